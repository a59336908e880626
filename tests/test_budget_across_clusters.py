"""A team's budget over several clusters (issue 27, item 2): each cluster's metering run pushes
its own share to a real Pushgateway, a real Prometheus scrapes it, and the Cost dashboard's
status column and the alerts say what the report's rule (BudgetLine.status) says of the
summed figures: a team that only the sum puts over, or heading over, is seen."""

from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
import yaml
from promtools import running_prometheus, running_pushgateway

from alerts.generate import ALERTS_FILE
from dashboards.generate import budget_status
from metering import publish
from metering.period import Month, Period
from metering.report.model import BudgetLine, BudgetStatus

D = Decimal
WARN_AT = D("0.9")
BUDGET = D(100)
# team -> cluster -> (spend, forecast): each share within the budget on its own (but ml's eu
# forecast, heading over alone)
SHARES = {
    "data": {"eu": (D(30), D(60)), "us": (D(20), D(50))},  # forecast 110 >= 90: heading over
    "web": {"eu": (D(60), D(70)), "us": (D(50), D(60))},  # spend 110 > 100: over
    "ops": {"eu": (D(10), D(30)), "us": (D(10), D(40))},  # forecast 70: within
    "ml": {"eu": (D(10), D(95)), "us": (D(1), D(2))},  # eu's own forecast heading over
}


def _fleet(team: str) -> BudgetLine:
    """The team's line over both clusters, by the report's rule."""
    parts = SHARES[team].values()
    return BudgetLine(team, BUDGET, WARN_AT, sum((s for s, _ in parts), D(0)),
                      sum((f for _, f in parts), D(0)))


def _query(prom: str, expr: str) -> list[dict[str, Any]]:
    url = f"{prom}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=10) as resp:
        body = json.load(resp)
    assert body["status"] == "success", body
    return list(body["data"]["result"])


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    work = tmp_path_factory.mktemp("budgets")
    now = time.time()
    today = datetime.fromtimestamp(now, UTC).replace(hour=0, minute=0, second=0,
                                                      microsecond=0)
    month = Month(today.year, today.month)
    with running_pushgateway(work) as gateway:
        for cluster in ("eu", "us"):
            lines = [BudgetLine(team, BUDGET, WARN_AT, *by[cluster])
                     for team, by in SHARES.items()]
            publish.push(gateway, publish.RunState(
                cluster, Period(today - timedelta(days=1), today), 24, now, month, "USD",
                lines))
        config = {"global": {"scrape_interval": "1s"}, "scrape_configs": [{
            "job_name": "pushgateway", "honor_labels": True,
            "static_configs": [{"targets": [gateway.removeprefix("http://")]}]}]}
        with running_prometheus(work / "data", yaml.safe_dump(config)) as prom:
            deadline = time.monotonic() + 60
            while len(_query(prom, publish.WARN_FROM)) < 2 * len(SHARES):
                assert time.monotonic() < deadline, "the pushed state was not scraped"
                time.sleep(0.3)
            yield prom


def test_pushed_warn_from_is_the_budget_times_warn_at(prometheus: str) -> None:
    got = {(r["metric"]["cluster"], r["metric"]["team"]): float(r["value"][1])
           for r in _query(prometheus, publish.WARN_FROM)}
    assert got == {(c, t): float(BUDGET * WARN_AT) for t in SHARES for c in ("eu", "us")}


def test_dashboard_status_is_the_reports_rule_over_the_clusters(prometheus: str) -> None:
    rows = _query(prometheus, budget_status('cluster=~".*"'))
    got = {r["metric"]["team"]: r["metric"]["status"] for r in rows}
    want = {team: publish.STATUS_LABEL[_fleet(team).status] for team in SHARES}
    assert got == want
    # each status the rule has, and a team (data) that no cluster's own status shows
    assert set(want.values()) == set(publish.STATUS_LABEL.values())
    assert _fleet("data").status is BudgetStatus.HEADING_OVER
    assert all(float(r["value"][1]) == 1.0 for r in rows) and len(rows) == len(SHARES)


def _alerting(prom: str, name: str) -> set[str]:
    rules = yaml.safe_load(ALERTS_FILE.read_text())  # the shipped rules
    (expr,) = [r["expr"] for g in rules["groups"] for r in g["rules"] if r.get("alert") == name]
    return {f'{r["metric"]["team"]}/{r["metric"].get("cluster", "*")}'
            for r in _query(prom, expr)}


def test_alerts_name_each_team_once(prometheus: str) -> None:
    assert _alerting(prometheus, "GpuLedgerBudgetHeadingOver") == {"ml/eu"}
    assert _alerting(prometheus, "GpuLedgerBudgetOverAcrossClusters") == {"web/*"}
    assert _alerting(prometheus, "GpuLedgerBudgetHeadingOverAcrossClusters") == {"data/*"}


def test_a_closed_months_line_has_no_forecast_and_so_never_heads_over() -> None:
    line = BudgetLine("t", BUDGET, WARN_AT, D(95), None)
    assert line.status is BudgetStatus.WITHIN and line.warn_from == D(90)
    assert BudgetLine("t", BUDGET, WARN_AT, D("100.000001"), None).status is BudgetStatus.OVER
    assert BudgetLine("t", BUDGET, WARN_AT, D(0), D(90)).status is BudgetStatus.HEADING_OVER
