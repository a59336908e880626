"""`gpu-ledger demo`: the whole product on one machine, in minutes.

1. Simulate a small cluster (the example scenarios: MIG, time-slicing, MPS, DRA claims, HAMi
   and gpushare grants, a vGPU host and guest, a GPU that falls off the bus, XIDs) for the
   first week of a month (--full-month: all of it), every --step, through the exporter's own
   code path (simulated NVML -> Sampler with a real PodResources server, cgroup files, pod and
   ResourceSlice watches), beside five AMD and Intel nodes (an MI300X in CPX/NPS4, an MxGPU
   host, an Intel Max with SR-IOV VFs, a Max 1550 whose tiles GPU Aware Scheduling gives to
   pods, an iGPU GVT-g host: gpusim/scenarios/vendors) through
   the same path over the exporter's AMD backend (simulated amdsmi) and Intel backend
   (simulated sysfs and Level Zero).
2. Backfill that history into a real Prometheus with promtool, then serve it, with the same
   nodes' exporters running live and scraped.
3. Run the metering job against that Prometheus into DuckDB, priced with the default cost model.
4. Write the month's chargeback report (terminal summary, HTML, CSV, Parquet, Markdown).
Where Prometheus is not installed it says how to install it and meters the OpenMetrics file.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import signal
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

from exporter.cli import parse_seconds
from exporter.errors import ConfigError
from exporter.history import OpenMetricsHistory
from gpu_ledger import promserver
from metering.errors import MeteringError
from metering.ingest import Source
from metering.openmetrics_source import OpenMetricsSource
from metering.period import Month, Period, PeriodError, utc_aware
from metering.promclient import PromClient
from metering.prometheus_source import PrometheusSource

# The alert and recording rules the demo's Prometheus loads (a source checkout has them).
RULES_DIR = Path(__file__).resolve().parent.parent / "alerts"
RULE_FILES = ("gpu-ledger-alerts.yml", "gpu-ledger-recording.yml")
SCENARIO_DIR = Path(__file__).resolve().parent.parent / "gpusim" / "scenarios"
DEMO_SCENARIOS = ("h100-mig.yaml", "a100-timeslice.yaml", "mixed.yaml", "rightsizing.yaml",
                  "sharing.yaml", "vgpu-host.yaml", "vgpu-guest.yaml")
VENDOR_DIR = SCENARIO_DIR / "vendors"
# A unix socket path is at most 107 bytes (sun_path is 108 with its NUL); the simulated
# kubelets listen at <temporary directory>/{sim,live}/<node>/kubelet.sock.
SOCKET_PATH_MAX = 107
# What metering and the dashboards read; the demo history keeps to these to stay small.
HISTORY_FAMILIES = (
    "gpu_info", "gpu_up", "gpu_utilization_ratio", "gpu_energy_joules_total",
    "gpu_power_watts", "gpu_temperature_celsius", "gpu_memory_used_bytes",
    "gpu_memory_total_bytes", "gpu_mig_info", "gpu_mig_memory_total_bytes",
    "gpu_xid_errors_total", "gpu_container_allocation", "gpu_container_memory_used_bytes",
    "gpu_container_sm_utilization_ratio", "gpu_container_processes", "gpu_sm_active_ratio",
    "gpu_container_memory_fraction", "gpu_container_core_fraction",
)




class Say:
    def __init__(self, total: int) -> None:
        self.total, self.n, self.t0 = total, 0, time.monotonic()

    def step(self, text: str) -> None:
        self.n += 1
        print(f"[{self.n}/{self.total}] {text}", flush=True)

    def note(self, text: str) -> None:
        print(f"      {text}", flush=True)


def _resolve(names: list[str]) -> list[Path]:
    return [Path(n) if Path(n).exists() else SCENARIO_DIR / n for n in names]


def is_vendor_scenario(path: Path) -> bool:
    """AMD and Intel nodes have a format of their own (gpusim/vendor_scenario.py); they are the
    files under gpusim/scenarios/vendors, or a --scenario given as vendors/NAME.yaml."""
    return path.resolve().parent == VENDOR_DIR.resolve()


def scenario_paths(names: list[str] | None) -> list[Path]:
    """The NVIDIA nodes (simulated NVML through the exporter)."""
    if names:
        return [p for p in _resolve(names) if not is_vendor_scenario(p)]
    return [SCENARIO_DIR / n for n in DEMO_SCENARIOS]


def vendor_scenario_paths(names: list[str] | None) -> list[Path]:
    """The AMD and Intel nodes (gpusim.vendor_node)."""
    if names:
        return [p for p in _resolve(names) if is_vendor_scenario(p)]
    return sorted(VENDOR_DIR.glob("*.yaml"))


# A week shows every scenario event (they all happen in the first day and repeat daily or
# hourly) in about three minutes on 2 cores; the month takes about four times as long
# (docs/performance.md, "Demo").
DEFAULT_DAYS = 7


def days_arg(text: str) -> int:
    """--days: 1..31 (more than the month has means the whole month)."""
    try:
        days = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of days, got {text!r}") from None
    if not 1 <= days <= 31:
        raise argparse.ArgumentTypeError(f"expected 1 to 31 days of the month, got {days}")
    return days


class Terminated(SystemExit):
    """SIGTERM, raised in the main thread so every `with` block below cleans up (Prometheus
    stopped, temporary directory removed) exactly as on Ctrl-C."""


def _on_sigterm(signum: int, frame: object) -> None:
    raise Terminated(128 + signum)


def firing_alerts(url: str) -> list[dict[str, str]]:
    """Labels of the alerts firing in the demo's Prometheus (empty when it cannot answer)."""
    try:
        with urllib.request.urlopen(f"{url}/api/v1/alerts", timeout=5) as resp:
            alerts = json.load(resp)["data"]["alerts"]
    except (OSError, ValueError, KeyError):
        return []
    return [a["labels"] for a in alerts if a.get("state") == "firing"]


def watch_alerts(url: str) -> None:
    """--keep-running: say where the alerts are, then each alert as it starts firing."""
    print(f"Alerts: {url}/alerts (the simulated faults' alerts fire once their `for` has "
          "passed; each is listed below as it starts). A GPU a scenario loses before the live "
          "exporters start (mixed.yaml's GPU 2) shows as GpuNotAnswering after 5 minutes (PCI "
          "lists more GPUs than answer NVML), not as GpuLost, which needs an exporter that saw "
          "the GPU answer.\nPress Ctrl-C to stop.", flush=True)
    seen: set[tuple[tuple[str, str], ...]] = set()
    while True:
        for labels in firing_alerts(url):
            key = tuple(sorted(labels.items()))
            if key not in seen:
                seen.add(key)
                where = ", ".join(f"{k}={labels[k]}" for k in ("node", "gpu", "uuid")
                                  if k in labels)
                print(f"  firing: {labels.get('alertname', '?')} ({where}) -> {url}/alerts",
                      flush=True)
        time.sleep(5)


def longest_socket_path(scenarios: list[Path], work: Path,
                        vendors: list[Path] | None = None) -> int:
    """Bytes in the longest simulated-kubelet socket path the demo will create under `work`.
    Raises ConfigError for a scenario that does not load."""
    from gpusim.scenario import load_scenario
    from gpusim.vendor_scenario import load_vendor_scenario

    nodes = [load_scenario(p).node for p in scenarios] + [
        load_vendor_scenario(p).node for p in vendors or []]
    return max((len(os.fsencode(work / part / node / "kubelet.sock"))
                for part in ("sim", "live") for node in nodes), default=0)


def simulate_history(scenarios: list[Path], start: datetime, end: datetime, step: float,
                     out_file: Path, workdir: Path, say: Say,
                     vendors: list[Path] | None = None) -> int:
    """Raises ConfigError for a scenario that does not load."""
    from gpusim.cluster import SimCluster

    t0, t1 = start.timestamp(), end.timestamp()
    steps = int((t1 - t0) // step)
    history = OpenMetricsHistory(out_file, HISTORY_FAMILIES)
    began = time.monotonic()
    with SimCluster(scenarios, start=t0, workdir=workdir, window=(0.0, t1 - t0 + step),
                    vendors=vendors or []) as c:
        say.note("nodes: " + ", ".join([n.name for n in c.nodes] + [
            f"{n.name} ({n.vendor.vendor})" for n in c.vendor_nodes]))
        for i in range(1, steps + 1):
            t = t0 + i * step
            for _, rendering in c.step(t):
                history.add(rendering.samples, t)
            if i % max(1, steps // 10) == 0 or i == steps:
                done = i / steps
                eta = (time.monotonic() - began) * (1 - done) / done
                print(f"      {done:4.0%} simulated ({i}/{steps} steps, "
                      f"{history.samples_written:,} samples, ETA {eta:.0f}s)", flush=True)
    history.close()
    return history.samples_written


@contextlib.contextmanager
def live_exporters(scenarios: list[Path], start: float, workdir: Path,
                   interval: float, vendors: list[Path] | None = None) -> Iterator[list[str]]:
    """The same nodes' exporters, live on the real clock, each on its own loopback port."""
    from exporter.web import start_server
    from gpusim.cluster import SimCluster

    now = time.time() - start
    with SimCluster(scenarios, start=start, workdir=workdir, live=True, interval=interval,
                    window=(now - 86400, now + 86400), vendors=vendors or []) as cluster:
        cluster.start_live()
        servers = [start_server(n.sampler, "127.0.0.1", 0, None) for n in cluster.all_nodes]
        try:
            yield [f"127.0.0.1:{s.port}" for s in servers]
        finally:
            for s in servers:
                s.shutdown()


def run_meter(source: Source, period: Period, db: Path) -> int:
    """Meter and price the period through the metering library, as the CronJob would."""
    from metering import api
    from metering.costmodel import load_cost_model

    def log(text: str) -> None:
        print(f"    {text}", flush=True)

    try:
        with contextlib.closing(source):
            api.meter(db, source, period,
                      api.MeterSettings(cost_model=load_cost_model(None), say=log))
    except MeteringError as err:
        print(f"gpu-ledger demo: {err}", file=sys.stderr)
        return err.code
    return 0


def run_report(month: str, db: Path, out: Path) -> int:
    """Write the month's chargeback report through the metering library, and print the
    summary `gpu-ledger report` prints."""
    from metering import api
    from metering.period import Month
    from metering.report.terminal import render_summary

    try:
        done = api.report(db, Month.parse(month), out)
    except MeteringError as err:
        print(f"gpu-ledger demo: {err}", file=sys.stderr)
        return err.code
    sys.stdout.write(render_summary(done.report, [str(p) for p in done.files]))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpu-ledger demo", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="demo-output", help="output directory (default ./demo-output)")
    p.add_argument("--month", help="month to simulate and report, YYYY-MM (default: last month)")
    span = p.add_mutually_exclusive_group()
    span.add_argument("--days", type=days_arg, default=DEFAULT_DAYS,
                      help=f"simulate the first N days of the month (default {DEFAULT_DAYS}; "
                           "the report names the hours without data)")
    span.add_argument("--full-month", dest="days", action="store_const", const=31,
                      help="simulate the whole month (about four times the default's time)")
    p.add_argument("--step", type=parse_seconds, default=600.0,
                   help="simulated sample spacing (default 10m)")
    p.add_argument("--scenario", action="append",
                   help="scenario file(s), vendors/NAME.yaml for an AMD or Intel node "
                        "(default: the example nodes, NVIDIA, AMD and Intel)")
    p.add_argument("--live-seconds", type=float, default=15.0,
                   help="how long Prometheus scrapes the live exporters (default 15)")
    p.add_argument("--keep-running", action="store_true",
                   help="leave Prometheus and the exporters running until Ctrl-C")
    p.add_argument("--no-prometheus", action="store_true",
                   help="meter the simulated OpenMetrics file instead of a real Prometheus")
    return p


def default_month(now: datetime) -> str:
    """Last month, or the one before while last month ended under 3 h ago (backfill limit)."""
    month = Month(now.year, now.month).previous()
    if utc_aware(month.end) > now - timedelta(hours=3):
        month = month.previous()
    return str(month)


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        return _main(args)
    except KeyboardInterrupt:
        print("gpu-ledger demo: interrupted", file=sys.stderr)
        return 130
    except Terminated as stop:
        print("gpu-ledger demo: terminated", file=sys.stderr)
        return int(stop.code or 143)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _main(args: argparse.Namespace) -> int:
    if importlib.util.find_spec("gpusim") is None:  # the image ships the product, not the simulator
        print("gpu-ledger demo: needs the simulator package gpusim, which this installation lacks "
              "(run it from a source checkout: make demo)", file=sys.stderr)
        return 2
    month = args.month or default_month(datetime.now(UTC))
    try:
        whole = Month.parse(month).period()
    except PeriodError:
        print(f"gpu-ledger demo: --month: expected YYYY-MM, got {month!r}", file=sys.stderr)
        return 2
    start, end = whole.start, whole.end
    end = min(end, start + timedelta(days=args.days))
    if end.timestamp() > time.time() - 3 * 3600:
        print("gpu-ledger demo: the month must have ended at least 3 hours ago "
              "(Prometheus backfill cannot write into its live head)", file=sys.stderr)
        return 2
    out = Path(args.out).resolve()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        print(f"gpu-ledger demo: --out {args.out}: cannot create it: {err.strerror}",
              file=sys.stderr)
        return 2
    scenarios = scenario_paths(args.scenario)
    vendors = vendor_scenario_paths(args.scenario)
    missing = [str(p) for p in [*scenarios, *vendors] if not p.is_file()]
    if missing:
        examples = sorted(str(p.relative_to(SCENARIO_DIR)) for p in
                          [*SCENARIO_DIR.glob("*.yaml"), *VENDOR_DIR.glob("*.yaml")])
        print(f"gpu-ledger demo: --scenario: no such file: {', '.join(missing)} (the examples: "
              f"{', '.join(examples)})",
              file=sys.stderr)
        return 2
    use_prometheus = not args.no_prometheus
    if use_prometheus:
        try:
            promserver.binaries()
        except promserver.PrometheusMissing as err:
            print(f"note: {err}.\n      Falling back to metering the simulated OpenMetrics file.",
                  flush=True)
            use_prometheus = False
    say = Say(4)
    began = time.monotonic()
    db = out / "gpu-ledger.duckdb"
    history_file = out / "history.om"
    with tempfile.TemporaryDirectory(prefix="gpu-ledger-demo-") as tmp:
        work = Path(tmp)
        try:
            longest = longest_socket_path(scenarios, work, vendors)
        except ConfigError as err:
            print(f"gpu-ledger demo: {err}", file=sys.stderr)
            return 2
        if longest > SOCKET_PATH_MAX:
            print(f"gpu-ledger demo: the temporary directory {tmp} is too long for the simulated "
                  f"kubelets' unix sockets ({longest} bytes > {SOCKET_PATH_MAX}); set TMPDIR to "
                  "a shorter directory, e.g. TMPDIR=/tmp", file=sys.stderr)
            return 2
        say.step(f"Simulating {len(scenarios) + len(vendors)} GPU nodes for {start:%Y-%m-%d} .. "
                 f"{end:%Y-%m-%d} every {args.step:g}s through the exporter's code path")
        try:
            n = simulate_history(scenarios, start, end, args.step, history_file, work / "sim",
                                 say, vendors)
        except ConfigError as err:
            print(f"gpu-ledger demo: {err}", file=sys.stderr)
            return 2
        say.note(f"{n:,} samples written to {history_file}")
        if use_prometheus:
            say.step("Backfilling the history into Prometheus with promtool, then serving it "
                     "with the nodes' exporters live")
            data_dir = work / "prometheus-data"
            rules = [RULES_DIR / name for name in RULE_FILES if (RULES_DIR / name).is_file()]
            promserver.backfill(history_file, data_dir)
            with live_exporters(scenarios, start.timestamp(), work / "live", 5.0,
                                vendors) as targets, \
                    promserver.running_prometheus(
                        data_dir, promserver.scrape_config(targets, rule_files=rules)) as url:
                say.note(f"Prometheus {url} scraping {', '.join(targets)}, with "
                         f"{len(rules)} rule files")
                time.sleep(max(0.0, args.live_seconds))
                say.step(f"Metering {month} from Prometheus into {db}")
                rc = run_meter(PrometheusSource(PromClient(url)), whole, db)
                if rc != 0:
                    return rc
                rc = _report(say, month, db, out)
                if rc == 0 and args.keep_running:
                    print(f"\nPrometheus: {url}   exporters: "
                          + ", ".join(f"http://{t}/metrics" for t in targets), flush=True)
                    with contextlib.suppress(KeyboardInterrupt):
                        watch_alerts(url)
        else:
            say.step("Skipping Prometheus: metering reads the OpenMetrics file instead")
            say.step(f"Metering {month} from {history_file} into {db}")
            rc = run_meter(OpenMetricsSource(str(history_file), whole), whole, db)
            if rc != 0:
                return rc
            rc = _report(say, month, db, out)
    if rc == 0:
        print(f"\nDone in {time.monotonic() - began:.0f}s. Outputs in {out}:")
        for path in sorted(out.rglob("*")):
            if path.is_file():
                print(f"  {path.relative_to(out.parent)}")
    return rc


def _report(say: Say, month: str, db: Path, out: Path) -> int:
    say.step(f"Writing the {month} chargeback report")
    return run_report(month, db, out / "report")

