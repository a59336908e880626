"""Test helper: INSERT statements that fill a ledger table by position, every column but
`cluster` (which then takes its default, 'default') and columns added after it (their
defaults too): the single-cluster rows most tests write."""

from __future__ import annotations

from functools import cache

import duckdb

from metering.db import schema_sql


@cache
def _columns(table: str) -> tuple[str, ...]:
    con = duckdb.connect(":memory:")
    con.execute(schema_sql())
    rows = con.execute("SELECT column_name FROM information_schema.columns WHERE table_name = $t "
                       "AND ordinal_position < (SELECT ordinal_position FROM information_schema."
                       "columns WHERE table_name = $t AND column_name = 'cluster') "
                       "ORDER BY ordinal_position", {"t": table}).fetchall()
    con.close()
    return tuple(r[0] for r in rows)


def ins(table: str) -> str:
    """`INSERT INTO table (columns but cluster) ` — follow it with VALUES or SELECT."""
    return f"INSERT INTO {table} ({', '.join(_columns(table))}) "
