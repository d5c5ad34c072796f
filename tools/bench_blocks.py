#!/usr/bin/env python3
"""Block codec benchmark: bytes per op and decode cost of format 2 blocks against Arrow IPC and
SQLite's session patchset, on the same ops.  (The format 1 op stream it was first compared
with is no longer written; formats/BLOCKS.md section 7 keeps the figures of that run.)

Workloads:

* ``bulk``: ``--ops`` puts (default 1,000,000) in transactions of 10,000; values are msgpack
  strings of 100 characters (50 random hex + 50 repeated), keys ``key000000000``..., one
  collection;
* ``small``: ``--small-ops`` puts (default 100,000), one op per transaction, same values;
* ``records``: ``--records-ops`` (default 20,000) JSON-like order records in transactions of
  100, to check the zstd setting on text-like values.

Figures, each a median of ``--runs`` runs (default 5):

* v2 blocks (``syncpack/format/blocks.py``), sealed every ``--block-ops`` ops at transaction ends:
  bytes, encode time, verify (signature + body hash), ``decode_block`` into columns, into rows
  ``(collection, key, csn, value)`` for ``executemany``, and into ``Op`` objects;
* the same columns as Arrow IPC (the alternative considered): bytes, decode to Python lists;
* the block body at other zstd levels (bytes and decode time);
* SQLite session extension (apsw): patchset and changeset of the same rows, raw and zstd-3.

    .venv/bin/python tools/bench_blocks.py                    # both workloads, 5 runs
    .venv/bin/python tools/bench_blocks.py --ops 20000 --small-ops 2000 --runs 1   # smoke
    .venv/bin/python tools/bench_blocks.py --json             # one JSON document

Speed is measured here only, never asserted in tests.
"""

from __future__ import annotations

import argparse
import gc
import io
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import msgpack  # noqa: E402
import zstandard  # noqa: E402
from cryptography.hazmat.primitives import serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey  # noqa: E402

from syncpack.format import codec  # noqa: E402
from syncpack.format import blocks
from syncpack.format.codec import Op  # noqa: E402
from syncpack.format.csn import next_hlc  # noqa: E402

ORIGIN = b"BENCH-OR"
PEER = b"BENCH-PR"
FAMILY = b"bench-family-v2!"
COLLECTION = "bench"
REPEAT = ("syncpack-bench;" * 4)[:50]
SEED = 13
T0_MS = 1_700_000_000_000
KEY = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))
PUB = KEY.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def workload(n: int, txn_ops: int, us_per_op: float = 5.0) -> list[Op]:
    """Clocks as csn.next_hlc issues them to a writer doing one op every ``us_per_op``
    microseconds: the hlc delta of a transaction is 1 within a millisecond, else the
    milliseconds elapsed << 16 less the logical counter."""
    rnd = random.Random(SEED)
    ops = []
    hlc = 0
    for i in range(n):
        seq = i % txn_ops
        if seq == 0:
            hlc = next_hlc(hlc, T0_MS + int(i * us_per_op) // 1000)
        value = codec.encode_value(rnd.randbytes(25).hex() + REPEAT)
        ops.append(Op(ORIGIN, i + 1, hlc, seq, COLLECTION, f"key{i:09d}", value, b""))
    return ops


CPU: dict[str, float] = {}


WORDS = ("alpha beta gamma delta order customer shipped pending invoice total amount street "
         "city berlin paris london note urgent").split()


def records_workload(n: int, txn_ops: int = 100) -> list[Op]:
    """Text-like values (JSON-ish order records), to check that the zstd setting chosen on the
    half-random values does not hurt ordinary data."""
    rnd = random.Random(SEED)
    ops, hlc = [], 0
    for i in range(n):
        seq = i % txn_ops
        if seq == 0:
            hlc = next_hlc(hlc, T0_MS + i // 10)
        value = codec.encode_value({
            "id": i, "name": f"user{rnd.randrange(10**6)}",
            "email": f"u{rnd.randrange(10**6)}@example.com",
            "status": rnd.choice(["open", "closed", "pending"]),
            "amount": round(rnd.random() * 1000, 2),
            "note": " ".join(rnd.choice(WORDS) for _ in range(rnd.randrange(3, 12)))})
        ops.append(Op(ORIGIN, i + 1, hlc, seq, "orders", f"order/{i:08d}", value, b""))
    return ops


def median_time(fn, runs: int, label: str = "") -> tuple[float, object]:
    """Median wall time of ``runs`` calls; the median CPU time goes to CPU[label] (on a shared
    machine the CPU time is the steadier of the two)."""
    times, cpu, out = [], [], None
    for _ in range(runs):
        out = None
        gc.collect()
        t, c = time.perf_counter(), time.process_time()
        out = fn()
        times.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    if label:
        CPU[label] = statistics.median(cpu)
    return statistics.median(times), out


def seal_points(ops: list[Op], block_ops: int) -> list[tuple[int, int]]:
    """Cut ops into blocks of about block_ops ops, only where a transaction starts."""
    cuts, start = [], 0
    for i in range(1, len(ops) + 1):
        if i == len(ops) or (i - start >= block_ops and ops[i].seq == 0):
            cuts.append((start, i))
            start = i
    return cuts


# --- v2 blocks ----------------------------------------------------------------------------------

def encode_blocks(ops: list[Op], cuts, level=None) -> list[bytes]:
    out, prev = [], blocks.ZERO_HASH
    for a, b in cuts:
        raw = blocks.encode_block(FAMILY, ORIGIN, prev, ops[a:b], KEY.sign, level=level)
        out.append(raw)
        prev = blocks.block_hash(FAMILY, raw[:blocks.SIGNED_LEN])
    return out


def verify_all(bl: list[bytes]) -> int:
    prev = blocks.ZERO_HASH
    for raw in bl:
        prev = blocks.verify_block(raw, PUB, FAMILY, prev).block_hash
    return len(bl)


def decode_columns(bl: list[bytes]) -> int:
    return sum(blocks.decode_block(raw).hi - 0 for raw in bl)


def decode_rows(bl: list[bytes]) -> int:
    """As an importer would: each block's rows go to executemany and are dropped."""
    n = 0
    for raw in bl:
        n += len(blocks.decode_block(raw).rows())
    return n


def decode_ops(bl: list[bytes]) -> int:
    n = 0
    for raw in bl:
        n += len(list(blocks.decode_ops(raw)))
    return n


def all_rows(bl: list[bytes]) -> list[tuple]:
    return [r for raw in bl for r in blocks.decode_block(raw).rows()]


def all_ops(bl: list[bytes]) -> list[Op]:
    return [o for raw in bl for o in blocks.decode_ops(raw)]


# --- Arrow IPC, the alternative -----------------------------------------------------------------

def arrow_encode(ops: list[Op], cuts) -> list[bytes]:
    import pyarrow as pa
    out = []
    for a, b in cuts:
        chunk = ops[a:b]
        tbl = pa.table({
            "collection": pa.array([o.collection for o in chunk]).dictionary_encode(),
            "key": pa.array([o.key for o in chunk], pa.string()),
            "value": pa.array([o.value for o in chunk], pa.binary()),
            "replaced": pa.array([o.replaced for o in chunk], pa.binary()),
        })
        s = io.BytesIO()
        with pa.ipc.new_stream(s, tbl.schema, options=pa.ipc.IpcWriteOptions(
                compression=pa.Codec("zstd", compression_level=3))) as w:
            w.write_table(tbl)
        out.append(s.getvalue())
    return out


def arrow_decode(bl: list[bytes]) -> int:
    import pyarrow as pa
    n = 0
    for raw in bl:
        t = pa.ipc.open_stream(raw).read_all()
        cols = [t.column(i).to_pylist() for i in range(t.num_columns)]
        n += len(cols[0])
    return n


# --- SQLite session extension ---------------------------------------------------------------------

def session_sizes(ops: list[Op], tmp: Path) -> dict:
    import apsw
    db = apsw.Connection(str(tmp / f"session-{len(ops)}-{time.monotonic_ns()}.db"))
    db.execute("CREATE TABLE records(collection TEXT, key TEXT, value BLOB, "
               "PRIMARY KEY(collection, key))")
    s = apsw.Session(db, "main")
    s.attach("records")
    with db:
        db.executemany("INSERT INTO records VALUES (?, ?, ?)",
                       ((o.collection, o.key, o.value) for o in ops))
    patch, change = s.patchset(), s.changeset()
    s.close()
    db.close()
    zc = zstandard.ZstdCompressor(level=3)
    return {"patchset_bytes": len(patch), "patchset_zstd3_bytes": len(zc.compress(patch)),
            "changeset_bytes": len(change), "changeset_zstd3_bytes": len(zc.compress(change))}


# --- one workload -------------------------------------------------------------------------------

def run(name: str, ops: list[Op], block_ops: int, runs: int, tmp: Path) -> dict:
    n = len(ops)
    res: dict = {"ops": n, "transactions": sum(1 for o in ops if o.seq == 0)}
    cuts = seal_points(ops, block_ops)
    t, bl = median_time(lambda: encode_blocks(ops, cuts), runs, "v2_encode")
    res["blocks"] = len(bl)
    res["v2_encode_s"] = t
    res["v2_bytes"] = sum(map(len, bl))
    res["v2_body_bytes"] = sum(len(b) - blocks.HEADER_LEN for b in bl)
    res["v2_raw_bytes"] = sum(blocks.read_block_header(b).raw_len for b in bl)
    res["v2_verify_s"], _ = median_time(lambda: verify_all(bl), runs, "v2_verify")
    res["v2_decode_columns_s"], _ = median_time(lambda: decode_columns(bl), runs,
                                              "v2_decode_columns")
    rows = all_rows(bl)         # correctness first, outside the timings
    assert [r[3] for r in rows] == [o.value for o in ops] and \
        [r[2] for r in rows] == [o.csn for o in ops]
    del rows
    assert all_ops(bl) == ops
    res["v2_decode_rows_s"], _ = median_time(lambda: decode_rows(bl), runs, "v2_decode_rows")
    res["v2_decode_ops_s"], _ = median_time(lambda: decode_ops(bl), runs, "v2_decode_ops")

    ab = arrow_encode(ops, cuts)
    res["arrow_ipc_zstd3_bytes"] = sum(map(len, ab))
    res["arrow_decode_lists_s"], _ = median_time(lambda: arrow_decode(ab), runs,
                                                 "arrow_decode_lists")

    levels = {}
    variants = {"1": 1, "3": 3, "3 min_match 7": None, "6": 6, "9": 9}
    for label, level in variants.items():
        lb = bl if level is None else None
        et = 0.0
        if lb is None:
            et, lb = median_time(lambda: encode_blocks(ops, cuts, level), 1)
        dt, _ = median_time(lambda: decode_columns(lb), max(1, runs // 2))
        levels[label] = {"bytes_per_op": sum(map(len, lb)) / n, "decode_columns_s": dt,
                         "encode_s": et or res["v2_encode_s"]}
    res["zstd_levels"] = levels
    res["cpu_s"] = dict(CPU)
    CPU.clear()
    res["session"] = session_sizes(ops, tmp)
    pz = res["session"]["patchset_zstd3_bytes"]
    res["ratios"] = {
        "v2_bytes_vs_patchset_zstd3": res["v2_bytes"] / pz,
        "arrow_bytes_vs_v2": res["arrow_ipc_zstd3_bytes"] / res["v2_bytes"],
    }
    return res


def report(name: str, r: dict) -> None:
    n = r["ops"]
    per = lambda b: f"{b:>12,} B  {b / n:6.2f} B/op"        # noqa: E731
    rate = lambda s: f"{s:8.3f} s  {n / s / 1e3:8.0f} k ops/s"  # noqa: E731
    cpu = r["cpu_s"]
    s = r["session"]
    print(f"\n== {name}: {n:,} ops in {r['transactions']:,} transactions, {r['blocks']} blocks")
    print(f"  v2 blocks (whole)            {per(r['v2_bytes'])}")
    print(f"  v2 bodies (raw {r['v2_raw_bytes'] / n:.1f} B/op)     {per(r['v2_body_bytes'])}")
    print(f"  Arrow IPC, zstd-3 buffers    {per(r['arrow_ipc_zstd3_bytes'])}")
    print(f"  session patchset raw         {per(s['patchset_bytes'])}")
    print(f"  session patchset zstd-3      {per(s['patchset_zstd3_bytes'])}")
    print(f"  session changeset zstd-3     {per(s['changeset_zstd3_bytes'])}")
    for label, key in (("v2 encode (incl. signing)", "v2_encode"),
                       ("v2 verify (sig + body hash)", "v2_verify"),
                       ("v2 decode -> columns", "v2_decode_columns"),
                       ("v2 decode -> rows", "v2_decode_rows"),
                       ("v2 decode -> Op objects", "v2_decode_ops"),
                       ("Arrow IPC -> Python lists", "arrow_decode_lists")):
        print(f"  {label:29s}{rate(r[key + '_s'])}, CPU {cpu[key]:.3f} s")
    for lv, d in r["zstd_levels"].items():
        print(f"  zstd level {lv:14s} {d['bytes_per_op']:6.2f} B/op, encode {d['encode_s']:.3f} s, "
              f"decode -> columns {d['decode_columns_s']:.3f} s")
    for k, v in r["ratios"].items():
        print(f"  {k:32s} {v:6.3f}x")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", type=int, default=1_000_000)
    ap.add_argument("--small-ops", type=int, default=100_000)
    ap.add_argument("--records-ops", type=int, default=20_000,
                    help="text-like records in transactions of 100 (0: skip)")
    ap.add_argument("--txn-ops", type=int, default=10_000)
    ap.add_argument("--block-ops", type=int, default=10_000,
                    help="seal a block at the first transaction end after this many ops")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    out = {"zstd_library": ".".join(map(str, zstandard.ZSTD_VERSION)),
           "msgpack": ".".join(map(str, msgpack.version)), "cpus": os.cpu_count(),
           "runs": a.runs, "block_ops": a.block_ops}
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        for name, n, make in (("bulk", a.ops, lambda n: workload(n, a.txn_ops)),
                              ("small", a.small_ops, lambda n: workload(n, 1)),
                              ("records", a.records_ops, records_workload)):
            if n:
                out[name] = run(name, make(n), a.block_ops, a.runs, tmp)
                if not a.json:
                    report(name, out[name])
    if a.json:
        print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
