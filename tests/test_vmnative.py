"""metering.vmnative against a real VictoriaMetrics (the Debian package, 1.79.5): every sample
of /api/v1/export/native equals /api/v1/export's JSON lines of the same request, floats bit
for bit, on data that makes the store pick each of its encodings; the hourly points equal
metering.vmexport.read's; what the decoder does not know is Unreadable."""

from __future__ import annotations

import itertools
import json
import random
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from promtools import running_victoria, vm_import

from metering import vmexport, vmnative
from metering.matrix import Labels

pytestmark = pytest.mark.slow

E = 1_791_158_400  # 2026-10-05T00:00Z
T0 = E * 1000
MIN = 60_000
V_STALE = (1 << 63) - 2  # VictoriaMetrics' mantissa of the stale NaN (lib/decimal)


def _prom(name: str, labels: dict[str, str], values: list[str], step: int = MIN,
          start: int = T0) -> str:
    lab = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return "".join(f"{name}{{{lab}}} {v} {start + i * step}\n" for i, v in enumerate(values))


def _fleet() -> str:
    rng = random.Random(27)
    many = ["123456789.98765433", "0.1", "3.141592653589793", "-0.000123456789012345",
            "9007199254740993", "1e-300", "5e-324", "2.2250738585072014e-308"]
    return "".join([
        # counters (nearest delta2, zstd): > 8192 rows, so several blocks per series
        _prom("n_counter", {"k": "a"}, [str(i * 17 + rng.randint(0, 5)) for i in range(9000)]),
        _prom("n_counter", {"k": "reset"}, [str(i % 700) for i in range(2000)]),
        # gauges of many digits (nearest delta, zstd), negative and positive
        _prom("n_gauge", {"k": "b"}, [repr(rng.uniform(-1e6, 1e6)) for _ in range(3000)]),
        _prom("n_gauge", {"k": "short"}, [repr(rng.uniform(0, 1)) for _ in range(20)]),
        _prom("n_const", {"k": "c"}, ["42.5"] * 500),
        _prom("n_const", {"k": "zero"}, ["0"] * 100),
        _prom("n_const", {"k": "one"}, ["1"] * 100),
        _prom("n_dconst", {"k": "d"}, [str(10 + 3 * i) for i in range(500)]),
        _prom("n_int", {"k": "e"}, [str(rng.randint(-10**15, 10**15)) for _ in range(300)]),
        _prom("n_many", {"k": "f"}, many * 20),
        _prom("n_many", {"k": "f-alone"}, [m for m in many for _ in range(3)], step=3 * MIN),
        _prom("n_big", {"k": "g"}, ["1.7976931348623157e308", "-2.5e200", "1e300",
                                    "6.02214076e23"] * 10),
        _prom("n_small", {"k": "h"}, ["1e-20", "2e-21", "3.3e-19", "7e-310"] * 30),
        _prom("n_inf", {"k": "i"}, ["+Inf", "-Inf", "1", "2.5"] * 10),
        _prom("n_gap", {"k": "j"}, [repr(rng.random()) for _ in range(40)], step=5 * 3_600_000),
        _prom("n_one", {"k": "single", "odd": 'q\\"uote\\\\s\x01'}, ["7.25"]),
    ])


def _uvarint(u: int) -> bytes:
    out = bytearray()
    while u > 0x7F:
        out.append(0x80 | (u & 0x7F))
        u >>= 7
    return bytes(out) + bytes([u])


def _varint(v: int) -> bytes:
    return _uvarint(((v << 1) ^ (v >> 63)) & (2**64 - 1))


def _zigzag64(v: int) -> bytes:
    """encoding.MarshalInt64: zig-zag, 8 bytes big-endian."""
    return (((v << 1) ^ (v >> 63)) & (2**64 - 1)).to_bytes(8, "big")


def _native_block(name: bytes, stamps: list[int], mantissas: list[int]) -> bytes:
    """One block as Block.MarshalPortable writes it (timestamps and values uncompressed
    nearest delta, type 6), for the store to import: values the text import cannot carry."""
    def deltas(a: list[int]) -> bytes:
        return b"".join(_varint((y - x + 2**63) % 2**64 - 2**63) for x, y in itertools.pairwise(a))
    ts, vs = deltas(stamps), deltas(mantissas)
    block = (_varint(stamps[0]) + _varint(mantissas[0]) + _uvarint(len(stamps)) + _varint(0)
             + bytes([6, 6]) + _uvarint(len(ts)) + ts + _uvarint(len(vs)) + vs)
    return (len(name).to_bytes(4, "big") + name + len(block).to_bytes(4, "big") + block)


def _get(url: str, path: str, selector: str, first: int, last: int) -> bytes:
    query = urllib.parse.urlencode(vmexport.params(selector, first, last))
    with urllib.request.urlopen(f"{url}{path}?{query}", timeout=60) as r:
        body: bytes = r.read()
    return body


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    path = tmp_path_factory.mktemp("vmnative") / "vm"
    with running_victoria(path) as url:
        text = _fleet()
        vm_import(url, text)
        vm_import(url, _prom("n_counter", {"k": "again"}, ["5", "6"]))
        vm_import(url, _prom("n_counter", {"k": "again"}, ["5", "6", "7"]))  # second block
        # The stale NaN (vmalert writes it when a series ends) amid values, and the
        # infinities' mantissas, imported as native blocks.
        name = b"n_stale\x01k\x01s\x01"
        span = _zigzag64(0) + _zigzag64(2**62)  # the time range the importer keeps
        stream = (span + _native_block(name, [T0 + i * MIN for i in range(5)],
                                              [1, 2, V_STALE, 4, 5])
                  + _native_block(b"n_stale\x01k\x01t\x01", [T0 + i * MIN for i in range(5)],
                                  [(1 << 63) - 1, -(1 << 63), (1 << 63) - 3, -(1 << 63) + 1,
                                   (1 << 62)]))  # +Inf, -Inf, the largest plain, ...
        req = urllib.request.Request(f"{url}/api/v1/import/native", data=stream,
                                     method="POST")
        with urllib.request.urlopen(req, timeout=60):
            pass
        vm_import(url, "")
        yield url


def _json_points(body: bytes) -> dict[str, list[tuple[int, str]]]:
    out: dict[str, list[tuple[int, str]]] = {}
    for line in body.splitlines():
        mid = line.index(b',"values":[')
        fixed = line[:mid] + line[mid:].replace(b"+Inf", b"Infinity").replace(b"-Inf",
                                                                               b"-Infinity")
        d = json.loads(fixed)
        key = json.dumps({k: v for k, v in d["metric"].items() if k != "__name__"},
                         sort_keys=True)
        out.setdefault(key, []).extend(zip(d["timestamps"], map(_bits, d["values"]),
                                           strict=True))
    return out


def _bits(v: float | None) -> str:
    """A value's bits; any NaN as one (JSON cannot say which NaN; a NaN after a line's first
    value is written `null`)."""
    return "nan" if v is None or v != v else np.float64(v).tobytes().hex()


def _native_points(body: bytes) -> dict[str, list[tuple[int, str]]]:
    b = vmnative.decode(body)
    out: dict[str, list[tuple[int, str]]] = {}
    at = 0
    for labels, n in zip(b.labels, b.lengths.tolist(), strict=True):
        key = json.dumps(labels, sort_keys=True)
        out.setdefault(key, []).extend(zip(b.stamps[at:at + n].tolist(),
                                           map(_bits, b.values[at:at + n].tolist()),
                                           strict=True))
        at += n
    return out


def test_native_samples_equal_the_json_export_bit_for_bit(store: str) -> None:
    first, last = E - 86_400, E + 40 * 86_400
    native = _get(store, vmnative.NATIVE_PATH, '{__name__=~"n_.*"}', first, last)
    lines = _get(store, vmexport.EXPORT_PATH, '{__name__=~"n_.*"}', first, last)
    want, got = _json_points(lines), _native_points(native)
    assert sorted(want) == sorted(got), sorted(want)
    for key, points in want.items():  # a series' blocks come in no fixed order
        assert sorted(got[key]) == sorted(points), key
    b = vmnative.decode(native)
    assert b.start_ms == first * 1000 and len(b.labels) > len(want)  # several blocks
    stale = b.values[np.isnan(b.values)].view(np.int64)
    assert len(stale) == 1 and int(stale[0]) == 0x7FF0000000000002  # VictoriaMetrics' own


@pytest.mark.parametrize("first, hours", [(E, 24), (E - 3600, 1), (E + 7 * 86_400, 72),
                                          (E + 86_400 * 20, 24 * 12)])
def test_hourly_points_equal_the_json_exports(store: str, first: int, hours: int) -> None:
    last = first + (hours - 1) * 3600
    for sel in ('{__name__=~"n_.*"}', '{__name__="n_counter"}', '{k="f"}'):
        native = vmnative.read(_get(store, vmnative.NATIVE_PATH, sel, first, last), first, last)
        lines = vmexport.read(_get(store, vmexport.EXPORT_PATH, sel, first, last), first, last)
        assert native.keys == lines.keys and native.labels == lines.labels
        assert np.array_equal(native.sid, lines.sid) and np.array_equal(native.t, lines.t)
        assert native.v.tobytes() == lines.v.tobytes()


def test_windows_of_a_period_equal_each_window_read_on_its_own(store: str) -> None:
    """A period's hourly points kept once (`hours`) give each chunk's window exactly as
    choosing them from the blocks for that window: the same series (those with a point in
    it, in series_key order), times and value bits; windows sharing their edge hour too."""
    first, last = E - 86_400, E + 30 * 86_400
    for sel in ('{__name__=~"n_.*"}', '{__name__="n_counter"}', '{__name__="nothing"}'):
        blocks = vmnative.decode(_get(store, vmnative.NATIVE_PATH, sel, first, last))
        kept = vmnative.hours(blocks, first, last)
        for f, hours in [(first, 1), (first, 72), (E - 3600, 2), (E, 25), (E + 86_400, 24 * 12),
                         (last, 1), (E + 3 * 86_400, 24 * 27 + 1)]:
            lo, hi = f, min(f + (hours - 1) * 3600, last)
            want, got = vmnative.points(blocks, lo, hi), kept.window(lo, hi)
            assert got.keys == want.keys and got.labels == want.labels, (sel, f, hours)
            assert got.sid.dtype == want.sid.dtype and np.array_equal(got.sid, want.sid)
            assert got.t.tobytes() == want.t.tobytes() and got.v.tobytes() == want.v.tobytes()
        assert sel == '{__name__="nothing"}' or len(kept.keys) > 0
    with pytest.raises(ValueError, match="not a whole hour"):
        kept.window(first + 60, last)


def test_a_block_of_one_row_first_in_the_answer(store: str) -> None:
    """A one-row block has no data; first in the answer, its empty parts are the first of
    all parts (this once counted another part's varints). The store sends blocks in no fixed
    order, so the case is also written here."""
    stream = (_zigzag64(T0) + _zigzag64(T0 + 9 * MIN)
              + _native_block(b"m\x01k\x01one\x01", [T0], [5])
              + _native_block(b"m\x01k\x01two\x01", [T0, T0 + MIN, T0 + 3 * MIN], [7, 9, 4]))
    b = vmnative.decode(stream)
    assert b.labels == [{"k": "one"}, {"k": "two"}] and b.lengths.tolist() == [1, 3]
    assert b.stamps.tolist() == [T0, T0, T0 + MIN, T0 + 3 * MIN]
    assert b.values.tolist() == [5.0, 7.0, 9.0, 4.0] and b.start_ms == T0
    for sel in ('{__name__="n_one"}', '{__name__=~"n_one|n_gauge"}'):
        native = _get(store, vmnative.NATIVE_PATH, sel, E - 86_400, E + 40 * 86_400)
        lines = _get(store, vmexport.EXPORT_PATH, sel, E - 86_400, E + 40 * 86_400)
        assert _native_points(native).keys() == _json_points(lines).keys()
        for key, points in _json_points(lines).items():
            assert sorted(_native_points(native)[key]) == sorted(points)


def test_an_empty_answer_is_no_series(store: str) -> None:
    body = _get(store, vmnative.NATIVE_PATH, '{__name__="nothing"}', E, E)
    assert len(body) == 16 and len(vmnative.read(body, E, E)) == 0


def _blocks_at(body: bytes) -> list[int]:
    """Where each block's Block.MarshalPortable starts."""
    at, pos = [], 16
    while pos < len(body):
        pos += 4 + int.from_bytes(body[pos:pos + 4], "big")
        at.append(pos + 4)
        pos += 4 + int.from_bytes(body[pos:pos + 4], "big")
    return at


def _types_at(body: bytes, block: int) -> int:
    """Where a block's two marshal-type bytes are (after four varints)."""
    pos = block
    for _ in range(4):
        while body[pos] >= 0x80:
            pos += 1
        pos += 1
    return pos


def test_what_the_decoder_does_not_know_is_unreadable(store: str) -> None:
    body = _get(store, vmnative.NATIVE_PATH, '{__name__="n_gauge"}', E, E + 86_400)
    at = _types_at(body, _blocks_at(body)[0])
    unknown = body[:at] + b"\x07" + body[at + 1:]
    with pytest.raises(vmnative.Unreadable, match="encoding 7"):
        vmnative.read(unknown, E, E)
    for cut in (len(body) - 1, len(body) // 2, 20):
        with pytest.raises(vmnative.Unreadable):
            vmnative.read(body[:cut], E, E)
    with pytest.raises(vmnative.Unreadable):
        vmnative.read(b"<html>oops</html>\n" + body, E, E)
    # A zstd-compressed part whose bytes are damaged: zstd refuses it, or it holds not the
    # rows; timestamps that go back within a block: not a block VictoriaMetrics writes.
    body = _get(store, vmnative.NATIVE_PATH, '{__name__="n_counter"}', E, E + 86_400)
    for block in _blocks_at(body):
        at = _types_at(body, block)
        if body[at + 1] in (1, 4):  # values zstd-compressed
            break
    else:
        raise AssertionError("no compressed block")
    size = body[at + 2]  # the timestamps part is a few bytes: its length is one byte
    data = at + 3 + size + 2  # past the values part's length (two bytes: > 127)
    damaged = body[:data + 20] + bytes(b ^ 0x5A for b in body[data + 20:data + 60]) \
        + body[data + 60:]
    with pytest.raises(vmnative.Unreadable):
        vmnative.read(damaged, E, E)
    b = vmnative.decode(body)
    assert (np.diff(b.stamps[:b.lengths[0]]) >= 0).all()


def test_one_instant_with_two_values_in_two_blocks_is_unreadable() -> None:
    labels = {"k": "x"}
    blocks = vmnative.Blocks(0, 0, [labels, dict(labels)], ["k=x", "k=x"], np.array([2, 1]),
                             np.array([T0, T0 + MIN, T0 + MIN]), np.array([1.0, 2.0, 3.0]))
    with pytest.raises(vmnative.Unreadable, match="one instant"):
        vmnative._check_unambiguous(blocks)
    same = vmnative.Blocks(0, 0, [labels, dict(labels)], ["k=x", "k=x"], np.array([2, 1]),
                           np.array([T0, T0 + MIN, T0 + MIN]), np.array([1.0, 2.0, 2.0]))
    vmnative._check_unambiguous(same)  # a copy (an HA pair, a re-import) is no question


@pytest.mark.parametrize("page, version", [
    ('vm_app_version{version="victoria-metrics-20220808-tags-v1.79.5-0-g1", '
     'short_version="v1.79.5"} 1\n', "v1.79.5"),
    ('vm_app_version{version="", short_version=""} 1\n', ""),
    ("# not VictoriaMetrics\nup 1\n", None),
])
def test_the_store_version_from_its_metrics(page: str, version: str | None,
                                            tmp_path: Path) -> None:
    assert vmnative.store_version("go_goroutines 7\n" + page) == version


def test_only_the_three_extreme_mantissas_are_special() -> None:
    """lib/decimal isSpecialValue: above 1<<63-3 or below -1<<63+1; those two are plain."""
    top, bottom = (1 << 63) - 3, -(1 << 63) + 1
    mant = np.array([top, top + 1, top + 2, bottom, bottom - 1, 12], np.int64)
    got = vmnative._floats(mant, np.array([0, -1]), np.array([5, 1]))
    assert got[[0, 3]].tolist() == [float(top), float(bottom)]
    assert got.view(np.int64)[1] == 0x7FF0000000000002  # the stale NaN
    assert got[[2, 4]].tolist() == [np.inf, -np.inf] and got[5] == 12 / 10.0


def test_an_answer_over_the_samples_allowed_is_too_large(store: str) -> None:
    """Whole blocks come whatever hours were asked: the caller bounds what it decodes."""
    body = _get(store, vmnative.NATIVE_PATH, '{__name__="n_gauge"}', E, E)
    total = int(vmnative.decode(body).lengths.sum())
    # More than the instant asked (one sample a series): the blocks that hold it, whole (all
    # 3,020 samples of both series once the store has merged its parts; 533 in one CI run on
    # a loaded machine, before the merge).
    assert 2 < total <= 3020
    assert len(vmnative.read(body, E, E, max_rows=total)) == 2
    with pytest.raises(vmnative.TooLarge, match=f"{total:,} samples"):
        vmnative.read(body, E, E, max_rows=total - 1)


def test_any_damage_is_unreadable_or_a_decoded_answer(store: str) -> None:
    """Bytes of a real answer flipped, dropped or cut at random places (seeded): the decoder
    either decodes the bytes or refuses them as Unreadable / TooLarge; nothing else escapes
    (the caller then reads JSON lines: metering.queryplan)."""
    body = _get(store, vmnative.NATIVE_PATH, '{__name__=~"n_.*"}', E - 86_400,
                E + 40 * 86_400)
    rng = random.Random(27)
    outcomes = {"decoded": 0, "refused": 0}
    for _ in range(400):
        damaged = bytearray(body)
        for _ in range(rng.randint(1, 4)):
            at = rng.randrange(len(damaged))
            how = rng.choice(("flip", "drop", "cut", "byte"))
            if how == "flip":
                damaged[at] ^= 1 << rng.randrange(8)
            elif how == "drop":
                del damaged[at]
            elif how == "cut":
                del damaged[at:]
            else:
                damaged[at] = rng.randrange(256)
            if not damaged:
                break
        try:
            vmnative.read(bytes(damaged), E, E + 86_400)
            outcomes["decoded"] += 1
        except (vmnative.Unreadable, vmnative.TooLarge):
            outcomes["refused"] += 1
    assert outcomes["refused"] > 0, outcomes


def test_label_maps_decoded_before_are_shared_across_answers() -> None:
    """Two answers of one family's series under two recorded names (and a name whose metric
    group holds an escaped byte 1): with one `seen`, the second answer's series take the
    labels decoded for the first (the same objects), and every answer decodes as it does
    alone; a label value with an escaped byte 1 is its own series."""
    def answer(*names: bytes) -> bytes:
        blocks = b"".join(_native_block(n, [T0, T0 + MIN], [1, 2]) for n in names)
        return _zigzag64(T0) + _zigzag64(T0 + 2 * MIN) + blocks
    first = answer(b"gpu_ledger:a:hour\x01node\x01n1\x01uuid\x01G-1\x01",
                   b"gpu_ledger:a:hour\x01node\x01n\x001z\x01uuid\x01G-2\x01")
    second = answer(b"gpu_ledger:b:hour\x01node\x01n1\x01uuid\x01G-1\x01",
                    b"x\x001y\x01node\x01n1\x01uuid\x01G-1\x01",
                    b"gpu_ledger:b:hour\x01node\x01n\x001z\x01uuid\x01G-2\x01")
    seen: Labels = {}
    a, b = vmnative.decode(first, seen=seen), vmnative.decode(second, seen=seen)
    for shared, alone in ((a, vmnative.decode(first)), (b, vmnative.decode(second))):
        assert shared.labels == alone.labels and shared.keys == alone.keys
    assert b.labels[0] is a.labels[0] and b.labels[1] is a.labels[0]
    assert b.labels[2] is a.labels[1] == {"node": "n\x01z", "uuid": "G-2"}
    assert len(seen) == 2
