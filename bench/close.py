"""The month-end close at fleet size: a month of N GPUs already metered and priced, then what
the CronJob runs on the 1st (deploy/base/metering-cronjob.yaml): `gpu-ledger close MONTH` and
`gpu-ledger report --month MONTH --cost-model ... --out DIR`, each in its own process (wall,
CPU seconds and peak RSS of that process).

    python -m bench.close --gpus 10000             # 1/8 of the 80,000-GPU target
    python -m bench.close --gpus 20000 --workdir /tmp/c20k --json c20k.json

No store is needed: the month's fact rows (device-hours, allocation-hours, workload-hours,
coverage) are written straight into a ledger from bench.scale's fleet plan (the same nodes,
pods, values and sample grid `python -m bench.scale` imports into VictoriaMetrics), computed
hour by hour in DuckDB as ingest would write them for a sample every --interval seconds
(`--check-against LEDGER` compares them row by row with a ledger that bench.scale metered from
the store). The month is then priced by `gpu-ledger meter --price-only` (as the month's daily
runs would have priced it, with the packaged cost model), and only close and report are the
close's figures. `--keep` reuses a ledger of an earlier run in --workdir (stages 3-4 only).

`--before DIR` (a checkout with its own .venv, e.g. the code before a change): the month is
priced by that code first, then by this one (pricing stores the waste device-hours the report
reads: what that costs; each on its own copy of the unpriced ledger), and the report is run
by each in turn on its own ledger, `--runs` times; every report file of the two must be the
same (CSV, Markdown, HTML byte for byte, Parquet row for row).
"""

from __future__ import annotations

import argparse
import multiprocessing
import shutil
import tempfile
import time
from datetime import datetime
from importlib import resources
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from bench.common import machine, say, stage_cell, table, write_json
from bench.scale import GPUS_PER_NODE, Fleet, run_stage
from metering import api
from metering.period import Month

FACT_TABLES = ("device_hours", "allocation_hours", "workload_hours", "coverage")


def plan_tables(fleet: Fleet) -> tuple[pa.Table, pa.Table]:
    """The fleet's GPUs and pod-GPUs (sample index ranges on the month's grid) as Arrow."""
    g: dict[str, list[Any]] = {"node": [], "gpu": [], "uuid": [], "model": [], "util": []}
    p: dict[str, list[Any]] = {"node": [], "namespace": [], "pod": [], "team": [], "uuid": [],
                               "i": [], "j": [], "memory": [], "sm": []}
    for n in range(fleet.nodes):
        plan = fleet.plan(n)
        for gpu, util, _base in plan.gpus:
            g["node"].append(plan.node)
            g["gpu"].append(str(gpu))
            g["uuid"].append(f"GPU-{n:05d}-{gpu}")
            g["model"].append(plan.model)
            g["util"].append(util)
        for pod in plan.pods:
            for d in pod.slot:
                p["node"].append(plan.node)
                p["namespace"].append(pod.namespace)
                p["pod"].append(pod.pod)
                p["team"].append(pod.team)
                p["uuid"].append(f"GPU-{n:05d}-{d}")
                p["i"].append(pod.i)
                p["j"].append(pod.j)
                p["memory"].append(float(pod.memory))
                p["sm"].append(pod.sm)
            fleet.pods.append((pod.namespace, pod.pod, 0, 0, len(pod.slot)))
    return pa.table(g), pa.table(p)


def write_facts(con: duckdb.DuckDBPyConnection, fleet: Fleet, start: datetime,
                end: datetime) -> dict[str, int]:
    """The month's fact rows as ingest writes them for the fleet's samples: sample k of the
    grid is at start - 1 h + (k + 1) x interval and counts in the hour (h, h + 1 h] ends."""
    gpus, pods = plan_tables(fleet)
    con.register("plan_gpus", gpus)
    con.register("plan_pods", pods)
    step = fleet.interval
    if 3600 % step:
        raise SystemExit("--interval must divide an hour")
    per = 3600 // step  # samples per hour
    hours = int((end - start).total_seconds() // 3600)
    naive_start = start.replace(tzinfo=None)
    con.execute("SET VARIABLE s = $s", {"s": naive_start})
    # Rows go in hour by hour, as daily metering commits them: DuckDB's per-row-group min/max
    # of `hour` then skips the other days when pricing and the report read a day's slice.
    # Sample k lies in hour index m (0 = the month's first) when per*(m+1) <= k < per*(m+2).
    con.execute(f"""
        INSERT INTO device_hours
        SELECT getvariable('s') + to_hours(m), node, gpu, uuid, model, false,
               3600.0, 3600.0, util * 3600.0, 300.0 * 3600.0, 'default', false, 'nvidia'
        FROM plan_gpus, range({hours}) AS r(m) ORDER BY m""")
    con.execute(f"""
        CREATE TEMP TABLE _ph AS
        SELECT *, least(j, {per} * (m + 2)) - greatest(i, {per} * (m + 1)) AS n
        FROM (SELECT *, unnest(range(greatest(i // {per} - 1, 0),
                                     least((j - 1) // {per}, {hours}))) AS m FROM plan_pods)
        WHERE least(j, {per} * (m + 2)) > greatest(i, {per} * (m + 1))""")
    con.execute(f"""
        INSERT INTO allocation_hours
        SELECT getvariable('s') + to_hours(m), node, namespace, pod, 'main', uuid, '',
               'nvidia.com/gpu', 'exclusive', 1, 1.0, n * {step}.0, memory * n * {step},
               sm * n * {step},
               CASE WHEN team = '' THEN MAP {{}}::MAP(VARCHAR, VARCHAR)
                    ELSE MAP {{'team': team}} END, 'default'
        FROM _ph ORDER BY m""")
    con.execute("""
        INSERT INTO workload_hours
        SELECT getvariable('s') + to_hours(m), namespace, pod, 'main', uuid, '', 'Job', pod,
               memory, 'default'
        FROM _ph ORDER BY m""")
    con.execute(f"""
        INSERT INTO coverage (hour, source, devices, ingested_at, duplicate_seconds,
                              dropped_values, cluster)
        SELECT getvariable('s') + to_hours(m), 'bench.close', (SELECT count(*) FROM plan_gpus),
               now()::TIMESTAMP, 0, 0, 'default'
        FROM range({hours}) AS r(m)""")
    con.execute("DROP TABLE _ph")
    return {t: int(con.execute(f"SELECT count(*) FROM {t}").fetchall()[0][0])
            for t in FACT_TABLES}


def _facts_child(gpus: int, start: datetime, end: datetime, interval: int,
                 db: Path) -> dict[str, int]:
    with api.open_ledger(db) as con:
        return write_facts(con, Fleet(gpus, start, end, interval), start, end)


def compare(db: Path, other: Path) -> dict[str, int]:
    """Rows of each fact table in one ledger and not the other (both ways), coverage's source
    and ingest time left out."""
    con = duckdb.connect(str(db), read_only=True)
    con.execute(f"ATTACH '{other}' AS o (READ_ONLY)")
    diff = {}
    for t in FACT_TABLES:
        cols = "hour, devices, cluster" if t == "coverage" else "*"
        n = con.execute(f"SELECT (SELECT count(*) FROM (SELECT {cols} FROM {t} EXCEPT ALL "
                        f"SELECT {cols} FROM o.{t})) + (SELECT count(*) FROM (SELECT {cols} "
                        f"FROM o.{t} EXCEPT ALL SELECT {cols} FROM {t}))").fetchall()[0][0]
        diff[t] = int(n)
    con.close()
    return diff


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.close", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpus", type=int, default=10_000)
    p.add_argument("--month", default="2026-10")
    p.add_argument("--interval", type=int, default=300, help="seconds between samples")
    p.add_argument("--workdir", help="keep the ledger and reports here (default: a temp dir, "
                                     "removed at the end)")
    p.add_argument("--keep", action="store_true",
                   help="reuse the priced ledger in --workdir: reopen the month, time close "
                        "and report again")
    p.add_argument("--check-against", metavar="LEDGER",
                   help="compare the generated facts with this ledger (bench.scale's, same "
                        "--gpus) and stop")
    p.add_argument("--before", type=Path, metavar="DIR",
                   help="a checkout with .venv: price and report with it too, alternating")
    p.add_argument("--runs", type=int, default=1, help="reports per variant (default 1)")
    p.add_argument("--json", help="write the figures as JSON too")
    args = p.parse_args(argv)
    if args.keep and not args.workdir:
        p.error("--keep needs --workdir")

    span = Month.parse(args.month).period()  # aware UTC bounds
    start, end = span.start, span.end
    work = Path(args.workdir or tempfile.mkdtemp(prefix="gpu-ledger-close-"))
    work.mkdir(parents=True, exist_ok=True)
    db, out = work / "ledger.duckdb", work / "report"
    db_before = work / "ledger-before.duckdb"  # --before's own ledger (its pricing)
    cost_model = str(resources.files("metering") / "data" / "cost-model.yaml")
    res: dict[str, Any] = {"machine": machine(), "gpus": args.gpus, "month": args.month,
                           "interval_s": args.interval}
    before: dict[str, Any] = {}
    if args.before:
        tree = args.before.resolve()
        before = {"python": str(tree / ".venv" / "bin" / "python"), "cwd": tree}
        res["before"] = str(tree)
    with open("/proc/loadavg") as f:
        res["load_before"] = f.read().split()[:3]
    try:
        if not args.keep:
            db.unlink(missing_ok=True)
            db_before.unlink(missing_ok=True)
            say(f"close: {max(1, args.gpus // GPUS_PER_NODE)} nodes x {GPUS_PER_NODE} GPUs, "
                f"{args.month}: writing the month's facts into {db}")
            t0 = time.perf_counter()
            # In a child: Linux carries a process's peak RSS across fork and exec, so stages
            # started from a parent that held the facts would report its size as theirs.
            with multiprocessing.get_context("spawn").Pool(1) as pool:
                rows = pool.apply(_facts_child, (args.gpus, start, end, args.interval, db))
            res["facts"] = {"wall_s": time.perf_counter() - t0, "rows": rows}
            say(f"close: facts {rows} in {res['facts']['wall_s']:.0f} s")
            if args.check_against:
                diff = compare(db, Path(args.check_against))
                say(f"close: rows differing from {args.check_against}: {diff}")
                return 1 if any(diff.values()) else 0
            price = ["meter", "--price-only", "--month", args.month, "--db", str(db),
                     "--cost-model", cost_model]
            if args.before:  # on a copy of the unpriced ledger: each prices an empty month
                shutil.copyfile(db, db_before)
                res["price_before"] = run_stage([*price[:-3], str(db_before), *price[-2:]],
                                                **before)
                say(f"close: pricing by {args.before} {res['price_before']['cpu_s']:.0f} CPU-s")
            res["price"] = run_stage(price)
            say(f"close: pricing (the month's daily runs) {res['price']['wall_s']:.0f} s")
        else:
            for ledger in (db, db_before):
                if ledger.exists():
                    con = duckdb.connect(str(ledger))
                    con.execute("DELETE FROM month_closes")
                    con.close()
        shutil.rmtree(out, ignore_errors=True)
        res["close"] = run_stage(["close", args.month, "--db", str(db)])
        if args.before and db_before.exists():  # the same close (its time is in the report)
            con = duckdb.connect(str(db_before))
            con.execute(f"ATTACH '{db}' AS closed (READ_ONLY)")
            con.execute("INSERT INTO month_closes SELECT * FROM closed.month_closes")
            con.close()
        variants: list[tuple[str, Path, dict[str, Any]]] = [("report", db, {})]
        if args.before and db_before.exists():
            variants.append(("report_before", db_before, before))
        for i in range(args.runs):  # alternating: the box's load moves under both alike
            for name, ledger, how in variants:
                r = run_stage(["report", "--month", args.month, "--db", str(ledger),
                               "--cost-model", cost_model, "--out", str(out / f"{name}-{i}")],
                              **how)
                res.setdefault(f"{name}_runs", []).append(r)
                say(f"close: {name} run {i + 1}: {r['cpu_s']:.1f} CPU-s, "
                    f"{r['maxrss_mib']:,.0f} MiB, {r['wall_s']:.1f} s")
        # the figures of record: each variant's run of least CPU
        for name, _, _ in variants:
            res[name] = min(res[f"{name}_runs"], key=lambda r: r["cpu_s"])
        if len(variants) > 1:
            res["reports_identical"] = same_reports(
                [out / f"{name}-{i}" for name, _, _ in variants for i in range(args.runs)])
            say(f"close: report files identical, before and after: {res['reports_identical']}")
        con = duckdb.connect(str(db), read_only=True)
        res["charge_rows"] = con.execute("SELECT count(*) FROM charges").fetchall()[0][0]
        res["device_hours"] = con.execute("SELECT count(*) FROM device_hours").fetchall()[0][0]
        con.close()
        res["ledger_mib"] = db.stat().st_size / 2**20
        with open("/proc/loadavg") as f:
            res["load_after"] = f.read().split()[:3]
        say(report(res))
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    write_json(args.json, {k: v for k, v in res.items()})
    return 0


def same_reports(dirs: list[Path]) -> bool:
    """Whether the report directories hold the same files with the same content: CSV,
    Markdown and HTML byte for byte, Parquet row for row (its metadata names the writer)."""
    def content(d: Path) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in sorted(d.iterdir()):
            if f.suffix == ".parquet":
                with duckdb.connect() as con:
                    out[f.name] = con.execute("SELECT * FROM read_parquet(?)", [str(f)]
                                              ).fetchall()
            else:
                out[f.name] = f.read_bytes()
        return out

    first = content(dirs[0])
    return bool(first) and all(content(d) == first for d in dirs[1:])


def report(res: dict[str, Any]) -> str:
    rows = [["fleet", f"{res['gpus']:,} GPUs, {res['device_hours']:,} device-hours, "
                      f"{res['charge_rows']:,} charge rows, ledger {res['ledger_mib']:,.0f} MiB"]]
    if "facts" in res:
        rows.append(["facts written (setup)", f"{res['facts']['wall_s']:.0f} s"])
        if "price_before" in res:
            rows.append(["pricing the month by --before (setup): wall / CPU / peak RSS",
                         stage_cell(res["price_before"])])
        rows.append(["pricing the month (setup; `meter --price-only`): wall / CPU / peak RSS",
                     stage_cell(res["price"])])
    rows += [["`close`: wall / CPU / peak RSS", stage_cell(res["close"])],
             ["`report` (all formats): wall / CPU / peak RSS", stage_cell(res["report"])],
             *([["`report` by --before: wall / CPU / peak RSS", stage_cell(res["report_before"])],
                ["report files identical (before, after)", str(res["reports_identical"])]]
               if "report_before" in res else []),
             ["**month-end close (close + report)**: wall / CPU",
              f"{res['close']['wall_s'] + res['report']['wall_s']:.1f} s / "
              f"{res['close']['cpu_s'] + res['report']['cpu_s']:.1f} s"],
             ["load average before / after", f"{res['load_before']} / {res['load_after']}"]]
    return table(["quantity", "measured"], rows)


if __name__ == "__main__":
    raise SystemExit(main())
