"""Run the real Prometheus (Debian package) for the demo and the tests: backfill history
with promtool, serve it on loopback, stop it cleanly."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from gpu_ledger.procutil import stop

INSTALL_HINT = "install it with `sudo apt-get install -y prometheus` (Debian/Ubuntu)"
NO_TARGETS = "global:\n  scrape_interval: 1m\n  evaluation_interval: 1m\n"


class PrometheusMissing(RuntimeError):
    pass


def binaries() -> tuple[str, str]:
    """(prometheus, promtool) paths, or PrometheusMissing saying how to install them."""
    prom = shutil.which("prometheus") or ("/usr/bin/prometheus"
                                          if os.path.exists("/usr/bin/prometheus") else None)
    tool = shutil.which("promtool") or ("/usr/bin/promtool"
                                        if os.path.exists("/usr/bin/promtool") else None)
    if not prom or not tool:
        raise PrometheusMissing(f"prometheus/promtool not found: {INSTALL_HINT}")
    return prom, tool


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def backfill(openmetrics_file: str | os.PathLike[str], data_dir: str | os.PathLike[str],
             timeout: float = 600) -> None:
    """Turn a timestamped OpenMetrics file into TSDB blocks under data_dir."""
    _, promtool = binaries()
    Path(data_dir).mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", "--max-block-duration=240h",
         str(openmetrics_file), str(data_dir)],
        capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"promtool backfill failed ({proc.returncode}):\n"
                           f"{proc.stderr[-2000:]}{proc.stdout[-2000:]}")


@contextmanager
def running_prometheus(data_dir: str | os.PathLike[str], config: str | None = None,
                       extra_args: tuple[str, ...] = (),
                       ready_timeout: float = 60) -> Iterator[str]:
    """Run prometheus over data_dir on 127.0.0.1:<free port>; yield its base URL. `config`
    is prometheus.yml text (default: no scrape targets). Stopped when the block exits."""
    prometheus, _ = binaries()
    data = Path(data_dir)
    data.mkdir(parents=True, exist_ok=True)
    cfg = data.parent / f"{data.name}-prometheus.yml"
    cfg.write_text(config if config is not None else NO_TARGETS)
    log = data.parent / f"{data.name}-prometheus.log"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with log.open("wb") as log_fh:
        proc = subprocess.Popen(
            [prometheus, f"--config.file={cfg}", f"--storage.tsdb.path={data}",
             f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=10y",
             "--web.enable-lifecycle", *extra_args],
            stdout=log_fh, stderr=subprocess.STDOUT)
    try:
        _wait_ready(url, proc, log, ready_timeout)
        yield url
    finally:
        stop(proc)


def _wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"prometheus exited with {proc.returncode}:\n"
                               f"{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url + "/-/ready", timeout=2) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.1)
    raise RuntimeError(f"prometheus not ready after {timeout:.0f}s:\n{log.read_text()[-3000:]}")


def scrape_config(targets: list[str], interval: str = "5s",
                  job: str = "gpu-ledger-exporter",
                  rule_files: list[Path] | None = None) -> str:
    quoted = ", ".join(f"'{t}'" for t in targets)
    rules = "".join(f"  - '{p.resolve()}'\n" for p in rule_files or [])
    return (f"global:\n  scrape_interval: {interval}\n  evaluation_interval: {interval}\n"
            + (f"rule_files:\n{rules}" if rules else "")
            + f"scrape_configs:\n  - job_name: {job}\n    static_configs:\n"
            f"      - targets: [{quoted}]\n")
