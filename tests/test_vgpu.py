"""NVIDIA vGPU from both sides: a host's vGPU instances (simulated NVML calls, the exporter's
gpu_vgpu_* series, attribution of KubeVirt virt-launcher pods by mdev UUID through a real
PodResources server) and a guest's licence state; bad scenario entries are one-line errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pynvml
import pytest
import yaml

from exporter.errors import ConfigError
from gpusim.cluster import SimCluster
from gpusim.node import device_ids
from gpusim.nvml import SimNVML
from gpusim.scenario import load_scenario, parse_scenario

SCENARIOS = Path(__file__).resolve().parent.parent / "gpusim" / "scenarios"
HOST, GUEST = SCENARIOS / "vgpu-host.yaml", SCENARIOS / "vgpu-guest.yaml"
T0 = 1_790_000_000.0
GIB = 1 << 30


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_simulated_nvml_lists_a_hosts_vgpu_instances() -> None:
    sc = load_scenario(HOST)
    nv = SimNVML(sc, clock=Clock(T0 + 60), start=T0)
    nv.nvmlInit()
    h0 = nv.nvmlDeviceGetHandleByIndex(0)
    insts = nv.nvmlDeviceGetActiveVgpus(h0)
    assert len(insts) == 2
    t = nv.nvmlVgpuInstanceGetType(insts[0])
    assert nv.nvmlVgpuTypeGetName(t) == "NVIDIA A100-20C"
    assert nv.nvmlVgpuTypeGetFramebufferSize(t) == 20 * GIB
    assert nv.nvmlVgpuInstanceGetMdevUUID(insts[0]) == sc.gpus[0].vgpus[0].uuid
    assert nv.nvmlVgpuInstanceGetVmID(insts[0]) == ("vms/vm-train",
                                                    pynvml.NVML_VGPU_VM_ID_UUID)
    assert nv.nvmlVgpuInstanceGetFbUsage(insts[0]) == 12 * GIB
    util = {s.vgpuInstance: s.smUtil.uiVal for s in nv.nvmlDeviceGetVgpuUtilization(h0, 0)}
    assert util[insts[0]] == 60
    assert nv.nvmlDeviceGetGridLicensableFeatures(h0).isGridLicenseSupported == 0
    guest = SimNVML(load_scenario(GUEST), clock=Clock(T0), start=T0)
    guest.nvmlInit()
    with pytest.raises(pynvml.NVMLError_NotSupported):
        guest.nvmlDeviceGetActiveVgpus(guest.nvmlDeviceGetHandleByIndex(0))


def _samples(path: Path, t: float) -> dict[str, list[tuple[Any, ...]]]:
    with SimCluster([path], start=T0) as cluster:
        for _, rendering in cluster.step(T0 + t):
            return rendering.samples  # type: ignore[no-any-return]
    raise AssertionError("no node")


def test_host_instances_are_reported_and_attributed_to_virt_launcher_pods() -> None:
    sc = load_scenario(HOST)
    assert {i for _, i in device_ids(sc)} == {v.uuid for g in sc.gpus for v in g.vgpus}
    s = _samples(HOST, 60)
    # device labels are node, gpu, uuid, model, vendor; then the family's own
    info = {labels[5]: (labels[6], labels[7]) for labels, _, _ in s["gpu_vgpu_info"]}
    v = sc.gpus[0].vgpus
    assert info[v[0].uuid] == ("NVIDIA A100-20C", "vms/vm-train")
    assert len(info) == 3
    used = {labels[5]: val for labels, val, _ in s["gpu_vgpu_memory_used_bytes"]}
    assert used[v[0].uuid] == 12 * GIB
    util = {labels[5]: val for labels, val, _ in s["gpu_vgpu_utilization_ratio"]}
    assert util[v[0].uuid] == 0.6
    allocs = {labels[2]: (labels[4], labels[6], labels[7])
              for labels, _, _ in s["gpu_container_allocation"]}
    assert allocs["virt-launcher-vm-train"] == (sc.gpus[0].uuid, "nvidia.com/NVIDIA_A100-20C",
                                                "vgpu")
    assert allocs["virt-launcher-vm-infer"][0] == sc.gpus[1].uuid
    fractions = {labels[2]: val for labels, val, _ in s["gpu_container_memory_fraction"]}
    assert fractions == {"virt-launcher-vm-train": 0.25, "virt-launcher-vm-notebook": 0.25,
                         "virt-launcher-vm-infer": 0.5}
    assert all(val == 0 for _, val, _ in s["gpu_exporter_unresolved_device_ids_total"])
    # The VM's processes are not visible to the host: the holder's SM use is its instance's.
    sm = {labels[2]: val for labels, val, _ in s["gpu_container_sm_utilization_ratio"]}
    assert sm == {"virt-launcher-vm-train": 0.6, "virt-launcher-vm-infer": 0.4,
                  "virt-launcher-vm-notebook": util[v[1].uuid]}
    # ... and its memory is the instance's framebuffer use, so a busy VM is never an idle
    # holder in metering's waste figures.
    memory = {labels[2]: val for labels, val, _ in s["gpu_container_memory_used_bytes"]}
    assert memory == {f"virt-launcher-{vm.split('/')[1]}": used[uuid]
                      for uuid, (_, vm) in info.items()}
    assert memory["virt-launcher-vm-train"] == 12 * GIB


@pytest.mark.parametrize(("t", "state"), [(60, 1), (95 * 60, 0)])
def test_guest_license_state(t: float, state: int) -> None:
    s = _samples(GUEST, t)
    (labels, value, _), = s["gpu_vgpu_license_state"]
    assert labels[4:] == ("nvidia", "compute", "NVIDIA Virtual Compute Server") and value == state
    assert "gpu_vgpu_info" not in s or s["gpu_vgpu_info"] == []


@pytest.mark.parametrize(("change", "key", "expected"), [
    (lambda d: d["gpus"][0].update(virtualization_mode="none"),
     "gpus[0].vgpus", "vgpus only with virtualization_mode: host_vgpu"),
    (lambda d: d["pods"][0]["containers"][0].update(gpus=[{"gpu": 0, "vgpu": 2}]),
     "pods[0].containers[0].gpus[0].vgpu", "a vGPU instance index 0..1 of GPU 0"),
    (lambda d: d["pods"][0]["containers"][0].update(gpus=[0]),
     "pods[0].containers[0].gpus[0]", "a vGPU instance {gpu: 0, vgpu: N}: GPU 0 is a vGPU "
     "host"),
    (lambda d: d["pods"][0]["containers"][0].update(processes=[{"memory": "1GiB"}]),
     "pods[0].containers[0].processes", "no processes with a vGPU"),
    (lambda d: d["gpus"][1]["vgpus"].append({"type": "NVIDIA A100-60C"}),
     "gpus[1].vgpus", "vGPU framebuffers that fit the GPU's 80GiB"),
    (lambda d: d["gpus"][1]["vgpus"][0].pop("framebuffer") and
     d["gpus"][1]["vgpus"][0].update(type="custom"),
     "gpus[1].vgpus[0].framebuffer", "a size (the type name gives none)"),
])
def test_bad_vgpu_entries(change: Any, key: str, expected: str) -> None:
    data = yaml.safe_load(HOST.read_text())
    change(data)
    with pytest.raises(ConfigError) as err:
        parse_scenario(data, "vgpu-host.yaml")
    assert f"vgpu-host.yaml: {key}: expected {expected}" in str(err.value)


def test_license_only_on_a_guest() -> None:
    data = yaml.safe_load(GUEST.read_text())
    data["gpus"][0]["virtualization_mode"] = "none"
    with pytest.raises(ConfigError, match=r"gpus\[0\].license: expected license only with "
                       "virtualization_mode: vgpu"):
        parse_scenario(data, "vgpu-guest.yaml")
