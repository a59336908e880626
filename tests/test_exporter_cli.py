"""`gpu-ledger exporter` as a user runs it: a real process, a real port, real signals."""

from __future__ import annotations

import gzip
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = ROOT / "gpusim" / "scenarios" / "mixed.yaml"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_cli(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpu_ledger.cli", "exporter", *args],
                          capture_output=True, text=True, timeout=timeout, check=False)


def test_serves_metrics_and_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpu_ledger.cli", "exporter", "--nvml", f"sim:{SCENARIO}",
         "--web.listen-address", f"127.0.0.1:{port}", "--interval", "1s", "--no-kubernetes",
         "--pod-resources-socket", str(tmp_path / "absent.sock"), "--node-name", "n1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(f"{url}/healthz", timeout=2) as r:
                    assert r.read() == b"ok"
                break
            except (urllib.error.URLError, ConnectionError):
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.1)
        req = urllib.request.Request(f"{url}/metrics", headers={
            "Accept": "application/openmetrics-text;version=1.0.0", "Accept-Encoding": "gzip"})
        with urllib.request.urlopen(req, timeout=5) as r:
            assert r.headers["Content-Type"].startswith("application/openmetrics-text")
            assert r.headers["Content-Encoding"] == "gzip"
            text = gzip.decompress(r.read()).decode()
        assert text.endswith("# EOF\n")
        assert 'gpu_up{node="n1"' in text
        # No kubelet socket and no API: GPU series still served, the sources say why.
        assert 'gpu_exporter_source_up{source="podresources"} 0' in text
        # --no-kubernetes: the source is off, not down, so GpuAttributionLost cannot fire
        assert 'source="kubernetes"' not in text
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err


@pytest.mark.parametrize(("content", "expect"), [
    ("node: n\ngpus:\n  - model: X\n    memory: lots\n    power_limit_watts: 300\n",
     "gpus[0].memory"),
    ("node: n\ngpus: [\n", "bad.yaml"),
    ("node: n\ngpus:\n  - model: X\n    memory: 8GiB\n    power_limit_watts: 300\n"
     "    colour: blue\n", "gpus[0].colour"),
])
def test_malformed_scenario_exits_with_file_and_key(tmp_path: Path, content: str,
                                                    expect: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(content)
    proc = run_cli("--nvml", f"sim:{path}")
    assert proc.returncode == 1
    assert "bad.yaml" in proc.stderr and expect in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("command", [["exporter", "--nvml", f"sim:{SCENARIO}"],
                                     ["doctor", "--nvml", f"sim:{SCENARIO}"], ["demo"]])
def test_without_the_simulator_installed_sim_is_a_one_line_error(command: list[str]) -> None:
    """As in the image, which has no gpusim: the product runs, asking for a simulation fails."""
    code = ("import sys; sys.modules['gpusim'] = None  # import fails as if not installed\n"
            "from gpu_ledger.cli import main; sys.exit(main(sys.argv[1:]))")
    proc = subprocess.run([sys.executable, "-c", code, *command], capture_output=True,
                          text=True, timeout=60, check=False)
    out = proc.stdout + proc.stderr  # doctor reports on stdout
    assert proc.returncode != 0
    assert "Traceback" not in out
    assert len([line for line in out.splitlines() if "gpusim" in line]) == 1, out


def test_malformed_web_config_exits_with_key(tmp_path: Path) -> None:
    path = tmp_path / "web.yml"
    path.write_text("tls_server_config:\n  cert_file: /nonexistent.pem\n  key_file: /x.key\n")
    proc = run_cli("--nvml", f"sim:{SCENARIO}", "--web.config.file", str(path))
    assert proc.returncode == 1
    assert "web.yml" in proc.stderr and "tls_server_config.cert_file" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_bad_flags_are_usage_errors() -> None:
    assert run_cli("--interval", "-3").returncode == 2
    proc = run_cli("--nvml", f"sim:{SCENARIO}", "--sharing-mode", "nvidia.com/gpu=magic")
    assert proc.returncode == 1 and "--sharing-mode" in proc.stderr


def test_device_backend_errors_are_one_line() -> None:
    """A bad --device-backend, or a named backend absent from the node: one line, exit 1."""
    for choice, expected in (("cuda", "--device-backend: expected auto or a comma list"),
                             ("nvml,amd", "--device-backend amd: ")):
        proc = run_cli("--nvml", f"sim:{SCENARIO}", "--device-backend", choice)
        assert proc.returncode == 1, proc.stderr
        assert "Traceback" not in proc.stderr
        lines = [line for line in proc.stderr.splitlines() if "--device-backend" in line]
        assert len(lines) == 1 and expected in lines[0], proc.stderr


def test_help_lists_collector_flags() -> None:
    proc = run_cli("--help")
    assert proc.returncode == 0
    for name in ("device", "gpm", "xid", "attribution"):
        assert f"--collector.{name}" in proc.stdout
