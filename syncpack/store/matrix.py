"""The vector, the epoch matrix and per-link bookkeeping, as stored.  Owns the tables
``vector`` (per origin: highest epoch held, floor, seeded), ``matrix`` (what we sent each peer
and what it acknowledged, per origin), ``links`` (link sequence numbers, what we last told a
peer, what it waits for), ``acks`` and ``own_acks`` (members' signed acknowledgements) and
``acks_told`` (which of them we passed on to whom).

The decisions made from these figures are pure functions in :mod:`syncpack.rules.planning`;
this module only reads and writes them, on the caller's connection and inside its
transaction.  :mod:`syncpack.exchange.links` offers the same figures per site."""

from __future__ import annotations

from syncpack.format import codec
from syncpack.rules import planning


def vec_blob(v: dict[bytes, int]) -> bytes:
    return codec.packb(sorted([o, e] for o, e in v.items() if e))


def vec_from_blob(b: bytes | None) -> dict[bytes, int]:
    return {o: e for o, e in codec.unpackb(b)} if b else {}


def ranges_blob(r: dict[bytes, tuple[int, int]]) -> bytes:
    return codec.packb(sorted([o, lo, hi] for o, (lo, hi) in r.items()))


def ranges_from_blob(b: bytes | None) -> dict[bytes, tuple[int, int]]:
    return {o: (lo, hi) for o, lo, hi in codec.unpackb(b)} if b else {}


# --- the vector --------------------------------------------------------------------------------

# Our own origin's row is not rewritten by every small local transaction: its newest unsealed
# op in the changelog (which holds our own ops only) may be above it (chain.own_tip), so the
# epoch held is the larger of the two; chain.settle_own writes it back before changelog rows go.
# The changelog holds one origin's ops, keyed by epoch: its last row alone is looked at.
_HELD = ("max(epoch, coalesce((SELECT CASE WHEN c.origin=vector.origin THEN c.epoch END "
         "FROM changelog c ORDER BY c.epoch DESC LIMIT 1), 0))")


def vector(conn) -> dict[bytes, int]:
    """Origin site id -> highest epoch held."""
    return {o: e for o, e in conn.execute(f"SELECT origin, {_HELD} FROM vector")}


def floors(conn) -> dict[bytes, int]:
    """Per origin, the highest epoch no longer in the changelog (trimmed or seeded)."""
    return {o: f for o, f in conn.execute("SELECT origin, floor FROM vector")}


def epoch(conn, origin: bytes) -> int:
    """The epoch held of an origin the vector lists."""
    return conn.execute(f"SELECT {_HELD} FROM vector WHERE origin=?", (origin,)).fetchone()[0]


def add_origin(conn, origin: bytes) -> None:
    """List ``origin`` at epoch 0 (a new store's own origin)."""
    conn.execute("INSERT INTO vector(origin, epoch) VALUES (?, 0)", (origin,))


def ensure_origin(conn, origin: bytes) -> None:
    conn.execute("INSERT OR IGNORE INTO vector(origin, epoch) VALUES (?, 0)", (origin,))


def set_epoch(conn, origin: bytes, e: int) -> None:
    conn.execute("UPDATE vector SET epoch=? WHERE origin=?", (e, origin))


def raise_epoch(conn, origin: bytes, e: int) -> None:
    conn.execute("UPDATE vector SET epoch=max(epoch, ?) WHERE origin=?", (e, origin))


def set_floor(conn, origin: bytes, floor: int) -> None:
    conn.execute("UPDATE vector SET floor=? WHERE origin=?", (floor, origin))


def seed(conn, snap: dict[bytes, int], kept: bytes | None = None) -> None:
    """A snapshot's vector: held, and the floor (its ops never were in our changelog).  The
    origin ``kept`` keeps its floor: its ops the snapshot covers stay in our changelog (a
    re-seeded site's own), so only ``seeded`` says that the records hold their effect."""
    conn.executemany("INSERT INTO vector(origin, epoch, floor, seeded) VALUES (?, ?, ?, ?) "
                     "ON CONFLICT(origin) DO UPDATE SET epoch=max(epoch, excluded.epoch), "
                     "floor=excluded.floor, seeded=excluded.seeded",
                     [(o, e, e, e) for o, e in snap.items() if o != kept])
    if kept in snap:
        conn.execute("UPDATE vector SET epoch=max(epoch, ?1), seeded=?1 WHERE origin=?2",
                     (snap[kept], kept))


def covered(conn) -> dict[bytes, int]:
    """Per origin, the highest epoch whose effect the records hold without a replay of our
    changelog: trimmed, or received inside a snapshot (the larger of floor and seeded)."""
    return {o: max(f, s) for o, f, s in conn.execute("SELECT origin, floor, seeded FROM vector")}


# --- the matrix --------------------------------------------------------------------------------

def matrix(conn, peer: bytes) -> tuple[dict[bytes, int], dict[bytes, int]]:
    """(what we sent the peer, what it acknowledged), per origin."""
    sent, acked = {}, {}
    for o, s, a in conn.execute("SELECT origin, sent, acked FROM matrix WHERE peer=?", (peer,)):
        if s:
            sent[o] = s
        if a:
            acked[o] = a
    return sent, acked


def raise_matrix(conn, peer: bytes, column: str, vec: dict[bytes, int]) -> None:
    assert column in ("sent", "acked")
    conn.executemany(
        f"INSERT INTO matrix(peer, origin, {column}) VALUES (?, ?, ?) "
        f"ON CONFLICT(peer, origin) DO UPDATE SET {column}=max({column}, excluded.{column})",
        [(peer, o, e) for o, e in vec.items()])


def replace_acked(conn, peer: bytes, vec: dict[bytes, int]) -> None:
    """The peer's newest report of what it holds replaces what we had."""
    conn.execute("UPDATE matrix SET acked=0 WHERE peer=?", (peer,))
    conn.executemany(
        "INSERT INTO matrix(peer, origin, acked) VALUES (?, ?, ?) "
        "ON CONFLICT(peer, origin) DO UPDATE SET acked=excluded.acked",
        [(peer, o, e) for o, e in vec.items()])


def set_sent(conn, peer: bytes, origin: bytes, e: int) -> None:
    conn.execute("UPDATE matrix SET sent=? WHERE peer=? AND origin=?", (e, peer, origin))


def correct_sent(conn, peer: bytes, origin: bytes, e: int) -> None:
    """An operator's correction: we sent the peer exactly up to ``e`` (and it cannot have
    acknowledged more)."""
    conn.execute("INSERT INTO matrix(peer, origin, sent, acked) VALUES (?, ?, ?, 0) "
                 "ON CONFLICT(peer, origin) DO UPDATE SET sent=excluded.sent, "
                 "acked=min(acked, excluded.sent)", (peer, origin, e))


def sent_back_to_acked(conn, peer: bytes | None = None) -> None:
    """Believe of a peer (or all) only what it acknowledged."""
    if peer is None:
        conn.execute("UPDATE matrix SET sent=acked")
    else:
        conn.execute("UPDATE matrix SET sent=acked WHERE peer=?", (peer,))


# --- links -------------------------------------------------------------------------------------

def link(conn, peer: bytes) -> dict:
    """The link's counters.  ``told`` is None until we have told the peer a vector (an empty
    vector told is not the same as nothing told: a restored site's vector may be empty)."""
    row = conn.execute("SELECT out_seq, in_seq, told, peer_recv_seq, peer_waiting FROM links "
                       "WHERE peer=?", (peer,)).fetchone()
    if row is None:
        return {"out_seq": 0, "in_seq": 0, "told": None, "peer_recv_seq": 0, "peer_waiting": {}}
    return {"out_seq": row[0], "in_seq": row[1],
            "told": None if row[2] is None else vec_from_blob(row[2]),
            "peer_recv_seq": row[3], "peer_waiting": ranges_from_blob(row[4])}


def ensure_link(conn, peer: bytes) -> None:
    conn.execute("INSERT OR IGNORE INTO links(peer) VALUES (?)", (peer,))


def out_seqs(conn) -> dict[bytes, int]:
    """Per peer, our outgoing link sequence."""
    return {peer: out for peer, out in conn.execute("SELECT peer, out_seq FROM links")}


def acked_created(conn, peer: bytes) -> int:
    """Creation time of the peer's packet whose vector we took last (the link exists)."""
    return conn.execute("SELECT acked_created FROM links WHERE peer=?", (peer,)).fetchone()[0]


def set_acked_created(conn, peer: bytes, created_ms: int) -> None:
    conn.execute("UPDATE links SET acked_created=? WHERE peer=?", (created_ms, peer))


def forget_told(conn, peer: bytes | None = None) -> None:
    """Tell a peer (or all) our vector again with the next packet."""
    if peer is None:
        conn.execute("UPDATE links SET told=NULL")
    else:
        conn.execute("UPDATE links SET told=NULL WHERE peer=?", (peer,))


def forget_acks_told(conn, peer: bytes) -> None:
    conn.execute("DELETE FROM acks_told WHERE peer=?", (peer,))


def note_received(conn, peer: bytes, seq: int, recv_seq: int, waiting: dict) -> None:
    """What a verified packet's header says of the link."""
    conn.execute(
        "UPDATE links SET in_seq=max(in_seq, ?), peer_recv_seq=max(peer_recv_seq, ?), "
        "peer_waiting=? WHERE peer=?", (seq, recv_seq, ranges_blob(waiting), peer))


def set_in_seq(conn, peer: bytes, seq: int) -> None:
    conn.execute("UPDATE links SET in_seq=? WHERE peer=?", (seq, peer))


def raise_out_seq(conn, peer: bytes, seq: int) -> None:
    conn.execute("UPDATE links SET out_seq=max(out_seq, ?) WHERE peer=?", (seq, peer))


def note_sent(conn, peer: bytes, seq: int, told: dict[bytes, int]) -> None:
    """We wrote the peer packets up to link sequence ``seq`` telling it vector ``told``."""
    conn.execute("UPDATE links SET out_seq=max(out_seq, ?), told=? WHERE peer=?",
                 (seq, vec_blob(told), peer))


# --- acknowledgements --------------------------------------------------------------------------

def acknowledgements(conn) -> dict[bytes, tuple[int, dict[bytes, int], bytes]]:
    """member -> (created_ms, vector, signature): each member's newest signed word."""
    return {m: (c, vec_from_blob(v), sig) for m, c, v, sig in
            conn.execute("SELECT member, created_ms, vector, signature FROM acks")}


def store_acknowledgements(conn, me: bytes, acks) -> None:
    """Keep each member's newest acknowledgement, and the one where it held the most of its
    own origin (already verified by the verifier); ours (``me``) are not kept."""
    rows = [(m, c, vec_blob(v), sig, v.get(m, 0)) for m, c, v, sig in acks if m != me]
    conn.executemany(
        "INSERT INTO acks(member, created_ms, vector, signature, grew_ms, own_epoch) "
        "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(member) DO UPDATE SET "
        "created_ms=excluded.created_ms, vector=excluded.vector, signature=excluded.signature, "
        "grew_ms=CASE WHEN excluded.vector = acks.vector THEN acks.grew_ms "
        "ELSE excluded.created_ms END, own_epoch=excluded.own_epoch "
        "WHERE excluded.created_ms > acks.created_ms", [(*r[:4], r[1], r[4]) for r in rows])
    conn.executemany(
        "INSERT INTO own_acks VALUES (?, ?, ?, ?, ?) ON CONFLICT(member) DO UPDATE SET "
        "epoch=excluded.epoch, created_ms=excluded.created_ms, vector=excluded.vector, "
        "signature=excluded.signature WHERE excluded.epoch > own_acks.epoch",
        [(m, e, c, v, sig) for m, c, v, sig, e in rows if e])


def own_epochs(conn) -> dict[bytes, int]:
    """Per member, the most of its own origin it signed it holds."""
    return dict(conn.execute("SELECT member, epoch FROM own_acks"))


def own_acknowledgement(conn, member: bytes) -> tuple[int, dict[bytes, int], bytes] | None:
    """(created_ms, vector, signature) of the member's acknowledgement holding the most of its
    own origin, if we have one."""
    row = conn.execute("SELECT created_ms, vector, signature FROM own_acks WHERE member=?",
                       (member,)).fetchone()
    return (row[0], vec_from_blob(row[1]), row[2]) if row else None


def ack_floor(conn, me: bytes, members) -> dict[bytes, int]:
    """Per origin, the epoch every current member (``members``, site ids) acknowledged
    holding, each in its own signed word (``planning.ack_floor``)."""
    acks = acknowledgements(conn)
    others = [acks[m][1] if m in acks else {} for m in members if m != me]
    return planning.ack_floor(vector(conn), others)
