"""The prefetcher hands over what its producer yields, in order, with the producer's error
where it happened, and stops its thread when closed, even a producer waiting on a full queue
or still inside a slow call."""

from __future__ import annotations

import threading
import time
from collections.abc import Generator

import pytest
from waiting import wait_until

from metering.prefetch import Prefetcher


def test_items_in_order_then_the_producers_error() -> None:
    def produce() -> Generator[int, None, None]:
        yield from range(5)
        raise ValueError("store gone")

    it = Prefetcher(produce(), depth=2)
    got = [next(it) for _ in range(5)]
    with pytest.raises(ValueError, match="store gone"):
        next(it)
    assert got == [0, 1, 2, 3, 4]
    with pytest.raises(StopIteration):  # finished: no item, no second error
        next(it)
    it.close()


def test_the_producer_runs_at_most_depth_items_ahead() -> None:
    made: list[int] = []

    def produce() -> Generator[int, None, None]:
        for i in range(100):
            made.append(i)
            yield i

    it = Prefetcher(produce(), depth=3)
    wait_until(lambda: len(made) >= 4, "the producer to fill the queue")
    time.sleep(0.3)
    # 3 queued and one more made, waiting to be queued
    assert len(made) == 4
    assert next(it) == 0
    wait_until(lambda: len(made) == 5, "the producer to make one more")
    it.close()
    assert list(it) == []


def test_the_producer_runs_at_most_max_bytes_ahead_but_one_item_always_passes() -> None:
    made: list[int] = []

    def produce() -> Generator[int, None, None]:
        for size in (40, 50, 30, 500, 10, 10):
            made.append(size)
            yield size

    it = Prefetcher(produce(), depth=10, max_bytes=100, size=lambda n: n)
    wait_until(lambda: len(made) >= 3, "the producer to fill the queue")
    time.sleep(0.3)
    assert len(made) == 3  # 40 + 50 queued; 30 made, over 100 bytes, waits
    assert next(it) == 40
    wait_until(lambda: len(made) == 4, "the 30 to be queued and the 500 made")
    time.sleep(0.3)
    assert len(made) == 4  # 50 + 30 queued, the 500 waits until the queue is empty
    assert [next(it), next(it)] == [50, 30]
    assert list(it) == [500, 10, 10]  # alone in the queue, the 500 passes
    it.close()


def test_close_stops_a_producer_waiting_on_a_full_queue() -> None:
    cleaned = threading.Event()

    def produce() -> Generator[int, None, None]:
        try:
            i = 0
            while True:
                yield i
                i += 1
        finally:
            cleaned.set()

    it = Prefetcher(produce(), depth=1)
    assert next(it) == 0
    it.close()
    wait_until(lambda: not it.alive, "the producer thread to end")
    assert cleaned.is_set()  # its finally ran (a generator holding connections closes them)


def test_close_does_not_wait_for_a_slow_call() -> None:
    release = threading.Event()

    def produce() -> Generator[int, None, None]:
        release.wait(30)  # a request the store has not answered yet
        yield 1

    it = Prefetcher(produce(), depth=1, join_s=0.2)
    t0 = time.monotonic()
    it.close()
    assert time.monotonic() - t0 < 5
    release.set()
    wait_until(lambda: not it.alive, "the producer thread to end once its call returns")
