"""GPU Performance Monitoring (Hopper+): SM active, SM occupancy, tensor and DRAM activity,
per GPU and per MIG instance. A metric is a difference of two samples, so each GPU (and MIG
GPU instance) keeps its previous sample between cycles; the first cycle emits nothing."""

from __future__ import annotations

import contextlib
from typing import Any

from exporter.collectors.base import NvmlCollector
from exporter.core import CollectorDeps, CycleContext, GpuRef, SampleSink
from exporter.nvmlcall import Reader

_METRICS = (
    ("gpu_sm_active_ratio", "NVML_GPM_METRIC_SM_UTIL", 2),
    ("gpu_sm_occupancy_ratio", "NVML_GPM_METRIC_SM_OCCUPANCY", 3),
    ("gpu_tensor_active_ratio", "NVML_GPM_METRIC_ANY_TENSOR_UTIL", 5),
    ("gpu_dram_active_ratio", "NVML_GPM_METRIC_DRAM_BW_UTIL", 10),
)
_NO_MIG = ("", "", "", "")

Key = tuple[str, int]  # (gpu uuid, gpu instance id or -1 for the whole GPU)


class GpmCollector(NvmlCollector):
    name = "gpm"

    def __init__(self, deps: CollectorDeps) -> None:
        super().__init__(deps)
        self._supported: dict[str, bool] = {}
        self._prev: dict[Key, Any] = {}
        self._spare: dict[Key, Any] = {}

    def _is_supported(self, r: Reader, gpu: GpuRef) -> bool:
        if gpu.uuid not in self._supported:
            fn = getattr(self.nvml, "nvmlGpmQueryDeviceSupport", None)
            support = r.call(fn, gpu.handle) if fn is not None else None
            self._supported[gpu.uuid] = bool(support and support.isSupportedDevice)
        return self._supported[gpu.uuid]

    def read_gpu(self, ctx: CycleContext, sink: SampleSink, r: Reader, gpu: GpuRef) -> None:
        if not self._is_supported(r, gpu):
            return
        self._sample(r, sink, (gpu.uuid, -1), gpu.handle, None,
                     (*gpu.labels(ctx.node), *_NO_MIG))
        for mig in ctx.migs:
            if mig.parent.uuid == gpu.uuid:
                self._sample(r, sink, (gpu.uuid, mig.gpu_instance_id), gpu.handle,
                             mig.gpu_instance_id, mig.labels(ctx.node))

    def on_gpu(self, ctx: CycleContext, sink: SampleSink, gpu: GpuRef, up: bool) -> None:
        if not up:  # a lost GPU's samples are stale: the next difference starts afresh
            for key in [k for k in self._prev if k[0] == gpu.uuid]:
                self._free(self._prev.pop(key))

    def _sample(self, r: Reader, sink: SampleSink, key: Key, handle: Any, gi: int | None,
                labels: tuple[str, ...]) -> None:
        nv = self.nvml
        cur = self._spare.pop(key, None) or r.call(nv.nvmlGpmSampleAlloc)
        if cur is None:
            return
        got = (r.call(nv.nvmlGpmSampleGet, handle, cur) if gi is None
               else r.call(nv.nvmlGpmMigSampleGet, handle, gi, cur))
        if got is None:
            self._spare[key] = cur
            return
        prev = self._prev.get(key)
        self._prev[key] = cur
        if prev is None:
            return
        self._spare[key] = prev  # reused next cycle: no alloc/free churn
        req = nv.c_nvmlGpmMetricsGet_t()
        req.version = nv.NVML_GPM_METRICS_GET_VERSION
        req.numMetrics = len(_METRICS)
        req.sample1 = prev
        req.sample2 = cur
        for i, (_, const, default) in enumerate(_METRICS):
            req.metrics[i].metricId = getattr(nv, const, default)
        if r.call(nv.nvmlGpmMetricsGet, req) is None:
            return
        for i, (family, _, _) in enumerate(_METRICS):
            m = req.metrics[i]
            if getattr(m, "nvmlReturn", 0) == 0:
                sink.add(family, labels, max(0.0, min(1.0, float(m.value) / 100.0)))

    def _free(self, sample: Any) -> None:
        fn = getattr(self.nvml, "nvmlGpmSampleFree", None)
        if fn is not None:
            with contextlib.suppress(self.nvml.NVMLError):
                fn(sample)

    def close(self) -> None:
        for store in (self._prev, self._spare):
            for sample in store.values():
                self._free(sample)
            store.clear()
