"""CSV output: the tidy table as RFC 4180 text (UTF-8, `\\n` line ends, minimal quoting).

Values are written as they are, so a label with commas, quotes or newlines reads back
unchanged with any CSV reader; text starting with `=`, `+`, `-`, `@`, a tab or a carriage
return gets a leading `'` so spreadsheets do not run it as a formula. Numbers have a fixed
number of decimals so two runs over the same data give the same bytes.
"""

from __future__ import annotations

import csv
import io
from decimal import Decimal

from metering.report import tidy
from metering.report.model import Report

# A cell starting with one of these is a formula to spreadsheet applications (OWASP "CSV
# injection"): such text values get a leading single quote, which shows the value as text.
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def neutralise(text: str) -> str:
    """`text` as a spreadsheet shows it as text, never runs it: the one rule every CSV the
    report writes (chargeback, FOCUS) applies to its text cells."""
    return "'" + text if text.startswith(_FORMULA_START) else text


def _text(value: tidy.Value) -> str:
    if isinstance(value, str):
        return neutralise(value)
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Decimal):
        return f"{value:.6f}"
    return str(value)


def render_csv(report: Report) -> bytes:
    buf = io.StringIO(newline="")
    writer = csv.writer(buf, lineterminator="\n", quoting=csv.QUOTE_MINIMAL)
    names = [name for name, _ in tidy.columns(report)]
    writer.writerow(names)
    for row in tidy.rows(report):
        writer.writerow(_text(row[name]) for name in names)
    return buf.getvalue().encode("utf-8")
