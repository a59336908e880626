"""A small HTTP/1.1 server on asyncio that holds hostile clients the way Go's net/http does.

The exporter's port is reachable from every pod in the cluster, so it is built to bound what
any client can cost before it is authenticated (docs/web-config.md, "Connections"):

- one event loop thread for every connection: a slow or idle connection costs a few KB of
  buffers, not a thread (bench/web_hostile.py measured both designs);
- a request head (request line + headers) of at most `max_head_bytes`, `max_header_line` per
  line and `max_headers` lines, answered 431 past that; the body is never read;
- one deadline for the whole head, from the first byte of a request (from accept, TLS
  handshake included, for the first request), not per read: trickling a byte at a time does
  not extend it;
- at most `max_connections` at once (`max_per_client` from one IP address), admitted fairly
  (`_admit`): a connection that has not yet completed a request ("fresh") may use all but
  `reserved` slots, which only "proven" connections (a request answered 2xx/3xx, or a verified
  client certificate) hold; when the table is full, a newcomer takes the slot of the oldest
  fresh connection (not mid-answer) of the IP address holding the most, if that holds two
  more than the newcomer's (each of n addresses ends up with about 1/n of the bound, so a few
  hosts cannot fill it), or else its own address's oldest idle keep-alive connection; a
  scraper's idle keep-alive connection is never taken for another address's newcomer unless
  that scraper's address holds the most. If nothing can be taken, the new one gets an
  immediate 503 (plain HTTP) or is closed (TLS), never a hang;
- a request with a body (`Content-Length` above 0, or `Transfer-Encoding`) is answered and the
  connection closed, so a body can never be parsed as a second request (request smuggling);
- a listen backlog of `backlog` (capped by the kernel's somaxconn), for Prometheus fan-in.

The application is an async callback from Request to Response; it decides authentication
from the head alone, before anything else is read.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import logging
import socket
import ssl
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Limits:
    max_connections: int = 512
    max_per_client: int = 256  # one IP address: a single hostile pod cannot take every slot
    reserved: int = 64  # slots fresh connections may not take: kept for proven ones
    head_timeout: float = 10.0  # seconds for a whole request head (and the TLS handshake)
    idle_timeout: float = 120.0  # keep-alive between requests (Prometheus scrapes every 15-60s)
    write_timeout: float = 30.0  # seconds for a whole response to be taken by the client
    max_head_bytes: int = 16 * 1024  # Prometheus sends ~300 bytes; Go's default is 1 MiB
    max_header_line: int = 8 * 1024
    max_headers: int = 64
    backlog: int = 4096  # Go's default (somaxconn); the kernel caps it


    def __post_init__(self) -> None:
        if not 0 <= self.reserved < self.max_connections:
            raise ValueError("Limits.reserved must be in [0, max_connections)")


DEFAULT_LIMITS = Limits()
LINGER_SECONDS = 0.5  # Go's net/http waits 500 ms after closing its side (closeWriteAndWait)


@dataclass(frozen=True)
class Request:
    method: str
    target: str
    version: str  # "HTTP/1.1" or "HTTP/1.0"
    headers: dict[str, str]  # lower-case names; repeated headers joined with ", "
    client: str  # the peer's IP address
    peercert: dict[str, object] | None = None  # a verified TLS client certificate, if any

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes = b""
    headers: tuple[tuple[str, str], ...] = ()
    close: bool = False  # close the connection after this response


class _BadRequest(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


@dataclass(eq=False)
class _Conn:
    writer: asyncio.StreamWriter
    client: str
    idle: bool = False  # between requests on a keep-alive connection: may be evicted
    idle_since: float = 0.0
    proven: bool = False  # completed a request (2xx/3xx) or verified a client certificate
    busy: bool = False  # a request is being answered: never evicted then
    done: asyncio.Event = field(default_factory=asyncio.Event)


Handler = Callable[[Request], Awaitable[Response]]
TlsHook = Callable[[], ssl.SSLContext]  # the context for a new connection (rotation)
PeerCheck = Callable[[dict[str, object] | None], bool]  # after the handshake: admit?


class HttpServer:
    """Serves `handler` on a listening socket bound in the constructor (so a port in use fails
    there), in a daemon thread running its own event loop."""

    def __init__(self, sock: socket.socket, handler: Handler, *, limits: Limits = DEFAULT_LIMITS,
                 tls: TlsHook | None = None, peer_ok: PeerCheck | None = None,
                 server_header: str = "", extra_headers: tuple[tuple[str, str], ...] = ()
                 ) -> None:
        self.sock = sock
        self.handler = handler
        self.limits = limits
        self.tls = tls
        self.peer_ok = peer_ok
        self.server_header = server_header
        self.extra_headers = extra_headers
        self._conns: dict[_Conn, None] = {}  # insertion-ordered: oldest first
        self._per_client: dict[str, int] = {}
        # fresh connections per address, oldest first; and how many there are in all
        self._fresh: dict[str, dict[_Conn, None]] = {}
        self._fresh_total = 0
        self.evicted = 0  # connections closed to admit another (for tests and benches)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stopped = False
        sock.listen(limits.backlog)  # before start(): connections queue from now on

    # --- lifecycle ----------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="exporter-web", daemon=True)
        self._thread.start()
        self._ready.wait()

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._main())
        finally:
            loop.close()

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        server = await asyncio.start_server(
            self._accept, sock=self.sock, backlog=self.limits.backlog,
            limit=self.limits.max_header_line)
        self._ready.set()
        async with server:
            await self._stop.wait()
            server.close()
            for conn in list(self._conns):
                conn.writer.transport.abort()  # their reads end: the tasks finish by themselves
            pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            if pending:
                _, stuck = await asyncio.wait(pending, timeout=2.0)
                for t in stuck:  # a bcrypt call still running, at most
                    t.cancel()

    def shutdown(self) -> None:
        """Stop serving, drop open connections and close the listening socket. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        if self._loop is not None and self._stop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join()
        with contextlib.suppress(OSError):
            self.sock.close()

    @property
    def connections(self) -> int:
        return len(self._conns)

    # --- admission ---------------------------------------------------------------------------
    def _admit(self, conn: _Conn) -> bool:
        lim, c = self.limits, conn.client
        if self._per_client.get(c, 0) >= lim.max_per_client and \
                not self._evict(self._idle_proven(c)):
            return False
        if self._fresh_total >= lim.max_connections - lim.reserved and \
                not self._evict(self._fresh_victim(c)):
            return False
        if len(self._conns) >= lim.max_connections and not self._evict(self._any_victim(c)):
            return False
        self._conns[conn] = None
        self._per_client[c] = self._per_client.get(c, 0) + 1
        self._fresh.setdefault(c, {})[conn] = None
        self._fresh_total += 1
        return True

    def _fresh_victim(self, client: str) -> _Conn | None:
        """The oldest fresh connection, not mid-request, of the address holding the most fresh
        ones, if it holds at least two more than `client` (then the two end up no further
        apart): a few hosts cannot keep a new one out. Else `client`'s oldest idle proven."""
        mine = len(self._fresh.get(client, ()))
        heavy = max(self._fresh, key=lambda a: len(self._fresh[a]), default=None)
        if heavy is not None and heavy != client and len(self._fresh[heavy]) > mine + 1:
            for conn in self._fresh[heavy]:
                if not conn.busy:
                    return conn
        return None

    def _any_victim(self, client: str) -> _Conn | None:
        """Full with proven connections: an idle one (fresh first) of the address holding the
        most if it holds at least two more than `client`, else `client`'s own oldest idle."""
        mine = self._per_client.get(client, 0)
        heavy = max(self._per_client, key=self._per_client.__getitem__, default=None)
        if heavy is not None and heavy != client and self._per_client[heavy] > mine + 1:
            fresh = next((c for c in self._fresh.get(heavy, ()) if not c.busy), None)
            return fresh or self._idle_proven(heavy)
        return self._idle_proven(client)

    def _idle_proven(self, client: str) -> _Conn | None:
        """`client`'s keep-alive connection idle the longest (the old rule, within an IP)."""
        oldest: _Conn | None = None
        for c in self._conns:
            if c.idle and c.proven and c.client == client and (
                    oldest is None or c.idle_since < oldest.idle_since):
                oldest = c
        return oldest

    def _evict(self, victim: _Conn | None) -> bool:
        if victim is None:
            return False
        self._release(victim)
        victim.writer.transport.abort()
        self.evicted += 1
        return True

    def _prove(self, conn: _Conn) -> None:
        if not conn.proven:
            conn.proven = True
            self._drop_fresh(conn)

    def _drop_fresh(self, conn: _Conn) -> None:
        mine = self._fresh.get(conn.client)
        if mine is not None and mine.pop(conn, False) is None:
            self._fresh_total -= 1
            if not mine:
                del self._fresh[conn.client]

    def _release(self, conn: _Conn) -> None:
        if self._conns.pop(conn, False) is None:
            self._drop_fresh(conn)
            left = self._per_client[conn.client] - 1
            if left:
                self._per_client[conn.client] = left
            else:
                del self._per_client[conn.client]

    # --- one connection -----------------------------------------------------------------------
    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        client = str(peer[0]) if peer else "?"
        sock = writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):  # headers and body leave at once
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = _Conn(writer, client)
        if not self._admit(conn):
            log.debug("refusing %s: too many connections", client)
            if self.tls is not None:  # no handshake spent on a refusal
                writer.transport.abort()
                return
            busy = Response(503, b"too many connections\n", (("Retry-After", "1"),), close=True)
            writer.write(self._head(busy) + busy.body)
            await self._linger(reader, writer)
            return
        try:
            await self._serve(conn, reader, writer)
        except (OSError, ssl.SSLError, asyncio.IncompleteReadError, TimeoutError) as exc:
            log.debug("connection from %s: %s", client, exc or type(exc).__name__)
        except Exception:
            log.exception("serving %s", client)
        finally:
            self._release(conn)
            if not _gone(writer):
                writer.transport.abort()

    async def _serve(self, conn: _Conn, reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> None:
        lim = self.limits
        loop = asyncio.get_running_loop()
        deadline = loop.time() + lim.head_timeout  # first request: from accept
        peercert: dict[str, object] | None = None
        if self.tls is not None:
            try:
                async with asyncio.timeout_at(deadline):
                    await writer.start_tls(self.tls())
            except AttributeError:
                # The client closed as the handshake completed: start_tls kept no transport
                # and then read one (StreamReaderProtocol._replace_writer of CPython 3.11,
                # which the image runs).
                if not _gone(writer):
                    raise
                log.debug("connection from %s: closed as its TLS handshake ended", conn.client)
                return
            peercert = writer.get_extra_info("peercert")
            if self.peer_ok is not None and not self.peer_ok(peercert):
                log.info("client %s: certificate SAN not in client_allowed_sans", conn.client)
                return
            if peercert:
                self._prove(conn)  # a verified client certificate: authenticated
        first = True
        while True:
            if not first:
                conn.idle, conn.idle_since = True, loop.time()
                async with asyncio.timeout(lim.idle_timeout):
                    start = await reader.read(1)
                conn.idle = False
                if not start:
                    return
                deadline = loop.time() + lim.head_timeout  # from the request's first byte
            else:
                start = b""
            first = False
            try:
                async with asyncio.timeout_at(deadline):
                    request = await self._read_head(reader, start, conn.client, peercert)
            except _BadRequest as bad:
                log.debug("%s: %d %s", conn.client, bad.status, bad)
                await self._send(writer, Response(bad.status, f"{bad}\n".encode(), close=True),
                                 False)
                await self._linger(reader, writer)
                return
            if request is None:
                return
            conn.busy = True
            response = await self._respond(request)
            head_only = request.method == "HEAD"
            keep = not response.close and _keep_alive(request)
            if not keep and not response.close:
                response = Response(response.status, response.body, response.headers, True)
            await self._send(writer, response, head_only)
            conn.busy = False
            if 200 <= response.status < 400:
                self._prove(conn)
            if response.close:
                await self._linger(reader, writer)
                return

    async def _respond(self, request: Request) -> Response:
        has_body = request.header("transfer-encoding") is not None or \
            _content_length(request) > 0
        if has_body and request.method in ("GET", "HEAD"):
            # Refused, and the connection closed before the body is read: a body left unread
            # on a kept-alive connection would be parsed as the next request.
            return Response(400, b"request body not allowed\n", close=True)
        response = await self.handler(request)
        if request.method not in ("GET", "HEAD") and not response.close:
            # Whatever the application said, a body may follow that nobody reads.
            response = Response(response.status, response.body, response.headers, True)
        return response

    async def _read_head(self, reader: asyncio.StreamReader, start: bytes, client: str,
                         peercert: dict[str, object] | None) -> Request | None:
        lim = self.limits
        lines: list[bytes] = []
        total = 0
        while True:
            try:
                line = start + await reader.readuntil(b"\n")
            except asyncio.LimitOverrunError:
                raise _BadRequest(431, "request header line too long") from None
            except asyncio.IncompleteReadError as exc:
                if not lines and not (start + exc.partial).strip():
                    return None  # closed between requests
                raise _BadRequest(400, "incomplete request") from None
            start = b""
            total += len(line)
            if total > lim.max_head_bytes:
                raise _BadRequest(431, "request header too large")
            line = line.rstrip(b"\r\n")
            if not line:
                if not lines:
                    continue  # RFC 9112 2.2: ignore empty lines before the request line
                break
            lines.append(line)
            if len(lines) > lim.max_headers + 1:
                raise _BadRequest(431, "too many request headers")
        return _parse_head(lines, client, peercert)

    async def _linger(self, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
        """Close after an answer the way Go does: stop sending, then read and discard what the
        client still sends for a moment (bounded in bytes and time), so that closing with
        unread data (which sends a TCP reset) does not destroy the answer before it is read."""
        with contextlib.suppress(OSError, TimeoutError, RuntimeError):
            if writer.can_write_eof():
                writer.write_eof()
            budget = 4 * self.limits.max_head_bytes
            async with asyncio.timeout(LINGER_SECONDS):
                while budget > 0 and (chunk := await reader.read(min(budget, 65536))):
                    budget -= len(chunk)

    async def _send(self, writer: asyncio.StreamWriter, response: Response,
                    head_only: bool) -> None:
        writer.write(self._head(response))
        if not head_only and response.body:
            # A second write, not a concatenation: no copy of a 300 KB body. With
            # TCP_NODELAY it does not wait for the client's delayed ACK.
            writer.write(response.body)
        async with asyncio.timeout(self.limits.write_timeout):
            await writer.drain()

    def _head(self, r: Response) -> bytes:
        try:
            phrase = HTTPStatus(r.status).phrase
        except ValueError:
            phrase = ""
        lines = [f"HTTP/1.1 {r.status} {phrase}",
                 f"Date: {email.utils.formatdate(usegmt=True)}"]
        if self.server_header:
            lines.append(f"Server: {self.server_header}")
        if not any(n.lower() == "content-type" for n, _ in r.headers):
            lines.append("Content-Type: text/plain; charset=utf-8")
        lines.append(f"Content-Length: {len(r.body)}")
        lines += [f"{n}: {v}" for n, v in (*self.extra_headers, *r.headers)]
        if r.close:
            lines.append("Connection: close")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1", "replace")


_TOKEN = frozenset(b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyz"
                   b"ABCDEFGHIJKLMNOPQRSTUVWXYZ")


def _parse_head(lines: list[bytes], client: str,
                peercert: dict[str, object] | None) -> Request:
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not parts[0] or not set(parts[0]) <= _TOKEN or not parts[1]:
        raise _BadRequest(400, "malformed request line")
    method, target, version = (p.decode("latin-1") for p in parts)
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        raise _BadRequest(505, "HTTP version not supported")
    headers: dict[str, str] = {}
    lengths: set[str] = set()
    for raw in lines[1:]:
        name_b, sep, value_b = raw.partition(b":")
        # No space before the colon, no obsolete line folding: both are smuggling vectors.
        if not sep or not name_b or not set(name_b) <= _TOKEN:
            raise _BadRequest(400, "malformed request header")
        name = name_b.decode("ascii").lower()
        value = value_b.strip(b" \t").decode("latin-1")
        if name == "content-length":
            lengths.add(value)
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    if len(lengths) > 1 or (lengths and not next(iter(lengths)).isdigit()):
        raise _BadRequest(400, "invalid Content-Length")
    if lengths:
        headers["content-length"] = next(iter(lengths))
    return Request(method, target, version, headers, client, peercert)


def _content_length(request: Request) -> int:
    value = request.header("content-length")
    return int(value) if value else 0


def _keep_alive(request: Request) -> bool:
    tokens = {t.strip().lower() for t in (request.header("connection") or "").split(",")}
    if request.version == "HTTP/1.0":
        return "keep-alive" in tokens
    return "close" not in tokens


def _gone(writer: asyncio.StreamWriter) -> bool:
    """Whether the writer has no transport: the client closed while its TLS handshake
    completed, and loop.start_tls returned None (CPython issue 105993, by design), which
    StreamWriter.start_tls keeps as the writer's transport."""
    transport: asyncio.WriteTransport | None = writer.transport
    return transport is None
