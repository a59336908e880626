"""The NVML backend: NVIDIA GPUs through pynvml, or through the simulator's SimNVML, which
answers the same calls (`NvmlApi`). The only code that calls NVML for the contract's readings;
units are normalised here (mW -> W, mJ -> J, MHz -> Hz, percent -> 0-1)."""

from __future__ import annotations

import logging

from exporter.device.contract import (
    EventSource,
    GpuRef,
    GuestLicence,
    Interconnect,
    Inventory,
    MemoryUsage,
    MigRef,
    ProcessReader,
    Reliability,
    RowRemapping,
    Tally,
    Telemetry,
    Vendor,
    VirtualFunction,
)
from exporter.device.nvml_events import NvmlEventSource
from exporter.device.nvml_inventory import discover
from exporter.device.nvml_processes import NvmlProcessReader
from exporter.device.nvmlapi import NvmlApi
from exporter.nvmlcall import Reader, field_value, text
from exporter.pcidevices import nvidia_gpu_functions

log = logging.getLogger(__name__)

MHZ = 1_000_000.0
# nvml.h constants (stable ABI: pynvml and the simulator use the same numbers)
TEMPERATURE_GPU = 0  # NVML_TEMPERATURE_GPU
FI_DEV_MEMORY_TEMP = 82  # NVML_FI_DEV_MEMORY_TEMP
CLOCK_SM, CLOCK_MEM = 1, 2  # NVML_CLOCK_SM, NVML_CLOCK_MEM
# NVML_MEMORY_ERROR_TYPE_CORRECTED / _UNCORRECTED, NVML_VOLATILE_ECC
MEMORY_ERROR_CORRECTED, MEMORY_ERROR_UNCORRECTED, VOLATILE_ECC = 0, 1, 0
# NVML licence feature codes (nvmlGridLicenseFeatureCode_t)
FEATURES = {1: "vgpu", 2: "nvidia_rtx", 3: "gaming", 4: "compute"}


class NvmlBackend:
    """NVIDIA GPUs through NVML (`nvml`: the pynvml module or a SimNVML)."""

    vendor: Vendor = "nvidia"
    source = "nvml"
    library = "NVML"

    def __init__(self, nvml: NvmlApi) -> None:
        self._nvml = nvml

    @property
    def nvml(self) -> NvmlApi:
        return self._nvml

    def open(self) -> None:
        self._nvml.nvmlInit()

    def close(self) -> None:
        self._nvml.nvmlShutdown()

    def inventory(self, previous: Inventory | None) -> Inventory:
        return discover(self._nvml, previous)

    def expected_devices(self, sysfs_root: str) -> list[str] | None:
        return nvidia_gpu_functions(sysfs_root)

    def telemetry(self, gpu: GpuRef, tally: Tally) -> Telemetry:
        nv, h = self._nvml, gpu.handle
        r = Reader(nv, tally)
        # Temperature first: it is the cheapest call and tells us quickly if the GPU is lost.
        temp = r.call(nv.nvmlDeviceGetTemperature, h, TEMPERATURE_GPU)
        mem_temp = None
        fields = r.call(nv.nvmlDeviceGetFieldValues, h, [FI_DEV_MEMORY_TEMP])
        if fields:
            fv = fields[0]
            if getattr(fv, "nvmlReturn", 1) == 0:
                mem_temp = field_value(fv)
        power = r.call(nv.nvmlDeviceGetPowerUsage, h)  # mW
        limit = r.call(nv.nvmlDeviceGetEnforcedPowerLimit, h)  # mW
        energy = r.call(nv.nvmlDeviceGetTotalEnergyConsumption, h)  # mJ
        util = enc = dec = None
        if not gpu.mig_enabled:  # NVML has no device utilisation on MIG-enabled GPUs
            util = r.call(nv.nvmlDeviceGetUtilizationRates, h)
            enc = r.call(nv.nvmlDeviceGetEncoderUtilization, h)
            dec = r.call(nv.nvmlDeviceGetDecoderUtilization, h)
        mem = r.call(nv.nvmlDeviceGetMemoryInfo, h, version=nv.nvmlMemory_v2)
        if mem is None:
            mem = r.call(nv.nvmlDeviceGetMemoryInfo, h)
        sm = r.call(nv.nvmlDeviceGetClockInfo, h, CLOCK_SM)
        memclk = r.call(nv.nvmlDeviceGetClockInfo, h, CLOCK_MEM)
        return Telemetry(
            temperature_celsius=temp,
            memory_temperature_celsius=mem_temp,
            power_watts=None if power is None else power / 1000.0,
            power_limit_watts=None if limit is None else limit / 1000.0,
            energy_joules=None if energy is None else energy / 1000.0,
            utilization=None if util is None else util.gpu / 100.0,
            memory_utilization=None if util is None else util.memory / 100.0,
            encoder_utilization=None if enc is None else enc[0] / 100.0,
            decoder_utilization=None if dec is None else dec[0] / 100.0,
            memory=None if mem is None else MemoryUsage(
                mem.total, mem.used, mem.free, getattr(mem, "reserved", None)),
            sm_clock_hertz=None if sm is None else sm * MHZ,
            memory_clock_hertz=None if memclk is None else memclk * MHZ,
        )

    def reliability(self, gpu: GpuRef, tally: Tally) -> Reliability:
        nv, h = self._nvml, gpu.handle
        r = Reader(nv, tally)
        corrected = r.call(nv.nvmlDeviceGetTotalEccErrors, h, MEMORY_ERROR_CORRECTED,
                           VOLATILE_ECC)
        uncorrected = r.call(nv.nvmlDeviceGetTotalEccErrors, h, MEMORY_ERROR_UNCORRECTED,
                             VOLATILE_ECC)
        rows = r.call(nv.nvmlDeviceGetRemappedRows, h)
        replays = r.call(nv.nvmlDeviceGetPcieReplayCounter, h)
        return Reliability(
            ecc_corrected=corrected, ecc_uncorrected=uncorrected,
            row_remapping=None if rows is None else RowRemapping(
                int(rows[0]), int(rows[1]), bool(rows[2]), bool(rows[3])),
            pcie_replays=replays)

    def partition_memory(self, partition: MigRef, tally: Tally) -> MemoryUsage | None:
        mem = Reader(self._nvml, tally).call(self._nvml.nvmlDeviceGetMemoryInfo,
                                             partition.handle)
        return None if mem is None else MemoryUsage(mem.total, mem.used)

    def partition_utilization(self, partition: MigRef, tally: Tally) -> float | None:
        return None  # a MIG instance's activity is GPM's (the gpm collector)

    def interconnect(self, gpu: GpuRef, tally: Tally) -> Interconnect:
        # NVML's PCIe and NVLink traffic is the throughput collector's (GPM rates, the
        # driver's PCIe reading, NVLink field counters): it reads NVML itself
        return Interconnect()

    def process_reader(self) -> ProcessReader:
        return NvmlProcessReader(self._nvml)

    def virtual_functions(self, gpu: GpuRef, tally: Tally) -> list[VirtualFunction]:
        nv = self._nvml
        r = Reader(nv, tally)
        instances = r.call(nv.nvmlDeviceGetActiveVgpus, gpu.handle) or []
        util: dict[int, float] = {}
        for s in r.call(nv.nvmlDeviceGetVgpuUtilization, gpu.handle, 0) or []:
            util[int(s.vgpuInstance)] = int(s.smUtil.uiVal) / 100
        out = []
        for inst in instances:
            uuid = r.call(nv.nvmlVgpuInstanceGetMdevUUID, inst) or \
                r.call(nv.nvmlVgpuInstanceGetUUID, inst)
            if not uuid:
                continue  # nothing to name its series by
            type_id = r.call(nv.nvmlVgpuInstanceGetType, inst)
            name = r.call(nv.nvmlVgpuTypeGetName, type_id) if type_id is not None else None
            vm = r.call(nv.nvmlVgpuInstanceGetVmID, inst)
            fb = r.call(nv.nvmlVgpuTypeGetFramebufferSize, type_id) \
                if type_id is not None else None
            used = r.call(nv.nvmlVgpuInstanceGetFbUsage, inst)
            out.append(VirtualFunction(
                id=text(uuid), kind="vgpu", type_name=text(name or ""),
                vm=text(vm[0]) if vm else "",
                framebuffer_bytes=None if fb is None else int(fb),
                memory_used_bytes=None if used is None else int(used),
                utilization=util.get(int(inst))))
        return out

    def guest_licences(self, gpu: GpuRef, tally: Tally) -> list[GuestLicence]:
        feats = Reader(self._nvml, tally).call(self._nvml.nvmlDeviceGetGridLicensableFeatures,
                                               gpu.handle)
        if feats is None or not feats.isGridLicenseSupported:
            return []
        count = min(int(feats.licensableFeaturesCount), len(feats.gridLicensableFeatures))
        out = []
        for i in range(count):
            f = feats.gridLicensableFeatures[i]
            out.append(GuestLicence(FEATURES.get(int(f.featureCode), str(int(f.featureCode))),
                                    text(f.productName), int(f.featureState) == 1))
        return out

    def error_events(self) -> EventSource:
        return NvmlEventSource(self._nvml)

