"""How the simulated node's GPUs reach pods, in the forms the real allocators publish them:
the device plugin's IDs under each `device_id_strategy`, the NVIDIA DRA driver's device names,
ResourceSlice and allocated ResourceClaims, and the pod annotations of the HAMi and gpushare
schedulers."""

from __future__ import annotations

from typing import Any

from gpu_ledger.sharing import SharingMode
from gpusim.model import (
    DRA_DRIVER,
    ClaimSpec,
    ContainerSpec,
    GpuSpec,
    MigSpec,
    PodSpec,
    Scenario,
    stable_uuid,
)

MIB, GIB = 1 << 20, 1 << 30
# HAMi's device plugin registers each GPU this many times as `GPU-<uuid>-<n>` (its chart's
# devicePlugin.deviceSplitCount; Project-HAMi/HAMi rm/devices.go GetPluginDevices)
HAMI_SPLIT_COUNT = 10


def plugin_id(scenario: Scenario, gpu: GpuSpec, mig: MigSpec | None) -> str:
    """The device plugin's ID of a GPU or MIG instance (before any `::<replica>` suffix):
    `GPU-<uuid>` / `MIG-<uuid>` (uuid), `0` / `0:1` (index: GPU, then the MIG device's slot),
    or the CDI name of the index form, `nvidia.com/gpu=0` (cdi)."""
    if scenario.device_id_strategy == "uuid":
        return mig.uuid if mig is not None else gpu.uuid
    base = str(gpu.index) if mig is None else f"{gpu.index}:{mig.index}"
    return base if scenario.device_id_strategy == "index" else f"nvidia.com/gpu={base}"


def vgpu_resource(type_name: str) -> str:
    """The KubeVirt device plugin's resource for a vGPU type: `NVIDIA A100-4C` ->
    `nvidia.com/NVIDIA_A100-4C`."""
    return "nvidia.com/" + type_name.replace(" ", "_")


def dra_device(gpu: GpuSpec, mig: MigSpec | None) -> str:
    """The DRA driver's device name: `gpu-<index>`, a MIG instance `gpu-<index>-mig-<slot>`."""
    return f"gpu-{gpu.index}" if mig is None else f"gpu-{gpu.index}-mig-{mig.index}"


def container_claims(scenario: Scenario, namespace: str, c: ContainerSpec
                     ) -> tuple[tuple[str, str, tuple[tuple[str, str, str], ...]], ...]:
    """(claim namespace, claim name, ((driver, pool, device), ...)) per claim the container
    consumes, as PodResources lists them."""
    out: list[tuple[str, str, tuple[tuple[str, str, str], ...]]] = []
    for claim in scenario.claims:
        if claim.namespace != namespace or not any(u.claim == claim.name for u in c.units):
            continue
        devices = []
        for u in claim.units:
            gpu = scenario.gpus[u.gpu]
            mig = gpu.mig[u.mig] if gpu.mig is not None and u.mig is not None else None
            devices.append((DRA_DRIVER, scenario.node, dra_device(gpu, mig)))
        out.append((claim.namespace, claim.name, tuple(devices)))
    return tuple(out)


def resource_slices(scenario: Scenario) -> list[dict[str, Any]]:
    """The DRA driver's ResourceSlice for this node: every GPU with allocation dra and its MIG
    instances, with the `uuid` (MIG: and `parentUUID`) and `index` attributes. Empty when the
    scenario has no DRA GPU or says `resource_slices: false`."""
    devices: list[dict[str, Any]] = []
    for gpu in scenario.gpus:
        if gpu.allocation != "dra":
            continue
        if gpu.mig is None:
            devices.append({"name": dra_device(gpu, None), "attributes": {
                "type": {"string": "gpu"}, "uuid": {"string": gpu.uuid},
                "index": {"int": gpu.index}, "productName": {"string": gpu.model}}})
        for mig in gpu.mig or ():
            devices.append({"name": dra_device(gpu, mig), "attributes": {
                "type": {"string": "mig"}, "uuid": {"string": mig.uuid},
                "parentUUID": {"string": gpu.uuid}, "index": {"int": mig.index},
                "profile": {"string": mig.profile}}})
    if not devices or not scenario.resource_slices:
        return []
    return [{
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": f"{scenario.node}-{DRA_DRIVER}"},
        "spec": {"driver": DRA_DRIVER, "nodeName": scenario.node,
                 "pool": {"name": scenario.node, "generation": 1, "resourceSliceCount": 1},
                 "devices": devices},
    }]


def resource_claim(scenario: Scenario, claim: ClaimSpec) -> dict[str, Any]:
    """The ResourceClaim as the API server serves it once allocated: a request per kind of
    device (`gpu`, `mig`), and with `sharing` an opaque config of the driver per request
    (GpuConfig / MigDeviceConfig, strategy MPS or TimeSlicing), copied into the allocation
    with `source: FromClaim` as the scheduler does."""
    results: list[dict[str, str]] = []
    for u in claim.units:
        gpu = scenario.gpus[u.gpu]
        mig = gpu.mig[u.mig] if gpu.mig is not None and u.mig is not None else None
        results.append({"request": "mig" if mig is not None else "gpu", "driver": DRA_DRIVER,
                        "pool": scenario.node, "device": dra_device(gpu, mig)})
    kinds = sorted({r["request"] for r in results})
    requests = [{"name": k, "exactly": {"deviceClassName": f"{k}.nvidia.com",
                                        "count": sum(r["request"] == k for r in results)}}
                for k in kinds]
    config: list[dict[str, Any]] = []
    if claim.sharing:
        mps = claim.sharing == SharingMode.MPS
        for k in kinds:
            sharing: dict[str, Any] = {"strategy": "MPS" if mps else "TimeSlicing"}
            if mps:
                sharing["mpsConfig"] = {"defaultActiveThreadPercentage": 50}
            elif k == "gpu":  # MIG devices have no time-slice settings
                sharing["timeSlicingConfig"] = {"interval": "Default"}
            config.append({"requests": [k], "opaque": {"driver": DRA_DRIVER, "parameters": {
                "apiVersion": "resource.nvidia.com/v1beta1",
                "kind": "MigDeviceConfig" if k == "mig" else "GpuConfig", "sharing": sharing}}})
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"namespace": claim.namespace, "name": claim.name,
                     "uid": stable_uuid("resourceclaim", claim.namespace, claim.name)},
        "spec": {"devices": {"requests": requests, "config": config}},
        "status": {"allocation": {"devices": {
            "results": results, "config": [{"source": "FromClaim", **c} for c in config]}}},
    }


def hami_slot_ids(scenario: Scenario) -> list[str]:
    """HAMi's kubelet device IDs: `GPU-<uuid>-<n>`, HAMI_SPLIT_COUNT per GPU it hands out."""
    return [f"{gpu.uuid}-{n}" for gpu in scenario.gpus if gpu.allocation == "hami"
            for n in range(HAMI_SPLIT_COUNT)]


def hami_slots(scenario: Scenario, pod: PodSpec, container: int) -> list[str]:
    """The slot IDs the kubelet gave a container for its HAMi grants: one per grant, on the
    granted GPU (HAMi's GetPreferredAllocation lines them up), numbered in the order the
    scenario's pods take that GPU's slots."""
    taken: dict[int, int] = {}
    for p in scenario.pods:
        for ci, c in enumerate(p.containers):
            out = []
            for u in c.units:
                if u.memory is None or scenario.gpus[u.gpu].allocation != "hami":
                    continue
                n = taken.get(u.gpu, 0)
                taken[u.gpu] = n + 1
                out.append(f"{scenario.gpus[u.gpu].uuid}-{n % HAMI_SPLIT_COUNT}")
            if p.index == pod.index and ci == container:
                return out
    return []


def pod_annotations(scenario: Scenario, pod: PodSpec) -> dict[str, str]:
    """The scheduler's decision for the pod's fractional grants, as the schedulers write it.

    HAMi (Project-HAMi/HAMi v2.9.0 `EncodePodSingleDevice`, nvidia `PatchAnnotations`):
    `hami.io/vgpu-devices-allocated`, one `;`-ended group per container the scheduler walked,
    empty for a container without a device (simulated pods have no init containers, which
    since v2.9.0 would come first), devices `:`-ended, `<uuid>,NVIDIA,<MiB>,<core %>`; the
    same string in `hami.io/vgpu-devices-to-allocate`, which the device plugin empties one
    group per Allocate (`eraseNextDeviceTypeFromAnnotation`, each re-encode adding a `;`), so a
    running pod shows only `;`s there; `hami.io/vgpu-node` and `hami.io/bind-phase: success`.
    gpushare: `ALIYUN_COM_GPU_MEM_IDX/_POD/_DEV` (GiB)."""
    out: dict[str, str] = {}
    groups: list[str] = []
    for c in pod.containers:
        devs = ""
        for u in c.units:
            gpu = scenario.gpus[u.gpu]
            if u.memory is None:
                continue
            if gpu.allocation == "hami":
                devs += f"{gpu.uuid},NVIDIA,{u.memory // MIB},{u.cores or 0}:"
            elif gpu.allocation == "gpushare":
                out.update({"ALIYUN_COM_GPU_MEM_IDX": str(gpu.index),
                            "ALIYUN_COM_GPU_MEM_POD": str(u.memory // GIB),
                            "ALIYUN_COM_GPU_MEM_DEV": str(gpu.memory_bytes // GIB)})
        groups.append(devs + ";")
    if any(g != ";" for g in groups):
        out["hami.io/vgpu-devices-allocated"] = "".join(groups)
        out["hami.io/vgpu-devices-to-allocate"] = ";" * (
            len(groups) + sum(g != ";" for g in groups))
        out["hami.io/vgpu-node"] = scenario.node
        out["hami.io/bind-phase"] = "success"
    return out
