"""MIG instances: identity with profile and slices, and memory."""

from __future__ import annotations

from exporter.collectors.base import GpuCollector
from exporter.core import CycleContext, GpuRef, SampleSink
from exporter.device.contract import Tally


class MigCollector(GpuCollector):
    name = "mig"

    def read_gpu(self, ctx: CycleContext, sink: SampleSink, tally: Tally, gpu: GpuRef) -> None:
        for mig in ctx.migs:
            if mig.parent.uuid != gpu.uuid:
                continue
            mem = self.backend.partition_memory(mig, tally)
            if mem is not None:
                labels = mig.labels(ctx.node)
                sink.add("gpu_mig_memory_total_bytes", labels, mem.total_bytes)
                sink.add("gpu_mig_memory_used_bytes", labels, mem.used_bytes)
            busy = self.backend.partition_utilization(mig, tally)
            if busy is not None:
                sink.add("gpu_partition_utilization_ratio", mig.labels(ctx.node), busy)

    def on_gpu(self, ctx: CycleContext, sink: SampleSink, gpu: GpuRef, up: bool) -> None:
        for mig in ctx.migs:
            if mig.parent.uuid == gpu.uuid:
                sink.add("gpu_mig_info", (*mig.labels(ctx.node), str(mig.slices),
                                          str(mig.parent_slices)), 1)
