"""A ledger metered from an OpenMetrics history file, as the vendor tests build theirs."""

from __future__ import annotations

from pathlib import Path

import duckdb

from metering.db import connect
from metering.ingest import ingest
from metering.openmetrics_source import OpenMetricsSource
from metering.period import Period
from metering.selector import DEFAULT_SELECTOR, Selector


def ingested(om: Path, period: Period, db: Path, selector: Selector = DEFAULT_SELECTOR
             ) -> duckdb.DuckDBPyConnection:
    """A new ledger at `db` holding `period` metered from `om` (the default selector unless
    given), open; the caller closes it."""
    src = OpenMetricsSource(str(om), period, selector)
    con = connect(db)
    try:
        ingest(con, src, period)
    finally:
        src.close()
    return con
