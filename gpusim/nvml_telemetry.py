"""Simulated NVML: temperatures, power, energy, utilisation, memory, clocks, clock event
reasons and violation time."""

from __future__ import annotations

from typing import Any

import pynvml

from gpusim.nvml_core import NvmlCore, SimDevice, nvml_error

ENCODER_SAMPLING_PERIOD_US = 167_000


_THROTTLE_BITS = {
    "hw_thermal": pynvml.nvmlClocksEventReasonHwThermalSlowdown
    | pynvml.nvmlClocksEventReasonHwSlowdown,
    "sw_thermal": pynvml.nvmlClocksEventReasonSwThermalSlowdown,
    "hw_power_brake": pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown
    | pynvml.nvmlClocksEventReasonHwSlowdown,
    "sw_power_cap": pynvml.nvmlClocksEventReasonSwPowerCap,
    "hw_slowdown": pynvml.nvmlClocksEventReasonHwSlowdown,
    "sync_boost": pynvml.nvmlClocksEventReasonSyncBoost,
}
_POLICY_REASONS = {
    pynvml.NVML_PERF_POLICY_POWER: ("sw_power_cap", "hw_power_brake"),
    pynvml.NVML_PERF_POLICY_THERMAL: ("hw_thermal", "sw_thermal"),
    pynvml.NVML_PERF_POLICY_SYNC_BOOST: ("sync_boost",),
    pynvml.NVML_PERF_POLICY_BOARD_LIMIT: ("hw_slowdown",),
    pynvml.NVML_PERF_POLICY_RELIABILITY: (),
}


def _overlap(a0: float, a1: float | None, b0: float, b1: float) -> float:
    end = b1 if a1 is None else min(a1, b1)
    return max(0.0, end - max(a0, b0))


class TelemetryQueries(NvmlCore):
    """Readings that vary with load over scenario time."""

    def nvmlDeviceGetTemperature(self, handle: SimDevice, sensor: int) -> int:
        gpu, _, t = self._dev(handle, "temperature")
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return round(self._temperature(gpu, t))

    def nvmlDeviceGetPowerUsage(self, handle: SimDevice) -> int:
        gpu, _, t = self._dev(handle, "power")
        return round(1000 * self._power_watts(gpu, t, self._reading(gpu, t).util))

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: SimDevice) -> int:
        gpu, _, _ = self._dev(handle, "power_limit")
        return round(1000 * gpu.power_limit_watts)

    nvmlDeviceGetPowerManagementLimit = nvmlDeviceGetEnforcedPowerLimit

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: SimDevice) -> int:
        gpu, _, t = self._dev(handle, "energy")
        with self._lock:
            joules, _ = self._integrators[gpu.index].at(t)
        return int(joules * 1000)

    def nvmlDeviceGetUtilizationRates(self, handle: SimDevice) -> Any:
        gpu, _, t = self._dev(handle, "utilization")
        if gpu.mig is not None:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        r = self._reading(gpu, t)
        return pynvml.c_nvmlUtilization_t(gpu=round(100 * r.util), memory=round(100 * r.mem_util))

    def nvmlDeviceGetEncoderUtilization(self, handle: SimDevice) -> list[int]:
        gpu, _, t = self._dev(handle, "encoder")
        if gpu.mig is not None:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return [round(100 * gpu.telemetry.encoder_utilization.at(t)), ENCODER_SAMPLING_PERIOD_US]

    def nvmlDeviceGetDecoderUtilization(self, handle: SimDevice) -> list[int]:
        gpu, _, t = self._dev(handle, "decoder")
        if gpu.mig is not None:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return [round(100 * gpu.telemetry.decoder_utilization.at(t)), ENCODER_SAMPLING_PERIOD_US]

    def nvmlDeviceGetMemoryInfo(self, handle: SimDevice,
                                version: int | None = None) -> Any:
        gpu, mig, t = self._dev(handle, mig_ok=True)
        if mig is not None:
            total, reserved = mig.memory_bytes, 0
            used = self._reading(gpu, t, mig.index).memory_used
        else:
            total, reserved = gpu.memory_bytes, gpu.reserved_bytes
            used = self._reading(gpu, t).memory_used
        used = min(used, total - reserved)
        if version == pynvml.nvmlMemory_v2:
            return pynvml.c_nvmlMemory_v2_t(version=version, total=total, reserved=reserved,
                                            free=total - reserved - used, used=used)
        if version is not None:
            raise nvml_error(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        # v1 counts the driver's reservation as used, as real NVML does
        return pynvml.c_nvmlMemory_t(total=total, free=total - reserved - used,
                                     used=used + reserved)

    def nvmlDeviceGetClockInfo(self, handle: SimDevice, clock_type: int) -> int:
        gpu, _, t = self._dev(handle, "clocks")
        if clock_type == pynvml.NVML_CLOCK_SM or clock_type == pynvml.NVML_CLOCK_GRAPHICS:
            mhz = gpu.telemetry.sm_clock_mhz.at(t)
            if any(f.reason != "sync_boost" for f in self._active(gpu.index, "throttle", t)):
                mhz *= 0.6  # a slowdown cuts the SM clock
            elif self._reading(gpu, t).util <= 0.0:
                mhz *= 0.25  # idle clocks
            return round(mhz)
        if clock_type == pynvml.NVML_CLOCK_MEM:
            return round(gpu.telemetry.mem_clock_mhz.at(t))
        raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: SimDevice) -> int:
        gpu, _, t = self._dev(handle, "clock_events")
        mask = 0
        for f in self._active(gpu.index, "throttle", t):
            mask |= _THROTTLE_BITS[f.reason]
        if self._reading(gpu, t).util <= 0.0:
            mask |= pynvml.nvmlClocksEventReasonGpuIdle
        return mask

    nvmlDeviceGetCurrentClocksThrottleReasons = nvmlDeviceGetCurrentClocksEventReasons

    def nvmlDeviceGetSupportedClocksEventReasons(self, handle: SimDevice) -> int:
        self._dev(handle, "clock_events")
        return int(pynvml.nvmlClocksEventReasonAll)

    nvmlDeviceGetSupportedClocksThrottleReasons = nvmlDeviceGetSupportedClocksEventReasons

    def nvmlDeviceGetViolationStatus(self, handle: SimDevice, policy: int) -> Any:
        gpu, _, t = self._dev(handle, "violation")
        if policy == pynvml.NVML_PERF_POLICY_LOW_UTILIZATION:
            with self._lock:
                _, seconds = self._integrators[gpu.index].at(t)
        elif policy in _POLICY_REASONS:
            reasons = _POLICY_REASONS[policy]
            seconds = sum(_overlap(f.at, f.until, 0.0, t)
                          for f in self._faults(gpu.index, "throttle", t) if f.reason in reasons)
        else:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED if 0 <= policy
                       < pynvml.NVML_PERF_POLICY_COUNT else pynvml.NVML_ERROR_INVALID_ARGUMENT)
        # referenceTime is a CPU timestamp in µs; violationTime is ns of throttling
        return pynvml.c_nvmlViolationTime_t(referenceTime=int(self._clock() * 1e6),
                                            violationTime=int(seconds * 1e9))

    def nvmlDeviceGetPerformanceState(self, handle: SimDevice) -> int:
        gpu, _, t = self._dev(handle)
        return 0 if self._reading(gpu, t).util > 0 else 8
