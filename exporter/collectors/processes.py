"""GPU processes with memory and SM utilisation. Emits nothing itself: it fills
ctx.processes for the attribution collector, which owns the per-container and per-process
families (they need pod labels)."""

from __future__ import annotations

from typing import Any

from exporter.collectors.base import NvmlCollector, mark_lost
from exporter.core import CycleContext, GpuRef, ProcessSample, SampleSink
from exporter.nvmlcall import GpuLost, Reader, text

_NOT_MIG = 0xFFFFFFFF


class ProcessesCollector(NvmlCollector):
    name = "processes"

    def __init__(self, options: Any, nvml: Any) -> None:
        super().__init__(options, nvml)
        # NVML returns utilisation samples newer than the timestamp we pass; remembering the
        # newest one seen per GPU gives each cycle exactly the samples since the last cycle.
        self._last_seen: dict[str, int] = {}

    def collect(self, ctx: CycleContext, sink: SampleSink) -> None:
        r = Reader(self.nvml)
        mig_by_ids: dict[tuple[str, int, int], str] = {
            (m.parent.uuid, m.gpu_instance_id, m.compute_instance_id): m.uuid for m in ctx.migs
        }
        for gpu in ctx.gpus:
            if gpu.uuid in ctx.lost:
                continue
            try:
                ctx.processes.extend(self._read_gpu(r, gpu, mig_by_ids))
            except GpuLost:
                mark_lost(ctx, gpu)
        self.failed_calls = r.failures
        del sink

    def _read_gpu(self, r: Reader, gpu: GpuRef,
                  mig_by_ids: dict[tuple[str, int, int], str]) -> list[ProcessSample]:
        nv = self.nvml
        procs = r.call(nv.nvmlDeviceGetComputeRunningProcesses, gpu.handle) or []
        util: dict[int, float] | None = None
        if not gpu.mig_enabled:
            util = self._utilisation(gpu)
        out = []
        for p in procs:
            mig_uuid = ""
            gi = getattr(p, "gpuInstanceId", _NOT_MIG)
            if gpu.mig_enabled and gi != _NOT_MIG:
                mig_uuid = mig_by_ids.get((gpu.uuid, gi, getattr(p, "computeInstanceId", 0)), "")
            mem = p.usedGpuMemory
            sm = None if util is None else util.get(int(p.pid), 0.0)
            out.append(ProcessSample(int(p.pid), gpu.uuid, text(mig_uuid),
                                     float(mem or 0), sm))
        return out

    def _utilisation(self, gpu: GpuRef) -> dict[int, float] | None:
        """pid -> SM utilisation (0-1) of its newest sample since the last cycle. NOT_FOUND
        means no process ran a kernel since then: every process is idle (0), not unknown."""
        nv = self.nvml
        try:
            samples = nv.nvmlDeviceGetProcessUtilization(gpu.handle,
                                                         self._last_seen.get(gpu.uuid, 0))
        except nv.NVMLError as err:
            if err.value == nv.NVML_ERROR_NOT_FOUND:
                return {}
            if err.value == nv.NVML_ERROR_GPU_IS_LOST:
                raise GpuLost(str(err)) from err
            return None
        newest: dict[int, tuple[int, float]] = {}
        top = self._last_seen.get(gpu.uuid, 0)
        for s in samples:
            ts = int(s.timeStamp)
            top = max(top, ts)
            if int(s.pid) not in newest or ts >= newest[int(s.pid)][0]:
                newest[int(s.pid)] = (ts, s.smUtil / 100.0)
        self._last_seen[gpu.uuid] = top
        return {pid: v for pid, (_, v) in newest.items()}
