"""The exporter's HTTP(S) server: /metrics, /healthz and a landing page.

It only serves what a MetricsSource has already rendered; it never talks to NVML, so a hung GPU
cannot hang a scrape. Each connection gets its own thread (TLS handshake included) and socket
timeouts, so a slow or broken client never holds up the others.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import hmac
import logging
import os
import socket
import socketserver
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol
from urllib.parse import urlsplit

import bcrypt

from exporter import __version__
from exporter.errors import ConfigError
from exporter.webconfig import TlsConfig, WebConfig

log = logging.getLogger(__name__)

OPENMETRICS_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"
TEXT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
REALM = "gpu-ledger"
IO_TIMEOUT_S = 30.0  # per socket operation: request reads, response writes, TLS handshakes

LANDING_PAGE = f"""<!DOCTYPE html>
<html lang="en">
<head><meta charset="utf-8"><title>GPU Ledger exporter</title></head>
<body>
<h1>GPU Ledger exporter</h1>
<p>Version {__version__}</p>
<ul>
<li><a href="metrics">/metrics</a>: GPU metrics for Prometheus</li>
<li><a href="healthz">/healthz</a>: health</li>
</ul>
</body>
</html>
""".encode()


class MetricsSource(Protocol):
    def exposition(self, openmetrics: bool, gzipped: bool) -> bytes: ...  # cached, cheap

    def health(self) -> tuple[bool, str]: ...  # (ok, human-readable reason)


# --- content negotiation -------------------------------------------------------------------


def _header_items(value: str | None) -> list[tuple[str, dict[str, str], float]]:
    """Split an Accept-style header into (token, params, q), lower-cased, in order."""
    items: list[tuple[str, dict[str, str], float]] = []
    for part in (value or "").split(","):
        token, *raw_params = (p.strip() for p in part.split(";"))
        if not token:
            continue
        params: dict[str, str] = {}
        for p in raw_params:
            name, _, val = p.partition("=")
            params[name.strip().lower()] = val.strip().strip('"')
        try:
            q = float(params.pop("q", "1"))
        except ValueError:
            q = 0.0  # an unreadable weight excludes the entry rather than favouring it
        items.append((token.lower(), params, min(max(q, 0.0), 1.0)))
    return items


def wants_openmetrics(accept: str | None) -> bool:
    """OpenMetrics 1.0.0 when the client accepts it at least as much as plain text."""
    best_om: tuple[float, int] | None = None
    best_text: tuple[float, int] | None = None
    for i, (token, params, q) in enumerate(_header_items(accept)):
        rank = (q, -i)  # equal weights: the one listed first wins
        if token == "application/openmetrics-text" and params.get("version") in (None, "1.0.0"):
            best_om = max(best_om or rank, rank)
        elif token in ("text/plain", "text/*", "*/*"):
            best_text = max(best_text or rank, rank)
    if best_om is None or best_om[0] <= 0:
        return False
    return best_text is None or best_om > best_text


def accepts_gzip(accept_encoding: str | None) -> bool:
    gzip_q: float | None = None
    star_q: float | None = None
    for token, _, q in _header_items(accept_encoding):
        if token in ("gzip", "x-gzip"):
            gzip_q = max(gzip_q or 0.0, q)
        elif token == "*":
            star_q = q
    if gzip_q is not None:
        return gzip_q > 0
    return star_q is not None and star_q > 0


# --- basic auth ----------------------------------------------------------------------------


class BasicAuth:
    """Checks `Authorization: Basic` against bcrypt hashes.

    bcrypt is slow on purpose, so a verified (user, password) is remembered as a salted SHA-256
    and later scrapes cost one hash and a constant-time compare. Unknown users are checked
    against a dummy hash so the answer takes as long as for a known one.
    """

    def __init__(self, users: dict[str, str]) -> None:
        self._users = {u: h.encode() for u, h in users.items()}
        self._salt = os.urandom(16)
        self._verified: dict[str, bytes] = {}
        self._lock = threading.Lock()
        self._dummy: bytes | None = None

    def check(self, header: str | None) -> bool:
        creds = _decode_basic(header)
        if creds is None:
            return False
        user, password = creds
        digest = hashlib.sha256(self._salt + user.encode() + b"\0" + password).digest()
        with self._lock:
            known = self._verified.get(user)
        if known is not None and hmac.compare_digest(known, digest):
            return True
        hashed = self._users.get(user)
        # bcrypt uses only the first 72 bytes (htpasswd hashes that prefix); bcrypt>=5 raises.
        ok = bcrypt.checkpw(password[:72], hashed or self._dummy_hash())
        if ok and hashed is not None:
            with self._lock:
                self._verified[user] = digest
            return True
        return False

    def _dummy_hash(self) -> bytes:
        if self._dummy is None:
            self._dummy = bcrypt.hashpw(os.urandom(16), bcrypt.gensalt(rounds=10))
        return self._dummy


def _decode_basic(header: str | None) -> tuple[str, bytes] | None:
    if not header:
        return None
    scheme, _, encoded = header.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        raw = base64.b64decode(encoded.strip(), validate=True)
        user_b, sep, password = raw.partition(b":")
        user = user_b.decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    return (user, password) if sep else None


# --- TLS -----------------------------------------------------------------------------------


class _TlsContexts:
    """The current SSLContext, rebuilt when the certificate, key or CA files change on disk
    (cert-manager rotation). A broken rotation keeps the last good context and logs why."""

    def __init__(self, tls: TlsConfig) -> None:
        self.tls = tls
        self._lock = threading.Lock()
        self._stamp = self._stat()
        self._ctx = tls.build_context()

    def _stat(self) -> tuple[tuple[int, int], ...]:
        out = []
        for path in self.tls.watched_files():
            try:
                st = os.stat(path)
                out.append((st.st_mtime_ns, st.st_size))
            except OSError:
                out.append((-1, -1))
        return tuple(out)

    def current(self) -> ssl.SSLContext:
        stamp = self._stat()
        with self._lock:
            if stamp != self._stamp:
                self._stamp = stamp
                try:
                    self._ctx = self.tls.build_context()
                    log.info("%s: TLS files changed, reloaded", self.tls.source)
                except ConfigError as exc:
                    log.warning("TLS reload failed, keeping the previous certificate: %s", exc)
            return self._ctx


def _san_allowed(cert: dict[str, Any] | None, allowed: tuple[str, ...]) -> bool:
    if not cert:
        return False
    return any(value in allowed for _, value in cert.get("subjectAltName", ()))


# --- server --------------------------------------------------------------------------------


class WebServer(ThreadingHTTPServer):
    """Serves a MetricsSource in a daemon thread. `port` is the bound port (useful with 0)."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64

    def __init__(self, source: MetricsSource, host: str, port: int,
                 web_config: WebConfig | None) -> None:
        host = host.strip("[]")
        try:
            info = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                      flags=socket.AI_PASSIVE)
        except (socket.gaierror, UnicodeError) as exc:
            raise OSError(f"cannot resolve listen address {host!r}: {exc}") from None
        self.address_family = info[0][0]
        self.source = source
        self.web_config = web_config or WebConfig()
        self.auth = BasicAuth(dict(self.web_config.basic_auth_users)) \
            if self.web_config.basic_auth_users else None
        self.tls = _TlsContexts(self.web_config.tls) if self.web_config.tls else None
        self._conns: set[socket.socket] = set()
        self._conns_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stopped = False
        bind_host, bind_port = str(info[0][4][0]), int(info[0][4][1])
        try:
            super().__init__((bind_host, bind_port), _Handler)
        except OSError as exc:  # the stdlib message does not say which address
            raise OSError(exc.errno, f"cannot listen on {self._display(bind_host)}:{port}: "
                          f"{exc.strerror or exc}") from None

    @staticmethod
    def _display(host: str) -> str:
        return f"[{host}]" if ":" in host else host

    def server_bind(self) -> None:
        if self.address_family == socket.AF_INET6 and hasattr(socket, "IPV6_V6ONLY"):
            # "::" then also answers IPv4, as a node exporter on a dual-stack node should.
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        # Skip HTTPServer.server_bind: its getfqdn() can stall on DNS at start-up.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), int(port)

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    @property
    def url(self) -> str:
        """Base URL, with a wildcard address replaced by loopback so it can be fetched."""
        host = str(self.server_address[0])
        host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
        return f"{'https' if self.tls else 'http'}://{self._display(host)}:{self.port}/"

    def start(self) -> None:
        # A short poll keeps shutdown() prompt; an idle wake-up ten times a second costs nothing.
        self._thread = threading.Thread(target=self.serve_forever, args=(0.1,),
                                        name="exporter-web", daemon=True)
        self._thread.start()

    def shutdown(self) -> None:
        """Stop serving, drop open connections and close the listening socket. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        if self._thread is not None:
            super().shutdown()
            self._thread.join()
        with self._conns_lock:
            conns = list(self._conns)
        for conn in conns:  # wake handler threads blocked on idle keep-alive reads
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        self.server_close()

    def finish_request(self, request: Any, client_address: Any) -> None:
        # Runs in the connection's own thread, so a slow TLS handshake blocks nobody else.
        conn: socket.socket = request
        self._track(conn, True)
        try:
            if self.tls is not None:
                conn.settimeout(IO_TIMEOUT_S)
                self._track(conn, False)
                conn = self.tls.current().wrap_socket(request, server_side=True)
                self._track(conn, True)
                allowed = self.tls.tls.client_allowed_sans
                if allowed and not _san_allowed(conn.getpeercert(), allowed):
                    log.info("client %s: certificate SAN not in client_allowed_sans",
                             client_address[0])
                    return
            _Handler(conn, client_address, self)
        except (OSError, ssl.SSLError) as exc:
            log.debug("connection from %s: %s", client_address[0], exc)
        finally:
            self._track(conn, False)
            if conn is not request:
                conn.close()

    def _track(self, conn: socket.socket, add: bool) -> None:
        with self._conns_lock:
            if add:
                self._conns.add(conn)
            else:
                self._conns.discard(conn)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # The default prints a traceback to stderr for every reset connection.
        log.debug("error serving %s", client_address, exc_info=True)


def start_server(source: MetricsSource, host: str, port: int,
                 web_config: WebConfig | None) -> WebServer:
    """Bind host:port (0: an ephemeral port; "::" for IPv6 and IPv4) and serve in a daemon
    thread. Call `.shutdown()` to stop."""
    server = WebServer(source, host, port, web_config)
    server.start()
    return server


class _Handler(BaseHTTPRequestHandler):
    server: WebServer
    protocol_version = "HTTP/1.1"  # keep-alive: Prometheus reuses connections
    # Headers and body go out in separate writes; with Nagle on, the body waits for the
    # client's delayed ACK (~40 ms on Linux). bench/exporter_scrape.py measured it.
    disable_nagle_algorithm = True
    server_version = f"gpu-ledger-exporter/{__version__}"
    timeout = IO_TIMEOUT_S

    def version_string(self) -> str:  # the stdlib appends the Python version
        return self.server_version

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)

    def do_GET(self) -> None:
        self._dispatch()

    do_HEAD = do_GET

    def _method_not_allowed(self) -> None:
        if not self._authorized():
            return
        self.close_connection = True  # a request body may follow that we never read
        self._reply(405, b"method not allowed\n", extra=(("Allow", "GET, HEAD"),))

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_TRACE = do_CONNECT = (
        _method_not_allowed)

    def _authorized(self) -> bool:
        auth = self.server.auth
        if auth is None or auth.check(self.headers.get("Authorization")):
            return True
        self.close_connection = self.command != "GET" and self.command != "HEAD"
        self._reply(401, b"unauthorized\n",
                    extra=(("WWW-Authenticate", f'Basic realm="{REALM}"'),))
        return False

    def _dispatch(self) -> None:
        if not self._authorized():
            return
        path = urlsplit(self.path).path
        if path == "/metrics":
            self._metrics()
        elif path == "/healthz":
            ok, reason = self.server.source.health()
            body = b"ok" if ok else (reason or "unhealthy").encode("utf-8", "replace")
            self._reply(200 if ok else 503, body)
        elif path == "/":
            self._reply(200, LANDING_PAGE, "text/html; charset=utf-8")
        else:
            self._reply(404, b"not found\n")

    def _metrics(self) -> None:
        openmetrics = wants_openmetrics(self.headers.get("Accept"))
        gzipped = accepts_gzip(self.headers.get("Accept-Encoding"))
        try:
            body = self.server.source.exposition(openmetrics, gzipped)
        except Exception:
            log.exception("rendering /metrics failed")
            self._reply(500, b"error rendering metrics\n")
            return
        extra: list[tuple[str, str]] = [("Vary", "Accept, Accept-Encoding")]
        if gzipped:
            extra.append(("Content-Encoding", "gzip"))
        self._reply(200, body, OPENMETRICS_TYPE if openmetrics else TEXT_TYPE, extra=tuple(extra))

    def _reply(self, status: int, body: bytes, content_type: str = "text/plain; charset=utf-8",
               extra: tuple[tuple[str, str], ...] = ()) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (*self.server.web_config.headers, *extra):
            self.send_header(name, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":  # HEAD: the same headers, Content-Length included, no body
            self.wfile.write(body)
