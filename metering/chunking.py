"""How long a chunk of a metered period is, and what it may cost in memory: picked from the
query planner's estimate of the series and the container's memory limit."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# Prometheus answers at most 11,000 points per series; a chunk of N hours asks for N+1.
MAX_CHUNK_HOURS = 10_000
DEFAULT_CHUNK_HOURS = 72  # a 31-day month: 11 chunks x 19 queries = 209 queries

# Ingest holds a chunk's points (one per series, signal and hour) as Arrow tables and in
# DuckDB while it writes the chunk's facts: its peak memory is a base plus a cost per point.
# Measured with bench/scale.py (docs/performance.md, "Ingest memory"): 0.18 MiB per GPU at
# 72-hour chunks over a ~0.4 GiB base, i.e. ~135 bytes per point of the planner's estimate
# (nodes x PRIOR_SERIES_PER_NODE series per signal, every signal, every hour).
INGEST_BASE_BYTES = 400 << 20
INGEST_BYTES_PER_POINT = 135
# What a chunk may cost by default: the whole path's target is 4 GB (issue 17); a container
# memory limit below it (cgroup) lowers it to 3/4 of that limit.
DEFAULT_INGEST_BUDGET = 3 << 30
# Chunk lengths the automatic choice picks from: a small change of fleet size rarely changes
# the pick, so an interrupted run is resumed by a rerun (the chunk length is part of a run's
# settings, metering/resume.py).
CHUNK_LADDER = (72, 48, 24, 12, 6, 3, 2, 1)



@dataclass(frozen=True)
class ChunkChoice:
    """The chunk length picked for a period from the planner's estimate of its series."""

    hours: int
    series: int  # estimated series per hour, over every signal
    peak_bytes: int  # estimated peak memory of ingest with chunks of `hours`
    budget_bytes: int

    def describe(self) -> str:
        gib = 1 << 30
        return (f"chunks of {self.hours} h (automatic: ~{self.series:,} series per hour "
                f"estimated, peak ~{self.peak_bytes / gib:.1f} GiB within a "
                f"{self.budget_bytes / gib:.1f} GiB budget; --chunk HOURS overrides)")


def choose_chunk(series: int, budget: int) -> ChunkChoice:
    """The longest chunk of CHUNK_LADDER whose estimated peak fits `budget` (the shortest
    when none does)."""
    def peak(hours: int) -> int:
        return INGEST_BASE_BYTES + INGEST_BYTES_PER_POINT * series * hours

    hours = next((h for h in CHUNK_LADDER if peak(h) <= budget), CHUNK_LADDER[-1])
    return ChunkChoice(hours, series, peak(hours), budget)


def memory_budget(cgroup: Path = Path("/sys/fs/cgroup")) -> int:
    """DEFAULT_INGEST_BUDGET, or 3/4 of the container's memory limit where that is lower
    (cgroup v2 memory.max, v1 memory.limit_in_bytes)."""
    for f in (cgroup / "memory.max", cgroup / "memory" / "memory.limit_in_bytes"):
        try:
            text = f.read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            return min(DEFAULT_INGEST_BUDGET, int(text) * 3 // 4)
    return DEFAULT_INGEST_BUDGET


