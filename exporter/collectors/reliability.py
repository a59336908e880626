"""ECC counters, row remapping, PCIe replays, RAS block counters (AMD) and NVLink error
counters."""

from __future__ import annotations

from exporter.collectors.base import GpuCollector, NvmlCollector, nvlink_count
from exporter.core import CollectorDeps, CycleContext, GpuRef, SampleSink
from exporter.device.contract import Tally
from exporter.nvmlcall import Reader

FEATURE_ENABLED = 1  # NVML_FEATURE_ENABLED (nvml.h)
# kind -> NVML_NVLINK_ERROR_DL_* counter (nvml.h)
_NVLINK_COUNTERS = (
    ("replay", 0),  # NVML_NVLINK_ERROR_DL_REPLAY
    ("recovery", 1),  # NVML_NVLINK_ERROR_DL_RECOVERY
    ("crc_flit", 2),  # NVML_NVLINK_ERROR_DL_CRC_FLIT
    ("crc_data", 3),  # NVML_NVLINK_ERROR_DL_CRC_DATA
)


class EccCollector(GpuCollector):
    name = "ecc"

    def read_gpu(self, ctx: CycleContext, sink: SampleSink, tally: Tally, gpu: GpuRef) -> None:
        rel = self.backend.reliability(gpu, tally)
        labels = gpu.labels(ctx.node)
        for kind, n in (("corrected", rel.ecc_corrected), ("uncorrected", rel.ecc_uncorrected)):
            if n is not None:
                sink.add("gpu_ecc_errors_total", (*labels, kind), n)
        rows = rel.row_remapping
        if rows is not None:
            sink.add("gpu_remapped_rows", (*labels, "correctable"), rows.correctable)
            sink.add("gpu_remapped_rows", (*labels, "uncorrectable"), rows.uncorrectable)
            sink.add("gpu_row_remap_pending", labels, 1 if rows.pending else 0)
            sink.add("gpu_row_remap_failure", labels, 1 if rows.failed else 0)
        if rel.pcie_replays is not None:
            sink.add("gpu_pcie_replay_total", labels, rel.pcie_replays)
        for ras in rel.ras_errors:
            sink.add("gpu_ras_errors_total", (*labels, ras.block, ras.severity), ras.count)


class NvlinkCollector(NvmlCollector):
    """Error counters of the links that are up. Links that exist but are not active (a PCIe
    card without a bridge still answers for 18 links) are all-zero noise: a link is emitted
    once NVML has reported it active, and stays emitted if it goes down later, so its error
    counts stay visible."""

    name = "nvlink"

    def __init__(self, deps: CollectorDeps) -> None:
        super().__init__(deps)
        self._links: dict[str, int] = {}  # uuid -> number of links that exist (probed once)
        self._active: dict[str, set[int]] = {}  # uuid -> links seen active since start

    def read_nvml(self, ctx: CycleContext, sink: SampleSink, r: Reader, gpu: GpuRef) -> None:
        nv = self.nvml
        if gpu.uuid not in self._links:
            self._links[gpu.uuid] = nvlink_count(r, gpu.handle)
        active = self._active.setdefault(gpu.uuid, set())
        labels = gpu.labels(ctx.node)
        for link in range(self._links[gpu.uuid]):
            if link not in active:
                if r.call(nv.nvmlDeviceGetNvLinkState, gpu.handle, link) != FEATURE_ENABLED:
                    continue
                active.add(link)
            for kind, counter in _NVLINK_COUNTERS:
                v = r.call(nv.nvmlDeviceGetNvLinkErrorCounter, gpu.handle, link, counter)
                if v is not None:
                    sink.add("gpu_nvlink_errors_total", (*labels, str(link), kind), v)
