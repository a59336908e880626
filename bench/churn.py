"""Nodes that leave the fleet, and the recorded hourly series (issue 27, stop 47):

    python -m bench.churn --gpus 496 --runs 2 --before DIR --json out.json

Label lookups are coarser than a chunk: VictoriaMetrics looks label values up by day. A node
that left the fleet on one day is listed with raw series for a chunk that starts at the next
midnight, and has no recorded series there. Until stop 47 that sent the chunk to the raw
series (`--recorded auto`) or failed it (`--recorded only`); now the samples of such nodes
are counted over the chunk's reads (metering.queryplan.QueryPlanner.nodes_sampled), and a
node with none there does not.

1. bench.scale's fleet for the month, except that node k (k < days - 1) leaves at 12:00 on
   day k + 1 (its samples end there): one node leaves each day but the last.
2. The shipped rules replayed over the month by vmalert (bench.recorded.replay).
3. `gpu-ledger meter --month M --no-price --verbose` reading the raw series (`--recorded
   never`), this checkout's default (`--recorded auto`) and, with `--before DIR` (another
   checkout with its own .venv, e.g. the code before the change), that one's default, in
   that order, `--runs` rounds: wall, client CPU, store CPU (/proc), peak RSS, and how many
   signal-chunks each read from the recorded series. Every run's facts must be identical
   (bench.recorded's digest). With `--by-day` each variant meters the month one day at a
   time into one ledger (`--from D --to D+1`, as the continuous CronJob meters each closed
   day): its figures are the days' sums (peak RSS: the largest).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench.common import machine, say, table, write_json
from bench.recorded import _digest, _loadavg, replay
from bench.scale import Fleet, Victoria, run_stage

_RECORDED = re.compile(r"(\d+) of (\d+) signal-chunks from the recorded")
_SIGNAL_CHUNKS = re.compile(r"^meter: queries: .* for ([\d,]+) signal-chunks", re.M)


class LeavingFleet(Fleet):
    """bench.scale's fleet, node k (k < days - 1) gone from 12:00 on day k + 1 of the month."""

    def leaves_at_ms(self, n: int) -> int | None:
        days = (self.end - self.start).days
        if n >= min(days - 1, self.nodes):
            return None
        return int((self.start + timedelta(days=n, hours=12)).timestamp()) * 1000

    def node_lines(self, n: int) -> Iterator[str]:
        leave = self.leaves_at_ms(n)
        for line in super().node_lines(n):
            if leave is None:
                yield line
                continue
            series = json.loads(line)
            kept = sum(1 for t in series["timestamps"] if t < leave)
            if kept:
                series["values"] = series["values"][:kept]
                series["timestamps"] = series["timestamps"][:kept]
                yield json.dumps(series, separators=(",", ":")) + "\n"


def meter(vm: Victoria, periods: list[list[str]], name: str, recorded: str, work: Path,
          code: dict[str, Any]) -> dict[str, Any]:
    """`gpu-ledger meter` of each period in turn into one ledger: the runs' figures summed."""
    db = work / f"{name}.duckdb"
    db.unlink(missing_ok=True)
    total: dict[str, Any] = {"wall_s": 0.0, "cpu_s": 0.0, "store_cpu_s": 0.0,
                             "maxrss_mib": 0.0}
    done = chunks = 0
    because: set[str] = set()
    for period in periods:
        store0 = vm.cpu_s()
        r = run_stage(["meter", "--prometheus", vm.url, *period, "--db", str(db),
                       "--no-price", "--verbose", "--recorded", recorded], **code)
        total["store_cpu_s"] += vm.cpu_s() - store0
        for k in ("wall_s", "cpu_s"):
            total[k] += r[k]
        total["maxrss_mib"] = max(total["maxrss_mib"], r["maxrss_mib"])
        stderr = r["stderr"]
        found, asked = _RECORDED.search(stderr), _SIGNAL_CHUNKS.search(stderr)
        chunks += int(asked.group(1).replace(",", "")) if asked else 0
        done += int(found.group(1)) if found else 0
        because |= {m.group(1) for m in re.finditer(
            r"raw series: (\d+ node\(s\) with raw series but none recorded)", stderr)}
    total["digest"] = _digest(db)
    total["recorded"] = f"{done} of {chunks}" if chunks else "0"
    total["raw_because"] = sorted(because)
    return total


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.churn", description=__doc__.split("\n")[0])
    p.add_argument("--gpus", type=int, default=496)
    p.add_argument("--month", default="2026-10")
    p.add_argument("--interval", type=int, default=300, help="seconds between samples")
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--by-day", action="store_true",
                   help="meter the month one day at a time (the continuous CronJob's way)")
    p.add_argument("--before", type=Path, metavar="DIR",
                   help="another checkout (with its .venv) whose default is metered too")
    p.add_argument("--workdir", help="keep the store here; a store already there is reused "
                   "(no import, no replay)")
    p.add_argument("--json")
    args = p.parse_args(argv)
    year, mon = map(int, args.month.split("-"))
    start = datetime(year, mon, 1, tzinfo=UTC)
    end = datetime(year + mon // 12, mon % 12 + 1, 1, tzinfo=UTC)
    days = (end - start).days
    periods = ([["--from", f"{start + timedelta(days=d):%Y-%m-%d}",
                 "--to", f"{start + timedelta(days=d + 1):%Y-%m-%d}"] for d in range(days)]
               if args.by_day else [["--month", args.month]])
    work = Path(args.workdir or tempfile.mkdtemp(prefix="gpu-ledger-churn-"))
    work.mkdir(parents=True, exist_ok=True)
    variants: list[tuple[str, str, dict[str, Any]]] = [("raw", "never", {}),
                                                       ("auto", "auto", {})]
    if args.before:
        tree = args.before.resolve()
        variants.append(("auto, --before", "auto",
                         {"python": str(tree / ".venv" / "bin" / "python"), "cwd": tree}))
    res: dict[str, Any] = {"machine": machine(), "gpus": args.gpus, "month": args.month,
                           "by_day": args.by_day, "before": str(args.before or ""),
                           "load_before": _loadavg()}
    reuse = (work / "vm-data").exists()  # the fleet and its replay are there already
    vm = Victoria(work / "vm-data")
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _ in variants}
    try:
        fleet = LeavingFleet(args.gpus, start, end, args.interval)
        if not reuse:
            vm.import_lines(line for n in range(fleet.nodes) for line in fleet.node_lines(n))
            vm.flush()
        leaving = sum(fleet.leaves_at_ms(n) is not None for n in range(fleet.nodes))
        res["leaving_nodes"] = leaving
        say(f"churn: {fleet.nodes * 8} GPUs on {fleet.nodes} nodes, {leaving} of them leaving "
            f"one a day{' (the store in --workdir reused)' if reuse else ''}")
        if not reuse:
            res["replay"] = replay(vm, start - timedelta(minutes=43),
                                   end + timedelta(minutes=17), work)
        for _ in range(args.runs):
            for name, recorded, code in variants:
                runs[name].append(meter(vm, periods, name.replace(", ", "-"), recorded,
                                        work, code))
                r = runs[name][-1]
                say(f"churn: {name}: {r['wall_s']:.1f} s, client {r['cpu_s']:.1f} CPU-s, "
                    f"store {r['store_cpu_s']:.1f} CPU-s, recorded {r['recorded']}")
    finally:
        vm.close()
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    res["runs"] = runs
    res["load_after"] = _loadavg()
    identical = len({r["digest"] for rs in runs.values() for r in rs}) == 1
    res["facts_identical"] = identical
    say(table(["the month's ingest" + (", day by day" if args.by_day else ""),
               "signal-chunks recorded", "wall s", "client CPU-s",
               "store CPU-s", "peak RSS MiB"],
              [[name, ", ".join(r["recorded"] for r in rs),
                ", ".join(f"{r['wall_s']:.1f}" for r in rs),
                ", ".join(f"{r['cpu_s']:.1f}" for r in rs),
                ", ".join(f"{r['store_cpu_s']:.1f}" for r in rs),
                ", ".join(f"{r['maxrss_mib']:,.0f}" for r in rs)] for name, rs in runs.items()]))
    for name, rs in runs.items():
        if rs and rs[0]["raw_because"]:
            say(f"{name}: chunks read raw because {'; '.join(rs[0]['raw_because'])}")
    say(f"facts identical in every run: {'yes' if identical else '**no**'}")
    say(f"load average before / after: {res['load_before']} / {res['load_after']}")
    write_json(args.json, res)
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
