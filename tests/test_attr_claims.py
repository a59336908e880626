"""A shared DRA device is an MPS share when its ResourceClaim's config says so: the claim's
opaque config read as the NVIDIA DRA driver reads it (claim_config), and the attribution
collector end to end with a real gRPC PodResources server on a unix socket serving
dynamic_resources and an HTTP server speaking the Kubernetes API serving ResourceSlices and
ResourceClaims (or refusing them)."""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from exporter.attribution.collector import AttributionCollector
from exporter.attribution.dra import SliceKey
from exporter.attribution.resourceclaims import ClaimReader, claim_config
from exporter.core import CycleContext, ExporterOptions, GpuRef, MigRef, SampleSink
from exporter.kube.client import connector
from gpusim.apiserver import FakeApiServer
from gpusim.kubelet import ClaimAllocation, ContainerAllocation, FakeKubelet, PodAllocation
from tests.waiting import wait_until

NODE = "node-a"
DRA = "gpu.nvidia.com"
GPU0 = "GPU-00000000-0000-4000-8000-000000000000"
GPU1 = "GPU-11111111-1111-4111-8111-111111111111"  # MIG enabled
MIG_A = "MIG-aaaaaaaa-aaaa-4aaa-8aaa-aaaaaaaaaaaa"
MIG_B = "MIG-bbbbbbbb-bbbb-4bbb-8bbb-bbbbbbbbbbbb"
GPU2 = "GPU-22222222-2222-4222-8222-222222222222"
GPU3 = "GPU-33333333-3333-4333-8333-333333333333"
G1 = GpuRef(1, GPU1, "NVIDIA H100 80GB HBM3", True, None)
GPUS = [GpuRef(0, GPU0, "NVIDIA H100 80GB HBM3", False, None), G1,
        GpuRef(2, GPU2, "NVIDIA L4", False, None), GpuRef(3, GPU3, "NVIDIA L4", False, None)]
MIGS = [MigRef(G1, MIG_A, 1, 0, "3g.40gb", 3, 7, None, slot=0),
        MigRef(G1, MIG_B, 2, 0, "3g.40gb", 3, 7, None, slot=1)]
# device names as the driver's ResourceSlice lists them
DEVICES = {"gpu-0": GPU0, "gpu-1-mig-9-0-4": MIG_A, "gpu-1-mig-9-4-4": MIG_B, "gpu-2": GPU2,
           "gpu-3": GPU3}
SLICE = {"metadata": {"name": "node-a-gpus", "uid": "uid-slice"},
         "spec": {"driver": DRA, "nodeName": NODE, "pool": {"name": NODE},
                  "devices": [{"name": n, "attributes": {"uuid": {"string": u}}}
                              for n, u in DEVICES.items()]}}
NS = "dra"


def opaque(kind: str, strategy: str | None, requests: list[str] | None = None,
           source: str | None = None, driver: str = DRA) -> dict[str, Any]:
    """A device config entry of the driver: `{requests, opaque: {driver, parameters}}`."""
    params: dict[str, Any] = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": kind}
    if strategy is not None:
        params["sharing"] = {"strategy": strategy}
        if strategy == "MPS":
            params["sharing"]["mpsConfig"] = {"defaultActiveThreadPercentage": 50}
    entry: dict[str, Any] = {"opaque": {"driver": driver, "parameters": params}}
    if requests is not None:
        entry["requests"] = requests
    if source is not None:
        entry["source"] = source
    return entry


def claim(name: str, devices: dict[str, str], spec_config: list[dict[str, Any]],
          class_config: list[dict[str, Any]] | None = None,
          allocated: bool = True) -> dict[str, Any]:
    """A ResourceClaim: `devices` maps each allocated device name to its request; allocated,
    the status holds the class's config (FromClass) and then the claim's own (FromClaim)."""
    obj: dict[str, Any] = {
        "metadata": {"namespace": NS, "name": name, "uid": f"uid-{name}"},
        "spec": {"devices": {"requests": [{"name": r, "exactly": {"deviceClassName": DRA}}
                                          for r in sorted(set(devices.values()))],
                             "config": spec_config}}}
    if allocated:
        status_config = [{**c, "source": "FromClass"} for c in class_config or []] \
            + [{**c, "source": "FromClaim"} for c in spec_config]
        obj["status"] = {"allocation": {"devices": {
            "results": [{"request": r, "driver": DRA, "pool": NODE, "device": d}
                        for d, r in devices.items()],
            "config": status_config}}}
    return obj


# --- what the driver would apply, from the claim's JSON --------------------------------------

def dev(name: str) -> SliceKey:
    return SliceKey(DRA, NODE, name)


def test_config_applies_by_request_kind_and_precedence() -> None:
    c = claim_config(claim("x", {"gpu-0": "a", "gpu-2": "b/fast", "gpu-1-mig-9-0-4": "m"}, [
        opaque("GpuConfig", "MPS", ["a"]),
        opaque("GpuConfig", "TimeSlicing", ["b"]),  # a main request covers its subrequests
        opaque("GpuConfig", "MPS", ["m"]),  # a GpuConfig never applies to a MIG device
    ], class_config=[opaque("MigDeviceConfig", "MPS")]))
    assert c.uid == "uid-x"
    assert c.is_mps(dev("gpu-0"), mig=False)
    assert not c.is_mps(dev("gpu-2"), mig=False)
    assert c.is_mps(dev("gpu-1-mig-9-0-4"), mig=True)  # the class's MigDeviceConfig
    assert not c.is_mps(SliceKey("other.example.com", NODE, "gpu-0"), mig=False)


def test_claim_config_wins_over_class_config_and_later_over_earlier() -> None:
    # The API may list them in any order: class config first, then the claim's, last wins.
    raw = claim("x", {"gpu-0": "a"}, [opaque("GpuConfig", "TimeSlicing")],
                class_config=[opaque("GpuConfig", "MPS")])
    raw["status"]["allocation"]["devices"]["config"].reverse()
    assert not claim_config(raw).is_mps(dev("gpu-0"), mig=False)
    c = claim_config(claim("y", {"gpu-0": "a"}, [opaque("GpuConfig", "TimeSlicing"),
                                                 opaque("GpuConfig", "MPS", ["a"])]))
    assert c.is_mps(dev("gpu-0"), mig=False)
    # a scoped entry for another request does not apply; the unscoped one does
    c = claim_config(claim("z", {"gpu-0": "a"}, [opaque("GpuConfig", "MPS"),
                                                 opaque("GpuConfig", "TimeSlicing", ["b"])]))
    assert c.is_mps(dev("gpu-0"), mig=False)


def test_status_is_read_before_spec_and_spec_without_an_allocation() -> None:
    # Allocated: the status is what the driver applies, whatever the spec says now.
    raw = claim("x", {"gpu-0": "a"}, [opaque("GpuConfig", "MPS")])
    raw["status"]["allocation"]["devices"]["config"] = []
    assert not claim_config(raw).is_mps(dev("gpu-0"), mig=False)
    # Not allocated: the spec's entries, scoped ones too (no result names the request).
    raw = claim("y", {"gpu-0": "a"}, [opaque("GpuConfig", "MPS", ["a"])], allocated=False)
    assert claim_config(raw).is_mps(dev("gpu-0"), mig=False)


@pytest.mark.parametrize("raw", [
    {}, {"status": "x"}, {"status": {"allocation": {"devices": {"config": "x", "results": [1]}}}},
    {"spec": {"devices": {"config": [{"opaque": None}, {"opaque": {"parameters": []}},
                                     {"structured": {}}, 7]}}},
])
def test_malformed_claims_read_as_no_sharing_config(raw: dict[str, Any]) -> None:
    assert not claim_config(raw).is_mps(dev("gpu-0"), mig=False)


# --- end to end: PodResources, ResourceSlices, ResourceClaims -------------------------------

def holding(pod: str, claim_name: str, *devices: str) -> PodAllocation:
    return PodAllocation(NS, pod, [ContainerAllocation("main", claims=[
        ClaimAllocation(NS, claim_name, [(DRA, NODE, d) for d in devices])])])


ALLOCATIONS = [
    holding("a1", "mps", "gpu-0"), holding("a2", "mps", "gpu-0"),  # MPS in the claim
    holding("b1", "ts", "gpu-3"), holding("b2", "ts", "gpu-3"),  # TimeSlicing in the claim
    holding("c1", "class-mps", "gpu-1-mig-9-0-4"),  # MPS from the device class, a MIG device
    holding("c2", "class-mps", "gpu-1-mig-9-0-4"),
    holding("d1", "solo-mps", "gpu-2"),  # one holder: exclusive whatever the config says
    holding("e1", "gone", "gpu-1-mig-9-4-4"), holding("e2", "gone", "gpu-1-mig-9-4-4"),  # 404
]
CLAIMS = [
    claim("mps", {"gpu-0": "gpu"}, [opaque("GpuConfig", "MPS", ["gpu"])]),
    claim("ts", {"gpu-3": "gpu"}, [opaque("GpuConfig", "TimeSlicing", ["gpu"])]),
    claim("class-mps", {"gpu-1-mig-9-0-4": "mig"}, [],
          class_config=[opaque("MigDeviceConfig", "MPS")]),
    claim("solo-mps", {"gpu-2": "gpu"}, [opaque("GpuConfig", "MPS")]),
]
ALL_SHARED = {
    ("a1", GPU0, ""), ("a2", GPU0, ""), ("b1", GPU3, ""), ("b2", GPU3, ""),
    ("c1", GPU1, MIG_A), ("c2", GPU1, MIG_A), ("e1", GPU1, MIG_B), ("e2", GPU1, MIG_B)}


@pytest.fixture
def sockdir() -> Iterator[Path]:
    path = tempfile.mkdtemp(prefix="gl-claims-", dir="/tmp")  # unix socket paths are short
    yield Path(path)
    shutil.rmtree(path, ignore_errors=True)


class Node:
    """A kubelet serving `allocations` (changeable) and an API server with the slice and
    `claims`; `attach()` builds a collector against them."""

    def __init__(self, sockdir: Path, claims: list[dict[str, Any]]) -> None:
        self.allocations = list(ALLOCATIONS)
        self.kubelet = FakeKubelet(str(sockdir / "kubelet.sock"), lambda: self.allocations,
                                   lambda: []).start()
        self.api = FakeApiServer([], slices=[SLICE], claims=claims).start()
        self.kubeconfig = self.api.kubeconfig(str(sockdir / "kubeconfig"))
        self.sockdir = sockdir

    def options(self, **kw: Any) -> ExporterOptions:
        return ExporterOptions(node=NODE, pod_resources_socket=str(self.sockdir / "kubelet.sock"),
                               proc_root=str(self.sockdir / "proc"), kubeconfig=self.kubeconfig,
                               rpc_timeout=2.0, **kw)

    def attach(self, opts: ExporterOptions, reader: ClaimReader | None = None
               ) -> AttributionCollector:
        collector = AttributionCollector(opts, claim_reader=reader)
        slices = collector.slice_watch
        assert slices is not None
        wait_until(lambda: slices.status.up, "the ResourceSlice watch's first list")
        return collector

    def close(self) -> None:
        self.api.stop()
        self.kubelet.stop()


@pytest.fixture
def node(sockdir: Path) -> Iterator[Node]:
    n = Node(sockdir, CLAIMS)
    yield n
    n.close()


def cycle(collector: AttributionCollector, opts: ExporterOptions) -> SampleSink:
    ctx = CycleContext(options=opts, now=time.time(), gpus=list(GPUS),
                       migs=list(MIGS), processes=[])
    sink = SampleSink()
    collector.collect(ctx, sink)
    return sink


def settled(collector: AttributionCollector, opts: ExporterOptions) -> SampleSink:
    """A cycle after the reader answered every claim the one before asked for: a cycle waits
    only briefly for a claim it sees first, and a loaded test machine may take longer."""
    cycle(collector, opts)
    reader = collector.claim_reader
    assert reader is not None
    wait_until(lambda: not reader.pending, "answers for the claims wanted")
    return cycle(collector, opts)


def modes(sink: SampleSink) -> dict[tuple[str, str, str], tuple[str, str]]:
    """(pod, uuid, mig_uuid) -> (sharing, replicas) of each DRA allocation."""
    out = {}
    for labels, value, _ in sink.samples["gpu_container_allocation"]:
        _, _, pod, _, uuid, mig, resource, sharing, replicas = labels[:9]
        assert (resource, value) == (DRA, 1.0)
        out[(pod, uuid, mig)] = (str(sharing), replicas)
    return out


def unreadable(sink: SampleSink) -> float:
    ((labels, value, _),) = sink.samples["gpu_exporter_dra_claims_unreadable"]
    assert labels == ()
    return value


def claim_gets(api: FakeApiServer) -> list[str]:
    return [r for r in api.requests if "resourceclaims" in r]


def test_shared_claims_take_their_sharing_from_the_claim(node: Node) -> None:
    """MPS in the claim's config (or its device class's) makes every holder an MPS share;
    TimeSlicing, no config, or a claim that cannot be read (404) leave time-slicing. Only
    shared claims are read, each with one GET and no list or watch."""
    opts = node.options()
    collector = node.attach(opts)
    try:
        sink = settled(collector, opts)
        again = cycle(collector, opts)
    finally:
        collector.close()
    assert modes(sink) == {
        ("a1", GPU0, ""): ("mps", "2"), ("a2", GPU0, ""): ("mps", "2"),
        ("b1", GPU3, ""): ("time-slicing", "2"), ("b2", GPU3, ""): ("time-slicing", "2"),
        ("c1", GPU1, MIG_A): ("mps", "2"), ("c2", GPU1, MIG_A): ("mps", "2"),
        ("d1", GPU2, ""): ("exclusive", "1"),
        ("e1", GPU1, MIG_B): ("time-slicing", "2"), ("e2", GPU1, MIG_B): ("time-slicing", "2"),
    }
    assert modes(again) == modes(sink)
    assert unreadable(sink) == unreadable(again) == 1.0  # `gone`
    base = "/apis/resource.k8s.io/v1/namespaces/dra/resourceclaims/"
    assert sorted(claim_gets(node.api)) == [base + n for n in ("class-mps", "gone", "mps", "ts")]


def test_unreadable_claims_are_time_slicing_counted_and_logged_once(
        node: Node, caplog: pytest.LogCaptureFixture) -> None:
    """A service account without `get` on resourceclaims: every shared claim is forbidden,
    split as time-slicing and counted; one warning line for the problem, no traceback."""
    node.api.forbidden = {"resourceclaims"}
    opts = node.options()
    collector = node.attach(opts)
    try:
        with caplog.at_level(logging.DEBUG, logger="exporter.attribution.resourceclaims"):
            sink = settled(collector, opts)
    finally:
        collector.close()
    got = modes(sink)
    assert {k for k, (mode, _) in got.items() if mode == "time-slicing"} == ALL_SHARED
    assert got[("d1", GPU2, "")] == ("exclusive", "1")
    assert unreadable(sink) == 4.0
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "forbidden" in warnings[0].getMessage()
    assert "\n" not in warnings[0].getMessage()
    assert all(r.exc_info is None for r in caplog.records)


def test_api_down_is_time_slicing_and_counted(sockdir: Path) -> None:
    n = Node(sockdir, CLAIMS)
    try:
        opts = n.options()
        collector = n.attach(opts)
        n.api.stop()  # the watches keep their lists; the claims cannot be read
        try:
            sink = settled(collector, opts)
        finally:
            collector.close()
    finally:
        n.kubelet.stop()
    got = modes(sink)
    assert {k for k, (mode, _) in got.items() if mode == "time-slicing"} == ALL_SHARED
    assert unreadable(sink) == 4.0
    reader = collector.claim_reader
    assert reader is not None
    assert {e.reason for e in reader.entries.values()} == {"unreachable"}


def test_the_operator_override_wins_and_no_claim_is_read(node: Node) -> None:
    opts = node.options(sharing_modes=((DRA, "time-slicing"),))
    collector = node.attach(opts)
    try:
        sink = settled(collector, opts)
    finally:
        collector.close()
    got = modes(sink)
    assert {k for k, (mode, _) in got.items() if mode == "time-slicing"} == ALL_SHARED
    assert unreadable(sink) == 0.0
    assert claim_gets(node.api) == []


def test_no_kubernetes_no_claims_no_series(node: Node) -> None:
    opts = node.options(kubernetes=False)
    collector = AttributionCollector(opts)
    try:
        sink = cycle(collector, opts)
    finally:
        collector.close()
    assert "gpu_exporter_dra_claims_unreadable" not in sink.samples
    assert modes(sink)[("a1", GPU0, "")] == ("time-slicing", "2")  # the gpu-<n> fallback


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_claims_are_read_again_after_refresh_and_forgotten_when_released(node: Node) -> None:
    """With a clock of its own: a claim read once is not read again before `refresh` (a
    config changed meanwhile shows only after), a failed one is retried after `retry`, and
    claims no longer shared on the node are dropped."""
    clock = Clock()
    reader = ClaimReader(connector(node.kubeconfig, 5.0), refresh=300.0, retry=60.0,
                         clock=clock)
    opts = node.options()
    collector = node.attach(opts, reader)
    try:
        assert modes(settled(collector, opts))[("a1", GPU0, "")] == ("mps", "2")
        assert len(claim_gets(node.api)) == 4
        changed = claim("mps", {"gpu-0": "gpu"}, [opaque("GpuConfig", "TimeSlicing")])
        changed["metadata"]["uid"] = "uid-mps-2"  # deleted and made again under its name
        node.api.delete_claim(NS, "mps")
        node.api.add_claim(changed)
        node.api.add_claim(claim("gone", {"gpu-1-mig-9-4-4": "mig"},
                                 [opaque("MigDeviceConfig", "MPS")]))

        clock.now += 59.0  # neither due: cached answers
        sink = cycle(collector, opts)
        assert (modes(sink)[("a1", GPU0, "")], unreadable(sink)) == (("mps", "2"), 1.0)
        assert len(claim_gets(node.api)) == 4

        clock.now += 1.0  # the failed `gone` is due for a retry, `mps` not yet
        cycle(collector, opts)
        wait_until(lambda: len(claim_gets(node.api)) == 5 and ("dra", "gone") in reader.entries
                   and reader.entries[("dra", "gone")].config is not None, "the retry")
        sink = cycle(collector, opts)
        assert modes(sink)[("e1", GPU1, MIG_B)] == ("mps", "2")
        assert (modes(sink)[("a1", GPU0, "")], unreadable(sink)) == (("mps", "2"), 0.0)

        clock.now += 240.0  # 300 s after the first read: every read claim is due
        cycle(collector, opts)
        wait_until(lambda: len(claim_gets(node.api)) == 8, "the refresh")
        entry = reader.entries[("dra", "mps")]
        assert entry.config is not None and entry.config.uid == "uid-mps-2"
        assert modes(cycle(collector, opts))[("a1", GPU0, "")] == ("time-slicing", "2")
        assert len(claim_gets(node.api)) == 8

        # b2 leaves: `ts` has one holder left, so it is no longer needed; a2 and e2 too
        node.allocations = [a for a in ALLOCATIONS if a.name not in ("a2", "b2", "e2")]
        cycle(collector, opts)
        assert set(reader.entries) == {("dra", "class-mps")}
    finally:
        collector.close()
