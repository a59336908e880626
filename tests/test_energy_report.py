"""Energy and carbon in every report format (issue 28): a month priced with `energy:` and
`carbon:` shows each team's compute and energy lines, kWh and kg CO2e in the terminal
summary, Markdown, HTML (rendered in headless Chromium), CSV, Parquet and the FOCUS export,
with figures worked out by hand."""

from __future__ import annotations

import csv
import io
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from test_report_html import DevTools, chromium

from metering.db import connect
from metering.period import Month
from metering.pricing import price_period
from metering.report import focus
from metering.report.builder import FORMATS, make_report
from metering.report.model import Report
from metering.report.terminal import render_summary
from tests.test_energy import BASE, ENERGY, device
from tests.test_pricing import alloc

OCT1 = datetime(2026, 10, 1)
MONTH = Month.parse("2026-10")
# By hand (BASE: H100 compute 1.25/h with `energy:`; ENERGY: 0.30/kWh by day, PUE 1.2,
# 400 g/kWh):
#   science: GPU-0 held 08:00-10:00 at 0.7 kWh/h: 1.4 kWh, energy 1.4 x 1.2 x 0.30 = 0.504,
#            1.4 x 1.2 x 400 = 672 g; compute 2 x 1.25 = 2.50.
#   ml:      GPU-T time-sliced at 12:00 (1.44 MJ = 0.4 kWh): x 1/4 busy = 0.1 kWh, y 1/2 =
#            0.2 kWh: 0.3 kWh, 0.108, 144 g; compute (1 + 2) / 4 x 1.25 = 0.9375.
#   idle:    GPU-T's idle quarter: 0.1 kWh, 0.036, 48 g; compute 0.3125.
TEAMS = {"science": ("1.400000", "0.504000", "0.672000", "2.500000"),
         "ml": ("0.300000", "0.108000", "0.144000", "0.937500"),
         "idle": ("0.100000", "0.036000", "0.048000", "0.312500")}


@pytest.fixture
def report(tmp_path: Path) -> Report:
    db, path = _priced(tmp_path)
    return make_report(str(db), MONTH, str(path), 20, charge_days=True)


def _priced(tmp_path: Path) -> tuple[Path, Path]:
    path = tmp_path / "cost-model.yaml"
    path.write_text(BASE + ENERGY)
    db = tmp_path / "m.duckdb"
    con = connect(db)
    for h in (8, 9):
        device(con, "GPU-0", 2_520_000.0, hour=OCT1 + timedelta(hours=h))
        alloc(con, "train", "GPU-0", hour=OCT1 + timedelta(hours=h))
    noon = OCT1 + timedelta(hours=12)
    device(con, "GPU-T", 1_440_000.0, hour=noon)
    alloc(con, "x", "GPU-T", ns="ml-a", sharing="time-slicing", replicas=4, units=1, sm=900,
          hour=noon)
    alloc(con, "y", "GPU-T", ns="ml-b", sharing="time-slicing", replicas=4, units=2, sm=1800,
          hour=noon)
    from metering.costmodel import load_cost_model
    price_period(con, load_cost_model(path), MONTH.start, MONTH.end)
    con.close()
    return db, path


def test_streamed_focus_export_has_the_energy_rows(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """`report --format focus` streams the energy days from the ledger as it writes (one row
    per fetch here): the same files as rendered from the whole report, energy rows included."""
    from metering.report import builder
    from metering.report.cli import main as report_main
    db, path = _priced(tmp_path)
    report = make_report(str(db), MONTH, str(path), 20, charge_days=True)
    assert list(report.energy_days)
    monkeypatch.setattr(builder, "DAY_BATCH", 1)
    out = tmp_path / "out"
    assert report_main(["--month", "2026-10", "--db", str(db), "--cost-model", str(path),
                        "--out", str(out), "--format", "focus"]) == 0
    csv_bytes = (out / "chargeback-2026-10.focus.csv").read_bytes()
    assert csv_bytes == focus.render_csv(report)
    assert b"energy" in csv_bytes.lower()
    assert (out / "chargeback-2026-10.focus.parquet").read_bytes() == \
        focus.render_parquet(report)


def test_tidy_csv_and_parquet_carry_each_teams_energy_and_carbon(report: Report) -> None:
    text = FORMATS["csv"][1](report).decode()
    rows = [r for r in csv.DictReader(io.StringIO(text)) if r["section"] == "team"]
    got = {(r["team"] or r["kind"]): (r["energy_kwh"], r["energy_cost"], r["co2e_kg"], r["cost"])
           for r in rows}
    assert got == TEAMS
    table = pq.read_table(io.BytesIO(FORMATS["parquet"][1](report))).to_pylist()
    fleet = next(r for r in table if r["section"] == "fleet")
    assert (fleet["energy_kwh"], fleet["energy_cost"], fleet["co2e_kg"]) == \
        (1.8, Decimal("0.648000"), 0.864)
    pods = {r["pod"]: r["co2e_kg"] for r in table if r["section"] == "pod"}
    assert pods == {"train": 0.672, "x": 0.048, "y": 0.096}  # per workload
    namespaces = {r["namespace"]: r["energy_kwh"] for r in table if r["section"] == "namespace"}
    assert namespaces == {"research": 1.4, "ml-a": 0.1, "ml-b": 0.2, "": 0.1}


def test_markdown_and_terminal_show_compute_and_energy_lines(report: Report) -> None:
    md = FORMATS["md"][1](report).decode()
    assert "| Compute (EUR) |" in md and "| Energy kWh | Energy (EUR) | kg CO2e |" in md
    science = next(line for line in md.splitlines() if line.startswith("| science |"))
    assert "| 2.50 |" in science and "| 1.400 | 0.50 | 0.672 |" in science
    summary = render_summary(report)
    assert "1.800 kWh measured; energy 0.65 EUR billed apart from compute 3.75 EUR; " \
           "0.864 kg CO2e" in summary
    assert "idle GPUs and idle SMs 0.100 kWh, 0.048 kg CO2e" in md


def test_focus_bills_energy_rows_and_carbon_as_x_columns(report: Report) -> None:
    rows = list(csv.DictReader(io.StringIO(focus.render_csv(report).decode())))
    assert list(rows[0])[-2:] == ["x_EnergyKwh", "x_CarbonKgCO2e"]
    billed = sum(Decimal(r["BilledCost"]) for r in rows)
    assert billed == Decimal("2.5") + Decimal("0.9375") + Decimal("0.3125") + Decimal("0.648")
    energy = [r for r in rows if r["x_RowKind"].endswith("energy")]
    assert sum(Decimal(r["x_CarbonKgCO2e"]) for r in energy) == Decimal("0.864")
    train = next(r for r in energy if r["ResourceName"] == "train")
    assert (train["ConsumedUnit"], train["ConsumedQuantity"], train["BilledCost"]) == \
        ("kWh", "1.400000", "0.504000")
    table = pq.read_table(io.BytesIO(focus.render_parquet(report)))
    assert table.column_names[-2:] == ["x_EnergyKwh", "x_CarbonKgCO2e"]
    assert sum(v for v in table.column("x_CarbonKgCO2e").to_pylist() if v is not None) == \
        Decimal("0.864")


def test_html_report_with_energy_columns_renders_in_chromium(report: Report,
                                                             tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    page.write_bytes(FORMATS["html"][1](report))
    with chromium(tmp_path / "profile") as port:
        cdp = DevTools(port)
        try:
            for domain in ("Runtime", "Log", "Page"):
                cdp.call(f"{domain}.enable")
            cdp.call("Page.navigate", url=page.as_uri())
            cdp.wait_for("Page.loadEventFired")
            heads = cdp.evaluate(
                "Array.from(document.querySelector('table').querySelectorAll('th'))"
                ".map(t => t.innerText)")
            science = cdp.evaluate(
                "Array.from(document.querySelectorAll('tr')).map(r => r.innerText)"
                ".find(t => t.startsWith('science'))")
            width = cdp.evaluate("document.querySelector('table').getBoundingClientRect().width")
            cdp.call("Runtime.evaluate", expression="0")
        finally:
            cdp.close()
    errors = [e for e in cdp.events if e["method"] in ("Runtime.exceptionThrown",
                                                         "Runtime.consoleAPICalled")]
    assert errors == []
    assert {"Compute (EUR)", "Energy kWh", "Energy (EUR)", "kg CO2e"} <= set(heads)
    want = ["2.50", "1.400", "0.50", "0.672"]  # compute, kWh, energy, kg CO2e
    assert [c for c in science.split("\t") if c in want] == want
    assert width > 300


def test_savings_state_the_kwh_and_co2e_they_would_free(tmp_path: Path) -> None:
    """100 h of a whole H100 drawing 0.5 kWh an hour (400 g/kWh, PUE 1): 50 kWh, 20 kg.
    Rightsized to MIG 1g.10gb it gives back 6/7 of the device: 400 x 6/7 = 342.857143 saved,
    so 50 x 342.857143 / 400 = 42.857143 kWh and 17.142857 kg. An idle Job's 30 idle hours
    of 0.5 kWh: 15 kWh, 6 kg."""
    from test_waste import COST_MODEL, H100, MONTH, Holder, _facts

    from metering.report.waste import Kind, Settings, mig_fraction, recommend

    holders = [Holder("infer-7d9f-abcde", "GPU-1", H100, 100, mem_gb=8.0,
                      owner=("Deployment", "infer"), peaks={5: 9.0}),
               Holder("batch-x1", "GPU-2", H100, 100, mem_gb=60.0, sm=0.8,
                      owner=("Job", "batch"), peaks=dict.fromkeys(range(30), 0.0))]
    carbon = COST_MODEL + "carbon: {grams_per_kwh: 400}\n"
    con, cm = _facts(tmp_path / "m.duckdb", holders, carbon)
    try:
        con.execute("UPDATE device_hours SET energy_joules = 1800000")
        price_period(con, cm, MONTH.start, MONTH.end)
        recs = {r.kind: r for r in recommend(con, MONTH.start, MONTH.end, mig_fraction(cm),
                                             Settings())}
    finally:
        con.close()
    to_mig, idle = recs[Kind.TO_MIG], recs[Kind.IDLE]
    share = Decimal("342.857143") / 400
    assert to_mig.saving == Decimal("342.857143")
    assert (to_mig.energy_saving_kwh, to_mig.co2e_saving_kg) == (
        (50 * share).quantize(Decimal("0.000001")), (20 * share).quantize(Decimal("0.000001")))
    assert (to_mig.energy_saving_kwh, to_mig.co2e_saving_kg) == \
        (Decimal("42.857143"), Decimal("17.142857"))
    assert (idle.energy_saving_kwh, idle.co2e_saving_kg) == (Decimal("15"), Decimal("6"))


def test_the_metering_push_carries_each_teams_energy_and_carbon(report: Report) -> None:
    """What `meter --pushgateway` pushes, from the report's team rows (as cli_meter does)."""
    from prometheus_client.parser import text_string_to_metric_families

    from metering import publish
    from metering.period import Period, utc_aware

    energy: list[tuple[str, float, float | None]] = [
        (t.team, float(t.energy.kwh), float(t.energy.co2e_kg or 0))
        for t in report.teams if t.energy is not None and not t.overhead]
    period = Period(utc_aware(MONTH.start), utc_aware(MONTH.end))
    state = publish.RunState("default", period, 3, 1.0, MONTH, "EUR", (), energy)
    got = {(f.name, s.labels["team"]): s.value
           for f in text_string_to_metric_families(publish.exposition(state))
           for s in f.samples if "team" in s.labels}
    assert got == {(publish.ENERGY, "science"): 1.4, (publish.ENERGY, "ml"): 0.3,
                   (publish.CO2E, "science"): 0.672, (publish.CO2E, "ml"): 0.144}
