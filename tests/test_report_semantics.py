"""Finance semantics of the report (docs/reports.md, "Efficiency, utilisation, allocation
rate"): each figure has one definition, every total row is computed from its own hours, idle
holders are judged on the hours they held, closed months show actuals, default prices are
said first, savings and larger units are apart."""

from __future__ import annotations

import csv
import io
from datetime import datetime
from decimal import Decimal
from pathlib import Path

import pytest
from test_report_fixtures import HASH, OCT1, charge, idle, make_db, make_mig_db
from test_waste import H100, Holder, _recs

from metering.db import connect
from metering.period import Month
from metering.report import fmt
from metering.report.builder import build_report
from metering.report.cli import STRICT_PRICES_FAILED
from metering.report.cli import main as report_main
from metering.report.csvout import render_csv
from metering.report.markdown import render_markdown
from metering.report.model import CostModelInfo, Report
from metering.report.terminal import render_summary
from metering.report.waste import Evidence, Kind, Recommendation

D = Decimal
OCT = Month.parse("2026-10")
INFO = CostModelInfo("c.yaml", HASH, "USD")


def _report(db: Path, **kw: object) -> Report:
    con = connect(db, read_only=True)
    try:
        return build_report(con, OCT, INFO, "0", **kw)  # type: ignore[arg-type]
    finally:
        con.close()


def test_total_row_efficiency_is_over_its_own_gpu_hours(tmp_path: Path) -> None:
    """The standard October: 6 device-hours, 3.928571 allocated, 2.55 used. The fleet total
    row shows 6.00 GPU-hours and 2.55 used: its efficiency is 2.55 / 6 = 42.5 %, which is
    the fleet's utilisation, not 2.55 / 3.928571 = 64.9 % (its allocated hours)."""
    report = _report(make_db(tmp_path / "m.duckdb"))
    fleet = report.fleet
    assert fleet.gpu_hours == D("6") and fleet.used_gpu_hours == D("2.55")
    assert fleet.efficiency == D("0.425")
    assert report.maturity[-1].model == "" and report.maturity[-1].utilisation == D("0.425")
    # a team's row: its own GPU-hours are its allocated ones
    ml = next(t for t in report.teams if t.team == "ml")
    assert ml.efficiency == (ml.used_gpu_hours / ml.allocated_gpu_hours).quantize(D("0.000001"))
    # rows nobody held have no efficiency
    assert all(t.efficiency is None for t in report.teams if t.overhead)
    _, grid = fmt.sections(report)[0]
    total = grid.rows[grid.kinds.index("total")]
    assert total[1:4] == ["6.00", "2.55", "42.5%"]


def test_an_idle_holder_is_judged_on_the_hours_it_held(tmp_path: Path) -> None:
    """Two GPUs held all 744 hours of October with no process in any: each is judged on 744
    fully covered hours, so both are high confidence (they were rated low: coverage was
    taken over their busy hours, of which there are none). One with 10 busy hours stays
    high too."""
    never = dict.fromkeys(range(744), 0.0)
    mostly = dict.fromkeys(range(10, 744), 0.0)
    recs = _recs(tmp_path, [
        Holder("a", "GPU-1", H100, 744, owner=("Job", "a"), peaks=never),
        Holder("b", "GPU-2", H100, 744, owner=("Job", "b"), peaks=never),
        Holder("c", "GPU-3", H100, 744, owner=("Job", "c"), peaks=mostly)])
    idle_recs = {r.owner_name: r for r in recs if r.kind is Kind.IDLE}
    assert set(idle_recs) == {"a", "b", "c"}
    assert {n: r.confidence for n, r in idle_recs.items()} == dict.fromkeys("abc", "high")
    assert idle_recs["a"].evidence.held_coverage == 1


def test_budgets_forecast_only_in_an_open_month(tmp_path: Path) -> None:
    """The standard October has data to 22:00 on the 31st (743 hours elapsed). Reported on
    the 31st it is open: ml's 12.00 is forecast to 12.00 x 744 / 743. Reported in November it
    is closed: actuals only, no forecast column, and the note says why."""
    db = make_db(tmp_path / "m.duckdb")
    budgets = {"ml": D(100)}
    open_ = _report(db, budgets=budgets, now=datetime(2026, 10, 31, 23, 30))
    [b] = open_.budgets or []
    assert not open_.closed and b.forecast == (D(12) * 744 / 743).quantize(D("0.000001"))
    closed = _report(db, budgets=budgets, now=datetime(2026, 11, 2))
    [b] = closed.budgets or []
    assert closed.closed and b.forecast is None and b.spend == D(12)
    grid = fmt.budget_grid(closed)
    assert grid is not None and "Forecast to month end" not in grid.heads
    assert grid.notes == [fmt.SPEND_NOTE, fmt.CLOSED_NOTE]


def test_default_priced_models_come_first_and_strict_prices_exits_3(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The fixture's models ("H100", "A100") match no entry of the packaged cost model: the
    report says so before any figure; --strict-prices writes it and exits 3."""
    db, out = make_db(tmp_path / "m.duckdb"), tmp_path / "out"
    rc = report_main(["--month", "2026-10", "--db", str(db), "--out", str(out),
                      "--format", "md", "--strict-prices"])
    assert rc == STRICT_PRICES_FAILED == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "A100, H100" in err[0] and "--strict-prices" in err[0]
    md = (out / "chargeback-2026-10.md").read_text()
    assert md.index("DEFAULT PRICE: no pricing.gpus entry matches A100") < md.index("Period")
    assert report_main(["--month", "2026-10", "--db", str(db), "--out", str(out),
                        "--format", "md"]) == 0


def _rec(kind: Kind, name: str, saving: str, proposed: str = "MIG 2g.20gb") -> Recommendation:
    ev = Evidence(hours=200, device_hours=D(200), peak_memory_gb=D(9), p95_memory_gb=D(8),
                  p95_sm=D("0.9"), coverage=D(1), idle_device_hours=0, all_hours=200,
                  held_coverage=D(1))
    return Recommendation(kind=kind, team="ml", cluster="default", namespace="ml",
                          owner_kind="Job", owner_name=name, model=H100,
                          current="MIG 1g.10gb", proposed=proposed, cost=D(100),
                          saving=D(saving), confidence="high", evidence=ev)


def test_savings_and_larger_units_are_separate_lists(tmp_path: Path) -> None:
    recs = [_rec(Kind.TO_SHARE, "small", "75", "1/4 of a GPU (time-slicing or MPS, 4 replicas)"),
            _rec(Kind.MIG_UP, "full", "-1700.57")]
    report = _report(make_db(tmp_path / "m.duckdb"), savings=recs)
    sections = dict(fmt.sections(report))
    savings, larger = sections["Savings"], sections[fmt.LARGER_UNIT]
    assert [r[1] for r in savings.rows] == ["ml/Job small"] and savings.rows[0][6] == "75.00"
    assert [r[1] for r in larger.rows] == ["ml/Job full"] and larger.rows[0][6] == "1,700.57"
    assert "Extra cost (USD)" in larger.heads
    assert fmt.savings_text(report).startswith("1 recommendation(s); up to 75.00 USD")
    summary = render_summary(report)
    assert "Needs a larger unit" in summary and "−1,700.57" not in summary
    assert summary.index("1,700.57") > summary.index("Needs a larger unit")


def test_no_recommendation_saves_nothing_to_the_cent(tmp_path: Path) -> None:
    # An idle holder of a GPU priced at 0: it holds 30 idle hours that cost 0.00.
    free = "currency: EUR\npricing:\n  default: {hourly: 0}\n"
    idle30 = dict.fromkeys(range(30), 0.0)
    recs = _recs(tmp_path, [Holder("z", "GPU-1", H100, 100, mem_gb=8.0, sm=0.05,
                                   owner=("Job", "z"), peaks=idle30)], free)
    assert recs == []


def test_terminal_explains_the_over_100_mark_and_it_names_vgpu(tmp_path: Path) -> None:
    # nb-1 holds one of four time-slicing replicas (0.25 GPU-h) and used 0.5: 200 %.
    rows = [charge(OCT1, "research", "lab", "nb-1", "GPU-4", "A100", "time-slicing", 0.25, 2,
                   0.25, 0.5, "0.5"),
            idle(OCT1, "GPU-4", "A100", 0.75, 2, "1.5")]
    report = _report(make_db(tmp_path / "m.duckdb", october=rows, september=False))
    summary = render_summary(report)
    assert f"200.0%{fmt.OVER_MARK}" in summary
    assert fmt.OVER_NOTE in summary and "vGPU" in fmt.OVER_NOTE
    assert fmt.OVER_NOTE in render_markdown(report)



def test_csv_fleet_gpu_hours_are_the_capacity(tmp_path: Path) -> None:
    """Priced by the engine: an H100 at 4.00 and an A100 at 2.00, each with a 3g.40gb
    instance held 2 h (3/7 of each device-hour), and a whole H100 held 2 h: 6 device-hours.
    The idle rows stand for 4/7 of a device-hour each (their money over the rate would say
    2.285715 / 4 = 0.57142875 on the H100), so the fleet's GPU-hours in the CSV are its
    capacity to the last decimal: 6.000000 both."""
    report = _report(make_mig_db(tmp_path / "m.duckdb", tmp_path / "cm.yaml"))
    rows = list(csv.DictReader(io.StringIO(render_csv(report).decode())))
    [fleet] = [r for r in rows if r["section"] == "fleet"]
    assert fleet["gpu_hours"] == fleet["capacity_gpu_hours"] == "6.000000"
    idle_rows = [r for r in rows if r["section"] == "team" and r["kind"] == "idle"]
    assert [r["gpu_hours"] for r in idle_rows] == ["2.285714"]
