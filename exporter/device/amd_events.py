"""AMD RAS error events: the CPER records (UEFI Common Platform Error Records) the driver
keeps per GPU, read with a cursor, each with the AMD Field Identifiers (AFIDs) it carries.

amdsmi (ROCm/amdsmi py-interface/amdsmi_interface.py at 4bc305a; rocm-systems docs):
`amdsmi_get_gpu_cper_entries(handle, severity_mask, buffer_size, cursor)` returns
`(entries, next_cursor, records, status)`: `entries` maps each record's position to its header
(`error_severity`: "non_fatal_uncorrected", "fatal" or "non_fatal_corrected"), `records` the
raw records as `{"bytes", "size"}`; `amdsmi_get_afids_from_cper([record])` returns
`(afids, count)`. Each AFID of a record is an `ErrorEvent` of kind "afid" (code the AFID), a
record without one a "ras" event (code 0); severity as the contract spells it.

Records written before the exporter started are skipped at registration (like NVML's event
set, which only sees events from its creation). The driver is polled at most every
`interval` seconds; a library without the CPER functions (older releases) reports nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from exporter.device.amd_calls import status_of, text
from exporter.device.amd_inventory import AmdGpu
from exporter.device.amdsmiapi import ABSENT_STATUSES, AmdSmiApi, Handle
from exporter.device.contract import ErrorEvent, GpuRef

log = logging.getLogger(__name__)

SEVERITY_ALL = 7  # 1 non-fatal uncorrected, 2 fatal, 4 non-fatal corrected
BUFFER_BYTES = 256 * 1024  # records are a few KiB; amdsmi's default allocates 4 MiB a call
MAX_SKIP_CALLS = 1000  # bound on reading past old records at registration
SEVERITY = {"non_fatal_uncorrected": "uncorrectable", "fatal": "fatal",
            "non_fatal_corrected": "correctable", "corrected": "correctable"}


class AmdEventSource:
    def __init__(self, api: Callable[[], AmdSmiApi], interval: float = 5.0,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self._api = api
        self._interval = interval
        self._clock = clock
        self._sleep = sleep
        self._cursors: dict[str, tuple[Handle, int]] = {}  # uuid -> (handle, next record)
        self._seen: set[str] = set()
        self._last_poll: float | None = None

    def register(self, gpus: Sequence[GpuRef]) -> None:
        try:
            api = self._api()
        except RuntimeError:  # amdsmi not loaded (the backend is down): next time
            return
        for gpu in gpus:
            if gpu.uuid in self._seen or not isinstance(gpu.handle, AmdGpu):
                continue
            self._seen.add(gpu.uuid)
            cursor: int | None = 0
            for _ in range(MAX_SKIP_CALLS):  # past the records written before now
                got = self._read(api, gpu.uuid, gpu.handle.primary, cursor or 0)
                if got is None:
                    cursor = None
                    break
                next_cursor, records = got
                if not records or next_cursor == cursor:
                    break
                cursor = next_cursor
            if cursor is not None:
                self._cursors[gpu.uuid] = (gpu.handle.primary, cursor)

    def wait(self, timeout_ms: int) -> list[ErrorEvent] | None:
        now = self._clock()
        if self._cursors and (self._last_poll is None
                              or now - self._last_poll >= self._interval):
            self._last_poll = now
            events = self._poll()
            if events:
                return events
        if timeout_ms > 0:
            self._sleep(timeout_ms / 1000.0)
        return None

    def close(self) -> None:
        self._cursors.clear()

    def _poll(self) -> list[ErrorEvent]:
        api = self._api()
        events: list[ErrorEvent] = []
        for uuid, (handle, cursor) in list(self._cursors.items()):
            got = self._read(api, uuid, handle, cursor, events)
            if got is not None:
                self._cursors[uuid] = (handle, got[0])
        return events

    def _read(self, api: AmdSmiApi, uuid: str, handle: Handle, cursor: int,
              events: list[ErrorEvent] | None = None) -> tuple[int, list[object]] | None:
        """The next cursor and the records from `cursor` (events appended when asked); None
        when this GPU has no CPER records to give (it is then no longer polled)."""
        try:
            entries, next_cursor, records, _ = api.amdsmi_get_gpu_cper_entries(
                handle, SEVERITY_ALL, BUFFER_BYTES, cursor)
        except api.AmdSmiLibraryException as err:
            code = status_of(err)
            if code in ABSENT_STATUSES:
                self._cursors.pop(uuid, None)
                return None
            log.debug("CPER entries of GPU %s: amdsmi status %s", uuid, code)
            return cursor, []
        if events is not None:
            for i, record in enumerate(records):
                header = entries.get(i, {}) if isinstance(entries, dict) else {}
                severity = SEVERITY.get(text(header.get("error_severity")), "")
                afids = self._afids(api, record)
                events.extend(ErrorEvent(uuid, a, "afid", severity) for a in afids)
                if not afids:
                    events.append(ErrorEvent(uuid, 0, "ras", severity))
        return int(next_cursor), list(records)

    @staticmethod
    def _afids(api: AmdSmiApi, record: object) -> list[int]:
        try:
            afids, _ = api.amdsmi_get_afids_from_cper([record])
        except api.AmdSmiLibraryException:
            return []
        return [int(a) for a in afids]
