"""What the invalid-Unicode check in SampleSink.add costs: 8,000 adds of 8-label MIG samples
(the big node's order of magnitude), with the shipped add() and with the same add() minus the
check, best of 7.

    python -m bench.label_check
"""

from __future__ import annotations

import timeit
from collections.abc import Callable

from bench.common import say
from exporter.core import Labels, PodLabels, SampleSink
from exporter.metrics import BY_NAME

SAMPLES: list[Labels] = [
    ("node-a", str(i % 8), f"GPU-{i:08d}-aaaa-bbbb", "NVIDIA H100 80GB HBM3", f"MIG-{i}", "3",
     "0", "1g.10gb") for i in range(8000)]
Add = Callable[[SampleSink, str, Labels, float, PodLabels], None]


def unchecked(self: SampleSink, family: str, labels: Labels, value: float,
              pod_labels: PodLabels = ()) -> None:
    if len(labels) != len(BY_NAME[family].labels):
        raise ValueError(family)
    self.samples.setdefault(family, []).append((labels, float(value), pod_labels))


def best_ms(add: Add) -> float:
    def run() -> None:
        sink = SampleSink()
        for labels in SAMPLES:
            add(sink, "gpu_mig_memory_used_bytes", labels, 1.0, ())
    return min(timeit.repeat(run, number=5, repeat=7)) / 5 * 1e3


def main() -> None:
    checked, bare = best_ms(SampleSink.add), best_ms(unchecked)
    say(f"8,000 SampleSink.add: {checked:.2f} ms with the check, {bare:.2f} ms without: "
        f"{(checked - bare) / 8000 * 1e3:.2f} us per sample")


if __name__ == "__main__":
    main()
