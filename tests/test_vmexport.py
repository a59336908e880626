"""metering.vmexport: which exported sample is an hour's point, and bad answers refused.
(Against a real VictoriaMetrics, beside query_range: tests/test_recorded.py.)"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metering.matrix import Labels
from metering.signals import series_key
from metering.vmexport import (
    _AS_INT,
    BadExport,
    _column,
    _NotArrow,
    _python,
    _scan,
    _stamps,
    hourly,
    params,
    read,
)

E = 1_791_158_400  # an hour start (2026-10-05T00:00Z)
H = 3_600_000  # an hour in ms


def line(labels: dict[str, str], values: list[str], stamps: list[int]) -> bytes:
    return (b'{"metric":' + json.dumps(labels, separators=(",", ":")).encode()
            + b',"values":[' + ",".join(values).encode() + b'],"timestamps":['
            + ",".join(map(str, stamps)).encode() + b"]}\n")


def points(body: bytes, first: int = E, last: int = E + 3600
           ) -> dict[str, list[tuple[float, float]]]:
    m = read(body, first, last)
    out: dict[str, list[tuple[float, float]]] = {}
    for i, key in enumerate(m.keys):
        sel = m.sid == i
        out[key] = list(zip(m.t[sel].tolist(), m.v[sel].tolist(), strict=True))
    return out


def test_the_last_sample_of_each_hour_stands_at_the_hour_start() -> None:
    ms = E * 1000
    body = line({"__name__": "gpu_ledger:up_sum:hour", "uuid": "a"},
                ["1", "2", "3", "4", "5"],
                [ms - 1, ms, ms + 17 * 60_000, ms + H + 5, ms + 2 * H - 1])
    assert points(body) == {"uuid=a": [(float(E), 3.0), (float(E + 3600), 5.0)]}


def test_samples_outside_the_hours_and_nan_are_not_points() -> None:
    ms = E * 1000
    body = line({"uuid": "a"}, ["7", "NaN", "9", "1"],
                [ms + 60_000, ms + 120_000, ms + 2 * H, ms - H])
    assert points(body) == {"uuid=a": [(float(E), 7.0)]}
    # an hour whose only sample is a NaN (a staleness marker) has no point, nor the series
    assert points(line({"uuid": "b"}, ["NaN"], [ms + 5])) == {}


def test_equal_timestamps_keep_the_later_and_lines_of_one_series_join() -> None:
    ms = E * 1000
    body = (line({"uuid": "b", "node": "n"}, ["2", "3"], [ms + 5, ms + 5])
            + line({"uuid": "a"}, ["0.1"], [ms + H])
            + line({"node": "n", "uuid": "b"}, ["4"], [ms + 3]))
    got = points(body)
    assert list(got) == ["node=n\x1fuuid=b", "uuid=a"]  # series_key order
    assert got["node=n\x1fuuid=b"] == [(float(E), 3.0)]
    assert got["uuid=a"] == [(float(E + 3600), 0.1)]


def test_values_read_as_python_reads_them_infinities_included() -> None:
    ms = E * 1000
    texts = ["0.1", "1000000000000000", "2.2250738585072014e-308", "+Inf", "-Inf",
             "123456789.98765433"]
    body = b"".join(line({"i": str(i)}, [t], [ms + i]) for i, t in enumerate(texts))
    got = points(body)
    for i, text in enumerate(texts):
        want = float(text.replace("Inf", "inf"))
        assert np.float64(got[f"i={i}"][0][1]).tobytes() == np.float64(want).tobytes()


def test_a_stale_marker_written_null_is_no_point() -> None:
    """VictoriaMetrics 1.79.5 writes a NaN after a line's first value as `null` (a live
    vmalert's staleness marker): skipped as NaN is, by the scanner and line by line."""
    ms = E * 1000
    body = line({"uuid": "a"}, ["7", "null", "NaN"], [ms + 1, ms + 2, ms + 3])
    assert points(body) == {"uuid=a": [(float(E), 7.0)]}
    _, _, values, _ = _python(body)  # line by line, where the scanner gives up
    assert values[0] == 7.0 and np.isnan(values[1:]).all()


def test_an_empty_answer_is_no_series() -> None:
    assert len(read(b"", E, E)) == 0


@pytest.mark.parametrize("body, says", [
    (line({"a": "x"}, ["1"], [E * 1000])[:-9], "whole line"),
    (line({"a": "x"}, ["1"], [E * 1000]) + b"remote error: timeout\n", "line 2"),
    (line({"a": "x"}, ["1", "2"], [E * 1000]), "as many"),
    (line({"a": "x"}, ["1_0"], [E * 1000]), "not a number"),
    (line({"a": "x"}, ["+Inf"], [E * 1000]).replace(b'"x"', b"1"), "not text"),
    (b"<html>bad gateway</html>\n", "not a series"),
    (line({"__name__": "x", "a": "b"}, ["1"], [E * 1000]).replace(b'"x"', b'"\xff"'), "not JSON"),
    (line({"__name__": "x", "a": "b"}, ["1"], [E * 1000]).replace(b'"x"', b'"x\tz"'),
     "not JSON"),
    (line({"__name__": "x", "a": "b"}, ["1"], [E * 1000]).replace(b'"a":"b"', b""), "not JSON"),
    (line({"a": "x"}, ["+Inf"], [E * 1000]).replace(b"timestamps\":[", b"timestamps\":[1.5,"),
     "timestamps"),
])
def test_a_bad_answer_is_one_line_error(body: bytes, says: str) -> None:
    with pytest.raises(BadExport) as err:
        read(body, E, E)
    assert says in str(err.value) and "\n" not in str(err.value)


def test_the_request_covers_the_hours_windows() -> None:
    assert params('m{a="b"}', E, E + 3600) == [
        ("match[]", 'm{a="b"}'), ("start", str(E)), ("end", f"{E + 7199}.999")]


def test_series_in_key_order_each_with_its_hours() -> None:
    ms = E * 1000
    body = (line({"uuid": "c"}, ["1", "2", "3"], [ms, ms + H, ms + H + 9])
            + line({"uuid": "a"}, ["4", "5"], [ms + 7, ms + H])
            + line({"uuid": "b"}, ["NaN"], [ms]))
    assert points(body) == {"uuid=a": [(float(E), 4.0), (float(E + 3600), 5.0)],
                            "uuid=c": [(float(E), 1.0), (float(E + 3600), 3.0)]}


# Lines as VictoriaMetrics writes them and with hostile label text: the numpy-marker scanner
# (_scan) reads what it takes exactly as Python's json line by line (_python) reads it, and
# what it does not take goes on to the other readers, which end in the same matrix or error.
NAMES = st.sampled_from(["__name__", "uuid", "node", "a", "é", "%s", "{}", "x y", "", "="])
TEXT = st.one_of(st.sampled_from(['},"values":[', '],"timestamps":[', '"', "\\", "\n", "null",
                                  "NaN", "%", "名", "\x1f", "}", "]", ","]),
                 st.text(max_size=6))
NUMBER = st.sampled_from(["1", "0.5", "-2", "1e+06", "NaN", "+Inf", "-Inf", "null",
                          "123456789.98765433", "2.2250738585072014e-308", "1e400"])
# what no reader takes as a number (JSON allows spaces): the answer is refused (BadExport)
NOT_NUMBER = st.sampled_from(["1_0", "", "0x10", "nul", "nulll", "NaNa", "1]"])


@st.composite
def export_line(draw: st.DrawFn) -> bytes:
    pairs = draw(st.lists(st.tuples(NAMES, TEXT), max_size=4))
    # json.dumps per pair keeps a name given twice (json keeps the last)
    metric = "{" + ",".join(f"{json.dumps(k)}:{json.dumps(v, ensure_ascii=False)}"
                            for k, v in pairs) + "}"
    values = draw(st.lists(st.one_of(NUMBER, NOT_NUMBER) if draw(st.integers(0, 9)) == 0
                           else NUMBER, max_size=4))
    stamps = draw(st.lists(st.integers(E * 1000 - H, E * 1000 + 3 * H), min_size=len(values),
                           max_size=len(values)))
    return (b'{"metric":' + metric.encode() + b',"values":[' + ",".join(values).encode()
            + b'],"timestamps":[' + ",".join(map(str, stamps)).encode() + b"]}\n")


def _as_json_reads(body: bytes) -> tuple[Any, ...]:
    labels, lengths, values, stamps = _python(body)
    return ([{k: v for k, v in m.items() if k != "__name__"} for m in labels], lengths.tolist(),
            values.tobytes(), stamps.tolist())


@settings(max_examples=500, deadline=None)
@given(st.lists(export_line(), min_size=1, max_size=6))
def test_the_scanner_reads_lines_as_json_does(lines: list[bytes]) -> None:
    body = b"".join(lines)
    try:
        want = _as_json_reads(body)
    except BadExport:  # refused by every reader (Arrow's JSON reader words it its way)
        with pytest.raises(BadExport) as err:
            read(body, E, E + 3600)
        assert "\n" not in str(err.value)
        return
    try:
        labels, lengths, values, stamps = _scan(body)
    except (_NotArrow, ValueError, pa.ArrowInvalid):
        pass  # another reader's (below: the same matrix)
    else:
        assert (labels, lengths.tolist(), values.tobytes(), stamps.tolist()) == want
    m = read(body, E, E + 3600)
    ref = hourly(*_python(body), E, E + 3600)
    assert m.labels == ref.labels and m.keys == ref.keys == [series_key(x) for x in m.labels]
    assert np.array_equal(m.sid, ref.sid) and np.array_equal(m.t, ref.t)
    assert m.v.tobytes() == ref.v.tobytes()


def test_the_scanner_takes_what_victoriametrics_writes() -> None:
    """No hostile text: the scanner itself reads it (not a fallback)."""
    ms = E * 1000
    body = (line({"__name__": "m", "uuid": "b", "node": "n%s"}, ["1", "null", "+Inf"],
                 [ms, ms + 1, ms + H])
            + line({"__name__": "m", "uuid": "a", "node": "é"}, [], [])
            + line({"uuid": "c"}, ["0.25"], [ms + 2]))
    assert _as_json_reads(body) == (lambda r: (r[0], r[1].tolist(), r[2].tobytes(),
                                               r[3].tolist()))(_scan(body))


MS = st.integers(10**12, 10**13 - 1).map(str)  # milliseconds, 2001-09-09 to 2286


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(MS, st.builds(lambda d, i, c: d[:i] + c + d[i + 1:], MS,
                                        st.integers(0, 12), st.sampled_from("-+ ./:e\n,a")),
                          st.text("0123456789-+ ./:e\n,", min_size=12, max_size=14)),
                min_size=1, max_size=5),
       st.sampled_from([",", "\n"]))
def test_timestamps_read_from_their_digits_as_arrow_reads_them(texts: list[str],
                                                                sep: str) -> None:
    """13-digit milliseconds are read by numpy from their digits: the same numbers as
    Arrow's CSV reader gives, and what it refuses is refused."""
    rows = sep.join(texts).encode()
    try:
        want = _column(rows, _AS_INT, len(texts)).tolist()
    except (_NotArrow, pa.ArrowInvalid):
        with pytest.raises((_NotArrow, pa.ArrowInvalid)):
            _stamps(rows, len(texts))
        return
    assert _stamps(rows, len(texts)).tolist() == want


@settings(max_examples=300, deadline=None)
@given(st.lists(export_line(), min_size=1, max_size=6), st.sampled_from(["m", "n:x:hour", 'q"',
                                                                         "é", ""]))
def test_a_familys_signals_share_decoded_labels(lines: list[bytes], name: str) -> None:
    """The family's signals (the same series under other names) read with one `seen`: each
    gives what Python's json gives line by line, as a fresh read does."""
    seen: Labels = {}
    for own in (name, name + "2", name, None):  # None: the names of lines differ
        body = b"".join(line.replace(b'{"metric":{', b'{"metric":{"__name__":' + json.dumps(
            f"{name}{i}" if own is None else own, ensure_ascii=False).encode() + b",", 1)
                        .replace(b",}", b"}") for i, line in enumerate(lines))
        try:
            ref = hourly(*_python(body), E, E + 3600)
        except BadExport:
            return
        m = read(body, E, E + 3600, seen)
        assert m.labels == ref.labels and m.keys == ref.keys
        assert np.array_equal(m.sid, ref.sid) and m.v.tobytes() == ref.v.tobytes()
    if '"' not in name and all(b"\\" not in line and b'"__name__"' not in line
                               and b'{"metric":{}' not in line for line in lines):
        assert seen  # the scanner took them and kept their labels
