"""Continuous metering (issue 27 item 1): days metered as they close give the bill the one-shot
month gives, to the cent, late samples included; a closed month never changes, and what late
data changes in it is posted as adjustments to the open month, shown in both months' reports
and as FOCUS corrections.

Inputs: the hand-computed fleet of conftest_prom (real Prometheus for the one-shot month, its
OpenMetrics history for the days), and the same history moved back 30 days as a closed
September whose late samples arrive after the close.
"""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import conftest_prom
import pytest

from metering.cli_close import main as close_main
from metering.cli_meter import main as meter_main
from metering.db import connect
from metering.errors import ExitCode
from metering.period import Month, Period, daily_window
from metering.report.cli import main as report_main

fleet_om_file = conftest_prom.fleet_om_file
fleet_prom_url = conftest_prom.fleet_prom_url

SHIFT = 30 * 86400  # October's history moved back into September
LATE_FROM = int(datetime(2026, 10, 5, 12, tzinfo=UTC).timestamp())  # node-b's samples after
LATE_TO = int(datetime(2026, 10, 6, tzinfo=UTC).timestamp())  # this arrive late, up to this


def _series(path: Path) -> list[tuple[str, list[str]]]:
    """The file as (family header, sample lines) blocks, in order."""
    blocks: list[tuple[str, list[str]]] = []
    for line in path.read_text().splitlines():
        if line.startswith("# TYPE"):
            blocks.append((line, []))
        elif line and not line.startswith("#"):
            blocks[-1][1].append(line)
    return blocks


def _ts(line: str) -> int:
    return int(line.rsplit(" ", 1)[1])


def _late(line: str, shift: int = 0) -> bool:
    return 'node="node-b"' in line and LATE_FROM - shift < _ts(line) <= LATE_TO - shift


def history(src: Path, out: Path, *, late_missing: bool = False, september: bool = False
            ) -> Path:
    """The fleet's history, optionally without node-b's late samples (of October 5, or of
    September 5 with `september`), optionally with the whole history 30 days earlier too."""
    parts = []
    for head, lines in _series(src):
        by_series: dict[str, list[str]] = {}
        for line in lines:
            by_series.setdefault(line.rsplit(" ", 2)[0], []).append(line)
        parts.append(head)
        for key, own in by_series.items():
            if september:  # that series' samples moved back first: each series in time order
                moved = [f"{key} {ln.rsplit(' ', 2)[1]} {_ts(ln) - SHIFT}" for ln in own]
                parts += [ln for ln in moved if not (late_missing and _late(ln, SHIFT))]
                parts += own
            else:
                parts += [ln for ln in own if not (late_missing and _late(ln))]
    out.write_text("\n".join(parts) + "\n# EOF\n")
    return out


def bill(db: Path, month: Month) -> dict[tuple[str, str], Decimal]:
    """The month's bill per team and namespace, from its charges."""
    with connect(db, read_only=True) as con:
        return {(t, n): c for t, n, c in con.execute(
            "SELECT team, namespace, sum(cost) FROM charges WHERE hour >= ? AND hour < ? "
            "GROUP BY ALL", [month.start, month.end]).fetchall()}


def meter(db: Path, source: Path, start: str, end: str, *extra: str) -> int:
    return meter_main(["--openmetrics", str(source), "--from", start, "--to", end,
                       "--db", str(db), "-q", *extra])


OCT, SEP = Month(2026, 10), Month(2026, 9)
DAYS = [("2026-10-04", "2026-10-05"), ("2026-10-05", "2026-10-06"), ("2026-10-06", "2026-10-07")]


def test_days_give_the_one_shot_months_bill_to_the_cent(
        fleet_om_file: Path, fleet_prom_url: str, tmp_path: Path) -> None:
    once = tmp_path / "once.duckdb"
    assert meter_main(["--prometheus", fleet_prom_url, "--month", "2026-10", "--db", str(once),
                       "-q"]) == 0
    full = bill(once, OCT)
    assert sum(full.values()) > 0 and len(full) >= 4

    late = history(fleet_om_file, tmp_path / "late.om", late_missing=True)
    daily = tmp_path / "daily.duckdb"
    for start, end in DAYS:  # each day as the daily run meters it, late samples missing
        assert meter(daily, late, start, end) == 0
    before = bill(daily, OCT)
    assert before != full  # the late samples matter to the bill
    assert meter(daily, fleet_om_file, *DAYS[1]) == 0  # a later run re-meters the day
    after = bill(daily, OCT)
    assert after == full  # to the micro, so to the cent
    with connect(daily, read_only=True) as con:  # and no hour of the day counted twice
        assert con.execute("SELECT count(*) FROM (SELECT hour, uuid FROM device_hours GROUP BY "
                           "ALL HAVING count(*) > 1)").fetchone() == (0,)


def _err(capsys: pytest.CaptureFixture[str]) -> str:
    return capsys.readouterr().err.strip()


def test_a_closed_month_never_changes_and_late_data_becomes_adjustments(
        fleet_om_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    late = history(fleet_om_file, tmp_path / "late.om", late_missing=True, september=True)
    full = history(fleet_om_file, tmp_path / "full.om", september=True)
    truth = tmp_path / "truth.duckdb"  # what September costs with every sample
    assert meter(truth, full, "2026-09-01", "2026-10-01") == 0
    want = bill(truth, SEP)

    db = tmp_path / "ledger.duckdb"
    assert meter(db, late, "2026-09-01", "2026-10-01") == 0  # September's daily runs
    assert meter(db, late, "2026-10-01", "2026-11-01") == 0  # and October's
    capsys.readouterr()
    assert close_main(["2026-09", "--db", str(db)]) == 0
    said = _err(capsys)
    assert said.startswith("close: 2026-09 closed at ") and "adjustments to 2026-10" in said
    assert close_main(["2026-09", "--db", str(db)]) == 0  # again: nothing changes
    assert "was closed on" in _err(capsys)
    closed = bill(db, SEP)
    assert closed != want

    # Re-metering a closed month's hours: refused, one line, nothing written.
    assert meter(db, full, "2026-09-05", "2026-09-06") == ExitCode.CLOSED
    err = _err(capsys)
    assert len(err.splitlines()) == 1 and "2026-09 is closed" in err and "--adjust-closed" in err
    assert meter_main(["--price-only", "--month", "2026-09", "--db", str(db), "-q"]
                      ) == ExitCode.CLOSED
    assert bill(db, SEP) == closed

    # With --adjust-closed (what --daily does): the closed bill stays, the difference is posted
    # to October per team and namespace; posting again adds nothing.
    for _ in range(2):
        assert meter(db, full, "2026-09-05", "2026-09-06", "--adjust-closed") == 0
        assert bill(db, SEP) == closed
        with connect(db, read_only=True) as con:
            posted = {(t, n): c for t, n, c in con.execute(
                "SELECT team, namespace, sum(cost) FROM adjustments GROUP BY ALL "
                "HAVING sum(cost) <> 0").fetchall()}
            months = con.execute("SELECT DISTINCT posted_month FROM adjustments").fetchall()
        assert months == [(datetime(2026, 10, 1).date(),)]
        assert {k: closed.get(k, Decimal(0)) + posted.get(k, Decimal(0))
                for k in want.keys() | posted.keys()} == want
    with connect(db, read_only=True) as con:
        lines = con.execute("SELECT count(*) FROM adjustments").fetchone()
    assert meter(db, full, "2026-10-04", "2026-10-07") == 0  # October is open: re-metered
    with connect(db, read_only=True) as con:
        assert con.execute("SELECT count(*) FROM adjustments").fetchone() == lines

    # Both months' reports show them; October's FOCUS export carries them as corrections.
    out = tmp_path / "reports"
    for month in ("2026-09", "2026-10"):
        assert report_main(["--month", month, "--db", str(db), "--out", str(out),
                            "--format", "md", "--format", "csv", "--format", "focus"]) == 0
    sep_md = (out / "chargeback-2026-09.md").read_text()
    oct_md = (out / "chargeback-2026-10.md").read_text()
    total = sum(posted.values(), Decimal(0))
    assert "## Adjustments posted to 2026-10" in sep_md and "**Closed:** on " in sep_md
    assert f"adjustments posted to 2026-10: {total:+,.2f}" in sep_md
    assert "## Adjustments for 2026-09" in oct_md and "Adjustments posted" not in oct_md
    assert f"adjustments for 2026-09: {total:+,.2f} USD, billed in this month" in oct_md
    assert "**Closed:**" not in oct_md
    focus = _focus_rows(out, "2026-10")
    corrections = [r for r in focus if r["ChargeClass"] == "Correction"]
    assert corrections and all(r["ChargePeriodStart"] == "2026-09-01T00:00:00Z" and
                               r["BillingPeriodStart"] == "2026-10-01T00:00:00Z"
                               for r in corrections)
    assert sum(Decimal(r["BilledCost"]) for r in corrections) == total
    assert not [r for r in _focus_rows(out, "2026-09") if r["ChargeClass"]]
    tidy = list(csv.DictReader(io.StringIO((out / "chargeback-2026-10.csv").read_text())))
    billed = [r for r in tidy if r["section"] == "adjustment"]
    assert billed and {r["hour_from"] for r in billed} == {"2026-09-01T00:00:00Z"}
    assert sum(Decimal(r["cost"]) for r in billed) == total
    sep_tidy = (out / "chargeback-2026-09.csv").read_text()
    assert ",adjustment," not in sep_tidy  # the closed month's own files keep their rows


def _focus_rows(out: Path, month: str) -> list[dict[str, Any]]:
    (path,) = out.glob(f"*{month}*focus*.csv")
    return list(csv.DictReader(io.StringIO(path.read_text())))


def test_close_refuses_a_month_not_metered_whole_or_not_over(
        fleet_om_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "m.duckdb"
    assert meter(db, fleet_om_file, *DAYS[1]) == 0
    capsys.readouterr()
    assert close_main(["2026-10", "--db", str(db)]) == ExitCode.REFUSED
    err = _err(capsys)
    # from the first metered hour (Oct 5) to the month's end: 27 days, one of them metered
    assert "2026-10: cluster default: 624 hour(s) not metered" in err and "\n" not in err
    assert "(gpu-ledger meter --from 2026-10-06T00:00Z --to 2026-11-01T00:00Z)" in err
    this = Month.of(datetime.now(UTC))
    assert close_main([str(this), "--db", str(db)]) == ExitCode.REFUSED
    assert "has not ended yet" in _err(capsys)
    assert close_main(["2026-13", "--db", str(db)]) == ExitCode.USAGE
    assert close_main(["2026-10", "--db", str(tmp_path / "none.duckdb")]) == ExitCode.BAD_INPUT


def test_daily_window_is_yesterday_and_the_late_days() -> None:
    now = datetime(2026, 11, 1, 0, 30, tzinfo=UTC)
    w = daily_window(now, 2)
    assert (w.start, w.end) == (datetime(2026, 10, 29, tzinfo=UTC), datetime(2026, 11, 1,
                                                                              tzinfo=UTC))
    assert daily_window(now, 0).hours == 24
    assert Period(w.start, w.end).months() == [OCT]
    assert Period(w.start, w.end + timedelta(hours=1)).months() == [OCT, OCT.next()]


def test_daily_takes_no_period(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert meter_main(["--openmetrics", "x.om", "--daily", "--month", "2026-10", "--db",
                       str(tmp_path / "m.duckdb")]) == ExitCode.USAGE
    assert "--daily picks its own days" in _err(capsys)
    assert meter_main(["--openmetrics", "x.om", "--month", "2026-10", "--late-days", "3",
                       "--db", str(tmp_path / "m.duckdb")]) == ExitCode.USAGE
    assert "--late-days: expected with --daily" in _err(capsys)
    assert meter_main(["--openmetrics", "x.om", "--daily", "--late-days", "40",
                       "--db", str(tmp_path / "m.duckdb")]) == ExitCode.USAGE


def test_the_daily_mode_catches_up_and_posts_late_data_for_a_closed_month(
        fleet_om_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`meter --daily` as the CronJob runs it, at chosen moments: a first run, a catch-up
    after weeks without runs, the close, and a run whose late days reach into the closed
    month, posting what its late samples change."""
    import metering.cli_meter as cli

    late = history(fleet_om_file, tmp_path / "late.om", late_missing=True, september=True)
    full = history(fleet_om_file, tmp_path / "full.om", september=True)
    truth = tmp_path / "truth.duckdb"
    assert meter(truth, full, "2026-09-01", "2026-10-01") == 0
    db = tmp_path / "ledger.duckdb"

    def daily(now: datetime, source: Path, *extra: str) -> tuple[int, str]:
        monkeypatch.setattr(cli, "_now", lambda: now)
        rc = meter_main(["--openmetrics", str(source), "--daily", "--db", str(db), *extra])
        return rc, capsys.readouterr().err

    rc, err = daily(datetime(2026, 9, 7, 0, 30, tzinfo=UTC), late, "--late-days", "5")
    assert rc == 0 and "meter: 2026-09-01T00:00Z .. 2026-09-07T00:00Z (144 h)" in err
    rc, err = daily(datetime(2026, 10, 5, 0, 30, tzinfo=UTC), late)
    assert rc == 0 and "catching up from 2026-09-07T00:00Z" in err
    assert "2026-09-07T00:00Z .. 2026-10-05T00:00Z" in err
    assert close_main(["2026-09", "--db", str(db), "-q"]) == 0
    closed = bill(db, SEP)

    rc, err = daily(datetime(2026, 10, 6, 0, 30, tzinfo=UTC), full, "--late-days", "31")
    assert rc == 0, err
    assert "2026-09 closed: its bill stays" in err and "adjustment line(s)" in err
    assert bill(db, SEP) == closed
    with connect(db, read_only=True) as con:
        posted = {(t, n): c for t, n, c in con.execute(
            "SELECT team, namespace, sum(cost) FROM adjustments GROUP BY ALL").fetchall()}
    want = bill(truth, SEP)
    assert {k: closed.get(k, Decimal(0)) + posted.get(k, Decimal(0))
            for k in want.keys() | posted.keys()} == want
