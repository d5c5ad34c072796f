"""The store's side of an attached application database (docs/attach.md).

Tables (created by the store's migration 4, :mod:`syncpack.store.db`):

- ``attached``: the one attached database of this site and how far its changes were captured
  (``captured_seq``: the application's change numbers up to it are in the changelog; a capture
  commits its ops and the new number in one store transaction, so a crash on either side of
  that commit neither loses nor repeats a change);
- ``attached_tables``: each replicated table, its key columns and definition, and times;
- ``attach_pending``: per key of an attached table whose surviving versions changed in the
  store and are not yet written into the application's table, the CSNs that arrived (the
  application has not seen them: a local write captured meanwhile does not replace them, it
  is concurrent with them); ``x''`` stands for "a version went away";
- ``attach_clashes``: keys whose visible record the application's schema refused (UNIQUE,
  CHECK, NOT NULL, FOREIGN KEY), with the constraint, retried on every apply;
- ``attach_inflight`` (migration 9): while an import writes an attached table's rows as they arrive (see
  :func:`set_direct`), the CSN range of each batch so written, committed with the batch; the
  marks go once the application's transaction has committed, and marks found at any other time
  (a crash, an interrupted import) become pending keys again (:func:`recover_inflight`);
- ``attached_tables.shape`` / ``stopped`` (migration 8): the table's shape as last captured
  (:mod:`syncpack.attach.shapes`), and, when the application changed it in a way peers cannot
  follow, why capture of it stopped (until ``attach --refresh``);
- ``attach_capturing``: a marker row inserted and removed inside a capture's own transaction,
  so the triggers that fill ``attach_pending`` skip what capture writes (the application
  already holds it).

The triggers on ``versions`` exist only while something is attached, so a site without an
attachment pays nothing on import.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from itertools import repeat
from pathlib import Path
from typing import Callable, Iterable, Iterator

from syncpack.store import db, meta
from syncpack.store.db import Connection


_TRIGGERS = [
    "CREATE TRIGGER IF NOT EXISTS attach_versions_ins AFTER INSERT ON versions "
    "WHEN NOT EXISTS (SELECT 1 FROM attach_capturing) AND "
    "EXISTS (SELECT 1 FROM attached_tables WHERE name = NEW.collection) "
    "BEGIN INSERT OR IGNORE INTO attach_pending VALUES (NEW.collection, NEW.key, NEW.csn); END",
    "CREATE TRIGGER IF NOT EXISTS attach_versions_del AFTER DELETE ON versions "
    "WHEN NOT EXISTS (SELECT 1 FROM attach_capturing) AND "
    "EXISTS (SELECT 1 FROM attached_tables WHERE name = OLD.collection) "
    "BEGIN INSERT OR IGNORE INTO attach_pending VALUES (OLD.collection, OLD.key, x''); END",
]


def attachment(conn: Connection) -> tuple[str, int] | None:
    """(database path, captured_seq), or None when nothing is attached."""
    row = conn.execute("SELECT db_path, captured_seq FROM attached").fetchone()
    return (row[0], row[1]) if row else None


def attachment_in(site_dir: Path) -> str | None:
    """The path of the application database another site's store has attached, read without
    writing; None when it has none, or there is no such store, or it cannot be read."""
    store_file = site_dir / db.DB_NAME
    if not store_file.is_file():
        return None
    try:
        conn = db.open_readonly(store_file)
        try:
            row = conn.execute("SELECT db_path FROM attached").fetchone()
        finally:
            conn.close()
    except db.DatabaseError:
        return None
    return row[0] if row else None


def set_attachment(conn: Connection, path: str, captured_seq: int) -> None:
    conn.execute("INSERT OR REPLACE INTO attached(id, db_path, captured_seq) VALUES (1, ?, ?)",
                 (path, captured_seq))
    for t in _TRIGGERS:
        conn.execute(t)


# The attached file was seen holding syncpack's tables after its attach committed: one found
# without any of them since is not that file (or a copy of it from before the attach).
_FILE_SEEN = "attached_file_seen"


def note_file_seen(conn: Connection, path: str | None) -> None:
    """Note that the file at ``path`` (None: forget) holds what this site's attach put there."""
    if path is None:
        meta.remove(conn, _FILE_SEEN)
    else:
        meta.put(conn, _FILE_SEEN, path)


def file_seen(conn: Connection, path: str) -> bool:
    return meta.get(conn, _FILE_SEEN) == path


# The last failure to capture from or write into the attached file, until a command succeeds:
# the commands that failed said it once, and 'status' (which captures too) must go on saying it.
_FAILING = "attached_failing"


def note_failing(conn: Connection, error: str, hint: str | None, since_ms: int) -> None:
    held = failing(conn)
    if held is not None and held["error"] == error:
        since_ms = held["since_ms"]
    meta.put(conn, _FAILING, json.dumps({"error": error, "hint": hint, "since_ms": since_ms}))


def failing(conn: Connection) -> dict | None:
    """{error, hint, since_ms} of the failure :func:`note_failing` noted, or None."""
    raw = meta.get(conn, _FAILING)
    return json.loads(raw) if raw else None


def end_failing(conn: Connection) -> None:
    meta.remove(conn, _FAILING)


# What the change row numbered as far as the store captured held ([number, fingerprint]): a
# file restored from an older copy and written past that number again holds another change
# there (appdb.went_back).
_TAIL = "attached_capture_tail"


def note_tail(conn: Connection, seq: int, fingerprint: str | None) -> None:
    if fingerprint is None:
        meta.remove(conn, _TAIL)
    else:
        meta.put(conn, _TAIL, json.dumps([seq, fingerprint]))


def tail(conn: Connection, captured: int) -> str | None:
    """The fingerprint of the change row numbered ``captured`` when it was captured, if
    noted."""
    raw = meta.get(conn, _TAIL)
    if not raw:
        return None
    seq, fingerprint = json.loads(raw)
    return fingerprint if seq == captured else None


def set_captured(conn: Connection, seq: int) -> None:
    conn.execute("UPDATE attached SET captured_seq=max(captured_seq, ?)", (seq,))


def tables(conn: Connection) -> dict[str, dict]:
    out = {}
    for name, pk, cols, sql, cap, app in conn.execute(
            "SELECT name, pk, columns, create_sql, last_capture_ms, last_apply_ms "
            "FROM attached_tables ORDER BY name"):
        out[name] = {"pk": json.loads(pk), "columns": json.loads(cols), "create_sql": sql,
                     "last_capture_ms": cap, "last_apply_ms": app}
    return out


def add_table(conn: Connection, name: str, pk: list[str], columns: list[str],
              create_sql: str) -> None:
    conn.execute("INSERT INTO attached_tables(name, pk, columns, create_sql) VALUES (?, ?, ?, ?)",
                 (name, json.dumps(pk), json.dumps(columns), create_sql))


def remove_table(conn: Connection, name: str) -> None:
    for sql in ("DELETE FROM attached_tables WHERE name=?",
                "DELETE FROM attach_pending WHERE collection=?",
                "DELETE FROM attach_clashes WHERE collection=?",
                "DELETE FROM attach_inflight WHERE collection=?"):
        conn.execute(sql, (name,))
    if conn.execute("SELECT 1 FROM attached_tables LIMIT 1").fetchone() is None:
        conn.execute("DELETE FROM attached")
        conn.execute("DROP TRIGGER IF EXISTS attach_versions_ins")
        conn.execute("DROP TRIGGER IF EXISTS attach_versions_del")
        end_store_behind(conn)
        end_failing(conn)
        meta.remove(conn, _TAIL)


def family_table(conn: Connection, definitions: str, collection: str) -> bool:
    """Whether ``collection`` is an attached table of the family, attached here or only at a
    peer (the collection of table ``definitions`` holds one of it)."""
    return collection in watched(conn) or conn.execute(
        "SELECT 1 FROM versions WHERE collection=? AND key=? AND value IS NOT NULL LIMIT 1",
        (definitions, collection)).fetchone() is not None


def remember_detached(conn: Connection, collection: str, db_path: str, file_id: str,
                      rows: Iterable[tuple[str, bytes, bytes]],
                      columns: list[str] | None = None) -> None:
    """What the rows of ``collection`` held as it is detached from the file ``file_id`` at
    ``db_path``: (key, the CSNs of the versions the row had seen, the digest of its
    record); and the table's ``columns`` then."""
    forget_detached(conn, collection)
    conn.execute("INSERT INTO detached_tables(collection, db_path, file_id, columns) "
                 "VALUES (?, ?, ?, ?)", (collection, db_path, file_id,
                                         None if columns is None else json.dumps(columns)))
    # Two rows of an untyped key column share a record key (the integer 1 and the text
    # '1', docs/attach.md): one of them is remembered, the other counts as changed.
    conn.executemany("INSERT OR REPLACE INTO detached_rows VALUES (?, ?, ?, ?)",
                     ((collection, k, c, d) for k, c, d in rows))


def detached_rows(conn: Connection, collection: str, db_path: str, file_id: str
                  ) -> dict[str, tuple[bytes, bytes]] | None:
    """key -> (CSNs, digest) of ``collection`` as it was detached from the same file at
    ``db_path``; None if it was not (or another file stands there now)."""
    if conn.execute("SELECT 1 FROM detached_tables WHERE collection=? AND db_path=? AND "
                    "file_id=?", (collection, db_path, file_id)).fetchone() is None:
        return None
    return {k: (c, d) for k, c, d in conn.execute(
        "SELECT key, csns, digest FROM detached_rows WHERE collection=?", (collection,))}


def detached_columns(conn: Connection, collection: str) -> list[str] | None:
    """The columns ``collection`` had when it was detached, if known."""
    row = conn.execute("SELECT columns FROM detached_tables WHERE collection=?",
                       (collection,)).fetchone()
    return json.loads(row[0]) if row and row[0] else None


def detached_here(conn: Connection) -> set[str]:
    """The tables this site detached (and has not attached again)."""
    return {r[0] for r in conn.execute("SELECT collection FROM detached_tables")}


def forget_detached(conn: Connection, collection: str) -> None:
    conn.execute("DELETE FROM detached_tables WHERE collection=?", (collection,))
    conn.execute("DELETE FROM detached_rows WHERE collection=?", (collection,))


def shapes(conn: Connection) -> dict[str, tuple[dict | None, str | None]]:
    """Per attached table: (recorded shape or None, why capture stopped or None)."""
    return {n: (json.loads(s) if s else None, st) for n, s, st in conn.execute(
        "SELECT name, shape, stopped FROM attached_tables ORDER BY name")}


def stopped(conn: Connection) -> dict[str, str]:
    """Per attached table whose capture a schema change stopped: why."""
    return {n: st for n, st in conn.execute(
        "SELECT name, stopped FROM attached_tables WHERE stopped IS NOT NULL ORDER BY name")}


def set_shape(conn: Connection, name: str, shape: dict, columns: list[str] | None = None,
              pk: list[str] | None = None, create_sql: str | None = None) -> None:
    """Record ``name``'s shape (and, when given, its columns, key and definition)."""
    conn.execute("UPDATE attached_tables SET shape=?, columns=coalesce(?, columns), "
                 "pk=coalesce(?, pk), create_sql=coalesce(?, create_sql) WHERE name=?",
                 (json.dumps(shape), None if columns is None else json.dumps(columns),
                  None if pk is None else json.dumps(pk), create_sql, name))


def set_stopped(conn: Connection, name: str, why: str | None) -> None:
    conn.execute("UPDATE attached_tables SET stopped=? WHERE name=?", (why, name))


def lone_clashes(conn: Connection) -> int:
    """Clashes of keys that are not also in conflict among their versions (those count
    once, as conflicts)."""
    return conn.execute(
        "SELECT count(*) FROM attach_clashes c WHERE (SELECT count(*) FROM versions v WHERE "
        "v.collection = c.collection AND v.key = c.key) < 2").fetchone()[0]


def waiting_count(conn: Connection, collection: str, prefix: str) -> int:
    """Clashes of ``collection`` whose text starts with ``prefix``."""
    return conn.execute("SELECT count(*) FROM attach_clashes WHERE collection=? AND "
                        "substr(constraint_text, 1, length(?)) = ?",
                        (collection, prefix, prefix)).fetchone()[0]


def touch(conn: Connection, names, column: str, at_ms: int) -> None:
    assert column in ("last_capture_ms", "last_apply_ms")
    conn.executemany(f"UPDATE attached_tables SET {column}=? WHERE name=?",
                     [(at_ms, n) for n in names])


@contextmanager
def triggers_aside(conn: Connection, deletes: bool = False) -> Iterator[None]:
    """Without the ``versions`` insert trigger for a bulk insert whose pending keys the caller
    notes itself: even with its WHEN clause false, a trigger costs every row three times the
    insert.  Dropped and re-created inside the caller's transaction, so no other connection
    sees the table without it and a rollback restores it.  ``deletes``: the delete trigger
    instead, for a removal of versions whose keys each get a new version next (noted then)."""
    name, sql = (("attach_versions_del", _TRIGGERS[1]) if deletes else
                 ("attach_versions_ins", _TRIGGERS[0]))
    if not deletes or watched(conn):
        conn.execute(f"DROP TRIGGER IF EXISTS {name}")
    try:
        yield
    finally:
        if not deletes or watched(conn):
            conn.execute(sql)


def begin_capturing(conn: Connection) -> None:
    conn.execute("INSERT INTO attach_capturing VALUES (1)")


def end_capturing(conn: Connection) -> None:
    conn.execute("DELETE FROM attach_capturing")


def pause_triggers(conn: Connection) -> None:
    """Drop the ``versions`` triggers for a bulk write of ours inside the caller's store
    transaction (a capture): with the capturing marker they would only find it, but checking
    costs each inserted version more than its insert.  :func:`resume_triggers` puts them back
    before the commit; a rollback or crash puts them back with everything else."""
    conn.execute("DROP TRIGGER IF EXISTS attach_versions_ins")
    conn.execute("DROP TRIGGER IF EXISTS attach_versions_del")


def resume_triggers(conn: Connection) -> None:
    if attachment(conn) is not None:
        for t in _TRIGGERS:
            conn.execute(t)


def mark_all_pending(conn: Connection, collection: str) -> None:
    """Every surviving version of ``collection`` is news to the application's table."""
    conn.execute("INSERT OR IGNORE INTO attach_pending SELECT collection, key, csn "
                 "FROM versions WHERE collection=?", (collection,))


def unseen(conn: Connection, collection: str, key: str) -> set[bytes]:
    return {r[0] for r in conn.execute(
        "SELECT csn FROM attach_pending WHERE collection=? AND key=?", (collection, key))}


def has_pending(conn: Connection) -> bool:
    return conn.execute("SELECT 1 FROM attach_pending LIMIT 1").fetchone() is not None


def pending_keys(conn: Connection, collection: str) -> list[str]:
    return [r[0] for r in conn.execute(
        "SELECT DISTINCT key FROM attach_pending WHERE collection=? ORDER BY key",
        (collection,))]


def pending_count(conn: Connection, collection: str) -> int:
    return conn.execute("SELECT count(DISTINCT key) FROM attach_pending WHERE collection=?",
                        (collection,)).fetchone()[0]


def clear_pending(conn: Connection, collection: str, keys: list[str]) -> None:
    conn.executemany("DELETE FROM attach_pending WHERE collection=? AND key=?",
                     [(collection, k) for k in keys])


def written_keys(conn: Connection, collection: str, keys: list[str], at_ms: int) -> None:
    """``keys`` got their visible records in the application: no longer pending, and no
    longer clashes."""
    clear_pending(conn, collection, keys)
    conn.executemany("DELETE FROM attach_clashes WHERE collection=? AND key=?",
                     [(collection, k) for k in keys])
    touch(conn, [collection], "last_apply_ms", at_ms)


def versions_of(conn: Connection, collection: str, key: str) -> list[tuple[bytes, bytes | None]]:
    return conn.execute("SELECT csn, value FROM versions WHERE collection=? AND key=? "
                        "ORDER BY csn", (collection, key)).fetchall()


def set_clash(conn: Connection, collection: str, key: str, text: str, at_ms: int) -> None:
    conn.execute("INSERT OR REPLACE INTO attach_clashes VALUES (?, ?, ?, ?)",
                 (collection, key, text, at_ms))


def clear_clashes(conn: Connection, collection: str, keys: list[str]) -> None:
    if not has_clashes(conn, collection):
        return      # the common case: nothing to look up key by key
    conn.executemany("DELETE FROM attach_clashes WHERE collection=? AND key=?",
                     [(collection, k) for k in keys])


def clashes(conn: Connection, collection: str | None = None) -> list[tuple[str, str, str, int]]:
    if collection is None:
        return conn.execute("SELECT collection, key, constraint_text, at_ms FROM attach_clashes "
                            "ORDER BY collection, key").fetchall()
    return conn.execute("SELECT collection, key, constraint_text, at_ms FROM attach_clashes "
                        "WHERE collection=? ORDER BY key", (collection,)).fetchall()


def clash_of(conn: Connection, collection: str, key: str) -> str | None:
    row = conn.execute("SELECT constraint_text FROM attach_clashes WHERE collection=? AND key=?",
                       (collection, key)).fetchone()
    return row[0] if row else None


def collection_used(conn: Connection, collection: str) -> bool:
    return conn.execute("SELECT 1 FROM versions WHERE collection=? LIMIT 1",
                        (collection,)).fetchone() is not None


def visible_candidates(conn: Connection, collection: str) -> Iterator[tuple[str, bytes, bytes | None]]:
    """(key, csn, value) of every surviving version of ``collection``, by key."""
    return conn.execute("SELECT key, csn, value FROM versions WHERE collection=? ORDER BY key, csn",
                        (collection,))


def versions_for(conn: Connection, collection: str, keys: list[str]
                 ) -> dict[str, list[tuple[bytes, bytes | None]]]:
    """Surviving versions of many keys at once: key -> [(csn, value)] in CSN order."""
    out: dict[str, list[tuple[bytes, bytes | None]]] = {}
    if not keys:
        return out
    for key, csn, value in conn.executemany(
            "SELECT key, csn, value FROM versions WHERE collection=? AND key=? ORDER BY csn",
            [(collection, k) for k in keys]):
        out.setdefault(key, []).append((csn, value))
    return out


def unseen_for(conn: Connection, collection: str, keys: list[str]) -> dict[str, set[bytes]]:
    """Pending CSNs of many keys at once (see :func:`unseen`)."""
    out: dict[str, set[bytes]] = {}
    if not keys:
        return out
    for key, csn in conn.executemany(
            "SELECT key, csn FROM attach_pending WHERE collection=? AND key=?",
            [(collection, k) for k in keys]):
        if csn:
            out.setdefault(key, set()).add(csn)
    return out


def pending_versions(conn: Connection, collection: str
                     ) -> Iterator[tuple[str, bytes | None, bytes | None]]:
    """(key, csn, value) of every surviving version of every pending key of ``collection``
    (csn None: the key has no version left), by key."""
    return conn.execute(
        "SELECT p.key, v.csn, v.value FROM (SELECT DISTINCT key FROM attach_pending "
        "WHERE collection=?) p LEFT JOIN versions v ON v.collection=? AND v.key=p.key "
        "ORDER BY p.key, v.csn", (collection, collection))


def clear_all_pending(conn: Connection, collection: str) -> None:
    conn.execute("DELETE FROM attach_pending WHERE collection=?", (collection,))


def settle_pending(conn: Connection, collection: str, clashes: dict[str, str],
                   at_ms: int) -> None:
    """After an apply that handled every pending key of ``collection``: the keys refused
    (``clashes``: key -> constraint) stay pending and become its clashes, replacing the old
    ones; every other key is done."""
    conn.execute("DELETE FROM attach_clashes WHERE collection=?", (collection,))
    if not clashes:
        conn.execute("DELETE FROM attach_pending WHERE collection=?", (collection,))
        return
    conn.executemany("INSERT OR REPLACE INTO attach_clashes VALUES (?, ?, ?, ?)",
                     [(collection, k, t, at_ms) for k, t in clashes.items()])
    conn.execute("DELETE FROM attach_pending WHERE collection=? AND key NOT IN "
                 "(SELECT key FROM attach_clashes WHERE collection=?)", (collection, collection))


def pending_visible(conn: Connection, collection: str, by_csn: bool = False
                    ) -> Iterator[tuple[str, int, bytes | None]]:
    """(key, number of surviving versions, the value if exactly one) of every pending key of
    ``collection``, by key, or with ``by_csn`` in the order of each key's newest version
    (the order the writes were made in, for a table whose triggers depend on it): the
    common case (one version) needs no second look-up."""
    order = "max(v.csn), p.key" if by_csn else "p.key"
    return conn.execute(
        "SELECT p.key, count(v.csn), CASE WHEN count(v.csn) = 1 THEN max(v.value) END "
        "FROM (SELECT DISTINCT key FROM attach_pending WHERE collection=?) p "
        f"LEFT JOIN versions v ON v.collection=? AND v.key=p.key GROUP BY p.key ORDER BY {order}",
        (collection, collection))


def has_clashes(conn: Connection, collection: str) -> bool:
    return conn.execute("SELECT 1 FROM attach_clashes WHERE collection=? LIMIT 1",
                        (collection,)).fetchone() is not None


def watched(conn: Connection) -> frozenset[str]:
    """The attached tables whose new versions the ``versions`` triggers would note as pending
    right now (none while a capture writes), for a bulk writer that notes them itself."""
    if conn.execute("SELECT 1 FROM attach_capturing LIMIT 1").fetchone() is not None:
        return frozenset()
    return frozenset(r[0] for r in conn.execute("SELECT name FROM attached_tables"))


def mark_pending(conn: Connection, rows: Iterable[tuple[str, str, bytes]]) -> None:
    """Note new versions ``(collection, key, csn)`` as pending, as the insert trigger does."""
    conn.executemany("INSERT OR IGNORE INTO attach_pending VALUES (?, ?, ?)", rows)


def mark_pending_held(conn: Connection, rows: list[tuple[str, str, bytes]]) -> None:
    """:func:`mark_pending` of versions inserted by an earlier transaction, those still held
    (one whose packet was rolled back, or that a later op superseded, needs no apply)."""
    conn.executemany("INSERT OR IGNORE INTO attach_pending SELECT ?1, ?2, ?3 WHERE EXISTS "
                     "(SELECT 1 FROM versions WHERE collection=?1 AND key=?2 AND csn=?3)", rows)


# --- rows written into the application as an import inserts them --------------------------------

# Per store connection (by id; set and removed around one import), the callable that takes the
# new versions of attached tables instead of noting them pending one key at a time, and,
# optionally, the callable that begins the sink's own work on records about to be inserted
# (while SQLite inserts them; its result goes to the sink with them).  Both take one table's
# versions as columns, as the bulk insert holds them: a tuple per row, made only to be taken
# apart again, cost an attached import of 1M rows 0.5 s on the interpreter that inserts.
_direct: dict[int, tuple[Callable, Callable | None]] = {}


def set_direct(conn: Connection, sink: Callable | None, prepare: Callable | None = None
               ) -> None:
    """While ``sink`` is set, :func:`note_new_versions` hands it the bulk-inserted versions of
    attached tables, ``sink(collection, keys, csns, values[, prepared])``; the sink writes
    them into the application's tables itself and leaves :func:`add_inflight` marks (or
    notes keys pending) in the same store transaction.  ``prepare(values)``, if given, is
    called before the insert of those values."""
    if sink is None:
        _direct.pop(id(conn), None)
    else:
        _direct[id(conn)] = (sink, prepare)


def prepare_direct(conn: Connection, values: list[bytes | None]) -> object:
    """Before a bulk insert of ``values`` (of one attached table): what the sink's
    ``prepare`` makes of them, for :func:`note_new_versions` (None without one)."""
    sink = _direct.get(id(conn))
    return sink[1](values) if sink is not None and sink[1] is not None else None


def note_new_versions(conn: Connection, collection: str, keys: list[str], csns: list[bytes],
                      values: list[bytes | None], prepared: object = None) -> None:
    """What the ``versions`` insert trigger would do for the versions just inserted in bulk
    of ``collection``, an attached table; ``prepared``, what :func:`prepare_direct` made of
    exactly these values."""
    if not keys:
        return
    sink = _direct.get(id(conn))
    if sink is None:
        mark_pending(conn, zip(repeat(collection), keys, csns))
    elif prepared is not None:
        sink[0](collection, keys, csns, values, prepared)
    else:
        sink[0](collection, keys, csns, values)


@contextmanager
def replaced_whole(conn: Connection) -> Iterator[None]:
    """Around a snapshot's replacement of every version (``versions.clear``, then the
    snapshot's, then the kept ops'): a key of an attached table that comes back with exactly
    the versions its row showed before is no news to the application.  Every key was marked
    pending (the delete trigger, then the inserts), and a change the application made before
    those marks were written off (an import stopped by kill -9 left them) was taken as
    concurrent with the very version it changed: a conflict of the site with itself.  The
    snapshot's rows are written from pending marks, not by the import's direct writer, whose
    marks cover ranges of CSNs rather than keys."""
    sink = _direct.pop(id(conn), None)
    conn.execute("CREATE TEMP TABLE attach_shown AS SELECT collection, key, csn, value "
                 "FROM versions v WHERE collection IN (SELECT name FROM attached_tables) AND "
                 "NOT EXISTS (SELECT 1 FROM attach_pending p WHERE p.collection = v.collection "
                 "AND p.key = v.key)")
    try:
        yield
        conn.execute(
            "DELETE FROM attach_pending WHERE (collection, key) IN (SELECT s.collection, s.key "
            "FROM temp.attach_shown s LEFT JOIN versions v ON v.collection = s.collection AND "
            "v.key = s.key AND v.csn = s.csn AND v.value IS s.value "
            "GROUP BY s.collection, s.key HAVING count(v.csn) = count(*) AND count(*) = "
            "(SELECT count(*) FROM versions w WHERE w.collection = s.collection AND "
            "w.key = s.key))")
    finally:
        conn.execute("DROP TABLE temp.attach_shown")
        if sink is not None:
            _direct[id(conn)] = sink


def several_versions(conn: Connection, collection: str, keys: list[str]) -> set[str]:
    """Those of ``keys``, each holding a version already (just inserted), that have more than
    one surviving version (one statement: the keys travel as one JSON array, not as a binding
    each)."""
    if not keys:
        return set()
    n = len(keys)
    # The common bulk case first: the versions between the batch's lowest and highest key
    # are the batch's own (exactly n of them: a load in key order) on n distinct keys, so
    # none has a second one.  Both counts read the key index in order, and stop past n
    # whatever else the range holds.
    held, distinct = conn.execute(
        "SELECT (SELECT count(*) FROM (SELECT 1 FROM versions WHERE collection=?1 AND key "
        "BETWEEN ?2 AND ?3 LIMIT ?4)), (SELECT count(*) FROM (SELECT DISTINCT key FROM "
        "versions WHERE collection=?1 AND key BETWEEN ?2 AND ?3 LIMIT ?4))",
        (collection, min(keys), max(keys), n + 1)).fetchone()
    if held == n and distinct == n:
        return set()
    return {r[0] for r in conn.execute(
        "SELECT j.value FROM json_each(?) j WHERE (SELECT count(*) FROM versions v "
        "WHERE v.collection=? AND v.key=j.value) > 1", (json.dumps(keys), collection))}


def add_inflight(conn: Connection, token: bytes, n: int, collection: str,
                 origin: bytes | None, lo: bytes, hi: bytes) -> None:
    conn.execute("INSERT INTO attach_inflight VALUES (?, ?, ?, ?, ?, ?)",
                 (token, n, collection, origin, lo, hi))


def inflight_count(conn: Connection, token: bytes) -> int:
    """How many of one import's marks are committed (fewer than it made: a packet of it was
    rolled back after its rows went into the application's uncommitted transaction)."""
    return conn.execute("SELECT count(*) FROM attach_inflight WHERE token=?",
                        (token,)).fetchone()[0]


def clear_inflight(conn: Connection, token: bytes) -> None:
    conn.execute("DELETE FROM attach_inflight WHERE token=?", (token,))


_IN_RANGE = ("FROM versions v JOIN attach_inflight f ON v.collection = f.collection "
             "AND v.csn BETWEEN f.lo AND f.hi AND (f.origin IS NULL OR substr(v.csn, 9, 8) = "
             "f.origin)")


def recover_inflight(conn: Connection) -> int:
    """Marks left by an import whose application transaction is not known to have committed:
    every version in their ranges is news to the application again (writing a visible record
    twice is harmless).  Returns the marks converted."""
    n = conn.execute("SELECT count(*) FROM attach_inflight").fetchone()[0]
    if n:
        conn.execute("INSERT OR IGNORE INTO attach_pending SELECT v.collection, v.key, v.csn "
                     + _IN_RANGE)
        conn.execute("DELETE FROM attach_inflight")
    return n


def written_now(conn: Connection, collection: str, keys: list[str], token: bytes | None
                ) -> set[str]:
    """Of ``keys``, those an apply is writing into the application's open transaction: pending
    (their visible record is written before the commit), or with a version in the marks of
    import ``token`` (written as it arrived)."""
    out = set()
    for key in keys:
        if conn.execute("SELECT 1 FROM attach_pending WHERE collection=? AND key=? LIMIT 1",
                        (collection, key)).fetchone() is not None or token is not None and \
                conn.execute("SELECT 1 " + _IN_RANGE + " WHERE v.collection=? AND v.key=? "
                             "AND f.token=? LIMIT 1", (collection, key, token)).fetchone():
            out.add(key)
    return out


def inflight_tokens(conn: Connection) -> set[bytes]:
    return {bytes(r[0]) for r in conn.execute("SELECT DISTINCT token FROM attach_inflight")}


# An apply's outcome, noted before the application's commit that makes it true: a crash
# between that commit and the store's own would otherwise leave its keys pending, and a change
# the application made to one of those rows before the next command would be captured as
# concurrent with the very record it had been shown (a false conflict, which 'priority' could
# settle against the application's own edit).
_SETTLING = "attach_settling"


def note_settling(conn: Connection, token: bytes, settle: dict[str, dict[str, str]],
                  written: dict[str, list[str]]) -> None:
    """What an apply has done once the application's transaction holding ``token`` commits:
    the tables whose pending keys it all handled, with the keys refused (``settle``: table ->
    key -> constraint), and the keys it wrote (``written``: table -> keys)."""
    meta.put(conn, _SETTLING, json.dumps({"token": token.hex(), "settle": settle,
                                          "written": written}))


def settling(conn: Connection) -> tuple[bytes, dict[str, dict[str, str]],
                                        dict[str, list[str]]] | None:
    raw = meta.get(conn, _SETTLING)
    if raw is None:
        return None
    doc = json.loads(raw)
    return bytes.fromhex(doc["token"]), doc["settle"], doc["written"]


def end_settling(conn: Connection) -> None:
    meta.remove(conn, _SETTLING)


_CREATING = "attach_creating"


def note_creating(conn: Connection, names: list[str]) -> None:
    """An attach creates these tables in the application's file, whose commit comes after the
    store's: until :func:`end_creating`, a table of them missing from the file is one the
    attach did not finish (not one the application dropped)."""
    meta.put(conn, _CREATING, json.dumps(sorted(set(names) | set(creating(conn)))))


def creating(conn: Connection) -> list[str]:
    raw = meta.get(conn, _CREATING)
    return json.loads(raw) if raw else []


def end_creating(conn: Connection, names: Iterable[str] | None = None) -> None:
    """The application's file holds these tables (all, by default) now."""
    left = [] if names is None else sorted(set(creating(conn)) - set(names))
    if left:
        meta.put(conn, _CREATING, json.dumps(left))
    else:
        meta.remove(conn, _CREATING)


_BEHIND = "attach_store_behind"


def note_store_behind(conn: Connection, at_ms: int) -> None:
    """The store was found behind the attached file (appdb.store_behind), at ``at_ms``."""
    if meta.get(conn, _BEHIND) is None:
        meta.put(conn, _BEHIND, at_ms)


def store_behind_since(conn: Connection) -> int | None:
    return meta.get(conn, _BEHIND)


def end_store_behind(conn: Connection) -> None:
    meta.remove(conn, _BEHIND)


def has_inflight(conn: Connection) -> bool:
    return conn.execute("SELECT 1 FROM attach_inflight LIMIT 1").fetchone() is not None


def inflight_keys(conn: Connection, collection: str) -> set[str]:
    """Keys of ``collection`` in the marks of an unfinished import (fsck leaves them out)."""
    if not has_inflight(conn):
        return set()
    return {r[0] for r in conn.execute("SELECT DISTINCT v.key " + _IN_RANGE
                                       + " WHERE v.collection=?", (collection,))}
