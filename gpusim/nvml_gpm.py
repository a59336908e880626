"""Simulated NVML: GPM (GPU performance monitoring) support, samples and metrics."""

from __future__ import annotations

import ctypes
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pynvml

from gpusim.model import GpuSpec, Scenario
from gpusim.nvml_core import NvmlCore, SimDevice, nvml_error
from gpusim.traffic import MIB, Direction

_GPM_METRICS = (pynvml.NVML_GPM_METRIC_SM_UTIL, pynvml.NVML_GPM_METRIC_SM_OCCUPANCY,
                pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL, pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL)


@dataclass
class GpmSample:
    buffer: Any  # keeps the memory the handed-out pointer points at alive
    gpu: int = -1
    gpu_instance: int | None = None
    t: float = math.nan


class GpmQueries(NvmlCore):
    """GPM samples taken at scenario times, metrics computed between two of them."""

    def __init__(self, scenario: Scenario, clock: Callable[[], float] = time.time,
                 start: float | None = None, no_driver_until: float | None = None) -> None:
        super().__init__(scenario, clock, start, no_driver_until)
        self._gpm: dict[int, GpmSample] = {}

    def nvmlGpmQueryDeviceSupport(self, handle: SimDevice) -> Any:
        gpu, _, t = self._dev(handle)
        support = pynvml.c_nvmlGpmSupport_t()
        support.version = pynvml.NVML_GPM_SUPPORT_VERSION
        support.isSupportedDevice = int(gpu.gpm and not self._unsupported(gpu, "gpm", t))
        return support

    def nvmlGpmSampleAlloc(self) -> Any:
        self._check_init()
        buffer = ctypes.create_string_buffer(16)
        ptr = ctypes.cast(buffer, pynvml.c_nvmlGpmSample_t)
        with self._lock:
            self._gpm[ctypes.addressof(buffer)] = GpmSample(buffer)
        return ptr

    def _gpm_sample(self, ptr: Any) -> GpmSample:
        address = ctypes.cast(ptr, ctypes.c_void_p).value if ptr is not None else None
        sample = self._gpm.get(address or 0)
        if sample is None:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return sample

    def nvmlGpmSampleFree(self, ptr: Any) -> None:
        self._check_init()
        with self._lock:
            self._gpm_sample(ptr)
            del self._gpm[ctypes.cast(ptr, ctypes.c_void_p).value or 0]

    def nvmlGpmSampleGet(self, handle: SimDevice, ptr: Any) -> Any:
        return self._gpm_take(handle, None, ptr)

    def nvmlGpmMigSampleGet(self, handle: SimDevice, gpu_instance_id: int,
                            ptr: Any) -> Any:
        return self._gpm_take(handle, gpu_instance_id, ptr)

    def _gpm_take(self, handle: SimDevice, gi: int | None, ptr: Any) -> Any:
        gpu, _, t = self._dev(handle)
        if not gpu.gpm or self._unsupported(gpu, "gpm", t):
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if gi is not None and not any(m.gpu_instance_id == gi for m in gpu.mig or ()):
            raise nvml_error(pynvml.NVML_ERROR_NOT_FOUND)
        with self._lock:
            sample = self._gpm_sample(ptr)
            sample.gpu, sample.gpu_instance, sample.t = gpu.index, gi, t
        return ptr

    def nvmlGpmMetricsGet(self, request: Any) -> Any:
        self._check_init()
        if request.version != pynvml.NVML_GPM_METRICS_GET_VERSION:
            raise nvml_error(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        with self._lock:
            s1, s2 = self._gpm_sample(request.sample1), self._gpm_sample(request.sample2)
        if s1.gpu < 0 or s1.gpu != s2.gpu or s1.gpu_instance != s2.gpu_instance:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu = self.scenario.gpus[s1.gpu]
        if self.now() >= self._lost_at.get(gpu.index, math.inf):
            raise nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)
        lo, hi = sorted((s1.t, s2.t))
        # a GPM metric is an average over the interval between the two samples
        points = [lo + (hi - lo) * (i + 0.5) / 5 for i in range(5)] if hi > lo else [hi]
        mig = None
        if s1.gpu_instance is not None:
            mig = next(m.index for m in gpu.mig or () if m.gpu_instance_id == s1.gpu_instance)
        totals = dict.fromkeys(_GPM_METRICS, 0.0)
        for t in points:
            for metric, value in self._gpm_values(gpu, mig, t).items():
                totals[metric] += value / len(points)
        if mig is None:  # the simulator gives no per-instance PCIe/NVLink figures
            totals.update(self._gpm_traffic(gpu, lo, hi))
        for i in range(int(request.numMetrics)):
            m = request.metrics[i]
            if m.metricId in totals:
                m.value = totals[m.metricId]
                m.nvmlReturn = pynvml.NVML_SUCCESS
            else:
                m.value = 0.0
                m.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        return request

    def _gpm_traffic(self, gpu: GpuSpec, lo: float, hi: float) -> dict[int, float]:
        """Mean PCIe/NVLink rates between two samples, in MiB/s as NVML gives them."""
        if hi <= lo:
            return {}
        out: dict[int, float] = {}
        tr = self.traffic
        if not self._unsupported(gpu, "pcie_throughput", hi):
            for metric, d in ((pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC, Direction.TX),
                              (pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC, Direction.RX)):
                out[metric] = (tr.pcie_bytes(gpu.index, d, hi)
                               - tr.pcie_bytes(gpu.index, d, lo)) / (hi - lo) / MIB
        if gpu.nvlink_links and not self._unsupported(gpu, "nvlink_throughput", hi):
            for metric, d in ((pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC, Direction.TX),
                              (pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC, Direction.RX)):
                out[metric] = (tr.nvlink_bytes(gpu.index, d, hi)
                               - tr.nvlink_bytes(gpu.index, d, lo)) / (hi - lo) / MIB
        return out

    def _gpm_values(self, gpu: GpuSpec, mig: int | None, t: float) -> dict[int, float]:
        r = self._reading(gpu, t, mig)
        sm = r.util if mig is None else min(1.0, r.proc_util)
        return {pynvml.NVML_GPM_METRIC_SM_UTIL: 100.0 * sm,
                pynvml.NVML_GPM_METRIC_SM_OCCUPANCY: 70.0 * sm,
                pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: 100.0 * r.tensor_util,
                pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: 100.0 * r.mem_util}
