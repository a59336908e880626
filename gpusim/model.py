"""The scenario model: frozen dataclasses that the simulated NVML module and the Kubernetes
side of the simulated node share, and the names a scenario may use."""

from __future__ import annotations

import hashlib
import uuid as uuidlib
from dataclasses import dataclass, field

from gpu_ledger.sharing import SharingMode
from gpusim.hardware import MigFamily
from gpusim.signal import Signal

# How a simulated GPU is shared (the rest of SharingMode follows from MIG, DRA, HAMi, vGPU).
SHARING_MODES = tuple(m.value for m in (SharingMode.EXCLUSIVE, SharingMode.TIME_SLICING,
                                        SharingMode.MPS))
# Who hands a GPU to pods: the NVIDIA device plugin (IDs in PodResources), the DRA driver
# (ResourceClaims), or a fractional scheduler (HAMi, gpushare: grants in pod annotations).
ALLOCATIONS = ("device-plugin", "dra", "hami", "gpushare")
# How the device plugin names devices: GPU-<uuid>, 0 / 0::1 / 0:1, or CDI nvidia.com/gpu=0.
DEVICE_ID_STRATEGIES = ("uuid", "index", "cdi")
DRA_DRIVER = "gpu.nvidia.com"
# What a DRA claim's opaque config may say of sharing (the driver's MPS / TimeSlicing).
CLAIM_SHARING = (SharingMode.TIME_SLICING.value, SharingMode.MPS.value)
QOS_CLASSES = ("guaranteed", "burstable", "besteffort")
THROTTLE_REASONS = ("hw_thermal", "sw_thermal", "hw_power_brake", "sw_power_cap",
                    "hw_slowdown", "sync_boost")
NVLINK_ERROR_TYPES = ("replay", "recovery", "crc_flit", "crc_data")
FAULT_KINDS = ("lost", "not_supported", "throttle", "ecc", "row_remap", "pcie_replay",
               "nvlink_error", "nvlink_down")
# Readings a scenario can mark NOT_SUPPORTED, and the NVML calls each one covers.
FIELDS = {
    "temperature": "nvmlDeviceGetTemperature",
    "memory_temperature": "nvmlDeviceGetFieldValues(NVML_FI_DEV_MEMORY_TEMP)",
    "power": "nvmlDeviceGetPowerUsage",
    "power_limit": "nvmlDeviceGetEnforcedPowerLimit",
    "energy": "nvmlDeviceGetTotalEnergyConsumption",
    "utilization": "nvmlDeviceGetUtilizationRates",
    "encoder": "nvmlDeviceGetEncoderUtilization",
    "decoder": "nvmlDeviceGetDecoderUtilization",
    "clocks": "nvmlDeviceGetClockInfo",
    "clock_events": "nvmlDeviceGetCurrentClocksEventReasons",
    "violation": "nvmlDeviceGetViolationStatus",
    "ecc": "nvmlDeviceGetTotalEccErrors",
    "remapped_rows": "nvmlDeviceGetRemappedRows",
    "pcie_replay": "nvmlDeviceGetPcieReplayCounter",
    "nvlink": "nvmlDeviceGetNvLinkState / nvmlDeviceGetNvLinkErrorCounter",
    "gpm": "nvmlGpm*",
    "pcie_throughput": "nvmlDeviceGetPcieThroughput, GPM PCIe metrics",
    "nvlink_throughput": "nvmlDeviceGetFieldValues(NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_*), "
                         "GPM NVLink metrics",
    "process_utilization": "nvmlDeviceGetProcessUtilization",
    "events": "nvmlDeviceRegisterEvents",
}
VIRTUALIZATION_MODES = {"none": 0, "passthrough": 1, "vgpu": 2, "host_vgpu": 3, "host_vsga": 4}
LICENSE_FEATURES = ("vgpu", "nvidia_rtx", "gaming", "compute")
NOT_MIG = 0xFFFFFFFF


@dataclass(frozen=True)
class Sharing:
    mode: str = "exclusive"  # exclusive | time-slicing | mps
    replicas: int = 1
    resource: str = ""  # device plugin resource name; "" = the default for the unit


_ZERO = Signal.const(0.0)
_CONST_SM_CLOCK = Signal.const(1410.0)
_CONST_MEM_CLOCK = Signal.const(1593.0)


@dataclass(frozen=True)
class Telemetry:
    """Per-GPU baseline readings; None means derived from utilisation (docs/scenarios.md)."""

    temperature: Signal | None = None  # °C
    memory_temperature: Signal | None = None  # °C
    power_watts: Signal | None = None
    idle_power_watts: float = 0.0
    sm_clock_mhz: Signal = _CONST_SM_CLOCK
    mem_clock_mhz: Signal = _CONST_MEM_CLOCK
    utilization: Signal = _ZERO  # 0-1, added to the processes' sum
    encoder_utilization: Signal = _ZERO  # 0-1
    decoder_utilization: Signal = _ZERO  # 0-1


@dataclass(frozen=True)
class MigSpec:
    index: int
    profile: str
    uuid: str
    gpu_instance_id: int
    compute_instance_id: int
    slices: int  # compute slices (= GPU instance slices: one compute instance per GI)
    memory_slices: int
    memory_bytes: int
    multiprocessors: int
    sharing: Sharing


@dataclass(frozen=True)
class VgpuSpec:
    """An active vGPU instance on a vGPU host GPU (virtualization_mode host_vgpu)."""

    index: int  # place in the GPU's vgpus list
    type_name: str  # nvmlVgpuTypeGetName, e.g. NVIDIA A100-4C
    framebuffer: int  # bytes, nvmlVgpuTypeGetFramebufferSize
    uuid: str  # nvmlVgpuInstanceGetMdevUUID: the ID the KubeVirt device plugin hands out
    vm: str  # nvmlVgpuInstanceGetVmID (UUID form)
    memory: Signal  # framebuffer in use, bytes
    sm_util: Signal  # 0-1 of the GPU


@dataclass(frozen=True)
class LicenseSpec:
    """A vGPU guest's licence (nvmlDeviceGetGridLicensableFeatures)."""

    feature: str = "compute"  # one of LICENSE_FEATURES
    product: str = "NVIDIA Virtual Compute Server"
    lapses_at: float | None = None  # scenario seconds: unlicensed from then on


@dataclass(frozen=True)
class GpuSpec:
    index: int
    model: str
    uuid: str
    memory_bytes: int
    reserved_bytes: int
    power_limit_watts: float
    pci_bus_id: str
    vbios_version: str
    virtualization_mode: int
    multiprocessors: int
    mig_family: MigFamily | None  # None: the model has no MIG
    mig: tuple[MigSpec, ...] | None  # None: MIG disabled; () enabled with no instances
    gpm: bool
    nvlink_links: int
    not_supported: frozenset[str]
    telemetry: Telemetry
    sharing: Sharing
    allocation: str = "device-plugin"  # one of ALLOCATIONS
    vgpus: tuple[VgpuSpec, ...] = ()  # host_vgpu: the active vGPU instances
    license: LicenseSpec | None = None  # vgpu (guest): its licence

    @property
    def mig_enabled(self) -> bool:
        return self.mig is not None


@dataclass(frozen=True)
class UnitRef:
    """A device unit a container holds: a GPU, a MIG instance, or one replica of either; a
    device of a DRA claim (`claim`); or a fractional grant of a GPU (`memory`, `cores`)."""

    gpu: int
    mig: int | None = None
    replica: int | None = None
    vgpu: int | None = None  # a vGPU instance of the GPU (index into its vgpus)
    claim: str = ""  # the ResourceClaim it comes through; '' for device plugin and grants
    memory: int | None = None  # bytes a HAMi / gpushare grant gives
    cores: int | None = None  # HAMi core percent; None: compute not limited

    @property
    def is_grant(self) -> bool:
        return self.memory is not None


@dataclass(frozen=True)
class ClaimSpec:
    """A DRA ResourceClaim: its devices; every container that lists it consumes them all."""

    namespace: str
    name: str
    units: tuple[UnitRef, ...]
    sharing: str = ""  # one of CLAIM_SHARING, the claim's config; "" = no sharing config


@dataclass(frozen=True)
class ProcessSpec:
    name: str
    memory: Signal  # bytes
    sm_util: Signal  # 0-1
    mem_util: Signal | None  # 0-1; None = 0.6 x sm_util
    tensor_util: Signal | None  # 0-1; None = 0.5 x sm_util
    pid: int | None
    unit: int | None  # index into the container's units; None = one process per unit


@dataclass(frozen=True)
class ContainerSpec:
    name: str
    units: tuple[UnitRef, ...]
    resource: str
    processes: tuple[ProcessSpec, ...]


@dataclass(frozen=True)
class PodSpec:
    index: int
    namespace: str
    name: str
    uid: str  # "" = derived per occurrence from namespace/name
    labels: tuple[tuple[str, str], ...]
    qos: str
    start: float
    end: float | None
    repeat: float | None
    containers: tuple[ContainerSpec, ...]
    owner: tuple[str, str] = ("", "")  # controller (kind, name); ("", "") for a bare pod


@dataclass(frozen=True)
class HostProcessSpec:
    """A GPU process outside Kubernetes (a node daemon): no pod, a system.slice cgroup."""

    name: str
    gpu: int
    mig: int | None
    pid: int | None
    memory: Signal
    sm_util: Signal
    start: float
    end: float | None


@dataclass(frozen=True)
class Fault:
    kind: str
    gpu: int
    at: float
    until: float | None = None  # end of a window (throttle, not_supported, nvlink_down)
    field: str = ""  # not_supported
    reason: str = ""  # throttle
    corrected: int = 0  # ecc / row_remap (correctable rows)
    uncorrected: int = 0
    pending: bool = False  # row_remap
    failure: bool = False  # row_remap
    count: int = 0  # pcie_replay / nvlink_error
    link: int = 0  # nvlink_error / nvlink_down
    error_type: str = ""  # nvlink_error


@dataclass(frozen=True)
class XidSpec:
    gpu: int
    at: float
    xid: int
    mig: int | None = None


@dataclass(frozen=True)
class Scenario:
    file: str
    node: str
    driver_version: str
    cuda_version: int
    gpus: tuple[GpuSpec, ...]
    pods: tuple[PodSpec, ...]
    host_processes: tuple[HostProcessSpec, ...]
    faults: tuple[Fault, ...]
    xids: tuple[XidSpec, ...]
    driver_unavailable_until: float = 0.0
    driver_error: str = "driver_not_loaded"  # driver_not_loaded | library_not_found
    mig_strategy: str = "mixed"  # mixed | single
    cgroup_driver: str = "systemd"  # systemd | cgroupfs
    container_runtime: str = "containerd"  # containerd | cri-o
    duration: float | None = None  # informative: how long the scenario is meant to run
    device_id_strategy: str = "uuid"  # one of DEVICE_ID_STRATEGIES
    claims: tuple[ClaimSpec, ...] = ()
    resource_slices: bool = True  # the DRA driver publishes ResourceSlices for this node
    process_count: int = field(default=0)  # process slots; for deterministic PIDs


def stable_uuid(*parts: str) -> str:
    """A uuid4-format UUID derived from the parts: the same scenario gives the same UUIDs."""
    digest = hashlib.sha256("\x1f".join(parts).encode()).digest()
    return str(uuidlib.UUID(bytes=digest[:16], version=4))


def stable_hex(length: int, *parts: str) -> str:
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:length]
