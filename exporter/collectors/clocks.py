"""Clock event (throttle) reasons and cumulative violation time."""

from __future__ import annotations

from exporter.collectors.base import NvmlCollector
from exporter.core import CycleContext, GpuRef, SampleSink
from exporter.nvmlcall import Reader

# metric reason -> clock event bit (nvmlClocksEventReason*, nvml.h)
_EVENT_BITS = (
    ("hw_thermal", 0x40),  # nvmlClocksEventReasonHwThermalSlowdown
    ("sw_thermal", 0x20),  # nvmlClocksEventReasonSwThermalSlowdown
    ("hw_power_brake", 0x80),  # nvmlClocksEventReasonHwPowerBrakeSlowdown
    ("sw_power_cap", 0x4),  # nvmlClocksEventReasonSwPowerCap
    ("hw_slowdown", 0x8),  # nvmlClocksEventReasonHwSlowdown
    ("sync_boost", 0x10),  # nvmlClocksEventReasonSyncBoost
    ("idle", 0x1),  # nvmlClocksEventReasonGpuIdle
)
# metric reason -> perf policy (NVML_PERF_POLICY_*, nvml.h)
_POLICIES = (
    ("power", 0),  # NVML_PERF_POLICY_POWER
    ("thermal", 1),  # NVML_PERF_POLICY_THERMAL
    ("sync_boost", 2),  # NVML_PERF_POLICY_SYNC_BOOST
    ("board_limit", 3),  # NVML_PERF_POLICY_BOARD_LIMIT
    ("low_utilization", 4),  # NVML_PERF_POLICY_LOW_UTILIZATION
    ("reliability", 5),  # NVML_PERF_POLICY_RELIABILITY
)


class ClocksCollector(NvmlCollector):
    name = "clocks"

    def read_nvml(self, ctx: CycleContext, sink: SampleSink, r: Reader, gpu: GpuRef) -> None:
        nv = self.nvml
        labels = gpu.labels(ctx.node)
        mask = r.call(nv.nvmlDeviceGetCurrentClocksEventReasons, gpu.handle)
        if mask is not None:
            for reason, bit in _EVENT_BITS:
                sink.add("gpu_clock_event_active", (*labels, reason), 1 if mask & bit else 0)
        for reason, policy in _POLICIES:
            v = r.call(nv.nvmlDeviceGetViolationStatus, gpu.handle, policy)
            if v is not None:
                sink.add("gpu_throttle_seconds_total", (*labels, reason), v.violationTime / 1e9)
