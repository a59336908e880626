"""Real Prometheus for tests: backfill history with promtool, run a server on loopback.

Reused by the metering, alert, dashboard and end-to-end tests:

    backfill(openmetrics_text, data_dir)
    with running_prometheus(data_dir) as url:
        ...

Backfilled samples must be older than the TSDB head (a few hours), so fixtures use past dates.
"""

from __future__ import annotations

import os
import tempfile
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from gpu_ledger import promserver
from gpu_ledger.promserver import free_port, running_prometheus

__all__ = ["backfill", "free_port", "http_server", "proxy_to", "running_prometheus"]


def backfill(openmetrics_text: str, data_dir: str | os.PathLike[str]) -> None:
    """Write `openmetrics_text` (timestamped samples, ending in `# EOF`) as TSDB blocks."""
    with tempfile.NamedTemporaryFile("w", suffix=".om", delete=False) as fh:
        fh.write(openmetrics_text)
        src = fh.name
    try:
        promserver.backfill(src, data_dir, timeout=120)
    finally:
        os.unlink(src)


# (status, content type, body) for a request path (with query string) and its headers.
Responder = Callable[[str, dict[str, str]], tuple[int, str, bytes]]


@contextmanager
def http_server(respond: Responder) -> Iterator[str]:
    """A loopback HTTP server answering every GET with `respond`; yields its base URL.
    For misbehaving-Prometheus tests (errors, HTML, slow answers) and proxies."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            try:
                status, ctype, body = respond(self.path, dict(self.headers.items()))
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (timeout tests)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def proxy_to(url: str, path: str, headers: dict[str, str]) -> tuple[int, str, bytes]:
    """Forward a GET to a real server (for http_server responders that fail selectively)."""
    try:
        with urllib.request.urlopen(url + path, timeout=30) as resp:
            return resp.status, resp.headers.get("Content-Type", ""), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Content-Type", ""), exc.read()
