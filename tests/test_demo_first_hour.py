"""The first hour of a new user with `gpu-ledger demo`, run as a real process: bad arguments
are one-line errors, SIGTERM stops Prometheus and removes the temporary directory, and with
--keep-running the demo's Prometheus evaluates the alert and recording rules and the demo
names each alert as it starts firing."""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DEMO = [sys.executable, "-m", "gpu_ledger.cli", "demo"]
SMALL = ["--month", "2026-10", "--days", "1", "--step", "30m", "--live-seconds", "1"]


def run(*args: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*DEMO, *args], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "TMPDIR": str(tmp)})


@pytest.mark.parametrize("days", ["0", "40", "-1", "two"])
def test_days_out_of_range_is_rejected(tmp_path: Path, days: str) -> None:
    result = run(*SMALL[:2], "--days", days, "--out", str(tmp_path / "o"), tmp=tmp_path)
    assert result.returncode == 2
    assert "--days" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "o").exists()


def one_line_error(result: subprocess.CompletedProcess[str], *words: str) -> None:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("gpu-ledger demo: ")
    for word in words:
        assert word in lines[0]


def test_missing_scenario_is_one_line(tmp_path: Path) -> None:
    result = run(*SMALL, "--scenario", "nope.yaml", "--out", str(tmp_path / "o"), tmp=tmp_path)
    one_line_error(result, "nope.yaml", "mixed.yaml")


def test_broken_scenario_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("gpus: [\n")
    result = run(*SMALL, "--no-prometheus", "--scenario", str(bad), "--out",
                 str(tmp_path / "o"), tmp=tmp_path)
    one_line_error(result, str(bad), "YAML")
    assert list((tmp_path).glob("gpu-ledger-demo-*")) == []


def test_unwritable_out_is_one_line(tmp_path: Path) -> None:
    result = run(*SMALL, "--out", "/proc/x", tmp=tmp_path)
    one_line_error(result, "/proc/x")


def _lines(proc: subprocess.Popen[str]) -> queue.Queue[str]:
    q: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            q.put(line)

    threading.Thread(target=pump, daemon=True).start()
    return q


def _wait_for(q: queue.Queue[str], pattern: str, timeout: float, seen: list[str]) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            line = q.get(timeout=1)
        except queue.Empty:
            continue
        seen.append(line)
        if re.search(pattern, line):
            return line
    raise AssertionError(f"no {pattern!r} within {timeout}s:\n{''.join(seen)}")


def _get(url: str) -> dict[str, object]:
    with urllib.request.urlopen(url, timeout=5) as resp:
        doc: dict[str, object] = json.load(resp)
    return doc


def test_keep_running_names_firing_alerts_and_sigterm_cleans_up(tmp_path: Path) -> None:
    # a short TMPDIR: the simulated kubelet's unix socket path must stay under 108 bytes
    tmp = Path(tempfile.mkdtemp(prefix="gl-demo-", dir="/tmp"))
    errors = (tmp_path / "stderr").open("w+")
    proc = subprocess.Popen(
        [*DEMO, *SMALL, "--out", str(tmp_path / "o"), "--keep-running"], cwd=ROOT,
        stdout=subprocess.PIPE, stderr=errors, text=True,
        env={**os.environ, "TMPDIR": str(tmp)})
    seen: list[str] = []
    try:
        q = _lines(proc)
        line = _wait_for(q, r"Prometheus http://127\.0\.0\.1:\d+ scraping", 240, seen)
        url = re.search(r"http://127\.0\.0\.1:\d+", line)[0]  # type: ignore[index]
        assert "2 rule files" in line
        groups = _get(f"{url}/api/v1/rules")["data"]["groups"]  # type: ignore[index]
        names = {g["name"] for g in groups}  # type: ignore[attr-defined]
        assert {"gpu-ledger.device", "gpu-ledger.exporter", "gpu-ledger.attribution"} <= names
        _wait_for(q, r"^Alerts: http://127\.0\.0\.1:\d+/alerts", 120, seen)
        firing = _wait_for(q, r"firing: Gpu\w+ \(node=", 150, seen)
        assert "/alerts" in firing
        assert tmp.exists() and list(tmp.glob("gpu-ledger-demo-*"))
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    errors.seek(0)
    err = errors.read()
    assert proc.returncode == 143, err
    assert "Traceback" not in err and "terminated" in err
    left = list(tmp.glob("gpu-ledger-demo-*"))
    shutil.rmtree(tmp)
    assert left == [], "temporary directory left behind"
    with pytest.raises(OSError):
        urllib.request.urlopen(f"{url}/-/ready", timeout=2)
    # no GpuAttributionLost: the demo's exporters run with the kubernetes source on and up
    assert not any("GpuAttributionLost" in s for s in seen)


def test_too_long_tmpdir_is_one_line(tmp_path: Path) -> None:
    """The simulated kubelets listen on unix sockets under the temporary directory; a path
    over 107 bytes cannot be bound, which used to end in a grpc traceback."""
    deep = tmp_path / ("d" * 100)
    deep.mkdir()
    result = run(*SMALL, "--no-prometheus", "--out", str(tmp_path / "o"), tmp=deep)
    one_line_error(result, "TMPDIR", "107")
    assert list(deep.glob("gpu-ledger-demo-*")) == []


def test_demo_lost_gpu_is_visible_to_gpu_not_answering(tmp_path: Path) -> None:
    """The live exporters start weeks into mixed.yaml, after its GPU 2 was lost: that GPU has
    no gpu_up series (so GpuLost cannot fire), and the PCI count exceeds the NVML count, which
    is what GpuNotAnswering alerts on (the README and --keep-running say so)."""
    from gpu_ledger.demo import SCENARIO_DIR, live_exporters

    work = Path(tempfile.mkdtemp(prefix="gl-", dir="/tmp"))  # short: unix sockets inside
    try:
        month_start = time.time() - 20 * 86400
        with live_exporters([SCENARIO_DIR / "mixed.yaml"], month_start, work, 1.0) as targets:
            deadline = time.monotonic() + 60
            text = ""
            while time.monotonic() < deadline and "gpu_answering_devices" not in text:
                time.sleep(1)
                with urllib.request.urlopen(f"http://{targets[0]}/metrics", timeout=5) as r:
                    text = r.read().decode()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    up_gpus = re.findall(r'^gpu_up\{[^}]*gpu="(\d+)"', text, re.M)
    assert sorted(up_gpus) == ["0", "1", "3"], up_gpus
    expected = re.search(r'^gpu_expected_devices\{[^}]*source="pci"[^}]*\} (\S+)', text, re.M)
    answering = re.search(r"^gpu_answering_devices\{[^}]*\} (\S+)", text, re.M)
    assert expected and answering, text[-2000:]
    assert float(expected.group(1)) == 4 and float(answering.group(1)) == 3
