"""What metering asks a source for: the signals (one metric family reduced by one function
per series and hour), what a sample of each family can be, and a series' identity. A leaf
module: the sources (metering.prometheus_source, metering.openmetrics_source), the query planner
and the fact writer (metering.facts) all read it; it imports none of them.

Metric names are the exporter's contract, spelled here as strings: metering never imports
the exporter.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

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

# Recorded hourly series (docs/recording-rules.md, "Metering series"): one recording rule per
# signal, `gpu_ledger:<signal>:hour`. Whenever in the clock hour [E, E+1h) the evaluator runs,
# the rule evaluates the signal at E alone (a subquery's steps are multiples of its step since
# the epoch), so its point holds what the raw query at E gives: the hour before E. With it the
# rule records a marker series (label MARK_LABEL = the signal) whose value is the start of
# the hour it evaluated; metering reads a signal's recorded series for a chunk only where
# every hour has its marker with the right value, else it asks for the raw family
# (metering.recorded).
RECORDED_PREFIX = "gpu_ledger:"
RECORDED_SUFFIX = ":hour"
MARK_LABEL = "metering_signal"
# The signal's window: (t-1h, t] on Prometheus 2 (both ends included), what the raw path asks
# Prometheus 2 and VictoriaMetrics for (metering.prometheus_source.window); on Prometheus 3 and
# VictoriaMetrics (left-open) it misses a sample exactly 1 ms after the hour, as the raw path
# does on VictoriaMetrics. The subquery's range holds exactly one multiple of 1h for every t on
# Prometheus 2, and for every t but one millisecond before the hour on left-open stores (no
# point then, and no marker: the chunk is read raw).
RECORD_WINDOW = "3599999ms"
# The read at E: the last point recorded in [E, E+1h) (left-open; Prometheus 2 adds E-1ms,
# whose marker would name the hour before and so refuse the chunk).
RECORDED_READ = "[1h] offset -3599999ms"


@dataclass(frozen=True)
class SignalSpec:
    name: str  # the DuckDB view name the fact SQL reads
    family: str  # sample name as Prometheus stores it
    func: str  # count | sum | max | min | last | tlast (time of the hour's last sample, s)
    # Labels kept as columns ('' where a series lacks one): those metering/sql/facts.sql reads
    # from this signal, no more (each is built per series and chunk).
    cols: tuple[str, ...]
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

    @property
    def recorded(self) -> str:
        """Name of the signal's recorded hourly series."""
        return f"{RECORDED_PREFIX}{self.name}{RECORDED_SUFFIX}"

    def record_expr(self, metricsql: bool = False) -> str:
        """The recording rule (evaluated once an hour, at any minute): the signal of the last
        whole clock hour for every series, all labels kept, or the hour's marker."""
        at_hour = f"[{RECORD_WINDOW}:1h]"
        inner = self.promql(RECORD_WINDOW, metricsql=metricsql)
        return (f"last_over_time(({inner}){at_hour})\n"
                f"or label_replace(last_over_time((vector(time()) - 3600){at_hour}), "
                f'"{MARK_LABEL}", "{self.name}", "", "")')

    def recorded_selector(self, match: str = "") -> str:
        """The signal's recorded series (not its marker) with `match` (more matchers)."""
        matchers = [f'{MARK_LABEL}=""', *(f'{label}!=""' for label in self.nonempty)]
        matchers += [match] if match else []
        return f"{self.recorded}{{{','.join(matchers)}}}"

    def recorded_promql(self, match: str = "") -> str:
        """Range query (step 1h) of the recorded series: at E, what `promql` gives at E."""
        return f"last_over_time({self.recorded_selector(match)}{RECORDED_READ})"

    def keeps(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(label) for label in self.nonempty)


SIGNALS: tuple[SignalSpec, ...] = (
    SignalSpec("up_count", "gpu_up", "count", DEVICE_COLS, DEVICE_KEY),
    SignalSpec("up_sum", "gpu_up", "sum", (), DEVICE_KEY),
    # Last sample time per series-hour: with the count it places the series' samples in the
    # hour, so overlapping duplicates (two jobs, an HA pair) are counted once (_dedup).
    SignalSpec("up_tlast", "gpu_up", "tlast", (), DEVICE_KEY),
    SignalSpec("info_count", "gpu_info", "count", ("mig_mode", "vendor"), DEVICE_KEY),
    SignalSpec("util_sum", "gpu_utilization_ratio", "sum", ("node",), DEVICE_KEY),
    SignalSpec("energy_last", "gpu_energy_joules_total", "last", (), DEVICE_KEY),
    SignalSpec("energy_min", "gpu_energy_joules_total", "min", (), DEVICE_KEY),
    # Power samples: the hour's energy where the counter is missing or reset (flagged).
    SignalSpec("power_sum", "gpu_power_watts", "sum", ("node",), DEVICE_KEY),
    SignalSpec("mig_count", "gpu_mig_info", "count",
               ("node", "uuid", "mig_uuid", "profile", "slices", "parent_slices"), MIG_KEY),
    SignalSpec("mig_tlast", "gpu_mig_info", "tlast", (), MIG_KEY),
    SignalSpec("migmem_max", "gpu_mig_memory_total_bytes", "max", (), MIG_KEY),
    # GPM SM activity per MIG instance (Hopper+): the only SM figure MIG has. The family also
    # has per-GPU series (mig_uuid ''), which device facts do not use.
    SignalSpec("gpm_sum", "gpu_sm_active_ratio", "sum", ("node", "mig_uuid"), MIG_KEY,
               nonempty=("mig_uuid",)),
    SignalSpec("alloc_count", "gpu_container_allocation", "count", ALLOC_COLS, CONTAINER_KEY,
               True),
    SignalSpec("alloc_sum", "gpu_container_allocation", "sum", (), CONTAINER_KEY),
    SignalSpec("alloc_tlast", "gpu_container_allocation", "tlast", (), CONTAINER_KEY),
    SignalSpec("cmem_sum", "gpu_container_memory_used_bytes", "sum", ("node",),
               CONTAINER_KEY),
    # peak memory in the hour, for rightsizing (metering/report/waste.py)
    SignalSpec("cmem_max", "gpu_container_memory_used_bytes", "max", (), CONTAINER_KEY),
    SignalSpec("csm_sum", "gpu_container_sm_utilization_ratio", "sum", ("node",),
               CONTAINER_KEY),
    # Fractional grants (HAMi, gpushare): the memory / core fraction a container was granted.
    # A grant is fixed for the pod's life; max is also blind to duplicate series.
    SignalSpec("cmemfrac_max", "gpu_container_memory_fraction", "max", (), CONTAINER_KEY),
    SignalSpec("ccorefrac_max", "gpu_container_core_fraction", "max", (), CONTAINER_KEY),
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
