"""What AMD compute partitions are, for pricing them as fractions of their GPU and for
rightsizing a whole GPU into one (docs/cost-model.md, "AMD partitions").

An AMD Instinct GPU of the MI300 family is built from XCDs (accelerator complex dies: MI300X
8, MI300A 6, amdsmi conceptual/partition.md). Its compute partition mode groups them into
equal logical GPUs; the Linux amdgpu driver (drivers/gpu/drm/amd/amdgpu/aqua_vanjaram.c,
`__aqua_vanjaram_get_xcc_per_xcp` and `aqua_vanjaram_get_xcp_res_info`) gives each partition
all XCDs (SPX), 1/2 (DPX), 1/3 (TPX), 1/4 (QPX) or one XCD (CPX), so a mode has 1, 2, 3, 4 or
XCDs partitions. `__aqua_vanjaram_is_valid_mode` allows DPX where the XCDs are a multiple of
4, TPX of 3, QPX where each partition gets at least 2, CPX with more than one XCD: MI300X
(8) has SPX, DPX, QPX, CPX; MI300A (6) SPX, TPX, CPX. amdsmi.h says the same for MI300X:
SPX=>1, DPX=>2, QPX=>4, CPX=>8.
The memory partition mode (NPS1/2/4/8) splits the HBM into NUMA domains shared by the
compute partitions; it does not change how many compute partitions there are.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from typing import Final

# XCDs and HBM (GB) per GPU model, as the exporter's gpu_info names it (amdsmi market name).
# Globs. MI300A's 128 GB are shared with its CPU cores.
AMD_PARTS: Final[tuple[tuple[str, int, int], ...]] = (
    ("AMD Instinct MI300A*", 6, 128),
    ("AMD Instinct MI300X*", 8, 192),
    ("AMD Instinct MI325X*", 8, 256),
    ("AMD Instinct MI350X*", 8, 288),
    ("AMD Instinct MI355X*", 8, 288),
)
# Where the model is not listed: the XCDs of every partitionable part but MI300A.
DEFAULT_XCDS: Final = 8
MODES: Final = ("spx", "dpx", "tpx", "qpx", "cpx")
# A partition profile as the exporter and the AMD device plugin name it: the compute mode and
# optionally the memory mode (resource amd.com/cpx_nps4, profile "cpx_nps4").
_PROFILE: Final = re.compile(r"^(?P<mode>spx|dpx|tpx|qpx|cpx)(?:_nps(?P<nps>[1248]))?$")


def partition_xcds(model: str) -> int | None:
    """XCDs of an AMD GPU model; None for a model not listed (any other vendor's)."""
    return next((n for pattern, n, _ in AMD_PARTS if fnmatch.fnmatchcase(model, pattern)),
                None)


def partition_memory_gb(model: str) -> int | None:
    """HBM of an AMD GPU model in GB; None for a model not listed."""
    return next((gb for pattern, _, gb in AMD_PARTS if fnmatch.fnmatchcase(model, pattern)),
                None)


def is_profile(name: str) -> bool:
    """Whether `name` is a partition profile exactly as the exporter writes it (cpx_nps4)."""
    return _PROFILE.fullmatch(name) is not None


def compute_mode(profile: str) -> str | None:
    """The compute mode of a partition profile ("cpx_nps4" -> "cpx"); None if not one."""
    m = _PROFILE.match(profile.strip().lower())
    return m.group("mode") if m else None


def partitions(mode: str, xcds: int) -> int | None:
    """How many compute partitions `mode` cuts a GPU of `xcds` XCDs into; None where the
    driver refuses the mode on such a GPU (`__aqua_vanjaram_is_valid_mode`)."""
    valid = {"spx": xcds > 0, "dpx": xcds > 0 and xcds % 4 == 0,
             "tpx": xcds > 0 and xcds % 3 == 0, "qpx": xcds % 4 == 0 and xcds // 4 >= 2,
             "cpx": xcds > 1}
    count = {"spx": 1, "dpx": 2, "tpx": 3, "qpx": 4, "cpx": xcds}
    return count[mode] if valid.get(mode) else None


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
