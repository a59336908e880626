"""Ingest orchestration: split the period into chunks, fetch each chunk's signals, write its
facts and coverage, report progress.

A chunk is all-or-nothing: its hours are deleted and rewritten in one transaction (a chunk in
node groups stages each group's facts apart first, metering.facts.STAGING, and swaps them in
in that transaction; where its hours hold nothing yet, its groups go in place, noted as
unfinished until that transaction: metering/unfinished.py), so a re-run gives the same rows
and a failed fetch leaves the chunk as it was. Chunks already committed stay when a later one
fails.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import Any, Protocol

from metering import guards, pricedhours, unfinished
from metering.chunking import DEFAULT_CHUNK_HOURS, MAX_CHUNK_HOURS
from metering.cluster import ClusterScope
from metering.db import transaction
from metering.errors import ExitCode, MeteringError
from metering.facts import (
    FactError,
    delete_hours,
    signal_table,
    write_coverage,
    write_facts,
)
from metering.matrix import Matrix
from metering.period import Period, utc_naive
from metering.progress import Progress
from metering.promclient import PromError
from metering.resume import Journal, RunSettings
from metering.selector import Screened, Selector
from metering.signals import SignalSpec
from metering.workers import ParallelSource


class IngestError(MeteringError):
    """A chunk could not be ingested; earlier chunks are committed, this one wrote nothing.
    `code` is that of the cause (source, data, usage)."""


class Source(Protocol):
    """Where samples come from (Prometheus, an OpenMetrics file): hourly signals per chunk."""

    name: str  # recorded in coverage.source
    selector: Selector  # only these series are metered
    screened: Screened  # values dropped and foreign series seen, for the run's coverage

    @property
    def queries(self) -> int: ...

    def fetch(self, chunk: Period) -> Iterator[Sequence[tuple[SignalSpec, Matrix]]]:
        """The chunk's signals (and the hour before it: energy needs it) in node groups
        (disjoint sets of series, each read when the one before is written), one decoded
        (spec, matrix) pair per signal with series, points at the start of their hour."""

    def prefetching(self, chunks: Sequence[Period]) -> AbstractContextManager[None]:
        """A context in which `fetch` is called for `chunks`, in order: the source may read
        ahead."""

    def grouped(self, chunk: Period) -> bool:
        """Whether `fetch` gives the chunk in several node groups (known once its first
        group is read): its facts are then staged group by group (metering.facts)."""

    def close(self) -> None:
        """Release what the source holds (connections, parsed samples); idempotent."""


@dataclass
class IngestResult:
    period: Period
    source: str
    chunks: int = 0
    queries: int = 0
    rows: dict[str, int] = field(default_factory=lambda: {
        "device_hours": 0, "mig_hours": 0, "allocation_hours": 0})
    empty_hours: list[datetime] = field(default_factory=list)  # UTC, naive
    resumed: int = 0  # chunks an interrupted run had committed, not metered again
    spacing: dict[str, float] = field(default_factory=dict)  # node -> seconds (last chunk)
    duplicate_seconds: float = 0.0  # sample-seconds de-duplication counted once, not twice+
    # (cluster, family) -> (hour, key)s its values were added up over more series than the
    # key's count family had (facts.FactCounts.more_series): twice the value where they
    # overlapped
    more_series: dict[tuple[str, str], int] = field(default_factory=dict)
    dropped: int = 0  # values dropped as not plausible (NaN, Inf, not a number, out of range)
    clusters: set[str] = field(default_factory=set)  # clusters whose hours were replaced
    # The run's journal, for a caller that finishes it after pricing (ingest(finish=False)).
    journal: Journal | None = field(default=None, repr=False)


def ingest(con: Any, source: Source | ParallelSource, period: Period,
           chunk_hours: int = DEFAULT_CHUNK_HOURS, sample_interval: float | None = None,
           progress: Progress | None = None,
           verbose: bool = False, replace: bool = False, resume: bool = True,
           clusters: ClusterScope | None = None, finish: bool = True) -> IngestResult:
    """Meter `period` from `source` chunk by chunk into the cluster(s) `clusters` names (one
    cluster, or the values of a cluster label; other clusters' hours are never touched). A
    chunk whose source yields fewer rows of any fact family (metering.guards) for a cluster
    than the ledger already holds for those hours is refused (nothing written) unless
    `replace`: a Prometheus past its retention, an empty source or one that lost a family's
    series never wipes a metered month. An earlier run of the same
    source, settings (selector, clusters, chunk length, sample interval) and period that
    stopped before its end is resumed after its committed chunks unless not `resume`
    (metering/resume.py). A source with no GPU series at all for the period is refused too:
    chunks without any fact are only written (as hours without data) once some chunk has
    facts. With `finish` False the run is left unfinished for the caller to finish once it
    has priced (`result.journal.finish`): a run killed before its pricing is resumed, and
    priced, by a rerun."""
    if not 1 <= chunk_hours <= MAX_CHUNK_HOURS:
        raise IngestError(f"--chunk: expected 1 to {MAX_CHUNK_HOURS} hours, got {chunk_hours}",
                          ExitCode.USAGE)
    chunks = list(period.chunks(chunk_hours))
    progress = progress or Progress(len(chunks), quiet=True)
    result = IngestResult(period, source.name)
    settings = RunSettings(source.selector, clusters or ClusterScope(), chunk_hours,
                           sample_interval)
    journal = Journal.begin(con, source.name, settings, period, resume)
    if journal.passed_over is not None:
        progress.message(f"meter: not resuming the interrupted run of this source and period: "
                         f"it used other settings ({journal.passed_over}); every chunk is "
                         "metered")
    result.journal = journal
    result.resumed = sum(1 for c in chunks if journal.committed(c))
    result.clusters.update(journal.clusters)  # priced even if every chunk was committed
    if journal.distrusted:
        progress.message(f"meter: {journal.distrusted} chunk(s) the interrupted run recorded "
                         "as committed are not in the ledger's facts; metering them again")
    if result.resumed and journal.resumed_from is not None:
        progress.total = len(chunks) - result.resumed
        began = journal.resumed_from.strftime("%Y-%m-%d %H:%M")
        progress.message(f"meter: resuming the run started {began} UTC: {result.resumed} of "
                         f"{len(chunks)} chunk(s) already "
                         "committed, not metered again (--no-resume meters them again)")
    # Empty chunks (with their dropped values per hour), written once the run has seen a fact.
    pending: list[tuple[Period, dict[datetime, int]]] = []
    seen = result.resumed > 0  # some chunk had a fact (an interrupted run's did)
    todo = [(i, c) for i, c in enumerate(chunks, 1)
            if not (result.resumed and journal.committed(c))]
    with source.prefetching([c for _, c in todo]):
        for i, chunk in todo:
            where = f"chunk {i}/{len(chunks)} ({chunk.label()})"
            before = source.queries
            start, end = chunk.naive()
            first = int(chunk.start.timestamp())
            dropped: dict[datetime, int] = {}
            try:
                # A chunk whose groups went in place is deleted again if it fails.
                with unfinished.recovered_on_error(con), transaction(con):
                    # Node groups are fetched as they are written: one group's signals at a
                    # time in memory (metering.queryplan, "node groups").
                    groups = _tables(source, chunk)
                    counts = write_facts(con, groups, start, end, sample_interval, clusters,
                                         staged=partial(source.grouped, chunk))
                    dropped = {utc_naive(datetime.fromtimestamp(h, UTC)): n for h, n in
                               source.screened.dropped_in(first,
                                                          int(chunk.end.timestamp())).items()}
                    shrunk = counts.shrunk()
                    if shrunk and not replace:
                        raise guards.refuse(shrunk, _named(counts.clusters))
                    if counts.total == 0 and not seen:
                        raise _Empty  # nothing seen yet: maybe a source without GPU series
                    result.empty_hours += write_coverage(
                        con, start, end, source.name, _now(), counts.clusters,
                        duplicates=counts.duplicates, dropped=dropped)
                    journal.record(con, chunk, counts.clusters)
            except PromError as exc:
                raise IngestError(f"{where}: {exc}; nothing written for this chunk"
                                  + (f", {i - 1} earlier chunk(s) kept" if i > 1 else ""),
                                  exc.code) from None
            except _Empty:
                pending.append((chunk, dropped))
            except (FactError, guards.ShrinkRefused) as exc:
                raise IngestError(f"{where}: {exc}; nothing written for this chunk", exc.code
                                  ) from None
            else:
                seen = True
                result.clusters.update(counts.clusters)
                for empty, lost in pending:  # the run has facts: the empty chunks before are gaps
                    try:
                        _write_empty(con, empty, source.name, result, journal, lost, clusters,
                                     replace)
                    except guards.ShrinkRefused as exc:
                        raise IngestError(f"chunk {empty.label()}: {exc}; nothing written for "
                                          "this chunk", exc.code) from None
                pending.clear()
            result.chunks += 1
            result.dropped += sum(dropped.values())
            for table in result.rows:
                result.rows[table] += getattr(counts, table)
            result.duplicate_seconds += counts.duplicate_seconds
            for cluster_family, n in counts.more_series.items():
                result.more_series[cluster_family] = \
                    result.more_series.get(cluster_family, 0) + n
            result.spacing = counts.spacing
            result.queries = source.queries
            if verbose:
                progress.message(f"meter: {where}: {source.queries - before} queries, "
                                 f"{counts.total} fact rows, sample interval "
                                 f"{describe_spacing(counts.spacing)}")
            progress.chunk_done(chunk.label(), f"{counts.total} fact rows", counts.total,
                                "fact rows")
    if pending:
        foreign = source.screened.describe_foreign()
        raise IngestError(
            f"{source.name}: no GPU Ledger series (gpu_up, gpu_container_allocation, ...) for "
            f"{period.label()}; nothing written (a Prometheus past its retention, the wrong "
            "URL or file, or an exporter not scraped?)"
            + (f"; outside the selector (--selector names the exporter's job): {foreign}"
               if foreign else ""), ExitCode.REFUSED)
    if finish:
        journal.finish(con)
    return result


def describe_spacing(spacing: dict[str, float], named: int = 5) -> str:
    """Nodes' sample intervals in one short line whatever the fleet size: each interval with
    its node count, naming the nodes of an interval only when few (a fleet with a node or two
    scraped differently shows which, not the thousands scraped alike)."""
    if not spacing:
        return "unknown (no samples)"
    by: dict[float, list[str]] = {}
    for node, seconds in spacing.items():
        by.setdefault(seconds, []).append(node)
    parts = []
    for seconds, nodes in sorted(by.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        nodes.sort()
        if len(nodes) <= named:
            parts.append(f"{seconds:g}s ({', '.join(nodes)})")
        else:
            parts.append(f"{seconds:g}s ({len(nodes):,} nodes)")
    return "; ".join(parts)


def _tables(source: Source | ParallelSource, chunk: Period) -> Iterator[dict[str, Any]]:
    """The chunk's signals as Arrow tables, node group by node group: decoded here, or by
    worker processes (meter --jobs, metering.workers)."""
    if isinstance(source, ParallelSource):
        return source.tables(chunk)
    return ({spec.name: signal_table(spec, m) for spec, m in group}
            for group in source.fetch(chunk))


class _Empty(Exception):
    """A chunk without any fact while the run has seen none: rolled back, decided later."""


def _now() -> datetime:
    return utc_naive(datetime.now(UTC))


def _named(clusters: Sequence[str]) -> bool:
    """Whether messages name the cluster: not for a ledger of cluster 'default' alone."""
    return len(clusters) > 1 or tuple(clusters) != ("default",)


def _write_empty(con: Any, chunk: Period, source: str, result: IngestResult,
                 journal: Journal, dropped: dict[datetime, int],
                 clusters: ClusterScope | None = None, replace: bool = False) -> None:
    """A chunk the source has no fact for, once the run has seen facts: hours without data
    for the run's clusters (the one named, or those the label gave in other chunks). Facts
    the ledger holds for those hours are a shrink like any other: refused unless `replace`."""
    start, end = chunk.naive()
    scope = clusters or ClusterScope()
    names = sorted(result.clusters) if scope.label is not None else [scope.name]
    if not replace:
        lost = guards.shrinks(guards.held(con, start, end, names), {})
        if lost:
            raise guards.refuse(lost, _named(names))
    with transaction(con):
        pricedhours.settle(con, start, end, names, delete_hours(con, start, end, names))
        result.empty_hours += write_coverage(con, start, end, source, _now(), names,
                                             dropped=dropped)
        journal.record(con, chunk, names)
