"""Build the Grafana dashboards with grafana-foundation-sdk and write dashboards/*.json.

`python -m dashboards.generate` rewrites the JSON; `--check` exits 1 when it is stale.
Panels query the exporter's families (exporter/metrics.py, named here as strings) and the
recording rules of alerts/gpu-ledger-recording.yml (documented in docs/recording-rules.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders import dashboard as dash
from grafana_foundation_sdk.builders import prometheus, stat, table, timeseries
from grafana_foundation_sdk.builders.common import (
    ReduceDataOptions,
    StackingConfig,
    VizLegendOptions,
    VizTooltipOptions,
)
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.common import (
    BigValueGraphMode,
    LegendDisplayMode,
    LegendPlacement,
    SortOrder,
    StackingMode,
    TableCellHeight,
    TooltipDisplayMode,
)
from grafana_foundation_sdk.models.dashboard import (
    DashboardCursorSync,
    DataSourceRef,
    DataTransformerConfig,
    VariableOption,
    VariableRefresh,
    VariableSort,
)
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

from alerts.generate import (
    JOULES_PER_KWH,
    METERING_MORE_SERIES,
    TEAM_CARBON_KG,
    TEAM_ENERGY_KWH,
    fleet_heading_over,
    fleet_over_budget,
)
from gpu_ledger.generated import sync
from gpu_ledger.sharing import SharingMode

HERE = Path(__file__).resolve().parent
DS = DataSourceRef(type_val="prometheus", uid="${datasource}")
# Grafana's latest dashboard schema version (LATEST_VERSION in grafana/grafana
# apps/dashboard/pkg/migration/schemaversion/migrations.go, Grafana 12). The SDK's model still
# defaults to 36; the migrations 37-42 touch nothing these boards contain (boolean legends,
# table displayMode, non-string refresh, timepicker time_options, hideFrom overrides), which
# tests/test_dashboards.py checks, so declaring 42 is what Grafana itself would write.
SCHEMA_VERSION = 42
TAGS = ["gpu", "gpu-ledger"]

# Label matchers shared by panels. `cluster` comes from relabelling or external labels in
# multi-cluster setups; its "All" value is `.*`, which also matches series without the label.
CL = 'cluster=~"$cluster"'
# GPU Ledger's exporters are the scrape targets (job, instance) that publish its build info,
# whatever job name the deployment gives them (a namePrefix overlay, annotation discovery):
# `up` and the process_* families are selected through it, never by a fixed job value.
OWN = f"and on (job, instance) gpu_exporter_build_info{{{CL}}}"
DEV = f'{CL}, node=~"$node", gpu=~"$gpu"'
NODE = f'{CL}, node=~"$node"'
NS = f'{CL}, namespace=~"$namespace"'

Panel = Any  # an SDK panel builder (timeseries.Panel, stat.Panel, table.Panel)


class Board:
    """A dashboard under construction: numbers panels and their queries."""

    def __init__(self, uid: str, title: str, description: str, variables: tuple[str, ...]):
        self.builder = (
            dash.Dashboard(title).uid(uid).description(description).tags(TAGS)
            .time("now-6h", "now").refresh("1m").timezone("browser")
            .tooltip(DashboardCursorSync.CROSSHAIR).editable()
        )
        for var in variables:
            self.builder = self.builder.with_variable(VARIABLES[var]())
        self.next_id = 1

    def row(self, title: str) -> None:
        self.builder = self.builder.with_row(dash.Row(title).id(self._id()))

    def add(self, panel: Panel, queries: list[tuple[str, str]], width: int = 12,
            height: int = 8, description: str = "") -> None:
        panel = panel.id(self._id()).datasource(DS).span(width).height(height)
        if description:
            panel = panel.description(description)
        for i, (expr, legend) in enumerate(queries):
            q = prometheus.Dataquery().expr(expr).ref_id(chr(ord("A") + i))
            q = q.legend_format(legend) if legend else q
            if isinstance(panel, stat.Panel | table.Panel):
                q = q.instant()
            if isinstance(panel, table.Panel):
                q = q.format(PromQueryFormat.TABLE)
            panel = panel.with_target(q)
        self.builder = self.builder.with_panel(panel)

    def _id(self) -> int:
        self.next_id += 1
        return self.next_id - 1

    def json(self) -> dict[str, Any]:
        board = self.builder.build()
        board.schema_version = SCHEMA_VERSION
        doc: dict[str, Any] = json.loads(json.dumps(board, cls=JSONEncoder))
        return schema_clean(doc)


# Fields the SDK still writes that Grafana's current dashboard schema (@grafana/schema 13)
# no longer has: the board's theme `style`, and on every variable the interval-variable knobs
# and a placeholder `id`. tests/test_dashboard_schema.py type-checks the output with tsc.
STALE_BOARD_FIELDS = ("style",)
STALE_VARIABLE_FIELDS = ("auto", "auto_count", "auto_min", "id")


def schema_clean(doc: dict[str, Any]) -> dict[str, Any]:
    """Drop the fields the SDK writes that are not in Grafana's dashboard schema."""
    out = {k: v for k, v in doc.items() if k not in STALE_BOARD_FIELDS}
    templating = out.get("templating")
    if isinstance(templating, dict) and isinstance(templating.get("list"), list):
        out["templating"] = {**templating, "list": [
            {k: v for k, v in var.items() if k not in STALE_VARIABLE_FIELDS}
            for var in templating["list"]]}
    return out


# --- variables -----------------------------------------------------------------------------

def _query_var(name: str, label: str, query: str, multi: bool = True) -> Any:
    return (
        dash.QueryVariable(name).label(label).datasource(DS).query(query)
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED).sort(VariableSort.ALPHABETICAL_ASC)
        .multi(multi).include_all(True).all_value(".*")
        .current(VariableOption(selected=True, text="All", value="$__all"))
    )


VARIABLES: dict[str, Callable[[], Any]] = {
    "datasource": lambda: dash.DatasourceVariable("datasource").label("Data source")
    .type("prometheus"),
    "cluster": lambda: _query_var("cluster", "Cluster", "label_values(gpu_info, cluster)",
                                  multi=False),
    "node": lambda: _query_var("node", "Node", f"label_values(gpu_info{{{CL}}}, node)"),
    "gpu": lambda: _query_var("gpu", "GPU", f"label_values(gpu_info{{{NODE}}}, gpu)"),
    "namespace": lambda: _query_var(
        "namespace", "Namespace", f"label_values(gpu_container_allocation{{{CL}}}, namespace)"),
}


# --- panel shorthands ----------------------------------------------------------------------

# Explicit options on every panel: Grafana's dashboard validator rejects `"options": null`,
# which the SDK writes for a time series or table panel given no option.
def ts(title: str, unit: str, stack: bool = False) -> timeseries.Panel:
    p = (timeseries.Panel().title(title).unit(unit).fill_opacity(10)
         .legend(VizLegendOptions().display_mode(LegendDisplayMode.LIST)
                 .placement(LegendPlacement.BOTTOM).show_legend(True))
         .tooltip(VizTooltipOptions().mode(TooltipDisplayMode.MULTI).sort(SortOrder.DESCENDING)))
    return p.stacking(StackingConfig().mode(StackingMode.NORMAL)) if stack else p


def st(title: str, unit: str = "none") -> stat.Panel:
    return (stat.Panel().title(title).unit(unit).graph_mode(BigValueGraphMode.NONE)
            .reduce_options(ReduceDataOptions().calcs(["lastNotNull"])))


def tab(title: str, merge: bool = False) -> table.Panel:
    """A table; `merge` joins its queries' frames into one row per label set (Grafana's
    "merge" transformation), so several instant queries read as columns of one table."""
    p = table.Panel().title(title).show_header(True).cell_height(TableCellHeight.SM)
    return p.with_transformation(DataTransformerConfig(id_val="merge", options={})) if merge else p


# --- the boards ----------------------------------------------------------------------------

def fleet() -> Board:
    b = Board("gpu-ledger-fleet", "GPU Ledger / Fleet overview",
              "GPUs by model and health, utilisation, memory, power, XIDs, allocation vs idle.",
              ("datasource", "cluster", "node"))
    b.row("Inventory and health")
    b.add(st("GPUs"), [(f"count(gpu_info{{{NODE}}})", "")], width=4, height=4)
    b.add(st("GPUs answering"), [(f"sum(gpu_up{{{NODE}}})", "")], width=4, height=4)
    b.add(st("GPUs lost"), [(f"count(gpu_up{{{NODE}}} == 0) or vector(0)", "")],
          width=4, height=4)
    b.add(st("MIG instances"), [(f"count(gpu_mig_info{{{NODE}}}) or vector(0)", "")],
          width=4, height=4)
    b.add(st("Allocated GPUs", "none"),
          [(f"sum(cluster:gpu_allocated:gpus{{{CL}}})", "")], width=4, height=4,
          description="GPU-equivalents allocated to containers (MIG slices and shares count "
                      "as fractions).")
    b.add(st("Exporters up"), [(f"sum(up {OWN}) or vector(0)", "")], width=4, height=4)
    b.add(tab("GPUs by model and health"),
          [(f"count by (model) (gpu_info{{{NODE}}})", ""),
           (f"sum by (model) (gpu_up{{{NODE}}})", "")], width=12,
          description="A: GPUs listed, B: GPUs answering NVML.")
    b.add(tab("Driver and CUDA versions"),
          [(f"count by (driver_version, cuda_version, mig_mode) (gpu_info{{{NODE}}})", "")],
          width=12)
    b.row("Usage")
    b.add(ts("Utilisation by node (whole GPUs)", "percentunit"),
          [(f"avg by (node) (gpu_utilization_ratio{{{NODE}}})", "{{node}}")])
    b.add(ts("GPUs busy (GPU-equivalents)", "none"),
          [(f"sum(cluster:gpu_used:gpus{{{CL}}})", "busy"),
           (f"sum(cluster:gpu_capacity:gpus{{{CL}}})", "capacity")])
    b.add(ts("Memory used by node", "percentunit"),
          [(f"sum by (node) (gpu_memory_used_bytes{{{NODE}}}) / "
            f"sum by (node) (gpu_memory_total_bytes{{{NODE}}})", "{{node}}")])
    b.add(ts("Power by node", "watt", stack=True),
          [(f"sum by (node) (gpu_power_watts{{{NODE}}})", "{{node}}")])
    b.row("Allocation and errors")
    b.add(ts("Allocated vs idle GPUs", "none", stack=True),
          [(f"sum(cluster:gpu_allocated:gpus{{{CL}}})", "allocated"),
           (f"sum(cluster:gpu_capacity:gpus{{{CL}}}) - sum(cluster:gpu_allocated:gpus{{{CL}}})",
            "idle")])
    b.add(ts("XID events by code", "none"),
          [(f"sum by (xid) (increase(gpu_xid_errors_total{{{NODE}}}[$__rate_interval]))",
            "XID {{xid}}")],
          description="Application XIDs (13, 31, 43) are included here but never alert.")
    return b


def node_detail() -> Board:
    b = Board("gpu-ledger-node", "GPU Ledger / Node and GPU detail",
              "Every device and MIG family of the selected GPUs, throttle reasons, ECC, NVLink, "
              "XID by code, and the exporter's own health.",
              ("datasource", "cluster", "node", "gpu"))
    g = "{{node}} GPU {{gpu}}"
    b.row("Devices")
    b.add(tab("GPUs"),
          [(f"gpu_info{{{DEV}}}", ""), (f"gpu_up{{{DEV}}}", "")], width=24, height=6)
    b.add(ts("Utilisation", "percentunit"),
          [(f"gpu_utilization_ratio{{{DEV}}}", g + " kernel"),
           (f"gpu_memory_utilization_ratio{{{DEV}}}", g + " memory")])
    b.add(ts("Encoder / decoder", "percentunit"),
          [(f"gpu_encoder_utilization_ratio{{{DEV}}}", g + " enc"),
           (f"gpu_decoder_utilization_ratio{{{DEV}}}", g + " dec")])
    b.add(ts("SM activity (GPM)", "percentunit"),
          [(f"gpu_sm_active_ratio{{{DEV}}}", g + " {{profile}} active"),
           (f"gpu_sm_occupancy_ratio{{{DEV}}}", g + " {{profile}} occupancy")])
    b.add(ts("Tensor and DRAM activity (GPM)", "percentunit"),
          [(f"gpu_tensor_active_ratio{{{DEV}}}", g + " {{profile}} tensor"),
           (f"gpu_dram_active_ratio{{{DEV}}}", g + " {{profile}} dram")])
    b.add(ts("Memory", "bytes"),
          [(f"gpu_memory_used_bytes{{{DEV}}}", g + " used"),
           (f"gpu_memory_free_bytes{{{DEV}}}", g + " free"),
           (f"gpu_memory_reserved_bytes{{{DEV}}}", g + " reserved"),
           (f"gpu_memory_total_bytes{{{DEV}}}", g + " total")])
    b.add(ts("Temperature", "celsius"),
          [(f"gpu_temperature_celsius{{{DEV}}}", g + " core"),
           (f"gpu_memory_temperature_celsius{{{DEV}}}", g + " memory")])
    b.add(ts("Power", "watt"),
          [(f"gpu_power_watts{{{DEV}}}", g), (f"gpu_power_limit_watts{{{DEV}}}", g + " limit"),
           (f"rate(gpu_energy_joules_total{{{DEV}}}[$__rate_interval])", g + " from energy"),
           # an Intel Max tile's part of its card's power (not added to the card's)
           (f"rate(gpu_partition_energy_joules_total{{{DEV}}}[$__rate_interval])",
            g + " {{mig_uuid}} from energy")])
    b.add(ts("Clocks", "hertz"),
          [(f"gpu_sm_clock_hertz{{{DEV}}}", g + " SM"),
           (f"gpu_memory_clock_hertz{{{DEV}}}", g + " memory")])
    b.add(ts("Partition busy (Intel tiles)", "percentunit"),
          [(f"gpu_partition_utilization_ratio{{{DEV}}}", g + " {{profile}} {{mig_uuid}}")])
    b.add(ts("PCIe and GPU link throughput", "binBps"),
          [(f"gpu_pcie_throughput_bytes_per_second{{{DEV}}}",
            g + " {{profile}} PCIe {{direction}}"),
           (f"gpu_nvlink_throughput_bytes_per_second{{{DEV}}}",
            g + " {{profile}} NVLink {{direction}}"),
           # XGMI, Xe Link (NVLink is the line above)
           (f'gpu_link_throughput_bytes_per_second{{{DEV},link_type!="nvlink"}}',
            g + " {{profile}} {{link_type}} {{direction}}")])
    b.row("Throttling")
    b.add(ts("Clock event reasons active", "none"),
          [(f"gpu_clock_event_active{{{DEV}}} > 0", g + " {{reason}}")])
    b.add(ts("Time held below target clocks", "percentunit"),
          [(f"rate(gpu_throttle_seconds_total{{{DEV}}}[$__rate_interval])", g + " {{reason}}")])
    b.row("Reliability")
    b.add(ts("ECC errors", "none"),
          [(f"increase(gpu_ecc_errors_total{{{DEV}}}[$__rate_interval])", g + " {{type}}")],
          width=8)
    b.add(ts("Row remapping", "none"),
          [(f"gpu_remapped_rows{{{DEV}}}", g + " {{kind}}"),
           (f"gpu_row_remap_pending{{{DEV}}}", g + " pending"),
           (f"gpu_row_remap_failure{{{DEV}}}", g + " failure")], width=8)
    b.add(ts("PCIe replays", "none"),
          [(f"increase(gpu_pcie_replay_total{{{DEV}}}[$__rate_interval])", g)], width=8)
    b.add(ts("NVLink errors", "none"),
          [(f"increase(gpu_nvlink_errors_total{{{DEV}}}[$__rate_interval])",
            g + " link {{link}} {{type}}")])
    b.add(ts("XID events by code", "none"),
          [(f"increase(gpu_xid_errors_total{{{DEV}}}[$__rate_interval])", g + " XID {{xid}}")])
    b.add(tab("Last XID per code"),
          [(f"gpu_xid_last_timestamp_seconds{{{DEV}}} * 1000", "")], width=24, height=6)
    # Other vendors' errors (AMD RAS): per-block counts and events by kind and code
    b.add(ts("RAS errors by block", "none"),
          [(f"increase(gpu_ras_errors_total{{{DEV}}}[$__rate_interval])",
            g + " {{block}} {{type}}")], width=8)
    b.add(ts("Error events by code (AMD RAS)", "none"),
          [(f"increase(gpu_error_events_total{{{DEV}}}[$__rate_interval])",
            g + " {{kind}} {{code}} {{error_severity}}")], width=8)
    b.add(tab("Last error event per code"),
          [(f"gpu_error_event_last_timestamp_seconds{{{DEV}}} * 1000", "")], width=8)
    b.row("MIG")
    b.add(tab("MIG instances"), [(f"gpu_mig_info{{{DEV}}}", "")], width=24, height=6)
    b.add(ts("MIG memory", "bytes"),
          [(f"gpu_mig_memory_used_bytes{{{DEV}}}", g + " {{profile}} used"),
           (f"gpu_mig_memory_total_bytes{{{DEV}}}", g + " {{profile}} total")])
    b.add(ts("MIG power share (by slices)", "watt", stack=True),
          [(f"mig:gpu_power:watts{{{DEV}}}", g + " {{profile}} {{mig_uuid}}")])
    b.row("Exporter")
    b.add(ts("Collector success", "none"),
          [("gpu_exporter_collector_success", "{{instance}} {{collector}}")], width=8)
    b.add(ts("Collector duration", "s"),
          [("gpu_exporter_collector_duration_seconds", "{{instance}} {{collector}}")], width=8)
    b.add(ts("Sample age", "s"),
          [("time() - gpu_exporter_last_sample_timestamp_seconds", "{{instance}}")], width=8)
    b.add(tab("Sources"),
          [("gpu_exporter_source_up", ""), ("gpu_exporter_build_info", "")], width=24, height=6)
    # PCI functions (no NVML needed) against GPUs answering NVML: a gap is a lost GPU.
    b.add(ts("GPUs expected (PCI) vs answering (NVML)", "none"),
          [("gpu_expected_devices", "{{node}} expected ({{source}})"),
           ("gpu_answering_devices", "{{node}} answering")], width=24, height=6)
    # The standard process_* families: every exporter serves them, so keep GPU Ledger's.
    b.add(ts("Exporter resident memory", "bytes"),
          [(f"process_resident_memory_bytes {OWN}", "{{instance}}")], width=6)
    b.add(ts("Exporter CPU", "percentunit"),
          [(f"rate(process_cpu_seconds_total[$__rate_interval]) {OWN}", "{{instance}}")],
          width=6)
    b.add(ts("Exporter open file descriptors", "none"),
          [(f"process_open_fds {OWN}", "{{instance}}")], width=6)
    b.add(ts("Exporter uptime", "s"),
          [(f"(time() - process_start_time_seconds) {OWN}", "{{instance}}")], width=6)
    # Non-zero only when the API server or kubelet sent text that is not valid Unicode.
    b.add(ts("Label values repaired (per hour)", "none"),
          [("increase(gpu_exporter_label_values_replaced_total[1h])", "{{instance}}")],
          width=24, height=6)
    return b


# Allocation sources and sharing modes (docs/attribution.md): the exporter's `sharing` label,
# and DRA claims, whose `resource` is the DRA driver's name (no slash, unlike device-plugin
# resource names such as nvidia.com/gpu).
# A panel for every SharingMode (a new mode without a title here fails generation).
_MODE_TITLES: dict[SharingMode, tuple[str, str]] = {
    SharingMode.EXCLUSIVE: ("holding whole GPUs", "Exclusive"),
    SharingMode.MIG: ("on MIG instances", "MIG"),
    SharingMode.TIME_SLICING: ("on time-sliced GPUs", "Time-slicing"),
    SharingMode.MPS: ("on MPS GPUs", "MPS"),
    SharingMode.FRACTIONAL: ("with fractional grants (HAMi, gpushare)", "Fractional"),
    SharingMode.VGPU: ("on vGPU instances (KubeVirt VMs)", "vGPU"),
}
SHARING_PANELS = (
    *((*_MODE_TITLES[m], f'sharing="{m}"') for m in SharingMode),
    ("through DRA ResourceClaims", "DRA", 'resource!~".+/.+"'),
)
AVG_ALLOC = f"avg_over_time(pod:gpu_allocated:gpus{{{NS}}}[$__range])"
AVG_USED = f"avg_over_time(pod:gpu_used:gpus{{{NS}}}[$__range])"


def workloads() -> Board:
    b = Board("gpu-ledger-workloads", "GPU Ledger / Workloads",
              "GPU allocation, use, memory and power per namespace, pod and team; efficiency "
              "(used / allocated), including on shared (time-sliced, MPS, MIG) GPUs.",
              ("datasource", "cluster", "namespace"))
    b.row("Namespaces")
    b.add(ts("GPUs used by namespace", "none", stack=True),
          [(f"namespace:gpu_used:gpus{{{NS}}}", "{{namespace}}")])
    b.add(ts("GPUs allocated by namespace", "none", stack=True),
          [(f"namespace:gpu_allocated:gpus{{{NS}}}", "{{namespace}}")])
    b.add(ts("Efficiency by namespace (used / allocated)", "percentunit"),
          [(f"namespace:gpu_used:gpus{{{NS}}} / namespace:gpu_allocated:gpus{{{NS}}}",
            "{{namespace}}")])
    b.add(ts("GPU memory by namespace", "bytes", stack=True),
          [(f"namespace:gpu_memory_used:bytes{{{NS}}}", "{{namespace}}")])
    b.row("Pods")
    b.add(tab("Pods"),
          [(f"pod:gpu_allocated:gpus{{{NS}}}", ""), (f"pod:gpu_used:gpus{{{NS}}}", ""),
           (f"pod:gpu_memory_used:bytes{{{NS}}}", ""), (f"pod:gpu_power:watts{{{NS}}}", "")],
          width=24, description="A: GPUs allocated, B: GPUs used, C: memory, D: power.")
    b.add(ts("GPUs used by pod", "none"),
          [(f"pod:gpu_used:gpus{{{NS}}}", "{{namespace}}/{{pod}}")])
    b.add(ts("Power by pod", "watt", stack=True),
          [(f"pod:gpu_power:watts{{{NS}}}", "{{namespace}}/{{pod}}")])
    b.add(ts("Efficiency on shared GPUs", "percentunit"),
          [(f"(pod:gpu_used:gpus{{{NS}}} / pod:gpu_allocated:gpus{{{NS}}})\n"
            "and on (namespace, pod)\n"
            f'count by (namespace, pod) (gpu_container_allocation{{{NS}, sharing!="exclusive"}})',
            "{{namespace}}/{{pod}}")],
          description="Pods on time-sliced, MPS or MIG devices: their own SM share of the "
                      "device's use over their share of the device.")
    b.add(tab("Containers on shared devices"),
          [(f'gpu_container_allocation{{{NS}, sharing!="exclusive"}}', ""),
           (f"gpu_container_sm_utilization_ratio{{{NS}}}", ""),
           (f"gpu_container_processes{{{NS}}}", "")], width=12)
    b.add(ts("Container memory", "bytes"),
          [(f"gpu_container_memory_used_bytes{{{NS}}}", "{{namespace}}/{{pod}}/{{container}}")])
    b.row("Waste")
    b.add(tab("Top waste: pods holding GPUs they don't use", merge=True),
          [(f"topk(20, {AVG_ALLOC} - {AVG_USED})", ""),
           (f"({AVG_USED} / {AVG_ALLOC})\nand on (cluster, namespace, pod)\n"
            f"topk(20, {AVG_ALLOC} - {AVG_USED})", ""),
           (f"avg_over_time(pod:gpu_cost:usd_per_hour{{{NS}}}[$__range])\n"
            f"* (1 - {AVG_USED} / {AVG_ALLOC})\nand on (cluster, namespace, pod)\n"
            f"topk(20, {AVG_ALLOC} - {AVG_USED})", "")],
          width=24,
          description="The 20 pods with the most allocated GPU-equivalents left idle, averaged "
                      "over the selected range while each pod ran. A: idle GPUs (allocated - "
                      "used), B: efficiency (used / allocated), C: idle cost per hour (USD, "
                      "example rates).")
    b.row("Sharing modes")
    for mode, title, selector in SHARING_PANELS:
        alloc = f"container:gpu_allocated:gpus{{{NS}, {selector}}}"
        b.add(ts(f"{title}: allocated vs used", "none"),
              [(f"sum({alloc})", "allocated"),
               (f"sum(container:gpu_used:gpus{{{NS}}}\n"
                f"and on (cluster, namespace, pod, container, uuid, mig_uuid) {alloc})", "used")],
              width=8, description=f"GPU-equivalents held by containers {mode} and what they "
                                   "keep busy.")
    vgpu_row(b)
    b.row("Teams")
    b.add(ts("GPUs used by team", "none", stack=True),
          [(f"team:gpu_used:gpus{{{CL}}}", "{{team}}")])
    b.add(ts("Efficiency by team", "percentunit"),
          [(f"team:gpu_used:gpus{{{CL}}} / team:gpu_allocated:gpus{{{CL}}}", "{{team}}")])
    b.add(tab("Teams"),
          [(f"team:gpu_allocated:gpus{{{CL}}}", ""), (f"team:gpu_used:gpus{{{CL}}}", ""),
           (f"team:gpu_memory_used:bytes{{{CL}}}", ""), (f"team:gpu_power:watts{{{CL}}}", "")],
          width=24)
    return b


# A vGPU instance's series carry only its vgpu_uuid; its type and VM come from gpu_vgpu_info.
VGPU_INFO = f"gpu_vgpu_info{{{CL}}}"


def by_vm(metric: str) -> str:
    return (f"{metric}{{{CL}}}\n* on (cluster, uuid, vgpu_uuid) group_left (vgpu_type, vm_id)\n"
            f"{VGPU_INFO}")


def vgpu_row(b: Board) -> None:
    """vGPU hosts (KubeVirt VMs' instances) and vGPU guests (licences): device-level series,
    so the namespace variable does not apply; the VMs' pods are in the vGPU sharing panel."""
    b.row("vGPU")
    b.add(ts("Active vGPU instances by type", "none", stack=True),
          [(f"count by (vgpu_type) ({VGPU_INFO})", "{{vgpu_type}}")], width=8,
          description="Active vGPU instances on vGPU host GPUs, by NVML vGPU type.")
    b.add(ts("vGPU framebuffer: used vs allocated, by VM", "bytes"),
          [(f"sum by (vm_id) ({by_vm('gpu_vgpu_memory_used_bytes')})", "{{vm_id}} used"),
           (f"sum by (vm_id) ({by_vm('gpu_vgpu_framebuffer_bytes')})", "{{vm_id}} allocated")],
          width=8, description="Framebuffer each VM's vGPU instances use, against what their "
                               "types allocate.")
    b.add(ts("vGPU utilisation by VM", "percentunit"),
          [(f"max by (vm_id, vgpu_type) ({by_vm('gpu_vgpu_utilization_ratio')})",
            "{{vm_id}} ({{vgpu_type}})")],
          width=8, description="SM utilisation of each VM's vGPU instance, as a share of the "
                               "whole GPU.")
    b.add(tab("vGPU instances", merge=True),
          [(by_vm("gpu_vgpu_framebuffer_bytes"), ""), (by_vm("gpu_vgpu_memory_used_bytes"), ""),
           (by_vm("gpu_vgpu_utilization_ratio"), "")],
          width=16, description="One row per active vGPU instance: A: framebuffer of its "
                                "type, B: framebuffer used, C: SM utilisation (0-1 of the GPU).")
    b.add(ts("vGPU guest licence (1 licensed, 0 not)", "none"),
          [(f"min by (node, gpu, uuid, product) (gpu_vgpu_license_state{{{CL}}})",
            "{{node}} GPU {{gpu}}: {{product}}")],
          width=8, description="In vGPU guests: whether the GPU holds its licence. An "
                               "unlicensed vGPU is restricted by the driver (alert "
                               "GpuVgpuUnlicensed).")


def budget_status(sel: str) -> str:
    """Each team's budget status over the clusters `sel` selects, one series of value 1 with
    its `status` label: the report's rule (metering.report.model.BudgetLine.status) applied
    to the pushed figures summed over clusters, since each cluster pushes its own share and
    a per-cluster status misses a team that only the sum puts over."""
    def state(name: str, expr: str) -> str:
        return f'label_replace({expr}, "status", "{name}", "", "") * 0 + 1'
    return "\nor on (team, month)\n".join((
        state("over", fleet_over_budget(sel, "team, month")),
        state("heading_over", fleet_heading_over(sel, "team, month")),
        state("within", f"max by (team, month) (gpu_ledger_team_budget{{{sel}}})")))


def cost() -> Board:
    b = Board("gpu-ledger-cost", "GPU Ledger / Cost (live showback)",
              "Live showback at example hourly rates per GPU model (recording rules "
              "model:gpu_hourly_rate:usd, set in alerts/generate.py). Monthly chargeback "
              "comes from the metering reports and cost-model.yaml.",
              ("datasource", "cluster", "namespace"))
    b.row("Fleet")
    b.add(st("Fleet cost per hour", "currencyUSD"),
          [(f"sum(cluster:gpu_cost:usd_per_hour{{{CL}}})", "")], width=6, height=4)
    b.add(st("Allocated per hour", "currencyUSD"),
          [(f"sum(cluster:gpu_allocated_cost:usd_per_hour{{{CL}}})", "")], width=6, height=4)
    b.add(st("Idle per hour", "currencyUSD"),
          [(f"sum(cluster:gpu_cost:usd_per_hour{{{CL}}}) - "
            f"sum(cluster:gpu_allocated_cost:usd_per_hour{{{CL}}})", "")], width=6, height=4)
    b.add(st("Fleet cost, 30 days at this rate", "currencyUSD"),
          [(f"sum(cluster:gpu_cost:usd_per_hour{{{CL}}}) * 24 * 30", "")], width=6, height=4)
    b.add(ts("Cost per hour: allocated vs idle", "currencyUSD", stack=True),
          [(f"sum(cluster:gpu_allocated_cost:usd_per_hour{{{CL}}})", "allocated"),
           (f"sum(cluster:gpu_cost:usd_per_hour{{{CL}}}) - "
            f"sum(cluster:gpu_allocated_cost:usd_per_hour{{{CL}}})", "idle")])
    b.add(ts("Cost per hour by model", "currencyUSD", stack=True),
          [(f"sum by (model) (gpu:hourly_rate:usd{{{CL}}})", "{{model}}")])
    b.row("Showback")
    b.add(ts("Cost per hour by team", "currencyUSD", stack=True),
          [(f"team:gpu_cost:usd_per_hour{{{CL}}}", "{{team}}")])
    b.add(ts("Cost per hour by namespace", "currencyUSD", stack=True),
          [(f"namespace:gpu_cost:usd_per_hour{{{NS}}}", "{{namespace}}")])
    b.add(tab("Cost over the selected range by namespace (USD)"),
          [(f"sum by (namespace) (avg_over_time(namespace:gpu_cost:usd_per_hour{{{NS}}}"
            "[$__range])) * $__range_s / 3600", "")], width=12)
    b.add(tab("Unused allocation per hour by team (USD)"),
          [(f"team:gpu_cost:usd_per_hour{{{CL}}}\n"
            f"* (1 - team:gpu_used:gpus{{{CL}}} / team:gpu_allocated:gpus{{{CL}}})", "")],
          width=12, description="Cost of allocated GPU time the team left idle.")
    b.add(tab("Pods by cost per hour (USD)"),
          [(f"sort_desc(pod:gpu_cost:usd_per_hour{{{NS}}})", "")], width=12)
    b.add(tab("Example hourly rates (USD per GPU-hour)"),
          [("model:gpu_hourly_rate:usd", "")], width=12)
    b.row("Energy and carbon (live)")
    # Recording rules (docs/recording-rules.md "Power, energy and carbon"): holders' power as
    # the ledger splits energy, the rest idle; CO2e at the metering job's intensity per cluster.
    b.add(st("GPU power now", "watt"), [(f"sum(cluster:gpu_power:watts{{{CL}}})", "")],
          width=5, height=4)
    b.add(st("Idle power now", "watt"), [(f"sum(cluster:gpu_idle_power:watts{{{CL}}})", "")],
          width=5, height=4, description="Power no holder accounts for: unheld GPUs and MIG "
          "slices, and the idle time of shared GPUs.")
    b.add(st("GPU energy, last hour", "kwatth"),
          [(f"sum(cluster:gpu_energy_joules:increase1h{{{CL}}}) / {JOULES_PER_KWH:g}", "")],
          width=5, height=4)
    b.add(st("CO2e, last hour (estimate)", "massg"),
          [(f"sum(cluster:gpu_carbon_grams:increase1h{{{CL}}})", "")], width=5, height=4,
          description="Energy x the cluster's grid intensity (gCO2e/kWh).")
    b.add(st("Grid intensity (gCO2e/kWh)"),
          [(f"cluster:gpu_carbon_intensity:grams_per_kwh{{{CL}}}", "{{cluster}}")],
          width=4, height=4, description="From the metering job's cost model (carbon), else "
          "the example figure set in alerts/generate.py.")
    b.add(ts("Power by team, and idle", "watt", stack=True),
          [(f"team:gpu_power:watts{{{CL}}}", "{{team}}"),
           (f"sum(cluster:gpu_idle_power:watts{{{CL}}})", "idle")],
          description="Stacked, the series add up to the GPUs' power.")
    b.add(ts("Power by namespace", "watt", stack=True),
          [(f"namespace:gpu_power:watts{{{NS}}}", "{{namespace}}")])
    b.add(ts("Power by GPU model: held and idle", "watt", stack=True),
          [(f"sum by (model) (model:gpu_power:watts{{{CL}}})\n"
            f"- sum by (model) (model:gpu_idle_power:watts{{{CL}}})", "{{model}} held"),
           (f"sum by (model) (model:gpu_idle_power:watts{{{CL}}})", "{{model}} idle")])
    b.add(tab("Energy and CO2e of the last hour by team", merge=True),
          [(f"sum by (team) (team:gpu_energy_joules:increase1h{{{CL}}}) / {JOULES_PER_KWH:g}",
            ""),
           (f"sum by (team) (team:gpu_carbon_grams:increase1h{{{CL}}}) / 1000", "")],
          description="A: kWh, B: kg CO2e (live estimate; the month's figures come from "
          "metering, below).")
    b.add(tab("Energy and CO2e of the last hour by namespace", merge=True),
          [(f"sum by (namespace) (namespace:gpu_energy_joules:increase1h{{{NS}}}) / "
            f"{JOULES_PER_KWH:g}", ""),
           (f"sum by (namespace) (namespace:gpu_carbon_grams:increase1h{{{NS}}}) / 1000", "")],
          description="A: kWh, B: kg CO2e.")
    b.add(tab("Energy of the last hour by GPU model", merge=True),
          [(f"sum by (model) (model:gpu_energy_joules:increase1h{{{CL}}}) / {JOULES_PER_KWH:g}",
            ""),
           (f"sum by (model) (model:gpu_idle_energy_joules:increase1h{{{CL}}}) / "
            f"{JOULES_PER_KWH:g}", "")],
          width=24, height=6, description="A: kWh drawn, B: of which idle (no holder).")
    b.row("Budgets (from metering)")
    # Pushed by `gpu-ledger meter --pushgateway` (metering/publish.py) per metered cluster:
    # spend and forecast add up over clusters' ledgers, a team's budget is one figure.
    b.add(tab("Team budgets this month (cost model currency)", merge=True),
          [(f"sum by (team, month) (gpu_ledger_team_spend_month_to_date{{{CL}}})", ""),
           (f"max by (team, month) (gpu_ledger_team_budget{{{CL}}})", ""),
           (f"sum by (team, month) (gpu_ledger_team_forecast_month_end{{{CL}}})", ""),
           (budget_status(CL), "")],
          width=18, description="From the last metering run: A: spend so far this month "
          "(the team's bill: compute, energy line and adjustments billed in the month), "
          "B: monthly budget, C: forecast to month end (usage so far extrapolated "
          "linearly plus adjustments, as in the report), D: status of the selected "
          "clusters together, as the report decides it: over once A is over B, "
          "heading_over once C reaches B x budgets.warn_at (alerts "
          "GpuLedgerBudgetHeadingOver, GpuLedgerBudgetOverAcrossClusters, "
          "GpuLedgerBudgetHeadingOverAcrossClusters).")
    b.add(tab("Team energy and CO2e this month (from metering)", merge=True),
          [(f"sum by (team, month) ({TEAM_ENERGY_KWH}{{{CL}}})", ""),
           (f"sum by (team, month) ({TEAM_CARBON_KG}{{{CL}}})", "")],
          width=18, description="From the last metering run: A: kWh of measured GPU energy "
          "split to the team, B: kg CO2e at the cost model's carbon intensity.")
    b.add(st("Hours since last metering run", "h"),
          [(f"(time() - max by (cluster) "
            f"(gpu_ledger_meter_last_success_timestamp_seconds{{{CL}}})) / 3600", "{{cluster}}")],
          width=6, height=8, description="Per cluster, since its last successful `gpu-ledger "
          "meter` run (alert GpuLedgerMeteringStale).")
    b.add(tab("Series added up that gpu_up does not have (last metering run)"),
          [(f"sum by (cluster, family) ({METERING_MORE_SERIES}{{{CL}}}) > 0", "")],
          width=24, height=6, description="Per cluster and family, the GPU-, MIG-instance- or "
          "container-hours in which the last `gpu-ledger meter` run added up more series of "
          "the family than the key's gpu_up, gpu_mig_info or gpu_container_allocation had: "
          "right where they followed each other, twice the value where they overlapped. "
          "Empty when none (alert GpuLedgerMeteringSeriesAddedUp; docs/runbooks.md).")
    return b


BOARDS: dict[str, Callable[[], Board]] = {
    "fleet.json": fleet,
    "node.json": node_detail,
    "workloads.json": workloads,
    "cost.json": cost,
}


def render(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def outputs() -> dict[Path, str]:
    return {HERE / name: render(make().json()) for name, make in BOARDS.items()}


def expressions(doc: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(where, PromQL) for every panel target and query variable of a dashboard document."""
    for panel in doc.get("panels", []):
        for inner in [panel, *panel.get("panels", [])]:
            for target in inner.get("targets") or []:
                yield f"{doc['uid']}: {inner.get('title')} [{target['refId']}]", target["expr"]
    for var in doc.get("templating", {}).get("list", []):
        if var.get("type") == "query":
            yield f"{doc['uid']}: variable {var['name']}", var["query"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dashboards.generate", description=__doc__)
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if a committed dashboard differs from the generator")
    args = parser.parse_args(argv)
    return sync(outputs(), args.check, "python -m dashboards.generate")

if __name__ == "__main__":
    sys.exit(main())
