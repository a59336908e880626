"""GPU processes through NVML: the compute processes of a GPU with their memory, and their SM
utilisation from NVML's per-process samples made consistent with the device's."""

from __future__ import annotations

from collections.abc import Sequence

from exporter.device.contract import GpuRef, MigRef, ProcessSample, Tally
from exporter.device.nvmlapi import NvmlApi
from exporter.nvmlcall import GpuLost, NvmlOutcome, Reader, classify, text
from exporter.processes import reconcile

_NOT_MIG = 0xFFFFFFFF
GPU_UTILIZATION_SAMPLES = 1  # NVML_GPU_UTILIZATION_SAMPLES (nvml.h)


class NvmlProcessReader:
    def __init__(self, nvml: NvmlApi) -> None:
        self.nvml = nvml
        # NVML returns utilisation samples newer than the timestamp we pass; remembering the
        # newest one seen per GPU gives each cycle exactly the samples since the last cycle.
        self._last_seen: dict[str, int] = {}
        self._device_last_seen: dict[str, int] = {}

    def read(self, gpu: GpuRef, partitions: Sequence[MigRef], tally: Tally
             ) -> list[ProcessSample]:
        r = Reader(self.nvml, tally)
        nv = self.nvml
        procs = r.call(nv.nvmlDeviceGetComputeRunningProcesses, gpu.handle) or []
        util: dict[int, float] | None = None
        if not gpu.mig_enabled:
            util = self._utilisation(r, gpu)
            if util is not None:
                pids = {int(p.pid) for p in procs}
                util = reconcile({pid: util.get(pid, 0.0) for pid in pids},
                                 self._device_busy(r, gpu))
        mig_by_ids: dict[tuple[int, int], str] = {
            (m.gpu_instance_id, m.compute_instance_id): m.uuid
            for m in partitions if m.parent.uuid == gpu.uuid
        } if gpu.mig_enabled else {}
        out = []
        for p in procs:
            mig_uuid = ""
            gi = getattr(p, "gpuInstanceId", _NOT_MIG)
            if gpu.mig_enabled and gi != _NOT_MIG:
                mig_uuid = mig_by_ids.get((gi, getattr(p, "computeInstanceId", 0)), "")
            mem = p.usedGpuMemory
            sm = None if util is None else util.get(int(p.pid), 0.0)
            out.append(ProcessSample(int(p.pid), gpu.uuid, text(mig_uuid),
                                     float(mem or 0), sm))
        return out

    def _utilisation(self, r: Reader, gpu: GpuRef) -> dict[int, float] | None:
        """pid -> SM utilisation (0-1): its mean over the sample periods since the last cycle,
        a period without a sample of the process counting as 0 (so a process that computes in
        bursts reads its average, not its newest sample). NOT_FOUND means no process ran a
        kernel since then: every process is idle (0), not unknown."""
        nv = self.nvml
        try:
            samples = nv.nvmlDeviceGetProcessUtilization(gpu.handle,
                                                         self._last_seen.get(gpu.uuid, 0))
        except nv.NVMLError as err:
            outcome = classify(err)
            if outcome is NvmlOutcome.NO_DATA:
                return {}
            if outcome is NvmlOutcome.LOST:
                raise GpuLost(str(err)) from err
            if not outcome.absent:
                r.failures += 1
            return None
        sums: dict[int, int] = {}  # pid -> whole percents summed
        periods = {int(s.timeStamp) for s in samples}
        for s in samples:
            sums[int(s.pid)] = sums.get(int(s.pid), 0) + int(s.smUtil)
        if periods:
            self._last_seen[gpu.uuid] = max(periods)
        return {pid: total / max(1, len(periods)) / 100.0 for pid, total in sums.items()}

    def _device_busy(self, r: Reader, gpu: GpuRef) -> float | None:
        """The device's utilisation (0-1), the mean of its samples since the last cycle (the
        same periods as the per-process samples); None where NVML gives none."""
        nv = self.nvml
        try:
            _, samples = nv.nvmlDeviceGetSamples(gpu.handle, GPU_UTILIZATION_SAMPLES,
                                                 self._device_last_seen.get(gpu.uuid, 0))
        except nv.NVMLError as err:
            outcome = classify(err)
            if outcome is NvmlOutcome.LOST:
                raise GpuLost(str(err)) from err
            if not outcome.absent:
                r.failures += 1
            return None
        if not samples:
            return None
        self._device_last_seen[gpu.uuid] = max(int(s.timeStamp) for s in samples)
        busy: int = sum(int(s.sampleValue.uiVal) for s in samples)
        return busy / len(samples) / 100.0
