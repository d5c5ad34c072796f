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


def reported(acked: Vector, sent: Vector, peer: bytes, reseeded: bool) -> dict[bytes, int]:
    """What ``peer`` reported holding, per origin, as its own origin is planned from.  When we
    sent it a snapshot it had not yet received at its last report (``reseeded``), that report
    predates the re-seed: its own origin counts as far as we sent it, or the next export would
    ask for yet another snapshot of the history the first one brought back."""
    out = dict(acked)
    if reseeded and sent.get(peer, 0) > out.get(peer, 0):
        out[peer] = sent[peer]
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


def holds_through(floor: int, held: tuple[int, int, int] | None, epoch: int) -> bool:
    """Whether a changelog holds every op of an origin from above its ``floor`` through
    ``epoch``: ``held`` is (lowest, highest, count) of the ops it holds of that origin."""
    if epoch <= floor:
        return False        # nothing of it to keep
    if held is None:
        return False
    lo, hi, n = held
    return lo == floor + 1 and hi >= epoch and n == hi - lo + 1


def gaps(ranges: Mapping[bytes, tuple[int, int]], vector: Vector) -> Ranges:
    """Epochs missing before a packet with these ranges can apply: origin -> (held, from)."""
    out: Ranges = {}
    for origin, (lo, _hi) in ranges.items():
        held = vector.get(origin, 0)
        if lo > held:
            out[origin] = (held, lo)
    return out


def ops_beyond(planned: Mapping[bytes, tuple[int, int]],
               written: list[Mapping[bytes, tuple[int, int]]]) -> int:
    """Ops of the ``planned`` ranges past what the ``written`` ranges reach: what an export
    cut short by a full medium leaves for the next one (each origin's ops travel in order)."""
    reached: dict[bytes, int] = {}
    for ranges in written:
        for o, (_lo, hi) in ranges.items():
            reached[o] = max(reached.get(o, 0), hi)
    return sum(max(0, hi - max(lo, reached.get(o, 0))) for o, (lo, hi) in planned.items())


def merge_max(a: Vector, b: Vector) -> dict[bytes, int]:
    """Per origin, the more of two vectors: what either says is held."""
    return {o: max(a.get(o, 0), b.get(o, 0)) for o in a.keys() | b.keys()}


def lag(vector: Vector, believed: Vector, peer: bytes, peer_reported: Vector) -> int:
    """How many ops we hold that the peer (as far as we know) lacks."""
    total = 0
    for origin, top in vector.items():
        have = peer_reported.get(origin, 0) if origin == peer else believed.get(origin, 0)
        total += max(0, top - have)
    return total


# --- decisions about what to believe and when to act (pure; the store only feeds them) --------

def ack_floor(own: Vector, acknowledgements: list[Vector]) -> dict[bytes, int]:
    """Per origin we hold, the epoch every member has acknowledged holding: the least over our
    own vector and each other member's own signed acknowledgement (a member without one holds
    nothing as far as trimming goes).  Nobody's summary of somebody else counts."""
    out = {}
    for o, e in own.items():
        f = min([e, *(a.get(o, 0) for a in acknowledgements)])
        if f:
            out[o] = f
    return out


def should_send(ranges: Ranges, told: Vector | None, vector: Vector, unconfirmed: bool,
                recovering: bool, grown_acks: bool = False) -> bool:
    """Whether a packet goes to a peer: ops to send; or the peer has not seen our current
    vector (``told`` is None when we never told it, or must tell it again, which an empty
    vector must not be mistaken for); or our last packets are unconfirmed; or a member's
    acknowledgement has grown since the peer was last given it (``grown_acks``: a spoke
    hears through its hub that a member it never meets holds its changes).  A recovering site
    always speaks: each packet asks the peer to answer with the members' newest word, which
    the site waits for (a hub relays it from spokes the site never meets, and has nothing
    else to write it)."""
    if ranges or unconfirmed or grown_acks or recovering:
        return True
    current = {o: e for o, e in vector.items() if e}
    if told is None:
        return bool(current)
    return {o: e for o, e in told.items() if e} != current


def covers(higher: Vector, lower: Vector) -> bool:
    """Whether ``higher`` holds at least every epoch ``lower`` holds, origin by origin."""
    return all(e <= higher.get(o, 0) for o, e in lower.items())


def wind_back(sent: Vector, peer_vector: Vector, seen_hi: Vector) -> dict[bytes, int]:
    """Lost packets: the peer has seen our packets carrying up to ``seen_hi`` (or reports a
    gap up to it), yet its vector lacks them.  Returns origin -> lowered 'sent' estimate."""
    out = {}
    for o, hi in seen_hi.items():
        have = peer_vector.get(o, 0)
        if have < hi and sent.get(o, 0) > have:
            out[o] = have
    return out


def scrub_floors(acked: Vector, floors: Vector, vector: Vector,
                 first_too_young: Mapping[bytes, int]) -> dict[bytes, tuple[int, int]]:
    """origin -> (old floor, new floor): trim what every member acknowledged and we hold, but
    never an op younger than the minimum age (``first_too_young``: the first such epoch)."""
    plan = {}
    for o, e in acked.items():
        new = min(e, vector.get(o, 0))
        young = first_too_young.get(o)
        if young is not None:
            new = min(new, young - 1)
        if new > floors.get(o, 0):
            plan[o] = (floors.get(o, 0), new)
    return plan


def snapshot_rollback(snapshot: Vector, vector: Vector, floors: Vector) -> bytes | None:
    """A resync snapshot may not roll state back: for every origin where it is behind us, we
    must still hold every later op in our changelog to replay on top of it.  Returns the first
    origin it would roll back, or None."""
    for o, e in sorted(vector.items()):
        if snapshot.get(o, 0) < e and floors.get(o, 0) > snapshot.get(o, 0):
            return o
    return None


def unproven_claim(claimed: Vector, held: Vector, proven: Vector,
                   exempt: set[bytes]) -> bytes | None:
    """A resync snapshot is its sender's word about every origin in it; for another origin
    (not ``exempt``: the sender, whose own word it is, and us) that word is believed only as
    far as that origin itself signed it holds (``proven``: its own acknowledgement, the one
    holding the most of its own origin) or as we already hold.  Any member holding an
    origin's ops got them in packets whose acknowledgements say so, and a member can trim
    them only once their origin acknowledged them, so an honest sender always has the proof
    to carry.  Returns the first origin claimed beyond it, or None."""
    for o, e in sorted(claimed.items()):
        if o not in exempt and e > max(held.get(o, 0), proven.get(o, 0)):
            return o
    return None


def own_claim_dismissed(claim: int, held: int, proven: int, saw_our_report: bool,
                        delivered: bool) -> bool:
    """A member's claim to hold more of our own history than we do delays us (we refuse
    writes until the ops come back) only while it is consistent with what we can check.  Up
    to ``proven`` (our own signed acknowledgement, which the member relayed back to us) it is
    our own word and always stands.  Beyond that, once the member has seen our report of
    being behind and its next applied packet still does not bring us up to its claim, the
    claim is dismissed."""
    return claim > max(held, proven) and saw_our_report and not delivered
