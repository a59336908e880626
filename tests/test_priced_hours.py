"""Hours priced before from the same facts keep their charges (metering/pricedhours.py): a
re-metered day whose facts come out the same is not priced again; a run that keeps some hours
and prices others writes what pricing them all writes, row for row, and the same totals; a
changed fact, cost model or charge row has its hours priced again."""

from __future__ import annotations

import dataclasses
import re
import shutil
from datetime import datetime
from pathlib import Path
from typing import Any

import conftest_prom
import pytest
from test_daily import history

from metering import wastehours
from metering.cli_meter import main as meter_main
from metering.costmodel import load_cost_model
from metering.db import connect
from metering.pricing import price_period

fleet_om_file = conftest_prom.fleet_om_file

SPAN = ("2026-10-04", "2026-10-07")  # 72 hours, node-b's late samples among them
START, END = datetime(2026, 10, 4), datetime(2026, 10, 7)
OUTPUTS = ("charges", "energy_hours", "waste_hours")
PACKAGED = Path(__file__).resolve().parents[1] / "metering" / "data" / "cost-model.yaml"


def _meter(db: Path, source: Path, *extra: str) -> int:
    return meter_main(["--openmetrics", str(source), "--from", SPAN[0], "--to", SPAN[1],
                       "--db", str(db), *extra])


def _rows(db: Path) -> dict[str, list[tuple[Any, ...]]]:
    with connect(db, read_only=True) as con:
        return {t: sorted(con.execute(f"SELECT * FROM {t}").fetchall(), key=repr)
                for t in OUTPUTS}


def _kept(err: str) -> int:
    found = re.search(r"\((\d+) of its hours kept their charges", err)
    return int(found.group(1)) if found else 0


def test_a_re_metered_span_keeps_what_did_not_change(
        fleet_om_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    late = history(fleet_om_file, tmp_path / "late.om", late_missing=True)
    db = tmp_path / "ledger.duckdb"
    assert _meter(db, late) == 0
    first = _rows(db)
    assert _kept(capsys.readouterr().err) == 0
    # The next daily run re-meters the days: nothing arrived late, nothing priced again.
    assert _meter(db, late) == 0
    assert _kept(capsys.readouterr().err) == 72
    assert _rows(db) == first
    with connect(db, read_only=True) as con:  # the report reads the kept hours' waste rows
        assert wastehours.plan(con, START, END).computed == ()
    # node-b's late samples arrive: the hours they change are priced again, the others kept,
    # and the ledger holds what metering the full history from scratch gives.
    assert _meter(db, fleet_om_file) == 0
    kept = _kept(capsys.readouterr().err)
    assert 48 <= kept < 72
    fresh = tmp_path / "fresh.duckdb"
    assert _meter(fresh, fleet_om_file, "-q") == 0
    assert _rows(db) == _rows(fresh) != first


def test_kept_hours_count_in_the_totals_as_if_priced(fleet_om_file: Path,
                                                     tmp_path: Path) -> None:
    db = tmp_path / "ledger.duckdb"
    assert _meter(db, fleet_om_file, "-q") == 0
    copy = tmp_path / "copy.duckdb"
    shutil.copy(db, copy)
    model = load_cost_model(None)
    with connect(db) as con:
        kept = price_period(con, model, START, END, keep=True)
    with connect(copy) as con:
        full = price_period(con, model, START, END)
    assert (kept.kept_hours, full.kept_hours) == (72, 0)
    assert full.rows > 0 and full.charged > 0
    assert dataclasses.replace(kept, kept_hours=0) == full
    assert _rows(db) == _rows(copy)


def test_a_fact_a_cost_model_or_a_charge_row_changed_is_priced_again(
        fleet_om_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "ledger.duckdb"
    assert _meter(db, fleet_om_file, "-q") == 0
    first = _rows(db)
    model = load_cost_model(None)
    hour = datetime(2026, 10, 5, 3)
    with connect(db) as con:  # charge rows lost: that hour is priced again, the same
        con.execute("DELETE FROM charges WHERE hour = ?", [hour])
        assert price_period(con, model, START, END, keep=True).kept_hours == 71
    assert _rows(db) == first
    # A fact rewritten without this version's ingest (an older image): its digest differs.
    with connect(db) as con:
        con.execute("UPDATE allocation_hours SET allocated_seconds = allocated_seconds / 2 "
                    "WHERE hour = ?", [hour])
        assert price_period(con, model, START, END, keep=True).kept_hours == 71
    copy = tmp_path / "copy.duckdb"
    shutil.copy(db, copy)
    with connect(copy) as con:
        price_period(con, model, START, END)
    assert _rows(db) == _rows(copy) != first
    # Another cost model: every hour priced again with it.
    other = tmp_path / "cost-model.yaml"
    other.write_text(PACKAGED.read_text() + "\n# another file, another hash\n")
    capsys.readouterr()
    assert _meter(db, fleet_om_file, "--cost-model", str(other)) == 0
    assert _kept(capsys.readouterr().err) == 0
    with connect(db, read_only=True) as con:
        hashes = {r[0] for r in con.execute(
            "SELECT DISTINCT cost_model_hash FROM charges WHERE hour >= ? AND hour < ?",
            [START, END]).fetchall()}
    assert hashes == {load_cost_model(str(other)).hash}


def test_an_hour_whose_carbon_intensity_changed_is_priced_again(
        fleet_om_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The cost model's hash covers its YAML, not the intensity CSV it names: a grid
    operator's actual figure replacing its forecast for an hour already priced reaches that
    hour's CO2e at the next re-metering, as pricing every hour gives it."""
    grid = tmp_path / "grid.csv"
    model_file = tmp_path / "cost-model.yaml"
    model_file.write_text(PACKAGED.read_text() + "\ncarbon:\n  grams_per_kwh: 350\n"
                          "  intensity_csv: grid.csv\n")
    hour = datetime(2026, 10, 5, 3)
    grid.write_text("timestamp,gCO2e/kWh\n2026-10-05T03:00:00Z,300\n")
    db = tmp_path / "ledger.duckdb"
    assert _meter(db, fleet_om_file, "--cost-model", str(model_file)) == 0
    capsys.readouterr()
    assert _meter(db, fleet_om_file, "--cost-model", str(model_file)) == 0
    assert _kept(capsys.readouterr().err) == 72

    def co2(path: Path) -> Any:
        with connect(path, read_only=True) as con:
            return con.execute("SELECT sum(co2e_grams), sum(energy_joules) FROM energy_hours "
                               "WHERE hour = ?", [hour]).fetchone()

    grams_before, joules = co2(db)
    assert joules > 0
    grid.write_text("timestamp,gCO2e/kWh\n2026-10-05T03:00:00Z,600\n")  # the actual figure
    assert _meter(db, fleet_om_file, "--cost-model", str(model_file)) == 0
    assert _kept(capsys.readouterr().err) == 71
    assert co2(db)[0] > grams_before
    copy = tmp_path / "copy.duckdb"
    shutil.copy(db, copy)
    with connect(copy) as con:  # every hour priced with the CSV as it is now: the same rows
        assert price_period(con, load_cost_model(str(model_file)), START, END).kept_hours == 0
    assert _rows(db) == _rows(copy)
