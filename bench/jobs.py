"""`meter --jobs 1` against `--jobs N` on the same month of a synthetic fleet in
VictoriaMetrics (bench.scale's fleet and store): wall time, CPU seconds and peak RSS of the
metering process and of its worker processes, and whether both ledgers hold the same facts.

    python -m bench.jobs --gpus 1000 --jobs 2
    python -m bench.jobs --gpus 1000 --jobs 4 8 16 --json out.json   # several counts, one store
"""

from __future__ import annotations

import argparse
import math
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import child_program, child_usage, machine, write_json
from bench.scale import Fleet, Victoria, import_fleet
from metering.db import connect
from metering.period import Month


def _meter(url: str, db: Path, month: str, jobs: int) -> dict[str, float]:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", child_program(), "meter", "--prometheus", url,
                           "--month", month, "--db", str(db), "--no-price", "--quiet",
                           "--jobs", str(jobs)], capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    usage = child_usage(proc.stderr)
    if proc.returncode != 0 or math.isnan(usage["cpu_s"]):  # NaN: it did not get there
        raise SystemExit(f"meter --jobs {jobs} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return {"wall_s": wall, "cpu_s": usage["cpu_s"],
            "parent_cpu_s": usage["cpu_s"] - usage["workers_cpu_s"],
            "workers_cpu_s": usage["workers_cpu_s"], "parent_rss_mib": usage["maxrss_mib"],
            "worker_rss_mib": usage["worker_maxrss_mib"]}


def _facts(db: Path) -> list[tuple[object, ...]]:
    with connect(db, read_only=True) as con:
        return [tuple(con.execute(f"SELECT count(*), sum(hash({t})) FROM {t}").fetchone() or ())
                for t in ("device_hours", "mig_hours", "allocation_hours")]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.jobs", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpus", type=int, default=1000)
    p.add_argument("--month", default="2026-10")
    p.add_argument("--interval", type=int, default=300)
    p.add_argument("--jobs", type=int, nargs="+", default=[2],
                   help="worker counts to compare with --jobs 1 (default 2)")
    p.add_argument("--json", help="also write the figures here")
    args = p.parse_args(argv)
    span = Month.parse(args.month).period()  # aware UTC bounds
    start, end = span.start, span.end
    work = Path(tempfile.mkdtemp(prefix="gpu-ledger-jobs-"))
    vm = Victoria(work / "vm-data")
    try:
        fleet = Fleet(args.gpus, start, end, args.interval)
        import_fleet(vm, fleet)
        print(f"{args.gpus} GPUs, {args.month}, {fleet.samples:,} samples, "
              f"{fleet.series:,} series; {resource.getpagesize()} B pages", flush=True)
        facts = {}
        runs: dict[int, dict[str, float]] = {}
        for jobs in dict.fromkeys([1, *args.jobs]):
            db = work / f"j{jobs}.duckdb"
            r = runs[jobs] = _meter(vm.url, db, args.month, jobs)
            facts[jobs] = _facts(db)
            print(f"--jobs {jobs}: wall {r['wall_s']:.1f} s, CPU {r['cpu_s']:.1f} s "
                  f"(writer {r['parent_cpu_s']:.1f} + workers {r['workers_cpu_s']:.1f}), "
                  f"peak RSS writer {r['parent_rss_mib']:.0f} MiB, largest worker "
                  f"{r['worker_rss_mib']:.0f} MiB", flush=True)
        same = all(f == facts[1] for f in facts.values())
        print("same facts" if same else f"DIFFERENT facts: {facts}")
        if args.json:
            write_json(args.json, {"machine": machine(), "gpus": args.gpus,
                                   "samples": fleet.samples, "series": fleet.series,
                                   "same_facts": same,
                                   "runs": {str(j): r for j, r in runs.items()}})
    finally:
        vm.close()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
