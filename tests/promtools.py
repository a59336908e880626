"""Real Prometheus for tests: backfill history with promtool, run a server on loopback.

Reused by the metering, alert, dashboard and end-to-end tests:

    backfill(openmetrics_text, data_dir)
    with running_prometheus(data_dir) as url:
        ...

Backfilled samples must be older than the TSDB head (a few hours), so fixtures use past dates.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from gpu_ledger import promserver
from gpu_ledger.procutil import stop
from gpu_ledger.promserver import free_port, running_prometheus

__all__ = ["backfill", "free_port", "http_server", "proxy_to", "running_prometheus",
           "running_victoria", "vm_import"]


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


@contextmanager
def running_victoria(path: Path, *flags: str) -> Iterator[str]:
    """A real single-node VictoriaMetrics (Debian package `victoria-metrics`) storing under
    `path` on 127.0.0.1:<free port>; yields its base URL, stops it when the block exits."""
    binary = shutil.which("victoria-metrics")
    assert binary, "victoria-metrics is not installed: apt-get install -y victoria-metrics"
    port = free_port()
    log_path = path.parent / f"{path.name}.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen([binary, f"-storageDataPath={path}",
                                 f"-httpListenAddr=127.0.0.1:{port}", "-retentionPeriod=100y",
                                 "-search.disableCache", *flags],
                                stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2):
                    break
            except OSError:
                assert proc.poll() is None, log_path.read_text()
                assert time.monotonic() < deadline, "victoria-metrics did not start"
                time.sleep(0.1)
        yield url
    finally:
        stop(proc)


def vm_import(url: str, prometheus_text: str) -> None:
    """Prometheus text with millisecond timestamps into VictoriaMetrics, flushed for queries."""
    req = urllib.request.Request(f"{url}/api/v1/import/prometheus",
                                 data=prometheus_text.encode(), method="POST")
    with urllib.request.urlopen(req, timeout=60):
        pass
    with urllib.request.urlopen(f"{url}/internal/force_flush", timeout=30):
        pass


PUSHGATEWAY = "/usr/bin/prometheus-pushgateway"


@contextmanager
def running_pushgateway(workdir: Path) -> Iterator[str]:
    """A real Prometheus Pushgateway on a free loopback port; yields its base URL."""
    binary = shutil.which("prometheus-pushgateway") or PUSHGATEWAY
    port = free_port()
    proc = subprocess.Popen([binary, f"--web.listen-address=127.0.0.1:{port}",
                             f"--persistence.file={workdir / 'pgw.store'}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):
            try:
                urllib.request.urlopen(url + "/-/ready", timeout=1).read()
                break
            except OSError:
                time.sleep(0.05)
        else:
            raise AssertionError("pushgateway did not start")
        yield url
    finally:
        stop(proc, timeout=10)
