"""An interrupted month resumes after its last committed chunk: a run killed with SIGKILL (or
stopped by a store that went away) is taken over by the next run of the same source and
period, which sends no query for the committed chunks and ends with the same facts and bill
as a run that was never interrupted."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
from pathlib import Path

import conftest_prom
import pytest
from conftest_prom import expected_facts, fact_rows
from promtools import http_server, proxy_to

from metering.cli_meter import main
from metering.db import connect
from metering.recorded import markers_promql
from metering.signals import SIGNALS

fleet_om_file = conftest_prom.fleet_om_file
fleet_prom_url = conftest_prom.fleet_prom_url
# One process: the proxies below count and hold queries in chunk order (workers interleave).
DAY = ["--from", "2026-10-05", "--to", "2026-10-06", "--chunk", "6", "--retries", "0",
       "--jobs", "1"]
FACTS = ("device_hours", "mig_hours", "allocation_hours", "workload_hours")


def _signal_query(path: str) -> bool:
    """A range query for a metering signal: the recorded-series marker probe each chunk sends
    first (metering/recorded.py) is not one of the chunk's signal queries."""
    if not path.startswith("/api/v1/query_range"):
        return False
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(path).query)
    return query.get("query", [""])[0] != markers_promql()


class Counting:
    """A proxy in front of the real Prometheus that logs the chunk start of every range query
    and, once `block_after` of them were answered, holds further ones (for a kill)."""

    def __init__(self, target: str, block_after: int | None = None) -> None:
        self.target = target
        self.block_after = block_after
        self.starts: list[float] = []
        self.release = threading.Event()

    def __call__(self, path: str, headers: dict[str, str]) -> tuple[int, str, bytes]:
        if _signal_query(path):
            query = urllib.parse.parse_qs(urllib.parse.urlsplit(path).query)
            if self.block_after is not None and len(self.starts) >= self.block_after:
                self.release.wait(60)
            self.starts.append(float(query["start"][0]))
        return proxy_to(self.target, path, headers)


def _ledger(db: Path) -> dict[str, list[tuple[object, ...]]]:
    con = connect(db, read_only=True)
    try:
        rows = {t: fact_rows(con, t) for t in FACTS}
        rows["charges"] = sorted(con.execute(
            "SELECT hour, team, namespace, pod, uuid, sharing, cost FROM charges").fetchall(),
            key=str)
        return rows
    finally:
        con.close()


def test_sigkill_mid_month_resumes_after_the_committed_chunks(
        fleet_prom_url: str, tmp_path: Path) -> None:
    whole = tmp_path / "whole.duckdb"
    assert main(["--prometheus", fleet_prom_url, *DAY, "--db", str(whole), "-q"]) == 0

    db = tmp_path / "m.duckdb"
    # Chunk 1 is answered (17 queries), then the proxy holds chunk 2's first query. One proxy
    # for both runs: a run resumes only a run of the same source (URL) and period.
    counting = Counting(fleet_prom_url, block_after=len(SIGNALS))
    with http_server(counting) as url:
        proc = subprocess.Popen(
            [sys.executable, "-c", "import sys; from metering.cli_meter import main; "
             "sys.exit(main())", "--prometheus", url, *DAY, "--db", str(db)],
            stderr=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parent.parent)
        assert proc.stderr is not None
        deadline = time.monotonic() + 60
        lines = []
        while time.monotonic() < deadline:
            line = proc.stderr.readline()
            lines.append(line)
            if "chunk 1/4" in line or not line:
                break
        assert any("chunk 1/4" in x for x in lines), "".join(lines)
        os.kill(proc.pid, signal.SIGKILL)  # no handler, no cleanup: what a node OOM does
        proc.wait(10)
        assert proc.returncode == -signal.SIGKILL

        # The killed run committed chunk 1 (the kill came while chunk 2 was being fetched).
        con = connect(db, read_only=True)
        assert con.execute("SELECT count(*) FROM ingest_chunks").fetchone() == (1,)
        assert con.execute("SELECT count(*) FROM ingest_runs WHERE finished_at IS NULL"
                           ).fetchone() == (1,)
        con.close()

        counting.block_after = None
        counting.release.set()
        time.sleep(0.5)  # the held request of the killed run goes through and is logged
        counting.starts.clear()
        again = counting
        err = _run(["--prometheus", url, *DAY, "--db", str(db)])
    assert "resuming the run started" in err and "1 of 4 chunk(s) already committed" in err
    # No query for the committed chunk (2026-10-05T00:00 .. 06:00): 3 chunks x 17 queries.
    first = min(again.starts)
    assert first >= 1_791_180_000 and len(again.starts) == 3 * len(SIGNALS), again.starts
    assert _ledger(db) == _ledger(whole)
    con = connect(db, read_only=True)
    assert fact_rows(con, "device_hours") == expected_facts()["device_hours"]
    assert con.execute("SELECT count(*) FROM ingest_runs WHERE finished_at IS NULL"
                       ).fetchone() == (0,)
    con.close()


def _run(argv: list[str]) -> str:
    import io
    from contextlib import redirect_stderr

    err = io.StringIO()
    with redirect_stderr(err):
        rc = main(argv)
    assert rc == 0, err.getvalue()
    return err.getvalue()


def test_store_gone_mid_month_then_resume(fleet_prom_url: str, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "m.duckdb"
    served = [0]

    def flaky(path: str, headers: dict[str, str]) -> tuple[int, str, bytes]:
        if _signal_query(path):
            served[0] += 1
            if served[0] > 2 * len(SIGNALS):  # two chunks, then the store is gone
                return 503, "text/plain", b"down"
        return proxy_to(fleet_prom_url, path, headers)

    with http_server(flaky) as url:
        rc = main(["--prometheus", url, *DAY, "--db", str(db), "-q"])
        assert rc == 5 and "chunk 3/4" in capsys.readouterr().err
        served[0] = -10_000  # the store is back
        err = _run(["--prometheus", url, *DAY, "--db", str(db)])
    assert "2 of 4 chunk(s) already committed" in err
    assert served[0] == -10_000 + 2 * len(SIGNALS)
    con = connect(db, read_only=True)
    assert fact_rows(con, "allocation_hours") == expected_facts()["allocation_hours"]
    con.close()


def test_a_finished_run_is_metered_again_and_no_resume_forces_it(
        fleet_prom_url: str, tmp_path: Path) -> None:
    db = tmp_path / "m.duckdb"
    counting = Counting(fleet_prom_url)
    with http_server(counting) as url:
        _run(["--prometheus", url, *DAY, "--db", str(db)])
        counting.starts.clear()  # finished: every chunk again (late data, a fix)
        err = _run(["--prometheus", url, *DAY, "--db", str(db)])
        assert "meter: resuming" not in err and len(counting.starts) == 4 * len(SIGNALS)
        con = connect(db)  # as if that run had been killed after its last chunk
        con.execute("UPDATE ingest_runs SET finished_at = NULL")
        con.close()
        counting.starts.clear()
        err = _run(["--prometheus", url, *DAY, "--db", str(db), "--no-resume"])
        assert "meter: resuming" not in err and len(counting.starts) == 4 * len(SIGNALS)
        con = connect(db)
        con.execute("UPDATE ingest_runs SET finished_at = NULL")
        con.close()
        counting.starts.clear()
        err = _run(["--prometheus", url, *DAY, "--db", str(db)])
        assert "4 of 4 chunk(s) already committed" in err and counting.starts == []
    # Another source (here the store itself, not the proxy) never takes a run over.
    err = _run(["--prometheus", fleet_prom_url, *DAY, "--db", str(db)])
    assert "meter: resuming" not in err


def _interrupted(url: str, db: Path, capsys: pytest.CaptureFixture[str],
                 *options: str) -> None:
    """A run with `options` that commits chunks 1 and 2 of 4, then loses the store (exit 5)."""
    served = [0]

    def flaky(path: str, headers: dict[str, str]) -> tuple[int, str, bytes]:
        if _signal_query(path):
            served[0] += 1
            if served[0] > 2 * len(SIGNALS):
                return 503, "text/plain", b"down"
        return proxy_to(url, path, headers)

    with http_server(flaky) as flaky_url:
        # The proxy's URL differs from `url`: record the run under `url`, as the rerun sees it.
        rc = main(["--prometheus", flaky_url, *DAY, "--db", str(db), "-q", *options])
    assert rc == 5, capsys.readouterr().err
    con = connect(db)
    assert con.execute("SELECT count(*) FROM ingest_chunks").fetchone() == (2,)
    con.execute("UPDATE ingest_runs SET source = $u", {"u": url})
    con.close()


@pytest.mark.parametrize(("first", "then"), [
    ((), ("--selector", 'node="node-a"', "--replace")),  # drops node-b's device-hours
    (("--selector", 'node="node-a"'), ()),
    ((), ("--cluster", "eu-west")),
    ((), ("--cluster-label", "cluster")),
    ((), ("--sample-interval", "30")),
    ((), ("--chunk", "12")),
], ids=["selector-narrowed", "selector-widened", "cluster", "cluster-label",
        "sample-interval", "chunk"])
def test_a_rerun_with_other_settings_does_not_take_over_committed_chunks(
        fleet_prom_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        first: tuple[str, ...], then: tuple[str, ...]) -> None:
    """Chunks committed under one selector (or cluster options, sample interval, chunk length)
    hold that run's facts: a rerun with other settings fetches them again and the ledger ends
    exactly as a clean run with the new settings, never a mix of the two."""
    db = tmp_path / "m.duckdb"
    _interrupted(fleet_prom_url, db, capsys, *first)
    clean = tmp_path / "clean.duckdb"
    assert main(["--prometheus", fleet_prom_url, *DAY, "--db", str(clean), "-q", *then]) == 0
    counting = Counting(fleet_prom_url)
    with http_server(counting) as url:
        con = connect(db)  # the interrupted run as if it had been made through this proxy
        con.execute("UPDATE ingest_runs SET source = $u", {"u": url})
        con.close()
        err = _run(["--prometheus", url, *DAY, "--db", str(db), *then])
    assert "meter: resuming" not in err
    assert "not resuming the interrupted run of this source and period: it used other " \
           "settings (selector=" in err
    chunks = 2 if "--chunk" in then else 4
    assert len(counting.starts) == chunks * len(SIGNALS), counting.starts
    if "--cluster" in then:  # another cluster's hours are never touched: set them aside
        con = connect(db)
        held = con.execute("SELECT count(DISTINCT hour) FROM device_hours WHERE cluster = "
                           "'default'").fetchone()
        for table in (*FACTS, "charges"):
            con.execute(f"DELETE FROM {table} WHERE cluster = 'default'")
        con.close()
        assert held == (12,)  # the interrupted run's two 6-hour chunks
    assert _ledger(db) == _ledger(clean)


def test_a_narrower_selector_bills_only_its_series_after_an_interrupted_default_run(
        fleet_prom_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The interrupted run (default selector: both nodes) committed the day's first 12 hours
    with node-b's GPUs; the rerun with node="node-a" must bill node-a only in every hour.
    Node-b holds GPU-b0 and GPU-b1 (6 GPUs in all, 4 on node-a): 24 h x 4 device rows."""
    db = tmp_path / "m.duckdb"
    _interrupted(fleet_prom_url, db, capsys)
    con = connect(db, read_only=True)
    assert con.execute("SELECT count(DISTINCT node) FROM device_hours").fetchone() == (2,)
    con.close()
    _run(["--prometheus", fleet_prom_url, *DAY, "--db", str(db), "--selector", 'node="node-a"',
          "--replace"])  # node-b's device-hours go: refused without it
    con = connect(db, read_only=True)
    assert con.execute("SELECT node, count(*) FROM device_hours GROUP BY node").fetchall() \
        == [("node-a", 24 * 4)]
    charged = con.execute("SELECT DISTINCT uuid FROM charges WHERE uuid <> '' ORDER BY uuid"
                          ).fetchall()
    con.close()
    assert charged and all(u.startswith("GPU-a") for (u,) in charged), charged


def test_the_same_settings_written_differently_still_resume(
        fleet_prom_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Braces and matcher order do not change a selector: the rerun resumes."""
    db = tmp_path / "m.duckdb"
    _interrupted(fleet_prom_url, db, capsys, "--selector", 'node=~"node-.*",job=~"|x"')
    err = _run(["--prometheus", fleet_prom_url, *DAY, "--db", str(db),
                "--selector", '{ job=~"|x", node=~"node-.*" }'])
    assert "2 of 4 chunk(s) already committed" in err


def test_a_chunk_rewritten_by_a_later_run_is_not_skipped(
        fleet_prom_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Selector X is interrupted after 2 chunks, a full run with selector Y rewrites the day,
    then X runs again: X's committed chunks now hold Y's facts, so none is skipped."""
    db = tmp_path / "m.duckdb"
    _interrupted(fleet_prom_url, db, capsys)
    _run(["--prometheus", fleet_prom_url, *DAY, "--db", str(db), "--selector", 'node="node-a"',
          "--replace"])
    counting = Counting(fleet_prom_url)
    with http_server(counting) as url:
        con = connect(db)
        con.execute("UPDATE ingest_runs SET source = $u", {"u": url})
        con.close()
        err = _run(["--prometheus", url, *DAY, "--db", str(db)])
    assert "meter: resuming" not in err and len(counting.starts) == 4 * len(SIGNALS)
    con = connect(db, read_only=True)
    assert fact_rows(con, "device_hours") == expected_facts()["device_hours"]
    con.close()


def test_an_interrupted_run_recorded_before_settings_existed_is_not_taken_over(
        fleet_prom_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A ledger written before runs recorded their settings: its unfinished run's selector is
    unknown, so opening migrates the tables and the next run meters every chunk."""
    db = tmp_path / "m.duckdb"
    _interrupted(fleet_prom_url, db, capsys)
    con = connect(db)
    con.execute("ALTER TABLE ingest_runs DROP COLUMN settings")
    con.execute("ALTER TABLE ingest_chunks DROP COLUMN clusters")
    con.close()
    err = _run(["--prometheus", fleet_prom_url, *DAY, "--db", str(db)])
    assert "meter: resuming" not in err
    assert "it used other settings (unknown: recorded by an older version)" in err
    con = connect(db, read_only=True)
    assert con.execute("SELECT settings FROM ingest_runs ORDER BY run_id").fetchall() == [
        ("",), ('selector={job=~"gpu-ledger-exporter|"} cluster=default cluster_label=- '
               "chunk=6h sample_interval=detected",)]
    assert fact_rows(con, "device_hours") == expected_facts()["device_hours"]
    con.close()
