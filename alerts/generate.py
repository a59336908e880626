"""Generate the Prometheus rule files from the tables below.

`python -m alerts.generate` rewrites alerts/gpu-ledger-alerts.yml and
alerts/gpu-ledger-recording.yml (and the optional views); `--check` exits 1 when the
committed files are stale.
Every threshold, `for` duration, the exporter's job matcher and the example hourly rates are
set here and nowhere else. Metric names come from the exporter's contract (exporter/metrics.py)
as strings: alerts/ never imports the exporter.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, get_type_hints

import yaml

from gpu_ledger.generated import sync
from metering import publish
from metering.signals import SIGNALS

HERE = Path(__file__).resolve().parent
ALERTS_FILE = HERE / "gpu-ledger-alerts.yml"
RECORDING_FILE = HERE / "gpu-ledger-recording.yml"
# Optional, so not under alerts/ directly (deploy/generate.py puts those in the base's
# PrometheusRule): the deploy/components/dcgm-compat Kustomize component adds it.
DCGM_FILE = HERE / "optional" / "gpu-ledger-dcgm.yml"
OTEL_FILE = HERE / "optional" / "gpu-ledger-otel.yml"
# The metering series in MetricsQL, for vmalert in front of VictoriaMetrics (last-sample
# times with tlast_over_time, as metering asks VictoriaMetrics for them).
METERING_VM_FILE = HERE / "optional" / "gpu-ledger-metering-vm.yml"

# --- the one place to change ------------------------------------------------------------------
# The exporter's scrape job: the ServiceMonitor's Service name, or job_name in a static config.
RUNBOOK_BASE = "https://github.com/gpu-ledger/gpu-ledger/blob/main/docs/runbooks.md"
# Pod label that names a team, as the exporter renders it (allow-listed pod label `team`).
TEAM_LABEL = "label_team"


@dataclass(frozen=True)
class Config:
    """Selectors and thresholds of the alerts. A user changes them with an override file
    (`python -m alerts.generate --config my.yaml --out DIR`, docs/runbooks.md "Configuring
    the alerts"), never by editing the generated rule files."""
    # Label matchers added to every selector of the exporter's series in the alerts (`up`,
    # `gpu_*`, `process_*`): the job the ServiceMonitor takes from the Service's
    # gpu-ledger.io/job label, or job_name in a static config. Add matchers (namespace="x",
    # cluster="a") to scope the alerts further; keep the job matcher.
    exporter_selector: str = 'job="gpu-ledger-exporter"'
    gpu_temp_warning_c: float = 85
    gpu_temp_warning_for: str = "5m"
    gpu_temp_critical_c: float = 90
    gpu_temp_critical_for: str = "2m"
    memory_temp_warning_c: float = 90
    memory_temp_warning_for: str = "5m"
    memory_full_ratio: float = 0.95
    memory_full_for: str = "15m"
    # A critical XID keeps the alert firing this long after its last event.
    xid_critical_window_s: int = 600
    # Non-critical XIDs alert when one code repeats this often within the window.
    xid_repeat_count: int = 3
    xid_repeat_window_s: int = 3600
    ecc_window: str = "10m"
    row_remap_pending_for: str = "5m"
    thermal_slowdown_for: str = "5m"
    power_brake_for: str = "1m"
    # Power far from its hourly mean: this many standard deviations away, and at least this
    # many watts (a flat series has a deviation of zero), for this long.
    power_anomaly_stddevs: float = 3
    power_anomaly_min_watts: float = 50
    power_anomaly_for: str = "2m"
    # Sustained full use is information (capacity planning), not a fault.
    full_utilization_ratio: float = 0.95
    full_utilization_for: str = "1h"
    sw_power_cap_for: str = "30m"
    nvlink_window: str = "15m"
    nvlink_crc_errors: int = 100  # CRC errors per window; replay/recovery alert on the first
    # A fatal error event (AMD RAS) keeps the alert firing this long after its last event.
    error_event_window_s: int = 600
    ras_window: str = "10m"
    gpu_lost_for: str = "1m"
    gpu_gone_lookback: str = "1h"
    gpu_gone_for: str = "5m"
    gpu_not_answering_for: str = "5m"
    # A vGPU guest's GPU without an active licence (the driver restricts it) for this long.
    vgpu_unlicensed_for: str = "10m"
    exporter_down_for: str = "5m"
    exporter_absent_for: str = "15m"
    collector_failing_for: str = "10m"
    stale_sample_s: int = 120
    stale_sample_for: str = "2m"
    attribution_lost_for: str = "10m"
    # Allocations the exporter saw but could not attribute or classify (unresolved device IDs,
    # unreadable fractional grants or shared DRA claims) within this window, for this long.
    attribution_incomplete_window: str = "30m"
    attribution_incomplete_for: str = "15m"
    nvml_down_for: str = "5m"
    # The exporter's resident memory grew this much within one process's lifetime (a leak).
    exporter_memory_growth_window: str = "6h"
    exporter_memory_growth_ratio: float = 1.5
    exporter_memory_growth_min_bytes: int = 32 * 1024 * 1024
    exporter_memory_growth_for: str = "15m"
    # The state `gpu-ledger meter --pushgateway` pushes (metering/publish.py), as Prometheus
    # scrapes it from the Pushgateway with honor_labels: job is the pushed group's job.
    metering_selector: str = 'job="gpu_ledger_meter"'
    # No successful metering run of a cluster for this long: a daily run missed a day.
    metering_stale_hours: int = 26
    metering_stale_for: str = "10m"
    budget_heading_over_for: str = "30m"


DEFAULT_CONFIG = Config()

CRITICAL_XIDS = (48, 63, 64, 74, 79, 94, 95, 119, 120)
# Raised by the application's own faults (illegal address, MMU fault, context reset): noise
# for an operator, so never alerted on.
APPLICATION_XIDS = (13, 31, 43)
# Largest time-slicing / MPS replica count the allocation rules understand (the exporter gives
# replicas as a label and PromQL cannot turn a label into a number, so the rule enumerates it).
MAX_REPLICAS = 16
# Compute slices of a MIG profile and of its parent are labels too; enumerated up to this.
MAX_MIG_SLICES = 8

# Example live-showback rates in USD per GPU-hour, by the model name NVML reports. Monthly
# chargeback uses cost-model.yaml; these only drive the cost dashboard. Models not listed get
# DEFAULT_HOURLY_RATE_USD.
EXAMPLE_HOURLY_RATES_USD: dict[str, float] = {
    "NVIDIA H100 80GB HBM3": 4.00,
    "NVIDIA A100-SXM4-80GB": 2.50,
    "NVIDIA L4": 0.80,
}
DEFAULT_HOURLY_RATE_USD = 2.00
# Example grid carbon intensity (gCO2e per kWh) for the live carbon estimate of clusters whose
# metering job pushes none (CARBON_INTENSITY below); replace it with your grid's and regenerate.
EXAMPLE_CARBON_INTENSITY_G_PER_KWH = 400.0
# Series the metering job pushes per cluster (`gpu-ledger meter --pushgateway`,
# metering/publish.py): the cost model's carbon intensity of the cluster now, and each team's
# month-to-date energy and CO2e from the ledger. Read by the rules and the cost dashboard.
CARBON_INTENSITY = publish.CARBON_INTENSITY
TEAM_ENERGY_KWH = publish.ENERGY
TEAM_CARBON_KG = publish.CO2E
# Hours the last metering run added up a family's series that its count family lacks.
METERING_MORE_SERIES = publish.MORE_SERIES
METERING_ENERGY_PUSHES = (CARBON_INTENSITY, TEAM_ENERGY_KWH, TEAM_CARBON_KG)
JOULES_PER_KWH = 3.6e6


# The report's budget rule (metering.report.model.BudgetLine.status) over the teams' figures
# summed across the clusters `sel` selects, each cluster pushing its own share: the fleet
# alerts and the Cost dashboard's status column read these. `by`: the grouping labels.
def fleet_over_budget(sel: str, by: str) -> str:
    return (f"sum by ({by}) ({publish.SPEND}{{{sel}}})\n"
            f"  > max by ({by}) ({publish.BUDGET}{{{sel}}})")


def fleet_heading_over(sel: str, by: str) -> str:
    return (f"sum by ({by}) ({publish.FORECAST}{{{sel}}})\n"
            f"  >= max by ({by}) ({publish.WARN_FROM}{{{sel}}})")


def xid_regex(codes: tuple[int, ...]) -> str:
    return "|".join(str(c) for c in codes)


def new_events(selector: str, window: str) -> str:
    """Events a counter gained within `window`, including a series' first sample.

    increase() needs two samples, so it misses the events that make a counter series appear
    (an XID counter is only created by its first event). Series that already existed a window
    ago use increase(); younger ones count from zero, i.e. their whole value.
    """
    return (f"(increase({selector}[{window}]) and {selector} offset {window})\n"
            f"or ({selector} unless {selector} offset {window})")


# A vector selector of a series the exporter's scrape produces: its own families (gpu_*,
# process_*) and `up`, not a function call, a recording rule (name:with:colons) or a label in a
# template or a string.
_EXPORTER_SELECTOR = re.compile(
    r'(?<![\w:"$.])((?:gpu|process)_[a-z_]+|up)\b(?:\{([^}]*)\})?(?!\s*\()')


def scoped(expr: str, selector: str) -> str:
    """`expr` with `selector` (Config.exporter_selector) added to every selector of the
    exporter's series, as a mixin's selectors are: the alerts then see only that scrape job
    (and cluster, namespace, ... if the selector names them)."""
    if not selector:
        return expr

    def add(m: re.Match[str]) -> str:
        own = m.group(2)
        return f"{m.group(1)}{{{selector}{', ' + own if own else ''}}}"

    return _EXPORTER_SELECTOR.sub(add, expr)


# --- alert annotations -----------------------------------------------------------------------

GPU = "GPU {{ $labels.gpu }} ({{ $labels.model }}, {{ $labels.uuid }}) on node {{ $labels.node }}"
MIG = ("MIG instance {{ $labels.profile }} ({{ $labels.mig_uuid }}) of GPU {{ $labels.gpu }} "
       "({{ $labels.model }}, {{ $labels.uuid }}) on node {{ $labels.node }}")
EXPORTER = "The GPU Ledger exporter at {{ $labels.instance }}"


def pods_on(label: str) -> str:
    """Template text naming the pods allocated the alert's device (looked up when it fires),
    so the alert stays one per device instead of one per pod."""
    q = (f"printf `count by (namespace, pod) (gpu_container_allocation{{{label}=\"%s\"}})` "
         f"$labels.{label}")
    return ("{{ with query (" + q + ") | sortByLabel \"pod\" }}Allocated to "
            "{{ range $i, $s := . }}{{ if $i }}, {{ end }}{{ $s.Labels.namespace }}/"
            "{{ $s.Labels.pod }}{{ end }}.{{ else }}No pod is allocated to it.{{ end }}")


PODS = pods_on("uuid")


@dataclass(frozen=True)
class Alert:
    name: str
    severity: str  # critical | warning | info
    expr: str
    for_: str
    summary: str
    description: str

    @property
    def anchor(self) -> str:
        # GitHub's anchor for a "## Name" heading is the lower-cased name.
        return self.name.lower()

    def rule(self) -> dict[str, Any]:
        rule: dict[str, Any] = {"alert": self.name, "expr": self.expr}
        if self.for_ != "0m":
            rule["for"] = self.for_
        rule["labels"] = {"severity": self.severity}
        rule["annotations"] = {
            "summary": self.summary,
            "description": self.description,
            "runbook_url": f"{RUNBOOK_BASE}#{self.anchor}",
        }
        return rule


CRIT = xid_regex(CRITICAL_XIDS)
NOT_OPERATOR = xid_regex(CRITICAL_XIDS + APPLICATION_XIDS)

def alert_groups(config: Config = DEFAULT_CONFIG) -> tuple[tuple[str, tuple[Alert, ...]], ...]:
    """The alert groups with the selectors and thresholds of `config`."""
    T = config
    DEVICE_ALERTS = (
        Alert("GpuTemperatureHigh", "warning",
              f"gpu_temperature_celsius > {T.gpu_temp_warning_c:g}", T.gpu_temp_warning_for,
              "GPU temperature is high",
              f"{GPU} has been above {T.gpu_temp_warning_c:g} °C for {T.gpu_temp_warning_for}: "
              "{{ $value }} °C. " + PODS),
        Alert("GpuTemperatureCritical", "critical",
              f"gpu_temperature_celsius > {T.gpu_temp_critical_c:g}", T.gpu_temp_critical_for,
              "GPU temperature is critical",
              f"{GPU} has been above {T.gpu_temp_critical_c:g} °C for {T.gpu_temp_critical_for}: "
              "{{ $value }} °C; the GPU will slow down or shut off. " + PODS),
        Alert("GpuMemoryTemperatureHigh", "warning",
              f"gpu_memory_temperature_celsius > {T.memory_temp_warning_c:g}",
              T.memory_temp_warning_for,
              "GPU memory temperature is high",
              f"The memory of {GPU} has been above {T.memory_temp_warning_c:g} °C for "
              f"{T.memory_temp_warning_for}: " + "{{ $value }} °C. " + PODS),
        Alert("GpuMemoryNearlyFull", "info",
              f"gpu_memory_used_bytes / gpu_memory_total_bytes > {T.memory_full_ratio:g}",
              T.memory_full_for,
              "GPU memory is nearly full",
              f"{GPU} has used more than {T.memory_full_ratio:.0%} of its memory for "
              f"{T.memory_full_for}: " + "{{ $value | humanizePercentage }}. " + PODS),
        Alert("GpuMigMemoryNearlyFull", "info",
              f"gpu_mig_memory_used_bytes / gpu_mig_memory_total_bytes > {T.memory_full_ratio:g}",
              T.memory_full_for,
              "MIG instance memory is nearly full",
              f"{MIG} has used more than {T.memory_full_ratio:.0%} of its memory for "
              f"{T.memory_full_for}: " + "{{ $value | humanizePercentage }}. "
              + pods_on("mig_uuid")),
        # A guest's GPU may list several licensable features; it is unlicensed when it holds
        # none of them.
        Alert("GpuVgpuUnlicensed", "warning",
              "max without (feature, product) (gpu_vgpu_license_state) == 0",
              T.vgpu_unlicensed_for,
              "vGPU has no licence",
              f"{GPU} is a vGPU whose licence has not been active for {T.vgpu_unlicensed_for};"
              " the driver restricts an unlicensed vGPU. " + PODS),
        Alert("GpuHardwareThermalSlowdown", "warning",
              'gpu_clock_event_active{reason="hw_thermal"} == 1', T.thermal_slowdown_for,
              "GPU clocks are cut by hardware thermal slowdown",
              f"{GPU} has been in hardware thermal slowdown for {T.thermal_slowdown_for}; "
              "its work runs at reduced clocks. " + PODS),
        Alert("GpuPowerBrakeSlowdown", "warning",
              'gpu_clock_event_active{reason="hw_power_brake"} == 1', T.power_brake_for,
              "GPU clocks are cut by the power brake",
              f"{GPU} has had its external power brake asserted for {T.power_brake_for}; "
              "its work runs at reduced clocks. " + PODS),
        Alert("GpuPowerAnomalous", "warning",
              "abs(gpu_power_watts - avg_over_time(gpu_power_watts[1h]))\n"
              f"> {T.power_anomaly_stddevs:g} * stddev_over_time(gpu_power_watts[1h])\n"
              "and abs(gpu_power_watts - avg_over_time(gpu_power_watts[1h])) "
              f"> {T.power_anomaly_min_watts:g}", T.power_anomaly_for,
              "GPU power draw is far from its hourly mean",
              f"{GPU} has drawn power more than {T.power_anomaly_stddevs:g} standard deviations "
              f"(and {T.power_anomaly_min_watts:g} W) away from its mean of the last hour for "
              f"{T.power_anomaly_for}: " + "{{ $value | printf \"%.0f\" }} W off. " + PODS),
        Alert("GpuFullyUtilized", "info",
              f"gpu_utilization_ratio >= {T.full_utilization_ratio:g}", T.full_utilization_for,
              "GPU has been fully used for a long time",
              f"{GPU} has been at least {T.full_utilization_ratio:.0%} utilised for "
              f"{T.full_utilization_for}. Information for capacity planning, not a fault. "
              + PODS),
        Alert("GpuSoftwarePowerCapping", "warning",
              'gpu_clock_event_active{reason="sw_power_cap"} == 1', T.sw_power_cap_for,
              "GPU clocks are held down by its software power cap",
              f"{GPU} has been held at its power limit (sw_power_cap) for {T.sw_power_cap_for}; "
              "its work runs below full clocks. " + PODS),
        Alert("GpuLost", "critical",
              "gpu_up == 0", T.gpu_lost_for,
              "GPU stopped answering",
              f"{GPU} does not answer its driver library (lost or fallen off the bus) for "
              f"{T.gpu_lost_for}. "
              + PODS),
        Alert("GpuDisappeared", "critical",
              "(\n  max by (cluster, node, gpu, uuid, model, job, instance) "
              f"(max_over_time(gpu_info[{T.gpu_gone_lookback}]))\n"
              "  unless on (node, uuid) gpu_info\n)\n"
              "and on (instance) (up == 1)",
              T.gpu_gone_for,
              "A GPU vanished from its node",
              f"{GPU} was reported in the last {T.gpu_gone_lookback} but the exporter at "
              "{{ $labels.instance }}, which is up, no longer lists it. " + PODS),
        # Counts from sysfs, not from memory of earlier scrapes: holds across exporter restarts
        # and catches a GPU that was already dead when the exporter started.
        Alert("GpuNotAnswering", "critical",
              'gpu_expected_devices{source="pci"}\n'
              "  > ignoring (source) gpu_answering_devices", T.gpu_not_answering_for,
              "A GPU of the node does not answer its driver library",
              "Node {{ $labels.node }} has {{ $value }} GPU(s) on its PCI bus but fewer "
              "answer their driver library"
              "{{ with query (printf `gpu_answering_devices{instance=\"%s\"}` "
              "$labels.instance) }} (only {{ (index . 0).Value }}){{ end }}, for "
              f"{T.gpu_not_answering_for}: a GPU is lost or fell off the bus, possibly before the "
              "exporter started."),
    )

    RELIABILITY_ALERTS = (
        Alert("GpuCriticalXid", "critical",
              f'gpu_xid_errors_total{{xid=~"{CRIT}"}}\n'
              f'and (time() - gpu_xid_last_timestamp_seconds{{xid=~"{CRIT}"}}) '
              f"< {T.xid_critical_window_s}",
              "0m",
              "GPU reported a critical XID",
              f"{GPU} reported XID " + "{{ $labels.xid }} within the last "
              f"{T.xid_critical_window_s // 60} minutes "
              "({{ $value }} since the exporter started). " + PODS),
        Alert("GpuRepeatedXid", "warning",
              "(\n" + new_events(f'gpu_xid_errors_total{{xid!~"{NOT_OPERATOR}"}}',
                                 f"{T.xid_repeat_window_s}s")
              + f"\n) >= {T.xid_repeat_count}\n"
              f'and (time() - gpu_xid_last_timestamp_seconds{{xid!~"{NOT_OPERATOR}"}}) '
              f"< {T.xid_repeat_window_s}",
              "0m",
              "GPU repeats a non-critical XID",
              f"{GPU} reported XID " + "{{ $labels.xid }} {{ $value }} times in the last "
              f"{T.xid_repeat_window_s // 60} minutes. " + PODS),
        Alert("GpuUncorrectableEccErrors", "critical",
              "(\n" + new_events('gpu_ecc_errors_total{type="uncorrected"}', T.ecc_window)
              + "\n) > 0",
              "0m",
              "GPU had uncorrectable ECC errors",
              f"{GPU} counted " + "{{ $value }} uncorrectable ECC errors in the last "
              f"{T.ecc_window}. " + PODS),
        # Vendor-neutral beside the XID alerts: other vendors' error events and RAS counters
        # (AMD: AFID events, per-block RAS counts), docs/backends.md "Error events".
        Alert("GpuFatalErrorEvent", "critical",
              'gpu_error_events_total{error_severity="fatal"}\n'
              'and (time() - gpu_error_event_last_timestamp_seconds{error_severity="fatal"}) '
              f"< {T.error_event_window_s}",
              "0m",
              "GPU reported a fatal error event",
              f"{GPU} reported a fatal " + "{{ $labels.kind }} error event (code "
              "{{ $labels.code }}) within the last "
              f"{T.error_event_window_s // 60} minutes "
              "({{ $value }} since the exporter started). " + PODS),
        Alert("GpuUncorrectableRasErrors", "critical",
              "(\n" + new_events('gpu_ras_errors_total{type="uncorrectable"}', T.ras_window)
              + "\n) > 0",
              "0m",
              "GPU RAS block had uncorrectable errors",
              f"{GPU} counted " + "{{ $value }} uncorrectable errors in its {{ $labels.block }} "
              f"block in the last {T.ras_window}. " + PODS),
        Alert("GpuRowRemapFailure", "critical",
              "gpu_row_remap_failure == 1", "0m",
              "GPU failed to remap a memory row",
              f"{GPU} could not remap a failing memory row; the GPU needs service. " + PODS),
        Alert("GpuRowRemapPending", "warning",
              "gpu_row_remap_pending == 1", T.row_remap_pending_for,
              "GPU has a row remap pending",
              f"{GPU} has had a memory row remap pending for {T.row_remap_pending_for}; "
              "it takes effect at the next GPU reset. " + PODS),
        Alert("GpuNvlinkErrors", "warning",
              "(\n" + new_events('gpu_nvlink_errors_total{type=~"replay|recovery"}',
                                 T.nvlink_window) + "\n) > 0\nor\n(\n"
              + new_events('gpu_nvlink_errors_total{type=~"crc_flit|crc_data"}', T.nvlink_window)
              + f"\n) > {T.nvlink_crc_errors}",
              "0m",
              "GPU NVLink errors",
              f"{GPU} counted " + "{{ $value }} NVLink {{ $labels.type }} errors on link "
              "{{ $labels.link }} in the last " + f"{T.nvlink_window}. " + PODS),
    )

    EXPORTER_ALERTS = (
        Alert("GpuExporterDown", "warning",
              "up == 0", T.exporter_down_for,
              "GPU Ledger exporter is down",
              "Prometheus has failed to scrape the GPU Ledger exporter at "
              "{{ $labels.instance }} for "
              f"{T.exporter_down_for}; "
              "the GPUs of its node are unobserved."),
        Alert("GpuExporterAbsent", "warning",
              "absent(up)", T.exporter_absent_for,
              "No GPU Ledger exporter is scraped",
              "Prometheus has had no target for job {{ $labels.job }} for "
              f"{T.exporter_absent_for}."),
        Alert("GpuExporterCollectorFailing", "warning",
              "gpu_exporter_collector_success == 0", T.collector_failing_for,
              "GPU Ledger exporter collector is failing",
              f"{EXPORTER}: collector " + "{{ $labels.collector }} has failed for "
              f"{T.collector_failing_for}; its metric families are missing."),
        Alert("GpuExporterSamplesStale", "warning",
              f"time() - gpu_exporter_last_sample_timestamp_seconds > {T.stale_sample_s}",
              T.stale_sample_for,
              "GPU Ledger exporter samples are stale",
              f"{EXPORTER} last completed a sample " + "{{ $value | humanizeDuration }} ago; "
              "the sampler is stuck (a hung NVML call?)."),
        Alert("GpuAttributionLost", "warning",
              'gpu_exporter_source_up{source=~"podresources|kubernetes"} == 0',
              T.attribution_lost_for,
              "GPU usage is no longer attributed to pods",
              f"{EXPORTER} cannot reach its " + "{{ $labels.source }} source"
              + "{{ with query (printf "
              "`gpu_exporter_source_error_info{instance=\"%s\",source=\"%s\"}` "
              "$labels.instance $labels.source) }} ({{ (index . 0).Labels.reason }}){{ end }}; "
              "GPU series are served without pod labels."),
        Alert("GpuAttributionIncomplete", "warning",
              "max without (resource) (\n"
              "  increase(gpu_exporter_unresolved_device_ids_total"
              f"[{T.attribution_incomplete_window}]) > 0\n"
              "  or increase(gpu_exporter_fractional_errors_total"
              f"[{T.attribution_incomplete_window}]) > 0\n"
              "  or gpu_exporter_dra_claims_unreadable > 0\n"
              ")",
              T.attribution_incomplete_for,
              "Some GPU allocations are not attributed correctly",
              f"{EXPORTER} sees GPU allocations it cannot attribute or classify: device IDs "
              "that match no GPU of the node, fractional grants (HAMi, gpushare) it cannot "
              "read, or shared DRA claims whose sharing config it cannot read. Those devices "
              "are billed as unallocated or at the time-slicing rate; the exporter's log names "
              "each one."),
        Alert("GpuExporterNvmlUnavailable", "warning",
              'gpu_exporter_source_up{source="nvml"} == 0', T.nvml_down_for,
              "GPU Ledger exporter cannot reach NVML",
              f"{EXPORTER} cannot initialise NVML" + "{{ with query (printf "
              "`gpu_exporter_source_error_info{instance=\"%s\",source=\"nvml\"}` "
              "$labels.instance) }}"
              " ({{ (index . 0).Labels.reason }}){{ end }}; no GPU of its node is observed."),
        Alert("GpuExporterMemoryGrowing", "warning",
              "process_resident_memory_bytes\n"
              f"  > {T.exporter_memory_growth_ratio} * "
              f"(process_resident_memory_bytes offset {T.exporter_memory_growth_window})\n"
              "and process_resident_memory_bytes\n"
              "  - (process_resident_memory_bytes offset "
              f"{T.exporter_memory_growth_window}) > {T.exporter_memory_growth_min_bytes}\n"
              "and process_start_time_seconds\n"
              "  == (process_start_time_seconds offset "
              f"{T.exporter_memory_growth_window})",
              T.exporter_memory_growth_for,
              "GPU Ledger exporter memory keeps growing",
              f"{EXPORTER} now uses " + "{{ $value | humanize1024 }}B"
              f" of resident memory, more than {T.exporter_memory_growth_ratio}x what the same "
              f"process used {T.exporter_memory_growth_window} ago: "
              "a leak will get it OOM-killed."),
    )

    M = config.metering_selector
    METERING_ALERTS = (
        Alert("GpuLedgerBudgetHeadingOver", "warning",
              f'gpu_ledger_team_budget_status{{{M}, status=~"heading_over|over"}} == 1',
              T.budget_heading_over_for,
              "A team is heading over its GPU budget",
              "Team {{ $labels.team }} is {{ if eq $labels.status \"over\" }}over{{ else }}"
              "heading over{{ end }} its {{ $labels.month }} GPU budget by the last metering "
              "run of cluster {{ $labels.cluster }}"
              "{{ with query (printf `gpu_ledger_team_forecast_month_end{team=\"%s\","
              "cluster=\"%s\"}` $labels.team $labels.cluster) }}: forecast "
              "{{ (index . 0).Value | printf \"%.2f\" }} {{ (index . 0).Labels.currency }}"
              "{{ end }}."),
        # Each cluster pushes its own share of a team's bill (metering/publish.py), so the
        # per-cluster status above misses a team that only the sum puts over its budget.
        Alert("GpuLedgerBudgetOverAcrossClusters", "warning",
              fleet_over_budget(M, "team, month, currency") + "\nunless on (team, month)\n"
              f'  gpu_ledger_team_budget_status{{{M}, status="over"}} == 1',
              T.budget_heading_over_for,
              "A team's spend over all clusters is over its GPU budget",
              "Team {{ $labels.team }} has spent {{ $value | printf \"%.2f\" }} "
              "{{ $labels.currency }} over all clusters in {{ $labels.month }}, more than its "
              "budget, though no one cluster's share is."),
        # The same for the forecast: a cluster's forecast extrapolates its own share, so the
        # clusters' forecasts add up to the team's fleet forecast, heading over from the
        # pushed budget x warn_at. Not where a cluster's status already says so, nor where
        # the spend alone is over (the alert above).
        Alert("GpuLedgerBudgetHeadingOverAcrossClusters", "warning",
              fleet_heading_over(M, "team, month, currency") + "\nunless on (team, month)\n"
              f'  gpu_ledger_team_budget_status{{{M}, status=~"heading_over|over"}} == 1\n'
              "unless on (team, month)\n  " + fleet_over_budget(M, "team, month"),
              T.budget_heading_over_for,
              "A team's forecast over all clusters is heading over its GPU budget",
              "Team {{ $labels.team }}'s forecast over all clusters for {{ $labels.month }} is "
              "{{ $value | printf \"%.2f\" }} {{ $labels.currency }}, heading over its budget, "
              "though no one cluster's forecast is."),
        Alert("GpuLedgerMeteringStale", "warning",
              f"time() - gpu_ledger_meter_last_success_timestamp_seconds{{{M}}}\n"
              f"  > {T.metering_stale_hours} * 3600", T.metering_stale_for,
              "GPU metering has not succeeded recently",
              "The last successful `gpu-ledger meter` run of cluster {{ $labels.cluster }} "
              "finished {{ $value | humanizeDuration }} ago (more than "
              f"{T.metering_stale_hours} h): spend and budget figures are that old."),
        # metering/facts.py gl_more_series: a family added up per key with more series than
        # the key's count family. The samples cannot tell a relabel of that family alone
        # (right) from a scrape job copying it (twice the value): a person must look.
        Alert("GpuLedgerMeteringSeriesAddedUp", "warning",
              f"{METERING_MORE_SERIES}{{{M}}} > 0", "0m",
              "GPU metering added up series of one family that gpu_up does not have",
              "The last `gpu-ledger meter` run of cluster {{ $labels.cluster }} added up "
              "{{ $labels.family }} over more series than the GPU's, MIG instance's or "
              "container's count family in {{ $value }} hour(s): right if they followed each "
              "other (a relabel of that family alone), twice the value if they overlapped (a "
              "scrape job or rule copying only that family)."),
    )

    groups = (
        ("gpu-ledger.device", DEVICE_ALERTS),
        ("gpu-ledger.reliability", RELIABILITY_ALERTS),
        ("gpu-ledger.exporter", EXPORTER_ALERTS),
    )
    # The metering group reads the Pushgateway's series, not the exporter's: not scoped.
    exporter = tuple((name, tuple(replace(a, expr=scoped(a.expr, config.exporter_selector))
                                  for a in alerts)) for name, alerts in groups)
    return (*exporter, ("gpu-ledger.metering", METERING_ALERTS))


# --- recording rules -------------------------------------------------------------------------

@dataclass(frozen=True)
class Record:
    name: str
    expr: str
    labels: tuple[tuple[str, str], ...] = ()

    def rule(self) -> dict[str, Any]:
        rule: dict[str, Any] = {"record": self.name, "expr": self.expr}
        if self.labels:
            rule["labels"] = dict(self.labels)
        return rule


def label_enum(metric: str, label: str, by: str, top: int) -> str:
    """A label holding a small integer, as a sample value (one term per possible value)."""
    return "\nor ".join(f'max by ({by}) ({metric}{{{label}="{n}"}}) * {n}'
                        for n in range(1, top + 1))


def replica_fraction() -> str:
    terms = [f'sum without (replicas) (gpu_container_allocation{{replicas="{n}"}}) / {n}'
             for n in range(1, MAX_REPLICAS + 1)]
    return "\nor ".join(terms)


TEAM = (f'label_replace(label_replace({{src}}, "team", "$1", "{TEAM_LABEL}", "(.+)"), '
        f'"team", "unlabelled", "{TEAM_LABEL}", "")')
MIG_KEYS = "cluster, node, gpu, uuid, model, mig_uuid, profile"
CONTAINER_SHARE_NON_MIG = """(
  gpu_container_sm_utilization_ratio{mig_uuid=""}
  / on (uuid) group_left ()
  (sum by (uuid) (gpu_container_sm_utilization_ratio{mig_uuid=""}) > 0)
)
or on (namespace, pod, container, uuid)
(
  (
    sum without (resource, sharing, replicas) (gpu_container_allocation{mig_uuid=""})
    / on (uuid) group_left ()
    sum by (uuid) (gpu_container_allocation{mig_uuid=""})
  )
  unless on (uuid) (sum by (uuid) (gpu_container_sm_utilization_ratio{mig_uuid=""}) > 0)
)
or
(
  sum without (resource, sharing, replicas) (gpu_container_allocation{mig_uuid!=""})
  / on (mig_uuid) group_left ()
  sum by (mig_uuid) (gpu_container_allocation{mig_uuid!=""})
)"""


def per_level(metric: str, source: str) -> tuple[Record, ...]:
    """pod / namespace / team aggregates of a container-level series."""
    return (
        Record(f"pod:{metric}", f"sum by (cluster, namespace, pod) ({source})"),
        Record(f"namespace:{metric}", f"sum by (cluster, namespace) ({source})"),
        Record(f"team:{metric}", "sum by (cluster, team) (" + TEAM.format(src=source) + ")"),
    )


# --- per-holder power and energy (docs/recording-rules.md "Power, energy and carbon") --------
# The live view of the ledger's energy split (metering, docs/cost-model.md): each holder's
# share of its device, the rest idle, so holders + idle = the device's power and energy.
ATTRIBUTION_ONLY = "resource, sharing, replicas, owner_kind, owner_name"
# A holder's claim on its device before scaling, one term per sharing mode (each container and
# device falls in exactly one): exclusive, all of it; MIG, its part of the instance's GPM
# activity in device-equivalents, else of the instance's slices; other whole-GPU sharing
# (time-slicing, MPS, fractional, vGPU), its own SM utilisation, else its allocated fraction.
ENERGY_WEIGHT = f"""max without ({ATTRIBUTION_ONLY}) (
  gpu_container_allocation{{mig_uuid="", sharing="exclusive"}}
) > bool 0
or
clamp_max(
  gpu_container_sm_utilization_ratio{{mig_uuid=""}}
  and on (namespace, pod, container, uuid) gpu_container_allocation{{sharing!="exclusive"}},
  1
)
or
(
  sum without ({ATTRIBUTION_ONLY}) (
    container:gpu_allocation_fraction:ratio{{mig_uuid="", sharing!="exclusive"}}
  )
  unless on (namespace, pod, container, uuid) gpu_container_sm_utilization_ratio
)
or
sum without (owner_kind, owner_name) (container:gpu_device_share:ratio{{mig_uuid!=""}})
* on (mig_uuid) group_left ()
(
  sum by (mig_uuid) (mig:gpu_used:gpus)
  or max by (mig_uuid) (mig:gpu_instance_share:ratio)
)"""
GPU_KEYS = "cluster, node, gpu, uuid, model"
DEVICES = f"max by ({GPU_KEYS}) (gpu_info)"


def energy_window(share: str, window: str) -> str:
    """A device's measured energy over `window` times `share`'s mean over the window: the
    mean over the device's idle-share samples (one per evaluation while the device is
    listed), so a holder present for 20 minutes of the hour gets a third of its share and the
    shares of a device still add up to 1."""
    return (f"sum_over_time({share}[{window}])\n"
            "/ on (uuid) group_left ()\n"
            f"count_over_time(gpu:gpu_idle_energy_share:ratio[{window}])\n"
            f"* on (uuid) group_left (gpu, model) gpu:gpu_energy_joules:increase{window}")


ENERGY_RECORDS: tuple[Record, ...] = (
    Record("container:gpu_energy_weight:ratio", ENERGY_WEIGHT),
    # A device whose holders claim more than all of it is scaled down to it, as the ledger does.
    Record("container:gpu_energy_share:ratio",
           "container:gpu_energy_weight:ratio\n"
           "/ on (uuid) group_left ()\n"
           "clamp_min(sum by (uuid) (container:gpu_energy_weight:ratio), 1)"),
    Record("gpu:gpu_idle_energy_share:ratio",
           f"{DEVICES}\n"
           "  - on (uuid) group_left () sum by (uuid) (container:gpu_energy_share:ratio)\n"
           f"or {DEVICES}"),
    Record("container:gpu_power:watts",
           "container:gpu_energy_share:ratio\n"
           "* on (uuid) group_left (gpu, model) gpu_power_watts"),
    Record("gpu:gpu_idle_power:watts",
           "gpu:gpu_idle_energy_share:ratio * on (uuid) group_left () gpu_power_watts"),
    # The device's measured joules in the last hour; estimated from power samples where the
    # GPU has no energy counter.
    Record("gpu:gpu_energy_joules:increase1h",
           f"max by ({GPU_KEYS}) (increase(gpu_energy_joules_total[1h]))\n"
           f"or max by ({GPU_KEYS}) (avg_over_time(gpu_power_watts[1h]) * 3600)"),
    Record("container:gpu_energy_joules:increase1h",
           energy_window("container:gpu_energy_share:ratio", "1h")),
    Record("gpu:gpu_idle_energy_joules:increase1h",
           energy_window("gpu:gpu_idle_energy_share:ratio", "1h")),
    # Grid intensity per cluster: the metering job's (its cost model's carbon section), else
    # the example figure for every cluster with GPUs.
    Record("cluster:gpu_carbon_intensity:grams_per_kwh",
           f"max by (cluster) ({CARBON_INTENSITY}{{{DEFAULT_CONFIG.metering_selector}}})\n"
           f"or max by (cluster) (gpu_info) * 0 + {EXAMPLE_CARBON_INTENSITY_G_PER_KWH:g}"),
)


def carbon(level: str) -> Record:
    """CO2e in grams of a level's energy of the last hour at its cluster's intensity."""
    return Record(f"{level}:gpu_carbon_grams:increase1h",
                  f"{level}:gpu_energy_joules:increase1h / {JOULES_PER_KWH:g}\n"
                  "* on (cluster) group_left () cluster:gpu_carbon_intensity:grams_per_kwh")


RECORDS: tuple[Record, ...] = (
    # MIG instance -> its share of the parent GPU, by compute slices.
    Record("mig:gpu_slices:count",
           label_enum("gpu_mig_info", "slices", MIG_KEYS, MAX_MIG_SLICES)),
    Record("mig:gpu_parent_slices:count",
           label_enum("gpu_mig_info", "parent_slices", MIG_KEYS, MAX_MIG_SLICES)),
    Record("mig:gpu_instance_share:ratio",
           "mig:gpu_slices:count / on (mig_uuid) group_left () mig:gpu_parent_slices:count"),
    Record("mig:gpu_power:watts",
           "mig:gpu_instance_share:ratio * on (uuid) group_left () gpu_power_watts"),
    Record("mig:gpu_used:gpus",
           'gpu_sm_active_ratio{mig_uuid!=""}\n'
           "* on (mig_uuid) group_left () mig:gpu_instance_share:ratio"),
    # Container -> its share of its device (a whole GPU, or a MIG instance).
    Record("container:gpu_device_share:ratio", CONTAINER_SHARE_NON_MIG),
    # GPU-equivalents a container holds: 1/replicas of a shared device, slices/parent of MIG.
    Record("container:gpu_allocation_fraction:ratio", replica_fraction()),
    Record("container:gpu_allocated:gpus",
           'container:gpu_allocation_fraction:ratio{mig_uuid=""}\n'
           'or container:gpu_allocation_fraction:ratio{mig_uuid!=""}\n'
           "  * on (mig_uuid) group_left () mig:gpu_instance_share:ratio"),
    # GPU-equivalents a container keeps busy, and the power it draws.
    Record("container:gpu_used:gpus",
           'container:gpu_device_share:ratio{mig_uuid=""}\n'
           "  * on (uuid) group_left (gpu, model) gpu_utilization_ratio\n"
           'or container:gpu_device_share:ratio{mig_uuid!=""}\n'
           "  * on (mig_uuid) group_left (gpu, model, profile) mig:gpu_used:gpus"),
    # Power and energy per holder, and what no holder draws.
    *ENERGY_RECORDS,
    # Example live showback: USD per hour by model, then per device and container.
    *(Record("model:gpu_hourly_rate:usd", f"vector({rate:g})", (("model", model),))
      for model, rate in EXAMPLE_HOURLY_RATES_USD.items()),
    Record("gpu:hourly_rate:usd",
           "max by (cluster, node, gpu, uuid, model) (gpu_info)\n"
           "  * on (model) group_left () model:gpu_hourly_rate:usd\n"
           "or max by (cluster, node, gpu, uuid, model) (gpu_info) "
           f"* {DEFAULT_HOURLY_RATE_USD:g}"),
    Record("container:gpu_cost:usd_per_hour",
           "container:gpu_allocated:gpus * on (uuid) group_left (gpu, model) "
           "gpu:hourly_rate:usd"),
    # Aggregates the dashboards read.
    *per_level("gpu_allocated:gpus", "container:gpu_allocated:gpus"),
    *per_level("gpu_used:gpus", "container:gpu_used:gpus"),
    *per_level("gpu_power:watts", "container:gpu_power:watts"),
    *per_level("gpu_memory_used:bytes", "gpu_container_memory_used_bytes"),
    *per_level("gpu_cost:usd_per_hour", "container:gpu_cost:usd_per_hour"),
    *per_level("gpu_energy_joules:increase1h", "container:gpu_energy_joules:increase1h"),
    carbon("namespace"),
    carbon("team"),
    *(Record(f"{level}:{metric}", f"sum by ({by}) ({source})")
      for level, by in (("model", "cluster, model"), ("cluster", "cluster"))
      for metric, source in (("gpu_power:watts", "gpu_power_watts"),
                             ("gpu_idle_power:watts", "gpu:gpu_idle_power:watts"),
                             ("gpu_energy_joules:increase1h", "gpu:gpu_energy_joules:increase1h"),
                             ("gpu_idle_energy_joules:increase1h",
                              "gpu:gpu_idle_energy_joules:increase1h"))),
    carbon("cluster"),
    Record("cluster:gpu_capacity:gpus", "count by (cluster) (gpu_info)"),
    Record("cluster:gpu_allocated:gpus", "sum by (cluster) (container:gpu_allocated:gpus)"),
    Record("cluster:gpu_used:gpus",
           'sum by (cluster) (gpu_utilization_ratio) + sum by (cluster) (mig:gpu_used:gpus)\n'
           "or sum by (cluster) (gpu_utilization_ratio)\n"
           "or sum by (cluster) (mig:gpu_used:gpus)"),
    Record("cluster:gpu_cost:usd_per_hour", "sum by (cluster) (gpu:hourly_rate:usd)"),
    Record("cluster:gpu_allocated_cost:usd_per_hour",
           "sum by (cluster) (container:gpu_cost:usd_per_hour)"),
)


# --- hourly metering series (docs/recording-rules.md "Metering series") ----------------------
# One rule per metering signal, defined with the signal (metering.signals.SignalSpec): once an
# hour, at whatever minute the evaluator picks, each records the last whole hour.
METERING_GROUP = "gpu-ledger.metering-series"
METERING_INTERVAL = "1h"


def metering_group(metricsql: bool = False) -> dict[str, Any]:
    return {"name": METERING_GROUP, "interval": METERING_INTERVAL,
            "rules": [Record(s.recorded, s.record_expr(metricsql)).rule() for s in SIGNALS]}


# --- DCGM-compatible view (optional) ----------------------------------------------------------
# dcgm-exporter's names, units and labels, so dashboards and tools written for it (NVIDIA's
# Grafana dashboard 12239, OpenCost's GPU queries) read GPU Ledger. Device properties are one
# series per GPU. Usage that belongs to workloads (utilisation, engine activity, decoder, power)
# is one series per container holding the device, carrying the container's share of the device
# (the share container:gpu_used:gpus uses), plus a series without pod labels for what no
# container holds: on a shared GPU the series add up to the device's value instead of repeating
# it per pod as dcgm-exporter does.

DCGM_LABELS = ("cluster, job, instance, gpu, device, UUID, modelName, Hostname, "
               "GPU_I_PROFILE, GPU_I_ID, namespace, pod, container")
MIB = 1024 * 1024


# The view is NVIDIA's: another vendor's GPUs (gpu_info's vendor label) are not in it.
NVIDIA_ONLY = 'and on (uuid) gpu_info{vendor="nvidia"}'


def dcgm_labels(expr: str, agg: str = "max") -> str:
    """`expr` of NVIDIA GPUs with dcgm-exporter's label names (UUID, modelName, Hostname,
    device nvidia<i>, GPU_I_PROFILE, GPU_I_ID) and only those plus the pod's and the
    scrape's. Device properties take `max` (one series each anyway); split usage takes `sum`
    (a container's parts of one device add up)."""
    renames = (("UUID", "$1", "uuid"), ("modelName", "$1", "model"), ("Hostname", "$1", "node"),
               ("device", "nvidia$1", "gpu"), ("GPU_I_PROFILE", "$1", "profile"),
               ("GPU_I_ID", "$1", "gpu_instance_id"))
    out = f"(\n  {expr}\n) {NVIDIA_ONLY}"
    for dst, repl, src in renames:
        out = f'label_replace({out}, "{dst}", "{repl}", "{src}", "(.+)")'
    return f"{agg} by ({DCGM_LABELS}) (\n  {out}\n)"


def split_whole_gpu(device: str) -> str:
    """A whole-GPU family split between the containers holding the GPU by their share, and
    the GPU's own value where no container holds it."""
    share = 'container:gpu_device_share:ratio{mig_uuid=""}'
    return (f"{share} * on (uuid) group_left (gpu, model, node) {device}\n"
            f"or ({device} unless on (uuid) {share})")


GR_ENGINE_MIG = (
    'container:gpu_device_share:ratio{mig_uuid!=""}\n'
    "  * on (mig_uuid) group_left (gpu, model, node, gpu_instance_id, profile)\n"
    '  gpu_sm_active_ratio{mig_uuid!=""}\n'
    'or (gpu_sm_active_ratio{mig_uuid!=""} unless on (mig_uuid) container:gpu_device_share:ratio)')
POWER_SPLIT = (
    'container:gpu_power:watts{mig_uuid=""}\n'
    'or container:gpu_power:watts{mig_uuid!=""}\n'
    "  * on (mig_uuid) group_left (gpu_instance_id, profile) gpu_mig_info\n"
    # what no container draws (idle time, unheld MIG slices, unheld GPUs) stays on the device
    "or gpu_power_watts * on (uuid) group_left () gpu:gpu_idle_energy_share:ratio")

_DCGM_CORE: tuple[Record, ...] = (
    # device properties, one series per GPU
    Record("DCGM_FI_DEV_GPU_TEMP", dcgm_labels("gpu_temperature_celsius")),
    Record("DCGM_FI_DEV_MEMORY_TEMP", dcgm_labels("gpu_memory_temperature_celsius")),
    Record("DCGM_FI_DEV_SM_CLOCK", dcgm_labels("gpu_sm_clock_hertz / 1e6")),
    Record("DCGM_FI_DEV_MEM_CLOCK", dcgm_labels("gpu_memory_clock_hertz / 1e6")),
    Record("DCGM_FI_DEV_FB_USED", dcgm_labels(f"gpu_memory_used_bytes / {MIB}")),
    Record("DCGM_FI_DEV_FB_FREE", dcgm_labels(f"gpu_memory_free_bytes / {MIB}")),
    Record("DCGM_FI_DEV_MEM_COPY_UTIL", dcgm_labels("gpu_memory_utilization_ratio * 100")),
    Record("DCGM_FI_DEV_ENC_UTIL", dcgm_labels("gpu_encoder_utilization_ratio * 100")),
    Record("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", dcgm_labels("gpu_energy_joules_total * 1000")),
    Record("DCGM_FI_PROF_SM_ACTIVE", dcgm_labels("gpu_sm_active_ratio")),
    Record("DCGM_FI_PROF_SM_OCCUPANCY", dcgm_labels("gpu_sm_occupancy_ratio")),
    Record("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", dcgm_labels("gpu_tensor_active_ratio")),
    Record("DCGM_FI_PROF_DRAM_ACTIVE", dcgm_labels("gpu_dram_active_ratio")),
    # workload usage, per container holding the device
    Record("DCGM_FI_DEV_GPU_UTIL", dcgm_labels(
        "100 * (\n" + split_whole_gpu("gpu_utilization_ratio") + "\n)", "sum")),
    Record("DCGM_FI_DEV_DEC_UTIL", dcgm_labels(
        "100 * (\n" + split_whole_gpu("gpu_decoder_utilization_ratio") + "\n)", "sum")),
    Record("DCGM_FI_PROF_GR_ENGINE_ACTIVE", dcgm_labels(
        split_whole_gpu("gpu_utilization_ratio") + "\nor\n" + GR_ENGINE_MIG, "sum")),
    Record("DCGM_FI_DEV_POWER_USAGE", dcgm_labels(POWER_SPLIT, "sum")),
)

# XID, PCIe, NVLink and clock-violation fields, named, typed and scaled as NVIDIA's dcgm-exporter
# 4.5.3-4.8.2 (etc/default-counters.csv, etc/dcp-metrics-included.csv) and DCGM's
# dcgm_fields.h write them (docs/dcgm-compat.md).
NVLINK_LINKS = 18  # DCGM has per-link fields L0..L17 (Hopper's 18 links)
DCGM_NVLINK_ERRORS = (("crc_flit", "CRC_FLIT"), ("crc_data", "CRC_DATA"), ("replay", "REPLAY"),
                      ("recovery", "RECOVERY"))  # our `type` label -> DCGM's field infix
DCGM_VIOLATIONS = (("power", "POWER"), ("thermal", "THERMAL"), ("sync_boost", "SYNC_BOOST"),
                   ("board_limit", "BOARD_LIMIT"), ("low_utilization", "LOW_UTIL"),
                   ("reliability", "RELIABILITY"))  # our throttle `reason` -> DCGM's prefix
NS_PER_SECOND = 1_000_000_000  # DCGM 4's violation counters are in ns (NVML's violationTime)
XID_DIGITS = 3  # XID codes are below 1000
# each GPU's most recent XID code (one series per GPU, also when two codes share a second)
XID_LAST = "topk by (uuid) (1, gpu_xid_last_timestamp_seconds)"


def xid_code_value() -> str:
    """The code of each GPU's most recent XID as the sample value: PromQL cannot read a label
    as a number, so the code is summed from its decimal digits, one `xid=~` match per digit
    and place (a helper label keeps the places apart until the sum); 0 for a GPU without
    XIDs, as dcgm-exporter reports."""
    terms = [f'label_replace((gpu_xid_last_timestamp_seconds{{xid=~"[0-9]*{d}{"[0-9]" * place}"}}'
             f' and on (uuid, xid) {XID_LAST}) * 0 + {d * 10 ** place}, '
             f'"xid_place", "{place}", "", "")'
             for place in range(XID_DIGITS) for d in range(1, 10)]
    return "\nor ".join([*terms, "gpu_info * 0"])


def dcgm_extra_records() -> tuple[Record, ...]:
    nvlink = tuple(
        Record(f"DCGM_FI_DEV_NVLINK_{field}_ERROR_COUNT_L{link}", dcgm_labels(
            f'gpu_nvlink_errors_total{{type="{kind}", link="{link}"}}'))
        for kind, field in DCGM_NVLINK_ERRORS for link in range(NVLINK_LINKS))
    totals = tuple(
        Record(f"DCGM_FI_DEV_NVLINK_{field}_ERROR_COUNT_TOTAL", dcgm_labels(
            f'gpu_nvlink_errors_total{{type="{kind}"}}', "sum"))
        for kind, field in DCGM_NVLINK_ERRORS)
    violations = tuple(
        Record(f"DCGM_FI_DEV_{field}_VIOLATION", dcgm_labels(
            f'gpu_throttle_seconds_total{{reason="{reason}"}} * {NS_PER_SECOND}'))
        for reason, field in DCGM_VIOLATIONS)
    return (
        Record("DCGM_FI_DEV_XID_ERRORS", dcgm_labels(xid_code_value(), "sum")),
        Record("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", dcgm_labels("gpu_pcie_replay_total")),
        Record("DCGM_FI_PROF_PCIE_TX_BYTES", dcgm_labels(
            'gpu_pcie_throughput_bytes_per_second{direction="tx"}')),
        Record("DCGM_FI_PROF_PCIE_RX_BYTES", dcgm_labels(
            'gpu_pcie_throughput_bytes_per_second{direction="rx"}')),
        Record("DCGM_FI_PROF_NVLINK_TX_BYTES", dcgm_labels(
            'gpu_nvlink_throughput_bytes_per_second{direction="tx"}')),
        Record("DCGM_FI_PROF_NVLINK_RX_BYTES", dcgm_labels(
            'gpu_nvlink_throughput_bytes_per_second{direction="rx"}')),
        *violations, *totals, *nvlink,
    )


DCGM_RECORDS: tuple[Record, ...] = (*_DCGM_CORE, *dcgm_extra_records())


# --- OpenTelemetry hardware view (optional) ---------------------------------------------------
# OpenTelemetry's hardware semantic conventions for GPUs (semantic-conventions v1.44.0,
# model/hardware/gpu-metrics.yaml and common-metrics.yaml), under the names OTel's Prometheus
# translation gives them (prometheus/otlptranslator, Prometheus' default
# UnderscoreEscapingWithSuffixes: dots to `_`, unit suffix, `_total` on counters, `_ratio` on
# unit-"1" gauges only) and attributes as labels (hw.id -> hw_id). docs/otel-hw.md.

OTEL_LABELS = "cluster, job, instance, k8s_node_name, hw_id, hw_type, hw_vendor, hw_model"


def otel_labels(expr: str, *extra: str) -> str:
    """`expr` per physical GPU with the OTel hardware attributes: hw.id (the GPU UUID),
    hw.model, hw.vendor, hw.type `gpu`, k8s.node.name, plus `extra` labels set by `expr`."""
    out = expr
    # hw.vendor from the vendor label (a series from before it existed is NVIDIA's)
    for dst, repl, src, regex in (
            ("hw_id", "$1", "uuid", "(.*)"), ("hw_model", "$1", "model", "(.*)"),
            ("k8s_node_name", "$1", "node", "(.*)"), ("hw_vendor", "NVIDIA", "vendor", "nvidia|"),
            ("hw_vendor", "AMD", "vendor", "amd"), ("hw_vendor", "Intel", "vendor", "intel"),
            ("hw_type", "gpu", "", "(.*)")):
        out = f'label_replace({out}, "{dst}", "{repl}", "{src}", "{regex}")'
    by = ", ".join([OTEL_LABELS, *extra])
    return f"max by ({by}) (\n  {out}\n)"


def _set(expr: str, label: str, value: str) -> str:
    return f'label_replace({expr}, "{label}", "{value}", "", "")'


# hw.status as a state set per GPU (one series per state, 1 for the current one): failed when
# NVML no longer answers; predicted_failure when a row remap failed (the GPU still runs, NVIDIA
# says replace it); degraded while a remap is pending (memory rows retired until a reset); ok
# otherwise. GPUs without row remapping (before Ampere) count as neither failure.
_REMAP_FAILED = "(gpu_row_remap_failure or gpu_up * 0)"
_REMAP_PENDING = "(gpu_row_remap_pending or gpu_up * 0)"
HW_STATES = (
    ("ok", f"gpu_up * (1 - {_REMAP_FAILED}) * (1 - {_REMAP_PENDING})"),
    ("degraded", f"gpu_up * (1 - {_REMAP_FAILED}) * {_REMAP_PENDING}"),
    ("failed", "(gpu_up == bool 0)"),
    ("predicted_failure", f"gpu_up * {_REMAP_FAILED}"),
)
GPU_TASKS = (("general", "gpu_utilization_ratio"), ("encoder", "gpu_encoder_utilization_ratio"),
             ("decoder", "gpu_decoder_utilization_ratio"))

OTEL_RECORDS: tuple[Record, ...] = (
    Record("hw_gpu_utilization_ratio", otel_labels(
        "\nor ".join(_set(src, "hw_gpu_task", task) for task, src in GPU_TASKS),
        "hw_gpu_task")),
    Record("hw_gpu_memory_usage_bytes", otel_labels("gpu_memory_used_bytes")),
    Record("hw_gpu_memory_limit_bytes", otel_labels("gpu_memory_total_bytes")),
    Record("hw_gpu_memory_utilization_ratio", otel_labels(
        "gpu_memory_used_bytes / (gpu_memory_total_bytes > 0)")),
    Record("hw_energy_joules_total", otel_labels("gpu_energy_joules_total")),
    Record("hw_power_watts", otel_labels("gpu_power_watts")),
    Record("hw_errors_total", otel_labels(
        'label_replace(gpu_ecc_errors_total, "error_type", "$1", "type", "(.+)")',
        "error_type")),
    Record("hw_status", otel_labels(
        "\nor ".join(_set(expr, "hw_state", state) for state, expr in HW_STATES), "hw_state")),
)


# --- rendering -------------------------------------------------------------------------------

class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)

HEADER = "# Generated by `python -m alerts.generate` from alerts/generate.py; do not edit.\n"


def _dump(doc: dict[str, Any]) -> str:
    return HEADER + yaml.dump(doc, Dumper=_Dumper, sort_keys=False, allow_unicode=True,
                              width=4096)


def alerts_yaml(config: Config = DEFAULT_CONFIG) -> str:
    return _dump({"groups": [{"name": name, "rules": [a.rule() for a in alerts]}
                             for name, alerts in alert_groups(config)]})


def recording_yaml() -> str:
    return _dump({"groups": [{"name": "gpu-ledger.attribution",
                              "rules": [r.rule() for r in RECORDS]}, metering_group()]})


def metering_vm_yaml() -> str:
    return _dump({"groups": [metering_group(metricsql=True)]})


def dcgm_yaml() -> str:
    return _dump({"groups": [{"name": "gpu-ledger.dcgm-compat",
                              "rules": [r.rule() for r in DCGM_RECORDS]}]})


def otel_yaml() -> str:
    return _dump({"groups": [{"name": "gpu-ledger.otel-hw",
                              "rules": [r.rule() for r in OTEL_RECORDS]}]})


def outputs(config: Config = DEFAULT_CONFIG, directory: Path = HERE) -> dict[Path, str]:
    out = {directory / ALERTS_FILE.name: alerts_yaml(config),
           directory / RECORDING_FILE.name: recording_yaml()}
    if directory == HERE:  # the optional views take no configuration: --out DIR leaves them out
        out[DCGM_FILE] = dcgm_yaml()
        out[OTEL_FILE] = otel_yaml()
        out[METERING_VM_FILE] = metering_vm_yaml()
    return out


def all_alerts(config: Config = DEFAULT_CONFIG) -> tuple[Alert, ...]:
    return tuple(a for _, alerts in alert_groups(config) for a in alerts)


class ConfigError(Exception):
    pass


def load_config(path: Path) -> Config:
    """DEFAULT_CONFIG with the keys of a YAML mapping replaced (same names as Config's
    fields, same types: numbers for thresholds, Prometheus durations as strings)."""
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as err:
        raise ConfigError(f"{path}: cannot read the alert configuration: {err}") from err
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: expected a mapping of setting: value")
    types = get_type_hints(Config)
    defaults = {f.name: types[f.name] for f in fields(Config)}
    changes: dict[str, Any] = {}
    for key, value in doc.items():
        if key not in defaults:
            raise ConfigError(f"{path}: unknown setting {key!r} (known: "
                              + ", ".join(sorted(defaults)) + ")")
        want = defaults[key]
        ok = (isinstance(value, want) and not isinstance(value, bool)) or (
            want is float and isinstance(value, int) and not isinstance(value, bool))
        if not ok:
            raise ConfigError(f"{path}: {key}: expected {want.__name__}, got {value!r}")
        changes[key] = value
    return replace(DEFAULT_CONFIG, **changes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m alerts.generate", description=__doc__)
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if a committed rule file differs from the tables")
    parser.add_argument("--config", type=Path,
                        help="YAML file overriding selectors and thresholds (Config's fields)")
    parser.add_argument("--out", type=Path, default=HERE,
                        help="directory to write the rule files to (default: alerts/)")
    args = parser.parse_args(argv)
    config = DEFAULT_CONFIG
    if args.config is not None:
        if args.out.resolve() == HERE:
            parser.error("--config writes customised rules: give --out DIR, not alerts/")
        try:
            config = load_config(args.config)
        except ConfigError as err:
            print(f"alerts.generate: {err}", file=sys.stderr)
            return 2
    if not args.out.is_dir():
        print(f"alerts.generate: {args.out}: not a directory", file=sys.stderr)
        return 2
    return sync(outputs(config, args.out.resolve()), args.check, "python -m alerts.generate")


if __name__ == "__main__":
    sys.exit(main())
