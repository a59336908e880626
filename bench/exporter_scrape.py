"""Exporter cost on a simulated "big node": sample-and-render cycle CPU, scrape latency over
real HTTP (ours vs prometheus_client's generate_latest), RSS and CPU of a separate exporter
process, and how cycle cost and exposition size grow with GPUs and processes.

    python -m bench.exporter_scrape            # full run (about 6 minutes on 2 cores)
    python -m bench.exporter_scrape --quick    # smoke check, about a minute
    python -m bench.exporter_scrape --json out.json

The NVML is simulated, so every figure measures our code plus the simulator's answers; the
simulator's per-process bookkeeping is memoized by bench/simshim.py (docs/performance.md gives
the figures with and without it).
"""

from __future__ import annotations

import argparse
import cProfile
import http.client
import pstats
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import (
    cpu_seconds,
    machine,
    rss_mib,
    say,
    summary_ms,
    table,
    write_json,
)
from bench.naive import NaiveSource
from bench.nodegen import node_scenario
from bench.simshim import memoize_processes
from exporter.web import MetricsSource, start_server
from gpu_ledger.procutil import stop
from gpu_ledger.promserver import free_port
from gpusim.cluster import SimCluster, SimNode
from gpusim.scenario import loads_scenario

INTERVAL = 5.0


@dataclass(frozen=True)
class Plan:
    cycles: int  # sample cycles timed per node size
    scrapes: int  # scrapes per format against our exporter
    naive_scrapes: int  # scrapes per format against the naive design
    proc_scrapes: int  # scrapes against the separate exporter process
    idle_seconds: float  # CPU window of the separate process
    growth_cycles: int
    full: bool  # every growth size, and the separate process without the simulator shim


FULL = Plan(cycles=200, scrapes=10_000, naive_scrapes=1_000, proc_scrapes=10_000,
            idle_seconds=60.0, growth_cycles=40, full=True)
QUICK = Plan(cycles=20, scrapes=500, naive_scrapes=50, proc_scrapes=500, idle_seconds=5.0,
             growth_cycles=5, full=False)


# --- in-process: a SimCluster node driven by a manual clock ------------------------------------


@contextmanager
def sim_node(yaml_text: str, shim: bool = True) -> Iterator[SimNode]:
    start = time.time() - 3600
    with SimCluster([loads_scenario(yaml_text)], start=start) as cluster:
        node = cluster.nodes[0]
        if shim:
            memoize_processes(node.nvml)
        node.sampler.eager_render = True  # the live exporter renders on the sampler thread
        node.clock.now = start + 3600
        node.refresh_proc_tree()  # constant pods: the tree never changes
        for _ in range(2):  # the first cycles open channels and take the first GPM samples
            node.clock.now += INTERVAL
            node.sampler.cycle()
        yield node


def time_cycles(node: SimNode, n: int) -> dict[str, Any]:
    cpu, thread, wall = [], [], []
    for _ in range(n):
        node.clock.now += INTERVAL
        c0, t0, w0 = time.process_time(), time.thread_time(), time.perf_counter()
        node.sampler.cycle()
        cpu.append(time.process_time() - c0)
        thread.append(time.thread_time() - t0)
        wall.append(time.perf_counter() - w0)
    body = node.sampler.exposition(False, False)
    return {"cpu": summary_ms(cpu), "thread_cpu": summary_ms(thread), "wall": summary_ms(wall),
            "bytes": len(body), "gzip_bytes": len(node.sampler.exposition(False, True)),
            "series": sum(1 for line in body.splitlines() if not line.startswith(b"#"))}


def simulator_share(node: SimNode, n: int) -> dict[str, float]:
    """Split cycle time between the simulator (gpusim, the shim) and everything else,
    from a cProfile run: real NVML would answer those calls, at its own cost."""
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(n):
        node.clock.now += INTERVAL
        node.sampler.cycle()
    prof.disable()
    stats: dict[Any, Any] = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    total = sim = 0.0
    for (file, _, _), (_, _, tottime, _, _) in stats.items():
        total += tottime
        if "/gpusim/" in file or file.endswith("simshim.py"):
            sim += tottime
    return {"simulator_fraction": sim / total if total else 0.0}


# --- scrapes over real HTTP ---------------------------------------------------------------------


def scrape_loop(port: int, n: int, gzipped: bool, between: Callable[[int], None] | None = None
                ) -> tuple[list[float], int]:
    """n GETs of /metrics on one keep-alive connection; durations (s) and the last body size."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    headers = {"Accept-Encoding": "gzip"} if gzipped else {}
    durations: list[float] = []
    size = 0
    try:
        for i in range(n):
            t0 = time.perf_counter()
            conn.request("GET", "/metrics", headers=headers)
            resp = conn.getresponse()
            body = resp.read()
            durations.append(time.perf_counter() - t0)
            if resp.status != 200:
                raise RuntimeError(f"scrape {i}: HTTP {resp.status}: {body[:200]!r}")
            size = len(body)
            if between is not None:
                between(i)
    finally:
        conn.close()
    return durations, size


def serve_and_scrape(source: MetricsSource, n: int, gzipped: bool) -> dict[str, Any]:
    server = start_server(source, "127.0.0.1", 0, None)
    try:
        scrape_loop(server.port, min(50, n), gzipped)  # warm-up: caches, connection
        durations, size = scrape_loop(server.port, n, gzipped)
    finally:
        server.shutdown()
    return {**summary_ms(durations), "bytes": size}


def scrape_comparison(node: SimNode, plan: Plan) -> dict[str, Any]:
    naive = NaiveSource(node.sampler, pod_labels=node.sampler.options.pod_label_allowlist)
    out: dict[str, Any] = {}
    for gz in (False, True):
        key = "gzip" if gz else "plain"
        out[f"ours_{key}"] = serve_and_scrape(node.sampler, plan.scrapes, gz)
        out[f"naive_{key}"] = serve_and_scrape(naive, plan.naive_scrapes, gz)
        out[f"ratio_{key}"] = out[f"naive_{key}"]["p50_ms"] / out[f"ours_{key}"]["p50_ms"]
    return out


# --- a separate exporter process ----------------------------------------------------------------


def wait_ready(port: int, proc: subprocess.Popen[bytes], log: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"exporter exited with {proc.returncode}:\n"
                               f"{log.read_text()[-3000:]}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/healthz")
            if conn.getresponse().status == 200:
                conn.close()
                return
            conn.close()
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"exporter not healthy after {timeout:.0f}s:\n{log.read_text()[-3000:]}")


def exporter_process(yaml_text: str, plan: Plan, shim: bool) -> dict[str, Any]:
    """Run the exporter as its own process against a simulated kubelet, API server and /proc
    (hosted by this process), scrape it, and read its RSS and CPU from /proc."""
    with tempfile.TemporaryDirectory(prefix="gpu-ledger-bench-") as tmp:
        scenario = Path(tmp) / "big-node.yaml"
        scenario.write_text(yaml_text)
        sc = loads_scenario(yaml_text)
        with SimCluster([sc], start=time.time(), workdir=Path(tmp) / "sim", live=True) as cl:
            node = cl.nodes[0]
            node.refresh_proc_tree()
            port = free_port()
            entry = (["-m", "bench.exporter_proc"] if shim
                     else ["-m", "gpu_ledger.cli", "exporter"])
            cmd = [sys.executable, *entry, f"--nvml=sim:{scenario}",
                   f"--web.listen-address=127.0.0.1:{port}", f"--interval={INTERVAL:g}s",
                   f"--node-name={sc.node}",
                   f"--pod-resources-socket={cl.workdir / sc.node / 'kubelet.sock'}",
                   f"--proc-root={node.proc_root}", f"--kubeconfig={cl.workdir / 'kubeconfig'}",
                   "--pod-labels=team", "--log-level=warning"]
            log = Path(tmp) / "exporter.log"
            with log.open("wb") as fh:
                proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT)
            try:
                wait_ready(port, proc, log)
                time.sleep(INTERVAL + 1)  # pod watch listed, GPM has two samples
                scrape_loop(port, 200, False)
                rss_before = rss_mib(proc.pid)
                cpu0, t0 = cpu_seconds(proc.pid), time.monotonic()
                plain, size = scrape_loop(port, plan.proc_scrapes, False)
                gz, gz_size = scrape_loop(port, min(plan.proc_scrapes // 4, 500), True)
                scrape_wall = time.monotonic() - t0
                scrape_cpu = cpu_seconds(proc.pid) - cpu0
                rss_after = rss_mib(proc.pid)
                # Idle: one scrape per interval, as Prometheus would at a 5 s scrape interval.
                cpu0, t0 = cpu_seconds(proc.pid), time.monotonic()
                while time.monotonic() - t0 < plan.idle_seconds:
                    scrape_loop(port, 1, True)
                    time.sleep(INTERVAL)
                idle_wall = time.monotonic() - t0
                idle_cpu = cpu_seconds(proc.pid) - cpu0
                rss_end = rss_mib(proc.pid)
                if proc.poll() is not None:
                    raise RuntimeError(f"exporter died: {log.read_text()[-2000:]}")
            finally:
                stop(proc)
    return {
        "command": " ".join(Path(c).name if c == sys.executable else c for c in cmd),
        "scrapes": len(plain) + len(gz), "plain": {**summary_ms(plain), "bytes": size},
        "gzip": {**summary_ms(gz), "bytes": gz_size},
        "scrape_cpu_ms_per_scrape": scrape_cpu / (len(plain) + len(gz)) * 1e3,
        "scrape_wall_s": scrape_wall,
        "rss_before_mib": rss_before, "rss_after_mib": rss_after, "rss_end_mib": rss_end,
        "idle_window_s": idle_wall, "idle_cpu_s": idle_cpu,
        "idle_core_percent": 100 * idle_cpu / idle_wall,
        "cpu_ms_per_cycle": 1e3 * idle_cpu / (idle_wall / INTERVAL),
    }


_RSS_PROBE = """
import sys
from pathlib import Path
if sys.argv[1] == "sim":
    from exporter.nvml_loader import load_nvml
    nvml = load_nvml("sim:" + sys.argv[2])
    nvml.nvmlInit()
    nvml._timeline.processes_at(0.0)
else:
    import pynvml
print([l for l in Path("/proc/self/status").read_text().splitlines()
       if l.startswith("VmRSS")][0].split()[1])
"""


def simulator_rss_mib(yaml_text: str) -> float:
    """Memory the simulator adds over real pynvml: a process that imports the simulator (numpy,
    the scenario model) and loads the scenario, minus one that imports pynvml."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "node.yaml"
        path.write_text(yaml_text)
        kib = [int(subprocess.run([sys.executable, "-c", _RSS_PROBE, kind, str(path)],
                                  capture_output=True, text=True, check=True).stdout)
               for kind in ("sim", "real")]
    return (kib[0] - kib[1]) / 1024


# --- growth --------------------------------------------------------------------------------------


def growth(plan: Plan) -> dict[str, list[dict[str, Any]]]:
    by_gpus, by_procs = [], []
    for gpus, pods in ((1, 12), (8, 100), (16, 200)) if plan.full else ((1, 12), (8, 100)):
        with sim_node(node_scenario(gpus=gpus, pods=pods, procs_per_pod=4)) as node:
            r = time_cycles(node, plan.growth_cycles)
        by_gpus.append({"gpus": gpus, "mig": gpus * 7, "pods": pods, "processes": pods * 4, **r})
        say(f"  growth: {gpus} GPUs: cycle {r['cpu']['p50_ms']:.1f} ms CPU, {r['bytes']:,} B")
    for procs in (10, 100, 400, 1000) if plan.full else (10, 400):
        pods = min(100, procs)
        with sim_node(node_scenario(gpus=8, pods=pods, procs_per_pod=procs // pods)) as node:
            r = time_cycles(node, plan.growth_cycles)
        by_procs.append({"gpus": 8, "pods": pods, "processes": procs, **r})
        say(f"  growth: {procs} processes: cycle {r['cpu']['p50_ms']:.1f} ms CPU, "
            f"{r['bytes']:,} B")
    return {"gpus": by_gpus, "processes": by_procs}


# --- report --------------------------------------------------------------------------------------


def report(res: dict[str, Any]) -> str:
    big, raw, cmp_ = res["cycle"], res["cycle_unshimmed"], res["scrapes"]
    proc, proc_raw = res["process"], res.get("process_unshimmed")
    rows = [
        ["cycle CPU p50 / p99 (ms, process_time)", "<= 50",
         f"{big['cpu']['p50_ms']:.1f} / {big['cpu']['p99_ms']:.1f}"],
        ["cycle CPU, sampler thread only p50 (ms)", "",
         f"{big['thread_cpu']['p50_ms']:.1f}"],
        ["share of cycle time in the simulator (cProfile)", "",
         f"{100 * big['simulator_fraction']:.0f} %"],
        ["cycle CPU p50, simulator not memoized (ms)", "", f"{raw['cpu']['p50_ms']:.1f}"],
        ["scrape p50 / p99, plain (ms, in-process)", "p99 <= 5",
         f"{cmp_['ours_plain']['p50_ms']:.3f} / {cmp_['ours_plain']['p99_ms']:.3f}"],
        ["scrape p50 / p99, gzip (ms, in-process)", "p99 <= 5",
         f"{cmp_['ours_gzip']['p50_ms']:.3f} / {cmp_['ours_gzip']['p99_ms']:.3f}"],
        ["naive generate_latest p50 / p99, plain (ms)", "",
         f"{cmp_['naive_plain']['p50_ms']:.2f} / {cmp_['naive_plain']['p99_ms']:.2f}"],
        ["naive generate_latest p50 / p99, gzip (ms)", "",
         f"{cmp_['naive_gzip']['p50_ms']:.2f} / {cmp_['naive_gzip']['p99_ms']:.2f}"],
        ["naive / ours, p50 plain | gzip", "",
         f"{cmp_['ratio_plain']:.0f}x | {cmp_['ratio_gzip']:.0f}x"],
        ["separate process: scrape p50 / p99 plain (ms)", "p99 <= 5",
         f"{proc['plain']['p50_ms']:.3f} / {proc['plain']['p99_ms']:.3f}"],
        ["separate process: scrape p50 / p99 gzip (ms)", "p99 <= 5",
         f"{proc['gzip']['p50_ms']:.3f} / {proc['gzip']['p99_ms']:.3f}"],
        ["separate process: RSS before / after scrapes / end (MiB)", "<= 100, no growth",
         f"{proc['rss_before_mib']:.1f} / {proc['rss_after_mib']:.1f} / "
         f"{proc['rss_end_mib']:.1f}"],
        ["of which the simulator (numpy, scenario) (MiB)", "",
         f"{proc['simulator_rss_mib']:.1f}"],
        [f"separate process: CPU at 5 s interval ({proc['idle_window_s']:.0f} s window)",
         "<= 2 % of a core", f"{proc['idle_core_percent']:.2f} %"],
        ["same, simulator not memoized", "",
         f"{proc_raw['idle_core_percent']:.2f} % (RSS {proc_raw['rss_end_mib']:.1f} MiB)"
         if proc_raw else "(full run only)"],
        ["exposition size plain / gzip (bytes)", "",
         f"{big['bytes']:,} / {big['gzip_bytes']:,} ({big['series']:,} series)"],
    ]
    out = [table(["big node (8 GPUs, 56 MIG, 100 pods, 400 processes)", "target", "measured"],
                 rows)]
    g = res["growth"]
    out.append(table(["GPUs", "MIG instances", "pods", "processes", "cycle CPU p50 (ms)",
                      "cycle CPU p99 (ms)", "series", "bytes", "gzip bytes"],
                     [[r["gpus"], r["mig"], r["pods"], r["processes"],
                       r["cpu"]["p50_ms"], r["cpu"]["p99_ms"], r["series"], r["bytes"],
                       r["gzip_bytes"]] for r in g["gpus"]]))
    out.append(table(["processes", "pods", "GPUs", "cycle CPU p50 (ms)", "cycle CPU p99 (ms)",
                      "series", "bytes", "gzip bytes"],
                     [[r["processes"], r["pods"], r["gpus"], r["cpu"]["p50_ms"],
                       r["cpu"]["p99_ms"], r["series"], r["bytes"], r["gzip_bytes"]]
                      for r in g["processes"]]))
    return "\n\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.exporter_scrape", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="small smoke run (under a minute)")
    p.add_argument("--json", help="also write the raw results to this file")
    args = p.parse_args(argv)
    plan = QUICK if args.quick else FULL
    res: dict[str, Any] = {"machine": machine(), "plan": plan.__dict__}
    say(f"# exporter benchmark ({'quick' if args.quick else 'full'}) on "
        f"{res['machine']['cores']} cores, {res['machine']['cpu']}, {res['machine']['date']}")
    big = node_scenario(gpus=8, pods=100, procs_per_pod=4)
    t0 = time.monotonic()
    with sim_node(big) as node:
        say(f"cycle: {plan.cycles} cycles of the big node")
        res["cycle"] = time_cycles(node, plan.cycles)
        res["cycle"].update(simulator_share(node, max(5, plan.cycles // 10)))
        say(f"scrapes: {plan.scrapes} ours and {plan.naive_scrapes} naive, per format")
        res["scrapes"] = scrape_comparison(node, plan)
    with sim_node(big, shim=False) as node:
        say("cycle without the simulator memo")
        res["cycle_unshimmed"] = time_cycles(node, max(3, plan.cycles // 20))
    say(f"separate process: {plan.proc_scrapes} scrapes, then {plan.idle_seconds:.0f} s at a "
        f"{INTERVAL:g} s interval")
    res["process"] = exporter_process(big, plan, shim=True)
    res["process"]["simulator_rss_mib"] = simulator_rss_mib(big)
    if plan.full:
        res["process_unshimmed"] = exporter_process(
            big, Plan(**{**plan.__dict__, "proc_scrapes": 1000}), shim=False)
    say("growth")
    res["growth"] = growth(plan)
    res["elapsed_s"] = time.monotonic() - t0
    say("")
    say(report(res))
    say(f"\n{res['machine']['command']}: {res['elapsed_s']:.0f} s")
    write_json(args.json, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
