"""Durations ('1h30m') and sizes ('80GiB') as scenario files write them."""

from __future__ import annotations

import math
import re

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
