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
3. How the recorded series are read, format by format (each signal's month in one request,
   alternated `--runs` times): a range query (matrix.read), /api/v1/export JSON lines
   (metering.vmexport.read), /api/v1/export/csv (label columns from /api/v1/labels, decoded by
   Arrow's CSV reader into typed columns, then the same hour selection),
   /api/v1/export/native (metering.vmnative.read), and the native export again chunk by
   chunk (`--chunk-hours`, the chunks meter asks for: one request per signal and chunk).
   Store CPU from /proc, client CPU of the decode in this process, answer bytes; every
   decoded format must give the same points as the range query.
4. `gpu-ledger meter --no-price` of the month: raw series (`--recorded never`), recorded
   series by range queries (`--recorded only --recorded-read query_range`), by export JSON
   lines (`--recorded-read export`) and native (`--recorded-read native`), alternated
   `--runs` times: client CPU, store CPU, peak RSS, wall; the facts of every run must be
   identical (digest).
"""

from __future__ import annotations

import argparse
import io
import json
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

import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv

from alerts.generate import METERING_VM_FILE
from bench.common import machine, say, table, write_json
from bench.scale import Fleet, Victoria, import_fleet, run_stage
from metering import matrix, vmexport, vmnative
from metering.signals import HOUR_S, SIGNALS

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


# How each meter run reads the month: --recorded and --recorded-read.
MODES = {"raw": ("never", "query_range"), "recorded query_range": ("only", "query_range"),
         "recorded export": ("only", "export"), "recorded native": ("only", "native")}


def meter(vm: Victoria, month: str, mode: str, work: Path) -> dict[str, Any]:
    recorded, read = MODES[mode]
    db = work / f"{mode.replace(' ', '-')}.duckdb"
    db.unlink(missing_ok=True)
    store0 = vm.cpu_s()
    r = run_stage(["meter", "--prometheus", vm.url, "--month", month, "--db", str(db),
                   "--no-price", "--verbose", "--recorded", recorded,
                   "--recorded-read", read])
    r["store_cpu_s"] = vm.cpu_s() - store0
    r["digest"] = _digest(db)
    split = [x for x in r.pop("stderr").splitlines() if x.startswith("meter: queries:")]
    r["split"] = split[0][len("meter: queries: "):] if split else ""
    return r


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=3600) as r:
        body: bytes = r.read()
    return body


def _csv_points(body: bytes, names: list[str], first: int, last: int) -> matrix.Matrix:
    """/api/v1/export/csv rows (label columns, value, unix ms) in typed Arrow columns, series
    told apart by their label columns' dictionary codes, then the hour selection of
    metering.vmexport."""
    if not body:
        return matrix.Matrix.empty()
    cols = [*names, "v", "t"]
    table = pa_csv.read_csv(
        io.BytesIO(body), read_options=pa_csv.ReadOptions(column_names=cols, use_threads=False),
        convert_options=pa_csv.ConvertOptions(
            column_types={"v": pa.float64(), "t": pa.int64(),
                          **{n: pa.dictionary(pa.int32(), pa.string()) for n in names}},
            strings_can_be_null=False))
    codes = np.stack([table.column(n).combine_chunks().indices.to_numpy() for n in names],
                     axis=1) if names else np.zeros((table.num_rows, 1), np.int32)
    uniq, line = np.unique(codes, axis=0, return_inverse=True)
    dicts = [table.column(n).combine_chunks().dictionary.to_pylist() for n in names]
    labels = [{n: dicts[j][int(c)] for j, (n, c) in enumerate(zip(names, row, strict=True))
               if dicts[j][int(c)]} for row in uniq]
    order = np.argsort(line.ravel(), kind="stable")
    lengths = np.bincount(line.ravel(), minlength=len(uniq)).astype(np.int64)
    return vmexport.hourly(labels, lengths, table.column("v").to_numpy()[order],
                           table.column("t").to_numpy()[order], first, last)


def _same(a: matrix.Matrix, b: matrix.Matrix) -> bool:
    return (a.keys == b.keys and np.array_equal(a.sid, b.sid) and np.array_equal(a.t, b.t)
            and a.v.tobytes() == b.v.tobytes())


NATIVE_CHUNKS = "export/native per chunk"


def formats(vm: Victoria, start: datetime, end: datetime, runs: int, chunk_h: int
            ) -> dict[str, Any]:
    """Every recorded signal's month read in each format, alternated `runs` times."""
    first = int(start.timestamp())
    last = int(end.timestamp())  # evaluation hours first..last, as meter reads a chunk
    out: dict[str, dict[str, list[float]]] = {}
    refs: dict[str, matrix.Matrix] = {}  # each signal's range query answer, series sorted
    same = True
    for _ in range(runs):
        for fmt in ("query_range", "export", "export/csv", "export/native", NATIVE_CHUNKS):
            store0, client, size = vm.cpu_s(), 0.0, 0
            for spec in SIGNALS:
                sel = spec.recorded_selector()
                rng = urllib.parse.urlencode(vmexport.params(sel, first, last))
                if fmt == "query_range":
                    q = urllib.parse.urlencode({"query": spec.recorded_promql(),
                                                "start": first, "end": f"{last}.001",
                                                "step": HOUR_S, "nocache": 1})
                    body = _get(f"{vm.url}/api/v1/query_range?{q}")
                    c0 = time.process_time()
                    got = matrix.read(body)
                    client += time.process_time() - c0
                    if got is None:
                        raise SystemExit(f"query_range of {spec.name}: not a matrix")
                    got = matrix.Matrix([{k: v for k, v in m.items() if k != "__name__"}
                                         for m in got.labels], got.keys, got.sid, got.t, got.v)
                    refs[spec.name] = _sorted(got)
                elif fmt == "export":
                    body = _get(f"{vm.url}/api/v1/export?{rng}")
                    c0 = time.process_time()
                    got = vmexport.read(body, first, last)
                    client += time.process_time() - c0
                elif fmt == "export/csv":
                    q = urllib.parse.urlencode([("match[]", sel), ("start", first),
                                                ("end", f"{last + HOUR_S - 1}.999")])
                    data = json.loads(_get(f"{vm.url}/api/v1/labels?{q}"))["data"]
                    names = sorted(n for n in data if n != "__name__")
                    form = ",".join([*names, "__value__", "__timestamp__:unix_ms"])
                    body = _get(f"{vm.url}/api/v1/export/csv?{rng}&"
                                + urllib.parse.urlencode({"format": form}))
                    c0 = time.process_time()
                    got = _csv_points(body, names, first, last)
                    client += time.process_time() - c0
                elif fmt == "export/native":
                    body = _get(f"{vm.url}/api/v1/export/native?{rng}")
                    c0 = time.process_time()
                    got = vmnative.read(body, first, last)
                    client += time.process_time() - c0
                else:  # as meter asks: evaluation hours chunk start .. chunk end
                    parts, body = [], b""
                    for lo in range(first, last, chunk_h * HOUR_S):
                        hi = min(lo + chunk_h * HOUR_S, last)
                        q = urllib.parse.urlencode(vmexport.params(sel, lo, hi))
                        part = _get(f"{vm.url}/api/v1/export/native?{q}")
                        c0 = time.process_time()
                        parts.append(vmnative.read(part, lo, hi))
                        client += time.process_time() - c0
                        size += len(part)
                    # Chunks share their boundary hour (as meter's do): compare point sets.
                    same = same and _points(parts) == _points([refs[spec.name]])
                    got = None
                size += len(body)
                if got is not None and fmt != "query_range":
                    same = same and _same(got, refs[spec.name])
            row = out.setdefault(fmt, {"store_cpu_s": [], "client_cpu_s": [], "mib": []})
            row["store_cpu_s"].append(vm.cpu_s() - store0)
            row["client_cpu_s"].append(client)
            row["mib"].append(size / 2**20)
    return {"formats": out, "same_points": same}


def _points(parts: list[matrix.Matrix]) -> set[tuple[str, float, int]]:
    """Every (series, time, value bits) of the matrices."""
    return {(p.keys[s], t, v) for p in parts
            for s, t, v in zip(p.sid.tolist(), p.t.tolist(), p.v.view(np.int64).tolist(),
                               strict=True)}


def _sorted(m: matrix.Matrix) -> matrix.Matrix:
    """A range query's matrix with its series in series_key order (export's order)."""
    rank = sorted(range(len(m.keys)), key=m.keys.__getitem__)
    remap = np.empty(len(rank), np.int64)
    remap[rank] = np.arange(len(rank))
    sid = remap[m.sid]
    order = np.lexsort((m.t, sid))
    return matrix.Matrix([m.labels[i] for i in rank], [m.keys[i] for i in rank], sid[order],
                         m.t[order], m.v[order])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.recorded", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpus", type=int, default=500)
    p.add_argument("--month", default="2026-10")
    p.add_argument("--interval", type=int, default=300, help="seconds between samples")
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--live-hours", type=int, default=24)
    p.add_argument("--chunk-hours", type=int, default=72,
                   help="chunk length of the per-chunk native reads (meter's at this size)")
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
            import_fleet(vm, fleet)
        else:  # recorded series of an earlier run go: the replay below writes them again
            q = urllib.parse.urlencode({"match[]": '{__name__=~"gpu_ledger:.+"}'})
            with urllib.request.urlopen(f"{vm.url}/api/v1/admin/tsdb/delete_series?{q}",
                                        timeout=600) as r:
                r.read()
        gpus = fleet.nodes * 8
        res["import"] = {"samples": fleet.samples, "series": fleet.series}
        say(f"recorded: {gpus} GPUs, {fleet.samples:,} samples, {fleet.series:,} series")
        # The raw ingest first, before any recorded series exist (as today).
        runs: dict[str, list[dict[str, Any]]] = {"raw": [meter(vm, args.month, "raw", work)]}
        res["replay"] = replay(vm, start - timedelta(minutes=43),
                               end + timedelta(minutes=17), work)
        res["live"] = live(vm, start, args.live_hours)
        res["formats"] = formats(vm, start, end, args.runs, args.chunk_hours)
        for mode in MODES:
            if mode != "raw":
                runs[mode] = [meter(vm, args.month, mode, work)]
        for _ in range(args.runs - 1):
            for mode in MODES:
                runs[mode].append(meter(vm, args.month, mode, work))
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
    fm = res["formats"]["formats"]
    say(table(["recorded month read as", "store CPU-s", "client decode CPU-s", "answer MiB"],
              [[name, ", ".join(f"{x:.2f}" for x in f["store_cpu_s"]),
                ", ".join(f"{x:.2f}" for x in f["client_cpu_s"]), f"{f['mib'][0]:,.1f}"]
               for name, f in fm.items()]))
    say(f"decoded formats give the range query's points bit for bit: "
        f"{'yes' if res['formats']['same_points'] else '**no**'}")
    raw = min(r["store_cpu_s"] for r in runs["raw"])
    ratios = {m: min(r["store_cpu_s"] for r in runs[m]) / raw for m in MODES if m != "raw"}
    rp, lv = res["replay"], res["live"]
    live_month = lv["store_cpu_s"] * hours / max(lv["hours"], 1)
    res["summary"] = {"gpu_months": per, "store_ratio_to_raw": ratios,
                      "facts_identical": identical, "live_rules_store_cpu_s_month": live_month}
    for m, ratio in ratios.items():
        say(f"{m} / raw store CPU at month end: {ratio:.3f} (target <= 1/3: "
            f"{'met' if ratio <= 1 / 3 else 'not met'})")
    say(f"facts identical in every run: {'yes' if identical else '**no**'}")
    say(f"rule evaluation: vmalert -replay of the month {rp['wall_s']:.0f} s wall, store "
        f"{rp['store_cpu_s']:.1f} CPU-s, vmalert {rp['vmalert_cpu_s']:.1f} CPU-s; live "
        f"(instant queries at hh:17) {lv['store_cpu_s']:.1f} store CPU-s for {lv['hours']} h, "
        f"projected {live_month:.1f} CPU-s for the month (projection)")
    say(f"load average before / after: {res['load_before']} / {res['load_after']}")
    write_json(args.json, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
