"""Before a report is written: the month's charges and facts agree with each other.

Pricing splits every device-hour among its rows (teams, idle, down), so no device-hour is
charged more than once, no charged device-hour is missing from the facts and no device-hour
is in the facts twice. A ledger assembled by hand (files copied into an export, two exports
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

_CHECKS = (
    # (query: the first offending row, or none; message from its columns)
    ("SELECT cluster, hour, uuid, count(*) FROM device_hours WHERE hour >= $s AND hour < $e "
     "GROUP BY ALL HAVING count(*) > 1 LIMIT 1",
     "cluster {0}, {1:%Y-%m-%d %H:%M}: GPU {2} is in the facts {3} times (device-hours "
     "counted twice)"),
    ("SELECT cluster, hour, uuid, sum(fraction) FROM charges WHERE hour >= $s AND hour < $e "
     "AND uuid <> '' AND sharing <> 'adjustment' GROUP BY ALL "
     f"HAVING sum(fraction) > 1 + {_SLACK} LIMIT 1",
     "cluster {0}, {1:%Y-%m-%d %H:%M}: GPU {2} is charged {3:.2f} times its device-hour "
     "(charges counted twice)"),
    ("SELECT c.cluster, c.hour, c.uuid FROM charges c ANTI JOIN device_hours d "
     "ON d.cluster = c.cluster AND d.hour = c.hour AND d.uuid = c.uuid "
     "WHERE c.hour >= $s AND c.hour < $e AND c.uuid <> '' LIMIT 1",
     "cluster {0}, {1:%Y-%m-%d %H:%M}: GPU {2} is charged but not in the facts (charges of "
     "facts since replaced; re-price the month)"),
    ("SELECT DISTINCT d.cluster FROM device_hours d WHERE d.hour >= $s AND d.hour < $e AND "
     "NOT EXISTS (SELECT 1 FROM charges c WHERE c.cluster = d.cluster AND c.hour >= $s AND "
     "c.hour < $e) LIMIT 1",
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
