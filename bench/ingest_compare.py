"""The ingest of one store's month by two code trees (or two settings), alternated, each run in
its own process: the client's CPU seconds and peak RSS, the store's CPU seconds over the same
run (from /proc of the store's process), and the ratios, in one run on one box.

    # a store holding a month (python -m bench.scale --gpus 2500 --workdir /tmp/b2500), then
    victoria-metrics -storageDataPath=/tmp/b2500/vm-data -httpListenAddr=127.0.0.1:27001 \\
        -retentionPeriod=100y -search.disableCache &
    python -m bench.ingest_compare --url http://127.0.0.1:27001 --store-pid $! \\
        --before /work/main --runs 2 --json out.json

`--before DIR`: a checkout with its own .venv (the code to compare against), run as
`gpu-ledger meter --no-price`; this tree is `after`. `--budget-mib M` adds a run of this tree
with ingest's memory budget lowered to M MiB (node groups, metering.queryplan), to show the
peak follows the budget while chunks stay 72 hours.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import child_program, child_usage, cpu_seconds, machine, say, table, write_json

_CHILD = child_program(
    "budget = int(sys.argv.pop(1))\n"
    "if budget:\n"
    "    import metering.prometheus_source as ps\n"
    "    real = ps.PrometheusSource.choose_chunk\n"
    "    ps.PrometheusSource.choose_chunk = lambda self, period, _b: real(self, period, budget)\n")


def run(tree: Path, url: str, month: str, pid: int, budget: int) -> dict[str, Any]:
    python = tree / ".venv" / "bin" / "python"
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "l.duckdb"
        cpu0, t0 = cpu_seconds(pid), time.perf_counter()
        proc = subprocess.run([str(python), "-c", _CHILD, str(budget), "meter", "--prometheus",
                               url, "--month", month, "--db", str(db), "--no-price",
                               "--verbose"], cwd=tree, capture_output=True, text=True,
                              check=False)
        wall, store = time.perf_counter() - t0, cpu_seconds(pid) - cpu0
        if proc.returncode != 0:
            raise SystemExit(f"{tree}: meter failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
        queries = re.search(r"(\d+) chunks, (\d+) queries", proc.stderr)
        split = re.search(r"meter: queries: (.*)", proc.stderr)
        import duckdb
        con = duckdb.connect(str(db), read_only=True)
        rows = {t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0]  # type: ignore[index]
                for t in ("device_hours", "allocation_hours")}
        digest = con.execute(
            "SELECT sum(hash(hour, uuid, observed_seconds, up_seconds, sm_active_seconds, "
            "energy_joules)) FROM device_hours").fetchone()[0]  # type: ignore[index]
        adigest = con.execute(
            "SELECT sum(hash(hour, namespace, pod, container, uuid, units, allocated_seconds, "
            "memory_byte_seconds, sm_seconds, labels)) FROM allocation_hours"
        ).fetchone()[0]  # type: ignore[index]
        con.close()
    return {"wall_s": wall, **child_usage(proc.stderr),
            "store_cpu_s": store, "queries": int(queries.group(2)) if queries else None,
            "split": split.group(1) if split else "", "rows": rows,
            "digest": f"{digest}/{adigest}"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.ingest_compare", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", required=True)
    p.add_argument("--store-pid", type=int, required=True)
    p.add_argument("--month", default="2026-10")
    p.add_argument("--before", type=Path, help="another checkout with .venv")
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--budget-mib", type=int, default=0)
    p.add_argument("--json")
    args = p.parse_args(argv)
    here = Path(__file__).resolve().parent.parent
    variants: list[tuple[str, Path, int]] = []
    if args.before:
        variants.append(("before", args.before.resolve(), 0))
    variants.append(("after", here, 0))
    if args.budget_mib:
        variants.append((f"after, {args.budget_mib} MiB budget", here, args.budget_mib << 20))
    res: dict[str, Any] = {"machine": machine(), "runs": {}}
    with open("/proc/loadavg") as f:
        res["load_before"] = f.read().split()[:3]
    for i in range(args.runs):
        for name, tree, budget in variants:
            r = run(tree, args.url, args.month, args.store_pid, budget)
            res["runs"].setdefault(name, []).append(r)
            say(f"ingest_compare: {name} run {i + 1}: {r['cpu_s']:.1f} CPU-s, store "
                f"{r['store_cpu_s']:.1f} CPU-s, {r['maxrss_mib']:.0f} MiB, {r['wall_s']:.0f} s")
    with open("/proc/loadavg") as f:
        res["load_after"] = f.read().split()[:3]
    rows = []
    for name, runs in res["runs"].items():
        def fig(key: str, fmt: str, runs: list[dict[str, Any]] = runs) -> str:
            return ", ".join(format(r[key], fmt) for r in runs)
        rows.append([name, fig("cpu_s", ".1f"), fig("store_cpu_s", ".1f"),
                     fig("maxrss_mib", ",.0f"), fig("wall_s", ".0f"),
                     str(runs[0]["queries"]), runs[0]["split"][:120],
                     "yes" if len({r["digest"] for rs in res["runs"].values() for r in rs}) == 1
                     else "**no**"])
    say(table(["ingest", "client CPU-s", "store CPU-s", "peak RSS MiB", "wall s", "queries",
               "split", "facts identical (all runs)"], rows))
    say(f"load average before / after: {res['load_before']} / {res['load_after']}")
    write_json(args.json, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
