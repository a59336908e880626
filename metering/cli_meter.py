"""`gpu-ledger meter`: pull hourly GPU facts into DuckDB, then price the period; or, with
`--price-only`, (re-)price facts already in the database without any source.

A thin layer over `metering.api`: options in, one line and an exit status
(`metering.errors.ExitCode`, docs/operations.md) out.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable, Mapping
from contextlib import closing
from datetime import UTC, datetime
from pathlib import Path

from metering import api, db, interrupt, publish
from metering.chunking import DEFAULT_CHUNK_HOURS, duckdb_within, memory_budget, points_within
from metering.cluster import DEFAULT_CLUSTER, ClusterScope, cluster_name_problem
from metering.cores import available_cores
from metering.costmodel import CostModel, load_cost_model
from metering.errors import (
    ArgumentParser,
    ExitCode,
    InputError,
    MeteringError,
    RefusedError,
    UsageError,
)
from metering.facts import ADDED_UP_FAMILIES
from metering.ingest import Source
from metering.openmetrics_source import OpenMetricsSource
from metering.period import (
    DAY,
    HOUR,
    Month,
    Period,
    daily_window,
    fmt_hour,
    midnight,
    resolve,
    utc_aware,
)
from metering.progress import Progress
from metering.promclient import PromClient
from metering.prometheus_source import PrometheusSource
from metering.queryplan import (
    DEFAULT_MAX_QUERY_BYTES,
    DEFAULT_MAX_SAMPLES,
    DEFAULT_MAX_SERIES,
    Limits,
)
from metering.recorded import RecordedMode
from metering.selector import DEFAULT_SELECTOR, Selector, SelectorError
from metering.vmexport import RecordedRead

DEFAULT_DB = "gpu-ledger.duckdb"
# Days before yesterday that `--daily` re-meters: samples a store receives late (remote-write
# backlogs, a Prometheus restarted from its WAL) are picked up within them.
DEFAULT_LATE_DAYS = 2
# How far back `--daily` catches up on days the ledger lacks (a CronJob suspended for weeks);
# older gaps are metered with --from/--to.
CATCH_UP_DAYS = 62
# Defaults for --selector, --cluster and --cluster-label of a run that reads a source, so a
# deployment sets them without editing the CronJob's command (deploy/base: ConfigMap keys
# `selector`, `cluster`, `cluster-label`). An option given on the command line wins; an empty
# variable is unset (`{}` selects every series).
SOURCE_ENV = {"selector": "GPU_LEDGER_SELECTOR", "cluster": "GPU_LEDGER_CLUSTER",
              "cluster_label": "GPU_LEDGER_CLUSTER_LABEL"}


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="gpu-ledger meter",
                description="Pull hourly GPU facts (device, MIG, allocation) for a period from "
                            "Prometheus or an OpenMetrics file into DuckDB, then price them; "
                            "or, with --price-only, price the facts already in the database.")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prometheus", metavar="URL",
                     help="Prometheus base URL; http://user:pass@host is basic auth (the "
                          "password is never printed)")
    src.add_argument("--openmetrics", metavar="FILE",
                     help="OpenMetrics file of timestamped samples (promtool backfill format)")
    src.add_argument("--price-only", action="store_true",
                     help="price the facts already in --db for the period (no source needed), "
                          "e.g. after changing the cost model")
    p.add_argument("--daily", action="store_true",
                   help="the operating mode (the shipped CronJob, just after midnight UTC): "
                        "meter yesterday and re-meter the --late-days days before it for late "
                        "samples, and catch up on days the ledger lacks since its last metered "
                        "hour (at most 62 days); changes to a closed month's hours are posted "
                        "as adjustments to the open month")
    p.add_argument("--late-days", type=int, default=None, metavar="N",
                   help=f"with --daily: days before yesterday re-metered for late samples "
                        f"(default {DEFAULT_LATE_DAYS})")
    p.add_argument("--month", metavar="YYYY-MM", help="calendar month (UTC)")
    p.add_argument("--from", dest="start", metavar="TIME", help="start, ISO date/time, UTC")
    p.add_argument("--to", dest="end", metavar="TIME", help="end (exclusive), ISO date/time, UTC")
    p.add_argument("--adjust-closed", action="store_true",
                   help="hours of a month `gpu-ledger close` closed: keep its bill and post "
                        "what changes as adjustments to the first open month after it "
                        "(refused by default, exit 9; --daily implies it)")
    p.add_argument("--db", default=DEFAULT_DB, metavar="PATH",
                   help=f"DuckDB file (default ./{DEFAULT_DB})")
    p.add_argument("--cost-model", metavar="PATH", help="cost model (default: packaged one)")
    p.add_argument("--cluster", metavar="NAME",
                   help="the cluster the source's series belong to (default \"default\", or "
                        "$GPU_LEDGER_CLUSTER); with --cluster-label, the cluster of series "
                        "without that label; with --price-only, price this cluster only")
    p.add_argument("--cluster-label", metavar="LABEL",
                   help="one store holding several clusters: each series' cluster is the "
                        "value of this label (e.g. cluster; default $GPU_LEDGER_CLUSTER_LABEL)")
    auth = p.add_mutually_exclusive_group()
    auth.add_argument("--bearer-token-file", metavar="FILE")
    auth.add_argument("--basic-auth", metavar="USER:PASS")
    auth.add_argument("--basic-auth-file", metavar="FILE", help="file holding USER:PASS")
    p.add_argument("--ca-file", metavar="FILE", help="CA bundle for an https:// Prometheus")
    p.add_argument("--timeout", type=float, default=30.0, metavar="SECONDS",
                   help="deadline of one request, connect to last byte (default 30)")
    p.add_argument("--retries", type=int, default=4,
                   help="retries on timeouts, 5xx and refused connections (default 4)")
    p.add_argument("--retry-delay", type=float, default=0.5, metavar="SECONDS",
                   help="first backoff, doubled on each retry (default 0.5)")
    p.add_argument("--chunk", type=int, default=None, metavar="HOURS",
                   help="hours per range query and per write of the facts (default 72, or "
                        "the month where every signal's recorded series are read natively; a "
                        "chunk over ingest's memory budget is fetched in node groups, not "
                        "shortened)")
    p.add_argument("--jobs", default="1", metavar="N|auto",
                   help="worker processes fetching and decoding chunks for the one ledger "
                        "writer (default 1: all in this process; auto: the cores available "
                        "to the process, its CPU affinity or cgroup quota)")
    p.add_argument("--max-samples", type=int, default=None, metavar="N",
                   help="samples one query may touch; queries are split by node and time to "
                        "stay under it (default 50,000,000, Prometheus' --query.max-samples)")
    p.add_argument("--max-series", type=int, default=None, metavar="N",
                   help="series one query may select (default 300,000, VictoriaMetrics' "
                        "-search.maxUniqueTimeseries)")
    p.add_argument("--max-query-bytes", type=int, default=None, metavar="N",
                   help="PromQL text one query may hold; node shards are cut to fit (default "
                        "16,384, VictoriaMetrics' -search.maxQueryLen)")
    p.add_argument("--selector", metavar="MATCHERS", default=None,
                   help="PromQL label matchers naming the exporter's series; only those are "
                        "metered (default: $GPU_LEDGER_SELECTOR, else job=\"gpu-ledger-"
                        "exporter\", the shipped scrape job, for a period the store scraped in; "
                        "also series without a job label for backfilled history alone)")
    p.add_argument("--recorded", choices=[m.value for m in RecordedMode], default="auto",
                   help="read the hourly recording rules gpu_ledger:<signal>:hour where the "
                        "store has them for a whole chunk, else the raw series (auto, the "
                        "default); raw series only (never); recorded only, a chunk without "
                        "them an error (only). docs/metering.md, \"Recorded hourly series\"")
    p.add_argument("--recorded-read", choices=[m.value for m in RecordedRead], default="auto",
                   help="how recorded series are read: on VictoriaMetrics its "
                        "/api/v1/export/native where its version is one the decoder was "
                        "verified on, else /api/v1/export JSON lines; range queries on other "
                        "stores (auto, the default); range queries on any store (query_range); "
                        "JSON lines export (export) or native export on any version, checked "
                        "against JSON lines once a run (native), an error where the store has "
                        "none. docs/metering.md, \"Recorded hourly series\"")
    p.add_argument("--sample-interval", type=float, default=None, metavar="SECONDS",
                   help="seconds between exporter samples (default: detected per node)")
    p.add_argument("--no-price", action="store_true", help="ingest only")
    p.add_argument("--replace", action="store_true",
                   help="overwrite hours even where the source has fewer rows of a fact "
                        "family (device, MIG, allocation, workload, fraction hours) than the "
                        "ledger holds (refused by default, exit 6)")
    p.add_argument("--wait", type=float, default=0.0, metavar="SECONDS",
                   help="when another process holds the ledger, wait up to this long for it "
                        "(polling) instead of exiting 7 at once (default 0)")
    p.add_argument("--no-resume", action="store_true",
                   help="meter every chunk, even those an interrupted run of the same source "
                        "and period already committed (resumed by default)")
    p.add_argument(db.MEMORY_LIMIT_OPTION, metavar="SIZE",
                   help=f"DuckDB's memory cap, e.g. 4GB (default ${db.MEMORY_LIMIT_ENV}, else "
                        f"{db.DEFAULT_MEMORY_LIMIT}); beyond it DuckDB spills to disk")
    p.set_defaults(from_env=[])  # options apply_source_env filled from the environment
    p.add_argument("--pushgateway", metavar="URL", default=None,
                   help="after a successful run, push its state (per metered cluster: its share "
                        "of each team's spend, forecast and status, its budget; last success "
                        "time) to this Prometheus Pushgateway "
                        f"(default ${publish.ENV}); a failed push is a warning, not a failure")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress output")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="per-chunk query counts and detected sample interval")
    return p


def _read_secret(path: str, what: str) -> str:
    try:
        text = Path(path).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise InputError(f"{path}: cannot read the {what}: {exc.strerror}") from None
    if not text:
        raise InputError(f"{path}: expected a {what}, found an empty file")
    return text


def _basic_auth(args: argparse.Namespace) -> tuple[str, str] | None:
    raw, origin = args.basic_auth, "--basic-auth"
    if args.basic_auth_file:
        raw, origin = _read_secret(args.basic_auth_file, "USER:PASS line"), args.basic_auth_file
    if raw is None:
        return None
    user, sep, password = raw.partition(":")
    if not sep or not user:
        raise UsageError(f"{origin}: expected USER:PASS")
    return user, password


def _run(args: argparse.Namespace) -> int:
    if args.daily and (args.month or args.start or args.end):
        raise UsageError("--daily picks its own days: expected no --month, --from or --to")
    if args.late_days is not None and not args.daily:
        raise UsageError("--late-days: expected with --daily (the days it re-meters)")
    late_days = DEFAULT_LATE_DAYS if args.late_days is None else args.late_days
    if not 0 <= late_days <= 31:
        raise UsageError(f"--late-days: expected 0 to 31 days, got {late_days}")
    period = (daily_window(_now(), late_days) if args.daily
              else resolve(args.month, args.start, args.end))
    jobs = available_cores() if args.jobs == "auto" else (
        int(args.jobs) if args.jobs.isascii() and args.jobs.isdigit() else 0)
    if not 1 <= jobs <= 256:
        raise UsageError(f"--jobs: expected 1 to 256 worker processes or auto, got {args.jobs}")
    if args.chunk is not None and args.chunk < 1:
        raise UsageError(f"--chunk: expected a whole number of hours >= 1, got {args.chunk}")
    if args.sample_interval is not None and not 0 < args.sample_interval <= 3600:
        raise UsageError(f"--sample-interval: expected seconds in (0, 3600], got "
                         f"{args.sample_interval:g}")
    if args.timeout <= 0 or args.retries < 0 or args.retry_delay < 0:
        raise UsageError("--timeout must be > 0, --retries and --retry-delay >= 0")
    if not 0 <= args.wait <= 7 * 86400:
        raise UsageError(f"--wait: expected seconds from 0 to 604800, got {args.wait:g}")
    if args.price_only and args.no_price:
        raise UsageError("--price-only and --no-price: expected one of them, not both")

    def say(msg: str) -> None:
        if not args.quiet:
            print(msg, file=sys.stderr)

    if not args.price_only:
        for name in apply_source_env(args, os.environ):
            say(f"meter: --{name.replace('_', '-')} {getattr(args, name)} (from "
                f"${SOURCE_ENV[name]})")
    clusters = _cluster_scope(args)

    if period.clipped:
        say(f"meter: period ends in the future; metering complete hours up to "
            f"{fmt_hour(period.end)}")
    if args.daily:
        period = _catch_up(args, period, clusters, say)
    # The cost model before any source or ledger: a bad file should not cost an ingest run.
    model = None if args.no_price else load_cost_model(args.cost_model)
    if args.price_only:
        assert model is not None
        return _price_only(args, period, model, say)
    with closing(_open_source(args, period)) as source:
        if isinstance(source, PrometheusSource) and source.client.proxy is not None:
            proxy = source.client.proxy
            say(f"meter: connecting through proxy {proxy.shown} (${proxy.variable}; "
                "$NO_PROXY lists hosts reached directly)")
        if isinstance(source, PrometheusSource):
            settled = source.settle_selector(period)  # before the chunk estimate reads nodes
            if settled:
                say(f"meter: {settled}")
        budget = memory_budget()  # the container's, read once for the whole run
        if isinstance(source, PrometheusSource):  # node groups keep the budget, --chunk or not
            source.planner.memory_points = float(points_within(budget))
            # The automatic chunk asks about recorded series as the run will read them.
            source.recorded.mode = RecordedMode(args.recorded)
            source.planner.recorded_read = RecordedRead(args.recorded_read)
            source.planner.on_fallback = say
        chunk = args.chunk or _auto_chunk(source, period, budget, say)
        progress = Progress(-(-period.hours // chunk), quiet=args.quiet)
        fresh = not Path(args.db).exists()
        try:
            result = api.meter(args.db, source, period, api.MeterSettings(
                cost_model=model, clusters=clusters, chunk_hours=chunk,
                sample_interval=args.sample_interval, replace=args.replace,
                resume=not args.no_resume, wait=args.wait,
                adjust_closed=args.adjust_closed or args.daily, say=say, progress=progress,
                price_progress=_price_progress(args), verbose=args.verbose,
                jobs=jobs, recorded=RecordedMode(args.recorded),
                recorded_read=RecordedRead(args.recorded_read),
                ingest_duckdb_bytes=duckdb_within(budget)))
        except BaseException:
            if fresh:
                _drop_if_empty(Path(args.db))
            raise
    gateway = args.pushgateway or os.environ.get(publish.ENV, "").strip()
    if gateway:
        _publish(gateway, args, period, clusters, model, result, say)
    return 0


def _publish(gateway: str, args: argparse.Namespace, period: Period, clusters: ClusterScope,
             model: CostModel | None, result: api.MeterResult,
             say: Callable[[str], None]) -> None:
    """Push the run's state, one group per cluster it metered (the one `--cluster` names, or
    each value `--cluster-label` gave); a failure is one warning line (always shown), never
    an error: the ledger is written, and the stale-metering alert tells a gateway that stays
    away."""
    # a label run that wrote nothing still pushes its last success time, under --cluster
    names = (sorted(result.ingest.clusters) if clusters.label is not None else []) \
        or [clusters.name]
    month = publish.budget_month(period)
    hours = period.hours - len(result.ingest.empty_hours)
    finished = publish.now()
    pushed = 0
    for name in names:
        state = _cluster_state(args, name, period, month, hours, finished, model, result)
        try:
            publish.push(gateway, state)
        except publish.PushError as exc:
            print(f"gpu-ledger meter: warning: push to the Pushgateway failed (the ledger is "
                  f"written): {exc}", file=sys.stderr)
            return
        pushed += len(state.budgets)
    say(f"meter: pushed state to {gateway} ({len(names)} cluster(s), {pushed} team "
        f"budget line(s))")


def _cluster_state(args: argparse.Namespace, cluster: str, period: Period, month: Month,
                   hours: int, finished: float, model: CostModel | None,
                   result: api.MeterResult) -> publish.RunState:
    """What is pushed for one cluster: its own share of each team's bill (the report's
    per-cluster view), so sums over clusters add up to the fleet whether the clusters share a
    ledger or each has its own, never the fleet once per cluster."""
    from metering.report.builder import make_report  # the report's budgets: one definition

    currency, budgets = "", []
    energy: list[tuple[str, float, float | None]] = []
    if result.pricing is not None:
        try:
            report = make_report(args.db, month, args.cost_model, 0, cluster=cluster)
            currency, budgets = report.cost_model.currency, list(report.budgets or [])
            energy = [(t.team, float(t.energy.kwh), None if t.energy.co2e_kg is None
                       else float(t.energy.co2e_kg))
                      for t in report.teams if t.energy is not None and not t.overhead]
        except MeteringError as exc:
            print(f"gpu-ledger meter: warning: budgets of cluster {cluster} not published: "
                  f"{exc}", file=sys.stderr)
    carbon = None if model is None else model.for_cluster(cluster).carbon
    grams = None if carbon is None else float(carbon.grams_at(
        datetime.fromtimestamp(finished, UTC).replace(minute=0, second=0, microsecond=0,
                                                       tzinfo=None)))
    more = {family: result.ingest.more_series.get((cluster, family), 0)
            for family in ADDED_UP_FAMILIES}
    return publish.RunState(cluster, period, hours, finished, month, currency, budgets,
                            energy, grams, more)


def _now() -> datetime:
    """The clock --daily reads (tests set it)."""
    return datetime.now(UTC)


def _catch_up(args: argparse.Namespace, window: Period, clusters: ClusterScope,
              say: Callable[[str], None]) -> Period:
    """--daily's period: `window`, started earlier when the ledger's last metered hour of
    the cluster(s) is older (days missed), by at most CATCH_UP_DAYS."""
    if not Path(args.db).exists():
        return window
    with api.open_ledger(args.db, create=False, wait=args.wait, say=say) as con:
        where, params = "", list[object]()
        if clusters.label is None:
            where, params = " WHERE cluster = ?", [clusters.name]
        row = con.execute("SELECT max(hour) FROM coverage" + where, params).fetchone()
    if row is None or row[0] is None:
        return window
    resume_at = midnight(utc_aware(row[0]) + HOUR)
    if resume_at >= window.start:
        return window
    earliest = window.end - CATCH_UP_DAYS * DAY
    start = max(resume_at, earliest)
    say(f"meter: catching up from {fmt_hour(start)}: the ledger's last metered hour is "
        f"{fmt_hour(row[0])}" + ("" if start == resume_at else
                                  f"; older days: --from {fmt_hour(resume_at)} --to "
                                  f"{fmt_hour(start)}"))
    return Period(start, window.end)


def _drop_if_empty(path: Path) -> None:
    """Remove a ledger this run created when it failed before committing any hour: an empty
    ledger left behind would look metered to the next reader."""
    try:
        with closing(db.connect(path, read_only=True)) as con:
            row = con.execute("SELECT count(*) FROM coverage").fetchone()
    except Exception:  # unreadable: not ours to judge, leave it
        return
    if row is not None and row[0] == 0:
        for leftover in (path, path.with_name(path.name + ".wal")):
            leftover.unlink(missing_ok=True)


def apply_source_env(args: argparse.Namespace, environ: Mapping[str, str]) -> list[str]:
    """Fill --selector, --cluster and --cluster-label that the command line left out from
    their environment variables (SOURCE_ENV); returns the option names filled. Only for runs
    that read a source: --price-only takes its --cluster from the command line alone."""
    filled = []
    for name, var in SOURCE_ENV.items():
        value = environ.get(var, "").strip()
        if getattr(args, name) is None and value:
            setattr(args, name, value)
            filled.append(name)
    args.from_env = filled
    return filled


def _auto_chunk(source: Source, period: Period, budget: int,
                say: Callable[[str], None]) -> int:
    """Chunk hours that keep ingest's memory within `budget` (a Prometheus source: from its
    node count); the default where the source gives no estimate."""
    choice = (source.choose_chunk(period, budget)
              if isinstance(source, PrometheusSource) else None)
    if choice is None:
        return DEFAULT_CHUNK_HOURS
    say(f"meter: {choice.describe()}")
    return choice.hours


def _open_source(args: argparse.Namespace, period: Period) -> Source:
    try:
        selector = DEFAULT_SELECTOR if args.selector is None else Selector.parse(args.selector)
    except SelectorError as exc:
        raise UsageError(f"--selector{_from_env(args, 'selector')}: {exc}") from None
    if not args.prometheus:
        return OpenMetricsSource(args.openmetrics, period, selector)
    token = (_read_secret(args.bearer_token_file, "bearer token")
             if args.bearer_token_file else None)
    client = PromClient(args.prometheus, bearer_token=token, basic_auth=_basic_auth(args),
                        ca_file=args.ca_file, timeout=args.timeout,
                        retries=args.retries, backoff=args.retry_delay,
                        on_retry=None if args.quiet else
                        lambda line: print(f"gpu-ledger meter: {line}", file=sys.stderr))
    return PrometheusSource(client, _limits(args), selector)


def _limits(args: argparse.Namespace) -> Limits:
    for name, value, least in (("--max-samples", args.max_samples, 1),
                               ("--max-series", args.max_series, 1),
                               ("--max-query-bytes", args.max_query_bytes, 1)):
        if value is not None and value < least:
            raise UsageError(f"{name}: expected a whole number >= {least}, got {value}")
    return Limits(max_samples=args.max_samples or DEFAULT_MAX_SAMPLES,
                  max_series=args.max_series or DEFAULT_MAX_SERIES,
                  max_query_bytes=args.max_query_bytes or DEFAULT_MAX_QUERY_BYTES)


def _price_only(args: argparse.Namespace, period: Period, model: CostModel,
                say: Callable[[str], None]) -> int:
    """Price the period from the facts in --db: no Prometheus, no file, no ingest."""
    try:
        result = api.price(args.db, period, model, progress=_price_progress(args),
                           wait=args.wait, say=say, cluster=args.cluster,
                           adjust_closed=args.adjust_closed or args.daily)
    except RefusedError as exc:
        raise RefusedError(f"{exc}: gpu-ledger meter --prometheus URL {_period_args(args)} "
                           f"--db {args.db}") from None
    say(f"meter: priced {period.label()} from the facts in {args.db} with cost model "
        f"{model.hash[:12]}: {result.rows} charge rows, fleet cost {result.fleet_cost:.2f} "
        f"{result.currency}")
    if result.hours < period.hours:
        say(f"meter: {period.hours - result.hours} of {period.hours} hour(s) have no device "
            "facts (not ingested, or no data); they are not priced")
    return 0


def _price_progress(args: argparse.Namespace) -> Progress:
    return Progress(0, quiet=args.quiet, stage="price", unit="slice")


_LABEL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _cluster_scope(args: argparse.Namespace) -> ClusterScope:
    name = args.cluster or DEFAULT_CLUSTER
    problem = cluster_name_problem(name)
    if problem:
        raise UsageError(f"--cluster{_from_env(args, 'cluster')}: {problem}")
    label = args.cluster_label
    if label is not None and not _LABEL_NAME.match(label):
        raise UsageError(f"--cluster-label{_from_env(args, 'cluster_label')}: expected a "
                         f"Prometheus label name, got {label!r}")
    if label is not None and args.price_only:
        raise UsageError("--cluster-label reads series, --price-only reads none: expected one "
                         "of them")
    return ClusterScope(name, label)


def _from_env(args: argparse.Namespace, name: str) -> str:
    """' (from $VAR)' when the option's value came from its environment variable."""
    return f" (from ${SOURCE_ENV[name]})" if name in args.from_env else ""


def _period_args(args: argparse.Namespace) -> str:
    if args.daily:
        return "--daily"
    if args.month:
        return f"--month {args.month}"
    return f"--from {args.start} --to {args.end}"


INTERRUPTED_LINE = ("gpu-ledger meter: interrupted; committed chunks are kept and the same "
                    "command resumes after them")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as exc:  # --help (0) or a usage error (2)
        return int(exc.code) if isinstance(exc.code, int) else ExitCode.USAGE
    rc: int = ExitCode.INTERRUPTED
    # After the work, Ctrl-C changes nothing: the status below is the run's.
    trapped = interrupt.trap(then_ignore=True)
    try:
        with trapped as trap:
            try:
                with db.memory_cap(args.memory_limit, f"{args.db}: metering"):
                    rc = _run(args)
            except (MeteringError, KeyboardInterrupt, Exception) as exc:
                # After Ctrl-C, whatever it surfaced as (DuckDB's "Query interrupted", a
                # failed pricing) is the interrupt; a traceback only for a bug.
                if not trap.hit and not isinstance(exc, KeyboardInterrupt):
                    if isinstance(exc, MeteringError):
                        print(f"gpu-ledger meter: {exc}", file=sys.stderr)
                        return exc.code
                    raise
                trap.hit = True
    except KeyboardInterrupt:  # landed between the block's end and the trap's hand-over
        trap.hit = True
    if trap.hit:
        print(INTERRUPTED_LINE, file=sys.stderr)
        return ExitCode.INTERRUPTED
    return rc
