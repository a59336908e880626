"""Every metering command reports an error as one line and the exit status of its kind, the
same kind with the same status in `meter`, `report` and `cost-model` (the table in
docs/operations.md, "Exit status"; issue 13 point 6). The locked-ledger status (7) is proven
with real concurrent processes in tests/test_meter_crash.py."""

from __future__ import annotations

import socket
from pathlib import Path

import conftest_prom
import pytest

from gpu_ledger.cli import main as gpu_ledger
from metering.db import connect
from metering.errors import ExitCode

fleet_om_file = conftest_prom.fleet_om_file  # session fixture
DAY = ["--from", "2026-10-05", "--to", "2026-10-06"]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str]:
    rc = gpu_ledger(argv)
    err = capsys.readouterr().err
    return rc, err


@pytest.fixture
def files(tmp_path: Path, fleet_om_file: Path) -> dict[str, str]:
    bad_model = tmp_path / "bad-model.yaml"
    bad_model.write_text("pricing:\n  default: {hourly: abc}\n")
    junk = tmp_path / "junk.duckdb"
    junk.write_bytes(b"not a database\n" * 64)
    empty_ledger = tmp_path / "empty.duckdb"
    connect(empty_ledger).close()
    empty_om = tmp_path / "empty.om"
    empty_om.write_text("# EOF\n")
    bad_om = tmp_path / "bad.om"
    bad_om.write_text('gpu_up{uuid="GPU-1"} 1\n')
    return {"bad_model": str(bad_model), "junk": str(junk), "missing": str(tmp_path / "no.db"),
            "empty_ledger": str(empty_ledger), "empty_om": str(empty_om),
            "bad_om": str(bad_om), "om": str(fleet_om_file), "out": str(tmp_path / "out"),
            "new": str(tmp_path / "new.duckdb")}


# kind -> commands that must all exit with it; {name} is a path from the fixture.
CASES: dict[ExitCode, list[list[str]]] = {
    ExitCode.USAGE: [
        ["meter", "--openmetrics", "{om}", "--month", "2026-13", "--db", "{new}"],
        ["report", "--month", "2026-13", "--db", "{empty_ledger}"],
        ["meter", "--openmetrics", "{om}", *DAY, "--bogus"],
        ["report", "--month", "2026-10", "--bogus"],
        ["cost-model", "check", "--bogus"],
        ["report", "--month", "2026-10", "--db", "{empty_ledger}", "--format", "xls"],
        ["close", "2026-13", "--db", "{empty_ledger}"],
    ],
    ExitCode.BAD_INPUT: [
        ["meter", "--openmetrics", "{om}", *DAY, "--db", "{new}", "--cost-model", "{bad_model}"],
        ["report", "--month", "2026-10", "--db", "{empty_ledger}", "--cost-model",
         "{bad_model}"],
        ["cost-model", "check", "{bad_model}"],
        ["meter", "--price-only", *DAY, "--db", "{missing}"],
        ["report", "--month", "2026-10", "--db", "{missing}"],
        ["meter", "--openmetrics", "{om}", *DAY, "--db", "{junk}"],
        ["report", "--month", "2026-10", "--db", "{junk}"],
        ["meter", "--openmetrics", "{bad_om}", *DAY, "--db", "{new}"],
        ["close", "2026-10", "--db", "{missing}"],
        ["close", "2026-10", "--db", "{junk}"],
    ],
    ExitCode.SOURCE: [
        ["meter", "--prometheus", "http://127.0.0.1:{port}", *DAY, "--db", "{new}",
         "--retries", "0"],
    ],
    ExitCode.REFUSED: [
        ["meter", "--openmetrics", "{empty_om}", *DAY, "--db", "{empty_ledger}"],
        ["meter", "--price-only", *DAY, "--db", "{empty_ledger}"],
        ["report", "--month", "2026-10", "--db", "{empty_ledger}", "--out", "{out}"],
        ["close", "2026-10", "--db", "{empty_ledger}"],
    ],
}


@pytest.mark.parametrize(("code", "argv"), [(c, a) for c, cases in CASES.items()
                                            for a in cases],
                         ids=lambda v: v.name if isinstance(v, ExitCode) else " ".join(v)[:40])
def test_same_kind_same_status_one_line(code: ExitCode, argv: list[str], files: dict[str, str],
                                        capsys: pytest.CaptureFixture[str]) -> None:
    args = [a.format(port=_closed_port(), **files) for a in argv]
    rc, err = _run(capsys, args)
    assert rc == code, err
    # One error line; anything before it is `meter:` progress (none with --quiet).
    *progress, last = err.rstrip("\n").split("\n")
    assert last.startswith(f"gpu-ledger {args[0]}: ") and "Traceback" not in err, err
    assert all(line.startswith("meter: ") for line in progress), err
    assert not Path(files["out"]).exists()


def test_no_gpu_series_is_refused_and_writes_nothing(files: dict[str, str],
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """An empty source is an error, not an empty month: no coverage rows claim the day was
    metered with no GPUs."""
    rc, err = _run(capsys, ["meter", "--openmetrics", files["empty_om"], *DAY,
                            "--db", files["new"], "--chunk", "6"])
    assert rc == ExitCode.REFUSED and "no GPU Ledger series" in err
    # the ledger this run created holds nothing, so it is not left behind (issue 27)
    assert not Path(files["new"]).exists()


def test_codes_are_documented() -> None:
    doc = (Path(__file__).resolve().parent.parent / "docs" / "operations.md").read_text()
    table = doc[doc.index("### Exit status"):]
    for code in ExitCode:
        assert f"\n| {code.value} |" in table, code
