"""The GPU process list: a stage of the sample cycle, like the inventory. The sampler runs it
before the collectors when one of them reads processes (attribution), so no collector depends
on another having run first and no flag can switch it off under attribution's feet. The
backend's ProcessReader reads each device; `reconcile` is the vendor-neutral rule that makes
per-process shares agree with the device's utilisation."""

from __future__ import annotations

from exporter.collectors.base import answering
from exporter.core import CycleContext
from exporter.device.contract import DeviceReader, Tally


class ProcessStage:
    def __init__(self, backend: DeviceReader) -> None:
        self._reader = backend.process_reader()

    def fill(self, ctx: CycleContext) -> None:
        """Fill ctx.processes (and ctx.process_failures) for every GPU that answers."""
        tally = Tally()
        for gpu in ctx.gpus:
            answering(ctx, gpu, lambda g: ctx.processes.extend(
                self._reader.read(g, ctx.migs, tally)))
        ctx.process_failures = tally.failures


def reconcile(shares: dict[int, float], device: float | None) -> dict[int, float]:
    """Per-process SM shares (pid -> 0-1) made consistent with the device's utilisation over
    the same periods. Both are whole-percent samples of the time a kernel ran, so they disagree
    by rounding, and under MPS processes overlap (their shares add up to more than the device
    was busy). The only process on a device ran every kernel: it gets the device figure (a
    light workload whose own samples round to 0 is then not 0). Several processes whose
    shares add up to more than the device are scaled down to it; less is left as it is (the
    rest stays unattributed: no evidence says whose it is)."""
    if device is None or not shares:
        return shares
    if len(shares) == 1:
        return dict.fromkeys(shares, device)
    total = sum(shares.values())
    if total <= device:
        return shares
    return {pid: v * device / total for pid, v in shares.items()}
