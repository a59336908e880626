"""Open (or create) the metering DuckDB file and make sure its tables exist.

A file that is not a DuckDB database is refused with a clear error and never touched: we look at
its header before DuckDB does, so nothing can "repair" it by writing over someone's data.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib import resources
from pathlib import Path

import duckdb

from metering import unfinished
from metering.cores import available_cores
from metering.errors import ExitCode, InputError, MeteringError, OutOfMemoryError, UsageError

# A DuckDB file starts with an 8-byte checksum, then this magic.
_MAGIC = b"DUCK"
_MAGIC_OFFSET = 8


class DatabaseError(InputError):
    """The metering database cannot be opened. str() names the file and what was wrong."""

    def __init__(self, file: str, problem: str) -> None:
        self.file, self.problem = file, problem
        super().__init__(f"{file}: {problem}")


class LedgerLocked(DatabaseError):
    """Another process has the ledger open for writing (DuckDB's file lock): a second run is
    refused rather than interleaved with the first. `holder`: that process's PID, if known."""

    code = ExitCode.LOCKED

    def __init__(self, file: str, problem: str, holder: int | None = None) -> None:
        super().__init__(file, problem)
        self.holder = holder


@contextmanager
def transaction(con: duckdb.DuckDBPyConnection) -> Iterator[None]:
    """BEGIN ... COMMIT around the block; any exception (or a kill) leaves the ledger as it
    was before BEGIN. The one transaction helper of metering."""
    con.execute("BEGIN TRANSACTION")
    try:
        yield
    except BaseException:
        with contextlib.suppress(duckdb.Error):  # an interrupted query ended it already
            con.execute("ROLLBACK")
        raise
    con.execute("COMMIT")


def schema_sql() -> str:
    return (resources.files("metering") / "sql" / "schema.sql").read_text(encoding="utf-8")


# Databases created by earlier versions get the schema's later changes here; each step checks
# the catalog first, so on a current database nothing is written. A step's statements run in
# one transaction: a database is migrated by a step entirely or not at all.
_MIGRATIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    # GPM SM activity per MIG instance.
    ("SELECT count(*) = 0 FROM information_schema.columns WHERE table_catalog = "
     "current_database() AND table_name = 'mig_hours' AND column_name = 'sm_active_seconds'",
     ("ALTER TABLE mig_hours ADD COLUMN IF NOT EXISTS sm_active_seconds DOUBLE",)),
    # "No SM samples" became NULL instead of 0. Earlier ingests wrote 0 for MIG allocations,
    # where the exporter never reports container SM activity, so a MIG 0 there meant unknown;
    # earlier pricing likewise wrote used 0 for every MIG row.
    ("SELECT count(*) > 0 FROM information_schema.columns WHERE table_catalog = "
     "current_database() AND table_name = 'allocation_hours' AND column_name = 'sm_seconds' "
     "AND is_nullable = 'NO'",
     ("ALTER TABLE allocation_hours ALTER COLUMN sm_seconds DROP NOT NULL",
      "UPDATE allocation_hours SET sm_seconds = NULL WHERE mig_uuid <> '' AND sm_seconds = 0")),
    ("SELECT count(*) > 0 FROM information_schema.columns WHERE table_catalog = "
     "current_database() AND table_name = 'charges' AND column_name = 'used_gpu_hours' "
     "AND is_nullable = 'NO'",
     ("ALTER TABLE charges ALTER COLUMN used_gpu_hours DROP NOT NULL",
      "UPDATE charges SET used_gpu_hours = NULL WHERE mig_uuid <> '' AND used_gpu_hours = 0")),
)


def _table_ddl(table: str) -> str:
    """The CREATE TABLE statement of `table` in schema.sql."""
    m = re.search(rf"CREATE TABLE IF NOT EXISTS {table} \(.*?\n\);", schema_sql(), re.S)
    assert m is not None, table
    return m.group(0)


def _drop_primary_key(table: str) -> tuple[str, tuple[str, ...]]:
    """Fact tables lost their PRIMARY KEY (its index cost most of an ingest's write time).
    DuckDB cannot drop a constraint, so the table is rebuilt from schema.sql and its rows
    copied by column name. Runs after the steps above, whose columns the copy needs."""
    return (
        "SELECT count(*) > 0 FROM duckdb_constraints() WHERE database_name = "
        f"current_database() AND table_name = '{table}' AND constraint_type = 'PRIMARY KEY'",
        (f"ALTER TABLE {table} RENAME TO {table}__with_key",
         _table_ddl(table),
         f"INSERT INTO {table} BY NAME SELECT * FROM {table}__with_key",
         f"DROP TABLE {table}__with_key"))


_MIGRATIONS += tuple(
    # What de-duplication removed and what was dropped as not plausible, per hour.
    ("SELECT count(*) = 0 FROM information_schema.columns WHERE table_catalog = "
     f"current_database() AND table_name = 'coverage' AND column_name = '{column}'",
     (f"ALTER TABLE coverage ADD COLUMN IF NOT EXISTS {column} {kind} DEFAULT 0",))
    for column, kind in (("duplicate_seconds", "DOUBLE"), ("dropped_values", "BIGINT")))
_MIGRATIONS += tuple(_drop_primary_key(t)
                     for t in ("device_hours", "mig_hours", "allocation_hours"))


def _no_cluster(table: str) -> str:
    return ("SELECT count(*) = 0 FROM information_schema.columns WHERE table_catalog = "
            f"current_database() AND table_name = '{table}' AND column_name = 'cluster'")


# Clusters: every earlier row belongs to cluster 'default'. Coverage's key becomes
# (hour, cluster), which DuckDB can only do by rebuilding the table.
_MIGRATIONS += tuple(
    (_no_cluster(t), (f"ALTER TABLE {t} ADD COLUMN cluster VARCHAR DEFAULT 'default'",
                      f"ALTER TABLE {t} ALTER COLUMN cluster SET NOT NULL"))
    for t in ("device_hours", "mig_hours", "allocation_hours", "workload_hours", "grant_hours",
              "charges"))
_MIGRATIONS += ((_no_cluster("coverage"),
                 ("ALTER TABLE coverage RENAME TO coverage__without_cluster",
                  _table_ddl("coverage"),
                  "INSERT INTO coverage BY NAME SELECT * FROM coverage__without_cluster",
                  "DROP TABLE coverage__without_cluster")),)


# Resuming is keyed by the run's settings too (metering/resume.py): a run recorded before has
# '' and is never taken over by a run that records them; its chunks' clusters are unknown
# (NULL), so they count as rewriting every cluster.
_MIGRATIONS += tuple(
    ("SELECT count(*) = 0 FROM information_schema.columns WHERE table_catalog = "
     f"current_database() AND table_name = '{table}' AND column_name = '{column}'",
     (f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {column} {kind}",))
    for table, column, kind in (("ingest_runs", "settings", "VARCHAR DEFAULT ''"),
                                ("ingest_chunks", "clusters", "VARCHAR[]")))


# Energy estimated from power samples (a missing or reset counter); earlier rows are measured.
_MIGRATIONS += ((
    "SELECT count(*) = 0 FROM information_schema.columns WHERE table_catalog = "
    "current_database() AND table_name = 'device_hours' AND column_name = 'energy_estimated'",
    ("ALTER TABLE device_hours ADD COLUMN energy_estimated BOOLEAN DEFAULT false",
     "ALTER TABLE device_hours ALTER COLUMN energy_estimated SET NOT NULL")),)
# Vendors: every earlier device row is NVIDIA's (the exporter read NVML only).
_MIGRATIONS += ((
    "SELECT count(*) = 0 FROM information_schema.columns WHERE table_catalog = "
    "current_database() AND table_name = 'device_hours' AND column_name = 'vendor'",
    ("ALTER TABLE device_hours ADD COLUMN vendor VARCHAR DEFAULT 'nvidia'",
     "ALTER TABLE device_hours ALTER COLUMN vendor SET NOT NULL")),)
# Notes of what a stopped run left half written: every earlier note was ingest's (facts).
_MIGRATIONS += ((
    "SELECT count(*) = 0 FROM information_schema.columns WHERE table_catalog = "
    "current_database() AND table_name = 'unfinished_hours' AND column_name = 'written'",
    ("ALTER TABLE unfinished_hours ADD COLUMN written VARCHAR DEFAULT 'facts'",
     "ALTER TABLE unfinished_hours ALTER COLUMN written SET NOT NULL")),)


def migrate(con: duckdb.DuckDBPyConnection) -> list[str]:
    """Bring an existing database's tables up to schema.sql; returns the statements run."""
    done: list[str] = []
    for check, statements in _MIGRATIONS:
        rows = con.execute(check).fetchall()  # all: a pending result blocks register()
        if not (rows and rows[0][0]):
            continue
        with transaction(con):
            for sql in statements:
                con.execute(sql)
        done += statements
    return done


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
# its limit instead. The cap bounds DuckDB's buffers (cached blocks included), not the
# process, which peaks ~0.1 GB above it: 1.5GB keeps a 1,000-node month's pricing (which
# needs ~1 GB since it prices a week at a time) under 2 GB (docs/performance.md).
MEMORY_LIMIT_ENV = "GPU_LEDGER_MEMORY_LIMIT"
MEMORY_LIMIT_OPTION = "--memory-limit"
DEFAULT_MEMORY_LIMIT = "1.5GB"
# Where DuckDB writes what does not fit under the cap (sorts, joins, aggregates and temporary
# tables spill there); default: next to a ledger file (DuckDB's <file>.tmp) and, for the
# in-memory connections the report reads through, the system's temporary directory.
TEMP_DIR_ENV = "GPU_LEDGER_TEMP_DIR"
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)\s*$", re.I)
_memory_limit: str | None = None  # memory_cap(): a command's --memory-limit


@contextmanager
def memory_cap(value: str | None, doing: str) -> Iterator[None]:
    """DuckDB's cap is `value` (a command's --memory-limit; None: $GPU_LEDGER_MEMORY_LIMIT,
    else the default) for the connections opened in the block, and DuckDB running out of
    memory there is the one-line OutOfMemoryError about `doing`, never a traceback."""
    global _memory_limit
    if value is not None and not _SIZE.match(value):
        raise UsageError(f"{MEMORY_LIMIT_OPTION}: expected a size such as 1.5GB or 800MB, "
                         f"got {value!r}")
    before, _memory_limit = _memory_limit, value or _memory_limit
    try:
        yield
    except duckdb.OutOfMemoryException:
        raise out_of_memory(doing) from None
    except (duckdb.IOException, duckdb.TransactionException, duckdb.FatalException) as e:
        failed = write_failed(doing, e)
        if failed is None:
            raise
        raise failed from None
    finally:
        _memory_limit = before


# DuckDB's words for a write the file system refused (disk full, quota, file size limit).
_WRITE_FAILED = re.compile(r"(?:Could not write (?:to )?file|Failed to commit|"
                           r"No space left on device|Disk quota exceeded|File too large)")


def write_failed(doing: str, e: BaseException) -> MeteringError | None:
    """The one-line error for DuckDB failing to write its file (disk full, quota, size
    limit), or None when `e` is not that. The transaction being committed is rolled back
    (DuckDB's write-ahead log keeps only whole commits), so what was committed before stays."""
    text = _first_line(e)
    if not _WRITE_FAILED.search(text):
        return None
    reason = re.search(r"No space left on device|Disk quota exceeded|File too large", text)
    return MeteringError(f"{doing}: could not write to disk ("
                         f"{reason.group(0) if reason else text}); what was being written is "
                         "not kept, what was committed before is: free space and run the same "
                         "command again")


def memory_limit() -> str:
    """DuckDB's memory cap: --memory-limit, else $GPU_LEDGER_MEMORY_LIMIT, else 1.5GB."""
    value = _memory_limit or os.environ.get(MEMORY_LIMIT_ENV) or DEFAULT_MEMORY_LIMIT
    if not _SIZE.match(value):
        raise UsageError(f"{MEMORY_LIMIT_ENV}: expected a size such as 1.5GB or 800MB, "
                         f"got {value!r}")
    return value.strip()


_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def memory_limit_bytes() -> int:
    """memory_limit() in bytes, with DuckDB's units (GB = 10^9 bytes, GiB = 2^30)."""
    m = _SIZE.match(memory_limit())
    assert m is not None  # memory_limit() checked the form
    return int(float(m[1]) * _UNITS[m[2].lower()])


@contextmanager
def capped(con: duckdb.DuckDBPyConnection, cap: int | None, doing: str) -> Iterator[None]:
    """DuckDB's cap lowered to `cap` bytes for the block (never raised above memory_limit();
    None: left as it is), then set back; DuckDB out of memory under it is the one-line
    OutOfMemoryError naming that cap and what raises it."""
    if cap is None or cap >= memory_limit_bytes():
        yield
        return
    shown = f"{max(1, cap >> 20)}MiB"
    con.execute(f"SET memory_limit = '{shown}'")
    done = False
    try:
        yield
        done = True
    except duckdb.OutOfMemoryException:
        raise OutOfMemoryError(
            f"{doing}: out of memory under DuckDB's {shown} cap while ingesting (its share of "
            "ingest's memory budget); raise the container's memory limit (docs/operations.md, "
            "sizing the metering job)") from None
    finally:
        # After an error, one from setting it back would hide the error raised.
        with contextlib.suppress(*(() if done else (duckdb.Error,))):
            con.execute(f"SET memory_limit = '{memory_limit()}'")


def out_of_memory(doing: str) -> OutOfMemoryError:
    """The one-line error for a DuckDB OutOfMemoryException while `doing` something."""
    return OutOfMemoryError(
        f"{doing}: out of memory under DuckDB's {memory_limit()} cap; raise it with "
        f"{MEMORY_LIMIT_OPTION} (or {MEMORY_LIMIT_ENV}), keeping the container's memory limit "
        "~0.5 GiB above it (docs/operations.md, sizing the metering job)")


# WAL bytes after which a commit checkpoints (DuckDB's default is 16 MiB): see engine_config.
CHECKPOINT_THRESHOLD = "1MB"


def engine_config(spill: Path | None = None) -> dict[str, str | bool | int | float | list[str]]:
    """DuckDB settings of every metering connection: the memory cap, and where to spill:
    $GPU_LEDGER_TEMP_DIR (a directory of this process's own inside it), else `spill`, else
    DuckDB's default. DuckDB creates the last directory of the path and removes it on close.

    Checkpoints come at (almost) every commit: left to DuckDB's 16 MiB WAL threshold, a month's
    ingest wrote each chunk's row groups at commit and then all of them again in one
    checkpoint at the last chunk (2,500 GPUs: 4.6-4.7 against 2.7-2.8 CPU-s of COMMITs, a 131
    against 76 MB ledger; pricing 206 against 176 MB; docs/performance.md). DuckDB's progress
    bar is off (`engine`)."""
    config: dict[str, str | bool | int | float | list[str]] = {
        "memory_limit": memory_limit(), "checkpoint_threshold": CHECKPOINT_THRESHOLD}
    base = os.environ.get(TEMP_DIR_ENV)
    if base:
        try:
            Path(base).mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UsageError(f"{TEMP_DIR_ENV}: cannot create {base}: {e.strerror or e}"
                             ) from None
        config["temp_directory"] = str(Path(base) / f"gpu-ledger-{os.getpid()}.tmp")
    elif spill is not None:
        config["temp_directory"] = str(spill)
    return config


def engine(target: str, *, read_only: bool = False, spill: Path | None = None
           ) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection with `engine_config`, its progress bar off: DuckDB turns it on by
    itself for `python -c` programs (the benches' children) and draws it on stdout. Its
    threads are at most the cores this process may use (metering.cores): DuckDB counts the
    machine's online CPUs, not the process's affinity (a cpuset from the kubelet's static CPU
    manager, or `taskset`), and would run more threads than it has cores."""
    con = duckdb.connect(target, read_only=read_only, config=engine_config(spill))
    try:
        con.execute("SET enable_progress_bar = false")  # a connection's option, not a global
        cores = available_cores()
        row = con.execute("SELECT current_setting('threads')").fetchone()
        if row is not None and cores < int(row[0]):
            con.execute(f"SET threads = {cores}")
    except BaseException:
        con.close()
        raise
    return con


def spill_dir() -> Path:
    """A directory of this process's own under the system's temporary directory, for
    connections without a ledger file to spill next to."""
    return Path(tempfile.gettempdir()) / f"gpu-ledger-{os.getpid()}.tmp"


def connect(path: str | Path, *, read_only: bool = False,
            say: Callable[[str], None] | None = None) -> duckdb.DuckDBPyConnection:
    """Open the database at `path`, creating it (and its tables) if it does not exist.

    read_only opens an existing file without creating or changing anything (for reports);
    otherwise tables from an earlier version are migrated (see _MIGRATIONS), and the hours a
    stopped run left half written are deleted (metering/unfinished.py; `say` tells which).
    Memory is capped at memory_limit() (default 1.5GB); DuckDB spills beyond it.
    """
    if str(path) == ":memory:":  # tests and throwaway runs
        con = engine(":memory:", spill=spill_dir())
        con.execute(schema_sql())
        migrate(con)
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
        con = engine(str(p), read_only=read_only)
    except duckdb.OutOfMemoryException:
        raise  # not the file's fault: the cap's (memory_cap says so)
    except duckdb.Error as e:
        if "Conflicting lock" in str(e) or "Could not set lock" in str(e):
            holder = re.search(r"PID (\d+)", str(e))
            raise LedgerLocked(str(p), "in use by another process" + (
                f" (PID {holder.group(1)})" if holder else "") + ", e.g. a `gpu-ledger meter` "
                "run; nothing was written: run again when it has finished",
                int(holder.group(1)) if holder else None) from None
        raise DatabaseError(str(p), f"cannot open as a DuckDB database: {_first_line(e)}") \
            from None
    problem = _not_a_ledger(con, writing=not read_only)
    if problem:
        con.close()
        raise DatabaseError(str(p), problem)
    if not read_only:
        # A chunk written in place by a run that stopped before its end: its hours back to
        # how they were (not metered) before anything reads them (metering/unfinished.py).
        for step, doing in ((lambda: con.execute(schema_sql()), "create the metering tables"),
                            (lambda: migrate(con), "update the metering tables to this version"),
                            (lambda: _recover(con, p, say),
                             "delete the hours a stopped run left half written")):
            try:
                step()
            except duckdb.OutOfMemoryException:
                con.close()
                raise
            except (duckdb.Error, unfinished.DamagedNote) as e:
                con.close()
                raise DatabaseError(str(p), f"cannot {doing}: {_first_line(e)}") from None
    if not read_only:
        problem = _not_a_ledger(con, writing=False)  # migrated: every column must fit now
        if problem:
            con.close()
            raise DatabaseError(str(p), problem)
    return con


def _recover(con: duckdb.DuckDBPyConnection, p: Path,
             say: Callable[[str], None] | None) -> None:
    cleared = unfinished.recover(con)
    if cleared and say is not None:
        kinds = list(dict.fromkeys(n.written for n in cleared))
        verbs = {k.verb for k in kinds}
        again = verbs.pop() if len(verbs) == 1 else "writes"
        say(f"gpu-ledger: {p}: deleted {unfinished.describe(cleared)} that a stopped "
            f"`gpu-ledger meter` run left half written: they are "
            f"{' or '.join(k.undone for k in kinds)}, and the same `meter` command {again} "
            "them again")


@functools.cache
def _expected_columns() -> dict[str, dict[str, str]]:
    """table -> column -> DuckDB type, as schema.sql creates them."""
    con = duckdb.connect(":memory:")
    try:
        con.execute(schema_sql())
        return _columns(con)
    finally:
        con.close()


def _columns(con: duckdb.DuckDBPyConnection) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for table, column, kind in con.execute(
            "SELECT table_name, column_name, data_type FROM information_schema.columns WHERE "
            "table_catalog = current_database() AND table_schema = 'main'").fetchall():
        out.setdefault(str(table), {})[str(column)] = str(kind)
    return out


def _not_a_ledger(con: duckdb.DuckDBPyConnection, writing: bool) -> str | None:
    """Why the database is not a ledger (None when it is one, or empty): tables named like
    the ledger's must have its columns' types (an older version's missing columns are what
    the migrations add); `writing` (about to create the ledger's tables): a database of other
    tables is refused too."""
    have = _columns(con)
    # Tables, none of them a ledger's: someone else's database, which creating the ledger's
    # tables beside would mix with a bill.
    if writing and have and not set(have) & set(_expected_columns()):
        shown = ", ".join(sorted(have)[:5]) + (", ..." if len(have) > 5 else "")
        return (f"expected a GPU Ledger database (or an empty one), got a DuckDB database of "
                f"other tables ({shown}); left untouched: give --db a new file")
    for table, columns in _expected_columns().items():
        for column, kind in have.get(table, {}).items():
            want = columns.get(column)
            if want is not None and want != kind:
                return (f"table {table}: column {column} is {kind}, a ledger's is {want}: "
                        "not a GPU Ledger database, or a damaged one; left untouched")
    return None


def _first_line(e: BaseException) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
