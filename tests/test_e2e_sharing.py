"""Every sharing mode, end to end with real parts: gpusim/scenarios/sharing.yaml (every
allocation on one node) and vgpu-host.yaml (a KubeVirt vGPU host) simulated through the
exporter's code path (real PodResources gRPC server serving device IDs by index, mdev UUIDs and
DRA dynamic_resources; the exporter's API client watching pods with HAMi and gpushare
annotations and the DRA driver's ResourceSlices, and reading the shared claim's ResourceClaim,
on an API-speaking server), 6 h every 60 s, backfilled into a real Prometheus, metered over
PromQL into DuckDB, priced, reported.

Hand computation (H100 = 4.00 per device-hour, 6 h = 24.00 per GPU; fractional: memory):
  alpha : whole (GPU 0, device plugin ID "0")                 24.00
          mig (GPU 1, 3g.40gb, ID "1:0"): 3/7 x 4.00 = 1.714285 per hour (rounded down)
                                                     x 6 h =  10.28571
  beta  : ts-a, ts-b (GPU 2, time-slicing 1 of 4): 2 x 1/4 x 24 = 12.00
          mps-a (GPU 3, MPS 1 of 2):                 1/2 x 24   = 12.00
  gamma : dra-one (GPU 4, a DRA claim of its own: exclusive)      24.00
          dra-s1, dra-s2 (GPU 5, one claim, 2 holders, MPS as the claim's GpuConfig says):
                                                     2 x 1/2 x 24 = 24.00
  delta : hami-a (GPU 6, 20 of 80 GiB = 0.25; cores 0.6 unused by the memory basis)  6.00
          hami-b (GPU 6, 40 of 80 GiB = 0.5)                                         12.00
          share-a (GPU 7, gpushare 60 of 80 GiB = 0.75)                              18.00
  idle  : GPU 1 24 - 10.28571 = 13.71429; GPU 2 12; GPU 3 12; GPU 6 6; GPU 7 6 = 49.71429
  fleet : 8 GPUs x 24 = 192.00 = 34.28571 + 24 + 48 + 36 + 49.71429
vGPU host (2 A100s at the default 1.00 per device-hour, 6 h = 6.00 per GPU; vGPU priced by
framebuffer share): vm-train A100-20C 20/80 x 6 = 1.50 (ml-research), vm-notebook 1.50 (data),
vm-infer A100-40C 40/80 x 6 = 3.00 (product); idle 3.00 + 3.00 = 6.00; fleet 12.00.
By sharing mode: exclusive 48, mig 10.28571, time-slicing 12 (beta), mps 36 (12 beta's
device plugin share, 24 gamma's DRA shares: priced alike), fractional 36, vgpu 6.
"""

from __future__ import annotations

import csv
from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb
import pytest

from gpu_ledger import promserver
from gpu_ledger.demo import Say, simulate_history
from metering.cli_meter import main as meter_main
from metering.report.cli import main as report_main

ROOT = Path(__file__).resolve().parent.parent
NODE = ROOT / "gpusim" / "scenarios" / "sharing.yaml"
VGPU_HOST = ROOT / "gpusim" / "scenarios" / "vgpu-host.yaml"
COST_MODEL = Path(__file__).resolve().parent / "fixtures" / "e2e" / "sharing-cost-model.yaml"
EXPECTED_TEAMS = {"alpha": 34.28571, "beta": 24.0, "gamma": 48.0, "delta": 36.0,
                  "ml-research": 1.5, "data": 1.5, "product": 3.0}
EXPECTED_MODES = {"exclusive": 48.0, "mig": 10.28571, "time-slicing": 12.0, "mps": 36.0,
                  "fractional": 36.0, "vgpu": 6.0}
EXPECTED_PODS = {"whole": 24.0, "mig": 10.28571, "ts-a": 6.0, "ts-b": 6.0, "mps-a": 12.0,
                 "dra-one": 24.0, "dra-s1": 12.0, "dra-s2": 12.0, "hami-a": 6.0,
                 "hami-b": 12.0, "share-a": 18.0, "virt-launcher-vm-train": 1.5,
                 "virt-launcher-vm-notebook": 1.5, "virt-launcher-vm-infer": 3.0}
EXPECTED_IDLE = 49.71429 + 6.0
EXPECTED_FLEET = 192.0 + 12.0


def test_every_sharing_mode_priced_through_prometheus(tmp_path: Path) -> None:
    start = (datetime.now(UTC) - timedelta(days=2)).replace(minute=0, second=0, microsecond=0)
    end = start + timedelta(hours=6)
    history = tmp_path / "history.om"
    simulate_history([NODE, VGPU_HOST], start, end, 60.0, history, tmp_path / "sim", Say(0))
    data = tmp_path / "prom-data"
    promserver.backfill(history, data)
    db = tmp_path / "ledger.duckdb"
    with promserver.running_prometheus(data) as url:
        assert meter_main(["--prometheus", url, "--from", start.isoformat(),
                           "--to", end.isoformat(), "--db", str(db),
                           "--cost-model", str(COST_MODEL), "-q"]) == 0

    con = duckdb.connect(str(db), read_only=True)
    try:
        grants = dict(((pod, (mem, cores)) for pod, mem, cores in con.execute(
            "SELECT pod, any_value(memory_fraction), any_value(core_fraction) "
            "FROM grant_hours GROUP BY pod").fetchall()))
        pods = dict(con.execute(
            "SELECT pod, sum(cost) FROM charges WHERE pod <> '' GROUP BY pod").fetchall())
        modes = dict(con.execute(
            "SELECT sharing, sum(cost) FROM charges WHERE team NOT IN ('idle', 'down') "
            "GROUP BY sharing").fetchall())
    finally:
        con.close()
    assert grants == {"hami-a": (0.25, 0.6), "hami-b": (0.5, None), "share-a": (0.75, None),
                      "virt-launcher-vm-train": (0.25, None),
                      "virt-launcher-vm-notebook": (0.25, None),
                      "virt-launcher-vm-infer": (0.5, None)}
    assert {p: float(c) for p, c in pods.items()} == pytest.approx(EXPECTED_PODS, abs=1e-5)
    assert {m: float(c) for m, c in modes.items()} == pytest.approx(EXPECTED_MODES, abs=1e-5)

    out = tmp_path / "report"
    month = start.strftime("%Y-%m")
    assert report_main(["--month", month, "--db", str(db), "--out", str(out),
                        "--cost-model", str(COST_MODEL)]) == 0
    with (out / f"chargeback-{month}.csv").open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    teams = {r["team"]: float(r["cost"]) for r in rows if r["section"] == "team"}
    assert {t: teams[t] for t in EXPECTED_TEAMS} == pytest.approx(EXPECTED_TEAMS, abs=1e-5)
    idle = sum(c for t, c in teams.items() if t not in EXPECTED_TEAMS)
    assert idle == pytest.approx(EXPECTED_IDLE, abs=1e-5)
    # The report's model x sharing breakdown names each mode.
    shown = {r["sharing"] for r in rows if r["section"] == "model_sharing"}
    assert set(EXPECTED_MODES) <= shown
    fleet = next(r for r in rows if r["section"] == "fleet")
    assert float(fleet["cost"]) == pytest.approx(EXPECTED_FLEET, abs=1e-6)
    assert int(fleet["hours_with_data"]) == 6
