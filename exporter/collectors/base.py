"""Shared plumbing for the device collectors: the per-GPU loop, written once."""

from __future__ import annotations

from collections.abc import Callable

from exporter.core import CollectorDeps, CycleContext, GpuRef, SampleSink
from exporter.device.contract import DeviceLost, Tally
from exporter.device.nvmlapi import Handle, NvmlApi
from exporter.nvmlcall import Reader


class GpuCollector:
    """Base for collectors that read the device backend one GPU at a time. `collect` walks
    the GPUs that still answer, calls `read_gpu` for each, marks a GPU lost when the backend
    raises DeviceLost (the later collectors then skip it) and returns the calls that failed
    unexpectedly."""

    name = ""
    needs_nvml = True  # needs the device backend up
    reads_processes = False

    def __init__(self, deps: CollectorDeps) -> None:
        self.options = deps.options
        self.backend = deps.backend

    def collect(self, ctx: CycleContext, sink: SampleSink) -> int:
        tally = Tally()
        for gpu in ctx.gpus:
            self.on_gpu(ctx, sink, gpu, answering(ctx, gpu, lambda g: self.read_gpu(
                ctx, sink, tally, g)))
        return tally.failures

    def read_gpu(self, ctx: CycleContext, sink: SampleSink, tally: Tally, gpu: GpuRef) -> None:
        """Read one GPU that answered so far; raises DeviceLost if it fell off."""
        raise NotImplementedError

    def on_gpu(self, ctx: CycleContext, sink: SampleSink, gpu: GpuRef, up: bool) -> None:
        """Called for every GPU, lost or not, after read_gpu (for series every GPU carries)."""
        del ctx, sink, gpu, up

    def close(self) -> None:
        return None


class NvmlCollector(GpuCollector):
    """Base for the NVIDIA-only collectors (clock reasons, ECC, NVLink, GPM, throughput): they
    read NVML itself, typed (`NvmlApi`), through the NVML backend, for NVIDIA GPUs only; on a
    node without NVML they read nothing."""

    def __init__(self, deps: CollectorDeps) -> None:
        super().__init__(deps)
        self._nvml = deps.backend.nvml

    @property
    def nvml(self) -> NvmlApi:
        assert self._nvml is not None, "read_nvml runs only on an NVML backend"
        return self._nvml

    def collect(self, ctx: CycleContext, sink: SampleSink) -> int:
        return super().collect(ctx, sink) if self._nvml is not None else 0

    def read_gpu(self, ctx: CycleContext, sink: SampleSink, tally: Tally, gpu: GpuRef) -> None:
        if gpu.vendor == "nvidia":  # another vendor's handle means nothing to NVML
            self.read_nvml(ctx, sink, Reader(self.nvml, tally), gpu)

    def read_nvml(self, ctx: CycleContext, sink: SampleSink, r: Reader, gpu: GpuRef) -> None:
        """Read one GPU through NVML; raises GpuLost (from Reader.call) if it fell off."""
        raise NotImplementedError


def answering(ctx: CycleContext, gpu: GpuRef, read: Callable[[GpuRef], None]) -> bool:
    """Run read(gpu) unless the GPU is already lost this cycle; mark it lost if it answers
    DeviceLost. True when the GPU answered."""
    if gpu.uuid in ctx.lost:
        return False
    try:
        read(gpu)
    except DeviceLost:
        ctx.lost.add(gpu.uuid)
        return False
    return True


NVLINK_MAX_LINKS = 36  # NVML_NVLINK_MAX_LINKS as pynvml 12.x defines it; probing stops earlier


def nvlink_count(r: Reader, handle: Handle) -> int:
    """How many NVLink links the GPU has: NVML answers for links 0..n-1 (up or down) and
    NOT_SUPPORTED / INVALID_ARGUMENT beyond them. Probe once per GPU."""
    n = 0
    for link in range(NVLINK_MAX_LINKS):
        if r.call(r.nvml.nvmlDeviceGetNvLinkState, handle, link) is None:
            break
        n = link + 1
    return n
