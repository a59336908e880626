"""GET JSON and stream watch events from the API server over http.client and ssl.

One ApiClient serves one thread (the watch loop that owns it); abort() may be called from
another thread to end whatever request is in flight. A connection per request: lists and
watches are minutes apart, so keep-alive would save nothing worth a pool.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
import ssl
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from exporter import __version__
from exporter.errors import ConfigError
from exporter.kube.config import Credentials, load_credentials

MAX_BODY = 64 << 20  # a list response larger than this is refused, not buffered
MAX_EVENT = 16 << 20  # one watch event (one JSON line)
_ERROR_BODY = 64 << 10  # read at most this much of an error answer
_READ = 64 << 10


class ApiError(Exception):
    """The server answered with a non-2xx status (or a watch ERROR event carrying one)."""

    def __init__(self, status: int, reason: str = "", message: str = "") -> None:
        self.status, self.reason, self.message = status, reason, message
        super().__init__(f"{status} {reason}: {message}" if message else f"{status} {reason}")


class BadResponse(ValueError):
    """The server's answer is not what the API returns (not JSON, too large, wrong shape)."""


class _Connection(http.client.HTTPConnection):
    """HTTP, or HTTPS with our own context and SNI name (kubeconfig `tls-server-name`)."""

    def __init__(self, host: str, port: int, timeout: float,
                 tls: ssl.SSLContext | None, server_name: str) -> None:
        super().__init__(host, port, timeout=timeout)
        self._tls, self._server_name = tls, server_name
        # http.client hands the socket to the response (and forgets it) when the server says
        # `Connection: close`, as watch responses do: keep it to set timeouts and to abort.
        self.raw: socket.socket | None = None

    def connect(self) -> None:
        super().connect()
        if self._tls is not None:
            self.sock = self._tls.wrap_socket(self.sock, server_hostname=self._server_name)
        self.raw = self.sock


def tls_context(creds: Credentials) -> ssl.SSLContext:
    """Verify the server against the configured CA (else the system roots) and present the
    client certificate, if any. Raises ConfigError naming the credentials' source."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        if creds.insecure:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        elif creds.ca_pem:
            ctx.load_verify_locations(cadata=creds.ca_pem.decode("ascii", "replace"))
        else:
            ctx.load_default_certs()
        if creds.cert_pem:
            _load_client_cert(ctx, creds.cert_pem, creds.key_pem)
    except (ssl.SSLError, ValueError, OSError) as err:
        raise ConfigError(creds.source, "", f"a usable CA and client certificate ({err})") from err
    return ctx


def _load_client_cert(ctx: ssl.SSLContext, cert: bytes, key: bytes) -> None:
    """ssl loads a key pair only from files: write both to a private directory, load, remove."""
    with tempfile.TemporaryDirectory(prefix="gpu-ledger-kube-") as tmp:
        paths = []
        for name, pem in (("cert.pem", cert), ("key.pem", key)):
            path = os.path.join(tmp, name)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(pem)
            paths.append(path)
        ctx.load_cert_chain(paths[0], paths[1])


class ApiClient:
    def __init__(self, creds: Credentials, *, timeout: float = 10.0) -> None:
        url = urlsplit(creds.server)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ConfigError(creds.source, "server", "an http(s):// URL", creds.server)
        self.creds = creds
        self.timeout = timeout
        self.host = url.hostname
        self.port = url.port or (443 if url.scheme == "https" else 80)
        self.prefix = url.path.rstrip("/")  # a server URL may carry a path (a proxy)
        self._tls = tls_context(creds) if url.scheme == "https" else None
        self._server_name = creds.tls_server_name or self.host
        self._lock = threading.Lock()
        self._inflight: _Connection | None = None
        self._aborted = False

    @property
    def server(self) -> str:
        return self.creds.server

    # --- requests ------------------------------------------------------------------------------
    def get_json(self, path: str, query: Mapping[str, str]) -> dict[str, Any]:
        """GET path?query and return the JSON object it answers. Raises ApiError, BadResponse,
        OSError (unreachable, timed out, TLS) or http.client.HTTPException."""
        conn, resp = self._open(path, query)
        try:
            body = resp.read(MAX_BODY + 1)
        finally:
            self._done(conn, resp)
        if len(body) > MAX_BODY:
            raise BadResponse(f"{path}: response larger than {MAX_BODY} bytes")
        return _json_object(body, path)

    @contextlib.contextmanager
    def watch(self, path: str, query: Mapping[str, str],
              read_timeout: float) -> Iterator[Iterator[dict[str, Any]]]:
        """A watch request: yields an iterator of its events (JSON objects, one per line) that
        ends when the server ends the stream. Raises like get_json."""
        conn, resp = self._open(path, query)
        try:
            if conn.raw is not None:
                conn.raw.settimeout(read_timeout)  # the server ends a watch at timeoutSeconds
            yield _events(resp, path)
        finally:
            self._done(conn, resp)

    def abort(self) -> None:
        """End the request in flight (from another thread); later requests fail at once."""
        with self._lock:
            self._aborted = True
            conn = self._inflight
        if conn is not None and conn.raw is not None:
            with contextlib.suppress(OSError):
                conn.raw.shutdown(socket.SHUT_RDWR)

    # --- plumbing ------------------------------------------------------------------------------
    def _open(self, path: str, query: Mapping[str, str]) -> tuple[_Connection,
                                                                  http.client.HTTPResponse]:
        target = self.prefix + quote(path) + (f"?{urlencode(query)}" if query else "")
        conn = _Connection(self.host, self.port, self.timeout, self._tls, self._server_name)
        with self._lock:
            if self._aborted:
                raise ConnectionAbortedError("client closed")
            self._inflight = conn
        try:
            headers = {"Accept": "application/json", "Accept-Encoding": "identity",
                       "User-Agent": f"gpu-ledger/{__version__}"}
            token = self.creds.bearer()
            if token:
                headers["Authorization"] = f"Bearer {token}"
            conn.request("GET", target, headers=headers)
            resp = conn.getresponse()
        except BaseException:
            self._done(conn, None)
            raise
        if resp.status != 200:
            try:
                raise _api_error(resp)
            finally:
                self._done(conn, resp)
        return conn, resp

    def _done(self, conn: _Connection, resp: http.client.HTTPResponse | None) -> None:
        with self._lock:
            if self._inflight is conn:
                self._inflight = None
        if resp is not None:
            resp.close()
        conn.close()


def _api_error(resp: http.client.HTTPResponse) -> ApiError:
    """An ApiError from a non-200 answer, with the Status object's reason and message if any."""
    reason, message = resp.reason or "", ""
    with contextlib.suppress(ValueError, OSError, http.client.HTTPException):
        status = json.loads(resp.read(_ERROR_BODY))
        if isinstance(status, dict):
            reason = str(status.get("reason") or reason)
            message = str(status.get("message") or "")
    return ApiError(resp.status, reason, message[:300])


def _json_object(data: bytes, what: str) -> dict[str, Any]:
    try:
        obj = json.loads(data)
    except ValueError as err:
        raise BadResponse(f"{what}: not JSON ({err})") from err
    if not isinstance(obj, dict):
        raise BadResponse(f"{what}: expected a JSON object, got {type(obj).__name__}")
    return obj


def _events(resp: http.client.HTTPResponse, what: str) -> Iterator[dict[str, Any]]:
    """JSON lines from a streamed body, chunks split anywhere; each line bounded."""
    buffer = b""
    while True:
        chunk = resp.read1(_READ)
        if not chunk:
            break
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        if len(buffer) > MAX_EVENT:
            raise BadResponse(f"{what}: a watch event larger than {MAX_EVENT} bytes")
        for line in lines:
            if line.strip():
                yield _json_object(line, what)
    if buffer.strip():
        yield _json_object(buffer, what)


def connector(kubeconfig: str | None, timeout: float) -> Callable[[], ApiClient]:
    """What a watch calls, on its own thread and again after a failure, for a client: so bad
    or missing credentials are a reported, retried failure, not a crash at start-up."""
    def connect() -> ApiClient:
        return ApiClient(load_credentials(kubeconfig), timeout=timeout)
    return connect
