"""Fetch and decode chunks in worker processes, feeding the one DuckDB writer (ingest) in
this process: `meter --jobs N`.

Decoding answers into Arrow tables is Python and numpy work that holds the GIL for most of
its time, so threads would not add a core; processes do. Each worker is forked from the
parent after the source is set up (the selector settled, an OpenMetrics file parsed), so it
inherits the source. Work is handed out in parts: a part is a chunk's series of a contiguous
slice of its nodes (a Prometheus source: the parent lists the chunk's nodes once, as ingest
does, and cuts them), or a whole chunk (a source that cannot be cut, or a run of many chunks
where whole chunks already give every worker one). A run of one chunk (the daily run: one
24-h chunk) is so fetched by every worker at once. The parent receives each part's decoded
tables in part order (slice 0's node groups, then slice 1's, ...; chunk after chunk) and
writes them as node groups (staged: metering.facts), so the facts do not depend on which
worker fetched what, nor on `--jobs`. At most N parts are fetched ahead of the writer, and a
slice holds at most 1/N of the points the memory budget lets a node group hold (estimated
from the series per node the answers so far showed), so memory stays near one node group's.

What must happen once per chunk is the parent's: the series outside the selector listed,
the nodes listed, recorded or raw chosen (and said); the hour before the chunk (the energy
counter's difference) is in every slice, as in every node group.

Workers ignore SIGINT (Ctrl-C reaches the parent, which kills them) and are killed by the
kernel when the parent dies (PR_SET_PDEATHSIG): none outlives the command. A worker's
failure comes back as the exception's one line, never a traceback.
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import dataclasses
import gc
import math
import multiprocessing
import os
import signal
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from metering.errors import ExitCode, MeteringError
from metering.facts import signal_table
from metering.openmetrics_source import OpenMetricsSource
from metering.period import Period
from metering.prometheus_source import PrometheusSource

_PR_SET_PDEATHSIG = 1  # linux/prctl.h


@dataclass(frozen=True)
class Part:
    """What a worker fetches: a whole chunk (`recorded` None: as the source's `fetch` does),
    or, of a chunk the parent began (metering.prometheus_source `begin_chunk`), the series of
    a slice of its nodes."""

    chunk: Period
    nodes: tuple[str, ...] | None = None  # the slice ("" first: series without a node), or
    # None: every series
    listed: tuple[str, ...] | None = None  # the chunk's nodes as the parent listed them
    recorded: frozenset[str] | None = None  # signals read from recorded series
    failed: _Failure | None = None  # the parent could not begin the chunk: not sent


@dataclass(frozen=True)
class Fetched:
    """A part's decoded signals, node group by node group, and what the worker screened."""

    groups: list[dict[str, pa.Table]]
    dropped: dict[int, int]  # hour start (epoch s) -> values dropped as not plausible
    foreign: dict[tuple[str, str, str], int]
    unchecked: str
    queries: int
    pid: int
    stats: Any  # the worker's query-split statistics so far (PrometheusSource), or None
    grouped: bool = False  # the worker fetched its part in several node groups
    series: dict[str, dict[str, int]] = field(default_factory=dict)  # learned per node


@dataclass(frozen=True)
class _Failure:
    cls: type[MeteringError] | None  # None: not a MeteringError (a bug): said as one line
    message: str
    code: int
    pid: int


_SOURCE: Any = None  # the source forked workers fetch from (set before they are forked)


def _start_worker() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    with contextlib.suppress(Exception):  # Linux only: elsewhere the parent's kill suffices
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() == 1:  # the parent died before prctl took effect
        os._exit(1)
    if isinstance(_SOURCE, OpenMetricsSource):
        _SOURCE.after_fork()
    if isinstance(_SOURCE, PrometheusSource):  # a worker's statistics count its own queries
        _SOURCE.planner.stats = type(_SOURCE.planner.stats)()


def _fetch(part: Part) -> Fetched | _Failure:
    source = _SOURCE
    try:
        before = source.queries
        s = source.screened
        first, last = int(part.chunk.start.timestamp()), int(part.chunk.end.timestamp())
        had = s.dropped_in(first, last)  # a worker may fetch several parts of a chunk
        fetched = (source.fetch(part.chunk) if part.recorded is None else
                   source.fetch_part(part.chunk, part.nodes, part.listed, part.recorded))
        groups = [{spec.name: signal_table(spec, m) for spec, m in group}
                  for group in fetched]
        dropped = {h: n - had.get(h, 0) for h, n in s.dropped_in(first, last).items()
                   if n > had.get(h, 0)}
        planner = source.planner if isinstance(source, PrometheusSource) else None
        return Fetched(groups, dropped, dict(s.foreign), s.unchecked, source.queries - before,
                       os.getpid(), None if planner is None else copy.copy(planner.stats),
                       planner is not None and part.chunk in planner.grouped,
                       {} if planner is None else _of_part(planner.learned_series(), part))
    except MeteringError as exc:
        return _Failure(type(exc), _one_line(str(exc)), int(exc.code), os.getpid())
    except Exception as exc:  # one line for the parent, not a traceback
        return _Failure(None, _one_line(f"{type(exc).__name__}: {exc}"),
                        int(ExitCode.FAILED), os.getpid())


def _of_part(series: dict[str, dict[str, int]], part: Part) -> dict[str, dict[str, int]]:
    """The series per node learned of the part's nodes (a worker's planner keeps those of
    every part it fetched: the writer needs each node once, not 80,000 GPUs' per slice)."""
    if part.nodes is None:
        return series
    mine = set(part.nodes)
    return {f: {n: k for n, k in per.items() if n in mine} for f, per in series.items()}


def _one_line(text: str) -> str:
    return " ".join(text.split())


@dataclass
class ParallelSource:
    """`source` fetched by `jobs` forked worker processes; `tables(chunk)` gives the chunk's
    signals as Arrow tables, node group by node group, in the order `prefetching` named."""

    inner: Any
    jobs: int
    fetched_by: dict[Period, list[int]] = field(default_factory=dict)  # worker pid per part
    _queries: int = 0  # the workers', and the parent's as it began chunks
    _pool: ProcessPoolExecutor | None = None
    _todo: deque[Period] = field(default_factory=deque)  # chunks not begun
    _least: int = 1  # node slices a chunk is cut into at least
    _parts: deque[Part] = field(default_factory=deque)  # of begun chunks, not handed out
    _pending: deque[tuple[Part, Future[Fetched | _Failure]]] = field(default_factory=deque)
    # Chunks whose node groups are staged (metering.facts): too large for one group, or a
    # worker fetched its part in groups.
    _staged: set[Period] = field(default_factory=set)
    _stats: dict[int, Any] = field(default_factory=dict)  # worker pid -> its latest stats

    def merged_stats(self) -> Any:
        """The query-split statistics (metering.queryplan.SplitStats) of the parent (which
        listed the chunks' nodes) and of the workers (which sent the signals' queries) as
        one: counts added, extremes kept."""
        merged = copy.copy(self.inner.planner.stats)
        for stats in self._stats.values():
            for f in dataclasses.fields(stats):
                mine, theirs = getattr(merged, f.name), getattr(stats, f.name)
                if f.name.startswith(("max_", "nodes")):
                    setattr(merged, f.name, max(mine, theirs))
                elif isinstance(theirs, (bool, str)):
                    setattr(merged, f.name, mine or theirs)
                else:
                    setattr(merged, f.name, mine + theirs)
        return merged

    def describe(self) -> str:
        """Which worker processes fetched the chunks, in how many parts."""
        pids = sorted({p for got in self.fetched_by.values() for p in got})
        parts = sum(map(len, self.fetched_by.values()))
        sliced = f" ({parts} node slices)" if parts > len(self.fetched_by) else ""
        return (f"{len(self.fetched_by)} chunk(s){sliced} fetched by {len(pids)} worker "
                f"process(es) of {self.jobs} (pids {', '.join(map(str, pids))})")

    @property
    def name(self) -> str:
        return str(self.inner.name)

    @property
    def selector(self) -> Any:
        return self.inner.selector

    @property
    def screened(self) -> Any:
        return self.inner.screened

    @property
    def queries(self) -> int:
        return int(self.inner.queries) + self._queries

    def close(self) -> None:
        self.inner.close()

    def grouped(self, chunk: Period) -> bool:
        """Whether the chunk's node groups are staged by the writer (metering.facts), which
        then holds one group's facts at a time: where one process would have fetched it in
        groups too (too large for one), or a worker fetched its part in groups (known once
        the chunk's first part is received). Slices of a chunk that fits one group are
        written in one transaction, as one process writes it (staging them cost the
        10,000-GPU day's writer 1.4 s more)."""
        return chunk in self._staged

    @contextmanager
    def prefetching(self, chunks: Sequence[Period]) -> Iterator[None]:
        global _SOURCE
        self._todo = deque(chunks)
        if not self._todo:
            yield
            return
        # Whole chunks give every worker one where there are as many; fewer are cut.
        self._least = math.ceil(self.jobs / len(self._todo))
        _SOURCE = self.inner
        ctx = multiprocessing.get_context("fork")  # workers inherit the source as it is
        ok = False
        try:
            # Chunks begun (their nodes listed: queries that may wait on the store) before
            # SIGINT is blocked, enough to give every worker a part.
            while len(self._parts) < self.jobs and self._todo:
                self._begin(self._todo.popleft())
            # SIGINT blocked while forking: a child never runs the parent's handler (one
            # that arrives meanwhile is raised once unblocked, inside this try). Garbage
            # collected first and the rest frozen while forking: a worker never collects
            # (destroys) a copy of the parent's DuckDB objects, whose threads were not forked.
            gc.collect()
            gc.freeze()
            old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
            try:
                self._pool = ProcessPoolExecutor(self.jobs, mp_context=ctx,
                                                 initializer=_start_worker)
                for _ in range(self.jobs):  # forks every worker (3.11: at the first submit)
                    self._submit()
            finally:
                gc.unfreeze()
                signal.pthread_sigmask(signal.SIG_SETMASK, old)
            yield
            ok = True
        finally:
            self._stop(ok)
            _SOURCE = None

    def _begin(self, chunk: Period) -> None:
        """The chunk's parts: where the source can be cut, what is done once per chunk done
        here (metering.prometheus_source `begin_chunk`) and the chunk's nodes cut into
        slices; else the whole chunk."""
        inner = self.inner
        if not isinstance(inner, PrometheusSource):  # an OpenMetrics file: whole chunks
            self._parts.append(Part(chunk))
            return
        asked = inner.client.queries
        try:
            choice, probes = inner.begin_chunk(chunk)
        except MeteringError as exc:  # the chunk's failure, said when it is written
            self._parts.append(Part(chunk, failed=_Failure(
                type(exc), _one_line(str(exc)), int(exc.code), os.getpid())))
            return
        finally:
            self._queries += inner.client.queries - asked
        self._queries -= probes  # said apart from the signals' queries, as without workers
        inner.say_choice(chunk, choice)
        planner = inner.planner
        slices = planner.slices(chunk, self._least, planner.memory_points / self.jobs)
        listed = planner.nodes(chunk)
        if not planner.fits(chunk):
            self._staged.add(chunk)
        cuts: list[tuple[str, ...] | None] = list(slices) if slices else [None]
        self._parts.extend(Part(chunk, nodes, listed, choice.recorded) for nodes in cuts)

    def _submit(self) -> None:
        if self._pool is None:
            return
        while not self._parts and self._todo:
            self._begin(self._todo.popleft())
        if self._parts:
            part = self._parts.popleft()
            if part.failed is None:
                self._pending.append((part, self._pool.submit(_fetch, part)))
                return
            failed: Future[Fetched | _Failure] = Future()
            failed.set_result(part.failed)
            self._pending.append((part, failed))

    def _stop(self, finished: bool) -> None:
        pool, self._pool = self._pool, None
        self._pending.clear()
        self._parts.clear()
        if pool is None:
            return
        if finished:
            pool.shutdown(wait=True)
            return
        # Interrupted or failed: the workers' fetches are of no use; kill, do not wait.
        processes = list(getattr(pool, "_processes", {}).values())
        pool.shutdown(wait=False, cancel_futures=True)
        for p in processes:
            with contextlib.suppress(Exception):
                p.kill()
        for p in processes:
            with contextlib.suppress(Exception):
                p.join(timeout=5)

    def tables(self, chunk: Period) -> Iterator[dict[str, pa.Table]]:
        """The chunk's signals (name -> Arrow table) per node group, fetched by workers: its
        parts in order, each part's groups in order."""
        if not self._pending or self._pending[0][0].chunk != chunk:
            raise RuntimeError(f"tables({chunk.label()}): not the next prefetched chunk")
        while self._pending and self._pending[0][0].chunk == chunk:
            got = self._receive(chunk)
            while got.groups:  # each let go once written
                yield got.groups.pop(0)

    def _receive(self, chunk: Period) -> Fetched:
        """The next part of the chunk, its screening and statistics merged."""
        _, future = self._pending.popleft()
        try:
            got = future.result()
        except BrokenProcessPool as exc:
            raise MeteringError(f"chunk {chunk.label()}: a worker process died ({exc}); "
                                "nothing written for this chunk") from None
        self._submit()  # keep `jobs` parts in flight while this one is written
        if isinstance(got, _Failure):
            if got.cls is None:
                raise MeteringError(f"chunk {chunk.label()}: worker process {got.pid} failed: "
                                    f"{got.message}", ExitCode(got.code))
            try:
                raise got.cls(got.message, ExitCode(got.code))
            except TypeError:  # a subclass with another constructor
                raise MeteringError(got.message, ExitCode(got.code)) from None
        self.fetched_by.setdefault(chunk, []).append(got.pid)
        if got.grouped:
            self._staged.add(chunk)
        if got.stats is not None:
            self._stats[got.pid] = got.stats
        if got.series:  # the next chunks' slices sized by what answers held
            self.inner.planner.learn_series(got.series)
        self._queries += got.queries
        s = self.inner.screened
        for hour, n in got.dropped.items():
            s.drop(hour, n)
        for key, n in got.foreign.items():  # series seen by several workers count once
            s.foreign[key] = max(s.foreign.get(key, 0), n)
        if got.unchecked and not s.unchecked:
            s.unchecked = got.unchecked
        return got
