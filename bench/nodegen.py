"""Scenario files for a benchmark node of any size, in the simulator's YAML format.

The "big node" is 8 H100s, each cut into 7 MIG 1g.10gb instances, every instance time-sliced
into 2 shares (so 100 pods can each hold one share), and 400 GPU processes. Everything is
constant over time: a benchmark should measure the exporter, not the scenario changing.
"""

from __future__ import annotations

import yaml

TEAMS = ("ml-research", "inference", "data-science", "data-eng", "search", "ads", "vision",
         "speech")
NAMESPACES = ("research", "serving", "notebooks", "batch", "search", "ads", "vision", "speech",
              "ml-train", "ml-eval")
MIG_PER_GPU = 7
SHARES_PER_MIG = 2


def node_scenario(gpus: int = 8, pods: int = 100, procs_per_pod: int = 4,
                  mig: bool = True, node: str = "bench-node-01") -> str:
    """YAML for one node; pods are spread over the MIG shares (or whole-GPU shares)."""
    if mig:
        units = [{"gpu": g, "mig": m, "replica": r} for r in range(SHARES_PER_MIG)
                 for g in range(gpus) for m in range(MIG_PER_GPU)]
    else:
        units = [{"gpu": g, "replica": r} for r in range(SHARES_PER_MIG * MIG_PER_GPU)
                 for g in range(gpus)]
    if pods > len(units):
        raise ValueError(f"{pods} pods need more than the {len(units)} shares of {gpus} GPUs")
    gpu: dict[str, object] = {
        "model": "NVIDIA H100 80GB HBM3", "count": gpus, "memory": "80GiB",
        "power_limit_watts": 700, "nvlink_links": 18,
        "telemetry": {"idle_power_watts": 90, "sm_clock_mhz": 1980, "mem_clock_mhz": 2619},
    }
    share = {"mode": "time-slicing", "replicas": SHARES_PER_MIG}
    if mig:
        gpu["mig"] = [{"profile": "1g.10gb", "sharing": share} for _ in range(MIG_PER_GPU)]
    else:
        gpu["sharing"] = {"mode": "time-slicing", "replicas": SHARES_PER_MIG * MIG_PER_GPU}
    pod_list = []
    for i in range(pods):
        pod_list.append({
            "namespace": NAMESPACES[i % len(NAMESPACES)],
            "name": f"worker-{i:04d}",
            "labels": {"team": TEAMS[i % len(TEAMS)], "app": f"app-{i % 17}"},
            "containers": [{
                "name": "main",
                "gpus": [units[i]],
                "processes": [{"name": "python", "unit": 0,
                               "memory": f"{256 + 64 * (p % 8)}MiB",
                               "sm_util": round(0.05 + 0.01 * (p % 10), 2)}
                              for p in range(procs_per_pod)],
            }],
        })
    doc = {"node": node, "driver_version": "550.90.07", "cuda_version": 12040,
           "gpus": [gpu], "pods": pod_list}
    return yaml.safe_dump(doc, sort_keys=False)


def big_node() -> str:
    return node_scenario(gpus=8, pods=100, procs_per_pod=4)
