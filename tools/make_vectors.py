#!/usr/bin/env python3
"""Regenerate the golden packets of format v1 in ``formats/vectors/``, deterministically.

No site store is involved: keys come from fixed seeds, site ids, family id, clocks and the
packet-id seed are constants, and the ops and snapshot records are written by hand.  The packets
are produced by the same code the exporter uses (``packets.build_update_packets`` for update
packets; for the snapshot the steps of ``replica.write_snapshot``, with ``codec.BodyWriter`` and
``codec.finish_packet``), so a change to the encoder that changes bytes shows up as a diff here.

Each vector is ``NAME.spk`` (the packet) and ``NAME.json`` (what a reader must decode from it:
layout, header map as on the wire with bytes in hex, signer's public key, ops or records).
``formats/PACKET.md`` is the specification; ``tests/test_golden.py`` reads these files and
reproduces them byte for byte by calling :func:`write_vectors`.

Usage::

    python tools/make_vectors.py                  # rewrite formats/vectors/
    python tools/make_vectors.py --out DIR        # write elsewhere (e.g. to compare)
    python tools/make_vectors.py --hexdump NAME   # print the dump used in PACKET.md

The compressed body depends on the zstd library (level 3); the version used is recorded in each
``.json`` as ``zstd_library``.  Ed25519 (RFC 8032) and msgpack encoding are deterministic.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any, BinaryIO, Callable

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import zstandard  # noqa: E402
from cryptography.hazmat.primitives import serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey  # noqa: E402
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey  # noqa: E402

from syncpack import codec, packets  # noqa: E402
from syncpack.codec import Header, Op, Record  # noqa: E402
from syncpack.csn import hlc_from_ms, pack_csn  # noqa: E402
from syncpack.site import FAMILY, FAMILY_KEY, ROSTER, Member  # noqa: E402

VECTOR_DIR = ROOT / "formats" / "vectors"
PREFIX = "v1-"   # vectors of a later format version get their own prefix, side by side

# --- fixed identities -------------------------------------------------------------------------

# Ed25519 seeds.  alpha and bravo use the secret keys of RFC 8032 section 7.1, TEST 1 and
# TEST 2, so their public keys can be checked against the RFC.
ED25519_SEEDS = {
    "alpha": bytes.fromhex("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60"),
    "bravo": bytes.fromhex("4ccd089b28ff96da9db6c346ec114e0f5b8a319f35aba624da8cf6ed4fb8a6fb"),
    "charlie": bytes(range(0x00, 0x20)),
    "delta": bytes(range(0x20, 0x40)),
    "echo": bytes(range(0x40, 0x60)),
}
X25519_SEEDS = {name: hashlib.blake2b(b"golden x25519 " + name.encode(), digest_size=32).digest()
                for name in ED25519_SEEDS}

# Site ids are 8 random bytes in real life; here readable ASCII, so hexdumps show them.
SITE_IDS = {
    "alpha": b"SITE-AAA",
    "bravo": b"SITE-BBB",
    "charlie": b"SITE-CCC",
    "delta": b"SITE-DDD",
    "echo": b"SITE-EEE",
}
PRIORITIES = {"alpha": 10, "bravo": 0, "charlie": 5, "delta": 0, "echo": 0}
A, B, C, D, E = (SITE_IDS[n] for n in ("alpha", "bravo", "charlie", "delta", "echo"))

FAMILY_ID = b"golden-family-01"                 # 16 bytes
FAMILY_NAME = "golden"
PACKET_ID_SEED = b"syncpack golden vectors v1"
T0_MS = 1_700_000_000_000                       # 2023-11-14T22:13:20Z
CREATED_MS = T0_MS + 60_000


def signing_key(name: str) -> Ed25519PrivateKey:
    return Ed25519PrivateKey.from_private_bytes(ED25519_SEEDS[name])


def public_key(name: str) -> bytes:
    return signing_key(name).public_key().public_bytes(serialization.Encoding.Raw,
                                                       serialization.PublicFormat.Raw)


def x25519_public(name: str) -> bytes:
    k = X25519PrivateKey.from_private_bytes(X25519_SEEDS[name])
    return k.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def name_of(site_id: bytes) -> str:
    return {v: k for k, v in SITE_IDS.items()}[site_id]


def hlc(ms_after_t0: int, counter: int = 0) -> int:
    return hlc_from_ms(T0_MS + ms_after_t0) | counter


def val(obj: Any) -> bytes:
    return codec.encode_value(obj)


def noise(label: str, n: int) -> bytes:
    """Incompressible but reproducible bytes (so the split vector really needs two parts)."""
    return hashlib.shake_256(b"golden noise " + label.encode()).digest(n)


# --- the hand-made ops ------------------------------------------------------------------------

T1, T2, T3, T4, T5 = hlc(1_000), hlc(2_000), hlc(2_000, 1), hlc(3_000), hlc(4_000)


def basic_ops() -> list[Op]:
    """Seven ops of two origins in CSN order: a two-op transaction, an overwrite that names the
    version it replaced, a delete, two concurrent writes with the same hlc (two transactions:
    a transaction is identified by hlc *and* origin), and a resolution that supersedes both."""
    return [
        Op(A, 1, T1, 0, "notes", "n1", val({"text": "hello"}), b""),
        Op(A, 2, T1, 1, "notes", "n2", val([1, 2, 3]), b""),
        Op(C, 1, T2, 0, "notes", "n1", val({"text": "hello, world"}), pack_csn(T1, A, 0)),
        Op(A, 3, T3, 0, "notes", "n2", None, pack_csn(T1, A, 1)),
        Op(A, 4, T4, 0, "tasks", "t1", val({"done": False, "n": 7}), b""),
        Op(C, 2, T4, 0, "tasks", "t1", val({"done": True, "n": 7}), b""),
        Op(A, 5, T5, 0, "tasks", "t1", val({"done": True, "n": 8}),
           pack_csn(T4, A, 0) + pack_csn(T4, C, 0)),
    ]


T6, T7, T8, T9 = hlc(5_000), hlc(6_000), hlc(7_000), hlc(8_000)
SPLIT_MAX_SIZE = 4096      # the smallest --max-size the CLI accepts


def split_ops() -> list[Op]:
    """Epochs 6..9 of alpha: a 1500-byte value, then one transaction of two 1000-byte values
    (the first of them alone would still fit the first part; the transaction as a whole does
    not, so it moves to part 1 whole), then a small op."""
    return [
        Op(A, 6, T6, 0, "blobs", "b1", val(noise("b1", 1500)), b""),
        Op(A, 7, T7, 0, "blobs", "b2", val(noise("b2", 1000)), b""),
        Op(A, 8, T7, 1, "blobs", "b3", val(noise("b3", 1000)), b""),
        Op(A, 9, T8, 0, "blobs", "b1", None, pack_csn(T6, A, 0)),
    ]


def sealed_ops() -> list[Op]:
    """Epochs 10 and 11 of alpha, one transaction, sent sealed to bravo."""
    return [
        Op(A, 10, T9, 0, "secrets", "s1", val({"pin": "0000"}), b""),
        Op(A, 11, T9, 1, "secrets", "s2", val("attack at dawn"), b""),
    ]


# --- writing ----------------------------------------------------------------------------------

def file_opener(directory: Path, name_for: Callable[[int], str]) -> packets.Opener:
    """Plain files (the tests compare bytes; durability does not matter here)."""

    def opener(part: int) -> tuple[BinaryIO, Callable[[bool], Path]]:
        path = directory / name_for(part)
        f = open(path, "wb")

        def commit(ok: bool) -> Path:
            f.close()
            if not ok:
                path.unlink(missing_ok=True)
            return path

        return f, commit

    return opener


def update_template(sender: bytes, recipient: bytes, seq: int, created_ms: int,
                    vector: dict[bytes, int], recv_seq: int = 0,
                    waiting: dict[bytes, tuple[int, int]] | None = None,
                    ack_floor: dict[bytes, int] | None = None) -> Header:
    """The header template sync.plan_exports builds (ranges and per-part fields are left to
    build_update_packets)."""
    return Header(kind=codec.KIND_UPDATE, family=FAMILY_ID, sender=sender, recipient=recipient,
                  packet_id=b"", seq=seq, part=0, final=True, created_ms=created_ms,
                  vector=vector, recv_seq=recv_seq, waiting=waiting or {},
                  ack_floor=ack_floor or {})


def write_update(directory: Path, name: str, ops: list[Op], template: Header, signer: str,
                 max_size: int = packets.DEFAULT_MAX_SIZE,
                 seal_to: bytes | None = None) -> list[packets.PartInfo]:
    """One export: part 0 is NAME.spk when it is the only part, else NAME-pN.spk."""
    staged = directory / f".{name}"
    staged.mkdir(parents=True, exist_ok=True)
    parts = packets.build_update_packets(ops, template, signing_key(signer).sign, max_size,
                                         file_opener(staged, lambda p: f"{p}.spk"),
                                         seed=PACKET_ID_SEED, seal_to=seal_to)
    for p in parts:
        final = directory / (f"{name}.spk" if len(parts) == 1 else f"{name}-p{p.header.part}.spk")
        p.path.replace(final)
        p.path = final
    staged.rmdir()
    return parts


def snapshot_roster() -> list[dict]:
    return [{"name": n, "id": SITE_IDS[n], "ed25519": public_key(n), "x25519": x25519_public(n),
             "priority": PRIORITIES[n]} for n in SITE_IDS]


def snapshot_records() -> list[Record]:
    """A state with system records, a tombstone and a key with two surviving versions (a
    conflict).  Hand-made to exercise the encoding; not the replay of the update vectors."""
    recs = [Record(FAMILY, FAMILY_KEY, pack_csn(hlc(0), A, 0),
                   val({"name": FAMILY_NAME, "policy": "lww"}))]
    for i, n in enumerate(SITE_IDS):
        m = Member(n, SITE_IDS[n], public_key(n), x25519_public(n), PRIORITIES[n],
                   {} if n == "alpha" else {A: 1 + i}, False)
        recs.append(Record(ROSTER, n, pack_csn(hlc(0) if n == "alpha" else hlc(100 * i), A,
                                               1 if n == "alpha" else 0), val(m.to_value())))
    recs += [
        Record("notes", "n1", pack_csn(T2, C, 0), val({"text": "hello, world"})),
        Record("notes", "n2", pack_csn(T3, A, 0), None),
        Record("tasks", "t1", pack_csn(T4, A, 0), val({"done": False, "n": 7})),
        Record("tasks", "t1", pack_csn(T4, C, 0), val({"done": True, "n": 7})),
    ]
    # The order of Site.iter_versions: (collection, key, csn).
    return sorted(recs, key=lambda r: (r.collection.encode(), r.key.encode(), r.csn))


def write_snapshot(directory: Path, name: str, records: list[Record], *, sender: bytes,
                   recipient: bytes, seq: int, created_ms: int, vector: dict[bytes, int],
                   hlc_max: int, signer: str,
                   max_size: int = packets.DEFAULT_MAX_SIZE) -> list[tuple[Path, Header, int]]:
    """replica.write_snapshot without a store: same template, budget, cutting and finishing."""
    roster = snapshot_roster()
    tmpl = Header(kind=codec.KIND_SNAPSHOT, family=FAMILY_ID, sender=sender, recipient=recipient,
                  packet_id=b"", seq=seq, part=0, final=False, created_ms=created_ms,
                  vector=vector, roster=roster, hlc_max=hlc_max)
    origins = tmpl.origin_table()
    budget = max_size - codec.framing_overhead() - codec.header_reserve(tmpl, origins)
    sign = signing_key(signer).sign
    out: list[tuple[Path, Header, int]] = []
    state: dict = {}

    def start(part: int) -> None:
        path = directory / (f"{name}.spk" if part == 0 else f"{name}-p{part}.spk")
        f = open(path, "wb")
        codec.start_packet(f)
        state.update(f=f, path=path, part=part, body=codec.BodyWriter(f, budget), n=0)

    def finish(final: bool) -> None:
        length, digest = state["body"].finish()
        h = Header(**{**tmpl.__dict__, "part": state["part"], "final": final,
                      "packet_id": packets.packet_id(PACKET_ID_SEED, sender, recipient, seq,
                                                     state["part"]),
                      "count": state["n"], "body_len": length, "body_hash": digest})
        size = codec.finish_packet(state["f"], h, origins, sign)
        state["f"].close()
        out.append((state["path"], h, size))

    start(0)
    for rec in records:
        raw = codec.encode_record(rec)
        if not state["body"].would_fit(len(raw)):
            if not state["n"]:
                raise ValueError("one record is larger than max_size allows")
            finish(False)
            start(state["part"] + 1)
        state["body"].write(raw)
        state["n"] += 1
    finish(True)
    return out


# --- the vectors ------------------------------------------------------------------------------

def _hex(obj: Any) -> Any:
    """The decoded header map, JSON-ready: bytes as lowercase hex strings."""
    if isinstance(obj, bytes):
        return obj.hex()
    if isinstance(obj, dict):
        return {k: _hex(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_hex(v) for v in obj]
    return obj


def _op_json(op: Op, wire: list) -> dict:
    return {"origin": op.origin.hex(), "epoch": op.epoch, "hlc": op.hlc, "seq": op.seq,
            "csn": op.csn.hex(), "collection": op.collection, "key": op.key,
            "value": None if op.value is None else op.value.hex(),
            "replaced": [op.replaced[i:i + 20].hex() for i in range(0, len(op.replaced), 20)],
            "wire": _hex(wire)}


def _record_json(rec: Record) -> dict:
    return {"collection": rec.collection, "key": rec.key, "csn": rec.csn.hex(),
            "value": None if rec.value is None else rec.value.hex(), "wire": _hex(
                [rec.collection, rec.key, rec.csn, rec.value])}


def _describe(path: Path, header: Header, origins: list[bytes], signer: str, description: str,
              ops: list[Op] | None = None, records: list[Record] | None = None) -> dict:
    data = path.read_bytes()
    hlen = int.from_bytes(data[-72:-68], "big")
    doc: dict[str, Any] = {
        "file": path.name,
        "description": description,
        "format_version": codec.FORMAT_VERSION,
        "zstd_library": ".".join(map(str, zstandard.ZSTD_VERSION)),
        "signer": signer,
        "signer_ed25519": public_key(signer).hex(),
        "layout": {"size": len(data), "body_offset": 9, "body_len": header.body_len,
                   "header_offset": len(data) - 72 - hlen, "header_len": hlen,
                   "footer_offset": len(data) - 72},
        "signature": data[-68:-4].hex(),
        "header": _hex(header.to_wire(origins)),
    }
    if ops is not None:
        wires, prev = [], 0     # the clock delta restarts at 0 in every part
        for op in ops:
            wires.append([origins.index(op.origin), op.hlc - prev, op.seq, op.collection,
                          op.key, op.value, op.replaced])
            prev = op.hlc
        doc["ops"] = [_op_json(op, w) for op, w in zip(ops, wires)]
    if records is not None:
        doc["records"] = [_record_json(r) for r in records]
    return doc


def _seal_json(path: Path, header: Header, recipient: str) -> dict:
    """What an implementer needs to check each step of unsealing: the recipient's private
    key (a test key), the derived AEAD key, and the nonce and length of each chunk."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PublicKey
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF
    from syncpack import seal
    k = X25519PrivateKey.from_private_bytes(X25519_SEEDS[recipient])
    pub = x25519_public(recipient)
    shared = k.exchange(X25519PublicKey.from_public_bytes(header.seal_epk))
    key = HKDF(algorithm=hashes.SHA256(), length=32, salt=header.seal_epk + pub,
               info=b"syncpack seal v1" + header.packet_id).derive(shared)
    body_len = header.body_len
    step = seal.CHUNK + seal.TAG
    chunks, off, n = [], 0, 0
    while body_len - off > step:
        chunks.append({"nonce": ((b"\0" + n.to_bytes(11, "big")).hex()), "len": step})
        off, n = off + step, n + 1
    chunks.append({"nonce": (b"\x01" + n.to_bytes(11, "big")).hex(), "len": body_len - off})
    return {"feature": codec.FEATURE_SEAL, "recipient": recipient,
            "recipient_x25519_private": X25519_SEEDS[recipient].hex(),
            "recipient_x25519": pub.hex(), "epk": header.seal_epk.hex(),
            "shared_secret": shared.hex(), "aead_key": key.hex(), "chunks": chunks}


def write_vectors(directory: Path) -> list[str]:
    """Write every vector into ``directory``; returns the names (without extension)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    docs: dict[str, dict] = {}

    # 1. An update packet alpha -> bravo with ops of two origins.  The origin table also holds
    #    delta, which appears only in 'waiting' (alpha holds parked packets that wait for it).
    name = PREFIX + "update-basic"
    ops = basic_ops()
    tmpl = update_template(A, B, seq=3, created_ms=CREATED_MS, vector={A: 5, C: 2},
                           recv_seq=2, waiting={D: (0, 3)}, ack_floor={A: 2, C: 1})
    (part,) = write_update(directory, name, ops, tmpl, "alpha")
    docs[name] = _describe(part.path, part.header, tmpl.origin_table(), "alpha",
                           "update alpha->bravo: 7 ops of alpha and charlie (puts, a delete, "
                           "replaced CSNs, a two-op transaction), one part", ops=ops)

    # 2. Ack-only: bravo -> alpha, no ops, only bravo's vector and what it received.
    name = PREFIX + "update-ack-only"
    tmpl = update_template(B, A, seq=1, created_ms=CREATED_MS + 60_000, vector={A: 5, C: 2},
                           recv_seq=3, ack_floor={A: 2, C: 1})
    (part,) = write_update(directory, name, [], tmpl, "bravo")
    docs[name] = _describe(part.path, part.header, tmpl.origin_table(), "bravo",
                           "update bravo->alpha without ops: an acknowledgement (count 0, empty "
                           "zstd frame)", ops=[])

    # 3. One export cut into two parts by --max-size 4096.
    name = PREFIX + "update-split"
    ops = split_ops()
    tmpl = update_template(A, B, seq=4, created_ms=CREATED_MS + 120_000, vector={A: 9, C: 2},
                           recv_seq=1, ack_floor={A: 5, C: 2})
    parts = write_update(directory, name, ops, tmpl, "alpha", max_size=SPLIT_MAX_SIZE)
    expect = [ops[:1], ops[1:]]   # the two-op transaction is not split across parts
    if [(p.header.part, p.header.count) for p in parts] != [(0, 1), (1, 3)]:
        raise RuntimeError(f"the cutting rule changed: parts "
                           f"{[(p.header.part, p.header.count) for p in parts]}")
    for p, part_ops in zip(parts, expect):
        n = f"{name}-p{p.header.part}"
        docs[n] = _describe(p.path, p.header, tmpl.origin_table(), "alpha",
                            f"update alpha->bravo, part {p.header.part} of an export cut into "
                            f"2 parts by max_size {SPLIT_MAX_SIZE}", ops=part_ops)

    # 4. A sealed update alpha -> bravo: the body is encrypted to bravo's X25519 key.  The
    #    ephemeral key derives from the packet-id seed (reproducible; random in real exports).
    name = PREFIX + "update-sealed"
    ops = sealed_ops()
    tmpl = update_template(A, B, seq=5, created_ms=CREATED_MS + 150_000, vector={A: 11, C: 2},
                           recv_seq=1, ack_floor={A: 9, C: 2})
    (part,) = write_update(directory, name, ops, tmpl, "alpha", seal_to=x25519_public("bravo"))
    doc = _describe(part.path, part.header, tmpl.origin_table(), "alpha",
                    "update alpha->bravo sealed to bravo (seal-x25519-chacha20poly1305): "
                    "2 ops, one sealed chunk", ops=ops)
    doc["seal"] = _seal_json(part.path, part.header, "bravo")
    docs[name] = doc

    # 5. A snapshot packet alpha -> echo (replica creation), one part.
    name = PREFIX + "snapshot"
    records = snapshot_records()
    ((path, hdr, _size),) = write_snapshot(directory, name, records, sender=A, recipient=E,
                                           seq=1, created_ms=CREATED_MS + 180_000,
                                           vector={A: 4, C: 2}, hlc_max=T4, signer="alpha")
    docs[name] = _describe(path, hdr, hdr.origin_table(), "alpha",
                           "snapshot alpha->echo (mkreplica): roster of 5, 10 records incl. a "
                           "tombstone and a two-version conflict", records=records)

    for n, doc in docs.items():
        (directory / f"{n}.json").write_text(json.dumps(doc, indent=1) + "\n")
    return sorted(docs)


# --- hexdumps for PACKET.md -------------------------------------------------------------------

def hexdump(data: bytes, start: int, length: int) -> str:
    """``hexdump -C`` style lines for ``data[start:start+length]`` (offsets are file offsets)."""
    lines = []
    end = min(len(data), start + length)
    for off in range(start - start % 16, end, 16):
        row = [data[i] if start <= i < end else None for i in range(off, off + 16)]
        hx = " ".join("  " if b is None else f"{b:02x}" for b in row[:8]) + "  " + \
             " ".join("  " if b is None else f"{b:02x}" for b in row[8:])
        asc = "".join(" " if b is None else (chr(b) if 32 <= b < 127 else ".") for b in row)
        lines.append(f"{off:08x}  {hx}  |{asc}|")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=VECTOR_DIR)
    ap.add_argument("--hexdump", metavar="NAME",
                    help="print the head (prefix, first body bytes) and tail (header, footer) "
                         "of vector NAME instead of writing")
    args = ap.parse_args(argv)
    if args.hexdump:
        data = (args.out / f"{args.hexdump}.spk").read_bytes()
        hlen = int.from_bytes(data[-72:-68], "big")
        print(hexdump(data, 0, 64))
        print("...")
        print(hexdump(data, len(data) - 72 - hlen, hlen + 72))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    for old in args.out.glob(PREFIX + "*"):
        old.unlink()
    for n in write_vectors(args.out):
        print(f"{args.out / n}.spk")
    return 0


if __name__ == "__main__":
    sys.exit(main())
