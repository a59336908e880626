"""A simulated NVML module: pynvml's API (functions, constants, structs, exceptions) answered
from a scenario over time, so the exporter runs unchanged on a laptop, in tests and in the demo.

Scenario time t = clock() - start. Readings are pure functions of t (energy and violation
counters are integrals over t), so a fake clock can jump a month ahead and calls stay cheap.
Errors are real `pynvml.NVMLError`s, so `except nvml.NVMLError_NotSupported` works with both.
Each group of calls lives in its own gpusim/nvml_*.py module; SimNVML puts them together.
"""

from __future__ import annotations

from typing import Any

import pynvml

from exporter.device.nvmlapi import NvmlApi
from gpusim.nvml_device import DeviceQueries
from gpusim.nvml_events import EventQueries
from gpusim.nvml_gpm import GpmQueries
from gpusim.nvml_interconnect import InterconnectQueries
from gpusim.nvml_mig import MigQueries
from gpusim.nvml_processes import ProcessQueries
from gpusim.nvml_reliability import ReliabilityQueries
from gpusim.nvml_telemetry import TelemetryQueries
from gpusim.nvml_vgpu import VgpuQueries

# Copy pynvml's constants, struct classes and exception classes, never its functions: those
# would call the real library.
_EXPORTS = {
    name: value for name, value in vars(pynvml).items()
    if not name.startswith("_") and isinstance(value, int | float | str | bytes | type)
}


class SimNVML(DeviceQueries, MigQueries, TelemetryQueries, ReliabilityQueries, ProcessQueries,
              GpmQueries, InterconnectQueries, EventQueries, VgpuQueries):
    """pynvml's API over a scenario. `no_driver_until` (scenario seconds) overrides the
    scenario's `driver.unavailable_until`: nvmlInit fails until then.

    It answers `NvmlApi`, the calls the exporter's NVML backend makes: mypy checks the methods
    against it (`as_api`). The names of NvmlApi that are not calls are declared here; the rest
    of pynvml's constants are copied below for scripts that use the module like pynvml."""

    NVMLError: type[Exception] = pynvml.NVMLError
    nvmlMemory_v2: int = pynvml.nvmlMemory_v2
    NVML_GPM_METRICS_GET_VERSION: int = pynvml.NVML_GPM_METRICS_GET_VERSION
    c_nvmlGpmMetricsGet_t: type[Any] = pynvml.c_nvmlGpmMetricsGet_t

    def as_api(self) -> NvmlApi:
        """This module as the NVML backend reads it (and the place mypy checks that it can)."""
        return self


for _name, _value in _EXPORTS.items():
    if not hasattr(SimNVML, _name):
        setattr(SimNVML, _name, _value)
