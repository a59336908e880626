"""GET JSON and stream watch events from the API server over http.client and ssl.

One ApiClient serves one thread (the watch loop that owns it); abort() may be called from
another thread to end whatever request is in flight. A connection per request: lists and
watches are minutes apart, so keep-alive would save nothing worth a pool.

Bounded in objects, not only bytes (docs/attribution.md, "Kubernetes client limits"): decoded
JSON can cost 30x its bytes (`{}` is 2 bytes and a 64-byte dict), so every document is counted
before it is decoded (`value_bound`, a C-speed
count of `,:{[`), one object at most MAX_OBJECT_BYTES and MAX_OBJECT_VALUES; a list is decoded
one item at a time (`get_list`), never whole. Every request has a total deadline as well as
a per-read timeout, so a server dripping a byte at a time cannot hold it open.
"""

from __future__ import annotations

import codecs
import contextlib
import http.client
import json
import os
import re
import socket
import ssl
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from exporter import __version__
from exporter.errors import ConfigError
from exporter.kube.config import Credentials, load_credentials

# One object (a get, one list item, one watch event): etcd refuses a request over 1.5 MiB by
# default (--max-request-bytes), and its JSON is at most about twice its protobuf.
MAX_OBJECT_BYTES = 3 << 20
# JSON values (incl. keys) in one object: a pod with 100 containers of 50 env vars each has
# ~20,000; 50,000 values cost ~10 MiB of Python objects at most.
MAX_OBJECT_VALUES = 50_000
# A whole list (read item by item: this bounds time, not memory): 13,000 pods of 20 KB.
MAX_LIST_BYTES = 256 << 20
MAX_ENVELOPE_BYTES = 64 << 10  # a list's fields other than its items (kind, metadata)
REQUEST_DEADLINE = 60.0  # a get or a whole list, however the bytes arrive
_ERROR_BODY = 64 << 10  # read at most this much of an error answer
_READ = 64 << 10
_FIRST_WINDOW = 1 << 10  # a list item is first decoded from this many characters


class ApiError(Exception):
    """The server answered with a non-2xx status (or a watch ERROR event carrying one)."""

    def __init__(self, status: int, reason: str = "", message: str = "") -> None:
        self.status, self.reason, self.message = status, reason, message
        super().__init__(f"{status} {reason}: {message}" if message else f"{status} {reason}")


class BadResponse(ValueError):
    """The server's answer is not what the API returns (not JSON, too large, wrong shape)."""


@dataclass(frozen=True)
class Skipped:
    """In place of a list item or watch event over MAX_OBJECT_VALUES (or, for an event,
    MAX_OBJECT_BYTES): passed on undecoded, so one tenant's oversized object costs only
    that object (the caller counts it), never the list or the watch."""

    reason: str


class DeadlineExceeded(TimeoutError):
    """A request ran past its total deadline (however slowly the server sent)."""


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
        self._expired = False  # the request in flight was cut at its deadline

    @property
    def server(self) -> str:
        return self.creds.server

    # --- requests ------------------------------------------------------------------------------
    def get_json(self, path: str, query: Mapping[str, str], *,
                 deadline: float = REQUEST_DEADLINE) -> dict[str, Any]:
        """GET path?query and return the one JSON object it answers (at most MAX_OBJECT_BYTES
        and MAX_OBJECT_VALUES). Raises ApiError, BadResponse, DeadlineExceeded, OSError
        (unreachable, timed out, TLS) or http.client.HTTPException."""
        with self._request(path, query, deadline) as resp:
            body = resp.read(MAX_OBJECT_BYTES + 1)
        if len(body) > MAX_OBJECT_BYTES:
            raise BadResponse(f"{path}: response larger than {MAX_OBJECT_BYTES} bytes")
        return _json_object(body, path)

    def get_list(self, path: str, query: Mapping[str, str], on_item: Callable[[Any], None],
                 *, max_items: int, deadline: float = REQUEST_DEADLINE) -> dict[str, Any]:
        """GET a list, decoding one item at a time and handing each to `on_item`; returns the
        list's other fields (`metadata` with its resourceVersion). At most `max_items` items,
        MAX_LIST_BYTES in all, each item bounded as in get_json; an item over
        MAX_OBJECT_VALUES is skipped undecoded and handed on as a Skipped. Raises like
        get_json."""
        with self._request(path, query, deadline) as resp:
            return _ListReader(resp, path).read(on_item, max_items)

    @contextlib.contextmanager
    def watch(self, path: str, query: Mapping[str, str],
              read_timeout: float) -> Iterator[Iterator[dict[str, Any] | Skipped]]:
        """A watch request: yields an iterator of its events (JSON objects, one per line, or
        a Skipped for a line over the bounds) that ends when the server ends the stream. The
        whole stream has `read_timeout` as its total deadline too (the server ends a watch at
        its timeoutSeconds). Raises like get_json."""
        with self._request(path, query, read_timeout) as resp:
            conn = self._inflight
            if conn is not None and conn.raw is not None:
                conn.raw.settimeout(read_timeout)
            yield _events(resp, path)

    @contextlib.contextmanager
    def _request(self, path: str, query: Mapping[str, str],
                 deadline: float) -> Iterator[http.client.HTTPResponse]:
        """One request whose connection is shut down `deadline` seconds after it starts, from
        a timer: connect, TLS, headers and body all count, a drip cannot extend it."""
        timer = threading.Timer(deadline, self._expire)
        timer.daemon = True
        self._expired = False
        timer.start()
        start = time.monotonic()
        try:
            conn, resp = self._open(path, query)
            try:
                yield resp
            finally:
                self._done(conn, resp)
        except (OSError, http.client.HTTPException, ValueError) as err:
            if self._expired or time.monotonic() - start >= deadline:
                raise DeadlineExceeded(f"{path}: no complete answer within {deadline:g}s") \
                    from err
            raise
        finally:
            timer.cancel()

    def _expire(self) -> None:
        with self._lock:
            conn = self._inflight
            self._expired = conn is not None
        if conn is not None and conn.raw is not None:
            with contextlib.suppress(OSError):
                conn.raw.shutdown(socket.SHUT_RDWR)

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


def value_bound(text: bytes | str) -> int:
    """An upper bound on the JSON values (keys included) `text` decodes to: every value but
    the first follows a `,` `:` `[` or `{` (counted inside strings too: an over-estimate)."""
    if isinstance(text, str):
        return sum(text.count(c) for c in ",:[{") + 1
    return sum(text.count(c) for c in (b",", b":", b"[", b"{")) + 1


def _json_object(data: bytes, what: str) -> dict[str, Any]:
    if value_bound(data) > MAX_OBJECT_VALUES:
        raise BadResponse(f"{what}: an object of more than {MAX_OBJECT_VALUES} JSON values")
    try:
        obj = json.loads(data)
    except ValueError as err:
        raise BadResponse(f"{what}: not JSON ({err})") from err
    if not isinstance(obj, dict):
        raise BadResponse(f"{what}: expected a JSON object, got {type(obj).__name__}")
    return obj


def _events(resp: http.client.HTTPResponse, what: str) -> Iterator[dict[str, Any] | Skipped]:
    """JSON lines from a streamed body, chunks split anywhere; a line over MAX_OBJECT_BYTES
    is discarded as it arrives (never buffered), one over MAX_OBJECT_VALUES is not decoded:
    either is a Skipped."""
    pending: list[bytes] = []  # pieces of the line being received
    size = 0
    discarding = False  # within a line already over the byte bound
    while chunk := resp.read1(_READ):
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            if discarding:
                discarding = False
                yield Skipped("too-large")
            else:
                line = b"".join((*pending, chunk[start:end]))
                if line.strip():
                    yield _event(line, what)
            pending, size, start = [], 0, end + 1
        rest = chunk[start:]
        if not discarding and rest:
            size += len(rest)
            if size > MAX_OBJECT_BYTES:
                discarding, pending = True, []
            else:
                pending.append(rest)
    if discarding:
        yield Skipped("too-large")
    elif (line := b"".join(pending)).strip():
        yield _event(line, what)


def _event(line: bytes, what: str) -> dict[str, Any] | Skipped:
    if len(line) > MAX_OBJECT_BYTES or value_bound(line) > MAX_OBJECT_VALUES:
        return Skipped("too-large")
    return _json_object(line, what)


# One token of JSON text for skipping a value undecoded: a whole string, a run of anything
# but strings and brackets, a bracket, or a string's opening quote whose end is not buffered.
_SKIP_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[^"\[\]{}]+|[\[\]{}]|"')


class _ListReader:
    """Decodes `{"kind": ..., "metadata": {...}, "items": [...]}` from a response one item
    at a time: each item is decoded from a window of the text that holds at most
    MAX_OBJECT_VALUES values (counted first), grown by doubling while the item is longer,
    so neither a huge item nor a flood of tiny ones is ever decoded at once."""

    _decoder = json.JSONDecoder()
    _SPACE = " \t\r\n"

    def __init__(self, resp: http.client.HTTPResponse, what: str) -> None:
        self.resp, self.what = resp, what
        self.text = ""
        self.pos = 0
        self.read_bytes = 0
        self.eof = False
        self._utf8 = codecs.getincrementaldecoder("utf-8")()
        self._window = _FIRST_WINDOW

    def read(self, on_item: Callable[[Any], None], max_items: int) -> dict[str, Any]:
        fields: dict[str, Any] = {}
        self._expect("{")
        if self._peek() == "}":
            self.pos += 1
            return fields
        while True:
            key = self._value(MAX_ENVELOPE_BYTES, 1)
            if not isinstance(key, str):
                raise BadResponse(f"{self.what}: a list with a non-string key")
            self._expect(":")
            if key == "items" and self._peek() == "[":
                self.pos += 1
                self._items(on_item, max_items)
            else:
                fields[key] = self._value(MAX_ENVELOPE_BYTES, 10_000)
            sep = self._peek()
            self.pos += 1
            if sep == "}":
                return fields
            if sep != ",":
                raise BadResponse(f"{self.what}: not JSON (expected , or }} in the list)")

    def _items(self, on_item: Callable[[Any], None], max_items: int) -> None:
        if self._peek() == "]":
            self.pos += 1
            return
        count = 0
        while True:
            count += 1
            if count > max_items:
                raise BadResponse(f"{self.what}: a list of more than {max_items} items")
            on_item(self._value(MAX_OBJECT_BYTES, MAX_OBJECT_VALUES, skip=True))
            sep = self._peek()
            self.pos += 1
            if sep == "]":
                return
            if sep != ",":
                raise BadResponse(f"{self.what}: not JSON (expected , or ] in items)")

    def _value(self, max_chars: int, max_values: int, skip: bool = False) -> Any:
        """Decode the next JSON value, at most max_chars long and of max_values values; with
        `skip`, one of more values is passed over undecoded and returned as a Skipped."""
        self._peek()
        window = min(self._window, max_chars)
        while True:
            self._fill(window)
            end = min(len(self.text), self.pos + window)
            cut = self._cut(end, max_values)
            try:
                value, used = self._decoder.raw_decode(self.text[self.pos:cut])
            except ValueError as err:
                if cut < end:
                    if skip:
                        self._skip(max_chars)
                        return Skipped("too-large")
                    raise BadResponse(f"{self.what}: an item of more than {max_values} JSON "
                                      "values") from None
                if end - self.pos >= max_chars:
                    raise BadResponse(f"{self.what}: an item larger than {max_chars} "
                                      "characters") from None
                if self.eof and end == len(self.text):
                    raise BadResponse(f"{self.what}: not JSON ({err})") from None
                window = min(window * 2, max_chars)
                continue
            self.pos += used
            self._window = max(_FIRST_WINDOW, min(2 * used, MAX_OBJECT_BYTES))
            return value

    def _skip(self, max_chars: int) -> None:
        """Move past the value at pos without decoding it: count brackets outside strings,
        a token at a time (runs without brackets or quotes at C speed)."""
        depth, rel = 0, 0  # rel: offset from pos (pos moves when _fill drops what was read)
        while True:
            if rel > max_chars:
                raise BadResponse(f"{self.what}: an item larger than {max_chars} characters")
            m = _SKIP_TOKEN.match(self.text, self.pos + rel)
            token = m.group() if m else ""
            if not m or token == '"' or (m.end() == len(self.text) and token[0] not in "[]{}"):
                if self.eof:  # an unterminated string, or the body ended inside the value
                    raise BadResponse(f"{self.what}: not JSON (an item ends unfinished)")
                self._fill(rel + _READ)
                continue
            rel = m.end() - self.pos
            if token in ("[", "{"):
                depth += 1
            elif token in ("]", "}"):
                depth -= 1
            if depth <= 0:  # the value ended: its closing bracket, or a whole string
                if depth < 0 or token[0] not in "]}\"":
                    raise BadResponse(f"{self.what}: not JSON (unbalanced item)")
                self.pos += rel
                return

    def _cut(self, end: int, max_values: int) -> int:
        """The furthest end <= `end` such that text[pos:end] holds at most max_values
        values (binary search over C-speed counts: log steps)."""
        text, pos = self.text, self.pos

        def bound(stop: int) -> int:
            return sum(text.count(c, pos, stop) for c in ",:[{") + 1

        if bound(end) <= max_values:
            return end
        lo, hi = pos, end
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if bound(mid) <= max_values:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _peek(self) -> str:
        """The next character that is not white space (consumed up to it); '' at the end."""
        while True:
            while self.pos < len(self.text) and self.text[self.pos] in self._SPACE:
                self.pos += 1
            if self.pos < len(self.text):
                return self.text[self.pos]
            if self.eof:
                return ""
            self._fill(len(self.text) - self.pos + 1)

    def _expect(self, char: str) -> None:
        if self._peek() != char:
            raise BadResponse(f"{self.what}: not JSON (expected {char!r})")
        self.pos += 1

    def _fill(self, want: int) -> None:
        """Read until `want` characters from pos are buffered (or the body ends)."""
        if self.pos > _READ:  # drop what was decoded
            self.text, self.pos = self.text[self.pos:], 0
        while len(self.text) - self.pos < want and not self.eof:
            chunk = self.resp.read1(_READ)
            self.read_bytes += len(chunk)
            if self.read_bytes > MAX_LIST_BYTES:
                raise BadResponse(f"{self.what}: a list larger than {MAX_LIST_BYTES} bytes")
            if not chunk:
                self.eof = True
            try:
                self.text += self._utf8.decode(chunk, final=not chunk)
            except UnicodeDecodeError as err:
                raise BadResponse(f"{self.what}: not UTF-8 ({err})") from None


def connector(kubeconfig: str | None, timeout: float) -> Callable[[], ApiClient]:
    """What a watch calls, on its own thread and again after a failure, for a client: so bad
    or missing credentials are a reported, retried failure, not a crash at start-up."""
    def connect() -> ApiClient:
        return ApiClient(load_credentials(kubeconfig), timeout=timeout)
    return connect
