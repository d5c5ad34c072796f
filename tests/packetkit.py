"""Taking packets apart and putting them back together, re-signed, as a member gone rogue (or
a buggy one) would with its own Ed25519 key; and what a refusal must leave behind.  Shared by
the tests of refused packets and of bounded trust."""

from __future__ import annotations

import hashlib
import io
import struct
from pathlib import Path

import msgpack
import pytest

from conftest import run

from syncpack.exchange import apply, verify
from syncpack.format import blocks, codec, keys
from syncpack.store import chain
from syncpack.format.codec import Op
from syncpack.site import Site

FOOTER = struct.Struct(">I64s4s")


def parts_of(raw: bytes) -> tuple[bytes, bytes, dict, int]:
    env = codec.read_envelope(io.BytesIO(raw), len(raw))
    body = raw[env.body_offset:env.body_offset + env.header.body_len]
    h = msgpack.unpackb(env.header_bytes, raw=False, strict_map_key=False)
    return raw[:env.body_offset], body, h, env.version


def rebuild(raw: bytes, key, edit=None, body: bytes | None = None) -> bytes:
    """``raw`` with its header edited and/or its body replaced, signed by ``key``."""
    prefix, old_body, h, version = parts_of(raw)
    if body is not None:
        h["body_len"] = len(body)
        h["body_hash"] = hashlib.blake2b(body, digest_size=32).digest()
    if edit:
        edit(h)
    hb = codec.packb(h)
    sig = key.sign(codec.signed_bytes(version, hb))
    return prefix + (old_body if body is None else body) + hb + FOOTER.pack(len(hb), sig,
                                                                            codec.END_MAGIC)


def blocks_of(raw: bytes) -> list[bytes]:
    _prefix, body, _h, _v = parts_of(raw)
    return list(blocks.split_blocks([body]))


def ops_of(raw: bytes) -> list[Op]:
    return [op for b in blocks_of(raw) for op in blocks.decode_ops(b)]


def reblock(raw: bytes, ops: list[Op], key) -> bytes:
    """One block of ``ops`` made again, as its original's origin and predecessor claim, but
    signed with ``key``: what a forger can make."""
    first = blocks.read_block_header(blocks_of(raw)[0])
    family = codec.read_envelope(io.BytesIO(raw), len(raw)).header.family
    return blocks.encode_block(family, ops[0].origin, first.prev_hash, ops, key.sign)


def sign_key(site: Path):
    return keys.load_signing_key(site)


def state(site: Path) -> dict:
    """Everything an import could touch."""
    with Site.open(site) as s:
        c = s.conn
        q = lambda sql: sorted(c.execute(sql).fetchall())  # noqa: E731
        return {"digest": s.digest()[0], "vector": q("SELECT * FROM vector"),
                "changelog": chain.count(c),
                "packets_in": q("SELECT packet_id FROM packets_in"),
                "parked": q("SELECT packet_id FROM parked"), "matrix": q("SELECT * FROM matrix"),
                "links": q("SELECT * FROM links"), "meta": q("SELECT * FROM meta")}


def write(tmp: Path, name: str, data: bytes) -> Path:
    p = tmp / name
    p.write_bytes(data)
    return p


def rejected_by_cli(site: Path, path: Path) -> str:
    """``syncpack import PATH`` must refuse with exit 1 and one error line naming the file."""
    r = run("import", path, site=site)
    assert r.code == 1, r
    errors = [ln for ln in r.err.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and str(path) in errors[0], r
    r = run("import", path, site=site, json_mode=True)
    assert r.code == 1 and len(r.json["rejected"]) == 1 and not r.json["applied"], r
    return r.json["rejected"][0]["error"]


def verify_raises(site: Path, path: Path, cls):
    with Site.open(site) as s:
        pk = verify.open_packet(path)
        try:
            with pytest.raises(cls) as ei:
                verify.verify(s, pk)
        finally:
            pk.close()
    return ei.value


def apply_raises(site: Path, path: Path, cls):
    """Verification passes; applying fails with ``cls`` and leaves nothing behind."""
    with Site.open(site) as s:
        pk = verify.open_packet(path)
        try:
            verify.verify(s, pk)
            with pytest.raises(cls) as ei:
                apply.apply_packet(s, pk)
        finally:
            pk.close()
    return ei.value


def snapshot_records(raw: bytes) -> list[list]:
    """The ``[collection, key, csn, value]`` records of an unsealed snapshot part."""
    import zstandard
    _prefix, body, _h, _v = parts_of(raw)
    data = zstandard.ZstdDecompressor().decompressobj().decompress(body)
    return list(msgpack.Unpacker(io.BytesIO(data), raw=False, strict_map_key=False))


def snapshot_body(records: list[list]) -> bytes:
    import zstandard
    return zstandard.ZstdCompressor(level=3).compress(b"".join(map(codec.packb, records)))
