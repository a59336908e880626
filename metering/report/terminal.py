"""The summary printed to the terminal: the report's facts and the team table.

Label values are data and may hold control characters (an ANSI escape in a pod name would
otherwise drive the terminal), so anything unprintable is shown as a Python-style escape.
"""

from __future__ import annotations

import unicodedata

from metering.report import fmt
from metering.report.model import Report

MAX_CELL = 36
MAX_GAPS = 10  # the files name every gap; the terminal shows the first few
MAX_SAVINGS = 5  # the files list every recommendation; the terminal shows the largest


def printable(text: str, limit: int | None = MAX_CELL) -> str:
    out = []
    for ch in text:
        if unicodedata.category(ch).startswith("C"):
            out.append(ch.encode("unicode_escape").decode("ascii"))
        else:
            out.append(ch)
    text = "".join(out)
    return text if limit is None or len(text) <= limit else text[: limit - 1] + "…"


def _table(grid: fmt.Grid) -> list[str]:
    cells = [[printable(c) for c in row] for row in [grid.heads, *grid.rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(grid.heads))]

    def line(row: list[str]) -> str:
        parts = [
            c.rjust(w) if grid.numeric(i) else c.ljust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        return "  ".join(parts).rstrip()

    rule = "  ".join("-" * w for w in widths)
    out = [line(cells[0]), rule]
    for kind, row in zip(grid.kinds, cells[1:], strict=True):
        if kind == "total":
            out.append(rule)
        out.append(line(row))
    return out


def render_summary(report: Report, written: list[str] | None = None) -> str:
    lines = [f"GPU chargeback report {report.month}"]
    lines += [f"  {printable(n, None)}" for n in report.notes]  # before any figure
    lines += [f"  {name + ':':<16} {printable(text, None)}" for name, text in fmt.facts(report)]
    for r in report.missing[:MAX_GAPS]:
        lines.append(f"  {'no data:':<16} {r.describe()}")
    if len(report.missing) > MAX_GAPS:
        more = len(report.missing) - MAX_GAPS
        lines.append(f"  {'':<16} … and {more} more range(s), listed in the report files")
    lines.append("")
    if not report.has_data:
        lines.append(f"No data for {report.month}: no priced GPU usage in the database.")
    else:
        heading, grid = fmt.sections(report)[0]
        lines += [heading, *_table(grid)]
        if fmt.OVER_NOTE in grid.notes:  # explains the table's OVER_MARK
            lines.append(printable(fmt.OVER_NOTE, None))
        budgets = fmt.budget_grid(report)
        if budgets is not None:
            lines += ["", "Budgets", *_table(budgets)]
        for title, recs in ((f"Savings ({fmt.savings_text(report)}), largest first:",
                             fmt.saving_recs(report)),
                            (f"{fmt.LARGER_UNIT} (extra cost this month, largest first):",
                             fmt.larger_unit_recs(report))):
            if not recs:
                continue
            lines += ["", title]
            for rec in recs[:MAX_SAVINGS]:
                who = printable(fmt.workload_name(report, rec), None)
                lines.append(f"  {fmt.money(abs(rec.saving)):>12}  {who}: {rec.current} -> "
                             f"{rec.proposed} ({rec.confidence} confidence)")
            if len(recs) > MAX_SAVINGS:
                lines.append(f"  … and {len(recs) - MAX_SAVINGS} more in the report files")
    if written:
        lines += ["", "Wrote:", *(f"  {printable(p, None)}" for p in written)]
    return "\n".join(lines) + "\n"
