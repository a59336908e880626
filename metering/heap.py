"""Memory a run has freed, given back to the system between its phases.

Ingest's Python objects and Arrow buffers are freed into their allocators' free lists
(glibc's arenas, Arrow's mimalloc pages), which keep them for reuse; pricing then fills
DuckDB's buffers from DuckDB's own allocator, beside them. Returned after ingest, the
80,000-GPU daily run peaked 117-130 MiB lower (docs/performance.md, "DuckDB's share of
ingest's budget").
"""

from __future__ import annotations

import ctypes
import gc

import pyarrow as pa


def trim() -> None:
    """Collect garbage and give the free pages of Arrow's pool and of glibc's heap back to
    the system (glibc's `malloc_trim`; nothing where the C library has none)."""
    gc.collect()
    pa.default_memory_pool().release_unused()
    try:
        malloc_trim = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS)
        return
    malloc_trim.argtypes = [ctypes.c_size_t]
    malloc_trim(0)
