"""Which series are GPU Ledger's: a PromQL label-matcher list applied to every metered family.

Without one, any pod that Prometheus scrapes (annotation discovery scrapes whatever asks) could
publish `gpu_info` / `gpu_container_allocation` series and get a GPU that does not exist billed
to any team. Metering reads only the series the selector matches; the default matches the
shipped deployment, whose exporter is scraped as job `gpu-ledger-exporter` (the headless
Service's name under the ServiceMonitor, the job name in docs/operations.md without it).

One definition serves both sources: `promql()` goes inside a PromQL selector's braces for
Prometheus, `matches()` filters an OpenMetrics file's series the same way, and `complement()`
lists matcher sets whose union is every series the selector leaves out (for the report of
series that look like GPU Ledger's but come from elsewhere).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum

_SPACE = re.compile(r"\s+")
_COMMA = re.compile(r"\s*,")
_MATCHER = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*("(?:[^"\\]|\\.)*")')
DEFAULT_SELECTOR_TEXT = 'job=~"gpu-ledger-exporter|"'


class SelectorError(ValueError):
    """A selector that is not a list of PromQL label matchers."""


class Op(Enum):
    EQ = "="
    NE = "!="
    RE = "=~"
    NRE = "!~"

    def negated(self) -> Op:
        return {Op.EQ: Op.NE, Op.NE: Op.EQ, Op.RE: Op.NRE, Op.NRE: Op.RE}[self]


@dataclass(frozen=True)
class Matcher:
    label: str
    op: Op
    value: str

    def matches(self, labels: Mapping[str, str]) -> bool:
        """As Prometheus does: a missing label is the empty string; regexes are anchored."""
        have = labels.get(self.label, "")
        if self.op in (Op.EQ, Op.NE):
            return (have == self.value) == (self.op is Op.EQ)
        return (re.fullmatch(self.value, have) is not None) == (self.op is Op.RE)

    def negated(self) -> Matcher:
        return Matcher(self.label, self.op.negated(), self.value)

    def promql(self) -> str:
        return f"{self.label}{self.op.value}{_quote(self.value)}"


@dataclass(frozen=True)
class Selector:
    matchers: tuple[Matcher, ...]

    @classmethod
    def parse(cls, text: str) -> Selector:
        """`job="gpu-ledger-exporter",namespace=~"gpu-.*"`, braces optional; empty: every
        series."""
        body = text.strip()
        if body.startswith("{") and body.endswith("}"):
            body = body[1:-1]
        matchers: list[Matcher] = []
        pos = 0
        while True:
            m = _SPACE.match(body, pos)
            pos = m.end() if m else pos
            if pos >= len(body):
                break
            m = _MATCHER.match(body, pos)
            if m is None:
                raise SelectorError(f"selector {text!r}: expected label matchers like "
                                    f'job="gpu-ledger-exporter" (=, !=, =~, !~, values in '
                                    f"double quotes), stuck at {body[pos:pos + 30]!r}")
            value = _unquote(m.group(3))
            op = Op(m.group(2))
            if op in (Op.RE, Op.NRE):
                try:
                    re.compile(value)
                except re.error as exc:
                    raise SelectorError(f"selector {text!r}: {m.group(1)}: not a regular "
                                        f"expression: {exc}") from None
            matchers.append(Matcher(m.group(1), op, value))
            pos = m.end()
            m = _COMMA.match(body, pos)
            if m is None:
                if body[pos:].strip():
                    raise SelectorError(f"selector {text!r}: expected a comma between "
                                        f"matchers at {body[pos:pos + 30]!r}")
                break
            pos = m.end()
        return cls(tuple(matchers))

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(m.matches(labels) for m in self.matchers)

    def promql(self) -> str:
        """The matchers for inside a selector's braces ('' for none)."""
        return ",".join(m.promql() for m in self.matchers)

    def complement(self) -> list[Matcher]:
        """Matchers whose union is every series this selector does not match (De Morgan)."""
        return [m.negated() for m in self.matchers]

    def __str__(self) -> str:
        return "{" + self.promql() + "}"




def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _unquote(quoted: str) -> str:
    return re.sub(r"\\(.)", lambda e: {"n": "\n"}.get(e.group(1), e.group(1)), quoted[1:-1])


@dataclass
class Screened:
    """What a source kept out of the facts, for the run's coverage: values that are not
    plausible (NaN, Inf, not a number, out of the family's range) and series outside the
    selector that look like GPU Ledger's (a metered family name)."""

    dropped: dict[int, int] = field(default_factory=dict)  # hour start (epoch s) -> values
    # (family, job, instance) -> series: who else publishes GPU Ledger's families
    foreign: dict[tuple[str, str, str], int] = field(default_factory=dict)
    unchecked: str = ""  # why foreign series could not be listed, if they could not
    _seen: set[tuple[tuple[str, str], ...]] = field(default_factory=set, repr=False)

    def drop(self, hour_s: int, n: int = 1) -> None:
        self.dropped[hour_s] = self.dropped.get(hour_s, 0) + n

    def dropped_in(self, start_s: int, end_s: int) -> dict[int, int]:
        return {h: n for h, n in self.dropped.items() if start_s <= h < end_s}

    def saw_foreign(self, family: str, labels: Mapping[str, str]) -> None:
        ident = (("__name__", family), *sorted(labels.items()))
        if ident in self._seen:
            return
        if len(self._seen) < MAX_FOREIGN_SERIES:
            self._seen.add(ident)
        key = (family, labels.get("job", ""), labels.get("instance", ""))
        self.foreign[key] = self.foreign.get(key, 0) + 1

    def describe_foreign(self, limit: int = 5) -> str:
        """`gpu_info from job="kubernetes-pods" instance="10.0.0.9:8080" (1 series), ...`."""
        parts = [f'{fam} from job="{job}" instance="{inst}" ({n} series)'
                 for (fam, job, inst), n in sorted(self.foreign.items(),
                                                    key=lambda kv: (-kv[1], kv[0]))]
        more = f", and {len(parts) - limit} more" if len(parts) > limit else ""
        return ", ".join(parts[:limit]) + more


MAX_FOREIGN_SERIES = 100_000  # series remembered to count each once across chunks


DEFAULT_SELECTOR = Selector.parse(DEFAULT_SELECTOR_TEXT)
# The default for a period the store scraped in (it has `up` series): the exporter's job. There a
# series without a job label is no proof of anything: with `honor_labels: true` a target (a
# Pushgateway, a federated Prometheus, any pod) that exposes job="" has its series stored
# with no job label at all. metering.prometheus_source.PrometheusSource.settle_selector picks it.
EXPORTER_SELECTOR = Selector.parse('job="gpu-ledger-exporter"')
