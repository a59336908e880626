"""Waste recommendations from a month of hand-made facts, priced by the real engine. Each
kind fires where it should and not where it must not (bursty memory peaks, too few hours,
unknown SM); recommendations never change the bill."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from test_report_fixtures import insert_coverage

from metering.costmodel import load_cost_model
from metering.db import connect
from metering.period import Month
from metering.pricing import price_period
from metering.report.waste import Kind, Recommendation, Settings, mig_fraction, recommend, units_for
from tests.ledger_rows import ins

D = Decimal
GB = 10**9
H100, A100, L4 = "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "NVIDIA L4"
MONTH = Month.parse("2026-10")
T0 = datetime(2026, 10, 1)
COST_MODEL = """
currency: EUR
pricing:
  default: {hourly: 1.00}
  gpus:
    - {model: "NVIDIA H100 80GB HBM3", hourly: 4.00}
    - {model: "NVIDIA A100-SXM4-80GB", hourly: 2.00}
    - {model: "NVIDIA L4", hourly: 0.80}
"""


@dataclass
class Holder:
    """One pod holding one unit for `hours` hours from hour `first`."""

    pod: str
    uuid: str
    model: str
    hours: int
    mem_gb: float | None = 8.0  # hourly peak
    sm: float | None = 0.10  # hourly mean SM of the whole GPU (container figure)
    owner: tuple[str, str] = ("Deployment", "")
    first: int = 0
    mig: tuple[str, int, float | None] | None = None  # (profile, slices, GPM activity) on MIG
    peaks: dict[int, float] | None = None  # hour -> peak memory, overriding mem_gb
    namespace: str = "ml"
    cluster: str = "default"


def _facts(path: Path, holders: list[Holder], cost_model: str = COST_MODEL) -> Any:
    path.parent.mkdir(exist_ok=True)
    con = connect(path)
    devices: dict[tuple[int, str], str] = {}
    for h in holders:
        for i in range(h.first, h.first + h.hours):
            hour = T0 + timedelta(hours=i)
            mig_uuid = ""
            if h.mig is not None:
                profile, slices, gpm = h.mig
                mig_uuid = "MIG-" + h.uuid
                con.execute(ins("mig_hours") + "VALUES (?, 'n1', ?, ?, ?, ?, 7, NULL, 3600, ?)",
                            [hour, h.uuid, mig_uuid, profile, slices,
                             None if gpm is None else gpm * 3600])
            devices[(i, h.uuid)] = h.model
            peak = (h.peaks or {}).get(i - h.first, h.mem_gb)
            sm = None if h.sm is None or h.mig else h.sm * 3600
            if peak == 0:  # no process in the hour: no memory, no SM activity
                sm = 0.0 if sm is not None else None
            con.execute(
                ins("allocation_hours") + "VALUES (?, 'n1', ?, ?, 'main', ?, ?, ?, ?, 1, 1, "
                "3600, ?, ?, MAP {'team': 'vision'})",
                [hour, h.namespace, h.pod, h.uuid, mig_uuid,
                 "nvidia.com/gpu" if h.mig is None else f"nvidia.com/mig-{h.mig[0]}",
                 "exclusive" if h.mig is None else "mig",
                 0 if peak is None else peak * GB * 3600, sm])
            con.execute(ins("workload_hours") + "VALUES (?, ?, ?, 'main', ?, ?, ?, ?, ?)",
                        [hour, h.namespace, h.pod, h.uuid, mig_uuid,
                         h.owner[0] if h.owner[1] else "", h.owner[1],
                         None if peak is None else peak * GB])
    for (i, uuid), model in devices.items():
        mig = any(h.mig for h in holders if h.uuid == uuid)
        con.execute(ins("device_hours") + "VALUES (?, 'n1', '0', ?, ?, ?, 3600, 3600, NULL, "
                    "NULL)", [T0 + timedelta(hours=i), uuid, model, mig])
    for h in holders:  # rows were written in cluster 'default'; move this holder's
        if h.cluster != "default":
            for table in ("allocation_hours", "workload_hours"):
                con.execute(f"UPDATE {table} SET cluster = ? WHERE pod = ?", [h.cluster, h.pod])
            for table in ("device_hours", "mig_hours"):
                con.execute(f"UPDATE {table} SET cluster = ? WHERE uuid = ?", [h.cluster, h.uuid])
    insert_coverage(con, MONTH.start, MONTH.end, [])
    cm_path = path.parent / "cm.yaml"
    cm_path.write_text(cost_model)
    cm = load_cost_model(cm_path)
    price_period(con, cm, MONTH.start, MONTH.end)
    return con, cm


def _recs(tmp_path: Path, holders: list[Holder], cost_model: str = COST_MODEL,
          **settings: Any) -> list[Recommendation]:
    con, cm = _facts(tmp_path / "m.duckdb", holders, cost_model)
    try:
        return recommend(con, MONTH.start, MONTH.end, mig_fraction(cm), Settings(**settings))
    finally:
        con.close()


def test_catalogue_covers_the_demo_models() -> None:
    h100 = units_for(H100)
    assert h100 is not None and [p.name for p in h100.profiles][:2] == ["1g.10gb", "1g.20gb"]
    assert units_for("NVIDIA A100-SXM4-40GB").profiles[0].name == "1g.5gb"  # type: ignore[union-attr]
    assert units_for(L4) is not None and units_for(L4).profiles == ()  # type: ignore[union-attr]
    assert units_for("Some Future GPU") is None


def test_whole_gpu_to_smallest_fitting_mig_profile(tmp_path: Path) -> None:
    # 100 h of a whole H100 at 4.00: 400.00. Peak 9 GB, SM 10 %: 1g.10gb holds 9 GB (90 % of
    # 10) and 1/7 x 90 % = 12.9 % SM. Saving at slices pricing: 400 x (1 - 1/7) = 342.857143.
    recs = _recs(tmp_path, [Holder("infer-7d9f-abcde", "GPU-1", H100, 100, mem_gb=8.0,
                                   owner=("Deployment", "infer"), peaks={5: 9.0})])
    assert len(recs) == 1
    r = recs[0]
    assert (r.kind, r.proposed, r.current) == (Kind.TO_MIG, "MIG 1g.10gb", "whole GPU")
    assert (r.owner_kind, r.owner_name, r.team) == ("Deployment", "infer", "vision")
    assert r.cost == D("400") and r.saving == D("342.857143")
    ev = r.evidence
    assert (ev.hours, ev.peak_memory_gb, ev.p95_memory_gb, ev.p95_sm) == (
        100, D("9"), D("8"), D("0.1"))
    assert ev.coverage == 1 and r.confidence == "medium"  # 100 h < a week


def test_bursty_memory_peak_keeps_a_larger_profile(tmp_path: Path) -> None:
    # Same workload but one hour peaks at 30 GB: p95 is still 8 GB, yet only 3g.40gb (36 GB
    # usable) holds the peak. Saving 400 x (1 - 3/7) = 228.571429, not the 1g.10gb one.
    recs = _recs(tmp_path, [Holder("infer-1", "GPU-1", H100, 100, peaks={50: 30.0})])
    assert [(r.proposed, r.saving) for r in recs] == [("MIG 3g.40gb", D("228.571429"))]
    assert recs[0].evidence.p95_memory_gb == D("8")


def test_nothing_fits_nothing_recommended(tmp_path: Path) -> None:
    assert _recs(tmp_path, [Holder("big", "GPU-1", H100, 100, mem_gb=70.0, sm=0.9)]) == []


def test_too_few_hours(tmp_path: Path) -> None:
    holders = [Holder("infer-1", "GPU-1", H100, 71)]
    assert _recs(tmp_path, holders) == []  # default minimum 72 h
    assert len(_recs(tmp_path / "again", holders, min_hours=24)) == 1


def test_pod_name_churn_does_not_split_a_workload(tmp_path: Path) -> None:
    # Two pods of one Deployment, 50 h each (one after the other): 100 h, one recommendation.
    recs = _recs(tmp_path, [
        Holder("infer-5f6d-aaaaa", "GPU-1", H100, 50, owner=("Deployment", "infer")),
        Holder("infer-5f6d-bbbbb", "GPU-2", H100, 50, owner=("Deployment", "infer"), first=50),
    ])
    assert len(recs) == 1 and recs[0].evidence.hours == 100
    # Without owners, each pod is its own workload with 50 h: below the minimum.
    assert _recs(tmp_path / "b", [Holder("a", "GPU-1", H100, 50, owner=("", "")),
                                  Holder("b", "GPU-2", H100, 50, owner=("", ""), first=50)]) == []


def test_gpu_without_mig_gets_a_share(tmp_path: Path) -> None:
    # L4 (24 GB, no MIG) at 0.80: 100 h = 80.00. Peak 4 GB, SM 10 %: a quarter holds 6 GB x 90 %
    # = 5.4 GB and 22.5 % SM. Saving 80 x 3/4 = 60.
    recs = _recs(tmp_path, [Holder("nb", "GPU-1", L4, 100, mem_gb=4.0)])
    assert [(r.kind, r.saving) for r in recs] == [(Kind.TO_SHARE, D("60"))]
    assert recs[0].proposed.startswith("1/4 of a GPU")


def test_mig_holder_down_one_profile(tmp_path: Path) -> None:
    # 3g.40gb of an H100 with GPM at 20 % of the instance, peak 15 GB. 2g.20gb holds 18 GB and
    # 20 % x 3/2 = 30 % of its SMs. Cost: floor(4 x 3/7 micros) = 1.714285 x 100 h = 171.4285;
    # saving = 171.4285 x (1 - 2/3) = 57.142833.
    recs = _recs(tmp_path, [Holder("emb", "GPU-1", H100, 100, mem_gb=15.0,
                                   mig=("3g.40gb", 3, 0.2))])
    assert [(r.kind, r.proposed, r.cost, r.saving) for r in recs] == [
        (Kind.MIG_DOWN, "MIG 2g.20gb", D("171.4285"), D("57.142833"))]
    assert recs[0].current == "MIG 3g.40gb" and recs[0].evidence.p95_sm == D("0.2")


def test_mig_holder_up_when_memory_runs_out(tmp_path: Path) -> None:
    # 2g.20gb with a 19.5 GB peak (>= 95 % of 20): up to 3g.40gb, the next with more memory:
    # costs 3/2 of today's: floor(4 x 2/7) = 1.142857 x 100 = 114.2857, extra 57.14285.
    recs = _recs(tmp_path, [Holder("emb", "GPU-1", H100, 100, mem_gb=19.5,
                                   mig=("2g.20gb", 2, 0.3))])
    assert [(r.kind, r.proposed, r.saving) for r in recs] == [
        (Kind.MIG_UP, "MIG 3g.40gb", D("-57.14285"))]


def test_mig_without_gpm_is_never_rightsized(tmp_path: Path) -> None:
    # A100 has no GPM: SM activity of the instance is unknown, so no profile is proposed,
    # however small the memory.
    recs = _recs(tmp_path, [Holder("old", "GPU-1", A100, 200, mem_gb=1.0,
                                   mig=("3g.40gb", 3, None))])
    assert recs == []


def test_idle_holder(tmp_path: Path) -> None:
    # A Job holds an H100 for 100 h; 30 of them with no GPU process (peak memory 0): 30 x 4.00.
    idle = dict.fromkeys(range(30), 0.0)
    recs = _recs(tmp_path, [Holder("batch-x1", "GPU-1", H100, 100, mem_gb=60.0, sm=0.8,
                                   owner=("Job", "batch"), peaks=idle)])
    assert [(r.kind, r.saving, r.evidence.idle_device_hours) for r in recs] == [
        (Kind.IDLE, D("120"), 30)]
    # 20 idle hours: under the default 24, nothing; a lower threshold flags it.
    idle20 = dict.fromkeys(range(20), 0.0)
    h = [Holder("batch-x1", "GPU-1", H100, 100, mem_gb=60.0, sm=0.8, peaks=idle20)]
    assert _recs(tmp_path / "b", h) == []
    assert [r.saving for r in _recs(tmp_path / "c", h, idle_hours=20)] == [D("80")]


def test_unknown_peak_memory_is_not_idle_and_not_rightsized(tmp_path: Path) -> None:
    # Facts from before peaks were ingested: memory_max NULL. Neither idle nor rightsizable.
    assert _recs(tmp_path, [Holder("x", "GPU-1", H100, 100, mem_gb=None)]) == []


def test_recommendations_never_change_the_bill(tmp_path: Path) -> None:
    holders = [Holder("infer-1", "GPU-1", H100, 100, owner=("Deployment", "infer")),
               Holder("batch", "GPU-2", H100, 100, mem_gb=60.0, sm=0.8,
                      peaks=dict.fromkeys(range(40), 0.0)),
               Holder("emb", "GPU-3", H100, 100, mem_gb=15.0, mig=("3g.40gb", 3, 0.2))]
    con, cm = _facts(tmp_path / "m.duckdb", holders)
    snapshot = "SELECT * FROM charges ORDER BY ALL"
    try:
        before = con.execute(snapshot).fetchall()
        recs = recommend(con, MONTH.start, MONTH.end, mig_fraction(cm))
        after = con.execute(snapshot).fetchall()
    finally:
        con.close()
    assert {r.kind for r in recs} == {Kind.TO_MIG, Kind.IDLE, Kind.MIG_DOWN}
    assert before == after
    # Ranked by money.
    assert [r.saving for r in recs] == sorted((r.saving for r in recs), reverse=True)


@pytest.mark.parametrize("fraction", ["memory", "table"])
def test_saving_follows_the_cost_models_mig_fraction(tmp_path: Path, fraction: str) -> None:
    cm_text = COST_MODEL.replace("}\n", ", memory_gb: 80}\n") + (
        f"mig: {{fraction: {fraction}, table: {{1g.10gb: 0.25}}}}\n")
    con, _ = _facts(tmp_path / "m.duckdb", [Holder("infer-1", "GPU-1", H100, 100)])
    path = tmp_path / "cm2.yaml"
    path.write_text(cm_text)
    try:
        recs = recommend(con, MONTH.start, MONTH.end, mig_fraction(load_cost_model(path)))
    finally:
        con.close()
    # memory: 10/80 = 1/8 -> 400 x 7/8 = 350; table: 0.25 -> 300.
    assert recs[0].saving == (D("350") if fraction == "memory" else D("300"))


def test_idle_and_busy_hours_are_never_counted_twice(tmp_path: Path) -> None:
    # 140 h held: 40 with no process (160.00 of idle holding), 100 busy at 8 GB / 10 % SM
    # (400.00). Rightsizing looks at the busy hours only: 400 x 6/7; the idle rec at the 40.
    recs = _recs(tmp_path, [Holder("infer-1", "GPU-1", H100, 140, owner=("Deployment", "inf"),
                                   peaks=dict.fromkeys(range(100, 140), 0.0))])
    got = {r.kind: (r.cost, r.saving, r.evidence.hours) for r in recs}
    assert got == {Kind.TO_MIG: (D("400"), D("342.857143"), 100),
                   Kind.IDLE: (D("160"), D("160"), 100)}
    # Busy hours below the minimum: no rightsizing, the idle holding is still flagged.
    recs = _recs(tmp_path / "b", [Holder("x", "GPU-1", H100, 100,
                                         peaks=dict.fromkeys(range(40, 100), 0.0))])
    assert [r.kind for r in recs] == [Kind.IDLE]


def test_same_workload_name_in_two_clusters_is_two_workloads(tmp_path: Path) -> None:
    # ml/Deployment infer runs in cluster 'default' (peak 9 GB) and in 'eu' (peak 30 GB), 100 h
    # each on a whole H100, SM 10 %. Each is sized on its own hours and priced at its cluster's
    # rate: default 100 h x 4.00 = 400.00 -> 1g.10gb, saving 400 x (1 - 1/7) = 342.857143;
    # eu 100 h x 3.20 = 320.00 -> 3g.40gb (30 GB <= 36; 2g.20gb holds 18), saving 320 x
    # (1 - 3/7) = 182.857143. Merged, the pair would be one workload with a 30 GB peak.
    cost_model = COST_MODEL + """clusters:
  eu:
    pricing:
      default: {hourly: 1.00}
      gpus:
        - {model: "NVIDIA H100 80GB HBM3", hourly: 3.20}
"""
    recs = _recs(tmp_path, [
        Holder("infer-a", "GPU-1", H100, 100, mem_gb=9.0, owner=("Deployment", "infer")),
        Holder("infer-b", "GPU-2", H100, 100, mem_gb=30.0, owner=("Deployment", "infer"),
               cluster="eu"),
    ], cost_model)
    got = {(r.cluster, r.kind, r.proposed, r.cost, r.saving, r.evidence.peak_memory_gb)
           for r in recs}
    assert got == {
        ("default", Kind.TO_MIG, "MIG 1g.10gb", D("400"), D("342.857143"), D("9.000000")),
        ("eu", Kind.TO_MIG, "MIG 3g.40gb", D("320"), D("182.857143"), D("30.000000")),
    }
    assert recs[0].workload == "default/ml/Deployment/infer"  # largest saving first


def test_a_clusters_mig_fraction_prices_its_workloads(tmp_path: Path) -> None:
    # Cluster eu prices MIG by memory (1g.10gb = 10/80 of an H100 whose memory_gb is 80), the
    # top level by slices (1/7): the same 100 h at 4.00 saves 400 x 7/8 = 350.00 in eu and
    # 400 x 6/7 = 342.857143 in default.
    cost_model = COST_MODEL + """clusters:
  eu:
    mig: {fraction: memory}
    pricing:
      default: {hourly: 1.00, memory_gb: 24}
      gpus:
        - {model: "NVIDIA H100 80GB HBM3", hourly: 4.00, memory_gb: 80}
"""
    recs = _recs(tmp_path, [
        Holder("infer-a", "GPU-1", H100, 100, mem_gb=9.0, owner=("Deployment", "infer")),
        Holder("infer-b", "GPU-2", H100, 100, mem_gb=9.0, owner=("Deployment", "infer"),
               cluster="eu"),
    ], cost_model)
    assert {(r.cluster, r.proposed, r.saving) for r in recs} == {
        ("default", "MIG 1g.10gb", D("342.857143")), ("eu", "MIG 1g.10gb", D("350.000000"))}
