"""ECC counters, row remapping, PCIe replays and NVLink error counters."""

from __future__ import annotations

from typing import Any

from exporter.collectors.base import NvmlCollector, mark_lost
from exporter.core import CycleContext, SampleSink
from exporter.nvmlcall import GpuLost, Reader

_NVLINK_COUNTERS = (
    ("replay", "NVML_NVLINK_ERROR_DL_REPLAY", 0),
    ("recovery", "NVML_NVLINK_ERROR_DL_RECOVERY", 1),
    ("crc_flit", "NVML_NVLINK_ERROR_DL_CRC_FLIT", 2),
    ("crc_data", "NVML_NVLINK_ERROR_DL_CRC_DATA", 3),
)


class EccCollector(NvmlCollector):
    name = "ecc"

    def collect(self, ctx: CycleContext, sink: SampleSink) -> None:
        nv, r = self.nvml, Reader(self.nvml)
        for gpu in ctx.gpus:
            if gpu.uuid in ctx.lost:
                continue
            labels = gpu.labels(ctx.node)
            try:
                for kind, const in (("corrected", nv.NVML_MEMORY_ERROR_TYPE_CORRECTED),
                                    ("uncorrected", nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED)):
                    n = r.call(nv.nvmlDeviceGetTotalEccErrors, gpu.handle, const,
                               nv.NVML_VOLATILE_ECC)
                    if n is not None:
                        sink.add("gpu_ecc_errors_total", (*labels, kind), n)
                rows = r.call(nv.nvmlDeviceGetRemappedRows, gpu.handle)
                if rows is not None:
                    corrected, uncorrected, pending, failure = rows[:4]
                    sink.add("gpu_remapped_rows", (*labels, "correctable"), corrected)
                    sink.add("gpu_remapped_rows", (*labels, "uncorrectable"), uncorrected)
                    sink.add("gpu_row_remap_pending", labels, 1 if pending else 0)
                    sink.add("gpu_row_remap_failure", labels, 1 if failure else 0)
                replay = r.call(nv.nvmlDeviceGetPcieReplayCounter, gpu.handle)
                if replay is not None:
                    sink.add("gpu_pcie_replay_total", labels, replay)
            except GpuLost:
                mark_lost(ctx, gpu)
        self.failed_calls = r.failures


class NvlinkCollector(NvmlCollector):
    name = "nvlink"

    def __init__(self, options: Any, nvml: Any) -> None:
        super().__init__(options, nvml)
        self._links: dict[str, int] = {}  # uuid -> number of links that exist (probed once)

    def _link_count(self, r: Reader, handle: Any) -> int:
        nv = self.nvml
        n = 0
        for link in range(int(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18))):
            if r.call(nv.nvmlDeviceGetNvLinkState, handle, link) is None:
                break
            n = link + 1
        return n

    def collect(self, ctx: CycleContext, sink: SampleSink) -> None:
        nv, r = self.nvml, Reader(self.nvml)
        counters = [(name, getattr(nv, c, d)) for name, c, d in _NVLINK_COUNTERS]
        for gpu in ctx.gpus:
            if gpu.uuid in ctx.lost:
                continue
            labels = gpu.labels(ctx.node)
            try:
                if gpu.uuid not in self._links:
                    self._links[gpu.uuid] = self._link_count(r, gpu.handle)
                for link in range(self._links[gpu.uuid]):
                    for kind, counter in counters:
                        v = r.call(nv.nvmlDeviceGetNvLinkErrorCounter, gpu.handle, link, counter)
                        if v is not None:
                            sink.add("gpu_nvlink_errors_total", (*labels, str(link), kind), v)
            except GpuLost:
                mark_lost(ctx, gpu)
        self.failed_calls = r.failures
