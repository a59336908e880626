"""`gpu-ledger meter --pushgateway` (issue 27, item 2): a real Prometheus Pushgateway receives
the run's state, and what it holds equals the ledger's report figures; a gateway that is
away costs one warning line, never the metering run."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import conftest_prom
import pytest
from promtools import free_port, running_pushgateway

from metering import publish
from metering.period import Month
from metering.report.builder import make_report

fleet_om_file = conftest_prom.fleet_om_file  # session fixture
DAY = ["--from", "2026-10-05", "--to", "2026-10-06"]
PACKAGED = Path(__file__).parent.parent / "metering" / "data" / "cost-model.yaml"


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[str]:
    with running_pushgateway(tmp_path) as url:
        yield url


def _meter(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpu_ledger.cli", "meter", *args],
                          capture_output=True, text=True, env=env, timeout=300)


def _groups(url: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(url + "/api/v1/metrics", timeout=5) as resp:
        body = json.load(resp)
    assert body["status"] == "success"
    return list(body["data"])


def _values(group: dict[str, Any], name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """Values by their own labels (the grouping key's job, cluster and the instance="" the
    gateway adds are on every sample)."""
    return {tuple(sorted((k, v) for k, v in m["labels"].items()
                         if k not in ("job", "cluster", "instance"))): float(m["value"])
            for m in group[name]["metrics"]}


def _metered_teams(fleet_om_file: Path, db: Path) -> list[str]:
    """Meter the day into `db` as cluster eu-west (no cost model); the teams it charges."""
    first = _meter("--openmetrics", str(fleet_om_file), "--db", str(db), *DAY, "-q",
                   "--cluster", "eu-west")
    assert first.returncode == 0, first.stderr
    return [ln.team for ln in make_report(str(db), Month(2026, 10), None, 0).teams
            if not ln.overhead]


def test_push_publishes_the_reports_budget_figures(
        fleet_om_file: Path, tmp_path: Path, gateway: str) -> None:
    db = tmp_path / "l.duckdb"
    teams = _metered_teams(fleet_om_file, db)
    assert len(teams) >= 2
    # one team far over its budget, one far within, one with no spend at all
    budgets = {teams[0]: 0.01, teams[1]: 1_000_000, "idle-team": 5}
    model = tmp_path / "cm.yaml"
    model_warn_at = Decimal("0.8")
    text = PACKAGED.read_text().replace("  monthly: {}", "  monthly: " + json.dumps(budgets), 1)
    assert "  warn_at: 1.0\n" in text
    model.write_text(text.replace("  warn_at: 1.0\n", f"  warn_at: {model_warn_at}\n", 1))
    before = time.time()
    run = _meter("--openmetrics", str(fleet_om_file), "--db", str(db), *DAY,
                 "--cost-model", str(model), "--cluster", "eu-west", "--pushgateway", gateway)
    assert run.returncode == 0, run.stderr
    assert "pushed state to" in run.stderr and "Traceback" not in run.stderr

    report = make_report(str(db), Month(2026, 10), str(model), 0)
    assert report.budgets is not None and len(report.budgets) == 3
    (group,) = _groups(gateway)
    assert group["labels"] == {"job": publish.JOB, "cluster": "eu-west"}
    assert "push_time_seconds" in group  # added by the gateway itself
    spend = _values(group, publish.SPEND)
    budget = _values(group, publish.BUDGET)
    status = _values(group, publish.STATUS)
    warn_from = _values(group, publish.WARN_FROM)
    for b in report.budgets:
        key = (("currency", report.cost_model.currency), ("month", "2026-10"), ("team", b.team))
        assert Decimal(str(spend[key])) == b.spend.quantize(Decimal("0.000001"))
        assert budget[key] == float(b.budget)
        assert warn_from[key] == float(b.budget * model_warn_at)
        for state, label in publish.STATUS_LABEL.items():
            want = 1.0 if b.status is state else 0.0
            assert status[tuple(sorted((*key, ("status", label))))] == want
    by_team = {b.team: b.status.name for b in report.budgets}
    assert by_team == {teams[0]: "OVER", teams[1]: "WITHIN", "idle-team": "WITHIN"}
    last = _values(group, publish.LAST_SUCCESS)[()]
    assert before <= last <= time.time()
    assert _values(group, publish.HOURS)[()] == 24.0
    assert _values(group, publish.THROUGH)[()] == 1791244800.0  # 2026-10-06T00:00Z
    assert publish.CARBON_INTENSITY not in group  # the packaged model has no `carbon:`


def test_push_carries_the_clusters_carbon_intensity(
        fleet_om_file: Path, tmp_path: Path, gateway: str) -> None:
    """The live carbon rules multiply energy by the intensity the metering job pushes: the
    cluster's own (`clusters.<name>.carbon`), not the top-level one."""
    model = tmp_path / "cm.yaml"
    text = PACKAGED.read_text() + "\ncarbon:\n  grams_per_kwh: 250\n"
    text = text.replace("clusters: {}", "clusters:\n  eu-west:\n    carbon: {grams_per_kwh: 35}")
    model.write_text(text)
    for cluster, grams in (("eu-west", 35.0), ("us-east", 250.0)):
        run = _meter("--openmetrics", str(fleet_om_file), "--db", str(tmp_path / "l.duckdb"),
                     *DAY, "-q", "--cost-model", str(model), "--cluster", cluster,
                     "--pushgateway", gateway)
        assert run.returncode == 0, run.stderr
        group = next(g for g in _groups(gateway) if g["labels"]["cluster"] == cluster)
        assert _values(group, publish.CARBON_INTENSITY)[()] == grams


def test_push_from_the_environment_replaces_the_group(
        fleet_om_file: Path, tmp_path: Path, gateway: str) -> None:
    """$GPU_LEDGER_PUSHGATEWAY is the default; a PUT replaces the cluster's whole group, so a
    run without budgets leaves no stale team series behind."""
    db = tmp_path / "l.duckdb"
    env = {**__import__("os").environ, publish.ENV: gateway}
    run = _meter("--openmetrics", str(fleet_om_file), "--db", str(db), *DAY, "--no-price",
                 env=env)
    assert run.returncode == 0, run.stderr
    (group,) = _groups(gateway)
    assert group["labels"]["cluster"] == "default"
    assert publish.SPEND not in group and publish.LAST_SUCCESS in group


def test_unreachable_gateway_is_one_warning_and_the_run_succeeds(
        fleet_om_file: Path, tmp_path: Path) -> None:
    db = tmp_path / "l.duckdb"
    url = f"http://127.0.0.1:{free_port()}"
    run = _meter("--openmetrics", str(fleet_om_file), "--db", str(db), *DAY, "-q",
                 "--pushgateway", url)
    assert run.returncode == 0
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "warning: push to the Pushgateway failed" in lines[0], lines
    assert url in lines[0] and "Traceback" not in run.stderr
    bad = _meter("--openmetrics", str(fleet_om_file), "--db", str(db), *DAY, "-q",
                 "--pushgateway", "not-a-url")
    assert bad.returncode == 0 and "expected an http(s):// URL" in bad.stderr


def test_a_ledger_of_two_clusters_pushes_each_clusters_share(
        fleet_om_file: Path, tmp_path: Path, gateway: str) -> None:
    """One ledger metering two clusters in turn: each cluster's group holds that cluster's
    share of each team's bill, so the dashboard's sum over clusters is the fleet's bill (not
    the fleet's bill once per cluster)."""
    db = tmp_path / "l.duckdb"
    teams = _metered_teams(fleet_om_file, db)
    model = tmp_path / "cm.yaml"
    model.write_text(PACKAGED.read_text().replace(
        "  monthly: {}", "  monthly: " + json.dumps({t: 1_000_000 for t in teams}), 1))
    for cluster in ("eu-west", "us-east"):
        run = _meter("--openmetrics", str(fleet_om_file), "--db", str(db), *DAY, "-q",
                     "--cost-model", str(model), "--cluster", cluster, "--pushgateway", gateway)
        assert run.returncode == 0, run.stderr
    groups = {g["labels"]["cluster"]: g for g in _groups(gateway)}
    assert set(groups) == {"eu-west", "us-east"}
    fleet = make_report(str(db), Month(2026, 10), str(model), 0)
    assert fleet.budgets is not None
    q = Decimal("0.000001")
    for b in fleet.budgets:
        key = (("currency", fleet.cost_model.currency), ("month", "2026-10"), ("team", b.team))
        shares = {c: Decimal(str(_values(g, publish.SPEND)[key])) for c, g in groups.items()}
        for cluster, share in shares.items():
            own = make_report(str(db), Month(2026, 10), str(model), 0, cluster=cluster)
            assert own.budgets is not None
            assert share == next(x.spend for x in own.budgets if x.team == b.team).quantize(q)
        assert b.spend > 0 and all(s > 0 for s in shares.values())
        assert abs(sum(shares.values()) - b.spend) <= 2 * q  # each share rounded to 1e-6


def test_a_cluster_label_run_pushes_each_cluster_it_metered(
        fleet_om_file: Path, tmp_path: Path, gateway: str) -> None:
    """One run over a store of several clusters (`--cluster-label`; here each node's `node`
    label stands for its cluster): one group per cluster, each with that cluster's share, and
    the shares add up to the fleet's bill."""
    db = tmp_path / "l.duckdb"
    model = tmp_path / "cm.yaml"
    model.write_text(PACKAGED.read_text().replace(
        "  monthly: {}", "  monthly: " + json.dumps({"ml": 1, "research": 1}), 1))
    run = _meter("--openmetrics", str(fleet_om_file), "--db", str(db), *DAY, "-q",
                 "--cost-model", str(model), "--cluster-label", "node",
                 "--pushgateway", gateway)
    assert run.returncode == 0, run.stderr
    fleet = make_report(str(db), Month(2026, 10), str(model), 0)
    clusters = sorted(ln.cluster for ln in fleet.clusters)
    assert len(clusters) >= 2
    groups = {g["labels"]["cluster"]: g for g in _groups(gateway)}
    assert sorted(groups) == clusters
    assert fleet.budgets is not None
    q = Decimal("0.000001")
    for b in fleet.budgets:
        key = (("currency", fleet.cost_model.currency), ("month", "2026-10"), ("team", b.team))
        shares = [Decimal(str(_values(g, publish.SPEND)[key])) for g in groups.values()]
        assert abs(sum(shares) - b.spend) <= len(shares) * q
    assert all(b.spend > 0 for b in fleet.budgets) and len(fleet.budgets) == 2
