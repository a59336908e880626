"""`gpu-ledger report`: write the monthly chargeback report from priced charges.

Exit status (`metering.errors.ExitCode`, the table in docs/operations.md): 0 report written,
1 files could not be written (nothing changed), 2 bad options, 3 (with --check-budgets) the
report was written and a team is over its monthly budget (with --strict-prices: a GPU model
was priced at the cost model's default price), 4 a bad cost model or ledger file,
6 the month is not metered or not priced (or priced with another cost model), 7 the ledger is
being written by another run, 8 out of memory under DuckDB's cap (--memory-limit).
"""

from __future__ import annotations

import argparse
import sys

from metering import db
from metering.cluster import cluster_name_problem
from metering.errors import ArgumentParser, ExitCode, MeteringError, UsageError
from metering.period import Month
from metering.progress import Progress
from metering.report import model, waste
from metering.report.builder import write_report
from metering.report.model import Report
from metering.report.terminal import render_summary

DEFAULT_DB = "gpu-ledger.duckdb"
DEFAULT_OUT = "reports"


BUDGET_EXCEEDED = ExitCode.OVER_BUDGET  # --check-budgets: a team is over budget
# --strict-prices: a model fell to the default price. Exit 3 as for budgets: the report is
# written, and a check a finance run asked for failed.
STRICT_PRICES_FAILED = ExitCode.OVER_BUDGET


def _parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="gpu-ledger report",
        description="Write the monthly GPU chargeback report (CSV, Parquet, Markdown, HTML) "
        "from the charges in the metering database.",
    )
    p.add_argument("--month", required=True, help="month to report, YYYY-MM (UTC)")
    p.add_argument("--db", default=DEFAULT_DB,
                   help=f"the ledger: a metering database (default {DEFAULT_DB}) or a directory "
                   "written by `gpu-ledger ledger export`")
    p.add_argument("--cluster", metavar="NAME",
                   help="report this cluster only (default: the fleet view over all clusters)")
    p.add_argument(
        "--cost-model",
        help="cost model file the month was (or is to be) priced with; "
        "default: the one recorded with the charges",
    )
    p.add_argument("--out", default=DEFAULT_OUT, help=f"output directory (default {DEFAULT_OUT})")
    p.add_argument(
        "--format",
        action="append",
        help="comma-separated formats among csv,parquet,md,html (default: these four) and "
        "focus (FinOps FOCUS 1.2 rows, CSV and Parquet); repeatable",
    )
    p.add_argument(
        "--min-hours", type=int, default=waste.Settings.min_hours,
        help="no waste recommendation from fewer hours observed "
        f"(default {waste.Settings.min_hours})",
    )
    p.add_argument(
        "--idle-hours", type=int, default=waste.Settings.idle_hours,
        help="device-hours held with no GPU process before a workload is an idle holder "
        f"(default {waste.Settings.idle_hours})",
    )
    p.add_argument(
        "--check-budgets",
        action="store_true",
        help=f"exit {BUDGET_EXCEEDED} (after writing the report) when a team's spend is over "
        "its monthly budget in the cost model",
    )
    p.add_argument(
        "--strict-prices",
        action="store_true",
        help=f"exit {STRICT_PRICES_FAILED} (after writing the report, which lists them at the "
        "top) when a GPU model was priced at pricing.default: no cost model entry matches it",
    )
    p.add_argument(
        "--top", type=int, default=model.DEFAULT_TOP_PODS, help="pods listed by cost (default 20)"
    )
    p.add_argument(
        db.MEMORY_LIMIT_OPTION, metavar="SIZE",
        help=f"DuckDB's memory cap, e.g. 4GB (default ${db.MEMORY_LIMIT_ENV}, else "
        f"{db.DEFAULT_MEMORY_LIMIT}); beyond it DuckDB spills to disk",
    )
    return p


def main(argv: list[str]) -> int:
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse has printed usage and the problem
        return int(e.code or 0)
    try:
        try:
            month = Month.parse(args.month)
        except ValueError as e:
            raise UsageError(f"--month: {e}") from None
        for opt, value in (("--top", args.top), ("--min-hours", args.min_hours),
                           ("--idle-hours", args.idle_hours)):
            if value < 1:
                raise UsageError(f"{opt}: expected a whole number >= 1, got {value}")
        if args.cluster is not None and cluster_name_problem(args.cluster):
            raise UsageError(f"--cluster: {cluster_name_problem(args.cluster)}")
        settings = waste.Settings(min_hours=args.min_hours, idle_hours=args.idle_hours)
        # A bar on a terminal only: the summary on stdout is what logs want.
        progress = Progress(3, stage="report", unit="step", logs=False)
        done = write_report(args.db, month, args.out, formats=args.format,
                            cost_model_path=args.cost_model, top=args.top, settings=settings,
                            cluster=args.cluster, memory_limit=args.memory_limit,
                            progress=progress, note=_log)
        report, written = done.report, done.files
        if args.strict_prices and report.budgets is None:  # None: cost model not at hand
            raise UsageError(
                "--strict-prices: which entry priced each model is in the cost model the "
                "charges were priced with; pass it with --cost-model (the report files were "
                "written)"
            )
        if args.check_budgets and report.budgets is None:
            raise UsageError(
                "--check-budgets: the budgets are in the cost model the charges were priced "
                "with; pass it with --cost-model (the report files were written)"
            )
    except MeteringError as e:
        print(f"gpu-ledger report: {e}", file=sys.stderr)
        return e.code
    sys.stdout.write(render_summary(report, [str(p) for p in written]))
    rc = _check_budgets(report) if args.check_budgets else 0
    if args.strict_prices and report.default_priced_models:
        print(f"gpu-ledger report: --strict-prices: {len(report.default_priced_models)} GPU "
              f"model(s) priced at pricing.default: {', '.join(report.default_priced_models)}; "
              "add them under pricing.gpus and re-price the month", file=sys.stderr)
        rc = STRICT_PRICES_FAILED
    return rc


def _log(text: str) -> None:
    """A line for the job's log (stderr: stdout is the summary)."""
    print(f"gpu-ledger report: {text}", file=sys.stderr, flush=True)


def _check_budgets(report: Report) -> int:
    over = [b for b in report.budgets or [] if b.status is model.BudgetStatus.OVER]
    for b in over:
        print(f"gpu-ledger report: team {b.team!r} is over its {report.month} budget: spent "
              f"{b.spend:.2f} of {b.budget:.2f} {report.cost_model.currency}", file=sys.stderr)
    return BUDGET_EXCEEDED if over else 0
