"""One bill whatever the scrape topology (issue 13): the same history (tests/topology_history.py)
backfilled into a real Prometheus as a clean single scrape, as two scrape jobs on one exporter,
as an HA pair with a replica label (`replica` or `prometheus_replica`), and as an exporter
restarting on a new instance mid-hour, bills the same to the cent per team, hour and model.
VictoriaMetrics and live scraping: tests/test_topologies_live.py.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import duckdb
import pytest
from promtools import backfill, running_prometheus
from topology_history import (
    GPUS,
    H100,
    H,
    Sample,
    clean_samples,
    copy_later,
    openmetrics,
    scraped,
)

from metering.cli_meter import main

EXPORTER = {"job": "gpu-ledger-exporter", "instance": "10.0.0.1:9400"}


def two_jobs(samples: list[Sample]) -> list[Sample]:
    """prometheus.yml with a ServiceMonitor job and an annotation job on one exporter."""
    return scraped(samples, **EXPORTER) + copy_later(samples, job="kubernetes-pods",
                                                     instance=EXPORTER["instance"])


def ha_pair(replica: str) -> Callable[[list[Sample]], list[Sample]]:
    """Two Prometheus servers with external label `replica` writing into one store."""
    def topology(samples: list[Sample]) -> list[Sample]:
        base = scraped(samples, **EXPORTER)
        return scraped(base, **{replica: "prom-0"}) + copy_later(base, **{replica: "prom-1"})
    return topology


def restart(samples: list[Sample]) -> list[Sample]:
    """The exporter pod restarts at 03:30 and comes back on a new IP (instance label)."""
    return [(f, {**lab, "job": "gpu-ledger-exporter",
                 "instance": "10.0.0.1:9400" if t <= H + 1800 else "10.0.0.2:9400"}, v, t)
            for f, lab, v, t in samples]


def bill(samples: list[Sample], tmp: Path) -> dict[tuple[str, str, str], float]:
    data = tmp / "prom"
    backfill(openmetrics(samples), data)
    db = tmp / "m.duckdb"
    with running_prometheus(data) as url:
        # Both jobs are the exporter's here: the selector admits them, so the annotation
        # job's copy reaches de-duplication (by default only gpu-ledger-exporter is metered).
        rc = main(["--prometheus", url, "--from", "2026-10-05T02:00", "--to",
                   "2026-10-05T06:00", "--db", str(db), "-q",
                   "--selector", 'job=~"gpu-ledger-exporter|kubernetes-pods"'])
    assert rc == 0
    con = duckdb.connect(str(db), read_only=True)
    try:
        held = dict(con.execute("SELECT pod, allocated_seconds FROM allocation_hours").fetchall())
        assert held == {f"p{m}": m * 60.0 for _, _, m in GPUS}
        obs = con.execute("SELECT DISTINCT observed_seconds FROM device_hours").fetchall()
        assert obs == [(3600.0,)]
        rows = con.execute("SELECT CAST(hour AS VARCHAR), team, model, sum(cost) FROM charges "
                           "GROUP BY ALL").fetchall()
    finally:
        con.close()
    return {(h, team, model): float(c) for h, team, model, c in rows}


@pytest.fixture(scope="module")
def clean_bill(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str, str], float]:
    return bill(scraped(clean_samples(), **EXPORTER), tmp_path_factory.mktemp("clean"))


def test_clean_bill_is_minutes_held(clean_bill: dict[tuple[str, str, str], float]) -> None:
    hour = "2026-10-05 03:00:00"
    rate = clean_bill[(hour, "t59", H100)] / (59 / 60)
    for _, _, m in GPUS:
        assert clean_bill[(hour, f"t{m}", H100)] == pytest.approx(rate * m / 60, abs=0.01)


@pytest.mark.parametrize("topology", [two_jobs, ha_pair("replica"),
                                      ha_pair("prometheus_replica"), restart],
                         ids=["two-jobs", "ha-pair-replica", "ha-pair-prometheus_replica",
                              "restart-new-instance"])
def test_topology_bills_like_clean(topology: Callable[[list[Sample]], list[Sample]],
                                   clean_bill: dict[tuple[str, str, str], float],
                                   tmp_path: Path) -> None:
    got = bill(topology(clean_samples()), tmp_path)
    assert {k: round(v, 2) for k, v in got.items()} == \
        {k: round(v, 2) for k, v in clean_bill.items()}
