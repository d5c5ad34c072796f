#!/usr/bin/env python3
"""The packet figures, measured the way a user meets them: through the `syncpack`
command (process start included), beside SQLite's session extension in the same run.

Two workloads, each exported by a hub to one peer (p0) and imported there:

* bulk: ``--bulk-ops`` puts (default 1,000,000) in one ``syncpack load``; each value 100
  characters, 50 random hex and 50 repeated; keys ``key000000000``...
* small: ``--small-ops`` transactions (default 100,000) of one put each, through the Python API.

The baseline is a session patchset of the same rows (collection, key, value) applied to an empty
table with ``apsw``; we report import and export time over its apply time, and packet bytes over
its zstd-3 size.  The local write path has plain SQLite as its baseline, with the store's
durability (WAL, synchronous=FULL): ``syncpack load`` against a Python script that reads the
same JSONL file into a plain table in one transaction (each run as a process of its own), and
the small workload's one-put API transactions against the same loop on a plain table, one commit
each (the two loops alternate in slices of 1,000 transactions).  A relay figure follows: the hub writes the bulk load's packets for ``--peers``
further members (r1..r8 by default, none of which holds the load; p0 is not one of them) in one
``export --to r1 ... --to r8`` (ops/s over all packets; every packet is checked to carry every
op).  Every figure is the median of ``--runs`` runs; absolute numbers are printed beside the
ratios.

``--big-gb G [G ...]`` adds the peak RSS of ``syncpack export`` and ``syncpack import`` of one
packet of about G GB (10^9 bytes) each.  A hub is filled through the Python API, faster than
``load`` and the same store: transactions of 8,000 puts (at most 32 MiB, where ``load`` cuts)
of ``--big-value-kb`` KiB values, each transaction sealed into one block at commit.  The values
are random base64 text, so the packet holds about 3/4 of the values' bytes (6 random bits a
character, which zstd cannot squeeze further).  The export (``--max-size`` above the packet, so
one packet) and the import then run as children of a tiny spawner, whose ``os.wait4`` gives the
kernel's ``ru_maxrss`` of exactly that process (a child forked from this large process would
start at our own high-water mark); the spawner also samples the child's RSS every 0.2 s, to
show whether it grows as the work proceeds, and a ``syncpack status`` is measured the same way
as the floor.  The hub is removed after the export, so the disk holds at most the packet, the
peer and the peer's write-ahead log (under 6x the packet); a size that does not fit the free
disk is skipped with a note.

    python tools/bench_cli.py                       # the default sizes, one run
    python tools/bench_cli.py --runs 3              # medians of three
    python tools/bench_cli.py --bulk-ops 0 --small-ops 0 --big-gb 1 2 4   # peak RSS only
    python tools/bench_cli.py --bulk-ops 20000 --small-ops 2000 --peers 2   # a smoke run

syncpack's bytecode is compiled first (machine.compile_syncpack, as ``pip install`` does);
``--no-bytecode`` leaves it out, to measure an editable install run with
``PYTHONDONTWRITEBYTECODE=1``, which compiles every module from source in every command.
"""

from __future__ import annotations

import argparse
import base64
import json
import math
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from syncpack.site import Site  # noqa: E402

import machine  # noqa: E402  (tools/machine.py, beside this file)

COLLECTION = "bench"
REPEATED = ("syncpack" * 7)[:50]
API_SLICE = 1_000                # small run: API and plain transactions alternate in these
BIG_TXN_OPS = 8_000              # big run: puts per transaction (one block each)
BIG_TXN_BYTES = 32 * 1024 ** 2   # ... and at most this many value bytes (load's own cut)


def value_of(rnd: random.Random) -> str:
    return rnd.randbytes(25).hex() + REPEATED


def key_of(i: int) -> str:
    return f"key{i:09d}"


def argv_of(args, site: Path | None, as_json: bool) -> list[str]:
    return [sys.executable, "-m", "syncpack"] + (["--site", str(site)] if site else []) + \
        (["--json"] if as_json else []) + [str(a) for a in args]


def sp(*args, site: Path | None = None, check: bool = True) -> float:
    """Run the syncpack command; returns wall seconds (process start included)."""
    return spj(*args, site=site, check=check, as_json=False)[0]


def spj(*args, site: Path | None = None, check: bool = True,
        as_json: bool = True) -> tuple[float, dict | None]:
    """Run the syncpack command (with --json); wall seconds and the JSON document it printed."""
    argv = argv_of(args, site, as_json)
    t0 = time.perf_counter()
    r = subprocess.run(argv, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({r.returncode}):\n{r.stderr}")
    return dt, (json.loads(r.stdout) if as_json and r.stdout.strip() else None)


# A process's ru_maxrss includes the memory image it was forked from (Linux keeps the old mm's
# high-water mark across exec, vfork included), so a child of this process (which holds the
# bulk rows) would report at least our own RSS.  A tiny spawner (python -S, no site-packages)
# starts the measured command instead and reports that one child's rusage from os.wait4.
_SPAWNER = """\
import json, os, subprocess, sys, threading, time
t0 = time.perf_counter()
p = subprocess.Popen(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
box, samples, done = {}, [], threading.Event()
def sample():                   # RSS every 0.2 s: does it grow as the work proceeds?
    while not done.wait(0.2):
        try:
            with open(f"/proc/{p.pid}/status") as f:
                kb = {k: int(v.split()[0]) for k, _, v in (line.partition(":") for line in f)
                      if k in ("VmRSS", "RssAnon", "RssFile", "RssShmem")}
            samples.append((time.perf_counter() - t0, kb["VmRSS"], kb.get("RssAnon", 0),
                            kb.get("RssFile", 0), kb.get("RssShmem", 0)))
        except (OSError, ValueError, IndexError, KeyError):
            pass
threads = [threading.Thread(target=lambda k, f: box.__setitem__(k, f.read()), args=kf)
           for kf in (("out", p.stdout), ("err", p.stderr))] + [threading.Thread(target=sample)]
for t in threads:
    t.start()
_pid, status, ru = os.wait4(p.pid, 0)
dt = time.perf_counter() - t0
done.set()
for t in threads:
    t.join()
print(json.dumps({"exit": os.waitstatus_to_exitcode(status), "maxrss_kb": ru.ru_maxrss,
                  "seconds": dt, "cpu_s": ru.ru_utime + ru.ru_stime, "rss_samples": samples,
                  "stdout": box["out"].decode(errors="replace"),
                  "stderr": box["err"].decode(errors="replace")}))
"""


def rss_profile(samples: list, seconds: float, parts: int = 10) -> list[float | None]:
    """The highest sampled RSS (MB) in each tenth of the run (None: no sample there): flat if
    memory does not grow with the work done."""
    out: list[float | None] = [None] * parts
    for t, kb, *_ in samples:
        i = min(parts - 1, int(t / seconds * parts))
        out[i] = max(out[i] or 0.0, round(kb / 1024, 1))
    return out


def rss_parts(samples: list) -> dict:
    """The sampled peak (MB) and what it was made of: anonymous memory (Python's heap, zstd's
    buffers, SQLite's page cache), mapped files, shared memory (SQLite's WAL index)."""
    if not samples:
        return {}
    _t, rss, anon, file, shmem = max(samples, key=lambda s: s[1])
    return {"rss": rss / 1024, "anon": anon / 1024, "file": file / 1024, "shmem": shmem / 1024}


def sp_rss(*args, site: Path | None = None) -> dict:
    """Run the syncpack command (with --json) under the spawner: wall seconds, cpu seconds and
    the kernel's peak RSS of that process alone (ru_maxrss, KiB on Linux)."""
    argv = argv_of(args, site, True)
    r = subprocess.run([sys.executable, "-S", "-c", _SPAWNER, *argv], capture_output=True,
                       text=True, check=True)
    res = json.loads(r.stdout)
    if res["exit"] != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({res['exit']}):\n{res['stderr']}")
    doc = json.loads(res["stdout"]) if res["stdout"].strip() else None
    return {"seconds": res["seconds"], "cpu_s": res["cpu_s"],
            "peak_rss_mb": res["maxrss_kb"] / 1024, "doc": doc,
            "rss_by_tenth_mb": rss_profile(res["rss_samples"], res["seconds"]),
            "sampled_peak_mb": rss_parts(res["rss_samples"])}


def family(root: Path, peers: list[str]) -> Path:
    hub = root / "hub"
    sp("init", hub, "--family", "bench", "--site", "hub")
    for p in peers:
        sp("keygen", root / p, "--site", p)
        out = root / f"seed-{p}"
        sp("mkreplica", "export", "--site", p, "--pubkey", root / p / "keys" / "site.pub",
           "--out", out, "--create-out", site=hub)
        sp("mkreplica", "import", out, site=root / p)
        shutil.rmtree(out)
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


# The plain-SQLite baselines of the local write path: the same rows into a plain table, with the
# store's durability (WAL, synchronous=FULL).  The load baseline is a script of its own, run
# like the command (process start included); it reads the same JSONL file.
PLAIN_TABLE = ("CREATE TABLE records(collection TEXT, key TEXT, value TEXT, "
               "PRIMARY KEY(collection, key))")
_PLAIN_LOAD = f"""\
import json, sys
import apsw
conn = apsw.Connection(sys.argv[2])
conn.execute("PRAGMA journal_mode=WAL")
conn.execute("PRAGMA synchronous=FULL")
conn.execute({PLAIN_TABLE!r})
def rows():
    with open(sys.argv[1], encoding="utf-8") as f:
        for line in f:
            d = json.loads(line)
            yield d["collection"], d["key"], json.dumps(d["value"])
with conn:
    conn.executemany("INSERT INTO records VALUES (?, ?, ?)", rows())
conn.close()
"""


def plain_load(root: Path, lines: Path) -> float:
    """Wall seconds of the plain-SQLite load script (process start included)."""
    db = root / "plain.db"
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", _PLAIN_LOAD, str(lines), str(db)], check=True)
    dt = time.perf_counter() - t0
    for f in ("plain.db", "plain.db-wal", "plain.db-shm"):
        (root / f).unlink(missing_ok=True)
    return dt


def plain_connection(db: Path):
    import apsw
    conn = apsw.Connection(str(db))
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute(PLAIN_TABLE)
    return conn


def check_packets(doc: dict | None, names: list[str], ops: int, what: str,
                  slack: int = 0) -> int:
    """Every named peer got, over its packets, the ``ops`` ops of the workload (and at most
    ``slack`` more: roster ops of members added after it was seeded).  Returns the total."""
    got: dict[str, int] = {}
    for p in (doc or {}).get("packets", []):
        got[p["to"]] = got.get(p["to"], 0) + p["ops"]
    if sorted(got) != sorted(names) or not all(ops <= n <= ops + slack for n in got.values()):
        raise RuntimeError(f"{what}: ops per recipient {got}, expected {ops} (+{slack}) to each "
                           f"of {names}")
    return sum(got.values())


def check_import(doc: dict | None, ops: int, what: str, slack: int = 0) -> None:
    if (not doc or not ops <= doc["ops_applied"] <= ops + slack or doc["rejected"]
            or doc["parked"]):
        raise RuntimeError(f"{what}: import did not apply {ops} ops: {doc}")


def bulk_run(root: Path, ops: int, peers: int, rnd: random.Random) -> dict:
    relay_names = [f"r{i + 1}" for i in range(peers)]
    hub = family(root, ["p0", *relay_names])
    lines = root / "load.jsonl"
    rows = []
    with open(lines, "w") as f:
        for i in range(ops):
            v = value_of(rnd)
            rows.append((COLLECTION, key_of(i), json.dumps(v)))
            f.write(json.dumps({"collection": COLLECTION, "key": key_of(i), "value": v}) + "\n")
    # the command and the plain script alternate, so a change in the machine's load in between
    # shifts both (the second pair measures the first again: medians of each)
    load_s = sp("load", lines, site=hub)
    plain_load_s = plain_load(root, lines)
    lines.unlink()
    out = root / "one"
    out.mkdir()
    export_s, doc = spj("export", "--to", "p0", "--out", out, site=hub)
    check_packets(doc, ["p0"], ops, "bulk export", slack=peers)
    size = packet_bytes(out)
    import_s, doc = spj("import", out / "p0", site=root / "p0")
    check_import(doc, ops, "bulk import", slack=peers)
    shutil.rmtree(out)
    relay_s, relay_ops, relay_bytes = 0.0, 0, 0
    if peers:
        relay = root / "relay"
        relay.mkdir()
        to = [a for n in relay_names for a in ("--to", n)]
        relay_s, doc = spj("export", *to, "--out", relay, site=hub)
        relay_ops = check_packets(doc, relay_names, ops, "relay export", slack=peers)
        relay_bytes = packet_bytes(relay)
        shutil.rmtree(relay)
    base = baseline(root, rows)
    return {"ops": ops, "load_s": load_s, "plain_load_s": plain_load_s,
            "export_s": export_s, "import_s": import_s,
            "packet_bytes": size, "relay_peers": peers, "relay_s": relay_s,
            "relay_ops": relay_ops, "relay_bytes": relay_bytes, **base}


def small_run(root: Path, ops: int, rnd: random.Random, api_ops: int | None = None) -> dict:
    hub = family(root, ["p0"])
    vals = [value_of(rnd) for _ in range(ops)]
    rows = [(COLLECTION, key_of(i), json.dumps(v)) for i, v in enumerate(vals)]
    # One put per transaction through the API, and the same on a plain table (one commit
    # each), alternating in slices of API_SLICE so both meet the same machine.
    api_s = plain_s = 0.0
    timed = ops if api_ops is None else min(ops, api_ops)
    plain = plain_connection(root / "plain.db")
    with Site.open(hub) as s:
        for lo in range(0, timed, API_SLICE):
            hi = min(timed, lo + API_SLICE)
            t0 = time.perf_counter()
            for i in range(lo, hi):
                with s.transaction() as tx:
                    tx.put(COLLECTION, key_of(i), vals[i])
            t1 = time.perf_counter()
            for i in range(lo, hi):
                with plain:
                    plain.execute("INSERT INTO records VALUES (?, ?, ?)", rows[i])
            t2 = time.perf_counter()
            api_s += t1 - t0
            plain_s += t2 - t1
        # The rest of the workload (--api-ops below --small-ops) is only filled: the same
        # transactions, without waiting for the disk at each commit (the store is the same).
        s.conn.execute("PRAGMA synchronous=OFF")
        for i in range(timed, ops):
            with s.transaction() as tx:
                tx.put(COLLECTION, key_of(i), vals[i])
    plain.close()
    for f in ("plain.db", "plain.db-wal", "plain.db-shm"):
        (root / f).unlink(missing_ok=True)
    out = root / "one"
    out.mkdir()
    export_s, doc = spj("export", "--to", "p0", "--out", out, site=hub)
    check_packets(doc, ["p0"], ops, "small export")
    size = packet_bytes(out)
    import_s, doc = spj("import", out / "p0", site=root / "p0")
    check_import(doc, ops, "small import")
    base = baseline(root, rows)
    return {"ops": ops, "api_ops": timed, "api_s": api_s, "plain_api_s": plain_s,
            "export_s": export_s,
            "import_s": import_s, "packet_bytes": size, **base}


# --- peak RSS of one big packet ----------------------------------------------------------------

def dir_bytes(d: Path) -> int:
    return sum(f.stat().st_size for f in d.rglob("*") if f.is_file())


def big_fill(hub: Path, target_bytes: float, value_kb: float, rnd: random.Random) -> dict:
    """Puts of random base64 values at the hub, in transactions of BIG_TXN_OPS (each sealed
    into one block at commit), until the blocks hold ``target_bytes``."""
    raw_len = max(4, int(value_kb * 1024) // 4 * 4)       # base64 characters per value
    per_txn = max(1000, min(BIG_TXN_OPS, BIG_TXN_BYTES // raw_len))
    ops = blocks_bytes = 0
    t0 = time.perf_counter()
    with Site.open(hub) as s:
        conn = s.conn
        last = "SELECT length(data) FROM blocks WHERE origin=? ORDER BY hi DESC LIMIT 1"
        while blocks_bytes < target_bytes:
            with s.transaction() as tx:
                for _ in range(per_txn):
                    tx.put(COLLECTION, f"big{ops:010d}",
                           base64.b64encode(rnd.randbytes(raw_len // 4 * 3)).decode("ascii"))
                    ops += 1
            blocks_bytes += conn.execute(last, (s.site_id,)).fetchone()[0]
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return {"ops": ops, "value_chars": raw_len, "txn_ops": per_txn, "blocks_bytes": blocks_bytes,
            "fill_s": time.perf_counter() - t0, "hub_store_bytes": dir_bytes(hub)}


def big_run(root: Path, gb: float, value_kb: float, rnd: random.Random) -> dict:
    target = gb * 1e9
    hub = family(root, ["p0"])
    # a trivial command's peak: the interpreter, syncpack and its imports, the site opened
    idle = sp_rss("status", site=root / "p0")
    fill = big_fill(hub, target, value_kb, rnd)
    ops = fill["ops"]
    out = root / "out"
    out.mkdir()
    max_size = f"{math.ceil(fill['blocks_bytes'] * 1.05 / 1024 ** 3) + 1}G"
    ex = sp_rss("export", "--to", "p0", "--out", out, "--max-size", max_size, site=hub)
    check_packets(ex["doc"], ["p0"], ops, "big export")
    packets = len(ex["doc"]["packets"])
    size = packet_bytes(out)
    shutil.rmtree(hub)                      # not needed any more: room for the peer's WAL
    im = sp_rss("import", out / "p0", site=root / "p0")
    check_import(im["doc"], ops, "big import")
    peer_bytes = dir_bytes(root / "p0")
    shutil.rmtree(out)
    shutil.rmtree(root / "p0")
    return {"target_gb": gb, "ops": ops, "value_chars": fill["value_chars"],
            "txn_ops": fill["txn_ops"], "fill_s": fill["fill_s"],
            "hub_store_bytes": fill["hub_store_bytes"], "packet_bytes": size,
            "packets": packets, "peer_store_bytes": peer_bytes,
            "idle_peak_rss_mb": idle["peak_rss_mb"],
            "export": {k: ex[k] for k in ("seconds", "cpu_s", "peak_rss_mb", "rss_by_tenth_mb",
                                          "sampled_peak_mb")},
            "import": {k: im[k] for k in ("seconds", "cpu_s", "peak_rss_mb", "rss_by_tenth_mb",
                                          "sampled_peak_mb")}}


def free_bytes(d: str) -> int:
    st = os.statvfs(d)
    return st.f_bavail * st.f_frsize


# --- report ------------------------------------------------------------------------------------

def med(runs: list[dict], k: str) -> float:
    return statistics.median(r[k] for r in runs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bulk-ops", type=int, default=1_000_000, help="0 skips the bulk workload")
    ap.add_argument("--small-ops", type=int, default=100_000, help="0 skips the small workload")
    ap.add_argument("--api-ops", type=int, default=None,
                    help="how many of the small workload's transactions are timed against "
                         "plain SQLite (default: all; the rest are written without waiting "
                         "for the disk, to save the time of their fsyncs)")
    ap.add_argument("--peers", type=int, default=8,
                    help="relay recipients besides p0 (8; 0 skips the relay)")
    ap.add_argument("--runs", type=int, default=1,
                    help="runs of each workload; every figure is their median (default 1; "
                         "the targets are medians of 3)")
    ap.add_argument("--seed", type=int, default=13,
                    help="seed of the generated records (the same seed, the same data)")
    ap.add_argument("--big-gb", type=float, nargs="*", default=[],
                    help="packet sizes in GB for the peak-RSS runs (default: none)")
    ap.add_argument("--big-value-kb", type=float, default=3.0,
                    help="value size of the big runs, KiB of base64 text (3: a version row "
                         "stays on its 16 KiB page; at 4 KiB each row spills ~2 KiB onto an "
                         "overflow page of its own, and the stores grow ~4.5x)")
    ap.add_argument("--dir", help="parent directory for the temporary sites ($TMPDIR)")
    ap.add_argument("--no-bytecode", action="store_true",
                    help="do not compile syncpack's bytecode first (each command then compiles "
                         "from source if PYTHONDONTWRITEBYTECODE is set)")
    ap.add_argument("--json", action="store_true", help="print one JSON document instead")
    ap.add_argument("--save", metavar="FILE", help="also write the JSON document to FILE")
    a = ap.parse_args()
    if a.bulk_ops < 0 or a.small_ops < 0 or a.peers < 0 or any(g <= 0 for g in a.big_gb):
        ap.error("sizes must not be negative, --big-gb sizes positive")
    if a.api_ops is not None and a.api_ops < 1:
        ap.error("--api-ops must be at least 1")
    if not a.no_bytecode:
        machine.compile_syncpack()
    rnd = random.Random(a.seed)
    bulk, small, big = [], [], []
    watch = machine.Watch()
    for i in range(a.runs):
        if a.bulk_ops:
            with tempfile.TemporaryDirectory(dir=a.dir) as t:
                bulk.append(bulk_run(Path(t), a.bulk_ops, a.peers, rnd))
        if a.small_ops:
            with tempfile.TemporaryDirectory(dir=a.dir) as t:
                small.append(small_run(Path(t), a.small_ops, rnd, a.api_ops))
    for gb in a.big_gb:
        with tempfile.TemporaryDirectory(dir=a.dir) as t:
            need, free = 6 * gb * 1e9, free_bytes(t)
            if free < need:
                big.append({"target_gb": gb, "skipped": f"needs ~{need / 1e9:.0f} GB of free "
                            f"disk (packet, peer and its WAL), {free / 1e9:.0f} GB free"})
                continue
            big.append(big_run(Path(t), gb, a.big_value_kb, rnd))
    seen = watch.report()
    res: dict = {"runs": a.runs, "load_average": seen["load_average"], "machine": seen,
                 "bytecode": not a.no_bytecode,
                 "cpus": os.cpu_count(), "ratios": {}}
    if bulk:
        b = res["bulk"] = {k: med(bulk, k) for k in bulk[0]}
        res["ratios"].update({
            "load_vs_plain_sqlite": b["load_s"] / b["plain_load_s"],
            "bulk_import_vs_apply": b["import_s"] / b["apply_s"],
            "bulk_export_vs_apply": b["export_s"] / b["apply_s"],
            "bulk_packet_vs_patchset_zstd3": b["packet_bytes"] / b["patchset_zstd3_bytes"]})
        if a.peers:
            res["relay_ops_per_s"] = b["relay_ops"] / b["relay_s"]
    if small:
        s = res["small"] = {k: med(small, k) for k in small[0]}
        res["ratios"]["small_import_vs_apply"] = s["import_s"] / s["apply_s"]
        res["ratios"]["api_txn_vs_plain_sqlite"] = s["api_s"] / s["plain_api_s"]
    if big:
        res["big"] = big
    res["each_run"] = {"bulk": bulk, "small": small}
    if a.save:
        Path(a.save).write_text(json.dumps(res, indent=2) + "\n")
    if a.json:
        print(json.dumps(res, indent=2))
        return 0
    r = res["ratios"]
    print(f"medians of {a.runs} run(s); syncpack "
          + ("from source in every command" if a.no_bytecode else "bytecode compiled first"))
    print(machine.describe(res["machine"]))
    if bulk or small:
        print(f"{'figure':44} {'ratio':>8}  {'syncpack':>24}  {'baseline':>24}  target")
    if bulk:
        b = res["bulk"]
        print(f"{'load / plain SQLite script':44} {r['load_vs_plain_sqlite']:7.2f}x  "
              f"{b['load_s']:8.2f} s {b['ops'] / b['load_s']:>9,.0f} rec/s  "
              f"{b['plain_load_s']:8.2f} s plain         <= 1.5x")
    if small:
        s = res["small"]
        print(f"{'one-put API transactions / plain SQLite':44} "
              f"{r['api_txn_vs_plain_sqlite']:7.2f}x  "
              f"{s['api_s']:8.2f} s {s['api_ops'] / s['api_s']:>9,.0f} txn/s  "
              f"{s['plain_api_s']:8.2f} s plain         <= 1.3x")
    if bulk:
        print(f"{'bulk import / changeset apply':44} {r['bulk_import_vs_apply']:7.2f}x  "
              f"{b['import_s']:8.2f} s {b['ops'] / b['import_s']:>9,.0f} op/s  "
              f"{b['apply_s']:8.2f} s apply         <= 1.3x")
        print(f"{'bulk export / changeset apply':44} {r['bulk_export_vs_apply']:7.2f}x  "
              f"{b['export_s']:8.2f} s {b['ops'] / b['export_s']:>9,.0f} op/s  "
              f"{b['apply_s']:8.2f} s apply    (was 0.19x)")
        print(f"{'bulk packet bytes / zstd-3 patchset bytes':44} "
              f"{r['bulk_packet_vs_patchset_zstd3']:7.3f}x  "
              f"{b['packet_bytes'] / b['ops']:13.2f} B/op  "
              f"{b['patchset_zstd3_bytes'] / b['ops']:13.2f} B/row   (was 0.84x)")
    if small:
        s = res["small"]
        print(f"{'small import / changeset apply':44} {r['small_import_vs_apply']:7.2f}x  "
              f"{s['import_s']:8.2f} s {s['ops'] / s['import_s']:>9,.0f} op/s  "
              f"{s['apply_s']:8.2f} s apply         <= 2.0x")
    if bulk and a.peers:
        b = res["bulk"]
        print(f"relay: hub -> {a.peers} peers in one export, {b['relay_ops']:,.0f} ops "
              f"({b['relay_bytes'] / 1e6:,.1f} MB) in {b['relay_s']:.2f} s = "
              f"{res['relay_ops_per_s']:,.0f} ops/s (target >= 1,000,000)")
    for g in big:
        if "skipped" in g:
            print(f"big packet, {g['target_gb']:g} GB: skipped ({g['skipped']})")
            continue
        e, i = g["export"], g["import"]
        print(f"big packet, {g['target_gb']:g} GB: {g['ops']:,} ops of {g['value_chars']:,}-char "
              f"values, {g['packet_bytes'] / 1e9:.2f} GB in {g['packets']} packet(s); hub "
              f"store {g['hub_store_bytes'] / 1e9:.2f} GB (filled in {g['fill_s']:.0f} s), "
              f"peer store {g['peer_store_bytes'] / 1e9:.2f} GB")
        print(f"  export: {e['seconds']:7.1f} s ({g['packet_bytes'] / e['seconds'] / 1e6:6.1f} "
              f"MB/s, {e['cpu_s']:.1f} s cpu)  peak RSS {e['peak_rss_mb']:6.1f} MB   "
              f"target <= 256 MB")
        print(f"  import: {i['seconds']:7.1f} s ({g['packet_bytes'] / i['seconds'] / 1e6:6.1f} "
              f"MB/s, {i['cpu_s']:.1f} s cpu)  peak RSS {i['peak_rss_mb']:6.1f} MB   "
              f"target <= 256 MB")
        for what, x in (("export", e), ("import", i)):
            pk = x["sampled_peak_mb"]
            print(f"  {what} RSS (MB), highest in each tenth of its run: "
                  + " ".join("-" if v is None else f"{v:.0f}" for v in x["rss_by_tenth_mb"])
                  + (f"; sampled peak {pk['rss']:.0f} = anon {pk['anon']:.0f} + file "
                     f"{pk['file']:.0f} + shmem {pk['shmem']:.0f}" if pk else ""))
        print(f"  (a 'syncpack status' at the peer peaks at {g['idle_peak_rss_mb']:.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
