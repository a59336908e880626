"""One place that decides what an NVML error means for a reading.

NOT_SUPPORTED (and its cousins) is normal: the value is simply absent. NOT_FOUND / NO_DATA means
there is nothing to report right now (no process sampled, no MIG instance in a slot). GPU_IS_LOST
marks the GPU lost for this cycle. TIMEOUT is an event wait that saw nothing. Anything else drops
that one value and counts as a collector failure. The collectors, the inventory and
`gpu-ledger doctor` all classify through `classify`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from enum import Enum
from typing import Any, TypeVar

from exporter.device.contract import DeviceLost, Tally
from exporter.device.nvmlapi import NvmlApi

log = logging.getLogger(__name__)
T = TypeVar("T")


class NvmlOutcome(Enum):
    UNSUPPORTED = "unsupported"  # this GPU/driver has no such value: absent, not a failure
    NO_DATA = "no_data"  # nothing to report right now: absent, not a failure
    LOST = "lost"  # the GPU fell off the bus
    TIMEOUT = "timeout"  # an event wait that saw no event
    FAILED = "failed"  # anything else: the value is dropped and the collector failed

    @property
    def absent(self) -> bool:
        return self in (NvmlOutcome.UNSUPPORTED, NvmlOutcome.NO_DATA)


# NVML return codes (nvml.h); pynvml and the simulated NVML use the same numbers.
_OUTCOMES = {
    3: NvmlOutcome.UNSUPPORTED,  # NVML_ERROR_NOT_SUPPORTED
    2: NvmlOutcome.UNSUPPORTED,  # NVML_ERROR_INVALID_ARGUMENT (e.g. a link that does not exist)
    13: NvmlOutcome.UNSUPPORTED,  # NVML_ERROR_FUNCTION_NOT_FOUND (older driver)
    6: NvmlOutcome.NO_DATA,  # NVML_ERROR_NOT_FOUND
    21: NvmlOutcome.NO_DATA,  # NVML_ERROR_NO_DATA
    15: NvmlOutcome.LOST,  # NVML_ERROR_GPU_IS_LOST
    10: NvmlOutcome.TIMEOUT,  # NVML_ERROR_TIMEOUT
}


def error_code(err: BaseException) -> int:
    return int(getattr(err, "value", -1))


def classify(err: BaseException) -> NvmlOutcome:
    return classify_code(error_code(err))


def classify_code(code: int) -> NvmlOutcome:
    """The outcome of an NVML return code (a per-entry nvmlReturn of a batched call)."""
    return _OUTCOMES.get(code, NvmlOutcome.FAILED)


# NVML_ERROR_GPU_IS_LOST is the contract's DeviceLost; the old name stays for NVML code.
GpuLost = DeviceLost


def text(value: object) -> str:
    """pynvml returns bytes from older bindings and str from newer ones."""
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)


def field_value(fv: Any) -> float:
    """Decode an nvmlFieldValue_t by its valueType (double, uint, ulong, ulonglong, sll...)."""
    kind = getattr(fv, "valueType", 1)
    attr = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal",
            6: "usVal"}.get(kind, "uiVal")
    return float(getattr(fv.value, attr))


class Reader:
    """Wraps NVML calls for one collector run and counts the ones that failed (in `tally`,
    when the backend was handed one by a collector)."""

    def __init__(self, nvml: NvmlApi, tally: Tally | None = None) -> None:
        self.nvml = nvml
        self.tally = Tally() if tally is None else tally

    @property
    def failures(self) -> int:
        return self.tally.failures

    @failures.setter
    def failures(self, value: int) -> None:
        self.tally.failures = value

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T | None:
        try:
            return fn(*args, **kwargs)
        except self.nvml.NVMLError as err:
            outcome = classify(err)
            if outcome is NvmlOutcome.LOST:
                raise GpuLost(str(err)) from err
            if not outcome.absent:
                self.failures += 1
                log.debug("NVML %s failed: %s", getattr(fn, "__name__", fn), err)
            return None

    def check(self, code: int, what: str) -> bool:
        """Judge one entry of a batched call (nvmlReturn of a field value or GPM metric) like
        `call` judges an exception: True when it holds a value."""
        outcome = classify_code(code)
        if outcome is NvmlOutcome.LOST:
            raise GpuLost(f"{what}: GPU is lost")
        if code != 0 and not outcome.absent:
            self.failures += 1
            log.debug("NVML %s failed with code %d", what, code)
        return code == 0
