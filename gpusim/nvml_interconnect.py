"""Simulated NVML: PCIe throughput (the pre-GPM call). NVLink byte counters are field values
(gpusim/nvml_reliability.py); GPM's PCIe/NVLink rates are in gpusim/nvml_gpm.py. All three
read the same traffic model (gpusim/traffic.py)."""

from __future__ import annotations

import pynvml

from gpusim.nvml_core import NvmlCore, SimDevice, nvml_error
from gpusim.traffic import PCIE_PEAK, Direction

_COUNTERS = {pynvml.NVML_PCIE_UTIL_TX_BYTES: Direction.TX,
             pynvml.NVML_PCIE_UTIL_RX_BYTES: Direction.RX}


class InterconnectQueries(NvmlCore):
    def nvmlDeviceGetPcieThroughput(self, handle: SimDevice, counter: int) -> int:
        """PCIe rate now (the driver measures over 20 ms), in KB/s = 1024 bytes/s."""
        gpu, _, t = self._dev(handle, "pcie_throughput")
        direction = _COUNTERS.get(counter)
        if direction is None:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return round(PCIE_PEAK[direction] * self._reading(gpu, t).util / 1024)
