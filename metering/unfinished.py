"""Hours a run writes straight into the ledger's tables, committing as it goes.

Two runs commit part of their hours' rows before the whole is written, to bound memory:
- ingest: a chunk in node groups commits each group on its own, so that memory holds one
  group's facts rather than the chunk's (metering/facts.py);
- pricing: a period priced slice by slice commits each slice, so that DuckDB does not keep
  every slice's work tables until the end (metering/pricing.py).

Where the ledger holds no rows for those hours (a month metered or priced for the first time,
a backfill), there is nothing to keep: the rows go straight into the tables (docs/
performance.md, "Fresh hours written in place" and "A new period's slices committed one by
one"). Where it holds facts, ingest stages the new ones apart and swaps them in at the end
(metering/facts.py). Where it holds charges, pricing first sets the old rows aside, in tables
`aside_<table>` (`Written.REPRICED`), and then replaces them slice by slice. Either way the
hours are noted in `unfinished_hours`, with what they hold part of (`Written`), for as long
as they do: the note (and what is set aside) is committed before the first group or slice,
and dropped in the run's last transaction.

So a run stopped part way leaves hours that hold part of their new rows, and the note saying
so. Nothing reads them: every writable open of the ledger (metering.db.connect) deletes them
first and puts back what was set aside, which leaves the hours as they were before the run
(not metered, not priced, or priced as before), and a reader of the ledger
(metering.ledgerview) refuses it until then with one line. A run that fails or is
interrupted does this itself.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from enum import StrEnum
from typing import Any, Final, NamedTuple

import duckdb

from metering import pricedhours, wastehours

TABLE: Final = "unfinished_hours"
# The tables ingest writes per hour and cluster: what a chunk's hours are.
FACT_TABLES: Final = ("device_hours", "mig_hours", "allocation_hours", "workload_hours",
                      "grant_hours", "coverage")
# The tables pricing writes per hour and cluster: what a priced hour is.
PRICED_TABLES: Final = ("charges", "energy_hours", *wastehours.TABLES, pricedhours.TABLE)


class Written(StrEnum):
    """What a noted hour range holds part of; its tables are what a recovery deletes."""

    FACTS = "facts"  # ingest's node groups, into hours that held no facts
    CHARGES = "charges"  # pricing's slices, into hours that held no charges
    REPRICED = "repriced"  # pricing's slices, into hours whose old rows are set aside

    @property
    def tables(self) -> tuple[str, ...]:
        return FACT_TABLES if self is Written.FACTS else PRICED_TABLES

    @property
    def set_aside(self) -> bool:
        """Whether the hours' old rows are kept in `aside_<table>` until the run is done."""
        return self is Written.REPRICED

    @property
    def noun(self) -> str:
        return "new charges" if self is Written.REPRICED else str(self)

    @property
    def undone(self) -> str:
        """What the hours are once a recovery has deleted what the note says."""
        return {Written.FACTS: "not metered now", Written.CHARGES: "not priced now",
                Written.REPRICED: "priced as before the run (the charges it replaced are "
                                  "put back)"}[self]

    @property
    def verb(self) -> str:
        """What the same `meter` command does to the hours again."""
        return "meters" if self is Written.FACTS else "prices"


def aside(table: str) -> str:
    """The table that keeps `table`'s old rows of a re-priced period until the run is done."""
    return f"aside_{table}"


class Note(NamedTuple):
    start: datetime
    end: datetime
    written: Written


class DamagedNote(ValueError):
    """A note whose `written` is not one this version knows: the ledger is damaged (or from
    a later version), and what its hours hold cannot be told."""


def _written(value: object) -> Written:
    try:
        return Written(str(value))
    except ValueError:
        raise DamagedNote(f"table {TABLE}: a note of {value!r}, expected one of "
                          f"{', '.join(Written)}") from None


def _where(clusters: Sequence[str] | None) -> str:
    return "hour >= $s AND hour < $e" + (
        "" if clusters is None else " AND list_contains($c, cluster)")


def _params(start: datetime, end: datetime,
            clusters: Sequence[str] | None) -> dict[str, Any]:
    params: dict[str, Any] = {"s": start, "e": end}
    if clusters is not None:
        params["c"] = sorted(clusters)
    return params


def fresh(con: Any, start: datetime, end: datetime, clusters: Sequence[str] | None,
          written: Written = Written.FACTS) -> bool:
    """Whether the ledger holds no row of `written`'s tables (facts and coverage; or charges,
    energy, waste and priced-hour rows) for hours [start, end) of these clusters (None: of any
    cluster, for a chunk whose clusters come from a label)."""
    where, params = _where(clusters), _params(start, end, clusters)
    return not any(con.execute(f"SELECT 1 FROM {table} WHERE {where} LIMIT 1",
                               params).fetchall() for table in written.tables)


def begin(con: Any, start: datetime, end: datetime, clusters: Sequence[str] | None,
          written: Written = Written.FACTS) -> None:
    """Note that hours [start, end) of these clusters (None: any) are being written in
    place, and set aside their rows where `written` says so; the caller commits it before the
    first group or slice."""
    if written.set_aside:
        for table in written.tables:
            con.execute(f"CREATE TABLE {aside(table)} AS SELECT * FROM {table} WHERE "
                        f"{_where(clusters)}", _params(start, end, clusters))
    con.execute(f"INSERT INTO {TABLE} (hour_start, hour_end, clusters, written) "
                "VALUES ($s, $e, $c, $w)",
                {"s": start, "e": end, "c": None if clusters is None else sorted(clusters),
                 "w": str(written)})


def done(con: Any, start: datetime, end: datetime, written: Written = Written.FACTS) -> None:
    """The hours are written whole: drop their note (and what was set aside) in the run's
    last transaction."""
    con.execute(f"DELETE FROM {TABLE} WHERE hour_start = $s AND hour_end = $e AND written = $w",
                {"s": start, "e": end, "w": str(written)})
    if written.set_aside:
        for table in written.tables:
            con.execute(f"DROP TABLE {aside(table)}")


def pending(con: Any, catalog: str | None = None) -> list[Note]:
    """The notes, oldest first; none where the ledger predates the note's table. A ledger
    whose table predates `written` (not migrated: a reader's) noted facts only. `catalog`: an
    attached ledger's alias (a reader's), else the connection's own."""
    where = "current_database()" if catalog is None else "$cat"
    params = {} if catalog is None else {"cat": catalog}
    columns = {str(c) for (c,) in con.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_catalog = "
        f"{where} AND table_schema = 'main' AND table_name = '{TABLE}'", params).fetchall()}
    if not columns:
        return []
    table = TABLE if catalog is None else f"{catalog}.main.{TABLE}"
    written = "written" if "written" in columns else f"'{Written.FACTS}'"
    return [Note(s, e, _written(w)) for s, e, w in con.execute(
        f"SELECT hour_start, hour_end, {written} FROM {table} ORDER BY ALL").fetchall()]


def clear(con: Any) -> list[Note]:
    """Delete what the noted hours hold, put back what was set aside, and drop the notes, in
    the caller's transaction; returns the notes cleared. The hours held none of it before
    they were noted (`fresh`), or what was set aside, so this is the ledger as it was."""
    rows = con.execute(f"SELECT hour_start, hour_end, clusters, written FROM {TABLE} "
                       "ORDER BY ALL").fetchall()
    notes = [Note(s, e, _written(w)) for s, e, _, w in rows]  # all known before a delete
    for (start, stop, clusters, _), note in zip(rows, notes, strict=True):
        names = None if clusters is None else [str(c) for c in clusters]
        for table in note.written.tables:
            con.execute(f"DELETE FROM {table} WHERE {_where(names)}",
                        _params(start, stop, names))
            if note.written.set_aside:
                con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM {aside(table)}")
                con.execute(f"DROP TABLE {aside(table)}")
    con.execute(f"DELETE FROM {TABLE}")
    return notes


def recover(con: Any) -> list[Note]:
    """`clear` in a transaction of its own, where anything is noted (a writable open, a run's
    failed chunk)."""
    if not pending(con):
        return []
    con.execute("BEGIN TRANSACTION")
    try:
        cleared = clear(con)
    except BaseException:
        with contextlib.suppress(duckdb.Error):
            con.execute("ROLLBACK")
        raise
    con.execute("COMMIT")
    return cleared


@contextmanager
def recovered_on_error(con: Any) -> Iterator[None]:
    """Around a chunk's transaction (or a period's pricing): where it fails (an error,
    Ctrl-C) after groups or slices were committed in place, delete them before the error goes
    on. If this fails too (a second Ctrl-C, the process killed), the next open of the ledger
    does it."""
    try:
        yield
    except BaseException:
        with contextlib.suppress(duckdb.Error, KeyboardInterrupt):
            recover(con)
        raise


def describe(notes: Sequence[Note]) -> str:
    """What the noted hours hold part of, in a few words: "the facts of hours A .. B UTC",
    "; the charges of hours ...", "; the new charges of hours ..." (for a reader's refusal, a
    recovery's line)."""
    parts = []
    for written in Written:
        ranges = [n for n in notes if n.written is written]
        if ranges:
            shown = ", ".join(f"{s:%Y-%m-%d %H:%M} .. {e:%Y-%m-%d %H:%M}"
                              for s, e, _ in ranges[:3])
            more = f" and {len(ranges) - 3} more" if len(ranges) > 3 else ""
            parts.append(f"the {written.noun} of hours {shown}{more} UTC")
    return "; ".join(parts)
