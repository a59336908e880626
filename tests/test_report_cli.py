"""`gpu-ledger report` end to end on real DuckDB files: files written, errors, atomicity."""

from __future__ import annotations

import errno
import os
import re
import shlex
import shutil
from datetime import datetime
from pathlib import Path

import duckdb
import pytest
from test_report_fixtures import HASH, charge, insert_charges, make_db

from gpu_ledger.cli import main as gpu_ledger
from metering.cli_meter import main as meter_main
from metering.costmodel import default_path
from metering.db import connect
from metering.report import builder, writer
from tests.ledger_rows import ins

NAMES = [f"chargeback-2026-10.{ext}" for ext in ("csv", "parquet", "md", "html")]


def run(*args: str) -> int:
    return gpu_ledger(["report", "--month", "2026-10", *args])


def snapshot(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())}


def test_writes_every_format_and_a_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db, out = make_db(tmp_path / "m.duckdb"), tmp_path / "out"
    assert run("--db", str(db), "--out", str(out)) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(NAMES)
    stdout = capsys.readouterr().out
    assert "Fleet total" in stdout and "20.00" in stdout
    assert "2026-10-03 04:00–07:00 UTC (3 h)" in stdout
    assert HASH in stdout and "cost-model.yaml (packaged default)" in stdout
    md = (out / "chargeback-2026-10.md").read_text()
    assert "- 2026-10-31 23:00–24:00 UTC (1 h)" in md
    assert "gpu-ledger 0.1.0" in md


def test_format_option_and_rerun_is_byte_identical(tmp_path: Path) -> None:
    db = make_db(tmp_path / "m.duckdb")
    for out in ("a", "b"):
        assert run("--db", str(db), "--out", str(tmp_path / out), "--format", "csv,parquet") == 0
    first, second = snapshot(tmp_path / "a"), snapshot(tmp_path / "b")
    assert sorted(first) == ["chargeback-2026-10.csv", "chargeback-2026-10.parquet"]
    assert first == second


def test_empty_month_is_an_error_not_an_empty_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 13: `report --month 2030-01` wrote empty reports and exited 0."""
    db = tmp_path / "empty.duckdb"
    connect(db).close()
    assert run("--db", str(db), "--out", str(tmp_path / "out")) == 6
    err = capsys.readouterr().err
    assert "no metered data for 2026-10" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_failed_write_leaves_previous_report_intact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    db, out = make_db(tmp_path / "m.duckdb"), tmp_path / "out"
    assert run("--db", str(db), "--out", str(out)) == 0
    before = snapshot(out)
    # New charges, so a successful run would change every file...
    con = connect(db)
    insert_charges(con, [charge("2026-10-09 00:00", "new", "n", "p", "GPU-7", "H100",
                                "exclusive", 1, 4, 1, 1, "4")])  # fmt: skip
    con.close()
    # ...but the disk fills up while the third file is written.
    real = writer._write_new
    calls = []

    def failing(path: Path, data: bytes) -> None:
        calls.append(path)
        if len(calls) == 3:
            real(path, data[: len(data) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(path, data)

    monkeypatch.setattr(writer, "_write_new", failing)
    assert run("--db", str(db), "--out", str(out)) == 1
    err = capsys.readouterr().err
    assert "No space left on device" in err and "previous report files are unchanged" in err
    assert snapshot(out) == before  # same files, same bytes, no temporary files left


def test_renderer_failure_touches_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db, out = make_db(tmp_path / "m.duckdb"), tmp_path / "out"
    assert run("--db", str(db), "--out", str(out)) == 0
    before = snapshot(out)

    def broken(report: object) -> bytes:
        raise RuntimeError("renderer bug")

    monkeypatch.setitem(builder.FORMATS, "html", ("html", broken))
    with pytest.raises(RuntimeError, match="renderer bug"):
        run("--db", str(db), "--out", str(out))
    assert snapshot(out) == before


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--month", "2026-13"], "--month: expected a month like 2026-10, got '2026-13'"),
        (["--format", "csv,pdf"],
         "--format: expected some of csv,parquet,md,html,focus, got 'pdf'"),
        (["--top", "0"], "--top: expected a whole number >= 1, got 0"),
    ],
)
def test_bad_options(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    db = make_db(tmp_path / "m.duckdb")
    rc = gpu_ledger(["report", "--month", "2026-10", "--db", str(db), *args])
    assert rc == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "reports").exists()


def test_missing_or_foreign_database(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope.duckdb"
    assert run("--db", str(missing)) == 4
    assert f"{missing}: expected an existing DuckDB database file" in capsys.readouterr().err
    assert not missing.exists()
    foreign = tmp_path / "other.duckdb"
    duckdb.connect(str(foreign)).close()
    assert run("--db", str(foreign)) == 4
    assert "expected a GPU Ledger metering database" in capsys.readouterr().err


def test_cost_model_must_be_the_one_charges_were_priced_with(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db, out = make_db(tmp_path / "m.duckdb"), tmp_path / "out"
    same = tmp_path / "same.yaml"
    shutil.copyfile(default_path(), same)
    assert run("--db", str(db), "--out", str(out), "--cost-model", str(same)) == 0
    assert f",{same},{HASH}," in (out / "chargeback-2026-10.csv").read_text()
    assert f"{same} (hash {HASH})" in capsys.readouterr().out
    changed = tmp_path / "changed.yaml"
    changed.write_bytes(default_path().read_bytes() + b"\n# edited\n")
    assert run("--db", str(db), "--out", str(out), "--cost-model", str(changed)) == 6
    err = capsys.readouterr().err
    assert f"priced with cost model {HASH}" in err and "re-price the month" in err
    broken = tmp_path / "broken.yaml"
    broken.write_text("currency: dollars\n")
    assert run("--db", str(db), "--cost-model", str(broken)) == 4
    assert f"{broken}: currency: expected a three-letter ISO 4217 code" in capsys.readouterr().err


def test_month_priced_with_two_cost_models_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = make_db(tmp_path / "m.duckdb")
    con = connect(db)
    insert_charges(con, [charge("2026-10-09 00:00", "x", "n", "p", "GPU-7", "H100", "exclusive",
                                1, 4, 1, 1, "4", cost_model_hash="f" * 64)])  # fmt: skip
    con.close()
    assert run("--db", str(db), "--out", str(tmp_path / "out")) == 6
    assert "priced with 2 different cost models" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def _ingested_not_priced(db: Path) -> None:
    con = connect(db)
    con.execute(
        ins("device_hours") + "VALUES (?, 'node-1', '0', 'GPU-1', 'NVIDIA H100 80GB HBM3', "
        "false, 3600, 3600, 1800, NULL)",
        [datetime(2026, 10, 4, 8)],
    )
    con.execute(
        ins("allocation_hours") + "VALUES (?, 'node-1', 'train', 'trainer-0', 'main', "
        "'GPU-1', '', 'nvidia.com/gpu', 'exclusive', 1, 1, 3600, 0, 1800, MAP {'team': 'ml'})",
        [datetime(2026, 10, 4, 8)],
    )
    con.execute("INSERT INTO coverage (hour, source, devices, ingested_at) "
                "VALUES (?, 'test', 1, ?)",
                [datetime(2026, 10, 4, 8), datetime(2026, 11, 1)])  # fmt: skip
    con.close()


def test_report_never_prices_pricing_is_an_explicit_step(tmp_path: Path) -> None:
    db, out = tmp_path / "m.duckdb", tmp_path / "out"
    _ingested_not_priced(db)
    assert run("--db", str(db), "--out", str(out), "--format", "md") == 6
    con = connect(db, read_only=True)
    assert con.execute("SELECT count(*) FROM charges").fetchone() == (0,)  # read only
    con.close()
    assert meter_main(["--price-only", "--month", "2026-10", "--db", str(db), "-q"]) == 0
    assert run("--db", str(db), "--out", str(out), "--format", "md") == 0
    md = (out / "chargeback-2026-10.md").read_text()
    con = connect(db, read_only=True)
    total = con.execute("SELECT sum(cost), any_value(cost_model_hash) FROM charges").fetchone()
    con.close()
    assert total is not None and total[0] > 0 and total[1] == HASH
    assert "**Fleet total** |" in md and f"{total[0]:,.2f}" in md


def test_ingested_month_without_pricing_says_what_to_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "m.duckdb"
    _ingested_not_priced(db)
    assert run("--db", str(db), "--out", str(tmp_path / "out")) == 6
    err = capsys.readouterr().err
    assert "2026-10 has GPU usage but no charges" in err
    assert f"gpu-ledger meter --price-only --month 2026-10 --db {db}" in err


def test_re_pricing_advice_is_a_command_that_works(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db, out = tmp_path / "m.duckdb", tmp_path / "out"
    _ingested_not_priced(db)
    assert meter_main(["--price-only", "--month", "2026-10", "--db", str(db), "-q"]) == 0
    assert run("--db", str(db), "--out", str(out), "--format", "csv") == 0  # default model
    changed = tmp_path / "changed.yaml"
    changed.write_bytes(default_path().read_bytes() + b"\n# edited\n")
    assert run("--db", str(db), "--out", str(out), "--cost-model", str(changed)) == 6
    advice = re.search(r"\((gpu-ledger meter [^)]*)\)", capsys.readouterr().err)
    assert advice is not None
    command = shlex.split(advice.group(1))
    assert command == ["gpu-ledger", "meter", "--price-only", "--month", "2026-10", "--db",
                       str(db), "--cost-model", str(changed)]
    # No Prometheus anywhere: the facts in the database are priced again.
    assert gpu_ledger(command[1:]) == 0
    assert run("--db", str(db), "--out", str(out), "--cost-model", str(changed)) == 0
    assert f"{changed} (hash " in capsys.readouterr().out
