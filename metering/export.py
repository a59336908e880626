"""The ledger as open data, and many ledgers as one.

`export_ledger` writes every ledger table as hive-partitioned Parquet,
`DIR/<table>/cluster=<name>/month=<YYYY-MM>/part-0.parquet` (schema in docs/ledger-export.md),
which Spark, Trino, BigQuery and DuckDB read as partitioned tables. `merge_ledgers` copies
ledgers (DuckDB files or such directories) into one DuckDB ledger, a cluster-month at a time:
facts and the charges priced from them travel together, so the pricing invariant of each
cluster holds in the merged ledger exactly as it held in its source.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from pathlib import Path

import duckdb

from metering import db, guards, manifest
from metering.cluster import is_cluster_name
from metering.errors import ExitCode
from metering.ledgerview import (
    CLOSE_TABLES,
    DERIVED_TABLES,
    LEDGER_TABLES,
    SIDE_TABLES,
    LedgerError,
    attach_ledger,
    open_ledger,
)
from metering.period import Month

PART_FILE = "part-0.parquet"
# A cluster-month of every table, read where it is stored.
_PARTITIONS = " UNION ".join(
    f"SELECT DISTINCT cluster, strftime(hour, '%Y-%m') AS month FROM {{schema}}.{t}"
    for t in LEDGER_TABLES)


@dataclass(frozen=True, order=True)
class Partition:
    cluster: str
    month: str  # YYYY-MM

    @property
    def bounds(self) -> tuple[datetime, datetime]:
        m = Month.parse(self.month)
        return m.start, m.end

    def where(self) -> str:
        """SQL condition selecting the partition's rows (both parts validated)."""
        start, end = self.bounds
        return (f"cluster = '{self.cluster}' AND hour >= TIMESTAMP '{start:%Y-%m-%d %H:%M:%S}' "
                f"AND hour < TIMESTAMP '{end:%Y-%m-%d %H:%M:%S}'")


def _partitions(con: duckdb.DuckDBPyConnection, schema: str, origin: str) -> list[Partition]:
    rows = con.execute(_PARTITIONS.format(schema=schema) + " ORDER BY ALL").fetchall()
    out = []
    for cluster, month in rows:
        if not is_cluster_name(cluster):  # it becomes a directory name and a SQL literal
            raise LedgerError(f"{origin}: cluster {cluster!r} is not a cluster name; "
                              "re-meter it with a valid --cluster")
        out.append(Partition(str(cluster), str(month)))
    return out


@dataclass
class ExportResult:
    partitions: list[Partition] = field(default_factory=list)
    files: int = 0
    rows: int = 0
    removed: int = 0  # partition files of the selection whose rows are gone from the ledger


def export_ledger(ledger: str | Path, out: Path, months: Sequence[Month] = (),
                  clusters: Sequence[str] = ()) -> ExportResult:
    """Write the ledger's tables under `out` as cluster=/month= partitions, each file written
    to a temporary name and renamed, so a reader never sees half a file. `months`/`clusters`
    limit the export (default: everything); partitions of the selection that the ledger no
    longer has rows for are removed, so the directory mirrors the ledger."""
    con = open_ledger(ledger)
    result = ExportResult()
    try:
        wanted = _partitions(con, "main", str(ledger))
        month_names = {str(m) for m in months}
        wanted = [p for p in wanted if (not month_names or p.month in month_names)
                  and (not clusters or p.cluster in clusters)]
        result.partitions = wanted
        out.mkdir(parents=True, exist_ok=True)
        # Partitions outside the selection keep their entries; until the new manifest is
        # written last, the directory reads as an export that did not finish.
        try:
            old = manifest.read(out) or manifest.Manifest()
        except manifest.ManifestError:
            old = manifest.Manifest()

        def kept(cluster: str, month: str) -> bool:  # a partition outside the selection
            return bool(cluster) and not ((not month_names or month in month_names)
                                          and (not clusters or cluster in clusters))

        new = manifest.Manifest(
            {k: f for k, f in old.files.items() if kept(f.cluster, f.month)},
            {k: v for k, v in old.cost_models.items() if kept(*k.split("/", 1))})
        manifest.remove(out)
        for table in LEDGER_TABLES:
            written: set[Path] = set()
            for part in wanted:
                rows = con.execute(f"SELECT count(*) FROM {table} WHERE {part.where()}"
                                   ).fetchall()[0][0]
                if not rows:
                    continue
                target = out / table / f"cluster={part.cluster}" / f"month={part.month}"
                target.mkdir(parents=True, exist_ok=True)
                tmp = target / f".{PART_FILE}.{secrets.token_hex(6)}.tmp"
                try:
                    con.execute(
                        f"COPY (SELECT * EXCLUDE (cluster) FROM {table} WHERE {part.where()} "
                        f"ORDER BY hour) TO '{_quoted(tmp)}' "
                        "(FORMAT PARQUET, COMPRESSION ZSTD, ROW_GROUP_SIZE 1000000)")
                    os.replace(tmp, target / PART_FILE)
                except BaseException:
                    with contextlib.suppress(FileNotFoundError):
                        tmp.unlink()
                    raise
                written.add(target / PART_FILE)
                entry = manifest.describe(out, target / PART_FILE, table, part.cluster,
                                          part.month)
                new.files[entry.path] = entry
                result.files += 1
                result.rows += int(rows)
            result.removed += _remove_stale(out / table, written, month_names, set(clusters))
        for table in (*SIDE_TABLES, *CLOSE_TABLES):  # small, not partitioned: whole each time
            if con.execute(f"SELECT count(*) FROM {table}").fetchall()[0][0]:
                (out / table).mkdir(parents=True, exist_ok=True)
                tmp = out / table / f".{PART_FILE}.{secrets.token_hex(6)}.tmp"
                con.execute(f"COPY (SELECT * FROM {table} ORDER BY ALL) TO '{_quoted(tmp)}' "
                            "(FORMAT PARQUET, COMPRESSION ZSTD)")
                os.replace(tmp, out / table / PART_FILE)
                entry = manifest.describe(out, out / table / PART_FILE, table)
                new.files[entry.path] = entry
                result.files += 1
            elif (out / table / PART_FILE).exists():
                (out / table / PART_FILE).unlink()
        for part in wanted:
            new.cost_models[f"{part.cluster}/{part.month}"] = [str(r[0]) for r in con.execute(
                f"SELECT DISTINCT cost_model_hash FROM charges WHERE {part.where()} "
                "ORDER BY 1").fetchall()]
        manifest.write(out, new)  # last: the files it names are all in place
    finally:
        con.close()
    return result


def _quoted(path: Path) -> str:
    return str(path).replace("'", "''")


def _remove_stale(root: Path, written: set[Path], months: set[str], clusters: set[str]) -> int:
    """Partition files in the export's selection that this export did not write."""
    removed = 0
    for f in root.glob(f"cluster=*/month=*/{PART_FILE}"):
        cluster = f.parent.parent.name.removeprefix("cluster=")
        month = f.parent.name.removeprefix("month=")
        if f in written or (months and month not in months) or (clusters
                                                                and cluster not in clusters):
            continue
        f.unlink()
        removed += 1
    return removed


class MergeError(Exception):
    """The ledgers cannot be merged; nothing was written. `code`: the exit status."""

    def __init__(self, message: str, code: ExitCode = ExitCode.REFUSED) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class MergeResult:
    partitions: dict[str, list[Partition]] = field(default_factory=dict)  # source -> copied
    rows: int = 0
    # Months whose charges now carry several cost model hashes: re-price them with one.
    mixed_hashes: list[str] = field(default_factory=list)
    # Months closed in some sources whose merged hours are not all closed: left open here.
    partly_closed: list[str] = field(default_factory=list)


def merge_ledgers(target: str | Path, sources: Sequence[str | Path],
                  replace: bool = False) -> MergeResult:
    """Copy every cluster-month of `sources` into the DuckDB ledger `target` (created if
    missing), replacing that cluster-month there, all in one transaction. A cluster-month
    held by two sources is refused, and so is one whose source has fewer rows of a fact
    family than the target holds (metering.guards) unless `replace`. After copying, each
    copied cluster-month's row counts and costs in the target are checked against its
    source."""
    try:
        db.connect(target).close()  # creates or migrates it, refuses a non-DuckDB file
    except db.LedgerLocked:
        raise  # another process writes it: its own exit status
    except db.DatabaseError as e:
        raise MergeError(str(e), ExitCode.BAD_INPUT) from None
    con = db.engine(":memory:", spill=db.spill_dir())
    result = MergeResult()
    try:
        owner: dict[Partition, str] = {}
        plan: list[tuple[str, str, list[Partition]]] = []
        for i, src in enumerate(sources):
            schema = f"src{i}"
            try:
                attach_ledger(con, Path(src), schema)
                parts = _partitions(con, schema, str(src))
            except LedgerError as e:
                raise MergeError(str(e), ExitCode.BAD_INPUT) from None
            for part in parts:
                if part in owner:
                    raise MergeError(f"cluster {part.cluster}, {part.month}: in both "
                                     f"{owner[part]} and {src}; merge each cluster-month from "
                                     "one ledger")
                owner[part] = str(src)
            plan.append((str(src), schema, parts))
        con.execute("ATTACH ? AS target", [str(target)])
        con.execute("BEGIN TRANSACTION")
        try:
            closed_before = _closes(con, "target.main")
            for src, schema, parts in plan:
                for part in parts:
                    start, end = part.bounds
                    lost = guards.shrinks(
                        guards.held(con, start, end, [part.cluster], "target.main."),
                        guards.held(con, start, end, [part.cluster], f"{schema}."))
                    if lost and not replace:
                        raise MergeError(f"{src}: {part.month}: " + str(guards.refuse(
                            lost, True, "pass --replace to overwrite the merged ledger's "
                            "cluster-month with this source's")) + "; nothing written")
                    for table in LEDGER_TABLES:
                        con.execute(f"DELETE FROM target.main.{table} WHERE {part.where()}")
                        n = con.execute(f"INSERT INTO target.main.{table} BY NAME SELECT * "
                                        f"FROM {schema}.{table} WHERE {part.where()}"
                                        ).fetchall()[0][0]
                        result.rows += int(n)
                    for table in DERIVED_TABLES:  # of the target's facts: computed again
                        con.execute(f"DELETE FROM target.main.{table} WHERE {part.where()}")
                    _check_copy(con, schema, part, src)
                result.partitions[src] = parts
            for table in SIDE_TABLES:  # by key: a cost model kept by two sources is one row
                for _, schema, _ in plan:
                    con.execute(f"INSERT OR IGNORE INTO target.main.{table} "
                                f"SELECT * FROM {schema}.{table}")
            result.partly_closed = _merge_closes(con, plan, closed_before, str(target))
            result.mixed_hashes = [str(r[0]) for r in con.execute(
                "SELECT strftime(hour, '%Y-%m') FROM target.main.charges GROUP BY 1 "
                "HAVING count(DISTINCT cost_model_hash) > 1 ORDER BY 1").fetchall()]
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
    finally:
        con.close()
    return result


def _check_copy(con: duckdb.DuckDBPyConnection, schema: str, part: Partition, src: str) -> None:
    """The cluster-month in the target is its source's, row for row and cent for cent."""
    for table in LEDGER_TABLES:
        figure = "sum(cost)" if table in ("charges", "adjustments") else "0"
        got, want = (con.execute(f"SELECT count(*), {figure} FROM {where}.{table} "
                                 f"WHERE {part.where()}").fetchall()[0]
                     for where in ("target.main", schema))
        if got != want:
            raise MergeError(f"{src}: cluster {part.cluster}, {part.month}, {table}: copied "
                             f"{got} (rows, cost) where the source has {want}; nothing written",
                             ExitCode.FAILED)


# --- closed months ----------------------------------------------------------------------------
# `month_closes` has one row per month for the whole ledger (metering/closes.py); its cost is
# the month's charges when it was closed, which pricing never changes afterwards. A merged
# ledger closes a month only when every cluster-month of it is closed where it came from, so
# the row means there what it means in each source: these hours' charges are final.


@dataclass(frozen=True)
class _Close:
    closed_at: datetime
    cost: Decimal
    device_hours: int


def _closes(con: duckdb.DuckDBPyConnection, schema: str) -> dict[str, _Close]:
    return {f"{m:%Y-%m}": _Close(t, Decimal(c), int(d)) for m, t, c, d in con.execute(
        f"SELECT month, closed_at, cost, device_hours FROM {schema}.month_closes").fetchall()}


def _month_bill(con: duckdb.DuckDBPyConnection, schema: str, month: str,
                clusters: Sequence[str] | None = None) -> Decimal:
    """The month's charges in `schema` (of `clusters` only, when given)."""
    start, end = Month.parse(month).start, Month.parse(month).end
    only = "" if clusters is None else "AND list_contains($c, cluster)"
    params: dict[str, object] = {"s": start, "e": end}
    if clusters is not None:
        params["c"] = list(clusters)
    row = con.execute(f"SELECT coalesce(sum(cost), 0) FROM {schema}.charges WHERE hour >= $s "
                      f"AND hour < $e {only}", params).fetchone()
    assert row is not None
    return Decimal(row[0])


def _merge_closes(con: duckdb.DuckDBPyConnection, plan: Sequence[tuple[str, str,
                  Sequence[Partition]]], before: dict[str, _Close], target: str) -> list[str]:
    """Merge `month_closes` after the cluster-months were copied; the months closed in some
    source but left open in the merged ledger (another cluster's hours of it are open).
    Refused (exit 9) where a month closed in the target would get another bill, or where a
    source's close disagrees with the charges it holds: a closed bill never changes
    silently."""
    for month, close in sorted(before.items()):
        cost = _month_bill(con, "target.main", month)
        if cost != close.cost:
            raise MergeError(
                f"{month} is closed in {target} with a bill of {close.cost:,.2f}; this merge "
                f"would make it {cost:,.2f}: a closed month's bill never changes (late data "
                "reaches it as adjustments, metered with --adjust-closed in the cluster's "
                "ledger); nothing written", ExitCode.CLOSED)
    closing: dict[str, list[tuple[str, _Close, list[str]]]] = {}
    for src, schema, parts in plan:
        for month, close in _closes(con, schema).items():
            clusters = sorted({p.cluster for p in parts if p.month == month})
            cost = _month_bill(con, schema, month, clusters)
            if cost != close.cost:
                raise MergeError(
                    f"{month} is closed in {src} with a bill of {close.cost:,.2f}, but its "
                    f"charges of the month add up to {cost:,.2f}: that close does not match "
                    "what it closed; nothing written", ExitCode.CLOSED)
            closing.setdefault(month, []).append((src, close, clusters))
    partly = []
    for month, closers in sorted(closing.items()):
        if month in before:  # closed here already, and its bill is unchanged (checked above)
            continue
        start, end = Month.parse(month).start, Month.parse(month).end
        held = {str(r[0]) for r in con.execute(
            "SELECT DISTINCT cluster FROM target.main.coverage WHERE hour >= $s AND hour < $e "
            "UNION SELECT DISTINCT cluster FROM target.main.charges WHERE hour >= $s AND "
            "hour < $e", {"s": start, "e": end}).fetchall()}
        if not held <= {c for _, _, cs in closers for c in cs}:
            partly.append(month)
            continue
        # The closes' own figures: device-hours at the close (facts metered since for
        # adjustments are not in them); their costs add up to the merged charges (checked).
        cost = sum((c.cost for _, c, _ in closers), Decimal(0))
        device_hours = sum(c.device_hours for _, c, _ in closers)
        at = max(c.closed_at for _, c, _ in closers)
        con.execute("INSERT INTO target.main.month_closes VALUES ($m, $t, $c, $d)",
                    {"m": Month.parse(month).start.date(), "t": at, "c": cost,
                     "d": device_hours})
    return partly
