"""Progress of a long stage (ingest, pricing, report) on stderr: a redrawn bar with a rate and
an ETA on a terminal, one line per step in logs (CronJob output), nothing when quiet."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

from metering import interrupt


def _eta(seconds: float) -> str:
    s = round(seconds)
    if s >= 3600:
        return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"
    return f"{s // 60}:{s % 60:02d}"


def _count(n: float) -> str:
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if n >= div:
            return f"{n / div:.1f}{suffix}"
    return f"{n:.0f}"


class Progress:
    """Steps done / total with an ETA from the mean step time so far, and the rate of
    whatever the steps produce (fact rows, charge rows) when they report an amount."""

    WIDTH = 30

    def __init__(self, total: int, stream: TextIO | None = None, quiet: bool = False,
                 tty: bool | None = None, clock: Callable[[], float] = time.monotonic,
                 stage: str = "meter", unit: str = "chunk", logs: bool = True) -> None:
        self.total = total
        self.done = 0
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        # `logs`: one line per step when not on a terminal; off for stages whose steps are
        # too small to be worth a log line.
        self.quiet = quiet or (not self.tty and not logs)
        self.clock = clock
        self.started = clock()
        self.stage, self.unit = stage, unit
        self.amount = 0.0
        self.what = ""

    def eta_seconds(self, now: float | None = None) -> float | None:
        if self.done == 0:
            return None
        now = self.clock() if now is None else now
        per_step = (now - self.started) / self.done
        return per_step * (self.total - self.done)

    def _rate(self, now: float) -> str:
        if not self.what or now <= self.started:
            return ""
        return f"{_count(self.amount / (now - self.started))} {self.what}/s"

    def chunk_done(self, label: str, detail: str = "", amount: float = 0,
                   what: str = "") -> None:
        """One step done; `amount` of `what` (e.g. 120000 "fact rows") feeds the rate."""
        interrupt.check()  # a Ctrl-C swallowed inside the step stops the run here
        self.done += 1
        self.amount += amount
        self.what = what or self.what
        if self.quiet:
            return
        now = self.clock()
        eta = self.eta_seconds(now)
        eta_text = f"ETA {_eta(eta)}" if eta is not None and self.done < self.total else "done"
        rate = self._rate(now) if self.what else ""
        if self.tty:
            filled = self.WIDTH * self.done // max(self.total, 1)
            bar = "#" * filled + "." * (self.WIDTH - filled)
            end = "\n" if self.done >= self.total else ""
            shown = f"{rate}  " if rate else ""
            self.stream.write(f"\r\x1b[K{self.stage} [{bar}] {self.done}/{self.total} "
                              f"{self.unit}s  {shown}{eta_text}{end}")
        else:
            inner = ", ".join(x for x in (detail, rate) if x)
            extra = f" ({inner})" if inner else ""
            self.stream.write(f"{self.stage}: {self.unit} {self.done}/{self.total} {label}"
                              f"{extra}, {eta_text}\n")
        self.stream.flush()

    def message(self, text: str) -> None:
        """A line that must not be lost in the bar (warnings, verbose details)."""
        if self.quiet:
            return
        if self.tty and 0 < self.done < self.total:
            self.stream.write("\r\x1b[K")
        self.stream.write(text + "\n")
        self.stream.flush()
