"""Fork evidence in the store: what this site knows of origins that signed two histories.

docs/design.md §3.10.  Everything here runs inside the caller's transaction on ``conn``.
"""

from __future__ import annotations

from typing import NamedTuple

from syncpack.format.blocks import HEADER_LEN
from syncpack.format.csn import pack_csn, split_csns
from syncpack.store import chain, fields

OPEN, HEALED, ENDED = "open", "healed", "ended"


class Fork(NamedTuple):
    origin: bytes
    epoch: int          # the first epoch both signed blocks hold
    a: bytes            # the two signed block headers, a <= b by bytes
    b: bytes
    found_ms: int
    state: str


_COLS = "origin, epoch, a, b, found_ms, state"


def record(conn, origin: bytes, epoch: int, a: bytes, b: bytes, now_ms: int) -> bool:
    """Keep one piece of evidence (``a <= b``); returns whether it was new here."""
    conn.execute(f"INSERT OR IGNORE INTO forks({_COLS}) VALUES (?, ?, ?, ?, ?, 'open')",
                 (origin, epoch, a, b, now_ms))
    return conn.changes() > 0


def known(conn, origin: bytes, a: bytes, b: bytes) -> bool:
    return conn.execute("SELECT 1 FROM forks WHERE origin=? AND a=? AND b=?",
                        (origin, a, b)).fetchone() is not None


def all_forks(conn) -> list[Fork]:
    return [Fork(*r) for r in conn.execute(f"SELECT {_COLS} FROM forks ORDER BY found_ms, "
                                           f"origin, epoch")]


def open_forks(conn, origin: bytes | None = None) -> list[Fork]:
    if origin is None:
        rows = conn.execute(f"SELECT {_COLS} FROM forks WHERE state='open' ORDER BY found_ms")
    else:
        rows = conn.execute(f"SELECT {_COLS} FROM forks WHERE state='open' AND origin=? "
                            f"ORDER BY found_ms", (origin,))
    return [Fork(*r) for r in rows]


def frozen(conn) -> dict[bytes, int]:
    """Origins with open evidence, each with the lowest fork epoch: its ops from there wait."""
    return {o: e for o, e in conn.execute(
        "SELECT origin, min(epoch) FROM forks WHERE state='open' GROUP BY origin")}


def set_state(conn, f: Fork, state: str) -> None:
    conn.execute("UPDATE forks SET state=? WHERE origin=? AND a=? AND b=?",
                 (state, f.origin, f.a, f.b))


# --- the signed block headers this site holds ---------------------------------------------------

def headers_overlapping(conn, origin: bytes, lo: int, hi: int) -> list[bytes]:
    """Signed headers of our blocks of ``origin`` holding any epoch in ``(lo, hi]``."""
    return [bytes(r[0]) for r in conn.execute(
        "SELECT substr(data, 1, ?) FROM blocks WHERE origin=? AND hi>? AND lo<? ORDER BY lo",
        (HEADER_LEN, origin, lo, hi))]


def trimmed_header_overlapping(conn, origin: bytes, lo: int, hi: int) -> bytes | None:
    """The signed header of the newest block of ``origin`` this site trimmed, if it holds an
    epoch in ``(lo, hi]`` (chain.trim keeps it)."""
    row = conn.execute("SELECT header FROM trimmed_heads WHERE origin=? AND hi>? AND lo<?",
                       (origin, lo, hi)).fetchone()
    return bytes(row[0]) if row else None


def header_ending_at(conn, origin: bytes, hi: int) -> bytes | None:
    row = conn.execute("SELECT substr(data, 1, ?) FROM blocks WHERE origin=? AND hi=?",
                       (HEADER_LEN, origin, hi)).fetchone()
    return bytes(row[0]) if row else None


def heads_to_tell(conn, peer: bytes, limit: int) -> list[tuple[bytes, int, bytes]]:
    """(origin, hi, signed header) of our top block of each origin that this peer has not
    been shown yet (the peer's own origin left out: ``tip`` covers it), at most ``limit``."""
    rows = conn.execute(
        "SELECT b.origin, b.hi, substr(b.data, 1, ?) FROM blocks b "
        "JOIN (SELECT origin, max(hi) AS top FROM blocks GROUP BY origin) t "
        "ON t.origin=b.origin AND t.top=b.hi "
        "LEFT JOIN heads_told h ON h.peer=? AND h.origin=b.origin "
        "WHERE b.origin<>? AND (h.hi IS NULL OR h.hi<>b.hi) ORDER BY b.origin LIMIT ?",
        (HEADER_LEN, peer, peer, limit)).fetchall()
    return [(o, hi, bytes(hd)) for o, hi, hd in rows]


def note_heads_told(conn, peer: bytes, heads: list[tuple[bytes, int]]) -> None:
    conn.executemany("INSERT INTO heads_told VALUES (?, ?, ?) ON CONFLICT(peer, origin) "
                     "DO UPDATE SET hi=excluded.hi", [(peer, o, hi) for o, hi in heads])


def forget_heads_told(conn, peer: bytes) -> None:
    """The peer lost what we showed it (restored from a backup): show it again."""
    conn.execute("DELETE FROM heads_told WHERE peer=?", (peer,))


# --- ending a fork: the history not kept is reverted ------------------------------------------

def _replaces(conn, collection: str, key: str, csn: bytes) -> bool:
    """Whether a surviving version of the key comes from an op we hold that lists ``csn``."""
    for (v,) in conn.execute("SELECT csn FROM versions WHERE collection=? AND key=?",
                             (collection, key)).fetchall():
        op = _op_by_csn(conn, v)
        if op is not None and csn in split_csns(op.replaced):
            return True
    return False


def _op_by_csn(conn, csn: bytes):
    hlc, origin, seq = int.from_bytes(csn[:8], "big"), csn[8:16], int.from_bytes(csn[16:], "big")
    e = chain.epoch_of(conn, hlc, origin, seq)
    if e is None:
        return None
    return chain.op_at(conn, origin, e)


def revert_from(conn, origin: bytes, epoch: int) -> int:
    """Undo ``origin``'s ops from ``epoch`` on (from the start of the block holding it: a
    signed block is kept whole or not at all): their versions go, the versions they replaced
    come back where we still hold the ops that wrote them, and the origin's epoch winds back.
    Returns the epoch we now hold of ``origin``."""
    row = conn.execute("SELECT min(lo) FROM blocks WHERE origin=? AND hi>=?",
                       (origin, epoch)).fetchone()
    if row[0] is None:
        return epoch - 1
    cut = row[0]
    ops = list(chain.iter_ops(conn, origin, cut, (1 << 63) - 1))
    conn.execute("DELETE FROM blocks WHERE origin=? AND hi>?", (origin, cut))
    undo_ops(conn, ops)
    conn.execute("UPDATE vector SET epoch=min(epoch, ?) WHERE origin=?", (cut, origin))
    return cut


def revert_trimmed(conn, origin: bytes, lo: int, hlc_first: int) -> int:
    """Undo ``origin``'s trimmed ops from its trimmed block that starts after epoch ``lo``
    (first clock ``hlc_first``) on: their ops are gone, so the versions they wrote go by
    their clocks (what they replaced was trimmed with them; a peer that still holds those
    ops brings them back where the history kept replays them), and the origin's epoch and
    floor wind back to ``lo``, so the history kept comes in ordinary rounds (or, where the
    peers trimmed it too, they say a resync is needed).  Returns ``lo``."""
    conn.execute("DELETE FROM versions WHERE substr(csn, 9, 8)=? AND csn>=?",
                 (origin, pack_csn(hlc_first, origin, 0)))
    conn.execute("UPDATE vector SET epoch=min(epoch, ?1), floor=min(floor, ?1) WHERE origin=?2",
                 (lo, origin))
    conn.execute("DELETE FROM trimmed_heads WHERE origin=?", (origin,))
    return lo


def undo_ops(conn, ops: list) -> None:
    """Undo the effect of ``ops`` (newest last) on the records: their versions go, and the
    versions they replaced come back where we still hold the ops that wrote them."""
    for op in reversed(ops):
        conn.execute("DELETE FROM versions WHERE collection=? AND key=? AND csn=?",
                     (op.collection, op.key, pack_csn(op.hlc, op.origin, op.seq)))
        for r in split_csns(op.replaced):
            back = _op_by_csn(conn, r)
            if back is not None and not _replaces(conn, op.collection, op.key, r):
                conn.execute("INSERT OR IGNORE INTO versions VALUES (?, ?, ?, ?)",
                             (op.collection, op.key, r,
                              fields.record_of(conn, op.collection, op.key, r, back.value)))
