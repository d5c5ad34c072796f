"""Packet history as stored.  Owns the tables ``packets_in`` (packets applied, by sender and
id), ``packets_out`` (packets written, with the ranges they carried) and ``parked`` (verified
packets kept in the site directory until the ops they wait for arrive).

Everything here runs on the caller's connection, inside the caller's transaction for writes."""

from __future__ import annotations

from typing import Iterator


def _text(path: str | None) -> str | None:
    """A path as stored text: a file name that is not UTF-8 (its bytes kept by Python as lone
    surrogates) is stored escaped; SQLite refused it, failing the import of a good packet."""
    return None if path is None else path.encode("utf-8", "backslashreplace").decode("utf-8")


# --- packets taken in --------------------------------------------------------------------------

def record_in(conn, sender: bytes, packet_id: bytes, seq: int, part: int, kind: str, ops: int,
              path: str, at_ms: int, *, again_ok: bool = False) -> None:
    """Note an applied packet (``again_ok``: a second note of the same one is ignored)."""
    verb = "INSERT OR IGNORE" if again_ok else "INSERT"
    conn.execute(f"{verb} INTO packets_in(sender, packet_id, seq, part, kind, ops, path, "
                 "at_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                 (sender, packet_id, seq, part, kind, ops, _text(path), at_ms))


def is_known(conn, sender: bytes, packet_id: bytes) -> bool:
    return conn.execute("SELECT 1 FROM packets_in WHERE sender=? AND packet_id=?",
                        (sender, packet_id)).fetchone() is not None


def last_snapshot_sender(conn) -> bytes | None:
    """The sender of the snapshot taken in last, if any."""
    row = conn.execute("SELECT sender FROM packets_in WHERE kind='snapshot' "
                       "ORDER BY at_ms DESC LIMIT 1").fetchone()
    return row[0] if row else None


# A time stamped while this site's clock ran fast (fixed since) is ahead of "now": it would be
# the newest for as long as the clock had been wrong, and a silent peer would look heard from.
# Such times count only while no sound one exists.
_NEWEST_SOUND = "coalesce(max(CASE WHEN at_ms <= ?1 THEN at_ms END), max(at_ms))"


def last_received(conn, now_ms: int) -> dict[bytes, int]:
    """Per sender, when we last took in one of its packets (applied or parked)."""
    return dict(conn.execute(
        f"SELECT sender, {_NEWEST_SOUND} FROM (SELECT sender, at_ms FROM packets_in "
        "UNION ALL SELECT sender, at_ms FROM parked) GROUP BY sender", (now_ms,)))


# --- packets written ---------------------------------------------------------------------------

def record_out(conn, packet_id: bytes, recipient: bytes, seq: int, part: int, kind: str,
               ranges: bytes, ops: int, size: int, path: str, at_ms: int) -> None:
    conn.execute("INSERT INTO packets_out VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                 (packet_id, recipient, seq, part, kind, ranges, ops, size, _text(path), at_ms))


def ranges_sent_through(conn, recipient: bytes, seq: int) -> Iterator[bytes]:
    """The ranges blobs of our packets to ``recipient`` up to link sequence ``seq``."""
    for (r,) in conn.execute("SELECT ranges FROM packets_out WHERE recipient=? AND seq<=?",
                             (recipient, seq)):
        yield r


def newest_snapshot_to(conn, recipient: bytes) -> int:
    """The link sequence of our newest snapshot for ``recipient`` (0: none)."""
    row = conn.execute("SELECT max(seq) FROM packets_out WHERE recipient=? AND kind='snapshot'",
                       (recipient,)).fetchone()
    return row[0] or 0


def last_sent(conn, now_ms: int) -> dict[bytes, int]:
    """Per recipient, when we last wrote a packet for it."""
    return dict(conn.execute(
        f"SELECT recipient, {_NEWEST_SOUND} FROM packets_out GROUP BY recipient", (now_ms,)))


# --- parked packets ----------------------------------------------------------------------------

def park(conn, sender: bytes, packet_id: bytes, seq: int, part: int, file: str,
         origin_path: str, waiting: bytes, at_ms: int) -> None:
    conn.execute("INSERT OR REPLACE INTO parked(sender, packet_id, seq, part, file, "
                 "origin_path, waiting, at_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                 (sender, packet_id, seq, part, file, _text(origin_path), waiting, at_ms))


def unpark(conn, sender: bytes, packet_id: bytes) -> None:
    conn.execute("DELETE FROM parked WHERE sender=? AND packet_id=?", (sender, packet_id))


def parked(conn) -> list[tuple[bytes, bytes, int, int, str, bytes]]:
    """(packet_id, sender, seq, part, origin_path, waiting blob) of parked packets, in
    (sender, seq, part) order."""
    return conn.execute("SELECT packet_id, sender, seq, part, origin_path, waiting FROM parked "
                        "ORDER BY sender, seq, part").fetchall()


def parked_waiting(conn, sender: bytes | None = None) -> Iterator[bytes]:
    """The waiting-ranges blobs of parked packets (of one sender, or all)."""
    q = "SELECT waiting FROM parked" + (" WHERE sender=?" if sender else "")
    for (w,) in conn.execute(q, (sender,) if sender else ()):
        yield w
