"""Scenario format for every way a GPU reaches a pod: device ID strategies, DRA claims (one
pod, several pods), HAMi and gpushare grants; what the simulated kubelet, API server and pod
annotations say for them, and one-line errors for bad entries."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from exporter.attribution.dra import SliceKey
from exporter.attribution.fractional import parse_grants
from exporter.attribution.resourceclaims import claim_config
from exporter.errors import ConfigError
from gpusim.allocation import pod_annotations, resource_claim, resource_slices
from gpusim.cluster import SimCluster
from gpusim.node import device_ids, pods_at
from gpusim.scenario import load_scenario, parse_scenario

SHARING = Path(__file__).resolve().parent.parent / "gpusim" / "scenarios" / "sharing.yaml"
T0 = 1_790_000_000.0


def _gpu(**extra: Any) -> dict[str, Any]:
    return {"model": "NVIDIA H100 80GB HBM3", "memory": "80GiB", "power_limit_watts": 700,
            **extra}


def _scenario(gpus: list[dict[str, Any]], pods: list[dict[str, Any]],
              **top: Any) -> dict[str, Any]:
    return {"node": "n1", "gpus": gpus, "pods": pods, **top}


def _pod(name: str, container: dict[str, Any], ns: str = "ns") -> dict[str, Any]:
    return {"namespace": ns, "name": name, "containers": [{"name": "c", **container}]}


@pytest.mark.parametrize(("strategy", "ids"), [
    ("index", ["0", "1:0", "1:1", "2::0", "2::1"]),
    ("cdi", ["nvidia.com/gpu=0", "nvidia.com/gpu=1:0", "nvidia.com/gpu=1:1",
             "nvidia.com/gpu=2::0", "nvidia.com/gpu=2::1"]),
])
def test_device_id_strategies(strategy: str, ids: list[str]) -> None:
    sc = parse_scenario(_scenario(
        [_gpu(), _gpu(mig=[{"profile": "3g.40gb"}, {"profile": "2g.20gb"}]),
         _gpu(sharing={"mode": "time-slicing", "replicas": 2})], [],
        device_id_strategy=strategy))
    assert [i for _, i in device_ids(sc)] == ids


def test_the_example_node_has_every_allocation() -> None:
    sc = load_scenario(SHARING)
    assert {g.allocation for g in sc.gpus} == {"device-plugin", "dra", "hami", "gpushare"}
    # The device plugin advertises only its own GPUs (0-3), by index; HAMi's plugin its GPU
    # (6) as ten `GPU-<uuid>-<n>` slots.
    hami_slots = {f"{sc.gpus[6].uuid}-{n}" for n in range(10)}
    ids = {i for _, i in device_ids(sc)}
    assert {i.split(":")[0] for i in ids - hami_slots} == {"0", "1", "2", "3"}
    assert hami_slots <= ids
    pods = {p.name: p for p in pods_at(sc, 60.0)}
    # A DRA claim is listed apart from device IDs, as PodResources' dynamic_resources.
    s1, s2 = pods["dra-s1"].containers[0], pods["dra-s2"].containers[0]
    assert s1.devices == () and s1.claims == s2.claims == (
        ("infer", "shared-gpu", (("gpu.nvidia.com", "gpu-sharing-01", "gpu-5"),)),)
    # Processes run on the claimed and granted GPUs.
    assert s1.processes[0].uuid == sc.gpus[5].uuid
    assert pods["hami-a"].containers[0].processes[0].uuid == sc.gpus[6].uuid
    # the kubelet gave each HAMi holder a slot of the granted GPU
    assert pods["hami-a"].containers[0].devices == (("nvidia.com/gpu", (f"{sc.gpus[6].uuid}-0",)),)
    assert pods["hami-b"].containers[0].devices == (("nvidia.com/gpu", (f"{sc.gpus[6].uuid}-1",)),)
    (slice_,) = resource_slices(sc)
    names = [d["name"] for d in slice_["spec"]["devices"]]
    assert names == ["gpu-4", "gpu-5"]
    assert slice_["spec"]["devices"][1]["attributes"]["uuid"] == {"string": sc.gpus[5].uuid}


def test_grant_annotations_read_back_as_the_exporter_reads_them() -> None:
    """What the simulator writes is what the exporter's annotation parser understands."""
    sc = load_scenario(SHARING)
    by_name = {p.name: p for p in sc.pods}
    hami = pod_annotations(sc, by_name["hami-a"])
    assert hami == {"hami.io/vgpu-devices-allocated": f"{sc.gpus[6].uuid},NVIDIA,20480,60:;",
                    "hami.io/vgpu-devices-to-allocate": ";;", "hami.io/vgpu-node": sc.node,
                    "hami.io/bind-phase": "success"}
    (g,) = parse_grants(hami, ("main",)).grants
    assert (g.device, g.memory_bytes, g.core_fraction) == (sc.gpus[6].uuid, 20 << 30, 0.6)
    share = pod_annotations(sc, by_name["share-a"])
    assert share == {"ALIYUN_COM_GPU_MEM_IDX": "7", "ALIYUN_COM_GPU_MEM_POD": "60",
                     "ALIYUN_COM_GPU_MEM_DEV": "80"}
    (g,) = parse_grants(share, ("main",)).grants
    assert (g.device, g.memory_fraction) == ("7", 0.75)
    assert pod_annotations(sc, by_name["whole"]) == {}


def test_claims_no_resource_slice_lists_are_counted_and_the_rest_attributed() -> None:
    """`resource_slices: false`: the driver publishes nothing, so the slices the exporter
    reads (it can: no fallback) name no claimed device. Each claimed device is counted under
    its driver in gpu_exporter_unresolved_device_ids_total and logged; every other pod of
    the node is still attributed."""
    data = yaml.safe_load(SHARING.read_text())
    data["resource_slices"] = False
    sc = parse_scenario(data, "sharing.yaml")
    assert resource_slices(sc) == []
    counts = []
    with SimCluster([sc], start=T0) as cluster:
        for t in (T0 + 60, T0 + 120):
            for _, rendering in cluster.step(t):
                samples = rendering.samples
                counts.append({labels[0]: v for labels, v, _ in
                               samples["gpu_exporter_unresolved_device_ids_total"]})
    assert [v for _, v, _ in samples["gpu_exporter_dra_fallback"]] == [0.0]
    # per PodResources answer: dra-one's, dra-s1's and dra-s2's device
    assert counts[1]["gpu.nvidia.com"] - counts[0]["gpu.nvidia.com"] == 3
    # HAMi's kubelet slots (GPU-<uuid>-<n>, in List and GetAllocatableResources) are no miss
    assert counts[0]["nvidia.com/gpu"] == counts[1]["nvidia.com/gpu"] == 0
    pods = {labels[2] for labels, _, _ in samples["gpu_container_allocation"]}
    assert pods == {"whole", "mig", "ts-a", "ts-b", "mps-a", "hami-a", "hami-b", "share-a"}


def test_claim_sharing_is_served_as_the_driver_config_and_read_back() -> None:
    """`sharing: mps` on a claim: the API server serves the ResourceClaim with the driver's
    opaque GpuConfig (strategy MPS) in its allocation, which the exporter's reader takes as
    MPS; a claim without `sharing` has no config. Through the simulated node, both holders of
    the shared claim are MPS shares and every claim was read."""
    sc = load_scenario(SHARING)
    claims = {c.name: c for c in sc.claims}
    assert (claims["shared-gpu"].sharing, claims["one-gpu"].sharing) == ("mps", "")
    shared = resource_claim(sc, claims["shared-gpu"])
    (entry,) = shared["status"]["allocation"]["devices"]["config"]
    assert entry["source"] == "FromClaim" and entry["requests"] == ["gpu"]
    assert entry["opaque"]["driver"] == "gpu.nvidia.com"
    assert entry["opaque"]["parameters"]["kind"] == "GpuConfig"
    assert entry["opaque"]["parameters"]["sharing"]["strategy"] == "MPS"
    assert claim_config(shared).is_mps(SliceKey("gpu.nvidia.com", sc.node, "gpu-5"), mig=False)
    one = resource_claim(sc, claims["one-gpu"])
    assert one["spec"]["devices"]["config"] == []
    assert not claim_config(one).is_mps(SliceKey("gpu.nvidia.com", sc.node, "gpu-4"), False)

    with SimCluster([sc], start=T0) as cluster:
        for _, rendering in cluster.step(T0 + 60):
            samples = rendering.samples
    dra = {labels[2]: (labels[7], labels[8])
           for labels, _, _ in samples["gpu_container_allocation"]
           if labels[6] == "gpu.nvidia.com"}
    assert dra == {"dra-one": ("exclusive", "1"), "dra-s1": ("mps", "2"),
                   "dra-s2": ("mps", "2")}
    assert [v for _, v, _ in samples["gpu_exporter_dra_claims_unreadable"]] == [0.0]


def test_a_mig_claim_shared_by_time_slicing() -> None:
    """A MIG device's claim says so in a MigDeviceConfig (no time-slice settings)."""
    sc = parse_scenario(_scenario(
        [_gpu(allocation="dra", mig=[{"profile": "3g.40gb"}])], [],
        resource_claims=[{"namespace": "ns", "name": "c", "devices": [{"gpu": 0, "mig": 0}],
                          "sharing": "time-slicing"}]))
    obj = resource_claim(sc, sc.claims[0])
    assert obj["status"]["allocation"]["devices"]["results"] == [
        {"request": "mig", "driver": "gpu.nvidia.com", "pool": "n1", "device": "gpu-0-mig-0"}]
    (entry,) = obj["spec"]["devices"]["config"]
    assert entry["opaque"]["parameters"] == {
        "apiVersion": "resource.nvidia.com/v1beta1", "kind": "MigDeviceConfig",
        "sharing": {"strategy": "TimeSlicing"}}
    assert not claim_config(obj).is_mps(SliceKey("gpu.nvidia.com", "n1", "gpu-0-mig-0"), True)


@pytest.mark.parametrize(("change", "key", "expected"), [
    (lambda d: d["pods"][0]["containers"][0].update(gpus=[4]),
     "pods[0].containers[0].gpus[0]", "a device plugin GPU: GPU 4 has allocation dra"),
    (lambda d: d["pods"][0]["containers"][0].update(claims=["nope"]),
     "pods[0].containers[0].claims[0]", "the name of a resource_claims entry in namespace "
     "research (none)"),
    (lambda d: d["resource_claims"][0].update(devices=[0]),
     "resource_claims[0].devices[0]", "a GPU with allocation: dra (GPU 0 is handed out by "
     "device-plugin)"),
    (lambda d: d["pods"][8]["containers"][0].update(gpus=[6]),
     "pods[8].containers[0].gpus[0]", "a grant {gpu: 6, memory: ...}: GPU 6 has allocation "
     "hami"),
    (lambda d: d["pods"][8]["containers"][0].update(gpus=[{"gpu": 6, "memory": "90GiB"}]),
     "pods[8].containers[0].gpus[0].memory", "a size above 0 and at most the GPU's 80GiB"),
    (lambda d: d["pods"][8]["containers"][0].update(gpus=[{"gpu": 6, "memory": "1GiB",
                                                           "cores": 101}]),
     "pods[8].containers[0].gpus[0].cores", "an integer"),
    (lambda d: d["pods"][10]["containers"][0].update(gpus=[{"gpu": 7, "memory": "1GiB",
                                                            "cores": 10}]),
     "pods[10].containers[0].gpus[0].cores", "no cores: gpushare grants memory only"),
    (lambda d: d["pods"][10]["containers"][0].update(gpus=[{"gpu": 7, "memory": "1GiB"},
                                                           {"gpu": 7, "memory": "2GiB"}]),
     "pods[10].containers[0].gpus[1]", "one gpushare grant per pod"),
    (lambda d: d["gpus"][5].update(mig=[{"profile": "3g.40gb"}]),
     "gpus[5].mig", "no mig with allocation hami"),
    (lambda d: d["resource_claims"][1].update(sharing="exclusive"),
     "resource_claims[1].sharing", "one of time-slicing, mps"),
    (lambda d: d.update(device_id_strategy="name"),
     "device_id_strategy", "one of uuid, index, cdi"),
])
def test_bad_entries_name_the_key(tmp_path: Path, change: Any, key: str, expected: str) -> None:
    data = yaml.safe_load(SHARING.read_text())
    change(data)
    with pytest.raises(ConfigError) as err:
        parse_scenario(data, "sharing.yaml")
    assert f"sharing.yaml: {key}: expected {expected}" in str(err.value)
