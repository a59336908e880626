"""One bill whatever the scrape topology (issue 13): the same hour of holdings stored in a real
Prometheus as a clean single scrape, as two scrape jobs on one exporter, as an HA pair with a
replica label, and as an exporter restarting on a new instance mid-hour, bills the same to the
cent per team, hour and model.

History: GPUs up from 02:00Z to 06:00Z on 2026-10-05, all four hours metered (spacing is detected
from whole hours, so a restart hour alone would not tell it); the pods hold in hour 03:00Z.
  node-a (scraped every 15 s): GPU-a0, GPU-a1, GPU-a2 (H100)
  node-b (scraped every 60 s): GPU-b0, GPU-b1 (H100)
Pods, each holding one whole GPU exclusively from 03:00:30 for M minutes (samples at
03:00:30 + k x spacing, k = 1 .. M x 60 / spacing), team tM:
  t5 on GPU-a0, t20 on GPU-a1, t30 on GPU-a2, t40 on GPU-b0, t59 on GPU-b1.
Expected by hand: team tM holds M x 60 s (300, 1200, 1800, 2400, 3540), i.e. M/60 GPU-hours,
and pays M/60 x the H100 hourly rate; every GPU is observed 3600 s; idle is the rest:
5 GPU-hours - 154/60 GPU-hours = 2.4333 GPU-hours. Duplicates are scraped 7 s (60 s node) or
4 s (15 s node) after the original, as a second job or replica would be.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import duckdb
import pytest
from promtools import backfill, running_prometheus

from metering.cli_meter import main

H = int(datetime(2026, 10, 5, 3, tzinfo=UTC).timestamp())
H100 = "NVIDIA H100 80GB HBM3"
SPACING = {"node-a": 15, "node-b": 60}
OFFSET = {"node-a": 4, "node-b": 7}
GPUS = [("node-a", "GPU-a0", 5), ("node-a", "GPU-a1", 20), ("node-a", "GPU-a2", 30),
        ("node-b", "GPU-b0", 40), ("node-b", "GPU-b1", 59)]
Sample = tuple[str, dict[str, str], float, float]  # family, labels, value, time


def clean_samples() -> list[Sample]:
    out: list[Sample] = []
    for i, (node, uuid, minutes) in enumerate(GPUS):
        dt = SPACING[node]
        dev = {"node": node, "gpu": str(i), "uuid": uuid, "model": H100}
        for t in range(H - 3600 + dt, H + 3 * 3600 + 1, dt):
            out.append(("gpu_up", dev, 1.0, t))
            out.append(("gpu_info", {"node": node, "uuid": uuid, "mig_mode": "disabled"}, 1.0, t))
        pod = {"node": node, "namespace": f"ns{minutes}", "pod": f"p{minutes}",
               "container": "main", "uuid": uuid, "mig_uuid": "",
               "resource": "nvidia.com/gpu", "sharing": "exclusive", "replicas": "1",
               "label_team": f"t{minutes}"}
        start = H + 30
        for k in range(1, minutes * 60 // dt + 1):
            out.append(("gpu_container_allocation", pod, 1.0, start + k * dt))
    return out


def scraped(samples: list[Sample], **scrape: str) -> list[Sample]:
    return [(f, {**lab, **scrape}, v, t) for f, lab, v, t in samples]


def two_jobs(samples: list[Sample]) -> list[Sample]:
    """prometheus.yml with a ServiceMonitor job and an annotation job on one exporter."""
    inst = {"instance": "10.0.0.1:9400"}
    return (scraped(samples, job="gpu-ledger-exporter", **inst)
            + [(f, {**lab, "job": "kubernetes-pods", **inst}, v, t + OFFSET[lab["node"]])
               for f, lab, v, t in samples])


def ha_pair(samples: list[Sample]) -> list[Sample]:
    """Two Prometheus servers with external label prometheus_replica writing into one store."""
    base = scraped(samples, job="gpu-ledger-exporter", instance="10.0.0.1:9400")
    return (scraped(base, prometheus_replica="prom-0")
            + [(f, {**lab, "prometheus_replica": "prom-1"}, v, t + OFFSET[lab["node"]])
               for f, lab, v, t in base])


def restart(samples: list[Sample]) -> list[Sample]:
    """The exporter pod restarts at 03:30 and comes back on a new IP (instance label)."""
    return [(f, {**lab, "job": "gpu-ledger-exporter",
                 "instance": "10.0.0.1:9400" if t <= H + 1800 else "10.0.0.2:9400"}, v, t)
            for f, lab, v, t in samples]


def openmetrics(samples: list[Sample]) -> str:
    lines: list[str] = []
    for family in sorted({s[0] for s in samples}):
        lines.append(f"# TYPE {family} gauge")
        for f, lab, v, t in sorted((s for s in samples if s[0] == family),
                                   key=lambda s: (sorted(s[1].items()), s[3])):
            body = ",".join(f'{k}="{x}"' for k, x in lab.items())
            lines.append(f"{f}{{{body}}} {v} {t}")
    return "\n".join([*lines, "# EOF"]) + "\n"


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
    return bill(scraped(clean_samples(), job="gpu-ledger-exporter", instance="10.0.0.1:9400"),
                tmp_path_factory.mktemp("clean"))


def test_clean_bill_is_minutes_held(clean_bill: dict[tuple[str, str, str], float]) -> None:
    hour = "2026-10-05 03:00:00"
    rate = clean_bill[(hour, "t59", H100)] / (59 / 60)
    for _, _, m in GPUS:
        assert clean_bill[(hour, f"t{m}", H100)] == pytest.approx(rate * m / 60, abs=0.01)


@pytest.mark.parametrize("topology", [two_jobs, ha_pair, restart],
                         ids=["two-jobs", "ha-pair", "restart-new-instance"])
def test_topology_bills_like_clean(topology: Callable[[list[Sample]], list[Sample]],
                                   clean_bill: dict[tuple[str, str, str], float],
                                   tmp_path: Path) -> None:
    got = bill(topology(clean_samples()), tmp_path)
    assert {k: round(v, 2) for k, v in got.items()} == \
        {k: round(v, 2) for k, v in clean_bill.items()}


