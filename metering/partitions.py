"""What AMD compute partitions are, for pricing them as fractions of their GPU and for
rightsizing a whole GPU into one (docs/cost-model.md, "AMD partitions").

An AMD Instinct GPU of the MI300 family is built from XCDs (accelerator complex dies: MI300X
8, MI300A 6, amdsmi conceptual/partition.md). Its compute partition mode groups them into
equal logical GPUs; the Linux amdgpu driver (drivers/gpu/drm/amd/amdgpu/aqua_vanjaram.c,
`__aqua_vanjaram_get_xcc_per_xcp` and `aqua_vanjaram_get_xcp_res_info`) gives each partition
all XCDs (SPX), 1/2 (DPX), 1/3 (TPX), 1/4 (QPX) or one XCD (CPX), so a mode has 1, 2, 3, 4 or
XCDs partitions; a mode is only valid where the XCDs divide evenly (TPX needs a multiple of 3:
MI300A, not MI300X). amdsmi.h says the same for MI300X: SPX=>1, DPX=>2, QPX=>4, CPX=>8.
The memory partition mode (NPS1/2/4/8) splits the HBM into NUMA domains shared by the
compute partitions; it does not change how many compute partitions there are.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from typing import Final

# XCDs per GPU model, as the exporter's gpu_info names it (amdsmi market name). Globs.
AMD_XCDS: Final[tuple[tuple[str, int], ...]] = (
    ("AMD Instinct MI300A*", 6),
    ("AMD Instinct MI300X*", 8),
    ("AMD Instinct MI325X*", 8),
    ("AMD Instinct MI350X*", 8),
    ("AMD Instinct MI355X*", 8),
)
# Where the model is not listed: the XCDs of every partitionable part but MI300A.
DEFAULT_XCDS: Final = 8
# Compute partitions of a mode: XCDs divided by XCDs per partition (CPX: one XCD each).
_DIVISOR: Final = {"spx": 1, "dpx": 2, "tpx": 3, "qpx": 4}
MODES: Final = ("spx", "dpx", "tpx", "qpx", "cpx")
# A partition profile as the exporter and the AMD device plugin name it: the compute mode and
# optionally the memory mode (resource amd.com/cpx_nps4, profile "cpx_nps4").
_PROFILE: Final = re.compile(r"^(?P<mode>spx|dpx|tpx|qpx|cpx)(?:_nps(?P<nps>[1248]))?$")


def partition_xcds(model: str) -> int | None:
    """XCDs of an AMD GPU model; None for a model not listed (any other vendor's)."""
    return next((n for pattern, n in AMD_XCDS if fnmatch.fnmatchcase(model, pattern)), None)


def compute_mode(profile: str) -> str | None:
    """The compute mode of a partition profile ("cpx_nps4" -> "cpx"); None if not one."""
    m = _PROFILE.match(profile.strip().lower())
    return m.group("mode") if m else None


def partitions(mode: str, xcds: int) -> int | None:
    """How many compute partitions `mode` cuts a GPU of `xcds` XCDs into; None where the
    driver refuses the mode (the XCDs do not divide evenly)."""
    if mode == "cpx":
        return xcds
    div = _DIVISOR.get(mode)
    if div is None or xcds % div or xcds // div < 1:
        return None
    return div


@dataclass(frozen=True)
class PartitionSize:
    mode: str
    xcds: int  # XCDs of one partition
    parts: int  # partitions of the GPU in this mode


def sizes(model: str) -> tuple[PartitionSize, ...]:
    """The compute modes valid on an AMD model, smallest partition first; () if not listed."""
    xcds = partition_xcds(model)
    if xcds is None:
        return ()
    out = [PartitionSize(m, xcds // n, n) for m in MODES
           if (n := partitions(m, xcds)) is not None]
    return tuple(sorted(out, key=lambda s: s.xcds))
