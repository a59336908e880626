"""The standard process self-metrics every Prometheus exporter serves (process_*), read from
/proc without prometheus_client: resident memory, CPU seconds, open file descriptors and start
time. On a system without /proc (or a field that cannot be read) the value is left out."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

# Fields of /proc/PID/stat after the ")" that ends the command name (man 5 proc, 1-based
# field numbers minus 3): utime 14, stime 15, starttime 22, rss 24.
_UTIME, _STIME, _STARTTIME, _RSS = 11, 12, 19, 21


@dataclass(frozen=True)
class ProcessStats:
    resident_memory_bytes: float | None = None
    cpu_seconds: float | None = None
    open_fds: float | None = None
    start_time_seconds: float | None = None


def read_process_stats(proc_root: str = "/proc", pid: str = "self") -> ProcessStats:
    root = Path(proc_root)
    ticks = float(os.sysconf("SC_CLK_TCK")) if hasattr(os, "sysconf") else 100.0
    page = float(os.sysconf("SC_PAGE_SIZE")) if hasattr(os, "sysconf") else 4096.0
    rss = cpu = start = fds = None
    try:
        stat = (root / pid / "stat").read_text()
        fields = stat[stat.rindex(")") + 2:].split()
        rss = int(fields[_RSS]) * page
        cpu = (int(fields[_UTIME]) + int(fields[_STIME])) / ticks
        boot = _boot_time(root)
        if boot is not None:
            start = boot + int(fields[_STARTTIME]) / ticks
    except (OSError, ValueError, IndexError):
        pass
    with contextlib.suppress(OSError):
        fds = float(len(os.listdir(root / pid / "fd")))
    return ProcessStats(rss, cpu, fds, start)


def _boot_time(root: Path) -> float | None:
    for line in (root / "stat").read_text().splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    return None
