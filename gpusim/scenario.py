"""Scenario files for the simulated node: load a YAML file, validate every key, and return the
frozen model (gpusim.model) that the simulated NVML module and the Kubernetes side share.

Every error is a ConfigError naming the file, the key path and what was expected.
docs/scenarios.md describes the format.
"""

from __future__ import annotations

from pathlib import Path

from exporter.errors import ConfigError
from gpu_ledger import safeyaml
from gpusim.consistency import check_pids, check_pod_names, check_units, process_slots
from gpusim.model import DEVICE_ID_STRATEGIES, Scenario
from gpusim.parse_gpus import parse_gpus
from gpusim.parse_sharing import parse_claims
from gpusim.parse_workloads import parse_fault, parse_host_process, parse_pod, parse_xid
from gpusim.validate import (
    Node,
    as_bool,
    as_duration,
    as_list,
    as_nonneg_int,
    as_str,
    k8s_name,
    one_of,
)


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario file. Raises ConfigError for anything malformed."""
    file = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError(file, "", "a readable scenario file", err.strerror) from None
    return loads_scenario(text, file)


def loads_scenario(text: str, file: str = "<scenario>") -> Scenario:
    try:  # the shared loader: alias bombs and deep nesting are refused, naming the key
        data = safeyaml.load(text, file)
    except safeyaml.YamlError as err:
        if err.key:
            raise ConfigError.from_yaml(err) from None
        where = f" ({err.where})" if err.where else ""
        raise ConfigError(file, "", f"valid YAML{where}", err.problem) from None
    return parse_scenario(data, file)


def parse_scenario(data: object, file: str = "<scenario>") -> Scenario:
    top = Node(file, "", data)
    node = top.need("node", k8s_name, "the node name")
    driver_version = top.get("driver_version", lambda f, k, v: as_str(f, k, str(v)), "550.54.15")
    cuda_version = top.get("cuda_version", as_nonneg_int, 12040)
    duration = top.get("duration", as_duration, None)
    mig_strategy = top.get("mig_strategy", one_of(("mixed", "single")), "mixed")
    cgroup_driver = top.get("cgroup_driver", one_of(("systemd", "cgroupfs")), "systemd")
    runtime = top.get("container_runtime", one_of(("containerd", "cri-o")), "containerd")
    unavailable, driver_error = 0.0, "driver_not_loaded"
    if top.has("driver") and top.raw("driver") is not None:
        d = Node(file, "driver", top.raw("driver"))
        unavailable = d.get("unavailable_until", as_duration, 0.0)
        driver_error = d.get("error", one_of(("driver_not_loaded", "library_not_found")),
                             "driver_not_loaded")
        d.done()
    top.read.add("driver")

    strategy = top.get("device_id_strategy", one_of(DEVICE_ID_STRATEGIES), "uuid")
    gpus = parse_gpus(file, node, top.need("gpus", as_list, "a list of GPUs"))
    n_gpus = len(gpus)
    claims = parse_claims(file, top.get("resource_claims", as_list, []), gpus)
    slices = top.get("resource_slices", as_bool, True)
    pods = tuple(parse_pod(file, i, p, gpus, claims)
                 for i, p in enumerate(top.get("pods", as_list, [])))
    hosts = tuple(parse_host_process(file, i, p, gpus)
                  for i, p in enumerate(top.get("host_processes", as_list, [])))
    faults = tuple(parse_fault(file, i, f, gpus)
                   for i, f in enumerate(top.get("faults", as_list, [])))
    xids = tuple(parse_xid(file, i, x, gpus)
                 for i, x in enumerate(top.get("xids", as_list, [])))
    top.done()
    if n_gpus == 0:
        raise ConfigError(file, "gpus", "at least one GPU", "[]")
    check_pod_names(file, pods)
    check_units(file, pods, gpus)
    check_pids(file, pods, hosts)
    slots = sum(process_slots(c) for p in pods for c in p.containers) + len(hosts)
    return Scenario(
        file=file, node=node, driver_version=driver_version, cuda_version=cuda_version,
        gpus=gpus, pods=pods, host_processes=hosts, faults=faults, xids=xids,
        driver_unavailable_until=unavailable, driver_error=driver_error,
        mig_strategy=mig_strategy, cgroup_driver=cgroup_driver, container_runtime=runtime,
        duration=duration, process_count=slots, device_id_strategy=strategy, claims=claims,
        resource_slices=slices,
    )
