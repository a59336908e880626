"""Regenerate metering/data/focus-columns.yaml from a FOCUS specification checkout.

    git clone https://github.com/FinOps-Open-Cost-and-Usage-Spec/FOCUS_Spec /tmp/focus
    python -m metering.report.focus_columns_refresh /tmp/focus v1.2

Reads every `specification/columns/*.md` at the tag: the Column ID and its constraints table
(feature level, data type, whether nulls are allowed). Only those facts are kept, as data; the
specification's prose is not copied. The specification is CC-BY-4.0 (attribution in the file).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml

OUT = Path(__file__).resolve().parent.parent / "data" / "focus-columns.yaml"
_ROW = re.compile(r"^\|\s*(Feature level|Data type|Allows nulls)\s*\|\s*([^|]+?)\s*\|", re.M)


def _git(repo: str, *args: str) -> str:
    return subprocess.run(["git", "-C", repo, *args], check=True, capture_output=True,
                          text=True).stdout


def columns(repo: str, tag: str) -> list[dict[str, object]]:
    names = _git(repo, "ls-tree", "--name-only", tag, "specification/columns/").split()
    out: list[dict[str, object]] = []
    for path in sorted(n for n in names if n.endswith(".md")):
        text = _git(repo, "show", f"{tag}:{path}")
        m = re.search(r"^## Column ID\s*\n\s*\n?(\w+)", text, re.M)
        if m is None:
            continue
        facts = dict(_ROW.findall(text))
        out.append({"id": m.group(1), "feature_level": facts["Feature level"],
                    "data_type": facts["Data type"],
                    "allows_nulls": facts["Allows nulls"].lower() == "true"})
    return out


def main(argv: list[str]) -> int:
    repo, tag = argv
    commit = _git(repo, "rev-parse", f"{tag}^{{commit}}").strip()
    doc = {
        "focus_version": tag.lstrip("v"),
        "source": {
            "repository": "https://github.com/FinOps-Open-Cost-and-Usage-Spec/FOCUS_Spec",
            "tag": tag,
            "commit": commit,
            "path": "specification/columns/*.md (Column ID and Content Constraints)",
            "licence": "CC-BY-4.0, (c) Joint Development Foundation Projects, LLC, FinOps "
                       "Open Cost and Usage Specification (FOCUS) Series and its contributors",
            "refresh": f"python -m metering.report.focus_columns_refresh <FOCUS_Spec checkout> "
                       f"{tag}",
        },
        "columns": columns(repo, tag),
    }
    header = ("# FOCUS column list (ids, feature level, type, nullability) extracted from the\n"
              "# FinOps FOCUS specification; generated, do not edit. See `source` below.\n")
    OUT.write_text(header + yaml.safe_dump(doc, sort_keys=False, width=100))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
