"""Waste: rightsizing and idle-holder recommendations from a month of facts.

Per workload (the pod's controller from its owner references: Deployment, StatefulSet, Job, ...;
a pod without one is its own workload), from the hourly facts:

- whole-GPU holders whose peak memory and p95 SM activity fit a smaller unit get the smallest
  MIG profile of their GPU model that fits (catalogue: metering/data/mig-profiles.yaml), else
  the smallest time-slicing / MPS share that fits;
- MIG holders that outgrow or underuse their profile get the next profile up or down;
- idle holders: workloads that held devices with no GPU process (peak memory 0 all hour) for
  at least `idle_hours` device-hours.

Every recommendation carries its evidence and a confidence; none is made from fewer than
`min_hours` observed hours or where a figure it needs is unknown (SM activity of MIG without
GPM). Recommendations read the ledger and never write it: they cannot change a bill.
"""

from __future__ import annotations

import enum
import fnmatch
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from functools import cache
from importlib import resources
from typing import Any

import yaml

from metering.costmodel import CostModel

_GB = Decimal(10) ** 9
_Q6 = Decimal("0.000001")
_ZERO = Decimal(0)


@dataclass(frozen=True)
class Settings:
    min_hours: int = 72  # no recommendation from fewer hours observed
    idle_hours: int = 24  # device-hours held with no GPU process before a workload is flagged
    headroom: Decimal = Decimal("0.9")  # use at most this share of a unit's memory and SM
    outgrow: Decimal = Decimal("0.95")  # a MIG instance at this share of memory or SM is full
    share_replicas: tuple[int, ...] = (2, 3, 4)  # time-slicing / MPS shares considered
    confident_hours: int = 168  # a week of observations with coverage >= 90 %: high confidence


@dataclass(frozen=True)
class Profile:
    name: str
    slices: int
    memory_gb: Decimal


@dataclass(frozen=True)
class GpuUnits:
    """What a GPU model can be cut into."""

    memory_gb: Decimal
    slices: int
    profiles: tuple[Profile, ...]  # smallest first

    def index(self, name: str) -> int | None:
        return next((i for i, p in enumerate(self.profiles) if p.name == name), None)


@cache
def catalogue() -> tuple[tuple[tuple[str, ...], GpuUnits], ...]:
    text = (resources.files("metering") / "data" / "mig-profiles.yaml").read_text("utf-8")
    out = []
    for entry in yaml.safe_load(text)["gpus"]:
        profiles = tuple(Profile(p["name"], int(p["slices"]), Decimal(str(p["memory_gb"])))
                         for p in entry["profiles"])
        units = GpuUnits(Decimal(str(entry["memory_gb"])), int(entry["slices"]), profiles)
        out.append((tuple(entry["models"]), units))
    return tuple(out)


def units_for(model: str) -> GpuUnits | None:
    for patterns, units in catalogue():
        if any(fnmatch.fnmatchcase(model, p) for p in patterns):
            return units
    return None


class Kind(enum.Enum):
    TO_MIG = "whole GPU -> MIG"
    TO_SHARE = "whole GPU -> shared"
    MIG_DOWN = "MIG profile down"
    MIG_UP = "MIG profile up"
    IDLE = "idle holder"


@dataclass(frozen=True)
class Evidence:
    hours: int  # hours in which the workload ran a process on the unit (busy hours)
    device_hours: Decimal  # busy device-hours held (replicas add up)
    peak_memory_gb: Decimal | None
    p95_memory_gb: Decimal | None
    p95_sm: Decimal | None  # of the unit held: the whole GPU, or the MIG instance
    coverage: Decimal  # share of busy device-hours with both memory and SM figures
    idle_device_hours: int  # device-hours held with no GPU process
    all_hours: int = 0  # hours in which the workload held the unit, busy or idle


@dataclass(frozen=True)
class Recommendation:
    kind: Kind
    team: str
    cluster: str  # the cluster the workload runs in (ledger cluster name)
    namespace: str
    owner_kind: str
    owner_name: str
    model: str
    current: str  # what it holds: "whole GPU", "MIG 3g.40gb"
    proposed: str  # "MIG 1g.10gb", "1/4 of a GPU (time-slicing or MPS)", "release idle GPUs"
    # what the hours it is about cost in the month (without shared-out idle): the busy
    # device-hours for a rightsizing, the idle ones for an idle holder
    cost: Decimal
    saving: Decimal  # in the month; negative: the change costs more (a MIG holder that is full)
    confidence: str  # high | medium | low
    evidence: Evidence

    @property
    def workload(self) -> str:
        return f"{self.cluster}/{self.namespace}/{self.owner_kind}/{self.owner_name}"


# Per device-hour (one hour, device or MIG instance a workload held) of one slice [start,
# end) of the facts and charges: the workload's containers there are summed (peak memory adds
# up: an upper bound of the unit's peak). Computed a day at a time into a temporary table, so
# the joins' working set is a day's rows whatever the month's size.
_DEVICE_HOURS = """
WITH a AS (
    SELECT a.hour, a.cluster, a.namespace, a.pod, a.container, a.uuid, a.mig_uuid, a.sharing,
           coalesce(nullif(w.owner_kind, ''), 'Pod') AS owner_kind,
           coalesce(nullif(w.owner_name, ''), a.pod) AS owner_name,
           d.model, least(a.allocated_seconds, 3600) AS held_s, a.sm_seconds,
           w.memory_max_bytes AS mem_max,
           coalesce(mh.profile, '') AS profile,
           mh.sm_active_seconds / nullif(mh.observed_seconds, 0) AS inst_sm
    FROM allocation_hours a
    JOIN device_hours d ON d.hour = a.hour AND d.cluster = a.cluster AND d.uuid = a.uuid
         AND d.hour >= $start AND d.hour < $end
    LEFT JOIN workload_hours w ON w.hour = a.hour AND w.cluster = a.cluster
         AND w.namespace = a.namespace AND w.pod = a.pod AND w.container = a.container
         AND w.uuid = a.uuid AND w.mig_uuid = a.mig_uuid
         AND w.hour >= $start AND w.hour < $end
    LEFT JOIN mig_hours mh ON a.mig_uuid <> '' AND mh.hour = a.hour AND mh.cluster = a.cluster
         AND mh.mig_uuid = a.mig_uuid AND mh.hour >= $start AND mh.hour < $end
    WHERE a.hour >= $start AND a.hour < $end AND a.allocated_seconds > 0
), c AS (
    SELECT hour, cluster, namespace, pod, container, uuid, mig_uuid, any_value(team) AS team,
           sum(cost - idle_share) AS cost
    FROM charges WHERE hour >= $start AND hour < $end AND pod <> ''
    GROUP BY hour, cluster, namespace, pod, container, uuid, mig_uuid
), dh AS (
    SELECT a.cluster, a.namespace, a.owner_kind, a.owner_name, a.model, a.sharing, a.profile,
           a.hour, a.uuid, a.mig_uuid,
           max(a.held_s) / 3600.0 AS held_h,
           -- unknown (NULL) as soon as one container's figure is unknown
           CASE WHEN count(a.mem_max) = count(*) THEN sum(a.mem_max) END AS mem_max,
           CASE WHEN a.mig_uuid <> '' THEN any_value(a.inst_sm)
                WHEN count(a.sm_seconds) = count(*)
                    THEN least(sum(a.sm_seconds) / nullif(max(a.held_s), 0), 1.0) END AS sm,
           max(c.team) AS team, coalesce(sum(c.cost), 0) AS cost
    FROM a
    LEFT JOIN c ON c.hour = a.hour AND c.cluster = a.cluster AND c.namespace = a.namespace
         AND c.pod = a.pod AND c.container = a.container AND c.uuid = a.uuid
         AND c.mig_uuid = a.mig_uuid
    GROUP BY a.namespace, a.owner_kind, a.owner_name, a.model, a.sharing, a.profile, a.hour,
             a.cluster, a.uuid, a.mig_uuid
)
-- A device-hour with peak memory 0 and no SM activity ran no GPU process: it is idle
-- holding, priced apart; rightsizing looks at the other (busy) device-hours only, so the
-- two kinds never count the same hour twice.
SELECT cluster, namespace, owner_kind, owner_name, model, sharing, profile, hour, held_h,
       mem_max, sm, team, cost, coalesce(mem_max = 0 AND coalesce(sm, 0) = 0, false) AS idle
FROM dh
"""
_TABLE = "waste_device_hours"
_SLICE_HOURS = 24
# A workload is its controller within one cluster: the same namespace and Deployment name in
# two clusters are two workloads, each sized by its own hours and priced by its cluster's rules.
_WORKLOAD = "cluster, namespace, owner_kind, owner_name, model, sharing, profile"


def _p95(column: str) -> str:
    """Nearest-rank 95th percentile of the busy device-hours' `column` per workload: what
    DuckDB's quantile_disc(column, 0.95) gives (the value at 1-based rank max(1, n -
    floor(n - n * 0.95)), in double arithmetic as DuckDB computes it), from a histogram of
    the values and a running count. quantile_disc holds every value of a group in memory and
    cannot spill; a grouped count and a window can."""
    return f"""
    SELECT {_WORKLOAD}, min(v) FILTER (WHERE below < rank AND rank <= upto) AS p95
    FROM (SELECT *, upto - k AS below,
                 greatest(1, n - floor(n - n * 0.95::DOUBLE)) AS rank
          FROM (SELECT *, sum(k) OVER (PARTITION BY {_WORKLOAD} ORDER BY v) AS upto,
                       sum(k) OVER (PARTITION BY {_WORKLOAD}) AS n
                FROM (SELECT {_WORKLOAD}, {column} AS v, count(*) AS k FROM {_TABLE}
                      WHERE NOT idle AND {column} IS NOT NULL GROUP BY ALL)))
    GROUP BY ALL"""


# Per workload x GPU model x unit held, from the device-hours above. Quantiles are nearest-rank
# over device-hours, so every figure is one that was observed. Only grouped aggregates and
# windows (both spill to disk under the memory limit): no holistic aggregate (quantile, mode,
# DISTINCT), which would hold a month of device-hours in memory.
_SQL = f"""
WITH g AS (
    SELECT {_WORKLOAD},
           coalesce(sum(held_h) FILTER (WHERE NOT idle), 0) AS device_hours,
           max(mem_max) FILTER (WHERE NOT idle) AS peak_mem,
           coalesce(count(*) FILTER (WHERE NOT idle AND mem_max IS NOT NULL AND sm IS NOT NULL)
                    / nullif(count(*) FILTER (WHERE NOT idle), 0), 0) AS coverage,
           count(*) FILTER (WHERE idle) AS idle_dh,
           coalesce(sum(cost) FILTER (WHERE NOT idle), 0) AS cost,
           coalesce(sum(cost) FILTER (WHERE idle), 0) AS idle_cost
    FROM {_TABLE} GROUP BY ALL
), hours AS (  -- hours the workload held a unit, and those in which one was busy
    SELECT {_WORKLOAD}, count(*) FILTER (WHERE busy) AS hours, count(*) AS all_hours
    FROM (SELECT {_WORKLOAD}, hour, bool_or(NOT idle) AS busy FROM {_TABLE} GROUP BY ALL)
    GROUP BY ALL
), team AS (  -- the team of most of its device-hours (ties: the first name)
    SELECT {_WORKLOAD}, team FROM (
        SELECT *, row_number() OVER (PARTITION BY {_WORKLOAD} ORDER BY k DESC, team) AS r
        FROM (SELECT {_WORKLOAD}, team, count(*) AS k FROM {_TABLE}
              WHERE team IS NOT NULL GROUP BY ALL))
    WHERE r = 1
), mem AS ({_p95("mem_max")}
), sm AS ({_p95("sm")}
)
SELECT {_WORKLOAD}, team.team, hours.hours, g.device_hours, g.peak_mem, mem.p95 AS p95_mem,
       sm.p95 AS p95_sm, g.coverage, g.idle_dh, hours.all_hours, g.cost, g.idle_cost
FROM g JOIN hours USING ({_WORKLOAD})
LEFT JOIN team USING ({_WORKLOAD})
LEFT JOIN mem USING ({_WORKLOAD})
LEFT JOIN sm USING ({_WORKLOAD})
ORDER BY ALL
"""


@dataclass(frozen=True)
class _Group:
    cluster: str
    namespace: str
    owner_kind: str
    owner_name: str
    model: str
    sharing: str
    profile: str
    team: str
    evidence: Evidence
    cost: Decimal
    idle_cost: Decimal


def _dec(value: Any, q: Decimal = _Q6) -> Decimal | None:
    return None if value is None else Decimal(str(value)).quantize(q)


def _groups(con: Any, start: datetime, end: datetime) -> list[_Group]:
    con.execute(f"CREATE OR REPLACE TEMP TABLE {_TABLE} AS {_DEVICE_HOURS} LIMIT 0",
                {"start": start, "end": start})
    try:
        for a in range(0, -(-int((end - start).total_seconds()) // 3600), _SLICE_HOURS):
            lo = start + timedelta(hours=a)
            hi = min(end, lo + timedelta(hours=_SLICE_HOURS))
            con.execute(f"INSERT INTO {_TABLE} {_DEVICE_HOURS}", {"start": lo, "end": hi})
        rows = con.execute(_SQL).fetchall()
    finally:
        con.execute(f"DROP TABLE IF EXISTS {_TABLE}")
    out = []
    for (cluster, ns, okind, oname, model, sharing, profile, team, hours, dev_h, peak, p95m, p95s,
         coverage, idle_dh, all_hours, cost, idle_cost) in rows:
        ev = Evidence(
            hours=int(hours), device_hours=_dec(dev_h) or _ZERO,
            peak_memory_gb=None if peak is None else _dec(Decimal(str(peak)) / _GB),
            p95_memory_gb=None if p95m is None else _dec(Decimal(str(p95m)) / _GB),
            p95_sm=_dec(p95s), coverage=_dec(coverage) or _ZERO, idle_device_hours=int(idle_dh),
            all_hours=int(all_hours),
        )
        out.append(_Group(cluster, ns, okind, oname, model, sharing, profile, team or "", ev,
                          Decimal(cost or 0), Decimal(idle_cost or 0)))
    return out


def _confidence(ev: Evidence, s: Settings) -> str:
    if ev.hours >= s.confident_hours and ev.coverage >= Decimal("0.9"):
        return "high"
    if ev.coverage >= Decimal("0.75"):
        return "medium"
    return "low"


# What a MIG profile costs, as a fraction of the whole device, under the cost model's
# mig.fraction of a cluster (metering.report.cli builds it from the cost model).
MigFraction = Callable[[str, str, Profile, GpuUnits], Decimal]  # cluster, model, profile, GPU


def mig_fraction(cm: CostModel) -> MigFraction:
    """The cost model's mig.fraction rule for a profile, with the cluster's own `mig` and
    `pricing` sections where the cost model overrides them: as pricing.sql applies it."""

    def fraction(cluster: str, model: str, p: Profile, units: GpuUnits) -> Decimal:
        c = cm.for_cluster(cluster)
        slices = min(Decimal(p.slices) / units.slices, Decimal(1))
        if c.mig_fraction == "table" and p.name in c.mig_table:
            return c.mig_table[p.name]
        memory = c.price_for(model).memory_gb
        if c.mig_fraction == "memory" and memory:
            return min(p.memory_gb / memory, Decimal(1))
        return slices

    return fraction


def recommend(con: Any, start: datetime, end: datetime, mig_fraction: MigFraction,
              settings: Settings = Settings()) -> list[Recommendation]:
    """Recommendations for [start, end), largest saving first."""
    out: list[Recommendation] = []
    for g in _groups(con, start, end):
        ev = g.evidence
        if ev.all_hours < settings.min_hours:
            continue
        units = units_for(g.model)
        current = f"MIG {g.profile}" if g.sharing == "mig" else (
            "whole GPU" if g.sharing == "exclusive" else g.sharing)

        def make(kind: Kind, proposed: str, saving: Decimal, g: _Group = g,
                 current: str = current) -> Recommendation:
            return Recommendation(
                kind=kind, team=g.team, cluster=g.cluster, namespace=g.namespace,
                owner_kind=g.owner_kind, owner_name=g.owner_name, model=g.model,
                current=current, proposed=proposed,
                cost=g.idle_cost if kind is Kind.IDLE else g.cost, saving=saving,
                confidence=_confidence(g.evidence, settings),
                evidence=g.evidence)

        if ev.idle_device_hours >= settings.idle_hours and g.idle_cost > 0:
            out.append(make(Kind.IDLE, "release GPUs while no process uses them",
                            g.idle_cost))
        if ev.hours < settings.min_hours:
            continue  # too few busy hours to size it (idle holding is judged above)
        if units is None or ev.peak_memory_gb is None or ev.p95_sm is None:
            continue  # unknown figures: no rightsizing
        if g.sharing == "exclusive" and not g.profile:
            rec = _whole(g, units, mig_fraction, settings)
        elif g.sharing == "mig" and g.profile:
            rec = _mig(g, units, mig_fraction, settings)
        else:
            rec = None
        if rec is not None:
            out.append(make(*rec))
    out.sort(key=lambda r: (-r.saving, r.workload, r.kind.value))
    return out


def _fits(peak_gb: Decimal, p95_sm: Decimal, memory_gb: Decimal, sm_share: Decimal,
          s: Settings) -> bool:
    return peak_gb <= memory_gb * s.headroom and p95_sm <= sm_share * s.headroom


def _whole(g: _Group, units: GpuUnits, frac: MigFraction, s: Settings
           ) -> tuple[Kind, str, Decimal] | None:
    ev = g.evidence
    assert ev.peak_memory_gb is not None and ev.p95_sm is not None
    for p in units.profiles:
        if p.slices >= units.slices:
            break  # the whole GPU as one instance saves nothing
        if _fits(ev.peak_memory_gb, ev.p95_sm, p.memory_gb, Decimal(p.slices) / units.slices,
                 s):
            f = frac(g.cluster, g.model, p, units)
            return Kind.TO_MIG, f"MIG {p.name}", (g.cost * (1 - f)).quantize(_Q6)
    for n in sorted(s.share_replicas, reverse=True):
        share = Decimal(1) / n
        if _fits(ev.peak_memory_gb, ev.p95_sm, units.memory_gb * share, share, s):
            return (Kind.TO_SHARE, f"1/{n} of a GPU (time-slicing or MPS, {n} replicas)",
                    (g.cost * (1 - share)).quantize(_Q6))
    return None


def _mig(g: _Group, units: GpuUnits, frac: MigFraction, s: Settings
         ) -> tuple[Kind, str, Decimal] | None:
    ev = g.evidence
    assert ev.peak_memory_gb is not None and ev.p95_sm is not None
    i = units.index(g.profile)
    if i is None:
        return None
    cur = units.profiles[i]
    f_cur = frac(g.cluster, g.model, cur, units)
    memory_full = ev.peak_memory_gb >= cur.memory_gb * s.outgrow
    sm_full = ev.p95_sm >= s.outgrow
    if memory_full or sm_full:
        # the next profile that adds what ran out (1g.10gb -> 1g.20gb adds memory only)
        up = next((p for p in units.profiles[i + 1:]
                   if (not memory_full or p.memory_gb > cur.memory_gb)
                   and (not sm_full or p.slices > cur.slices)), None)
        if up is None:
            return None
        extra = g.cost * (frac(g.cluster, g.model, up, units) / f_cur - 1)
        return Kind.MIG_UP, f"MIG {up.name}", -extra.quantize(_Q6)
    if i > 0:
        down = units.profiles[i - 1]
        # the instance's SM activity, in the smaller instance's terms
        sm_there = ev.p95_sm * Decimal(cur.slices) / Decimal(down.slices)
        if _fits(ev.peak_memory_gb, sm_there, down.memory_gb, Decimal(1), s):
            f_down = frac(g.cluster, g.model, down, units)
            if f_down < f_cur:
                return (Kind.MIG_DOWN, f"MIG {down.name}",
                        (g.cost * (1 - f_down / f_cur)).quantize(_Q6))
    return None


def total_saving(recs: Sequence[Recommendation]) -> Decimal:
    return sum((r.saving for r in recs if r.saving > 0), _ZERO)
