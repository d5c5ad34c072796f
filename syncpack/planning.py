"""Range planning over epoch vectors: pure functions, no I/O.

Vectors are plain ``dict[origin_id, epoch]``; a missing origin means epoch 0.
"""

from __future__ import annotations

from typing import Mapping

Vector = Mapping[bytes, int]
Ranges = dict[bytes, tuple[int, int]]  # origin -> (from_exclusive, to_inclusive)


class BelowFloor(Exception):
    """A peer needs epochs this site no longer holds in its changelog."""

    def __init__(self, origin: bytes, needed: int, floor: int):
        super().__init__(origin, needed, floor)
        self.origin, self.needed, self.floor = origin, needed, floor


def belief(sent: Vector, acked: Vector, base: Vector) -> dict[bytes, int]:
    """What we believe a peer holds: the most of what we sent it, what it reported, and the
    state it was created from."""
    out: dict[bytes, int] = {}
    for v in (sent, acked, base):
        for o, e in v.items():
            if e > out.get(o, 0):
                out[o] = e
    return out


def plan_ranges(vector: Vector, peer: bytes, believed: Vector, peer_reported: Vector,
                floor: Vector, seeded: Vector | None = None, me: bytes | None = None) -> Ranges:
    """The increments ``peer`` lacks, per origin.

    The peer is the authority on its own origin, so that origin is planned from what the peer
    itself reported (sent only when it reported being behind, i.e. after a restore), never from
    our estimates.  Raises :class:`BelowFloor` when a needed op has been trimmed.  An origin
    whose needed ops we only ever held inside a snapshot (``seeded``) is left out: the sites we
    were seeded from hold them and relay them.  That includes our own origin after a hard
    resync, when what we believe a peer holds of it is stale (a restore resets it).
    """
    ranges: Ranges = {}
    for origin, top in vector.items():
        have = peer_reported.get(origin, 0) if origin == peer else believed.get(origin, 0)
        if top <= have:
            continue
        if have < floor.get(origin, 0):
            if seeded and have < seeded.get(origin, 0):
                continue
            raise BelowFloor(origin, have + 1, floor.get(origin, 0) + 1)
        ranges[origin] = (have, top)
    return ranges


def gaps(ranges: Mapping[bytes, tuple[int, int]], vector: Vector) -> Ranges:
    """Epochs missing before a packet with these ranges can apply: origin -> (held, from)."""
    out: Ranges = {}
    for origin, (lo, _hi) in ranges.items():
        held = vector.get(origin, 0)
        if lo > held:
            out[origin] = (held, lo)
    return out


def lag(vector: Vector, believed: Vector, peer: bytes, peer_reported: Vector) -> int:
    """How many ops we hold that the peer (as far as we know) lacks."""
    total = 0
    for origin, top in vector.items():
        have = peer_reported.get(origin, 0) if origin == peer else believed.get(origin, 0)
        total += max(0, top - have)
    return total


def vmax(a: Vector, b: Vector) -> dict[bytes, int]:
    out = dict(a)
    for o, e in b.items():
        if e > out.get(o, 0):
            out[o] = e
    return out


def vmin_all(vectors: list[Vector], origins) -> dict[bytes, int]:
    """Per origin, the least epoch over all vectors (0 where any lacks it)."""
    return {o: min((v.get(o, 0) for v in vectors), default=0) for o in origins}
