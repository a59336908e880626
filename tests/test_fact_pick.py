"""Where no fact key has two series (the usual store), facts.sql names each fact row by its one
series (`pick_single`) instead of grouping every key's series and joining the winner back
(`pick_grouped`, with de-duplication's spans). Both must write the same facts, bit for bit:
here each history is metered both ways and every fact table compared row for row.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import conftest_prom
import pyarrow as pa
import pytest

from metering import facts
from metering.period import Period, resolve
from tests.omledger import ingested
from tests.test_vendor_month import openmetrics as vendor_month

fleet_om_file = conftest_prom.fleet_om_file  # session fixture

TABLES = {"device_hours": "*", "mig_hours": "*", "allocation_hours": "*",
          "workload_hours": "*", "grant_hours": "*",
          "coverage": "* EXCLUDE (ingested_at)"}


def _rows(con: Any) -> dict[str, list[tuple[Any, ...]]]:
    return {t: con.execute(f"SELECT {cols} FROM {t} ORDER BY ALL").fetchall()
            for t, cols in TABLES.items()}


def _metered(om: Path, period: Period, db: Path, monkeypatch: pytest.MonkeyPatch,
             grouped: bool) -> tuple[dict[str, list[tuple[Any, ...]]], list[bool]]:
    """The history's facts, and what each node group's key check said; `grouped` has
    every group take pick_grouped (and the spans) as if some key had two series."""
    seen: list[bool] = []
    check = facts._shares_keys

    def shares(table: pa.Table) -> bool:
        seen.append(check(table))
        return grouped or seen[-1]

    with monkeypatch.context() as m:
        m.setattr(facts, "_shares_keys", shares)
        con = ingested(om, period, db)
    try:
        return _rows(con), seen
    finally:
        con.close()


@pytest.mark.parametrize("history", ["fleet", "vendors"])
def test_single_series_pick_writes_what_grouping_writes(
        history: str, fleet_om_file: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    if history == "fleet":  # NVIDIA: MIG, time-slicing, energy counters and power
        om, period = fleet_om_file, resolve(None, "2026-10-05", "2026-10-06")
    else:  # AMD partitions and VFs, Intel VFs and mdevs, memory-fraction grants
        om, period = tmp_path / "vendors.om", resolve(None, "2026-10-01", "2026-10-06")
        om.write_text(vendor_month())
    single, checks = _metered(om, period, tmp_path / "single.duckdb", monkeypatch, False)
    grouped, _ = _metered(om, period, tmp_path / "grouped.duckdb", monkeypatch, True)
    assert checks and not any(checks)  # no key had two series: pick_single was taken
    for table in ("device_hours", "allocation_hours", "workload_hours"):
        assert single[table], table  # the comparison covers rows, not empty tables
    assert single["mig_hours" if history == "fleet" else "grant_hours"]
    for table in TABLES:
        assert single[table] == grouped[table], table
