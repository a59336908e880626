"""RSS of the real `gpu-ledger exporter` process in the production configuration: real NVML mode
(`--nvml` default; on a machine without a GPU, NVML init fails and is retried, as on a node
whose driver is not up yet), attribution through the kubelet PodResources socket (the
simulator's real gRPC server on a unix socket) and the pod watch on (the simulator's API server,
reached through a kubeconfig). The API server's pods churn during the run and one watch is
expired, so the list+watch path runs too.

    python -m bench.exporter_rss                     # 10,000 scrapes, then a 30 s soak
    python -m bench.exporter_rss --scrapes 1000 --soak 0
    python -m bench.exporter_rss --json out.json

RSS is VmRSS from /proc/<pid>/status (RssAnon + RssFile + RssShmem); VmHWM is the peak. This is
memory, not time, so other jobs on the machine do not change it much.
"""

from __future__ import annotations

import argparse
import http.client
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import machine, say, table, write_json
from gpu_ledger.procutil import stop
from gpu_ledger.promserver import free_port
from gpusim.apiserver import FakeApiServer
from gpusim.kubelet import ContainerAllocation, FakeKubelet, PodAllocation

NODE = "bench-node"
PODS = 20  # GPU pods on this node (and as many on another node, which the watch filters out)
CHURN_EVERY = 100  # scrapes between pod changes on the API server
CHECKPOINTS = (0, 100, 1_000, 2_500, 5_000, 7_500, 10_000)


def proc_status(pid: int) -> dict[str, int]:
    """The kB figures (and Threads) of /proc/<pid>/status."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        parts = value.split()
        if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile", "Threads") and parts:
            out[key] = int(parts[0])
    return out


def api_pod(i: int, node: str = NODE) -> dict[str, Any]:
    cid = f"{i:064x}"
    return {"metadata": {"name": f"job-{i}", "namespace": "ml", "uid": f"uid-{i}",
                         "labels": {"team": f"team-{i % 4}"}},
            "spec": {"nodeName": node, "containers": [{"name": "main"}]},
            "status": {"containerStatuses": [{"name": "main",
                                              "containerID": f"containerd://{cid}"}]}}


def kubelet_pods() -> list[PodAllocation]:
    return [PodAllocation("ml", f"job-{i}", [ContainerAllocation(
        "main", [("nvidia.com/gpu", [f"GPU-{i % 8:08x}-0000-0000-0000-000000000000"])])])
        for i in range(PODS)]


def allocatable() -> list[tuple[str, str]]:
    return [("nvidia.com/gpu", f"GPU-{i:08x}-0000-0000-0000-000000000000") for i in range(8)]


def scrape(conn: http.client.HTTPConnection) -> bytes:
    conn.request("GET", "/metrics", headers={"Accept-Encoding": "gzip"})
    resp = conn.getresponse()
    body = resp.read()
    if resp.status != 200:
        raise RuntimeError(f"/metrics answered {resp.status}")
    return body


def wait_ready(port: int, proc: subprocess.Popen[Any], limit: float = 60.0) -> None:
    """Until /metrics shows both the kubelet and the API server up."""
    end = time.monotonic() + limit
    want = (b'gpu_exporter_source_up{source="podresources"} 1',
            b'gpu_exporter_source_up{source="kubernetes"} 1')
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"the exporter exited with {proc.returncode}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/metrics")
            body = conn.getresponse().read()
            conn.close()
            if all(w in body for w in want):
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError("the exporter did not report podresources and kubernetes up in time")


def run(scrapes: int, soak: float, settle: float, extra: list[str]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="gpu-ledger-rss-") as tmp:
        socket_path = str(Path(tmp) / "kubelet.sock")
        api = FakeApiServer([api_pod(i) for i in range(PODS)]
                            + [api_pod(1000 + i, "other-node") for i in range(PODS)]).start()
        kubelet = FakeKubelet(socket_path, kubelet_pods, allocatable).start()
        port = free_port()
        cmd = [sys.executable, "-m", "gpu_ledger.cli", "exporter",
               "--web.listen-address", f"127.0.0.1:{port}", "--node-name", NODE,
               "--kubeconfig", api.kubeconfig(str(Path(tmp) / "kubeconfig")),
               "--pod-resources-socket", socket_path, *extra]
        log_path = Path(tmp) / "exporter.log"
        with open(log_path, "w") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_ready(port, proc)
            time.sleep(settle)  # a few sample cycles at the default 5 s interval
            points: list[dict[str, Any]] = []
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            next_pod = PODS
            for n in range(scrapes + 1):
                if n in CHECKPOINTS or n == scrapes:
                    points.append({"scrapes": n, **proc_status(proc.pid)})
                if n == scrapes:
                    break
                scrape(conn)
                if n and n % CHURN_EVERY == 0:  # a pod ends, another starts
                    api.delete_pod("ml", f"job-{next_pod - PODS}")
                    api.add_pod(api_pod(next_pod))
                    next_pod += 1
                if n == scrapes // 2:
                    api.expire()  # one relist mid-run
            conn.close()
            if soak > 0:
                time.sleep(soak)
                points.append({"scrapes": scrapes, "soak_s": soak, **proc_status(proc.pid)})
            watch_requests = sum("watch=true" in r for r in api.requests)
            lists = len(api.requests) - watch_requests
        finally:
            stop(proc)
            kubelet.stop()
            api.stop()
        return {"command": cmd, "points": points, "lists": lists,
                "watch_requests": watch_requests, "pod_changes": next_pod - PODS,
                "kubelet_calls": dict(kubelet.calls)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scrapes", type=int, default=10_000)
    p.add_argument("--soak", type=float, default=30.0, help="seconds of sampling after them")
    p.add_argument("--settle", type=float, default=15.0, help="seconds before the first point")
    p.add_argument("--json", default=None)
    p.add_argument("exporter_args", nargs="*", help="extra exporter flags (after --)")
    args = p.parse_args(argv)
    info = machine()
    say(f"machine: {info['cpu']}, {info['cores']} cores, Python {info['python']}, "
        f"{info['date']}")
    result = run(args.scrapes, args.soak, args.settle, args.exporter_args)
    rows = [[("after soak " if "soak_s" in pt else "") + f"{pt['scrapes']:,} scrapes",
             pt["VmRSS"] / 1024, pt["RssAnon"] / 1024, pt["RssFile"] / 1024,
             pt["VmHWM"] / 1024, pt["Threads"]] for pt in result["points"]]
    say(table(["point", "VmRSS (MiB)", "RssAnon (MiB)", "RssFile (MiB)", "VmHWM (MiB)",
               "threads"], rows))
    first, last = result["points"][0], result["points"][-1]
    say(f"growth over the run: {(last['VmRSS'] - first['VmRSS']) / 1024:+.2f} MiB; "
        f"API requests: {result['lists']} lists, {result['watch_requests']} watches for "
        f"{result['pod_changes']} pod changes and one expiry")
    write_json(args.json, {"machine": info, **result})
    return 0


if __name__ == "__main__":
    sys.exit(main())
