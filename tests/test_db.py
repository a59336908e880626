"""metering.db: create, reopen, and refuse files that are not DuckDB databases untouched."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from metering.cores import available_cores
from metering.db import DatabaseError, connect, migrate

TABLES = {"allocation_hours", "charges", "coverage", "device_hours", "mig_hours",
          "workload_hours", "grant_hours", "ingest_runs", "ingest_chunks",
          "unfinished_hours",  # metering/unfinished.py
          "cost_models", "cost_model_prices", "month_closes", "adjustments", "energy_hours",
          "waste_hours", "waste_hours_stored",  # these two: metering/wastehours.py
          "priced_hours"}  # metering/pricedhours.py


def tables(con: object) -> set[str]:
    return {r[0] for r in con.execute("SHOW TABLES").fetchall()}  # type: ignore[attr-defined]


def test_creates_the_file_and_every_table_and_reopens_it(tmp_path: Path) -> None:
    path = tmp_path / "ledger.duckdb"
    con = connect(path)
    assert tables(con) == TABLES
    con.execute("INSERT INTO coverage (hour, source, devices, ingested_at) "
                "VALUES ('2026-10-01 00:00', 'src', 3, '2026-11-01')")
    con.close()
    con = connect(str(path))  # the schema is applied again: IF NOT EXISTS keeps the data
    assert con.execute("SELECT devices FROM coverage").fetchall() == [(3,)]
    con.close()
    ro = connect(path, read_only=True)
    assert ro.execute("SELECT count(*) FROM coverage").fetchone() == (1,)
    ro.close()


def test_an_empty_file_becomes_a_database(tmp_path: Path) -> None:
    path = tmp_path / "empty.duckdb"
    path.touch()
    con = connect(path)
    assert tables(con) == TABLES
    con.close()


@pytest.mark.parametrize("content", [
    b"hello, this is a CSV file,1,2,3\n" * 10,
    b"SQLite format 3\x00" + b"\x00" * 200,
    b"\x00\x01",
])
def test_a_file_that_is_not_duckdb_is_refused_and_left_untouched(tmp_path: Path,
                                                                 content: bytes) -> None:
    path = tmp_path / "precious.db"
    path.write_bytes(content)
    before = os.stat(path)
    for read_only in (False, True):
        with pytest.raises(DatabaseError) as info:
            connect(path, read_only=read_only)
        assert str(info.value) == f"{path}: expected a DuckDB database file, got a file " \
            "that is not one (left untouched)"
    assert path.read_bytes() == content
    assert os.stat(path).st_mtime_ns == before.st_mtime_ns
    assert sorted(p.name for p in tmp_path.iterdir()) == ["precious.db"]  # no .wal left


def test_a_truncated_duckdb_file_gives_a_clear_error(tmp_path: Path) -> None:
    good = tmp_path / "good.duckdb"
    connect(good).close()
    head = good.read_bytes()[:4096]  # the magic survives, the rest does not
    broken = tmp_path / "broken.duckdb"
    broken.write_bytes(head)
    with pytest.raises(DatabaseError) as info:
        connect(broken)
    assert str(info.value).startswith(f"{broken}: cannot open as a DuckDB database: ")
    assert broken.read_bytes() == head


def test_paths_that_cannot_be_a_database(tmp_path: Path) -> None:
    with pytest.raises(DatabaseError, match="expected a DuckDB database file, got a directory"):
        connect(tmp_path)
    with pytest.raises(DatabaseError, match=r"directory .*nowhere does not exist"):
        connect(tmp_path / "nowhere" / "ledger.duckdb")
    with pytest.raises(DatabaseError, match="expected an existing DuckDB database file"):
        connect(tmp_path / "absent.duckdb", read_only=True)
    assert not (tmp_path / "absent.duckdb").exists()


def test_in_memory_database_for_throwaway_runs() -> None:
    con = connect(":memory:")
    assert tables(con) == TABLES
    con.close()


def test_duckdb_threads_follow_the_cpus_the_process_may_use(tmp_path: Path) -> None:
    """DuckDB counts the machine's CPUs; a process confined to one (a cpuset, `taskset`) must
    not run a thread per machine CPU. Run in a child confined to the first CPU."""
    code = ("import os, sys; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
            "from metering.db import connect; "
            f"con = connect({str(tmp_path / 'l.duckdb')!r}); "
            "print(con.execute(\"SELECT current_setting('threads')\").fetchone()[0])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parents[1])
    assert out.stdout.strip() == "1"
    # Otherwise DuckDB's own count, lowered to this process's CPUs only where they are fewer.
    with connect(":memory:") as con:
        row = duckdb.connect().execute("SELECT current_setting('threads')").fetchone()
        assert row is not None
        expected = min(int(row[0]), available_cores())
        assert con.execute("SELECT current_setting('threads')").fetchone() == (expected,)


# The three tables as the first release created them: no GPM column, SM figures NOT NULL.
_V1_TABLES = """
CREATE TABLE mig_hours (hour TIMESTAMP NOT NULL, node VARCHAR NOT NULL, uuid VARCHAR NOT NULL,
    mig_uuid VARCHAR NOT NULL, profile VARCHAR NOT NULL, slices INTEGER NOT NULL,
    parent_slices INTEGER NOT NULL, memory_total_bytes DOUBLE,
    observed_seconds DOUBLE NOT NULL, PRIMARY KEY (hour, mig_uuid));
CREATE TABLE allocation_hours (hour TIMESTAMP NOT NULL, node VARCHAR NOT NULL,
    namespace VARCHAR NOT NULL, pod VARCHAR NOT NULL, container VARCHAR NOT NULL,
    uuid VARCHAR NOT NULL, mig_uuid VARCHAR NOT NULL, resource VARCHAR NOT NULL,
    sharing VARCHAR NOT NULL, replicas INTEGER NOT NULL, units DOUBLE NOT NULL,
    allocated_seconds DOUBLE NOT NULL, memory_byte_seconds DOUBLE NOT NULL,
    sm_seconds DOUBLE NOT NULL, labels MAP(VARCHAR, VARCHAR) NOT NULL,
    PRIMARY KEY (hour, namespace, pod, container, uuid, mig_uuid));
CREATE TABLE charges (hour TIMESTAMP NOT NULL, team VARCHAR NOT NULL,
    namespace VARCHAR NOT NULL, pod VARCHAR NOT NULL, container VARCHAR NOT NULL,
    node VARCHAR NOT NULL, uuid VARCHAR NOT NULL, mig_uuid VARCHAR NOT NULL,
    model VARCHAR NOT NULL, sharing VARCHAR NOT NULL, profile VARCHAR NOT NULL,
    basis VARCHAR NOT NULL, fraction DOUBLE NOT NULL, rate DOUBLE NOT NULL,
    allocated_gpu_hours DOUBLE NOT NULL, used_gpu_hours DOUBLE NOT NULL,
    cost DECIMAL(18, 6) NOT NULL, idle_share DECIMAL(18, 6) NOT NULL,
    cost_model_hash VARCHAR NOT NULL);
INSERT INTO mig_hours VALUES ('2026-10-01 00:00', 'n', 'GPU-m', 'MIG-1', '3g.40gb', 3, 7,
    NULL, 3600);
INSERT INTO allocation_hours VALUES
    ('2026-10-01 00:00', 'n', 'ns', 'mig-pod', 'c', 'GPU-m', 'MIG-1', 'r', 'mig', 1, 1, 3600,
     0, 0, MAP {}),
    ('2026-10-01 00:00', 'n', 'ns', 'idle-pod', 'c', 'GPU-x', '', 'r', 'exclusive', 1, 1,
     3600, 0, 0, MAP {});
INSERT INTO charges VALUES
    ('2026-10-01 00:00', 't', 'ns', 'mig-pod', 'c', 'n', 'GPU-m', 'MIG-1', 'H100', 'mig',
     '3g.40gb', 'allocation', 0.43, 4, 0.43, 0, 1.7, 0, 'h'),
    ('2026-10-01 00:00', 't', 'ns', 'idle-pod', 'c', 'n', 'GPU-x', '', 'H100', 'exclusive',
     '', 'allocation', 1, 4, 1, 0, 4, 0, 'h');
"""


def _columns(con: object, table: str) -> list[tuple[str, str]]:
    return con.execute(  # type: ignore[attr-defined, no-any-return]
        "SELECT column_name, is_nullable FROM information_schema.columns "
        "WHERE table_name = ? ORDER BY ordinal_position", [table]).fetchall()


def test_a_database_from_the_first_release_is_migrated(tmp_path: Path) -> None:
    old = tmp_path / "old.duckdb"
    raw = duckdb.connect(str(old))
    raw.execute(_V1_TABLES)
    raw.close()
    con = connect(old)
    fresh = connect(":memory:")
    for table in ("device_hours", "mig_hours", "allocation_hours", "charges"):
        assert _columns(con, table) == _columns(fresh, table), table  # same shape as new
    # Old ingests wrote 0 for "no SM samples" on MIG, old pricing used 0 on every MIG row:
    # both become unknown. A whole GPU's 0 is a measured idle and stays.
    assert con.execute("SELECT pod, sm_seconds FROM allocation_hours ORDER BY pod").fetchall() \
        == [("idle-pod", 0.0), ("mig-pod", None)]
    assert con.execute("SELECT pod, used_gpu_hours FROM charges ORDER BY pod").fetchall() \
        == [("idle-pod", 0.0), ("mig-pod", None)]
    assert con.execute("SELECT sm_active_seconds FROM mig_hours").fetchall() == [(None,)]
    # Their PRIMARY KEYs are gone (rebuilt tables), the rows and NOT NULLs are kept.
    assert con.execute("SELECT table_name FROM duckdb_constraints() WHERE constraint_type = "
                       "'PRIMARY KEY' AND table_name LIKE '%_hours'").fetchall() == []
    assert con.execute("SELECT count(*) FROM allocation_hours").fetchone() == (2,)
    assert con.execute("SELECT mig_uuid, profile, slices FROM mig_hours").fetchall() == \
        [("MIG-1", "3g.40gb", 3)]
    with pytest.raises(duckdb.ConstraintException):
        con.execute("INSERT INTO mig_hours (hour, node, uuid, mig_uuid, profile, slices, "
                    "parent_slices, observed_seconds) VALUES ('2026-10-01', 'n', 'g', NULL, "
                    "'p', 1, 7, 0)")
    assert sorted(t for t in tables(con)) == sorted(TABLES)  # no *__with_key left behind
    assert migrate(con) == []  # applied once; later opens change nothing
    con.close()
    fresh.close()
    ro = connect(old, read_only=True)
    assert ro.execute("SELECT count(*) FROM charges").fetchone() == (2,)
    ro.close()


def test_coverage_of_an_earlier_version_gets_the_screening_columns(tmp_path: Path) -> None:
    path = tmp_path / "old.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE coverage (hour TIMESTAMP NOT NULL PRIMARY KEY, source VARCHAR "
                "NOT NULL, devices INTEGER NOT NULL, ingested_at TIMESTAMP NOT NULL)")
    con.execute("INSERT INTO coverage VALUES ('2026-10-01', 's', 2, '2026-11-01')")
    con.close()
    con = connect(path)
    assert con.execute("SELECT devices, duplicate_seconds, dropped_values FROM coverage"
                       ).fetchall() == [(2, 0.0, 0)]
    con.close()
