"""Hourly facts from per-series hourly aggregates ("signals"), computed and written in DuckDB.

Both sources (Prometheus range queries, OpenMetrics files) reduce raw samples to the same
signals: for one metric family and one function (count, sum, max, min, last), one row per
series per hour with that series' labels. Hour H holds the samples in (H, H+1h], which is
what a PromQL `<fn>_over_time(x[1h])` evaluated at H+1h sees. Everything after that is SQL
over Arrow tables, so the cost per fact row is DuckDB's, not Python's.

Metric names are the exporter's contract, spelled here as strings: metering never imports
the exporter.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np
import pyarrow as pa

from metering.errors import RefusedError

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
    SignalSpec("info_count", "gpu_info", "count", ("node", "uuid", "mig_mode"), DEVICE_KEY),
    SignalSpec("util_sum", "gpu_utilization_ratio", "sum", ("node", "uuid"), DEVICE_KEY),
    SignalSpec("energy_last", "gpu_energy_joules_total", "last", ("node", "uuid"),
               DEVICE_KEY),
    SignalSpec("energy_min", "gpu_energy_joules_total", "min", ("node", "uuid"), DEVICE_KEY),
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
    # peak memory in the hour, for rightsizing (metering/waste.py)
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


def series_hash(key: str) -> int:
    """Stable 64-bit id of a series key: joins and tie-breaks on an integer, not a string."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little",
                          signed=True)


def build_signal(spec: SignalSpec, series: Sequence[Mapping[str, str]], sid: np.ndarray,
                 hour_s: np.ndarray, value: np.ndarray) -> pa.Table:
    """Arrow table for one signal: point i belongs to series[sid[i]], hour start hour_s[i].

    Per-series columns are dictionary-encoded with one dictionary entry per series (Arrow
    allows repeats) and `sid` as the indices: nothing is copied per point, and DuckDB reads
    such a column as a dictionary vector, converting each label (and each MAP) once per
    series instead of once per sample."""
    idx = pa.array(sid.astype(np.int32, copy=False), pa.int32())
    skeys = [series_key(m) for m in series]
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
    spacing: dict[str, float] = field(default_factory=dict)  # node -> seconds per sample
    # hour -> sample-seconds of device, MIG and allocation series counted once instead of
    # twice or more (overlapping duplicates: two jobs, an HA pair, a store without dedup)
    duplicates: dict[datetime, float] = field(default_factory=dict)

    @property
    def duplicate_seconds(self) -> float:
        return sum(self.duplicates.values())

    @property
    def total(self) -> int:
        return (self.device_hours + self.mig_hours + self.allocation_hours
                + self.workload_hours + self.grant_hours)


# Seconds per sample for each series: its node's detected spacing, else the chunk's.
_DT = "coalesce(sp.seconds, $dflt)"
def _in(alias: str = "") -> str:
    col = f"{alias}.hour" if alias else "hour"
    return f"{col} >= $start AND {col} < $end"


_IN_CHUNK = _in()
# A key with several series in an hour sums them where they follow each other (exporter
# restart on a new instance, pod relabelled, replicas changed) and counts the time once where
# they overlap (one exporter scraped by two jobs, an HA pair in one store): each series' samples
# span [last - count x spacing, last], and the key holds the union of those spans, never more
# than its samples' seconds nor the hour. Integrals are scaled by held / sampled seconds, i.e.
# overlapping duplicates are averaged. No scrape label (job, instance, replica) is looked at.
def _union(count: str, tlast: str) -> str:
    return f"""
    SELECT c.hour, c.key, {_DT} AS dt, t.value - c.value * {_DT} AS s, t.value AS e
    FROM {count} c JOIN {tlast} t ON t.sh = c.sh AND t.hour = c.hour
    LEFT JOIN spacing sp ON sp.node = c.node
    WHERE {_in("c")}"""


def _held(ivs: str) -> str:
    """Per (hour, key): seconds covered by the union of the spans in CTE `ivs`, each run of
    overlapping spans in whole sample spacings (two copies scraped 7 s apart hold what one
    does, not 7 s more)."""
    return f"""
    SELECT hour, key, sum(floor((ge - gs) / dt + 1e-6) * dt) AS u FROM (
        SELECT hour, key, g, min(s) AS gs, max(e) AS ge, max(dt) AS dt FROM (
            SELECT hour, key, dt, s, e, sum(CASE WHEN prev IS NULL OR s > prev THEN 1 ELSE 0 END)
                OVER (PARTITION BY hour, key ORDER BY s, e ROWS UNBOUNDED PRECEDING) AS g
            FROM (SELECT hour, key, dt, s, e, max(e) OVER (PARTITION BY hour, key ORDER BY s, e
                      ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev FROM {ivs}))
        GROUP BY hour, key, g)
    GROUP BY hour, key"""


def _sec(raw: str, held: str) -> str:
    return f"least({raw}, coalesce({held}, {raw}), 3600.0)"


def _scale(raw: str, held: str) -> str:
    return f"({_sec(raw, held)} / {raw})"

# Every statement below aggregates per (hour, key) on integers: the series with the most
# samples (`w`, ties broken by its id) names the fact row, and only that series' string
# labels are read back, by a join on (series hash, hour). Hashing six strings per sample to
# group and join was most of the time of a chunk.
DEVICE_SQL = f"""
INSERT INTO device_hours (hour, node, gpu, uuid, model, mig_enabled, observed_seconds,
                          up_seconds, sm_active_seconds, energy_joules)
WITH up AS (
    SELECT c.hour, c.key, c.sh, c.value AS n,
           CAST(c.value AS BIGINT) * 4294967296 + c.rank AS w,
           coalesce(s.value, 0) AS ones, {_DT} AS dt
    FROM up_count c
    LEFT JOIN up_sum s ON s.sh = c.sh AND s.hour = c.hour
    LEFT JOIN spacing sp ON sp.node = c.node
    WHERE {_in("c")}),
dev AS (
    SELECT hour, key, arg_max(sh, w) AS sh, sum(n * dt) AS obs, sum(ones * dt) AS up
    FROM up GROUP BY hour, key),
ivs AS ({_union("up_count", "up_tlast")}),
held AS ({_held("ivs")}),
info AS (
    SELECT hour, key, bool_or(lower(mig_mode) IN ('enabled', 'true', '1', 'on')) AS mig
    FROM info_count WHERE {_IN_CHUNK} GROUP BY hour, key),
util AS (
    SELECT u.hour, u.key, sum(u.value * {_DT}) AS sm
    FROM util_sum u LEFT JOIN spacing sp ON sp.node = u.node
    WHERE {_in("u")} GROUP BY u.hour, u.key),
inc AS (
    -- Per series: last value of the hour minus last value of the hour before (a drop is a
    -- counter reset: count from zero); with no hour before, last minus first of the hour.
    SELECT l.hour, l.key,
           CASE WHEN p.value IS NULL THEN l.value - m.value
                WHEN l.value >= p.value THEN l.value - p.value
                ELSE l.value END AS j
    FROM energy_last l
    LEFT JOIN energy_last p ON p.sh = l.sh AND p.hour = l.hour - INTERVAL 1 HOUR
    LEFT JOIN energy_min m ON m.sh = l.sh AND m.hour = l.hour
    WHERE {_in("l")}),
energy AS (SELECT hour, key, sum(j) AS j FROM inc GROUP BY hour, key)
SELECT d.hour, c.node, c.gpu, c.uuid, c.model, coalesce(i.mig, false),
       {_sec("d.obs", "h.u")}, d.up * {_scale("d.obs", "h.u")},
       CASE WHEN coalesce(i.mig, false) THEN NULL
            ELSE u.sm * {_scale("d.obs", "h.u")} END,
       e.j * {_scale("d.obs", "h.u")}
FROM dev d
JOIN up_count c ON c.sh = d.sh AND c.hour = d.hour
LEFT JOIN held h ON h.hour = d.hour AND h.key = d.key
LEFT JOIN info i ON i.hour = d.hour AND i.key = d.key
LEFT JOIN util u ON u.hour = d.hour AND u.key = d.key
LEFT JOIN energy e ON e.hour = d.hour AND e.key = d.key
"""

MIG_SQL = f"""
INSERT INTO mig_hours (hour, node, uuid, mig_uuid, profile, slices, parent_slices,
                       memory_total_bytes, observed_seconds, sm_active_seconds)
WITH k AS (
    SELECT c.hour, c.key, arg_max(c.sh, CAST(c.value AS BIGINT) * 4294967296 + c.rank) AS sh,
           sum(c.value * {_DT}) AS sec
    FROM mig_count c
    LEFT JOIN spacing sp ON sp.node = c.node WHERE {_in("c")}
    GROUP BY c.hour, c.key),
ivs AS ({_union("mig_count", "mig_tlast")}),
held AS ({_held("ivs")}),
mem AS (SELECT hour, key, max(value) AS v FROM migmem_max WHERE {_IN_CHUNK}
        GROUP BY hour, key),
gpm AS (
    -- NULL (no row) when the hour has no GPM sample for the instance: unknown, not idle.
    SELECT g.hour, g.key, sum(g.value * {_DT}) AS v
    FROM gpm_sum g LEFT JOIN spacing sp ON sp.node = g.node
    WHERE {_in("g")} AND g.mig_uuid <> '' GROUP BY g.hour, g.key)
SELECT k.hour, c.node, c.uuid, c.mig_uuid, c.profile, CAST(c.slices AS INTEGER),
       CAST(c.parent_slices AS INTEGER), mem.v,
       {_sec("k.sec", "h.u")}, gpm.v * {_scale("k.sec", "h.u")}
FROM k
JOIN mig_count c ON c.sh = k.sh AND c.hour = k.hour
LEFT JOIN held h ON h.hour = k.hour AND h.key = k.key
LEFT JOIN mem ON mem.hour = k.hour AND mem.key = k.key
LEFT JOIN gpm ON gpm.hour = k.hour AND gpm.key = k.key
"""


def _usage(view: str) -> str:
    return (f"SELECT x.hour, x.key, sum(x.value * {_DT}) AS v FROM {view} x "
            f"LEFT JOIN spacing sp ON sp.node = x.node WHERE {_in('x')} "
            f"GROUP BY x.hour, x.key")


ALLOC_SQL = f"""
INSERT INTO allocation_hours (hour, node, namespace, pod, container, uuid, mig_uuid, resource,
                              sharing, replicas, units, allocated_seconds,
                              memory_byte_seconds, sm_seconds, labels)
WITH a AS (
    SELECT c.hour, c.key, c.sh, c.value AS n,
           CAST(c.value AS BIGINT) * 4294967296 + c.rank AS w,
           coalesce(s.value, 0) AS u, c.value * {_DT} AS sec
    FROM alloc_count c
    LEFT JOIN alloc_sum s ON s.sh = c.sh AND s.hour = c.hour
    LEFT JOIN spacing sp ON sp.node = c.node
    WHERE {_in("c")}),
k AS (
    SELECT hour, key, arg_max(sh, w) AS sh, sum(u) / sum(n) AS units, sum(sec) AS sec
    FROM a GROUP BY hour, key),
ivs AS ({_union("alloc_count", "alloc_tlast")}),
held AS ({_held("ivs")}),
mem AS ({_usage("cmem_sum")}),
sm AS ({_usage("csm_sum")})
SELECT k.hour, c.node, c.namespace, c.pod, c.container, c.uuid, c.mig_uuid, c.resource,
       c.sharing, CAST(c.replicas AS INTEGER), k.units, {_sec("k.sec", "h.u")},
       coalesce(mem.v, 0) * {_scale("k.sec", "h.u")},
       -- NULL without samples (MIG: NVML has no per-process SM there): unknown, not idle.
       sm.v * {_scale("k.sec", "h.u")}, c.labels
FROM k
JOIN alloc_count c ON c.sh = k.sh AND c.hour = k.hour
LEFT JOIN held h ON h.hour = k.hour AND h.key = k.key
LEFT JOIN mem ON mem.hour = k.hour AND mem.key = k.key
LEFT JOIN sm ON sm.hour = k.hour AND sm.key = k.key
"""

# Per allocation fact: the pod's owner (from the series that names the fact row) and the
# peak memory of the hour (max over duplicate series too: a duplicate cannot raise a peak).
WORKLOAD_SQL = f"""
INSERT INTO workload_hours (hour, namespace, pod, container, uuid, mig_uuid, owner_kind,
                            owner_name, memory_max_bytes)
WITH k AS (
    SELECT c.hour, c.key, arg_max(c.sh, CAST(c.value AS BIGINT) * 4294967296 + c.rank) AS sh
    FROM alloc_count c WHERE {_in("c")} GROUP BY c.hour, c.key),
mx AS (SELECT hour, key, max(value) AS v FROM cmem_max WHERE {_IN_CHUNK} GROUP BY hour, key)
SELECT k.hour, c.namespace, c.pod, c.container, c.uuid, c.mig_uuid, c.owner_kind,
       c.owner_name, mx.v
FROM k
JOIN alloc_count c ON c.sh = k.sh AND c.hour = k.hour
LEFT JOIN mx ON mx.hour = k.hour AND mx.key = k.key
"""

# Per allocation fact with a fractional grant: the granted memory and core fractions (the
# largest seen in the hour; NULL where the grant gives none, e.g. no core limit).
GRANT_SQL = f"""
INSERT INTO grant_hours (hour, namespace, pod, container, uuid, mig_uuid, memory_fraction,
                         core_fraction)
WITH k AS (
    SELECT c.hour, c.key, arg_max(c.sh, CAST(c.value AS BIGINT) * 4294967296 + c.rank) AS sh
    FROM alloc_count c WHERE {_in("c")} GROUP BY c.hour, c.key),
m AS (SELECT hour, key, max(value) AS v FROM cmemfrac_max WHERE {_IN_CHUNK}
      GROUP BY hour, key),
cf AS (SELECT hour, key, max(value) AS v FROM ccorefrac_max WHERE {_IN_CHUNK}
       GROUP BY hour, key)
SELECT k.hour, c.namespace, c.pod, c.container, c.uuid, c.mig_uuid,
       -- clamped to 0-1; greatest() would turn a missing figure (NULL) into 0
       CASE WHEN m.v IS NOT NULL THEN least(greatest(m.v, 0), 1) END,
       CASE WHEN cf.v IS NOT NULL THEN least(greatest(cf.v, 0), 1) END
FROM k
JOIN alloc_count c ON c.sh = k.sh AND c.hour = k.hour
LEFT JOIN m ON m.hour = k.hour AND m.key = k.key
LEFT JOIN cf ON cf.hour = k.hour AND cf.key = k.key
WHERE m.v IS NOT NULL OR cf.v IS NOT NULL
"""

# Integer labels that pricing divides by: a bad value is an error, never a silent 0.
_INT_LABELS = (("mig_count", "gpu_mig_info", ("slices", "parent_slices")),
               ("alloc_count", "gpu_container_allocation", ("replicas",)))


def _check_int_labels(con: Any, params: dict[str, Any]) -> None:
    for view, family, labels in _INT_LABELS:
        for label in labels:
            rows = con.execute(
                f"SELECT series, {label} FROM {view} WHERE {_IN_CHUNK} AND "
                f"coalesce(try_cast({label} AS INTEGER), 0) < 1 LIMIT 1",
                {"start": params["start"], "end": params["end"]}).fetchall()
            for row in rows:
                series = "{" + row[0].replace("\x1f", ", ") + "}"
                raise FactError(f"{family}{series}: label {label}: expected a whole number "
                                f">= 1, got {row[1]!r}")


def detect_spacing(con: Any, start: datetime, end: datetime
                   ) -> tuple[dict[str, float], float | None]:
    """Seconds between the exporter's samples, per node: 3600 / the most common number of
    gpu_up samples a series holds in an hour of the chunk (full hours dominate; partial hours
    and jitter of one sample do not move the mode). Also the mode over all nodes, for series
    on nodes without gpu_up."""
    rows = con.execute(
        f"SELECT node, value AS n, count(*) AS k FROM up_count "
        f"WHERE {_IN_CHUNK} AND value > 0 GROUP BY node, value",
        {"start": start, "end": end}).fetchall()
    per_node: dict[str, tuple[int, float]] = {}
    overall: dict[float, int] = {}
    for node, n, k in rows:
        if (k, n) > per_node.get(node, (0, 0.0)):
            per_node[node] = (k, n)
        overall[n] = overall.get(n, 0) + k
    spacing = {node: HOUR_S / n for node, (_, n) in per_node.items()}
    default = HOUR_S / max(overall, key=lambda n: (overall[n], n)) if overall else None
    return spacing, default


def write_facts(con: Any, signals: Mapping[str, pa.Table], start: datetime, end: datetime,
                sample_interval: float | None = None) -> FactCounts:
    """Insert the facts for hours [start, end) (naive UTC) from `signals` (one table per
    SignalSpec name; missing ones count as empty). The caller owns the transaction and has
    already deleted those hours."""
    names = [s.name for s in SIGNALS]
    for spec in SIGNALS:
        con.register(spec.name, signals.get(spec.name, empty_signal(spec)))
    try:
        params: dict[str, Any] = {"start": start, "end": end}
        _check_int_labels(con, params)
        spacing: dict[str, float] = {}
        default = sample_interval
        if default is None:
            spacing, detected = detect_spacing(con, start, end)
            default = detected
            if default is None:
                pending = con.execute(
                    f"SELECT (SELECT count(*) FROM alloc_count WHERE {_IN_CHUNK}) + "
                    f"(SELECT count(*) FROM mig_count WHERE {_IN_CHUNK})", params).fetchall()
                if pending[0][0]:
                    raise FactError(
                        f"cannot detect the sample interval for {start:%Y-%m-%dT%H:%M}Z .. "
                        f"{end:%Y-%m-%dT%H:%M}Z: there are allocation or MIG samples but no "
                        "gpu_up samples; pass --sample-interval SECONDS")
                default = float(HOUR_S)  # nothing will use it
        con.register("spacing", pa.table({
            "node": pa.array(list(spacing), pa.string()),
            "seconds": pa.array(list(spacing.values()), pa.float64())}))
        names.append("spacing")
        params["dflt"] = default
        counts = FactCounts(spacing=spacing or {"*": default})
        for sql, attr in ((DEVICE_SQL, "device_hours"), (MIG_SQL, "mig_hours"),
                          (ALLOC_SQL, "allocation_hours"), (WORKLOAD_SQL, "workload_hours"),
                          (GRANT_SQL, "grant_hours")):
            # DuckDB refuses named parameters a statement does not use
            used = {k: v for k, v in params.items() if f"${k}" in sql}
            rows = con.execute(sql, used).fetchall()
            setattr(counts, attr, int(rows[0][0]) if rows else 0)
        counts.duplicates = _duplicates(con, params)
        return counts
    finally:
        for name in names:
            con.unregister(name)


def _duplicates(con: Any, params: dict[str, Any]) -> dict[datetime, float]:
    """Per hour: sample-seconds the sources hold minus those the facts kept, over device, MIG
    and allocation series, i.e. what de-duplication removed."""
    def raw(view: str) -> str:
        return (f"SELECT c.hour, c.value * {_DT} AS s FROM {view} c "
                f"LEFT JOIN spacing sp ON sp.node = c.node WHERE {_in('c')}")

    def kept(table: str, col: str) -> str:
        return f"SELECT hour, {col} AS s FROM {table} WHERE {_IN_CHUNK}"

    rows = con.execute(
        f"""SELECT hour, sum(s) FROM (
                {raw("up_count")} UNION ALL {raw("mig_count")} UNION ALL {raw("alloc_count")}
                UNION ALL SELECT hour, -s FROM ({kept("device_hours", "observed_seconds")})
                UNION ALL SELECT hour, -s FROM ({kept("mig_hours", "observed_seconds")})
                UNION ALL SELECT hour, -s FROM ({kept("allocation_hours", "allocated_seconds")}))
            GROUP BY hour HAVING sum(s) > 0.5 ORDER BY hour""",
        {k: params[k] for k in ("start", "end", "dflt")}).fetchall()
    return {h: float(v) for h, v in rows}


FACT_TABLES = ("device_hours", "mig_hours", "allocation_hours", "workload_hours", "grant_hours",
               "coverage")


def delete_hours(con: Any, start: datetime, end: datetime) -> None:
    for table in FACT_TABLES:
        con.execute(f"DELETE FROM {table} WHERE hour >= $start AND hour < $end",
                    {"start": start, "end": end})


def write_coverage(con: Any, start: datetime, end: datetime, source: str,
                   ingested_at: datetime, duplicates: Mapping[datetime, float] | None = None,
                   dropped: Mapping[datetime, int] | None = None) -> list[datetime]:
    """One coverage row per hour of [start, end), with the sample-seconds de-duplication
    removed and the values dropped as not plausible; returns the hours without device data."""
    extra = pa.table({
        "hour": pa.array([*(duplicates or {}), *(dropped or {})], pa.timestamp("us")),
        "dup": pa.array([*(duplicates or {}).values(), *(0.0 for _ in dropped or {})],
                        pa.float64()),
        "bad": pa.array([*(0 for _ in duplicates or {}), *(dropped or {}).values()],
                        pa.int64())})
    con.register("_coverage_extra", extra)
    try:
        con.execute(
            """INSERT INTO coverage (hour, source, devices, ingested_at, duplicate_seconds,
                                     dropped_values)
               SELECT h.hour, $source, coalesce(d.n, 0), $now, coalesce(x.dup, 0),
                      coalesce(x.bad, 0)
               FROM (SELECT unnest(generate_series($start, $end - INTERVAL 1 HOUR,
                                                   INTERVAL 1 HOUR)) AS hour) h
               LEFT JOIN (SELECT hour, count(*) AS n FROM device_hours
                          WHERE hour >= $start AND hour < $end GROUP BY hour) d
                      ON d.hour = h.hour
               LEFT JOIN (SELECT hour, sum(dup) AS dup, sum(bad) AS bad FROM _coverage_extra
                          GROUP BY hour) x ON x.hour = h.hour""",
            {"start": start, "end": end, "source": source, "now": ingested_at})
    finally:
        con.unregister("_coverage_extra")
    rows = con.execute("SELECT hour FROM coverage WHERE hour >= $start AND hour < $end "
                       "AND devices = 0 ORDER BY hour", {"start": start, "end": end}).fetchall()
    return [r[0] for r in rows]
