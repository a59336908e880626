"""Test helper: poll for a condition a background thread (a watch, a server) brings about."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(cond: Callable[[], bool], what: str, limit: float = 20.0) -> None:
    """Return once `cond()` holds; fail naming `what` after `limit` seconds."""
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.02)
    raise AssertionError(f"gave up waiting for {what}")
