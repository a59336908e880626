"""Hourly facts from per-series hourly aggregates ("signals"), computed and written in DuckDB.

Both sources (Prometheus range queries, OpenMetrics files) reduce raw samples to the same
signals: for one metric family and one function (count, sum, max, min, last), one row per
series per hour with that series' labels. Hour H holds the samples in (H, H+1h], which is
what a PromQL `<fn>_over_time(x[1h])` evaluated at H+1h sees. Everything after that is SQL
over Arrow tables (metering/sql/facts.sql), so the cost per fact row is DuckDB's, not
Python's. Every signal row and fact row carries the cluster it belongs to (ClusterScope).

Metric names are the exporter's contract, spelled here as strings: metering never imports
the exporter.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np
import pyarrow as pa

from metering import guards, sqlfile
from metering.cluster import DEFAULT_CLUSTER, ClusterScope, cluster_name_problem
from metering.errors import RefusedError
from metering.sqlfile import SqlFile

HOUR_S = 3600
# Grid of the `tlast` subquery: at most the shortest scrape interval metered (docs/metering.md).
TLAST_STEP_S = 10.0
DEVICE_COLS = ("node", "gpu", "uuid", "model")
CONTAINER_COLS = ("node", "namespace", "pod", "container", "uuid", "mig_uuid")
# What identifies a fact row (besides the hour) in each fact table.
DEVICE_KEY = ("uuid",)
MIG_KEY = ("mig_uuid",)
CONTAINER_KEY = ("namespace", "pod", "container", "uuid", "mig_uuid")
# owner_kind/owner_name: the pod's controller (Deployment, StatefulSet, Job, ...), '' if none.
ALLOC_COLS = (*CONTAINER_COLS, "resource", "sharing", "replicas", "owner_kind", "owner_name")
POD_LABEL_PREFIX = "label_"


class FactError(RefusedError):
    """The data cannot be turned into facts (bad label values, no sample spacing)."""


@dataclass(frozen=True)
class SignalSpec:
    name: str  # the DuckDB view name the fact SQL reads
    family: str  # sample name as Prometheus stores it
    func: str  # count | sum | max | min | last | tlast (time of the hour's last sample, s)
    cols: tuple[str, ...]  # labels kept as columns ('' where a series lacks one)
    # Labels of the fact row the series feeds; their 64-bit hash (column `key`) is what the
    # fact SQL groups and joins on, so no statement hashes strings per sample.
    key: tuple[str, ...]
    pod_labels: bool = False  # keep label_* (prefix dropped) as a MAP column `labels`
    # Labels a series must have non-empty to count (a family that mixes device and MIG
    # series keeps only the MIG ones); both sources apply it, so their rows stay equal.
    nonempty: tuple[str, ...] = ()

    def selector(self, match: str = "") -> str:
        """The family with its nonempty matchers and `match` (more matchers, e.g. a node
        shard from metering.queryplan)."""
        matchers = [f'{label}!=""' for label in self.nonempty] + ([match] if match else [])
        return self.family + ("{" + ",".join(matchers) + "}" if matchers else "")

    def promql(self, window: str, step_s: float = TLAST_STEP_S, match: str = "",
               metricsql: bool = False) -> str:
        if self.func == "tlast" and metricsql:
            # MetricsQL (VictoriaMetrics) has the exact function: no 10 s subquery grid.
            return f"tlast_over_time({self.selector(match)}[{window}])"
        if self.func == "tlast":
            # Latest sample time at grid points every step_s: the hour's last sample time,
            # exact while a grid point falls between it and its staleness marker.
            return f"max_over_time(timestamp({self.selector(match)})[{window}:{step_s:g}s])"
        return f"{self.func}_over_time({self.selector(match)}[{window}])"

    def keeps(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(label) for label in self.nonempty)


SIGNALS: tuple[SignalSpec, ...] = (
    SignalSpec("up_count", "gpu_up", "count", DEVICE_COLS, DEVICE_KEY),
    SignalSpec("up_sum", "gpu_up", "sum", DEVICE_COLS, DEVICE_KEY),
    # Last sample time per series-hour: with the count it places the series' samples in the
    # hour, so overlapping duplicates (two jobs, an HA pair) are counted once (_dedup).
    SignalSpec("up_tlast", "gpu_up", "tlast", ("node",), DEVICE_KEY),
    SignalSpec("info_count", "gpu_info", "count", ("node", "uuid", "mig_mode", "vendor"),
               DEVICE_KEY),
    SignalSpec("util_sum", "gpu_utilization_ratio", "sum", ("node", "uuid"), DEVICE_KEY),
    SignalSpec("energy_last", "gpu_energy_joules_total", "last", ("node", "uuid"),
               DEVICE_KEY),
    SignalSpec("energy_min", "gpu_energy_joules_total", "min", ("node", "uuid"), DEVICE_KEY),
    # Power samples: the hour's energy where the counter is missing or reset (flagged).
    SignalSpec("power_sum", "gpu_power_watts", "sum", ("node", "uuid"), DEVICE_KEY),
    SignalSpec("mig_count", "gpu_mig_info", "count",
               ("node", "uuid", "mig_uuid", "profile", "slices", "parent_slices"), MIG_KEY),
    SignalSpec("mig_tlast", "gpu_mig_info", "tlast", ("node",), MIG_KEY),
    SignalSpec("migmem_max", "gpu_mig_memory_total_bytes", "max", ("node", "mig_uuid"),
               MIG_KEY),
    # GPM SM activity per MIG instance (Hopper+): the only SM figure MIG has. The family also
    # has per-GPU series (mig_uuid ''), which device facts do not use.
    SignalSpec("gpm_sum", "gpu_sm_active_ratio", "sum", ("node", "mig_uuid"), MIG_KEY,
               nonempty=("mig_uuid",)),
    SignalSpec("alloc_count", "gpu_container_allocation", "count", ALLOC_COLS, CONTAINER_KEY,
               True),
    SignalSpec("alloc_sum", "gpu_container_allocation", "sum", ALLOC_COLS, CONTAINER_KEY,
               True),
    SignalSpec("alloc_tlast", "gpu_container_allocation", "tlast", ("node",), CONTAINER_KEY),
    SignalSpec("cmem_sum", "gpu_container_memory_used_bytes", "sum", CONTAINER_COLS,
               CONTAINER_KEY),
    # peak memory in the hour, for rightsizing (metering/report/waste.py)
    SignalSpec("cmem_max", "gpu_container_memory_used_bytes", "max", CONTAINER_COLS,
               CONTAINER_KEY),
    SignalSpec("csm_sum", "gpu_container_sm_utilization_ratio", "sum", CONTAINER_COLS,
               CONTAINER_KEY),
    # Fractional grants (HAMi, gpushare): the memory / core fraction a container was granted.
    # A grant is fixed for the pod's life; max is also blind to duplicate series.
    SignalSpec("cmemfrac_max", "gpu_container_memory_fraction", "max", CONTAINER_COLS,
               CONTAINER_KEY),
    SignalSpec("ccorefrac_max", "gpu_container_core_fraction", "max", CONTAINER_COLS,
               CONTAINER_KEY),
)
FAMILIES: frozenset[str] = frozenset(s.family for s in SIGNALS)

# What one sample of each family can be (the exporter's contract, docs/metrics.md). A value
# outside, or not a finite number, is dropped and counted, never priced: it comes from a broken
# store or a writer that is not the exporter (NaN SM ratios once made a usage charge +244 %).
MAX_BYTES = float(2 ** 50)  # 1 PiB
VALUE_RANGE: dict[str, tuple[float, float]] = {
    "gpu_up": (0.0, 1.0),
    "gpu_info": (0.0, 1.0),
    "gpu_utilization_ratio": (0.0, 1.0),
    "gpu_energy_joules_total": (0.0, 1e15),  # 1 kW for 30 years is 1e12 J
    "gpu_power_watts": (0.0, 1e5),  # MAX_WATTS of the cost model; a GPU draws about 1e3
    "gpu_mig_info": (0.0, 1.0),
    "gpu_mig_memory_total_bytes": (0.0, MAX_BYTES),
    "gpu_sm_active_ratio": (0.0, 1.0),
    "gpu_container_allocation": (0.0, 1e4),  # units of a device held
    "gpu_container_memory_used_bytes": (0.0, MAX_BYTES),
    "gpu_container_sm_utilization_ratio": (0.0, 1.0),
    "gpu_container_memory_fraction": (0.0, 1.0),
    "gpu_container_core_fraction": (0.0, 1.0),
}
MAX_SAMPLES_PER_HOUR = 360_000.0  # one every 10 ms: more is not a scrape


def plausible(spec: SignalSpec, values: np.ndarray) -> np.ndarray:
    """Mask of hourly aggregates (`spec.func` over one series-hour) that plausible samples can
    give; what the Prometheus source checks, as it sees no raw sample."""
    lo, hi = VALUE_RANGE[spec.family]
    if spec.func == "tlast":
        lo, hi = -np.inf, np.inf
    elif spec.func == "count":
        lo, hi = 0.0, MAX_SAMPLES_PER_HOUR
    elif spec.func == "sum":
        lo, hi = lo * MAX_SAMPLES_PER_HOUR, hi * MAX_SAMPLES_PER_HOUR
    with np.errstate(invalid="ignore"):
        mask: np.ndarray = np.isfinite(values) & (values >= lo) & (values <= hi)
    return mask


def series_key(labels: Mapping[str, str]) -> str:
    """Canonical identity of a series (all labels but __name__), shared by both sources."""
    return "\x1f".join(f"{k}={v}" for k, v in sorted(labels.items()) if k != "__name__")


def series_labels(key: str) -> dict[str, str]:
    """The labels of a series_key (a label value holding the 0x1f separator cannot be told
    apart; no exporter label does)."""
    out: dict[str, str] = {}
    for part in key.split("\x1f") if key else ():
        name, _, value = part.partition("=")
        out[name] = value
    return out


@functools.lru_cache(maxsize=1 << 18)
def series_hash(key: str) -> int:
    """Stable 64-bit id of a series key: joins and tie-breaks on an integer, not a string.
    Cached: a series (and a fact row's key) recurs in every signal of its family and in
    every chunk."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little",
                          signed=True)


def build_signal(spec: SignalSpec, series: Sequence[Mapping[str, str]], sid: np.ndarray,
                 hour_s: np.ndarray, value: np.ndarray,
                 series_keys: Sequence[str] | None = None) -> pa.Table:
    """Arrow table for one signal: point i belongs to series[sid[i]], hour start hour_s[i].

    Per-series columns are dictionary-encoded with one dictionary entry per series (Arrow
    allows repeats) and `sid` as the indices: nothing is copied per point, and DuckDB reads
    such a column as a dictionary vector, converting each label (and each MAP) once per
    series instead of once per sample. `series_keys`: the series' series_key where the caller
    has them already."""
    idx = pa.array(sid.astype(np.int32, copy=False), pa.int32())
    skeys = (list(series_keys) if series_keys is not None
             else [series_key(m) for m in series])
    hashes = np.fromiter((series_hash(k) for k in skeys), np.int64, len(skeys))
    keys = np.fromiter((series_hash("\x1f".join(m.get(c, "") for c in spec.key))
                        for m in series), np.int64, len(series))

    def per_series(values: pa.Array) -> pa.DictionaryArray:
        return pa.DictionaryArray.from_arrays(idx, values)

    cols: dict[str, Any] = {
        "series": per_series(pa.array(skeys, pa.string())),
        "sh": pa.array(hashes).take(idx),
        # Low 32 bits of the id: a tie-break packed under the sample count in one BIGINT.
        "rank": pa.array(hashes & 0xFFFFFFFF).take(idx),
        "key": pa.array(keys).take(idx),
        "hour": pa.array(hour_s.astype(np.int64, copy=False) * 1_000_000, pa.timestamp("us")),
        "value": pa.array(value.astype(np.float64, copy=False), pa.float64()),
    }
    for col in spec.cols:
        cols[col] = per_series(pa.array([m.get(col, "") for m in series], pa.string()))
    if spec.pod_labels:
        labels = [sorted((k[len(POD_LABEL_PREFIX):], v) for k, v in m.items()
                         if k.startswith(POD_LABEL_PREFIX)) for m in series]
        cols["labels"] = per_series(pa.array(labels, pa.map_(pa.string(), pa.string())))
    return pa.table(cols)


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
    key = table.column("key")
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


def _set_column(table: pa.Table, name: str, col: pa.Array | pa.ChunkedArray) -> pa.Table:
    i = table.schema.get_field_index(name)
    return table.set_column(i, name, col) if i >= 0 else table.append_column(name, col)


def write_facts(con: Any, signals: Mapping[str, pa.Table], start: datetime, end: datetime,
                sample_interval: float | None = None,
                clusters: ClusterScope | None = None) -> FactCounts:
    """Replace the facts of hours [start, end) (naive UTC) of the clusters in `signals` (one
    table per SignalSpec name; missing ones count as empty) with what the signals hold. Only
    the clusters the chunk writes are touched: re-metering one cluster never changes
    another's hours. The caller owns the transaction."""
    scope = clusters or ClusterScope()
    sql = _sql()
    names = [s.name for s in SIGNALS]
    seen: set[str] = set()
    for spec in SIGNALS:
        table, found = _tag_clusters(signals.get(spec.name, empty_signal(spec)), scope)
        seen |= found
        con.register(spec.name, table)
    for name in sorted(seen):
        problem = cluster_name_problem(name)
        if problem:
            raise FactError(f"label {scope.label}: {problem}")
    written = {scope.name} if scope.label is None else seen
    try:
        for name, value in (("gl_start", start), ("gl_end", end)):
            con.execute(f"SET VARIABLE {name} = ?", [value])
        step_sql = dict(sql.steps)
        con.execute(step_sql["macros"])
        _check_int_labels(con)
        spacing: dict[tuple[str, str], float] = {}
        default = sample_interval
        if default is None:
            spacing, default = detect_spacing(con)
            if default is None:
                if con.execute(sql.query("pending")).fetchall()[0][0]:
                    raise FactError(
                        f"cannot detect the sample interval for {start:%Y-%m-%dT%H:%M}Z .. "
                        f"{end:%Y-%m-%dT%H:%M}Z: there are allocation or MIG samples but no "
                        "gpu_up samples; pass --sample-interval SECONDS")
                default = float(HOUR_S)  # nothing will use it
        con.register("spacing", pa.table({
            "cluster": pa.array([c for c, _ in spacing], pa.string()),
            "node": pa.array([n for _, n in spacing], pa.string()),
            "seconds": pa.array(list(spacing.values()), pa.float64())}))
        names.append("spacing")
        con.execute("SET VARIABLE gl_dflt = ?", [default])
        held = guards.held(con, start, end, written)
        delete_hours(con, start, end, written)
        single = len({c for c, _ in spacing}) <= 1
        counts = FactCounts(
            spacing={(n if single else f"{c}/{n}"): s for (c, n), s in spacing.items()}
            or {"*": default},
            clusters=tuple(sorted(written)), held=held)
        for step, body in sql.steps:
            rows = con.execute(body).fetchall()
            if step in _COUNTED:
                setattr(counts, step, int(rows[0][0]) if rows else 0)
        counts.written = guards.held(con, start, end, written)
        counts.duplicates = {(str(c), h): float(v) for c, h, v in
                             con.execute(sql.query("duplicates")).fetchall()}
        return counts
    finally:
        con.execute(sql.query("cleanup"))
        for name in names:
            con.unregister(name)


_COUNTED = frozenset(("device_hours", "mig_hours", "allocation_hours", "workload_hours",
                      "grant_hours"))
FACT_TABLES = ("device_hours", "mig_hours", "allocation_hours", "workload_hours", "grant_hours",
               "coverage")


def delete_hours(con: Any, start: datetime, end: datetime, clusters: Iterable[str]) -> None:
    """Delete the facts and coverage of hours [start, end) of these clusters only."""
    wanted = sorted(clusters)
    for table in FACT_TABLES:
        con.execute(f"DELETE FROM {table} WHERE hour >= ? AND hour < ? AND "
                    "list_contains(?, cluster)", [start, end, wanted])


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
