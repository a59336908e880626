"""`meter --jobs N` (issue 27, item 4): worker processes fetch and decode chunks for the one
ledger writer. The bill is the same to the cent with 1 and 2 jobs, from a real Prometheus and
from OpenMetrics; the chunks are fetched by other processes than the writer; a worker's
failure is one line and writes nothing for its chunk; Ctrl-C leaves no worker behind."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import conftest_prom
import pytest
from conftest_prom import expected_facts, fact_rows

from metering import api
from metering.cli_meter import main
from metering.cores import available_cores
from metering.db import connect
from metering.errors import MeteringError
from metering.matrix import Matrix
from metering.openmetrics_source import OpenMetricsSource
from metering.period import Period, resolve
from metering.signals import SignalSpec

fleet_om_file = conftest_prom.fleet_om_file  # session fixtures
fleet_prom_url = conftest_prom.fleet_prom_url
DAY = ["--from", "2026-10-05", "--to", "2026-10-06", "--chunk", "6"]


def _bill(db: Path) -> dict[str, list[tuple[Any, ...]]]:
    with connect(db, read_only=True) as con:
        return {t: sorted(con.execute(f"SELECT * EXCLUDE (priced_at) FROM {t}"
                                      if t == "charges" and _has(con, t, "priced_at")
                                      else f"SELECT * FROM {t}").fetchall(), key=repr)
                for t in ("device_hours", "mig_hours", "allocation_hours", "charges")}


def _has(con: Any, table: str, column: str) -> bool:
    return bool(con.execute("SELECT count(*) FROM information_schema.columns WHERE "
                            "table_name = ? AND column_name = ?", [table, column]).fetchone()[0])


@pytest.mark.parametrize("source", ["prometheus", "openmetrics"])
def test_one_and_two_jobs_give_the_same_bill_and_workers_fetch(
        source: str, fleet_om_file: Path, fleet_prom_url: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    args = (["--openmetrics", str(fleet_om_file)] if source == "openmetrics"
            else ["--prometheus", fleet_prom_url])
    bills = {}
    for jobs in (1, 2):
        db = tmp_path / f"j{jobs}.duckdb"
        rc = main([*args, *DAY, "--db", str(db), "--jobs", str(jobs), "--verbose"])
        err = capsys.readouterr().err
        assert rc == 0, err
        assert "Traceback" not in err
        bills[jobs] = _bill(db)
        with connect(db, read_only=True) as con:
            assert fact_rows(con, "allocation_hours") == expected_facts()["allocation_hours"]
        found = re.search(r"4 chunk\(s\) fetched by (\d) worker process\(es\) of 2 \(pids "
                          r"([\d, ]+)\)", err)
        if jobs == 1:
            assert found is None, err
            continue
        assert found is not None, err
        pids = {int(p) for p in found.group(2).split(", ")}
        assert len(pids) == int(found.group(1)) <= 2
        assert os.getpid() not in pids  # fetched and decoded elsewhere than the writer
    assert bills[1]["charges"], "nothing priced"
    assert bills[1] == bills[2]


class _Broken(OpenMetricsSource):
    """Fails on its third chunk with a bug's exception (not a MeteringError)."""

    def fetch(self, chunk: Period) -> Iterator[list[tuple[SignalSpec, Matrix]]]:
        if chunk.start.hour == 12:
            raise ValueError("boom\nsecond line")
        return super().fetch(chunk)


def test_a_failing_worker_is_one_line_and_writes_nothing_for_its_chunk(
        fleet_om_file: Path, tmp_path: Path) -> None:
    period = resolve(None, "2026-10-05", "2026-10-06")
    db = tmp_path / "m.duckdb"
    source = _Broken(str(fleet_om_file), period)
    with pytest.raises(MeteringError) as failed:
        api.meter(db, source, period, api.MeterSettings(chunk_hours=6, jobs=2))
    message = str(failed.value)
    assert re.fullmatch(r"chunk 2026-10-05T12:00Z \.\. 2026-10-05T18:00Z: worker process \d+ "
                        r"failed: ValueError: boom second line", message), message
    with connect(db, read_only=True) as con:
        hours = con.execute("SELECT DISTINCT hour(hour) FROM device_hours ORDER BY 1").fetchall()
    assert [h for (h,) in hours] == list(range(12))  # the two chunks before it are kept


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_ctrl_c_with_workers_exits_130_and_leaves_no_worker(fleet_prom_url: str,
                                                            tmp_path: Path) -> None:
    db = tmp_path / "m.duckdb"
    proc = subprocess.Popen([sys.executable, "-m", "gpu_ledger.cli", "meter", "--prometheus",
                             fleet_prom_url, "--db", str(db), "--from", "2026-10-05", "--to",
                             "2026-10-06", "--chunk", "1", "--jobs", "2"],
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    assert proc.stderr is not None
    lines, workers = [], []
    for line in proc.stderr:
        lines.append(line)
        if "meter: chunk " in line:
            workers = _children(proc.pid)
            proc.send_signal(signal.SIGINT)
            break
    _, rest = proc.communicate(timeout=60)
    err = "".join(lines) + rest
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1].startswith("gpu-ledger meter: interrupted;"), err
    assert "Traceback" not in err
    assert len(workers) >= 2, workers  # the workers were there when the signal came
    deadline = time.monotonic() + 5
    while any(map(_alive, workers)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(map(_alive, workers)), workers
    assert main(["--prometheus", fleet_prom_url, "--db", str(db), "--from", "2026-10-05",
                 "--to", "2026-10-06", "--chunk", "1", "--jobs", "2", "--quiet"]) == 0


def test_available_cores_follow_the_cgroup_quota(tmp_path: Path) -> None:
    own = len(os.sched_getaffinity(0))
    assert available_cores(tmp_path) == own  # no quota files
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert available_cores(tmp_path) == own
    (tmp_path / "cpu.max").write_text("50000 100000\n")  # half a core: one process
    assert available_cores(tmp_path) == 1
    (tmp_path / "cpu.max").write_text(f"{(own + 8) * 100000} 100000\n")
    assert available_cores(tmp_path) == own  # a quota above the affinity does not add


@pytest.mark.parametrize("value", ["0", "257", "-1", "²", "two"])
def test_jobs_must_be_a_count_or_auto(value: str, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--openmetrics", "x.om", *DAY, "--db", str(tmp_path / "m.duckdb"),
                 "--jobs", value]) == 2
    assert capsys.readouterr().err.strip() == (
        f"gpu-ledger meter: --jobs: expected 1 to 256 worker processes or auto, got {value}")
