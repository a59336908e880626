"""Number and label formatting shared by the outputs meant for people (Markdown, HTML,
terminal). CSV and Parquet keep the exact figures; these round for reading."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from decimal import ROUND_FLOOR, ROUND_HALF_UP, Decimal

from metering.report.model import Energy, Line, Report
from metering.report.waste import Kind, Recommendation

CENT = Decimal("0.01")
DASH = "—"


def cents(value: Decimal) -> Decimal:
    return value.quantize(CENT, rounding=ROUND_HALF_UP)


def apportion_cents(values: Sequence[Decimal], total: Decimal) -> list[Decimal]:
    """Round each value to cents so the rounded values add up to the rounded total.

    Largest remainder: every value is floored to the cent, then the cents still missing go
    to the values that lost the most, first row first on ties. No value moves by more than a
    cent, and a table of teams adds up to the fleet total that is printed under it.
    """
    floors = [v.quantize(CENT, rounding=ROUND_FLOOR) for v in values]
    missing = int((cents(total) - sum(floors, Decimal(0))) / CENT)
    order = sorted(range(len(values)), key=lambda i: (-(values[i] - floors[i]), i))
    out = list(floors)
    for i in order[: max(0, min(missing, len(values)))]:
        out[i] += CENT
    return out


def money(value: Decimal) -> str:
    return f"{cents(value):,.2f}"


def hours(value: Decimal | None) -> str:
    """GPU-hours; a dash where they are unknown (SM activity of MIG without GPM)."""
    return DASH if value is None else f"{value:,.2f}"


def percent(value: Decimal | None) -> str:
    return DASH if value is None else f"{value * 100:.1f}%"


def change(line: Line, has_previous: bool) -> str:
    """Cost change against the previous month: `+12.30 (+4.1%)`, `new`, or a dash."""
    prev, diff = line.previous_cost, line.cost_change
    if not has_previous or prev is None or diff is None:
        return DASH
    if prev == 0:
        return "new" if line.cost else DASH
    sign = "+" if diff >= 0 else "−"
    return f"{sign}{money(abs(diff))} ({sign}{abs(diff) / prev * 100:.1f}%)"


KIND_LABELS = {
    "idle": "idle (unallocated)",
    "down": "down (GPU unavailable)",
    "adjustment": "adjustment (discounts, tiers)",
}


def label(value: str, kind: str = "") -> str:
    """A key as people read it: fleet rows are named for what they are, empty keys get a word."""
    if kind:
        return KIND_LABELS.get(kind, kind)
    return value if value != "" else "(none)"


def sharing(line: Line) -> str:
    if line.overhead:
        return line.kind
    if line.sharing == "idle":  # a team's share of weighted idle
        return "idle (shared out)"
    if line.sharing == "mig" and line.profile:
        return f"MIG {line.profile}"
    return {"mps": "MPS", "mig": "MIG"}.get(line.sharing, line.sharing)


def currency(report: Report) -> str:
    return report.cost_model.currency or "cost units"


def coverage_text(report: Report) -> str:
    got, of = report.hours_with_data, report.hours_in_period
    if got == of:
        return f"all {of} hours have data"
    return f"{got} of {of} hours have data; no data in {len(report.missing)} range(s)"


def sm_text(report: Report) -> str:
    """Which share of allocated GPU-hours has no SM data, and why: used GPU-hours and
    efficiency are over the rest, so a reader must know how much that leaves out."""
    share = report.sm_unknown_share
    if share is None:
        return "no allocated GPU-hours"
    unknown = report.fleet.sm_unknown_gpu_hours
    if unknown <= 0:
        return "known for all allocated GPU-hours"
    causes = []
    if report.sm_unknown_mig_gpu_hours > 0:
        causes.append("MIG without GPM")
    if unknown > report.sm_unknown_mig_gpu_hours:
        causes.append("no SM samples")
    pct = f"{share * 100:.1f}%" if share >= Decimal("0.0005") else "<0.1%"
    return (f"SM activity unknown for {pct} of allocated GPU-hours ({', '.join(causes)}); "
            "used GPU-hours and efficiency cover the rest")


def period_text(report: Report) -> str:
    m = report.month
    return f"{m.start:%Y-%m-%d %H:%M} – {m.end:%Y-%m-%d %H:%M} UTC ({report.hours_in_period} h)"


def cost_model_text(report: Report) -> str:
    cm = report.cost_model
    file = cm.file or "not given"
    return f"{file} (hash {cm.hash or 'unknown'})"


def previous_text(report: Report) -> str:
    prev = report.month.previous()
    if report.has_previous:
        return f"changes are against {prev}"
    return f"no charges for {prev} in the database, so no change column"


@dataclass(frozen=True)
class Grid:
    """A report table as text cells; `kinds` marks rows as '', a fleet row kind, or 'total'."""

    heads: list[str]
    numeric_from: int  # columns from here on are figures (right-aligned)
    rows: list[list[str]]
    kinds: list[str]
    notes: list[str] = field(default_factory=list)  # footnotes printed under the table
    text_columns: tuple[int, ...] = ()  # columns after numeric_from that are text

    def numeric(self, column: int) -> bool:
        return column >= self.numeric_from and column not in self.text_columns


OVER_MARK = "*"
OVER_NOTE = (
    f"{OVER_MARK} Efficiency above 100 %: on time-sliced, MPS and vGPU GPUs a holder is "
    "allocated its share of the device (one of four replicas = 25 %, an A100-20C vGPU 20 of "
    "80 GB = 25 %) but may keep the whole device busy while its neighbours are idle, so it "
    "used more than it was allocated. Not a measurement error."
)
GPU_HOURS_NOTE = (
    "GPU-hours: allocated GPU-hours for teams (a 3g.40gb MIG slice of a 7-slice GPU for an "
    "hour is 3/7, one of four time-slicing replicas 1/4); for the idle and down rows, the "
    "device-hours nobody held or the GPU was not up; on the total row, all of them. Used "
    "GPU-hours: SM activity in device-hours. Efficiency: used GPU-hours / the row's own "
    "GPU-hours (those with SM activity known); on the total row that is the fleet's "
    "utilisation."
)


def efficiency(line: Line) -> str:
    """Efficiency as a percentage, marked when above 100 % (explained by OVER_NOTE)."""
    eff = line.efficiency
    return percent(eff) + (OVER_MARK if eff is not None and eff > 1 else "")


def energy_heads(report: Report) -> list[str]:
    """Energy columns of a breakdown, where the month's energy is reported: kWh always, the
    energy line's cost where `energy:` priced it, kg CO2e where `carbon:` gave intensities."""
    if not report.energy_shown:
        return []
    return ["Energy kWh", *([f"Energy ({currency(report)})"] if report.energy_priced else []),
            *(["kg CO2e"] if report.carbon_shown else [])]


def energy_cells(report: Report, line: Line) -> list[str]:
    if not report.energy_shown:
        return []
    zero = Decimal(0)
    e = line.energy or Energy(zero, zero, zero)
    cells = [f"{e.kwh:,.3f}"]
    if report.energy_priced:
        cells.append(f"{cents(e.cost or zero):,.2f}")
    if report.carbon_shown:
        cells.append(f"{e.co2e_kg or zero:,.3f}")
    return cells


def energy_text(report: Report) -> str:
    """The month's measured energy, its line on the bill and its carbon, fleet-wide."""
    e = report.fleet.energy
    if e is None:
        return ""
    out = f"{e.kwh:,.3f} kWh measured"
    if e.estimated_kwh:
        out += f" ({e.estimated_kwh:,.3f} kWh estimated from power samples)"
    if e.cost is not None:
        out += (f"; energy {cents(e.cost):,.2f} {currency(report)} billed apart from compute "
                f"{cents(report.fleet.cost):,.2f} {currency(report)}")
    else:
        out += "; priced inside the device-hour rate (no `energy:` in the cost model)"
    if e.co2e_kg is not None:
        out += f"; {e.co2e_kg:,.3f} kg CO2e"
    return out


ENERGY_NOTE = (
    "Energy: each device-hour's measured joules split among its holders (exclusive: all of "
    "the time held; MIG: the instance's GPM activity, else its slices; time-slicing, MPS, "
    "fractional, vGPU: SM activity), the rest on the idle and down rows. Its cost is kWh x "
    "PUE x the tariff's price of the hour, billed apart from the compute cost; kg CO2e is "
    "kWh x PUE x the grid's intensity (docs/reports.md, \"Energy and carbon\")."
)


def grid(
    report: Report,
    key_heads: Sequence[str],
    keys: Callable[[Line], Sequence[str]],
    lines: Sequence[Line],
    total: Line | None,
    first: bool = False,
) -> Grid:
    """Rows of a breakdown, with a fleet total row when the rows partition the fleet.
    The first table of the report explains its columns in a footnote.

    With a total, costs are apportioned to the cent so the printed rows add up to it.
    """
    show_idle_share = report.fleet.idle_share != 0
    heads = [
        *key_heads,
        "GPU-hours",
        "Used GPU-h",
        "Efficiency",
        f"{'Compute' if report.energy_priced else 'Cost'} ({currency(report)})",
    ]
    if show_idle_share:
        heads.append("of which shared idle")
    heads += energy_heads(report)
    heads.append("Share")
    if report.has_previous:
        heads.append(f"Change vs {report.month.previous()}")
    if total is not None:
        costs = apportion_cents([ln.cost for ln in lines], total.cost)
    else:
        costs = [cents(ln.cost) for ln in lines]
    entries: list[tuple[str, Line, Decimal, Sequence[str]]] = [
        (ln.kind, ln, c, keys(ln)) for ln, c in zip(lines, costs, strict=True)
    ]
    if total is not None:
        entries.append(
            ("total", total, cents(total.cost), ["Fleet total"] + [""] * (len(key_heads) - 1))
        )
    rows, kinds = [], []
    for kind, ln, cost, key_values in entries:
        cells = [
            *key_values,
            hours(ln.gpu_hours),
            hours(ln.used_gpu_hours),
            efficiency(ln),
            f"{cost:,.2f}",
        ]
        if show_idle_share:
            cells.append(money(ln.idle_share))
        cells += energy_cells(report, ln)
        cells.append(percent(ln.share_of_total))
        if report.has_previous:
            cells.append(change(ln, report.has_previous))
        rows.append(cells)
        kinds.append(kind)
    notes = [GPU_HOURS_NOTE] if first else []
    if first and report.energy_shown:
        notes.append(ENERGY_NOTE)
    if any((ln.efficiency or 0) > 1 for _, ln, _, _ in entries):
        notes.append(OVER_NOTE)
    return Grid(heads, len(key_heads), rows, kinds, notes)


def sections(report: Report) -> list[tuple[str, Grid]]:
    """The breakdown tables every human-readable output shows, in order."""
    return [
        (
            "Cost by team",
            grid(
                report, ["Team"], lambda ln: [label(ln.team, ln.kind)], report.teams, report.fleet,
                first=True,
            ),
        ),
        *([("Cost by cluster", grid(report, ["Cluster"], lambda ln: [label(ln.cluster)],
                                    report.clusters, report.fleet))]
          if len(report.clusters) > 1 else []),
        ("Prices and capacity by GPU model", price_grid(report)),
        ("Utilisation maturity", maturity_grid(report)),
        *([("Budgets", b)] if (b := budget_grid(report)) is not None else []),
        *adjustment_sections(report),
        *([("Savings", g)] if (g := savings_grid(report)) is not None else []),
        *([(LARGER_UNIT, g)] if (g := larger_unit_grid(report)) is not None else []),
        (
            "By namespace",
            grid(
                report,
                ["Namespace"],
                lambda ln: [label(ln.namespace, ln.kind)],
                report.namespaces,
                report.fleet,
            ),
        ),
        (
            "By GPU model and sharing mode",
            grid(
                report,
                ["GPU model", "Sharing"],
                lambda ln: [label(ln.model), sharing(ln)],
                report.models,
                report.fleet,
            ),
        ),
        (
            f"Top {len(report.pods)} pods by cost",
            grid(
                report,
                ["Team", "Namespace", "Pod"],
                lambda ln: [label(ln.team), label(ln.namespace), label(ln.pod)],
                report.pods,
                None,
            ),
        ),
    ]


def closed_text(report: Report) -> str:
    """When `gpu-ledger close` closed the month; '' for an open month."""
    if report.closed_at is None:
        return ""
    return (f"on {report.closed_at:%Y-%m-%d %H:%M} UTC (gpu-ledger close): the charges in this "
            "report never change")


def adjustments_text(report: Report) -> str:
    """Adjustments either way: posted to later months for this closed month, and billed in
    this month for earlier closed months; '' when neither."""
    parts = []
    if report.closed_at is not None or report.adjustments_out:
        posted = sorted({a.posted_month for a in report.adjustments_out})
        total = sum((a.cost for a in report.adjustments_out), Decimal(0))
        parts.append(f"adjustments posted to {', '.join(map(str, posted))}: {total:+,.2f} "
                     f"{currency(report)} (usage metered after the close)" if posted else
                     "none posted since the close")
    if report.adjustments_in:
        fors = sorted({a.for_month for a in report.adjustments_in})
        total = sum((a.cost for a in report.adjustments_in), Decimal(0))
        parts.append(f"adjustments for {', '.join(map(str, fors))}: {total:+,.2f} "
                     f"{currency(report)}, billed in this month")
    return "; ".join(parts)


ADJUSTMENTS_NOTE = (
    "Adjustments: usage of a closed month metered after its close (late samples), per cluster, "
    "team and namespace; its cost is billed in the month that was open when it was metered. "
    "The closed month's charges stay as they were sent."
)


def adjustment_sections(report: Report) -> list[tuple[str, Grid]]:
    """'Adjustments posted to <later month>' (a closed month's report) and 'Adjustments for
    <closed month>' (the month that bills them)."""
    out = []
    for lines, title, posted in ((report.adjustments_out, "Adjustments posted to {}", True),
                                 (report.adjustments_in, "Adjustments for {}", False)):
        for month in sorted({a.posted_month if posted else a.for_month for a in lines}):
            mine = [a for a in lines if (a.posted_month if posted else a.for_month) == month]
            rows = [[a.cluster, label(a.team), label(a.namespace),
                     f"{a.allocated_gpu_hours:+,.1f}", f"{cents(a.cost):+,.2f}"] for a in mine]
            total = sum((a.cost for a in mine), Decimal(0))
            rows.append(["Total", "", "", "", f"{cents(total):+,.2f}"])
            out.append((title.format(month), Grid(
                ["Cluster", "Team", "Namespace", "GPU-hours", f"Cost ({currency(report)})"],
                3, rows, [""] * len(mine) + ["total"], [ADJUSTMENTS_NOTE])))
    return out


def budget_text(report: Report) -> str:
    if report.budgets is None:
        return "unknown (the cost model file is not at hand)"
    if not report.budgets:
        return "none set in the cost model"
    over = [b.team for b in report.budgets if b.status.name == "OVER"]
    heading = [b.team for b in report.budgets if b.status.name == "HEADING_OVER"]
    parts = []
    if over:
        parts.append("over budget: " + ", ".join(over))
    if heading:
        parts.append("heading over: " + ", ".join(heading))
    return "; ".join(parts) if parts else f"all {len(report.budgets)} team(s) within budget"


def capacity_text(report: Report) -> str:
    cap = report.capacity_gpu_hours
    if cap <= 0:
        return "no GPUs in the period"
    n = report.devices
    return f"{cap:,.0f} GPU-hours ({n} GPU{'s' if n != 1 else ''} over the period)"


def allocation_text(report: Report) -> str:
    rate = report.allocation_rate
    if rate is None:
        return DASH
    return (f"{percent(rate)} of capacity allocated to teams "
            f"({hours(report.fleet.allocated_gpu_hours)} GPU-hours)")


def price_grid(report: Report) -> Grid:
    """Per GPU model: capacity, allocation, and the list price with the cost-model entry
    that set it; a model that no entry matched is flagged (it got the default price)."""
    money_head = f"Price per GPU-hour ({currency(report)})"
    heads = ["GPU model", "GPUs", "Capacity GPU-h", "Allocated GPU-h", "Allocation rate",
             money_head, "Set by (cost model)"]
    rows, kinds = [], []
    fallback = False
    for c in report.capacity:
        price, rule = DASH, "cost model file not at hand (hash only)"
        if c.price is not None:
            price = f"{c.price.hourly:,.2f}" if c.price.hourly == cents(c.price.hourly) \
                else f"{c.price.hourly:,.6f}".rstrip("0")
            rule = c.price.rule
            if c.price.discount:
                rule += f"; model discount {c.price.discount * 100:.1f}%"
            if c.price.fallback:
                rule += " — DEFAULT PRICE: no entry matches this model"
                fallback = True
        rows.append([label(c.model), str(c.devices), hours(c.capacity_gpu_hours),
                     hours(c.allocated_gpu_hours), percent(c.allocation_rate), price, rule])
        kinds.append("")
    rows.append(["Fleet total", str(report.devices), hours(report.capacity_gpu_hours),
                 hours(report.fleet.allocated_gpu_hours), percent(report.allocation_rate),
                 "", ""])
    kinds.append("total")
    notes = ["Capacity: every hour of the period each GPU was in the fleet, up or not. "
             "Allocation rate: allocated GPU-hours / capacity."]
    if fallback:
        notes.append("DEFAULT PRICE: the cost model has no entry for this GPU model, so it "
                     "was priced at pricing.default; add an entry under pricing.gpus.")
    return Grid(heads, 1, rows, kinds, notes, text_columns=(len(heads) - 1,))


SPEND_NOTE = (
    "Spend: the team's bill so far: its compute charges (shared-out idle included), its "
    "energy line and the adjustments billed in this month for closed months."
)

FORECAST_NOTE = (
    "Forecast: the month's usage so far (compute and energy) extrapolated linearly to the "
    "month's end (x hours in the month / hours elapsed, through the last hour with data), "
    "plus the adjustments billed in it. Heading over: the forecast reaches the budget (or the "
    "cost model's budgets.warn_at share of it)."
)


CLOSED_NOTE = (
    "The month is closed: spend is the month's actual bill, and nothing is forecast "
    "(hours without data are a coverage gap, not spend still to come)."
)


def budget_grid(report: Report) -> Grid | None:
    """Teams with a budget: spend, budget, forecast (open months only), status; None when
    there is nothing to show."""
    if not report.budgets:
        return None
    heads = ["Team", f"Budget ({currency(report)})", "Spend", "Used"]
    if not report.closed:
        heads.append("Forecast to month end")
    heads.append("Status")
    rows, kinds = [], []
    for b in report.budgets:
        row = [label(b.team), money(b.budget), money(b.spend), percent(b.used)]
        if not report.closed:
            row.append(DASH if b.forecast is None else money(b.forecast))
        row.append(b.status.value.upper() if b.status.name != "WITHIN" else b.status.value)
        rows.append(row)
        kinds.append("")
    if report.closed:
        return Grid(heads, 1, rows, kinds, [SPEND_NOTE, CLOSED_NOTE])
    elapsed = f"{report.elapsed_hours} of {report.hours_in_period} hours of the month elapsed."
    return Grid(heads, 1, rows, kinds, [SPEND_NOTE, f"{elapsed} {FORECAST_NOTE}"])


LEVEL_NAMES = {1: "level 1 (< 30 %)", 2: "level 2 (30–50 %)", 3: "level 3 (50–80 %)",
               4: "level 4 (> 80 %)"}
MATURITY_NOTE = (
    "Utilisation: used GPU-hours (SM activity) / capacity, leaving out capacity whose SM "
    "activity is unknown (MIG without GPM). Maturity level from the GPU management maturity "
    "scale: 1 below 30 %, 2 from 30 to 50 %, 3 from 50 to 80 %, 4 above 80 %."
)


def level_text(level: int | None) -> str:
    return DASH if level is None else LEVEL_NAMES[level]


def maturity_text(report: Report) -> str:
    fleet = next((m for m in report.maturity if m.model == ""), None)
    if fleet is None or fleet.level is None:
        return "unknown (no capacity with known SM activity)"
    text = f"{level_text(fleet.level)}, utilisation {percent(fleet.utilisation)}"
    if fleet.previous_level is not None:
        prev = report.month.previous()
        text += (f"; {prev}: level {fleet.previous_level}, "
                 f"{percent(fleet.previous_utilisation)} ({points(fleet.change_points)})")
    return text


def points(change: Decimal | None) -> str:
    if change is None:
        return DASH
    return f"{'+' if change >= 0 else '−'}{abs(change)} points"


def maturity_grid(report: Report) -> Grid:
    prev = report.month.previous()
    heads = ["GPU model", "Utilisation", "Maturity"]
    if report.has_previous:
        heads += [f"Utilisation {prev}", f"Maturity {prev}", "Change"]
    rows, kinds = [], []
    for m in report.maturity:
        row = [label(m.model) if m.model else "Fleet", percent(m.utilisation),
               level_text(m.level)]
        if report.has_previous:
            row += [percent(m.previous_utilisation), level_text(m.previous_level),
                    points(m.change_points)]
        rows.append(row)
        kinds.append("" if m.model else "total")
    return Grid(heads, 1, rows, kinds, [MATURITY_NOTE])


def cluster_text(report: Report) -> str:
    """Which cluster(s) the report covers; '' for a ledger that only knows one cluster."""
    if report.cluster:
        return f"{report.cluster} (per-cluster view)"
    if len(report.clusters) > 1:
        names = ", ".join(ln.cluster for ln in report.clusters)
        return f"fleet view over {len(report.clusters)} clusters: {names}"
    return ""


def facts(report: Report) -> list[tuple[str, str]]:
    """What every report states about itself, as (name, text)."""
    return [
        ("Period", period_text(report)),
        *([("Cluster", cluster_text(report))] if cluster_text(report) else []),
        ("Data coverage", coverage_text(report)),
        ("Capacity", capacity_text(report)),
        ("Allocation rate", allocation_text(report)),
        ("Fleet maturity", maturity_text(report)),
        ("SM activity", sm_text(report)),
        ("Cost model", cost_model_text(report)),
        ("Currency", currency(report)),
        ("Budgets", budget_text(report)),
        ("Savings", savings_text(report)),
        *([("Idle energy", t)] if report.energy_shown and (t := fleet_energy_text(report))
          else []),
        ("Idle", report.idle_policy),
        *([("Energy", energy_text(report))] if report.energy_shown else []),
        ("Previous month", previous_text(report)),
        *([("Closed", closed_text(report))] if closed_text(report) else []),
        *([("Adjustments", adjustments_text(report))] if adjustments_text(report) else []),
        ("Tool", f"gpu-ledger {report.tool_version}"),
    ]


SAVINGS_NOTE = (
    "Recommendations read the month's facts and never change a bill. Saving: what the "
    "workload's holding cost this month (at the cost model's prices, without shared-out idle) "
    "minus what the proposed unit would have cost; negative when the workload needs a larger "
    "unit. Peak and p95 memory: of the hourly peaks; p95 SM: of the hourly mean SM activity of "
    "the unit held (whole GPU, or the MIG instance by GPM), all over the hours it ran a process "
    "(hours with none count only as idle holding). Coverage: share of those device-hours with "
    "memory and SM figures. Confidence, from the hours a recommendation is judged on (the "
    "busy hours for a rightsizing, every held hour for an idle holder) and their coverage: "
    "high from a week of hours with 90 % coverage, medium from 75 % coverage, else low."
)
LARGER_UNIT = "Needs a larger unit"
LARGER_UNIT_NOTE = (
    "Workloads that outgrew the unit they hold (a MIG instance at 95 % of its memory or SM): "
    "the larger unit would cost the amount shown more this month (0.00 where the cost model "
    "prices both profiles the same). Not a saving: listed apart from the savings, and not in "
    "their total."
)


def evidence_text(rec: Recommendation) -> str:
    ev = rec.evidence
    if rec.kind is Kind.IDLE:
        return (f"{ev.idle_device_hours} device-hours held with no GPU process; "
                f"{ev.all_hours} h observed")
    parts = []
    if ev.peak_memory_gb is not None:
        parts.append(f"peak memory {ev.peak_memory_gb:.1f} GB")
    if ev.p95_memory_gb is not None:
        parts.append(f"p95 memory {ev.p95_memory_gb:.1f} GB")
    if ev.p95_sm is not None:
        parts.append(f"p95 SM {percent(ev.p95_sm)}")
    parts.append(f"{ev.hours} h with a process observed")
    parts.append(f"coverage {percent(ev.coverage)}")
    return ", ".join(parts)


def savings_text(report: Report) -> str:
    if report.savings is None:
        return "not computed (the cost model file is not at hand)"
    savings, larger = saving_recs(report), larger_unit_recs(report)
    if not savings and not larger:
        return "no recommendation for this month"
    total = sum((r.saving for r in savings), Decimal(0))
    text = (f"{len(savings)} recommendation(s); up to {money(total)} {currency(report)} "
            "this month")
    if report.energy_shown:
        kwh = sum((r.energy_saving_kwh or Decimal(0) for r in savings), Decimal(0))
        text += f", {kwh:,.3f} kWh"
        if report.carbon_shown:
            kg = sum((r.co2e_saving_kg or Decimal(0) for r in savings), Decimal(0))
            text += f", {kg:,.3f} kg CO2e"
    if larger:
        text += f"; {len(larger)} workload(s) need a larger unit"
    return text


def fleet_energy_text(report: Report) -> str:
    """Savings' energy view of the fleet rows: what idle and down GPUs drew this month."""
    parts = []
    for ln in report.teams:
        if ln.kind in ("idle", "down") and ln.energy is not None and ln.energy.kwh:
            what = "idle GPUs and idle SMs" if ln.kind == "idle" else "down GPUs"
            carbon = (f", {ln.energy.co2e_kg:,.3f} kg CO2e"
                      if ln.energy.co2e_kg is not None else "")
            parts.append(f"{what} {ln.energy.kwh:,.3f} kWh{carbon}")
    return "; ".join(parts)


def saving_recs(report: Report) -> list[Recommendation]:
    """Recommendations that save money, largest saving first."""
    return [r for r in report.savings or [] if r.kind is not Kind.MIG_UP and r.saving > 0]


def larger_unit_recs(report: Report) -> list[Recommendation]:
    """Workloads whose unit is full (MIG profile up): largest extra cost first (0.00 where
    the larger profile is priced the same)."""
    return sorted((r for r in report.savings or [] if r.kind is Kind.MIG_UP),
                  key=lambda r: (r.saving, r.workload))


def workload_name(report: Report, r: Recommendation, short: bool = False) -> str:
    """A recommendation's workload as the report names it, with its cluster where the report
    spans several (the same Deployment name in two clusters is two workloads)."""
    name = (f"{r.namespace}/{r.owner_name}" if short
            else f"{r.namespace}/{r.owner_kind} {r.owner_name}")
    return f"{r.cluster}: {name}" if len(report.clusters) > 1 else name


def _recommendation_grid(report: Report, recs: list[Recommendation], amount_head: str,
                         note: str) -> Grid | None:
    if not recs:
        return None
    heads = ["#", "Workload", "Team", "GPU model", "Holds", "Recommendation",
             f"{amount_head} ({currency(report)})"]
    if report.energy_shown:
        heads.append("kWh")
    if report.carbon_shown:
        heads.append("kg CO2e")
    heads += ["Confidence", "Evidence"]
    rows, kinds = [], []
    for i, r in enumerate(recs, start=1):
        row = [str(i), workload_name(report, r), label(r.team),
               r.model, r.current, f"{r.kind.value}: {r.proposed}", money(abs(r.saving))]
        if report.energy_shown:
            row.append(DASH if r.energy_saving_kwh is None else f"{abs(r.energy_saving_kwh):,.3f}")
        if report.carbon_shown:
            row.append(DASH if r.co2e_saving_kg is None else f"{abs(r.co2e_saving_kg):,.3f}")
        rows.append([*row, r.confidence, evidence_text(r)])
        kinds.append("")
    # no column is right-aligned: the amount sits between text columns
    return Grid(heads, len(heads), rows, kinds, [note])


def savings_grid(report: Report) -> Grid | None:
    return _recommendation_grid(report, saving_recs(report), "Saving", SAVINGS_NOTE)


def larger_unit_grid(report: Report) -> Grid | None:
    return _recommendation_grid(report, larger_unit_recs(report), "Extra cost",
                                LARGER_UNIT_NOTE)
