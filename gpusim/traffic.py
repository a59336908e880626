"""PCIe and NVLink traffic of a simulated GPU: a rate proportional to the GPU's utilisation,
so a busy GPU moves data and an idle one does not. Cumulative bytes are integrals over
scenario time (pure in t); NVML's rate calls are the mean over an interval or the rate now.
A link that is down (an `nvlink_down` fault) carries nothing while it is down."""

from __future__ import annotations

import math
from collections.abc import Callable
from enum import Enum

from gpusim.model import Scenario

MIB = 1 << 20
GIB = 1 << 30


class Direction(Enum):
    TX = "tx"  # from the GPU
    RX = "rx"  # to the GPU


# Bytes per second at full utilisation: different per direction so a swapped TX/RX shows.
PCIE_PEAK = {Direction.TX: 1.0 * GIB, Direction.RX: 4.0 * GIB}
NVLINK_LINK_PEAK = {Direction.TX: 8.0 * GIB, Direction.RX: 10.0 * GIB}


class Traffic:
    """`busy(gpu, t)`: the integral of the GPU's utilisation from 0 to t, in seconds."""

    def __init__(self, scenario: Scenario, busy: Callable[[int, float], float]) -> None:
        self._busy = busy
        self._links = {g.index: g.nvlink_links for g in scenario.gpus}
        # per (gpu, link): merged down windows [(from, until)]
        self._down: dict[tuple[int, int], list[tuple[float, float]]] = {}
        for f in sorted(scenario.faults, key=lambda f: f.at):
            if f.kind != "nvlink_down":
                continue
            windows = self._down.setdefault((f.gpu, f.link), [])
            until = math.inf if f.until is None else f.until
            if windows and f.at <= windows[-1][1]:
                windows[-1] = (windows[-1][0], max(windows[-1][1], until))
            else:
                windows.append((f.at, until))

    def busy_seconds(self, gpu: int, t: float) -> float:
        return self._busy(gpu, max(0.0, t))

    def pcie_bytes(self, gpu: int, direction: Direction, t: float) -> float:
        return PCIE_PEAK[direction] * self.busy_seconds(gpu, t)

    def link_bytes(self, gpu: int, link: int, direction: Direction, t: float) -> float:
        """Bytes over one link from 0 to t; nothing while the link was down."""
        busy = self.busy_seconds(gpu, t)
        for start, until in self._down.get((gpu, link), ()):
            if start < t:
                busy -= self.busy_seconds(gpu, min(t, until)) - self.busy_seconds(gpu, start)
        return NVLINK_LINK_PEAK[direction] * max(0.0, busy)

    def link_up(self, gpu: int, link: int, t: float) -> bool:
        return not any(start <= t < until for start, until in self._down.get((gpu, link), ()))

    def nvlink_bytes(self, gpu: int, direction: Direction, t: float) -> float:
        """Bytes over all the GPU's links from 0 to t."""
        return sum(self.link_bytes(gpu, link, direction, t) for link in range(self._links[gpu]))
