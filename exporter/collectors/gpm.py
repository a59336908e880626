"""GPU Performance Monitoring (Hopper+): SM active, SM occupancy, tensor and DRAM activity,
per GPU and per MIG instance. A metric is a difference of two samples, so the first cycle
emits nothing (exporter/collectors/gpmsample.py)."""

from __future__ import annotations

from exporter.collectors.base import NvmlCollector
from exporter.collectors.gpmsample import GpmPairs
from exporter.core import CollectorDeps, CycleContext, GpuRef, Labels, SampleSink
from exporter.nvmlcall import Reader

# family -> NVML_GPM_METRIC_* id (nvml.h; the same in every driver since GPM came)
_METRICS = (
    ("gpu_sm_active_ratio", 2),  # NVML_GPM_METRIC_SM_UTIL, percent
    ("gpu_sm_occupancy_ratio", 3),  # NVML_GPM_METRIC_SM_OCCUPANCY, percent
    ("gpu_tensor_active_ratio", 5),  # NVML_GPM_METRIC_ANY_TENSOR_UTIL, percent
    ("gpu_dram_active_ratio", 10),  # NVML_GPM_METRIC_DRAM_BW_UTIL, percent
)
_IDS = tuple(metric for _, metric in _METRICS)
NO_MIG = ("", "", "", "")


class GpmCollector(NvmlCollector):
    name = "gpm"

    def __init__(self, deps: CollectorDeps) -> None:
        super().__init__(deps)
        self._gpm = GpmPairs(deps.backend.nvml)

    def read_nvml(self, ctx: CycleContext, sink: SampleSink, r: Reader, gpu: GpuRef) -> None:
        if not self._gpm.supported(r, gpu):
            return
        self._emit(sink, self._gpm.metrics(r, gpu, None, _IDS),
                   (*gpu.labels(ctx.node), *NO_MIG))
        for mig in ctx.migs:
            if mig.parent.uuid == gpu.uuid:
                self._emit(sink, self._gpm.metrics(r, gpu, mig.gpu_instance_id, _IDS),
                           mig.labels(ctx.node))

    def on_gpu(self, ctx: CycleContext, sink: SampleSink, gpu: GpuRef, up: bool) -> None:
        if not up:
            self._gpm.forget(gpu.uuid)

    @staticmethod
    def _emit(sink: SampleSink, values: dict[int, float] | None, labels: Labels) -> None:
        for family, metric in _METRICS:
            if values and metric in values:
                sink.add(family, labels, max(0.0, min(1.0, values[metric] / 100.0)))

    def close(self) -> None:
        self._gpm.close()
