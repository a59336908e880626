"""Query planning: keep every range query inside the limits a PromQL store enforces.

A store refuses a query that would touch too much: Prometheus `--query.max-samples` (points
held in memory, 50M by default in 2.42), VictoriaMetrics `-search.maxSamplesPerQuery` (raw
samples read, 1e9), `-search.maxUniqueTimeseries` (series selected, 300k) and
`-search.maxQueryLen` (16 KiB of PromQL; defaults of 1.79, `victoria-metrics -help`). One
query per signal per chunk stops fitting somewhere between a thousand and ten thousand nodes,
so each signal's chunk query is split, before it is sent, so that every piece is within all
three (`Limits`; `meter --max-samples/--max-series/--max-query-bytes` where a store is set
lower):

- by series, into node shards: the chunk's node names (one label-values call per chunk, an
  index lookup in both stores) are packed, in name order, into shards whose estimated cost
  fits the budget, each queried with `node=~"a|b|..."` (the first shard also matches series
  without a node label, so every series is in exactly one shard);
- by time, into consecutive runs of evaluation hours, when even one node's series do not fit.

The PromQL length is known exactly (the node regex is counted as sent); series and samples are
estimates from what earlier answers showed (series per node and family, samples per
series-hour from the count signals), starting from conservative priors: a family no answer has
shown yet is planned within PROBE_SHARE of the series limit, so priors several times too low
still fit. A store that still
answers with a limit error gets the failing query split in two (nodes first, then hours) and
retried, and that signal's later plans keep under half the refused query's estimate. The
answers of a signal's pieces are merged per series, so the facts do not depend on how a chunk
was split.
"""

from __future__ import annotations

import functools
import re
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

import numpy as np

from metering import matrix, vmexport, vmnative
from metering.chunking import DEFAULT_INGEST_BUDGET, INGEST_BYTES_PER_POINT, points_within
from metering.matrix import Matrix
from metering.period import Month, Period, utc_aware
from metering.promclient import Answer, PromClient, PromError
from metering.signals import HOUR_S, RECORDED_PREFIX, RECORDED_SUFFIX, SIGNALS, SignalSpec
from metering.vmexport import EXPORT_PATH, RecordedRead
from metering.vmnative import HOURS_BYTES_PER_POINT, NATIVE_PATH

# Prometheus's default --query.max-samples: the smallest default among the stores we target.
DEFAULT_MAX_SAMPLES = 50_000_000
DEFAULT_MAX_SERIES = 300_000  # VictoriaMetrics -search.maxUniqueTimeseries default
# VictoriaMetrics -search.maxQueryLen (16 KiB in 1.79): the whole PromQL of a query. Prometheus
# has no such limit, but this keeps its POST bodies small too.
DEFAULT_MAX_QUERY_BYTES = 16_384
# Room left in a query for what the planner does not count (percent-encoding is not counted by
# the store: it checks the decoded text).
QUERY_SLACK_BYTES = 64
# Before any answer: a node has 8 series per family, sampled every 15 s (both on the high
# side, so a first plan errs towards smaller queries).
PRIOR_SERIES_PER_NODE = 8.0
PRIOR_SAMPLES_PER_HOUR = 240.0
SHARD_LABEL = "node"
DEFAULT_MEMORY_POINTS = float(points_within(DEFAULT_INGEST_BUDGET))
# Of memory_points, for a node group planned before any answer; of the series limit, for a
# family before any answer.
PROBE_SHARE = 0.25

# What stores say when a query exceeds a limit (the HTTP status is 422 for both, but so is any
# other execution error, so the message is what tells them apart).
_LIMIT_ERROR = re.compile(
    r"too many samples|maxSamplesPerQuery|maxSamplesPerSeries|maxUniqueTimeseries|"
    r"matching timeseries exceeds|maxPointsPerTimeseries|too many points|maxQueryLen|"
    r"query timed out|maxQueryDuration|max-fetched|exceeded the maximum|limit exceeded",
    re.I)
_REGEX_META = re.compile(r"([\\.+*?()|\[\]{}^$])")


class QueryLimitError(PromError):
    """A single node-hour of one signal exceeds the store's limit: it cannot be split."""


def is_limit_error(exc: PromError) -> bool:
    return _LIMIT_ERROR.search(str(exc)) is not None


@dataclass(frozen=True)
class Limits:
    """What one query may cost. `max_samples` counts the larger of raw samples read and
    points held (a `[1h:10s]` subquery holds 360 points per series-hour)."""

    max_samples: int = DEFAULT_MAX_SAMPLES
    max_series: int = DEFAULT_MAX_SERIES
    max_query_bytes: int = DEFAULT_MAX_QUERY_BYTES  # the whole PromQL text


@dataclass(frozen=True)
class Piece:
    """One range query of a signal: a node shard (None: every series) and evaluation hours
    first..last (unix seconds, inclusive, step 1h)."""

    nodes: tuple[str, ...] | None
    first: int
    last: int

    @property
    def steps(self) -> int:
        return (self.last - self.first) // HOUR_S + 1

    def matcher(self) -> str:
        if self.nodes is None:
            return ""
        return f'{SHARD_LABEL}=~"{"|".join(_alternative(n) for n in self.nodes)}"'


@dataclass
class SplitStats:
    """How queries were split, for the run's output."""

    signal_queries: int = 0  # signal x chunk pairs planned
    queries: int = 0  # range queries answered
    max_shards: int = 1
    max_time_pieces: int = 1
    refused: int = 0  # queries the store refused with a limit error (then split)
    lookups: int = 0  # label-values calls
    nodes: int = 0  # most nodes of one chunk (the last may have none: a period's tail)
    no_discovery: str = ""  # why nodes could not be listed (then no node shards)
    groups: int = 0  # node groups of chunks too large to hold at once (0: none needed)
    max_group_nodes: int = 0
    metricsql: bool = False  # last-sample times from MetricsQL tlast_over_time
    # signal-chunks read from the recorded hourly series (metering.recorded), and chunks of
    # which only some signals were
    recorded: int = 0
    recorded_partly: int = 0
    probes: int = 0  # range queries over the recorded series' markers (not in `queries`)
    exported: int = 0  # recorded signal-chunks read by /api/v1/export (metering.vmexport)
    native: int = 0  # of those, by /api/v1/export/native (metering.vmnative)
    period_reads: int = 0  # native requests of a signal's whole period (QueryPlanner.period)
    native_too_large: int = 0  # native answers over the memory budget, read as JSON lines
    native_fallback: str = ""  # why native reads stopped (then JSON lines)
    # signal-chunks whose export the store refused even for one node-hour: range queries
    export_refused: int = 0

    def describe(self) -> str:
        if self.max_shards == 1 and self.max_time_pieces == 1 and not self.refused:
            split = "no split needed (one query per signal and chunk)"
        else:
            split = (f"split into up to {self.max_shards} node shard(s) x "
                     f"{self.max_time_pieces} time range(s) per signal and chunk")
        extra = f"; {self.refused} query(ies) refused by the store's limits and split again" \
            if self.refused else ""
        why = f"; {self.no_discovery}" if self.no_discovery else ""
        why += (f"; {self.groups} node group(s) of up to {self.max_group_nodes:,} nodes, "
                "written one after another to bound memory" if self.groups else "")
        why += "; last-sample times with MetricsQL tlast_over_time" if self.metricsql else ""
        if self.recorded:
            why += (f"; {self.recorded} of {self.signal_queries} signal-chunks from the "
                    "recorded hourly series")
            why += (f" ({self.recorded_partly} chunk(s) partly recorded, their other "
                    "signals raw)" if self.recorded_partly else "")
            why += f", checked by {self.probes} probe query(ies)"
            why += (f"; {self.exported} of them read by VictoriaMetrics' {EXPORT_PATH}"
                    if self.exported else "")
            why += (f" ({self.native} as {NATIVE_PATH}"
                    + (f", from {self.period_reads} request(s) of a signal's whole period"
                       if self.period_reads else "")
                    + (f"; {self.native_too_large} over the memory budget read as JSON lines"
                       if self.native_too_large else "") + ")" if self.native else "")
            why += (f"; {self.export_refused} whose export the store refused even for one "
                    "node-hour, read by range queries" if self.export_refused else "")
        return (f"{self.queries} range queries for {self.signal_queries} signal-chunks over "
                f"up to {self.nodes} node(s) per chunk: {split}{extra}{why}")


@dataclass(frozen=True)
class Answered:
    """A piece's answer as the store sent it, not decoded yet."""

    spec: SignalSpec
    piece: Piece
    promql: str  # the query, or the series selector of an export
    answer: Answer
    exported: bool = False  # an /api/v1/export answer (metering.vmexport), not a matrix
    native: bool = False  # of /api/v1/export/native (metering.vmnative)
    # hours read apart from the whole months of a node group (_month_pieces): their series
    # are those of a few hours, not the chunk's, so they are not learned from
    learn: bool = True


@dataclass(frozen=True)
class Refusal:
    """The store refused a piece as over a limit; it was split and sent again."""

    message: str


@dataclass(frozen=True)
class SignalSent:
    """Every piece of a signal's chunk query was answered."""

    spec: SignalSpec
    first: int  # evaluation hours first..last (unix seconds)
    last: int

    def assemble(self, parts: Sequence[tuple[Piece, Matrix]]) -> Matrix:
        """The decoded pieces as one matrix: node shards one after another, time pieces
        merged per series, so the facts do not depend on how the chunk was split."""
        if all(p.first == self.first and p.last == self.last for p, _ in parts):
            return matrix.concat([m for _, m in parts])
        return matrix.merge([m for _, m in parts])


Sent = Answered | Refusal | SignalSent


@dataclass
class _Learned:
    # family -> node -> series seen in the last answer
    series: dict[str, dict[str, int]] = field(default_factory=dict)
    rate: dict[str, float] = field(default_factory=dict)  # node -> samples per series-hour
    # signal -> budget learned from refusals: half the estimate of the last refused query
    budget: dict[str, float] = field(default_factory=dict)
    # What a node no answer has shown is estimated at, kept as answers are learned: the
    # planner asks for every node of a group and signal (10,000 nodes x 20 signals), and
    # recomputing these over every node per question made planning quadratic (5.1 of the
    # 80,000-GPU day's 57.5 ingest CPU-s).
    mean_series: dict[str, float] = field(default_factory=dict)  # family -> mean per node
    max_rate: float | None = None  # the largest of `rate`

    def learn(self, family: str, counted: Mapping[str, int], rates: Mapping[str, float]
              ) -> None:
        """An answer's series per node of `family` and samples per series-hour per node."""
        per_node = self.series.setdefault(family, {})
        per_node.update(counted)
        self.mean_series[family] = sum(per_node.values()) / len(per_node) if per_node \
            else PRIOR_SERIES_PER_NODE
        for node, value in rates.items():
            if value > self.rate.get(node, 0.0):
                self.rate[node] = value
        if self.rate:
            self.max_rate = max(self.rate.values())


class QueryPlanner:
    """Plans and sends the range queries of a signal over a chunk (`send`) and decodes their
    answers (`decode`): ingest runs the two in different threads."""

    def __init__(self, client: PromClient, limits: Limits | None = None,
                 on_split: Callable[[str], None] | None = None, selector: str = "",
                 memory_points: float = DEFAULT_MEMORY_POINTS) -> None:
        self.client = client
        self.selector = selector  # matchers every query carries (metering.selector)
        self.limits = limits or Limits()
        self.stats = SplitStats()
        self.on_split = on_split  # told about each split forced by a store error
        # told why recorded series are read as JSON lines, not native (once a run)
        self.on_fallback: Callable[[str], None] | None = None
        # Points of answers ingest may hold at once (a chunk's node group; node groups above)
        self.memory_points = memory_points
        self._learned = _Learned()
        self._nodes: tuple[str, ...] | None = None
        self._chunk: Period | None = None
        self._metricsql: bool | None = None
        self.recorded_read = RecordedRead.AUTO
        self._export: bool | None = None
        self._native: bool | None = None
        self._native_check = False  # the next native read is checked against JSON lines
        # Evaluation hours of every chunk of the run (`plan_period`): a recorded signal
        # read natively is asked for all of them at once, where that fits the memory budget
        # (its blocks hold the whole period anyway: per chunk, the store would send and the
        # client decode them once per chunk); answers and their hourly points kept until the
        # period's last chunk is decoded.
        self.period: tuple[int, int] | None = None
        self._period: dict[tuple[str, str], Answer] = {}
        # per kept answer (id): its hourly points, decoded once
        self._period_hours: dict[int, vmnative.Hours] = {}
        # answers dropped because their points did not fit (id: the answer while it lives):
        # the chunks sent with one before that read JSON lines
        self._period_dropped: dict[int, weakref.ref[Answer]] = {}
        self._period_bytes = 0  # of the answers and hourly points kept
        # Signals whose period did not fit: their chunks read JSON lines (the store filters
        # them to the hours), not native answers of whole blocks again
        self._period_off: set[str] = set()
        self._lock = threading.Lock()  # _learned: sent from one thread, decoded in another
        # Chunks fetched in node groups, noted before the first group is sent (ingest stages
        # their facts group by group: metering.facts)
        self.grouped: set[Period] = set()

    def metricsql(self) -> bool:
        """Whether the store speaks MetricsQL (VictoriaMetrics): then `tlast_over_time` gives
        a series' last sample time directly, instead of a `[1h:10s]` subquery that costs the
        store 360 evaluations per series-hour. Probed once with an instant query."""
        if self._metricsql is None:
            try:
                self.client.query(f'tlast_over_time(gpu_up{{{SHARD_LABEL}="-"}}[1m])')
                self._metricsql = True
            except PromError:
                self._metricsql = False
            self.stats.metricsql = self._metricsql
        return self._metricsql

    def exports(self) -> bool:
        """Whether recorded series are read by /api/v1/export (metering.vmexport): with
        `recorded_read` auto, where the store is VictoriaMetrics, told once by MetricsQL
        (only VictoriaMetrics speaks it) and its export endpoint answering an empty selection
        in its format; Prometheus has no such endpoint (404)."""
        if self.recorded_read is RecordedRead.QUERY_RANGE:
            return False
        if self._export is None:
            why = "" if self.metricsql() else "no MetricsQL"
            if not why:
                nothing = f'{RECORDED_PREFIX}up_count{RECORDED_SUFFIX}{{{SHARD_LABEL}="-"}}'
                try:
                    answer = self.client.export_answer(EXPORT_PATH,
                                                       vmexport.params(nothing, 0, 0))
                    if answer.status != 200:
                        why = f"HTTP {answer.status}"
                    else:
                        vmexport.read(answer.body, 0, 0)
                except (PromError, vmexport.BadExport) as exc:
                    why = str(exc)
            self._export = not why
            if why and self.recorded_read in (RecordedRead.EXPORT, RecordedRead.NATIVE):
                raise PromError(f"{self.client.url}: --recorded-read {self.recorded_read}: no "
                                f"VictoriaMetrics {EXPORT_PATH} ({why})")
        return self._export

    def native(self) -> bool:
        """Whether recorded series read by export are read by /api/v1/export/native
        (metering.vmnative): ~7x less store CPU than JSON lines, but VictoriaMetrics' internal
        encoding. With `recorded_read` auto only on a version the decoder was verified
        against (vm_app_version on /metrics); with native on any, the run's first read then
        decoded both ways and compared bit for bit. Otherwise, and from the first answer the
        decoder does not know, JSON lines, said once (`on_fallback`)."""
        mode = self.recorded_read
        if mode not in (RecordedRead.AUTO, RecordedRead.NATIVE) or not self.exports():
            return False
        with self._lock:
            if self._native is None:
                version = self._store_version()
                self._native = version in vmnative.VERIFIED_VERSIONS or \
                    mode is RecordedRead.NATIVE
                self._native_check = self._native and version not in vmnative.VERIFIED_VERSIONS
                if not self._native:
                    known = ", ".join(sorted(vmnative.VERIFIED_VERSIONS))
                    self._fall_back(f"{self.client.url}: VictoriaMetrics version "
                                    f"{version or 'unreported'} is not one {NATIVE_PATH} was "
                                    f"verified on ({known})")
            return self._native

    def plan_period(self, chunks: Sequence[Period]) -> None:
        """The run's chunks, before their queries are sent: a recorded signal read natively
        is asked once for all their evaluation hours (`period`)."""
        if chunks:
            self.period = (int(min(c.start for c in chunks).timestamp()),
                           int(max(c.end for c in chunks).timestamp()))

    def _period_answer(self, spec: SignalSpec, selector: str, chunk: Period,
                       nodes: tuple[str, ...] | None) -> Answer | None:
        """The native answer of the signal's whole period (`period`), asked once; None where
        there is no period beyond the chunk, nodes are unknown, or the store refuses it (then
        per chunk), or where the answer does not fit the memory budget (then the signal's
        chunks read JSON lines: `reads_native`)."""
        if self.period is None or nodes is None:
            return None
        pf, pl = self.period
        first, last = int(chunk.start.timestamp()), int(chunk.end.timestamp())
        if not pf <= first <= last <= pl or (pf, pl) == (first, last) or \
                (first - pf) % HOUR_S:
            return None
        key = (spec.name, selector)
        with self._lock:
            cached = self._period.get(key)
            if cached is not None:
                return cached
        answer = self.client.export_answer(NATIVE_PATH, vmexport.params(selector, pf, pl))
        if answer.status != 200:
            return None  # e.g. over a series limit: the chunk's own request says
        self.stats.period_reads += 1
        with self._lock:
            if self._period_bytes + len(answer.body) > self._native_bytes() / 4:
                self._period_off.add(spec.name)  # JSON lines: the store filters those
                return None
            self._period[key] = answer
            self._period_bytes += len(answer.body)
        return answer

    def reads_native(self, spec: SignalSpec) -> bool:
        """Whether the signal's recorded series are read natively (`native`), unless its
        period did not fit the memory budget: a native answer of one chunk holds the same
        whole blocks as the period's, so the chunks then read JSON lines."""
        if not self.native():
            return False
        with self._lock:
            return spec.name not in self._period_off

    def _native_bytes(self) -> float:
        """Bytes native answers and the hourly points decoded from them may take: the memory
        budget."""
        return self._group_points() * INGEST_BYTES_PER_POINT

    def max_native_rows(self) -> int:
        """Samples one native answer may hold to be decoded (its blocks: whole months, not
        the hours asked for; ~100 bytes a sample while decoding): more reads JSON lines."""
        return int(self._native_bytes() / 2 / INGEST_BYTES_PER_POINT)

    def _store_version(self) -> str | None:
        try:
            page = self.client.page("/metrics")
        except PromError:
            return None
        if page.status != 200:
            return None
        return vmnative.store_version(page.body.decode("utf-8", "replace"))

    def _fall_back(self, why: str) -> None:
        """Native reads off for the run (under the lock), said once."""
        self._native = False
        if not self.stats.native_fallback:
            self.stats.native_fallback = why
            if self.on_fallback is not None:
                self.on_fallback(f"{why}: recorded series read as JSON lines ({EXPORT_PATH})")

    # --- nodes ----------------------------------------------------------------------------

    def nodes(self, chunk: Period) -> tuple[str, ...] | None:
        """Node names with series of any metered family in the chunk (and the hour before);
        None where the store cannot list them (then only time splits are possible)."""
        if self._chunk == chunk:
            return self._nodes
        self._chunk = chunk
        families = sorted({s.family for s in SIGNALS})
        try:
            values = self._node_values(families, int(chunk.start.timestamp()) - HOUR_S,
                                       int(chunk.end.timestamp()))
        except PromError as exc:
            self.stats.no_discovery = f"node names not listed ({exc})"
            self._nodes = None
            return None
        self._nodes = tuple(sorted({v for v in values if v}))
        self.stats.nodes = max(self.stats.nodes, len(self._nodes))
        return self._nodes

    def _node_values(self, families: Sequence[str], start: int, end: int) -> set[str]:
        """Values of the node label on the families' series in [start, end]. A store that
        refuses the lookup as too big (VictoriaMetrics counts every matching series against
        -search.maxUniqueTimeseries, 300k by default: a 40,000-GPU fleet's families over a
        chunk are more) is asked one family at a time, then for halves of the time range;
        the union is the same set of names."""
        match = [self._with_selector(f'__name__=~"{"|".join(families)}"', "")]
        try:
            values = self.client.label_values(SHARD_LABEL, match, start, end)
        except PromError as exc:
            if not is_limit_error(exc):
                raise
            if len(families) > 1:
                return set().union(*(self._node_values([f], start, end) for f in families))
            if end - start > HOUR_S:
                mid = start + (end - start) // HOUR_S // 2 * HOUR_S
                return self._node_values(families, start, mid) | \
                    self._node_values(families, mid, end)
            raise
        self.stats.lookups += 1
        return set(values)

    def nodes_sampled(self, chunk: Period, nodes: Sequence[str], span: str) -> set[str]:
        """Those of `nodes` with a sample of a metered family that the chunk's raw reads take:
        within `span` before its last evaluation. Exact where `nodes` (label lookups) is not:
        VictoriaMetrics looks label values up by day and Prometheus by block, so a node gone
        at midnight is listed for the next day too. Counts only these nodes' samples, family
        by family (Prometheus 2 refuses one range over several names: two families' series
        differ by name only), in batches of names that fit the length limit, and stops at
        the first batch with any (one such node sends the chunk raw; a cluster without the
        rules is not counted whole for it)."""
        families = sorted({s.family for s in SIGNALS})
        room = (self.limits.max_query_bytes - 1024) // len(families)
        found: set[str] = set()
        for batch in _by_length(sorted({n for n in nodes if n}), room):
            matcher = Piece(batch, 0, 0).matcher()
            counts = []
            for family in families:
                selector = self._with_selector(f'__name__="{family}"', matcher)
                counts.append(f"count by ({SHARD_LABEL}) (count_over_time({selector}[{span}]))")
            for series in self.client.query(" or ".join(counts), chunk.end):
                metric = series.get("metric") if isinstance(series, dict) else None
                if isinstance(metric, dict):
                    found.add(str(metric.get(SHARD_LABEL, "")))
            if found & set(batch):
                break
        return found & set(nodes)

    # --- node groups ----------------------------------------------------------------------
    # A chunk's answers are held in memory until its facts are written. Rather than shorter
    # chunks (each of which costs the store a scan of every series' index and the hour
    # before; issue 27: six 12-h chunks cost it 2.8x one 72-h chunk), a chunk whose points
    # would not fit `memory_points` is fetched and written in node groups: every signal of
    # the first group's nodes, then the next group's, each group's tables let go before the
    # next is read. A group's size comes from the series per node the answers so far held
    # (the priors before the first), so it is planned when its queries are sent.

    def groups(self, chunk: Period, within: tuple[str, ...] | None = None
               ) -> Iterator[tuple[str, ...] | None]:
        """The chunk's node groups, in node name order: None (every series) when the whole
        chunk fits; else tuples of node names, the first with "" (series without a node).
        `within`: only these nodes (a worker's slice, `slices`; with "", series without a
        node too), given whole where they fit."""
        nodes = self.nodes(chunk) if within is None else tuple(n for n in within if n)
        steps = chunk.hours + 1
        if not nodes or self._fit(nodes, steps):  # unknown nodes: nothing to group them by
            yield within
            return
        self.grouped.add(chunk)
        rest = list(nodes)
        head: tuple[str, ...] = ("",) if within is None or "" in within else ()
        while rest:
            taken: list[str] = []
            points = 0.0
            with self._lock:
                limit = self._group_points()
                for node in rest:
                    cost = self._points_per_step(node) * steps
                    if taken and points + cost > limit:
                        break
                    taken.append(node)
                    points += cost
            del rest[:len(taken)]
            self.stats.groups += 1
            self.stats.max_group_nodes = max(self.stats.max_group_nodes, len(taken))
            yield (*head, *taken)
            head = ()

    def slices(self, chunk: Period, least: int, most_points: float
               ) -> list[tuple[str, ...]] | None:
        """The chunk's nodes cut, in name order, into contiguous slices for worker processes
        (metering.workers), at least `least` (fewer where there are fewer nodes) and each of
        at most `most_points` estimated points where that takes more; the first with ""
        (series without a node). None: one slice of every series (nodes not listed, or a
        single slice)."""
        nodes = self.nodes(chunk)
        if not nodes:
            return None
        steps = chunk.hours + 1
        with self._lock:
            cost = [self._points_per_step(n) * steps for n in nodes]
        total = sum(cost)
        count = min(len(nodes), max(least, -int(-total // max(most_points, 1.0))))
        if count <= 1:
            return None
        out: list[tuple[str, ...]] = []
        taken: list[str] = [""]
        points = 0.0
        for i, (node, c) in enumerate(zip(nodes, cost, strict=True)):
            # Cut where the running total passes the next share, leaving a node for each
            # slice still to come.
            if any(taken) and (
                    points + c / 2 > total * (len(out) + 1) / count
                    or len(nodes) - i <= count - len(out) - 1):
                out.append(tuple(taken))
                taken = []
            taken.append(node)
            points += c
        out.append(tuple(taken))
        return out

    def fits(self, chunk: Period) -> bool:
        """Whether the chunk's series fit one node group (`groups` gives None): its facts
        need not be staged group by group, however many processes fetch it."""
        return self._fit(self.nodes(chunk), chunk.hours + 1)

    def _fit(self, nodes: Sequence[str] | None, steps: int) -> bool:
        """Whether `steps` evaluation hours of the nodes' series fit one node group (no or
        unknown nodes: nothing to group by)."""
        if not nodes:
            return True
        with self._lock:
            return sum(self._points_per_step(n) for n in nodes) * steps <= self._group_points()

    def know_nodes(self, chunk: Period, nodes: tuple[str, ...] | None) -> None:
        """The chunk's node names as another process's planner listed them (`nodes`)."""
        self._chunk, self._nodes = chunk, nodes

    def learned_series(self) -> dict[str, dict[str, int]]:
        """Series per node and family that answers showed (to pass to another planner)."""
        with self._lock:
            return {f: dict(per) for f, per in self._learned.series.items()}

    def learn_series(self, series: Mapping[str, Mapping[str, int]]) -> None:
        """Series per node and family that another planner's answers showed."""
        with self._lock:
            for family, per_node in series.items():
                self._learned.learn(family, per_node, {})

    def _group_points(self) -> float:
        """Points a group may hold: `memory_points`, or a PROBE_SHARE of it while no answer
        has told what nodes hold (the priors can be far below: pods churn, shares multiply
        series), so the first group cannot overrun the budget and sizes the next ones."""
        return self.memory_points * (1.0 if self._learned.series else PROBE_SHARE)

    def _points_per_step(self, node: str) -> float:
        """Points one evaluation hour of the node's series holds over every signal."""
        return sum(self._series(s.family, node) for s in SIGNALS)

    # --- estimates ------------------------------------------------------------------------

    def series_estimate(self, period: Period) -> int | None:
        """Series per evaluation hour over every signal, before any answer: the nodes with
        series in `period` x PRIOR_SERIES_PER_NODE per signal. None where nodes cannot be
        listed."""
        nodes = self.nodes(period)
        if nodes is None:
            return None
        return max(1, len(nodes)) * int(PRIOR_SERIES_PER_NODE) * len(SIGNALS)

    def _series(self, family: str, node: str) -> float:
        seen = self._learned.series.get(family)
        if seen is None:
            return PRIOR_SERIES_PER_NODE
        if node in seen:
            return float(seen[node])
        return self._learned.mean_series.get(family, PRIOR_SERIES_PER_NODE)

    def _per_step(self, spec: SignalSpec, node: str, recorded: bool = False) -> float:
        """Samples one series costs per evaluation hour (one where recorded)."""
        if recorded:
            return 1.0
        rate = self._learned.rate.get(node)
        if rate is None:
            top = self._learned.max_rate
            rate = top if top is not None else PRIOR_SAMPLES_PER_HOUR
        if spec.func == "tlast" and not self._metricsql:  # a [1h:10s] subquery holds
            # 360 points per series-hour
            rate = max(rate, HOUR_S / 10)
        return rate

    # --- planning -------------------------------------------------------------------------

    def plan(self, spec: SignalSpec, first: int, last: int,
             nodes: Sequence[str] | None, group: tuple[str, ...] | None = None,
             recorded: bool = False, room: int | None = None) -> list[Piece]:
        """Pieces covering every series (of the node group, where given: its `nodes`) and
        every evaluation hour first..last once. `room`: bytes of PromQL left for the node
        matcher (default: the length limit less 1 KiB)."""
        steps = (last - first) // HOUR_S + 1
        if not nodes:  # unknown (or no) nodes: one query; a limit error splits it by time
            return [Piece(group, first, last)]
        room = self.limits.max_query_bytes - 1024 if room is None else room
        budget = self._budget(spec)
        max_series = self._max_series(spec.family)
        series = {n: self._series(spec.family, n) for n in nodes}
        weight = {n: series[n] * self._per_step(spec, n, recorded) for n in nodes}
        total_series = sum(series.values())
        # A group's node names are in its matcher: a whole group is one query only if they fit
        # (a 5,188-node group was 57 KB of PromQL, refused three times over per signal).
        if (sum(weight.values()) * steps <= budget and total_series <= max_series
                and len(Piece(group, first, last).matcher()) <= room):
            return [Piece(group, first, last)]
        heaviest = max(weight.values())
        hours = max(1, min(steps, int(budget // max(heaviest, 1.0))))
        shards = self._pack(nodes, weight, series, hours, budget, max_series, room,
                            empty=group is None or "" in group)
        pieces: list[Piece] = []
        for shard in shards:
            for a, b in _time_ranges(first, last, hours):
                pieces.append(Piece(shard, a, b))
        return pieces

    def _budget(self, spec: SignalSpec) -> float:
        return min(float(self.limits.max_samples),
                   self._learned.budget.get(spec.name, float("inf")))

    def _max_series(self, family: str) -> float:
        """The series limit, or PROBE_SHARE of it for a family no answer has shown yet."""
        learned = family in self._learned.series
        return self.limits.max_series * (1.0 if learned else PROBE_SHARE)

    def _cost(self, spec: SignalSpec, piece: Piece, nodes: Sequence[str]) -> float:
        members = nodes if piece.nodes is None else [n for n in piece.nodes if n]
        return sum(self._series(spec.family, n) * self._per_step(spec, n)
                   for n in members) * piece.steps

    def _pack(self, nodes: Sequence[str], weight: dict[str, float], series: dict[str, float],
              hours: int, budget: float, max_series: float, room: int,
              empty: bool = True) -> list[tuple[str, ...]]:
        """Nodes in name order into shards within the sample, series and length budgets
        (`room`: bytes of the matcher, exactly as Piece.matcher writes it). With `empty`, the
        first shard also matches an empty node label (series without one)."""
        shards: list[tuple[str, ...]] = []
        cur: list[str] = [""] if empty else []
        cost = n_series = 0.0
        base = len(Piece((), 0, 0).matcher())
        length = base
        for node in nodes:
            w, s, ln = weight[node] * hours, series[node], len(_alternative(node)) + 1
            if len(cur) > (1 if not shards and empty else 0) and (
                    cost + w > budget
                    or n_series + s > max_series
                    or length + ln > room):
                shards.append(tuple(cur))
                cur, cost, n_series, length = [], 0.0, 0.0, base
            cur.append(node)
            cost, n_series, length = cost + w, n_series + s, length + ln
        if cur:
            shards.append(tuple(cur))
        return shards

    # --- running --------------------------------------------------------------------------
    # Sending (planning, the store's answers, splitting refused queries) and decoding (the
    # answers into matrices, learning from them) are separate steps, so that ingest can send
    # the next queries while it decodes and writes earlier answers (metering.prefetch). The
    # estimates both steps share are guarded by a lock.

    def send(self, spec: SignalSpec, window: str, chunk: Period,
             group: tuple[str, ...] | None = None, recorded: bool = False) -> Iterator[Sent]:
        """The signal's pieces over the chunk's evaluation hours (chunk start to end) for the
        node group (None: every series), each answer as the store sent it; a piece the store
        refuses as over a limit is split in two and sent again (`Refusal` says so). Ends with
        a `SignalSent`. `recorded`: from the signal's recorded hourly series (the same points,
        metering.recorded)."""
        first, last = int(chunk.start.timestamp()), int(chunk.end.timestamp())
        metricsql = self.metricsql()
        nodes = self.nodes(chunk) if group is None else tuple(n for n in group if n)
        # Bytes of PromQL the node matcher may take: the limit less the query around it.
        bare = self._promql(spec, window, self._with_selector("", f'{SHARD_LABEL}=~""'),
                            recorded, metricsql)
        room = self.limits.max_query_bytes - len(bare) - QUERY_SLACK_BYTES
        with self._lock:
            pieces = self.plan(spec, first, last, nodes, group, recorded,
                               room + len(f'{SHARD_LABEL}=~""'))
        self.stats.signal_queries += 1
        self.stats.recorded += recorded
        exported = recorded and self.exports()
        reads_native = exported and self.reads_native(spec)
        native = reads_native and group is None
        # A node group reads natively only its whole calendar months (_month_pieces): a
        # native answer holds whole blocks, and a block lies in one month's partition.
        months = reads_native and group is not None
        if months:
            split = [q for p in pieces for q in _month_pieces(p)]
            months = any(map(_whole_month, split))
            pieces = split if months else pieces
        native_planned = int(native or months)
        self.stats.exported += exported
        self.stats.native += native_planned
        answered: list[Piece] = []
        todo = list(reversed(pieces))
        while todo:
            piece = todo.pop()
            match = self._with_selector("", piece.matcher())
            promql = (spec.recorded_selector(match) if exported
                      else self._promql(spec, window, match, recorded, metricsql))
            try:
                answer = None
                if native and group is None and piece == Piece(None, first, last):
                    answer = self._period_answer(spec, promql, chunk, nodes)
                    if answer is None and not self.reads_native(spec):  # did not fit
                        native = False
                        self.stats.native -= native_planned
                        native_planned = 0
                piece_native = native or (months and _whole_month(piece))
                path = NATIVE_PATH if piece_native else EXPORT_PATH
                if answer is not None:
                    pass
                elif exported:
                    answer = self.client.export_answer(
                        path, vmexport.params(promql, piece.first, piece.last))
                    if answer.status != 200:
                        raise PromError(f"{self.client.url}: {path} of {promql!r}: "
                                        f"HTTP {answer.status}: {_first_line(answer.body)}")
                else:
                    answer = self.client.query_range_answer(promql, piece.first, piece.last,
                                                            HOUR_S)
                    if answer.status != 200:
                        self.client.matrix(answer, promql)  # raises the store's error
            except PromError as exc:
                if not is_limit_error(exc):
                    raise
                halves = self._halve(piece, nodes)
                if halves is None and exported:
                    # VictoriaMetrics orders its index filters by measured cost, so a small
                    # -search.maxExportSeries can trip on the name alone, whatever the node
                    # matcher: the rest of this signal-chunk is read by range queries over
                    # the same recorded series (the same points, another limit).
                    exported = native = months = False
                    self.stats.exported -= 1
                    self.stats.native -= native_planned
                    self.stats.export_refused += 1
                    yield Refusal(f"{spec.name}: the store refused its export even for "
                                  f"{_describe(piece)}; reading the recorded series by "
                                  "range queries instead")
                    todo.append(piece)
                    continue
                if halves is None:
                    raise QueryLimitError(
                        f"{exc} (one node-hour of {spec.name} is over the store's limit: "
                        "raise the limit)") from None
                self.stats.refused += 1
                with self._lock:
                    cost = self._cost(spec, piece, nodes or ())
                    if cost > 0:
                        self._learned.budget[spec.name] = min(self._budget(spec), cost / 2)
                yield Refusal(f"{spec.name}: the store refused a query ({_describe(piece)}); "
                              "splitting it in two")
                todo.extend(reversed(halves))
                continue
            self.stats.queries += 1
            answered.append(piece)
            yield Answered(spec, piece, promql, answer, exported, piece_native,
                           learn=not months or piece_native)
        shards = {p.nodes for p in answered}
        self.stats.max_shards = max(self.stats.max_shards, len(shards))
        self.stats.max_time_pieces = max(
            [self.stats.max_time_pieces,
             *(sum(1 for p in answered if p.nodes == s) for s in shards)])
        yield SignalSent(spec, first, last)

    def decode(self, sent: Answered, seen: matrix.Labels | None = None) -> Matrix:
        """One answer in columns (metering.matrix's scanner), or by Python's json where it is
        not a well-formed matrix (then its problem is a PromError naming the query); learned
        from. `seen`: label maps decoded before (metering.matrix.read, vmexport.read)."""
        m = self._decode(sent, seen)
        if sent.learn:
            with self._lock:
                self._learn(sent.spec, m)
        return m

    def _decode(self, sent: Answered, seen: matrix.Labels | None) -> Matrix:
        answer = sent.answer
        if sent.exported:
            if sent.native:
                m = self._from_native(sent, seen)
                if m is not None:
                    return m
                answer = self._json_export(sent)
            try:
                return vmexport.read(answer.body, sent.piece.first, sent.piece.last, seen)
            except vmexport.BadExport as exc:
                raise PromError(f"{self.client.url}: {EXPORT_PATH} of {sent.promql!r}: {exc}"
                                ) from None
        if answer.status == 200:
            m = matrix.read(answer.body, seen)
            if m is not None:
                return m
        result = self.client.matrix(answer, sent.promql)
        try:
            return matrix.from_result(result)
        except matrix.NotAMatrix as exc:
            raise PromError(f"{self.client.url}: answer to {sent.promql!r} is not {exc}"
                            ) from None

    def _from_native(self, sent: Answered, seen: matrix.Labels | None) -> Matrix | None:
        """A native answer decoded; None where native reads are off or this one is not
        understood (then off for the run)."""
        first, last = sent.piece.first, sent.piece.last
        with self._lock:
            on, check = self._native, self._native_check
        if not on:
            return None
        try:
            m = self._native_points(sent, seen)
            if check:
                same = _same_points(m, vmexport.read(self._json_export(sent).body, first, last))
                if not same:
                    raise vmnative.Unreadable("its points differ from the JSON lines' (an "
                                              "unverified version)")
                with self._lock:
                    self._native_check = False
            return m
        except vmnative.TooLarge:
            self.stats.native_too_large += 1
            return None  # this read's JSON lines: the store filters them to the hours
        except (vmnative.Unreadable, vmexport.BadExport) as exc:
            with self._lock:
                self._fall_back(f"{self.client.url}: {NATIVE_PATH} of {sent.promql!r}: {exc}")
            return None

    def _native_points(self, sent: Answered, seen: matrix.Labels | None) -> Matrix:
        """The piece's hourly points of a native answer: of a whole period's, decoded once
        into the period's hourly points, kept until the period's last chunk where they fit
        the memory budget; where they do not, the signal's other chunks read JSON lines
        (`TooLarge` for those already sent with this answer)."""
        first, last = sent.piece.first, sent.piece.last
        key = id(sent.answer)
        with self._lock:
            dropped = self._period_dropped.get(key)
            if dropped is not None and dropped() is sent.answer:
                raise vmnative.TooLarge("the period's hourly points are over the memory budget")
            name = next((n for (n, _), a in self._period.items() if a is sent.answer), None)
            hours = self._period_hours.get(key)
        if name is None or self.period is None:
            return vmnative.read(sent.answer.body, first, last, self.max_native_rows(), seen)
        last_chunk = last >= self.period[1]
        if hours is None:
            # Not decoded where its points could not be kept: samples of a recorded series
            # are its hourly points.
            with self._lock:
                room = (self._native_bytes() / 4 - self._period_bytes) / HOURS_BYTES_PER_POINT
            rows = self.max_native_rows() if last_chunk else min(self.max_native_rows(),
                                                                   max(int(room), 0))
            try:
                hours = vmnative.hours(vmnative.decode(sent.answer.body, rows, seen),
                                       *self.period)
            except vmnative.TooLarge:
                self._drop_period(sent.answer, name, off=True)
                raise
            if not last_chunk:
                with self._lock:
                    fits = self._period_bytes + hours.nbytes <= self._native_bytes() / 4
                    if fits:
                        self._period_hours[key] = hours
                        self._period_bytes += hours.nbytes
                if not fits:
                    self._drop_period(sent.answer, name, off=True)
        if last_chunk:
            self._drop_period(sent.answer, name, off=False)
        return hours.window(first, last)

    def _drop_period(self, answer: Answer, name: str, off: bool) -> None:
        """A period answer, and its hourly points, no longer kept: its last chunk is read,
        or (`off`) its points do not fit the memory budget, and the signal's other chunks
        read JSON lines (those sent with this answer already: `TooLarge`)."""
        with self._lock:
            self._period = {k: a for k, a in self._period.items() if a is not answer}
            hours = self._period_hours.pop(id(answer), None)
            self._period_bytes -= len(answer.body) + (hours.nbytes if hours else 0)
            if off:
                self._period_off.add(name)
                self._period_dropped[id(answer)] = weakref.ref(answer)

    def _json_export(self, sent: Answered) -> Answer:
        """The JSON lines of a native read (its fallback, or its check)."""
        answer = self.client.export_answer(
            EXPORT_PATH, vmexport.params(sent.promql, sent.piece.first, sent.piece.last))
        if answer.status != 200:
            raise PromError(f"{self.client.url}: {EXPORT_PATH} of {sent.promql!r}: "
                            f"HTTP {answer.status}: {_first_line(answer.body)}")
        return answer

    @staticmethod
    def _promql(spec: SignalSpec, window: str, match: str, recorded: bool,
                metricsql: bool) -> str:
        return (spec.recorded_promql(match) if recorded
                else spec.promql(window, match=match, metricsql=metricsql))

    def _with_selector(self, first: str, match: str) -> str:
        """`first`, the selector's matchers and `match`, comma-joined (braced when `first`
        is given: a whole series selector)."""
        joined = ",".join(m for m in (first, self.selector, match) if m)
        return "{" + joined + "}" if first else joined

    def _halve(self, piece: Piece, nodes: tuple[str, ...] | None) -> list[Piece] | None:
        shard = piece.nodes
        if shard is None and nodes:
            shard = ("", *nodes)
        real = tuple(n for n in (shard or ()) if n)
        if len(real) > 1:  # the empty name (series without a node) stays in the first half
            mid = len(real) // 2
            head = ("",) if shard is not None and "" in shard else ()
            return [Piece((*head, *real[:mid]), piece.first, piece.last),
                    Piece(real[mid:], piece.first, piece.last)]
        if piece.steps > 1:
            mid = piece.first + (piece.steps // 2 - 1) * HOUR_S
            return [Piece(shard, piece.first, mid), Piece(shard, mid + HOUR_S, piece.last)]
        return None

    def _learn(self, spec: SignalSpec, result: Matrix) -> None:
        """Series per node for the family; samples per series-hour from count signals."""
        nodes = [labels.get(SHARD_LABEL, "") for labels in result.labels]
        counted: dict[str, int] = {}
        for node in nodes:
            counted[node] = counted.get(node, 0) + 1
        rates: dict[str, float] = {}
        if spec.func == "count" and len(result.sid):
            # A few points from the middle of each series: full hours, cheap to read.
            starts = np.searchsorted(result.sid, np.arange(len(result)))
            ends = np.append(starts[1:], len(result.sid))
            mid = (starts + ends) // 2
            pos = np.arange(len(result.sid))
            near = ((pos >= np.maximum(starts, mid - 2)[result.sid])
                    & (pos < np.minimum(ends, mid + 2)[result.sid]) & np.isfinite(result.v))
            top = np.full(len(result), -np.inf)
            np.maximum.at(top, result.sid[near], result.v[near])
            for node, value in zip(nodes, top.tolist(), strict=True):
                if value > rates.get(node, 0.0):
                    rates[node] = value
        self._learned.learn(spec.family, counted, rates)


@functools.lru_cache(maxsize=1 << 16)  # asked per node of every piece planned and sent
def _alternative(node: str) -> str:
    """A node name as one alternative of the shard matcher's regex, quoted for PromQL."""
    return _REGEX_META.sub(r"\\\1", node).replace("\\", "\\\\").replace('"', '\\"')


def _by_length(names: Sequence[str], room: int) -> list[tuple[str, ...]]:
    """`names` in order, cut where a batch's shard matcher would pass `room` bytes."""
    batches: list[tuple[str, ...]] = []
    batch: list[str] = []
    size = 0
    for name in names:
        cost = len(_alternative(name)) + 1
        if batch and size + cost > room:
            batches.append(tuple(batch))
            batch, size = [], 0
        batch.append(name)
        size += cost
    return [*batches, tuple(batch)] if batch else batches


def _first_line(body: bytes) -> str:
    # Whole: VictoriaMetrics puts the limit it hit at the end of a long line.
    text = body.decode("utf-8", "replace").strip()
    return (text.splitlines() or ["no message"])[0][:4000]


def _time_ranges(first: int, last: int, hours: int) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    a = first
    while a <= last:
        b = min(a + (hours - 1) * HOUR_S, last)
        out.append((a, b))
        a = b + HOUR_S
    return out


def _month_pieces(piece: Piece) -> list[Piece]:
    """The piece cut where its samples pass from one calendar month to the next: evaluation
    hour E reads the samples of [E, E + 1h) (vmexport.params), so each piece's samples lie in
    one month."""
    out: list[Piece] = []
    a = piece.first
    while a <= piece.last:
        b = min(_month_bounds(a)[1] - HOUR_S, piece.last)
        out.append(Piece(piece.nodes, a, b))
        a = b + HOUR_S
    return out


def _whole_month(piece: Piece) -> bool:
    """Whether the piece's samples, [first, last + 1h), are one whole calendar month."""
    return _month_bounds(piece.first) == (piece.first, piece.last + HOUR_S)


def _month_bounds(t: int) -> tuple[int, int]:
    """[start, end) of the calendar month holding unix time `t`, in unix seconds."""
    month = Month.of(datetime.fromtimestamp(t, UTC))
    return int(utc_aware(month.start).timestamp()), int(utc_aware(month.end).timestamp())


def _describe(piece: Piece) -> str:
    who = "every node" if piece.nodes is None else f"{len([n for n in piece.nodes if n])} node(s)"
    return f"{who}, {piece.steps} hour(s)"


def _same_points(a: Matrix, b: Matrix) -> bool:
    """The same series and points, values bit for bit."""
    return (a.keys == b.keys and np.array_equal(a.sid, b.sid) and np.array_equal(a.t, b.t)
            and np.array_equal(a.v.view(np.int64), b.v.view(np.int64)))
