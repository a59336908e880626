"""Stopping child processes (Prometheus, exporters, Chromium) the same way everywhere."""

from __future__ import annotations

import subprocess
from typing import Any


def stop(proc: subprocess.Popen[Any], timeout: float = 20) -> None:
    """SIGTERM, wait up to `timeout`, then SIGKILL: a hung child never hangs its parent."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
