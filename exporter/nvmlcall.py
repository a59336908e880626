"""One place that decides what an NVML error means for a reading.

NOT_SUPPORTED (and its cousins) is normal: the value is simply absent. GPU_IS_LOST marks the GPU
lost for this cycle. Anything else drops that one value and counts as a collector failure.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")


class GpuLost(Exception):
    """The GPU answered NVML_ERROR_GPU_IS_LOST: it fell off the bus."""


def text(value: object) -> str:
    """pynvml returns bytes from older bindings and str from newer ones."""
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)


class Reader:
    """Wraps NVML calls for one collector run and remembers whether any failed."""

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        self.failures = 0
        self._absent = {
            getattr(nvml, name)
            for name in ("NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_NOT_FOUND",
                         "NVML_ERROR_FUNCTION_NOT_FOUND", "NVML_ERROR_INVALID_ARGUMENT",
                         "NVML_ERROR_NO_DATA")
            if hasattr(nvml, name)
        }
        self._lost = getattr(nvml, "NVML_ERROR_GPU_IS_LOST", 15)

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T | None:
        try:
            return fn(*args, **kwargs)
        except self.nvml.NVMLError as err:
            code = getattr(err, "value", None)
            if code == self._lost:
                raise GpuLost(str(err)) from err
            if code not in self._absent:
                self.failures += 1
                log.debug("NVML %s failed: %s", getattr(fn, "__name__", fn), err)
            return None
