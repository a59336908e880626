"""Hand-made metering databases for the report tests (helpers, plus checks of the helpers).

Rows go straight into the schema's tables, so each figure the tests expect can be worked out
by hand from the rows below. Hash and currency come from the packaged default cost model, so
reports name it as the model the charges were priced with.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from metering.costmodel import load_cost_model
from metering.db import connect
from metering.pricing import price_period
from tests.ledger_rows import ins

MONTH = "2026-10"
HASH = load_cost_model(None).hash

# Hours of 2026-10 with no coverage row: 03 04:00-07:00 (3 h) and 31 23:00 (1 h).
MISSING = [datetime(2026, 10, 3, h) for h in (4, 5, 6)] + [datetime(2026, 10, 31, 23)]


def charge(
    hour: str,
    team: str,
    namespace: str,
    pod: str,
    uuid: str,
    model: str,
    sharing: str,
    fraction: float,
    rate: float,
    alloc: float,
    used: float | None,
    cost: str,
    *,
    profile: str = "",
    idle_share: str = "0",
    cost_model_hash: str = HASH,
    mig_uuid: str = "",
) -> tuple[Any, ...]:
    idle = sharing == "idle"
    return (
        datetime.fromisoformat(hour),
        team,
        namespace,
        pod,
        "" if idle else "main",
        "node-1",
        uuid,
        mig_uuid,
        model,
        sharing,
        profile,
        "idle" if idle else "allocation",
        fraction,
        rate,
        alloc,
        used,
        Decimal(cost),
        Decimal(idle_share),
        cost_model_hash,
    )


def idle(
    hour: str, uuid: str, model: str, fraction: float, rate: float, cost: str
) -> tuple[Any, ...]:
    return charge(hour, "idle", "", "", uuid, model, "idle", fraction, rate, 0, 0, cost)


OCT1, OCT2, SEP15 = "2026-10-01 00:00", "2026-10-02 10:00", "2026-09-15 00:00"

# 2026-10: H100 at 4.00 and A100 at 2.00 per device-hour. Expected figures in test_report_model.
# charge(hour, team, namespace, pod, uuid, model, sharing, fraction, rate, alloc, used, cost)
OCTOBER = [
    charge(OCT1, "ml", "train", "trainer-0", "GPU-1", "H100", "exclusive", 1, 4, 1, 0.75, "4"),
    charge(OCT1, "ml", "train", "trainer-1", "GPU-2", "H100", "exclusive", 0.5, 4, 0.5, 0.25, "2"),
    idle(OCT1, "GPU-2", "H100", 0.5, 4, "2"),
    charge(OCT1, "web", "serve", "api-7", "GPU-3", "A100", "mig", 3 / 7, 2, 0.428571, 0.2,
           "0.857143", profile="3g.40gb"),
    idle(OCT1, "GPU-3", "A100", 4 / 7, 2, "1.142857"),
    charge(OCT1, "research", "lab", "nb-1", "GPU-4", "A100", "time-slicing", 0.25, 2, 0.25, 0.1,
           "0.5"),
    charge(OCT1, "research", "lab", "nb-2", "GPU-4", "A100", "time-slicing", 0.25, 2, 0.25, 0.05,
           "0.5"),
    idle(OCT1, "GPU-4", "A100", 0.5, 2, "1"),
    charge(OCT2, "ml", "train", "trainer-0", "GPU-1", "H100", "exclusive", 1, 4, 1, 0.9, "4"),
    charge(OCT2, "ml", "infer", "mps-a", "GPU-2", "H100", "mps", 0.5, 4, 0.5, 0.3, "2"),
    idle(OCT2, "GPU-2", "H100", 0.5, 4, "2"),
]  # fmt: skip

SEPTEMBER = [
    charge(SEP15, "ml", "train", "trainer-0", "GPU-1", "H100", "exclusive", 1, 4, 1, 0.5, "4"),
    charge(SEP15, "gone", "old", "legacy", "GPU-2", "H100", "exclusive", 0.75, 4, 0.75, 0.1, "3"),
    idle(SEP15, "GPU-2", "H100", 0.25, 4, "1"),
]  # fmt: skip


def insert_charges(con: Any, rows: list[tuple[Any, ...]]) -> None:
    con.executemany(
        ins("charges") + "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows
    )


def insert_coverage(con: Any, start: datetime, end: datetime, skip: list[datetime]) -> None:
    """A coverage row for every hour of [start, end) except `skip` (one statement: fast)."""
    con.execute(
        "INSERT INTO coverage (hour, source, devices, ingested_at) "
        "SELECT h, 'http://prometheus.test', 4, TIMESTAMP '2026-11-01' "
        "FROM generate_series(CAST(? AS TIMESTAMP), CAST(? AS TIMESTAMP) - INTERVAL 1 HOUR, "
        "INTERVAL 1 HOUR) AS t(h) WHERE NOT list_contains(CAST(? AS TIMESTAMP[]), h)",
        [start, end, skip],
    )


def make_db(
    path: Path,
    october: list[tuple[Any, ...]] | None = None,
    september: bool = True,
    missing: list[datetime] | None = None,
) -> Path:
    """The standard fixture: October priced with partial coverage, September for the change."""
    con = connect(path)
    try:
        insert_charges(con, OCTOBER if october is None else october)
        if september:
            insert_charges(con, SEPTEMBER)
            insert_coverage(con, datetime(2026, 9, 1), datetime(2026, 10, 1), [])
        insert_coverage(
            con,
            datetime(2026, 10, 1),
            datetime(2026, 11, 1),
            MISSING if missing is None else missing,
        )
    finally:
        con.close()
    return path


def test_fixture_charges_balance_per_device_hour(tmp_path: Path) -> None:
    # Each device-hour is fully charged (team rows + idle = rate), as pricing guarantees.
    con = connect(make_db(tmp_path / "m.duckdb"))
    try:
        rows = con.execute(
            "SELECT hour, uuid, sum(fraction), sum(cost), any_value(rate) FROM charges "
            "GROUP BY ALL ORDER BY ALL"
        ).fetchall()
    finally:
        con.close()
    assert len(rows) == 8
    for _, _, fraction, cost, rate in rows:
        assert abs(fraction - 1) < 1e-9
        assert cost == Decimal(str(rate)).quantize(Decimal("0.000001"))


MIG_COST_MODEL = """
currency: EUR
pricing:
  default: {hourly: 1.00}
  gpus:
    - {model: "NVIDIA H100 80GB HBM3", hourly: 4.00}
    - {pattern: "NVIDIA A100*", hourly: 2.00}
"""


def make_mig_db(path: Path, cost_model: Path) -> Path:
    """Facts for 2026-10-01 00:00-02:00, priced by the engine (not hand-made charges):
      vision: hopper, 3g.40gb of an H100 with GPM at 50% SM active (1800 s an hour), 2 h;
              trainer, a whole H100 at 25% SM (900 s an hour), 2 h
      search: ampere, 3g.40gb of an A100 (no GPM: SM activity unknown), 2 h
    """
    cost_model.write_text(MIG_COST_MODEL)
    con = connect(path)
    try:
        for h in (0, 1):
            hour = datetime(2026, 10, 1, h)
            for uuid, model, mig in (("GPU-h", "NVIDIA H100 80GB HBM3", True),
                                     ("GPU-a", "NVIDIA A100-SXM4-80GB", True),
                                     ("GPU-x", "NVIDIA H100 80GB HBM3", False)):
                con.execute(ins("device_hours") + "VALUES (?, 'node-1', '0', ?, ?, ?, 3600, "
                            "3600, NULL, NULL)", [hour, uuid, model, mig])
            con.execute(ins("mig_hours") + "VALUES (?, 'node-1', 'GPU-h', 'MIG-h', "
                        "'3g.40gb', 3, 7, NULL, 3600, 1800)", [hour])
            con.execute(ins("mig_hours") + "VALUES (?, 'node-1', 'GPU-a', 'MIG-a', "
                        "'3g.40gb', 3, 7, NULL, 3600, NULL)", [hour])
            for pod, team, uuid, mig_uuid, sharing, sm in (
                    ("hopper", "vision", "GPU-h", "MIG-h", "mig", None),
                    ("ampere", "search", "GPU-a", "MIG-a", "mig", None),
                    ("trainer", "vision", "GPU-x", "", "exclusive", 900.0)):
                con.execute(ins("allocation_hours") + "VALUES (?, 'node-1', 'ml', ?, 'main', "
                            "?, ?, 'nvidia.com/gpu', ?, 1, 1, 3600, 0, ?, MAP {'team': ?})",
                            [hour, pod, uuid, mig_uuid, sharing, sm, team])
        insert_coverage(con, datetime(2026, 10, 1), datetime(2026, 10, 1, 2), [])
        price_period(con, load_cost_model(cost_model), datetime(2026, 10, 1),
                     datetime(2026, 11, 1))
    finally:
        con.close()
    return path
