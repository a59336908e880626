"""A month from scratch (backfill) on a given number of cores: bench.scale's fleet imported
once into VictoriaMetrics, then, for each `--config CORES[:JOBS]`, the store restarted on the
first CORES CPUs and `meter --no-price` (with `--jobs JOBS`, else meter's default: the cores
it may use), `meter --price-only` and `report` run one after another, each a child process on
the same CPUs as the store: wall, CPU seconds (the workers' too), peak RSS, the store's CPU
during ingest, and the DuckDB threads a process on those CPUs gets. Every configuration's
ledger must hold the same facts, coverage and bill row for row as the first one's.

    python -m bench.cores --gpus 10000 --config 2 16:8        # 2 cores, then 16 with 8 jobs
    python -m bench.cores --gpus 1000 --config 1 2 --json out.json

On a machine with more cores than the box the targets name, `--config 2` stands in for the
2-core box: the store and the metering process share two CPUs, as they do there (the CPUs
themselves differ, so compare configurations of one run, not runs of two machines).
The figures are written to `--json` after every stage, so a run cut short keeps what it did.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple

from bench.common import machine, say, table, write_json
from bench.day import PRICED_TABLES, same_rows
from bench.scale import Fleet, Victoria, import_fleet, pinned, run_stage
from metering.period import Month

# What the cores must not change: bench.day's --jobs tables, coverage without its source too
# (each configuration's store listens on a port of its own).
SAME_TABLES = ("device_hours", "mig_hours", "allocation_hours", "workload_hours", "grant_hours",
               "coverage EXCLUDE (ingested_at, source)", *PRICED_TABLES)


class Config(NamedTuple):
    cores: int
    jobs: int | None  # None: meter's default

    @classmethod
    def parse(cls, text: str) -> Config:
        cores, _, jobs = text.partition(":")
        try:
            config = cls(int(cores), int(jobs) if jobs else None)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not CORES[:JOBS]: {text!r}") from None
        if config.cores < 1 or (config.jobs is not None and config.jobs < 1):
            raise argparse.ArgumentTypeError(f"cores and jobs must be at least 1: {text!r}")
        return config

    def label(self) -> str:
        return (f"{self.cores} core{'s' if self.cores > 1 else ''}"
                + (f", --jobs {self.jobs}" if self.jobs else ""))


def core_order(cpus: set[int]) -> list[int]:
    """`cpus`, one per physical core first (a CPU's hyperthread siblings after every core's
    first): the first two are two cores where the machine has them. Without sysfs's topology
    (some sandboxes), in number order."""
    def rank(cpu: int) -> tuple[int, int]:
        try:
            text = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list"
                        ).read_text().strip()
        except OSError:
            return (0, cpu)
        siblings: list[int] = []
        for part in text.split(","):
            a, _, b = part.partition("-")
            siblings.extend(range(int(a), int(b or a) + 1))
        return (siblings.index(cpu) if cpu in siblings else 0, cpu)
    return sorted(cpus, key=rank)


def _duckdb_threads(cpus: set[int]) -> int:
    """The threads of a ledger connection (metering.db.engine) opened by a process on `cpus`."""
    out = subprocess.run(
        [sys.executable, "-c", "from metering.db import engine; print(engine(':memory:')"
         ".execute(\"SELECT current_setting('threads')\").fetchall()[0][0])"],
        capture_output=True, text=True, check=True,
        preexec_fn=pinned(cpus))
    return int(out.stdout)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.cores", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpus", type=int, default=10_000)
    p.add_argument("--month", default="2026-10")
    p.add_argument("--interval", type=int, default=300, help="seconds between samples")
    p.add_argument("--config", type=Config.parse, nargs="+", default=[Config(2, None)],
                   metavar="CORES[:JOBS]", help="configurations, run in this order")
    p.add_argument("--import-procs", type=int, default=len(os.sched_getaffinity(0)),
                   help="processes writing the fleet into the store (default: the cores)")
    p.add_argument("--workdir", help="keep the store and ledgers here (default: a temp dir)")
    p.add_argument("--json", help="write the figures as JSON too (after every stage)")
    args = p.parse_args(argv)
    cpus = core_order(os.sched_getaffinity(0))
    for c in args.config:
        if c.cores > len(cpus):
            p.error(f"--config {c.cores}: this process may use {len(cpus)} CPU(s)")

    span = Month.parse(args.month).period()  # aware UTC bounds
    work = Path(args.workdir or tempfile.mkdtemp(prefix="gpu-ledger-cores-"))
    work.mkdir(parents=True, exist_ok=True)
    res: dict[str, Any] = {"machine": machine(), "cpus": len(cpus), "gpus": args.gpus,
                           "month": args.month, "interval_s": args.interval, "runs": []}
    try:
        fleet = Fleet(args.gpus, span.start, span.end, args.interval)
        vm = Victoria(work / "vm-data")
        try:
            say(f"cores: {fleet.nodes} nodes x 8 GPUs, {args.month}; importing from "
                f"{args.import_procs} process(es)")
            t0 = time.perf_counter()
            import_fleet(vm, fleet, args.import_procs)
            res["import"] = {"wall_s": time.perf_counter() - t0, "samples": fleet.samples,
                             "series": fleet.series}
            say(f"cores: imported {fleet.samples:,} samples, {fleet.series:,} series in "
                f"{res['import']['wall_s']:.0f} s")
        finally:
            vm.close()
        write_json(args.json, res)
        first: Path | None = None
        for n, config in enumerate(args.config):
            on = set(cpus[:config.cores])
            run: dict[str, Any] = {"config": config.label(), "cpus": sorted(on),
                                   "duckdb_threads": _duckdb_threads(on),
                                   "load_before": os.getloadavg()[0]}
            res["runs"].append(run)
            db = work / f"ledger-{n}.duckdb"
            period = ["--month", args.month, "--db", str(db)]
            vm = Victoria(work / "vm-data", cpus=on)
            try:
                cpu0 = vm.cpu_s()
                jobs = ["--jobs", str(config.jobs)] if config.jobs else []
                run["ingest"] = run_stage(["meter", "--prometheus", vm.url, *period,
                                           "--no-price", "--quiet", *jobs], cpus=on)
                run["ingest"]["vm_cpu_s"] = vm.cpu_s() - cpu0
            finally:
                vm.close()
            write_json(args.json, res)
            run["price"] = run_stage(["meter", "--price-only", *period], cpus=on)
            write_json(args.json, res)
            run["report"] = run_stage(["report", *period, "--out", str(work / f"report-{n}")],
                                      cpus=on)
            for stage in ("ingest", "price", "report"):
                run[stage].pop("stderr")
            if first is None:
                first = db
            else:
                run["same_as_first"] = same_rows(first, db, SAME_TABLES)
            say(f"cores: {config.label()}: ingest {run['ingest']['wall_s']:.1f} s, pricing "
                f"{run['price']['wall_s']:.1f} s, report {run['report']['wall_s']:.1f} s")
            write_json(args.json, res)
        say(report(res))
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    return 0


def report(res: dict[str, Any]) -> str:
    rows = []
    for run in res["runs"]:
        i, pr, rp = run["ingest"], run["price"], run["report"]
        same = run.get("same_as_first")
        rows.append([
            run["config"], str(run["duckdb_threads"]),
            f"{i['wall_s']:.1f} s / {i['cpu_s']:.1f} / {i['vm_cpu_s']:.1f} / "
            f"{i['maxrss_mib']:,.0f}",
            f"{pr['wall_s']:.1f} s / {pr['cpu_s']:.1f} / {pr['maxrss_mib']:,.0f}",
            f"{rp['wall_s']:.1f} s / {rp['cpu_s']:.1f} / {rp['maxrss_mib']:,.0f}",
            f"{i['wall_s'] + pr['wall_s'] + rp['wall_s']:.1f} s",
            "first" if same is None else
            ("yes" if all(t["same"] for t in same.values()) else "**no**")])
    return (f"{res['gpus']:,} GPUs, {res['month']}, {res['import']['samples']:,} samples; "
            f"{res['machine']}\n\n" + table(
                ["configuration", "DuckDB threads",
                 "ingest: wall / CPU-s / store CPU-s / peak MiB",
                 "pricing: wall / CPU-s / peak MiB", "report: wall / CPU-s / peak MiB",
                 "month", "same rows"], rows))


if __name__ == "__main__":
    raise SystemExit(main())
