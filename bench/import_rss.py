"""What importing a dependency costs: VmRSS and module count of a fresh interpreter after
importing a module set, against a bare interpreter.

    python -m bench.import_rss                       # the table in docs/performance.md
    python -m bench.import_rss kubernetes grpc       # any module names

Each set runs in its own `python -c`, so nothing is shared between rows. A module that is not
installed prints as such (the official `kubernetes` client is a dev dependency only now).
"""

from __future__ import annotations

import subprocess
import sys

from bench.common import say, table

_PROBE = """
import importlib, sys
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
base, n0 = rss(), len(sys.modules)
for name in sys.argv[1:]:
    importlib.import_module(name)
print(f"{rss():.1f} {rss() - base:.1f} {len(sys.modules) - n0}")
"""

EXPORTER = ["exporter.cli", "exporter.sampler", "exporter.web", "pynvml"]
SETS: list[tuple[str, list[str]]] = [
    ("bare interpreter", []),
    ("`kubernetes` (the official client)", ["kubernetes"]),
    ("`kubernetes.client`, `.config`, `.watch` only", ["kubernetes.client", "kubernetes.config",
                                                       "kubernetes.watch"]),
    ("urllib3 (the official client's HTTP)", ["urllib3"]),
    ("`exporter.kube.watch` (http.client, ssl)", ["exporter.kube.watch"]),
    ("grpc", ["grpc"]),
    ("protobuf + PodResources messages", ["exporter.attribution.podresources_pb2"]),
    ("h2", ["h2.connection"]),
    ("yaml", ["yaml"]),
    ("bcrypt", ["bcrypt"]),
    ("pynvml", ["pynvml"]),
    ("exporter core (cli, sampler, web, pynvml)", EXPORTER),
    ("exporter core + grpc + protobuf", [*EXPORTER, "grpc",
                                         "exporter.attribution.podresources_pb2"]),
    ("exporter core + h2 + protobuf + kube", [*EXPORTER, "exporter.attribution.unarygrpc",
                                              "exporter.attribution.podresources_pb2",
                                              "exporter.kube.watch"]),
]


def measure(modules: list[str]) -> tuple[float, float, int] | None:
    proc = subprocess.run([sys.executable, "-c", _PROBE, *modules], capture_output=True,
                          text=True, check=False)
    if proc.returncode != 0:
        return None
    rss, delta, count = proc.stdout.split()
    return float(rss), float(delta), int(count)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    sets = [(" ".join(args), args)] if args else SETS
    rows: list[list[object]] = []
    for label, modules in sets:
        got = measure(modules)
        rows.append([label, *got] if got else [label, "not installed", "", ""])
    say(table(["import", "VmRSS (MiB)", "over bare (MiB)", "modules"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
