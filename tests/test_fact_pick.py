"""Where no fact key has two series (the usual store), facts.sql names each fact row by its one
series (`pick_single`) instead of grouping every key's series and joining the winner back
(`pick_grouped`, with de-duplication's spans), and takes each other signal's row as its key's
aggregate (`agg_single`) instead of grouping (`agg_grouped`). Both must write the same facts,
bit for bit: here each history is metered both ways and every fact table compared row for row.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import conftest_prom
import duckdb
import pyarrow as pa
import pytest

from metering import facts
from metering.period import Period, resolve
from metering.selector import DEFAULT_SELECTOR, Selector
from metering.sqlfile import SqlFile
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
             grouped: bool | None, selector: Selector = DEFAULT_SELECTOR
             ) -> tuple[dict[str, list[tuple[Any, ...]]], list[bool]]:
    """The history's facts, and what each signal's key check said; `grouped` True has every
    node group take pick_grouped (and the spans) and agg_grouped as if some key had two
    series, False has them all take the single forms whatever the check says."""
    seen: list[bool] = []
    check = facts._shares_keys

    def shares(table: pa.Table) -> bool:
        seen.append(check(table))
        return seen[-1] if grouped is None else grouped

    with monkeypatch.context() as m:
        m.setattr(facts, "_shares_keys", shares)
        con = ingested(om, period, db, selector)
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
    single, checks = _metered(om, period, tmp_path / "single.duckdb", monkeypatch, None)
    grouped, _ = _metered(om, period, tmp_path / "grouped.duckdb", monkeypatch, True)
    assert checks and not any(checks)  # no key had two series: pick_single was taken
    for table in ("device_hours", "allocation_hours", "workload_hours"):
        assert single[table], table  # the comparison covers rows, not empty tables
    assert single["mig_hours" if history == "fleet" else "grant_hours"]
    for table in TABLES:
        assert single[table] == grouped[table], table


T0 = int(datetime(2026, 10, 5, tzinfo=UTC).timestamp())


def test_a_key_with_two_series_in_one_signal_groups_the_aggregates(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """gpu_up has one series; gpu_utilization_ratio two for the same GPU, one after the other
    (a relabel on that family alone, mid-hour). The rows are picked without grouping, the other
    signals' aggregates are grouped: the same facts as grouping everything, and the hour's SM
    seconds those of both series. agg_single here would join both utilisation rows to the
    device row and write the GPU's hour twice."""
    dev = 'node="n1",gpu="0",uuid="GPU-1",model="L4",job="gpu"'
    lines = [f"gpu_up{{{dev}}} 1 {T0 + t}" for t in range(30, 3601, 30)]
    lines += [f'gpu_utilization_ratio{{{dev},shard="a"}} 0.25 {T0 + t}'
              for t in range(30, 1801, 30)]
    lines += [f'gpu_utilization_ratio{{{dev},shard="b"}} 0.75 {T0 + t}'
              for t in range(1830, 3601, 30)]
    om = tmp_path / "relabel.om"
    om.write_text("\n".join(lines) + "\n# EOF\n")
    period = resolve(None, "2026-10-05T00:00", "2026-10-05T01:00")
    selector = Selector.parse('job="gpu"')
    ran: list[str] = []
    query = SqlFile.query

    def spy(self: SqlFile, name: str) -> str:
        ran.append(name)
        return query(self, name)

    with monkeypatch.context() as m:
        m.setattr(SqlFile, "query", spy)
        natural, checks = _metered(om, period, tmp_path / "n.duckdb", monkeypatch, None,
                                   selector)
    assert checks.count(True) == 1  # the utilisation signal alone
    assert "pick_single" in ran and "agg_grouped" in ran
    assert "pick_grouped" not in ran and "agg_single" not in ran
    grouped, _ = _metered(om, period, tmp_path / "g.duckdb", monkeypatch, True, selector)
    assert natural == grouped
    con = duckdb.connect(str(tmp_path / "n.duckdb"), read_only=True)
    try:
        assert con.execute("SELECT observed_seconds, sm_active_seconds FROM device_hours"
                           ).fetchall() == [(3600.0, 0.25 * 1800 + 0.75 * 1800)]
    finally:
        con.close()
    wrong, _ = _metered(om, period, tmp_path / "w.duckdb", monkeypatch, False, selector)
    assert len(wrong["device_hours"]) == 2  # what the check prevents
