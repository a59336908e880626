"""Ctrl-C and waits of `gpu-ledger meter` (issue 27, item 6), with real processes, a real
DuckDB file and a real Prometheus: SIGINT at any point of a run exits 130 with the one
documented line and no traceback, leaves a ledger that opens and that a re-run completes to the
bill of an uninterrupted run; a wrong URL says what it waits for and leaves no ledger file."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import conftest_prom
import pytest

from metering.db import connect

fleet_om_file = conftest_prom.fleet_om_file  # session fixtures
fleet_prom_url = conftest_prom.fleet_prom_url
DAY = ["--from", "2026-10-05", "--to", "2026-10-06", "--chunk", "1"]
LINE = ("gpu-ledger meter: interrupted; committed chunks are kept and the same command "
        "resumes after them")


def _cmd(source: list[str], db: Path) -> list[str]:
    return [sys.executable, "-m", "gpu_ledger.cli", "meter", *source, "--db", str(db), *DAY]


def _bill(db: Path) -> dict[str, list[tuple[Any, ...]]]:
    with connect(db, read_only=True) as con:
        return {t: sorted(con.execute(f"SELECT * FROM {t}").fetchall(), key=repr)
                for t in ("device_hours", "allocation_hours", "charges")}


def _interrupt_when(cmd: list[str], trigger: str, nth: int) -> tuple[int, str]:
    """SIGINT the run right after its nth stderr line containing `trigger`."""
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    assert proc.stderr is not None
    seen, lines = 0, []
    for line in proc.stderr:
        lines.append(line)
        if trigger in line:
            seen += 1
            if seen == nth:
                proc.send_signal(signal.SIGINT)
                break
    _, rest = proc.communicate(timeout=60)
    return proc.returncode, "".join(lines) + rest


@pytest.mark.parametrize("source, trigger, nth", [
    ("openmetrics", "meter: 2026-10-05", 1),  # before the first chunk
    ("openmetrics", "meter: chunk ", 5),  # mid-ingest
    ("openmetrics", "meter: 24 chunks", 1),  # pricing
    ("prometheus", "meter: chunk ", 3),  # mid-ingest, queries in flight
    ("prometheus", "meter: 24 chunks", 1),
])
def test_sigint_exits_130_with_one_line_and_the_rerun_completes_the_bill(
        source: str, trigger: str, nth: int, fleet_om_file: Path, fleet_prom_url: str,
        tmp_path: Path) -> None:
    args = (["--openmetrics", str(fleet_om_file)] if source == "openmetrics"
            else ["--prometheus", fleet_prom_url])
    clean = tmp_path / "clean.duckdb"
    subprocess.run(_cmd(args, clean), check=True, capture_output=True)
    db = tmp_path / "cut.duckdb"
    started = time.monotonic()
    rc, err = _interrupt_when(_cmd(args, db), trigger, nth)
    assert rc == 130, err
    assert err.strip().splitlines()[-1] == LINE, err
    assert "Traceback" not in err and "Error" not in err.replace("gpu-ledger meter:", ""), err
    assert time.monotonic() - started < 30  # stopped, not ignored until the run's end
    if db.exists():  # it opens for writing (schema checked) after the interrupt
        connect(db).close()
    again = subprocess.run(_cmd(args, db), capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    assert _bill(db) == _bill(clean)


def test_a_wrong_url_says_what_it_waits_for_and_leaves_no_ledger(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: connections are refused
    url = f"http://127.0.0.1:{port}"
    db = tmp_path / "new.duckdb"
    run = subprocess.run([sys.executable, "-m", "gpu_ledger.cli", "meter", "--prometheus", url,
                          "--db", str(db), *DAY, "--retries", "2", "--retry-delay", "0.05"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 5, run.stderr
    waits = [ln for ln in run.stderr.splitlines() if "retry " in ln]
    # one round of retries, each line naming the URL and the wait; later requests try once
    assert waits == [f"gpu-ledger meter: {url}: cannot connect: [Errno 111] Connection "
                     f"refused; retry {i} of 2 in {0.05 * 2 ** (i - 1):g} s" for i in (1, 2)]
    assert "Traceback" not in run.stderr
    assert not db.exists() and not Path(f"{db}.wal").exists()


def test_sigint_at_a_sweep_of_moments_never_gives_a_traceback(
        fleet_om_file: Path, tmp_path: Path) -> None:
    """A week in one chunk: SIGINT lands inside DuckDB's scans, fact SQL and pricing (before
    the fix: `KeyboardInterrupt` out of an Arrow scan, `TransactionContext Error`, `pricing
    failed: RuntimeError: Query interrupted`, each exit 1). Every run ends either interrupted
    (130, the one line) or, when the signal came after the work, finished (0)."""
    week = ["--from", "2026-10-01", "--to", "2026-10-08"]
    outcomes = []
    for i, delay in enumerate(x / 20 for x in range(15)):  # 0 to 0.7 s
        db = tmp_path / f"w{i}.duckdb"
        proc = subprocess.Popen([sys.executable, "-m", "gpu_ledger.cli", "meter",
                                 "--openmetrics", str(fleet_om_file), "--db", str(db), *week],
                                stderr=subprocess.PIPE, text=True)
        assert proc.stderr is not None
        head = []
        for line in proc.stderr:
            head.append(line)
            if "meter: 2026-10-01" in line:
                break
        time.sleep(delay)
        proc.send_signal(signal.SIGINT)
        _, rest = proc.communicate(timeout=60)
        err = "".join(head) + rest
        assert "Traceback" not in err, err
        assert proc.returncode in (0, 130), err
        if proc.returncode == 130:
            assert err.strip().splitlines()[-1] == LINE, err
        outcomes.append(proc.returncode)
        if db.exists():
            connect(db).close()  # opens for writing: schema intact
    assert outcomes.count(130) >= 3, outcomes  # the sweep did interrupt runs mid-way


def test_query_summary_counts_the_nodes_of_the_busiest_chunk(
        fleet_prom_url: str, tmp_path: Path) -> None:
    """A period whose last chunk has no data (the demo's `--days 3` in a whole month) said
    "over 0 node(s)" while metering device-hours: the count is the most of any chunk."""
    run = subprocess.run([sys.executable, "-m", "gpu_ledger.cli", "meter", "--prometheus",
                          fleet_prom_url, "--db", str(tmp_path / "l.duckdb"), "--from",
                          "2026-10-05", "--to", "2026-10-09", "--chunk", "24", "--no-price"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    (summary,) = [ln for ln in run.stderr.splitlines() if ln.startswith("meter: queries:")]
    assert "over up to " in summary and "over up to 0 node" not in summary, summary
    assert "no device data for" in run.stderr  # the last chunks were empty indeed
