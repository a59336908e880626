"""`gpu-ledger demo`, the README's first command, at a small size: it must run the whole
pipeline and leave a report, with Prometheus and without."""

from __future__ import annotations

import csv
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import duckdb
import pytest

from gpu_ledger.demo import (
    DEFAULT_DAYS,
    build_parser,
    default_month,
    main,
    scenario_paths,
    vendor_scenario_paths,
)
from gpusim.scenario import load_scenario

SMALL = ["--month", "2026-10", "--days", "1", "--step", "30m", "--live-seconds", "1"]


def _rows(out: Path) -> list[dict[str, str]]:
    with (out / "report" / "chargeback-2026-10.csv").open(newline="") as fh:
        return list(csv.DictReader(fh))


def _fleet_cost(out: Path) -> float:
    fleet = next(r for r in _rows(out) if r["section"] == "fleet")
    assert fleet["hours_with_data"] == "24"
    return float(fleet["cost"])


# The AMD and Intel nodes' holders over the 24 hours SMALL simulates, priced by hand with the
# packaged cost-model.yaml (MI300X 3.20, Max 1550 1.50, UHD 630 0.05 an hour): a CPX/NPS4
# partition is 1/8 of its GPU, an MxGPU or Intel VF 1/4 (4 enabled), a GVT-g mdev 1/N by its
# type's _N suffix.
_MI300X, _MAX1550, _UHD630 = Decimal("3.20"), Decimal("1.50"), Decimal("0.05")
VENDOR_PODS = {  # the metered charges (the report's pod section keeps the top 20)
    "vllm-small-0": 24 * _MI300X / 8,  # amd.com/cpx_nps4
    "notebook-ana": 24 * _MI300X / 8,
    "embedder-0": 24 * _MI300X,  # a whole MI300X (amd.com/gpu)
    "virt-launcher-vm-render": 24 * _MI300X / 4,  # MxGPU VF
    "solver-0": 24 * _MAX1550 / 4,  # Intel Max SR-IOV VF (gpu.intel.com/xe card)
    "virt-launcher-desk-alice": 24 * _UHD630 / 4,  # i915-GVTg_V5_4
    "virt-launcher-desk-bob": 24 * _UHD630 / 8,  # i915-GVTg_V5_8
    "lammps-0": 24 * _MAX1550 / 2,  # an Intel Max tile (gas-container-tiles)
    "finetune-1": 24 * _MAX1550 / 2,
}
# Teams only the vendor nodes have: hpc (an Intel VF), design and support (GVT-g mdevs), geo
# and translate (an Intel Max shared by the GPU plugin's -shared-dev-num 2: half each), physics
# and climate (an Intel Max 1550 tile each, from gas-container-tiles: half each).
VENDOR_TEAMS = {"hpc": 24 * _MAX1550 / 4, "design": 24 * _UHD630 / 4,
                "support": 24 * _UHD630 / 8, "geo": 24 * _MAX1550 / 2,
                "translate": 24 * _MAX1550 / 2, "physics": 24 * _MAX1550 / 2,
                "climate": 24 * _MAX1550 / 2}
# (model, sharing, profile) -> (allocated GPU-hours, cost): partitions, VFs and mdevs at their
# fractions of the device-hour.
VENDOR_MODELS = {
    ("AMD Instinct MI300X", "mig", "cpx_nps4"): (Decimal(3 * 24) / 8, 3 * 24 * _MI300X / 8),
    ("AMD Instinct MI300X", "vgpu", ""): (Decimal(3 * 24) / 4, 3 * 24 * _MI300X / 4),
    ("AMD Instinct MI300X", "exclusive", ""): (Decimal(24), 24 * _MI300X),
    ("Intel(R) Data Center GPU Max 1550", "vgpu", ""): (Decimal(2 * 24) / 4,
                                                        2 * 24 * _MAX1550 / 4),
    ("Intel(R) Data Center GPU Max 1550", "time-slicing", ""): (Decimal(24), 24 * _MAX1550),
    ("Intel(R) Data Center GPU Max 1550", "mig", "tile"): (Decimal(24), 24 * _MAX1550),
    ("Intel(R) UHD Graphics 630", "vgpu", ""): (Decimal(24) / 4 + Decimal(24) / 8,
                                                24 * _UHD630 * (Decimal(1) / 4 + Decimal(1) / 8)),
}


def _assert_vendor_lines(out: Path) -> None:
    rows = _rows(out)
    teams = {r["team"]: Decimal(r["cost"]) for r in rows if r["section"] == "team"}
    assert {t: teams.get(t) for t in VENDOR_TEAMS} == VENDOR_TEAMS
    models = {(r["model"], r["sharing"], r["profile"]):
              (Decimal(r["allocated_gpu_hours"]), Decimal(r["cost"]))
              for r in rows if r["section"] == "model_sharing"}
    assert {k: models.get(k) for k in VENDOR_MODELS} == VENDOR_MODELS
    con = duckdb.connect(str(out / "gpu-ledger.duckdb"), read_only=True)
    try:
        pods = dict(con.execute("SELECT pod, sum(cost) FROM charges WHERE pod IN "
                                f"({', '.join('?' * len(VENDOR_PODS))}) GROUP BY pod",
                                list(VENDOR_PODS)).fetchall())
    finally:
        con.close()
    assert pods == VENDOR_PODS


@pytest.mark.parametrize("source", ["prometheus", "file"])
def test_demo_runs_the_pipeline(tmp_path: Path, source: str,
                                capsys: pytest.CaptureFixture[str]) -> None:
    extra = ["--no-prometheus"] if source == "file" else []
    assert main([*SMALL, "--out", str(tmp_path), *extra]) == 0
    printed = capsys.readouterr().out
    assert "[4/4] Writing the 2026-10 chargeback report" in printed
    for name in ("chargeback-2026-10.html", "chargeback-2026-10.csv",
                 "chargeback-2026-10.parquet", "chargeback-2026-10.md"):
        assert (tmp_path / "report" / name).stat().st_size > 0
    assert _fleet_cost(tmp_path) > 0
    _assert_vendor_lines(tmp_path)
    history = (tmp_path / "history.om").read_text()
    for vendor in ("nvidia", "amd", "intel"):
        assert f'vendor="{vendor}"' in history, vendor


def test_default_month_steps_back_while_last_month_is_too_fresh() -> None:
    assert default_month(datetime(2026, 11, 21, tzinfo=UTC)) == "2026-10"
    assert default_month(datetime(2026, 11, 1, 1, 0, tzinfo=UTC)) == "2026-09"
    assert default_month(datetime(2027, 1, 1, 4, 0, tzinfo=UTC)) == "2026-12"


def test_unfinished_month_is_refused(tmp_path: Path) -> None:
    month = datetime.now(UTC).strftime("%Y-%m")
    assert main(["--month", month, "--full-month", "--out", str(tmp_path)]) == 2


def test_default_is_a_week_and_full_month_is_a_flag() -> None:
    parse = build_parser().parse_args
    assert parse([]).days == DEFAULT_DAYS == 7
    assert parse(["--full-month"]).days == 31  # days_arg: more than the month has = all of it
    assert parse(["--days", "3"]).days == 3
    with pytest.raises(SystemExit):
        parse(["--days", "3", "--full-month"])


def test_default_week_shows_every_scenario_event() -> None:
    """The shorter default loses no feature: every fault, XID and pod of the example
    scenarios starts within the simulated week (later runs are repeats)."""
    week = DEFAULT_DAYS * 86400.0
    events = 0
    for path in scenario_paths(None):
        sc = load_scenario(str(path))
        starts = [f.at for f in sc.faults] + [x.at for x in sc.xids] + [p.start for p in sc.pods]
        events += len(starts)
        assert all(t < week for t in starts), path.name
        assert all(p.repeat is None or p.repeat < week for p in sc.pods), path.name
    assert events > 20


def test_scenario_flag_splits_nvidia_and_vendor_nodes() -> None:
    assert [p.name for p in vendor_scenario_paths(None)] == [
        "intel-igpu-gvtg.yaml", "intel-max-sriov.yaml", "intel-max-tiles.yaml",
        "mi300x-cpx.yaml", "mxgpu-host.yaml"]
    names = ["h100-mig.yaml", "vendors/mi300x-cpx.yaml"]
    assert [p.name for p in scenario_paths(names)] == ["h100-mig.yaml"]
    assert [p.name for p in vendor_scenario_paths(names)] == ["mi300x-cpx.yaml"]
