"""What a monthly report says: its tables and figures, as types. builder.py fills them from
the ledger (queries in metering/sql/report.sql); the renderers only read them.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

from metering.closes import Adjustment
from metering.period import HOUR, HourRange, Month
from metering.report.waste import Recommendation

# Rows the pricing engine writes for the fleet rather than a team: team and sharing both carry
# the kind (a team's share of weighted idle has its own team name, so it stays the team's).
KINDS = ("idle", "down", "adjustment")
DEFAULT_TOP_PODS = 20

_HOUR = HOUR
_Q6 = Decimal("0.000001")
_ZERO = Decimal(0)


@dataclass(frozen=True)
class Energy:
    """A row's measured energy and what it was priced at (docs/reports.md, "Energy and
    carbon"): on teams' rows their holders' share, on idle and down rows the fleet's rest."""

    kwh: Decimal
    cost: Decimal | None  # None: the cost model has no `energy:` (energy is in the rate)
    co2e_kg: Decimal | None  # None: the cost model has no `carbon:`
    estimated_kwh: Decimal = _ZERO  # of kwh, from power samples (counter missing or reset)


@dataclass(frozen=True, kw_only=True)
class Line:
    """One report row. Key fields that do not apply to the section are ''."""

    cluster: str = ""  # on the per-cluster rows of Report.clusters
    team: str = ""
    namespace: str = ""
    pod: str = ""
    model: str = ""
    sharing: str = ""
    profile: str = ""
    day: str = ""
    kind: str = ""  # '' for teams' charges, else one of KINDS
    allocated_gpu_hours: Decimal = _ZERO
    # SM activity of the allocated hours whose SM activity is known; None when it is known
    # for none of them (MIG without GPM): unknown, never shown as 0.
    used_gpu_hours: Decimal | None = _ZERO
    sm_unknown_gpu_hours: Decimal = _ZERO  # allocated GPU-hours with no SM data
    # Device-hours of idle and down rows (nobody held the GPU / it was not up); 0 on teams' rows.
    fleet_gpu_hours: Decimal = _ZERO
    cost: Decimal = _ZERO
    idle_share: Decimal = _ZERO
    share_of_total: Decimal | None = None
    previous_cost: Decimal | None = None  # None: no previous month to compare with
    energy: Energy | None = None  # None: energy is not reported this month

    @property
    def sm_known_gpu_hours(self) -> Decimal:
        return self.allocated_gpu_hours - self.sm_unknown_gpu_hours

    @property
    def gpu_hours(self) -> Decimal:
        """The hours a row stands for: allocated GPU-hours for teams, idle or down
        device-hours for fleet rows, both together on a total."""
        return self.allocated_gpu_hours + self.fleet_gpu_hours

    @property
    def efficiency(self) -> Decimal | None:
        """Used GPU-hours / the row's own GPU-hours (`gpu_hours`) whose SM activity is known
        (docs/reports.md, "Efficiency, utilisation, allocation rate"). On a team's row those
        are its allocated GPU-hours; on a total row every GPU-hour it shows, idle and down
        included, so the fleet total reads as the fleet's use of its hours. None on the
        idle, down and adjustment rows (nobody held those hours), and where SM activity is
        unknown for all of the row."""
        if self.overhead or self.used_gpu_hours is None:
            return None
        known = self.gpu_hours - self.sm_unknown_gpu_hours
        if known <= 0:
            return None
        return (self.used_gpu_hours / known).quantize(_Q6)

    @property
    def idle(self) -> bool:
        return self.kind == "idle"

    @property
    def overhead(self) -> bool:
        """A fleet row (idle, down, adjustment), not a team's own charges."""
        return self.kind != ""

    @property
    def cost_change(self) -> Decimal | None:
        return None if self.previous_cost is None else self.cost - self.previous_cost


@dataclass(frozen=True)
class CostModelInfo:
    """What the report states about the cost model the charges were priced with."""

    file: str  # path as given, or '' when unknown
    hash: str
    currency: str


@dataclass(frozen=True)
class ModelPrice:
    """The list price the cost model gives a GPU model, and which entry set it."""

    hourly: Decimal  # per device-hour, before discounts
    rule: str  # e.g. `pricing.gpus[1] (pattern "NVIDIA A100*")` or `pricing.default`
    fallback: bool  # no entry matched the model: it got pricing.default
    discount: Decimal = _ZERO  # model discount, 0-1


# What the report asks of the cost model: the price of a GPU model.
PriceLookup = Callable[[str], ModelPrice]


@dataclass(frozen=True)
class ModelCapacity:
    """One GPU model's capacity, allocation and price in the month."""

    model: str
    devices: int  # distinct GPUs seen
    capacity_gpu_hours: Decimal  # device-hours the fleet owned (up or not)
    allocated_gpu_hours: Decimal
    down_gpu_hours: Decimal
    price: ModelPrice | None  # None: the cost model the charges were priced with is not at hand
    used_gpu_hours: Decimal = _ZERO  # SM activity where known
    sm_unknown_gpu_hours: Decimal = _ZERO  # allocated GPU-hours with no SM data

    @property
    def allocation_rate(self) -> Decimal | None:
        if self.capacity_gpu_hours <= 0:
            return None
        return (self.allocated_gpu_hours / self.capacity_gpu_hours).quantize(_Q6)

    @property
    def utilisation(self) -> Decimal | None:
        return utilisation(self.used_gpu_hours, self.capacity_gpu_hours,
                           self.sm_unknown_gpu_hours)

    @property
    def maturity(self) -> int | None:
        return maturity_level(self.utilisation)


def utilisation(used: Decimal, capacity: Decimal, sm_unknown: Decimal) -> Decimal | None:
    """Fleet utilisation: used GPU-hours / capacity, leaving out the capacity whose SM activity
    is unknown (held on MIG without GPM, or without SM samples); None when nothing is known."""
    known = capacity - sm_unknown
    if known <= 0:
        return None
    return min(used / known, Decimal(1)).quantize(_Q6)


# GPU management maturity by utilisation: level 1 < 30 %, 2: 30-50 %, 3: 50-80 %, 4: > 80 %.
MATURITY_BOUNDS = ((Decimal("0.30"), 1), (Decimal("0.50"), 2))


def maturity_level(util: Decimal | None) -> int | None:
    if util is None:
        return None
    for bound, level in MATURITY_BOUNDS:
        if util < bound:
            return level
    return 3 if util <= Decimal("0.80") else 4


@dataclass(frozen=True)
class Maturity:
    """Where a GPU model (or the fleet, model '') stands on the maturity scale, and last month."""

    model: str
    utilisation: Decimal | None
    level: int | None
    previous_utilisation: Decimal | None = None  # None: no previous month, or not known
    previous_level: int | None = None

    @property
    def change_points(self) -> Decimal | None:
        """Change in utilisation, percentage points."""
        if self.utilisation is None or self.previous_utilisation is None:
            return None
        return ((self.utilisation - self.previous_utilisation) * 100).quantize(Decimal("0.1"))


class BudgetStatus(enum.Enum):
    WITHIN = "within budget"
    HEADING_OVER = "heading over"
    OVER = "over budget"


@dataclass(frozen=True)
class TeamBill:
    """What a team's bill for the month says so far: the one definition of a team's
    month-to-date spend, used by the budgets (report and `meter --pushgateway`)."""

    team: str
    compute: Decimal = _ZERO  # its charges, shared-out idle included
    energy: Decimal = _ZERO  # its energy line (kWh x PUE x tariff); 0 without `energy:`
    # adjustments billed in this month for earlier closed months (may be negative)
    adjustments: Decimal = _ZERO

    @property
    def total(self) -> Decimal:
        return self.compute + self.energy + self.adjustments


def team_bills(teams: Sequence[Line], adjustments_in: Sequence[Adjustment] = ()
               ) -> dict[str, TeamBill]:
    """Per team: compute charges + energy line + adjustments posted to the month
    (docs/cost-model.md, `budgets`). Fleet rows (idle, down, adjustment) are nobody's bill."""
    bills: dict[str, TeamBill] = {}
    for ln in teams:
        if ln.overhead:
            continue
        energy = ln.energy.cost if ln.energy is not None and ln.energy.cost is not None \
            else _ZERO
        was = bills.get(ln.team, TeamBill(ln.team))
        bills[ln.team] = TeamBill(ln.team, was.compute + ln.cost, was.energy + energy,
                                  was.adjustments)
    for adj in adjustments_in:
        if adj.team in KINDS:
            continue
        was = bills.get(adj.team, TeamBill(adj.team))
        bills[adj.team] = TeamBill(adj.team, was.compute, was.energy,
                                   was.adjustments + adj.cost)
    return bills


@dataclass(frozen=True)
class BudgetLine:
    """A team's month against its budget. Spend: its bill so far (`TeamBill.total`).
    Forecast, in an open month only: the month's usage so far (compute + energy) extrapolated
    linearly to the month's end (x hours in month / hours elapsed), plus the adjustments
    billed in it, which are one-off amounts and not extrapolated. A closed month has its
    actuals: spend, no forecast."""

    team: str
    budget: Decimal
    warn_at: Decimal  # budgets.warn_at: heading over from this share of the budget
    spend: Decimal
    forecast: Decimal | None  # None: the month is closed, or no hour of it has data yet
    bill: TeamBill | None = None  # the parts of `spend`

    @property
    def warn_from(self) -> Decimal:
        """The forecast from which the team is heading over: budget x warn_at. Pushed for
        Prometheus, where the forecasts of a team's clusters are summed against it."""
        return self.budget * self.warn_at

    @property
    def status(self) -> BudgetStatus:
        """Over once the spend exceeds the budget; else heading over once the forecast
        reaches warn_from; else within."""
        if self.spend > self.budget:
            return BudgetStatus.OVER
        if self.forecast is not None and self.forecast >= self.warn_from:
            return BudgetStatus.HEADING_OVER
        return BudgetStatus.WITHIN

    @property
    def used(self) -> Decimal:
        return (self.spend / self.budget).quantize(_Q6)


def budget_lines(
    teams: Sequence[Line], budgets: Mapping[str, Decimal], warn_at: Decimal,
    elapsed_hours: int, month_hours: int, *, closed: bool = False,
    adjustments_in: Sequence[Adjustment] = (),
) -> list[BudgetLine]:
    """`closed`: the month has ended, so its spend is final and nothing is forecast (hours
    without data in a closed month are a gap, not spend still to come)."""
    bills = team_bills(teams, adjustments_in)
    out = []
    for team, budget in sorted(budgets.items(), key=lambda kv: natural_key(kv[0])):
        bill = bills.get(team, TeamBill(team))
        cost = bill.total
        forecast = None
        if elapsed_hours and not closed:
            usage = bill.compute + bill.energy
            forecast = (usage * month_hours / elapsed_hours + bill.adjustments).quantize(_Q6)
        out.append(BudgetLine(team, budget, warn_at, cost, forecast, bill))
    return out


@dataclass(frozen=True)
class Report:
    month: Month
    cost_model: CostModelInfo
    tool_version: str
    hours_with_data: int
    missing: list[HourRange]
    fleet: Line
    teams: list[Line]
    namespaces: list[Line]
    models: list[Line]
    pods: list[Line]
    team_days: list[Line]
    has_previous: bool
    has_data: bool  # the month has charges
    top_pods: int = DEFAULT_TOP_PODS
    # What a reader must know before the figures (default prices, vGPU types priced by an
    # entry for whole GPUs): shown at the top of every output.
    notes: list[str] = field(default_factory=list)
    # GPU models priced at pricing.default (report --strict-prices exits 3 on any)
    default_priced_models: list[str] = field(default_factory=list)
    # Of fleet.sm_unknown_gpu_hours, the part on MIG instances (no GPM); the rest had no SM
    # samples at all.
    sm_unknown_mig_gpu_hours: Decimal = _ZERO
    capacity: list[ModelCapacity] = field(default_factory=list)
    maturity: list[Maturity] = field(default_factory=list)  # per model, then the fleet ('')
    # Waste recommendations, largest saving first; None: not computed (no cost model at hand).
    savings: list[Recommendation] | None = None
    # None: the cost model the charges were priced with is not at hand, so budgets are unknown.
    budgets: list[BudgetLine] | None = None
    elapsed_hours: int = 0  # hours of the month so far (through the last hour with data)
    # The month had ended when the report was made: budgets show actuals, no forecast.
    closed: bool = True
    # Filled only for the FOCUS export (metering/report/focus.py): lists, or (while
    # write_report writes the files) rows read from the ledger each time they are iterated.
    charge_days: Iterable[ChargeDay] = field(default_factory=list)
    energy_days: Iterable[EnergyDay] = field(default_factory=list)  # FOCUS, when energy_shown
    # The cluster this report is about; '' for the fleet view over every cluster.
    cluster: str = ""
    # One row per cluster with charges in the month (or the one cluster of a per-cluster
    # report), largest cost first.
    clusters: list[Line] = field(default_factory=list)
    # cluster -> GPU model -> list price that cluster's charges were priced at (filled where
    # the cost model is at hand; prices may differ per cluster, see Capacity.price).
    cluster_prices: Mapping[str, Mapping[str, ModelPrice]] = field(default_factory=dict)
    # When `gpu-ledger close` closed the month (None: open): its charges never change since.
    closed_at: datetime | None = None
    # Adjustments for this closed month, billed in later months; and those billed in this
    # month for earlier closed months (metering/closes.py).
    adjustments_out: list[Adjustment] = field(default_factory=list)
    adjustments_in: list[Adjustment] = field(default_factory=list)

    @property
    def capacity_gpu_hours(self) -> Decimal:
        return sum((c.capacity_gpu_hours for c in self.capacity), _ZERO)

    @property
    def energy_shown(self) -> bool:
        """The month's energy was priced or its carbon reported: energy columns everywhere."""
        return self.fleet.energy is not None

    @property
    def energy_priced(self) -> bool:
        return self.fleet.energy is not None and self.fleet.energy.cost is not None

    @property
    def carbon_shown(self) -> bool:
        return self.fleet.energy is not None and self.fleet.energy.co2e_kg is not None

    @property
    def devices(self) -> int:
        return sum(c.devices for c in self.capacity)

    @property
    def allocation_rate(self) -> Decimal | None:
        """Allocated GPU-hours / capacity; None when the fleet had no capacity."""
        cap = self.capacity_gpu_hours
        return (self.fleet.allocated_gpu_hours / cap).quantize(_Q6) if cap > 0 else None

    @property
    def over_full_efficiency(self) -> bool:
        """Some row shows efficiency above 100 % (a share that used more than its slice)."""
        rows = [self.fleet, *self.teams, *self.namespaces, *self.models, *self.pods]
        return any((ln.efficiency or 0) > 1 for ln in rows)

    @property
    def sm_unknown_share(self) -> Decimal | None:
        """Share of allocated GPU-hours without SM data; None when nothing was allocated."""
        if self.fleet.allocated_gpu_hours <= 0:
            return None
        return (self.fleet.sm_unknown_gpu_hours / self.fleet.allocated_gpu_hours).quantize(_Q6)

    @property
    def hours_in_period(self) -> int:
        return self.month.hours

    @property
    def idle_policy(self) -> str:
        """How idle cost appears in this report, read from the charges themselves."""
        idle_row = next((t for t in self.teams if t.idle and t.cost), None)
        shared = self.fleet.idle_share
        if idle_row is not None and shared:
            return "idle cost is partly its own row (team 'idle'), partly shared out to teams"
        if idle_row is not None:
            return "idle cost is its own row (team 'idle')"
        if shared:
            return "idle cost is shared out to teams (column idle_share)"
        return "no idle cost in this period"


@dataclass(frozen=True)
class ChargeDay:
    """Charges summed per UTC day x team x namespace x pod x GPU model x sharing x profile x
    cluster: the grain of the FOCUS export."""

    day: datetime
    team: str
    namespace: str
    pod: str
    model: str
    sharing: str
    profile: str
    kind: str  # '' for teams' charges, else one of KINDS
    charged_gpu_hours: Decimal  # device-hours the money is for (fraction; 0 on idle-share rows)
    allocated_gpu_hours: Decimal
    used_gpu_hours: Decimal | None
    cost: Decimal
    idle_share: Decimal
    cluster: str = ""


@dataclass(frozen=True)
class EnergyDay:
    """Energy summed at the FOCUS grain (as ChargeDay): one FOCUS row of its own, billed as
    the energy line (docs/reports.md, "FOCUS export")."""

    day: datetime
    team: str
    namespace: str
    pod: str
    model: str
    sharing: str
    profile: str
    kind: str  # '' for teams' energy, else idle | down
    cluster: str
    kwh: Decimal
    cost: Decimal | None  # None: not priced (`energy:` absent)
    co2e_kg: Decimal | None  # None: no `carbon:`


_DIGITS = re.compile(r"(\d+)")


def natural_key(text: str) -> tuple[tuple[Any, ...], str]:
    """Order names as people do: runs of digits compare as numbers (`trainer-2` before
    `trainer-10`); the text itself breaks the remaining ties (`01` and `1`)."""
    parts = _DIGITS.split(text)  # text at even positions, digit runs at odd ones
    return tuple(int(p) if i % 2 else p for i, p in enumerate(parts)), text


@dataclass(frozen=True)
class StoredCostModel:
    """A cost model as the ledger keeps it with the charges it priced."""

    name: str
    currency: str
    text: str
