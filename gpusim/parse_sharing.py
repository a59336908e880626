"""How pods get GPUs besides the device plugin's IDs: DRA ResourceClaims (`resource_claims`)
and the fractional grants of HAMi and gpushare (`{gpu, memory, cores}` units), checked
against each GPU's `allocation`."""

from __future__ import annotations

from exporter.errors import ConfigError
from gpusim.model import CLAIM_SHARING, ClaimSpec, GpuSpec, UnitRef
from gpusim.validate import (
    Node,
    as_int,
    as_list,
    as_nonneg_int,
    as_size,
    int_range,
    k8s_name,
    one_of,
)

GIB = 1 << 30


def _gpu(file: str, key: str, g: int, gpus: tuple[GpuSpec, ...]) -> GpuSpec:
    if not 0 <= g < len(gpus):
        raise ConfigError(file, key, f"a GPU index 0..{len(gpus) - 1}", g)
    return gpus[g]


def claim_unit(file: str, key: str, raw: object, gpus: tuple[GpuSpec, ...],
               claim: str) -> UnitRef:
    """A device of a ResourceClaim: a GPU index or `{gpu, mig}` on a GPU with allocation dra."""
    if isinstance(raw, int) and not isinstance(raw, bool):
        g, mig, gkey = raw, None, key
    else:
        n = Node(file, key, raw)
        g = n.need("gpu", as_int, "a GPU index")
        mig = n.get("mig", as_nonneg_int, None)
        n.done()
        gkey = f"{key}.gpu"
    gpu = _gpu(file, gkey, g, gpus)
    if gpu.allocation != "dra":
        raise ConfigError(file, gkey, f"a GPU with allocation: dra (GPU {g} is handed out by "
                          f"{gpu.allocation})", g)
    if mig is not None and (gpu.mig is None or mig >= len(gpu.mig)):
        raise ConfigError(file, f"{key}.mig", f"a MIG instance index of GPU {g}", mig)
    if mig is None and gpu.mig is not None:
        raise ConfigError(file, gkey, f"a MIG instance ({{gpu: {g}, mig: N}}): GPU {g} has "
                          "MIG enabled", raw)
    return UnitRef(gpu=g, mig=mig, claim=claim)


def parse_claims(file: str, items: list[object],
                 gpus: tuple[GpuSpec, ...]) -> tuple[ClaimSpec, ...]:
    out: list[ClaimSpec] = []
    seen: set[tuple[str, str]] = set()
    for i, raw in enumerate(items):
        key = f"resource_claims[{i}]"
        n = Node(file, key, raw)
        ns = n.need("namespace", k8s_name, "the claim's namespace (its pods')")
        name = n.need("name", k8s_name, "the claim's name")
        devices = n.need("devices", as_list, "the claimed devices: GPU indexes or {gpu, mig}")
        sharing = n.get("sharing", one_of(CLAIM_SHARING), "")
        n.done()
        if (ns, name) in seen:
            raise ConfigError(file, f"{key}.name", "a claim name unique in its namespace",
                              f"{ns}/{name}")
        seen.add((ns, name))
        if not devices:
            raise ConfigError(file, f"{key}.devices", "at least one device", "[]")
        units = tuple(claim_unit(file, f"{key}.devices[{j}]", d, gpus, name)
                      for j, d in enumerate(devices))
        out.append(ClaimSpec(ns, name, units, sharing))
    return tuple(out)


def grant_unit(file: str, key: str, n: Node, gpu: GpuSpec) -> UnitRef:
    """`{gpu, memory, cores}` on a GPU whose allocation is hami or gpushare."""
    memory = n.need("memory", as_size, "the granted memory, a size like 20GiB")
    if not 0 < memory <= gpu.memory_bytes:
        raise ConfigError(file, f"{key}.memory", f"a size above 0 and at most the GPU's "
                          f"{gpu.memory_bytes // GIB}GiB", n.data.get("memory"))
    cores = n.get("cores", int_range(0, 100), None)
    if gpu.allocation == "gpushare":
        if cores is not None:
            raise ConfigError(file, f"{key}.cores", "no cores: gpushare grants memory only",
                              cores)
        if memory % GIB:
            raise ConfigError(file, f"{key}.memory", "whole GiB (gpushare's unit)",
                              n.data.get("memory"))
    return UnitRef(gpu=gpu.index, memory=memory, cores=cores or None)


def vgpu_unit(file: str, key: str, n: Node, gpu: GpuSpec) -> UnitRef:
    """`{gpu, vgpu}`: one active vGPU instance of a vGPU host GPU, as the KubeVirt device
    plugin hands it to a virt-launcher pod."""
    v = n.need("vgpu", as_nonneg_int, "a vGPU instance index")
    if v >= len(gpu.vgpus):
        raise ConfigError(file, f"{key}.vgpu", f"a vGPU instance index 0..{len(gpu.vgpus) - 1} "
                          f"of GPU {gpu.index}", v)
    return UnitRef(gpu=gpu.index, vgpu=v)
