"""Each signal keeps as columns the labels metering/sql/facts.sql reads from it, and no more
(SignalSpec.cols, and the pod labels' MAP where pod_labels): every kept column is built per
series and chunk, so one the SQL never reads is CPU for nothing. Without any one of them the
fact statements must fail to bind."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pytest

from metering.db import connect
from metering.facts import _shares_keys, build_signal, empty_signal, write_facts
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


def _alloc(series: list[dict[str, str]], sid: list[int]) -> pa.Table:
    spec = next(s for s in SIGNALS if s.name == "alloc_count")
    hours = np.full(len(sid), int(START.replace(tzinfo=UTC).timestamp()), np.int64)
    return build_signal(spec, series, np.array(sid, np.int64), hours,
                        np.ones(len(sid), np.float64))


_POD = {"namespace": "ml", "pod": "train-0", "container": "main", "uuid": "GPU-a",
        "mig_uuid": "", "node": "n1"}


def test_series_ids_are_stored_once_per_series() -> None:
    """A signal's series and key ids are dictionaries over its series, as its labels are: the
    points carry a 4-byte index, not two 8-byte copies (the 80,000-GPU chunk peaked 0.4 GiB
    lower, docs/performance.md)."""
    table = _alloc([_POD, {**_POD, "node": "n2"}], [0, 1, 1, 0])
    for col in ("sh", "key", "series"):
        assert pa.types.is_dictionary(table.column(col).type), col
    assert len(table.column("sh").chunk(0).dictionary) == 2
    # both series name one key (node is not a key label) with different ids
    assert table.column("key").to_pylist()[0] == table.column("key").to_pylist()[1]
    assert table.column("sh").to_pylist()[0] != table.column("sh").to_pylist()[1]


def test_a_key_shares_only_with_series_that_have_rows() -> None:
    """Which signals take the grouping path (facts._shares_keys) counts the series the rows
    use: a second series of a key that has no point in this signal (its entry still in the
    answer's label maps) does not make the key shared."""
    two = [_POD, {**_POD, "node": "n2"}]
    assert _shares_keys(_alloc(two, [0, 1]))
    assert not _shares_keys(_alloc(two, [0, 0]))
    assert not _shares_keys(_alloc([_POD, {**_POD, "pod": "train-1"}], [0, 1]))
    assert not _shares_keys(_alloc(two, []))
