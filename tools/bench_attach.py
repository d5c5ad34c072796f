#!/usr/bin/env python3
"""Benchmark of attached application databases (docs/attach.md).

Measures, each figure the median of --repeat runs (3 by default; the application's writes at
least 5), ratios within one run:

* the application's own writes (stdlib ``sqlite3``, WAL, synchronous=FULL, a busy timeout)
  with capture triggers installed vs. the same writes into the same table without syncpack:
  bulk (one transaction of --bulk rows) and one-row transactions (--single of them);
* a pipeline of --rows rows written by the application at site A in transactions of 100k:
  ``syncpack capture`` (rows/s), ``export``, and ``import`` at site B including the writes into
  B's attached table; against it, the same rows as an SQLite session changeset (apsw's session
  extension) applied into the same empty table;
* the peak RSS of the capture and the import at --rows/4 and --rows rows (flat in rows = a
  ratio near 1).

    .venv/bin/python tools/bench_attach.py                 # 1M rows, medians of 3
    .venv/bin/python tools/bench_attach.py --rows 20000 --repeat 1 --json   # a smoke run

syncpack's bytecode is compiled first (machine.compile_syncpack, as ``pip install`` does);
``--no-bytecode`` leaves it out, to measure an editable install run with
``PYTHONDONTWRITEBYTECODE=1``, which compiles every module from source in every command.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import machine

SYNCPACK = str(Path(sys.executable).with_name("syncpack"))
DDL = "CREATE TABLE items(id TEXT PRIMARY KEY, n INTEGER, r REAL, s TEXT, b BLOB)"
TARGETS = {
    "bulk_write_ratio": ("<=", 2.0),
    "single_write_ratio": ("<=", 1.15),
    "capture_rows_per_s": (">=", 300_000),
    "import_vs_changeset_apply": ("<=", 2.5),
}

# The peak RSS of exactly one child: a tiny spawner without site-packages forks it and reports
# its rusage (a child forked from this process would inherit our high-water mark).
_SPAWNER = ("import json, os, subprocess, sys, time\n"
            "t = time.perf_counter()\n"
            "p = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL)\n"
            "_pid, st, ru = os.wait4(p.pid, 0)\n"
            "print(json.dumps({'exit': os.waitstatus_to_exitcode(st), 'maxrss_kb': ru.ru_maxrss,"
            " 'seconds': time.perf_counter() - t, 'cpu': ru.ru_utime + ru.ru_stime}))")


def timed_cmd(*args) -> dict:
    r = subprocess.run([sys.executable, "-S", "-c", _SPAWNER, *map(str, args)],
                       stdout=subprocess.PIPE, check=True, text=True)
    out = json.loads(r.stdout)
    if out["exit"] != 0:
        raise RuntimeError(f"{' '.join(map(str, args))} failed ({out['exit']})")
    return out


def sp(*args) -> str:
    r = subprocess.run([SYNCPACK, *map(str, args)], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"syncpack {' '.join(map(str, args))}: {r.stderr}")
    return r.stdout


def row(i: int) -> tuple:
    return (f"k{i:09d}", i, i / 7, f"text of row {i}", i.to_bytes(8, "big"))


def app_conn(db: Path) -> sqlite3.Connection:
    c = sqlite3.connect(db, timeout=60, isolation_level=None)
    c.execute("PRAGMA journal_mode=WAL")
    c.execute("PRAGMA synchronous=FULL")
    return c


def new_site(root: Path, name: str) -> Path:
    p = root / name
    sp("init", p, "--family", "bench", "--site", name)
    return p


def fresh_db(root: Path, name: str) -> Path:
    db = root / name
    c = app_conn(db)
    c.execute(DDL)
    c.close()
    return db


def write_bulk(db: Path, start: int, n: int, txn: int = 100_000) -> float:
    c = app_conn(db)
    t0 = time.perf_counter()
    for b in range(start, start + n, txn):
        c.execute("BEGIN")
        c.executemany("INSERT INTO items VALUES (?, ?, ?, ?, ?)",
                      (row(i) for i in range(b, min(b + txn, start + n))))
        c.execute("COMMIT")
    s = time.perf_counter() - t0
    c.close()
    return s


def write_single(db: Path, n: int) -> float:
    c = app_conn(db)
    t0 = time.perf_counter()
    for i in range(n):
        c.execute("BEGIN")
        c.execute("INSERT INTO items VALUES (?, ?, ?, ?, ?)", row(i))
        c.execute("COMMIT")
    s = time.perf_counter() - t0
    c.close()
    return s


def app_overhead(root: Path, bulk: int, single: int, repeat: int) -> dict:
    res: dict = {}
    for kind, fn, n in (("bulk", write_bulk, bulk), ("single", write_single, single)):
        plain, captured = [], []
        for k in range(repeat):
            d0 = fresh_db(root, f"plain-{kind}-{k}.db")
            plain.append(fn(d0, 0, n) if kind == "bulk" else fn(d0, n))
            d1 = fresh_db(root, f"cap-{kind}-{k}.db")
            site = new_site(root, f"site-{kind}-{k}")
            sp("--site", site, "attach", d1, "--table", "items")
            captured.append(fn(d1, 0, n) if kind == "bulk" else fn(d1, n))
            shutil.rmtree(site)
            for f in root.glob(f"*-{kind}-{k}.db*"):
                f.unlink()
        p, c = statistics.median(plain), statistics.median(captured)
        res[kind] = {"rows": n, "plain_s": p, "captured_s": c, "ratio": c / p,
                     "plain_rows_per_s": n / p, "captured_rows_per_s": n / c}
    return res


def session_apply(root: Path, rows: int) -> float:
    import apsw
    src = apsw.Connection(str(root / "session-src.db"))
    src.execute("PRAGMA journal_mode=WAL")
    src.execute(DDL)
    s = apsw.Session(src, "main")
    s.attach("items")
    for b in range(0, rows, 100_000):
        with src:
            src.executemany("INSERT INTO items VALUES (?, ?, ?, ?, ?)",
                            (row(i) for i in range(b, min(b + 100_000, rows))))
    cs = s.changeset()
    s.close()
    src.close()
    dst = apsw.Connection(str(root / "session-dst.db"))
    dst.execute("PRAGMA journal_mode=WAL")
    dst.execute("PRAGMA synchronous=FULL")
    dst.execute(DDL)
    t0 = time.perf_counter()
    with dst:
        apsw.Changeset.apply(cs, dst)
    secs = time.perf_counter() - t0
    n = dst.execute("SELECT count(*) FROM items").fetchone()[0]
    dst.close()
    if n != rows:
        raise RuntimeError(f"changeset applied {n} rows, expected {rows}")
    for f in root.glob("session-*"):
        f.unlink()
    return secs


def pipeline(root: Path, rows: int) -> dict:
    """A writes ``rows`` rows, captures, exports; B imports into its attached table."""
    work = Path(tempfile.mkdtemp(dir=root))
    a = new_site(work, "a")
    sp("keygen", work / "b", "--site", "b")
    sp("--site", a, "mkreplica", "export", "--site", "b", "--pubkey",
       work / "b" / "keys" / "site.pub", "--out", work / "seed", "--create-out")
    sp("--site", work / "b", "mkreplica", "import", work / "seed")
    dba, dbb = fresh_db(work, "a.db"), fresh_db(work, "b.db")
    sp("--site", a, "attach", dba, "--table", "items")
    sp("--site", work / "b", "attach", dbb, "--table", "items")
    write_s = write_bulk(dba, 0, rows)
    cap = timed_cmd(SYNCPACK, "--site", a, "capture")
    exp = timed_cmd(SYNCPACK, "--site", a, "export", "--to", "b", "--out", work / "out",
                    "--create-out")
    imp = timed_cmd(SYNCPACK, "--site", work / "b", "import", work / "out")
    c = sqlite3.connect(dbb)
    n = c.execute("SELECT count(*) FROM items").fetchone()[0]
    c.close()
    if n != rows:
        raise RuntimeError(f"B's table holds {n} rows, expected {rows}")
    shutil.rmtree(work)
    return {"rows": rows, "app_write_s": write_s, "capture_s": cap["seconds"],
            "capture_cpu_s": cap["cpu"], "import_cpu_s": imp["cpu"],
            "capture_rss_mb": cap["maxrss_kb"] / 1024, "export_s": exp["seconds"],
            "import_s": imp["seconds"], "import_rss_mb": imp["maxrss_kb"] / 1024}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000,
                    help="rows of the capture/export/import pipeline (default 1,000,000; the "
                         "peak-RSS check also runs a quarter of them)")
    ap.add_argument("--bulk", type=int, default=100_000,
                    help="rows of the one bulk application transaction (default 100,000)")
    ap.add_argument("--single", type=int, default=5_000,
                    help="one-row application transactions (default 5,000)")
    ap.add_argument("--repeat", type=int, default=3,
                    help="runs of each figure; the median is reported (default 3)")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    ap.add_argument("--dir", help="where to work (default: a new temporary directory)")
    ap.add_argument("--no-bytecode", action="store_true",
                    help="do not compile syncpack's bytecode first (each command then compiles "
                         "from source if PYTHONDONTWRITEBYTECODE is set)")
    a = ap.parse_args()
    if not a.no_bytecode:
        machine.compile_syncpack()
    root = Path(tempfile.mkdtemp(dir=a.dir))
    watch = machine.Watch()
    try:
        # At least 5 runs of the application's writes: they are the cheapest figures and the
        # noisiest (each one-row commit waits for the disk; of 2,000 of them, medians of 3
        # gave 0.87x to 1.24x on one quiet day for an overhead of about 7%)
        res: dict = {"app_writes": app_overhead(root, a.bulk, a.single, max(5, a.repeat))}
        runs = [pipeline(root, a.rows) for _ in range(a.repeat)]
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        base = statistics.median(session_apply(root, a.rows) for _ in range(a.repeat))
        med["capture_rows_per_s"] = a.rows / med["capture_s"]
        med["capture_rows_per_cpu_s"] = a.rows / med["capture_cpu_s"]
        med["changeset_apply_s"] = base
        med["import_vs_changeset_apply"] = med["import_s"] / base
        res["pipeline"] = med
        small = pipeline(root, max(1, a.rows // 4))
        res["memory"] = {"rows_small": small["rows"], "rows_large": a.rows,
                         "capture_rss_mb": [small["capture_rss_mb"], med["capture_rss_mb"]],
                         "import_rss_mb": [small["import_rss_mb"], med["import_rss_mb"]],
                         "capture_growth": med["capture_rss_mb"] / small["capture_rss_mb"],
                         "import_growth": med["import_rss_mb"] / small["import_rss_mb"]}
        values = {"bulk_write_ratio": res["app_writes"]["bulk"]["ratio"],
                  "single_write_ratio": res["app_writes"]["single"]["ratio"],
                  "capture_rows_per_s": med["capture_rows_per_s"],
                  "import_vs_changeset_apply": med["import_vs_changeset_apply"]}
        res["targets"] = {k: {"target": f"{op} {lim}", "value": values[k],
                              "met": values[k] <= lim if op == "<=" else values[k] >= lim}
                          for k, (op, lim) in TARGETS.items()}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    res["machine"] = watch.report()
    if a.json:
        print(json.dumps(res, indent=2))
    else:
        w = res["app_writes"]
        print(f"app bulk write ({w['bulk']['rows']:,} rows/txn): plain {w['bulk']['plain_s']:.3f} s,"
              f" captured {w['bulk']['captured_s']:.3f} s, ratio {w['bulk']['ratio']:.2f}x")
        print(f"app one-row txns ({w['single']['rows']:,}): plain {w['single']['plain_s']:.3f} s,"
              f" captured {w['single']['captured_s']:.3f} s, ratio {w['single']['ratio']:.2f}x")
        p = res["pipeline"]
        print(f"pipeline {p['rows']:,} rows: app write {p['app_write_s']:.2f} s, capture "
              f"{p['capture_s']:.2f} s ({p['capture_rows_per_s']:,.0f} rows/s; cpu "
              f"{p['capture_cpu_s']:.2f} s), export "
              f"{p['export_s']:.2f} s, import into B's table {p['import_s']:.2f} s (cpu "
              f"{p['import_cpu_s']:.2f} s); changeset "
              f"apply {p['changeset_apply_s']:.2f} s; import/changeset "
              f"{p['import_vs_changeset_apply']:.2f}x")
        m = res["memory"]
        print(f"peak RSS at {m['rows_small']:,} / {m['rows_large']:,} rows: capture "
              f"{m['capture_rss_mb'][0]:.0f} / {m['capture_rss_mb'][1]:.0f} MB, import "
              f"{m['import_rss_mb'][0]:.0f} / {m['import_rss_mb'][1]:.0f} MB")
        for k, t in res["targets"].items():
            print(f"  {k}: {t['value']:.3f} (target {t['target']}): "
                  f"{'met' if t['met'] else 'NOT met'}")
        print(machine.describe(res["machine"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
