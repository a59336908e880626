"""The waste recommendations' device-hours, stored per hour and cluster by pricing.

The month-end report's largest cost was joining a month of allocation-, device-, workload-
and MIG-hours with the month's charges and energy (waste.sql `device_hours`) to size each
workload's device-hours. Every row of that query is one hour of one cluster, so pricing,
which rewrites an hour's charges, computes the hour's rows there and then and keeps them in
`waste_hours` (schema.sql); the report reads them and computes only the hours with no stored
rows (a ledger priced before this version, facts re-metered and not priced again).

Who keeps them true: pricing replaces the rows of the hours x clusters it prices, in its
transaction, after closed hours' charges are restored (metering/closes.py); rewriting facts
that come out different (metering/pricedhours.py `settle`, after metering/facts.py
`delete_hours`) and merging a cluster-month (metering/export.py) delete them. A stored hour is
therefore what the query gives from the facts and charges as they are.

How pricing computes them: from its own work tables, which already joined each allocation fact
with its device and MIG facts and hold its team, cost and energy (pricing.sql `waste_rows`;
the same rows: tests/test_waste_from_pricing.py), else (a closed month's charges restored
over the priced ones, a holder key seen twice) with the query (`compute`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

from metering import sqlfile

ROWS: Final = "waste_hours"  # the query's rows
STORED: Final = "waste_hours_stored"  # the hours x clusters whose rows are stored
TABLES: Final = (ROWS, STORED)
# Hours per statement: a day's rows bound the joins' working set whatever the period's size.
SLICE_HOURS: Final = 24


def query() -> str:
    """waste.sql `device_hours` for [$start, $end), every cluster, without its `;`."""
    return sqlfile.load("waste.sql").query("device_hours").rstrip().rstrip(";")


def slices(start: datetime, end: datetime) -> Iterator[tuple[datetime, datetime]]:
    """[start, end) in SLICE_HOURS pieces from start."""
    lo = start
    while lo < end:
        hi = min(end, lo + timedelta(hours=SLICE_HOURS))
        yield lo, hi
        lo = hi


def store(con: Any, start: datetime, end: datetime, clusters: Iterable[str],
          now: datetime) -> int:
    """Replace the stored rows of hours [start, end) (naive UTC) of `clusters` with what the
    query gives now; inside the caller's transaction. Returns the rows stored."""
    names = list(clusters)
    forget(con, start, end, names)
    n = sum(compute(con, lo, hi, cluster) for cluster in names for lo, hi in slices(start, end))
    mark(con, start, end, names, now)
    return n


def compute(con: Any, start: datetime, end: datetime, cluster: str) -> int:
    """Insert the query's rows of [start, end) of `cluster` (none stored there). Pricing
    inserts the same rows from its work tables (pricing.sql `waste_rows`) where it can."""
    # One cluster's rows: the query joins and groups by cluster, so they are the same rows as
    # the fleet's query gives for it.
    row = con.execute(f"INSERT INTO {ROWS} SELECT * FROM ({query()}) WHERE cluster = $c",
                      {"start": start, "end": end, "c": cluster}).fetchone()
    return int(row[0]) if row else 0


def mark(con: Any, start: datetime, end: datetime, clusters: Iterable[str],
         now: datetime) -> None:
    """Record every hour of [start, end) x `clusters` as stored (their rows, or none, are)."""
    for cluster in clusters:
        con.execute(f"INSERT INTO {STORED} SELECT unnest(generate_series($s, $e - INTERVAL 1 "
                    "HOUR, INTERVAL 1 HOUR)), $c, $now",
                    {"s": start, "e": end, "c": cluster, "now": now})


def forget(con: Any, start: datetime, end: datetime, clusters: Iterable[str]) -> None:
    """Delete the stored rows of hours [start, end) of `clusters` (their facts change)."""
    _delete(con, "hour >= $s AND hour < $e AND list_contains($c, cluster)",
            {"s": start, "e": end, "c": sorted(clusters)})


def _delete(con: Any, where: str, params: dict[str, Any]) -> None:
    for table in TABLES:
        con.execute(f"DELETE FROM {table} WHERE {where}", params)


@dataclass(frozen=True)
class Plan:
    """Which slices of a period the report reads from the stored rows."""

    stored: tuple[tuple[datetime, datetime], ...]
    computed: tuple[tuple[datetime, datetime], ...]


def plan(con: Any, start: datetime, end: datetime) -> Plan:
    """A slice is read from the stored rows when every hour x cluster of it with allocation
    facts has them, stored no earlier than that hour's facts were ingested; otherwise it is
    computed from the facts, as a whole. (This version's ingest forgets the rows of what it
    rewrites; an earlier version's, e.g. after an image rollback, left them: their hours'
    coverage says they were ingested after the rows were stored.)"""
    missing = {r[0] for r in con.execute(
        f"SELECT DISTINCT hour FROM (SELECT hour, cluster FROM allocation_hours WHERE "
        f"hour >= $s AND hour < $e EXCEPT SELECT s.hour, s.cluster FROM {STORED} s "
        "LEFT JOIN coverage c ON c.hour = s.hour AND c.cluster = s.cluster "
        "WHERE s.hour >= $s AND s.hour < $e "
        "AND (c.ingested_at IS NULL OR s.stored_at >= c.ingested_at))",
        {"s": start, "e": end}).fetchall()}
    stored: list[tuple[datetime, datetime]] = []
    computed: list[tuple[datetime, datetime]] = []
    for lo, hi in slices(start, end):
        (computed if any(lo <= h < hi for h in missing) else stored).append((lo, hi))
    return Plan(tuple(stored), tuple(computed))


def expose(con: Any, view: str, start: datetime, end: datetime) -> Plan:
    """Make `view` (a temporary view) the query's rows of [start, end): the stored rows read
    in place where a slice has them, the other slices computed into the temporary table
    `computed_table(view)`. Copying a month of stored rows into a work table was most of the
    report's waste step (2,500 GPUs: 1.7M rows, ~4 of its ~5 CPU-s); the report's queries read
    the view as fast as they read the copy (docs/performance.md)."""
    p = plan(con, start, end)
    computed = computed_table(view)
    sql = query()
    con.execute(f"CREATE OR REPLACE TEMP TABLE {computed} AS {sql} LIMIT 0",
                {"start": start, "end": start})
    for lo, hi in p.computed:
        con.execute(f"INSERT INTO {computed} {sql}", {"start": lo, "end": hi})
    ranges = " OR ".join(f"(hour >= {_literal(lo)} AND hour < {_literal(hi)})"
                         for lo, hi in _merged(p.stored)) or "false"
    con.execute(f"CREATE OR REPLACE TEMP VIEW {view} AS SELECT * FROM {ROWS} WHERE {ranges} "
                f"UNION ALL SELECT * FROM {computed}")
    return p


def computed_table(view: str) -> str:
    """The temporary table that holds the computed slices of `expose(con, view, ...)`."""
    return f"{view}_computed"


def _merged(spans: Iterable[tuple[datetime, datetime]]) -> list[tuple[datetime, datetime]]:
    """Adjacent slices as one range (a month wholly stored: one condition, not 31)."""
    out: list[tuple[datetime, datetime]] = []
    for lo, hi in sorted(spans):
        if out and out[-1][1] == lo:
            out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return out


def _literal(t: datetime) -> str:
    """A naive UTC datetime as a SQL timestamp literal (a view takes no parameters)."""
    if t.tzinfo is not None:
        raise ValueError(f"expected a naive UTC datetime, got {t!r}")
    return f"TIMESTAMP '{t.isoformat(sep=' ')}'"
