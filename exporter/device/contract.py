"""The device backend contract: what the sampler and the collectors read about GPUs, whoever
makes them. One vendor library sits behind each backend (NVML now: exporter/device/nvml.py;
AMD `amdsmi` and Intel sysfs / DRM fdinfo / Level Zero later, docs/backends.md); nothing
outside a backend calls a vendor library.

Readings are frozen dataclasses in normalised units: bytes, watts, joules (NVML gives mJ, AMD
µJ, Intel J), hertz, degrees Celsius, ratios 0-1. A value the device does not have is None
(absent, not a failure). A backend counts the calls that failed unexpectedly in the `Tally` it
is given, and raises `DeviceLost` when a device fell off the bus (the collectors then skip it
for the rest of the cycle).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol

if TYPE_CHECKING:
    from exporter.device.nvmlapi import NvmlApi

Vendor = Literal["nvidia", "amd", "intel"]
# How a device is split into units a pod can hold: MIG, AMD compute x memory partitions
# (SPX..CPX x NPS1..8), Intel subdevices (the tiles of a Data Center GPU Max).
PartitionKind = Literal["mig", "amd_partition", "intel_subdevice"]
# A device lent whole or in part to a VM: NVIDIA vGPU now; AMD MxGPU (SR-IOV VF), Intel
# SR-IOV VF and GVT-g mdev later.
VirtualKind = Literal["vgpu", "sriov_vf", "mdev"]


_BDF = re.compile(r"(?:([0-9a-f]{1,8}):)?([0-9a-f]{2}):([0-9a-f]{2})\.([0-7])")


def pci_bdf(bus_id: str) -> str:
    """A PCI address in the form sysfs, AMD and Intel use (`0000:3b:00.0`: 4-digit domain,
    lower case), from any vendor's spelling (NVML: `00000000:3B:00.0`). Anything that is not
    an address comes back trimmed and lower-cased, "" stays ""."""
    text = bus_id.strip().lower()
    m = _BDF.fullmatch(text)
    if m is None:
        return text
    domain, bus, dev, fn = m.groups()
    return f"{int(domain or '0', 16):04x}:{bus}:{dev}.{fn}"


def pci_address(text: str) -> str | None:
    """`pci_bdf(text)` when `text` is a PCI address in any vendor's spelling, else None (a
    device ID that is no address, a `drm-pdev` that is garbage)."""
    bdf = pci_bdf(text)
    return bdf if _BDF.fullmatch(bdf) else None


class DeviceLost(Exception):
    """The device fell off the bus (NVML_ERROR_GPU_IS_LOST, or its vendor's equivalent)."""


@dataclass
class Tally:
    """Calls that failed unexpectedly during one collector run (0 is success)."""

    failures: int = 0


@dataclass(frozen=True)
class GpuRef:
    """A physical device as its backend discovered it. `handle` is the backend's own (an NVML
    device handle, real or simulated): only the backend that made it reads it."""

    index: int
    uuid: str
    model: str
    mig_enabled: bool  # partitioned (MIG mode on): the device-wide utilisation is absent
    handle: object = field(compare=False, repr=False)
    # whose backend made it: the composite backend (exporter/device/backends.py) hands each
    # read to that vendor's backend; it is also the `vendor` label of the gpu_* families
    vendor: Vendor = "nvidia"

    def labels(self, node: str) -> tuple[str, ...]:
        return (node, str(self.index), self.uuid, self.model, self.vendor)


@dataclass(frozen=True)
class GpuStatic:
    """Identity read once per inventory refresh (gpu_info labels and the join keys)."""

    pci_bus_id: str = ""  # PCI BDF as the vendor library writes it (NVML: 00000000:3B:00.0)
    vbios_version: str = ""
    mig_mode: str = ""  # "enabled" | "disabled" | "" (no partitioning)
    virtualization_mode: str = ""  # none | passthrough | vgpu | host_vgpu | host_vsga | ""
    vendor: Vendor = "nvidia"
    memory_bytes: int | None = None  # the device's memory; None where the backend cannot say

    @property
    def pci_bdf(self) -> str:
        """The PCI address as a join key across vendors and sysfs (`0000:3b:00.0`)."""
        return pci_bdf(self.pci_bus_id)


@dataclass(frozen=True)
class MigRef:
    """A partition of a device that a pod can hold: a MIG instance now (`kind` "mig"). For
    other kinds `gpu_instance_id` / `compute_instance_id` are the vendor's partition ids and
    `profile` its name (e.g. "cpx_nps4")."""

    parent: GpuRef
    uuid: str
    gpu_instance_id: int
    compute_instance_id: int
    profile: str  # e.g. "3g.40gb"
    slices: int  # compute slices of the profile
    parent_slices: int
    handle: object = field(compare=False, repr=False)
    # position among the parent's MIG device handles (nvmlDeviceGetMigDeviceHandleByIndex):
    # the `j` of the device plugin's `<gpu>:<j>` index IDs; -1 when not known
    slot: int = -1
    kind: PartitionKind = "mig"

    def labels(self, node: str) -> tuple[str, ...]:
        return (*self.parent.labels(node), self.uuid, str(self.gpu_instance_id),
                str(self.compute_instance_id), self.profile)


Partition = MigRef  # the vendor-neutral name; MigRef stays for the MIG-only code


@dataclass(frozen=True)
class Inventory:
    driver_version: str = ""
    cuda_version: str = ""  # NVIDIA only; "" elsewhere
    gpus: tuple[GpuRef, ...] = ()
    migs: tuple[MigRef, ...] = ()
    static: dict[str, GpuStatic] = field(default_factory=dict)  # uuid -> identity


@dataclass(frozen=True)
class ProcessSample:
    """One process using a device (host PID)."""

    pid: int
    uuid: str  # parent GPU
    mig_uuid: str  # '' unless the process runs in a partition
    memory_bytes: float
    sm_util: float | None  # 0-1; None where the backend gives none (MIG, no sample yet)


@dataclass(frozen=True)
class MemoryUsage:
    total_bytes: float
    used_bytes: float
    free_bytes: float | None = None
    reserved_bytes: float | None = None


@dataclass(frozen=True)
class Telemetry:
    """One reading of a device. Every field is None where the device or driver has no such
    value; device-wide utilisation is None on a partitioned device."""

    temperature_celsius: float | None = None
    memory_temperature_celsius: float | None = None
    power_watts: float | None = None
    power_limit_watts: float | None = None
    energy_joules: float | None = None  # since the driver loaded: a counter
    utilization: float | None = None
    memory_utilization: float | None = None
    encoder_utilization: float | None = None
    decoder_utilization: float | None = None
    memory: MemoryUsage | None = None
    sm_clock_hertz: float | None = None
    memory_clock_hertz: float | None = None
    # (partition uuid, J since the driver loaded) for partitions with their own energy counter
    # (an Intel Max tile): parts of `energy_joules`, which alone is the device's (billed) energy
    partition_energy_joules: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class RowRemapping:
    """Memory rows retired by remapping (NVIDIA Ampere+; AMD's bad pages would map here)."""

    correctable: int
    uncorrectable: int
    pending: bool  # a remap waits for the next reset
    failed: bool  # a remap failed: the device needs service


@dataclass(frozen=True)
class RasErrorCount:
    """Errors one RAS block of the device counted since the driver loaded (AMD: umc, gfx,
    sdma, mmhub, xgmi_wafl, ... with severity correctable, uncorrectable or deferred)."""

    block: str
    severity: str
    count: int


@dataclass(frozen=True)
class Reliability:
    """Error counters of a device, since the driver loaded; None where it has no such count."""

    ecc_corrected: int | None = None
    ecc_uncorrected: int | None = None
    row_remapping: RowRemapping | None = None
    pcie_replays: int | None = None
    ras_errors: tuple[RasErrorCount, ...] = ()  # per block (AMD); empty where there are none


LinkType = Literal["nvlink", "xgmi", "xelink"]


@dataclass(frozen=True)
class LinkTraffic:
    """Bytes one scale-up link (AMD XGMI, Intel Xe Link) carried since the driver loaded; tx
    sent by the device, rx received; None where the link does not count that direction."""

    link_type: LinkType
    link: int
    tx_bytes: int | None
    rx_bytes: int | None
    # when the link's counters were read (the device's clock, s), where each link has its own
    # (Level Zero's fabric ports); None: the Interconnect's timestamp
    timestamp_seconds: float | None = None


@dataclass(frozen=True)
class Interconnect:
    """Byte counters of a device's PCIe and scale-up links, since the driver loaded (the
    collector differences them into rates); None and () where the device has none."""

    pcie_tx_bytes: int | None = None
    pcie_rx_bytes: int | None = None
    links: tuple[LinkTraffic, ...] = ()
    # when the device took the reading (its own clock, seconds); None: the exporter's clock
    timestamp_seconds: float | None = None
    # PCIe bytes per second measured by the driver over a window of its own, where the device
    # has no byte counter (AMD's pcie_bw, an estimate: docs/backends.md); emitted as read
    pcie_tx_bytes_per_second: float | None = None
    pcie_rx_bytes_per_second: float | None = None


@dataclass(frozen=True)
class VirtualFunction:
    """A slice of a device lent to a VM, seen from the host: an NVIDIA vGPU instance now."""

    id: str  # the mdev UUID (what KubeVirt's device plugin hands out), else the instance UUID
    kind: VirtualKind
    type_name: str  # e.g. "GRID A100-4C"; "" when unknown
    vm: str  # the VM it serves; "" when unknown
    framebuffer_bytes: int | None
    memory_used_bytes: int | None
    utilization: float | None  # 0-1 of the device; None: no sample
    # the fraction of the device it is priced as (an Intel GVT-g type's 1/N, an SR-IOV VF's
    # 1/VFs); None: priced by framebuffer (vGPU) or unknown
    share: float | None = None


@dataclass(frozen=True)
class GuestLicence:
    """Inside a VM: the licence state of one licensable feature (NVIDIA vGPU guests)."""

    feature: str
    product: str
    licensed: bool


# What an error event's `code` numbers: an NVIDIA XID; an AMD Field Identifier (AFID, the
# number AMD's RAS events carry, listed in AMD's AFID table); an AMD RAS event without one.
ErrorKind = Literal["xid", "afid", "ras"]


@dataclass(frozen=True)
class ErrorEvent:
    """A device error the driver reported as an event: an NVIDIA XID, an AMD RAS event (with
    its AFID when the driver gives one). `gpu_device_errors_total` counts them per kind and
    code beside `gpu_xid_errors_total` (docs/backends.md)."""

    uuid: str  # the device; "" when the backend cannot tell which
    code: int
    kind: ErrorKind = "xid"
    # the error's severity as the vendor names it (AMD: "fatal", "uncorrectable",
    # "correctable"); "" when the vendor does not say (an XID)
    severity: str = ""


class EventSource(Protocol):
    """A subscription to error events. `wait` blocks up to timeout_ms: None when nothing came,
    else the error events of what came (empty for an event that is not an error). Raises
    EventsUnavailable on any other failure."""

    def register(self, gpus: Sequence[GpuRef]) -> None: ...
    def wait(self, timeout_ms: int) -> list[ErrorEvent] | None: ...
    def close(self) -> None: ...


class EventsUnavailable(Exception):
    """Waiting for events failed (not a timeout)."""


class ProcessReader(Protocol):
    """Lists the processes on one device. Stateful: a backend that gives utilisation as
    samples since a time remembers, per device, what it has already read."""

    def read(self, gpu: GpuRef, partitions: Sequence[MigRef], tally: Tally
             ) -> list[ProcessSample]: ...


class DeviceReader(Protocol):
    """What the collectors and the process stage read about the devices of a cycle: one
    vendor's backend, or the node's `Backends` (exporter/device/backends.py), which hands each
    read to the backend whose vendor made the device (`GpuRef.vendor`)."""

    @property
    def nvml(self) -> NvmlApi | None:
        """The NVML API itself, for the NVIDIA-only collectors (clock event reasons, NVLink
        error counters, GPM, throughput); None on a backend (or node) without NVML."""
        ...

    def telemetry(self, gpu: GpuRef, tally: Tally) -> Telemetry: ...

    def reliability(self, gpu: GpuRef, tally: Tally) -> Reliability: ...

    def partition_memory(self, partition: MigRef, tally: Tally) -> MemoryUsage | None: ...

    def partition_utilization(self, partition: MigRef, tally: Tally) -> float | None:
        """The share of time a partition's compute or render engines were busy since the
        previous call (0-1); None on the first call and where the backend has no
        per-partition figure (NVML: GPM's gpu_sm_active_ratio is MIG's)."""
        ...

    def interconnect(self, gpu: GpuRef, tally: Tally) -> Interconnect:
        """PCIe and link byte counters (empty on NVIDIA, whose throughput collector reads
        NVML's rates and counters itself)."""
        ...

    def process_reader(self) -> ProcessReader: ...

    def virtual_functions(self, gpu: GpuRef, tally: Tally) -> list[VirtualFunction]:
        """The device's active VFs / vGPU instances (host side); empty where there are none."""
        ...

    def guest_licences(self, gpu: GpuRef, tally: Tally) -> list[GuestLicence]: ...

    def error_events(self) -> EventSource: ...


class DeviceBackend(DeviceReader, Protocol):
    """One vendor's devices on this node. Its GpuRefs carry its `vendor`."""

    vendor: Vendor
    source: str  # its gpu_exporter_source_up name ("nvml")
    library: str  # how log lines and reasons name it ("NVML")

    def open(self) -> None:
        """Initialise the library; raises (any exception) when it cannot: retried later."""
        ...

    def close(self) -> None: ...

    def inventory(self, previous: Inventory | None) -> Inventory:
        """Every device and partition. A device lost since `previous` keeps its old identity
        so its series stay the same series."""
        ...

    def expected_devices(self, sysfs_root: str) -> list[str] | None:
        """PCI addresses of this vendor's GPU functions in sysfs (whether or not the library
        answers); None when sysfs cannot be read."""
        ...
