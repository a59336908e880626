"""Closing a month: once `gpu-ledger close` has closed it, its bill never changes.

Metering runs every day (`meter --daily`), so a month's hours are metered and priced as they
close; at month end `close` checks that every hour of the month is metered and priced and
records the month in `month_closes` (a cluster's hours count from its first metered hour in
the month: one installed mid-month has nothing earlier to meter). From then on:

- re-metering or re-pricing its hours is refused (`ClosedError`, exit 9) unless the caller asks
  for adjustments (`meter --daily` does; `--adjust-closed` elsewhere);
- with adjustments, the facts are rewritten as usual, but the closed hours' charges are kept as
  they were: pricing prices them, posts the difference from the closed bill (less what earlier
  adjustments already posted) to `adjustments`, per hour x cluster x team x namespace, billed
  in the first month after it that is still open, and restores the closed charges, all in
  pricing's one transaction. Posting is idempotent: the same data posts nothing twice.

So closed charges + adjustments equal what pricing the current facts gives, to the micro.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

from metering.errors import ClosedError, RefusedError
from metering.period import HOUR, Month, Period, hour_ranges, utc_naive

ADJUST_HINT = "--adjust-closed"


def _day(m: Month) -> date:
    return date(m.year, m.month, 1)


def _has(con: Any, table: str) -> bool:
    """Whether `con` has the table (a ledger view of an older ledger or an export may not)."""
    return bool(con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = "
                            "? AND table_catalog = current_database()", [table]).fetchall()[0][0])


def closed_months(con: Any) -> dict[Month, datetime]:
    """Every closed month and when it was closed (naive UTC)."""
    if not _has(con, "month_closes"):
        return {}
    return {Month(d.year, d.month): t for d, t in
            con.execute("SELECT month, closed_at FROM month_closes ORDER BY month").fetchall()}


def closed_in(con: Any, period: Period) -> list[Month]:
    """The closed months `period` has hours in."""
    closed = closed_months(con)
    return [m for m in period.months() if m in closed]


def posting_month(con: Any, month: Month) -> Month:
    """The month that bills adjustments to `month`: the first one after it still open."""
    closed, cur = closed_months(con), month.next()
    while cur in closed:
        cur = cur.next()
    return cur


def refuse(months: list[Month], posted: Month, doing: str) -> ClosedError:
    shown = ", ".join(str(m) for m in months)
    return ClosedError(f"{shown} {'is' if len(months) == 1 else 'are'} closed (gpu-ledger "
                       f"close): {doing} would change a closed bill; pass {ADJUST_HINT} to post "
                       f"the difference as adjustments to {posted} instead")


@dataclass(frozen=True)
class Freeze:
    """Keeps closed hours' charges as they are while pricing rewrites a period, posting the
    difference to `adjustments` (see the module's docstring). Used inside pricing's
    transaction: `before` ahead of the pricing statements, `after` once they ran."""

    months: tuple[Month, ...]  # the closed months the period has hours in
    posted: tuple[tuple[Month, Month], ...]  # closed month -> month that bills its adjustments

    @classmethod
    def of(cls, con: Any, period: Period) -> Freeze | None:
        months = closed_in(con, period)
        if not months:
            return None
        return cls(tuple(months), tuple((m, posting_month(con, m)) for m in months))

    def _where(self) -> str:
        days = ", ".join(f"DATE '{_day(m)}'" for m in self.months)
        return (f"hour >= $s AND hour < $e AND list_contains($c, cluster) AND "
                f"CAST(date_trunc('month', hour) AS DATE) IN ({days})")

    def before(self, con: Any, start: datetime, end: datetime, clusters: list[str]) -> None:
        con.execute(f"CREATE OR REPLACE TEMP TABLE _gl_frozen AS SELECT * FROM charges WHERE "
                    f"{self._where()}", {"s": start, "e": end, "c": clusters})

    def after(self, con: Any, start: datetime, end: datetime, clusters: list[str],
              cost_model_hash: str) -> int:
        """Post what changed and restore the closed charges; the number of lines posted."""
        params = {"s": start, "e": end, "c": clusters}
        post = " ".join(f"WHEN DATE '{_day(m)}' THEN DATE '{_day(p)}'" for m, p in self.posted)
        group = ("SELECT hour, cluster, team, namespace, sum(cost) AS c, "
                 "sum(allocated_gpu_hours) AS g FROM {} WHERE {} GROUP BY ALL")
        where = self._where()
        n = con.execute(f"""
            INSERT INTO adjustments
            WITH now_ AS ({group.format('charges', where)}),
                 was AS ({group.format('_gl_frozen', where)}),
                 done AS ({group.format('adjustments', where)}),
                 k AS (SELECT hour, cluster, team, namespace FROM now_ UNION
                       SELECT hour, cluster, team, namespace FROM was UNION
                       SELECT hour, cluster, team, namespace FROM done),
                 d AS (SELECT k.*, coalesce(now_.c, 0) - coalesce(was.c, 0)
                              - coalesce(done.c, 0) AS dc,
                              coalesce(now_.g, 0) - coalesce(was.g, 0) - coalesce(done.g, 0)
                              AS dg
                       FROM k LEFT JOIN now_ USING (hour, cluster, team, namespace)
                       LEFT JOIN was USING (hour, cluster, team, namespace)
                       LEFT JOIN done USING (hour, cluster, team, namespace))
            SELECT hour, cluster, team, namespace, dc, dg,
                   CASE CAST(date_trunc('month', hour) AS DATE) {post} END,
                   $now, $hash
            FROM d WHERE dc <> 0 OR abs(dg) > 1e-9""",
                        {**params, "now": utc_naive(datetime.now(UTC)),
                         "hash": cost_model_hash}).fetchall()[0][0]
        con.execute(f"DELETE FROM charges WHERE {where}", params)
        con.execute("INSERT INTO charges SELECT * FROM _gl_frozen")
        con.execute("DROP TABLE _gl_frozen")
        return int(n)


@dataclass(frozen=True)
class Closed:
    month: Month
    closed_at: datetime
    cost: Decimal
    device_hours: int
    already: bool  # closed before this call


def close(con: Any, month: Month, now: datetime) -> Closed:
    """Record `month` as closed, once every hour of it is metered and priced; closing a closed
    month again changes nothing. Refused (exit 6) while the month runs or has hours missing."""
    done = closed_months(con).get(month)
    if done is not None:
        return _closed(con, month, done, already=True)
    if month.end > utc_naive(now):
        raise RefusedError(f"{month} has not ended yet (now {utc_naive(now):%Y-%m-%d %H:%M} "
                           "UTC): only a past month can be closed")
    params = {"s": month.start, "e": month.end}
    clusters = [r[0] for r in con.execute(
        "SELECT DISTINCT cluster FROM coverage WHERE hour >= $s AND hour < $e ORDER BY 1",
        params).fetchall()]
    if not clusters:
        raise RefusedError(f"{month} is not metered: expected its hours in the ledger before "
                           f"closing it; run gpu-ledger meter --month {month} first")
    have = {(c, h) for c, h in con.execute(
        "SELECT cluster, hour FROM coverage WHERE hour >= $s AND hour < $e", params).fetchall()}
    for cluster in clusters:
        # From the cluster's first metered hour: a cluster metered since mid-month (newly
        # installed, newly added) has no earlier hours to meter, and its month still closes.
        first = min(h for c, h in have if c == cluster)
        hours = [first + i * HOUR for i in range(int((month.end - first) / HOUR))]
        missing = [h for h in hours if (cluster, h) not in have]
        if missing:
            gaps = hour_ranges(missing)
            shown = ", ".join(g.label() for g in gaps[:3]) + (", ..." if len(gaps) > 3 else "")
            raise RefusedError(f"{month}: cluster {cluster}: {len(missing)} hour(s) not metered "
                               f"({shown}); meter them before closing the month (gpu-ledger "
                               f"meter --from {gaps[0].start:%Y-%m-%dT%H:00Z} --to "
                               f"{gaps[-1].end:%Y-%m-%dT%H:00Z})")
    unpriced = con.execute(
        "SELECT count(*) FROM (SELECT DISTINCT hour, cluster FROM device_hours WHERE hour >= $s "
        "AND hour < $e EXCEPT SELECT DISTINCT hour, cluster FROM charges WHERE hour >= $s AND "
        "hour < $e)", params).fetchall()[0][0]
    if unpriced:
        raise RefusedError(f"{month}: {unpriced} metered hour(s) are not priced; price them "
                           f"before closing the month (gpu-ledger meter --price-only --month "
                           f"{month})")
    cost, dh = _bill(con, month)
    con.execute("INSERT INTO month_closes VALUES ($m, $t, $c, $d)",
                {"m": _day(month), "t": utc_naive(now), "c": cost, "d": dh})
    return Closed(month, utc_naive(now), cost, dh, already=False)


def _bill(con: Any, month: Month) -> tuple[Decimal, int]:
    row = con.execute(
        "SELECT coalesce(sum(cost), 0), (SELECT count(*) FROM device_hours WHERE hour >= $s AND "
        "hour < $e) FROM charges WHERE hour >= $s AND hour < $e",
        {"s": month.start, "e": month.end}).fetchone()
    assert row is not None
    return Decimal(row[0]), int(row[1])


def _closed(con: Any, month: Month, at: datetime, already: bool) -> Closed:
    row = con.execute("SELECT cost, device_hours FROM month_closes WHERE month = $m",
                      {"m": _day(month)}).fetchone()
    assert row is not None
    return Closed(month, at, Decimal(row[0]), int(row[1]), already)


@dataclass(frozen=True)
class Adjustment:
    """Adjustments of one closed month posted to one open month, per cluster, team and
    namespace (what a bill groups by)."""

    for_month: Month
    posted_month: Month
    cluster: str
    team: str
    namespace: str
    cost: Decimal
    allocated_gpu_hours: float


def adjustments(con: Any, *, for_month: Month | None = None,
                posted_month: Month | None = None) -> list[Adjustment]:
    """Adjustment lines of a closed month (`for_month`) or billed in a month
    (`posted_month`); lines that net to zero are left out. [] when the ledger predates them."""
    if not _has(con, "adjustments"):
        return []
    cond: list[str] = []
    params: dict[str, object] = {}
    if for_month is not None:
        cond.append("hour >= $s AND hour < $e")
        params.update(s=for_month.start, e=for_month.end)
    if posted_month is not None:
        cond.append("posted_month = $p")
        params["p"] = _day(posted_month)
    where = " AND ".join(cond) or "true"
    rows = con.execute(
        "SELECT CAST(date_trunc('month', hour) AS DATE), posted_month, cluster, team, namespace, "
        f"sum(cost), sum(allocated_gpu_hours) FROM adjustments WHERE {where} GROUP BY ALL "
        "HAVING sum(cost) <> 0 ORDER BY ALL", params).fetchall()
    return [Adjustment(Month(f.year, f.month), Month(p.year, p.month), c, t, n, Decimal(cost),
                       float(g)) for f, p, c, t, n, cost, g in rows]
