"""Shared plumbing for the NVML collectors."""

from __future__ import annotations

from typing import Any

from exporter.core import CycleContext, GpuRef


class NvmlCollector:
    """Base for collectors that read NVML. `failed_calls` tells the sampler whether an
    unexpected NVML error dropped a value in the last run (the collector still succeeded
    for every other value)."""

    name = ""
    needs_nvml = True

    def __init__(self, options: Any, nvml: Any) -> None:
        self.options = options
        self.nvml = nvml
        self.failed_calls = 0

    def close(self) -> None:
        return None


def mark_lost(ctx: CycleContext, gpu: GpuRef) -> None:
    ctx.lost.add(gpu.uuid)
