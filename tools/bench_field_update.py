#!/usr/bin/env python3
"""Packet bytes of one-field updates (issue 22): how much a change of one small field of a
~1 KB JSON record costs on the medium, against sending the record whole.

Two sites; a ``merge`` collection of ``--records`` records of about 1 KB each (20 fields of
random text, so zstd cannot shrink them much) written and sent to the peer; then one small field
(``qty``) of every record changed at the origin and sent again.  Printed: packet bytes of the
load and of the update, per record, and their ratio (the issue asks for <= 15% once ops carry
only the fields they changed; while an op carries the whole record it is about 100%).

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
        with Site.open(root / "b") as b:
            sync.import_packets(b, sorted((root / "m1").rglob("*.spk")))
        with Site.open(root / "a") as a:
            with a.transaction() as tx:
                for i, r in enumerate(recs):
                    tx.put("parts", f"p{i:06d}", dict(r, qty=r["qty"] + 1))
            update = _packet_bytes(a, "b", root / "m2")
    doc = {"records": args.records, "record_bytes": len(json.dumps(recs[0])),
           "load_packet_bytes": load, "update_packet_bytes": update,
           "load_bytes_per_record": round(load / args.records, 1),
           "update_bytes_per_record": round(update / args.records, 1),
           "update_to_load": round(update / load, 3)}
    if args.json:
        print(json.dumps(doc))
    else:
        for k, v in doc.items():
            print(f"{k:24} {v}")


if __name__ == "__main__":
    main()
