"""Clusters: the names a ledger's rows carry, and which cluster a source's series belong to.

Kept apart from the fact SQL so that the cost model (which validates `clusters:` keys) and the
CLIs can use it without loading Arrow.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

# The cluster of a ledger that never named one: every single-cluster ledger, and every ledger
# written before clusters existed (metering/db.py fills it in), is cluster "default".
DEFAULT_CLUSTER = "default"
# A cluster name is a path component of the Parquet export (cluster=NAME/): no '/', no '='.
_CLUSTER_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$")


CLUSTER_NAME_RULE = ("a cluster name (letters, digits, . _ -, at most 63, starting and ending "
                     "with a letter or digit)")


def is_cluster_name(name: object) -> bool:
    return isinstance(name, str) and _CLUSTER_NAME.match(name) is not None


def cluster_name_problem(name: object) -> str:
    """'' for a good cluster name, else what is wrong with it."""
    return "" if is_cluster_name(name) else f"expected {CLUSTER_NAME_RULE}, got {name!r}"


@dataclass(frozen=True)
class ClusterScope:
    """Which cluster a source's series belong to: one name for every series (a Prometheus per
    cluster), or the value of a series label (one global store holding several clusters), in
    which case `name` is the cluster of series without that label."""

    name: str = DEFAULT_CLUSTER
    label: str | None = None

    def of(self, labels: Mapping[str, str]) -> str:
        if self.label is None:
            return self.name
        return labels.get(self.label) or self.name
