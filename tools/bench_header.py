#!/usr/bin/env python3
"""What a packet header costs in a large family: the sender's vector, its own signed
acknowledgement, and the members' acknowledgements it relays (docs/design.md §4: O(sites), not
O(sites²)).

Builds one real site whose roster holds N members (each with its own Ed25519 key), whose vector
holds an epoch of every member, and which holds every member's signed acknowledgement, as a hub
does after a round; then plans a packet to one peer with the exporter's own code and reports
the encoded header size, and how many packets it takes until the peer has had every member's
newest acknowledgement.

Format v2: an export must carry what the peer lacks as its origins' signed blocks, so the hub
holds, for every member, one block signed by that member with its newest epochs (from just below
the lowest epoch any acknowledgement reports, so the op each range continues is held and the
header carries its anchor, as at a hub with the whole history).  The first header thus has a
range and an anchor for every origin, the worst case.

    python tools/bench_header.py --members 1000
"""

from __future__ import annotations

import argparse
from dataclasses import replace
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey  # noqa: E402
from cryptography.hazmat.primitives import serialization  # noqa: E402

from syncpack.exchange import sync  # noqa: E402
from syncpack.format import blocks, codec, keys
from syncpack.store import chain
from syncpack.store import forks as fork_store  # noqa: E402
from syncpack.format.codec import Op  # noqa: E402
from syncpack.exchange.links import raise_matrix, store_acknowledgements  # noqa: E402
from syncpack.site import ROSTER, Member, Site  # noqa: E402


def raw_pub(k: Ed25519PrivateKey) -> bytes:
    return k.public_key().public_bytes(serialization.Encoding.Raw,
                                       serialization.PublicFormat.Raw)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--members", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--changed", type=float, default=1.0,
                    help="fraction of origins in which a member's acknowledgement differs from "
                         "the hub's vector (1.0: all, the worst case)")
    ap.add_argument("--forks", type=int, default=0,
                    help="pieces of fork evidence the hub holds (each travels as two signed "
                         "block headers, docs/design.md §3.10; at most 16 go per header)")
    args = ap.parse_args()
    rnd = random.Random(args.seed)
    n = args.members
    with tempfile.TemporaryDirectory() as tmp:
        hub = Site.init_family(Path(tmp) / "hub", "big", "hub")
        others = []
        with hub.transaction(_system=True) as tx:
            for i in range(n - 1):
                k = Ed25519PrivateKey.generate()
                m = Member(f"s{i:04d}", rnd.randbytes(8), raw_pub(k), b"", 0, {}, False)
                tx.write_raw(ROSTER, m.name, codec.encode_value(m.to_value()))
                others.append((m, k))
        hub.invalidate()
        # every member wrote a little; the hub holds all of it
        vec = {m.site_id: rnd.randint(1_000, 5_000_000) for m, _k in others}
        vec[hub.site_id] = hub.vector()[hub.site_id]
        with hub.write_txn() as c:
            c.executemany("INSERT OR REPLACE INTO vector(origin, epoch) VALUES (?, ?)",
                          list(vec.items()))
            now = int(time.time() * 1000)
            acks = []
            for m, k in others:
                v = {o: max(0, e - rnd.randint(1, 500)) if rnd.random() < args.changed else e
                     for o, e in vec.items()}
                acks.append((m.site_id, now, v,
                             k.sign(codec.ack_signed_bytes(hub.family_id, m.site_id, now, v))))
            store_acknowledgements(hub, acks)
        with hub.write_txn() as c:
            # what an export would carry: our own pending ops sealed, every member's newest
            # epochs as a block of its own (one transaction of tiny ops; the header does not
            # depend on what the ops hold)
            hub.seal_pending()
            lowest = {}
            for _m, _c, v, _s in acks:
                for o, e in v.items():
                    lowest[o] = min(lowest.get(o, e), e)
            hlc = now << 16
            for m, k in others:
                hi = vec[m.site_id]
                lo = max(1, lowest.get(m.site_id, hi) - 1)
                # the op at epoch lo, in a block of its own, and what follows it: a range to
                # the peer then starts at a block's end and carries its anchor
                prev = blocks.ZERO_HASH
                for a, b, h in ((lo - 1, lo, hlc - 1), (lo, hi, hlc)):
                    ops = [Op(m.site_id, e, h, e - a - 1, "bench", f"k{e}", b"\xc0", b"")
                           for e in range(a + 1, b + 1)]
                    raw = blocks.encode_block(hub.family_id, m.site_id, prev, ops, k.sign)
                    info = blocks.read_block_header(raw, hub.family_id)
                    chain.store_block(c, info, len(ops) - 1)
                    prev = info.block_hash
        with hub.write_txn() as c:
            # fork evidence: pairs of (shape-correct) signed headers, as 'forks' carries them
            for i in range(args.forks):
                m, _k = others[1 + i % (len(others) - 1)]
                a, b = rnd.randbytes(186), rnd.randbytes(186)
                fork_store.record(c, m.site_id, i + 1, min(a, b), max(a, b), now)
        peer = others[0][0]
        with hub.write_txn():
            # the peer's last packet told us what it holds (its own acknowledgement), as after
            # a round: the packet to it carries only what it lacks
            raise_matrix(hub, peer.site_id, "acked",
                         next(v for m, _c, v, _s in acks if m == peer.site_id))
        sign = keys.load_signing_key(hub.path).sign
        sizes, relayed = [], set()
        t0 = time.perf_counter()
        while True:
            [plan] = sync.plan_exports(hub, [peer.site_id], int(time.time() * 1000), sign=sign)
            # the header of the packet's one part: the template with the ranges it carries
            h = replace(plan.template, ranges=plan.ranges)
            wire = codec.packb(h.to_wire(h.origin_table()))
            sizes.append(len(wire))
            if len(sizes) == 1:
                parts = {f: len(codec.packb(v)) for f, v in h.to_wire(h.origin_table()).items()
                         if f in ("origins", "vector", "ranges", "anchors", "acks", "heads",
                                  "forks")}
                bare = replace(h, ranges={}, anchors={})
                bare_size = len(codec.packb(bare.to_wire(bare.origin_table())))
            new = {m for m, _c, _v, _s in h.acks if m not in (hub.site_id, peer.site_id)}
            relayed |= new
            sync.record_exports(hub, [(plan, [])], int(time.time() * 1000))
            if not new or len(relayed) >= n - 2:
                break
        dt = time.perf_counter() - t0
        vec_only = len(codec.packb([[i, e] for i, e in enumerate(vec.values())]))
        print(f"family of {n} members; acknowledgements differ from the hub's vector in "
              f"{args.changed:.0%} of origins")
        print(f"  header vector alone:              {vec_only / 1024:8.1f} KiB")
        print(f"  first header (vector, ranges, anchors, own ack, relayed acks): "
              f"{sizes[0] / 1024:8.1f} KiB")
        print("    of which " + ", ".join(f"{f} {b / 1024:.1f} KiB" for f, b in parts.items()))
        print(f"  first header without ranges and anchors (what this tool measured before "
              f"format 2): {bare_size / 1024:.1f} KiB")
        print(f"  largest header:                   {max(sizes) / 1024:8.1f} KiB")
        print(f"  packets until the peer has every member's newest acknowledgement: "
              f"{len(sizes)} ({len(relayed)} relayed, "
              f"{dt / len(sizes) * 1000:.0f} ms to plan each)")
        print(f"  with full vectors and no budget it would be one header of ~"
              f"{(sizes[0] + (n - 2) * (96 + 9 * n)) / 1024 / 1024:.1f} MiB")


if __name__ == "__main__":
    main()
