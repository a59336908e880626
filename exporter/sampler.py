"""The background sampler: every interval it reads every source once, renders the result and
swaps in the new rendering. Scrapes only read the last rendering, so a hung GPU or a slow
kubelet delays the next snapshot, never a scrape."""

from __future__ import annotations

import contextlib
import logging
import platform
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from exporter import __version__
from exporter.core import (
    Collector,
    CollectorDeps,
    CollectorSpec,
    CycleContext,
    ExporterOptions,
    SampleSink,
)
from exporter.device.backends import Backends
from exporter.device.contract import DeviceBackend, Inventory
from exporter.kube.watch import dropped as kube_dropped
from exporter.processes import ProcessStage
from exporter.render import Rendering
from exporter.selfstats import read_process_stats

log = logging.getLogger(__name__)

INVENTORY_REFRESH_SECONDS = 60.0
INIT_RETRY_MAX_SECONDS = 60.0


@dataclass
class _Member:
    """One backend's lifecycle: opened and inventoried on its own, retried with backoff while
    it is down, so one vendor's failing library never hides another vendor's devices."""

    backend: DeviceBackend
    ok: bool = False
    reason: str = "not initialised yet"
    next_init: float = 0.0
    backoff: float = 1.0
    inventory: Inventory | None = None
    inventory_at: float = 0.0
    pci: list[str] | None = None


class Sampler:
    def __init__(self, backend: DeviceBackend | Backends, options: ExporterOptions,
                 specs: Sequence[CollectorSpec], clock: Callable[[], float] = time.time,
                 threaded: bool = True, eager_render: bool = True) -> None:
        self.backend = Backends.of(backend)
        self._members = [_Member(b) for b in self.backend]
        self.eager_render = eager_render
        self.options = options
        self.clock = clock
        self.threaded = threaded
        deps = CollectorDeps(options=options, backend=self.backend, clock=clock,
                             threaded=threaded)
        self.collectors: list[Collector] = [spec.factory(deps) for spec in specs]
        # The process list is a stage of the cycle, run when a collector reads it.
        self._processes = (ProcessStage(self.backend) if any(c.reads_processes
                                                             for c in self.collectors) else None)
        self._pci_at = -INVENTORY_REFRESH_SECONDS
        self._last_cycle_end = 0.0
        # What the cycle is doing now and since when, and why the last one failed: /healthz
        # names the real cause of a stall instead of guessing.
        self._stage = ""
        self._stage_since = 0.0
        self._cycle_error = ""
        self._replaced_total = 0
        # /healthz fails when no sample completed for this long (a hung driver call).
        self.stale_after = max(3 * options.interval, 30.0)
        self._rendering = Rendering({})
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def _backend_ok(self) -> bool:
        """Some backend is up: the device collectors run (over the devices of those up)."""
        return any(m.ok for m in self._members)

    def inventories(self) -> list[Inventory]:
        """The last inventory of each backend up (for tests and the doctor)."""
        return [m.inventory for m in self._members if m.ok and m.inventory is not None]

    # --- backend lifecycle --------------------------------------------------------------------
    def _ensure_backend(self, m: _Member, now: float) -> None:
        if m.ok or now < m.next_init:
            return
        try:
            m.backend.open()
        except Exception as err:  # NVMLError, OSError (library missing), anything: retry later
            m.reason = f"{m.backend.library} init failed: {err}"
            m.next_init = now + m.backoff
            log.warning("%s; retrying in %.0fs", m.reason, m.backoff)
            m.backoff = min(m.backoff * 2, INIT_RETRY_MAX_SECONDS)
            return
        m.ok, m.reason, m.backoff = True, "", 1.0
        m.inventory = None
        log.info("%s initialised", m.backend.library)

    def _refresh_inventory(self, m: _Member, now: float) -> Inventory:
        if m.inventory is None or now - m.inventory_at >= INVENTORY_REFRESH_SECONDS:
            m.inventory = m.backend.inventory(m.inventory)
            m.inventory_at = now
        return m.inventory

    # --- one cycle ----------------------------------------------------------------------------
    def cycle(self) -> Rendering:
        now = self.clock()
        ctx = CycleContext(options=self.options, now=now, backend=self.backend)
        sink = SampleSink()
        for m in self._members:
            self._enter(f"{m.backend.library} init")
            self._ensure_backend(m, now)
            if not m.ok:
                continue
            self._enter("GPU discovery" if len(self._members) == 1
                        else f"{m.backend.library} discovery")
            try:
                inv = self._refresh_inventory(m, now)
            except Exception as err:
                log.exception("%s GPU discovery failed", m.backend.library)
                m.reason = f"GPU discovery failed: {err}"
                continue
            ctx.gpus += inv.gpus
            ctx.migs += inv.migs
            ctx.static = {**ctx.static, **inv.static}
            ctx.versions[m.backend.vendor] = (inv.driver_version, inv.cuda_version)
        if self._backend_ok and self._processes is not None:
            try:
                self._processes.fill(ctx)
            except Exception:
                log.exception("listing GPU processes failed")
                ctx.process_failures += 1
        for c in self.collectors:
            if c.needs_nvml and not self._backend_ok:
                sink.add("gpu_exporter_collector_success", (c.name,), 0)
                continue
            self._enter(f"collector {c.name}")
            start = time.perf_counter()
            ok = True
            try:
                ok = c.collect(ctx, sink) == 0
            except Exception:
                log.exception("collector %s failed", c.name)
                ok = False
            sink.add("gpu_exporter_collector_success", (c.name,), 1 if ok else 0)
            sink.add("gpu_exporter_collector_duration_seconds", (c.name,),
                     time.perf_counter() - start)
        self._replaced_total += sink.replaced
        if sink.replaced:
            log.warning("%d label values were not valid Unicode; replaced", sink.replaced)
        self._device_counts(ctx, sink, now)
        self._self_metrics(ctx, sink, now)
        self._enter("rendering")
        rendering = Rendering(sink.samples, eager=self.eager_render)
        self._rendering = rendering  # one reference swap: scrapes see old or new, never half
        self._last_cycle_end = self.clock()
        self._stage, self._cycle_error = "", ""
        return rendering

    def _enter(self, stage: str) -> None:
        self._stage, self._stage_since = stage, self.clock()

    def _device_counts(self, ctx: CycleContext, sink: SampleSink, now: float) -> None:
        """Expected (PCI, read at the inventory's cadence, NVML or not) vs answering GPUs."""
        if now - self._pci_at >= INVENTORY_REFRESH_SECONDS or now < self._pci_at:
            for m in self._members:
                m.pci = m.backend.expected_devices(self.options.sysfs_root)
            self._pci_at = now
        counts = [m.pci for m in self._members if m.pci is not None]
        if counts:  # the vendors' functions are disjoint (PCI vendor IDs): counts add up
            sink.add("gpu_expected_devices", (ctx.node, "pci"), sum(map(len, counts)))
        answering = sum(1 for g in ctx.gpus if g.uuid not in ctx.lost)
        sink.add("gpu_answering_devices", (ctx.node,), answering)

    def _self_metrics(self, ctx: CycleContext, sink: SampleSink, now: float) -> None:
        sink.add("gpu_exporter_last_sample_timestamp_seconds", (), now)
        sink.add("gpu_exporter_build_info", (__version__, platform.python_version()), 1)
        sink.add("gpu_exporter_label_values_replaced_total", (), self._replaced_total)
        for (kind, reason), n in sorted(kube_dropped(ctx.node).items()):
            sink.add("gpu_exporter_kube_objects_dropped_total", (kind, reason), n)
        sources = {m.backend.source: (m.ok, m.reason) for m in self._members}
        for name, status in sorted(ctx.sources.items()):
            sources[name] = (status.up, status.reason)
        for name, (up, reason) in sources.items():
            sink.add("gpu_exporter_source_up", (name,), 1 if up else 0)
            if not up:
                sink.add("gpu_exporter_source_error_info", (name, reason or "unknown"), 1)
        stats = read_process_stats()
        for family, value in (("process_resident_memory_bytes", stats.resident_memory_bytes),
                              ("process_cpu_seconds_total", stats.cpu_seconds),
                              ("process_open_fds", stats.open_fds),
                              ("process_start_time_seconds", stats.start_time_seconds)):
            if value is not None:
                sink.add(family, (), value)

    # --- serving (exporter.web.MetricsSource) -------------------------------------------------
    def exposition(self, openmetrics: bool, gzipped: bool) -> bytes:
        return self._rendering.body(openmetrics, gzipped)

    def health(self) -> tuple[bool, str]:
        if not self._backend_ok:  # every backend down (the others' state is in source_up)
            return False, "; ".join(m.reason for m in self._members)
        if self.threaded and self._last_cycle_end:
            stale = self.clock() - self._last_cycle_end
            if stale > self.stale_after:
                return False, f"no completed sample for {stale:.0f}s: {self._stall_cause()}"
        return True, "ok"

    def _stall_cause(self) -> str:
        if self._cycle_error:
            return f"the last cycle failed in {self._cycle_error}"
        if self._stage:
            waited = self.clock() - self._stage_since
            hint = " (a hung driver call?)" if self._stage != "rendering" else ""
            return f"stuck in {self._stage} for {waited:.0f}s{hint}"
        return "the sampler thread is not running"

    # --- background thread --------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            try:
                self.cycle()
            except Exception as err:  # never let the sampler thread die
                self._cycle_error = f"{self._stage or 'the cycle'}: {type(err).__name__}: {err}"
                self._stage = ""
                log.exception("sample cycle failed in %s", self._cycle_error)
            self._stop.wait(max(0.0, self.options.interval - (time.monotonic() - began)))

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        for c in self.collectors:
            try:
                c.close()
            except Exception:
                log.exception("closing collector %s", c.name)
        for m in self._members:
            if m.ok:
                with contextlib.suppress(Exception):
                    m.backend.close()
                m.ok = False
