"""Facts from an OpenMetrics file of timestamped samples, as `promtool tsdb
create-blocks-from openmetrics` takes it: `name{labels} value timestamp_seconds`, `# EOF`.

The file is read once (only the families the facts need, only samples in the period), then
each chunk is bucketed into hours with the same (H, H+1h] windows a Prometheus range query
uses, so both sources give the same signals and therefore the same fact rows.
"""

from __future__ import annotations

import re
from array import array
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa

from metering.errors import InputError
from metering.matrix import Matrix
from metering.period import Period
from metering.selector import DEFAULT_SELECTOR, Screened, Selector
from metering.signals import FAMILIES, SIGNALS, VALUE_RANGE, SignalSpec, series_key

_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\\n]|\\.)*)"\s*(,|\})')
_UNESCAPE = re.compile(r"\\(.)")
_ESCAPES = {"n": "\n", "\\": "\\", '"': '"'}


_FORKED: list[duckdb.DuckDBPyConnection] = []  # the parent's connections, in a worker


class OpenMetricsError(InputError):
    """The file is unreadable or a line is not an OpenMetrics sample."""


@dataclass
class _Family:
    series: list[dict[str, str]] = field(default_factory=list)
    sid: array[int] = field(default_factory=lambda: array("q"))
    t_ms: array[int] = field(default_factory=lambda: array("q"))
    value: array[float] = field(default_factory=lambda: array("d"))


def _parse_labels(text: str, start: int, where: str) -> tuple[dict[str, str], int]:
    """Labels from text[start] == '{'; returns them and the index just past '}'."""
    labels: dict[str, str] = {}
    pos = start + 1
    if text.startswith("}", pos):
        return labels, pos + 1
    while True:
        m = _LABEL.match(text, pos)
        if m is None:
            raise OpenMetricsError(f"{where}: expected labels like {{name=\"value\",...}}, got "
                                   f"{text[start:start + 80].rstrip()!r}")
        raw = m.group(2)
        labels[m.group(1)] = (_UNESCAPE.sub(lambda e: _ESCAPES.get(e.group(1), e.group(0)), raw)
                              if "\\" in raw else raw)
        pos = m.end()
        if m.group(3) == "}":
            return labels, pos
        if text.startswith("}", pos):  # trailing comma
            return labels, pos + 1


class OpenMetricsSource:
    """A chunked source over one file; `fetch(chunk)` returns the chunk's signals."""

    queries = 0  # no PromQL: kept for the same report as the Prometheus source

    def __init__(self, path: str, period: Period, selector: Selector = DEFAULT_SELECTOR
                 ) -> None:
        self.path = path
        self.selector = selector  # only these series are metered, as from Prometheus
        self.screened = Screened()
        self.name = f"openmetrics:{Path(path).resolve()}"
        # Hour H needs samples in (H, H+1h]; energy also needs the hour before the period.
        self._lo_ms = int(period.start.timestamp() * 1000) - 3_600_000
        self._hi_ms = int(period.end.timestamp() * 1000)
        self.families = self._read()
        self._series_keys: dict[str, list[str]] = {}
        self._con = self._connect()

    def _connect(self) -> duckdb.DuckDBPyConnection:
        con = duckdb.connect(":memory:")
        for name, fam in self.families.items():
            con.register(f"raw_{name}", pa.table({
                "sid": np.frombuffer(fam.sid, dtype=np.int64),
                "t_ms": np.frombuffer(fam.t_ms, dtype=np.int64),
                "value": np.frombuffer(fam.value, dtype=np.float64)}))
        return con

    def after_fork(self) -> None:
        """In a forked worker (metering.workers): a connection of its own, not the parent's.
        The parent's copy is kept, never closed or collected here: its destructor would
        touch DuckDB state of threads that were not forked (a segfault)."""
        _FORKED.append(self._con)
        self._con = self._connect()

    def samples(self) -> int:
        return sum(len(f.t_ms) for f in self.families.values())

    def _read(self) -> dict[str, _Family]:
        fams: dict[str, _Family] = {name: _Family() for name in FAMILIES}
        # Label text -> (family, series id): labels are parsed once per series, not per line.
        # A series outside the selector gets id -1: its lines are skipped.
        known: dict[tuple[str, str], int] = {}
        lo, hi = self._lo_ms, self._hi_ms
        try:
            fh = open(self.path, encoding="utf-8")  # noqa: SIM115 - closed below
        except OSError as exc:
            raise OpenMetricsError(f"{self.path}: cannot read: {exc.strerror}") from None
        with fh:
            try:
                for lineno, line in enumerate(fh, 1):
                    if not line or line[0] == "#" or line == "\n":
                        if line.startswith("# EOF"):
                            break
                        continue
                    sp = line.find(" ")
                    brace = line.find("{", 0, sp if sp >= 0 else len(line))
                    name = line[:brace] if brace >= 0 else line[:sp]
                    fam = fams.get(name)
                    if fam is None:
                        continue
                    where = f"{self.path}:{lineno}"
                    if brace >= 0:
                        close = line.find("} ", brace)
                        key = (name, line[brace:close + 1])
                        sid = known.get(key) if close >= 0 else None
                        if sid is None:
                            labels, end = _parse_labels(line, brace, where)
                            key = (name, line[brace:end])
                            sid = known.get(key)
                            if sid is None:
                                sid = known[key] = self._admit(fam, name, labels)
                        rest = line[len(key[1]) + brace:]
                    else:
                        key = (name, "")
                        sid = known.get(key)
                        if sid is None:
                            sid = known[key] = self._admit(fam, name, {})
                        rest = line[sp:]
                    parts = rest.split(None, 2)
                    if len(parts) < 2 or parts[1] == "#":
                        raise OpenMetricsError(
                            f"{where}: expected `{name}{{...}} VALUE TIMESTAMP` (backfill files "
                            f"need a timestamp on every sample), got {line.strip()[:120]!r}")
                    try:
                        value = float(parts[0])
                        t_ms = round(float(parts[1]) * 1000)
                    except (ValueError, OverflowError):
                        raise OpenMetricsError(
                            f"{where}: expected a number for the value and the timestamp "
                            f"(seconds), got {parts[0]!r} {parts[1]!r}") from None
                    if sid < 0 or not lo < t_ms <= hi:
                        continue
                    vlo, vhi = VALUE_RANGE[name]
                    if not vlo <= value <= vhi:  # NaN, Inf, out of range: never priced
                        if t_ms > self._lo_ms + 3_600_000:  # the hour before is not metered
                            self.screened.drop(((t_ms + 3_599_999) // 3_600_000 - 1) * 3600)
                    else:
                        fam.sid.append(sid)
                        fam.t_ms.append(t_ms)
                        fam.value.append(value)
            except UnicodeDecodeError as exc:
                raise OpenMetricsError(f"{self.path}: expected UTF-8 text: {exc}") from None
        return fams

    def _admit(self, fam: _Family, name: str, labels: dict[str, str]) -> int:
        """A new series' id, or -1 (skipped, reported) when the selector leaves it out."""
        if not self.selector.matches(labels):
            self.screened.saw_foreign(name, labels)
            return -1
        fam.series.append(labels)
        return len(fam.series) - 1

    def fetch(self, chunk: Period) -> Iterator[list[tuple[SignalSpec, Matrix]]]:
        """Signals for the chunk's hours and the hour before it (energy needs it), in one
        node group: the file is in memory already."""
        yield list(self._signals(chunk))

    def grouped(self, chunk: Period) -> bool:
        return False  # one group: the file is read whole

    def _signals(self, chunk: Period) -> Iterator[tuple[SignalSpec, Matrix]]:
        lo = int(chunk.start.timestamp() * 1000) - 3_600_000
        hi = int(chunk.end.timestamp() * 1000)
        by_family: dict[str, dict[str, np.ndarray]] = {}
        for name, fam in self.families.items():
            if not fam.series:
                continue
            # Sample at t belongs to hour H with H < t <= H+1h (Prometheus's window at H+1h).
            by_family[name] = self._con.execute(
                f"""SELECT sid, ((t_ms + 3599999) // 3600000 - 1) * 3600 AS hour_s,
                           count(*)::DOUBLE AS count, sum(value) AS sum, max(value) AS max,
                           min(value) AS min, arg_max(value, t_ms) AS last,
                           max(t_ms) / 1000.0 AS tlast
                    FROM raw_{name} WHERE t_ms > $lo AND t_ms <= $hi
                    GROUP BY sid, hour_s ORDER BY sid, hour_s""",
                {"lo": lo, "hi": hi}).fetchnumpy()
        for spec in SIGNALS:
            agg = by_family.get(spec.family)
            if agg is None or len(agg["sid"]) == 0:
                continue
            series = self.families[spec.family].series
            sid, hour_s, value = agg["sid"], agg["hour_s"], agg[spec.func]
            if spec.nonempty:  # what the PromQL selector leaves out (e.g. mig_uuid!="")
                keep = np.fromiter((spec.keeps(m) for m in series), np.bool_, len(series))[sid]
                sid, hour_s, value = sid[keep], hour_s[keep], value[keep]
            yield spec, Matrix(series, self._keys(spec.family), sid.astype(np.int64),
                               hour_s.astype(np.float64), value.astype(np.float64))

    def _keys(self, family: str) -> list[str]:
        """series_key of each series of the family, once per run."""
        keys = self._series_keys.get(family)
        if keys is None:
            keys = self._series_keys[family] = [series_key(m)
                                                for m in self.families[family].series]
        return keys

    def prefetching(self, chunks: Sequence[Period]) -> AbstractContextManager[None]:
        """The file is parsed already: nothing to read ahead."""
        return nullcontext()

    def close(self) -> None:
        self._con.close()
