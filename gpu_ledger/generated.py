"""Write generated files, or check that the committed ones are current (for `--check` and CI).
Shared by the alert-rule and dashboard generators."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path


def sync(outputs: Mapping[Path, str], check: bool, regenerate: str) -> int:
    """Write each path whose content differs (check=False) or report the stale ones and
    return 1 (check=True). `regenerate` is the command named in the stale message."""
    stale = []
    for path, text in outputs.items():
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current == text:
            continue
        if check:
            stale.append(path.name)
        else:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path}")
    if stale:
        print(f"stale: {', '.join(stale)}; run `{regenerate}`", file=sys.stderr)
        return 1
    return 0
