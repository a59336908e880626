"""Write a report's files all-or-nothing: every file goes to a temporary name in the output
directory first and is renamed over the old one only when all of them were written, so a
failed run (a renderer error, a full disk) leaves the previous report as it was."""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import BinaryIO

# A file's contents: its bytes, or a function writing them into the open file (a file too big
# to hold twice, the FOCUS export at fleet size).
Content = bytes | Callable[[BinaryIO], None]


def _write_new(path: Path, data: Content) -> None:
    # O_EXCL: never write through a file (or link) someone else put at the temporary name.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    with os.fdopen(fd, "wb") as f:
        if isinstance(data, bytes):
            f.write(data)
        else:
            data(f)
        f.flush()
        os.fsync(f.fileno())


def write_files(out_dir: Path, files: Mapping[str, Content]) -> list[Path]:
    """Write name -> contents under out_dir; returns the final paths. Raises OSError (or what
    a writing function raised) on failure, after removing any temporary file it made."""
    out_dir.mkdir(parents=True, exist_ok=True)
    staged: list[tuple[Path, Path]] = []
    try:
        for name, data in files.items():
            tmp = out_dir / f".{name}.{secrets.token_hex(6)}.tmp"
            staged.append((tmp, out_dir / name))
            _write_new(tmp, data)
        for tmp, final in staged:
            os.replace(tmp, final)
    except BaseException:
        for tmp, _ in staged:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        raise
    _sync_dir(out_dir)
    return [final for _, final in staged]


def _sync_dir(path: Path) -> None:
    """Make the renames durable; some filesystems cannot open a directory, which is fine."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
