"""The waste device-hours pricing stores (metering/wastehours.py): they are what the query
gives from the facts and charges as they are now, after re-pricing, re-metering, a closed
month's adjustments and a merge; the report reads them, computes the days without them (and
says so), and is the same file for file either way; a ledger of before opens and gains them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb
import pytest
from test_waste import A100, H100, MONTH, T0, Holder, _facts

from metering import pricedhours, wastehours
from metering.closes import Freeze, close
from metering.db import connect
from metering.export import merge_ledgers
from metering.facts import delete_hours
from metering.period import Period
from metering.pricing import price_period
from metering.report.builder import make_report, render
from metering.report.cli import main as report_main
from metering.report.waste import mig_fraction, recommend

FLEET = [
    Holder("infer-1", "GPU-1", H100, 200, mem_gb=8.0, owner=("Deployment", "infer"),
           peaks={5: 9.0, 30: 0.0, 31: 0.0}),
    Holder("train-1", "GPU-2", A100, 150, mem_gb=60.0, sm=0.9, owner=("Job", "train"), first=20),
    Holder("mig-1", "GPU-3", H100, 120, mem_gb=4.0, mig=("3g.40gb", 3, 0.05),
           owner=("Deployment", "small")),
    Holder("idle-1", "GPU-4", A100, 100, mem_gb=0.0, sm=0.0, owner=("StatefulSet", "idle")),
    Holder("far-1", "GPU-5", H100, 180, mem_gb=10.0, owner=("Deployment", "far"),
           cluster="east", first=300),
]
FORMATS = ["csv", "parquet", "md", "html"]


def _computed(con: Any, start: datetime, end: datetime) -> set[tuple[Any, ...]]:
    """The query's rows of [start, end) computed from the facts now (no duplicates: a row is
    one workload's hour of one device)."""
    rows = con.execute(wastehours.query(), {"start": start, "end": end}).fetchall()
    assert len(rows) == len(set(rows))
    return set(rows)


def _stored(con: Any, start: datetime, end: datetime) -> set[tuple[Any, ...]]:
    rows = con.execute(f"SELECT * FROM {wastehours.ROWS} WHERE hour >= ? AND hour < ?",
                       [start, end]).fetchall()
    assert len(rows) == len(set(rows))
    return set(rows)


def _forget_all(con: Any) -> None:
    for table in wastehours.TABLES:
        con.execute(f"DELETE FROM {table}")


def _files(db: Path, note: list[str] | None = None, cluster: str | None = None
           ) -> dict[str, bytes]:
    report = make_report(str(db), MONTH, None, 20, settings=None, cluster=cluster,
                          note=None if note is None else note.append)
    return render(report, FORMATS)


def _parquet_rows(data: bytes, tmp: Path) -> list[tuple[Any, ...]]:
    path = tmp / "x.parquet"
    path.write_bytes(data)
    return duckdb.sql(f"SELECT * FROM read_parquet('{path}')").fetchall()


def _same_files(a: dict[str, bytes], b: dict[str, bytes], tmp: Path) -> None:
    assert sorted(a) == sorted(b)
    for name in a:
        if name.endswith(".parquet"):  # by content: the writer's metadata is not the report
            assert _parquet_rows(a[name], tmp) == _parquet_rows(b[name], tmp), name
        else:
            assert a[name] == b[name], name


def test_pricing_stores_what_the_query_gives_and_the_report_is_the_same(tmp_path: Path
                                                                         ) -> None:
    db = tmp_path / "m.duckdb"
    con, cm = _facts(db, FLEET)
    try:
        stored = _stored(con, MONTH.start, MONTH.end)
        assert stored and stored == _computed(con, MONTH.start, MONTH.end)
        assert {r[0] for r in stored} == {"default", "east"}
        # every priced hour x cluster is marked, rows or none
        assert con.execute(f"SELECT count(*) FROM {wastehours.STORED}").fetchone() == (
            2 * 31 * 24,)
        recs = recommend(con, MONTH.start, MONTH.end, mig_fraction(cm))
        assert wastehours.plan(con, MONTH.start, MONTH.end).computed == ()
    finally:
        con.close()
    said: list[str] = []
    new = _files(db, said)
    assert said == []  # every day stored: nothing to say
    east = _files(db, cluster="east")
    with connect(db) as con:
        _forget_all(con)  # a ledger priced before the rows were stored
        assert recommend(con, MONTH.start, MONTH.end, mig_fraction(cm)) == recs
        # the days with facts are computed; the others have nothing to compute
        held = con.execute("SELECT count(DISTINCT date_trunc('day', hour)) FROM "
                           "allocation_hours").fetchone()[0]
        assert 10 < held < 31
        assert len(wastehours.plan(con, MONTH.start, MONTH.end).computed) == held
    old = _files(db, said)
    assert said == [f"waste: {held} of 31 day(s) computed from the facts (from 2026-10-01 00:00 "
                    "UTC), no stored device-hours: priced before they were stored, or "
                    "re-metered and not priced again; pricing them again stores them"]
    assert recs and any(r.kind.name == "IDLE" for r in recs)
    _same_files(new, old, tmp_path)
    _same_files(east, _files(db, cluster="east"), tmp_path)


def test_re_metered_hours_are_computed_until_priced_again(tmp_path: Path) -> None:
    db = tmp_path / "m.duckdb"
    con, cm = _facts(db, FLEET)
    try:
        first = recommend(con, MONTH.start, MONTH.end, mig_fraction(cm))
        day = T0 + timedelta(days=3)
        # ingest rewrites a day of cluster default (delete_hours), its facts now differ:
        # peak memory of infer-1 doubled
        kept = con.execute("SELECT * FROM workload_hours WHERE hour >= ? AND hour < ?",
                           [day, day + timedelta(days=1)]).fetchall()
        alloc = con.execute("SELECT * FROM allocation_hours WHERE hour >= ? AND hour < ? AND "
                            "cluster = 'default'", [day, day + timedelta(days=1)]).fetchall()
        dev = con.execute("SELECT * FROM device_hours WHERE hour >= ? AND hour < ? AND "
                          "cluster = 'default'", [day, day + timedelta(days=1)]).fetchall()
        was = delete_hours(con, day, day + timedelta(days=1), ["default"])
        for table, rows in (("allocation_hours", alloc), ("device_hours", dev)):
            for r in rows:
                con.execute(f"INSERT INTO {table} VALUES ({', '.join('?' * len(r))})", list(r))
        for r in kept:
            r = list(r)
            r[8] = None if r[8] is None else r[8] * 2
            con.execute(f"INSERT INTO workload_hours VALUES ({', '.join('?' * len(r))})", r)
        assert pricedhours.settle(con, day, day + timedelta(days=1), ["default"], was) == 0
        p = wastehours.plan(con, MONTH.start, MONTH.end)
        assert p.computed == ((day, day + timedelta(days=1)),)  # east's rows stay stored
        assert _stored(con, day, day + timedelta(days=1)) == {
            r for r in _computed(con, day, day + timedelta(days=1)) if r[0] == "east"}
        said: list[str] = []
        mixed = recommend(con, MONTH.start, MONTH.end, mig_fraction(cm), note=said.append)
        assert said and said[0].startswith("waste: 1 of 31 day(s) computed from the facts "
                                           "(from 2026-10-04 00:00 UTC)")
        # priced again: stored again, from the new facts
        price_period(con, cm, day, day + timedelta(days=1))
        assert wastehours.plan(con, MONTH.start, MONTH.end).computed == ()
        # 30 days read in place and one computed gave what 31 stored days give
        assert mixed and recommend(con, MONTH.start, MONTH.end, mig_fraction(cm)) == mixed
        assert mixed != first  # the new facts' figures, not those stored before
        assert _stored(con, MONTH.start, MONTH.end) == _computed(con, MONTH.start, MONTH.end)
        # re-pricing one cluster replaces that cluster's rows only
        before = _stored(con, MONTH.start, MONTH.end)
        price_period(con, cm, MONTH.start, MONTH.end, clusters=["east"])
        assert _stored(con, MONTH.start, MONTH.end) == before
    finally:
        con.close()


def test_hours_an_earlier_version_re_metered_are_computed(tmp_path: Path) -> None:
    """An earlier version's ingest (an image rolled back) rewrites a day's facts and coverage
    but not the stored rows: the coverage's ingest time, later than the rows', has the day
    computed from the new facts, not read from the stale rows."""
    db = tmp_path / "m.duckdb"
    con, cm = _facts(db, FLEET)
    try:
        day = T0 + timedelta(days=3)
        span = [day, day + timedelta(days=1)]
        stale = _stored(con, *span)
        # Priced an hour ago; then what that version did half an hour ago: facts and coverage
        # rewritten, the waste tables untouched.
        con.execute(f"UPDATE {wastehours.STORED} SET stored_at = stored_at - INTERVAL 1 HOUR")
        con.execute("UPDATE workload_hours SET memory_max_bytes = memory_max_bytes * 2 "
                    "WHERE hour >= ? AND hour < ? AND cluster = 'default'", span)
        con.execute("UPDATE coverage SET ingested_at = (SELECT max(stored_at) FROM "
                    f"{wastehours.STORED}) + INTERVAL 30 MINUTE WHERE hour >= ? AND hour < ? "
                    "AND cluster = 'default'", span)
        fresh = _computed(con, *span)
        assert fresh != stale  # the rows the stale ones would have hidden
        assert wastehours.plan(con, MONTH.start, MONTH.end).computed == (tuple(span),)
        said: list[str] = []
        recs = recommend(con, MONTH.start, MONTH.end, mig_fraction(cm), note=said.append)
        assert said and said[0].startswith("waste: 1 of 31 day(s) computed from the facts "
                                           "(from 2026-10-04 00:00 UTC)")
        # the same recommendations as from rows stored from the new facts
        price_period(con, cm, span[0], span[1])
        assert wastehours.plan(con, MONTH.start, MONTH.end).computed == ()
        assert _stored(con, *span) == fresh
        assert recommend(con, MONTH.start, MONTH.end, mig_fraction(cm)) == recs
    finally:
        con.close()


def test_a_closed_months_stored_hours_keep_its_closed_charges(tmp_path: Path) -> None:
    """Re-metering a closed month with adjustments: the facts are new, the charges the
    closed ones; the stored rows are what the report would compute from both."""
    db = tmp_path / "m.duckdb"
    con, cm = _facts(db, FLEET)
    try:
        close(con, MONTH, datetime(2026, 11, 2, tzinfo=UTC))
        day = T0 + timedelta(days=2)
        end = day + timedelta(days=1)
        for table in ("allocation_hours", "workload_hours", "device_hours", "coverage"):
            con.execute(f"CREATE TEMP TABLE _kept_{table} AS SELECT * FROM {table}")
        delete_hours(con, day, end, ["default"])  # the day's facts again, minus a holder
        _facts_again(con, day, end)
        closed_charges = con.execute("SELECT sum(cost) FROM charges WHERE hour >= ? AND "
                                     "hour < ?", [day, end]).fetchone()
        freeze = Freeze.of(con, Period(day.replace(tzinfo=UTC), end.replace(tzinfo=UTC)))
        assert freeze is not None
        price_period(con, cm, day, end, freeze=freeze)
        assert con.execute("SELECT sum(cost) FROM charges WHERE hour >= ? AND hour < ?",
                           [day, end]).fetchone() == closed_charges
        assert con.execute("SELECT count(*) FROM adjustments").fetchone() != (0,)
        assert wastehours.plan(con, MONTH.start, MONTH.end).computed == ()
        assert _stored(con, MONTH.start, MONTH.end) == _computed(con, MONTH.start, MONTH.end)
    finally:
        con.close()


def _facts_again(con: Any, day: datetime, end: datetime) -> None:
    """Cluster default's facts of [day, end) from a copy kept before: all but mig-1's."""
    for table in ("allocation_hours", "workload_hours", "device_hours"):
        where = "hour >= ? AND hour < ? AND cluster = 'default'"
        con.execute(f"INSERT INTO {table} SELECT * FROM _kept_{table} WHERE {where} AND "
                    "uuid <> 'GPU-3'", [day, end])
    con.execute("INSERT INTO coverage SELECT * FROM _kept_coverage WHERE hour >= ? AND hour < ? "
                "AND cluster = 'default'", [day, end])


def test_a_ledger_of_before_is_upgraded_and_reported_the_same(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "m.duckdb"
    con, cm = _facts(db, FLEET)
    for table in wastehours.TABLES:  # as an earlier version left it
        con.execute(f"DROP TABLE {table}")
    con.close()
    out_old, out_new = tmp_path / "old", tmp_path / "new"
    assert report_main(["--month", str(MONTH), "--db", str(db), "--out", str(out_old)]) == 0
    err = capsys.readouterr().err
    assert "gpu-ledger report: waste: 17 of 31 day(s) computed from the facts" in err
    with duckdb.connect(str(db), read_only=True) as raw:  # the report did not write
        assert raw.execute("SELECT count(*) FROM information_schema.tables WHERE table_name "
                           "LIKE 'waste_hours%'").fetchone() == (0,)
    with connect(db) as con:  # opened for writing: upgraded, empty until priced again
        assert con.execute(f"SELECT count(*) FROM {wastehours.ROWS}").fetchone() == (0,)
        price_period(con, cm, MONTH.start, MONTH.end)
    assert report_main(["--month", str(MONTH), "--db", str(db), "--out", str(out_new)]) == 0
    assert "computed from the facts" not in capsys.readouterr().err
    old = {p.name: p.read_bytes() for p in out_old.iterdir()}
    new = {p.name: p.read_bytes() for p in out_new.iterdir()}
    _same_files(old, new, tmp_path)


def test_a_merge_forgets_the_targets_rows_of_what_it_replaces(tmp_path: Path) -> None:
    src = tmp_path / "src" / "m.duckdb"
    con, _ = _facts(src, FLEET[4:])  # cluster east only
    for table in ("coverage", "charges", "energy_hours"):  # _facts covers 'default' too
        con.execute(f"DELETE FROM {table} WHERE cluster = 'default'")
    con.close()
    target = tmp_path / "dst" / "t.duckdb"
    con, _ = _facts(target, FLEET)
    try:
        assert _stored(con, MONTH.start, MONTH.end)
    finally:
        con.close()
    merge_ledgers(target, [src], replace=True)
    with connect(target) as con:
        p = wastehours.plan(con, MONTH.start, MONTH.end)
        east_days = {T0 + timedelta(days=d) for d in range(300 // 24, 480 // 24)}  # far-1's
        assert {lo for lo, _ in p.computed} == east_days
        assert {r[0] for r in _stored(con, MONTH.start, MONTH.end)} == {"default"}
