"""The ledger's checkpoint threshold (metering.db.CHECKPOINT_THRESHOLD) against DuckDB's
default (16 MiB) on a month of a synthetic fleet in VictoriaMetrics (bench.scale's fleet and
store): `meter --no-price`, then `meter --price-only`, one process each, the two settings
alternated; the client's CPU seconds and peak RSS, the store's CPU seconds, the ledger file's
size after each stage, and whether both ledgers hold the same facts and charges.

    python -m bench.checkpoint --gpus 2500 --runs 2
    python -m bench.checkpoint --gpus 10000 --workdir /tmp/b10k --runs 1   # bench.scale's store
"""

from __future__ import annotations

import argparse
import math
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import child_program, child_usage, cpu_seconds, machine, table, write_json
from bench.scale import Fleet, Victoria, import_fleet
from metering.db import CHECKPOINT_THRESHOLD, connect
from metering.period import Month

DUCKDB_DEFAULT = "16MiB"
# The child sets the threshold before metering.db is used: its first argument.
_PRELUDE = ("import metering.db as _db\n"
            "_db.CHECKPOINT_THRESHOLD = sys.argv.pop(1)\n")
_TABLES = ("device_hours", "mig_hours", "allocation_hours", "charges")


def _stage(vm: Victoria, threshold: str, args: list[str]) -> dict[str, float]:
    store = cpu_seconds(vm.proc.pid)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", child_program(_PRELUDE), threshold, *args,
                           "--quiet"], capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    usage = child_usage(proc.stderr)
    if proc.returncode != 0 or math.isnan(usage["cpu_s"]):
        raise SystemExit(f"{' '.join(args[:2])} failed ({proc.returncode}):\n"
                         f"{proc.stderr[-2000:]}")
    return {"wall_s": wall, "cpu_s": usage["cpu_s"], "maxrss_mib": usage["maxrss_mib"],
            "store_cpu_s": cpu_seconds(vm.proc.pid) - store}


def _digest(db: Path) -> list[tuple[object, ...]]:
    with connect(db, read_only=True) as con:
        return [tuple(con.execute(f"SELECT count(*), sum(hash({t})) FROM {t}").fetchone() or ())
                for t in _TABLES]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpus", type=int, default=1000)
    p.add_argument("--month", default="2026-10")
    p.add_argument("--interval", type=int, default=300, help="seconds between samples")
    p.add_argument("--runs", type=int, default=2, help="runs of each setting, alternated")
    p.add_argument("--workdir", help="a bench.scale --workdir: its store (vm-data) is used "
                   "as it is; else a temporary store is imported and removed")
    p.add_argument("--json", help="also write the figures here")
    args = p.parse_args(argv)
    span = Month.parse(args.month).period()  # aware UTC bounds
    start, end = span.start, span.end
    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="gl-ckpt-"))
    reuse = (work / "vm-data").is_dir()
    vm = Victoria(work / "vm-data")
    results: dict[str, list[dict[str, Any]]] = {CHECKPOINT_THRESHOLD: [], DUCKDB_DEFAULT: []}
    try:
        if not reuse:
            fleet = Fleet(args.gpus, start, end, args.interval)
            import_fleet(vm, fleet)
        digests = {}
        for run in range(args.runs):
            for threshold in results:
                db = work / f"ckpt-{threshold}.duckdb"
                db.unlink(missing_ok=True)
                ingest = _stage(vm, threshold, ["meter", "--no-price", "--prometheus", vm.url,
                                                "--month", args.month, "--db", str(db)])
                ingest["file_mib"] = db.stat().st_size / 2**20
                price = _stage(vm, threshold, ["meter", "--price-only", "--month", args.month,
                                               "--db", str(db)])
                price["file_mib"] = db.stat().st_size / 2**20
                digests[threshold] = _digest(db)
                results[threshold].append({"ingest": ingest, "pricing": price})
                print(f"run {run + 1} checkpoint_threshold {threshold}: ingest client "
                      f"{ingest['cpu_s']:.1f} CPU-s, store {ingest['store_cpu_s']:.1f} CPU-s, "
                      f"peak {ingest['maxrss_mib']:.0f} MiB, {ingest['file_mib']:.0f} MiB file; "
                      f"pricing {price['cpu_s']:.1f} CPU-s, {price['file_mib']:.0f} MiB file",
                      flush=True)
        same = len({repr(d) for d in digests.values()}) == 1
        rows = [[f"{t} ({'this code' if t == CHECKPOINT_THRESHOLD else 'DuckDB default'})",
                 ", ".join(f"{r['ingest']['cpu_s']:.1f}" for r in rs),
                 ", ".join(f"{r['ingest']['store_cpu_s']:.1f}" for r in rs),
                 ", ".join(f"{r['ingest']['maxrss_mib']:,.0f}" for r in rs),
                 ", ".join(f"{r['ingest']['file_mib']:.0f}" for r in rs),
                 ", ".join(f"{r['pricing']['cpu_s']:.1f}" for r in rs),
                 ", ".join(f"{r['pricing']['file_mib']:.0f}" for r in rs)]
                for t, rs in results.items()]
        print(table(["checkpoint_threshold", "ingest client CPU-s", "store CPU-s",
                     "ingest peak RSS MiB", "file after ingest MiB", "pricing CPU-s",
                     "file after pricing MiB"], rows))
        print("same facts and charges" if same else "DIFFERENT facts or charges")
        write_json(args.json, {"machine": machine(), "gpus": args.gpus, "month": args.month,
                               "same": same, "runs": results})
        return 0 if same else 1
    finally:
        vm.close()
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
