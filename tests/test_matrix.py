"""Range-query answers decoded in columns by DuckDB give exactly what Python's json gives, and
an answer DuckDB's reader does not take as a well-formed matrix is left to the json path (which
names its problem or drops its odd values), so which decoder ran never shows in the facts."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metering import matrix
from metering.db import engine_config
from metering.matrix import Matrix, MatrixReader

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
    return json.dumps({"status": status, "data": {"resultType": kind, "result": result}}
                      ).encode()


@pytest.fixture(scope="module")
def reader() -> MatrixReader:
    return MatrixReader(engine_config())


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.dictionaries(st.from_regex(r"[a-z_][a-z0-9_]{0,6}", fullmatch=True),
                                          LABEL, max_size=5),
                          st.lists(VALUE, max_size=6)), max_size=6))
def test_duckdb_decodes_well_formed_answers_as_json_does(
        reader: MatrixReader, series: list[tuple[dict[str, str], list[str | None]]]) -> None:
    result = [{"metric": m, "values": [[1790812800 + 3600 * i, v] for i, v in enumerate(vs)]}
              for m, vs in series]
    body = _body(result)
    got = reader.read(body)
    assert got is not None
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
def test_odd_answers_are_left_to_json(reader: MatrixReader, body: bytes) -> None:
    assert reader.read(body) is None


def test_empty_answer(reader: MatrixReader) -> None:
    got = reader.read(_body([]))
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
