"""A period of several slices never priced (or priced before, in more than
ONE_TRANSACTION_SLICES slices) is priced slice by slice, each slice committed, and noted as
unfinished until the last (metering/pricing.py, metering/unfinished.py): the rows are those of
one transaction. Hours priced before have their old rows set aside first. A run that fails or
is interrupted part way deletes what it priced and puts back what it set aside; one killed
leaves a note that readers refuse and the next writable open clears."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import conftest_prom
import pytest

from metering import ledgerview, pricedhours, pricing, unfinished
from metering.cli_meter import main as meter_main
from metering.costmodel import default_path, load_cost_model
from metering.db import connect
from metering.pricing import PricingResult, price_period

fleet_om_file = conftest_prom.fleet_om_file

SPAN = ("--from", "2026-10-04", "--to", "2026-10-07")  # 72 hours: 6 slices of 12
START, END = datetime(2026, 10, 4), datetime(2026, 10, 7)
# What pricing writes per hour, without the columns that say when.
PRICED = {"charges": "*", "energy_hours": "*", "waste_hours": "*",
          "waste_hours_stored": "* EXCLUDE (stored_at)",
          "priced_hours": "* EXCLUDE (priced_at)"}
# The fleet's samples begin at 10-04 22:00: slices 2 and 3 hold charges, committed when the
# fourth is priced.
_STOP_AT = 4
FACTS = tuple(t for t in unfinished.FACT_TABLES if t != "coverage")
_RECORD = pricedhours.record  # pricing calls it once per slice of a cluster


def _rows(db: Path, tables: dict[str, str] | tuple[str, ...]) -> dict[str, list[Any]]:
    cols = tables if isinstance(tables, dict) else dict.fromkeys(tables, "*")
    with connect(db, read_only=True) as con:
        return {t: sorted(con.execute(f"SELECT {c} FROM {t}").fetchall(), key=repr)
                for t, c in cols.items()}


def _notes(db: Path) -> list[tuple[Any, ...]]:
    with connect(db, read_only=True) as con:
        return con.execute("SELECT hour_start, hour_end, written FROM unfinished_hours"
                           ).fetchall()


def _aside_tables(db: Path) -> list[str]:
    with connect(db, read_only=True) as con:
        return [str(t) for (t,) in con.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_catalog = "
            "current_database() AND table_name LIKE 'aside_%'").fetchall()]


@pytest.fixture(scope="module")
def metered(fleet_om_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fleet's 72 hours metered, not priced."""
    db = tmp_path_factory.mktemp("in-place") / "metered.duckdb"
    assert meter_main(["--openmetrics", str(fleet_om_file), *SPAN, "--no-price", "--db",
                       str(db), "-q"]) == 0
    return db


@pytest.fixture(scope="module")
def priced_before(metered: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same hours priced with dearer GPUs than the packaged cost model's: their old rows
    differ from what a re-price with the packaged model writes."""
    where = tmp_path_factory.mktemp("priced-before")
    dearer = where / "dearer.yaml"
    dearer.write_text(default_path().read_text().replace("hourly: 4.00", "hourly: 5.00")
                      .replace("hourly: 2.00", "hourly: 3.00"))
    db = _copy(metered, where / "priced.duckdb")
    with connect(db) as con:
        price_period(con, load_cost_model(dearer), START, END, slice_hours=168)
    return db


def _copy(src: Path, dst: Path) -> Path:
    shutil.copy(src, dst)
    return dst


def _at_fourth_slice(monkeypatch: pytest.MonkeyPatch, act: Callable[[Any], None]) -> None:
    """`act(con)` as pricing records its fourth slice's priced hours (slices 2 and 3 are
    committed by then where the period is priced in place)."""
    calls: list[int] = []

    def record(con: Any, *args: Any, **kw: Any) -> None:
        calls.append(1)
        if len(calls) == _STOP_AT:
            act(con)
        _RECORD(con, *args, **kw)

    monkeypatch.setattr(pricedhours, "record", record)


def _price(db: Path, slice_hours: int) -> PricingResult:
    with connect(db) as con:
        return price_period(con, load_cost_model(None), START, END, slice_hours=slice_hours)


def test_hours_never_priced_are_committed_slice_by_slice_with_the_rows_of_one_transaction(
        metered: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[int, list[Any], int]] = []

    def look(con: Any) -> None:  # what another connection sees: what is committed
        other = con.cursor()
        aside = other.execute("SELECT count(*) FROM information_schema.tables WHERE "
                              "table_name = 'aside_charges'").fetchall()[0][0]
        seen.append((other.execute("SELECT count(*) FROM charges").fetchall()[0][0],
                     other.execute("SELECT written FROM unfinished_hours").fetchall(),
                     other.execute("SELECT count(*) FROM aside_charges").fetchall()[0][0]
                     if aside else -1))

    _at_fourth_slice(monkeypatch, look)
    in_place = _price(_copy(metered, tmp_path / "a.duckdb"), 12)
    charges, notes, aside = seen[0]
    assert charges > 0 and notes == [("charges",)]  # slices committed, the period noted
    assert aside == -1  # nothing to set aside
    assert _notes(tmp_path / "a.duckdb") == []
    # One slice: one transaction, as before.
    monkeypatch.undo()
    whole = _price(_copy(metered, tmp_path / "b.duckdb"), 168)
    assert in_place == whole
    assert _rows(tmp_path / "a.duckdb", PRICED) == _rows(tmp_path / "b.duckdb", PRICED)
    # Priced again, the hours hold charges. In no more than ONE_TRANSACTION_SLICES slices:
    # one transaction (mid-run, another connection still sees every old row, and no note).
    total = len(_rows(tmp_path / "a.duckdb", ("charges",))["charges"])
    seen.clear()
    _at_fourth_slice(monkeypatch, look)
    assert _price(tmp_path / "a.duckdb", 12) == whole
    assert seen == [(total, [], -1)]
    # In more: set aside (mid-run, every old row is kept aside and the hours are noted as
    # re-priced), committed slice by slice; the same rows.
    monkeypatch.setattr(pricing, "ONE_TRANSACTION_SLICES", 5)
    seen.clear()
    _at_fourth_slice(monkeypatch, look)
    again = _price(tmp_path / "a.duckdb", 12)
    assert seen[0][1:] == ([("repriced",)], total) and seen[0][0] > 0
    assert again == whole
    assert _rows(tmp_path / "a.duckdb", PRICED) == _rows(tmp_path / "b.duckdb", PRICED)
    assert _notes(tmp_path / "a.duckdb") == [] and _aside_tables(tmp_path / "a.duckdb") == []


@pytest.mark.parametrize("before", ["never priced", "priced"])
@pytest.mark.parametrize("stop", ["error", "ctrl-c"])
def test_a_stopped_pricing_leaves_the_hours_as_they_were(
        metered: Path, priced_before: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str], stop: str, before: str) -> None:
    db = _copy(priced_before if before == "priced" else metered, tmp_path / "ledger.duckdb")
    facts, old = _rows(db, FACTS), _rows(db, dict.fromkeys(PRICED, "*"))
    monkeypatch.setattr(pricing, "SLICE_LADDER", (12,))
    monkeypatch.setattr(pricing, "ONE_TRANSACTION_SLICES", 1)  # a re-price sets rows aside

    def stopped(con: Any) -> None:
        if stop == "ctrl-c":
            os.kill(os.getpid(), signal.SIGINT)
        raise RuntimeError("the disk went away")

    _at_fourth_slice(monkeypatch, stopped)
    capsys.readouterr()
    rc = meter_main(["--price-only", *SPAN, "--db", str(db), "-q"])
    err = capsys.readouterr().err
    assert rc == (130 if stop == "ctrl-c" else 1) and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1, err
    # Slices 2 and 3 taken out again; a re-price's old rows back, to the timestamp.
    assert _rows(db, dict.fromkeys(PRICED, "*")) == old
    assert _notes(db) == [] and _aside_tables(db) == [] and _rows(db, FACTS) == facts
    monkeypatch.setattr(pricedhours, "record", _RECORD)
    assert meter_main(["--price-only", *SPAN, "--db", str(db), "-q"]) == 0
    whole = _copy(metered, tmp_path / "whole.duckdb")
    _price(whole, 168)
    assert _rows(db, PRICED) == _rows(whole, PRICED)
    assert before == "never priced" or _rows(db, PRICED) != _rows(priced_before, PRICED)


_KILLED_AT_FOURTH_SLICE = """
import os, sys
from metering import pricedhours, pricing
from metering.cli_meter import main
pricing.SLICE_LADDER = (12,)
pricing.ONE_TRANSACTION_SLICES = 1  # a re-price sets rows aside
real, calls = pricedhours.record, []
def record(*args, **kw):
    calls.append(1)
    if len(calls) == 4:
        os._exit(9)  # as a kill -9 would: nothing after it runs
    real(*args, **kw)
pricedhours.record = record
sys.exit(main(sys.argv[1:]))
"""
_SPAN_SAID = "2026-10-04 00:00 .. 2026-10-07 00:00 UTC"


@pytest.mark.parametrize(("before", "written", "said"), [
    ("never priced", "charges", f"the charges of hours {_SPAN_SAID} that a stopped "
     "`gpu-ledger meter` run left half written: they are not priced now"),
    ("priced", "repriced", f"the new charges of hours {_SPAN_SAID} that a stopped "
     "`gpu-ledger meter` run left half written: they are priced as before the run (the "
     "charges it replaced are put back)")])
def test_hours_a_killed_pricing_left_half_priced_are_refused_and_put_back_on_open(
        metered: Path, priced_before: Path, tmp_path: Path, before: str, written: str,
        said: str) -> None:
    db = _copy(priced_before if before == "priced" else metered, tmp_path / "ledger.duckdb")
    facts, old = _rows(db, FACTS), _rows(db, dict.fromkeys(PRICED, "*"))
    command = ["--price-only", *SPAN, "--db", str(db)]
    run = subprocess.run([sys.executable, "-c", _KILLED_AT_FOURTH_SLICE, *command],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 9, run.stderr
    assert ("copying them aside" in run.stderr) is (before == "priced"), run.stderr
    assert _notes(db) == [(START, END, written)]
    assert _rows(db, ("charges",))["charges"] != old["charges"]  # slices 2-3 committed
    with pytest.raises(ledgerview.LedgerError) as refused:
        ledgerview.open_ledger(db)
    noun = "new charges" if before == "priced" else "charges"
    assert f"the {noun} of hours {_SPAN_SAID} are half written" in str(refused.value) \
        and "\n" not in str(refused.value)
    assert ("deletes them first (and puts back the charges they replace)" in str(
        refused.value)) is (before == "priced")
    told: list[str] = []
    connect(db, say=told.append).close()
    assert told == [f"gpu-ledger: {db}: deleted {said}, and the same `meter` command prices "
                    "them again"]
    assert _rows(db, dict.fromkeys(PRICED, "*")) == old
    assert _notes(db) == [] and _aside_tables(db) == [] and _rows(db, FACTS) == facts
    assert meter_main([*command, "-q"]) == 0
    whole = _copy(metered, tmp_path / "whole.duckdb")
    _price(whole, 168)
    assert _rows(db, PRICED) == _rows(whole, PRICED)


def test_a_ledger_noted_before_notes_said_what_they_hold_is_read_as_facts(
        metered: Path, tmp_path: Path) -> None:
    """A ledger of the version before `written` (every note was ingest's): a reader takes
    its notes as facts, and a writable open adds the column and clears them as facts."""
    db = _copy(metered, tmp_path / "old.duckdb")
    with connect(db) as con:
        con.execute("DROP TABLE unfinished_hours")
        con.execute("CREATE TABLE unfinished_hours (hour_start TIMESTAMP NOT NULL, "
                    "hour_end TIMESTAMP NOT NULL, clusters VARCHAR[])")
        con.execute("INSERT INTO unfinished_hours VALUES ('2026-10-06', '2026-10-07', NULL)")
    with pytest.raises(ledgerview.LedgerError) as refused:
        ledgerview.open_ledger(db)
    assert "the facts of hours 2026-10-06 00:00 .. 2026-10-07 00:00 UTC" in str(refused.value)
    said: list[str] = []
    connect(db, say=said.append).close()
    assert said and "deleted the facts of hours 2026-10-06 00:00" in said[0]
    held = _rows(db, ("device_hours",))["device_hours"]
    assert held and all(row[0] < datetime(2026, 10, 6) for row in held)
    assert _notes(db) == [] and unfinished.Written("facts") is unfinished.Written.FACTS


def test_a_note_this_version_cannot_read_is_one_line_not_a_guess(
        metered: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A damaged ledger (or a later version's) whose note says neither facts nor charges:
    nothing is deleted on a guess; readers and writers refuse it in one line."""
    db = _copy(metered, tmp_path / "damaged.duckdb")
    with connect(db) as con:
        con.execute("INSERT INTO unfinished_hours VALUES ('2026-10-06', '2026-10-07', NULL, "
                    "'budgets')")
    facts = _rows(db, FACTS)
    with pytest.raises(ledgerview.LedgerError) as refused:
        ledgerview.open_ledger(db)
    assert "unfinished_hours: a note of 'budgets', expected one of facts, charges, " \
        "repriced" in str(refused.value) and "\n" not in str(refused.value)
    capsys.readouterr()
    assert meter_main(["--price-only", *SPAN, "--db", str(db)]) == 4
    err = capsys.readouterr().err
    assert "cannot delete the hours a stopped run left half written: table unfinished_hours: "\
        "a note of 'budgets'" in err and len(err.strip().splitlines()) == 1, err
    assert _rows(db, FACTS) == facts
