"""SQL that runs against an application's own SQLite database (see docs/attach.md).

syncpack never asks the application to load anything: capture is done by triggers stored in the
application's file, so they fire on every connection of every program.  Each trigger appends the
primary key of the changed row to ``_syncpack_changes`` (key only, so a one-row write stays
cheap); the capture step reads the current row itself.  Writes made by syncpack are not
captured: syncpack's apply transaction holds the write lock, inserts a row into
``_syncpack_applying`` and deletes it before COMMIT, and every trigger has
``WHEN NOT EXISTS (SELECT 1 FROM _syncpack_applying)``.  That row is never committed, so no
other connection ever sees it.

Only this module knows the shape of those tables and triggers.
"""

from __future__ import annotations

from collections import deque
from contextlib import contextmanager
import re
from dataclasses import dataclass, field
from itertools import islice
from operator import itemgetter
from pathlib import Path
from typing import Callable, Collection, Iterable, Iterator, NamedTuple

import apsw

from syncpack.errors import ApplicationOnlyError, AttachBusyError, AttachError, arg
from syncpack.rules import sqltext
from syncpack.store import db
from syncpack.store.db import read_txn  # noqa: F401  (one snapshot rule for both files)

Connection = apsw.Connection
ConstraintError = apsw.ConstraintError
# The application may hold the write lock for a while (a bulk transaction); we wait as long.
BUSY_TIMEOUT_MS = 60_000

# Failures of the file itself, not of a statement: told as the application's file's, never
# as the site store's (whose hint, restore from a backup, would be wrong and dangerous).
# Statement errors (a constraint, a schema the caller reads) stay the caller's to handle.
_FILE_ERRORS = (apsw.BusyError, apsw.LockedError, apsw.ReadOnlyError, apsw.CorruptError,
                apsw.NotADBError, apsw.IOError, apsw.FullError, apsw.CantOpenError,
                apsw.PermissionsError, apsw.ProtocolError, apsw.TooBigError)


def file_error(path: str, e: BaseException) -> AttachError:
    """The :class:`AttachError` that tells a failure of the application's file ``path``."""
    if isinstance(e, (apsw.BusyError, apsw.LockedError)):
        return AttachBusyError(
            f"the application's database {path} stayed locked by another connection longer "
            f"than this command waits", hint="an application transaction held it (or a lock "
            "it keeps: PRAGMA locking_mode=EXCLUSIVE); run the command again once that "
            "transaction has ended")
    return AttachError(f"the application's database {path} cannot be used: {e}",
                       hint="the site store is not at fault: check that file (its "
                            "permissions, free space, sqlite3 FILE 'PRAGMA integrity_check')")


# What SQLite refuses to compile when the application's schema (a trigger, an index, a CHECK
# constraint, a generated column) uses a function, a collation or a module that only the
# application defines, registered in its own connections.
_APP_ONLY = ("no such function", "no such collation sequence", "no such module")


def schema_refusal(path: str, e: BaseException) -> ApplicationOnlyError | None:
    """The :class:`ApplicationOnlyError` that ``e``, an error of a statement on the
    application's file ``path``, is; None for an error that is no statement's refusal.

    Any SQLError there is told as the application's: syncpack's statements on a table
    compiled against its schema when it was attached (Writer.unwritable), so what SQLite
    refuses later is what the application changed since (a trigger naming a table it dropped,
    a key rebuilt under a collation), never the site store's state; told as the store's, its
    hint (restore from a backup) would be wrong and dangerous.  A row such an error refuses
    is a clash (Writer), as one refused by a constraint."""
    if not isinstance(e, apsw.SQLError):
        return None
    msg = str(e).removeprefix("SQLError: ")
    if msg.startswith(_APP_ONLY):
        err = ApplicationOnlyError(
            f"the application's database {path} uses what only the application defines "
            f"({msg})", hint="syncpack cannot read or write what needs it; detach the table "
                             "that uses it ('syncpack detach DB --table T')")
    else:
        err = ApplicationOnlyError(
            f"SQLite refused a statement of syncpack's on the application's database {path} "
            f"({msg})", hint="the site store is not at fault; the application's schema "
                             "likely is (a trigger, view or index naming a table or column "
                             "the file no longer has: 'sqlite3 FILE .schema' shows it); "
                             "correct it, or detach the table ('syncpack detach DB --table T')")
    err.needs = msg
    return err


def _told_as_the_files(method):
    """``method`` of apsw.Cursor with the file's failures raised as :func:`file_error`'s,
    and what the application's schema makes SQLite refuse as :func:`schema_refusal`'s."""
    def told(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except _FILE_ERRORS as e:
            raise file_error(self.connection.filename, e) from None
        except apsw.SQLError as e:
            raise schema_refusal(self.connection.filename, e) from None
    told.__name__ = method.__name__
    return told


class _AppCursor(apsw.Cursor):
    """A cursor on the application's file whose file failures are :func:`file_error`'s.
    Rows taken one by one are not wrapped (a Python call per row); the bulk readers here
    wrap their loops themselves."""

    execute = _told_as_the_files(apsw.Cursor.execute)
    executemany = _told_as_the_files(apsw.Cursor.executemany)
    fetchone = _told_as_the_files(apsw.Cursor.fetchone)
    fetchall = _told_as_the_files(apsw.Cursor.fetchall)


CHANGES = "_syncpack_changes"
APPLYING = "_syncpack_applying"
# A change row of table T whose tbl is MAYBE + T notes a key a REPLACE may have removed.
MAYBE = "\x01"
MAYBE_SQL = f"char({ord(MAYBE)})"
# Which site attached the file (one site replicates one file).
OWNER = "_syncpack_site"
TRIGGER_PREFIX = "_syncpack_"
# Key columns of the change table; more are added when a table with a longer key is attached.
MIN_KEY_COLS = 4


def q(name: str) -> str:
    """An SQL identifier, quoted."""
    return '"' + name.replace('"', '""') + '"'


@dataclass
class TableInfo:
    name: str
    create_sql: str
    columns: list[str]
    pk: list[str]
    affinity: dict[str, str]      # column -> INTEGER/REAL/TEXT/NUMERIC/BLOB
    virtual: bool
    uniques: list[list[str]]      # other UNIQUE indexes (plain columns only)
    parents: list[str]            # tables this one references by FOREIGN KEY
    # Foreign keys SQLite checks only at COMMIT (DEFERRABLE INITIALLY DEFERRED), which a
    # row's savepoint cannot catch: (child table, child columns, parent table, parent
    # columns) where this table is the child, and where it is the parent.
    deferred: list[tuple[str, list[str], str, list[str]]] = field(default_factory=list)
    deferred_children: list[tuple[str, list[str], str, list[str]]] = field(default_factory=list)
    # Columns the family dropped (docs/attach.md, "Schema changes"): values of them in older
    # records are left out; any other column the table lacks makes a record wait.
    dropped: frozenset = field(default_factory=frozenset)
    # UNIQUE indexes on expressions or with a WHERE clause: (their terms' SQL, the WHERE
    # clause's or None), read from their CREATE INDEX text
    other_uniques: list[tuple[list[str], str | None]] = field(default_factory=list)
    # Captured in the order of each key's last change, not by key: set by the capture for a
    # table whose own triggers delete rows of it (see :func:`_in_order`)
    by_change: bool = False
    # (column, collation) of key columns that compare by a collation other than BINARY
    # (:func:`key_collations`): attach refuses such a key, and a table rebuilt with one
    # after the attach must stop, not go on as if its key were unchanged
    key_collation: list[tuple[str, str]] = field(default_factory=list)


SQLITE_MAGIC = b"SQLite format 3\0"


def _magic(path: Path) -> bytes:
    """The file's first 16 bytes (an SQLite database's are SQLITE_MAGIC; an empty file is an
    empty database)."""
    with open(path, "rb") as f:
        return f.read(16)


def is_other_file(path: Path) -> bool:
    """Whether the file at ``path`` is readable and no SQLite database (another file put in
    the place of an attached one)."""
    try:
        magic = _magic(path)
    except OSError:
        return False
    return bool(magic) and magic != SQLITE_MAGIC


def open_app(path: Path, wait_ms: int = BUSY_TIMEOUT_MS) -> Connection:
    """Open the application's database for capture and apply; never creates the file.
    ``wait_ms``: how long a statement waits for another connection's lock."""
    try:
        magic = _magic(path)
    except FileNotFoundError:
        raise AttachError(f"{path}: no such file",
                          hint=f"give the path of the application's SQLite database (for a "
                               f"new, empty one, create the file first: touch {arg(path)})"
                          ) from None
    except IsADirectoryError:
        raise AttachError(f"{path} is a directory, not an SQLite database",
                          hint="give the path of the application's SQLite database file") from None
    except OSError as e:
        raise AttachError(f"{path} cannot be read ({e.strerror})") from None
    if magic and magic != SQLITE_MAGIC:
        raise AttachError(f"{path} is not an SQLite database",
                          hint="attach the application's SQLite database file")
    try:
        conn = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READWRITE)
        conn.cursor_factory = _AppCursor
        conn.set_busy_timeout(wait_ms)
        conn.execute("PRAGMA foreign_keys=ON")
        conn.execute("SELECT count(*) FROM sqlite_schema").fetchone()
    except ApplicationOnlyError as e:    # statements this plain fail for the file itself
        raise AttachError(f"{path} cannot be opened as an SQLite database ({e.needs})") \
            from None
    except AttachError:
        raise
    except (apsw.BusyError, apsw.LockedError) as e:
        raise file_error(str(path), e) from None
    except apsw.Error as e:
        raise AttachError(f"{path} cannot be opened as an SQLite database ({e})") from None
    return conn


def sort_beside(conn: Connection) -> None:
    """Let SQLite sort on helper threads for ``conn`` (a capture's reader process): grouping a
    large backlog's changes by key (a table ordered by change, or the keys gone) sorts them
    all before the first row, while the capturing process has nothing to do but wait (1M
    changes: 0.5 s to the first row, 0.3-0.4 s with two threads)."""
    conn.execute("PRAGMA threads=2")


_TRIGGER_WRITES = (apsw.SQLITE_INSERT, apsw.SQLITE_UPDATE)


def skip_trigger_writes(conn: Connection, replicated: Iterable[str]) -> None:
    """On ``conn`` (ours, writing peers' rows), the application's triggers do not INSERT into
    or UPDATE the ``replicated`` tables: what such a trigger wrote at the origin arrives as
    rows of its own, and what it would write here again (an audit row with a local number, a
    row's touched time) would never be captured, so the tables and the family would differ.
    Writes into tables not replicated (a counter, a full-text index) still happen; so do a
    trigger's DELETEs, which the authorizer cannot skip (docs/attach.md).

    SQLite's authorizer does it as statements compile, in this connection only: answering
    IGNORE for a trigger's INSERT compiles it to nothing, and for an UPDATE leaves its columns
    as they were.  The application's own connections never see it.  Setting it again expires
    the statements compiled before."""
    tables = frozenset(replicated)

    def authorize(action, table, _column, _db, trigger):
        if (trigger is not None and action in _TRIGGER_WRITES and table in tables
                and not trigger.startswith(TRIGGER_PREFIX)):
            return apsw.SQLITE_IGNORE
        return apsw.SQLITE_OK

    conn.authorizer = authorize if tables else None


@contextmanager
def write_txn(conn: Connection) -> Iterator[Connection]:
    """Our writes into the application's file: the write lock up front (we wait for the
    application's writers), the applying marker so our own writes are not captured, and the
    marker gone before COMMIT."""
    begin_write(conn)
    try:
        yield conn
    except BaseException:
        end_write(conn, False)
        raise
    end_write(conn, True)


def begin_write(conn: Connection) -> None:
    """:func:`write_txn` for a caller that decides at the end whether to commit
    (:func:`end_write`)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        if has_table(conn, APPLYING):
            conn.execute(f"INSERT INTO {APPLYING}(x) VALUES (1)")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def end_write(conn: Connection, commit: bool) -> None:
    if not commit:
        if not conn.get_autocommit():
            conn.execute("ROLLBACK")
        return
    try:
        if has_table(conn, APPLYING):
            conn.execute(f"DELETE FROM {APPLYING}")
        conn.execute("COMMIT")
    except apsw.ConstraintError as e:
        # A deferred foreign key that the rows written broke where no check of ours saw it:
        # everything written here is rolled back, and the store's side with it.
        if not conn.get_autocommit():
            conn.execute("ROLLBACK")
        raise AttachError(
            f"the application's database {conn.filename} refused the records written into it "
            f"at COMMIT ({e}); nothing was written",
            hint="a deferred foreign key of the application's schema is broken by records "
                 "from the peers; 'syncpack conflicts' lists what waits, and resolving or "
                 "deleting the row that refers to the missing one lets the rest through") \
            from None
    except BaseException:
        if not conn.get_autocommit():
            conn.execute("ROLLBACK")
        raise


def has_table(conn: Connection, name: str) -> bool:
    return conn.execute("SELECT 1 FROM sqlite_schema WHERE type='table' AND name=?",
                        (name,)).fetchone() is not None


def is_view(conn: Connection, name: str) -> bool:
    return conn.execute("SELECT 1 FROM sqlite_schema WHERE type='view' AND name=?",
                        (name,)).fetchone() is not None


def is_site_store(conn: Connection) -> bool:
    """Whether the file is a syncpack site's store (its changelog, versions and epoch
    matrix), not an application's database."""
    names = ("changelog", "versions", "superseded", "matrix", "links", "meta")
    return conn.execute(
        f"SELECT count(*) FROM sqlite_schema WHERE type='table' AND name IN "
        f"({', '.join('?' for _ in names)})", names).fetchone()[0] == len(names)


def user_tables(conn: Connection) -> tuple[list[str], list[str]]:
    """(the application's ordinary tables, its virtual tables and their shadow tables), each
    by name; SQLite's and syncpack's own left out."""
    plain, virtual = [], []
    for name, kind in conn.execute(
            "SELECT name, type FROM pragma_table_list WHERE schema = 'main' AND "
            "type IN ('table', 'virtual', 'shadow') AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' "
            "AND name NOT LIKE '\\_syncpack\\_%' ESCAPE '\\' ORDER BY name"):
        (plain if kind == "table" else virtual).append(name)
    return plain, virtual


def shadow_of(conn: Connection, table: str) -> str | None:
    """The virtual table whose shadow table ``table`` is (the module keeps its data there, and
    a row written by anyone else breaks its index), or None."""
    if conn.execute("SELECT 1 FROM pragma_table_list WHERE schema = 'main' AND name = ? "
                    "AND type = 'shadow'", (table,)).fetchone() is None:
        return None
    owners = [n for (n,) in conn.execute(
        "SELECT name FROM pragma_table_list WHERE schema = 'main' AND type = 'virtual'")
        if table.startswith(n + "_")]
    return max(owners, key=len, default="?")


def _affinity(decl: str) -> str:
    # SQLite's rules (datatype3.html §3.1), in their order.
    d = (decl or "").upper()
    if "INT" in d:
        return "INTEGER"
    if any(s in d for s in ("CHAR", "CLOB", "TEXT")):
        return "TEXT"
    if "BLOB" in d or not d:
        return "BLOB"
    if any(s in d for s in ("REAL", "FLOA", "DOUB")):
        return "REAL"
    return "NUMERIC"


def table_info(conn: Connection, name: str) -> TableInfo | None:
    row = conn.execute("SELECT sql FROM sqlite_schema WHERE type='table' AND name=?",
                       (name,)).fetchone()
    if row is None:
        return None
    sql = row[0] or ""
    virtual = sql.upper().lstrip().startswith("CREATE VIRTUAL")
    cols, pk, aff = [], [], {}
    if not virtual:
        xinfo = conn.execute(f"PRAGMA table_xinfo({q(name)})").fetchall()
        strict = conn.execute("SELECT strict FROM pragma_table_list WHERE schema = 'main' AND "
                              "name = ?", (name,)).fetchone()
        strict = bool(strict and strict[0])
        # cid, name, type, notnull, dflt, pk, hidden: generated columns cannot be written
        for _cid, col, decl, _nn, _d, pkn, hidden in xinfo:
            if hidden:
                continue
            cols.append(col)
            # In a STRICT table a column declared ANY keeps every value as given (elsewhere
            # ANY is a NUMERIC column, which turns '7' into 7).
            aff[col] = "BLOB" if strict and (decl or "").upper() == "ANY" else _affinity(decl)
        pk = [c for _i, c, _t, _n, _d, pkn, _h in sorted(xinfo, key=lambda r: r[5]) if pkn]
    uniques, other_uniques = [], []
    if not virtual:
        for _seq, iname, unique, origin, partial in conn.execute(
                f"PRAGMA index_list({q(name)})").fetchall():
            if not unique or origin == "pk":
                continue
            # seqno, cid, name, desc, collation, key
            xi = [r for r in conn.execute(f"PRAGMA index_xinfo({q(iname)})") if r[5]]
            icols = [r[2] for r in xi]
            if icols and all(c is not None for c in icols) and not partial:
                if all(r[4] == "BINARY" for r in xi):
                    uniques.append(icols)
                else:
                    # a clash under the index's collation ('n1' and 'N1' under NOCASE), which
                    # a comparison by the columns' own would not find
                    other_uniques.append(([f"{q(r[2])} COLLATE {q(r[4])}" for r in xi], None))
                continue
            isql = conn.execute("SELECT sql FROM sqlite_schema WHERE type='index' AND name=?",
                                (iname,)).fetchone()
            parts = index_terms(isql[0]) if isql and isql[0] else None
            if parts is not None:
                other_uniques.append(parts)
    parents = sorted({r[2] for r in conn.execute(f"PRAGMA foreign_key_list({q(name)})")}) \
        if not virtual else []
    info = TableInfo(name, sql, cols, pk, aff, virtual, uniques, parents,
                     other_uniques=other_uniques)
    if not virtual:
        info.key_collation = key_collations(conn, info) if pk else []
        info.deferred = _deferred_fks(conn, name, sql)
        for (other, osql) in conn.execute(
                "SELECT name, sql FROM sqlite_schema WHERE type='table' AND name != ?", (name,)):
            info.deferred_children += [fk for fk in _deferred_fks(conn, other, osql or "")
                                       if fk[2] == name]
    return info


def index_terms(sql: str) -> tuple[list[str], str | None] | None:
    """The terms (``lower(email) COLLATE NOCASE``, without ASC or DESC) and the WHERE clause
    of a CREATE INDEX statement, or None if its text is not read as one."""
    depth, start, quote, terms, end = 0, None, None, [], None
    i = 0
    while i < len(sql):
        ch = sql[i]
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"`":
            quote = ch
        elif ch == "[":
            quote = "]"
        elif ch == "(":
            depth += 1
            if depth == 1 and start is None:
                start = i + 1
        elif ch == ")":
            depth -= 1
            if depth == 0 and start is not None:
                terms.append(sql[start:i])
                end = i + 1
                break
        elif ch == "," and depth == 1 and start is not None:
            terms.append(sql[start:i])
            start = i + 1
        i += 1
    if end is None or not terms:
        return None
    terms = [re.sub(r"\s+(ASC|DESC)\s*$", "", t.strip(), flags=re.IGNORECASE) for t in terms]
    rest = sql[end:].strip()
    if not rest:
        return terms, None
    m = re.match(r"WHERE\s+(.+)$", rest, flags=re.IGNORECASE | re.DOTALL)
    return (terms, m.group(1).strip()) if m else None


def key_columns(conn: Connection, table: str) -> list[str]:
    """The primary key columns of ``table``, in key order."""
    return [r[1] for r in sorted(conn.execute(f"PRAGMA table_info({q(table)})"),
                                 key=lambda r: r[5]) if r[5]]


def unwritable(conn: Connection, t: TableInfo) -> str | None:
    """Why SQLite would refuse to compile the statements syncpack runs on ``t``, or None
    (:meth:`Writer.unwritable`)."""
    return Writer(conn, t).unwritable()


# A DEFAULT that is a constant: its value is the same at every site (CURRENT_TIME and
# function calls are not: those columns are left out of comparisons).
_CONSTANT_DEFAULT = re.compile(r"(?is)\s*(?:[-+]?\s*(?:0x[0-9a-f]+|(?:\d+(?:\.\d*)?|\.\d+)"
                               r"(?:e[-+]?\d+)?)|'(?:[^']|'')*'|x'[0-9a-f]*'|null|true|false)\s*")


def constant_defaults(conn: Connection, t: TableInfo) -> dict[str, object]:
    """Column -> the value a row gets when a write does not name the column, for the
    columns whose DEFAULT is a constant (or absent: NULL)."""
    out: dict[str, object] = {}
    for _cid, col, _decl, _nn, dflt, _pk, hidden in conn.execute(
            f"PRAGMA table_xinfo({q(t.name)})").fetchall():
        if hidden:
            continue
        if dflt is None:
            out[col] = None
        elif _CONSTANT_DEFAULT.fullmatch(dflt):
            out[col] = conn.execute(f"SELECT {dflt}").fetchone()[0]
    # as a row holds it, the column's affinity applied (REAL DEFAULT 0 is 0.0, INTEGER
    # DEFAULT '5' is 5): the bare constant made every row differ from its default, so an
    # edit of another column carried the default as a change, overriding a peer's edit
    typed = {c: v for c, v in out.items() if c in t.affinity}
    out.update(as_stored({c: t.affinity[c] for c in typed}, [typed])[0])
    return out


def computed_defaults(conn: Connection, table: str) -> dict[str, str]:
    """Column -> its DEFAULT, for the columns whose DEFAULT is computed at each write
    (``random()``, ``CURRENT_TIMESTAMP``): a record that leaves one out would get another
    value at each site.  Only CREATE TABLE makes such columns (ADD COLUMN refuses them)."""
    return {col: dflt for _cid, col, _decl, _nn, dflt, _pk, hidden in conn.execute(
        f"PRAGMA table_xinfo({q(table)})").fetchall()
        if not hidden and dflt is not None and not _CONSTANT_DEFAULT.fullmatch(dflt)}


def lacks_computed(record: dict, computed: dict[str, str]) -> str | None:
    """Why ``record`` cannot be written into a table whose columns ``computed`` have
    computed defaults, or None: it leaves one out."""
    for c, dflt in computed.items():
        if c not in record:
            return (f"the record leaves out column {c}, whose DEFAULT {dflt} each site would "
                    f"compute for itself")
    return None


def rowid_alias(conn: Connection, t: TableInfo) -> bool:
    """``t`` is keyed by its rowid (one column declared INTEGER PRIMARY KEY)."""
    return len(t.pk) == 1 and _keyed_by_rowid(conn, t.name, t.pk[0])


def _keyed_by_rowid(conn: Connection, table: str, column: str) -> bool:
    """``column`` of ``table`` is an alias of its rowid.  Declared INTEGER is not enough:
    ``INTEGER PRIMARY KEY DESC`` written beside the column is an ordinary key (SQLite's
    documented quirk) and may hold NULL or text, as may the key of a WITHOUT ROWID table;
    SQLite gives either an index of its own, which an alias never has."""
    if (conn.column_metadata("main", table, column)[0] or "").upper() != "INTEGER":
        return False
    return not any(r[3] == "pk" for r in conn.execute(f"PRAGMA index_list({q(table)})"))


def key_collations(conn: Connection, t: TableInfo) -> list[tuple[str, str]]:
    """(column, collation) of each key column of ``t`` whose text compares by a collation
    other than BINARY: its own, or the one its PRIMARY KEY clause gives it.  A rowid alias
    (INTEGER PRIMARY KEY) holds integers only, which no collation touches."""
    if rowid_alias(conn, t):
        return []
    out = {}
    for c in t.pk:
        coll = conn.column_metadata("main", t.name, c)[1]
        if coll and coll.upper() != "BINARY":
            out[c] = coll
    for _seq, iname, _unique, origin, _partial in conn.execute(
            f"PRAGMA index_list({q(t.name)})").fetchall():
        if origin == "pk":
            for r in conn.execute(f"PRAGMA index_xinfo({q(iname)})").fetchall():
                if r[5] and r[2] in t.pk and r[4] and r[4].upper() != "BINARY":
                    out.setdefault(r[2], r[4])
    return sorted(out.items(), key=lambda kv: t.pk.index(kv[0]))


def nullable_key(conn: Connection, table: str) -> list[str]:
    """The key columns of ``table`` that may hold NULL: SQLite lets a PRIMARY KEY column of a
    rowid table hold NULL unless NOT NULL is declared (a rowid alias never does, nor a key of
    a WITHOUT ROWID table)."""
    key = sorted((r for r in conn.execute(f"PRAGMA table_xinfo({q(table)})") if r[5]),
                 key=lambda r: r[5])
    if len(key) == 1 and _keyed_by_rowid(conn, table, key[0][1]):
        return []
    return [r[1] for r in key if not r[3]]


def null_key_rows(conn: Connection, table: str, columns: list[str]) -> int:
    """Rows of ``table`` with NULL in any of ``columns``."""
    if not columns:
        return 0
    where = " OR ".join(f"{q(c)} IS NULL" for c in columns)
    return conn.execute(f"SELECT count(*) FROM {q(table)} WHERE {where}").fetchone()[0]


_DEFERRED = re.compile(r"DEFERRABLE\s+INITIALLY\s+DEFERRED", re.I)


def _deferred_fks(conn: Connection, table: str, sql: str
                  ) -> list[tuple[str, list[str], str, list[str]]]:
    """The foreign keys of ``table`` when any of them is deferred (all of them then: checking
    an immediate one again is harmless, and telling them apart would need an SQL parser)."""
    if not _DEFERRED.search(sql):
        return []
    fks: dict[int, tuple[str, list[str], list[str | None]]] = {}
    for r in conn.execute(f"PRAGMA foreign_key_list({q(table)})"):
        fid, _seq, parent, frm, to = r[0], r[1], r[2], r[3], r[4]
        fks.setdefault(fid, (parent, [], []))
        fks[fid][1].append(frm)
        fks[fid][2].append(to)
    out = []
    for parent, frm, to in fks.values():
        if any(c is None for c in to):     # the parent's primary key
            to = key_columns(conn, parent)
        out.append((table, frm, parent, list(to)))
    return out


def _violations_sql(fk: tuple[str, list[str], str, list[str]]) -> str:
    """WHERE text true for a row of the child table that breaks ``fk``."""
    child, frm, parent, to = fk
    present = " AND ".join(f"c.{q(f)} IS NOT NULL" for f in frm)
    match = " AND ".join(f"p.{q(t)} = c.{q(f)}" for f, t in zip(frm, to))
    return f"({present} AND NOT EXISTS (SELECT 1 FROM {q(parent)} p WHERE {match}))"


_DECLARED = {"INTEGER": "INTEGER", "REAL": "REAL", "TEXT": "TEXT", "NUMERIC": "NUMERIC",
             "BLOB": ""}


def as_stored(affinity: dict[str, str], rows: list[dict]) -> list[dict]:
    """``rows`` (column -> value; columns of ``affinity`` only, values SQLite can bind) as
    columns of those type affinities would store them: SQLite's own conversions (a TEXT '7'
    in an INTEGER column is 7, an integer in a TEXT column is text), made in a private
    in-memory table rather than told again here."""
    mem = apsw.Connection(":memory:")
    try:
        cols = list(affinity)
        mem.execute(f"CREATE TABLE t({', '.join(f'{q(c)} {_DECLARED[affinity[c]]}' for c in cols)})")
        out = []
        for row in rows:
            names = [c for c in cols if c in row]
            if not names:
                out.append({})
                continue
            got = mem.execute(
                f"INSERT INTO t({', '.join(map(q, names))}) VALUES "
                f"({', '.join('?' for _ in names)}) RETURNING {', '.join(map(q, names))}",
                [row[c] for c in names]).fetchone()
            out.append(dict(zip(names, got)))
        return out
    finally:
        mem.close()


class Declared(NamedTuple):
    """What a table definition says of how the table stores a row."""
    affinity: dict[str, str]        # column -> type affinity
    rowid_key: str | None           # the key column that is an alias of the rowid (integers)
    generated: frozenset[str]       # columns SQLite computes, which a row never gives
    computed: dict[str, str]        # column -> its DEFAULT computed at each write


def declared(name: str, sql: str) -> Declared | None:
    """How the table that ``sql`` (a CREATE TABLE text, maybe a peer's) would make stores a
    row, read by making it in a private in-memory database; None if it makes no such table."""
    mem = apsw.Connection(":memory:")
    try:
        # held to what a member's word may do, but read only: a table this database would
        # refuse to create (a generated column) still says how it stores values
        _run_definition(mem, name, sql)
        t = table_info(mem, name)
        if t is None:
            return None
        generated = frozenset(r[1] for r in mem.execute(f"PRAGMA table_xinfo({q(name)})")
                              if r[6])
        return Declared(dict(t.affinity), t.pk[0] if rowid_alias(mem, t) else None, generated,
                        computed_defaults(mem, name))
    except (AttachError, apsw.Error):
        return None
    finally:
        mem.close()


# A peer's table definition, or one added column's, longer than this is refused unread (the
# widest table an attached one may be, 900 columns with long names, is a few dozen KB).
MAX_DEFINITION_BYTES = 256 * 1024
# What a peer's definition may compute at each write here (in a CHECK, a DEFAULT), the
# application's writes too: at most PEER_CALLS calls of SQLite's functions whose cost is
# linear in their arguments and whose result is no larger (or small), at most
# PEER_CONCATENATIONS `||`, and no generated column.  Each function left out made a few
# bytes of definition cost every write: a huge value (zeroblob, randomblob, printf, replace;
# hex, quote and strftime by nesting; generated columns doubling each other), a slow one
# (ltrim, trim and instr cost the product of their arguments' lengths; LIKE and GLOB
# backtrack), or a write SQLite refuses (a value past its size limit).  A table or column
# beyond that is created with the application's own schema, then attached.
PEER_FUNCTIONS = frozenset("""
    abs char coalesce current_date current_time current_timestamp date datetime ifnull iif
    julianday length likelihood likely lower max min nullif octet_length random round sign
    substr substring time typeof unicode unixepoch unlikely upper""".split())
PEER_CALLS = 8
PEER_CONCATENATIONS = 4
# ... and at most this many terms in its expressions (sqltext.expression_terms): a CHECK of
# 30,000 values in an IN list, 240 KB, made each INSERT into the table 1,000 times slower,
# the application's own (SQLite builds the list anew for each row)
PEER_TERMS = 256
MAX_DEFAULT_CHARS = 1024
# Tables no peer's definition may refer to: SQLite's and syncpack's own (a foreign key to
# the change table made syncpack's own clean-up of it fail at every command).
_NEVER_REFERENCED = ("sqlite_", TRIGGER_PREFIX)
# Said with every refusal of a peer's definition.
OWN_SCHEMA_HINT = ("create the table (or add the column) with the application's own schema "
                   "at this site, then attach it: the family's records then fill it")


@contextmanager
def _authorizing(conn: Connection, authorize: Callable) -> Iterator[None]:
    """``authorize`` as ``conn``'s authorizer while the block compiles statements, the one
    before (skip_trigger_writes's) put back after."""
    before = conn.authorizer
    conn.authorizer = authorize
    try:
        yield
    finally:
        conn.authorizer = before


@contextmanager
def _peers_text(conn: Connection) -> Iterator[list[str]]:
    """While a peer's schema text compiles on ``conn``, SQLite's authorizer refuses what no
    table definition of a peer may hold: a query (``CREATE TABLE ... AS SELECT`` over an
    endless recursive one held the application's write lock for good), a function outside
    :data:`PEER_FUNCTIONS`, more than :data:`PEER_CALLS` calls.  Yields the list of what was
    refused, in words."""
    refused: list[str] = []
    calls = [0]

    def authorize(action, _a, b, _db, _trigger):
        if action in (apsw.SQLITE_SELECT, apsw.SQLITE_RECURSIVE):
            refused.append("a query (CREATE TABLE ... AS SELECT)")
            return apsw.SQLITE_DENY
        if action == apsw.SQLITE_FUNCTION:
            calls[0] += 1
            if (b or "").lower() not in PEER_FUNCTIONS:
                refused.append(f"the function {b}()")
                return apsw.SQLITE_DENY
            if calls[0] > PEER_CALLS:
                refused.append(f"more than {PEER_CALLS} function calls")
                return apsw.SQLITE_DENY
        if action in (apsw.SQLITE_ATTACH, apsw.SQLITE_DETACH, apsw.SQLITE_PRAGMA):
            refused.append("a statement that is no table definition")
            return apsw.SQLITE_DENY
        return apsw.SQLITE_OK

    with _authorizing(conn, authorize):
        yield refused


def _too_long(sql: str) -> str | None:
    """Why a peer's definition is refused unread: its length, or its concatenations."""
    if len(sql) > MAX_DEFINITION_BYTES:
        return (f"it is {len(sql):,} characters long, more than the {MAX_DEFINITION_BYTES:,} "
                f"a definition may have")
    n = sqltext.concatenations(sql)
    if n > PEER_CONCATENATIONS:
        return f"it holds {n} concatenations (||), more than the {PEER_CONCATENATIONS} allowed"
    n = sqltext.expression_terms(sql)
    if n > PEER_TERMS:
        return (f"its expressions hold {n:,} terms (values of IN lists, OR, AND, WHEN), more "
                f"than the {PEER_TERMS} allowed")
    return None


def _computed(conn: Connection, table: str) -> str | None:
    """Why ``table`` (made from a peer's text) holds what SQLite would compute into each row:
    a generated column, or a DEFAULT longer than :data:`MAX_DEFAULT_CHARS`."""
    for _cid, col, _decl, _nn, dflt, _pk, hidden in conn.execute(
            f"PRAGMA table_xinfo({q(table)})").fetchall():
        if hidden in (2, 3):
            return f"column {col} is generated, which a definition from the peers may not be"
        if dflt is not None and len(dflt) > MAX_DEFAULT_CHARS:
            return (f"the DEFAULT of column {col} is longer than {MAX_DEFAULT_CHARS:,} "
                    f"characters")
    return None


def create_table(conn: Connection, name: str, sql: str, *,
                 replicated: Collection[str] | None) -> None:
    """Create a table from the definition that travelled with its records: one CREATE TABLE
    statement of that name and nothing else (the text comes from a peer), computing little at
    a write (:data:`PEER_FUNCTIONS`), whose foreign keys refer to no table of SQLite's or
    syncpack's, and, unless ``replicated`` is None (an administrator's attach, a private
    in-memory copy), only to tables in ``replicated``."""
    _run_definition(conn, name, sql)
    why = _foreign_keys_unusable(conn, name) or _too_wide(conn, name) or \
        _references_ours(conn, name) or _computed(conn, name) or \
        (_refers_elsewhere(conn, name, replicated) if replicated is not None else None)
    if why:
        raise AttachError(f"cannot create table {name!r} from the peers' definition: {why}",
                          hint=OWN_SCHEMA_HINT)


def definition_parents(name: str, sql: str) -> list[str]:
    """The tables that the table ``sql`` (a peer's CREATE TABLE text) would reference by
    FOREIGN KEY, read by making it in a private in-memory database (none if it cannot be
    made): tables created together are created parents first."""
    mem = apsw.Connection(":memory:")
    try:
        _run_definition(mem, name, sql)
        return sorted({r[2] for r in mem.execute(f"PRAGMA foreign_key_list({q(name)})")})
    except (AttachError, apsw.Error):
        return []
    finally:
        mem.close()


def _run_definition(conn: Connection, name: str, sql: str) -> None:
    """Runs a peer's definition of table ``name``, held to what a member's word may do."""
    seen: list[str] = []

    def only_one(_cursor, stmt, _bindings):
        seen.append(stmt)
        return len(seen) == 1 and stmt.lstrip().upper().startswith("CREATE TABLE")

    too_long = _too_long(sql)
    if too_long:
        raise AttachError(f"cannot create table {name!r} from the peers' definition: "
                          f"{too_long}", hint=OWN_SCHEMA_HINT)
    cur = conn.cursor()
    cur.exec_trace = only_one
    with _peers_text(conn) as refused:
        try:
            cur.execute(sql)
        except apsw.ExecTraceAbort:
            raise AttachError(f"the definition of table {name!r} from the peers is not one "
                              f"CREATE TABLE statement; nothing was created",
                              hint=OWN_SCHEMA_HINT) from None
        except (apsw.Error, ApplicationOnlyError, ValueError) as e:     # ValueError: a NUL
            why = f"it holds {refused[0]}" if refused else getattr(e, "needs", "") or e
            raise AttachError(f"cannot create table {name!r} from the peers' definition "
                              f"({why})", hint=OWN_SCHEMA_HINT) from None
    if not has_table(conn, name):
        raise AttachError(f"the peers' definition of table {name!r} creates another table",
                          hint=OWN_SCHEMA_HINT)


def _references_ours(conn: Connection, table: str) -> str | None:
    """Why a foreign key of ``table`` (made from a peer's text) may not stand: it refers to a
    table of SQLite's or syncpack's."""
    for row in conn.execute(f"PRAGMA foreign_key_list({q(table)})").fetchall():
        if sqltext.fold(row[2]).startswith(_NEVER_REFERENCED):
            return f"a foreign key refers to table {row[2]!r}, which is not the application's"
    return None


def _refers_elsewhere(conn: Connection, table: str, replicated: Collection[str]) -> str | None:
    """Why a foreign key of ``table`` (made from a peer's text) may not stand here: it refers
    to a table that is not replicated here (nor ``table`` itself).  Such a table's rows are
    each site's own, and a peer's row referring to one of them would keep the application
    from deleting or changing it."""
    ok = {sqltext.fold(n) for n in replicated} | {sqltext.fold(table)}
    for row in conn.execute(f"PRAGMA foreign_key_list({q(table)})").fetchall():
        if sqltext.fold(row[2]) not in ok:
            return (f"a foreign key refers to table {row[2]!r}, which is not attached here (its "
                    f"rows are this site's own, and the peers' rows referring to them would "
                    f"keep the application from changing them; attach it too)")
    return None


# Columns an attached table may have: a capture reads each column's name and value side by
# side, and SQLite returns at most 2,000 columns a row.
MAX_COLUMNS = 900


def _too_wide(conn: Connection, table: str) -> str | None:
    n = len(conn.execute(f"PRAGMA table_info({q(table)})").fetchall())
    if n > MAX_COLUMNS:
        return f"it has {n} columns, more than the {MAX_COLUMNS} an attached table may have"
    return None


def _foreign_keys_unusable(conn: Connection, table: str) -> str | None:
    """Why ``table``'s foreign keys would make writes fail that do not involve syncpack (a
    parent table that does not exist, parent columns that are no key: every INSERT into the
    child, and every change of the parent, fails once foreign keys are on), or would break
    with the rows it holds; None when they are sound.  A peer's definition is the peers' word."""
    for row in conn.execute(f"PRAGMA foreign_key_list({q(table)})").fetchall():
        if not has_table(conn, row[2]):
            return f"a foreign key refers to table {row[2]!r}, which does not exist here"
    try:
        broken = conn.execute(f"PRAGMA foreign_key_check({q(table)})").fetchone()
    except apsw.SQLError as e:
        return f"its foreign keys are unusable ({e})"
    except ApplicationOnlyError as e:      # the application's file: its cursors tell it so
        return f"its foreign keys are unusable ({e.needs})"
    if broken is not None:
        return "rows of the table would break its foreign keys"
    return None


# --- capture tables and triggers ----------------------------------------------------------------

def key_cols(conn: Connection) -> int:
    return _key_columns(conn, CHANGES)


def marker_key_cols(conn: Connection) -> int:
    """Key columns of the applying marker (none in a file an older release attached)."""
    return _key_columns(conn, APPLYING)


def _key_columns(conn: Connection, table: str) -> int:
    if not has_table(conn, table):
        return 0
    return sum(1 for r in conn.execute(f"PRAGMA table_info({table})") if r[1].startswith("k"))


def install_capture(conn: Connection, t: TableInfo, floor: int = 0) -> None:
    """The change table, the applying marker and the triggers of table ``t``; the caller
    holds the write lock.  New change numbers are above ``floor`` (the store's captured
    number: a change table made again, or one a restored file holds, numbers from where it
    is, and a change numbered at or below what the store captured would never be read)."""
    n = max(MIN_KEY_COLS, len(t.pk))
    if not has_table(conn, CHANGES):
        ks = ", ".join(f"k{i}" for i in range(n))
        # A plain rowid (AUTOINCREMENT would cost every write an update of sqlite_sequence):
        # new numbers follow the largest present, and forget_changes always keeps the largest,
        # so a number is never reused and "seq > captured_seq" never skips a new change.
        conn.execute(f"CREATE TABLE {CHANGES}(seq INTEGER PRIMARY KEY, tbl TEXT NOT NULL, {ks})")
    else:
        for i in range(key_cols(conn), n):
            conn.execute(f"ALTER TABLE {CHANGES} ADD COLUMN k{i}")
    if max_seq(conn) < floor:
        # a row of no table, kept as the largest until a change follows it
        conn.execute(f"INSERT INTO {CHANGES}(seq, tbl) VALUES (?, '')", (floor,))
    if not has_table(conn, APPLYING):
        conn.execute(f"CREATE TABLE {APPLYING}(x)")
        # We are inside our own write transaction (write_txn found no marker table to mark).
        conn.execute(f"INSERT INTO {APPLYING}(x) VALUES (1)")
    for i in range(marker_key_cols(conn), n):
        conn.execute(f"ALTER TABLE {APPLYING} ADD COLUMN k{i}")
    drop_capture(conn, t.name)
    tn = t.name.replace("'", "''")
    new = ", ".join(f"NEW.{q(c)}" for c in t.pk)
    old = ", ".join(f"OLD.{q(c)}" for c in t.pk)
    moved = " OR ".join(f"OLD.{q(c)} IS NOT NEW.{q(c)}" for c in t.pk)
    when, ins, name = _trigger_parts(t)
    tq = q(t.name)
    conn.execute(f"CREATE TRIGGER {name('ins')} AFTER INSERT ON {tq} {when('NEW')} "
                 f"BEGIN {ins} VALUES ('{tn}', {new}); END")
    # syncpack's own update of a row never moves its key: its NEW key is the one written
    conn.execute(f"CREATE TRIGGER {name('upd')} AFTER UPDATE ON {tq} {when('NEW')} "
                 f"BEGIN {ins} VALUES ('{tn}', {new}); "
                 f"{ins} SELECT '{tn}', {old} WHERE {moved}; END")
    conn.execute(f"CREATE TRIGGER {name('del')} AFTER DELETE ON {tq} {when('OLD')} "
                 f"BEGIN {ins} VALUES ('{tn}', {old}); END")
    if t.uniques or t.other_uniques or rowid_names(conn, t):
        _install_replace_triggers(conn, t, when, ins, name)


def rowid_names(conn: Connection, t: TableInfo) -> list[str]:
    """The names under which a write may set the rowid of ``t`` when the rowid is a unique
    key of its own: a rowid table whose primary key is not its alias.  A REPLACE that sets
    it (``INSERT OR REPLACE INTO t(rowid, ...)``, ``UPDATE OR REPLACE t SET rowid = ...``)
    removes the row holding that rowid, whatever its key, without a DELETE trigger.  A
    column of the same name hides the rowid behind it; a WITHOUT ROWID table has none, and
    an alias's clash is one on the key itself, which the key's own triggers see."""
    if t.virtual or rowid_alias(conn, t):
        return []
    wr = conn.execute("SELECT wr FROM pragma_table_list WHERE schema = 'main' AND name = ?",
                      (t.name,)).fetchone()
    if wr is None or wr[0]:
        return []
    taken = {c.lower() for c in _all_columns(conn, t)}
    return [n for n in ("rowid", "oid", "_rowid_") if n not in taken]


def _install_replace_triggers(conn: Connection, t: TableInfo, when, ins: str,
                              name, expect: list | None = None) -> None:
    """INSERT OR REPLACE and UPDATE OR REPLACE remove the rows they clash with on another
    UNIQUE index without firing their DELETE trigger: note the keys of such rows before the
    write.  (Nothing is kept if the write fails: the statement's changes, these included,
    are undone; a row noted but still there was not removed, and is no change.)"""
    tn, tq = t.name.replace("'", "''"), q(t.name)
    # Noted as *maybe removed*: the trigger fires before SQLite resolves the write, which
    # may then do nothing (INSERT OR IGNORE, ON CONFLICT DO NOTHING); such a key counts
    # as changed only if its row is gone (see _changed_keys).
    keys = (f"{ins} SELECT {MAYBE_SQL} || '{tn}', " + ", ".join(q(c) for c in t.pk)
            + f" FROM {tq} WHERE ")
    plain = [" AND ".join(f"{q(c)} = NEW.{q(c)}" for c in u) for u in t.uniques]
    # The rowid is a unique key too.  In a BEFORE INSERT trigger NEW.rowid of a row whose
    # rowid SQLite is to choose is -1, which no row holds unless one was given it: at worst
    # a row noted as maybe removed that is still there, which is no change.
    rowids = rowid_names(conn, t)
    if rowids:
        plain.append(f"{rowids[0]} = NEW.{rowids[0]}")
    # Where the rowid is the only such key (a table keyed by text, the commonest), an INSERT
    # that leaves the rowid to SQLite cannot clash on it, and the look-up a firing makes cost
    # the application's bulk inserts a quarter more: the INSERT trigger fires only for a rowid
    # given (one given as -1 would go unnoticed here; fsck would see its row differ).
    only_rowid = bool(rowids) and not t.uniques and not t.other_uniques
    given = f" AND NEW.{rowids[0]} <> -1" if only_rowid else ""
    # An index on expressions, or with a WHERE clause: its terms, evaluated on the new row by
    # a subquery where only the new row's columns are named, against the table's rows (the
    # same terms over the table, which the index serves).  The subquery's columns take the
    # table's affinities from its first, empty, arm: a bare NEW.c has none, so a term such
    # as "active = '1'" on an INTEGER column was false for the new row and true in the index.
    columns = _all_columns(conn, t)
    # Only the columns the terms may name: a trigger naming a column keeps SQLite from
    # dropping it, and the application's DROP COLUMN of one no index uses would fail
    used = [c for c in columns
            if any(_names_column(c, " ".join(terms) + " " + (where or ""))
                   for terms, where in t.other_uniques)] or columns
    names = ", ".join(q(c) for c in used)
    row = (f"(SELECT {names} FROM {tq} WHERE 0 UNION ALL SELECT "
           + ", ".join(f"NEW.{q(c)}" for c in used) + ")")
    other = []
    for terms, where in t.other_uniques:
        lhs = terms[0] if len(terms) == 1 else "(" + ", ".join(terms) + ")"
        cond = f"{lhs} = (SELECT {', '.join(terms)} FROM {row})"
        if where:
            cond += f" AND ({where}) AND (SELECT ({where}) FROM {row})"
        other.append(cond)
    # an update's own row is not one it removes
    not_old = ("(" + ", ".join(q(c) for c in t.pk) + ") IS NOT (" +
               ", ".join(f"OLD.{q(c)}" for c in t.pk) + ")")

    # An update that sets none of the indexes' columns removes nothing: the trigger fires
    # only for those (each firing is an index lookup, 4 us an update measured)
    named = [c for c in columns
             if any(c in u for u in t.uniques) or any(
                 _names_column(c, " ".join(terms) + " " + (where or ""))
                 for terms, where in t.other_uniques)]
    # UPDATE OF matches the names the UPDATE sets as spelt: each of the rowid's
    named += rowids
    # A generated column is never set by name: an update of what it is computed from changes
    # it, so a table whose indexes name one fires for every update.
    generated = _generated_columns(conn, t)
    update_of = ("UPDATE OF " + ", ".join(q(c) for c in named)
                 if named and not generated.intersection(named) else "UPDATE")

    def statements(conds: list[str]) -> list[str]:
        out = []
        for kind, event, extra, only in (("rep", "INSERT", "", given),
                                         ("repu", update_of, f" AND {not_old}", "")):
            body = " ".join(f"{keys}{c}{extra};" for c in conds)
            out.append(f"CREATE TRIGGER {name(kind)} BEFORE {event} ON {tq} {when('NEW')}"
                       f"{only} BEGIN {body} END")
        return out

    if expect is not None:
        expect.append(statements(plain + other))
        expect.append(statements(plain) if plain else [])
        return
    for sql in statements(plain + other):
        conn.execute(sql)
    if other and not _compiles_writes(conn, t):
        # never an application's write that fails for our triggers: without those terms
        for kind in ("rep", "repu"):
            conn.execute(f"DROP TRIGGER {name(kind)}")
        for sql in statements(plain) if plain else []:
            conn.execute(sql)


def _names_column(column: str, sql: str) -> bool:
    """``sql`` may name ``column`` (a word of it, bare or quoted; more is harmless)."""
    c = re.escape(column)
    return re.search(rf'(?<![\w$]){c}(?![\w$])|"{c}"|`{c}`|\[{c}\]', sql,
                     flags=re.IGNORECASE) is not None


def _generated_columns(conn: Connection, t: TableInfo) -> set[str]:
    return {r[1] for r in conn.execute(f"PRAGMA table_xinfo({q(t.name)})").fetchall()
            if r[6] in (2, 3)}


def _all_columns(conn: Connection, t: TableInfo) -> list[str]:
    """Every column of ``t`` a trigger's NEW names, generated ones included."""
    return [r[1] for r in conn.execute(f"PRAGMA table_xinfo({q(t.name)})").fetchall()
            if r[6] != 1]


def _compile_error(conn: Connection, statements: Iterable[tuple[str, int]]) -> str | None:
    """SQLite's reason for refusing to compile the first of ``statements`` (SQL, number of
    parameters) that it refuses, with the triggers, indexes and checks each sets off, or
    None.  Compiled, never run: EXPLAIN, whose rows are never read (a program's text column
    holds a literal's bytes as they are: x'ff' in a DEFAULT, a CHECK or a trigger is no
    UTF-8, and reading it failed)."""
    for sql, n in statements:
        try:
            apsw.Cursor(conn).execute("EXPLAIN " + sql, [None] * n).close()
        except apsw.SQLError as e:
            return str(e).removeprefix("SQLError: ")
    return None


def _compiles_writes(conn: Connection, t: TableInfo) -> bool:
    """An INSERT into ``t`` and an UPDATE of it, with their triggers, compile."""
    cols = ", ".join(q(c) for c in t.columns)
    marks = ", ".join("?" for _ in t.columns)
    sets = ", ".join(f"{q(c)} = ?" for c in t.columns)
    n = len(t.columns)
    return _compile_error(conn, [(f"INSERT INTO {q(t.name)}({cols}) VALUES ({marks})", n),
                                 (f"UPDATE {q(t.name)} SET {sets}", n)]) is None


def capture_current(conn: Connection, t: TableInfo) -> bool:
    """Whether ``t``'s capture triggers, where there, are those this release installs (an
    older one's were quiet whatever table syncpack wrote), and the REPLACE ones those its
    indexes call for.  Missing ones are :func:`has_capture`'s: put back, they need the
    whole table compared."""
    ins = conn.execute("SELECT sql FROM sqlite_schema WHERE type='trigger' AND name=?",
                       (f"{TRIGGER_PREFIX}{t.name}_ins",)).fetchone()
    return (ins is None or _trigger_parts(t)[0]("NEW") in ins[0]) and \
        replace_triggers_current(conn, t)


def replace_triggers_current(conn: Connection, t: TableInfo) -> bool:
    """Whether the triggers that note rows a REPLACE removes are those ``t``'s UNIQUE indexes
    call for now.  Each names the columns of an index: after the application drops one, the
    trigger would still name its columns, and SQLite would refuse the application's next
    ``DROP COLUMN`` of them (an error it gets only because of syncpack)."""
    held = dict(conn.execute(
        "SELECT name, sql FROM sqlite_schema WHERE type='trigger' AND tbl_name=? AND name IN "
        "(?, ?)", (t.name, f"{TRIGGER_PREFIX}{t.name}_rep", f"{TRIGGER_PREFIX}{t.name}_repu")))
    if not (t.uniques or t.other_uniques or rowid_names(conn, t)):
        return not held
    expect: list[list[str]] = []
    _install_replace_triggers(conn, t, *_trigger_parts(t), expect)
    return sorted(held.values()) in [sorted(e) for e in expect]


def _trigger_parts(t: TableInfo) -> tuple[Callable[[str], str], str, Callable[[str], str]]:
    """(the WHEN clause of a trigger whose row is NEW or OLD, the INSERT into the change
    table, kind -> trigger name) of ``t``'s capture triggers.

    They are quiet while syncpack writes into ``t``: the applying marker is 1 (all tables),
    or names ``t`` with no key (the whole table), or names ``t`` and the key of the row
    being written (Writer marks each row so for a table whose own triggers delete rows of
    it).  They are not quiet while syncpack writes into another table, or another row: a
    row that a trigger of the application deletes then (a cascade by trigger, the children
    of a deleted node) is a change of this site's, captured like the application's own, as
    a foreign key's cascade is."""
    tn = t.name.replace("'", "''")

    def when(row: str) -> str:
        # row = k: the table's collation and affinity compare (the row's column on the left)
        same = " AND ".join(f"{row}.{q(c)} = k{i}" for i, c in enumerate(t.pk))
        return (f"WHEN NOT EXISTS (SELECT 1 FROM {APPLYING} WHERE x = 1 OR x = '{tn}' AND "
                f"(k0 IS NULL OR {same}))")
    ins = f"INSERT INTO {CHANGES}(tbl, {', '.join(f'k{i}' for i in range(len(t.pk)))})"
    return when, ins, lambda kind: q(f"{TRIGGER_PREFIX}{t.name}_{kind}")


def drop_capture(conn: Connection, table: str) -> None:
    for kind in ("ins", "upd", "del", "rep", "repu"):
        conn.execute(f"DROP TRIGGER IF EXISTS {q(TRIGGER_PREFIX + table + '_' + kind)}")


@contextmanager
def capture_paused(conn: Connection, t: TableInfo) -> Iterator[None]:
    """Without ``t``'s triggers for a bulk write of ours: each would still run per row only to
    find the applying marker (about half the cost of an upsert).  Dropped and re-created inside
    our own write transaction, so no other connection ever sees the table without them, and a
    failure or crash rolls the drop back with everything else."""
    drop_capture(conn, t.name)
    yield
    install_capture(conn, t)


def has_capture(conn: Connection, table: str) -> bool:
    """Whether the triggers of ``table`` and the tables they write are all there (an
    application or an administrator may drop any of them)."""
    if not (has_table(conn, CHANGES) and has_table(conn, APPLYING)):
        return False
    names = {f"{TRIGGER_PREFIX}{table}_{k}" for k in ("ins", "upd", "del")}
    got = {r[0] for r in conn.execute(
        "SELECT name FROM sqlite_schema WHERE type='trigger' AND tbl_name=?", (table,))}
    return names <= got


def drop_capture_tables(conn: Connection) -> None:
    conn.execute(f"DROP TABLE IF EXISTS {CHANGES}")
    conn.execute(f"DROP TABLE IF EXISTS {APPLYING}")
    conn.execute(f"DROP TABLE IF EXISTS {OWNER}")


def owner(conn: Connection) -> tuple[bytes, str] | None:
    """(site id, site directory) of the site that attached this file, if it says."""
    if not has_table(conn, OWNER):
        return None
    row = conn.execute(f"SELECT site_id, site_dir FROM {OWNER}").fetchone()
    return (row[0], row[1]) if row else None


def has_syncpack_tables(conn: Connection) -> bool:
    """Whether the file holds any of the tables or capture triggers an attach puts in it
    (an administrator who dropped the tables left the triggers, which then refuse the
    application's writes until syncpack puts the tables back)."""
    return conn.execute(
        "SELECT 1 FROM sqlite_schema WHERE type='table' AND name IN (?, ?, ?) OR "
        "type='trigger' AND substr(name, 1, ?) = ? LIMIT 1",
        (OWNER, CHANGES, APPLYING, len(TRIGGER_PREFIX), TRIGGER_PREFIX)).fetchone() is not None


def set_owner(conn: Connection, site_id: bytes, site_dir: str) -> None:
    """Note the site that attached this file (a second site's capture would take the
    changes the first has not read yet); the caller holds the write lock."""
    conn.execute(f"CREATE TABLE IF NOT EXISTS {OWNER}(site_id BLOB, site_dir TEXT)")
    conn.execute(f"DELETE FROM {OWNER}")
    conn.execute(f"INSERT INTO {OWNER} VALUES (?, ?)", (site_id, site_dir))


def text_encoding(conn: Connection) -> str:
    """The Python codec of the file's TEXT bytes, as SQLite's hex() and CAST AS BLOB give
    them: a database may be UTF-16 (PRAGMA encoding), and its keys' hex is then UTF-16."""
    enc = conn.execute("PRAGMA encoding").fetchone()[0].lower()
    return {"utf-16le": "utf-16-le", "utf-16be": "utf-16-be"}.get(enc, "utf-8")


def schema_version(conn: Connection) -> int:
    """A number that changes with every change of the file's schema."""
    return conn.execute("PRAGMA schema_version").fetchone()[0]


def went_back(conn: Connection, captured: int, tail: str | None = None) -> bool:
    """Whether the file went back behind ``captured``, what the store captured of it: it was
    restored from an older copy (or its change table emptied).  Its change numbers are then
    below ``captured``, since only syncpack removes change rows and it always keeps the
    largest; or, once the application has written past that number again, the change row
    numbered ``captured`` is another change than the one captured under it (``tail``, its
    :func:`change_fingerprint` noted at the capture).  A row captured and then forgotten is
    gone, or is the row of no table that stands for the largest number."""
    if not has_table(conn, CHANGES):
        return False
    if max_seq(conn) < captured:
        return True
    if tail is None:
        return False
    row = change_row(conn, captured)
    return row is not None and row[0] != "" and change_fingerprint(row) != tail


def change_row(conn: Connection, seq: int) -> tuple | None:
    """(table name, then each key value as its type and the hex of its bytes) of the change
    row numbered ``seq``, or None.  As bytes: a key may be TEXT that is not UTF-8."""
    if not has_table(conn, CHANGES):
        return None
    ks = ", ".join(f"typeof(k{i}) || ':' || hex(k{i})" for i in range(key_cols(conn)))
    row = conn.execute(f"SELECT hex(tbl), {ks} FROM {CHANGES} WHERE seq = ?",
                       (seq,)).fetchone()
    return None if row is None else tuple(row)


def change_fingerprint(row: tuple) -> str:
    """What tells one change row from another under the same number: its table and key
    values with their types (key columns added later, NULL, do not count)."""
    vals = list(row)
    while vals and vals[-1] == "null:":
        vals.pop()
    return "|".join(vals)


def store_behind(conn: Connection, captured: int) -> bool:
    """Whether the file's change table starts above what the store says it captured: the
    store went back (restored from an older copy), and what it had captured in between is in
    neither (the capture removed it from the file, the restore from the store) but in the
    application's rows.  Only syncpack removes change rows: those up to what it captured."""
    if not has_table(conn, CHANGES):
        return False
    # A capture's mark (a row of no table and no key, numbered what it captured) above what
    # the store says, or no change row left at or just above it.
    low = conn.execute(f"SELECT min(seq) FROM {CHANGES}").fetchone()[0]
    return low is not None and low > captured + 1 or conn.execute(
        f"SELECT 1 FROM {CHANGES} WHERE tbl = '' AND k0 IS NULL AND seq > ? LIMIT 1",
        (captured,)).fetchone() is not None


def max_seq(conn: Connection) -> int:
    """The highest change number given so far."""
    if not has_table(conn, CHANGES):
        return 0
    return conn.execute(f"SELECT coalesce(max(seq), 0) FROM {CHANGES}").fetchone()[0]


def _change_names(tables: Iterable[str]) -> list[str]:
    """The ``tbl`` values of the change rows of ``tables``: each name, and the name marking
    the keys a REPLACE may have removed."""
    tables = list(tables)
    return [*tables, *(MAYBE + n for n in tables)]


def pending_counts(conn: Connection, since: int, stopped: Iterable[str] = ()
                   ) -> dict[str, int]:
    """Per table, changes committed after ``since`` (not yet captured); for the tables in
    ``stopped`` (whose capture a schema change stopped), every change still kept, since those
    wait for the refresh whatever their number."""
    if not has_table(conn, CHANGES):
        return {}
    stopped = _change_names(stopped)
    counts: dict[str, int] = {}
    for tbl, n in conn.execute(
            f"SELECT tbl, count(*) FROM {CHANGES} WHERE tbl != '' AND (seq > ? OR tbl IN "
            f"({', '.join('?' for _ in stopped)})) GROUP BY tbl", (since, *stopped)):
        name = tbl.removeprefix(MAYBE)
        counts[name] = counts.get(name, 0) + n
    return counts


def _changed_keys(t: TableInfo) -> str:
    """The keys of ``t`` changed in (since, upto] (bindings: table, since, upto), each once
    with its last change number ``s``.  Grouped before the join: joined first, every change
    row's whole row went through the grouping's sorter (200k changes, in SQLite alone: 0.29 s
    against 0.11 s)."""
    ks = ", ".join(f"k{i}" for i in range(len(t.pk)))
    there = " AND ".join(f"x.{q(c)} = c.k{i}" for i, c in enumerate(t.pk))
    return (f"SELECT {ks}, max(seq) AS s FROM {CHANGES} c WHERE seq > ?2 AND seq <= ?3 AND "
            f"(tbl = ?1 OR tbl = {MAYBE_SQL} || ?1 AND NOT EXISTS (SELECT 1 FROM {q(t.name)} x "
            f"WHERE {there})) "
            f"GROUP BY {ks}")


def _in_order(t: TableInfo) -> str:
    """How the changed rows of ``t`` are given: in order of each key's last change for a
    table that references itself (a parent row its application wrote before a child then
    comes first to the peers too) or whose own triggers delete rows of it (a capped log
    whose insert of 300 deletes the rows below 200: written at a peer before 150, as at the
    origin, not after it); any other as :func:`changed_records` finds them fastest, in no
    order promised (an order by last change: 1M rows took 2.1 s to the first row against
    0.3 s)."""
    self_ref = sqltext.fold(t.name) in {sqltext.fold(p) for p in t.parents}
    return " ORDER BY c.s" if self_ref or t.by_change else ""


def changed_records(conn: Connection, t: TableInfo, since: int, upto: int,
                    n: int | Callable[[], int]) -> Iterator[tuple[bool, list[tuple]]]:
    """The keys of ``t`` changed in (since, upto], in lists of up to ``n`` rows (or as
    :func:`_parts` says), each list with how its rows are laid out: ``(True, rows)`` when
    every row is present and is only each column's name beside its value, in ``t.columns``
    order (the interleaved names and values pack as a msgpack array whose elements are
    exactly those of the row's map); ``(False, rows)`` when a row may be absent, each then
    laid out as (the record key when SQLite can spell it, else None; present; the key
    values...; then the names and values as above).  The record key spelt there is an
    INTEGER key's decimal text or a TEXT key not starting with '[' (attach/rows.py:
    encode_key); the key values are there only when it is not (NULL otherwise: a value fewer
    to convert per row).

    The TEXT key values of a key no longer in the table come as ``'T'`` and their bytes in
    hex (never spelt as the record key): SQLite keeps any bytes as TEXT, and such a key may
    be one that was never valid UTF-8 (nor ever captured), whose delete must not stop the
    capture.  attach/reader.py reads them back.

    A table given in the order of its changes (:func:`_in_order`) is read in one grouped
    join.  Any other gives the rows present (in the order of their keys' first change),
    then the keys gone: SQLite makes the changed keys distinct as it meets them, for a
    fraction of what grouping them by key costs (a sort of every change row), and the keys
    gone are looked for only when the counts leave room for one (1M new rows read and
    encoded: 2.47 s against 2.80 s, the best of 8)."""
    if not _in_order(t):
        return _present_then_gone(conn, t, since, upto, n)
    cs = [f"c.k{i}" for i in range(len(t.pk))]
    absent = f"t.{q(t.pk[0])} IS NULL"
    key, kvals = _key_spelling(t, cs, absent)
    sql = (f"SELECT {key}, NOT {absent}, {kvals}, {_named_values(t, 't.')} FROM "
           f"({_changed_keys(t)}) c LEFT JOIN {q(t.name)} t ON {_same_key(t, cs)}"
           f"{_in_order(t)}")
    return _tagged(False, _parts(conn.execute(sql, (t.name, since, upto)), n, t.name))


def _tagged(tag: bool, parts: Iterator[list[tuple]]) -> Iterator[tuple[bool, list[tuple]]]:
    return ((tag, part) for part in parts)


def _present_then_gone(conn: Connection, t: TableInfo, since: int, upto: int,
                       n: int | Callable[[], int]) -> Iterator[tuple[bool, list[tuple]]]:
    """:func:`changed_records` of a table not ordered by change."""
    cs = [f"c.k{i}" for i in range(len(t.pk))]
    ks = ", ".join(f"k{i}" for i in range(len(t.pk)))
    # CROSS JOIN: the changed keys are always the outer loop.  As an IN list they were as
    # fast, but with the application's statistics saying the table is small (ANALYZE run
    # early, never again) SQLite scanned the whole table for a single change.  Only the
    # names and values: the record key is read from the key's values in Python (a key
    # spelt here too was a third more of the reader's time).
    sql = (f"SELECT {_named_values(t, 't.')} FROM (SELECT DISTINCT {ks} "
           f"FROM {CHANGES} WHERE seq > ?2 AND seq <= ?3 AND tbl = ?1) c "
           f"CROSS JOIN {q(t.name)} t ON {_same_key(t, cs)}")
    present = 0
    for part in _parts(conn.execute(sql, (t.name, since, upto)), n, t.name):
        present += len(part)
        yield True, part
    # Counted after the rows (the caller's snapshot holds, so the counts are those of the
    # same changes): before them, the count of 1M changes kept the first rows back.
    changed, maybe = conn.execute(
        f"SELECT count(*) FILTER (WHERE tbl = ?1), count(*) FILTER (WHERE tbl = "
        f"{MAYBE_SQL} || ?1) FROM {CHANGES} WHERE seq > ?2 AND seq <= ?3",
        (t.name, since, upto)).fetchone()
    if present == changed and not maybe:
        return      # as many rows present as changes: each was a key of its own, and is here
    key, kvals = _key_spelling(t, cs, "1")
    sql = (f"SELECT {key}, 0, {kvals}, {_named_values(t, None)} FROM ({_changed_keys(t)}) c "
           f"WHERE NOT EXISTS (SELECT 1 FROM {q(t.name)} t WHERE {_same_key(t, cs)})")
    yield from _tagged(False, _parts(conn.execute(sql, (t.name, since, upto)), n, t.name))


def _named_values(t: TableInfo, row: str | None) -> str:
    """SQL of each column's name (a literal) beside its value in ``row`` ('t.', or '' for the
    table itself), or beside NULL when ``row`` is None: what a record's map packs from
    (:func:`changed_records`)."""
    return ", ".join(f"'{c.replace(chr(39), chr(39) * 2)}', "
                     f"{'NULL' if row is None else row + q(c)}" for c in t.columns)


def _same_key(t: TableInfo, ks: list[str]) -> str:
    return " AND ".join(f"t.{q(c)} = {k}" for c, k in zip(t.pk, ks))


def _key_spelling(t: TableInfo, ks: list[str], absent: str) -> tuple[str, str]:
    """SQL of (the record key, or NULL where SQLite cannot spell it; the key values, or NULL
    where the record key is spelt) of the key ``ks``, which is no longer in the table where
    ``absent`` holds (:func:`changed_records`)."""

    def gone_as_hex(k: str) -> str:
        return f"CASE WHEN {absent} AND typeof({k}) = 'text' THEN 'T' || hex({k}) ELSE {k} END"

    if len(t.pk) > 1:
        return "NULL", ", ".join(map(gone_as_hex, ks))
    k = ks[0]
    key = (f"CASE typeof({k}) WHEN 'integer' THEN CAST({k} AS TEXT) WHEN 'text' THEN "
           f"CASE WHEN substr({k}, 1, 1) <> '[' AND NOT {absent} THEN {k} END END")
    kvals = (f"CASE WHEN typeof({k}) = 'integer' THEN NULL WHEN typeof({k}) <> 'text' OR "
             f"substr({k}, 1, 1) = '[' OR {absent} THEN {gone_as_hex(k)} END")
    return key, kvals


def changed_rows(conn: Connection, t: TableInfo, since: int, upto: int
                 ) -> Iterator[tuple[int, tuple, tuple | None]]:
    """(last seq, key values, current row or None) of each key of ``t`` changed in
    (since, upto], ordered as :func:`_in_order` says; the caller holds a read snapshot."""
    m, n = len(t.columns), len(t.pk)
    for part in changed_chunks(conn, t, since, upto, 10_000):
        for row in part:
            yield row[-1], tuple(row[m + 1:m + 1 + n]), (tuple(row[:m]) if row[m] else None)


def changed_chunks(conn: Connection, t: TableInfo, since: int, upto: int, n: int
                   ) -> Iterator[list[tuple]]:
    """:func:`changed_rows` in lists of up to ``n`` raw rows for bulk readers, each laid out
    as (the row's columns in ``t.columns`` order, present, key values...), so that
    ``zip(t.columns, row)`` is the row and ``row[len(t.columns)]`` says whether it exists."""
    ks = [f"c.k{i}" for i in range(len(t.pk))]
    on = " AND ".join(f"t.{q(c)} = {k}" for c, k in zip(t.pk, ks))
    cols = ", ".join(f"t.{q(c)}" for c in t.columns)
    present = f"t.{q(t.pk[0])} IS NOT NULL"
    sql = (f"SELECT {cols}, {present}, {', '.join(ks)}, c.s FROM ({_changed_keys(t)}) c "
           f"LEFT JOIN {q(t.name)} t ON {on}{_in_order(t)}")
    return _parts(conn.execute(sql, (t.name, since, upto)), n, t.name)


def note_applied(conn: Connection, token: bytes) -> None:
    """Inside our write transaction: that transaction's token, committed with it (a row of
    no table in the change table, gone at the next capture), so that after a crash the site
    can tell whether the rows it wrote are in the file (:func:`applied_tokens`)."""
    if has_table(conn, CHANGES):
        conn.execute(f"INSERT INTO {CHANGES}(tbl, k0) VALUES ('', ?)", (token,))


def applied_tokens(conn: Connection, tokens: Iterable[bytes]) -> set[bytes]:
    """Which of ``tokens`` (:func:`note_applied`) the file holds: their transactions
    committed."""
    tokens = list(tokens)
    if not tokens or not has_table(conn, CHANGES):
        return set()
    return {bytes(r[0]) for r in conn.execute(
        f"SELECT k0 FROM {CHANGES} WHERE tbl = '' AND k0 IN "
        f"({', '.join('?' for _ in tokens)})", tokens)}


def forget_changes(conn: Connection, upto: int, keep: Iterable[str] = ()) -> None:
    """Captured rows are no longer needed (the store remembers how far it captured); those of
    the tables in ``keep`` (whose capture stopped) stay for the refresh (:func:`kept_keys`)."""
    if has_table(conn, CHANGES):
        keep = list(keep)
        # The largest stays: the next number is always above it (see install_capture).
        last = conn.execute(f"SELECT max(seq) FROM {CHANGES}").fetchone()[0]
        if not keep and last is not None and last <= upto:
            # Everything goes, and a row of no table takes the largest number: a DELETE
            # without WHERE empties the table without visiting each row (1M rows: 0.01 s
            # against 0.5 s), and the number stays in the same transaction, so no reader sees
            # it gone.  The row names no key: in a copy of this file restored later, every
            # key in the change table is one changed after the copy's last capture
            # (attach/capturing.py: _went_back).
            conn.execute(f"DELETE FROM {CHANGES}")
            conn.execute(f"INSERT INTO {CHANGES}(seq, tbl) VALUES (?, '')", (last,))
            return
        keep = _change_names(keep)
        conn.execute(f"DELETE FROM {CHANGES} WHERE seq <= ? AND seq < "
                     f"(SELECT max(seq) FROM {CHANGES}) AND tbl NOT IN "
                     f"({', '.join('?' for _ in keep)})", (upto, *keep))


def has_forgettable(conn: Connection, upto: int, keep: Iterable[str] = ()) -> bool:
    """Whether :func:`forget_changes` of ``upto`` would remove anything: a captured change
    row of a table not in ``keep``, other than the largest when that one is the row of no
    table it leaves behind."""
    if not has_table(conn, CHANGES):
        return False
    keep = _change_names(keep)
    return conn.execute(
        f"SELECT 1 FROM {CHANGES} WHERE seq <= ? AND (seq < (SELECT max(seq) FROM {CHANGES}) "
        f"OR tbl != '') AND tbl NOT IN ({', '.join('?' for _ in keep)}) LIMIT 1",
        (upto, *keep)).fetchone() is not None


def removed_since(conn: Connection, infos: dict[str, TableInfo], start: int
                  ) -> dict[str, list[tuple]]:
    """Per table of ``infos``, the key values of rows noted changed after change number
    ``start`` that are no longer there.  Inside syncpack's own write transaction, where its
    writes are quiet, these are rows that the application's triggers (or its foreign keys'
    actions) deleted as syncpack wrote other rows."""
    if not has_table(conn, CHANGES):
        return {}
    out: dict[str, list[tuple]] = {}
    for name, t in infos.items():
        if not t.pk:
            continue
        ks = ", ".join(f"c.k{i}" for i in range(len(t.pk)))
        # the row's column on the left: the table's collation and affinity compare
        same = " AND ".join(f"x.{q(c)} = c.k{i}" for i, c in enumerate(t.pk))
        gone = conn.execute(
            f"SELECT DISTINCT {ks} FROM {CHANGES} c WHERE c.seq > ? AND c.tbl = ? AND "
            f"NOT EXISTS (SELECT 1 FROM {q(t.name)} x WHERE {same})", (start, name)).fetchall()
        if gone:
            out[name] = [tuple(k) for k in gone]
    return out


def kept_keys(conn: Connection, t: TableInfo) -> list[tuple]:
    """The key values of every change of ``t`` still in the change table."""
    if not has_table(conn, CHANGES):
        return []
    ks = ", ".join(f"k{i}" for i in range(len(t.pk)))
    return conn.execute(f"SELECT DISTINCT {ks} FROM {CHANGES} WHERE tbl IN (?, ?)",
                        (t.name, MAYBE + t.name)).fetchall()


def scan(conn: Connection, t: TableInfo, named: bool = False) -> Iterator[tuple]:
    """Every row of ``t`` that has a whole key (columns in ``t.columns`` order; or, if
    ``named``, each column's name beside its value, as :func:`changed_records` gives a row
    present).  A row with NULL in a key column is no record, and is never replicated
    (:func:`null_key_rows` counts them)."""
    cols = _named_values(t, "") if named else ", ".join(q(c) for c in t.columns)
    nullable = nullable_key(conn, t.name)
    where = " AND ".join(f"{q(c)} IS NOT NULL" for c in nullable)
    try:
        yield from _whole_table(conn, cols, t.name, where)
    except UnicodeDecodeError:
        raise _not_utf8(t.name) from None
    except _FILE_ERRORS as e:
        raise file_error(conn.filename, e) from None


def count_rows(conn: Connection, table: str) -> int:
    return _whole_table(conn, "count(*)", table).fetchone()[0]


def _whole_table(conn: Connection, what: str, table: str, where: str = ""):
    """A cursor on ``SELECT what FROM table [WHERE where]``: by an index if SQLite picks one
    (it counts by the smallest), else, when that index needs the application's collation,
    by the table itself, which needs none."""
    cond = f" WHERE {where}" if where else ""
    try:
        return conn.execute(f"SELECT {what} FROM {q(table)}{cond}")
    except ApplicationOnlyError:
        return conn.execute(f"SELECT {what} FROM {q(table)} NOT INDEXED{cond}")


_SQLITE_TYPES = (type(None), int, float, str, bytes)


def _storable(v: object) -> bool:
    """A value SQLite stores as it is (a 64-bit integer, a float, text, a blob, NULL)."""
    return isinstance(v, _SQLITE_TYPES) and (v.__class__ is not int or -1 << 63 <= v < 1 << 63)


# What refuses one row of ours and nothing else: a constraint (a trigger's RAISE(ABORT) or
# RAISE(FAIL) included), a key an INTEGER PRIMARY KEY cannot hold (a record from a site whose
# table is keyed by TEXT, or that never attached it), what the application's schema makes
# SQLite refuse (what only the application defines, a trigger naming a dropped table), a
# value SQLite cannot bind.  That row is a clash; the rest of the write goes on.
# TooBigError: a row the application's schema makes larger than SQLite allows (a DEFAULT or
# a CHECK it computes): that row's clash, not a failure of the whole write.
_ROW_REFUSED = (apsw.ConstraintError, apsw.MismatchError, apsw.TooBigError,
                ApplicationOnlyError, TypeError, OverflowError)
# A trigger that skips its row (RAISE(IGNORE)) or ends the whole transaction (RAISE(ROLLBACK)).
_RAISE = re.compile(r"(?is)\braise\s*\(\s*(ignore|rollback)\b")


def raising_triggers(conn: Connection, table: str) -> dict[str, set[str]]:
    """Trigger name -> what it raises of IGNORE and ROLLBACK, for the triggers of ``table``
    that do."""
    out: dict[str, set[str]] = {}
    for name, sql in conn.execute("SELECT name, sql FROM sqlite_schema WHERE type='trigger' "
                                  "AND tbl_name = ? COLLATE NOCASE", (table,)).fetchall():
        kinds = {m.lower() for m in _RAISE.findall(sql or "")}
        if kinds:
            out[name] = kinds
    return out


def self_deleting_triggers(conn: Connection, t: TableInfo) -> list[str]:
    """The application's triggers that delete rows of ``t`` itself when a row of ``t`` is
    written (a tree of rows kept by trigger): the rows such a trigger deletes while syncpack
    writes into ``t`` are not captured (see _trigger_parts).  Found as SQLite compiles a
    write of each kind with its triggers (EXPLAIN: nothing runs)."""
    found: set[str] = set()

    def authorize(action, table, _column, _db, trigger):
        if (action == apsw.SQLITE_DELETE and trigger and sqltext.fold(table or "") == sqltext.fold(t.name)
                and not trigger.startswith(TRIGGER_PREFIX)):
            found.add(trigger)
        return apsw.SQLITE_OK

    # every column set, as syncpack's upsert sets them: an UPDATE OF trigger fires for those
    sets = ", ".join(f"{q(c)} = {q(c)}" for c in t.columns)
    with _authorizing(conn, authorize):
        for sql in (f"EXPLAIN DELETE FROM {q(t.name)} WHERE 0",
                    f"EXPLAIN INSERT INTO {q(t.name)} DEFAULT VALUES",
                    f"EXPLAIN UPDATE {q(t.name)} SET {sets} WHERE 0"):
            try:        # a plain cursor: what only the application defines is no error here
                # (compiling is what the authorizer sees; the rows are not read, see
                # _compile_error)
                apsw.Cursor(conn).execute(sql).close()
            except apsw.Error:      # a schema this connection cannot compile: nothing found
                pass
    return sorted(found)


def self_updating_keys(conn: Connection, t: TableInfo) -> list[str]:
    """The foreign keys of ``t`` that refer to ``t`` itself by columns other than its primary
    key with an ON UPDATE action (``up REFERENCES node(code) ON UPDATE CASCADE``), in words:
    a row syncpack writes that changes such a column changes other rows of ``t`` by the
    schema, which the whole table's applying marker kept from being captured.  (A record never
    changes its key in place, and a delete's actions are noted by _cascade.)"""
    fks: dict[int, tuple[str, list, list]] = {}
    for r in conn.execute(f"PRAGMA foreign_key_list({q(t.name)})").fetchall():
        if sqltext.fold(r[2]) == sqltext.fold(t.name) and r[5] in ("CASCADE", "SET NULL",
                                                                   "SET DEFAULT"):
            f = fks.setdefault(r[0], (r[5], [], []))
            f[1].append(r[3])
            f[2].append(r[4])
    return [f"{', '.join(frm)} -> {t.name}({', '.join(to)}) ON UPDATE {action}"
            for action, frm, to in fks.values()
            if not any(c is None for c in to)
            and sorted(map(sqltext.fold, to)) != sorted(map(sqltext.fold, t.pk))]


def _refusal_text(e: BaseException) -> str:
    if isinstance(e, ApplicationOnlyError):
        if e.needs.startswith(_APP_ONLY):
            return f"{e.needs}, which only the application defines"
        return f"{e.needs}: the application's schema makes SQLite refuse the write"
    if isinstance(e, apsw.MismatchError):
        return "datatype mismatch: the table's INTEGER PRIMARY KEY holds only integers"
    if isinstance(e, (TypeError, OverflowError)):
        return f"a value SQLite cannot store ({e})"
    return str(e).replace("ConstraintError: ", "")


# A conflict clause in a table's definition (`UNIQUE ON CONFLICT REPLACE`); found in a string
# literal too, which only costs such a table the OR ABORT it does not need.
_OWN_CONFLICT_CLAUSE = re.compile(r"(?i)\bON\s+CONFLICT\b")


class Writer:
    """Writes visible records into one table, one row per savepoint: a row the local schema
    refuses (UNIQUE, CHECK, NOT NULL, FOREIGN KEY) is rolled back alone and reported."""

    def __init__(self, conn: Connection, t: TableInfo):
        self.conn, self.t = conn, t
        where = " AND ".join(f"{q(c)} = ?" for c in t.pk)
        self._delete = f"DELETE FROM {q(t.name)} WHERE {where}"
        self._cols = set(t.columns)
        self.computed = computed_defaults(conn, t.name)
        self._sql: dict[tuple[tuple[str, ...], int], str] = {}
        # The upsert's target names the primary key's own index: by columns alone it may match
        # a UNIQUE index on the same columns under another collation ('bob' against 'Bob'
        # under NOCASE), whose clash it would then turn into an update of the other row.  A
        # rowid has no index, and a collation on it is refused.
        self._target = ", ".join(q(c) if rowid_alias(conn, t) else f"{q(c)} COLLATE BINARY"
                                 for c in t.pk)
        self._exists = f"SELECT 1 FROM {q(t.name)} WHERE {where}"
        # OR ABORT where the table's definition has a conflict clause of its own: a clash is
        # the row's, whatever it says (REPLACE would delete this site's row uncaptured,
        # IGNORE would drop the peer's, both silently).  Not elsewhere: the outer statement's
        # OR also overrides those of the statements in the application's triggers, and a
        # trigger's INSERT OR IGNORE into a table of its own then failed the peer's row.
        self._or_abort = " OR ABORT" if _OWN_CONFLICT_CLAUSE.search(t.create_sql or "") else ""
        # An upsert that updates a row runs the row's UPDATE triggers under OR ABORT whatever
        # they say (SQLite's rule): a table with UPDATE triggers of the application's gets
        # a plain UPDATE, then an INSERT where no row was there
        self._split = conn.execute(
            "SELECT 1 FROM sqlite_schema WHERE type='trigger' AND tbl_name=? AND "
            "substr(name, 1, ?) <> ? AND sql LIKE '%UPDATE%' LIMIT 1",
            (t.name, len(TRIGGER_PREFIX), TRIGGER_PREFIX)).fetchone() is not None
        rest = [c for c in t.columns if c not in t.pk]
        self._update = (f"UPDATE{self._or_abort} {q(t.name)} SET "
                        + ", ".join(f"{q(c)} = ?" for c in rest) + f" WHERE {where}"
                        if rest else None)
        # The applying marker names the table written (see _trigger_parts), and for a table
        # whose own triggers delete rows of it, each row's key as it is written: the rows
        # such a trigger deletes beside it are captured.  Such a table's rows are then
        # written one at a time, its capture triggers never set aside.
        marked = marker_key_cols(conn)
        self.row_marks = marked >= len(t.pk) and bool(self_deleting_triggers(conn, t)
                                                      or self_updating_keys(conn, t))
        # Its capture triggers are never set aside for a large batch when a trigger of the
        # application's may delete its rows: a row so deleted as another table is written is
        # then noted (and written back, attach/applying.py restore_removed), not lost unseen
        self.keeps_capture = self.row_marks or any(
            re.search(r"(?i)\bDELETE\b", sql or "") and _names_column(t.name, sql or "")
            for (sql,) in conn.execute(
                "SELECT sql FROM sqlite_schema WHERE type='trigger' AND substr(name, 1, ?) <> ?",
                (len(TRIGGER_PREFIX), TRIGGER_PREFIX)))
        if self.row_marks:
            sets = ", ".join(f"k{i} = ?{i + 2}" for i in range(len(t.pk)))
            self._mark = f"UPDATE {APPLYING} SET x = ?1, {sets}"
        elif marked:
            self._mark = (f"UPDATE {APPLYING} SET x = ?1, k0 = NULL "
                          f"WHERE x IS NOT ?1 OR k0 IS NOT NULL")
        else:
            self._mark = (f"UPDATE {APPLYING} SET x = ?1 WHERE x IS NOT ?1"
                          if has_table(conn, APPLYING) else None)
        # a trigger that may skip a row: each write is then checked to have happened
        self._may_ignore = any("ignore" in k for k in raising_triggers(conn, t.name).values())
        self._actions: dict = {}     # table -> its incoming ON DELETE actions (_actions_on)
        self._others: dict = {}      # table -> its Writer, for a cascade's deferred checks
        # deferred foreign keys are checked by hand, in the row's savepoint (see TableInfo)
        self._check_put = self._check_delete = None
        if t.deferred:
            self._check_put = (f"SELECT 1 FROM {q(t.name)} c WHERE "
                               + " AND ".join(f"c.{q(c)} = ?" for c in t.pk) + " AND ("
                               + " OR ".join(map(_violations_sql, t.deferred)) + ")")
        if t.deferred_children:
            # children of the deleted key only, when they refer to it by its primary key
            self._check_delete = "SELECT 1 WHERE " + " OR ".join(
                f"EXISTS (SELECT 1 FROM {q(fk[0])} c WHERE "
                + ("".join(f"c.{q(f)} = ?{1 + t.pk.index(to)} AND "
                           for f, to in zip(fk[1], fk[3])) if sorted(fk[3]) == sorted(t.pk)
                   else "") + f"{_violations_sql(fk)})"
                for fk in t.deferred_children)
        # An update can break only the deferred keys that refer to other columns than the
        # primary key (which a record never changes): checked after each row that writes.
        by_other = [fk for fk in t.deferred_children if sorted(fk[3]) != sorted(t.pk)]
        self._check_update = ("SELECT 1 WHERE " + " OR ".join(
            f"EXISTS (SELECT 1 FROM {q(fk[0])} c WHERE {_violations_sql(fk)})"
            for fk in by_other)) if by_other else None

    def unwritable(self) -> str | None:
        """Why SQLite would refuse to compile the statements syncpack runs on the table (its
        rows written and deleted, with the triggers, indexes, checks and foreign key actions
        they set off; counted; read whole), or None."""
        t = self.t
        cols = tuple(t.columns)
        names = ", ".join(q(c) for c in cols)
        return _compile_error(self.conn, [(self._upsert(cols), len(cols)),
                                          (self._delete, len(t.pk)),
                                          (f"SELECT count(*) FROM {q(t.name)}", 0),
                                          (f"SELECT {names} FROM {q(t.name)}", 0)])

    def _upsert(self, cols: tuple[str, ...], rows: int = 1) -> str:
        sql = self._sql.get((cols, rows))
        if sql is None:
            names = ", ".join(q(c) for c in cols)
            marks = ", ".join([f"({', '.join('?' for _ in cols)})"] * rows)
            # Every column, also those the record lacks: a record written where the table
            # had fewer columns (an older release) stands for a row with their defaults, as
            # that site's row has them once it adds the columns; and excluded.c of a column
            # the INSERT does not name is its default.  Keeping this site's values there
            # instead would keep a row the family's visible record does not say.
            rest = [c for c in self.t.columns if c not in self.t.pk]
            tail = ("DO UPDATE SET " + ", ".join(f"{q(c)}=excluded.{q(c)}" for c in rest)
                    if rest else "DO NOTHING")
            sql = self._sql[cols, rows] = (
                f"INSERT{self._or_abort} INTO {q(self.t.name)}({names}) VALUES {marks} "
                f"ON CONFLICT({self._target}) {tail}")
        return sql

    def _upsert_all(self, cols: tuple[str, ...], args: list[tuple]) -> None:
        """Every row of ``args``, in order, several rows to a statement (db.execute_rows)."""
        if self._splits(cols):
            for values in args:
                self._write(cols, values)
            return
        db.execute_rows(self.conn, self._upsert(cols),
                        self._upsert(cols, db.rows_per_statement(len(cols))), args, len(cols))

    def _splits(self, cols: tuple[str, ...]) -> bool:
        """Whether a row of ``cols`` is written by UPDATE, then INSERT (see __init__): a
        record with every column (one that lacks some is written by the upsert, which sets
        those to their defaults)."""
        return self._split and self._update is not None and len(cols) == len(self._cols) \
            and set(cols) == self._cols

    def _write(self, cols: tuple[str, ...], values: list | tuple) -> None:
        """One row of ``cols`` holding ``values``."""
        if not self._splits(cols):
            self.conn.execute(self._upsert(cols), values)
            return
        row = dict(zip(cols, values))
        key = [row[c] for c in self.t.pk]
        self.conn.execute(self._update, [row[c] for c in self.t.columns if c not in self.t.pk]
                          + key)
        # (a row there that a trigger's RAISE(IGNORE) kept as it was is no row to insert)
        if not self.conn.changes() and self.conn.execute(self._exists, key).fetchone() is None:
            self.conn.execute(f"INSERT{self._or_abort} INTO {q(self.t.name)}("
                              + ", ".join(q(c) for c in cols) + ") VALUES ("
                              + ", ".join("?" for _ in cols) + ")", values)

    def put(self, row: dict) -> str | None:
        cols = tuple(c for c in row if c in self._cols)
        if len(cols) != len(row):
            if not all(type(c) is str for c in row):    # a lying member's record
                return "the record is not a row of the table (a column name is not text)"
            missing = [c for c in row if c not in self._cols and c not in self.t.dropped]
            if missing:
                return waiting_text(self.t.name, missing)
        left_out = lacks_computed(row, self.computed) if self.computed else None
        if left_out:
            return left_out
        odd = next((c for c in cols if not _storable(row[c])), None)
        if odd is not None:     # what no application wrote: a lying member's record
            return f"column {odd} holds {_kind(row[odd])}, which is not a value SQLite stores"
        checks = []
        if self._check_put:
            checks.append((self._check_put, [row.get(c) for c in self.t.pk]))
        if self._check_update:
            checks.append((self._check_update, []))
        return self._one(cols, [row[c] for c in cols], checks,
                         [row.get(c) for c in self.t.pk], deleting=False)

    def _writing(self) -> None:
        """Marks the writes that follow as syncpack's, unless the table is marked row by
        row (:meth:`_writing_row`)."""
        if self._mark is not None and not self.row_marks:
            self.conn.execute(self._mark, (self.t.name,))

    def _writing_row(self, key: list | tuple) -> None:
        """Marks the write of ``key``'s row that follows as syncpack's, in a table marked
        row by row."""
        if self.row_marks:
            self.conn.execute(self._mark, (self.t.name, *key))

    def put_many(self, rows: list[dict]) -> list[str | None]:
        """Each row's constraint message or None; the whole batch in one savepoint, and row by
        row only when something in it is refused."""
        if not rows:
            return []
        cols = tuple(c for c in rows[0] if c in self._cols)
        args = None
        if self._check_put is None and self._check_update is None and \
                not self._may_ignore and not self.row_marks and len(cols) == len(rows[0]) and \
                set(map(len, rows)) == {len(cols)}:
            # every row as long as the first and holding each of its columns: the same
            # columns (cheaper than comparing each row's keys with the first's)
            get = itemgetter(*cols)
            try:
                args = list(map(get, rows)) if len(cols) > 1 else [(get(r),) for r in rows]
            except KeyError:
                args = None
        if args is not None:
            self._writing()
            self.conn.execute("SAVEPOINT syncpack_batch")
            try:
                self._upsert_all(cols, args)
            except _ROW_REFUSED as e:
                # a refused row (or one SQLite cannot bind): found row by row below
                self._undone(e)
                self.conn.execute("ROLLBACK TO syncpack_batch")
                self.conn.execute("RELEASE syncpack_batch")
            else:
                self.conn.execute("RELEASE syncpack_batch")
                return [None] * len(rows)
        return [self.put(r) for r in rows]

    def delete_plain(self, rows: list[dict]) -> None:
        """Delete the rows of these records' keys, no savepoint, no check (write_group)."""
        keys = [[r.get(c) for c in self.t.pk] for r in rows]
        if self.row_marks:
            for key in keys:
                self._writing_row(key)
                self.conn.execute(self._delete, key)
            return
        self._writing()
        self.conn.executemany(self._delete, keys)

    def put_plain(self, rows: list[dict]) -> None:
        """Upsert these records, no savepoint, no check (write_group)."""
        self._writing()
        for r in rows:
            cols = tuple(c for c in r if c in self._cols)
            key = [r.get(c) for c in self.t.pk]
            self._writing_row(key)
            self._write(cols, [r[c] for c in cols])
            if self._ignored(key, deleting=False):
                raise apsw.ConstraintError(IGNORED)

    def breaks_deferred(self, rows: list[dict]) -> bool:
        """Whether a row of these records' keys breaks a deferred foreign key."""
        by_row = bool(self._check_put) and any(
            self.conn.execute(self._check_put, [r.get(c) for c in self.t.pk]).fetchone()
            for r in rows)
        return by_row or (bool(self._check_update) and
                          self.conn.execute(self._check_update).fetchone() is not None)

    def delete_keys(self, keys: list[tuple]) -> list[tuple[str, list]]:
        """Delete these keys' rows, no savepoint (delete_group), as :meth:`delete` does;
        returns the deferred checks to run once all are gone."""
        checks: list[tuple[str, list]] = []
        self._writing()
        for key in keys:
            self._writing_row(key)
            touched, more = self._delete_plan(key)
            self.conn.execute(self._delete, list(key))
            if self._ignored(list(key), deleting=True):
                raise apsw.ConstraintError(IGNORED)
            if touched:
                note_changed(self.conn, touched)
            checks += more
        return checks

    def delete_check(self, key: tuple) -> list[tuple[str, list]]:
        """The deferred foreign keys' check of deleting ``key`` (SQL, arguments), if any."""
        if not self._check_delete or len(key) != len(self.t.pk):
            return []
        return [(self._check_delete, list(key))]

    def _delete_plan(self, key: tuple) -> tuple[list[tuple[str, tuple]], list[tuple[str, list]]]:
        """What deleting ``key`` changes beyond its row, and what must be checked after.

        Rows of other tables that the delete changes by their foreign keys' ON DELETE actions
        (CASCADE, SET NULL, SET DEFAULT) are the application's schema at work, not our write:
        the caller notes them as changes, which the next capture makes local ops, so the
        peers do the same and the store stays equal to the table.  Each row so removed may be
        one a deferred foreign key refers to: its own check joins the delete's."""
        touched = _cascade(self.conn, self.t.name, self.t.pk, list(key), self._actions)
        checks = self.delete_check(key)
        for table, k in touched:
            w = self._others.get(table)
            if w is None:
                t = table_info(self.conn, table)
                w = self._others[table] = Writer(self.conn, t) if t and t.pk else False
            if w:
                checks += w.delete_check(k)
        return touched, checks

    def delete(self, key: tuple) -> str | None:
        touched, checks = self._delete_plan(key)
        err = self._one(self._delete, list(key), checks, list(key), deleting=True)
        if err is None and touched:
            note_changed(self.conn, touched)
        return err

    def _one(self, sql: str | tuple[str, ...], args: list, checks: list[tuple[str, list]],
             key: list, deleting: bool) -> str | None:
        """``sql`` (or, given the columns, the write of a row of them) in a savepoint of its
        own; any of ``checks`` (SQL, arguments) finding a row after it is a deferred foreign
        key broken, and rolls it back."""
        self._writing()
        self._writing_row(key)
        self.conn.execute("SAVEPOINT syncpack_row")
        try:
            if isinstance(sql, tuple):
                self._write(sql, args)
            else:
                self.conn.execute(sql, args)
            if self._ignored(key, deleting):
                raise apsw.ConstraintError(IGNORED)
            if any(self.conn.execute(*c).fetchone() is not None for c in checks):
                raise apsw.ConstraintError("FOREIGN KEY constraint failed (deferred)")
        except _ROW_REFUSED as e:
            self._undone(e)
            self.conn.execute("ROLLBACK TO syncpack_row")
            self.conn.execute("RELEASE syncpack_row")
            return _refusal_text(e)
        self.conn.execute("RELEASE syncpack_row")
        return None

    def _ignored(self, key: list, deleting: bool) -> bool:
        """Whether a trigger's RAISE(IGNORE) skipped the write just made of ``key``: it
        changed no row, and the row is still there (a delete) or is not, or was to be updated
        (an upsert; one of a table of key columns only changes nothing when the row is
        there)."""
        if not self._may_ignore or self.conn.changes():
            return False
        there = self.conn.execute(self._exists, key).fetchone() is not None
        return there if deleting else (not there or len(self.t.columns) > len(self.t.pk))

    def _undone(self, e: BaseException) -> None:
        _not_undone(self.conn, e, self.t.name)


def _not_undone(conn: Connection, e: BaseException, table: str | None) -> None:
    """After ``e`` refused a write: if a trigger's RAISE(ROLLBACK) ended the application's
    whole transaction, the rows written before with it, that is not one row's clash but the
    write's failure, told as the application's."""
    if conn.in_transaction:
        return
    of = f"the application's table {table}" if table else "the application"
    raise AttachError(
        f"a trigger of {of} rolled back the whole transaction syncpack was writing into the "
        f"application's tables ({e}); nothing of it was written there, and the records wait "
        f"in the store",
        hint="make the trigger refuse with RAISE(ABORT, ...) instead of RAISE(ROLLBACK, "
             "...): then the row it refuses is listed by 'syncpack conflicts' and the rest "
             "goes in") from None


# The clash of a row that an application's trigger skipped (RAISE(IGNORE)).
IGNORED = "a trigger of the application's skipped it (RAISE(IGNORE))"


def _actions_on(conn: Connection, table: str, cache: dict
                ) -> list[tuple[str, list[str], list[str], str]]:
    """(child table, its columns, the columns of ``table`` they refer to, action) of every
    foreign key with an ON DELETE action that refers to ``table``."""
    if table not in cache:
        out = []
        for (child,) in conn.execute(
                "SELECT name FROM sqlite_schema WHERE type='table'").fetchall():
            fks: dict[int, tuple[str, list, list, str]] = {}
            for r in conn.execute(f"PRAGMA foreign_key_list({q(child)})").fetchall():
                if sqltext.fold(r[2]) == sqltext.fold(table) and r[6] in ("CASCADE", "SET NULL",
                                                               "SET DEFAULT"):
                    f = fks.setdefault(r[0], (child, [], [], r[6]))
                    f[1].append(r[3])
                    f[2].append(r[4])
            for child_, frm, to, action in fks.values():
                if any(c is None for c in to):      # the parent's primary key
                    to = key_columns(conn, table)
                out.append((child_, frm, list(to), action))
        cache[table] = out
    return cache[table]


def foreign_key_actions(conn: Connection, table: str) -> list[str]:
    """The ON DELETE and ON UPDATE actions of the foreign keys that ``table`` declares or that
    refer to it, in words (``orders -> users ON DELETE CASCADE``)."""
    out = []
    for (child,) in conn.execute("SELECT name FROM sqlite_schema WHERE type='table'").fetchall():
        for r in conn.execute(f"PRAGMA foreign_key_list({q(child)})").fetchall():
            if sqltext.fold(table) not in (sqltext.fold(child), sqltext.fold(r[2])):
                continue
            for when, action in (("UPDATE", r[5]), ("DELETE", r[6])):
                if action not in ("NO ACTION", "RESTRICT"):
                    out.append(f"{child} -> {r[2]} ON {when} {action}")
    return sorted(set(out))


def _cascade(conn: Connection, table: str, pk: list[str], key: list, cache: dict
             ) -> list[tuple[str, tuple]]:
    """(table, key values) of the rows that deleting ``key`` from
    ``table`` would change through ON DELETE actions (a CASCADE's own cascades too, however
    deep).  Walked with a queue, not by recursion: a tree of a table referring to itself can
    be any depth, and its rows removed below a cut-off were never noted (the applying marker
    keeps that table's own triggers quiet), so they were lost unseen.  Each row is listed
    once and its own children looked for once: rows whose references form a cycle end the
    walk rather than loop."""
    out: list[tuple[str, tuple]] = []
    # the deleted row itself is syncpack's write, not a change of the schema's
    seen: set[tuple[str, tuple]] = {(table, tuple(key))}
    # apart from seen: a row reached first by a SET NULL and then by a CASCADE is removed,
    # and its children with it
    walked = set(seen)
    pks: dict[str, list[str]] = {table: pk}
    todo = deque(seen)
    while todo:
        parent_table, parent_key = todo.popleft()
        actions = _actions_on(conn, parent_table, cache)
        if not actions:
            continue
        where = " AND ".join(f"{q(c)} IS ?" for c in pks[parent_table])
        for child, frm, to, action in actions:
            parent = conn.execute(f"SELECT {', '.join(map(q, to))} FROM {q(parent_table)} "
                                  f"WHERE {where}", parent_key).fetchone()
            if parent is None:
                continue
            cpk = pks.get(child)
            if cpk is None:
                cpk = pks[child] = key_columns(conn, child) or ["rowid"]
            for r in conn.execute(
                    f"SELECT {', '.join(map(q, cpk))} FROM {q(child)} WHERE "
                    + " AND ".join(f"{q(c)} = ?" for c in frm), list(parent)):
                row = (child, tuple(r))
                if row not in seen:
                    seen.add(row)
                    out.append(row)
                if action == "CASCADE" and row not in walked:
                    walked.add(row)
                    todo.append(row)
    return out


def note_changed(conn: Connection, rows: list[tuple[str, tuple]]) -> None:
    """Note rows as changed, as their capture triggers would (inside our write transaction,
    where the triggers are quiet); those of tables not attached are never read, and go
    with the captured ones."""
    if not has_table(conn, CHANGES):
        return
    width = key_cols(conn)
    for table, key in rows:
        if len(key) > width:
            continue
        ks = ", ".join(f"k{i}" for i in range(len(key)))
        conn.execute(f"INSERT INTO {CHANGES}(tbl, {ks}) VALUES (?{', ?' * len(key)})",
                     (table, *key))


def deletes_reach_further(conn: Connection, table: str) -> bool:
    """Whether deleting a row of ``table`` could change or refuse anything beyond that row:
    a FOREIGN KEY of any table refers to it, or the application has a trigger on it."""
    if conn.execute("SELECT 1 FROM sqlite_schema WHERE type='trigger' AND tbl_name=? AND "
                    "name NOT LIKE '\\_syncpack\\_%' ESCAPE '\\'", (table,)).fetchone():
        return True
    for (other,) in conn.execute("SELECT name FROM sqlite_schema WHERE type='table'").fetchall():
        for r in conn.execute(f"PRAGMA foreign_key_list({q(other)})").fetchall():
            if sqltext.fold(r[2]) == sqltext.fold(table):
                return True
    return False


def _all_or_none(conn: Connection, work) -> bool:
    """``work()`` in one savepoint, rolled back whole if a constraint (or a value SQLite
    cannot bind) refuses any of it; whether it went in."""
    conn.execute("SAVEPOINT syncpack_group")
    try:
        work()
    except _ROW_REFUSED as e:
        _not_undone(conn, e, None)
        conn.execute("ROLLBACK TO syncpack_group")
        conn.execute("RELEASE syncpack_group")
        return False
    conn.execute("RELEASE syncpack_group")
    return True


def write_group(group: list[tuple["Writer", list[dict]]], delete_first: set[str]) -> bool:
    """Writes every row of ``group`` (per table, in the order given) or none: the rows that
    one at a time each broke a constraint only because of another of them (two rows that
    swap a UNIQUE value, rows whose deferred FOREIGN KEYs point at each other) go in
    together, as the origin's transaction wrote them.  The rows of tables in
    ``delete_first`` (tables no FOREIGN KEY refers to) are deleted first, so that values
    they swap are free; deferred foreign keys are checked once all are in.  Returns whether
    they went in."""
    def work() -> None:
        for w, rows in group:
            if w.t.name in delete_first:
                w.delete_plain(rows)
        for w, rows in group:
            w.put_plain(rows)
        if any(w.breaks_deferred(rows) for w, rows in group):
            raise apsw.ConstraintError("FOREIGN KEY constraint failed (deferred)")
    return bool(group) and _all_or_none(group[0][0].conn, work)


def refused_even_together(group: list[tuple["Writer", list[dict]]], delete_first: set[str]
                          ) -> list[set[int]]:
    """Per table of ``group``, the rows that break a constraint even beside all the others
    (a UNIQUE value that a row here holds, and that no row of the group frees): with the
    rows of ``delete_first`` deleted, each row is written in a savepoint of its own, again
    and again while any more go in; those never written are the answer.  Nothing stays
    written.  Deferred foreign keys are not checked here (write_group does)."""
    conn = group[0][0].conn
    left = [set(range(len(rows))) for _w, rows in group]
    conn.execute("SAVEPOINT syncpack_probe")
    try:
        for w, rows in group:
            if w.t.name in delete_first:
                w.delete_plain(rows)
        more = True
        while more:
            more = False
            for (w, rows), out in zip(group, left):
                for i in sorted(out):
                    if _all_or_none(conn, lambda: w.put_plain([rows[i]])):
                        out.discard(i)
                        more = True
    finally:
        conn.execute("ROLLBACK TO syncpack_probe")
        conn.execute("RELEASE syncpack_probe")
    return left


def delete_group(group: list[tuple["Writer", list[tuple]]]) -> bool:
    """Deletes every key of ``group`` or none: rows whose deferred foreign keys refer to
    each other, refused one at a time, go together as the origin's transaction deleted
    them; the deferred keys are checked once all are gone.  Returns whether they went."""
    if not group:
        return False
    conn = group[0][0].conn

    def work() -> None:
        checks = [c for w, keys in group for c in w.delete_keys(keys)]
        if any(conn.execute(*c).fetchone() is not None for c in checks):
            raise apsw.ConstraintError("FOREIGN KEY constraint failed (deferred)")
    return _all_or_none(conn, work)


# A record with a column the table lacks waits (it stays pending, and is listed as a clash with
# this text) until the column arrives, instead of losing the column's value.
WAITING = "waits for column"


def waiting_text(table: str, columns: list[str]) -> str:
    return (f"{WAITING} {', '.join(columns)}: table {table} here lacks "
            f"{'it' if len(columns) == 1 else 'them'} (a peer's table has "
            f"{'it' if len(columns) == 1 else 'them'}; added here, or dropped everywhere "
            f"with 'attach --refresh', the record goes in)")


def column_sql(conn: Connection, table: str, column: str) -> str:
    """A column definition rebuilt from the table's description (when the CREATE TABLE text
    does not show it plainly): name, declared type, NOT NULL, DEFAULT."""
    for _cid, col, decl, notnull, dflt, _pk, _hidden in conn.execute(
            f"PRAGMA table_xinfo({q(table)})"):
        if col == column:
            out = q(col) + (f" {decl}" if decl else "")
            if notnull:
                out += " NOT NULL"
            if dflt is not None:
                out += f" DEFAULT {dflt}"
            return out
    raise KeyError(column)


def add_column(conn: Connection, table: str, column: str, definition: str,
               replicated: Collection[str]) -> str | None:
    """Add ``column`` to ``table`` from a peer's column definition; the caller holds the write
    lock.  The text is the peers': it must define that column alone, computing little at a
    write and naming no other column (a CHECK on the table's other columns refused the
    application's own writes) nor a table of SQLite's or syncpack's; a row written without
    the column (by a release that does not know it yet) must pass its constraints; its
    foreign key may refer only to tables in ``replicated`` (as a peer's new table's); and it
    must add exactly that column to exactly that table and change nothing else (checked
    after running it inside a savepoint, rolled back otherwise).  Returns why it was
    refused, or None."""
    why = column_refusal(definition, table, replicated)
    if why:
        return (f"the peers' definition of column {column} of table {table} "
                f"({definition[:200]!r}) was refused: {why}")
    before = table_info(conn, table)
    others = _others(conn, table)
    keys_before = _foreign_keys_unusable(conn, table)
    seen: list[str] = []

    def only_one(_cursor, stmt, _bindings):
        seen.append(stmt)
        return len(seen) == 1

    conn.execute("SAVEPOINT syncpack_schema")
    why = None
    try:
        cur = conn.cursor()
        cur.exec_trace = only_one
        cur.execute(f"ALTER TABLE {q(table)} ADD COLUMN {definition}")
        after = table_info(conn, table)
        if before is None or after is None or after.columns != before.columns + [column] \
                or after.pk != before.pk or after.uniques != before.uniques:
            why = "it changes more than adding that column"
    except apsw.ExecTraceAbort:
        why = "it is more than one statement"
    except (apsw.Error, ApplicationOnlyError, ValueError) as e:     # ValueError: a NUL
        why = f"SQLite refused it ({getattr(e, 'needs', '') or e})"
    if why is None and _others(conn, table) != others:
        why = "it changes other parts of the schema"
    if why is None:
        keys_after = _foreign_keys_unusable(conn, table)
        why = (keys_after if keys_after != keys_before else None) or _too_wide(conn, table)
    if why:
        conn.execute("ROLLBACK TO syncpack_schema")
    conn.execute("RELEASE syncpack_schema")
    return None if why is None else (f"the peers' definition of column {column} of table "
                                     f"{table} ({definition!r}) was refused: {why}")


def column_refusal(definition: str, table: str, replicated: Collection[str]) -> str | None:
    """Why a site would refuse to add ``definition`` (one column's text) to its ``table`` as
    a peer's schema op, judged from the text alone (what :func:`add_column` checks first; the
    site adding the column checks it too, before it publishes it), or None."""
    return _too_long(definition) or _column_alone(definition, table, replicated)


def _column_alone(definition: str, table: str, replicated: Collection[str]) -> str | None:
    """Why a peer's column definition may not be added to ``table``: made alone as the one
    column of a private in-memory table, it must compile under :func:`_peers_text` (where
    naming another column fails), compute little into a row (:func:`_computed`), refer to
    no table outside ``replicated`` (:func:`_refers_elsewhere`), and take a row written
    without it (:func:`_refuses_old`)."""
    mem = apsw.Connection(":memory:")
    try:
        with _peers_text(mem) as refused:
            try:
                mem.execute(f"CREATE TABLE {q(table)}({definition})")
            except (apsw.Error, ValueError) as e:      # ValueError: a NUL
                if refused:
                    return f"it holds {refused[0]}"
                if "no such column" in str(e):
                    return "it refers to other columns of the table"
                return f"SQLite refused it ({e})"
        return _references_ours(mem, table) or _computed(mem, table) or \
            _refers_elsewhere(mem, table, replicated) or _refuses_old(mem, table)
    finally:
        mem.close()


def _refuses_old(mem: Connection, table: str) -> str | None:
    """Why the one column of ``table`` (a private in-memory table made from a peer's column
    definition) would refuse the rows of a release that does not know it: its default (what
    such a row holds) must pass its NOT NULL and CHECK constraints, and be NULL if it refers
    to another table (its parent row may be missing at any site).  SQLite adds a NOT NULL
    column without a default to an empty table, and that table then refused every insert
    of the application's old release."""
    try:
        (value,) = mem.execute(f"INSERT INTO {q(table)} DEFAULT VALUES RETURNING *").fetchone()
    except apsw.ConstraintError as e:
        return f"a row written without the column would break it ({e})"
    except (apsw.Error, ValueError) as e:
        return f"SQLite refused a row written without the column ({e})"
    if value is not None and mem.execute(f"PRAGMA foreign_key_list({q(table)})").fetchone():
        return (f"a row written without the column would refer to {value!r} in another "
                f"table, which may be missing there; refer to a parent with a NULL default")
    return None


def _others(conn: Connection, table: str) -> list[tuple]:
    return conn.execute("SELECT type, name, tbl_name, sql FROM sqlite_schema WHERE name != ? "
                        "ORDER BY type, name", (table,)).fetchall()


def _kind(value: object) -> str:
    """What a value SQLite cannot store is, in words."""
    if isinstance(value, bool):
        return f"{str(value).lower()} (SQLite has no booleans)"
    if isinstance(value, int):
        return "an integer beyond 64 bits"
    return {list: "a list", dict: "a map"}.get(type(value), f"a {type(value).__name__}")


def held_key(conn: Connection, t: TableInfo, key: tuple) -> tuple | None:
    """The primary key values, as the table holds them, of the row that ``key`` finds (by
    the key columns' affinities and collations), or None."""
    return _by_key(conn, t, key, t.pk)


def fetch_row(conn: Connection, t: TableInfo, key: tuple) -> tuple | None:
    return _by_key(conn, t, key, t.columns)


def _by_key(conn: Connection, t: TableInfo, key: tuple, columns: list[str]) -> tuple | None:
    cols = ", ".join(q(c) for c in columns)
    where = " AND ".join(f"{q(c)} = ?" for c in t.pk)
    try:
        return conn.execute(f"SELECT {cols} FROM {q(t.name)} WHERE {where}", key).fetchone()
    except UnicodeDecodeError:
        raise _not_utf8(t.name) from None


def foreign_keys_ok(conn: Connection, tables: Iterable[str]) -> list[str]:
    out = []
    for t in tables:
        for r in conn.execute(f"PRAGMA foreign_key_check({q(t)})"):
            out.append(f"{r[0]} row {r[1]} references a missing {r[2]} row")
    return out


def _parts(cur, n: int | Callable[[], int], table: str) -> Iterator[list[tuple]]:
    """A cursor's rows of ``table`` in lists of up to ``n`` (or as many as ``n()`` says,
    asked before each list)."""
    size = n if callable(n) else (lambda: n)
    while True:
        try:
            part = list(islice(cur, size()))
        except UnicodeDecodeError:
            raise _not_utf8(table) from None
        except _FILE_ERRORS as e:
            raise file_error(cur.connection.filename, e) from None
        if not part:
            return
        yield part


def _not_utf8(table: str) -> AttachError:
    """SQLite keeps whatever bytes it is given as TEXT; a record's text is UTF-8."""
    return AttachError(
        f"table {table!r} holds TEXT that is not valid UTF-8, which syncpack cannot "
        f"replicate; nothing was captured or written",
        hint="store such bytes as a BLOB (CAST(value AS BLOB)) or correct the text, then "
             "run the command again")
