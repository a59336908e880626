"""Resuming an interrupted ingest run from its last committed chunk.

Every run is recorded in `ingest_runs` (source, period) and every chunk it commits in
`ingest_chunks`, inside that chunk's transaction. A run that did not reach its end (killed,
out of memory, the store went away) is left unfinished; the next run for the same source and
period takes it over and skips the chunks it committed, instead of metering the month again.
A run that finished is never resumed: running it again re-meters every chunk (late data,
a fixed exporter), as before.

Skipped chunks are not rewritten, so they neither grow nor shrink; the chunks still to do are
checked like any other (a source with fewer device-hours than the ledger holds is refused
unless --replace).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from metering.period import Period, utc_naive


def _now() -> datetime:
    return utc_naive(datetime.now(UTC))


@dataclass
class Journal:
    """The run being metered, and what an interrupted run before it already committed."""

    run_id: int
    done: list[tuple[datetime, datetime]] = field(default_factory=list)  # naive UTC
    resumed_from: datetime | None = None  # start of the interrupted run taken over

    @classmethod
    def begin(cls, con: Any, source: str, period: Period, resume: bool = True) -> Journal:
        """Take over the latest unfinished run of this source and period (if `resume`), else
        record a new one. Committed before the first chunk."""
        start, end = period.naive()
        row = con.execute(
            "SELECT run_id, started_at, finished_at FROM ingest_runs WHERE source = $src AND "
            "period_start = $s AND period_end = $e ORDER BY started_at DESC, run_id DESC "
            "LIMIT 1", {"src": source, "s": start, "e": end}).fetchall()
        if resume and row and row[0][2] is None:
            run_id, started = int(row[0][0]), row[0][1]
            done = [(a, b) for a, b in con.execute(
                "SELECT chunk_start, chunk_end FROM ingest_chunks WHERE run_id = $r "
                "ORDER BY chunk_start", {"r": run_id}).fetchall()]
            if done:
                return cls(run_id, done, started)
        next_id = con.execute("SELECT coalesce(max(run_id), 0) + 1 FROM ingest_runs"
                              ).fetchall()[0][0]
        con.execute("INSERT INTO ingest_runs VALUES ($r, $src, $s, $e, $now, NULL)",
                    {"r": next_id, "src": source, "s": start, "e": end, "now": _now()})
        return cls(int(next_id))

    def committed(self, chunk: Period) -> bool:
        """Whether the interrupted run committed every hour of `chunk`."""
        start, end = chunk.naive()
        cur = start
        for a, b in self.done:  # sorted by start; chunks of one run never overlap
            if a <= cur < b:
                cur = b
            if cur >= end:
                return True
        return cur >= end

    def record(self, con: Any, chunk: Period) -> None:
        """Inside the chunk's transaction: it is committed exactly when its facts are."""
        con.execute("INSERT INTO ingest_chunks VALUES ($r, $s, $e, $now)",
                    {"r": self.run_id, "s": utc_naive(chunk.start), "e": utc_naive(chunk.end),
                     "now": _now()})

    def finish(self, con: Any) -> None:
        con.execute("UPDATE ingest_runs SET finished_at = $now WHERE run_id = $r",
                    {"r": self.run_id, "now": _now()})
