"""Every metric family the exporter emits, declared once as data.

The renderer, docs/metrics.md and the tests all read this table; nothing else spells a
metric name. Label tuples are ordered as they are rendered.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Kind(StrEnum):
    GAUGE = "gauge"
    COUNTER = "counter"


DEVICE = ("node", "gpu", "uuid", "model", "vendor")
MIG = (*DEVICE, "mig_uuid", "gpu_instance_id", "compute_instance_id", "profile")
CONTAINER = ("node", "namespace", "pod", "container", "uuid", "mig_uuid")
PROCESS = ("node", "pid", "uuid", "mig_uuid", "namespace", "pod", "container")


@dataclass(frozen=True)
class Family:
    name: str
    kind: Kind
    help: str
    labels: tuple[str, ...]
    collector: str
    # True: allow-listed pod labels are appended as label_<name> (kube-state-metrics style).
    pod_labels: bool = False

    @property
    def openmetrics_name(self) -> str:
        """OpenMetrics names a counter family without its _total suffix."""
        if self.kind is Kind.COUNTER and self.name.endswith("_total"):
            return self.name[: -len("_total")]
        return self.name


def _g(name: str, help: str, labels: tuple[str, ...], collector: str, **kw: bool) -> Family:
    return Family(name, Kind.GAUGE, help, labels, collector, **kw)


def _c(name: str, help: str, labels: tuple[str, ...], collector: str) -> Family:
    return Family(name, Kind.COUNTER, help, labels, collector)


FAMILIES: tuple[Family, ...] = (
    # --- device -------------------------------------------------------------------------------
    _g("gpu_info", "Fixed properties of a GPU; always 1.",
       (*DEVICE, "pci_bus_id", "driver_version", "cuda_version", "vbios_version", "mig_mode",
        "virtualization_mode"), "device"),
    _g("gpu_up", "1 if the GPU answers NVML, 0 if it is lost or fell off the bus.", DEVICE,
       "device"),
    _g("gpu_temperature_celsius", "GPU core temperature.", DEVICE, "device"),
    _g("gpu_memory_temperature_celsius", "GPU memory (HBM) temperature.", DEVICE, "device"),
    _g("gpu_power_watts", "Current power draw.", DEVICE, "device"),
    _g("gpu_power_limit_watts", "Enforced power limit.", DEVICE, "device"),
    _c("gpu_energy_joules_total", "Energy consumed since the driver was loaded.", DEVICE,
       "device"),
    _g("gpu_utilization_ratio",
       "Fraction of the sample period a kernel ran on the GPU (absent on MIG-enabled GPUs).",
       DEVICE, "device"),
    _g("gpu_memory_utilization_ratio",
       "Fraction of the sample period device memory was read or written (absent on MIG).",
       DEVICE, "device"),
    _g("gpu_encoder_utilization_ratio", "Video encoder utilisation (absent on MIG).", DEVICE,
       "device"),
    _g("gpu_decoder_utilization_ratio", "Video decoder utilisation (absent on MIG).", DEVICE,
       "device"),
    _g("gpu_memory_total_bytes", "Total device memory.", DEVICE, "device"),
    _g("gpu_memory_used_bytes", "Device memory in use.", DEVICE, "device"),
    _g("gpu_memory_free_bytes", "Device memory free.", DEVICE, "device"),
    _g("gpu_memory_reserved_bytes", "Device memory reserved by the driver and firmware.",
       DEVICE, "device"),
    _g("gpu_sm_clock_hertz", "Current SM clock.", DEVICE, "device"),
    _g("gpu_memory_clock_hertz", "Current memory clock.", DEVICE, "device"),
    _g("gpu_expected_devices",
       "NVIDIA GPUs the node has by a source that does not need NVML (source pci: GPU "
       "functions in sysfs); absent when that source cannot be read.", ("node", "source"),
       "inventory"),
    _g("gpu_answering_devices",
       "GPUs that answered NVML on the last sample; below gpu_expected_devices while a GPU is "
       "lost, also one that was lost before the exporter started.", ("node",), "inventory"),
    # --- clocks events and violation time -------------------------------------------------------
    _g("gpu_clock_event_active",
       "1 while a clock event (throttle) reason is active, else 0.", (*DEVICE, "reason"),
       "clocks"),
    _c("gpu_throttle_seconds_total",
       "Time the GPU spent held below its target clocks, by policy.", (*DEVICE, "reason"),
       "clocks"),
    # --- reliability ----------------------------------------------------------------------------
    _c("gpu_ecc_errors_total", "Volatile ECC error count since the driver was loaded.",
       (*DEVICE, "type"), "ecc"),
    _g("gpu_remapped_rows", "Memory rows remapped, by kind.", (*DEVICE, "kind"), "ecc"),
    _g("gpu_row_remap_pending", "1 if a row remap is pending (needs a GPU reset).", DEVICE,
       "ecc"),
    _g("gpu_row_remap_failure", "1 if a row remap failed.", DEVICE, "ecc"),
    _c("gpu_pcie_replay_total", "PCIe replay count.", DEVICE, "ecc"),
    _c("gpu_ras_errors_total",
       "Errors a RAS block of the GPU counted since the driver loaded (AMD: block umc, gfx, "
       "sdma, mmhub, xgmi_wafl, ...; type correctable, uncorrectable or deferred).",
       (*DEVICE, "block", "type"), "ecc"),
    _c("gpu_nvlink_errors_total", "NVLink error counters, per link and type.",
       (*DEVICE, "link", "type"), "nvlink"),
    # --- XID events -----------------------------------------------------------------------------
    _c("gpu_xid_errors_total", "XID events received from the NVML event set, per XID code.",
       (*DEVICE, "xid"), "xid"),
    _g("gpu_xid_last_timestamp_seconds", "Unix time of the last XID event of this code.",
       (*DEVICE, "xid"), "xid"),
    _c("gpu_error_events_total",
       "Error events other than XIDs the driver reported (AMD RAS events: kind afid with the "
       "AMD Field Identifier as code, or ras), per kind, code and the vendor's severity "
       "(error_severity fatal, uncorrectable, correctable; empty when not given).",
       (*DEVICE, "kind", "code", "error_severity"), "xid"),
    _g("gpu_error_event_last_timestamp_seconds",
       "Unix time of the last error event of this kind, code and severity.",
       (*DEVICE, "kind", "code", "error_severity"), "xid"),
    # --- GPM (Hopper+) per GPU and per MIG instance ---------------------------------------------
    _g("gpu_sm_active_ratio", "Fraction of cycles an SM had at least one warp assigned (GPM).",
       MIG, "gpm"),
    _g("gpu_sm_occupancy_ratio", "Resident warps over the SM maximum (GPM).", MIG, "gpm"),
    _g("gpu_tensor_active_ratio", "Fraction of cycles a tensor pipe was active (GPM).", MIG,
       "gpm"),
    _g("gpu_dram_active_ratio", "Fraction of peak DRAM bandwidth used (GPM).", MIG, "gpm"),
    # --- PCIe / NVLink / scale-up link throughput ---------------------------------------------
    _g("gpu_pcie_throughput_bytes_per_second",
       "PCIe traffic by direction (tx: sent by the GPU, rx: received): NVIDIA with GPM "
       "(Hopper+) the mean over the sample interval, else the driver's 20 ms reading at sample "
       "time; Intel the mean of Level Zero's byte counters over the sample interval; AMD the "
       "driver's one-second estimate (messages x max payload, an upper bound), refreshed "
       "about every minute.",
       (*MIG, "direction"), "throughput"),
    _g("gpu_nvlink_throughput_bytes_per_second",
       "NVLink data traffic over all links by direction (tx: sent by the GPU, rx: received), "
       "mean over the sample interval (GPM on Hopper+, else the links' byte counters). The "
       "same figure as gpu_link_throughput_bytes_per_second{link_type=\"nvlink\"}.",
       (*MIG, "direction"), "throughput"),
    _g("gpu_link_throughput_bytes_per_second",
       "Scale-up link traffic (GPU to GPU) over all links of a type, by direction (tx: sent "
       "by the GPU, rx: received), mean over the sample interval: link_type nvlink (NVIDIA), "
       "xgmi (AMD, amdsmi's per-link data counters), xelink (Intel).",
       (*MIG, "link_type", "direction"), "throughput"),
    # --- MIG ------------------------------------------------------------------------------------
    _g("gpu_mig_info", "A MIG instance and its profile; always 1.",
       (*MIG, "slices", "parent_slices"), "mig"),
    _g("gpu_mig_memory_total_bytes", "Memory of a MIG instance.", MIG, "mig"),
    _g("gpu_mig_memory_used_bytes", "Memory in use in a MIG instance.", MIG, "mig"),
    _c("gpu_partition_energy_joules_total",
       "Energy a partition (an Intel Max tile) consumed since the driver was loaded: a part of "
       "its GPU's gpu_energy_joules_total, which alone is metered (never add the two).",
       MIG, "device"),
    _g("gpu_partition_utilization_ratio",
       "Fraction of the sample interval a partition's busiest engine group (compute, render) "
       "was active (Intel tiles: Level Zero engine activity on the subdevice); absent where "
       "the backend has no per-partition figure (a MIG instance's is gpu_sm_active_ratio).",
       MIG, "mig"),
    # --- vGPU ---------------------------------------------------------------------------------
    _g("gpu_vgpu_license_state",
       "In a vGPU guest: 1 while the GPU holds a licence for the feature, 0 while it does not "
       "(nvmlDeviceGetGridLicensableFeatures); absent where NVML does not license the GPU.",
       (*DEVICE, "feature", "product"), "vgpu"),
    _g("gpu_vgpu_info",
       "On a vGPU host: an active vGPU instance of the GPU; always 1. vgpu_uuid is its mdev "
       "UUID (the device ID the KubeVirt device plugin hands a virt-launcher pod), vgpu_type "
       "the NVML type name, vm_id the VM it serves.",
       (*DEVICE, "vgpu_uuid", "vgpu_type", "vm_id"), "vgpu"),
    _g("gpu_vgpu_framebuffer_bytes", "Framebuffer of a vGPU instance's type.",
       (*DEVICE, "vgpu_uuid"), "vgpu"),
    _g("gpu_vgpu_memory_used_bytes", "Framebuffer a vGPU instance uses.",
       (*DEVICE, "vgpu_uuid"), "vgpu"),
    _g("gpu_vgpu_utilization_ratio", "SM utilisation of a vGPU instance, 0-1 of the GPU.",
       (*DEVICE, "vgpu_uuid"), "vgpu"),
    # --- attribution ----------------------------------------------------------------------------
    _g("gpu_container_allocation",
       "1 per GPU unit the kubelet allocated to a container; replicas is how many shares the "
       "device is cut into (1 if exclusive); owner_kind/owner_name: the pod's controller "
       "(a ReplicaSet of a Deployment is named as the Deployment), empty for a bare pod.",
       (*CONTAINER, "resource", "sharing", "replicas", "owner_kind", "owner_name"),
       "attribution", pod_labels=True),
    _g("gpu_container_memory_used_bytes", "GPU memory used by the container's processes.",
       CONTAINER, "attribution", pod_labels=True),
    _g("gpu_container_sm_utilization_ratio",
       "SM utilisation of the container's processes, summed (absent on MIG).", CONTAINER,
       "attribution", pod_labels=True),
    _g("gpu_container_processes", "GPU processes the container runs on the device.",
       CONTAINER, "attribution", pod_labels=True),
    _g("gpu_container_memory_fraction",
       "Fraction of the device's memory a fractional grant gives the container (HAMi "
       "gpumem over the GPU's framebuffer, gpushare POD/DEV units).", CONTAINER,
       "attribution", pod_labels=True),
    _g("gpu_container_core_fraction",
       "Fraction of the device's compute a fractional grant gives the container (HAMi "
       "gpucores / 100); absent when the grant does not limit compute.", CONTAINER,
       "attribution", pod_labels=True),
    _g("gpu_process_memory_used_bytes", "GPU memory used by one process (opt-in).", PROCESS,
       "attribution"),
    _g("gpu_process_sm_utilization_ratio", "SM utilisation of one process (opt-in).", PROCESS,
       "attribution"),
    _c("gpu_exporter_unresolved_device_ids_total",
       "Allocated device IDs of a GPU resource that matched no GPU or MIG instance on this "
       "node (each logged once), counted once per PodResources answer that held them: those "
       "allocations are not attributed.", ("resource",), "attribution"),
    _c("gpu_exporter_fractional_errors_total",
       "Pods whose fractional GPU grant (HAMi, gpushare pod annotations) could not be read "
       "or names no GPU of this node, counted and logged once per pod: that pod's grant is "
       "not attributed, every other pod's is.", (),
       "attribution"),
    _g("gpu_exporter_dra_fallback",
       "1 while this node's ResourceSlices cannot be read, so DRA devices named gpu-<n> are "
       "taken as NVML index n (and MIG devices are not resolved); 0 when they are read.",
       (), "attribution"),
    _g("gpu_exporter_dra_claims_unreadable",
       "DRA ResourceClaims whose device several containers on this node share and whose "
       "sharing config the exporter could not read (no RBAC get on resourceclaims, deleted, "
       "API down; each problem logged once): their shares are reported as time-slicing, not "
       "as the MPS their config may say. No series with --no-kubernetes.", (), "attribution"),
    # --- the exporter itself --------------------------------------------------------------------
    _g("gpu_exporter_collector_success", "1 if the collector's last run succeeded.",
       ("collector",), "exporter"),
    _g("gpu_exporter_collector_duration_seconds", "Wall time of the collector's last run.",
       ("collector",), "exporter"),
    _g("gpu_exporter_last_sample_timestamp_seconds", "Unix time of the last completed sample.",
       (), "exporter"),
    _g("gpu_exporter_build_info", "Exporter build; always 1.", ("version", "python_version"),
       "exporter"),
    _g("gpu_exporter_source_up", "1 if the data source answered on the last sample; no series "
       "for a source turned off (kubernetes, resourceslices with --no-kubernetes).",
       ("source",), "exporter"),
    _g("gpu_exporter_source_error_info",
       "Why a data source is down; present (=1) only while it is down.",
       ("source", "reason"), "exporter"),
    # Standard process metrics (the names every exporter serves), read from /proc.
    _g("process_resident_memory_bytes", "Resident memory of the exporter process.", (),
       "exporter"),
    _c("process_cpu_seconds_total", "User and system CPU time of the exporter process.", (),
       "exporter"),
    _g("process_open_fds", "Open file descriptors of the exporter process.", (), "exporter"),
    _g("process_start_time_seconds", "Start time of the exporter process since the epoch.",
       (), "exporter"),
    _c("gpu_exporter_label_values_replaced_total",
       "Label values that were not valid Unicode (lone surrogates), repaired with U+FFFD.",
       (), "exporter"),
    _c("gpu_exporter_kube_objects_dropped_total",
       "Objects from the Kubernetes API (kind: pod, ResourceSlice) this node's cache did not "
       "take, by reason: cache-full (it holds its maximum: 13,000 objects or 32 MiB parsed, "
       "per kind) or too-large (over the client's per-object bounds: 3 MiB, 50,000 JSON "
       "values); each reason logged once. No series until one is dropped.",
       ("kind", "reason"), "attribution"),
)

BY_NAME: dict[str, Family] = {f.name: f for f in FAMILIES}

# Which vendors' backends fill a device family (docs/metrics.md). The contract's families are
# filled by every backend whose library has the value ("all"); the collectors that read NVML
# itself are NVIDIA's; AMD's RAS families are AMD's.
_NVIDIA_COLLECTORS = frozenset({"clocks", "nvlink", "gpm"})
_VENDORS = {"gpu_pcie_throughput_bytes_per_second": "nvidia, amd, intel",
            "gpu_nvlink_throughput_bytes_per_second": "nvidia",
            "gpu_link_throughput_bytes_per_second": "nvidia, amd, intel",
            "gpu_xid_errors_total": "nvidia", "gpu_xid_last_timestamp_seconds": "nvidia",
            "gpu_vgpu_license_state": "nvidia",
            "gpu_error_events_total": "amd", "gpu_error_event_last_timestamp_seconds": "amd",
            "gpu_ras_errors_total": "amd", "gpu_partition_utilization_ratio": "intel",
            "gpu_partition_energy_joules_total": "intel"}


def vendors(family: Family) -> str:
    """'nvidia', 'amd', 'all' (or a list, 'nvidia, intel') for a device family (one with a
    `vendor` label); '' otherwise."""
    if "vendor" not in family.labels:
        return ""
    if family.collector in _NVIDIA_COLLECTORS:
        return "nvidia"
    return _VENDORS.get(family.name, "all")

# Reasons in the metric contract, mapped from NVML bit masks / policy enums by the collectors.
CLOCK_EVENT_REASONS = ("hw_thermal", "sw_thermal", "hw_power_brake", "sw_power_cap",
                       "hw_slowdown", "sync_boost", "idle")
THROTTLE_REASONS = ("power", "thermal", "reliability", "board_limit", "low_utilization",
                    "sync_boost")
NVLINK_ERROR_TYPES = ("crc_flit", "crc_data", "replay", "recovery")
