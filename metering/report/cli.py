"""`gpu-ledger report`: write the monthly chargeback report from priced charges.

Exit status (`metering.errors.ExitCode`, the table in docs/operations.md): 0 report written,
1 files could not be written (nothing changed), 2 bad options, 3 (with --check-budgets) the
report was written and a team is over its monthly budget, 4 a bad cost model or ledger file,
6 the month is not metered or not priced (or priced with another cost model), 7 the ledger is
being written by another run, 8 out of memory under DuckDB's cap (--memory-limit).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path

import duckdb

import metering
from metering import crosscheck, db, ledgerview, waste
from metering.cluster import cluster_name_problem
from metering.costmodel import CostModel, CostModelError, load_cost_model, parse_cost_model
from metering.errors import (
    ArgumentParser,
    ExitCode,
    InputError,
    MeteringError,
    RefusedError,
    UsageError,
)
from metering.period import Month
from metering.progress import Progress
from metering.report import focus, model
from metering.report.csvout import render_csv
from metering.report.html import render_html
from metering.report.markdown import render_markdown
from metering.report.model import CostModelInfo, Report
from metering.report.parquetout import render_parquet
from metering.report.terminal import render_summary
from metering.report.writer import write_files

DEFAULT_DB = "gpu-ledger.duckdb"
DEFAULT_OUT = "reports"
PACKAGED_MODEL = "cost-model.yaml (packaged default)"

# format -> (file extension, renderer)
FORMATS: dict[str, tuple[str, Callable[[Report], bytes]]] = {
    "csv": ("csv", render_csv),
    "parquet": ("parquet", render_parquet),
    "md": ("md", lambda r: render_markdown(r).encode("utf-8")),
    "html": ("html", lambda r: render_html(r).encode("utf-8")),
}
# Formats only written when asked for: format -> files (extension, renderer).
ON_REQUEST: dict[str, list[tuple[str, Callable[[Report], bytes]]]] = {
    "focus": [("focus.csv", focus.render_csv), ("focus.parquet", focus.render_parquet)],
}


BUDGET_EXCEEDED = ExitCode.OVER_BUDGET  # --check-budgets: a team is over budget


def file_name(month: Month, fmt: str) -> str:
    return f"chargeback-{month}.{FORMATS[fmt][0]}"


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
        "--top", type=int, default=model.DEFAULT_TOP_PODS, help="pods listed by cost (default 20)"
    )
    p.add_argument(
        db.MEMORY_LIMIT_OPTION, metavar="SIZE",
        help=f"DuckDB's memory cap, e.g. 4GB (default ${db.MEMORY_LIMIT_ENV}, else "
        f"{db.DEFAULT_MEMORY_LIMIT}); beyond it DuckDB spills to disk",
    )
    return p


def _formats(values: list[str] | None) -> list[str]:
    if not values:
        return list(FORMATS)
    chosen: list[str] = []
    for value in values:
        for name in (v.strip().lower() for v in value.split(",")):
            if name not in FORMATS and name not in ON_REQUEST:
                known = ",".join([*FORMATS, *ON_REQUEST])
                raise UsageError(f"--format: expected some of {known}, got {name!r}")
            if name not in chosen:
                chosen.append(name)
    return chosen


def _open(path: str, cluster: str | None) -> duckdb.DuckDBPyConnection:
    """The ledger as the report reads it: read-only views, one cluster's rows with --cluster."""
    try:
        return ledgerview.open_ledger(path, cluster)
    except ledgerview.LedgerError as e:
        raise InputError(str(e)) from None


def meter_command(month: Month, db_path: str, cost_model: str | None = None) -> str:
    """The command that (re-)prices a month from the facts already in the database."""
    cmd = f"gpu-ledger meter --price-only --month {month} --db {db_path}"
    return cmd + (f" --cost-model {cost_model}" if cost_model else "")


def _cost_model_info(
    month: Month, hashes: list[str], given: str | None, cm: CostModel, db_path: str
) -> CostModelInfo:
    """Which cost model the report states: the one the charges were priced with."""
    if len(hashes) > 1:
        raise RefusedError(
            f"charges for {month} were priced with {len(hashes)} different cost models "
            f"({', '.join(h[:12] for h in hashes)}): re-price the month with one cost model "
            f"({meter_command(month, db_path)}) before reporting it"
        )
    name = given if given is not None else cm.name or PACKAGED_MODEL
    if not hashes or hashes[0] == cm.hash:
        return CostModelInfo(name, str(cm.hash), str(cm.currency))
    if given is not None:
        raise RefusedError(
            f"{given}: charges for {month} were priced with cost model {hashes[0]}, but this "
            f"file has hash {cm.hash}; re-price the month with it "
            f"({meter_command(month, db_path, given)}) or leave out --cost-model"
        )
    # Priced with a file we cannot name: state the hash the charges carry, and no file.
    return CostModelInfo("", hashes[0], "")


def _ledger_cost_model(con: duckdb.DuckDBPyConnection, hashes: list[str]) -> CostModel | None:
    """The cost model the month was priced with, as the ledger keeps it next to the charges."""
    stored = model.stored_cost_model(con, hashes[0]) if len(hashes) == 1 else None
    if stored is None:
        return None
    try:
        return parse_cost_model(stored.text, stored.name)
    except CostModelError:  # kept by a version whose rules were looser: state what is stored
        return None


def price_lookup(cm: CostModel) -> model.PriceLookup:
    """The report's view of a cost model's prices: rate, the entry that set it, fallback."""
    rules = {r.key: r for r in (cm.default_price, *cm.gpus)}

    def lookup(gpu_model: str) -> model.ModelPrice:
        resolved = cm.price_for(gpu_model)
        rule = rules[resolved.rule]
        text = str(resolved.rule)
        if rule.model is not None:
            text += f' (model "{rule.model}")'
        elif rule.pattern is not None:
            text += f' (pattern "{rule.pattern}")'
        if rule.derived is not None:
            text += ", derived from purchase price, power and overhead"
        fallback = rule.model is None and rule.pattern is None
        return model.ModelPrice(resolved.hourly, text, fallback, resolved.discount)

    return lookup


def make_report(
    db_path: str, month: Month, cost_model_path: str | None, top: int, charge_days: bool = False,
    settings: waste.Settings | None = None, cluster: str | None = None,
) -> Report:
    given = load_cost_model(cost_model_path) if cost_model_path is not None else None
    con = _open(db_path, cluster)
    notes: list[str] = []
    try:
        hashes = model.priced_hashes(con, month)
        facts = model.has_facts(con, month)
        # The report only reads: pricing is the explicit `meter --price-only` step.
        if not hashes and facts:
            raise RefusedError(
                f"{db_path}: {month} has GPU usage but no charges (it was ingested, not "
                f"priced); price it first: {meter_command(month, db_path, cost_model_path)}"
            )
        if not hashes:
            raise RefusedError(
                f"{db_path}: no metered data for {month}; meter it first: gpu-ledger meter "
                f"--prometheus URL --month {month} --db {db_path}"
            )
        cm = given or _ledger_cost_model(con, hashes) or load_cost_model(None)
        info = _cost_model_info(month, hashes, cost_model_path, cm, db_path)
        crosscheck.check_month(con, month, db_path)  # no doubled or orphaned device-hours
        same = info.hash == cm.hash
        if same and cluster is not None:
            cm = cm.for_cluster(cluster)  # the prices and rules that cluster was priced with
        # Prices per GPU model are one figure only where every cluster has the same ones.
        uniform = cluster is not None or not (set(cm.clusters)
                                              & set(model.clusters_in(con, month)))
        prices = price_lookup(cm) if same and uniform else None
        budgets = cm.budgets if same else None
        report = model.build_report(
            con, month, info, metering.__version__, top, prices,
            budgets.monthly if budgets else None, budgets.warn_at if budgets else Decimal(1),
            cluster or "",
        )
        if charge_days:
            days = model.charge_days(con, month)
            by_cluster = {}
            if same and cm is not None:
                gpu_models = sorted({cd.model for cd in days if cd.model})
                for name in sorted({cd.cluster for cd in days}):
                    lookup = price_lookup(cm.for_cluster(name))
                    by_cluster[name] = {m: lookup(m) for m in gpu_models}
            report = dataclasses.replace(report, charge_days=days, cluster_prices=by_cluster)
        if same:
            recs = waste.recommend(con, month.start, month.end, waste.mig_fraction(cm),
                                   settings or waste.Settings())
            report = dataclasses.replace(report, savings=recs)
    finally:
        con.close()
    return dataclasses.replace(report, notes=report.notes + notes)


def _render(report: Report, formats: list[str]) -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    for f in formats:
        if f in FORMATS:
            files[file_name(report.month, f)] = FORMATS[f][1](report)
            continue
        for ext, render in ON_REQUEST[f]:
            try:
                files[f"chargeback-{report.month}.{ext}"] = render(report)
            except focus.FocusError as e:
                raise UsageError(f"--format {f}: {e}") from None
    return files


@dataclasses.dataclass(frozen=True)
class Written:
    """A report written by `write_report`: what it says, and the files it wrote."""

    report: Report
    files: list[Path]


def write_report(db_path: str | Path, month: Month, out: str | Path, *,
                 formats: list[str] | None = None, cost_model_path: str | None = None,
                 top: int = model.DEFAULT_TOP_PODS, settings: waste.Settings | None = None,
                 cluster: str | None = None, memory_limit: str | None = None,
                 progress: Progress | None = None) -> Written:
    """Read `month` from the ledger (read-only), render `formats` (default csv, parquet, md,
    html; `focus` on request) and write them into `out`, all files or none. Every failure is
    a MeteringError (not metered or not priced: RefusedError; files not written: exit 1)."""
    chosen = _formats(formats)
    with db.memory_cap(memory_limit, f"{db_path}: reporting {month}"):
        report = make_report(str(db_path), month, cost_model_path, top, "focus" in chosen,
                             settings, cluster)
    if progress is not None:
        progress.chunk_done("read the ledger")
    files = _render(report, chosen)
    if progress is not None:
        progress.chunk_done("rendered", amount=len(files), what="files")
    try:
        written = write_files(Path(out), files)
    except OSError as e:
        raise MeteringError(
            f"{out}: cannot write the report ({e.strerror or e}); previous report files are "
            "unchanged"
        ) from None
    if progress is not None:
        progress.chunk_done("written")
    return Written(report, written)


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
                            progress=progress)
        report, written = done.report, done.files
        if args.check_budgets and report.budgets is None:
            raise UsageError(
                "--check-budgets: the budgets are in the cost model the charges were priced "
                "with; pass it with --cost-model (the report files were written)"
            )
    except MeteringError as e:
        print(f"gpu-ledger report: {e}", file=sys.stderr)
        return e.code
    sys.stdout.write(render_summary(report, [str(p) for p in written]))
    if args.check_budgets:
        return _check_budgets(report)
    return 0


def _check_budgets(report: Report) -> int:
    over = [b for b in report.budgets or [] if b.status is model.BudgetStatus.OVER]
    for b in over:
        print(f"gpu-ledger report: team {b.team!r} is over its {report.month} budget: spent "
              f"{b.spend:.2f} of {b.budget:.2f} {report.cost_model.currency}", file=sys.stderr)
    return BUDGET_EXCEEDED if over else 0
