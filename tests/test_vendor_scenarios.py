"""The AMD and Intel scenarios of issue 25 item 8 (gpusim/scenarios/vendors) run live in the
simulated cluster: an MI300X in CPX/NPS4 with pods on partitions, an MxGPU host with VFs lent
to VMs, an Intel Max with SR-IOV VFs handed out by the Intel GPU plugin, an Intel Max 1550
whose two tiles GPU Aware Scheduling gave to two pods (`gas-container-tiles` on the pods in the
fake API server), an iGPU GVT-g host with virt-launcher pods on mdevs. Each node is the real
exporter (Sampler over AmdBackend on the simulated amdsmi, or IntelBackend on a sysfs tree in
the kernel's layout), attributing through
a real PodResources gRPC server with `amd.com/*`, `gpu.intel.com/*` and mdev IDs, and the
pods' processes through amdsmi's process list or DRM fdinfo and their cgroups. Its scrapes
go through the real ingest path, are priced with the packaged cost model and reported: every
holder pays its fraction, computed by hand below."""

from __future__ import annotations

import time
import urllib.request
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pytest
from pytest import approx

from exporter.errors import ConfigError
from exporter.history import OpenMetricsHistory
from exporter.web import start_server
from gpu_ledger.demo import HISTORY_FAMILIES
from gpusim.cluster import SimCluster
from gpusim.vendor_node import XE_TIMESTAMP_HZ
from gpusim.vendor_scenario import load_vendor_scenario
from metering.costmodel import load_cost_model
from metering.period import Month, resolve
from metering.pricing import price_period
from metering.report import cli as report_cli
from metering.report.waste import Kind, Settings, mig_fraction, recommend
from tests.omledger import ingested
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parent.parent
# Live utilisation is a ratio of two integer counter deltas read >= 0.2 s apart: each counter is
# truncated to a whole cycle, so a share is exact only to ~2 cycles in 0.2 s of the GPU clock.
# (Comparing exactly made the test wait for a read pair whose truncations happened to cancel.)
CYCLE_ROUNDING = 2 / (0.2 * XE_TIMESTAMP_HZ)
VENDORS = ROOT / "gpusim" / "scenarios" / "vendors"
SCENARIOS = sorted(VENDORS.glob("*.yaml"))
T0 = int(datetime(2026, 10, 1, tzinfo=UTC).timestamp())
D = Decimal
MI300X, MAX1550, UHD = D("3.20"), D("1.50"), D("0.05")  # cost-model.yaml


def test_the_five_scenarios_load() -> None:
    names = {p.name for p in SCENARIOS}
    assert names == {"mi300x-cpx.yaml", "mxgpu-host.yaml", "intel-max-sriov.yaml",
                     "intel-igpu-gvtg.yaml", "intel-max-tiles.yaml"}
    sc = load_vendor_scenario(VENDORS / "mi300x-cpx.yaml")
    assert (sc.gpus[0].profile, sc.gpus[0].partitions, sc.gpus[0].vendor) == (
        "cpx_nps4", 8, "amd")
    tiles = load_vendor_scenario(VENDORS / "intel-max-tiles.yaml")
    assert (tiles.gpus[0].profile, tiles.gpus[0].partitions, tiles.gpus[0].vendor) == (
        "tile", 2, "intel")


@pytest.mark.parametrize(("gpus", "key"), [
    ("  - {model: X, vendor: amd, memory: 1GiB, partitions: {profile: cpx_nps3, count: 8}}\n",
     "gpus[0].partitions.profile"),
    ("  - {model: X, vendor: amd, memory: 1GiB, partitions: {profile: cpx_nps4, count: 4}}\n",
     "gpus[0].partitions.count"),
    ("  - {model: X, vendor: intel, memory: 1GiB, mdevs: [i915-GVTg_V5_3]}\n",
     "gpus[0].mdevs[0]"),
    ("  - {model: X, vendor: nvidia, memory: 1GiB}\n", "gpus[0].vendor"),
    ("  - {model: X, vendor: amd, memory: 1GiB, shared: 2}\n", "gpus[0].shared"),
    ("  - {model: X, vendor: amd, memory: 1GiB, partitions: {profile: tile, count: 2}}\n",
     "gpus[0].partitions.profile"),
    ("  - {model: X, vendor: intel, memory: 1GiB, partitions: {profile: cpx_nps4, count: 8}}\n",
     "gpus[0].partitions.profile"),
    ("  - {model: X, vendor: intel, memory: 1GiB, partitions: {profile: tile, count: 1}}\n",
     "gpus[0].partitions.count"),
    ("  - {model: X, vendor: intel, memory: 1GiB}\npods:\n" + "".join(
        f"  - {{namespace: a, name: p{n}, containers: [{{name: c, resource: gpu.intel.com/xe,"
        f" unit: {{gpu: 0}}}}]}}\n" for n in range(2)), "at most shared: 1 pods"),
    ("  - {model: X, vendor: amd, memory: 1GiB}\n  - {model: Y, vendor: intel, memory: 1GiB}\n",
     "gpus"),
])
def test_a_bad_scenario_is_one_line(tmp_path: Path, gpus: str, key: str) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("node: n1\ngpus:\n" + gpus)
    with pytest.raises(ConfigError) as e:
        load_vendor_scenario(bad)
    assert str(e.value).count("\n") == 0 and key in str(e.value), str(e.value)


def _history(tmp_path: Path, hours: int, step: int, scenarios: list[Path] = SCENARIOS
             ) -> Path:
    """The nodes' exporters sampled every `step` seconds for `hours`, as the demo writes its
    history (the simulated clock stepped through the real exporter)."""
    om = tmp_path / "vendors.om"
    history = OpenMetricsHistory(om, HISTORY_FAMILIES)
    with SimCluster([], start=T0, workdir=tmp_path / "sim", vendors=scenarios,
                    window=(0.0, hours * 3600.0 + step)) as cluster:
        for i in range(1, hours * 3600 // step + 1):
            for _, rendering in cluster.step(T0 + i * step):
                history.add(rendering.samples, T0 + i * step)
    history.close()
    return om


def test_vendor_nodes_metered_priced_and_reported(tmp_path: Path) -> None:
    # 2026-10-01 00:00 .. 10-04 18:00: enough busy hours (72) for a rightsizing, and every
    # holder of the scenarios (the shortest, desk-bob, runs hours 0-96) holds all of it
    hours = 90
    om = _history(tmp_path, hours, 3600)
    period = resolve(None, "2026-10-01T00:00", "2026-10-04T18:00")
    con = ingested(om, period, tmp_path / "m.duckdb")
    cm = load_cost_model(None)  # the packaged cost-model.yaml
    result = price_period(con, cm, period.start, period.end)
    assert result.total == result.fleet_cost and result.default_priced_models == ()
    pods = dict(con.execute("SELECT pod, sum(cost) FROM charges WHERE pod <> '' "
                            "GROUP BY pod").fetchall())
    H = hours
    assert pods == {
        # CPX/NPS4 partitions (amd.com/cpx_nps4: partition 0 by PCI address, the others by
        # amdgpu_xcp_<n>): 1/8 of an MI300X each; the notebook runs hours 0-240.
        "vllm-small-0": H * MI300X / 8, "vllm-small-1": H * MI300X / 8,
        "notebook-ana": H * MI300X / 8,
        "embedder-0": H * MI300X,  # amd.com/gpu, a whole MI300X
        # MxGPU (amd.com/gpu_vf by IOMMU group): a VF of 4; vm-ci runs hours 0-120.
        "virt-launcher-vm-render": H * MI300X / 4, "virt-launcher-vm-ci": H * MI300X / 4,
        "virt-launcher-vm-train": H * MI300X / 4,
        # Intel Max SR-IOV (gpu.intel.com/xe, the VF's card): a VF of 4.
        "solver-0": H * MAX1550 / 4, "render-0": H * MAX1550 / 4,
        # The second Max, its card registered twice (-shared-dev-num 2): half each.
        "tiles-0": H * MAX1550 / 2, "translate-0": H * MAX1550 / 2,
        # GVT-g (mdev UUIDs): V5_4 = 1/4, V5_8 = 1/8.
        "virt-launcher-desk-alice": H * UHD / 4, "virt-launcher-desk-bob": H * UHD / 8,
        # Max 1550 tiles (the card's ID card0-<k>, the tile from gas-container-tiles): 1 of 2.
        # finetune-1 runs scenario hours 0-48: the samples at 01:00 .. 47:00 (a sample is
        # the hour it ends; at 48:00 the node is in hour 48 and the pod gone) = 47 hours.
        "lammps-0": H * MAX1550 / 2, "finetune-1": 47 * MAX1550 / 2,
    }
    idle = dict(con.execute("SELECT model, sum(cost) FROM charges WHERE team = 'idle' "
                            "GROUP BY model").fetchall())
    # MI300X: 5 of 8 partitions; MxGPU GPU 0: VFs 2 and 3; GPU 1: VFs 1-3. Max 1550: VFs 1
    # and 3 of 4 on the SR-IOV node; tile 1 of the tiles node once finetune-1 is gone.
    assert idle == {"AMD Instinct MI300X": H * MI300X * (D(5) / 8 + D(2) / 4 + D(3) / 4),
                    "Intel(R) Data Center GPU Max 1550":
                        H * MAX1550 / 2 + (H - 47) * MAX1550 / 2,
                    "Intel(R) UHD Graphics 630": H * UHD * (1 - D(1) / 4 - D(1) / 8)}
    # Usage measured by the exporter, not written: amdsmi's per-process GFX time and VRAM.
    used = dict(con.execute(
        "SELECT pod, round(max(memory_byte_seconds) / 3600 / 2^30, 3) FROM allocation_hours "
        "WHERE pod IN ('embedder-0', 'vllm-small-0') GROUP BY pod").fetchall())
    assert used == {"embedder-0": 18.0, "vllm-small-0": 16.0}
    # ... and xe's fdinfo: the shared Max's split between its two pods (memory, ccs cycles)
    split = dict(con.execute(
        "SELECT pod, (round(sum(memory_byte_seconds) / sum(allocated_seconds) / 2^30, 3), "
        "round(sum(sm_seconds) / sum(allocated_seconds), 3)) FROM allocation_hours "
        "WHERE pod IN ('tiles-0', 'translate-0') GROUP BY pod").fetchall())
    assert split == {"tiles-0": (24.0, 0.3), "translate-0": (40.0, 0.5)}
    # ... and a tile's: its pod's xe fdinfo (device cycles, rescaled to the tile) and memory
    tile = dict(con.execute(
        "SELECT pod, (round(sum(memory_byte_seconds) / sum(allocated_seconds) / 2^30, 3), "
        "round(sum(sm_seconds) / sum(allocated_seconds), 3)) FROM allocation_hours "
        "WHERE pod IN ('lammps-0', 'finetune-1') GROUP BY pod").fetchall())
    assert tile == {"lammps-0": (40.0, 0.6), "finetune-1": (58.0, 0.9)}
    month = Month.parse("2026-10")
    recs = recommend(con, month.start, month.end, mig_fraction(cm), Settings())
    con.close()
    rightsized = [(r.owner_name, r.kind, r.proposed, r.saving) for r in recs
                  if r.kind is not Kind.IDLE]
    assert rightsized == [("embedder", Kind.TO_PARTITION, "AMD CPX partition (1 of 8)",
                           H * MI300X * 7 / 8)]
    out = tmp_path / "report"
    assert report_cli.main(["--month", "2026-10", "--db", str(tmp_path / "m.duckdb"),
                            "--out", str(out), "--format", "md,csv"]) == 0
    md = next(out.glob("*.md")).read_text()
    for text in ("AMD Instinct MI300X", "Intel(R) UHD Graphics 630",
                 "Intel(R) Data Center GPU Max 1550", "AMD CPX partition (1 of 8)"):
        assert text in md, text


def test_tiles_node_as_gpu_aware_scheduling_and_xe_leave_it(tmp_path: Path) -> None:
    """The tiles node's inputs to the exporter: GAS's annotation on the pods the API server
    serves (one entry per container holding the plugin's resource, `card<N>:gt<i>`), the
    Intel GPU plugin's two shares of card0, and xe's sysfs with the Max 1550's two tiles."""
    with SimCluster([], start=T0, workdir=tmp_path, window=(0.0, 3600.0),
                    vendors=[VENDORS / "intel-max-tiles.yaml"]) as cluster:
        node = cluster.vendor_nodes[0]
        written = {p["metadata"]["name"]: p["metadata"].get("annotations")
                   for p in node.vendor.pod_objects(0.0, 3600.0)}
        bound = str(T0 * 10**9)  # gas-ts: both pods bound at the scenario's start
        assert written == {
            "lammps-0": {"gas-ts": bound, "gas-container-cards": "card0",
                         "gas-container-tiles": "card0:gt0"},
            "finetune-1": {"gas-ts": bound, "gas-container-cards": "card0",
                           "gas-container-tiles": "card0:gt1"}}
        watch = next(w for c in node.sampler.collectors
                     if (w := getattr(c, "pod_watch", None)) is not None)
        assert {pod: info.intel_tiles for (_, pod), info in watch.by_name.items()} == {
            "lammps-0": ((("card0", 0),),), "finetune-1": ((("card0", 1),),)}
        assert node.vendor.device_ids() == [("gpu.intel.com/xe", "card0-0"),
                                            ("gpu.intel.com/xe", "card0-1")]
        pf = tmp_path / "gpu-intel-max-02" / "sys" / "bus" / "pci" / "devices" / "0000:29:00.0"
        assert sorted(str(p.relative_to(pf)) for p in pf.glob("tile*/gt*")) == [
            "tile0/gt0", "tile1/gt1"]


SHORT = """
node: short-1
gpus:
  - {model: AMD Instinct MI300X, vendor: amd, memory: 192GiB,
     partitions: {profile: dpx_nps2, count: 2}}
pods:
  - namespace: ml
    name: early
    labels: {team: a}
    hours: [0, 1]
    containers:
      - {name: c, resource: amd.com/dpx_nps2, unit: {gpu: 0, partition: 1}, memory: 1GiB}
  - namespace: ml
    name: late
    labels: {team: b}
    hours: [1, 3]
    containers:
      - {name: c, resource: amd.com/dpx_nps2, unit: {gpu: 0, partition: 1}, memory: 1GiB}
"""


def test_short_window_bill_follows_the_holders(tmp_path: Path) -> None:
    """Three hours, a sample every 10 minutes, on an MI300X in DPX/NPS2 (2 partitions, 3.20/h):
    `early` holds partition 1 in hour 0, `late` in hours 1-2. Metering counts a sample for the
    hour it ends (the sample at 01:00 is hour 0's), and the node at 01:00 is already in hour 1
    of its scenario, so by hand, in 10-minute samples of a partition:
      early: 00:10 .. 00:50                      =  5
      late:  01:00, 01:10 .. 02:00, 02:10 .. 02:50 = 1 + 6 + 5 = 12
      partition 1 idle: 03:00 (no holder)        =  1
      partition 0 idle: all 18."""
    path = tmp_path / "short.yaml"
    path.write_text(SHORT)
    om = _history(tmp_path, 3, 600, [path])
    period = resolve(None, "2026-10-01T00:00", "2026-10-01T03:00")
    con = ingested(om, period, tmp_path / "s.duckdb")
    price_period(con, load_cost_model(None), period.start, period.end)
    bills = dict(con.execute("SELECT team, sum(cost) FROM charges GROUP BY team").fetchall())
    con.close()
    sample = MI300X / 2 / 6  # a DPX partition for 10 minutes
    want = {"a": 5 * sample, "b": 12 * sample, "idle": (1 + 18) * sample}
    # charges are kept to the micro-unit, the rounding put where the total stays exact
    assert bills.keys() == want.keys() and sum(bills.values()) == 3 * MI300X
    assert all(abs(bills[t] - want[t]) <= D("0.000002") for t in want), bills


def test_vendor_exporters_serve_attributed_scrapes(tmp_path: Path) -> None:
    """Live, on the real clock: each node's /metrics attributes its partitions, VFs and mdevs
    to the pods holding them, with the unit's fraction where it is a grant."""
    with SimCluster([], start=time.time(), workdir=tmp_path, live=True, interval=0.5,
                    vendors=SCENARIOS, window=(-3600.0, 3600.0)) as cluster:
        cluster.start_live(refresh=0.2)
        servers = {n.name: start_server(n.sampler, "127.0.0.1", 0, None)
                   for n in cluster.all_nodes}
        try:
            def scrape(node: str) -> str:
                url = f"http://127.0.0.1:{servers[node].port}/metrics"
                with urllib.request.urlopen(url, timeout=5) as resp:
                    return str(resp.read().decode())

            def held(text: str) -> set[tuple[str, str, str]]:
                out = set()
                for line in text.splitlines():
                    if line.startswith("gpu_container_allocation{") and line.endswith(" 1"):
                        labels = dict(kv.split("=", 1) for kv in
                                      line[line.index("{") + 1:line.rindex("}")].split(","))
                        out.add((labels["pod"].strip('"'), labels["sharing"].strip('"'),
                                 labels["resource"].strip('"')))
                return out

            want = {
                "gpu-mi300x-01": {("vllm-small-0", "mig", "amd.com/cpx_nps4"),
                                  ("vllm-small-1", "mig", "amd.com/cpx_nps4"),
                                  ("notebook-ana", "mig", "amd.com/cpx_nps4"),
                                  ("embedder-0", "exclusive", "amd.com/gpu")},
                "gpu-mxgpu-01": {(f"virt-launcher-vm-{v}", "vgpu", "amd.com/gpu_vf")
                                 for v in ("render", "ci", "train")},
                "gpu-intel-max-01": {("solver-0", "vgpu", "gpu.intel.com/xe"),
                                     ("render-0", "vgpu", "gpu.intel.com/xe"),
                                     ("tiles-0", "time-slicing", "gpu.intel.com/xe"),
                                     ("translate-0", "time-slicing", "gpu.intel.com/xe")},
                "igpu-desk-01": {("virt-launcher-desk-alice", "vgpu",
                                  "intel.com/i915-GVTg_V5_4"),
                                 ("virt-launcher-desk-bob", "vgpu", "intel.com/i915-GVTg_V5_8")},
                # a tile each, from gas-container-tiles on the pods the API server lists
                "gpu-intel-max-02": {("lammps-0", "mig", "gpu.intel.com/xe"),
                                     ("finetune-1", "mig", "gpu.intel.com/xe")},
            }
            for node, pods in want.items():
                wait_until(lambda n=node, p=pods: held(scrape(n)) == p,  # type: ignore[misc]
                           f"{node}'s allocations", limit=30)
            mi300x = scrape("gpu-mi300x-01")
            assert 'vendor="amd"' in mi300x and 'profile="cpx_nps4"' in mi300x
            igpu = scrape("igpu-desk-01")
            fractions = sorted(float(line.rsplit(" ", 1)[1]) for line in igpu.splitlines()
                               if line.startswith("gpu_container_memory_fraction{"))
            assert fractions == [0.125, 0.25]
            # the Max's use, per pod, from its processes' xe fdinfo (two reads apart); the VF
            # holders' processes open their VF (drm-pdev the VF's address)
            def util(text: str) -> dict[str, float]:
                return {line.split('pod="', 1)[1].split('"', 1)[0]: float(line.rsplit(" ", 1)[1])
                        for line in text.splitlines()
                        if line.startswith("gpu_container_sm_utilization_ratio{")}
            wait_until(lambda: util(scrape("gpu-intel-max-01")) == approx(
                {"tiles-0": 0.3, "translate-0": 0.5, "solver-0": 0.45, "render-0": 0.1},
                abs=CYCLE_ROUNDING), "the shared Max's fdinfo split", limit=30)
            # the tiles: listed from xe's sysfs and Level Zero, each pod's fdinfo on its tile
            tiles = scrape("gpu-intel-max-02")
            assert tiles.count('profile="tile"') >= 2, tiles
            wait_until(lambda: util(scrape("gpu-intel-max-02")) == approx(
                {"lammps-0": 0.6, "finetune-1": 0.9}, abs=CYCLE_ROUNDING),
                "each tile's pod's fdinfo", limit=30)

            def tile_busy(text: str) -> list[float]:
                return sorted(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                              if line.startswith("gpu_partition_utilization_ratio{"))
            wait_until(lambda: tile_busy(scrape("gpu-intel-max-02")) == approx(
                [0.6, 0.9], abs=CYCLE_ROUNDING),
                       "each tile's busy share from Level Zero", limit=30)
        finally:
            for s in servers.values():
                s.shutdown()
