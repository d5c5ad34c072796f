#!/usr/bin/env python3
"""A transaction larger than the medium, through the ``syncpack`` command: one ``load`` of
``--records`` records of ``--value-bytes`` random hex each (one transaction), exported to one
peer with ``--max-size`` (parts); the packets are imported in reverse order, one command each (each
parked until the first arrives, nothing applied before).  Prints packets, bytes and
wall-clock seconds (process start included), and checks the digests are equal.

    python tools/bench_parts.py                                  # 3,000 x 400 bytes, 64K
    python tools/bench_parts.py --records 100000 --max-size 1M
    python tools/bench_parts.py --records 0 --single-bytes 5000000   # one 5 MB record: pieces

``--single-bytes N`` adds one record of N bytes of random hex (one op, a block larger than the
medium: it travels in pieces, formats/PACKET.md section 6.4); the packet bytes are then also
compared with the blocks they carry (the pieces' headers are the overhead).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=3000)
    ap.add_argument("--value-bytes", type=int, default=400)
    ap.add_argument("--max-size", default="64K")
    ap.add_argument("--single-bytes", type=int, default=0)
    args = ap.parse_args(argv)
    exe = shutil.which("syncpack", path=str(Path(sys.executable).parent)) or "syncpack"

    def sp(*a, site=None):
        cmd = [exe, "--json"] + (["--site", str(site)] if site else []) + [str(x) for x in a]
        t = time.perf_counter()
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode:
            raise SystemExit(f"{' '.join(cmd)}: {r.stderr}")
        return json.loads(r.stdout) if r.stdout.strip() else {}, time.perf_counter() - t

    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        sp("init", d / "a", "--family", "f", "--site", "a")
        sp("keygen", d / "b", "--site", "b")
        sp("mkreplica", "export", "--site", "b", "--pubkey", d / "b/keys/site.pub", "--out",
           d / "seed", "--create-out", site=d / "a")
        sp("mkreplica", "import", d / "seed", site=d / "b")
        with open(d / "r.jsonl", "w") as f:
            for i in range(args.records):
                f.write(json.dumps({"collection": "c", "key": f"k{i:08d}", "value":
                                    os.urandom(args.value_bytes // 2).hex()}) + "\n")
        t_load = 0.0
        if args.records:
            _, t_load = sp("load", d / "r.jsonl", site=d / "a")
        if args.single_bytes:
            v = d / "single.json"
            v.write_text(json.dumps({"blob": os.urandom(args.single_bytes // 2).hex()}))
            subprocess.run(
                [exe, "--site", str(d / "a"), "put", "c", "single", "-"], input=v.read_text(),
                text=True, check=True, capture_output=True)
        doc, t_exp = sp("export", "--to", "b", "--out", d / "small", "--create-out",
                        "--max-size", args.max_size, site=d / "a")
        small = [Path(p["path"]) for p in doc["packets"]]
        t_imp = 0.0
        for p in reversed(small):
            _, t = sp("import", p, site=d / "b")
            t_imp += t
        da, _ = sp("digest", site=d / "a")
        db_, _ = sp("digest", site=d / "b")
        assert da["digest"] == db_["digest"], "digests differ"
        print(f"{args.records} records x {args.value_bytes} B in one transaction "
              f"(load {t_load:.2f} s)")
        print(f"--max-size {args.max_size}: {len(small)} packets, "
              f"{sum(p.stat().st_size for p in small):,} bytes, largest "
              f"{max(p.stat().st_size for p in small):,}; export {t_exp:.2f} s; "
              f"import in reverse order, one command per packet: {t_imp:.2f} s in total")
        if args.single_bytes:
            sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
            from syncpack.site import Site
            with Site.open(d / "a") as s:
                held = s.conn.execute("SELECT sum(length(data)) FROM blocks").fetchone()[0]
            print(f"one record of {args.single_bytes:,} B: blocks {held:,} bytes, packets / "
                  f"blocks = {sum(p.stat().st_size for p in small) / held:.4f}")
        print(f"digests equal: {da['digest'][:16]}...")
    return 0


if __name__ == "__main__":
    sys.exit(main())
