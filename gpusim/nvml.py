"""A simulated NVML module: pynvml's API (functions, constants, structs, exceptions) answered
from a scenario over time, so the exporter runs unchanged on a laptop, in tests and in the demo.

Scenario time t = clock() - start. Readings are pure functions of t (energy and violation
counters are integrals over t), so a fake clock can jump a month ahead and calls stay cheap.
Errors are real `pynvml.NVMLError`s, so `except nvml.NVMLError_NotSupported` works with both.
"""

from __future__ import annotations

import ctypes
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pynvml

from gpusim.node import SimProcess, Timeline, timeline
from gpusim.scenario import NOT_MIG, Fault, FloatArray, GpuSpec, MigSpec, Scenario

# Copy pynvml's constants, struct classes and exception classes, never its functions: those
# would call the real library.
_EXPORTS = {
    name: value for name, value in vars(pynvml).items()
    if not name.startswith("_") and isinstance(value, int | float | str | bytes | type)
}

INTEGRATION_STEP_S = 15.0  # grid for energy / low-utilisation time: pure in t, any cadence
PROCESS_SAMPLE_PERIOD_US = 1_000_000  # the driver's per-process utilisation sample period
ENCODER_SAMPLING_PERIOD_US = 167_000
EVENT_POLL_S = 0.05  # how often a blocked event wait re-reads a (possibly fake) clock

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
# GPU instance profile constant -> (compute slices, memory slices relative to the smallest)
_GI_PROFILES = {
    pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE: (1, 1),
    pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1: (1, 1),
    pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2: (1, 2),
    pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE: (2, 2),
    pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE: (3, 4),
    pynvml.NVML_GPU_INSTANCE_PROFILE_4_SLICE: (4, 4),
    pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE: (7, 8),
}
_GPM_METRICS = (pynvml.NVML_GPM_METRIC_SM_UTIL, pynvml.NVML_GPM_METRIC_SM_OCCUPANCY,
                pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL, pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL)
_SUPPORTED_EVENTS: int = (pynvml.nvmlEventTypeXidCriticalError
                          | pynvml.nvmlEventTypeSingleBitEccError
                          | pynvml.nvmlEventTypeDoubleBitEccError | pynvml.nvmlEventTypePState
                          | pynvml.nvmlEventTypeClock)


def _err(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


@dataclass(frozen=True)
class SimDevice:
    """A device handle: a GPU, or a MIG instance of one. Hashable and comparable."""

    gpu: int
    mig: int | None = None

    def __repr__(self) -> str:
        return f"<SimDevice gpu={self.gpu}" + ("" if self.mig is None else f" mig={self.mig}") \
            + ">"


@dataclass
class SimEventData:
    """What nvmlEventSetWait returns (the fields of c_nvmlEventData_t)."""

    device: SimDevice
    eventType: int  # pynvml's field names
    eventData: int
    gpuInstanceId: int
    computeInstanceId: int


@dataclass(frozen=True)
class _Event:
    at: float
    gpu: int
    xid: int
    mig: int | None


@dataclass
class _EventSet:
    registered: dict[int, float] = field(default_factory=dict)  # gpu -> registration time
    delivered: set[int] = field(default_factory=set)  # indexes into SimNVML._events
    freed: bool = False


@dataclass
class _GpmSample:
    buffer: Any  # keeps the memory the handed-out pointer points at alive
    gpu: int = -1
    gpu_instance: int | None = None
    t: float = math.nan


@dataclass
class _Reading:
    """Everything about one GPU at one instant that several calls share."""

    procs: list[SimProcess]
    util: float  # 0-1, device
    proc_util: float  # sum of the processes' SM utilisation, not clamped
    mem_util: float
    tensor_util: float
    memory_used: int  # process memory, bytes


class _Integrator:
    """Cumulative power (J) and idle time (s) of one GPU on a fixed grid, so the integral at
    t is a pure function of t: monotonic, and the same whatever the call cadence."""

    def __init__(self, power_many: Callable[[FloatArray], tuple[FloatArray, FloatArray]]) -> None:
        self._power_many = power_many
        self._power: FloatArray = np.zeros(0)
        self._idle: FloatArray = np.zeros(0)
        self._cum_energy: FloatArray = np.zeros(0)
        self._cum_idle: FloatArray = np.zeros(0)

    def _extend(self, k: int) -> None:
        have = len(self._power)
        if k < have:
            return
        upto = max(k + 1, 2 * have, 256)
        ts = np.arange(have, upto, dtype=np.float64) * INTEGRATION_STEP_S
        power, idle = self._power_many(ts)
        base_e = self._cum_energy[-1] + self._power[-1] * INTEGRATION_STEP_S if have else 0.0
        base_i = self._cum_idle[-1] + self._idle[-1] * INTEGRATION_STEP_S if have else 0.0
        steps_e = np.concatenate(([0.0], np.cumsum(power[:-1]) * INTEGRATION_STEP_S))
        steps_i = np.concatenate(([0.0], np.cumsum(idle[:-1]) * INTEGRATION_STEP_S))
        self._power = np.concatenate((self._power, power))
        self._idle = np.concatenate((self._idle, idle))
        self._cum_energy = np.concatenate((self._cum_energy, base_e + steps_e))
        self._cum_idle = np.concatenate((self._cum_idle, base_i + steps_i))

    def at(self, t: float) -> tuple[float, float]:
        """(energy J, idle seconds) from 0 to t."""
        if t <= 0:
            return 0.0, 0.0
        k = int(t // INTEGRATION_STEP_S)
        self._extend(k)
        dt = t - k * INTEGRATION_STEP_S
        return (float(self._cum_energy[k] + self._power[k] * dt),
                float(self._cum_idle[k] + self._idle[k] * dt))


def _overlap(a0: float, a1: float | None, b0: float, b1: float) -> float:
    end = b1 if a1 is None else min(a1, b1)
    return max(0.0, end - max(a0, b0))


class SimNVML:
    """pynvml's API over a scenario. `no_driver_until` (scenario seconds) overrides the
    scenario's `driver.unavailable_until`: nvmlInit fails until then."""

    def __init__(self, scenario: Scenario, clock: Callable[[], float] = time.time,
                 start: float | None = None, no_driver_until: float | None = None) -> None:
        self.scenario = scenario
        self._clock = clock
        self.start = clock() if start is None else start
        self._no_driver_until = (scenario.driver_unavailable_until if no_driver_until is None
                                 else no_driver_until)
        self._timeline: Timeline = timeline(scenario)
        self._lock = threading.RLock()
        self._cond = threading.Condition()
        self._init_count = 0
        self._reading_cache: dict[int, tuple[float, _Reading]] = {}
        self._integrators = {g.index: _Integrator(self._power_many_fn(g)) for g in scenario.gpus}
        self._gpm: dict[int, _GpmSample] = {}
        self._sets: dict[int, _EventSet] = {}
        self._next_set = 1
        self._lost_at: dict[int, float] = {}
        events = [_Event(x.at, x.gpu, x.xid, x.mig) for x in scenario.xids]
        for f in scenario.faults:
            if f.kind == "lost":
                self._lost_at[f.gpu] = min(f.at, self._lost_at.get(f.gpu, math.inf))
        events += [_Event(at, gpu, 79, None) for gpu, at in self._lost_at.items()]
        self._events = sorted(events, key=lambda e: (e.at, e.gpu))

    # -----------------------------------------------------------------------------------------
    # plumbing

    def now(self) -> float:
        """Scenario time in seconds."""
        return self._clock() - self.start

    def notify(self) -> None:
        """Wake blocked event waits now (after a test advances a fake clock)."""
        with self._cond:
            self._cond.notify_all()

    def _check_init(self) -> None:
        if self._init_count <= 0:
            raise _err(pynvml.NVML_ERROR_UNINITIALIZED)

    def _dev(self, handle: object, field_name: str = "",
             mig_ok: bool = False) -> tuple[GpuSpec, MigSpec | None, float]:
        """Resolve a handle for a call at the current time; raise what real NVML would."""
        self._check_init()
        if not isinstance(handle, SimDevice) or not 0 <= handle.gpu < len(self.scenario.gpus):
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        t = self.now()
        gpu = self.scenario.gpus[handle.gpu]
        if t >= self._lost_at.get(gpu.index, math.inf):
            raise _err(pynvml.NVML_ERROR_GPU_IS_LOST)
        mig = None
        if handle.mig is not None:
            if gpu.mig is None or handle.mig >= len(gpu.mig):
                raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            mig = gpu.mig[handle.mig]
            if not mig_ok:
                raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if field_name and self._unsupported(gpu, field_name, t):
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu, mig, t

    def _unsupported(self, gpu: GpuSpec, field_name: str, t: float) -> bool:
        if field_name in gpu.not_supported:
            return True
        return any(f.kind == "not_supported" and f.gpu == gpu.index and f.field == field_name
                   and f.at <= t and (f.until is None or t < f.until)
                   for f in self.scenario.faults)

    def _faults(self, gpu: int, kind: str, t: float) -> list[Fault]:
        return [f for f in self.scenario.faults if f.gpu == gpu and f.kind == kind and f.at <= t]

    def _active(self, gpu: int, kind: str, t: float) -> list[Fault]:
        return [f for f in self._faults(gpu, kind, t) if f.until is None or t < f.until]

    def _reading(self, gpu: GpuSpec, t: float, mig: int | None = None) -> _Reading:
        key = gpu.index if mig is None else -1 - gpu.index * 64 - mig
        with self._lock:
            hit = self._reading_cache.get(key)
            if hit is not None and hit[0] == t:
                return hit[1]
        procs = [p for p in self._timeline.processes_at(t)
                 if p.gpu == gpu.index and (mig is None or p.mig == mig)]
        proc_util = sum(p.sm_util for p in procs)
        if mig is None and gpu.mig is not None:
            # a MIG-enabled GPU is as busy as its instances, weighted by their slices
            parent = gpu.mig_family.parent_slices if gpu.mig_family else 7
            util = sum(min(1.0, sum(p.sm_util for p in procs if p.mig == m.index)) * m.slices
                       for m in gpu.mig) / parent
        else:
            base = gpu.telemetry.utilization.at(t) if mig is None else 0.0
            util = min(1.0, base + proc_util)
        r = _Reading(
            procs=procs, util=util, proc_util=proc_util,
            mem_util=min(1.0, sum(p.mem_util for p in procs)),
            tensor_util=min(1.0, sum(p.tensor_util for p in procs)),
            memory_used=sum(p.memory_bytes for p in procs),
        )
        with self._lock:
            self._reading_cache[key] = (t, r)
        return r

    def _power_watts(self, gpu: GpuSpec, t: float, util: float) -> float:
        tel = gpu.telemetry
        if tel.power_watts is not None:
            return min(tel.power_watts.at(t), gpu.power_limit_watts)
        return tel.idle_power_watts + (0.9 * gpu.power_limit_watts - tel.idle_power_watts) * util

    def _power_many_fn(self, gpu: GpuSpec) -> Callable[[FloatArray],
                                                        tuple[FloatArray, FloatArray]]:
        def power_many(ts: FloatArray) -> tuple[FloatArray, FloatArray]:
            tel = gpu.telemetry
            if gpu.mig is not None:
                # slice-weighted, like _reading; per-instance sums clamp separately
                parent = gpu.mig_family.parent_slices if gpu.mig_family else 7
                util = np.zeros(ts.shape)
                for m in gpu.mig:
                    inst = np.zeros(ts.shape)
                    for s in self._timeline.by_gpu[gpu.index]:
                        if s.mig == m.index:
                            alive, since = s.window.alive_many(ts)
                            inst += alive * s.sm_util.at_many(since)
                    util += np.minimum(inst, 1.0) * m.slices / parent
            else:
                util = np.minimum(1.0, tel.utilization.at_many(ts)
                                  + self._timeline.gpu_util_many(gpu.index, ts))
            if tel.power_watts is not None:
                power = np.minimum(tel.power_watts.at_many(ts), gpu.power_limit_watts)
            else:
                power = tel.idle_power_watts + (0.9 * gpu.power_limit_watts
                                                - tel.idle_power_watts) * util
            return power, (util <= 0.0).astype(np.float64)
        return power_many

    # -----------------------------------------------------------------------------------------
    # init, system

    def nvmlInit(self) -> None:
        if self.now() < self._no_driver_until:
            code = (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND
                    if self.scenario.driver_error == "library_not_found"
                    else pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
            raise _err(code)
        with self._lock:
            self._init_count += 1

    def nvmlInitWithFlags(self, flags: int) -> None:
        del flags
        self.nvmlInit()

    def nvmlShutdown(self) -> None:
        with self._lock:
            self._check_init()
            self._init_count -= 1
        self.notify()

    def nvmlSystemGetDriverVersion(self) -> str:
        self._check_init()
        return self.scenario.driver_version

    def nvmlSystemGetNVMLVersion(self) -> str:
        self._check_init()
        return f"{self.scenario.cuda_version // 1000}.{self.scenario.driver_version}"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._check_init()
        return self.scenario.cuda_version

    nvmlSystemGetCudaDriverVersion_v2 = nvmlSystemGetCudaDriverVersion

    def nvmlDeviceGetCount(self) -> int:
        self._check_init()
        return len(self.scenario.gpus)

    # -----------------------------------------------------------------------------------------
    # identity

    def nvmlDeviceGetHandleByIndex(self, index: int) -> SimDevice:
        self._check_init()
        if not isinstance(index, int) or not 0 <= index < len(self.scenario.gpus):
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return SimDevice(index)

    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> SimDevice:
        self._check_init()
        text = uuid.decode() if isinstance(uuid, bytes) else uuid
        for g in self.scenario.gpus:
            if g.uuid == text:
                return SimDevice(g.index)
            for m in g.mig or ():
                if m.uuid == text:
                    return SimDevice(g.index, m.index)
        raise _err(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetHandleByPciBusId(self, bus_id: str | bytes) -> SimDevice:
        self._check_init()
        text = (bus_id.decode() if isinstance(bus_id, bytes) else bus_id).upper()
        for g in self.scenario.gpus:
            if g.pci_bus_id.upper() == text:
                return SimDevice(g.index)
        raise _err(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetIndex(self, handle: SimDevice) -> int:
        gpu, _, _ = self._dev(handle)
        return gpu.index

    def nvmlDeviceGetMinorNumber(self, handle: SimDevice) -> int:
        gpu, _, _ = self._dev(handle)
        return gpu.index

    def nvmlDeviceGetUUID(self, handle: SimDevice) -> str:
        gpu, mig, _ = self._dev(handle, mig_ok=True)
        return mig.uuid if mig is not None else gpu.uuid

    def nvmlDeviceGetName(self, handle: SimDevice) -> str:
        gpu, mig, _ = self._dev(handle, mig_ok=True)
        return f"{gpu.model} MIG {mig.profile}" if mig is not None else gpu.model

    def nvmlDeviceGetPciInfo(self, handle: SimDevice) -> Any:
        gpu, _, _ = self._dev(handle)
        domain, bus, rest = gpu.pci_bus_id.split(":")
        info = pynvml.nvmlPciInfo_t()
        info.busId = gpu.pci_bus_id
        info.busIdLegacy = gpu.pci_bus_id[4:]
        info.domain = int(domain, 16)
        info.bus = int(bus, 16)
        info.device = int(rest.split(".")[0], 16)
        info.pciDeviceId = 0x233010DE
        info.pciSubSystemId = 0x16C110DE
        return info

    nvmlDeviceGetPciInfo_v3 = nvmlDeviceGetPciInfo

    def nvmlDeviceGetVbiosVersion(self, handle: SimDevice) -> str:
        gpu, _, _ = self._dev(handle)
        return gpu.vbios_version

    def nvmlDeviceGetVirtualizationMode(self, handle: SimDevice) -> int:
        gpu, _, _ = self._dev(handle)
        return gpu.virtualization_mode

    def nvmlDeviceGetPersistenceMode(self, handle: SimDevice) -> int:
        self._dev(handle)
        return int(pynvml.NVML_FEATURE_ENABLED)

    def nvmlDeviceGetComputeMode(self, handle: SimDevice) -> int:
        gpu, _, _ = self._dev(handle)
        return int(pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS if gpu.sharing.mode == "mps"
                   else pynvml.NVML_COMPUTEMODE_DEFAULT)

    def nvmlDeviceGetMigMode(self, handle: SimDevice) -> list[int]:
        gpu, _, _ = self._dev(handle)
        if gpu.mig_family is None:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        mode = int(gpu.mig is not None)
        return [mode, mode]

    def nvmlDeviceGetAttributes(self, handle: SimDevice) -> Any:
        gpu, mig, _ = self._dev(handle, mig_ok=True)
        attrs = pynvml.c_nvmlDeviceAttributes()
        if mig is not None:
            attrs.multiprocessorCount = mig.multiprocessors
            attrs.gpuInstanceSliceCount = mig.slices
            attrs.computeInstanceSliceCount = mig.slices
            attrs.memorySizeMB = mig.memory_bytes >> 20
            attrs.sharedCopyEngineCount = max(1, mig.slices)
            attrs.sharedDecoderCount = mig.slices // 2
            attrs.sharedJpegCount = mig.slices // 7
            attrs.sharedOfaCount = mig.slices // 7
        else:
            slices = gpu.mig_family.parent_slices if gpu.mig_family else 0
            attrs.multiprocessorCount = gpu.multiprocessors
            attrs.gpuInstanceSliceCount = slices
            attrs.computeInstanceSliceCount = slices
            attrs.memorySizeMB = gpu.memory_bytes >> 20
        return attrs

    nvmlDeviceGetAttributes_v2 = nvmlDeviceGetAttributes

    # -----------------------------------------------------------------------------------------
    # MIG

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: SimDevice) -> int:
        gpu, _, _ = self._dev(handle)
        return gpu.mig_family.parent_slices if gpu.mig_family else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: SimDevice,
                                            index: int) -> SimDevice:
        gpu, _, _ = self._dev(handle)
        if gpu.mig_family is None:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if not 0 <= index < gpu.mig_family.parent_slices:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if gpu.mig is None or index >= len(gpu.mig):
            raise _err(pynvml.NVML_ERROR_NOT_FOUND)
        return SimDevice(gpu.index, index)

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self,
                                                     handle: SimDevice) -> SimDevice:
        gpu, mig, _ = self._dev(handle, mig_ok=True)
        if mig is None:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return SimDevice(gpu.index)

    def nvmlDeviceIsMigDeviceHandle(self, handle: SimDevice) -> bool:
        _, mig, _ = self._dev(handle, mig_ok=True)
        return mig is not None

    def nvmlDeviceGetGpuInstanceId(self, handle: SimDevice) -> int:
        _, mig, _ = self._dev(handle, mig_ok=True)
        if mig is None:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return mig.gpu_instance_id

    def nvmlDeviceGetComputeInstanceId(self, handle: SimDevice) -> int:
        _, mig, _ = self._dev(handle, mig_ok=True)
        if mig is None:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return mig.compute_instance_id

    def nvmlDeviceGetGpuInstanceProfileInfo(self, handle: SimDevice, profile: int,
                                            version: int = 2) -> Any:
        gpu, _, _ = self._dev(handle)
        fam = gpu.mig_family
        if fam is None:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        shape = _GI_PROFILES.get(profile)
        if shape is None:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        g, mem = shape
        mem = min(mem, fam.memory_slices)
        if g not in fam.sms or mem not in fam.labels:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        info = (pynvml.c_nvmlGpuInstanceProfileInfo_v2_t() if version == 2
                else pynvml.c_nvmlGpuInstanceProfileInfo_t())
        info.id = profile
        info.isP2pSupported = 0
        info.sliceCount = g
        info.instanceCount = fam.parent_slices // g
        info.multiprocessorCount = fam.sms[g]
        info.copyEngineCount = g
        info.decoderCount = g // 2
        info.encoderCount = 0
        info.memorySizeMB = (gpu.memory_bytes * mem // fam.memory_slices) >> 20
        if version == 2:
            info.name = f"MIG {g}g.{fam.labels[mem]}"
        return info

    # -----------------------------------------------------------------------------------------
    # telemetry

    def nvmlDeviceGetTemperature(self, handle: SimDevice, sensor: int) -> int:
        gpu, _, t = self._dev(handle, "temperature")
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return round(self._temperature(gpu, t))

    def _temperature(self, gpu: GpuSpec, t: float) -> float:
        if gpu.telemetry.temperature is not None:
            return gpu.telemetry.temperature.at(t)
        return 30.0 + 45.0 * self._reading(gpu, t).util

    def _memory_temperature(self, gpu: GpuSpec, t: float) -> float:
        if gpu.telemetry.memory_temperature is not None:
            return gpu.telemetry.memory_temperature.at(t)
        return self._temperature(gpu, t) + 8.0

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
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        r = self._reading(gpu, t)
        return pynvml.c_nvmlUtilization_t(gpu=round(100 * r.util), memory=round(100 * r.mem_util))

    def nvmlDeviceGetEncoderUtilization(self, handle: SimDevice) -> list[int]:
        gpu, _, t = self._dev(handle, "encoder")
        if gpu.mig is not None:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return [round(100 * gpu.telemetry.encoder_utilization.at(t)), ENCODER_SAMPLING_PERIOD_US]

    def nvmlDeviceGetDecoderUtilization(self, handle: SimDevice) -> list[int]:
        gpu, _, t = self._dev(handle, "decoder")
        if gpu.mig is not None:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
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
            raise _err(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
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
        raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)

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
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED if 0 <= policy
                       < pynvml.NVML_PERF_POLICY_COUNT else pynvml.NVML_ERROR_INVALID_ARGUMENT)
        # referenceTime is a CPU timestamp in µs; violationTime is ns of throttling
        return pynvml.c_nvmlViolationTime_t(referenceTime=int(self._clock() * 1e6),
                                            violationTime=int(seconds * 1e9))

    def nvmlDeviceGetPerformanceState(self, handle: SimDevice) -> int:
        gpu, _, t = self._dev(handle)
        return 0 if self._reading(gpu, t).util > 0 else 8

    # -----------------------------------------------------------------------------------------
    # reliability

    def nvmlDeviceGetTotalEccErrors(self, handle: SimDevice, error_type: int,
                                    counter_type: int) -> int:
        gpu, _, t = self._dev(handle, "ecc")
        if counter_type not in (pynvml.NVML_VOLATILE_ECC, pynvml.NVML_AGGREGATE_ECC):
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        faults = self._faults(gpu.index, "ecc", t)
        if error_type == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED:
            return sum(f.corrected for f in faults)
        if error_type == pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED:
            return sum(f.uncorrected for f in faults)
        raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlDeviceGetRemappedRows(self, handle: SimDevice) -> tuple[int, int, int, int]:
        gpu, _, t = self._dev(handle, "remapped_rows")
        faults = self._faults(gpu.index, "row_remap", t)
        return (sum(f.corrected for f in faults), sum(f.uncorrected for f in faults),
                int(any(f.pending for f in faults)), int(any(f.failure for f in faults)))

    def nvmlDeviceGetPcieReplayCounter(self, handle: SimDevice) -> int:
        gpu, _, t = self._dev(handle, "pcie_replay")
        return sum(f.count for f in self._faults(gpu.index, "pcie_replay", t))

    def _link(self, handle: SimDevice, link: int) -> tuple[GpuSpec, float]:
        gpu, _, t = self._dev(handle, "nvlink")
        if not 0 <= link < pynvml.NVML_NVLINK_MAX_LINKS:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if link >= gpu.nvlink_links:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu, t

    def nvmlDeviceGetNvLinkState(self, handle: SimDevice, link: int) -> int:
        gpu, t = self._link(handle, link)
        down = any(f.link == link for f in self._active(gpu.index, "nvlink_down", t))
        return int(pynvml.NVML_FEATURE_DISABLED if down else pynvml.NVML_FEATURE_ENABLED)

    def nvmlDeviceGetNvLinkErrorCounter(self, handle: SimDevice, link: int,
                                        counter: int) -> int:
        gpu, t = self._link(handle, link)
        names = {pynvml.NVML_NVLINK_ERROR_DL_REPLAY: "replay",
                 pynvml.NVML_NVLINK_ERROR_DL_RECOVERY: "recovery",
                 pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT: "crc_flit",
                 pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA: "crc_data"}
        if counter not in names:
            ecc = counter == pynvml.NVML_NVLINK_ERROR_DL_ECC_DATA
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED if ecc
                       else pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return sum(f.count for f in self._faults(gpu.index, "nvlink_error", t)
                   if f.link == link and f.error_type == names[counter])

    # -----------------------------------------------------------------------------------------
    # field values

    def nvmlDeviceGetFieldValues(self, handle: SimDevice,
                                 field_ids: Sequence[int | tuple[int, int]]) -> Any:
        gpu, _, t = self._dev(handle)
        values = (pynvml.c_nvmlFieldValue_t * len(field_ids))()
        stamp = int(self._clock() * 1e6)
        for i, fid in enumerate(field_ids):
            v = values[i]
            if isinstance(fid, tuple):
                v.fieldId, v.scopeId = fid
            else:
                v.fieldId = fid
            v.timestamp = stamp
            got = self._field(gpu, int(v.fieldId), int(v.scopeId), t)
            if got is None:
                v.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
                continue
            value_type, value = got
            v.nvmlReturn = pynvml.NVML_SUCCESS
            v.valueType = value_type
            if value_type == pynvml.NVML_VALUE_TYPE_DOUBLE:
                v.value.dVal = float(value)
            elif value_type == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT:
                v.value.uiVal = int(value)
            else:
                v.value.ullVal = int(value)
        return values

    def _field(self, gpu: GpuSpec, fid: int, scope: int, t: float) -> tuple[int, float] | None:
        del scope
        uint, ull = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
        readers: dict[int, tuple[str, int, Callable[[], float]]] = {
            pynvml.NVML_FI_DEV_MEMORY_TEMP:
                ("memory_temperature", uint, lambda: round(self._memory_temperature(gpu, t))),
            pynvml.NVML_FI_DEV_POWER_INSTANT:
                ("power", uint, lambda: round(1000 * self._power_watts(
                    gpu, t, self._reading(gpu, t).util))),
            pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION:
                ("energy", ull, lambda: int(1000 * self._integrators[gpu.index].at(t)[0])),
            pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER:
                ("pcie_replay", ull, lambda: sum(
                    f.count for f in self._faults(gpu.index, "pcie_replay", t))),
            pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT:
                ("nvlink", uint, lambda: gpu.nvlink_links),
            pynvml.NVML_FI_DEV_REMAPPED_COR:
                ("remapped_rows", uint, lambda: sum(
                    f.corrected for f in self._faults(gpu.index, "row_remap", t))),
            pynvml.NVML_FI_DEV_REMAPPED_UNC:
                ("remapped_rows", uint, lambda: sum(
                    f.uncorrected for f in self._faults(gpu.index, "row_remap", t))),
            pynvml.NVML_FI_DEV_REMAPPED_PENDING:
                ("remapped_rows", uint, lambda: int(any(
                    f.pending for f in self._faults(gpu.index, "row_remap", t)))),
            pynvml.NVML_FI_DEV_REMAPPED_FAILURE:
                ("remapped_rows", uint, lambda: int(any(
                    f.failure for f in self._faults(gpu.index, "row_remap", t)))),
        }
        entry = readers.get(fid)
        if entry is None or self._unsupported(gpu, entry[0], t):
            return None
        if fid == pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT and gpu.nvlink_links == 0:
            return None
        with self._lock:
            return entry[1], entry[2]()

    # -----------------------------------------------------------------------------------------
    # processes

    def _proc_ids(self, gpu: GpuSpec, p: SimProcess) -> tuple[int, int]:
        if gpu.mig is None or p.mig is None:
            return NOT_MIG, NOT_MIG
        m = gpu.mig[p.mig]
        return m.gpu_instance_id, m.compute_instance_id

    def nvmlDeviceGetComputeRunningProcesses(self, handle: SimDevice) -> list[Any]:
        gpu, mig, t = self._dev(handle, mig_ok=True)
        procs = self._reading(gpu, t, None if mig is None else mig.index).procs
        out = []
        for p in procs:
            gi, ci = self._proc_ids(gpu, p)
            out.append(pynvml.c_nvmlProcessInfo_t(pid=p.pid, usedGpuMemory=p.memory_bytes,
                                                  gpuInstanceId=gi, computeInstanceId=ci))
        return out

    nvmlDeviceGetComputeRunningProcesses_v2 = nvmlDeviceGetComputeRunningProcesses
    nvmlDeviceGetComputeRunningProcesses_v3 = nvmlDeviceGetComputeRunningProcesses

    def nvmlDeviceGetMPSComputeRunningProcesses(self, handle: SimDevice) -> list[Any]:
        gpu, mig, _ = self._dev(handle, mig_ok=True)
        sharing = mig.sharing if mig is not None else gpu.sharing
        return self.nvmlDeviceGetComputeRunningProcesses(handle) if sharing.mode == "mps" else []

    nvmlDeviceGetMPSComputeRunningProcesses_v3 = nvmlDeviceGetMPSComputeRunningProcesses

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: SimDevice) -> list[Any]:
        self._dev(handle, mig_ok=True)
        return []

    nvmlDeviceGetGraphicsRunningProcesses_v3 = nvmlDeviceGetGraphicsRunningProcesses

    def nvmlDeviceGetProcessUtilization(self, handle: SimDevice,
                                        last_seen_us: int) -> list[Any]:
        gpu, _, _ = self._dev(handle, "process_utilization")
        if gpu.mig is not None:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        # the driver samples on a fixed period; the newest sample is the last period boundary
        stamp = int(self._clock() * 1e6) // PROCESS_SAMPLE_PERIOD_US * PROCESS_SAMPLE_PERIOD_US
        if stamp <= last_seen_us:
            raise _err(pynvml.NVML_ERROR_NOT_FOUND)
        r = self._reading(gpu, stamp / 1e6 - self.start)
        if not r.procs:
            raise _err(pynvml.NVML_ERROR_NOT_FOUND)
        # per-process shares of a busy GPU add up to at most 100%
        scale = 1.0 / r.proc_util if r.proc_util > 1.0 else 1.0
        mem_total = sum(p.mem_util for p in r.procs)
        mem_scale = 1.0 / mem_total if mem_total > 1.0 else 1.0
        return [pynvml.c_nvmlProcessUtilizationSample_t(
            pid=p.pid, timeStamp=stamp, smUtil=round(100 * p.sm_util * scale),
            memUtil=round(100 * p.mem_util * mem_scale), encUtil=0, decUtil=0)
            for p in r.procs]

    # -----------------------------------------------------------------------------------------
    # GPM

    def nvmlGpmQueryDeviceSupport(self, handle: SimDevice) -> Any:
        gpu, _, t = self._dev(handle)
        support = pynvml.c_nvmlGpmSupport_t()
        support.version = pynvml.NVML_GPM_SUPPORT_VERSION
        support.isSupportedDevice = int(gpu.gpm and not self._unsupported(gpu, "gpm", t))
        return support

    def nvmlGpmSampleAlloc(self) -> Any:
        self._check_init()
        buffer = ctypes.create_string_buffer(16)
        ptr = ctypes.cast(buffer, pynvml.c_nvmlGpmSample_t)
        with self._lock:
            self._gpm[ctypes.addressof(buffer)] = _GpmSample(buffer)
        return ptr

    def _gpm_sample(self, ptr: Any) -> _GpmSample:
        address = ctypes.cast(ptr, ctypes.c_void_p).value if ptr is not None else None
        sample = self._gpm.get(address or 0)
        if sample is None:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return sample

    def nvmlGpmSampleFree(self, ptr: Any) -> None:
        self._check_init()
        with self._lock:
            self._gpm_sample(ptr)
            del self._gpm[ctypes.cast(ptr, ctypes.c_void_p).value or 0]

    def nvmlGpmSampleGet(self, handle: SimDevice, ptr: Any) -> Any:
        return self._gpm_take(handle, None, ptr)

    def nvmlGpmMigSampleGet(self, handle: SimDevice, gpu_instance_id: int,
                            ptr: Any) -> Any:
        return self._gpm_take(handle, gpu_instance_id, ptr)

    def _gpm_take(self, handle: SimDevice, gi: int | None, ptr: Any) -> Any:
        gpu, _, t = self._dev(handle)
        if not gpu.gpm or self._unsupported(gpu, "gpm", t):
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if gi is not None and not any(m.gpu_instance_id == gi for m in gpu.mig or ()):
            raise _err(pynvml.NVML_ERROR_NOT_FOUND)
        with self._lock:
            sample = self._gpm_sample(ptr)
            sample.gpu, sample.gpu_instance, sample.t = gpu.index, gi, t
        return ptr

    def nvmlGpmMetricsGet(self, request: Any) -> Any:
        self._check_init()
        if request.version != pynvml.NVML_GPM_METRICS_GET_VERSION:
            raise _err(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        with self._lock:
            s1, s2 = self._gpm_sample(request.sample1), self._gpm_sample(request.sample2)
        if s1.gpu < 0 or s1.gpu != s2.gpu or s1.gpu_instance != s2.gpu_instance:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu = self.scenario.gpus[s1.gpu]
        if self.now() >= self._lost_at.get(gpu.index, math.inf):
            raise _err(pynvml.NVML_ERROR_GPU_IS_LOST)
        lo, hi = sorted((s1.t, s2.t))
        # a GPM metric is an average over the interval between the two samples
        points = [lo + (hi - lo) * (i + 0.5) / 5 for i in range(5)] if hi > lo else [hi]
        mig = None
        if s1.gpu_instance is not None:
            mig = next(m.index for m in gpu.mig or () if m.gpu_instance_id == s1.gpu_instance)
        totals = dict.fromkeys(_GPM_METRICS, 0.0)
        for t in points:
            for metric, value in self._gpm_values(gpu, mig, t).items():
                totals[metric] += value / len(points)
        for i in range(int(request.numMetrics)):
            m = request.metrics[i]
            if m.metricId in totals:
                m.value = totals[m.metricId]
                m.nvmlReturn = pynvml.NVML_SUCCESS
            else:
                m.value = 0.0
                m.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        return request

    def _gpm_values(self, gpu: GpuSpec, mig: int | None, t: float) -> dict[int, float]:
        r = self._reading(gpu, t, mig)
        sm = r.util if mig is None else min(1.0, r.proc_util)
        return {pynvml.NVML_GPM_METRIC_SM_UTIL: 100.0 * sm,
                pynvml.NVML_GPM_METRIC_SM_OCCUPANCY: 70.0 * sm,
                pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: 100.0 * r.tensor_util,
                pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: 100.0 * r.mem_util}

    # -----------------------------------------------------------------------------------------
    # events

    def nvmlEventSetCreate(self) -> int:
        self._check_init()
        with self._cond:
            handle = self._next_set
            self._next_set += 1
            self._sets[handle] = _EventSet()
        return handle

    def _event_set(self, handle: object) -> _EventSet:
        s = self._sets.get(handle) if isinstance(handle, int) else None
        if s is None or s.freed:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return s

    def nvmlDeviceGetSupportedEventTypes(self, handle: SimDevice) -> int:
        self._dev(handle, "events")
        return _SUPPORTED_EVENTS

    def nvmlDeviceRegisterEvents(self, handle: SimDevice, event_types: int,
                                 event_set: int) -> None:
        gpu, _, t = self._dev(handle, "events")
        if event_types & ~_SUPPORTED_EVENTS:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        with self._cond:
            s = self._event_set(event_set)
            if event_types & pynvml.nvmlEventTypeXidCriticalError:
                s.registered.setdefault(gpu.index, t)

    def _pending(self, s: _EventSet, t: float) -> tuple[int, _Event] | None:
        for i, e in enumerate(self._events):
            if e.at > t:
                break
            since = s.registered.get(e.gpu)
            if since is not None and e.at >= since and i not in s.delivered:
                return i, e
        return None

    def nvmlEventSetWait_v2(self, event_set: int, timeout_ms: int) -> SimEventData:
        self._check_init()
        deadline = time.monotonic() + max(0, timeout_ms) / 1000.0
        with self._cond:
            while True:
                s = self._event_set(event_set)
                if self._init_count <= 0:
                    raise _err(pynvml.NVML_ERROR_UNINITIALIZED)
                found = self._pending(s, self.now())
                if found is not None:
                    i, e = found
                    s.delivered.add(i)
                    return self._event_data(e)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise _err(pynvml.NVML_ERROR_TIMEOUT)
                self._cond.wait(min(EVENT_POLL_S, remaining))

    nvmlEventSetWait = nvmlEventSetWait_v2

    def _event_data(self, e: _Event) -> SimEventData:
        gi = ci = NOT_MIG
        gpu = self.scenario.gpus[e.gpu]
        if e.mig is not None and gpu.mig is not None:
            gi, ci = gpu.mig[e.mig].gpu_instance_id, gpu.mig[e.mig].compute_instance_id
        return SimEventData(device=SimDevice(e.gpu), eventType=pynvml.nvmlEventTypeXidCriticalError,
                            eventData=e.xid, gpuInstanceId=gi, computeInstanceId=ci)

    def nvmlEventSetFree(self, event_set: int) -> None:
        self._check_init()
        with self._cond:
            self._event_set(event_set).freed = True
            self._cond.notify_all()


for _name, _value in _EXPORTS.items():
    if not hasattr(SimNVML, _name):
        setattr(SimNVML, _name, _value)
