"""The node's device backends together: a node may have NVIDIA GPUs and an Intel iGPU, or AMD
and NVIDIA cards. `Backends` is what the collectors and the process stage read (a
`DeviceReader`): each read of a device goes to the backend whose vendor made it
(`GpuRef.vendor`), so a collector never knows how many backends there are. The sampler opens,
inventories and retries each backend on its own (exporter/sampler.py)."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence

from exporter.device.contract import (
    DeviceBackend,
    ErrorEvent,
    EventSource,
    EventsUnavailable,
    GpuRef,
    GuestLicence,
    Interconnect,
    MemoryUsage,
    MigRef,
    ProcessReader,
    ProcessSample,
    Reliability,
    Tally,
    Telemetry,
    Vendor,
    VirtualFunction,
)
from exporter.device.nvmlapi import NvmlApi

log = logging.getLogger(__name__)


class Backends:
    """One backend per vendor, in the order given (the order of their devices in a cycle)."""

    def __init__(self, members: Sequence[DeviceBackend]) -> None:
        if not members:
            raise ValueError("Backends needs at least one backend")
        self.members: tuple[DeviceBackend, ...] = tuple(members)
        self._by_vendor: dict[Vendor, DeviceBackend] = {}
        for b in self.members:
            if b.vendor in self._by_vendor:
                raise ValueError(f"two {b.vendor} backends: {self._by_vendor[b.vendor].library} "
                                 f"and {b.library}")
            self._by_vendor[b.vendor] = b

    @classmethod
    def of(cls, backend: DeviceBackend | Backends) -> Backends:
        """`backend` itself when it is the node's Backends, else one backend as Backends."""
        return backend if isinstance(backend, Backends) else cls([backend])

    def __iter__(self) -> Iterator[DeviceBackend]:
        return iter(self.members)

    def __len__(self) -> int:
        return len(self.members)

    def for_vendor(self, vendor: Vendor) -> DeviceBackend | None:
        """The backend of `vendor`, None when the node runs none."""
        return self._by_vendor.get(vendor)

    def _for(self, gpu: GpuRef) -> DeviceBackend:
        # Only a backend's own inventory makes GpuRefs of its vendor: a miss is a bug.
        return self._by_vendor[gpu.vendor]

    # --- DeviceReader ---------------------------------------------------------------------
    @property
    def nvml(self) -> NvmlApi | None:
        nvidia = self._by_vendor.get("nvidia")
        return nvidia.nvml if nvidia is not None else None

    def telemetry(self, gpu: GpuRef, tally: Tally) -> Telemetry:
        return self._for(gpu).telemetry(gpu, tally)

    def reliability(self, gpu: GpuRef, tally: Tally) -> Reliability:
        return self._for(gpu).reliability(gpu, tally)

    def partition_memory(self, partition: MigRef, tally: Tally) -> MemoryUsage | None:
        return self._for(partition.parent).partition_memory(partition, tally)

    def partition_utilization(self, partition: MigRef, tally: Tally) -> float | None:
        return self._for(partition.parent).partition_utilization(partition, tally)

    def interconnect(self, gpu: GpuRef, tally: Tally) -> Interconnect:
        return self._for(gpu).interconnect(gpu, tally)

    def process_reader(self) -> ProcessReader:
        if len(self.members) == 1:
            return self.members[0].process_reader()
        return _Readers({b.vendor: b.process_reader() for b in self.members})

    def virtual_functions(self, gpu: GpuRef, tally: Tally) -> list[VirtualFunction]:
        return self._for(gpu).virtual_functions(gpu, tally)

    def guest_licences(self, gpu: GpuRef, tally: Tally) -> list[GuestLicence]:
        return self._for(gpu).guest_licences(gpu, tally)

    def error_events(self) -> EventSource:
        if len(self.members) == 1:
            return self.members[0].error_events()
        return _Events({b.vendor: b.error_events() for b in self.members})


class _Readers:
    """Each device's processes from its own vendor's reader (each keeps its own state)."""

    def __init__(self, readers: dict[Vendor, ProcessReader]) -> None:
        self._readers = readers

    def read(self, gpu: GpuRef, partitions: Sequence[MigRef], tally: Tally
             ) -> list[ProcessSample]:
        mine = [p for p in partitions if p.parent.vendor == gpu.vendor]
        return self._readers[gpu.vendor].read(gpu, mine, tally)


class _Events:
    """Several vendors' error events as one source: `wait` shares its timeout between them
    (the XID watcher waits in a loop, so none is starved), and is unavailable only when every
    source is."""

    def __init__(self, sources: dict[Vendor, EventSource]) -> None:
        self._sources = sources

    def register(self, gpus: Sequence[GpuRef]) -> None:
        for vendor, source in self._sources.items():
            mine = [g for g in gpus if g.vendor == vendor]
            if mine:
                source.register(mine)

    def wait(self, timeout_ms: int) -> list[ErrorEvent] | None:
        share = timeout_ms // len(self._sources)
        failed: list[str] = []
        got: list[ErrorEvent] | None = None
        for vendor, source in self._sources.items():
            try:
                events = source.wait(share)
            except EventsUnavailable as err:
                failed.append(f"{vendor}: {err}")
                continue
            if events is not None:
                got = (got or []) + events
        if len(failed) == len(self._sources):
            raise EventsUnavailable("; ".join(failed))
        return got

    def close(self) -> None:
        for source in self._sources.values():
            try:
                source.close()
            except Exception:  # one vendor's failure must not keep another's open
                log.exception("closing an error event source")
