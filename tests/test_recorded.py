"""The hourly metering series (alerts: group gpu-ledger.metering-series; metering.recorded)
bill exactly as the raw series they were recorded from.

The rules are backfilled over the hand-computed fleet of tests/conftest_prom.py with the real
tools: `vmalert -replay` against VictoriaMetrics (the MetricsQL variant) and `promtool tsdb
create-blocks-from rules` for Prometheus (the shipped file), both evaluating at 17 minutes past
the hour, as an evaluator with its own offset does. Then the same day is metered from the raw
series only (`--recorded never`) and from the recorded ones only (`--recorded only`), and
every fact row and charge must be equal, floats to the last bit. Two copies of node-b's series
(a second scrape 7 s later, as an HA pair gives) make the de-duplication read the last-sample
times too.
"""

from __future__ import annotations

import http.server
import io
import re
import shutil
import subprocess
import threading
import urllib.request
from contextlib import redirect_stderr
from pathlib import Path

import pytest
import yaml
from conftest_prom import fact_rows
from promtools import backfill, running_prometheus, running_victoria, vm_import

from alerts.generate import METERING_GROUP, METERING_VM_FILE, metering_group
from bench.recorded import REPLAY_LOST, REPLAY_WRITE
from metering import vmnative
from metering.cli_meter import main
from metering.db import connect
from metering.matrix import Labels
from metering.signals import SIGNALS

pytestmark = pytest.mark.slow

DAY_ARGS = ["--from", "2026-10-05", "--to", "2026-10-06"]
FACTS = ("device_hours", "mig_hours", "allocation_hours", "workload_hours", "grant_hours")
# Evaluations at hh:17 from the hour before the day to the hour after it.
REPLAY_FROM, REPLAY_TO = "2026-10-04T23:17:00Z", "2026-10-06T00:59:00Z"
# promtool's rule backfill (v2.42 cmd/promtool/rules.go) evaluates a group at the minute its
# name and *file path* hash to (rules.Group.EvalTimestamp), so each test run's tmp path gives
# another minute; it walks 2-hour blocks and stops at the first whose aligned evaluation is
# past the block's end. From a 2-hour boundary to an hour past the last hour needed, every
# minute gives each hour of the day (the hh:17 range above lost the day for ~18 minutes of 60:
# the whole replay for minutes before :17, the last hour for minutes after :59).
PROMTOOL_FROM, PROMTOOL_TO = "2026-10-04T22:00:00Z", "2026-10-06T01:59:00Z"
HA_HOURS = range(3, 9)  # node-b scraped twice from 03:00 to 09:00


def _with_copies(om: str) -> list[tuple[str, int]]:
    """(series, unix seconds) of the fleet, plus node-b's series again as another instance
    7 s later during HA_HOURS."""
    out: list[tuple[str, int]] = []
    day0 = None
    for line in om.splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, ts = line.rpartition(" ")
        t = int(ts)
        day0 = day0 or t - t % 86400
        out.append((head, t))
        if 'node="node-b"' in head and (t - day0) // 3600 % 24 in HA_HOURS:
            name, _, labels = head.partition("{")
            out.append((f'{name}{{instance="copy",{labels}', t + 7))
    return out


def _prometheus_text(samples: list[tuple[str, int]]) -> str:
    return "\n".join(f"{head} {t * 1000}" for head, t in samples) + "\n"


def _openmetrics(samples: list[tuple[str, int]]) -> str:
    return "\n".join(f"{head} {t}" for head, t in sorted(samples, key=_by_series)) + "\n# EOF\n"


def _by_series(sample: tuple[str, int]) -> tuple[str, str, int]:
    head, t = sample
    return head.partition("{")[0], head, t


def _meter(url: str, db: Path, *extra: str) -> str:
    err = io.StringIO()
    with redirect_stderr(err):
        rc = main(["--prometheus", url, *DAY_ARGS, "--db", str(db), "--retries", "0", "-v",
                   *extra])
    assert rc == 0, err.getvalue()
    return err.getvalue()


def _same_ledger(a: Path, b: Path) -> int:
    """Every fact row and charge equal; returns the number of fact rows compared."""
    ca, cb = connect(a, read_only=True), connect(b, read_only=True)
    compared = 0
    try:
        for table in FACTS:
            rows = fact_rows(ca, table)
            assert rows == fact_rows(cb, table), table
            compared += len(rows)
        cols = [r[0] for r in ca.execute("DESCRIBE charges").fetchall()]
        keep = ", ".join(c for c in cols if c not in ("priced_at", "ingested_at"))
        sql = f"SELECT {keep} FROM charges ORDER BY ALL"
        charges = ca.execute(sql).fetchall()
        assert charges and charges == cb.execute(sql).fetchall()
    finally:
        ca.close()
        cb.close()
    return compared


def _replay(url: str, rules: Path, start: str, end: str, log: Path) -> None:
    vmalert = shutil.which("vmalert")
    assert vmalert, "vmalert is not installed: apt-get install -y vmalert"
    with log.open("wb") as fh:
        rc = subprocess.run([vmalert, f"-rule={rules}", f"-datasource.url={url}",
                             f"-remoteWrite.url={url}", f"-replay.timeFrom={start}",
                             f"-replay.timeTo={end}", "-replay.rulesDelay=0s",
                             "-replay.disableProgressBar", "-httpListenAddr=127.0.0.1:0",
                             *REPLAY_WRITE],
                            stdout=fh, stderr=subprocess.STDOUT, timeout=300).returncode
    assert rc == 0 and not any(w in log.read_text() for w in REPLAY_LOST), log.read_text()
    vm_import(url, "")  # flushes what the replay wrote


@pytest.fixture(scope="module")
def samples(fleet_om_file: Path) -> list[tuple[str, int]]:
    return _with_copies(fleet_om_file.read_text())


def test_victoria_metrics_recorded_series_bill_as_the_raw_ones(
        samples: list[tuple[str, int]], tmp_path: Path) -> None:
    """Read by VictoriaMetrics' /api/v1/export JSON lines (its default on this unreported
    version), its native form (asked) and by range queries: all bill as the raw series. A
    second evaluator at hh:43 (an HA pair's other member) gives every series-hour two
    recorded samples."""
    raw, rec, ranged, native = (tmp_path / f"{n}.duckdb"
                                for n in ("raw", "recorded", "ranged", "native"))
    with running_victoria(tmp_path / "vm") as url:
        vm_import(url, _prometheus_text(samples))
        _replay(url, METERING_VM_FILE, REPLAY_FROM, REPLAY_TO, tmp_path / "replay.log")
        _replay(url, METERING_VM_FILE, REPLAY_FROM.replace(":17:", ":43:"), REPLAY_TO,
                tmp_path / "replay2.log")
        raw_out = _meter(url, raw, "--recorded", "never")
        rec_out = _meter(url, rec, "--recorded", "only")
        ranged_out = _meter(url, ranged, "--recorded", "only", "--recorded-read", "query_range")
        native_out = _meter(url, native, "--recorded", "only", "--recorded-read", "native")
    n = len(SIGNALS)
    assert f"{n} of {n} signal-chunks from the recorded hourly series" in rec_out, rec_out
    assert f"{n} of them read by VictoriaMetrics' /api/v1/export\n" in rec_out, rec_out
    # Debian's build reports no version: auto reads JSON lines and says why, once.
    said = [ln for ln in rec_out.splitlines() if "/api/v1/export/native was verified" in ln]
    assert len(said) == 1 and "version unreported" in said[0], rec_out
    assert f"{n} of them read by VictoriaMetrics' /api/v1/export ({n} as " \
           "/api/v1/export/native)" in native_out, native_out
    assert "JSON lines" not in native_out, native_out  # checked against them, and equal
    assert f"{n} of {n} signal-chunks from the recorded" in ranged_out
    assert "/api/v1/export" not in ranged_out and "/api/v1/export" not in raw_out
    assert "recorded hourly series" not in raw_out
    assert _same_ledger(raw, rec) > 400
    assert _same_ledger(raw, ranged) > 400
    assert _same_ledger(raw, native) > 400
    # The copies were seen, and counted once, on both paths.
    assert "coverage: 0 duplicate" not in raw_out and "coverage: 0 duplicate" not in rec_out


def test_rules_for_part_of_the_day_fall_back_to_raw_series(
        samples: list[tuple[str, int]], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Rules deployed at 08:00 (evaluations from 08:17), with alloc_count's rule only from
    the start: in 8-hour chunks, the first reads alloc_count recorded and the rest raw, the
    others read every signal recorded; the bill is the raw one's. `--recorded only` refuses
    the first chunk in one line."""
    raw, auto = tmp_path / "raw.duckdb", tmp_path / "auto.duckdb"
    with running_victoria(tmp_path / "vm") as url:
        vm_import(url, _prometheus_text(samples))
        _replay(url, METERING_VM_FILE, "2026-10-05T08:17:00Z", REPLAY_TO,
                tmp_path / "late.log")
        only_alloc = tmp_path / "only-alloc.yml"
        doc = yaml.safe_load(METERING_VM_FILE.read_text())
        doc["groups"][0]["rules"] = [r for r in doc["groups"][0]["rules"]
                                     if r["record"] == "gpu_ledger:alloc_count:hour"]
        only_alloc.write_text(yaml.safe_dump(doc))
        _replay(url, only_alloc, REPLAY_FROM, "2026-10-05T08:16:00Z", tmp_path / "early.log")
        _meter(url, raw, "--recorded", "never", "--chunk", "8")
        out = _meter(url, auto, "--chunk", "8")
        rc = main(["--prometheus", url, *DAY_ARGS, "--db", str(tmp_path / "only.duckdb"),
                   "--recorded", "only", "--chunk", "8", "--retries", "0", "-q"])
    n = len(SIGNALS)
    assert ("2026-10-05T00:00Z .. 2026-10-05T08:00Z: recorded hourly series for 1 signal(s), "
            f"raw for the others: hours not recorded for {n - 1} signal(s)") in out, out
    assert "2026-10-05T08:00Z .. 2026-10-05T16:00Z: recorded hourly series\n" in out
    assert f"{2 * n + 1} of {3 * n} signal-chunks from the recorded hourly series" in out
    assert "1 chunk(s) partly recorded" in out
    assert _same_ledger(raw, auto) > 400
    err = capsys.readouterr().err
    assert rc == 5 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "--recorded only: 2026-10-05T00:00Z .. 2026-10-05T08:00Z" in err


def test_a_store_without_the_rules_bills_and_says_as_before(
        samples: list[tuple[str, int]], tmp_path: Path) -> None:
    raw, auto = tmp_path / "raw.duckdb", tmp_path / "auto.duckdb"
    with running_victoria(tmp_path / "vm") as url:
        vm_import(url, _prometheus_text(samples))
        never = _meter(url, raw, "--recorded", "never")
        out = _meter(url, auto)
    assert "recorded" not in out and "marker" not in out
    assert _same_ledger(raw, auto) > 400
    # the same lines but for timings and figures of speed
    assert [line.split(" (")[0] for line in never.splitlines()] == \
        [line.split(" (")[0] for line in out.splitlines()]


def test_prometheus_rules_backfilled_by_promtool_bill_as_the_raw_series(
        samples: list[tuple[str, int]], tmp_path: Path) -> None:
    """The shipped rules (Prometheus dialect) backfilled with `promtool tsdb
    create-blocks-from rules`, evaluated hourly by the group's interval, at the minute the
    group hashes to (PROMTOOL_FROM)."""
    data = tmp_path / "data"
    backfill(_openmetrics(samples), data)
    rules = tmp_path / "metering.yml"
    rules.write_text(yaml.safe_dump({"groups": [metering_group()]}))
    assert yaml.safe_load(rules.read_text())["groups"][0]["name"] == METERING_GROUP
    blocks = tmp_path / "recorded-blocks"
    blocks.mkdir()
    with running_prometheus(data) as url:
        subprocess.run(["promtool", "tsdb", "create-blocks-from", "rules", f"--url={url}",
                        f"--start={PROMTOOL_FROM}", f"--end={PROMTOOL_TO}",
                        f"--output-dir={blocks}", "-q", str(rules)],
                       check=True, capture_output=True, timeout=300)
        raw_out = _meter(url, tmp_path / "raw.duckdb", "--recorded", "never")
    for block in blocks.iterdir():
        shutil.move(str(block), data / block.name)
    with running_prometheus(data) as url:
        rec_out = _meter(url, tmp_path / "recorded.duckdb", "--recorded", "only")
        err = io.StringIO()
        with redirect_stderr(err):  # Prometheus has no /api/v1/export: one line, no ledger
            rc = main(["--prometheus", url, *DAY_ARGS, "--db", str(tmp_path / "x.duckdb"),
                       "--recorded-read", "export", "--retries", "0", "-q"])
    n = len(SIGNALS)
    assert f"{n} of {n} signal-chunks from the recorded hourly series" in rec_out, rec_out
    assert "/api/v1/export" not in rec_out  # range queries on Prometheus
    assert rc != 0 and len(err.getvalue().strip().splitlines()) == 1, err.getvalue()
    assert "--recorded-read export: no VictoriaMetrics /api/v1/export" in err.getvalue()
    assert not (tmp_path / "x.duckdb").exists()
    assert "coverage: 0 duplicate" not in raw_out
    assert _same_ledger(tmp_path / "raw.duckdb", tmp_path / "recorded.duckdb") > 400


def test_recorded_series_that_cannot_stand_for_the_raw_ones_are_not_read(
        samples: list[tuple[str, int]], tmp_path: Path) -> None:
    """An evaluator that had only node-a's series (node-b's arrived from a store without the
    rules): the day is read raw, saying so. Then a second evaluator's up_count marker that
    names the wrong hours (points stamped an hour late): up_count alone is read raw."""
    node_a = [s for s in samples if 'node="node-b"' not in s[0]]
    node_b = [s for s in samples if 'node="node-b"' in s[0]]
    raw, auto, mixed = (tmp_path / f"{n}.duckdb" for n in ("raw", "auto", "mixed"))
    with running_victoria(tmp_path / "vm") as url:
        vm_import(url, _prometheus_text(node_a))
        _replay(url, METERING_VM_FILE, REPLAY_FROM, REPLAY_TO, tmp_path / "replay.log")
        vm_import(url, _prometheus_text(node_b))
        _meter(url, raw, "--recorded", "never")
        out = _meter(url, auto)
        assert "raw series: 1 node(s) with raw series but none recorded (node-b)" in out, out
        assert "signal-chunks from the recorded" not in out
        assert _same_ledger(raw, auto) > 400
        # node-b recorded too now; another evaluator's up_count marker is an hour off
        _replay(url, METERING_VM_FILE, REPLAY_FROM, REPLAY_TO, tmp_path / "replay2.log")
        late = [f'gpu_ledger:up_count:hour{{metering_signal="up_count",replica="2"}} '
                f"{t - 7200} {t * 1000}" for t in range(1791154800, 1791248400 + 1, 3600)]
        vm_import(url, "\n".join(late) + "\n")
        out = _meter(url, mixed)
    n = len(SIGNALS)
    assert (f"recorded hourly series for {n - 1} signal(s), raw for the others: hours not "
            "recorded for 1 signal(s) (up_count)") in out, out
    assert _same_ledger(raw, mixed) > 400


def _raw_then_recorded(samples: list[tuple[str, int]], tmp_path: Path, flag: str,
                       *recorded: str) -> tuple[Path, Path, str]:
    """The day imported, the rules replayed, into VictoriaMetrics run with `flag`; metered
    from the raw series, then with `recorded` (meter's own choice where none): both ledgers
    and the second run's output."""
    raw, rec = tmp_path / "raw.duckdb", tmp_path / "recorded.duckdb"
    with running_victoria(tmp_path / "vm", flag) as url:
        vm_import(url, _prometheus_text(samples))
        _replay(url, METERING_VM_FILE, REPLAY_FROM, REPLAY_TO, tmp_path / "replay.log")
        _meter(url, raw, "--recorded", "never")
        out = _meter(url, rec, *recorded)
    return raw, rec, out


def test_recorded_nodes_listed_family_by_family_under_a_series_limit(
        samples: list[tuple[str, int]], tmp_path: Path) -> None:
    """VictoriaMetrics refuses to list the recorded series' nodes all at once under
    -search.maxUniqueTimeseries=25 (the families hold more together, each fewer): they are
    listed one family at a time, and the day is still read recorded."""
    raw, rec, out = _raw_then_recorded(samples, tmp_path, "-search.maxUniqueTimeseries=25")
    n = len(SIGNALS)
    assert f"{n} of {n} signal-chunks from the recorded hourly series" in out, out
    assert _same_ledger(raw, rec) > 400


def test_an_export_over_the_series_limit_is_split_by_node(
        samples: list[tuple[str, int]], tmp_path: Path) -> None:
    """Under -search.maxExportSeries=7 VictoriaMetrics refuses the export of a signal whose
    series on both nodes are more (HTTP 400, "the number of matching timeseries exceeds 7"):
    the export is split by node as a range query is, and the bill is still the raw one."""
    raw, rec, out = _raw_then_recorded(samples, tmp_path, "-search.maxExportSeries=7",
                                       "--recorded", "only")
    # Every signal-chunk is read by export, or, where the store's adaptive filter order made
    # even a one-node export trip the limit, by range queries over the recorded series.
    n = len(SIGNALS)
    m = re.search(r"; (\d+) of them read by VictoriaMetrics' /api/v1/export", out)
    fell = re.search(r"; (\d+) whose export the store refused even for one node-hour", out)
    assert m is not None, out
    assert int(m[1]) + (int(fell[1]) if fell else 0) == n, out
    assert "refused by the store's limits and split again" in out, out
    assert _same_ledger(raw, rec) > 400


def test_an_export_refused_even_for_one_node_hour_is_read_by_range_queries(
        samples: list[tuple[str, int]], tmp_path: Path) -> None:
    """Under -search.maxExportSeries=1 the store refuses the export of any signal with two
    series on one node, whatever the split: those signal-chunks are read by range queries
    over the same recorded series (another limit), said once, and the bill is the raw one."""
    raw, rec, out = _raw_then_recorded(samples, tmp_path, "-search.maxExportSeries=1",
                                       "--recorded", "only")
    fell = re.search(r"; (\d+) whose export the store refused even for one node-hour, "
                     r"read by range queries", out)
    assert fell is not None and int(fell[1]) > 0, out
    assert "Traceback" not in out
    assert _same_ledger(raw, rec) > 400


class _Proxy(http.server.BaseHTTPRequestHandler):
    """Forwards a GET to VictoriaMetrics (`upstream`), its answer changed by `alter`."""

    upstream = ""

    def alter(self, body: bytes) -> bytes:
        return body

    def do_GET(self) -> None:
        with urllib.request.urlopen(self.upstream + self.path, timeout=60) as r:
            body, status = self.alter(r.read()), r.status
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


class _Cutting(_Proxy):
    """An export answer (not the empty probe's) comes back cut mid-line or with garbage after
    it, with HTTP 200, as a broken proxy would send it."""

    mode = "cut"

    def alter(self, body: bytes) -> bytes:
        if self.path.startswith("/api/v1/export?") and body:
            return body[:len(body) // 2] if self.mode == "cut" else body + b"<html>oops\n"
        return body


@pytest.mark.parametrize("mode", ["cut", "garbage"])
def test_a_bad_export_answer_is_one_line_and_writes_nothing(
        samples: list[tuple[str, int]], tmp_path: Path, mode: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    with running_victoria(tmp_path / "vm") as url:
        vm_import(url, _prometheus_text(samples))
        _replay(url, METERING_VM_FILE, REPLAY_FROM, REPLAY_TO, tmp_path / "replay.log")
        handler = type("H", (_Cutting,), {"upstream": url, "mode": mode})
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            db = tmp_path / "ledger.duckdb"
            rc = main(["--prometheus", f"http://127.0.0.1:{server.server_address[1]}",
                       *DAY_ARGS, "--db", str(db), "--recorded", "only", "--retries", "0",
                       "-q"])
        finally:
            server.shutdown()
            server.server_close()
    err = capsys.readouterr().err
    assert rc != 0 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "/api/v1/export of 'gpu_ledger:" in err, err
    assert not db.exists()


class _Versioned(_Proxy):
    """/metrics says `version` (Debian's build says none); with `damage`, each native export
    answer's first block is of an unknown encoding (7)."""

    version = ""
    damage = False

    def alter(self, body: bytes) -> bytes:
        if self.path == "/metrics":
            body = body.replace(b'short_version=""', f'short_version="{self.version}"'.encode())
        if self.damage and self.path.startswith("/api/v1/export/native?") and len(body) > 16:
            at = 16 + 4 + int.from_bytes(body[16:20], "big") + 4  # the first block
            for _ in range(4):  # its four varints, then the two encoding bytes
                while body[at] >= 0x80:
                    at += 1
                at += 1
            body = body[:at + 1] + b"\x07" + body[at + 2:]
        return body


@pytest.mark.parametrize("version, damage, said", [
    ("v1.79.5", False, ""),
    ("v1.79.5", True, "/api/v1/export/native of 'gpu_ledger:"),
    ("v1.99.0", False, "version v1.99.0 is not one /api/v1/export/native was verified on"),
])
def test_native_reads_on_a_verified_version_else_json_lines_said_once(
        samples: list[tuple[str, int]], tmp_path: Path, version: str, damage: bool,
        said: str) -> None:
    """auto reads VictoriaMetrics' native export where its version is one the decoder was
    verified on; an unknown version, or a block of an encoding it does not know, reads JSON
    lines instead, said in one line; the bill is the raw one either way."""
    raw, rec = tmp_path / "raw.duckdb", tmp_path / "recorded.duckdb"
    with running_victoria(tmp_path / "vm") as url:
        vm_import(url, _prometheus_text(samples))
        _replay(url, METERING_VM_FILE, REPLAY_FROM, REPLAY_TO, tmp_path / "replay.log")
        _meter(url, raw, "--recorded", "never")
        handler = type("H", (_Versioned,), {"upstream": url, "version": version,
                                            "damage": damage})
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            out = _meter(f"http://127.0.0.1:{server.server_address[1]}", rec,
                         "--recorded", "only", "--chunk", "12")
        finally:
            server.shutdown()
            server.server_close()
    fell_back = [ln for ln in out.splitlines() if "recorded series read as JSON lines" in ln]
    if said:
        assert len(fell_back) == 1 and said in fell_back[0], out
    else:
        # Two chunks: each signal's day asked once, both chunks read from it.
        assert not fell_back and "40 as /api/v1/export/native, from 20 request(s) of a " \
            "signal's whole period)" in out, out
    assert "Traceback" not in out
    assert _same_ledger(raw, rec) > 400


def test_a_native_answer_over_the_memory_budget_reads_json_lines(
        samples: list[tuple[str, int]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Native answers hold whole blocks (a month per series), not the hours asked for: one
    over what the planner lets it decode (here: any) is read as JSON lines, which the store
    filters to the hours; the bill is the raw one, and native stays on for the rest."""
    from metering.queryplan import QueryPlanner
    monkeypatch.setattr(QueryPlanner, "max_native_rows", lambda self: 1)
    raw, rec = tmp_path / "raw.duckdb", tmp_path / "recorded.duckdb"
    with running_victoria(tmp_path / "vm") as url:
        vm_import(url, _prometheus_text(samples))
        _replay(url, METERING_VM_FILE, REPLAY_FROM, REPLAY_TO, tmp_path / "replay.log")
        _meter(url, raw, "--recorded", "never")
        out = _meter(url, rec, "--recorded", "only", "--recorded-read", "native")
    # Every signal with samples (three have none here: no answer holds more than 1).
    assert "17 over the memory budget read as JSON lines" in out, out
    assert "recorded series read as JSON lines" not in out, out  # no decoder problem said
    assert _same_ledger(raw, rec) > 400


@pytest.mark.parametrize("short", ["hours", "room"])
def test_a_period_whose_hourly_points_do_not_fit_is_decoded_once_then_json_lines(
        samples: list[tuple[str, int]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        short: str) -> None:
    """A signal's whole-period native answer is decoded at most once. Where its hourly
    points do not fit the memory budget (`hours`: found after decoding; `room`: the samples
    its headers count are over what is left, found before decoding them) the signal reads
    JSON lines (the store filters them to the hours), instead of decoding the period's blocks
    again for each chunk. The bill is the raw one."""
    import metering.queryplan
    decoded: list[int] = []
    decode = vmnative.decode

    def counted(body: bytes, max_rows: int | None = None,
                seen: Labels | None = None) -> vmnative.Blocks:
        decoded.append(len(body))
        return decode(body, max_rows, seen)

    monkeypatch.setattr(vmnative, "decode", counted)
    if short == "hours":
        monkeypatch.setattr(vmnative.Hours, "nbytes", property(lambda self: 1 << 60))
    else:
        monkeypatch.setattr(metering.queryplan, "HOURS_BYTES_PER_POINT", 1 << 60)
    raw, rec = tmp_path / "raw.duckdb", tmp_path / "recorded.duckdb"
    with running_victoria(tmp_path / "vm") as url:
        vm_import(url, _prometheus_text(samples))
        _replay(url, METERING_VM_FILE, REPLAY_FROM, REPLAY_TO, tmp_path / "replay.log")
        _meter(url, raw, "--recorded", "never")
        out = _meter(url, rec, "--recorded", "only", "--recorded-read", "native",
                     "--chunk", "8")
    summary = next(ln for ln in out.splitlines() if ln.startswith("meter: queries:"))
    # Three chunks, 20 signals: each period asked and decoded (or refused) once.
    assert "from 20 request(s) of a signal's whole period" in summary, summary
    assert len(decoded) == 20, decoded
    # `room`: the signals with samples are refused before their samples are decoded
    assert short == "hours" or "over the memory budget read as JSON lines" in summary, summary
    assert "recorded series read as JSON lines" not in out, out  # no decoder problem said
    assert _same_ledger(raw, rec) > 400


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_month_in_node_groups_reads_each_series_month_natively_once(
        samples: list[tuple[str, int]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        jobs: str) -> None:
    """A calendar month whose every signal is recorded and read natively is one chunk (a
    recorded series' month lies in whole blocks, which a native answer holds), fetched in
    node groups within the memory budget (here a small one: several groups), by this process
    or by worker processes over node slices. Each group's month is one native request; the
    month's last evaluation hour, whose samples lie in the next month's blocks, is read as
    JSON lines. The bill is the raw one, fact for fact. A node that left the fleet on the day
    before the month (node-gone: node-a's first ten hours, five days earlier) is listed with
    raw series for the month by VictoriaMetrics' day-granular label lookup, and has no
    recorded ones there: its samples are counted and found outside the month's reads, so the
    month is still read in one chunk."""
    import metering.cli_meter
    monkeypatch.setattr(metering.cli_meter, "memory_budget", lambda: 40 << 20)
    month = ["--month", "2026-10", "--retries", "0", "-v"]
    raw, rec = tmp_path / "raw.duckdb", tmp_path / "recorded.duckdb"
    day0 = min(t for _, t in samples)
    gone = [(head.replace('node="node-a"', 'node="node-gone"'), t - 5 * 86400)
            for head, t in samples if 'node="node-a"' in head and t < day0 + 10 * 3600]
    assert gone
    with running_victoria(tmp_path / "vm") as url:
        vm_import(url, _prometheus_text(samples + gone))
        _replay(url, METERING_VM_FILE, "2026-09-30T23:17:00Z", "2026-11-01T00:59:00Z",
                tmp_path / "replay.log")
        outs = []
        for db, extra in ((raw, ["--recorded", "never"]),
                          (rec, ["--recorded", "only", "--recorded-read", "native"])):
            err = io.StringIO()
            with redirect_stderr(err):
                rc = main(["--prometheus", url, "--db", str(db), "--jobs", jobs, *month,
                           *extra])
            assert rc == 0, err.getvalue()
            outs.append(err.getvalue())
    out = outs[1]
    assert "chunks of 744 h" in out and "the month in one chunk" in out, out
    assert "chunks of 72 h" in outs[0], outs[0]
    summary = next(ln for ln in out.splitlines() if ln.startswith("meter: queries:"))
    groups = re.search(r"; (\d+) node group\(s\)", summary)
    assert groups and int(groups.group(1)) >= 2, summary
    # every signal of every group (and of a worker's slice that fits whole, e.g. node-gone's
    # alone: not counted as a group): its month natively, its last hour apart
    read = re.search(r"(\d+) of them read by VictoriaMetrics' /api/v1/export \((\d+) as "
                     r"/api/v1/export/native\)", summary)
    asked = re.search(r" for (\d+) signal-chunks", summary)
    assert read and asked and read.group(1) == read.group(2) == asked.group(1), summary
    assert int(asked.group(1)) % len(SIGNALS) == 0, summary
    assert int(asked.group(1)) >= int(groups.group(1)) * len(SIGNALS), summary
    assert "x 2 time range(s) per signal" in summary, summary
    assert "Traceback" not in out
    assert _same_ledger(raw, rec) > 400


class _NoCounts(_Proxy):
    """An instant query's answer (the count of nodes' samples) comes back without its result
    list, with HTTP 200."""

    def alter(self, body: bytes) -> bytes:
        if self.path.startswith("/api/v1/query?"):
            return b'{"status":"success","data":{}}'
        return body


def test_nodes_gone_the_day_before_a_chunk_do_not_send_it_raw(
        samples: list[tuple[str, int]], tmp_path: Path) -> None:
    """The fleet's last samples are at 01:00 on 2026-10-06, and the chunk of 10-07 and 10-08
    starts the next midnight. VictoriaMetrics looks label values up by day, so the chunk's raw
    listing (from the hour before it, 10-06 23:00) names both nodes, and the recorded one (from
    10-07) neither. Counting those nodes' raw samples in the chunk's reads finds none: the
    chunk is read recorded, `--recorded only` passes, and the bill is the raw one. Where that
    count cannot be read, the chunk is read raw and says why."""
    four_days = ["--from", "2026-10-05", "--to", "2026-10-09", "--chunk", "48",
                 "--retries", "0", "-v"]
    runs = {name: tmp_path / f"{name}.duckdb" for name in ("raw", "only", "uncounted")}
    outs: dict[str, str] = {}
    with running_victoria(tmp_path / "vm") as url:
        vm_import(url, _prometheus_text(samples))
        _replay(url, METERING_VM_FILE, REPLAY_FROM, "2026-10-09T00:59:00Z",
                tmp_path / "replay.log")
        # the coarse lookup this works around, as the store answers it
        with urllib.request.urlopen(f"{url}/api/v1/label/node/values?match[]=gpu_up"
                                    "&start=1791327600&end=1791331200", timeout=30) as r:
            assert b"node-a" in r.read()  # 10-06 23:00..10-07 00:00: no sample, yet listed
        handler = type("H", (_NoCounts,), {"upstream": url})
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        proxied = f"http://127.0.0.1:{server.server_address[1]}"
        try:
            for name, at, extra in (("raw", url, ["--recorded", "never"]),
                                    ("only", url, ["--recorded", "only"]),
                                    ("uncounted", proxied, [])):
                err = io.StringIO()
                with redirect_stderr(err):
                    rc = main(["--prometheus", at, "--db", str(runs[name]), *four_days,
                               *extra])
                assert rc == 0, err.getvalue()
                outs[name] = err.getvalue()
        finally:
            server.shutdown()
            server.server_close()
    n = len(SIGNALS)
    assert f"{2 * n} of {2 * n} signal-chunks from the recorded" in outs["only"], outs["only"]
    assert ("2026-10-07T00:00Z .. 2026-10-09T00:00Z: raw series: 2 node(s) with raw series "
            "but none recorded (node-a, node-b); their samples not counted (") \
        in outs["uncounted"], outs["uncounted"]
    assert f"{n} of {2 * n} signal-chunks from the recorded" in outs["uncounted"]
    assert _same_ledger(runs["raw"], runs["only"]) > 400
    assert _same_ledger(runs["raw"], runs["uncounted"]) > 400
