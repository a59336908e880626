"""Pricing stores the waste device-hours from its own work tables (pricing.sql `waste_rows`),
not with waste.sql `device_hours`: the rows must be the query's, row for row, on a ledger with
MIG, time-slicing, MPS, fractional grants, idle holders, measured energy, two clusters,
holders without workload facts and devices with several holders; where a holder's key is seen
twice the query itself computes the slice."""

from __future__ import annotations

import shutil
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from gpu_ledger.demo import SCENARIO_DIR, Say, simulate_history
from metering import wastehours
from metering.costmodel import CostModel, load_cost_model
from metering.db import connect
from metering.ingest import ingest
from metering.openmetrics_source import OpenMetricsSource
from metering.period import resolve
from metering.pricing import price_period

START, END = datetime(2026, 10, 1), datetime(2026, 10, 2)
FACTS = ("device_hours", "mig_hours", "allocation_hours", "workload_hours", "grant_hours",
         "coverage")
ENERGY = """
energy: {price_per_kwh: 0.30, pue: 1.2, tariff: [{hours: "22-06", price_per_kwh: 0.10}]}
carbon: {grams_per_kwh: 400}
"""
# the packaged default plus energy; one with usage basis, tiers, a discount, idle shared out
MODELS = {
    "default": None,
    "usage": """
currency: EUR
pricing:
  default: {hourly: 2.00, memory_gb: 80}
basis: {mode: usage}
utilization_tiers: [{up_to: 0.2, multiplier: 1.2}, {up_to: 1.0, multiplier: 1.0}]
idle: {policy: proportional}
teams: {default: unallocated}
discounts: {teams: {unallocated: 0.1}, models: {}}
""",
}


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A day of the sharing, MIG and rightsizing scenarios, metered (not priced), in cluster
    default and again in cluster east with some workload and energy facts missing."""
    tmp = tmp_path_factory.mktemp("waste-from-pricing")
    history = tmp / "history.om"
    scenarios = [SCENARIO_DIR / f"{n}.yaml" for n in ("sharing", "h100-mig", "rightsizing")]
    simulate_history(scenarios, START.astimezone(), END.astimezone(), 1800.0, history,
                     tmp / "sim", Say(1))
    period = resolve(None, "2026-10-01", "2026-10-02")
    src = OpenMetricsSource(str(history), period)
    db = tmp / "facts.duckdb"
    con = connect(db)
    try:
        ingest(con, src, period)
        for table in FACTS:
            con.execute(f"INSERT INTO {table} SELECT * REPLACE ('east' AS cluster) FROM {table} "
                        "WHERE cluster = 'default'")
        # east: the pods sharing a device in an hour are one workload's replicas (one row
        # per hour); a third of the other holders have no workload facts (owner: the pod);
        # some devices no measured energy
        shared = con.execute("SELECT uuid FROM allocation_hours WHERE cluster = 'east' GROUP BY "
                             "hour, uuid, mig_uuid ORDER BY count(*) DESC, uuid LIMIT 1"
                             ).fetchone()
        assert shared is not None
        for table in ("allocation_hours", "workload_hours", "grant_hours"):
            con.execute(f"UPDATE {table} SET namespace = 'apps' WHERE cluster = 'east' AND "
                        "uuid = ?", [shared[0]])
        con.execute("UPDATE workload_hours SET owner_kind = 'Deployment', owner_name = 'app' "
                    "WHERE cluster = 'east' AND uuid = ?", [shared[0]])
        con.execute("DELETE FROM workload_hours WHERE cluster = 'east' AND hash(pod) % 3 = 0 "
                    "AND owner_name <> 'app'")
        con.execute("UPDATE device_hours SET energy_joules = NULL WHERE cluster = 'east' AND "
                    "hash(uuid) % 2 = 0")
    finally:
        src.close()
        con.close()
    return db


def _model(tmp: Path, text: str | None) -> CostModel:
    """`text`, else the packaged default; with energy and carbon."""
    path = tmp / "cm.yaml"
    default = (Path(__file__).parents[1] / "metering" / "data" / "cost-model.yaml").read_text()
    path.write_text((default if text is None else text) + ENERGY)
    return load_cost_model(path)


def _priced(ledger: Path, tmp: Path, model: CostModel,
            monkeypatch: pytest.MonkeyPatch) -> tuple[Any, list[tuple[str, datetime]]]:
    """Price a copy of the ledger in 6-hour slices; the slices the query computed."""
    db = tmp / "m.duckdb"
    shutil.copy(ledger, db)
    by_query: list[tuple[str, datetime]] = []
    compute = wastehours.compute

    def spy(con: Any, start: datetime, end: datetime, cluster: str) -> int:
        by_query.append((cluster, start))
        return compute(con, start, end, cluster)

    monkeypatch.setattr(wastehours, "compute", spy)
    con = connect(db)
    price_period(con, model, START, END, slice_hours=6)
    return con, by_query


def _rows(con: Any, sql: str, params: Any) -> Counter[tuple[Any, ...]]:
    return Counter(con.execute(sql, params).fetchall())


@pytest.mark.parametrize("name", sorted(MODELS))
def test_stored_rows_are_the_querys(ledger: Path, tmp_path: Path, name: str,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    con, by_query = _priced(ledger, tmp_path, _model(tmp_path, MODELS[name]), monkeypatch)
    try:
        assert by_query == []  # every slice from the work tables
        stored = _rows(con, f"SELECT * FROM {wastehours.ROWS}", [])
        computed = _rows(con, wastehours.query(), {"start": START, "end": END})
        assert stored == computed
        # what the ledger exercises
        assert {r[0] for r in stored} == {"default", "east"}
        assert {r[5] for r in stored} >= {"exclusive", "mig", "time-slicing", "mps"}
        assert any(r[6] != "" for r in stored)  # MIG profiles
        assert any(r[13] for r in stored) and any(not r[13] for r in stored)  # idle, busy
        assert any(r[14] > 0 and r[15] is not None for r in stored)  # energy and CO2e
        assert any(r[0] == "east" and r[2] == "Pod" for r in stored)  # no workload facts
        several = con.execute("SELECT count(*) FROM (SELECT hour, cluster, uuid FROM "
                              "allocation_hours GROUP BY ALL HAVING count(*) > 1)").fetchone()
        assert several is not None and several[0] > 0  # devices with several holders
        # ... of one workload: rows of the query's that sum several containers
        held = con.execute("SELECT count(*) FROM allocation_hours a JOIN device_hours d USING "
                           "(hour, cluster, uuid) WHERE a.allocated_seconds > 0").fetchone()
        assert held is not None and held[0] > sum(stored.values())
        assert con.execute(f"SELECT count(*) FROM {wastehours.STORED}").fetchone() == (48,)
    finally:
        con.close()


def test_a_holder_seen_twice_is_computed_by_the_query(ledger: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Facts that break the allocation key (one holder twice in an hour): the work tables'
    rows would differ from the query's, so that slice is computed by the query."""
    db = tmp_path / "dup.duckdb"
    shutil.copy(ledger, db)
    with connect(db) as con:
        hour = con.execute("SELECT min(hour) + INTERVAL 7 HOUR FROM allocation_hours"
                           ).fetchone()[0]
        con.execute("INSERT INTO allocation_hours SELECT * FROM allocation_hours WHERE "
                    "cluster = 'east' AND hour = ? LIMIT 1", [hour])
    con, by_query = _priced(db, tmp_path, _model(tmp_path, MODELS["default"]), monkeypatch)
    try:
        assert by_query == [("east", datetime(2026, 10, 1, 6))]
        assert (_rows(con, f"SELECT * FROM {wastehours.ROWS}", [])
                == _rows(con, wastehours.query(), {"start": START, "end": END}))
    finally:
        con.close()
