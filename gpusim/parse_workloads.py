"""The workload sections of a scenario: pods and their containers and processes, host
processes, faults and XIDs."""

from __future__ import annotations

from exporter.errors import ConfigError
from gpusim.model import (
    FAULT_KINDS,
    FIELDS,
    NVLINK_ERROR_TYPES,
    QOS_CLASSES,
    THROTTLE_REASONS,
    ClaimSpec,
    ContainerSpec,
    Fault,
    GpuSpec,
    HostProcessSpec,
    PodSpec,
    ProcessSpec,
    UnitRef,
    XidSpec,
)
from gpusim.parse_sharing import grant_unit, vgpu_unit
from gpusim.signal import Signal
from gpusim.validate import (
    MAX_EXPLICIT_PID,
    Node,
    as_bool,
    as_duration,
    as_int,
    as_list,
    as_nonneg_int,
    as_str,
    int_range,
    k8s_name,
    one_of,
    ratio_signal,
    show,
    size_signal,
    uuid_with_prefix,
)


def _unit(file: str, key: str, raw: object, gpus: tuple[GpuSpec, ...]) -> UnitRef:
    if isinstance(raw, int) and not isinstance(raw, bool):
        ref = UnitRef(gpu=raw)
        n = None
    else:
        n = Node(file, key, raw)
        g = n.need("gpu", as_int, "a GPU index")
        if 0 <= g < len(gpus) and gpus[g].allocation in ("hami", "gpushare"):
            ref = grant_unit(file, key, n, gpus[g])
            n.done()
            return ref
        if 0 <= g < len(gpus) and gpus[g].vgpus:
            ref = vgpu_unit(file, key, n, gpus[g])
            n.done()
            return ref
        ref = UnitRef(gpu=g, mig=n.get("mig", as_nonneg_int, None),
                      replica=n.get("replica", as_nonneg_int, None))
        n.done()
    gkey = f"{key}.gpu" if n is not None else key
    if not 0 <= ref.gpu < len(gpus):
        raise ConfigError(file, gkey, f"a GPU index 0..{len(gpus) - 1}", ref.gpu)
    gpu = gpus[ref.gpu]
    if gpu.allocation == "dra":
        raise ConfigError(file, gkey, f"a device plugin GPU: GPU {ref.gpu} has allocation dra "
                          "(list it in resource_claims and the claim under claims)", raw)
    if gpu.allocation != "device-plugin":
        raise ConfigError(file, key, f"a grant {{gpu: {ref.gpu}, memory: ...}}: GPU {ref.gpu} "
                          f"has allocation {gpu.allocation}", raw)
    if gpu.vgpus:
        raise ConfigError(file, key, f"a vGPU instance {{gpu: {ref.gpu}, vgpu: N}}: GPU "
                          f"{ref.gpu} is a vGPU host", raw)
    sharing = gpu.sharing
    if ref.mig is not None:
        if gpu.mig is None:
            raise ConfigError(file, f"{key}.mig", f"no mig: GPU {ref.gpu} has MIG disabled",
                              ref.mig)
        if ref.mig >= len(gpu.mig):
            raise ConfigError(file, f"{key}.mig",
                              f"a MIG instance index 0..{len(gpu.mig) - 1} of GPU {ref.gpu}",
                              ref.mig)
        sharing = gpu.mig[ref.mig].sharing
    elif gpu.mig is not None:
        raise ConfigError(file, gkey, f"a MIG instance ({{gpu: {ref.gpu}, mig: N}}): GPU "
                          f"{ref.gpu} has MIG enabled", raw)
    if sharing.mode == "exclusive":
        if ref.replica is not None:
            raise ConfigError(file, f"{key}.replica", "no replica: the device is not shared",
                              ref.replica)
    elif ref.replica is None:
        raise ConfigError(file, key, f"a replica ({{..., replica: N}}): the device is shared "
                          f"({sharing.mode})", raw)
    elif ref.replica >= sharing.replicas:
        raise ConfigError(file, f"{key}.replica", f"a replica 0..{sharing.replicas - 1}",
                          ref.replica)
    return ref


def _parse_process(file: str, key: str, raw: object, n_units: int) -> ProcessSpec:
    n = Node(file, key, raw)
    p = ProcessSpec(
        name=n.get("name", as_str, "python"),
        memory=n.need("memory", size_signal, "a size like 4GiB"),
        sm_util=n.get("sm_util", ratio_signal, Signal.const(0.0)),
        mem_util=n.get("mem_util", ratio_signal, None),
        tensor_util=n.get("tensor_util", ratio_signal, None),
        pid=n.get("pid", int_range(1, MAX_EXPLICIT_PID), None),
        unit=n.get("unit", as_nonneg_int, None),
    )
    n.done()
    if p.unit is not None and p.unit >= n_units:
        raise ConfigError(file, f"{key}.unit", f"an index into the container's gpus "
                          f"0..{n_units - 1}", p.unit)
    return p


def _parse_container(file: str, key: str, raw: object, gpus: tuple[GpuSpec, ...],
                     namespace: str, claims: dict[tuple[str, str], ClaimSpec]) -> ContainerSpec:
    n = Node(file, key, raw)
    name = n.need("name", k8s_name, "a container name")
    units = tuple(_unit(file, f"{key}.gpus[{i}]", u, gpus)
                  for i, u in enumerate(n.get("gpus", as_list, [])))
    # A claim's devices follow the container's own units (process `unit` counts them too).
    for i, c in enumerate(n.get("claims", as_list, [])):
        claim = claims.get((namespace, c)) if isinstance(c, str) else None
        if claim is None:
            known = sorted(name for ns, name in claims if ns == namespace)
            raise ConfigError(file, f"{key}.claims[{i}]", "the name of a resource_claims entry "
                              f"in namespace {namespace} ({', '.join(known) or 'none'})", c)
        units += claim.units
    resource = n.get("resource", as_str, "")
    procs = tuple(_parse_process(file, f"{key}.processes[{i}]", p, len(units))
                  for i, p in enumerate(n.get("processes", as_list, [])))
    n.done()
    if procs and not units:
        raise ConfigError(file, f"{key}.gpus", "at least one GPU for a container with processes",
                          "[]")
    if procs and any(u.vgpu is not None for u in units):
        raise ConfigError(file, f"{key}.processes", "no processes with a vGPU (they run in the "
                          "VM, where the host's NVML does not see them)", "[...]")
    return ContainerSpec(name, units, resource, procs)


def parse_pod(file: str, i: int, raw: object, gpus: tuple[GpuSpec, ...],
              claims: tuple[ClaimSpec, ...] = ()) -> PodSpec:
    key = f"pods[{i}]"
    n = Node(file, key, raw)
    namespace = n.need("namespace", k8s_name, "a namespace")
    by_name = {(c.namespace, c.name): c for c in claims}
    labels_raw = n.get("labels", lambda f, k, v: Node(f, k, v).data, {})
    labels: list[tuple[str, str]] = []
    for lk, lv in labels_raw.items():
        if not isinstance(lk, str) or not isinstance(lv, str | int | float | bool):
            raise ConfigError(file, f"{key}.labels.{lk}", "a string label value", show(lv))
        labels.append((lk, str(lv).lower() if isinstance(lv, bool) else str(lv)))
    start = n.get("start", as_duration, 0.0)
    end = n.get("end", as_duration, None)
    repeat = n.get("repeat", as_duration, None)
    owner_raw = n.get("owner", lambda f, k, v: Node(f, k, v), None)
    owner = ("", "")
    if owner_raw is not None:
        owner = (owner_raw.need("kind", as_str, "a controller kind like Deployment or Job"),
                 owner_raw.need("name", k8s_name, "the controller's name"))
        owner_raw.done()
    pod = PodSpec(
        index=i,
        namespace=namespace,
        name=n.need("name", k8s_name, "a pod name"),
        uid=n.get("uid", uuid_with_prefix(""), ""),
        labels=tuple(sorted(labels)),
        qos=n.get("qos", one_of(QOS_CLASSES), "burstable"),
        start=start, end=end, repeat=repeat,
        containers=tuple(_parse_container(file, f"{key}.containers[{j}]", c, gpus, namespace,
                                          by_name)
                         for j, c in enumerate(n.need("containers", as_list, "a list"))),
        owner=owner,
    )
    n.done()
    if end is not None and end <= start:
        raise ConfigError(file, f"{key}.end", "a time after start", n.data.get("end"))
    if repeat is not None:
        if end is None:
            raise ConfigError(file, f"{key}.end", "an end time when repeat is set", None)
        if repeat <= 0 or end - start > repeat:
            raise ConfigError(file, f"{key}.repeat", "a period >= end - start (runs of a "
                              "repeating pod never overlap)", n.data.get("repeat"))
        if pod.uid:
            raise ConfigError(file, f"{key}.uid", "no uid on a repeating pod (each run gets "
                              "its own)", pod.uid)
    if not pod.containers:
        raise ConfigError(file, f"{key}.containers", "at least one container", "[]")
    _check_gpushare(file, key, pod, gpus)
    return pod


def _check_gpushare(file: str, key: str, pod: PodSpec, gpus: tuple[GpuSpec, ...]) -> None:
    """gpushare records one grant per pod (ALIYUN_COM_GPU_MEM_*), for its first container."""
    found = [(ci, ui) for ci, c in enumerate(pod.containers) for ui, u in enumerate(c.units)
             if u.is_grant and gpus[u.gpu].allocation == "gpushare"]
    if len(found) > 1 or (found and found[0][0] != 0):
        ci, ui = found[-1]
        raise ConfigError(file, f"{key}.containers[{ci}].gpus[{ui}]", "one gpushare grant per "
                          "pod, in its first container (gpushare annotates the pod once)",
                          f"gpu {pod.containers[ci].units[ui].gpu}")


def parse_host_process(file: str, i: int, raw: object,
                        gpus: tuple[GpuSpec, ...]) -> HostProcessSpec:
    key = f"host_processes[{i}]"
    n = Node(file, key, raw)
    name = n.need("name", k8s_name, "a process (service) name")
    gpu = n.need("gpu", lambda f, k, v: _gpu_index(f, k, v, gpus), "a GPU index")
    mig = n.get("mig", as_nonneg_int, None)
    migs = gpus[gpu].mig
    if mig is not None and (migs is None or mig >= len(migs)):
        raise ConfigError(file, f"{key}.mig", f"a MIG instance index of GPU {gpu}", mig)
    if mig is None and migs is not None:
        raise ConfigError(file, f"{key}.mig", f"a MIG instance: GPU {gpu} has MIG enabled", None)
    hp = HostProcessSpec(
        name=name, gpu=gpu, mig=mig,
        pid=n.get("pid", int_range(1, MAX_EXPLICIT_PID), None),
        memory=n.need("memory", size_signal, "a size like 1GiB"),
        sm_util=n.get("sm_util", ratio_signal, Signal.const(0.0)),
        start=n.get("start", as_duration, 0.0), end=n.get("end", as_duration, None),
    )
    n.done()
    return hp


def _gpu_index(file: str, key: str, raw: object, gpus: tuple[GpuSpec, ...]) -> int:
    g = as_int(file, key, raw)
    if not 0 <= g < len(gpus):
        raise ConfigError(file, key, f"a GPU index 0..{len(gpus) - 1}", g)
    return g


def parse_fault(file: str, i: int, raw: object, gpus: tuple[GpuSpec, ...]) -> Fault:
    key = f"faults[{i}]"
    n = Node(file, key, raw)
    kind = n.need("kind", one_of(FAULT_KINDS), "a fault kind")
    gpu = n.need("gpu", lambda f, k, v: _gpu_index(f, k, v, gpus), "a GPU index")
    at = n.get("at", as_duration, 0.0)
    until = None
    if (n.has("until") or n.has("duration")) and \
            kind not in ("throttle", "not_supported", "nvlink_down"):
        raise ConfigError(file, f"{key}.until", f"no end for a {kind} fault", None)
    if n.has("until"):
        until = n.get("until", as_duration, None)
    if n.has("duration"):
        if until is not None:
            raise ConfigError(file, f"{key}.duration", "either until or duration", None)
        until = at + n.get("duration", as_duration, 0.0)
    f = Fault(kind=kind, gpu=gpu, at=at, until=until)
    if kind == "not_supported":
        f = Fault(kind, gpu, at, until,
                  field=n.need("field", one_of(tuple(FIELDS)), "a reading name"))
    elif kind == "throttle":
        f = Fault(kind, gpu, at, until,
                  reason=n.need("reason", one_of(THROTTLE_REASONS), "a throttle reason"))
        if until is None:
            raise ConfigError(file, f"{key}.duration", "a duration (or until) for a throttle "
                              "window", None)
    elif kind == "ecc":
        f = Fault(kind, gpu, at, corrected=n.get("corrected", as_nonneg_int, 0),
                  uncorrected=n.get("uncorrected", as_nonneg_int, 0))
    elif kind == "row_remap":
        f = Fault(kind, gpu, at, corrected=n.get("correctable", as_nonneg_int, 0),
                  uncorrected=n.get("uncorrectable", as_nonneg_int, 0),
                  pending=n.get("pending", as_bool, False),
                  failure=n.get("failure", as_bool, False))
    elif kind == "pcie_replay":
        f = Fault(kind, gpu, at, count=n.need("count", as_nonneg_int, "a count"))
    elif kind in ("nvlink_error", "nvlink_down"):
        link = n.need("link", as_nonneg_int, "an NVLink link number")
        if link >= gpus[gpu].nvlink_links:
            raise ConfigError(file, f"{key}.link",
                              f"a link 0..{gpus[gpu].nvlink_links - 1} of GPU {gpu}", link)
        if kind == "nvlink_error":
            f = Fault(kind, gpu, at, link=link,
                      error_type=n.need("type", one_of(NVLINK_ERROR_TYPES), "an error type"),
                      count=n.need("count", as_nonneg_int, "a count"))
        else:
            f = Fault(kind, gpu, at, until, link=link)
    n.done()
    if f.until is not None and f.until <= f.at:
        raise ConfigError(file, f"{key}.until", "a time after at", f.until)
    return f


def parse_xid(file: str, i: int, raw: object, gpus: tuple[GpuSpec, ...]) -> XidSpec:
    key = f"xids[{i}]"
    n = Node(file, key, raw)
    gpu = n.need("gpu", lambda f, k, v: _gpu_index(f, k, v, gpus), "a GPU index")
    x = XidSpec(gpu=gpu, at=n.need("at", as_duration, "a duration"),
                xid=n.need("xid", int_range(1, 1000), "an XID code"),
                mig=n.get("mig", as_nonneg_int, None))
    n.done()
    migs = gpus[gpu].mig
    if x.mig is not None and (migs is None or x.mig >= len(migs)):
        raise ConfigError(file, f"{key}.mig", f"a MIG instance index of GPU {gpu}", x.mig)
    return XidSpec(x.gpu, x.at, int(x.xid), x.mig)
