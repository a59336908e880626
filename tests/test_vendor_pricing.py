"""Per-vendor prices and the fractions of AMD partitions, VFs and GVT-g mdevs, on hand-made
facts (the month through ingest is tests/test_vendor_month.py)."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import duckdb
import pytest
from test_pricing import T0, T1, alloc, charges, device, price

from metering.costmodel import CostModelError, load_cost_model
from metering.db import connect, migrate
from metering.pricing import price_period

D = Decimal
MI300X = "AMD Instinct MI300X"
MODEL = """
currency: EUR
pricing:
  default: {hourly: 1.00}
  gpus:
    - {model: "Shared Name", vendor: amd, hourly: 3.00}
    - {model: "Shared Name", hourly: 2.00}
    - {model: "AMD Instinct MI300X", vendor: amd, hourly: 3.20}
    - {pattern: "Intel*", vendor: intel, hourly: 0.80}
"""


@pytest.fixture
def con() -> Any:
    c = connect(":memory:")
    yield c
    c.close()


def _cm(tmp_path: Path, extra: str = "") -> Any:
    p = tmp_path / "cm.yaml"
    p.write_text(MODEL + extra)
    return load_cost_model(p)


def _vendor(con: Any, uuid: str, vendor: str) -> None:
    con.execute("UPDATE device_hours SET vendor = ? WHERE uuid = ?", [vendor, uuid])


def test_vendor_key_picks_the_entry(tmp_path: Path) -> None:
    cm = _cm(tmp_path)
    assert cm.price_for("Shared Name", "amd").hourly == D("3.00")
    assert cm.price_for("Shared Name", "nvidia").hourly == D("2.00")
    assert cm.price_for("Intel(R) Arc A770", "intel").hourly == D("0.80")
    assert cm.price_for("Intel(R) Arc A770", "nvidia").rule == "pricing.default"
    # No vendor known (a report's price table): any entry may match.
    assert cm.price_for(MI300X).hourly == D("3.20")


@pytest.mark.parametrize(("extra", "message"), [
    ("    - {model: X, vendor: AMD, hourly: 1}\n",
     'cm.yaml: pricing.gpus[4].vendor: expected one of nvidia | amd | intel, got "AMD"'),
    ("    - {model: \"AMD Instinct MI300X\", vendor: amd, hourly: 1}\n",
     'cm.yaml: pricing.gpus[4]: expected a model not already priced at pricing.gpus[2], got '
     '"AMD Instinct MI300X of vendor amd"'),
])
def test_bad_vendor_entries_are_one_line_errors(tmp_path: Path, extra: str,
                                                message: str) -> None:
    with pytest.raises(CostModelError) as e:
        _cm(tmp_path, extra)
    assert str(e.value).replace(str(tmp_path) + "/", "") == message


def test_same_model_name_of_two_vendors_is_priced_by_each_vendor(con: Any,
                                                                 tmp_path: Path) -> None:
    device(con, "GPU-n", "Shared Name")
    device(con, "GPU-a", "Shared Name")
    _vendor(con, "GPU-a", "amd")
    result = price_period(con, _cm(tmp_path), T0, T1)
    assert result.fleet_cost == result.total == D("5.00")
    got = charges(con)
    assert got == {("idle", "GPU-n"): D("2.00"), ("idle", "GPU-a"): D("3.00")}


def test_amd_partition_known_by_resource_name_only(con: Any, tmp_path: Path) -> None:
    """No partition facts (gpu_mig_info): the resource amd.com/qpx_nps4 says a QPX partition,
    1 of 4 on an MI300X; amd.com/cpx_nps1 1 of 8. The rest of the GPU is idle."""
    device(con, "GPU-a", MI300X, mig=True)
    _vendor(con, "GPU-a", "amd")
    alloc(con, "q", "GPU-a", mig_uuid="part-0", sharing="mig", resource="amd.com/qpx_nps4")
    alloc(con, "c", "GPU-a", mig_uuid="part-1", sharing="mig", resource="amd.com/cpx_nps1")
    price(con, _cm(tmp_path))
    assert charges(con) == {("unallocated", "q"): D("0.80"), ("unallocated", "c"): D("0.40"),
                            ("idle", "GPU-a"): D("2.00")}
    profiles = dict(con.execute("SELECT pod, profile FROM charges WHERE pod <> ''").fetchall())
    assert profiles == {"q": "qpx_nps4", "c": "cpx_nps1"}


def test_mdev_type_vgpu_table_and_replicas(con: Any, tmp_path: Path) -> None:
    """GVT-g V5_8 = 1/8; vgpu.table wins over the type rule; a VF of 4 enabled = 1/4."""
    device(con, "GPU-i", "Intel(R) UHD Graphics 630")
    _vendor(con, "GPU-i", "intel")
    alloc(con, "vm-8", "GPU-i", ns="vms", sharing="vgpu", resource="intel.com/i915-GVTg_V5_8")
    alloc(con, "vm-t", "GPU-i", ns="vms", sharing="vgpu", resource="intel.com/i915-GVTg_V5_4",
          container="other")
    device(con, "GPU-x", "Intel(R) Data Center GPU Flex 170")
    _vendor(con, "GPU-x", "intel")
    alloc(con, "vm-vf", "GPU-x", ns="vms", sharing="vgpu", replicas=4,
          resource="intel.com/flex170_vf")
    price(con, _cm(tmp_path, "vgpu:\n  table: {i915-GVTg_V5_4: 0.5}\n"))
    got = charges(con)
    assert got == {("unallocated", "vm-8"): D("0.10"), ("unallocated", "vm-t"): D("0.40"),
                   ("idle", "GPU-i"): D("0.30"), ("unallocated", "vm-vf"): D("0.20"),
                   ("idle", "GPU-x"): D("0.60")}


def test_a_ledger_without_vendors_gets_nvidia(tmp_path: Path) -> None:
    """A ledger written before the vendor column: its devices become NVIDIA's."""
    path = tmp_path / "old.duckdb"
    connect(path).close()
    old = duckdb.connect(str(path))
    old.execute("ALTER TABLE device_hours DROP COLUMN vendor")
    old.execute("INSERT INTO device_hours (hour, node, gpu, uuid, model, mig_enabled, "
                "observed_seconds, up_seconds) VALUES (?, 'n1', '0', 'GPU-1', 'NVIDIA L4', "
                "false, 3600, 3600)", [T0])
    done = migrate(old)
    assert any("vendor" in s for s in done)
    assert old.execute("SELECT vendor FROM device_hours").fetchall() == [("nvidia",)]
    assert migrate(old) == []
    old.close()


def test_an_export_from_before_vendors_reads_as_nvidia(tmp_path: Path) -> None:
    """A Parquet export written before device_hours.vendor (its files lack the column) is
    still a ledger: its devices read as NVIDIA's, as the migration makes a ledger's."""
    import pyarrow.parquet as pq
    from test_fleet_ledger import cluster_ledger

    from metering import manifest
    from metering.export import export_ledger
    from metering.ledgerview import open_ledger

    out = tmp_path / "export"
    export_ledger(cluster_ledger(tmp_path, "fleet.duckdb", ("east",)), out)
    m = manifest.read(out)
    assert m is not None
    for rel, entry in list(m.files.items()):
        if entry.table == "device_hours":
            f = out / rel
            pq.write_table(pq.read_table(f).drop_columns(["vendor"]), f)
            m.files[rel] = manifest.describe(out, f, entry.table, entry.cluster, entry.month)
    manifest.write(out, m)
    con = open_ledger(out)
    try:
        assert {r[0] for r in con.execute("SELECT vendor FROM device_hours").fetchall()} == {
            "nvidia"}
    finally:
        con.close()
