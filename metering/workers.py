"""Fetch and decode chunks in worker processes, feeding the one DuckDB writer (ingest) in
this process: `meter --jobs N`.

Decoding answers into Arrow tables is Python and numpy work that holds the GIL for most of
its time, so threads would not add a core; processes do. Each worker is forked from the
parent after the source is set up (the selector settled, an OpenMetrics file parsed), so it
inherits the source and fetches whole chunks with it; the parent receives each chunk's
decoded tables in chunk order and writes them as today (one transaction per chunk, resume
and guards unchanged). At most N chunks are fetched ahead of the writer, so memory grows
with N chunks' tables.

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
from pathlib import Path
from typing import Any

import pyarrow as pa

from metering.errors import ExitCode, MeteringError
from metering.facts import signal_table
from metering.period import Period

_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def available_cores(cgroup: Path = Path("/sys/fs/cgroup")) -> int:
    """CPUs this process may run on (its affinity), fewer where a cgroup CPU quota is set
    (v2 cpu.max, v1 cpu.cfs_quota_us / cpu.cfs_period_us): a pod's `limits.cpu`."""
    cores = len(os.sched_getaffinity(0))
    quota: tuple[str, str] | None = None
    with contextlib.suppress(OSError, ValueError):
        text, length = (cgroup / "cpu.max").read_text().split()[:2]
        quota = (text, length)
    if quota is None:
        with contextlib.suppress(OSError):
            quota = ((cgroup / "cpu" / "cpu.cfs_quota_us").read_text().strip(),
                     (cgroup / "cpu" / "cpu.cfs_period_us").read_text().strip())
    if quota is not None and quota[0].lstrip("-").isdigit() and quota[1].isdigit():
        us, per = int(quota[0]), int(quota[1])
        if us > 0 and per > 0:
            cores = min(cores, math.ceil(us / per))
    return max(1, cores)


@dataclass(frozen=True)
class Fetched:
    """A chunk's decoded signals, node group by node group, and what the worker screened."""

    groups: list[dict[str, pa.Table]]
    dropped: dict[int, int]  # hour start (epoch s) -> values dropped as not plausible
    foreign: dict[tuple[str, str, str], int]
    unchecked: str
    queries: int
    pid: int
    stats: Any  # the worker's query-split statistics so far (PrometheusSource), or None


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
    after_fork = getattr(_SOURCE, "after_fork", None)
    if after_fork is not None:
        after_fork()


def _fetch(chunk: Period) -> Fetched | _Failure:
    source = _SOURCE
    try:
        before = source.queries
        groups = [{spec.name: signal_table(spec, m) for spec, m in group}
                  for group in source.fetch(chunk)]
        s = source.screened
        return Fetched(groups, s.dropped_in(int(chunk.start.timestamp()),
                                            int(chunk.end.timestamp())),
                       dict(s.foreign), s.unchecked, source.queries - before, os.getpid(),
                       copy.copy(getattr(getattr(source, "planner", None), "stats", None)))
    except MeteringError as exc:
        return _Failure(type(exc), _one_line(str(exc)), int(exc.code), os.getpid())
    except Exception as exc:  # one line for the parent, not a traceback
        return _Failure(None, _one_line(f"{type(exc).__name__}: {exc}"),
                        int(ExitCode.FAILED), os.getpid())


def _one_line(text: str) -> str:
    return " ".join(text.split())


@dataclass
class ParallelSource:
    """`source` fetched by `jobs` forked worker processes; `tables(chunk)` gives the chunk's
    signals as Arrow tables, node group by node group, in the order `prefetching` named."""

    inner: Any
    jobs: int
    fetched_by: list[int] = field(default_factory=list)  # worker pid per chunk fetched
    _worker_queries: int = 0
    _pool: ProcessPoolExecutor | None = None
    _todo: deque[Period] = field(default_factory=deque)
    _pending: deque[tuple[Period, Future[Fetched | _Failure]]] = field(default_factory=deque)
    _stats: dict[int, Any] = field(default_factory=dict)  # worker pid -> its latest stats

    def merged_stats(self, base: Any) -> Any:
        """The workers' query-split statistics (metering.queryplan.SplitStats) as one: counts
        added (less `base`, the parent's, which each worker started from), extremes kept."""
        merged = copy.copy(base)
        for stats in self._stats.values():
            for f in dataclasses.fields(stats):
                mine, theirs = getattr(merged, f.name), getattr(stats, f.name)
                if f.name.startswith(("max_", "nodes")):
                    setattr(merged, f.name, max(mine, theirs))
                elif isinstance(theirs, (bool, str)):
                    setattr(merged, f.name, mine or theirs)
                else:
                    setattr(merged, f.name, mine + theirs - getattr(base, f.name))
        return merged

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
        return int(self.inner.queries) + self._worker_queries

    def close(self) -> None:
        self.inner.close()

    def grouped(self, chunk: Period) -> bool:
        """False: a worker has fetched every group of the chunk before the writer sees
        it, so the facts are written as one group's are (the worker, not the writer, held
        the answers)."""
        return False

    @contextmanager
    def prefetching(self, chunks: Sequence[Period]) -> Iterator[None]:
        global _SOURCE
        self._todo = deque(chunks)
        if not self._todo:
            yield
            return
        _SOURCE = self.inner
        ctx = multiprocessing.get_context("fork")  # workers inherit the source as it is
        ok = False
        try:
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

    def _submit(self) -> None:
        if self._todo and self._pool is not None:
            chunk = self._todo.popleft()
            self._pending.append((chunk, self._pool.submit(_fetch, chunk)))

    def _stop(self, finished: bool) -> None:
        pool, self._pool = self._pool, None
        self._pending.clear()
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
        """The chunk's signals (name -> Arrow table) per node group, fetched by a worker."""
        if not self._pending or self._pending[0][0] != chunk:
            raise RuntimeError(f"tables({chunk.label()}): not the next prefetched chunk")
        _, future = self._pending.popleft()
        try:
            got = future.result()
        except BrokenProcessPool as exc:
            raise MeteringError(f"chunk {chunk.label()}: a worker process died ({exc}); "
                                "nothing written for this chunk") from None
        self._submit()  # keep `jobs` chunks in flight while this one is written
        if isinstance(got, _Failure):
            if got.cls is None:
                raise MeteringError(f"chunk {chunk.label()}: worker process {got.pid} failed: "
                                    f"{got.message}", ExitCode(got.code))
            try:
                raise got.cls(got.message, ExitCode(got.code))
            except TypeError:  # a subclass with another constructor
                raise MeteringError(got.message, ExitCode(got.code)) from None
        self.fetched_by.append(got.pid)
        if got.stats is not None:
            self._stats[got.pid] = got.stats
        self._worker_queries += got.queries
        s = self.inner.screened
        for hour, n in got.dropped.items():
            s.drop(hour, n)
        for key, n in got.foreign.items():  # series seen by several workers count once
            s.foreign[key] = max(s.foreign.get(key, 0), n)
        if got.unchecked and not s.unchecked:
            s.unchecked = got.unchecked
        yield from got.groups
