#!/usr/bin/env python3
"""Packet bytes of one-field updates: how much a change of one small field of a
~1 KB JSON record costs on the medium, sent as a patch against sent whole.

Two sites; ``--records`` records of about 1 KB each (20 fields of random text, so zstd cannot
shrink them much) written into two collections, ``parts`` under ``merge`` and ``whole`` under
``lww``, and sent to the peer; then one small field (``qty``) of every record changed at the
origin, in ``parts`` (each op a patch: only the field it changed, formats/VALUES.md) and then in
``whole`` (each op the whole record, as every update travelled before patches), each update
exported on its own.  Printed: packet bytes of the load and of both updates, per record, and
``patch_to_whole``, the patch update's bytes over the whole-record update's (the target:
<= 0.15).

    .venv/bin/python tools/bench_field_update.py                  # 1000 records
    .venv/bin/python tools/bench_field_update.py --records 200 --json
"""

from __future__ import annotations

import argparse
import json
import random
import string
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from syncpack.exchange import replica, sync  # noqa: E402
from syncpack.site import Site  # noqa: E402


def _record(rng: random.Random, i: int) -> dict:
    rec = {f"f{j:02d}": "".join(rng.choice(string.ascii_letters) for _ in range(42))
           for j in range(20)}
    rec["qty"] = i
    return rec


def _packet_bytes(src: Site, peer: str, out: Path) -> int:
    out.mkdir(parents=True)
    return sum(p.path.stat().st_size for p in sync.export(src, out, to=[peer]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=1000)
    ap.add_argument("--json", action="store_true", help="print one JSON document")
    args = ap.parse_args()
    rng = random.Random(22)
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        Site.init_family(root / "a", "bench", "a").close()
        b, pub = Site.keygen(root / "b", "b")
        b.close()
        with Site.open(root / "a") as a:
            replica.mkreplica_export(a, "b", pub, root / "m0", 0)
        with Site.open(root / "b", require_joined=False) as b:
            replica.mkreplica_import(b, [root / "m0"])
        recs = [_record(rng, i) for i in range(args.records)]
        with Site.open(root / "a") as a:
            with a.transaction() as tx:
                tx.set_policy("parts", "merge")
            with a.transaction() as tx:
                for i, r in enumerate(recs):
                    tx.put("parts", f"p{i:06d}", r)
            load = _packet_bytes(a, "b", root / "m1")
            with a.transaction() as tx:
                for i, r in enumerate(recs):
                    tx.put("whole", f"p{i:06d}", r)
            _packet_bytes(a, "b", root / "m1w")
        with Site.open(root / "b") as b:
            sync.import_packets(b, sorted((root / "m1").rglob("*.spk")))
            sync.import_packets(b, sorted((root / "m1w").rglob("*.spk")))
        updates = {}
        for coll in ("parts", "whole"):
            with Site.open(root / "a") as a:
                with a.transaction() as tx:
                    for i, r in enumerate(recs):
                        tx.put(coll, f"p{i:06d}", dict(r, qty=r["qty"] + 1))
                updates[coll] = _packet_bytes(a, "b", root / f"m2{coll}")
            with Site.open(root / "b") as b:
                sync.import_packets(b, sorted((root / f"m2{coll}").rglob("*.spk")))
        with Site.open(root / "a") as a, Site.open(root / "b") as b:
            if a.digest() != b.digest() or b.get("parts", "p000000") != dict(recs[0], qty=1):
                sys.exit("the peer does not hold what the origin holds")
    update, whole = updates["parts"], updates["whole"]
    doc = {"records": args.records, "record_bytes": len(json.dumps(recs[0])),
           "load_packet_bytes": load, "update_packet_bytes": update,
           "whole_update_packet_bytes": whole,
           "load_bytes_per_record": round(load / args.records, 1),
           "update_bytes_per_record": round(update / args.records, 1),
           "whole_update_bytes_per_record": round(whole / args.records, 1),
           "update_to_load": round(update / load, 3),
           "patch_to_whole": round(update / whole, 3), "target": 0.15}
    if args.json:
        print(json.dumps(doc))
    else:
        for k, v in doc.items():
            print(f"{k:24} {v}")


if __name__ == "__main__":
    main()
