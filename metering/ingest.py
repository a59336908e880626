"""Ingest orchestration: split the period into chunks, fetch each chunk's signals, write its
facts and coverage in one transaction, report progress.

A chunk is all-or-nothing: its hours are deleted and rewritten inside one transaction, so a
re-run gives the same rows and a failed fetch leaves the chunk as it was. Chunks already
committed stay when a later one fails.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from metering.facts import (
    SIGNALS,
    FactError,
    build_signal,
    delete_hours,
    write_coverage,
    write_facts,
)
from metering.period import HOUR, Period
from metering.progress import Progress
from metering.promclient import PromClient, PromError
from metering.queryplan import Limits, QueryPlanner
from metering.resume import Journal

# Prometheus answers at most 11,000 points per series; a chunk of N hours asks for N+1.
MAX_CHUNK_HOURS = 10_000
DEFAULT_CHUNK_HOURS = 72  # a 31-day month: 11 chunks x 17 queries = 187 queries


class IngestError(Exception):
    """A chunk could not be ingested; earlier chunks are committed, this one wrote nothing."""


class Source(Protocol):
    name: str  # recorded in coverage.source

    @property
    def queries(self) -> int: ...

    def fetch(self, chunk: Period) -> dict[str, pa.Table]: ...


class PrometheusSource:
    """One range query per signal per chunk (step 1h): the query count depends on hours and
    families only; every series comes back in the same answer."""

    def __init__(self, client: PromClient, limits: Limits | None = None) -> None:
        self.client = client
        self.name = client.url
        # Splits each signal's chunk query by node shard and time to fit the store's limits.
        self.planner = QueryPlanner(client, limits)
        self._window: str | None = None
        self.dropped = 0  # points whose value was not a finite number: never priced

    @property
    def queries(self) -> int:
        return self.client.queries

    def _points(self, result: list[dict[str, Any]], promql: str
                ) -> tuple[list[dict[str, str]], np.ndarray, np.ndarray, np.ndarray]:
        """Series labels and (series index, time, value) per point of a matrix answer. A point
        whose value is not a finite number ("abc", null, NaN, Inf) is dropped and counted; an
        answer that is not a matrix is an error."""
        series: list[dict[str, str]] = []
        sids: list[np.ndarray] = []
        tss: list[np.ndarray] = []
        vals: list[np.ndarray] = []
        for r in result:
            metric = r.get("metric") if isinstance(r, dict) else None
            points = r.get("values") if isinstance(r, dict) else None
            if not isinstance(metric, dict) or not isinstance(points, list):
                raise PromError(f"{self.client.url}: answer to {promql!r} is not a matrix "
                                "of {metric, values}")
            i = len(series)
            series.append({str(k): str(v) for k, v in metric.items()})
            t, v = self._series_points(points)
            sids.append(np.full(len(t), i, np.int64))
            tss.append(t)
            vals.append(v)
        if not series:
            return series, np.zeros(0, np.int64), np.zeros(0), np.zeros(0)
        return series, np.concatenate(sids), np.concatenate(tss), np.concatenate(vals)

    def _series_points(self, points: list[Any]) -> tuple[np.ndarray, np.ndarray]:
        """(time, value) arrays of one series' points, non-finite ones dropped and counted.
        numpy parses the whole series at once; a malformed point sends the series through
        the point-by-point path, which drops just that point."""
        try:
            t = np.array([p[0] for p in points], np.float64)
            v = np.array([p[1] for p in points], np.float64)
        except (TypeError, ValueError, IndexError, KeyError):
            ts: list[float] = []
            values: list[float] = []
            for p in points:
                try:
                    ts.append(float(p[0]))
                    values.append(float(p[1]))
                except (TypeError, ValueError, IndexError, KeyError):
                    self.dropped += 1
                    if len(ts) > len(values):
                        ts.pop()
            t, v = np.array(ts, np.float64), np.array(values, np.float64)
        ok = np.isfinite(t) & np.isfinite(v)
        if not ok.all():
            self.dropped += int((~ok).sum())
            t, v = t[ok], v[ok]
        return t, v

    def window(self) -> str:
        """Range selector covering exactly (T-1h, T]. Prometheus 3 range windows are left-open;
        Prometheus 2 includes both ends, so 1h minus a millisecond there (timestamps are ms)."""
        if self._window is None:
            major = self.client.major_version()
            self._window = "1h" if major is not None and major >= 3 else "3599999ms"
        return self._window

    def fetch(self, chunk: Period) -> dict[str, pa.Table]:
        window = self.window()
        # Evaluation at T covers hour T-1h: T = start covers the hour before the chunk, which
        # the energy counter difference needs.
        out: dict[str, pa.Table] = {}
        for spec in SIGNALS:
            result = self.planner.fetch(spec, window, chunk)
            if not result:
                continue
            series, sid, ts, values = self._points(result, spec.promql(window))
            out[spec.name] = build_signal(spec, series, sid, ts.astype(np.int64) - 3600,
                                          values)
        return out


@dataclass
class IngestResult:
    period: Period
    source: str
    chunks: int = 0
    queries: int = 0
    rows: dict[str, int] = field(default_factory=lambda: {
        "device_hours": 0, "mig_hours": 0, "allocation_hours": 0})
    empty_hours: list[datetime] = field(default_factory=list)  # UTC, naive
    resumed: int = 0  # chunks an interrupted run had committed, not metered again
    spacing: dict[str, float] = field(default_factory=dict)  # node -> seconds (last chunk)


def _naive(t: datetime) -> datetime:
    return t.astimezone(UTC).replace(tzinfo=None)


def ingest(con: Any, source: Source, period: Period, chunk_hours: int = DEFAULT_CHUNK_HOURS,
           sample_interval: float | None = None, progress: Progress | None = None,
           verbose: bool = False, replace: bool = False, resume: bool = True
           ) -> IngestResult:
    """Meter `period` from `source` chunk by chunk. A chunk whose source yields fewer
    device-hours than the ledger already holds for those hours is refused (nothing written)
    unless `replace`: a Prometheus past its retention or an empty source never wipes a
    metered month. An earlier run of the same source and period that stopped before its end
    is resumed after its committed chunks unless not `resume` (metering/resume.py)."""
    if not 1 <= chunk_hours <= MAX_CHUNK_HOURS:
        raise IngestError(f"--chunk: expected 1 to {MAX_CHUNK_HOURS} hours, got {chunk_hours}")
    chunks = list(period.chunks(chunk_hours))
    progress = progress or Progress(len(chunks), quiet=True)
    result = IngestResult(period, source.name)
    journal = Journal.begin(con, source.name, period, resume)
    result.resumed = sum(1 for c in chunks if journal.committed(c))
    if result.resumed and journal.resumed_from is not None:
        progress.total = len(chunks) - result.resumed
        began = journal.resumed_from.strftime("%Y-%m-%d %H:%M")
        progress.message(f"meter: resuming the run started {began} UTC: {result.resumed} of "
                         f"{len(chunks)} chunk(s) already "
                         "committed, not metered again (--no-resume meters them again)")
    for i, chunk in enumerate(chunks, 1):
        if result.resumed and journal.committed(chunk):
            continue
        where = f"chunk {i}/{len(chunks)} ({chunk.label()})"
        before = source.queries
        try:
            signals = source.fetch(chunk)
        except PromError as exc:
            raise IngestError(f"{where}: {exc}; nothing written for this chunk"
                              + (f", {i - 1} earlier chunk(s) kept" if i > 1 else "")) from None
        start, end = _naive(chunk.start), _naive(chunk.end)
        con.execute("BEGIN TRANSACTION")
        try:
            held = con.execute("SELECT count(*) FROM device_hours WHERE hour >= $s AND "
                               "hour < $e", {"s": start, "e": end}).fetchall()[0][0]
            delete_hours(con, start, end)
            counts = write_facts(con, signals, start, end, sample_interval)
            if counts.device_hours < held and not replace:
                raise FactError(
                    f"the source has {counts.device_hours} device-hours where the ledger holds "
                    f"{held}; metering would lose {held - counts.device_hours} (pass --replace "
                    "to overwrite them with what the source has)")
            empty = write_coverage(con, start, end, source.name,
                                   datetime.now(UTC).replace(tzinfo=None))
            journal.record(con, chunk)
            con.execute("COMMIT")
        except FactError as exc:
            con.execute("ROLLBACK")
            raise IngestError(f"{where}: {exc}; nothing written for this chunk") from None
        except BaseException:
            con.execute("ROLLBACK")
            raise
        result.chunks += 1
        for table in result.rows:
            result.rows[table] += getattr(counts, table)
        result.empty_hours += empty
        result.spacing = counts.spacing
        result.queries = source.queries
        if verbose:
            spacing = ", ".join(f"{n}={s:g}s" for n, s in sorted(counts.spacing.items()))
            progress.message(f"meter: {where}: {source.queries - before} queries, "
                             f"{counts.total} fact rows, sample interval {spacing}")
        progress.chunk_done(chunk.label(), f"{counts.total} fact rows", counts.total,
                            "fact rows")
    journal.finish(con)
    return result


def hour_ranges(hours: list[datetime]) -> list[tuple[datetime, datetime]]:
    """Consecutive hours merged into [first, last+1h) ranges, for naming gaps."""
    ranges: list[tuple[datetime, datetime]] = []
    for h in sorted(hours):
        if ranges and ranges[-1][1] == h:
            ranges[-1] = (ranges[-1][0], h + HOUR)
        else:
            ranges.append((h, h + HOUR))
    return ranges
