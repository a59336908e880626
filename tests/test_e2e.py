"""The whole pipeline at a small size, with real parts: the fixture node simulated through the
exporter's code path (6 h of history every 60 s), backfilled into a real Prometheus that also
scrapes the node's live exporter, metered into DuckDB, priced, reported; the report's figures
are checked against the allocation computed by hand. The same history is then metered from
VictoriaMetrics, a Prometheus-compatible store that scales out, and must give the same facts.

Hand computation (cost model: H100 4.00/h, A100 2.00/h, MIG by slices/7, replicas split 1/4):
  vision : trainer, whole H100, 6 h = 24.00; mig-a 3g.40gb, 3/7 x 6 h x 4 = 10.285714
  search : mig-b 2g.20gb, 2/7 x 2 h x 4 = 2.285714; shared-0/1, 2 x 1/4 x 6 h x 2 = 6.00
  batch-jobs (namespace rule): shared-2, 1/4 x 6 h x 2 = 3.00
  idle   : MIG GPU 24 - 12.571429 = 11.428571; time-sliced GPU 12 - 9 = 3.00
  fleet  : 3 GPUs x 6 h = 24 + 24 + 12 = 60.00
Used GPU-hours (SM activity in device-equivalents; the H100 has GPM, so its MIG instances
report gpu_sm_active_ratio = the sum of their processes' sm_util, capped at 1):
  vision : trainer 0.8 x 6 h = 4.8; mig-a 0.5 x 3/7 x 6 h = 1.285714      -> 6.085714
  search : mig-b 0.5 x 2/7 x 2 h = 0.285714; shared-0/1 2 x 0.2 x 6 h = 2.4 -> 2.685714
  batch-jobs: shared-2 0.2 x 6 h = 1.2
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb
import pytest

from gpu_ledger import promserver
from gpu_ledger.demo import Say, live_exporters, simulate_history
from gpu_ledger.procutil import stop
from metering.cli_meter import main as meter_main
from metering.report.cli import main as report_main

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "e2e"
NODE = FIXTURES / "node.yaml"
COST_MODEL = FIXTURES / "cost-model.yaml"
LIVE_SECONDS = float(os.environ.get("E2E_LIVE_SECONDS", "60"))
EXPECTED_COST = {"vision": 34.285714, "search": 8.285714, "batch-jobs": 3.0}
EXPECTED_GPU_HOURS = {"vision": 6 + 18 / 7, "search": 4 / 7 + 3.0, "batch-jobs": 1.5}
EXPECTED_USED = {"vision": 4.8 + 0.5 * 3 / 7 * 6, "search": 0.5 * 2 / 7 * 2 + 2.4,
                 "batch-jobs": 1.2}
EXPECTED_IDLE = 14.428571
EXPECTED_FLEET = 60.0


@pytest.fixture(scope="module")
def period() -> tuple[datetime, datetime]:
    # Two days back: old enough for promtool backfill, and whole hours.
    start = (datetime.now(UTC) - timedelta(days=2)).replace(minute=0, second=0, microsecond=0)
    return start, start + timedelta(hours=6)


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory,
            period: tuple[datetime, datetime]) -> Path:
    work = tmp_path_factory.mktemp("e2e-history")
    out = work / "history.om"
    simulate_history([NODE], period[0], period[1], 60.0, out, work / "sim", Say(0))
    return out


def _query(url: str, expr: str) -> list[dict[str, object]]:
    with urllib.request.urlopen(f"{url}/api/v1/query?query={urllib.parse.quote(expr)}",
                                timeout=10) as resp:
        body = json.load(resp)
    assert body["status"] == "success", body
    result: list[dict[str, object]] = body["data"]["result"]
    return result


def _meter(url: str, period: tuple[datetime, datetime], db: Path) -> None:
    rc = meter_main(["--prometheus", url, "--from", period[0].isoformat(),
                     "--to", period[1].isoformat(), "--db", str(db),
                     "--cost-model", str(COST_MODEL), "-q"])
    assert rc == 0


def _rows(db: Path, sql: str) -> list[tuple[object, ...]]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def test_pipeline_against_real_prometheus(history: Path, period: tuple[datetime, datetime],
                                          tmp_path: Path) -> None:
    data = tmp_path / "prom-data"
    promserver.backfill(history, data)
    db = tmp_path / "ledger.duckdb"
    with live_exporters([NODE], period[0].timestamp(), tmp_path / "live", 1.0) as targets, \
            promserver.running_prometheus(data, promserver.scrape_config(targets, "1s")) as url:
        began = time.monotonic()
        # Live: Prometheus scrapes the running exporter; its series join the backfilled ones.
        while time.monotonic() - began < LIVE_SECONDS:
            time.sleep(2)
        live = _query(url, 'count_over_time(gpu_up{node="e2e-node"}[1m])')
        assert len(live) == 3 and all(float(r["value"][1]) >= 10 for r in live)  # type: ignore[index]
        allocs = _query(url, 'gpu_container_allocation{node="e2e-node"}')
        assert {r["metric"]["pod"] for r in allocs} == {  # type: ignore[index]
            "trainer", "mig-a", "shared-0", "shared-1", "shared-2"}  # mig-b ended long ago
        assert _query(url, 'up{job="gpu-ledger-exporter"} == 1')
        _meter(url, period, db)

    # The facts: 6 covered hours, the 20-minute-style boundary pod billed exactly 2 h.
    assert _rows(db, "SELECT count(*) FROM coverage WHERE devices > 0") == [(6,)]
    migb = _rows(db, "SELECT sum(allocated_seconds) FROM allocation_hours WHERE pod = 'mig-b'")
    assert migb == [(7200.0,)]

    out = tmp_path / "report"
    month = period[0].strftime("%Y-%m")
    assert report_main(["--month", month, "--db", str(db), "--out", str(out),
                        "--cost-model", str(COST_MODEL)]) == 0
    with (out / f"chargeback-{month}.csv").open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    teams = {r["team"]: r for r in rows if r["section"] == "team"}
    for team, cost in EXPECTED_COST.items():
        assert float(teams[team]["cost"]) == pytest.approx(cost, abs=0.001), team
        assert float(teams[team]["allocated_gpu_hours"]) == pytest.approx(
            EXPECTED_GPU_HOURS[team], abs=1e-5), team
        assert float(teams[team]["used_gpu_hours"]) == pytest.approx(
            EXPECTED_USED[team], abs=1e-5), team
        assert float(teams[team]["sm_unknown_gpu_hours"]) == 0, team
    idle = sum(float(r["cost"]) for r in rows if r["section"] == "team"
               and r["team"] not in EXPECTED_COST)
    assert idle == pytest.approx(EXPECTED_IDLE, abs=0.001)
    fleet = next(r for r in rows if r["section"] == "fleet")
    # Exact: team charges + idle = fleet cost to the cent.
    assert float(fleet["cost"]) == pytest.approx(EXPECTED_FLEET, abs=0.000001)
    assert int(fleet["hours_with_data"]) == 6
    assert (out / f"chargeback-{month}.html").stat().st_size > 10_000


@pytest.fixture
def victoria_metrics(tmp_path: Path) -> Iterator[str]:
    binary = shutil.which("victoria-metrics")
    assert binary, "victoria-metrics is not installed: apt-get install -y victoria-metrics"
    port = promserver.free_port()
    log = (tmp_path / "vm.log").open("wb")
    proc = subprocess.Popen([binary, f"-storageDataPath={tmp_path / 'vm-data'}",
                             f"-httpListenAddr=127.0.0.1:{port}", "-retentionPeriod=100y",
                             "-search.disableCache"], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2):
                    break
            except OSError:
                assert proc.poll() is None, (tmp_path / "vm.log").read_text()
                assert time.monotonic() < deadline, "victoria-metrics did not start"
                time.sleep(0.1)
        yield url
    finally:
        stop(proc)
        log.close()


def _import_into_vm(url: str, history: Path) -> None:
    """VictoriaMetrics imports the Prometheus text format with millisecond timestamps."""
    lines = []
    for line in history.read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, ts = line.rpartition(" ")
        lines.append(f"{head} {round(float(ts) * 1000)}")
    req = urllib.request.Request(f"{url}/api/v1/import/prometheus",
                                 data="\n".join(lines).encode() + b"\n", method="POST")
    with urllib.request.urlopen(req, timeout=60) as resp:
        assert resp.status in (200, 204)
    with urllib.request.urlopen(f"{url}/internal/force_flush", timeout=30):
        pass


def test_metering_against_victoria_metrics_matches_prometheus(
        history: Path, period: tuple[datetime, datetime], tmp_path: Path,
        victoria_metrics: str) -> None:
    _import_into_vm(victoria_metrics, history)
    vm_db, prom_db = tmp_path / "vm.duckdb", tmp_path / "prom.duckdb"
    _meter(victoria_metrics, period, vm_db)
    data = tmp_path / "prom-data"
    promserver.backfill(history, data)
    with promserver.running_prometheus(data) as url:
        _meter(url, period, prom_db)
    facts = ("SELECT hour, namespace, pod, container, uuid, mig_uuid, sharing, replicas, "
             "allocated_seconds FROM allocation_hours ORDER BY ALL")
    assert _rows(vm_db, facts) == _rows(prom_db, facts)
    assert len(_rows(vm_db, facts)) == 6 * 5 + 2  # five pods all 6 h, mig-b 2 h
    totals = "SELECT team, sum(cost) FROM charges GROUP BY team ORDER BY team"
    assert _rows(vm_db, totals) == _rows(prom_db, totals)
