"""Each signal keeps as columns the labels metering/sql/facts.sql reads from it, and no more
(SignalSpec.cols, and the pod labels' MAP where pod_labels): every kept column is built per
series and chunk, so one the SQL never reads is CPU for nothing. Without any one of them the
fact statements must fail to bind."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest

from metering.db import connect
from metering.facts import empty_signal, write_facts
from metering.signals import SIGNALS

START, END = datetime(2026, 10, 5), datetime(2026, 10, 5, 1)


def _signals(drop: tuple[str, str] | None = None) -> dict[str, pa.Table]:
    out = {}
    for spec in SIGNALS:
        table = empty_signal(spec)
        if drop is not None and spec.name == drop[0]:
            table = table.drop_columns([drop[1]])
        out[spec.name] = table
    return out


def test_all_columns_bind(tmp_path: Path) -> None:
    con = connect(tmp_path / "m.duckdb")
    write_facts(con, [_signals()], START, END, sample_interval=60)


@pytest.mark.parametrize("drop", [(s.name, c) for s in SIGNALS
                                  for c in (*s.cols, *(("labels",) if s.pod_labels else ()))],
                         ids=lambda d: f"{d[0]}.{d[1]}")
def test_each_kept_column_is_read(drop: tuple[str, str], tmp_path: Path) -> None:
    con = connect(tmp_path / "m.duckdb")
    with pytest.raises(duckdb.BinderException, match=drop[1]):
        write_facts(con, [_signals(drop)], START, END, sample_interval=60)
