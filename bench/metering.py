"""Metering cost on a synthetic fleet: fact write throughput, pricing and reports (time and
peak RSS, each in its own process), pricing against a bare DuckDB aggregate and a pandas
implementation, and PromQL queries per month against a real Prometheus.

    python -m bench.metering            # 1,000 nodes x 8 GPUs, a month (several minutes)
    python -m bench.metering --quick    # 100 nodes, smoke check (under a minute)
    python -m bench.metering --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import machine, say, table, write_json
from bench.fleet import Fleet, generate

MONTH = "2026-10"
MEMORY_ENV = "GPU_LEDGER_MEMORY_LIMIT"  # metering.db's DuckDB memory cap (default 1.5GB)
CAPPED = "1GB"
START = datetime(2026, 10, 1)
END = datetime(2026, 11, 1)


def _maxrss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# --- children: one measurement per process, so ru_maxrss is that step's peak ---------------------


def child_price(db: str) -> dict[str, Any]:
    from metering import api
    from metering.costmodel import load_cost_model
    from metering.db import connect
    from metering.period import Period, utc_aware

    model = load_cost_model(None)
    t0 = time.perf_counter()
    r = api.price(db, Period(utc_aware(START), utc_aware(END)), model)  # opens the ledger too
    wall = time.perf_counter() - t0
    con = connect(db)
    teams = con.execute(
        "SELECT team, sum(cost)::VARCHAR FROM charges WHERE sharing NOT IN ('idle', 'down', "
        "'adjustment') GROUP BY team").fetchall()
    con.close()
    totals = {t: int(Decimal(c) * 1_000_000) for t, c in teams}
    totals["idle"] = int(r.idle * 1_000_000)
    totals["down"] = int(r.down * 1_000_000)
    return {"wall_s": wall, "maxrss_mib": _maxrss_mib(), "rows": r.rows,
            "fleet_cost": str(r.fleet_cost), "totals": totals}


def child_report(db: str, out: str) -> dict[str, Any]:
    from metering import api
    from metering.period import Month

    t0 = time.perf_counter()
    done = api.report(db, Month.parse(MONTH), out)  # what `gpu-ledger report` does
    return {"wall_s": time.perf_counter() - t0, "maxrss_mib": _maxrss_mib(),
            "files": {p.name: p.stat().st_size for p in done.files}}


def child_pandas(db: str) -> dict[str, Any]:
    from bench.pandas_pricing import load, price
    from metering.costmodel import load_cost_model
    from metering.db import connect

    model = load_cost_model(None)
    con = connect(db, read_only=True)
    t0 = time.perf_counter()
    dev, alloc, mig = load(con, model, START, END)
    t1 = time.perf_counter()
    totals = price(model, dev, alloc, mig)
    t2 = time.perf_counter()
    con.close()
    return {"load_s": t1 - t0, "compute_s": t2 - t1, "wall_s": t2 - t0,
            "maxrss_mib": _maxrss_mib(), "totals": totals}


def child_floor(db: str) -> dict[str, Any]:
    from metering.db import connect

    con = connect(db, read_only=True)
    t0 = time.perf_counter()
    rows = con.execute(
        "SELECT a.hour, d.model, sum(a.allocated_seconds) FROM allocation_hours a "
        "JOIN device_hours d ON d.hour = a.hour AND d.uuid = a.uuid "
        "GROUP BY a.hour, d.model").fetchall()
    wall = time.perf_counter() - t0
    con.close()
    return {"wall_s": wall, "groups": len(rows), "maxrss_mib": _maxrss_mib()}


CHILDREN: dict[str, Callable[..., dict[str, Any]]] = {
    "price": child_price, "report": child_report, "pandas": child_pandas, "floor": child_floor}


def run_child(name: str, *args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-m", "bench.metering", "--child", name, *args],
                          capture_output=True, text=True, check=False,
                          env={**os.environ, **(env or {})})
    if proc.returncode != 0:
        raise RuntimeError(f"{name} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


# --- fact write throughput (ingest's write path on parsed samples) -------------------------------


def signals_for(nodes: int, hours: int, start: datetime) -> tuple[dict[str, Any], float]:
    """Arrow signal tables as a source would hand them to write_facts: every series of the
    fleet with one point per hour. Returns the tables and the seconds build_signal took."""
    from metering.facts import build_signal
    from metering.signals import SIGNALS

    devices, migs, containers = [], [], []
    for n in range(nodes):
        for g in range(8):
            dev = {"node": f"node-{n}", "gpu": str(g), "uuid": f"GPU-{n}-{g}",
                   "model": "NVIDIA H100 80GB HBM3", "mig_mode": "enabled" if n % 10 == 0
                   else "disabled"}
            devices.append(dev)
            for m in range(7 if n % 10 == 0 else 0):
                migs.append({**dev, "mig_uuid": f"MIG-{n}-{g}-{m}", "profile": "1g.10gb",
                             "slices": "1", "parent_slices": "7"})
            units = ([(f"MIG-{n}-{g}-{m}", "mig", "1") for m in range(7)] if n % 10 == 0
                     else [("", "time-slicing", "4")] * 4 if n % 10 == 1
                     else [("", "exclusive", "1")])
            for i, (mig_uuid, sharing, replicas) in enumerate(units):
                containers.append({**dev, "namespace": f"ns-{(n + g + i) % 40}",
                                   "pod": f"pod-{n}-{g}-{i}", "container": "main",
                                   "mig_uuid": mig_uuid, "sharing": sharing,
                                   "replicas": replicas, "resource": "nvidia.com/gpu",
                                   "label_team": f"team-{(n + i) % 20}"})
    hour0 = int(start.replace(tzinfo=UTC).timestamp())
    rng = np.random.default_rng(42)
    tables: dict[str, Any] = {}
    built = 0.0
    for spec in SIGNALS:
        if spec.family.startswith("gpu_container_"):
            series = containers
        elif spec.family.startswith("gpu_mig_") or spec.nonempty:
            series = migs
        else:
            series = devices
        k = len(series)
        sid = np.repeat(np.arange(k), hours)
        hour_s = np.tile(hour0 + 3600 * np.arange(hours), k)
        if spec.func == "count":
            value = np.full(k * hours, 720.0)  # a 5 s interval
        elif spec.func == "tlast":
            value = (hour_s + 3600).astype(np.float64)  # sampled to the end of the hour
        elif spec.family == "gpu_energy_joules_total":
            value = np.cumsum(rng.uniform(1e5, 1e6, k * hours))
        else:
            value = 720.0 * rng.uniform(0, 1, k * hours)
        t0 = time.perf_counter()
        tables[spec.name] = build_signal(spec, series, sid, hour_s, value)
        built += time.perf_counter() - t0
    return tables, built


def ingest_throughput(nodes: int, hours: int) -> dict[str, Any]:
    from metering.db import connect, transaction
    from metering.facts import write_facts

    start = datetime(2026, 9, 1)
    end = start + timedelta(hours=hours)
    tables, built = signals_for(nodes, hours, start)
    points = sum(t.num_rows for t in tables.values())
    with tempfile.TemporaryDirectory() as tmp:
        con = connect(str(Path(tmp) / "ingest.duckdb"))
        t0 = time.perf_counter()
        with transaction(con):
            counts = write_facts(con, [tables], start, end)  # deletes the chunk's hours first
        wall = time.perf_counter() - t0
        con.close()
    return {"nodes": nodes, "hours": hours, "signal_points": points, "fact_rows": counts.total,
            "build_s": built, "write_s": wall, "rows_per_s": counts.total / wall,
            "rows_per_s_with_build": counts.total / (wall + built)}


# --- PromQL queries per month against a real Prometheus -----------------------------------------


def history(pods: int, start: datetime, end: datetime, step_s: int, path: Path) -> int:
    """OpenMetrics history of one node with `pods` pods (16 MIG GPUs, so pods vary and devices
    do not): the exporter's own rendering of one cycle, repeated every step_s seconds."""
    from bench.nodegen import node_scenario
    from bench.simshim import memoize_processes
    from exporter.history import OpenMetricsHistory
    from gpusim.cluster import SimCluster
    from gpusim.scenario import loads_scenario
    from metering.signals import FAMILIES

    sc = loads_scenario(node_scenario(gpus=16, pods=pods, procs_per_pod=1,
                                      node=f"bench-{pods}-pods"))
    with SimCluster([sc], start=time.time() - 3600) as cl:
        node = cl.nodes[0]
        memoize_processes(node.nvml)
        node.refresh_proc_tree()
        samples: dict[str, Any] = {}
        for i in range(3):  # GPM and counters need two cycles
            node.clock.now = time.time() + 5 * i
            samples = node.sampler.cycle().samples
    out = OpenMetricsHistory(path, families=FAMILIES)
    t = start.replace(tzinfo=UTC).timestamp() + 1
    stop = end.replace(tzinfo=UTC).timestamp()
    while t < stop:
        out.add(samples, t)
        t += step_s
    written = out.samples_written
    out.close()
    return written


class CountingProxy:
    """A loopback HTTP proxy in front of Prometheus that counts PromQL requests."""

    def __init__(self, target: str) -> None:
        import threading
        import urllib.error
        import urllib.request
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.count = 0
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.startswith(("/api/v1/query", "/api/v1/query_range")):
                    proxy.count += 1
                try:
                    with urllib.request.urlopen(target + self.path, timeout=120) as resp:
                        status, ctype, body = (resp.status, resp.headers.get("Content-Type", ""),
                                               resp.read())
                except urllib.error.HTTPError as err:  # relay Prometheus' own 4xx/5xx answer
                    status, ctype, body = err.code, err.headers.get("Content-Type", ""), err.read()
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_POST = do_GET

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


def promql_queries(pods: int, start: datetime, end: datetime, step_s: int) -> dict[str, Any]:
    from gpu_ledger.promserver import backfill, running_prometheus
    from metering import api
    from metering.db import connect
    from metering.period import Period
    from metering.promclient import PromClient
    from metering.prometheus_source import PrometheusSource

    with tempfile.TemporaryDirectory(prefix="gpu-ledger-bench-prom-") as tmp:
        om = Path(tmp) / "history.om"
        t0 = time.perf_counter()
        samples = history(pods, start, end, step_s, om)
        backfill(om, Path(tmp) / "data")
        om.unlink()
        prepared = time.perf_counter() - t0
        with running_prometheus(Path(tmp) / "data") as url:
            proxy = CountingProxy(url)
            try:
                ledger = Path(tmp) / "m.duckdb"
                t0 = time.perf_counter()
                result = api.meter(ledger, PrometheusSource(PromClient(proxy.url)),
                                   Period(start.replace(tzinfo=UTC), end.replace(tzinfo=UTC))
                                   ).ingest
                wall = time.perf_counter() - t0
                con = connect(ledger)
                pods_seen = con.execute(
                    "SELECT count(DISTINCT (namespace, pod)) FROM allocation_hours").fetchone()
                con.close()
            finally:
                proxy.close()
    return {"pods": pods, "samples": samples, "hours": int((end - start).total_seconds() // 3600),
            "queries": result.queries, "proxied_queries": proxy.count, "chunks": result.chunks,
            "fact_rows": sum(result.rows.values()),
            "pods_in_facts": int(pods_seen[0]) if pods_seen else 0, "ingest_s": wall,
            "prepare_s": prepared}


# --- the run ---------------------------------------------------------------------------------


def compare_totals(engine: dict[str, int], pandas: dict[str, int]) -> dict[str, Any]:
    keys = set(engine) | set(pandas)
    diffs = {k: pandas.get(k, 0) - engine.get(k, 0) for k in keys}
    worst = max(diffs.values(), key=abs) if diffs else 0
    return {"keys": len(keys), "max_abs_diff_micros": abs(worst),
            "same_to_the_cent": all(abs(d) < 5_000 for d in diffs.values())}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.metering", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="100 nodes, short PromQL history")
    p.add_argument("--nodes", type=int, help="fleet size (default 1000, --quick 100)")
    p.add_argument("--json", help="also write the raw results to this file")
    p.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        name, *rest = args.child
        print(json.dumps(CHILDREN[name](*rest)))
        return 0
    nodes = args.nodes or (100 if args.quick else 1000)
    res: dict[str, Any] = {"machine": machine(), "nodes": nodes}
    say(f"# metering benchmark ({'quick' if args.quick else 'full'}), {nodes} nodes x 8 GPUs, "
        f"{MONTH}, on {res['machine']['cores']} cores, {res['machine']['date']}")
    t_all = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gpu-ledger-bench-") as tmp:
        db = str(Path(tmp) / "fleet.duckdb")
        from metering.db import connect

        con = connect(db)
        t0 = time.perf_counter()
        res["fleet"] = generate(con, Fleet(nodes, START, int((END - START).total_seconds()
                                                              // 3600)))
        con.close()
        res["fleet"]["generate_s"] = time.perf_counter() - t0
        res["fleet"]["db_mib"] = Path(db).stat().st_size / 2**20
        say(f"facts: {res['fleet']} ")
        res["floor"] = run_child("floor", db)
        say(f"floor: {res['floor']['wall_s']:.2f} s")
        res["price"] = run_child("price", db)
        say(f"pricing: {res['price']['wall_s']:.1f} s, {res['price']['maxrss_mib']:.0f} MiB")
        # DuckDB's cap covers its buffers, not the whole process: a lower one keeps the
        # process under 2 GB.
        try:
            res["price_capped"] = run_child("price", db, env={MEMORY_ENV: CAPPED})
        except RuntimeError as exc:  # DuckDB cannot spill everything pricing holds
            res["price_capped"] = {"error": str(exc).strip().splitlines()[-1][:200]}
        say(f"pricing with {MEMORY_ENV}={CAPPED}: {res['price_capped']}")
        res["report"] = run_child("report", db, str(Path(tmp) / "reports"))
        say(f"reports: {res['report']['wall_s']:.1f} s, {res['report']['maxrss_mib']:.0f} MiB")
        res["pandas"] = run_child("pandas", db)
        say(f"pandas: {res['pandas']['wall_s']:.1f} s, {res['pandas']['maxrss_mib']:.0f} MiB")
    res["pandas_check"] = compare_totals(res["price"]["totals"], res["pandas"]["totals"])
    say("ingest write path")
    res["ingest"] = ingest_throughput(nodes, 72)
    hist_end = datetime(2026, 10, 4) if args.quick else datetime(2026, 11, 1)
    res["promql"] = []
    for pods in (10, 200):
        say(f"PromQL: {pods} pods, history {START:%Y-%m-%d} .. {hist_end:%Y-%m-%d}")
        res["promql"].append(promql_queries(pods, START, hist_end, 1800))
    res["elapsed_s"] = time.monotonic() - t_all
    say("")
    say(report(res))
    say(f"\n{res['machine']['command']}: {res['elapsed_s']:.0f} s")
    write_json(args.json, res)
    return 0


def _capped(r: dict[str, Any]) -> str:
    if "error" in r:
        return f"fails: {r['error']}"
    return f"{r['wall_s']:.1f} s / {r['maxrss_mib']:,.0f} MiB"


def report(res: dict[str, Any]) -> str:
    f, pr, rp, pd_, fl, ing = (res[k] for k in ("fleet", "price", "report", "pandas", "floor",
                                                 "ingest"))
    rows = [
        ["facts (device / MIG / allocation rows, pods)", "",
         f"{f['device_hours']:,} / {f['mig_hours']:,} / {f['allocation_hours']:,}, "
         f"{f['pods']:,} pods (generated in {f['generate_s']:.0f} s)"],
        ["pricing: price_period, wall / peak RSS", "<= 60 s, <= 2 GB",
         f"{pr['wall_s']:.1f} s / {pr['maxrss_mib']:,.0f} MiB ({pr['rows']:,} charge rows)"],
        [f"pricing with {MEMORY_ENV}={CAPPED}, wall / peak RSS", "<= 60 s, <= 2 GB",
         _capped(res["price_capped"])],
        ["reports: all formats, wall / peak RSS", "<= 60 s, <= 2 GB",
         f"{rp['wall_s']:.1f} s / {rp['maxrss_mib']:,.0f} MiB"],
        ["floor: bare DuckDB SUM(allocated_seconds) GROUP BY hour, model", "",
         f"{fl['wall_s']:.2f} s"],
        ["pricing / floor", "", f"{pr['wall_s'] / fl['wall_s']:.1f}x"],
        ["pandas: load / compute / peak RSS", "",
         f"{pd_['load_s']:.1f} s / {pd_['compute_s']:.1f} s / {pd_['maxrss_mib']:,.0f} MiB"],
        ["pandas (load + compute) / pricing", "", f"{pd_['wall_s'] / pr['wall_s']:.1f}x"],
        ["pandas totals = engine totals (per team, idle, down)", "to the cent",
         f"{res['pandas_check']['same_to_the_cent']} (max diff "
         f"{res['pandas_check']['max_abs_diff_micros']} micros over "
         f"{res['pandas_check']['keys']} totals)"],
        [f"ingest write path ({ing['nodes']} nodes, {ing['hours']} h chunk): write_facts",
         ">= 1M rows/s", f"{ing['rows_per_s']:,.0f} rows/s ({ing['fact_rows']:,} rows in "
         f"{ing['write_s']:.2f} s)"],
        ["same, with build_signal (labels to Arrow)", "",
         f"{ing['rows_per_s_with_build']:,.0f} rows/s"],
    ]
    for q in res["promql"]:
        rows.append([f"PromQL queries, {q['pods']} pods, {q['hours']} h", "<= 200 per month",
                     f"{q['queries']} (proxy counted {q['proxied_queries']}; "
                     f"{q['chunks']} chunks, {q['pods_in_facts']} pods in facts, "
                     f"ingest {q['ingest_s']:.1f} s)"])
    return table(["metering", "target", "measured"], rows)


if __name__ == "__main__":
    sys.exit(main())
