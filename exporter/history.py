"""Write many sample cycles to one OpenMetrics file with timestamps, the input of
`promtool tsdb create-blocks-from openmetrics` and of metering's file source.

OpenMetrics wants every sample of a family in one contiguous block, while cycles arrive in
time order with every family each time; so each family is spooled to its own temporary file
and the spools are joined at the end, under a temporary name renamed into place.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import IO

from exporter.metrics import FAMILIES
from exporter.render import Sample, family_header, sample_lines


class OpenMetricsHistory:
    def __init__(self, path: str | Path, families: Iterable[str] | None = None) -> None:
        self.path = Path(path)
        wanted = set(families) if families is not None else None
        self._families = [f for f in FAMILIES if wanted is None or f.name in wanted]
        self._spool_dir = Path(tempfile.mkdtemp(prefix=".om-spool-", dir=self.path.parent))
        self._spools: dict[str, IO[str]] = {}
        self.samples_written = 0

    def add(self, samples: dict[str, list[Sample]], timestamp: float) -> None:
        for fam in self._families:
            rows = samples.get(fam.name)
            if not rows:
                continue
            spool = self._spools.get(fam.name)
            if spool is None:
                spool = (self._spool_dir / fam.name).open("w", buffering=1 << 20)
                self._spools[fam.name] = spool
            spool.write(sample_lines(fam, rows, timestamp))
            self.samples_written += len(rows)

    def close(self) -> Path:
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        try:
            with tmp.open("w") as out:
                for fam in self._families:
                    spool = self._spools.pop(fam.name, None)
                    if spool is None:
                        continue
                    spool.close()
                    out.write(family_header(fam, openmetrics=True))
                    with (self._spool_dir / fam.name).open() as src:
                        shutil.copyfileobj(src, out, 1 << 20)
                out.write("# EOF\n")
            os.replace(tmp, self.path)
        finally:
            for spool in self._spools.values():
                spool.close()
            shutil.rmtree(self._spool_dir, ignore_errors=True)
            tmp.unlink(missing_ok=True)
        return self.path
