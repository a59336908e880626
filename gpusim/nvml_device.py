"""Simulated NVML: device count, handles and identity (UUID, name, PCI, modes, attributes)."""

from __future__ import annotations

from typing import Any

import pynvml

from gpusim.nvml_core import NvmlCore, SimDevice, nvml_error


class DeviceQueries(NvmlCore):
    """Device handles and what identifies a device."""

    def nvmlDeviceGetHandleByIndex(self, index: int) -> SimDevice:
        self._check_init()
        if not isinstance(index, int) or not 0 <= index < len(self.scenario.gpus):
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return SimDevice(index)

    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> SimDevice:
        self._check_init()
        text = uuid.decode() if isinstance(uuid, bytes) else uuid
        for g in self.scenario.gpus:
            if g.uuid == text:
                return SimDevice(g.index)
            for m in g.mig or ():
                if m.uuid == text:
                    return SimDevice(g.index, m.index)
        raise nvml_error(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetHandleByPciBusId(self, bus_id: str | bytes) -> SimDevice:
        self._check_init()
        text = (bus_id.decode() if isinstance(bus_id, bytes) else bus_id).upper()
        for g in self.scenario.gpus:
            if g.pci_bus_id.upper() == text:
                return SimDevice(g.index)
        raise nvml_error(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetIndex(self, handle: SimDevice) -> int:
        gpu, _, _ = self._dev(handle)
        return gpu.index

    def nvmlDeviceGetMinorNumber(self, handle: SimDevice) -> int:
        gpu, _, _ = self._dev(handle)
        return gpu.index

    def nvmlDeviceGetUUID(self, handle: SimDevice) -> str:
        gpu, mig, _ = self._dev(handle, mig_ok=True)
        return mig.uuid if mig is not None else gpu.uuid

    def nvmlDeviceGetName(self, handle: SimDevice) -> str:
        gpu, mig, _ = self._dev(handle, mig_ok=True)
        return f"{gpu.model} MIG {mig.profile}" if mig is not None else gpu.model

    def nvmlDeviceGetPciInfo(self, handle: SimDevice) -> Any:
        gpu, _, _ = self._dev(handle)
        domain, bus, rest = gpu.pci_bus_id.split(":")
        info = pynvml.nvmlPciInfo_t()
        info.busId = gpu.pci_bus_id
        info.busIdLegacy = gpu.pci_bus_id[4:]
        info.domain = int(domain, 16)
        info.bus = int(bus, 16)
        info.device = int(rest.split(".")[0], 16)
        info.pciDeviceId = 0x233010DE
        info.pciSubSystemId = 0x16C110DE
        return info

    nvmlDeviceGetPciInfo_v3 = nvmlDeviceGetPciInfo

    def nvmlDeviceGetVbiosVersion(self, handle: SimDevice) -> str:
        gpu, _, _ = self._dev(handle)
        return gpu.vbios_version

    def nvmlDeviceGetVirtualizationMode(self, handle: SimDevice) -> int:
        gpu, _, _ = self._dev(handle)
        return gpu.virtualization_mode

    def nvmlDeviceGetPersistenceMode(self, handle: SimDevice) -> int:
        self._dev(handle)
        return int(pynvml.NVML_FEATURE_ENABLED)

    def nvmlDeviceGetComputeMode(self, handle: SimDevice) -> int:
        gpu, _, _ = self._dev(handle)
        return int(pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS if gpu.sharing.mode == "mps"
                   else pynvml.NVML_COMPUTEMODE_DEFAULT)

    def nvmlDeviceGetMigMode(self, handle: SimDevice) -> list[int]:
        gpu, _, _ = self._dev(handle)
        if gpu.mig_family is None:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        mode = int(gpu.mig is not None)
        return [mode, mode]

    def nvmlDeviceGetAttributes(self, handle: SimDevice) -> Any:
        gpu, mig, _ = self._dev(handle, mig_ok=True)
        attrs = pynvml.c_nvmlDeviceAttributes()
        if mig is not None:
            attrs.multiprocessorCount = mig.multiprocessors
            attrs.gpuInstanceSliceCount = mig.slices
            attrs.computeInstanceSliceCount = mig.slices
            attrs.memorySizeMB = mig.memory_bytes >> 20
            attrs.sharedCopyEngineCount = max(1, mig.slices)
            attrs.sharedDecoderCount = mig.slices // 2
            attrs.sharedJpegCount = mig.slices // 7
            attrs.sharedOfaCount = mig.slices // 7
        else:
            slices = gpu.mig_family.parent_slices if gpu.mig_family else 0
            attrs.multiprocessorCount = gpu.multiprocessors
            attrs.gpuInstanceSliceCount = slices
            attrs.computeInstanceSliceCount = slices
            attrs.memorySizeMB = gpu.memory_bytes >> 20
        return attrs

    nvmlDeviceGetAttributes_v2 = nvmlDeviceGetAttributes
