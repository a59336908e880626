"""A range query's answer in columns: per series its labels and identity, per point its series,
time and value. A scanner reads the answer in the layout stores write (Arrow parses the
points: no Python object per point); an answer it cannot take as a well-formed matrix is
parsed by Python's json and checked point by point instead, so an odd answer gives the same
errors and drops as before.

Ingest reads hundreds of millions of points a month at fleet size: decoding them into Python
lists and converting them series by series cost more than everything else it does
(docs/performance.md, "Ingest CPU").
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv

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


# --- the scanner: well-formed matrices ---------------------------------------------------
# Stores write a matrix answer in one canonical layout (no whitespace; each entry "metric"
# then "values"; values as [time,"value"] pairs). The scanner takes exactly that layout: the
# envelope key by key and each entry's labels by json, each entry's points as the text up to
# its closing "]}", and every point by Arrow's CSV parser (C++, no Python object per point),
# which must find a JSON number and a quoted value spelling that Python's float and Arrow
# read alike. Anything else is left to the json path, so an odd answer gives the same errors
# and drops whichever decoder would have run.

_DECODER = json.JSONDecoder()
# Per point (RE2, in Arrow): the time a JSON number; the value a quoted spelling that Python's
# float and Arrow's cast read alike.
_TIME = r"^-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?$"
_VALUE = r'^"(?:[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[+-]?Inf|NaN)"$'
_CSV_READ = pa_csv.ReadOptions(column_names=["t", "v"])
_CSV_PARSE = pa_csv.ParseOptions(quote_char=False)
_CSV_CONVERT = pa_csv.ConvertOptions(
    column_types={"t": pa.string(), "v": pa.string()}, null_values=[],
    strings_can_be_null=False, quoted_strings_can_be_null=False)


class _Odd(Exception):
    """Not the canonical layout: the json path decodes the answer."""


def read(body: bytes) -> Matrix | None:
    """The matrix of a well-formed success answer in the canonical layout; None for any
    other answer (decode it with json and from_result, which name the problem)."""
    try:
        text = body.decode("utf-8")
        entries: list[tuple[dict[str, str], str]] = []  # (labels, points text) per series

        def result(pos: int) -> tuple[object, int]:
            if text[pos] != "[":
                raise _Odd
            pos += 1
            if text[pos] == "]":
                return None, pos + 1
            while True:  # {"metric":{...},"values":[...]}
                if not text.startswith('{"metric":', pos):
                    raise _Odd
                metric, pos = _DECODER.raw_decode(text, pos + 10)
                if not text.startswith(',"values":[', pos) or not isinstance(metric, dict) \
                        or not all(isinstance(v, str) for v in metric.values()):
                    raise _Odd  # json's path turns label values that are not text into text
                # The array ends at the first "]}": a point's "]" is followed by "," or "]",
                # and a "]}" inside a value is refused with the value (_points).
                end = text.find("]}", pos + 11)
                if end < 0:
                    raise _Odd
                entries.append((metric, text[pos + 11:end]))
                pos = end + 2
                if text[pos] == "]":
                    return None, pos + 1
                if text[pos] != ",":
                    raise _Odd
                pos += 1

        def data(pos: int) -> tuple[object, int]:
            return _object(text, pos, {"result": result})

        top, end = _object(text, 0, {"data": data})
        if text[end:].strip() or top.get("status") != "success":
            raise _Odd
        inner = top.get("data")
        if not isinstance(inner, dict) or inner.get("resultType") != "matrix" \
                or "result" not in inner:
            raise _Odd
        labels = [m for m, _ in entries]
        counts = np.array([pts.count("[") for _, pts in entries], np.int64)
        t, v = _points([pts for _, pts in entries if pts], int(counts.sum()))
    except (_Odd, IndexError, ValueError, UnicodeDecodeError, pa.ArrowInvalid):
        return None
    if not entries:
        return Matrix.empty()
    return Matrix(labels, [series_key(m) for m in labels],
                  np.repeat(np.arange(len(entries), dtype=np.int64), counts), t, v)


def _object(text: str, pos: int, fields: dict[str, Callable[[int], tuple[object, int]]]
            ) -> tuple[dict[str, object], int]:
    """The JSON object at `pos` (no whitespace) and the position after it: each key's value
    read by its entry in `fields`, or by json; a repeated key is odd (json keeps the last)."""
    if text[pos] != "{":
        raise _Odd
    pos += 1
    out: dict[str, object] = {}
    if text[pos] == "}":
        return out, pos + 1
    while True:
        if text[pos] != '"':
            raise _Odd
        key, pos = _DECODER.raw_decode(text, pos)
        if text[pos] != ":" or key in out:
            raise _Odd
        read_value = fields.get(key)
        value, pos = read_value(pos + 1) if read_value else _DECODER.raw_decode(text, pos + 1)
        out[key] = value
        if text[pos] == "}":
            return out, pos + 1
        if text[pos] != ",":
            raise _Odd
        pos += 1


def _points(texts: list[str], expected: int) -> tuple[np.ndarray, np.ndarray]:
    """Times and values of `[t,"v"],[t,"v"]...` texts, in order, as two float64 arrays;
    _Odd unless every point is such a pair."""
    if not texts:
        return np.zeros(0), np.zeros(0)
    csv = ",".join(texts)[1:-1].replace("],[", "\n").encode()
    table = pa_csv.read_csv(io.BytesIO(csv), read_options=_CSV_READ,
                            parse_options=_CSV_PARSE, convert_options=_CSV_CONVERT)
    t, v = table.column("t"), table.column("v")
    if table.num_rows != expected or not (pc.all(pc.match_substring_regex(t, _TIME)).as_py()
                                          and pc.all(pc.match_substring_regex(v, _VALUE)
                                                     ).as_py()):
        raise _Odd
    v = pc.utf8_slice_codeunits(v, 1, -1)  # the quotes
    return (pc.cast(t, pa.float64()).to_numpy(), pc.cast(v, pa.float64()).to_numpy())
