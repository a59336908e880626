"""Client-side cost of a range query's answer: decoding (points per CPU-second) and fetching
(CPU-seconds per GiB), each beside its alternative, in one process.

    python -m bench.decode                     # 2,500 series x 73 points, like a 72-h chunk
    python -m bench.decode --series 20000 --json out.json
    python -m bench.decode --series 4000 --points 25 --old 6196fcc    # a day's fresh series
    python -m bench.decode --series 4000 --points 25 --export         # the same, JSON lines
    python -m bench.decode --orders 2500 --old 5de553e    # a label-name order per series

Decoders on the same answer bytes: metering.matrix.read (the scanner: markers found by numpy
over the whole answer, points parsed by Arrow's CSV reader into typed columns), the scanners
of earlier commits (`--old REV`, default e4e6bbb: per-point RE2 checks and a string column
cut to floats; fbb0257: typed columns, envelope and entries scanned in Python per series;
4d5eca1: entries found by numpy, series_key computed per label map; 7547511: every point
through Arrow's CSV reader, before points were cut at their quotes),
Python's json + from_result (the path every odd answer takes) and json alone.
Each must give the same matrix as json's path.
Fetch: metering.promclient (http.client, one deadline, its own loop over the body) against
urllib.request.urlopen().read() from the same loopback server: the alternative the standard
library offers, since the metering image carries no HTTP stack.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import inspect
import json
import random
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from bench.common import machine, say, table, write_json
from metering import matrix, vmexport
from metering.promclient import PromClient

# Scanners to compare: per-point RE2 checks (before issue 27); typed Arrow columns with the
# envelope scanned and label maps keyed per series in Python (before the vectorised scan);
# the vectorised scan with series_key per label map (before keys were cut from the text); the
# CSV reader for every point (before points were cut at their quotes).
OLD_REVS = ("e4e6bbb", "fbb0257", "4d5eca1", "7547511")
# vmexport before its lines were cut by numpy markers and keyed per label order
OLD_EXPORT_REV = "6196fcc"


def answer(series: int, points: int, seed: int = 7, orders: int = 1) -> bytes:
    """A matrix answer in the layout stores write: allocation-like label sets, hourly
    points, values as the exporter's series give them (counts, ratios, byte counts).
    `orders`: how many label-name orders the series have (pod labels that some pods carry
    and others not: series i has the labels label_x<b> of the bits b of i % orders)."""
    rng = random.Random(seed)
    t0 = 1_790_812_800
    parts = []
    for i in range(series):
        metric = {"container": "main", "mig_uuid": "", "namespace": f"team-{i % 20:02d}",
                  "node": f"node-{i // 40:05d}", "owner_kind": "Job",
                  "owner_name": f"job-{i}", "pod": f"job-{i}", "replicas": "1",
                  "resource": "nvidia.com/gpu", "sharing": "exclusive",
                  "uuid": f"GPU-{i // 5:05d}-{i % 8}", "label_team": f"t{i % 20:02d}",
                  **{f"label_x{b}": "y" for b in range((orders - 1).bit_length())
                     if (i % orders) >> b & 1}}
        kind = i % 3
        vals = []
        for k in range(points):
            v = ("12" if kind == 0 else f"{rng.choice((0.25, 0.5, 0.875)) * 12:g}"
                 if kind == 1 else str(rng.randrange(4, 80) * 2**30 * 12))
            vals.append(f'[{t0 + 3600 * k},"{v}"]')
        # Label names in order, as Prometheus and VictoriaMetrics write them.
        parts.append('{"metric":' + json.dumps(metric, separators=(",", ":"), sort_keys=True)
                     + ',"values":[' + ",".join(vals) + "]}")
    return ('{"status":"success","data":{"resultType":"matrix","result":['
            + ",".join(parts) + "]}}").encode()


def export_answer(series: int, points: int) -> bytes:
    """The same series as recorded hourly series read from VictoriaMetrics' /api/v1/export:
    one JSON line each, __name__ first and the other names in the store's order (not
    sorted), `points` samples stamped at hh:17, integer values (a sum of 12 samples)."""
    rng = random.Random(7)
    t0 = 1_790_812_800 * 1000 + 17 * 60_000
    lines = []
    for i in range(series):
        metric = {"__name__": "gpu_ledger:alloc_sum:hour", "namespace": f"team-{i % 20:02d}",
                  "pod": f"job-{i}", "node": f"node-{i // 40:05d}", "container": "main",
                  "label_team": f"t{i % 20:02d}", "owner_kind": "Job", "owner_name": f"job-{i}",
                  "replicas": "1", "resource": "nvidia.com/gpu", "sharing": "exclusive",
                  "uuid": f"GPU-{i // 5:05d}-{i % 8}"}
        values = ",".join(str(rng.choice((12, 12, 6, 3))) for _ in range(points))
        stamps = ",".join(str(t0 + 3_600_000 * k) for k in range(points))
        lines.append('{"metric":' + json.dumps(metric, separators=(",", ":"))
                     + f',"values":[{values}],"timestamps":[{stamps}]}}\n')
    return "".join(lines).encode()


def old_matrix(rev: str, path: str = "metering/matrix.py") -> ModuleType | None:
    """`path` (metering/matrix.py) as of `rev`, imported under another name (None without
    git)."""
    name = f"old_{Path(path).stem}_{rev}"
    try:
        text = subprocess.run(["git", "show", f"{rev}:{path}"], check=True,
                              capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    text = text.replace("from metering.facts import series_key",
                        "from metering.signals import series_key")
    file = Path(tempfile.mkdtemp()) / f"{name}.py"
    file.write_text(text)
    spec = importlib.util.spec_from_file_location(name, file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def round_robin(decoders: dict[str, Any], repeat: int) -> tuple[dict[str, float], dict[str, Any]]:
    """Each decoder once per round, `repeat` rounds, so load that comes and goes on the shared
    box falls on all of them alike: the least CPU of the rounds (each one's cost) and the
    last output, per decoder."""
    least = dict.fromkeys(decoders, float("inf"))
    outs: dict[str, Any] = {}
    for _ in range(repeat):
        for name, fn in decoders.items():
            s, outs[name] = cpu(fn, 1)
            least[name] = min(least[name], s)
    return least, outs


def cpu(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    """Least CPU seconds of `repeat` calls (the box is shared: the least is the cost)."""
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.process_time()
        out = fn()
        best = min(best, time.process_time() - t0)
    return best, out


def same(a: matrix.Matrix, b: matrix.Matrix) -> bool:
    return (a.labels == b.labels and a.keys == b.keys and np.array_equal(a.sid, b.sid)
            and np.array_equal(a.t, b.t) and np.array_equal(a.v, b.v, equal_nan=True))


def serve(body: bytes) -> tuple[ThreadingHTTPServer, str]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.decode", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--series", type=int, default=2500)
    p.add_argument("--points", type=int, default=73, help="points per series (73: 72 h)")
    p.add_argument("--orders", type=int, default=1,
                   help="label-name orders among the series (pod labels some pods carry)")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--old", action="append",
                   help=f"git revision of a scanner to compare (repeatable; default "
                        f"{', '.join(OLD_REVS)})")
    p.add_argument("--export", action="store_true",
                   help="decode the same series as /api/v1/export JSON lines (recorded hourly "
                        "series, metering.vmexport) instead of a range query's answer")
    p.add_argument("--old-export", action="append",
                   help=f"with --export: git revision of a vmexport to compare (repeatable; "
                        f"default {OLD_EXPORT_REV})")
    p.add_argument("--json", help="write the figures as JSON too")
    args = p.parse_args(argv)

    if args.export:
        return export_main(args)
    body = answer(args.series, args.points, orders=args.orders)
    n = args.series * args.points
    res: dict[str, Any] = {"machine": machine(), "series": args.series, "points": n,
                           "orders": args.orders, "bytes": len(body)}
    seen: matrix.Labels = {}
    matrix.read(body, seen)
    reference = matrix.from_result(json.loads(body)["data"]["result"])
    decoders: dict[str, Callable[[], Any]] = {
        "scanner, typed Arrow columns (metering.matrix.read)": lambda: matrix.read(body),
        "same, a family's second signal (labels decoded before: same chunk)":
            lambda: matrix.read(body, seen),
        "json.loads + from_result (the path of odd answers)":
            lambda: matrix.from_result(json.loads(body)["data"]["result"]),
        "json.loads alone": lambda: json.loads(body),
    }
    for rev in args.old or OLD_REVS:
        old = old_matrix(rev)
        if old is None:
            continue
        decoders[f"scanner of {rev}"] = functools.partial(old.read, body)
        if "seen" in inspect.signature(old.read).parameters:
            old_seen: dict[Any, Any] = {}
            old.read(body, old_seen)
            decoders[f"scanner of {rev}, a family's second signal"] = \
                functools.partial(old.read, body, old_seen)
    rows = []
    res["decode"] = {}
    least, outs = round_robin(decoders, args.repeat)
    for name in decoders:
        s, out = least[name], outs[name]
        ok = same(out, reference) if hasattr(out, "sid") else None
        res["decode"][name] = {"cpu_s": s, "points_per_cpu_s": n / s, "same": ok}
        rows.append([name, f"{s * 1e3:.0f} ms", f"{n / s / 1e6:.2f} M",
                     "" if ok is None else "yes" if ok else "**no**"])
    say(f"decode: {args.series:,} series x {args.points} points ({n:,} points, "
        f"{len(body) / 2**20:.1f} MiB, {args.orders:,} label-name order(s))")
    say(table(["decoder", "CPU", "points per CPU-s", "same matrix as json's path"], rows))

    server, url = serve(body)
    try:
        client = PromClient(url, timeout=120)

        def ours() -> int:
            return len(client._fetch("/api/v1/query_range?query=x").body)

        def stdlib() -> int:
            with urllib.request.urlopen(url + "/api/v1/query_range?query=x", timeout=120) as r:
                return len(r.read())

        fetch_rows = []
        res["fetch"] = {}
        for name, fn in (("metering.promclient (http.client, deadline, read1 loop)", ours),
                         ("urllib.request.urlopen().read()", stdlib)):
            t0 = time.perf_counter()
            s, size = cpu(fn, args.repeat)
            wall = (time.perf_counter() - t0) / args.repeat
            res["fetch"][name] = {"cpu_s": s, "wall_s": wall, "bytes": size}
            fetch_rows.append([name, f"{s * 1e3:.0f} ms", f"{s / (size / 2**30):.2f} s",
                               f"{wall * 1e3:.0f} ms"])
        say(table(["client", "CPU per answer (client thread + server in one process)",
                   "CPU-s per GiB", "wall per answer"], fetch_rows))
    finally:
        server.shutdown()
        server.server_close()
    write_json(args.json, res)
    return 0


def export_main(args: argparse.Namespace) -> int:
    """--export: vmexport.read of this tree beside older revisions' and Python's json line
    by line (the path of answers the scanner refuses), round-robin, least CPU of the rounds."""
    body = export_answer(args.series, args.points)
    n = args.series * args.points
    first, last = 1_790_812_800, 1_790_812_800 + (args.points - 1) * 3600
    reference = vmexport.hourly(*vmexport._python(body), first, last)
    seen: matrix.Labels = {}  # as the family's first signal (another name) left it
    vmexport.read(body.replace(b":alloc_sum:", b":alloc_count:"), first, last, seen)
    decoders: dict[str, Callable[[], Any]] = {
        "numpy markers + Arrow CSV columns (metering.vmexport.read)":
            lambda: vmexport.read(body, first, last),
        "same, a family's second signal (labels decoded before: vmexport.read(seen))":
            lambda: vmexport.read(body, first, last, seen),
        "json line by line (vmexport._python + hourly)":
            lambda: vmexport.hourly(*vmexport._python(body), first, last),
    }
    for rev in args.old_export or (OLD_EXPORT_REV,):
        old = old_matrix(rev, "metering/vmexport.py")
        if old is not None:
            decoders[f"vmexport of {rev}"] = functools.partial(old.read, body, first, last)
    least, outs = round_robin(decoders, args.repeat)
    res: dict[str, Any] = {"machine": machine(), "series": args.series, "points": n,
                           "bytes": len(body), "decode": {}}
    rows = []
    for name, s in least.items():
        ok = same(outs[name], reference)
        res["decode"][name] = {"cpu_s": s, "points_per_cpu_s": n / s, "same": ok}
        rows.append([name, f"{s * 1e3:.0f} ms", f"{n / s / 1e6:.2f} M",
                     "yes" if ok else "**no**"])
    say(f"decode export: {args.series:,} series x {args.points} hourly samples ({n:,} points, "
        f"{len(body) / 2**20:.1f} MiB)")
    say(table(["decoder", "CPU", "points per CPU-s", "same matrix as json's path"], rows))
    write_json(args.json, res)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
