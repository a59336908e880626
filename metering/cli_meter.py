"""`gpu-ledger meter`: pull hourly GPU facts into DuckDB, then price the period; or, with
`--price-only`, (re-)price facts already in the database without any source.

Exit codes: 0 ok, 1 a named failure (Prometheus, the database, the data, pricing), 2 usage.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from metering.period import Period, PeriodError, resolve

if TYPE_CHECKING:
    from metering.queryplan import Limits

DEFAULT_DB = "gpu-ledger.duckdb"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # usage errors: exit 2 with one line, no traceback
        self.print_usage(sys.stderr)
        self.exit(2, f"gpu-ledger meter: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="gpu-ledger meter",
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
    p.add_argument("--month", metavar="YYYY-MM", help="calendar month (UTC)")
    p.add_argument("--from", dest="start", metavar="TIME", help="start, ISO date/time, UTC")
    p.add_argument("--to", dest="end", metavar="TIME", help="end (exclusive), ISO date/time, UTC")
    p.add_argument("--db", default=DEFAULT_DB, metavar="PATH",
                   help=f"DuckDB file (default ./{DEFAULT_DB})")
    p.add_argument("--cost-model", metavar="PATH", help="cost model (default: packaged one)")
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
                   help="hours per range query and transaction (default 72)")
    p.add_argument("--max-samples", type=int, default=None, metavar="N",
                   help="samples one query may touch; queries are split by node and time to "
                        "stay under it (default 50,000,000, Prometheus' --query.max-samples)")
    p.add_argument("--max-series", type=int, default=None, metavar="N",
                   help="series one query may select (default 300,000, VictoriaMetrics' "
                        "-search.maxUniqueTimeseries)")
    p.add_argument("--selector", metavar="MATCHERS", default=None,
                   help="PromQL label matchers naming the exporter's series; only those are "
                        "metered (default: job=~\"gpu-ledger-exporter|\", the shipped "
                        "scrape job, or no job label for backfilled history)")
    p.add_argument("--sample-interval", type=float, default=None, metavar="SECONDS",
                   help="seconds between exporter samples (default: detected per node)")
    p.add_argument("--no-price", action="store_true", help="ingest only")
    p.add_argument("--replace", action="store_true",
                   help="overwrite hours even where the source has fewer device-hours than "
                        "the ledger holds (refused by default)")
    p.add_argument("--no-resume", action="store_true",
                   help="meter every chunk, even those an interrupted run of the same source "
                        "and period already committed (resumed by default)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress output")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="per-chunk query counts and detected sample interval")
    return p


def _read_secret(path: str, what: str) -> str:
    try:
        text = Path(path).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise _Fail(f"{path}: cannot read the {what}: {exc.strerror}") from None
    if not text:
        raise _Fail(f"{path}: expected a {what}, found an empty file")
    return text


def _basic_auth(args: argparse.Namespace) -> tuple[str, str] | None:
    raw, origin = args.basic_auth, "--basic-auth"
    if args.basic_auth_file:
        raw, origin = _read_secret(args.basic_auth_file, "USER:PASS line"), args.basic_auth_file
    if raw is None:
        return None
    user, sep, password = raw.partition(":")
    if not sep or not user:
        raise _Usage(f"{origin}: expected USER:PASS")
    return user, password


class _Fail(Exception):
    """Exit 1 with this message."""


class _Usage(Exception):
    """Exit 2 with this message."""


def _fmt(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%MZ")


def _run(args: argparse.Namespace) -> int:
    from metering.db import DatabaseError, connect
    from metering.ingest import (
        DEFAULT_CHUNK_HOURS,
        IngestError,
        PrometheusSource,
        Source,
        hour_ranges,
        ingest,
    )
    from metering.openmetrics_source import OpenMetricsError, OpenMetricsSource
    from metering.progress import Progress
    from metering.promclient import PromClient, PromError

    try:
        period = resolve(args.month, args.start, args.end)
    except PeriodError as exc:
        raise _Usage(str(exc)) from None
    if args.chunk is not None and args.chunk < 1:
        raise _Usage(f"--chunk: expected a whole number of hours >= 1, got {args.chunk}")
    if args.sample_interval is not None and not 0 < args.sample_interval <= 3600:
        raise _Usage(f"--sample-interval: expected seconds in (0, 3600], got "
                     f"{args.sample_interval:g}")
    if args.timeout <= 0 or args.retries < 0 or args.retry_delay < 0:
        raise _Usage("--timeout must be > 0, --retries and --retry-delay >= 0")
    def say(msg: str) -> None:
        if not args.quiet:
            print(msg, file=sys.stderr)

    if period.clipped:
        say(f"meter: period ends in the future; metering complete hours up to {_fmt(period.end)}")
    if args.price_only:
        if args.no_price:
            raise _Usage("--price-only and --no-price: expected one of them, not both")
        return _price_only(args, period, say)

    from metering.selector import DEFAULT_SELECTOR, Selector, SelectorError
    try:
        selector = DEFAULT_SELECTOR if args.selector is None else Selector.parse(args.selector)
    except SelectorError as exc:
        raise _Usage(f"--selector: {exc}") from None
    source: Source
    if args.prometheus:
        token = (_read_secret(args.bearer_token_file, "bearer token")
                 if args.bearer_token_file else None)
        try:
            client = PromClient(args.prometheus, bearer_token=token, basic_auth=_basic_auth(args),
                                ca_file=args.ca_file, timeout=args.timeout,
                                retries=args.retries, backoff=args.retry_delay)
        except PromError as exc:
            raise _Fail(str(exc)) from None
        source = PrometheusSource(client, _limits(args), selector)
    else:
        try:
            source = OpenMetricsSource(args.openmetrics, period, selector)
        except OpenMetricsError as exc:
            raise _Fail(str(exc)) from None

    # Price before touching the database: a bad cost model should not cost an ingest run.
    model = None
    pricing: Any = None
    if not args.no_price:
        try:
            pricing = importlib.import_module("metering.pricing")
        except ImportError:
            say("meter: pricing is not available in this build; facts ingested only")
        else:
            from metering.costmodel import CostModelError, load_cost_model
            try:
                model = load_cost_model(args.cost_model)
            except CostModelError as exc:
                raise _Fail(str(exc)) from None

    try:
        con = connect(args.db)
    except DatabaseError as exc:
        raise _Fail(str(exc)) from None
    try:
        chunk = args.chunk or DEFAULT_CHUNK_HOURS
        progress = Progress(-(-period.hours // chunk), quiet=args.quiet)
        if isinstance(source, PrometheusSource) and args.verbose:
            source.planner.on_split = progress.message  # a store refused a query: say so
        say(f"meter: {period.label()} ({period.hours} h) from {source.name} into {args.db}")
        try:
            result = ingest(con, source, period, chunk, args.sample_interval, progress,
                            verbose=args.verbose, replace=args.replace,
                            resume=not args.no_resume)
        except IngestError as exc:
            raise _Fail(str(exc)) from None
        rows = ", ".join(f"{n} {t}" for t, n in result.rows.items())
        say(f"meter: {result.chunks} chunks, {result.queries} queries, {rows}")
        if isinstance(source, PrometheusSource):
            say(f"meter: queries: {source.planner.stats.describe()}")
        say(f"meter: coverage: {result.duplicate_seconds:,.0f} duplicate sample-seconds counted "
            f"once (overlapping series of one GPU, MIG instance or container), "
            f"{result.dropped:,} values dropped as not plausible (NaN, Inf, out of range)")
        if source.screened.foreign:
            say(f"meter: warning: series that look like GPU Ledger's but are outside --selector "
                f"{selector} were not metered: {source.screened.describe_foreign()}")
        if source.screened.unchecked:
            say(f"meter: {source.screened.unchecked}")
        if result.empty_hours:
            gaps = ", ".join(f"{_fmt(a)} .. {_fmt(b)}" for a, b in hour_ranges(result.empty_hours))
            say(f"meter: no device data for {len(result.empty_hours)} hour(s): {gaps}")
        if pricing is not None and model is not None:
            try:
                pricing.price_period(con, model, period.start, period.end,
                                     progress=Progress(0, quiet=args.quiet, stage="price",
                                                       unit="week"))
            except Exception as exc:  # any pricing failure: report it, no traceback
                raise _Fail(f"pricing {period.label()} failed: {type(exc).__name__}: {exc}"
                            ) from None
            say(f"meter: priced {period.label()}")
    finally:
        con.close()
        if isinstance(source, OpenMetricsSource):
            source.close()
    return 0


def _limits(args: argparse.Namespace) -> Limits:
    from metering.queryplan import DEFAULT_MAX_SAMPLES, DEFAULT_MAX_SERIES, Limits

    for name, value in (("--max-samples", args.max_samples), ("--max-series", args.max_series)):
        if value is not None and value < 1:
            raise _Usage(f"{name}: expected a whole number >= 1, got {value}")
    return Limits(max_samples=args.max_samples or DEFAULT_MAX_SAMPLES,
                  max_series=args.max_series or DEFAULT_MAX_SERIES)


def _price_only(args: argparse.Namespace, period: Period, say: Callable[[str], None]) -> int:
    """Price the period from the facts in --db: no Prometheus, no file, no ingest."""
    from metering.costmodel import CostModelError, load_cost_model
    from metering.db import DatabaseError, connect
    from metering.pricing import price_period
    from metering.progress import Progress

    try:
        model = load_cost_model(args.cost_model)
    except CostModelError as exc:
        raise _Fail(str(exc)) from None
    db = Path(args.db)
    if not db.exists():  # connect() would create an empty database with nothing to price
        raise _Fail(f"{db}: expected a metering database written by `gpu-ledger meter`, "
                    "found no file")
    try:
        con = connect(db)
    except DatabaseError as exc:
        raise _Fail(str(exc)) from None
    try:
        naive = [t.astimezone(UTC).replace(tzinfo=None) for t in (period.start, period.end)]
        row = con.execute("SELECT count(DISTINCT hour) FROM device_hours "
                          "WHERE hour >= ? AND hour < ?", naive).fetchone()
        hours = int(row[0]) if row else 0
        if hours == 0:
            raise _Fail(f"{db}: expected facts for {period.label()}, found none; ingest them "
                        f"first: gpu-ledger meter --prometheus URL {_period_args(args)} "
                        f"--db {db}")
        try:
            result = price_period(con, model, period.start, period.end,
                                  progress=Progress(0, quiet=args.quiet, stage="price",
                                                    unit="week"))
        except Exception as exc:  # any pricing failure: report it, no traceback
            raise _Fail(f"pricing {period.label()} failed: {type(exc).__name__}: {exc}"
                        ) from None
    finally:
        con.close()
    say(f"meter: priced {period.label()} from the facts in {db} with cost model "
        f"{model.hash[:12]}: {result.rows} charge rows, fleet cost {result.fleet_cost:.2f} "
        f"{result.currency}")
    if hours < period.hours:
        say(f"meter: {period.hours - hours} of {period.hours} hour(s) have no device facts "
            "(not ingested, or no data); they are not priced")
    return 0


def _period_args(args: argparse.Namespace) -> str:
    if args.month:
        return f"--month {args.month}"
    return f"--from {args.start} --to {args.end}"


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as exc:  # --help (0) or a usage error (2)
        return int(exc.code) if isinstance(exc.code, int) else 2
    try:
        return _run(args)
    except _Usage as exc:
        print(f"gpu-ledger meter: {exc}", file=sys.stderr)
        return 2
    except _Fail as exc:
        print(f"gpu-ledger meter: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("gpu-ledger meter: interrupted; committed chunks are kept and the same command "
              "resumes after them", file=sys.stderr)
        return 130
