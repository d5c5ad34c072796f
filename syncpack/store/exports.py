"""The SQL of the export and import drivers (:mod:`syncpack.exchange.sync` and the Spark
engine): the read snapshot an export plans in, what each peer has been told, the packets
recorded once written, and the parked packets an import retries.  Every function takes an
open connection; the callers hold the site lock and decide the transactions."""

from __future__ import annotations

from typing import Iterable, Iterator


# --- the read snapshot an export plans (and, locally, writes) in --------------------------------

def begin_snapshot(conn) -> None:
    """One read snapshot: the plan and the blocks it names come from the same state."""
    conn.execute("BEGIN")


def end_snapshot(conn, keep: bool = False) -> None:
    """Close the snapshot begun by :func:`begin_snapshot` (it wrote nothing either way)."""
    conn.execute("COMMIT" if keep else "ROLLBACK")


# --- what a plan reads -------------------------------------------------------------------------

def seeded_epochs(conn) -> dict[bytes, int]:
    """Per origin, the epoch a snapshot seeded our history at."""
    return {o: e for o, e in conn.execute("SELECT origin, seeded FROM vector")}


def acks_told(conn, peer: bytes) -> dict[bytes, int]:
    """Per member, the creation time of its newest acknowledgement this peer was given."""
    return dict(conn.execute("SELECT member, created_ms FROM acks_told WHERE peer=?", (peer,)))


def ack_times(conn) -> Iterator[tuple[bytes, int]]:
    """(member, created_ms) of every stored signed acknowledgement."""
    return iter(conn.execute("SELECT member, created_ms FROM acks").fetchall())


def ack_growths(conn) -> Iterator[tuple[bytes, int]]:
    """(member, created_ms of the first stored acknowledgement saying what its newest says)."""
    return iter(conn.execute("SELECT member, grew_ms FROM acks").fetchall())


def own_epochs_acked_since(conn, since_ms: int) -> list[tuple[bytes, int]]:
    """(member, epochs of its own history it holds) of the acknowledgements created after
    ``since_ms``."""
    return conn.execute("SELECT member, own_epoch FROM acks WHERE created_ms > ?",
                        (since_ms,)).fetchall()


def ack_of(conn, member: bytes) -> tuple[bytes, bytes]:
    """A member's stored acknowledgement: (vector blob, signature)."""
    return conn.execute("SELECT vector, signature FROM acks WHERE member=?", (member,)).fetchone()


def block_sizes(conn, blocks: Iterable) -> list[int]:
    """The stored lengths of ``blocks`` (anything with origin, lo and hi), in their order."""
    q = "SELECT length(data) FROM blocks WHERE origin=? AND hi=? AND lo=?"
    return [conn.execute(q, (b.origin, b.hi, b.lo)).fetchone()[0] for b in blocks]


# --- what an export records once its files are durable -------------------------------------------

def record_link_sent(conn, peer: bytes, seq: int, told_blob: bytes) -> None:
    conn.execute("UPDATE links SET out_seq=max(out_seq, ?), told=? WHERE peer=?",
                 (seq, told_blob, peer))


def record_acks_told(conn, peer: bytes, told: Iterable[tuple[bytes, int]]) -> None:
    conn.executemany(
        "INSERT INTO acks_told VALUES (?, ?, ?) ON CONFLICT(peer, member) DO UPDATE "
        "SET created_ms=max(created_ms, excluded.created_ms)",
        [(peer, m, c) for m, c in told])


def packets_out_count(conn) -> int:
    return conn.execute("SELECT count(*) FROM packets_out").fetchone()[0]


def record_packet_out(conn, packet_id: bytes, recipient: bytes, seq: int, part: int, kind: str,
                      ranges_blob: bytes, count: int, size: int, path: str, now: int) -> None:
    conn.execute("INSERT INTO packets_out VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                 (packet_id, recipient, seq, part, kind, ranges_blob, count, size, path, now))


# --- parked packets an import tries again ----------------------------------------------------------

def parked_rows(conn) -> list[tuple[bytes, bytes, str, str | None]]:
    """(sender, packet id, file name, path shown to the user), in link order."""
    return conn.execute("SELECT sender, packet_id, file, origin_path FROM parked "
                        "ORDER BY sender, seq, part").fetchall()


def forget_parked(conn, sender: bytes, packet_id: bytes) -> None:
    conn.execute("DELETE FROM parked WHERE sender=? AND packet_id=?", (sender, packet_id))
