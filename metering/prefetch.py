"""Run a producer a few items ahead of its consumer, in a thread.

Ingest spends about a third of its wall time waiting for the store to answer (the store
works, the client idles) and the rest decoding answers and writing facts (the client works,
the store idles). Sending the next queries while the current answers are decoded overlaps
the two; a bounded queue keeps at most `depth` undecoded answers, and at most `max_bytes` of
them, in memory.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")

_STOP_POLL_S = 0.1  # how often a producer waiting on a full queue checks for close()


@dataclass(frozen=True)
class _Item(Generic[T]):
    value: T


@dataclass(frozen=True)
class _Failed:
    exc: BaseException


class _End:
    pass


class Prefetcher(Generic[T]):
    """Iterates over what `items` yields, produced in a daemon thread at most `depth` items
    ahead, and at most `max_bytes` ahead where `size` tells an item's bytes (one item is
    always let through, whatever its size). An exception of the producer is raised to the
    consumer where it happened in the sequence (items before it are delivered first).
    `close()` stops the producer at its next item; a producer blocked in I/O is not waited
    for beyond `join_s`."""

    def __init__(self, items: Generator[T, None, None], depth: int = 2,
                 join_s: float = 1.0, max_bytes: int | None = None,
                 size: Callable[[T], int] | None = None) -> None:
        self._queue: deque[tuple[_Item[T] | _Failed | _End, int]] = deque()
        self._depth = max(1, depth)
        self._max_bytes = max_bytes
        self._size = size
        self._bytes = 0  # of the queued items
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._finished = False
        self._join_s = join_s
        self._thread = threading.Thread(target=self._run, args=(items,), daemon=True,
                                        name="gpu-ledger-prefetch")
        self._thread.start()

    def _run(self, items: Generator[T, None, None]) -> None:
        try:
            for value in items:
                if not self._put(_Item(value)):
                    return
        except BaseException as exc:  # handed to the consumer, which raises it
            self._put(_Failed(exc))
            return
        finally:
            items.close()
        self._put(_End())

    def _fits(self, n: int) -> bool:
        if not self._queue:
            return True
        if len(self._queue) >= self._depth:
            return False
        return self._max_bytes is None or self._bytes + n <= self._max_bytes

    def _put(self, entry: _Item[T] | _Failed | _End) -> bool:
        n = self._size(entry.value) if self._size is not None and isinstance(entry, _Item) \
            else 0
        with self._cond:
            while not self._stop.is_set():
                if self._fits(n):
                    self._queue.append((entry, n))
                    self._bytes += n
                    self._cond.notify_all()
                    return True
                self._cond.wait(_STOP_POLL_S)
        return False

    def __iter__(self) -> Iterator[T]:
        return self

    def __next__(self) -> T:
        if self._finished:
            raise StopIteration
        with self._cond:
            while not self._queue:
                self._cond.wait()
            entry, n = self._queue.popleft()
            self._bytes -= n
            self._cond.notify_all()
        if isinstance(entry, _Item):
            return entry.value
        self._finished = True
        if isinstance(entry, _Failed):
            raise entry.exc
        raise StopIteration

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def close(self) -> None:
        """Stop the producer; idempotent."""
        self._stop.set()
        self._finished = True
        self._thread.join(timeout=self._join_s)
