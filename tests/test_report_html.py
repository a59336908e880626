"""The HTML report opened in real headless Chromium, driven over the DevTools protocol.

The page must load with no console errors and no network requests, its four charts must be
laid out and painted (the screenshot holds the charts' colours), and a hostile pod name must
be text on the page, not a script.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import struct
import subprocess
import tempfile
import time
import urllib.request
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import websocket
from test_report_fixtures import HASH, OCT2, OCTOBER, charge, make_db

from gpu_ledger.procutil import stop
from metering.costmodel import load_cost_model
from metering.db import connect
from metering.period import Month
from metering.report.builder import build_report, price_lookup
from metering.report.charts import IDLE_COLOR, PALETTE
from metering.report.html import render_html
from metering.report.model import CostModelInfo
from metering.report.waste import Evidence, Kind, Recommendation

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or "/usr/bin/chromium"
HOSTILE_POD = "<script>document.title='owned'</script>"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--remote-debugging-port=0",
    "--window-size=1200,900",
]


@contextmanager
def chromium(profile: Path) -> Iterator[int]:
    """Start headless Chromium with an empty profile; yields its DevTools port. The singleton
    directory Chromium makes in its temporary directory outlives a stopped browser (in /tmp
    they piled up run after run), so it gets one of its own, removed afterwards: short,
    because it holds a unix socket (a path of at most 107 bytes)."""
    profile.mkdir()
    scratch = tempfile.mkdtemp(prefix="gl-chromium-")
    proc = subprocess.Popen(
        [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "TMPDIR": scratch},
    )
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text().strip()):
            if proc.poll() is not None:
                raise RuntimeError(f"chromium exited with {proc.returncode}")
            if time.monotonic() > deadline:
                raise RuntimeError("chromium did not open its DevTools port")
            time.sleep(0.05)
        yield int(port_file.read_text().split()[0])
    finally:
        stop(proc, timeout=15)
        shutil.rmtree(scratch, ignore_errors=True)


class DevTools:
    """A minimal CDP client for one page target: commands in order, events kept."""

    def __init__(self, port: int) -> None:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
            targets = json.load(r)
        page = next(t for t in targets if t["type"] == "page")
        self.ws = websocket.create_connection(
            page["webSocketDebuggerUrl"], timeout=30, suppress_origin=True
        )
        self.next_id = 0
        self.events: list[dict[str, Any]] = []

    def close(self) -> None:
        self.ws.close()

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                result: dict[str, Any] = msg["result"]
                return result
            if "method" in msg:
                self.events.append(msg)

    def wait_for(self, event: str) -> None:
        while not any(e["method"] == event for e in self.events):
            msg = json.loads(self.ws.recv())
            if "method" in msg:
                self.events.append(msg)

    def evaluate(self, expression: str) -> Any:
        out = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return out["result"]["value"]


def png_pixels(data: bytes) -> tuple[int, int, list[bytes]]:
    """Decode an 8-bit RGB/RGBA non-interlaced PNG (what Chromium writes) into RGB rows.

    Sub and Up rows are undone with numpy; Average and Paeth (rare in screenshots) byte by byte.
    """
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, b"", b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", header)
    assert depth == 8 and color in (2, 6) and interlace == 0
    bpp = 3 if color == 2 else 4
    raw = np.frombuffer(zlib.decompress(idat), dtype=np.uint8).reshape(height, width * bpp + 1)
    out = np.zeros((height, width * bpp), dtype=np.uint8)
    prev = np.zeros(width * bpp, dtype=np.uint8)
    for y in range(height):
        f, line = raw[y, 0], raw[y, 1:].copy()
        if f == 1:
            line = (
                (line.reshape(width, bpp).cumsum(axis=0, dtype=np.uint64) % 256)
                .astype(np.uint8)
                .reshape(-1)
            )
        elif f == 2:
            line = line + prev
        elif f in (3, 4):
            cur, up = bytearray(line.tobytes()), prev.tobytes()
            for i in range(len(cur)):
                a = cur[i - bpp] if i >= bpp else 0
                b, c = up[i], up[i - bpp] if i >= bpp else 0
                if f == 3:
                    cur[i] = (cur[i] + (a + b) // 2) & 0xFF
                else:
                    p = a + b - c
                    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                    cur[i] = (
                        cur[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)
                    ) & 0xFF
            line = np.frombuffer(bytes(cur), dtype=np.uint8)
        out[y], prev = line, line
    pixels = out.reshape(height, width, bpp)[:, :, :3]
    return width, height, [row.tobytes() for row in pixels]


def rgb(hex_color: str) -> bytes:
    return bytes.fromhex(hex_color.lstrip("#"))


@pytest.fixture
def page(tmp_path: Path) -> Path:
    rows = [*OCTOBER, charge(OCT2, "web", "serve", HOSTILE_POD, "GPU-3", "A100", "exclusive",
                             1, 2, 1, 0.5, "2")]  # fmt: skip
    db = make_db(tmp_path / "m.duckdb", october=rows)
    con = connect(db, read_only=True)
    report = build_report(con, Month.parse("2026-10"), CostModelInfo("c.yaml", HASH, "USD"), "0")
    con.close()
    path = tmp_path / "report.html"
    path.write_text(render_html(report), encoding="utf-8")
    return path


def test_html_report_renders_offline_in_chromium(page: Path, tmp_path: Path) -> None:
    with chromium(tmp_path / "profile") as port:
        cdp = DevTools(port)
        try:
            for domain in ("Runtime", "Log", "Network", "Page"):
                cdp.call(f"{domain}.enable")
            cdp.call("Page.navigate", url=page.as_uri())
            cdp.wait_for("Page.loadEventFired")
            charts = cdp.evaluate(
                "Array.from(document.querySelectorAll('figure svg')).map(s => {"
                " const r = s.getBoundingClientRect();"
                " return [r.width, r.height, s.querySelectorAll('rect').length]; })"
            )
            scripts = cdp.evaluate("document.scripts.length")
            title = cdp.evaluate("document.title")
            body_text = cdp.evaluate("document.body.innerText")
            height = cdp.evaluate("document.documentElement.scrollHeight")
            shot = cdp.call(
                "Page.captureScreenshot",
                format="png",
                captureBeyondViewport=True,
                clip={"x": 0, "y": 0, "width": 1200, "height": height, "scale": 1},
            )
            cdp.call("Runtime.evaluate", expression="0")  # drain events sent meanwhile
        finally:
            cdp.close()

    events = cdp.events
    console = [e for e in events if e["method"] == "Runtime.consoleAPICalled"]
    exceptions = [e for e in events if e["method"] == "Runtime.exceptionThrown"]
    log_errors = [
        e for e in events
        if e["method"] == "Log.entryAdded" and e["params"]["entry"]["level"] == "error"
    ]  # fmt: skip
    requests = [
        e["params"]["request"]["url"] for e in events
        if e["method"] == "Network.requestWillBeSent"
        and not e["params"]["request"]["url"].startswith("file:")
    ]  # fmt: skip
    assert console == [] and exceptions == [] and log_errors == []
    assert requests == []

    # Four charts, laid out with a size, each drawing bars.
    assert len(charts) == 4
    for width, h, rects in charts:
        assert width > 300 and h > 50 and rects >= 3

    # The hostile pod name is text; it never ran.
    assert scripts == 0 and title == "GPU chargeback report — 2026-10"
    assert HOSTILE_POD in body_text

    # The screenshot is not blank: many colours, and the charts' own colours are painted.
    (tmp_path / "shot.png").write_bytes(base64.b64decode(shot["data"]))
    width, h, rows = png_pixels((tmp_path / "shot.png").read_bytes())
    assert width == 1200 and h > 1000
    colours = {row[i : i + 3] for row in rows[::3] for i in range(0, len(row), 9)}
    assert len(colours) > 20
    for expected in (PALETTE[0], PALETTE[1], PALETTE[2], IDLE_COLOR):
        assert rgb(expected) in colours, expected


def test_html_report_fits_narrow_windows(page: Path, tmp_path: Path) -> None:
    """Under ~1,000 px the page must not spill sideways: wide tables scroll in their own box,
    charts scale down. Checked at three widths in a real browser."""
    widths = (980, 760, 420)
    seen: dict[int, tuple[int, int, float, int]] = {}
    with chromium(tmp_path / "profile") as port:
        cdp = DevTools(port)
        try:
            cdp.call("Page.enable")
            for width in widths:
                cdp.call("Emulation.setDeviceMetricsOverride", width=width, height=900,
                         deviceScaleFactor=1, mobile=False)
                cdp.events.clear()
                cdp.call("Page.navigate", url=page.as_uri())
                cdp.wait_for("Page.loadEventFired")
                seen[width] = tuple(cdp.evaluate(  # type: ignore[assignment]
                    "[document.documentElement.scrollWidth, window.innerWidth,"
                    " Math.max(...Array.from(document.querySelectorAll('figure svg'))"
                    "   .map(s => s.getBoundingClientRect().right)),"
                    " document.querySelectorAll('.scroll table').length]"))
        finally:
            cdp.close()
    for width, (scroll_w, inner_w, chart_right, tables) in seen.items():
        assert inner_w == width
        assert scroll_w <= inner_w, (width, scroll_w)
        assert chart_right <= inner_w, (width, chart_right)
        assert tables >= 5


def _recommendation(name: str, kind: Kind, proposed: str, saving: str) -> Recommendation:
    ev = Evidence(hours=200, device_hours=Decimal(200), peak_memory_gb=Decimal("14.2"),
                  p95_memory_gb=Decimal("13.9"), p95_sm=Decimal("0.12"), coverage=Decimal(1),
                  idle_device_hours=0, all_hours=744, held_coverage=Decimal(1))
    return Recommendation(kind=kind, team="ml-research", cluster="default",
                          namespace="ml-training", owner_kind="Deployment",
                          owner_name=name, model="NVIDIA H100 80GB HBM3",
                          current="whole GPU", proposed=proposed, cost=Decimal(2000),
                          saving=Decimal(saving), confidence="medium", evidence=ev)


@pytest.fixture
def finance_page(tmp_path: Path) -> Path:
    """A report as a finance run shows it: prices with the entries that set them (the
    packaged cost model: a derived A100 price, the default for the fixture's models),
    savings with long proposals, a workload that needs a larger unit, and budgets."""
    db = make_db(tmp_path / "m.duckdb")
    con = connect(db, read_only=True)
    recs = [
        _recommendation("feature-store-embedding-refresh", Kind.TO_SHARE,
                        "1/4 of a GPU (time-slicing or MPS, 4 replicas)", "1500.25"),
        _recommendation("nightly-batch-scoring-pipeline", Kind.TO_MIG, "MIG 1g.20gb",
                        "1714.29"),
        _recommendation("llm-finetune-large", Kind.MIG_UP, "MIG 3g.40gb", "-1700.57"),
    ]
    report = build_report(con, Month.parse("2026-10"), CostModelInfo("c.yaml", HASH, "USD"),
                          "0", prices=price_lookup(load_cost_model(None)),
                          budgets={"ml": Decimal(10), "research": Decimal(100)},
                          savings=recs,
                          notes=["DEFAULT PRICE: no pricing.gpus entry matches H100: 2.00 USD "
                                 "per GPU-hour (pricing.default); add an entry"])
    con.close()
    path = tmp_path / "finance.html"
    path.write_text(render_html(report), encoding="utf-8")
    return path


def test_html_report_fits_1280_px_with_no_label_cut(finance_page: Path, tmp_path: Path) -> None:
    """At a 1,280 px window nothing scrolls sideways, neither the page nor any table's box,
    and every chart label lies inside its chart (none is cut at the edge)."""
    with chromium(tmp_path / "profile") as port:
        cdp = DevTools(port)
        try:
            cdp.call("Page.enable")
            cdp.call("Emulation.setDeviceMetricsOverride", width=1280, height=900,
                     deviceScaleFactor=1, mobile=False)
            cdp.call("Page.navigate", url=finance_page.as_uri())
            cdp.wait_for("Page.loadEventFired")
            page_w, inner_w = cdp.evaluate(
                "[document.documentElement.scrollWidth, window.innerWidth]")
            boxes = cdp.evaluate(
                "Array.from(document.querySelectorAll('.scroll')).map(d =>"
                " [d.previousElementSibling ? d.previousElementSibling.textContent : '',"
                "  d.scrollWidth, d.clientWidth])")
            cut = cdp.evaluate(
                "Array.from(document.querySelectorAll('figure svg')).flatMap(svg => {"
                " const w = svg.viewBox.baseVal.width;"
                " return Array.from(svg.querySelectorAll('text')).filter(t => {"
                "  const b = t.getBBox(); return b.x < 0 || b.x + b.width > w + 0.5; })"
                "  .map(t => t.textContent); })")
            headings = cdp.evaluate(
                "Array.from(document.querySelectorAll('h2')).map(h => h.textContent)")
        finally:
            cdp.close()
    assert inner_w == 1280 and page_w <= 1280, page_w
    assert len(boxes) >= 8
    wide = [(title, sw, cw) for title, sw, cw in boxes if sw > cw]
    assert wide == []
    assert cut == []
    assert "Savings" in headings and "Needs a larger unit" in headings
