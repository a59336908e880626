"""A month of N GPUs through the real path: history in VictoriaMetrics, then `gpu-ledger meter`
(ingest, split to fit the store's limits), pricing and reports, each stage in its own process
(wall time, peak RSS), with the queries sent and the samples VictoriaMetrics read; and, in the
same run, the naive per-pod design (a range query per pod and signal, as OpenCost-style
allocation code does) measured on a sample of pods and projected to all of them.

    python -m bench.scale --gpus 10000            # 1/8 of the 80,000-GPU target
    python -m bench.scale --gpus 2000 --interval 600 --json out.json

The fleet (deterministic, seed 7): nodes of 8 GPUs (H100 and A100 by node), every GPU up the
whole month; each node's GPUs are cut into slots by node % 4 ([8], [4,4], [2,2,4], [1,1,2,4]),
and each slot runs pods one after another (4-80 h, idle gaps of 0-8 h, 20 namespaces, team
label on 9 pods in 10): about 40 pods per node a month, 400k pods at 80,000 GPUs. Series per
GPU: gpu_up, gpu_info, gpu_utilization_ratio, gpu_energy_joules_total; per pod and GPU:
gpu_container_allocation, gpu_container_memory_used_bytes,
gpu_container_sm_utilization_ratio. Samples every --interval seconds (300 by default; the
query count and the points metering reads are per hour, so they do not depend on it; what the
store reads does, linearly). The generator writes VictoriaMetrics' JSON-lines import format
from precomputed timestamp strings: it is not the simulator's sampler.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, NamedTuple

from bench.common import child_program, child_usage, machine, say, table, write_json
from gpu_ledger.procutil import stop
from gpu_ledger.promserver import free_port
from metering.period import Month

GPUS_PER_NODE = 8
SLOTS = ([8], [4, 4], [2, 2, 4], [1, 1, 2, 4])
MODELS = ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB")
NAMESPACES = tuple(f"team-{i:02d}" for i in range(20))
CONTAINER_SIGNALS = 6  # alloc count/sum/tlast, memory sum/max, SM sum
DEVICE_SIGNALS = 7  # up count/sum/tlast, info count, util sum, energy last/min
GIB = 2**30


class PodPlan(NamedTuple):
    pod: str
    namespace: str
    team: str  # label_team, '' for the pods without one
    slot: tuple[int, ...]  # GPU indices on the node
    i: int  # first and past-last sample index on the grid
    j: int
    memory: int  # bytes
    sm: float


class NodePlan(NamedTuple):
    node: str
    model: str
    gpus: list[tuple[int, float, int]]  # index, utilization, energy counter base
    pods: list[PodPlan]


class Grid:
    """The month's sample times as one JSON-ready string, sliceable by sample index."""

    def __init__(self, start: int, end: int, interval: int) -> None:
        self.times = list(range(start + interval, end + 1, interval))
        parts = [str(t * 1000) for t in self.times]
        self.offsets = [0]
        for p in parts:
            self.offsets.append(self.offsets[-1] + len(p) + 1)
        self.text = ",".join(parts)
        self.ones = ",".join("1" * len(self.times))

    def ts(self, i: int, j: int) -> str:
        return self.text[self.offsets[i]:self.offsets[j] - 1]

    def const(self, value: str, n: int) -> str:
        if value == "1":
            return self.ones[:2 * n - 1]
        return ",".join([value] * n)


def _line(metric: dict[str, str], values: str, ts: str) -> str:
    return f'{{"metric":{json.dumps(metric)},"values":[{values}],"timestamps":[{ts}]}}\n'


class Fleet:
    def __init__(self, gpus: int, start: datetime, end: datetime, interval: int) -> None:
        self.nodes = max(1, gpus // GPUS_PER_NODE)
        self.start, self.end = start, end
        # History from the hour before the month (energy differences need it).
        self.t0 = int((start - timedelta(hours=1)).timestamp())
        self.t1 = int(end.timestamp())
        self.interval = interval
        self.grid = Grid(self.t0, self.t1, interval)
        self.samples = 0
        self.series = 0
        # namespace, pod, first and last sample time (s), GPUs
        self.pods: list[tuple[str, str, int, int, int]] = []

    def plan(self, n: int) -> NodePlan:
        """Node `n`'s GPUs and pods, drawn from its own seed (the import and bench.close's
        facts read the same plan)."""
        rng = random.Random(7 * 1_000_003 + n)
        total = len(self.grid.times)
        gpus = []
        for gpu in range(GPUS_PER_NODE):
            util = rng.choice((0.25, 0.5, 0.75))
            gpus.append((gpu, util, rng.randrange(10**9)))
        pods: list[PodPlan] = []
        gpu = 0
        for size in SLOTS[n % len(SLOTS)]:
            slot = tuple(range(gpu, gpu + size))
            gpu += size
            i = rng.randrange(0, 8 * 3600 // self.interval + 1)
            k = 0
            while i < total:
                length = rng.randrange(4 * 3600, 80 * 3600) // self.interval
                j = min(total, i + max(1, length))
                ns = NAMESPACES[rng.randrange(len(NAMESPACES))]
                team = ns.replace("team-", "t") if rng.random() < 0.9 else ""
                mem = rng.randrange(4, 80) * GIB
                sm = rng.choice((0.0, 0.125, 0.5, 0.875))
                pods.append(PodPlan(f"job-{n:05d}-{slot[0]}-{k}", ns, team, slot, i, j, mem, sm))
                k += 1
                i = j + rng.randrange(0, 8 * 3600 // self.interval + 1)
        return NodePlan(f"node-{n:05d}", MODELS[n % 2], gpus, pods)

    def node_lines(self, n: int) -> Iterator[str]:
        plan = self.plan(n)
        node, model = plan.node, plan.model
        g = self.grid
        total = len(g.times)
        energy_step = 300 * self.interval  # 300 W
        for gpu, util, base in plan.gpus:
            uuid = f"GPU-{n:05d}-{gpu}"
            dev = {"node": node, "gpu": str(gpu), "uuid": uuid, "model": model}
            ts = g.ts(0, total)
            yield _line({"__name__": "gpu_up", **dev}, g.const("1", total), ts)
            yield _line({"__name__": "gpu_info", **dev, "driver_version": "550.54",
                         "mig_mode": "disabled"}, g.const("1", total), ts)
            yield _line({"__name__": "gpu_utilization_ratio", **dev}, g.const(f"{util:g}", total),
                        ts)
            energy = ",".join(map(str, range(base, base + total * energy_step, energy_step)))
            yield _line({"__name__": "gpu_energy_joules_total", **dev}, energy, ts)
            self.samples += 4 * total
            self.series += 4
        for p in plan.pods:
            team = {"label_team": p.team} if p.team else {}
            ts = g.ts(p.i, p.j)
            for d in p.slot:
                key = {"node": node, "namespace": p.namespace, "pod": p.pod, "container": "main",
                       "uuid": f"GPU-{n:05d}-{d}", "mig_uuid": ""}
                yield _line({"__name__": "gpu_container_allocation", **key,
                             "resource": "nvidia.com/gpu", "sharing": "exclusive",
                             "replicas": "1", "owner_kind": "Job", "owner_name": p.pod,
                             **team}, g.const("1", p.j - p.i), ts)
                yield _line({"__name__": "gpu_container_memory_used_bytes", **key, **team},
                            g.const(str(p.memory), p.j - p.i), ts)
                yield _line({"__name__": "gpu_container_sm_utilization_ratio", **key,
                             **team}, g.const(f"{p.sm:g}", p.j - p.i), ts)
                self.samples += 3 * (p.j - p.i)
                self.series += 3
            self.pods.append((p.namespace, p.pod, g.times[p.i], g.times[p.j - 1], len(p.slot)))


# --- VictoriaMetrics ---------------------------------------------------------------------


def pinned(cpus: set[int] | None) -> Callable[[], None] | None:
    """A child's pre-exec hook that confines it to `cpus` (None: unconfined); Go's runtime
    and the project's worker count read the affinity, so a pinned child sees that many
    cores."""
    if cpus is None:
        return None
    return lambda: os.sched_setaffinity(0, cpus)


def _post_import(url: str, lines: Iterator[str]) -> None:
    """JSON lines into the store at `url`, streamed as one import request in ~4 MiB pieces."""
    def body() -> Iterator[bytes]:
        buf: list[str] = []
        size = 0
        for line in lines:
            buf.append(line)
            size += len(line)
            if size > 4 << 20:
                yield "".join(buf).encode()
                buf, size = [], 0
        if buf:
            yield "".join(buf).encode()

    req = urllib.request.Request(f"{url}/api/v1/import", data=body(), method="POST")
    with urllib.request.urlopen(req, timeout=3600) as resp:
        resp.read()


class Victoria:
    def __init__(self, data: Path, cpus: set[int] | None = None) -> None:
        binary = shutil.which("victoria-metrics")
        if not binary:
            raise SystemExit("victoria-metrics is not installed: apt-get install -y "
                             "victoria-metrics")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = (data.parent / "vm.log").open("wb")
        self.data = data
        self.proc = subprocess.Popen(
            [binary, f"-storageDataPath={data}", f"-httpListenAddr=127.0.0.1:{self.port}",
             "-retentionPeriod=100y", "-search.disableCache"],
            stdout=self.log, stderr=subprocess.STDOUT, preexec_fn=pinned(cpus))
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2):
                    return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("victoria-metrics did not start") from None
                time.sleep(0.2)

    def import_lines(self, lines: Iterator[str]) -> None:
        _post_import(self.url, lines)

    def flush(self) -> None:
        with urllib.request.urlopen(f"{self.url}/internal/force_flush", timeout=600):
            pass

    def delete_series(self, match: str) -> None:
        """Delete the series `match` selects (VictoriaMetrics' admin API)."""
        q = urllib.parse.urlencode({"match[]": match})
        with urllib.request.urlopen(f"{self.url}/api/v1/admin/tsdb/delete_series?{q}",
                                    timeout=600) as resp:
            resp.read()

    def counter(self, name: str) -> float:
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=30) as resp:
            text = resp.read().decode()
        m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
        return float(m.group(1)) if m else 0.0

    def cpu_s(self) -> float:
        """CPU seconds the store has used (user + system), from /proc."""
        stat = Path(f"/proc/{self.proc.pid}/stat").read_text()
        fields = stat[stat.rindex(")") + 2:].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def rss_mib(self) -> float:
        return self.counter("process_resident_memory_bytes") / 2**20

    def close(self) -> None:
        stop(self.proc)
        self.log.close()


def _import_nodes(job: tuple[Fleet, str, range]) -> tuple[int, int]:
    fleet, url, nodes = job
    _post_import(url, (line for n in nodes for line in fleet.node_lines(n)))
    return fleet.samples, fleet.series


def import_fleet(vm: Victoria, fleet: Fleet, procs: int = 1) -> None:
    """The fleet's month into the store, flushed, from `procs` processes each writing a
    contiguous range of nodes (the same lines as one process writes). With one, the fleet
    counts its samples, series and pods; with more, its samples and series are the
    processes' sums and its `pods` list stays empty."""
    if procs <= 1:
        vm.import_lines(line for n in range(fleet.nodes) for line in fleet.node_lines(n))
    else:
        step = -(-fleet.nodes // procs)
        jobs = [(fleet, vm.url, range(a, min(a + step, fleet.nodes)))
                for a in range(0, fleet.nodes, step)]
        with multiprocessing.get_context("fork").Pool(len(jobs)) as pool:
            for samples, series in pool.map(_import_nodes, jobs):
                fleet.samples += samples
                fleet.series += series
    vm.flush()


def _disk_mib(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20


# --- stages, each in its own process ----------------------------------------------------


_CHILD = child_program()


def run_stage(args: list[str], required: bool = True, python: str = sys.executable,
              cwd: Path | None = None, cpus: set[int] | None = None) -> dict[str, Any]:
    """Run `gpu-ledger ...` in a child process: its wall time, peak RSS and stderr. A stage
    that is not `required` may fail: the run goes on and the figures say how it failed.
    `python`, `cwd`: another checkout's interpreter (its .venv) and the checkout (`-c` puts
    the working directory first on the path), to compare code on the same data. `cpus`: run
    it on these CPUs only."""
    t0 = time.perf_counter()
    proc = subprocess.run([python, "-c", _CHILD, *args], capture_output=True,
                          text=True, check=False, cwd=cwd, preexec_fn=pinned(cpus))
    wall = time.perf_counter() - t0
    if proc.returncode != 0 and required:
        raise SystemExit(f"gpu-ledger {' '.join(args)} failed ({proc.returncode}):\n"
                         f"{proc.stderr[-3000:]}")
    lines = [x for x in proc.stderr.splitlines() if x.strip() and not x.startswith("BENCH_")]
    return {"wall_s": wall, **child_usage(proc.stderr), "stderr": proc.stderr,
            "failed": lines[-1][:300] if proc.returncode != 0 and lines else ""}


def naive(vm: Victoria, fleet: Fleet, pods: int, window: str) -> dict[str, Any]:
    """Per-pod range queries (step 1h over the pod's life) for a sample of pods."""
    rng = random.Random(11)
    sample = rng.sample(fleet.pods, min(pods, len(fleet.pods)))
    funcs = ("count_over_time(gpu_container_allocation{{{m}}}[{w}])",
             "sum_over_time(gpu_container_allocation{{{m}}}[{w}])",
             "max_over_time(timestamp(gpu_container_allocation{{{m}}})[{w}:10s])",
             "sum_over_time(gpu_container_memory_used_bytes{{{m}}}[{w}])",
             "max_over_time(gpu_container_memory_used_bytes{{{m}}}[{w}])",
             "sum_over_time(gpu_container_sm_utilization_ratio{{{m}}}[{w}])")
    t0 = time.perf_counter()
    queries = samples = 0
    for ns, pod, first, last, gpus in sample:
        # each of the 6 queries reads the pod's series of its family once
        samples += len(funcs) * gpus * ((last - first) // fleet.interval + 1)
        m = f'namespace="{ns}",pod="{pod}"'
        start = first - first % 3600 + 3600
        end = last - last % 3600 + 3600
        for f in funcs:
            q = urllib.parse.urlencode({"query": f.format(m=m, w=window), "start": start,
                                        "end": end, "step": 3600})
            with urllib.request.urlopen(f"{vm.url}/api/v1/query_range?{q}", timeout=60) as r:
                json.load(r)
            queries += 1
    wall = time.perf_counter() - t0
    # VictoriaMetrics' per-query row counters skip these small queries: computed instead.
    return {"pods": len(sample), "queries": queries, "wall_s": wall,
            "per_query_ms": wall / queries * 1e3, "samples_read": samples}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpus", type=int, default=10_000)
    p.add_argument("--month", default="2026-10")
    p.add_argument("--interval", type=int, default=300, help="seconds between samples")
    p.add_argument("--naive-pods", type=int, default=200)
    p.add_argument("--workdir", help="keep the store and ledger here (default: a temp dir, "
                                     "removed at the end)")
    p.add_argument("--json", help="write the figures as JSON too")
    args = p.parse_args(argv)

    span = Month.parse(args.month).period()  # aware UTC bounds
    start, end = span.start, span.end
    work = Path(args.workdir or tempfile.mkdtemp(prefix="gpu-ledger-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    res: dict[str, Any] = {"machine": machine(), "gpus": args.gpus, "month": args.month,
                           "interval_s": args.interval}
    vm = Victoria(work / "vm-data")
    try:
        fleet = Fleet(args.gpus, start, end, args.interval)
        say(f"scale: {fleet.nodes} nodes x {GPUS_PER_NODE} GPUs, {args.month}, a sample "
            f"every {args.interval} s; importing into VictoriaMetrics at {vm.url}")
        t0 = time.perf_counter()
        import_fleet(vm, fleet)
        res["import"] = {"wall_s": time.perf_counter() - t0, "samples": fleet.samples,
                         "series": fleet.series, "pods": len(fleet.pods),
                         "vm_disk_mib": _disk_mib(work / "vm-data")}
        say(f"scale: imported {fleet.samples:,} samples, {fleet.series:,} series, "
            f"{len(fleet.pods):,} pods in {res['import']['wall_s']:.0f} s")

        db, out = work / "ledger.duckdb", work / "report"
        period = ["--month", args.month, "--db", str(db)]
        read0 = vm.counter("vm_rows_read_per_query_sum")
        scanned0 = vm.counter("vm_rows_scanned_per_query_sum")
        vm_cpu0 = vm.cpu_s()
        ing = run_stage(["meter", "--prometheus", vm.url, *period, "--no-price", "--verbose"])
        ing["vm_samples_read"] = vm.counter("vm_rows_read_per_query_sum") - read0
        ing["vm_samples_scanned"] = vm.counter("vm_rows_scanned_per_query_sum") - scanned0
        ing["vm_rss_mib"] = vm.rss_mib()
        ing["vm_cpu_s"] = vm.cpu_s() - vm_cpu0
        m = re.search(r"(\d+) chunks, (\d+) queries", ing["stderr"])
        ing["queries"] = int(m.group(2)) if m else None
        split = re.search(r"meter: queries: (.*)", ing["stderr"])
        ing["split"] = split.group(1) if split else ""
        chunk = re.search(r"meter: (chunks of .*)", ing["stderr"])
        ing["chunk"] = chunk.group(1) if chunk else ""
        res["ingest"] = ing
        say(f"scale: ingest {ing['wall_s']:.0f} s, {ing['maxrss_mib']:.0f} MiB, "
            f"{ing['queries']} queries; {ing['split']}")
        pr = run_stage(["meter", "--price-only", *period])
        res["price"] = pr
        say(f"scale: pricing {pr['wall_s']:.0f} s, peak RSS {pr['maxrss_mib']:.0f} MiB")
        rp = run_stage(["report", *period, "--out", str(out)], required=False)
        res["report"] = rp
        say(f"scale: report {rp['wall_s']:.0f} s, peak RSS {rp['maxrss_mib']:.0f} MiB")
        res["ledger_mib"] = db.stat().st_size / 2**20
        res["naive"] = naive(vm, fleet, args.naive_pods, "3599999ms")
        nv = res["naive"]
        hours = int((end - start).total_seconds() // 3600)
        res["naive_projection"] = {
            "queries": len(fleet.pods) * CONTAINER_SIGNALS
            + fleet.nodes * GPUS_PER_NODE * DEVICE_SIGNALS,
            "container_wall_s": nv["per_query_ms"] / 1e3 * len(fleet.pods) * CONTAINER_SIGNALS,
            "container_samples_read": nv["samples_read"] / max(nv["pods"], 1) * len(fleet.pods),
            "hours": hours}
        say(report(res))
    finally:
        vm.close()
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    write_json(args.json, {k: v for k, v in res.items()})
    return 0


def report(res: dict[str, Any]) -> str:
    ing, pr, rp, nv, nvp = (res["ingest"], res["price"], res["report"], res["naive"],
                            res["naive_projection"])
    imp = res["import"]
    rows = [
        ["fleet", f"{res['gpus']:,} GPUs, {imp['pods']:,} pods, {imp['series']:,} series, "
                  f"{imp['samples']:,} samples (every {res['interval_s']} s)"],
        ["import into VictoriaMetrics", f"{imp['wall_s']:.0f} s, {imp['vm_disk_mib']:,.0f} MiB "
                                        "on disk"],
        ["ingest (`meter --no-price`): wall / CPU / peak RSS",
         f"{ing['wall_s']:.0f} s / {ing['cpu_s']:.0f} s / {ing['maxrss_mib']:,.0f} MiB"],
        ["ingest: the store's CPU while answering", f"{ing['vm_cpu_s']:.0f} s"],
        ["ingest: range queries", f"{ing['queries']:,}"],
        ["ingest: how queries split", ing["split"]],
        ["ingest: chunk length", ing.get("chunk", "")],
        ["ingest: samples read by the store", f"{ing['vm_samples_read']:,.0f} (scanned "
                                              f"{ing['vm_samples_scanned']:,.0f})"],
        ["pricing (`meter --price-only`): wall / CPU / peak RSS",
         f"{pr['wall_s']:.0f} s / {pr['cpu_s']:.0f} s / {pr['maxrss_mib']:,.0f} MiB"],
        ["report (all formats): wall / CPU / peak RSS",
         f"{rp['wall_s']:.0f} s / {rp['cpu_s']:.0f} s / {rp['maxrss_mib']:,.0f} MiB"
         + (f" **failed**: {rp['failed']}" if rp["failed"] else "")],
        ["whole path (ingest + pricing + report): wall / CPU of the metering processes",
         f"{ing['wall_s'] + pr['wall_s'] + rp['wall_s']:.0f} s / "
         f"{ing['cpu_s'] + pr['cpu_s'] + rp['cpu_s']:.0f} s"],
        ["ledger file", f"{res['ledger_mib']:,.0f} MiB"],
        ["naive per-pod queries, measured", f"{nv['queries']:,} queries for {nv['pods']} pods "
                                            f"in {nv['wall_s']:.1f} s "
                                            f"({nv['per_query_ms']:.1f} ms each), "
                                            f"{nv['samples_read']:,.0f} samples read (computed)"],
        ["naive, projected to every pod and GPU (estimate)",
         f"{nvp['queries']:,} queries; the pods' share alone "
         f"{nvp['container_wall_s']:,.0f} s, {nvp['container_samples_read']:,.0f} samples"],
    ]
    return table(["quantity", "measured"], rows)


if __name__ == "__main__":
    raise SystemExit(main())
