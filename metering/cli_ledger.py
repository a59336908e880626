"""`gpu-ledger ledger export|merge`: the ledger as hive-partitioned Parquet, and several
ledgers (one per cluster, from separate CronJobs) merged into one.

Exit status (metering.errors.ExitCode): 0 done, 2 usage, 4 a ledger that cannot be read,
6 a merge refused (a cluster-month in two sources, or one that would lose facts the merged
ledger holds), 8 out of memory under the DuckDB cap (--memory-limit), 9 a merge that would
change the bill of a closed month (metering/closes.py), 1 anything else; nothing half-written.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from metering import db
from metering.cluster import cluster_name_problem
from metering.errors import ExitCode, MeteringError
from metering.export import MergeError, export_ledger, merge_ledgers
from metering.ledgerview import LedgerError
from metering.period import Month


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # usage errors: exit 2 with one line
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: {message}\n")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="gpu-ledger ledger",
                description="Export a ledger as hive-partitioned Parquet, or merge ledgers.")
    sub = p.add_subparsers(dest="action", required=True, parser_class=_Parser)
    ex = sub.add_parser("export", help="write facts and charges as Parquet partitioned by "
                        "cluster and month (docs/ledger-export.md)")
    ex.add_argument("--db", required=True, metavar="PATH",
                    help="the ledger: a DuckDB file, or an export directory")
    ex.add_argument("--out", required=True, metavar="DIR", help="export directory")
    ex.add_argument("--month", action="append", default=[], metavar="YYYY-MM",
                    help="export this month only (repeatable; default: every month)")
    ex.add_argument("--cluster", action="append", default=[], metavar="NAME",
                    help="export this cluster only (repeatable; default: every cluster)")
    mg = sub.add_parser("merge", help="copy ledgers (DuckDB files or export directories) "
                        "into one DuckDB ledger, a cluster-month at a time")
    mg.add_argument("--into", required=True, metavar="PATH",
                    help="the DuckDB ledger to merge into (created if missing)")
    mg.add_argument("sources", nargs="+", metavar="LEDGER",
                    help="DuckDB files or export directories, e.g. one per cluster")
    mg.add_argument("--replace", action="store_true",
                    help="replace a cluster-month even where the source has fewer device, "
                         "allocation, workload or fraction rows than the merged ledger "
                         "(refused by default, exit 6)")
    for action in (ex, mg):
        action.add_argument(db.MEMORY_LIMIT_OPTION, metavar="SIZE",
                            help=f"DuckDB's memory cap, e.g. 4GB (default "
                                 f"${db.MEMORY_LIMIT_ENV}, else {db.DEFAULT_MEMORY_LIMIT})")
    return p


def main(argv: list[str] | None = None) -> int:
    try:
        args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as exc:
        return int(exc.code) if isinstance(exc.code, int) else 2
    try:
        with db.memory_cap(args.memory_limit, f"ledger {args.action}"):
            if args.action == "export":
                return _export(args)
            return _merge(args)
    except MeteringError as exc:  # a locked ledger, ...: its own exit status
        print(f"gpu-ledger ledger {args.action}: {exc}", file=sys.stderr)
        return exc.code
    except LedgerError as exc:
        print(f"gpu-ledger ledger {args.action}: {exc}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    except MergeError as exc:
        print(f"gpu-ledger ledger {args.action}: {exc}", file=sys.stderr)
        return exc.code
    except OSError as exc:
        print(f"gpu-ledger ledger {args.action}: {exc.filename or ''}: "
              f"{exc.strerror or exc}", file=sys.stderr)
        return 1


def _usage(action: str, message: str) -> int:
    print(f"gpu-ledger ledger {action}: {message}", file=sys.stderr)
    return 2


def _export(args: argparse.Namespace) -> int:
    months = []
    for text in args.month:
        try:
            months.append(Month.parse(text))
        except ValueError as exc:
            return _usage("export", f"--month: {exc}")
    for name in args.cluster:
        if cluster_name_problem(name):
            return _usage("export", f"--cluster: {cluster_name_problem(name)}")
    if not Path(args.db).exists():
        return _usage("export", f"--db {args.db}: expected a ledger, found nothing there")
    result = export_ledger(args.db, Path(args.out), months, args.cluster)
    print(f"gpu-ledger ledger export: {len(result.partitions)} cluster-month(s), "
          f"{result.files} file(s), {result.rows} row(s) under {args.out}"
          + (f"; removed {result.removed} stale file(s)" if result.removed else ""),
          file=sys.stderr)
    return 0


def _merge(args: argparse.Namespace) -> int:
    for src in args.sources:
        if not Path(src).exists():
            return _usage("merge", f"{src}: expected a ledger, found nothing there")
        if Path(src).resolve() == Path(args.into).resolve():
            return _usage("merge", f"{src}: is the ledger merged into")
    result = merge_ledgers(args.into, args.sources, replace=args.replace)
    for src, parts in result.partitions.items():
        clusters = sorted({p.cluster for p in parts})
        print(f"gpu-ledger ledger merge: {src}: {len(parts)} cluster-month(s) of "
              f"{', '.join(clusters) or 'nothing'}", file=sys.stderr)
    print(f"gpu-ledger ledger merge: {result.rows} row(s) into {args.into}", file=sys.stderr)
    if result.partly_closed:
        print(f"gpu-ledger ledger merge: {', '.join(result.partly_closed)}: closed in some "
              "sources but other clusters' hours of it are open, so the merged ledger leaves it "
              "open until every cluster's ledger closes it (gpu-ledger close)", file=sys.stderr)
    if result.mixed_hashes:
        print(f"gpu-ledger ledger merge: {', '.join(result.mixed_hashes)}: charges priced with "
              "different cost models; re-price before reporting: gpu-ledger meter --price-only "
              f"--month YYYY-MM --db {args.into} --cost-model FILE", file=sys.stderr)
    return 0
