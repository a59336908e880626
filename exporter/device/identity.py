"""The one rule for the `uuid` a device is published under (docs/backends.md, "Device
identity"): metering keys a GPU by `uuid` across every node of a cluster, so it must be unique
in the fleet, not only on the node.

- `HardwareId`: an ID the vendor library derives from the chip itself: NVML's UUID, amdsmi's
  device UUID when it carries the ASIC's unique ID, Level Zero's device UUID when compute-runtime
  read it from the chip's telemetry (Data Center GPU Max) rather than building it from the PCI
  address. Published as it is.
- `NodeAddress`: every other device: the node's name and the device's PCI address, published as
  `<bdf>@<node>` (`0000:4d:00.0@gpu-node-7`). `@` is in neither a node name (a DNS subdomain)
  nor an address, so the two parts read back unambiguously. Without a node name it is the bare
  address, which only one node may report (metering refuses a chunk where two do).

The classifiers below say which vendor IDs are hardware-derived, from the upstream formats they
cite; anything else is not one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from exporter.device.contract import pci_address


@dataclass(frozen=True)
class HardwareId:
    """An ID the vendor library derived from the chip: unique across nodes."""

    value: str


@dataclass(frozen=True)
class NodeAddress:
    """A device the library gives no chip-unique ID: this node's name and its PCI address."""

    node: str
    bdf: str


DeviceIdentity = HardwareId | NodeAddress


def identity(hardware: HardwareId | None, node: str, bdf: str) -> DeviceIdentity:
    """The device's identity: its hardware ID where it has one, else node + address."""
    return hardware if hardware is not None else NodeAddress(node, bdf)


def published_uuid(ident: DeviceIdentity) -> str:
    """The `uuid` label (and metering's GPU key) of a device."""
    if isinstance(ident, HardwareId):
        return ident.value
    return f"{ident.bdf}@{ident.node}" if ident.node else ident.bdf


def uuid_text(raw: bytes) -> str:
    """16 bytes as xpumd writes a Level Zero UUID: lower-case hex in byte order, 8-4-4-4-12
    (intel/xpumanager ial/cmn/metrics/identity.h)."""
    h = raw.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def level_zero_id(raw: bytes, bdf: str) -> HardwareId | None:
    """Level Zero's device UUID (`ze_device_properties_t.uuid`, 16 bytes) when it is
    chip-derived; None when it is the PCI-built one or empty.

    compute-runtime (intel/compute-runtime 26.31.39395.13) reads a Data Center GPU Max's UUID
    from its PMT telemetry (product_helper_pvc.cpp: GUID 0x41fe79a5, 8 bytes at offset 64;
    product_helper_uuid_xehp_and_later.inl: the rest zero, byte 15 the subdevice) and builds
    every other device's from its PCI location (zes_os_sysman_imp.cpp / device.cpp `DeviceUUID`:
    vendor 0x8086, device, revision as little-endian u16s, then domain u16, bus, device,
    function, four zero bytes, subdevice). The PCI-built one is recognised by its vendor bytes
    and the device's own address in bytes 6-10: no telemetry UUID matches, as its bytes 8-10 are
    zero and no GPU sits at 00:00.0."""
    if len(raw) != 16 or not any(raw):
        return None
    addr = pci_address(bdf)
    if addr is not None:
        domain, bus, rest = addr.split(":")
        dev, fn = rest.split(".")
        pci = int(domain, 16).to_bytes(2, "little") + bytes((int(bus, 16), int(dev, 16),
                                                               int(fn, 16)))
        if raw[0:2] == b"\x86\x80" and raw[6:11] == pci and not any(raw[11:15]):
            return None
    return HardwareId(uuid_text(raw))


_UUID = re.compile(r"([0-9a-f]{8})-([0-9a-f]{4})-([0-9a-f]{4})-([0-9a-f]{4})-([0-9a-f]{12})")


def amdsmi_id(text: str) -> HardwareId | None:
    """amdsmi's device UUID when it carries the ASIC's unique ID; None when empty or built
    from a zero one.

    amdsmi_uuid_gen (ROCm/amdsmi amd_smi_uuid.cc, rocm-6.2) writes the 64-bit unique ID as its
    top byte in the first group's first two digits, the next byte in the fourth group's last
    two and the low 48 bits in the last group, beside the PCI device ID and a function or
    partition byte. ROCm 6.2 takes it from sysfs `device/unique_id` and generates a UUID
    from 0 where the file is missing, the same for every GPU of a model; later releases
    (ROCm/rocm-systems projects/amdsmi/src/amd_smi/amd_smi.cc, amdsmi_get_gpu_device_uuid)
    fail the call instead. A UUID of another form is taken as it is."""
    t = text.strip().lower()
    if not t:
        return None
    m = _UUID.fullmatch(t)
    if m is not None and m.group(1)[:2] == "00" and m.group(4)[2:] == "00" \
            and int(m.group(5), 16) == 0:
        return None
    return HardwareId(t)
