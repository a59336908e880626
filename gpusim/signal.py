"""Values that vary over scenario time: a constant, a sine, or steps."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Signal:
    """A value over scenario time t (seconds): a constant, a sine, or steps.

    sine: min + (max - min) * (1 + sin(2π (t + phase) / period)) / 2
    steps: the value of the last step whose time is <= t (the first value before it).
    """

    kind: str  # const | sine | steps
    value: float = 0.0
    lo: float = 0.0
    hi: float = 0.0
    period: float = 1.0
    phase: float = 0.0
    times: tuple[float, ...] = ()
    values: tuple[float, ...] = ()

    @staticmethod
    def const(value: float) -> Signal:
        return Signal("const", value=value)

    def at(self, t: float) -> float:
        if self.kind == "const":
            return self.value
        if self.kind == "sine":
            s = math.sin(2.0 * math.pi * (t + self.phase) / self.period)
            return self.lo + (self.hi - self.lo) * (1.0 + s) / 2.0
        i = int(np.searchsorted(self.times, t, side="right")) - 1
        return self.values[max(i, 0)]

    def at_many(self, ts: FloatArray) -> FloatArray:
        if self.kind == "const":
            return np.full(ts.shape, self.value, dtype=np.float64)
        if self.kind == "sine":
            s = np.sin(2.0 * np.pi * (ts + self.phase) / self.period)
            out: FloatArray = self.lo + (self.hi - self.lo) * (1.0 + s) / 2.0
            return out
        idx = np.searchsorted(np.asarray(self.times), ts, side="right") - 1
        picked: FloatArray = np.asarray(self.values, dtype=np.float64)[np.maximum(idx, 0)]
        return picked

    @property
    def maximum(self) -> float:
        if self.kind == "const":
            return self.value
        if self.kind == "sine":
            return max(self.lo, self.hi)
        return max(self.values)
