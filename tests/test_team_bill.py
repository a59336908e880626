"""A team's month-to-date spend is what its bill says (issue 27): compute charges + energy line
+ adjustments billed in the month for a closed month, one definition for the report's Budgets,
`--check-budgets` and the series `meter --pushgateway` pushes. Figures worked out by hand."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from pathlib import Path

from test_energy_report import OCT1
from test_pricing import alloc

from metering import publish
from metering.closes import Adjustment
from metering.costmodel import load_cost_model
from metering.db import connect
from metering.period import Month, Period
from metering.pricing import price_period
from metering.report import fmt, tidy
from metering.report.builder import make_report
from metering.report.cli import BUDGET_EXCEEDED
from metering.report.cli import main as report_main
from metering.report.model import (
    BudgetStatus,
    Energy,
    Line,
    TeamBill,
    budget_lines,
    team_bills,
)
from tests.test_energy import BASE, ENERGY, device

D = Decimal
MONTH = Month(2026, 10)
# By hand (tests/test_energy_report.py): science held GPU-0 08:00-10:00 on October 1st:
# compute 2 x 1.25 = 2.50, energy 1.4 kWh x 1.2 x 0.30 = 0.504. September is closed, and late
# data of September 10th posted +1.25 for science and -0.40 for ml to October.
BUDGETS = "budgets:\n  monthly: {science: 4.2, ml: 1}\n"


def ledger(tmp_path: Path) -> tuple[Path, Path]:
    cm = tmp_path / "cost-model.yaml"
    cm.write_text(BASE + ENERGY + BUDGETS)
    db = tmp_path / "m.duckdb"
    con = connect(db)
    for h in (8, 9):
        device(con, "GPU-0", 2_520_000.0, hour=OCT1 + timedelta(hours=h))
        alloc(con, "train", "GPU-0", hour=OCT1 + timedelta(hours=h))
    model = load_cost_model(cm)
    price_period(con, model, MONTH.start, MONTH.end)
    con.execute("INSERT INTO month_closes VALUES (DATE '2026-09-01', TIMESTAMP '2026-10-01 "
                "06:00', 0, 0)")
    for team, ns, cost in (("science", "research", "1.25"), ("ml", "ml-a", "-0.40")):
        con.execute("INSERT INTO adjustments VALUES (TIMESTAMP '2026-09-10 04:00', 'default', "
                    "?, ?, ?, 1.0, DATE '2026-10-01', TIMESTAMP '2026-10-02 00:30', ?)",
                    [team, ns, D(cost), model.hash])
    con.close()
    return db, cm


def test_spend_is_compute_plus_energy_plus_adjustments(tmp_path: Path) -> None:
    db, cm = ledger(tmp_path)
    report = make_report(str(db), MONTH, str(cm), 20)
    bills = team_bills(report.teams, report.adjustments_in)
    assert bills["science"] == TeamBill("science", D("2.5"), D("0.504"), D("1.25"))
    assert bills["science"].total == D("4.254")
    assert bills["ml"] == TeamBill("ml", D(0), D(0), D("-0.40"))
    spend = {b.team: (b.spend, b.status) for b in report.budgets or []}
    # 4.254 > 4.2: over budget only with energy and the adjustment counted (compute is 2.50)
    assert spend == {"science": (D("4.254"), BudgetStatus.OVER),
                     "ml": (D("-0.40"), BudgetStatus.WITHIN)}
    grid = dict(fmt.sections(report))["Budgets"]
    assert grid.rows[1][:3] == ["science", "4.20", "4.25"]
    assert any("energy line and the adjustments" in n for n in grid.notes)
    rows = {r["team"]: r["cost"] for r in tidy.rows(report) if r["section"] == "budget"}
    assert rows == {"science": D("4.254"), "ml": D("-0.40")}
    # the pushed series are the same figures
    state = publish.RunState("default", Period(MONTH.start, MONTH.end), 744, 0.0, MONTH,
                             "EUR", report.budgets or [])
    text = publish.exposition(state)
    assert (f'{publish.SPEND}{{team="science",month="2026-10",currency="EUR"}} 4.254'
            in text)
    assert f'{publish.SPEND}{{team="ml",month="2026-10",currency="EUR"}} -0.4' in text
    assert report_main(["--month", "2026-10", "--db", str(db), "--out", str(tmp_path / "o"),
                        "--format", "csv", "--check-budgets"]) == BUDGET_EXCEEDED


def test_forecast_extrapolates_usage_and_adds_adjustments_once() -> None:
    teams = [Line(team="science", cost=D(2), energy=Energy(kwh=D(1), cost=D("0.5"),
                                                           co2e_kg=None)),
             Line(team="idle", kind="idle", cost=D(9))]
    adj = [Adjustment(Month(2026, 9), MONTH, "default", "science", "research", D(3), 1.0)]
    # 48 of 744 hours: (2 + 0.5) x 15.5 + 3 = 41.75; spend 2 + 0.5 + 3 = 5.5
    (line,) = budget_lines(teams, {"science": D(40)}, D(1), 48, 744, adjustments_in=adj)
    assert (line.spend, line.forecast, line.status) == (D("5.5"), D("41.75"),
                                                        BudgetStatus.HEADING_OVER)
