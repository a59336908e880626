"""Hours a chunk writes straight into the fact tables, node group by node group.

A chunk in node groups commits each group on its own, so that memory holds one group's facts
rather than the chunk's (metering/facts.py). Where the ledger already holds facts for the
chunk's hours, the groups are staged apart and swapped in at the end, so that a run stopped
between groups leaves the old facts in place. Where it holds none (a month metered for the
first time, a backfill), there is nothing to keep: the groups go straight into the fact
tables, which saves copying every row a second time (docs/performance.md, "Fresh hours
written in place"), and the hours are noted in `unfinished_hours` for as long as they hold
part of their facts. The note is written and committed before the first group, and dropped
in the chunk's last transaction, with its coverage rows.

So a run stopped between groups leaves hours that held nothing before and now hold some of
their facts, and the note saying so. Nothing reads them: every writable open of the ledger
(metering.db.connect) deletes them first, which puts the hours back as they were (not
metered, as before the run), and a reader of the ledger (metering.ledgerview) refuses it
until then with one line. A run that fails or is interrupted deletes them itself.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any, Final

import duckdb

TABLE: Final = "unfinished_hours"
# The tables ingest writes per hour and cluster: what a chunk's hours are.
FACT_TABLES: Final = ("device_hours", "mig_hours", "allocation_hours", "workload_hours",
                      "grant_hours", "coverage")


def _where(clusters: Sequence[str] | None) -> str:
    return "hour >= $s AND hour < $e" + (
        "" if clusters is None else " AND list_contains($c, cluster)")


def _params(start: datetime, end: datetime,
            clusters: Sequence[str] | None) -> dict[str, Any]:
    params: dict[str, Any] = {"s": start, "e": end}
    if clusters is not None:
        params["c"] = sorted(clusters)
    return params


def fresh(con: Any, start: datetime, end: datetime, clusters: Sequence[str] | None) -> bool:
    """Whether the ledger holds no fact nor coverage row for hours [start, end) of these
    clusters (None: of any cluster, for a chunk whose clusters come from a label)."""
    where, params = _where(clusters), _params(start, end, clusters)
    return not any(con.execute(f"SELECT 1 FROM {table} WHERE {where} LIMIT 1",
                               params).fetchall() for table in FACT_TABLES)


def begin(con: Any, start: datetime, end: datetime, clusters: Sequence[str] | None) -> None:
    """Note that hours [start, end) of these clusters (None: any) are being written in
    place; the caller commits it before the first group."""
    con.execute(f"INSERT INTO {TABLE} VALUES ($s, $e, $c)",
                {"s": start, "e": end, "c": None if clusters is None else sorted(clusters)})


def done(con: Any, start: datetime, end: datetime) -> None:
    """The hours are written whole: drop their note in the chunk's last transaction."""
    con.execute(f"DELETE FROM {TABLE} WHERE hour_start = $s AND hour_end = $e",
                {"s": start, "e": end})


def pending(con: Any, catalog: str | None = None) -> list[tuple[datetime, datetime]]:
    """The noted hour ranges, oldest first; none where the ledger predates the note's table.
    `catalog`: an attached ledger's alias (a reader's), else the connection's own."""
    where = "current_database()" if catalog is None else "$cat"
    params = {} if catalog is None else {"cat": catalog}
    if not con.execute("SELECT count(*) FROM information_schema.tables WHERE table_catalog = "
                       f"{where} AND table_schema = 'main' AND table_name = '{TABLE}'",
                       params).fetchall()[0][0]:
        return []
    table = TABLE if catalog is None else f"{catalog}.main.{TABLE}"
    return [(s, e) for s, e in con.execute(
        f"SELECT hour_start, hour_end FROM {table} ORDER BY ALL").fetchall()]


def clear(con: Any) -> list[tuple[datetime, datetime]]:
    """Delete what the noted hours hold, and the notes, in the caller's transaction; returns
    the hour ranges cleared. The hours held nothing before they were noted (`fresh`), so this
    is the ledger as it was."""
    rows = con.execute(f"SELECT hour_start, hour_end, clusters FROM {TABLE} ORDER BY ALL"
                       ).fetchall()
    for start, stop, clusters in rows:
        names = None if clusters is None else [str(c) for c in clusters]
        for table in FACT_TABLES:
            con.execute(f"DELETE FROM {table} WHERE {_where(names)}",
                        _params(start, stop, names))
    con.execute(f"DELETE FROM {TABLE}")
    return [(s, e) for s, e, _ in rows]


def recover(con: Any) -> list[tuple[datetime, datetime]]:
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
    """Around a chunk's transaction: where it fails (an error, Ctrl-C) after groups were
    committed in place, delete them before the error goes on. If this fails too (a second
    Ctrl-C, the process killed), the next open of the ledger does it."""
    try:
        yield
    except BaseException:
        with contextlib.suppress(duckdb.Error, KeyboardInterrupt):
            recover(con)
        raise


def describe(ranges: Sequence[tuple[datetime, datetime]]) -> str:
    """The noted hours in a few words, for a reader's refusal."""
    shown = ", ".join(f"{s:%Y-%m-%d %H:%M} .. {e:%Y-%m-%d %H:%M}" for s, e in ranges[:3])
    return shown + (f" and {len(ranges) - 3} more" if len(ranges) > 3 else "") + " UTC"
