"""What every group of simulated NVML calls stands on: device handles, NVML errors, handle
resolution (lost GPUs, unsupported fields), the per-instant readings, the energy integral,
init and shutdown."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pynvml

from gpusim.model import Fault, GpuSpec, MigSpec, Scenario
from gpusim.node import SimProcess, Timeline, timeline
from gpusim.signal import FloatArray
from gpusim.traffic import Traffic

INTEGRATION_STEP_S = 15.0  # grid for energy / low-utilisation time: pure in t, any cadence


def nvml_error(code: int) -> pynvml.NVMLError:
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
class Reading:
    """Everything about one GPU at one instant that several calls share."""

    procs: list[SimProcess]
    util: float  # 0-1, device
    proc_util: float  # sum of the processes' SM utilisation, not clamped
    mem_util: float
    tensor_util: float
    memory_used: int  # process memory, bytes


class Integrator:
    """Integrals of two rates of one GPU (power in W and idle 0/1 -> J and idle s; or
    utilisation -> busy s) on a fixed grid, so the integral at t is a pure function of t:
    monotonic, and the same whatever the call cadence."""

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


class NvmlCore:
    """The state every group of calls shares: the scenario, the clock, init count, lost GPUs,
    and the readings several calls derive from (utilisation, power, temperatures).
    `no_driver_until` (scenario seconds) overrides the scenario's `driver.unavailable_until`:
    nvmlInit fails until then."""

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
        self._reading_cache: dict[int, tuple[float, Reading]] = {}
        self._integrators = {g.index: Integrator(self._power_many_fn(g)) for g in scenario.gpus}
        busy = {g.index: Integrator(self._busy_many_fn(g)) for g in scenario.gpus}
        self.traffic = Traffic(scenario, lambda gpu, t: busy[gpu].at(t)[0])
        self._lost_at: dict[int, float] = {}
        for f in scenario.faults:
            if f.kind == "lost":
                self._lost_at[f.gpu] = min(f.at, self._lost_at.get(f.gpu, math.inf))

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
            raise nvml_error(pynvml.NVML_ERROR_UNINITIALIZED)

    def _dev(self, handle: object, field_name: str = "",
             mig_ok: bool = False) -> tuple[GpuSpec, MigSpec | None, float]:
        """Resolve a handle for a call at the current time; raise what real NVML would."""
        self._check_init()
        if not isinstance(handle, SimDevice) or not 0 <= handle.gpu < len(self.scenario.gpus):
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        t = self.now()
        gpu = self.scenario.gpus[handle.gpu]
        if t >= self._lost_at.get(gpu.index, math.inf):
            raise nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)
        mig = None
        if handle.mig is not None:
            if gpu.mig is None or handle.mig >= len(gpu.mig):
                raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            mig = gpu.mig[handle.mig]
            if not mig_ok:
                raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if field_name and self._unsupported(gpu, field_name, t):
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
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

    def _reading(self, gpu: GpuSpec, t: float, mig: int | None = None) -> Reading:
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
        r = Reading(
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

    def _util_many_fn(self, gpu: GpuSpec) -> Callable[[FloatArray], FloatArray]:
        """Device utilisation (0-1) at many instants, as _reading computes it at one."""
        def util_many(ts: FloatArray) -> FloatArray:
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
                return util
            return np.minimum(1.0, gpu.telemetry.utilization.at_many(ts)
                              + self._timeline.gpu_util_many(gpu.index, ts))
        return util_many

    def _busy_many_fn(self, gpu: GpuSpec) -> Callable[[FloatArray],
                                                       tuple[FloatArray, FloatArray]]:
        util_many = self._util_many_fn(gpu)
        return lambda ts: (util_many(ts), np.zeros(ts.shape))

    def _power_many_fn(self, gpu: GpuSpec) -> Callable[[FloatArray],
                                                        tuple[FloatArray, FloatArray]]:
        util_many = self._util_many_fn(gpu)

        def power_many(ts: FloatArray) -> tuple[FloatArray, FloatArray]:
            tel = gpu.telemetry
            util = util_many(ts)
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
            raise nvml_error(code)
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

    def _temperature(self, gpu: GpuSpec, t: float) -> float:
        if gpu.telemetry.temperature is not None:
            return gpu.telemetry.temperature.at(t)
        return 30.0 + 45.0 * self._reading(gpu, t).util

    def _memory_temperature(self, gpu: GpuSpec, t: float) -> float:
        if gpu.telemetry.memory_temperature is not None:
            return gpu.telemetry.memory_temperature.at(t)
        return self._temperature(gpu, t) + 8.0
