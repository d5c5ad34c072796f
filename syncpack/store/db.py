"""The site store: one SQLite database per site directory, with versioned migrations.
Owns the schema (every table's definition and its migrations) and the transactions; the
rows of each table are read and written by the store module that owns it (see each one's
docstring).

WAL mode with ``synchronous=FULL``: a commit is on stable storage when it returns, and a crash
at any instant leaves either the whole transaction or none of it.

The driver is ``apsw``, not the stdlib ``sqlite3``: the import path's own inserts (``versions``
and ``changelog`` rows by ``executemany``) take 0.63x the wall and 0.58x the CPU time through it
(``tools/bench_driver.py``, 1M ops), and it brings a current SQLite whatever the Python build
links.  Like ``sqlite3`` with ``isolation_level=None`` it never begins a transaction on its own:
``write_txn``/``read_txn`` are the only transactions.  The other store modules use the
connection's ``execute``/``executemany``/``changes`` and cursors' ``fetchone``/``fetchall``, and
every module catches the driver's errors by the names below, so only this module knows which
driver it is.  Outside ``syncpack/store/`` no module runs SQL.
"""

from __future__ import annotations

from contextlib import contextmanager
from itertools import chain
from pathlib import Path
from typing import Iterator

import apsw

from syncpack.errors import ACCESS_HINT, SiteError

Connection = apsw.Connection
# Every failure the driver reports (corrupt or foreign file, I/O, busy, misuse): the stdlib's
# sqlite3.DatabaseError, whose subclasses covered the same ground.
DatabaseError = apsw.Error
# A UNIQUE/PRIMARY KEY/NOT NULL constraint refused a row (the stdlib's sqlite3.IntegrityError).
IntegrityError = apsw.ConstraintError
# SQLite's carray table-valued function with apsw's binding for it (apsw.carray, in PyPI's
# builds): a column of strings or blobs handed to one statement, which reads it in C, instead
# of one binding per row.  A build without it takes the row-by-row path.
HAS_CARRAY = hasattr(apsw, "carray") and "ENABLE_CARRAY" in apsw.compile_options


def carray(items: tuple) -> object:
    """``items`` (a tuple of str, or of bytes) bound as one value for ``carray(?)``."""
    return apsw.carray(items)


# Another process holding the write lock is waited for this long before BusyError.
BUSY_TIMEOUT_MS = 30_000

DB_NAME = "syncpack.db"
SCHEMA_VERSION = 14

# Each entry migrates from version i to i+1; never edit a released step, add one.
MIGRATIONS: list[str] = [
    """
    CREATE TABLE meta(key TEXT PRIMARY KEY, value) WITHOUT ROWID;
    -- origin -> highest epoch applied; floor: epochs <= floor are not in the changelog
    -- (trimmed, or received inside a snapshot)
    -- seeded: epochs <= seeded arrived inside a snapshot (never in our changelog), so peers
    -- that lack them are left to other members instead of failing the export
    CREATE TABLE vector(origin BLOB PRIMARY KEY, epoch INTEGER NOT NULL,
                        floor INTEGER NOT NULL DEFAULT 0,
                        seeded INTEGER NOT NULL DEFAULT 0) WITHOUT ROWID;
    CREATE TABLE changelog(
        origin BLOB NOT NULL, epoch INTEGER NOT NULL,
        hlc INTEGER NOT NULL, seq INTEGER NOT NULL,
        collection TEXT NOT NULL, key TEXT NOT NULL,
        value BLOB,                      -- msgpack value; NULL for a delete
        replaced BLOB NOT NULL,          -- concatenated CSNs this op superseded at its origin
        PRIMARY KEY(origin, epoch)) WITHOUT ROWID;
    -- own ops set aside after a restore showed our history forked; re-issued later
    CREATE TABLE stash(
        origin BLOB NOT NULL, epoch INTEGER NOT NULL, hlc INTEGER NOT NULL,
        seq INTEGER NOT NULL, collection TEXT NOT NULL, key TEXT NOT NULL, value BLOB,
        replaced BLOB NOT NULL, PRIMARY KEY(origin, epoch)) WITHOUT ROWID;
    -- CSN order is (hlc, origin, seq)
    CREATE UNIQUE INDEX changelog_csn ON changelog(hlc, origin, seq);
    -- surviving versions per key; value NULL is a tombstone
    CREATE TABLE versions(collection TEXT NOT NULL, key TEXT NOT NULL, csn BLOB NOT NULL,
                          value BLOB, PRIMARY KEY(collection, key, csn)) WITHOUT ROWID;
    -- versions superseded by an op that arrived before them (only outside causal delivery)
    CREATE TABLE superseded(csn BLOB PRIMARY KEY) WITHOUT ROWID;
    -- the epoch matrix: what we sent each peer and what it acknowledged, per origin
    CREATE TABLE matrix(peer BLOB NOT NULL, origin BLOB NOT NULL,
                        sent INTEGER NOT NULL DEFAULT 0, acked INTEGER NOT NULL DEFAULT 0,
                        PRIMARY KEY(peer, origin)) WITHOUT ROWID;
    -- per link: our outgoing sequence, the highest sequence received, what we last told it
    CREATE TABLE links(peer BLOB PRIMARY KEY, out_seq INTEGER NOT NULL DEFAULT 0,
                       in_seq INTEGER NOT NULL DEFAULT 0, told BLOB,
                       peer_recv_seq INTEGER NOT NULL DEFAULT 0,
                       peer_waiting BLOB,
                       acked_created INTEGER NOT NULL DEFAULT 0) WITHOUT ROWID;
    -- tombstones every member acknowledged, waiting until every op that could be concurrent
    -- with them (anything below 'after', a vector) is acknowledged too
    CREATE TABLE tomb_pending(collection TEXT NOT NULL, key TEXT NOT NULL, csn BLOB NOT NULL,
                              after BLOB NOT NULL, PRIMARY KEY(collection, key, csn))
                              WITHOUT ROWID;
    CREATE TABLE packets_in(packet_id BLOB PRIMARY KEY, sender BLOB NOT NULL,
                            seq INTEGER NOT NULL, part INTEGER NOT NULL, kind TEXT NOT NULL,
                            ops INTEGER NOT NULL, path TEXT, at_ms INTEGER NOT NULL) WITHOUT ROWID;
    CREATE TABLE packets_out(packet_id BLOB PRIMARY KEY, recipient BLOB NOT NULL,
                             seq INTEGER NOT NULL, part INTEGER NOT NULL, kind TEXT NOT NULL,
                             ranges BLOB NOT NULL, ops INTEGER NOT NULL, bytes INTEGER NOT NULL,
                             path TEXT NOT NULL, at_ms INTEGER NOT NULL) WITHOUT ROWID;
    CREATE TABLE parked(packet_id BLOB PRIMARY KEY, sender BLOB NOT NULL, seq INTEGER NOT NULL,
                        part INTEGER NOT NULL, file TEXT NOT NULL, origin_path TEXT,
                        waiting BLOB NOT NULL, at_ms INTEGER NOT NULL) WITHOUT ROWID;
    """,
    # 2: packets are known by (sender, id): one member reusing another's packet id must not
    # make the genuine packet a "duplicate"; signed acknowledgements replace gossiped floors.
    """
    CREATE TABLE packets_in_v2(sender BLOB NOT NULL, packet_id BLOB NOT NULL,
                               seq INTEGER NOT NULL, part INTEGER NOT NULL, kind TEXT NOT NULL,
                               ops INTEGER NOT NULL, path TEXT, at_ms INTEGER NOT NULL,
                               PRIMARY KEY(sender, packet_id)) WITHOUT ROWID;
    INSERT INTO packets_in_v2 SELECT sender, packet_id, seq, part, kind, ops, path, at_ms
        FROM packets_in;
    DROP TABLE packets_in;
    ALTER TABLE packets_in_v2 RENAME TO packets_in;
    CREATE TABLE parked_v2(sender BLOB NOT NULL, packet_id BLOB NOT NULL, seq INTEGER NOT NULL,
                           part INTEGER NOT NULL, file TEXT NOT NULL, origin_path TEXT,
                           waiting BLOB NOT NULL, at_ms INTEGER NOT NULL,
                           PRIMARY KEY(sender, packet_id)) WITHOUT ROWID;
    INSERT INTO parked_v2 SELECT sender, packet_id, seq, part, file, origin_path, waiting, at_ms
        FROM parked;
    DROP TABLE parked;
    ALTER TABLE parked_v2 RENAME TO parked;
    -- each member's newest acknowledgement of its own vector, with its signature, as received
    -- directly or relayed word for word; scrub trims on these alone
    CREATE TABLE acks(member BLOB PRIMARY KEY, created_ms INTEGER NOT NULL,
                      vector BLOB NOT NULL, signature BLOB NOT NULL) WITHOUT ROWID;
    -- per member, the acknowledgement in which it held the most of its own origin: relayed
    -- back to it after a restore as the proof of how much of its own history it once held
    CREATE TABLE own_acks(member BLOB PRIMARY KEY, epoch INTEGER NOT NULL,
                          created_ms INTEGER NOT NULL, vector BLOB NOT NULL,
                          signature BLOB NOT NULL) WITHOUT ROWID;
    -- which acknowledgement of each member we last passed on to each peer
    CREATE TABLE acks_told(peer BLOB NOT NULL, member BLOB NOT NULL,
                           created_ms INTEGER NOT NULL, PRIMARY KEY(peer, member)) WITHOUT ROWID;
    DELETE FROM meta WHERE key IN ('ack_floor_gossip', 'ack_floor_set');
    """,
    # 3: format v2.  Ops travel and are kept as blocks signed by their origin (syncpack/chain.py);
    # the changelog keeps only our own ops not sealed yet.  Relayed ops of other origins came
    # without their origin's signature and no one but the origin can sign them: they count as
    # held as if received inside a snapshot: a peer that lacks them is left to their origin
    # (and to the sites it sends them to), as after seeding.
    """
    CREATE TABLE blocks(origin BLOB NOT NULL, lo INTEGER NOT NULL, hi INTEGER NOT NULL,
                        hlc_first INTEGER NOT NULL, hlc_last INTEGER NOT NULL,
                        last_seq INTEGER NOT NULL, hash BLOB NOT NULL, data BLOB NOT NULL);
    CREATE UNIQUE INDEX blocks_by_epoch ON blocks(origin, hi);
    CREATE INDEX blocks_by_clock ON blocks(origin, hlc_first);
    UPDATE vector SET floor=max(floor, epoch), seeded=max(seeded, epoch)
        WHERE origin IS NOT (SELECT value FROM meta WHERE key='site_id')
        AND EXISTS (SELECT 1 FROM meta WHERE key='site_id');
    -- superseded-in-advance versions are known by their key too (an op supersedes only
    -- versions of its own key): each takes the key of the op that listed it
    CREATE TABLE superseded_v3(collection TEXT NOT NULL, key TEXT NOT NULL, csn BLOB NOT NULL,
                               PRIMARY KEY(collection, key, csn)) WITHOUT ROWID;
    WITH RECURSIVE listed(collection, key, rest, csn) AS (
        SELECT collection, key, replaced, NULL FROM changelog WHERE length(replaced) > 0
        UNION ALL
        SELECT collection, key, substr(rest, 21), substr(rest, 1, 20) FROM listed
            WHERE length(rest) > 0)
    INSERT OR IGNORE INTO superseded_v3 SELECT l.collection, l.key, l.csn FROM listed l
        JOIN superseded s ON s.csn = l.csn;
    DROP TABLE superseded;
    ALTER TABLE superseded_v3 RENAME TO superseded;
    DELETE FROM changelog WHERE origin IS NOT (SELECT value FROM meta WHERE key='site_id');
    """,
    # An attached application database (syncpack/store/attached.py, docs/attach.md).
    """
    CREATE TABLE attached(id INTEGER PRIMARY KEY CHECK (id = 1), db_path TEXT NOT NULL,
                          captured_seq INTEGER NOT NULL DEFAULT 0);
    CREATE TABLE attached_tables(name TEXT PRIMARY KEY, pk TEXT NOT NULL, columns TEXT NOT NULL,
                                 create_sql TEXT NOT NULL, last_capture_ms INTEGER,
                                 last_apply_ms INTEGER) WITHOUT ROWID;
    CREATE TABLE attach_pending(collection TEXT NOT NULL, key TEXT NOT NULL, csn BLOB NOT NULL,
                                PRIMARY KEY(collection, key, csn)) WITHOUT ROWID;
    CREATE TABLE attach_clashes(collection TEXT NOT NULL, key TEXT NOT NULL,
                                constraint_text TEXT NOT NULL, at_ms INTEGER NOT NULL,
                                PRIMARY KEY(collection, key)) WITHOUT ROWID;
    CREATE TABLE attach_capturing(x);
    """,
    # 5: forks (docs/design.md §3.10).  Evidence that an origin signed two histories: both
    # signed block headers (a <= b by bytes), the first epoch both hold, and what became of it
    # here ('open': the origin is frozen; 'healed': it continued the version we hold; 'ended':
    # retired, one history kept).  heads_told: the top block of each origin we last showed
    # each peer, so a peer holding another version of it learns of the fork.
    """
    CREATE TABLE forks(origin BLOB NOT NULL, epoch INTEGER NOT NULL, a BLOB NOT NULL,
                       b BLOB NOT NULL, found_ms INTEGER NOT NULL,
                       state TEXT NOT NULL DEFAULT 'open',
                       PRIMARY KEY(origin, a, b)) WITHOUT ROWID;
    CREATE TABLE heads_told(peer BLOB NOT NULL, origin BLOB NOT NULL, hi INTEGER NOT NULL,
                            PRIMARY KEY(peer, origin)) WITHOUT ROWID;
    """,
    # 6: a one-put transaction writes one changelog row and its version, nothing else (the
    # Speed issue): the changelog holds only our own ops, whose CSNs ascend with their epochs,
    # so a CSN is found by bisecting epochs (store/chain.py epoch_of) and the CSN index, a
    # third B-tree page in every commit, goes; our own epoch and clock are read from the
    # changelog's last row instead of being rewritten in vector and meta each time
    # (store/chain.py own_tip).
    """
    DROP INDEX IF EXISTS changelog_csn;
    """,
    # 7: the merge policy.  Every version ever applied in a merge collection, with the field
    # stamps it was given and the CSNs it replaced, kept after it is superseded: a later write
    # based on it is stamped against it (syncpack/store/fields.py).
    """
    CREATE TABLE field_history(collection TEXT NOT NULL, key TEXT NOT NULL, csn BLOB NOT NULL,
                               value BLOB, stamps BLOB, replaced BLOB NOT NULL,
                               PRIMARY KEY(collection, key, csn)) WITHOUT ROWID;
    """,
    # 8: schema changes of attached tables (syncpack/store/attached.py, docs/attach.md): the
    # shape recorded at the last capture, and why capture of a table stopped.
    """
    ALTER TABLE attached_tables ADD COLUMN shape TEXT;
    ALTER TABLE attached_tables ADD COLUMN stopped TEXT;
    """,
    # 9: the changelog holds our own ops only (migration 3), so the epoch alone is its key:
    # a rowid table keyed by it.  A commit appends at its right edge, which SQLite does by
    # starting a new page (its "quick balance"); the clustered (origin, epoch) key re-balanced
    # three pages every few commits instead (3.1 WAL pages a one-put commit against 2.6).
    """
    CREATE TABLE changelog_by_epoch(
        origin BLOB NOT NULL, epoch INTEGER PRIMARY KEY,
        hlc INTEGER NOT NULL, seq INTEGER NOT NULL,
        collection TEXT NOT NULL, key TEXT NOT NULL,
        value BLOB, replaced BLOB NOT NULL);
    INSERT INTO changelog_by_epoch
        SELECT origin, epoch, hlc, seq, collection, key, value, replaced FROM changelog
        WHERE origin IS (SELECT value FROM meta WHERE key='site_id') ORDER BY epoch;
    DROP TABLE changelog;
    ALTER TABLE changelog_by_epoch RENAME TO changelog;
    """,
    # 10: an import writes an attached table's rows as they arrive, in an application
    # transaction that commits after the store's; each batch so written leaves the range of its
    # CSNs here, in the store transaction that inserted it, until the application's commit is
    # known (syncpack/store/attached.py, attach/applying.py DirectApply).
    """
    CREATE TABLE attach_inflight(token BLOB NOT NULL, n INTEGER NOT NULL,
                                 collection TEXT NOT NULL, origin BLOB, lo BLOB NOT NULL,
                                 hi BLOB NOT NULL, PRIMARY KEY(token, n)) WITHOUT ROWID;
    """,
    # 11: what a detached table's rows held when it was detached (the versions each row
    # showed, and a digest of its record), so that attaching it again tells the rows the
    # application changed meanwhile from those left behind by imports (attach/core.py).
    """
    CREATE TABLE detached_tables(collection TEXT PRIMARY KEY, db_path TEXT NOT NULL,
                                 file_id TEXT NOT NULL);
    CREATE TABLE detached_rows(collection TEXT NOT NULL, key TEXT NOT NULL, csns BLOB NOT NULL,
                               digest BLOB NOT NULL, PRIMARY KEY(collection, key)) WITHOUT ROWID;
    """,
    # 12: the signed header of the newest block trimmed of each origin: a block signed again
    # for those epochs (the origin restored from a backup, then written to) is still told
    # apart from the one trimmed (store/chain.py: trim; exchange/forks.py: contradiction).
    # And a detached table's columns then: a column the application's release added while
    # it was detached, still at its default, is no change of a row (attach/capturing.py).
    """
    CREATE TABLE trimmed_heads(origin BLOB PRIMARY KEY, lo INTEGER NOT NULL,
                               hi INTEGER NOT NULL, header BLOB NOT NULL) WITHOUT ROWID;
    ALTER TABLE detached_tables ADD COLUMN columns TEXT;
    """,
    # 13: packets_out is kept for good (a year of hourly rounds to 20 peers: 175k rows), and
    # every export and status asks it per peer for the newest snapshot sent and the newest
    # packet: each a whole-table scan without these (0.75 s a round at 175k rows, 1 ms with).
    """
    CREATE INDEX packets_out_kind ON packets_out(recipient, kind, seq);
    CREATE INDEX packets_out_at ON packets_out(recipient, at_ms);
    """,
    # 14: when each member's acknowledged vector last changed, and how much of its own
    # history it holds in it.  A grown acknowledgement is a reason to write a peer a packet (a
    # spoke learns that a member it never meets holds its changes: its backlog figure falls,
    # it may trim); a newer one saying the same is not (every packet carries its sender's, so
    # that would never fall quiet).  A member holding less of its own history than we do was
    # restored from a backup and waits for every member's word, ours included, even through
    # a hub that has nothing else to send it.
    """
    ALTER TABLE acks ADD COLUMN grew_ms INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE acks ADD COLUMN own_epoch INTEGER NOT NULL DEFAULT 0;
    UPDATE acks SET grew_ms = created_ms,
        own_epoch = coalesce((SELECT epoch FROM own_acks o WHERE o.member = acks.member), 0);
    """,
]


@contextmanager
def write_txn(conn: Connection) -> Iterator[Connection]:
    """The one way to write: BEGIN IMMEDIATE (the write lock up front, so no reader-turned-
    writer deadlock), COMMIT on success, ROLLBACK on any exception, Ctrl-C included."""
    begin_write(conn)
    try:
        yield conn
    except BaseException:
        rollback(conn)
        raise
    commit(conn)


# write_txn in three steps, for a caller that is itself a context manager class
# (Site.transaction: a generator-based one costs a one-put transaction ~3% of its CPU time).
def begin_write(conn: Connection) -> None:
    conn.execute("BEGIN IMMEDIATE")


# A statement run once per row costs more than its row: bulk writers bind this many rows to one
# multi-row statement (versions: 1M rows 1.2-1.8 s against 2.1-3.4 s; an application's upsert of
# 200k five-column rows 0.32-0.40 s against 0.55-0.86 s), within SQLite's limit on bound values
# in one statement (32,766 since 3.32).
ROWS_PER_STATEMENT = 64
MAX_BINDINGS = 32_766


def rows_per_statement(width: int) -> int:
    """How many rows of ``width`` values one statement of :func:`execute_rows` binds."""
    return max(1, min(ROWS_PER_STATEMENT, MAX_BINDINGS // max(1, width)))


def execute_rows(conn: Connection, one: str, many: str, rows: list, width: int) -> None:
    """Run ``one`` (a statement of one row of ``width`` values) for each of ``rows`` in order,
    as ``many`` (the same statement with :func:`rows_per_statement` rows) where rows fill it."""
    k = rows_per_statement(width)
    n = len(rows)
    whole = n - n % k if k > 1 else 0
    if whole:
        flat = list(chain.from_iterable(rows[:whole] if whole < n else rows))
        w = k * width
        conn.executemany(many, (flat[i:i + w] for i in range(0, len(flat), w)))
    if whole < n:
        conn.executemany(one, rows[whole:])


def data_version(conn: Connection) -> int:
    """A number that changes whenever any connection, this one included, commits a change to
    the store: a value read in memory is still the store's while this stays the same (read
    it inside a transaction, where it reflects every commit before it)."""
    return conn.data_version()


def commit(conn: Connection) -> None:
    conn.execute("COMMIT")


def rollback(conn: Connection) -> None:
    # SQLite may have rolled back by itself (a full disk, no memory): the error that did it is
    # the one to tell, not "no transaction is active"
    if not conn.get_autocommit():
        conn.execute("ROLLBACK")


def integrity_check(conn: Connection) -> list[str]:
    """SQLite's own check of the file: ``[]`` when sound, else its first complaints."""
    rows = conn.execute("PRAGMA integrity_check").fetchall()
    return [] if rows == [("ok",)] else [r[0] for r in rows[:5]]


@contextmanager
def read_txn(conn: Connection) -> Iterator[Connection]:
    """One consistent read snapshot for several queries."""
    conn.execute("BEGIN")
    try:
        yield conn
    finally:
        conn.execute("ROLLBACK")


def _open(db_path: Path, flags: int) -> Connection:
    conn = apsw.Connection(str(db_path), flags=flags)
    conn.set_busy_timeout(BUSY_TIMEOUT_MS)
    return conn


def open_readonly(db_path: Path) -> Connection:
    """Another site's store, to read a setting of it: never written, never migrated."""
    return _open(db_path, apsw.SQLITE_OPEN_READONLY)


def _configure(conn: Connection, new: bool = False) -> None:
    if new:
        # 4 KiB pages (SQLite's default): a commit writes whole pages to the WAL and waits for
        # them to reach the disk, and a one-put transaction touches two or three of them; at
        # 16 KiB it wrote 39 KB a commit against 13 KB (one-put transactions 1.84x plain
        # SQLite's time against 1.38x, same run).  An import spends ~3% more CPU on the
        # smaller pages.  Only possible before the first table and before WAL; stores made
        # before keep their 16 KiB pages.
        conn.execute("PRAGMA page_size=4096")
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("PRAGMA foreign_keys=OFF")
    # Imports insert into three B-trees in CSN order, which is not key order; a larger page
    # cache keeps their hot pages in memory (16 MiB, allocated only as used).
    conn.execute("PRAGMA cache_size=-16384")


def connect(db_path: Path, new: bool = False) -> Connection:
    conn = _open(db_path, apsw.SQLITE_OPEN_READWRITE | apsw.SQLITE_OPEN_CREATE)
    _configure(conn, new)
    return conn


def create(db_path: Path) -> Connection:
    conn = connect(db_path, new=True)
    migrate(conn, db_path)
    return conn


def migrate(conn: Connection, db_path: Path) -> None:
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        raise SiteError(f"{db_path} has schema version {version}, newer than this syncpack "
                        f"understands ({SCHEMA_VERSION})",
                        hint="upgrade syncpack to open this site")
    while version < SCHEMA_VERSION:
        with write_txn(conn):
            for stmt in _statements(MIGRATIONS[version]):
                conn.execute(stmt)
            conn.execute(f"PRAGMA user_version={version + 1}")
        version += 1


def _statements(script: str) -> list[str]:
    out, buf = [], []
    for line in script.splitlines():
        s = line.split("--", 1)[0]
        buf.append(s)
        if s.rstrip().endswith(";"):
            stmt = "\n".join(buf).strip()
            if stmt.strip(";").strip():
                out.append(stmt)
            buf = []
    return out


# SQLite's "database is locked": another connection holds what this one waited for.
BusyErrors = (apsw.BusyError, apsw.LockedError)


def access_problem(e: BaseException) -> tuple[str, str] | None:
    """(what, hint) when ``e`` says the store may well be sound but this process cannot use
    it now: another program holds it locked, this user may not write it, the disk is full or
    failed a read or write.  None of these is known damage, and restoring a backup (the hint
    for damage) would be the wrong thing to do first."""
    if isinstance(e, BusyErrors):
        return ("the site store is locked by another program",
                "a program other than syncpack (an sqlite3 shell, a backup tool) holds it "
                "open for writing; close it, then run the command again")
    if isinstance(e, (apsw.ReadOnlyError, apsw.PermissionsError, apsw.CantOpenError)):
        return ("the site store cannot be written by this user",
                "run syncpack as the account that owns the site directory, or give that "
                "account write access to it and to the files in it, the store's -wal and "
                "-shm files too, which SQLite makes with the store's mode "
                "(docs/operations.md)")
    if isinstance(e, apsw.FullError):
        return ("the disk holding the site store is full",
                "free space on it, then run the command again (what failed was rolled back)")
    if isinstance(e, apsw.IOError):
        # a file-size limit (ulimit -f), a quota or a device gone: the store itself is
        # usually sound, and a restore from a backup would lose what it holds
        return ("the site store could not be read or written",
                "check the disk and this process's limits (free space, a quota, a file-size "
                "limit such as 'ulimit -f'), then run 'syncpack fsck'; restore from a backup "
                "only if fsck fails")
    return None


def open_existing(db_path: Path) -> Connection:
    """Open a site's store; never writes to a file that is not already a syncpack store."""
    hint = "restore the site directory from a backup"
    try:
        with open(db_path, "rb") as f:
            magic = f.read(16)
    except PermissionError as e:
        # the file is likely sound: restoring a backup over it would lose what it holds
        raise SiteError(f"{db_path} cannot be read by this user ({e.strerror})",
                        hint=ACCESS_HINT) from None
    except OSError as e:
        raise SiteError(f"{db_path} cannot be read ({e.strerror})", hint=hint) from None
    if magic != b"SQLite format 3\0":
        raise SiteError(f"{db_path} is not a readable syncpack store (not an SQLite database)", hint=hint)
    conn = None
    try:
        # Never created here, and looked at before any pragma: switching another program's
        # database to WAL would write to it.
        conn = _open(db_path, apsw.SQLITE_OPEN_READWRITE)
        if conn.execute("PRAGMA user_version").fetchone()[0] == 0:
            raise SiteError(f"{db_path} is not a readable syncpack store (an SQLite database of something else)",
                            hint=hint)
        _configure(conn)
        migrate(conn, db_path)
        conn.execute("SELECT count(*) FROM meta").fetchone()
        return conn
    except DatabaseError as e:
        if conn is not None:
            conn.close()
        access = access_problem(e)
        if access is not None:
            raise SiteError(f"{access[0]} ({db_path}: {e})", hint=access[1]) from None
        raise SiteError(f"{db_path} is not a readable syncpack store ({e})", hint=hint) from None
    except SiteError:
        if conn is not None:
            conn.close()
        raise
