"""Intel allocations end to end: the AttributionCollector reads PodResources from a real gRPC
server on a unix socket (FakeKubelet) with the Intel GPU plugin's device IDs, resolves cards
through a sysfs tree in the kernel's layout (gpusim/intel_sysfs.py) and the Intel backend.

Device IDs as intel/intel-device-plugins-for-kubernetes registers them (cmd/gpu_plugin/
gpu_plugin.go scan at 94a91bc, after v0.36.0): `<card>-<n>` for n < -shared-dev-num, resource
`gpu.intel.com/<driver>`; a PF with VFs is not registered, its VFs' cards are. KubeVirt's
mediated device plugin hands a virt-launcher pod the mdev UUID under the resource name its CR
chooses (KubeVirt's Intel vGPU guide uses `intel.com/U630`)."""

import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from exporter.attribution.collector import AttributionCollector
from exporter.attribution.deviceids import DeviceIndex, UnknownIds
from exporter.attribution.podresources import Allocation
from exporter.attribution.sources import intel_card, intel_plugin_units, intel_shares
from exporter.core import CycleContext, ExporterOptions, Labels, SampleSink
from exporter.device.backends import Backends
from exporter.device.intel import IntelBackend
from exporter.processes import ProcessStage
from gpu_ledger.sharing import SharingMode
from gpusim.apiserver import FakeApiServer
from gpusim.intel_sysfs import GVT_MDEVS, IntelGpu, flex_host, gvt_host, write_gpu
from gpusim.kubelet import ContainerAllocation, FakeKubelet, PodAllocation
from tests.test_attr_collector import api_pod
from tests.test_fdinfo import ARC, Clock, Proc, xe
from tests.waiting import wait_until

NODE = "node-i"
FLEX_PF = "0000:4d:00.0"  # VFs on: cards 1 and 2 are its VFs
FLEX_SHARED = "0000:9a:00.0"  # card 3, -shared-dev-num 3
IGPU = "0000:00:02.0"
XE = "gpu.intel.com/xe"
MDEV4 = next(u for u, n in GVT_MDEVS.items() if n == 4)  # i915-GVTg_V5_4
MDEV8 = next(u for u, n in GVT_MDEVS.items() if n == 8)  # i915-GVTg_V5_8


def _alloc(ns: str, pod: str, resource: str, *ids: str) -> PodAllocation:
    return PodAllocation(ns, pod, [ContainerAllocation("app", [(resource, list(ids))])])


@pytest.fixture
def sockdir() -> Iterator[Path]:
    path = tempfile.mkdtemp(prefix="gl-intel-", dir="/tmp")
    yield Path(path)
    shutil.rmtree(path, ignore_errors=True)


def flex_node(root: Path) -> None:
    flex_host(str(root), vfs=2)
    write_gpu(str(root), IntelGpu(FLEX_SHARED, 3, "0x56c0", "xe", vram_per_tile=(16 << 30,)))


def run(sockdir: Path, sysfs: Path, pods: list[PodAllocation],
        allocatable: list[tuple[str, str]]) -> tuple[SampleSink, AttributionCollector]:
    kubelet = FakeKubelet(str(sockdir / "kubelet.sock"), lambda: pods, lambda: allocatable)
    kubelet.start()
    opts = ExporterOptions(node=NODE, pod_resources_socket=str(sockdir / "kubelet.sock"),
                           proc_root=str(sockdir / "proc"), sysfs_root=str(sysfs),
                           kubernetes=False, rpc_timeout=2.0)
    backend = IntelBackend(sysfs_root=str(sysfs), proc_root=str(sysfs / "proc"))
    backend.open()
    inv = backend.inventory(None)
    collector = AttributionCollector(opts)
    try:
        ctx = CycleContext(options=opts, now=time.time(), gpus=list(inv.gpus),
                           static=dict(inv.static), backend=Backends([backend]))
        sink = SampleSink()
        collector.collect(ctx, sink)
    finally:
        collector.close()
        kubelet.stop()
    return sink, collector


def family(sink: SampleSink, name: str) -> dict[Labels, float]:
    return {labels: value for labels, value, _ in sink.samples.get(name, [])}


def test_device_plugin_cards_shared_and_vf(sockdir: Path, tmp_path: Path) -> None:
    flex_node(tmp_path)
    allocatable = [(XE, "card1-0"), (XE, "card2-0")] + [(XE, f"card3-{n}") for n in range(3)]
    allocatable += [("gpu.intel.com/xe_monitoring", "all")]
    pods = [_alloc("team-a", "infer-1", XE, "card3-0"),
            _alloc("team-b", "infer-2", XE, "card3-2"),
            _alloc("team-c", "vf-pod", XE, "card1-0"),
            _alloc("ml", "stray", XE, "card9-0"),
            _alloc("ml", "odd", "gpu.intel.com/i915", "GPU-0aa1c2d3"),
            _alloc("ml", "nic", "example.com/nic", "card3-0"),
            # the plugin's monitoring resource opens every GPU to an agent: not a unit
            _alloc("mon", "xpumd", "gpu.intel.com/xe_monitoring", "all")]
    sink, collector = run(sockdir, tmp_path, pods, allocatable)
    alloc = family(sink, "gpu_container_allocation")
    assert alloc == {
        # -shared-dev-num 3: two of the three shares held; each container is one of 3
        (NODE, "team-a", "infer-1", "app", FLEX_SHARED, "", XE, "time-slicing", "3", "", ""): 1,
        (NODE, "team-b", "infer-2", "app", FLEX_SHARED, "", XE, "time-slicing", "3", "", ""): 1,
        # a VF card is a share of its PF: 1 of the 2 VFs enabled
        (NODE, "team-c", "vf-pod", "app", FLEX_PF, "", XE, "vgpu", "1", "", ""): 1,
    }
    assert family(sink, "gpu_container_memory_fraction") == {
        (NODE, "team-c", "vf-pod", "app", FLEX_PF, ""): 0.5}
    reported = {r: n for r, n in collector.unknown_ids.by_resource.items() if n}
    assert reported == {XE: 1, "gpu.intel.com/i915": 1}


def test_unshared_card_is_exclusive(sockdir: Path, tmp_path: Path) -> None:
    flex_node(tmp_path)
    sink, _ = run(sockdir, tmp_path, [_alloc("ml", "train", XE, "card3-0")], [(XE, "card3-0")])
    assert family(sink, "gpu_container_allocation") == {
        (NODE, "ml", "train", "app", FLEX_SHARED, "", XE, "exclusive", "1", "", ""): 1}


def test_gvt_mdevs_held_by_virt_launcher_pods(sockdir: Path, tmp_path: Path) -> None:
    gvt_host(str(tmp_path))
    pods = [_alloc("vms", "virt-launcher-win10-a", "intel.com/U630", MDEV4.upper()),
            _alloc("vms", "virt-launcher-win10-b", "intel.com/U630", MDEV8),
            _alloc("vms", "virt-launcher-gone", "intel.com/U630",
                   "00000000-0000-4000-8000-000000000000")]
    allocatable = [("intel.com/U630", u) for u in GVT_MDEVS]
    sink, collector = run(sockdir, tmp_path, pods, allocatable)
    # each mdev is a vgpu unit of the iGPU, priced as its type's fraction (V5_N: 1/N)
    assert family(sink, "gpu_container_allocation") == {
        (NODE, "vms", "virt-launcher-win10-a", "app", IGPU, "", "intel.com/U630", "vgpu", "2",
         "", ""): 1,
        (NODE, "vms", "virt-launcher-win10-b", "app", IGPU, "", "intel.com/U630", "vgpu", "2",
         "", ""): 1}
    assert family(sink, "gpu_container_memory_fraction") == {
        (NODE, "vms", "virt-launcher-win10-a", "app", IGPU, ""): 0.25,
        (NODE, "vms", "virt-launcher-win10-b", "app", IGPU, ""): 0.125}
    # a resource that is not a GPU resource is not reported when its ID names nothing
    assert collector.unknown_ids.by_resource == {}


@pytest.mark.parametrize(("device_id", "card"), [
    ("card0-0", "card0"), ("card12-7", "card12"), (" card1-0 ", "card1"), ("card0", None),
    ("card-1-0", None), ("renderD128-0", None), ("card٣-0", None), ("card0-0-0", None),
    ("card1234567-0", None), ("", None)])
def test_intel_ids(device_id: str, card: str | None) -> None:
    assert intel_card(device_id) == card


def test_source_alone(tmp_path: Path) -> None:
    flex_node(tmp_path)
    backend = IntelBackend(sysfs_root=str(tmp_path), proc_root=str(tmp_path / "proc"))
    inv = backend.inventory(None)
    index = DeviceIndex(inv.gpus, (), inv.static)
    unknown = UnknownIds()
    allocs = [Allocation("a", "p", "c", XE, ("card3-1", "card3-1"))]
    shares = intel_shares([(XE, "card3-0"), (XE, "card3-1"), ("example.com/x", "card3-2")])
    assert shares == {"card3": 2}
    rows = intel_plugin_units(allocs, {"card3": FLEX_SHARED}, index, shares, {}, unknown)
    assert [(r.device, r.mode) for r in rows] == [((FLEX_SHARED, ""),
                                                   SharingMode.TIME_SLICING)] * 2
    # a card sysfs does not know: reported, not guessed
    rows = intel_plugin_units(allocs, {}, index, shares, {}, unknown)
    assert rows == [] and unknown.by_resource == {XE: 2}



def test_shared_intel_gpu_split_between_pods_by_fdinfo(sockdir: Path, tmp_path: Path) -> None:
    """-shared-dev-num 2 on an xe Flex: two pods hold one share each; their processes' xe
    fdinfo, joined to the pods through cgroups and the pod watch, split the GPU's use."""
    flex_node(tmp_path)
    proc = Proc(tmp_path / "proc")
    pods = [("team-a", "infer-1", "app", "alpha", "40000000-0000-4000-8000-000000000001", "d1"),
            ("team-b", "infer-2", "app", "beta", "40000000-0000-4000-8000-000000000002", "d2")]
    allocations = [_alloc("team-a", "infer-1", XE, "card3-0"),
                   _alloc("team-b", "infer-2", XE, "card3-1")]
    allocatable = [(XE, "card3-0"), (XE, "card3-1")]
    # pid -> (pod index, DRM client id, ccs busy cycles at the second read)
    procs = {201: (0, 1, 2_000_000), 301: (1, 2, 1_000_000)}
    for pid, (i, client, _) in procs.items():
        proc.open(pid, 4, xe(client, rcs=0, ccs=0, stamp=1_000_000).replace(ARC, FLEX_SHARED))
        (proc.root / str(pid) / "cgroup").write_text(
            f"0::/kubepods/burstable/pod{pods[i][4]}/{pods[i][5] * 32}\n")
    def later() -> None:
        for pid, (_, client, ccs) in procs.items():
            proc.open(pid, 4, xe(client, rcs=0, ccs=ccs, stamp=2_000_000)
                      .replace(ARC, FLEX_SHARED))
    sink, _ = _two_cycles(sockdir, tmp_path, proc, pods, allocations, allocatable, later)
    assert family(sink, "gpu_container_allocation") == {
        (NODE, "team-a", "infer-1", "app", FLEX_SHARED, "", XE, "time-slicing", "2", "", ""): 1,
        (NODE, "team-b", "infer-2", "app", FLEX_SHARED, "", XE, "time-slicing", "2", "", ""): 1}
    sm = family(sink, "gpu_container_sm_utilization_ratio")
    # ccs: 2e6 and 1e6 busy cycles of 1e6 x 4 engines
    assert sm == {(NODE, "team-a", "infer-1", "app", FLEX_SHARED, ""): pytest.approx(0.5),
                  (NODE, "team-b", "infer-2", "app", FLEX_SHARED, ""): pytest.approx(0.25)}
    assert family(sink, "gpu_container_memory_used_bytes")[
        (NODE, "team-a", "infer-1", "app", FLEX_SHARED, "")] == 23992 * 1024


def test_a_vf_holders_processes_count_on_its_vf_unit(sockdir: Path, tmp_path: Path) -> None:
    """A container given a VF's card opens the VF: its xe fdinfo's drm-pdev is the VF's
    address (0000:4d:00.1), not the PF's. Its use is the holder of that VF's unit (a vgpu
    unit of the PF, priced as 1/2), not dropped and not another pod's: the other VF's holder
    is idle."""
    flex_node(tmp_path)
    vf1, vf2 = "0000:4d:00.1", "0000:4d:00.2"
    proc = Proc(tmp_path / "proc")
    pods = [("team-c", "vf-pod", "app", "gamma", "40000000-0000-4000-8000-000000000003", "d3"),
            ("team-d", "vf-idle", "app", "delta", "40000000-0000-4000-8000-000000000004", "d4")]
    allocations = [_alloc("team-c", "vf-pod", XE, "card1-0"),
                   _alloc("team-d", "vf-idle", XE, "card2-0")]
    allocatable = [(XE, "card1-0"), (XE, "card2-0")]
    proc.open(401, 4, xe(7, rcs=0, ccs=0, stamp=1_000_000).replace(ARC, vf1))
    (proc.root / "401" / "cgroup").write_text(
        f"0::/kubepods/burstable/pod{pods[0][4]}/{pods[0][5] * 32}\n")
    def later() -> None:  # 3e6 ccs cycles busy of 1e6 x 4 engines
        proc.open(401, 4, xe(7, rcs=0, ccs=3_000_000, stamp=2_000_000).replace(ARC, vf1))
    sink, ctx = _two_cycles(sockdir, tmp_path, proc, pods, allocations, allocatable, later)
    assert vf2 != vf1 and {p.pid: p.uuid for p in ctx.processes} == {401: FLEX_PF}
    assert family(sink, "gpu_container_allocation") == {  # the PF's two VF units
        (NODE, "team-c", "vf-pod", "app", FLEX_PF, "", XE, "vgpu", "2", "", ""): 1,
        (NODE, "team-d", "vf-idle", "app", FLEX_PF, "", XE, "vgpu", "2", "", ""): 1}
    assert family(sink, "gpu_container_memory_fraction") == {
        (NODE, "team-c", "vf-pod", "app", FLEX_PF, ""): 0.5,
        (NODE, "team-d", "vf-idle", "app", FLEX_PF, ""): 0.5}
    assert family(sink, "gpu_container_sm_utilization_ratio") == {
        (NODE, "team-c", "vf-pod", "app", FLEX_PF, ""): pytest.approx(0.75)}
    assert family(sink, "gpu_container_memory_used_bytes") == {
        (NODE, "team-c", "vf-pod", "app", FLEX_PF, ""): 23992 * 1024,
        (NODE, "team-d", "vf-idle", "app", FLEX_PF, ""): 0}
    assert family(sink, "gpu_container_processes") == {
        (NODE, "team-c", "vf-pod", "app", FLEX_PF, ""): 1,
        (NODE, "team-d", "vf-idle", "app", FLEX_PF, ""): 0}


Pod = tuple[str, str, str, str, str, str]


def _two_cycles(sockdir: Path, tmp_path: Path, proc: Proc, pods: list[Pod],
                allocations: list[PodAllocation], allocatable: list[tuple[str, str]],
                later: Callable[[], None]) -> tuple[SampleSink, CycleContext]:
    """The flex node's exporter over a real PodResources server and the pod watch: a first
    cycle (fdinfo baselines), `later()` one second on, and the second cycle's samples."""
    kubelet = FakeKubelet(str(sockdir / "kubelet.sock"), lambda: allocations,
                          lambda: allocatable)
    kubelet.start()
    server = FakeApiServer([api_pod(*p, node=NODE) for p in pods])
    server.start()
    opts = ExporterOptions(node=NODE, pod_resources_socket=str(sockdir / "kubelet.sock"),
                           proc_root=str(proc.root), sysfs_root=str(tmp_path),
                           kubeconfig=server.kubeconfig(str(tmp_path / "kubeconfig")),
                           kubernetes=True, pod_label_allowlist=("team",), rpc_timeout=2.0)
    clock = Clock()
    backends = Backends([IntelBackend(str(tmp_path), str(proc.root), clock=clock)])
    inv = backends.members[0].inventory(None)
    stage = ProcessStage(backends)
    collector = AttributionCollector(opts)
    try:
        watch = collector.pod_watch
        assert watch is not None
        wait_until(lambda: len(watch.pods) == len(pods), "the pod watch's first list")
        for second in (False, True):
            if second:
                clock.now += 1.0
                later()
            ctx = CycleContext(options=opts, now=time.time(), gpus=list(inv.gpus),
                               static=dict(inv.static), backend=backends)
            stage.fill(ctx)
            sink = SampleSink()
            collector.collect(ctx, sink)
    finally:
        collector.close()
        server.stop()
        kubelet.stop()
    return sink, ctx
