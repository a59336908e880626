"""A GPU is one uuid within its cluster. Two nodes reporting the same uuid in one hour (Intel
GPUs are keyed by PCI address, and identical nodes put identical GPUs at identical addresses:
docs/backends.md) would have their device-hours and holders merged into one GPU's bill:
metering refuses such a chunk with one line and writes nothing, whether the two nodes' series
arrive in one node group or in two."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import numpy as np
import pytest
from test_clusters import T0, gpu_hour, meter, om, rows

from metering.cluster import ClusterScope
from metering.db import connect
from metering.errors import MeteringError
from metering.facts import build_signal, write_facts
from metering.signals import SIGNALS

BDF = "0000:4d:00.0"
MAX1550 = "Intel Data Center GPU Max 1550"
MESSAGE = (rf"GPU {BDF} is reported by nodes n1 and n2 in the hour 2026-10-05T00:00Z: a GPU's "
           "uuid must be unique in its cluster")


def test_one_uuid_on_two_nodes_in_one_group_is_refused(tmp_path: Path) -> None:
    n1 = gpu_hour(MAX1550, 60, uuid=BDF)
    n2 = gpu_hour(MAX1550, 30, uuid=BDF, pod="trainer-1").replace('node="n1"', 'node="n2"')
    con = connect(tmp_path / "ledger.duckdb")
    with pytest.raises(MeteringError, match=MESSAGE):
        meter(con, om(tmp_path, "two.om", n1, n2), ClusterScope("east"))
    assert rows(con, "SELECT count(*) FROM device_hours") == [(0,)]
    assert rows(con, "SELECT count(*) FROM allocation_hours") == [(0,)]


def test_the_same_uuid_in_two_clusters_or_two_hours_is_not_a_clash(tmp_path: Path) -> None:
    con = connect(tmp_path / "ledger.duckdb")
    meter(con, om(tmp_path, "east.om", gpu_hour(MAX1550, 60, uuid=BDF)), ClusterScope("east"))
    meter(con, om(tmp_path, "west.om", gpu_hour(MAX1550, 60, uuid=BDF)), ClusterScope("west"))
    assert rows(con, "SELECT cluster, node, uuid FROM device_hours ORDER BY 1") == [
        ("east", "n1", BDF), ("west", "n1", BDF)]


def test_a_node_relabelled_mid_hour_is_one_gpu_not_a_clash(tmp_path: Path) -> None:
    """The same GPU under a node label that changes at 00:30 (docs/metering.md, "Several series
    for one key"): the two nodes' series follow each other, so the hour is one GPU's. (The
    sample interval is given: detected from this one hour, each half would look whole.)"""
    first = "\n".join(line for line in gpu_hour(MAX1550, 60, uuid=BDF).splitlines()
                      if line.startswith("#") or int(line.rsplit(" ", 1)[1]) <= T0 + 1800)
    second = "\n".join(line for line in gpu_hour(MAX1550, 60, uuid=BDF).splitlines()
                       if line.startswith("#") or int(line.rsplit(" ", 1)[1]) > T0 + 1800)
    con = connect(tmp_path / "ledger.duckdb")
    meter(con, om(tmp_path, "relabel.om", first, second.replace('node="n1"', 'node="n2"')),
          ClusterScope("east"), sample_interval=60.0)
    assert rows(con, "SELECT uuid, observed_seconds FROM device_hours") == [(BDF, 3600.0)]
    assert rows(con, "SELECT pod, allocated_seconds FROM allocation_hours") == [
        ("trainer-0", 3600.0)]


def _up(node: str) -> dict[str, object]:
    spec = next(s for s in SIGNALS if s.name == "up_count")
    labels = {"node": node, "gpu": "0", "uuid": BDF, "model": MAX1550, "cluster": "east"}
    hour = int(datetime(2026, 10, 5, 0, 0).timestamp())
    table = build_signal(spec, [labels], np.zeros(1, np.int64), np.array([hour], np.int64),
                         np.array([60.0]))
    return {"up_count": table}


def test_one_uuid_on_two_nodes_in_two_node_groups_is_refused(tmp_path: Path) -> None:
    """Node groups are written one after another (the planner splits a chunk by node): each
    group alone has one node per GPU, the chunk has two."""
    con = connect(tmp_path / "ledger.duckdb")
    start, end = datetime(2026, 10, 5, 0), datetime(2026, 10, 5, 1)
    con.execute("BEGIN")
    with pytest.raises(MeteringError, match=MESSAGE):
        write_facts(con, [_up("n1"), _up("n2")], start, end, 60.0, ClusterScope("east"))
    con.execute("ROLLBACK")
    assert rows(con, "SELECT count(*) FROM device_hours") == [(0,)]
