"""The one tidy table behind the CSV and Parquet outputs.

One row per figure group: a `section` column says which breakdown the row belongs to, key
columns that do not apply to it are empty. Every row repeats the report's context (period,
cost model, coverage, tool version), so a row read on its own still says where it came from.
Column names and order are a contract, documented in docs/reports.md.
"""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal

from metering.period import HourRange
from metering.report.model import Line, ModelCapacity, Report
from metering.report.waste import Recommendation

# (name, kind); kind drives the CSV text form and the Parquet type.
COLUMNS: tuple[tuple[str, str], ...] = (
    ("period", "str"),
    ("section", "str"),
    ("rank", "int"),
    ("team", "str"),
    ("namespace", "str"),
    ("pod", "str"),
    ("model", "str"),
    ("sharing", "str"),
    ("profile", "str"),
    ("day", "str"),
    ("kind", "str"),
    ("hour_from", "str"),
    ("hour_to", "str"),
    ("hours", "int"),
    ("allocated_gpu_hours", "float"),
    ("used_gpu_hours", "float"),
    ("efficiency", "float"),
    ("cost", "money"),
    ("idle_share", "money"),
    ("share_of_total", "float"),
    ("previous_cost", "money"),
    ("cost_change", "money"),
    ("currency", "str"),
    ("cost_model_file", "str"),
    ("cost_model_hash", "str"),
    ("hours_in_period", "int"),
    ("hours_with_data", "int"),
    ("tool_version", "str"),
    ("sm_unknown_gpu_hours", "float"),
    ("gpu_hours", "float"),
    ("devices", "int"),
    ("capacity_gpu_hours", "float"),
    ("allocation_rate", "float"),
    ("price_hourly", "money"),
    ("price_rule", "str"),
    ("price_default", "bool"),
    ("budget", "money"),
    ("forecast", "money"),
    ("budget_status", "str"),
    ("utilisation", "float"),
    ("maturity_level", "int"),
    ("previous_utilisation", "float"),
    ("previous_maturity_level", "int"),
    ("owner_kind", "str"),
    ("owner_name", "str"),
    ("recommendation", "str"),
    ("current_unit", "str"),
    ("proposed_unit", "str"),
    ("saving", "money"),
    ("confidence", "str"),
    ("peak_memory_gb", "float"),
    ("p95_memory_gb", "float"),
    ("p95_sm", "float"),
    ("hours_observed", "int"),
    ("coverage", "float"),
    ("idle_device_hours", "int"),
    # the cluster a row is about: the report's (--cluster), '' in the fleet view, and each
    # cluster's own on rows of section `cluster` and on `savings` rows (a workload's cluster)
    ("cluster", "str"),
)
COLUMN_NAMES = tuple(name for name, _ in COLUMNS)
# Appended where the month's energy is reported (the cost model has `energy:` or `carbon:`);
# a report without them keeps the columns above, byte for byte.
ENERGY_COLUMNS: tuple[tuple[str, str], ...] = (
    ("energy_kwh", "float"),  # measured kWh (a team's holders' share; idle / down: the rest)
    ("energy_cost", "money"),  # the energy line (kWh x PUE x tariff); null: not priced
    ("co2e_kg", "float"),  # kg CO2e; null: no `carbon:`
    ("energy_estimated_kwh", "float"),  # of energy_kwh, from power samples
    ("energy_saving_kwh", "float"),  # savings rows: kWh the recommendation would save
    ("co2e_saving_kg", "float"),
)


def columns(report: Report) -> tuple[tuple[str, str], ...]:
    return COLUMNS + ENERGY_COLUMNS if report.energy_shown else COLUMNS

# Section names, in the order rows appear.
SECTIONS = ("fleet", "cluster", "team", "namespace", "model_sharing", "pod", "team_day",
            "missing_hours", "adjustment", "model_price", "budget", "maturity", "savings")

Value = str | int | bool | Decimal | None
Row = dict[str, Value]


def _iso(hour_range: HourRange) -> tuple[str, str]:
    fmt = "%Y-%m-%dT%H:%M:%SZ"
    return hour_range.start.strftime(fmt), hour_range.end.strftime(fmt)


def _figures(line: Line) -> Row:
    return {
        **({"cluster": line.cluster} if line.cluster else {}),
        "team": line.team,
        "namespace": line.namespace,
        "pod": line.pod,
        "model": line.model,
        "sharing": line.sharing,
        "profile": line.profile,
        "day": line.day,
        "kind": line.kind,
        "allocated_gpu_hours": line.allocated_gpu_hours,
        "used_gpu_hours": line.used_gpu_hours,  # None (empty / null): unknown
        "sm_unknown_gpu_hours": line.sm_unknown_gpu_hours,
        "gpu_hours": line.gpu_hours,
        "efficiency": line.efficiency,
        "cost": line.cost,
        "idle_share": line.idle_share,
        "share_of_total": line.share_of_total,
        "previous_cost": line.previous_cost,
        "cost_change": line.cost_change,
        **({} if line.energy is None else {
            "energy_kwh": line.energy.kwh, "energy_cost": line.energy.cost,
            "co2e_kg": line.energy.co2e_kg, "energy_estimated_kwh": line.energy.estimated_kwh}),
    }


def rows(report: Report) -> Iterator[Row]:
    """The report as tidy rows; every row has every column of COLUMNS, in order."""
    context: Row = {
        "period": str(report.month),
        # the cluster the report is about ('' in the fleet view); cluster rows carry their own
        "cluster": report.cluster,
        "currency": report.cost_model.currency,
        "cost_model_file": report.cost_model.file,
        "cost_model_hash": report.cost_model.hash,
        "hours_in_period": report.hours_in_period,
        "hours_with_data": report.hours_with_data,
        "tool_version": report.tool_version,
    }
    sections: list[tuple[str, list[Line]]] = [
        ("fleet", [report.fleet]),
        ("cluster", report.clusters),
        ("team", report.teams),
        ("namespace", report.namespaces),
        ("model_sharing", report.models),
        ("pod", report.pods),
        ("team_day", report.team_days),
    ]
    fleet_capacity: Row = {
        "devices": report.devices,
        "capacity_gpu_hours": report.capacity_gpu_hours,
        "allocation_rate": report.allocation_rate,
    }
    for section, lines in sections:
        extra = fleet_capacity if section == "fleet" else {}
        for rank, line in enumerate(lines, start=1):
            yield _complete(
                {**context, "section": section, "rank": rank, **_figures(line), **extra}
            )
    for rank, gap in enumerate(report.missing, start=1):
        start, end = _iso(gap)
        yield _complete(
            {
                **context,
                "section": "missing_hours",
                "rank": rank,
                "hour_from": start,
                "hour_to": end,
                "hours": gap.hours,
            }
        )
    # Billed in this month for a closed month (metering/closes.py); a closed month's own rows
    # never change, so the adjustments posted for it appear in the month that bills them.
    for rank, adj in enumerate(report.adjustments_in, start=1):
        start, end = _iso(HourRange(adj.for_month.start, adj.for_month.end))
        yield _complete({**context, "section": "adjustment", "rank": rank,
                         "cluster": adj.cluster or report.cluster, "team": adj.team,
                         "namespace": adj.namespace, "kind": "correction",
                         "hour_from": start, "hour_to": end,
                         "allocated_gpu_hours": Decimal(repr(adj.allocated_gpu_hours)),
                         "cost": adj.cost})
    for rank, cap in enumerate(report.capacity, start=1):
        yield _complete({**context, "section": "model_price", "rank": rank, **_capacity(cap)})
    for rank, m in enumerate(report.maturity, start=1):
        yield _complete({**context, "section": "maturity", "rank": rank, "model": m.model,
                         "utilisation": m.utilisation, "maturity_level": m.level,
                         "previous_utilisation": m.previous_utilisation,
                         "previous_maturity_level": m.previous_level})
    for rank, rec in enumerate(report.savings or [], start=1):
        yield _complete({**context, "section": "savings", "rank": rank, **_saving(rec)})
    for rank, b in enumerate(report.budgets or [], start=1):
        yield _complete({**context, "section": "budget", "rank": rank, "team": b.team,
                         "cost": b.spend, "budget": b.budget, "forecast": b.forecast,
                         "budget_status": b.status.name.lower()})


def _saving(r: Recommendation) -> Row:
    ev = r.evidence
    return {
        "team": r.team, "cluster": r.cluster, "namespace": r.namespace, "model": r.model,
        "owner_kind": r.owner_kind, "owner_name": r.owner_name,
        "recommendation": r.kind.name.lower(), "current_unit": r.current,
        "proposed_unit": r.proposed, "cost": r.cost, "saving": r.saving,
        "confidence": r.confidence, "peak_memory_gb": ev.peak_memory_gb,
        "p95_memory_gb": ev.p95_memory_gb, "p95_sm": ev.p95_sm, "hours_observed": ev.hours,
        "coverage": ev.coverage, "idle_device_hours": ev.idle_device_hours,
        "gpu_hours": ev.device_hours, "energy_saving_kwh": r.energy_saving_kwh,
        "co2e_saving_kg": r.co2e_saving_kg,
    }


def _capacity(cap: ModelCapacity) -> Row:
    price = cap.price
    return {
        "model": cap.model,
        "allocated_gpu_hours": cap.allocated_gpu_hours,
        "gpu_hours": cap.capacity_gpu_hours,
        "devices": cap.devices,
        "capacity_gpu_hours": cap.capacity_gpu_hours,
        "allocation_rate": cap.allocation_rate,
        "price_hourly": None if price is None else price.hourly,
        "price_rule": "" if price is None else price.rule,
        "price_default": None if price is None else price.fallback,
    }


def _complete(row: Row) -> Row:
    """Text columns that do not apply are '', other columns null."""
    return {name: row.get(name, "" if kind == "str" else None)
            for name, kind in COLUMNS + ENERGY_COLUMNS}
