"""Helpers shared by the benchmarks: statistics, /proc readings, the machine line, output."""

from __future__ import annotations

import json
import os
import platform
import re
import statistics
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

_CLK_TCK = os.sysconf("SC_CLK_TCK")


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (p in 0-100) of an unsorted sample."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(p / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def summary_ms(seconds: Sequence[float]) -> dict[str, float]:
    """p50 / p99 / max / mean of durations given in seconds, in milliseconds."""
    return {"n": len(seconds), "p50_ms": percentile(seconds, 50) * 1e3,
            "p99_ms": percentile(seconds, 99) * 1e3, "max_ms": max(seconds) * 1e3,
            "mean_ms": statistics.fmean(seconds) * 1e3}


def rss_mib(pid: int | str = "self") -> float:
    """Resident set size (VmRSS) of a process, in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS in /proc/{pid}/status")


def cpu_seconds(pid: int | str = "self") -> float:
    """User + system CPU time a process (all its threads) has used."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()  # the name may hold spaces
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


def child_program(prelude: str = "") -> str:
    """A `python -c` program that runs `gpu-ledger` (its arguments) after `prelude` (a bench's
    patch, reading its own leading arguments) and writes its peak RSS and CPU seconds to stderr
    for `child_usage`: a child's own figures, not the parent's high-water mark, and those of
    its worker processes (`meter --jobs`; waited for, so counted in RUSAGE_CHILDREN)."""
    return ("import resource, sys\n" + prelude + "from gpu_ledger.cli import main\n"
            "try:\n    rc = main()\n"
            "finally:\n    u = resource.getrusage(resource.RUSAGE_SELF)\n"
            "    c = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
            "    sys.stderr.write('\\nBENCH_MAXRSS_KIB %d\\nBENCH_CPU_S %.2f\\n"
            "BENCH_WORKERS %d %.2f\\n' % (u.ru_maxrss, u.ru_utime + u.ru_stime, "
            "c.ru_maxrss, c.ru_utime + c.ru_stime))\n"
            "raise SystemExit(rc)\n")


def child_usage(stderr: str) -> dict[str, float]:
    """`cpu_s` (with its worker processes') and `maxrss_mib` (its own) a `child_program`
    wrote, and its workers' `workers_cpu_s` and `worker_maxrss_mib` (the largest one's; 0
    without workers); NaN where it did not get to."""
    rss = re.search(r"BENCH_MAXRSS_KIB (\d+)", stderr)
    cpu = re.search(r"BENCH_CPU_S ([\d.]+)", stderr)
    workers = re.search(r"BENCH_WORKERS (\d+) ([\d.]+)", stderr)
    w_rss, w_cpu = (int(workers.group(1)) / 1024, float(workers.group(2))) if workers \
        else (0.0, 0.0)
    return {"cpu_s": float(cpu.group(1)) + w_cpu if cpu else float("nan"),
            "maxrss_mib": int(rss.group(1)) / 1024 if rss else float("nan"),
            "workers_cpu_s": w_cpu, "worker_maxrss_mib": w_rss}


def machine() -> dict[str, Any]:
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {"cpu": model, "cores": os.cpu_count(), "memory_gib": round(mem_gib, 1),
            "python": platform.python_version(), "kernel": platform.release(),
            "date": datetime.now(UTC).strftime("%Y-%m-%d"),
            "command": " ".join([Path(sys.executable).name, *sys.argv])}


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A Markdown table, ready to paste into docs/performance.md."""
    def cell(v: object) -> str:
        if isinstance(v, float):
            return f"{v:,.3f}" if abs(v) < 10 else f"{v:,.1f}"
        return f"{v:,}" if isinstance(v, int) else str(v)
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def say(text: str) -> None:
    print(text, flush=True)


def write_json(path: str | None, results: dict[str, Any]) -> None:
    if path:
        Path(path).write_text(json.dumps(results, indent=2, default=str) + "\n")
        say(f"results written to {path}")


class Stopwatch:
    """Wall and process CPU time of a block."""

    def __enter__(self) -> Stopwatch:
        self.wall0, self.cpu0 = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self.wall0
        self.cpu = time.process_time() - self.cpu0


def stage_cell(r: dict[str, Any]) -> str:
    """One timed stage (`run_stage`'s result) as a table cell: wall / CPU / peak RSS."""
    return f"{r['wall_s']:.1f} s / {r['cpu_s']:.1f} s / {r['maxrss_mib']:,.0f} MiB"
