"""Metering as a library (issue 13 point 3): `api.meter` / `api.price` give the ledger the CLI
gives, sources follow one protocol with close(), errors are typed with their exit status."""

from __future__ import annotations

from contextlib import closing
from datetime import UTC, datetime
from pathlib import Path

import conftest_prom
import pytest

from metering import api
from metering.cli_meter import main as meter_main
from metering.costmodel import load_cost_model
from metering.db import connect
from metering.errors import ExitCode, MeteringError
from metering.ingest import Source
from metering.openmetrics_source import OpenMetricsSource
from metering.period import Period

fleet_om_file = conftest_prom.fleet_om_file  # session fixture
DAY = Period(datetime(2026, 10, 5, tzinfo=UTC), datetime(2026, 10, 6, tzinfo=UTC))


def _rows(db: Path) -> dict[str, list[object]]:
    with connect(db, read_only=True) as con:
        return {t: sorted(con.execute(f"SELECT * FROM {t}").fetchall(), key=repr)
                for t in ("device_hours", "allocation_hours", "charges")}


def test_library_gives_the_cli_ledger(fleet_om_file: Path, tmp_path: Path) -> None:
    cli, lib = tmp_path / "cli.duckdb", tmp_path / "lib.duckdb"
    assert meter_main(["--openmetrics", str(fleet_om_file), "--from", "2026-10-05", "--to",
                       "2026-10-06", "--db", str(cli), "-q"]) == 0
    lines: list[str] = []
    source: Source = OpenMetricsSource(str(fleet_om_file), DAY)
    with closing(source):
        result = api.meter(lib, source, DAY, api.MeterSettings(cost_model=load_cost_model(None),
                                                              say=lines.append))
    assert result.ingest.rows["device_hours"] == 144 and result.pricing is not None
    assert result.pricing.total == result.pricing.fleet_cost
    assert lines[-1] == f"meter: priced {DAY.label()}"
    assert _rows(lib) == _rows(cli)
    # price() re-prices from the facts alone: same charges again.
    again = api.price(lib, DAY, load_cost_model(None))
    assert again.fleet_cost == result.pricing.fleet_cost and _rows(lib) == _rows(cli)


def test_ingest_only_then_price(fleet_om_file: Path, tmp_path: Path) -> None:
    db = tmp_path / "m.duckdb"
    with closing(OpenMetricsSource(str(fleet_om_file), DAY)) as source:
        assert api.meter(db, source, DAY).pricing is None
    with connect(db, read_only=True) as con:
        assert con.execute("SELECT count(*) FROM charges").fetchone() == (0,)
    assert api.price(db, DAY, load_cost_model(None)).device_hours == 144


def test_errors_are_typed_with_their_exit_status(tmp_path: Path) -> None:
    with pytest.raises(MeteringError) as missing:
        api.price(tmp_path / "none.duckdb", DAY, load_cost_model(None))
    assert missing.value.code == ExitCode.BAD_INPUT and not (tmp_path / "none.duckdb").exists()
    connect(tmp_path / "empty.duckdb").close()
    with pytest.raises(MeteringError) as empty:
        api.price(tmp_path / "empty.duckdb", DAY, load_cost_model(None))
    assert empty.value.code == ExitCode.REFUSED and "found none" in str(empty.value)


def test_report_through_the_library_writes_what_the_cli_writes(
        fleet_om_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`api.report` (what the demo calls) and `gpu-ledger report` write the same files from
    one ledger; an unpriced month is refused with the exit status the CLI gives."""
    from metering.period import Month
    from metering.report.cli import main as report_main

    db = tmp_path / "m.duckdb"
    with closing(OpenMetricsSource(str(fleet_om_file), DAY)) as source:
        api.meter(db, source, DAY)  # ingest only: not priced yet
    with pytest.raises(MeteringError) as unpriced:
        api.report(db, Month.parse("2026-10"), tmp_path / "none")
    assert unpriced.value.code == ExitCode.REFUSED and "meter --price-only" in str(
        unpriced.value)
    assert not (tmp_path / "none").exists()

    api.price(db, DAY, load_cost_model(None))
    done = api.report(db, Month.parse("2026-10"), tmp_path / "lib")
    assert sorted(p.name for p in done.files) == sorted(
        f"chargeback-2026-10.{ext}" for ext in ("csv", "parquet", "md", "html"))
    assert done.report.month == Month.parse("2026-10") and done.report.teams
    assert report_main(["--month", "2026-10", "--db", str(db), "--out",
                        str(tmp_path / "cli")]) == 0
    capsys.readouterr()
    for name in ("chargeback-2026-10.csv", "chargeback-2026-10.md"):
        assert (tmp_path / "lib" / name).read_bytes() == (tmp_path / "cli" / name).read_bytes()
