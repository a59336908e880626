"""A benchmark-only shim for the simulated NVML, so cycle figures measure the exporter.

The simulator rebuilds the node's whole process list (UUIDs, cgroup lines) for every
(GPU, MIG instance) it is asked about, so one cycle of the big node spends about a second
in the simulator itself: 64 devices x 400 processes. Real NVML answers those calls from the
driver. Remembering the list for the current scenario time removes that cost and changes no
answer for the benchmark scenarios: the list is a function of t, and in them it does not change
with t (constant pods and signals), so the cache is keyed by the whole second. A live exporter
reads the clock at every call, so an exact-time key would never hit. docs/performance.md
reports the figures with and without the shim.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from typing import Any

# A GPM reading averages 5 points between two samples: a cycle asks for a few distinct seconds.
CACHE_TIMES = 32


def memoize_processes(nvml: Any) -> None:
    """Cache the simulator's per-time process list on this SimNVML (the last few times)."""
    tl = nvml._timeline
    compute = tl.processes_at
    lock = threading.Lock()
    cache: OrderedDict[int, Any] = OrderedDict()

    def processes_at(t: float) -> Any:
        key = math.floor(t)
        with lock:
            hit = cache.get(key)
        if hit is not None:
            return hit
        procs = compute(t)
        with lock:
            cache[key] = procs
            while len(cache) > CACHE_TIMES:
                cache.popitem(last=False)
        return procs

    tl.processes_at = processes_at
