"""A site's view of its links to peers: the stored figures of :mod:`syncpack.store.matrix`
for one site, joined with what only the site knows (its roster, its id)."""

from __future__ import annotations

from syncpack.format.csn import csn_hlc, csn_origin, csn_seq, pack_csn
from syncpack.replicated import FAMILY, FAMILY_KEY
from syncpack.rules import planning
from syncpack.rules.conflict import pick
from syncpack.site import Site
from syncpack.store import chain, log
from syncpack.store import matrix as stored
from syncpack.store.matrix import ranges_blob, ranges_from_blob, vec_blob, vec_from_blob

__all__ = ["matrix", "link", "ensure_link", "raise_matrix", "believed", "waiting_gaps",
           "acknowledgements", "store_acknowledgements", "own_acknowledgement", "ack_floor",
           "seal_key",
           "vec_blob", "vec_from_blob", "ranges_blob", "ranges_from_blob"]


def matrix(site: Site, peer: bytes) -> tuple[dict[bytes, int], dict[bytes, int]]:
    """(what we sent the peer, what it acknowledged), per origin."""
    return stored.matrix(site.conn, peer)


def link(site: Site, peer: bytes) -> dict:
    """The link's counters (:func:`syncpack.store.matrix.link`)."""
    return stored.link(site.conn, peer)


def ensure_link(site: Site, peer: bytes) -> None:
    stored.ensure_link(site.conn, peer)


def raise_matrix(site: Site, peer: bytes, column: str, vec: dict[bytes, int]) -> None:
    stored.raise_matrix(site.conn, peer, column, vec)


def believed(site: Site, peer: bytes) -> tuple[dict[bytes, int], dict[bytes, int]]:
    """(what we believe the peer holds, what it reported itself)."""
    sent, acked = stored.matrix(site.conn, peer)
    m = site.members_by_id(include_retired=True).get(peer)
    base = m.base if m else {}
    reseeded = log.newest_snapshot_to(site.conn, peer) > link(site, peer)["peer_recv_seq"]
    return planning.belief(sent, acked, base), planning.reported(acked, sent, peer, reseeded)


def seal_key(site: Site, peer: bytes, encrypt: bool) -> bytes | None:
    """The peer's X25519 key when a packet to it goes sealed, else None: asked for, the
    family's rule, or the rule lifted here by a write the peer is not known to hold.  Until
    it holds that write the peer still requires sealing, and would refuse our unsealed
    packets, the one that lifts the rule among them: the site that lifted it was cut off
    for good (its own status clean)."""
    return site.seal_key(peer, encrypt or _lifted_unheard(site, peer))


def _lifted_unheard(site: Site, peer: bytes) -> bool:
    if site.requires_sealing():
        return False
    vs = site.versions(FAMILY, FAMILY_KEY)
    if not vs:
        return False
    csn = pick(vs, "lww", {}).csn
    origin = csn_origin(csn)
    epoch = chain.epoch_of(site.conn, csn_hlc(csn), origin, csn_seq(csn))
    return epoch is not None and believed(site, peer)[0].get(origin, 0) < epoch


def waiting_gaps(site: Site, sender: bytes | None = None) -> dict[bytes, tuple[int, int]]:
    """What our parked packets wait for, merged per origin."""
    out: dict[bytes, tuple[int, int]] = {}
    for w in log.parked_waiting(site.conn, sender):
        for o, (lo, hi) in ranges_from_blob(w).items():
            cur = out.get(o)
            out[o] = (lo, max(hi, cur[1])) if cur else (lo, hi)
    v = site.vector()
    return {o: (v.get(o, 0), hi) for o, (lo, hi) in out.items() if hi > v.get(o, 0)}


def acknowledgements(site: Site) -> dict[bytes, tuple[int, dict[bytes, int], bytes]]:
    """member -> (created_ms, vector, signature): each member's newest signed word."""
    return stored.acknowledgements(site.conn)


def store_acknowledgements(site: Site, acks) -> None:
    """Keep each member's newest acknowledgement, and the one where it held the most of its
    own origin (already verified by the verifier)."""
    stored.store_acknowledgements(site.conn, site.site_id, acks)


def own_acknowledgement(site: Site, member: bytes) -> tuple[int, dict[bytes, int], bytes] | None:
    return stored.own_acknowledgement(site.conn, member)


def ack_floor(site: Site) -> dict[bytes, int]:
    """Per origin, the epoch every current member acknowledged holding, each in its own
    signed word (``planning.ack_floor``)."""
    return stored.ack_floor(site.conn, site.site_id, list(site.members_by_id()))


def tip_for(site: Site, peer: bytes, vec: dict[bytes, int]) -> tuple[int, bytes] | None:
    """The newest op of the peer's own origin we hold, so the peer can tell whether its own
    history still matches the family's (a restored site that wrote before it knew)."""
    e = vec.get(peer, 0)
    if not e:
        return None
    held = chain.op_id_at(site.conn, peer, e)
    return (e, pack_csn(held[0], peer, held[1])) if held else None
