"""A lost GPU stays visible: the GPUs the node has are counted from sysfs PCI functions (no
NVML needed) and compared with those that answer NVML, also after an exporter restart."""

from __future__ import annotations

from pathlib import Path

from exporter.pcidevices import nvidia_gpu_functions
from tests.exporter_helpers import SCENARIO, make_sampler, values


def pci(root: Path, address: str, vendor: str, klass: str) -> None:
    d = root / "bus" / "pci" / "devices" / address
    d.mkdir(parents=True)
    (d / "vendor").write_text(vendor + "\n")
    (d / "class").write_text(klass + "\n")


def test_counts_nvidia_display_and_3d_functions_only(tmp_path: Path) -> None:
    pci(tmp_path, "0000:18:00.0", "0x10de", "0x030200")  # 3D controller (H100, A100)
    pci(tmp_path, "0000:3b:00.0", "0x10de", "0x030000")  # VGA (T4, L4 in some modes)
    pci(tmp_path, "0000:18:00.1", "0x10de", "0x040300")  # the GPU's audio function
    pci(tmp_path, "0000:c1:00.0", "0x10de", "0x068000")  # NVSwitch (a bridge)
    pci(tmp_path, "0000:00:02.0", "0x8086", "0x030000")  # another vendor's VGA
    (tmp_path / "bus" / "pci" / "devices" / "0000:99:00.0").mkdir()  # unreadable: skipped
    assert nvidia_gpu_functions(str(tmp_path)) == ["0000:18:00.0", "0000:3b:00.0"]


def test_unreadable_sysfs_is_unknown_not_zero(tmp_path: Path) -> None:
    assert nvidia_gpu_functions(str(tmp_path / "absent")) is None
    sampler, _, _ = make_sampler()
    sampler.options = type(sampler.options)(node="node-a", sysfs_root=str(tmp_path / "absent"))
    body = sampler.cycle().body(False, False)
    assert values(body, "gpu_expected_devices") == []
    assert values(body, "gpu_answering_devices") == [3]


def test_gpu_lost_before_start_stays_visible_across_restarts() -> None:
    text = SCENARIO.replace("  - {gpu: 1, at: 1h, kind: lost}", "  - {gpu: 1, at: 0s, kind: lost}")
    for _restart in range(2):  # a fresh exporter each time: nothing remembered
        sampler, _, _ = make_sampler(text)
        body = sampler.cycle().body(False, False)
        assert values(body, "gpu_expected_devices", source="pci") == [3]
        assert values(body, "gpu_answering_devices") == [2]
        sampler.close()


def test_gpu_lost_while_running_counts_down_and_nvml_down_answers_none() -> None:
    sampler, clock, _ = make_sampler()
    assert values(sampler.cycle().body(False, False), "gpu_answering_devices") == [3]
    clock.now += 3600 + 5
    body = sampler.cycle().body(False, False)
    assert values(body, "gpu_expected_devices") == [3]
    assert values(body, "gpu_answering_devices") == [2]
    nodriver, _, _ = make_sampler(SCENARIO + "driver: {unavailable_until: 30s}\n")
    body = nodriver.cycle().body(False, False)
    assert values(body, "gpu_expected_devices") == [3]
    assert values(body, "gpu_answering_devices") == [0]
