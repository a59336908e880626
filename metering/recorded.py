"""Whether a chunk's signals can be read from the recorded hourly series.

The shipped rules (group gpu-ledger.metering-series, docs/recording-rules.md "Metering
series") record, once an hour, each signal of the last whole hour as `gpu_ledger:<signal>:hour`
with every label of its raw series, and a marker series per signal whose value is the start
of the hour it recorded. Reading those costs the store one sample per series-hour instead of
every raw sample of the hour. A signal is read recorded for a chunk only where that is the same
as reading it raw:

- every evaluation hour of the chunk has the signal's marker with the right hour (the rule ran
  for that hour, where this reader expects its point): a marker missing or naming another hour
  (rules deployed mid-chunk, an evaluator down, a rule that failed, points stamped at another
  time than they were computed for) reads the signal raw for the chunk;
- every node with raw series in the chunk has recorded series (an evaluator without the rules,
  e.g. one cluster of a global store, reads the whole chunk raw).

Two index lookups' worth per chunk: one range query over the markers (a few series) and one
label-values call; where that lists nodes with raw series but none recorded, one count of
those nodes' raw samples within the chunk's reads, because label lookups are coarser than a
chunk (VictoriaMetrics' go by day, Prometheus's by block): a node gone at midnight is listed
for the next day too, and has nothing there to bill. A store without the rules therefore
bills exactly as before.
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from metering.errors import SourceError
from metering.period import Period
from metering.promclient import PromClient, PromError
from metering.queryplan import is_limit_error
from metering.signals import (
    HOUR_S,
    MARK_LABEL,
    RECORDED_PREFIX,
    RECORDED_READ,
    RECORDED_SUFFIX,
    SIGNALS,
)

# Of the nodes given, those with raw samples that the chunk's reads take, counted exactly (not
# a label lookup): none, or some of them (it may stop at the first it finds; one is enough to
# read the chunk raw). metering.queryplan.QueryPlanner.nodes_sampled.
Sampled = Callable[[Sequence[str]], set[str]]


class RecordedMode(enum.StrEnum):
    AUTO = "auto"  # recorded where complete for the chunk, raw elsewhere
    NEVER = "never"  # raw series only (as before the rules existed)
    ONLY = "only"  # recorded series only: a chunk without them is an error


class RecordedMissing(SourceError):
    """`--recorded only` and a chunk whose signals are not all recorded."""


@dataclass(frozen=True)
class Choice:
    """What a chunk reads recorded (signal names) and, where not all, why not."""

    recorded: frozenset[str]
    why: str = ""
    none_deployed: bool = False  # no marker at all (or --recorded never): nothing to say


def _names_regex() -> str:
    return "|".join(s.name for s in SIGNALS)


def markers_promql() -> str:
    """Every signal's marker, read as the signals are (metering.signals.RECORDED_READ)."""
    name = f"{RECORDED_PREFIX}({_names_regex()}){RECORDED_SUFFIX}"
    return f'last_over_time({{__name__=~"{name}",{MARK_LABEL}!=""}}{RECORDED_READ})'


class RecordedProbe:
    """Decides, per chunk, which signals are read from the recorded series."""

    def __init__(self, client: PromClient, mode: RecordedMode = RecordedMode.AUTO) -> None:
        self.client = client
        self.mode = mode

    def choose(self, chunk: Period, raw_nodes: Sequence[str] | None, sampled: Sampled
               ) -> Choice:
        """The chunk's choice. `raw_nodes`: nodes with raw series in the chunk (the
        planner's lookup), None where they could not be listed; `sampled` tells which of
        some nodes have raw samples there."""
        if self.mode is RecordedMode.NEVER:
            return Choice(frozenset(), "--recorded never", none_deployed=True)
        choice = self._probe(chunk, raw_nodes, sampled)
        if self.mode is RecordedMode.ONLY and len(choice.recorded) < len(SIGNALS):
            raise RecordedMissing(f"--recorded only: {chunk.label()}: {choice.why}")
        return choice

    def _probe(self, chunk: Period, raw_nodes: Sequence[str] | None, sampled: Sampled
               ) -> Choice:
        first, last = int(chunk.start.timestamp()), int(chunk.end.timestamp())
        promql = markers_promql()
        try:
            answer = self.client.query_range_answer(promql, first, last, HOUR_S)
            result = self.client.matrix(answer, promql)
        except PromError as exc:
            return Choice(frozenset(), f"markers not readable ({exc})")
        want = {t: float(t - HOUR_S) for t in range(first, last + 1, HOUR_S)}
        complete: dict[str, bool] = {}
        for series in result:
            name = str(series.get("metric", {}).get(MARK_LABEL, ""))
            got = {}
            for t, v in series.get("values", ()):
                try:
                    got[int(float(t))] = float(v)
                except (TypeError, ValueError):
                    continue
            ok = all(math.isclose(got.get(t, math.nan), h) for t, h in want.items())
            complete[name] = complete.get(name, True) and ok
        if not complete:
            return Choice(frozenset(), "no recorded hourly series (rules not deployed)",
                          none_deployed=True)
        names = frozenset(n for n, ok in complete.items() if ok) & {s.name for s in SIGNALS}
        missing = [s.name for s in SIGNALS if s.name not in names]
        if names:
            problem = self._nodes_problem(first, last, raw_nodes, sampled)
            if problem:
                return Choice(frozenset(), problem)
        if missing:
            return Choice(names, f"hours not recorded for {len(missing)} signal(s) "
                                 f"({', '.join(missing[:4])}{', ...' if len(missing) > 4 else ''})")
        return Choice(names)

    def _nodes_problem(self, first: int, last: int, raw_nodes: Sequence[str] | None,
                       sampled: Sampled) -> str:
        """Why the recorded series cannot stand for the raw ones (nodes with raw series but
        none recorded), or ''."""
        if raw_nodes is None:
            return "nodes not listed, so recorded series not checked against the raw ones"
        if not raw_nodes:
            return ""
        # One signal per family stands for it (its rule records every series of the family).
        first_of: dict[str, str] = {}
        for spec in SIGNALS:
            if not spec.nonempty:
                first_of.setdefault(spec.family, spec.recorded)
        names = list(first_of.values())
        try:
            have = self._node_values(names, first, last + HOUR_S)
        except PromError as exc:
            return f"nodes of the recorded series not listed ({exc})"
        lacking = sorted(set(raw_nodes) - have)
        if not lacking:
            return ""
        unchecked = ""
        try:
            lacking = sorted(sampled(lacking))
        except PromError as exc:
            unchecked = f"; their samples not counted ({exc})"
        if not lacking:
            return ""
        shown = ", ".join(lacking[:3]) + (", ..." if len(lacking) > 3 else "")
        return f"{len(lacking)} node(s) with raw series but none recorded ({shown}){unchecked}"

    def _node_values(self, names: Sequence[str], start: int, end: int) -> set[str]:
        """Values of `node` on the named series; one name at a time where the store refuses
        all at once as too many series (as metering.queryplan lists the raw families)."""
        match = ["{__name__=~\"" + "|".join(re.escape(n) for n in names) + "\"}"]
        try:
            return set(self.client.label_values("node", match, start, end))
        except PromError as exc:
            if len(names) == 1 or not is_limit_error(exc):
                raise
            return set().union(*(self._node_values([n], start, end) for n in names))
