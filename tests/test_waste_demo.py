"""The demo's rightsizing node through the whole path: simulated exporter (owner references
from the fake API server's pod watch) -> OpenMetrics history -> ingest -> pricing ->
recommendations. Four simulated days (over the 72 h minimum) give every kind."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from gpu_ledger.demo import SCENARIO_DIR, Say, simulate_history
from metering.costmodel import load_cost_model
from metering.db import connect
from metering.ingest import ingest
from metering.openmetrics_source import OpenMetricsSource
from metering.period import resolve
from metering.pricing import price_period
from metering.report.waste import Kind, mig_fraction, recommend


def test_rightsizing_scenario_triggers_every_kind(tmp_path: Path) -> None:
    start, end = datetime(2026, 10, 1), datetime(2026, 10, 5)
    history = tmp_path / "history.om"
    simulate_history([SCENARIO_DIR / "rightsizing.yaml"], start.astimezone(),
                     end.astimezone(), 1800.0, history, tmp_path / "sim", Say(1))
    period = resolve(None, "2026-10-01", "2026-10-05")
    src = OpenMetricsSource(str(history), period)
    con = connect(tmp_path / "m.duckdb")
    try:
        ingest(con, src, period)
        cm = load_cost_model(None)
        price_period(con, cm, start, end)
        owners = con.execute("SELECT DISTINCT pod, owner_kind, owner_name FROM workload_hours "
                             "ORDER BY pod").fetchall()
        recs = recommend(con, start, end, mig_fraction(cm))
    finally:
        src.close()
        con.close()
    assert ("chat-infer-0", "Deployment", "chat-infer") in owners
    assert ("embed-c-0", "StatefulSet", "embed-c") in owners
    assert ("dev-box", "", "") in owners
    got = {(r.owner_name, r.kind, r.proposed) for r in recs}
    assert ("chat-infer", Kind.TO_MIG, "MIG 1g.10gb") in got
    assert ("embed-c", Kind.MIG_DOWN, "MIG 2g.20gb") in got
    assert ("tokenizer", Kind.MIG_UP, "MIG 1g.20gb") in got
    assert any(o == "nb-carol" and k is Kind.TO_SHARE for o, k, _ in got)
    assert any(o == "dev-box" and k is Kind.IDLE for o, k, _ in got)
    # A GPU that never ran a process is released, not rightsized.
    assert [k for o, k, _ in got if o == "dev-box"] == [Kind.IDLE]
