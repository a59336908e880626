"""Requests and log lines of the pod watch against an API server that answers every watch with
410 Gone (as an ERROR event, then as an HTTP status), with the exporter's default backoff.

    python -m bench.watch_storm                  # 30 s per mode
    python -m bench.watch_storm --seconds 10

Counts, not timings: how many list and watch requests reached the server, and how many log
lines at INFO or above the watch wrote. Loopback only.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import machine, say, table
from exporter.attribution.podwatch import PodWatch
from exporter.core import ExporterOptions
from gpusim.apiserver import FakeApiServer

NODE = "storm-node"


class _Count(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.lines += 1


def storm(gone: str, seconds: float) -> dict[str, Any]:
    pods = [{"metadata": {"name": f"p{i}", "namespace": "ml"}, "spec": {"nodeName": NODE}}
            for i in range(10)]
    counter = _Count()
    logger = logging.getLogger("exporter.kube")
    logger.addHandler(counter)
    logger.setLevel(logging.INFO)
    try:
        with tempfile.TemporaryDirectory() as tmp, FakeApiServer(pods) as server:
            server.gone = gone
            kubeconfig = server.kubeconfig(str(Path(tmp) / "kubeconfig"))
            watch = PodWatch(ExporterOptions(node=NODE, kubeconfig=kubeconfig)).start()
            time.sleep(seconds)
            requests = list(server.requests)
            watch.close()
    finally:
        logger.removeHandler(counter)
    watches = sum("watch=true" in r for r in requests)
    return {"mode": gone, "seconds": seconds, "lists": len(requests) - watches,
            "watches": watches, "log_lines": counter.lines}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=30.0)
    args = p.parse_args(argv)
    info = machine()
    say(f"machine: {info['cpu']}, {info['cores']} cores, Python {info['python']}, "
        f"{info['date']}")
    rows = []
    for gone in ("event", "http"):
        r = storm(gone, args.seconds)
        rows.append([f"410 as {'an ERROR event' if gone == 'event' else 'HTTP status'}",
                     r["seconds"], r["lists"], r["watches"], r["lists"] / r["seconds"],
                     r["log_lines"]])
    say(table(["storm", "seconds", "lists", "watches", "lists/s", "log lines"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
