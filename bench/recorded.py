"""Store CPU per GPU-month of the month-end ingest, raw series vs the recorded hourly series
(group gpu-ledger.metering-series), alternated in one run over one VictoriaMetrics, with what
the rules' own evaluation costs beside it:

    python -m bench.recorded --gpus 500 --runs 2 --json out.json

1. bench.scale's fleet (a month, a sample every --interval s) imported into VictoriaMetrics.
2. Rule evaluation, two ways: `vmalert -replay` over the month (alerts/optional/
   gpu-ledger-metering-vm.yml, one range query per rule: how history is backfilled) and, as a
   live evaluator pays it, every rule as an instant query at hh:17 for `--live-hours` hours,
   projected to the month (a projection, labelled so). Store CPU from /proc, vmalert's own CPU
   from its rusage.
3. `gpu-ledger meter --no-price` of the month with `--recorded never` and `--recorded only`,
   alternated `--runs` times: client CPU, store CPU, peak RSS, wall; the facts of every run
   must be identical (digest).
"""

from __future__ import annotations

import argparse
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from alerts.generate import METERING_VM_FILE
from bench.common import machine, say, table, write_json
from bench.scale import Fleet, Victoria, run_stage
from metering.signals import SIGNALS

# vmalert's remote-write queue: replay pushes a month of every series of a rule at once, and
# the default queue (100,000 entries, one writer) drops what does not fit ("queue is full").
# A day per range query: the series of a month-long answer, flushed together when vmalert
# ends, are over VictoriaMetrics' 32 MiB request limit.
# A step of the group's hour: vmalert's replay otherwise steps -datasource.queryStep (5m)
# and writes twelve points an hour, not the one a live evaluator writes.
REPLAY_WRITE = ("-remoteWrite.maxQueueSize=100000000", "-remoteWrite.concurrency=2",
                "-remoteWrite.maxBatchSize=100", "-replay.maxDatapointsPerQuery=24",
                "-datasource.queryStep=1h")
# What vmalert logs when it loses recorded samples.
REPLAY_LOST = ("queue is full", "dropping")


def _loadavg() -> list[str]:
    with open("/proc/loadavg") as f:
        return f.read().split()[:3]


def _digest(db: Path) -> str:
    import duckdb
    con = duckdb.connect(str(db), read_only=True)
    try:
        d = con.execute("SELECT count(*), sum(hash(hour, uuid, observed_seconds, up_seconds, "
                        "sm_active_seconds, energy_joules)) FROM device_hours").fetchone()
        a = con.execute("SELECT count(*), sum(hash(hour, namespace, pod, container, uuid, "
                        "units, allocated_seconds, memory_byte_seconds, sm_seconds, labels)) "
                        "FROM allocation_hours").fetchone()
    finally:
        con.close()
    return f"{d}/{a}"


def replay(vm: Victoria, start: datetime, end: datetime, work: Path) -> dict[str, Any]:
    vmalert = shutil.which("vmalert")
    if not vmalert:
        raise SystemExit("vmalert is not installed: apt-get install -y vmalert")
    fmt = "%Y-%m-%dT%H:%M:%SZ"
    cpu0, store0, t0 = _children_cpu(), vm.cpu_s(), time.perf_counter()
    with (work / "replay.log").open("wb") as log:
        rc = subprocess.run(
            [vmalert, f"-rule={METERING_VM_FILE}", f"-datasource.url={vm.url}",
             f"-remoteWrite.url={vm.url}", f"-replay.timeFrom={start.strftime(fmt)}",
             f"-replay.timeTo={end.strftime(fmt)}", "-replay.rulesDelay=0s",
             "-replay.disableProgressBar", "-httpListenAddr=127.0.0.1:0",
             *REPLAY_WRITE],
            stdout=log, stderr=subprocess.STDOUT, check=False).returncode
    if rc != 0 or any(w in (work / "replay.log").read_text() for w in REPLAY_LOST):
        raise SystemExit(f"vmalert -replay failed ({rc}): see {work / 'replay.log'}")
    wall = time.perf_counter() - t0
    vm.flush()
    return {"wall_s": wall, "vmalert_cpu_s": _children_cpu() - cpu0,
            "store_cpu_s": vm.cpu_s() - store0}


def live(vm: Victoria, start: datetime, hours: int) -> dict[str, Any]:
    """Every rule as an instant query at hh:17 for `hours` hours: what a live evaluator
    asks the store (its answers are not written: that is the replay's)."""
    store0, t0 = vm.cpu_s(), time.perf_counter()
    for h in range(hours):
        at = (start + timedelta(hours=h + 1, minutes=17)).timestamp()
        for spec in SIGNALS:
            q = urllib.parse.urlencode({"query": spec.record_expr(metricsql=True),
                                        "time": f"{at:.0f}", "nocache": "1"})
            with urllib.request.urlopen(f"{vm.url}/api/v1/query?{q}", timeout=600) as r:
                r.read()
    return {"hours": hours, "wall_s": time.perf_counter() - t0,
            "store_cpu_s": vm.cpu_s() - store0}


def _children_cpu() -> float:
    u = resource.getrusage(resource.RUSAGE_CHILDREN)
    return u.ru_utime + u.ru_stime


def meter(vm: Victoria, month: str, mode: str, work: Path) -> dict[str, Any]:
    db = work / f"{mode}.duckdb"
    db.unlink(missing_ok=True)
    store0 = vm.cpu_s()
    r = run_stage(["meter", "--prometheus", vm.url, "--month", month, "--db", str(db),
                   "--no-price", "--verbose", "--recorded", mode])
    r["store_cpu_s"] = vm.cpu_s() - store0
    r["digest"] = _digest(db)
    split = [x for x in r.pop("stderr").splitlines() if x.startswith("meter: queries:")]
    r["split"] = split[0][len("meter: queries: "):] if split else ""
    return r


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.recorded", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpus", type=int, default=500)
    p.add_argument("--month", default="2026-10")
    p.add_argument("--interval", type=int, default=300, help="seconds between samples")
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--live-hours", type=int, default=24)
    p.add_argument("--workdir")
    p.add_argument("--reuse-store", action="store_true",
                   help="the store in --workdir holds the fleet already: no import")
    p.add_argument("--json")
    args = p.parse_args(argv)
    year, mon = map(int, args.month.split("-"))
    start = datetime(year, mon, 1, tzinfo=UTC)
    end = datetime(year + mon // 12, mon % 12 + 1, 1, tzinfo=UTC)
    hours = int((end - start).total_seconds() // 3600)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="gpu-ledger-recorded-"))
    work.mkdir(parents=True, exist_ok=True)
    res: dict[str, Any] = {"machine": machine(), "gpus": args.gpus, "month": args.month,
                           "interval_s": args.interval, "load_before": _loadavg()}
    if args.reuse_store and not args.workdir:
        p.error("--reuse-store needs --workdir")
    vm = Victoria(work / "vm-data")
    try:
        fleet = Fleet(args.gpus, start, end, args.interval)
        if not args.reuse_store:
            vm.import_lines(line for n in range(fleet.nodes) for line in fleet.node_lines(n))
            vm.flush()
        else:  # recorded series of an earlier run go: the replay below writes them again
            q = urllib.parse.urlencode({"match[]": '{__name__=~"gpu_ledger:.+"}'})
            with urllib.request.urlopen(f"{vm.url}/api/v1/admin/tsdb/delete_series?{q}",
                                        timeout=600) as r:
                r.read()
        gpus = fleet.nodes * 8
        res["import"] = {"samples": fleet.samples, "series": fleet.series}
        say(f"recorded: {gpus} GPUs, {fleet.samples:,} samples, {fleet.series:,} series")
        # The raw ingest first, before any recorded series exist (as today).
        runs: dict[str, list[dict[str, Any]]] = {"raw": [meter(vm, args.month, "never", work)]}
        res["replay"] = replay(vm, start - timedelta(minutes=43),
                               end + timedelta(minutes=17), work)
        res["live"] = live(vm, start, args.live_hours)
        runs["recorded"] = [meter(vm, args.month, "only", work)]
        for _ in range(args.runs - 1):
            runs["raw"].append(meter(vm, args.month, "never", work))
            runs["recorded"].append(meter(vm, args.month, "only", work))
        res["runs"] = runs
    finally:
        vm.close()
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    res["load_after"] = _loadavg()
    per = gpus * hours / 744  # GPU-months (a 31-day month = 744 h)
    identical = len({r["digest"] for rs in runs.values() for r in rs}) == 1
    rows = [[name, ", ".join(f"{r['store_cpu_s']:.1f}" for r in rs),
             f"{min(r['store_cpu_s'] for r in rs) / per * 1e3:.2f}",
             ", ".join(f"{r['cpu_s']:.1f}" for r in rs),
             ", ".join(f"{r['maxrss_mib']:,.0f}" for r in rs),
             ", ".join(f"{r['wall_s']:.0f}" for r in rs)] for name, rs in runs.items()]
    say(table(["month-end ingest", "store CPU-s", "store CPU-ms / GPU-month (best)",
               "client CPU-s", "peak RSS MiB", "wall s"], rows))
    raw = min(r["store_cpu_s"] for r in runs["raw"])
    rec = min(r["store_cpu_s"] for r in runs["recorded"])
    rp, lv = res["replay"], res["live"]
    live_month = lv["store_cpu_s"] * hours / max(lv["hours"], 1)
    res["summary"] = {"gpu_months": per, "store_ratio_recorded_to_raw": rec / raw,
                      "facts_identical": identical, "live_rules_store_cpu_s_month": live_month}
    say(f"recorded / raw store CPU at month end: {rec / raw:.3f} (target <= 1/3: "
        f"{'met' if rec / raw <= 1 / 3 else 'not met'}); facts identical in every run: "
        f"{'yes' if identical else '**no**'}")
    say(f"rule evaluation: vmalert -replay of the month {rp['wall_s']:.0f} s wall, store "
        f"{rp['store_cpu_s']:.1f} CPU-s, vmalert {rp['vmalert_cpu_s']:.1f} CPU-s; live "
        f"(instant queries at hh:17) {lv['store_cpu_s']:.1f} store CPU-s for {lv['hours']} h, "
        f"projected {live_month:.1f} CPU-s for the month (projection)")
    say(f"load average before / after: {res['load_before']} / {res['load_after']}")
    write_json(args.json, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
