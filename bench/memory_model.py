"""Ingest's memory model from what one chunk's answers actually hold (issue 27, item 3).

Injects fleets of different sizes into one VictoriaMetrics store, each in its own 72-hour
window (one chunk: `bench.scale`'s deterministic fleet), then meters each window in a process
of its own (`gpu-ledger meter --no-price`) and records its peak RSS against the points its
answers held (the planner's unit: one per series, signal and evaluation hour):

- with an unlimited budget (one node group: every answer of the chunk held at once), at two or
  more sizes: the slope is the bytes per point, the intercept the base;
- at the largest size under the given budgets (default 2 GiB, and 1.5 GiB: 3/4 of the
  CronJob's 2 GiB limit): node groups should keep the peak under the budget.

    python -m bench.memory_model --gpus 2500,10000 --budgets-mib 2048,1536 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench.common import child_program, child_usage, machine, say, table, write_json
from bench.scale import Fleet, Victoria, import_fleet

# One signal per (family, reducer) the planner counts: bench.scale's device families carry 7,
# its container families 6 (metering.signals.SIGNALS).
DEVICE_SIGNALS_PER_GPU = 7
CONTAINER_SIGNALS_PER_SERIES = 2  # 6 signals over 3 families

_CHILD = child_program(
    "budget = int(sys.argv.pop(1))\n"
    "import metering.cli_meter as cm\n"
    # as a container memory limit of budget x 4/3 gives
    "cm.memory_budget = lambda: budget\n")
UNLIMITED = 1 << 40  # one node group whatever the chunk holds


def meter(url: str, start: datetime, end: datetime, budget: int,
          before: str | None = None) -> dict[str, Any]:
    """One `meter --no-price` of the window in a child; `before`: a checkout of the code to
    compare with, the child's working directory (`python -c` puts it first on the path,
    ahead of PYTHONPATH: a PYTHONPATH checkout lost to this one when the bench ran from it)."""
    env = {**os.environ, "PYTHONPATH": before} if before else None
    cwd = str(Path(before).resolve()) if before else None
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-c", _CHILD, str(budget), "meter", "--prometheus", url,
             "--from", f"{start:%Y-%m-%dT%H:%M:%SZ}", "--to", f"{end:%Y-%m-%dT%H:%M:%SZ}",
             "--db", str(Path(tmp) / "l.duckdb"), "--no-price", "--verbose"],
            capture_output=True, text=True, check=False, env=env, cwd=cwd)
        wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"meter failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    chunk = re.search(r"meter: (chunks of .*)", proc.stderr)
    split = re.search(r"meter: queries: (.*)", proc.stderr)
    return {"wall_s": wall, **child_usage(proc.stderr),
            "chunk": chunk.group(1) if chunk else "", "split": split.group(1) if split else ""}


def fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares line: (intercept, slope)."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    return my - slope * mx, slope


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.memory_model", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpus", default="2500,10000", help="fleet sizes, comma-separated")
    p.add_argument("--hours", type=int, default=72, help="window metered (one chunk: 72)")
    p.add_argument("--interval", type=int, default=900, help="seconds between samples "
                   "(the points ingest holds are per hour: this only sets the import's size)")
    p.add_argument("--budgets-mib", default="2048,1536")
    p.add_argument("--workdir", help="keep the store here; a second run with the same sizes "
                   "reuses it (no import)")
    p.add_argument("--skip-unlimited", action="store_true",
                   help="only the budget runs (with a reused store)")
    p.add_argument("--before", metavar="DIR",
                   help="also meter each case with the code checked out in DIR (e.g. `git "
                        "archive REV | tar -x -C DIR`), alternating with this checkout")
    p.add_argument("--json")
    args = p.parse_args(argv)
    sizes = [int(x) for x in args.gpus.split(",")]
    budgets = [int(x) << 20 for x in args.budgets_mib.split(",") if x]
    work = Path(args.workdir or tempfile.mkdtemp(prefix="gpu-ledger-memmodel-"))
    work.mkdir(parents=True, exist_ok=True)
    res: dict[str, Any] = {"machine": machine(), "hours": args.hours,
                           "interval_s": args.interval, "runs": []}
    saved = work / "windows.json"
    reuse = saved.is_file() and json.loads(saved.read_text())["sizes"] == sizes
    vm = Victoria(work / "vm-data")
    try:
        windows = []
        # each fleet in its own window of the same store
        for i, gpus in enumerate(sizes if not reuse else []):
            start = datetime(2026, 10, 1, tzinfo=UTC) + timedelta(days=7 * i)
            end = start + timedelta(hours=args.hours)
            fleet = Fleet(gpus, start, end, args.interval)
            t0 = time.perf_counter()
            import_fleet(vm, fleet)
            pod_gpus = sum(g for *_, g in fleet.pods)
            points = (args.hours + 1) * (fleet.nodes * 8 * DEVICE_SIGNALS_PER_GPU
                                         + (fleet.series - fleet.nodes * 8 * 4)
                                         * CONTAINER_SIGNALS_PER_SERIES)
            say(f"memory_model: {gpus:,} GPUs: {fleet.series:,} series, {pod_gpus:,} pod-GPUs, "
                f"{points:,} points per chunk; imported in {time.perf_counter() - t0:.0f} s")
            windows.append((gpus, fleet.series, points, start, end))
        if reuse:
            windows = [(g, s, p, datetime.fromisoformat(a), datetime.fromisoformat(b))
                       for g, s, p, a, b in json.loads(saved.read_text())["windows"]]
        else:
            saved.write_text(json.dumps({"sizes": sizes, "windows": [
                (g, s, p, a.isoformat(), b.isoformat()) for g, s, p, a, b in windows]}))
        for gpus, series, points, start, end in windows:
            first = [] if args.skip_unlimited else [UNLIMITED]
            for budget in first + (budgets if gpus == max(sizes) else []):
                for code in ([args.before, None] if args.before else [None]):
                    r = meter(vm.url, start, end, budget, code)
                    r.update(gpus=gpus, series=series, points=points, code=code or "this",
                             budget_mib=None if budget == UNLIMITED else budget >> 20)
                    res["runs"].append(r)
                    say(f"memory_model: {gpus:,} GPUs, budget "
                        f"{'unlimited' if budget == UNLIMITED else f'{budget >> 20} MiB'}"
                        f"{f' ({code})' if code else ''}: peak {r['maxrss_mib']:,.0f} MiB, "
                        f"{r['cpu_s']:.0f} CPU-s; {r['split']}")
    finally:
        vm.close()
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    one = [r for r in res["runs"] if r["budget_mib"] is None and r["code"] == "this"]
    if len(one) >= 2:
        base, slope = fit([r["points"] for r in one], [r["maxrss_mib"] * 2**20 for r in one])
        res["fit"] = {"base_mib": base / 2**20, "bytes_per_point": slope}
        say(f"memory_model: fit over one-group runs: base {base / 2**20:,.0f} MiB, "
            f"{slope:,.0f} bytes per point")
    rows = [[r["code"], f"{r['gpus']:,}", f"{r['series']:,}", f"{r['points']:,}",
             "unlimited (one group)" if r["budget_mib"] is None else f"{r['budget_mib']:,} MiB",
             f"{r['maxrss_mib']:,.0f}", f"{r['cpu_s']:.0f}", r["split"]] for r in res["runs"]]
    say(table(["code", "GPUs", "series", "points per chunk", "budget", "peak RSS MiB", "CPU-s",
               "queries"], rows))
    write_json(args.json, res)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
