"""A GPU is one uuid within its cluster. Exporters publish a chip-derived ID where the vendor
library gives one, else `<PCI address>@<node>` (exporter/device/identity.py): identical nodes'
Intel GPUs, at identical addresses, are separate GPUs with separate bills. Two nodes reporting
the same uuid all hour (an older exporter's bare PCI address) would have their device-hours and
holders merged into one GPU's bill: metering refuses such a chunk with one line and writes
nothing, whether the two nodes' series arrive in one node group or in two."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import numpy as np
import pytest
from test_clusters import T0, gpu_hour, meter, om, rows

from exporter.cli import node_name_notice
from exporter.device.amd import AmdBackend
from exporter.device.contract import Tally
from exporter.device.identity import (
    HardwareId,
    NodeAddress,
    amdsmi_id,
    identity,
    level_zero_id,
    published_uuid,
)
from exporter.device.intel import IntelBackend
from exporter.history import OpenMetricsHistory
from gpu_ledger.demo import HISTORY_FAMILIES
from gpusim.amdsmi_sim import mi300x_cpx_nps4
from gpusim.cluster import SimCluster
from gpusim.intel_sysfs import flex_host
from gpusim.levelzero import SimZes, SimZesDevice, SimZesMemory, pci_uuid, telemetry_uuid
from metering.cluster import ClusterScope
from metering.costmodel import load_cost_model
from metering.db import connect
from metering.errors import MeteringError
from metering.facts import build_signal, write_facts
from metering.period import resolve
from metering.pricing import price_period
from metering.signals import SIGNALS
from tests.omledger import ingested

VENDORS = Path(__file__).resolve().parent.parent / "gpusim" / "scenarios" / "vendors"
VT0 = int(datetime(2026, 10, 1, tzinfo=UTC).timestamp())
BDF = "0000:4d:00.0"
MAX1550 = "Intel Data Center GPU Max 1550"
MESSAGE = (rf"GPU {BDF} is reported by nodes n1 and n2 in the hour 2026-10-05T00:00Z: a GPU's "
           "uuid must be unique in its cluster")


def test_one_uuid_on_two_nodes_in_one_group_is_refused(tmp_path: Path) -> None:
    n1 = gpu_hour(MAX1550, 60, uuid=BDF)
    n2 = gpu_hour(MAX1550, 30, uuid=BDF, pod="trainer-1").replace('node="n1"', 'node="n2"')
    con = connect(tmp_path / "ledger.duckdb")
    with pytest.raises(MeteringError, match=MESSAGE):
        meter(con, om(tmp_path, "two.om", n1, n2), ClusterScope("east"))
    assert rows(con, "SELECT count(*) FROM device_hours") == [(0,)]
    assert rows(con, "SELECT count(*) FROM allocation_hours") == [(0,)]


def test_the_same_uuid_in_two_clusters_or_two_hours_is_not_a_clash(tmp_path: Path) -> None:
    con = connect(tmp_path / "ledger.duckdb")
    meter(con, om(tmp_path, "east.om", gpu_hour(MAX1550, 60, uuid=BDF)), ClusterScope("east"))
    meter(con, om(tmp_path, "west.om", gpu_hour(MAX1550, 60, uuid=BDF)), ClusterScope("west"))
    assert rows(con, "SELECT cluster, node, uuid FROM device_hours ORDER BY 1") == [
        ("east", "n1", BDF), ("west", "n1", BDF)]


def test_a_node_relabelled_mid_hour_is_one_gpu_not_a_clash(tmp_path: Path) -> None:
    """The same GPU under a node label that changes at 00:30 (docs/metering.md, "Several series
    for one key"): the two nodes' series follow each other, so the hour is one GPU's. (The
    sample interval is given: detected from this one hour, each half would look whole.)"""
    first = "\n".join(line for line in gpu_hour(MAX1550, 60, uuid=BDF).splitlines()
                      if line.startswith("#") or int(line.rsplit(" ", 1)[1]) <= T0 + 1800)
    second = "\n".join(line for line in gpu_hour(MAX1550, 60, uuid=BDF).splitlines()
                       if line.startswith("#") or int(line.rsplit(" ", 1)[1]) > T0 + 1800)
    con = connect(tmp_path / "ledger.duckdb")
    meter(con, om(tmp_path, "relabel.om", first, second.replace('node="n1"', 'node="n2"')),
          ClusterScope("east"), sample_interval=60.0)
    assert rows(con, "SELECT uuid, observed_seconds FROM device_hours") == [(BDF, 3600.0)]
    assert rows(con, "SELECT pod, allocated_seconds FROM allocation_hours") == [
        ("trainer-0", 3600.0)]


def _up(node: str, at: int = 0) -> dict[str, object]:
    spec = next(s for s in SIGNALS if s.name == "up_count")
    labels = {"node": node, "gpu": "0", "uuid": BDF, "model": MAX1550, "cluster": "east"}
    hour = int(datetime(2026, 10, 5, at, 0).timestamp())
    table = build_signal(spec, [labels], np.zeros(1, np.int64), np.array([hour], np.int64),
                         np.array([60.0]))
    return {"up_count": table}


def test_one_uuid_on_two_nodes_in_two_node_groups_is_refused(tmp_path: Path) -> None:
    """Node groups are written one after another (the planner splits a chunk by node): each
    group alone has one node per GPU, the chunk has two."""
    con = connect(tmp_path / "ledger.duckdb")
    start, end = datetime(2026, 10, 5, 0), datetime(2026, 10, 5, 1)
    con.execute("BEGIN")
    with pytest.raises(MeteringError, match=MESSAGE):
        write_facts(con, [_up("n1"), _up("n2")], start, end, 60.0, ClusterScope("east"))
    con.execute("ROLLBACK")
    assert rows(con, "SELECT count(*) FROM device_hours") == [(0,)]


def test_a_gpu_moved_to_another_node_between_hours_in_two_node_groups_is_not_a_clash(
        tmp_path: Path) -> None:
    """The GPU is on n1 in the first hour and on n2 in the second (a card moved, a node
    renamed): two nodes in the chunk, one in each hour."""
    con = connect(tmp_path / "ledger.duckdb")
    start, end = datetime(2026, 10, 5, 0), datetime(2026, 10, 5, 2)
    con.execute("BEGIN")
    write_facts(con, [_up("n1", 0), _up("n2", 1)], start, end, 60.0, ClusterScope("east"))
    con.execute("COMMIT")
    assert rows(con, "SELECT node, hour FROM device_hours ORDER BY hour") == [
        ("n1", datetime(2026, 10, 5, 0)), ("n2", datetime(2026, 10, 5, 1))]


# --- the identity exporters publish (exporter/device/identity.py, docs/backends.md) --------

def test_level_zero_uuid_is_used_only_when_read_from_the_chip() -> None:
    """compute-runtime's PCI-built UUID (vendor 0x8086, device 0x56c0, revision 8, domain 0,
    bus 0x4d, device 0, function 0, zeros, subdevice 0) is not unique across nodes; the one it
    reads from a Max's telemetry (8 chip bytes, zeros) is; zeros mean it gave none."""
    pci = bytes.fromhex("8680c05608000000" "4d00000000000000")
    assert level_zero_id(pci, BDF) is None
    # the same layout at another address is not this device's PCI-built UUID
    assert level_zero_id(pci, "0000:8d:00.0") == HardwareId(
        "8680c056-0800-0000-4d00-000000000000")
    chip = bytes.fromhex("1f2e3d4c5b6a7988" "0000000000000000")
    assert level_zero_id(chip, BDF) == HardwareId("1f2e3d4c-5b6a-7988-0000-000000000000")
    assert level_zero_id(bytes(16), BDF) is None


def test_amdsmi_uuid_is_used_only_with_the_asics_unique_id() -> None:
    """amdsmi_uuid_gen over a zero unique ID (ROCm 6.2 with no sysfs unique_id) is the same for
    every GPU of a model; one over a real unique ID is the chip's."""
    assert amdsmi_id("00ff74a1-0000-1000-8000-000000000000") is None
    assert amdsmi_id("") is None
    real = "5cff74a1-0000-1000-80e3-0fa1b2c3d4e5"
    assert amdsmi_id(real.upper()) == HardwareId(real)


def test_published_uuid_is_the_chip_id_else_address_at_node() -> None:
    assert published_uuid(identity(HardwareId("GPU-1"), "n1", BDF)) == "GPU-1"
    assert published_uuid(identity(None, "n1", BDF)) == f"{BDF}@n1"
    assert published_uuid(NodeAddress("", BDF)) == BDF  # no node name: the old bare address


def test_a_node_name_that_is_not_the_nodes_is_one_line(monkeypatch: pytest.MonkeyPatch
                                                       ) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)
    for line in (node_name_notice("", []), node_name_notice("pod-x7k2p", [])):
        assert line and "\n" not in line
    assert node_name_notice("n1", ["--node-name", "n1"]) is None
    monkeypatch.setenv("NODE_NAME", "n1")
    assert node_name_notice("n1", []) is None


H = 3  # hours the two-node clusters below run
UHD, MAX = Decimal("0.05"), Decimal("1.50")  # cost-model.yaml's device-hour prices


def _twins(tmp_path: Path, name: str, renames: dict[str, str]) -> list[Path]:
    """A vendor scenario and its twin: the same GPUs at the same PCI addresses on node
    `<node>-b`, its pods renamed (one cluster has one pod of a name per namespace)."""
    text = (VENDORS / name).read_text()
    node = next(line.split(":", 1)[1].strip() for line in text.splitlines()
                if line.startswith("node:"))
    twin = text.replace(f"node: {node}", f"node: {node}-b")
    for old, new in renames.items():
        twin = twin.replace(old, new)
    a, b = tmp_path / f"a-{name}", tmp_path / f"b-{name}"
    a.write_text(text)
    b.write_text(twin)
    return [a, b]


def test_identical_intel_nodes_in_one_cluster_are_metered_as_separate_gpus(
        tmp_path: Path) -> None:
    """Two identical GVT-g iGPU hosts (the iGPU at 0000:00:02.0 on both, Level Zero's UUID
    PCI-built: published as `<address>@<node>`) and two identical Max SR-IOV hosts (0000:4d:00.0
    and 0000:8d:00.0 on both, UUIDs read from the chips' telemetry) in one cluster, each node
    the real exporter, its history ingested, priced with the packaged cost model: four iGPU
    and Max GPUs, each billed alone. Per node and hour: alice (GVTg_V5_4) pays UHD/4, bob
    (V5_8) UHD/8, the free V5_8 is idle; solver and render hold a VF of 4 each: MAX/4; the
    shared Max's two pods MAX/2 each."""
    scenarios = (_twins(tmp_path, "intel-igpu-gvtg.yaml",
                        {"desk-alice": "desk-carol", "desk-bob": "desk-dave"})
                 + _twins(tmp_path, "intel-max-sriov.yaml",
                          {"solver-0": "solver-1", "render-0": "render-1",
                           "tiles-0": "tiles-1", "translate-0": "translate-1"}))
    om = tmp_path / "twins.om"
    history = OpenMetricsHistory(om, HISTORY_FAMILIES)
    with SimCluster([], start=VT0, workdir=tmp_path / "sim", vendors=scenarios,
                    window=(0.0, H * 3600.0 + 3600)) as cluster:
        for i in range(1, H + 1):
            for _, rendering in cluster.step(VT0 + i * 3600):
                history.add(rendering.samples, VT0 + i * 3600)
    history.close()
    period = resolve(None, "2026-10-01T00:00", f"2026-10-01T{H:02d}:00")
    con = ingested(om, period, tmp_path / "m.duckdb")
    gpus = rows(con, "SELECT node, uuid, count(*) FROM device_hours GROUP BY ALL ORDER BY ALL")
    igpu = "0000:00:02.0"
    assert [(n, u) for n, u, _ in gpus if u.startswith(igpu)] == [
        ("igpu-desk-01", f"{igpu}@igpu-desk-01"), ("igpu-desk-01-b", f"{igpu}@igpu-desk-01-b")]
    chips = [(n, u) for n, u, _ in gpus if not u.startswith(igpu)]
    assert len(chips) == 4 and len({u for _, u in chips}) == 4
    assert all("@" not in u for _, u in chips)  # chip-derived: 8-4-4-4-12 hex
    assert {c for _, _, c in gpus} == {H}
    result = price_period(con, load_cost_model(None), period.start, period.end)
    assert result.total == result.fleet_cost
    pods = dict(con.execute("SELECT pod, sum(cost) FROM charges WHERE pod <> '' "
                            "GROUP BY pod").fetchall())
    assert pods == {
        "virt-launcher-desk-alice": H * UHD / 4, "virt-launcher-desk-carol": H * UHD / 4,
        "virt-launcher-desk-bob": H * UHD / 8, "virt-launcher-desk-dave": H * UHD / 8,
        "solver-0": H * MAX / 4, "render-0": H * MAX / 4,
        "solver-1": H * MAX / 4, "render-1": H * MAX / 4,
        "tiles-0": H * MAX / 2, "translate-0": H * MAX / 2,
        "tiles-1": H * MAX / 2, "translate-1": H * MAX / 2}
    idle = dict(con.execute("SELECT model, sum(cost) FROM charges WHERE team = 'idle' "
                            "GROUP BY model").fetchall())
    assert idle == {"Intel(R) UHD Graphics 630": 2 * H * UHD * (1 - Decimal(1) / 4
                                                                - Decimal(1) / 8),
                    "Intel(R) Data Center GPU Max 1550": 2 * H * MAX / 2}
    con.close()


@pytest.mark.parametrize("amd_uuid", [
    "",  # ROCm 7 amdsmi_get_gpu_device_uuid fails without a unique ID
    "00ff74a1-0000-1000-8000-000000000000",  # ROCm 6.2: generated from unique ID 0
])
def test_amd_gpu_without_a_chip_uuid_is_named_by_node_and_address(amd_uuid: str) -> None:
    """Its CPX partitions are children of that name, as MIG instances are of a GPU's."""
    sim = mi300x_cpx_nps4(gpus=1)
    sim.gpus[0].uuid = amd_uuid
    backend = AmdBackend(sim.as_api(), node="n1")
    backend.open()
    inv = backend.inventory(None)
    gpu = "0000:0c:00.0@n1"
    assert [g.uuid for g in inv.gpus] == [gpu]
    assert inv.static[gpu].pci_bdf == "0000:0c:00.0"
    assert [m.uuid for m in inv.migs] == [f"{gpu}/{slot}" for slot in range(8)]


def test_a_gpu_keeps_its_chip_uuid_when_the_library_misses_it_once() -> None:
    sim = mi300x_cpx_nps4(gpus=1)
    chip = sim.gpus[0].uuid
    backend = AmdBackend(sim.as_api(), node="n1")
    backend.open()
    first = backend.inventory(None)
    sim.gpus[0].uuid = ""
    again = backend.inventory(first)
    assert [g.uuid for g in again.gpus] == [chip]
    assert [m.uuid for m in again.migs] == [m.uuid for m in first.migs]  # its partitions' too
    assert len({m.uuid for m in first.migs}) == 8 and chip not in {m.uuid for m in first.migs}


def test_intel_uuid_from_level_zero_only_when_read_from_the_chip(tmp_path: Path) -> None:
    """A Flex at 0000:4d:00.0: with compute-runtime's PCI-built UUID it is `<address>@n1`; with
    a telemetry one it is that UUID, kept when Level Zero misses it once; its telemetry,
    memory and process joins stay by address."""
    flex_host(str(tmp_path), vfs=0)
    dev = SimZesDevice((0, 0x4d, 0, 0), "Intel(R) Data Center GPU Flex 170",
                       [SimZesMemory(16 << 30, 12 << 30)],
                       uuid=pci_uuid(0x56C0, (0, 0x4D, 0, 0)))
    b = IntelBackend(sysfs_root=str(tmp_path), proc_root=str(tmp_path / "no-proc"),
                     sysman=lambda: (SimZes([dev]), ""), node="n1")
    b.open()
    inv = b.inventory(None)
    assert [g.uuid for g in inv.gpus] == [f"{BDF}@n1"]
    assert inv.static[f"{BDF}@n1"].pci_bdf == BDF
    dev.uuid = telemetry_uuid(bytes.fromhex("0123456789abcdef"))
    inv = b.inventory(None)
    assert [g.uuid for g in inv.gpus] == ["01234567-89ab-cdef-0000-000000000000"]
    t = b.telemetry(inv.gpus[0], Tally())
    assert t.energy_joules == 1234.0 and t.memory is not None \
        and t.memory.used_bytes == 4 << 30
    dev.uuid = bytes(16)  # Level Zero gives none this time
    assert [g.uuid for g in b.inventory(inv).gpus] == ["01234567-89ab-cdef-0000-000000000000"]
