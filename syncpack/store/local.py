"""The local write path's batched statements: a bulk write (``load``, and later captured rows)
reads and writes the ``versions`` B-tree through ``executemany`` so SQLite's C loop, not a
Python call per record, does the work.

Everything here runs inside the caller's write transaction on ``conn``; nothing commits.
"""

from __future__ import annotations

from typing import Iterable


def versions_of(conn, keys: Iterable[tuple[str, str]]) -> dict[tuple[str, str], list[bytes]]:
    """The surviving versions' CSNs of each of ``keys`` that has any, in CSN order (keys
    without a version are left out)."""
    out: dict[tuple[str, str], list[bytes]] = {}
    # No ORDER BY: with it SQLite runs a sorter for every binding (10x slower at 200k keys);
    # the primary key's order is CSN order within a key, and the few keys with several
    # versions are sorted here to be sure.
    for coll, key, csn in conn.executemany(
            "SELECT collection, key, csn FROM versions WHERE collection=? AND key=?", keys):
        out.setdefault((coll, key), []).append(csn)
    for csns in out.values():
        if len(csns) > 1:
            csns.sort()
    return out


def replace_versions(conn, gone: Iterable[tuple[str, str]],
                     rows: Iterable[tuple[str, str, bytes, bytes | None]]) -> None:
    """Drop every version of the keys in ``gone``, then insert ``rows`` (collection, key,
    csn, value); rows in key order make the inserts append to the B-tree's pages."""
    conn.executemany("DELETE FROM versions WHERE collection=? AND key=?", gone)
    conn.executemany("INSERT INTO versions VALUES (?, ?, ?, ?)", rows)


def own_tip(conn, origin: bytes) -> tuple[int, int] | None:
    """``(epoch, hlc)`` of our newest unsealed op, or None.  A small transaction records only
    its changelog rows; the ``vector`` and ``meta`` rows of our own epoch and clock catch up
    when the changelog is emptied (:func:`settle_own`), so readers take the larger of both."""
    return conn.execute("SELECT epoch, hlc FROM changelog WHERE origin=? ORDER BY epoch DESC "
                        "LIMIT 1", (origin,)).fetchone()


def settle_own(conn, origin: bytes) -> None:
    """Carry our newest unsealed op's epoch and clock into ``vector`` and ``meta``, before
    changelog rows are deleted (sealed, trimmed or set aside)."""
    tip = own_tip(conn, origin)
    if tip is None:
        return
    conn.execute("UPDATE vector SET epoch=max(epoch, ?) WHERE origin=?", (tip[0], origin))
    conn.execute("UPDATE meta SET value=max(CAST(value AS INTEGER), ?) WHERE key='hlc'",
                 (tip[1],))
