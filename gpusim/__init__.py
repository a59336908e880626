"""A simulated GPU node: a scenario YAML drives a pynvml-compatible module (SimNVML) and the
Kubernetes view of the same node (device plugin IDs, pods, /proc cgroup files)."""

from gpusim.node import SimContainer, SimPod, SimProcess, device_ids, pods_at, write_proc_tree
from gpusim.nvml import SimDevice, SimNVML
from gpusim.scenario import Scenario, load_scenario, loads_scenario, parse_scenario

__all__ = [
    "Scenario", "SimContainer", "SimDevice", "SimNVML", "SimPod", "SimProcess", "device_ids",
    "load_scenario", "loads_scenario", "parse_scenario", "pods_at", "write_proc_tree",
]
