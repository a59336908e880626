"""Hourly facts from per-series hourly aggregates ("signals"), computed and written in DuckDB.

Both sources (Prometheus range queries, OpenMetrics files) reduce raw samples to the same
signals: for one metric family and one function (count, sum, max, min, last), one row per
series per hour with that series' labels. Hour H holds the samples in (H, H+1h], which is
what a PromQL `<fn>_over_time(x[1h])` evaluated at H+1h sees. Everything after that is SQL
over Arrow tables (metering/sql/facts.sql), so the cost per fact row is DuckDB's, not
Python's. Every signal row and fact row carries the cluster it belongs to (ClusterScope).
What the signals are is metering.signals; this module only writes facts.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from metering import guards, pricedhours, sqlfile, unfinished
from metering.cluster import DEFAULT_CLUSTER, ClusterScope, cluster_name_problem
from metering.errors import RefusedError
from metering.matrix import Matrix
from metering.signals import (
    HOUR_S,
    POD_LABEL_PREFIX,
    SIGNALS,
    SignalSpec,
    series_hash,
    series_key,
    series_labels,
)
from metering.sqlfile import SqlFile
from metering.unfinished import FACT_TABLES


class FactError(RefusedError):
    """The data cannot be turned into facts (bad label values, no sample spacing)."""


def build_signal(spec: SignalSpec, series: Sequence[Mapping[str, str]], sid: np.ndarray,
                 hour_s: np.ndarray, value: np.ndarray,
                 series_keys: Sequence[str] | None = None) -> pa.Table:
    """Arrow table for one signal: point i belongs to series[sid[i]], hour start hour_s[i].

    Per-series columns, the series' and key's ids among them, are dictionary-encoded with one
    dictionary entry per series (Arrow allows repeats) and `sid` as the indices: nothing is
    copied per point, and DuckDB reads such a column as a dictionary vector, converting each
    label (and each MAP) once per series instead of once per sample. `series_keys`: the
    series' series_key where the caller has them already."""
    idx = pa.array(sid.astype(np.int32, copy=False), pa.int32())
    skeys = (list(series_keys) if series_keys is not None
             else [series_key(m) for m in series])
    n = len(series)
    hashes = np.fromiter(map(series_hash, skeys), np.int64, n)
    # Each label column once per series (a key label is often a kept column too); the key
    # text of a series is its key labels joined, as map/zip over those columns, not a
    # generator per series (this was a sixth of ingest's CPU, docs/performance.md).
    text = {c: [m.get(c, "") for m in series] for c in dict.fromkeys((*spec.key, *spec.cols))}
    key_text = (text[spec.key[0]] if len(spec.key) == 1
                else list(map("\x1f".join, zip(*(text[c] for c in spec.key), strict=True))))
    keys = np.fromiter(map(series_hash, key_text), np.int64, n)

    def per_series(values: pa.Array) -> pa.DictionaryArray:
        return pa.DictionaryArray.from_arrays(idx, values)

    cols: dict[str, Any] = {
        "series": per_series(pa.array(skeys, pa.string())),
        # ids as dictionaries too: two int64 copies per point were 16 bytes of each point's
        # 78 (an 80,000-GPU chunk peaks 0.4 GiB lower without them), and DuckDB joins the
        # dictionaries as fast (docs/performance.md, "The series' ids per series")
        "sh": per_series(pa.array(hashes, pa.int64())),
        "key": per_series(pa.array(keys, pa.int64())),
        "hour": pa.array(hour_s.astype(np.int64, copy=False) * 1_000_000, pa.timestamp("us")),
        "value": pa.array(value.astype(np.float64, copy=False), pa.float64()),
    }
    for col in spec.cols:
        cols[col] = per_series(pa.array(text[col], pa.string()))
    if spec.pod_labels:
        labels = [sorted((k[len(POD_LABEL_PREFIX):], v) for k, v in m.items()
                         if k.startswith(POD_LABEL_PREFIX)) for m in series]
        cols["labels"] = per_series(pa.array(labels, pa.map_(pa.string(), pa.string())))
    return pa.table(cols)


def signal_table(spec: SignalSpec, m: Matrix) -> pa.Table:
    """build_signal of a source's decoded signal (points at hour starts)."""
    return build_signal(spec, m.labels, m.sid, m.t.astype(np.int64), m.v, m.keys)


def empty_signal(spec: SignalSpec) -> pa.Table:
    return build_signal(spec, [], np.zeros(0, np.int64), np.zeros(0, np.int64),
                        np.zeros(0, np.float64))


@dataclass
class FactCounts:
    device_hours: int = 0
    mig_hours: int = 0
    allocation_hours: int = 0
    workload_hours: int = 0
    grant_hours: int = 0
    # node -> seconds per sample ("cluster/node" when the chunk holds several clusters)
    spacing: dict[str, float] = field(default_factory=dict)
    clusters: tuple[str, ...] = ()  # clusters whose hours this chunk replaced
    # Per cluster written: rows of each fact family the ledger held for the chunk before,
    # and now (metering.guards).
    held: guards.Held = field(default_factory=dict)
    written: guards.Held = field(default_factory=dict)
    # (cluster, hour) -> sample-seconds of device, MIG and allocation series counted once
    # instead of twice or more (overlapping duplicates: two jobs, an HA pair, a store without
    # dedup)
    duplicates: dict[tuple[str, datetime], float] = field(default_factory=dict)
    # (cluster, family) -> (hour, key)s where a family whose values are added up per key had
    # more series than the key's count family (gpu_up, gpu_mig_info, gpu_container_allocation):
    # added up there, twice the value where they overlapped (facts.sql gl_more_series)
    more_series: dict[tuple[str, str], int] = field(default_factory=dict)

    @property
    def duplicate_seconds(self) -> float:
        return sum(self.duplicates.values())

    @property
    def total(self) -> int:
        return (self.device_hours + self.mig_hours + self.allocation_hours
                + self.workload_hours + self.grant_hours)

    def shrunk(self) -> list[guards.Shrink]:
        """Families of clusters for which the chunk has fewer rows than the ledger held."""
        return guards.shrinks(self.held, self.written)


# Integer labels that pricing divides by: a bad value is an error, never a silent 0.
_INT_LABELS = (("mig_count", "gpu_mig_info", ("slices", "parent_slices")),
               ("alloc_count", "gpu_container_allocation", ("replicas",)))


def _check_int_labels(con: Any) -> None:
    for view, family, labels in _INT_LABELS:
        for label in labels:
            rows = con.execute(
                f"SELECT series, {label} FROM {view} WHERE gl_in(hour) AND "
                f"coalesce(try_cast({label} AS INTEGER), 0) < 1 LIMIT 1").fetchall()
            for row in rows:
                series = "{" + row[0].replace("\x1f", ", ") + "}"
                raise FactError(f"{family}{series}: label {label}: expected a whole number "
                                f">= 1, got {row[1]!r}")


def detect_spacing(con: Any) -> tuple[dict[tuple[str, str], float], float | None]:
    """Seconds between the exporter's samples, per (cluster, node): 3600 / the most common
    number of gpu_up samples a series holds in an hour of the chunk. Also the mode over all
    nodes, for series on nodes without gpu_up. Needs the chunk's variables set."""
    rows = con.execute(_sql().query("spacing")).fetchall()
    per_node: dict[tuple[str, str], tuple[int, float]] = {}
    overall: dict[float, int] = {}
    for cluster, node, n, k in rows:
        if (k, n) > per_node.get((cluster, node), (0, 0.0)):
            per_node[(cluster, node)] = (k, n)
        overall[n] = overall.get(n, 0) + k
    spacing = {where: HOUR_S / n for where, (_, n) in per_node.items()}
    default = HOUR_S / max(overall, key=lambda n: (overall[n], n)) if overall else None
    return spacing, default


def _sql() -> SqlFile:
    """metering/sql/facts.sql: the fact statements, run in the file's order."""
    return sqlfile.load("facts.sql")


def _tag_clusters(table: pa.Table, scope: ClusterScope) -> tuple[pa.Table, set[str]]:
    """`table` with a `cluster` column (one dictionary entry per series, like the labels) and,
    when the cluster comes from a label, the cluster folded into `key`: the same container
    names in two clusters are two fact rows. Returns the clusters seen."""
    n = table.num_rows
    if scope.label is None:
        col = pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int32), pa.int32()),
                                             pa.array([scope.name], pa.string()))
        table = _set_column(table, "cluster", col)
        return table, ({scope.name} if n else set())
    clusters: list[pa.Array] = []
    keys: list[pa.Array] = []
    seen: set[str] = set()
    series = table.column("series")
    key = table.column("key").cast(pa.int64())  # per point: each is salted by its cluster
    offset = 0
    for chunk in series.chunks:
        names = [scope.of(series_labels(k.as_py())) for k in chunk.dictionary]
        seen.update(names[i] for i in set(chunk.indices.to_numpy(zero_copy_only=False)))
        clusters.append(pa.DictionaryArray.from_arrays(chunk.indices,
                                                       pa.array(names, pa.string())))
        salt = np.fromiter((series_hash(name) for name in names), np.int64, len(names))
        idx = chunk.indices.to_numpy(zero_copy_only=False)
        part = key.slice(offset, len(chunk)).to_numpy()
        keys.append(pa.array(part ^ salt[idx] if len(idx) else part, pa.int64()))
        offset += len(chunk)
    table = _set_column(table, "cluster", pa.chunked_array(
        clusters, pa.dictionary(pa.int32(), pa.string())))
    table = _set_column(table, "key", pa.chunked_array(keys, pa.int64()))
    return table, seen


def _check_one_node_per_gpu(con: Any, query: str, params: Mapping[str, object] | None = None
                            ) -> None:
    """A GPU seen all hour on two nodes is refused (facts.sql `clash_in_group`,
    `clash_across_groups`): its hours and holders would merge into one GPU's bill. Exporters
    publish a GPU without a chip-derived UUID as `<PCI address>@<node>`; an older one
    published the bare address, the same on identical nodes (docs/backends.md, "Device
    identity")."""
    clash = con.execute(query, params or {}).fetchall()
    if clash:
        uuid, a, b, hour = clash[0]
        raise FactError(f"GPU {uuid} is reported by nodes {a} and {b} in the hour "
                        f"{hour:%Y-%m-%dT%H}:00Z: a GPU's uuid must be unique in its cluster, "
                        "or their hours would be billed as one GPU's (an exporter older than "
                        "the node-qualified uuid, or run without a node name, publishes an "
                        "AMD or Intel GPU's bare PCI address: docs/backends.md)")


def _shares_keys(table: pa.Table) -> bool:
    """Whether some fact key of a signal has two series or more (in any of its hours)."""
    if table.num_rows == 0:
        return False
    return _distinct(table.column("key")) < _distinct(table.column("sh"))


def _distinct(col: pa.ChunkedArray) -> int:
    """Distinct values in the rows of `col`, plain or dictionary-encoded (build_signal's
    per-series columns: only the entries some row uses count)."""
    if pa.types.is_dictionary(col.type):
        col = pa.chunked_array([c.dictionary.take(pc.unique(c.indices)) for c in col.chunks],
                               col.type.value_type)
    count: int = pc.count_distinct(col).as_py()
    return count


def _set_column(table: pa.Table, name: str, col: pa.Array | pa.ChunkedArray) -> pa.Table:
    i = table.schema.get_field_index(name)
    return table.set_column(i, name, col) if i >= 0 else table.append_column(name, col)


def write_facts(con: Any, groups: Iterable[Mapping[str, pa.Table]], start: datetime,
                end: datetime, sample_interval: float | None = None,
                clusters: ClusterScope | None = None,
                staged: Callable[[], bool] | None = None) -> FactCounts:
    """Replace the facts of hours [start, end) (naive UTC) of the clusters in the signals
    with what they hold. The signals come in node groups (one table per SignalSpec name
    each; missing ones count as empty): disjoint sets of series, written one after another,
    so that a group's tables are let go before the next is read. Only the clusters the
    chunk writes are touched: re-metering one cluster never changes another's hours. The
    caller owns the transaction; `staged` (asked once the first group is read: whether the
    chunk comes in several) has each group committed on its own: in place where the chunk's
    hours hold nothing yet (`_in_place`), else staged (`_stage`)."""
    scope = clusters or ClusterScope()
    sql = _sql()
    it = iter(groups)
    first = next(it, None)
    stage = first is not None and staged is not None and staged()
    w = _Writer(con, sql, scope, start, end, sample_interval, defer=stage)
    for name, value in (("gl_start", start), ("gl_end", end), ("gl_hour_s", float(HOUR_S))):
        con.execute(f"SET VARIABLE {name} = ?", [value])
    con.execute(dict(sql.steps)["macros"])
    if scope.label is None:
        w.replace({scope.name})
    rest: Iterator[Mapping[str, pa.Table]] = (
        it if first is None else (g for gs in ((first,), it) for g in gs))
    if stage:
        into = None if scope.label is not None else [scope.name]
        if unfinished.fresh(con, start, end, into):
            _in_place(con, w, rest, into)
        else:
            _stage(con, w, rest)
    else:
        for signals in rest:
            w.group(signals)
    # Node groups are written apart: one GPU's two nodes may be in two groups. Within one
    # group a GPU has one device row per hour (its key), so there is nothing to find: two
    # nodes there are two series of one key, which clash_in_group checks.
    if w.groups > 1 and w.written:
        slack = 2 * max([*w.spacing.values(), w.default or 0.0, 1.0])
        _check_one_node_per_gpu(con, sql.query("clash_across_groups"),
                                {"clusters": sorted(w.written), "slack": slack})
    pricedhours.settle(con, start, end, w.written, w.replaced)
    counts = w.counts
    single = len({c for c, _ in w.spacing}) <= 1
    counts.spacing = ({(n if single else f"{c}/{n}"): sec for (c, n), sec in w.spacing.items()}
                      or {"*": w.default if w.default is not None else float(HOUR_S)})
    counts.clusters = tuple(sorted(w.written))
    counts.written = guards.held(con, start, end, w.written)
    facts_s = {(str(c), h): float(v) for c, h, v in
               con.execute(sql.query("fact_seconds")).fetchall()}
    counts.duplicates = {k: v - facts_s.get(k, 0.0) for k, v in sorted(w.signal_s.items())
                         if v - facts_s.get(k, 0.0) > 0.5}
    return counts


@dataclass
class _Writer:
    """The state of one chunk's fact writes across its node groups."""

    con: Any
    sql: SqlFile
    scope: ClusterScope
    start: datetime
    end: datetime
    fixed: float | None  # seconds per sample given (--sample-interval), or None: detected
    counts: FactCounts = field(default_factory=FactCounts)
    written: set[str] = field(default_factory=set)  # clusters whose hours were replaced
    spacing: dict[tuple[str, str], float] = field(default_factory=dict)
    # (cluster, hour) -> sample-seconds the signals held (de-duplication's input)
    signal_s: dict[tuple[str, datetime], float] = field(default_factory=dict)
    default: float | None = None  # seconds per sample of nodes without their own
    defer: bool = False  # staged (_stage): the ledger's hours are replaced at the end
    groups: int = 0  # node groups written
    # the digests of the replaced priced hours' facts (delete_hours), for pricedhours.settle
    replaced: pricedhours.Before = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.default = self.fixed

    def replace(self, clusters: set[str]) -> None:
        """Count, then delete, what the ledger holds for the hours of clusters not yet
        replaced by this chunk (deferred: only noted, for `settle`)."""
        new = clusters - self.written
        if new and not self.defer:
            self.counts.held.update(guards.held(self.con, self.start, self.end, new))
            self.replaced.update(delete_hours(self.con, self.start, self.end, new))
        self.written |= new

    def settle(self) -> None:
        """Count, then delete, what the ledger holds for the hours of every cluster the
        staged groups wrote."""
        self.counts.held.update(guards.held(self.con, self.start, self.end, self.written))
        self.replaced.update(delete_hours(self.con, self.start, self.end, self.written))

    def group(self, signals: Mapping[str, pa.Table]) -> None:
        self.groups += 1
        con, sql, scope = self.con, self.sql, self.scope
        names = [s.name for s in SIGNALS]
        seen: set[str] = set()
        shared = False  # a count signal's key has two series (spans merged, rows picked)
        plural: list[str] = []  # signals with a key of two series (their aggregates group)
        done = False
        try:
            for spec in SIGNALS:
                table, found = _tag_clusters(signals.get(spec.name, empty_signal(spec)), scope)
                seen |= found
                con.register(spec.name, table)
                if _shares_keys(table):
                    shared = shared or spec.name in _SPAN_COUNTS
                    plural.append(spec.name)
            for name in sorted(seen):
                problem = cluster_name_problem(name)
                if problem:
                    raise FactError(f"label {scope.label}: {problem}")
            _check_int_labels(con)
            spacing: dict[tuple[str, str], float] = {}
            default = self.fixed
            if default is None:
                spacing, default = detect_spacing(con)
                default = default if default is not None else self.default  # earlier group's
                if default is None and con.execute(sql.query("pending")).fetchall()[0][0]:
                    raise FactError(
                        f"cannot detect the sample interval for "
                        f"{self.start:%Y-%m-%dT%H:%M}Z .. {self.end:%Y-%m-%dT%H:%M}Z: there "
                        "are allocation or MIG samples but no gpu_up samples; pass "
                        "--sample-interval SECONDS")
            dflt = default if default is not None else float(HOUR_S)
            # Every statement reads a node's seconds per sample as coalesce(its spacing row,
            # gl_dflt): a node at the default needs no row, and a fleet scraped at one
            # interval joins an empty table instead of matching every signal row's node.
            other = {where: sec for where, sec in spacing.items() if sec != dflt}
            con.register("spacing", pa.table({
                "cluster": pa.array([c for c, _ in other], pa.string()),
                "node": pa.array([n for _, n in other], pa.string()),
                "seconds": pa.array(list(other.values()), pa.float64())}))
            names.append("spacing")
            con.execute("SET VARIABLE gl_dflt = ?", [dflt])
            if shared:
                _check_one_node_per_gpu(con, sql.query("clash_in_group"))
            if scope.label is not None:
                self.replace(seen)
            # Which series names each fact row, and the other signals per row: grouped only
            # where some key has two series.
            con.execute(sql.query("pick_grouped" if shared else "pick_single"))
            con.execute(sql.query("agg_rows"))
            con.execute(sql.query("agg_grouped" if plural else "agg_single"))
            more = self.counts.more_series
            for name in (n for n in plural if n in _ADDED_UP):
                family, count = _ADDED_UP[name]
                for cluster, n in con.execute(
                        f"FROM gl_more_series('{name}', '{count}')").fetchall():
                    where = (str(cluster), family)
                    more[where] = more.get(where, 0) + int(n)
            for step, body in sql.steps:
                if step == "macros":
                    continue
                if step in _DEDUP_STEPS and not shared:
                    # One series per key: its span holds what its samples do, so there is
                    # nothing to de-duplicate; the window over every span was 2.3 s of a
                    # chunk.
                    body = sql.query("no_spans") if step == "spans" else sql.query("no_held")
                rows = con.execute(body).fetchall()
                if step in _COUNTED:
                    setattr(self.counts, step,
                            getattr(self.counts, step) + (int(rows[0][0]) if rows else 0))
            for c, h, v in con.execute(sql.query("signal_seconds")).fetchall():
                self.signal_s[(str(c), h)] = self.signal_s.get((str(c), h), 0.0) + float(v)
            self.spacing.update(spacing)
            if self.default is None:
                self.default = default
            done = True
        finally:
            # After an error an aborted transaction refuses these (its rollback and the
            # connection's close undo them), and that error would hide the one raised
            # (DuckDB out of memory).
            with contextlib.suppress(*(() if done else (duckdb.Error,))):
                con.execute(sql.query("cleanup"))
                for name in names:
                    con.unregister(name)


# The count signals whose series' spans de-duplication merges (facts.sql, step spans), and
# the steps it takes.
_SPAN_COUNTS = frozenset(("up_count", "mig_count", "alloc_count"))
_DEDUP_STEPS = frozenset(("spans", "held"))
_COUNTED = frozenset(("device_hours", "mig_hours", "allocation_hours", "workload_hours",
                      "grant_hours"))
# The signals a key's series are added up in (integrals, energy increases), each with its
# family and the count signal of its key, whose series de-duplication sees (gl_more_series).
_COUNT_OF = {s.key: s.name for s in SIGNALS if s.name in _SPAN_COUNTS}
_ADDED_UP: dict[str, tuple[str, str]] = {
    s.name: (s.family, _COUNT_OF[s.key]) for s in SIGNALS
    if s.func in ("sum", "last") and s.key in _COUNT_OF
    and s.family not in {c.family for c in SIGNALS if c.name in _SPAN_COUNTS}}
# The families of _ADDED_UP, in SIGNALS order: what `meter --pushgateway` publishes a count of.
ADDED_UP_FAMILIES: tuple[str, ...] = tuple(dict.fromkeys(f for f, _ in _ADDED_UP.values()))
_HOURS_OF = {"up_count": "GPU-hour", "mig_count": "MIG-instance-hour",
             "alloc_count": "container-hour"}


def describe_more_series(more: Mapping[tuple[str, str], int]) -> str:
    """The warning for FactCounts.more_series (empty: none), one line."""
    if not more:
        return ""
    units = {family: _HOURS_OF[count] for family, count in _ADDED_UP.values()}
    several = len({c for c, _ in more}) > 1
    where = "; ".join(f"{family} in {n:,} {units[family]}(s)"
                      + (f" of cluster {cluster}" if several else "")
                      for (cluster, family), n in sorted(more.items()))
    return (f"more series than the count family of their GPU, MIG instance or container, "
            f"values added up: {where}. Right where the series followed each other (a "
            f"relabel of that family alone), twice the value where they overlapped (a scrape "
            f"job keeping only that family): docs/metering.md, \"Several series for one key\"")


# Why node groups are staged: in one transaction DuckDB holds every group's inserted facts in
# memory until COMMIT (4.8M fact rows: 1.4 GiB against 0.6 GiB committed group by group; at 40,000
# GPUs a 2 GiB budget peaked at 2.8 GiB). So a chunk in several groups writes each group's facts
# into tables of their own (schema STAGING, the fact tables' columns) and commits them; its
# last transaction replaces the chunk's hours with them (an INSERT ... SELECT, which DuckDB
# writes to the file as it goes), guards and coverage as for one group. The fact tables never
# hold part of a chunk: a run stopped between groups leaves only staged rows, which the next
# staged chunk replaces. Hours that hold nothing yet are written in place instead (_in_place).
# The move cost 15-18 % of an 80,000-GPU chunk's client CPU (docs/performance.md).
STAGING = "gl_staging"
_STAGED = FACT_TABLES[:-1]  # not coverage: ingest writes it after the facts


def _stage(con: Any, w: _Writer, groups: Iterable[Mapping[str, pa.Table]]) -> None:
    """The groups into STAGING, each committed, then their facts in place of the chunk's
    hours in the caller's (new) transaction."""
    try:
        con.execute(f"CREATE SCHEMA IF NOT EXISTS {STAGING}")
        for table in _STAGED:
            con.execute(f"CREATE OR REPLACE TABLE {STAGING}.{table} AS "
                        f"FROM main.{table} LIMIT 0")
        con.execute("COMMIT")
        con.execute("BEGIN TRANSACTION")
        con.execute(f"SET search_path = '{STAGING},main'")  # facts.sql writes there
        for signals in groups:
            w.group(signals)
            con.execute("COMMIT")
            con.execute("BEGIN TRANSACTION")
        con.execute("RESET search_path")
    except BaseException:
        # RESET after the ROLLBACK: an aborted transaction refuses it, and its error would
        # hide the one raised (DuckDB out of memory, a Ctrl-C).
        for statement in ("ROLLBACK", "RESET search_path",
                          f"DROP SCHEMA IF EXISTS {STAGING} CASCADE",
                          "BEGIN TRANSACTION"):  # the last one for the caller's ROLLBACK
            with contextlib.suppress(duckdb.Error):
                con.execute(statement)
        raise
    w.settle()
    for table in _STAGED:
        con.execute(f"INSERT INTO main.{table} SELECT * FROM {STAGING}.{table}")
    con.execute(f"DROP SCHEMA {STAGING} CASCADE")


def _in_place(con: Any, w: _Writer, groups: Iterable[Mapping[str, pa.Table]],
              clusters: Sequence[str] | None) -> None:
    """The groups straight into the fact tables, each committed, where the chunk's hours
    hold nothing yet (metering/unfinished.py): noted as unfinished first, the note dropped in
    the caller's (new) transaction, which writes the coverage. A failure from here on leaves
    committed groups for the caller to delete (unfinished.recovered_on_error)."""
    unfinished.begin(con, w.start, w.end, clusters)
    con.execute("COMMIT")
    con.execute("BEGIN TRANSACTION")
    for signals in groups:
        w.group(signals)
        con.execute("COMMIT")
        con.execute("BEGIN TRANSACTION")
    unfinished.done(con, w.start, w.end)


def delete_hours(con: Any, start: datetime, end: datetime,
                 clusters: Iterable[str]) -> pricedhours.Before:
    """Delete the facts and coverage of hours [start, end) of these clusters only. Returns
    the digests of the priced hours' facts: once the new facts are written,
    pricedhours.settle drops what pricing derived from the old ones (the waste device-hours,
    the priced mark) where the facts changed."""
    wanted = sorted(clusters)
    was = pricedhours.before(con, start, end, wanted)
    for table in FACT_TABLES:
        con.execute(f"DELETE FROM {table} WHERE hour >= ? AND hour < ? AND "
                    "list_contains(?, cluster)", [start, end, wanted])
    return was


def write_coverage(con: Any, start: datetime, end: datetime, source: str,
                   ingested_at: datetime, clusters: Iterable[str] = (DEFAULT_CLUSTER,),
                   duplicates: Mapping[tuple[str, datetime], float] | None = None,
                   dropped: Mapping[datetime, int] | None = None) -> list[datetime]:
    """One coverage row per hour of [start, end) and cluster, with the sample-seconds
    de-duplication removed (per cluster) and the values dropped as not plausible; returns the
    hours in which some of these clusters had no device data. A dropped value has no labels
    to trust, so the chunk's drops are counted on the first of its clusters."""
    wanted = sorted(clusters)
    first = wanted[0] if wanted else DEFAULT_CLUSTER
    keys = [*(duplicates or {}), *((first, h) for h in dropped or {})]
    extra = pa.table({
        "cluster": pa.array([c for c, _ in keys], pa.string()),
        "hour": pa.array([h for _, h in keys], pa.timestamp("us")),
        "dup": pa.array([*(duplicates or {}).values(), *(0.0 for _ in dropped or {})],
                        pa.float64()),
        "bad": pa.array([*(0 for _ in duplicates or {}), *(dropped or {}).values()],
                        pa.int64())})
    con.register("_coverage_extra", extra)
    try:
        con.execute(
            """INSERT INTO coverage (hour, cluster, source, devices, ingested_at,
                                     duplicate_seconds, dropped_values)
               SELECT h.hour, c.cluster, $source, coalesce(d.n, 0), $now, coalesce(x.dup, 0),
                      coalesce(x.bad, 0)
               FROM (SELECT unnest(generate_series($start, $end - INTERVAL 1 HOUR,
                                                   INTERVAL 1 HOUR)) AS hour) h
               CROSS JOIN (SELECT unnest($clusters::VARCHAR[]) AS cluster) c
               LEFT JOIN (SELECT hour, cluster, count(*) AS n FROM device_hours
                          WHERE hour >= $start AND hour < $end GROUP BY hour, cluster) d
                      ON d.hour = h.hour AND d.cluster = c.cluster
               LEFT JOIN (SELECT hour, cluster, sum(dup) AS dup, sum(bad) AS bad
                          FROM _coverage_extra GROUP BY hour, cluster) x
                      ON x.hour = h.hour AND x.cluster = c.cluster""",
            {"start": start, "end": end, "source": source, "now": ingested_at,
             "clusters": wanted})
    finally:
        con.unregister("_coverage_extra")
    rows = con.execute("SELECT DISTINCT hour FROM coverage WHERE hour >= ? AND hour < ? "
                       "AND devices = 0 AND list_contains(?, cluster) ORDER BY hour",
                       [start, end, wanted]).fetchall()
    return [r[0] for r in rows]
