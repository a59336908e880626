"""One day of N GPUs metered and priced, as the daily CronJob run does it: bench.scale's fleet
for one UTC day (plus the hour before it) in VictoriaMetrics, then `gpu-ledger meter
--prometheus URL --from DAY --to DAY+1 --cost-model ...` (ingest and pricing in one process),
with the process's wall, CPU seconds and peak RSS, the store's CPU and the samples it read.
`--split` also runs the same day as ingest only (`--no-price`) and `--price-only` in two
more processes, on fresh ledgers, to say which half costs what; with `--before DIR`, each
`--price-only` run is alternated with DIR's code on a copy of the same ledger, and the two
ledgers' charges, energy_hours and waste_hours are compared row for row.

    python -m bench.day --gpus 10000                      # 1/8 of the 80,000-GPU target
    python -m bench.day --gpus 80000 --workdir /tmp/d80k --json d80k.json
    python -m bench.day --gpus 80000 --workdir /tmp/d80k --reuse   # the store already imported
    python -m bench.day --gpus 10000 --recorded native     # raw and recorded series, alternating

`--recorded READ` also evaluates the shipped recording rules over the day (`vmalert -replay`,
as bench.recorded does; its cost is the rules', spread over the day's hours in production, and
reported apart) and meters the day from the recorded hourly series (`--recorded only
--recorded-read READ`), alternating with the raw series in each run: the daily run of a
cluster whose store evaluates the shipped PrometheusRule.

`meter --daily` meters yesterday and re-meters the --late-days (2) days before it: in steady
state it does this bench's work for each of them (docs/performance.md).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from importlib import resources
from pathlib import Path
from typing import Any

import duckdb

from bench.common import machine, say, stage_cell, table, write_json
from bench.recorded import replay
from bench.scale import GPUS_PER_NODE, Fleet, Victoria, import_fleet, run_stage


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def _meter(vm: Victoria, args: list[str], before: str | None = None,
           read: str | None = None) -> dict[str, Any]:
    """One meter run in a child; `before`: a checkout of other code, the child's working
    directory (`python -c` puts it first on the path, ahead of PYTHONPATH: a PYTHONPATH
    checkout lost to this one when the bench ran from it); `read`: from the recorded series,
    read so (--recorded-read), else raw."""
    read0 = vm.counter("vm_rows_read_per_query_sum")
    cpu0 = vm.cpu_s()
    load0 = _load()
    how = ["--recorded", "only", "--recorded-read", read] if read else ["--recorded", "never"]
    r = run_stage(["meter", "--prometheus", vm.url, *args, *how, "--verbose"],
                  cwd=Path(before) if before else None)
    r["code"] = (before or "this") + (f", recorded by {read}" if read else "")
    split = [x for x in r["stderr"].splitlines() if x.startswith("meter: queries: ")]
    r["queries"] = split[-1][len("meter: queries: "):] if split else ""
    r["vm_cpu_s"] = vm.cpu_s() - cpu0
    r["vm_samples_read"] = vm.counter("vm_rows_read_per_query_sum") - read0
    r["load_before"], r["load_after"] = load0, _load()
    return r


def _price(db: Path, args: list[str], before: str | None = None) -> dict[str, Any]:
    """`meter --price-only` of the ledger `db` in a child, with `before`'s code or this."""
    load0 = _load()
    r = run_stage(["meter", "--price-only", *args, "--db", str(db)],
                  cwd=Path(before) if before else None)
    r["code"], r["load_before"], r["load_after"] = before or "this", load0, _load()
    return r


PRICED_TABLES = ("charges", "energy_hours", "waste_hours")
# What `--jobs` must not change: the facts, their coverage (less when it was written) and the
# bill (less when it was priced).
JOBS_TABLES = ("device_hours", "mig_hours", "allocation_hours", "workload_hours",
               "grant_hours", "coverage EXCLUDE (ingested_at)", *PRICED_TABLES)


def _jobs_tag(all_jobs: list[str], jobs: str) -> str:
    return f"-j{jobs}" if len(all_jobs) > 1 else ""


def same_rows(a: Path, b: Path, tables: tuple[str, ...] = PRICED_TABLES) -> dict[str, Any]:
    """Per table (default: the priced ones) of two ledgers: rows, rows of one missing from
    the other (as multisets, both ways) and an order-free hash of every row, each side. A
    table may be written `name EXCLUDE (column, ...)`."""
    con = duckdb.connect()
    try:
        con.execute(f"ATTACH '{a}' AS a (READ_ONLY)")
        con.execute(f"ATTACH '{b}' AS b (READ_ONLY)")
        out: dict[str, Any] = {}
        for spec in tables:
            t, _, rest = spec.partition(" ")
            a_t, b_t = (f"(SELECT * {rest} FROM {side}.{t})" for side in ("a", "b"))
            n, ha = con.execute(f"SELECT count(*), sum(hash(x))::HUGEINT FROM {a_t} x"
                                ).fetchone() or (0, 0)
            hb = (con.execute(f"SELECT sum(hash(x))::HUGEINT FROM {b_t} x").fetchone()
                  or (0,))[0]
            diff = [(con.execute(f"SELECT count(*) FROM (FROM {p} EXCEPT ALL FROM {q})"
                                 ).fetchone() or (0,))[0] for p, q in ((a_t, b_t), (b_t, a_t))]
            out[t] = {"rows": n, "only_before": diff[0], "only_this": diff[1],
                      "same": diff == [0, 0] and ha == hb}
        return out
    finally:
        con.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.day", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpus", type=int, default=10_000)
    p.add_argument("--day", default="2026-10-15", help="the UTC day (YYYY-MM-DD)")
    p.add_argument("--interval", type=int, default=300, help="seconds between samples")
    p.add_argument("--workdir", help="keep the store and ledgers here (default: a temp dir)")
    p.add_argument("--reuse", action="store_true",
                   help="the store in --workdir holds the day already: skip the import")
    p.add_argument("--split", action="store_true",
                   help="also ingest only and price only, each in its own process")
    p.add_argument("--runs", type=int, default=1, help="times to meter the day (fresh ledger)")
    p.add_argument("--price-runs", type=int,
                   help="times to run --split's --price-only (default: --runs)")
    p.add_argument("--before", metavar="DIR",
                   help="also meter with the code checked out in DIR (e.g. `git archive REV | "
                        "tar -x -C DIR`), alternating with this checkout, each run")
    p.add_argument("--recorded", metavar="READ", choices=("query_range", "export", "native"),
                   help="also replay the recording rules over the day and meter it from the "
                        "recorded series read so, alternating with the raw series")
    p.add_argument("--jobs", nargs="+", default=["1"],
                   help="meter's --jobs in every run (default 1); several (`--jobs 1 16`): "
                        "each run meters the day with each, alternating, and the first run's "
                        "ledgers are compared row for row (facts, coverage and bill)")
    p.add_argument("--json", help="write the figures as JSON too")
    args = p.parse_args(argv)
    if args.reuse and not args.workdir:
        p.error("--reuse needs --workdir")
    if args.before:
        args.before = str(Path(args.before).resolve())

    start = datetime.fromisoformat(args.day).replace(tzinfo=UTC)
    end = start + timedelta(days=1)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="gpu-ledger-day-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    cost_model = str(resources.files("metering") / "data" / "cost-model.yaml")
    res: dict[str, Any] = {"machine": machine(), "gpus": args.gpus, "day": args.day,
                           "interval_s": args.interval}
    meta = work / "import.json"
    vm = Victoria(work / "vm-data")
    try:
        if not args.reuse:
            fleet = Fleet(args.gpus, start, end, args.interval)
            say(f"day: {fleet.nodes} nodes x {GPUS_PER_NODE} GPUs, {args.day}; importing "
                f"into VictoriaMetrics at {vm.url} (load {_load()})")
            t0 = time.perf_counter()
            import_fleet(vm, fleet)
            imp = {"wall_s": time.perf_counter() - t0, "samples": fleet.samples,
                   "series": fleet.series, "pods": len(fleet.pods)}
            meta.write_text(json.dumps(imp))
            say(f"day: imported {fleet.samples:,} samples, {fleet.series:,} series, "
                f"{len(fleet.pods):,} pods in {imp['wall_s']:.0f} s")
        res["import"] = json.loads(meta.read_text())
        if args.recorded and "replay" in res["import"]:
            res["replay"] = res["import"]["replay"]  # --reuse: replayed by an earlier run
        elif args.recorded:
            vm.delete_series('{__name__=~"gpu_ledger:.+"}')  # a partial earlier replay's
            say(f"day: replaying the recording rules over the day (load {_load()})")
            res["replay"] = replay(vm, start - timedelta(minutes=43),
                                   end + timedelta(minutes=17), work)
            meta.write_text(json.dumps({**res["import"], "replay": res["replay"]}))
        if "replay" in res:
            say(f"day: replayed in {res['replay']['wall_s']:.0f} s: store "
                f"{res['replay']['store_cpu_s']:.1f} CPU-s, vmalert "
                f"{res['replay']['vmalert_cpu_s']:.1f} CPU-s")
        period = ["--from", f"{start:%Y-%m-%dT%H:%MZ}", "--to", f"{end:%Y-%m-%dT%H:%MZ}"]
        runs = []
        for k in range(args.runs):
            variants = [(code, read, jobs)
                        for code in ([args.before, None] if args.before else [None])
                        for read in ([None, args.recorded] if args.recorded else [None])
                        for jobs in args.jobs]
            for code, read, jobs in variants:
                db = work / (f"day-{k}-{'before' if code else 'this'}-{read or 'raw'}"
                             f"{_jobs_tag(args.jobs, jobs)}.duckdb")
                db.unlink(missing_ok=True)
                r = _meter(vm, [*period, "--db", str(db), "--cost-model", cost_model,
                                "--jobs", jobs], code, read)
                r["jobs"] = jobs
                if len(args.jobs) > 1:
                    r["code"] += f", --jobs {jobs}"
                say(f"day: {r['code']}: metered and priced in {r['wall_s']:.1f} s wall, "
                    f"{r['cpu_s']:.1f} CPU-s (workers {r['workers_cpu_s']:.1f}), "
                    f"{r['maxrss_mib']:,.0f} MiB (largest worker {r['worker_maxrss_mib']:,.0f}); "
                    f"store {r['vm_cpu_s']:.1f} CPU-s (load {r['load_before']} -> "
                    f"{r['load_after']}); {r['queries']}")
                runs.append(r)
        res["runs"] = runs
        tag = _jobs_tag(args.jobs, args.jobs[0])
        if args.recorded and args.runs:
            res["recorded_same_rows"] = same_rows(work / f"day-0-this-raw{tag}.duckdb",
                                                  work / f"day-0-this-{args.recorded}{tag}"
                                                  ".duckdb")
        if len(args.jobs) > 1 and args.runs:
            res["jobs_same_rows"] = {
                jobs: same_rows(work / f"day-0-this-raw{tag}.duckdb",
                                work / f"day-0-this-raw{_jobs_tag(args.jobs, jobs)}.duckdb",
                                JOBS_TABLES)
                for jobs in args.jobs[1:]}
            for jobs, same in res["jobs_same_rows"].items():
                say(f"day: --jobs {jobs} against --jobs {args.jobs[0]}: " + ", ".join(
                    f"{t} {v['rows']:,} rows {'same' if v['same'] else 'DIFFERENT'}"
                    for t, v in same.items()))
        if args.split:
            db = work / "split.duckdb"
            db.unlink(missing_ok=True)
            res["ingest"] = _meter(vm, [*period, "--db", str(db), "--no-price",
                                        "--jobs", args.jobs[0]])
            prices = []
            for _ in range(args.price_runs or args.runs):
                for code in ([args.before, None] if args.before else [None]):
                    copy = work / f"price-{'before' if code else 'this'}.duckdb"
                    shutil.copyfile(db, copy)
                    r = _price(copy, [*period, "--cost-model", cost_model], code)
                    say(f"day: {r['code']}: priced in {stage_cell(r)} (load "
                        f"{r['load_before']} -> {r['load_after']})")
                    prices.append(r)
            res["prices"] = prices
            if args.before:
                res["same_rows"] = same_rows(work / "price-before.duckdb",
                                             work / "price-this.duckdb")
        say(report(res))
    finally:
        vm.close()
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    write_json(args.json, {k: v for k, v in res.items()})
    return 0


def report(res: dict[str, Any]) -> str:
    imp = res["import"]
    rows = [["fleet", f"{res['gpus']:,} GPUs, {imp['pods']:,} pods, {imp['series']:,} series, "
                      f"{imp['samples']:,} samples (every {res['interval_s']} s), day "
                      f"{res['day']}"]]
    if "replay" in res:
        rp = res["replay"]
        rows.append(["recording rules replayed over the day (setup; in production spread over "
                     "its hours)", f"{rp['wall_s']:.0f} s; store {rp['store_cpu_s']:.1f} CPU-s, "
                     f"vmalert {rp['vmalert_cpu_s']:.1f} CPU-s"])
    for k, r in enumerate(res["runs"]):
        rows.append([f"run {k + 1} ({r['code']}): meter + price one day: wall / CPU / peak RSS",
                     f"{stage_cell(r)}"
                     + (f" (workers {r['workers_cpu_s']:.1f} CPU-s, largest worker "
                        f"{r['worker_maxrss_mib']:,.0f} MiB)" if r.get("workers_cpu_s") else "")
                     + f"; store {r['vm_cpu_s']:.1f} CPU-s, "
                     f"{r['vm_samples_read']:,.0f} samples read; load {r['load_before']} -> "
                     f"{r['load_after']}"])
    if "ingest" in res:
        rows.append(["ingest only (`--no-price`): wall / CPU / peak RSS",
                     f"{stage_cell(res['ingest'])}; store {res['ingest']['vm_cpu_s']:.1f} CPU-s"])
        for k, r in enumerate(res["prices"]):
            rows.append([f"pricing only (`--price-only`), run {k + 1} ({r['code']})",
                         f"{stage_cell(r)}; load {r['load_before']} -> {r['load_after']}"])
        codes = sorted({r["code"] for r in res["prices"]}, key=lambda c: c == "this")
        if len(codes) > 1:
            def med(c: str, k: str) -> float:
                return float(statistics.median([r[k] for r in res["prices"] if r["code"] == c]))
            rows.append(["pricing only, median of the runs: CPU / wall", ", ".join(
                f"{c}: {med(c, 'cpu_s'):.2f} CPU-s / {med(c, 'wall_s'):.2f} s" for c in codes)])
    for key, what, a, b in (("same_rows", "before vs this", "before", "this"),
                            ("recorded_same_rows", "raw vs recorded (run 1)", "raw",
                             "recorded")):
        for t, d in res.get(key, {}).items():
            rows.append([f"{t}: {what}, row for row",
                         f"{d['rows']:,} rows, " + ("the same" if d["same"] else
                         f"DIFFERENT ({d['only_before']} only {a}, {d['only_this']} only {b})")])
    for jobs, same in res.get("jobs_same_rows", {}).items():
        for t, d in same.items():
            rows.append([f"{t}: --jobs {res['runs'][0]['jobs']} vs --jobs {jobs} (run 1), row "
                         "for row", f"{d['rows']:,} rows, " + ("the same" if d["same"] else
                         f"DIFFERENT ({d['only_before']} only --jobs "
                         f"{res['runs'][0]['jobs']}, {d['only_this']} only --jobs {jobs})")])
    return table(["quantity", "measured"], rows)


if __name__ == "__main__":
    raise SystemExit(main())
