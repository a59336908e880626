"""Connection admission and the bcrypt queue against many hosts (issue 24, item 4), over
loopback addresses 127.0.0.2-127.0.0.13 (Linux routes all of 127/8 to lo). Bounded: a few
hundred connections, loops with fixed counts, only loopback targets."""

from __future__ import annotations

import base64
import http.client
import socket
import threading
import time
from contextlib import ExitStack

import bcrypt

from exporter.httpserver import Limits
from exporter.web import AUTH_QUEUE_PER_CLIENT, WebServer
from exporter.webconfig import WebConfig
from tests.test_web_hostile import serving

ATTACKERS = [f"127.0.0.{i}" for i in range(2, 10)]  # eight hosts
SCRAPER, FRESH = "127.0.0.10", "127.0.0.11"


def slow_connection(server: WebServer, source: str) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", server.port), timeout=10,
                                 source_address=(source, 0))
    s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ")  # a head that never ends
    return s


def scrape(conn: http.client.HTTPConnection, headers: dict[str, str] | None = None) -> int:
    conn.request("GET", "/metrics", headers=headers or {})
    resp = conn.getresponse()
    resp.read()
    return resp.status


def held(socks: list[socket.socket]) -> int:
    """How many of these connections the server still holds open without answering."""
    n = 0
    for s in socks:
        s.setblocking(False)
        try:
            s.recv(1)
        except BlockingIOError:
            n += 1
        except OSError:
            pass
    return n


def test_many_host_slowloris_keeps_the_scraper_and_admits_a_fresh_host() -> None:
    """Eight hosts open 3x the bound's worth of slow heads. Before: a per-IP bound let two of
    them fill the table, and the scraper's idle keep-alive connection was the one evicted.
    Now the keep-alive scraper gets 200 on the same connection every round, a host that was
    never seen before is admitted, and every attacker holds about an equal share."""
    limits = Limits(max_connections=64, max_per_client=64, reserved=8)
    with serving(limits) as server, ExitStack() as stack:
        scraper = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10,
                                             source_address=(SCRAPER, 0))
        stack.callback(scraper.close)
        assert scrape(scraper) == 200
        assert scraper.sock is not None
        local = scraper.sock.getsockname()
        socks: list[socket.socket] = []
        for _ in range(3):
            for host in ATTACKERS:
                for _ in range(8):
                    s = slow_connection(server, host)
                    stack.callback(s.close)
                    socks.append(s)
            time.sleep(0.2)
            assert scrape(scraper) == 200
            assert scraper.sock is not None and scraper.sock.getsockname() == local, \
                "the scraper's keep-alive connection was closed"
        assert server.http.connections <= limits.max_connections
        fresh = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10,
                                           source_address=(FRESH, 0))
        stack.callback(fresh.close)
        assert scrape(fresh) == 200
        per_host = {h: held([s for s in socks if s.getsockname()[0] == h]) for h in ATTACKERS}
        fresh_cap = limits.max_connections - limits.reserved
        assert sum(per_host.values()) <= fresh_cap
        assert max(per_host.values()) - min(per_host.values()) <= 2, per_host
        assert scrape(scraper) == 200 and scraper.sock.getsockname() == local


def test_a_second_fresh_host_evicts_the_heaviest_host_not_the_scraper() -> None:
    """One host fills every slot a fresh connection may take; newcomers from other hosts
    each take one of its slow connections, never the proven scraper's."""
    limits = Limits(max_connections=16, max_per_client=16, reserved=4)
    with serving(limits) as server, ExitStack() as stack:
        scraper = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10,
                                             source_address=(SCRAPER, 0))
        stack.callback(scraper.close)
        assert scrape(scraper) == 200
        socks = [slow_connection(server, ATTACKERS[0]) for _ in range(20)]
        for s in socks:
            stack.callback(s.close)
        time.sleep(0.2)
        assert held(socks) == limits.max_connections - limits.reserved
        for i in range(4):
            c = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10,
                                           source_address=(f"127.0.0.{20 + i}", 0))
            stack.callback(c.close)
            assert scrape(c) == 200
        assert server.http.evicted >= 1
        assert scrape(scraper) == 200


def _basic(user: str, password: str) -> dict[str, str]:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


def test_wrong_password_flood_does_not_queue_a_good_scrape_behind_it() -> None:
    """32 keep-alive connections from eight hosts send wrong passwords (each one different,
    so no cache helps) without pause. Before, every check queued in one line behind the
    flood (a fresh exporter's first good scrape waited 17 s behind 100 such connections).
    Now at most AUTH_QUEUE_PER_CLIENT checks per host wait, the rest get 503 at once, waiting
    checks start round-robin across hosts, and the good scrape from a ninth host is checked
    after at most one per other host: it succeeds while the flood goes on."""
    users = {"prometheus": bcrypt.hashpw(b"right", bcrypt.gensalt(rounds=10)).decode()}
    hosts = ATTACKERS
    with serving(Limits(), WebConfig(basic_auth_users=users)) as server:
        auth = server.auth
        assert auth is not None
        checked: list[str] = []
        real_check = auth.check

        def recording_check(header: str | None) -> bool:
            checked.append(header or "")
            return real_check(header)

        auth.check = recording_check  # type: ignore[method-assign]
        stop = threading.Event()
        statuses: list[int] = []

        def flood(host: str, k: int) -> None:
            n = 0
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30,
                                              source_address=(host, 0))
            while not stop.is_set() and n < 200:
                n += 1
                try:
                    statuses.append(scrape(conn, _basic("prometheus", f"wrong-{host}-{k}-{n}")))
                except (OSError, http.client.HTTPException):
                    conn.close()  # answered 503 and closed: reconnect, as an attacker would
            conn.close()

        threads = [threading.Thread(target=flood, args=(h, k)) for h in hosts for k in range(4)]
        for t in threads:
            t.start()
        try:
            time.sleep(1.0)  # the flood is in full swing
            good = _basic("prometheus", "right")["Authorization"]
            before = len(checked)
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30,
                                              source_address=(FRESH, 0))
            try:
                status = scrape(conn, _basic("prometheus", "right"))
            finally:
                conn.close()
            flooding = not stop.is_set() and any(t.is_alive() for t in threads)
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=60)
        assert status == 200
        assert flooding, "the flood ended before the good scrape was answered"
        ahead = checked.index(good) - before
        assert ahead <= len(hosts) * AUTH_QUEUE_PER_CLIENT, ahead
        assert 401 in statuses and 503 in statuses, sorted(set(statuses))


def test_a_repeated_wrong_password_is_answered_without_bcrypt() -> None:
    users = {"prometheus": bcrypt.hashpw(b"right", bcrypt.gensalt(rounds=4)).decode()}
    with serving(Limits(), WebConfig(basic_auth_users=users)) as server:
        auth = server.auth
        assert auth is not None
        calls: list[str] = []
        real_check = auth.check

        def recording_check(header: str | None) -> bool:
            calls.append(header or "")
            return real_check(header)

        auth.check = recording_check  # type: ignore[method-assign]
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        try:
            statuses = [scrape(conn, _basic("prometheus", "wrong")) for _ in range(5)]
            statuses.append(scrape(conn, _basic("prometheus", "right")))
            statuses.append(scrape(conn, _basic("prometheus", "right")))
        finally:
            conn.close()
    assert statuses == [401] * 5 + [200, 200]
    assert len(calls) == 2  # one bcrypt for the wrong password, one for the right one
