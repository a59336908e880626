"""XID errors as NVML events: one event set per subscription, waited on by the XID watcher
(exporter/collectors/xid.py)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence

from exporter.device.contract import ErrorEvent, EventsUnavailable, GpuRef
from exporter.device.nvmlapi import Handle, NvmlApi, Struct
from exporter.nvmlcall import NvmlOutcome, classify, text

log = logging.getLogger(__name__)
XID_CRITICAL_ERROR = 0x8  # nvmlEventTypeXidCriticalError (nvml.h)


class NvmlEventSource:
    def __init__(self, nvml: NvmlApi) -> None:
        self.nvml = nvml
        self._set: Struct = None
        self._registered: set[str] = set()
        self._handles: list[tuple[Handle, str]] = []

    def register(self, gpus: Sequence[GpuRef]) -> None:
        """Register XID events for GPUs not registered yet (idempotent, cheap)."""
        nv = self.nvml
        if self._set is None:
            self._set = nv.nvmlEventSetCreate()
        for gpu in gpus:
            if gpu.uuid in self._registered:
                continue
            try:
                nv.nvmlDeviceRegisterEvents(gpu.handle, XID_CRITICAL_ERROR, self._set)
            except nv.NVMLError as err:
                log.warning("XID events unavailable on GPU %s: %s", gpu.uuid, err)
            self._registered.add(gpu.uuid)
            self._handles.append((gpu.handle, gpu.uuid))

    def wait(self, timeout_ms: int) -> list[ErrorEvent] | None:
        nv = self.nvml
        if self._set is None:
            return None
        try:
            event = nv.nvmlEventSetWait_v2(self._set, timeout_ms)
        except nv.NVMLError as err:
            if classify(err) is NvmlOutcome.TIMEOUT:
                return None
            raise EventsUnavailable(str(err)) from err
        if not event.eventType & XID_CRITICAL_ERROR:
            return []
        return [ErrorEvent(self._uuid_of(event.device), int(event.eventData))]

    def _uuid_of(self, handle: Handle) -> str:
        for known, uuid in self._handles:
            if known is handle or known == handle:
                return uuid
        try:
            return text(self.nvml.nvmlDeviceGetUUID(handle))
        except self.nvml.NVMLError:
            return ""

    def close(self) -> None:
        if self._set is not None:
            with contextlib.suppress(self.nvml.NVMLError):
                self.nvml.nvmlEventSetFree(self._set)
            self._set = None
