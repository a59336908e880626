"""Only the exporter's own series are metered (issue 26, repro 2): a real Prometheus that
scrapes with `honor_labels: true` stores a target's job="" as no job label at all, so "no job
label" is no identity. In a store that scrapes, the default selector is the exporter's job."""

from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request
from pathlib import Path

import duckdb
import pytest
from promtools import backfill, http_server, running_prometheus
from test_selector import H100, _series

from metering.cli_meter import main

EXPORTER = {"job": "gpu-ledger-exporter", "instance": "10.0.0.1:9847"}
FAKE = {"node": "n9", "uuid": "GPU-FAKE"}
# What a target scraped with honor_labels: true exposes to get a GPU billed: job and instance
# set to "" so the scrape's own labels are not attached.
PUSHED = 'gpu_up{job="",instance="",node="n9",gpu="0",uuid="GPU-FAKE",model="' + H100 + '"} 1\n'


def _om(lines: list[str]) -> str:
    text, last = "", ""
    for ln in sorted(lines, key=lambda ln: (ln.split("{")[0], ln)):
        name = ln.split("{")[0]
        if name != last:
            text += f"# TYPE {name} gauge\n"
            last = name
        text += ln + "\n"
    return text + "# EOF\n"


def _history() -> str:
    """2026-10-05 00:00-01:00 as a store scraping with honor_labels keeps it: the exporter's
    GPU-1, idle, each scrape's `up`, and a fabricated GPU with no job label billed to
    `victim` (the shape the live scrape below shows Prometheus storing)."""
    return _om(
        _series("up", {"job": "pushgateway", "instance": "10.0.0.9:9091"})
        + _series("up", EXPORTER)
        + _series("gpu_up", {"node": "n1", "gpu": "0", "uuid": "GPU-1", "model": H100,
                           **EXPORTER})
        + _series("gpu_info", {"node": "n1", "uuid": "GPU-1", "mig_mode": "disabled",
                               **EXPORTER})
        + _series("gpu_up", {**FAKE, "gpu": "0", "model": H100})
        + _series("gpu_info", {**FAKE, "mig_mode": "disabled"})
        + _series("gpu_container_allocation", {
            **FAKE, "namespace": "x", "pod": "p", "container": "c", "mig_uuid": "",
            "resource": "nvidia.com/gpu", "sharing": "exclusive", "replicas": "1",
            "label_team": "victim"}))


def _stored(url: str, match: str) -> list[dict[str, str]]:
    now = time.time()
    query = urllib.parse.urlencode({"match[]": match, "start": now - 600, "end": now + 60})
    with urllib.request.urlopen(f"{url}/api/v1/series?{query}", timeout=10) as resp:
        data: list[dict[str, str]] = json.load(resp)["data"]
    return data


def test_a_pushed_series_without_a_job_label_is_not_billed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    backfill(_history(), tmp_path / "prom")

    def target(path: str, headers: dict[str, str]) -> tuple[int, str, bytes]:
        return 200, "text/plain; version=0.0.4", PUSHED.encode()

    with http_server(target) as pushed:
        config = ("global: {scrape_interval: 1s}\nscrape_configs:\n"
                  "  - job_name: pushgateway\n    honor_labels: true\n"
                  f"    static_configs: [{{targets: ['{pushed.removeprefix('http://')}']}}]\n")
        with running_prometheus(tmp_path / "prom", config=config) as url:
            deadline = time.monotonic() + 60
            while not (live := _stored(url, 'gpu_up{uuid="GPU-FAKE"}')):
                assert time.monotonic() < deadline, "the scrape never stored gpu_up"
                time.sleep(0.5)
            # What makes "no job label" worthless as identity, from Prometheus itself:
            assert "job" not in live[0] and "instance" not in live[0], live
            db = tmp_path / "m.duckdb"
            rc = main(["--prometheus", url, "--from", "2026-10-05T00:00", "--to",
                       "2026-10-05T01:00", "--db", str(db), "--chunk", "1"])
    err = capsys.readouterr().err
    assert rc == 0, err
    con = duckdb.connect(str(db), read_only=True)
    try:
        assert con.execute("SELECT uuid FROM device_hours").fetchall() == [("GPU-1",)]
        assert con.execute("SELECT count(*) FROM allocation_hours").fetchone() == (0,)
        teams = {t for (t,) in con.execute("SELECT DISTINCT team FROM charges").fetchall()}
    finally:
        con.close()
    assert teams == {"idle"}  # victim pays nothing
    assert "this store scraped in the period (jobs gpu-ledger-exporter, pushgateway)" in err
    assert 'gpu_container_allocation from job="" instance="" (1 series)' in err


def test_backfilled_history_alone_is_still_metered_without_a_job(tmp_path: Path) -> None:
    """Hours in which the store scraped nothing hold history backfilled with promtool: series
    without a job label there are the history's own (the fleet fixtures of every metering
    test), even while the store scrapes now (tests/test_e2e.py, the demo)."""
    backfill(_om(_series("gpu_up", {**FAKE, "gpu": "0", "model": H100})
                 + _series("gpu_info", {**FAKE, "mig_mode": "disabled"})), tmp_path / "prom")
    db = tmp_path / "m.duckdb"

    def target(path: str, headers: dict[str, str]) -> tuple[int, str, bytes]:
        return 200, "text/plain; version=0.0.4", PUSHED.encode()

    with http_server(target) as live, running_prometheus(tmp_path / "prom", config=(
            "global: {scrape_interval: 1s}\nscrape_configs:\n  - job_name: now\n"
            f"    static_configs: [{{targets: ['{live.removeprefix('http://')}']}}]\n")) as url:
        deadline = time.monotonic() + 60
        while not _stored(url, "up"):
            assert time.monotonic() < deadline, "the scrape never stored up"
            time.sleep(0.5)
        assert main(["--prometheus", url, "--from", "2026-10-05T00:00", "--to",
                     "2026-10-05T01:00", "--db", str(db), "-q"]) == 0
    con = duckdb.connect(str(db), read_only=True)
    try:
        assert con.execute("SELECT uuid FROM device_hours").fetchall() == [("GPU-FAKE",)]
    finally:
        con.close()
