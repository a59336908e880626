"""Facts about real GPU models the simulator copies: MIG geometry per family, GPU instance
ids, SM counts, which models have GPM, PCI bus numbers."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MigFamily:
    """MIG geometry of one GPU family: compute slices, and per profile size its memory slices
    (of 8) and SM count. `labels` maps memory slices to the profile's memory label."""

    parent_slices: int
    memory_slices: int
    labels: dict[int, str]
    sms: dict[int, int]
    # (compute slices, memory slices) of each profile, "+me" variants added for 1g
    shapes: tuple[tuple[int, int], ...]

    def profiles(self) -> dict[str, tuple[int, int]]:
        out: dict[str, tuple[int, int]] = {}
        for g, mem in self.shapes:
            out[f"{g}g.{self.labels[mem]}"] = (g, mem)
        smallest = min(self.labels)
        out[f"1g.{self.labels[smallest]}+me"] = (1, smallest)
        return out


_SEVEN = ((1, 1), (1, 2), (2, 2), (3, 4), (4, 4), (7, 8))
_HOPPER_SMS = {1: 16, 2: 32, 3: 60, 4: 64, 7: 132}
_AMPERE_SMS = {1: 14, 2: 28, 3: 42, 4: 56, 7: 98}
# (model keyword, memory GiB of the whole GPU) -> geometry; the nearest memory size wins.
MIG_FAMILIES: dict[tuple[str, int], MigFamily] = {
    ("A100", 40): MigFamily(7, 8, {1: "5gb", 2: "10gb", 4: "20gb", 8: "40gb"}, _AMPERE_SMS,
                            _SEVEN),
    ("A100", 80): MigFamily(7, 8, {1: "10gb", 2: "20gb", 4: "40gb", 8: "80gb"}, _AMPERE_SMS,
                            _SEVEN),
    ("H100", 80): MigFamily(7, 8, {1: "10gb", 2: "20gb", 4: "40gb", 8: "80gb"}, _HOPPER_SMS,
                            _SEVEN),
    ("H100", 94): MigFamily(7, 8, {1: "12gb", 2: "24gb", 4: "47gb", 8: "94gb"}, _HOPPER_SMS,
                            _SEVEN),
    ("H200", 141): MigFamily(7, 8, {1: "18gb", 2: "35gb", 4: "71gb", 8: "141gb"}, _HOPPER_SMS,
                             _SEVEN),
    ("A30", 24): MigFamily(4, 4, {1: "6gb", 2: "12gb", 4: "24gb"}, {1: 14, 2: 28, 4: 56},
                           ((1, 1), (2, 2), (4, 4))),
}
# Default GPU instance ids by profile size, in the order NVML hands them out on A100/H100.
GI_POOLS = {7: (0,), 4: (1,), 3: (1, 2), 2: (3, 4, 5), 1: (7, 8, 9, 10, 11, 12, 13)}
# SM counts of whole GPUs, by model keyword (first match wins).
SM_COUNTS = (("H100 PCIe", 114), ("H100", 132), ("H200", 132), ("A100", 108), ("A30", 56),
              ("A10", 72), ("L40", 142), ("L4", 58), ("T4", 40), ("V100", 80))
GPM_MODELS = ("H100", "H200", "H800", "GH200", "B100", "B200", "GB200")
PCI_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)


def mig_family(model: str, memory_bytes: int) -> MigFamily | None:
    candidates = [(abs(gib - memory_bytes / (1 << 30)), fam)
                  for (kw, gib), fam in MIG_FAMILIES.items() if kw in model]
    return min(candidates, key=lambda c: c[0])[1] if candidates else None
