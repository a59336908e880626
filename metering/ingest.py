"""Ingest orchestration: split the period into chunks, fetch each chunk's signals, write its
facts and coverage in one transaction, report progress.

A chunk is all-or-nothing: its hours are deleted and rewritten inside one transaction, so a
re-run gives the same rows and a failed fetch leaves the chunk as it was. Chunks already
committed stay when a later one fails.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from metering import guards
from metering.cluster import ClusterScope
from metering.db import transaction
from metering.errors import ExitCode, MeteringError
from metering.facts import (
    FAMILIES,
    SIGNALS,
    FactError,
    SignalSpec,
    build_signal,
    delete_hours,
    plausible,
    write_coverage,
    write_facts,
)
from metering.matrix import Matrix
from metering.period import Period, utc_naive
from metering.prefetch import Prefetcher
from metering.progress import Progress
from metering.promclient import PromClient, PromError
from metering.queryplan import Answered, Limits, Piece, QueryPlanner, Refusal, Sent, SignalSent
from metering.resume import Journal, RunSettings
from metering.selector import DEFAULT_SELECTOR, EXPORTER_SELECTOR, Screened, Selector

# Prometheus answers at most 11,000 points per series; a chunk of N hours asks for N+1.
MAX_CHUNK_HOURS = 10_000
DEFAULT_CHUNK_HOURS = 72  # a 31-day month: 11 chunks x 19 queries = 209 queries

# Ingest holds a chunk's points (one per series, signal and hour) as Arrow tables and in
# DuckDB while it writes the chunk's facts: its peak memory is a base plus a cost per point.
# Measured with bench/scale.py (docs/performance.md, "Ingest memory"): 0.18 MiB per GPU at
# 72-hour chunks over a ~0.4 GiB base, i.e. ~135 bytes per point of the planner's estimate
# (nodes x PRIOR_SERIES_PER_NODE series per signal, every signal, every hour).
INGEST_BASE_BYTES = 400 << 20
INGEST_BYTES_PER_POINT = 135
# What a chunk may cost by default: the whole path's target is 4 GB (issue 17); a container
# memory limit below it (cgroup) lowers it to 3/4 of that limit.
DEFAULT_INGEST_BUDGET = 3 << 30
# Chunk lengths the automatic choice picks from: a small change of fleet size rarely changes
# the pick, so an interrupted run is resumed by a rerun (the chunk length is part of a run's
# settings, metering/resume.py).
CHUNK_LADDER = (72, 48, 24, 12, 6, 3, 2, 1)
# Answers sent ahead of the one being decoded (metering.prefetch): enough to keep the store
# busy, few enough that their bodies stay small beside a chunk's facts.
PREFETCH_ANSWERS = 2


@dataclass(frozen=True)
class ChunkChoice:
    """The chunk length picked for a period from the planner's estimate of its series."""

    hours: int
    series: int  # estimated series per hour, over every signal
    peak_bytes: int  # estimated peak memory of ingest with chunks of `hours`
    budget_bytes: int

    def describe(self) -> str:
        gib = 1 << 30
        return (f"chunks of {self.hours} h (automatic: ~{self.series:,} series per hour "
                f"estimated, peak ~{self.peak_bytes / gib:.1f} GiB within a "
                f"{self.budget_bytes / gib:.1f} GiB budget; --chunk HOURS overrides)")


def choose_chunk(series: int, budget: int) -> ChunkChoice:
    """The longest chunk of CHUNK_LADDER whose estimated peak fits `budget` (the shortest
    when none does)."""
    def peak(hours: int) -> int:
        return INGEST_BASE_BYTES + INGEST_BYTES_PER_POINT * series * hours

    hours = next((h for h in CHUNK_LADDER if peak(h) <= budget), CHUNK_LADDER[-1])
    return ChunkChoice(hours, series, peak(hours), budget)


def memory_budget(cgroup: Path = Path("/sys/fs/cgroup")) -> int:
    """DEFAULT_INGEST_BUDGET, or 3/4 of the container's memory limit where that is lower
    (cgroup v2 memory.max, v1 memory.limit_in_bytes)."""
    for f in (cgroup / "memory.max", cgroup / "memory" / "memory.limit_in_bytes"):
        try:
            text = f.read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            return min(DEFAULT_INGEST_BUDGET, int(text) * 3 // 4)
    return DEFAULT_INGEST_BUDGET


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

    def fetch(self, chunk: Period) -> dict[str, pa.Table]: ...

    def prefetching(self, chunks: Sequence[Period]) -> AbstractContextManager[None]:
        """A context in which `fetch` is called for `chunks`, in order: the source may read
        ahead."""

    def close(self) -> None:
        """Release what the source holds (connections, parsed samples); idempotent."""


class PrometheusSource:
    """One range query per signal per chunk (step 1h): the query count depends on hours and
    families only; every series comes back in the same answer."""

    def __init__(self, client: PromClient, limits: Limits | None = None,
                 selector: Selector = DEFAULT_SELECTOR) -> None:
        self.client = client
        self.name = client.url
        self.selector = selector  # only these series are metered
        # Splits each signal's chunk query by node shard and time to fit the store's limits.
        self.planner = QueryPlanner(client, limits, selector=selector.promql())
        self._window: str | None = None
        self.screened = Screened()
        self._stream: Prefetcher[Sent | ChunkSent] | None = None
        self._queries = 0

    def settle_selector(self, period: Period) -> str | None:
        """With the default selector, decide whether series without a job label may be
        metered: only for a period in which the store scraped nothing (no `up` series), i.e.
        history backfilled with promtool, perhaps before the store began scraping. Where it
        scraped, a job-less series may be a scrape's (honor_labels) and the default narrows to
        the exporter's job (EXPORTER_SELECTOR). Returns what it decided, to say."""
        if self.selector is not DEFAULT_SELECTOR:  # a selector given, even the same text
            return None
        jobs: set[str] = set()
        try:
            jobs.update(self.client.label_values("job", ["up"], period.start.timestamp(),
                                                 period.end.timestamp()))
        except PromError as exc:  # cannot tell: the exporter's job, named, is the safe side
            jobs.add(f"unknown: {exc}")
        if not jobs:
            return None
        self.selector = EXPORTER_SELECTOR
        self.planner.selector = EXPORTER_SELECTOR.promql()
        shown = ", ".join(sorted(jobs)[:3]) + (", ..." if len(jobs) > 3 else "")
        return (f"this store scraped in the period (jobs {shown}): only series of job "
                "gpu-ledger-exporter are metered, not series without a job label (--selector "
                "names another job; docs/metering.md, \"Whose series are metered\")")

    def choose_chunk(self, period: Period, budget: int) -> ChunkChoice | None:
        """The chunk length for `period` from the planner's series estimate (one label-values
        lookup); None where the store cannot list nodes."""
        series = self.planner.series_estimate(period)
        return None if series is None else choose_chunk(series, budget)

    @property
    def dropped(self) -> int:
        """Points whose value was not plausible (not a finite number, out of range)."""
        return sum(self.screened.dropped.values())

    @property
    def queries(self) -> int:
        """Queries sent for the chunks fetched so far (not those prefetched beyond them)."""
        return self._queries

    def close(self) -> None:
        """Nothing to release: each query opens and closes its connection."""

    def _points(self, m: Matrix, spec: SignalSpec, chunk: Period
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(series index, time, value) of the answer's points whose value is plausible. A point
        whose value is not ("abc", null, NaN, Inf, out of the family's range) is dropped, and
        counted against its hour when that hour is in the chunk."""
        sid, ts, vs = m.sid, m.t, m.v
        ok = plausible(spec, vs) & np.isfinite(ts)
        if not ok.all():
            first, last = int(chunk.start.timestamp()), int(chunk.end.timestamp())
            for t in ts[~ok & np.isfinite(ts)].tolist():
                hour = int(t) - 3600  # evaluation at T covers the hour before it
                if first <= hour < last:
                    self.screened.drop(hour)
            sid, ts, vs = sid[ok], ts[ok], vs[ok]
        return sid, ts, vs

    def _check_foreign(self, chunk: Period) -> None:
        """List the series of metered families outside the selector (an index lookup per
        chunk): they are not metered, and the run names who publishes them."""
        others = self.selector.complement()
        if not others or self.screened.unchecked:
            return
        families = "|".join(sorted(FAMILIES))
        match = [f'{{__name__=~"{families}",{m.promql()}}}' for m in others]
        try:
            found = self.client.series(match, chunk.start.timestamp() - 3600,
                                       chunk.end.timestamp())
        except PromError as exc:
            self.screened.unchecked = f"series outside the selector not listed ({exc})"
            return
        for labels in found:
            family = labels.pop("__name__", "")
            self.screened.saw_foreign(family, labels)

    def window(self) -> str:
        """Range selector covering exactly (T-1h, T]. Prometheus 3 range windows are left-open;
        Prometheus 2 includes both ends, so 1h minus a millisecond there (timestamps are ms)."""
        if self._window is None:
            major = self.client.major_version()
            self._window = "1h" if major is not None and major >= 3 else "3599999ms"
        return self._window

    def prefetching(self, chunks: Sequence[Period]) -> AbstractContextManager[None]:
        """While in this context, the queries of `chunks` (in that order, which `fetch` must
        follow) are sent from a thread while earlier answers are decoded and written: the
        store and ingest work at the same time."""
        return self._prefetching(list(chunks))

    @contextmanager
    def _prefetching(self, chunks: list[Period]) -> Iterator[None]:
        if self._stream is not None:
            raise RuntimeError("PrometheusSource: already prefetching")
        self._stream = Prefetcher(self._send(chunks), depth=PREFETCH_ANSWERS)
        try:
            yield
        finally:
            self._stream.close()
            self._stream = None

    def _send(self, chunks: list[Period]) -> Generator[Sent | ChunkSent, None, None]:
        """Every query of the chunks, chunk by chunk and signal by signal (the producer)."""
        window = self.window()
        for chunk in chunks:
            before = self.client.queries
            self._check_foreign(chunk)
            for spec in SIGNALS:
                yield from self.planner.send(spec, window, chunk)
            yield ChunkSent(chunk, self.client.queries - before)

    def fetch(self, chunk: Period) -> dict[str, pa.Table]:
        if self._stream is None:
            with self.prefetching([chunk]):
                return self.fetch(chunk)
        # Evaluation at T covers hour T-1h: T = start covers the hour before the chunk, which
        # the energy counter difference needs.
        out: dict[str, pa.Table] = {}
        parts: list[tuple[Piece, Matrix]] = []
        for sent in self._stream:
            if isinstance(sent, Answered):
                parts.append((sent.piece, self.planner.decode(sent)))
            elif isinstance(sent, Refusal):
                if self.planner.on_split:
                    self.planner.on_split(sent.message)
            elif isinstance(sent, SignalSent):
                m, spec, parts = sent.assemble(parts), sent.spec, []
                if len(m):
                    sid, ts, values = self._points(m, spec, chunk)
                    out[spec.name] = build_signal(spec, m.labels, sid,
                                                  ts.astype(np.int64) - 3600, values, m.keys)
            else:
                if sent.chunk != chunk:
                    raise RuntimeError(f"fetch({chunk.label()}) out of the prefetched order "
                                       f"({sent.chunk.label()})")
                self._queries += sent.queries
                return out
        raise RuntimeError(f"fetch({chunk.label()}): not among the prefetched chunks")


@dataclass(frozen=True)
class ChunkSent:
    """Every query of a chunk was answered; `queries` were sent for it."""

    chunk: Period
    queries: int


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
    dropped: int = 0  # values dropped as not plausible (NaN, Inf, not a number, out of range)
    clusters: set[str] = field(default_factory=set)  # clusters whose hours were replaced
    # The run's journal, for a caller that finishes it after pricing (ingest(finish=False)).
    journal: Journal | None = field(default=None, repr=False)


def ingest(con: Any, source: Source, period: Period, chunk_hours: int = DEFAULT_CHUNK_HOURS,
           sample_interval: float | None = None, progress: Progress | None = None,
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
            try:
                signals = source.fetch(chunk)
            except PromError as exc:
                raise IngestError(f"{where}: {exc}; nothing written for this chunk"
                                  + (f", {i - 1} earlier chunk(s) kept" if i > 1 else ""),
                                  exc.code) from None
            start, end = chunk.naive()
            try:
                first = int(chunk.start.timestamp())
                dropped = {utc_naive(datetime.fromtimestamp(h, UTC)): n for h, n in
                           source.screened.dropped_in(first, int(chunk.end.timestamp())).items()}
                with transaction(con):
                    counts = write_facts(con, signals, start, end, sample_interval, clusters)
                    shrunk = counts.shrunk()
                    if shrunk and not replace:
                        raise guards.refuse(shrunk, _named(counts.clusters))
                    if counts.total == 0 and not seen:
                        raise _Empty  # nothing seen yet: maybe a source without GPU series
                    result.empty_hours += write_coverage(
                        con, start, end, source.name, _now(), counts.clusters,
                        duplicates=counts.duplicates, dropped=dropped)
                    journal.record(con, chunk, counts.clusters)
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
        delete_hours(con, start, end, names)
        result.empty_hours += write_coverage(con, start, end, source, _now(), names,
                                             dropped=dropped)
        journal.record(con, chunk, names)
