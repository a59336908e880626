"""Recorded hourly series read in bulk from VictoriaMetrics' /api/v1/export (JSON lines)
instead of a range query: the store sends the samples it holds and does not evaluate or
serialise a matrix (docs/performance.md, "Recorded hourly series": less store CPU per
GPU-month). Prometheus has no such endpoint and keeps query_range.

Which sample is an hour's fact (the range query's semantics, metering.signals.RECORDED_READ:
`last_over_time(s[1h] offset -3599999ms)` evaluated at each hour start E of the chunk):

- the samples of the series with a timestamp in [E, E+1h) (milliseconds; the window
  (E-1ms, E+1h-1ms] of the range query), wherever in the hour the evaluator stamped them;
- NaN samples are not samples: VictoriaMetrics' staleness markers (what an evaluator writes
  when a series disappears) are skipped by last_over_time, and its text import drops NaN;
- of the rest, the one with the latest timestamp; between samples with the same timestamp
  (two evaluators of an HA pair writing at the same instant) the later one in the store's
  order, which is the order export sends and last_over_time reads;
- its value, at time E, for a series with such a sample; an hour without one has no point.

tests/test_recorded.py checks that the ledger is the same, floats to the last bit, as through
query_range over a real VictoriaMetrics with recorded series written by vmalert.

The answer's format (VictoriaMetrics app/vmselect/prometheus/export.qtpl, checked against
1.79.5, the Debian package): one line per series, `{"metric":{...},"values":[...],
"timestamps":[...]}`; values are Go's shortest decimal ('f', -1), `+Inf`/`-Inf`/`NaN` bare
(not JSON), and a NaN after a line's first value `null` (export.qtpl ExportJSONLine: a
stale marker a live vmalert wrote when a series ended, tests/test_vmnative.py);
timestamps integer milliseconds. A series may come in several lines; they are
joined. Arrow's JSON reader takes the lines into typed columns; an answer it refuses is read
line by line with Python's json, which names the problem. A truncated or garbled answer is a
BadExport (one line), never a partial matrix.
"""

from __future__ import annotations

import enum
import io
import itertools
import json
import operator
import re
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.json as pa_json

from metering.matrix import Labels, Matrix, all_text, marks, series_keys
from metering.signals import HOUR_S

EXPORT_PATH = "/api/v1/export"
HOUR_MS = HOUR_S * 1000


class RecordedRead(enum.StrEnum):
    """How the recorded hourly series are read."""

    # on VictoriaMetrics /api/v1/export/native where its version is one metering.vmnative was
    # verified against, else /api/v1/export; query_range on other stores
    AUTO = "auto"
    QUERY_RANGE = "query_range"  # range queries on every store
    EXPORT = "export"  # /api/v1/export; a store without it is an error
    # /api/v1/export/native (metering.vmnative), as auto does on a version it was verified
    # against; on another, checked against the JSON lines on the run's first read
    NATIVE = "native"


class BadExport(ValueError):
    """The export answer is not VictoriaMetrics' JSON lines: str() says what is wrong."""


def params(selector: str, first: int, last: int) -> list[tuple[str, str]]:
    """The export request for the hours first..last (evaluation hours, unix s): every sample
    in [first, last + 1h), the range query's windows."""
    end_ms = (last + HOUR_S) * 1000 - 1
    return [("match[]", selector), ("start", f"{first:d}"),
            ("end", f"{end_ms // 1000}.{end_ms % 1000:03d}")]


_SCHEMA = pa.schema([("values", pa.list_(pa.float64())),
                     ("timestamps", pa.list_(pa.int64()))])
_PARSE = pa_json.ParseOptions(explicit_schema=_SCHEMA, unexpected_field_behavior="infer")
# VictoriaMetrics' spellings of a value (Go's strconv 'f' format, -1 precision).
_VALUE = re.compile(rb"-?[0-9]+(\.[0-9]+)?([eE][+-]?[0-9]+)?|[+-]Inf|NaN|null")
_SPECIAL = {b"+Inf": float("inf"), b"-Inf": float("-inf"), b"NaN": float("nan"),
            b"null": float("nan")}


def read(body: bytes, first: int, last: int, seen: Labels | None = None) -> Matrix:
    """The hourly points (time E = each hour start first..last) of an export answer, one
    per series and hour as the module docstring defines; series in series_key order.
    `seen`: label maps decoded before (the caller's, e.g. for one chunk, as for
    metering.matrix.read), added to."""
    if not body:
        return Matrix.empty()
    if not body.endswith(b"\n"):
        raise BadExport("the answer does not end with a whole line (truncated?)")
    keys = None
    try:
        metrics, lengths, values, stamps, keys = _scan(body, seen)
    except (pa.ArrowInvalid, _NotArrow, ValueError):
        try:
            metrics, lengths, values, stamps = _arrow(body)
        except (pa.ArrowInvalid, _NotArrow, UnicodeDecodeError):  # Arrow reads bytes as text
            metrics, lengths, values, stamps = _python(body)
    return hourly(metrics, lengths, values, stamps, first, last, keys)


class _NotArrow(Exception):
    """Arrow read the lines, but not as text labels and number lists."""


_COLUMN = pa_csv.ReadOptions(column_names=["x"], use_threads=False)
_AS_FLOAT = pa_csv.ConvertOptions(column_types={"x": pa.float64()}, null_values=[],
                                  strings_can_be_null=False)
_AS_INT = pa_csv.ConvertOptions(column_types={"x": pa.int64()}, null_values=[],
                                strings_can_be_null=False)
_NO_QUOTES = pa_csv.ParseOptions(quote_char=False, escape_char=False)


def _column(rows: bytes, convert: pa_csv.ConvertOptions, n: int) -> np.ndarray:
    """The numbers of `rows` (separated by `,` or newlines) as one typed column; _NotArrow
    unless `n`."""
    if not n:
        return np.zeros(0, np.float64 if convert is _AS_FLOAT else np.int64)
    col = pa_csv.read_csv(io.BytesIO(rows.replace(b",", b"\n") + b"\n"), read_options=_COLUMN,
                          parse_options=_NO_QUOTES, convert_options=convert).column("x")
    if len(col) != n or col.null_count:  # an empty number is an empty row, skipped
        raise _NotArrow
    out: np.ndarray = col.to_numpy()
    return out


_POW13 = 10 ** np.arange(12, -1, -1, dtype=np.int64)


def _stamps(rows: bytes, n: int) -> np.ndarray:
    """The `n` timestamps of `rows` (separated by `,` or newlines). Milliseconds of every
    time from 2001-09-09 to 2286 have 13 digits: where each is 13 digits and a separator,
    numpy reads them from their digits (what Arrow reads them as, no faster); else Arrow."""
    if n and len(rows) == 14 * n - 1:
        cells = np.frombuffer(rows + b",", np.uint8).reshape(n, 14)
        digits = cells[:, :13] - np.uint8(ord("0"))  # a byte that is not a digit wraps past 9
        if (digits < 10).all() and ((cells[:, 13] == ord(",")) | (cells[:, 13] == ord("\n"))
                                    ).all():
            out: np.ndarray = digits.astype(np.int64) @ _POW13
            return out
    return _column(rows, _AS_INT, n)


def _scan(body: bytes, seen: Labels | None = None
          ) -> tuple[list[dict[str, str]], np.ndarray, np.ndarray, np.ndarray, list[str] | None]:
    """VictoriaMetrics' layout exactly (no whitespace; metric, values, timestamps), with no
    Python per line: the lines cut at their markers, found by numpy over the whole answer
    (each line holds each marker once: `},"values":[` and `],"timestamps":[` hold a `"` after
    another character, so cannot lie inside a JSON string, and the number lists hold no `"`);
    the label maps by _label_maps; the numbers by Arrow's CSV reader into typed columns (it
    reads the spellings Python's float reads, to the same value; tests/test_vmexport.py), the
    timestamps by _stamps. Any other layout: _NotArrow (the JSON readers take it)."""
    a = np.frombuffer(body, np.uint8)
    ends = np.flatnonzero(a == ord("\n"))  # the body ends with one (read)
    starts = np.concatenate(([0], ends[:-1] + 1))
    mid = marks(a, np.flatnonzero(a == ord("}")), _MID)
    tail = marks(a, np.flatnonzero(a == ord("]")), _TAIL)
    n = len(ends)
    if len(marks(a, starts, _HEAD)) != n or len(mid) != n or len(tail) != n \
            or not ((starts < mid) & (mid < tail) & (tail < ends - 2)).all() \
            or not ((a[ends - 2] == ord("]")) & (a[ends - 1] == ord("}"))).all() \
            or not (mid[:-1] < starts[1:]).all() or not (tail[:-1] < starts[1:]).all():
        raise _NotArrow
    first = starts + len(_HEAD)
    if not (a[first] == ord("{")).all():  # each label map an object (matrix.all_text)
        raise _NotArrow
    v_at, v_end = mid + len(_MID), tail
    t_at, t_end = tail + len(_TAIL), ends - 2
    commas = np.flatnonzero(a == ord(","))
    lengths = np.where(v_end > v_at, np.searchsorted(commas, v_end)
                       - np.searchsorted(commas, v_at) + 1, 0)
    if not np.array_equal(lengths, np.where(t_end > t_at, np.searchsorted(commas, t_end)
                                            - np.searchsorted(commas, t_at) + 1, 0)):
        raise _NotArrow
    labels, keys = _label_maps(body, a, first, mid + 1, {} if seen is None else seen)
    total = int(lengths.sum())
    # An empty list gives an empty row, which the reader skips. `null` is no number's text.
    values = b"\n".join(map(body.__getitem__, map(slice, v_at.tolist(), v_end.tolist())))
    stamps = b"\n".join(map(body.__getitem__, map(slice, t_at.tolist(), t_end.tolist())))
    return (labels, lengths.astype(np.int64),
            _column(values.replace(b"null", b"NaN"), _AS_FLOAT, total),
            _stamps(stamps, total), keys)


def _label_maps(body: bytes, a: np.ndarray, at: np.ndarray, end: np.ndarray, seen: Labels
                ) -> tuple[list[dict[str, str]], list[str] | None]:
    """Each line's labels (body[at[i]:end[i]], `{...}`) without __name__, and their
    series_keys where known: by one json call, checked over their text (matrix.all_text).
    Where every line begins with one `{"__name__":"<name>",` (an export of one recorded
    series), the text after it is the series' identity: its labels and key are taken from
    `seen` or added to it, so the family's other signals (the same series under another name)
    decode no label map twice. That text never begins with `{`, so it is never a range
    query's label map (metering.matrix.read's key in a shared `seen`). _NotArrow unless each
    is an object of text values."""
    head = body[at[0]:end[0]]
    cut = head.find(b'",', len(_NAME)) + 2 if head.startswith(_NAME) else 1
    if cut == 1 or b"\\" in head[:cut] or len(marks(a, at, head[:cut])) != len(at) \
            or not (a[at + cut] == ord('"')).all() or not _one_name(head[:cut - 1] + b"}"):
        cut = 0  # no name, or not one name: the whole map, no cache
    texts = list(map(body.__getitem__, map(slice, (at + cut).tolist(), end.tolist())))
    new = [t for t in dict.fromkeys(texts) if t not in seen] if cut else texts
    joined = (b"{" if cut else b"") + (b",{" if cut else b",").join(new)
    decoded = json.loads(b"[" + joined + b"]") if new else []
    if len(decoded) != len(new) or set(map(type, decoded)) - {dict} or (
            new and not all_text(joined, decoded)
            and not all(isinstance(v, str) for m in decoded for v in m.values())):
        raise _NotArrow
    if not cut:
        for m in decoded:  # our own maps: hourly keeps them as the series' labels
            m.pop("__name__", None)
        return decoded, None
    keys = series_keys(decoded)
    seen.update(zip(new, zip(decoded, keys, strict=True), strict=True))
    if len(new) == len(texts):  # each map new and once: as decoded
        return decoded, keys
    got = list(map(seen.__getitem__, texts))
    return [m for m, _ in got], [k for _, k in got]


def _one_name(text: bytes) -> bool:
    """Whether `text` is JSON `{"__name__": <text>}`: the part of every line _label_maps
    does not give json (what json would refuse there is refused)."""
    try:
        name = json.loads(text)
    except ValueError:
        return False
    return isinstance(name, dict) and list(name) == ["__name__"] \
        and isinstance(name["__name__"], str)


def _arrow(body: bytes) -> tuple[list[dict[str, str]], np.ndarray, np.ndarray, np.ndarray]:
    table = pa_json.read_json(io.BytesIO(body),
                              read_options=pa_json.ReadOptions(use_threads=False,
                                                               block_size=len(body) + 1),
                              parse_options=_PARSE)
    if set(table.column_names) != {"metric", "values", "timestamps"}:
        raise _NotArrow
    metric = table.column("metric")
    if not pa.types.is_struct(metric.type) or metric.null_count or \
            not all(pa.types.is_string(f.type) for f in metric.type):
        raise _NotArrow
    vals = table.column("values").combine_chunks()
    stamps = table.column("timestamps").combine_chunks()
    if vals.null_count or stamps.null_count:
        raise _NotArrow
    lengths = vals.value_lengths().to_numpy(zero_copy_only=False)
    if not np.array_equal(lengths, stamps.value_lengths().to_numpy(zero_copy_only=False)):
        raise BadExport("a series has not as many timestamps as values")
    flat_v = vals.flatten()
    flat_t = stamps.flatten()
    if flat_v.null_count or flat_t.null_count:
        raise _NotArrow
    labels = [{k: v for k, v in m.items() if v is not None and k != "__name__"}
              for m in metric.to_pylist()]
    return (labels, lengths.astype(np.int64), flat_v.to_numpy(zero_copy_only=False),
            flat_t.to_numpy(zero_copy_only=False))


_HEAD = b'{"metric":'
_NAME = b'{"__name__":"'
_MID = b'},"values":['
_TAIL = b'],"timestamps":['


def _python(body: bytes) -> tuple[list[dict[str, str]], np.ndarray, np.ndarray, np.ndarray]:
    """Line by line (an answer Arrow refused: a bare +Inf, -Inf or NaN, or not an export)."""
    labels: list[dict[str, str]] = []
    lengths: list[int] = []
    values: list[float] = []
    stamps: list[int] = []
    for n, line in enumerate(body.split(b"\n")[:-1], 1):
        # `},"values":[` cannot be inside a JSON string (its `"` would be escaped).
        mid, tail = line.find(_MID), line.rfind(_TAIL)
        if not line.startswith(_HEAD) or mid < 0 or tail < mid or not line.endswith(b"]}"):
            raise BadExport(f"line {n} is not a series of VictoriaMetrics' export "
                            f"({_shown(line)})")
        try:
            metric: Any = json.loads(line[len(_HEAD):mid + 1])
            ts: Any = json.loads(line[tail + len(_TAIL) - 1:-1])
        except ValueError:
            raise BadExport(f"line {n}: not JSON ({_shown(line)})") from None
        if not isinstance(metric, dict) or not all(isinstance(v, str) for v in metric.values()):
            raise BadExport(f"line {n}: labels are not text ({_shown(line)})")
        if not isinstance(ts, list) or not all(type(t) is int for t in ts):
            raise BadExport(f"line {n}: timestamps are not integers ({_shown(line)})")
        texts = line[mid + len(_MID):tail].split(b",") if tail > mid + len(_MID) else []
        if len(texts) != len(ts):
            raise BadExport(f"line {n}: not as many timestamps as values")
        for text in texts:
            if not _VALUE.fullmatch(text):
                raise BadExport(f"line {n}: {_shown(text)} is not a number")
            values.append(_SPECIAL[text] if text in _SPECIAL else float(text))
        labels.append(metric)
        lengths.append(len(ts))
        stamps += ts
    return (labels, np.array(lengths, np.int64), np.array(values, np.float64),
            np.array(stamps, np.int64))


def _shown(text: bytes) -> str:
    return repr(text[:60].decode("utf-8", "replace")) + ("..." if len(text) > 60 else "")


def hourly(lines: list[dict[str, str]], lengths: np.ndarray, values: np.ndarray,
           stamps: np.ndarray, first: int, last: int, keys: list[str] | None = None
           ) -> Matrix:
    """One point per series and hour E: the last non-NaN sample of [E, E+1h). `lines`: the
    labels of each line, `lengths` its samples, `values`/`stamps` theirs, line after line;
    `keys`: each line's series_key where the caller has it (metering.vmnative)."""
    if keys is None:
        keys = series_keys(lines)
    index = dict.fromkeys(keys, 0)
    if len(index) == len(lines):  # one line per series: VictoriaMetrics' usual answer
        line_sid = np.arange(len(lines), dtype=np.int64)
        labels = lines
        if any(map(operator.contains, lines, itertools.repeat("__name__"))):
            labels = [{k: v for k, v in m.items() if k != "__name__"} for m in lines]
    else:
        index.clear()
        labels = []
        line_sid = np.empty(len(lines), np.int64)
        for i, (key, metric) in enumerate(zip(keys, lines, strict=True)):
            if key not in index:
                index[key] = len(labels)
                labels.append({k: v for k, v in metric.items() if k != "__name__"})
            line_sid[i] = index[key]
    sid = np.repeat(line_sid, lengths)
    lo, hi = first * 1000, (last + HOUR_S) * 1000
    keep = np.flatnonzero((stamps >= lo) & (stamps < hi) & ~np.isnan(values))
    if len(labels) == len(lines) and _in_time_order(stamps, lengths):
        order = keep  # one line per series, in time order (VictoriaMetrics' usual answer)
    else:  # by series, then time, then answer order (lexsort is stable)
        order = keep[np.lexsort((stamps[keep], sid[keep]))]
    # Each series' points now lie together in time order: the last of each series-hour is
    # the one before the series-hour changes.
    hour = (stamps[order] - lo) // HOUR_MS
    s = sid[order]
    last_of = np.ones(len(order), bool)
    last_of[:-1] = (s[1:] != s[:-1]) | (hour[1:] != hour[:-1])
    pick, s, hour = order[last_of], s[last_of], hour[last_of]
    # Series in series_key order, those without a point left out (as a range query does):
    # each series' run of points moved whole.
    keys = list(index)
    counts = np.bincount(s, minlength=len(keys))
    ranked = sorted(np.flatnonzero(counts).tolist(), key=keys.__getitem__)
    cnt = counts[ranked]
    at = np.repeat(np.cumsum(counts)[ranked] - cnt - (np.cumsum(cnt) - cnt), cnt)
    moved = np.arange(len(s)) + at
    return Matrix([labels[i] for i in ranked], [keys[i] for i in ranked],
                  np.repeat(np.arange(len(ranked), dtype=np.int64), cnt),
                  (first + hour[moved] * HOUR_S).astype(np.float64), values[pick[moved]])


def _in_time_order(stamps: np.ndarray, lengths: np.ndarray) -> bool:
    """Whether each line's samples are in time order (a decrease only where a line starts)."""
    down = np.flatnonzero(np.diff(stamps) < 0) + 1
    return bool(np.isin(down, np.cumsum(lengths)).all())
