"""What can go wrong in metering, as exception kinds with one exit status each.

Every `gpu-ledger` metering command (`meter`, `report`, `cost-model`) turns a
`MeteringError` into one line on stderr and its `code`: the same kind of failure exits with
the same status in every command (the table is in docs/operations.md, "Exit status").
"""

from __future__ import annotations

import argparse
import enum
from typing import NoReturn


class ExitCode(enum.IntEnum):
    OK = 0
    FAILED = 1  # an unexpected failure (pricing broke, report files could not be written)
    USAGE = 2  # a bad command line: unknown option, malformed period or number
    OVER_BUDGET = 3  # report --check-budgets: written, and a team is over budget
    BAD_INPUT = 4  # a file you named is wrong: cost model, OpenMetrics file, ledger, secret
    SOURCE = 5  # the source could not be read: Prometheus unreachable, refusing, not Prometheus
    REFUSED = 6  # the data does not allow it: would lose metered hours, no GPU series, month
    # not metered or not priced, mixed cost models, bad label values in the source
    LOCKED = 7  # another run holds the ledger
    OUT_OF_MEMORY = 8  # DuckDB needed more than its memory cap (--memory-limit)
    CLOSED = 9  # the hours are in a month `gpu-ledger close` closed: its bill never changes
    INTERRUPTED = 130  # Ctrl-C / SIGINT: committed chunks are kept


class MeteringError(Exception):
    """A failure with a one-line message (str()) and the exit status it gets."""

    code: ExitCode = ExitCode.FAILED

    def __init__(self, message: str, code: ExitCode | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


class UsageError(MeteringError):
    code = ExitCode.USAGE


class InputError(MeteringError):
    code = ExitCode.BAD_INPUT


class SourceError(MeteringError):
    code = ExitCode.SOURCE


class RefusedError(MeteringError):
    code = ExitCode.REFUSED


class ClosedError(MeteringError):
    code = ExitCode.CLOSED


class LockedError(MeteringError):
    code = ExitCode.LOCKED


class OutOfMemoryError(MeteringError):
    """DuckDB needed more memory than its cap (metering.db.memory_limit) for work it could not
    spill to disk."""

    code = ExitCode.OUT_OF_MEMORY


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose usage errors are one line and exit `ExitCode.USAGE`, like every other
    metering error (the full usage is one `--help` away)."""

    def error(self, message: str) -> NoReturn:
        self.exit(ExitCode.USAGE, f"{self.prog}: {message} (see {self.prog} --help)\n")
