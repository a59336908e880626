"""Monthly budgets per team (cost model `budgets`), the forecast to month end, and
`report --check-budgets`. Figures worked out by hand."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from pathlib import Path

import pytest
from test_report_fixtures import make_db
from test_report_focus import _db

from metering.costmodel import CostModelError, load_cost_model
from metering.db import connect
from metering.pricing import price_period
from metering.report import fmt, tidy
from metering.report.builder import build_report
from metering.report.cli import BUDGET_EXCEEDED
from metering.report.cli import main as report_main
from metering.report.model import (
    BudgetStatus,
    CostModelInfo,
    Line,
    Month,
    budget_lines,
)

D = Decimal


def test_budget_status_and_forecast_by_hand() -> None:
    teams = [Line(team="ml", cost=D(12)), Line(team="web", cost=D(1)),
             Line(team="lab", cost=D("0.5")), Line(team="idle", kind="idle", cost=D(50))]
    budgets = {"ml": D(10), "web": D(10), "lab": D(100), "quiet": D(5), "idle": D(1)}
    # 48 of 744 hours elapsed: forecast = spend x 744 / 48 = spend x 15.5
    lines = {b.team: b for b in budget_lines(teams, budgets, D(1), 48, 744)}
    assert lines["ml"].status is BudgetStatus.OVER and lines["ml"].forecast == D(186)
    assert lines["web"].status is BudgetStatus.HEADING_OVER and lines["web"].forecast == D("15.5")
    assert lines["lab"].status is BudgetStatus.WITHIN and lines["lab"].forecast == D("7.75")
    assert lines["quiet"].spend == 0 and lines["quiet"].status is BudgetStatus.WITHIN
    # A fleet row is never a team's spend, even if someone budgets a team called like it.
    assert lines["idle"].spend == 0
    # warn_at 0.5: lab's 7.75 of 100 is still within, web's 15.5 of 10 heading over.
    warn = {b.team: b for b in budget_lines(teams, budgets, D("0.5"), 48, 744)}
    assert warn["lab"].status is BudgetStatus.WITHIN
    # Nothing elapsed: no forecast, and no "heading over" from it.
    none = {b.team: b for b in budget_lines(teams, {"web": D(10)}, D(1), 0, 744)}
    assert none["web"].forecast is None and none["web"].status is BudgetStatus.WITHIN


def test_report_budgets_from_the_ledger(tmp_path: Path) -> None:
    con = connect(make_db(tmp_path / "m.duckdb"), read_only=True)
    try:
        report = build_report(con, Month.parse("2026-10"), CostModelInfo("c", "h", "USD"), "0",
                              budgets={"ml": D(10), "research": D(2)}, warn_at=D(1),
                              now=datetime(2026, 10, 31, 23, 30))  # the month still open
    finally:
        con.close()
    # Coverage runs to 2026-10-31 22:00 (23:00 is missing): 743 hours elapsed.
    assert report.elapsed_hours == 743
    b = {x.team: x for x in report.budgets or []}
    assert b["ml"].status is BudgetStatus.OVER and b["ml"].forecast == D("12.016151")
    assert b["research"].status is BudgetStatus.WITHIN
    facts = dict(fmt.facts(report))
    assert facts["Budgets"] == "over budget: ml"
    grid = dict(fmt.sections(report))["Budgets"]
    assert grid.rows[0][:4] == ["ml", "10.00", "12.00", "120.0%"]
    assert grid.rows[0][5] == "OVER BUDGET"
    rows = [r for r in tidy.rows(report) if r["section"] == "budget"]
    assert [(r["team"], r["budget_status"]) for r in rows] == [
        ("ml", "over"), ("research", "within")]


def test_budgets_in_the_cost_model_are_validated(tmp_path: Path) -> None:
    base = "pricing: {default: {hourly: 1}}\n"
    for text, message in (
        ("budgets: {monthly: {ml: -5}}", "budgets.monthly.ml: expected a number > 0"),
        ("budgets: {monthly: {idle: 5}}", "budgets.monthly.idle: expected a team name"),
        ("budgets: {monthly: [ml]}", "budgets.monthly: expected a mapping of team"),
        ("budgets: {warn_at: 1.5}", "budgets.warn_at: expected a number > 0 and <= 1"),
        ("budgets: {montly: {}}", 'did you mean "monthly"?'),
    ):
        path = tmp_path / "cm.yaml"
        path.write_text(base + text)
        with pytest.raises(CostModelError) as e:
            load_cost_model(path)
        assert message in str(e.value), (text, str(e.value))
    path.write_text(base + "budgets: {monthly: {ml: 5000}, warn_at: 0.9}")
    budgets = load_cost_model(path).budgets
    assert budgets.monthly == {"ml": D(5000)} and budgets.warn_at == D("0.9")


def _with_budget(cm: Path, amount: str) -> None:
    cm.write_text(cm.read_text() + f"budgets:\n  monthly: {{vision: {amount}}}\n")


@pytest.mark.parametrize(("amount", "code"), [("5", BUDGET_EXCEEDED), ("6", 0), ("100", 0)])
def test_check_budgets_exit_status(tmp_path: Path, amount: str, code: int,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    db, cm = _db(tmp_path, "separate")
    _with_budget(cm, amount)
    # Budgets are part of the cost model file, so re-price with it (its hash changed).
    con = connect(db)
    month = Month.parse("2026-10")
    price_period(con, load_cost_model(cm), month.start, month.end)
    con.close()
    args = ["--month", "2026-10", "--db", str(db), "--cost-model", str(cm), "--out",
            str(tmp_path / "out"), "--format", "csv", "--check-budgets"]
    assert report_main(args) == code
    err = capsys.readouterr().err
    # vision: 2 GPU-hours at 4.00 with 25 % off = 6.00; over only when the budget is below it.
    if code:
        assert "team 'vision' is over its 2026-10 budget: spent 6.00 of 5.00 EUR" in err
    else:
        assert err == ""
    assert (tmp_path / "out" / "chargeback-2026-10.csv").exists()


def test_check_budgets_without_the_cost_model(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    db, _ = _db(tmp_path, "separate")
    # The ledger keeps the cost model with the charges: its budgets need no --cost-model.
    args = ["--month", "2026-10", "--db", str(db), "--out", str(tmp_path / "o"),
            "--check-budgets"]
    assert report_main(args) == 0
    capsys.readouterr()
    # Charges priced before ledgers kept their cost model: the file must be given.
    con = connect(db)
    con.execute("DELETE FROM cost_models")
    con.close()
    assert report_main(args) == 2 and "--check-budgets" in capsys.readouterr().err
