"""The Markdown report: the same facts and tables as the HTML page, without charts.

Values from the data are escaped for a GitHub-flavoured table cell: `|` would end the cell,
a newline would end the row, and `<`, `&`, `*`, `_`, backticks and brackets would turn into
markup. Newlines become `<br>`, the one line break a table cell can hold.
"""

from __future__ import annotations

import re

from metering.report import fmt
from metering.report.model import Report

_SPECIAL = re.compile(r"([\\`*_\[\]|~#])")
_NEWLINE = re.compile(r"\r\n|\r|\n")


def escape(text: str) -> str:
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    text = _SPECIAL.sub(r"\\\1", text)
    return _NEWLINE.sub("<br>", text)


def _table(grid: fmt.Grid) -> list[str]:
    align = ["---:" if grid.numeric(i) else ":---" for i in range(len(grid.heads))]
    out = [
        "| " + " | ".join(escape(h) for h in grid.heads) + " |",
        "| " + " | ".join(align) + " |",
    ]
    for kind, cells in zip(grid.kinds, grid.rows, strict=True):
        text = [escape(c) for c in cells]
        if kind == "total":
            text = [f"**{t}**" if t else t for t in text]
        elif kind:  # idle, down, adjustment
            text[0] = f"*{text[0]}*"
        out.append("| " + " | ".join(text) + " |")
    for note in grid.notes:
        out += ["", escape(note)]
    return out


def render_markdown(report: Report) -> str:
    lines = [f"# GPU chargeback report — {report.month}", ""]
    lines += [f"**{escape(n)}**\n" for n in report.notes]  # before any figure
    lines += [f"- **{name}:** {escape(text)}" for name, text in fmt.facts(report)]
    if report.missing:
        lines += ["", "Hours with no data (UTC, end exclusive):", ""]
        lines += [f"- {escape(r.describe())}" for r in report.missing]
    if not report.has_data:
        lines += [
            "",
            f"**No data for {report.month}:** the database holds no priced GPU usage for "
            "this month.",
        ]
        return "\n".join(lines) + "\n"
    for heading, grid in fmt.sections(report):
        lines += ["", f"## {escape(heading)}", "", *_table(grid)]
    return "\n".join(lines) + "\n"
