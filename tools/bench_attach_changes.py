#!/usr/bin/env python3
"""Benchmark of changes to rows an attached table already holds: updates and deletes, under
each policy (docs/attach.md).  ``bench_attach.py`` measures new rows; here the application at
site A updates every row of a table B holds too (one column, ``n = n + 1``) and then deletes
every row, each in one application transaction, and the figures are ``syncpack capture`` at A
and ``import`` at B (which writes B's table, holding the application's write lock meanwhile),
the medians of --repeat runs.

    .venv/bin/python tools/bench_attach_changes.py                  # 100k rows, lww and merge
    .venv/bin/python tools/bench_attach_changes.py --rows 10000 --repeat 1 --json

syncpack's bytecode is compiled first (machine.compile_syncpack, as ``pip install`` does).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sqlite3
import statistics
import tempfile
from pathlib import Path

import machine
from bench_attach import DDL, SYNCPACK, app_conn, row, sp, timed_cmd

CHANGES = {"update": "UPDATE items SET n = n + 1", "delete": "DELETE FROM items"}


def family(work: Path, policy: str, rows: int) -> tuple[Path, Path, Path, Path]:
    """Sites a and b, each with its own application file holding the same ``rows`` rows,
    attached (b's filled by an import of a's); the collection under ``policy``."""
    a, b = work / "a", work / "b"
    sp("init", a, "--family", "bench", "--site", "a")
    sp("--site", a, "collection", "create", "items", "--policy", policy)
    sp("keygen", b, "--site", "b")
    sp("--site", a, "mkreplica", "export", "--site", "b", "--pubkey", b / "keys" / "site.pub",
       "--out", work / "seed", "--create-out")
    sp("--site", b, "mkreplica", "import", work / "seed")
    dbs = []
    for name in ("a.db", "b.db"):
        c = app_conn(work / name)
        c.execute(DDL)
        c.close()
        dbs.append(work / name)
    c = app_conn(dbs[0])
    c.execute("BEGIN")
    c.executemany("INSERT INTO items VALUES (?, ?, ?, ?, ?)", (row(i) for i in range(rows)))
    c.execute("COMMIT")
    c.close()
    sp("--site", a, "attach", dbs[0], "--table", "items")
    sp("--site", b, "attach", dbs[1], "--table", "items")
    sp("--site", a, "export", "--to", "b", "--out", work / "first", "--create-out")
    sp("--site", b, "import", work / "first")
    return a, b, dbs[0], dbs[1]


def one_run(root: Path, policy: str, rows: int) -> dict:
    work = Path(tempfile.mkdtemp(dir=root))
    a, b, dba, dbb = family(work, policy, rows)
    out = {}
    for kind, sql in CHANGES.items():
        c = app_conn(dba)
        c.execute("BEGIN")
        c.execute(sql)
        c.execute("COMMIT")
        c.close()
        cap = timed_cmd(SYNCPACK, "--site", a, "capture")
        sp("--site", a, "export", "--to", "b", "--out", work / kind, "--create-out")
        imp = timed_cmd(SYNCPACK, "--site", b, "import", work / kind)
        c = sqlite3.connect(dbb)
        got = c.execute("SELECT count(*), total(n) FROM items").fetchone()
        c.close()
        want = (rows, sum(i + 1 for i in range(rows))) if kind == "update" else (0, 0)
        if got != want:
            raise RuntimeError(f"{policy} {kind}: B's table holds {got}, expected {want}")
        out[kind] = {"capture_s": cap["seconds"], "import_s": imp["seconds"]}
    shutil.rmtree(work)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=100_000, help="rows changed (default 100,000)")
    ap.add_argument("--repeat", type=int, default=3, help="runs; medians reported (default 3)")
    ap.add_argument("--policy", action="append", choices=("lww", "merge", "priority"),
                    help="policies to measure (repeatable; default lww and merge)")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    ap.add_argument("--dir", help="where to work (default: a new temporary directory)")
    a = ap.parse_args()
    if a.rows < 1 or a.repeat < 1:
        ap.error("--rows and --repeat must be at least 1")
    machine.compile_syncpack()
    root = Path(tempfile.mkdtemp(dir=a.dir))
    watch = machine.Watch()
    res: dict = {"rows": a.rows, "policies": {}}
    try:
        for policy in a.policy or ["lww", "merge"]:
            runs = [one_run(root, policy, a.rows) for _ in range(a.repeat)]
            res["policies"][policy] = {
                kind: {k: statistics.median(r[kind][k] for r in runs) for k in runs[0][kind]}
                for kind in CHANGES}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    res["machine"] = watch.report()
    if a.json:
        print(json.dumps(res, indent=2))
        return 0
    for policy, kinds in res["policies"].items():
        for kind, f in kinds.items():
            print(f"{policy:5} {kind} of {a.rows:,} rows: capture {f['capture_s']:.2f} s "
                  f"({a.rows / f['capture_s']:,.0f} rows/s), import into B's table "
                  f"{f['import_s']:.2f} s ({a.rows / f['import_s']:,.0f} rows/s)")
    print(machine.describe(res["machine"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
