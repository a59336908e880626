"""Intel tiles held by pods: GPU Aware Scheduling's `gas-container-tiles` annotation.

A Data Center GPU Max has two tiles (Level Zero subdevices). The Intel GPU plugin hands a
container a card (`gpu.intel.com/i915` / `xe`, ID `card0-1`); which tiles of it the container
may use is GPU Aware Scheduling's decision, written on the pod as `gas-container-tiles`
(intel/platform-aware-scheduling gpu-aware-scheduling; read by the plugin in
intel/intel-device-plugins-for-kubernetes cmd/gpu_plugin/rm/gpu_plugin_resource_manager.go
`containerTileAffinityMask` at 8f6a235, which turns it into the container's ZE_AFFINITY_MASK).
The pod requests them as the extended resource `gpu.intel.com/tiles`, which no device plugin
serves, so PodResources never lists tiles: the annotation is the only record.

Format, as the plugin parses it: containers separated by `|`, the n-th non-empty entry for
the n-th container (in spec order) that requests the plugin's resource; within an entry, cards
separated by `,`, each `card<N>:gt<a>+gt<b>` (the GT directories under the card's sysfs).
An entry the plugin would reject (no `:`, a tile not `gt<digits>`) gives that container no
tiles: it holds its cards whole, as the plugin then leaves it.
"""

from __future__ import annotations

import re

ANNOTATION = "gas-container-tiles"
_MAX_LEN = 4096  # tenant-written: longer is not read
_MAX_ENTRIES = 64
_CARD = re.compile(r"^card[0-9]{1,6}$")
_GT = re.compile(r"^gt([0-9]{1,2})$")

# per GPU-using container: the (card, GT id) pairs it may use
ContainerTiles = tuple[tuple[str, int], ...]


def _entry(text: str) -> ContainerTiles:
    out: list[tuple[str, int]] = []
    for combo in text.split(","):
        card, sep, gts = combo.partition(":")
        if not sep or not _CARD.match(card):
            return ()
        for gt in gts.split("+"):
            m = _GT.match(gt)
            if m is None:
                return ()
            out.append((card, int(m[1])))
    return tuple(dict.fromkeys(out))


def parse_tiles(annotation: object) -> tuple[ContainerTiles, ...]:
    """The annotation's entries, one per GPU-using container; () when absent or unreadable."""
    if not isinstance(annotation, str) or len(annotation) > _MAX_LEN:
        return ()
    entries = [e.strip() for e in annotation.split("|") if e.strip()]
    return tuple(_entry(e) for e in entries[:_MAX_ENTRIES])
