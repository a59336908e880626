"""Unary gRPC calls over HTTP/2 on a unix socket, with the pure-Python `h2` state machine.

The kubelet's PodResources API needs two unary calls a cycle. grpcio costs ~15 MiB of RSS and
six native threads for that (docs/performance.md, "Memory"); this is one blocking socket on the
caller's thread. Supported: identity encoding, one request and one response message, deadlines
(`grpc-timeout` and the socket timeout), Trailers-Only answers. Not needed here, so absent:
TLS, compression, streaming calls.
"""

from __future__ import annotations

import socket
import time
from enum import IntEnum
from urllib.parse import unquote

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings

from exporter import __version__

_WINDOW = 16 << 20  # flow-control window we grant: a whole response without stalls
_PREFIX = 5  # a gRPC message: 1 byte compressed flag, 4 bytes length


class StatusCode(IntEnum):
    """gRPC status codes (the grpc-status trailer)."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


class RpcError(Exception):
    def __init__(self, code: StatusCode, message: str = "") -> None:
        self.code, self.message = code, message
        super().__init__(f"{code.name}: {message}" if message else code.name)

    @property
    def reason(self) -> str:
        """`deadline-exceeded`, `unavailable`, ...: gRPC's names, for source_error_info."""
        return self.code.name.lower().replace("_", "-")


class _Stale(Exception):
    """The connection ended before any answer to this call: nothing was processed."""


class UnaryChannel:
    """One HTTP/2 connection to a unix socket, opened on the first call. After any failure the
    connection is closed; the next call opens a fresh one (a restarted server at once)."""

    def __init__(self, socket_path: str, *, max_message: int = 16 << 20) -> None:
        self.socket_path = socket_path
        self.max_message = max_message
        self._sock: socket.socket | None = None
        self._h2: h2.connection.H2Connection | None = None

    def call(self, method: str, request: bytes, timeout: float) -> bytes:
        """POST one message to `method` (`/package.Service/Method`); the response message.
        Raises RpcError (DEADLINE_EXCEEDED, UNAVAILABLE, or the server's status)."""
        deadline = time.monotonic() + timeout
        reused = self._sock is not None
        try:
            return self._attempt(method, request, deadline, timeout)
        except _Stale as err:
            if not reused:
                raise RpcError(StatusCode.UNAVAILABLE, "connection closed by the server") from err
        # The server closed an idle connection (GOAWAY, keepalive, restart) before answering:
        # the calls here are reads, so one retry on a fresh connection is safe.
        left = max(0.001, deadline - time.monotonic())
        try:
            return self._attempt(method, request, deadline, left)
        except _Stale as err:
            raise RpcError(StatusCode.UNAVAILABLE, "connection closed by the server") from err

    def _attempt(self, method: str, request: bytes, deadline: float, timeout: float) -> bytes:
        try:
            return self._call(method, request, deadline, timeout)
        except (RpcError, _Stale):
            self.close()
            raise
        except TimeoutError as err:
            self.close()
            raise RpcError(StatusCode.DEADLINE_EXCEEDED, "deadline exceeded") from err
        except (OSError, h2.exceptions.H2Error) as err:
            self.close()
            raise RpcError(StatusCode.UNAVAILABLE, str(err) or type(err).__name__) from err

    def close(self) -> None:
        sock, self._sock, self._h2 = self._sock, None, None
        if sock is not None:
            sock.close()

    # --- one call ------------------------------------------------------------------------------
    def _connect(self, timeout: float) -> tuple[socket.socket, h2.connection.H2Connection]:
        if self._sock is None or self._h2 is None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.settimeout(timeout)
                sock.connect(self.socket_path)
                conn = h2.connection.H2Connection(
                    h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
                conn.initiate_connection()
                conn.update_settings({h2.settings.SettingCodes.ENABLE_PUSH: 0,
                                      h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: _WINDOW})
                conn.increment_flow_control_window(_WINDOW - 65535)
                sock.sendall(conn.data_to_send())
            except BaseException:
                sock.close()
                raise
            self._sock, self._h2 = sock, conn
        return self._sock, self._h2

    def _call(self, method: str, request: bytes, deadline: float, timeout: float) -> bytes:
        sock, conn = self._connect(timeout)
        stream = conn.get_next_available_stream_id()
        conn.send_headers(stream, [
            (":method", "POST"), (":scheme", "http"), (":path", method),
            (":authority", "localhost"), ("content-type", "application/grpc"),
            ("te", "trailers"), ("grpc-timeout", f"{max(1, int(timeout * 1000))}m"),
            ("user-agent", f"gpu-ledger/{__version__}")])
        conn.send_data(stream, b"\x00" + len(request).to_bytes(4, "big") + request,
                       end_stream=True)
        try:
            sock.sendall(conn.data_to_send())
        except (BrokenPipeError, ConnectionResetError) as err:
            raise _Stale from err
        body = bytearray()
        answered = False  # any frame of this stream seen
        status: dict[str, str] = {}
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            sock.settimeout(remaining)
            try:
                data = sock.recv(1 << 16)
            except ConnectionResetError as err:
                if answered:
                    raise
                raise _Stale from err
            if not data:
                if answered:
                    raise RpcError(StatusCode.UNAVAILABLE, "connection closed mid-answer")
                raise _Stale
            ended = False
            for event in conn.receive_data(data):
                if isinstance(event, (h2.events.ResponseReceived, h2.events.TrailersReceived)):
                    if event.stream_id == stream and event.headers:
                        answered = True
                        status.update((str(k), str(v)) for k, v in event.headers)
                elif isinstance(event, h2.events.DataReceived):
                    if event.stream_id == stream:
                        body += event.data
                        if len(body) > self.max_message + _PREFIX:
                            raise RpcError(StatusCode.RESOURCE_EXHAUSTED,
                                           f"response larger than {self.max_message} bytes")
                    conn.acknowledge_received_data(event.flow_controlled_length,
                                                   event.stream_id)
                elif isinstance(event, h2.events.StreamEnded) and event.stream_id == stream:
                    ended = True
                elif isinstance(event, h2.events.StreamReset) and event.stream_id == stream:
                    raise RpcError(StatusCode.UNAVAILABLE, f"stream reset ({event.error_code})")
                elif isinstance(event, h2.events.ConnectionTerminated):
                    last = event.last_stream_id
                    if not answered and (last is None or last < stream):
                        raise _Stale  # GOAWAY: our stream was never processed
                    raise RpcError(StatusCode.UNAVAILABLE,
                                   f"connection closed ({event.error_code})")
            pending = conn.data_to_send()
            if pending:
                sock.sendall(pending)
            if ended:
                return _message(status, bytes(body))


def _message(headers: dict[str, str], body: bytes) -> bytes:
    """The one response message, or the RpcError the status says."""
    if headers.get(":status", "200") != "200":
        raise RpcError(StatusCode.UNAVAILABLE, f"HTTP status {headers[':status']}")
    raw = headers.get("grpc-status")
    if raw is None:
        raise RpcError(StatusCode.INTERNAL, "no grpc-status in the response")
    try:
        code = StatusCode(int(raw))
    except ValueError:
        code = StatusCode.UNKNOWN
    if code != StatusCode.OK:
        raise RpcError(code, unquote(headers.get("grpc-message", "")))
    if len(body) < _PREFIX or body[0] != 0:
        raise RpcError(StatusCode.INTERNAL, "not one uncompressed message")
    length = int.from_bytes(body[1:_PREFIX], "big")
    if len(body) != _PREFIX + length:
        raise RpcError(StatusCode.INTERNAL, "message length does not match the body")
    return body[_PREFIX:]
