"""The AMD backend: AMD Instinct / Radeon GPUs through amdsmi (AMD's Python package over
libamd_smi.so), or through the simulator's SimAmdSmi, which answers the same calls
(`AmdSmiApi`). The only code that calls amdsmi; units are normalised here (MB -> bytes,
µJ -> J, MHz -> Hz, percent -> 0-1, µW -> W).

amdsmi reports device-wide activity, power and energy on a partitioned GPU's partition 0 only;
they are read there and are the whole GPU's. Per-partition usage comes from per-process data
(amd_processes.py). docs/backends.md says which contract fields AMD fills.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from exporter.device.amd_calls import AmdCalls, field, number, text
from exporter.device.amd_events import AmdEventSource
from exporter.device.amd_inventory import MIB, AmdGpu, discover
from exporter.device.amd_processes import AmdProcessReader
from exporter.device.amdsmiapi import AmdSmiApi, load_amdsmi
from exporter.device.contract import (
    DeviceBackend,
    EventSource,
    GpuRef,
    GuestLicence,
    Interconnect,
    Inventory,
    LinkTraffic,
    MemoryUsage,
    MigRef,
    ProcessReader,
    RasErrorCount,
    Reliability,
    RowRemapping,
    Tally,
    Telemetry,
    Vendor,
    VirtualFunction,
)
from exporter.device.nvmlapi import NvmlApi
from exporter.pcidevices import gpu_functions

if TYPE_CHECKING:
    from exporter.device.registry import LoadSpec

log = logging.getLogger(__name__)

MHZ = 1_000_000.0
KIB = 1024
MICRO = 1e-6
AMD_VENDOR = "0x1002"
# VGA, 3D, display "other" (Radeon) and processing accelerator (Instinct MI200/MI300)
AMD_GPU_CLASSES = ("0x0300", "0x0302", "0x0380", "0x1200")
HOST_MODE = 2  # AMDSMI_VIRTUALIZATION_MODE_HOST: the MxGPU (GIM) host
RAS_SEVERITIES = (("correctable", "correctable_count"), ("uncorrectable", "uncorrectable_count"),
                  ("deferred", "deferred_count"))


class AmdBackend:
    """AMD GPUs through amdsmi (`api`: the amdsmi module or a SimAmdSmi)."""

    vendor: Vendor = "amd"
    source = "amdsmi"
    library = "amdsmi"

    def __init__(self, api: AmdSmiApi | None = None, *,
                 loader: Callable[[], AmdSmiApi] = load_amdsmi,
                 clock_ns: Callable[[], int] = time.monotonic_ns,
                 event_interval: float = 5.0, proc_root: str | None = None,
                 node: str = "", pcie_period: float = 60.0,
                 pcie_spacing: float = 5.0) -> None:
        """`api` None: amdsmi is imported by the first `open()` (lazily: a node without
        libamd_smi.so gets one "amdsmi init failed: amdsmi: ..." line and retries, never an
        import-time traceback). `node`: this node's name, half of the `uuid` of a GPU
        without a chip-derived amdsmi UUID (exporter/device/identity.py). `pcie_period` /
        `pcie_spacing`: seconds between two PCIe estimates of one GPU / of any two GPUs (each
        blocks the caller one second)."""
        self.node = node
        self._loaded = api
        self._loader = loader
        self._clock_ns = clock_ns
        self._event_interval = event_interval  # seconds between reads of the CPER records
        self._proc_root = proc_root  # DRM fdinfo where amdsmi lists no processes; None: off
        self._pcie_period = pcie_period
        self._pcie_spacing = pcie_spacing
        self._pcie_read_at = -math.inf  # when any GPU's PCIe estimate was last read
        # uuid -> (when read, (tx, rx) bytes/s or None): the last estimate, re-emitted
        self._pcie: dict[str, tuple[float, tuple[float, float] | None]] = {}

    @property
    def _api(self) -> AmdSmiApi:
        if self._loaded is None:
            raise RuntimeError("amdsmi is not loaded: open() first")
        return self._loaded

    @property
    def api(self) -> AmdSmiApi:
        return self._api

    @property
    def nvml(self) -> NvmlApi | None:
        return None

    def open(self) -> None:
        if self._loaded is None:
            self._loaded = self._loader()  # AmdSmiUnavailable: one line
        self._loaded.amdsmi_init()

    def close(self) -> None:
        self._api.amdsmi_shut_down()

    def inventory(self, previous: Inventory | None) -> Inventory:
        return discover(self._api, previous, self.node)

    def expected_devices(self, sysfs_root: str) -> list[str] | None:
        return amd_gpu_functions(sysfs_root)

    def telemetry(self, gpu: GpuRef, tally: Tally) -> Telemetry:
        api = self._api
        r = AmdCalls(api, tally)
        dev = _amd(gpu)
        h = dev.primary
        # MI300 has no edge sensor: the hotspot (junction) is the one every AMD GPU has
        temp = r.call(api.amdsmi_get_temp_metric, h, api.AmdSmiTemperatureType.HOTSPOT,
                      api.AmdSmiTemperatureMetric.CURRENT)
        if temp is None:
            temp = r.call(api.amdsmi_get_temp_metric, h, api.AmdSmiTemperatureType.EDGE,
                          api.AmdSmiTemperatureMetric.CURRENT)
        mem_temp = r.call(api.amdsmi_get_temp_metric, h, api.AmdSmiTemperatureType.VRAM,
                          api.AmdSmiTemperatureMetric.CURRENT)
        power = r.call(api.amdsmi_get_power_info, h)
        watts = field(power, "socket_power", "current_socket_power", "average_socket_power")
        limit = field(power, "power_limit")
        if limit is None:
            cap = field(r.call(api.amdsmi_get_power_cap_info, h), "power_cap")  # µW
            limit = None if cap is None else cap * MICRO
        activity = r.call(api.amdsmi_get_gpu_activity, h)
        gfx = field(activity, "gfx_activity")
        umc = field(activity, "umc_activity")
        total = used = 0.0
        have_mem = False
        for m in dev.members:  # each partition holds its share of the memory
            vram = r.call(api.amdsmi_get_gpu_vram_usage, m)
            t, u = field(vram, "vram_total"), field(vram, "vram_used")
            if t is not None and u is not None:
                have_mem = True
                total, used = total + t * MIB, used + u * MIB
        sclk = field(r.call(api.amdsmi_get_clock_info, h, api.AmdSmiClkType.GFX), "clk")
        mclk = field(r.call(api.amdsmi_get_clock_info, h, api.AmdSmiClkType.MEM), "clk")
        return Telemetry(
            temperature_celsius=number(temp),
            memory_temperature_celsius=number(mem_temp),
            power_watts=watts,
            power_limit_watts=limit,
            energy_joules=self._energy(r, h),
            utilization=None if gfx is None else gfx / 100.0,
            memory_utilization=None if umc is None else umc / 100.0,
            memory=MemoryUsage(total, used, total - used) if have_mem else None,
            sm_clock_hertz=None if sclk is None else sclk * MHZ,
            memory_clock_hertz=None if mclk is None else mclk * MHZ,
        )

    def _energy(self, r: AmdCalls, h: object) -> float | None:
        """Joules since the driver loaded: energy_accumulator x counter_resolution is µJ
        (the counter counts units of the resolution the library reports with it). Older
        releases name the counter `power` only."""
        info = r.call(self._api.amdsmi_get_energy_count, h)
        ticks = field(info, "energy_accumulator", "power")
        resolution = field(info, "counter_resolution")
        if ticks is None or resolution is None:
            return None
        return ticks * resolution * MICRO

    def partition_utilization(self, partition: MigRef, tally: Tally) -> float | None:
        # amdsmi reports activity on partition 0 only; a partition's use is its processes'
        # (the container families)
        return None

    def interconnect(self, gpu: GpuRef, tally: Tally) -> Interconnect:
        """XGMI data per link from `amdsmi_get_gpu_metrics_info`: `xgmi_read_data_acc` (data
        this GPU read over the link: rx) and `xgmi_write_data_acc` (tx), KB since the driver
        loaded (amdsmi.h `amdsmi_gpu_metrics_t`: "XGMI accumulated data transfer size (KB)"),
        read at the metrics' `system_clock_counter` (ns). A link reading "N/A" (the struct's
        UINT64_MAX: not supported) has no counter. PCIe has no per-direction byte counter in
        amdsmi; the PCIe rates are the driver's one-second estimate (`_pcie_estimate`)."""
        r = AmdCalls(self._api, tally)
        metrics = r.call(self._api.amdsmi_get_gpu_metrics_info, _amd(gpu).primary) or {}

        def per_link(key: str) -> list[int | None]:
            values = metrics.get(key)
            if not isinstance(values, list):
                return []
            return [None if (v := number(x)) is None else int(v) * KIB for x in values]

        reads, writes = per_link("xgmi_read_data_acc"), per_link("xgmi_write_data_acc")
        links = tuple(
            LinkTraffic("xgmi", i, writes[i] if i < len(writes) else None,
                        reads[i] if i < len(reads) else None)
            for i in range(max(len(reads), len(writes)))
            if (i < len(reads) and reads[i] is not None)
            or (i < len(writes) and writes[i] is not None))
        stamp = number(metrics.get("system_clock_counter"))
        pcie = self._pcie_estimate(r, gpu)
        return Interconnect(links=links, timestamp_seconds=None if stamp is None else stamp / 1e9,
                            pcie_tx_bytes_per_second=None if pcie is None else pcie[0],
                            pcie_rx_bytes_per_second=None if pcie is None else pcie[1])

    def _pcie_estimate(self, r: AmdCalls, gpu: GpuRef) -> tuple[float, float] | None:
        """PCIe (tx, rx) bytes per second: `amdsmi_get_gpu_pci_throughput` reads the amdgpu
        `pcie_bw` file, whose driver counts the messages the GPU received and the posted
        requests it sent over a one-second sleep (soc15_get_pcie_usage) and gives the max
        payload size: messages x payload is an upper bound of the bytes, the estimate the
        driver's documentation intends. rocm_smi parses the file's first number (received)
        into `sent` and its second (sent) into `received`: the keys are read swapped.

        Each call blocks one second in the driver, so one GPU is read at most every
        `pcie_period` seconds and any GPU at most every `pcie_spacing`; in between the last
        estimate is given again."""
        now = self._clock_ns() / 1e9
        taken, value = self._pcie.get(gpu.uuid, (-math.inf, None))
        if now - taken < self._pcie_period or now - self._pcie_read_at < self._pcie_spacing:
            return value
        self._pcie_read_at = now
        info = r.call(self._api.amdsmi_get_gpu_pci_throughput, _amd(gpu).primary)
        rx, tx, mps = (field(info, k) for k in ("sent", "received", "max_pkt_sz"))
        value = None if rx is None or tx is None or not mps else (tx * mps, rx * mps)
        self._pcie[gpu.uuid] = (now, value)
        return value

    def reliability(self, gpu: GpuRef, tally: Tally) -> Reliability:
        """ECC totals of all RAS blocks and the counts per block (deferred errors only per
        block: the totals have no field for them); retired pages as `RowRemapping` (reserved
        pages are uncorrectable retirements, pending ones wait for a reset, unreservable ones
        failed)."""
        api = self._api
        r = AmdCalls(api, tally)
        h = _amd(gpu).primary
        ecc = r.call(api.amdsmi_get_gpu_total_ecc_count, h)
        pages = r.call(api.amdsmi_get_gpu_bad_page_info, h)
        rows = None
        if pages is not None:
            status = [text(p.get("status")).upper() for p in pages]
            rows = RowRemapping(correctable=0,
                                uncorrectable=sum(s == "RESERVED" for s in status),
                                pending=any(s == "PENDING" for s in status),
                                failed=any(s == "UNRESERVABLE" for s in status))
        replays = r.call(api.amdsmi_get_gpu_pci_replay_counter, h)
        corr, uncorr = field(ecc, "correctable_count"), field(ecc, "uncorrectable_count")
        return Reliability(
            ecc_corrected=None if corr is None else int(corr),
            ecc_uncorrected=None if uncorr is None else int(uncorr),
            row_remapping=rows, pcie_replays=None if replays is None else int(replays),
            ras_errors=self._ras_blocks(r, h))

    def _ras_blocks(self, r: AmdCalls, h: object) -> tuple[RasErrorCount, ...]:
        """Per RAS block whose error reporting is enabled: its correctable, uncorrectable and
        deferred counts (block names lower case, as `gpu_ras_errors_total{block}`)."""
        api = self._api
        out: list[RasErrorCount] = []
        for state in r.call(api.amdsmi_get_gpu_ras_block_features_enabled, h) or []:
            name = text(state.get("block"))
            if text(state.get("status")) != "ENABLED" or not name:
                continue
            try:
                block = api.AmdSmiGpuBlock[name]
            except KeyError:
                continue  # a block this package's enum does not know
            counts = r.call(api.amdsmi_get_gpu_ecc_count, h, block)
            for severity, key in RAS_SEVERITIES:
                n = field(counts, key)
                if n is not None:
                    out.append(RasErrorCount(name.lower(), severity, int(n)))
        return tuple(out)

    def partition_memory(self, partition: MigRef, tally: Tally) -> MemoryUsage | None:
        vram = AmdCalls(self._api, tally).call(self._api.amdsmi_get_gpu_vram_usage,
                                               partition.handle)
        t, u = field(vram, "vram_total"), field(vram, "vram_used")
        return None if t is None or u is None else MemoryUsage(t * MIB, u * MIB)

    def process_reader(self) -> ProcessReader:
        fallback = None
        if self._proc_root is not None:
            from exporter.device.fdinfo import DrmFdinfo, FdinfoProcessReader

            fallback = FdinfoProcessReader(DrmFdinfo(self._proc_root), lambda g: _amd(g).bdf)
        return AmdProcessReader(lambda: self._api, self._clock_ns, fallback)

    def virtual_functions(self, gpu: GpuRef, tally: Tally) -> list[VirtualFunction]:
        """MxGPU: the VFs of a GPU on a GIM host, by VF PCI address (what the AMD device plugin
        hands a KubeVirt VM, through the VF's IOMMU group). Empty elsewhere."""
        api = self._api
        r = AmdCalls(api, tally)
        h = _amd(gpu).primary
        mode = number((r.call(api.amdsmi_get_gpu_virtualization_mode, h) or {}).get("mode"))
        if mode is not None and int(mode) != HOST_MODE:
            return []
        # the ROCm (bare metal, guest) library has no VF functions: NOT_SUPPORTED, absent
        enabled = number((r.call(api.amdsmi_get_num_vf, h) or {}).get("num_vf_enabled"))
        if not enabled:
            return []
        fb_by_vf = {int(p["vf_id"]): field(p.get("fb"), "fb_size")
                    for p in r.call(api.amdsmi_get_vf_partition_info, h) or []
                    if number(p.get("vf_id")) is not None}
        out = []
        for i in range(int(enabled)):
            vf = r.call(api.amdsmi_get_vf_handle_from_vf_index, h, i)
            if vf is None:
                continue
            bdf = text(r.call(api.amdsmi_get_vf_bdf, vf))
            if not bdf:
                continue
            fb = fb_by_vf.get(i)
            guest = r.call(api.amdsmi_get_guest_data, vf)
            used = field(guest, "fb_usage")
            out.append(VirtualFunction(
                id=bdf, kind="sriov_vf",
                type_name="" if fb is None else f"MxGPU {int(fb) // 1024}GB",
                vm="", framebuffer_bytes=None if fb is None else int(fb * MIB),
                memory_used_bytes=None if used is None else int(used * MIB),
                utilization=None))
        return out

    def guest_licences(self, gpu: GpuRef, tally: Tally) -> list[GuestLicence]:
        return []  # MxGPU has no licensing

    def error_events(self) -> EventSource:
        """RAS events from the GPUs' CPER records, with their AFIDs (amd_events.py)."""
        return AmdEventSource(lambda: self._api, self._event_interval)


def probe(spec: LoadSpec, auto: bool) -> DeviceBackend:
    """The AMD backend for `--device-backend` (exporter/device/registry.py): present when
    sysfs lists an AMD GPU (absent otherwise, auto or named). A present backend without amdsmi
    is down with one line ("amdsmi init failed: amdsmi: libamd_smi.so not found ..."),
    retried, like a missing NVML on a node with NVIDIA GPUs. amdsmi itself is imported by the
    sampler's open(), never here."""
    from exporter.device.registry import BackendAbsent
    from exporter.nvml_loader import load_amd_backend

    if spec.amdsmi != "real":
        # ConfigError for a bad --amdsmi
        return load_amd_backend(spec.amdsmi, spec.clock, spec.node)
    if not amd_gpu_functions(spec.sysfs_root):
        raise BackendAbsent(f"sysfs ({spec.sysfs_root}) lists no AMD GPU")
    return AmdBackend(proc_root=spec.proc_root, node=spec.node)


def amd_gpu_functions(sysfs_root: str = "/sys") -> list[str] | None:
    """Sorted PCI addresses of the AMD GPUs' physical functions (MxGPU VFs, which have a
    `physfn` link, are not GPUs of this node); None when sysfs cannot be read."""
    return gpu_functions(sysfs_root, AMD_VENDOR, AMD_GPU_CLASSES, physical_only=True)


def _amd(gpu: GpuRef) -> AmdGpu:
    if not isinstance(gpu.handle, AmdGpu):
        raise TypeError(f"GPU {gpu.uuid} is not an AMD backend's device")
    return gpu.handle
