"""A priced month mixing NVIDIA, AMD partitions, AMD MxGPU VFs, Intel SR-IOV VFs and Intel
GVT-g mdevs (issue 25, item 7): exporter series in OpenMetrics through the real ingest path,
priced with a cost model that has per-vendor entries, and every bill checked against
arithmetic done here by hand, from the scenario's description, not from the engine.

October 2026 (744 hours), one sample every 10 minutes:
  n-nv   GPU-nv0  "NVIDIA H100 80GB HBM3", no vendor label (an exporter before the label):
         NVIDIA, 4.00/h. Deployment train (team ml) holds it exclusively all month.
  n-amd  GPU-amd0 "AMD Instinct MI300X", vendor amd, 3.20/h, in CPX/NPS4: 8 partitions
         (gpu_mig_info profile cpx_nps4, 1 of 8 XCDs each). Down (gpu_up 0) hours 456-479.
         pod llm-0 (team ml) holds partition 0 all month; pod llm-1 (team research) holds
         partition 1 the first 240 hours.
  n-mx   GPU-amd1 "AMD Instinct MI210", vendor amd, 1.60/h, MxGPU host, 4 VFs enabled:
         virt-launcher-vm-mx holds one VF (replicas 4, no grant) all month.
  n-max  GPU-max0 "Intel(R) Data Center GPU Max 1550", vendor intel, 2.50/h, SR-IOV:
         virt-launcher-vm-c holds a VF with 4 VFs enabled (replicas 4) all month;
         virt-launcher-vm-d holds a VF granted 32 of 128 GB (memory fraction 0.25, replicas 4)
         for 300 hours.
  n-igpu GPU-igpu0 "Intel(R) UHD Graphics 630", vendor intel, 0.08/h, GVT-g:
         virt-launcher-vm-a holds an i915-GVTg_V5_4 mdev all month; virt-launcher-vm-b an
         i915-GVTg_V5_2 for 100 hours (its exported memory grant, 0.0625, is not its price).
A decoy entry `{pattern: "*Max 1550*", vendor: amd, hourly: 99}` comes first: an AMD-only
entry never prices an Intel GPU.
"""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from metering.costmodel import load_cost_model
from metering.period import resolve
from metering.pricing import price_period
from tests.omledger import ingested

HOURS = 744
STEP = 600
T0 = int(datetime(2026, 10, 1, tzinfo=UTC).timestamp())
H100 = "NVIDIA H100 80GB HBM3"
MI300X = "AMD Instinct MI300X"
MI210 = "AMD Instinct MI210"
MAX = "Intel(R) Data Center GPU Max 1550"
UHD = "Intel(R) UHD Graphics 630"
AMD_DOWN = range(456, 480)

COST_MODEL = """
currency: USD
pricing:
  default: {hourly: 1.00}
  gpus:
    - {pattern: "*Max 1550*", vendor: amd, hourly: 99}
    - {model: "NVIDIA H100 80GB HBM3", hourly: 4.00, memory_gb: 80}
    - {model: "AMD Instinct MI300X", vendor: amd, hourly: 3.20, memory_gb: 192}
    - {pattern: "AMD Instinct MI2*", vendor: amd, hourly: 1.60}
    - {pattern: "Intel(R) Data Center GPU Max*", vendor: intel, hourly: 2.50, memory_gb: 128}
    - {pattern: "Intel(R) UHD Graphics*", vendor: intel, hourly: 0.08}
teams:
  label: team
  namespaces:
    - {namespace: vms, team: virt}
"""


def _dev(node: str, uuid: str, model: str, vendor: str | None) -> str:
    v = f',vendor="{vendor}"' if vendor else ""
    return f'node="{node}",gpu="0",uuid="{uuid}",model="{model}"{v}'


DEVICES = (("n-nv", "GPU-nv0", H100, None), ("n-amd", "GPU-amd0", MI300X, "amd"),
           ("n-mx", "GPU-amd1", MI210, "amd"), ("n-max", "GPU-max0", MAX, "intel"),
           ("n-igpu", "GPU-igpu0", UHD, "intel"))


def _alloc(node: str, ns: str, pod: str, uuid: str, part: str, resource: str, sharing: str,
           replicas: int, team: str = "") -> str:
    labels = f',label_team="{team}"' if team else ""
    return (f'gpu_container_allocation{{node="{node}",namespace="{ns}",pod="{pod}",'
            f'container="main",uuid="{uuid}",mig_uuid="{part}",resource="{resource}",'
            f'sharing="{sharing}",replicas="{replicas}",owner_kind="",owner_name=""'
            f'{labels}}}')


def _key(node: str, ns: str, pod: str, uuid: str) -> str:
    return (f'node="{node}",namespace="{ns}",pod="{pod}",container="main",uuid="{uuid}",'
            f'mig_uuid=""')


def openmetrics() -> str:
    """The month as the exporter would have exposed it, one sample every STEP seconds."""
    held: list[tuple[str, range, str]] = [
        (_alloc("n-nv", "train", "train-0", "GPU-nv0", "", "nvidia.com/gpu", "exclusive", 1,
                "ml"), range(HOURS), "1"),
        (_alloc("n-amd", "llm", "llm-0", "GPU-amd0", "amd-part-0", "amd.com/cpx_nps4", "mig",
                1, "ml"), range(HOURS), "1"),
        (_alloc("n-amd", "llm", "llm-1", "GPU-amd0", "amd-part-1", "amd.com/cpx_nps4", "mig",
                1, "research"), range(240), "1"),
        (_alloc("n-mx", "vms", "virt-launcher-vm-mx", "GPU-amd1", "", "amd.com/gpu_vf",
                "vgpu", 4), range(HOURS), "1"),
        (_alloc("n-max", "vms", "virt-launcher-vm-c", "GPU-max0", "", "intel.com/max1550_vf",
                "vgpu", 4), range(HOURS), "1"),
        (_alloc("n-max", "vms", "virt-launcher-vm-d", "GPU-max0", "", "intel.com/max1550_vf",
                "vgpu", 4), range(300), "1"),
        ("gpu_container_memory_fraction{"
         + _key("n-max", "vms", "virt-launcher-vm-d", "GPU-max0") + "}", range(300), "0.25"),
        (_alloc("n-igpu", "vms", "virt-launcher-vm-a", "GPU-igpu0", "",
                "intel.com/i915-GVTg_V5_4", "vgpu", 1), range(HOURS), "1"),
        (_alloc("n-igpu", "vms", "virt-launcher-vm-b", "GPU-igpu0", "",
                "intel.com/i915-GVTg_V5_2", "vgpu", 1), range(100), "1"),
        ("gpu_container_memory_fraction{"
         + _key("n-igpu", "vms", "virt-launcher-vm-b", "GPU-igpu0") + "}", range(100),
         "0.0625"),
    ]
    lines: list[str] = []
    for hour in range(HOURS):
        for k in range(1, 3600 // STEP + 1):
            t = T0 + hour * 3600 + k * STEP
            for node, uuid, model, vendor in DEVICES:
                dev = _dev(node, uuid, model, vendor)
                up = 0 if uuid == "GPU-amd0" and hour in AMD_DOWN else 1
                lines.append(f"gpu_up{{{dev}}} {up} {t}")
                mig = "enabled" if uuid == "GPU-amd0" else "disabled"
                lines.append(f'gpu_info{{{dev},mig_mode="{mig}"}} 1 {t}')
            for i in range(8):
                lines.append(
                    f'gpu_mig_info{{node="n-amd",gpu="0",uuid="GPU-amd0",model="{MI300X}",'
                    f'vendor="amd",mig_uuid="amd-part-{i}",gpu_instance_id="{i}",'
                    f'compute_instance_id="0",profile="cpx_nps4",slices="1",'
                    f'parent_slices="8"}} 1 {t}')
            lines += [f"{series} {value} {t}" for series, hours, value in held
                      if hour in hours]
    return "\n".join(lines) + "\n# EOF\n"


def _meter(tmp_path: Path) -> Any:
    f = tmp_path / "month.om"
    f.write_text(openmetrics())
    cm_path = tmp_path / "cost-model.yaml"
    cm_path.write_text(COST_MODEL)
    period = resolve("2026-10", None, None)
    con = ingested(f, period, tmp_path / "m.duckdb")
    result = price_period(con, load_cost_model(cm_path), period.start, period.end)
    return con, result


def _bills(con: Any) -> dict[tuple[str, str], Decimal]:
    """(team, pod, or the device's uuid for idle/down rows) -> month total."""
    out: dict[tuple[str, str], Decimal] = {}
    for team, pod, uuid, cost in con.execute(
            "SELECT team, pod, uuid, sum(cost) FROM charges GROUP BY ALL").fetchall():
        out[(team, pod or uuid)] = cost
    return out


def test_mixed_vendor_month_bills_by_hand(tmp_path: Path) -> None:
    con, result = _meter(tmp_path)
    D = Decimal
    up_amd = HOURS - len(AMD_DOWN)  # 720 hours up
    want = {
        # NVIDIA, no vendor label: the vendor-less H100 entry, whole device.
        ("ml", "train-0"): 744 * D("4.00"),                                   # 2976.00
        # MI300X CPX: 1/8 of 3.20 per held hour while up.
        ("ml", "llm-0"): up_amd * D("3.20") / 8,                              # 288.00
        ("research", "llm-1"): 240 * D("3.20") / 8,                           # 96.00
        ("down", "GPU-amd0"): len(AMD_DOWN) * D("3.20"),                      # 76.80
        ("idle", "GPU-amd0"): up_amd * D("3.20") - 720 * D("0.40") - 240 * D("0.40"),  # 1920
        # MxGPU VF, 4 enabled: 1/4 of 1.60.
        ("virt", "virt-launcher-vm-mx"): 744 * D("1.60") / 4,                 # 297.60
        ("idle", "GPU-amd1"): 744 * D("1.60") * 3 / 4,                        # 892.80
        # Max 1550 VFs: 1/4 by replicas; vm-d by its 0.25 grant (the same share here).
        ("virt", "virt-launcher-vm-c"): 744 * D("2.50") / 4,                  # 465.00
        ("virt", "virt-launcher-vm-d"): 300 * D("2.50") / 4,                  # 187.50
        ("idle", "GPU-max0"): 744 * D("2.50") - 465 - D("187.50"),            # 1207.50
        # GVT-g: V5_4 = 1/4, V5_2 = 1/2 of 0.08 (not the 0.0625 grant).
        ("virt", "virt-launcher-vm-a"): 744 * D("0.08") / 4,                  # 14.88
        ("virt", "virt-launcher-vm-b"): 100 * D("0.08") / 2,                  # 4.00
        ("idle", "GPU-igpu0"): 744 * D("0.08") - D("14.88") - D("4.00"),      # 40.64
    }
    got = _bills(con)
    assert {k: v for k, v in got.items() if v} == {k: v.quantize(D("0.000001"))
                                                    for k, v in want.items()}
    assert result.fleet_cost == 744 * (D("4.00") + D("3.20") + D("1.60") + D("2.50")
                                       + D("0.08"))
    assert result.total == result.fleet_cost
    assert result.default_priced_models == ()
    # The ledger knows each device's vendor; the unlabelled H100 is NVIDIA's.
    vendors = dict(con.execute("SELECT DISTINCT uuid, vendor FROM device_hours").fetchall())
    assert vendors == {"GPU-nv0": "nvidia", "GPU-amd0": "amd", "GPU-amd1": "amd",
                       "GPU-max0": "intel", "GPU-igpu0": "intel"}
    # AMD partitions carry their profile and their fraction of the device-hour.
    rows = con.execute("SELECT DISTINCT pod, profile, fraction FROM charges "
                       "WHERE model = ? AND team NOT IN ('idle', 'down') AND fraction > 0",
                       [MI300X]).fetchall()
    assert sorted(rows) == [("llm-0", "cpx_nps4", 0.125), ("llm-1", "cpx_nps4", 0.125)]
