"""Parquet output: the tidy table with typed columns, written by pyarrow with fixed settings.

Everything that could vary between runs is pinned: column types, compression, format version,
page layout, and the key-value metadata (report context only, never the time of the run).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from metering.report import tidy
from metering.report.model import Report

_TYPES: dict[str, Any] = {
    "str": pa.string(),
    "int": pa.int64(),
    "bool": pa.bool_(),
    "float": pa.float64(),
    "money": pa.decimal128(18, 6),
}


def schema(report: Report) -> Any:
    metadata = {
        "gpu_ledger.period": str(report.month),
        "gpu_ledger.cost_model_file": report.cost_model.file,
        "gpu_ledger.cost_model_hash": report.cost_model.hash,
        "gpu_ledger.currency": report.cost_model.currency,
        "gpu_ledger.hours_in_period": str(report.hours_in_period),
        "gpu_ledger.hours_with_data": str(report.hours_with_data),
        "gpu_ledger.missing_hours": ";".join(r.describe() for r in report.missing),
        "gpu_ledger.tool_version": report.tool_version,
        # share of allocated GPU-hours without SM data ('' when nothing was allocated)
        "gpu_ledger.sm_unknown_share": "" if report.sm_unknown_share is None
        else f"{report.sm_unknown_share:.6f}",
    }
    fields = [pa.field(name, _TYPES[kind]) for name, kind in tidy.columns(report)]
    return pa.schema(fields, metadata=metadata)


def render_parquet(report: Report) -> bytes:
    rows = list(tidy.rows(report))
    columns: dict[str, list[Any]] = {}
    for name, kind in tidy.columns(report):
        values: list[Any] = [row[name] for row in rows]
        if kind == "float":  # exact decimals in the model; Parquet readers want doubles
            values = [None if v is None else float(v) for v in values]
        columns[name] = values
    table = pa.table(columns, schema=schema(report))
    sink = pa.BufferOutputStream()
    pq.write_table(
        table,
        sink,
        version="2.6",
        compression="zstd",
        compression_level=3,
        use_dictionary=False,
        write_statistics=True,
        data_page_version="1.0",
        row_group_size=1_000_000,
        store_schema=True,
    )
    return bytes(sink.getvalue().to_pybytes())
