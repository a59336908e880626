"""Real Prometheus for tests: backfill history with promtool, run a server on loopback.

Reused by the metering, alert, dashboard and end-to-end tests:

    backfill(openmetrics_text, data_dir)
    with running_prometheus(data_dir) as url:
        ...

Backfilled samples must be older than the TSDB head (a few hours), so fixtures use past dates.
"""

from __future__ import annotations

import os
import socket
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

PROMETHEUS = "/usr/bin/prometheus"
PROMTOOL = "/usr/bin/promtool"

# No scrape targets: the server only answers queries over backfilled blocks (and rules, if a
# caller's config loads some).
MINIMAL_CONFIG = "global:\n  scrape_interval: 1m\n  evaluation_interval: 1m\n"


def backfill(openmetrics_text: str, data_dir: str | os.PathLike[str]) -> None:
    """Write `openmetrics_text` (timestamped samples, ending in `# EOF`) as TSDB blocks."""
    data = Path(data_dir)
    data.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", suffix=".om", delete=False) as fh:
        fh.write(openmetrics_text)
        src = fh.name
    try:
        # Large blocks: fewer files for the server to open and nothing left to compact.
        proc = subprocess.run(
            [PROMTOOL, "tsdb", "create-blocks-from", "openmetrics",
             "--max-block-duration=240h", src, str(data)],
            capture_output=True, text=True, timeout=120, check=False,
        )
    finally:
        os.unlink(src)
    if proc.returncode != 0:
        raise RuntimeError(f"promtool backfill failed ({proc.returncode}):\n{proc.stderr}"
                           f"{proc.stdout}")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path, deadline_s: float) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"prometheus exited with {proc.returncode}:\n{log.read_text()}")
        try:
            with urllib.request.urlopen(url + "/-/ready", timeout=2) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.1)
    raise RuntimeError(f"prometheus not ready after {deadline_s}s:\n{log.read_text()}")


@contextmanager
def running_prometheus(data_dir: str | os.PathLike[str], config: str | None = None,
                       extra_args: tuple[str, ...] = ()) -> Iterator[str]:
    """Run /usr/bin/prometheus over `data_dir` on 127.0.0.1:<free port>; yield its base URL.

    `config` is the YAML text of prometheus.yml (default: no scrape targets). The server is
    stopped (SIGTERM, then SIGKILL) when the block exits.
    """
    data = Path(data_dir)
    data.mkdir(parents=True, exist_ok=True)
    cfg = data.parent / f"{data.name}-prometheus.yml"
    cfg.write_text(config if config is not None else MINIMAL_CONFIG)
    log = data.parent / f"{data.name}-prometheus.log"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with log.open("wb") as log_fh:
        proc = subprocess.Popen(
            [PROMETHEUS, f"--config.file={cfg}", f"--storage.tsdb.path={data}",
             f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=10y",
             "--web.enable-lifecycle", *extra_args],
            stdout=log_fh, stderr=subprocess.STDOUT,
        )
    try:
        _wait_ready(url, proc, log, deadline_s=60)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


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
