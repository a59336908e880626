"""A report made from the ledger alone states the cost model the charges were priced with:
its name, hash and currency, and the prices and budgets it set (issue 13 point 6). Pricing
stores the cost model next to the charges, in the same transaction."""

from __future__ import annotations

import csv
import hashlib
from decimal import Decimal
from pathlib import Path

import conftest_prom
import pytest

from metering.cli_meter import main as meter_main
from metering.db import connect
from metering.report.cli import main as report_main

fleet_om_file = conftest_prom.fleet_om_file  # session fixture
DAY = ["--from", "2026-10-05", "--to", "2026-10-06"]
MODEL = """\
currency: EUR
pricing:
  default: {hourly: 1.25}
  gpus:
    - {model: "NVIDIA H100 80GB HBM3", hourly: 4.5}
budgets:
  monthly: {ml: 10}
"""


def test_report_from_the_ledger_alone_names_the_cost_model(
        fleet_om_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "eur.yaml"
    model.write_text(MODEL)
    digest = hashlib.sha256(MODEL.encode()).hexdigest()
    db = tmp_path / "m.duckdb"
    assert meter_main(["--openmetrics", str(fleet_om_file), *DAY, "--db", str(db),
                       "--cost-model", str(model), "-q"]) == 0
    with connect(db, read_only=True) as con:
        assert con.execute("SELECT hash, name, currency, document FROM cost_models"
                           ).fetchall() == [(digest, str(model), "EUR", MODEL)]
        # 4 H100s (fleet node-a) at the 4.5 entry, 2 A100s at the default 1.25
        assert sorted(con.execute("SELECT model, hourly, rule FROM cost_model_prices "
                                  "WHERE cost_model_hash = ?", [digest]).fetchall()) == [
            (conftest_prom.A100, Decimal("1.25"), "pricing.default"),
            (conftest_prom.H100, Decimal("4.5"), "pricing.gpus[0]")]
    model.unlink()  # the file is gone: the report needs only the ledger
    out = tmp_path / "out"
    rc = report_main(["--month", "2026-10", "--db", str(db), "--out", str(out),
                      "--format", "csv,md,focus", "--check-budgets"])
    assert rc == 3  # budgets came from the ledger's copy: ml's 10 EUR is exceeded
    summary = capsys.readouterr().out
    assert f"{model} (hash {digest})" in summary and "EUR" in summary
    md = (out / "chargeback-2026-10.md").read_text()
    assert f"eur.yaml (hash {digest})" in md.replace("\\_", "_")
    assert "**Currency:** EUR" in md and "not given" not in md and "cost units" not in md
    assert '| 4.50 | pricing.gpus\\[0\\] (model "NVIDIA H100 80GB HBM3") |' in md
    assert "| 1.25 | pricing.default" in md
    with (out / "chargeback-2026-10.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert rows and {r["currency"] for r in rows} == {"EUR"}
    assert {r["cost_model_hash"] for r in rows} == {digest}
    with (out / "chargeback-2026-10.focus.csv").open() as f:  # FOCUS needs currency + prices
        focus = list(csv.DictReader(f))
    assert focus and {r["BillingCurrency"] for r in focus} == {"EUR"}
