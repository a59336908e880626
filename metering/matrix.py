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
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv

from metering.signals import series_key


class NotAMatrix(ValueError):
    """The answer is not a matrix of {metric, values}: str() says what was expected."""


@dataclass(frozen=True)
class Matrix:
    """Points i of series sid[i] at time t[i] (unix seconds) with value v[i] (NaN where the
    answer's value is not a number); series in answer order, points in time order."""

    labels: list[dict[str, str]]  # without __name__: the query names the signal
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
    # By series, then piece order (time): a stable sort, which merges the pieces' runs of
    # ascending series in linear time.
    order = np.argsort(sid, kind="stable")
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
        labels.append({str(k): str(v) for k, v in metric.items() if k != "__name__"})
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
# then "values"; values as [time,"value"] pairs). The scanner takes exactly that layout, with
# no Python per series or per point: the envelope key by key; the entries by two markers,
# `},"values":[` (a label map's end) and `]},{"metric":` (an entry's end), found by numpy over
# the whole answer (a marker holds a `"` after another character, so it cannot be inside a
# JSON string, where every `"` is escaped); every entry's label map by one json call over all
# of them, and their series keys once per label-name order, or by replacements over their text
# where nearly each map has its own order (_keys_of); every point by
# Arrow's float parser: cut at its quotes where every point is `[t,"v"]` (_cut, below), else
# by Arrow's CSV reader (_rows: a quoted time, a bare value). For _rows the entries' points
# texts are cut out and joined, and one byte translation makes each point a CSV row:
# `:[[t,"v"],[t,"v"]]` -> `X,,t,"v"` `,,t,"v"` (`:`->X marks an entry's first point, `[`->`,`,
# `]`->newline). A value stays quoted, so nothing inside it can make a row or a column; a row
# of another shape fails the parse. Arrow's float parser reads a subset of the spellings
# Python's float reads, to the same value (tests/test_matrix.py); what it cannot read fails the
# parse, and only then is the answer checked, by the json path, which names its problem or
# drops the odd values. So which decoder ran never shows in the facts.

_DECODER = json.JSONDecoder()
_METRIC = b'{"metric":'
_VALUES = b'},"values":['  # a label map's end; its entry's points follow
_NEXT = b']},{"metric":'  # the end of an entry's points and the start of the next entry
_ROWS = bytes.maketrans(b":[]", b"X,\n")
_CSV_READ = pa_csv.ReadOptions(column_names=["first", "_", "t", "v"], use_threads=False)
_CSV_PARSE = pa_csv.ParseOptions(quote_char='"', double_quote=False, escape_char=False)
_CSV_CONVERT = pa_csv.ConvertOptions(
    column_types={"first": pa.bool_(), "t": pa.float64(), "v": pa.float64()},
    include_columns=["first", "t", "v"], true_values=["X"], false_values=[""],
    null_values=[], strings_can_be_null=False, quoted_strings_can_be_null=False)


class _Odd(Exception):
    """Not the canonical layout: the json path decodes the answer."""


# A label map's JSON text -> (labels, series_key): a series comes back in every signal of its
# family (count, sum, last-sample time), so its labels are decoded once per chunk.
Labels = dict[bytes, tuple[dict[str, str], str]]


@dataclass
class _Entries:
    """Where the result array's entries lie in the answer: label map i is
    body[metric[i]:metric_end[i]], its points body[points[i]:points_end[i]] (`:[...]`)."""

    metric: np.ndarray
    metric_end: np.ndarray
    points: np.ndarray
    points_end: np.ndarray


def read(body: bytes, seen: Labels | None = None) -> Matrix | None:
    """The matrix of a well-formed success answer in the canonical layout; None for any
    other answer (decode it with json and from_result, which name the problem). `seen`:
    label maps decoded before (the caller's, e.g. for one chunk), added to."""
    try:
        if not body.isascii():
            body.decode("utf-8")  # json would refuse it
        # One character per byte: positions in the text are positions in the body. The
        # envelope's keys and the values read (status, resultType) are ASCII.
        text = body.decode("latin-1")
        found: list[_Entries] = []

        def result(pos: int) -> tuple[object, int]:
            entries, end = _entries(body, pos)
            found.append(entries)
            return None, end

        def data(pos: int) -> tuple[object, int]:
            return _object(text, pos, {"result": result})

        top, end = _object(text, 0, {"data": data})
        if text[end:].strip():
            raise _Odd
        if top.get("status") != "success" or len(found) != 1:
            raise _Odd
        inner = top.get("data")
        if not isinstance(inner, dict) or inner.get("resultType") != "matrix" \
                or "result" not in inner:
            raise _Odd
        entries = found[0]
        if not len(entries.metric):
            return Matrix.empty()
        labels, keys = _labels(body, entries, {} if seen is None else seen)
        sid, t, v = _points(body, entries)
    except (_Odd, IndexError, ValueError, UnicodeDecodeError, pa.ArrowInvalid):
        return None
    return Matrix(labels, keys, sid, t, v)


def marks(a: np.ndarray, at: np.ndarray, mark: bytes) -> np.ndarray:
    """The positions in `at` where `mark` starts in the answer's bytes `a`."""
    at = at[at + len(mark) <= len(a)]
    window = a[at[:, None] + np.arange(len(mark))]
    found: np.ndarray = at[(window == np.frombuffer(mark, np.uint8)).all(axis=1)]
    return found


def _entries(body: bytes, pos: int) -> tuple[_Entries, int]:
    """The entries of the result array at `pos` and the position after it; _Odd unless they
    lie as {"metric":{...},"values":[...]} one after another."""
    if body[pos:pos + 2] == b"[]":
        none = np.zeros(0, np.int64)
        return _Entries(none, none, none, none), pos + 2
    if not body.startswith(b"[" + _METRIC, pos):
        raise _Odd
    a = np.frombuffer(body, np.uint8)
    braces = np.flatnonzero(a == ord("}"))
    braces = braces[braces > pos]
    values = marks(a, braces, _VALUES)
    nexts = marks(a, braces - 1, _NEXT)
    n = len(values)
    # The last entry's points end at the first `]}` (a `]}` inside a value ends them early;
    # then what follows is not the envelope's end, or the points fail the parse).
    last = body.find(b"]}", int(values[-1]) + len(_VALUES)) if n else -1
    if n == 0 or len(nexts) != n - 1 or last < 0 or body[last + 2:last + 3] != b"]" or \
            not (values[:-1] < nexts).all() or not (nexts < values[1:]).all() or \
            nexts[-1:].max(initial=-1) > last:
        raise _Odd
    metric = np.concatenate(([pos + 1 + len(_METRIC)], nexts + len(_NEXT)))
    if not (a[metric] == ord("{")).all():  # a label map that is not an object
        raise _Odd
    points_end = np.append(nexts + 1, last + 1)
    return _Entries(metric, values + 1, values + len(_VALUES) - 2, points_end), last + 3


def _labels(body: bytes, e: _Entries, seen: Labels) -> tuple[list[dict[str, str]], list[str]]:
    """Labels (without __name__) and series_key of each entry's label map: those not in
    `seen` by one json call over all of them, then added to it. _Odd unless each is an
    object of text values (json's path turns other values into text)."""
    metrics = list(map(body.__getitem__, map(slice, e.metric.tolist(),
                                             e.metric_end.tolist())))
    if _NAME in b"".join(metrics):  # the maps' text, not the whole answer's (1.5 ms of ~25)
        metrics = list(map(_nameless, metrics))
    new = [m for m in dict.fromkeys(metrics) if m not in seen]
    if new:
        joined = b",".join(new)
        decoded = json.loads(b"[" + joined + b"]")
        if len(decoded) != len(new):
            raise _Odd
        plain = all_text(joined, decoded)
        if not plain:
            for m in decoded:
                if not isinstance(m, dict) or not all(isinstance(v, str) for v in m.values()):
                    raise _Odd
        if _NAME in joined:  # a metric name _nameless left (not the first name, escaped)
            for m in decoded:
                m.pop("__name__", None)
        keys = _keys_of(joined, decoded, plain)
        seen.update(zip(new, zip(decoded, keys, strict=True), strict=True))
        if len(new) == len(metrics):  # each map new and once (a fresh answer): as decoded
            return decoded, keys
    got = list(map(seen.__getitem__, metrics))
    return [m for m, _ in got], [k for _, k in got]


# VictoriaMetrics keeps the metric name in max_, min_ and last_over_time's answers (Prometheus
# drops it): a series' label map would then be another text in each of its family's signals,
# decoded again for each instead of once per group (metering.prometheus_source).
_NAME = b'"__name__":'
_FIRST_NAME = b'{"__name__":"'


def _nameless(metric: bytes) -> bytes:
    """A label map's text without its metric name where that is its first name and holds no
    escape (as stores write it); else as it is (json decodes it, the name is dropped then)."""
    if not metric.startswith(_FIRST_NAME):
        return metric
    end = metric.find(b'"', len(_FIRST_NAME))
    if end < 0 or b"\\" in metric[len(_FIRST_NAME):end]:
        return metric
    rest = metric[end + 1:]
    if rest == b"}":
        return b"{}"
    return b"{" + rest[1:] if rest.startswith(b',"') else metric


# With few label-name orders among an answer's new maps (at most one per 8 maps, or 64),
# series_keys (one %-format per map) costs half of cutting the keys from the text; with an
# order per map or so (pod labels that differ from pod to pod) the text costs less
# (docs/performance.md, "Series keys by label order").
_FEW_ORDERS = 64


def _keys_of(joined: bytes, decoded: list[dict[str, str]], plain: bool) -> list[str]:
    """series_key of each decoded map (text values): by label order where the maps have few
    orders, else cut from their text where all_text holds (`plain`)."""
    orders = list(map(tuple, decoded))
    distinct = dict.fromkeys(orders)
    if plain and len(distinct) > max(_FEW_ORDERS, len(decoded) // 8):
        keys = _keys(joined, decoded, distinct)
        if keys is not None:
            return keys
    return series_keys(decoded, orders, distinct)


def _keys(joined: bytes, decoded: list[dict[str, str]],
          distinct: Iterable[tuple[str, ...]] | None = None) -> list[str] | None:
    """series_key of each label map, cut from their joined text at once, where all_text
    holds: no name or value holds a `"` (no backslash), so every `"` opens or closes a string,
    and as many `":` as names (none begins with `:`, so none is `:`). Replacing `":"` (a
    name's end and its value's start) by `=` and then `","` (a value's end and the next
    name's start) by 0x1f, and splitting at `"},{"` (two maps), gives the keys: a string
    that is `,` or `},{` has lost a quote to an earlier replacement by then (tests/
    test_matrix.py tries such texts). Only if each map's names are in order (as stores write
    them; checked once per distinct order) and none is __name__, and no whitespace lies
    between the strings (as many `","` and `"},{"` as labels and maps); None otherwise
    (series_key of each map then)."""
    labels = sum(map(len, decoded))
    orders = set(map(tuple, decoded)) if distinct is None else distinct
    if joined[:2] != b'{"' or joined[-2:] != b'"}' or b"{}" in joined \
            or joined.count(b'","') != labels - len(decoded) \
            or joined.count(b'"},{"') != len(decoded) - 1 or b'"__name__":' in joined \
            or not all(list(o) == sorted(o) for o in orders):
        return None
    keys = joined[2:-2].decode().replace('":"', "=").replace('","', "\x1f").split('"},{"')
    return keys if len(keys) == len(decoded) else None


def series_keys(maps: list[dict[str, str]], orders: list[tuple[str, ...]] | None = None,
                distinct: Iterable[tuple[str, ...]] | None = None) -> list[str]:
    """series_key of each label map (text values), the same text at less cost where many
    maps have the same names in the same order (an answer's series mostly do): the sort and
    the `name=` prefixes done once per such order, each map's key one %-format of its values
    in name order, with no Python call per map. `orders`, `distinct`: each map's label names
    and the distinct ones in first-seen order, where the caller has them."""
    if orders is None:
        orders = list(map(tuple, maps))
    forms = {o: _form(o) for o in (dict.fromkeys(orders) if distinct is None else distinct)}
    if len(forms) == 1:
        return _keyed(maps, *forms[orders[0]])
    # Maps of each order together (one stable sort by order), keyed, and put back in place.
    ids = {o: i for i, o in enumerate(forms)}
    which = np.fromiter(map(ids.__getitem__, orders), np.int64, len(orders))
    by = np.argsort(which, kind="stable")
    bounds = np.searchsorted(which[by], np.arange(len(forms) + 1)).tolist()
    out = np.empty(len(maps), object)
    for i, form in enumerate(forms.values()):
        at = by[bounds[i]:bounds[i + 1]]
        out[at] = _keyed(list(map(maps.__getitem__, at.tolist())), *form)
    keys: list[str] = out.tolist()
    return keys


def _keyed(maps: list[dict[str, str]], text: str, names: tuple[str, ...]) -> list[str]:
    if len(names) < 2:  # itemgetter of one name gives the value, not a tuple
        return list(map(series_key, maps))
    return list(map(text.__mod__, map(itemgetter(*names), maps)))


def _form(order: tuple[str, ...]) -> tuple[str, tuple[str, ...]]:
    """The %-format of series_key for maps with the label names `order` (by name, no
    __name__, `name=value` joined by 0x1f) and the names its values are in."""
    names = tuple(sorted(n for n in order if n != "__name__"))
    return "\x1f".join(f"{n.replace('%', '%%')}=%s" for n in names), names


def all_text(joined: bytes, decoded: list[Any]) -> bool:
    """Whether the label maps (each text begins with `{`: objects) hold only text values,
    told from their text at once where it has no backslash (no `"` inside a name or value):
    each name's closing `"` is followed by `:`, so as many `":` as names (no name or value
    starts with `:`) and each of them followed by `"` means every value is a string. False
    where it cannot tell: each map is checked instead."""
    if b"\\" in joined:
        return False
    pairs = joined.count(b'":')
    return joined.count(b'":"') == pairs == sum(map(len, decoded))


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


def _points(body: bytes, e: _Entries) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Series index, time and value of every point, as arrays: cut at the quotes where every
    point is `[t,"v"]` (_cut), else by Arrow's CSV reader (_rows); _Odd unless one of them
    reads every point, with a finite time."""
    length = e.points_end - e.points
    full = np.flatnonzero(length > 3)  # `:[]`: an entry without points
    if not len(full):
        return np.zeros(0, np.int64), np.zeros(0), np.zeros(0)
    try:
        return _cut(body, e, full)
    except (_Odd, IndexError, ValueError, pa.ArrowInvalid):
        return _rows(body, e, full)


# The points cut at their quotes: each entry's points text without its brackets, `[t,"v"],...`,
# joined by `,` into one text where every point is `[t,"v"]` and points are joined by `,`. Its
# quotes (numpy) give every field: a value lies between a quote pair, a time between the `[`
# after the previous pair's `"],[` and the `,"` before its own. Every separator is checked in
# place (`,"` before each value, `"],[` after each value but the last, `"]` at the end), so
# the text is laid out as json reads it (a time Arrow reads and JSON refuses, `01`, `+1`, is
# read as that number, as _rows reads it). One Arrow string array laid
# over the text without a copy, its elements in turn a separator (null) and a field, is cast
# to float64 by Arrow's parser (the spellings of tests/test_matrix.py): the nulls are not
# parsed, and a field that is not a number (one holding a separator, an empty one) fails.


def _cut(body: bytes, e: _Entries, full: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The points of the entries `full` (those with points) where every point is `[t,"v"]`;
    _Odd (or IndexError, ArrowInvalid) otherwise."""
    start = e.points[full] + 2  # `:[` `[t,"v"],...,[t,"v"]` `]`
    end = e.points_end[full] - 1
    text = b",".join(map(body.__getitem__, map(slice, start.tolist(), end.tolist())))
    a = np.frombuffer(text, np.uint8)
    quotes = np.flatnonzero(a == ord('"'))
    n = len(quotes) // 2
    if not n or len(quotes) != 2 * n or a[0] != ord("[") or text[-2:] != b'"]' \
            or quotes[-1] != len(text) - 2:
        raise _Odd
    opens, closes = quotes[0::2], quotes[1::2]
    after = closes[:-1]
    if not ((a[opens - 1] == ord(",")).all() and (a[after + 1] == ord("]")).all()
            and (a[after + 2] == ord(",")).all() and (a[after + 3] == ord("[")).all()):
        raise _Odd
    # Element 4k+1 is point k's time, 4k+3 its value; the even ones are separators.
    bounds = np.empty(4 * n + 2, np.int64)
    bounds[:2] = 0, 1
    np.add(after, 4, out=bounds[5:4 * n + 1:4])
    np.subtract(opens, 1, out=bounds[2::4])
    np.add(opens, 1, out=bounds[3::4])
    bounds[4::4] = closes
    bounds[-1] = len(text)
    # Each entry's text begins with a point: its first quote opens a value, and the point's
    # time begins right after the entry's start.
    size = end - start + 1
    at = np.cumsum(size) - size
    first = np.searchsorted(quotes, at)
    if (first % 2).any() or not (bounds[2 * first + 1] == at + 1).all():
        raise _Odd
    odd = pa.py_buffer(b"\xaa" * ((4 * n + 8) // 8))  # validity: every odd element
    strings = pa.Array.from_buffers(pa.large_string(), 4 * n + 1,
                                    [odd, pa.py_buffer(bounds), pa.py_buffer(text)])
    numbers = pc.cast(strings, pa.float64())
    x = np.frombuffer(numbers.buffers()[1], np.float64, 4 * n + 1, numbers.offset * 8)
    t, v = x[1::4].copy(), x[3::4].copy()
    if not np.isfinite(t).all():
        raise _Odd
    return np.repeat(full, np.diff(first // 2, append=n)), t, v


def _rows(body: bytes, e: _Entries, full: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The points by Arrow's CSV reader: any spelling of a point's time and value it reads
    (a quoted time, a bare value). A time spelled as a number JSON would refuse (`01`, `+1`)
    is read as that number."""
    rows = b"".join(map(body.__getitem__, map(slice, e.points[full].tolist(),
                                              e.points_end[full].tolist())))
    table = pa_csv.read_csv(io.BytesIO(rows.translate(_ROWS)), read_options=_CSV_READ,
                            parse_options=_CSV_PARSE, convert_options=_CSV_CONVERT)
    first = table.column("first").to_numpy(zero_copy_only=False)
    if not len(first) or not first[0] or int(first.sum()) != len(full):
        raise _Odd
    t = table.column("t").to_numpy()
    if not np.isfinite(t).all():
        raise _Odd
    return full[np.cumsum(first) - 1], t, table.column("v").to_numpy()
