"""What pricing's one transaction holds: a month priced in one call (as `meter` prices it)
against one call, and so one transaction, per slice, on copies of one ledger; and DuckDB
keeping replaced temp tables until a transaction ends, on its own.

Since stops 55-56 one call for the month commits it slice by slice too (metering/pricing.py,
docs/metering.md "Pricing slices"): on a priced ledger (a re-price) it first copies the month's
old pricing rows aside. So both runs commit per slice; run this bench from a checkout of the
code before (its own `bench` and `metering`, e.g. `cd OLD && python -m bench.pricing_tx ...`)
to measure the one transaction it had.

    python -m bench.pricing_tx --ledger L.duckdb --month 2026-10 --slice 72
    python -m bench.pricing_tx --ledger L.duckdb --slice 24 72 168 --one   # by slice length
    python -m bench.pricing_tx --retention          # DuckDB alone: a temp table replaced N times
    python -m bench.pricing_tx --ledger L.duckdb --one --threads 2 16 --memory 1.5GB 16GB

`--threads` and `--memory` price the month once per pair, in one transaction, with DuckDB's
threads and the ledger's memory cap ($GPU_LEDGER_MEMORY_LIMIT) set so: whether pricing uses
the cores a machine has, and whether the cap is what stops it.

Each pricing run is a child process on a fresh copy of the ledger (the default cost model):
its wall, CPU seconds, peak RSS, the largest size of its spill directory (`<copy>.tmp`,
sampled every 0.5 s) and a hash of every row of `charges`, `energy_hours` and `waste_hours`
(equal in both runs: pricing is per hour, so slices commit the same rows).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import duckdb

from bench.common import machine, say, table, write_json
from metering.db import MEMORY_LIMIT_ENV, memory_limit

# The child: price the month at once or slice by slice, print its figures as one JSON line.
_CHILD = """
import glob, json, os, resource, sys, threading, time
from datetime import timedelta
from metering import db, pricing
from metering.costmodel import load_cost_model
from metering.period import Month
path, month, hours, mode = sys.argv[1], Month.parse(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
con = db.connect(path)
if sys.argv[5] != '-':
    con.execute('SET threads = ' + str(int(sys.argv[5])))
peak, done = [0], []
def watch():
    while not done:
        peak[0] = max(peak[0], sum(os.path.getsize(f) for f in glob.glob(path + '.tmp/*')))
        time.sleep(0.5)
threading.Thread(target=watch, daemon=True).start()
model = load_cost_model(None)
start, end = month.period().naive()
w0, c0 = time.perf_counter(), time.process_time()
if mode == 'one':
    rows = pricing.price_period(con, model, start, end, slice_hours=hours).rows
else:
    rows, t = 0, start
    while t < end:
        u = min(t + timedelta(hours=hours), end)
        rows += pricing.price_period(con, model, t, u, slice_hours=hours).rows
        t = u
wall, cpu = time.perf_counter() - w0, time.process_time() - c0
done.append(1)
sums = {t: str(con.execute(f'SELECT count(*), sum(hash(x))::HUGEINT FROM (FROM {t}) x'
                           ).fetchone()) for t in ('charges', 'energy_hours', 'waste_hours')}
print(json.dumps({'wall_s': wall, 'cpu_s': cpu, 'rows': rows, 'spill_mib': peak[0] / 2**20,
                  'maxrss_mib': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  'tables': sums}))
"""


def price(ledger: Path, work: Path, month: str, hours: int, mode: str,
          threads: int | None = None, memory: str | None = None) -> dict[str, Any]:
    """Price a fresh copy of `ledger` in a child; `threads`, `memory`: DuckDB's threads and
    the memory cap (default: the ledger's own)."""
    copy = work / f"price-{mode}.duckdb"
    for f in glob.glob(f"{copy}*"):
        shutil.rmtree(f) if os.path.isdir(f) else os.remove(f)
    shutil.copy(ledger, copy)
    load = os.getloadavg()[0]
    env = dict(os.environ, **({MEMORY_LIMIT_ENV: memory} if memory else {}))
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(copy), month, str(hours), mode,
                           str(threads) if threads else "-"],
                          capture_output=True, text=True, check=False, env=env)
    shutil.rmtree(f"{copy}.tmp", ignore_errors=True)
    copy.unlink(missing_ok=True)
    if proc.returncode != 0:
        raise SystemExit(f"pricing ({mode}) failed: {proc.stderr.strip().splitlines()[-1:]}")
    r: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    r["mode"], r["load"] = mode, load
    r["threads"], r["memory"] = threads, memory or memory_limit()
    return r


def retention(counts: tuple[int, ...] = (1, 4, 8)) -> list[dict[str, Any]]:
    """MiB spilled after a temp table of 1M rows is replaced n times under a 100MB cap, in
    autocommit and inside one transaction."""
    out = []
    for n in counts:
        for in_tx in (False, True):
            with tempfile.TemporaryDirectory() as d:
                con = duckdb.connect(":memory:", config={
                    "memory_limit": "100MB", "temp_directory": f"{d}/spill", "threads": 1})
                if in_tx:
                    con.execute("BEGIN")
                for i in range(n):
                    lo, hi = i * 1_000_000, (i + 1) * 1_000_000
                    con.execute("CREATE OR REPLACE TEMP TABLE w AS SELECT r, repeat('x', 30) "
                                f"|| r AS s FROM range({lo}, {hi}) t(r)")
                spilled = sum(os.path.getsize(f) for f in glob.glob(f"{d}/spill/*"))
                if in_tx:
                    con.execute("COMMIT")
                con.close()
            out.append({"replacements": n, "in_transaction": in_tx,
                        "spilled_mib": spilled / 2**20})
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.pricing_tx", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ledger", type=Path, help="a ledger with the month's facts")
    p.add_argument("--month", default="2026-10")
    p.add_argument("--slice", type=int, nargs="+", default=[72], help="hours per slice")
    p.add_argument("--one", action="store_true",
                   help="only the one call for the month (meter's pricing), no run per slice")
    p.add_argument("--threads", type=int, nargs="+", help="DuckDB threads, one run each "
                   "(default: the ledger's own)")
    p.add_argument("--memory", nargs="+", help="memory caps such as 1.5GB, one run each "
                   "(default: $GPU_LEDGER_MEMORY_LIMIT or 1.5GB)")
    p.add_argument("--workdir", type=Path, help="where the copies go (default: beside --ledger)")
    p.add_argument("--retention", action="store_true", help="DuckDB's temp tables alone")
    p.add_argument("--json", help="write the figures as JSON too")
    args = p.parse_args(argv)
    if not (args.retention or args.ledger):
        p.error("give --ledger, --retention or both")
    if any(t < 1 for t in args.threads or []):
        p.error("--threads: expected 1 or more")
    res: dict[str, Any] = {"machine": machine()}
    if args.retention:
        res["retention"] = retention()
        say(table(["replacements", "transaction", "spilled MiB"],
                  [(r["replacements"], "one" if r["in_transaction"] else "autocommit",
                    round(r["spilled_mib"])) for r in res["retention"]]))
    if args.ledger:
        work = args.workdir or args.ledger.parent
        runs = [dict(price(args.ledger, work, args.month, h, m, t, mem), slice_hours=h)
                for h in args.slice for m in (("one",) if args.one else ("one", "per"))
                for t in args.threads or [None] for mem in args.memory or [None]]
        res["runs"] = runs
        say(table(["slice", "transactions", "DuckDB threads", "memory cap", "wall s", "CPU s",
                   "peak RSS MiB", "spilled MiB (peak)", "load"],
                  [(f"{r['slice_hours']} h",
                    "one call for the month" if r["mode"] == "one" else "one per slice",
                    r["threads"] or "default", r["memory"],
                    round(r["wall_s"], 1), round(r["cpu_s"], 1), round(r["maxrss_mib"]),
                    round(r["spill_mib"]), r["load"]) for r in runs]))
        same = all(r["tables"] == runs[0]["tables"] for r in runs)
        res["same_rows"] = same
        say(f"charges, energy_hours, waste_hours: {'the same' if same else 'DIFFERENT'} "
            f"({runs[0]['tables']})")
    write_json(args.json, res)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
