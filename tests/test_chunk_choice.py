"""Chunks stay 72 hours long whatever the fleet; ingest's peak memory is kept within its
budget (lowered by a container memory limit) by node groups, sized from the planner's
estimate of series x hours; the run says what it picked, and --chunk overrides the length."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import conftest_prom
import pytest

from gpu_ledger.cli import main as gpu_ledger
from metering.chunking import (
    DEFAULT_CHUNK_HOURS,
    DEFAULT_INGEST_BUDGET,
    INGEST_BASE_BYTES,
    INGEST_BYTES_PER_POINT,
    choose_chunk,
    duckdb_within,
    memory_budget,
    points_within,
)

fleet_prom_url = conftest_prom.fleet_prom_url  # session fixture
GIB = 1 << 30
T = TypeVar("T")


@pytest.mark.parametrize(("nodes", "budget", "groups"), [
    (10, 3 * GIB, 1),  # a small fleet: one group
    (1_250, 3 * GIB, 1),  # 10,000 GPUs within the default budget
    (1_250, int(1.5 * GIB), 2),  # ... in a 2 GiB container
    (10_000, 3 * GIB, 6),  # 80,000 GPUs
    (10_000, 100 << 20, 813),  # a budget below the base: an eighth of it per group
])
def test_long_chunks_in_node_groups_within_the_budget(nodes: int, budget: int,
                                                      groups: int) -> None:
    series = nodes * 8 * 19
    choice = choose_chunk(series, budget)
    assert choice.hours == DEFAULT_CHUNK_HOURS == 72
    assert choice.groups == groups
    points = series * (choice.hours + 1)
    per_group = points_within(budget)
    assert points <= per_group * groups and (groups == 1 or points > per_group * (groups - 1))
    if budget > INGEST_BASE_BYTES + duckdb_within(budget):
        assert (INGEST_BASE_BYTES + duckdb_within(budget)
                + INGEST_BYTES_PER_POINT * per_group <= budget)


def test_budget_follows_the_container_limit(tmp_path: Path) -> None:
    assert memory_budget(tmp_path) == DEFAULT_INGEST_BUDGET  # no cgroup files
    (tmp_path / "memory.max").write_text("max\n")
    assert memory_budget(tmp_path) == DEFAULT_INGEST_BUDGET
    (tmp_path / "memory.max").write_text(f"{2 * GIB}\n")
    assert memory_budget(tmp_path) == int(1.5 * GIB)
    (tmp_path / "memory.max").write_text(f"{64 * GIB}\n")
    assert memory_budget(tmp_path) == DEFAULT_INGEST_BUDGET
    v1 = tmp_path / "v1"
    (v1 / "memory").mkdir(parents=True)
    (v1 / "memory" / "memory.limit_in_bytes").write_text(f"{GIB}\n")
    assert memory_budget(v1) == 3 * GIB // 4


def test_the_run_says_what_it_picked_and_chunk_overrides(
        fleet_prom_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    day = ["--from", "2026-10-05", "--to", "2026-10-07", "--no-price", "-v"]
    assert gpu_ledger(["meter", "--prometheus", fleet_prom_url, *day,
                       "--db", str(tmp_path / "a.duckdb")]) == 0
    err = capsys.readouterr().err
    assert "meter: chunks of 72 h (automatic: ~" in err, err
    assert "chunk 1/1 " in err  # 48 hours in one 72-hour chunk
    assert gpu_ledger(["meter", "--prometheus", fleet_prom_url, *day, "--chunk", "12",
                       "--db", str(tmp_path / "b.duckdb")]) == 0
    err = capsys.readouterr().err
    assert "automatic" not in err and "chunk 4/4 " in err, err


def test_chunk_option_keeps_the_memory_budget(
        fleet_prom_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """--chunk sets the length only: node groups still keep the container's budget (a tiny
    one here: every node a group of its own), and the facts are the same."""
    import metering.cli_meter as cli_meter
    from metering.db import connect

    day = ["--from", "2026-10-05", "--to", "2026-10-07", "--no-price", "-v", "--chunk", "48"]
    assert gpu_ledger(["meter", "--prometheus", fleet_prom_url, *day,
                       "--db", str(tmp_path / "a.duckdb")]) == 0
    assert "node group(s)" not in capsys.readouterr().err
    monkeypatch.setattr(cli_meter, "memory_budget", lambda: 1 << 10)
    assert gpu_ledger(["meter", "--prometheus", fleet_prom_url, *day,
                       "--db", str(tmp_path / "b.duckdb")]) == 0
    assert "node group(s)" in capsys.readouterr().err
    rows = []
    for name in ("a", "b"):
        with connect(tmp_path / f"{name}.duckdb", read_only=True) as con:
            rows.append(con.execute("SELECT * EXCLUDE (cluster) FROM allocation_hours "
                                    "ORDER BY ALL").fetchall())
    assert rows[0] == rows[1] and rows[0]


def test_duckdb_keeps_its_share_of_the_budget_while_ingesting(
        fleet_prom_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """While ingest writes, DuckDB's cap is its share of ingest's budget (a quarter of 1 GiB
    here, below the 1.5GB default), so that the blocks it caches count against the budget;
    pricing, after, has DuckDB's own cap again."""
    import metering.api as api
    import metering.cli_meter as cli_meter

    caps: dict[str, str] = {}

    def watched(name: str, real: Callable[..., T]) -> Callable[..., T]:
        def call(con: Any, *args: Any, **kwargs: Any) -> T:
            caps[name] = con.execute("SELECT current_setting('memory_limit')").fetchone()[0]
            return real(con, *args, **kwargs)
        return call

    monkeypatch.setattr(cli_meter, "memory_budget", lambda: GIB)
    monkeypatch.setattr(api, "ingest", watched("ingest", api.ingest))
    monkeypatch.setattr(api, "_price", watched("price", api._price))
    assert duckdb_within(GIB) == 256 << 20
    assert gpu_ledger(["meter", "--prometheus", fleet_prom_url, "--from", "2026-10-05",
                       "--to", "2026-10-06", "--db", str(tmp_path / "a.duckdb")]) == 0
    assert caps == {"ingest": "256.0 MiB", "price": "1.3 GiB"}  # 1.5GB is 1.397 GiB


def test_duckdb_out_of_memory_while_ingesting_is_one_line(
        fleet_prom_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """DuckDB running out under its ingest share, between staged node groups too (where an
    aborted transaction's error used to hide it), is exit 8 and the line naming that cap."""
    import metering.chunking as chunking
    import metering.cli_meter as cli_meter

    monkeypatch.setattr(cli_meter, "memory_budget", lambda: 1 << 10)  # a group per node
    monkeypatch.setattr(chunking, "INGEST_DUCKDB_MIN_BYTES", 1 << 20)
    assert gpu_ledger(["meter", "--prometheus", fleet_prom_url, "--from", "2026-10-05",
                       "--to", "2026-10-06", "--no-price",
                       "--db", str(tmp_path / "a.duckdb")]) == 8
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert ("out of memory under DuckDB's 1MiB cap while ingesting (its share of ingest's "
            "memory budget); raise the container's memory limit") in err, err


@pytest.mark.parametrize("stop", ["ctrl-c", "store error"])
def test_a_chunk_stopped_between_node_groups_leaves_the_ledger_as_it_was(
        fleet_prom_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str], stop: str) -> None:
    """A chunk in node groups commits each group's facts on its own (staged, so that memory
    holds one group's, not the chunk's); stopped after its first group, the ledger's facts
    are still those of the earlier run, hour for hour (no hour half rewritten that pricing
    would read), nothing staged is left in the file, and a rerun gives the one-group facts."""
    import os
    import signal

    import metering.cli_meter as cli_meter
    from metering import facts
    from metering.db import connect
    from metering.promclient import PromError

    day = ["--from", "2026-10-05", "--to", "2026-10-07", "--no-price", "--chunk", "48"]
    whole, db = tmp_path / "whole.duckdb", tmp_path / "ledger.duckdb"
    assert gpu_ledger(["meter", "--prometheus", fleet_prom_url, *day, "--db", str(whole)]) == 0
    assert gpu_ledger(["meter", "--prometheus", fleet_prom_url, *day, "--db", str(db)]) == 0

    def ledger(path: Path) -> list[list[tuple[object, ...]]]:
        with connect(path, read_only=True) as con:
            staging = con.execute("SELECT schema_name FROM information_schema.schemata "
                                  f"WHERE schema_name = '{facts.STAGING}'").fetchall()
        return [*_facts_by_table(path), staging]

    before = ledger(db)
    assert before == ledger(whole) and before[0] and before[2]
    monkeypatch.setattr(cli_meter, "memory_budget", lambda: 1 << 10)  # a group per node
    real = facts._Writer.group
    calls: list[int] = []
    staged: list[int] = []

    def group(self: facts._Writer, signals: object) -> None:
        calls.append(1)
        if len(calls) == 2:  # the first group is committed (staged)
            staged.append(self.con.execute(
                f"SELECT count(*) FROM {facts.STAGING}.device_hours").fetchall()[0][0])
            if stop == "ctrl-c":
                os.kill(os.getpid(), signal.SIGINT)
            raise PromError("the store went away")
        real(self, signals)  # type: ignore[arg-type]

    monkeypatch.setattr(facts._Writer, "group", group)
    capsys.readouterr()
    rc = gpu_ledger(["meter", "--prometheus", fleet_prom_url, *day, "--db", str(db)])
    err = capsys.readouterr().err
    assert rc == (130 if stop == "ctrl-c" else 5) and "Traceback" not in err, err
    assert len(calls) == 2 and staged[0] > 0
    assert ledger(db) == before
    monkeypatch.setattr(facts._Writer, "group", real)
    assert gpu_ledger(["meter", "--prometheus", fleet_prom_url, *day, "--db", str(db), "-v"]
                      ) == 0
    assert "node group(s)" in capsys.readouterr().err
    assert ledger(db) == before


_IN_PLACE_DAYS = (["--from", "2026-10-05", "--to", "2026-10-06"],
                  ["--from", "2026-10-06", "--to", "2026-10-07"])


def _facts_by_table(path: Path) -> list[list[tuple[object, ...]]]:
    from metering import facts
    from metering.db import connect
    with connect(path, read_only=True) as con:
        return [con.execute(f"SELECT * FROM {t} ORDER BY ALL").fetchall()
                for t in facts.FACT_TABLES if t != "coverage"]


def _held(path: Path) -> tuple[int, int, int]:
    """Device-hours of 10-05 and of 10-06, and the unfinished notes, read as the file is."""
    from metering.db import connect
    with connect(path, read_only=True) as con:
        day5, day6 = con.execute(
            "SELECT count(*) FILTER (hour < '2026-10-06'), count(*) FILTER "
            "(hour >= '2026-10-06') FROM device_hours").fetchall()[0]
        notes = con.execute("SELECT count(*) FROM unfinished_hours").fetchall()[0][0]
    return int(day5), int(day6), int(notes)


def _one_day_of_two(url: str, tmp_path: Path) -> tuple[Path, Path, int]:
    """Ledgers of both days and of the first alone (in one group each), and how many
    device-hours the first day holds."""
    whole, db = tmp_path / "whole.duckdb", tmp_path / "ledger.duckdb"
    for path in (whole, db):
        for days in _IN_PLACE_DAYS[: 2 if path == whole else 1]:
            assert gpu_ledger(["meter", "--prometheus", url, *days, "--no-price",
                               "--db", str(path)]) == 0
    return whole, db, _held(db)[0]


@pytest.mark.parametrize("stop", ["error", "ctrl-c"])
def test_node_groups_of_hours_not_metered_yet_go_in_place_and_a_stop_takes_them_out(
        fleet_prom_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str], stop: str) -> None:
    """Hours the ledger holds nothing for get their node groups written straight into the
    fact tables, each committed and noted as unfinished (metering/unfinished.py); stopped
    after the first group, the run deletes what it wrote, so those hours are unmetered
    again and the other day's facts stay, and a rerun gives the facts of one group."""
    import os
    import signal

    import metering.cli_meter as cli_meter
    from metering import facts
    from metering.promclient import PromError

    whole, db, day5 = _one_day_of_two(fleet_prom_url, tmp_path)
    assert day5 > 0 and _held(db) == (day5, 0, 0)
    monkeypatch.setattr(cli_meter, "memory_budget", lambda: 1 << 10)  # a group per node
    real = facts._Writer.group
    seen: list[tuple[int, int, int]] = []

    def group(self: facts._Writer, signals: object) -> None:
        if len(seen) == 1:  # the first group is committed, in place
            seen.append(self.con.execute(
                "SELECT (SELECT count(*) FROM main.device_hours WHERE hour >= '2026-10-06'), "
                "(SELECT count(*) FROM main.unfinished_hours), (SELECT count(*) FROM "
                "information_schema.schemata WHERE schema_name = 'gl_staging')").fetchall()[0])
            if stop == "ctrl-c":
                os.kill(os.getpid(), signal.SIGINT)
            raise PromError("the store went away")
        seen.append((0, 0, 0))
        real(self, signals)  # type: ignore[arg-type]

    monkeypatch.setattr(facts._Writer, "group", group)
    capsys.readouterr()
    rc = gpu_ledger(["meter", "--prometheus", fleet_prom_url, *_IN_PLACE_DAYS[1], "--no-price",
                     "--db", str(db)])
    err = capsys.readouterr().err
    assert rc == (130 if stop == "ctrl-c" else 5) and "Traceback" not in err, err
    in_place, noted, staging = seen[1]
    assert in_place > 0 and noted == 1 and staging == 0
    assert _held(db) == (day5, 0, 0)
    monkeypatch.setattr(facts._Writer, "group", real)
    assert gpu_ledger(["meter", "--prometheus", fleet_prom_url, *_IN_PLACE_DAYS[1], "--no-price",
                       "--db", str(db), "-v"]) == 0
    assert "node group(s)" in capsys.readouterr().err
    assert _facts_by_table(db) == _facts_by_table(whole)


_KILLED_AT_SECOND_GROUP = """
import os, sys
import metering.cli_meter as cli_meter
from metering import facts
from gpu_ledger.cli import main
cli_meter.memory_budget = lambda: 1 << 10
real, calls = facts._Writer.group, []
def group(self, signals):
    calls.append(1)
    if len(calls) == 2:
        os._exit(9)  # as a kill -9 would: nothing after it runs
    real(self, signals)
facts._Writer.group = group
sys.exit(main(sys.argv[1:]))
"""


def test_hours_a_killed_run_left_half_written_are_refused_by_readers_and_taken_out_on_open(
        fleet_prom_url: str, tmp_path: Path) -> None:
    """Killed between two node groups written in place, the file holds part of those hours'
    facts and the note that says so: a report refuses the ledger in one line, and the next
    writable open deletes them (the hours unmetered, as before the run); the same command
    then meters them as an uninterrupted run does."""
    import subprocess
    import sys

    from metering import ledgerview
    from metering.db import connect

    whole, db, day5 = _one_day_of_two(fleet_prom_url, tmp_path)
    meter = ["meter", "--prometheus", fleet_prom_url, *_IN_PLACE_DAYS[1], "--no-price",
             "--db", str(db)]
    run = subprocess.run([sys.executable, "-c", _KILLED_AT_SECOND_GROUP, *meter],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 9, run.stderr
    left = _held(db)
    assert left[0] == day5 and left[1] > 0 and left[2] == 1  # half of 10-06, noted
    with pytest.raises(ledgerview.LedgerError) as refused:
        ledgerview.open_ledger(db)
    assert "the facts of hours 2026-10-06 00:00 .. 2026-10-07 00:00 UTC are half written" in str(
        refused.value) and "\n" not in str(refused.value)
    report = subprocess.run([sys.executable, "-m", "gpu_ledger.cli", "report", "--db", str(db),
                             "--month", "2026-10", "--out", str(tmp_path / "r")],
                            capture_output=True, text=True, timeout=300)
    assert report.returncode != 0 and "are half written" in report.stderr
    assert "Traceback" not in report.stderr and len(report.stderr.splitlines()) == 1, \
        report.stderr
    said: list[str] = []
    connect(db, say=said.append).close()  # a writable open takes them out, and says so
    assert said == [f"gpu-ledger: {db}: deleted the facts of hours 2026-10-06 00:00 .. "
                    "2026-10-07 00:00 UTC that a stopped `gpu-ledger meter` run left half "
                    "written: they are not metered now, and the same `meter` command meters "
                    "them again"]
    assert _held(db) == (day5, 0, 0)
    assert gpu_ledger(meter) == 0
    assert _facts_by_table(db) == _facts_by_table(whole)
