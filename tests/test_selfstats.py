"""The standard process_* self-metrics, read from /proc (a temp tree and the real one)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from exporter.selfstats import ProcessStats, read_process_stats
from tests.exporter_helpers import make_sampler, values


def fake_proc(root: Path, *, utime: int, stime: int, start: int, rss_pages: int, fds: int,
              btime: int) -> None:
    me = root / "4242"
    (me / "fd").mkdir(parents=True)
    for i in range(fds):
        (me / "fd" / str(i)).write_text("")
    # The command name may hold spaces and parentheses: fields are counted after the last ")".
    rest = ["S", "1", "1", "1", "0", "-1", "0", "0", "0", "0", "0", str(utime), str(stime),
            "0", "0", "20", "0", "4", "0", str(start), "1000", str(rss_pages)]
    (me / "stat").write_text(f"4242 (gpu) ledger) x) {' '.join(rest)} 0 0\n")
    (root / "stat").write_text(f"cpu  1 2 3\nbtime {btime}\nprocesses 9\n")


def test_reads_a_proc_tree(tmp_path: Path) -> None:
    tick = os.sysconf("SC_CLK_TCK")
    page = os.sysconf("SC_PAGE_SIZE")
    fake_proc(tmp_path, utime=3 * tick, stime=tick, start=50 * tick, rss_pages=1000, fds=7,
              btime=1_700_000_000)
    got = read_process_stats(str(tmp_path), "4242")
    assert got == ProcessStats(1000.0 * page, 4.0, 7.0, 1_700_000_050.0)


def test_missing_proc_leaves_values_out(tmp_path: Path) -> None:
    assert read_process_stats(str(tmp_path / "absent"), "4242") == ProcessStats()


def test_sampler_serves_the_real_process_figures() -> None:
    sampler, _, _ = make_sampler()
    body = sampler.cycle().body(False, False)
    [rss] = values(body, "process_resident_memory_bytes")
    [start] = values(body, "process_start_time_seconds")
    [fds] = values(body, "process_open_fds")
    [cpu] = values(body, "process_cpu_seconds_total")
    assert 1 << 20 < rss < 4 << 30
    assert time.time() - 24 * 3600 < start <= time.time() + 1
    assert fds >= 3 and cpu > 0
