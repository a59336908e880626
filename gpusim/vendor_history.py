"""AMD and Intel nodes as the metering side sees them: a vendor scenario
(gpusim/scenarios/vendors/*.yaml) turned into the exporter's series over a period, in
OpenMetrics, for the demo history and the metering tests.

The NVIDIA scenarios run the real exporter over SimNVML (gpusim.cluster); the AMD and Intel
backends have simulators of their own (the amdsmi and sysfs ones), which the demo's
simulated cluster does not start yet. Until it does, this writes what those exporters
expose for such a node, in the exporter's contract (docs/metrics.md): `gpu_up`, `gpu_info`
with `vendor`, AMD compute partitions in `gpu_mig_info` (profile `cpx_nps4`, slices 1 of the
mode's partitions), VFs and GVT-g mdevs as `vgpu` allocations of the physical GPU (a VF's
framebuffer share as `gpu_container_memory_fraction`, the VFs enabled as replicas), and the
holders' memory and activity. Metric names are strings here, as in metering: gpusim never
imports the exporter's metric table.

Format (every key commented in the files):

    node: NAME
    gpus:
      - model: AMD Instinct MI300X          # gpu_info's model
        vendor: amd                         # nvidia | amd | intel
        memory: 192GiB
        partitions: {profile: cpx_nps4, count: 8}   # AMD compute partitions, Intel tiles
                                            # ({profile: tile, count: 2}), or
        vfs: 4                              # SR-IOV VFs enabled (MxGPU, Intel), or
        mdevs: [i915-GVTg_V5_4, ...]        # GVT-g mdevs created, by type
    pods:
      - namespace: NS
        name: POD
        labels: {team: T}
        owner: {kind: Deployment, name: NAME}
        hours: [FROM, TO]                   # hours of the period it runs (default: all)
        containers:
          - name: C
            resource: amd.com/cpx_nps4
            unit: {gpu: 0, partition: 3}    # or {gpu: 0}, {gpu: 0, vf: 1}, {gpu: 0, mdev: 0}
            memory: 18GiB                   # memory in use (the unit's, for a VM)
            activity: 0.07                  # 0-1 of the whole GPU
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from exporter.errors import ConfigError
from gpu_ledger import safeyaml
from gpusim.validate import Node, as_list, as_number, as_size, int_range, k8s_name, one_of, ranged

VENDORS = ("nvidia", "amd", "intel")
# AMD compute x memory partitions, and an Intel tile (a Data Center GPU Max subdevice)
_PROFILES = (*(f"{c}_nps{n}" for c in ("spx", "dpx", "tpx", "qpx", "cpx")
               for n in (1, 2, 4, 8)), "tile")


@dataclass(frozen=True)
class Gpu:
    model: str
    vendor: str
    memory: int
    uuid: str
    profile: str = ""  # AMD compute partition profile; "" whole
    partitions: int = 0
    vfs: int = 0
    mdevs: tuple[str, ...] = ()


@dataclass(frozen=True)
class Holder:
    namespace: str
    pod: str
    container: str
    labels: tuple[tuple[str, str], ...]
    owner: tuple[str, str]
    first: int
    last: int | None  # exclusive; None: to the period's end
    resource: str
    gpu: int
    kind: str  # whole | partition | vf | mdev
    index: int
    memory: int
    activity: float


@dataclass(frozen=True)
class VendorScenario:
    node: str
    gpus: tuple[Gpu, ...]
    holders: tuple[Holder, ...]


def _uuid(node: str, i: int, vendor: str) -> str:
    digest = hashlib.sha256(f"{node}/{i}".encode()).hexdigest()
    return f"{vendor.upper()}-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:28]}"


def load_vendor_scenario(path: str | Path) -> VendorScenario:
    """Read and check a vendor scenario; ConfigError names the file and the key."""
    file = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(file, "", "a readable file", e.strerror) from None
    try:
        doc = safeyaml.load(text, file, unique_keys=True)
    except safeyaml.YamlError as e:
        raise ConfigError(file, e.key or e.where, "valid YAML", e.problem) from None
    top = Node(file, "", doc)
    node = top.need("node", k8s_name, "the node's name")
    gpus: list[Gpu] = []
    for i, raw in enumerate(top.need("gpus", as_list, "a list of GPUs")):
        g = Node(file, f"gpus[{i}]", raw)
        vendor = g.need("vendor", one_of(VENDORS), "the GPU's vendor")
        model = g.need("model", _text, "the GPU's model name")
        memory = g.need("memory", as_size, "the GPU's memory, e.g. 192GiB")
        profile, count = "", 0
        if g.has("partitions"):
            p = Node(file, g.key("partitions"), g.raw("partitions"))
            profile = p.need("profile", one_of(_PROFILES), "a partition profile like cpx_nps4")
            count = p.need("count", int_range(1, 64), "the partitions of the mode")
            p.done()
        vfs = g.get("vfs", int_range(1, 64), 0)
        mdevs = tuple(_text(file, g.key(f"mdevs[{j}]"), t)
                      for j, t in enumerate(g.get("mdevs", as_list, [])))
        g.done()
        gpus.append(Gpu(model, vendor, memory, _uuid(node, i, vendor), profile, count, vfs,
                        mdevs))
    holders: list[Holder] = []
    for i, raw in enumerate(top.get("pods", as_list, [])):
        p = Node(file, f"pods[{i}]", raw)
        ns = p.need("namespace", k8s_name, "the pod's namespace")
        pod = p.need("name", k8s_name, "the pod's name")
        labels = tuple(sorted((str(k), str(v)) for k, v in
                              (p.get("labels", _mapping, {}) or {}).items()))
        owner = ("", "")
        if p.has("owner"):
            o = Node(file, p.key("owner"), p.raw("owner"))
            owner = (o.need("kind", _text, "the controller's kind"),
                     o.need("name", _text, "the controller's name"))
            o.done()
        hours = p.get("hours", as_list, None)
        first, last = (0, None) if hours is None else _hours(file, p.key("hours"), hours)
        for j, craw in enumerate(p.need("containers", as_list, "a list of containers")):
            c = Node(file, p.key(f"containers[{j}]"), craw)
            name = c.need("name", k8s_name, "the container's name")
            resource = c.need("resource", _text, "the resource it holds, e.g. amd.com/gpu")
            u = Node(file, c.key("unit"), c.raw("unit"))
            gi = u.need("gpu", int_range(0, len(gpus) - 1), "a GPU index of this node")
            kind, index = "whole", 0
            for k in ("partition", "vf", "mdev"):
                if u.has(k):
                    kind = k
                    index = u.need(k, int_range(0, _units(gpus[gi], k) - 1),
                                   f"a {k} index of gpus[{gi}]")
            u.done()
            holders.append(Holder(
                ns, pod, name, labels, owner, first, last, resource, gi, kind, index,
                c.get("memory", as_size, 0), c.get("activity", ranged(0, 1, as_number), 0.0)))
            c.done()
        p.done()
    top.done()
    return VendorScenario(node, tuple(gpus), tuple(holders))


def _text(file: str, key: str, v: object) -> str:
    if not isinstance(v, str) or not v.strip():
        raise ConfigError(file, key, "a non-empty string", v)
    return v


def _mapping(file: str, key: str, v: object) -> dict[object, object]:
    if not isinstance(v, dict):
        raise ConfigError(file, key, "a mapping", v)
    return v


def _hours(file: str, key: str, v: list[object]) -> tuple[int, int]:
    if len(v) != 2 or not all(isinstance(h, int) and not isinstance(h, bool) and h >= 0
                              for h in v) or int(str(v[0])) >= int(str(v[1])):
        raise ConfigError(file, key, "[first hour, end hour) with first < end", v)
    return int(str(v[0])), int(str(v[1]))


def _units(gpu: Gpu, kind: str) -> int:
    return {"partition": gpu.partitions, "vf": gpu.vfs, "mdev": len(gpu.mdevs)}[kind]


def _labels(pairs: list[tuple[str, str]]) -> str:
    return ",".join(f'{k}="{v}"' for k, v in pairs)


# One series: (metric name, its labels in order, the pod's Kubernetes labels, value). The pod
# labels stay apart, as raw keys, so a writer can name them as kube-state-metrics does.
Row = tuple[str, tuple[tuple[str, str], ...], tuple[tuple[str, str], ...], float]


def rows_at(sc: VendorScenario, hour: int) -> list[Row]:
    """The exporter's series of the node in `hour` of the period."""
    out: list[Row] = []
    for i, g in enumerate(sc.gpus):
        dev = (("node", sc.node), ("gpu", str(i)), ("uuid", g.uuid), ("model", g.model),
               ("vendor", g.vendor))
        out.append(("gpu_up", dev, (), 1.0))
        mode = "enabled" if g.partitions else "disabled"
        out.append(("gpu_info", (*dev, ("mig_mode", mode)), (), 1.0))
        for p in range(g.partitions):
            part = (*dev, ("mig_uuid", f"{g.uuid}-p{p}"), ("gpu_instance_id", str(p)),
                    ("compute_instance_id", "0"), ("profile", g.profile), ("slices", "1"),
                    ("parent_slices", str(g.partitions)))
            out.append(("gpu_mig_info", part, (), 1.0))
    for h in sc.holders:
        if hour < h.first or (h.last is not None and hour >= h.last):
            continue
        g = sc.gpus[h.gpu]
        unit = f"{g.uuid}-p{h.index}" if h.kind == "partition" else ""
        sharing = {"whole": "exclusive", "partition": "mig"}.get(h.kind, "vgpu")
        replicas = g.vfs if h.kind == "vf" else 1
        key = (("node", sc.node), ("namespace", h.namespace), ("pod", h.pod),
               ("container", h.container), ("uuid", g.uuid), ("mig_uuid", unit))
        alloc = (*key, ("resource", h.resource), ("sharing", sharing),
                 ("replicas", str(replicas)), ("owner_kind", h.owner[0]),
                 ("owner_name", h.owner[1]))
        out.append(("gpu_container_allocation", alloc, h.labels, 1.0))
        out.append(("gpu_container_memory_used_bytes", key, h.labels, float(h.memory)))
        if h.kind != "partition":  # per-process activity of a whole GPU, a VF, an mdev
            out.append(("gpu_container_sm_utilization_ratio", key, h.labels, h.activity))
        if h.kind == "vf":  # MxGPU and Intel split the framebuffer evenly between the VFs
            out.append(("gpu_container_memory_fraction", key, h.labels, 1.0 / g.vfs))
    return out


def series_at(sc: VendorScenario, hour: int) -> list[tuple[str, float]]:
    """The exporter's series of the node in `hour` of the period, as (name{labels}, value)."""
    return [(f"{name}{{{_labels([*labels, *map(_pod_label, pod)])}}}", value)
            for name, labels, pod, value in rows_at(sc, hour)]


def _pod_label(pair: tuple[str, str]) -> tuple[str, str]:
    """As kube-state-metrics and the exporter name a pod label: label_kubevirt_io."""
    return "label_" + re.sub(r"[^A-Za-z0-9_]", "_", pair[0]), pair[1]


def openmetrics(paths: list[str | Path], start: int, hours: int, step: int) -> str:
    """The scenarios' series for `hours` hours from `start` (unix seconds, on the hour), a
    sample every `step` seconds, as an OpenMetrics text ending in # EOF."""
    scenarios = [load_vendor_scenario(p) for p in paths]
    lines: list[str] = []
    for hour in range(hours):
        now = [s for sc in scenarios for s in series_at(sc, hour)]
        for k in range(step, 3601, step):
            t = start + hour * 3600 + k
            lines += [f"{name} {value:g} {t}" for name, value in now]
    return "\n".join(lines) + "\n# EOF\n"
