"""Signals from a Prometheus-compatible store: range queries (step 1h) planned to fit the
store's limits (metering.queryplan), sent ahead from a thread (metering.prefetch) and decoded
in columns (metering.matrix); each signal of a chunk read from its recorded hourly series
where the store has them for the whole chunk, else raw (metering.recorded). `fetch(chunk)`
yields each signal of the chunk as one decoded
(spec, matrix) pair, its points at hour starts, implausible values already dropped: ingest
never sees a query, an answer or a split.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Generator, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass

import numpy as np

from metering.chunking import (
    INGEST_BYTES_PER_POINT,
    ChunkChoice,
    choose_chunk,
    points_within,
)
from metering.matrix import Labels, Matrix
from metering.period import Month, Period
from metering.prefetch import Prefetcher
from metering.promclient import PromClient, PromError
from metering.queryplan import Answered, Limits, Piece, QueryPlanner, Refusal, Sent, SignalSent
from metering.recorded import Choice, RecordedMissing, RecordedMode, RecordedProbe, Sampled
from metering.selector import DEFAULT_SELECTOR, EXPORTER_SELECTOR, Screened, Selector
from metering.signals import FAMILIES, HOUR_S, SIGNALS, SignalSpec, plausible

# Answers sent ahead of the one being decoded (metering.prefetch): enough to keep the store
# busy while a node group's facts are written (two answers ahead, it idled through them: the
# 80,000-GPU day's ingest waited 15 s of 54 on it, 8 s of 43 with eight, at load ~2), few
# enough that their bodies stay small beside a node group's points: at most PREFETCH_SHARE of
# the bytes the planner lets a group's points take.
PREFETCH_ANSWERS = 16
PREFETCH_SHARE = 1 / 16


class PrometheusSource:
    """One range query per signal per chunk (step 1h): the query count depends on hours and
    families only; every series comes back in the same answer."""

    def __init__(self, client: PromClient, limits: Limits | None = None,
                 selector: Selector = DEFAULT_SELECTOR,
                 recorded: RecordedMode = RecordedMode.AUTO) -> None:
        self.client = client
        self.name = client.url
        self.selector = selector  # only these series are metered
        # Splits each signal's chunk query by node shard and time to fit the store's limits.
        self.planner = QueryPlanner(client, limits, selector=selector.promql())
        self._left_open: bool | None = None  # range selectors exclude their start (Prometheus 3)
        self.screened = Screened()
        self._stream: Prefetcher[Sent | GroupSent | ChunkSent | Chosen] | None = None
        self._queries = 0
        self.recorded = RecordedProbe(client, recorded)
        self.on_recorded: Callable[[str], None] | None = None  # told each chunk's choice

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
        lookup), and the memory its node groups keep within; None where the store cannot
        list nodes."""
        self.planner.memory_points = float(points_within(budget))
        series = self.planner.series_estimate(period)
        if series is None:
            return None
        if self._month_natively(period):
            return choose_chunk(series, budget, period.hours,
                                "the month in one chunk: every signal's recorded hourly "
                                "series read natively, each series' month once")
        return choose_chunk(series, budget)

    def _month_natively(self, period: Period) -> bool:
        """Whether `period` is a calendar month whose every signal is read from recorded
        series natively (VictoriaMetrics' /api/v1/export/native, metering.vmnative). A
        native answer holds whole blocks, and a recorded series' block holds its month: one
        chunk of the month, in node groups, has each block sent once, where chunks of the
        default length would each be sent it again, or read JSON lines, which cost the store
        2.3x the CPU (docs/performance.md, "The month in one chunk from the recorded
        series")."""
        if self.recorded.mode is RecordedMode.NEVER or \
                period != Month.of(period.start).period():
            return False
        try:
            choice = self.recorded.choose(period, self.planner.nodes(period),
                                         self._sampled(period))
            return len(choice.recorded) == len(SIGNALS) and self.planner.exports() \
                and self.planner.native()
        except (RecordedMissing, PromError):
            return False  # the first chunk says why

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

    def grouped(self, chunk: Period) -> bool:
        """What the query planner decided when it sent the chunk's first group."""
        return chunk in self.planner.grouped

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
        return "1h" if self._range_left_open() else "3599999ms"

    def span(self, seconds: int) -> str:
        """Range selector covering exactly (T-seconds, T], as `window` does the hour."""
        return f"{seconds}s" if self._range_left_open() else f"{seconds * 1000 - 1}ms"

    def _range_left_open(self) -> bool:
        if self._left_open is None:
            major = self.client.major_version()
            self._left_open = major is not None and major >= 3
        return self._left_open

    def _sampled(self, chunk: Period) -> Sampled:
        """Of some nodes, those with samples the chunk's raw reads take: (first - 1h, last]."""
        seconds = int((chunk.end - chunk.start).total_seconds()) + HOUR_S
        return functools.partial(self.planner.nodes_sampled, chunk, span=self.span(seconds))

    def prefetching(self, chunks: Sequence[Period]) -> AbstractContextManager[None]:
        """While in this context, the queries of `chunks` (in that order, which `fetch` must
        follow) are sent from a thread while earlier answers are decoded and written: the
        store and ingest work at the same time."""
        return self._prefetching(list(chunks))

    @contextmanager
    def _prefetching(self, chunks: list[Period]) -> Iterator[None]:
        if self._stream is not None:
            raise RuntimeError("PrometheusSource: already prefetching")
        room = int(self.planner.memory_points * INGEST_BYTES_PER_POINT * PREFETCH_SHARE)
        self._stream = Prefetcher(self._send(chunks), depth=PREFETCH_ANSWERS, max_bytes=room,
                                  size=_body_bytes)
        try:
            yield
        finally:
            self._stream.close()
            self._stream = None

    def _send(self, chunks: list[Period]
              ) -> Generator[Sent | GroupSent | ChunkSent | Chosen, None, None]:
        """Every query of the chunks, chunk by chunk, node group by node group and signal by
        signal (the producer)."""
        window = self.window()
        self.planner.plan_period(chunks)
        for chunk in chunks:
            before = self.client.queries
            choice, probes = self.begin_chunk(chunk)
            before += probes  # not the signals' queries: said apart
            yield Chosen(chunk, choice)
            yield from self._send_groups(chunk, self.planner.groups(chunk), choice.recorded,
                                         window, before)

    def begin_chunk(self, chunk: Period) -> tuple[Choice, int]:
        """What is done once per chunk before its signals are asked: series outside the
        selector listed, node names listed, recorded or raw chosen (and the probes that took,
        counted apart from the signals' queries)."""
        self._check_foreign(chunk)
        nodes = self.planner.nodes(chunk)
        probing = self.client.queries
        choice = self.recorded.choose(chunk, nodes, self._sampled(chunk))
        probes = self.client.queries - probing
        self.planner.stats.probes += probes
        self.planner.stats.recorded_partly += 0 < len(choice.recorded) < len(SIGNALS)
        return choice, probes

    def _send_groups(self, chunk: Period, groups: Iterator[tuple[str, ...] | None],
                     recorded: frozenset[str], window: str, before: int
                     ) -> Generator[Sent | GroupSent | ChunkSent, None, None]:
        for group in groups:
            for spec in SIGNALS:
                yield from self.planner.send(spec, window, chunk, group,
                                             recorded=spec.name in recorded)
            yield GroupSent()
        yield ChunkSent(chunk, self.client.queries - before)

    def fetch_part(self, chunk: Period, part: tuple[str, ...] | None,
                   nodes: tuple[str, ...] | None, recorded: frozenset[str]
                   ) -> Iterator[list[tuple[SignalSpec, Matrix]]]:
        """As `fetch`, for a worker process (metering.workers): only the series of the node
        slice `part` (None: every series), whose chunk was begun (`begin_chunk`) by the
        parent, which listed `nodes` and chose `recorded`."""
        if self._stream is not None:
            raise RuntimeError("PrometheusSource: already prefetching")
        self.planner.know_nodes(chunk, nodes)
        room = int(self.planner.memory_points * INGEST_BYTES_PER_POINT * PREFETCH_SHARE)
        groups = self.planner.groups(chunk, part)
        self._stream = Prefetcher(
            self._send_groups(chunk, groups, recorded, self.window(), self.client.queries),
            depth=PREFETCH_ANSWERS, max_bytes=room, size=_body_bytes)
        try:
            yield from self.fetch(chunk)
        finally:
            self._stream.close()
            self._stream = None

    def fetch(self, chunk: Period) -> Iterator[list[tuple[SignalSpec, Matrix]]]:
        """The chunk's signals in node groups (metering.queryplan: each group's points fit
        the memory budget), one (spec, matrix) pair per signal with series, points at the
        start of the hour they cover; the next group is decoded when the caller asks for it.
        Evaluation at T covers hour T-1h: T = start covers the hour before the chunk, which
        the energy counter difference needs."""
        if self._stream is None:
            with self.prefetching([chunk]):
                yield from self.fetch(chunk)
            return
        parts: list[tuple[Piece, Matrix]] = []
        group: list[tuple[SignalSpec, Matrix]] = []
        seen: Labels = {}  # a series' labels are decoded once per group, not per signal
        for sent in self._stream:
            if isinstance(sent, Answered):
                parts.append((sent.piece, self.planner.decode(sent, seen)))
            elif isinstance(sent, Refusal):
                if self.planner.on_split:
                    self.planner.on_split(sent.message)
            elif isinstance(sent, SignalSent):
                m, spec, parts = sent.assemble(parts), sent.spec, []
                if len(m):
                    sid, ts, values = self._points(m, spec, chunk)
                    group.append((spec, Matrix(m.labels, m.keys, sid, ts - HOUR_S, values)))
            elif isinstance(sent, GroupSent):
                out, group, seen = group, [], {}
                yield out
            elif isinstance(sent, Chosen):
                self.say_choice(sent.chunk, sent.choice)
            else:
                if sent.chunk != chunk:
                    raise RuntimeError(f"fetch({chunk.label()}) out of the prefetched order "
                                       f"({sent.chunk.label()})")
                self._queries += sent.queries
                return
        raise RuntimeError(f"fetch({chunk.label()}): not among the prefetched chunks")


    def say_choice(self, chunk: Period, choice: Choice) -> None:
        """Tell `on_recorded` how each chunk is read, unless the store has no recorded series
        at all or they are not wanted (then the run says what it said before the rules)."""
        label = f"meter: {chunk.label()}"
        if self.on_recorded is None or choice.none_deployed:
            return
        if len(choice.recorded) == len(SIGNALS):
            self.on_recorded(f"{label}: recorded hourly series")
        elif choice.recorded:
            self.on_recorded(f"{label}: recorded hourly series for {len(choice.recorded)} "
                             f"signal(s), raw for the others: {choice.why}")
        else:
            self.on_recorded(f"{label}: raw series: {choice.why}")


def _body_bytes(sent: Sent | GroupSent | ChunkSent | Chosen) -> int:
    """What a prefetched item holds in memory until decoded: an answer's body."""
    return len(sent.answer.body) if isinstance(sent, Answered) else 0


@dataclass(frozen=True)
class Chosen:
    """Which signals of the chunk are read from recorded series (metering.recorded)."""

    chunk: Period
    choice: Choice


@dataclass(frozen=True)
class GroupSent:
    """Every query of a node group of the chunk was answered."""


@dataclass(frozen=True)
class ChunkSent:
    """Every query of a chunk was answered; `queries` were sent for it."""

    chunk: Period
    queries: int


