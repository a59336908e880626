"""Before a report is written: the month's charges and facts agree with each other.

Pricing splits every device-hour among its rows (teams, idle, down), so in each hour the
charged fractions add up to at most the devices in the facts, and no GPU is in an hour's facts
twice. A ledger assembled by hand (files copied into an export, two exports
merged, facts re-metered and not re-priced) can break that; the report then printed a total
of 976 GPU-hours beside a capacity of 384 without a word. Any break is refused here, in one
line, before a figure is rendered.
"""

from __future__ import annotations

from typing import Any

from metering.errors import InputError
from metering.period import Month

# Rounding of fractions summed in floating point; a device-hour charged twice is off by ~1.
_SLACK = 1e-6

# Every check aggregates per cluster-hour at most (a few thousand groups a month, whatever the
# fleet size): one streaming pass over the month's facts and charges, no hash of every
# device-hour.
_CHECKS = (
    # (query: the first offending row, or none; message from its columns)
    ("SELECT cluster, hour, count(*), approx_count_distinct(uuid) FROM device_hours "
     "WHERE hour >= $s AND hour < $e GROUP BY ALL "
     "HAVING count(*) > 1.5 * approx_count_distinct(uuid) LIMIT 1",
     "cluster {0}, {1:%Y-%m-%d %H:%M}: {2} device facts for ~{3} GPUs (device-hours "
     "counted twice)"),
    # Only in a month with facts: a ledger of charges alone (hand-made, or facts kept
    # elsewhere) has nothing to cross-check them with.
    ("WITH d AS (SELECT cluster, hour, count(*) AS n FROM device_hours WHERE hour >= $s AND "
     "hour < $e GROUP BY ALL), c AS (SELECT cluster, hour, sum(fraction) AS f FROM charges "
     "WHERE hour >= $s AND hour < $e AND uuid <> '' AND sharing <> 'adjustment' GROUP BY ALL) "
     "SELECT c.cluster, c.hour, c.f, coalesce(d.n, 0) FROM c LEFT JOIN d USING (cluster, hour) "
     f"WHERE c.f > coalesce(d.n, 0) + {_SLACK} * (1 + coalesce(d.n, 0)) AND EXISTS (SELECT 1 "
     "FROM device_hours WHERE hour >= $s AND hour < $e) ORDER BY c.hour LIMIT 1",
     "cluster {0}, {1:%Y-%m-%d %H:%M}: charges cover {2:.2f} device-hours where the facts "
     "hold {3} (charges counted twice, or left from facts since replaced: re-price)"),
    # The clusters of each side first (a few groups): NOT EXISTS against the charges
    # themselves hashed a month of them, out of memory under the 1.5GB cap at 80,000 GPUs.
    ("WITH f AS (SELECT DISTINCT cluster FROM device_hours WHERE hour >= $s AND hour < $e), "
     "c AS (SELECT DISTINCT cluster FROM charges WHERE hour >= $s AND hour < $e) "
     "SELECT cluster FROM f WHERE NOT EXISTS (SELECT 1 FROM c WHERE c.cluster = f.cluster) "
     "ORDER BY cluster LIMIT 1",
     "cluster {0} has facts but no charges for the month (metered after pricing; price it)"),
)


def check_month(con: Any, month: Month, ledger: str) -> None:
    """InputError (exit 4), naming the first device-hour that breaks the rules, if any."""
    params = {"s": month.start.replace(tzinfo=None), "e": month.end.replace(tzinfo=None)}
    for query, message in _CHECKS:
        row = con.execute(query, params).fetchone()
        if row:
            raise InputError(f"{ledger}: {month}: " + message.format(*row)
                             + "; the ledger's totals would not match its capacity, so no "
                             "report is written")
