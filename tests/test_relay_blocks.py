"""A relaying member cannot alter, splice, reorder or drop from the middle another origin's ops
(format 2, formats/BLOCKS.md): every block is checked against its origin's key, whoever relays
it, and each refusal names the origin, applies nothing and leaves the store as it was.

The family: A writes three transactions, B imports them and relays them to C.  B is a member
with a valid key, so every forged packet below carries B's own valid packet signature; only
the blocks can give the forgery away.
"""

from __future__ import annotations

import pytest

from conftest import run
from syncpack.format import blocks, codec
from test_tamper import blocks_of, ops_of, parts_of, rebuild, sign_key, state, write


@pytest.fixture
def relay(family):
    family.init("A")
    family.add("B", via="A")
    family.add("C", via="A")
    family.full_exchange(2)
    for i in range(3):                  # three transactions, sealed as one block each
        with family.open("A") as s, s.transaction() as tx:
            for j in range(1200):
                tx.put("parts", f"p{i}-{j}", {"qty": i * 10_000 + j})
    family.sync("A", "B")
    [p] = family.export("B", "C")
    raw = p.read_bytes()
    with family.open("A") as s:
        a_id = s.site_id
    assert sum(1 for b in blocks_of(raw) if b[6:14] == a_id) == 3
    return family, raw, a_id


def refused(family, tmp_path, name: str, data: bytes) -> str:
    """C refuses the forged packet: exit 1, one error line, nothing applied or changed."""
    path = write(tmp_path, name, data)
    before = state(family.path("C"))
    r = run("import", path, site=family.path("C"))
    assert r.code == 1, r
    errors = [ln for ln in r.err.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in r.err, r
    assert state(family.path("C")) == before
    with family.open("C") as s:
        assert s.get("parts", "p0-0", None) is None
    return errors[0]


def forged_body(raw: bytes, edit) -> bytes:
    """B re-signs the packet (a valid signature of the sender) over a body edited by ``edit``
    (a function of the list of raw blocks)."""
    body = b"".join(edit(blocks_of(raw)))
    return rebuild(raw, SIGNER[0], body=body)


SIGNER: list = []


@pytest.fixture(autouse=True)
def _b_signs(relay):
    family, _raw, _a = relay
    SIGNER[:] = [sign_key(family.path("B"))]
    yield
    SIGNER.clear()


def a_blocks(bs: list[bytes], a_id: bytes) -> list[int]:
    return [i for i, b in enumerate(bs) if b[6:14] == a_id]


def test_the_honest_relay_applies(relay, tmp_path):
    family, raw, _a = relay
    path = write(tmp_path, "honest.spk", rebuild(raw, SIGNER[0]))
    assert run("import", path, site=family.path("C")).code == 0
    assert family.digest("C") == family.digest("A")


def test_one_op_altered_is_refused_naming_the_origin(relay, tmp_path):
    family, raw, a_id = relay

    def edit(bs):
        i = a_blocks(bs, a_id)[1]
        ops = list(blocks.decode_ops(bs[i]))
        ops[5] = ops[5]._replace(value=codec.encode_value({"qty": 1_000_000}))
        info = blocks.read_block_header(bs[i])
        family_id = codec.read_envelope(__import__("io").BytesIO(raw), len(raw)).header.family
        # B can make the block only with its own key
        bs[i] = blocks.encode_block(family_id, a_id, info.prev_hash, ops, SIGNER[0].sign)
        return bs
    err = refused(family, tmp_path, "altered.spk", forged_body(raw, edit))
    assert "block of origin A" in err and "signature does not verify" in err, err


def test_a_flipped_byte_in_a_block_body_is_refused_naming_the_origin(relay, tmp_path):
    family, raw, a_id = relay

    def edit(bs):
        i = a_blocks(bs, a_id)[0]
        b = bytearray(bs[i])
        b[blocks.HEADER_LEN + 40] ^= 0x01
        bs[i] = bytes(b)
        return bs
    err = refused(family, tmp_path, "flipped.spk", forged_body(raw, edit))
    assert "block of origin A" in err and "body does not match its signed hash" in err, err


def test_a_spliced_block_is_refused_naming_the_origin(relay, tmp_path):
    """Header and signature of A's first block over the body of its second."""
    family, raw, a_id = relay

    def edit(bs):
        i, j = a_blocks(bs, a_id)[:2]
        bs[i] = bs[i][:blocks.HEADER_LEN] + bs[j][blocks.HEADER_LEN:]
        return bs
    err = refused(family, tmp_path, "spliced.spk", forged_body(raw, edit))
    assert "block of origin A" in err, err


def test_a_block_dropped_from_the_middle_is_refused_naming_the_origin(relay, tmp_path):
    family, raw, a_id = relay

    def edit(bs):
        del bs[a_blocks(bs, a_id)[1]]
        return bs

    err = refused(family, tmp_path, "dropped.spk", forged_body(raw, edit))
    assert "block of A" in err and "does not continue" in err, err


def test_reordered_blocks_are_refused(relay, tmp_path):
    family, raw, a_id = relay

    def edit(bs):
        i, j = a_blocks(bs, a_id)[1:3]
        bs[i], bs[j] = bs[j], bs[i]
        return bs
    err = refused(family, tmp_path, "reordered.spk", forged_body(raw, edit))
    assert "block of A" in err and "does not continue" in err, err


def test_ops_merged_from_two_blocks_into_one_are_refused(relay, tmp_path):
    """B re-encodes two of A's blocks as one (same ops, fewer signatures): only A can sign it."""
    family, raw, a_id = relay

    def edit(bs):
        i, j = a_blocks(bs, a_id)[:2]
        ops = list(blocks.decode_ops(bs[i])) + list(blocks.decode_ops(bs[j]))
        info = blocks.read_block_header(bs[i])
        family_id = codec.read_envelope(__import__("io").BytesIO(raw), len(raw)).header.family
        bs[i] = blocks.encode_block(family_id, a_id, info.prev_hash, ops, SIGNER[0].sign)
        del bs[j]
        return bs
    err = refused(family, tmp_path, "merged.spk", forged_body(raw, edit))
    assert "block of origin A" in err and "signature does not verify" in err, err


def test_ops_of_the_relayed_packet_are_the_origins_own(relay):
    """What C would apply from the honest relay is exactly what A wrote, block by block."""
    family, raw, a_id = relay
    ops = [op for op in ops_of(raw) if op.origin == a_id]
    assert len(ops) == 3600 and ops[0].key == "p0-0"
    _prefix, _body, h, version = parts_of(raw)
    assert version == codec.FORMAT_VERSION == 2 and "blocks" in h["req"]


def test_a_block_that_does_not_chain_onto_the_one_before_it_in_the_packet_is_refused(relay,
                                                                                     tmp_path):
    """Even the origin itself cannot continue its blocks in one packet from another past: the
    second block names a predecessor other than the first (a fork), signed with A's own key."""
    family, raw, a_id = relay
    a_key = sign_key(family.path("A"))

    def edit(bs):
        i = a_blocks(bs, a_id)[1]
        ops = list(blocks.decode_ops(bs[i]))
        family_id = codec.read_envelope(__import__("io").BytesIO(raw), len(raw)).header.family
        bs[i] = blocks.encode_block(family_id, a_id, b"\x42" * 32, ops, a_key.sign)
        return bs
    err = refused(family, tmp_path, "forked.spk", forged_body(raw, edit))
    assert "block of origin A" in err and "does not continue the chain" in err, err
