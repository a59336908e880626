"""CPU seconds of the demo's live AMD and Intel nodes (gpusim/scenarios/vendors) stepped through
the exporter, with and without one scenario, alternated in one process so the shared machine's
load weighs on both alike.

    python -m bench.vendor_nodes --steps 200 --without intel-max-tiles.yaml
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from pathlib import Path

from gpusim.cluster import SimCluster

VENDORS = Path(__file__).resolve().parent.parent / "gpusim" / "scenarios" / "vendors"
T0 = 1_790_000_000
STEP = 600  # seconds of scenario time a step


def run(paths: list[Path], steps: int) -> float:
    """CPU seconds (all threads) of `steps` sample cycles of the nodes."""
    with tempfile.TemporaryDirectory() as d, SimCluster(
            [], start=T0, workdir=d, vendors=paths,
            window=(0.0, (steps + 1) * float(STEP))) as cluster:
        t = time.process_time()
        for i in range(1, steps + 1):
            for _ in cluster.step(T0 + i * STEP):
                pass
        return time.process_time() - t


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--without", default="intel-max-tiles.yaml")
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    every = sorted(VENDORS.glob("*.yaml"))
    fewer = [s for s in every if s.name != args.without]
    out: dict[str, list[float]] = {"without": [], "with": []}
    for _ in range(args.rounds):
        out["without"].append(run(fewer, args.steps))
        out["with"].append(run(every, args.steps))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    print(f"without {args.without} ({len(fewer)} nodes): "
          f"{', '.join(f'{x:.2f}' for x in out['without'])} CPU-s; with ({len(every)}): "
          f"{', '.join(f'{x:.2f}' for x in out['with'])} CPU-s; ratio "
          f"{sum(out['with']) / sum(out['without']):.2f}; peak RSS {rss} MB")


if __name__ == "__main__":
    main()
