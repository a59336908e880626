"""PCIe and NVLink throughput: GPM rates on Hopper, the spot PCIe call and the NVLink byte
counters elsewhere, through the whole sampler on the simulated NVML."""

from __future__ import annotations

import pynvml
import pytest

from gpusim.nvml import SimNVML
from gpusim.scenario import loads_scenario
from gpusim.traffic import GIB, NVLINK_LINK_PEAK, PCIE_PEAK, Direction
from tests.exporter_helpers import T0, make_sampler, values

TX, RX = Direction.TX, Direction.RX
SCENARIO = """
node: node-a
gpus:
  - model: NVIDIA H100 80GB HBM3
    memory: 80GiB
    power_limit_watts: 700
    nvlink_links: 2
  - model: NVIDIA A100-SXM4-80GB
    memory: 80GiB
    power_limit_watts: 400
    nvlink_links: 3
  - model: NVIDIA A100 80GB PCIe
    memory: 80GiB
    power_limit_watts: 300
    not_supported: [pcie_throughput]
  - model: NVIDIA H100 80GB HBM3
    memory: 80GiB
    power_limit_watts: 700
    nvlink_links: 2
    mig: [{profile: 3g.40gb}]
pods:
  - namespace: ml
    name: a
    containers: [{name: main, gpus: [{gpu: 0}], processes: [{memory: 1GiB, sm_util: 0.5}]}]
  - namespace: ml
    name: b
    containers: [{name: main, gpus: [{gpu: 1}], processes: [{memory: 1GiB, sm_util: 0.25}]}]
  - namespace: ml
    name: c
    containers: [{name: main, gpus: [{gpu: 3, mig: 0}], processes: [{memory: 1GiB, sm_util: 1}]}]
faults:
  - {gpu: 1, at: 0s, kind: nvlink_down, link: 2}
"""
PCIE = "gpu_pcie_throughput_bytes_per_second"
NVLINK = "gpu_nvlink_throughput_bytes_per_second"
LINK = "gpu_link_throughput_bytes_per_second"


def one(body: bytes, name: str, **match: str) -> float:
    got = values(body, name, **match)
    assert len(got) == 1, (name, match, got)
    return got[0]


def test_gpm_rates_on_hopper_from_the_second_cycle() -> None:
    sampler, clock, _ = make_sampler(SCENARIO)
    clock.now = T0 + 60
    first = sampler.cycle().body(False, False)
    assert not values(first, PCIE, gpu="0") and not values(first, NVLINK, gpu="0")
    clock.now += 10
    body = sampler.cycle().body(False, False)
    util = 0.5
    assert one(body, PCIE, gpu="0", direction="tx") == pytest.approx(util * PCIE_PEAK[TX])
    assert one(body, PCIE, gpu="0", direction="rx") == pytest.approx(util * PCIE_PEAK[RX])
    assert one(body, NVLINK, gpu="0", direction="tx") == \
        pytest.approx(2 * util * NVLINK_LINK_PEAK[TX])
    assert one(body, NVLINK, gpu="0", direction="rx") == \
        pytest.approx(2 * util * NVLINK_LINK_PEAK[RX])
    # the vendor-neutral link family carries the same figures as link_type nvlink
    for d in ("tx", "rx"):
        assert one(body, LINK, gpu="0", link_type="nvlink", direction=d) == \
            one(body, NVLINK, gpu="0", direction=d)
    assert one(body, "gpu_exporter_collector_success", collector="throughput") == 1


def test_pre_hopper_pcie_spot_and_nvlink_counters() -> None:
    """A100: PCIe from the 20 ms call at once; NVLink from counters, so from the second cycle,
    summed over the links that carried traffic (link 2 is down)."""
    sampler, clock, _ = make_sampler(SCENARIO)
    clock.now = T0 + 60
    first = sampler.cycle().body(False, False)
    util = 0.25
    assert one(first, PCIE, gpu="1", direction="tx") == pytest.approx(util * PCIE_PEAK[TX])
    assert one(first, PCIE, gpu="1", direction="rx") == pytest.approx(util * PCIE_PEAK[RX])
    assert not values(first, NVLINK, gpu="1")
    clock.now += 10
    body = sampler.cycle().body(False, False)
    # KiB counters: the rate is exact to 1 KiB over 10 s
    assert one(body, NVLINK, gpu="1", direction="tx") == \
        pytest.approx(2 * util * NVLINK_LINK_PEAK[TX], abs=1024)
    assert one(body, NVLINK, gpu="1", direction="rx") == \
        pytest.approx(2 * util * NVLINK_LINK_PEAK[RX], abs=1024)
    assert one(body, LINK, gpu="1", link_type="nvlink", direction="rx") == \
        one(body, NVLINK, gpu="1", direction="rx")


def test_absent_where_nvml_has_no_figure() -> None:
    """GPU 2 has no NVLink and no PCIe throughput: no series, and not a failure. GPU 3 is
    MIG-enabled: the GPU figure is there, the instance figure is not (the simulator, like the
    exporter, gives a per-instance figure only where NVML answers one)."""
    sampler, clock, _ = make_sampler(SCENARIO)
    clock.now = T0 + 60
    sampler.cycle()
    clock.now += 10
    body = sampler.cycle().body(False, False)
    assert not values(body, PCIE, gpu="2") and not values(body, NVLINK, gpu="2")
    assert one(body, PCIE, gpu="3", direction="rx") > 0  # one series: the GPU's, no instance
    assert len(values(body, PCIE, gpu="3")) == len(values(body, NVLINK, gpu="3")) == 2
    assert one(body, "gpu_exporter_collector_success", collector="throughput") == 1


def test_sim_counters_stop_while_a_link_is_down() -> None:
    scenario = loads_scenario(SCENARIO.replace(
        "link: 2}", "link: 2}\n  - {gpu: 1, at: 100s, kind: nvlink_down, link: 0, duration: 50s}"
    ), "t.yaml")
    nv = SimNVML(scenario, clock=lambda: T0 + now, start=T0)
    nv.nvmlInit()
    h = nv.nvmlDeviceGetHandleByIndex(1)
    fid = pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX

    def kib(t: float, link: int) -> int:
        global now
        now = t
        fv = nv.nvmlDeviceGetFieldValues(h, [(fid, link)])[0]
        assert fv.nvmlReturn == pynvml.NVML_SUCCESS
        return int(fv.value.ullVal)

    assert kib(90, 0) < kib(100, 0) == kib(120, 0) == kib(150, 0) < kib(160, 0)
    assert kib(200, 2) == 0  # down from the start
    assert kib(200, 1) * 1024 == pytest.approx(200 * 0.25 * NVLINK_LINK_PEAK[TX], abs=1024)
    fv = nv.nvmlDeviceGetFieldValues(h, [(fid, 3)])[0]  # no such link
    assert fv.nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED
    assert nv.nvmlDeviceGetPcieThroughput(h, pynvml.NVML_PCIE_UTIL_RX_BYTES) * 1024 == \
        pytest.approx(0.25 * 4 * GIB, rel=1e-6)


now = 0.0
