"""Metering as a library: `meter()` ingests a period from a source into a ledger and prices
it; `price()` (re-)prices facts already in a ledger; `report()` writes a month's chargeback
report from it (read-only). The CLI (`gpu-ledger meter`), the demo
and the benchmarks all call these; the CLI only turns options into arguments and errors into
exit statuses.

Every failure is a `metering.errors.MeteringError` with a one-line message and the exit
status it maps to. Sources are opened by the caller and closed by it (they follow the
`metering.ingest.Source` protocol, so `contextlib.closing(source)` works).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import duckdb

from metering import closes, heap, interrupt
from metering.chunking import DEFAULT_CHUNK_HOURS
from metering.cluster import ClusterScope
from metering.costmodel import CostModel
from metering.db import DatabaseError, LedgerLocked, capped, connect, out_of_memory
from metering.errors import MeteringError, RefusedError
from metering.facts import describe_more_series
from metering.ingest import IngestResult, Source, ingest
from metering.period import Month, Period, hour_ranges
from metering.pricing import PricingResult, price_period
from metering.progress import Progress
from metering.prometheus_source import PrometheusSource
from metering.recorded import RecordedMode
from metering.vmexport import RecordedRead
from metering.workers import ParallelSource

if TYPE_CHECKING:
    from metering.report.builder import Written
    from metering.report.waste import Settings

Say = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


@dataclass(frozen=True)
class MeterResult:
    ingest: IngestResult
    pricing: PricingResult | None  # None when metered without a cost model (ingest only)


# How often a run told to wait (--wait) tries the ledger's lock again.
LOCK_POLL_SECONDS = 0.5


def _connect_waiting(path: str | Path, wait: float, say: Say,
                     sleep: Callable[[float], None] = time.sleep) -> duckdb.DuckDBPyConnection:
    """`connect(path)`, trying again while another process holds the ledger, for up to
    `wait` seconds (0: refuse at once); says once that it waits."""
    deadline = time.monotonic() + wait
    waited = False
    while True:
        try:
            return connect(path, say=say)
        except LedgerLocked as exc:
            left = deadline - time.monotonic()
            if left <= 0:
                if waited:
                    raise LedgerLocked(exc.file, f"still in use by another process after "
                                       f"waiting {wait:g} s (--wait); nothing was written",
                                       exc.holder) from None
                raise
            if not waited:
                holder = f" (PID {exc.holder})" if exc.holder is not None else ""
                say(f"meter: {exc.file} is in use by another process{holder}; waiting up to "
                    f"{wait:g} s for it to finish")
                waited = True
            sleep(min(LOCK_POLL_SECONDS, left))


@contextmanager
def open_ledger(path: str | Path, *, create: bool = True, wait: float = 0.0,
                say: Say = _quiet) -> Iterator[duckdb.DuckDBPyConnection]:
    """The ledger at `path` opened for writing (created if `create`), closed afterwards. Held
    open, it is locked: a second writer gets `LedgerLocked` (exit 7), never a mixed ledger;
    with `wait` > 0 it first waits that many seconds for the lock, polling."""
    if not create and str(path) != ":memory:" and not Path(path).exists():
        raise DatabaseError(str(path), "expected a metering database written by "
                            "`gpu-ledger meter`, found no file")
    con = _connect_waiting(path, wait, say)
    try:
        with interrupt.watch(con):  # Ctrl-C stops the running query (metering.interrupt)
            yield con
    finally:
        con.close()


@dataclass(frozen=True)
class MeterSettings:
    """Everything `meter()` takes besides where (ledger), from what (source) and when
    (period). The defaults are the CLI's: ingest only, cluster `default`, resumable."""

    cost_model: CostModel | None = None  # None: ingest only, price later (`price()`)
    clusters: ClusterScope | None = None  # None: cluster `default`
    chunk_hours: int = DEFAULT_CHUNK_HOURS  # hours per range query and transaction
    sample_interval: float | None = None  # None: detected per node and chunk
    replace: bool = False  # overwrite hours whose facts would shrink (else exit 6)
    resume: bool = True  # take over an interrupted run's committed chunks
    wait: float = 0.0  # seconds to wait for a ledger another process holds (0: exit 7)
    # Hours of a closed month: post what changes as adjustments (else refused, exit 9).
    adjust_closed: bool = False
    # What the run says while it works.
    say: Say = _quiet
    progress: Progress | None = None
    price_progress: Progress | None = None
    verbose: bool = False
    # Worker processes fetching and decoding chunks for the one writer (metering.workers);
    # 1: fetched and decoded in this process. The CLI's default is the cores available.
    jobs: int = 1
    # Read the hourly recording rules where complete for a chunk (metering.recorded).
    recorded: RecordedMode = RecordedMode.AUTO
    # How they are read: VictoriaMetrics' /api/v1/export (metering.vmexport) or its native
    # form (metering.vmnative) where it is one.
    recorded_read: RecordedRead = RecordedRead.AUTO
    # DuckDB's cap while ingesting, in bytes (metering.chunking.duckdb_within: its share of
    # ingest's memory budget; never above its own cap). None: its own cap throughout.
    ingest_duckdb_bytes: int | None = None


def meter(ledger: str | Path, source: Source, period: Period,
          settings: MeterSettings = MeterSettings()) -> MeterResult:
    """Ingest `period` from `source` into `ledger` chunk by chunk (each chunk one
    transaction) as the cluster(s) `settings.clusters` names, then price the period of those
    clusters with `settings.cost_model` (all or nothing, metering.pricing; skipped when None).
    Killed at any point, a re-run of the same call gives the same ledger as an uninterrupted
    run: an interrupted run is resumed after its committed chunks (all are rewritten
    identically with `resume=False`) and pricing is redone. A ledger another process holds
    is waited for up to `settings.wait` seconds, then refused (`LedgerLocked`, exit 7)."""
    s = settings
    say, progress, verbose = s.say, s.progress, s.verbose
    with open_ledger(ledger, wait=s.wait, say=say) as con:
        _check_closed(con, period, s.adjust_closed, f"metering {period.label()}", say)
        say(f"meter: {period.label()} ({period.hours} h) from {source.name} into {ledger}")
        if isinstance(source, PrometheusSource):
            settled = source.settle_selector(period)  # the exporter's identity, not no job
            if settled:
                say(f"meter: {settled}")
        if progress is not None and verbose and isinstance(source, PrometheusSource):
            source.planner.on_split = progress.message  # a store refused a query: say so
        if isinstance(source, PrometheusSource):
            source.recorded.mode = s.recorded
            source.planner.recorded_read = s.recorded_read
            if progress is not None:  # recorded or raw, chunk by chunk
                source.on_recorded = progress.message
                source.planner.on_fallback = progress.message  # native reads, or not
        fetching: Source | ParallelSource = source
        if s.jobs > 1:
            if isinstance(source, PrometheusSource):
                source.window()  # asked once here, not by every worker
            fetching = ParallelSource(source, s.jobs)
        with capped(con, s.ingest_duckdb_bytes, f"{ledger}: metering"):
            result = ingest(con, fetching, period, s.chunk_hours, s.sample_interval,
                            progress, verbose=verbose, replace=s.replace, resume=s.resume,
                            clusters=s.clusters, finish=False)
        rows = ", ".join(f"{n} {t}" for t, n in result.rows.items())
        say(f"meter: {result.chunks} chunks, {result.queries} queries, {rows}")
        if isinstance(fetching, ParallelSource) and verbose:
            say(f"meter: {fetching.describe()}")
        if isinstance(source, PrometheusSource):
            if isinstance(fetching, ParallelSource):  # the workers planned the queries
                source.planner.stats = fetching.merged_stats()
            say(f"meter: queries: {source.planner.stats.describe()}")
        say(f"meter: coverage: {result.duplicate_seconds:,.0f} duplicate sample-seconds counted "
            f"once (overlapping series of one GPU, MIG instance or container), "
            f"{result.dropped:,} values dropped as not plausible (NaN, Inf, out of range)")
        more = describe_more_series(result.more_series)
        if more:
            say(f"meter: warning: {more}")
        if source.screened.foreign:
            say(f"meter: warning: series that look like GPU Ledger's but are outside "
                f"--selector {source.selector} were not metered: "
                f"{source.screened.describe_foreign()}")
        if source.screened.unchecked:
            say(f"meter: {source.screened.unchecked}")
        if result.empty_hours:
            gaps = ", ".join(r.label() for r in hour_ranges(result.empty_hours))
            say(f"meter: no device data for {len(result.empty_hours)} hour(s): {gaps}")
        priced = None
        if s.cost_model is not None:
            heap.trim()  # what ingest freed, before DuckDB's buffers grow to its cap
            priced = _price(con, period, s.cost_model, s.price_progress,
                            sorted(result.clusters), keep=True)
            kept = (f" ({priced.kept_hours} of its hours kept their charges: priced before "
                    "from the same facts with this cost model)" if priced.kept_hours else "")
            say(f"meter: priced {period.label()}{kept}")
            if priced.adjustment_lines:
                say(f"meter: posted {priced.adjustment_lines} adjustment line(s) for the "
                    "closed hours")
        assert result.journal is not None
        result.journal.finish(con)  # finished when priced: killed before, a rerun prices
        return MeterResult(result, priced)


def price(ledger: str | Path, period: Period, cost_model: CostModel,
          progress: Progress | None = None, cluster: str | None = None, wait: float = 0.0,
          say: Say = _quiet, adjust_closed: bool = False) -> PricingResult:
    """Rebuild the charges of `period` (of every cluster, or of `cluster` only) from the facts
    already in `ledger` (no source read, facts untouched), all or nothing. A ledger without
    device facts for the period is refused (exit 6) and never created; hours of a closed month
    are refused (exit 9) unless `adjust_closed`."""
    with open_ledger(ledger, create=False, wait=wait, say=say) as con:
        _check_closed(con, period, adjust_closed, f"pricing {period.label()}", say)
        start, end = period.naive()
        where, params = "", list[object]([start, end])
        if cluster is not None:
            where, params = " AND cluster = ?", [start, end, cluster]
        row = con.execute("SELECT count(*) FROM device_hours WHERE hour >= ? AND hour < ?"
                          + where, params).fetchone()
        if not row or not row[0]:
            scope = f" of cluster {cluster}" if cluster is not None else ""
            raise RefusedError(f"{ledger}: expected facts{scope} for {period.label()}, found "
                               "none; ingest them first")
        return _price(con, period, cost_model, progress,
                      [cluster] if cluster is not None else None)


def _check_closed(con: duckdb.DuckDBPyConnection, period: Period, adjust: bool, doing: str,
                  say: Say) -> None:
    """Refuse to touch a closed month's hours (exit 9) unless told to post adjustments."""
    months = closes.closed_in(con, period)
    if not months:
        return
    posted = closes.posting_month(con, months[-1])
    if not adjust:
        raise closes.refuse(months, posted, doing)
    say(f"meter: {', '.join(map(str, months))} closed: its bill stays; what changes in its "
        f"hours is posted as adjustments to {posted}")


def _price(con: duckdb.DuckDBPyConnection, period: Period, cost_model: CostModel,
           progress: Progress | None, clusters: list[str] | None = None,
           keep: bool = False) -> PricingResult:
    try:
        return price_period(con, cost_model, period.start, period.end, progress=progress,
                            clusters=clusters, freeze=closes.Freeze.of(con, period), keep=keep)
    except MeteringError:
        raise
    except duckdb.OutOfMemoryException:
        raise out_of_memory(f"pricing {period.label()}") from None
    except Exception as exc:  # any pricing failure: one line, no traceback; nothing written
        raise MeteringError(f"pricing {period.label()} failed: {type(exc).__name__}: {exc}"
                            ) from None


def report(ledger: str | Path, month: Month, out: str | Path, *,
           formats: list[str] | None = None, cost_model_path: str | None = None,
           cluster: str | None = None, top: int | None = None,
           settings: Settings | None = None) -> Written:
    """Write `month`'s chargeback report from `ledger` (a metering database or a `ledger
    export` directory, read-only) into `out`: CSV, Parquet, Markdown and HTML by default
    (`formats`, `focus` on request), all files or none. The month must be metered and priced
    (`RefusedError`, exit 6, naming the command to run otherwise)."""
    from metering.report.builder import write_report  # renderers load only when reporting
    from metering.report.model import DEFAULT_TOP_PODS

    return write_report(ledger, month, out, formats=formats, cost_model_path=cost_model_path,
                        top=DEFAULT_TOP_PODS if top is None else top, settings=settings,
                        cluster=cluster)
