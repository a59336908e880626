"""How long a chunk of a metered period is, and what it may cost in memory: picked from the
query planner's estimate of the series and the container's memory limit."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# Prometheus answers at most 11,000 points per series; a chunk of N hours asks for N+1.
MAX_CHUNK_HOURS = 10_000
DEFAULT_CHUNK_HOURS = 72  # a 31-day month: 11 chunks x 19 queries = 209 queries

# Ingest holds a node group's points (one per series, signal and hour) as decoded answers,
# Arrow tables and in DuckDB while it writes their facts: its peak memory is a base, DuckDB's
# buffers and a cost per point the answers hold. Measured with bench/memory_model.py
# (docs/performance.md, "Ingest memory model (issue 27)"): one 72-hour chunk of 26k, 52k and
# 103k series held at once peaked at 489, 765 and 1,291 MiB: 79 bytes per point over a
# 221 MiB base (Python, pyarrow, DuckDB). Kept with headroom: the bytes for the answers sent
# ahead of the group being written. Since the series' ids are stored per series (stop 51) the
# same chunks peak at 433, 606 and 1,113 MiB, 68 bytes per point over 176 MiB; 96 is kept (the
# native reads' sizing shares it, and was not measured again).
INGEST_BASE_BYTES = 320 << 20
INGEST_BYTES_PER_POINT = 96
# DuckDB's share of the budget: its cap is lowered to it while ingesting (metering.db.capped).
# At its own cap (1.5GB by default) DuckDB keeps the blocks each chunk writes cached until it
# reaches that cap: two 72-hour chunks of the 80,000-GPU month peaked at 1.15x a 3 GiB and
# 1.37x a 1.5 GiB budget, 0.88x and 0.92x with the share (docs/performance.md, "DuckDB's
# share of ingest's budget"). Fact SQL works a node group at a time and spills beyond it.
INGEST_DUCKDB_SHARE = 1 / 4
INGEST_DUCKDB_MIN_BYTES = 128 << 20
# What a chunk may cost by default: the whole path's target is 4 GB (issue 17); a container
# memory limit below it (cgroup) lowers it to 3/4 of that limit.
DEFAULT_INGEST_BUDGET = 3 << 30


def duckdb_within(budget: int) -> int:
    """Bytes of buffers DuckDB may keep while ingesting within `budget` bytes of peak memory
    (at least INGEST_DUCKDB_MIN_BYTES: below it a node group's fact SQL runs out)."""
    return max(INGEST_DUCKDB_MIN_BYTES, int(budget * INGEST_DUCKDB_SHARE))


def points_within(budget: int) -> int:
    """Points of answers ingest may hold at once within `budget` bytes of peak memory, beside
    the base and DuckDB's share (at least an eighth of the budget's worth where the budget is
    below those)."""
    room = budget - INGEST_BASE_BYTES - duckdb_within(budget)
    return max(1, (room if room > budget // 8 else budget // 8) // INGEST_BYTES_PER_POINT)


@dataclass(frozen=True)
class ChunkChoice:
    """How a period is fetched within a memory budget: chunks of `hours` (always the
    default: longer ranges cost the store less per point), each in about `groups` node
    groups (metering.queryplan) from the planner's estimate of its series."""

    hours: int
    series: int  # estimated series per hour, over every signal
    groups: int  # node groups per chunk, estimated before any answer
    budget_bytes: int
    why: str = ""  # why the length is not the default

    def describe(self) -> str:
        gib = 1 << 30
        split = (f" in ~{self.groups} node groups" if self.groups > 1 else "")
        why = f"{self.why}; " if self.why else ""
        return (f"chunks of {self.hours} h{split} (automatic: {why}~{self.series:,} series per "
                f"hour estimated, peak within a {self.budget_bytes / gib:.1f} GiB budget; "
                "--chunk HOURS overrides the length)")


def choose_chunk(series: int, budget: int, hours: int = DEFAULT_CHUNK_HOURS, why: str = ""
                 ) -> ChunkChoice:
    """Chunks of `hours` (DEFAULT_CHUNK_HOURS unless the caller says `why`), in as many
    node groups as `series` (per hour, every signal) need to stay within `budget`."""
    points = series * (hours + 1)
    groups = max(1, -(-points // points_within(budget)))
    return ChunkChoice(hours, series, groups, budget, why)


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


