"""Peak RSS of the exporter's pod watch (and the ResourceClaim get) against a hostile or
broken API server (issue 24, item 5), each attack in a fresh process whose VmHWM is read.

    python -m bench.kube_hostile                 # all attacks (about 3 minutes)
    python -m bench.kube_hostile --only flood    # one attack by name

The server is gpusim/apiserver.py's FakeApiServer in this process, its `hostile` hook giving
the answers; the exporter side is exporter.attribution.podwatch.PodWatch (the real pod
watch: exporter/kube client and cache) with its defaults, in a child process, for the
attack's duration. Loopback only. Attacks:
- baseline: 110 ordinary pods on the node, no attack;
- full-node: 13,000 ordinary pods (the cache's bound: finished pods up to the garbage
  collector's threshold), no attack: the first list's time (in the child's CPU) and RSS;
- list: a 60 MiB pod list of `{}` items;
- event: a normal list, then a watch event of 15 MiB (one annotation);
- claim: a 64 MiB ResourceClaim of `{}` items, read with ApiClient.get_json as the claim
  reader does;
- drip: a list answered one byte every 0.5 s; how long until the watch gives up;
- flood: a normal list, then ADDED events of new pods as fast as the server sends them,
  40 s (each pod ~0.6 KB: a container status and a label);
- fat-pods: a normal list, then ADDED events of pods each within the per-object bounds but
  holding 5,000 container statuses, 40 s: what the cache's byte budget is for.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bench.common import machine, say, table
from gpusim.apiserver import FakeApiServer

NODE = "bench-node"
LIMIT_MIB = 192  # the DaemonSet's memory limit (deploy/)

_CHILD = """
import json, sys, time
from exporter.attribution.podwatch import PodWatch
from exporter.core import ExporterOptions
from exporter.kube.client import ApiClient
from exporter.kube.config import load_kubeconfig
from exporter.kube.watch import dropped
from bench.common import cpu_seconds

mode, kubeconfig, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
out = {}
t0 = time.monotonic()
if mode == "claim":
    try:
        ApiClient(load_kubeconfig(kubeconfig)).get_json(
            "/apis/resource.k8s.io/v1/namespaces/ml/resourceclaims/c", {})
        out["result"] = "read"
    except Exception as exc:
        out["result"] = f"{type(exc).__name__}: {exc}"[:120]
else:
    watch = PodWatch(ExporterOptions(node=sys.argv[4], kubeconfig=kubeconfig)).start()
    gave_up = listed = None
    while time.monotonic() - t0 < seconds:
        if gave_up is None and watch.status.reason == "deadline":
            gave_up = time.monotonic() - t0
        if listed is None and watch.lists:
            listed = time.monotonic() - t0
        time.sleep(0.05)
    out.update(status=watch.status.reason or "up", pods=len(watch.pods), lists=watch.lists,
               dropped={"/".join(k): v for k, v in dropped(sys.argv[4]).items()},
               gave_up_s=gave_up, listed_s=listed)
    watch.close()
out["cpu_s"] = cpu_seconds()
out["wall_s"] = time.monotonic() - t0
for line in open("/proc/self/status"):
    if line.startswith("VmHWM:"):
        out["peak_mib"] = int(line.split()[1]) / 1024
print(json.dumps(out))
"""


def pod(i: int, statuses: int = 1) -> dict[str, Any]:
    return {"metadata": {"name": f"p{i}", "namespace": "ml", "uid": f"uid-{i:08}",
                         "labels": {"team": "ml", "app": f"a{i % 7}"},
                         "resourceVersion": str(1000 + i)},
            "spec": {"nodeName": NODE, "containers": [{"name": "main", "image": "x"}]},
            "status": {"phase": "Running", "containerStatuses": [
                {"name": "main" if s == 0 else f"c{s}",
                 "containerID": f"containerd://{(i << 16) + s:064x}"}
                for s in range(statuses)]}}


def _list(items: Iterator[bytes]) -> Iterator[bytes]:
    yield b'{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"7"},"items":['
    first = True
    for item in items:
        yield item if first else b"," + item
        first = False
    yield b"]}"


def _empties(mib: int) -> Iterator[bytes]:
    piece = b",".join([b"{}"] * 21845) + b",{}"  # 64 KiB
    for i in range(mib * 16):
        yield piece if i == 0 else b"," + piece


def _watch_only(answer: Callable[[], Iterator[bytes]]) -> Callable[[str], Any]:
    return lambda path: answer() if "watch=true" in path else None


def _big_event() -> Iterator[bytes]:
    yield b'{"type":"ADDED","object":{"metadata":{"name":"x","uid":"u","annotations":{"a":"'
    for _ in range(15 * 16):
        yield b"z" * 65536
    yield b'"}}}}\n'
    time.sleep(60)


def _flood(statuses: int, seconds: float) -> Callable[[], Iterator[bytes]]:
    def stream() -> Iterator[bytes]:
        end = time.monotonic() + seconds
        i = 0
        while time.monotonic() < end:
            batch = []
            for _ in range(50 if statuses == 1 else 1):
                i += 1  # new pods, not the 110 listed
                obj = pod(1_000_000 + i, statuses)
                batch.append(json.dumps({"type": "ADDED", "object": obj}).encode()
                             + b"\n")
            yield b"".join(batch)
    return stream


def _drip() -> Iterator[bytes]:
    for b in b'{"kind":"PodList","metadata":{"resourceVersion":"1"},"items":[{}' * 100:
        yield bytes([b])
        time.sleep(0.5)


ATTACKS: dict[str, tuple[str, float, Callable[[str], Any] | None]] = {
    "baseline": ("110 ordinary pods, no attack", 8, None),
    "full-node": ("13,000 ordinary pods, no attack", 20, None),
    "list": ("a 60 MiB pod list of `{}`", 15,
             lambda path: _list(_empties(60)) if "watch" not in path else None),
    "event": ("a 15 MiB watch event", 15, _watch_only(_big_event)),
    "claim": ("a 64 MiB ResourceClaim of `{}`", 0,
              lambda path: _list(_empties(64))),
    "drip": ("a list dripped at 1 byte / 0.5 s", 70, lambda path: _drip()),
    "flood": ("endless ADDED events of new pods, 40 s", 40, _watch_only(_flood(1, 40))),
    "fat-pods": ("ADDED pods of 5,000 container statuses each, 40 s", 40,
                 _watch_only(_flood(5_000, 40))),
}


def run(name: str) -> dict[str, Any]:
    label, seconds, hostile = ATTACKS[name]
    pods = [pod(i) for i in range(13_000 if name == "full-node" else 110)]
    root = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory() as tmp, FakeApiServer(pods) as server:
        server.hostile = hostile
        kubeconfig = server.kubeconfig(str(Path(tmp) / "kubeconfig"))
        mode = "claim" if name == "claim" else "watch"
        proc = subprocess.run([sys.executable, "-c", _CHILD, mode, kubeconfig, str(seconds),
                               NODE], capture_output=True, text=True, cwd=root, timeout=600,
                              check=False)
    if proc.returncode != 0:
        return {"attack": label, "error": proc.stderr.strip().splitlines()[-1:]}
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    out["attack"] = label
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", choices=sorted(ATTACKS), action="append")
    args = p.parse_args(argv)
    info = machine()
    say(f"machine: {info['cpu']}, {info['cores']} cores, Python {info['python']}, "
        f"{info['date']}")
    rows = []
    for name in args.only or list(ATTACKS):
        say(f"{name} ...")
        r = run(name)
        if "error" in r:
            rows.append([r["attack"], "error", "", "", str(r["error"])])
            continue
        outcome = r.get("result") or (
            f"{r['status']}; {r['pods']} pods cached, {r['lists']} lists"
            + (f", dropped {r['dropped']}" if r.get("dropped") else "")
            + (f", gave up after {r['gave_up_s']:.1f} s" if r.get("gave_up_s") else "")
            + (f", first list after {r['listed_s']:.1f} s" if r.get("listed_s") else ""))
        rows.append([r["attack"], f"{r['peak_mib']:.0f}",
                     "yes" if r["peak_mib"] <= LIMIT_MIB else "**no**",
                     f"{r['cpu_s']:.1f} / {r['wall_s']:.0f}", outcome])
    say(table(["attack", "peak RSS (MiB)", f"within {LIMIT_MIB} MiB", "CPU s / wall s",
               "outcome"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
