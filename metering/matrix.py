"""A range query's answer in columns: per series its labels and identity, per point its series,
time and value. DuckDB's JSON reader parses the answer (C++, no Python object per point); an
answer it cannot take as a well-formed matrix is parsed by Python's json and checked point by
point instead, so an odd answer gives the same errors and drops as before.

Ingest reads hundreds of millions of points a month at fleet size: decoding them into Python
lists and converting them series by series cost more than everything else it does
(docs/performance.md, "Ingest CPU").
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import duckdb
import numpy as np

from metering.facts import series_key


class NotAMatrix(ValueError):
    """The answer is not a matrix of {metric, values}: str() says what was expected."""


@dataclass(frozen=True)
class Matrix:
    """Points i of series sid[i] at time t[i] (unix seconds) with value v[i] (NaN where the
    answer's value is not a number); series in answer order, points in time order."""

    labels: list[dict[str, str]]
    keys: list[str]  # series_key of each series: its identity across answers
    sid: np.ndarray  # int64
    t: np.ndarray  # float64
    v: np.ndarray  # float64

    @staticmethod
    def empty() -> Matrix:
        return Matrix([], [], np.zeros(0, np.int64), np.zeros(0), np.zeros(0))

    def __len__(self) -> int:
        return len(self.labels)


def concat(parts: Sequence[Matrix]) -> Matrix:
    """Answers over disjoint series (node shards): their series one after another."""
    if len(parts) == 1:
        return parts[0]
    labels: list[dict[str, str]] = []
    keys: list[str] = []
    sids: list[np.ndarray] = []
    for p in parts:
        sids.append(p.sid + len(labels))
        labels += p.labels
        keys += p.keys
    if not sids:
        return Matrix.empty()
    return Matrix(labels, keys, np.concatenate(sids), np.concatenate([p.t for p in parts]),
                  np.concatenate([p.v for p in parts]))


def merge(parts: Sequence[Matrix]) -> Matrix:
    """Answers over consecutive time ranges (time pieces, in order): one series per identity,
    its points in time order."""
    index: dict[str, int] = {}
    labels: list[dict[str, str]] = []
    for p in parts:
        for key, lab in zip(p.keys, p.labels, strict=True):
            if key not in index:
                index[key] = len(labels)
                labels.append(lab)
    if not parts:
        return Matrix.empty()
    sid = np.concatenate([np.array([index[k] for k in p.keys], np.int64)[p.sid]
                          if len(p.sid) else np.zeros(0, np.int64) for p in parts])
    t = np.concatenate([p.t for p in parts])
    v = np.concatenate([p.v for p in parts])
    order = np.lexsort((np.arange(len(sid)), sid))  # by series, then piece order (time)
    return Matrix(labels, list(index), sid[order], t[order], v[order])


# --- Python's json: any answer -------------------------------------------------------------


def from_result(result: list[Any]) -> Matrix:
    """The matrix of a decoded answer's data.result; NotAMatrix if an entry is not
    {metric: {...}, values: [...]}. A point whose value is not a number gets NaN, a point
    without a time is skipped."""
    labels: list[dict[str, str]] = []
    sids: list[np.ndarray] = []
    tss: list[np.ndarray] = []
    vals: list[np.ndarray] = []
    for r in result:
        metric = r.get("metric") if isinstance(r, dict) else None
        points = r.get("values") if isinstance(r, dict) else None
        if not isinstance(metric, dict) or not isinstance(points, list):
            raise NotAMatrix("a matrix of {metric, values}")
        i = len(labels)
        labels.append({str(k): str(v) for k, v in metric.items()})
        t, v = _series_points(points)
        sids.append(np.full(len(t), i, np.int64))
        tss.append(t)
        vals.append(v)
    if not labels:
        return Matrix.empty()
    return Matrix(labels, [series_key(m) for m in labels], np.concatenate(sids),
                  np.concatenate(tss), np.concatenate(vals))


def _series_points(points: list[Any]) -> tuple[np.ndarray, np.ndarray]:
    """(time, value) arrays of one series' points. numpy parses the whole series at once
    (null becomes NaN); a malformed point sends the series through the point-by-point path,
    where a value that is not a number becomes NaN and a point without a time is skipped."""
    try:
        return (np.array([p[0] for p in points], np.float64),
                np.array([p[1] for p in points], np.float64))
    except (TypeError, ValueError, IndexError, KeyError):
        ts: list[float] = []
        values: list[float] = []
        for p in points:
            try:
                t = float(p[0])
            except (TypeError, ValueError, IndexError, KeyError):
                continue
            try:
                v = float(p[1])
            except (TypeError, ValueError, IndexError, KeyError):
                v = math.nan
            ts.append(t)
            values.append(v)
        return np.array(ts, np.float64), np.array(values, np.float64)


# --- DuckDB's JSON reader: well-formed matrices -------------------------------------------

_SHAPE = ("{status: 'VARCHAR', data: 'STRUCT(resultType VARCHAR, result STRUCT(metric "
          "MAP(VARCHAR, VARCHAR), \"values\" VARCHAR[][])[])'}")
_READ = ("CREATE OR REPLACE TEMP TABLE doc AS SELECT status, data.resultType AS kind, "
         "data.result AS result FROM "
         f"read_json(?, columns = {_SHAPE}, format = 'unstructured', "
         "maximum_object_size = MAX_SIZE)")
_ANSWER = ("CREATE OR REPLACE TEMP TABLE answer AS SELECT unnest(result) AS r, "
           "generate_subscripts(result, 1) - 1 AS sid FROM doc")
# Answers of any other shape (not one success document holding a matrix, an entry without
# metric or values, a point without two elements or a numeric time, a value neither a number
# nor null) go to Python's json, which says what is wrong or drops exactly what it drops.
_ODD = """
SELECT (SELECT count(*) <> 1 OR count(*) FILTER (WHERE status = 'success' AND kind = 'matrix'
                                                AND result IS NOT NULL) <> 1 FROM doc)::INT
       + (SELECT count(*) FROM answer WHERE r.metric IS NULL OR r."values" IS NULL)
       + (SELECT count(*) FROM (SELECT unnest(r."values") AS p FROM answer)
          WHERE len(p) <> 2 OR TRY_CAST(p[1] AS DOUBLE) IS NULL
             OR (p[2] IS NOT NULL AND TRY_CAST(p[2] AS DOUBLE) IS NULL))
"""
_SERIES = """
SELECT map_keys(r.metric), map_values(r.metric),
       array_to_string(list_transform(list_sort(list_filter(map_entries(r.metric),
           lambda e: e.key <> '__name__')), lambda e: e.key || '=' || e.value), chr(31))
FROM answer ORDER BY sid
"""
_POINTS = """
SELECT sid, CAST(p[1] AS DOUBLE) AS t, coalesce(TRY_CAST(p[2] AS DOUBLE), 'NaN') AS v
FROM (SELECT sid, unnest(r."values") AS p FROM answer)
"""


class MatrixReader:
    """Parses range-query answers with DuckDB (one in-memory connection, one thread, under
    the metering memory cap)."""

    def __init__(self, config: dict[str, str | bool | int | float | list[str]]) -> None:
        self._config = {**config, "threads": 1}
        self._con: duckdb.DuckDBPyConnection | None = None

    def read(self, body: bytes) -> Matrix | None:
        """The matrix of a well-formed success answer; None for any other answer (decode it
        with json and from_result, which name the problem)."""
        if self._con is None:
            self._con = duckdb.connect(":memory:", config=self._config)
        con = self._con
        fd, path = tempfile.mkstemp(prefix="gpu-ledger-answer-", suffix=".json")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(body)
            try:
                con.execute(_READ.replace("MAX_SIZE", str(max(len(body) + 1, 1 << 20))), [path])
                con.execute(_ANSWER)
                odd = con.execute(_ODD).fetchall()[0][0]
            except duckdb.OutOfMemoryException:
                raise
            except duckdb.Error:
                return None  # not of the expected shape at all
            if odd:
                return None
            rows = con.execute(_SERIES).fetchall()
            points = con.execute(_POINTS).fetchnumpy()
        finally:
            os.unlink(path)
            if self._con is not None:
                self._con.execute("DROP TABLE IF EXISTS answer; DROP TABLE IF EXISTS doc")
        if not rows:
            return Matrix.empty()
        return Matrix([dict(zip(k, v, strict=True)) for k, v, _ in rows], [s for _, _, s in rows],
                      np.asarray(points["sid"], np.int64), np.asarray(points["t"], np.float64),
                      np.asarray(points["v"], np.float64))

    def close(self) -> None:
        if self._con is not None:
            self._con.close()
            self._con = None
