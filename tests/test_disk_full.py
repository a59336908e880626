"""A disk that refuses writes while a chunk is committed or an export is written (issue 26,
repro 8): one line, exit 1, and the ledger / export as it was (or refused until redone).

The refusal is real, not mocked: the command runs in a process whose file size limit
(RLIMIT_FSIZE, with SIGXFSZ ignored) makes the kernel refuse writes past a few KiB, as a full
disk refuses them past its last free block; DuckDB and Python see the same failed write(2)."""

from __future__ import annotations

import resource
import signal
import subprocess
import sys
from pathlib import Path

import conftest_prom
import pytest

from metering.cli_meter import main
from metering.db import connect

fleet_om_file = conftest_prom.fleet_om_file  # session fixture
DAY = ["--from", "2026-10-05", "--to", "2026-10-06", "--chunk", "6"]
ROOT = Path(__file__).resolve().parent.parent
LIMIT = 16 << 10  # bytes a process may write to one file


def _limited(module: str, *args: str, size: int = LIMIT) -> subprocess.CompletedProcess[str]:
    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))

    return subprocess.run(
        [sys.executable, "-c", f"import sys; from {module} import main; sys.exit(main())",
         *args], capture_output=True, text=True, cwd=ROOT, preexec_fn=limit, timeout=300)


def _state(db: Path) -> tuple[object, ...]:
    with connect(db, read_only=True) as con:
        return tuple(con.execute(
            f"SELECT count(*) FROM {t}").fetchone()[0]  # type: ignore[index]
            for t in ("device_hours", "allocation_hours", "coverage", "charges")) + tuple(
            con.execute("SELECT sum(cost) FROM charges").fetchone() or ())


def test_disk_full_while_committing_a_chunk(fleet_om_file: Path, tmp_path: Path) -> None:
    db = tmp_path / "m.duckdb"
    assert main(["--openmetrics", str(fleet_om_file), *DAY, "--db", str(db), "-q"]) == 0
    before = _state(db)
    done = _limited("metering.cli_meter", "--openmetrics", str(fleet_om_file), *DAY, "--db",
                    str(db), "-q")
    assert done.returncode == 1, done.stderr
    err = done.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "could not write to disk (File too large)" in err and "run the same command" in err
    assert _state(db) == before  # a chunk is all or nothing
    assert main(["--openmetrics", str(fleet_om_file), *DAY, "--db", str(db), "-q"]) == 0
    assert _state(db) == before


def test_disk_full_while_exporting(fleet_om_file: Path, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "m.duckdb"
    assert main(["--openmetrics", str(fleet_om_file), *DAY, "--db", str(db), "-q"]) == 0
    out = tmp_path / "export"
    from metering.cli_ledger import main as ledger_main
    assert ledger_main(["export", "--db", str(db), "--out", str(out)]) == 0
    done = _limited("metering.cli_ledger", "export", "--db", str(db), "--out", str(out),
                    size=1024)  # the export's files are small
    assert done.returncode == 1, done.stderr
    err = done.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "could not write to disk" in err or "File too large" in err, err
    from metering.report.cli import main as report_main
    capsys.readouterr()
    rc = report_main(["--month", "2026-10", "--db", str(out), "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert rc == 4 and "did not finish" in err and len(err.strip().splitlines()) == 1, err
