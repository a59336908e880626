"""Scenario files for the simulated node: load a YAML file, validate every key, and return
frozen dataclasses that the simulated NVML module and the Kubernetes side share.

Every error is a ConfigError naming the file, the key path (`gpus[2].mig[0].profile`) and what
was expected. docs/scenarios.md describes the format.
"""

from __future__ import annotations

import hashlib
import math
import re
import uuid as uuidlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import numpy as np
import numpy.typing as npt
import yaml

from exporter.errors import ConfigError

T = TypeVar("T")
D = TypeVar("D")
FloatArray = npt.NDArray[np.float64]

# ---------------------------------------------------------------------------------------------
# Units

_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
_SIZE_UNITS = {
    "": 1, "b": 1,
    "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
}
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([a-zA-Z]*)")


def parse_duration(value: object) -> float | None:
    """'90s', '20m', '2h', '7d', '1h30m', '500ms' or a number of seconds; None if malformed."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value) if math.isfinite(value) and value >= 0 else None
    if not isinstance(value, str):
        return None
    text = value.strip().replace(" ", "")
    pos, total = 0, 0.0
    for m in _DURATION_PART.finditer(text):
        if m.start() != pos:
            return None
        total += float(m.group(1)) * _DURATION_UNITS[m.group(2)]
        pos = m.end()
    return total if pos == len(text) and pos > 0 else None


def parse_size(value: object) -> int | None:
    """'512MiB', '80GiB', '1.5GB' or a number of bytes; None if malformed."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 0 else None
    if isinstance(value, float):
        return int(value) if math.isfinite(value) and value >= 0 else None
    if not isinstance(value, str):
        return None
    m = _SIZE.fullmatch(value.strip())
    if m is None or m.group(2).lower() not in _SIZE_UNITS:
        return None
    return int(float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()])


# ---------------------------------------------------------------------------------------------
# Time-varying values


@dataclass(frozen=True)
class Signal:
    """A value over scenario time t (seconds): a constant, a sine, or steps.

    sine: min + (max - min) * (1 + sin(2π (t + phase) / period)) / 2
    steps: the value of the last step whose time is <= t (the first value before it).
    """

    kind: str  # const | sine | steps
    value: float = 0.0
    lo: float = 0.0
    hi: float = 0.0
    period: float = 1.0
    phase: float = 0.0
    times: tuple[float, ...] = ()
    values: tuple[float, ...] = ()

    @staticmethod
    def const(value: float) -> Signal:
        return Signal("const", value=value)

    def at(self, t: float) -> float:
        if self.kind == "const":
            return self.value
        if self.kind == "sine":
            s = math.sin(2.0 * math.pi * (t + self.phase) / self.period)
            return self.lo + (self.hi - self.lo) * (1.0 + s) / 2.0
        i = int(np.searchsorted(self.times, t, side="right")) - 1
        return self.values[max(i, 0)]

    def at_many(self, ts: FloatArray) -> FloatArray:
        if self.kind == "const":
            return np.full(ts.shape, self.value, dtype=np.float64)
        if self.kind == "sine":
            s = np.sin(2.0 * np.pi * (ts + self.phase) / self.period)
            out: FloatArray = self.lo + (self.hi - self.lo) * (1.0 + s) / 2.0
            return out
        idx = np.searchsorted(np.asarray(self.times), ts, side="right") - 1
        picked: FloatArray = np.asarray(self.values, dtype=np.float64)[np.maximum(idx, 0)]
        return picked

    @property
    def maximum(self) -> float:
        if self.kind == "const":
            return self.value
        if self.kind == "sine":
            return max(self.lo, self.hi)
        return max(self.values)


# ---------------------------------------------------------------------------------------------
# The scenario model

SHARING_MODES = ("exclusive", "time-slicing", "mps")
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
    "process_utilization": "nvmlDeviceGetProcessUtilization",
    "events": "nvmlDeviceRegisterEvents",
}
VIRTUALIZATION_MODES = {"none": 0, "passthrough": 1, "vgpu": 2, "host_vgpu": 3, "host_vsga": 4}
NOT_MIG = 0xFFFFFFFF


@dataclass(frozen=True)
class MigFamily:
    """MIG geometry of one GPU family: compute slices, and per profile size its memory slices
    (of 8) and SM count. `labels` maps memory slices to the profile's memory label."""

    parent_slices: int
    memory_slices: int
    labels: dict[int, str]
    sms: dict[int, int]
    # (compute slices, memory slices) of each profile, "+me" variants added for 1g
    shapes: tuple[tuple[int, int], ...]

    def profiles(self) -> dict[str, tuple[int, int]]:
        out: dict[str, tuple[int, int]] = {}
        for g, mem in self.shapes:
            out[f"{g}g.{self.labels[mem]}"] = (g, mem)
        smallest = min(self.labels)
        out[f"1g.{self.labels[smallest]}+me"] = (1, smallest)
        return out


_SEVEN = ((1, 1), (1, 2), (2, 2), (3, 4), (4, 4), (7, 8))
_HOPPER_SMS = {1: 16, 2: 32, 3: 60, 4: 64, 7: 132}
_AMPERE_SMS = {1: 14, 2: 28, 3: 42, 4: 56, 7: 98}
# (model keyword, memory GiB of the whole GPU) -> geometry; the nearest memory size wins.
MIG_FAMILIES: dict[tuple[str, int], MigFamily] = {
    ("A100", 40): MigFamily(7, 8, {1: "5gb", 2: "10gb", 4: "20gb", 8: "40gb"}, _AMPERE_SMS,
                            _SEVEN),
    ("A100", 80): MigFamily(7, 8, {1: "10gb", 2: "20gb", 4: "40gb", 8: "80gb"}, _AMPERE_SMS,
                            _SEVEN),
    ("H100", 80): MigFamily(7, 8, {1: "10gb", 2: "20gb", 4: "40gb", 8: "80gb"}, _HOPPER_SMS,
                            _SEVEN),
    ("H100", 94): MigFamily(7, 8, {1: "12gb", 2: "24gb", 4: "47gb", 8: "94gb"}, _HOPPER_SMS,
                            _SEVEN),
    ("H200", 141): MigFamily(7, 8, {1: "18gb", 2: "35gb", 4: "71gb", 8: "141gb"}, _HOPPER_SMS,
                             _SEVEN),
    ("A30", 24): MigFamily(4, 4, {1: "6gb", 2: "12gb", 4: "24gb"}, {1: 14, 2: 28, 4: 56},
                           ((1, 1), (2, 2), (4, 4))),
}
# Default GPU instance ids by profile size, in the order NVML hands them out on A100/H100.
_GI_POOLS = {7: (0,), 4: (1,), 3: (1, 2), 2: (3, 4, 5), 1: (7, 8, 9, 10, 11, 12, 13)}
# SM counts of whole GPUs, by model keyword (first match wins).
_SM_COUNTS = (("H100 PCIe", 114), ("H100", 132), ("H200", 132), ("A100", 108), ("A30", 56),
              ("A10", 72), ("L40", 142), ("L4", 58), ("T4", 40), ("V100", 80))
_GPM_MODELS = ("H100", "H200", "H800", "GH200", "B100", "B200", "GB200")
_PCI_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)


def mig_family(model: str, memory_bytes: int) -> MigFamily | None:
    candidates = [(abs(gib - memory_bytes / (1 << 30)), fam)
                  for (kw, gib), fam in MIG_FAMILIES.items() if kw in model]
    return min(candidates, key=lambda c: c[0])[1] if candidates else None


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

    @property
    def mig_enabled(self) -> bool:
        return self.mig is not None


@dataclass(frozen=True)
class UnitRef:
    """A device unit a container holds: a GPU, a MIG instance, or one replica of either."""

    gpu: int
    mig: int | None = None
    replica: int | None = None


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
    process_count: int = field(default=0)  # process slots; for deterministic PIDs


def stable_uuid(*parts: str) -> str:
    """A uuid4-format UUID derived from the parts: the same scenario gives the same UUIDs."""
    digest = hashlib.sha256("\x1f".join(parts).encode()).digest()
    return str(uuidlib.UUID(bytes=digest[:16], version=4))


def stable_hex(length: int, *parts: str) -> str:
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:length]


# ---------------------------------------------------------------------------------------------
# Validation helpers


class _Node:
    """A mapping being read at a key path; records which keys were read to reject unknown ones."""

    def __init__(self, file: str, path: str, data: object) -> None:
        if not isinstance(data, Mapping):
            raise ConfigError(file, path or "(top level)", "a mapping", _show(data))
        self.file, self.path, self.data = file, path, data
        self.read: set[str] = set()

    def key(self, name: str) -> str:
        return f"{self.path}.{name}" if self.path else name

    def has(self, name: str) -> bool:
        return name in self.data

    def raw(self, name: str) -> object:
        self.read.add(name)
        return self.data.get(name)

    def get(self, name: str, conv: Callable[[str, str, object], T], default: D) -> T | D:
        self.read.add(name)
        if name not in self.data or self.data[name] is None:
            return default
        return conv(self.file, self.key(name), self.data[name])

    def need(self, name: str, conv: Callable[[str, str, object], T], what: str) -> T:
        self.read.add(name)
        if name not in self.data or self.data[name] is None:
            raise ConfigError(self.file, self.key(name), f"{what} (required)", None)
        return conv(self.file, self.key(name), self.data[name])

    def done(self) -> None:
        for k in self.data:
            if k not in self.read:
                allowed = ", ".join(sorted(self.read))
                raise ConfigError(self.file, self.key(str(k)),
                                  f"one of the known keys ({allowed})", f"unknown key {k!s}")


def _show(value: object) -> object:
    return value if isinstance(value, str | int | float | bool) or value is None else \
        type(value).__name__


def _str(file: str, key: str, v: object) -> str:
    if not isinstance(v, str) or not v.strip():
        raise ConfigError(file, key, "a non-empty string", _show(v))
    return v


def _int(file: str, key: str, v: object) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ConfigError(file, key, "an integer", _show(v))
    return v


def _nonneg_int(file: str, key: str, v: object) -> int:
    n = _int(file, key, v)
    if n < 0:
        raise ConfigError(file, key, "an integer >= 0", v)
    return n


def _number(file: str, key: str, v: object) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise ConfigError(file, key, "a number", _show(v))
    return float(v)


def _bool(file: str, key: str, v: object) -> bool:
    if not isinstance(v, bool):
        raise ConfigError(file, key, "true or false", _show(v))
    return v


def _duration(file: str, key: str, v: object) -> float:
    d = parse_duration(v)
    if d is None:
        raise ConfigError(file, key, "a duration like 90s, 20m, 2h, 7d (or seconds)", _show(v))
    return d


def _size(file: str, key: str, v: object) -> int:
    s = parse_size(v)
    if s is None:
        raise ConfigError(file, key, "a size like 512MiB, 80GiB (or bytes)", _show(v))
    return s


def _choice(options: Sequence[str]) -> Callable[[str, str, object], str]:
    def conv(file: str, key: str, v: object) -> str:
        if v not in options:
            raise ConfigError(file, key, "one of " + ", ".join(options), _show(v))
        return str(v)
    return conv


def _list(file: str, key: str, v: object) -> list[object]:
    if not isinstance(v, list):
        raise ConfigError(file, key, "a list", _show(v))
    return v


def _int_range(lo: int, hi: int) -> Callable[[str, str, object], int]:
    def conv(file: str, key: str, v: object) -> int:
        x = _int(file, key, v)
        if not lo <= x <= hi:
            raise ConfigError(file, key, f"an integer between {lo} and {hi}", v)
        return x
    return conv


def _ranged(lo: float, hi: float | None,
            scalar: Callable[[str, str, object], float]) -> Callable[[str, str, object], float]:
    def conv(file: str, key: str, v: object) -> float:
        x = scalar(file, key, v)
        if x < lo or (hi is not None and x > hi):
            rng = f"between {lo:g} and {hi:g}" if hi is not None else f">= {lo:g}"
            raise ConfigError(file, key, f"a value {rng}", v)
        return x
    return conv


def _signal(scalar: Callable[[str, str, object], float],
            what: str) -> Callable[[str, str, object], Signal]:
    """A constant, {sine: {min, max, period, phase}} or {steps: [[t, v], ...]} of `scalar`."""

    def conv(file: str, key: str, v: object) -> Signal:
        if not isinstance(v, Mapping):
            return Signal.const(scalar(file, key, v))
        if len(v) != 1 or next(iter(v)) not in ("sine", "steps"):
            raise ConfigError(file, key, f"{what}, or a mapping with one key: sine or steps",
                              ", ".join(map(str, v)))
        kind = next(iter(v))
        if kind == "sine":
            n = _Node(file, f"{key}.sine", v["sine"])
            lo = n.need("min", scalar, what)
            hi = n.need("max", scalar, what)
            period = n.need("period", _duration, "a duration")
            phase = n.get("phase", _duration, 0.0)
            n.done()
            if period <= 0:
                raise ConfigError(file, f"{key}.sine.period", "a duration > 0", v["sine"]["period"])
            return Signal("sine", lo=lo, hi=hi, period=period, phase=phase)
        steps = _list(file, f"{key}.steps", v["steps"])
        if not steps:
            raise ConfigError(file, f"{key}.steps", "at least one [time, value] pair", "[]")
        times: list[float] = []
        values: list[float] = []
        for i, step in enumerate(steps):
            k = f"{key}.steps[{i}]"
            if not isinstance(step, list) or len(step) != 2:
                raise ConfigError(file, k, "a [time, value] pair", _show(step))
            t = _duration(file, k, step[0])
            if times and t <= times[-1]:
                raise ConfigError(file, k, "step times in increasing order", step[0])
            times.append(t)
            values.append(scalar(file, k, step[1]))
        return Signal("steps", times=tuple(times), values=tuple(values))

    return conv


def _size_float(file: str, key: str, v: object) -> float:
    return float(_size(file, key, v))


_ratio = _ranged(0.0, 1.0, _number)
_ratio_signal = _signal(_ratio, "a number between 0 and 1")
_size_signal = _signal(_size_float, "a size like 4GiB")
_temp_signal = _signal(_ranged(-50.0, 150.0, _number), "a temperature in °C")
_watts_signal = _signal(_ranged(0.0, None, _number), "watts")
_mhz_signal = _signal(_ranged(0.0, None, _number), "MHz")
_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")
MAX_EXPLICIT_PID = 99_999  # automatic PIDs start at 100000


def _uuid(prefix: str) -> Callable[[str, str, object], str]:
    def conv(file: str, key: str, v: object) -> str:
        s = _str(file, key, v)
        body = s[len(prefix):] if s.startswith(prefix) else s
        if not _UUID.fullmatch(body):
            raise ConfigError(file, key,
                              f"a UUID like {prefix}xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", s)
        return prefix + body.lower()
    return conv


def _k8s_name(file: str, key: str, v: object) -> str:
    s = _str(file, key, v)
    if not _NAME.fullmatch(s) or len(s) > 253:
        raise ConfigError(file, key, "a Kubernetes name (lower-case letters, digits, '-', '.')",
                          s)
    return s


# ---------------------------------------------------------------------------------------------
# Parsing


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario file. Raises ConfigError for anything malformed."""
    file = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError(file, "", "a readable scenario file", err.strerror) from None
    return loads_scenario(text, file)


def loads_scenario(text: str, file: str = "<scenario>") -> Scenario:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(err, "problem", None) or str(err)
        raise ConfigError(file, "", f"valid YAML{where}", problem) from None
    return parse_scenario(data, file)


def parse_scenario(data: object, file: str = "<scenario>") -> Scenario:
    top = _Node(file, "", data)
    node = top.need("node", _k8s_name, "the node name")
    driver_version = top.get("driver_version", lambda f, k, v: _str(f, k, str(v)), "550.54.15")
    cuda_version = top.get("cuda_version", _nonneg_int, 12040)
    duration = top.get("duration", _duration, None)
    mig_strategy = top.get("mig_strategy", _choice(("mixed", "single")), "mixed")
    cgroup_driver = top.get("cgroup_driver", _choice(("systemd", "cgroupfs")), "systemd")
    runtime = top.get("container_runtime", _choice(("containerd", "cri-o")), "containerd")
    unavailable, driver_error = 0.0, "driver_not_loaded"
    if top.has("driver") and top.raw("driver") is not None:
        d = _Node(file, "driver", top.raw("driver"))
        unavailable = d.get("unavailable_until", _duration, 0.0)
        driver_error = d.get("error", _choice(("driver_not_loaded", "library_not_found")),
                             "driver_not_loaded")
        d.done()
    top.read.add("driver")

    gpus = _parse_gpus(file, node, top.need("gpus", _list, "a list of GPUs"))
    n_gpus = len(gpus)
    pods = tuple(_parse_pod(file, i, p, gpus)
                 for i, p in enumerate(top.get("pods", _list, [])))
    hosts = tuple(_parse_host_process(file, i, p, gpus)
                  for i, p in enumerate(top.get("host_processes", _list, [])))
    faults = tuple(_parse_fault(file, i, f, gpus)
                   for i, f in enumerate(top.get("faults", _list, [])))
    xids = tuple(_parse_xid(file, i, x, gpus)
                 for i, x in enumerate(top.get("xids", _list, [])))
    top.done()
    if n_gpus == 0:
        raise ConfigError(file, "gpus", "at least one GPU", "[]")
    _check_pod_names(file, pods)
    _check_units(file, pods, gpus)
    _check_pids(file, pods, hosts)
    slots = sum(_process_slots(c) for p in pods for c in p.containers) + len(hosts)
    return Scenario(
        file=file, node=node, driver_version=driver_version, cuda_version=cuda_version,
        gpus=gpus, pods=pods, host_processes=hosts, faults=faults, xids=xids,
        driver_unavailable_until=unavailable, driver_error=driver_error,
        mig_strategy=mig_strategy, cgroup_driver=cgroup_driver, container_runtime=runtime,
        duration=duration, process_count=slots,
    )


def _parse_sharing(file: str, key: str, v: object) -> Sharing:
    n = _Node(file, key, v)
    mode = n.need("mode", _choice(SHARING_MODES), "a sharing mode")
    replicas = n.get("replicas", _int_range(1, 1024), 1 if mode == "exclusive" else 0)
    resource = n.get("resource", _str, "")
    n.done()
    if mode != "exclusive" and replicas < 2:
        raise ConfigError(file, f"{key}.replicas", f"an integer >= 2 for {mode}",
                          n.data.get("replicas"))
    if mode == "exclusive" and replicas != 1:
        raise ConfigError(file, f"{key}.replicas", "1 (or no replicas) for exclusive", replicas)
    return Sharing(mode, int(replicas), resource)


def _parse_telemetry(file: str, key: str, v: object, limit: float) -> Telemetry:
    n = _Node(file, key, v if v is not None else {})
    t = Telemetry(
        temperature=n.get("temperature", _temp_signal, None),
        memory_temperature=n.get("memory_temperature", _temp_signal, None),
        power_watts=n.get("power_watts", _watts_signal, None),
        idle_power_watts=n.get("idle_power_watts", _ranged(0.0, limit, _number), 0.1 * limit),
        sm_clock_mhz=n.get("sm_clock_mhz", _mhz_signal, Signal.const(1410.0)),
        mem_clock_mhz=n.get("mem_clock_mhz", _mhz_signal, Signal.const(1593.0)),
        utilization=n.get("utilization", _ratio_signal, Signal.const(0.0)),
        encoder_utilization=n.get("encoder_utilization", _ratio_signal, Signal.const(0.0)),
        decoder_utilization=n.get("decoder_utilization", _ratio_signal, Signal.const(0.0)),
    )
    n.done()
    return t


def _parse_gpus(file: str, node: str, entries: list[object]) -> tuple[GpuSpec, ...]:
    out: list[GpuSpec] = []
    for i, raw in enumerate(entries):
        key = f"gpus[{i}]"
        n = _Node(file, key, raw)
        model = n.need("model", _str, "the NVML device name, e.g. NVIDIA H100 80GB HBM3")
        count = n.get("count", _int_range(1, 64), 1)
        memory = n.need("memory", _size, "a size like 80GiB")
        if memory < (1 << 30):
            raise ConfigError(file, f"{key}.memory", "at least 1GiB", n.data["memory"])
        reserved = n.get("reserved_memory", _size, min(512 << 20, memory // 64))
        limit = n.need("power_limit_watts", _ranged(1.0, 5000.0, _number), "watts")
        family = mig_family(model, memory)
        given_uuid = n.get("uuid", _uuid("GPU-"), "")
        if given_uuid and count > 1:
            raise ConfigError(file, f"{key}.uuid", "no uuid when count > 1 (UUIDs are derived)",
                              given_uuid)
        pci = n.get("pci_bus_id", _str, "")
        if pci and count > 1:
            raise ConfigError(file, f"{key}.pci_bus_id", "no pci_bus_id when count > 1", pci)
        vbios = n.get("vbios_version", _str, "96.00.61.00.01")
        virt = VIRTUALIZATION_MODES[n.get("virtualization_mode",
                                          _choice(tuple(VIRTUALIZATION_MODES)), "none")]
        sms = n.get("multiprocessors", _int_range(1, 1024),
                    next((c for kw, c in _SM_COUNTS if kw in model), 80))
        gpm = n.get("gpm", _bool, any(kw in model for kw in _GPM_MODELS))
        links = n.get("nvlink_links", _int_range(0, 36), 0)
        not_supported = frozenset(_parse_fields(file, f"{key}.not_supported",
                                                n.get("not_supported", _list, [])))
        telemetry = _parse_telemetry(file, f"{key}.telemetry", n.raw("telemetry"), limit)
        sharing = n.get("sharing", _parse_sharing, Sharing())
        mig_raw = n.raw("mig")
        n.done()
        for c in range(count):
            index = len(out)
            uuid = given_uuid or "GPU-" + stable_uuid(node, "gpu", str(index))
            migs: tuple[MigSpec, ...] | None = None
            if mig_raw is not None:
                if family is None:
                    raise ConfigError(file, f"{key}.mig", "no mig: this model has no MIG "
                                      "(MIG models: A100, A30, H100, H200)", model)
                if sharing.mode != "exclusive":
                    raise ConfigError(file, f"{key}.sharing", "sharing on each mig instance, "
                                      "not on a MIG-enabled GPU", sharing.mode)
                migs = _parse_migs(file, f"{key}.mig", mig_raw, family, memory, node, index)
            out.append(GpuSpec(
                index=index, model=model, uuid=uuid, memory_bytes=memory,
                reserved_bytes=reserved, power_limit_watts=limit,
                pci_bus_id=pci or _pci_bus_id(index), vbios_version=vbios,
                virtualization_mode=virt, multiprocessors=int(sms), mig_family=family,
                mig=migs, gpm=gpm, nvlink_links=int(links), not_supported=not_supported,
                telemetry=telemetry, sharing=sharing,
            ))
            del c
    return tuple(out)


def _pci_bus_id(index: int) -> str:
    bus = _PCI_BUSES[index] if index < len(_PCI_BUSES) else 0x20 + index
    return f"00000000:{bus:02X}:00.0"


def _parse_fields(file: str, key: str, items: list[object]) -> list[str]:
    conv = _choice(tuple(FIELDS))
    return [conv(file, f"{key}[{i}]", v) for i, v in enumerate(items)]


def _parse_migs(file: str, key: str, raw: object, family: MigFamily, memory: int, node: str,
                gpu_index: int) -> tuple[MigSpec, ...]:
    items = _list(file, key, raw)
    profiles = family.profiles()
    used_gi: set[int] = set()
    parsed: list[tuple[str, int, int, int | None, int, Sharing]] = []
    for i, item in enumerate(items):
        n = _Node(file, f"{key}[{i}]", item)
        profile = n.need("profile", _str, "a MIG profile like 3g.40gb")
        if profile not in profiles:
            raise ConfigError(file, f"{key}[{i}].profile",
                              "one of " + ", ".join(profiles), profile)
        gi = n.get("gpu_instance_id", _int_range(0, 14), None)
        ci = n.get("compute_instance_id", _int_range(0, 7), 0)
        sharing = n.get("sharing", _parse_sharing, Sharing())
        n.done()
        g, mem = profiles[profile]
        parsed.append((profile, g, mem, None if gi is None else int(gi), int(ci), sharing))
        if gi is not None:
            if gi in used_gi:
                raise ConfigError(file, f"{key}[{i}].gpu_instance_id", "a unique id", gi)
            used_gi.add(int(gi))
    if sum(p[1] for p in parsed) > family.parent_slices:
        raise ConfigError(file, key, f"at most {family.parent_slices} compute slices in all",
                          "+".join(p[0] for p in parsed))
    if sum(p[2] for p in parsed) > family.memory_slices:
        raise ConfigError(file, key, f"at most {family.memory_slices} memory slices in all",
                          "+".join(p[0] for p in parsed))
    out: list[MigSpec] = []
    for i, (profile, g, mem, gi, ci, sharing) in enumerate(parsed):
        if gi is None:
            pool = [x for x in _GI_POOLS.get(g, range(1, 15)) if x not in used_gi]
            gi = pool[0] if pool else max(used_gi | {0}) + 1
            used_gi.add(gi)
        out.append(MigSpec(
            index=i, profile=profile,
            uuid="MIG-" + stable_uuid(node, "mig", str(gpu_index), str(i)),
            gpu_instance_id=gi, compute_instance_id=ci, slices=g, memory_slices=mem,
            memory_bytes=memory * mem // family.memory_slices,
            multiprocessors=family.sms[g], sharing=sharing,
        ))
    return tuple(out)


def _unit(file: str, key: str, raw: object, gpus: tuple[GpuSpec, ...]) -> UnitRef:
    if isinstance(raw, int) and not isinstance(raw, bool):
        ref = UnitRef(gpu=raw)
        n = None
    else:
        n = _Node(file, key, raw)
        ref = UnitRef(gpu=n.need("gpu", _int, "a GPU index"),
                      mig=n.get("mig", _nonneg_int, None),
                      replica=n.get("replica", _nonneg_int, None))
        n.done()
    gkey = f"{key}.gpu" if n is not None else key
    if not 0 <= ref.gpu < len(gpus):
        raise ConfigError(file, gkey, f"a GPU index 0..{len(gpus) - 1}", ref.gpu)
    gpu = gpus[ref.gpu]
    sharing = gpu.sharing
    if ref.mig is not None:
        if gpu.mig is None:
            raise ConfigError(file, f"{key}.mig", f"no mig: GPU {ref.gpu} has MIG disabled",
                              ref.mig)
        if ref.mig >= len(gpu.mig):
            raise ConfigError(file, f"{key}.mig",
                              f"a MIG instance index 0..{len(gpu.mig) - 1} of GPU {ref.gpu}",
                              ref.mig)
        sharing = gpu.mig[ref.mig].sharing
    elif gpu.mig is not None:
        raise ConfigError(file, gkey, f"a MIG instance ({{gpu: {ref.gpu}, mig: N}}): GPU "
                          f"{ref.gpu} has MIG enabled", raw)
    if sharing.mode == "exclusive":
        if ref.replica is not None:
            raise ConfigError(file, f"{key}.replica", "no replica: the device is not shared",
                              ref.replica)
    elif ref.replica is None:
        raise ConfigError(file, key, f"a replica ({{..., replica: N}}): the device is shared "
                          f"({sharing.mode})", raw)
    elif ref.replica >= sharing.replicas:
        raise ConfigError(file, f"{key}.replica", f"a replica 0..{sharing.replicas - 1}",
                          ref.replica)
    return ref


def _parse_process(file: str, key: str, raw: object, n_units: int) -> ProcessSpec:
    n = _Node(file, key, raw)
    p = ProcessSpec(
        name=n.get("name", _str, "python"),
        memory=n.need("memory", _size_signal, "a size like 4GiB"),
        sm_util=n.get("sm_util", _ratio_signal, Signal.const(0.0)),
        mem_util=n.get("mem_util", _ratio_signal, None),
        tensor_util=n.get("tensor_util", _ratio_signal, None),
        pid=n.get("pid", _int_range(1, MAX_EXPLICIT_PID), None),
        unit=n.get("unit", _nonneg_int, None),
    )
    n.done()
    if p.unit is not None and p.unit >= n_units:
        raise ConfigError(file, f"{key}.unit", f"an index into the container's gpus "
                          f"0..{n_units - 1}", p.unit)
    return p


def _parse_container(file: str, key: str, raw: object,
                     gpus: tuple[GpuSpec, ...]) -> ContainerSpec:
    n = _Node(file, key, raw)
    name = n.need("name", _k8s_name, "a container name")
    units = tuple(_unit(file, f"{key}.gpus[{i}]", u, gpus)
                  for i, u in enumerate(n.get("gpus", _list, [])))
    resource = n.get("resource", _str, "")
    procs = tuple(_parse_process(file, f"{key}.processes[{i}]", p, len(units))
                  for i, p in enumerate(n.get("processes", _list, [])))
    n.done()
    if procs and not units:
        raise ConfigError(file, f"{key}.gpus", "at least one GPU for a container with processes",
                          "[]")
    return ContainerSpec(name, units, resource, procs)


def _parse_pod(file: str, i: int, raw: object, gpus: tuple[GpuSpec, ...]) -> PodSpec:
    key = f"pods[{i}]"
    n = _Node(file, key, raw)
    labels_raw = n.get("labels", lambda f, k, v: _Node(f, k, v).data, {})
    labels: list[tuple[str, str]] = []
    for lk, lv in labels_raw.items():
        if not isinstance(lk, str) or not isinstance(lv, str | int | float | bool):
            raise ConfigError(file, f"{key}.labels.{lk}", "a string label value", _show(lv))
        labels.append((lk, str(lv).lower() if isinstance(lv, bool) else str(lv)))
    start = n.get("start", _duration, 0.0)
    end = n.get("end", _duration, None)
    repeat = n.get("repeat", _duration, None)
    owner_raw = n.get("owner", lambda f, k, v: _Node(f, k, v), None)
    owner = ("", "")
    if owner_raw is not None:
        owner = (owner_raw.need("kind", _str, "a controller kind like Deployment or Job"),
                 owner_raw.need("name", _k8s_name, "the controller's name"))
        owner_raw.done()
    pod = PodSpec(
        index=i,
        namespace=n.need("namespace", _k8s_name, "a namespace"),
        name=n.need("name", _k8s_name, "a pod name"),
        uid=n.get("uid", _uuid(""), ""),
        labels=tuple(sorted(labels)),
        qos=n.get("qos", _choice(QOS_CLASSES), "burstable"),
        start=start, end=end, repeat=repeat,
        containers=tuple(_parse_container(file, f"{key}.containers[{j}]", c, gpus)
                         for j, c in enumerate(n.need("containers", _list, "a list"))),
        owner=owner,
    )
    n.done()
    if end is not None and end <= start:
        raise ConfigError(file, f"{key}.end", "a time after start", n.data.get("end"))
    if repeat is not None:
        if end is None:
            raise ConfigError(file, f"{key}.end", "an end time when repeat is set", None)
        if repeat <= 0 or end - start > repeat:
            raise ConfigError(file, f"{key}.repeat", "a period >= end - start (runs of a "
                              "repeating pod never overlap)", n.data.get("repeat"))
        if pod.uid:
            raise ConfigError(file, f"{key}.uid", "no uid on a repeating pod (each run gets "
                              "its own)", pod.uid)
    if not pod.containers:
        raise ConfigError(file, f"{key}.containers", "at least one container", "[]")
    return pod


def _parse_host_process(file: str, i: int, raw: object,
                        gpus: tuple[GpuSpec, ...]) -> HostProcessSpec:
    key = f"host_processes[{i}]"
    n = _Node(file, key, raw)
    name = n.need("name", _k8s_name, "a process (service) name")
    gpu = n.need("gpu", lambda f, k, v: _gpu_index(f, k, v, gpus), "a GPU index")
    mig = n.get("mig", _nonneg_int, None)
    migs = gpus[gpu].mig
    if mig is not None and (migs is None or mig >= len(migs)):
        raise ConfigError(file, f"{key}.mig", f"a MIG instance index of GPU {gpu}", mig)
    if mig is None and migs is not None:
        raise ConfigError(file, f"{key}.mig", f"a MIG instance: GPU {gpu} has MIG enabled", None)
    hp = HostProcessSpec(
        name=name, gpu=gpu, mig=mig,
        pid=n.get("pid", _int_range(1, MAX_EXPLICIT_PID), None),
        memory=n.need("memory", _size_signal, "a size like 1GiB"),
        sm_util=n.get("sm_util", _ratio_signal, Signal.const(0.0)),
        start=n.get("start", _duration, 0.0), end=n.get("end", _duration, None),
    )
    n.done()
    return hp


def _gpu_index(file: str, key: str, raw: object, gpus: tuple[GpuSpec, ...]) -> int:
    g = _int(file, key, raw)
    if not 0 <= g < len(gpus):
        raise ConfigError(file, key, f"a GPU index 0..{len(gpus) - 1}", g)
    return g


def _parse_fault(file: str, i: int, raw: object, gpus: tuple[GpuSpec, ...]) -> Fault:
    key = f"faults[{i}]"
    n = _Node(file, key, raw)
    kind = n.need("kind", _choice(FAULT_KINDS), "a fault kind")
    gpu = n.need("gpu", lambda f, k, v: _gpu_index(f, k, v, gpus), "a GPU index")
    at = n.get("at", _duration, 0.0)
    until = None
    if (n.has("until") or n.has("duration")) and \
            kind not in ("throttle", "not_supported", "nvlink_down"):
        raise ConfigError(file, f"{key}.until", f"no end for a {kind} fault", None)
    if n.has("until"):
        until = n.get("until", _duration, None)
    if n.has("duration"):
        if until is not None:
            raise ConfigError(file, f"{key}.duration", "either until or duration", None)
        until = at + n.get("duration", _duration, 0.0)
    f = Fault(kind=kind, gpu=gpu, at=at, until=until)
    if kind == "not_supported":
        f = Fault(kind, gpu, at, until,
                  field=n.need("field", _choice(tuple(FIELDS)), "a reading name"))
    elif kind == "throttle":
        f = Fault(kind, gpu, at, until,
                  reason=n.need("reason", _choice(THROTTLE_REASONS), "a throttle reason"))
        if until is None:
            raise ConfigError(file, f"{key}.duration", "a duration (or until) for a throttle "
                              "window", None)
    elif kind == "ecc":
        f = Fault(kind, gpu, at, corrected=n.get("corrected", _nonneg_int, 0),
                  uncorrected=n.get("uncorrected", _nonneg_int, 0))
    elif kind == "row_remap":
        f = Fault(kind, gpu, at, corrected=n.get("correctable", _nonneg_int, 0),
                  uncorrected=n.get("uncorrectable", _nonneg_int, 0),
                  pending=n.get("pending", _bool, False), failure=n.get("failure", _bool, False))
    elif kind == "pcie_replay":
        f = Fault(kind, gpu, at, count=n.need("count", _nonneg_int, "a count"))
    elif kind in ("nvlink_error", "nvlink_down"):
        link = n.need("link", _nonneg_int, "an NVLink link number")
        if link >= gpus[gpu].nvlink_links:
            raise ConfigError(file, f"{key}.link",
                              f"a link 0..{gpus[gpu].nvlink_links - 1} of GPU {gpu}", link)
        if kind == "nvlink_error":
            f = Fault(kind, gpu, at, link=link,
                      error_type=n.need("type", _choice(NVLINK_ERROR_TYPES), "an error type"),
                      count=n.need("count", _nonneg_int, "a count"))
        else:
            f = Fault(kind, gpu, at, until, link=link)
    n.done()
    if f.until is not None and f.until <= f.at:
        raise ConfigError(file, f"{key}.until", "a time after at", f.until)
    return f


def _parse_xid(file: str, i: int, raw: object, gpus: tuple[GpuSpec, ...]) -> XidSpec:
    key = f"xids[{i}]"
    n = _Node(file, key, raw)
    gpu = n.need("gpu", lambda f, k, v: _gpu_index(f, k, v, gpus), "a GPU index")
    x = XidSpec(gpu=gpu, at=n.need("at", _duration, "a duration"),
                xid=n.need("xid", _int_range(1, 1000), "an XID code"),
                mig=n.get("mig", _nonneg_int, None))
    n.done()
    migs = gpus[gpu].mig
    if x.mig is not None and (migs is None or x.mig >= len(migs)):
        raise ConfigError(file, f"{key}.mig", f"a MIG instance index of GPU {gpu}", x.mig)
    return XidSpec(x.gpu, x.at, int(x.xid), x.mig)


def _check_pod_names(file: str, pods: tuple[PodSpec, ...]) -> None:
    seen: dict[tuple[str, str], int] = {}
    for p in pods:
        if (p.namespace, p.name) in seen:
            raise ConfigError(file, f"pods[{p.index}].name", "a name unique in its namespace",
                              f"{p.namespace}/{p.name}")
        seen[(p.namespace, p.name)] = p.index


def _overlap(a: PodSpec, b: PodSpec) -> bool:
    """Whether two pods can be alive at once. Repeating pods are treated as always alive from
    their start, which is stricter than needed but keeps the check simple."""
    a_end = math.inf if a.end is None or a.repeat is not None else a.end
    b_end = math.inf if b.end is None or b.repeat is not None else b.end
    return a.start < b_end and b.start < a_end


def _check_units(file: str, pods: tuple[PodSpec, ...], gpus: tuple[GpuSpec, ...]) -> None:
    """No device unit is held by two containers at the same time."""
    holders: dict[UnitRef, list[tuple[PodSpec, str]]] = {}
    for p in pods:
        for ci, c in enumerate(p.containers):
            for ui, u in enumerate(c.units):
                for other, where in holders.get(u, []):
                    if other is p or _overlap(other, p):
                        raise ConfigError(
                            file, f"pods[{p.index}].containers[{ci}].gpus[{ui}]",
                            f"a device unit no other container holds at the same time "
                            f"(held by {where})", _unit_text(u))
                holders.setdefault(u, []).append(
                    (p, f"{p.namespace}/{p.name}/{c.name}"))
    del gpus


def _unit_text(u: UnitRef) -> str:
    s = f"gpu {u.gpu}"
    if u.mig is not None:
        s += f" mig {u.mig}"
    if u.replica is not None:
        s += f" replica {u.replica}"
    return s


def _process_slots(c: ContainerSpec) -> int:
    return sum(1 if p.unit is not None else len(c.units) for p in c.processes)


def _check_pids(file: str, pods: tuple[PodSpec, ...],
                hosts: tuple[HostProcessSpec, ...]) -> None:
    seen: dict[int, str] = {}

    def claim(pid: int, key: str) -> None:
        if pid in seen:
            raise ConfigError(file, key, f"a pid not used elsewhere (also at {seen[pid]})", pid)
        seen[pid] = key

    for p in pods:
        for ci, c in enumerate(p.containers):
            for pi, proc in enumerate(c.processes):
                if proc.pid is None:
                    continue
                key = f"pods[{p.index}].containers[{ci}].processes[{pi}].pid"
                n = 1 if proc.unit is not None else len(c.units)
                for j in range(n):
                    claim(proc.pid + j, key)
    for i, h in enumerate(hosts):
        if h.pid is not None:
            claim(h.pid, f"host_processes[{i}].pid")
