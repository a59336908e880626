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
from exporter.core import GpuRef, MigRef

GPU0 = "GPU-0aa1c2d3-0000-4000-8000-00000000000a"
GPU1 = "GPU-1bb1c2d3-1111-4111-8111-11111111111b"
MIG1 = "MIG-5cc1c2d3-5555-4555-8555-55555555555c"
MIG2 = "MIG-6dd1c2d3-6666-4666-8666-66666666666d"
G0 = GpuRef(0, GPU0, "A100", False, None)
G1 = GpuRef(1, GPU1, "A100", True, None)
MIGS = [MigRef(G1, MIG1, 1, 0, "3g.20gb", 3, 7, None),
        MigRef(G1, MIG2, 5, 0, "1g.5gb", 1, 7, None)]


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
])
def test_known_forms(index: DeviceIndex, device_id: str, expected: DeviceRef) -> None:
    assert index.resolve(device_id) == expected


@pytest.mark.parametrize("device_id", [
    "GPU-ffffffff-0000-4000-8000-000000000000",  # another node's GPU
    f"MIG-{GPU0[4:]}",  # a GPU UUID dressed as MIG
    "nvidia7", "nvidia1/gi9", "nvidia0/xyz1", "", "::", "GPU-::1", "🙂",
])
def test_unknown_forms_resolve_to_none(index: DeviceIndex, device_id: str) -> None:
    assert index.resolve(device_id) is None


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
    assert unknown.total == 4
    assert len(caplog.records) == 2
    assert "GPU-nope" in caplog.records[0].getMessage()
