"""Render one sample cycle to the Prometheus text format and to OpenMetrics.

Rendering happens once per sample cycle on the sampler thread; a scrape only picks the cached
bytes (and a gzip of them, made on first request). This is why a scrape costs microseconds
whatever the node size.
"""

from __future__ import annotations

import gzip
import math
import re
import threading
from collections.abc import Iterable, Sequence

from exporter.metrics import FAMILIES, Family, Kind

_LABEL_NAME_BAD = re.compile(r"[^a-zA-Z0-9_]")

Sample = tuple[tuple[str, ...], float, tuple[tuple[str, str], ...]]


def escape_label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def pod_label_name(name: str) -> str:
    """Kubernetes label key -> Prometheus label name, as kube-state-metrics does."""
    return "label_" + _LABEL_NAME_BAD.sub("_", name)


def format_value(value: float) -> str:
    value = float(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value.is_integer() and abs(value) < 2**53:
        return str(int(value))
    return repr(value)


def _label_block(names: Sequence[str], values: Sequence[str],
                 pod_labels: Iterable[tuple[str, str]]) -> str:
    # Empty values are omitted: Prometheus treats an empty label as an absent one.
    parts = [f'{n}="{escape_label_value(v)}"' for n, v in zip(names, values, strict=True) if v]
    seen = set(names)
    for key, val in pod_labels:
        name = pod_label_name(key)
        if val and name not in seen:
            seen.add(name)
            parts.append(f'{name}="{escape_label_value(val)}"')
    return "{" + ",".join(parts) + "}" if parts else ""


def sample_lines(fam: Family, rows: Iterable[Sample], timestamp: float | None = None) -> str:
    """The sample lines of one family; with a timestamp (seconds) for OpenMetrics history."""
    suffix = "\n" if timestamp is None else f" {format_value(round(timestamp, 3))}\n"
    return "".join(f"{fam.name}{_label_block(fam.labels, labels, pod_labels)} "
                   f"{format_value(value)}{suffix}" for labels, value, pod_labels in rows)


def family_header(fam: Family, openmetrics: bool) -> str:
    if openmetrics and _is_info(fam):
        fam_name, type_name = fam.name[: -len("_info")], "info"
    elif openmetrics:
        fam_name, type_name = fam.openmetrics_name, fam.kind.value
    else:
        fam_name, type_name = fam.name, fam.kind.value
    return f"# HELP {fam_name} {escape_help(fam.help)}\n# TYPE {fam_name} {type_name}\n"


def _is_info(fam: Family) -> bool:
    return fam.kind is Kind.GAUGE and fam.name.endswith("_info")


def render(samples: dict[str, list[Sample]], openmetrics: bool = False,
           families: Sequence[Family] = FAMILIES) -> bytes:
    out: list[str] = []
    for fam in families:
        rows = samples.get(fam.name)
        if not rows:
            continue
        out.append(family_header(fam, openmetrics))
        out.append(sample_lines(fam, rows))
    if openmetrics:
        out.append("# EOF\n")
    return "".join(out).encode()


class Rendering:
    """The immutable exposition of one cycle. Each format (and its gzip) is made once, on
    first use; `eager` renders the text format up front, on the sampler thread, so a scrape
    finds it ready."""

    def __init__(self, samples: dict[str, list[Sample]], eager: bool = True) -> None:
        self.samples = samples
        self._cache: dict[tuple[bool, bool], bytes] = {}
        self._lock = threading.Lock()
        if eager:
            self.body(False, False)

    def body(self, openmetrics: bool, gzipped: bool) -> bytes:
        key = (openmetrics, gzipped)
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        with self._lock:
            if key not in self._cache:
                plain = self._cache.get((openmetrics, False))
                if plain is None:
                    plain = render(self.samples, openmetrics)
                    self._cache[(openmetrics, False)] = plain
                if gzipped:
                    self._cache[key] = gzip.compress(plain, compresslevel=5)
            return self._cache[key]
