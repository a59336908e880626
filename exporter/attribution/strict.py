"""Whole numbers from text that others write (pod annotations, device IDs, DRA device names),
read strictly: ASCII digits only, a bounded length, a range. `str.isdigit()` accepts `²` and
`int()` accepts `٣`, `+3`, ` 3` and 4,300 digits; a reader here accepts none of them, and
never raises."""

from __future__ import annotations

INT32_MAX = (1 << 31) - 1


def ascii_uint(text: object, hi: int) -> int | None:
    """`text` as a whole number in 0..hi when it is nothing but ASCII digits (no sign, no
    space, at most as many digits as `hi` has); None otherwise."""
    if not isinstance(text, str) or not text or len(text) > len(str(hi)):
        return None
    if not (text.isascii() and text.isdigit()):
        return None
    value = int(text)
    return value if value <= hi else None
