"""metering.vmexport: which exported sample is an hour's point, and bad answers refused.
(Against a real VictoriaMetrics, beside query_range: tests/test_recorded.py.)"""

from __future__ import annotations

import json

import numpy as np
import pytest

from metering.vmexport import BadExport, _python, params, read

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
