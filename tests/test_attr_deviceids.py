"""Device ID forms resolved against an inventory, and the resource name → sharing mode map."""

import logging

import pytest

from exporter.attribution.deviceids import (
    DeviceIndex,
    DeviceRef,
    UnknownIds,
    is_gpu_resource,
    sharing_mode,
)
from exporter.core import GpuRef, GpuStatic, MigRef

GPU0 = "GPU-0aa1c2d3-0000-4000-8000-00000000000a"
GPU1 = "GPU-1bb1c2d3-1111-4111-8111-11111111111b"
MIG1 = "MIG-5cc1c2d3-5555-4555-8555-55555555555c"
MIG2 = "MIG-6dd1c2d3-6666-4666-8666-66666666666d"
G0 = GpuRef(0, GPU0, "A100", False, None)
G1 = GpuRef(1, GPU1, "A100", True, None)
# slots as NVML numbers the MIG device handles of GPU 1 (not the GPU instance IDs)
MIGS = [MigRef(G1, MIG1, 1, 0, "3g.20gb", 3, 7, None, slot=0),
        MigRef(G1, MIG2, 5, 0, "1g.5gb", 1, 7, None, slot=1)]


@pytest.fixture
def index() -> DeviceIndex:
    return DeviceIndex([G0, G1], MIGS)


@pytest.mark.parametrize(("device_id", "expected"), [
    (GPU0, DeviceRef(GPU0, "", False)),
    (GPU0.lower(), DeviceRef(GPU0, "", False)),
    (GPU0[4:], DeviceRef(GPU0, "", False)),  # some plugins drop the prefix
    (MIG1, DeviceRef(GPU1, MIG1, False)),
    (f"{GPU0}::0", DeviceRef(GPU0, "", True)),
    (f"{GPU0}::12", DeviceRef(GPU0, "", True)),
    (f"{MIG2}::3", DeviceRef(GPU1, MIG2, True)),
    (f"MIG-{GPU1}/5/0", DeviceRef(GPU1, MIG2, False)),  # pre-R470 MIG naming
    ("nvidia0", DeviceRef(GPU0, "", False)),
    ("nvidia1/gi1", DeviceRef(GPU1, MIG1, False)),
    ("nvidia1/gi5", DeviceRef(GPU1, MIG2, False)),
    ("nvidia0/vgpu3", DeviceRef(GPU0, "", True)),
    # deviceIDStrategy: index
    ("0", DeviceRef(GPU0, "", False)),
    ("1", DeviceRef(GPU1, "", False)),
    ("0::1", DeviceRef(GPU0, "", True)),
    ("1:0", DeviceRef(GPU1, MIG1, False)),  # first MIG device handle of GPU 1
    ("1:1", DeviceRef(GPU1, MIG2, False)),
    ("1:1::3", DeviceRef(GPU1, MIG2, True)),
    # CDI fully-qualified names
    ("nvidia.com/gpu=0", DeviceRef(GPU0, "", False)),
    (f"nvidia.com/gpu={GPU0}", DeviceRef(GPU0, "", False)),
    (f"nvidia.com/gpu={MIG2}", DeviceRef(GPU1, MIG2, False)),
    ("nvidia.com/gpu=1:0", DeviceRef(GPU1, MIG1, False)),
    ("nvidia.com/gpu=0::2", DeviceRef(GPU0, "", True)),
])
def test_known_forms(index: DeviceIndex, device_id: str, expected: DeviceRef) -> None:
    assert index.resolve(device_id) == expected


@pytest.mark.parametrize("device_id", [
    "GPU-ffffffff-0000-4000-8000-000000000000",  # another node's GPU
    f"MIG-{GPU0[4:]}",  # a GPU UUID dressed as MIG
    "nvidia7", "nvidia1/gi9", "nvidia0/xyz1", "", "::", "GPU-::1", "🙂",
    "2", "0:0", "1:5", "1:", ":1", "-1", "1:0:0", "0x1",  # index forms past the inventory
    "nvidia.com/gpu=", "nvidia.com/gpu=7", "=0", "nvidia.com/gpu=all::1",
])
def test_unknown_forms_resolve_to_none(index: DeviceIndex, device_id: str) -> None:
    assert index.resolve(device_id) is None


def test_cdi_all_names_every_gpu(index: DeviceIndex) -> None:
    assert index.resolve_all("nvidia.com/gpu=all") == (
        DeviceRef(GPU0, "", False), DeviceRef(GPU1, "", False))
    assert index.resolve_all("nvidia.com/gpu=1:0") == (DeviceRef(GPU1, MIG1, False),)
    assert index.resolve_all("nvidia.com/gpu=7") == ()
    assert DeviceIndex([], []).resolve_all("nvidia.com/gpu=all") == ()


def test_index_forms_need_slots() -> None:
    """MIG index IDs name a handle slot: an inventory that does not know slots resolves none,
    rather than guessing from GPU instance IDs."""
    index = DeviceIndex([G0, G1], [MigRef(G1, MIG1, 1, 0, "3g.20gb", 3, 7, None)])
    assert index.resolve("1:0") is None and index.resolve("1") == DeviceRef(GPU1, "", False)


def test_sharing_modes() -> None:
    whole, mig, share = DeviceRef(GPU0, "", False), DeviceRef(GPU1, MIG1, False), \
        DeviceRef(GPU0, "", True)
    assert sharing_mode("nvidia.com/gpu", whole, {}) == "exclusive"
    assert sharing_mode("nvidia.com/gpu", share, {}) == "time-slicing"
    assert sharing_mode("nvidia.com/gpu", mig, {}) == "mig"  # single strategy
    assert sharing_mode("nvidia.com/mig-3g.20gb", mig, {}) == "mig"
    assert sharing_mode("nvidia.com/gpu.shared", share, {}) == "time-slicing"
    assert sharing_mode("nvidia.com/gpu.shared", share, {"nvidia.com/gpu.shared": "mps"}) == "mps"
    assert sharing_mode("nvidia.com/gpu", share, {"nvidia.com/gpu.shared": "mps"}) == \
        "time-slicing"


def test_gpu_resources() -> None:
    assert is_gpu_resource("nvidia.com/gpu", {})
    assert is_gpu_resource("nvidia.com/mig-1g.5gb", {})
    assert not is_gpu_resource("example.com/nic", {})
    assert is_gpu_resource("example.com/gpu", {"example.com/gpu": "exclusive"})


def test_unknown_ids_log_once(caplog: pytest.LogCaptureFixture) -> None:
    unknown = UnknownIds()
    with caplog.at_level(logging.WARNING, logger="exporter.attribution.deviceids"):
        for _ in range(3):
            unknown.report("nvidia.com/gpu", "GPU-nope")
        unknown.report("nvidia.com/gpu", "GPU-other")
        unknown.report("nvidia.com/mig-1g.5gb", "9:9")
    assert unknown.total == 5
    assert unknown.by_resource == {"nvidia.com/gpu": 4, "nvidia.com/mig-1g.5gb": 1}
    assert len(caplog.records) == 3
    assert "GPU-nope" in caplog.records[0].getMessage()


# --- PCI addresses: the join key of AMD's and Intel's device plugins ----------------------------
AMD0 = GpuRef(0, "GPU-amd-0", "AMD Instinct MI300X", False, None, vendor="amd")
IGPU = GpuRef(0, "intel-0000:00:02.0", "Intel UHD Graphics 770", False, None, vendor="intel")
STATIC = {GPU0: GpuStatic(pci_bus_id="00000000:18:00.0"),
          AMD0.uuid: GpuStatic(pci_bus_id="0000:0c:00.0", vendor="amd"),
          IGPU.uuid: GpuStatic(pci_bus_id="0000:00:02.0", vendor="intel")}


@pytest.mark.parametrize(("device_id", "expected"), [
    ("0000:0c:00.0", DeviceRef(AMD0.uuid, "", False)),
    ("0000:0C:00.0", DeviceRef(AMD0.uuid, "", False)),
    ("0c:00.0", DeviceRef(AMD0.uuid, "", False)),  # no domain
    ("0000:0c:00.0::2", DeviceRef(AMD0.uuid, "", True)),  # a share of it
    ("amd.com/gpu=0000:0c:00.0", DeviceRef(AMD0.uuid, "", False)),  # CDI
    ("0000:00:02.0", DeviceRef(IGPU.uuid, "", False)),
    ("00000000:18:00.0", DeviceRef(GPU0, "", False)),  # NVML's spelling, an NVIDIA GPU
    ("0000:0c:00.1", None),  # another function: no GPU
    ("0000:0c:00.9", None),  # no address
    ("0", DeviceRef(GPU0, "", False)),  # index IDs stay NVIDIA's, whatever else has index 0
])
def test_pci_address_ids(device_id: str, expected: DeviceRef | None) -> None:
    index = DeviceIndex([AMD0, IGPU, G0, G1], MIGS, STATIC)
    assert index.resolve(device_id) == expected


def test_by_bdf_any_spelling() -> None:
    index = DeviceIndex([AMD0, G0], [], STATIC)
    assert index.by_bdf("0000:0C:00.0") is AMD0 and index.by_bdf("00000000:18:00.0") is G0
    assert index.by_bdf("card0") is None and index.by_bdf("") is None


def test_vendor_resources_are_gpu_resources() -> None:
    assert is_gpu_resource("amd.com/gpu", {}) and is_gpu_resource("amd.com/cpx_nps4", {})
    assert is_gpu_resource("gpu.intel.com/i915", {}) and is_gpu_resource("gpu.intel.com/xe", {})
    assert not is_gpu_resource("intel.com/sriov-netdevice", {})
