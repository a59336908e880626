"""Per-process GPU usage from DRM fdinfo (`/proc/<pid>/fdinfo/<fd>` of an open /dev/dri node),
the kernel's vendor-neutral client usage stats: what splits a shared AMD or Intel GPU between
the processes, hence the pods, that use it. The AMD and Intel backends build their process
lists with it (`DrmFdinfo`); the pids join to pods through the cgroup mapping attribution
already uses (exporter/attribution/cgroup.py).

Format: Documentation/gpu/drm-usage-stats.rst (torvalds/linux f76ad354146d, the text with
drm-client-name and drm-total-cycles-), and the drivers' own examples: amdgpu_fdinfo.c
(drm-memory-<region> in KiB, drm-engine-<ip> in ns), i915 (drm-engine-<class> ns,
drm-engine-capacity-<class>), xe_drm_client.c (drm-cycles-/drm-total-cycles-<class>, printed
since Linux 6.11, and drm-resident-/drm-total-<region> with KiB/MiB units). Lines are
`key:<whitespace>value[ unit]`; numbers are unsigned decimal.

The files are tenant-influenced (any process may open the render node; the client name is set
by user space), so parsing is strict and bounded: a file over MAX_FDINFO_BYTES, a process
with more than MAX_FDS_PER_PID fds or a scan past MAX_DRM_FILES is cut short and counted;
numbers are ASCII digits of bounded length with a known unit, or the line is ignored; unknown
keys are ignored; nothing a tenant writes is ever a label.

Accounting, as the specification asks: fds of one client (`drm-client-id`, unique per
`drm-pdev`) count once, for the lowest pid that holds one (a client shared through fork or fd
passing is one client, not two); counters that step back keep their larger previous value
until they catch up; utilisation is the difference between two reads: engine nanoseconds over
elapsed nanoseconds and the engine class's capacity, or on xe busy cycles over total cycles.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from exporter.device.contract import (
    GpuRef,
    MigRef,
    ProcessSample,
    Tally,
    pci_address,
    pci_bdf,
)

MAX_FDINFO_BYTES = 16 * 1024  # xe's full output is under 2 KiB
MAX_FDS_PER_PID = 65_536  # fds looked at per process (a process may hold a million)
MAX_DRM_FILES = 65_536  # DRM fdinfo files read per scan
MAX_DIGITS = 20  # 2**64 has 20 digits
DRI_PREFIX = "/dev/dri/"
_KEY = re.compile(r"drm-[a-z0-9][a-z0-9_.-]{0,79}")
_UNITS = {"": 1, "KiB": 1024, "MiB": 1024 * 1024}
# Engine classes that run a process's compute or graphics work (amdgpu gfx/compute, i915
# render/compute, xe rcs/ccs): a process's utilisation is its busiest of these. Copy, video
# and the rest are in `DrmClient.engine_ns` / `DrmUsage.engines` for whoever wants them.
COMPUTE_ENGINES = frozenset({"gfx", "compute", "render", "rcs", "ccs"})
# Memory regions on the device itself (amdgpu vram, xe vram<N>, i915 local<N>); a client on a
# device without one (an integrated GPU: system, stolen-system, gtt) is counted in all its
# regions but "memory" (reserved by the specification for ordinary system RAM).
LOCAL_REGION = re.compile(r"(?:vram|local)[0-9]*")


@dataclass
class DrmClient:
    """One DRM client (a `struct drm_file`) as one fdinfo file shows it."""

    pid: int
    fd: int
    driver: str = ""
    pdev: str = ""  # PCI address, one spelling (contract.pci_bdf); "" when not given
    client_id: int | None = None
    engine_ns: dict[str, int] = field(default_factory=dict)  # drm-engine-<class>
    capacity: dict[str, int] = field(default_factory=dict)  # drm-engine-capacity-<class>
    cycles: dict[str, int] = field(default_factory=dict)  # drm-cycles-<class>
    total_cycles: dict[str, int] = field(default_factory=dict)  # drm-total-cycles-<class>
    resident: dict[str, int] = field(default_factory=dict)  # bytes: drm-resident-/-memory-
    total: dict[str, int] = field(default_factory=dict)  # bytes: drm-total-<region>

    @property
    def key(self) -> tuple[str, int] | tuple[str, int, int]:
        """What makes two fds one client: (pdev, client id); an fd without a client id is a
        client of its own."""
        if self.client_id is None:
            return (self.pdev, self.pid, self.fd)
        return (self.pdev, self.client_id)

    @property
    def memory_bytes(self) -> int:
        """Resident bytes on the device (its local regions; every region but system RAM on a
        device without local memory)."""
        local = [v for r, v in self.resident.items() if LOCAL_REGION.fullmatch(r)]
        if local:
            return sum(local)
        return sum(v for r, v in self.resident.items() if r != "memory")


def _number(value: str, units: Mapping[str, int]) -> int | None:
    """`123`, `123 KiB`: bounded ASCII digits and a unit of `units`; None for anything else."""
    parts = value.split()
    if not 1 <= len(parts) <= 2:
        return None
    digits, unit = parts[0], parts[1] if len(parts) == 2 else ""
    if not digits or len(digits) > MAX_DIGITS or not (digits.isascii() and digits.isdigit()):
        return None
    scale = units.get(unit)
    return None if scale is None else int(digits) * scale


def parse_fdinfo(text: str, pid: int = 0, fd: int = 0) -> DrmClient | None:
    """The DRM client an fdinfo file describes; None when it is no DRM file (no drm-driver)."""
    client = DrmClient(pid, fd)
    for line in text.splitlines():
        key, sep, raw = line.partition(":")
        if not sep or not _KEY.fullmatch(key):
            continue  # pos:, flags:, amd-*, driver keys: not ours
        value = raw.strip(" \t")
        name = key[4:]
        if name == "driver":
            client.driver = value[:64] if value.isascii() and value.isprintable() else "?"
        elif name == "pdev":
            client.pdev = pci_address(value) or ""
        elif name == "client-id":
            client.client_id = _number(value, {"": 1})
        elif name.startswith("engine-capacity-"):
            _put(client.capacity, name[16:], _number(value, {"": 1}))
        elif name.startswith("engine-"):
            _put(client.engine_ns, name[7:], _number(value, {"ns": 1, "": 1}))
        elif name.startswith("total-cycles-"):
            _put(client.total_cycles, name[13:], _number(value, {"": 1}))
        elif name.startswith("cycles-"):
            _put(client.cycles, name[7:], _number(value, {"": 1}))
        elif name.startswith(("resident-", "memory-")):  # memory- is resident's old alias
            _put(client.resident, name.partition("-")[2], _number(value, _UNITS))
        elif name.startswith("total-"):
            _put(client.total, name[6:], _number(value, _UNITS))
    return client if client.driver else None


def _put(into: dict[str, int], name: str, value: int | None) -> None:
    if name and value is not None:
        into[name] = value


@dataclass
class ScanStats:
    """What one scan left out (bounded, never silent)."""

    oversized: int = 0  # fdinfo files over MAX_FDINFO_BYTES
    truncated_pids: int = 0  # processes with more fds than MAX_FDS_PER_PID
    truncated: bool = False  # MAX_DRM_FILES reached


def _pids(proc_root: str) -> Iterator[int]:
    try:
        names = os.listdir(proc_root)
    except OSError:
        return
    for name in names:
        if name.isascii() and name.isdigit() and len(name) <= 10:
            yield int(name)


def _drm_fds(proc_root: str, pid: int, stats: ScanStats) -> Iterator[int]:
    """The fds of `pid` open on a DRM node (/dev/dri/...)."""
    fd_dir = os.path.join(proc_root, str(pid), "fd")
    try:
        with os.scandir(fd_dir) as entries:
            for n, entry in enumerate(entries):
                if n >= MAX_FDS_PER_PID:
                    stats.truncated_pids += 1
                    return
                name = entry.name
                if not (name.isascii() and name.isdigit()):
                    continue
                try:
                    target = os.readlink(entry.path)
                except OSError:
                    continue  # closed meanwhile
                if target.startswith(DRI_PREFIX):
                    yield int(name)
    except OSError:
        return  # gone, or not ours to read


def _read_bounded(path: str, stats: ScanStats) -> str | None:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_FDINFO_BYTES + 1)
    except OSError:
        return None
    if len(data) > MAX_FDINFO_BYTES:
        stats.oversized += 1
        return None
    return data.decode("ascii", errors="replace")


def scan_clients(proc_root: str = "/proc") -> tuple[list[DrmClient], ScanStats]:
    """Every DRM client of the node, each once (lowest pid holding it), and what the bounds
    left out."""
    stats = ScanStats()
    by_key: dict[tuple[str, int] | tuple[str, int, int], DrmClient] = {}
    files = 0
    for pid in sorted(_pids(proc_root)):
        for fd in _drm_fds(proc_root, pid, stats):
            if files >= MAX_DRM_FILES:
                stats.truncated = True
                return list(by_key.values()), stats
            files += 1
            text = _read_bounded(os.path.join(proc_root, str(pid), "fdinfo", str(fd)), stats)
            client = parse_fdinfo(text, pid, fd) if text is not None else None
            if client is not None:
                by_key.setdefault(client.key, client)  # pids ascend: the lowest keeps it
    return list(by_key.values()), stats


@dataclass(frozen=True)
class DrmUsage:
    """One process's use of one device, over the last two reads."""

    pid: int
    pdev: str
    memory_bytes: int
    engines: dict[str, float]  # engine class -> busy share 0-1; empty on the first read
    utilization: float | None  # busiest compute/graphics engine; None on the first read


@dataclass
class _Seen:
    at: float
    engine_ns: dict[str, int]
    cycles: dict[str, int]
    total_cycles: dict[str, int]


def _delta(now: int, before: int | None) -> int | None:
    # a counter that stepped back stays at its larger previous value (the specification)
    return None if before is None else max(0, now - before)


class DrmFdinfo:
    """Per-process usage from fdinfo, stateful: utilisation is the difference from the
    previous read of the same client. One scan serves every device of a cycle (`usage` scans
    again only when the last scan is older than `rescan_after` seconds)."""

    def __init__(self, proc_root: str = "/proc", clock: Callable[[], float] = time.monotonic,
                 rescan_after: float = 0.5) -> None:
        self.proc_root = proc_root
        self.clock = clock
        self.rescan_after = rescan_after
        self.stats = ScanStats()
        self._prev: dict[object, _Seen] = {}
        self._scan_at: float | None = None
        self._by_pdev: dict[str, list[DrmUsage]] = {}

    def usage(self, pdev: str) -> list[DrmUsage]:
        """The processes using the device at PCI address `pdev` (any spelling)."""
        now = self.clock()
        if self._scan_at is None or now - self._scan_at >= self.rescan_after or \
                now < self._scan_at:
            self._scan(now)
        return self._by_pdev.get(pci_bdf(pdev), [])

    def _scan(self, now: float) -> None:
        clients, self.stats = scan_clients(self.proc_root)
        prev, self._prev = self._prev, {}
        per_process: dict[tuple[int, str], list[tuple[DrmClient, dict[str, float] | None]]] = {}
        for c in clients:
            before = prev.get(c.key)
            seen = _Seen(now, dict(c.engine_ns), dict(c.cycles), dict(c.total_cycles))
            if before is not None:  # keep the larger of a counter that stepped back
                for mine, old in ((seen.engine_ns, before.engine_ns), (seen.cycles, before.cycles),
                                  (seen.total_cycles, before.total_cycles)):
                    for k, v in old.items():
                        if mine.get(k, 0) < v:
                            mine[k] = v
            self._prev[c.key] = seen
            shares = _shares(c, before, seen) if before is not None else None
            per_process.setdefault((c.pid, c.pdev), []).append((c, shares))
        self._scan_at = now
        by_pdev: dict[str, list[DrmUsage]] = {}
        for (pid, pdev), items in sorted(per_process.items()):
            engines: dict[str, float] = {}
            # a client seen for the first time has no baseline yet: its process is measured
            # by its other clients, or not at all this time
            measured = any(s is not None for _, s in items)
            for _, s in items:
                for engine, share in (s or {}).items():
                    engines[engine] = min(1.0, engines.get(engine, 0.0) + share)
            compute = [share for e, share in engines.items() if e in COMPUTE_ENGINES]
            util = (max(compute) if compute else 0.0) if measured else None
            by_pdev.setdefault(pdev, []).append(DrmUsage(
                pid, pdev, sum(c.memory_bytes for c, _ in items),
                engines if measured else {}, util))
        self._by_pdev = by_pdev


def _shares(c: DrmClient, before: _Seen, now: _Seen) -> dict[str, float]:
    """Busy share 0-1 of each engine class between two reads of one client."""
    out: dict[str, float] = {}
    elapsed_ns = (now.at - before.at) * 1e9
    for engine, ns in now.engine_ns.items():
        d = _delta(ns, before.engine_ns.get(engine))
        if d is not None and elapsed_ns > 0:
            out[engine] = min(1.0, d / (elapsed_ns * max(1, c.capacity.get(engine, 1))))
    for engine, cyc in now.cycles.items():  # xe: on the GPU's own clock
        d = _delta(cyc, before.cycles.get(engine))
        total_now = now.total_cycles.get(engine)
        total = _delta(total_now, before.total_cycles.get(engine)) \
            if total_now is not None else None
        if d is not None and total:
            out[engine] = min(1.0, d / (total * max(1, c.capacity.get(engine, 1))))
    return out


def read_fdinfo_processes(reader: DrmFdinfo, pdev_to_uuid: Mapping[str, str]
                          ) -> list[ProcessSample]:
    """Contract ProcessSamples for the devices in `pdev_to_uuid` (PCI address, any spelling ->
    the device's UUID): host pid, memory bytes, the busiest compute engine's share as
    `sm_util` (None until a second read). What an AMD or Intel ProcessReader returns."""
    out: list[ProcessSample] = []
    for pdev, uuid in pdev_to_uuid.items():
        for u in reader.usage(pdev):
            out.append(ProcessSample(u.pid, uuid, "", float(u.memory_bytes), u.utilization))
    return out


class FdinfoProcessReader:
    """A contract ProcessReader over DRM fdinfo, for a backend whose library has no process
    list (or only one partition's): `bdf_of` gives a device's PCI address. Whole devices
    only: a process on a partition is the backend's to place."""

    def __init__(self, drm: DrmFdinfo, bdf_of: Callable[[GpuRef], str]) -> None:
        self.drm = drm
        self.bdf_of = bdf_of

    def read(self, gpu: GpuRef, partitions: Sequence[MigRef], tally: Tally
             ) -> list[ProcessSample]:
        del partitions, tally  # reading /proc fails only as "no such process": not a failure
        return read_fdinfo_processes(self.drm, {self.bdf_of(gpu): gpu.uuid})
