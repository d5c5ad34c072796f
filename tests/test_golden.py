"""Golden vectors of packet format v1 (formats/PACKET.md, formats/vectors/).

Each vector is read three ways: by hand from the byte layout the spec gives (struct slicing,
BLAKE2b, Ed25519 over the documented signed message, zstd + msgpack), through the codec the
importer uses, and by regenerating it with tools/make_vectors.py and comparing bytes.  Then every
single-byte change of every vector must be rejected with a PacketError naming the right check.
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import re
import sys
from pathlib import Path

import msgpack
import pytest
import zstandard

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from syncpack import blocks
from syncpack import codec, keys, seal
from syncpack.errors import (PacketBodyError, PacketError, PacketFeatureError, PacketFormatError,
                             PacketLimitError, PacketSealError, PacketSignatureError,
                             PacketVersionError)

ROOT = Path(__file__).resolve().parents[1]
VECTORS = ROOT / "formats" / "vectors"
SPEC = ROOT / "formats" / "PACKET.md"


def _load_generator():
    spec = importlib.util.spec_from_file_location("make_vectors", ROOT / "tools" / "make_vectors.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("make_vectors", mod)
    spec.loader.exec_module(mod)
    return mod


gen = _load_generator()
NAMES = sorted(p.stem for p in VECTORS.glob("v1-*.json"))


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


def unsealer(recipient_name: str | None = None):
    """What keys.unsealer gives the importer, from the golden X25519 test keys."""
    def open_for(header):
        name = recipient_name or gen.name_of(header.recipient)
        k = X25519PrivateKey.from_private_bytes(gen.X25519_SEEDS[name])
        return seal.opener(k, gen.x25519_public(name), header.seal_epk, header.packet_id)
    return open_for


def full_check(data: bytes, public: bytes, unseal=None) -> list:
    """Every check a receiver makes, in the importer's order (the site-dependent family,
    recipient and membership checks aside); returns the decoded ops or records."""
    unseal = unseal or unsealer()
    f = io.BytesIO(data)
    env = codec.read_envelope(f, len(data))
    if not keys.verify(public, env.signature, codec.signed_bytes(env.version, env.header_bytes)):
        raise PacketSignatureError("signature does not verify")
    if not codec.body_hash_matches(f, env):
        raise PacketBodyError("packet body does not match the hash in its signed header")
    if env.header.kind == codec.KIND_UPDATE:
        return list(blocks.packet_ops(f, env, unseal))
    return list(codec.iter_records(f, env, unseal))


def test_every_vector_is_present():
    expected = {"v1-update-basic", "v1-update-ack-only", "v1-update-split-p0",
                "v1-update-split-p1", "v1-update-sealed", "v1-snapshot"}
    assert set(NAMES) == expected
    for n in NAMES:
        assert (VECTORS / f"{n}.spk").is_file()


# --- reading by hand, from the spec alone --------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_layout_by_hand(name):
    data, doc = load(name)
    lay = doc["layout"]
    assert len(data) == lay["size"]
    assert data[:8] == b"\x89SYNCPK\n" == bytes.fromhex("89 53 59 4e 43 50 4b 0a")
    assert data[8] == 1 == doc["format_version"]
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

    # The body: one zstd frame holding a stream of msgpack arrays (sealed: section 3.5).
    if "seal" in header:
        body = unseal_by_hand(body, header, doc["seal"])
    raw = zstandard.ZstdDecompressor().decompressobj().decompress(body)
    items = list(msgpack.Unpacker(io.BytesIO(raw), raw=False))
    listed = doc["ops"] if header["kind"] == "update" else doc["records"]
    assert hexify(items) == [x["wire"] for x in listed]


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


@pytest.mark.parametrize("name", [n for n in NAMES if "snapshot" not in n])
def test_epochs_and_csns_by_hand(name):
    """Epochs are not on the wire: the i-th op of an origin has epoch lo+1+i of its range."""
    _data, doc = load(name)
    h = doc["header"]
    nxt = {h["origins"][i]: lo + 1 for i, lo, _hi in h["ranges"]}
    hlc = 0
    for op in doc["ops"]:
        oi, delta, seq, coll, key, value, replaced = op["wire"]
        hlc += delta
        origin = h["origins"][oi]
        assert (origin, nxt[origin], hlc, seq) == (op["origin"], op["epoch"], op["hlc"], op["seq"])
        nxt[origin] += 1
        csn = hlc.to_bytes(8, "big") + bytes.fromhex(origin) + seq.to_bytes(4, "big")
        assert csn.hex() == op["csn"]
        assert (coll, key, value) == (op["collection"], op["key"], op["value"])
        assert replaced == "".join(op["replaced"])
    assert {h["origins"][i]: hi + 1 for i, _lo, hi in h["ranges"]} == nxt
    assert h["count"] == len(doc["ops"])


# --- reading through the codec -------------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_codec_reads_header(name):
    data, doc = load(name)
    f = io.BytesIO(data)
    env = codec.read_envelope(f, len(data))
    assert env.version == 1 and env.size == len(data) and env.body_offset == 9
    assert env.signature.hex() == doc["signature"]
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
    assert {k.hex(): e for k, e in h.ack_floor.items()} == {o[i]: e for i, e in w["ack_floor"]}
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


@pytest.mark.parametrize("name", [n for n in NAMES if "snapshot" not in n])
def test_codec_reads_ops(name):
    data, doc = load(name)
    ops = full_check(data, bytes.fromhex(doc["signer_ed25519"]))
    got = [{"origin": op.origin.hex(), "epoch": op.epoch, "hlc": op.hlc, "seq": op.seq,
            "csn": op.csn.hex(), "collection": op.collection, "key": op.key,
            "value": None if op.value is None else op.value.hex(),
            "replaced": [op.replaced[i:i + 20].hex() for i in range(0, len(op.replaced), 20)]}
           for op in ops]
    assert got == [{k: v for k, v in x.items() if k != "wire"} for x in doc["ops"]]


def test_codec_reads_snapshot_records():
    data, doc = load("v1-snapshot")
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


def test_split_parts_apply_on_their_own():
    """Two parts of one export: same seq, consecutive part numbers, final only on the last,
    adjacent ranges, distinct ids, the two-op transaction kept whole in part 1."""
    (d0, j0), (d1, j1) = load("v1-update-split-p0"), load("v1-update-split-p1")
    h0, h1 = j0["header"], j1["header"]
    assert (h0["seq"], h0["part"], h0["final"]) == (4, 0, False)
    assert (h1["seq"], h1["part"], h1["final"]) == (4, 1, True)
    assert h0["id"] != h1["id"]
    assert h0["ranges"] == [[0, 5, 6]] and h1["ranges"] == [[0, 6, 9]]
    assert [op["hlc"] for op in j1["ops"][:2]] == [gen.T7, gen.T7]
    # the clock delta restarts in every part
    assert j1["ops"][0]["wire"][1] == j1["ops"][0]["hlc"]
    for data in (d0, d1):
        assert len(data) <= gen.SPLIT_MAX_SIZE


def test_sealed_body_needs_the_recipient_key():
    data, doc = load("v1-update-sealed")
    public = bytes.fromhex(doc["signer_ed25519"])
    assert len(full_check(data, public)) == 2
    env = codec.read_envelope(io.BytesIO(data), len(data))
    assert env.header.sealed and env.header.seal_epk.hex() == doc["seal"]["epk"]
    with pytest.raises(PacketSealError):           # a site without an unsealer
        list(blocks.packet_ops(io.BytesIO(data), env))
    with pytest.raises(PacketSealError):           # the wrong recipient key
        full_check(data, public, unsealer("charlie"))
    # the plaintext is not visible in the file
    assert b"attack at dawn" not in data and b"secrets" not in data


def test_ack_only_has_empty_body():
    data, doc = load("v1-update-ack-only")
    h = doc["header"]
    assert (h["count"], h["ranges"], h["hlc_max"]) == (0, [], 0)
    body = data[9:9 + h["body_len"]]
    assert zstandard.ZstdDecompressor().decompressobj().decompress(body) == b""
    assert full_check(data, bytes.fromhex(doc["signer_ed25519"])) == []


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
    stored = sorted(p.name for p in VECTORS.iterdir() if p.name.startswith("v1-"))
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


def test_version_byte_is_checked_before_the_header():
    data, _doc = load("v1-update-basic")
    for v, words in ((2, "newer"), (255, "newer"), (0, "unknown")):
        bad = data[:8] + bytes([v]) + data[9:]
        with pytest.raises(PacketVersionError, match=words):
            codec.read_envelope(io.BytesIO(bad), len(bad))


def test_unknown_mandatory_feature_rejects_unknown_advisory_is_ignored():
    """Re-sign the basic vector's header with extra features (the key is the golden key)."""
    data, doc = load("v1-update-basic")
    hlen = doc["layout"]["header_len"]
    header = msgpack.unpackb(data[-72 - hlen:-72], raw=False)
    body = data[9:-72 - hlen]

    def repack(**changes) -> bytes:
        hb = codec.packb({**header, **changes})
        sig = gen.signing_key("alpha").sign(codec.signed_bytes(1, hb))
        return data[:9] + body + hb + len(hb).to_bytes(4, "big") + sig + b"SPKE"

    ok = repack(opt=["some-hint-from-the-future"], extra_field=1)
    assert len(full_check(ok, gen.public_key("alpha"))) == 7
    bad = repack(req=["zstd", "sealed-x25519"])
    with pytest.raises(PacketFeatureError, match="sealed-x25519"):
        full_check(bad, gen.public_key("alpha"))


# --- the worked hexdump in the spec ----------------------------------------------------------------

def test_spec_hexdumps_match_the_vectors():
    """Blocks in PACKET.md introduced by <!-- hexdump NAME --> must show the vector's bytes."""
    text = SPEC.read_text()
    blocks = re.findall(r"<!-- hexdump (\S+) -->\s*```[a-z]*\n(.*?)```", text, re.S)
    assert blocks, "PACKET.md has no hexdump blocks"
    for name, block in blocks:
        data = (VECTORS / f"{name}.spk").read_bytes()
        checked = 0
        for line in block.splitlines():
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
