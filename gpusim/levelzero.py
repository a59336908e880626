"""A simulated `pyzes` module: the Level Zero Sysman calls the Intel backend makes
(exporter/device/intel_levelzero.py), with pyzes 0.1.3's names, struct fields, constants and
calling convention (ctypes `byref` out-parameters, count-then-fill enumeration, a
`ze_result_t` return), over a list of devices. A multi-tile device (Data Center GPU Max)
reports `numSubdevices` and memory modules on its subdevices (`onSubdevice`, `subdeviceId`);
PCIe byte counters come from `zesDevicePciGetStats` (pyzes.py's `zes_pci_stats_t`), energy
from power domains (`zesDeviceEnumPowerDomains`, one per subdevice and one for the device),
Xe Link bytes from fabric ports, which pyzes does not wrap: reached through its
`getFunctionPointerList` as on the real loader (zes_api.h v1.8's structs)."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from typing import Any

ZE_RESULT_SUCCESS = 0
ZE_RESULT_ERROR_UNSUPPORTED_FEATURE = 0x78000003
ZE_RESULT_ERROR_INVALID_ARGUMENT = 0x78000004
ZES_STRUCTURE_TYPE_DEVICE_PROPERTIES = 0x1
ZES_STRUCTURE_TYPE_PCI_PROPERTIES = 0x2
ZES_STRUCTURE_TYPE_ENGINE_PROPERTIES = 0x5
ZES_ENGINE_GROUP_COMPUTE_ALL = 1
ZES_ENGINE_GROUP_MEDIA_ALL = 2
ZES_STRUCTURE_TYPE_MEM_PROPERTIES = 0xB
ZES_STRUCTURE_TYPE_POWER_PROPERTIES = 0xD
ZES_STRUCTURE_TYPE_MEM_STATE = 0x1E
ZES_MEM_LOC_SYSTEM = 0
ZES_MEM_LOC_DEVICE = 1


class zes_driver_handle_t(ctypes.c_void_p):
    pass


class zes_device_handle_t(ctypes.c_void_p):
    pass


class zes_mem_handle_t(ctypes.c_void_p):
    pass


class ze_device_uuid_t(ctypes.Structure):
    _fields_ = [("id", ctypes.c_ubyte * 16)]


class ze_device_properties_t(ctypes.Structure):
    _fields_ = [("stype", ctypes.c_int32), ("pNext", ctypes.c_void_p),
                ("vendorId", ctypes.c_uint32), ("deviceId", ctypes.c_uint32),
                ("uuid", ze_device_uuid_t), ("name", ctypes.c_char * 256)]


def pci_uuid(device_id: int, bdf: tuple[int, int, int, int], revision: int = 0) -> bytes:
    """The UUID compute-runtime builds from a device's PCI location where it reads none from
    the chip (26.31.39395.13 zes_os_sysman_imp.cpp `DeviceUUID`: vendor 0x8086, device,
    revision, domain as little-endian u16s, then bus, device, function, four zero bytes and
    the subdevice, 0 for the root device)."""
    domain, bus, dev, fn = bdf
    return b"".join(v.to_bytes(2, "little") for v in (0x8086, device_id, revision, domain)) \
        + bytes((bus, dev, fn, 0, 0, 0, 0, 0))


def telemetry_uuid(chip_id: bytes) -> bytes:
    """The UUID compute-runtime reads from a Data Center GPU Max's PMT telemetry: 8 bytes of
    the chip's, then zeros, byte 15 the subdevice (product_helper_uuid_xehp_and_later.inl)."""
    return chip_id[:8].ljust(16, b"\0")


class zes_device_properties_t(ctypes.Structure):
    _fields_ = [("stype", ctypes.c_int32), ("pNext", ctypes.c_void_p),
                ("core", ze_device_properties_t), ("numSubdevices", ctypes.c_uint32),
                ("modelName", ctypes.c_char * 64)]


class zes_pci_address_t(ctypes.Structure):
    _fields_ = [("domain", ctypes.c_uint32), ("bus", ctypes.c_uint32),
                ("device", ctypes.c_uint32), ("function", ctypes.c_uint32)]


class zes_pci_speed_t(ctypes.Structure):
    _fields_ = [("gen", ctypes.c_int32), ("width", ctypes.c_int32),
                ("maxBandwidth", ctypes.c_int64)]


class zes_pci_properties_t(ctypes.Structure):
    _fields_ = [("stype", ctypes.c_int32), ("pNext", ctypes.c_void_p),
                ("address", zes_pci_address_t), ("maxSpeed", zes_pci_speed_t),
                ("haveBandwidthCounters", ctypes.c_uint8),
                ("havePacketCounters", ctypes.c_uint8), ("haveReplayCounters", ctypes.c_uint8)]


class zes_pci_stats_t(ctypes.Structure):
    # no stype: the spec's zes_pci_stats_t is not an extensible structure
    _fields_ = [("timestamp", ctypes.c_uint64), ("replayCounter", ctypes.c_uint64),
                ("packetCounter", ctypes.c_uint64), ("rxCounter", ctypes.c_uint64),
                ("txCounter", ctypes.c_uint64), ("speed", zes_pci_speed_t)]


class zes_engine_handle_t(ctypes.c_void_p):
    pass


class zes_engine_properties_t(ctypes.Structure):
    _fields_ = [("stype", ctypes.c_int32), ("pNext", ctypes.c_void_p),
                ("type", ctypes.c_uint32), ("onSubdevice", ctypes.c_uint8),
                ("subdeviceId", ctypes.c_uint32)]


class zes_engine_stats_t(ctypes.Structure):
    _fields_ = [("activeTime", ctypes.c_uint64), ("timestamp", ctypes.c_uint64)]


class zes_pwr_handle_t(ctypes.c_void_p):
    pass


class zes_power_properties_t(ctypes.Structure):
    _fields_ = [("stype", ctypes.c_int32), ("pNext", ctypes.c_void_p),
                ("onSubdevice", ctypes.c_uint8), ("subdeviceId", ctypes.c_uint32),
                ("canControl", ctypes.c_uint8), ("isEnergyThresholdSupported", ctypes.c_uint8),
                ("defaultLimit", ctypes.c_int32), ("minLimit", ctypes.c_int32),
                ("maxLimit", ctypes.c_int32)]


class zes_power_energy_counter_t(ctypes.Structure):
    # no stype, as pyzes defines it: energy µJ, timestamp µs
    _fields_ = [("energy", ctypes.c_uint64), ("timestamp", ctypes.c_uint64)]


class zes_mem_properties_t(ctypes.Structure):
    _fields_ = [("stype", ctypes.c_int32), ("pNext", ctypes.c_void_p),
                ("type", ctypes.c_int32), ("onSubdevice", ctypes.c_uint8),
                ("subdeviceId", ctypes.c_uint32), ("location", ctypes.c_int32),
                ("physicalSize", ctypes.c_uint64)]


class zes_mem_state_t(ctypes.Structure):
    _fields_ = [("stype", ctypes.c_int32), ("pNext", ctypes.c_void_p),
                ("health", ctypes.c_int32), ("free", ctypes.c_uint64),
                ("size", ctypes.c_uint64)]


@dataclass
class SimZesMemory:
    size: int
    free: int
    location: int = ZES_MEM_LOC_DEVICE
    subdevice: int | None = None  # the tile it is on (onSubdevice, subdeviceId)


@dataclass
class SimZesEngine:
    """An engine group and its activity counter (µs busy, at `timestamp` µs)."""

    type: int
    subdevice: int | None = None
    active_us: int = 0
    timestamp_us: int = 0


@dataclass
class SimZesPower:
    """A power domain's energy counter (µJ since the driver loaded, at `timestamp_us`)."""

    subdevice: int | None = None  # the tile it is on; None: the whole device
    energy_uj: int = 0
    timestamp_us: int = 0


@dataclass
class SimZesFabricPort:
    """An Xe Link port's byte counters (since the driver loaded, at `timestamp_us`)."""

    rx: int = 0
    tx: int = 0
    timestamp_us: int = 0


@dataclass
class SimZesDevice:
    bdf: tuple[int, int, int, int]  # domain, bus, device, function
    name: str
    memory: list[SimZesMemory] = field(default_factory=list)
    subdevices: int = 0  # numSubdevices: tiles of a multi-tile GPU, else 0
    engines: list[SimZesEngine] = field(default_factory=list)
    # PCIe bytes since the driver loaded and the reading's time (µs); None: no counters
    pci_rx: int | None = None
    pci_tx: int = 0
    timestamp_us: int = 0
    uuid: bytes = bytes(16)  # core.uuid.id: pci_uuid() or telemetry_uuid(); zeros: none
    power: list[SimZesPower] = field(default_factory=list)
    fabric: list[SimZesFabricPort] = field(default_factory=list)


def _out(ref: Any) -> Any:
    """The object a `byref` argument points at."""
    return ref._obj


def _id(handle: Any) -> int:
    return int(handle.value if hasattr(handle, "value") else handle)


class SimZes:
    """Use as the pyzes module: `IntelBackend(sysman=lambda: (SimZes(devices), ""))`."""

    ZE_RESULT_SUCCESS = ZE_RESULT_SUCCESS
    ZES_STRUCTURE_TYPE_DEVICE_PROPERTIES = ZES_STRUCTURE_TYPE_DEVICE_PROPERTIES
    ZES_STRUCTURE_TYPE_PCI_PROPERTIES = ZES_STRUCTURE_TYPE_PCI_PROPERTIES
    ZES_STRUCTURE_TYPE_MEM_PROPERTIES = ZES_STRUCTURE_TYPE_MEM_PROPERTIES
    ZES_STRUCTURE_TYPE_MEM_STATE = ZES_STRUCTURE_TYPE_MEM_STATE
    ZES_MEM_LOC_SYSTEM = ZES_MEM_LOC_SYSTEM
    ZES_MEM_LOC_DEVICE = ZES_MEM_LOC_DEVICE
    zes_driver_handle_t = zes_driver_handle_t
    zes_device_handle_t = zes_device_handle_t
    zes_mem_handle_t = zes_mem_handle_t
    zes_engine_handle_t = zes_engine_handle_t
    zes_engine_properties_t = zes_engine_properties_t
    zes_engine_stats_t = zes_engine_stats_t
    ZES_STRUCTURE_TYPE_ENGINE_PROPERTIES = ZES_STRUCTURE_TYPE_ENGINE_PROPERTIES
    zes_device_properties_t = zes_device_properties_t
    zes_pci_properties_t = zes_pci_properties_t
    zes_pci_stats_t = zes_pci_stats_t
    zes_mem_properties_t = zes_mem_properties_t
    zes_mem_state_t = zes_mem_state_t
    zes_pwr_handle_t = zes_pwr_handle_t
    zes_power_properties_t = zes_power_properties_t
    zes_power_energy_counter_t = zes_power_energy_counter_t
    ZES_STRUCTURE_TYPE_POWER_PROPERTIES = ZES_STRUCTURE_TYPE_POWER_PROPERTIES

    def __init__(self, devices: list[SimZesDevice], fabric_calls: bool = True) -> None:
        self.devices = devices
        self.calls: dict[str, int] = {}
        self.fabric_calls = fabric_calls  # False: a loader without the fabric port functions

    def getFunctionPointerList(self, name: str) -> Any:
        """pyzes's access to a library function it does not wrap (here the fabric port calls,
        with the C calling convention); AttributeError for a symbol the library lacks, as
        ctypes raises it."""
        exported = {"zesDeviceEnumFabricPorts": self._enum_fabric_ports,
                    "zesFabricPortGetThroughput": self._fabric_port_throughput}
        if not self.fabric_calls or name not in exported:
            raise AttributeError(f"libze_loader.so.1: undefined symbol: {name}")
        return exported[name]

    def _enum_fabric_ports(self, handle: Any, p_count: Any, handles: Any) -> int:
        self._count("zesDeviceEnumFabricPorts")
        dev = self._device(handle)
        if dev is None:
            return ZE_RESULT_ERROR_INVALID_ARGUMENT
        i = _id(handle)
        return self._fill([i << 8 | p for p in range(len(dev.fabric))], p_count, handles)

    def _fabric_port_throughput(self, handle: Any, stats: Any) -> int:
        h = _id(handle)
        dev = self._device(h >> 8)
        if dev is None or (h & 0xFF) >= len(dev.fabric):
            return ZE_RESULT_ERROR_INVALID_ARGUMENT
        port = dev.fabric[h & 0xFF]
        out = _out(stats)
        out.timestamp, out.rxCounter, out.txCounter = port.timestamp_us, port.rx, port.tx
        return ZE_RESULT_SUCCESS

    def _count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    @staticmethod
    def _fill(items: list[int], p_count: Any, handles: Any) -> int:
        count = _out(p_count)
        if handles is None:
            count.value = len(items)
            return ZE_RESULT_SUCCESS
        n = min(count.value, len(items))
        for i in range(n):
            handles[i] = items[i]
        count.value = n
        return ZE_RESULT_SUCCESS

    def zesInit(self, flags: int) -> int:
        self._count("zesInit")
        return ZE_RESULT_SUCCESS

    def zesDriverGet(self, p_count: Any, handles: Any) -> int:
        self._count("zesDriverGet")
        return self._fill([1], p_count, handles)

    def zesDeviceGet(self, driver: Any, p_count: Any, handles: Any) -> int:
        self._count("zesDeviceGet")
        return self._fill(list(range(1, len(self.devices) + 1)), p_count, handles)

    def _device(self, handle: Any) -> SimZesDevice | None:
        i = _id(handle) - 1
        return self.devices[i] if 0 <= i < len(self.devices) else None

    def zesDevicePciGetProperties(self, handle: Any, props: Any) -> int:
        self._count("zesDevicePciGetProperties")
        dev = self._device(handle)
        if dev is None:
            return ZE_RESULT_ERROR_INVALID_ARGUMENT
        a = _out(props).address
        a.domain, a.bus, a.device, a.function = dev.bdf
        _out(props).haveBandwidthCounters = int(dev.pci_rx is not None)
        return ZE_RESULT_SUCCESS

    def zesDevicePciGetStats(self, handle: Any, stats: Any) -> int:
        self._count("zesDevicePciGetStats")
        dev = self._device(handle)
        if dev is None:
            return ZE_RESULT_ERROR_INVALID_ARGUMENT
        if dev.pci_rx is None:
            return ZE_RESULT_ERROR_UNSUPPORTED_FEATURE
        out = _out(stats)
        out.rxCounter, out.txCounter, out.timestamp = dev.pci_rx, dev.pci_tx, dev.timestamp_us
        return ZE_RESULT_SUCCESS

    def zesDeviceGetProperties(self, handle: Any, props: Any) -> int:
        self._count("zesDeviceGetProperties")
        dev = self._device(handle)
        if dev is None:
            return ZE_RESULT_ERROR_INVALID_ARGUMENT
        _out(props).core.name = dev.name.encode()
        _out(props).core.uuid.id[:] = list(dev.uuid)
        _out(props).numSubdevices = dev.subdevices
        return ZE_RESULT_SUCCESS

    def zesDeviceEnumMemoryModules(self, handle: Any, p_count: Any,
                                   handles: Any) -> int:
        self._count("zesDeviceEnumMemoryModules")
        i = _id(handle)
        dev = self._device(handle)
        if dev is None:
            return ZE_RESULT_ERROR_INVALID_ARGUMENT
        return self._fill([i << 8 | m for m in range(len(dev.memory))], p_count, handles)

    def zesDeviceEnumEngineGroups(self, handle: Any, p_count: Any, handles: Any) -> int:
        self._count("zesDeviceEnumEngineGroups")
        dev = self._device(handle)
        if dev is None:
            return ZE_RESULT_ERROR_INVALID_ARGUMENT
        i = _id(handle)
        return self._fill([i << 8 | e for e in range(len(dev.engines))], p_count, handles)

    def _engine(self, handle: Any) -> SimZesEngine | None:
        h = _id(handle)
        dev = self._device(h >> 8)
        return dev.engines[h & 0xFF] if dev is not None and (h & 0xFF) < len(dev.engines) \
            else None

    def zesEngineGetProperties(self, handle: Any, props: Any) -> int:
        engine = self._engine(handle)
        if engine is None:
            return ZE_RESULT_ERROR_INVALID_ARGUMENT
        out = _out(props)
        out.type = engine.type
        out.onSubdevice = int(engine.subdevice is not None)
        out.subdeviceId = engine.subdevice or 0
        return ZE_RESULT_SUCCESS

    def zesEngineGetActivity(self, handle: Any, stats: Any) -> int:
        engine = self._engine(handle)
        if engine is None:
            return ZE_RESULT_ERROR_INVALID_ARGUMENT
        _out(stats).activeTime, _out(stats).timestamp = engine.active_us, engine.timestamp_us
        return ZE_RESULT_SUCCESS

    def _module(self, handle: Any) -> SimZesMemory | None:
        h = _id(handle)
        dev = self._device(h >> 8)
        return dev.memory[h & 0xFF] if dev is not None and (h & 0xFF) < len(dev.memory) \
            else None

    def zesMemoryGetProperties(self, handle: Any, props: Any) -> int:
        mem = self._module(handle)
        if mem is None:
            return ZE_RESULT_ERROR_INVALID_ARGUMENT
        _out(props).location = mem.location
        _out(props).physicalSize = mem.size
        _out(props).onSubdevice = int(mem.subdevice is not None)
        _out(props).subdeviceId = mem.subdevice or 0
        return ZE_RESULT_SUCCESS

    def zesMemoryGetState(self, handle: Any, state: Any) -> int:
        mem = self._module(handle)
        if mem is None:
            return ZE_RESULT_ERROR_INVALID_ARGUMENT
        _out(state).size, _out(state).free = mem.size, mem.free
        return ZE_RESULT_SUCCESS

    def zesDeviceEnumPowerDomains(self, handle: Any, p_count: Any, handles: Any) -> int:
        self._count("zesDeviceEnumPowerDomains")
        dev = self._device(handle)
        if dev is None:
            return ZE_RESULT_ERROR_INVALID_ARGUMENT
        i = _id(handle)
        return self._fill([i << 8 | p for p in range(len(dev.power))], p_count, handles)

    def _power(self, handle: Any) -> SimZesPower | None:
        h = _id(handle)
        dev = self._device(h >> 8)
        return dev.power[h & 0xFF] if dev is not None and (h & 0xFF) < len(dev.power) \
            else None

    def zesPowerGetProperties(self, handle: Any, props: Any) -> int:
        power = self._power(handle)
        if power is None:
            return ZE_RESULT_ERROR_INVALID_ARGUMENT
        _out(props).onSubdevice = int(power.subdevice is not None)
        _out(props).subdeviceId = power.subdevice or 0
        return ZE_RESULT_SUCCESS

    def zesPowerGetEnergyCounter(self, handle: Any, counter: Any) -> int:
        power = self._power(handle)
        if power is None:
            return ZE_RESULT_ERROR_INVALID_ARGUMENT
        _out(counter).energy, _out(counter).timestamp = power.energy_uj, power.timestamp_us
        return ZE_RESULT_SUCCESS
