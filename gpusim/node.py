"""The Kubernetes side of a simulated node, as pure functions of (scenario, t).

What the NVIDIA device plugin would advertise (`device_ids`), which pods run at t with which
devices and processes (`pods_at`), and the `/proc/<pid>/cgroup` files that tie those processes
to their pods (`write_proc_tree`). SimNVML reports the same PIDs, so a fake kubelet, a fake
API server and the exporter all see one consistent node.
"""

from __future__ import annotations

import math
import os
import shutil
import threading
import weakref
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gpusim.allocation import (
    container_claims,
    hami_slot_ids,
    hami_slots,
    plugin_id,
    vgpu_resource,
)
from gpusim.model import (
    HostProcessSpec,
    PodSpec,
    ProcessSpec,
    Scenario,
    UnitRef,
    stable_hex,
    stable_uuid,
)
from gpusim.signal import FloatArray, Signal

AUTO_PID_BASE = 100_000  # explicit scenario PIDs are below this
_PID_SPAN = 3_900_000  # automatic PIDs stay below Linux's pid_max (4194304)


@dataclass(frozen=True)
class SimProcess:
    pid: int
    name: str
    gpu: int  # GPU index
    mig: int | None  # MIG instance index on that GPU
    uuid: str  # the GPU's UUID
    mig_uuid: str  # '' unless in a MIG instance
    memory_bytes: int
    sm_util: float  # 0-1
    mem_util: float  # 0-1
    tensor_util: float  # 0-1
    namespace: str  # '' for a host process
    pod: str
    container: str
    cgroup: str  # the /proc/<pid>/cgroup line


@dataclass(frozen=True)
class SimContainer:
    name: str
    container_id: str  # 64 hex
    devices: tuple[tuple[str, tuple[str, ...]], ...]  # (resource_name, device ids)
    processes: tuple[SimProcess, ...]
    # DRA claims it consumes: (claim namespace, claim name, ((driver, pool, device), ...))
    claims: tuple[tuple[str, str, tuple[tuple[str, str, str], ...]], ...] = ()


@dataclass(frozen=True)
class SimPod:
    uid: str
    namespace: str
    name: str
    labels: dict[str, str]
    qos: str  # guaranteed | burstable | besteffort
    node: str
    start: float  # scenario seconds when this run started
    end: float | None  # scenario seconds when it ends (None: runs on)
    containers: tuple[SimContainer, ...]


@dataclass(frozen=True)
class Window:
    """When something runs: [start, end), repeated every `repeat` seconds if set."""

    start: float
    end: float | None
    repeat: float | None

    def run_at(self, t: float) -> tuple[int, float] | None:
        """(run number, run start) of the run alive at t, or None."""
        if t < self.start:
            return None
        if self.repeat is None:
            return (0, self.start) if self.end is None or t < self.end else None
        assert self.end is not None  # validated: repeat needs end
        k = math.floor((t - self.start) / self.repeat)
        begin = self.start + k * self.repeat
        return (k, begin) if t - begin < self.end - self.start else None

    def alive_many(self, ts: FloatArray) -> tuple[FloatArray, FloatArray]:
        """(1.0 where alive else 0.0, time since the run started) over an array of times."""
        since = ts - self.start
        alive = since >= 0
        if self.repeat is not None:
            assert self.end is not None
            since = np.mod(since, self.repeat)
            alive &= since < self.end - self.start
        elif self.end is not None:
            alive &= ts < self.end
        return alive.astype(np.float64), since


@dataclass(frozen=True)
class _Slot:
    """One OS process of the scenario: a pod process on one device unit, or a host process."""

    slot: int
    window: Window
    gpu: int
    mig: int | None
    name: str
    memory: Signal
    sm_util: Signal
    mem_util: Signal | None
    tensor_util: Signal | None
    pid: int | None  # explicit PID
    pod: PodSpec | None
    container: int
    host: HostProcessSpec | None


_AT_CACHE = 64  # instants Timeline.processes_at remembers


class Timeline:
    """Precomputed per scenario: the process slots, grouped by GPU."""

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self._identities: dict[tuple[int, int], tuple[str, str, str, str]] = {}
        # processes_at by instant: one exporter cycle asks for the same few instants once per
        # GPU and MIG instance (and per GPM sample), which was 80% of the demo's CPU.
        self._at: dict[float, tuple[SimProcess, ...]] = {}
        self._at_lock = threading.Lock()
        slots: list[_Slot] = []
        for pod in scenario.pods:
            window = Window(pod.start, pod.end, pod.repeat)
            for ci, c in enumerate(pod.containers):
                for proc in c.processes:
                    positions = range(len(c.units)) if proc.unit is None else [proc.unit]
                    for n, pos in enumerate(positions):
                        unit = c.units[pos]
                        slots.append(_pod_slot(len(slots), window, unit, proc, pod, ci,
                                               None if proc.pid is None else proc.pid + n))
        for h in scenario.host_processes:
            slots.append(_Slot(len(slots), Window(h.start, h.end, None), h.gpu, h.mig, h.name,
                               h.memory, h.sm_util, None, None, h.pid, None, -1, h))
        self.slots = tuple(slots)
        self.by_pod: dict[int, list[_Slot]] = {}
        self.by_gpu: dict[int, list[_Slot]] = {g.index: [] for g in scenario.gpus}
        for s in slots:
            if s.pod is not None:
                self.by_pod.setdefault(s.pod.index, []).append(s)
            self.by_gpu[s.gpu].append(s)

    def pid(self, s: _Slot, run: int) -> int:
        if s.pid is not None:
            return s.pid
        n = max(len(self.slots), 1)
        return AUTO_PID_BASE + (run * n + s.slot) % _PID_SPAN

    def processes_at(self, t: float) -> list[SimProcess]:
        with self._at_lock:
            hit = self._at.get(t)
        if hit is not None:
            return list(hit)
        out: list[SimProcess] = []
        for s in self.slots:
            run = s.window.run_at(t)
            if run is not None:
                out.append(self._process(s, run[0], t - run[1]))
        with self._at_lock:
            if len(self._at) >= _AT_CACHE:  # keep the newest instants (dicts keep order)
                del self._at[next(iter(self._at))]
            self._at[t] = tuple(out)
        return out

    def _identity(self, s: _Slot, run: int) -> tuple[str, str, str, str]:
        """(namespace, pod, container, cgroup line) of one run of a slot. Deriving UUIDs and
        container IDs is the costly part of a process and never changes within a run, while
        SimNVML asks for the process list at many instants per cycle (GPM samples)."""
        key = (s.slot, run)
        hit = self._identities.get(key)
        if hit is not None:
            return hit
        if s.pod is not None:
            uid, name = pod_identity(s.pod, run)
            cname = s.pod.containers[s.container].name
            ident = (s.pod.namespace, name, cname,
                     cgroup_line(self.scenario, s.pod.qos, uid, container_id(uid, cname)))
        else:
            assert s.host is not None
            ident = ("", "", "", f"0::/system.slice/{s.host.name}.service")
        if len(self._identities) > 100_000:  # a long churny simulation: forget old runs
            self._identities.clear()
        self._identities[key] = ident
        return ident

    def _process(self, s: _Slot, run: int, since: float) -> SimProcess:
        gpu = self.scenario.gpus[s.gpu]
        sm = s.sm_util.at(since)
        ns, name, cname, cgroup = self._identity(s, run)
        return SimProcess(
            pid=self.pid(s, run), name=s.name, gpu=s.gpu, mig=s.mig, uuid=gpu.uuid,
            mig_uuid=gpu.mig[s.mig].uuid if gpu.mig is not None and s.mig is not None else "",
            memory_bytes=max(0, int(s.memory.at(since))), sm_util=sm,
            mem_util=s.mem_util.at(since) if s.mem_util else 0.6 * sm,
            tensor_util=s.tensor_util.at(since) if s.tensor_util else 0.5 * sm,
            namespace=ns, pod=name, container=cname, cgroup=cgroup,
        )

    def gpu_util_many(self, gpu: int, ts: FloatArray) -> FloatArray:
        """Sum of the GPU's process SM utilisation over an array of times (not clamped)."""
        total = np.zeros(ts.shape, dtype=np.float64)
        for s in self.by_gpu[gpu]:
            alive, since = s.window.alive_many(ts)
            total += alive * s.sm_util.at_many(since)
        return total


def _pod_slot(slot: int, window: Window, unit: UnitRef, proc: ProcessSpec, pod: PodSpec,
              container: int, pid: int | None) -> _Slot:
    return _Slot(slot, window, unit.gpu, unit.mig, proc.name, proc.memory, proc.sm_util,
                 proc.mem_util, proc.tensor_util, pid, pod, container, None)


_timelines: dict[int, Timeline] = {}
_timelines_lock = threading.Lock()


def timeline(scenario: Scenario) -> Timeline:
    """The scenario's Timeline, built once per scenario object."""
    key = id(scenario)
    with _timelines_lock:
        tl = _timelines.get(key)
        if tl is None or tl.scenario is not scenario:
            tl = Timeline(scenario)
            _timelines[key] = tl
            weakref.finalize(scenario, _timelines.pop, key, None)
        return tl


# ---------------------------------------------------------------------------------------------
# Identities


def pod_identity(pod: PodSpec, run: int) -> tuple[str, str]:
    """(uid, name) of one run of a pod. A repeating pod's runs are new pods: name-<run>."""
    name = pod.name if pod.repeat is None else f"{pod.name}-{run}"
    uid = pod.uid or stable_uuid("pod", pod.namespace, name)
    return uid, name


def container_id(pod_uid: str, container: str) -> str:
    return stable_hex(64, "container", pod_uid, container)


def cgroup_line(scenario: Scenario, qos: str, uid: str, cid: str) -> str:
    """The cgroup v2 line of a container's process, for the scenario's cgroup driver/runtime."""
    if scenario.cgroup_driver == "systemd":
        u = uid.replace("-", "_")
        scope = f"crio-{cid}.scope" if scenario.container_runtime == "cri-o" else \
            f"cri-containerd-{cid}.scope"
        if qos == "guaranteed":
            path = f"/kubepods.slice/kubepods-pod{u}.slice/{scope}"
        else:
            path = f"/kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{u}.slice/{scope}"
    else:
        leaf = f"crio-{cid}" if scenario.container_runtime == "cri-o" else cid
        path = f"/kubepods/pod{uid}/{leaf}" if qos == "guaranteed" else \
            f"/kubepods/{qos}/pod{uid}/{leaf}"
    return f"0::{path}"


def unit_device(scenario: Scenario, unit: UnitRef) -> tuple[str, str]:
    """(resource name, device id) of a device unit, in the NVIDIA device plugin's forms."""
    gpu = scenario.gpus[unit.gpu]
    if unit.vgpu is not None:  # KubeVirt: resource nvidia.com/<type>, ID the mdev UUID
        v = gpu.vgpus[unit.vgpu]
        return vgpu_resource(v.type_name), v.uuid
    if unit.mig is not None and gpu.mig is not None:
        mig = gpu.mig[unit.mig]
        default = f"nvidia.com/mig-{mig.profile}" if scenario.mig_strategy == "mixed" \
            else "nvidia.com/gpu"
        resource, base = mig.sharing.resource or default, plugin_id(scenario, gpu, mig)
    else:
        resource, base = gpu.sharing.resource or "nvidia.com/gpu", plugin_id(scenario, gpu, None)
    return resource, base if unit.replica is None else f"{base}::{unit.replica}"


def device_units(scenario: Scenario) -> list[UnitRef]:
    """Every unit the device plugin advertises: whole GPUs, MIG instances, and each replica
    of shared ones (GPUs that DRA, HAMi or gpushare hand out are not the plugin's)."""
    out: list[UnitRef] = []
    for gpu in scenario.gpus:
        if gpu.allocation != "device-plugin":
            continue
        if gpu.vgpus:  # a vGPU host hands out its vGPU instances, not the GPU
            out.extend(UnitRef(gpu.index, vgpu=v.index) for v in gpu.vgpus)
            continue
        if gpu.mig is not None:
            for mig in gpu.mig:
                if mig.sharing.mode == "exclusive":
                    out.append(UnitRef(gpu.index, mig.index))
                else:
                    out.extend(UnitRef(gpu.index, mig.index, r)
                               for r in range(mig.sharing.replicas))
        elif gpu.sharing.mode == "exclusive":
            out.append(UnitRef(gpu.index))
        else:
            out.extend(UnitRef(gpu.index, None, r) for r in range(gpu.sharing.replicas))
    return out


def device_ids(scenario: Scenario) -> list[tuple[str, str]]:
    """The device plugins' allocatable list: (resource_name, device_id) per unit, then HAMi's
    slots of the GPUs it hands out."""
    return [unit_device(scenario, u) for u in device_units(scenario)] + [
        ("nvidia.com/gpu", slot) for slot in hami_slot_ids(scenario)]


def sharing_modes(scenario: Scenario) -> dict[str, str]:
    """resource name -> sharing mode (exclusive | mig | time-slicing | mps), as the exporter's
    `sharing_modes` option would be configured for this node."""
    out: dict[str, str] = {}
    for gpu in scenario.gpus:
        if gpu.allocation != "device-plugin" or gpu.vgpus:
            continue
        for mig in gpu.mig or ():
            res, _ = unit_device(scenario, UnitRef(gpu.index, mig.index))
            out[res] = "mig" if mig.sharing.mode == "exclusive" else mig.sharing.mode
        if gpu.mig is None:
            res, _ = unit_device(scenario, UnitRef(gpu.index))
            out[res] = gpu.sharing.mode
    return out


# ---------------------------------------------------------------------------------------------
# Pods and processes at t


def processes_at(scenario: Scenario, t: float) -> list[SimProcess]:
    """Every GPU process alive at t (pod and host processes), as SimNVML reports them."""
    return timeline(scenario).processes_at(t)


def pods_at(scenario: Scenario, t: float) -> list[SimPod]:
    """Pods alive at scenario time t, with their devices and GPU processes."""
    tl = timeline(scenario)
    out: list[SimPod] = []
    for pod in scenario.pods:
        run = Window(pod.start, pod.end, pod.repeat).run_at(t)
        if run is None:
            continue
        k, begin = run
        uid, name = pod_identity(pod, k)
        procs: dict[int, list[SimProcess]] = {}
        for s in tl.by_pod.get(pod.index, []):
            procs.setdefault(s.container, []).append(tl._process(s, k, t - begin))
        containers = []
        for ci, c in enumerate(pod.containers):
            grouped: dict[str, list[str]] = {}
            for u in c.units:
                if u.claim or u.is_grant:  # PodResources lists claims apart, grants as slots
                    continue
                resource, dev = unit_device(scenario, u)
                grouped.setdefault(c.resource or resource, []).append(dev)
            if slots := hami_slots(scenario, pod, ci):
                grouped.setdefault("nvidia.com/gpu", []).extend(slots)
            containers.append(SimContainer(
                name=c.name, container_id=container_id(uid, c.name),
                devices=tuple((r, tuple(ids)) for r, ids in grouped.items()),
                processes=tuple(procs.get(ci, [])),
                claims=container_claims(scenario, pod.namespace, c),
            ))
        end = None if pod.end is None else begin + (pod.end - pod.start)
        out.append(SimPod(uid=uid, namespace=pod.namespace, name=name, labels=dict(pod.labels),
                          qos=pod.qos, node=scenario.node, start=begin, end=end,
                          containers=tuple(containers)))
    return out


def write_sysfs_tree(scenario: Scenario, root: Path) -> None:
    """Write `<root>/bus/pci/devices/<address>/{vendor,class}` for every GPU of the scenario,
    lost or not (a GPU that fell off the bus keeps its PCI function), plus an NVSwitch and a
    non-NVIDIA device that must not be counted as GPUs."""
    devices = Path(root) / "bus" / "pci" / "devices"
    entries = [(gpu.pci_bus_id[4:].lower(), "0x10de", "0x030200") for gpu in scenario.gpus]
    entries += [("0000:c1:00.0", "0x10de", "0x068000"), ("0000:00:1f.0", "0x8086", "0x060100")]
    for address, vendor, klass in entries:
        d = devices / address
        d.mkdir(parents=True, exist_ok=True)
        (d / "vendor").write_text(vendor + "\n")
        (d / "class").write_text(klass + "\n")


def write_proc_tree(scenario: Scenario, root: Path, t: float) -> list[int]:
    """Write `<root>/<pid>/cgroup` (and `comm`) for every GPU process alive at t and remove
    numeric entries for processes no longer alive. Returns the live PIDs, sorted.

    Files are written to a temporary name and renamed, so a concurrent reader never sees a
    half-written cgroup file."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    alive = {p.pid: p for p in processes_at(scenario, t)}
    for entry in root.iterdir():
        if entry.name.isdigit() and int(entry.name) not in alive:
            shutil.rmtree(entry, ignore_errors=True)
    for pid, proc in alive.items():
        d = root / str(pid)
        d.mkdir(exist_ok=True)
        for fname, content in (("cgroup", proc.cgroup + "\n"), ("comm", proc.name + "\n")):
            target = d / fname
            try:
                if target.read_text() == content:
                    continue
            except OSError:
                pass
            tmp = d / f".{fname}.tmp"
            tmp.write_text(content)
            os.replace(tmp, target)
    return sorted(alive)
