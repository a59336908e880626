"""`gpu-ledger doctor` against the simulated NVML, a real gRPC PodResources server on a unix
socket, a dead socket, fake /proc and /sys trees, the fake Kubernetes API and a tiny HTTP
server speaking Prometheus' query API."""

from __future__ import annotations

import json
import shutil
import socket
import tempfile
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pynvml
import pytest

from exporter.nvml_loader import load_nvml
from gpu_ledger import cli, doctor
from gpusim.apiserver import FakeApiServer
from gpusim.kubelet import ContainerAllocation, FakeKubelet, PodAllocation

SCENARIOS = Path(__file__).resolve().parent.parent / "gpusim" / "scenarios"
H100 = SCENARIOS / "h100-mig.yaml"  # 8 GPUs: 0 and 1 with MIG (3 and 7 instances)
UUID0 = "GPU-11111111-2222-3333-4444-555555555555"


def lines(output: str) -> dict[str, str]:
    """Doctor output as {check name: whole line} (the summary line excluded)."""
    out = {}
    for line in output.splitlines():
        if line.startswith("doctor:"):
            continue
        status, rest = line.split(None, 1)
        assert status in ("OK", "WARN", "FAIL"), line
        name = rest[:13].strip()
        out[name] = line
    return out


def status(found: dict[str, str], name: str) -> str:
    return found[name].split(None, 1)[0]


# --- fixtures ------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def not_in_a_pod(monkeypatch: pytest.MonkeyPatch) -> None:
    # In a pod (CI runners can be one) doctor would check the in-cluster API on its own.
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("NODE_NAME", raising=False)


@pytest.fixture
def sockdir() -> Iterator[Path]:
    # unix socket paths are limited to ~107 bytes: pytest's tmp_path can be longer
    path = tempfile.mkdtemp(prefix="gl-doc-", dir="/tmp")
    yield Path(path)
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def kubelet(sockdir: Path) -> Iterator[FakeKubelet]:
    pods = [PodAllocation("ml", "train-0", [ContainerAllocation(
        "main", [("nvidia.com/gpu", [UUID0])])])]
    k = FakeKubelet(str(sockdir / "kubelet.sock"), lambda: pods,
                    lambda: [("nvidia.com/gpu", UUID0), ("nvidia.com/gpu", "GPU-other")])
    k.start()
    yield k
    k.stop()


def make_proc(root: Path, pid1_cgroup: str, comm: str, same_ns: bool = True) -> Path:
    (root / "1" / "ns").mkdir(parents=True)
    (root / "self" / "ns").mkdir(parents=True)
    (root / "1" / "cgroup").write_text(pid1_cgroup)
    (root / "1" / "comm").write_text(comm + "\n")
    (root / "1" / "ns" / "pid").symlink_to("pid:[4026531836]")
    (root / "self" / "ns" / "pid").symlink_to("pid:[4026531836]" if same_ns
                                               else "pid:[4026532999]")
    return root


@pytest.fixture
def host_proc(tmp_path: Path) -> Path:
    return make_proc(tmp_path / "proc", "0::/init.scope\n", "systemd")


@pytest.fixture
def sys_v2(tmp_path: Path) -> Path:
    (tmp_path / "sys" / "fs" / "cgroup").mkdir(parents=True)
    (tmp_path / "sys" / "fs" / "cgroup" / "cgroup.controllers").write_text("cpu memory pids\n")
    return tmp_path / "sys"


class FakePrometheus:
    """/api/v1/query answering from a {query: result list} table; anything else is 404."""

    def __init__(self, results: dict[str, list[Any]], code: int = 200,
                 body: Any = None) -> None:
        self.results, self.code, self.body = results, code, body
        self.queries: list[str] = []
        prom = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                url = urlsplit(self.path)
                if url.path != "/api/v1/query":
                    self.send_error(404)
                    return
                query = parse_qs(url.query)["query"][0]
                prom.queries.append(query)
                body = prom.body if prom.body is not None else {
                    "status": "success",
                    "data": {"resultType": "vector", "result": prom.results.get(query, [])}}
                data = json.dumps(body).encode()
                self.send_response(prom.code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> FakePrometheus:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


def sample(value: str, **labels: str) -> dict[str, Any]:
    return {"metric": labels, "value": [1700000000.0, value]}


def run_doctor(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, str]]:
    rc = cli.main(["doctor", *argv])
    return rc, lines(capsys.readouterr().out)


def base_args(kubelet_sock: str, proc: Path, sys_root: Path,
              nvml: str = f"sim:{H100}") -> list[str]:
    return ["--nvml", nvml, "--pod-resources-socket", kubelet_sock, "--proc-root", str(proc),
            "--sys-root", str(sys_root), "--timeout", "2s"]


# --- a healthy node ------------------------------------------------------------------------


def test_healthy_node_passes_every_check(capsys: pytest.CaptureFixture[str], kubelet: FakeKubelet,
                                         host_proc: Path, sys_v2: Path) -> None:
    with FakePrometheus({"up": [sample("1", job="a"), sample("0", job="b")],
                         "gpu_up": [sample("1", gpu="0"), sample("1", gpu="1")]}) as prom:
        rc, found = run_doctor(capsys, *base_args(kubelet.socket_path, host_proc, sys_v2),
                               "--prometheus", prom.url)
    assert rc == 0
    assert all(line.startswith("OK") for line in found.values()), found
    assert "driver 550.90.07, CUDA 12.4" in found["driver"]
    assert "8 GPU(s)" in found["gpus"]
    assert "MIG enabled, 3 instance(s)" in found["gpu 0"]
    assert "MIG enabled, 7 instance(s)" in found["gpu 1"]
    assert "MIG disabled" in found["gpu 2"]
    assert "1 pod(s) with devices, 1 allocation(s); 2 allocatable" in found["podresources"]
    assert kubelet.calls["List"] == 1
    assert "v2 (unified hierarchy), controllers: cpu memory pids" in found["cgroup"]
    assert "host's systemd" in found["hostpid"]
    assert "1 of 2 target(s) up" in found["prometheus"]
    assert "2 GPU(s) reporting, all up" in found["gpu_up"]
    assert "kubernetes" not in found  # only with --kubeconfig or in a pod


def test_summary_line_counts_statuses(capsys: pytest.CaptureFixture[str], sockdir: Path,
                                      host_proc: Path, sys_v2: Path) -> None:
    rc = cli.main(["doctor", *base_args(str(sockdir / "none.sock"), host_proc, sys_v2)])
    last = capsys.readouterr().out.splitlines()[-1]
    assert rc == 1
    assert last.startswith("doctor: 1 FAIL, 0 WARN, ")
    assert "docs/operations.md#troubleshooting" in last


# --- NVML ----------------------------------------------------------------------------------


def write_scenario(tmp_path: Path, extra: str, gpus: str | None = None) -> str:
    gpus = gpus or ("  - {model: NVIDIA A100-SXM4-80GB, memory: 80GiB, power_limit_watts: 400,"
                    " count: 2}\n")
    path = tmp_path / "node.yaml"
    path.write_text(f"node: n1\ngpus:\n{gpus}{extra}")
    return f"sim:{path}"


def test_lost_gpu_fails(capsys: pytest.CaptureFixture[str], tmp_path: Path, kubelet: FakeKubelet,
                        host_proc: Path, sys_v2: Path) -> None:
    spec = write_scenario(tmp_path, "faults:\n  - {kind: lost, gpu: 1, at: 0s}\n")
    rc, found = run_doctor(capsys, *base_args(kubelet.socket_path, host_proc, sys_v2, spec))
    assert rc == 1
    assert status(found, "gpu 0") == "OK"
    assert status(found, "gpu 1") == "FAIL"
    assert "fell off the bus (XID 79)" in found["gpu 1"]
    assert "hint: drain the node" in found["gpu 1"]


def test_mig_enabled_without_instances_warns(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                             kubelet: FakeKubelet, host_proc: Path,
                                             sys_v2: Path) -> None:
    gpus = ("  - {model: NVIDIA H100 80GB HBM3, memory: 80GiB, power_limit_watts: 700, mig: []}\n")
    spec = write_scenario(tmp_path, "", gpus)
    rc, found = run_doctor(capsys, *base_args(kubelet.socket_path, host_proc, sys_v2, spec))
    assert rc == 0  # a warning, not a failure
    assert status(found, "gpu 0") == "WARN"
    assert "MIG enabled but no instance created" in found["gpu 0"]


def test_mig_mode_pending_a_reset_warns(kubelet: FakeKubelet, host_proc: Path,
                                        sys_v2: Path) -> None:
    nvml = load_nvml(f"sim:{H100}")
    real = nvml.nvmlDeviceGetMigMode

    def pending_on_gpu_2(handle: Any) -> list[int]:
        if nvml.nvmlDeviceGetIndex(handle) == 2:
            return [0, 1]  # disabled now, enabled once the GPU is reset
        return list(real(handle))

    nvml.nvmlDeviceGetMigMode = pending_on_gpu_2
    args = doctor.build_parser().parse_args(base_args(kubelet.socket_path, host_proc, sys_v2))
    found = {c.name: c for c in doctor.run(args, nvml=nvml)}
    assert found["gpu 2"].status == "WARN"
    assert "MIG disabled but enabled is pending" in found["gpu 2"].message
    assert "nvidia-smi -i 2 -r" in found["gpu 2"].hint
    assert found["gpu 0"].status == "OK"


def test_driver_not_loaded_fails_and_other_checks_still_run(capsys: pytest.CaptureFixture[str],
                                                            tmp_path: Path, kubelet: FakeKubelet,
                                                            host_proc: Path, sys_v2: Path) -> None:
    spec = write_scenario(tmp_path, "driver: {unavailable_until: 1h}\n")
    rc, found = run_doctor(capsys, *base_args(kubelet.socket_path, host_proc, sys_v2, spec))
    assert rc == 1
    assert status(found, "nvml") == "FAIL"
    assert "nvmlInit failed" in found["nvml"]
    assert "kernel module is not loaded" in found["nvml"]
    assert "gpus" not in found  # nothing to ask a driver that did not initialise
    assert status(found, "podresources") == "OK"
    assert status(found, "cgroup") == "OK"


def test_missing_scenario_names_the_file(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                         kubelet: FakeKubelet, host_proc: Path,
                                         sys_v2: Path) -> None:
    missing = tmp_path / "nope.yaml"
    rc, found = run_doctor(capsys, *base_args(kubelet.socket_path, host_proc, sys_v2,
                                               f"sim:{missing}"))
    assert rc == 1
    assert status(found, "nvml") == "FAIL"
    assert str(missing) in found["nvml"]


def test_bad_nvml_spec_is_a_failed_check_not_a_traceback(capsys: pytest.CaptureFixture[str],
                                                         kubelet: FakeKubelet, host_proc: Path,
                                                         sys_v2: Path) -> None:
    rc, found = run_doctor(capsys, *base_args(kubelet.socket_path, host_proc, sys_v2, "fake"))
    assert rc == 1
    assert "--nvml: nvml: expected 'real' or 'sim:PATH'" in found["nvml"]


def test_cuda_version_format() -> None:
    assert doctor.cuda_version(12040) == "12.4"
    assert doctor.cuda_version(11080) == "11.8"
    assert doctor.cuda_version(12020) == "12.2"


# --- PodResources --------------------------------------------------------------------------


def test_missing_socket_fails(capsys: pytest.CaptureFixture[str], sockdir: Path, host_proc: Path,
                              sys_v2: Path) -> None:
    rc, found = run_doctor(capsys, *base_args(str(sockdir / "kubelet.sock"), host_proc, sys_v2))
    assert rc == 1
    assert status(found, "podresources") == "FAIL"
    assert "no socket at" in found["podresources"]
    assert "hostPath" in found["podresources"]


def test_dead_socket_fails_with_unavailable(capsys: pytest.CaptureFixture[str], sockdir: Path,
                                            host_proc: Path, sys_v2: Path) -> None:
    path = str(sockdir / "kubelet.sock")
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(path)  # the file stays after close: a kubelet that died without cleaning up
    dead.close()
    rc, found = run_doctor(capsys, *base_args(path, host_proc, sys_v2))
    assert rc == 1
    assert status(found, "podresources") == "FAIL"
    assert "failed: unavailable" in found["podresources"]
    assert "is the kubelet running" in found["podresources"]


def test_regular_file_is_not_a_socket(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                      host_proc: Path, sys_v2: Path) -> None:
    path = tmp_path / "kubelet.sock"
    path.write_text("")
    rc, found = run_doctor(capsys, *base_args(str(path), host_proc, sys_v2))
    assert rc == 1
    assert "is not a socket" in found["podresources"]


def test_hung_kubelet_hits_the_deadline(capsys: pytest.CaptureFixture[str], kubelet: FakeKubelet,
                                        host_proc: Path, sys_v2: Path) -> None:
    kubelet.hang = True
    args = [*base_args(kubelet.socket_path, host_proc, sys_v2), "--timeout", "300ms"]
    rc, found = run_doctor(capsys, *args)
    assert rc == 1
    assert "failed: deadline-exceeded" in found["podresources"]


# --- cgroup and PID namespace --------------------------------------------------------------


def test_cgroup_v1_and_hybrid(tmp_path: Path) -> None:
    root = tmp_path / "sys"
    for name in ("cpu,cpuacct", "memory", "pids"):
        (root / "fs" / "cgroup" / name).mkdir(parents=True)
    check = doctor.check_cgroup(str(root))
    assert (check.status, check.message) == ("OK", "v1 (cpu,cpuacct, memory, pids)")
    (root / "fs" / "cgroup" / "unified").mkdir()
    assert doctor.check_cgroup(str(root)).message.startswith("hybrid v1/v2")


def test_cgroup_unknown_warns(tmp_path: Path) -> None:
    check = doctor.check_cgroup(str(tmp_path / "nosys"))
    assert check.status == "WARN"
    assert "cannot tell the cgroup version" in check.message


def test_container_pid_namespace_warns(tmp_path: Path) -> None:
    uid = "0f4bb1e6-8c6c-4c5e-9d3a-2b1e5a7c9d10"
    proc = make_proc(tmp_path / "proc", "0::/kubepods.slice/kubepods-besteffort.slice/"
                     f"kubepods-besteffort-pod{uid.replace('-', '_')}.slice/"
                     f"cri-containerd-{'ab' * 32}.scope\n", "gpu-ledger")
    check = doctor.check_hostpid(str(proc))
    assert check.status == "WARN"
    assert f"runs in pod {uid}" in check.message
    assert "hostPID: true" in check.hint


def test_unknown_pid1_in_root_cgroup_warns(tmp_path: Path) -> None:
    # A container with its own cgroup namespace sees its first process at "/".
    check = doctor.check_hostpid(str(make_proc(tmp_path / "proc", "0::/\n", "python3")))
    assert check.status == "WARN"
    assert "'python3', not a host init" in check.message


def test_host_proc_mounted_in_another_namespace_is_ok(tmp_path: Path) -> None:
    proc = make_proc(tmp_path / "proc", "0::/init.scope\n", "systemd", same_ns=False)
    check = doctor.check_hostpid(str(proc))
    assert check.status == "OK"
    assert "mounted into another PID namespace" in check.message


def test_unreadable_proc_warns(tmp_path: Path) -> None:
    check = doctor.check_hostpid(str(tmp_path / "noproc"))
    assert check.status == "WARN"
    assert "cannot read" in check.message


# --- Kubernetes API ------------------------------------------------------------------------


def pod(name: str, node: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ml"}, "spec": {"nodeName": node}}


def test_kubernetes_lists_pods_of_this_node(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                            kubelet: FakeKubelet, host_proc: Path,
                                            sys_v2: Path) -> None:
    with FakeApiServer([pod("a", "n1"), pod("b", "n1"), pod("c", "n2")]) as api:
        kubeconfig = api.kubeconfig(str(tmp_path / "kubeconfig"))
        rc, found = run_doctor(capsys, *base_args(kubelet.socket_path, host_proc, sys_v2),
                               "--kubeconfig", kubeconfig, "--node-name", "n1")
        assert any("fieldSelector=spec.nodeName%3Dn1" in r for r in api.requests)
    assert rc == 0
    assert status(found, "kubernetes") == "OK"
    assert "2 pod(s) on node n1" in found["kubernetes"]


def test_kubernetes_wrong_node_name_warns(tmp_path: Path) -> None:
    with FakeApiServer([pod("a", "n1")]) as api:
        check = doctor.check_kubernetes(api.kubeconfig(str(tmp_path / "kc")), "n9", 2.0)
    assert check.status == "WARN"
    assert "no pod on node 'n9'" in check.message
    assert "--node-name" in check.hint


def test_kubernetes_refusal_names_the_rbac_fix(tmp_path: Path) -> None:
    with FakeApiServer([pod("a", "n1")]) as api:
        path = Path(api.kubeconfig(str(tmp_path / "kc")))
        path.write_text(path.read_text().replace("gpu-ledger-fake-token", "wrong"))
        check = doctor.check_kubernetes(str(path), "n1", 2.0)
    assert check.status == "FAIL"
    assert "refused to list pods: 401" in check.message
    assert "ClusterRole gpu-ledger-exporter" in check.hint


def test_kubernetes_bad_kubeconfig_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "kc"
    path.write_text("clusters: 3\n")
    check = doctor.check_kubernetes(str(path), "n1", 2.0)
    assert check.status == "FAIL"
    assert check.message == f"{path}: current-context: expected the name of a context"


# --- Prometheus ----------------------------------------------------------------------------


def test_prometheus_without_gpu_series_warns() -> None:
    with FakePrometheus({"up": [sample("1")]}) as prom:
        checks = doctor.check_prometheus(prom.url, 2.0)
        assert prom.queries == ["up", "gpu_up"]
    assert [c.status for c in checks] == ["OK", "WARN"]
    assert "no gpu_up series" in checks[1].message
    assert "ServiceMonitor" in checks[1].hint


def test_prometheus_lost_gpu_warns() -> None:
    with FakePrometheus({"up": [sample("1")],
                         "gpu_up": [sample("1", gpu="0"), sample("0", gpu="1")]}) as prom:
        checks = doctor.check_prometheus(prom.url + "/", 2.0)
    assert checks[1].status == "WARN"
    assert "1 of 2 GPU(s) report gpu_up 0" in checks[1].message


def test_prometheus_http_error_fails() -> None:
    with FakePrometheus({}, code=503) as prom:
        checks = doctor.check_prometheus(prom.url, 2.0)
    assert [c.status for c in checks] == ["FAIL"]
    assert "HTTP 503" in checks[0].message


def test_prometheus_not_an_api_answer_fails() -> None:
    with FakePrometheus({}, body={"status": "error", "error": "bad"}) as prom:
        checks = doctor.check_prometheus(prom.url, 2.0)
    assert checks[0].status == "FAIL"
    assert "did not answer like the Prometheus query API" in checks[0].message


def test_prometheus_unreachable_fails() -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    checks = doctor.check_prometheus(f"http://127.0.0.1:{port}", 2.0)
    assert checks[0].status == "FAIL"
    assert "cannot reach" in checks[0].message


# --- usage ---------------------------------------------------------------------------------


def test_bad_timeout_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["doctor", "--timeout", "soon"])
    assert exc.value.code == 2
    assert "--timeout" in capsys.readouterr().err


def test_nvml_error_codes_have_hints() -> None:
    # the hints key on pynvml's own constants, so a renamed constant would fail here
    assert pynvml.NVML_ERROR_LIBRARY_NOT_FOUND in doctor._INIT_HINTS
    assert pynvml.NVML_ERROR_DRIVER_NOT_LOADED in doctor._INIT_HINTS


# --- other vendors' backends ------------------------------------------------------------------


def test_absent_vendor_backends_are_one_line_each(capsys: pytest.CaptureFixture[str],
                                                   kubelet: FakeKubelet, host_proc: Path,
                                                   sys_v2: Path) -> None:
    rc, found = run_doctor(capsys, *base_args(kubelet.socket_path, host_proc, sys_v2))
    assert rc == 0
    for vendor in ("amd", "intel"):
        assert status(found, vendor) == "OK" and "absent: " in found[vendor]
    rc, found = run_doctor(capsys, *base_args(kubelet.socket_path, host_proc, sys_v2),
                           "--device-backend", "nvml,amd")
    assert rc == 1 and status(found, "amd") == "FAIL" and "intel" not in found


def test_other_vendor_read_through_its_backend(monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str],
                                               tmp_path: Path, kubelet: FakeKubelet,
                                               host_proc: Path, sys_v2: Path) -> None:
    """An AMD node: the AMD backend's GPUs are checked (a lost one FAILs); NVML, which does
    not initialise there and has no GPU in sysfs, is absent rather than a failure."""
    from exporter.device import registry
    from exporter.device.contract import DeviceLost, GpuRef, Tally, Telemetry
    from tests.test_device_backends import _Amd

    class LostAmd(_Amd):
        def telemetry(self, gpu: GpuRef, tally: Tally) -> Telemetry:
            raise DeviceLost(gpu.uuid)

    monkeypatch.setitem(registry.PROBES, "amd", lambda spec, auto: _Amd())
    spec = write_scenario(tmp_path, "driver: {unavailable_until: 1h}\n")
    rc, found = run_doctor(capsys, *base_args(kubelet.socket_path, host_proc, sys_v2, spec))
    assert status(found, "nvml") == "OK" and "absent: nvmlInit failed" in found["nvml"]
    assert status(found, "amd") == "OK" and "FakeSMI: 1 GPU(s)" in found["amd"]
    assert status(found, "amd gpu 0") == "OK" and "AMD Instinct MI300X" in found["amd gpu 0"]
    assert rc == 0
    monkeypatch.setitem(registry.PROBES, "amd", lambda spec, auto: LostAmd())
    rc, found = run_doctor(capsys, *base_args(kubelet.socket_path, host_proc, sys_v2, spec))
    assert rc == 1 and status(found, "amd gpu 0") == "FAIL" and "is lost" in found["amd gpu 0"]
    failing = _Amd()
    failing.fail_open = "libamd_smi.so: cannot open shared object file"
    monkeypatch.setitem(registry.PROBES, "amd", lambda spec, auto: failing)
    rc, found = run_doctor(capsys, *base_args(kubelet.socket_path, host_proc, sys_v2, spec))
    assert rc == 1 and status(found, "amd") == "FAIL"
    assert "FakeSMI init failed: libamd_smi.so" in found["amd"]
