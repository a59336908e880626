"""Which hours `meter` need not price again: those priced from the facts they hold now.

`meter --daily` re-meters the two days before yesterday for late samples and used to price
all three days again, though a late day's facts mostly come out the same: two thirds of the
run's pricing rebuilt charges that did not change (docs/performance.md, "The CronJob's daily
run at 80,000 GPUs"). An hour's charges, energy rows and waste device-hours depend only on
that hour's facts, the cost model, the hour's energy price, PUE and carbon intensity (which
come from the cost model and, for intensity, from the CSV file it names: the cost model's hash
covers its YAML only) and the pricing code (every figure of pricing.sql is per hour), so:

- pricing records every hour it prices in `priced_hours`: a digest of the hour's facts (each
  fact table's rows counted and hashed twice), the cost model's hash, what else it was priced
  with (`pricing_key`: the pricing code's fingerprint and the hour's energy factors), its
  charge rows and unpriced allocations (`record`);
- `meter` keeps the charges of an hour whose record names the cost model, code and energy
  factors of this run and the digest its facts have now, whose charge rows are all still
  there and whose waste device-hours are stored (`kept`);
- ingest, re-metering priced hours, drops the waste device-hours derived from the old facts
  only where the digest changed (`before`, `settle`), so that an hour re-metered unchanged
  can be kept.

A run that closes months (metering/closes.py Freeze) keeps nothing and records nothing for
the period: its closed hours hold the closed bill, not what the facts price at.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any, Final

import pyarrow as pa

from metering import wastehours
from metering.energy import hours_of

TABLE: Final = "priced_hours"
# The tables an hour's charges are priced from (metering/facts.py FACT_TABLES but coverage,
# which pricing does not read).
_FACTS: Final = ("device_hours", "mig_hours", "allocation_hours", "workload_hours",
                 "grant_hours")
# What decides the charges besides the facts and the cost model: the pricing code. A new
# version of any of these files prices everything again.
_CODE: Final = ("pricing.py", "wastehours.py", "costmodel.py", "partitions.py", "energy.py",
                "pricedhours.py", "sql/pricing.sql", "sql/waste.sql")


def _fingerprint() -> str:
    digest = hashlib.sha256()
    for name in _CODE:
        digest.update(name.encode() + b"\0" + (Path(__file__).parent / name).read_bytes())
    return digest.hexdigest()[:16]


FINGERPRINT: Final = _fingerprint()

# Per hour: its kWh price (micros; None: no `energy:`), PUE (millionths) and carbon intensity
# (mg per kWh; None: no `carbon:`), as pricing loads them (metering/pricing.py _p_energy).
Factors = Mapping[datetime, tuple[int | None, int, int | None]]


def pricing_key(factors: Factors, hour: datetime) -> str:
    """The `pricing` column of an hour: the code's fingerprint and the hour's energy factors.
    An intensity CSV updated for hours already priced (grid operators publish actual figures
    after their forecasts) changes this, so those hours are priced again."""
    return f"{FINGERPRINT}:{hashlib.sha256(repr(factors[hour]).encode()).hexdigest()[:16]}"


def _text(parts: list[tuple[str, int, int, int]]) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()


EMPTY: Final = _text([])

# Per (cluster, hour): a sha256 of each fact table's row count and two 64-bit hash sums of
# its rows (EMPTY: an hour without facts).
Before = dict[tuple[str, datetime], str]


def before(con: Any, start: datetime, end: datetime, clusters: Iterable[str]) -> Before:
    """The digests of the facts of every priced hour of [start, end) x `clusters`: taken
    before ingest deletes those hours (facts.delete_hours), compared by `settle`."""
    params = {"s": start, "e": end, "c": sorted(clusters)}
    priced = [(str(c), h) for c, h in con.execute(
        f"SELECT cluster, hour FROM {TABLE} WHERE hour >= $s AND hour < $e "
        "AND list_contains($c, cluster)", params).fetchall()]
    if not priced:
        return {}
    got = _digests(con, params)
    return {k: got.get(k, EMPTY) for k in priced}


def settle(con: Any, start: datetime, end: datetime, clusters: Iterable[str],
           was: Mapping[tuple[str, datetime], str]) -> int:
    """After ingest wrote the new facts of [start, end) x `clusters`: drop what pricing derived
    from the old facts (priced_hours rows, stored waste device-hours) except for the priced
    hours whose facts came out the same. Returns how many hours kept theirs."""
    names = sorted(clusters)
    params = {"s": start, "e": end, "c": names}
    now = _digests(con, params) if was else {}
    same = [k for k, d in was.items() if now.get(k, EMPTY) == d]
    where = "hour >= $s AND hour < $e AND list_contains($c, cluster)"
    if same:
        con.register("_gl_same", pa.table({
            "cluster": pa.array([c for c, _ in same], pa.string()),
            "hour": pa.array([h for _, h in same], pa.timestamp("us"))}))
    try:
        for table in (*wastehours.TABLES, TABLE):
            kept = (f" AND NOT EXISTS (SELECT 1 FROM _gl_same k WHERE k.cluster = "
                    f"{table}.cluster AND k.hour = {table}.hour)" if same else "")
            con.execute(f"DELETE FROM {table} WHERE {where}{kept}", params)
    finally:
        if same:
            con.unregister("_gl_same")
    return len(same)


def _digests(con: Any, params: Mapping[str, Any]) -> dict[tuple[str, datetime], str]:
    parts: dict[tuple[str, datetime], list[tuple[str, int, int, int]]] = {}
    for table in _FACTS:
        for cluster, hour, n, h1, h2 in con.execute(
                f"SELECT cluster, hour, count(*), sum(hash(t)), sum(hash(t, 1)) FROM {table} t "
                "WHERE hour >= $s AND hour < $e AND list_contains($c, cluster) GROUP BY ALL",
                dict(params)).fetchall():
            parts.setdefault((str(cluster), hour), []).append((table, int(n), int(h1), int(h2)))
    return {k: _text(v) for k, v in parts.items()}


def kept(con: Any, start: datetime, end: datetime, cluster: str,
         cost_model_hash: str, factors: Factors) -> dict[datetime, int]:
    """The hours of [start, end) of `cluster` whose charges this pricing would give again,
    with their unpriced allocations: priced with this cost model, code and energy `factors`
    (every hour of the period) from facts with the digest they have now, every charge row
    there and the waste device-hours stored."""
    params = {"s": start, "e": end, "c": cluster, "m": cost_model_hash}
    rows = con.execute(
        f"""SELECT p.hour, p.facts, p.pricing, p.unpriced_allocations FROM {TABLE} p
            JOIN {wastehours.STORED} w ON w.hour = p.hour AND w.cluster = p.cluster
            LEFT JOIN (SELECT hour, count(*) AS n FROM charges
                       WHERE hour >= $s AND hour < $e AND cluster = $c
                         AND cost_model_hash = $m GROUP BY hour) ch ON ch.hour = p.hour
            WHERE p.hour >= $s AND p.hour < $e AND p.cluster = $c
              AND p.cost_model_hash = $m
              AND coalesce(ch.n, 0) = p.charge_rows""", params).fetchall()
    if not rows:
        return {}
    now = _digests(con, {"s": start, "e": end, "c": [cluster]})
    return {h: int(n) for h, facts, pricing, n in rows
            if now.get((cluster, h), EMPTY) == facts and pricing == pricing_key(factors, h)}


def touch(con: Any, start: datetime, end: datetime, cluster: str, now: datetime) -> None:
    """Kept hours: their stored waste device-hours are current (the report reads rows stored
    no earlier than their hour's facts were ingested, metering.wastehours.plan)."""
    con.execute(f"UPDATE {wastehours.STORED} SET stored_at = $now WHERE hour >= $s "
                "AND hour < $e AND cluster = $c",
                {"s": start, "e": end, "c": cluster, "now": now})


def record(con: Any, cluster: str, cost_model_hash: str, factors: Factors,
           unpriced: Mapping[datetime, int], start: datetime, end: datetime,
           now: datetime) -> None:
    """Record the hours [start, end) of `cluster` as priced now (their charges written in
    this transaction) from the facts they hold and these energy `factors`, with the unpriced
    allocations of each."""
    con.execute(f"DELETE FROM {TABLE} WHERE hour >= $s AND hour < $e AND cluster = $c",
                {"s": start, "e": end, "c": cluster})
    facts = _digests(con, {"s": start, "e": end, "c": [cluster]})
    hours = hours_of(start, end)
    con.register("_gl_priced", pa.table({
        "hour": pa.array(hours, pa.timestamp("us")),
        "facts": pa.array([facts.get((cluster, h), EMPTY) for h in hours], pa.string()),
        "pricing": pa.array([pricing_key(factors, h) for h in hours], pa.string()),
        "unpriced": pa.array([unpriced.get(h, 0) for h in hours], pa.int64())}))
    try:
        con.execute(
            f"""INSERT INTO {TABLE}
                SELECT p.hour, $c, $m, p.pricing, p.facts, coalesce(ch.n, 0), p.unpriced,
                       $now
                FROM _gl_priced p
                LEFT JOIN (SELECT hour, count(*) AS n FROM charges
                           WHERE hour >= $s AND hour < $e AND cluster = $c GROUP BY hour) ch
                       ON ch.hour = p.hour""",
            {"s": start, "e": end, "c": cluster, "m": cost_model_hash, "now": now})
    finally:
        con.unregister("_gl_priced")


def forget(con: Any, start: datetime, end: datetime, clusters: Iterable[str]) -> None:
    """Drop the priced_hours rows of [start, end) x `clusters` (a run that closes months)."""
    con.execute(f"DELETE FROM {TABLE} WHERE hour >= $s AND hour < $e "
                "AND list_contains($c, cluster)",
                {"s": start, "e": end, "c": sorted(clusters)})
