"""Errors for bad input: each names the file, the key path and what was expected."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # no yaml import for callers that never read YAML (the kubeconfig reader)
    from gpu_ledger.safeyaml import YamlError


class ConfigError(Exception):
    """A configuration or scenario file is malformed.

    str() reads like `scenario.yaml: gpus[2].memory: expected a size like 80GiB, got "abc"`.
    """

    def __init__(self, file: str, key: str, expected: str, found: object = None) -> None:
        self.file, self.key, self.expected, self.found = file, key, expected, found
        msg = f"{file}: {key}: expected {expected}" if key else f"{file}: expected {expected}"
        if found is not None:  # described, never serialised: it may be huge (an alias bomb)
            from gpu_ledger.safeyaml import describe

            msg += f", got {describe(found)}"
        super().__init__(msg)

    @classmethod
    def from_yaml(cls, exc: YamlError) -> ConfigError:
        """The loader's refusal (invalid YAML, an alias bomb, deep nesting) as a ConfigError."""
        err = cls(exc.file, exc.key, "YAML the loader accepts")
        err.args = (str(exc),)
        return err
