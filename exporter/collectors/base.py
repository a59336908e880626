"""Shared plumbing for the NVML collectors: the per-GPU loop, written once."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from exporter.core import CollectorDeps, CycleContext, GpuRef, SampleSink
from exporter.nvmlcall import GpuLost, Reader


class NvmlCollector:
    """Base for collectors that read NVML one GPU at a time. `collect` walks the GPUs that
    still answer, calls `read_gpu` for each, marks a GPU lost when it answers GPU_IS_LOST (the
    later collectors then skip it) and returns the NVML calls that failed unexpectedly."""

    name = ""
    needs_nvml = True
    reads_processes = False

    def __init__(self, deps: CollectorDeps) -> None:
        self.options = deps.options
        self.nvml: Any = deps.nvml

    def collect(self, ctx: CycleContext, sink: SampleSink) -> int:
        r = Reader(self.nvml)
        for gpu in ctx.gpus:
            self.on_gpu(ctx, sink, gpu, answering(ctx, gpu, lambda g: self.read_gpu(
                ctx, sink, r, g)))
        return r.failures

    def read_gpu(self, ctx: CycleContext, sink: SampleSink, r: Reader, gpu: GpuRef) -> None:
        """Read one GPU that answered so far; raises GpuLost (from Reader.call) if it fell off."""
        raise NotImplementedError

    def on_gpu(self, ctx: CycleContext, sink: SampleSink, gpu: GpuRef, up: bool) -> None:
        """Called for every GPU, lost or not, after read_gpu (for series every GPU carries)."""
        del ctx, sink, gpu, up

    def close(self) -> None:
        return None


def answering(ctx: CycleContext, gpu: GpuRef, read: Callable[[GpuRef], None]) -> bool:
    """Run read(gpu) unless the GPU is already lost this cycle; mark it lost if it answers
    GPU_IS_LOST. True when the GPU answered."""
    if gpu.uuid in ctx.lost:
        return False
    try:
        read(gpu)
    except GpuLost:
        ctx.lost.add(gpu.uuid)
        return False
    return True


def nvlink_count(r: Reader, handle: object) -> int:
    """How many NVLink links the GPU has: NVML answers for links 0..n-1 (up or down) and
    NOT_SUPPORTED / INVALID_ARGUMENT beyond them. Probe once per GPU."""
    nv = r.nvml
    n = 0
    for link in range(int(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18))):
        if r.call(nv.nvmlDeviceGetNvLinkState, handle, link) is None:
            break
        n = link + 1
    return n
