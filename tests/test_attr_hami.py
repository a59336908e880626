"""HAMi as HAMi writes it, and hostile pod values that must cost only their own pod.

Encodings come from Project-HAMi/HAMi: `EncodePodSingleDevice` writes one `;`-ended group per
container (`<uuid>,NVIDIA,<MiB>,<core %>:` per device); up to v2.8.x the groups follow
`spec.containers`, since v2.9.0 (#1650) `spec.initContainers` come first (the strings below
are the ones HAMi's own `GetNextDeviceRequest` tests use, with real UUIDs). HAMi's device
plugin registers each GPU as `GPU-<uuid>-<n>`, 10 per GPU with its chart's deviceSplitCount.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from exporter.attribution.collector import AttributionCollector
from exporter.attribution.deviceids import DeviceIndex, DeviceRef
from exporter.attribution.fractional import FractionalGrant, ParsedGrants, parse_grants
from exporter.attribution.strict import ascii_uint
from exporter.core import CycleContext, ExporterOptions, GpuRef, Labels, SampleSink, SourceStatus
from exporter.device.nvml import NvmlBackend
from gpusim.apiserver import FakeApiServer
from gpusim.kubelet import ClaimAllocation, ContainerAllocation, FakeKubelet, PodAllocation
from tests.waiting import wait_until

HAMI = "hami.io/vgpu-devices-allocated"
MEM = "nvidia.com/gpumem"
U0, U1 = "GPU-8dcd427f-483b-b48f-d7e5-75fb19a52b76", "GPU-ebe7c3f7-303d-558d-435e-99a160631fe4"
MiB = 1 << 20


# --- the annotation, every released encoding -------------------------------------------------

def test_before_v2_9_groups_follow_the_containers_only() -> None:
    """Up to v2.8.x an init container has no group: 2 groups for 2 containers."""
    parsed = parse_grants({HAMI: f"{U0},NVIDIA,2048,0:;;"}, ("main", "sidecar"), ("init",))
    assert parsed == ParsedGrants((FractionalGrant("main", U0, MEM, memory_bytes=2048 * MiB),))


def test_v2_4_placeholder_for_a_container_without_a_device() -> None:
    """v2.4.x-v2.5.x `calcScore` gives a later container without a device `,,0,0:`."""
    parsed = parse_grants({HAMI: f"{U0},NVIDIA,3000,30:;,,0,0:;"}, ("main", "sidecar"))
    assert parsed == ParsedGrants((FractionalGrant("main", U0, MEM, memory_bytes=3000 * MiB,
                                                   core_fraction=0.3),))


def test_since_v2_9_init_containers_come_first() -> None:
    # HAMi's TestGetNextDeviceRequest_DeviceInRegularContainerWithInitOffset
    parsed = parse_grants({HAMI: f";;{U0},NVIDIA,2000,50:;"}, ("main-with-gpu",),
                          ("init1-no-gpu", "init2-no-gpu"))
    assert parsed == ParsedGrants((FractionalGrant("main-with-gpu", U0, MEM,
                                                   memory_bytes=2000 * MiB, core_fraction=0.5),))
    # TestGetNextDeviceRequest_DeviceInInitContainer: the init container holds the GPU
    parsed = parse_grants({HAMI: f"{U0},NVIDIA,500,10:;;"}, ("main-no-gpu",), ("init-with-gpu",))
    assert parsed.grants == (FractionalGrant("init-with-gpu", U0, MEM, memory_bytes=500 * MiB,
                                             core_fraction=0.1),)


def test_one_init_container_and_two_gpu_containers_each_get_their_own() -> None:
    """The issue's silently wrong bill: `b` was given `a`'s grant and `a` nothing."""
    parsed = parse_grants({HAMI: f";{U0},NVIDIA,1000,0:;{U1},NVIDIA,4096,25:;"}, ("a", "b"),
                          ("init",))
    assert parsed == ParsedGrants((
        FractionalGrant("a", U0, MEM, memory_bytes=1000 * MiB),
        FractionalGrant("b", U1, MEM, memory_bytes=4096 * MiB, core_fraction=0.25)))


def test_several_gpus_per_container_and_mig_templates() -> None:
    parsed = parse_grants({HAMI: f"{U0},NVIDIA,1000,10:{U1}[2-0],NVIDIA,10240,0:;"}, ("main",))
    assert parsed.grants == (
        FractionalGrant("main", U0, MEM, memory_bytes=1000 * MiB, core_fraction=0.1),
        FractionalGrant("main", U1, MEM, memory_bytes=10240 * MiB))  # MIG mode: its GPU


@pytest.mark.parametrize("value", [
    f"{U0},NVIDIA,²,0:;",  # str.isdigit() says yes, int() says no
    f"{U0},NVIDIA,{'9' * 310},0:;",  # over float range once in bytes
    f"{U0},NVIDIA,2147483648,0:;",  # past HAMi's int32
    f"{U0},NVIDIA,-1,0:;",
    f"{U0},NVIDIA,NaN,0:;",
    f"{U0},NVIDIA,1024,NaN:;",
    f"{U0},NVIDIA,1024,101:;",
    f"{U0},NVIDIA,١٠٢٤,0:;",  # Arabic-Indic digits: int() would take them
    f"{U0},NVIDIA, 1024,0:;",
    f"{U0},NVIDIA,1024,0:;" * 10_000,  # 10,000 groups for one container
    f"{U0},NVIDIA,1024,0:{U0};",  # one good device, one malformed: the pod gets nothing
    f"{U0} x,NVIDIA,1024,0:;",
])
def test_hostile_values_give_one_error_and_no_grant(value: str) -> None:
    parsed = parse_grants({HAMI: value}, ("main",))
    assert parsed.grants == ()
    assert len(parsed.errors) == 1 and len(parsed.errors[0]) < 300


@pytest.mark.parametrize("bad", [None, 7, "²", "NaN", "-1", "1e3", "9" * 310, "", " 4"])
def test_gpushare_values_are_strict(bad: object) -> None:
    annotations = {"ALIYUN_COM_GPU_MEM_IDX": "0", "ALIYUN_COM_GPU_MEM_POD": bad,
                   "ALIYUN_COM_GPU_MEM_DEV": "16"}
    parsed = parse_grants(annotations, ("main",))
    assert parsed.grants == () and len(parsed.errors) == 1


def test_ascii_uint() -> None:
    assert [ascii_uint(t, 100) for t in ("0", "7", "100", "007")] == [0, 7, 100, 7]
    assert all(ascii_uint(t, 100) is None
               for t in ("101", "1000", "²", "٣", "+3", "-3", " 3", "3 ", "", "3.0", None, 3))


# --- HAMi's kubelet device IDs -----------------------------------------------------------------

def test_hami_slots_resolve_to_their_gpu_as_slots() -> None:
    index = DeviceIndex([GpuRef(0, U0, "NVIDIA L4", False, None)], [])
    assert index.resolve(f"{U0}-0") == DeviceRef(U0, "", False, slot=True)
    assert index.resolve(f"{U0}-9") == DeviceRef(U0, "", False, slot=True)
    assert index.resolve(U0) == DeviceRef(U0, "", False)
    assert index.resolve(f"{U1}-0") is None  # not this node's GPU
    assert index.resolve(f"{U0}-{'9' * 5000}") is None  # no int() of 5,000 digits
    assert index.resolve("nvidia" + "9" * 5000) is None
    assert index.resolve("٣") is None


# --- a node: HAMi pods of every encoding, and hostile pods that must not change them -----------

NODE = "node-a"


def _pod(name: str, uid: int, containers: tuple[str, ...], init: tuple[str, ...] = (),
         annotations: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ml", "uid": f"40000000-0000-4000-8000-{uid:012d}",
                     "labels": {"team": f"team-{name}"}, "annotations": annotations or {}},
        "spec": {"nodeName": NODE, "containers": [{"name": c} for c in containers],
                 "initContainers": [{"name": c} for c in init]},
        "status": {"phase": "Running"},
    }


def _good_pods(u0: str, u1: str) -> list[dict[str, Any]]:
    return [
        _pod("v28", 1, ("main", "sidecar"), ("init",), {HAMI: f"{u0},NVIDIA,2048,0:;;"}),
        _pod("v29", 2, ("a", "b"), ("init",),
             {HAMI: f";{u0},NVIDIA,1024,0:;{u1},NVIDIA,4096,25:;"}),
        _pod("v29-offset", 3, ("main",), ("i1", "i2"), {HAMI: f";;{u0},NVIDIA,2000,50:;"}),
        _pod("multi", 4, ("main",), (), {HAMI: f"{u0},NVIDIA,1000,10:{u1},NVIDIA,1000,10:;"}),
    ]


def _hostile_pods(u0: str) -> list[dict[str, Any]]:
    bad = [f"{u0},NVIDIA,²,0:;", f"{u0},NVIDIA,{'9' * 310},0:;", f"{u0},NVIDIA,1024,0:;" * 10_000,
           f"{u0},NVIDIA,-1,0:;", f"{u0},NVIDIA,NaN,0:;"]
    pods = [_pod(f"bad-{i}", 100 + i, ("main",), (), {HAMI: v}) for i, v in enumerate(bad)]
    pods.append(_pod("bad-share", 200, ("main",), (), {
        "ALIYUN_COM_GPU_MEM_IDX": "0", "ALIYUN_COM_GPU_MEM_POD": "NaN",
        "ALIYUN_COM_GPU_MEM_DEV": "24"}))
    return pods


def _podresources(u0: str, u1: str) -> list[PodAllocation]:
    """What the kubelet lists for the good pods: HAMi's slots, picked without HAMi's say."""
    def slots(*ids: str) -> list[tuple[str, list[str]]]:
        return [("nvidia.com/gpu", list(ids))]
    return [
        PodAllocation("ml", "v28", [ContainerAllocation("main", slots(f"{u1}-3"))]),
        PodAllocation("ml", "v29", [ContainerAllocation("a", slots(f"{u0}-0")),
                                    ContainerAllocation("b", slots(f"{u1}-0"))]),
        PodAllocation("ml", "v29-offset", [ContainerAllocation("main", slots(f"{u0}-7"))]),
        PodAllocation("ml", "multi", [ContainerAllocation("main", slots(f"{u0}-1", f"{u1}-1"))]),
    ]


@pytest.fixture
def sockdir() -> Iterator[Path]:
    path = tempfile.mkdtemp(prefix="gl-hami-", dir="/tmp")
    yield Path(path)
    shutil.rmtree(path, ignore_errors=True)


def _family(sink: SampleSink, name: str) -> dict[Labels, float]:
    return {labels: value for labels, value, _ in sink.samples.get(name, [])}


def _run_node(sockdir: Path, tmp_path: Path, hostile: bool) -> tuple[SampleSink, float]:
    """Two cycles of a node with two 24 GiB L4s: the second cycle's samples, and the count of
    unresolved device IDs."""
    from gpusim.nvml import SimNVML
    from gpusim.scenario import loads_scenario

    l4 = "  - model: NVIDIA L4\n    memory: 24GiB\n    power_limit_watts: 72\n"
    nvml = SimNVML(loads_scenario(f"node: {NODE}\ngpus:\n{l4}{l4}", "t.yaml"))
    nvml.nvmlInit()
    backend = NvmlBackend(nvml.as_api())
    inventory = backend.inventory(None)  # the GPUs' memory (HAMi MiB grants) comes from here
    u0, u1 = (g.uuid for g in inventory.gpus)
    pods = _good_pods(u0, u1) + (_hostile_pods(u0) if hostile else [])
    allocatable = [("nvidia.com/gpu", f"{u}-{n}") for u in (u0, u1) for n in range(10)]
    kubelet = FakeKubelet(str(sockdir / "kubelet.sock"), lambda: _podresources(u0, u1),
                          lambda: allocatable)
    kubelet.start()
    server = FakeApiServer(pods)
    server.start()
    opts = ExporterOptions(node=NODE, pod_resources_socket=str(sockdir / "kubelet.sock"),
                           proc_root=str(tmp_path / "proc"),
                           kubeconfig=server.kubeconfig(str(tmp_path / "kubeconfig")),
                           kubernetes=True, pod_label_allowlist=("team",), rpc_timeout=2.0)
    collector = AttributionCollector(opts)
    try:
        watch = collector.pod_watch
        assert watch is not None
        # a pod parser that raised would fail every list (and every relist after a 410)
        wait_until(lambda: len(watch.pods) == len(pods), "the pod watch's first list")
        for _ in range(2):
            sink = SampleSink()
            collector.collect(CycleContext(options=opts, now=time.time(),
                                           gpus=list(inventory.gpus), static=inventory.static,
                                           backend=backend), sink)
    finally:
        collector.close()
        server.stop()
        kubelet.stop()
    return sink, collector.unknown_ids.total


ATTRIBUTION = ("gpu_container_allocation", "gpu_container_memory_fraction",
               "gpu_container_core_fraction", "gpu_container_memory_used_bytes",
               "gpu_container_sm_utilization_ratio", "gpu_container_processes")


def test_hami_node_is_attributed_and_hostile_pods_cost_only_themselves(
        sockdir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    clean, unresolved = _run_node(sockdir, tmp_path, hostile=False)
    alloc = {k[1:9]: v for k, v in _family(clean, "gpu_container_allocation").items()}
    u0 = next(k[3] for k in alloc if k[1] == "v29-offset")
    u1 = next(k[3] for k in alloc if k[1] == "v29" and k[2] == "b")
    assert alloc == {  # four fractional holders on GPU 0, two on GPU 1
        ("ml", "v28", "main", u0, "", MEM, "fractional", "4"): 1.0,
        ("ml", "v29", "a", u0, "", MEM, "fractional", "4"): 1.0,
        ("ml", "v29", "b", u1, "", MEM, "fractional", "2"): 1.0,
        ("ml", "v29-offset", "main", u0, "", MEM, "fractional", "4"): 1.0,
        ("ml", "multi", "main", u0, "", MEM, "fractional", "4"): 1.0,
        ("ml", "multi", "main", u1, "", MEM, "fractional", "2"): 1.0,
    }
    mem = {k[1:5]: v for k, v in _family(clean, "gpu_container_memory_fraction").items()}
    assert mem == {("ml", "v28", "main", u0): 2048 / 24576, ("ml", "v29", "a", u0): 1024 / 24576,
                   ("ml", "v29", "b", u1): 4096 / 24576,
                   ("ml", "v29-offset", "main", u0): 2000 / 24576,
                   ("ml", "multi", "main", u0): 1000 / 24576,
                   ("ml", "multi", "main", u1): 1000 / 24576}
    cores = {k[1:5]: v for k, v in _family(clean, "gpu_container_core_fraction").items()}
    assert cores == {("ml", "v29", "b", u1): 0.25, ("ml", "v29-offset", "main", u0): 0.5,
                     ("ml", "multi", "main", u0): 0.1, ("ml", "multi", "main", u1): 0.1}
    # HAMi's kubelet slots are recognised, never unresolved: GpuAttributionIncomplete stays quiet
    assert unresolved == 0
    assert _family(clean, "gpu_exporter_unresolved_device_ids_total") == {
        ("nvidia.com/gpu",): 0.0}
    assert _family(clean, "gpu_exporter_fractional_errors_total") == {(): 0.0}

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="exporter.attribution.collector"):
        hostile, unresolved = _run_node(sockdir, tmp_path, hostile=True)
    for name in ATTRIBUTION:  # every other pod keeps its exact series
        assert _family(hostile, name) == _family(clean, name), name
    assert unresolved == 0
    # each bad pod counted and logged once over two cycles; 10,000 groups: once
    assert _family(hostile, "gpu_exporter_fractional_errors_total") == {(): 6.0}
    lines = [r.getMessage() for r in caplog.records if "fractional GPU grant" in r.getMessage()]
    assert len(lines) == 6 and all(len(line) < 500 for line in lines)


# --- DRA before the first ResourceSlice list -----------------------------------------------------

class _StartingWatch:
    """A ResourceSlice watch that has not listed yet, and lists when told to."""

    def __init__(self) -> None:
        self.lists = 0
        self.status = SourceStatus(False, "starting")
        self.items: dict[str, Any] = {}

    def listed(self) -> None:
        self.lists, self.status = 1, SourceStatus(True)

    def close(self) -> None:
        pass


def _dra_cycle(sockdir: Path, tmp_path: Path, watch: _StartingWatch) -> int:
    """One cycle of a node whose container holds a DRA MIG device no fallback can resolve;
    the unresolved count after it."""
    pods = [PodAllocation("ml", "p", [ContainerAllocation("c", [], [ClaimAllocation(
        "ml", "claim", [("gpu.nvidia.com", NODE, "gpu-0-mig-9-0-1")])])])]
    kubelet = FakeKubelet(str(sockdir / "kubelet.sock"), lambda: pods, lambda: [])
    kubelet.start()
    server = FakeApiServer([])
    server.start()
    opts = ExporterOptions(node=NODE, pod_resources_socket=str(sockdir / "kubelet.sock"),
                           proc_root=str(tmp_path / "proc"),
                           kubeconfig=server.kubeconfig(str(tmp_path / "kubeconfig")),
                           kubernetes=True, rpc_timeout=2.0)
    collector = AttributionCollector(opts)
    assert collector._slices is not None
    collector._slices.close()
    collector._slices = watch  # type: ignore[assignment]
    try:
        collector.collect(CycleContext(options=opts, now=time.time(),
                                       gpus=[GpuRef(0, U0, "NVIDIA A100", True, None)]),
                          SampleSink())
    finally:
        collector.close()
        server.stop()
        kubelet.stop()
    return collector.unknown_ids.total


def test_first_cycle_waits_for_the_slice_list(sockdir: Path, tmp_path: Path) -> None:
    watch = _StartingWatch()
    timer = threading.Timer(0.3, watch.listed)
    timer.start()
    unresolved = _dra_cycle(sockdir, tmp_path, watch)
    timer.join()
    # the cycle waited for the list, then looked the device up in it: a real miss, counted
    assert unresolved == 1


def test_no_slice_list_yet_is_not_unresolved(sockdir: Path, tmp_path: Path) -> None:
    # the wait is bounded, and what it could not see is not counted
    assert _dra_cycle(sockdir, tmp_path, _StartingWatch()) == 0


def test_a_failing_source_or_parser_costs_only_its_own_rows(
        sockdir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """Defence in depth: should a source or the annotation parser ever raise, the cycle and
    the pod list go on; the vGPU source (no vGPU here) failing changes no series, a parser
    failing on one pod costs that pod alone."""
    import exporter.attribution.collector as collector_module
    import exporter.attribution.podwatch as podwatch_module
    from exporter.attribution.fractional import parse_grants as real_parse

    clean, _ = _run_node(sockdir, tmp_path, hostile=False)

    def broken_source(*_: object) -> list[Any]:
        raise RuntimeError("boom")

    def parse_or_raise(annotations: dict[str, Any], *args: Any) -> ParsedGrants:
        if "2000,50" in str(annotations.get(HAMI)):  # the v29-offset pod
            raise RuntimeError("boom")
        return real_parse(annotations, *args)

    monkeypatch.setattr(collector_module, "vgpu_units", broken_source)
    monkeypatch.setattr(podwatch_module, "parse_grants", parse_or_raise)
    with caplog.at_level(logging.WARNING, logger="exporter.attribution.collector"):
        broken, _ = _run_node(sockdir, tmp_path, hostile=False)
    want = {k: v for k, v in _family(clean, "gpu_container_memory_fraction").items()
            if k[2] != "v29-offset"}
    assert _family(broken, "gpu_container_memory_fraction") == want
    assert _family(broken, "gpu_exporter_fractional_errors_total") == {(): 1.0}
    assert sum("source vgpu failed" in r.getMessage() for r in caplog.records) == 1


def test_hostile_pods_never_fail_a_list_or_a_relist(tmp_path: Path) -> None:
    """The issue's `²` made every pod list raise, so after a 410 the watch never listed again.
    Here the pod watch lists the hostile pods, relists them after a 410, and sees changes."""
    from exporter.attribution.podwatch import PodWatch

    pods = _good_pods(U0, U1) + _hostile_pods(U0)
    server = FakeApiServer(pods)
    server.start()
    watch = PodWatch(ExporterOptions(node=NODE, kubeconfig=server.kubeconfig(
        str(tmp_path / "kubeconfig")))).start()
    try:
        wait_until(lambda: len(watch.pods) == len(pods), "the first list")
        server.expire()  # the next watch gets 410 Gone: a relist
        server.add_pod(_pod("late", 300, ("main",)))
        wait_until(lambda: watch.lists >= 2 and len(watch.pods) == len(pods) + 1,
                   "the relist after a 410")
    finally:
        watch.close()
        server.stop()
    bad = {p.name for p in watch.pods.values() if p.grants.errors}
    assert bad == {"bad-0", "bad-1", "bad-2", "bad-3", "bad-4", "bad-share"}
