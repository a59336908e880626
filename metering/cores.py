"""The CPUs a metering process may use: one count for its worker processes (`meter --jobs
auto`) and its DuckDB threads."""

from __future__ import annotations

import contextlib
import math
import os
from pathlib import Path


def available_cores(cgroup: Path = Path("/sys/fs/cgroup")) -> int:
    """CPUs this process may run on (its affinity), fewer where a cgroup CPU quota is set
    (v2 cpu.max, v1 cpu.cfs_quota_us / cpu.cfs_period_us): a pod's `limits.cpu`."""
    cores = len(os.sched_getaffinity(0))
    quota: tuple[str, str] | None = None
    with contextlib.suppress(OSError, ValueError):
        text, length = (cgroup / "cpu.max").read_text().split()[:2]
        quota = (text, length)
    if quota is None:
        with contextlib.suppress(OSError):
            quota = ((cgroup / "cpu" / "cpu.cfs_quota_us").read_text().strip(),
                     (cgroup / "cpu" / "cpu.cfs_period_us").read_text().strip())
    if quota is not None and quota[0].lstrip("-").isdigit() and quota[1].isdigit():
        us, per = int(quota[0]), int(quota[1])
        if us > 0 and per > 0:
            cores = min(cores, math.ceil(us / per))
    return max(1, cores)
