"""The epoch matrix and per-link bookkeeping, as stored: what we sent each peer, what it
acknowledged, and the link sequence numbers.  The decisions made from these figures are pure
functions in :mod:`syncpack.rules.planning`; this module only reads and writes them."""

from __future__ import annotations

from syncpack.format import codec
from syncpack.rules import planning
from syncpack.site import Site


def vec_blob(v: dict[bytes, int]) -> bytes:
    return codec.packb(sorted([o, e] for o, e in v.items() if e))


def vec_from_blob(b: bytes | None) -> dict[bytes, int]:
    return {o: e for o, e in codec.unpackb(b)} if b else {}


def ranges_blob(r: dict[bytes, tuple[int, int]]) -> bytes:
    return codec.packb(sorted([o, lo, hi] for o, (lo, hi) in r.items()))


def ranges_from_blob(b: bytes | None) -> dict[bytes, tuple[int, int]]:
    return {o: (lo, hi) for o, lo, hi in codec.unpackb(b)} if b else {}


def matrix(site: Site, peer: bytes) -> tuple[dict[bytes, int], dict[bytes, int]]:
    """(what we sent the peer, what it acknowledged), per origin."""
    sent, acked = {}, {}
    for o, s, a in site.conn.execute("SELECT origin, sent, acked FROM matrix WHERE peer=?",
                                     (peer,)):
        if s:
            sent[o] = s
        if a:
            acked[o] = a
    return sent, acked


def link(site: Site, peer: bytes) -> dict:
    """The link's counters.  ``told`` is None until we have told the peer a vector (an empty
    vector told is not the same as nothing told: a restored site's vector may be empty)."""
    row = site.conn.execute("SELECT out_seq, in_seq, told, peer_recv_seq, peer_waiting FROM links "
                            "WHERE peer=?", (peer,)).fetchone()
    if row is None:
        return {"out_seq": 0, "in_seq": 0, "told": None, "peer_recv_seq": 0, "peer_waiting": {}}
    return {"out_seq": row[0], "in_seq": row[1],
            "told": None if row[2] is None else vec_from_blob(row[2]),
            "peer_recv_seq": row[3], "peer_waiting": ranges_from_blob(row[4])}


def ensure_link(site: Site, peer: bytes) -> None:
    site.conn.execute("INSERT OR IGNORE INTO links(peer) VALUES (?)", (peer,))


def raise_matrix(site: Site, peer: bytes, column: str, vec: dict[bytes, int]) -> None:
    assert column in ("sent", "acked")
    site.conn.executemany(
        f"INSERT INTO matrix(peer, origin, {column}) VALUES (?, ?, ?) "
        f"ON CONFLICT(peer, origin) DO UPDATE SET {column}=max({column}, excluded.{column})",
        [(peer, o, e) for o, e in vec.items()])


def believed(site: Site, peer: bytes) -> tuple[dict[bytes, int], dict[bytes, int]]:
    """(what we believe the peer holds, what it reported itself)."""
    sent, acked = matrix(site, peer)
    m = site.members_by_id(include_retired=True).get(peer)
    base = m.base if m else {}
    return planning.belief(sent, acked, base), acked


def waiting_gaps(site: Site, sender: bytes | None = None) -> dict[bytes, tuple[int, int]]:
    """What our parked packets wait for, merged per origin."""
    out: dict[bytes, tuple[int, int]] = {}
    q = "SELECT waiting FROM parked" + (" WHERE sender=?" if sender else "")
    for (w,) in site.conn.execute(q, (sender,) if sender else ()):
        for o, (lo, hi) in ranges_from_blob(w).items():
            cur = out.get(o)
            out[o] = (lo, max(hi, cur[1])) if cur else (lo, hi)
    v = site.vector()
    return {o: (v.get(o, 0), hi) for o, (lo, hi) in out.items() if hi > v.get(o, 0)}


def acknowledgements(site: Site) -> dict[bytes, tuple[int, dict[bytes, int], bytes]]:
    """member -> (created_ms, vector, signature): each member's newest signed word."""
    return {m: (c, vec_from_blob(v), sig) for m, c, v, sig in
            site.conn.execute("SELECT member, created_ms, vector, signature FROM acks")}


def store_acknowledgements(site: Site, acks) -> None:
    """Keep each member's newest acknowledgement, and the one where it held the most of its
    own origin (already verified by the verifier)."""
    rows = [(m, c, vec_blob(v), sig, v.get(m, 0)) for m, c, v, sig in acks
            if m != site.site_id]
    site.conn.executemany(
        "INSERT INTO acks VALUES (?, ?, ?, ?) ON CONFLICT(member) DO UPDATE SET "
        "created_ms=excluded.created_ms, vector=excluded.vector, signature=excluded.signature "
        "WHERE excluded.created_ms > acks.created_ms", [r[:4] for r in rows])
    site.conn.executemany(
        "INSERT INTO own_acks VALUES (?, ?, ?, ?, ?) ON CONFLICT(member) DO UPDATE SET "
        "epoch=excluded.epoch, created_ms=excluded.created_ms, vector=excluded.vector, "
        "signature=excluded.signature WHERE excluded.epoch > own_acks.epoch",
        [(m, e, c, v, sig) for m, c, v, sig, e in rows if e])


def own_acknowledgement(site: Site, member: bytes) -> tuple[int, dict[bytes, int], bytes] | None:
    """(created_ms, vector, signature) of the member's acknowledgement holding the most of its
    own origin, if we have one."""
    row = site.conn.execute("SELECT created_ms, vector, signature FROM own_acks WHERE member=?",
                            (member,)).fetchone()
    return (row[0], vec_from_blob(row[1]), row[2]) if row else None


def ack_floor(site: Site) -> dict[bytes, int]:
    """Per origin, the epoch every current member acknowledged holding, each in its own
    signed word (``planning.ack_floor``)."""
    acks = acknowledgements(site)
    others = [acks[m][1] if m in acks else {} for m in site.members_by_id()
              if m != site.site_id]
    return planning.ack_floor(site.vector(), others)
