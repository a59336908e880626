"""Range-query answers decoded in columns by the scanner give exactly what Python's json gives,
and an answer the scanner does not take as a well-formed matrix is left to the json path (which
names its problem or drops its odd values), so which decoder ran never shows in the facts."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metering import matrix
from metering.matrix import Matrix
from metering.signals import series_key

LABEL = st.text(st.characters(codec="utf-8", exclude_characters="\x1f\x00"), max_size=8)
VALUE = st.one_of(st.integers(-10**12, 10**12).map(str),
                  st.floats(allow_nan=False, allow_infinity=False).map(repr),
                  st.sampled_from(["NaN", "+Inf", "-Inf", "1e+06", "0.125", "-0"]),
                  st.none())


def _same(a: Matrix, b: Matrix) -> None:
    assert a.labels == b.labels and a.keys == b.keys
    assert np.array_equal(a.sid, b.sid) and np.array_equal(a.t, b.t)
    assert np.array_equal(a.v, b.v, equal_nan=True)


def _body(result: list[Any], status: str = "success", kind: str = "matrix") -> bytes:
    """An answer as stores write it: compact, `metric` before `values` in each entry."""
    return json.dumps({"status": status, "data": {"resultType": kind, "result": result}},
                      separators=(",", ":")).encode()


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.dictionaries(st.from_regex(r"[a-z_][a-z0-9_]{0,6}", fullmatch=True),
                                          LABEL, max_size=5),
                          st.lists(VALUE, max_size=6)), max_size=6))
def test_the_scanner_decodes_well_formed_answers_as_json_does(
        series: list[tuple[dict[str, str], list[str | None]]]) -> None:
    result = [{"metric": m, "values": [[1790812800 + 3600 * i, v] for i, v in enumerate(vs)]}
              for m, vs in series]
    body = _body(result)
    got = matrix.read(body)
    assert got is not None or any(v is None for _, vs in series for v in vs)
    if got is None:  # a null value: the json path's
        return
    _same(got, matrix.from_result(json.loads(body)["data"]["result"]))


@pytest.mark.parametrize("body", [
    _body([{"metric": {"uuid": "GPU-1"}, "values": [[1790812800, "abc"]]}]),  # not a number
    _body([{"metric": {"uuid": "GPU-1"}, "values": [[1790812800]]}]),  # no value
    _body([{"metric": {"uuid": "GPU-1"}, "values": [["x", "1"]]}]),  # time not a number
    _body([{"metric": {"uuid": "GPU-1"}}]),  # no values
    _body([{"values": [[1790812800, "1"]]}]),  # no metric
    _body([{"metric": "GPU-1", "values": [[1790812800, "1"]]}]),  # metric not an object
    _body([], status="error"),
    _body([], kind="vector"),
    b"<html>not prometheus</html>",
    b'{"status": "success"}',
])
def test_odd_answers_are_left_to_json(body: bytes) -> None:
    assert matrix.read(body) is None


def test_empty_answer() -> None:
    got = matrix.read(_body([]))
    assert got is not None and len(got) == 0 and len(got.sid) == 0


def test_pieces_concat_and_merge() -> None:
    """Node shards one after another; time pieces of one series joined in time order."""
    a = matrix.from_result([{"metric": {"n": "1"}, "values": [[1, "1"], [2, "2"]]},
                            {"metric": {"n": "2"}, "values": [[1, "5"]]}])
    b = matrix.from_result([{"metric": {"n": "2"}, "values": [[3, "6"]]},
                            {"metric": {"n": "3"}, "values": [[3, "7"]]},
                            {"metric": {"n": "1"}, "values": [[3, "3"]]}])
    merged = matrix.merge([a, b])
    assert [m["n"] for m in merged.labels] == ["1", "2", "3"]
    assert merged.sid.tolist() == [0, 0, 0, 1, 1, 2]
    assert merged.t.tolist() == [1, 2, 3, 1, 3, 3]
    assert merged.v.tolist() == [1, 2, 3, 5, 6, 7]
    both = matrix.concat([a, b])
    assert both.sid.tolist() == [0, 0, 1, 2, 3, 4] and len(both) == 5


def _json_matrix(body: bytes) -> Matrix:
    return matrix.from_result(json.loads(body)["data"]["result"])


@settings(max_examples=40, deadline=None)
@given(st.lists(st.dictionaries(st.text(max_size=6), st.text(max_size=12), max_size=4),
                max_size=5), st.booleans())
def test_any_label_text_is_read_as_json_reads_it(metrics: list[dict[str, str]],
                                                 ascii_only: bool) -> None:
    """Quotes, backslashes, brackets, control and non-ASCII characters in label names and
    values, escaped or written as UTF-8."""
    result = [{"metric": m, "values": [[1790812800, "1"], [1790816400.5, "2.5"]]}
              for m in metrics]
    body = json.dumps({"status": "success", "data": {"resultType": "matrix", "result": result}},
                      separators=(",", ":"), ensure_ascii=ascii_only).encode()
    got = matrix.read(body)
    assert got is not None
    _same(got, _json_matrix(body))


def test_a_label_value_that_looks_like_points() -> None:
    body = _body([{"metric": {"pod": '"values":[[1,"2"]]},{"metric":{', "x": "],["},
                   "values": [[1790812800, "3"]]},
                  {"metric": {"pod": "b"}, "values": [[1790812800, "4"], [1790816400, "5"]]}])
    got = matrix.read(body)
    assert got is not None
    _same(got, _json_matrix(body))
    assert got.sid.tolist() == [0, 1, 1] and got.v.tolist() == [3, 4, 5]


@pytest.mark.parametrize("value", ["1_000", "infinity", "Infinity", "inf", "nan", "+NaN",
                                   "0x10", " 2", "", "1e", ".", "5.", ".5", "+1", "-0",
                                   "1E-7", "-Inf", "12345678901234567890"])
def test_odd_value_spellings_decode_as_json_decodes_them(value: str) -> None:
    """A spelling the scanner admits is read as Python's float reads it; any other sends the
    answer to the json path."""
    body = _body([{"metric": {"uuid": "GPU-1"}, "values": [[1790812800, value]]}])
    got = matrix.read(body)
    if got is not None:
        _same(got, _json_matrix(body))


@pytest.mark.parametrize("body", [
    b'{"status":"success","isPartial":false,"data":{"resultType":"matrix","result":'
    b'[{"metric":{"a":"1"},"values":[[1790812800,"2"]]}]}}',  # VictoriaMetrics
    b'{"status":"success","data":{"resultType":"matrix","result":[{"metric":{"a":"1"},'
    b'"values":[[1790812800,"2"]]}],"stats":{"samples":{"total":1}}},"warnings":["w"]}\n',
])
def test_store_variants_of_the_envelope_are_scanned(body: bytes) -> None:
    got = matrix.read(body)
    assert got is not None
    _same(got, _json_matrix(body))


@pytest.mark.parametrize("body", [
    json.dumps({"status": "success", "data": {"resultType": "matrix", "result": [
        {"metric": {"a": "1"}, "values": [[1790812800, "2"]]}]}}).encode(),  # with spaces
    b'{"status":"success","data":{"resultType":"matrix","result":[{"values":'
    b'[[1790812800,"2"]],"metric":{"a":"1"}}]}}',  # values first
    b'{"status":"success","data":{"resultType":"matrix","result":[{"metric":{"a":"1"},'
    b'"values":[[1790812800,"2"]],"extra":1}]}}',  # another key in an entry
    b'{"status":"error","status":"success","data":{"resultType":"matrix","result":[]}}',
    b'{"status":"success","data":{"resultType":"matrix","result":[{"metric":{"a":1},'
    b'"values":[[1790812800,"2"]]}]}}',  # a label value that is not text
    b'{"status":"success","data":{"resultType":"matrix","result":[{"metric":{"a":"1"},'
    b'"values":[[1790812800,"]}"]]}]}}',  # a value that ends the array early
    b'{"status":"success","data":{"resultType":"matrix","result":[{"metric":{"a":"1"},'
    b'"values":[[1790812800,"2],[3,4"]]}]}}',  # a value that looks like two points
])
def test_other_layouts_go_to_json_which_reads_them_the_same(body: bytes) -> None:
    """Whitespace, another key order, another key, a repeated key: json decides."""
    assert matrix.read(body) is None
    _json_matrix(body)  # still a matrix to the json path


@pytest.mark.parametrize("metrics", [
    [{"a": "1", "b": ""}, {}, {"a": "x=y", "c": "{}"}, {"": ""}, {"k": "}{"}],
    [{"a": "[1]", "b": "],[", "c": ":,"}, {"a": "é", "b": "\x1f"}],
    [{"b": "1", "a": "2"}],  # names out of order
    [{"__name__": "gpu_up", "a": "1"}, {"a": "1"}],  # the metric name is not in the key
    [{"A": "1", "__name__": "gpu_up", "b": "2"}],  # ... nor where it is not the first name
    [{"a": 'say "hi"', "b": "back\\slash"}],  # escapes
    # VictoriaMetrics keeps the metric name in max_, min_ and last_over_time's answers
    [{"__name__": "gpu_up", "a": "1"}, {"__name__": "gpu_up"}, {"A": "2", "__name__": "x"}],
    [{"__name__": 'say "hi"', "a": "1"}, {"__name__": "back\\slash", "b": "2"}],  # escaped
])
def test_label_maps_as_stores_write_them(metrics: list[dict[str, str]]) -> None:
    """Label maps with names in order and UTF-8 unescaped, as stores write them, and others:
    read as json reads them, keyed by series_key, without the metric name (wherever it
    stands and however it is spelled)."""
    result = [{"metric": m, "values": [[1790812800, "1"]]} for m in metrics]
    body = json.dumps({"status": "success", "data": {"resultType": "matrix", "result": result}},
                      separators=(",", ":"), ensure_ascii=False).encode()
    got = matrix.read(body)
    assert got is not None
    _same(got, _json_matrix(body))
    assert got.labels == [{k: v for k, v in m.items() if k != "__name__"} for m in metrics]


def test_a_named_answer_shares_the_label_maps_of_its_family() -> None:
    """sum_over_time drops the metric name, max_over_time on VictoriaMetrics keeps it: the
    second answer's series are the first's, their label maps decoded once (the same objects,
    nothing added to `seen`)."""
    maps = [{"a": str(i), "node": f"n{i}"} for i in range(3)]
    plain = _body([{"metric": m, "values": [[1790812800, "1"]]} for m in maps])
    named = _body([{"metric": {"__name__": "gpu_container_memory_used_bytes", **m},
                    "values": [[1790812800, "2"]]} for m in reversed(maps)])
    seen: matrix.Labels = {}
    first = matrix.read(plain, seen)
    assert first is not None and len(seen) == 3
    second = matrix.read(named, seen)
    assert second is not None and len(seen) == 3
    assert all(a is b for a, b in zip(second.labels, reversed(first.labels), strict=True))
    assert second.keys == first.keys[::-1]


def test_a_label_name_twice_is_read_as_json_reads_it() -> None:
    body = (b'{"status":"success","data":{"resultType":"matrix","result":[{"metric":{"a":"1",'
            b'"a":"2"},"values":[[1790812800,"1"]]},{"metric":{"a":"3","b":"4"},"values":'
            b'[[1790812800,"2"]]}]}}')
    got = matrix.read(body)
    assert got is not None
    _same(got, _json_matrix(body))
    assert got.keys == ["a=2", "a=3\x1fb=4"]



@pytest.mark.parametrize("points", [
    [["1790812800", "2"]], [[1790812800, 2]], [[1790812800.5, "2"], [1790816400, "1e3"]],
])
def test_quoted_times_and_bare_values_are_read_as_json_reads_them(points: list[Any]) -> None:
    body = _body([{"metric": {"a": "1"}, "values": points},
                  {"metric": {"a": "2"}, "values": []}, {"metric": {"a": "3"}, "values": points}])
    got = matrix.read(body)
    assert got is not None
    _same(got, _json_matrix(body))
    assert got.sid.tolist() == [0] * len(points) + [2] * len(points)


@pytest.mark.parametrize("metric", [
    b'{"a":1}', b'{"a":null}', b'{"a":{"b":"c"}}', b'{"a":["b"]}', b'{"b":":","a":2}',
    b'{"a":"\\":","b":3}',
])
def test_a_label_value_that_is_not_text_is_left_to_json(metric: bytes) -> None:
    body = (b'{"status":"success","data":{"resultType":"matrix","result":[{"metric":{"a":"1"},'
            b'"values":[[1790812800,"1"]]},{"metric":' + metric + b',"values":[[1790812800,'
            b'"2"]]}]}}')
    assert matrix.read(body) is None
    _json_matrix(body)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.dictionaries(st.text(max_size=6), st.text(max_size=12), max_size=5),
                min_size=1, max_size=5))
def test_label_maps_in_store_order_are_keyed_from_their_text(
        metrics: list[dict[str, str]]) -> None:
    """Names in order and UTF-8 unescaped, as stores write them: the keys cut from the maps'
    text are series_key's."""
    result = [{"metric": m, "values": [[1790812800, "1"]]} for m in metrics]
    body = json.dumps({"status": "success", "data": {"resultType": "matrix", "result": result}},
                      separators=(",", ":"), ensure_ascii=False, sort_keys=True).encode()
    got = matrix.read(body)
    assert got is not None
    _same(got, _json_matrix(body))
    assert got.keys == [series_key(m) for m in metrics]


@pytest.mark.parametrize(("metrics", "cut"), [
    ([{"a": "", "b": ""}, {"a": "é", "b": "日本"}, {"label_team": "x", "node": "n"}], True),
    ([{"a": "x:", "b": "}{x"}, {"a": "],[", "b": "=", "c": "a b"}], True),
    # Strings that are or hold the separators: cut right, or refused (series_key then).
    ([{"": "", "a": ":x"}, {"a": ",y", "b": "}{x"}], None),
    ([{"a": "},{x"}, {"b": "y},{z"}, {":a": "b,"}], None),
    ([{"a": ","}], None), ([{",": "b"}], None), ([{"a": "},{"}, {"b": "},{"}], None),
    ([{"a": ""}, {"},{": ""}], None), ([{",": ",", "a": "},{"}, {"},{": ","}], None),
    ([{"a": ":"}], False), ([{":": "b"}], False), ([{"a": "1", "b": ":x"}], False),
])
def test_keys_cut_from_plain_label_text_are_series_keys(metrics: list[dict[str, str]],
                                                        cut: bool | None) -> None:
    """Separators' characters inside names and values (no quote, no backslash): the keys cut
    from the text are series_key's, or the text is refused (cut None: either)."""
    result = [{"metric": m, "values": [[1790812800, "1"]]} for m in metrics]
    body = json.dumps({"status": "success", "data": {"resultType": "matrix", "result": result}},
                      separators=(",", ":"), ensure_ascii=False, sort_keys=True).encode()
    joined = b",".join(json.dumps(m, separators=(",", ":"), ensure_ascii=False,
                                  sort_keys=True).encode() for m in metrics)
    decoded = [dict(sorted(m.items())) for m in metrics]
    keys = matrix._keys(joined, decoded) if matrix.all_text(joined, decoded) else None
    want = [series_key(m) for m in metrics]
    assert keys in ([want, None] if cut is None else [want] if cut else [None])
    got = matrix.read(body)
    assert got is not None
    _same(got, _json_matrix(body))


@pytest.mark.parametrize("metric", [
    b'{ "a":"1","b":"2"}', b'{"a":"1", "b":"2"}', b'{"a":"1","b":"2" }', b'{"a" :"1"}',
    b'{"a": "1"}', b'{"a":"1","b":"2"}\n',
])
def test_label_maps_with_whitespace_are_read_as_json_reads_them(metric: bytes) -> None:
    body = (b'{"status":"success","data":{"resultType":"matrix","result":[{"metric":' + metric
            + b',"values":[[1790812800,"1"]]},{"metric":' + metric.strip() + b',"values":'
            b'[[1790816400,"2"]]}]}}')
    got = matrix.read(body)
    if got is not None:
        _same(got, _json_matrix(body))
        assert got.keys == ["a=1\x1fb=2"] * 2 or got.keys == ["a=1"] * 2


SEPARATORS = st.text(alphabet=':,{}a="', max_size=4)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.dictionaries(SEPARATORS, SEPARATORS, max_size=4), min_size=1, max_size=4))
def test_label_text_made_of_separators_is_keyed_as_series_key_keys_it(
        metrics: list[dict[str, str]]) -> None:
    """Names and values made of the characters the keys are cut at, in store order."""
    result = [{"metric": m, "values": [[1790812800, "1"]]} for m in metrics]
    body = json.dumps({"status": "success", "data": {"resultType": "matrix", "result": result}},
                      separators=(",", ":"), sort_keys=True).encode()
    got = matrix.read(body)
    assert got is not None
    assert got.keys == [series_key(m) for m in metrics]
    _same(got, _json_matrix(body))


# --- points cut at their quotes (matrix._cut), without the CSV reader behind it -------------

TIME = st.one_of(st.integers(0, 10**11), st.sampled_from([1790812800.5, 1790812800.125, 1e9]))


def _cut_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CSV reader refuses everything: what read() returns came from _cut."""
    def refuse(*_: Any) -> Any:
        raise matrix._Odd
    monkeypatch.setattr(matrix, "_rows", refuse)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.tuples(TIME, VALUE.filter(lambda v: v is not None)), max_size=4),
                min_size=1, max_size=5))
def test_points_as_stores_write_them_are_cut_as_json_reads_them(
        series: list[list[tuple[float, str]]]) -> None:
    """Entries without points, with one, and with several, between others; times of any width,
    whole or not; values in every spelling stores write (NaN, +Inf, -Inf, exponents)."""
    result = [{"metric": {"i": str(i)}, "values": [list(p) for p in points]}
              for i, points in enumerate(series)]
    body = _body(result)
    with pytest.MonkeyPatch.context() as mp:
        _cut_only(mp)
        got = matrix.read(body)
    assert got is not None
    _same(got, _json_matrix(body))


@pytest.mark.parametrize("values", [
    ['"],[1790816400,"2'], ['1,"2'], ["1]"], ["[1"], ["1,2"], ['"'], ["2", '3"],["4'],
    [",", "1"], ["1", "],["], ["", "1"],
])
def test_values_holding_the_separators_are_not_cut(values: list[str]) -> None:
    """A value holding a point's separators (json escapes its quotes) is not a number: the
    answer goes to the json path, which gives NaN; it never becomes points of its own."""
    body = _body([{"metric": {"a": "1"}, "values": [[1790812800 + i, v]
                                                    for i, v in enumerate(values)]}])
    assert matrix.read(body) is None
    assert np.isnan(_json_matrix(body).v).any()


@pytest.mark.parametrize("points", [
    b'[[1,"2"],,3,"4"][[5,"6"]]', b'[[1,"2"][3,"4"]]', b'[[1,"2"],[3,"4"],]',
    b'[[1,"2"],[3,"4",]]', b'[[1,"2"] ,[3,"4"]]', b'[[1, "2"]]', b'[[1,"2"]]]',
    b'[[1,"2"],[,"4"]]', b'[[1,2"],[3,"4"]]', b'[[1,"2"],["3,"4"]]', b'[[1,"2","3"]]',
    b'[[1,"2"],[3,"4"]', b'[[1,"2"],[[3,"4"]]]', b'[[1"2"]]', b'[[1,,"2"]]',
])
def test_points_in_other_layouts_are_not_cut(points: bytes) -> None:
    """Separators missing, doubled, moved or spaced: _cut refuses (json refuses most of these
    or reads them otherwise), whatever the CSV reader behind it makes of them."""
    body = (b'{"status":"success","data":{"resultType":"matrix","result":[{"metric":{"a":"1"},'
            b'"values":' + points + b'},{"metric":{"a":"2"},"values":[[7,"8"]]}]}}')
    with pytest.MonkeyPatch.context() as mp:
        _cut_only(mp)
        assert matrix.read(body) is None


# Separators' characters and a letter: no digit, so no edit spells a time JSON refuses and
# Arrow reads (`01`: the scanner reads such times as numbers, as it did before _cut).
MUTANT = st.text(alphabet='[],":x', min_size=1, max_size=3)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.tuples(st.integers(1, 99), st.integers(1, 99)), min_size=1,
                         max_size=3), min_size=1, max_size=3),
       st.data())
def test_cut_points_text_with_any_edit_is_json_or_refused(
        series: list[list[tuple[int, int]]], data: st.DataObject) -> None:
    """Any edit of the points' text by the separators' characters: _cut gives what json gives
    for the edited answer, or refuses it (always where json refuses it)."""
    entries = [b'{"metric":{"i":"%d"},"values":[' % i
               + b",".join(b'[%d,"%d"]' % p for p in points) + b"]}"
               for i, points in enumerate(series)]
    text = b",".join(entries)
    at = data.draw(st.integers(0, len(text)))
    cut = data.draw(st.integers(0, 2))
    text = text[:at] + data.draw(MUTANT).encode() + text[at + cut:]
    body = b'{"status":"success","data":{"resultType":"matrix","result":[' + text + b"]}}"
    with pytest.MonkeyPatch.context() as mp:
        _cut_only(mp)
        got = matrix.read(body)
    if got is None:
        return
    try:
        want = _json_matrix(body)
    except (ValueError, TypeError, AttributeError, KeyError) as e:
        raise AssertionError(f"cut an answer json refuses: {body!r}") from e
    _same(got, want)


# Label names and values that a %-format, a str.format or the key's own separators could
# misread; maps sharing a name order (the fast case) and of other orders, __name__ anywhere.
HOSTILE = st.sampled_from(["%", "%s", "%%", "%(a)s", "{}", "{0}", "=", "a=b", "\x1f", "é", "名",
                           "__name__", "a", "b", "", " ", "\\", '"', "z" * 9])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["a", "b", "__name__", "%", "é", "{x}", "="]), max_size=5,
                unique=True),
       st.lists(st.tuples(st.booleans(), st.dictionaries(st.one_of(HOSTILE, LABEL),
                                                         st.one_of(HOSTILE, LABEL), max_size=5),
                          st.lists(st.one_of(HOSTILE, LABEL), min_size=5, max_size=5)),
                max_size=8))
def test_series_keys_are_series_key(order: list[str],
                                    maps: list[tuple[bool, dict[str, str], list[str]]]) -> None:
    """matrix.series_keys gives series_key's text for every map, whether it shares a name
    order with others (formatted once per order) or not."""
    got = [dict(zip(order, values, strict=False)) if shared else m for shared, m, values in maps]
    assert matrix.series_keys(got) == [series_key(m) for m in got]


@pytest.mark.parametrize(("orders", "cut"), [(1, False), (40, False), (200, True)])
def test_keys_by_label_order_or_cut_from_the_text_are_series_keys(
        orders: int, cut: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """An answer's series keys are series_key's whether its label maps share a few name
    orders (keyed once per order) or nearly each has its own (pod labels that differ from pod
    to pod: cut from the text, which costs less there)."""
    maps = [{"node": f"n{i}", "pod": f"p{i % 7}",
             **{f"label_x{b}": f"v{i}" for b in range(8) if (i % orders) >> b & 1}}
            for i in range(400)]
    result = [{"metric": m, "values": [[1790812800 + 3600 * k, str(k)] for k in range(3)]}
              for m in maps]
    body = json.dumps({"status": "success", "data": {"resultType": "matrix", "result": result}},
                      separators=(",", ":"), sort_keys=True).encode()
    calls: list[int] = []
    text_keys = matrix._keys

    def spy(joined: bytes, decoded: list[dict[str, str]], *rest: Any) -> list[str] | None:
        calls.append(len(decoded))
        return text_keys(joined, decoded, *rest)

    monkeypatch.setattr(matrix, "_keys", spy)
    got = matrix.read(body)
    assert got is not None
    assert got.keys == [series_key(m) for m in maps]
    _same(got, _json_matrix(body))
    assert calls == ([400] if cut else [])
