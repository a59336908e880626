"""What a finance reader needs from the report without the docs (issue 16, point 6): GPU-hours
on idle and down rows, capacity and allocation rate, a price table naming the cost-model entry
behind each price, the >100 % efficiency footnote, readable axes, natural name order. Figures
are worked out by hand from tests/test_report_fixtures.py."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

from test_report_fixtures import MONTH, OCT1, charge, idle, insert_charges, make_db
from test_report_model import INFO

from metering.costmodel import load_cost_model
from metering.db import connect
from metering.period import Month
from metering.report import charts, fmt, tidy
from metering.report.builder import build_report, price_lookup
from metering.report.html import render_html
from metering.report.markdown import render_markdown
from metering.report.model import Report, natural_key

D = Decimal


def _report(path: Path, cost_model_prices: bool = True) -> Report:
    con = connect(path, read_only=True)
    try:
        prices = price_lookup(load_cost_model(None)) if cost_model_prices else None
        return build_report(con, Month.parse(MONTH), INFO, "9.9.9", 20, prices)
    finally:
        con.close()


def test_idle_and_down_rows_show_their_gpu_hours(tmp_path: Path) -> None:
    db = make_db(tmp_path / "m.duckdb")
    con = connect(db)
    # A down row: GPU-1 was down for a quarter of 03:00 (fraction 0.25 of the device-hour).
    insert_charges(con, [charge("2026-10-01 03:00", "down", "", "", "GPU-1", "H100", "down",
                                0.25, 4, 0, 0, "1")])
    con.close()
    report = _report(db)
    rows = {t.kind: t for t in report.teams if t.overhead}
    # idle: half of GPU-2 twice, 4/7 of GPU-3, half of GPU-4 = 2 + 4/7.
    assert rows["idle"].gpu_hours == D("2.071429") and rows["idle"].allocated_gpu_hours == 0
    assert rows["down"].gpu_hours == D("0.25")
    grid = fmt.sections(report)[0][1]
    idle_row = grid.rows[grid.kinds.index("idle")]
    assert idle_row[grid.heads.index("GPU-hours")] == "2.07"
    total = grid.rows[grid.kinds.index("total")]
    # allocated 3 + 0.928571 (H100, A100) + idle 2.071429 + down 0.25
    assert total[grid.heads.index("GPU-hours")] == "6.25"


def test_capacity_allocation_rate_and_price_table(tmp_path: Path) -> None:
    report = _report(make_db(tmp_path / "m.duckdb"))
    caps = {c.model: c for c in report.capacity}
    # H100: GPU-1 and GPU-2 on Oct 1 and Oct 2 = 4 device-hours, 3 allocated.
    h100, a100 = caps["H100"], caps["A100"]
    assert (h100.devices, h100.capacity_gpu_hours, h100.allocated_gpu_hours) == (2, 4, D(3))
    assert h100.allocation_rate == D("0.75")
    # A100: GPU-3 and GPU-4 on Oct 1 = 2 device-hours; 3/7 + 1/4 + 1/4 allocated.
    assert a100.capacity_gpu_hours == 2 and a100.allocated_gpu_hours == D("0.928571")
    assert report.capacity_gpu_hours == 6 and report.devices == 4
    assert report.allocation_rate == D("0.654762")  # 3.928571 / 6
    facts = dict(fmt.facts(report))
    assert facts["Capacity"] == "6 GPU-hours (4 GPUs over the period)"
    assert facts["Allocation rate"].startswith("65.5% of capacity allocated")
    # Neither fixture model name is in the packaged cost model: both fell back to the default.
    assert h100.price is not None and h100.price.fallback and h100.price.hourly == D("2.00")
    grid = dict(fmt.sections(report))["Prices and capacity by GPU model"]
    assert all("DEFAULT PRICE" in row[-1] for row in grid.rows[:-1])
    assert any("pricing.default" in n for n in grid.notes)


def test_price_lookup_names_the_rule_that_set_the_price() -> None:
    lookup = price_lookup(load_cost_model(None))
    h100 = lookup("NVIDIA H100 80GB HBM3")
    assert (h100.hourly, h100.fallback) == (D("4.00"), False)
    assert h100.rule == 'pricing.gpus[0] (model "NVIDIA H100 80GB HBM3")'
    a100 = lookup("NVIDIA A100-SXM4-80GB")
    assert a100.hourly == D("0.737976") and not a100.fallback
    assert a100.rule.startswith('pricing.gpus[1] (pattern "NVIDIA A100*"), derived')
    other = lookup("Tesla T4")
    assert other.fallback and other.rule == "pricing.default" and other.hourly == D("2.00")


def test_without_the_cost_model_the_price_is_not_guessed(tmp_path: Path) -> None:
    report = _report(make_db(tmp_path / "m.duckdb"), cost_model_prices=False)
    grid = dict(fmt.sections(report))["Prices and capacity by GPU model"]
    assert all(row[5] == fmt.DASH for row in grid.rows[:-1])
    rows = [r for r in tidy.rows(report) if r["section"] == "model_price"]
    assert [r["model"] for r in rows] == ["A100", "H100"]
    assert all(r["price_hourly"] is None and r["price_default"] is None for r in rows)


def test_efficiency_above_100_percent_is_marked_and_explained(tmp_path: Path) -> None:
    # nb-1 holds a quarter of GPU-4 but kept it 60 % busy: 0.6 / 0.25 = 240 %.
    rows = [charge(OCT1, "research", "lab", "nb-1", "GPU-4", "A100", "time-slicing", 0.25, 2,
                   0.25, 0.6, "0.5"), idle(OCT1, "GPU-4", "A100", 0.75, 2, "1.5")]
    report = _report(make_db(tmp_path / "m.duckdb", october=rows, september=False))
    grid = fmt.sections(report)[0][1]
    research = grid.rows[0]
    assert research[grid.heads.index("Efficiency")] == "240.0%" + fmt.OVER_MARK
    assert fmt.OVER_NOTE in grid.notes
    assert fmt.OVER_NOTE.replace("*", "\\*") in render_markdown(report)
    html = render_html(report)
    assert 'class="reference"' in html and "100 % = used all it was allocated" in html
    # The efficiency axis reaches past 240 % with round ticks.
    assert ">250%</text>" in html


def test_no_footnote_when_nothing_is_above_100_percent(tmp_path: Path) -> None:
    report = _report(make_db(tmp_path / "m.duckdb"))
    assert fmt.OVER_NOTE not in render_markdown(report)


def test_axis_ticks_are_round_and_share_one_format() -> None:
    cases = {
        (7.3, 1.0): ["0", "2", "4", "6", "8"],
        (0.37, 1.0): ["0.0", "0.1", "0.2", "0.3", "0.4"],
        (1234.0, 1.0): ["0", "250", "500", "750", "1,000", "1,250"],
        (1.12, 100.0): ["0", "25", "50", "75", "100", "125"],
        (0.012, 1.0): ["0.0000", "0.0025", "0.0050", "0.0075", "0.0100", "0.0125"],
    }
    for (largest, scale), expected in cases.items():
        ax = charts.axis(largest, scale=scale)
        assert [ax.label(t, scale) for t in ax.ticks] == expected
        assert ax.top >= largest


def test_names_sort_numbers_as_numbers(tmp_path: Path) -> None:
    names = ["w-10", "w-2", "w-1", "a", "w-02"]
    assert sorted(names, key=natural_key) == ["a", "w-1", "w-02", "w-2", "w-10"]
    rows = [charge(OCT1, "ml", "train", f"worker-{i}", f"GPU-{i}", "H100", "exclusive", 1, 4,
                   1, 0.5, "4") for i in (10, 2, 1, 11)]
    report = _report(make_db(tmp_path / "m.duckdb", october=rows, september=False))
    assert [p.pod for p in report.pods] == ["worker-1", "worker-2", "worker-10", "worker-11"]
