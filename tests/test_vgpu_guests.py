"""A cluster of VMs on NVIDIA vGPU (the guest) beside the cluster that hosts them: the guest's
GPU is its vGPU type ("NVIDIA A100-20C"), priced at the type's share of the whole GPU, or
left out when the host's vGPU rows already bill the hardware. Hand-computed month, to the
cent."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest

from metering.costmodel import load_cost_model, vgpu_guest_framebuffer
from metering.db import connect
from metering.period import Month
from metering.pricing import price_period
from metering.report.builder import make_report

OCT = Month.parse("2026-10")  # 744 hours
HOST_GPU = "NVIDIA A100-SXM4-80GB"
GUEST_GPU = "NVIDIA A100-20C"  # the vGPU type, as the guest's driver names its device
MODEL = """
currency: EUR
pricing:
  default: {hourly: 1.00, memory_gb: 16}
  gpus:
    - {pattern: "NVIDIA A100*", hourly: 2.00, memory_gb: 80}
teams:
  label: team
  namespaces:
    - {namespace: vms, team: platform}
"""
EXCLUDE = """clusters:
  guest:
    vgpu: {guests: exclude}
"""


def _ledger(path: Path) -> Path:
    """October 2026, every hour:
      host:  one A100 80 GB up all month; VM vm-1 (namespace vms) holds an A100-20C vGPU on
             it (framebuffer 20 of 80 GB: grant fraction 0.25) all month.
      guest: that VM, a Kubernetes node whose GPU is the A100-20C; pod finetune (team ml)
             holds it the first 372 hours, nobody the rest."""
    con = connect(path)
    hours = ("SELECT TIMESTAMP '2026-10-01' + INTERVAL (h) HOUR AS hour FROM range(744) t(h)")
    dev = ("INSERT INTO device_hours (hour, node, gpu, uuid, model, mig_enabled, "
           "observed_seconds, up_seconds, sm_active_seconds, energy_joules, cluster) ")
    con.execute(dev + f"SELECT hour, 'n1', '0', 'GPU-host', '{HOST_GPU}', "
                f"false, 3600, 3600, NULL, NULL, 'host' FROM ({hours})")
    con.execute(dev + f"SELECT hour, 'vm-1', '0', 'GPU-vm', '{GUEST_GPU}', "
                f"false, 3600, 3600, NULL, NULL, 'guest' FROM ({hours})")
    con.execute("INSERT INTO allocation_hours SELECT hour, 'n1', 'vms', 'virt-launcher-vm-1', "
                "'compute', 'GPU-host', '', 'nvidia.com/NVIDIA_A100-20C', 'vgpu', 1, 1, 3600, "
                f"0, NULL, MAP {{}}, 'host' FROM ({hours})")
    con.execute("INSERT INTO grant_hours SELECT hour, 'vms', 'virt-launcher-vm-1', 'compute', "
                f"'GPU-host', '', 0.25, NULL, 'host' FROM ({hours})")
    con.execute("INSERT INTO allocation_hours SELECT hour, 'vm-1', 'ml', 'finetune', 'main', "
                "'GPU-vm', '', 'nvidia.com/gpu', 'exclusive', 1, 1, 3600, 0, 0, "
                f"MAP {{'team': 'ml'}}, 'guest' FROM ({hours}) WHERE hour < TIMESTAMP "
                "'2026-10-16 12:00'")
    for cluster in ("host", "guest"):
        con.execute(f"INSERT INTO coverage SELECT hour, 'test', 1, now(), 0, 0, '{cluster}' "
                    f"FROM ({hours})")
    con.close()
    return path


def _costs(db: Path) -> dict[tuple[str, str], Decimal]:
    """(cluster, team) -> cost of the month."""
    with connect(db, read_only=True) as con:
        rows = con.execute("SELECT cluster, team, sum(cost) FROM charges GROUP BY ALL").fetchall()
    return {(c, t): Decimal(v) for c, t, v in rows}


def test_vgpu_type_names() -> None:
    assert vgpu_guest_framebuffer("NVIDIA A100-20C") == 20
    assert vgpu_guest_framebuffer("GRID T4-16Q") == 16
    assert vgpu_guest_framebuffer("NVIDIA A100-3-20C") == 20  # MIG-backed
    for whole in ("NVIDIA A100-SXM4-80GB", "NVIDIA A100-PCIE-40GB", "NVIDIA H100 80GB HBM3",
                  "Tesla T4", "NVIDIA L4", "NVIDIA A10G", "NVIDIA A800-SXM4-80GB"):
        assert vgpu_guest_framebuffer(whole) is None, whole


def test_guest_gpu_is_priced_at_its_vgpu_share(tmp_path: Path) -> None:
    """A100s at 2.00/h. host: 744 device-hours = 1,488.00; vm-1's vGPU 0.25 of them =
    372.00 to platform, idle 1,116.00. guest: its A100-20C is 20 of the entry's 80 GB =
    0.50/h: finetune 372 h = 186.00, idle 372 h = 186.00. Fleet 1,860.00 (billed as a whole
    A100, the guest alone would have been 1,488.00)."""
    (tmp_path / "cm.yaml").write_text(MODEL)
    cm = load_cost_model(tmp_path / "cm.yaml")
    db = _ledger(tmp_path / "m.duckdb")
    with connect(db) as con:
        result = price_period(con, cm, OCT.start, OCT.end)
    assert _costs(db) == {("host", "platform"): Decimal("372"),
                          ("host", "idle"): Decimal("1116"),
                          ("guest", "ml"): Decimal("186"), ("guest", "idle"): Decimal("186")}
    assert result.fleet_cost == Decimal("1860")
    price = cm.price_for(GUEST_GPU)
    assert price.hourly == Decimal("0.5") and price.guest is not None
    report = make_report(str(db), OCT, str(tmp_path / "cm.yaml"), 20)
    guest = next(c for c in report.capacity if c.model == GUEST_GPU)
    assert guest.price is not None and "vGPU guest: 0.25 of it (20 of 80 GB)" in guest.price.rule
    # the vGPU type matched a pattern written for whole GPUs: said at the top of the report
    [warning] = [w for w in report.notes if GUEST_GPU in w]
    assert 'pattern "NVIDIA A100*"' in warning and "0.25" in warning


@pytest.mark.parametrize("table", ["", "vgpu: {table: {NVIDIA_A100-20C: 0.3}}\n"])
def test_guest_cluster_left_out_when_its_host_is_metered(tmp_path: Path, table: str) -> None:
    """clusters.guest.vgpu.guests: exclude: the host's vGPU rows bill the hardware (372.00 to
    platform, 1,116.00 idle), the guest's device-hours cost nothing; the fleet is the host's
    1,488.00 whatever the vgpu.table says."""
    (tmp_path / "cm.yaml").write_text(MODEL + table + EXCLUDE)
    cm = load_cost_model(tmp_path / "cm.yaml")
    db = _ledger(tmp_path / "m.duckdb")
    with connect(db) as con:
        result = price_period(con, cm, OCT.start, OCT.end)
    costs = {k: v for k, v in _costs(db).items() if v}
    host_vm = Decimal("0.3") * 2 * 744 if table else Decimal("372")
    assert costs == {("host", "platform"): host_vm, ("host", "idle"): 1488 - host_vm}
    assert result.fleet_cost == Decimal("1488")
    assert cm.for_cluster("guest").price_for(GUEST_GPU).hourly == 0
    assert cm.price_for(GUEST_GPU).hourly == (Decimal("0.6") if table else Decimal("0.5"))


def test_an_exact_entry_for_the_vgpu_type_is_its_price(tmp_path: Path) -> None:
    (tmp_path / "cm.yaml").write_text(MODEL.replace(
        "  gpus:\n", '  gpus:\n    - {model: "NVIDIA A100-20C", hourly: 0.70}\n'))
    price = load_cost_model(tmp_path / "cm.yaml").price_for(GUEST_GPU)
    assert price.hourly == Decimal("0.7") and price.guest is None
