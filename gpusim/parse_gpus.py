"""The `gpus` section of a scenario: models, telemetry, sharing, MIG instances."""

from __future__ import annotations

from exporter.errors import ConfigError
from gpusim.hardware import GI_POOLS, GPM_MODELS, PCI_BUSES, SM_COUNTS, MigFamily, mig_family
from gpusim.model import (
    ALLOCATIONS,
    FIELDS,
    SHARING_MODES,
    VIRTUALIZATION_MODES,
    GpuSpec,
    MigSpec,
    Sharing,
    Telemetry,
    stable_uuid,
)
from gpusim.parse_vgpu import parse_license, parse_vgpus
from gpusim.signal import Signal
from gpusim.validate import (
    Node,
    as_bool,
    as_list,
    as_number,
    as_size,
    as_str,
    int_range,
    mhz_signal,
    one_of,
    ranged,
    ratio_signal,
    temp_signal,
    uuid_with_prefix,
    watts_signal,
)


def _parse_sharing(file: str, key: str, v: object) -> Sharing:
    n = Node(file, key, v)
    mode = n.need("mode", one_of(SHARING_MODES), "a sharing mode")
    replicas = n.get("replicas", int_range(1, 1024), 1 if mode == "exclusive" else 0)
    resource = n.get("resource", as_str, "")
    n.done()
    if mode != "exclusive" and replicas < 2:
        raise ConfigError(file, f"{key}.replicas", f"an integer >= 2 for {mode}",
                          n.data.get("replicas"))
    if mode == "exclusive" and replicas != 1:
        raise ConfigError(file, f"{key}.replicas", "1 (or no replicas) for exclusive", replicas)
    return Sharing(mode, int(replicas), resource)


def _parse_telemetry(file: str, key: str, v: object, limit: float) -> Telemetry:
    n = Node(file, key, v if v is not None else {})
    t = Telemetry(
        temperature=n.get("temperature", temp_signal, None),
        memory_temperature=n.get("memory_temperature", temp_signal, None),
        power_watts=n.get("power_watts", watts_signal, None),
        idle_power_watts=n.get("idle_power_watts", ranged(0.0, limit, as_number), 0.1 * limit),
        sm_clock_mhz=n.get("sm_clock_mhz", mhz_signal, Signal.const(1410.0)),
        mem_clock_mhz=n.get("mem_clock_mhz", mhz_signal, Signal.const(1593.0)),
        utilization=n.get("utilization", ratio_signal, Signal.const(0.0)),
        encoder_utilization=n.get("encoder_utilization", ratio_signal, Signal.const(0.0)),
        decoder_utilization=n.get("decoder_utilization", ratio_signal, Signal.const(0.0)),
    )
    n.done()
    return t


def parse_gpus(file: str, node: str, entries: list[object]) -> tuple[GpuSpec, ...]:
    out: list[GpuSpec] = []
    for i, raw in enumerate(entries):
        key = f"gpus[{i}]"
        n = Node(file, key, raw)
        model = n.need("model", as_str, "the NVML device name, e.g. NVIDIA H100 80GB HBM3")
        count = n.get("count", int_range(1, 64), 1)
        memory = n.need("memory", as_size, "a size like 80GiB")
        if memory < (1 << 30):
            raise ConfigError(file, f"{key}.memory", "at least 1GiB", n.data["memory"])
        reserved = n.get("reserved_memory", as_size, min(512 << 20, memory // 64))
        limit = n.need("power_limit_watts", ranged(1.0, 5000.0, as_number), "watts")
        family = mig_family(model, memory)
        given_uuid = n.get("uuid", uuid_with_prefix("GPU-"), "")
        if given_uuid and count > 1:
            raise ConfigError(file, f"{key}.uuid", "no uuid when count > 1 (UUIDs are derived)",
                              given_uuid)
        pci = n.get("pci_bus_id", as_str, "")
        if pci and count > 1:
            raise ConfigError(file, f"{key}.pci_bus_id", "no pci_bus_id when count > 1", pci)
        vbios = n.get("vbios_version", as_str, "96.00.61.00.01")
        virt = VIRTUALIZATION_MODES[n.get("virtualization_mode",
                                          one_of(tuple(VIRTUALIZATION_MODES)), "none")]
        sms = n.get("multiprocessors", int_range(1, 1024),
                    next((c for kw, c in SM_COUNTS if kw in model), 80))
        gpm = n.get("gpm", as_bool, any(kw in model for kw in GPM_MODELS))
        links = n.get("nvlink_links", int_range(0, 36), 0)
        not_supported = frozenset(_parse_fields(file, f"{key}.not_supported",
                                                n.get("not_supported", as_list, [])))
        telemetry = _parse_telemetry(file, f"{key}.telemetry", n.raw("telemetry"), limit)
        sharing = n.get("sharing", _parse_sharing, Sharing())
        allocation = n.get("allocation", one_of(ALLOCATIONS), "device-plugin")
        mig_raw = n.raw("mig")
        vgpus_raw = n.get("vgpus", as_list, [])
        license_raw = n.raw("license") if n.has("license") else None
        n.read.add("license")
        n.done()
        if vgpus_raw and virt != VIRTUALIZATION_MODES["host_vgpu"]:
            raise ConfigError(file, f"{key}.vgpus", "vgpus only with virtualization_mode: "
                              "host_vgpu", "[...]")
        if n.has("license") and virt != VIRTUALIZATION_MODES["vgpu"]:
            raise ConfigError(file, f"{key}.license", "license only with virtualization_mode: "
                              "vgpu (a vGPU guest)", "{...}")
        license = parse_license(file, f"{key}.license", license_raw) \
            if virt == VIRTUALIZATION_MODES["vgpu"] else None
        if allocation != "device-plugin" and sharing.mode != "exclusive":
            raise ConfigError(file, f"{key}.sharing", f"no sharing with allocation "
                              f"{allocation} (sharing is the device plugin's)", sharing.mode)
        if allocation in ("hami", "gpushare") and mig_raw is not None:
            raise ConfigError(file, f"{key}.mig", f"no mig with allocation {allocation} "
                              "(it grants slices of a whole GPU)", allocation)
        for c in range(count):
            index = len(out)
            uuid = given_uuid or "GPU-" + stable_uuid(node, "gpu", str(index))
            migs: tuple[MigSpec, ...] | None = None
            if mig_raw is not None:
                if family is None:
                    raise ConfigError(file, f"{key}.mig", "no mig: this model has no MIG "
                                      "(MIG models: A100, A30, H100, H200)", model)
                if sharing.mode != "exclusive":
                    raise ConfigError(file, f"{key}.sharing", "sharing on each mig instance, "
                                      "not on a MIG-enabled GPU", sharing.mode)
                migs = _parse_migs(file, f"{key}.mig", mig_raw, family, memory, node, index)
            out.append(GpuSpec(
                index=index, model=model, uuid=uuid, memory_bytes=memory,
                reserved_bytes=reserved, power_limit_watts=limit,
                pci_bus_id=pci or _pci_bus_id(index), vbios_version=vbios,
                virtualization_mode=virt, multiprocessors=int(sms), mig_family=family,
                mig=migs, gpm=gpm, nvlink_links=int(links), not_supported=not_supported,
                telemetry=telemetry, sharing=sharing, allocation=allocation,
                vgpus=parse_vgpus(file, f"{key}.vgpus", vgpus_raw, node, index, memory),
                license=license,
            ))
            del c
    return tuple(out)


def _pci_bus_id(index: int) -> str:
    bus = PCI_BUSES[index] if index < len(PCI_BUSES) else 0x20 + index
    return f"00000000:{bus:02X}:00.0"


def _parse_fields(file: str, key: str, items: list[object]) -> list[str]:
    conv = one_of(tuple(FIELDS))
    return [conv(file, f"{key}[{i}]", v) for i, v in enumerate(items)]


def _parse_migs(file: str, key: str, raw: object, family: MigFamily, memory: int, node: str,
                gpu_index: int) -> tuple[MigSpec, ...]:
    items = as_list(file, key, raw)
    profiles = family.profiles()
    used_gi: set[int] = set()
    parsed: list[tuple[str, int, int, int | None, int, Sharing]] = []
    for i, item in enumerate(items):
        n = Node(file, f"{key}[{i}]", item)
        profile = n.need("profile", as_str, "a MIG profile like 3g.40gb")
        if profile not in profiles:
            raise ConfigError(file, f"{key}[{i}].profile",
                              "one of " + ", ".join(profiles), profile)
        gi = n.get("gpu_instance_id", int_range(0, 14), None)
        ci = n.get("compute_instance_id", int_range(0, 7), 0)
        sharing = n.get("sharing", _parse_sharing, Sharing())
        n.done()
        g, mem = profiles[profile]
        parsed.append((profile, g, mem, None if gi is None else int(gi), int(ci), sharing))
        if gi is not None:
            if gi in used_gi:
                raise ConfigError(file, f"{key}[{i}].gpu_instance_id", "a unique id", gi)
            used_gi.add(int(gi))
    if sum(p[1] for p in parsed) > family.parent_slices:
        raise ConfigError(file, key, f"at most {family.parent_slices} compute slices in all",
                          "+".join(p[0] for p in parsed))
    if sum(p[2] for p in parsed) > family.memory_slices:
        raise ConfigError(file, key, f"at most {family.memory_slices} memory slices in all",
                          "+".join(p[0] for p in parsed))
    out: list[MigSpec] = []
    for i, (profile, g, mem, gi, ci, sharing) in enumerate(parsed):
        if gi is None:
            pool = [x for x in GI_POOLS.get(g, range(1, 15)) if x not in used_gi]
            gi = pool[0] if pool else max(used_gi | {0}) + 1
            used_gi.add(gi)
        out.append(MigSpec(
            index=i, profile=profile,
            uuid="MIG-" + stable_uuid(node, "mig", str(gpu_index), str(i)),
            gpu_instance_id=gi, compute_instance_id=ci, slices=g, memory_slices=mem,
            memory_bytes=memory * mem // family.memory_slices,
            multiprocessors=family.sms[g], sharing=sharing,
        ))
    return tuple(out)
