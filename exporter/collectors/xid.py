"""Error events from the backends (an NVML event set; AMD RAS events), counted per GPU, kind
and code: XIDs in gpu_xid_errors_total, other vendors' events (an AMD AFID) in
gpu_error_events_total with their kind and severity.

A daemon thread blocks in the backend's event wait so an event is never
missed between scrapes; the collector only renders the counts. For simulation (a fake clock
advanced in steps) the sampler can run without the thread and drain pending events
synchronously each cycle.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from exporter.collectors.base import GpuCollector
from exporter.core import CollectorDeps, CycleContext, GpuRef, SampleSink
from exporter.device.contract import ErrorKind, EventSource, EventsUnavailable

log = logging.getLogger(__name__)
WAIT_MS = 500
EventKey = tuple[str, ErrorKind, int, str]  # uuid, kind, code, severity


class XidWatcher:
    def __init__(self, source: EventSource, clock: Callable[[], float] = time.time) -> None:
        self.source = source
        self.clock = clock
        self._lock = threading.Lock()
        self._counts: dict[EventKey, int] = {}
        self._last: dict[EventKey, float] = {}
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def register(self, gpus: list[GpuRef]) -> None:
        """Register XID events for GPUs not registered yet (idempotent, cheap)."""
        self.source.register(gpus)

    def poll(self, timeout_ms: int) -> bool:
        """Wait up to timeout_ms for one event and count it. True if one arrived."""
        try:
            events = self.source.wait(timeout_ms)
        except EventsUnavailable as err:
            log.debug("XID wait: %s", err)
            if timeout_ms:
                self._stop.wait(timeout_ms / 1000.0)
            return False
        if events is None:
            return False
        for event in events:
            key = (event.uuid, event.kind, event.code, event.severity)
            with self._lock:
                self._counts[key] = self._counts.get(key, 0) + 1
                self._last[key] = self.clock()
        return True

    def drain(self) -> None:
        while self.poll(0):
            pass

    def snapshot(self) -> list[tuple[EventKey, int, float]]:
        """(uuid, kind, code, severity), count, time of the last one; sorted."""
        with self._lock:
            return [(k, n, self._last[k]) for k, n in sorted(self._counts.items())]

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="xid-events", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.poll(WAIT_MS)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * WAIT_MS / 1000.0)
        self.source.close()


class XidCollector(GpuCollector):
    name = "xid"

    def __init__(self, deps: CollectorDeps) -> None:
        super().__init__(deps)
        self.watcher = XidWatcher(deps.backend.error_events(), deps.clock)
        self.threaded = deps.threaded

    def collect(self, ctx: CycleContext, sink: SampleSink) -> int:
        self.watcher.register(ctx.gpus)
        if self.threaded:
            self.watcher.start()
        else:
            self.watcher.drain()
        by_uuid = {g.uuid: g for g in ctx.gpus}
        for (uuid, kind, code, severity), count, last in self.watcher.snapshot():
            gpu = by_uuid.get(uuid)
            labels = gpu.labels(ctx.node) if gpu else (ctx.node, "", uuid, "", "")
            if kind == "xid":
                sink.add("gpu_xid_errors_total", (*labels, str(code)), count)
                sink.add("gpu_xid_last_timestamp_seconds", (*labels, str(code)), last)
            else:
                event = (*labels, kind, str(code), severity)
                sink.add("gpu_error_events_total", event, count)
                sink.add("gpu_error_event_last_timestamp_seconds", event, last)
        return 0

    def close(self) -> None:
        self.watcher.close()
