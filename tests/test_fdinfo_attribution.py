"""The vendor-neutral split of a shared GPU between pods: a GPU that is not NVIDIA's, allocated
by PCI address through a real PodResources gRPC server (gpusim.kubelet), its processes found
in DRM fdinfo (exporter/device/fdinfo.py), joined to their pods through the cgroup mapping and
the pod watch (gpusim.apiserver) by the attribution collector."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from exporter.attribution.collector import AttributionCollector
from exporter.core import CycleContext, ExporterOptions, SampleSink
from exporter.device.contract import (
    EventSource,
    GpuRef,
    GpuStatic,
    GuestLicence,
    Interconnect,
    Inventory,
    MemoryUsage,
    MigRef,
    ProcessReader,
    Reliability,
    Tally,
    Telemetry,
    Vendor,
    VirtualFunction,
)
from exporter.device.fdinfo import DrmFdinfo, FdinfoProcessReader
from exporter.device.nvmlapi import NvmlApi
from exporter.processes import ProcessStage
from gpusim.apiserver import FakeApiServer
from gpusim.kubelet import ContainerAllocation, FakeKubelet, PodAllocation
from tests.test_attr_collector import api_pod
from tests.test_fdinfo import Clock, Proc, amdgpu
from tests.waiting import wait_until

NODE = "node-a"
GIB = 1024**3
WHOLE, SHARED = "0000:0c:00.0", "0000:0d:00.0"  # sysfs spelling
GPU_A = GpuRef(0, "GPU-amd-a", "AMD Instinct MI300X", False, None, vendor="amd")
GPU_B = GpuRef(1, "GPU-amd-b", "AMD Instinct MI300X", False, None, vendor="amd")
BDF = {GPU_A.uuid: WHOLE, GPU_B.uuid: SHARED}
# (namespace, pod, container, team, pod uid, container id tag)
PODS = [("ml", "trainer", "main", "ml", "30000000-0000-4000-8000-000000000001", "c1"),
        ("team-a", "nb-1", "app", "alpha", "30000000-0000-4000-8000-000000000002", "c2"),
        ("team-b", "nb-2", "app", "beta", "30000000-0000-4000-8000-000000000003", "c3")]
# The whole GPU by its address; two shares of the other (the plugin's own IDs would be the
# AMD backend's business: here an address with a replica suffix, which the index knows)
ALLOCATIONS = [
    PodAllocation("ml", "trainer", [ContainerAllocation("main", [("amd.com/gpu", [WHOLE])])]),
    PodAllocation("team-a", "nb-1", [ContainerAllocation("app", [
        ("amd.com/gpu", [f"{SHARED}::0"])])]),
    PodAllocation("team-b", "nb-2", [ContainerAllocation("app", [
        ("amd.com/gpu", [f"{SHARED}::1"])])]),
]
ALLOCATABLE = [("amd.com/gpu", WHOLE), ("amd.com/gpu", f"{SHARED}::0"),
               ("amd.com/gpu", f"{SHARED}::1")]


class _Amd:
    vendor: Vendor = "amd"
    source = "fakesmi"
    library = "FakeSMI"
    nvml: NvmlApi | None = None

    def __init__(self, drm: DrmFdinfo) -> None:
        self.drm = drm

    def open(self) -> None: ...
    def close(self) -> None: ...

    def inventory(self, previous: Inventory | None) -> Inventory:
        return Inventory(gpus=(GPU_A, GPU_B), static={
            g.uuid: GpuStatic(pci_bus_id=BDF[g.uuid].upper(), vendor="amd",
                              memory_bytes=192 * GIB) for g in (GPU_A, GPU_B)})

    def expected_devices(self, sysfs_root: str) -> list[str] | None:
        return sorted(BDF.values())

    def telemetry(self, gpu: GpuRef, tally: Tally) -> Telemetry:
        return Telemetry()

    def reliability(self, gpu: GpuRef, tally: Tally) -> Reliability:
        return Reliability()

    def partition_memory(self, partition: MigRef, tally: Tally) -> MemoryUsage | None:
        return None

    def process_reader(self) -> ProcessReader:
        return FdinfoProcessReader(self.drm, lambda g: BDF[g.uuid])

    def virtual_functions(self, gpu: GpuRef, tally: Tally) -> list[VirtualFunction]:
        return []

    def partition_utilization(self, partition: MigRef, tally: Tally) -> float | None:
        return None

    def interconnect(self, gpu: GpuRef, tally: Tally) -> Interconnect:
        return Interconnect()

    def guest_licences(self, gpu: GpuRef, tally: Tally) -> list[GuestLicence]:
        return []

    def error_events(self) -> EventSource:
        raise AssertionError("not read here")


def _cgroup(uid: str, cid: str) -> str:
    return f"0::/kubepods/burstable/pod{uid}/{cid}\n"


@pytest.fixture
def sockdir() -> Iterator[Path]:
    path = tempfile.mkdtemp(prefix="gl-fdinfo-", dir="/tmp")
    yield Path(path)
    shutil.rmtree(path, ignore_errors=True)


def test_shared_amd_gpu_split_between_pods_by_fdinfo(sockdir: Path, tmp_path: Path) -> None:
    proc = Proc(tmp_path / "proc")
    uid = {(ns, pod): u for ns, pod, _, _, u, _ in PODS}
    cid = {(ns, pod): tag * 32 for ns, pod, _, _, _, tag in PODS}
    # pid -> (pod, device, DRM client id, VRAM KiB, gfx ns at the 1st read, at the 2nd)
    procs = {
        101: (("ml", "trainer"), WHOLE, 1, 40 * 1024 * 1024, 0, 1_800_000_000),
        102: (("ml", "trainer"), WHOLE, 2, 8 * 1024 * 1024, 0, 200_000_000),
        201: (("team-a", "nb-1"), SHARED, 1, 16 * 1024 * 1024, 0, 500_000_000),
        301: (("team-b", "nb-2"), SHARED, 2, 4 * 1024 * 1024, 0, 100_000_000),
    }
    clock = Clock()
    for pid, (pod, bdf, client, vram, gfx, _) in procs.items():
        proc.open(pid, 5, amdgpu(client, vram, gfx).replace("0000:0c:00.0", bdf))
        (proc.root / str(pid) / "cgroup").write_text(_cgroup(uid[pod], cid[pod]))
    proc.open(999, 3, amdgpu(3, 1024, 0).replace("0000:0c:00.0", SHARED))  # no cgroup: host
    kubelet = FakeKubelet(str(sockdir / "kubelet.sock"), lambda: ALLOCATIONS,
                          lambda: ALLOCATABLE)
    kubelet.start()
    server = FakeApiServer([api_pod(*p) for p in PODS])
    server.start()
    opts = ExporterOptions(node=NODE, pod_resources_socket=str(sockdir / "kubelet.sock"),
                           proc_root=str(proc.root),
                           kubeconfig=server.kubeconfig(str(tmp_path / "kubeconfig")),
                           kubernetes=True, pod_label_allowlist=("team",), rpc_timeout=2.0)
    backend = _Amd(DrmFdinfo(str(proc.root), clock))
    inventory = backend.inventory(None)
    stage = ProcessStage(backend)
    collector = AttributionCollector(opts)
    try:
        watch = collector.pod_watch
        assert watch is not None
        wait_until(lambda: len(watch.pods) == len(PODS), "the pod watch's first list")
        for second in (False, True):
            if second:  # two seconds later, the second read of every client
                clock.now += 2.0
                for pid, (_, bdf, client, vram, _, gfx) in procs.items():
                    proc.open(pid, 5, amdgpu(client, vram, gfx).replace("0000:0c:00.0", bdf))
            ctx = CycleContext(options=opts, now=time.time(), gpus=list(inventory.gpus),
                               static=inventory.static, backend=backend)
            stage.fill(ctx)
            sink = SampleSink()
            collector.collect(ctx, sink)
    finally:
        collector.close()
        server.stop()
        kubelet.stop()

    def family(name: str) -> dict[tuple[str, ...], float]:
        return {labels[1:5]: v for labels, v, _ in sink.samples.get(name, [])}

    alloc = {labels[1:5] + labels[6:9]: v
             for labels, v, _ in sink.samples["gpu_container_allocation"]}
    assert alloc == {
        ("ml", "trainer", "main", GPU_A.uuid, "amd.com/gpu", "exclusive", "1"): 1.0,
        ("team-a", "nb-1", "app", GPU_B.uuid, "amd.com/gpu", "time-slicing", "2"): 1.0,
        ("team-b", "nb-2", "app", GPU_B.uuid, "amd.com/gpu", "time-slicing", "2"): 1.0,
    }
    assert family("gpu_container_memory_used_bytes") == {
        ("ml", "trainer", "main", GPU_A.uuid): 48 * GIB,
        ("team-a", "nb-1", "app", GPU_B.uuid): 16 * GIB,
        ("team-b", "nb-2", "app", GPU_B.uuid): 4 * GIB,
        ("", "", "", GPU_B.uuid): 1024 * 1024,  # the host process: used, held by no pod
    }
    sm = family("gpu_container_sm_utilization_ratio")
    # the trainer's two processes: 0.9 + 0.1 of two seconds; the shared GPU split 0.25 / 0.05
    assert sm == {("ml", "trainer", "main", GPU_A.uuid): pytest.approx(1.0),
                  ("team-a", "nb-1", "app", GPU_B.uuid): pytest.approx(0.25),
                  ("team-b", "nb-2", "app", GPU_B.uuid): pytest.approx(0.05),
                  ("", "", "", GPU_B.uuid): 0.0}
    assert family("gpu_container_processes")[("ml", "trainer", "main", GPU_A.uuid)] == 2
    unresolved = {labels: v for labels, v, _ in
                  sink.samples["gpu_exporter_unresolved_device_ids_total"]}
    assert unresolved == {("amd.com/gpu",): 0.0}
