"""The manifest of a ledger export: which files the export wrote, their rows and content hash,
and each cluster-month's cost models, written last and atomically.

A Parquet directory is easy to change behind the tool's back: a copied `part-1.parquet`, the
same file under another `month=` partition, an export killed half-way that leaves new facts
beside old charges. Any of these once doubled a bill or mixed two runs without a word. So
`ledger export` removes the manifest before it writes anything and writes a new one after its
last rename; `report` and `ledger merge` read a directory only when its files are exactly the
manifest's (no file more or less, each with the recorded size, rows and SHA-256).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

MANIFEST = "manifest.json"
FORMAT = "gpu-ledger-export/1"
_BLOCK = 1 << 20


class ManifestError(Exception):
    """The directory does not match its manifest (or has none); str() is one line."""


@dataclass(frozen=True)
class FileEntry:
    """One Parquet file of the export."""

    path: str  # relative to the export's root, '/'-separated
    table: str
    cluster: str  # '' for the side tables (cost models), which are not partitioned
    month: str  # YYYY-MM, '' for the side tables
    rows: int
    bytes: int
    sha256: str


@dataclass
class Manifest:
    files: dict[str, FileEntry] = field(default_factory=dict)  # path -> entry
    # "cluster/month" -> cost model hashes of that cluster-month's charges
    cost_models: dict[str, list[str]] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps({"format": FORMAT,
                           "files": [asdict(f) for _, f in sorted(self.files.items())],
                           "cost_models": dict(sorted(self.cost_models.items()))},
                          indent=1, sort_keys=True) + "\n"


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(_BLOCK):
            h.update(block)
    return h.hexdigest()


def describe(root: Path, path: Path, table: str, cluster: str = "", month: str = ""
             ) -> FileEntry:
    """The entry of a file the export has just written."""
    return FileEntry(path.relative_to(root).as_posix(), table, cluster, month,
                     pq.read_metadata(path).num_rows, path.stat().st_size, sha256(path))


def read(root: Path) -> Manifest | None:
    """The manifest of the export at `root`; None where there is none."""
    try:
        doc: Any = json.loads((root / MANIFEST).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise ManifestError(f"{root / MANIFEST}: cannot read it ({e}); export the ledger "
                            "again") from None
    try:
        if doc["format"] != FORMAT:
            raise ManifestError(f"{root / MANIFEST}: format {doc['format']!r}, expected "
                                f"{FORMAT!r}")
        files = [FileEntry(**f) for f in doc["files"]]
        return Manifest({f.path: f for f in files},
                        {str(k): [str(h) for h in v] for k, v in doc["cost_models"].items()})
    except (KeyError, TypeError, AttributeError) as e:
        raise ManifestError(f"{root / MANIFEST}: not a ledger export manifest ({e}); export "
                            "the ledger again") from None


def remove(root: Path) -> None:
    """Before an export writes anything: until the new manifest is written, the directory
    reads as an export that did not finish."""
    with contextlib.suppress(FileNotFoundError):
        (root / MANIFEST).unlink()
    _sync_dir(root)


def write(root: Path, manifest: Manifest) -> None:
    """Atomically: a reader sees the old manifest, none, or this one whole."""
    tmp = root / f".{MANIFEST}.{secrets.token_hex(6)}.tmp"
    try:
        with tmp.open("w", encoding="utf-8") as f:
            f.write(manifest.to_json())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, root / MANIFEST)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    _sync_dir(root)


def _sync_dir(root: Path) -> None:
    with contextlib.suppress(OSError):  # not every file system syncs directories
        fd = os.open(root, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def verify(root: Path, tables: tuple[str, ...]) -> Manifest:
    """The export's manifest, once every Parquet file under `tables` is checked against it:
    the same files (none more, none fewer), sizes, rows and SHA-256. ManifestError (one line,
    naming the first file that differs) otherwise."""
    manifest = read(root)
    again = "export the ledger again (gpu-ledger ledger export)"
    if manifest is None:
        raise ManifestError(f"{root}: no {MANIFEST}: an export that did not finish (killed, "
                            f"disk full) or one by an older version; {again}")
    found = {p.relative_to(root).as_posix(): p for t in tables
             for p in (root / t).rglob("*.parquet")}
    extra = sorted(set(found) - set(manifest.files))
    if extra:
        raise ManifestError(f"{root / extra[0]}: not in the export's {MANIFEST} (copied in, or "
                            f"left by another export): its rows would be counted twice; remove "
                            f"it or {again}")
    missing = sorted(set(manifest.files) - set(found))
    if missing:
        raise ManifestError(f"{root / missing[0]}: in the export's {MANIFEST} but missing; "
                            f"{again}")
    for path, entry in sorted(manifest.files.items()):
        f = found[path]
        if f.stat().st_size != entry.bytes or sha256(f) != entry.sha256:
            raise ManifestError(f"{f}: not the file the export wrote (size or SHA-256 differs "
                                f"from {MANIFEST}); {again}")
    return manifest
