"""Ctrl-C (SIGINT) during a metering command: stop within moments, at any point, and end with
the command's one documented line and exit 130 (metering.errors.ExitCode.INTERRUPTED).

Python's own KeyboardInterrupt is not enough: DuckDB checks for signals itself while a query
runs and turns the KeyboardInterrupt into `RuntimeError: Query interrupted` (or an Arrow
scan's error), after which the open transaction is already gone and a ROLLBACK fails too; a
caller that handles errors may even carry on. So `trap()` records the interrupt, interrupts
the running query of every ledger connection `watch()` registered, and raises
KeyboardInterrupt; the command's top level then asks `trap.hit`, not the exception's type,
whether this was an interrupt.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType
from typing import Any

_watched: list[Any] = []  # DuckDB connections whose queries an interrupt stops


@dataclass
class Trap:
    hit: bool = False  # a SIGINT arrived while the trap was set


_current: Trap | None = None


@contextmanager
def trap(then_ignore: bool = False) -> Iterator[Trap]:
    """Handle SIGINT while the block runs (main thread only; elsewhere a no-op trap); then
    restore the previous handler, or with `then_ignore` ignore SIGINT from then on, with no
    moment between the two: the command's work is over and its status decided, and a Ctrl-C
    while the interpreter shuts down would otherwise kill it by signal (exit -2)."""
    global _current
    caught = Trap()
    if threading.current_thread() is not threading.main_thread():
        yield caught
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        caught.hit = True
        for con in list(_watched):
            with contextlib.suppress(Exception):  # a closed one has nothing to stop
                con.interrupt()
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, handler)
    _current = caught
    try:
        yield caught
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN if then_ignore else previous)
        _current = None


def check() -> None:
    """Raise KeyboardInterrupt when a trapped SIGINT was swallowed on its way up (e.g. by
    DuckDB inside a scan): called between units of work, so the run stops at the next one."""
    if _current is not None and _current.hit:
        raise KeyboardInterrupt


@contextmanager
def watch(con: Any) -> Iterator[None]:
    """Let a trapped SIGINT interrupt `con`'s running query while the block runs."""
    _watched.append(con)
    try:
        yield
    finally:
        _watched.remove(con)
