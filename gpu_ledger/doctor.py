"""`gpu-ledger doctor`: check what the exporter needs on this node, one line per check.

Each line is OK, WARN or FAIL with what was found and, when it is not OK, what to do. The exit
status is 1 when any check FAILs, else 0 (2 for a usage error). Run it in the exporter's pod
(`kubectl exec ds/gpu-ledger-exporter -- gpu-ledger doctor`) to see the node as the exporter
sees it: same mounts, same user, same PID namespace.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import stat
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exporter.cli import parse_seconds
from exporter.device.contract import DeviceLost, Tally
from exporter.device.registry import NAMES, PROBES, BackendAbsent, LoadSpec, parse_choice
from exporter.errors import ConfigError
from exporter.nvmlcall import NvmlOutcome, classify, error_code
from exporter.pcidevices import nvidia_gpu_functions

OK, WARN, FAIL = "OK", "WARN", "FAIL"
DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
DOCS = "docs/operations.md#troubleshooting"
# PID 1 of a host: anything else seen as PID 1 means a container's own PID namespace.
HOST_INITS = ("systemd", "init")


@dataclass(frozen=True)
class Check:
    status: str  # OK | WARN | FAIL
    name: str
    message: str
    hint: str = ""

    def line(self) -> str:
        text = f"{self.status:<4}  {self.name:<13} {self.message}"
        return f"{text} -- hint: {self.hint}" if self.hint and self.status != OK else text


# --- NVML ----------------------------------------------------------------------------------

# nvml.h return codes (NVML_ERROR_LIBRARY_NOT_FOUND 12, _DRIVER_NOT_LOADED 9, _NO_PERMISSION 4):
# the doctor reads NVML through the NVML backend's typed API, not by importing pynvml
_INIT_HINTS = {
    12:
        "libnvidia-ml.so.1 is not in this container: run it with the NVIDIA container runtime "
        "(runtimeClassName: nvidia where that is a RuntimeClass) and NVIDIA_VISIBLE_DEVICES=all; "
        "on a host, install the NVIDIA driver",
    9:
        "the NVIDIA kernel module is not loaded: check `lsmod | grep nvidia` and dmesg on the "
        "node, or the GPU operator's driver pod",
    4:
        "the /dev/nvidia* device nodes cannot be opened: check the runtime mounts them and "
        "their permissions",
}


def init(nvml: Any) -> Check:
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as err:
        hint = _INIT_HINTS.get(error_code(err), "see dmesg on the node for NVIDIA errors")
        return Check(FAIL, "nvml", f"nvmlInit failed: {err}", hint)
    try:
        version = f"NVML {nvml.nvmlSystemGetNVMLVersion()}"
    except nvml.NVMLError:
        version = "NVML version unknown"
    return Check(OK, "nvml", f"NVML initialised ({version})")


def load(spec: str) -> tuple[Any, Check]:
    """Load and initialise NVML; (module, check) with module None when it failed."""
    from exporter.nvml_loader import load_nvml

    try:
        nvml = load_nvml(spec)
    except ConfigError as err:
        return None, Check(FAIL, "nvml", str(err), "use --nvml real or --nvml sim:SCENARIO.yaml")
    check = init(nvml)
    return (nvml if check.status == OK else None), check


def cuda_version(value: int) -> str:
    """nvmlSystemGetCudaDriverVersion's 12040 -> '12.4'."""
    return f"{value // 1000}.{value % 1000 // 10}"


def check_driver(nvml: Any) -> Check:
    try:
        driver = nvml.nvmlSystemGetDriverVersion()
        cuda = cuda_version(int(nvml.nvmlSystemGetCudaDriverVersion()))
    except nvml.NVMLError as err:
        return Check(WARN, "driver", f"cannot read the driver version: {err}",
                     "the driver answers init but not queries: check dmesg for NVIDIA errors")
    return Check(OK, "driver", f"driver {driver}, CUDA {cuda}")


def _mig_instances(nvml: Any, handle: Any) -> int:
    count = 0
    for i in range(int(nvml.nvmlDeviceGetMaxMigDeviceCount(handle))):
        try:
            nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, i)
        except nvml.NVMLError as err:
            if classify(err).absent:  # an empty MIG slot
                continue
            raise
        count += 1
    return count


def check_gpu(nvml: Any, index: int) -> Check:
    """One GPU: it answers, and its MIG mode is settled (current == pending)."""
    name = f"gpu {index}"
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        model = nvml.nvmlDeviceGetName(handle)
        uuid = nvml.nvmlDeviceGetUUID(handle)
        about = f"{model} {uuid}"
        try:
            current, pending = (int(x) for x in nvml.nvmlDeviceGetMigMode(handle))
        except nvml.NVMLError as err:
            if classify(err) is not NvmlOutcome.UNSUPPORTED:
                raise
            return Check(OK, name, f"{about}, MIG not supported")
        if current != pending:
            state = {0: "disabled", 1: "enabled"}
            return Check(WARN, name,
                         f"{about}, MIG {state.get(current, current)} but "
                         f"{state.get(pending, pending)} is pending",
                         "the change takes effect only after a GPU reset: drain the node, then "
                         f"`nvidia-smi -i {index} -r` or reboot (the MIG manager does this when "
                         "it owns the MIG layout)")
        if not current:
            return Check(OK, name, f"{about}, MIG disabled")
        instances = _mig_instances(nvml, handle)
    except nvml.NVMLError as err:
        if classify(err) is NvmlOutcome.LOST:
            return Check(FAIL, name, "GPU is lost: it fell off the bus (XID 79)",
                         "drain the node and reset the GPU or reboot it; if it recurs, check "
                         "power, cooling and the PCIe slot (docs/runbooks.md#gpulost)")
        return Check(FAIL, name, f"NVML query failed: {err}", "check dmesg for XID errors")
    if instances == 0:
        return Check(WARN, name, f"{about}, MIG enabled but no instance created",
                     "nothing on this GPU can be allocated until GPU and compute instances "
                     "exist: apply a MIG profile (nvidia-smi mig -cgi ... -C, or the MIG "
                     "manager's config label)")
    return Check(OK, name, f"{about}, MIG enabled, {instances} instance(s)")


def check_gpus(nvml: Any) -> list[Check]:
    try:
        count = int(nvml.nvmlDeviceGetCount())
    except nvml.NVMLError as err:
        return [Check(FAIL, "gpus", f"cannot count GPUs: {err}", "check dmesg for NVIDIA errors")]
    if count == 0:
        return [Check(FAIL, "gpus", "NVML sees no GPU",
                      "the runtime mounted no /dev/nvidia*: set NVIDIA_VISIBLE_DEVICES=all and "
                      "check the device plugin accepts it from unprivileged pods "
                      "(accept-nvidia-visible-devices-envvar-when-unprivileged)")]
    return [Check(OK, "gpus", f"{count} GPU(s)")] + [check_gpu(nvml, i) for i in range(count)]


# --- kubelet PodResources --------------------------------------------------------------------

_RPC_HINTS = {
    "unavailable": "nothing answers on the socket: is the kubelet running, and is this its "
                   "socket (mount the host's /var/lib/kubelet/pod-resources)?",
    "deadline-exceeded": "the kubelet did not answer in time: check its health and load",
    "unimplemented": "this kubelet has no PodResources v1 API (Kubernetes 1.20 or later)",
}


def check_podresources(path: str, timeout: float) -> Check:
    name = "podresources"
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return Check(FAIL, name, f"no socket at {path}: pods get no GPU attribution",
                     "mount the host's /var/lib/kubelet/pod-resources read-only (hostPath) "
                     "and pass --pod-resources-socket if the kubelet's root dir differs")
    except OSError as err:
        return Check(FAIL, name, f"cannot stat {path}: {err.strerror}",
                     "run as root or in the socket's group")
    if not stat.S_ISSOCK(st.st_mode):
        return Check(FAIL, name, f"{path} is not a socket",
                     "point --pod-resources-socket at the kubelet's kubelet.sock")
    if not os.access(path, os.W_OK):
        return Check(FAIL, name,
                     f"permission denied: connecting needs write access to {path} (owner "
                     f"uid {st.st_uid}, gid {st.st_gid}, mode {stat.S_IMODE(st.st_mode):o}), "
                     f"running as uid {os.getuid()}",
                     "run as root (runAsUser: 0, no capabilities needed) or in the socket's "
                     "group (supplementalGroups)")
    from exporter.attribution.podresources import PodResourcesClient

    client = PodResourcesClient(path, timeout)
    try:
        allocations = client.poll()
    finally:
        client.close()
    if allocations is None:
        reason = client.status.reason
        return Check(FAIL, name, f"List on {path} failed: {reason}",
                     _RPC_HINTS.get(reason, "check the kubelet's log"))
    pods = {(a.namespace, a.pod) for a in allocations}
    return Check(OK, name, f"List answered: {len(pods)} pod(s) with devices, "
                           f"{len(allocations)} allocation(s); "
                           f"{len(client.allocatable)} allocatable device ID(s)")


# --- cgroups and PID namespace ---------------------------------------------------------------

def check_cgroup(sys_root: str) -> Check:
    root = Path(sys_root) / "fs" / "cgroup"
    unified = root / "cgroup.controllers"
    if unified.is_file():
        controllers = unified.read_text(encoding="utf-8", errors="replace").split()
        return Check(OK, "cgroup", f"v2 (unified hierarchy), controllers: "
                                   f"{' '.join(controllers) or 'none'}")
    try:
        hierarchies = sorted(p.name for p in root.iterdir() if p.is_dir())
    except OSError:
        hierarchies = []
    if hierarchies:
        kind = "hybrid v1/v2" if "unified" in hierarchies else "v1"
        return Check(OK, "cgroup", f"{kind} ({', '.join(hierarchies)})")
    return Check(WARN, "cgroup", f"cannot tell the cgroup version: {root} is empty or missing",
                 "mount /sys (read-only) or pass --sys-root")


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def _ns(path: Path) -> str | None:
    try:
        return os.readlink(path)
    except OSError:
        return None


def check_hostpid(proc_root: str) -> Check:
    """NVML reports host PIDs: only in the host's PID namespace (or with its /proc) can
    /proc/<pid>/cgroup be read for them. PID 1 tells which namespace /proc shows: the host's
    init, or a container's first process."""
    from exporter.attribution.cgroup import parse_cgroup

    name = "hostpid"
    proc = Path(proc_root)
    hint = ("set hostPID: true on the exporter pod (or mount the host's /proc and pass "
            "--proc-root): without it GPU processes cannot be matched to pods")
    cgroup = _read(proc / "1" / "cgroup")
    if cgroup is None:
        return Check(WARN, name, f"cannot read {proc / '1' / 'cgroup'}", hint)
    comm = (_read(proc / "1" / "comm") or "?").strip()
    ref = parse_cgroup(cgroup)
    if ref is not None:
        where = f"pod {ref.pod_uid}" if ref.pod_uid else f"container {ref.container_id[:12]}"
        return Check(WARN, name, f"PID 1 ({comm}) runs in {where}: {proc} shows a container's "
                                 "own PID namespace", hint)
    if comm not in HOST_INITS:
        return Check(WARN, name, f"PID 1 is {comm!r}, not a host init ({', '.join(HOST_INITS)}):"
                                 f" {proc} probably shows a container's own PID namespace", hint)
    own, first = _ns(proc / "self" / "ns" / "pid"), _ns(proc / "1" / "ns" / "pid")
    note = ""
    if own and first and own != first:
        note = f" ({proc} is the host's /proc mounted into another PID namespace)"
    return Check(OK, name, f"PID 1 is the host's {comm}: host PIDs resolve{note}")


# --- Kubernetes API and Prometheus -----------------------------------------------------------

def check_kubernetes(kubeconfig: str | None, node: str, timeout: float) -> Check:
    from exporter.kube.client import ApiClient, ApiError
    from exporter.kube.config import load_credentials

    name = "kubernetes"
    try:
        api = ApiClient(load_credentials(kubeconfig), timeout=timeout)
    except ConfigError as err:
        return Check(FAIL, name, str(err),
                     "pass --kubeconfig PATH, or run in a pod with a service account token")
    host = api.server
    try:
        body = api.get_json("/api/v1/pods", {"fieldSelector": f"spec.nodeName={node}"})
        pods = body.get("items") or []
    except ApiError as err:
        hint = ("bind the ClusterRole gpu-ledger-exporter (get/list/watch pods) to this service "
                "account" if err.status in (401, 403) else "check the API server")
        return Check(FAIL, name, f"{host} refused to list pods: {err.status} {err.reason}", hint)
    except Exception as err:  # connection errors, TLS, bad answers
        return Check(FAIL, name, f"cannot reach {host}: {type(err).__name__}: {err}",
                     "check the API server address and network policy")
    if not pods:
        return Check(WARN, name, f"{host} answers, but lists no pod on node {node!r}",
                     "check --node-name (the DaemonSet sets NODE_NAME from spec.nodeName)")
    return Check(OK, name, f"{host} answers: {len(pods)} pod(s) on node {node}")


def _query(base: str, promql: str, timeout: float) -> list[Any]:
    url = f"{base.rstrip('/')}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        body = json.loads(resp.read())
    if not isinstance(body, dict) or body.get("status") != "success":
        raise ValueError(f"status {body.get('status') if isinstance(body, dict) else body!r}")
    result = (body.get("data") or {}).get("result")
    if not isinstance(result, list):
        raise ValueError("no data.result list")
    return result


def _up_count(series: list[Any]) -> tuple[int, int]:
    values = [s.get("value", [None, ""])[1] for s in series if isinstance(s, dict)]
    return sum(1 for v in values if v == "1"), len(values)


def check_prometheus(url: str, timeout: float) -> list[Check]:
    try:
        up, targets = _up_count(_query(url, "up", timeout))
    except urllib.error.HTTPError as err:
        return [Check(FAIL, "prometheus", f"{url}: HTTP {err.code} {err.reason}",
                      "pass the Prometheus base URL (without /api/v1), with access to query")]
    except (urllib.error.URLError, OSError) as err:
        reason = getattr(err, "reason", err)
        return [Check(FAIL, "prometheus", f"cannot reach {url}: {reason}",
                      "check the URL and that this pod may connect to it")]
    except (ValueError, AttributeError) as err:
        return [Check(FAIL, "prometheus", f"{url} did not answer like the Prometheus query "
                                          f"API: {err}", "pass the Prometheus base URL")]
    checks = [Check(OK, "prometheus", f"{url} answers: {up} of {targets} target(s) up")]
    try:
        good, gpus = _up_count(_query(url, "gpu_up", timeout))
    except (OSError, ValueError, AttributeError) as err:
        return [*checks, Check(FAIL, "gpu_up", f"query gpu_up failed: {err}")]
    if gpus == 0:
        checks.append(Check(WARN, "gpu_up", "no gpu_up series: Prometheus does not scrape the "
                                            "exporter (yet)",
                            "check the ServiceMonitor is selected (serviceMonitorSelector and "
                            "its namespace selector; kube-prometheus-stack wants its release "
                            "label) and the target's state on Prometheus' /targets page"))
    elif good < gpus:
        checks.append(Check(WARN, "gpu_up", f"{gpus - good} of {gpus} GPU(s) report gpu_up 0",
                            "a lost GPU: see the GpuLost runbook (docs/runbooks.md)"))
    else:
        checks.append(Check(OK, "gpu_up", f"{gpus} GPU(s) reporting, all up"))
    return checks


# --- command ---------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gpu-ledger doctor",
        description="Check this node's NVML, driver, GPUs and MIG, the kubelet PodResources "
                    "socket, cgroups and the PID namespace; optionally the Kubernetes API and "
                    "Prometheus. One line per check; exit 1 when any check FAILs.")
    p.add_argument("--nvml", default="real", help="'real' (default) or 'sim:SCENARIO.yaml'")
    p.add_argument("--device-backend", default="auto",
                   help="which vendors' GPUs to check, as the exporter's flag: 'auto' (every "
                        "vendor library or sysfs that answers) or a list of nvml, amd, intel")
    p.add_argument("--pod-resources-socket", default=DEFAULT_SOCKET,
                   help=f"kubelet PodResources socket (default {DEFAULT_SOCKET})")
    p.add_argument("--proc-root", default="/proc", help="procfs to inspect (default /proc)")
    p.add_argument("--sys-root", default="/sys", help="sysfs to inspect (default /sys)")
    p.add_argument("--kubeconfig", default=None,
                   help="check the Kubernetes API with this kubeconfig (in a pod: the service "
                        "account is used when this is not given)")
    p.add_argument("--node-name", default=os.environ.get("NODE_NAME") or socket.gethostname(),
                   help="this node's name (default: $NODE_NAME, else the hostname)")
    p.add_argument("--prometheus", metavar="URL", default=None,
                   help="also check this Prometheus answers and has gpu_up series")
    p.add_argument("--timeout", type=parse_seconds, default=5.0,
                   help="deadline of each kubelet, API and Prometheus call (default 5s)")
    return p


def check_backends(names: tuple[str, ...], spec: LoadSpec) -> tuple[list[Check], bool]:
    """The other vendors' backends (NVML has its own checks above), as the exporter chooses
    them: one line per backend absent or failing, one per GPU read. (checks, any present)."""
    auto = names == ("auto",)
    checks: list[Check] = []
    present = False
    for name in (n for n in (NAMES if auto else names) if n != "nvml"):
        try:
            backend = PROBES[name](spec, auto)
        except BackendAbsent as err:
            checks.append(Check(OK if auto else FAIL, name, f"absent: {err}",
                                f"install the {name} library or drop it from --device-backend"))
            continue
        except ConfigError as err:
            checks.append(Check(FAIL, name, str(err)))
            continue
        present = True
        try:
            backend.open()
        except Exception as err:  # the library's own error: one line, never a traceback
            checks.append(Check(FAIL, name, f"{backend.library} init failed: {err}",
                                f"see docs/backends.md and dmesg for the {name} driver"))
            continue
        try:
            gpus = backend.inventory(None).gpus
            checks.append(Check(OK if gpus else WARN, name,
                                f"{backend.library}: {len(gpus)} GPU(s)",
                                "the library answers but lists no GPU: check the device "
                                "nodes are mounted into this container"))
            for gpu in gpus:
                label = f"{name} gpu {gpu.index}"
                try:
                    backend.telemetry(gpu, Tally())
                except DeviceLost:
                    checks.append(Check(FAIL, label, f"{gpu.model} {gpu.uuid} is lost",
                                        "drain the node and reset the GPU or reboot"))
                else:
                    checks.append(Check(OK, label, f"{gpu.model} {gpu.uuid}"))
        except Exception as err:
            checks.append(Check(FAIL, name, f"{backend.library} query failed: {err}"))
        finally:
            with contextlib.suppress(Exception):
                backend.close()
    return checks, present


def run(args: argparse.Namespace, nvml: Any = None) -> list[Check]:
    """Every check, in order. `nvml`: an already loaded NVML module (tests), else --nvml."""
    checks: list[Check] = []
    try:
        names = parse_choice(args.device_backend)
    except ValueError:
        names = ()
        checks.append(Check(FAIL, "backends", f"--device-backend: expected auto or a list of "
                            f"{', '.join(NAMES)}, got {args.device_backend!r}"))
    spec = LoadSpec(nvml=args.nvml, sysfs_root=args.sys_root, proc_root=args.proc_root)
    others, others_present = check_backends(names, spec) if names else ([], False)
    if names == ("auto",) or "nvml" in names:
        if nvml is None:
            nvml, first = load(args.nvml)
        else:
            first = init(nvml)
            nvml = nvml if first.status == OK else None
        if nvml is None and names == ("auto",) and others_present and \
                not nvidia_gpu_functions(args.sys_root):
            # another vendor's node: NVML failing is its absence, as the exporter sees it
            first = Check(OK, "nvml", f"absent: {first.message}")
        checks.append(first)
        if nvml is not None:
            try:
                checks.append(check_driver(nvml))
                checks += check_gpus(nvml)
            finally:
                with contextlib.suppress(nvml.NVMLError):
                    nvml.nvmlShutdown()
    checks += others
    checks.append(check_podresources(args.pod_resources_socket, args.timeout))
    checks.append(check_cgroup(args.sys_root))
    checks.append(check_hostpid(args.proc_root))
    if args.kubeconfig or os.environ.get("KUBERNETES_SERVICE_HOST"):
        checks.append(check_kubernetes(args.kubeconfig, args.node_name, args.timeout))
    if args.prometheus:
        checks += check_prometheus(args.prometheus, args.timeout)
    return checks


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    checks = run(args)
    for check in checks:
        print(check.line())
    counts = {s: sum(c.status == s for c in checks) for s in (OK, WARN, FAIL)}
    print(f"doctor: {counts[FAIL]} FAIL, {counts[WARN]} WARN, {counts[OK]} OK"
          + (f" (see {DOCS})" if counts[FAIL] or counts[WARN] else ""))
    return 1 if counts[FAIL] else 0
