"""Level Zero Sysman through PyPI `pyzes` (ctypes over `libze_loader.so.1`, Debian `libze1`),
where it is installed: what sysfs does not say, a device's model name, its local memory in
use (per tile on a multi-tile GPU: `numSubdevices`, memory modules' `onSubdevice` /
`subdeviceId`), its PCIe byte counters, per-tile energy and its Xe Link ports' byte counters.
Optional: `pyzes` loads the library when imported and raises without it, so it is imported
here, lazily, and any failure means "absent" (one log line in the backend).

The calls follow pyzes 0.1.3 (its examples/pyzes_example.py; the subdevice fields, PCI stats,
power domains and their structs as pyzes.py defines them, Level Zero Sysman spec v1.x):
C-style count-then-fill enumeration with ctypes `byref`, every call returning a `ze_result_t`
(0 is success). The fabric port calls pyzes does not wrap are taken from the library it loaded,
with zes_api.h v1.8's signatures and struct. Devices are matched to sysfs by PCI address
(`zesDevicePciGetProperties`)."""

from __future__ import annotations

import ctypes
import logging
from typing import Any

from exporter.device.contract import MemoryUsage, pci_bdf

log = logging.getLogger(__name__)

SUCCESS = 0  # ZE_RESULT_SUCCESS
# zes_engine_group_t: the compute and the render engines, together (zes_api.h)
ENGINE_GROUP_COMPUTE_ALL = 1
ENGINE_GROUP_RENDER_ALL = 12
BUSY_GROUPS = (ENGINE_GROUP_COMPUTE_ALL, ENGINE_GROUP_RENDER_ALL)
STRING_PROPERTY_SIZE = 64  # ZES_STRING_PROPERTY_SIZE


def load_pyzes() -> tuple[Any, str]:
    """The pyzes module, or None and why (not installed, library missing, init failed)."""
    try:
        import pyzes  # type: ignore[import-not-found]
    except Exception as err:  # ModuleNotFoundError, OSError (no libze_loader), anything
        return None, f"{type(err).__name__}: {err}".splitlines()[0][:200]
    rc = pyzes.zesInit(0)
    if rc != SUCCESS:
        return None, f"zesInit returned {rc}"
    return pyzes, ""


class zes_fabric_port_handle_t(ctypes.c_void_p):
    """zes_api.h `zes_fabric_port_handle_t` (pyzes 0.1.3 does not wrap fabric ports)."""


class zes_fabric_port_throughput_t(ctypes.Structure):
    """zes_api.h v1.8 `zes_fabric_port_throughput_t`: a µs timestamp and the bytes received and
    sent ("includes all protocol overhead, not only the GPU traffic"); no stype."""

    _fields_ = [("timestamp", ctypes.c_uint64), ("rxCounter", ctypes.c_uint64),
                ("txCounter", ctypes.c_uint64)]


def _loader_function(zes: Any, name: str, argtypes: list[Any]) -> Any:
    """A Sysman function pyzes does not wrap, from the library pyzes loaded
    (`getFunctionPointerList`), with its C signature; None where the loader lacks it."""
    get = getattr(zes, "getFunctionPointerList", None)
    if get is None:
        return None
    try:
        fn = get(name)
    except Exception:  # AttributeError: an older loader without the symbol
        return None
    if hasattr(fn, "argtypes"):  # a ctypes function of the real library (a stand-in is not)
        fn.argtypes, fn.restype = argtypes, ctypes.c_int32  # ze_result_t
    return fn


class LevelZero:
    """Sysman devices by PCI address (`zes`: the pyzes module, or a stand-in in tests)."""

    def __init__(self, zes: Any) -> None:
        self._zes = zes
        self._devices: dict[str, Any] = {}  # BDF -> zes_device_handle_t
        self._bandwidth: dict[str, bool] = {}  # BDF -> haveBandwidthCounters

    def _enum(self, fn: Any, handle_type: Any, *parent: Any) -> list[Any]:
        count = ctypes.c_uint32(0)
        if fn(*parent, ctypes.byref(count), None) != SUCCESS or count.value == 0:
            return []
        handles = (handle_type * count.value)()
        if fn(*parent, ctypes.byref(count), handles) != SUCCESS:
            return []
        return list(handles)[:count.value]

    def refresh(self) -> None:
        zes = self._zes
        self._devices, self._bandwidth = {}, {}
        for driver in self._enum(zes.zesDriverGet, zes.zes_driver_handle_t):
            for device in self._enum(zes.zesDeviceGet, zes.zes_device_handle_t, driver):
                pci = zes.zes_pci_properties_t()
                pci.stype = zes.ZES_STRUCTURE_TYPE_PCI_PROPERTIES
                if zes.zesDevicePciGetProperties(device, ctypes.byref(pci)) != SUCCESS:
                    continue
                a = pci.address
                bdf = pci_bdf(f"{a.domain:04x}:{a.bus:02x}:{a.device:02x}.{a.function:x}")
                self._devices[bdf] = device
                self._bandwidth[bdf] = bool(pci.haveBandwidthCounters)

    def _properties(self, bdf: str) -> Any | None:
        """`zesDeviceGetProperties` of the device, or None. pyzes 0.1.3's
        `zes_device_properties_t` stops at `serialNumber`, while the library writes the whole
        struct of zes_api.h (five more 64-byte strings: boardNumber .. driverVersion): the
        struct is read from a buffer with room for them, never overrun."""
        device = self._devices.get(bdf)
        if device is None:
            return None
        struct = self._zes.zes_device_properties_t
        buffer = (ctypes.c_ubyte * (ctypes.sizeof(struct) + 5 * STRING_PROPERTY_SIZE))()
        props = struct.from_buffer(buffer)  # keeps `buffer` alive
        props.stype = self._zes.ZES_STRUCTURE_TYPE_DEVICE_PROPERTIES
        if self._zes.zesDeviceGetProperties(device, ctypes.byref(props)) != SUCCESS:
            return None
        return props

    def model(self, bdf: str) -> str | None:
        props = self._properties(bdf)
        if props is None:
            return None
        name = bytes(props.core.name).split(b"\0", 1)[0].decode("utf-8", "replace").strip()
        return name or None

    def uuid(self, bdf: str) -> bytes | None:
        """The device's 16-byte UUID (`core.uuid.id`); what it is made of:
        exporter/device/identity.py `level_zero_id`."""
        props = self._properties(bdf)
        return None if props is None else bytes(props.core.uuid.id)

    def subdevices(self, bdf: str) -> int | None:
        """`numSubdevices`: the tiles (0 for a single-tile GPU)."""
        props = self._properties(bdf)
        return None if props is None else int(props.numSubdevices)

    def _modules(self, bdf: str) -> list[tuple[int | None, int, int]]:
        """The device-local memory modules: (subdevice id or None, size, used bytes)."""
        zes, device = self._zes, self._devices.get(bdf)
        if device is None:
            return []
        out: list[tuple[int | None, int, int]] = []
        for module in self._enum(zes.zesDeviceEnumMemoryModules, zes.zes_mem_handle_t, device):
            props = zes.zes_mem_properties_t()
            props.stype = zes.ZES_STRUCTURE_TYPE_MEM_PROPERTIES
            state = zes.zes_mem_state_t()
            state.stype = zes.ZES_STRUCTURE_TYPE_MEM_STATE
            if zes.zesMemoryGetProperties(module, ctypes.byref(props)) != SUCCESS \
                    or props.location != zes.ZES_MEM_LOC_DEVICE \
                    or zes.zesMemoryGetState(module, ctypes.byref(state)) != SUCCESS:
                continue
            size = int(state.size)
            out.append((int(props.subdeviceId) if props.onSubdevice else None, size,
                        size - min(int(state.free), size)))
        return out

    def memory(self, bdf: str) -> MemoryUsage | None:
        """The device's local memory modules summed (size and size - free); None when it has
        none (an integrated GPU) or Sysman cannot say."""
        modules = self._modules(bdf)
        total, used = sum(m[1] for m in modules), sum(m[2] for m in modules)
        return MemoryUsage(float(total), float(used), float(total - used)) if total else None

    def tile_memory(self, bdf: str) -> dict[int, MemoryUsage]:
        """Local memory per subdevice (tile), from the modules whose `onSubdevice` is set."""
        out: dict[int, MemoryUsage] = {}
        for sub, size, used in self._modules(bdf):
            if sub is not None and size:
                old = out.get(sub, MemoryUsage(0.0, 0.0, 0.0))
                total = old.total_bytes + size
                in_use = old.used_bytes + used
                out[sub] = MemoryUsage(total, in_use, total - in_use)
        return out

    def engine_activity(self, bdf: str) -> dict[tuple[int | None, int], tuple[int, int]]:
        """(subdevice id or None, engine group) -> (`activeTime`, `timestamp`), µs, of the
        device's compute-all and render-all engine groups (`zesDeviceEnumEngineGroups`,
        `zes_engine_properties_t.onSubdevice` / `subdeviceId`, `zesEngineGetActivity`)."""
        zes, device = self._zes, self._devices.get(bdf)
        if device is None:
            return {}
        out: dict[tuple[int | None, int], tuple[int, int]] = {}
        for h in self._enum(zes.zesDeviceEnumEngineGroups, zes.zes_engine_handle_t, device):
            props = zes.zes_engine_properties_t()
            props.stype = zes.ZES_STRUCTURE_TYPE_ENGINE_PROPERTIES
            if zes.zesEngineGetProperties(h, ctypes.byref(props)) != SUCCESS \
                    or int(props.type) not in BUSY_GROUPS:
                continue
            stats = zes.zes_engine_stats_t()
            if zes.zesEngineGetActivity(h, ctypes.byref(stats)) != SUCCESS:
                continue
            sub = int(props.subdeviceId) if props.onSubdevice else None
            out[(sub, int(props.type))] = (int(stats.activeTime), int(stats.timestamp))
        return out

    def tile_energy(self, bdf: str) -> dict[int, tuple[int, int]]:
        """Subdevice id -> (`energy` µJ, `timestamp` µs) of the power domains on a subdevice
        (`zesDeviceEnumPowerDomains`, `zes_power_properties_t.onSubdevice` / `subdeviceId`,
        `zesPowerGetEnergyCounter`; pyzes 0.1.3's structs). The device-level domain (not on a
        subdevice) is the card's, read from hwmon."""
        zes, device = self._zes, self._devices.get(bdf)
        if device is None:
            return {}
        out: dict[int, tuple[int, int]] = {}
        for h in self._enum(zes.zesDeviceEnumPowerDomains, zes.zes_pwr_handle_t, device):
            props = zes.zes_power_properties_t()
            props.stype = zes.ZES_STRUCTURE_TYPE_POWER_PROPERTIES
            if zes.zesPowerGetProperties(h, ctypes.byref(props)) != SUCCESS \
                    or not props.onSubdevice:
                continue
            counter = zes.zes_power_energy_counter_t()
            if zes.zesPowerGetEnergyCounter(h, ctypes.byref(counter)) != SUCCESS:
                continue
            out[int(props.subdeviceId)] = (int(counter.energy), int(counter.timestamp))
        return out

    def fabric_counters(self, bdf: str) -> list[tuple[int, int, int, int]]:
        """Xe Link: (port index, rx bytes, tx bytes, timestamp µs) of each of the device's
        fabric ports (`zesDeviceEnumFabricPorts`, `zesFabricPortGetThroughput`, zes_api.h
        v1.8, called through the loader since pyzes does not wrap them); empty where the
        device has none or the loader lacks the calls."""
        zes, device = self._zes, self._devices.get(bdf)
        if device is None:
            return []
        enum = _loader_function(zes, "zesDeviceEnumFabricPorts", [
            zes.zes_device_handle_t, ctypes.POINTER(ctypes.c_uint32),
            ctypes.POINTER(zes_fabric_port_handle_t)])
        get = _loader_function(zes, "zesFabricPortGetThroughput", [
            zes_fabric_port_handle_t, ctypes.POINTER(zes_fabric_port_throughput_t)])
        if enum is None or get is None:
            return []
        out: list[tuple[int, int, int, int]] = []
        for i, port in enumerate(self._enum(enum, zes_fabric_port_handle_t, device)):
            stats = zes_fabric_port_throughput_t()
            if get(port, ctypes.byref(stats)) == SUCCESS:
                out.append((i, int(stats.rxCounter), int(stats.txCounter),
                            int(stats.timestamp)))
        return out

    def pci_counters(self, bdf: str) -> tuple[int, int, int] | None:
        """PCIe bytes received and sent since the driver loaded and the reading's time (µs),
        from `zesDevicePciGetStats` (`rxCounter`, `txCounter`, `timestamp`); None where the
        device has no bandwidth counters (`haveBandwidthCounters` false) or the call fails."""
        zes, device = self._zes, self._devices.get(bdf)
        if device is None or not self._bandwidth.get(bdf, False):
            return None
        stats = zes.zes_pci_stats_t()
        if zes.zesDevicePciGetStats(device, ctypes.byref(stats)) != SUCCESS:
            return None
        return int(stats.rxCounter), int(stats.txCounter), int(stats.timestamp)
