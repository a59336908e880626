"""Monthly report tables, computed from priced `charges` and the `coverage` table.

Every sum is taken in DuckDB as an exact DECIMAL (hours are cast before summing), so the
figures do not depend on the order DuckDB's parallel aggregation adds rows in: the same
database gives the same report, byte for byte, on every run.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

import duckdb

from metering.period import HOUR, HourRange, Month, hour_ranges
from metering.waste import Recommendation

# Rows the pricing engine writes for the fleet rather than a team: team and sharing both carry
# the kind (a team's share of weighted idle has its own team name, so it stays the team's).
KINDS = ("idle", "down", "adjustment")
DEFAULT_TOP_PODS = 20

_HOUR = HOUR
_Q6 = Decimal("0.000001")
_ZERO = Decimal(0)


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
        """used / allocated, over the allocated hours with SM data only; None where nothing
        was allocated (idle, no data) or SM activity is unknown for all of it."""
        known = self.sm_known_gpu_hours
        if self.used_gpu_hours is None or known <= 0:
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
class BudgetLine:
    """A team's month against its budget. Forecast: the month so far, extrapolated linearly
    to the month's end (spend x hours in month / hours elapsed)."""

    team: str
    budget: Decimal
    spend: Decimal
    forecast: Decimal | None  # None: no hour of the month has data yet
    status: BudgetStatus

    @property
    def used(self) -> Decimal:
        return (self.spend / self.budget).quantize(_Q6)


def budget_lines(
    teams: Sequence[Line], budgets: Mapping[str, Decimal], warn_at: Decimal,
    elapsed_hours: int, month_hours: int,
) -> list[BudgetLine]:
    spend = {ln.team: ln.cost for ln in teams if not ln.overhead}
    out = []
    for team, budget in sorted(budgets.items(), key=lambda kv: natural_key(kv[0])):
        cost = spend.get(team, _ZERO)
        forecast = (cost * month_hours / elapsed_hours).quantize(_Q6) if elapsed_hours else None
        if cost > budget:
            status = BudgetStatus.OVER
        elif forecast is not None and forecast >= budget * warn_at:
            status = BudgetStatus.HEADING_OVER
        else:
            status = BudgetStatus.WITHIN
        out.append(BudgetLine(team, budget, cost, forecast, status))
    return out


def elapsed_hours(con: Any, month: Month) -> int:
    """Hours from the month's start through the last hour with data or charges (0 if none)."""
    row = con.execute(
        "SELECT max(h) FROM (SELECT max(hour) AS h FROM coverage WHERE hour >= ? AND hour < ? "
        "AND devices > 0 UNION ALL SELECT max(hour) FROM charges WHERE hour >= ? AND hour < ?)",
        [month.start, month.end, month.start, month.end],
    ).fetchone()
    if row is None or row[0] is None:
        return 0
    return int((row[0] - month.start) / _HOUR) + 1


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
    notes: list[str] = field(default_factory=list)
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
    # Filled only for the FOCUS export (metering/report/focus.py).
    charge_days: list[ChargeDay] = field(default_factory=list)
    # The cluster this report is about; '' for the fleet view over every cluster.
    cluster: str = ""
    # One row per cluster with charges in the month (or the one cluster of a per-cluster
    # report), largest cost first.
    clusters: list[Line] = field(default_factory=list)
    # cluster -> GPU model -> list price that cluster's charges were priced at (filled where
    # the cost model is at hand; prices may differ per cluster, see Capacity.price).
    cluster_prices: Mapping[str, Mapping[str, ModelPrice]] = field(default_factory=dict)

    @property
    def capacity_gpu_hours(self) -> Decimal:
        return sum((c.capacity_gpu_hours for c in self.capacity), _ZERO)

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


# --- queries ---------------------------------------------------------------------------------

# used_gpu_hours is NULL where SM activity is unknown: SUM() adds the known rows only, and the
# allocated hours of the unknown ones are summed apart, so efficiency compares like with like.
_SUMS = (
    "SUM(CAST(allocated_gpu_hours AS DECIMAL(38, 9))), "
    "SUM(CAST(used_gpu_hours AS DECIMAL(38, 9))), SUM(cost), SUM(idle_share), "
    "SUM(CASE WHEN used_gpu_hours IS NULL THEN CAST(allocated_gpu_hours AS DECIMAL(38, 9)) "
    "ELSE 0 END), "
    # idle and down rows' fraction is the device-hours they stand for (a team's 'idle-share'
    # row under policy weights carries a weight there, not hours: it is not a fleet row)
    "SUM(CASE WHEN team = sharing AND team IN ('idle', 'down') "
    "THEN CAST(fraction AS DECIMAL(38, 9)) ELSE 0 END)"
)
# Key expressions are fixed here, never taken from input.
_KEYS = {
    "cluster": "cluster",
    "team": "team",
    "namespace": "namespace",
    "pod": "pod",
    "model": "model",
    "sharing": "sharing",
    "profile": "profile",
    "day": "CAST(CAST(hour AS DATE) AS VARCHAR)",
}
# Every grouping also splits fleet rows from charged rows, so an idle row is never merged with
# a namespace or model row that happens to share its key.
_KIND_KEY = (
    "CASE WHEN team = sharing AND team IN ("
    + ", ".join(f"'{k}'" for k in KINDS)
    + ") THEN team ELSE '' END"
)

@dataclass(frozen=True)
class Sums:
    """One group's sums, from one row of _SUMS."""

    allocated: Decimal = _ZERO
    used: Decimal | None = _ZERO  # None: unknown for all of it
    cost: Decimal = _ZERO
    idle_share: Decimal = _ZERO
    sm_unknown: Decimal = _ZERO  # allocated without SM data
    fleet_hours: Decimal = _ZERO  # device-hours of idle and down rows

    def line(self, **keys: Any) -> Line:
        return Line(**keys, allocated_gpu_hours=self.allocated, used_gpu_hours=self.used,
                    sm_unknown_gpu_hours=self.sm_unknown, cost=self.cost,
                    idle_share=self.idle_share, fleet_gpu_hours=self.fleet_hours)


Key = tuple[tuple[str, ...], str]  # (key values, kind)
_NO_SUMS = Sums()


def _q6(value: Any) -> Decimal:
    return _ZERO if value is None else Decimal(value).quantize(_Q6)


def _sums(values: Sequence[Any]) -> Sums:
    alloc, used, cost, idle, unknown, fleet_hours = values
    return Sums(_q6(alloc), None if used is None else _q6(used), Decimal(cost), Decimal(idle),
                _q6(unknown), _q6(fleet_hours))


def _grouped(con: Any, month: Month, keys: Sequence[str], where: str = "") -> dict[Key, Sums]:
    exprs = [_KEYS[k] for k in keys] + [_KIND_KEY]
    select = ", ".join([*exprs, _SUMS])
    sql = f"SELECT {select} FROM charges WHERE hour >= ? AND hour < ? {where}"
    sql += " GROUP BY " + ", ".join(str(i + 1) for i in range(len(exprs)))
    rows = con.execute(sql, [month.start, month.end]).fetchall()
    out: dict[Key, Sums] = {}
    for row in rows:
        n = len(keys)
        out[(tuple(str(v) for v in row[:n]), str(row[n]))] = _sums(row[n + 1 :])
    return out


def _lines(
    keys: Sequence[str],
    current: dict[Key, Sums],
    previous: dict[Key, Sums] | None,
    total: Decimal,
    vanished: bool = True,
) -> list[Line]:
    lines = []
    entries = dict(current)
    if previous is not None and vanished:
        # Groups charged last month but not this one: a zero row keeps their drop visible
        # (and the change column adding up to the fleet's change).
        for key in previous.keys() - current.keys():
            entries[key] = _NO_SUMS
    for key, sums in entries.items():
        prev: Decimal | None = None
        if previous is not None:
            prev = previous[key].cost if key in previous else _ZERO
        values: dict[str, Any] = dict(zip(keys, key[0], strict=True))
        lines.append(
            sums.line(
                **values,
                kind=key[1],
                share_of_total=(sums.cost / total).quantize(_Q6) if total else None,
                previous_cost=prev,
            )
        )
    # Largest cost first, fleet rows last, ties broken by the keys so the order is stable.
    lines.sort(
        key=lambda ln: (
            ln.overhead,
            KINDS.index(ln.kind) if ln.overhead else 0,
            -ln.cost,
            tuple(natural_key(getattr(ln, k)) for k in keys),
        )
    )
    return lines


_DIGITS = re.compile(r"(\d+)")


def natural_key(text: str) -> tuple[tuple[Any, ...], str]:
    """Order names as people do: runs of digits compare as numbers (`trainer-2` before
    `trainer-10`); the text itself breaks the remaining ties (`01` and `1`)."""
    parts = _DIGITS.split(text)  # text at even positions, digit runs at odd ones
    return tuple(int(p) if i % 2 else p for i, p in enumerate(parts)), text


def _fleet(con: Any, month: Month) -> Sums | None:
    """Whole-fleet sums, or None when the month has no charges at all."""
    row = con.execute(
        f"SELECT count(*), {_SUMS} FROM charges WHERE hour >= ? AND hour < ?",
        [month.start, month.end],
    ).fetchone()
    if row is None or not row[0]:
        return None
    return _sums(row[1:])


def _sm_unknown_on_mig(con: Any, month: Month) -> Decimal:
    """Allocated GPU-hours on MIG instances without SM data (no GPM on their GPU)."""
    row = con.execute(
        "SELECT SUM(CAST(allocated_gpu_hours AS DECIMAL(38, 9))) FROM charges "
        "WHERE hour >= ? AND hour < ? AND used_gpu_hours IS NULL AND mig_uuid <> ''",
        [month.start, month.end],
    ).fetchone()
    return _ZERO if row is None or row[0] is None else Decimal(row[0]).quantize(_Q6)


@dataclass(frozen=True)
class StoredCostModel:
    """A cost model as the ledger keeps it with the charges it priced."""

    name: str
    currency: str
    text: str


def stored_cost_model(con: Any, cost_model_hash: str) -> StoredCostModel | None:
    """The ledger's copy of a cost model; None for charges priced before ledgers kept one."""
    try:
        row = con.execute("SELECT name, currency, document FROM cost_models WHERE hash = ?",
                          [cost_model_hash]).fetchone()
    except duckdb.CatalogException:  # a ledger from before the table (opened read-only)
        return None
    return StoredCostModel(*row) if row else None


def priced_hashes(con: Any, month: Month) -> list[str]:
    rows = con.execute(
        "SELECT DISTINCT cost_model_hash FROM charges WHERE hour >= ? AND hour < ? ORDER BY 1",
        [month.start, month.end],
    ).fetchall()
    return [str(r[0]) for r in rows]


def has_facts(con: Any, month: Month) -> bool:
    """Whether ingest wrote usage for the month (whatever pricing has done with it)."""
    for table in ("device_hours", "allocation_hours"):
        row = con.execute(
            f"SELECT count(*) FROM {table} WHERE hour >= ? AND hour < ?", [month.start, month.end]
        ).fetchone()
        if row and row[0]:
            return True
    return False


def clusters_in(con: Any, month: Month) -> list[str]:
    rows = con.execute("SELECT DISTINCT cluster FROM charges WHERE hour >= ? AND hour < ? "
                       "ORDER BY 1", [month.start, month.end]).fetchall()
    return [str(r[0]) for r in rows]


def covered_hours(con: Any, month: Month) -> set[datetime]:
    """Hours with data from every cluster metered in the month: an hour one cluster lacks is
    a gap of the fleet, not hidden by the others."""
    rows = con.execute(
        "SELECT hour FROM coverage WHERE hour >= ? AND hour < ? GROUP BY hour "
        "HAVING count(DISTINCT CASE WHEN devices > 0 THEN cluster END) = "
        "(SELECT count(DISTINCT cluster) FROM coverage WHERE hour >= ? AND hour < ?)",
        [month.start, month.end, month.start, month.end],
    ).fetchall()
    return {r[0] for r in rows}


def _capacity(
    con: Any, month: Month, models: list[Line], prices: PriceLookup | None
) -> list[ModelCapacity]:
    """Per GPU model: the device-hours the fleet owned. A device-hour is counted when ingest
    saw the device or pricing charged it (a ledger may hold charges only)."""
    rows = con.execute(
        "SELECT model, count(DISTINCT (cluster, uuid)), count(*) FROM ("
        " SELECT DISTINCT hour, cluster, uuid, model FROM device_hours"
        " WHERE hour >= ? AND hour < ?"
        " UNION SELECT DISTINCT hour, cluster, uuid, model FROM charges"
        " WHERE hour >= ? AND hour < ? AND uuid <> '') GROUP BY model ORDER BY model",
        [month.start, month.end, month.start, month.end],
    ).fetchall()
    allocated: dict[str, Decimal] = {}
    down: dict[str, Decimal] = {}
    used: dict[str, Decimal] = {}
    unknown: dict[str, Decimal] = {}
    for ln in models:
        allocated[ln.model] = allocated.get(ln.model, _ZERO) + ln.allocated_gpu_hours
        used[ln.model] = used.get(ln.model, _ZERO) + (ln.used_gpu_hours or _ZERO)
        unknown[ln.model] = unknown.get(ln.model, _ZERO) + ln.sm_unknown_gpu_hours
        if ln.kind == "down":
            down[ln.model] = down.get(ln.model, _ZERO) + ln.fleet_gpu_hours
    return [
        ModelCapacity(
            model=str(model),
            devices=int(devices),
            capacity_gpu_hours=Decimal(int(hours)),
            allocated_gpu_hours=allocated.get(model, _ZERO),
            down_gpu_hours=down.get(model, _ZERO),
            price=prices(model) if prices is not None else None,
            used_gpu_hours=used.get(model, _ZERO),
            sm_unknown_gpu_hours=unknown.get(model, _ZERO),
        )
        for model, devices, hours in rows
    ]


def _maturity(now: list[ModelCapacity], before: list[ModelCapacity] | None) -> list[Maturity]:
    """Per model, then the fleet (model ''), with last month's figures where the ledger has
    them."""

    def fleet(caps: list[ModelCapacity]) -> tuple[Decimal | None, int | None]:
        u = utilisation(sum((c.used_gpu_hours for c in caps), _ZERO),
                        sum((c.capacity_gpu_hours for c in caps), _ZERO),
                        sum((c.sm_unknown_gpu_hours for c in caps), _ZERO))
        return u, maturity_level(u)

    prev = {c.model: c for c in before or []}
    out = []
    for c in now:
        p = prev.get(c.model)
        out.append(Maturity(c.model, c.utilisation, c.maturity,
                            p.utilisation if p else None, p.maturity if p else None))
    if now:
        u, level = fleet(now)
        pu, plevel = fleet(before) if before else (None, None)
        out.append(Maturity("", u, level, pu, plevel))
    return out


def build_report(
    con: Any,
    month: Month,
    cost_model: CostModelInfo,
    tool_version: str,
    top_pods: int = DEFAULT_TOP_PODS,
    prices: PriceLookup | None = None,
    budgets: Mapping[str, Decimal] | None = None,
    warn_at: Decimal = Decimal(1),
    cluster: str = "",
) -> Report:
    """Read the month's charges (and the previous month's, for the change) into report tables.
    `con` sees the ledger the report is about (metering.ledgerview: the whole fleet, or one
    cluster's rows, named by `cluster`)."""
    covered = covered_hours(con, month)
    every_hour = (month.start + i * _HOUR for i in range(month.hours))
    missing = hour_ranges(h for h in every_hour if h not in covered)

    prev_month = month.previous()
    fleet_now = _fleet(con, month)
    fleet_prev = _fleet(con, prev_month)
    has_previous = fleet_prev is not None
    total = fleet_now.cost if fleet_now else _ZERO

    def section(keys: Sequence[str], where: str = "", vanished: bool = True) -> list[Line]:
        prev = _grouped(con, prev_month, keys, where) if has_previous else None
        return _lines(keys, _grouped(con, month, keys, where), prev, total, vanished)

    fleet_line = (fleet_now or _NO_SUMS).line(
        share_of_total=Decimal(1).quantize(_Q6) if total else None,
        previous_cost=fleet_prev.cost if fleet_prev else None,
    )

    team_days = _lines(["day", "team"], _grouped(con, month, ["day", "team"]), None, total)
    team_days.sort(key=lambda ln: (ln.day, ln.overhead, ln.kind, ln.team))
    pods = section(["team", "namespace", "pod"], "AND pod <> ''", False)
    models = section(["model", "sharing", "profile"])
    teams = section(["team"])
    clusters = _cluster_lines(con, month, prev_month if has_previous else None, total)
    elapsed = elapsed_hours(con, month)
    capacity = _capacity(con, month, models, prices)
    before = None
    if has_previous:
        keys = ["model", "sharing", "profile"]
        prev_models = _lines(keys, _grouped(con, prev_month, keys), None, _ZERO)
        before = _capacity(con, prev_month, prev_models, None)
    return Report(
        month=month,
        cost_model=cost_model,
        tool_version=tool_version,
        hours_with_data=len(covered),
        missing=missing,
        fleet=fleet_line,
        teams=teams,
        namespaces=section(["namespace"]),
        models=models,
        pods=pods[:top_pods],
        team_days=team_days,
        has_previous=has_previous,
        has_data=fleet_now is not None,
        top_pods=top_pods,
        sm_unknown_mig_gpu_hours=_sm_unknown_on_mig(con, month),
        capacity=capacity,
        maturity=_maturity(capacity, before),
        budgets=None if budgets is None
        else budget_lines(teams, budgets, warn_at, elapsed, month.hours),
        elapsed_hours=elapsed,
        cluster=cluster,
        clusters=clusters,
    )


def _cluster_lines(con: Any, month: Month, previous: Month | None, total: Decimal
                   ) -> list[Line]:
    """Per cluster, all its rows together (team charges, idle, down, adjustment)."""

    def sums(m: Month) -> dict[Key, Sums]:
        rows = con.execute(f"SELECT cluster, {_SUMS} FROM charges WHERE hour >= ? AND hour < ? "
                           "GROUP BY cluster", [m.start, m.end]).fetchall()
        return {((str(r[0]),), ""): _sums(r[1:]) for r in rows}

    return _lines(["cluster"], sums(month), sums(previous) if previous else None, total)


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


def charge_days(con: Any, month: Month) -> list[ChargeDay]:
    rows = con.execute(
        "SELECT CAST(CAST(hour AS DATE) AS TIMESTAMP), team, namespace, pod, model, sharing, "
        f"profile, {_KIND_KEY}, cluster, "
        # an idle-share row of policy weights carries the team's weight in fraction, no hours
        "SUM(CASE WHEN basis = 'idle-share' THEN 0 ELSE CAST(fraction AS DECIMAL(38, 9)) END), "
        "SUM(CAST(allocated_gpu_hours AS DECIMAL(38, 9))), "
        "SUM(CAST(used_gpu_hours AS DECIMAL(38, 9))), SUM(cost), SUM(idle_share) "
        "FROM charges WHERE hour >= ? AND hour < ? GROUP BY ALL ORDER BY ALL",
        [month.start, month.end],
    ).fetchall()
    return [
        ChargeDay(day, team, ns, pod, mdl, sharing, profile, kind, _q6(charged), _q6(alloc),
                  None if used is None else _q6(used), Decimal(cost), Decimal(idle), cluster)
        for day, team, ns, pod, mdl, sharing, profile, kind, cluster, charged, alloc, used, cost,
        idle in rows
    ]
