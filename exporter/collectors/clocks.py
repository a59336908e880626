"""Clock event (throttle) reasons and cumulative violation time."""

from __future__ import annotations

from exporter.collectors.base import NvmlCollector
from exporter.core import CycleContext, GpuRef, SampleSink
from exporter.nvmlcall import Reader

# metric reason -> pynvml constant name of the clock event bit
_EVENT_BITS = (
    ("hw_thermal", "nvmlClocksEventReasonHwThermalSlowdown", 0x40),
    ("sw_thermal", "nvmlClocksEventReasonSwThermalSlowdown", 0x20),
    ("hw_power_brake", "nvmlClocksEventReasonHwPowerBrakeSlowdown", 0x80),
    ("sw_power_cap", "nvmlClocksEventReasonSwPowerCap", 0x4),
    ("hw_slowdown", "nvmlClocksEventReasonHwSlowdown", 0x8),
    ("sync_boost", "nvmlClocksEventReasonSyncBoost", 0x10),
    ("idle", "nvmlClocksEventReasonGpuIdle", 0x1),
)
# metric reason -> pynvml perf policy constant name
_POLICIES = (
    ("power", "NVML_PERF_POLICY_POWER", 0),
    ("thermal", "NVML_PERF_POLICY_THERMAL", 1),
    ("sync_boost", "NVML_PERF_POLICY_SYNC_BOOST", 2),
    ("board_limit", "NVML_PERF_POLICY_BOARD_LIMIT", 3),
    ("low_utilization", "NVML_PERF_POLICY_LOW_UTILIZATION", 4),
    ("reliability", "NVML_PERF_POLICY_RELIABILITY", 5),
)


class ClocksCollector(NvmlCollector):
    name = "clocks"

    def read_gpu(self, ctx: CycleContext, sink: SampleSink, r: Reader, gpu: GpuRef) -> None:
        nv = self.nvml
        reasons_fn = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            nv.nvmlDeviceGetCurrentClocksThrottleReasons
        labels = gpu.labels(ctx.node)
        mask = r.call(reasons_fn, gpu.handle)
        if mask is not None:
            for reason, const, default in _EVENT_BITS:
                bit = getattr(nv, const, default)
                sink.add("gpu_clock_event_active", (*labels, reason), 1 if mask & bit else 0)
        for reason, const, default in _POLICIES:
            v = r.call(nv.nvmlDeviceGetViolationStatus, gpu.handle, getattr(nv, const, default))
            if v is not None:
                sink.add("gpu_throttle_seconds_total", (*labels, reason), v.violationTime / 1e9)
