"""GPU processes through amdsmi's process list: per process its VRAM and its GFX engine time.

amdsmi_get_gpu_process_list gives, per process on a handle, `engine_usage.gfx`: the
nanoseconds the GFX engine spent on it, a counter since the process opened the device. Its
share of the engine over a cycle is the counter's increase over the wall time between two
reads (None the first time a process is seen). On a partitioned GPU each partition is its own
handle, so its processes carry the partition's UUID: the partition's usage is the sum of its
processes' shares (`partition_busy`), which is how per-partition usage is known where amdsmi
reports the device's activity on partition 0 only.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence

from exporter.device.amd_calls import AmdCalls, field, number
from exporter.device.amd_inventory import AmdGpu
from exporter.device.amdsmiapi import AmdSmiApi
from exporter.device.contract import GpuRef, MigRef, ProcessReader, ProcessSample, Tally


class AmdProcessReader:
    """`fallback`: where amdsmi gives no process list for a GPU (the MxGPU host package has
    none; NO_PERM without the privileges it needs), the GPU's processes from another reader
    (DRM fdinfo: whole GPUs, not partitions)."""

    def __init__(self, api: Callable[[], AmdSmiApi],
                 clock_ns: Callable[[], int] = time.monotonic_ns,
                 fallback: ProcessReader | None = None) -> None:
        # the backend's amdsmi, asked at each read: the reader is made before open() loads it
        self._api = api
        self._clock_ns = clock_ns
        self._fallback = fallback
        # (device or partition uuid, pid) -> (gfx ns, read at ns) of the last read
        self._last: dict[tuple[str, int], tuple[int, int]] = {}

    def read(self, gpu: GpuRef, partitions: Sequence[MigRef], tally: Tally
             ) -> list[ProcessSample]:
        if not isinstance(gpu.handle, AmdGpu):
            return []
        api = self._api()
        r = AmdCalls(api, tally)
        by_handle = {id(p.handle): p.uuid for p in partitions if p.parent.uuid == gpu.uuid}
        now = self._clock_ns()
        out: list[ProcessSample] = []
        seen: set[tuple[str, int]] = set()
        listed = False
        for h in gpu.handle.members:
            part_uuid = by_handle.get(id(h), "") if gpu.mig_enabled else ""
            procs = r.call(api.amdsmi_get_gpu_process_list, h)
            listed = listed or procs is not None
            for p in procs or []:
                pid = number(p.get("pid"))
                if pid is None:
                    continue
                key = (part_uuid or gpu.uuid, int(pid))
                seen.add(key)
                vram = field(p.get("memory_usage"), "vram_mem")
                mem = vram if vram is not None else field(p, "mem")
                gfx = field(p.get("engine_usage"), "gfx")
                out.append(ProcessSample(int(pid), gpu.uuid, part_uuid, float(mem or 0),
                                         self._share(key, gfx, now)))
        for key in [k for k in self._last if k[0] in _uuids(gpu, partitions)
                    and k not in seen]:
            del self._last[key]  # exited: a reused PID starts afresh
        if not listed and self._fallback is not None:
            return self._fallback.read(gpu, partitions, tally)
        return out

    def _share(self, key: tuple[str, int], gfx: float | None, now: int) -> float | None:
        if gfx is None:
            self._last.pop(key, None)
            return None
        last = self._last.get(key)
        self._last[key] = (int(gfx), now)
        if last is None or now <= last[1] or gfx < last[0]:
            return None  # first sight, or the counter restarted
        return min(1.0, (gfx - last[0]) / (now - last[1]))


def _uuids(gpu: GpuRef, partitions: Iterable[MigRef]) -> set[str]:
    return {gpu.uuid} | {p.uuid for p in partitions if p.parent.uuid == gpu.uuid}


def partition_busy(samples: Iterable[ProcessSample]) -> dict[str, float]:
    """Partition UUID -> its GFX busy share (0-1): the sum of its processes' shares."""
    out: dict[str, float] = {}
    for s in samples:
        if s.mig_uuid and s.sm_util is not None:
            out[s.mig_uuid] = min(1.0, out.get(s.mig_uuid, 0.0) + s.sm_util)
    return out
