"""`gpu-ledger meter --wait SECONDS`: a second run on a ledger another process holds waits for
it (polling DuckDB's lock) instead of exiting 7 at once, with real processes on a real file:
a `meter` held mid-ingest by a stalled store, and a plain process holding the ledger open."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import conftest_prom
import pytest
from promtools import http_server, proxy_to
from test_meter_crash import _ledger

fleet_om_file = conftest_prom.fleet_om_file
fleet_prom_url = conftest_prom.fleet_prom_url
DAY = ["--from", "2026-10-05", "--to", "2026-10-06", "--chunk", "6"]
ROOT = Path(__file__).resolve().parent.parent


def _meter(*args: str) -> list[str]:
    return [sys.executable, "-m", "gpu_ledger.cli", "meter", *DAY, *args]


def _line(proc: subprocess.Popen[str], text: str, timeout: float = 120) -> list[str]:
    """stderr lines of `proc` up to the first containing `text`."""
    assert proc.stderr is not None
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line)
        if text in line:
            return lines
    raise AssertionError(f"no {text!r} in {lines}")


def test_a_second_meter_waits_for_the_first_then_runs(
        fleet_prom_url: str, fleet_om_file: Path, tmp_path: Path) -> None:
    """Run A meters from Prometheus and stalls in its second chunk (the store stops
    answering); run B with --wait 120 says once that it waits, starts when A has finished,
    and the ledger is B's complete run, as if the two had been started one after the other."""
    clean = tmp_path / "clean.duckdb"
    subprocess.run(_meter("--openmetrics", str(fleet_om_file), "--db", str(clean)),
                   check=True, capture_output=True, cwd=ROOT)
    db = tmp_path / "m.duckdb"
    stalled = threading.Event()
    release = threading.Event()

    def stalling(path: str, headers: dict[str, str]) -> tuple[int, str, bytes]:
        if path.startswith("/api/v1/query_range") and "start=1791180000" in path:
            stalled.set()  # chunk 2 (06:00 ..): hold it until B is waiting
            release.wait(120)
        return proxy_to(fleet_prom_url, path, headers)

    with http_server(stalling) as url:
        a = subprocess.Popen(_meter("--prometheus", url, "--db", str(db)), cwd=ROOT,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        b = None
        try:
            assert stalled.wait(120), "run A never reached chunk 2"
            b = subprocess.Popen(
                _meter("--openmetrics", str(fleet_om_file), "--db", str(db), "--wait", "120"),
                cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            waiting = _line(b, "waiting up to 120 s")
            assert f"{db} is in use by another process (PID {a.pid})" in waiting[-1]
            assert a.poll() is None and b.poll() is None  # both alive: B is waiting on A
            release.set()
            assert a.wait(120) == 0
            assert b.wait(120) == 0, b.stderr.read() if b.stderr else ""
            rest = b.stderr.read() if b.stderr else ""
            assert "waiting" not in rest and "meter: priced" in rest  # said once, then ran
        finally:
            release.set()
            for proc in (a, b):
                if proc is not None and proc.poll() is None:
                    proc.kill()
                    proc.wait()
    assert _ledger(db) == _ledger(clean)


def test_wait_gives_up_at_its_deadline_and_zero_refuses_at_once(
        fleet_om_file: Path, tmp_path: Path) -> None:
    db = tmp_path / "m.duckdb"
    subprocess.run(_meter("--openmetrics", str(fleet_om_file), "--db", str(db)),
                   check=True, capture_output=True, cwd=ROOT)
    before = _ledger(db)
    holder = subprocess.Popen([sys.executable, "-c", "import duckdb, sys; "
                               f"c = duckdb.connect({str(db)!r}); print('held', flush=True); "
                               "sys.stdin.read()"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        started = time.monotonic()
        run = subprocess.run(_meter("--openmetrics", str(fleet_om_file), "--db", str(db),
                                    "--wait", "1.5"), capture_output=True, text=True, cwd=ROOT)
        assert time.monotonic() - started >= 1.5  # it did wait
        lines = run.stderr.splitlines()
        assert run.returncode == 7, run.stderr
        assert f"is in use by another process (PID {holder.pid}); waiting up to 1.5 s" \
            in run.stderr
        assert lines[-1].startswith("gpu-ledger meter: ") and "Traceback" not in run.stderr
        assert "still in use by another process after waiting 1.5 s (--wait); nothing was " \
               "written" in lines[-1]
        # --price-only waits the same way; without --wait (0) the refusal is immediate.
        run = subprocess.run([sys.executable, "-m", "gpu_ledger.cli", "meter", "--price-only",
                              *DAY, "--db", str(db), "--wait", "0.5"],
                             capture_output=True, text=True, cwd=ROOT)
        assert run.returncode == 7 and "after waiting 0.5 s" in run.stderr, run.stderr
        run = subprocess.run(_meter("--openmetrics", str(fleet_om_file), "--db", str(db)),
                             capture_output=True, text=True, cwd=ROOT)
        assert run.returncode == 7 and "waiting" not in run.stderr, run.stderr
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=30)
    assert _ledger(db) == before


@pytest.mark.parametrize("value", ["-1", "nan", "1e9"])
def test_wait_must_be_a_sane_number_of_seconds(
        fleet_om_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        value: str) -> None:
    from metering.cli_meter import main

    rc = main(["--openmetrics", str(fleet_om_file), *DAY, "--db", str(tmp_path / "m.duckdb"),
               "--wait", value])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "--wait" in err, err
