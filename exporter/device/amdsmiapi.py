"""The part of AMD's `amdsmi` Python package the AMD backend calls, as a Protocol, and its lazy
loader.

Signatures and return shapes are those of ROCm/amdsmi `py-interface/amdsmi_interface.py`
(rocm-6.2.2 .. ROCm 7 `rocm-systems/projects/amdsmi`, docs/reference/amdsmi-py-api.md) and, for
the MxGPU host functions (VFs), of the host library's Python package in
amd/MxGPU-Virtualization `smi-lib/py/interface/amdsmi_interface.py` (8.1.0.K): docs/backends.md
cites the exact versions. Functions return dicts; a value the device does not report is the
string "N/A" (amdsmi's `_validate_if_max_uint`); every failure raises
`AmdSmiLibraryException`, whose `get_error_code()` is an `amdsmi_status_t`.

The real module is untyped and needs `libamd_smi.so`: `import amdsmi` without it prints the
`OSError` to stdout and then raises `KeyError('libamd_smi.so')` (amdsmi_wrapper.py indexes
`_libraries['libamd_smi.so']`). `load_amdsmi` turns that into one `AmdSmiUnavailable` line.
The simulator's `gpusim.amdsmi_sim.SimAmdSmi` implements the same Protocol.
"""

from __future__ import annotations

import contextlib
import importlib
import io
from collections.abc import Sequence
from typing import Any, Protocol, cast

Handle = Any  # an amdsmi_processor_handle (real) or the simulator's; opaque to the exporter
VfHandle = Any  # an amdsmi_vf_handle_t (MxGPU host library)
Info = dict[str, Any]  # one of amdsmi's result dicts; ints, strings, or "N/A"

# amdsmi_status_t (include/amd_smi/amdsmi.h): the codes the backend tells apart
STATUS_NOT_SUPPORTED = 2
STATUS_NOT_YET_IMPLEMENTED = 3
STATUS_NO_PERM = 10
STATUS_NOT_FOUND = 31
STATUS_NO_DATA = 40
STATUS_DRIVER_NOT_LOADED = 34
# "the device has no such value": absent, not a failure
ABSENT_STATUSES = frozenset({STATUS_NOT_SUPPORTED, STATUS_NOT_YET_IMPLEMENTED, STATUS_NO_DATA})
# the device is gone (amdgpu unbound it, or it fell off the bus)
LOST_STATUSES = frozenset({STATUS_NOT_FOUND, STATUS_DRIVER_NOT_LOADED})


class AmdSmiUnavailable(Exception):
    """The amdsmi package or libamd_smi.so cannot be loaded (one line, no traceback)."""


class AmdSmiApi(Protocol):
    # every library error; `.get_error_code()` is the amdsmi_status_t
    AmdSmiLibraryException: type[Exception]
    # enums the functions check with isinstance: members are passed, never bare ints
    AmdSmiTemperatureType: Any  # .EDGE .HOTSPOT .VRAM
    AmdSmiTemperatureMetric: Any  # .CURRENT
    AmdSmiClkType: Any  # .GFX .MEM
    AmdSmiGpuBlock: Any  # RAS blocks by name: .UMC .GFX .SDMA .MMHUB .XGMI_WAFL ...

    # --- library, identity ---
    def amdsmi_init(self, /) -> None: ...
    def amdsmi_shut_down(self, /) -> None: ...
    def amdsmi_get_processor_handles(self, /) -> list[Handle]: ...
    def amdsmi_get_gpu_device_bdf(self, handle: Handle, /) -> str: ...
    def amdsmi_get_gpu_device_uuid(self, handle: Handle, /) -> str: ...
    def amdsmi_get_gpu_asic_info(self, handle: Handle, /) -> Info: ...  # market_name
    def amdsmi_get_gpu_vbios_info(self, handle: Handle, /) -> Info: ...  # version
    def amdsmi_get_gpu_driver_info(self, handle: Handle, /) -> Info: ...  # driver_version
    # kfd_id, node_id, current_partition_id (a partition's index; "N/A" unpartitioned)
    def amdsmi_get_gpu_kfd_info(self, handle: Handle, /) -> Info: ...
    # drm_render, drm_card, hsa_id, hip_id, hip_uuid (ROCm 6.4+)
    def amdsmi_get_gpu_enumeration_info(self, handle: Handle, /) -> Info: ...
    def amdsmi_get_gpu_compute_partition(self, handle: Handle, /) -> str: ...  # "CPX"
    def amdsmi_get_gpu_memory_partition(self, handle: Handle, /) -> str: ...  # "NPS4"
    # {"mode": AmdSmiVirtualizationMode}: 0 unknown, 1 bare metal, 2 host, 3 guest,
    # 4 passthrough
    def amdsmi_get_gpu_virtualization_mode(self, handle: Handle, /) -> Info: ...

    # --- telemetry ---
    def amdsmi_get_gpu_activity(self, handle: Handle, /) -> Info: ...  # % gfx/umc/mm
    def amdsmi_get_gpu_vram_usage(self, handle: Handle, /) -> Info: ...  # MB total/used
    def amdsmi_get_power_info(self, handle: Handle, /) -> Info: ...  # W
    def amdsmi_get_power_cap_info(self, handle: Handle, /) -> Info: ...  # µW power_cap
    # energy_accumulator x counter_resolution = µJ since the driver loaded
    def amdsmi_get_energy_count(self, handle: Handle, /) -> Info: ...
    def amdsmi_get_temp_metric(self, handle: Handle, sensor: Any, metric: Any, /) -> int: ...
    def amdsmi_get_clock_info(self, handle: Handle, clock: Any, /) -> Info: ...  # MHz
    def amdsmi_get_gpu_metrics_info(self, handle: Handle, /) -> Info: ...  # xgmi_*_data_acc
    # {sent, received, max_pkt_sz}: PCIe messages counted by the driver over one second (it
    # sleeps 1 s in the call) and the max payload size, bytes; the amdgpu pcie_bw file
    def amdsmi_get_gpu_pci_throughput(self, handle: Handle, /) -> Info: ...

    # --- reliability ---
    def amdsmi_get_gpu_total_ecc_count(self, handle: Handle, /) -> Info: ...
    def amdsmi_get_gpu_pci_replay_counter(self, handle: Handle, /) -> int: ...
    def amdsmi_get_gpu_bad_page_info(self, handle: Handle, /) -> Sequence[Info]: ...
    # [{block: AmdSmiGpuBlock name, status: AmdSmiRasErrState name ("ENABLED", ...)}]
    def amdsmi_get_gpu_ras_block_features_enabled(self, handle: Handle, /) -> list[Info]: ...
    # one block's correctable_count, uncorrectable_count, deferred_count
    def amdsmi_get_gpu_ecc_count(self, handle: Handle, block: Any, /) -> Info: ...

    # --- RAS events (newer releases): CPER records from a cursor, and the AFIDs in a record ---
    # (entries {i: {error_severity, ...}}, next cursor, records [{bytes, size}], status)
    def amdsmi_get_gpu_cper_entries(self, handle: Handle, severity_mask: int, buffer_size: int,
                                    cursor: int, /) -> tuple[dict[int, Info], int, list[Info],
                                                             int]: ...
    def amdsmi_get_afids_from_cper(self, records: list[Any], /) -> tuple[list[int], int]: ...

    # --- processes ---
    # name, pid, mem (bytes), engine_usage {gfx, enc} (ns, cumulative), memory_usage
    # {gtt_mem, cpu_mem, vram_mem} (bytes)
    def amdsmi_get_gpu_process_list(self, handle: Handle, /) -> list[Info]: ...

    # --- MxGPU host (the GIM driver's amdsmi): virtual functions ---
    def amdsmi_get_num_vf(self, handle: Handle, /) -> Info: ...  # num_vf_enabled/_supported
    # [{vf_id, fb: {fb_offset, fb_size (MB)}}]
    def amdsmi_get_vf_partition_info(self, handle: Handle, /) -> list[Info]: ...
    def amdsmi_get_vf_handle_from_vf_index(self, handle: Handle, index: int, /) -> VfHandle: ...
    def amdsmi_get_vf_bdf(self, vf: VfHandle, /) -> str: ...
    def amdsmi_get_vf_uuid(self, vf: VfHandle, /) -> str: ...
    def amdsmi_get_vf_data(self, vf: VfHandle, /) -> Info: ...  # sched.state, ...
    def amdsmi_get_guest_data(self, vf: VfHandle, /) -> Info: ...  # fb_usage (MB)


def load_amdsmi(module: str = "amdsmi") -> AmdSmiApi:
    """Import the amdsmi package lazily. Raises AmdSmiUnavailable with one line when the
    package or libamd_smi.so is missing; the wrapper's own prints on a missing library are
    swallowed so the log keeps that one line."""
    noise = io.StringIO()
    try:
        with contextlib.redirect_stdout(noise), contextlib.redirect_stderr(noise):
            mod = importlib.import_module(module)
    except KeyError as e:  # amdsmi_wrapper: _libraries['libamd_smi.so'] never set
        raise AmdSmiUnavailable(
            f"amdsmi: libamd_smi.so not found (install amd-smi-lib / ROCm; {e!s})") from None
    except OSError as e:
        raise AmdSmiUnavailable(f"amdsmi: libamd_smi.so not loadable ({e})") from None
    except ImportError as e:
        raise AmdSmiUnavailable(f"amdsmi: Python package not installed ({e.msg})") from None
    return cast(AmdSmiApi, Flavour(mod))


class Flavour:
    """The amdsmi module as the backend sees it. AMD ships two flavours under one name: ROCm's
    (bare metal, guests) and the MxGPU host's (GIM), each without some of the other's
    functions (the host has no process list, VRAM usage or energy counter; ROCm no VF
    functions), and older releases lack newer ones. A function this flavour lacks raises the
    module's own AmdSmiLibraryException(NOT_SUPPORTED) when called, so the backend reads it as
    an absent value instead of failing on an AttributeError. Everything else is the module's.
    """

    def __init__(self, module: object) -> None:
        self._module = module

    def __getattr__(self, name: str) -> Any:
        try:
            return getattr(self._module, name)
        except AttributeError:
            if not name.startswith("amdsmi_"):
                raise
        error: Any = getattr(self._module, "AmdSmiLibraryException", None)

        def unsupported(*args: object) -> Any:
            if error is None:  # not an amdsmi module at all
                raise AttributeError(name)
            raise error(STATUS_NOT_SUPPORTED)

        return unsupported
