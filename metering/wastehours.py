"""The waste recommendations' device-hours, stored per hour and cluster by pricing.

The month-end report's largest cost was joining a month of allocation-, device-, workload-
and MIG-hours with the month's charges and energy (waste.sql `device_hours`) to size each
workload's device-hours. Every row of that query is one hour of one cluster, so pricing,
which rewrites an hour's charges, computes the hour's rows there and then and keeps them in
`waste_hours` (schema.sql); the report reads them and computes only the hours with no stored
rows (a ledger priced before this version, facts re-metered and not priced again).

Who keeps them true: pricing replaces the rows of the hours x clusters it prices, in its
transaction, after closed hours' charges are restored (metering/closes.py); rewriting facts
(metering/facts.py `delete_hours`) and merging a cluster-month (metering/export.py) delete
them. A stored hour is therefore what the query gives from the facts and charges as they are.

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


def fill(con: Any, table: str, start: datetime, end: datetime) -> Plan:
    """Insert the query's rows of [start, end) into `table` (created by the caller with the
    query's columns), slice by slice: stored rows where there are, computed elsewhere."""
    p = plan(con, start, end)
    sql = query()
    for lo, hi in sorted((*p.stored, *p.computed)):
        if (lo, hi) in p.stored:
            con.execute(f"INSERT INTO {table} SELECT * FROM {ROWS} WHERE hour >= $s AND "
                        "hour < $e", {"s": lo, "e": hi})
        else:
            con.execute(f"INSERT INTO {table} {sql}", {"start": lo, "end": hi})
    return p
