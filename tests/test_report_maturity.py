"""Fleet maturity level per GPU model and overall, with the change against last month.
Figures by hand from tests/test_report_fixtures.py."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

from test_report_fixtures import MONTH, make_db
from test_report_model import report_for

from metering.report import fmt, tidy
from metering.report.model import maturity_level

D = Decimal


def test_levels_at_the_bounds() -> None:
    cases = {"0": 1, "0.299999": 1, "0.30": 2, "0.49": 2, "0.50": 3, "0.80": 3, "0.800001": 4,
             "1": 4}
    for util, level in cases.items():
        assert maturity_level(D(util)) == level, util
    assert maturity_level(None) is None


def test_maturity_per_model_and_fleet_with_last_month(tmp_path: Path) -> None:
    report = report_for(make_db(tmp_path / "m.duckdb"))
    by_model = {m.model: m for m in report.maturity}
    # H100: 4 device-hours, 0.75 + 0.25 + 0.9 + 0.3 = 2.2 used -> 55 %, level 3.
    assert (by_model["H100"].utilisation, by_model["H100"].level) == (D("0.55"), 3)
    # September: GPU-1 and GPU-2 for an hour, 0.5 + 0.1 used -> 30 %, level 2.
    assert (by_model["H100"].previous_utilisation, by_model["H100"].previous_level) == (
        D("0.3"), 2)
    # A100: 2 device-hours, 0.2 + 0.1 + 0.05 used -> 17.5 %, level 1; not in September.
    assert (by_model["A100"].utilisation, by_model["A100"].level) == (D("0.175"), 1)
    assert by_model["A100"].previous_level is None
    # Fleet: 2.55 / 6 = 42.5 %, level 2; September 0.6 / 2 = 30 %: +12.5 points.
    fleet = by_model[""]
    assert (fleet.utilisation, fleet.level, fleet.change_points) == (D("0.425"), 2, D("12.5"))
    text = dict(fmt.facts(report))["Fleet maturity"]
    assert text == ("level 2 (30–50 %), utilisation 42.5%; 2026-09: level 2, 30.0% "
                    "(+12.5 points)")
    grid = dict(fmt.sections(report))["Utilisation maturity"]
    assert grid.rows[-1] == ["Fleet", "42.5%", "level 2 (30–50 %)", "30.0%",
                             "level 2 (30–50 %)", "+12.5 points"]
    rows = [r for r in tidy.rows(report) if r["section"] == "maturity"]
    assert [(r["model"], r["maturity_level"], r["previous_maturity_level"]) for r in rows] == [
        ("A100", 1, None), ("H100", 3, 2), ("", 2, 2)]


def test_without_last_month_there_is_no_change(tmp_path: Path) -> None:
    report = report_for(make_db(tmp_path / "m.duckdb", september=False), MONTH)
    grid = dict(fmt.sections(report))["Utilisation maturity"]
    assert grid.heads == ["GPU model", "Utilisation", "Maturity"]
    assert dict(fmt.facts(report))["Fleet maturity"] == "level 2 (30–50 %), utilisation 42.5%"
