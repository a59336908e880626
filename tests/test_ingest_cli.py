"""`gpu-ledger meter` end to end on OpenMetrics input: exit codes, messages, progress."""

from __future__ import annotations

import hashlib
import io
from decimal import Decimal
from pathlib import Path

import conftest_prom
import pytest

from gpu_ledger.cli import main as gpu_ledger
from metering.cli_meter import main
from metering.db import connect
from metering.progress import Progress

fleet_om_file = conftest_prom.fleet_om_file  # session fixture
DAY = ["--from", "2026-10-05", "--to", "2026-10-06"]


def test_meter_openmetrics_and_price(fleet_om_file: Path, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "m.duckdb"
    rc = gpu_ledger(["meter", "--openmetrics", str(fleet_om_file), *DAY, "--db", str(db),
                     "--chunk", "6"])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert "4 chunks, 0 queries, 144 device_hours, 48 mig_hours, 121 allocation_hours" in err
    assert "meter: chunk 4/4" in err and "priced" in err  # not a TTY: plain lines
    con = connect(db, read_only=True)
    assert con.execute("SELECT count(*) FROM coverage WHERE devices = 6").fetchone() == (24,)
    assert con.execute("SELECT count(*) > 0 FROM charges").fetchone() == (True,)
    con.close()


def test_price_only_prices_the_facts_in_the_database(fleet_om_file: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Ingest without pricing, then price with no source at all; the charges equal those of
    an ingest that priced, and re-pricing with another cost model replaces them."""
    db, both = tmp_path / "m.duckdb", tmp_path / "both.duckdb"
    assert main(["--openmetrics", str(fleet_om_file), *DAY, "--db", str(db), "--no-price",
                 "-q"]) == 0
    assert main(["--openmetrics", str(fleet_om_file), *DAY, "--db", str(both), "-q"]) == 0
    capsys.readouterr()
    rc = gpu_ledger(["meter", "--price-only", *DAY, "--db", str(db)])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert "meter: priced 2026-10-05T00:00Z .. 2026-10-06T00:00Z from the facts in" in err
    charges = "SELECT * EXCLUDE (cost_model_hash) FROM charges ORDER BY ALL"
    with connect(db, read_only=True) as con, connect(both, read_only=True) as ref:
        assert con.execute(charges).fetchall() == ref.execute(charges).fetchall()
        assert con.execute("SELECT count(*) FROM charges").fetchone()[0] > 0  # type: ignore[index]
    model = tmp_path / "flat.yaml"
    model.write_text("pricing:\n  default: {hourly: 1.5}\n")
    assert main(["--price-only", *DAY, "--db", str(db), "--cost-model", str(model), "-q"]) == 0
    with connect(db, read_only=True) as con:
        # 6 GPUs x 24 h at 1.50 each, whatever the model
        assert con.execute("SELECT sum(cost), count(DISTINCT cost_model_hash) FROM charges"
                           ).fetchone() == (Decimal("216"), 1)
    # The month around the day: 720 of its hours have no facts, and the message says so.
    assert main(["--price-only", "--month", "2026-10", "--db", str(db)]) == 0
    assert "720 of 744 hour(s) have no device facts" in capsys.readouterr().err


@pytest.mark.parametrize(("args", "code", "message"), [
    (["--no-price"], 2, "--price-only and --no-price: expected one of them"),
    (["--prometheus", "http://127.0.0.1:9"], 2, "not allowed with argument"),
    (["--month", "2026-13"], 2, "--month: expected YYYY-MM"),
])
def test_price_only_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                 args: list[str], code: int, message: str) -> None:
    period = [] if "--month" in args else DAY
    rc = main(["--price-only", *period, "--db", str(tmp_path / "m.duckdb"), *args])
    err = capsys.readouterr().err
    assert rc == code and message in err and "Traceback" not in err
    assert not (tmp_path / "m.duckdb").exists()


def test_price_only_needs_a_database_with_facts(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "m.duckdb"
    assert main(["--price-only", *DAY, "--db", str(db)]) == 4
    err = capsys.readouterr().err
    assert f"{db}: expected a metering database written by `gpu-ledger meter`" in err
    assert not db.exists()  # not created empty
    connect(db).close()
    assert main(["--price-only", *DAY, "--db", str(db)]) == 6
    err = capsys.readouterr().err
    assert "expected facts for 2026-10-05T00:00Z .. 2026-10-06T00:00Z, found none" in err
    assert "gpu-ledger meter --prometheus URL --from 2026-10-05 --to 2026-10-06" in err
    bad = tmp_path / "bad.yaml"
    bad.write_text("pricing: [\n")
    assert main(["--price-only", *DAY, "--db", str(db), "--cost-model", str(bad)]) == 4
    err = capsys.readouterr().err
    assert str(bad) in err and "Traceback" not in err


def test_quiet_prints_nothing(fleet_om_file: Path, tmp_path: Path,
                              capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["--openmetrics", str(fleet_om_file), *DAY, "--db", str(tmp_path / "m.duckdb"),
               "--no-price", "--quiet"])
    assert rc == 0
    assert capsys.readouterr() == ("", "")


def test_corrupt_database_is_refused_and_untouched(fleet_om_file: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "ledger.duckdb"
    db.write_bytes(b"this is not a database\n" * 100)
    digest = hashlib.sha256(db.read_bytes()).hexdigest()
    rc = main(["--openmetrics", str(fleet_om_file), *DAY, "--db", str(db), "--no-price"])
    err = capsys.readouterr().err
    assert rc == 4
    assert f"{db}: expected a DuckDB database file" in err and "Traceback" not in err
    assert hashlib.sha256(db.read_bytes()).hexdigest() == digest
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ledger.duckdb"]


def test_bad_cost_model_fails_before_ingest(fleet_om_file: Path, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "cost.yaml"
    model.write_text("prices: [\n")
    rc = main(["--openmetrics", str(fleet_om_file), *DAY, "--db", str(tmp_path / "m.duckdb"),
               "--cost-model", str(model)])
    err = capsys.readouterr().err
    assert rc == 4 and str(model) in err and "Traceback" not in err
    assert not (tmp_path / "m.duckdb").exists()


@pytest.mark.parametrize(("args", "code", "message"), [
    (["--basic-auth", "no-colon"], 2, "--basic-auth: expected USER:PASS"),
    (["--bearer-token-file", "/nonexistent/token"], 4, "/nonexistent/token: cannot read"),
    (["--chunk", "0"], 2, "--chunk: expected a whole number"),
    (["--sample-interval", "-5"], 2, "--sample-interval: expected seconds"),
    (["--timeout", "abc"], 2, "invalid float value"),
])
def test_bad_options(tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str],
                     code: int, message: str) -> None:
    rc = main(["--prometheus", "http://127.0.0.1:9", *DAY, "--db", str(tmp_path / "m.duckdb"),
               "--no-price", *args])
    err = capsys.readouterr().err
    assert rc == code and message in err and "Traceback" not in err


def test_bad_openmetrics_file_is_an_error(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    om = tmp_path / "bad.om"
    om.write_text('gpu_up{uuid="GPU-1"} 1\n')
    rc = main(["--openmetrics", str(om), *DAY, "--db", str(tmp_path / "m.duckdb")])
    err = capsys.readouterr().err
    assert rc == 4 and f"{om}:1: expected" in err


def test_progress_bar_on_a_terminal_and_lines_elsewhere() -> None:
    clock = iter([0.0, 10.0, 20.0, 30.0]).__next__
    tty = io.StringIO()
    p = Progress(3, stream=tty, tty=True, clock=clock)
    p.chunk_done("a")
    assert "1/3 chunks" in tty.getvalue() and "ETA 0:20" in tty.getvalue()
    assert "\r" in tty.getvalue() and "\n" not in tty.getvalue()
    p.chunk_done("b")
    p.chunk_done("c")
    assert tty.getvalue().endswith("3/3 chunks  done\n")
    log = io.StringIO()
    p = Progress(2, stream=log, tty=False, clock=iter([0.0, 5.0, 6.0]).__next__)
    p.chunk_done("2026-10-05T00:00Z .. 2026-10-05T06:00Z", "12 fact rows")
    assert log.getvalue() == ("meter: chunk 1/2 2026-10-05T00:00Z .. 2026-10-05T06:00Z "
                              "(12 fact rows), ETA 0:05\n")
    quiet = io.StringIO()
    Progress(2, stream=quiet, quiet=True).chunk_done("x")
    assert quiet.getvalue() == ""


def test_rerun_from_a_poorer_source_refuses_unless_replace(
        fleet_om_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 13 point 6: re-metering a metered day from an empty source (a Prometheus past
    its retention) must not wipe it. The day holds 6 GPUs x 24 h = 144 device-hours; the empty
    source has 0, so the run refuses, says it would lose 144, and the ledger is unchanged."""
    db = tmp_path / "m.duckdb"
    assert main(["--openmetrics", str(fleet_om_file), *DAY, "--db", str(db), "-q"]) == 0
    con = connect(db, read_only=True)
    before = con.execute("SELECT count(*), sum(cost) FROM charges").fetchone()
    con.close()
    empty = tmp_path / "empty.om"
    empty.write_text("# EOF\n")
    capsys.readouterr()
    rc = main(["--openmetrics", str(empty), *DAY, "--db", str(db), "-q"])
    err = capsys.readouterr().err
    assert rc == 6 and "would lose 144" in err and "--replace" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    con = connect(db, read_only=True)
    assert con.execute("SELECT count(*) FROM device_hours").fetchone() == (144,)
    assert con.execute("SELECT count(*), sum(cost) FROM charges").fetchone() == before
    con.close()
    # A source with no GPU series at all is refused even with --replace: nothing to replace with.
    rc = main(["--openmetrics", str(empty), *DAY, "--db", str(db), "-q", "--replace"])
    err = capsys.readouterr().err
    assert rc == 6 and "no GPU Ledger series" in err and len(err.strip().splitlines()) == 1
    con = connect(db, read_only=True)
    assert con.execute("SELECT count(*) FROM device_hours").fetchone() == (144,)
    con.close()


def test_progress_has_a_rate_per_stage_and_stays_quiet_in_logs_when_asked() -> None:
    log = io.StringIO()
    p = Progress(2, stream=log, tty=False, clock=iter([0.0, 4.0, 8.0]).__next__,
                 stage="price", unit="week")
    p.chunk_done("2026-10-01T00:00Z .. 2026-10-08T00:00Z", "2000 charge rows", 2000,
                 "charge rows")
    assert log.getvalue() == ("price: week 1/2 2026-10-01T00:00Z .. 2026-10-08T00:00Z "
                              "(2000 charge rows, 500 charge rows/s), ETA 0:04\n")
    tty = io.StringIO()
    p = Progress(2, stream=tty, tty=True, clock=iter([0.0, 2.0, 2.0]).__next__,
                 stage="meter")
    p.chunk_done("a", amount=3_000_000, what="fact rows")
    assert "meter [" in tty.getvalue() and "1.5M fact rows/s" in tty.getvalue()
    silent = io.StringIO()
    Progress(3, stream=silent, tty=False, logs=False, stage="report").chunk_done("x")
    assert silent.getvalue() == ""
