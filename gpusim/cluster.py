"""A simulated cluster: every node of a scenario set with its simulated NVML, kubelet
PodResources server, /proc tree and one shared Kubernetes API server, each node driven through
the exporter's own Sampler. AMD and Intel nodes (vendor scenarios, gpusim.vendor_node) run the
same way over the exporter's AmdBackend and IntelBackend. Used by the demo, the end-to-end
tests and the benchmarks.

Two ways to drive it: `step(t)` with a manual clock (a month of history in minutes), or
`start_live()` with the real clock (sampler threads plus a proc-tree refresher).
"""

from __future__ import annotations

import functools
import hashlib
import math
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exporter.collectors import REGISTRY
from exporter.core import CollectorSpec, ExporterOptions
from exporter.device.nvml import NvmlBackend
from exporter.render import Rendering
from exporter.sampler import Sampler
from gpu_ledger.sharing import SharingMode
from gpusim.allocation import pod_annotations, resource_claim, resource_slices
from gpusim.apiserver import FakeApiServer
from gpusim.kubelet import ClaimAllocation, ContainerAllocation, FakeKubelet, PodAllocation
from gpusim.model import Scenario
from gpusim.node import (
    Window,
    container_id,
    device_ids,
    pod_identity,
    pods_at,
    sharing_modes,
    write_proc_tree,
    write_sysfs_tree,
)
from gpusim.nvml import SimNVML
from gpusim.scenario import load_scenario
from gpusim.vendor_node import VendorNode
from gpusim.vendor_scenario import VendorScenario, load_vendor_scenario


class ManualClock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def owner_metadata(namespace: str, pod_labels: dict[str, str], owner: tuple[str, str]
                   ) -> dict[str, object]:
    """Labels and ownerReferences as the controllers write them: a Deployment's pods belong to
    its ReplicaSet `<name>-<pod-template-hash>` and carry that hash as a label."""
    labels = dict(pod_labels)
    kind, name = owner
    if not kind:
        return {"labels": labels}
    if kind == "Deployment":
        pth = hashlib.sha256(f"{namespace}/{name}".encode()).hexdigest()[:10]
        labels["pod-template-hash"] = pth
        kind, name = "ReplicaSet", f"{name}-{pth}"
    ref = {"apiVersion": "batch/v1" if kind == "Job" else "apps/v1", "kind": kind,
           "name": name, "uid": str(uuid.uuid5(uuid.NAMESPACE_URL, f"{kind}/{name}")),
           "controller": True}
    return {"labels": labels, "ownerReferences": [ref]}


def pod_objects(scenario: Scenario, t0: float, t1: float) -> list[dict[str, Any]]:
    """Kubernetes Pod objects for every pod run alive at some time in [t0, t1) (scenario
    seconds), as the API server would list them for the node."""
    out = []
    for pod in scenario.pods:
        w = Window(pod.start, pod.end, pod.repeat)
        if w.repeat is None:
            runs = [0] if pod.start < t1 and (pod.end is None or pod.end > t0) else []
        else:
            assert pod.end is not None
            first = max(0, math.floor((t0 - pod.end) / w.repeat))
            last = math.floor((t1 - pod.start) / w.repeat)
            runs = list(range(first, last + 1))
        for k in runs:
            uid, name = pod_identity(pod, k)
            annotations = pod_annotations(scenario, pod)
            out.append({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": pod.namespace, "uid": uid,
                             **owner_metadata(pod.namespace, dict(pod.labels), pod.owner),
                             **({"annotations": annotations} if annotations else {})},
                "spec": {"nodeName": scenario.node,
                         "containers": [{"name": c.name, "image": "sim"}
                                        for c in pod.containers]},
                "status": {"phase": "Running", "containerStatuses": [
                    {"name": c.name, "ready": True,
                     "containerID": f"containerd://{container_id(uid, c.name)}"}
                    for c in pod.containers]},
            })
    return out


def mode_overrides(scenario: Scenario) -> tuple[tuple[str, SharingMode], ...]:
    """The exporter's --sharing-mode flags for this node. Exclusive, MIG and time-slicing are
    told apart by the device IDs themselves (a ::N replica suffix means a share), so only MPS,
    which looks like time-slicing in IDs, needs configuring, as on a real cluster."""
    return tuple(sorted((r, SharingMode.MPS) for r, m in sharing_modes(scenario).items()
                        if m == SharingMode.MPS))


@dataclass
class SimNode:
    scenario: Scenario
    clock: Any
    start: float
    nvml: SimNVML
    kubelet: FakeKubelet
    proc_root: Path
    sampler: Sampler

    @property
    def name(self) -> str:
        return self.scenario.node

    def scenario_time(self) -> float:
        return float(self.clock()) - self.start

    def allocations(self) -> list[PodAllocation]:
        return [PodAllocation(p.namespace, p.name, [
            ContainerAllocation(c.name, [(r, list(ids)) for r, ids in c.devices],
                                [ClaimAllocation(ns, name, list(devs))
                                 for ns, name, devs in c.claims])
            for c in p.containers]) for p in pods_at(self.scenario, self.scenario_time())]

    def refresh_proc_tree(self) -> None:
        write_proc_tree(self.scenario, self.proc_root, self.scenario_time())


@dataclass
class VendorSimNode:
    """An AMD or Intel node (gpusim.vendor_node) driven through the exporter's Sampler."""

    vendor: VendorNode
    clock: Any
    start: float
    kubelet: FakeKubelet
    proc_root: Path
    sampler: Sampler

    @property
    def name(self) -> str:
        return self.vendor.scenario.node

    def scenario_time(self) -> float:
        return float(self.clock()) - self.start

    def allocations(self) -> list[PodAllocation]:
        return self.vendor.allocations(self.scenario_time())

    def refresh_proc_tree(self) -> None:
        """The vendor library's state, sysfs and /proc at the clock's time."""
        self.vendor.refresh(self.scenario_time())


ClusterNode = SimNode | VendorSimNode


class SimCluster:
    """Nodes from scenario files; `start` is the wall-clock time scenario t=0 maps to, and
    `window` the scenario seconds whose pods the API server lists."""

    def __init__(self, scenarios: Sequence[str | Path | Scenario], start: float,
                 workdir: str | Path | None = None, live: bool = False,
                 interval: float = 5.0, window: tuple[float, float] = (0.0, 32 * 86400.0),
                 collectors: Sequence[str] | None = None, pod_labels: Sequence[str] = ("team",),
                 process_metrics: bool = False,
                 vendors: Sequence[str | Path | VendorScenario] = ()) -> None:
        """`scenarios`: NVIDIA nodes (SimNVML); `vendors`: AMD and Intel nodes."""
        self._tmp = None if workdir else tempfile.TemporaryDirectory(prefix="gpu-ledger-sim-")
        self.workdir = Path(workdir or self._tmp.name)  # type: ignore[union-attr]
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.live = live
        loaded = [s if isinstance(s, Scenario) else load_scenario(s) for s in scenarios]
        vendor_loaded = [v if isinstance(v, VendorScenario) else load_vendor_scenario(v)
                         for v in vendors]
        pods: list[dict[str, Any]] = []
        slices: list[dict[str, Any]] = []
        claims: list[dict[str, Any]] = []
        for sc in loaded:
            pods.extend(pod_objects(sc, *window))
            slices.extend(resource_slices(sc))
            claims.extend(resource_claim(sc, c) for c in sc.claims)
        vendor_nodes: list[tuple[VendorNode, Any]] = []
        for vs in vendor_loaded:
            clock: Any = time.time if live else ManualClock(start)
            base = self.workdir / vs.node
            vnode = VendorNode(vs, base / "sys", base / "proc", clock, start)
            vendor_nodes.append((vnode, clock))
            pods.extend(vnode.pod_objects(*window))
        self.api = FakeApiServer(pods, slices=slices, claims=claims).start()
        kubeconfig = self.api.kubeconfig(str(self.workdir / "kubeconfig"))
        specs: list[CollectorSpec] = [s for s in REGISTRY
                                      if collectors is None or s.name in collectors]
        self.nodes: list[SimNode] = []  # the NVIDIA nodes
        self.vendor_nodes: list[VendorSimNode] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

        def options(node: str, sock: str, proc_root: Path, sysfs_root: Path,
                    modes: tuple[tuple[str, SharingMode], ...] = ()) -> ExporterOptions:
            return ExporterOptions(
                node=node, interval=interval, process_metrics=process_metrics,
                pod_resources_socket=sock, proc_root=str(proc_root), kubeconfig=kubeconfig,
                sysfs_root=str(sysfs_root), pod_label_allowlist=tuple(sorted(pod_labels)),
                sharing_modes=modes)

        for sc in loaded:
            clock = time.time if live else ManualClock(start)
            nvml = SimNVML(sc, clock=clock, start=start)
            proc_root = self.workdir / sc.node / "proc"
            sock = str(self.workdir / sc.node / "kubelet.sock")
            proc_root.mkdir(parents=True, exist_ok=True)
            sysfs_root = self.workdir / sc.node / "sys"
            write_sysfs_tree(sc, sysfs_root)
            node = SimNode(sc, clock, start, nvml, None, proc_root, None)  # type: ignore[arg-type]
            node.kubelet = FakeKubelet(sock, node.allocations,
                                       functools.partial(device_ids, sc)).start()
            node.sampler = Sampler(NvmlBackend(nvml),
                                   options(sc.node, sock, proc_root, sysfs_root,
                                           mode_overrides(sc)),
                                   specs, clock=clock, threaded=live, eager_render=live)
            self.nodes.append(node)
        for vnode, clock in vendor_nodes:
            sock = str(vnode.proc_root.parent / "kubelet.sock")
            vsim = VendorSimNode(vnode, clock, start, None, vnode.proc_root,  # type: ignore[arg-type]
                                 None)  # type: ignore[arg-type]
            vsim.kubelet = FakeKubelet(sock, vsim.allocations, vnode.device_ids).start()
            vsim.sampler = Sampler(vnode.backend, options(vsim.name, sock, vnode.proc_root,
                                                          vnode.sysfs_root),
                                   specs, clock=clock, threaded=live, eager_render=live)
            self.vendor_nodes.append(vsim)
        self._wait_for_pod_watch()

    @property
    def all_nodes(self) -> list[ClusterNode]:
        """The NVIDIA nodes, then the AMD and Intel ones."""
        return [*self.nodes, *self.vendor_nodes]

    def _wait_for_pod_watch(self, timeout: float = 15.0) -> None:
        """The pod and ResourceSlice watches and the ResourceClaim reader run on their own
        threads; before stepping a simulated clock, let the watches finish their first list and
        the reader answer the claims the first cycle asked for, so the first cycles already
        carry pod names, labels, claimed devices and their sharing."""
        for node in self.all_nodes:
            node.refresh_proc_tree()
            node.sampler.cycle()  # starts the collectors' background threads
        watches = [w for n in self.all_nodes for c in n.sampler.collectors
                   for attr in ("pod_watch", "slice_watch")
                   if (w := getattr(c, attr, None)) is not None]
        readers = [r for n in self.all_nodes for c in n.sampler.collectors
                   if (r := getattr(c, "claim_reader", None)) is not None]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and (any(w.lists < 1 for w in watches)
                                               or any(r.pending for r in readers)):
            time.sleep(0.02)

    def step(self, t: float) -> Iterator[tuple[ClusterNode, Rendering]]:
        """Set every node's clock to wall time t and run one sample cycle on each."""
        for node in self.all_nodes:
            assert isinstance(node.clock, ManualClock), "step() needs a cluster built live=False"
            node.clock.now = t
            node.refresh_proc_tree()
            yield node, node.sampler.cycle()

    def start_live(self, refresh: float = 1.0) -> None:
        for node in self.all_nodes:
            node.refresh_proc_tree()
            node.sampler.start()

        def refresher() -> None:
            while not self._stop.wait(refresh):
                for node in self.all_nodes:
                    node.refresh_proc_tree()

        thread = threading.Thread(target=refresher, name="proc-tree", daemon=True)
        thread.start()
        self._threads.append(thread)

    def close(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=5)
        for node in self.all_nodes:
            node.sampler.close()
            node.kubelet.stop()
        self.api.stop()
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self) -> SimCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
