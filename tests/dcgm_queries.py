"""PromQL that tools written for dcgm-exporter run, copied as data with its source, for
tests/test_promql_proof.py to run against GPU Ledger's DCGM-compatible recording rules
(alerts/optional/gpu-ledger-dcgm.yml)."""

from __future__ import annotations

# NVIDIA's Grafana dashboard 12239 ("NVIDIA DCGM Exporter Dashboard"): NVIDIA/dcgm-exporter,
# grafana/dcgm-exporter-dashboard.json at commit 1f7abdb7dc0f86f3cf7853995b0d262fd3e80bc6.
# Panel title -> target expression; $instance and $gpu are the board's query variables.
NVIDIA_12239_PANELS = {
    "GPU Temperature": 'DCGM_FI_DEV_GPU_TEMP{instance=~"$instance", gpu=~"$gpu"}',
    "GPU Avg. Temp": 'avg(DCGM_FI_DEV_GPU_TEMP{instance=~"$instance", gpu=~"$gpu"})',
    "GPU Power Usage": 'DCGM_FI_DEV_POWER_USAGE{instance=~"$instance", gpu=~"$gpu"}',
    "GPU Power Total": 'sum(DCGM_FI_DEV_POWER_USAGE{instance=~"$instance", gpu=~"$gpu"})',
    "GPU SM Clocks": 'DCGM_FI_DEV_SM_CLOCK{instance=~"$instance", gpu=~"$gpu"} * 1000000',
    "GPU Utilization": 'DCGM_FI_DEV_GPU_UTIL{instance=~"$instance", gpu=~"$gpu"}',
    "GPU Framebuffer Mem Used": 'DCGM_FI_DEV_FB_USED{instance=~"$instance", gpu=~"$gpu"}',
    "Tensor Core Utilization":
        'DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{instance=~"$instance", gpu=~"$gpu"}',
}
NVIDIA_12239_VARIABLES = {
    "instance": "label_values(DCGM_FI_DEV_GPU_TEMP, instance)",
    "gpu": "label_values(DCGM_FI_DEV_GPU_TEMP, gpu)",
}

# OpenCost's GPU queries: opencost/opencost, modules/prometheus-source/pkg/prom/
# metricsquerier.go (QueryGPUsUsageAvg, QueryGPUsUsageMax, QueryGPUInfo). Go format strings:
# the window, then the cluster label; QueryGPUInfo takes the cluster filter first.
OPENCOST_GPU_USAGE_AVG = ('avg(avg_over_time(DCGM_FI_PROF_GR_ENGINE_ACTIVE{container!=""}[%s])) '
                          "by (container, pod, namespace, uid, %s)")
OPENCOST_GPU_USAGE_MAX = ('max(max_over_time(DCGM_FI_PROF_GR_ENGINE_ACTIVE{container!=""}[%s])) '
                          "by (container, pod, namespace, uid, %s)")
OPENCOST_GPU_INFO = ('avg(avg_over_time(DCGM_FI_DEV_DEC_UTIL{container!="",%s}[%s])) '
                     "by (container, pod, namespace, device, modelName, UUID, uid, %s)")
# OpenCost's defaults: cluster label cluster_id, no cluster filter.
OPENCOST_CLUSTER_LABEL = "cluster_id"
OPENCOST_CLUSTER_FILTER = ""
