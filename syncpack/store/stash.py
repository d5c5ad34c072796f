"""Our own ops set aside after a fork of our history (see
:func:`syncpack.admin.recovery.stash_own`).  Owns the table ``stash`` (rows shaped like the
changelog's: origin, epoch, hlc, seq, collection, key, value, replaced).

Everything here runs on the caller's connection and inside its transaction."""

from __future__ import annotations

from syncpack.format.codec import Op


def any_held(conn) -> bool:
    return conn.execute("SELECT 1 FROM stash LIMIT 1").fetchone() is not None


def count(conn) -> int:
    return conn.execute("SELECT count(*) FROM stash").fetchone()[0]


def put(conn, ops: list) -> None:
    conn.executemany("INSERT OR REPLACE INTO stash VALUES (?, ?, ?, ?, ?, ?, ?, ?)", ops)


def op_of(conn, origin: bytes, hlc: int, seq: int) -> Op | None:
    """The op (origin, hlc, seq) as it is set aside, if it is."""
    row = conn.execute("SELECT origin, epoch, hlc, seq, collection, key, value, replaced FROM "
                       "stash WHERE origin=? AND hlc=? AND seq=?", (origin, hlc, seq)).fetchone()
    return Op(*row) if row else None


def op_id_at(conn, origin: bytes, epoch: int) -> tuple[int, int] | None:
    """(hlc, seq) of the op set aside under ``epoch``, if any."""
    row = conn.execute("SELECT hlc, seq FROM stash WHERE origin=? AND epoch=?",
                       (origin, epoch)).fetchone()
    return (row[0], row[1]) if row else None


def drop(conn, origin: bytes, epoch: int) -> None:
    conn.execute("DELETE FROM stash WHERE origin=? AND epoch=?", (origin, epoch))


def drop_through(conn, origin: bytes, epoch: int) -> None:
    conn.execute("DELETE FROM stash WHERE origin=? AND epoch<=?", (origin, epoch))


def return_through(conn, origin: bytes, epoch: int) -> None:
    """Move the set-aside ops of ``origin`` up to ``epoch`` back into the changelog."""
    conn.execute("INSERT INTO changelog SELECT origin, epoch, hlc, seq, collection, key, value, "
                 "replaced FROM stash WHERE origin=? AND epoch<=?", (origin, epoch))
    drop_through(conn, origin, epoch)


def rows(conn) -> list[tuple]:
    """Every set-aside op as a changelog-shaped row, in epoch order."""
    return conn.execute("SELECT origin, epoch, hlc, seq, collection, key, value, replaced "
                        "FROM stash ORDER BY epoch").fetchall()


def ops(conn) -> list[Op]:
    return [Op(*row) for row in conn.execute(
        "SELECT origin, epoch, hlc, seq, collection, key, value, replaced FROM stash")]


def clear(conn) -> None:
    conn.execute("DELETE FROM stash")
