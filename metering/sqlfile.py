"""Named SQL sections of the files under metering/sql/.

A file is a sequence of sections, each opened by a comment line `-- step: NAME` (run in file
order by the module that owns the file) or `-- query: NAME` (run by name where Python needs its
rows or runs it apart from the steps). The order of the steps is the file's: it is never
repeated in Python.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from importlib import resources

_SECTION = re.compile(r"^-- (step|query): (\w+)\s*$", re.MULTILINE)


@dataclass(frozen=True)
class SqlFile:
    name: str
    steps: tuple[tuple[str, str], ...]  # (name, SQL) in file order
    queries: dict[str, str]

    def query(self, name: str) -> str:
        return self.queries[name]


def parse(name: str, text: str) -> SqlFile:
    parts = _SECTION.split(text)
    steps: list[tuple[str, str]] = []
    queries: dict[str, str] = {}
    seen: set[str] = set()
    for kind, section, body in zip(parts[1::3], parts[2::3], parts[3::3], strict=True):
        if section in seen:
            raise ValueError(f"{name}: section {section!r} appears twice")
        seen.add(section)
        if kind == "step":
            steps.append((section, body.strip()))
        else:
            queries[section] = body.strip()
    return SqlFile(name, tuple(steps), queries)


@cache
def load(name: str) -> SqlFile:
    """metering/sql/<name>, parsed once per process."""
    text = (resources.files("metering") / "sql" / name).read_text(encoding="utf-8")
    return parse(name, text)
