"""Simulated NVML: event sets, registration, and XID events (scenario XIDs and lost GPUs)
delivered by nvmlEventSetWait."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pynvml

from gpusim.model import NOT_MIG, Scenario
from gpusim.nvml_core import NvmlCore, SimDevice, nvml_error

EVENT_POLL_S = 0.05  # how often a blocked event wait re-reads a (possibly fake) clock

_SUPPORTED_EVENTS: int = (pynvml.nvmlEventTypeXidCriticalError
                          | pynvml.nvmlEventTypeSingleBitEccError
                          | pynvml.nvmlEventTypeDoubleBitEccError | pynvml.nvmlEventTypePState
                          | pynvml.nvmlEventTypeClock)


@dataclass
class SimEventData:
    """What nvmlEventSetWait returns (the fields of c_nvmlEventData_t)."""

    device: SimDevice
    eventType: int  # pynvml's field names
    eventData: int
    gpuInstanceId: int
    computeInstanceId: int


@dataclass(frozen=True)
class Event:
    at: float
    gpu: int
    xid: int
    mig: int | None


@dataclass
class EventSet:
    registered: dict[int, float] = field(default_factory=dict)  # gpu -> registration time
    delivered: set[int] = field(default_factory=set)  # indexes into SimNVML._events
    freed: bool = False


class EventQueries(NvmlCore):
    """XID events: the scenario's, and XID 79 when a GPU falls off the bus."""

    def __init__(self, scenario: Scenario, clock: Callable[[], float] = time.time,
                 start: float | None = None, no_driver_until: float | None = None) -> None:
        super().__init__(scenario, clock, start, no_driver_until)
        self._sets: dict[int, EventSet] = {}
        self._next_set = 1
        events = [Event(x.at, x.gpu, x.xid, x.mig) for x in scenario.xids]
        events += [Event(at, gpu, 79, None) for gpu, at in self._lost_at.items()]
        self._events = sorted(events, key=lambda e: (e.at, e.gpu))

    def nvmlEventSetCreate(self) -> int:
        self._check_init()
        with self._cond:
            handle = self._next_set
            self._next_set += 1
            self._sets[handle] = EventSet()
        return handle

    def _event_set(self, handle: object) -> EventSet:
        s = self._sets.get(handle) if isinstance(handle, int) else None
        if s is None or s.freed:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return s

    def nvmlDeviceGetSupportedEventTypes(self, handle: SimDevice) -> int:
        self._dev(handle, "events")
        return _SUPPORTED_EVENTS

    def nvmlDeviceRegisterEvents(self, handle: SimDevice, event_types: int,
                                 event_set: int) -> None:
        gpu, _, t = self._dev(handle, "events")
        if event_types & ~_SUPPORTED_EVENTS:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        with self._cond:
            s = self._event_set(event_set)
            if event_types & pynvml.nvmlEventTypeXidCriticalError:
                s.registered.setdefault(gpu.index, t)

    def _pending(self, s: EventSet, t: float) -> tuple[int, Event] | None:
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
                    raise nvml_error(pynvml.NVML_ERROR_UNINITIALIZED)
                found = self._pending(s, self.now())
                if found is not None:
                    i, e = found
                    s.delivered.add(i)
                    return self._event_data(e)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise nvml_error(pynvml.NVML_ERROR_TIMEOUT)
                self._cond.wait(min(EVENT_POLL_S, remaining))

    nvmlEventSetWait = nvmlEventSetWait_v2

    def _event_data(self, e: Event) -> SimEventData:
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
