#!/usr/bin/env python3
"""Regenerate the golden packets of format v2 in ``formats/vectors/``, deterministically.

No site store is involved: keys come from fixed seeds, site ids, family id, clocks and the
packet-id seed are constants, and the ops and snapshot records are written by hand.  The packets
are produced by the same code the exporter uses: each origin's ops are sealed into blocks by
``blocks.encode_block`` (chained as ``chain.seal`` chains them), put in travelling order by
``packets.order_blocks`` and written by ``packets.build_update_packets``; the snapshot follows the
steps of ``replica.write_snapshot`` (``packets.PartSeries``, ``codec.encode_record``).  A change
to the encoder that changes bytes shows up as a diff here.

Each vector is ``NAME.spk`` (the packet) and ``NAME.json`` (what a reader must decode from it:
layout, header map as on the wire with bytes in hex, signer's public key, the acknowledgements'
signed messages, and for update packets every block with its ops, for snapshots the records).
``formats/PACKET.md`` is the specification; ``tests/test_golden.py`` reads these files and
reproduces them byte for byte by calling :func:`write_vectors`.

``v1-update-legacy.spk`` is not made here: it is a packet of format 1, written by the syncpack
that preceded format 2, kept as it was so that the refusal of version 1 stays tested against a
real one.  The golden blocks ``v2-block-*`` are ``tools/make_block_vectors.py``'s.

Usage::

    python tools/make_vectors.py                  # rewrite the packet vectors in formats/vectors/
    python tools/make_vectors.py --out DIR        # write elsewhere (e.g. to compare)
    python tools/make_vectors.py --hexdump NAME   # print the dump used in PACKET.md

The compressed bytes depend on the zstd library (blocks and the snapshot body); the version used
is recorded in each ``.json`` as ``zstd_library``.  Ed25519 (RFC 8032) and msgpack encoding are
deterministic.
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

from syncpack.exchange import packets  # noqa: E402
from syncpack.format import blocks, codec
from syncpack.format.codec import Header, Op, Record  # noqa: E402
from syncpack.format.csn import hlc_from_ms, pack_csn  # noqa: E402
from syncpack.site import FAMILY, FAMILY_KEY, ROSTER, Member  # noqa: E402

VECTOR_DIR = ROOT / "formats" / "vectors"
PREFIX = "v2-"
# What write_vectors owns in VECTOR_DIR; v2-block-* belong to make_block_vectors.py.
OWN_PATTERNS = (PREFIX + "update-*", PREFIX + "snapshot*")
# The pieces of one block (PACKET.md section 6.4), written by write_piece_vectors.
PIECE_PATTERN = PREFIX + "piece-*"
# The pieces of one snapshot record (PACKET.md section 7.1), by write_record_piece_vectors.
RECORD_PIECE_PATTERN = PREFIX + "rpiece-*"
LEGACY = "v1-update-legacy"

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
PACKET_ID_SEED = b"syncpack golden vectors v2"
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


# --- the hand-made ops, as their origins sealed them into blocks --------------------------------

T1, T2, T3, T4, T5 = hlc(1_000), hlc(2_000), hlc(2_000, 1), hlc(3_000), hlc(4_000)


def basic_blocks() -> list[list[Op]]:
    """Seven ops of two origins, as three blocks: alpha's epochs 1..3 (a two-op transaction,
    then a delete naming the version it replaced), charlie's epochs 1..2 (an overwrite of
    alpha's first op; a write with the same hlc as alpha's next one: a transaction is
    identified by hlc *and* origin), and alpha's epochs 4..5 (a resolution that supersedes both
    concurrent writes), chained to alpha's first block.  The three clock ranges overlap, so an
    importer merges their ops into CSN order."""
    return [
        [Op(A, 1, T1, 0, "notes", "n1", val({"text": "hello"}), b""),
         Op(A, 2, T1, 1, "notes", "n2", val([1, 2, 3]), b""),
         Op(A, 3, T3, 0, "notes", "n2", None, pack_csn(T1, A, 1))],
        [Op(C, 1, T2, 0, "notes", "n1", val({"text": "hello, world"}), pack_csn(T1, A, 0)),
         Op(C, 2, T4, 0, "tasks", "t1", val({"done": True, "n": 7}), b"")],
        [Op(A, 4, T4, 0, "tasks", "t1", val({"done": False, "n": 7}), b""),
         Op(A, 5, T5, 0, "tasks", "t1", val({"done": True, "n": 8}),
            pack_csn(T4, A, 0) + pack_csn(T4, C, 0))],
    ]


T6, T7, T8, T9 = hlc(5_000), hlc(6_000), hlc(7_000), hlc(8_000)
SPLIT_MAX_SIZE = 4096      # the smallest --max-size the CLI accepts


def split_blocks() -> list[list[Op]]:
    """alpha's epochs 6..9 as three blocks: a 1500-byte value; one transaction of two
    1000-byte values (which does not fit beside the first block, so part 1 starts with it);
    a delete, small enough to follow it in part 1."""
    return [
        [Op(A, 6, T6, 0, "blobs", "b1", val(noise("b1", 1500)), b"")],
        [Op(A, 7, T7, 0, "blobs", "b2", val(noise("b2", 1000)), b""),
         Op(A, 8, T7, 1, "blobs", "b3", val(noise("b3", 1000)), b"")],
        [Op(A, 9, T8, 0, "blobs", "b1", None, pack_csn(T6, A, 0))],
    ]


def sealed_blocks() -> list[list[Op]]:
    """alpha's epochs 10 and 11, one transaction in one block, sent sealed to bravo."""
    return [
        [Op(A, 10, T9, 0, "secrets", "s1", val({"pin": "0000"}), b""),
         Op(A, 11, T9, 1, "secrets", "s2", val("attack at dawn"), b"")],
    ]


class Chains:
    """Each origin's chain across all vectors: one history of alpha, epochs 1..11, whatever
    packet a block travels in, so every prev_hash names a block of another vector or of the
    same one."""

    def __init__(self) -> None:
        self.last: dict[bytes, bytes] = {}

    def seal(self, ops: list[Op]) -> bytes:
        origin = ops[0].origin
        raw = blocks.encode_block(FAMILY_ID, origin, self.last.get(origin, blocks.ZERO_HASH),
                                  ops, signing_key(name_of(origin)).sign)
        self.last[origin] = blocks.read_block_header(raw, FAMILY_ID).block_hash
        return raw


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


def own_ack(member: str, created_ms: int, vector: dict[bytes, int]) -> tuple:
    """A member's signed acknowledgement of ``vector``, as sync._acks_for makes it."""
    sid = SITE_IDS[member]
    return (sid, created_ms, vector,
            signing_key(member).sign(codec.ack_signed_bytes(FAMILY_ID, sid, created_ms, vector)))


def update_template(sender: bytes, recipient: bytes, seq: int, created_ms: int,
                    vector: dict[bytes, int], recv_seq: int = 0,
                    waiting: dict[bytes, tuple[int, int]] | None = None,
                    relayed: list[tuple] | None = None, **extra) -> Header:
    """The header template sync.plan_exports builds (ranges and per-part fields are left to
    build_update_packets): the sender's own acknowledgement first, with the header's vector."""
    own = own_ack(name_of(sender), created_ms, vector)
    return Header(kind=codec.KIND_UPDATE, mandatory=[codec.FEATURE_BLOCKS], family=FAMILY_ID,
                  sender=sender, recipient=recipient, packet_id=b"", seq=seq, part=0,
                  final=True, created_ms=created_ms, vector=vector, recv_seq=recv_seq,
                  waiting=waiting or {}, acks=[(own[0], own[1], None, own[3]), *(relayed or [])],
                  **extra)


def write_update(directory: Path, name: str, raws: list[bytes], template: Header, signer: str,
                 max_size: int = packets.DEFAULT_MAX_SIZE, seal_to: bytes | None = None
                 ) -> list[tuple[packets.PartInfo, list[bytes]]]:
    """One export: part 0 is NAME.spk when it is the only part, else NAME-pN.spk.  Returns
    each part with the blocks it holds, in the order it holds them."""
    staged = directory / f".{name}"
    staged.mkdir(parents=True, exist_ok=True)
    per_origin: dict[bytes, list[packets.BlockRef]] = {}
    for raw in raws:
        ref = packets.BlockRef.of(raw)
        per_origin.setdefault(ref.origin, []).append(ref)
    ordered = packets.order_blocks(per_origin.values())
    parts = packets.build_update_packets(ordered, template, signing_key(signer).sign, max_size,
                                         file_opener(staged, lambda p: f"{p}.spk"),
                                         seed=PACKET_ID_SEED, seal_to=seal_to)
    out = []
    for p in parts:
        final = directory / (f"{name}.spk" if len(parts) == 1 else f"{name}-p{p.header.part}.spk")
        p.path.replace(final)
        p.path = final
        held = [b.data for b in ordered if b.origin in p.header.ranges
                and p.header.ranges[b.origin][0] <= b.lo < p.header.ranges[b.origin][1]]
        out.append((p, held))
    staged.rmdir()
    return out


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
                   max_size: int = packets.DEFAULT_MAX_SIZE) -> list[packets.PartInfo]:
    """replica.write_snapshot without a store: same template, series, cutting and finishing."""
    tmpl = Header(kind=codec.KIND_SNAPSHOT, family=FAMILY_ID, sender=sender, recipient=recipient,
                  packet_id=b"", seq=seq, part=0, final=False, created_ms=created_ms,
                  vector=vector, roster=snapshot_roster(), hlc_max=hlc_max)
    opener = file_opener(directory, lambda p: f"{name}.spk" if p == 0 else f"{name}-p{p}.spk")
    series = packets.PartSeries(tmpl, signing_key(signer).sign, max_size, opener,
                                PACKET_ID_SEED)
    packets.write_records(series, map(codec.encode_record, records), max_size, False)
    series.finish(True)
    return series.parts


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


def _op_json(op: Op) -> dict:
    return {"origin": op.origin.hex(), "epoch": op.epoch, "hlc": op.hlc, "seq": op.seq,
            "csn": op.csn.hex(), "collection": op.collection, "key": op.key,
            "value": None if op.value is None else op.value.hex(),
            "replaced": [op.replaced[i:i + 20].hex() for i in range(0, len(op.replaced), 20)]}


def _record_json(rec: Record) -> dict:
    return {"collection": rec.collection, "key": rec.key, "csn": rec.csn.hex(),
            "value": None if rec.value is None else rec.value.hex(), "wire": _hex(
                [rec.collection, rec.key, rec.csn, rec.value])}


def _block_json(raw: bytes, offset: int) -> dict:
    info = blocks.read_block_header(raw, FAMILY_ID)
    signer = name_of(info.origin)
    return {"offset_in_body": offset, "size": len(raw), "origin": info.origin.hex(),
            "signer": signer, "signer_ed25519": public_key(signer).hex(), "lo": info.lo,
            "hi": info.hi, "txns": info.txns, "hlc_first": info.hlc_first,
            "hlc_last": info.hlc_last, "prev_hash": info.prev_hash.hex(),
            "body_hash": info.body_hash.hex(), "raw_len": info.raw_len,
            "body_len": info.body_len, "block_hash": info.block_hash.hex(),
            "ops": [_op_json(op) for op in blocks.decode_ops(raw)]}


def _describe(path: Path, header: Header, origins: list[bytes], signer: str, description: str,
              raws: list[bytes] | None = None, records: list[Record] | None = None) -> dict:
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
    if header.acks:
        doc["acks"] = [{"member": m.hex(), "signer": name_of(m), "created": c,
                        "vector": {o.hex(): e for o, e in sorted(
                            (header.vector if v is None else v).items())},
                        "signed_message": codec.ack_signed_bytes(
                            FAMILY_ID, m, c, header.vector if v is None else v).hex()}
                       for m, c, v, _sig in header.acks]
    if raws is not None:
        doc["blocks"], off = [], 0
        for raw in raws:
            doc["blocks"].append(_block_json(raw, off))
            off += len(raw)
        # What the importer applies: the ops of blocks whose clocks overlap, merged.
        ops = [op for b in doc["blocks"] for op in b["ops"]]
        doc["ops"] = sorted(ops, key=lambda op: op["csn"])
    if records is not None:
        doc["records"] = [_record_json(r) for r in records]
    return doc


def _seal_json(path: Path, header: Header, recipient: str) -> dict:
    """What an implementer needs to check each step of unsealing: the recipient's private
    key (a test key), the derived AEAD key, and the nonce and length of each chunk."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PublicKey
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF
    from syncpack.format import seal
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
    chains = Chains()

    # 1. An update packet alpha -> bravo carrying blocks of two origins: alpha's own and
    #    charlie's, relayed (each verifies with its origin's key, not alpha's).  The origin
    #    table also holds delta, which appears only in 'waiting' (alpha holds parked packets
    #    that wait for it); 'acks' holds alpha's own acknowledgement and charlie's, relayed.
    name = PREFIX + "update-basic"
    raws = [chains.seal(ops) for ops in basic_blocks()]
    tmpl = update_template(A, B, seq=3, created_ms=CREATED_MS, vector={A: 5, C: 2},
                           recv_seq=2, waiting={D: (0, 3)}, reply=True,
                           relayed=[own_ack("charlie", CREATED_MS - 30_000, {A: 3, C: 2})])
    ((part, held),) = write_update(directory, name, raws, tmpl, "alpha")
    docs[name] = _describe(part.path, part.header, tmpl.origin_table(), "alpha",
                           "update alpha->bravo: 3 blocks, two of alpha (chained) and one of "
                           "charlie (relayed), 7 ops whose clocks interleave; one part",
                           raws=held)

    # 2. Ack-only: bravo -> alpha, no blocks (an empty body), only bravo's vector, what it
    #    received, its acknowledgement and the newest op of alpha's own origin it holds.
    name = PREFIX + "update-ack-only"
    created = CREATED_MS + 60_000
    tmpl = update_template(B, A, seq=1, created_ms=created, vector={A: 5, C: 2},
                           recv_seq=3, tip=(5, pack_csn(T5, A, 0)))
    ((part, _held),) = write_update(directory, name, [], tmpl, "bravo")
    docs[name] = _describe(part.path, part.header, tmpl.origin_table(), "bravo",
                           "update bravo->alpha without blocks: an acknowledgement (count 0, "
                           "empty body) with a tip", raws=[])

    # 3. One export cut into two parts by --max-size 4096, between blocks.  The template's
    #    anchor is the op at epoch 5 that the first range continues (as sync._anchors finds
    #    it); the second part's is the last op of the first part.
    name = PREFIX + "update-split"
    raws = [chains.seal(ops) for ops in split_blocks()]
    tmpl = update_template(A, B, seq=4, created_ms=CREATED_MS + 120_000, vector={A: 9, C: 2},
                           recv_seq=1, reply=True, anchors={A: pack_csn(T5, A, 0)})
    parts = write_update(directory, name, raws, tmpl, "alpha", max_size=SPLIT_MAX_SIZE)
    if [(p.header.part, p.header.count) for p, _held in parts] != [(0, 1), (1, 3)]:
        raise RuntimeError(f"the cutting rule changed: parts "
                           f"{[(p.header.part, p.header.count) for p, _held in parts]}")
    for p, held in parts:
        n = f"{name}-p{p.header.part}"
        docs[n] = _describe(p.path, p.header, tmpl.origin_table(), "alpha",
                            f"update alpha->bravo, part {p.header.part} of an export cut "
                            f"between blocks into 2 parts by max_size {SPLIT_MAX_SIZE}",
                            raws=held)

    # 4. A sealed update alpha -> bravo: the body (one block) is encrypted to bravo's X25519
    #    key.  The ephemeral key derives from the packet-id seed (reproducible; random in real
    #    exports).
    name = PREFIX + "update-sealed"
    raws = [chains.seal(ops) for ops in sealed_blocks()]
    tmpl = update_template(A, B, seq=5, created_ms=CREATED_MS + 150_000, vector={A: 11, C: 2},
                           recv_seq=1, reply=True, anchors={A: pack_csn(T8, A, 0)})
    ((part, held),) = write_update(directory, name, raws, tmpl, "alpha",
                                   seal_to=x25519_public("bravo"))
    doc = _describe(part.path, part.header, tmpl.origin_table(), "alpha",
                    "update alpha->bravo sealed to bravo (seal-x25519-chacha20poly1305): "
                    "one block of 2 ops, one sealed chunk", raws=held)
    doc["seal"] = _seal_json(part.path, part.header, "bravo")
    docs[name] = doc

    # 6. Fork evidence: charlie signed two blocks for its epoch 3, both continuing its block
    #    of epochs 1..2 (one went to alpha, one to bravo).  bravo -> alpha, no blocks: 'heads'
    #    shows bravo's newest block of charlie (so alpha, holding the other, finds the fork),
    #    'forks' the pair of signed headers (byte order), announced by the advisory 'forks';
    #    'kept_by' passes on charlie's signed word that it kept the first one (section 4.5).
    name = PREFIX + "update-fork"
    prev = chains.last[C]
    one = blocks.encode_block(FAMILY_ID, C, prev, [Op(C, 3, hlc(5_000), 0, "parts", "k",
                                                      val("to alpha"), b"")],
                              signing_key("charlie").sign)
    two = blocks.encode_block(FAMILY_ID, C, prev, [Op(C, 3, hlc(5_500), 0, "parts", "k",
                                                      val("to bravo"), b"")],
                              signing_key("charlie").sign)
    h1, h2 = one[:blocks.HEADER_LEN], two[:blocks.HEADER_LEN]
    kept = blocks.read_block_header(h1, FAMILY_ID, header_only=True).block_hash
    word = signing_key("charlie").sign(codec.kept_signed_bytes(FAMILY_ID, C, kept))
    tmpl = update_template(B, A, seq=2, created_ms=CREATED_MS + 210_000, vector={A: 11, C: 3},
                           recv_seq=5, heads=[h2], forks=[(min(h1, h2), max(h1, h2))],
                           kept_by=[(kept, word)], advisory=[codec.FEATURE_FORKS])
    ((part, _held),) = write_update(directory, name, [], tmpl, "bravo")
    docs[name] = _describe(part.path, part.header, tmpl.origin_table(), "bravo",
                           "update bravo->alpha without blocks: a head (bravo's newest block "
                           "of charlie), fork evidence (two blocks charlie signed for its "
                           "epoch 3) and charlie's signed word that it kept the one that went "
                           "to alpha", raws=[])
    docs[name]["kept_by"] = [{"block_hash": kept.hex(), "signer": "charlie",
                              "signed_message": codec.kept_signed_bytes(FAMILY_ID, C,
                                                                        kept).hex()}]

    # 5. A snapshot packet alpha -> echo (replica creation), one part: records in one zstd
    #    frame, as in format 1.
    name = PREFIX + "snapshot"
    records = snapshot_records()
    (part,) = write_snapshot(directory, name, records, sender=A, recipient=E, seq=1,
                             created_ms=CREATED_MS + 180_000, vector={A: 4, C: 2}, hlc_max=T4,
                             signer="alpha")
    docs[name] = _describe(part.path, part.header, part.header.origin_table(), "alpha",
                           "snapshot alpha->echo (mkreplica): roster of 5, 10 records incl. a "
                           "tombstone and a two-version conflict", records=records)

    for n, doc in docs.items():
        (directory / f"{n}.json").write_text(json.dumps(doc, indent=1, ensure_ascii=False)
                                             + "\n")
    return sorted(docs)


def piece_block() -> bytes:
    """alpha's epoch 12, one op whose value (9000 incompressible bytes) makes a block larger
    than a packet of SPLIT_MAX_SIZE; chained onto alpha's block of epochs 10..11."""
    chains = Chains()
    for ops in basic_blocks() + split_blocks() + sealed_blocks():
        chains.seal(ops)
    return chains.seal([Op(A, 12, hlc(9_000), 0, "blobs", "big", val(noise("big", 9000)), b"")])


def write_piece_vectors(directory: Path) -> list[str]:
    """v2-piece-pN: one export alpha -> bravo at max_size SPLIT_MAX_SIZE whose one block does
    not fit a packet: each part's body is one piece of it (mandatory feature 'block-piece')."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    raw = piece_block()
    name = PREFIX + "piece"
    tmpl = update_template(A, B, seq=6, created_ms=CREATED_MS + 240_000, vector={A: 12, C: 2},
                           recv_seq=2, anchors={A: pack_csn(T9, A, 1)})
    parts = write_update(directory, name, [raw], tmpl, "alpha", max_size=SPLIT_MAX_SIZE)
    info = blocks.read_block_header(raw, FAMILY_ID)
    names = []
    for p, _held in parts:
        data = p.path.read_bytes()
        off, total = p.header.piece
        n = f"{name}-p{p.header.part}"
        doc = _describe(p.path, p.header, tmpl.origin_table(), "alpha",
                        f"update alpha->bravo, part {p.header.part} of {len(parts)}: the "
                        f"block bytes {off}..{off + p.header.body_len} of {total} (one "
                        f"block of one op, larger than a packet of max_size {SPLIT_MAX_SIZE})")
        doc["piece"] = {"offset": off, "total": total,
                        "bytes": data[9:9 + p.header.body_len].hex()}
        doc["joined_block"] = _block_json(raw, 0)
        doc["joined_block"]["block_hash"] = info.block_hash.hex()
        (directory / f"{n}.json").write_text(json.dumps(doc, indent=1, ensure_ascii=False)
                                             + "\n")
        names.append(n)
    return names


def record_piece_records() -> list[Record]:
    """A snapshot whose middle record (9000 incompressible bytes of value) is larger than a
    packet of SPLIT_MAX_SIZE, between two small ones."""
    recs = snapshot_records()
    recs.append(Record("blobs", "big", pack_csn(T4, A, 1), val(noise("record", 9000))))
    return sorted(recs, key=lambda r: (r.collection.encode(), r.key.encode(), r.csn))


def write_record_piece_vectors(directory: Path) -> list[str]:
    """v2-rpiece-pN: a snapshot alpha -> echo at max_size SPLIT_MAX_SIZE with one record too
    large for a packet: the parts around it hold whole records, the record's own parts one
    piece of it each (mandatory feature 'record-piece', PACKET.md section 7.1)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    name = PREFIX + "rpiece"
    records = record_piece_records()
    parts = write_snapshot(directory, name, records, sender=A, recipient=E, seq=2,
                           created_ms=CREATED_MS + 300_000, vector={A: 4, C: 2}, hlc_max=T4,
                           signer="alpha", max_size=SPLIT_MAX_SIZE)
    names = []
    for p in parts:
        n = f"{name}-p{p.header.part}"
        target = directory / f"{n}.spk"
        p.path.rename(target)
        what = (f"piece [{p.header.piece[0]}, {p.header.piece[1]}] of the record blobs/big"
                if p.header.piece else f"{p.header.count} whole record(s)")
        doc = _describe(target, p.header, p.header.origin_table(), "alpha",
                        f"snapshot alpha->echo at max_size {SPLIT_MAX_SIZE}, part "
                        f"{p.header.part} of {len(parts)}: {what}")
        if p.header.piece:
            doc["piece"] = {"offset": p.header.piece[0], "total": p.header.piece[1]}
        (directory / f"{n}.json").write_text(json.dumps(doc, indent=1, ensure_ascii=False)
                                             + "\n")
        names.append(n)
    return names


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
        # An update packet's first block header is readable as it is: show all of it.
        head = 9 + blocks.HEADER_LEN if data[9:13] == blocks.MAGIC else 64
        print(hexdump(data, 0, head))
        print("...")
        print(hexdump(data, len(data) - 72 - hlen, hlen + 72))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    for pattern in OWN_PATTERNS:
        for old in args.out.glob(pattern):
            old.unlink()
    for pattern in (PIECE_PATTERN, RECORD_PIECE_PATTERN):
        for old in args.out.glob(pattern):
            old.unlink()
    for n in (write_vectors(args.out) + write_piece_vectors(args.out)
              + write_record_piece_vectors(args.out)):
        print(f"{args.out / n}.spk")
    return 0


if __name__ == "__main__":
    sys.exit(main())
