"""Open (or create) the metering DuckDB file and make sure its tables exist.

A file that is not a DuckDB database is refused with a clear error and never touched: we look at
its header before DuckDB does, so nothing can "repair" it by writing over someone's data.
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

import duckdb

# A DuckDB file starts with an 8-byte checksum, then this magic.
_MAGIC = b"DUCK"
_MAGIC_OFFSET = 8


class DatabaseError(Exception):
    """The metering database cannot be opened. str() names the file and what was wrong."""

    def __init__(self, file: str, problem: str) -> None:
        self.file, self.problem = file, problem
        super().__init__(f"{file}: {problem}")


def schema_sql() -> str:
    return (resources.files("metering") / "sql" / "schema.sql").read_text(encoding="utf-8")


def _check_header(path: Path) -> None:
    try:
        with path.open("rb") as f:
            head = f.read(_MAGIC_OFFSET + len(_MAGIC))
    except IsADirectoryError:
        raise DatabaseError(str(path), "expected a DuckDB database file, got a directory") \
            from None
    except OSError as e:
        raise DatabaseError(str(path), f"cannot read the file ({e.strerror})") from None
    if head and head[_MAGIC_OFFSET:] != _MAGIC:
        raise DatabaseError(str(path), "expected a DuckDB database file, got a file that is "
                            "not one (left untouched)")


# DuckDB takes 80% of the machine's memory by default; a metering pod should stay inside
# its limit instead. A month of a 1,000-node fleet prices within 2 GB (docs/performance.md).
MEMORY_LIMIT_ENV = "GPU_LEDGER_MEMORY_LIMIT"
DEFAULT_MEMORY_LIMIT = "2GB"


def _config() -> dict[str, str | bool | int | float | list[str]]:
    return {"memory_limit": os.environ.get(MEMORY_LIMIT_ENV) or DEFAULT_MEMORY_LIMIT}


def connect(path: str | Path, *, read_only: bool = False) -> duckdb.DuckDBPyConnection:
    """Open the database at `path`, creating it (and its tables) if it does not exist.

    read_only opens an existing file without creating or changing anything (for reports).
    Memory is capped at $GPU_LEDGER_MEMORY_LIMIT (default 2GB); DuckDB spills beyond it.
    """
    if str(path) == ":memory:":  # tests and throwaway runs
        con = duckdb.connect(":memory:", config=_config())
        con.execute(schema_sql())
        return con
    p = Path(path)
    if p.exists() or p.is_symlink():
        _check_header(p)
        if not read_only and p.is_file() and p.stat().st_size == 0:
            # An empty file (touch, mkstemp) holds nothing to lose; DuckDB refuses it as is.
            p.unlink()
    elif read_only:
        raise DatabaseError(str(p), "expected an existing DuckDB database file, found none")
    elif not p.parent.is_dir():
        raise DatabaseError(str(p), f"directory {p.parent} does not exist")
    try:
        con = duckdb.connect(str(p), read_only=read_only, config=_config())
    except duckdb.Error as e:
        raise DatabaseError(str(p), f"cannot open as a DuckDB database: {_first_line(e)}") \
            from None
    if not read_only:
        try:
            con.execute(schema_sql())
        except duckdb.Error as e:
            con.close()
            raise DatabaseError(str(p), f"cannot create the metering tables: {_first_line(e)}") \
                from None
    return con


def _first_line(e: BaseException) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
