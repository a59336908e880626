"""Waste: rightsizing and idle-holder recommendations from a month of facts.

Per workload (the pod's controller from its owner references: Deployment, StatefulSet, Job, ...;
a pod without one is its own workload), from the hourly facts:

- whole-GPU holders whose peak memory and p95 SM activity fit a smaller unit get the smallest
  MIG profile of their GPU model that fits (catalogue: metering/data/mig-profiles.yaml), on an
  AMD Instinct the smallest compute partition that fits (metering/partitions.py: a CPX
  partition is one of 8 XCDs of an MI300X), else the smallest time-slicing / MPS share that
  fits;
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
from datetime import datetime
from decimal import Decimal
from functools import cache
from importlib import resources
from typing import Any

import yaml

from metering import partitions, sqlfile, wastehours
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
    # "mig"; "amd_partition": profiles are compute modes (cpx, qpx, ...), slices XCDs
    kind: str = "mig"

    def index(self, name: str) -> int | None:
        if self.kind == "amd_partition":  # the exporter's "cpx_nps4" is mode cpx
            name = partitions.compute_mode(name) or name
        return next((i for i, p in enumerate(self.profiles) if p.name == name), None)

    def label(self, p: Profile) -> str:
        """How a proposal names a profile: "MIG 1g.10gb", "AMD CPX partition (1 of 8)"."""
        if self.kind == "amd_partition":
            return f"AMD {p.name.upper()} partition (1 of {self.slices // p.slices})"
        return f"MIG {p.name}"


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
    return _amd_units(model)


def _amd_units(model: str) -> GpuUnits | None:
    """An AMD Instinct's compute partitions, each its equal share of the XCDs and HBM."""
    sizes = partitions.sizes(model)
    memory = partitions.partition_memory_gb(model)
    xcds = partitions.partition_xcds(model)
    if not sizes or memory is None or xcds is None:
        return None
    return GpuUnits(Decimal(memory), xcds,
                    tuple(Profile(s.mode, s.xcds, Decimal(memory) / s.parts) for s in sizes),
                    "amd_partition")


class Kind(enum.Enum):
    TO_MIG = "whole GPU -> MIG"
    TO_SHARE = "whole GPU -> shared"
    MIG_DOWN = "MIG profile down"
    MIG_UP = "MIG profile up"
    IDLE = "idle holder"
    TO_PARTITION = "whole GPU -> AMD partition"  # last: report colours follow this order


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
    # share of all device-hours held (busy or idle) with a memory figure: what idle holding
    # is judged on, as `coverage` is for rightsizing
    held_coverage: Decimal = Decimal(0)


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
    # The energy view (docs/reports.md, "Savings"): the measured kWh and kg CO2e the change
    # would free: an idle holder's energy while idle; for a rightsizing, the busy hours'
    # energy times the share of the cost saved. None: no energy figure (no energy rows).
    energy_saving_kwh: Decimal | None = None
    co2e_saving_kg: Decimal | None = None  # None also where the cost model has no `carbon:`

    @property
    def workload(self) -> str:
        return f"{self.cluster}/{self.namespace}/{self.owner_kind}/{self.owner_name}"


_TABLE = "waste_device_hours"  # working view and table of metering/sql/waste.sql (temporary)
_P95_TABLE = "waste_p95"


def _sql(name: str) -> str:
    return sqlfile.load("waste.sql").query(name)


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
    # measured energy (kWh) and CO2e (kg) of the busy and the idle device-hours; None: unknown
    kwh: Decimal = _ZERO
    idle_kwh: Decimal = _ZERO
    co2e_kg: Decimal | None = None
    idle_co2e_kg: Decimal | None = None


def _computed_note(done: wastehours.Plan) -> str:
    """The log line of a report that computed waste device-hours from the facts."""
    n, of = len(done.computed), len(done.computed) + len(done.stored)
    first = done.computed[0][0]
    return (f"waste: {n} of {of} day(s) computed from the facts (from {first:%Y-%m-%d %H:%M}"
            " UTC), no stored device-hours: priced before they were stored, or re-metered "
            "and not priced again; pricing them again stores them")


def _kwh(joules: Any) -> Decimal:
    return (Decimal(str(joules or 0)) / 3_600_000).quantize(_Q6)


def _kg(grams: Any) -> Decimal | None:
    return None if grams is None else (Decimal(str(grams)) / 1000).quantize(_Q6)


def _dec(value: Any, q: Decimal = _Q6) -> Decimal | None:
    return None if value is None else Decimal(str(value)).quantize(q)


def _groups(con: Any, start: datetime, end: datetime,
            note: Callable[[str], None] | None = None) -> list[_Group]:
    try:
        done = wastehours.expose(con, _TABLE, start, end)
        if done.computed and note is not None:
            note(_computed_note(done))
        con.execute(_sql("p95"))
        rows = con.execute(_sql("workloads")).fetchall()
    finally:
        con.execute(f"DROP VIEW IF EXISTS {_TABLE}")
        con.execute(f"DROP TABLE IF EXISTS {wastehours.computed_table(_TABLE)}")
        con.execute(f"DROP TABLE IF EXISTS {_P95_TABLE}")
    out = []
    for (cluster, ns, okind, oname, model, sharing, profile, team, hours, dev_h, peak, p95m, p95s,
         coverage, idle_dh, all_hours, cost, idle_cost, held_coverage, joules, idle_joules,
         grams, idle_grams) in rows:
        ev = Evidence(
            hours=int(hours), device_hours=_dec(dev_h) or _ZERO,
            peak_memory_gb=None if peak is None else _dec(Decimal(str(peak)) / _GB),
            p95_memory_gb=None if p95m is None else _dec(Decimal(str(p95m)) / _GB),
            p95_sm=_dec(p95s), coverage=_dec(coverage) or _ZERO, idle_device_hours=int(idle_dh),
            all_hours=int(all_hours), held_coverage=_dec(held_coverage) or _ZERO,
        )
        out.append(_Group(cluster, ns, okind, oname, model, sharing, profile, team or "", ev,
                          Decimal(cost or 0), Decimal(idle_cost or 0), _kwh(joules),
                          _kwh(idle_joules), _kg(grams), _kg(idle_grams)))
    return out


def _confidence(kind: Kind, ev: Evidence, s: Settings) -> str:
    """From the hours a recommendation is judged on and their coverage: the busy hours for a
    rightsizing, every held hour for an idle holder (a GPU held 744 of 744 hours with no
    process is judged on 744 hours, not on its 0 busy ones)."""
    hours, coverage = ((ev.all_hours, ev.held_coverage) if kind is Kind.IDLE
                       else (ev.hours, ev.coverage))
    if hours >= s.confident_hours and coverage >= Decimal("0.9"):
        return "high"
    if coverage >= Decimal("0.75"):
        return "medium"
    return "low"


# What a MIG profile costs, as a fraction of the whole device, under the cost model's
# mig.fraction of a cluster (metering.report.builder builds it from the cost model).
MigFraction = Callable[[str, str, Profile, GpuUnits], Decimal]  # cluster, model, profile, GPU


def mig_fraction(cm: CostModel) -> MigFraction:
    """The cost model's mig.fraction rule for a profile, with the cluster's own `mig` and
    `pricing` sections where the cost model overrides them: as pricing.sql applies it."""

    def fraction(cluster: str, model: str, p: Profile, units: GpuUnits) -> Decimal:
        c = cm.for_cluster(cluster)
        slices = min(Decimal(p.slices) / units.slices, Decimal(1))
        if c.mig_fraction == "table" and p.name in c.mig_table:
            return c.mig_table[p.name]
        if units.kind == "amd_partition":
            # pricing.sql prices AMD partitions by slices (XCDs), or by a table entry of the
            # exporter's profile name (cpx_nps4): the first entry of this compute mode
            listed = [f for name, f in c.mig_table.items()
                      if partitions.compute_mode(name) == p.name]
            return listed[0] if c.mig_fraction == "table" and listed else slices
        memory = c.price_for(model).memory_gb
        if c.mig_fraction == "memory" and memory:
            return min(p.memory_gb / memory, Decimal(1))
        return slices

    return fraction


def recommend(con: Any, start: datetime, end: datetime, mig_fraction: MigFraction,
              settings: Settings = Settings(),
              note: Callable[[str], None] | None = None) -> list[Recommendation]:
    """Recommendations for [start, end), largest saving first. `note` is told when some
    days' device-hours were computed from the facts instead of read as stored."""
    out: list[Recommendation] = []
    for g in _groups(con, start, end, note):
        ev = g.evidence
        if ev.all_hours < settings.min_hours:
            continue
        units = units_for(g.model)
        current = (f"AMD partition {g.profile}" if partitions.compute_mode(g.profile)
                   else f"MIG {g.profile}") if g.sharing == "mig" else (
            "whole GPU" if g.sharing == "exclusive" else g.sharing)

        def make(kind: Kind, proposed: str, saving: Decimal, g: _Group = g,
                 current: str = current) -> Recommendation:
            kwh, kg = _energy_saving(g, kind, saving)
            return Recommendation(
                kind=kind, team=g.team, cluster=g.cluster, namespace=g.namespace,
                owner_kind=g.owner_kind, owner_name=g.owner_name, model=g.model,
                current=current, proposed=proposed,
                cost=g.idle_cost if kind is Kind.IDLE else g.cost, saving=saving,
                confidence=_confidence(kind, g.evidence, settings),
                evidence=g.evidence, energy_saving_kwh=kwh, co2e_saving_kg=kg)

        if ev.idle_device_hours >= settings.idle_hours and _to_the_cent(g.idle_cost):
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
        # A saving of 0.00 says nothing; a larger unit is advice even at no extra cost
        # (1g.10gb -> 1g.20gb is one slice either way under mig.fraction slices).
        if rec is not None and (rec[0] is Kind.MIG_UP or _to_the_cent(rec[2])):
            out.append(make(*rec))
    out.sort(key=lambda r: (-r.saving, r.workload, r.kind.value))
    return out


def _energy_saving(g: _Group, kind: Kind, saving: Decimal
                   ) -> tuple[Decimal | None, Decimal | None]:
    """kWh and kg CO2e a recommendation frees: an idle holder's energy while idle; a
    rightsizing's busy energy times saving / cost, the share of the device it gives back
    (negative for a larger unit). None where the workload has no energy figure."""
    if kind is Kind.IDLE:
        return (g.idle_kwh or None), g.idle_co2e_kg if g.idle_kwh else None
    if not g.kwh or not g.cost:
        return None, None
    share = saving / g.cost
    kg = None if g.co2e_kg is None else (g.co2e_kg * share).quantize(_Q6)
    return (g.kwh * share).quantize(_Q6), kg


def _to_the_cent(amount: Decimal) -> bool:
    """A saving of 0.00 to the cent is no saving: such a recommendation is not made."""
    return abs(amount) >= Decimal("0.005")


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
            kind = Kind.TO_PARTITION if units.kind == "amd_partition" else Kind.TO_MIG
            return kind, units.label(p), (g.cost * (1 - f)).quantize(_Q6)
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
        return Kind.MIG_UP, units.label(up), -extra.quantize(_Q6)
    if i > 0:
        down = units.profiles[i - 1]
        # the instance's SM activity, in the smaller instance's terms
        sm_there = ev.p95_sm * Decimal(cur.slices) / Decimal(down.slices)
        if _fits(ev.peak_memory_gb, sm_there, down.memory_gb, Decimal(1), s):
            f_down = frac(g.cluster, g.model, down, units)
            if f_down < f_cur:
                return (Kind.MIG_DOWN, units.label(down),
                        (g.cost * (1 - f_down / f_cur)).quantize(_Q6))
    return None


def total_saving(recs: Sequence[Recommendation]) -> Decimal:
    return sum((r.saving for r in recs if r.saving > 0), _ZERO)
