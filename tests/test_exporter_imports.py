"""The exporter's import closure stays lean (docs/performance.md, "Memory"): what the production
process imports, checked in a fresh interpreter, not a figure."""

import json
import subprocess
import sys

# Loaded by the exporter process with real NVML, attribution and the pod watch on.
EXPORTER_PATH = ["exporter.cli", "exporter.sampler", "exporter.web", "exporter.webconfig",
                 "exporter.nvml_loader", "exporter.collectors", "exporter.attribution.collector",
                 "exporter.attribution.resourceslices", "pynvml"]
# Never on that path: heavy clients, the simulator, metering and its data stack.
FORBIDDEN = ("kubernetes", "grpc", "urllib3", "requests", "pydantic", "pandas", "numpy",
             "duckdb", "pyarrow", "prometheus_client", "metering", "gpusim")


def imported(modules: list[str]) -> set[str]:
    code = ("import importlib, json, sys\n"
            "for m in sys.argv[1:]: importlib.import_module(m)\n"
            "print(json.dumps(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code, *modules], capture_output=True,
                         text=True, check=True).stdout
    return set(json.loads(out))


def test_exporter_path_imports_nothing_heavy() -> None:
    loaded = imported(EXPORTER_PATH)
    bad = sorted(m for m in loaded if m.split(".")[0] in FORBIDDEN or m.startswith(FORBIDDEN))
    assert bad == []
    assert "h2.connection" in loaded and "exporter.kube.watch" in loaded  # what replaced them


def test_kubeconfig_reader_loads_yaml_only_when_reading() -> None:
    assert "yaml" not in imported(["exporter.kube.client", "exporter.kube.config"])


def test_bcrypt_and_yaml_only_with_a_web_config() -> None:
    loaded = imported(["exporter.web", "exporter.webconfig", "exporter.cli"])
    assert "bcrypt" not in loaded and "yaml" not in loaded
