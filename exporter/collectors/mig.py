"""MIG instances: identity with profile and slices, and memory."""

from __future__ import annotations

from exporter.collectors.base import NvmlCollector
from exporter.core import CycleContext, SampleSink
from exporter.nvmlcall import GpuLost, Reader


class MigCollector(NvmlCollector):
    name = "mig"

    def collect(self, ctx: CycleContext, sink: SampleSink) -> None:
        nv, r = self.nvml, Reader(self.nvml)
        for mig in ctx.migs:
            labels = mig.labels(ctx.node)
            sink.add("gpu_mig_info", (*labels, str(mig.slices), str(mig.parent_slices)), 1)
            if mig.parent.uuid in ctx.lost:
                continue
            try:
                mem = r.call(nv.nvmlDeviceGetMemoryInfo, mig.handle)
            except GpuLost:
                ctx.lost.add(mig.parent.uuid)
                continue
            if mem is not None:
                sink.add("gpu_mig_memory_total_bytes", labels, mem.total)
                sink.add("gpu_mig_memory_used_bytes", labels, mem.used)
        self.failed_calls = r.failures
