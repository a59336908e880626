"""Closed months and their adjustments travel with `ledger export` and `ledger merge`
(issue 27): a merged ledger knows which months are closed and what was posted for them, so a
closed month cannot be re-billed through the fleet ledger.

Inputs: the hand-computed fleet of conftest_prom as OpenMetrics history, moved back into a
September that is closed before node-b's late samples arrive (tests/test_daily.py).
"""

from __future__ import annotations

from pathlib import Path

import conftest_prom
import pytest
from test_daily import SEP, history

from metering.cli_close import main as close_main
from metering.cli_ledger import main as ledger_main
from metering.cli_meter import main as meter_main
from metering.db import connect
from metering.errors import ExitCode
from metering.report.cli import main as report_main

fleet_om_file = conftest_prom.fleet_om_file


def _meter(db: Path, source: Path, start: str, end: str, cluster: str, *extra: str) -> None:
    assert meter_main(["--openmetrics", str(source), "--from", start, "--to", end, "--db",
                       str(db), "--cluster", cluster, "-q", *extra]) == 0


def closed_ledger(fleet_om: Path, tmp: Path, name: str, cluster: str, *,
                  late: bool = True) -> Path:
    """September and October metered (node-b's late samples of September 5 missing when
    `late`), September closed, then the late samples metered as adjustments to October."""
    tmp.mkdir(exist_ok=True)
    full = history(fleet_om, tmp / "full.om", september=True)
    first = history(fleet_om, tmp / "late.om", late_missing=True, september=True) if late \
        else full
    db = tmp / name
    _meter(db, first, "2026-09-01", "2026-11-01", cluster)
    assert close_main(["2026-09", "--db", str(db), "-q"]) == 0
    _meter(db, full, "2026-09-05", "2026-09-06", cluster, "--adjust-closed")
    return db


def _closes(db: Path) -> list[tuple[object, ...]]:
    with connect(db, read_only=True) as con:
        return con.execute("SELECT month, cost, device_hours FROM month_closes ORDER BY 1"
                           ).fetchall()


def _adjustments(db: Path) -> list[tuple[object, ...]]:
    with connect(db, read_only=True) as con:
        return con.execute("SELECT * EXCLUDE (posted_at) FROM adjustments ORDER BY ALL"
                           ).fetchall()


def _reports(db: Path, out: Path) -> dict[str, bytes]:
    files = {}
    for month in ("2026-09", "2026-10"):
        assert report_main(["--month", month, "--db", str(db), "--out", str(out), "--format",
                            "csv", "--format", "md"]) == 0
    for f in sorted(out.iterdir()):
        files[f.name] = f.read_bytes()
    return files


def test_export_and_merge_carry_closes_and_adjustments(
        fleet_om_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    east = closed_ledger(fleet_om_file, tmp_path / "e", "east.duckdb", "east")
    closes, posted = _closes(east), _adjustments(east)
    assert [m.month for m, *_ in closes] == [9] and posted  # type: ignore[attr-defined]
    want = _reports(east, tmp_path / "r-east")
    assert b"## Adjustments for 2026-09" in want["chargeback-2026-10.md"]

    export = tmp_path / "export"
    assert ledger_main(["export", "--db", str(east), "--out", str(export)]) == 0
    assert (export / "month_closes" / "part-0.parquet").is_file()
    assert list((export / "adjustments").glob("cluster=east/month=2026-09/part-0.parquet"))
    # the export reports as the ledger does, closes and adjustments included
    assert _reports(export, tmp_path / "r-export") == want

    fleet = tmp_path / "fleet.duckdb"
    for _ in range(2):  # merging the same export again changes nothing
        assert ledger_main(["merge", "--into", str(fleet), str(export)]) == 0
        assert _closes(fleet) == closes and _adjustments(fleet) == posted
    assert _reports(fleet, tmp_path / "r-fleet") == want

    # The fleet ledger's September is closed: re-metering it there is refused as in east.
    capsys.readouterr()
    assert meter_main(["--price-only", "--month", "2026-09", "--db", str(fleet), "-q"]
                      ) == ExitCode.CLOSED


def test_merge_refuses_another_bill_for_a_closed_month(
        fleet_om_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    east = closed_ledger(fleet_om_file, tmp_path / "a", "east.duckdb", "east")
    # the same cluster metered again elsewhere, its September closed with every sample
    again = closed_ledger(fleet_om_file, tmp_path / "b", "east-again.duckdb", "east",
                          late=False)
    assert _closes(east) != _closes(again)
    fleet = tmp_path / "fleet.duckdb"
    assert ledger_main(["merge", "--into", str(fleet), str(east)]) == 0
    before = (_closes(fleet), _adjustments(fleet))
    capsys.readouterr()
    assert ledger_main(["merge", "--into", str(fleet), str(again)]) == ExitCode.CLOSED
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "2026-09 is closed in" in err, err
    assert "nothing written" in err
    assert (_closes(fleet), _adjustments(fleet)) == before


def test_a_month_closed_in_one_cluster_only_stays_open_when_merged(
        fleet_om_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    east = closed_ledger(fleet_om_file, tmp_path / "a", "east.duckdb", "east")
    west = tmp_path / "west.duckdb"
    _meter(west, history(fleet_om_file, tmp_path / "w.om", september=True), "2026-09-01",
           "2026-11-01", "west")
    fleet = tmp_path / "fleet.duckdb"
    capsys.readouterr()
    assert ledger_main(["merge", "--into", str(fleet), str(east), str(west)]) == 0
    assert "2026-09: closed in some sources but other clusters' hours of it are open" in \
        capsys.readouterr().err
    assert _closes(fleet) == [] and _adjustments(fleet) == _adjustments(east)
    # once west closes September too, the merge closes it, with both clusters' bill
    assert close_main(["2026-09", "--db", str(west), "-q"]) == 0
    assert ledger_main(["merge", "--into", str(fleet), str(east), str(west)]) == 0
    (month, cost, device_hours), = _closes(fleet)
    assert month == SEP.start.date()
    assert cost == _closes(east)[0][1] + _closes(west)[0][1]  # type: ignore[operator]
    assert device_hours == _closes(east)[0][2] + _closes(west)[0][2]  # type: ignore[operator]
