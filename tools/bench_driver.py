#!/usr/bin/env python3
"""Store driver benchmark (whether apsw should be the store's driver, measured): the
import path's own inserts through the stdlib ``sqlite3`` module and through ``apsw``, beside a
session changeset apply of the same rows, all in one run.

What is timed is only what SQLite does for an import, not our decode: the rows are built before
the clock starts.  Per op, as ``apply.apply_packet`` writes a plain put (no replaced CSNs):

* one ``versions`` row ``(collection, key, csn, value)`` by ``executemany``, then
* one ``changelog`` row ``(origin, epoch, hlc, seq, collection, key, value, replaced)`` by
  ``executemany`` (``Site.record_ops``), the flush order of ``apply_packet``;

into a store made from ``db.MIGRATIONS`` (the real schema and indexes) with the store's
settings: page_size 16384, WAL, synchronous=FULL, cache_size -16384.  The workload is
``tools/bench``'s: ``--ops`` puts (1,000,000) in transactions of ``--txn-ops`` (10,000), values of
100 characters (50 random 7-bit, 50 repeated) msgpack-encoded, keys ``k000000000``... in one
collection, ops in CSN order.  The baseline is ``tools/bench``'s: an apsw session changeset of
the same rows in a ``records(collection, key, value)`` table, applied to an empty copy.

Each of ``--runs`` rounds (5) measures the three in turn on fresh files; the medians of wall and
CPU (``time.process_time``) seconds are reported, with each driver's ratio to the changeset apply
of the same round (the median of those per-round ratios, so machine drift within the run
cancels).

    PATH=$PWD/.venv/bin:$PATH tools/bench_driver.py                 # 1M ops, 5 runs
    tools/bench_driver.py --ops 20000 --runs 1 --json                 # smoke size
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from syncpack.store import db  # noqa: E402
from syncpack.format import codec
from syncpack.format.csn import pack_csn  # noqa: E402

RANDOM_BYTES = 50
REPEAT = ("syncpack-bench;" * 4)[:50]        # as tools/bench
_SEVEN_BITS = bytes(b & 0x7F for b in range(256))
COLLECTION = "bench"
ORIGIN = bytes.fromhex("0123456789abcdef")
HLC0 = 1_700_000_000_000 << 16
APPLY_BATCH = 20_000                          # apply.APPLY_BATCH: ops per executemany flush
PRAGMAS = ("PRAGMA journal_mode=WAL", "PRAGMA synchronous=FULL", "PRAGMA foreign_keys=OFF",
           "PRAGMA cache_size=-16384")
RECORDS_DDL = ("CREATE TABLE records(collection TEXT, key TEXT, value BLOB, "
               "PRIMARY KEY(collection, key))")


def workload(ops: int, seed: int = 9) -> tuple[list[tuple], list[tuple], list[tuple]]:
    """(versions rows, changelog rows, records rows) for ``ops`` puts in CSN order."""
    import random
    rnd = random.Random(seed)
    blob = rnd.randbytes(RANDOM_BYTES * ops).translate(_SEVEN_BITS).decode("ascii")
    versions, changelog, records = [], [], []
    for i in range(ops):
        key = f"k{i:09d}"
        value = codec.encode_value(blob[RANDOM_BYTES * i:RANDOM_BYTES * (i + 1)] + REPEAT)
        hlc, seq = HLC0 + i, 0
        versions.append((COLLECTION, key, pack_csn(hlc, ORIGIN, seq), value))
        changelog.append((ORIGIN, i + 1, hlc, seq, COLLECTION, key, value, b""))
        records.append((COLLECTION, key, value))
    return versions, changelog, records


def open_sqlite3(path: Path):
    import sqlite3
    conn = sqlite3.connect(str(path), isolation_level=None)
    conn.execute("PRAGMA page_size=16384")     # before the first table and before WAL
    for p in PRAGMAS:
        conn.execute(p)
    for script in db.MIGRATIONS:     # the real schema, every migration step
        conn.executescript(script)
    return conn


def open_apsw(path: Path):
    import apsw
    conn = apsw.Connection(str(path))
    conn.execute("PRAGMA page_size=16384")
    for p in PRAGMAS:
        conn.execute(p)
    for script in db.MIGRATIONS:
        conn.execute(script)            # apsw runs every statement of a script
    return conn


def insert_import_rows(conn, versions: list[tuple], changelog: list[tuple], txn_ops: int) -> None:
    """apply_packet's inserts: per transaction, flushes of up to APPLY_BATCH ops, each the
    versions rows then the changelog rows; explicit BEGIN IMMEDIATE/COMMIT as db.write_txn."""
    n = len(versions)
    step = txn_ops or n
    for t0 in range(0, n, step):
        t1 = min(n, t0 + step)
        conn.execute("BEGIN IMMEDIATE")
        for b0 in range(t0, t1, APPLY_BATCH):
            b1 = min(t1, b0 + APPLY_BATCH)
            conn.executemany("INSERT INTO versions VALUES (?, ?, ?, ?)", versions[b0:b1])
            conn.executemany("INSERT INTO changelog VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                             changelog[b0:b1])
        conn.execute("COMMIT")


def make_changeset(path: Path, records: list[tuple], txn_ops: int) -> bytes:
    import apsw
    src = apsw.Connection(str(path))
    for p in PRAGMAS[:2]:
        src.execute(p)
    src.execute(RECORDS_DDL)
    session = apsw.Session(src, "main")
    session.attach("records")
    step = txn_ops or len(records)
    for b0 in range(0, len(records), step):
        with src:
            src.executemany("INSERT INTO records VALUES (?, ?, ?)", records[b0:b0 + step])
    cs = session.changeset()
    session.close()
    src.close()
    return cs


def timed(fn) -> tuple[float, float]:
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - t0, time.process_time() - c0


def count(conn, table: str) -> int:
    return conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]


def one_round(root: Path, changeset: bytes, versions, changelog, txn_ops: int) -> dict:
    import apsw
    out = {}
    d = root / "round"
    d.mkdir()
    # The baseline exactly as tools/bench: WAL, synchronous=FULL, one transaction.
    dst = apsw.Connection(str(d / "copy.db"))
    for p in PRAGMAS[:2]:
        dst.execute(p)
    dst.execute(RECORDS_DDL)

    def apply_cs():
        with dst:
            apsw.Changeset.apply(changeset, dst)
    out["changeset_apply"] = timed(apply_cs)
    if count(dst, "records") != len(versions):
        raise RuntimeError("changeset applied the wrong number of rows")
    dst.close()
    for name, opener in (("sqlite3", open_sqlite3), ("apsw", open_apsw)):
        conn = opener(d / f"{name}.db")
        out[name] = timed(lambda: insert_import_rows(conn, versions, changelog, txn_ops))
        if count(conn, "versions") != len(versions) or count(conn, "changelog") != len(versions):
            raise RuntimeError(f"{name}: wrong number of rows inserted")
        conn.close()
    shutil.rmtree(d)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", type=int, default=1_000_000)
    ap.add_argument("--txn-ops", type=int, default=10_000,
                    help="ops per transaction (0: one transaction, as one imported packet)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--dir", type=Path, default=None, help="where the databases go (a temp dir)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if a.ops < 1 or a.runs < 1 or a.txn_ops < 0:
        ap.error("--ops and --runs must be >= 1, --txn-ops >= 0")
    import apsw
    import sqlite3
    root = Path(tempfile.mkdtemp(prefix="bench_driver-", dir=a.dir))
    try:
        versions, changelog, records = workload(a.ops)
        changeset = make_changeset(root / "source.db", records, a.txn_ops)
        rounds = [one_round(root, changeset, versions, changelog, a.txn_ops)
                  for _ in range(a.runs)]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    med = statistics.median
    res: dict = {
        "ops": a.ops, "txn_ops": a.txn_ops, "runs": a.runs, "loadavg": os.getloadavg(),
        "sqlite3_lib": sqlite3.sqlite_version, "apsw": apsw.apsw_version(),
        "apsw_lib": apsw.sqlite_lib_version(), "median": {}, "ratio_to_changeset_apply": {},
    }
    for name in ("changeset_apply", "sqlite3", "apsw"):
        wall = med(r[name][0] for r in rounds)
        cpu = med(r[name][1] for r in rounds)
        res["median"][name] = {"wall_s": wall, "cpu_s": cpu, "ops_per_s": a.ops / wall}
    for name in ("sqlite3", "apsw"):
        res["ratio_to_changeset_apply"][name] = {
            "wall": med(r[name][0] / r["changeset_apply"][0] for r in rounds),
            "cpu": med(r[name][1] / r["changeset_apply"][1] for r in rounds)}
    res["apsw_vs_sqlite3"] = {
        "wall": med(r["apsw"][0] / r["sqlite3"][0] for r in rounds),
        "cpu": med(r["apsw"][1] / r["sqlite3"][1] for r in rounds)}
    res["rounds"] = rounds
    if a.json:
        print(json.dumps(res, indent=2))
        return 0
    txn = f"{a.txn_ops:,}" if a.txn_ops else "all"
    print(f"{a.ops:,} ops, transactions of {txn}, medians of {a.runs} runs; sqlite3 module on "
          f"SQLite {res['sqlite3_lib']}, apsw {res['apsw']}")
    print(f"{'':28}{'wall s':>9}{'cpu s':>9}{'ops/s':>12}{'x apply wall':>14}{'x apply cpu':>13}")
    for name, label in (("changeset_apply", "session changeset apply"),
                        ("sqlite3", "import rows via sqlite3"), ("apsw", "import rows via apsw")):
        m = res["median"][name]
        r = res["ratio_to_changeset_apply"].get(name, {"wall": 1.0, "cpu": 1.0})
        print(f"{label:28}{m['wall_s']:9.2f}{m['cpu_s']:9.2f}{m['ops_per_s']:12,.0f}"
              f"{r['wall']:13.2f}x{r['cpu']:12.2f}x")
    s = res["apsw_vs_sqlite3"]
    print(f"apsw / sqlite3: {s['wall']:.2f}x wall, {s['cpu']:.2f}x cpu; "
          f"load average {res['loadavg'][0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
