"""What DuckDB holds while one transaction inserts many fact-like rows (why a chunk in node
groups stages each group's facts, metering.facts): N groups of R rows (allocation_hours-like:
strings, doubles, a MAP of pod labels) inserted from Arrow into a ledger file,

- `one`: in one transaction, committed at the end (a chunk's groups before staging);
- `each`: each group committed on its own;
- `staged`: each group committed into a table of schema gl_staging, then moved into the real
  table by one INSERT ... SELECT in one transaction (what ingest does now).

Each mode runs in a process of its own; peak RSS from getrusage.

    python -m bench.tx_memory --groups 8 --rows 600000
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.common import say, table

_CHILD = """
import resource, sys, time
import duckdb, numpy as np, pyarrow as pa
mode, groups, rows, path = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
con = duckdb.connect(path, config={"memory_limit": "1.5GB", "threads": "2"})
con.execute("CREATE TABLE f (hour TIMESTAMP, cluster VARCHAR, node VARCHAR, namespace VARCHAR, "
            "pod VARCHAR, container VARCHAR, uuid VARCHAR, seconds DOUBLE, mem DOUBLE, "
            "util DOUBLE, labels MAP(VARCHAR, VARCHAR))")
into = "f"
if mode == "staged":
    con.execute("CREATE SCHEMA gl_staging")
    con.execute("CREATE TABLE gl_staging.f AS FROM main.f LIMIT 0")
    into = "gl_staging.f"
t0 = time.process_time()
con.execute("BEGIN")
for g in range(groups):
    i = np.arange(rows) + g * rows
    t = pa.table({
        "hour": pa.array((1_790_000_000 + (i % 25) * 3600) * 1_000_000, pa.timestamp("us")),
        "cluster": pa.array(["default"] * rows),
        "node": pa.array([f"node-{x // 200:05d}" for x in i]),
        "namespace": pa.array([f"team-{x % 40}" for x in i]),
        "pod": pa.array([f"pod-{x // 25:08d}-abcdef" for x in i]),
        "container": pa.array(["main"] * rows),
        "uuid": pa.array([f"GPU-{x // 25:08d}-0000-1111-2222-333344445555" for x in i]),
        "seconds": pa.array(np.full(rows, 3600.0)), "mem": pa.array(np.random.rand(rows)),
        "util": pa.array(np.random.rand(rows)),
        "labels": pa.array([[("team", f"t{x % 40}")] for x in i],
                           pa.map_(pa.string(), pa.string()))})
    con.register("t", t)
    con.execute(f"INSERT INTO {into} SELECT * FROM t")
    con.unregister("t")
    del t
    if mode != "one":
        con.execute("COMMIT")
        con.execute("BEGIN")
if mode == "staged":
    con.execute("INSERT INTO f SELECT * FROM gl_staging.f")
    con.execute("DROP SCHEMA gl_staging CASCADE")
con.execute("COMMIT")
n = con.execute("SELECT count(*) FROM f").fetchall()[0][0]
u = resource.getrusage(resource.RUSAGE_SELF)
print(f"ROWS {n} MAXRSS_KIB {u.ru_maxrss} CPU_S {time.process_time() - t0:.2f}")
"""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.tx_memory", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--groups", type=int, default=8)
    p.add_argument("--rows", type=int, default=600_000, help="rows per group")
    args = p.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for mode in ("one", "each", "staged"):
            out = subprocess.run([sys.executable, "-c", _CHILD, mode, str(args.groups),
                                  str(args.rows), str(Path(tmp) / f"{mode}.duckdb")],
                                 capture_output=True, text=True, check=True).stdout
            m = re.search(r"ROWS (\d+) MAXRSS_KIB (\d+) CPU_S ([\d.]+)", out)
            assert m, out
            rows.append([mode, f"{int(m.group(1)):,}", f"{int(m.group(2)) / 1024:,.0f}",
                         m.group(3)])
            say(f"tx_memory: {mode}: {rows[-1][2]} MiB, {rows[-1][3]} CPU-s")
    say(table(["mode", "rows", "peak RSS MiB", "CPU-s"], rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
