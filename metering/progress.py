"""Ingest progress on stderr: a redrawn bar on a terminal, one line per chunk in logs."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO


def _eta(seconds: float) -> str:
    s = round(seconds)
    if s >= 3600:
        return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"
    return f"{s // 60}:{s % 60:02d}"


class Progress:
    """Chunks done / total with an ETA from the mean chunk time so far."""

    WIDTH = 30

    def __init__(self, total: int, stream: TextIO | None = None, quiet: bool = False,
                 tty: bool | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.total = total
        self.done = 0
        self.stream = stream if stream is not None else sys.stderr
        self.quiet = quiet
        self.tty = self.stream.isatty() if tty is None else tty
        self.clock = clock
        self.started = clock()

    def eta_seconds(self) -> float | None:
        if self.done == 0:
            return None
        per_chunk = (self.clock() - self.started) / self.done
        return per_chunk * (self.total - self.done)

    def chunk_done(self, label: str, detail: str = "") -> None:
        self.done += 1
        if self.quiet:
            return
        eta = self.eta_seconds()
        eta_text = f"ETA {_eta(eta)}" if eta is not None and self.done < self.total else "done"
        if self.tty:
            filled = self.WIDTH * self.done // max(self.total, 1)
            bar = "#" * filled + "." * (self.WIDTH - filled)
            end = "\n" if self.done >= self.total else ""
            self.stream.write(f"\r\x1b[Kmeter [{bar}] {self.done}/{self.total} chunks  "
                              f"{eta_text}{end}")
        else:
            extra = f" ({detail})" if detail else ""
            self.stream.write(f"meter: chunk {self.done}/{self.total} {label}{extra}, "
                              f"{eta_text}\n")
        self.stream.flush()

    def message(self, text: str) -> None:
        """A line that must not be lost in the bar (warnings, verbose details)."""
        if self.quiet:
            return
        if self.tty and 0 < self.done < self.total:
            self.stream.write("\r\x1b[K")
        self.stream.write(text + "\n")
        self.stream.flush()
