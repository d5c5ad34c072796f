"""The packet-cutting rule, without Spark: the writer that has the blocks' bytes
(build_update_packets, the local engine) and the planner that has only their sizes
(plan_packets, the Spark engine) must cut the same blocks into the same parts."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from hypothesis import given, settings, strategies as st

from syncpack.errors import ExportError
from syncpack.exchange.packets import BlockRef, build_update_packets, plan_packets
from syncpack.format import codec
from syncpack.format.codec import Header

ORIGINS = [bytes([i]) * 8 for i in range(1, 4)]
SEED = b"cutting-rule-test"


def template(anchored: bool) -> Header:
    return Header(kind=codec.KIND_UPDATE, mandatory=[codec.FEATURE_BLOCKS], family=b"F" * 16,
                  sender=ORIGINS[0], recipient=b"R" * 8, packet_id=b"", seq=7, part=0,
                  final=True, created_ms=1_700_000_000_000,
                  vector={o: 1000 for o in ORIGINS},
                  anchors={o: b"\x01" * 16 for o in ORIGINS} if anchored else {})


def make_blocks(specs: list[tuple[int, int, int]]) -> list[BlockRef]:
    """(origin index, ops, bytes) per block, each origin's blocks consecutive in epochs."""
    at = {o: 3 for o in ORIGINS}
    out = []
    for k, (oi, ops, size) in enumerate(specs):
        o = ORIGINS[oi]
        lo, hi = at[o], at[o] + ops
        at[o] = hi
        out.append(BlockRef(o, lo, hi, 10 * k + 1, 10 * k + 5, ops - 1,
                            bytes([k % 251]) * size))
    return out


def memory_opener():
    def opener(part: int):
        return io.BytesIO(), lambda ok: Path(f"part-{part}")
    return opener


def sign(_b: bytes) -> bytes:
    return b"\x00" * 64


def recipient_key() -> bytes:
    return X25519PrivateKey.generate().public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def both(blocks: list[BlockRef], tmpl: Header, max_size: int, seal_to: bytes | None):
    """The parts each engine's rule gives, as (packet id, count, per-part fields), or the
    error each raised."""
    try:
        built = [(p.header.packet_id, p.header.count, p.header.ranges, p.header.hlc_max,
                  p.header.anchors, p.header.final, p.header.piece)
                 for p in build_update_packets(iter(blocks), tmpl, sign, max_size,
                                               memory_opener(), SEED, seal_to=seal_to)]
    except ExportError as e:
        built = ("error", str(e), e.hint)
    try:
        plan = plan_packets(blocks, [len(b.data) for b in blocks], tmpl, max_size, SEED,
                            seal_to)
        planned = [(pp.packet_id, pp.count, pp.fields["ranges"], pp.fields["hlc_max"],
                    pp.fields["anchors"], pp.part == len(plan.parts) - 1,
                    pp.fields.get("piece"))
                   for pp in plan.parts]
    except ExportError as e:
        planned = ("error", str(e), e.hint)
    return built, planned


spec = st.tuples(st.integers(0, len(ORIGINS) - 1), st.integers(1, 50), st.integers(1, 6000))


@settings(max_examples=60, deadline=None)
@given(specs=st.lists(spec, max_size=25), extra=st.integers(0, 12000),
       sealed=st.booleans(), anchored=st.booleans())
def test_plan_and_writer_cut_alike(specs, extra, sealed, anchored):
    blocks = make_blocks(specs)
    tmpl = template(anchored)
    # a size just above the smallest allowed for this header, so cuts actually happen
    floor = codec.framing_overhead() + codec.header_reserve(tmpl, tmpl.origin_table()) + 1024
    built, planned = both(blocks, tmpl, floor + extra, recipient_key() if sealed else None)
    assert built == planned


def test_cuts_happen_and_agree():
    blocks = make_blocks([(i % 3, 5, 3000) for i in range(12)])
    tmpl = template(True)
    floor = codec.framing_overhead() + codec.header_reserve(tmpl, tmpl.origin_table())
    built, planned = both(blocks, tmpl, floor + 7000, None)
    assert built == planned
    assert len(built) >= 5
    assert sum(p[1] for p in built) == 60
    # an origin's anchor goes with the first part that holds that origin, never again
    anchored = [o for p in built for o in p[4]]
    assert sorted(anchored) == sorted(set(anchored)) == sorted(ORIGINS)


def test_too_big_block_travels_in_pieces_and_budget_errors_agree():
    tmpl = template(False)
    floor = codec.framing_overhead() + codec.header_reserve(tmpl, tmpl.origin_table())
    blocks = make_blocks([(0, 2, 100), (0, 1, 5000), (1, 3, 100)])
    built, planned = both(blocks, tmpl, floor + 2000, None)
    assert built == planned
    pieces = [p[6] for p in built if p[6] is not None]
    assert len(pieces) >= 3 and [off for off, _n in pieces][0] == 0
    assert {n for _off, n in pieces} == {5000}
    assert built[0][6] is None and built[-1][6] is None and built[-1][5]
    # the pieces' bytes, joined, are the block
    out: dict[int, io.BytesIO] = {}

    def opener(part: int):
        out[part] = io.BytesIO()
        return out[part], lambda ok: Path(f"part-{part}")

    parts = build_update_packets(iter(blocks), tmpl, sign, floor + 2000, opener, SEED)
    joined = b""
    for p in parts:
        if p.header.piece is not None:
            raw = out[p.header.part].getvalue()
            env = codec.read_envelope(io.BytesIO(raw), len(raw))
            joined += b"".join(codec.body_chunks(io.BytesIO(raw), env))
    assert joined == blocks[1].data
    built, planned = both(make_blocks([(0, 1, 10)]), tmpl, floor + 10, None)
    assert built == planned and built[0] == "error" and "leaves no room" in built[1]
    with pytest.raises(ExportError):
        plan_packets([], [], tmpl, floor)
