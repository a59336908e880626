"""A small synthetic fleet as OpenMetrics history, its hand-computed facts, and session
fixtures that backfill it into a real Prometheus.

Fleet (history from 2026-10-04T22:00Z to 2026-10-06T01:00Z; metered day 2026-10-05):
  node-a (a sample every 60 s)
    GPU-a0  H100, exclusive pod train/trainer-0 all day, label_team=ml
    GPU-a1  H100, pod batch/short-1 ran 20 minutes in hour 05:00
    GPU-a2  H100, lost (gpu_up 0) for hours 10:00 and 11:00, no other samples then
    GPU-a3  H100, MIG enabled, instance MIG-a3-1 (3g.40gb) to infer/server-1; GPM
            gpu_sm_active_ratio 0.5 for the instance from 02:00 (none before: unknown), and
            0.25 for the whole GPU (a per-GPU series, which MIG facts must not take)
  node-b (a sample every 30 s)
    GPU-b0  A100, MIG enabled, instance MIG-b0-1 (3g.40gb, 3 of 7 slices) to infer/server-0;
            no GPM (A100), so its SM activity is unknown
    GPU-b1  A100, time-sliced into 4 replicas: dev/nb-a holds 2 (label_team=research),
            dev/nb-b holds 1, one replica unallocated
Values are binary fractions so that sums are exact whatever order they are added in.

Import the fixtures into a test module: `from conftest_prom import fleet_prom_url  # noqa`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from promtools import backfill, running_prometheus

H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-80GB"
GIB = 2**30
T_FIRST = int(datetime(2026, 10, 4, 22, tzinfo=UTC).timestamp())  # samples after this
T_LAST = int(datetime(2026, 10, 6, 1, tzinfo=UTC).timestamp())  # ... up to and including this
DAY = datetime(2026, 10, 5)  # naive UTC, as DuckDB returns it
DAY_TS = int(DAY.replace(tzinfo=UTC).timestamp())
SPACING = {"node-a": 60, "node-b": 30}


def _labels(d: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in d.items()) + "}"


@dataclass
class _Series:
    name: str
    labels: dict[str, str]
    node: str
    value: Any  # callable(t) -> float | None (None: no sample at t)


@dataclass
class Fleet:
    series: list[_Series] = field(default_factory=list)

    def add(self, name: str, node: str, labels: dict[str, str], value: Any) -> None:
        self.series.append(_Series(name, {"node": node, **labels}, node, value))

    def openmetrics(self) -> str:
        out: list[str] = []
        by_family: dict[str, list[_Series]] = {}
        for s in self.series:
            by_family.setdefault(s.name, []).append(s)
        for name, group in by_family.items():
            counter = name.endswith("_total")
            kind = "counter" if counter else "gauge"
            out.append(f"# TYPE {name[:-6] if counter else name} {kind}")
            for s in group:
                lab = _labels(s.labels)
                dt = SPACING[s.node]
                for t in range(T_FIRST + dt, T_LAST + 1, dt):
                    v = s.value(t)
                    if v is not None:
                        out.append(f"{name}{lab} {v} {t}")
        out.append("# EOF")
        return "\n".join(out) + "\n"


def _hour(t: int) -> int:
    """Hour index within DAY of the window (H, H+1h] holding t."""
    return -(-(t - DAY_TS) // 3600) - 1


def build_fleet() -> Fleet:
    f = Fleet()

    def dev(node: str, gpu: str, uuid: str, model: str) -> dict[str, str]:
        return {"gpu": gpu, "uuid": uuid, "model": model}

    gpus = [("node-a", "0", "GPU-a0", H100, "disabled"),
            ("node-a", "1", "GPU-a1", H100, "disabled"),
            ("node-a", "2", "GPU-a2", H100, "disabled"),
            ("node-a", "3", "GPU-a3", H100, "enabled"),
            ("node-b", "0", "GPU-b0", A100, "enabled"),
            ("node-b", "1", "GPU-b1", A100, "disabled")]
    util = {"GPU-a0": 0.5, "GPU-a1": 0.25, "GPU-a2": 0.125, "GPU-b1": 0.75}
    for node, gpu, uuid, model, mig in gpus:
        d = dev(node, gpu, uuid, model)
        down = (lambda t: 10 <= _hour(t) <= 11) if uuid == "GPU-a2" else (lambda t: False)
        f.add("gpu_info", node, {**d, "driver_version": "550.54", "mig_mode": mig},
              lambda t: 1)
        f.add("gpu_up", node, d, lambda t, down=down: 0 if down(t) else 1)
        if uuid in util:
            f.add("gpu_utilization_ratio", node, d,
                  lambda t, down=down, u=util[uuid]: None if down(t) else u)
        # 100 J per minute on every GPU: 6000 J an hour.
        f.add("gpu_energy_joules_total", node, d,
              lambda t, down=down: None if down(t) else 1_000_000 + (t - T_FIRST) * 100 // 60)

    inst = {"gpu": "0", "uuid": "GPU-b0", "model": A100, "mig_uuid": "MIG-b0-1",
            "gpu_instance_id": "1", "compute_instance_id": "0", "profile": "3g.40gb"}
    f.add("gpu_mig_info", "node-b", {**inst, "slices": "3", "parent_slices": "7"}, lambda t: 1)
    f.add("gpu_mig_memory_total_bytes", "node-b", inst, lambda t: 40 * GIB)
    hopper = {**inst, "gpu": "3", "uuid": "GPU-a3", "model": H100, "mig_uuid": "MIG-a3-1"}
    f.add("gpu_mig_info", "node-a", {**hopper, "slices": "3", "parent_slices": "7"},
          lambda t: 1)
    f.add("gpu_mig_memory_total_bytes", "node-a", hopper, lambda t: 40 * GIB)
    f.add("gpu_sm_active_ratio", "node-a", hopper, lambda t: 0.5 if _hour(t) >= 2 else None)
    f.add("gpu_sm_active_ratio", "node-a", dev("node-a", "3", "GPU-a3", H100), lambda t: 0.25)

    def pod(node: str, ns: str, name: str, ctr: str, uuid: str, mig_uuid: str, resource: str,
            sharing: str, replicas: int, units: int, mem: int, sm: float | None,
            team: str | None = None, when: Any = lambda t: True) -> None:
        key = {"namespace": ns, "pod": name, "container": ctr, "uuid": uuid,
               "mig_uuid": mig_uuid}
        extra = {"label_team": team} if team else {}
        f.add("gpu_container_allocation", node,
              {**key, "resource": resource, "sharing": sharing, "replicas": str(replicas),
               **extra}, lambda t: units if when(t) else None)
        f.add("gpu_container_memory_used_bytes", node, {**key, **extra},
              lambda t: mem if when(t) else None)
        if sm is not None:
            f.add("gpu_container_sm_utilization_ratio", node, {**key, **extra},
                  lambda t: sm if when(t) else None)

    pod("node-a", "train", "trainer-0", "main", "GPU-a0", "", "nvidia.com/gpu", "exclusive", 1,
        1, GIB, 0.5, team="ml")
    # 20 samples 60 s apart: 05:11 .. 05:30 inclusive.
    short = (DAY_TS + 5 * 3600 + 10 * 60, DAY_TS + 5 * 3600 + 30 * 60)
    pod("node-a", "batch", "short-1", "job", "GPU-a1", "", "nvidia.com/gpu", "exclusive", 1, 1,
        GIB // 2, 0.25, when=lambda t: short[0] < t <= short[1])
    pod("node-b", "infer", "server-0", "srv", "GPU-b0", "MIG-b0-1", "nvidia.com/mig-3g.40gb",
        "mig", 1, 1, 8 * GIB, None)
    pod("node-a", "infer", "server-1", "srv", "GPU-a3", "MIG-a3-1", "nvidia.com/mig-3g.40gb",
        "mig", 1, 1, 8 * GIB, None)
    pod("node-b", "dev", "nb-a", "nb", "GPU-b1", "", "nvidia.com/gpu.shared", "time-slicing",
        4, 2, GIB, 0.5, team="research")
    pod("node-b", "dev", "nb-b", "nb", "GPU-b1", "", "nvidia.com/gpu.shared", "time-slicing",
        4, 1, GIB // 2, 0.25)
    return f


def expected_facts() -> dict[str, list[tuple[Any, ...]]]:
    """Rows for DAY, hand-computed from the fleet description, in the column order of
    device_hours / mig_hours / allocation_hours (labels as a sorted tuple of pairs; the
    cluster column left out)."""
    from datetime import timedelta

    dev: list[tuple[Any, ...]] = []
    mig: list[tuple[Any, ...]] = []
    alloc: list[tuple[Any, ...]] = []
    for h in range(24):
        hour = DAY + timedelta(hours=h)
        a2_down = h in (10, 11)
        # energy: 6000 J/h; GPU-a2's first hour back has no hour before: last - first = 59 min.
        a2_energy = None if a2_down else (5900.0 if h == 12 else 6000.0)
        dev += [
            (hour, "node-a", "0", "GPU-a0", H100, False, 3600.0, 3600.0, 1800.0, 6000.0, False),
            (hour, "node-a", "1", "GPU-a1", H100, False, 3600.0, 3600.0, 900.0, 6000.0, False),
            (hour, "node-a", "2", "GPU-a2", H100, False, 3600.0, 0.0 if a2_down else 3600.0,
             None if a2_down else 450.0, a2_energy, False),
            (hour, "node-a", "3", "GPU-a3", H100, True, 3600.0, 3600.0, None, 6000.0, False),
            (hour, "node-b", "0", "GPU-b0", A100, True, 3600.0, 3600.0, None, 6000.0, False),
            (hour, "node-b", "1", "GPU-b1", A100, False, 3600.0, 3600.0, 2700.0, 6000.0, False),
        ]
        mig.append((hour, "node-b", "GPU-b0", "MIG-b0-1", "3g.40gb", 3, 7, 40.0 * GIB, 3600.0,
                    None))
        # GPM: 60 samples of 0.5, 60 s apart = 1800 s; none before 02:00 (NULL, unknown).
        mig.append((hour, "node-a", "GPU-a3", "MIG-a3-1", "3g.40gb", 3, 7, 40.0 * GIB, 3600.0,
                    1800.0 if h >= 2 else None))
        alloc += [
            (hour, "node-a", "train", "trainer-0", "main", "GPU-a0", "", "nvidia.com/gpu",
             "exclusive", 1, 1.0, 3600.0, GIB * 3600.0, 1800.0, (("team", "ml"),)),
            # MIG: no container SM samples, so sm_seconds is NULL (unknown), not 0.
            (hour, "node-b", "infer", "server-0", "srv", "GPU-b0", "MIG-b0-1",
             "nvidia.com/mig-3g.40gb", "mig", 1, 1.0, 3600.0, 8 * GIB * 3600.0, None, ()),
            (hour, "node-a", "infer", "server-1", "srv", "GPU-a3", "MIG-a3-1",
             "nvidia.com/mig-3g.40gb", "mig", 1, 1.0, 3600.0, 8 * GIB * 3600.0, None, ()),
            (hour, "node-b", "dev", "nb-a", "nb", "GPU-b1", "", "nvidia.com/gpu.shared",
             "time-slicing", 4, 2.0, 3600.0, GIB * 3600.0, 1800.0, (("team", "research"),)),
            (hour, "node-b", "dev", "nb-b", "nb", "GPU-b1", "", "nvidia.com/gpu.shared",
             "time-slicing", 4, 1.0, 3600.0, GIB / 2 * 3600.0, 900.0, ()),
        ]
        if h == 5:  # the 20-minute pod pays 1200 s
            alloc.append((hour, "node-a", "batch", "short-1", "job", "GPU-a1", "",
                          "nvidia.com/gpu", "exclusive", 1, 1.0, 1200.0, GIB / 2 * 1200.0,
                          300.0, ()))
    # No gpu_info carries a vendor label: every device is NVIDIA's, the ledger's default.
    dev = [(*row, "nvidia") for row in dev]
    return {"device_hours": sorted(dev, key=_key), "mig_hours": sorted(mig, key=_key),
            "allocation_hours": sorted(alloc, key=_key)}


def _key(row: tuple[Any, ...]) -> tuple[str, ...]:
    return tuple(str(v) for v in row)


def fact_rows(con: Any, table: str) -> list[tuple[Any, ...]]:
    """A fact table's rows, sorted, labels MAPs as sorted pairs, for comparisons. The cluster
    column is left out: these comparisons are about one cluster's figures
    (tests/test_clusters.py covers the column)."""
    rows = con.execute(f"SELECT * EXCLUDE (cluster) FROM {table}").fetchall()
    out = []
    for row in rows:
        out.append(tuple(tuple(sorted(v.items())) if isinstance(v, dict) else v for v in row))
    return sorted(out, key=_key)


@pytest.fixture(scope="session")
def fleet_om_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("fleet") / "fleet.om"
    path.write_text(build_fleet().openmetrics())
    return path


@pytest.fixture(scope="session")
def fleet_prom_url(tmp_path_factory: pytest.TempPathFactory, fleet_om_file: Path
                   ) -> Iterator[str]:
    data = tmp_path_factory.mktemp("fleet-tsdb") / "data"
    backfill(fleet_om_file.read_text(), data)
    with running_prometheus(data) as url:
        yield url
