"""heap.trim gives the pages a run freed back to the system: what ingest freed does not stay
in the process's resident memory while pricing fills DuckDB's buffers."""

from __future__ import annotations

from pathlib import Path

from metering import heap


def _resident_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def test_freed_heap_pages_go_back_to_the_system() -> None:
    # 1 KiB objects come from glibc's heap (Python's own allocator takes 512 bytes or less);
    # one kept in every 64 holds the heap's top, so glibc cannot shrink it by itself.
    blocks = [bytes(1024) for _ in range(256 * 1024)]  # 256 MiB
    kept = blocks[::64]
    heap.trim()
    before = _resident_mib()
    del blocks
    after_free = _resident_mib()
    heap.trim()
    after_trim = _resident_mib()
    assert after_free - after_trim > 150, (before, after_free, after_trim)
    assert len(kept) == 4096
