"""Record state as stored: every surviving version of every key.  Owns the tables
``versions`` (collection, key, CSN, value; a NULL value is a tombstone), ``superseded`` (CSNs an
op listed as replaced before they arrived) and ``tomb_pending`` (tombstones noted for removal
once every member acknowledged them).

Which version is visible is decided by :mod:`syncpack.rules.conflict`; this module only reads
and writes.  Everything runs on the caller's connection and inside its transaction."""

from __future__ import annotations

from itertools import repeat
from operator import itemgetter
from typing import Iterable, Iterator

from syncpack.format.codec import Op
from syncpack.format.csn import CSN_LEN, csn_hlc, csn_origin, csn_seq, split_csns
from syncpack.rules.conflict import Version
from syncpack.store import attached, chain, db

_ROWS = "SELECT collection, key, csn, value FROM versions"


# --- reading -----------------------------------------------------------------------------------

def of_key(conn, collection: str, key: str) -> list[Version]:
    """The surviving versions of one key."""
    return [Version(c, v is None, v) for c, v in conn.execute(
        "SELECT csn, value FROM versions WHERE collection=? AND key=?", (collection, key))]


def csns_of_key(conn, collection: str, key: str) -> bytes:
    """The CSNs of one key's surviving versions, concatenated in CSN order."""
    # Sorted here, not by ORDER BY: the sorter SQLite sets up for it cost a one-put
    # transaction 10 us of its ~50 us in SQL, for the rare key with several versions.
    csns = [r[0] for r in conn.execute(
        "SELECT csn FROM versions WHERE collection=? AND key=?", (collection, key))]
    if len(csns) > 1:
        csns.sort()
    return b"".join(csns)


def csns_of_keys(conn, keys: Iterable[tuple[str, str]]) -> dict[tuple[str, str], list[bytes]]:
    """:func:`csns_of_key` of many keys in one ``executemany`` (a bulk write): the surviving
    versions' CSNs of each key that has any, in CSN order; keys without one are left out."""
    out: dict[tuple[str, str], list[bytes]] = {}
    keys = _maybe_held(conn, keys)
    # No ORDER BY: with it SQLite runs a sorter for every binding (10x slower at 200k keys);
    # the few keys with several versions are sorted here.
    for coll, key, csn in conn.executemany(
            "SELECT collection, key, csn FROM versions WHERE collection=? AND key=?", keys):
        out.setdefault((coll, key), []).append(csn)
    for csns in out.values():
        if len(csns) > 1:
            csns.sort()
    return out


def _maybe_held(conn, keys: Iterable[tuple[str, str]]) -> Iterable[tuple[str, str]]:
    """``keys`` without those of a collection whose versions hold no key between the batch's
    lowest and highest of it: a load into a new collection (or past its last key, as a file
    in key order is loaded batch after batch) then looks up nothing, where one look-up per
    key cost as much as the insert.  SQLite's text order is Python's (UTF-8 keeps code point
    order)."""
    keys = keys if isinstance(keys, (list, tuple, dict)) else list(keys)
    if not keys:
        return keys
    colls = set(map(itemgetter(0), keys))
    by_coll = ({next(iter(colls)): list(map(itemgetter(1), keys))} if len(colls) == 1 else
               {c: [k for cc, k in keys if cc == c] for c in colls})
    held = {c for c, ks in by_coll.items() if conn.execute(
        "SELECT 1 FROM versions WHERE collection=? AND key>=? AND key<=? LIMIT 1",
        (c, min(ks), max(ks))).fetchone()}
    if held == colls:
        return keys
    return [ck for ck in keys if ck[0] in held]


def rows(conn, collection: str | None = None) -> Iterator[tuple[str, str, bytes, bytes | None]]:
    """(collection, key, csn, value) of every version, sorted by collection and key; one
    collection or all."""
    if collection is None:
        return conn.execute(_ROWS + " ORDER BY collection, key")
    return conn.execute(_ROWS + " WHERE collection=? ORDER BY key", (collection,))


def rows_by_csn(conn) -> Iterator[tuple[str, str, bytes, bytes | None]]:
    """(collection, key, csn, value) of every version in (collection, key, CSN) order."""
    return conn.execute(_ROWS + " ORDER BY collection, key, csn")


def scan(conn) -> Iterator[tuple[str, str, bytes, bytes | None]]:
    """(collection, key, csn, value) of every version, in no particular order."""
    return conn.execute(_ROWS)


def newest_csn(conn) -> bytes | None:
    """The greatest CSN of any version (CSNs sort by clock first)."""
    return conn.execute("SELECT max(csn) FROM versions").fetchone()[0]


def count(conn) -> int:
    return conn.execute("SELECT count(*) FROM versions").fetchone()[0]


def conflict_rows(conn, collection: str | None = None) -> Iterator[tuple]:
    """(collection, key, csn, value) of the keys with more than one surviving version, in
    (collection, key, CSN) order."""
    if collection is not None:
        return conn.execute(
            "SELECT v.collection, v.key, v.csn, v.value FROM versions v JOIN "
            "(SELECT collection, key FROM versions WHERE collection=? GROUP BY collection, key "
            "HAVING count(*) > 1) c USING (collection, key) ORDER BY v.collection, v.key, v.csn",
            (collection,))
    return conn.execute(
        "SELECT v.collection, v.key, v.csn, v.value FROM versions v JOIN "
        "(SELECT collection, key FROM versions GROUP BY collection, key "
        "HAVING count(*) > 1) c USING (collection, key) ORDER BY v.collection, v.key, v.csn")


def count_conflicts(conn) -> int:
    """Keys in conflict outside syncpack's own ``$`` collections."""
    return conn.execute(
        "SELECT count(*) FROM (SELECT 1 FROM versions WHERE collection NOT LIKE '$%' "
        "GROUP BY collection, key HAVING count(*) > 1)").fetchone()[0]


def collections(conn) -> set[str]:
    return {c for (c,) in conn.execute("SELECT DISTINCT collection FROM versions")}


def collection_exists(conn, name: str, policies: str) -> bool:
    """Whether ``name`` holds a version, or has a record in the policies collection."""
    return conn.execute("SELECT 1 FROM versions WHERE collection IN (?, ?) AND "
                        "(collection=? OR key=?) LIMIT 1",
                        (name, policies, name, name)).fetchone() is not None


def any_superseded(conn) -> bool:
    return conn.execute("SELECT 1 FROM superseded LIMIT 1").fetchone() is not None


# --- writing -----------------------------------------------------------------------------------

_INSERT = "INSERT INTO versions VALUES (?, ?, ?, ?)"
_INSERT_BULK = "INSERT INTO versions VALUES " + ", ".join(
    ["(?, ?, ?, ?)"] * db.rows_per_statement(4))


def _insert(conn, rows: list[tuple[str, str, bytes, bytes | None]]) -> None:
    db.execute_rows(conn, _INSERT, _INSERT_BULK, rows, 4)


def insert_many(conn, rows: Iterable[tuple[str, str, bytes, bytes | None]]) -> None:
    rows = rows if isinstance(rows, list) else list(rows)
    watched = attached.watched(conn)
    if not watched:
        _insert(conn, rows)
        return
    # Rows of attached tables: their trigger's work (noting each new version as pending for
    # the application) done in one statement instead of a trigger program per row, which
    # cost an import three times its own insert.
    with attached.triggers_aside(conn):
        _insert(conn, rows)
    by: dict[str, tuple[list, list, list]] = {}
    for collection, key, csn, value in rows:
        if collection in watched:
            ks, cs, vs = by.setdefault(collection, ([], [], []))
            ks.append(key)
            cs.append(csn)
            vs.append(value)
    for collection, (ks, cs, vs) in by.items():
        attached.note_new_versions(conn, collection, ks, cs, vs)


def remove_listed(conn, rows: list[tuple[str, str, bytes]]) -> None:
    """Remove the named versions ``(collection, key, csn)`` (those a bulk local write
    supersedes; the key's other versions stay, concurrent with it)."""
    if rows:
        conn.executemany("DELETE FROM versions WHERE collection=? AND key=? AND csn=?", rows)


# One blob per row, key (UTF-8, in which no byte is 0xff) | 0xff | CSN | value, read back into
# the row's columns by SQLite: a batch of rows is one statement over a carray, where a binding
# per row cost as much as the insert itself.
_SEP = b"\xff"
PACKED_BYTES = 4 * 1024 * 1024      # of values packed for one statement
_INSERT_PACKED = (
    "INSERT INTO versions(collection, key, csn, value) SELECT ?1, "
    f"CAST(substr(value, 1, p - 1) AS TEXT), substr(value, p + 1, {CSN_LEN}), "
    f"substr(value, p + {CSN_LEN + 1}) "
    "FROM (SELECT value, instr(value, x'ff') AS p FROM carray(?2))")


def insert_columns(conn, collection: str, keys: list[str], csns: Iterable[bytes],
                   values: list[bytes | None]) -> None:
    """:func:`insert_many` of rows of one collection held as columns (a block's, a bulk
    writer's)."""
    if not db.HAS_CARRAY or None in values or not keys:
        # a tombstone has no bytes to pack; such a batch (rare in bulk) goes row by row
        insert_many(conn, zip(repeat(collection), keys, csns, values))
        return
    csns = csns if isinstance(csns, list) else list(csns)
    n = len(keys)
    size = sum(map(len, values))
    if size > PACKED_BYTES and n > 1:
        # the packed copy of large values would add to an import's peak memory: in parts
        step = max(1, n * PACKED_BYTES // size)
        for at in range(0, n, step):
            insert_columns(conn, collection, keys[at:at + step], csns[at:at + step],
                           values[at:at + step])
        return
    packed = db.carray(tuple(map(b"".join, zip(map(str.encode, keys), repeat(_SEP), csns,
                                                values))))
    watched = attached.watched(conn)
    if not watched:
        conn.execute(_INSERT_PACKED, (collection, packed))
        return
    mine = collection in watched
    # an import's direct apply decodes the rows on another thread while SQLite inserts them
    prepared = attached.prepare_direct(conn, values) if mine else None
    with attached.triggers_aside(conn):     # as insert_many does, for the same reason
        conn.execute(_INSERT_PACKED, (collection, packed))
    if mine:
        attached.note_new_versions(conn, collection, keys, csns, values, prepared)


# As _INSERT_PACKED, for a local bulk writer's rows, whose CSNs are one prefix and consecutive
# seqs: SQLite appends each row's seq (carray numbers its rows from 1), so no CSN is made in
# Python (1M rows: 0.17 s of a capture's 3.5).
_INSERT_NUMBERED = (
    "INSERT INTO versions(collection, key, csn, value) SELECT ?1, "
    "CAST(substr(value, 1, p - 1) AS TEXT), "
    "CAST(?3 || unhex(printf('%08x', ?4 + rowid - 1)) AS BLOB), "    # || makes TEXT
    "substr(value, p + 1) "
    "FROM (SELECT rowid, value, instr(value, x'ff') AS p FROM carray(?2))")


def insert_numbered(conn, collection: str, keys: list[str], prefix: bytes, seq0: int,
                    values: list[bytes | None], size: int) -> None:
    """:func:`insert_columns` of rows whose CSNs are ``prefix`` followed by the 4-byte seqs
    ``seq0``, ``seq0 + 1``, ...: a local bulk writer's (``size``: at least the bytes of
    ``values``)."""
    n = len(keys)
    if not db.HAS_CARRAY or None in values or not keys or attached.watched(conn):
        insert_columns(conn, collection, keys, [
            prefix + s.to_bytes(4, "big") for s in range(seq0, seq0 + n)], values)
        return
    if size > PACKED_BYTES and n > 1:
        step = max(1, n * PACKED_BYTES // size)     # as insert_columns, for the same reason
        for at in range(0, n, step):
            insert_numbered(conn, collection, keys[at:at + step], prefix, seq0 + at,
                            values[at:at + step], PACKED_BYTES)
        return
    packed = db.carray(tuple(map(b"".join, zip(map(str.encode, keys), repeat(_SEP), values))))
    conn.execute(_INSERT_NUMBERED, (collection, packed, prefix, seq0))


def replace_key(conn, collection: str, key: str, csn: bytes, value: bytes | None,
                had_versions: bool) -> None:
    """A local write: the new version supersedes every surviving one of its key."""
    if had_versions:
        conn.execute("DELETE FROM versions WHERE collection=? AND key=?", (collection, key))
    conn.execute("INSERT INTO versions VALUES (?, ?, ?, ?)", (collection, key, csn, value))


def replace_many(conn, gone: Iterable[tuple[str, str]],
                 rows: Iterable[tuple[str, str, bytes, bytes | None]]) -> None:
    """:func:`replace_key` in bulk: drop every version of the keys in ``gone``, then insert
    ``rows`` (in key order they append to the B-tree's pages)."""
    conn.executemany("DELETE FROM versions WHERE collection=? AND key=?", gone)
    conn.executemany("INSERT INTO versions VALUES (?, ?, ?, ?)", rows)


def _op_applied(conn, csn: bytes) -> bool:
    hlc, origin, seq = csn_hlc(csn), csn_origin(csn), csn_seq(csn)
    # An op trimmed from the changelog was applied before; it can never arrive again.
    e = chain.epoch_of(conn, hlc, origin, seq)
    if e is None:
        return False
    # held in a part of a transaction whose last part has not come: applied with it, later
    part = chain.incomplete(conn).get(origin)
    return part is None or not part[0] < e <= part[1]


def apply_version(conn, op: Op, csn: bytes) -> bool:
    """Make ``op`` a surviving version of its key unless a known write superseded it, and
    drop the versions it superseded.  Returns whether one of those was remembered as
    superseded (not here yet: it is dropped when it arrives)."""
    noted = False
    if op.replaced:
        for r in split_csns(op.replaced):
            conn.execute("DELETE FROM versions WHERE collection=? AND key=? AND csn=?",
                         (op.collection, op.key, r))
            n = conn.changes()
            if n == 0 and not _op_applied(conn, r):
                # Keyed by the key too: an op can only supersede versions of its own key,
                # whatever CSNs it lists (a member listing another key's must not hide it).
                conn.execute("INSERT OR IGNORE INTO superseded VALUES (?, ?, ?)",
                             (op.collection, op.key, r))
                noted = True
    conn.execute("DELETE FROM superseded WHERE collection=? AND key=? AND csn=?",
                 (op.collection, op.key, csn))
    if conn.changes():
        return noted
    conn.execute("INSERT INTO versions VALUES (?, ?, ?, ?)",
                 (op.collection, op.key, csn, op.value))
    return noted


# The packed (key | 0xff | CSN) pairs whose version is not held.
_NOT_HELD = ("SELECT c.value FROM carray(?2) c WHERE NOT EXISTS (SELECT 1 FROM versions v "
             "WHERE v.collection = ?1 "
             "AND v.key = CAST(substr(c.value, 1, instr(c.value, x'ff') - 1) AS TEXT) "
             "AND v.csn = substr(c.value, instr(c.value, x'ff') + 1))")


def remove_replaced(conn, collection: str, pairs: list[tuple[str, bytes]]) -> bool:
    """:func:`apply_version`'s removal of what ops supersede, for the ops of a bulk apply
    (distinct keys, none of them superseded already): each version ``(key, csn)`` of
    ``collection`` goes; one not held whose op was never seen is remembered as superseded (it
    may still arrive).  Returns whether one was."""
    if not pairs:
        return False
    delete = "DELETE FROM versions WHERE collection=? AND key=? AND csn=?"
    rows = [(collection, k, c) for k, c in pairs]
    if not attached.watched(conn):
        # Nearly always every one is held: deleted in a savepoint and counted (no trigger on
        # versions counts too), which saves looking each up first.
        conn.execute("SAVEPOINT syncpack_replaced")
        before = conn.total_changes()
        conn.executemany(delete, rows)
        if conn.total_changes() - before == len(rows):
            conn.execute("RELEASE syncpack_replaced")
            return False
        conn.execute("ROLLBACK TO syncpack_replaced")
        conn.execute("RELEASE syncpack_replaced")
    if db.HAS_CARRAY:
        packed = db.carray(tuple(k.encode() + _SEP + c for k, c in pairs))
        absent = [bytes(r[0]).split(_SEP, 1) for r in conn.execute(_NOT_HELD, (collection,
                                                                               packed))]
        absent = [(k.decode(), c) for k, c in absent]     # a key is UTF-8: no 0xff in it
    else:
        absent = [(k, c) for k, c in pairs if conn.execute(
            "SELECT 1 FROM versions WHERE collection=? AND key=? AND csn=?",
            (collection, k, c)).fetchone() is None]
    conn.executemany(delete, rows)
    noted = False
    for k, c in absent:
        if not _op_applied(conn, c):
            conn.execute("INSERT OR IGNORE INTO superseded VALUES (?, ?, ?)", (collection, k, c))
            noted = True
    return noted


def rename_csn(conn, collection: str, key: str, old: bytes, new: bytes) -> None:
    """A re-issued op's new CSN, wherever its old one survives."""
    conn.execute("UPDATE versions SET csn=? WHERE collection=? AND key=? AND csn=?",
                 (new, collection, key, old))
    conn.execute("UPDATE superseded SET csn=? WHERE collection=? AND key=? AND csn=?",
                 (new, collection, key, old))


def clear(conn) -> None:
    """Drop all record state (before a snapshot replaces it)."""
    for table in ("versions", "superseded", "tomb_pending"):
        conn.execute(f"DELETE FROM {table}")


# --- tombstones waiting for removal ------------------------------------------------------------

def pending_tombstones(conn) -> list[tuple[str, str, bytes, bytes]]:
    """(collection, key, csn, vector blob) of the tombstones noted for removal."""
    return conn.execute("SELECT collection, key, csn, after FROM tomb_pending").fetchall()


def is_sole_version(conn, collection: str, key: str, csn: bytes) -> bool:
    """Whether ``csn`` is still the only surviving version of its key."""
    n, this = conn.execute("SELECT count(*), max(csn=?) FROM versions WHERE collection=? "
                           "AND key=?", (csn, collection, key)).fetchone()
    return n == 1 and bool(this)


def forget_pending(conn, collection: str, key: str, csn: bytes) -> None:
    conn.execute("DELETE FROM tomb_pending WHERE collection=? AND key=? AND csn=?",
                 (collection, key, csn))


def remove_tombstone(conn, collection: str, key: str, csn: bytes) -> None:
    conn.execute("DELETE FROM versions WHERE collection=? AND key=? AND csn=?",
                 (collection, key, csn))
    forget_pending(conn, collection, key, csn)


def lone_tombstones_not_pending(conn) -> list[tuple[str, str, bytes]]:
    """(collection, key, csn) of tombstones that are their key's only version and not yet
    noted for removal."""
    return conn.execute(
        "SELECT v.collection, v.key, v.csn FROM versions v WHERE v.value IS NULL AND "
        "NOT EXISTS (SELECT 1 FROM versions w WHERE w.collection=v.collection AND "
        "w.key=v.key AND w.csn<>v.csn) AND NOT EXISTS (SELECT 1 FROM tomb_pending t "
        "WHERE t.collection=v.collection AND t.key=v.key AND t.csn=v.csn)").fetchall()


def note_pending(conn, collection: str, key: str, csn: bytes, after: bytes) -> None:
    conn.execute("INSERT OR IGNORE INTO tomb_pending VALUES (?, ?, ?, ?)",
                 (collection, key, csn, after))


def count_pending(conn) -> int:
    return conn.execute("SELECT count(*) FROM tomb_pending").fetchone()[0]
