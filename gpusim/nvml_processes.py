"""Simulated NVML: running processes per device or MIG instance, and per-process utilisation."""

from __future__ import annotations

from typing import Any

import pynvml

from gpusim.model import NOT_MIG, GpuSpec
from gpusim.node import SimProcess
from gpusim.nvml_core import NvmlCore, SimDevice, nvml_error

PROCESS_SAMPLE_PERIOD_US = 1_000_000  # the driver's utilisation sample period
UTILIZATION_BUFFER = 20  # samples the driver keeps (an assumption: NVML does not document it)


class ProcessQueries(NvmlCore):
    """The scenario's processes at the current time, as NVML lists them."""

    def _proc_ids(self, gpu: GpuSpec, p: SimProcess) -> tuple[int, int]:
        if gpu.mig is None or p.mig is None:
            return NOT_MIG, NOT_MIG
        m = gpu.mig[p.mig]
        return m.gpu_instance_id, m.compute_instance_id

    def nvmlDeviceGetComputeRunningProcesses(self, handle: SimDevice) -> list[Any]:
        gpu, mig, t = self._dev(handle, mig_ok=True)
        procs = self._reading(gpu, t, None if mig is None else mig.index).procs
        out = []
        for p in procs:
            gi, ci = self._proc_ids(gpu, p)
            out.append(pynvml.c_nvmlProcessInfo_t(pid=p.pid, usedGpuMemory=p.memory_bytes,
                                                  gpuInstanceId=gi, computeInstanceId=ci))
        return out

    nvmlDeviceGetComputeRunningProcesses_v2 = nvmlDeviceGetComputeRunningProcesses
    nvmlDeviceGetComputeRunningProcesses_v3 = nvmlDeviceGetComputeRunningProcesses

    def nvmlDeviceGetMPSComputeRunningProcesses(self, handle: SimDevice) -> list[Any]:
        gpu, mig, _ = self._dev(handle, mig_ok=True)
        sharing = mig.sharing if mig is not None else gpu.sharing
        return self.nvmlDeviceGetComputeRunningProcesses(handle) if sharing.mode == "mps" else []

    nvmlDeviceGetMPSComputeRunningProcesses_v3 = nvmlDeviceGetMPSComputeRunningProcesses

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: SimDevice) -> list[Any]:
        self._dev(handle, mig_ok=True)
        return []

    nvmlDeviceGetGraphicsRunningProcesses_v3 = nvmlDeviceGetGraphicsRunningProcesses

    def _sample_stamps(self, last_seen_us: int) -> list[int]:
        """Stamps (us) of the driver's sample periods newer than last_seen_us, oldest first,
        at most UTILIZATION_BUFFER of them: what NVML still holds."""
        newest = int(self._clock() * 1e6) // PROCESS_SAMPLE_PERIOD_US * PROCESS_SAMPLE_PERIOD_US
        count = min(UTILIZATION_BUFFER, (newest - last_seen_us) // PROCESS_SAMPLE_PERIOD_US)
        return [newest - i * PROCESS_SAMPLE_PERIOD_US for i in reversed(range(count))]

    def nvmlDeviceGetProcessUtilization(self, handle: SimDevice,
                                        last_seen_us: int) -> list[Any]:
        gpu, _, _ = self._dev(handle, "process_utilization")
        if gpu.mig is not None:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        out = []
        for stamp in self._sample_stamps(last_seen_us):
            r = self._reading(gpu, stamp / 1e6 - self.start)
            # per-process shares of a busy GPU add up to at most 100%
            scale = 1.0 / r.proc_util if r.proc_util > 1.0 else 1.0
            mem_total = sum(p.mem_util for p in r.procs)
            mem_scale = 1.0 / mem_total if mem_total > 1.0 else 1.0
            out += [pynvml.c_nvmlProcessUtilizationSample_t(
                pid=p.pid, timeStamp=stamp, smUtil=round(100 * p.sm_util * scale),
                memUtil=round(100 * p.mem_util * mem_scale), encUtil=0, decUtil=0)
                for p in r.procs]
        if not out:
            raise nvml_error(pynvml.NVML_ERROR_NOT_FOUND)
        return out

    def nvmlDeviceGetSamples(self, handle: SimDevice, sampling_type: int,
                             last_seen_us: int) -> tuple[int, list[Any]]:
        """Device utilisation samples (NVML_GPU_UTILIZATION_SAMPLES, percent) on the same
        periods as the per-process samples; other sample types are not simulated."""
        gpu, _, _ = self._dev(handle, "utilization")
        if gpu.mig is not None or sampling_type != pynvml.NVML_GPU_UTILIZATION_SAMPLES:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        out = []
        for stamp in self._sample_stamps(last_seen_us):
            sample = pynvml.c_nvmlSample_t(timeStamp=stamp)
            util = self._reading(gpu, stamp / 1e6 - self.start).util
            sample.sampleValue.uiVal = round(100 * util)
            out.append(sample)
        if not out:
            raise nvml_error(pynvml.NVML_ERROR_NOT_FOUND)
        return pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, out
