"""AttributionCollector end to end: a real gRPC PodResources server on a unix socket, a real
pod watch (exporter/kube) watching FakeApiServer, and a proc tree of cgroup files."""

import os
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from exporter.attribution.collector import AttributionCollector
from exporter.attribution.podwatch import PodWatch
from exporter.core import (
    CycleContext,
    ExporterOptions,
    GpuRef,
    Labels,
    MigRef,
    PodLabels,
    ProcessSample,
    SampleSink,
    SourceStatus,
)
from exporter.device.nvml import NvmlBackend
from gpusim.apiserver import FakeApiServer
from gpusim.kubelet import ClaimAllocation, ContainerAllocation, FakeKubelet, PodAllocation
from tests.waiting import wait_until

Attached = tuple[AttributionCollector, ExporterOptions]
NODE = "node-a"
GiB = 1024**3
GPU0 = "GPU-00000000-0000-4000-8000-000000000000"  # exclusive
GPU1 = "GPU-11111111-1111-4111-8111-111111111111"  # MIG enabled
MIG_A = "MIG-aaaaaaaa-aaaa-4aaa-8aaa-aaaaaaaaaaaa"  # mixed strategy
MIG_B = "MIG-bbbbbbbb-bbbb-4bbb-8bbb-bbbbbbbbbbbb"  # single strategy
GPU2 = "GPU-22222222-2222-4222-8222-222222222222"  # time-sliced, 4 replicas
GPU3 = "GPU-33333333-3333-4333-8333-333333333333"  # MPS, 2 replicas
UNKNOWN = "GPU-deadbeef-dead-4ead-8ead-deaddeaddead"

G0 = GpuRef(0, GPU0, "NVIDIA H100 80GB HBM3", False, None)
G1 = GpuRef(1, GPU1, "NVIDIA H100 80GB HBM3", True, None)
G2 = GpuRef(2, GPU2, "NVIDIA L4", False, None)
G3 = GpuRef(3, GPU3, "NVIDIA L4", False, None)
MIGS = [MigRef(G1, MIG_A, 1, 0, "3g.40gb", 3, 7, None, slot=0),
        MigRef(G1, MIG_B, 2, 0, "3g.40gb", 3, 7, None, slot=1)]

ALLOCATABLE = [("nvidia.com/gpu", GPU0), ("nvidia.com/mig-3g.40gb", MIG_A),
               ("nvidia.com/gpu", MIG_B), ("example.com/nic", "eth1")]
ALLOCATABLE += [("nvidia.com/gpu", f"{GPU2}::{n}") for n in range(4)]
ALLOCATABLE += [("nvidia.com/gpu.shared", f"{GPU3}::{n}") for n in range(2)]


def _alloc(ns: str, name: str, container: str,
           *devices: tuple[str, list[str]]) -> PodAllocation:
    return PodAllocation(ns, name, [ContainerAllocation(container, list(devices))])


ALLOCATIONS = [
    PodAllocation("ml", "trainer", [
        ContainerAllocation("main", [("nvidia.com/gpu", [GPU0])]),
        ContainerAllocation("sidecar", [])]),
    _alloc("ml", "mig-mixed", "worker", ("nvidia.com/mig-3g.40gb", [MIG_A])),
    _alloc("ml", "mig-single", "worker", ("nvidia.com/gpu", [MIG_B])),
    _alloc("team-a", "ts-1", "app", ("nvidia.com/gpu", [f"{GPU2}::0"])),
    _alloc("team-b", "ts-2", "app", ("nvidia.com/gpu", [f"{GPU2}::1"])),
    _alloc("team-c", "ts-3", "app", ("nvidia.com/gpu", [f"{GPU2}::2"])),
    _alloc("ml", "mps", "srv", ("nvidia.com/gpu.shared", [f"{GPU3}::0", f"{GPU3}::1"])),
    _alloc("ml", "stray", "x", ("nvidia.com/gpu", [UNKNOWN]), ("example.com/nic", ["eth1"])),
]

# (namespace, pod, container, team label, pod uid, container id tag)
PODS = [
    ("ml", "trainer", "main", "ml-platform", "10000000-0000-4000-8000-000000000001", "a1"),
    ("ml", "mig-mixed", "worker", "ml-platform", "10000000-0000-4000-8000-000000000002", "a2"),
    ("ml", "mig-single", "worker", "ml-platform", "10000000-0000-4000-8000-000000000003", "a3"),
    ("team-a", "ts-1", "app", "alpha", "10000000-0000-4000-8000-000000000004", "a4"),
    ("team-b", "ts-2", "app", "beta", "10000000-0000-4000-8000-000000000005", "a5"),
    ("team-c", "ts-3", "app", "gamma", "10000000-0000-4000-8000-000000000006", "a6"),
    ("ml", "mps", "srv", "ml-platform", "10000000-0000-4000-8000-000000000007", "a7"),
]
UID = {(ns, pod): uid for ns, pod, _, _, uid, _ in PODS}
CID = {(ns, pod): tag * 32 for ns, pod, _, _, _, tag in PODS}

# pid -> (pod it runs in or None, uuid, mig_uuid, memory, sm)
PROCESSES: dict[int, tuple[tuple[str, str] | None, str, str, int, float | None]] = {
    101: (("ml", "trainer"), GPU0, "", 10 * GiB, 0.5),
    102: (("ml", "trainer"), GPU0, "", 1 * GiB, 0.25),
    201: (("ml", "mig-mixed"), GPU1, MIG_A, 5 * GiB, None),
    202: (("ml", "mig-single"), GPU1, MIG_B, 6 * GiB, None),
    301: (("team-a", "ts-1"), GPU2, "", 1 * GiB, 0.1),
    302: (("team-b", "ts-2"), GPU2, "", 2 * GiB, 0.2),
    303: (("team-b", "ts-2"), GPU2, "", 3 * GiB, 0.3),
    304: (("team-c", "ts-3"), GPU2, "", 4 * GiB, 0.05),
    305: (None, GPU2, "", GiB // 2, 0.01),  # no cgroup file: exited, or not ours to read
    401: (("ml", "mps"), GPU3, "", 7 * GiB, 0.4),
}

CGROUP_STYLES: list[Callable[[str, str], str]] = [
    lambda uid, cid: ("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
                      f"{uid.replace('-', '_')}.slice/cri-containerd-{cid}.scope\n"),
    lambda uid, cid: f"0::/kubepods/burstable/pod{uid}/{cid}\n",
    lambda uid, cid: (f"11:memory:/kubepods.slice/kubepods-pod{uid.replace('-', '_')}.slice/"
                      f"crio-{cid}.scope\n0::/\n"),
]


def api_pod(ns: str, name: str, container: str, team: str, uid: str, cid: str,
            node: str = NODE) -> dict[str, Any]:
    # The trainer belongs to Deployment "trainer" through ReplicaSet trainer-abc.
    owners = [{"kind": "ReplicaSet", "name": "trainer-abc", "controller": True}] \
        if name == "trainer" else []
    return {
        "metadata": {"name": name, "namespace": ns, "uid": uid, "ownerReferences": owners,
                     "labels": {"team": team, "pod-template-hash": "abc"}},
        "spec": {"nodeName": node, "containers": [{"name": container}, {"name": "sidecar"}]},
        "status": {"phase": "Running", "containerStatuses": [
            {"name": container, "containerID": f"containerd://{cid}"},
            {"name": "sidecar", "containerID": f"containerd://{'f' * 64}"}]},
    }


@pytest.fixture
def sockdir() -> Iterator[Path]:
    # unix socket paths are limited to ~107 bytes: pytest's tmp_path can be longer
    path = tempfile.mkdtemp(prefix="gl-attr-", dir="/tmp")
    yield Path(path)
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def proc_root(tmp_path: Path) -> Path:
    root = tmp_path / "proc"
    for i, (pid, (pod, *_)) in enumerate(PROCESSES.items()):
        if pod is None:
            continue
        (root / str(pid)).mkdir(parents=True)
        style = CGROUP_STYLES[i % len(CGROUP_STYLES)]
        (root / str(pid) / "cgroup").write_text(style(UID[pod], CID[pod]))
    return root


@pytest.fixture
def kubelet(sockdir: Path) -> Iterator[FakeKubelet]:
    k = FakeKubelet(str(sockdir / "kubelet.sock"), lambda: ALLOCATIONS, lambda: ALLOCATABLE)
    k.start()
    yield k
    k.stop()


@pytest.fixture
def apiserver() -> Iterator[FakeApiServer]:
    server = FakeApiServer([api_pod(*p) for p in PODS]
                           + [api_pod("ml", "elsewhere", "c", "x", "20000000-0000-4000-8000-"
                                      "000000000001", "b1" * 32, node="node-b")])
    server.start()
    yield server
    server.stop()


def options(sockdir: Path, proc_root: Path, kubeconfig: str | None = None,
            **kw: Any) -> ExporterOptions:
    base: dict[str, Any] = dict(node=NODE, pod_resources_socket=str(sockdir / "kubelet.sock"),
                proc_root=str(proc_root), kubeconfig=kubeconfig, kubernetes=kubeconfig is not None,
                pod_label_allowlist=("team",), sharing_modes=(("nvidia.com/gpu.shared", "mps"),),
                rpc_timeout=2.0)
    base.update(kw)
    return ExporterOptions(**base)


def context(opts: ExporterOptions) -> CycleContext:
    return CycleContext(
        options=opts, now=time.time(), gpus=[G0, G1, G2, G3], migs=list(MIGS),
        processes=[ProcessSample(pid, uuid, mig, mem, sm)
                   for pid, (_, uuid, mig, mem, sm) in PROCESSES.items()])


def collect(collector: AttributionCollector,
            opts: ExporterOptions) -> tuple[CycleContext, SampleSink]:
    ctx, sink = context(opts), SampleSink()
    collector.collect(ctx, sink)
    return ctx, sink


def family(sink: SampleSink, name: str) -> dict[Labels, tuple[float, PodLabels]]:
    out: dict[Labels, tuple[float, PodLabels]] = {}
    for labels, value, pod_labels in sink.samples.get(name, []):
        assert labels not in out, f"duplicate series {name}{labels}"
        out[labels] = (value, pod_labels)
    return out


def watch_of(collector: AttributionCollector) -> PodWatch:
    assert collector._watch is not None
    return collector._watch


def team(t: str) -> PodLabels:
    return (("team", t),)


@pytest.fixture
def attached(sockdir: Path, proc_root: Path, kubelet: FakeKubelet, apiserver: FakeApiServer,
             tmp_path: Path) -> Iterator[Attached]:
    kubeconfig = apiserver.kubeconfig(str(tmp_path / "kubeconfig"))
    opts = options(sockdir, proc_root, kubeconfig)
    collector = AttributionCollector(opts)
    wait_until(lambda: len(watch_of(collector).pods) == len(PODS), "the pod watch's first list")
    yield collector, opts
    collector.close()


def test_allocations_for_every_sharing_mode(attached: Attached) -> None:
    collector, opts = attached
    ctx, sink = collect(collector, opts)
    assert ctx.sources["podresources"].up and ctx.sources["kubernetes"].up
    alloc = family(sink, "gpu_container_allocation")
    assert alloc == {
        (NODE, "ml", "trainer", "main", GPU0, "", "nvidia.com/gpu", "exclusive", "1",
         "Deployment", "trainer"):
            (1.0, team("ml-platform")),
        (NODE, "ml", "mig-mixed", "worker", GPU1, MIG_A, "nvidia.com/mig-3g.40gb", "mig", "1",
         "", ""):
            (1.0, team("ml-platform")),
        (NODE, "ml", "mig-single", "worker", GPU1, MIG_B, "nvidia.com/gpu", "mig", "1", "", ""):
            (1.0, team("ml-platform")),
        (NODE, "team-a", "ts-1", "app", GPU2, "", "nvidia.com/gpu", "time-slicing", "4", "", ""):
            (1.0, team("alpha")),
        (NODE, "team-b", "ts-2", "app", GPU2, "", "nvidia.com/gpu", "time-slicing", "4", "", ""):
            (1.0, team("beta")),
        (NODE, "team-c", "ts-3", "app", GPU2, "", "nvidia.com/gpu", "time-slicing", "4", "", ""):
            (1.0, team("gamma")),
        (NODE, "ml", "mps", "srv", GPU3, "", "nvidia.com/gpu.shared", "mps", "2", "", ""):
            (2.0, team("ml-platform")),
    }
    assert ("nvidia.com/gpu", UNKNOWN) in collector.unknown_ids.seen
    # every allocatable GPU resource has the counter, at 0 until an ID fails
    unresolved = family(sink, "gpu_exporter_unresolved_device_ids_total")
    zero = {("nvidia.com/mig-3g.40gb",): 0.0, ("nvidia.com/gpu.shared",): 0.0}
    assert {k: v for k, (v, _) in unresolved.items()} == {("nvidia.com/gpu",): 1.0, **zero}
    _, sink = collect(collector, opts)  # a counter: the same stray allocation, seen again
    unresolved = family(sink, "gpu_exporter_unresolved_device_ids_total")
    assert {k: v for k, (v, _) in unresolved.items()} == {("nvidia.com/gpu",): 2.0, **zero}


def test_index_and_cdi_device_ids(sockdir: Path, proc_root: Path) -> None:
    """A node whose device plugin runs with deviceIDStrategy: index, and one ID in CDI form:
    the same devices as the UUID forms, the same sharing modes; IDs past the inventory are
    counted per resource."""
    allocatable = [("nvidia.com/gpu", "0"), ("nvidia.com/mig-3g.40gb", "1:0"),
                   ("nvidia.com/gpu", "1:1")]
    allocatable += [("nvidia.com/gpu", f"2::{n}") for n in range(4)]
    allocations = [
        _alloc("ml", "trainer", "main", ("nvidia.com/gpu", ["0"])),
        _alloc("ml", "mig-mixed", "worker", ("nvidia.com/mig-3g.40gb", ["1:0"])),
        _alloc("ml", "mig-single", "worker", ("nvidia.com/gpu", ["nvidia.com/gpu=1:1"])),
        _alloc("team-a", "ts-1", "app", ("nvidia.com/gpu", ["2::0"])),
        _alloc("team-b", "ts-2", "app", ("nvidia.com/gpu", ["nvidia.com/gpu=2::1"])),
        _alloc("ml", "stray", "x", ("nvidia.com/gpu", ["7", "1:5"]),
               ("nvidia.com/mig-3g.40gb", ["nvidia.com/gpu=9:0"])),
    ]
    k = FakeKubelet(str(sockdir / "kubelet.sock"), lambda: allocations, lambda: allocatable)
    k.start()
    opts = options(sockdir, proc_root)
    collector = AttributionCollector(opts)
    try:
        _, sink = collect(collector, opts)
    finally:
        collector.close()
        k.stop()
    alloc = {k[1:9]: v for k, (v, _) in family(sink, "gpu_container_allocation").items()}
    assert alloc == {
        ("ml", "trainer", "main", GPU0, "", "nvidia.com/gpu", "exclusive", "1"): 1.0,
        ("ml", "mig-mixed", "worker", GPU1, MIG_A, "nvidia.com/mig-3g.40gb", "mig", "1"): 1.0,
        ("ml", "mig-single", "worker", GPU1, MIG_B, "nvidia.com/gpu", "mig", "1"): 1.0,
        ("team-a", "ts-1", "app", GPU2, "", "nvidia.com/gpu", "time-slicing", "4"): 1.0,
        ("team-b", "ts-2", "app", GPU2, "", "nvidia.com/gpu", "time-slicing", "4"): 1.0,
    }
    unresolved = family(sink, "gpu_exporter_unresolved_device_ids_total")
    assert {k: v for k, (v, _) in unresolved.items()} == {
        ("nvidia.com/gpu",): 2.0, ("nvidia.com/mig-3g.40gb",): 1.0}


def test_usage_per_container(attached: Attached) -> None:
    collector, opts = attached
    _, sink = collect(collector, opts)
    mem = family(sink, "gpu_container_memory_used_bytes")
    assert {k: v for k, (v, _) in mem.items()} == {
        (NODE, "ml", "trainer", "main", GPU0, ""): 11 * GiB,
        (NODE, "ml", "mig-mixed", "worker", GPU1, MIG_A): 5 * GiB,
        (NODE, "ml", "mig-single", "worker", GPU1, MIG_B): 6 * GiB,
        (NODE, "team-a", "ts-1", "app", GPU2, ""): 1 * GiB,
        (NODE, "team-b", "ts-2", "app", GPU2, ""): 5 * GiB,
        (NODE, "team-c", "ts-3", "app", GPU2, ""): 4 * GiB,
        (NODE, "", "", "", GPU2, ""): GiB // 2,
        (NODE, "ml", "mps", "srv", GPU3, ""): 7 * GiB,
    }
    assert mem[(NODE, "team-b", "ts-2", "app", GPU2, "")][1] == team("beta")
    assert mem[(NODE, "", "", "", GPU2, "")][1] == ()
    sm = {k: v for k, (v, _) in family(sink, "gpu_container_sm_utilization_ratio").items()}
    assert sm == pytest.approx({
        (NODE, "ml", "trainer", "main", GPU0, ""): 0.75,
        (NODE, "team-a", "ts-1", "app", GPU2, ""): 0.1,
        (NODE, "team-b", "ts-2", "app", GPU2, ""): 0.5,
        (NODE, "team-c", "ts-3", "app", GPU2, ""): 0.05,
        (NODE, "", "", "", GPU2, ""): 0.01,
        (NODE, "ml", "mps", "srv", GPU3, ""): 0.4,
    })  # no MIG series: NVML has no per-process SM figure there
    procs = {k: v for k, (v, _) in family(sink, "gpu_container_processes").items()}
    assert procs[(NODE, "ml", "trainer", "main", GPU0, "")] == 2
    assert procs[(NODE, "team-b", "ts-2", "app", GPU2, "")] == 2
    assert sum(procs.values()) == len(PROCESSES)
    assert "gpu_process_memory_used_bytes" not in sink.samples  # opt-in only


def test_shared_gpu_pods_sum_to_device_total(attached: Attached) -> None:
    collector, opts = attached
    _, sink = collect(collector, opts)
    on_gpu2 = [(k, v) for k, (v, _) in family(sink, "gpu_container_memory_used_bytes").items()
               if k[4] == GPU2]
    pods = {k[2] for k, _ in on_gpu2}
    assert pods == {"ts-1", "ts-2", "ts-3", ""}
    device_total = sum(mem for _, uuid, _, mem, _ in PROCESSES.values() if uuid == GPU2)
    assert sum(v for _, v in on_gpu2) == device_total
    sm = [v for k, (v, _) in family(sink, "gpu_container_sm_utilization_ratio").items()
          if k[4] == GPU2]
    assert sum(sm) == pytest.approx(
        sum(s for _, uuid, _, _, s in PROCESSES.values() if uuid == GPU2))
    for ns, pod, pids in (("team-a", "ts-1", [301]), ("team-b", "ts-2", [302, 303]),
                          ("team-c", "ts-3", [304])):
        own = sum(PROCESSES[p][3] for p in pids)
        assert dict(on_gpu2)[(NODE, ns, pod, "app", GPU2, "")] == own


def test_process_metrics_opt_in(sockdir: Path, proc_root: Path, kubelet: FakeKubelet,
                                apiserver: FakeApiServer, tmp_path: Path) -> None:
    kubeconfig = apiserver.kubeconfig(str(tmp_path / "kubeconfig"))
    opts = options(sockdir, proc_root, kubeconfig, process_metrics=True)
    collector = AttributionCollector(opts)
    try:
        wait_until(lambda: len(watch_of(collector).pods) == len(PODS), "the pod watch")
        _, sink = collect(collector, opts)
    finally:
        collector.close()
    mem = family(sink, "gpu_process_memory_used_bytes")
    assert mem[(NODE, "303", GPU2, "", "team-b", "ts-2", "app")] == (3 * GiB, ())
    assert mem[(NODE, "305", GPU2, "", "", "", "")] == (GiB // 2, ())
    assert len(mem) == len(PROCESSES)
    sm = family(sink, "gpu_process_sm_utilization_ratio")
    assert (NODE, "201", GPU1, MIG_A, "ml", "mig-mixed", "worker") not in sm
    assert sm[(NODE, "101", GPU0, "", "ml", "trainer", "main")] == (0.5, ())


def test_pod_label_changes_follow_the_watch(
        attached: Attached,
        apiserver: FakeApiServer) -> None:
    collector, opts = attached
    ns, name, ctr, _, uid, tag = PODS[0]
    apiserver.modify_pod(api_pod(ns, name, ctr, "research", uid, tag * 32))
    wait_until(lambda: watch_of(collector).pods[uid].labels == team("research"), "the MODIFIED")
    _, sink = collect(collector, opts)
    key = (NODE, "ml", "trainer", "main", GPU0, "")
    assert family(sink, "gpu_container_memory_used_bytes")[key] == (11 * GiB, team("research"))


def test_without_the_api_devices_still_attribute(sockdir: Path, proc_root: Path,
                                                 kubelet: FakeKubelet) -> None:
    # PodResources alone: exclusive and MIG devices have one holder, shared ones do not
    opts = options(sockdir, proc_root, kubeconfig=None)
    collector = AttributionCollector(opts)
    try:
        ctx, sink = collect(collector, opts)
    finally:
        collector.close()
    # turned off, not down: no status at all, so no source_up series to alert on
    assert "kubernetes" not in ctx.sources
    assert ctx.sources["podresources"].up
    mem = {k: v for k, (v, _) in family(sink, "gpu_container_memory_used_bytes").items()}
    assert mem[(NODE, "ml", "trainer", "main", GPU0, "")] == 11 * GiB
    assert mem[(NODE, "ml", "mig-mixed", "worker", GPU1, MIG_A)] == 5 * GiB
    assert mem[(NODE, "ml", "mig-single", "worker", GPU1, MIG_B)] == 6 * GiB
    assert mem[(NODE, "", "", "", GPU2, "")] == sum(
        m for _, uuid, _, m, _ in PROCESSES.values() if uuid == GPU2)
    # holders of the shared GPU still appear, idle as far as we can tell
    assert mem[(NODE, "team-b", "ts-2", "app", GPU2, "")] == 0
    assert all(pl == () for _, _, pl in sink.samples["gpu_container_allocation"])


def test_no_socket_no_api(sockdir: Path, proc_root: Path, tmp_path: Path) -> None:
    opts = options(sockdir, proc_root, kubeconfig=str(tmp_path / "missing-kubeconfig"))
    collector = AttributionCollector(opts)
    try:
        wait_until(lambda: watch_of(collector).status.reason != "starting", "the watch to fail")
        ctx, sink = collect(collector, opts)
    finally:
        collector.close()
    pr, k8s = ctx.sources["podresources"], ctx.sources["kubernetes"]
    assert (pr.up, pr.reason) == (False, "no-socket")
    assert k8s.up is False and k8s.reason == "no-config"
    assert "gpu_container_allocation" not in sink.samples
    procs = {k: v for k, (v, _) in family(sink, "gpu_container_processes").items()}
    assert procs == {(NODE, "", "", "", GPU0, ""): 2, (NODE, "", "", "", GPU1, MIG_A): 1,
                     (NODE, "", "", "", GPU1, MIG_B): 1, (NODE, "", "", "", GPU2, ""): 5,
                     (NODE, "", "", "", GPU3, ""): 1}


def test_kubelet_restart_recovers(sockdir: Path, proc_root: Path) -> None:
    path = str(sockdir / "kubelet.sock")
    opts = options(sockdir, proc_root)
    first = FakeKubelet(path, lambda: ALLOCATIONS, lambda: ALLOCATABLE).start()
    collector = AttributionCollector(opts)
    try:
        ctx, sink = collect(collector, opts)
        assert ctx.sources["podresources"].up
        assert len(sink.samples["gpu_container_allocation"]) == 7
        first.stop()
        ctx, sink = collect(collector, opts)
        assert ctx.sources["podresources"] == SourceStatus(False, "no-socket")
        assert "gpu_container_allocation" not in sink.samples
        assert sum(v for _, v, _ in sink.samples["gpu_container_processes"]) == len(PROCESSES)
        # a crashed kubelet leaves its socket file behind, with nobody listening
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as stale:
            stale.bind(path)
            ctx, _ = collect(collector, opts)
            assert ctx.sources["podresources"] == SourceStatus(False, "unavailable")
        os.unlink(path)
        # a new kubelet on the same path, with one pod fewer
        second = FakeKubelet(path, lambda: ALLOCATIONS[1:], lambda: ALLOCATABLE).start()
        try:
            ctx, sink = collect(collector, opts)
            assert ctx.sources["podresources"].up
            assert len(sink.samples["gpu_container_allocation"]) == 6
            # a reconnect re-reads the allocatable devices (replica counts may have changed)
            assert second.calls["GetAllocatableResources"] == 1
        finally:
            second.stop()
    finally:
        collector.close()


def test_kubelet_that_never_answers(sockdir: Path, proc_root: Path,
                                    kubelet: FakeKubelet) -> None:
    opts = options(sockdir, proc_root, rpc_timeout=0.3)
    collector = AttributionCollector(opts)
    try:
        ctx, _ = collect(collector, opts)
        assert ctx.sources["podresources"].up
        kubelet.hang = True
        done: dict[str, tuple[CycleContext, SampleSink]] = {}
        worker = threading.Thread(target=lambda: done.update(out=collect(collector, opts)))
        worker.start()
        worker.join(timeout=30)  # a liveness guard: the deadline must end the call
        assert not worker.is_alive()
        ctx, sink = done["out"]
        assert ctx.sources["podresources"].up is False
        assert ctx.sources["podresources"].reason == "deadline-exceeded"
        assert sum(v for _, v, _ in sink.samples["gpu_container_processes"]) == len(PROCESSES)
        kubelet.hang = False
        ctx, _ = collect(collector, opts)
        assert ctx.sources["podresources"].up
    finally:
        collector.close()


def test_pod_watch_is_injectable_and_closed(sockdir: Path, proc_root: Path, kubelet: FakeKubelet,
                                            apiserver: FakeApiServer, tmp_path: Path) -> None:
    kubeconfig = apiserver.kubeconfig(str(tmp_path / "kubeconfig"))
    opts = options(sockdir, proc_root, kubeconfig)
    watch = PodWatch(opts, watch_timeout=5)
    collector = AttributionCollector(opts, pod_watch=watch)
    wait_until(lambda: watch.status.up, "the watch")
    assert watch.running
    collector.close()
    assert watch.started and not watch.running


# --- DRA: claimed devices through ResourceSlices -----------------------------------------------

def dra_slice(name: str, node: str, devices: dict[str, str]) -> dict[str, Any]:
    """A ResourceSlice as the NVIDIA DRA driver publishes it: device name → uuid attribute
    (MIG devices carry parentUUID too)."""
    def attrs(uuid: str) -> dict[str, Any]:
        a: dict[str, Any] = {"uuid": {"string": uuid}, "type": {"string": "gpu"}}
        if uuid.startswith("MIG-"):
            a = {"uuid": {"string": uuid}, "type": {"string": "mig"},
                 "parentUUID": {"string": GPU1}}
        return a
    return {"metadata": {"name": name, "uid": f"uid-{name}"},
            "spec": {"driver": "gpu.nvidia.com", "nodeName": node,
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                     "devices": [{"name": n, "attributes": attrs(u)}
                                 for n, u in devices.items()]}}


def _claims(ns: str, pod: str, ctr: str, claim: str,
            *devices: tuple[str, str, str]) -> PodAllocation:
    return PodAllocation(ns, pod, [ContainerAllocation(ctr, claims=[
        ClaimAllocation(ns, claim, list(devices))])])


DRA = "gpu.nvidia.com"
DRA_ALLOCATIONS = [
    # device names are gpu-<minor>: here minors differ from NVML indexes, so only the slices
    # can say which GPU gpu-5 is
    _claims("ml", "trainer", "main", "solo", (DRA, NODE, "gpu-5")),
    _claims("ml", "mig-mixed", "worker", "mig", (DRA, NODE, "gpu-1-mig-9-4-3")),
    # one claim, two consumers: each holds a share
    _claims("team-a", "ts-1", "app", "shared", (DRA, NODE, "gpu-7")),
    _claims("team-b", "ts-2", "app", "shared", (DRA, NODE, "gpu-7")),
    # bad input: a device no slice lists, and another driver's device (not a GPU: ignored)
    _claims("ml", "mps", "srv", "ghost", (DRA, NODE, "gpu-99"), ("net.example.com", NODE, "n0")),
]
DRA_SLICES = [dra_slice("node-a-gpus", NODE, {"gpu-5": GPU0, "gpu-1-mig-9-4-3": MIG_A,
                                              "gpu-7": GPU3}),
              dra_slice("node-b-gpus", "node-b", {"gpu-99": GPU2})]


def test_dra_claims_through_resource_slices(sockdir: Path, proc_root: Path,
                                            tmp_path: Path) -> None:
    k = FakeKubelet(str(sockdir / "kubelet.sock"), lambda: DRA_ALLOCATIONS, lambda: [])
    k.start()
    server = FakeApiServer([api_pod(*p) for p in PODS], slices=DRA_SLICES)
    server.start()
    opts = options(sockdir, proc_root, server.kubeconfig(str(tmp_path / "kubeconfig")))
    collector = AttributionCollector(opts)
    try:
        wait_until(lambda: len(watch_of(collector).pods) == len(PODS)
                   and collector._slices is not None and collector._slices.status.up,
                   "the pod and ResourceSlice watches' first lists")
        ctx, sink = collect(collector, opts)
    finally:
        collector.close()
        server.stop()
        k.stop()
    assert ctx.sources["resourceslices"].up
    alloc = {k[1:9]: v for k, (v, _) in family(sink, "gpu_container_allocation").items()}
    assert alloc == {
        ("ml", "trainer", "main", GPU0, "", DRA, "exclusive", "1"): 1.0,
        ("ml", "mig-mixed", "worker", GPU1, MIG_A, DRA, "mig", "1"): 1.0,
        ("team-a", "ts-1", "app", GPU3, "", DRA, "time-slicing", "2"): 1.0,
        ("team-b", "ts-2", "app", GPU3, "", DRA, "time-slicing", "2"): 1.0,
    }
    assert family(sink, "gpu_exporter_dra_fallback") == {(): (0.0, ())}
    unresolved = family(sink, "gpu_exporter_unresolved_device_ids_total")
    assert {k: v for k, (v, _) in unresolved.items()} == {(DRA,): 1.0}
    # the holders own their processes through the claim as through a device plugin
    procs = {k[1:5]: v for k, (v, _) in family(sink, "gpu_container_processes").items()}
    assert procs[("ml", "trainer", "main", GPU0)] == 2


def test_dra_fallback_without_resource_slices(sockdir: Path, proc_root: Path) -> None:
    """No API access: gpu-<n> is NVML index n, MIG device names cannot be resolved (counted),
    and the fallback gauge says so. A claim shared by two pods is MPS when configured so."""
    claims = [
        _claims("ml", "trainer", "main", "solo", (DRA, NODE, "gpu-0")),
        _claims("ml", "mig-mixed", "worker", "mig", (DRA, NODE, "gpu-1-mig-9-4-3")),
        _claims("team-a", "ts-1", "app", "shared", (DRA, NODE, "gpu-3")),
        _claims("team-b", "ts-2", "app", "shared", (DRA, NODE, "gpu-3")),
    ]
    k = FakeKubelet(str(sockdir / "kubelet.sock"), lambda: claims, lambda: [])
    k.start()
    opts = options(sockdir, proc_root, sharing_modes=((DRA, "mps"),))
    collector = AttributionCollector(opts)
    try:
        ctx, sink = collect(collector, opts)
    finally:
        collector.close()
        k.stop()
    assert "resourceslices" not in ctx.sources  # turned off (no API): no status, no series
    alloc = {k[1:9]: v for k, (v, _) in family(sink, "gpu_container_allocation").items()}
    assert alloc == {
        ("ml", "trainer", "main", GPU0, "", DRA, "exclusive", "1"): 1.0,
        ("team-a", "ts-1", "app", GPU3, "", DRA, "mps", "2"): 1.0,
        ("team-b", "ts-2", "app", GPU3, "", DRA, "mps", "2"): 1.0,
    }
    assert family(sink, "gpu_exporter_dra_fallback") == {(): (1.0, ())}
    unresolved = family(sink, "gpu_exporter_unresolved_device_ids_total")
    assert {k: v for k, (v, _) in unresolved.items()} == {(DRA,): 1.0}


# --- HAMi / gpushare fractional grants from pod annotations -----------------------------------

def test_fractional_grants_from_annotations(sockdir: Path, proc_root: Path,
                                            tmp_path: Path) -> None:
    """HAMi and gpushare pods: mode `fractional`, the granted memory and core fractions; the
    framebuffer a HAMi MiB grant divides comes from the simulated NVML. Malformed annotations
    and a gpushare index past the GPU count are counted and logged; the rest is attributed."""
    from gpusim.nvml import SimNVML
    from gpusim.scenario import loads_scenario

    l4 = "  - model: NVIDIA L4\n    memory: 24GiB\n    power_limit_watts: 72\n"
    nvml = SimNVML(loads_scenario(f"node: node-a\ngpus:\n{l4}{l4}", "t.yaml"))
    nvml.nvmlInit()
    backend = NvmlBackend(nvml.as_api())
    inventory = backend.inventory(None)  # the GPUs' memory (HAMi MiB grants) comes from here
    uuids = [g.uuid for g in inventory.gpus]

    def pod_with(name: str, annotations: dict[str, str], uid: str) -> dict[str, Any]:
        p = api_pod("ml", name, "main", "ml-platform", uid, uid[-1] * 64)
        p["metadata"]["annotations"] = annotations
        return p

    pods = [
        # HAMi: 6144 MiB of 24 GiB and 30% of the cores for `main`; sidecar has no group
        pod_with("hami", {"hami.io/vgpu-devices-allocated": f"{uuids[0]},NVIDIA,6144,30:;"},
                 "30000000-0000-4000-8000-000000000001"),
        # HAMi without a core limit (0): memory only
        pod_with("hami-mem", {"hami.io/vgpu-devices-allocated": f"{uuids[0]},NVIDIA,12288,0:;"},
                 "30000000-0000-4000-8000-000000000002"),
        # gpushare: 6 of 24 units on GPU 1
        pod_with("share", {"ALIYUN_COM_GPU_MEM_IDX": "1", "ALIYUN_COM_GPU_MEM_POD": "6",
                           "ALIYUN_COM_GPU_MEM_DEV": "24"}, "30000000-0000-4000-8000-000000000003"),
        # bad input
        pod_with("bad-hami", {"hami.io/vgpu-devices-allocated": f"{uuids[0]},NVIDIA,lots,30:;"},
                 "30000000-0000-4000-8000-000000000004"),
        pod_with("bad-index", {"ALIYUN_COM_GPU_MEM_IDX": "7", "ALIYUN_COM_GPU_MEM_POD": "2",
                               "ALIYUN_COM_GPU_MEM_DEV": "24"},
                 "30000000-0000-4000-8000-000000000005"),
        pod_with("bad-share", {"ALIYUN_COM_GPU_MEM_IDX": "0", "ALIYUN_COM_GPU_MEM_POD": "30",
                               "ALIYUN_COM_GPU_MEM_DEV": "24"},
                 "30000000-0000-4000-8000-000000000006"),
    ]
    k = FakeKubelet(str(sockdir / "kubelet.sock"), lambda: [], lambda: [])
    k.start()
    server = FakeApiServer(pods)
    server.start()
    opts = options(sockdir, proc_root, server.kubeconfig(str(tmp_path / "kubeconfig")))
    collector = AttributionCollector(opts)
    try:
        wait_until(lambda: len(watch_of(collector).pods) == len(pods), "the pod watch")
        ctx = CycleContext(options=opts, now=time.time(), gpus=list(inventory.gpus),
                           static=inventory.static, backend=backend)
        sink = SampleSink()
        collector.collect(ctx, sink)
        collector.collect(ctx, sink := SampleSink())  # errors count once per pod, not cycle
    finally:
        collector.close()
        server.stop()
        k.stop()
    alloc = {k[1:9]: v for k, (v, _) in family(sink, "gpu_container_allocation").items()}
    assert alloc == {
        ("ml", "hami", "main", uuids[0], "", "nvidia.com/gpumem", "fractional", "2"): 1.0,
        ("ml", "hami-mem", "main", uuids[0], "", "nvidia.com/gpumem", "fractional", "2"): 1.0,
        ("ml", "share", "main", uuids[1], "", "aliyun.com/gpu-mem", "fractional", "1"): 1.0,
    }
    mem = {k[1:5]: v for k, (v, _) in family(sink, "gpu_container_memory_fraction").items()}
    assert mem == {("ml", "hami", "main", uuids[0]): 0.25,
                   ("ml", "hami-mem", "main", uuids[0]): 0.5,
                   ("ml", "share", "main", uuids[1]): 0.25}
    cores = {k[1:5]: v for k, (v, _) in family(sink, "gpu_container_core_fraction").items()}
    assert cores == {("ml", "hami", "main", uuids[0]): 0.3}
    assert family(sink, "gpu_exporter_fractional_errors_total") == {(): (3.0, ())}
