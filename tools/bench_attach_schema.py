#!/usr/bin/env python3
"""What noticing schema changes costs a capture (docs/attach.md "Schema changes").

In one process, a site with --tables attached tables; the application commits one row into one
of them, then the site captures (``attach.core.sync_app``: review, capture, follow, apply).
Timed with the schema review and follow as they are, and with both replaced by no-ops, in
alternating rounds; medians of --repeat captures each, the ratio within one run.

    .venv/bin/python tools/bench_attach_schema.py                  # 5 tables, medians of 200
    .venv/bin/python tools/bench_attach_schema.py --tables 20 --repeat 100
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from syncpack.attach import core, schema

SYNCPACK = str(Path(sys.executable).with_name("syncpack"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tables", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=200)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        site_dir, db = root / "a", root / "app.db"
        subprocess.run([SYNCPACK, "init", site_dir, "--family", "f", "--site", "a"], check=True,
                       stdout=subprocess.DEVNULL)
        c = sqlite3.connect(db, isolation_level=None, timeout=30)
        c.execute("PRAGMA journal_mode=WAL")
        names = [f"t{i}" for i in range(args.tables)]
        for n in names:
            c.execute(f"CREATE TABLE {n}(id INTEGER PRIMARY KEY, a TEXT, b REAL, c BLOB)")
        subprocess.run([SYNCPACK, "--site", site_dir, "attach", db,
                        *[x for n in names for x in ("--table", n)]], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        from syncpack.site import Site
        site = Site.open(site_dir)
        real = (schema.review, schema.follow)
        off = (lambda _s, _a, infos, _back=(): infos, lambda _s, _a, infos, _r: (infos, []))
        times: dict[str, list[float]] = {"with_review": [], "without_review": []}
        k = 0
        for i in range(args.repeat * 2):
            label, fns = (("with_review", real) if i % 2 == 0 else ("without_review", off))
            schema.review, schema.follow = fns
            k += 1
            c.execute(f"INSERT INTO {names[k % len(names)]} VALUES (?, 'x', 1.5, x'00')", (k,))
            t = time.perf_counter()
            core.sync_app(site)
            times[label].append(time.perf_counter() - t)
        schema.review, schema.follow = real
        site.close()
        med = {k: statistics.median(v) for k, v in times.items()}
        print(json.dumps({"tables": args.tables, "repeat": args.repeat,
                          "capture_ms_with_review": round(med["with_review"] * 1000, 3),
                          "capture_ms_without_review": round(med["without_review"] * 1000, 3),
                          "ratio": round(med["with_review"] / med["without_review"], 3)},
                         indent=2))


if __name__ == "__main__":
    main()
