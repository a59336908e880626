"""How a pod holds its share of a GPU: the one definition of the exporter's `sharing` label,
the cost model's `sharing.efficiency` keys and the dashboards' per-mode panels."""

from __future__ import annotations

from enum import StrEnum


class SharingMode(StrEnum):
    EXCLUSIVE = "exclusive"  # a whole GPU
    MIG = "mig"  # a MIG instance
    TIME_SLICING = "time-slicing"  # a replica of a time-sliced GPU (or a shared DRA claim)
    MPS = "mps"  # a replica of an MPS-shared GPU (or a shared DRA claim whose config says MPS)
    FRACTIONAL = "fractional"  # a scheduler's memory / core grant (HAMi, gpushare)
    VGPU = "vgpu"  # an NVIDIA vGPU instance (KubeVirt), a profile's share of the GPU


# Modes an operator may assert for a resource name (--sharing-mode): the ones that device
# IDs alone cannot tell apart. Fractional and vGPU come from their own sources.
DECLARABLE: tuple[SharingMode, ...] = (SharingMode.EXCLUSIVE, SharingMode.MIG,
                                       SharingMode.TIME_SLICING, SharingMode.MPS)
