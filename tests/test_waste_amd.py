"""Rightsizing knows AMD compute partitions (issue 25, item 7): a workload on a whole MI300X
whose peak memory and p95 activity fit one XCD is told to use a CPX partition, with the
saving the cost model's fraction gives; the partition sizes come from the XCD counts."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

from test_waste import Holder, _recs

from metering.partitions import partitions, sizes
from metering.report.waste import Kind, units_for

D = Decimal
MI300X, MI300A = "AMD Instinct MI300X", "AMD Instinct MI300A"
COST_MODEL = """
currency: EUR
pricing:
  default: {hourly: 1.00}
  gpus:
    - {model: "AMD Instinct MI300X", hourly: 3.20, memory_gb: 192}
"""


def test_partition_counts_follow_the_xcds() -> None:
    # MI300X, 8 XCDs: SPX 1, DPX 2, QPX 4, CPX 8 (amdsmi.h); TPX needs a multiple of 3.
    assert [partitions(m, 8) for m in ("spx", "dpx", "tpx", "qpx", "cpx")] == [1, 2, None, 4, 8]
    # MI300A, 6 XCDs: SPX, TPX, CPX only (DPX needs a multiple of 4, QPX 2 XCDs each).
    assert [partitions(m, 6) for m in ("spx", "dpx", "tpx", "qpx", "cpx")] == [1, None, 3, None, 6]
    assert [(s.mode, s.parts) for s in sizes(MI300A)] == [("cpx", 6), ("tpx", 3), ("spx", 1)]
    assert [(s.mode, s.xcds, s.parts) for s in sizes(MI300X)] == [
        ("cpx", 1, 8), ("qpx", 2, 4), ("dpx", 4, 2), ("spx", 8, 1)]
    units = units_for(MI300X)
    assert units is not None and units.kind == "amd_partition"
    assert [(p.name, p.memory_gb) for p in units.profiles] == [
        ("cpx", D(24)), ("qpx", D(48)), ("dpx", D(96)), ("spx", D(192))]
    assert units.index("cpx_nps4") == 0 and units.index("3g.40gb") is None
    assert units_for("AMD Radeon PRO W7900") is None


def test_whole_mi300x_that_fits_one_xcd_gets_a_cpx_partition(tmp_path: Path) -> None:
    # 100 h of a whole MI300X at 3.20 = 320.00. Peak 20 GB, SM 10 %: a CPX partition has
    # 192 / 8 = 24 GB (21.6 usable at 90 %) and 1/8 x 90 % = 11.25 % of the XCDs.
    # Saving at slices pricing: 320 x (1 - 1/8) = 280.
    recs = _recs(tmp_path, [Holder("llm-0", "GPU-amd0", MI300X, 100, mem_gb=20.0, sm=0.10,
                                   owner=("Deployment", "llm"))], COST_MODEL)
    assert [(r.kind, r.current, r.proposed, r.cost, r.saving) for r in recs] == [
        (Kind.TO_PARTITION, "whole GPU", "AMD CPX partition (1 of 8)", D("320"), D("280"))]


def test_too_big_for_cpx_gets_the_next_partition(tmp_path: Path) -> None:
    # Peak 40 GB: CPX's 21.6 usable GB is too small, QPX (48 GB, 43.2 usable; 2/8 = 25 % of
    # the XCDs, 22.5 % usable) fits a 20 % SM workload. Saving 320 x (1 - 2/8) = 240.
    recs = _recs(tmp_path, [Holder("llm-0", "GPU-amd0", MI300X, 100, mem_gb=40.0, sm=0.20,
                                   owner=("Deployment", "llm"))], COST_MODEL)
    assert [(r.kind, r.proposed, r.saving) for r in recs] == [
        (Kind.TO_PARTITION, "AMD QPX partition (1 of 4)", D("240"))]
