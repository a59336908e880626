"""Report figures for the fixture month, worked out by hand from tests/test_report_fixtures.py."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from pathlib import Path

import pytest
from test_report_fixtures import (
    HASH,
    MONTH,
    charge,
    insert_charges,
    insert_coverage,
    make_db,
    make_mig_db,
)

from metering.db import connect
from metering.period import HourRange, Month, hour_ranges
from metering.report import fmt
from metering.report.builder import build_report
from metering.report.model import CostModelInfo, Report

D = Decimal
INFO = CostModelInfo("cost-model.yaml", HASH, "USD")


def report_for(path: Path, month: str = MONTH, top: int = 20) -> Report:
    con = connect(path, read_only=True)
    try:
        return build_report(con, Month.parse(month), INFO, "9.9.9", top)
    finally:
        con.close()


@pytest.fixture
def report(tmp_path: Path) -> Report:
    return report_for(make_db(tmp_path / "m.duckdb"))


def test_team_rows_and_idle_row(report: Report) -> None:
    rows = {(t.team, t.kind): t for t in report.teams}
    # ml: trainer-0 4 + 4, trainer-1 2, mps-a 2; 3.0 GPU-h allocated, 0.75+0.25+0.9+0.3 used.
    ml = rows[("ml", "")]
    assert (ml.cost, ml.allocated_gpu_hours, ml.used_gpu_hours) == (D("12"), D("3"), D("2.2"))
    assert ml.efficiency == D("0.733333")
    assert ml.share_of_total == D("0.6")
    assert ml.previous_cost == D("4") and ml.cost_change == D("8")
    web = rows[("web", "")]  # 3g.40gb of an A100 at 2.00: 3/7 of the device-hour
    assert web.cost == D("0.857143") and web.efficiency == D("0.466667")
    assert web.previous_cost == D("0")  # September exists, web was not in it
    research = rows[("research", "")]
    assert (research.cost, research.used_gpu_hours, research.efficiency) == (
        D("1"), D("0.15"), D("0.3"))  # fmt: skip
    # Idle: half of GPU-2 twice (2 + 2), 4/7 of GPU-3 (1.142857), half of GPU-4 (1).
    idle = rows[("idle", "idle")]
    assert idle.cost == D("6.142857") and idle.efficiency is None
    assert idle.share_of_total == D("0.307143")
    # A team charged in September and not in October keeps a zero row showing the drop.
    gone = rows[("gone", "")]
    assert gone.cost == 0 and gone.previous_cost == D("3") and gone.cost_change == D("-3")
    # Order: by cost, fleet rows last.
    assert [t.team for t in report.teams] == ["ml", "research", "web", "gone", "idle"]
    assert report.idle_policy == "idle cost is its own row (team 'idle')"


def test_sections_sum_to_fleet_total_to_the_cent(report: Report) -> None:
    assert report.fleet.cost == D("20")
    assert report.fleet.previous_cost == D("8")
    for lines in (report.teams, report.namespaces, report.models):
        assert sum((ln.cost for ln in lines), D(0)) == report.fleet.cost
        assert sum((ln.cost_change or 0 for ln in lines), D(0)) == report.fleet.cost_change
    # Printed, rounded rows add up to the printed total too (0.857143 -> 0.86, 6.142857 -> 6.14).
    grid = fmt.sections(report)[0][1]
    cost_col = grid.heads.index("Cost (USD)")
    printed = [D(row[cost_col].replace(",", "")) for row in grid.rows]
    assert printed[:-1] == [D("12.00"), D("1.00"), D("0.86"), D("0.00"), D("6.14")]
    assert sum(printed[:-1], D(0)) == printed[-1] == D("20.00")


def test_namespace_model_and_pod_rows(report: Report) -> None:
    ns = {(n.namespace, n.kind): n.cost for n in report.namespaces}
    assert ns == {
        ("train", ""): D("10"),
        ("infer", ""): D("2"),
        ("lab", ""): D("1"),
        ("serve", ""): D("0.857143"),
        ("old", ""): D("0"),
        ("", "idle"): D("6.142857"),
    }
    models = {(m.model, m.sharing, m.profile): m.cost for m in report.models}
    assert models == {
        ("H100", "exclusive", ""): D("10"),
        ("H100", "mps", ""): D("2"),
        ("A100", "time-slicing", ""): D("1"),
        ("A100", "mig", "3g.40gb"): D("0.857143"),
        ("H100", "idle", ""): D("4"),
        ("A100", "idle", ""): D("2.142857"),
    }
    # Top pods: ties (mps-a, trainer-1 at 2.00) ordered by team, namespace, pod; idle never listed.
    assert [(p.pod, p.cost) for p in report.pods] == [
        ("trainer-0", D("8")), ("mps-a", D("2")), ("trainer-1", D("2")),
        ("api-7", D("0.857143")), ("nb-1", D("0.5")), ("nb-2", D("0.5")),
    ]  # fmt: skip
    assert report.pods[0].efficiency == D("0.825")  # (0.75 + 0.9) / 2


def test_top_limits_pods(tmp_path: Path) -> None:
    report = report_for(make_db(tmp_path / "m.duckdb"), top=2)
    assert [p.pod for p in report.pods] == ["trainer-0", "mps-a"]


def test_daily_team_costs(report: Report) -> None:
    days = {(d.day, d.team): d.cost for d in report.team_days}
    assert days == {
        ("2026-10-01", "ml"): D("6"), ("2026-10-01", "web"): D("0.857143"),
        ("2026-10-01", "research"): D("1"), ("2026-10-01", "idle"): D("4.142857"),
        ("2026-10-02", "ml"): D("6"), ("2026-10-02", "idle"): D("2"),
    }  # fmt: skip


def test_partial_coverage_names_missing_hours(report: Report) -> None:
    assert report.hours_in_period == 744 and report.hours_with_data == 740
    assert [r.describe() for r in report.missing] == [
        "2026-10-03 04:00–07:00 UTC (3 h)",
        "2026-10-31 23:00–24:00 UTC (1 h)",
    ]


def test_hour_ranges_compress_runs() -> None:
    hours = [datetime(2026, 2, 1, h) for h in (0, 1, 2, 5, 23)] + [datetime(2026, 2, 2, 0)]
    ranges = hour_ranges(reversed(hours))
    assert ranges == [
        HourRange(datetime(2026, 2, 1, 0), datetime(2026, 2, 1, 3)),
        HourRange(datetime(2026, 2, 1, 5), datetime(2026, 2, 1, 6)),
        HourRange(datetime(2026, 2, 1, 23), datetime(2026, 2, 2, 1)),
    ]
    assert ranges[2].describe() == "2026-02-01 23:00 – 2026-02-02 01:00 UTC (2 h)"


def test_empty_month(tmp_path: Path) -> None:
    con = connect(tmp_path / "empty.duckdb")
    con.close()
    report = report_for(tmp_path / "empty.duckdb", "2026-02")
    assert not report.has_data and not report.has_previous
    assert report.teams == [] and report.pods == []
    assert report.fleet.cost == 0 and report.fleet.previous_cost is None
    assert report.hours_with_data == 0
    assert [r.describe() for r in report.missing] == [
        "2026-02-01 00:00 – 2026-03-01 00:00 UTC (672 h)"
    ]


def test_idle_shared_out_to_teams(tmp_path: Path) -> None:
    # Proportional idle: a GPU-hour at 4.00, team a used 0.6 of it, team b 0.2; the idle 0.2
    # (0.80) is split 3:1, so a pays 2.40 + 0.60 and b 0.80 + 0.20.
    rows = [
        charge("2026-10-05 00:00", "a", "ns-a", "p", "GPU-9", "H100", "time-slicing", 0.6, 4,
               0.6, 0.3, "3.0", idle_share="0.6"),
        charge("2026-10-05 00:00", "b", "ns-b", "q", "GPU-9", "H100", "time-slicing", 0.2, 4,
               0.2, 0.2, "1.0", idle_share="0.2"),
    ]  # fmt: skip
    con = connect(tmp_path / "s.duckdb")
    insert_charges(con, rows)
    insert_coverage(con, datetime(2026, 10, 5), datetime(2026, 10, 5, 1), [])
    con.close()
    report = report_for(tmp_path / "s.duckdb")
    assert [(t.team, t.kind, t.cost, t.idle_share) for t in report.teams] == [
        ("a", "", D("3"), D("0.6")), ("b", "", D("1"), D("0.2"))]  # fmt: skip
    assert report.fleet.cost == D("4") and report.fleet.idle_share == D("0.8")
    assert report.idle_policy == "idle cost is shared out to teams (column idle_share)"
    assert report.has_previous is False and report.teams[0].previous_cost is None
    assert len(report.missing) == 2  # the hours before and after the one covered hour


def test_weighted_idle_rows_stay_with_their_team(tmp_path: Path) -> None:
    # Pricing's `weights` policy writes a team's idle share as its own row (sharing 'idle');
    # it belongs to the team, not to the idle row, and never shows up as a pod.
    rows = [
        charge("2026-10-05 00:00", "a", "ns-a", "p", "GPU-9", "H100", "exclusive", 0.5, 4,
               0.5, 0.5, "2"),
        charge("2026-10-05 00:00", "a", "", "", "", "H100", "idle", 0.5, 0, 0, 0, "2",
               idle_share="2"),
    ]  # fmt: skip
    con = connect(tmp_path / "w.duckdb")
    insert_charges(con, rows)
    con.close()
    report = report_for(tmp_path / "w.duckdb")
    assert [(t.team, t.kind, t.cost, t.idle_share) for t in report.teams] == [
        ("a", "", D("4"), D("2"))]  # fmt: skip
    assert [p.pod for p in report.pods] == ["p"]


def test_apportion_cents_keeps_the_total() -> None:
    thirds = [D("0.333333"), D("0.333333"), D("0.333334")]
    assert fmt.apportion_cents(thirds, D(1)) == [D("0.33"), D("0.33"), D("0.34")]
    values = [D("1.005"), D("2.005"), D("-0.5")]
    out = fmt.apportion_cents(values, sum(values, D(0)))
    assert sum(out, D(0)) == fmt.cents(sum(values, D(0)))
    assert all(abs(o - v) < D("0.01") for o, v in zip(out, values, strict=True))


@pytest.mark.parametrize("text", ["2026-13", "2026-1", "26-10", "2026-10-01", "", "October"])
def test_month_parse_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="expected a month like 2026-10"):
        Month.parse(text)


def test_month_bounds() -> None:
    m = Month.parse("2024-12")
    assert (m.start, m.end, m.hours) == (datetime(2024, 12, 1), datetime(2025, 1, 1), 744)
    assert str(m.previous()) == "2024-11" and str(Month.parse("2025-01").previous()) == "2024-12"
    assert Month.parse("2024-02").hours == 29 * 24


def test_mig_with_gpm_is_used_and_mig_without_gpm_is_unknown(tmp_path: Path) -> None:
    report = report_for(make_mig_db(tmp_path / "m.duckdb", tmp_path / "cm.yaml"))
    teams = {t.team: t for t in report.teams if not t.overhead}
    # hopper: 3/7 x 2 h = 0.857143 allocated, 0.5 x 3/7 x 2 = 0.428571 used;
    # trainer: 2 h allocated, 0.25 x 2 = 0.5 used. 0.928571 / 2.857143 = 0.325.
    vision = teams["vision"]
    assert (vision.allocated_gpu_hours, vision.used_gpu_hours, vision.sm_unknown_gpu_hours) == (
        D("2.857143"), D("0.928571"), D("0"))  # fmt: skip
    assert vision.efficiency == D("0.325")
    # ampere: A100 without GPM: allocated 0.857143, used unknown (not 0, not 0%).
    search = teams["search"]
    assert (search.allocated_gpu_hours, search.used_gpu_hours, search.efficiency) == (
        D("0.857143"), None, None)  # fmt: skip
    assert search.sm_unknown_gpu_hours == D("0.857143")
    models = {(m.model, m.profile): m for m in report.models if not m.overhead}
    assert models[("NVIDIA H100 80GB HBM3", "3g.40gb")].used_gpu_hours == D("0.428571")
    # 0.428571 / 0.857143 (both rounded to 6 places) = 0.499999: 50.0% as people read it.
    assert fmt.percent(models[("NVIDIA H100 80GB HBM3", "3g.40gb")].efficiency) == "50.0%"
    assert models[("NVIDIA A100-SXM4-80GB", "3g.40gb")].used_gpu_hours is None
    # The fleet sums the known parts and says how much is unknown: 0.857143 of 3.714286.
    fleet = report.fleet
    assert (fleet.allocated_gpu_hours, fleet.used_gpu_hours, fleet.sm_unknown_gpu_hours) == (
        D("3.714286"), D("0.928571"), D("0.857143"))  # fmt: skip
    # The fleet row's own GPU-hours are all 6 device-hours (3.714286 allocated, 2.285714
    # idle), 0.857143 of them without SM data: 0.928571 / 5.142857 = 0.180555, the fleet's
    # utilisation (docs/reports.md, "Efficiency, utilisation, allocation rate").
    # The idle rows are the device-hours' unheld time (1 - 3/7 each), not their money over
    # the rate (2.285715 / 4 = 0.57142875 on the H100): the total is the capacity, exactly.
    assert fleet.gpu_hours == D("6") and fleet.efficiency == D("0.180555")
    assert report.maturity[-1].utilisation == fleet.efficiency
    assert report.sm_unknown_share == D("0.230769")
    assert report.sm_unknown_mig_gpu_hours == D("0.857143")
    assert dict(fmt.facts(report))["SM activity"] == (
        "SM activity unknown for 23.1% of allocated GPU-hours (MIG without GPM); used "
        "GPU-hours and efficiency cover the rest")


def test_a_group_partly_without_sm_data_sums_the_known_part(tmp_path: Path) -> None:
    con = connect(tmp_path / "m.duckdb")
    insert_charges(con, [
        # one team: 1 GPU-h at 50% used, 1 GPU-h of MIG without GPM, 1 GPU-h without samples
        charge("2026-10-01 00:00", "t", "ns", "a", "GPU-1", "H100", "exclusive", 1, 4, 1, 0.5,
               "4"),
        charge("2026-10-01 00:00", "t", "ns", "b", "GPU-2", "H100", "mig", 1, 4, 1, None, "4",
               mig_uuid="MIG-2"),
        charge("2026-10-01 00:00", "t", "ns", "c", "GPU-3", "H100", "exclusive", 1, 4, 1, None,
               "4"),
    ])  # fmt: skip
    insert_coverage(con, datetime(2026, 10, 1), datetime(2026, 11, 1), [])
    con.close()
    report = report_for(tmp_path / "m.duckdb")
    team = report.teams[0]
    assert (team.allocated_gpu_hours, team.used_gpu_hours, team.sm_unknown_gpu_hours) == (
        D("3"), D("0.5"), D("2"))  # fmt: skip
    assert team.efficiency == D("0.5")  # over the one GPU-hour with SM data, not 0.5 / 3
    assert fmt.sm_text(report) == (
        "SM activity unknown for 66.7% of allocated GPU-hours (MIG without GPM, no SM "
        "samples); used GPU-hours and efficiency cover the rest")


def test_sm_activity_statement_when_everything_is_known(report: Report) -> None:
    assert dict(fmt.facts(report))["SM activity"] == "known for all allocated GPU-hours"
    assert report.sm_unknown_share == D("0")
