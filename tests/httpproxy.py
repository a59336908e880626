"""A small forward HTTP proxy for tests, like Squid or a corporate egress proxy: CONNECT tunnels
(for https:// targets) and absolute-URI requests (for http:// targets), optional basic proxy
authentication, and a hosts map so that a target name which does not resolve on this machine
is reachable only through the proxy (a request that bypassed it fails to connect)."""

from __future__ import annotations

import base64
import select
import socket
import socketserver
import threading
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field


@dataclass
class ProxyLog:
    """What the proxy was asked: ("CONNECT", "host:port") or ("GET", absolute URI)."""

    requests: list[tuple[str, str]] = field(default_factory=list)
    refused: int = 0  # requests answered 407


def _pipe(a: socket.socket, b: socket.socket) -> None:
    """Copy bytes both ways until either side closes."""
    socks = [a, b]
    while True:
        readable, _, _ = select.select(socks, [], [], 30)
        if not readable:
            return
        for s in readable:
            data = s.recv(65536)
            if not data:
                return
            (b if s is a else a).sendall(data)


@contextmanager
def http_proxy(hosts: dict[str, str] | None = None,
               credentials: tuple[str, str] | None = None) -> Iterator[tuple[str, ProxyLog]]:
    """A proxy on 127.0.0.1:<free port>; yields its URL (`http://127.0.0.1:PORT`) and the log.
    `hosts` maps names to addresses for the upstream connections; with `credentials`, a
    request without the matching Proxy-Authorization gets 407."""
    log = ProxyLog()
    names = hosts or {}
    expected = None
    if credentials is not None:
        raw = f"{credentials[0]}:{credentials[1]}".encode()
        expected = "Basic " + base64.b64encode(raw).decode("ascii")

    class Handler(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            line = self.rfile.readline(65536).decode("latin-1").rstrip("\r\n")
            headers: list[tuple[str, str]] = []
            while True:
                h = self.rfile.readline(65536).decode("latin-1").rstrip("\r\n")
                if not h:
                    break
                name, _, value = h.partition(":")
                headers.append((name.strip(), value.strip()))
            try:
                method, target, _version = line.split(" ", 2)
            except ValueError:
                return
            log.requests.append((method, target))
            auth = next((v for k, v in headers if k.lower() == "proxy-authorization"), None)
            if expected is not None and auth != expected:
                log.refused += 1
                self.wfile.write(b"HTTP/1.1 407 Proxy Authentication Required\r\n"
                                 b"Proxy-Authenticate: Basic realm=\"test\"\r\n"
                                 b"Content-Length: 0\r\nConnection: close\r\n\r\n")
                return
            if method == "CONNECT":
                host, _, port = target.rpartition(":")
                upstream = socket.create_connection((names.get(host, host), int(port)), 10)
                self.wfile.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
                self.wfile.flush()
                with upstream:
                    _pipe(self.connection, upstream)
                return
            url = urllib.parse.urlsplit(target)
            if url.scheme != "http" or url.hostname is None:
                self.wfile.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
                return
            upstream = socket.create_connection(
                (names.get(url.hostname, url.hostname), url.port or 80), 10)
            path = url.path + (f"?{url.query}" if url.query else "")
            kept = [(k, v) for k, v in headers
                    if k.lower() not in ("proxy-authorization", "connection")]
            head = f"{method} {path or '/'} HTTP/1.1\r\n" + "".join(
                f"{k}: {v}\r\n" for k, v in kept) + "Connection: close\r\n\r\n"
            with upstream:
                upstream.sendall(head.encode("latin-1"))
                while data := upstream.recv(65536):
                    self.wfile.write(data)

    class Server(socketserver.ThreadingTCPServer):
        daemon_threads = True
        allow_reuse_address = True

    server = Server(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", log
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
