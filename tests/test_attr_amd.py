"""AMD allocations as attribution units: PodResources answered by the real gRPC server on a
unix socket (gpusim.kubelet.FakeKubelet) carrying the IDs ROCm's device plugin and DRA driver
register (exporter/attribution/amdids.py), resolved against the AMD backend over the simulated
amdsmi and a sysfs tree in the kernel's layout."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from exporter.attribution.amdids import (
    AmdDeviceIndex,
    AmdSysfs,
    amd_slice_attributes,
    read_amd_sysfs,
)
from exporter.attribution.deviceids import UnknownIds
from exporter.attribution.dra import ClaimDevice, SliceKey
from exporter.attribution.podresources import Allocation, PodResourcesClient
from exporter.attribution.resourceslices import ResourceSlice, SliceDevice
from exporter.attribution.sources import amd_units
from exporter.attribution.units import Grant, Holder, InstanceUse
from exporter.device.amd import AmdBackend
from exporter.device.contract import Inventory, Tally
from gpu_ledger.sharing import SharingMode
from gpusim.amdsmi_sim import SimAmdVf, mi300x_cpx_nps4, mxgpu_host
from gpusim.cluster import ManualClock
from gpusim.kubelet import ClaimAllocation, ContainerAllocation, FakeKubelet, PodAllocation

T0 = 1_790_000_000.0


@pytest.fixture
def sock() -> Iterator[str]:
    d = tempfile.mkdtemp(prefix="gl-amd-", dir="/tmp")
    yield str(Path(d) / "kubelet.sock")
    shutil.rmtree(d, ignore_errors=True)


def _xcp_tree(root: Path, gpus: int) -> None:
    """/sys/devices/platform/amdgpu_xcp_<n>/drm/renderD<m> for partitions 1..7 of each GPU
    (partition 0 is the PCI device itself); platform numbers do not follow GPU order."""
    for i in range(gpus):
        for j in range(1, 8):
            n = 30 + (gpus - 1 - i) * 7 + (j - 1)
            (root / "devices" / "platform" / f"amdgpu_xcp_{n}" / "drm" /
             f"renderD{128 + 8 * i + j}").mkdir(parents=True)


def _poll(sock: str, pods: list[PodAllocation]) -> tuple[list[Allocation], PodResourcesClient]:
    kubelet = FakeKubelet(sock, lambda: pods, lambda: []).start()
    client = PodResourcesClient(sock, rpc_timeout=2)
    try:
        allocations = client.poll()
    finally:
        client.close()
        kubelet.stop()
    assert allocations is not None
    return allocations, client


def _cpx_inventory() -> Inventory:
    sim = mi300x_cpx_nps4(gpus=2, clock=ManualClock(T0), start=T0)
    backend = AmdBackend(sim.as_api())
    backend.open()
    return backend.inventory(None)


def test_device_plugin_and_dra_ids_on_a_cpx_node(sock: str, tmp_path: Path) -> None:
    inv = _cpx_inventory()
    _xcp_tree(tmp_path, 2)
    index = AmdDeviceIndex(inv, read_amd_sysfs(str(tmp_path)))
    part = {(m.parent.index, m.gpu_instance_id): m for m in inv.migs}
    gpu0, gpu1 = inv.gpus
    pods = [
        PodAllocation("ml", "train-a", [ContainerAllocation("main", [
            ("amd.com/cpx_nps4", ["0000:0c:00.0"])])]),  # partition 0 by PCI address
        PodAllocation("ml", "train-b", [ContainerAllocation("main", [
            ("amd.com/cpx_nps4", ["amdgpu_xcp_38", "amdgpu_xcp_30"])])]),
        PodAllocation("ml", "stale", [ContainerAllocation("main", [
            ("amd.com/gpu", ["amdgpu_xcp_999"])])]),
        PodAllocation("ml", "nv", [ContainerAllocation("main", [
            ("nvidia.com/gpu", ["GPU-0aa1c2d3-0000-4000-8000-00000000000a"])])]),
        PodAllocation("ml", "dra", [ContainerAllocation("main", claims=[
            ClaimAllocation("ml", "cpx-claim", [("gpu.amd.com", "node-a", "gpu-13-141")])])]),
    ]
    allocations, client = _poll(sock, pods)
    slices = amd_slice_attributes([ResourceSlice("s", "gpu.amd.com", "node-a", "node-a", (
        SliceDevice("gpu-13-141", (("gpu.amd.com/parentPciAddr", "0000:2c:00.0"),
                                   ("gpu.amd.com/renderIndex", "141"),
                                   ("gpu.amd.com/type", "amdgpu-partition"))),))])
    unknown = UnknownIds()
    rows = amd_units(allocations, client.claim_devices, index, slices, {}, unknown)
    got = {(u.holder.pod, u.device, u.resource, u.mode) for u in rows}
    # xcp_38: platform numbers run backwards over GPUs here: 38 is GPU 0's partition 2
    assert got == {
        ("train-a", (gpu0.uuid, part[(0, 0)].uuid), "amd.com/cpx_nps4", SharingMode.MIG),
        ("train-b", (gpu0.uuid, part[(0, 2)].uuid), "amd.com/cpx_nps4", SharingMode.MIG),
        ("train-b", (gpu1.uuid, part[(1, 1)].uuid), "amd.com/cpx_nps4", SharingMode.MIG),
        ("dra", (gpu1.uuid, part[(1, 5)].uuid), "gpu.amd.com", SharingMode.MIG),
    }
    assert unknown.by_resource == {"amd.com/gpu": 1}
    assert {(m.profile, m.slices, m.parent_slices) for m in inv.migs} == {("cpx_nps4", 1, 8)}


def test_dra_without_resource_slices_falls_back_to_the_render_node() -> None:
    inv = _cpx_inventory()
    index = AmdDeviceIndex(inv, AmdSysfs())
    claim = ClaimDevice("ml", "p", "c", "ml", "x", "gpu.amd.com", "node-a", "gpu-2-130")
    ref = index.resolve_claim(claim, None)
    assert ref is not None and ref.partition == next(
        m.uuid for m in inv.migs if m.parent.index == 0 and m.gpu_instance_id == 2)
    # slices readable but the device not in them: not guessed
    assert index.resolve_claim(claim, {SliceKey("gpu.amd.com", "node-a", "other"): {}}) is None


def test_two_containers_on_one_partition_are_time_slicing(sock: str, tmp_path: Path) -> None:
    inv = _cpx_inventory()
    index = AmdDeviceIndex(inv, AmdSysfs())
    pods = [PodAllocation("ml", f"p{n}", [ContainerAllocation("main", [
        ("amd.com/gpu", ["0000:2c:00.0"])])]) for n in range(2)]
    allocations, _ = _poll(sock, pods)
    rows = amd_units(allocations, (), index, None, {}, UnknownIds())
    assert {u.mode for u in rows} == {SharingMode.TIME_SLICING} and len(rows) == 2


def test_mxgpu_vfs_by_iommu_group_are_vgpu_units_with_their_share(sock: str, tmp_path: Path
                                                                  ) -> None:
    vfs = [SimAmdVf(fb_mb=49_152, guest_fb_usage_mb=1024, vm="a"),
           SimAmdVf(fb_mb=98_304, vm="b")]
    sim = mxgpu_host(gpus=1, vfs=vfs, clock=ManualClock(T0), start=T0)
    backend = AmdBackend(sim.as_api())
    backend.open()
    inv = backend.inventory(None)
    gpu = inv.gpus[0]
    functions = backend.virtual_functions(gpu, Tally())
    # sysfs: each VF's iommu_group link, as the device plugin reads it
    devices = tmp_path / "bus" / "pci" / "devices"
    for vf, group in zip(functions, ("218", "230"), strict=True):
        (tmp_path / "kernel" / "iommu_groups" / group).mkdir(parents=True)
        (devices / vf.id).mkdir(parents=True)
        os.symlink(f"../../../../kernel/iommu_groups/{group}", devices / vf.id / "iommu_group")
    index = AmdDeviceIndex(inv, read_amd_sysfs(str(tmp_path)), {gpu.uuid: functions})
    pods = [PodAllocation("vms", "virt-launcher-a", [ContainerAllocation("compute", [
                ("amd.com/gpu_vf", ["218"])])]),
            PodAllocation("vms", "virt-launcher-b", [ContainerAllocation("compute", [
                ("amd.com/gpu_vf", ["230"])])]),
            PodAllocation("vms", "virt-launcher-c", [ContainerAllocation("compute", [
                ("amd.com/gpu_vf", ["999"])])])]
    allocations, _ = _poll(sock, pods)
    unknown = UnknownIds()
    rows = amd_units(allocations, (), index, None, {}, unknown)
    assert sorted((u.holder, u.device, u.mode, u.grant) for u in rows) == [
        (Holder("vms", "virt-launcher-a", "compute"), (gpu.uuid, ""), SharingMode.VGPU,
         Grant(memory_fraction=0.25)),
        (Holder("vms", "virt-launcher-b", "compute"), (gpu.uuid, ""), SharingMode.VGPU,
         Grant(memory_fraction=0.5))]
    assert unknown.by_resource == {"amd.com/gpu_vf": 1}
    use = {u.holder.pod: u.use for u in rows}
    assert use["virt-launcher-a"] == InstanceUse(None, 1 << 30)  # the guest's framebuffer use
    # KubeVirt's own PCI host-device plugin names a VF by its address: the same VF
    [by_address] = index.resolve(functions[1].id.upper())
    assert (by_address.key, by_address.mode, by_address.vf_fraction) == \
        ((gpu.uuid, ""), SharingMode.VGPU, 0.5)


def test_the_exporter_attributes_amd_partitions_end_to_end(sock: str, tmp_path: Path) -> None:
    """Sampler + attribution collector over the AMD backend: PodResources' amd.com IDs become
    gpu_container_allocation series of partitions."""
    from exporter.collectors import REGISTRY
    from exporter.core import ExporterOptions
    from exporter.sampler import Sampler
    from gpusim.amdsmi_sim import SimAmdProcess
    from tests.exporter_helpers import values

    clock = ManualClock(T0 + 100)
    sim = mi300x_cpx_nps4(gpus=2, processes=[SimAmdProcess(4242, gpu=0, partition=2,
                                                            vram_bytes=5 << 30, gfx_busy=0.5)],
                          clock=clock, start=T0)
    backend = AmdBackend(sim.as_api(), clock_ns=lambda: int(clock.now * 1e9))
    _xcp_tree(tmp_path, 2)
    pods = [PodAllocation("ml", "train-b", [ContainerAllocation("main", [
        ("amd.com/cpx_nps4", ["amdgpu_xcp_38"])])])]
    kubelet = FakeKubelet(sock, lambda: pods, lambda: []).start()
    opts = ExporterOptions(node="node-a", pod_resources_socket=sock, kubernetes=False,
                           sysfs_root=str(tmp_path))
    sampler = Sampler(backend, opts, list(REGISTRY), threaded=False)
    try:
        body = sampler.cycle().body(False, False)
        inv = backend.inventory(None)
    finally:
        sampler.close()
        kubelet.stop()
    part = next(m for m in inv.migs if m.parent.index == 0 and m.gpu_instance_id == 2)
    assert values(body, "gpu_container_allocation", pod="train-b", mig_uuid=part.uuid,
                  sharing="mig") == [1]
    assert values(body, "gpu_exporter_unresolved_device_ids_total") in ([], [0])


def test_time_slicing_replicas_of_the_device_plugin(sock: str, tmp_path: Path) -> None:
    """ROCm/k8s-device-plugin's time-slicing (internal/pkg/plugin/timeslice.go) advertises
    `<id>-slice-<n>`: a share of what `<id>` names, whole GPU or partition."""
    inv = _cpx_inventory()
    _xcp_tree(tmp_path, 2)
    index = AmdDeviceIndex(inv, read_amd_sysfs(str(tmp_path)))
    part = {(m.parent.index, m.gpu_instance_id): m for m in inv.migs}
    pods = [PodAllocation("ml", "a", [ContainerAllocation("main", [
                ("amd.com/gpu", ["amdgpu_xcp_30-slice-0", "amdgpu_xcp_30-slice-1"])])]),
            PodAllocation("ml", "b", [ContainerAllocation("main", [
                ("amd.com/gpu", ["0000:0c:00.0-slice-3"])])])]
    allocations, _ = _poll(sock, pods)
    rows = amd_units(allocations, (), index, None, {}, UnknownIds())
    got = sorted((u.holder.pod, u.device, u.mode) for u in rows)
    p11, p00 = part[(1, 1)], part[(0, 0)]
    assert got == [("a", (p11.parent.uuid, p11.uuid), SharingMode.TIME_SLICING)] * 2 + [
        ("b", (p00.parent.uuid, p00.uuid), SharingMode.TIME_SLICING)]
