"""Intel Data Center GPU Max tiles (Level Zero subdevices) as partitions: the Intel backend
lists them from sysfs in the kernel's layout (xe `device/tile<i>/gt<i>`, i915 `card<N>/gt/
gt<i>` on PVC) or from Level Zero's `numSubdevices`, reads a tile's memory from the memory
modules on its subdevice, and attribution gives each container the tiles GPU Aware
Scheduling wrote on its pod (`gas-container-tiles`), with the plugin's card from a real
PodResources gRPC server and the pod from the fake API server. A tile is priced as its 1/2
of the GPU, by hand below."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from exporter.attribution.collector import AttributionCollector
from exporter.attribution.deviceids import DeviceIndex, UnknownIds
from exporter.attribution.inteltiles import parse_tiles
from exporter.attribution.podresources import Allocation
from exporter.attribution.podwatch import pod_info
from exporter.attribution.sources import intel_plugin_units
from exporter.collectors import REGISTRY
from exporter.core import CycleContext, ExporterOptions, Labels, SampleSink
from exporter.device.backends import Backends
from exporter.device.contract import MemoryUsage, Tally
from exporter.device.intel import IntelBackend
from exporter.history import OpenMetricsHistory
from exporter.processes import ProcessStage
from exporter.sampler import Sampler
from gpu_ledger.demo import HISTORY_FAMILIES
from gpu_ledger.sharing import SharingMode
from gpusim.apiserver import FakeApiServer
from gpusim.cluster import SimCluster
from gpusim.intel_sysfs import MAX1550_BDF, IntelGpu, flex_host, max1550_host, write_gpu
from gpusim.kubelet import ContainerAllocation, FakeKubelet, PodAllocation
from gpusim.levelzero import (
    ZES_ENGINE_GROUP_COMPUTE_ALL,
    ZES_ENGINE_GROUP_MEDIA_ALL,
    SimZes,
    SimZesDevice,
    SimZesEngine,
    SimZesFabricPort,
    SimZesMemory,
    SimZesPower,
)
from metering.costmodel import load_cost_model
from metering.db import connect
from metering.ingest import ingest
from metering.openmetrics_source import OpenMetricsSource
from metering.period import resolve
from metering.pricing import price_period
from metering.selector import DEFAULT_SELECTOR
from tests.exporter_helpers import values
from tests.omledger import ingested
from tests.test_device_intel import Clock
from tests.test_fdinfo import ARC, Proc, xe
from tests.waiting import wait_until

GiB = 1 << 30
NODE = "node-max"
TILE0, TILE1 = f"{MAX1550_BDF}/tile0", f"{MAX1550_BDF}/tile1"
I915 = "gpu.intel.com/i915"
ROOT = Path(__file__).resolve().parent.parent


def _backend(root: Path, zes: SimZes | None = None) -> IntelBackend:
    (root / "proc").mkdir(exist_ok=True)
    b = IntelBackend(str(root), str(root / "proc"),
                     sysman=lambda: (zes, "") if zes is not None else (None, "absent"))
    b.open()
    return b


def _zes(used: tuple[int, int] = (40 * GiB, 10 * GiB), subdevices: int = 2) -> SimZes:
    """Sysman's view of the Max 1550 at 0000:29:00.0: a 64 GiB HBM module, a compute-all and
    a media-all engine group per subdevice, and a device-level compute-all group."""
    engines = [SimZesEngine(group, sub) for sub in (0, 1)
               for group in (ZES_ENGINE_GROUP_COMPUTE_ALL, ZES_ENGINE_GROUP_MEDIA_ALL)]
    return SimZes([SimZesDevice(
        (0, 0x29, 0, 0), "Intel(R) Data Center GPU Max 1550",
        [SimZesMemory(64 * GiB, 64 * GiB - used[i], subdevice=i) for i in range(2)],
        subdevices=subdevices,
        engines=[*engines, SimZesEngine(ZES_ENGINE_GROUP_COMPUTE_ALL, None)])])


@pytest.mark.parametrize("driver", ["xe", "i915"])
def test_max1550_lists_its_two_tiles(tmp_path: Path, driver: str) -> None:
    max1550_host(str(tmp_path), driver)
    inv = _backend(tmp_path).inventory(None)
    (gpu,) = inv.gpus
    assert gpu.mig_enabled and inv.static[MAX1550_BDF].mig_mode == "enabled"
    assert [(m.uuid, m.gpu_instance_id, m.compute_instance_id, m.profile, m.slices,
             m.parent_slices, m.kind, m.parent.uuid) for m in inv.migs] == [
        (TILE0, 0, 0, "tile", 1, 2, "intel_subdevice", MAX1550_BDF),
        (TILE1, 1, 1, "tile", 1, 2, "intel_subdevice", MAX1550_BDF)]
    # xe says each tile's VRAM; upstream i915 has no such file
    assert inv.static[MAX1550_BDF].memory_bytes == (128 * GiB if driver == "xe" else None)


def test_single_tile_and_media_gt_are_no_tiles(tmp_path: Path) -> None:
    flex_host(str(tmp_path), vfs=0)  # xe, tile0 only
    # a Meteor Lake-class i915 iGPU: gt1 is its media GT, not a tile
    write_gpu(str(tmp_path), IntelGpu("0000:00:02.0", 5, "0x7d55", "i915", gts=2))
    inv = _backend(tmp_path).inventory(None)
    assert len(inv.gpus) == 2 and inv.migs == ()
    assert not any(g.mig_enabled for g in inv.gpus)
    assert {s.mig_mode for s in inv.static.values()} == {""}


def test_level_zero_gives_tiles_and_their_memory(tmp_path: Path) -> None:
    # upstream i915 without gt/ directories: Sysman's numSubdevices says two tiles
    write_gpu(str(tmp_path), IntelGpu(MAX1550_BDF, 0, "0x0bd5", "i915", gts=0))
    b = _backend(tmp_path, _zes())
    inv = b.inventory(None)
    assert [m.uuid for m in inv.migs] == [TILE0, TILE1]
    assert inv.gpus[0].model == "Intel(R) Data Center GPU Max 1550"
    mem = {m.uuid: b.partition_memory(m, Tally()) for m in inv.migs}
    assert mem == {TILE0: MemoryUsage(64.0 * GiB, 40.0 * GiB, 24.0 * GiB),
                   TILE1: MemoryUsage(64.0 * GiB, 10.0 * GiB, 54.0 * GiB)}
    # the device's memory is both tiles' modules
    t = b.telemetry(inv.gpus[0], Tally())
    assert t.memory == MemoryUsage(128.0 * GiB, 50.0 * GiB, 78.0 * GiB)


def test_tile_busy_from_level_zero_engine_groups(tmp_path: Path) -> None:
    """zesEngineGetActivity of each subdevice's compute-all group, differenced: tile 0 busy
    1.5 s of 2 s, tile 1 idle; the media group's activity is not compute; the first read and a
    reading without time passing give nothing."""
    max1550_host(str(tmp_path))
    zes = _zes()
    b = _backend(tmp_path, zes)
    migs = b.inventory(None).migs
    assert [b.partition_utilization(m, Tally()) for m in migs] == [None, None]
    for e in zes.devices[0].engines:
        e.timestamp_us = 2_000_000
        if e.type == ZES_ENGINE_GROUP_COMPUTE_ALL and e.subdevice == 0:
            e.active_us = 1_500_000
        if e.type == ZES_ENGINE_GROUP_MEDIA_ALL:
            e.active_us = 2_000_000  # a busy video engine is not a busy tile
    assert [b.partition_utilization(m, Tally()) for m in migs] == [0.75, 0.0]
    assert [b.partition_utilization(m, Tally()) for m in migs] == [None, None]  # no time
    # without Level Zero there is no per-tile figure
    assert _backend(tmp_path).partition_utilization(migs[0], Tally()) is None


def test_without_level_zero_a_tile_has_no_memory_reading(tmp_path: Path) -> None:
    max1550_host(str(tmp_path))
    b = _backend(tmp_path)
    assert [b.partition_memory(m, Tally()) for m in b.inventory(None).migs] == [None, None]


def test_the_sampler_serves_tiles_as_partitions(tmp_path: Path) -> None:
    max1550_host(str(tmp_path))
    specs = [s for s in REGISTRY if s.name != "attribution"]
    zes = _zes()
    backend = IntelBackend(str(tmp_path), str(tmp_path / "proc"), sysman=lambda: (zes, ""))
    sampler = Sampler(backend, ExporterOptions(node=NODE, sysfs_root=str(tmp_path)), specs,
                      threaded=False)
    try:
        body = sampler.cycle().body(False, False)
        for e in zes.devices[0].engines:  # 10 s on: tile 1's compute engines busy 4 s
            e.timestamp_us = 10_000_000
            e.active_us = 4_000_000 if (e.type, e.subdevice) == (
                ZES_ENGINE_GROUP_COMPUTE_ALL, 1) else 0
        second = sampler.cycle().body(False, False)
    finally:
        sampler.close()
    assert values(second, "gpu_partition_utilization_ratio", mig_uuid=TILE1, profile="tile",
                  vendor="intel") == [0.4]
    assert values(second, "gpu_partition_utilization_ratio", mig_uuid=TILE0) == [0.0]
    assert values(body, "gpu_info", uuid=MAX1550_BDF, mig_mode="enabled", vendor="intel") == [1]
    for tile, gi in ((TILE0, "0"), (TILE1, "1")):
        assert values(body, "gpu_mig_info", mig_uuid=tile, gpu_instance_id=gi,
                      compute_instance_id=gi, profile="tile", slices="1",
                      parent_slices="2") == [1]
        assert values(body, "gpu_mig_memory_total_bytes", mig_uuid=tile) == [64 * GiB]
    assert values(body, "gpu_mig_memory_used_bytes", mig_uuid=TILE0) == [40 * GiB]
    assert values(body, "gpu_partition_utilization_ratio") == []  # from the second cycle
    assert values(body, "gpu_exporter_collector_success", collector="mig") == [1]


@pytest.mark.parametrize(("text", "parsed"), [
    # the plugin's own examples (gpu_plugin_resource_manager.go, fractional.md)
    ("card0:gt0+gt1,card1:gt0|card2:gt1+gt2||card0:gt3",
     ((("card0", 0), ("card0", 1), ("card1", 0)), (("card2", 1), ("card2", 2)),
      (("card0", 3),))),
    ("card0:gt1", ((("card0", 1),),)),
    # an entry the plugin rejects gives its container no tiles; the others keep theirs
    ("card0|card1:gt0", ((), (("card1", 0),))),
    ("card0:tile0", ((),)),
    ("", ()), (None, ()), ("|" * 5, ()), ("card0:gt0" + "+gt1" * 2000, ()),
])
def test_gas_container_tiles(text: object, parsed: tuple[Any, ...]) -> None:
    assert parse_tiles(text) == parsed


def _pod(ns: str, name: str, uid: str, cid: str, tiles: str | None,
         containers: tuple[str, ...] = ("app",)) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": ns, "uid": uid,
                            "labels": {"team": ns}}
    if tiles is not None:
        meta["annotations"] = {"gas-container-cards": "card0", "gas-container-tiles": tiles}
    return {"metadata": meta,
            "spec": {"nodeName": NODE, "containers": [{"name": c} for c in containers]},
            "status": {"phase": "Running", "containerStatuses": [
                {"name": c, "containerID": f"containerd://{cid * 64}"} for c in containers]}}


@pytest.fixture
def sockdir() -> Iterator[Path]:
    path = tempfile.mkdtemp(prefix="gl-tiles-", dir="/tmp")
    yield Path(path)
    shutil.rmtree(path, ignore_errors=True)


def family(sink: SampleSink, name: str) -> dict[Labels, float]:
    return {labels: value for labels, value, _ in sink.samples.get(name, [])}


def test_two_pods_on_the_two_tiles(sockdir: Path, tmp_path: Path) -> None:
    """-shared-dev-num 3: the plugin hands card0-0, card0-1, card0-2; GAS put one pod on each
    tile; a third pod holds a share of card0 without an annotation: the whole card,
    time-sliced. lammps-0's process (xe fdinfo names the device, not the tile) counts on its
    tile, its share of the device's engines doubled to a share of the tile."""
    max1550_host(str(tmp_path))
    proc = Proc(tmp_path / "proc")
    pods = [_pod("hpc", "lammps-0", "50000000-0000-4000-8000-000000000001", "a", "card0:gt0"),
            _pod("ml", "finetune-1", "50000000-0000-4000-8000-000000000002", "b",
                 "card0:gt1", ("sidecar", "trainer")),
            _pod("misc", "old-style", "50000000-0000-4000-8000-000000000003", "c", None)]
    allocations = [
        PodAllocation("hpc", "lammps-0", [ContainerAllocation("app", [(I915, ["card0-0"])])]),
        # the sidecar holds no GPU: the annotation's first entry is the trainer's
        PodAllocation("ml", "finetune-1", [ContainerAllocation("trainer", [(I915, ["card0-1"])])]),
        PodAllocation("misc", "old-style", [ContainerAllocation("app", [(I915, ["card0-2"])])])]
    allocatable = [(I915, f"card0-{i}") for i in range(3)]

    def lammps(ccs: int, stamp: int) -> None:
        proc.open(201, 4, xe(7, rcs=0, ccs=ccs, stamp=stamp).replace(ARC, MAX1550_BDF))
        (proc.root / "201" / "cgroup").write_text(
            f"0::/kubepods/burstable/pod{pods[0]['metadata']['uid']}/{'a' * 64}\n")

    lammps(0, 1_000_000)
    kubelet = FakeKubelet(str(sockdir / "kubelet.sock"), lambda: allocations,
                          lambda: allocatable)
    kubelet.start()
    server = FakeApiServer(pods)
    server.start()
    opts = ExporterOptions(node=NODE, pod_resources_socket=str(sockdir / "kubelet.sock"),
                           proc_root=str(proc.root), sysfs_root=str(tmp_path),
                           kubeconfig=server.kubeconfig(str(tmp_path / "kubeconfig")),
                           kubernetes=True, pod_label_allowlist=("team",), rpc_timeout=2.0)
    clock = Clock()
    backend = IntelBackend(str(tmp_path), str(proc.root), clock=clock,
                           sysman=lambda: (None, "absent"))
    backend.open()
    inv = backend.inventory(None)
    backends = Backends([backend])
    stage = ProcessStage(backends)
    collector = AttributionCollector(opts)
    try:
        watch = collector.pod_watch
        assert watch is not None
        wait_until(lambda: len(watch.pods) == len(pods), "the pod watch's first list")
        for second in (False, True):
            if second:  # 1e6 of 4 x 1e6 ccs cycles: a quarter of the device's engines
                clock.now += 1.0
                lammps(1_000_000, 2_000_000)
            ctx = CycleContext(options=opts, now=time.time(), gpus=list(inv.gpus),
                               migs=list(inv.migs), static=dict(inv.static), backend=backends)
            stage.fill(ctx)
            sink = SampleSink()
            collector.collect(ctx, sink)
    finally:
        collector.close()
        server.stop()
        kubelet.stop()
    assert family(sink, "gpu_container_allocation") == {
        (NODE, "hpc", "lammps-0", "app", MAX1550_BDF, TILE0, I915, "mig", "1", "", ""): 1,
        (NODE, "ml", "finetune-1", "trainer", MAX1550_BDF, TILE1, I915, "mig", "1", "", ""): 1,
        (NODE, "misc", "old-style", "app", MAX1550_BDF, "", I915, "time-slicing", "3", "",
         ""): 1}
    assert not any(collector.unknown_ids.by_resource.values())
    lammps_tile = (NODE, "hpc", "lammps-0", "app", MAX1550_BDF, TILE0)
    assert family(sink, "gpu_container_memory_used_bytes")[lammps_tile] == 23992 * 1024
    assert family(sink, "gpu_container_processes")[lammps_tile] == 1
    assert family(sink, "gpu_container_sm_utilization_ratio")[lammps_tile] == \
        pytest.approx(0.5)
    # nothing left on the whole device for lammps-0
    assert (NODE, "hpc", "lammps-0", "app", MAX1550_BDF, "") not in family(
        sink, "gpu_container_memory_used_bytes")


def test_a_tile_two_containers_hold_is_time_sliced(tmp_path: Path) -> None:
    max1550_host(str(tmp_path))
    inv = _backend(tmp_path).inventory(None)
    index = DeviceIndex(list(inv.gpus), list(inv.migs), dict(inv.static))
    tiles = {(m.parent.uuid, m.compute_instance_id): m.uuid for m in inv.migs}
    infos = {}
    for i, (ns, name, ann) in enumerate((("a", "p1", "card0:gt0"), ("b", "p2", "card0:gt0"),
                                        ("c", "p3", "card0:gt0+gt1"))):
        info = pod_info(_pod(ns, name, f"60000000-0000-4000-8000-00000000000{i}", "d", ann),
                        frozenset())
        assert info is not None
        infos[(ns, name)] = info
    allocs = [Allocation(ns, name, "app", I915, (f"card0-{i}",))
              for i, (ns, name) in enumerate(infos)]
    rows = intel_plugin_units(allocs, {"card0": MAX1550_BDF}, index, {"card0": 3}, {},
                              UnknownIds(), tiles, infos)
    got = sorted((r.holder.pod, r.device[1], r.mode) for r in rows)
    assert got == [("p1", TILE0, SharingMode.TIME_SLICING),
                   ("p2", TILE0, SharingMode.TIME_SLICING),
                   ("p3", TILE0, SharingMode.TIME_SLICING), ("p3", TILE1, SharingMode.MIG)]


def test_a_tile_is_priced_as_half_the_max1550(tmp_path: Path) -> None:
    """The scenario's node live (its exporter over the simulated sysfs tree and Level Zero,
    the pods' gas-container-tiles in the fake API server), scraped hourly for 96 hours at
    2.50/h: lammps-0 holds tile 0 all 96 hours = 96 x 2.50 / 2 = 120.00; finetune-1 holds
    tile 1 in scenario hours 0-47, i.e. the samples at 01:00 .. 47:00 (a sample is priced for
    the hour it ends, and at 48:00 the pod is gone) = 47 x 1.25 = 58.75; tile 1's other 49
    hours are idle = 61.25; together the GPU's 96 x 2.50 = 240.00."""
    t0 = int(datetime(2026, 10, 1, tzinfo=UTC).timestamp())
    om = tmp_path / "tiles.om"
    history = OpenMetricsHistory(om, HISTORY_FAMILIES)
    with SimCluster([], start=t0, workdir=tmp_path / "sim", window=(0.0, 97 * 3600.0),
                    vendors=[ROOT / "gpusim/scenarios/vendors/intel-max-tiles.yaml"]) as cluster:
        for hour in range(1, 97):
            for _, rendering in cluster.step(t0 + hour * 3600):
                history.add(rendering.samples, t0 + hour * 3600)
    history.close()
    cm_path = tmp_path / "cm.yaml"
    cm_path.write_text("currency: EUR\npricing:\n  default: {hourly: 1.00}\n  gpus:\n"
                       "    - {pattern: \"Intel(R) Data Center GPU Max*\", vendor: intel,"
                       " hourly: 2.50}\n")
    period = resolve(None, "2026-10-01T00:00", "2026-10-05T00:00")
    con = ingested(om, period, tmp_path / "m.duckdb")
    result = price_period(con, load_cost_model(cm_path), period.start, period.end)
    by_pod = dict(con.execute("SELECT pod, sum(cost) FROM charges WHERE pod <> '' "
                              "GROUP BY pod").fetchall())
    idle = con.execute("SELECT sum(cost) FROM charges WHERE team = 'idle'").fetchone()
    con.close()
    assert by_pod == {"lammps-0": Decimal("120.00"), "finetune-1": Decimal("58.75")}
    assert idle == (Decimal("61.25"),)
    assert result.total == result.fleet_cost == Decimal("240.00")


def test_pcie_throughput_from_level_zero_counters(tmp_path: Path) -> None:
    """zesDevicePciGetStats: rx/tx bytes and a µs timestamp, differenced by the throughput
    collector; no series on the first cycle or where the device has no bandwidth counters."""
    max1550_host(str(tmp_path))
    zes = _zes()
    dev = zes.devices[0]
    dev.pci_rx, dev.pci_tx, dev.timestamp_us = 10 * GiB, 4 * GiB, 1_000_000
    specs = [s for s in REGISTRY if s.name == "throughput"]
    backend = IntelBackend(str(tmp_path), str(tmp_path / "proc"), sysman=lambda: (zes, ""))
    sampler = Sampler(backend, ExporterOptions(node=NODE, sysfs_root=str(tmp_path)), specs,
                      threaded=False)
    pcie = "gpu_pcie_throughput_bytes_per_second"
    try:
        assert values(sampler.cycle().body(False, False), pcie) == []
        # 2 s on the device's clock: 6 GiB received, 1 GiB sent
        dev.pci_rx, dev.pci_tx, dev.timestamp_us = 16 * GiB, 5 * GiB, 3_000_000
        body = sampler.cycle().body(False, False)
        dev.pci_rx = None  # counters gone: nothing, not a failure
        gone = sampler.cycle().body(False, False)
    finally:
        sampler.close()
    assert values(body, pcie, uuid=MAX1550_BDF, direction="rx", vendor="intel") == [3 * GiB]
    assert values(body, pcie, uuid=MAX1550_BDF, direction="tx") == [GiB / 2]
    assert values(body, "gpu_link_throughput_bytes_per_second") == []  # no fabric ports
    assert values(gone, pcie) == []
    assert values(gone, "gpu_exporter_collector_success", collector="throughput") == [1]


def test_a_tile_the_gpu_lacks_leaves_the_card_whole(tmp_path: Path) -> None:
    """An annotation naming a GT the card does not have (or another card) cannot invent a
    unit: the container holds its card as without the annotation."""
    max1550_host(str(tmp_path))
    inv = _backend(tmp_path).inventory(None)
    index = DeviceIndex(list(inv.gpus), list(inv.migs), dict(inv.static))
    tiles = {(m.parent.uuid, m.compute_instance_id): m.uuid for m in inv.migs}
    info = pod_info(_pod("a", "p", "70000000-0000-4000-8000-000000000000", "e",
                         "card0:gt7,card3:gt0"), frozenset())
    assert info is not None
    rows = intel_plugin_units([Allocation("a", "p", "app", I915, ("card0-0",))],
                              {"card0": MAX1550_BDF}, index, {"card0": 2}, {}, UnknownIds(),
                              tiles, {("a", "p"): info})
    assert [(r.device, r.mode) for r in rows] == [((MAX1550_BDF, ""), SharingMode.TIME_SLICING)]


def test_tile_energy_from_i915_gt_hwmon_and_level_zero_power_domains(tmp_path: Path) -> None:
    """i915's gt-level hwmons (`i915_gt<N>`, µJ) are the tiles' energy; on xe, which has no
    per-tile file, Level Zero's power domains on a subdevice; the device's own domain and
    the card's hwmon stay the GPU's energy."""
    i915 = tmp_path / "i915"
    max1550_host(str(i915), "i915")  # the simulator gives each GT a third of the card
    b = _backend(i915)
    t = b.telemetry(b.inventory(None).gpus[0], Tally())
    assert t.energy_joules == 9876.0
    assert t.partition_energy_joules == ((TILE0, 3292.0), (TILE1, 3292.0))

    xe_root = tmp_path / "xe"
    max1550_host(str(xe_root))
    zes = _zes()
    zes.devices[0].power = [SimZesPower(None, 9_000_000_000), SimZesPower(0, 4_000_000_000),
                            SimZesPower(1, 3_500_000_000)]
    b = _backend(xe_root, zes)
    t = b.telemetry(b.inventory(None).gpus[0], Tally())
    assert t.energy_joules == 9876.0  # hwmon's card counter, not Sysman's device domain
    assert t.partition_energy_joules == ((TILE0, 4000.0), (TILE1, 3500.0))
    b = _backend(xe_root)  # xe without Level Zero: no per-tile energy
    assert b.telemetry(b.inventory(None).gpus[0], Tally()).partition_energy_joules == ()


def test_the_sampler_serves_tile_energy_in_its_own_family(tmp_path: Path) -> None:
    max1550_host(str(tmp_path), "i915")
    specs = [s for s in REGISTRY if s.name == "device"]
    sampler = Sampler(IntelBackend(str(tmp_path), str(tmp_path / "proc"),
                                   sysman=lambda: (None, "absent")),
                      ExporterOptions(node=NODE, sysfs_root=str(tmp_path)), specs,
                      threaded=False)
    try:
        body = sampler.cycle().body(False, False)
    finally:
        sampler.close()
    part = "gpu_partition_energy_joules_total"
    assert values(body, part, mig_uuid=TILE0, gpu_instance_id="0", profile="tile",
                  vendor="intel") == [3292.0]
    assert values(body, part, mig_uuid=TILE1) == [3292.0]
    assert values(body, "gpu_energy_joules_total") == [9876.0]  # one series: the card


def _metered_energy(tmp_path: Path, with_tiles: bool) -> list[tuple[str, float]]:
    """An hour of a Max 1550: the card's counter +7.2 MJ, each tile's +3 MJ (when written),
    ingested from OpenMetrics as `gpu-ledger meter` reads it."""
    t0 = int(datetime(2026, 10, 5, tzinfo=UTC).timestamp())
    dev = f'node="{NODE}",gpu="0",uuid="{MAX1550_BDF}",model="Intel PVC",vendor="intel"'
    lines = [f"gpu_up{{{dev}}} 1 {t0 + t}" for t in range(60, 3601, 60)]
    lines += [f"gpu_energy_joules_total{{{dev}}} {j} {t0 + t}"
              for t, j in ((60, 1e6), (3600, 8.2e6))]
    if with_tiles:
        for tile in (0, 1):
            part = (f'{dev},mig_uuid="{MAX1550_BDF}/tile{tile}",gpu_instance_id="{tile}",'
                    f'compute_instance_id="{tile}",profile="tile"')
            lines += [f"gpu_partition_energy_joules_total{{{part}}} {j} {t0 + t}"
                      for t, j in ((60, 0.5e6), (3600, 3.5e6))]
    f = tmp_path / f"energy-{with_tiles}.om"
    f.write_text("\n".join(sorted(lines, key=lambda s: int(s.rsplit(" ", 1)[1])))
                 + "\n# EOF\n")
    period = resolve(None, "2026-10-05T00:00", "2026-10-05T01:00")
    src = OpenMetricsSource(str(f), period, DEFAULT_SELECTOR)
    con = connect(tmp_path / f"m-{with_tiles}.duckdb")
    try:
        ingest(con, src, period)
        return con.execute("SELECT uuid, energy_joules FROM device_hours ORDER BY uuid"
                           ).fetchall()
    finally:
        src.close()
        con.close()


def test_tile_energy_is_not_metered_twice(tmp_path: Path) -> None:
    """The billed energy is the card's counter alone: the tiles' series change nothing, and
    no recording rule or metering signal reads the tile family."""
    assert _metered_energy(tmp_path, True) == _metered_energy(tmp_path, False) == [
        (MAX1550_BDF, 7.2e6)]
    rules = "".join(p.read_text() for p in (ROOT / "alerts").glob("*.yml"))
    assert "gpu_partition_energy" not in rules and "__name__" not in rules
    from metering.signals import FAMILIES as METERED
    assert "gpu_partition_energy_joules_total" not in METERED


def test_xe_link_throughput_from_level_zero_fabric_ports(tmp_path: Path) -> None:
    """zesFabricPortGetThroughput per port (rx/tx bytes, a µs timestamp of its own),
    differenced by the throughput collector and summed over the ports as link_type "xelink";
    nothing on the first cycle, and none where the loader lacks the fabric calls."""
    max1550_host(str(tmp_path))
    zes = _zes()
    ports = [SimZesFabricPort(0, 0, 1_000_000), SimZesFabricPort(0, 0, 1_500_000)]
    zes.devices[0].fabric = ports
    specs = [s for s in REGISTRY if s.name == "throughput"]
    backend = IntelBackend(str(tmp_path), str(tmp_path / "proc"), sysman=lambda: (zes, ""))
    sampler = Sampler(backend, ExporterOptions(node=NODE, sysfs_root=str(tmp_path)), specs,
                      threaded=False)
    link = "gpu_link_throughput_bytes_per_second"
    try:
        assert values(sampler.cycle().body(False, False), link) == []
        # port 0: 2 s, 8 GiB in, 2 GiB out; port 1: 4 s, 4 GiB in, 8 GiB out
        ports[0].rx, ports[0].tx, ports[0].timestamp_us = 8 * GiB, 2 * GiB, 3_000_000
        ports[1].rx, ports[1].tx, ports[1].timestamp_us = 4 * GiB, 8 * GiB, 5_500_000
        body = sampler.cycle().body(False, False)
        zes.fabric_calls = False  # an older loader: no links, not a failure
        gone = sampler.cycle().body(False, False)
    finally:
        sampler.close()
    assert values(body, link, uuid=MAX1550_BDF, link_type="xelink", direction="rx",
                  vendor="intel") == [4 * GiB + GiB]
    assert values(body, link, uuid=MAX1550_BDF, link_type="xelink", direction="tx") == \
        [GiB + 2 * GiB]
    assert values(gone, link) == []
    assert values(gone, "gpu_exporter_collector_success", collector="throughput") == [1]


def test_a_loader_without_the_fabric_symbols_gives_no_links() -> None:
    """The real path: pyzes's getFunctionPointerList is getattr on the loaded CDLL, which
    raises AttributeError for a symbol the library does not export (here libc)."""
    import ctypes

    from exporter.device.intel_levelzero import _loader_function

    class Zes:
        @staticmethod
        def getFunctionPointerList(name: str) -> Any:
            return getattr(ctypes.CDLL(None), name)

    assert _loader_function(Zes(), "zesDeviceEnumFabricPorts", []) is None
    getpid = _loader_function(Zes(), "getpid", [])  # a symbol that exists: typed as C
    assert getpid is not None and getpid.restype is ctypes.c_int32 and getpid() > 0
