"""One place that calls amdsmi and classifies its errors: absent (the device has no such
value), lost (the device is gone: `DeviceLost`), or a failure counted in the cycle's Tally.
Also the readers of amdsmi's values, which are ints, floats or the string "N/A"."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from exporter.device.amdsmiapi import ABSENT_STATUSES, LOST_STATUSES, AmdSmiApi
from exporter.device.contract import DeviceLost, Tally

T = TypeVar("T")


def status_of(err: BaseException) -> int | None:
    """The amdsmi_status_t of an AmdSmiLibraryException (`get_error_code()`, else
    `err_code`)."""
    get = getattr(err, "get_error_code", None)
    code = get() if callable(get) else getattr(err, "err_code", None)
    return code if isinstance(code, int) else None


class AmdCalls:
    """Calls amdsmi for one collector run; `tally` counts the unexpected failures."""

    def __init__(self, api: AmdSmiApi, tally: Tally | None = None) -> None:
        self.api = api
        self.tally = tally if tally is not None else Tally()

    def call(self, fn: Callable[..., T], *args: Any) -> T | None:
        try:
            return fn(*args)
        except self.api.AmdSmiLibraryException as err:
            code = status_of(err)
            if code in LOST_STATUSES:
                raise DeviceLost(f"amdsmi status {code}") from err
            if code not in ABSENT_STATUSES:
                self.tally.failures += 1
            return None


def number(value: object) -> float | None:
    """A reading as a float; "N/A", None, bools and anything else non-numeric are None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def field(info: object, *keys: str) -> float | None:
    """The first numeric value among `keys` of an amdsmi result dict (keys are tried in order:
    newer releases renamed some fields)."""
    if not isinstance(info, dict):
        return None
    for key in keys:
        value = number(info.get(key))
        if value is not None:
            return value
    return None


def text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode(errors="replace").strip()
    return value.strip() if isinstance(value, str) and value != "N/A" else ""
