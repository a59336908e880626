"""The GPU process list: a stage of the sample cycle, like the inventory. The sampler runs it
before the collectors when one of them reads processes (attribution), so no collector depends
on another having run first and no flag can switch it off under attribution's feet."""

from __future__ import annotations

from typing import Any

from exporter.collectors.base import answering
from exporter.core import CycleContext, GpuRef, ProcessSample
from exporter.nvmlcall import GpuLost, NvmlOutcome, Reader, classify, text

_NOT_MIG = 0xFFFFFFFF


class ProcessLister:
    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        # NVML returns utilisation samples newer than the timestamp we pass; remembering the
        # newest one seen per GPU gives each cycle exactly the samples since the last cycle.
        self._last_seen: dict[str, int] = {}

    def fill(self, ctx: CycleContext) -> None:
        """Fill ctx.processes (and ctx.process_failures) for every GPU that answers."""
        r = Reader(self.nvml)
        mig_by_ids: dict[tuple[str, int, int], str] = {
            (m.parent.uuid, m.gpu_instance_id, m.compute_instance_id): m.uuid for m in ctx.migs
        }
        for gpu in ctx.gpus:
            answering(ctx, gpu, lambda g: ctx.processes.extend(self._read_gpu(r, g, mig_by_ids)))
        ctx.process_failures = r.failures

    def _read_gpu(self, r: Reader, gpu: GpuRef,
                  mig_by_ids: dict[tuple[str, int, int], str]) -> list[ProcessSample]:
        nv = self.nvml
        procs = r.call(nv.nvmlDeviceGetComputeRunningProcesses, gpu.handle) or []
        util: dict[int, float] | None = None
        if not gpu.mig_enabled:
            util = self._utilisation(r, gpu)
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

    def _utilisation(self, r: Reader, gpu: GpuRef) -> dict[int, float] | None:
        """pid -> SM utilisation (0-1) of its newest sample since the last cycle. NOT_FOUND
        means no process ran a kernel since then: every process is idle (0), not unknown."""
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
        newest: dict[int, tuple[int, float]] = {}
        top = self._last_seen.get(gpu.uuid, 0)
        for s in samples:
            ts = int(s.timeStamp)
            top = max(top, ts)
            if int(s.pid) not in newest or ts >= newest[int(s.pid)][0]:
                newest[int(s.pid)] = (ts, s.smUtil / 100.0)
        self._last_seen[gpu.uuid] = top
        return {pid: v for pid, (_, v) in newest.items()}
