"""Reading a parsed YAML mapping at a key path: typed converters that raise ConfigError naming
the file, the key path (`gpus[2].mig[0].profile`) and what was expected, and unknown-key checks."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

from exporter.errors import ConfigError
from gpusim.signal import Signal
from gpusim.units import parse_duration, parse_size

T = TypeVar("T")
D = TypeVar("D")


class Node:
    """A mapping being read at a key path; records which keys were read to reject unknown ones."""

    def __init__(self, file: str, path: str, data: object) -> None:
        if not isinstance(data, Mapping):
            raise ConfigError(file, path or "(top level)", "a mapping", show(data))
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


def show(value: object) -> object:
    return value if isinstance(value, str | int | float | bool) or value is None else \
        type(value).__name__


def as_str(file: str, key: str, v: object) -> str:
    if not isinstance(v, str) or not v.strip():
        raise ConfigError(file, key, "a non-empty string", show(v))
    return v


def as_int(file: str, key: str, v: object) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ConfigError(file, key, "an integer", show(v))
    return v


def as_nonneg_int(file: str, key: str, v: object) -> int:
    n = as_int(file, key, v)
    if n < 0:
        raise ConfigError(file, key, "an integer >= 0", v)
    return n


def as_number(file: str, key: str, v: object) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise ConfigError(file, key, "a number", show(v))
    return float(v)


def as_bool(file: str, key: str, v: object) -> bool:
    if not isinstance(v, bool):
        raise ConfigError(file, key, "true or false", show(v))
    return v


def as_duration(file: str, key: str, v: object) -> float:
    d = parse_duration(v)
    if d is None:
        raise ConfigError(file, key, "a duration like 90s, 20m, 2h, 7d (or seconds)", show(v))
    return d


def as_size(file: str, key: str, v: object) -> int:
    s = parse_size(v)
    if s is None:
        raise ConfigError(file, key, "a size like 512MiB, 80GiB (or bytes)", show(v))
    return s


def one_of(options: Sequence[str]) -> Callable[[str, str, object], str]:
    def conv(file: str, key: str, v: object) -> str:
        if v not in options:
            raise ConfigError(file, key, "one of " + ", ".join(options), show(v))
        return str(v)
    return conv


def as_list(file: str, key: str, v: object) -> list[object]:
    if not isinstance(v, list):
        raise ConfigError(file, key, "a list", show(v))
    return v


def int_range(lo: int, hi: int) -> Callable[[str, str, object], int]:
    def conv(file: str, key: str, v: object) -> int:
        x = as_int(file, key, v)
        if not lo <= x <= hi:
            raise ConfigError(file, key, f"an integer between {lo} and {hi}", v)
        return x
    return conv


def ranged(lo: float, hi: float | None,
            scalar: Callable[[str, str, object], float]) -> Callable[[str, str, object], float]:
    def conv(file: str, key: str, v: object) -> float:
        x = scalar(file, key, v)
        if x < lo or (hi is not None and x > hi):
            rng = f"between {lo:g} and {hi:g}" if hi is not None else f">= {lo:g}"
            raise ConfigError(file, key, f"a value {rng}", v)
        return x
    return conv


def signal_of(scalar: Callable[[str, str, object], float],
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
            n = Node(file, f"{key}.sine", v["sine"])
            lo = n.need("min", scalar, what)
            hi = n.need("max", scalar, what)
            period = n.need("period", as_duration, "a duration")
            phase = n.get("phase", as_duration, 0.0)
            n.done()
            if period <= 0:
                raise ConfigError(file, f"{key}.sine.period", "a duration > 0", v["sine"]["period"])
            return Signal("sine", lo=lo, hi=hi, period=period, phase=phase)
        steps = as_list(file, f"{key}.steps", v["steps"])
        if not steps:
            raise ConfigError(file, f"{key}.steps", "at least one [time, value] pair", "[]")
        times: list[float] = []
        values: list[float] = []
        for i, step in enumerate(steps):
            k = f"{key}.steps[{i}]"
            if not isinstance(step, list) or len(step) != 2:
                raise ConfigError(file, k, "a [time, value] pair", show(step))
            t = as_duration(file, k, step[0])
            if times and t <= times[-1]:
                raise ConfigError(file, k, "step times in increasing order", step[0])
            times.append(t)
            values.append(scalar(file, k, step[1]))
        return Signal("steps", times=tuple(times), values=tuple(values))

    return conv


def as_size_float(file: str, key: str, v: object) -> float:
    return float(as_size(file, key, v))


as_ratio = ranged(0.0, 1.0, as_number)
ratio_signal = signal_of(as_ratio, "a number between 0 and 1")
size_signal = signal_of(as_size_float, "a size like 4GiB")
temp_signal = signal_of(ranged(-50.0, 150.0, as_number), "a temperature in °C")
watts_signal = signal_of(ranged(0.0, None, as_number), "watts")
mhz_signal = signal_of(ranged(0.0, None, as_number), "MHz")
UUID_RE = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
NAME_RE = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")
MAX_EXPLICIT_PID = 99_999  # automatic PIDs start at 100000


def uuid_with_prefix(prefix: str) -> Callable[[str, str, object], str]:
    def conv(file: str, key: str, v: object) -> str:
        s = as_str(file, key, v)
        body = s[len(prefix):] if s.startswith(prefix) else s
        if not UUID_RE.fullmatch(body):
            raise ConfigError(file, key,
                              f"a UUID like {prefix}xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", s)
        return prefix + body.lower()
    return conv


def k8s_name(file: str, key: str, v: object) -> str:
    s = as_str(file, key, v)
    if not NAME_RE.fullmatch(s) or len(s) > 253:
        raise ConfigError(file, key, "a Kubernetes name (lower-case letters, digits, '-', '.')",
                          s)
    return s
