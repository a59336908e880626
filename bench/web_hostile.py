"""Serving designs against hostile clients: what a slow connection costs, whether a normal
scrape still gets through, scrape latency, and basic-auth timing (issue 14).

    python -m bench.web_hostile            # full run (about 3 minutes on 2 cores)
    python -m bench.web_hostile --quick    # fewer connections and scrapes
    python -m bench.web_hostile --json out.json
    python -m bench.web_hostile --admission    # many hosts, wrong passwords (issue 24)
    python -m bench.web_hostile --admission --root /work/main   # the same, another tree's exporter

Designs, each served from its own process so that its RSS can be read from /proc:
- `threads`: the stdlib ThreadingHTTPServer, one thread per connection, a 30 s timeout per
  read, backlog 64: the exporter's server before exporter/httpserver.py, in its essentials;
- `pool`: the same handler on a bounded pool of 32 threads (connections past it queue);
- `aiohttp`: aiohttp.web with its defaults (installed here through the `kubernetes` dev
  dependency; left out, with a line saying so, where it is not installed);
- `ours`: exporter.web.start_server (exporter/httpserver.py, asyncio) with its default limits.
Every design serves the same bytes: a 318 KB body (the big node's exposition size) or 13 KB
gzip, so the figures compare the HTTP layers, not the rendering.

`--admission` measures only `ours` (loaded from `--root`, default this tree, so a checkout of
an older commit gives the before figures) against attackers on several loopback addresses
(127.0.0.2-9; Linux routes all of 127/8 to lo): a scrape on a keep-alive connection and from
hosts never seen before, behind 2,000 slow connections from 8 hosts; and a fresh exporter's
first good scrape (basic auth, cost 10) behind 100 keep-alive connections sending wrong
passwords, each request a different one.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import http.client
import importlib.util
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import bcrypt

from bench.common import machine, rss_mib, say, summary_ms, table, write_json
from exporter.web import BasicAuth

PLAIN = b"# a 318 KB exposition\n" + b"gpu_x{a=\"b\"} 1\n" * 21_176
GZIP = b"\x1f\x8b" + b"z" * 13_137
DESIGNS = ("threads", "pool", "aiohttp", "ours")


# --- the servers (run in a child process) -----------------------------------------------------


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    timeout = 30.0

    def do_GET(self) -> None:
        gz = "gzip" in (self.headers.get("Accept-Encoding") or "")
        body = GZIP if gz else PLAIN
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _Threads(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 64


class _Pool(_Threads):
    def __init__(self, addr: tuple[str, int]) -> None:
        super().__init__(addr, _Handler)
        self.pool = ThreadPoolExecutor(32)

    def process_request(self, request: Any, client_address: Any) -> None:
        self.pool.submit(self.process_request_thread, request, client_address)


class _Static:
    def exposition(self, openmetrics: bool, gzipped: bool) -> bytes:
        return GZIP if gzipped else PLAIN

    def health(self) -> tuple[bool, str]:
        return True, "ok"


def serve(design: str, port_file: Path) -> None:
    if design in ("threads", "pool"):
        srv = _Threads(("127.0.0.1", 0), _Handler) if design == "threads" else \
            _Pool(("127.0.0.1", 0))
        port_file.write_text(str(srv.server_address[1]))
        srv.serve_forever()
    elif design == "aiohttp":
        from aiohttp import web

        async def metrics(request: web.Request) -> web.Response:
            gz = "gzip" in request.headers.get("Accept-Encoding", "")
            return web.Response(body=GZIP if gz else PLAIN)

        async def main() -> None:
            app = web.Application()
            app.router.add_get("/metrics", metrics)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            port_file.write_text(str(runner.addresses[0][1]))
            await asyncio.Event().wait()

        asyncio.run(main())
    else:
        from exporter.web import start_server
        server = start_server(_Static(), "127.0.0.1", 0, None)
        port_file.write_text(str(server.port))
        threading.Event().wait()


# --- the attacks and the measurements (parent process) ----------------------------------------


@dataclass(frozen=True)
class Plan:
    slow: int  # slowloris connections
    floods: int  # header-flood connections
    scrapes: int
    burst_clients: int


FULL = Plan(slow=400, floods=10, scrapes=2_000, burst_clients=200)
QUICK = Plan(slow=100, floods=4, scrapes=300, burst_clients=50)


def start(design: str) -> tuple[subprocess.Popen[bytes], int]:
    tmp = Path(tempfile.mkdtemp(prefix="gpu-ledger-hostile-"))
    port_file = tmp / "port"
    proc = subprocess.Popen([sys.executable, "-m", "bench.web_hostile", "--serve", design,
                             str(port_file)])
    deadline = time.monotonic() + 30
    while not port_file.exists() or not port_file.read_text():
        if time.monotonic() > deadline or proc.poll() is not None:
            raise RuntimeError(f"{design} server did not start")
        time.sleep(0.05)
    time.sleep(0.3)
    return proc, int(port_file.read_text())


def scrape(port: int, timeout: float = 5.0, gz: bool = False,
           source: str | None = None) -> float | str:
    """One scrape on a fresh connection (from `source`, another loopback address, to stand
    for another pod): seconds, or what went wrong."""
    t0 = time.perf_counter()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout,
                                          source_address=(source, 0) if source else None)
        conn.request("GET", "/metrics", headers={"Accept-Encoding": "gzip"} if gz else {})
        resp = conn.getresponse()
        resp.read()
        conn.close()
        if resp.status != 200:
            return f"HTTP {resp.status}"
        return time.perf_counter() - t0
    except TimeoutError:
        return f"timeout {timeout:.0f}s"
    except OSError as exc:
        return type(exc).__name__


def slowloris(port: int, pid: int, n: int) -> dict[str, Any]:
    """n connections from 127.0.0.1 that started a request head and stopped: how many the
    server holds, RSS per held connection, and whether a scrape from another address
    (127.0.0.2, as Prometheus in another pod) still gets an answer meanwhile."""
    before = rss_mib(pid)
    socks = []
    for _ in range(n):
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            socks.append(s)
        except OSError:
            break
    time.sleep(1.0)
    after = rss_mib(pid)
    probe = scrape(port, source="127.0.0.2")
    held = 0
    for s in socks:
        s.setblocking(False)
        try:
            s.recv(1)  # data (a 503) or b"" (closed): not held
        except BlockingIOError:
            held += 1
        except OSError:
            pass
        s.close()
    return {"opened": len(socks), "held": held, "rss_before_mib": before,
            "rss_after_mib": after, "kib_per_conn": (after - before) * 1024 / max(1, held),
            "scrape_meanwhile": probe if isinstance(probe, str) else f"{probe * 1e3:.1f} ms"}


def header_flood(port: int, pid: int, n: int) -> dict[str, Any]:
    """n connections each sending 100 header lines of 64 KiB and never ending the head."""
    before = rss_mib(pid)
    line = b"X-Pad: " + b"a" * (64 * 1024 - 9) + b"\r\n"
    socks, answered = [], 0
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(b"GET /metrics HTTP/1.1\r\n")
        try:
            for _ in range(100):
                s.sendall(line)
        except OSError:
            answered += 1  # the server answered (431/400) and closed
        socks.append(s)
    time.sleep(0.5)
    peak = rss_mib(pid)
    for s in socks:
        s.close()
    return {"connections": n, "cut_short": answered, "rss_grown_mib": peak - before,
            "mib_per_conn": (peak - before) / n}


def latency(port: int, n: int, gz: bool) -> dict[str, float]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    headers = {"Accept-Encoding": "gzip"} if gz else {}
    out = []
    for _ in range(n + 20):
        t0 = time.perf_counter()
        conn.request("GET", "/metrics", headers=headers)
        resp = conn.getresponse()
        resp.read()
        out.append(time.perf_counter() - t0)
    conn.close()
    return summary_ms(out[20:])


def burst(port: int, clients: int) -> dict[str, Any]:
    """`clients` threads, 10 scrapes each with Connection: close, all at once."""
    results: list[float | str] = []
    lock = threading.Lock()

    def client() -> None:
        for _ in range(10):
            r = scrape(port, timeout=10.0, gz=True)
            with lock:
                results.append(r)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ok = [r for r in results if isinstance(r, float)]
    failed = [r for r in results if isinstance(r, str)]
    return {"requests": len(results), "failed": len(failed),
            "failures": sorted(set(failed)), **(summary_ms(ok) if ok else {})}


def run_design(design: str, plan: Plan) -> dict[str, Any]:
    proc, port = start(design)
    try:
        res: dict[str, Any] = {"rss_idle_mib": rss_mib(proc.pid)}
        res["plain"] = latency(port, plan.scrapes, False)
        res["gzip"] = latency(port, plan.scrapes, True)
        res["slowloris"] = slowloris(port, proc.pid, plan.slow)
        time.sleep(0.5)
        res["burst"] = burst(port, plan.burst_clients)
        res["flood"] = header_flood(port, proc.pid, plan.floods)
        return res
    finally:
        proc.kill()
        proc.wait()


def auth_timing(repeat: int) -> list[list[object]]:
    """Median ms of a wrong password for a known user vs any password for an unknown one,
    with the configured hashes at cost 4 and 12: dummy hash at cost 10 (before) vs at the
    highest configured cost (now)."""
    rows: list[list[object]] = []
    for cost in (4, 12):
        users = {"alice": bcrypt.hashpw(b"right", bcrypt.gensalt(rounds=cost)).decode()}
        for label, auth in (("dummy cost 10 (before)", _FixedDummy(users)),
                            ("dummy = configured cost (now)", BasicAuth(users))):
            def timed(header: str, auth: BasicAuth = auth) -> float:
                times = []
                for _ in range(repeat):
                    t0 = time.perf_counter()
                    auth.check(header)
                    times.append(time.perf_counter() - t0)
                return statistics.median(times) * 1e3
            wrong = timed(_basic("alice", "wrong"))
            unknown = timed(_basic("mallory", "wrong"))
            rows.append([f"cost {cost}", label, round(wrong, 1), round(unknown, 1),
                         f"{unknown / wrong:.2f}"])
    return rows


class _FixedDummy(BasicAuth):
    """The previous behaviour: the dummy hash always at cost 10."""

    def __init__(self, users: dict[str, str]) -> None:
        super().__init__(users)
        self._dummy = bcrypt.hashpw(b"dummy", bcrypt.gensalt(rounds=10))


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def report(res: dict[str, Any]) -> str:
    rows = []
    for d in (d for d in DESIGNS if d in res):
        r = res[d]
        s, f, b = r["slowloris"], r["flood"], r["burst"]
        rows.append([
            d, f"{r['rss_idle_mib']:.1f}",
            f"{s['held']} of {s['opened']} held, {s['kib_per_conn']:.0f} KiB each; "
            f"scrape from another IP: {s['scrape_meanwhile']}",
            f"{f['mib_per_conn']:.2f} MiB/conn ({f['cut_short']}/{f['connections']} cut)",
            f"{r['plain']['p50_ms']:.3f} / {r['plain']['p99_ms']:.3f}",
            f"{r['gzip']['p50_ms']:.3f} / {r['gzip']['p99_ms']:.3f}",
            f"{b['failed']}/{b['requests']} failed" + (
                f", p99 {b['p99_ms']:.0f} ms" if "p99_ms" in b else "")])
    out = table(["design", "idle RSS (MiB)", "slowloris (one IP)",
                 "header flood (100 x 64 KiB lines)", "scrape p50 / p99 plain (ms)",
                 "gzip (ms)", "burst: Connection: close"], rows)
    out += "\n\n" + table(["configured hash", "unknown-user check", "wrong password (ms)",
                           "unknown user (ms)", "unknown / wrong"], res["auth"])
    return out


# --- admission: many hosts, wrong passwords (issue 24) ---------------------------------------

_ADMISSION_SERVER = """
import sys, threading
from pathlib import Path
from exporter.web import start_server
from exporter.webconfig import WebConfig
class Source:
    def exposition(self, openmetrics, gzipped): return b"gpu_x 1\\n" * 2000
    def health(self): return True, "ok"
users = {"prometheus": sys.argv[2]} if sys.argv[2] else {}
server = start_server(Source(), "127.0.0.1", 0, WebConfig(basic_auth_users=users))
Path(sys.argv[1]).write_text(str(server.port))
threading.Event().wait()
"""
HOSTS = [f"127.0.0.{i}" for i in range(2, 10)]


def start_admission(root: Path, hashed: str) -> tuple[subprocess.Popen[bytes], int]:
    port_file = Path(tempfile.mkdtemp(prefix="gpu-ledger-admission-")) / "port"
    proc = subprocess.Popen([sys.executable, "-c", _ADMISSION_SERVER, str(port_file), hashed],
                            cwd=root, env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"})
    deadline = time.monotonic() + 30
    while not port_file.exists() or not port_file.read_text():
        if time.monotonic() > deadline or proc.poll() is not None:
            raise RuntimeError("the exporter did not start")
        time.sleep(0.05)
    return proc, int(port_file.read_text())


def _get(conn: http.client.HTTPConnection, headers: dict[str, str]) -> float | str:
    t0 = time.perf_counter()
    try:
        conn.request("GET", "/metrics", headers=headers)
        resp = conn.getresponse()
        resp.read()
    except (OSError, http.client.HTTPException) as exc:
        conn.close()
        return type(exc).__name__
    return time.perf_counter() - t0 if resp.status == 200 else f"HTTP {resp.status}"


def many_hosts(port: int, slow: int) -> dict[str, Any]:
    """`slow` connections stopping mid-head, round-robin from 8 hosts; then 6 scrapes on a
    keep-alive connection opened before them and 6 from hosts never seen before."""
    keep = http.client.HTTPConnection("127.0.0.1", port, timeout=10,
                                      source_address=("127.0.0.10", 0))
    first = _get(keep, {})
    socks: list[socket.socket] = []
    for i in range(slow):
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=5,
                                         source_address=(HOSTS[i % len(HOSTS)], 0))
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            socks.append(s)
        except OSError:
            pass
    time.sleep(1.0)
    kept = [_get(keep, {}) for _ in range(6)]
    fresh = []
    for i in range(6):
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=10,
                                       source_address=(f"127.0.0.{11 + i}", 0))
        fresh.append(_get(c, {}))
        c.close()
    keep.close()
    held: dict[str, int] = {h: 0 for h in HOSTS}
    for s in socks:
        s.setblocking(False)
        try:
            s.recv(1)
        except BlockingIOError:
            held[s.getsockname()[0]] += 1
        except OSError:
            pass
        s.close()
    return {"first": first, "keep_alive": kept, "fresh_hosts": fresh, "held": held}


def wrong_passwords(port: int, connections: int, hosts: list[str]) -> dict[str, Any]:
    """`connections` keep-alive clients sending a different wrong password each request,
    from `hosts` in turn; after 1 s, the first good scrape from another host, timed."""
    stop = threading.Event()
    answers: list[str] = []

    def flood(k: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60,
                                          source_address=(hosts[k % len(hosts)], 0))
        n = 0
        while not stop.is_set():
            n += 1
            r = _get(conn, {"Authorization": _basic("prometheus", f"wrong-{k}-{n}")})
            answers.append(r if isinstance(r, str) else "HTTP 200")
        conn.close()

    threads = [threading.Thread(target=flood, args=(k,), daemon=True)
               for k in range(connections)]
    for t in threads:
        t.start()
    time.sleep(1.0)
    good = http.client.HTTPConnection("127.0.0.1", port, timeout=120,
                                      source_address=("127.0.0.20", 0))
    t0 = time.perf_counter()
    result = _get(good, {"Authorization": _basic("prometheus", "right")})
    took = time.perf_counter() - t0
    good.close()
    stop.set()
    for t in threads:
        t.join(timeout=120)
    counts = {a: answers.count(a) for a in sorted(set(answers))}
    return {"good": "200" if isinstance(result, float) else result, "seconds": took,
            "flood_answers": counts}


def _fmt(results: list[float | str]) -> str:
    ok = [r for r in results if isinstance(r, float)]
    bad = [r for r in results if isinstance(r, str)]
    text = f"{len(ok)}/{len(results)} OK"
    if ok:
        text += f" (max {max(ok) * 1e3:.1f} ms)"
    if bad:
        text += ", " + ", ".join(f"{bad.count(b)}x {b}" for b in sorted(set(bad)))
    return text


def admission(root: Path) -> str:
    rows = []
    proc, port = start_admission(root, "")
    try:
        r = many_hosts(port, 2000)
    finally:
        proc.kill()
        proc.wait()
    held = r["held"]
    rows.append(["2,000 slow connections from 8 hosts",
                 f"keep-alive scraper: {_fmt(r['keep_alive'])}",
                 f"fresh hosts: {_fmt(r['fresh_hosts'])}",
                 f"held {sum(held.values())}, {min(held.values())}-{max(held.values())} "
                 "per host"])
    hashed = bcrypt.hashpw(b"right", bcrypt.gensalt(rounds=10)).decode()
    for label, hosts in (("100 wrong-password connections, 1 host", ["127.0.0.1"]),
                         ("100 wrong-password connections, 8 hosts", HOSTS)):
        proc, port = start_admission(root, hashed)
        try:
            w = wrong_passwords(port, 100, hosts)
        finally:
            proc.kill()
            proc.wait()
        rows.append([label, "", f"first good scrape (fresh exporter): {w['good']} after "
                     f"{w['seconds']:.2f} s",
                     ", ".join(f"{n}x {a}" for a, n in w["flood_answers"].items())])
    return table(["attack", "keep-alive", "fresh host", "attackers"], rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json")
    p.add_argument("--admission", action="store_true", help="issue 24's attacks only")
    p.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent,
                   help="the tree whose exporter --admission measures")
    p.add_argument("--serve", nargs=2, metavar=("DESIGN", "PORT_FILE"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve:
        serve(args.serve[0], Path(args.serve[1]))
        return 0
    if args.admission:
        info = machine()
        say(f"machine: {info['cpu']}, {info['cores']} cores, Python {info['python']}; "
            f"exporter from {args.root}")
        say(admission(args.root))
        return 0
    plan = QUICK if args.quick else FULL
    res: dict[str, Any] = {"machine": machine()}
    for d in DESIGNS:
        if d == "aiohttp" and importlib.util.find_spec("aiohttp") is None:
            say("aiohttp is not installed: that design is left out")
            continue
        say(f"{d} ...")
        res[d] = run_design(d, plan)
    res["auth"] = auth_timing(3 if args.quick else 7)
    say(report(res))
    if args.json:
        write_json(args.json, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
