"""Pricing engine: hand-computed charges for the cases a platform team asks about, and the
invariant (charges + idle + down + adjustments = fleet cost, to the cent, per hour and model)."""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from metering import pricing
from metering.costmodel import CostModel, load_cost_model
from metering.db import connect, memory_limit
from metering.pricing import PricingResult, choose_slice, price_period
from metering.progress import Progress
from tests.ledger_rows import ins

H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-40GB"
T0 = datetime(2026, 10, 1, 0, 0)
T1 = T0 + timedelta(hours=1)

BASE = """
currency: EUR
pricing:
  default: {hourly: 1.00, memory_gb: 16}
  gpus:
    - {model: "NVIDIA H100 80GB HBM3", hourly: 4.00, memory_gb: 80}
    - {pattern: "NVIDIA A100*", hourly: 2.00, memory_gb: 40}
teams:
  label: team
  namespaces:
    - {namespace: research, team: science}
    - {namespace: "ml-*", team: ml}
"""


def model(tmp_path: Path, extra: str = "") -> CostModel:
    path = tmp_path / "cost-model.yaml"
    path.write_text(BASE + extra)
    return load_cost_model(path)


@pytest.fixture
def con() -> Any:
    c = connect(":memory:")
    yield c
    c.close()


def device(con: Any, uuid: str, model_name: str = H100, hour: datetime = T0,
           up: float = 3600, mig: bool = False, node: str = "n1") -> None:
    con.execute(ins("device_hours") + "VALUES (?, ?, '0', ?, ?, ?, 3600, ?, NULL, NULL)",
                [hour, node, uuid, model_name, mig, up])


def mig(con: Any, uuid: str, mig_uuid: str, profile: str, slices: int,
        hour: datetime = T0, gpm: float | None = None) -> None:
    """gpm: the instance's SM-active seconds (GPM); None: no GPM (A100)."""
    con.execute(ins("mig_hours") + "VALUES (?, 'n1', ?, ?, ?, ?, 7, NULL, 3600, ?)",
                [hour, uuid, mig_uuid, profile, slices, gpm])


def alloc(con: Any, pod: str, uuid: str, *, ns: str = "research", mig_uuid: str = "",
          sharing: str = "exclusive", replicas: int = 1, units: float = 1,
          seconds: float = 3600, sm: float | None = 0, mem: float = 0,
          labels: dict[str, str] | None = None, hour: datetime = T0,
          container: str = "main", resource: str = "nvidia.com/gpu") -> None:
    con.execute(
        ins("allocation_hours") + "VALUES (?, 'n1', ?, ?, ?, ?, ?, ?, ?, ?, ?,"
        " ?, ?, ?, ?)",
        [hour, ns, pod, container, uuid, mig_uuid, resource, sharing, replicas, units, seconds,
         mem, sm, labels or {}])


def grant(con: Any, pod: str, uuid: str, memory: float | None, cores: float | None, *,
          ns: str = "research", hour: datetime = T0, container: str = "main") -> None:
    """A fractional grant's memory and core fractions (HAMi, gpushare) for an allocation."""
    con.execute(ins("grant_hours") + "VALUES (?, ?, ?, ?, ?, '', ?, ?)",
                [hour, ns, pod, container, uuid, memory, cores])


def charges(con: Any) -> dict[tuple[str, str], Decimal]:
    """(team, pod or uuid) -> cost; idle/down rows are keyed by device uuid."""
    out: dict[tuple[str, str], Decimal] = {}
    for team, pod, uuid, cost in con.execute(
            "SELECT team, pod, uuid, cost FROM charges").fetchall():
        key = (team, pod or uuid)
        out[key] = out.get(key, Decimal(0)) + cost
    return out


def d(text: str) -> Decimal:
    return Decimal(text)


def assert_balanced(con: Any, result: PricingResult) -> None:
    """Per hour and GPU model, every row together equals the fleet's device-hour cost."""
    bad = con.execute("""
        WITH fleet AS (
            SELECT hour, model, sum(CAST(rate_micros AS DECIMAL(18, 0))) * 0.000001 AS fleet
            FROM (SELECT hour, model, rate_micros FROM _fleet_rates) GROUP BY ALL),
        charged AS (SELECT hour, model, sum(cost) AS total FROM charges GROUP BY ALL)
        SELECT * FROM fleet FULL JOIN charged USING (hour, model)
        WHERE fleet IS DISTINCT FROM total""").fetchall()
    assert bad == []
    assert result.total == result.fleet_cost


def price(con: Any, cm: CostModel, start: datetime = T0, end: datetime = T1) -> PricingResult:
    # Keep each device-hour's list price where assert_balanced can see it.
    con.execute("CREATE OR REPLACE TEMP TABLE _fleet_rates (hour TIMESTAMP, model VARCHAR, "
                "rate_micros BIGINT)")
    for hour, model_name in con.execute(
            "SELECT hour, model FROM device_hours WHERE hour >= ? AND hour < ?",
            [start, end]).fetchall():
        rate = cm.price_for(model_name).hourly
        con.execute("INSERT INTO _fleet_rates VALUES (?, ?, ?)",
                    [hour, model_name, int(rate * 1_000_000)])
    result = price_period(con, cm, start, end)
    assert_balanced(con, result)
    return result


# --- the cases from the issue, by hand --------------------------------------------------------


def test_exclusive_gpus_charge_the_full_device_hour(con: Any, tmp_path: Path) -> None:
    device(con, "GPU-0")
    device(con, "GPU-1")
    alloc(con, "trainer", "GPU-0")
    alloc(con, "server", "GPU-1", ns="ml-serving")
    result = price(con, model(tmp_path))
    assert charges(con) == {("science", "trainer"): d("4"), ("ml", "server"): d("4")}
    assert (result.fleet_cost, result.charged, result.idle) == (d("8"), d("8"), d("0"))
    row = con.execute("SELECT sharing, basis, fraction, rate, allocated_gpu_hours, "
                      "cost_model_hash FROM charges WHERE pod = 'trainer'").fetchone()
    assert row[:5] == ("exclusive", "allocation", 1.0, 4.0, 1.0)
    assert row[5] == model(tmp_path).hash


def _mig_h100(con: Any) -> None:
    # 3g.40gb held all hour, one 2g.20gb held 30 minutes, the other 2g.20gb held by nobody.
    device(con, "GPU-m", mig=True)
    mig(con, "GPU-m", "MIG-a", "3g.40gb", 3)
    mig(con, "GPU-m", "MIG-b", "2g.20gb", 2)
    mig(con, "GPU-m", "MIG-c", "2g.20gb", 2)
    # NVML has no per-process SM on MIG: the facts hold no container SM figure (NULL).
    alloc(con, "big", "GPU-m", mig_uuid="MIG-a", sharing="mig", sm=None)
    alloc(con, "small", "GPU-m", mig_uuid="MIG-b", sharing="mig", seconds=1800, sm=None)


def test_mig_instances_pay_their_slices_and_unheld_ones_are_idle(con: Any,
                                                                  tmp_path: Path) -> None:
    _mig_h100(con)
    price(con, model(tmp_path))
    # 4.00 x 3/7 = 1.7142857 -> 1.714285; 4.00 x 2/7 x 1/2 = 0.5714285 -> 0.571428.
    assert charges(con) == {("science", "big"): d("1.714285"),
                            ("science", "small"): d("0.571428"),
                            ("idle", "GPU-m"): d("1.714287")}
    assert con.execute("SELECT profile FROM charges WHERE pod = 'big'").fetchone() == \
        ("3g.40gb",)


def test_mig_fraction_by_memory_and_by_table(con: Any, tmp_path: Path) -> None:
    _mig_h100(con)
    price(con, model(tmp_path, "mig: {fraction: memory}\n"))
    # 40/80 x 4.00 = 2.00; 20/80 x 4.00 x 1/2 = 0.50; idle 1.50.
    assert charges(con) == {("science", "big"): d("2"), ("science", "small"): d("0.5"),
                            ("idle", "GPU-m"): d("1.5")}
    price(con, model(tmp_path, "mig: {fraction: table, table: {3g.40gb: 0.6}}\n"))
    # 0.6 x 4.00 = 2.40; 2g.20gb is not in the table: 2/7 x 4.00 x 1/2 = 0.571428.
    assert charges(con) == {("science", "big"): d("2.4"), ("science", "small"): d("0.571428"),
                            ("idle", "GPU-m"): d("1.028572")}


def test_usage_basis_falls_back_to_allocation_on_mig_and_says_so(con: Any,
                                                                  tmp_path: Path) -> None:
    _mig_h100(con)
    price(con, model(tmp_path, "basis: {mode: usage}\n"))
    assert con.execute("SELECT DISTINCT basis FROM charges WHERE pod <> ''").fetchall() == \
        [("allocation (no SM data on MIG)",)]
    assert charges(con)[("science", "big")] == d("1.714285")


def used(con: Any) -> dict[str, tuple[float, float | None, str]]:
    """pod -> (allocated GPU-h, used GPU-h or None when unknown, basis), over all hours."""
    rows = con.execute("SELECT pod, sum(allocated_gpu_hours), sum(used_gpu_hours), "
                       "string_agg(DISTINCT basis, ',') FROM charges WHERE pod <> '' "
                       "GROUP BY pod").fetchall()
    return {pod: (a, u, b) for pod, a, u, b in rows}


def test_mig_usage_comes_from_gpm_where_the_gpu_has_it(con: Any, tmp_path: Path) -> None:
    # H100 with GPM: 3g.40gb at 50% SM active for 2 h (1800 s of each hour).
    # A100 without GPM: 3g.40gb held the same 2 h, SM activity unknown.
    for h in range(2):
        hour = T0 + timedelta(hours=h)
        device(con, "GPU-h", hour=hour, mig=True)
        device(con, "GPU-a", A100, hour=hour, mig=True)
        mig(con, "GPU-h", "MIG-h", "3g.40gb", 3, hour, gpm=1800)
        mig(con, "GPU-a", "MIG-a", "3g.40gb", 3, hour)
        alloc(con, "hopper", "GPU-h", mig_uuid="MIG-h", sharing="mig", sm=None, hour=hour)
        alloc(con, "ampere", "GPU-a", mig_uuid="MIG-a", sharing="mig", sm=None, hour=hour)
    end = T0 + timedelta(hours=2)
    price(con, model(tmp_path), T0, end)
    got = used(con)
    # used = 0.5 x 3/7 x 2 h = 0.428571 GPU-h of 3/7 x 2 = 0.857143 allocated: 50%.
    assert got["hopper"][0] == pytest.approx(6 / 7)
    assert got["hopper"][1] == pytest.approx(0.428571, abs=1e-6)
    assert got["ampere"][0] == pytest.approx(6 / 7) and got["ampere"][1] is None
    # Usage basis: GPM prices the H100 instance; the A100 one falls back to allocation.
    price(con, model(tmp_path, "basis: {mode: usage}\n"), T0, end)
    got = used(con)
    assert (got["hopper"][2], got["ampere"][2]) == ("usage", "allocation (no SM data on MIG)")
    # 4.00 x 0.5 x 3/7 = 0.857142 per hour; 2.00 x 3/7 = 0.857142 per hour.
    assert charges(con)[("science", "hopper")] == d("1.714284")
    assert charges(con)[("science", "ampere")] == d("1.714284")


def test_containers_sharing_a_mig_instance_split_its_gpm_activity(con: Any,
                                                                   tmp_path: Path) -> None:
    device(con, "GPU-m", mig=True)
    # MIG-s: 2g.20gb time-sliced 2 ways, both replicas held all hour, 75% SM active.
    mig(con, "GPU-m", "MIG-s", "2g.20gb", 2, gpm=2700)
    for pod in ("r0", "r1"):
        alloc(con, pod, "GPU-m", mig_uuid="MIG-s", sharing="time-slicing", replicas=2, sm=None)
    # MIG-q: 3g.40gb held by "first" for 20 min, then by "second" for 40, 50% SM active.
    mig(con, "GPU-m", "MIG-q", "3g.40gb", 3, gpm=1800)
    alloc(con, "first", "GPU-m", mig_uuid="MIG-q", sharing="mig", seconds=1200, sm=None)
    alloc(con, "second", "GPU-m", mig_uuid="MIG-q", sharing="mig", seconds=2400, sm=None)
    price(con, model(tmp_path))
    got = used(con)
    # r0, r1: 0.75 x 2/7 x 1/2 = 0.107143 each; allocated 2/7 x 1/2 = 0.142857.
    for pod in ("r0", "r1"):
        assert got[pod][:2] == pytest.approx((1 / 7, 0.75 * 2 / 7 / 2))
    # first: 0.5 x 3/7 x 1200/3600 = 0.071429; second: 0.5 x 3/7 x 2400/3600 = 0.142857.
    assert got["first"][1] == pytest.approx(0.5 * 3 / 7 / 3)
    assert got["second"][1] == pytest.approx(0.5 * 3 / 7 * 2 / 3)


def test_a_container_without_sm_samples_is_unknown_not_idle(con: Any, tmp_path: Path) -> None:
    device(con, "GPU-0")
    device(con, "GPU-1")
    alloc(con, "silent", "GPU-0", sm=None)  # no gpu_container_sm_utilization_ratio samples
    alloc(con, "idle-pod", "GPU-1", sm=0)  # samples, all 0
    price(con, model(tmp_path, "basis: {mode: usage}\n"))
    got = used(con)
    assert got["silent"] == (1.0, None, "allocation (no SM data)")
    assert got["idle-pod"] == (1.0, 0.0, "usage")
    assert charges(con)[("science", "silent")] == d("4")
    assert charges(con)[("science", "idle-pod")] == d("0")


def test_time_sliced_four_ways_with_three_replicas_in_use(con: Any, tmp_path: Path) -> None:
    device(con, "GPU-ts")
    for pod in ("a", "b", "c"):
        alloc(con, pod, "GPU-ts", sharing="time-slicing", replicas=4)
    price(con, model(tmp_path))
    # Each replica is 1/4 of 4.00; the fourth, unheld, is idle.
    assert charges(con) == {("science", "a"): d("1"), ("science", "b"): d("1"),
                            ("science", "c"): d("1"), ("idle", "GPU-ts"): d("1")}


def test_a_container_holding_two_of_four_replicas_pays_half(con: Any, tmp_path: Path) -> None:
    device(con, "GPU-ts")
    alloc(con, "pair", "GPU-ts", sharing="mps", replicas=4, units=2)
    alloc(con, "one", "GPU-ts", sharing="mps", replicas=4, units=1)
    price(con, model(tmp_path))
    assert charges(con) == {("science", "pair"): d("2"), ("science", "one"): d("1"),
                            ("idle", "GPU-ts"): d("1")}


def test_usage_weighted_split_of_a_shared_gpu(con: Any, tmp_path: Path) -> None:
    device(con, "GPU-ts")
    alloc(con, "busy", "GPU-ts", sharing="time-slicing", replicas=4, sm=1800, mem=3e12)
    alloc(con, "light", "GPU-ts", sharing="time-slicing", replicas=4, sm=900, mem=1e12)
    alloc(con, "quiet", "GPU-ts", sharing="time-slicing", replicas=4, sm=0, mem=0)
    price(con, model(tmp_path, "sharing: {split: sm}\n"))
    # Three shares held = 3.00, split 1800:900:0 -> 2.00, 1.00, 0; the unheld share idle.
    assert charges(con) == {("science", "busy"): d("2"), ("science", "light"): d("1"),
                            ("science", "quiet"): d("0"), ("idle", "GPU-ts"): d("1")}
    price(con, model(tmp_path, "sharing: {split: memory}\n"))
    # By memory 3:1:0 -> 2.25, 0.75, 0.
    assert charges(con)[("science", "busy")] == d("2.25")
    assert charges(con)[("science", "light")] == d("0.75")


def test_a_pod_running_20_minutes_pays_20_minutes(con: Any, tmp_path: Path) -> None:
    device(con, "GPU-0")
    alloc(con, "short", "GPU-0", seconds=1200)
    price(con, model(tmp_path))
    # 4.00 x 1200/3600 = 1.333333 (rounded down); the other 40 minutes are idle.
    assert charges(con) == {("science", "short"): d("1.333333"), ("idle", "GPU-0"): d("2.666667")}


def test_a_gpu_down_for_two_hours_costs_the_fleet_not_the_team(con: Any, tmp_path: Path) -> None:
    for h in range(4):
        hour = T0 + timedelta(hours=h)
        # Up in hour 0, fell off the bus for hours 1 and 2, back for half of hour 3.
        device(con, "GPU-0", hour=hour, up=[3600, 0, 0, 1800][h])
        alloc(con, "job", "GPU-0", hour=hour)  # the pod kept its allocation throughout
    result = price(con, model(tmp_path), T0, T0 + timedelta(hours=4))
    per_hour = con.execute("SELECT hour, team, cost FROM charges ORDER BY hour, team").fetchall()
    assert [(h.hour, t, c) for h, t, c in per_hour] == [
        (0, "science", d("4")),
        (1, "down", d("4")), (1, "science", d("0")),
        (2, "down", d("4")), (2, "science", d("0")),
        (3, "down", d("2")), (3, "science", d("2")),
    ]
    assert (result.fleet_cost, result.charged, result.down) == (d("16"), d("6"), d("10"))
    assert result.hours == 4 and result.device_hours == 4


def test_team_from_label_then_namespace_rule_then_default(con: Any, tmp_path: Path) -> None:
    for i in range(6):
        device(con, f"GPU-{i}")
    alloc(con, "labelled", "GPU-0", ns="research", labels={"team": "vision"})
    alloc(con, "exact-rule", "GPU-1", ns="research")
    alloc(con, "glob-rule", "GPU-2", ns="ml-train")
    alloc(con, "nothing", "GPU-3", ns="default")
    alloc(con, "empty-label", "GPU-4", ns="ml-x", labels={"team": ""})
    alloc(con, "other-label", "GPU-5", ns="default", labels={"owner": "vision"})
    price(con, model(tmp_path))
    teams = dict(con.execute("SELECT pod, team FROM charges").fetchall())
    assert teams == {"labelled": "vision", "exact-rule": "science", "glob-rule": "ml",
                     "nothing": "unallocated", "empty-label": "ml", "other-label": "unallocated"}
    price(con, load_cost_model_with(tmp_path, "owner"))
    teams = dict(con.execute("SELECT pod, team FROM charges").fetchall())
    assert teams["other-label"] == "vision" and teams["labelled"] == "science"


def load_cost_model_with(tmp_path: Path, label: str) -> CostModel:
    path = tmp_path / "label.yaml"
    path.write_text(BASE.replace("label: team", f"label: {label}"))
    return load_cost_model(path)


# --- idle policies ------------------------------------------------------------------------------


def _two_teams(con: Any) -> None:
    # GPU-0: science all hour (4.00). GPU-1: vision for 30 minutes (2.00), idle 2.00.
    # An A100 nobody used (2.00 idle, no A100 users to share it with).
    device(con, "GPU-0")
    device(con, "GPU-1")
    device(con, "GPU-a", model_name=A100)
    alloc(con, "s", "GPU-0")
    alloc(con, "v", "GPU-1", labels={"team": "vision"}, seconds=1800)


def test_idle_separate_is_its_own_row(con: Any, tmp_path: Path) -> None:
    _two_teams(con)
    result = price(con, model(tmp_path))
    assert charges(con) == {("science", "s"): d("4"), ("vision", "v"): d("2"),
                            ("idle", "GPU-1"): d("2"), ("idle", "GPU-a"): d("2")}
    assert (result.idle, result.idle_shared) == (d("4"), d("0"))


def test_idle_shared_proportionally(con: Any, tmp_path: Path) -> None:
    _two_teams(con)
    result = price(con, model(tmp_path, "idle: {policy: proportional}\n"))
    # 2.00 of H100 idle split 4:2 -> 1.333333 + the leftover micro, 0.666666.
    assert charges(con) == {("science", "s"): d("5.333334"), ("vision", "v"): d("2.666666"),
                            ("idle", "GPU-a"): d("2")}
    assert con.execute("SELECT idle_share FROM charges WHERE pod = 'v'").fetchone() == \
        (d("0.666666"),)
    assert (result.idle_shared, result.idle) == (d("2"), d("2"))


def test_idle_shared_evenly(con: Any, tmp_path: Path) -> None:
    _two_teams(con)
    price(con, model(tmp_path, "idle: {policy: even}\n"))
    assert charges(con) == {("science", "s"): d("5"), ("vision", "v"): d("3"),
                            ("idle", "GPU-a"): d("2")}


def test_idle_shared_by_fixed_weights(con: Any, tmp_path: Path) -> None:
    _two_teams(con)
    price(con, model(tmp_path, "idle: {policy: weights, weights: {science: 0.75, ops: 0.25}}\n"))
    # Each model's idle pool is split 3:1 whether or not the team used that model.
    rows = con.execute("SELECT team, model, cost, idle_share FROM charges "
                       "WHERE basis = 'idle-share' ORDER BY model, team").fetchall()
    assert rows == [("ops", A100, d("0.5"), d("0.5")), ("science", A100, d("1.5"), d("1.5")),
                    ("ops", H100, d("0.5"), d("0.5")), ("science", H100, d("1.5"), d("1.5"))]
    assert con.execute("SELECT count(*) FROM charges WHERE team = 'idle'").fetchone() == (0,)


def test_down_time_is_never_shared_out(con: Any, tmp_path: Path) -> None:
    device(con, "GPU-0")
    device(con, "GPU-1", up=0)
    alloc(con, "s", "GPU-0")
    price(con, model(tmp_path, "idle: {policy: proportional}\n"))
    assert charges(con) == {("science", "s"): d("4"), ("down", "GPU-1"): d("4")}


# --- basis, tiers, discounts, efficiency --------------------------------------------------------


def test_usage_and_blend_basis(con: Any, tmp_path: Path) -> None:
    device(con, "GPU-0")
    alloc(con, "p", "GPU-0", sm=900)  # 25% SM activity for the hour
    price(con, model(tmp_path, "basis: {mode: usage}\n"))
    assert charges(con) == {("science", "p"): d("1"), ("idle", "GPU-0"): d("3")}
    row = con.execute("SELECT basis, allocated_gpu_hours, used_gpu_hours FROM charges "
                      "WHERE pod = 'p'").fetchone()
    assert row == ("usage", 1.0, 0.25)
    price(con, model(tmp_path, "basis: {mode: blend, usage_weight: 0.5}\n"))
    # (0.5 x 1 + 0.5 x 0.25) x 4.00 = 2.50
    assert charges(con) == {("science", "p"): d("2.5"), ("idle", "GPU-0"): d("1.5")}


def test_discounts_and_factors_become_an_adjustment_row(con: Any, tmp_path: Path) -> None:
    device(con, "GPU-0")
    device(con, "GPU-ts")
    alloc(con, "p", "GPU-0")
    alloc(con, "q", "GPU-ts", ns="ml-a", sharing="time-slicing", replicas=4)
    result = price(con, model(tmp_path, (
        "discounts: {teams: {science: 0.1}, models: {'NVIDIA H100*': 0.5}}\n"
        "sharing: {efficiency: {time-slicing: 0.8}}\n")))
    # p: 4.00 x 0.9 x 0.5 = 1.80; q: 1.00 x 0.8 x 0.5 = 0.40; given away 2.20 + 0.60.
    assert charges(con) == {("science", "p"): d("1.8"), ("ml", "q"): d("0.4"),
                            ("idle", "GPU-ts"): d("3"), ("adjustment", ""): d("2.8")}
    assert con.execute("SELECT rate FROM charges WHERE pod = 'p'").fetchone() == (1.8,)
    assert result.adjustment == d("2.8")


def test_utilization_tiers_can_surcharge(con: Any, tmp_path: Path) -> None:
    device(con, "GPU-0")
    device(con, "GPU-1")
    alloc(con, "lazy", "GPU-0", sm=180)  # 5% utilisation
    alloc(con, "busy", "GPU-1", sm=3240)  # 90%
    price(con, model(tmp_path, "utilization_tiers:\n  - {up_to: 0.1, multiplier: 1.5}\n"
                               "  - {up_to: 1, multiplier: 1}\n"))
    # lazy pays 4.00 x 1.5 = 6.00; the extra 2.00 is a negative adjustment.
    assert charges(con) == {("science", "lazy"): d("6"), ("science", "busy"): d("4"),
                            ("adjustment", ""): d("-2")}


# --- engine behaviour ---------------------------------------------------------------------------


def test_repricing_is_idempotent_and_only_touches_the_period(con: Any, tmp_path: Path) -> None:
    for h in range(2):
        device(con, "GPU-0", hour=T0 + timedelta(hours=h))
        alloc(con, "p", "GPU-0", hour=T0 + timedelta(hours=h), seconds=1800)
    cm = model(tmp_path)
    price(con, cm, T0, T0 + timedelta(hours=2))
    before = con.execute("SELECT * FROM charges ORDER BY ALL").fetchall()
    price(con, cm, T0, T0 + timedelta(hours=2))
    assert con.execute("SELECT * FROM charges ORDER BY ALL").fetchall() == before
    # Re-price only the second hour with another model: the first hour keeps its rows.
    other = model(tmp_path, "discounts: {teams: {science: 0.5}}\n")
    price_period(con, other, T1, T1 + timedelta(hours=1))
    hashes = con.execute("SELECT hour, any_value(cost_model_hash) FROM charges GROUP BY hour "
                         "ORDER BY hour").fetchall()
    assert hashes == [(T0, cm.hash), (T1, other.hash)]
    assert len(con.execute("SELECT * FROM charges").fetchall()) == len(before) + 1


def test_aware_datetimes_and_orphan_allocations(con: Any, tmp_path: Path) -> None:
    device(con, "GPU-0")
    alloc(con, "p", "GPU-0")
    alloc(con, "ghost", "GPU-gone")  # no device fact in that hour: cannot be priced
    result = price_period(con, model(tmp_path), T0.replace(tzinfo=UTC), T1.replace(tzinfo=UTC))
    assert result.unpriced_allocations == 1
    # pricing turns insertion order off for its inserts and gives the caller's setting back
    assert con.execute("SELECT current_setting('preserve_insertion_order')").fetchone() == \
        (True,)
    assert charges(con) == {("science", "p"): d("4")}
    assert result.default_priced_models == ()
    with pytest.raises(ValueError, match="start before end"):
        price_period(con, model(tmp_path), T1, T0)


def test_models_without_an_entry_use_the_default_price(con: Any, tmp_path: Path) -> None:
    device(con, "GPU-t4", model_name="Tesla T4")
    alloc(con, "p", "GPU-t4", seconds=1800)
    result = price(con, model(tmp_path))
    assert result.default_priced_models == ("Tesla T4",)
    assert charges(con) == {("science", "p"): d("0.5"), ("idle", "GPU-t4"): d("0.5")}


def test_overclaimed_device_is_scaled_to_what_it_was_up(con: Any, tmp_path: Path) -> None:
    # Two pods both claim the whole exclusive GPU for the hour (a pod replaced mid-hour that
    # the facts cannot tell apart): together they pay one device-hour, half each.
    device(con, "GPU-0")
    alloc(con, "old", "GPU-0")
    alloc(con, "new", "GPU-0")
    price(con, model(tmp_path))
    assert charges(con) == {("science", "old"): d("2"), ("science", "new"): d("2")}


def test_a_failed_run_leaves_the_previous_charges(con: Any, tmp_path: Path) -> None:
    device(con, "GPU-0")
    alloc(con, "p", "GPU-0")
    price(con, model(tmp_path))
    before = con.execute("SELECT * FROM charges").fetchall()
    con.execute("ALTER TABLE allocation_hours RENAME COLUMN sm_seconds TO sm_s")
    with pytest.raises(duckdb.Error):
        price_period(con, model(tmp_path), T0, T1)
    assert con.execute("SELECT * FROM charges").fetchall() == before


# --- the invariant, over random fleets ----------------------------------------------------------

_policies = st.sampled_from(["separate", "proportional", "even", "weights"])
_splits = st.sampled_from(["replicas", "memory", "sm"])
_bases = st.sampled_from(["allocation", "usage", "blend"])
_fractions = st.sampled_from(["slices", "memory", "table"])
_grant_bases = st.sampled_from(["memory", "cores", "larger"])


@st.composite
def _fleets(draw: st.DrawFn) -> list[tuple[str, Any]]:
    """A few hours of a few GPUs, each exclusive, time-sliced or MIG, randomly held."""
    facts: list[tuple[str, Any]] = []
    for g in range(draw(st.integers(1, 5))):
        uuid = f"GPU-{g}"
        name = draw(st.sampled_from([H100, A100, "Tesla T4"]))
        kind = draw(st.sampled_from(["exclusive", "time-slicing", "mps", "mig", "fractional"]))
        replicas = 1 if kind in ("exclusive", "mig") else draw(st.integers(2, 8))
        for h in range(draw(st.integers(1, 3))):
            hour = T0 + timedelta(hours=h)
            up = draw(st.sampled_from([3600, 3600, 0, 1234.5, 3599]))
            facts.append(("device", (uuid, name, hour, up, kind == "mig")))
            holders = draw(st.integers(0, 4))
            for p in range(holders):
                seconds = draw(st.sampled_from([3600, 1200, 1, 0, 3333.3]))
                sm = draw(st.one_of(st.none(), st.floats(0, 4000, allow_nan=False)))
                mem = draw(st.floats(0, 1e13, allow_nan=False))
                labels = draw(st.sampled_from([{}, {"team": "vision"}, {"team": "x.y"}]))
                ns = draw(st.sampled_from(["research", "ml-a", "default"]))
                mig_uuid = ""
                if kind == "mig":
                    mig_uuid = f"MIG-{g}-{p}"
                    profile, slices = draw(st.sampled_from([("3g.40gb", 3), ("2g.20gb", 2),
                                                            ("1g.10gb", 1), ("7g.80gb", 7)]))
                    gpm = draw(st.one_of(st.none(), st.floats(0, 4000, allow_nan=False)))
                    facts.append(("mig", (uuid, mig_uuid, profile, slices, hour, gpm)))
                units = 1 if kind in ("exclusive", "mig") else draw(st.integers(1, replicas))
                if kind == "fractional" and draw(st.booleans()):
                    fracs = st.one_of(st.none(), st.floats(0, 1))
                    facts.append(("grant", dict(pod=f"p{p}", uuid=uuid, ns=ns, hour=hour,
                                                memory=draw(fracs), cores=draw(fracs))))
                facts.append(("alloc", dict(pod=f"p{p}", uuid=uuid, ns=ns, mig_uuid=mig_uuid,
                                            sharing=kind, replicas=replicas, units=units,
                                            seconds=seconds, sm=sm, mem=mem, labels=labels,
                                            hour=hour)))
    return facts


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(facts=_fleets(), policy=_policies, split=_splits, basis=_bases, fraction=_fractions,
       discount=st.sampled_from([0, 0.15, 1]), tier=st.booleans(), grants=_grant_bases)
def test_charges_plus_idle_equal_fleet_cost_for_any_fleet(
        tmp_path: Path, facts: list[tuple[str, Any]], policy: str, split: str, basis: str,
        fraction: str, discount: float, tier: bool, grants: str) -> None:
    extra = (f"idle: {{policy: {policy}"
             + (", weights: {science: 0.3, ops: 0.7}" if policy == "weights" else "") + "}\n"
             f"sharing: {{split: {split}, fractional: {grants}, "
             "efficiency: {mps: 0.7, fractional: 0.9}}\n"
             f"basis: {{mode: {basis}, usage_weight: 0.3}}\n"
             f"mig: {{fraction: {fraction}, table: {{2g.20gb: 0.3}}}}\n"
             f"discounts: {{teams: {{vision: {discount}}}}}\n")
    if tier:
        extra += "utilization_tiers: [{up_to: 0.5, multiplier: 1.3}, {up_to: 1, multiplier: 0.9}]\n"
    cm = model(tmp_path, extra)
    c = connect(":memory:")
    try:
        seen_mig: set[tuple[str, datetime]] = set()
        for kind, f in facts:
            if kind == "device":
                uuid, name, hour, up, is_mig = f
                device(c, uuid, name, hour, up, is_mig)
            elif kind == "mig":
                uuid, mig_uuid, profile, slices, hour, gpm = f
                if (mig_uuid, hour) not in seen_mig:
                    seen_mig.add((mig_uuid, hour))
                    mig(c, uuid, mig_uuid, profile, slices, hour, gpm)
            elif kind == "grant":
                grant(c, f["pod"], f["uuid"], f["memory"], f["cores"], ns=f["ns"],
                      hour=f["hour"])
            else:
                alloc(c, f.pop("pod"), f.pop("uuid"), **f)
        result = price(c, cm, T0, T0 + timedelta(hours=3))
        assert result.fleet_cost >= 0
        # Pricing an hour at a time (as it prices a long period a week at a time) gives the
        # same rows: every figure is per hour. Costs may move by a micro between rows of a
        # device-hour (float sums in another order), never the balance.
        costs = ("SELECT hour, team, namespace, pod, container, uuid, mig_uuid, model, "
                 "sharing, basis, sum(cost) FROM charges GROUP BY ALL")
        micro = Decimal("0.000001")
        together = {r[:-1]: r[-1] for r in c.execute(costs).fetchall()}
        hourly = price_period(c, cm, T0, T0 + timedelta(hours=3), slice_hours=1)
        assert_balanced(c, hourly)
        assert (hourly.fleet_cost, hourly.hours, hourly.device_hours) == \
            (result.fleet_cost, result.hours, result.device_hours)
        sliced = {r[:-1]: r[-1] for r in c.execute(costs).fetchall()}
        for k in together.keys() | sliced.keys():
            assert abs(together.get(k, 0) - sliced.get(k, 0)) <= micro, k
        # No team is charged for more than the device-time it held while the GPU was up,
        # before multipliers (list cost = rate x fraction, fractions <= up time per device).
        over = c.execute("""
            SELECT c.hour, c.uuid FROM charges c JOIN device_hours d USING (hour, uuid)
            WHERE c.sharing NOT IN ('idle', 'down', 'adjustment')
            GROUP BY c.hour, c.uuid, d.up_seconds
            HAVING sum(c.fraction) > d.up_seconds / 3600 + 1e-9""").fetchall()
        assert over == []
    finally:
        c.close()


def test_fractional_and_dra_shares_price_by_head_count(con: Any, tmp_path: Path) -> None:
    """What docs/cost-model.md says of DRA and fractional rows today. H100s at 4.00/h:
    GPU-f holds two HAMi grants (units 1 of replicas 2): 4.00 x 1/2 = 2.00 each; GPU-g one
    gpushare grant alone: 4.00; GPU-c one DRA claim consumed by two pods (time-slicing, 2
    replicas) for half an hour each: 4.00 x 1/2 x 0.5 = 1.00 each, idle 2.00. Fleet 12.00 =
    2 + 2 + 4 + 1 + 1 + 2."""
    for uuid in ("GPU-f", "GPU-g", "GPU-c"):
        device(con, uuid)
    alloc(con, "hami-a", "GPU-f", sharing="fractional", replicas=2)
    alloc(con, "hami-b", "GPU-f", sharing="fractional", replicas=2, ns="ml-x")
    alloc(con, "share", "GPU-g", sharing="fractional", replicas=1)
    alloc(con, "claim-a", "GPU-c", sharing="time-slicing", replicas=2, seconds=1800)
    alloc(con, "claim-b", "GPU-c", sharing="time-slicing", replicas=2, seconds=1800, ns="ml-y")
    result = price(con, model(tmp_path))
    assert charges(con) == {
        ("science", "hami-a"): d("2"), ("ml", "hami-b"): d("2"), ("science", "share"): d("4"),
        ("science", "claim-a"): d("1"), ("ml", "claim-b"): d("1"), ("idle", "GPU-c"): d("2")}
    assert (result.fleet_cost, result.idle) == (d("12"), d("2"))
    modes = {r[0] for r in con.execute("SELECT DISTINCT sharing FROM charges").fetchall()}
    assert "fractional" in modes


def test_a_dra_mps_share_is_priced_like_a_device_plugin_mps_share(con: Any,
                                                                   tmp_path: Path) -> None:
    """An MPS share is priced by its mode, not by who handed it out. H100s at 4.00/h,
    sharing.efficiency mps 0.7: GPU-p, one device-plugin MPS share (nvidia.com/gpu.shared,
    1 of 2 replicas): 4.00 x 1/2 x 0.7 = 1.40, idle 2.00; GPU-d, one DRA claim shared under
    MPS by two pods (resource gpu.nvidia.com, 2 shares): 1.40 each. Efficiency gives away
    3 x 0.60 = 1.80 (the adjustment row). Fleet 8.00 = 1.40 x 3 + 2.00 + 1.80."""
    device(con, "GPU-p")
    device(con, "GPU-d")
    alloc(con, "plugin", "GPU-p", sharing="mps", replicas=2, resource="nvidia.com/gpu.shared")
    for pod in ("claim-a", "claim-b"):
        alloc(con, pod, "GPU-d", sharing="mps", replicas=2, resource="gpu.nvidia.com")
    result = price(con, model(tmp_path, "sharing: {efficiency: {mps: 0.7}}\n"))
    got = charges(con)
    assert {k: v for k, v in got.items() if k[0] == "science"} == {
        ("science", "plugin"): d("1.4"), ("science", "claim-a"): d("1.4"),
        ("science", "claim-b"): d("1.4")}
    assert got[("idle", "GPU-p")] == d("2")
    assert con.execute("SELECT sum(cost) FROM charges WHERE team = 'adjustment'").fetchone() \
        == (d("1.8"),)
    assert result.fleet_cost == d("8")


@pytest.mark.parametrize(("basis", "a_cost", "idle_h"), [
    ("memory", "1.00", "2.50"), ("cores", "2.40", "1.10"), ("larger", "2.40", "1.10")])
def test_fractional_grants_pay_their_fraction(con: Any, tmp_path: Path, basis: str,
                                              a_cost: str, idle_h: str) -> None:
    """sharing.fractional prices a grant by its fraction of the GPU. H100s at 4.00/h.
    GPU-h: HAMi pod `a` granted 20 GiB of 80 (memory 0.25) and 60% of the cores, all hour;
    HAMi pod `b` granted memory 0.25 with no core limit, for 30 minutes.
      memory: a 4.00 x 0.25 = 1.00; b 4.00 x 0.25 x 30/60 = 0.50; idle 4.00 - 1.50 = 2.50.
      cores:  a 4.00 x 0.6 = 2.40; b has no core fraction, so its memory: 0.50; idle 1.10.
      larger: a max(0.25, 0.6) = 0.6 -> 2.40; b 0.50; idle 1.10.
    GPU-s: gpushare pod `c` granted 6 of 8 GiB units (memory 0.75, never a core figure):
      3.00 under every basis; idle 1.00.
    GPU-o: two grants of memory 0.75 each all hour (over-committed, 1.5 of the GPU): scaled
      down together to the device-hour, 2.00 each; idle 0.
    GPU-n: a fractional holder with no grant figures (an exporter that could not read the
      GPU's memory): head count, 1 of 2 replicas = 2.00; idle 2.00.
    Fleet 16.00 = every row together."""
    for uuid in ("GPU-h", "GPU-s", "GPU-o", "GPU-n"):
        device(con, uuid)
    alloc(con, "a", "GPU-h", sharing="fractional", replicas=2)
    grant(con, "a", "GPU-h", 0.25, 0.6)
    alloc(con, "b", "GPU-h", sharing="fractional", replicas=2, seconds=1800, ns="ml-x")
    grant(con, "b", "GPU-h", 0.25, None, ns="ml-x")
    alloc(con, "c", "GPU-s", sharing="fractional")
    grant(con, "c", "GPU-s", 0.75, None)
    for pod in ("o1", "o2"):
        alloc(con, pod, "GPU-o", sharing="fractional", replicas=2)
        grant(con, pod, "GPU-o", 0.75, None)
    alloc(con, "n", "GPU-n", sharing="fractional", replicas=2)
    result = price(con, model(tmp_path, f"sharing: {{fractional: {basis}}}\n"))
    assert charges(con) == {
        ("science", "a"): d(a_cost), ("ml", "b"): d("0.5"), ("idle", "GPU-h"): d(idle_h),
        ("science", "c"): d("3"), ("idle", "GPU-s"): d("1"),
        ("science", "o1"): d("2"), ("science", "o2"): d("2"),
        ("science", "n"): d("2"), ("idle", "GPU-n"): d("2")}
    assert result.fleet_cost == d("16")
    fractions = dict(con.execute(
        "SELECT pod, allocated_gpu_hours FROM charges WHERE pod IN ('a', 'b', 'c')").fetchall())
    assert fractions == pytest.approx(
        {"a": 0.25 if basis == "memory" else 0.6, "b": 0.125, "c": 0.75})


def test_a_fractional_grant_is_not_split_by_use(con: Any, tmp_path: Path) -> None:
    """sharing.split sm splits time-sliced shares by SM use, never a priced grant: `g` holds
    memory 0.5 of an H100 (4.00) and used no SM, `t` has one of 2 time-slicing replicas and
    used 1800 SM-seconds. g pays 4.00 x 0.5 = 2.00 and t 4.00 x 1/2 = 2.00 (the only holder
    of the time-sliced shares pays its own share); an efficiency factor for fractional 0.5
    halves g's charge: 1.00, and 1.00 goes to the adjustment row."""
    device(con, "GPU-0")
    alloc(con, "g", "GPU-0", sharing="fractional", replicas=2, sm=0)
    grant(con, "g", "GPU-0", 0.5, None)
    alloc(con, "t", "GPU-0", sharing="time-slicing", replicas=2, sm=1800)
    price(con, model(tmp_path, "sharing: {split: sm, efficiency: {fractional: 0.5}}\n"))
    got = charges(con)
    assert (got[("science", "g")], got[("science", "t")]) == (d("1"), d("2"))
    assert con.execute("SELECT cost FROM charges WHERE team = 'adjustment'").fetchall() == \
        [(d("1"),)]


@pytest.mark.parametrize(("table", "b_cost", "idle_v"), [
    ("", "1", "0.5"), ("vgpu: {table: {NVIDIA_A100-40C: 0.6}}\n", "1.2", "0.3")])
def test_vgpu_instances_pay_their_profile_share(con: Any, tmp_path: Path, table: str,
                                                b_cost: str, idle_v: str) -> None:
    """A vGPU costs its profile's share of the physical GPU. A100s at 2.00/h. GPU-v: vm-a's
    virt-launcher holds an A100-20C (framebuffer 20 of 80 GiB: 0.25), vm-b's an A100-40C
    (0.5), all hour; the GPU's third of a share is idle.
      framebuffer share (default): a 2.00 x 0.25 = 0.50, b 2.00 x 0.5 = 1.00, idle 0.50.
      vgpu.table {NVIDIA_A100-40C: 0.6}: b 2.00 x 0.6 = 1.20, a (not listed) 0.50, idle 0.30.
    GPU-w: a vGPU whose framebuffer share is unknown, one of 2 holders' shares: 1.00, idle
    1.00. Fleet 4.00."""
    for uuid in ("GPU-v", "GPU-w"):
        device(con, uuid, A100)
    alloc(con, "vm-a", "GPU-v", sharing="vgpu", replicas=2,
          resource="nvidia.com/NVIDIA_A100-20C")
    grant(con, "vm-a", "GPU-v", 0.25, None)
    alloc(con, "vm-b", "GPU-v", sharing="vgpu", replicas=2,
          resource="nvidia.com/NVIDIA_A100-40C")
    grant(con, "vm-b", "GPU-v", 0.5, None)
    alloc(con, "vm-c", "GPU-w", sharing="vgpu", replicas=2,
          resource="nvidia.com/NVIDIA_A100-10C")
    result = price(con, model(tmp_path, table))
    assert charges(con) == {
        ("science", "vm-a"): d("0.5"), ("science", "vm-b"): d(b_cost),
        ("idle", "GPU-v"): d(idle_v), ("science", "vm-c"): d("1"), ("idle", "GPU-w"): d("1")}
    assert result.fleet_cost == d("4")


def test_slice_length_follows_the_rows_and_the_memory_cap(con: Any) -> None:
    """The longest slice whose allocation rows fit the cap at PRICING_BYTES_PER_ROW, from the
    busiest cluster's rows per hour: 48 rows in 24 hours of cluster 'default' (2 per hour)
    and 24 in cluster 'b' (1 per hour)."""
    for h in range(24):
        for pod in ("p1", "p2"):
            alloc(con, pod, "GPU-a", hour=T0 + timedelta(hours=h))
        con.execute("INSERT INTO allocation_hours SELECT * REPLACE ('b' AS cluster, 'q' AS pod) "
                    "FROM allocation_hours WHERE pod = 'p1' AND hour = ?",
                    [T0 + timedelta(hours=h)])
    end = T0 + timedelta(hours=24)
    per_row = pricing.PRICING_BYTES_PER_ROW
    assert choose_slice(con, T0, end, 10**9) == pricing.SliceChoice(168, 2)  # a week fits
    assert choose_slice(con, T0, end, 2 * 72 * per_row).hours == 72
    assert choose_slice(con, T0, end, 2 * 71 * per_row).hours == 48
    assert choose_slice(con, T0, end, 2 * 13 * per_row).hours == 12
    assert choose_slice(con, T0, end, 0).hours == 1  # never less than an hour
    assert choose_slice(con, end, end + timedelta(hours=5), 0).rows_per_hour == 0


def test_pricing_says_the_slice_it_picked(con: Any, tmp_path: Path) -> None:
    device(con, "GPU-a")
    alloc(con, "p1", "GPU-a")
    log = io.StringIO()
    progress = Progress(0, stream=log, tty=False, stage="price", unit="slice")
    auto = price_period(con, load_cost_model(None), T0, T1, progress=progress)
    assert ("price: slices of 168 h (automatic: ~1 allocation rows per hour, ~168 per slice "
            f"within DuckDB's {memory_limit()} cap)") in log.getvalue()
    assert "price: slice 1/1" in log.getvalue()
    hourly = price_period(con, load_cost_model(None), T0, T1, slice_hours=1)
    assert (auto.fleet_cost, auto.rows) == (hourly.fleet_cost, hourly.rows)
