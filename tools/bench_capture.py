#!/usr/bin/env python3
"""Benchmark of one attached table's capture alone (docs/attach.md "Speed").

Builds, once, what ``tools/bench_attach.py`` builds for its pipeline (a site with one attached
table of five columns, --rows rows written by the application in transactions of 100k), then
captures a fresh copy of it --repeat times, each in a new process, and prints the medians of
wall and CPU seconds, rows/s and the peak RSS of that process (CPU of the process and of its
reader process added, the larger peak RSS of the two): the capture itself, without the
command's start-up or the export.  ``--python-path DIR`` puts DIR first on the captures' path,
DIR holding another version's ``syncpack`` package (``git archive REV syncpack | tar -x -C
DIR``): a before/after comparison in one session.

    .venv/bin/python tools/bench_capture.py --rows 200000 --repeat 3
    .venv/bin/python tools/bench_capture.py --rows 1000000 --repeat 1 --json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_attach as ba  # noqa: E402  (its set-up: sites, tables, rows)

_CAPTURE = r"""
import json, resource, sys, time
from pathlib import Path
from syncpack.attach import core
from syncpack.site import Site
from syncpack.store import attached
site_dir, db = Path(sys.argv[1]), sys.argv[2]
site = Site.open(site_dir)
with site.write_txn() as c:     # the copy's own application file
    path, seq = attached.attachment(c)
    attached.set_attachment(c, db, seq)
def cpu():     # this process and its reader process (attach/reader.py), once waited for
    return sum(resource.getrusage(w).ru_utime + resource.getrusage(w).ru_stime
               for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
t0, c0 = time.perf_counter(), cpu()
doc = core.capture(site)
print(json.dumps({"rows": doc["captured"], "wall_s": time.perf_counter() - t0,
                  "cpu_s": cpu() - c0,
                  "rss_mb": max(resource.getrusage(w).ru_maxrss for w in (
                      resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)) / 1024}))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--python-path", help="a checkout whose syncpack package goes first")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--dir", help="where to work (default: a new temporary directory)")
    a = ap.parse_args()
    root = Path(tempfile.mkdtemp(dir=a.dir))
    env = dict(os.environ)
    if a.python_path:
        env["PYTHONPATH"] = str(Path(a.python_path).resolve())
    try:
        tmpl = root / "template"
        tmpl.mkdir()
        site = ba.new_site(tmpl, "a")
        db = ba.fresh_db(tmpl, "a.db")
        ba.sp("--site", site, "attach", db, "--table", "items")
        ba.write_bulk(db, 0, a.rows)
        runs = []
        for i in range(a.repeat):
            work = root / f"run{i}"
            shutil.copytree(tmpl, work)
            # Run from the copy: "python -c" puts the working directory first on the path,
            # so from the repository's root it imported that syncpack whatever --python-path
            # said.
            r = subprocess.run([sys.executable, "-c", _CAPTURE, str(work / "a"),
                                str(work / "a.db")], env=env, check=True,
                               capture_output=True, text=True, cwd=work)
            runs.append(json.loads(r.stdout))
            shutil.rmtree(work)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    med = {k: statistics.median(r[k] for r in runs) for k in ("wall_s", "cpu_s", "rss_mb")}
    med["rows"] = runs[0]["rows"]
    med["rows_per_s"] = med["rows"] / med["wall_s"]
    med["rows_per_cpu_s"] = med["rows"] / med["cpu_s"]
    if a.json:
        print(json.dumps(med, indent=2))
    else:
        print(f"capture of {med['rows']:,} rows: {med['wall_s']:.2f} s wall "
              f"({med['rows_per_s']:,.0f} rows/s), {med['cpu_s']:.2f} s CPU "
              f"({med['rows_per_cpu_s']:,.0f} rows/CPU s), peak RSS {med['rss_mb']:.0f} MB "
              f"(medians of {a.repeat})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
