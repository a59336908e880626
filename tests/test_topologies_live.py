"""One bill whatever the scrape topology, on real servers configured as a user would (issue 13).

- Two scrape jobs in prometheus.yml on one exporter, scraped live by a real Prometheus: the
  ServiceMonitor's job `gpu-ledger-exporter` and an annotation job `kubernetes-pods`.
- HA pairs written into one VictoriaMetrics: with a replica label (`replica`,
  `prometheus_replica`); with the replica label dropped (write_relabel_configs) and no
  de-duplication, so both replicas' samples land in one series; and the same with
  `-dedup.minScrapeInterval=15s`.
- A scrape relabelled mid-hour (every series gains a target label at 03:30), a pod's team label
  edited mid-hour, an exporter restart on a new instance, nodes scraped at 15 s and 60 s.

History goes in through VictoriaMetrics' import API (as remote write would put it there)
and, for the live test, through a real scrape of an exporter stand-in that serves explicit
timestamps, so no test waits in real time. Expected bills are computed by hand (module
docstrings here and in tests/topology_history.py).
"""

from __future__ import annotations

import io
import json
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager, redirect_stderr
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import duckdb
import pytest
from promtools import running_prometheus, running_victoria, vm_import
from topology_history import (
    COST_MODEL,
    H,
    Sample,
    clean_samples,
    copy_later,
    expected_bill,
    prometheus_text,
    scraped,
)

from metering.cli_meter import main

EXPORTER = {"job": "gpu-ledger-exporter", "instance": "10.0.0.1:9847"}


def meter(url: str, tmp: Path, start: str, end: str, *extra: str
          ) -> tuple[dict[tuple[str, str], float], float, str]:
    """Meter and price [start, end); returns ({(hour, team): cost}, the run's duplicate
    sample-seconds from coverage, stderr)."""
    model = tmp / "cost-model.yaml"
    model.write_text(COST_MODEL)
    db = tmp / f"m{len(list(tmp.glob('m*.duckdb')))}.duckdb"
    err = io.StringIO()
    with redirect_stderr(err):
        rc = main(["--prometheus", url, "--from", start, "--to", end, "--db", str(db),
                   "--cost-model", str(model), *extra])
    assert rc == 0, err.getvalue()
    con = duckdb.connect(str(db), read_only=True)
    try:
        rows = con.execute("SELECT strftime(hour, '%Y-%m-%d %H:%M:%S'), team, sum(cost) "
                           "FROM charges GROUP BY ALL").fetchall()
        dup = con.execute("SELECT coalesce(sum(duplicate_seconds), 0) FROM coverage"
                          ).fetchone()
    finally:
        con.close()
    assert dup is not None
    return {(h, t): round(float(c), 2) for h, t, c in rows}, float(dup[0]), err.getvalue()


# --- VictoriaMetrics: HA pairs, relabels, restarts ---------------------------------------


def ha_replica_label(replica: str) -> Callable[[list[Sample]], list[Sample]]:
    """Prometheus pair with external label `replica` remote-writing into one store."""
    def topology(samples: list[Sample]) -> list[Sample]:
        base = scraped(samples, **EXPORTER)
        return scraped(base, **{replica: "prom-0"}) + copy_later(base, **{replica: "prom-1"})
    return topology


def ha_same_labels(samples: list[Sample]) -> list[Sample]:
    """The pair's replica label dropped by write_relabel_configs: both replicas write the same
    series, so a store without de-duplication holds every sample twice in one series (7 s or
    4 s apart). The node's spacing is then detected as half the scrape interval and every
    sample counts half as long: the same seconds."""
    base = scraped(samples, **EXPORTER)
    return base + copy_later(base)


def relabel_mid_hour(samples: list[Sample]) -> list[Sample]:
    """The scrape config gains a target label at 03:30: every series ends and a new one with
    `cluster="c1"` follows it. Following spans add up: the clean bill."""
    return [(f, {**lab, **EXPORTER, **({"cluster": "c1"} if t > H + 1800 else {})}, v, t)
            for f, lab, v, t in samples]


def team_edited_mid_hour(samples: list[Sample]) -> list[Sample]:
    """Pod p40's label team is edited from t40 to t40-new at 03:30. Its 40 samples
    (03:01:30 .. 03:40:30) are 29 before and 11 after: one fact row of 2400 s, named by the
    series with more samples, so t40 pays 2.67 and t40-new nothing this hour (the edit shows
    from the next hour on): the clean bill."""
    def team(lab: dict[str, str], t: float) -> dict[str, str]:
        if lab.get("label_team") == "t40" and t > H + 1800:
            return {**lab, "label_team": "t40-new"}
        return lab
    return [(f, {**team(lab, t), **EXPORTER}, v, t) for f, lab, v, t in samples]


def restart_new_instance(samples: list[Sample]) -> list[Sample]:
    """The exporter restarts at 03:30 and comes back on a new pod IP (instance label)."""
    return [(f, {**lab, "job": EXPORTER["job"],
                 "instance": "10.0.0.1:9847" if t <= H + 1800 else "10.0.0.2:9847"}, v, t)
            for f, lab, v, t in samples]


# Sample-seconds de-duplication removes in 03:00-06:00 for two copies in distinct series:
# each GPU-hour's copy (node-a 240 x 15 s, node-b 60 x 60 s = 3600 s) x 5 GPUs x 3 h, plus each
# pod's copy in hour 03 (300 + 1200 + 1800 + 2400 + 3540 s).
DUPLICATE_SECONDS = 5 * 3600 * 3 + 9240.0


@pytest.mark.parametrize(("topology", "flags", "removed"), [
    (lambda s: scraped(s, **EXPORTER), (), 0.0),
    (ha_replica_label("replica"), (), DUPLICATE_SECONDS),
    (ha_replica_label("prometheus_replica"), (), DUPLICATE_SECONDS),
    (ha_same_labels, (), 0.0),
    (relabel_mid_hour, (), 0.0),
    (team_edited_mid_hour, (), 0.0),
    (restart_new_instance, (), 0.0),
], ids=["clean", "ha-replica", "ha-prometheus_replica", "ha-same-series-no-dedup",
        "relabel-mid-hour", "team-label-edited-mid-hour",
        "restart-new-instance"])
def test_victoria_metrics_bills_every_topology_like_a_clean_scrape(
        topology: Callable[[list[Sample]], list[Sample]], flags: tuple[str, ...],
        removed: float, tmp_path: Path) -> None:
    with running_victoria(tmp_path / "vm", *flags) as url:
        vm_import(url, prometheus_text(topology(clean_samples())))
        bill, dup, err = meter(url, tmp_path, "2026-10-05T03:00", "2026-10-05T06:00")
    assert bill == expected_bill()
    assert dup == pytest.approx(removed)
    assert f"{removed:,.0f} duplicate sample-seconds counted once" in err


def test_victoria_metrics_dedup_keeps_one_sample_too_many_at_a_series_end(
        tmp_path: Path) -> None:
    """The HA pair of ha_same_labels into a VictoriaMetrics with -dedup.minScrapeInterval=15s.
    VictoriaMetrics keeps the last sample of each 15 s bucket (k x 15 - 15, k x 15]: on node-a
    the copy at t+4 shares its bucket with the next original and is dropped, except after a
    series' last original, where it survives: each node-a pod keeps one sample too many
    (t5: 21 samples, last at 03:05:34). Metering counts it: t5, t20 and t30 pay 15 s more
    (+0.0167 each at 4.00 per device-hour), idle 0.05 less; node-b (60 s, copy 7 s later in
    its own bucket: every sample twice) and the fleet total are exact. A limit of count-based
    metering (docs/metering.md): within one sample spacing per series end, never more."""
    with running_victoria(tmp_path / "vm", "-dedup.minScrapeInterval=15s") as url:
        vm_import(url, prometheus_text(ha_same_labels(clean_samples())))
        bill, _, _ = meter(url, tmp_path, "2026-10-05T03:00", "2026-10-05T06:00")
    expected = expected_bill()
    hour = "2026-10-05 03:00:00"
    extra = 4 * 15 / 3600
    for team in ("t5", "t20", "t30"):
        assert bill.pop((hour, team)) == round(expected.pop((hour, team)) + extra, 2)
    assert bill.pop((hour, "idle")) == round(expected.pop((hour, "idle")) - 3 * extra, 2)
    assert bill == expected


# --- Prometheus scraping one exporter under two jobs, live ---------------------------------


class ReplayExporter:
    """An exporter stand-in for a live scrape: each scrape of /metrics?who=NAME returns the
    next step of one hour of history for NAME, with explicit timestamps (60 s apart, plus
    `offset` seconds for NAME), so Prometheus stores an hour in a few seconds. Per-name
    cursors give every job every step exactly once, whatever the scrape timing."""

    def __init__(self, hour: int, steps: int, offsets: dict[str, int]) -> None:
        self.hour, self.steps, self.offsets = hour, steps, offsets
        self.cursor = dict.fromkeys(offsets, 0)
        self.lock = threading.Lock()

    def page(self, who: str) -> str:
        with self.lock:
            k = self.cursor[who] = self.cursor[who] + 1
        if k > self.steps:
            return ""
        ts = (self.hour + 60 * k + self.offsets[who]) * 1000
        h100 = "NVIDIA H100 80GB HBM3"
        out = []
        for gpu, uuid, minutes in (("0", "GPU-b0", 20), ("1", "GPU-b1", 40)):
            out.append(f'gpu_up{{node="node-b",gpu="{gpu}",uuid="{uuid}",model="{h100}"}} 1 {ts}')
            out.append(f'gpu_info{{node="node-b",uuid="{uuid}",mig_mode="disabled"}} 1 {ts}')
            if k <= minutes:
                out.append(
                    f'gpu_container_allocation{{node="node-b",namespace="ns{minutes}",'
                    f'pod="p{minutes}",container="main",uuid="{uuid}",mig_uuid="",'
                    f'resource="nvidia.com/gpu",sharing="exclusive",replicas="1",'
                    f'label_team="t{minutes}"}} 1 {ts}')
        return "\n".join(out) + "\n"

    def done(self) -> bool:
        with self.lock:
            return all(k > self.steps for k in self.cursor.values())


@contextmanager
def serve(exporter: ReplayExporter) -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
            body = exporter.page(query.get("who", [""])[0]).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


PROMETHEUS_YML = """\
global: {{scrape_interval: 100ms, scrape_timeout: 100ms}}
storage: {{tsdb: {{out_of_order_time_window: 3h}}}}  # the replayed hour is behind the head
scrape_configs:
  - job_name: gpu-ledger-exporter        # the ServiceMonitor's job
    honor_labels: true
    params: {{who: [servicemonitor]}}
    static_configs: [{{targets: ['{target}']}}]
  - job_name: kubernetes-pods            # annotation-based discovery finds the exporter too
    params: {{who: [annotations]}}
    static_configs: [{{targets: ['{target}']}}]
"""


def test_two_scrape_jobs_on_one_exporter_live(tmp_path: Path) -> None:
    """node-b (60 s) with GPU-b0 held 20 minutes by t20 and GPU-b1 40 minutes by t40, in the
    last complete hour, scraped by both jobs (the annotation job 7 s later). By hand at 4.00 per
    device-hour: t20 1.33, t40 2.67, idle 8 - 4 = 4.00.
    Default selector: only gpu-ledger-exporter is metered; the annotation job's copy is named
    in the warning, 0 duplicate seconds. Both jobs selected: the same bill, and coverage shows
    what was counted once: each GPU's copy (59 samples in the hour, the 60th falls 7 s into the
    next) 2 x 3540 s + the pods' copies 1200 + 2400 s = 10,680 s."""
    hour = int(time.time()) // 3600 * 3600 - 3600
    exporter = ReplayExporter(hour, 60, {"servicemonitor": 0, "annotations": 7})
    with serve(exporter) as target, \
            running_prometheus(tmp_path / "prom",
                               config=PROMETHEUS_YML.format(target=target)) as url:
        deadline = time.monotonic() + 120
        while not exporter.done():
            assert time.monotonic() < deadline, exporter.cursor
            time.sleep(0.2)
        query = urllib.parse.urlencode({"query": "sum(count_over_time(gpu_up[2h]))",
                                        "time": hour + 3700})
        with urllib.request.urlopen(f"{url}/api/v1/query?{query}", timeout=10) as resp:
            stored = json.load(resp)["data"]["result"][0]["value"][1]
        assert stored == "240"  # 2 GPUs x 60 steps x 2 jobs: no scrape lost
        start = datetime.fromtimestamp(hour, UTC).strftime("%Y-%m-%dT%H:%M")
        end = datetime.fromtimestamp(hour + 3600, UTC).strftime("%Y-%m-%dT%H:%M")
        default, dup_default, err_default = meter(url, tmp_path, start, end)
        both, dup_both, _ = meter(url, tmp_path, start, end, "--selector",
                                  'job=~"gpu-ledger-exporter|kubernetes-pods"')
    label = datetime.fromtimestamp(hour, UTC).strftime("%Y-%m-%d %H:%M:%S")
    expected = {(label, "t20"): 1.33, (label, "t40"): 2.67, (label, "idle"): 4.0}
    assert default == expected and both == expected
    assert dup_default == 0 and dup_both == 10_680
    assert 'gpu_up from job="kubernetes-pods"' in err_default
    assert 'gpu_container_allocation from job="kubernetes-pods"' in err_default
