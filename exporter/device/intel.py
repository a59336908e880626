"""The Intel backend: i915 and xe GPUs read from sysfs and hwmon (exporter/device/intel_sysfs.py),
per-process and engine figures from DRM fdinfo. No vendor library is needed; Level Zero
Sysman (PyPI `pyzes`), where installed, adds the model name and memory in use
(intel_levelzero.py); its absence is one log line.

Identity: sysfs gives an Intel GPU no UUID. A device's `uuid` follows the rule of
exporter/device/identity.py: Level Zero's UUID where compute-runtime read it from the chip (Data
Center GPU Max), else `<PCI address>@<node>`. Inside the backend a device is found by its PCI
address (`0000:03:00.0`), the key DRM fdinfo's `drm-pdev` and the device plugin's cards resolve
to; attribution joins by `GpuStatic.pci_bdf`.
A PF's SR-IOV VFs and a GVT-g host's mediated devices are its `VirtualFunction`s (kinds
`sriov_vf`, `mdev`), not devices of their own, each with the fraction of the GPU it is priced
as (`share`). Units are normalised here: µJ -> J, µW -> W, MHz -> Hz, m°C -> °C.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from exporter.device.contract import (
    DeviceLost,
    EventSource,
    GpuRef,
    GpuStatic,
    GuestLicence,
    Interconnect,
    Inventory,
    LinkTraffic,
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
from exporter.device.fdinfo import (
    COMPUTE_ENGINES,
    DrmFdinfo,
    FdinfoProcessReader,
    read_fdinfo_processes,
)
from exporter.device.identity import identity, level_zero_id, published_uuid
from exporter.device.intel_levelzero import LevelZero, load_pyzes
from exporter.device.intel_sysfs import (
    PVC_IDS,
    IntelCard,
    Tile,
    frequency_mhz,
    gt_energy_uj,
    gvt_share,
    hwmon_dir,
    intel_cards,
    intel_gpu_functions,
    local_memory_bytes,
    mdev_types,
    mdevs,
    read_int,
    sriov,
    tiles,
)
from exporter.device.nvmlapi import NvmlApi
from exporter.device.registry import BackendAbsent, LoadSpec

log = logging.getLogger(__name__)

MHZ = 1_000_000.0
# Platform names as the kernel's include/drm/intel/pciids.h groups device IDs (Linux 6.15):
# the model label where Level Zero does not name the device.
PLATFORMS = {"0x56c0": "ATS-M150", "0x56c2": "ATS-M150", "0x56c1": "ATS-M75",
             **{i: "PVC" for i in PVC_IDS}}
TILE_PROFILE = "tile"  # gpu_mig_info's profile of an Intel tile (subdevice)


def tile_uuid(gpu_uuid: str, tile: int) -> str:
    """A tile's partition uuid (`gpu_mig_info`'s `mig_uuid`)."""
    return f"{gpu_uuid}/tile{tile}"


def model_name(device_id: str) -> str:
    return f"Intel {PLATFORMS[device_id]}" if device_id in PLATFORMS \
        else f"Intel GPU {device_id or 'unknown'}"


class _NoEvents:
    """Intel's drivers raise no error events the exporter can subscribe to."""

    def register(self, gpus: Sequence[GpuRef]) -> None:
        pass

    def wait(self, timeout_ms: int) -> None:
        time.sleep(max(timeout_ms, 0) / 1000)
        return None

    def close(self) -> None:
        pass


class IntelBackend:
    """Intel GPUs (i915, xe) under `sysfs_root`. `clock` times the energy counter for power
    where hwmon has no power reading (i915 and xe give energy and limits only). `node` is
    this node's name, half of the `uuid` of a GPU without a chip-derived UUID."""

    vendor: Vendor = "intel"
    source = "intel"
    library = "Intel sysfs"

    def __init__(self, sysfs_root: str = "/sys", proc_root: str = "/proc",
                 clock: Callable[[], float] = time.monotonic,
                 sysman: Callable[[], tuple[Any, str]] = load_pyzes, node: str = "") -> None:
        self.sysfs_root = sysfs_root
        self.node = node
        self.proc_root = proc_root
        self._clock = clock
        self._sysman = sysman
        self._cards: dict[str, IntelCard] = {}  # uuid -> card (its PF)
        self._hosts: set[str] = set()  # uuids lending VFs or mdevs to VMs
        self._tiles: dict[str, list[Tile]] = {}  # uuid -> its tiles (two or more)
        self._last_energy: dict[str, tuple[float, float]] = {}  # uuid -> (time, joules)
        # (uuid, tile, engine group) -> Level Zero (activeTime, timestamp) at the last read
        self._last_busy: dict[tuple[str, int, int], tuple[int, int]] = {}
        self.level_zero: LevelZero | None = None
        # one fdinfo scan per cycle serves the process list and the device's engine busy
        self._drm = DrmFdinfo(proc_root, clock)

    @property
    def nvml(self) -> NvmlApi | None:
        return None

    def open(self) -> None:
        if intel_cards(self.sysfs_root) is None:
            raise OSError(f"no DRM sysfs under {self.sysfs_root}/class/drm")
        zes, why = self._sysman()
        self.level_zero = LevelZero(zes) if zes is not None else None
        if self.level_zero is None:
            log.info("intel: Level Zero Sysman (pyzes) absent (%s); reading sysfs and hwmon "
                     "only", why)

    def close(self) -> None:
        self._last_energy.clear()
        self._last_busy.clear()
        self.level_zero = None

    def inventory(self, previous: Inventory | None) -> Inventory:
        cards = intel_cards(self.sysfs_root) or []
        gpus: list[GpuRef] = []
        migs: list[MigRef] = []
        static: dict[str, GpuStatic] = {}
        self._cards, self._hosts, self._tiles = {}, set(), {}
        l0 = self.level_zero
        if l0 is not None:
            l0.refresh()
        # a device keeps its uuid when Level Zero does not answer this time
        known = {st.pci_bdf: u for u, st in previous.static.items()} if previous else {}
        # VFs bound to the host's driver are cards too; they are their PF's VirtualFunctions.
        for card in (c for c in cards if not c.physfn):
            raw = l0.uuid(card.bdf) if l0 is not None else None
            chip = None if raw is None else level_zero_id(raw, card.bdf)
            uuid = published_uuid(identity(chip, self.node, card.bdf)) \
                if chip is not None or card.bdf not in known else known[card.bdf]
            self._cards[uuid] = card
            model = (l0.model(card.bdf) if l0 is not None else None) \
                or model_name(card.device_id)
            memory = local_memory_bytes(card)
            if memory is None and l0 is not None:
                usage = l0.memory(card.bdf)
                memory = None if usage is None else int(usage.total_bytes)
            parts = self._tiles_of(card, l0)
            ref = GpuRef(len(gpus), uuid, model, bool(parts), card, vendor="intel")
            gpus.append(ref)
            if parts:
                self._tiles[uuid] = parts
                migs.extend(MigRef(
                    parent=ref, uuid=tile_uuid(uuid, t.id), gpu_instance_id=t.id,
                    compute_instance_id=t.gt, profile=TILE_PROFILE, slices=1,
                    parent_slices=len(parts), handle=t, slot=t.id, kind="intel_subdevice")
                    for t in parts)
            mode = self._virtualization_mode(card)
            if mode == "host":
                self._hosts.add(uuid)
            static[uuid] = GpuStatic(
                pci_bus_id=card.bdf, vendor="intel", memory_bytes=memory,
                virtualization_mode=mode, mig_mode="enabled" if parts else "")
        if previous is not None:  # a device gone from sysfs keeps its identity (gpu_up 0)
            for old in previous.gpus:
                if old.uuid not in self._cards and old.uuid in previous.static:
                    ref = GpuRef(len(gpus), old.uuid, old.model, old.mig_enabled, None,
                                 vendor="intel")
                    gpus.append(ref)
                    static[old.uuid] = previous.static[old.uuid]
                    migs.extend(MigRef(ref, m.uuid, m.gpu_instance_id, m.compute_instance_id,
                                       m.profile, m.slices, m.parent_slices, m.handle,
                                       m.slot, m.kind)
                                for m in previous.migs if m.parent.uuid == old.uuid)
        driver = ",".join(sorted({c.driver for c in cards}))
        return Inventory(driver_version=driver, gpus=tuple(gpus), migs=tuple(migs),
                         static=static)

    @staticmethod
    def _tiles_of(card: IntelCard, l0: LevelZero | None) -> list[Tile]:
        """The GPU's tiles when it has two or more: sysfs's, else as many as Level Zero's
        `numSubdevices` (GT id = tile id, as on PVC); empty for a single-tile GPU."""
        found = tiles(card)
        if len(found) < 2 and l0 is not None:
            n = l0.subdevices(card.bdf) or 0
            if n >= 2:
                found = [Tile(i, i, "", None) for i in range(n)]
        return found if len(found) >= 2 else []

    @staticmethod
    def _virtualization_mode(card: IntelCard) -> str:
        """"host" when the GPU lends parts of itself to VMs (SR-IOV VFs enabled, or GVT-g on:
        it lists mdev types), as AMD's MxGPU host says; else "none"."""
        state = sriov(card.pci_dir)
        if (state is not None and state.num_vfs > 0) or mdev_types(card.pci_dir):
            return "host"
        return "none"

    def expected_devices(self, sysfs_root: str) -> list[str] | None:
        return intel_gpu_functions(sysfs_root)

    def _card(self, gpu: GpuRef) -> IntelCard:
        """The device's card; DeviceLost when its PCI function left sysfs."""
        card = self._cards.get(gpu.uuid)
        if card is None or not os.path.isdir(card.pci_dir):
            raise DeviceLost(gpu.uuid)
        return card

    def telemetry(self, gpu: GpuRef, tally: Tally) -> Telemetry:
        card = self._card(gpu)
        hwmon = hwmon_dir(card)
        energy = power = limit = temp = mem_temp = None
        if hwmon is not None:
            uj = read_int(os.path.join(hwmon, "energy1_input"))
            energy = None if uj is None else uj / 1e6
            uw = read_int(os.path.join(hwmon, "power1_average"))
            if uw is None:
                uw = read_int(os.path.join(hwmon, "power1_input"))
            power = None if uw is None else uw / 1e6
            cap = read_int(os.path.join(hwmon, "power1_max"))
            limit = cap / 1e6 if cap else None  # 0: the limit is disabled
            for name in ("temp2_input", "temp1_input"):  # xe: temp2 is the package
                mc = read_int(os.path.join(hwmon, name))
                if mc is not None:
                    temp = mc / 1000
                    break
            vram = read_int(os.path.join(hwmon, "temp3_input"))
            mem_temp = None if vram is None else vram / 1000
        if power is None and energy is not None:
            power = self._power_from_energy(gpu.uuid, energy)
        freq = frequency_mhz(card)
        busy, resident = self._engine_busy(card.bdf)
        if gpu.uuid in self._hosts:
            busy = None  # its VMs' work is on the engines but in no fdinfo of this host
        # Memory in use has no sysfs file: Level Zero's where present, else what the node's
        # processes hold resident in the device's memory (fdinfo).
        l0 = self.level_zero
        memory = l0.memory(card.bdf) if l0 is not None else None
        total = local_memory_bytes(card)
        if memory is None and total:
            used = min(float(resident), float(total))
            memory = MemoryUsage(float(total), used, float(total) - used)
        return Telemetry(
            temperature_celsius=temp, memory_temperature_celsius=mem_temp,
            power_watts=power, power_limit_watts=limit, energy_joules=energy,
            utilization=busy, memory=memory,
            sm_clock_hertz=None if freq is None else freq * MHZ,
            partition_energy_joules=self._tile_energy(gpu.uuid, card))

    def _tile_energy(self, uuid: str, card: IntelCard) -> tuple[tuple[str, float], ...]:
        """Each tile's energy counter (J): i915's gt-level hwmon (`i915_gt<N>`, the tile's
        GT), else Level Zero's power domain on the tile's subdevice. Parts of the card's
        `energy1_input`, never added to it."""
        parts = self._tiles.get(uuid)
        if not parts:
            return ()
        by_gt = gt_energy_uj(card)
        by_sub = {} if self.level_zero is None or by_gt else \
            self.level_zero.tile_energy(card.bdf)
        out: list[tuple[str, float]] = []
        for t in parts:
            uj = by_gt.get(t.gt) if by_gt else by_sub.get(t.id, (None, 0))[0]
            if uj is not None:
                out.append((tile_uuid(uuid, t.id), uj / 1e6))
        return tuple(out)

    def _engine_busy(self, bdf: str) -> tuple[float | None, int]:
        """The device's busiest compute/graphics engine class, summed over the node's DRM
        clients (0-1; None until every client has two reads), and their resident memory.
        The i915/xe PMU would count work of every client, VMs' included, but needs
        perf_event_open; fdinfo sees the processes of this host."""
        usage = self._drm.usage(bdf)
        resident = sum(u.memory_bytes for u in usage)
        if any(u.utilization is None for u in usage):
            return None, resident
        engines: dict[str, float] = {}
        for u in usage:
            for engine, share in u.engines.items():
                engines[engine] = min(1.0, engines.get(engine, 0.0) + share)
        compute = [v for e, v in engines.items() if e in COMPUTE_ENGINES]
        return (max(compute) if compute else 0.0), resident

    def _power_from_energy(self, uuid: str, joules: float) -> float | None:
        """Average power since the previous reading of the energy counter; None on the first
        reading and after the counter went back (driver reload)."""
        now = self._clock()
        last = self._last_energy.get(uuid)
        self._last_energy[uuid] = (now, joules)
        if last is None or now <= last[0] or joules < last[1]:
            return None
        return (joules - last[1]) / (now - last[0])

    def reliability(self, gpu: GpuRef, tally: Tally) -> Reliability:
        return Reliability()

    def partition_memory(self, partition: MigRef, tally: Tally) -> MemoryUsage | None:
        """A tile's local memory from Level Zero's per-subdevice modules; None without Level
        Zero (sysfs has a tile's size but not its use, and fdinfo names the device only)."""
        l0 = self.level_zero
        tile = partition.handle
        if l0 is None or not isinstance(tile, Tile):
            return None
        card = self._cards.get(partition.parent.uuid)
        return None if card is None else l0.tile_memory(card.bdf).get(tile.id)

    def partition_utilization(self, partition: MigRef, tally: Tally) -> float | None:
        """A tile's busiest engine group (compute-all, render-all) on its subdevice, from Level
        Zero's activity counters since the previous call; None without Level Zero (fdinfo
        names the device, not the tile) and on the first call."""
        l0, tile = self.level_zero, partition.handle
        if l0 is None or not isinstance(tile, Tile):
            return None
        uuid = partition.parent.uuid
        card = self._cards.get(uuid)
        if card is None:
            return None
        busy: list[float] = []
        for (sub, group), (active, stamp) in l0.engine_activity(card.bdf).items():
            if sub != tile.id:
                continue
            key = (uuid, tile.id, group)
            last = self._last_busy.get(key)
            self._last_busy[key] = (active, stamp)
            if last is not None and stamp > last[1] and active >= last[0]:
                busy.append(min(1.0, (active - last[0]) / (stamp - last[1])))
        return max(busy) if busy else None

    def interconnect(self, gpu: GpuRef, tally: Tally) -> Interconnect:
        """PCIe bytes from Level Zero's `zesDevicePciGetStats` where the device has bandwidth
        counters (sysfs has none); Xe Link bytes per fabric port (`zesFabricPortGetThroughput`,
        each port with its own µs timestamp). Nothing without Level Zero."""
        card = self._card(gpu)
        l0 = self.level_zero
        if l0 is None:
            return Interconnect()
        links = tuple(LinkTraffic("xelink", port, tx, rx, stamp_us / 1e6)
                      for port, rx, tx, stamp_us in l0.fabric_counters(card.bdf))
        pci = l0.pci_counters(card.bdf)
        if pci is None:
            return Interconnect(links=links)
        rx, tx, stamp_us = pci
        return Interconnect(pcie_tx_bytes=tx, pcie_rx_bytes=rx, links=links,
                            timestamp_seconds=stamp_us / 1e6)

    def process_reader(self) -> ProcessReader:
        # fdinfo's drm-pdev is the PCI address (a VF's, for a container given a VF's card);
        # a device gone from sysfs has none
        return _VfProcessReader(FdinfoProcessReader(self._drm, self._bdf), self._vf_pdevs)

    def _bdf(self, gpu: GpuRef) -> str:
        card = self._cards.get(gpu.uuid)
        return "" if card is None else card.bdf

    def _vf_pdevs(self, gpu: GpuRef) -> list[str]:
        """The PCI addresses of the GPU's enabled SR-IOV VFs: a container given a VF's card
        (bound to the host's driver) opens the VF, so its fdinfo's `drm-pdev` is the VF."""
        card = self._cards.get(gpu.uuid)
        state = sriov(card.pci_dir) if card is not None else None
        return [vf for _, vf in state.vfs] if state is not None else []

    def virtual_functions(self, gpu: GpuRef, tally: Tally) -> list[VirtualFunction]:
        card = self._card(gpu)
        out: list[VirtualFunction] = []
        state = sriov(card.pci_dir)
        if state is not None and state.num_vfs > 0:
            # The PF provisions its enabled VFs evenly unless an operator set quotas.
            share = 1 / state.num_vfs
            out.extend(VirtualFunction(
                id=vf, kind="sriov_vf", type_name=f"VF{n}", vm="", framebuffer_bytes=None,
                memory_used_bytes=None, utilization=None, share=share)
                for n, vf in state.vfs)
        for m in mdevs(self.sysfs_root):
            if m.parent == card.bdf:
                out.append(VirtualFunction(
                    id=m.uuid, kind="mdev", type_name=m.type_name, vm="",
                    framebuffer_bytes=None, memory_used_bytes=None, utilization=None,
                    share=gvt_share(m.type_name)))
        return out

    def guest_licences(self, gpu: GpuRef, tally: Tally) -> list[GuestLicence]:
        return []

    def error_events(self) -> EventSource:
        return _NoEvents()



class _VfProcessReader:
    """The device's DRM clients and its VFs': a process on a VF counts on the PF's uuid,
    which is the key of the VF's unit (a `vgpu` unit of the PF priced as the VF's share,
    exporter/attribution/sources.py `intel_plugin_units`), so its use goes to the container
    holding that VF, never unattributed and never to another holder of the PF."""

    def __init__(self, own: FdinfoProcessReader, vfs: Callable[[GpuRef], list[str]]) -> None:
        self._own = own
        self._vfs = vfs

    def read(self, gpu: GpuRef, partitions: Sequence[MigRef], tally: Tally
             ) -> list[ProcessSample]:
        pdevs = {vf: gpu.uuid for vf in self._vfs(gpu)}
        extra = read_fdinfo_processes(self._own.drm, pdevs) if pdevs else []
        return [*self._own.read(gpu, partitions, tally), *extra]


def probe(spec: LoadSpec, auto: bool) -> IntelBackend:
    """The Intel backend for `--device-backend` (exporter/device/registry.py): with `auto`,
    absent unless sysfs lists an Intel GPU bound to i915 or xe."""
    if auto:
        cards = intel_cards(spec.sysfs_root)
        if not any(not c.physfn for c in cards or []):
            raise BackendAbsent(f"{spec.sysfs_root}/class/drm lists no Intel GPU bound to "
                                "i915 or xe")
    return IntelBackend(spec.sysfs_root, spec.proc_root, node=spec.node)
