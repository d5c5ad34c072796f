#!/usr/bin/env python3
"""Benchmark local writes through the Python API.

Creates a fresh site in a temporary directory, writes ``--ops`` puts (values of about
``--value-size`` bytes) in transactions of ``--batch`` puts each, and prints the write rate,
the elapsed time and the size of the store on disk.

    python tools/bench_api.py                      # 1,000,000 puts, 10,000 per transaction
    python tools/bench_api.py --ops 100000 --batch 1000 --json
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from syncpack.site import Site
from syncpack.store.db import DB_NAME


def dir_size(p: Path) -> int:
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())


def make_value(i: int, size: int) -> dict:
    # a small record whose msgpack encoding is about `size` bytes
    pad = max(0, size - 36)
    return {"id": i, "name": f"part-{i:08d}", "qty": i % 1000, "note": "x" * pad}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", type=int, default=1_000_000, help="puts to write (default 1000000)")
    ap.add_argument("--batch", type=int, default=10_000, help="puts per transaction (default 10000)")
    ap.add_argument("--value-size", type=int, default=100, help="approximate value bytes (100)")
    ap.add_argument("--collections", type=int, default=1, help="spread keys over N collections")
    ap.add_argument("--dir", help="parent directory for the temporary site (default: $TMPDIR)")
    ap.add_argument("--keep", action="store_true", help="keep the site directory afterwards")
    ap.add_argument("--json", action="store_true", help="print the figures as one JSON document")
    a = ap.parse_args(argv)
    if a.ops < 1 or a.batch < 1:
        ap.error("--ops and --batch must be at least 1")

    root = Path(tempfile.mkdtemp(prefix="syncpack-bench-", dir=a.dir))
    path = root / "site"
    try:
        Site.init_family(path, "bench", "bench").close()
        values = [make_value(i, a.value_size) for i in range(min(a.batch, a.ops))]
        from syncpack.format import codec
        value_bytes = len(codec.encode_value(values[0]))
        with Site.open(path) as s:
            done = 0
            t0 = time.perf_counter()
            while done < a.ops:
                n = min(a.batch, a.ops - done)
                with s.transaction() as tx:
                    for j in range(n):
                        i = done + j
                        v = values[j]
                        v["id"] = i
                        tx.put(f"c{i % a.collections}", f"k{i:09d}", v)
                done += n
                if not a.json and sys.stderr.isatty():
                    print(f"\r{done:,}/{a.ops:,}", end="", file=sys.stderr, flush=True)
            elapsed = time.perf_counter() - t0
            if not a.json and sys.stderr.isatty():
                print(file=sys.stderr)
            changelog = s.conn.execute("SELECT count(*) FROM changelog").fetchone()[0]
            s.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        db_bytes = (path / DB_NAME).stat().st_size
        total_bytes = dir_size(path)
        figures = {
            "ops": a.ops, "batch": a.batch, "transactions": -(-a.ops // a.batch),
            "value_bytes": value_bytes, "elapsed_s": round(elapsed, 3),
            "ops_per_s": round(a.ops / elapsed), "changelog_ops": changelog,
            "store_bytes": db_bytes, "site_dir_bytes": total_bytes,
            "bytes_per_op": round(db_bytes / a.ops, 1),
        }
        if a.json:
            print(json.dumps(figures, indent=2))
        else:
            print(f"puts:          {a.ops:,} in {figures['transactions']:,} transactions "
                  f"of {a.batch:,} (values ~{value_bytes} bytes msgpack)")
            print(f"elapsed:       {elapsed:.2f} s")
            print(f"rate:          {figures['ops_per_s']:,} ops/s")
            print(f"store size:    {db_bytes / 1e6:.1f} MB ({figures['bytes_per_op']} bytes/op, "
                  f"site dir {total_bytes / 1e6:.1f} MB)")
            if a.keep:
                print(f"site:          {path}")
        return 0
    finally:
        if not a.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
