"""Resuming an interrupted ingest run from its last committed chunk.

Every run is recorded in `ingest_runs` (source, settings, period) and every chunk it commits in
`ingest_chunks`, inside that chunk's transaction. A run that did not reach its end (killed,
out of memory, the store went away) is left unfinished; the next run of the same source,
settings and period takes it over and skips the chunks it committed, instead of metering the
month again. A run that finished is never resumed: running it again re-meters every chunk
(late data, a fixed exporter), as before.

The settings are everything besides the source that decides a chunk's facts: the selector, the
cluster options, the sample interval and the chunk length (the sample interval is detected per
chunk). A run with other settings never takes over chunks committed under different ones, and
a committed chunk is skipped only if no later run (of any source or settings) rewrote its hours
of its clusters.

Skipped chunks are not rewritten, so they neither grow nor shrink; the chunks still to do are
checked like any other (a source with fewer facts of a family than the ledger holds is refused
unless --replace).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from metering.cluster import ClusterScope
from metering.period import Period, utc_naive
from metering.selector import Selector


def _now() -> datetime:
    return utc_naive(datetime.now(UTC))


@dataclass(frozen=True)
class RunSettings:
    """What, besides the source, decides the facts a chunk gets: two runs resume each other
    only when these are equal."""

    selector: Selector
    clusters: ClusterScope
    chunk_hours: int
    sample_interval: float | None  # None: detected per node and chunk

    def key(self) -> str:
        """A canonical text (stored in `ingest_runs.settings`): matcher order and braces do
        not matter, every other difference does."""
        matchers = ",".join(sorted(m.promql() for m in self.selector.matchers))
        label = "-" if self.clusters.label is None else self.clusters.label
        interval = "detected" if self.sample_interval is None else f"{self.sample_interval:g}s"
        return (f"selector={{{matchers}}} cluster={self.clusters.name} cluster_label={label} "
                f"chunk={self.chunk_hours}h sample_interval={interval}")


@dataclass
class Journal:
    """The run being metered, and what an interrupted run before it already committed."""

    run_id: int
    done: list[tuple[datetime, datetime]] = field(default_factory=list)  # naive UTC
    resumed_from: datetime | None = None  # start of the interrupted run taken over
    # An interrupted run of this source and period under other settings: not taken over.
    passed_over: str | None = None
    # Clusters the taken-over chunks rewrote: priced with the run's own, even when every
    # chunk was committed before the run was killed.
    clusters: set[str] = field(default_factory=set)
    # Chunks the interrupted run recorded whose hours the ledger does not hold: metered again.
    distrusted: int = 0

    @classmethod
    def begin(cls, con: Any, source: str, settings: RunSettings, period: Period,
              resume: bool = True) -> Journal:
        """Take over the latest run of this source, settings and period if it is unfinished
        (and `resume`), else record a new one. Committed before the first chunk."""
        start, end = period.naive()
        key = settings.key()
        rows = con.execute(
            "SELECT run_id, started_at, finished_at, settings FROM ingest_runs WHERE "
            "source = $src AND period_start = $s AND period_end = $e "
            "ORDER BY started_at DESC, run_id DESC",
            {"src": source, "s": start, "e": end}).fetchall()
        passed_over = None
        if rows and rows[0][3] != key and rows[0][2] is None:
            passed_over = str(rows[0][3]) or "unknown: recorded by an older version"
        mine = [r for r in rows if r[3] == key][:1]
        if resume and mine and mine[0][2] is None:
            run_id, started = int(mine[0][0]), mine[0][1]
            # A chunk whose hours of its clusters a later run (any source or settings)
            # rewrote is done again; NULL clusters (not recorded) overlap every cluster.
            rows = con.execute(
                "SELECT chunk_start, chunk_end, clusters FROM ingest_chunks c WHERE run_id = $r "
                "AND NOT EXISTS (SELECT 1 FROM ingest_chunks l WHERE l.run_id > $r AND "
                "l.chunk_start < c.chunk_end AND l.chunk_end > c.chunk_start AND "
                "coalesce(list_has_any(l.clusters, c.clusters), true)) "
                "ORDER BY chunk_start", {"r": run_id}).fetchall()
            # The journal is a claim; the ledger's own facts are the proof: a chunk is skipped
            # only if its hours are there (restored from a backup, deleted by hand, a journal
            # copied from another ledger: metered again, not trusted).
            kept = [(a, b, list(c or ())) for a, b, c in rows
                    if c is not None and _holds(con, a, b, c)]
            if kept:
                clusters = {n for _, _, c in kept for n in c}
                return cls(run_id, [(a, b) for a, b, _ in kept], started,
                           clusters=clusters, distrusted=len(rows) - len(kept))
        next_id = con.execute("SELECT coalesce(max(run_id), 0) + 1 FROM ingest_runs"
                              ).fetchall()[0][0]
        con.execute("INSERT INTO ingest_runs (run_id, source, period_start, period_end, "
                    "started_at, finished_at, settings) VALUES ($r, $src, $s, $e, $now, NULL, "
                    "$k)", {"r": next_id, "src": source, "s": start, "e": end, "now": _now(),
                            "k": key})
        return cls(int(next_id), passed_over=passed_over if resume else None)

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

    def record(self, con: Any, chunk: Period, clusters: Iterable[str]) -> None:
        """Inside the chunk's transaction: it is committed exactly when its facts are.
        `clusters`: those whose hours the chunk rewrote."""
        con.execute("INSERT INTO ingest_chunks (run_id, chunk_start, chunk_end, committed_at, "
                    "clusters) VALUES ($r, $s, $e, $now, $c)",
                    {"r": self.run_id, "s": utc_naive(chunk.start), "e": utc_naive(chunk.end),
                     "now": _now(), "c": sorted(clusters)})

    def finish(self, con: Any) -> None:
        """The run is done: its last chunk committed and, when it prices, its charges too.
        A run killed in between is unfinished, so a rerun takes it over and prices."""
        con.execute("UPDATE ingest_runs SET finished_at = $now WHERE run_id = $r",
                    {"r": self.run_id, "now": _now()})


def _holds(con: Any, start: datetime, end: datetime, clusters: list[str]) -> bool:
    """Whether the ledger holds what a committed chunk wrote for `clusters`: a coverage row
    for every hour and cluster, and as many device facts in each as that row counted."""
    hours = int((end - start).total_seconds()) // 3600
    row = con.execute(
        "SELECT count(*), count(*) FILTER (WHERE c.devices = coalesce(d.n, 0)) FROM coverage c "
        "LEFT JOIN (SELECT hour, cluster, count(*) AS n FROM device_hours WHERE hour >= $s AND "
        "hour < $e GROUP BY ALL) d ON d.hour = c.hour AND d.cluster = c.cluster "
        "WHERE c.hour >= $s AND c.hour < $e AND list_contains($c, c.cluster)",
        {"s": start, "e": end, "c": clusters}).fetchone()
    want = hours * len(set(clusters))
    return row is not None and row[0] == want and row[1] == want
