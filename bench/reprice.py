"""Re-pricing a priced ledger (issue 27, stop 56): `gpu-ledger meter --price-only` over a
period whose hours hold charges, each run a child process on a fresh copy of the ledger, with
its wall, CPU seconds, peak RSS and the largest size of its spill directory (`<copy>.tmp`,
read every second), and a hash of every row of `charges`, `energy_hours` and `waste_hours`
afterwards (the same in every run: a re-price with the same cost model writes the same rows).

- `--before DIR` (a checkout with its own .venv, e.g. the code before a change) alternates
  with this checkout, `--runs` rounds: two designs on the same data under the same load.
- `--kill-at N` instead: this checkout's re-price is killed (SIGKILL) when its progress says
  slice N, then one writable open of the ledger (`metering.db.connect`) puts back what the
  run left half written; its figures, what it said, and whether the rows are those of
  before.

    python -m bench.reprice --ledger L.duckdb --from 2026-10-13 --to 2026-10-16 --before OLD
    python -m bench.reprice --ledger L.duckdb --month 2026-10        # the month, this code
    python -m bench.reprice --ledger L.duckdb --month 2026-10 --kill-at 20

A priced ledger at fleet size: `python -m bench.close --gpus 80000 --workdir W` (its ledger is
priced, then closed: `--reopen` deletes the close from the copies, so the month is re-priced,
not refused as closed).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import duckdb

from bench.common import child_program, child_usage, machine, say, table, write_json

_TABLES = ("charges", "energy_hours", "waste_hours")
_CHILD = child_program()
_RECOVER = ("import sys\nfrom metering.db import connect\n"
            "connect(sys.argv[-1], say=print).close()\n")


def rows_hash(ledger: Path) -> dict[str, str]:
    con = duckdb.connect(str(ledger), read_only=True)
    try:
        return {t: str(con.execute(f"SELECT count(*), sum(hash(x))::HUGEINT FROM (FROM {t}) x"
                                   ).fetchone()) for t in _TABLES}
    finally:
        con.close()


def _fresh_copy(ledger: Path, copy: Path, reopen: bool) -> None:
    for p in (copy, Path(f"{copy}.wal")):
        p.unlink(missing_ok=True)
    shutil.rmtree(f"{copy}.tmp", ignore_errors=True)
    shutil.copyfile(ledger, copy)
    if reopen:
        con = duckdb.connect(str(copy))
        con.execute("DELETE FROM month_closes")
        con.close()


@contextmanager
def _spill_peak(directory: str) -> Iterator[list[int]]:
    """The largest size (bytes, in the list's one item) the spill directory reached while the
    block ran, read every second."""
    peak, done = [0], threading.Event()

    def watch() -> None:
        while not done.is_set():
            size = 0
            for root, _, files in os.walk(directory):
                for f in files:
                    with contextlib.suppress(OSError):  # removed while read
                        size += os.path.getsize(os.path.join(root, f))
            peak[0] = max(peak[0], size)
            done.wait(1.0)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield peak
    finally:
        done.set()
        thread.join()


def reprice(copy: Path, span: list[str], python: str, cwd: Path | None) -> dict[str, Any]:
    args = ["meter", "--price-only", *span, "--db", str(copy), "-q"]
    t0 = time.perf_counter()
    with _spill_peak(f"{copy}.tmp") as spill:
        proc = subprocess.run([python, "-c", _CHILD, *args], capture_output=True, text=True,
                              check=False, cwd=cwd)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"re-price failed ({proc.returncode}): {proc.stderr.strip()[-500:]}")
    return {"wall_s": wall, **child_usage(proc.stderr), "spill_mib": spill[0] / 2**20,
            "tables": rows_hash(copy)}


def killed(copy: Path, span: list[str], at: int) -> dict[str, Any]:
    """Kill the re-price at slice `at`, then time the open that puts the ledger back."""
    proc = subprocess.Popen([sys.executable, "-m", "gpu_ledger.cli", "meter", "--price-only",
                             *span, "--db", str(copy), "--verbose"], stderr=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, text=True)
    assert proc.stderr is not None
    t0 = time.perf_counter()
    for line in proc.stderr:
        if f"slice {at}/" in line:
            break
    else:
        proc.wait()
        raise SystemExit(f"the re-price ended (exit {proc.returncode}) before slice {at}")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_after = time.perf_counter() - t0
    con = duckdb.connect(str(copy), read_only=True)
    notes = con.execute("SELECT written FROM unfinished_hours").fetchall()
    aside = con.execute("SELECT count(*) FROM information_schema.tables "
                        "WHERE table_name LIKE 'aside_%'").fetchone()
    con.close()
    t1 = time.perf_counter()
    rec = subprocess.run([sys.executable, "-c", "import resource\n" + _RECOVER +
                          "u = resource.getrusage(resource.RUSAGE_SELF)\n"
                          "sys.stderr.write('\\nBENCH_MAXRSS_KIB %d\\nBENCH_CPU_S %.2f\\n' % "
                          "(u.ru_maxrss, u.ru_utime + u.ru_stime))\n", str(copy)],
                         capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t1
    if rec.returncode != 0:
        raise SystemExit(f"the open failed ({rec.returncode}): {rec.stderr.strip()[-500:]}")
    return {"killed_after_s": killed_after, "notes": [str(n[0]) for n in notes],
            "aside_tables": int(aside[0]) if aside else 0, "said": rec.stdout.strip(),
            "wall_s": wall, **child_usage(rec.stderr), "tables": rows_hash(copy)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.reprice", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ledger", type=Path, required=True, help="a priced ledger")
    p.add_argument("--month", help="re-price this month (YYYY-MM)")
    p.add_argument("--from", dest="start", help="or hours from this day ...")
    p.add_argument("--to", dest="end", help="... to this one")
    p.add_argument("--before", type=Path, metavar="DIR",
                   help="a checkout with .venv: re-price with it too, alternating")
    p.add_argument("--runs", type=int, default=1, help="rounds (default 1)")
    p.add_argument("--kill-at", type=int, metavar="N",
                   help="kill this code's re-price at slice N and time the recovering open")
    p.add_argument("--reopen", action="store_true",
                   help="delete the copies' month closes first (a ledger bench.close closed)")
    p.add_argument("--workdir", type=Path, help="where the copy goes (default: beside --ledger)")
    p.add_argument("--json", help="write the figures as JSON too")
    args = p.parse_args(argv)
    if bool(args.month) == bool(args.start and args.end):
        p.error("give --month, or --from and --to")
    span = ["--month", args.month] if args.month else ["--from", args.start, "--to", args.end]
    copy = (args.workdir or args.ledger.parent) / "reprice-copy.duckdb"
    before = rows_hash(args.ledger)
    res: dict[str, Any] = {"machine": machine(), "span": span, "before_rows": before}
    try:
        if args.kill_at:
            _fresh_copy(args.ledger, copy, args.reopen)
            r = res["killed"] = killed(copy, span, args.kill_at)
            say(f"killed after {r['killed_after_s']:.0f} s, notes {r['notes']}, "
                f"{r['aside_tables']} aside tables; the open said: {r['said']}")
            say(f"the open: {r['wall_s']:.1f} s, {r['cpu_s']:.1f} CPU-s, "
                f"{r['maxrss_mib']:,.0f} MiB; rows as before: {r['tables'] == before}")
        else:
            variants: list[tuple[str, str, Path | None]] = [("this", sys.executable, None)]
            if args.before:
                tree = args.before.resolve()
                variants.insert(0, ("before", str(tree / ".venv" / "bin" / "python"), tree))
            runs = []
            for i in range(args.runs):  # alternating: the box's load moves under both alike
                for name, python, cwd in variants:
                    _fresh_copy(args.ledger, copy, args.reopen)
                    load = os.getloadavg()[0]
                    runs.append(dict(reprice(copy, span, python, cwd), code=name, run=i + 1,
                                     load=load))
            res["runs"] = runs
            say(table(["code", "run", "wall s", "CPU s", "peak RSS MiB", "spilled MiB (peak)",
                       "load", "rows as before"],
                      [(r["code"], r["run"], round(r["wall_s"], 1), round(r["cpu_s"], 1),
                        round(r["maxrss_mib"]), round(r["spill_mib"]), round(r["load"], 2),
                        "yes" if r["tables"] == before else "NO") for r in runs]))
    finally:
        for q in (copy, Path(f"{copy}.wal")):
            q.unlink(missing_ok=True)
        shutil.rmtree(f"{copy}.tmp", ignore_errors=True)
    write_json(args.json, res)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
