"""Guards on every path that replaces metered facts: what is written is compared with what it
replaces, family by family, and a shrink is refused (exit 6) unless the caller said
`--replace`.

A source can lose one family and keep the others: a Prometheus whose allocation series were
dropped by a relabelling rule, a store that kept `gpu_up` longer than the container series.
Comparing device-hours only let such a source move a whole priced month to idle, so each
family the charges are computed from is counted on its own: device, MIG instance, allocation,
workload (owner, peak memory) and fractional grant rows, one row per key and hour.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from metering.errors import RefusedError

# (fact table, what one of its rows is called in a message), in the order messages list them.
FAMILIES: Final = (("device_hours", "device-hours"), ("mig_hours", "MIG-instance-hours"),
                   ("allocation_hours", "allocation-hours"),
                   ("workload_hours", "workload-hours"), ("grant_hours", "fraction-hours"))
REPLACE_HINT = "pass --replace to overwrite them with what the source has"

# cluster -> fact table -> rows
Held = dict[str, dict[str, int]]


@dataclass(frozen=True, order=True)
class Shrink:
    """A family of a cluster with fewer rows than the ledger held for the same hours."""

    cluster: str
    table: str
    held: int
    now: int

    def describe(self, named: bool) -> str:
        what = dict(FAMILIES)[self.table]
        where = f"cluster {self.cluster}: " if named else ""
        return (f"{where}the source has {self.now} {what} where the ledger holds {self.held}; "
                f"metering would lose {self.held - self.now}")


class ShrinkRefused(RefusedError):
    """A replacement that would lose metered facts, refused without --replace."""


def held(con: Any, start: datetime, end: datetime, clusters: Iterable[str],
         schema: str = "") -> Held:
    """Rows of each fact family in hours [start, end) of `clusters` (every wanted cluster
    and family present, 0 where none). `schema`: the catalog/schema prefix of the tables
    ('' for the connection's own, e.g. 'target.main.')."""
    wanted = sorted(clusters)
    out: Held = {c: {t: 0 for t, _ in FAMILIES} for c in wanted}
    union = " UNION ALL ".join(
        f"SELECT '{t}' AS t, cluster, count(*) AS n FROM {schema}{t} WHERE hour >= $s AND "
        "hour < $e AND list_contains($c, cluster) GROUP BY cluster" for t, _ in FAMILIES)
    for table, cluster, n in con.execute(union, {"s": start, "e": end, "c": wanted}
                                         ).fetchall():
        out[str(cluster)][str(table)] = int(n)
    return out


def shrinks(before: Mapping[str, Mapping[str, int]],
            after: Mapping[str, Mapping[str, int]]) -> list[Shrink]:
    """Every (cluster, family) with fewer rows `after` than `before`."""
    return sorted(Shrink(c, t, n, after.get(c, {}).get(t, 0))
                  for c, tables in before.items() for t, n in tables.items()
                  if after.get(c, {}).get(t, 0) < n)


def refuse(found: Sequence[Shrink], named: bool, hint: str = REPLACE_HINT) -> ShrinkRefused:
    """One line naming each shrunk family and its hours (`named`: with its cluster)."""
    return ShrinkRefused("; ".join(s.describe(named) for s in found) + f" ({hint})")
