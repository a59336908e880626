"""The exporter's HTTP(S) server: /metrics, /healthz and a landing page.

It only serves what a MetricsSource has already rendered; it never talks to NVML, so a hung GPU
cannot hang a scrape. The HTTP layer is exporter.httpserver (one event loop, bounded heads,
connections and deadlines); this module is the application: routes, content negotiation,
basic auth (bcrypt in a small thread pool, off the event loop, behind a bounded and per-address
fair queue) and TLS contexts.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hashlib
import hmac
import logging
import os
import re
import socket
import ssl
import threading
from collections import Counter, OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol
from urllib.parse import urlsplit

from exporter import __version__
from exporter.errors import ConfigError
from exporter.httpserver import DEFAULT_LIMITS, HttpServer, Limits, Request, Response
from exporter.webconfig import TlsConfig, WebConfig

log = logging.getLogger(__name__)

OPENMETRICS_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"
TEXT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
REALM = "gpu-ledger"
# bcrypt checks: AUTH_WORKERS run at once; AUTH_QUEUE_PER_CLIENT per client address wait or
# run, AUTH_QUEUE wait in all (see _AuthQueue): past them, 503 at once instead of a queue.
AUTH_QUEUE = 16
AUTH_QUEUE_PER_CLIENT = 2
AUTH_WORKERS = 2
REJECTED_CACHE = 4096  # wrong credentials remembered (LRU), answered 401 without bcrypt

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
    and later scrapes cost one hash and a constant-time compare (`cached`); so is a rejected
    one (the last REJECTED_CACHE of them), so a client repeating a wrong password costs no
    bcrypt either. Unknown users are checked against a dummy hash of the highest cost in the
    file, so an unknown user takes as long as the slowest known one: timing does not tell
    which users exist.
    """

    def __init__(self, users: dict[str, str]) -> None:
        self._users = {u: h.encode() for u, h in users.items()}
        self._salt = os.urandom(16)
        self._verified: dict[str, bytes] = {}
        self._rejected: OrderedDict[bytes, None] = OrderedDict()
        self._lock = threading.Lock()
        self.dummy_cost = max((_bcrypt_cost(h) for h in self._users.values()), default=10)
        import bcrypt  # only when basic auth is configured

        self._dummy = bcrypt.hashpw(os.urandom(16), bcrypt.gensalt(rounds=self.dummy_cost))

    def _digest(self, user: str, password: bytes) -> bytes:
        return hashlib.sha256(self._salt + user.encode() + b"\0" + password).digest()

    def cached(self, header: str | None) -> bool | None:
        """True: verified before; False: malformed, or rejected before; None: call check."""
        creds = _decode_basic(header)
        if creds is None:
            return False
        digest = self._digest(*creds)
        with self._lock:
            known = self._verified.get(creds[0])
            if known is not None and hmac.compare_digest(known, digest):
                return True
            if digest in self._rejected:
                self._rejected.move_to_end(digest)
                return False
        return None

    def check(self, header: str | None) -> bool:
        creds = _decode_basic(header)
        if creds is None:
            return False
        user, password = creds
        digest = self._digest(user, password)
        with self._lock:
            known = self._verified.get(user)
        if known is not None and hmac.compare_digest(known, digest):
            return True
        hashed = self._users.get(user)
        import bcrypt  # loaded by __init__ already

        # bcrypt uses only the first 72 bytes (htpasswd hashes that prefix); bcrypt>=5 raises.
        ok = bcrypt.checkpw(password[:72], hashed or self._dummy)
        with self._lock:
            if ok and hashed is not None:
                self._verified[user] = digest
                return True
            self._rejected[digest] = None
            if len(self._rejected) > REJECTED_CACHE:
                self._rejected.popitem(last=False)
        return False


def _bcrypt_cost(hashed: bytes) -> int:
    match = re.match(rb"^\$2[abxy]?\$(\d\d)\$", hashed)
    return int(match.group(1)) if match else 10


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


class _AuthQueue:
    """bcrypt checks off the event loop, fairly: AUTH_WORKERS run at once; the waiting ones
    are kept per client address and started round-robin across addresses, so a check from a
    new address waits for at most one check per other address, however many one address
    sends. At most AUTH_QUEUE_PER_CLIENT per address wait or run, AUTH_QUEUE wait in all;
    when full, a newcomer from an address with fewer waiting takes the newest waiting slot
    of the address with the most (that request is answered 503). Event-loop state only."""

    def __init__(self, pool: ThreadPoolExecutor) -> None:
        self.pool = pool
        self.waiting: dict[str, deque[tuple[asyncio.Future[bool | None],
                                            Callable[[], bool]]]] = {}
        self.held: Counter[str] = Counter()  # waiting or running, per address
        self.running = 0

    async def check(self, client: str, fn: Callable[[], bool]) -> bool | None:
        """fn()'s answer; None: no room (answer 503)."""
        if self.held[client] >= AUTH_QUEUE_PER_CLIENT:
            return None
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[bool | None] = loop.create_future()
        if self.running < AUTH_WORKERS and not self.waiting:
            self.held[client] += 1
            self._start(client, fut, fn)
        else:
            if sum(len(q) for q in self.waiting.values()) >= AUTH_QUEUE and \
                    not self._evict_for(client):
                return None
            self.held[client] += 1
            self.waiting.setdefault(client, deque()).append((fut, fn))
        return await fut

    def _evict_for(self, client: str) -> bool:
        mine = len(self.waiting.get(client, ()))
        heavy = max(self.waiting, key=lambda a: len(self.waiting[a]))
        if len(self.waiting[heavy]) <= mine + 1:
            return False
        fut, _ = self.waiting[heavy].pop()
        self._release(heavy)
        if not self.waiting[heavy]:
            del self.waiting[heavy]
        fut.set_result(None)
        return True

    def _start(self, client: str, fut: asyncio.Future[bool | None],
               fn: Callable[[], bool]) -> None:
        self.running += 1
        loop = asyncio.get_running_loop()
        work = self.pool.submit(fn)

        def done(w: Future[bool]) -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed: shutting down
                loop.call_soon_threadsafe(self._finished, client, fut, w)

        work.add_done_callback(done)

    def _finished(self, client: str, fut: asyncio.Future[bool | None],
                  work: Future[bool]) -> None:
        self.running -= 1
        self._release(client)
        if not fut.done():
            ok = not work.cancelled() and work.exception() is None and work.result()
            fut.set_result(bool(ok))
        if self.waiting:  # round-robin: the address waiting longest since its last turn
            nxt = next(iter(self.waiting))
            queue = self.waiting.pop(nxt)
            nfut, fn = queue.popleft()
            if queue:
                self.waiting[nxt] = queue  # to the back of the line
            self._start(nxt, nfut, fn)

    def _release(self, client: str) -> None:
        self.held[client] -= 1
        if self.held[client] <= 0:
            del self.held[client]


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


class WebServer:
    """Serves a MetricsSource in a daemon thread. `port` is the bound port (useful with 0)."""

    def __init__(self, source: MetricsSource, host: str, port: int,
                 web_config: WebConfig | None, limits: Limits = DEFAULT_LIMITS) -> None:
        host = host.strip("[]")
        try:
            info = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                      flags=socket.AI_PASSIVE)
        except (socket.gaierror, UnicodeError) as exc:
            raise OSError(f"cannot resolve listen address {host!r}: {exc}") from None
        self.source = source
        self.web_config = web_config or WebConfig()
        self.auth = BasicAuth(dict(self.web_config.basic_auth_users)) \
            if self.web_config.basic_auth_users else None
        self.tls = _TlsContexts(self.web_config.tls) if self.web_config.tls else None
        # bcrypt takes ~50-250 ms of CPU: off the event loop, fairly queued (_AuthQueue).
        self._auth_pool = ThreadPoolExecutor(AUTH_WORKERS, thread_name_prefix="exporter-auth")
        self._auth_queue = _AuthQueue(self._auth_pool)
        family, addr = info[0][0], info[0][4]
        bind_host = str(addr[0])
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6 and hasattr(socket, "IPV6_V6ONLY"):
                # "::" then also answers IPv4, as a node exporter on a dual-stack node should.
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            sock.bind(addr)
        except OSError as exc:  # the plain message does not say which address
            sock.close()
            raise OSError(exc.errno, f"cannot listen on {self._display(bind_host)}:{port}: "
                          f"{exc.strerror or exc}") from None
        self.server_address = sock.getsockname()
        allowed = self.tls.tls.client_allowed_sans if self.tls else ()
        self.http = HttpServer(
            sock, self._handle, limits=limits,
            tls=self.tls.current if self.tls else None,
            peer_ok=(lambda cert: _san_allowed(cert, allowed)) if allowed else None,
            server_header=f"gpu-ledger-exporter/{__version__}",
            extra_headers=self.web_config.headers)

    @staticmethod
    def _display(host: str) -> str:
        return f"[{host}]" if ":" in host else host

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
        self.http.start()

    def shutdown(self) -> None:
        """Stop serving, drop open connections and close the listening socket. Idempotent."""
        self.http.shutdown()
        self._auth_pool.shutdown(wait=False, cancel_futures=True)

    # --- the application ----------------------------------------------------------------------
    async def _handle(self, request: Request) -> Response:
        if request.method not in ("GET", "HEAD"):
            if not (ok := await self._authorized(request)):
                return _unauthorized(close=True) if ok is False else _busy()
            return Response(405, b"method not allowed\n", (("Allow", "GET, HEAD"),),
                            close=True)
        if not (ok := await self._authorized(request)):
            return _unauthorized(close=False) if ok is False else _busy()
        target = request.target
        if target.startswith("//"):  # as http.server does: never read as "//host/path"
            target = "/" + target.lstrip("/")
        path = urlsplit(target).path
        if path == "/metrics":
            return self._metrics(request)
        if path == "/healthz":
            ok, reason = self.source.health()
            body = b"ok" if ok else (reason or "unhealthy").encode("utf-8", "replace")
            return Response(200 if ok else 503, body)
        if path == "/":
            return Response(200, LANDING_PAGE,
                            (("Content-Type", "text/html; charset=utf-8"),))
        return Response(404, b"not found\n")

    async def _authorized(self, request: Request) -> bool | None:
        """True/False; None: the bcrypt queue is full (for this client or in all)."""
        auth = self.auth
        if auth is None:
            return True
        header = request.header("Authorization")
        known = auth.cached(header)
        if known is not None:
            return known
        ok = await self._auth_queue.check(request.client, lambda: auth.check(header))
        if ok is None:
            log.debug("%s: bcrypt queue full, answering 503", request.client)
        return ok

    def _metrics(self, request: Request) -> Response:
        openmetrics = wants_openmetrics(request.header("Accept"))
        gzipped = accepts_gzip(request.header("Accept-Encoding"))
        try:
            body = self.source.exposition(openmetrics, gzipped)
        except Exception:
            log.exception("rendering /metrics failed")
            return Response(500, b"error rendering metrics\n")
        headers = [("Content-Type", OPENMETRICS_TYPE if openmetrics else TEXT_TYPE),
                   ("Vary", "Accept, Accept-Encoding")]
        if gzipped:
            headers.append(("Content-Encoding", "gzip"))
        return Response(200, body, tuple(headers))


def _unauthorized(close: bool) -> Response:
    return Response(401, b"unauthorized\n",
                    (("WWW-Authenticate", f'Basic realm="{REALM}"'),), close=close)


def _busy() -> Response:
    return Response(503, b"too many password checks in progress\n", (("Retry-After", "1"),),
                    close=True)


def start_server(source: MetricsSource, host: str, port: int,
                 web_config: WebConfig | None, limits: Limits = DEFAULT_LIMITS) -> WebServer:
    """Bind host:port (0: an ephemeral port; "::" for IPv6 and IPv4) and serve in a daemon
    thread. Call `.shutdown()` to stop."""
    server = WebServer(source, host, port, web_config, limits)
    server.start()
    return server
