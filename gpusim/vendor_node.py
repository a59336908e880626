"""An AMD or Intel node of a vendor scenario (gpusim/scenarios/vendors, format in
gpusim/vendor_scenario.py) as the exporter meets it on a real node, for gpusim.cluster:

- AMD: a simulated amdsmi (gpusim.amdsmi_sim) whose GPUs, partitions, MxGPU VFs and process
  list follow the scenario, plus the sysfs the attribution reads: the GPUs' PCI functions, the
  partitions' `amdgpu_xcp_<n>` platform devices with their render nodes, the VFs' IOMMU groups;
- Intel: a sysfs tree in the kernel's layout (gpusim.intel_sysfs: an xe PF with SR-IOV VFs bound
  to xe, a Max 1550's two tiles as xe's tile<i>/gt<i>, an i915 iGPU with GVT-g mdevs) whose
  energy counter advances with the clock, and a simulated Level Zero (gpusim.levelzero) naming
  the devices, with a Max's subdevices, their memory modules and engine groups' busy time;
- what the device plugins hand the pods, as the kubelet's PodResources lists it: AMD's
  `amd.com/<profile>` partitions (partition 0 by PCI address, the others by `amdgpu_xcp_<n>`),
  `amd.com/gpu` whole GPUs by PCI address, `amd.com/gpu_vf` VFs by IOMMU group; the Intel GPU
  plugin's `gpu.intel.com/<driver>` cards (`card<N>-0`, a VF's own card; `card<N>-<k>` shared,
  and on a tiled card GPU Aware Scheduling's `gas-container-tiles` pod annotation naming the
  tile, `card<N>:gt<i>`); KubeVirt's mdev UUIDs under the scenario's resource name;
- the pods' processes: `/proc/<pid>/cgroup` of the containers on AMD GPUs and partitions, which
  amdsmi lists with their VRAM and GFX time. A VM's work (a VF, an mdev) has no process on the
  host: the host sees a VF's framebuffer use (MxGPU guest data) and nothing of an mdev's.

Everything is a function of the scenario time t (seconds since the cluster's start; a holder's
`hours` are hours of that clock), so `refresh(t)` before a sample cycle gives one consistent
node to the kubelet, /proc and the vendor library.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exporter.device.amd import AmdBackend
from exporter.device.contract import DeviceBackend
from exporter.device.intel import IntelBackend
from exporter.device.intel_sysfs import PVC_IDS
from exporter.errors import ConfigError
from gpusim.amdsmi_sim import SimAmdGpu, SimAmdProcess, SimAmdSmi, SimAmdVf
from gpusim.intel_sysfs import IntelGpu, write_gpu
from gpusim.kubelet import ContainerAllocation, PodAllocation
from gpusim.levelzero import (
    ZES_ENGINE_GROUP_COMPUTE_ALL,
    SimZes,
    SimZesDevice,
    SimZesEngine,
    SimZesMemory,
    pci_uuid,
    telemetry_uuid,
)
from gpusim.model import stable_hex, stable_uuid
from gpusim.node import container_id
from gpusim.vendor_scenario import TILE, Gpu, Holder, VendorScenario

PID_BASE = 300_000  # a vendor node's container processes: PID_BASE + holder index
XCP_BASE = 30  # the first amdgpu_xcp_<n> platform device number
IOMMU_BASE = 200  # the first VF's IOMMU group
XE_TIMESTAMP_HZ = 19_200_000  # the GPU timestamp xe's drm-total-cycles counts
# Intel device IDs (include/drm/intel/pciids.h, Linux 6.15): PVC Max 1550, CFL GT2 (UHD 630).
INTEL_DEVICE_IDS = {"Intel(R) Data Center GPU Max 1550": "0x0bd5",
                    "Intel(R) UHD Graphics 630": "0x3e92"}
# Board power the simulated Intel devices draw (energy counter, W), busy and idle.
INTEL_WATTS = {"xe": (450.0, 90.0), "i915": (15.0, 2.0)}


def _alive(h: Holder, t: float) -> bool:
    hour = int(t // 3600)
    return t >= 0 and hour >= h.first and (h.last is None or hour < h.last)


def pod_uid(h: Holder) -> str:
    return stable_uuid("pod", h.namespace, h.pod)


def cgroup_line(h: Holder) -> str:
    """cgroup v2 under the cgroupfs driver, burstable QoS, containerd."""
    return f"0::/kubepods/burstable/pod{pod_uid(h)}/{container_id(pod_uid(h), h.container)}"


@dataclass(frozen=True)
class _Partitioning:
    compute: str  # "CPX"
    memory: str  # "NPS4"


def _partitioning(g: Gpu) -> _Partitioning:
    if not g.profile:
        return _Partitioning("SPX", "NPS1")
    compute, nps = g.profile.split("_")
    return _Partitioning(compute.upper(), nps.upper())


class VendorNode:
    """One AMD or Intel node: its backend, sysfs, /proc and device plugin IDs over time."""

    def __init__(self, scenario: VendorScenario, sysfs_root: Path, proc_root: Path,
                 clock: Callable[[], float], start: float) -> None:
        self.scenario = scenario
        self.sysfs_root = Path(sysfs_root)
        self.proc_root = Path(proc_root)
        self.proc_root.mkdir(parents=True, exist_ok=True)
        self.start = start
        self._clock = clock
        vendors = {g.vendor for g in scenario.gpus}
        if len(vendors) != 1 or not vendors <= {"amd", "intel"}:
            raise ConfigError(scenario.node, "gpus", "AMD or Intel GPUs of one vendor",
                              ",".join(sorted(vendors)))
        self.vendor = vendors.pop()
        self._ids: dict[int, str] = {}  # holder index -> device ID
        self._allocatable: list[tuple[str, str]] = []
        # Intel: (gpu, kind, index) -> (PCI address, card, driver) a container's process opens
        self._drm: dict[tuple[int, str, int], tuple[str, int, str]] = {}
        # Intel: holder index -> GAS's gas-container-tiles entry (`card0:gt1`)
        self._tiles: dict[int, str] = {}
        self.backend: DeviceBackend
        if self.vendor == "amd":
            self.backend = self._amd()
        else:
            self.backend = self._intel()

    # --- AMD -------------------------------------------------------------------------------
    def _amd(self) -> AmdBackend:
        sc = self.scenario
        gpus: list[SimAmdGpu] = []
        xcp = XCP_BASE
        devices = self.sysfs_root / "bus" / "pci" / "devices"
        for i, g in enumerate(sc.gpus):
            part = _partitioning(g)
            bdf = f"0000:{0x0c + 0x20 * i:02x}:00.0"
            mb = g.memory >> 20
            vfs = [SimAmdVf(fb_mb=mb // g.vfs) for _ in range(g.vfs)]
            sim = SimAmdGpu(bdf=bdf, uuid=f"{stable_hex(8, sc.node, str(i))}-0000-1000-8000-"
                            f"{stable_hex(12, sc.node, str(i), 'gpu')}", model=g.model,
                            vram_mb=mb, compute=part.compute, memory=part.memory,
                            render_base=128 + 8 * i, vfs=vfs)
            gpus.append(sim)
            _pci_function(devices / bdf, "0x1002", "0x120000")  # processing accelerator
            ids: dict[str, list[str]] = {}
            if g.vfs:
                for v in range(g.vfs):
                    group = str(IOMMU_BASE + 8 * i + v)
                    vf = devices / f"0000:{bdf.split(':')[1]}:02.{v}"
                    _pci_function(vf, "0x1002", "0x120000")
                    _symlink(vf / "physfn", f"../{bdf}")
                    (self.sysfs_root / "kernel" / "iommu_groups" / group).mkdir(
                        parents=True, exist_ok=True)
                    _symlink(vf / "iommu_group", f"../../../../kernel/iommu_groups/{group}")
                    ids.setdefault("amd.com/gpu_vf", []).append(group)
                    self._unit_id(i, "vf", v, group)
            elif g.partitions:
                for p in range(g.partitions):
                    if p == 0:  # partition 0 is the PCI device itself
                        dev = bdf
                    else:
                        dev = f"amdgpu_xcp_{xcp}"
                        render = self.sysfs_root / "devices" / "platform" / dev / "drm" / \
                            f"renderD{sim.render_base + p}"
                        render.mkdir(parents=True, exist_ok=True)
                        xcp += 1
                    ids.setdefault(f"amd.com/{g.profile}", []).append(dev)
                    self._unit_id(i, "partition", p, dev)
            else:
                ids.setdefault("amd.com/gpu", []).append(bdf)
                self._unit_id(i, "whole", 0, bdf)
            self._allocatable += [(r, d) for r, devs in ids.items() for d in devs]
        host = any(g.vfs for g in sc.gpus)
        self._amdsmi = SimAmdSmi(gpus, host=host, clock=self._clock, start=self.start)
        return AmdBackend(self._amdsmi.as_api(),
                          clock_ns=lambda: int(self._clock() * 1e9), node=sc.node)

    def _amd_refresh(self, t: float) -> None:
        procs: list[SimAmdProcess] = []
        vf_use: dict[tuple[int, int], int] = {}
        for n, h in enumerate(self.scenario.holders):
            if not _alive(h, t):
                continue
            if h.kind == "vf":
                vf_use[(h.gpu, h.index)] = h.memory >> 20
                continue
            procs.append(SimAmdProcess(
                pid=PID_BASE + n, gpu=h.gpu, partition=h.index if h.kind == "partition" else 0,
                vram_bytes=h.memory, gfx_busy=h.activity, name=h.container))
        self._amdsmi.processes = procs  # one assignment: a sampler thread sees old or new
        for i, g in enumerate(self._amdsmi.gpus):
            for v, vf in enumerate(g.vfs):
                used = vf_use.get((i, v))
                vf.vm, vf.guest_fb_usage_mb = ("" if used is None else f"vm-{i}-{v}"), used or 0

    # --- Intel -----------------------------------------------------------------------------
    def _intel(self) -> IntelBackend:
        sc = self.scenario
        card = 0
        self._energy: list[tuple[str, str, int]] = []  # (energy1_input, driver, GPU index)
        zes: list[SimZesDevice] = []
        self._zes_memory: dict[int, list[SimZesMemory]] = {}  # per tile on a tiled GPU
        self._zes_engines: dict[int, list[SimZesEngine]] = {}
        for i, g in enumerate(sc.gpus):
            device_id = INTEL_DEVICE_IDS.get(g.model, "0x56c0")
            tiles = g.partitions if g.profile == TILE else 1
            if g.mdevs:  # an integrated GPU (one a node): 00:02.0, i915
                bdf, driver = "0000:00:02.0", "i915"
            else:  # a tiled Max on other buses than the SR-IOV node's (different scenarios,
                # different addresses: tests/test_gpu_identity.py puts two nodes at one)
                bdf, driver = f"0000:{(0x29 if tiles > 1 else 0x4d) + 0x40 * i:02x}:00.0", "xe"
            mdevs = {str(stable_uuid("mdev", sc.node, str(i), str(m))): _gvt_n(sc, t)
                     for m, t in enumerate(g.mdevs)}
            vfs = tuple((f"0000:{bdf.split(':')[1]}:00.{v + 1}", card + 1 + v)
                        for v in range(g.vfs))
            gpu = IntelGpu(bdf, card, device_id, driver, power_max_uw=600_000_000
                           if driver == "xe" else 0, act_freq_mhz=1600, cur_freq_mhz=1600,
                           temp_mc=52_000 if driver == "xe" else None,
                           vram_per_tile=(g.memory // tiles,) * tiles if driver == "xe" else (),
                           total_vfs=63 if g.vfs else None, vfs=vfs, gvt=bool(g.mdevs),
                           mdevs=mdevs)
            write_gpu(str(self.sysfs_root), gpu)
            energy = _hwmon_energy(self.sysfs_root, bdf, driver)
            if energy is not None:
                self._energy.append((energy, driver, i))
            if g.vfs:  # the plugin registers each VF's card, not the PF's
                for v, (vf_bdf, vf_card) in enumerate(vfs):
                    self._allocatable.append((f"gpu.intel.com/{driver}", f"card{vf_card}-0"))
                    self._unit_id(i, "vf", v, f"card{vf_card}-0")
                    self._drm[(i, "vf", v)] = (vf_bdf, vf_card, driver)
            elif g.mdevs:
                for m, uuid in enumerate(mdevs):
                    self._allocatable.append((f"intel.com/{g.mdevs[m]}", uuid))
                    self._unit_id(i, "mdev", m, uuid)
            else:  # -shared-dev-num N: the card N times, `card<N>-<k>`, one per holder
                # (with GPU Aware Scheduling, N covers a container per tile)
                shares = max(g.shared, tiles)
                self._allocatable += [(f"gpu.intel.com/{driver}", f"card{card}-{k}")
                                      for k in range(shares)]
                sharers = [n for n, h in enumerate(sc.holders) if h.gpu == i]
                for k, n in enumerate(sharers):
                    self._ids[n] = f"card{card}-{k % shares}"
                    if sc.holders[n].kind == "partition":  # GAS gave it one tile: gt<id>
                        self._tiles[n] = f"card{card}:gt{sc.holders[n].index}"
                self._drm[(i, "whole", 0)] = (bdf, card, driver)
                for p in range(g.partitions if tiles > 1 else 0):
                    self._drm[(i, "partition", p)] = (bdf, card, driver)
            card += 1 + len(vfs)
            a, b, d, f = (int(x, 16) for x in bdf.replace(".", ":").split(":"))
            # a tiled GPU's local memory is on its subdevices (onSubdevice, subdeviceId)
            size = g.memory // tiles
            memory = [SimZesMemory(size, size, subdevice=t if tiles > 1 else None)
                      for t in range(tiles)] if driver == "xe" else []
            if memory:
                self._zes_memory[i] = memory
            engines = [SimZesEngine(ZES_ENGINE_GROUP_COMPUTE_ALL, t)
                       for t in range(tiles)] if tiles > 1 else []
            self._zes_engines[i] = engines
            # Level Zero's UUID: read from the chip on a Data Center GPU Max, else built from
            # the PCI location (exporter/device/identity.py level_zero_id)
            l0_uuid = telemetry_uuid(bytes.fromhex(stable_hex(16, sc.node, str(i), "chip"))) \
                if device_id in PVC_IDS else pci_uuid(int(device_id, 16), (a, b, d, f))
            zes.append(SimZesDevice((a, b, d, f), g.model, memory,
                                    subdevices=tiles if tiles > 1 else 0, engines=engines,
                                    uuid=l0_uuid))
        sim = SimZes(zes)
        return IntelBackend(str(self.sysfs_root), str(self.proc_root), clock=self._clock,
                            sysman=lambda: (sim, ""), node=sc.node)

    def _intel_refresh(self, t: float) -> None:
        busy: dict[int, float] = {}
        used: dict[tuple[int, int], int] = {}  # (GPU, tile) -> bytes; tile 0 untiled
        tile_busy_us: dict[tuple[int, int], float] = {}  # compute busy since the start
        for h in self.scenario.holders:
            if _alive(h, t):
                busy[h.gpu] = busy.get(h.gpu, 0.0) + h.activity * _unit_share(
                    self.scenario.gpus[h.gpu], h)
            tile = h.index if h.kind == "partition" else 0
            if _alive(h, t):
                used[(h.gpu, tile)] = used.get((h.gpu, tile), 0) + h.memory
            ran = max(0.0, min(t, float("inf") if h.last is None else h.last * 3600.0)
                      - h.first * 3600.0)
            tile_busy_us[(h.gpu, tile)] = tile_busy_us.get((h.gpu, tile), 0.0) + \
                ran * 1e6 * h.activity
        for i, mems in self._zes_memory.items():
            for tile, mem in enumerate(mems):
                mem.free = max(0, mem.size - used.get((i, tile), 0))
        for i, engines in self._zes_engines.items():
            for e in engines:  # Level Zero's activeTime/timestamp, µs
                e.active_us = int(min(tile_busy_us.get((i, e.subdevice or 0), 0.0),
                                      max(t, 0.0) * 1e6))
                e.timestamp_us = int(max(t, 0.0) * 1e6)
        for path, driver, i in self._energy:
            peak, idle = INTEL_WATTS[driver]
            # energy since the sim began at the mean draw of [0, t] (constant activity: exact)
            watts = idle + (peak - idle) * min(1.0, busy.get(i, 0.0))
            _write_atomic(Path(path), f"{int(max(t, 0.0) * watts * 1e6)}\n")

    # --- the node over time ----------------------------------------------------------------
    def _unit_id(self, gpu: int, kind: str, index: int, device_id: str) -> None:
        for n, h in enumerate(self.scenario.holders):
            if (h.gpu, h.kind, h.index) == (gpu, kind, index):
                self._ids[n] = device_id

    def device_ids(self) -> list[tuple[str, str]]:
        """The device plugins' allocatable list (PodResources GetAllocatableResources)."""
        return list(self._allocatable)

    def allocations(self, t: float) -> list[PodAllocation]:
        pods: dict[tuple[str, str], list[ContainerAllocation]] = {}
        for n, h in enumerate(self.scenario.holders):
            if _alive(h, t):
                pods.setdefault((h.namespace, h.pod), []).append(
                    ContainerAllocation(h.container, [(h.resource, [self._ids[n]])]))
        return [PodAllocation(ns, name, cs) for (ns, name), cs in pods.items()]

    def pod_objects(self, t0: float, t1: float) -> list[dict[str, Any]]:
        """Pod objects of the holders alive some time in [t0, t1) (scenario seconds)."""
        from gpusim.cluster import owner_metadata

        by_pod: dict[tuple[str, str], list[Holder]] = {}
        for h in self.scenario.holders:
            begin, end = h.first * 3600.0, None if h.last is None else h.last * 3600.0
            if begin < t1 and (end is None or end > t0):
                by_pod.setdefault((h.namespace, h.pod), []).append(h)
        out = []
        for (ns, name), hs in by_pod.items():
            uid = pod_uid(hs[0])
            out.append({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": ns, "uid": uid,
                             **owner_metadata(ns, dict(hs[0].labels), hs[0].owner),
                             **self._gas_annotations(hs)},
                "spec": {"nodeName": self.scenario.node,
                         "containers": [{"name": h.container, "image": "sim"} for h in hs]},
                "status": {"phase": "Running", "containerStatuses": [
                    {"name": h.container, "ready": True,
                     "containerID": f"containerd://{container_id(uid, h.container)}"}
                    for h in hs]},
            })
        return out

    def _gas_annotations(self, hs: list[Holder]) -> dict[str, Any]:
        """What GPU Aware Scheduling patches onto a pod it binds to a tiled card
        (intel/platform-aware-scheduling gpu-aware-scheduling/pkg/gpuscheduler/scheduler.go
        `annotatePodBind`: `gas-ts` in Unix ns, `gas-container-cards`, and
        `gas-container-tiles` when tiles were asked for): an entry per container holding the
        Intel GPU plugin's resource (`gpu.intel.com/i915` or `xe`), in spec order,
        `|`-separated. None on pods GAS gave no tiles (the scenario's other Intel pods)."""
        index = {h: n for n, h in enumerate(self.scenario.holders)}
        using = [index[h] for h in hs if h.resource.startswith("gpu.intel.com/")]
        tiles = [self._tiles.get(n, "") for n in using]
        if not any(tiles):
            return {}
        cards = [self._ids[n].rsplit("-", 1)[0] for n in using]  # card0-1 -> card0
        bound = int((self.start + hs[0].first * 3600.0) * 1e9)
        return {"annotations": {"gas-ts": str(bound), "gas-container-cards": "|".join(cards),
                                "gas-container-tiles": "|".join(tiles)}}

    def refresh(self, t: float) -> None:
        """Bring the vendor library, sysfs and /proc to scenario time t."""
        if self.vendor == "amd":
            self._amd_refresh(t)
        else:
            self._intel_refresh(t)
        self._write_proc(t)

    def _write_proc(self, t: float) -> None:
        """/proc/<pid>/cgroup of each container process; on Intel also its DRM fd and fdinfo,
        the only per-process usage i915 and xe give. A VM's work has no process on the host
        (an AMD VF, an mdev)."""
        alive: dict[int, Holder] = {}
        for n, h in enumerate(self.scenario.holders):
            if not _alive(h, t):
                continue
            if (self.vendor == "amd" and h.kind != "vf") or \
                    (h.gpu, h.kind, h.index) in self._drm:
                alive[PID_BASE + n] = h
        for entry in self.proc_root.iterdir():
            if entry.name.isdigit() and int(entry.name) not in alive:
                shutil.rmtree(entry, ignore_errors=True)
        for pid, h in alive.items():
            d = self.proc_root / str(pid)
            if not (d / "cgroup").is_file():  # a holder's identity never changes
                d.mkdir(exist_ok=True)
                _write_atomic(d / "comm", h.container + "\n")
                _write_atomic(d / "cgroup", cgroup_line(h) + "\n")
            if self.vendor == "intel":
                self._write_fdinfo(d, pid, h, t)

    def _write_fdinfo(self, d: Path, pid: int, h: Holder, t: float) -> None:
        """fd 3 on the card's render node and its fdinfo, as xe prints it (xe_drm_client.c:
        drm-cycles-/drm-total-cycles-<class>, resident VRAM in KiB) or i915 (drm-engine-
        <class> in ns). Counters run from the process's start at its activity."""
        bdf, card, driver = self._drm[(h.gpu, h.kind, h.index)]
        since = max(0.0, t - h.first * 3600.0)
        fd = d / "fd" / "3"
        if not fd.is_symlink():
            (d / "fd").mkdir(exist_ok=True)
            (d / "fdinfo").mkdir(exist_ok=True)
            os.symlink(f"/dev/dri/renderD{128 + card}", fd)
        kib = h.memory >> 10
        head = f"pos:\t0\nflags:\t02100002\nmnt_id:\t26\ndrm-driver:\t{driver}\n" \
            f"drm-client-id:\t{pid}\ndrm-pdev:\t{bdf}\n"
        if driver == "xe":
            # the cycles of every tile's engines: a tile's work is its share of them
            tile = 1 / max(self.scenario.gpus[h.gpu].partitions, 1) \
                if h.kind == "partition" else 1.0
            total = int(t * XE_TIMESTAMP_HZ)
            busy = int(since * XE_TIMESTAMP_HZ * h.activity * tile)
            body = (f"drm-total-vram0:\t{kib} KiB\ndrm-resident-vram0:\t{kib} KiB\n"
                    f"drm-cycles-rcs:\t0\ndrm-total-cycles-rcs:\t{total}\n"
                    f"drm-cycles-ccs:\t{busy}\ndrm-total-cycles-ccs:\t{total}\n")
        else:
            body = (f"drm-engine-render:\t{int(since * 1e9 * h.activity)} ns\n"
                    f"drm-total-system0:\t{h.memory}\ndrm-resident-system0:\t{h.memory}\n")
        _write_atomic(d / "fdinfo" / "3", head + body)


def _gvt_n(sc: VendorScenario, type_name: str) -> int:
    try:
        return int(type_name.rsplit("_", 1)[1])
    except (IndexError, ValueError):
        raise ConfigError(sc.node, "gpus.mdevs", "GVT-g types i915-GVTg_V5_<N>",
                          type_name) from None


def _unit_share(g: Gpu, h: Holder) -> float:
    """The fraction of its GPU a holder's unit is (activity is 0-1 of the unit)."""
    if h.kind == "partition":  # an AMD partition, an Intel tile
        return 1 / max(g.partitions, 1)
    if h.kind == "vf":
        return 1 / max(g.vfs, 1)
    if h.kind == "mdev":
        return 1 / int(g.mdevs[h.index].rsplit("_", 1)[1])
    return 1.0


def _pci_function(d: Path, vendor: str, klass: str) -> None:
    d.mkdir(parents=True, exist_ok=True)
    (d / "vendor").write_text(vendor + "\n")
    (d / "class").write_text(klass + "\n")


def _symlink(path: Path, target: str) -> None:
    if not path.is_symlink():
        os.symlink(target, path)


def _hwmon_energy(root: Path, bdf: str, driver: str) -> str | None:
    """The device-level hwmon's energy1_input of the function (its `name` is the driver)."""
    hwmon = root / "bus" / "pci" / "devices" / bdf / "hwmon"
    for d in sorted(hwmon.iterdir()) if hwmon.is_dir() else []:
        if (d / "name").read_text().strip() == driver and (d / "energy1_input").exists():
            return str(d / "energy1_input")
    return None


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
