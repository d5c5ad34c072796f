#!/usr/bin/env python3
"""Crash harness: SIGKILL syncpack commands at random instants and check docs/design.md §3.3.

Each trial copies a prepared site (and medium) into a scratch directory, starts one command as
a child process (the venv's ``syncpack`` script, or a small Python write loop using the API),
sleeps a random time chosen inside the command's measured run time, and kills it with SIGKILL.
Then it checks, for that trial:

* the store opens and ``fsck`` finds nothing wrong (in-process, ``syncpack.admin.inspection.fsck``);
* no packet file is half-written under its final name: every ``*.spk`` on the output medium
  parses with ``syncpack lspacket``, its signature is valid, its body matches its hash and holds
  exactly the ops its header declares; the only other files are hidden temporaries ``.*.tmp``;
* for the write loop: every committed transaction is whole (each transaction writes a counter
  and K records carrying the same counter; the changelog holds exactly ``counter * (K+1)`` of
  them, in whole transactions);
* re-running the command completes (exit 0), and the final digest and vectors equal those of an
  uninterrupted reference run (for the write loop the clock differs between runs, so the visible
  records and the vector are compared instead of the digest).

Commands cycled through:

``import``            import a 4-packet medium at b (one transaction per packet)
``import-parked``     b holds packets 1-3 parked; import packet 0, which applies all four
``export``            export from a to b into a medium, cut into 4 packets
``mkreplica-import``  seed a new site c from a snapshot packet
``scrub``             trim every acknowledged op from a's changelog
``write``             a Python loop of local transactions (``site.transaction()``)

Usage::

    .venv/bin/python tools/crash_run.py --kills 200
    .venv/bin/python tools/crash_run.py --kills 30 --commands import,scrub --ops 20000

Prints a tally (kills per command, where they landed, failures) and exits 1 on any failure.
``tests/test_crash.py`` runs the same harness with about 20 kills.
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

BIN = Path(sys.executable).parent
SYNCPACK = BIN / "syncpack"
COMMANDS = ("import", "import-parked", "export", "mkreplica-import", "scrub", "write")
PARTS = 4            # the a->b update is cut into this many packets (one load per packet)

WRITE_LOOP = r"""
import sys
import syncpack
from syncpack.errors import RecordNotFound
path, target, width = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = syncpack.open_site(path)
try:
    i = s.get("w", "counter")["i"]
except RecordNotFound:
    i = 0
while i < target:
    i += 1
    with s.transaction() as tx:
        for j in range(width):
            tx.put("w", f"k{j:04d}", {"i": i, "j": j})
        tx.put("w", "counter", {"i": i})
"""


class HarnessError(Exception):
    pass


def sp(*args, site: Path | None = None, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess:
    argv = [str(SYNCPACK)]
    if site is not None:
        argv += ["--site", str(site)]
    argv += [str(a) for a in args]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise HarnessError(f"{' '.join(argv)} -> exit {r.returncode}: {r.stderr.strip()}")
    if "Traceback" in r.stderr:
        raise HarnessError(f"{' '.join(argv)} printed a traceback: {r.stderr}")
    return r


def copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, symlinks=True)
    return dst


def spk_files(d: Path) -> list[Path]:
    return sorted(p for p in d.rglob("*.spk") if not p.name.startswith("."))


# --- state snapshots (in-process, through the API) ----------------------------------------------

def _open(path: Path, joined: bool = True):
    from syncpack.site import Site
    return Site.open(path, require_joined=joined)


def state_of(path: Path) -> dict:
    """Digest, vector (named, zeros dropped), changelog size, floors, parked, packets in."""
    from syncpack.store import chain
    with _open(path) as s:
        d, n = s.digest()
        c = s.conn
        return {
            "digest": d, "records": n,
            "vector": {k: v for k, v in s.named(s.vector()).items() if v},
            "floors": {k: v for k, v in s.named(s.floors()).items() if v},
            # ops held, sealed or not (an export seals first, in its own transaction)
            "changelog": chain.count(c),
            "parked": c.execute("SELECT count(*) FROM parked").fetchone()[0],
            "packets_in": c.execute("SELECT count(*) FROM packets_in").fetchone()[0],
        }


def fsck_problems(path: Path) -> list[str]:
    from syncpack.admin import inspection
    with _open(path) as s:
        doc = inspection.fsck(s)
    return [] if doc["ok"] else doc["problems"]


def sent_to(path: Path, peer: str) -> dict:
    from syncpack.admin import inspection
    with _open(path) as s:
        return inspection.lsepoch(s)["peers"].get(peer, {}).get("sent", {})


def records(path: Path, collection: str) -> dict:
    with _open(path) as s:
        return {k: v for _c, k, v in s.records(collection)}


# --- the world: sites and media every trial starts from -----------------------------------------

@dataclass
class World:
    root: Path
    ops: int
    write_txns: int
    write_width: int
    max_size: str = ""
    t: dict = field(default_factory=dict)      # template paths
    ref: dict = field(default_factory=dict)    # reference results
    dur: dict = field(default_factory=dict)    # uninterrupted run time per command (s)
    startup: float = 0.15


def _timed(argv: list[str]) -> float:
    t0 = time.monotonic()
    r = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise HarnessError(f"{' '.join(map(str, argv))} -> exit {r.returncode}: {r.stderr}")
    return time.monotonic() - t0


def build_world(root: Path, ops: int = 20000, write_txns: int = 60, write_width: int = 100,
                log=lambda s: None) -> World:
    """Build every template once, with uninterrupted reference runs (which also time each
    command so kills can be aimed inside it)."""
    w = World(root, ops, write_txns, write_width)
    t = w.t
    T = root / "templates"
    T.mkdir(parents=True)
    log(f"building the world in {root} ({ops} ops)")
    w.startup = min(_timed([str(SYNCPACK), "--version"]) for _ in range(3))

    a, b, c = T / "a", T / "b_pre", T / "c_pre"
    sp("init", a, "--family", "crashfam", "--site", "a")
    sp("keygen", b, "--site", "b")
    sp("keygen", c, "--site", "c")
    snap_b = T / "snap_b"
    sp("mkreplica", "export", "--site", "b", "--pubkey", b / "keys" / "site.pub", "--create-out",
       "--out", snap_b,
       site=a)
    sp("mkreplica", "import", snap_b, site=b)
    # The data: PARTS equal transactions (one 'load' each) of puts, so the a->b update is cut
    # into PARTS packets, then a small one of deletes (scrub then has tombstones to consider).
    per = max(1, ops // PARTS)
    # Some random bytes in every value, so each load's block is well above the smallest
    # --max-size (64K) and the size found below cuts one load per packet.
    pad_rng = random.Random(7)
    for p in range(PARTS + 1):
        f = T / f"ops{p}.jsonl"
        with open(f, "w") as out:
            # the deletes stay a small transaction (sealed at export, small enough to ride
            # with the last load) at any --ops
            for i in range(per if p < PARTS else min(per // 10, 300)):
                if p == PARTS:
                    out.write(json.dumps({"collection": "c", "key": f"k0-{i * 10:07d}",
                                          "delete": True}) + "\n")
                else:
                    out.write(json.dumps({"collection": "c", "key": f"k{p}-{i:07d}",
                                          "value": {"n": i, "part": p, "pad": "x" * 24,
                                                    "r": pad_rng.randbytes(12).hex()}}) + "\n")
        sp("load", f, site=a)
        f.unlink()
    # mkreplica import: a snapshot for c made by a throw-away copy of a (so that a's own roster
    # does not gain a member that never acknowledges anything, which would stop scrub).
    a_tmp = copy(a, T / "a_tmp")
    # Packets are cut per transaction: find a --max-size that holds one load but not two.
    w.max_size = str(_one_txn_size(a, T))
    t["snap_c"] = T / "snap_c"
    sp("mkreplica", "export", "--site", "c", "--pubkey", c / "keys" / "site.pub",
       "--create-out", "--out", t["snap_c"], site=a_tmp)
    shutil.rmtree(a_tmp)
    t["c_pre"] = c
    ref_c = copy(c, T / "ref_c")
    w.dur["mkreplica-import"] = _timed([str(SYNCPACK), "--site", str(ref_c), "mkreplica",
                                        "import", str(t["snap_c"])])
    w.ref["mkreplica-import"] = state_of(ref_c)

    # export: a before its export to b; the reference run's medium is the import medium.
    t["a_pre_export"] = copy(a, T / "a_pre_export")
    t["medium_ab"] = T / "medium_ab"
    w.dur["export"] = _timed([str(SYNCPACK), "--site", str(a), "export", "--to", "b",
                              "--create-out", "--out",
                              str(t["medium_ab"]), "--max-size", w.max_size])
    parts = spk_files(t["medium_ab"])
    if len(parts) != PARTS:
        raise HarnessError(f"expected {PARTS} packets from a to b, got {len(parts)}: {parts}")
    w.ref["export_sent"] = sent_to(a, "b")

    # import: b before the update; reference state after it.
    t["b_pre"] = b
    ref_b = copy(b, T / "ref_b")
    w.dur["import"] = _timed([str(SYNCPACK), "--site", str(ref_b), "import",
                              str(t["medium_ab"])])
    w.ref["import"] = state_of(ref_b)
    if w.ref["import"]["digest"] != state_of(a)["digest"]:
        raise HarnessError("b does not converge with a after the reference import")

    # import-parked: packets 1..3 parked at b first, then packet 0 is imported.
    t["b_parked"] = copy(b, T / "b_parked")
    sp("import", *parts[1:], site=t["b_parked"])
    if state_of(t["b_parked"])["parked"] != PARTS - 1:
        raise HarnessError("packets 1.. were not parked")
    t["part0"] = parts[0]
    ref_bp = copy(t["b_parked"], T / "ref_b_parked")
    w.dur["import-parked"] = _timed([str(SYNCPACK), "--site", str(ref_bp), "import",
                                     str(parts[0])])
    w.ref["import-parked"] = state_of(ref_bp)
    if w.ref["import-parked"]["digest"] != w.ref["import"]["digest"]:
        raise HarnessError("parked route does not converge with the direct import")

    # scrub: b acknowledges everything to a; a then trims its whole changelog.
    ack = T / "medium_ba"
    sp("export", "--to", "a", "--create-out", "--out", ack, site=ref_b)
    sp("import", ack, site=a)
    t["a_scrub"] = a
    ref_a = copy(a, T / "ref_a_scrub")
    w.dur["scrub"] = _timed([str(SYNCPACK), "--site", str(ref_a), "scrub"])
    w.ref["scrub"] = state_of(ref_a)
    if w.ref["scrub"]["changelog"] >= state_of(a)["changelog"]:
        raise HarnessError("reference scrub trimmed nothing")

    # write loop: local transactions at a copy of b after the update.
    t["b_post"] = ref_b
    ref_w = copy(ref_b, T / "ref_write")
    w.dur["write"] = _timed(write_argv(w, ref_w))
    w.ref["write"] = state_of(ref_w)
    w.ref["write_records"] = records(ref_w, "w")
    w.ref["write_base"] = state_of(ref_b)["vector"].get("b", 0)
    log("uninterrupted run times: " + ", ".join(f"{k} {v:.2f}s" for k, v in w.dur.items())
        + f"; interpreter start {w.startup:.2f}s")
    return w


def _one_txn_size(a: Path, work: Path) -> int:
    """A --max-size that holds one load but not two, so each load travels in a packet of its
    own.  Each load is one block and packets are cut between blocks: start just above the
    largest block plus the packet's own framing and header, and check by exporting from
    copies of ``a``."""
    from syncpack.format import blocks, codec
    from syncpack.exchange.verify import open_packet
    probe = work / "probe"
    copy(a, work / "probe_site")
    sp("export", "--to", "b", "--create-out", "--out", probe, site=work / "probe_site")
    largest = overhead = 0
    for p in spk_files(probe):
        pk = open_packet(p)
        try:
            sizes = [len(b) for b in blocks.split_blocks(codec.body_chunks(pk.f, pk.env))]
            largest = max([largest, *sizes])
            overhead = max(overhead, p.stat().st_size - sum(sizes))
        finally:
            pk.close()
    base = largest + overhead
    try:
        # at least the room an export keeps for the header beside one of its own blocks
        # (sync.RESEAL_HEADROOM), else the load would be sealed again as parts
        for slack in (4608, 5120, 6144, 4096, 7168, 8192, 10240):
            size = base + slack
            shutil.rmtree(probe, ignore_errors=True)
            shutil.rmtree(work / "probe_site", ignore_errors=True)
            copy(a, work / "probe_site")
            sp("export", "--to", "b", "--create-out", "--out", probe, "--max-size", size,
               site=work / "probe_site")
            if len(spk_files(probe)) == PARTS:
                return size
        raise HarnessError(f"found no --max-size that cuts the update into {PARTS} packets")
    finally:
        shutil.rmtree(probe, ignore_errors=True)
        shutil.rmtree(work / "probe_site", ignore_errors=True)


def write_argv(w: World, site: Path) -> list[str]:
    return [sys.executable, "-c", WRITE_LOOP, str(site), str(w.write_txns), str(w.write_width)]


# --- one trial ----------------------------------------------------------------------------------

@dataclass
class Trial:
    argv: list[str]
    site: Path
    out: Path | None = None          # export medium


def prepare(w: World, cmd: str, d: Path) -> Trial:
    t = w.t
    if cmd == "import":
        s = copy(t["b_pre"], d / "b")
        return Trial([str(SYNCPACK), "--site", str(s), "import", str(t["medium_ab"])], s)
    if cmd == "import-parked":
        s = copy(t["b_parked"], d / "b")
        return Trial([str(SYNCPACK), "--site", str(s), "import", str(t["part0"])], s)
    if cmd == "export":
        s = copy(t["a_pre_export"], d / "a")
        out = d / "usb"
        return Trial([str(SYNCPACK), "--site", str(s), "export", "--to", "b", "--create-out",
                      "--out", str(out),
                      "--max-size", w.max_size], s, out)
    if cmd == "mkreplica-import":
        s = copy(t["c_pre"], d / "c")
        return Trial([str(SYNCPACK), "--site", str(s), "mkreplica", "import",
                      str(t["snap_c"])], s)
    if cmd == "scrub":
        s = copy(t["a_scrub"], d / "a")
        return Trial([str(SYNCPACK), "--site", str(s), "scrub"], s)
    if cmd == "write":
        s = copy(t["b_post"], d / "b")
        return Trial(write_argv(w, s), s)
    raise ValueError(cmd)


def landed(w: World, cmd: str, tr: Trial) -> str:
    """Where the kill landed, judged from the durable state it left."""
    if cmd == "mkreplica-import":
        with _open(tr.site, joined=False) as s:
            return "after commit" if s.joined else "before commit"
    if cmd in ("import", "import-parked"):
        with _open(tr.site) as s:
            n = s.conn.execute("SELECT count(*) FROM packets_in WHERE kind='update'"
                               ).fetchone()[0]
        return f"{n}/{PARTS} packets applied"
    if cmd == "export":
        files = len(spk_files(tr.out)) if tr.out.exists() else 0
        with _open(tr.site) as s:
            rec = s.conn.execute("SELECT count(*) FROM packets_out WHERE kind='update'"
                                 ).fetchone()[0]
        return f"{files}/{PARTS} files, " + ("recorded" if rec else "not recorded")
    if cmd == "scrub":
        with _open(tr.site) as s:
            trimmed = any(f for f in s.floors().values())
        return "after commit" if trimmed else "before commit"
    if cmd == "write":
        with _open(tr.site) as s:
            c = s.get("w", "counter", None)
        n = c["i"] if c else 0
        q = "0" if n == 0 else ("all" if n >= w.write_txns else "some")
        return f"{q} transactions committed"
    return "?"


def check_medium(w: World, tr: Trial) -> list[str]:
    """No half-written packet under a packet's name; temporaries are hidden .*.tmp files."""
    from syncpack.format import blocks, codec
    from syncpack.exchange.verify import open_packet
    problems = []
    if not tr.out.exists():
        return problems
    for p in sorted(tr.out.rglob("*")):
        if p.is_dir():
            continue
        if p.name.endswith(".spk") and not p.name.startswith("."):
            continue
        if not (p.name.startswith(".") and p.name.endswith(".tmp")):
            problems.append(f"unexpected file on the medium: {p.relative_to(tr.out)}")
    pkts = spk_files(tr.out)
    if not pkts:
        return problems
    r = sp("--json", "lspacket", *pkts, site=tr.site, check=False)
    if r.returncode != 0:
        problems.append(f"lspacket failed (exit {r.returncode}): {r.stderr.strip()}")
    else:
        doc = json.loads(r.stdout)
        for e in doc["packets"]:
            if e["signature"] != "valid":
                problems.append(f"{e['path']}: signature {e['signature']}")
        if len(doc["packets"]) != len(pkts):
            problems.append(f"lspacket listed {len(doc['packets'])} of {len(pkts)} packets")
    for p in pkts:
        try:
            pk = open_packet(p)
        except Exception as e:  # noqa: BLE001 - any failure here is a finding
            problems.append(f"{p.name}: does not open: {e}")
            continue
        try:
            if not codec.body_hash_matches(pk.f, pk.env):
                problems.append(f"{p.name}: body does not match its hash")
            else:
                n = sum(1 for _ in blocks.packet_ops(pk.f, pk.env))
                if n != pk.header.count:
                    problems.append(f"{p.name}: {n} ops, header says {pk.header.count}")
        except Exception as e:  # noqa: BLE001
            problems.append(f"{p.name}: body unreadable: {type(e).__name__}: {e}")
        finally:
            pk.close()
    return problems


def check_write_whole(w: World, site: Path) -> list[str]:
    """Every committed transaction of the write loop is whole, the changelog contiguous."""
    from syncpack.store import chain
    problems = []
    with _open(site) as s:
        c = s.get("w", "counter", None)
        n = c["i"] if c else 0
        recs = {k: v for _c, k, v in s.records("w")}
        for j in range(w.write_width):
            v = recs.get(f"k{j:04d}")
            if n == 0 and v is not None:
                problems.append(f"k{j:04d} exists but no transaction committed")
            if n and (v is None or v["i"] != n):
                problems.append(f"k{j:04d} holds {v}, the counter says transaction {n}")
                break
        own = s.vector().get(s.site_id, 0)
        expect = w.ref["write_base"] + n * (w.write_width + 1)
        if own != expect:
            problems.append(f"own epoch {own}, expected {expect} after {n} transactions")
        by_hlc: dict[int, list[int]] = {}
        for op in chain.iter_ops(s.conn, s.site_id, 0, own):
            if op.collection == "w":
                by_hlc.setdefault(op.hlc, []).append(op.epoch)
        groups = [(h, len(es), min(es), max(es)) for h, es in sorted(by_hlc.items())]
        if len(groups) != n:
            problems.append(f"changelog holds {len(groups)} write transactions, counter says {n}")
        prev = w.ref["write_base"]
        for hlc, cnt, lo, hi in groups:
            if cnt != w.write_width + 1 or lo != prev + 1 or hi != lo + cnt - 1:
                problems.append(f"partial or non-contiguous transaction at hlc {hlc}: {cnt} ops, "
                                f"epochs {lo}-{hi} after {prev}")
                break
            prev = hi
    return problems


def rerun(w: World, cmd: str, tr: Trial) -> list[str]:
    r = subprocess.run(tr.argv, capture_output=True, text=True, timeout=600)
    if "Traceback" in r.stderr:
        return [f"re-run printed a traceback: {r.stderr}"]
    if cmd == "mkreplica-import" and r.returncode == 1 and "already belongs" in r.stderr:
        return []   # the killed run had committed: the site is complete, a re-run refuses
    if r.returncode != 0:
        return [f"re-run exited {r.returncode}: {r.stderr.strip()}"]
    return []


def check_final(w: World, cmd: str, tr: Trial, d: Path) -> list[str]:
    problems = []
    if cmd == "write":
        st = state_of(tr.site)
        if st["vector"] != w.ref["write"]["vector"]:
            problems.append(f"vector {st['vector']} != reference {w.ref['write']['vector']}")
        if records(tr.site, "w") != w.ref["write_records"]:
            problems.append("records differ from the reference run")
        return problems + check_write_whole(w, tr.site)
    if cmd == "export":
        # What the medium now holds must bring b exactly where the reference export did.
        b = copy(w.t["b_pre"], d / "b_check")
        r = sp("--json", "import", tr.out, site=b, check=False)
        if r.returncode != 0:
            return [f"importing the re-run's medium failed: {r.stderr.strip()}"]
        doc = json.loads(r.stdout)
        if doc["parked"] or doc["rejected"]:
            problems.append(f"medium import parked/rejected: {doc['parked']} {doc['rejected']}")
        st, ref = state_of(b), w.ref["import"]
        for k in ("digest", "vector"):
            if st[k] != ref[k]:
                problems.append(f"b after importing the medium: {k} {st[k]} != {ref[k]}")
        got = sent_to(tr.site, "b")
        if got != w.ref["export_sent"]:
            problems.append(f"a's matrix: sent to b {got} != reference {w.ref['export_sent']}")
        return problems
    ref = w.ref[cmd]
    st = state_of(tr.site)
    keys = ["digest", "vector"]
    if cmd == "scrub":
        keys += ["floors", "changelog"]
    if cmd in ("import", "import-parked"):
        keys += ["parked"]
    for k in keys:
        if st[k] != ref[k]:
            problems.append(f"{k}: {st[k]} != reference {ref[k]}")
    return problems


@dataclass
class Tally:
    kills: collections.Counter = field(default_factory=collections.Counter)
    finished: collections.Counter = field(default_factory=collections.Counter)
    landings: dict = field(default_factory=lambda: collections.defaultdict(collections.Counter))
    failures: list = field(default_factory=list)
    notes: collections.Counter = field(default_factory=collections.Counter)

    def report(self) -> str:
        lines = [f"{'command':18} {'kills':>5} {'failures':>8}  where the kills landed"]
        for cmd in COMMANDS:
            if not self.kills[cmd] and not self.finished[cmd]:
                continue
            nf = sum(1 for f in self.failures if f[0] == cmd)
            where = ", ".join(f"{k}: {v}" for k, v in sorted(self.landings[cmd].items()))
            lines.append(f"{cmd:18} {self.kills[cmd]:>5} {nf:>8}  {where}")
        total = sum(self.kills.values())
        lines.append(f"{'total':18} {total:>5} {len(self.failures):>8}")
        if sum(self.finished.values()):
            lines.append("runs that finished before their kill (not counted): " + ", ".join(
                f"{k} {v}" for k, v in sorted(self.finished.items())))
        for k, v in sorted(self.notes.items()):
            lines.append(f"note: {k}: {v}")
        for cmd, n, delay, where, msgs in self.failures:
            lines.append(f"FAIL {cmd} #{n} (killed at {delay:.3f}s, {where}):")
            lines += [f"    {m}" for m in msgs[:8]]
        return "\n".join(lines)


def leftovers(cmd: str, tr: Trial) -> list[str]:
    """Harmless litter a kill may leave (reported as notes, not failures)."""
    notes = []
    parked = tr.site / "parked"
    if parked.is_dir():
        with _open(tr.site, joined=False) as s:
            known = {r[0] for r in s.conn.execute("SELECT file FROM parked")}
        for p in parked.iterdir():
            if p.name.endswith(".tmp"):
                notes.append("temporary file left in parked/")
            elif p.name not in known:
                notes.append("unrecorded packet file left in parked/")
    if tr.out is not None and tr.out.exists():
        if any(p.name.endswith(".tmp") for p in tr.out.rglob(".*")):
            notes.append("hidden .tmp file left on the export medium")
    return notes


def run_trial(w: World, cmd: str, n: int, rng: random.Random, tally: Tally,
              keep: bool = False) -> bool:
    """One kill; returns False when the command finished before the kill (no kill counted)."""
    d = w.root / "trials" / f"{cmd}-{n:04d}"
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    tr = prepare(w, cmd, d)
    lo = 0.6 * w.startup
    hi = max(w.dur[cmd] * 1.0, lo + 0.02)
    delay = rng.uniform(lo, hi)
    with open(d / "child.err", "w") as err:
        p = subprocess.Popen(tr.argv, stdout=subprocess.DEVNULL, stderr=err)
        time.sleep(delay)
        if p.poll() is not None:
            rc = p.returncode
            p.wait()
            if rc != 0:
                tally.failures.append((cmd, n, delay, "finished",
                                       [f"uninterrupted run exited {rc}: "
                                        f"{(d / 'child.err').read_text()}"]))
            tally.finished[cmd] += 1
            # The machine got faster than when the run was timed (load comes and goes):
            # aim the next kills earlier instead of giving up.
            w.dur[cmd] = max(lo + 0.02, min(w.dur[cmd], delay) * 0.8)
            if not keep:
                shutil.rmtree(d, ignore_errors=True)
            return False
        p.send_signal(signal.SIGKILL)
        p.wait()
    tally.kills[cmd] += 1
    problems: list[str] = []
    where = "?"
    try:
        where = landed(w, cmd, tr)
        tally.landings[cmd][where] += 1
        if cmd == "mkreplica-import" and where == "before commit":
            with _open(tr.site, joined=False):
                pass
        else:
            problems += [f"after kill: fsck: {x}" for x in fsck_problems(tr.site)]
        if tr.out is not None:
            problems += [f"after kill: {x}" for x in check_medium(w, tr)]
        if cmd == "write":
            problems += [f"after kill: {x}" for x in check_write_whole(w, tr.site)]
        for note in leftovers(cmd, tr):
            tally.notes[f"{cmd}: {note}"] += 1
        problems += rerun(w, cmd, tr)
        if not problems:
            problems += [f"after re-run: fsck: {x}" for x in fsck_problems(tr.site)]
            if tr.out is not None:
                problems += [f"after re-run: {x}" for x in check_medium(w, tr)]
            problems += check_final(w, cmd, tr, d)
    except Exception as e:  # noqa: BLE001 - a crash of the checks is a finding
        import traceback
        problems.append(f"check raised {type(e).__name__}: {e}\n{traceback.format_exc()}")
    if problems:
        tally.failures.append((cmd, n, delay, where, problems))
        keep = True
    if not keep:
        shutil.rmtree(d, ignore_errors=True)
    return True


def run(w: World, kills: dict[str, int], seed: int, tally: Tally | None = None,
        log=lambda s: None, keep: bool = False) -> Tally:
    """Kill each command ``kills[cmd]`` times, cycling through the commands."""
    tally = tally or Tally()
    rng = random.Random(seed)
    want = dict(kills)
    n = 0
    attempts = collections.Counter()
    while any(want.values()):
        for cmd in COMMANDS:
            if not want.get(cmd):
                continue
            n += 1
            attempts[cmd] += 1
            if run_trial(w, cmd, n, rng, tally, keep):
                want[cmd] -= 1
            elif attempts[cmd] > 4 * kills[cmd] + 10:
                raise HarnessError(f"{cmd} keeps finishing before its kill; enlarge --ops")
        done = sum(tally.kills.values())
        if done and done % 20 == 0:
            log(f"... {done} kills, {len(tally.failures)} failures")
    return tally


def spread(total: int, commands=COMMANDS) -> dict[str, int]:
    out = {c: total // len(commands) for c in commands}
    for c in list(commands)[: total % len(commands)]:
        out[c] += 1
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kills", type=int, default=200, help="total kills (spread over commands)")
    ap.add_argument("--commands", default=",".join(COMMANDS),
                    help="comma-separated subset of: " + ", ".join(COMMANDS))
    ap.add_argument("--ops", type=int, default=40000, help="ops in the a->b update")
    ap.add_argument("--write-txns", type=int, default=80)
    ap.add_argument("--write-width", type=int, default=100, help="puts per write transaction")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--dir", help="work directory (default: a fresh temporary one)")
    ap.add_argument("--keep", action="store_true", help="keep every trial directory")
    a = ap.parse_args(argv)
    cmds = [c for c in a.commands.split(",") if c]
    bad = [c for c in cmds if c not in COMMANDS]
    if bad:
        ap.error(f"unknown command(s): {', '.join(bad)}")
    seed = a.seed if a.seed is not None else random.randrange(1 << 30)
    root = Path(a.dir) if a.dir else Path(tempfile.mkdtemp(prefix="syncpack-crash-"))
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    t0 = time.monotonic()
    w = build_world(root, a.ops, a.write_txns, a.write_width, log)
    tally = run(w, spread(a.kills, cmds), seed, log=log, keep=a.keep)
    print(f"crash_run: seed {seed}, {a.ops} ops, {time.monotonic() - t0:.0f}s, work dir {root}")
    print(tally.report())
    if not tally.failures and not a.keep and not a.dir:
        shutil.rmtree(root, ignore_errors=True)
    return 1 if tally.failures else 0


if __name__ == "__main__":
    sys.exit(main())
