"""Resume gaps (issue 26, repro 5): a run is finished when its pricing is; the journal is
checked against the ledger's own facts before chunks are skipped; ledger commands refuse a
DuckDB database that is not a ledger unless it is empty."""

from __future__ import annotations

from pathlib import Path

import conftest_prom
import duckdb
import pytest

from metering import api
from metering.cli_ledger import main as ledger_main
from metering.cli_meter import main
from metering.db import connect

fleet_om_file = conftest_prom.fleet_om_file  # session fixture
DAY = ["--from", "2026-10-05", "--to", "2026-10-06", "--chunk", "6"]
BILL = "SELECT hour, team, namespace, pod, uuid, sharing, cost FROM charges ORDER BY ALL"
FACTS = "SELECT * EXCLUDE (memory_max_bytes) FROM workload_hours ORDER BY ALL"


def _bill(db: Path) -> list[tuple[object, ...]]:
    with connect(db, read_only=True) as con:
        return con.execute(BILL).fetchall()


@pytest.fixture
def whole(fleet_om_file: Path, tmp_path: Path) -> Path:
    db = tmp_path / "whole.duckdb"
    assert main(["--openmetrics", str(fleet_om_file), *DAY, "--db", str(db), "-q"]) == 0
    return db


def test_killed_between_the_last_chunk_and_pricing_a_rerun_prices(
        fleet_om_file: Path, whole: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "m.duckdb"

    def killed(*_: object, **__: object) -> None:
        raise KeyboardInterrupt  # as a kill: after every chunk committed, before pricing

    with monkeypatch.context() as m:
        m.setattr(api, "_price", killed)
        assert main(["--openmetrics", str(fleet_om_file), *DAY, "--db", str(db)]) == 130
    with connect(db, read_only=True) as con:
        assert con.execute("SELECT count(*) FROM charges").fetchone() == (0,)
        assert con.execute("SELECT count(*) FROM ingest_runs WHERE finished_at IS NULL"
                           ).fetchone() == (1,)
    capsys.readouterr()
    assert main(["--openmetrics", str(fleet_om_file), *DAY, "--db", str(db)]) == 0
    err = capsys.readouterr().err
    assert "4 of 4 chunk(s) already committed" in err and "priced" in err
    assert _bill(db) == _bill(whole) and _bill(db)


def test_an_unfinished_run_with_every_chunk_committed_prices_its_clusters(
        fleet_om_file: Path, whole: Path, tmp_path: Path) -> None:
    """The journal's state after a kill between the last commit and the end of the run."""
    db = tmp_path / "m.duckdb"
    assert main(["--openmetrics", str(fleet_om_file), *DAY, "--db", str(db), "-q"]) == 0
    with connect(db) as con:
        con.execute("UPDATE ingest_runs SET finished_at = NULL")
        con.execute("DELETE FROM charges")
    assert main(["--openmetrics", str(fleet_om_file), *DAY, "--db", str(db), "-q"]) == 0
    assert _bill(db) == _bill(whole)


def test_a_journal_is_not_trusted_over_the_ledgers_facts(
        fleet_om_file: Path, whole: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The journal says the whole day was committed; 18 of its 24 hours are not in the
    ledger (restored from an older backup, deleted by hand): they are metered again."""
    db = tmp_path / "m.duckdb"
    assert main(["--openmetrics", str(fleet_om_file), *DAY, "--db", str(db), "-q"]) == 0
    with connect(db) as con:
        con.execute("UPDATE ingest_runs SET finished_at = NULL")
        for table in ("device_hours", "mig_hours", "allocation_hours", "workload_hours",
                      "grant_hours", "coverage"):
            con.execute(f"DELETE FROM {table} WHERE hour >= TIMESTAMP '2026-10-05 06:00'")
    capsys.readouterr()
    assert main(["--openmetrics", str(fleet_om_file), *DAY, "--db", str(db)]) == 0
    err = capsys.readouterr().err
    assert "1 of 4 chunk(s) already committed" in err
    assert "3 chunk(s) the interrupted run recorded as committed are not in the ledger" in err
    with connect(db, read_only=True) as con, connect(whole, read_only=True) as ref:
        assert con.execute("SELECT count(*) FROM coverage").fetchone() == (24,)
        assert con.execute(FACTS).fetchall() == ref.execute(FACTS).fetchall()
    assert _bill(db) == _bill(whole)


def _foreign(path: Path) -> Path:
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE sales (id INTEGER, amount DECIMAL(10, 2))")
    con.execute("INSERT INTO sales VALUES (1, 9.99)")
    con.close()
    return path


def _tables(path: Path) -> list[str]:
    con = duckdb.connect(str(path), read_only=True)
    try:
        return sorted(r[0] for r in con.execute("SHOW TABLES").fetchall())
    finally:
        con.close()


def test_meter_and_merge_refuse_a_database_that_is_not_a_ledger(
        fleet_om_file: Path, whole: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    other = _foreign(tmp_path / "sales.duckdb")
    capsys.readouterr()
    assert main(["--openmetrics", str(fleet_om_file), *DAY, "--db", str(other), "-q"]) == 4
    err = capsys.readouterr().err
    assert "expected a GPU Ledger database (or an empty one)" in err
    assert "other tables (sales)" in err and len(err.strip().splitlines()) == 1
    assert _tables(other) == ["sales"]
    assert ledger_main(["merge", "--into", str(other), str(whole)]) == 4
    err = capsys.readouterr().err
    assert "other tables (sales)" in err and len(err.strip().splitlines()) == 1
    assert _tables(other) == ["sales"]
    # An empty DuckDB database holds nothing to mix with: it becomes a ledger.
    empty = tmp_path / "empty.duckdb"
    duckdb.connect(str(empty)).close()
    assert ledger_main(["merge", "--into", str(empty), str(whole)]) == 0
    assert _bill(empty) == _bill(whole)


def test_ledger_named_tables_of_another_shape_are_one_line(
        fleet_om_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Repro 8: tables named like the ledger's whose columns are not the ledger's."""
    bad = tmp_path / "bad.duckdb"
    con = duckdb.connect(str(bad))
    for table in ("device_hours", "coverage", "charges"):
        con.execute(f"CREATE TABLE {table} (hour VARCHAR, cluster VARCHAR, cost VARCHAR)")
    con.close()
    capsys.readouterr()
    assert main(["--openmetrics", str(fleet_om_file), *DAY, "--db", str(bad), "-q"]) == 4
    err = capsys.readouterr().err
    assert "column hour is VARCHAR, a ledger's is TIMESTAMP" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert _tables(bad) == ["charges", "coverage", "device_hours"]
    from metering.report.cli import main as report_main
    assert report_main(["--month", "2026-10", "--db", str(bad), "--out",
                        str(tmp_path / "r")]) == 4
    err = capsys.readouterr().err
    assert "a ledger's is TIMESTAMP" in err and len(err.strip().splitlines()) == 1
