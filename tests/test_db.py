"""metering.db: create, reopen, and refuse files that are not DuckDB databases untouched."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from metering.db import DatabaseError, connect

TABLES = {"allocation_hours", "charges", "coverage", "device_hours", "mig_hours"}


def tables(con: object) -> set[str]:
    return {r[0] for r in con.execute("SHOW TABLES").fetchall()}  # type: ignore[attr-defined]


def test_creates_the_file_and_every_table_and_reopens_it(tmp_path: Path) -> None:
    path = tmp_path / "ledger.duckdb"
    con = connect(path)
    assert tables(con) == TABLES
    con.execute("INSERT INTO coverage VALUES ('2026-10-01 00:00', 'src', 3, '2026-11-01')")
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
