"""Test helper: INSERT statements that fill a ledger table by position, every column but
`cluster` and `vendor` (which then take their defaults, 'default' and 'nvidia'): the
single-cluster NVIDIA rows most tests write."""

from __future__ import annotations

from functools import cache

import duckdb

from metering.db import schema_sql


@cache
def _columns(table: str) -> tuple[str, ...]:
    con = duckdb.connect(":memory:")
    con.execute(schema_sql())
    rows = con.execute("SELECT column_name FROM information_schema.columns WHERE table_name = ? "
                       "AND column_name NOT IN ('cluster', 'vendor') ORDER BY ordinal_position",
                       [table]).fetchall()
    con.close()
    return tuple(r[0] for r in rows)


def ins(table: str) -> str:
    """`INSERT INTO table (columns but cluster) ` — follow it with VALUES or SELECT."""
    return f"INSERT INTO {table} ({', '.join(_columns(table))}) "
