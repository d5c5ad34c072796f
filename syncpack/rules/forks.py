"""When two signed block headers of one origin prove that it signed two histories.

Pure functions (docs/design.md §3.10).  A header alone is enough for a third site to check the
proof: the origin's signature covers every field used here, and no body is needed, so the
evidence is small enough to travel in packet headers.

Two headers ``a`` and ``b`` of the same origin, with different block hashes, prove a fork when
one of these holds:

- same ``hi`` and different ``hlc_last``: the op at epoch ``hi`` is the last one of each
  block's last transaction, so the two blocks name two ops with different CSNs for that epoch;
- same ``lo`` and different ``hlc_first``: the same for epoch ``lo + 1``;
- same ``lo``, ``hi`` and ``prev_hash``: the same ops after the same past always encode to
  the same bytes (the origin's encoding and signature are deterministic), so two different
  blocks there hold different ops.

Blocks of one honest history may overlap (an origin seals its ops again after a restore, in
other groups), but they never meet any of these conditions: they hold the same ops, so every
shared epoch has the same clock.  The fork epoch reported is the first epoch both blocks hold:
the histories may differ from there on (they may also differ earlier; a site healing its own
fork finds that out as its peers send their version, see ``admin/recovery.py``).
"""

from __future__ import annotations

from typing import NamedTuple


class HeaderFacts(NamedTuple):
    """What the proof reads from a signed block header."""
    origin: bytes
    lo: int
    hi: int
    hlc_first: int
    hlc_last: int
    prev_hash: bytes
    block_hash: bytes


def fork_epoch(a: HeaderFacts, b: HeaderFacts) -> int | None:
    """The first epoch the two blocks both hold if together they prove a fork, else None."""
    if a.origin != b.origin or a.block_hash == b.block_hash:
        return None
    same_hi = a.hi == b.hi
    same_lo = a.lo == b.lo
    if (same_hi and a.hlc_last != b.hlc_last) or (same_lo and a.hlc_first != b.hlc_first) \
            or (same_lo and same_hi and a.prev_hash == b.prev_hash):
        return max(a.lo, b.lo) + 1
    return None


def canonical(a: bytes, b: bytes) -> tuple[bytes, bytes]:
    """The pair in one order (by bytes), so every site names and stores one fork once."""
    return (a, b) if a <= b else (b, a)


def deciding(evidence: list[tuple[int, bytes, bytes]]) -> tuple[int, bytes, bytes]:
    """Of several pieces of evidence ``(fork epoch, a, b)`` against one retired origin, the
    one whose :func:`winner` every site keeps: the lowest fork epoch (ties by bytes).  The
    histories part there; a piece at a later epoch compares blocks after that point, and its
    own winner may lie in the other history, so deciding each piece alone could keep the
    start of one history and the rest of the other (a chain the origin never signed whole,
    a transaction cut in two).  Sites that learn the pieces in different orders decide again
    when a lower one arrives, and end with the same choice."""
    return min(evidence)


def winner(a: HeaderFacts, b: HeaderFacts) -> HeaderFacts:
    """The history every site keeps when a fork is ended by retiring its member: a
    deterministic choice that needs nothing but the evidence (the lower block hash)."""
    return a if a.block_hash <= b.block_hash else b


# What a site does when shown evidence that it signed two histories itself (own_keep).
WAIT = "wait"


def own_keep(held: tuple[bool, bool], aside: tuple[bool, bool],
             sender_holds_ours: bool | None) -> int | str | None:
    """Which of the two versions ``(a, b)`` of its own epoch a site keeps when shown that it
    signed both: the index of the one kept, None to keep neither (it holds both or none, and
    set neither aside: nothing to choose between), or :data:`WAIT` until a peer's word tells.

    ``held``: whether the site holds each; ``aside``: whether it set each aside on a peer's
    word before (that peer holds the other, which is the family's: what it holds now may be
    the family's block come back); ``sender_holds_ours``: whether the peer whose packet showed
    the evidence holds, as its newest op of our origin at or past the fork, the op we hold
    there (None if its packet does not say: it holds none of our ops from the fork on).

    The version kept is always one a peer holds.  Keeping the one we do not hold whatever the
    peer holds (right after a careless restore, where only this site holds its version) made
    each of two running copies of one site keep the other's: peers settle on the first word
    they hear, and the copy that went on then refused, as the version it left, the one the
    family held, and waited for good or issued that epoch again."""
    if aside[0] != aside[1]:
        return 1 if aside[0] else 0
    if held[0] != held[1]:
        if sender_holds_ours is None:
            return WAIT
        ours = 0 if held[0] else 1
        return ours if sender_holds_ours else 1 - ours
    return None
