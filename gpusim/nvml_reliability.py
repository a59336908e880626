"""Simulated NVML: ECC errors, remapped rows, PCIe replays, NVLink state and errors, and field
values."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pynvml

from gpusim.model import GpuSpec
from gpusim.nvml_core import NvmlCore, SimDevice, nvml_error
from gpusim.traffic import Direction

_NVLINK_DATA = {pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: Direction.TX,
                pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: Direction.RX}


class ReliabilityQueries(NvmlCore):
    """Error counters driven by the scenario's faults, and nvmlDeviceGetFieldValues."""

    def nvmlDeviceGetTotalEccErrors(self, handle: SimDevice, error_type: int,
                                    counter_type: int) -> int:
        gpu, _, t = self._dev(handle, "ecc")
        if counter_type not in (pynvml.NVML_VOLATILE_ECC, pynvml.NVML_AGGREGATE_ECC):
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        faults = self._faults(gpu.index, "ecc", t)
        if error_type == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED:
            return sum(f.corrected for f in faults)
        if error_type == pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED:
            return sum(f.uncorrected for f in faults)
        raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlDeviceGetRemappedRows(self, handle: SimDevice) -> tuple[int, int, int, int]:
        gpu, _, t = self._dev(handle, "remapped_rows")
        faults = self._faults(gpu.index, "row_remap", t)
        return (sum(f.corrected for f in faults), sum(f.uncorrected for f in faults),
                int(any(f.pending for f in faults)), int(any(f.failure for f in faults)))

    def nvmlDeviceGetPcieReplayCounter(self, handle: SimDevice) -> int:
        gpu, _, t = self._dev(handle, "pcie_replay")
        return sum(f.count for f in self._faults(gpu.index, "pcie_replay", t))

    def _link(self, handle: SimDevice, link: int) -> tuple[GpuSpec, float]:
        gpu, _, t = self._dev(handle, "nvlink")
        if not 0 <= link < pynvml.NVML_NVLINK_MAX_LINKS:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if link >= gpu.nvlink_links:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu, t

    def nvmlDeviceGetNvLinkState(self, handle: SimDevice, link: int) -> int:
        gpu, t = self._link(handle, link)
        down = any(f.link == link for f in self._active(gpu.index, "nvlink_down", t))
        return int(pynvml.NVML_FEATURE_DISABLED if down else pynvml.NVML_FEATURE_ENABLED)

    def nvmlDeviceGetNvLinkErrorCounter(self, handle: SimDevice, link: int,
                                        counter: int) -> int:
        gpu, t = self._link(handle, link)
        names = {pynvml.NVML_NVLINK_ERROR_DL_REPLAY: "replay",
                 pynvml.NVML_NVLINK_ERROR_DL_RECOVERY: "recovery",
                 pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT: "crc_flit",
                 pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA: "crc_data"}
        if counter not in names:
            ecc = counter == pynvml.NVML_NVLINK_ERROR_DL_ECC_DATA
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED if ecc
                       else pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return sum(f.count for f in self._faults(gpu.index, "nvlink_error", t)
                   if f.link == link and f.error_type == names[counter])

    def _nvlink_data(self, gpu: GpuSpec, direction: Direction, link: int,
                     t: float) -> tuple[int, float] | None:
        """Data bytes over one link since the driver loaded, in KiB (scopeId = the link)."""
        if not 0 <= link < gpu.nvlink_links or self._unsupported(gpu, "nvlink_throughput", t):
            return None
        kib = self.traffic.link_bytes(gpu.index, link, direction, t) // 1024
        return pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, kib

    def nvmlDeviceGetFieldValues(self, handle: SimDevice,
                                 field_ids: Sequence[int | tuple[int, int]]) -> Any:
        gpu, _, t = self._dev(handle)
        values = (pynvml.c_nvmlFieldValue_t * len(field_ids))()
        stamp = int(self._clock() * 1e6)
        for i, fid in enumerate(field_ids):
            v = values[i]
            if isinstance(fid, tuple):
                v.fieldId, v.scopeId = fid
            else:
                v.fieldId = fid
            v.timestamp = stamp
            got = self._field(gpu, int(v.fieldId), int(v.scopeId), t)
            if got is None:
                v.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
                continue
            value_type, value = got
            v.nvmlReturn = pynvml.NVML_SUCCESS
            v.valueType = value_type
            if value_type == pynvml.NVML_VALUE_TYPE_DOUBLE:
                v.value.dVal = float(value)
            elif value_type == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT:
                v.value.uiVal = int(value)
            else:
                v.value.ullVal = int(value)
        return values

    def _field(self, gpu: GpuSpec, fid: int, scope: int, t: float) -> tuple[int, float] | None:
        if fid in _NVLINK_DATA:
            return self._nvlink_data(gpu, _NVLINK_DATA[fid], scope, t)
        uint, ull = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
        readers: dict[int, tuple[str, int, Callable[[], float]]] = {
            pynvml.NVML_FI_DEV_MEMORY_TEMP:
                ("memory_temperature", uint, lambda: round(self._memory_temperature(gpu, t))),
            pynvml.NVML_FI_DEV_POWER_INSTANT:
                ("power", uint, lambda: round(1000 * self._power_watts(
                    gpu, t, self._reading(gpu, t).util))),
            pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION:
                ("energy", ull, lambda: int(1000 * self._integrators[gpu.index].at(t)[0])),
            pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER:
                ("pcie_replay", ull, lambda: sum(
                    f.count for f in self._faults(gpu.index, "pcie_replay", t))),
            pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT:
                ("nvlink", uint, lambda: gpu.nvlink_links),
            pynvml.NVML_FI_DEV_REMAPPED_COR:
                ("remapped_rows", uint, lambda: sum(
                    f.corrected for f in self._faults(gpu.index, "row_remap", t))),
            pynvml.NVML_FI_DEV_REMAPPED_UNC:
                ("remapped_rows", uint, lambda: sum(
                    f.uncorrected for f in self._faults(gpu.index, "row_remap", t))),
            pynvml.NVML_FI_DEV_REMAPPED_PENDING:
                ("remapped_rows", uint, lambda: int(any(
                    f.pending for f in self._faults(gpu.index, "row_remap", t)))),
            pynvml.NVML_FI_DEV_REMAPPED_FAILURE:
                ("remapped_rows", uint, lambda: int(any(
                    f.failure for f in self._faults(gpu.index, "row_remap", t)))),
        }
        entry = readers.get(fid)
        if entry is None or self._unsupported(gpu, entry[0], t):
            return None
        if fid == pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT and gpu.nvlink_links == 0:
            return None
        with self._lock:
            return entry[1], entry[2]()
