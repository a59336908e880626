"""Crash safety of `gpu-ledger meter` (issue 13, point 5), proven with real processes and a
real DuckDB file: `kill -9` at random points of a run, mid-ingest and mid-pricing, then a
re-run of the same command gives the ledger of an uninterrupted run, row for row; two runs on
one ledger at once either both finish or the second refuses (exit 7), never a mixed ledger.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import conftest_prom

from metering.db import connect

fleet_om_file = conftest_prom.fleet_om_file  # session fixture
DAY = ["--from", "2026-10-05", "--to", "2026-10-06"]
# One transaction per hour: 24 ingest commits, then pricing; plenty of points to die at.
ARGS = ["--chunk", "1", *DAY]
SEED = int(os.environ.get("GPU_LEDGER_CRASH_SEED", "13"))


def _cmd(om: Path, db: Path) -> list[str]:
    return [sys.executable, "-m", "gpu_ledger.cli", "meter", "--openmetrics", str(om),
            "--db", str(db), *ARGS]


def _ledger(db: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Everything a bill is made of: the facts, the hours covered and every charge row
    (coverage.ingested_at aside, the one column a re-run may change)."""
    with connect(db, read_only=True) as con:
        out = {}
        for table in ("device_hours", "mig_hours", "allocation_hours", "workload_hours",
                      "charges"):
            out[table] = sorted(con.execute(f"SELECT * FROM {table}").fetchall(), key=repr)
        out["coverage"] = sorted(con.execute(
            "SELECT hour, source, devices FROM coverage").fetchall())
        return out


def _kill_when(proc: subprocess.Popen[str], trigger: str, nth: int, delay: float) -> bool:
    """SIGKILL `proc` `delay` s after the nth stderr line containing `trigger`; False if it
    finished first."""
    assert proc.stderr is not None
    seen = 0
    for line in proc.stderr:
        if trigger in line:
            seen += 1
            if seen == nth:
                time.sleep(delay)
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                return proc.returncode == -signal.SIGKILL
    proc.wait()
    return False


def test_kill_9_at_random_points_then_rerun_gives_the_uninterrupted_bill(
        fleet_om_file: Path, tmp_path: Path) -> None:
    clean = tmp_path / "clean.duckdb"
    subprocess.run(_cmd(fleet_om_file, clean), check=True, capture_output=True)
    want = _ledger(clean)
    assert len(want["device_hours"]) == 144 and len(want["charges"]) > 144
    rng = random.Random(SEED)
    # (what the kill interrupts, the stderr line to wait for, which one, extra delay)
    plan = [("ingest", "meter: chunk ", rng.randint(1, 23), rng.uniform(0, 0.05))
            for _ in range(3)]
    plan += [("pricing", "meter: 24 chunks", 1, rng.uniform(0, 0.02)) for _ in range(2)]
    plan += [("start", "meter: 2026-10-05", 1, rng.uniform(0, 0.2))]
    killed = {"ingest": 0, "pricing": 0, "start": 0}
    for i, (phase, trigger, nth, delay) in enumerate(plan):
        db = tmp_path / f"run{i}.duckdb"
        if i % 2:  # a ledger that already held the day (a re-run killed half way)
            db.write_bytes(clean.read_bytes())
        proc = subprocess.Popen(_cmd(fleet_om_file, db), text=True,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        killed[phase] += _kill_when(proc, trigger, nth, delay)
        rerun = subprocess.run(_cmd(fleet_om_file, db), capture_output=True, text=True)
        assert rerun.returncode == 0, (phase, nth, delay, rerun.stderr)
        got = _ledger(db)
        for table, rows in want.items():
            assert got[table] == rows, (table, phase, nth, delay)
    # The kills landed where they were meant to (a run that finished first proves nothing).
    assert killed["ingest"] >= 2 and killed["pricing"] >= 1, killed


def test_two_runs_on_one_ledger_serialise_or_the_second_refuses(
        fleet_om_file: Path, tmp_path: Path) -> None:
    clean = tmp_path / "clean.duckdb"
    subprocess.run(_cmd(fleet_om_file, clean), check=True, capture_output=True)
    want = _ledger(clean)
    db = tmp_path / "shared.duckdb"
    refused = 0
    for _ in range(2):
        procs = [subprocess.Popen(_cmd(fleet_om_file, db), text=True,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                 for _ in range(2)]
        results = [(p.wait(), p.stderr.read() if p.stderr else "") for p in procs]
        for rc, err in results:
            assert rc in (0, 7), err
            if rc == 7:
                refused += 1
                assert len(err.strip().splitlines()) == 1, err
                assert "in use by another process" in err and "nothing was written" in err
        assert any(rc == 0 for rc, _ in results)
        assert _ledger(db) == want
    print(f"refused {refused} of 4 concurrent runs")


def test_a_held_ledger_refuses_meter_and_report_in_one_line(
        fleet_om_file: Path, tmp_path: Path) -> None:
    db = tmp_path / "m.duckdb"
    subprocess.run(_cmd(fleet_om_file, db), check=True, capture_output=True)
    before = _ledger(db)
    holder = subprocess.Popen([sys.executable, "-c", "import duckdb, sys, time; "
                               f"c = duckdb.connect({str(db)!r}); print('held', flush=True); "
                               "sys.stdin.read()"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        for cmd in (_cmd(fleet_om_file, db),
                    [sys.executable, "-m", "gpu_ledger.cli", "meter", "--price-only", *DAY,
                     "--db", str(db)],
                    [sys.executable, "-m", "gpu_ledger.cli", "report", "--month", "2026-10",
                     "--db", str(db), "--out", str(tmp_path / "out")]):
            run = subprocess.run(cmd, capture_output=True, text=True)
            assert run.returncode == 7, run.stderr
            assert run.stderr.count("\n") == 1 and "Traceback" not in run.stderr
            assert f"{db}: in use by another process (PID {holder.pid})" in run.stderr
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=30)
    assert _ledger(db) == before
    assert not (tmp_path / "out").exists()


def test_a_killed_run_leaves_no_partial_chunk(fleet_om_file: Path, tmp_path: Path) -> None:
    """Right after a kill (before any re-run), every hour is either fully there with its
    coverage row or absent: a chunk is one transaction."""
    db = tmp_path / "m.duckdb"
    proc = subprocess.Popen(_cmd(fleet_om_file, db), text=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert _kill_when(proc, "meter: chunk ", 12, 0.01)
    with connect(db, read_only=True) as con:
        per_hour = dict(con.execute("SELECT hour, count(*) FROM device_hours GROUP BY hour"
                                    ).fetchall())
        covered = {r[0] for r in con.execute("SELECT hour FROM coverage").fetchall()}
    assert set(per_hour) == covered and len(covered) >= 12
    assert set(per_hour.values()) == {6}
