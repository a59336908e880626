"""AMD and Intel nodes for the simulated cluster: a vendor scenario
(gpusim/scenarios/vendors/*.yaml) describes the node's GPUs and the pods holding them;
gpusim.vendor_node turns it into the simulated vendor library (amdsmi, or the Intel sysfs tree
and Level Zero), the sysfs and /proc the exporter reads and the device plugins' IDs, and
gpusim.cluster runs the real exporter (AmdBackend, IntelBackend, PodResources, attribution)
over it, as for the NVIDIA scenarios.

Format (every key commented in the files):

    node: NAME
    gpus:
      - model: AMD Instinct MI300X          # gpu_info's model
        vendor: amd                         # amd | intel
        memory: 192GiB
        partitions: {profile: cpx_nps4, count: 8}   # AMD compute partitions, Intel tiles
                                            # ({profile: tile, count: 2}), or
        vfs: 4                              # SR-IOV VFs enabled (MxGPU, Intel), or
        mdevs: [i915-GVTg_V5_4, ...]        # GVT-g mdevs created, by type, or
        shared: 2                           # Intel: the GPU plugin's -shared-dev-num
    pods:
      - namespace: NS
        name: POD
        labels: {team: T}
        owner: {kind: Deployment, name: NAME}
        hours: [FROM, TO]                   # hours of the period it runs (default: all)
        containers:
          - name: C
            resource: amd.com/cpx_nps4      # the device plugin's resource name
            unit: {gpu: 0, partition: 3}    # or {gpu: 0}, {gpu: 0, vf: 1}, {gpu: 0, mdev: 0}
                                            # (an Intel tile: GAS's gas-container-tiles)
            memory: 18GiB                   # memory in use (the unit's, for a VM)
            activity: 0.07                  # 0-1 of the unit it holds
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from exporter.errors import ConfigError
from gpu_ledger import safeyaml
from gpusim.validate import Node, as_list, as_number, as_size, int_range, k8s_name, one_of, ranged

VENDORS = ("amd", "intel")  # NVIDIA nodes are SimNVML scenarios (gpusim/scenario.py)
_GVT_TYPE = re.compile(r"i915-GVTg_V[0-9]{1,2}_(1|2|4|8)")
# AMD compute x memory partitions, and an Intel tile (a Data Center GPU Max subdevice)
TILE = "tile"
_PROFILES = (*(f"{c}_nps{n}" for c in ("spx", "dpx", "tpx", "qpx", "cpx")
               for n in (1, 2, 4, 8)), TILE)


@dataclass(frozen=True)
class Gpu:
    model: str
    vendor: str
    memory: int
    profile: str = ""  # AMD compute partition profile, or TILE (Intel); "" whole
    partitions: int = 0
    vfs: int = 0
    mdevs: tuple[str, ...] = ()
    shared: int = 1  # Intel GPU plugin -shared-dev-num: pods sharing the whole GPU


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
            if (profile == TILE) != (vendor == "intel"):
                raise ConfigError(file, p.key("profile"), "tile on Intel, a compute partition "
                                  "profile on AMD", profile)
            if profile == TILE:  # a Max 1550 has two, a Max 1100 one (no subdevices)
                want = count if 2 <= count <= 4 else 2
            else:
                want = {"spx": 1, "dpx": 2, "tpx": 3, "qpx": 4, "cpx": 8}[  # MI300X XCDs: 8
                    profile.split("_")[0]]
            if count != want:
                raise ConfigError(file, p.key("count"), f"{want} partitions for {profile}",
                                  count)
            p.done()
        vfs = g.get("vfs", int_range(1, 64), 0)
        mdevs = tuple(_gvt_type(file, g.key(f"mdevs[{j}]"), t)
                      for j, t in enumerate(g.get("mdevs", as_list, [])))
        shared = g.get("shared", int_range(1, 64), 1)
        if shared > 1 and (vendor != "intel" or vfs or mdevs or count):
            raise ConfigError(file, g.key("shared"), "an Intel GPU without VFs, mdevs or tiles",
                              shared)
        g.done()
        gpus.append(Gpu(model, vendor, memory, profile, count, vfs, mdevs, shared))
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
    for gi, gpu in enumerate(gpus):
        whole = sum(1 for h in holders if h.gpu == gi and h.kind == "whole")
        if whole > gpu.shared:
            raise ConfigError(file, f"gpus[{gi}]", f"at most shared: {gpu.shared} pods on the "
                              "whole GPU", f"{whole} pods")
    if len({g.vendor for g in gpus}) > 1:
        raise ConfigError(file, "gpus", "GPUs of one vendor (one backend per node here)",
                          ",".join(sorted({g.vendor for g in gpus})))
    return VendorScenario(node, tuple(gpus), tuple(holders))


def _text(file: str, key: str, v: object) -> str:
    if not isinstance(v, str) or not v.strip():
        raise ConfigError(file, key, "a non-empty string", v)
    return v


def _gvt_type(file: str, key: str, v: object) -> str:
    if not isinstance(v, str) or not _GVT_TYPE.fullmatch(v):
        raise ConfigError(file, key, "a GVT-g type i915-GVTg_V<gen>_<1|2|4|8>", v)
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
