"""Read a ledger wherever it is stored: a DuckDB file, or a directory of hive-partitioned Parquet
files written by `gpu-ledger ledger export` (metering/export.py).

`open_ledger` returns an in-memory DuckDB connection whose views (LEDGER_TABLES) read the
ledger, optionally one cluster's rows only, so the report code reads the same tables whatever
the storage and never writes to the ledger.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

import duckdb

from metering import db, manifest, pricedhours, unfinished, wastehours
from metering.cluster import CLUSTER_NAME_RULE, is_cluster_name

# Adjustments (metering/closes.py) are per hour of a closed month and cluster: they travel
# with that cluster-month's facts and charges, as a partition of their own.
LEDGER_TABLES: Final = ("device_hours", "mig_hours", "allocation_hours", "workload_hours",
                        "grant_hours", "coverage", "charges", "energy_hours", "adjustments")
# What the charges were priced with (pricing.py keeps it): not per cluster or hour, so read and
# exported whole, and merged by key.
SIDE_TABLES: Final = ("cost_models", "cost_model_prices")
# Closed months (metering/closes.py): one row per month, not per cluster, so read and exported
# whole; merged by month (metering/export.py).
CLOSE_TABLES: Final = ("month_closes",)
# Derived by pricing from the facts and charges (metering/wastehours.py, and what each hour
# was priced with, metering/pricedhours.py): read from a DuckDB ledger that has them, never
# exported nor merged (an export reads them as empty, the report computes what the waste
# device-hours would hold, and `meter` prices a merged hour again).
DERIVED_TABLES: Final = (*wastehours.TABLES, pricedhours.TABLE)
# Tables every ledger has; the others may be missing from an export (then read as empty).
_REQUIRED: Final = ("device_hours", "coverage", "charges")
# Hive partition keys of the Parquet export, read as text whatever they look like.
PARTITION_TYPES: Final = "{'cluster': 'VARCHAR', 'month': 'VARCHAR'}"


class LedgerError(Exception):
    """The ledger cannot be read; str() names the path and what was wrong."""


def parquet_glob(root: Path, table: str) -> str:
    """The files of one table of an export, as a quoted SQL string literal."""
    return "'" + str(root / table / "**" / "*.parquet").replace("'", "''") + "'"


def _blank_tables(con: duckdb.DuckDBPyConnection) -> None:
    """The schema's tables, empty, in schema `blank` of the in-memory catalog: what a table
    missing from an export reads as, with the right columns and types."""
    if con.execute("SELECT count(*) FROM information_schema.schemata WHERE catalog_name = "
                   "'memory' AND schema_name = 'blank'").fetchall()[0][0]:
        return
    con.execute("CREATE SCHEMA memory.blank")
    con.execute("USE memory.blank")
    con.execute(db.schema_sql())
    con.execute("USE memory.main")


def _scoped(source: str, cluster: str | None) -> str:
    if cluster is None:
        return f"SELECT * FROM {source}"
    return f"SELECT * FROM {source} WHERE cluster = '{cluster}'"


def open_ledger(path: str | Path, cluster: str | None = None) -> duckdb.DuckDBPyConnection:
    """A read-only view of the ledger at `path` (DuckDB file or Parquet export directory);
    with `cluster`, that cluster's rows only."""
    con = db.engine(":memory:", spill=db.spill_dir())
    try:
        attach_ledger(con, Path(path), "main", cluster)
    except BaseException:
        con.close()
        raise
    return con


def attach_ledger(con: duckdb.DuckDBPyConnection, p: Path, schema: str,
                  cluster: str | None = None) -> None:
    """Create the ledger's views in schema `schema` of `con`'s in-memory catalog, reading the
    ledger at `p`; `con` must be an in-memory connection."""
    if cluster is not None and not is_cluster_name(cluster):
        raise LedgerError(f"--cluster: expected {CLUSTER_NAME_RULE}, got {cluster!r}")
    _blank_tables(con)
    if schema != "main":
        con.execute(f"CREATE SCHEMA memory.{schema}")
    if p.is_dir():
        sources = _parquet_sources(con, p)
    else:
        sources = _duckdb_sources(con, p, f"ledger_{schema}")
    for table, source in sources.items():
        whole = table in SIDE_TABLES or table in CLOSE_TABLES
        scoped = f"SELECT * FROM {source}" if whole else _scoped(source, cluster)
        try:
            con.execute(f"CREATE VIEW memory.{schema}.{table} AS {scoped}")
            con.execute(f"SELECT * FROM memory.{schema}.{table} LIMIT 0").fetchall()
        except duckdb.OutOfMemoryException:
            raise  # the memory cap's, not the ledger's (metering.db.memory_cap)
        except duckdb.Error as e:
            raise LedgerError(f"{p / table if p.is_dir() else p}: cannot read it as the "
                              f"ledger's {table}: {str(e).strip().splitlines()[0]}") from None


def _duckdb_sources(con: duckdb.DuckDBPyConnection, p: Path, alias: str) -> dict[str, str]:
    try:
        db.connect(p, read_only=True).close()  # refuses what is not a DuckDB file, clearly
    except db.LedgerLocked:
        raise  # its own exit status: another process is writing the ledger
    except db.DatabaseError as e:
        raise LedgerError(str(e)) from None
    con.execute(f"ATTACH ? AS {alias} (READ_ONLY)", [str(p)])
    try:
        left = unfinished.pending(con, alias)
    except unfinished.DamagedNote as e:
        raise LedgerError(f"{p}: {e}") from None
    if left:
        back = (" (and puts back the charges they replace)"
                if any(n.written.set_aside for n in left) else "")
        raise LedgerError(
            f"{p}: {unfinished.describe(left)} are half written: a `gpu-ledger meter` run "
            "stopped while writing them; any command that writes the ledger (`meter`, "
            f"`close`) deletes them first{back}, and the same `meter` command writes them "
            "again")
    columns: dict[str, set[str]] = {}
    for table, column in con.execute(
            "SELECT table_name, column_name FROM information_schema.columns "
            "WHERE table_catalog = ? AND table_schema = 'main'", [alias]).fetchall():
        columns.setdefault(str(table), set()).add(str(column))
    missing = [t for t in _REQUIRED if t not in columns]
    if missing:
        raise LedgerError(f"{p}: expected a GPU Ledger metering database (tables "
                          f"{', '.join(_REQUIRED)}), got one without {', '.join(missing)}")
    sources = {t: f"{alias}.main.{t}" if t in columns else f"memory.blank.{t}"
               for t in (*SIDE_TABLES, *CLOSE_TABLES, *DERIVED_TABLES)}
    for table in LEDGER_TABLES:
        if table not in columns:
            sources[table] = f"memory.blank.{table}"
        elif "cluster" not in columns[table]:  # written before clusters: all 'default'
            sources[table] = f"(SELECT *, 'default' AS cluster FROM {alias}.main.{table})"
        else:
            sources[table] = f"{alias}.main.{table}"
    return sources


def _parquet_sources(con: duckdb.DuckDBPyConnection, root: Path) -> dict[str, str]:
    found = [t for t in LEDGER_TABLES if any((root / t).rglob("*.parquet"))]
    if not any(t in found for t in _REQUIRED):
        raise LedgerError(f"{root}: expected a ledger export (directories "
                          f"{', '.join(_REQUIRED)} holding cluster=NAME/month=YYYY-MM/*.parquet"
                          "), found none")
    try:  # the files the export wrote, and no others (metering/manifest.py)
        manifest.verify(root, (*LEDGER_TABLES, *SIDE_TABLES, *CLOSE_TABLES))
    except manifest.ManifestError as e:
        raise LedgerError(str(e)) from None
    sources = {}
    for table in (*SIDE_TABLES, *CLOSE_TABLES):
        whole = root / table / "part-0.parquet"
        sources[table] = (f"read_parquet('{str(whole).replace(chr(39), chr(39) * 2)}')"
                          if whole.is_file() else f"memory.blank.{table}")
    sources.update({t: f"memory.blank.{t}" for t in DERIVED_TABLES})
    for table in LEDGER_TABLES:
        if table not in found:
            sources[table] = f"memory.blank.{table}"
            continue
        # Columns in the schema's order and types; month is the partition key only.
        files = (f"read_parquet({parquet_glob(root, table)}, hive_partitioning = true, "
                 f"hive_types = {PARTITION_TYPES}, filename = true)")
        have = _check_parquet(con, root, table, files)
        # A column added after the export was written (device_hours.vendor) reads as its
        # default, as the migration gives a ledger's rows of before.
        columns = ", ".join(
            name if name in have or default is None else f"{default} AS {name}"
            for name, default in con.execute(
                "SELECT column_name, column_default FROM information_schema.columns WHERE "
                "table_catalog = 'memory' AND table_schema = 'blank' AND table_name = ? "
                "ORDER BY ordinal_position", [table]).fetchall())
        sources[table] = f"(SELECT {columns} FROM {files})"
    return sources


def _check_parquet(con: duckdb.DuckDBPyConnection, root: Path, table: str, files: str
                   ) -> set[str]:
    """One line, not a wrong bill or a traceback later: every column of the table's files has
    the ledger's type, and each cluster-month comes from one file holding that month's hours
    only (the same file under another month= partition would count its hours twice)."""
    want = {str(c): str(t) for c, t in con.execute(
        "SELECT column_name, data_type FROM information_schema.columns WHERE table_catalog = "
        "'memory' AND table_schema = 'blank' AND table_name = ?", [table]).fetchall()}
    try:
        have = {str(r[0]): str(r[1]) for r in con.execute(f"DESCRIBE SELECT * FROM {files}"
                                                          ).fetchall()}
    except duckdb.OutOfMemoryException:
        raise
    except duckdb.Error as e:
        raise LedgerError(f"{root / table}: cannot read it as the ledger's {table}: "
                          f"{str(e).strip().splitlines()[0]}") from None
    for column, kind in want.items():
        if have.get(column, kind) != kind:
            raise LedgerError(f"{root / table}: column {column} is {have[column]}, the "
                              f"ledger's is {kind} (a file not written by `gpu-ledger ledger "
                              "export`); export the ledger again")
    if "hour" not in have:
        return set(have)
    try:
        row = con.execute(
            f"SELECT filename, cluster, month FROM {files} GROUP BY ALL HAVING "
            "bool_or(strftime(hour, '%Y-%m') <> month) UNION ALL SELECT min(filename), cluster, "
            f"month FROM {files} GROUP BY cluster, month HAVING count(DISTINCT filename) > 1 "
            "LIMIT 1").fetchall()
    except duckdb.OutOfMemoryException:
        raise
    except duckdb.Error as e:
        raise LedgerError(f"{root / table}: cannot read it as the ledger's {table}: "
                          f"{str(e).strip().splitlines()[0]}") from None
    if row:
        name, cluster, month = row[0]
        raise LedgerError(f"{name}: cluster {cluster}, {month} of {table} is not this file's "
                          "alone or holds hours of another month: its rows would be counted "
                          "twice; export the ledger again")
    return set(have)
