"""MIG instances: identity with profile and slices, and memory."""

from __future__ import annotations

from exporter.collectors.base import NvmlCollector
from exporter.core import CycleContext, GpuRef, SampleSink
from exporter.nvmlcall import Reader


class MigCollector(NvmlCollector):
    name = "mig"

    def read_gpu(self, ctx: CycleContext, sink: SampleSink, r: Reader, gpu: GpuRef) -> None:
        for mig in ctx.migs:
            if mig.parent.uuid != gpu.uuid:
                continue
            mem = r.call(self.nvml.nvmlDeviceGetMemoryInfo, mig.handle)
            if mem is not None:
                labels = mig.labels(ctx.node)
                sink.add("gpu_mig_memory_total_bytes", labels, mem.total)
                sink.add("gpu_mig_memory_used_bytes", labels, mem.used)

    def on_gpu(self, ctx: CycleContext, sink: SampleSink, gpu: GpuRef, up: bool) -> None:
        for mig in ctx.migs:
            if mig.parent.uuid == gpu.uuid:
                sink.add("gpu_mig_info", (*mig.labels(ctx.node), str(mig.slices),
                                          str(mig.parent_slices)), 1)
