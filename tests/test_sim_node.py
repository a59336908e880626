"""The Kubernetes side of a simulated node: device plugin IDs, pods at t, /proc cgroup files."""

from __future__ import annotations

import re
from pathlib import Path

from gpusim.node import (
    device_ids,
    pods_at,
    processes_at,
    sharing_modes,
    write_proc_tree,
)
from gpusim.nvml import SimNVML
from gpusim.scenario import load_scenario, loads_scenario

SCENARIOS = Path(__file__).parent.parent / "gpusim" / "scenarios"
HOUR = 3600.0
DAY = 86400.0
UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"

NODE = """
node: n1
gpus:
  - model: NVIDIA A100-SXM4-80GB
    memory: 80GiB
    power_limit_watts: 400
  - model: NVIDIA A100-SXM4-80GB
    memory: 80GiB
    power_limit_watts: 400
    sharing: {mode: time-slicing, replicas: 2}
pods:
  - namespace: team-a
    name: trainer
    labels: {team: a}
    qos: guaranteed
    containers:
      - name: main
        gpus: [0]
        processes: [{memory: 1GiB, sm_util: 0.5}, {memory: 2GiB, sm_util: 0.1}]
      - name: sidecar
  - namespace: team-b
    name: job
    labels: {team: b}
    start: 1h
    end: 2h
    repeat: 1d
    containers:
      - name: work
        gpus: [{gpu: 1, replica: 1}]
        processes: [{memory: 3GiB, sm_util: 0.2}]
host_processes:
  - {name: dcgm, gpu: 1, memory: 100MiB}
"""


def test_device_ids_forms():
    h100 = load_scenario(SCENARIOS / "h100-mig.yaml")
    ids = device_ids(h100)
    resources = {r for r, _ in ids}
    assert {"nvidia.com/mig-3g.40gb", "nvidia.com/mig-2g.20gb", "nvidia.com/mig-1g.10gb",
            "nvidia.com/gpu"} == resources
    assert sum(r == "nvidia.com/mig-1g.10gb" for r, _ in ids) == 7
    assert all(re.fullmatch("MIG-" + UUID, d) for r, d in ids if "mig-" in r)
    whole = [d for r, d in ids if r == "nvidia.com/gpu"]
    assert whole == [g.uuid for g in h100.gpus[2:]]  # the ID is the UUID, GPU- included
    assert all(re.fullmatch("GPU-" + UUID, d) for d in whole)

    a100 = load_scenario(SCENARIOS / "a100-timeslice.yaml")
    ids = device_ids(a100)
    assert len(ids) == 16 and {r for r, _ in ids} == {"nvidia.com/gpu"}
    assert [d for _, d in ids[:4]] == [f"{a100.gpus[0].uuid}::{n}" for n in range(4)]

    mixed = load_scenario(SCENARIOS / "mixed.yaml")
    shared = [d for r, d in device_ids(mixed) if r == "nvidia.com/gpu.shared"]
    assert shared == [f"{mixed.gpus[1].uuid}::{n}" for n in range(4)]
    assert sharing_modes(mixed) == {"nvidia.com/gpu": "exclusive", "nvidia.com/gpu.shared": "mps"}
    assert sharing_modes(h100)["nvidia.com/mig-3g.40gb"] == "mig"


def test_pods_at():
    sc = loads_scenario(NODE)
    pods = pods_at(sc, 0)
    assert [p.name for p in pods] == ["trainer"]
    (trainer,) = pods
    assert re.fullmatch(UUID, trainer.uid)
    assert trainer.labels == {"team": "a"} and trainer.qos == "guaranteed"
    assert trainer.node == "n1"
    main, sidecar = trainer.containers
    assert re.fullmatch("[0-9a-f]{64}", main.container_id)
    assert main.container_id != sidecar.container_id
    assert main.devices == (("nvidia.com/gpu", (sc.gpus[0].uuid,)),)
    assert sorted(p.memory_bytes for p in main.processes) == [1 << 30, 2 << 30]
    assert sidecar.devices == () and sidecar.processes == ()
    # deterministic
    assert pods_at(loads_scenario(NODE), 0) == pods


def test_repeating_pod_runs_are_new_pods():
    sc = loads_scenario(NODE)
    assert [p.name for p in pods_at(sc, 0.5 * HOUR)] == ["trainer"]
    day0 = {p.name: p for p in pods_at(sc, 1.5 * HOUR)}
    day1 = {p.name: p for p in pods_at(sc, DAY + 1.5 * HOUR)}
    assert set(day0) == {"trainer", "job-0"} and set(day1) == {"trainer", "job-1"}
    assert day0["job-0"].uid != day1["job-1"].uid
    assert day1["job-1"].start == DAY + HOUR and day1["job-1"].end == DAY + 2 * HOUR
    assert day0["job-0"].containers[0].devices == (
        ("nvidia.com/gpu", (f"{sc.gpus[1].uuid}::1",)),)
    pid0 = day0["job-0"].containers[0].processes[0].pid
    pid1 = day1["job-1"].containers[0].processes[0].pid
    assert pid0 != pid1  # a new run is a new process
    assert day0["trainer"].uid == day1["trainer"].uid


def test_month_long():
    sc = load_scenario(SCENARIOS / "a100-timeslice.yaml")
    t = 30 * DAY + 7 * 60  # 30 days in, during the 720th run of the hourly CI pod
    names = {p.name for p in pods_at(sc, t)}
    assert "gpu-tests-720" in names and "segment-train" not in names
    pids = [p.pid for p in processes_at(sc, t)]
    assert len(pids) == len(set(pids))


def test_nvml_reports_the_same_pids():
    for name in ("h100-mig.yaml", "a100-timeslice.yaml", "mixed.yaml"):
        sc = load_scenario(SCENARIOS / name)
        t = 2 * HOUR
        nv = SimNVML(sc, clock=lambda: 1000.0 + 2 * HOUR, start=1000.0)
        nv.nvmlInit()
        nvml_pids = set()
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            nvml_pids |= {p.pid for p in nv.nvmlDeviceGetComputeRunningProcesses(h)}
        pod_pids = {p.pid for pod in pods_at(sc, t) for c in pod.containers
                    for p in c.processes}
        host_pids = {p.pid for p in processes_at(sc, t) if not p.namespace}
        assert pod_pids and nvml_pids == pod_pids | host_pids


def test_write_proc_tree(tmp_path):
    sc = loads_scenario(NODE)
    root = tmp_path / "proc"
    live = write_proc_tree(sc, root, 1.5 * HOUR)
    pods = {p.name: p for p in pods_at(sc, 1.5 * HOUR)}
    trainer, job = pods["trainer"], pods["job-0"]
    assert len(live) == 4  # two trainer processes, the job's, the host daemon
    for proc in trainer.containers[0].processes:
        line = (root / str(proc.pid) / "cgroup").read_text()
        u = trainer.uid.replace("-", "_")
        cid = trainer.containers[0].container_id
        assert line == (f"0::/kubepods.slice/kubepods-pod{u}.slice/"
                        f"cri-containerd-{cid}.scope\n")
    job_pid = job.containers[0].processes[0].pid
    line = (root / str(job_pid) / "cgroup").read_text()
    assert line.startswith("0::/kubepods.slice/kubepods-burstable.slice/"
                           f"kubepods-burstable-pod{job.uid.replace('-', '_')}.slice/")
    host = [p for p in processes_at(sc, 1.5 * HOUR) if not p.namespace]
    assert (root / str(host[0].pid) / "cgroup").read_text() == "0::/system.slice/dcgm.service\n"
    (root / "self").mkdir()  # non-PID entries are left alone
    # the job ends: its PID directory goes, the others stay
    live_after = write_proc_tree(sc, root, 3 * HOUR)
    assert job_pid not in live_after and not (root / str(job_pid)).exists()
    assert set(live_after) == set(live) - {job_pid}
    assert (root / "self").is_dir()


def test_cri_o_and_cgroupfs(tmp_path):
    mixed = load_scenario(SCENARIOS / "mixed.yaml")
    write_proc_tree(mixed, tmp_path, HOUR)
    canary = (tmp_path / "4242" / "cgroup").read_text()  # the canary's fixed PID
    assert re.fullmatch(r"0::/kubepods\.slice/kubepods-pod[0-9a-f_]{36}\.slice/"
                        r"crio-[0-9a-f]{64}\.scope\n", canary)
    cgfs = loads_scenario(NODE + "cgroup_driver: cgroupfs\n")
    pod = pods_at(cgfs, 0)[0]
    proc = pod.containers[0].processes[0]
    assert proc.cgroup == f"0::/kubepods/pod{pod.uid}/{pod.containers[0].container_id}"


def test_processes_at_cache_is_invisible_and_bounded():
    """Timeline.processes_at remembers recent instants: a caller's changes to the list it got
    do not reach the next caller, the answer equals a fresh Timeline's, and it keeps at most
    _AT_CACHE instants."""
    from gpusim.node import _AT_CACHE, Timeline, timeline

    sc = load_scenario(SCENARIOS / "a100-timeslice.yaml")
    first = processes_at(sc, 2 * HOUR)
    assert first
    first.clear()
    assert processes_at(sc, 2 * HOUR) == Timeline(sc).processes_at(2 * HOUR)
    for i in range(3 * _AT_CACHE):
        processes_at(sc, i * 60.0)
    assert len(timeline(sc)._at) == _AT_CACHE
