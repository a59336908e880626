"""Recorded hourly series read from VictoriaMetrics' /api/v1/export/native: the blocks the
store holds, sent as stored (no float formatting, zstd-compressed integers), which costs the
store ~7x less CPU than the JSON lines of metering.vmexport (docs/performance.md, "Read
through VictoriaMetrics' export"). The hourly points are then chosen exactly as from the JSON
lines (metering.vmexport.hourly), and equal them bit for bit (tests/test_vmnative.py).

The format is VictoriaMetrics' internal encoding with no compatibility promise, so it is
decoded only as the version it was read from and checked against (VERIFIED_VERSIONS); a
block this decoder does not know is `Unreadable` (the caller reads JSON lines instead), never
a guess. Read from VictoriaMetrics v1.79.5 (the Debian package 1.79.5+ds1):

- app/vmselect/prometheus/prometheus.go ExportNativeHandler: the answer is the time range
  (encoding.MarshalInt64 of start and end, ms: 8 bytes big-endian each, zig-zag), then per
  block a big-endian uint32 length + MetricName.Marshal, a uint32 length + the block's
  Block.MarshalPortable. Blocks are whole (netstorage.ExportBlocks leaves the time filter to
  the writer, which does not filter) and come from parallel workers in no fixed order; a
  series may have several blocks.
- lib/storage/metric_name.go: the metric name, then key, value, ..., each ended by byte 1,
  with bytes 0/1/2 escaped as 0 '0' / 0 '1' / 0 '2'.
- lib/storage/block.go MarshalPortable: varint MinTimestamp, varint FirstValue, uvarint
  RowsCount, varint Scale (int16), a byte each: timestamps' and values' MarshalType, then
  uvarint-length-prefixed timestamps data and values data (precision bits 64: lossless).
- lib/encoding/encoding.go unmarshalInt64Array, nearest_delta.go, nearest_delta2.go,
  int.go: types 1 zstd(nearest delta2), 2 delta const (one varint), 3 const (no data),
  4 zstd(nearest delta), 5 nearest delta2, 6 nearest delta; varints are zig-zag LEB128
  (at most 10 bytes); nearest delta: first + running sum of the n-1 varints; delta2: the
  deltas are themselves the running sum; sums wrap at 64 bits as Go's int64 does.
- lib/decimal/decimal.go AppendDecimalToFloat: mantissa v with the block's Scale e is
  float64(v) (e = 0), float64(v) / Pow10(-e) (e < 0), float64(v) * Pow10(e) (e > 0), a block
  of zeros is zeros; 1<<63-1 is +Inf, -1<<63 is -Inf, 1<<63-2 the stale NaN
  (0x7ff0000000000002). Pow10 is Go's math.Pow10: tables 1e0..1e31 and 1e0, 1e32, .. 1e288
  (and 1e-0 .. 1e-320), multiplied or divided, +Inf above 308 and 0 below -323.

The JSON export (app/vmselect/netstorage mergeSortBlocks) merges a series' blocks by time;
where two blocks of a series hold different values at one instant its order among them is
the store's, which a reader of blocks in arrival order cannot know: such an answer is
Unreadable too (the JSON lines answer it).
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from metering import vmexport
from metering.matrix import Labels, Matrix
from metering.signals import HOUR_S, series_key

NATIVE_PATH = "/api/v1/export/native"
# Versions (vm_app_version's short_version) whose native blocks this decoder was checked
# against, value for value, beside the JSON export (tests/test_vmnative.py).
VERIFIED_VERSIONS = frozenset({"v1.79.5"})


class Unreadable(ValueError):
    """The native answer holds what this decoder does not know: str() says what."""


class TooLarge(ValueError):
    """The answer's blocks hold more samples than the caller may decode (they are whole
    blocks, up to a month per series, whatever hours were asked)."""


_VERSION = re.compile(r'^vm_app_version\{[^}]*short_version="([^"]*)"', re.M)


def store_version(metrics_text: str) -> str | None:
    """The short version VictoriaMetrics reports on /metrics (`vm_app_version`), '' where it
    reports none (Debian's build), None where there is no such line."""
    m = _VERSION.search(metrics_text)
    return m.group(1) if m else None


@dataclass(frozen=True)
class Blocks:
    """Every block's samples, block after block: `labels`, `keys` (series_key) and `lengths`
    per block (its labels without __name__, its sample count), `stamps` (ms) and `values`
    per sample."""

    start_ms: int
    end_ms: int
    labels: list[dict[str, str]]
    keys: list[str]
    lengths: np.ndarray
    stamps: np.ndarray
    values: np.ndarray


def read(body: bytes, first: int, last: int, max_rows: int | None = None,
         seen: Labels | None = None) -> Matrix:
    """The hourly points (time E = each hour start first..last) of a native answer, as
    metering.vmexport.read gives them from the JSON lines of the same request. `seen`: as
    for `decode`."""
    return points(decode(body, max_rows, seen), first, last)


def points(b: Blocks, first: int, last: int) -> Matrix:
    """The hourly points of decoded blocks (of one answer: several windows may be read from
    one decode)."""
    _check_unambiguous(b, first * 1000, last * 1000 + vmexport.HOUR_MS)
    return vmexport.hourly(b.labels, b.lengths, b.values, b.stamps, first, last, b.keys)


HOURS_BYTES_PER_POINT = 16  # of `Hours`: an int32 series, an int32 hour, a float64 value


@dataclass(frozen=True)
class Hours:
    """The hourly points of a whole period (evaluation hours first..), kept to cut each
    chunk's points from (`window`) instead of choosing them from every block again per chunk:
    a native answer holds whole blocks, so each chunk's choice went over the period's samples
    (a 10,000-GPU month in 11 chunks: about 3x the client CPU of range queries;
    docs/performance.md). Series in series_key order, each one's points in time order."""

    first: int
    labels: list[dict[str, str]]
    keys: list[str]
    sid: np.ndarray  # int32: series of each point
    hour: np.ndarray  # int32: hours after `first`
    v: np.ndarray  # float64

    @property
    def nbytes(self) -> int:
        return self.sid.nbytes + self.hour.nbytes + self.v.nbytes

    def window(self, first: int, last: int) -> Matrix:
        """The points of evaluation hours first..last (hours after self.first), as `points`
        gives them over the same blocks: the same sample chosen for each series-hour, the
        series with a point in the window, in series_key order."""
        lo, rest = divmod(first - self.first, HOUR_S)
        if rest or lo < 0:
            raise ValueError(f"window {first}: not a whole hour from {self.first}")
        hi = (last - self.first) // HOUR_S
        at = np.flatnonzero((self.hour >= lo) & (self.hour <= hi))
        sid = self.sid[at]
        present = np.zeros(len(self.keys), bool)
        present[sid] = True
        kept = np.flatnonzero(present).tolist()
        rank = np.cumsum(present, dtype=np.int64) - 1
        return Matrix([self.labels[i] for i in kept], [self.keys[i] for i in kept], rank[sid],
                      (self.first + self.hour[at].astype(np.int64) * HOUR_S).astype(np.float64),
                      self.v[at])


def hours(b: Blocks, first: int, last: int) -> Hours:
    """The hourly points of evaluation hours first..last of decoded blocks, to cut windows
    from (`Hours.window`)."""
    m = points(b, first, last)
    return Hours(first, m.labels, m.keys, m.sid.astype(np.int32),
                 ((m.t.astype(np.int64) - first) // HOUR_S).astype(np.int32), m.v)


_ZSTD = pa.Codec("zstd")
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_ZSTD_TYPES = (1, 4)
_DELTA2_TYPES = (1, 5)
_DELTA_TYPES = (4, 6)
_DELTA_CONST, _CONST = 2, 3
_U32 = struct.Struct(">I").unpack_from


def decode(body: bytes, max_rows: int | None = None, seen: Labels | None = None) -> Blocks:
    """Every block of a native answer, samples as VictoriaMetrics reads them (its floats bit
    for bit); Unreadable on anything else. Python walks the blocks' two length prefixes;
    headers, varints and floats are decoded for all blocks at once (numpy). `seen`: label
    maps decoded before, by their labels' bytes without the metric name, added to: a
    family's signals are one set of series under several recorded names, so a node group's
    labels are decoded once, not once per signal (the caller's, e.g. for one group)."""
    if len(body) < 16:
        raise Unreadable(f"{len(body)} bytes: not VictoriaMetrics' native export")
    start_ms, end_ms = (_unzigzag(int.from_bytes(body[i:i + 8], "big")) for i in (0, 8))
    names: dict[bytes, int] = {}
    name_of: list[int] = []
    block_at: list[int] = []
    block_end: list[int] = []
    pos, end = 16, len(body)
    try:
        while pos < end:
            at = pos + 4 + _U32(body, pos)[0]
            name = body[pos + 4:at]
            pos = at + 4 + _U32(body, at)[0]
            name_of.append(names.setdefault(name, len(names)))
            block_at.append(at + 4)
            block_end.append(pos)
    except struct.error:
        raise Unreadable("truncated between blocks") from None
    if pos != end:
        raise Unreadable("truncated block")
    named = [_labels(n) for n in names] if seen is None else [_known(n, seen) for n in names]
    labels = [named[i][0] for i in name_of]
    keys = [named[i][1] for i in name_of]
    if not block_at:
        return Blocks(start_ms, end_ms, [], [], np.zeros(0, np.int64), np.zeros(0, np.int64),
                      np.zeros(0))
    raw = np.frombuffer(body, np.uint8)
    h = _headers(raw, np.array(block_at, np.int64), np.array(block_end, np.int64))
    lengths = h["rows"]
    if max_rows is not None and int(lengths.sum()) > max_rows:
        raise TooLarge(f"{int(lengths.sum()):,} samples")
    # Parts (timestamps, values) alternate: their types, firsts, bytes.
    types = np.stack([h["ts_type"], h["v_type"]], axis=1).ravel()
    firsts = np.stack([h["t0"], h["v0"]], axis=1).ravel()
    offs = np.stack([h["ts_at"], h["v_at"]], axis=1).ravel()
    sizes = np.stack([h["ts_size"], h["v_size"]], axis=1).ravel()
    rows = np.repeat(lengths, 2)
    if ((types == _CONST) & (sizes > 0)).any():
        raise Unreadable("data in a constant block")
    if (np.isin(types, _DELTA2_TYPES) & (rows < 2)).any():
        raise Unreadable("a delta2 block of one row")
    packed = np.flatnonzero(np.isin(types, _ZSTD_TYPES))
    if len(packed):  # decompressed one by one, after the answer's bytes
        plain = [_unzstd(body[o:o + n]) for o, n in
                 zip(offs[packed].tolist(), sizes[packed].tolist(), strict=True)]
        extra = np.frombuffer(b"".join(plain), np.uint8)
        offs[packed] = len(raw) + np.concatenate(([0], np.cumsum([len(x) for x in plain])[:-1]))
        sizes[packed] = [len(x) for x in plain]
        raw = np.concatenate([raw, extra])
    data = raw[_ranges(offs, sizes)]
    ints = _int_arrays(rows, firsts, types, data, sizes)
    # Blocks' timestamps and values alternate in `ints`: cut them apart again.
    is_ts = np.repeat(np.arange(2 * len(lengths)) % 2 == 0, rows)
    stamps, mantissas = ints[is_ts], ints[~is_ts]
    back = np.flatnonzero(np.diff(stamps) < 0) + 1
    if not np.isin(back, np.cumsum(lengths)).all():  # VictoriaMetrics sorts a block's rows
        raise Unreadable("a block's timestamps go back")
    values = _floats(mantissas, h["scale"], lengths)
    return Blocks(start_ms, end_ms, labels, keys, lengths, stamps, values)


def _unzigzag(u: int) -> int:
    return (u >> 1) ^ -(u & 1)


_SHIFTS = (np.arange(10, dtype=np.uint64) * np.uint64(7))


def _uvarints_at(raw: np.ndarray, ends: np.ndarray, at: np.ndarray, stop: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray]:
    """The unsigned LEB128 varint at each position `at` (each before its `stop`), as uint64,
    and the position after each. `ends`: positions of the bytes < 0x80 in `raw`."""
    i = np.searchsorted(ends, at)
    if (i >= len(ends)).any():
        raise Unreadable("a varint is cut")
    last = ends[i]
    n = last - at + 1
    if (n > 10).any() or (last >= stop).any():
        raise Unreadable("a block header is cut or holds a varint over 10 bytes")
    k = np.arange(10)
    idx = np.minimum(at[:, None] + k, len(raw) - 1)
    b = (raw[idx] & 0x7F).astype(np.uint64)
    b[k >= n[:, None]] = 0
    out: np.ndarray = (b << _SHIFTS).sum(axis=1, dtype=np.uint64)
    return out, last + 1


def _headers(raw: np.ndarray, at: np.ndarray, stop: np.ndarray) -> dict[str, np.ndarray]:
    """Block.MarshalPortable's fields of every block (starting at `at`, ending at `stop`):
    varint MinTimestamp, varint FirstValue, uvarint RowsCount, varint Scale, the two marshal
    types, uvarint-prefixed timestamps data and values data (where each starts, its size)."""
    ends = np.flatnonzero(raw < 0x80)
    out: dict[str, np.ndarray] = {}
    pos = at
    for field, signed in (("t0", True), ("v0", True), ("rows", False), ("scale", True)):
        u, pos = _uvarints_at(raw, ends, pos, stop)
        out[field] = _zigzag(u) if signed else u.astype(np.int64)
    if (pos + 2 > stop).any():
        raise Unreadable("a block header is cut")
    out["ts_type"], out["v_type"] = raw[pos].astype(np.int64), raw[pos + 1].astype(np.int64)
    pos = pos + 2
    for part in ("ts", "v"):
        u, pos = _uvarints_at(raw, ends, pos, stop)
        if (u > (stop - pos).astype(np.uint64)).any():
            raise Unreadable("a block's data is cut")
        out[f"{part}_at"], out[f"{part}_size"] = pos, u.astype(np.int64)
        pos = pos + out[f"{part}_size"]
    if (pos != stop).any():
        raise Unreadable("bytes after a block's data")
    rows, scale = out["rows"], out["scale"]
    if (rows < 1).any() or (rows > 0xFFFF_FFFF).any() or (scale < -32768).any() \
            or (scale > 32767).any():
        raise Unreadable("a block of no rows, too many, or a scale beyond int16")
    for t in (out["ts_type"], out["v_type"]):
        if ((t < 1) | (t > 6)).any():
            raise Unreadable(f"block encoding {int(t[(t < 1) | (t > 6)][0])} (known: 1-6)")
    return out


def _unzstd(data: bytes) -> bytes:
    """One zstd frame whose header says its decompressed size (VictoriaMetrics writes it;
    Arrow's codec needs it)."""
    if len(data) < 6 or data[:4] != _ZSTD_MAGIC:
        raise Unreadable("a compressed block is not a zstd frame")
    fhd = data[4]
    single = fhd >> 5 & 1
    fcs_size = (1 if single else 0, 2, 4, 8)[fhd >> 6]
    at = 5 + (0 if single else 1) + (0, 1, 2, 4)[fhd & 3]
    if not fcs_size or at + fcs_size > len(data):
        raise Unreadable("a zstd frame without its decompressed size")
    size = int.from_bytes(data[at:at + fcs_size], "little") + (256 if fcs_size == 2 else 0)
    if size > 16 * len(data) + (1 << 20):  # a block is ~8k rows of <= 10 bytes
        raise Unreadable(f"a zstd frame of {size} bytes")
    try:
        out: bytes = _ZSTD.decompress(data, decompressed_size=size, asbytes=True)
    except (pa.ArrowException, OSError, ValueError) as exc:  # Arrow: OSError on corruption
        raise Unreadable(f"zstd: {exc}") from None
    return out


def _zigzag(u: np.ndarray) -> np.ndarray:
    out: np.ndarray = ((u >> np.uint64(1)) ^ (np.uint64(0) - (u & np.uint64(1)))).view(np.int64)
    return out


def _int_arrays(rows: np.ndarray, firsts: np.ndarray, types: np.ndarray, raw: np.ndarray,
                sizes: np.ndarray) -> np.ndarray:
    """The int64 arrays of parts with `rows` items each, one after another, from their
    varints (`raw`, `sizes` bytes per part): all varints decoded at once, then running sums
    per part (numpy, no Python per item)."""
    n_var = np.where(types == _CONST, 0, np.where(types == _DELTA_CONST, 1, rows - 1))
    ends = raw < 0x80
    if len(raw) and not ends[-1]:
        raise Unreadable("a varint is cut")
    # Each part must end on a varint's end and hold exactly its count of varints.
    stops = np.cumsum(sizes)
    nonempty = sizes > 0
    if nonempty.any() and not ends[stops[nonempty] - 1].all():
        raise Unreadable("a block's varints are cut")
    ends_before = np.concatenate(([0], np.cumsum(ends)))  # varints ended before each byte
    per_part = ends_before[stops] - ends_before[stops - sizes]
    if not np.array_equal(per_part, n_var):
        raise Unreadable("a block holds not as many values as rows")
    decoded = _varints(raw, ends)
    # Per part: [first, delta, ...] (delta const: its delta repeated; const: zeros), then
    # one running sum per part gives the items.
    steps = np.zeros(int(rows.sum()), np.int64)
    part_start = np.concatenate(([0], np.cumsum(rows)[:-1]))
    steps[part_start] = firsts
    var_start = np.concatenate(([0], np.cumsum(n_var)[:-1]))
    delta = np.isin(types, _DELTA_TYPES + _DELTA2_TYPES)
    if delta.any():
        idx = _ranges(part_start[delta] + 1, rows[delta] - 1)
        src = _ranges(var_start[delta], rows[delta] - 1)
        d = decoded[src]
        two = np.repeat(np.isin(types[delta], _DELTA2_TYPES), rows[delta] - 1)
        if two.any():  # delta2: the deltas are the running sums of the varints
            d[two] = _segment_cumsum(d[two], (rows[delta] - 1)[np.isin(types[delta],
                                                                       _DELTA2_TYPES)])
        steps[idx] = d
    dc = types == _DELTA_CONST
    if dc.any():
        steps[_ranges(part_start[dc] + 1, rows[dc] - 1)] = np.repeat(decoded[var_start[dc]],
                                                                     rows[dc] - 1)
    return _segment_cumsum(steps, rows)


def _varints(raw: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Zig-zag LEB128 varints (VictoriaMetrics' MarshalVarInt64s) of `raw`, `ends` marking
    each one's last byte; sums wrap at 64 bits as Go's do."""
    if not len(raw):
        return np.zeros(0, np.int64)
    last = np.flatnonzero(ends)
    begin = np.concatenate(([0], last[:-1] + 1))
    if (last - begin).max() >= 10:
        raise Unreadable("a varint longer than 10 bytes")
    shift = (np.arange(len(raw)) - np.repeat(begin, last - begin + 1)) * 7
    u = np.add.reduceat((raw & 0x7F).astype(np.uint64) << shift.astype(np.uint64), begin)
    return _zigzag(u)


def _ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """start, start+1, .. start+count-1 of each (start, count), one after another."""
    total = int(counts.sum())
    if not total:
        return np.zeros(0, np.int64)
    offs = np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts)
    out: np.ndarray = np.repeat(starts, counts) + offs
    return out


def _segment_cumsum(a: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Running sums restarting at each segment of `counts` items (int64 sums wrap, and the
    wrapped differences are exact: arithmetic modulo 2^64)."""
    with np.errstate(over="ignore"):
        c = np.cumsum(a)
        before = np.concatenate(([0], c[np.cumsum(counts)[:-1] - 1])) if len(counts) \
            else np.zeros(0, np.int64)
        out: np.ndarray = c - np.repeat(before.astype(np.int64), counts)
    return out


_POW10 = [float(f"1e{i}") for i in range(32)]
_POW10_32 = [float(f"1e{32 * i}") for i in range(10)]
_POW10_NEG32 = [float(f"1e-{32 * i}") for i in range(11)]
_V_INF_POS = (1 << 63) - 1
_V_STALE_NAN = (1 << 63) - 2
_V_INF_NEG = -(1 << 63)
_V_MAX, _V_MIN = (1 << 63) - 3, -(1 << 63) + 1  # the largest and smallest plain mantissas
STALE_NAN = struct.unpack("<d", (0x7FF0000000000002).to_bytes(8, "little"))[0]


def _go_pow10(n: int) -> float:
    """Go's math.Pow10, products of its tables (not Python's correctly rounded 10**n)."""
    if 0 <= n <= 308:
        return _POW10_32[n // 32] * _POW10[n % 32]
    if -323 <= n <= 0:
        return _POW10_NEG32[-n // 32] / _POW10[-n % 32]
    return float("inf") if n > 0 else 0.0


def _floats(mant: np.ndarray, scales: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """decimal.AppendDecimalToFloat block by block, vectorized."""
    out = mant.astype(np.float64)
    e = np.repeat(scales, lengths)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
        for s in np.unique(scales[scales != 0]).tolist():
            at = e == s
            if s < 0:
                out[at] = out[at] / _go_pow10(-s)
            else:
                out[at] = out[at] * _go_pow10(s)
    # A block of zeros is zeros whatever its scale (0 * Pow10(>308) would be NaN).
    nonzero = np.add.reduceat((mant != 0).astype(np.int64),
                              np.concatenate(([0], np.cumsum(lengths)[:-1]))) > 0
    out[~np.repeat(nonzero, lengths)] = 0.0
    special = (mant > _V_MAX) | (mant < _V_MIN)  # decimal.isSpecialValue
    if special.any():
        sv = mant[special]
        out[special] = np.where(sv == _V_INF_POS, np.inf,
                                np.where(sv == _V_INF_NEG, -np.inf, STALE_NAN))
    return out


def _labels(name: bytes) -> tuple[dict[str, str], str]:
    """MetricName.Marshal's labels (without the metric name, as series_key leaves it) and
    their series_key."""
    try:
        text = name.decode()
    except UnicodeDecodeError:
        raise Unreadable("a label not in UTF-8") from None
    parts = text.split("\x01")
    if len(parts) < 2 or parts[-1] or len(parts) % 2:
        raise Unreadable("a metric name not as VictoriaMetrics writes it")
    if "\x00" in text:
        parts = [_unescape(p) for p in parts]
    names, values = parts[1:-1:2], parts[2:-1:2]
    pairs = list(zip(names, values, strict=True))
    labels = dict(pairs)
    if len(labels) == len(pairs) and "__name__" not in labels:  # series_key, in C loops
        return labels, "\x1f".join(map("=".join, sorted(pairs)))
    return labels, series_key(labels)


def _known(name: bytes, seen: Labels) -> tuple[dict[str, str], str]:
    """`_labels` of a metric name, from `seen` where its labels were decoded before. The
    key is the bytes after the metric name (its first unescaped byte 1 ends it), after a
    byte 1 that no JSON label map (metering.matrix, metering.vmexport: keys of the same
    `seen`) begins with."""
    tags = b"\x01" + name[name.find(b"\x01") + 1:]
    got = seen.get(tags)
    if got is None:
        got = seen[tags] = _labels(name)
    return got


def _unescape(text: str) -> str:
    """Bytes 0, 1, 2 of a label written as 0 '0', 0 '1', 0 '2'."""
    out, rest = [], text
    while (i := rest.find("\x00")) >= 0:
        if i + 1 >= len(rest) or rest[i + 1] not in "012":
            raise Unreadable("a bad escape in a metric name")
        out += [rest[:i], chr(ord(rest[i + 1]) - 0x30)]
        rest = rest[i + 2:]
    return "".join([*out, rest])


def _check_unambiguous(b: Blocks, lo: int = -(1 << 63), hi: int = (1 << 63) - 1) -> None:
    """Unreadable where two blocks of a series hold different values at one instant in
    [lo, hi) ms (the JSON export's order among them is the store's merge order, not the
    arrival order)."""
    if len(b.keys) < 2:
        return
    ids: dict[str, int] = {}
    block_sid = np.fromiter((ids.setdefault(k, len(ids)) for k in b.keys), np.int64,
                            len(b.keys))
    if len(ids) == len(b.keys):
        return  # one block per series
    # Only samples of series with several blocks, in the window, are in question.
    several = np.repeat(np.bincount(block_sid)[block_sid] > 1, b.lengths)
    at = np.flatnonzero(several & (b.stamps >= lo) & (b.stamps < hi))
    sid = np.repeat(block_sid, b.lengths)[at]
    blk = np.repeat(np.arange(len(b.keys)), b.lengths)[at]
    stamps = b.stamps[at]
    order = np.lexsort((stamps, sid))
    s, t, k = sid[order], stamps[order], blk[order]
    v = b.values[at][order].view(np.int64)
    if not len(s):
        return
    # Groups of samples of one series at one instant: fine unless they span blocks and
    # differ in value.
    start = np.flatnonzero(np.concatenate(([True], (s[1:] != s[:-1]) | (t[1:] != t[:-1]))))
    if len(start) == len(s):
        return
    spans = np.minimum.reduceat(k, start) != np.maximum.reduceat(k, start)
    differ = np.minimum.reduceat(v, start) != np.maximum.reduceat(v, start)
    if (spans & differ).any():
        raise Unreadable("two blocks of a series hold different values at one instant")
