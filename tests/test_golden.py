"""Golden vectors of packet format v2 (formats/PACKET.md, formats/vectors/).

Each vector is read three ways: by hand from the byte layout the spec gives (struct slicing,
BLAKE2b, Ed25519 over the documented signed messages, zstd + msgpack; for update packets every
block by the rules of formats/BLOCKS.md), through the modules the importer uses, and by
regenerating it with tools/make_vectors.py and comparing bytes.  Then every single-byte change of
every vector must be rejected with a PacketError naming the right check, and the one packet of
format 1 that is kept must be refused as made by an older syncpack.
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import re
import struct
import sys
from pathlib import Path

import msgpack
import pytest
import zstandard

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from syncpack.format import blocks
from syncpack.exchange import verify
from syncpack.format import codec, keys, seal
from syncpack.format.codec import Op
from syncpack.errors import (PacketBodyError, PacketError, PacketFeatureError, PacketFormatError,
                             PacketLimitError, PacketSealError, PacketSenderError,
                             PacketSignatureError, PacketVersionError)

ROOT = Path(__file__).resolve().parents[1]
VECTORS = ROOT / "formats" / "vectors"
SPEC = ROOT / "formats" / "PACKET.md"
LEGACY = "v1-update-legacy"


def _load_generator():
    spec = importlib.util.spec_from_file_location("make_vectors", ROOT / "tools" / "make_vectors.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("make_vectors", mod)
    spec.loader.exec_module(mod)
    return mod


gen = _load_generator()
# The packets; v2-block-* are single blocks (tests/test_blocks.py).
NAMES = sorted(p.stem for pattern in ("v2-update-*.json", "v2-snapshot*.json")
               for p in VECTORS.glob(pattern))
UPDATES = [n for n in NAMES if "snapshot" not in n]
FAMILY = gen.FAMILY_ID


def load(name: str) -> tuple[bytes, dict]:
    return (VECTORS / f"{name}.spk").read_bytes(), json.loads((VECTORS / f"{name}.json").read_text())


def hexify(obj):
    if isinstance(obj, bytes):
        return obj.hex()
    if isinstance(obj, dict):
        return {k: hexify(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [hexify(v) for v in obj]
    return obj


def op_json(op: Op) -> dict:
    return gen._op_json(op)


def unsealer(recipient_name: str | None = None):
    """What keys.unsealer gives the importer, from the golden X25519 test keys."""
    def open_for(header):
        name = recipient_name or gen.name_of(header.recipient)
        k = X25519PrivateKey.from_private_bytes(gen.X25519_SEEDS[name])
        return seal.opener(k, gen.x25519_public(name), header.seal_epk, header.packet_id)
    return open_for


def origin_key(origin: bytes) -> bytes:
    """The roster a reader of the golden family holds: every origin's public key."""
    try:
        return gen.public_key(gen.name_of(origin))
    except KeyError:
        raise PacketSenderError(f"origin {origin.hex()} is not a member") from None


def check_blocks(raws, env: codec.Envelope) -> list[Op]:
    """The per-block checks of PACKET.md section 9 for a reader that holds none of the
    origins' blocks yet: each block against its origin's key, chained to the one before it in
    the packet, continuing its origin's range exactly, in travelling order, within hlc_max.
    Returns the ops in the order the importer applies them (CSN order)."""
    h = env.header
    cursor = {o: lo for o, (lo, _hi) in h.ranges.items()}
    last_hash: dict[bytes, bytes] = {}
    last_key = None
    ops: list[Op] = []
    for raw in raws:
        info = blocks.read_block_header(raw, FAMILY)
        o = info.origin
        root = info.prev_hash == blocks.ZERO_HASH and info.lo > 0
        prev = None if root else (blocks.ZERO_HASH if info.lo == 0 else last_hash.get(o))
        info = blocks.verify_block(info, origin_key(o), FAMILY, prev)
        if cursor.get(o) != info.lo or info.hi > h.ranges[o][1]:
            raise PacketBodyError("block does not continue its origin's range")
        cursor[o] = info.hi
        if info.hlc_last > h.hlc_max:
            raise PacketBodyError("block beyond hlc_max")
        key = (info.hlc_first, o, info.lo)
        if last_key is not None and key < last_key:
            raise PacketBodyError("blocks out of travelling order")
        last_key = key
        last_hash[o] = info.block_hash
        ops += blocks.decode_ops(info)
    if any(cursor[o] != hi for o, (_lo, hi) in h.ranges.items()):
        raise PacketBodyError("ranges not covered")
    return sorted(ops, key=lambda op: op.csn)


def full_check(data: bytes, public: bytes, unseal=None) -> list:
    """Every check a receiver makes, in the importer's order (the site-dependent family,
    recipient and membership checks aside); returns the ops to apply or the records."""
    unseal = unseal or unsealer()
    f = io.BytesIO(data)
    env = codec.read_envelope(f, len(data))
    if not keys.verify(public, env.signature, codec.signed_bytes(env.version, env.header_bytes)):
        raise PacketSignatureError("signature does not verify")
    if not codec.body_hash_matches(f, env):
        raise PacketBodyError("packet body does not match the hash in its signed header")
    if env.header.kind == codec.KIND_UPDATE:
        return check_blocks(blocks.split_blocks(codec.body_chunks(f, env, unseal)), env)
    return list(codec.iter_records(f, env, unseal))


def test_every_vector_is_present():
    assert NAMES == ["v2-snapshot", "v2-update-ack-only", "v2-update-basic", "v2-update-fork",
                     "v2-update-sealed", "v2-update-split-p0", "v2-update-split-p1"]
    for n in NAMES + [LEGACY]:
        assert (VECTORS / f"{n}.spk").is_file() and (VECTORS / f"{n}.json").is_file()
    # format 1 survives only as the one packet that tests its refusal
    assert sorted(p.name for p in VECTORS.glob("v1-*")) == [f"{LEGACY}.json", f"{LEGACY}.spk"]


# --- reading by hand, from the spec alone --------------------------------------------------------

BLOCK_HEADER = struct.Struct(">4sBB8sQQIQQ32s32sII")     # BLOCKS.md 3.1


def blocks_by_hand(body: bytes) -> list[dict]:
    """Walk a concatenation of blocks by their headers (186 + body_len bytes each)."""
    out, off = [], 0
    while off < len(body):
        (magic, version, flags, origin, lo, hi, txns, hlc_first, hlc_last, prev, bhash, raw_len,
         body_len) = BLOCK_HEADER.unpack(body[off:off + 122])
        assert (magic, version, flags) == (b"SPKB", 2, 0)
        size = 186 + body_len
        out.append({"offset_in_body": off, "size": size, "origin": origin.hex(), "lo": lo,
                    "hi": hi, "txns": txns, "hlc_first": hlc_first, "hlc_last": hlc_last,
                    "prev_hash": prev.hex(), "body_hash": bhash.hex(), "raw_len": raw_len,
                    "body_len": body_len, "bytes": body[off:off + size]})
        off += size
    assert off == len(body), "the body ends inside a block"
    return out


def ops_by_hand(b: dict) -> list[dict]:
    """BLOCKS.md section 4: the nine columns back into ops."""
    frame = b["bytes"][186:]
    cols = msgpack.unpackb(zstandard.ZstdDecompressor().decompress(frame), raw=False)
    txn_lens, deltas, names, run_coll, run_len, ks, vs, rep_at, rep = cols
    hlcs = [b["hlc_first"]]
    for d in deltas:
        hlcs.append(hlcs[-1] + d)
    assert hlcs[-1] == b["hlc_last"] and len(txn_lens) == b["txns"]
    colls = [names[c] for c, n in zip(run_coll, run_len) for _ in range(n)]
    reps = dict(zip(rep_at, rep))
    origin = bytes.fromhex(b["origin"])
    ops, i = [], 0
    for hl, n in zip(hlcs, txn_lens):
        for seq in range(n):
            ops.append(op_json(Op(origin, b["lo"] + 1 + i, hl, seq, colls[i], ks[i], vs[i],
                                  reps.get(i, b""))))
            i += 1
    assert i == b["hi"] - b["lo"]
    return ops


@pytest.mark.parametrize("name", NAMES)
def test_layout_by_hand(name):
    data, doc = load(name)
    lay = doc["layout"]
    assert len(data) == lay["size"]
    assert data[:8] == b"\x89SYNCPK\n" == bytes.fromhex("89 53 59 4e 43 50 4b 0a")
    assert data[8] == 2 == doc["format_version"]
    assert data[-4:] == b"SPKE"
    hlen = int.from_bytes(data[-72:-68], "big")
    assert hlen == lay["header_len"]
    assert lay["body_offset"] == 9
    assert lay["header_offset"] == 9 + lay["body_len"] == len(data) - 72 - hlen
    assert lay["footer_offset"] == len(data) - 72
    header_bytes = data[-72 - hlen:-72]
    body = data[9:-72 - hlen]
    signature = data[-68:-4]
    assert signature.hex() == doc["signature"]

    header = msgpack.unpackb(header_bytes, raw=False)
    assert hexify(header) == doc["header"]          # every key, nothing more, in wire form
    assert list(header) == list(doc["header"])      # and in the writer's key order
    assert header["body_len"] == len(body)
    assert header["body_hash"] == hashlib.blake2b(body, digest_size=32).digest()

    message = b"syncpack packet signature v1\x00" + data[:9] + header_bytes
    assert keys.verify(bytes.fromhex(doc["signer_ed25519"]), signature, message)

    if "seal" in header:
        body = unseal_by_hand(body, header, doc["seal"])
    if header["kind"] == "snapshot":
        # one zstd frame holding a stream of msgpack arrays
        assert header["req"] == ["zstd"]
        raw = zstandard.ZstdDecompressor().decompressobj().decompress(body)
        items = list(msgpack.Unpacker(io.BytesIO(raw), raw=False))
        assert hexify(items) == [x["wire"] for x in doc["records"]]
        return
    assert header["req"][0] == "blocks" and "zstd" not in header["req"]
    found = blocks_by_hand(body)
    assert [{k: v for k, v in b.items() if k != "bytes"} for b in found] == \
        [{k: v for k, v in b.items() if k not in ("signer", "signer_ed25519", "block_hash",
                                                  "ops")} for b in doc["blocks"]]
    for b, want in zip(found, doc["blocks"]):
        assert want["signer_ed25519"] == gen.public_key(want["signer"]).hex()
        assert bytes.fromhex(b["origin"]) == gen.SITE_IDS[want["signer"]]
        assert ops_by_hand(b) == want["ops"]


@pytest.mark.parametrize("name", UPDATES)
def test_blocks_and_rules_by_hand(name):
    """Each block verifies with its **origin's** key (not the packet signer's), chains to the
    one before it, and the blocks satisfy the order, contiguity and count rules of section 6."""
    data, doc = load(name)
    h = doc["header"]
    body = data[9:9 + h["body_len"]]
    if "seal" in h:
        body = unseal_by_hand(body, msgpack.unpackb(data[-72 - doc["layout"]["header_len"]:-72],
                                                    raw=False), doc["seal"])
    found = blocks_by_hand(body)
    ranges = {h["origins"][i]: (lo, hi) for i, lo, hi in h["ranges"]}
    cursor = {o: lo for o, (lo, _hi) in ranges.items()}
    prev_hash: dict[str, str] = {}
    keys_seen = []
    for b, want in zip(found, doc["blocks"]):
        raw = b["bytes"]
        signed = b"syncpack block signature v2\x00" + FAMILY + raw[:122]
        assert keys.verify(gen.public_key(want["signer"]), raw[122:186], signed)
        if want["signer"] != doc["signer"]:     # a relayed block: the packet's key is no good
            assert not keys.verify(gen.public_key(doc["signer"]), raw[122:186], signed)
        assert hashlib.blake2b(raw[186:], digest_size=32).hexdigest() == b["body_hash"]
        block_hash = hashlib.blake2b(signed, digest_size=32).hexdigest()
        assert block_hash == want["block_hash"]
        o = b["origin"]
        if b["lo"] == 0:
            assert b["prev_hash"] == "00" * 32
        elif o in prev_hash:
            assert b["prev_hash"] == prev_hash[o]
        prev_hash[o] = block_hash
        assert cursor[o] == b["lo"]                       # continues its origin's range
        cursor[o] = b["hi"]
        assert b["hlc_last"] <= h["hlc_max"]
        keys_seen.append((b["hlc_first"], bytes.fromhex(o), b["lo"]))
    assert keys_seen == sorted(keys_seen)                 # travelling order
    assert cursor == {o: hi for o, (_lo, hi) in ranges.items()}
    assert h["count"] == sum(hi - lo for lo, hi in ranges.values()) == \
        sum(b["hi"] - b["lo"] for b in found) == len(doc["ops"])
    assert h["hlc_max"] == max((b["hlc_last"] for b in found), default=0)
    merged = sorted((op for want in doc["blocks"] for op in want["ops"]), key=lambda op: op["csn"])
    assert merged == doc["ops"]
    for op in doc["ops"]:
        csn = op["hlc"].to_bytes(8, "big") + bytes.fromhex(op["origin"]) + \
            op["seq"].to_bytes(4, "big")
        assert csn.hex() == op["csn"]


@pytest.mark.parametrize("name", UPDATES)
def test_acknowledgements_by_hand(name):
    """Section 4.4: each entry of 'acks' verifies with its member's key over the documented
    message; a relayed one's vector is the header's vector changed by its delta."""
    data, doc = load(name)
    h = doc["header"]
    header = msgpack.unpackb(data[-72 - doc["layout"]["header_len"]:-72], raw=False)
    base = {o: e for o, e in header["vector"]}
    assert len(header["acks"]) == len(doc["acks"]) >= 1
    for (mi, created, delta, sig), want in zip(header["acks"], doc["acks"]):
        member = header["origins"][mi]
        if delta is None:
            assert member == header["from"] and created == h["created"]
            vec = dict(base)
        else:
            vec = dict(base)
            vec.update({o: e for o, e in delta})
        vec = {header["origins"][o]: e for o, e in vec.items() if e}
        message = (b"syncpack acknowledgement v1\x00" + FAMILY + member
                   + created.to_bytes(8, "big") + msgpack.packb(sorted([o, e] for o, e in
                                                                       vec.items())))
        assert message.hex() == want["signed_message"]
        assert {o.hex(): e for o, e in vec.items()} == want["vector"]
        assert keys.verify(gen.public_key(want["signer"]), sig, message)


def unseal_by_hand(body: bytes, header: dict, sj: dict) -> bytes:
    assert "seal-x25519-chacha20poly1305" in header["req"]
    epk = header["seal"]["epk"]
    assert list(header["seal"]) == ["epk"] and epk.hex() == sj["epk"]
    k = X25519PrivateKey.from_private_bytes(bytes.fromhex(sj["recipient_x25519_private"]))
    pub = bytes.fromhex(sj["recipient_x25519"])
    shared = k.exchange(X25519PublicKey.from_public_bytes(epk))
    assert shared.hex() == sj["shared_secret"]
    key = HKDF(algorithm=hashes.SHA256(), length=32, salt=epk + pub,
               info=b"syncpack seal v1" + header["id"]).derive(shared)
    assert key.hex() == sj["aead_key"]
    aead, out, off = ChaCha20Poly1305(key), b"", 0
    for i, c in enumerate(sj["chunks"]):
        last = i == len(sj["chunks"]) - 1
        nonce = (b"\x01" if last else b"\x00") + i.to_bytes(11, "big")
        assert nonce.hex() == c["nonce"]
        out += aead.decrypt(nonce, body[off:off + c["len"]], None)
        off += c["len"]
    assert off == len(body)
    return out


# --- reading through the modules -----------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_codec_reads_header(name):
    data, doc = load(name)
    f = io.BytesIO(data)
    env = codec.read_envelope(f, len(data))
    assert env.version == 2 == codec.FORMAT_VERSION and env.size == len(data)
    assert env.body_offset == 9 and env.signature.hex() == doc["signature"]
    assert hexify(env.header.to_wire(env.origins)) == doc["header"]
    h, w = env.header, doc["header"]
    assert (h.kind, h.family.hex(), h.sender.hex(), h.recipient.hex(), h.packet_id.hex()) == \
        (w["kind"], w["family"], w["from"], w["to"], w["id"])
    assert (h.seq, h.part, h.final, h.created_ms, h.recv_seq, h.count, h.hlc_max) == \
        (w["seq"], w["part"], w["final"], w["created"], w["recv_seq"], w["count"], w["hlc_max"])
    assert (h.body_len, h.body_hash.hex(), h.mandatory, h.advisory) == \
        (w["body_len"], w["body_hash"], w["req"], w["opt"])
    o = w["origins"]
    assert {k.hex(): e for k, e in h.vector.items()} == {o[i]: e for i, e in w["vector"]}
    assert {k.hex(): list(r) for k, r in h.ranges.items()} == \
        {o[i]: [lo, hi] for i, lo, hi in w["ranges"]}
    assert {k.hex(): list(r) for k, r in h.waiting.items()} == \
        {o[i]: [lo, hi] for i, lo, hi in w["waiting"]}
    assert h.ack_floor == {} and w["ack_floor"] == []     # obsolete: written empty
    assert {k.hex(): c.hex() for k, c in h.anchors.items()} == \
        {o[i]: c for i, c in w.get("anchors", [])}
    if h.kind == codec.KIND_SNAPSHOT:
        assert [[m["name"], m["id"].hex(), m["ed25519"].hex(), m["x25519"].hex(), m["priority"]]
                for m in h.roster] == w["roster"]
    else:
        assert "roster" not in w


@pytest.mark.parametrize("name", NAMES)
def test_codec_verifies_signature_and_body(name):
    data, doc = load(name)
    f = io.BytesIO(data)
    env = codec.read_envelope(f, len(data))
    public = bytes.fromhex(doc["signer_ed25519"])
    assert public == gen.public_key(doc["signer"])
    assert keys.verify(public, env.signature, codec.signed_bytes(env.version, env.header_bytes))
    assert codec.body_hash_matches(f, env)
    other = gen.public_key("charlie")
    assert not keys.verify(other, env.signature, codec.signed_bytes(env.version, env.header_bytes))


@pytest.mark.parametrize("name", UPDATES)
def test_modules_read_blocks(name):
    """codec.body_chunks + blocks.split_blocks give the blocks as the origins made them;
    blocks.verify_block passes each with its origin's key and the chain; blocks.packet_ops
    gives their ops block after block, and the importer's merge gives CSN order."""
    data, doc = load(name)
    f = io.BytesIO(data)
    env = codec.read_envelope(f, len(data))
    raws = list(blocks.split_blocks(codec.body_chunks(f, env, unsealer())))
    assert [len(r) for r in raws] == [b["size"] for b in doc["blocks"]]
    prev: dict[bytes, bytes] = {}
    for raw, want in zip(raws, doc["blocks"]):
        info = blocks.read_block_header(raw, FAMILY)
        expected = blocks.ZERO_HASH if info.lo == 0 else prev.get(info.origin)
        info = blocks.verify_block(info, gen.public_key(want["signer"]), FAMILY, expected)
        assert info.block_hash.hex() == want["block_hash"]
        assert [op_json(op) for op in blocks.decode_ops(info)] == want["ops"]
        prev[info.origin] = info.block_hash
    in_blocks = [op for b in doc["blocks"] for op in b["ops"]]
    assert [op_json(op) for op in blocks.packet_ops(io.BytesIO(data), env, unsealer())] == \
        in_blocks
    ops = full_check(data, bytes.fromhex(doc["signer_ed25519"]))
    assert [op_json(op) for op in ops] == doc["ops"]


def test_blocks_are_the_origins_bytes():
    """A packet copies blocks byte for byte: the same encoder with the same ops gives the
    same block whichever packet carries it, and the block is found verbatim in the file."""
    data, doc = load("v2-update-basic")
    for want, ops in zip(doc["blocks"], [gen.basic_blocks()[i] for i in (0, 1, 2)]):
        raw = data[9 + want["offset_in_body"]:9 + want["offset_in_body"] + want["size"]]
        prev = bytes.fromhex(want["prev_hash"])
        origin = bytes.fromhex(want["origin"])
        assert blocks.encode_block(FAMILY, origin, prev, ops,
                                   gen.signing_key(want["signer"]).sign) == raw


def test_travelling_order_interleaves_origins():
    """order_blocks sorts by (hlc_first, origin, lo): charlie's block travels between alpha's
    two, and the three clock ranges overlap, so the importer merges their ops by CSN."""
    _data, doc = load("v2-update-basic")
    assert [(b["signer"], b["lo"], b["hi"]) for b in doc["blocks"]] == \
        [("alpha", 0, 3), ("charlie", 0, 2), ("alpha", 3, 5)]
    b0, b1, b2 = doc["blocks"]
    assert b1["hlc_first"] <= b0["hlc_last"] and b2["hlc_first"] <= b1["hlc_last"]
    assert b2["prev_hash"] == b0["block_hash"]
    assert [(op["origin"], op["epoch"]) for op in doc["ops"]] == [
        (gen.A.hex(), 1), (gen.A.hex(), 2), (gen.C.hex(), 1), (gen.A.hex(), 3),
        (gen.A.hex(), 4), (gen.C.hex(), 2), (gen.A.hex(), 5)]


def test_codec_reads_snapshot_records():
    data, doc = load("v2-snapshot")
    recs = full_check(data, bytes.fromhex(doc["signer_ed25519"]))
    assert [[r.collection, r.key, r.csn.hex(), None if r.value is None else r.value.hex()]
            for r in recs] == [[x["collection"], x["key"], x["csn"], x["value"]]
                               for x in doc["records"]]
    # records come in (collection, key, csn) order; the roster holds the recipient's key
    assert recs == sorted(recs, key=lambda r: (r.collection.encode(), r.key.encode(), r.csn))
    env = codec.read_envelope(io.BytesIO(data), len(data))
    roster = {m["id"]: m for m in env.header.roster}
    assert roster[env.header.recipient]["ed25519"] == gen.public_key("echo")
    assert roster[env.header.sender]["ed25519"] == gen.public_key("alpha")
    assert env.header.mandatory == ["zstd"]


def test_split_parts_are_cut_between_blocks():
    """Two parts of one export: same seq, consecutive part numbers, final only on the last,
    adjacent ranges, distinct ids, each part whole blocks; part 0 anchors the op its range
    continues (the sender's own origin), part 1 none: its first block chains onto part 0's
    last (it names that block's hash)."""
    (d0, j0), (d1, j1) = load("v2-update-split-p0"), load("v2-update-split-p1")
    h0, h1 = j0["header"], j1["header"]
    assert (h0["seq"], h0["part"], h0["final"]) == (4, 0, False)
    assert (h1["seq"], h1["part"], h1["final"]) == (4, 1, True)
    assert h0["id"] != h1["id"]
    assert h0["ranges"] == [[0, 5, 6]] and h1["ranges"] == [[0, 6, 9]]
    assert [(b["lo"], b["hi"]) for b in j0["blocks"]] == [(5, 6)]
    assert [(b["lo"], b["hi"]) for b in j1["blocks"]] == [(6, 8), (8, 9)]
    # the two-op transaction is one block: it moved to part 1 whole
    assert [op["epoch"] for op in j1["blocks"][0]["ops"]] == [7, 8]
    assert "anchors" not in h1
    assert j1["blocks"][0]["prev_hash"] == j0["blocks"][-1]["block_hash"]
    assert h0["anchors"] == [[0, load("v2-update-basic")[1]["ops"][-1]["csn"]]]
    # the first two blocks would not have fit one part of max_size 4096
    assert len(d0) + j1["blocks"][0]["size"] > gen.SPLIT_MAX_SIZE
    for data in (d0, d1):
        assert len(data) <= gen.SPLIT_MAX_SIZE


def test_one_chain_of_alpha_across_the_vectors():
    """alpha's blocks in every update vector form one chain from epoch 0 to 11."""
    chain = [b for n in ("v2-update-basic", "v2-update-split-p0", "v2-update-split-p1",
                         "v2-update-sealed")
             for b in load(n)[1]["blocks"] if b["signer"] == "alpha"]
    assert [(b["lo"], b["hi"]) for b in chain] == [(0, 3), (3, 5), (5, 6), (6, 8), (8, 9),
                                                  (9, 11)]
    assert chain[0]["prev_hash"] == "00" * 32
    for a, b in zip(chain, chain[1:]):
        assert b["prev_hash"] == a["block_hash"]


def test_sealed_body_needs_the_recipient_key():
    data, doc = load("v2-update-sealed")
    public = bytes.fromhex(doc["signer_ed25519"])
    assert len(full_check(data, public)) == 2
    env = codec.read_envelope(io.BytesIO(data), len(data))
    assert env.header.sealed and env.header.seal_epk.hex() == doc["seal"]["epk"]
    assert env.header.mandatory == ["blocks", codec.FEATURE_SEAL]
    with pytest.raises(PacketSealError):           # a site without an unsealer
        list(blocks.packet_ops(io.BytesIO(data), env))
    with pytest.raises(PacketSealError):           # the wrong recipient key
        full_check(data, public, unsealer("charlie"))
    # neither the plaintext nor the blocks' headers are visible in the file
    assert b"attack at dawn" not in data and b"secrets" not in data and b"SPKB" not in data
    # the seal covers the concatenation of blocks: one chunk of the block plus its tag
    assert doc["seal"]["chunks"] == [{"nonce": "01" + "00" * 11,
                                      "len": doc["blocks"][0]["size"] + 16}]


def test_ack_only_has_empty_body():
    data, doc = load("v2-update-ack-only")
    h = doc["header"]
    assert (h["count"], h["ranges"], h["hlc_max"], h["body_len"]) == (0, [], 0, 0)
    assert h["body_hash"] == hashlib.blake2b(b"", digest_size=32).hexdigest()
    assert doc["layout"]["header_offset"] == 9 and doc["blocks"] == []
    assert full_check(data, bytes.fromhex(doc["signer_ed25519"])) == []
    assert h["tip"] == [5, load("v2-update-basic")[1]["ops"][-1]["csn"]]


def test_fork_evidence_by_hand():
    """PACKET.md 4 ('heads', 'forks'), BLOCKS.md 3.1-3.2 and design §3.10: two headers charlie
    signed, read by hand, contradict each other; the head is one of them."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    data, doc = load("v2-update-fork")
    assert full_check(data, bytes.fromhex(doc["signer_ed25519"])) == []
    h = doc["header"]
    assert h["opt"] == ["forks"] and h["count"] == 0
    a, b = (bytes.fromhex(x) for x in h["forks"][0])
    assert a < b and len(a) == len(b) == 186
    assert bytes.fromhex(h["heads"][0]) in (a, b)
    charlie = Ed25519PublicKey.from_public_bytes(gen.public_key("charlie"))
    fields = []
    for raw in (a, b):
        charlie.verify(raw[122:186], b"syncpack block signature v2\x00" + gen.FAMILY_ID + raw[:122])
        f = BLOCK_HEADER.unpack(raw[:122])
        assert f[3] == gen.C
        fields.append(f)
    (_, _, _, _, lo1, hi1, _, _, last1, prev1, body1, _, _) = fields[0]
    (_, _, _, _, lo2, hi2, _, _, last2, prev2, body2, _, _) = fields[1]
    # the same place in charlie's chain, two different ops for epoch 3
    assert (lo1, hi1, prev1) == (lo2, hi2, prev2) == (2, 3, prev1)
    assert last1 != last2 and body1 != body2
    from syncpack.rules import forks as fork_rules
    infos = [blocks.read_block_header(x, gen.FAMILY_ID, header_only=True) for x in (a, b)]
    facts = [fork_rules.HeaderFacts(i.origin, i.lo, i.hi, i.hlc_first, i.hlc_last, i.prev_hash,
                                    i.block_hash) for i in infos]
    assert fork_rules.fork_epoch(*facts) == 3
    # PACKET.md 4.5: charlie's word that it kept the version that went to alpha, passed on by
    # bravo, verifies with charlie's key over the context, family, origin and block hash
    [[kept, word]] = [[bytes.fromhex(x) for x in pair] for pair in h["kept_by"]]
    # (the head is bravo's own version; the word names the other)
    assert kept == next(i.block_hash for x, i in zip((a, b), infos)
                        if x != bytes.fromhex(h["heads"][0]))
    message = b"syncpack fork kept v1\x00" + gen.FAMILY_ID + gen.C + kept
    assert message == bytes.fromhex(doc["kept_by"][0]["signed_message"])
    charlie.verify(word, message)
    assert not keys.verify(gen.public_key("bravo"), word, message)


# --- reproducing the bytes -----------------------------------------------------------------------

def test_vectors_reproduce_byte_for_byte(tmp_path):
    _data, doc = load(NAMES[0])
    here = ".".join(map(str, zstandard.ZSTD_VERSION))
    if doc["zstd_library"] != here:
        pytest.skip(f"vectors were compressed by zstd {doc['zstd_library']}, this is {here}; the "
                    f"decoding tests above still apply (regenerate with tools/make_vectors.py)")
    names = gen.write_vectors(tmp_path)
    assert sorted(names) == NAMES
    produced = sorted(p.name for p in tmp_path.iterdir())
    stored = sorted(p.name for pattern in gen.OWN_PATTERNS for p in VECTORS.glob(pattern))
    assert produced == stored
    for fn in produced:
        assert (tmp_path / fn).read_bytes() == (VECTORS / fn).read_bytes(), \
            f"{fn} differs: the encoder changed; update formats/PACKET.md and regenerate"


# --- tampering -----------------------------------------------------------------------------------

def _expected_errors(pos: int, doc: dict) -> tuple[type, ...]:
    lay = doc["layout"]
    if pos < 8:
        return (PacketFormatError,)                       # magic
    if pos == 8:
        return (PacketVersionError,)                      # version
    if pos < lay["header_offset"]:
        return (PacketBodyError,)                         # body: hash in the signed header
    if pos < lay["footer_offset"]:                        # header: parse, features or signature
        return (PacketFormatError, PacketFeatureError, PacketLimitError, PacketSignatureError)
    if pos < lay["footer_offset"] + 4:                    # header length
        return (PacketFormatError, PacketLimitError, PacketSignatureError)
    if pos < lay["size"] - 4:
        return (PacketSignatureError,)                    # signature
    return (PacketFormatError,)                           # end magic


@pytest.mark.parametrize("name", NAMES)
def test_every_flipped_byte_is_rejected(name):
    data, doc = load(name)
    public = bytes.fromhex(doc["signer_ed25519"])
    full_check(data, public)
    for pos in range(len(data)):
        for mask in (0x01, 0x80):
            bad = bytearray(data)
            bad[pos] ^= mask
            with pytest.raises(PacketError) as ei:
                full_check(bytes(bad), public)
            assert isinstance(ei.value, _expected_errors(pos, doc)), \
                f"byte {pos} ^ {mask:#x}: {type(ei.value).__name__}: {ei.value}"


@pytest.mark.parametrize("name", NAMES)
def test_truncated_or_extended_is_rejected(name):
    data, doc = load(name)
    public = bytes.fromhex(doc["signer_ed25519"])
    for bad in (data[:-1], data[1:], data[:80], data[:len(data) // 2], data + b"\0",
                data[:9] + data[10:], data[:9] + b"\0" + data[9:]):
        with pytest.raises(PacketError):
            full_check(bad, public)


def repack(data: bytes, doc: dict, body: bytes | None = None, signer: str = "alpha",
           **changes) -> bytes:
    """The vector with its header changed (and its body replaced), signed again with the
    golden key: what a member could send, not what a carrier could forge."""
    hlen = doc["layout"]["header_len"]
    header = msgpack.unpackb(data[-72 - hlen:-72], raw=False)
    if body is None:
        body = data[9:-72 - hlen]
    else:
        changes = {"body_len": len(body),
                   "body_hash": hashlib.blake2b(body, digest_size=32).digest(), **changes}
    hb = codec.packb({**header, **changes})
    sig = gen.signing_key(signer).sign(codec.signed_bytes(2, hb))
    return data[:9] + body + hb + len(hb).to_bytes(4, "big") + sig + b"SPKE"


def test_version_byte_is_checked_before_the_header():
    data, _doc = load("v2-update-basic")
    for v, words in ((3, "newer"), (255, "newer"), (0, "unknown"),
                     (1, "made by an older syncpack")):
        bad = data[:8] + bytes([v]) + data[9:]
        with pytest.raises(PacketVersionError, match=words):
            codec.read_envelope(io.BytesIO(bad), len(bad))


def test_unknown_mandatory_feature_rejects_unknown_advisory_is_ignored():
    """Re-sign the basic vector's header with extra features (the key is the golden key)."""
    data, doc = load("v2-update-basic")
    ok = repack(data, doc, opt=["some-hint-from-the-future"], extra_field=1)
    assert len(full_check(ok, gen.public_key("alpha"))) == 7
    bad = repack(data, doc, req=["blocks", "sealed-x25519"])
    with pytest.raises(PacketFeatureError, match="sealed-x25519"):
        full_check(bad, gen.public_key("alpha"))


def test_update_packets_must_announce_blocks():
    """'blocks' in req is what tells a reader the body is blocks; 'zstd' alone was format 1's
    op stream and does not do (nor 'blocks' for a snapshot's record stream)."""
    data, doc = load("v2-update-basic")
    with pytest.raises(PacketFormatError, match="'blocks'"):
        full_check(repack(data, doc, req=["zstd"]), gen.public_key("alpha"))
    sdata, sdoc = load("v2-snapshot")
    with pytest.raises(PacketFormatError, match="'zstd'"):
        full_check(repack(sdata, sdoc, req=["blocks"]), gen.public_key("alpha"))


def test_block_rules_refuse_what_the_signer_may_not_send():
    """Correctly signed packets whose blocks break section 6's rules: the packet signature
    passes, the block checks do not."""
    data, doc = load("v2-update-basic")
    public = gen.public_key("alpha")
    raws = [data[9 + b["offset_in_body"]:9 + b["offset_in_body"] + b["size"]]
            for b in doc["blocks"]]
    a1, c1, a2 = raws
    # out of travelling order (both alpha blocks still in epoch order)
    with pytest.raises(PacketBodyError, match="order"):
        full_check(repack(data, doc, body=c1 + a1 + a2), public)
    # a block missing from the middle of alpha's range
    with pytest.raises(PacketBodyError):
        full_check(repack(data, doc, body=a1 + c1), public)
    # a block beyond hlc_max
    with pytest.raises(PacketBodyError, match="hlc_max"):
        full_check(repack(data, doc, hlc_max=doc["blocks"][0]["hlc_last"]), public)
    # a block of an origin without a range
    ranges = [r for r in msgpack.unpackb(data[-72 - doc["layout"]["header_len"]:-72],
                                         raw=False)["ranges"] if r[0] == 0]
    with pytest.raises(PacketError):
        full_check(repack(data, doc, ranges=ranges, count=5), public)
    # charlie's block passed off as alpha's: the origin's key, not the packet's, decides
    forged = bytearray(c1)
    forged[6:14] = gen.A
    with pytest.raises(PacketSignatureError):
        full_check(repack(data, doc, body=a1 + bytes(forged) + a2), public)


# --- format 1: refused, never read ----------------------------------------------------------------

def test_legacy_v1_packet_is_refused_as_older():
    data, doc = load(LEGACY)
    assert data[8] == 1 == doc["format_version"]
    # a genuine packet of format 1, by its own rules: its signature verifies with alpha's key
    hlen = doc["layout"]["header_len"]
    message = b"syncpack packet signature v1\x00" + data[:9] + data[-72 - hlen:-72]
    assert keys.verify(gen.public_key("alpha"), data[-68:-4], message)
    with pytest.raises(PacketVersionError, match="made by an older syncpack") as ei:
        codec.read_envelope(io.BytesIO(data), len(data))
    assert "upgrade syncpack at the sending site" in ei.value.hint
    # before anything after the prefix is looked at: a damaged header changes nothing
    bad = data[:-100] + bytes(100)
    with pytest.raises(PacketVersionError, match="made by an older syncpack"):
        codec.read_envelope(io.BytesIO(bad), len(bad))


def test_legacy_v1_packet_is_refused_by_the_verifier(tmp_path):
    path = tmp_path / "0000000003-0000.spk"
    path.write_bytes((VECTORS / f"{LEGACY}.spk").read_bytes())
    with pytest.raises(PacketVersionError, match="made by an older syncpack"):
        verify.open_packet(path)


def test_legacy_v1_relabelled_as_v2_is_not_read():
    """The version byte is signed, and format 1's header names no 'blocks': relabelling the
    old packet fails on the header, and would fail the signature after it."""
    data, _doc = load(LEGACY)
    bad = data[:8] + b"\x02" + data[9:]
    with pytest.raises(PacketFormatError, match="'blocks'"):
        codec.read_envelope(io.BytesIO(bad), len(bad))


# --- the worked hexdump in the spec ----------------------------------------------------------------

def test_spec_hexdumps_match_the_vectors():
    """Blocks in PACKET.md introduced by <!-- hexdump NAME --> must show the vector's bytes."""
    text = SPEC.read_text()
    found = re.findall(r"<!-- hexdump (\S+) -->\s*```[a-z]*\n(.*?)```", text, re.S)
    assert found, "PACKET.md has no hexdump blocks"
    for name, dump in found:
        data = (VECTORS / f"{name}.spk").read_bytes()
        checked = 0
        for line in dump.splitlines():
            m = re.match(r"^([0-9a-f]{8})  (.{48}) ", line + " ")
            if not m:
                continue
            off = int(m.group(1), 16)
            cells = m.group(2)
            for i in range(16):
                cell = cells[i * 3 + (1 if i >= 8 else 0):][:2]
                if cell.strip():
                    assert data[off + i] == int(cell, 16), f"{name} byte {off + i:#x}"
                    checked += 1
        assert checked >= 64, f"hexdump of {name} shows too little"


def test_spec_lists_every_vector():
    text = SPEC.read_text()
    assert "# syncpack packet format, version 2" in text
    for name in NAMES + [LEGACY]:
        assert f"`{re.sub(r'-p[0-9]+$', '', name)}" in text, f"PACKET.md does not list {name}"


# --- pieces of one block too large for a packet (PACKET.md section 6.4) -------------------------

PIECES = sorted(p.stem for p in VECTORS.glob("v2-piece-*.json"))


def test_piece_vectors_by_hand_join_into_alpha_block():
    assert PIECES == ["v2-piece-p0", "v2-piece-p1", "v2-piece-p2"]
    joined, total = b"", None
    for name in PIECES:
        data, doc = load(name)
        lay = doc["layout"]
        assert len(data) == lay["size"] <= gen.SPLIT_MAX_SIZE
        assert data[:9] == codec.MAGIC + b"\x02"
        hlen = int.from_bytes(data[-72:-68], "big")
        h = msgpack.unpackb(data[-72 - hlen:-72], raw=False)
        assert h["req"] == ["blocks", "block-piece"] and h["kind"] == "update"
        off, total_here = h["piece"]
        assert off == len(joined) and (total is None or total_here == total)
        total = total_here
        body = data[9:9 + h["body_len"]]
        assert hashlib.blake2b(body, digest_size=32).digest() == h["body_hash"]
        assert body.hex() == doc["piece"]["bytes"]
        # each piece's header names the whole block's range and op count
        assert [r[1:] for r in h["ranges"]] == [[11, 12]] and h["count"] == 1
        assert keys.verify(bytes.fromhex(doc["signer_ed25519"]), data[-68:-4],
                           codec.signed_bytes(2, data[-72 - hlen:-72]))
        joined += body
    assert len(joined) == total
    info = blocks.read_block_header(joined, FAMILY)
    blk = load(PIECES[0])[1]["joined_block"]
    assert info.block_hash.hex() == blk["block_hash"] and (info.lo, info.hi) == (11, 12)
    blocks.verify_block(info, gen.public_key("alpha"), FAMILY, None)
    [op] = blocks.decode_ops(joined)
    assert (op.key, len(op.value)) == ("big", len(gen.val(gen.noise("big", 9000))))
    # chained onto alpha's block of epochs 10..11 (v2-update-sealed)
    _d, sealed = load("v2-update-sealed")
    assert info.prev_hash.hex() == sealed["blocks"][-1]["block_hash"]


def test_piece_vectors_reproduce_and_need_their_feature(tmp_path):
    _data, doc = load(PIECES[0])
    if doc["zstd_library"] != ".".join(map(str, zstandard.ZSTD_VERSION)):
        pytest.skip("vectors were compressed by another zstd")
    assert gen.write_piece_vectors(tmp_path) == PIECES
    for p in tmp_path.iterdir():
        assert p.read_bytes() == (VECTORS / p.name).read_bytes(), p.name
    # a reader that does not know pieces refuses them cleanly, by the mandatory feature
    data, _doc = load(PIECES[1])
    known = codec.KNOWN_MANDATORY
    try:
        codec.KNOWN_MANDATORY = known - {codec.FEATURE_PIECE}
        with pytest.raises(PacketFeatureError, match="block-piece"):
            codec.read_envelope(io.BytesIO(data), len(data))
    finally:
        codec.KNOWN_MANDATORY = known
    assert "`v2-piece-p0`" in SPEC.read_text()


# --- pieces of one snapshot record too large for a packet (PACKET.md section 7.1) ---------------

RPIECES = sorted((p.stem for p in VECTORS.glob("v2-rpiece-*.json")),
                 key=lambda n: int(n.rsplit("-p", 1)[1]))


def test_record_piece_vectors_by_hand_join_into_one_record():
    assert RPIECES == [f"v2-rpiece-p{i}" for i in range(6)]
    joined, total, records = b"", None, []
    for i, name in enumerate(RPIECES):
        data, doc = load(name)
        assert len(data) == doc["layout"]["size"] <= gen.SPLIT_MAX_SIZE
        hlen = int.from_bytes(data[-72:-68], "big")
        h = msgpack.unpackb(data[-72 - hlen:-72], raw=False)
        assert h["kind"] == "snapshot" and h["part"] == i and h["final"] == (i == 5)
        assert keys.verify(bytes.fromhex(doc["signer_ed25519"]), data[-68:-4],
                           codec.signed_bytes(2, data[-72 - hlen:-72]))
        body = data[9:9 + h["body_len"]]
        assert hashlib.blake2b(body, digest_size=32).digest() == h["body_hash"]
        plain = zstandard.ZstdDecompressor().decompressobj().decompress(body)
        if "piece" in h:
            assert h["req"] == ["zstd", "record-piece"]
            off, total_here = h["piece"]
            assert off == len(joined) and (total is None or total_here == total)
            assert h["count"] == (1 if off == 0 else 0)
            total = total_here
            joined += plain
        else:
            assert h["req"] == ["zstd"]
            recs = list(msgpack.Unpacker(io.BytesIO(plain), raw=False))
            assert len(recs) == h["count"]
            records += recs
    assert len(joined) == total
    coll, key, _csn, value = msgpack.unpackb(joined, raw=False)
    assert (coll, key) == ("blobs", "big")
    assert value == gen.val(gen.noise("record", 9000))
    assert len(records) + 1 == len(gen.record_piece_records())


def test_record_piece_vectors_read_by_the_codec_and_need_their_feature(tmp_path):
    from syncpack.exchange.apply import RecordJoiner
    joiner, got = RecordJoiner(), []
    for name in RPIECES:
        data, _doc = load(name)
        env = codec.read_envelope(io.BytesIO(data), len(data))
        if env.header.piece is None:
            joiner.check_closed()
            got += codec.iter_records(io.BytesIO(data), env)
        else:
            rec = joiner.add(env.header, codec.read_record_piece(io.BytesIO(data), env))
            got += [rec] if rec else []
    joiner.check_closed()
    assert got == gen.record_piece_records()
    data, doc = load(RPIECES[2])
    known = codec.KNOWN_MANDATORY
    try:
        codec.KNOWN_MANDATORY = known - {codec.FEATURE_RECORD_PIECE}
        with pytest.raises(PacketFeatureError, match="record-piece"):
            codec.read_envelope(io.BytesIO(data), len(data))
    finally:
        codec.KNOWN_MANDATORY = known
    # a piece out of order, or the record's last piece missing, refuses the snapshot
    envs = [codec.read_envelope(io.BytesIO(load(n)[0]), len(load(n)[0])) for n in RPIECES]
    bodies = [codec.read_record_piece(io.BytesIO(load(n)[0]), e) if e.header.piece else None
              for n, e in zip(RPIECES, envs)]
    j = RecordJoiner()
    with pytest.raises(PacketBodyError):
        j.add(envs[2].header, bodies[2])
    j = RecordJoiner()
    j.add(envs[1].header, bodies[1])
    with pytest.raises(PacketBodyError):
        j.add(envs[3].header, bodies[3])
    j = RecordJoiner()
    for k in (1, 2, 3):
        j.add(envs[k].header, bodies[k])
    with pytest.raises(PacketBodyError):
        j.check_closed()
    if doc["zstd_library"] == ".".join(map(str, zstandard.ZSTD_VERSION)):
        assert gen.write_record_piece_vectors(tmp_path) == RPIECES
        for p in tmp_path.iterdir():
            assert p.read_bytes() == (VECTORS / p.name).read_bytes(), p.name
    assert "`v2-rpiece-p0`" in SPEC.read_text()
