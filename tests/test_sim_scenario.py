"""Scenario loading and validation: the example scenarios load, and malformed files give a
ConfigError naming the file, the key path and what was expected."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from exporter.errors import ConfigError
from gpusim.scenario import load_scenario, loads_scenario
from gpusim.signal import Signal
from gpusim.units import parse_duration, parse_size

SCENARIOS = sorted((Path(__file__).parent.parent / "gpusim" / "scenarios").glob("*.yaml"))

BASE = """
node: n1
gpus:
  - model: NVIDIA H100 80GB HBM3
    memory: 80GiB
    power_limit_watts: 700
    mig: [{profile: 3g.40gb}, {profile: 2g.20gb}]
  - model: NVIDIA A100-SXM4-40GB
    memory: 40GiB
    power_limit_watts: 400
    sharing: {mode: time-slicing, replicas: 2}
  - model: Tesla T4
    memory: 15GiB
    power_limit_watts: 70
pods:
  - namespace: ns
    name: p
    containers:
      - name: c
        gpus: [2]
        processes: [{memory: 1GiB, sm_util: 0.5}]
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "scenario.yaml"
    path.write_text(text)
    return path


def _edit(tmp_path: Path, change) -> Path:
    data = yaml.safe_load(BASE)
    change(data)
    return _write(tmp_path, yaml.safe_dump(data))


def test_examples_exist():
    names = {p.name for p in SCENARIOS}
    assert {"h100-mig.yaml", "a100-timeslice.yaml", "mixed.yaml"} <= names


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.name)
def test_every_example_loads(path: Path):
    sc = load_scenario(path)
    assert sc.gpus and sc.pods
    assert len({g.uuid for g in sc.gpus}) == len(sc.gpus)
    assert all(g.uuid.startswith("GPU-") for g in sc.gpus)
    teams = {dict(p.labels).get("team") for p in sc.pods}
    assert None not in teams and len(teams) >= 2


def test_examples_cover_the_cases():
    by_name = {p.name: load_scenario(p) for p in SCENARIOS}
    h100 = by_name["h100-mig.yaml"]
    assert len(h100.gpus) == 8 and all(g.gpm for g in h100.gpus)
    assert [m.profile for m in h100.gpus[0].mig or ()] == ["3g.40gb", "2g.20gb", "2g.20gb"]
    assert [m.profile for m in h100.gpus[1].mig or ()] == ["1g.10gb"] * 7
    assert all(g.mig is None for g in h100.gpus[2:])
    a100 = by_name["a100-timeslice.yaml"]
    assert {(g.sharing.mode, g.sharing.replicas) for g in a100.gpus} == {("time-slicing", 4)}
    mixed = by_name["mixed.yaml"]
    assert {g.sharing.mode for g in mixed.gpus} >= {"mps", "exclusive"}
    assert any(f.kind == "lost" for f in mixed.faults)
    assert {x.xid for x in mixed.xids} >= {13, 31, 48, 94}
    assert "memory_temperature" in mixed.gpus[0].not_supported
    namespaces = {p.namespace for sc in by_name.values() for p in sc.pods}
    teams = {dict(p.labels)["team"] for sc in by_name.values() for p in sc.pods}
    assert len(namespaces) >= 6 and len(teams) >= 6


def test_mig_geometry_derives_from_profile():
    sc = loads_scenario(BASE)
    m3, m2 = sc.gpus[0].mig or ()
    assert (m3.slices, m3.memory_bytes, m3.multiprocessors) == (3, 40 << 30, 60)
    assert (m2.slices, m2.memory_bytes) == (2, 20 << 30)
    assert m3.gpu_instance_id != m2.gpu_instance_id
    assert m3.uuid.startswith("MIG-")
    assert sc.gpus[0].mig_family is not None and sc.gpus[0].mig_family.parent_slices == 7


def test_uuids_are_deterministic_per_node():
    a, b = loads_scenario(BASE), loads_scenario(BASE)
    assert [g.uuid for g in a.gpus] == [g.uuid for g in b.gpus]
    other = loads_scenario(BASE.replace("node: n1", "node: n2"))
    assert not {g.uuid for g in a.gpus} & {g.uuid for g in other.gpus}


def test_units():
    assert parse_duration("90s") == 90 and parse_duration("20m") == 1200
    assert parse_duration("2h") == 7200 and parse_duration("7d") == 7 * 86400
    assert parse_duration("1h30m") == 5400 and parse_duration(15) == 15
    assert parse_duration("soon") is None and parse_duration("5x") is None
    assert parse_size("512MiB") == 512 << 20 and parse_size("80GiB") == 80 << 30
    assert parse_size("1GB") == 10**9 and parse_size(4096) == 4096
    assert parse_size("lots") is None and parse_size(-1) is None


def test_signals():
    sine = Signal("sine", lo=0.0, hi=1.0, period=100.0)
    assert sine.at(0) == pytest.approx(0.5) and sine.at(25) == pytest.approx(1.0)
    steps = Signal("steps", times=(0.0, 10.0), values=(1.0, 5.0))
    assert steps.at(-1) == 1.0 and steps.at(9.9) == 1.0 and steps.at(10) == 5.0
    import numpy as np

    ts = np.array([0.0, 25.0, 75.0])
    assert list(sine.at_many(ts)) == pytest.approx([sine.at(t) for t in ts])


def _expect(path: Path, key: str, expected: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_scenario(path)
    err = info.value
    assert err.file == str(path)
    assert err.key == key
    assert expected in err.expected
    assert str(path) in str(err) and key in str(err)
    return err


def test_bad_size(tmp_path):
    path = _edit(tmp_path, lambda d: d["gpus"][1].update(memory="forty gigs"))
    err = _expect(path, "gpus[1].memory", "a size like")
    assert err.found == "forty gigs"


def test_unknown_mig_profile(tmp_path):
    path = _edit(tmp_path, lambda d: d["gpus"][0]["mig"][1].update(profile="5g.50gb"))
    err = _expect(path, "gpus[0].mig[1].profile", "3g.40gb")
    assert err.found == "5g.50gb"


def test_too_many_mig_slices(tmp_path):
    path = _edit(tmp_path, lambda d: d["gpus"][0]["mig"].append({"profile": "4g.40gb"}))
    _expect(path, "gpus[0].mig", "at most 7 compute slices")


def test_mig_on_a_model_without_mig(tmp_path):
    path = _edit(tmp_path, lambda d: d["gpus"][2].update(mig=[{"profile": "1g.5gb"}]))
    _expect(path, "gpus[2].mig", "no mig")


def test_unknown_key(tmp_path):
    path = _edit(tmp_path, lambda d: d["gpus"][2].update(memroy="16GiB"))
    err = _expect(path, "gpus[2].memroy", "one of the known keys")
    assert "memory" in err.expected


def test_unknown_top_level_key(tmp_path):
    path = _edit(tmp_path, lambda d: d.update(podz=[]))
    _expect(path, "podz", "known keys")


def test_gpu_index_out_of_range(tmp_path):
    def change(d):
        d["pods"][0]["containers"][0]["gpus"] = [9]
    path = _edit(tmp_path, change)
    err = _expect(path, "pods[0].containers[0].gpus[0]", "a GPU index 0..2")
    assert err.found == 9


def test_fault_gpu_out_of_range(tmp_path):
    path = _edit(tmp_path, lambda d: d.update(faults=[{"kind": "lost", "gpu": 5, "at": "1h"}]))
    _expect(path, "faults[0].gpu", "a GPU index 0..2")


def test_yaml_syntax_error(tmp_path):
    path = _write(tmp_path, "node: n1\ngpus: [\n  - model: x\n")
    err = _expect(path, "", "valid YAML (line")
    assert err.found


def test_missing_required_key(tmp_path):
    path = _edit(tmp_path, lambda d: d["gpus"][0].pop("power_limit_watts"))
    _expect(path, "gpus[0].power_limit_watts", "(required)")


def test_bad_duration_in_signal(tmp_path):
    def change(d):
        d["pods"][0]["containers"][0]["processes"][0]["sm_util"] = {
            "sine": {"min": 0, "max": 1, "period": "often"}}
    path = _edit(tmp_path, change)
    _expect(path, "pods[0].containers[0].processes[0].sm_util.sine.period", "a duration")


def test_ratio_out_of_range(tmp_path):
    def change(d):
        d["pods"][0]["containers"][0]["processes"][0]["sm_util"] = 1.5
    path = _edit(tmp_path, change)
    _expect(path, "pods[0].containers[0].processes[0].sm_util", "between 0 and 1")


def test_shared_gpu_needs_a_replica(tmp_path):
    def change(d):
        d["pods"][0]["containers"][0]["gpus"] = [{"gpu": 1, "replica": 2}]
    path = _edit(tmp_path, change)
    _expect(path, "pods[0].containers[0].gpus[0].replica", "a replica 0..1")


def test_mig_gpu_needs_an_instance(tmp_path):
    def change(d):
        d["pods"][0]["containers"][0]["gpus"] = [0]
    path = _edit(tmp_path, change)
    _expect(path, "pods[0].containers[0].gpus[0]", "a MIG instance")


def test_unit_held_twice(tmp_path):
    def change(d):
        d["pods"].append({"namespace": "ns", "name": "q",
                          "containers": [{"name": "c", "gpus": [2]}]})
    path = _edit(tmp_path, change)
    _expect(path, "pods[1].containers[0].gpus[0]", "no other container holds")


def test_units_can_be_reused_when_pods_do_not_overlap(tmp_path):
    def change(d):
        d["pods"][0]["end"] = "1h"
        d["pods"].append({"namespace": "ns", "name": "q", "start": "1h",
                          "containers": [{"name": "c", "gpus": [2]}]})
    sc = load_scenario(_edit(tmp_path, change))
    assert len(sc.pods) == 2


def test_repeat_needs_end_and_fitting_period(tmp_path):
    path = _edit(tmp_path, lambda d: d["pods"][0].update(repeat="1h"))
    _expect(path, "pods[0].end", "an end time")
    path = _edit(tmp_path, lambda d: d["pods"][0].update(end="2h", repeat="1h"))
    _expect(path, "pods[0].repeat", "a period >= end - start")


def test_unreadable_file(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_scenario(tmp_path / "missing.yaml")
    assert "missing.yaml" in str(info.value)


def test_top_level_must_be_a_mapping(tmp_path):
    _expect(_write(tmp_path, "- 1\n- 2\n"), "(top level)", "a mapping")
