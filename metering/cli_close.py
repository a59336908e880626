"""`gpu-ledger close YYYY-MM`: close a month whose hours `meter --daily` metered and priced.

From then on its bill never changes: re-metering its hours is refused (exit 9) unless
`--adjust-closed`, and `meter --daily` posts what late data changes as adjustments to the open
month (metering/closes.py; docs/metering.md, "Closing a month").
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime

from metering import api, closes, db
from metering.cli_meter import DEFAULT_DB
from metering.errors import ArgumentParser, ExitCode, MeteringError
from metering.period import parse_month


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="gpu-ledger close",
                       description="Close a metered and priced month: its charges never change "
                                   "again; later data becomes adjustments in the open month.")
    p.add_argument("month", metavar="YYYY-MM", help="the month to close (UTC)")
    p.add_argument("--db", default=DEFAULT_DB, metavar="PATH",
                   help=f"DuckDB file (default ./{DEFAULT_DB})")
    p.add_argument("--wait", type=float, default=0.0, metavar="SECONDS",
                   help="when another process holds the ledger, wait up to this long for it")
    p.add_argument("-q", "--quiet", action="store_true", help="no output on success")
    return p


def _run(args: argparse.Namespace) -> int:
    month = parse_month(args.month)
    with api.open_ledger(args.db, create=False, wait=args.wait,
                         say=lambda msg: print(msg, file=sys.stderr)) as con, \
            db.transaction(con):
        done = closes.close(con, month, datetime.now(UTC))
        currency = ", ".join(r[0] for r in con.execute(
            "SELECT DISTINCT currency FROM cost_models WHERE hash IN (SELECT DISTINCT "
            "cost_model_hash FROM charges WHERE hour >= ? AND hour < ?) ORDER BY 1",
            [month.start, month.end]).fetchall())
        posted = closes.posting_month(con, month)
    if not args.quiet:
        when = "was closed on" if done.already else "closed at"
        print(f"close: {month} {when} {done.closed_at:%Y-%m-%d %H:%M} UTC: {done.cost:,.2f} "
              f"{currency} over {done.device_hours:,} device-hours; its charges never change "
              f"from now on, data metered later is posted as adjustments to {posted}",
              file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as exc:
        return int(exc.code) if isinstance(exc.code, int) else ExitCode.USAGE
    try:
        return _run(args)
    except MeteringError as exc:
        print(f"gpu-ledger close: {exc}", file=sys.stderr)
        return exc.code
