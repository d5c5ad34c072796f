#!/usr/bin/env python3
"""The Blocks issue's figures, measured the way a user meets them: through the `syncpack`
command (process start included), beside SQLite's session extension in the same run.

Two workloads, each exported by a hub to one peer and imported there:

* bulk: ``--bulk-ops`` puts (default 1,000,000) in one ``syncpack load``; each value 100
  characters, 50 random hex and 50 repeated; keys ``key000000000``...
* small: ``--small-ops`` transactions (default 100,000) of one put each, through the Python API.

The baseline is a session patchset of the same rows (collection, key, value) applied to an empty
table with ``apsw``; we report import and export time over its apply time, and packet bytes over
its zstd-3 size.  A relay figure follows: the hub, with 8 peers, writes the bulk load's packets
for all of them in one ``export --all`` (ops/s over all packets).  Every figure is the median of
``--runs`` runs; absolute numbers are printed beside the ratios.

    python tools/bench_cli.py                       # the issue's sizes, one run
    python tools/bench_cli.py --runs 3              # medians of three
    python tools/bench_cli.py --bulk-ops 20000 --small-ops 2000 --peers 2   # a smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from syncpack.site import Site  # noqa: E402

COLLECTION = "bench"
REPEATED = ("syncpack" * 7)[:50]


def value_of(rnd: random.Random) -> str:
    return rnd.randbytes(25).hex() + REPEATED


def key_of(i: int) -> str:
    return f"key{i:09d}"


def sp(*args, site: Path | None = None, check: bool = True) -> float:
    """Run the syncpack command; returns wall seconds (process start included)."""
    argv = [sys.executable, "-m", "syncpack"] + (["--site", str(site)] if site else []) + \
        [str(a) for a in args]
    t0 = time.perf_counter()
    r = subprocess.run(argv, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({r.returncode}):\n{r.stderr}")
    return dt


def family(root: Path, peers: list[str]) -> Path:
    hub = root / "hub"
    sp("init", hub, "--family", "bench", "--site", "hub")
    for p in peers:
        sp("keygen", root / p, "--site", p)
        out = root / f"seed-{p}"
        sp("mkreplica", "export", "--site", p, "--pubkey", root / p / "keys" / "site.pub",
           "--out", out, "--create-out", site=hub)
        sp("mkreplica", "import", out, site=root / p)
    return hub


def packet_bytes(d: Path) -> int:
    return sum(f.stat().st_size for f in d.rglob("*.spk"))


def baseline(root: Path, rows: list[tuple[str, str, str]]) -> dict:
    """Session extension: the rows inserted under a session, the patchset applied to an empty
    copy of the table; sizes raw and zstd-3."""
    import apsw
    import zstandard
    src = apsw.Connection(str(root / "src.db"))
    src.execute("CREATE TABLE records(collection TEXT, key TEXT, value TEXT, "
                "PRIMARY KEY(collection, key))")
    session = apsw.Session(src, "main")
    session.attach("records")
    with src:
        src.executemany("INSERT INTO records VALUES (?, ?, ?)", rows)
    patchset = session.patchset()
    changeset = session.changeset()
    session.close()
    src.close()
    dst = apsw.Connection(str(root / "dst.db"))
    dst.execute("PRAGMA journal_mode=WAL")
    dst.execute("PRAGMA synchronous=FULL")
    dst.execute("CREATE TABLE records(collection TEXT, key TEXT, value TEXT, "
                "PRIMARY KEY(collection, key))")
    t0 = time.perf_counter()
    with dst:
        apsw.Changeset.apply(changeset, dst)
    apply_s = time.perf_counter() - t0
    dst.close()
    for f in ("src.db", "dst.db", "dst.db-wal", "dst.db-shm"):
        (root / f).unlink(missing_ok=True)
    return {"apply_s": apply_s, "patchset_bytes": len(patchset),
            "patchset_zstd3_bytes": len(zstandard.ZstdCompressor(level=3).compress(patchset))}


def bulk_run(root: Path, ops: int, peers: int, rnd: random.Random) -> dict:
    names = [f"p{i}" for i in range(peers)]
    hub = family(root, names)
    lines = root / "load.jsonl"
    rows = []
    with open(lines, "w") as f:
        for i in range(ops):
            v = value_of(rnd)
            rows.append((COLLECTION, key_of(i), json.dumps(v)))
            f.write(json.dumps({"collection": COLLECTION, "key": key_of(i), "value": v}) + "\n")
    load_s = sp("load", lines, site=hub)
    out = root / "one"
    out.mkdir()
    export_s = sp("export", "--to", names[0], "--out", out, site=hub)
    size = packet_bytes(out)
    import_s = sp("import", out / names[0], site=root / names[0])
    relay = root / "all"
    relay.mkdir()
    relay_s = sp("export", "--all", "--out", relay, site=hub)
    relay_ops = ops * (peers - 1)        # p0 already holds the load
    base = baseline(root, rows)
    return {"ops": ops, "load_s": load_s, "export_s": export_s, "import_s": import_s,
            "packet_bytes": size, "relay_s": relay_s, "relay_ops": relay_ops, **base}


def small_run(root: Path, ops: int, rnd: random.Random) -> dict:
    hub = family(root, ["p0"])
    rows = []
    with Site.open(hub) as s:
        for i in range(ops):
            v = value_of(rnd)
            with s.transaction() as tx:
                tx.put(COLLECTION, key_of(i), v)
            rows.append((COLLECTION, key_of(i), json.dumps(v)))
    out = root / "one"
    out.mkdir()
    export_s = sp("export", "--to", "p0", "--out", out, site=hub)
    size = packet_bytes(out)
    import_s = sp("import", out / "p0", site=root / "p0")
    base = baseline(root, rows)
    return {"ops": ops, "export_s": export_s, "import_s": import_s, "packet_bytes": size,
            **base}


def med(runs: list[dict], k: str) -> float:
    return statistics.median(r[k] for r in runs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bulk-ops", type=int, default=1_000_000)
    ap.add_argument("--small-ops", type=int, default=100_000)
    ap.add_argument("--peers", type=int, default=8)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--seed", type=int, default=13)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    rnd = random.Random(a.seed)
    bulk, small = [], []
    load0 = os.getloadavg()[0]
    for i in range(a.runs):
        with tempfile.TemporaryDirectory() as t:
            bulk.append(bulk_run(Path(t), a.bulk_ops, a.peers, rnd))
        with tempfile.TemporaryDirectory() as t:
            small.append(small_run(Path(t), a.small_ops, rnd))
    b = {k: med(bulk, k) for k in bulk[0]}
    s = {k: med(small, k) for k in small[0]}
    res = {
        "runs": a.runs, "load_average": [load0, os.getloadavg()[0]],
        "bulk": b, "small": s,
        "ratios": {
            "bulk_import_vs_apply": b["import_s"] / b["apply_s"],
            "bulk_export_vs_apply": b["export_s"] / b["apply_s"],
            "bulk_packet_vs_patchset_zstd3": b["packet_bytes"] / b["patchset_zstd3_bytes"],
            "small_import_vs_apply": s["import_s"] / s["apply_s"],
        },
        "relay_ops_per_s": b["relay_ops"] / b["relay_s"],
    }
    if a.json:
        print(json.dumps(res, indent=2))
        return 0
    r = res["ratios"]
    print(f"medians of {a.runs} run(s); load average {load0:.2f} -> {os.getloadavg()[0]:.2f}")
    print(f"{'figure':44} {'ratio':>8}  {'syncpack':>24}  {'baseline':>24}  target")
    print(f"{'bulk import / changeset apply':44} {r['bulk_import_vs_apply']:7.2f}x  "
          f"{b['import_s']:8.2f} s {b['ops'] / b['import_s']:>9,.0f} op/s  "
          f"{b['apply_s']:8.2f} s apply         <= 2.0x")
    print(f"{'bulk export / changeset apply':44} {r['bulk_export_vs_apply']:7.2f}x  "
          f"{b['export_s']:8.2f} s {b['ops'] / b['export_s']:>9,.0f} op/s  "
          f"{b['apply_s']:8.2f} s apply         <= 1.0x")
    print(f"{'bulk packet bytes / zstd-3 patchset bytes':44} "
          f"{r['bulk_packet_vs_patchset_zstd3']:7.3f}x  "
          f"{b['packet_bytes'] / b['ops']:13.2f} B/op  "
          f"{b['patchset_zstd3_bytes'] / b['ops']:13.2f} B/row         <= 0.90x")
    print(f"{'small import / changeset apply':44} {r['small_import_vs_apply']:7.2f}x  "
          f"{s['import_s']:8.2f} s {s['ops'] / s['import_s']:>9,.0f} op/s  "
          f"{s['apply_s']:8.2f} s apply         <= 3.0x")
    print(f"relay: hub -> {a.peers - 1} peers, {b['relay_ops']:,} ops in {b['relay_s']:.2f} s = "
          f"{res['relay_ops_per_s']:,.0f} ops/s (target >= 1,000,000)")
    print(f"bulk load through 'syncpack load': {b['load_s']:.2f} s "
          f"({b['ops'] / b['load_s']:,.0f} ops/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
