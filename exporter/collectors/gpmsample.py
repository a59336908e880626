"""GPM samples kept in pairs: a GPM metric is computed between two samples of the same GPU
(or MIG GPU instance), so each keeps its previous sample between cycles. Every collector that
reads GPM metrics holds its own `GpmPairs`; none reads another's."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

from exporter.core import GpuRef
from exporter.device.nvmlapi import NvmlApi, Struct
from exporter.nvmlcall import Reader

Key = tuple[str, int]  # (gpu uuid, gpu instance id or -1 for the whole GPU)


class GpmPairs:
    def __init__(self, nvml: NvmlApi | None) -> None:
        self.nvml = nvml  # None on a backend without NVML: nothing is ever sampled
        self._supported: dict[str, bool] = {}
        self._prev: dict[Key, Struct] = {}
        self._spare: dict[Key, Struct] = {}

    def supported(self, r: Reader, gpu: GpuRef) -> bool:
        """Whether the GPU has GPM (asked once per GPU)."""
        if gpu.uuid not in self._supported:
            support = (r.call(self.nvml.nvmlGpmQueryDeviceSupport, gpu.handle)
                       if self.nvml is not None else None)
            self._supported[gpu.uuid] = bool(support and support.isSupportedDevice)
        return self._supported[gpu.uuid]

    def metrics(self, r: Reader, gpu: GpuRef, gi: int | None,
                ids: Sequence[int]) -> dict[int, float] | None:
        """Take a sample of the GPU (gi None) or its GPU instance `gi`; return the metrics
        NVML answered between the previous sample and this one, by metric id. None when
        there is no pair of samples (the first cycle, a failed call)."""
        nv = self.nvml
        if nv is None:
            return None
        key = (gpu.uuid, -1 if gi is None else gi)
        cur = self._spare.pop(key, None) or r.call(nv.nvmlGpmSampleAlloc)
        if cur is None:
            return None
        got = (r.call(nv.nvmlGpmSampleGet, gpu.handle, cur) if gi is None
               else r.call(nv.nvmlGpmMigSampleGet, gpu.handle, gi, cur))
        if got is None:
            self._spare[key] = cur
            return None
        prev = self._prev.get(key)
        self._prev[key] = cur
        if prev is None:
            return None
        self._spare[key] = prev  # reused next cycle: no alloc/free churn
        req = nv.c_nvmlGpmMetricsGet_t()
        req.version = nv.NVML_GPM_METRICS_GET_VERSION
        req.numMetrics = len(ids)
        req.sample1 = prev
        req.sample2 = cur
        for i, metric in enumerate(ids):
            req.metrics[i].metricId = metric
        if r.call(nv.nvmlGpmMetricsGet, req) is None:
            return None
        return {int(req.metrics[i].metricId): float(req.metrics[i].value)
                for i in range(len(ids))
                if r.check(int(req.metrics[i].nvmlReturn), "nvmlGpmMetricsGet")}

    def forget(self, uuid: str) -> None:
        """A lost GPU's samples are stale: the next difference starts afresh."""
        for key in [k for k in self._prev if k[0] == uuid]:
            self._free(self._prev.pop(key))

    def _free(self, sample: Struct) -> None:
        if self.nvml is not None:
            with contextlib.suppress(self.nvml.NVMLError):
                self.nvml.nvmlGpmSampleFree(sample)

    def close(self) -> None:
        for store in (self._prev, self._spare):
            for sample in store.values():
                self._free(sample)
            store.clear()
