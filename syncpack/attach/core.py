"""Attach, detach, refresh and the capture-then-apply cycle of an application's own SQLite
tables as collections, with the reports on them; what a capture takes is in
:mod:`~syncpack.attach.capturing`, what an apply writes in :mod:`~syncpack.attach.applying`.

See docs/attach.md for the model.  The order of commits is what makes a crash harmless:

- capture reads the application's committed changes in one snapshot and writes them as this
  site's ops in one store transaction that also records how far it read (``captured_seq``);
  the application's change rows are deleted only after that commit, and rows at or below
  ``captured_seq`` are skipped if they are still there;
- apply holds the application's write lock, captures first (so an application change is never
  overwritten before it is in the changelog), writes each pending key's visible record, each
  row in a savepoint (a row the local schema refuses is rolled back alone and recorded as a
  clash), commits the application's file, and only then clears the pending keys in the store.
  A crash before that leaves the keys pending, and writing a visible record twice is harmless;
- an import (:class:`applying.DirectApply`) holds that lock, captures first, and writes rows
  whose new version is their key's only one as the store inserts them (a large import's in a
  child process that took the lock over, attach/writer.py), leaving a mark of their CSNs in
  the same store transaction; the application commits only if every mark committed, and only
  then are the marks dropped.  Marks found later (a crash) make their keys pending again
  (:func:`applying.recover`, before any capture).

The lock order is always the application's file, then the store; every step holds the site's
own lock (one syncpack command at a time works on an attachment).
"""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from syncpack.attach import applying, capturing, reader, rows, schema, shapes, writer
from syncpack.errors import (AttachBusyError, AttachError, InvalidNameError, LockedError,
                             UsageError, arg)
from syncpack.format import codec
from syncpack.rules import sqltext
from syncpack.rules.conflict import Version
from syncpack.site import SYS_PREFIX, TABLES, Site, check_collection, wall_ms
from syncpack.store import appdb, attached, chain


def _path(db_path: str | os.PathLike) -> Path:
    return Path(db_path).expanduser().resolve()


def is_attached(site: Site) -> bool:
    return attached.attachment(site.conn) is not None


def back_or_detach(path: str) -> str:
    """What to do when the attached file is gone, or another file stands in its place."""
    return (f"put the application's database back at {path} (from its backup), or run "
            f"\"syncpack detach {arg(path)}\" to stop replicating it (the records stay in the "
            f"family)")


def _gone_why(name: str, path: str) -> str:
    return f"attached table {name} is gone from {path} (dropped, or renamed?)"


def _is_gone_why(why: str | None, name: str) -> bool:
    return bool(why) and why.startswith(f"attached table {name} is gone from ")


@contextmanager
def _open_attached(site: Site, gone_ok: bool = False, stop_gone: bool = False,
                   wait_ms: int = appdb.BUSY_TIMEOUT_MS
                   ) -> Iterator[tuple[appdb.Connection, dict[str, appdb.TableInfo]]]:
    """The attached file and its attached tables; one gone from the file is an error, or
    with ``gone_ok`` (detach) left out, or with ``stop_gone`` (a capture) left out and its
    capture stopped until it is back or detached: the other tables carry on, and
    'attached', 'status' and the metrics say why."""
    path, _seq = attached.attachment(site.conn)
    if not Path(path).exists():
        raise AttachError(f"the attached application database {path} is gone",
                          hint=back_or_detach(path))
    try:
        app = appdb.open_app(Path(path), wait_ms=wait_ms)
    except AttachBusyError:
        raise
    except AttachError as e:    # the hints of an attach do not apply to a file attached
        raise AttachError(e.message, hint=back_or_detach(path)) from None
    try:
        _refuse_other_owner(site, app, Path(path))
        # (detach and fsck, which leave out what is gone, ask themselves and act on it)
        why = None if gone_ok else _not_the_file(site, app, path)
        if why:
            raise AttachError(why, hint=_NOT_THE_FILE_HINT.format(path=arg(path)))
        infos = {}
        stopped = attached.stopped(site.conn) if stop_gone else {}
        unfinished = attached.creating(site.conn) if stop_gone else []
        names = attached.tables(site.conn)
        again = {}
        # parents first, as the attach made them: a child made before its parent was refused
        # (its foreign key named no table) and stopped as gone, for good
        for name in rows.fk_order({n: _parents_of(site, n) for n in unfinished
                                   if n in names and appdb.table_info(app, n) is None}):
            again[name] = _create_again(site, app, name)
        for name in names:
            t = again.get(name) or appdb.table_info(app, name)
            if t is None:
                if gone_ok:
                    continue
                if stop_gone:
                    if not _is_gone_why(stopped.get(name), name):
                        with site.write_txn() as conn:
                            attached.set_stopped(conn, name, _gone_why(name, path))
                    continue
                raise AttachError(_gone_why(name, path), hint=_gone_hint(path, name))
            infos[name] = t     # one back from being gone is taken back by sync_app
        if unfinished:
            with site.write_txn() as conn:
                attached.end_creating(conn, unfinished)
        appdb.skip_trigger_writes(app, attached.tables(site.conn))
        yield app, infos
    finally:
        app.close()


_NOT_THE_FILE_HINT = ("put back the file this site attached (a copy of it made after the attach "
                      "heals itself); to replicate this one instead, run \"syncpack detach {path}\" "
                      "and attach it again (its rows then join as this site's changes)")


def _not_the_file(site: Site, app: appdb.Connection, path: str, note: bool = True
                  ) -> str | None:
    """Why the file at ``path`` is not the one this site attached, or None.  A file once seen
    holding syncpack's tables and now without any is another database put in its place, or
    a copy made before the attach: compared with the store as a file whose tables were
    dropped, its rows would become this site's changes and every key it lacks a delete, at
    every site.  (Before it is first seen so, a file without them is one whose attach was
    interrupted before the file's commit: that is healed.)"""
    with appdb.read_txn(app):
        ours = appdb.has_syncpack_tables(app)
        owner = appdb.owner(app)
    seen = attached.file_seen(site.conn, path)
    if not ours and seen:
        return (f"{path} holds none of the tables and triggers syncpack keeps in the attached "
                f"file: it is not the file this site attached (another database put in its "
                f"place, or a copy of it made before the attach); nothing was captured from it "
                f"or written into it")
    if note and not seen and owner is not None and owner[0] == site.site_id:
        with site.write_txn() as conn:
            attached.note_file_seen(conn, path)
    return None


def _parents_of(site: Site, name: str) -> list[str]:
    """The tables the family's definition of ``name`` refers to."""
    d = _definition(site, name)
    sql = d.get("create_sql") if isinstance(d, dict) else None
    return appdb.definition_parents(name, sql) if isinstance(sql, str) else []


def _create_again(site: Site, app: appdb.Connection, name: str) -> appdb.TableInfo | None:
    """An attach that created ``name`` from the family's definition was stopped after the
    store's commit and before the file's: create it again (the store still has every record
    of it pending, and the table had no rows of its own to lose)."""
    d = _definition(site, name)
    if not isinstance(d, dict) or not isinstance(d.get("create_sql"), str):
        return None
    try:
        with appdb.write_txn(app):
            # checked as it was the first time, which this attach already passed
            appdb.create_table(app, name, d["create_sql"], replicated=None)
            t = appdb.table_info(app, name)
            if t is not None:
                appdb.install_capture(app, t, floor=attached.attachment(site.conn)[1])
                appdb.set_owner(app, site.site_id, str(site.path.resolve()))
    except AttachError:
        return None
    return t


def _gone_hint(path: str, name: str) -> str:
    return (f"rename it back, or run \"syncpack detach {arg(path)} --table {arg(name)}\" to stop "
            f"replicating it (its records stay in the family)")


def _cycle(site: Site, app: appdb.Connection, infos: dict[str, appdb.TableInfo]) -> dict:
    """Capture, then apply, under the application's write lock."""
    refused: list[str] = []
    with appdb.write_txn(app):
        infos = schema.review(site, app, infos)     # stopped tables are left out
        captured = capturing.heal(site, app, infos)
        captured += capturing.take_changes(site, app, infos)
        infos, grown = schema.follow(site, app, infos, refused)     # peers' new columns
        done, clashes = ({}, {})
        if attached.has_pending(site.conn):
            start = appdb.max_seq(app)
            done, clashes = applying.apply_pending(site, app, infos)
            applying.restore_here(site, app, infos, start, None)
            applying.intend(site, app, os.urandom(8), done, clashes)
        capturing.forget_taken(app, site)
    schema.record(site, grown)
    if done or clashes:
        applying.settle(site, done, clashes)
    return {"captured": captured, "applied": sum(done.values()),
            "clashes": sum(len(v) for v in clashes.values()), "refused": refused}


def _idle(site: Site, app: appdb.Connection, infos: dict[str, appdb.TableInfo],
          tidy: bool = True) -> bool:
    """Whether :func:`_cycle` would write nothing into the application's file: everything is
    captured and its change rows forgotten, no record waits to be written, the capture's
    triggers are all there and current, and no column of the family's is missing.

    Without ``tidy`` ('status', and a monitor scraping it every few seconds), change rows
    captured but not yet forgotten, and changes committed after the read snapshot, are no
    reason to write: the next export, import or capture takes them.  A write of syncpack's
    ends the snapshot of an application transaction that read and is about to write, which
    then fails at once (BUSY_SNAPSHOT), and a monitor must not make that routine."""
    att = attached.attachment(site.conn)
    if att is None:
        return True
    captured = att[1]
    if attached.has_pending(site.conn):
        return False
    if appdb.max_seq(app) < captured if not tidy else appdb.max_seq(app) != captured:
        return False    # (below it: the file went back, which heal must see to)
    if any(not appdb.has_capture(app, n) or not appdb.capture_current(app, t)
           for n, t in infos.items()):
        return False
    if schema.to_follow(site, infos):
        return False
    return not tidy or not appdb.has_forgettable(app, captured,
                                                 list(attached.stopped(site.conn)))


# How long a command that must answer (status) waits for the application's write lock.
BRIEF_WAIT_MS = 2_000


def sync_app(site: Site, *, wait: bool = True, lock_wait: bool = True) -> dict | None:
    """Capture the application's changes and write pending records into its tables: what
    'export', 'import', 'batch' and 'status' do first (and import after).  None when nothing
    is attached, or the site is busy with another command and ``wait`` is false, or it is
    recovering from a restore (local writes wait; the changes stay in the application's
    change table); ``{"busy": why}`` when ``wait`` is false and the application held its
    lock through the brief wait.  ``lock_wait`` false: another command holding the site is not waited for
    (it writes what is pending itself)."""
    if not is_attached(site) or site.state == "recovering":
        return None
    try:
        with site.lock(wait=wait and lock_wait):
            if not is_attached(site):
                return None
            try:
                doc = _sync_app_locked(site, wait)
            except AttachError as e:
                if not wait and isinstance(e, AttachBusyError):
                    # 'status': busy for a moment, no failure of the capture
                    return {"busy": e.message}
                with site.write_txn() as conn:
                    attached.note_failing(conn, e.message, e.hint, wall_ms())
                raise
            if attached.failing(site.conn) is not None:
                with site.write_txn() as conn:
                    attached.end_failing(conn)
            return doc
    except (LockedError, AttachError):
        # 'status' must answer even when the database is gone or busy; it shows that itself.
        if wait:
            raise
        return None


def _sync_app_locked(site: Site, wait: bool) -> dict:
    """:func:`sync_app` under the site lock."""
    not_created, created = _follow_new_tables(site)
    filled = sum(c["rows"] for c in created)
    # 'status' from cron or a monitor: a minute's wait for the application's lock would stall
    # it (twice: the capture, then the figures); they are then those of the last capture
    with _open_attached(site, stop_gone=True,
                        wait_ms=appdb.BUSY_TIMEOUT_MS if wait else BRIEF_WAIT_MS
                        ) as (app, infos):
        applying.recover(site, app)
        if appdb.store_behind(app, attached.attachment(site.conn)[1]):
            # said by 'attached', status and fsck until a refresh takes the rows
            with site.write_txn() as conn:
                attached.note_store_behind(conn, wall_ms())
        # The bulk of a capture under a read snapshot: the application keeps writing
        # (in WAL mode); the write lock is held only for what came in meanwhile and
        # for writing peers' records.
        back = [n for n, why in attached.stopped(site.conn).items()
                if n in infos and _is_gone_why(why, n)]
        with appdb.read_txn(app):
            infos = schema.review(site, app, infos, back)
            # A file gone back is compared whole under the write lock (capturing.heal): a
            # capture of its numbers now would take the application's new changes under
            # numbers the store already captured, and pass over the rest.
            went_back = capturing.file_went_back(site, app)
            early = sum(_take_back(site, app, infos[n]) for n in back if n in infos)
            if not went_back:
                early += capturing.take_changes(site, app, infos)
            idle = _idle(site, app, infos, tidy=wait) if not went_back else not wait
        if idle:
            # nothing to write: a write committed for nothing would still end the
            # read snapshot of an application transaction about to write (SQLite's
            # BUSY_SNAPSHOT, at once, whatever its busy timeout)
            return {"captured": early, "applied": filled, "clashes": 0,
                    "refused": not_created, "created": created}
        doc = _cycle(site, app, infos)
        doc["captured"] += early
        doc["applied"] += filled
        doc["refused"] = not_created + doc["refused"]
        doc["created"] = created
        return doc


def _take_back(site: Site, app: appdb.Connection, t: appdb.TableInfo) -> int:
    """A table that was gone from the file (renamed away, then back) is here again, as it was
    recorded.  Its change rows were kept while it was gone (``forget_taken`` leaves a stopped
    table's), but a capture reads only numbers above what the store captured, and the other
    tables' captures moved that on: its changes meanwhile are taken as a refresh takes them,
    and its capture resumes only in the same store commit as the last of them, so a crash in
    between takes them again (finding nothing new).  Returns the changes taken."""
    t = schema.with_dropped(site, t)
    taken = _capture_stopped(site, app, t)
    with site.transaction() as tx:
        taken += capturing.load_rows_in(site, tx, app, t, rescan=True)
        attached.set_stopped(site.conn, t.name, None)
    return taken


# New tables of the family one command creates here at most; the others stay 'available' and
# follow at the next commands (a member may publish thousands).
FOLLOW_AT_ONCE = 64


def _follow_new_tables(site: Site) -> tuple[list[str], list[dict]]:
    """A table another site attached, which this site's application does not have, is a schema
    change of the family: it is created from the family's definition and attached here, and its
    records are written into it (docs/attach.md).  A table the application already has (an
    unrelated table of that name), or one detached here (even if the application dropped it
    since), is left alone and stays 'available'.  Returns why each table whose definition
    this database refuses was not created, and the tables created (``{"table", "rows"}``)."""
    names = [n for n in schema.available(site) if n not in attached.detached_here(site.conn)]
    if not names:
        return [], []
    why: dict[str, str] = {}
    created: list[dict] = []
    path = Path(attached.attachment(site.conn)[0])
    app = appdb.open_app(path)
    try:
        # Again while a round creates one: a table whose foreign keys refer to another new
        # table is refused until that one exists (its inserts would all fail before).
        # SQLite's names ignore case: a peer's 'Items' beside this application's 'items'
        # is a table the application has (creating it failed at every capture)
        plain, virtual = appdb.user_tables(app)
        taken = {sqltext.fold(n) for n in [*plain, *virtual]}
        current = attached.tables(site.conn)
        ready = []
        for name in names:
            if sqltext.fold(name) in taken or appdb.table_info(app, name) is not None:
                continue
            problem = _check_table(site, app, name, current)
            if problem is not None:
                why[name] = problem
            elif len(ready) < FOLLOW_AT_ONCE:
                ready.append(name)
        try:
            # all at once, parents first: one by one, each attach reviewed every table
            # attached so far (a member's 400 tables took one import 142 s)
            if ready:
                created += _attach_locked(site, app, path, ready, False, unasked=True)["tables"]
            ready = []
        except AttachError:
            pass        # one of them is refused: one by one, to tell which
        names = ready
        while names:
            refused = []
            for name in names:
                try:
                    created += _attach_locked(site, app, path, [name], False,
                                              unasked=True)["tables"]
                    why.pop(name, None)
                except AttachError as e:
                    # A definition this database refuses (it is a peer's text): the records
                    # stay in the store, and the table stays 'available' for an
                    # administrator to see.
                    refused.append(name)
                    why[name] = e.message
            names = refused if len(refused) < len(names) else []
    finally:
        app.close()
    return ([f"table {n} of the family was not created here: {w}"
             for n, w in sorted(why.items())],
            [{"table": c["table"], "rows": c["rows"]} for c in created])


def capture(site: Site) -> dict:
    """``syncpack capture``: the application's committed changes into the changelog now (and
    pending records into the application's tables)."""
    if not is_attached(site):
        raise UsageError("no database is attached to this site",
                         hint="attach one with 'syncpack attach DB --table T'")
    doc = sync_app(site)
    if doc is None:
        raise UsageError(f"site {site.name!r} is recovering from a restore; local changes are "
                         f"captured once it has recovered",
                         hint="import packets from the peers ('syncpack status' shows what is "
                              "missing)")
    stopped = stopped_tables(site)
    if stopped:
        # The other tables were captured; this one waits until the change is rolled out.
        # (What was done is said too: a table created now is not created, nor said, again.)
        raise AttachError("; ".join([why for _n, why, _h in stopped]
                                    + [created_text(c) for c in doc.get("created", [])]),
                          hint=stopped[0][2])
    return doc


def created_text(c: dict) -> str:
    """What is said of a table of the family created in the attached file (``{"table",
    "rows"}`` of a capture's ``created``)."""
    return (f"created table {c['table']} in the attached database from the family's "
            f"definition ({c['rows']:,} row(s) written)")


def stopped_tables(site: Site) -> list[tuple[str, str, str]]:
    """(table, why, what to do) of each attached table whose capture a schema change stopped:
    its application's changes are not replicated until an administrator acts."""
    if not is_attached(site):
        return []
    path = attached.attachment(site.conn)[0]
    return [(n, why, _gone_hint(path, n) if _is_gone_why(why, n)
             else shapes.REFRESH_HINT.format(db=arg(path), table=arg(n)))
            for n, why in attached.stopped(site.conn).items()]


# --- attach and detach --------------------------------------------------------------------------

def _definition(site: Site, name: str) -> dict | None:
    v = site.get(TABLES, name, None)
    return v if isinstance(v, dict) else None


def attach(site: Site, db_path: str | os.PathLike, names: list[str],
           all_tables: bool = False) -> dict:
    """Start replicating tables of an application database (docs/attach.md)."""
    if not names and not all_tables:
        raise UsageError("name the tables with --table T (repeatable) or use --all-tables")
    if names and all_tables:
        raise UsageError("use either --table T... or --all-tables")
    path = _path(db_path)
    with site.lock():
        att = attached.attachment(site.conn)
        if att is not None and att[0] != str(path) and _same_file(att[0], path):
            raise AttachError(f"{path} is {att[0]} under another name, which site "
                              f"{site.name!r} has attached already",
                              hint=f"name it as it was attached: 'syncpack attach "
                                   f"{arg(att[0])} --table T'")
        if att is not None and att[0] != str(path):
            _refuse_copy(site, Path(att[0]))    # its own error says what this directory is
            raise AttachError(f"site {site.name!r} already has {att[0]} attached; a site "
                              f"replicates one application database",
                              hint=f"\"syncpack detach {arg(att[0])}\" first, or use another "
                                   f"site")
        app = appdb.open_app(path)
        try:
            if appdb.is_site_store(app):
                raise AttachError(f"{path} is a syncpack site's store, not an application's "
                                  f"database", hint="attach the SQLite database file the "
                                  "application writes; a store replicates by itself")
            _refuse_other_owner(site, app, path)
            return _attach_locked(site, app, path, names, all_tables)
        finally:
            app.close()


def _same_file(a: str | Path, b: str | Path) -> bool:
    """Whether paths ``a`` and ``b`` name one existing file (the same path, or the same file
    under another name: a hard link)."""
    try:
        return capturing.file_id(Path(a)) == capturing.file_id(Path(b))
    except OSError:
        return False


def _refuse_copy(site: Site, path: Path) -> None:
    """:func:`_refuse_other_owner` for the file this site has attached, if it can be read."""
    try:
        app = appdb.open_app(path)
    except AttachError:
        return
    try:
        _refuse_other_owner(site, app, path)
    finally:
        app.close()


def _refuse_other_owner(site: Site, app: appdb.Connection, path: Path) -> None:
    """One file, one site: the file names the site directory that attached it, and while the
    store there still attaches this file, no other directory captures it (it would take the
    application's changes out of the change table, and the site that exports them would never
    see them).  That directory is another site's, or this site's original when this one is a
    copy of it (``cp -a``).  A file whose site has gone, detached it or moved is taken over."""
    with appdb.read_txn(app):
        owner = appdb.owner(app)
    if owner is None:
        return
    other = Path(owner[1])
    try:
        if other.resolve() == site.path.resolve():
            return
    except OSError:
        return
    theirs = attached.attachment_in(other)
    if theirs is None or not _same_file(theirs, path):
        return
    if owner[0] == site.site_id:
        raise AttachError(
            f"this site directory ({site.path}) is a copy of the site at {other}, which "
            f"replicates {path}; a copy does not take its application's changes",
            hint=f"run syncpack with --site {arg(other)}; if this copy is to replace it, "
                 f"move or remove {arg(other)} first (a new site is made with 'syncpack "
                 f"keygen' and 'syncpack mkreplica', not by copying one)")
    raise AttachError(f"{path} is attached to the site at {other}; one application database "
                      f"is replicated by one site", hint=f"detach it there ('syncpack --site "
                      f"{arg(other)} detach {arg(theirs)}') or attach a copy here")


_NO_SUCH_TABLE_END = " (and no peer has attached one so named)"


def _check_table(site: Site, app: appdb.Connection, name: str, current: dict) -> str | None:
    """Why ``name`` cannot be attached, or None."""
    if name in current:
        return f"table {name} is already attached"
    # (a name starting with appdb.MAYBE would read as another table's notes in the change
    # table, which marks the keys a REPLACE may have removed that way)
    # SQLite matches names whatever their case: _SYNCPACK_x is a name of ours as well
    if sqltext.fold(name).startswith((SYS_PREFIX, appdb.TRIGGER_PREFIX, "sqlite_", appdb.MAYBE)):
        return f"table name {name!r} is reserved"
    try:
        check_collection(name)      # its rows travel as the collection of its name
    except InvalidNameError as e:
        return f"table name {name!r} cannot name a collection: {e}"
    t = appdb.table_info(app, name)
    d = _definition(site, name)
    stray = _not_only_rows(site, name, d) if d is not None else None
    if stray is not None:
        return stray
    if t is None:
        if appdb.is_view(app, name):
            return f"{name} is a view; only ordinary tables can be replicated"
        if d is None:
            plain, _virtual = appdb.user_tables(app)
            alike = [n for n in plain if sqltext.fold(n) == sqltext.fold(name)]
            if alike:
                # the table's own spelling names the collection at every site
                return (f"no table {name} in the database (names are matched exactly: did you "
                        f"mean {alike[0]}?)")
            return f"no table {name} in the database{_NO_SUCH_TABLE_END}"
        return None
    if t.virtual:
        return f"table {name} is a virtual table; only ordinary tables can be replicated"
    owner = appdb.shadow_of(app, name)
    if owner is not None:
        return (f"table {name} holds the data of virtual table {owner}, which alone may write "
                f"it; only ordinary tables can be replicated")
    if not t.pk:
        return f"table {name} has no declared PRIMARY KEY; a replicated row needs a key"
    if len(t.columns) > appdb.MAX_COLUMNS:
        return schema.too_wide(t)
    collated = _collated_key(app, t)
    if collated:
        return collated
    rolls = [n for n, kinds in appdb.raising_triggers(app, name).items() if "rollback" in kinds]
    if rolls:
        return (f"table {name} has a trigger ({', '.join(rolls)}) that can end the whole "
                f"transaction (RAISE(ROLLBACK)), which would undo every row syncpack writes "
                f"with the one it refuses; RAISE(ABORT) refuses that row alone")
    refused = appdb.unwritable(app, t)
    if refused:
        return (f"table {name} cannot be written outside the application: SQLite refuses "
                f"syncpack's statements on it ({refused}); a trigger, index, CHECK constraint "
                f"or generated column of it uses what only the application defines")
    nulls = appdb.null_key_rows(app, name, appdb.nullable_key(app, name))
    if nulls:
        return (f"table {name} has {nulls} row(s) with NULL in its primary key; a replicated "
                f"row needs a key (give them one, or delete them)")
    if d is None and attached.collection_used(site.conn, name):
        return f"table name {name} is already used by a collection of this family"
    if d is not None and list(d.get("pk", [])) != t.pk:
        return (f"table {name} is keyed by ({', '.join(t.pk)}) here but by "
                f"({', '.join(d.get('pk', []))}) in the family")
    return None


def _lacking_warning(t: appdb.TableInfo, defs: list) -> str | None:
    """A warning when ``t`` lacks columns of the family's table (definitions ``defs``) that
    no schema op adds here: those of the CREATE TABLE that made it.  Peers' rows carrying
    them wait until the table has them, or until the family accepts their drop (a column
    dropped on purpose, the refresh not yet run); said at once, not only as waiting records
    blamed on a peer adding a column."""
    lacking = _lacking(t, defs)
    if not lacking:
        return None
    return (f"table {t.name} lacks column(s) {', '.join(lacking)} of the family's table: "
            f"peers' rows holding them wait here until it has them (add them as "
            f"\"syncpack get '$tables' {t.name}\" shows), or until the family accepts "
            f"their drop ('attach --refresh' at every site, docs/attach.md 'Schema changes')")


def _lacking(t: appdb.TableInfo, defs: list) -> list[str]:
    """The columns of the family's table (definitions ``defs``) that ``t`` lacks and that
    the family never added by a schema op (which every site follows) nor dropped: those of
    the CREATE TABLE that made it."""
    here = {sqltext.fold(c) for c in t.columns}
    later = {sqltext.fold(op["column"]) for op in shapes.ops_of(defs)} | {
        sqltext.fold(c) for c in shapes.dropped_of(defs)}
    return [c for c in schema.declared_columns(t.name, defs, generated=False)
            if sqltext.fold(c) not in here | later]


def _not_only_rows(site: Site, name: str, d: dict) -> str | None:
    """Why the family's table ``name`` (definition ``d``) is not to be attached here: its
    collection holds records no such table could hold.  A definition published for a
    collection that holds other things (a lying member's, or two sites' names that met):
    followed, the application would get a table it never asked for, and this site's own
    writes to the collection would be refused."""
    stray = _record_not_a_row(site, name, list(d.get("pk", [])))
    if stray is None:
        return None
    return (f"the collection {name} holds records that are not rows of the family's table "
            f"{name} (key {stray!r}): that name is a collection of the family, not only a "
            f"table")


def _record_not_a_row(site: Site, name: str, pk: list[str], chunk: int = 4096) -> str | None:
    """The key of a record of collection ``name`` that no table keyed by ``pk`` could hold,
    or None: every record is a row of it (the first such key ends the scan)."""
    batch: list[tuple[str, object]] = []

    def first_refused() -> str | None:
        refused = rows.refused_records([v for _k, v in batch], [k for k, _v in batch], pk)
        return batch[min(refused)][0] if refused else None

    for _c, key, value in site.records(name, shown=True):
        if value is None:
            continue
        batch.append((key, value))
        if len(batch) >= chunk:
            found = first_refused()
            if found is not None:
                return found
            batch.clear()
    return first_refused() if batch else None


def _collated_key(app: appdb.Connection, t: appdb.TableInfo) -> str | None:
    """Why ``t``'s key cannot be replicated for its collation, or None.  A record's key is
    its exact text, while the table would hold keys its collation calls equal ('Bob' and
    'bob' under NOCASE) as one row: a peer's row would overwrite, or delete, another."""
    odd = appdb.key_collations(app, t)
    if not odd:
        return None
    col, coll = odd[0]
    return (f"table {t.name}'s key column {col} compares with COLLATE {coll}, and syncpack "
            f"keys rows by their exact text: two sites' keys that {coll} holds equal would "
            f"overwrite each other's rows (declare the key without COLLATE; a UNIQUE index on "
            f"({col} COLLATE {coll}) keeps the rule, and its clashes become conflicts)")


def _check_created(app: appdb.Connection, t: appdb.TableInfo | None, name: str,
                   d: dict) -> None:
    """A table made from the family's definition (a peer's text) must be what the definition
    says it is, keyed as its records are; else the caller's transaction of the application's
    file rolls back and nothing was created."""
    pk = d.get("pk")
    why = _collated_key(app, t) if t is not None and t.pk else None
    if why:
        raise AttachError(f"the family's definition of table {name!r} cannot be replicated: "
                          f"{why}; nothing was created",
                          hint="the site that attached the table may have published a wrong "
                               "definition; create the table yourself and attach it")
    if t is None or t.virtual or not t.pk or t.pk != pk:
        raise AttachError(
            f"the family's definition of table {name!r} does not create a table keyed by "
            f"({', '.join(map(str, pk or []))}); nothing was created",
            hint="the site that attached the table may have published a wrong definition; "
                 "create the table yourself and attach it")
    # as an administrator's table is refused (_check_table): created, every row written
    # into it, the application's own too, failed and stayed listed as a clash for good
    refused = appdb.unwritable(app, t)
    if refused:
        raise AttachError(
            f"the family's definition of table {name!r} makes a table SQLite refuses to "
            f"write here ({refused}); nothing was created",
            hint="the site that attached the table may have published a wrong definition; "
                 "create the table yourself and attach it")


def _attach_locked(site: Site, app: appdb.Connection, path: Path, names: list[str],
                   all_tables: bool, unasked: bool = False) -> dict:
    """``unasked``: a table of the family created here because a peer attached it, which may
    refer only to tables attached here: its rows, a peer's word, must not pin rows the
    application keeps to itself (an administrator's attach may)."""
    current = attached.tables(site.conn)
    skipped = []
    if all_tables:
        plain, virtual = appdb.user_tables(app)
        names = [n for n in plain if n not in current]
        if not names:
            raise AttachError(
                f"{path} has no table left to attach",
                hint="--all-tables takes the tables the file holds that are not attached yet; "
                     "to have a table of the family created here, name it with --table T "
                     "('syncpack attached' lists those available)")
        if virtual:
            # a full-text index and its own tables: the application writes them from its
            # tables (each site builds its own), and they cannot be replicated anyway
            skipped.append(f"left out virtual tables and their shadow tables: "
                           f"{', '.join(virtual)}")
    names = list(dict.fromkeys(names))
    why = {n: _check_table(site, app, n, current) for n in names}
    problems = [p for p in why.values() if p]
    appdb.skip_trigger_writes(app, [*current, *names])
    if problems:
        if all(n in current for n in names):
            hint = ("'syncpack attached' lists what is attached; 'attach DB --refresh' "
                    "accepts a changed definition")
        elif all(n in current for n, p in why.items() if p):
            again = [n for n in names if n in current]
            hint = (f"leave out --table {' --table '.join(map(arg, again))}: attached already "
                    f"('syncpack attached' lists what is)")
        elif any(p.endswith(_NO_SUCH_TABLE_END) for p in problems):
            hint = ("check the name ('sqlite3 DB .tables' lists them); a table another site "
                    "attached is created here once its packets are imported (its definition "
                    "travels with its records)")
        else:
            hint = ("docs/attach.md, 'What it needs', says what a table needs (a declared "
                    "PRIMARY KEY, a name no collection uses, ...)")
        raise AttachError("; ".join(problems) + "; nothing was attached", hint=hint)
    out, warnings = [], []
    with appdb.write_txn(app):
        infos = {}
        for n in current:
            t = appdb.table_info(app, n)
            if t is not None:
                infos[n] = t
        infos = schema.review(site, app, infos)
        capturing.take_changes(site, app, infos)     # what the attached tables hold so far, first
        created = set()
        missing = {n: _definition(site, n) for n in names if appdb.table_info(app, n) is None}
        # parents first, whatever order the tables were named in: a table is created only
        # where every table its foreign keys refer to is
        for n in rows.fk_order({n: appdb.definition_parents(n, d["create_sql"])
                                for n, d in missing.items()}):
            created.add(n)
            d = missing[n]
            appdb.create_table(app, n, d["create_sql"],
                               replicated=[*current, *names] if unasked else None)
            _check_created(app, appdb.table_info(app, n), n, d)
        new = {n: appdb.table_info(app, n) for n in names}
        odd_types = {n: rows.type_warning(n, new[n].affinity, made and made.affinity)
                     for n in names if (d := _definition(site, n)) is not None
                     for made in [appdb.declared(n, d["create_sql"])]}
        short = {n: _lacking_warning(new[n], schema.definitions(site, n))
                 for n in names if n not in created}
        added = {n: schema.unpublished(site, app, t) for n, t in new.items()}
        for t in new.values():
            appdb.install_capture(app, t)
        appdb.set_owner(app, site.site_id, str(site.path.resolve()))
        upto = appdb.max_seq(app)
        # One store transaction for the attachment, the definitions and the rows: a table
        # whose rows cannot be read (text that is not UTF-8, a damaged file) leaves the site
        # as it was, not attached to a table it never captured.
        with site.transaction() as tx:
            conn = site.conn
            if attached.attachment(conn) is None:
                attached.set_attachment(conn, str(path), upto)
                attached.note_file_seen(conn, None)     # until the file's commit below
            attached.set_captured(conn, upto)
            if created:
                attached.note_creating(conn, list(created))
            for n, t in new.items():
                attached.mark_all_pending(conn, n)
                attached.add_table(conn, n, t.pk, t.columns, t.create_sql)
                attached.set_shape(conn, n, schema.shape_of(t))
            for n, t in new.items():
                d = schema.definition(t, schema.definitions(site, n), added[n])
                family = _definition(site, n)
                if family is not None and n not in created:
                    # A site joining with a table of its own publishes the columns it adds,
                    # never its own CREATE TABLE: in place of the family's, a site attaching
                    # later was made that table (other types, a column short) and refused
                    # the other sites' rows for good.
                    d = {**d, **{k: family[k] for k in ("create_sql", "columns")
                                 if k in family}}
                if family != d:
                    tx.write_raw(TABLES, n, codec.encode_value(d))
            told: set[str] = set()
            for n, t in new.items():
                if n in created:
                    # detached here once, then dropped: its rows were not deleted one by
                    # one, the table is new and fills from the records like any other
                    attached.forget_detached(conn, n)
                tx.split()      # each table's rows a transaction of their own
                capturing.load_rows_in(site, tx, app, t, rescan=False)
                actions = [a for a in appdb.foreign_key_actions(app, n) if a not in told]
                told.update(actions)        # a key between two tables attached: said once
                for w in (rows.integer_key_warning(n, t.pk, t.affinity, t.create_sql),
                          rows.untyped_key_warning(n, t.pk, t.affinity),
                          rows.null_key_warning(n, appdb.nullable_key(app, n)),
                          rows.fk_action_warning(n, actions),
                          odd_types.get(n), short.get(n)):
                    if w:
                        warnings.append(w)
                out.append({"table": n, "rows": 0, "primary_key": t.pk})
            # the rows it held became this site's changes: that was its first capture
            attached.touch(conn, list(new), "last_capture_ms", wall_ms())
        # with the columns the family dropped, whose values older records still carry
        infos.update({n: schema.with_dropped(site, t) for n, t in new.items()})
        infos, grown = schema.follow(site, app, infos, [])
        done, clashes = applying.apply_pending(site, app, infos)
        capturing.forget_taken(app, site)
    with site.write_txn() as conn:
        attached.note_file_seen(conn, str(path))
        if created:
            # these alone: another attach's, stopped between its two commits, are still
            # to be made again (_open_attached)
            attached.end_creating(conn, created)
    schema.record(site, grown)
    applying.settle(site, done, clashes)
    with appdb.read_txn(app):
        for o in out:
            o["rows"] = appdb.count_rows(app, o["table"])
    return {"database": str(path), "tables": out, "warnings": skipped + warnings}


def _named_tables(site: Site, path: Path, names: list[str] | None, current: dict,
                  done: str) -> list[str]:
    """The attached tables a command names (all of them by default), or why not; the caller
    holds the site lock."""
    att = attached.attachment(site.conn)
    if att is not None and att[0] != str(path) and _same_file(att[0], path):
        raise AttachError(f"{path} is {att[0]} under another name; nothing was {done}",
                          hint=f"name it as it was attached: {arg(att[0])}")
    if att is None or att[0] != str(path):
        raise AttachError(f"{path} is not attached to site {site.name!r}",
                          hint="'syncpack attached' shows what is")
    names = list(dict.fromkeys(names)) if names else list(current)
    unknown = [n for n in names if n not in current]
    if unknown:
        raise AttachError(f"table(s) {', '.join(unknown)} are not attached; nothing was "
                          f"{done}", hint="'syncpack attached' lists them")
    return names


def detach(site: Site, db_path: str | os.PathLike, names: list[str] | None = None) -> dict:
    """Stop replicating tables (all of them by default): their changes are captured one last
    time, the triggers go, the rows stay in place, the records stay in the family."""
    path = _path(db_path)
    with site.lock():
        current = attached.tables(site.conn)
        names = _named_tables(site, path, names, current, "detached")
        applying.recover(site)
        if not path.exists() or appdb.is_other_file(path):
            # The file was moved or deleted (or another, no database, stands in its place):
            # nothing of ours is left to remove from it, and its changes not yet captured
            # went with it.
            with site.write_txn() as conn:
                for n in names:
                    attached.remove_table(conn, n)
            return {"database": str(path), "detached": names}
        with _open_attached(site, gone_ok=True) as (app, infos):
            if _not_the_file(site, app, attached.attachment(site.conn)[0], note=False):
                # as for a file gone: nothing of ours is in it to capture or remove, and
                # its rows are no record of what this site's application did
                with site.write_txn() as conn:
                    for n in names:
                        attached.remove_table(conn, n)
                return {"database": str(path), "detached": names}
            if site.state != "recovering":
                _cycle(site, app, infos)
            # The store's transaction around the application's: the rows are read as the
            # triggers go, and a crash after the application's commit leaves the table
            # attached without triggers, which the next command heals.
            with site.write_txn() as conn, appdb.write_txn(app):
                stopped = attached.stopped(conn)
                for n in names:
                    # A stopped table without its capture (the application dropped and made
                    # it again) changed unseen: no row of it is known to be left as it was.
                    known = n not in stopped or appdb.has_capture(app, n)
                    appdb.drop_capture(app, n)
                    if n in infos and known:
                        attached.remember_detached(conn, n, str(path), capturing.file_id(path),
                                                   _as_left(site, app, infos[n]),
                                                   infos[n].columns)
                    attached.remove_table(conn, n)
                if set(names) == set(current):
                    appdb.drop_capture_tables(app)
    return {"database": str(path), "detached": names}


def _as_left(site: Site, app: appdb.Connection, t: appdb.TableInfo
             ) -> Iterator[tuple[str, bytes, bytes]]:
    """(key, CSNs of the versions its row has seen, digest of the row's record) of each row
    of ``t`` as it is detached: what a capture would compare it with.

    A table whose capture a schema change stopped holds changes no capture took (their keys
    wait in the change table): such a row is left with no digest, so attached again it is
    the application's change, and such a key gone from the table is left too, as a row the
    application deleted.  Taken as rows left as they were, the rows inserted meanwhile were
    deleted from the table, and the updates never replicated."""
    conn = site.conn
    changed = (set(capturing.changed_keys(app, t)) if t.name in attached.stopped(conn)
               else set())

    def shown(keys: list[str]) -> dict[str, bytes]:
        current = attached.versions_for(conn, t.name, keys)
        unseen = attached.unseen_for(conn, t.name, keys)
        return {k: b"".join(c for c, _v in current.get(k, ()) if c not in unseen.get(k, ()))
                for k in keys}

    seen: set[str] = set()
    for items in capturing.scanned(app, t):
        held = shown([k for k, _r in items])
        for key, raw in items:
            if key in changed:
                seen.add(key)
                yield key, held[key], b""
            else:
                yield key, held[key], capturing.digest(raw)
    for key, csns in shown(sorted(changed - seen)).items():
        if csns:        # a row the application deleted meanwhile
            yield key, csns, b""


def _capture_stopped(site: Site, app: appdb.Connection, t: appdb.TableInfo) -> int:
    """The keys of ``t`` changed while its capture was stopped and still waiting for peers'
    records: each current row (or its absence) becomes a local op concurrent with the
    versions the application has not seen, as capture makes it.  (The other changed keys are
    found by the refresh's comparison of the whole table.)  Returns the ops written."""
    conn = site.conn
    # the columns the family dropped, and those the recorded table has and ``t`` lacks (a
    # refresh accepting their drop)
    dropped = schema.with_dropped(site, t).dropped | (
        set(attached.tables(conn)[t.name]["columns"]) - set(t.columns))
    pending = set(attached.pending_keys(conn, t.name))
    keys = {k: v for k, v in capturing.changed_keys(app, t).items() if k in pending}
    if not keys:
        return 0
    current = attached.versions_for(conn, t.name, list(keys))
    unseen = attached.unseen_for(conn, t.name, list(keys))
    replaced = chain.replaced_of_many(conn, set().union(*unseen.values()))
    gone = dropped if dropped and site.policy_of(t.name) == "merge" else None
    # what the unseen versions replaced, which the row still shows where nothing else is
    under = chain.values_of_many(conn, {r for rs in replaced.values() for r in rs}) \
        if gone else {}
    batch = []
    for key, vals in keys.items():
        raw = capturing.record_of(t, appdb.fetch_row(app, t, vals))
        vs = current.get(key, ())
        u = unseen.get(key, set())
        seen = [c for c, _v in vs if c not in u]
        if gone:
            # (one version two unseen ones both replaced is one record the row shows)
            below = {r for c in u for r in replaced.get(c, ()) if r in under}
            base = (capturing.shown_record(site, t.name, key, vs, u) if seen else
                    under[below.pop()] if len(below) == 1 else None)
            raw = capturing.merge_write(raw, base, None, gone)
        if seen and len(seen) == len(vs) and any(v == raw for c, v in vs):
            continue
        # the row still shows what the unseen versions replaced: as a capture, the op
        # supersedes those too, or under 'merge' a peer's concurrent edit of another field
        # lost to the row's old value of it
        batch.append((key, raw, capturing.shown(vs, u, replaced)))
    # as a capture refuses them (a small batch goes to the changelog unsealed: the export
    # that sealed it failed, then every later one)
    reader.check_sizes(t, [k for k, _r, _v in batch], [r for _k, r, _v in batch])
    with site.transaction() as tx:
        attached.begin_capturing(conn)
        tx.write_many(t.name, batch)
        attached.end_capturing(conn)
    return len(batch)


def refresh(site: Site, db_path: str | os.PathLike, names: list[str] | None = None) -> dict:
    """``attach DB --refresh``: accept the tables' current definitions (after a change rolled
    out at every site, docs/attach.md "Schema changes"): each becomes the recorded one and
    travels to the peers, capture of it resumes, and the whole table is compared with the
    store, so every change made meanwhile becomes a local op."""
    path = _path(db_path)
    with site.lock():
        current = attached.tables(site.conn)
        names = _named_tables(site, path, names, current, "refreshed")
        if site.state == "recovering":
            raise UsageError(f"site {site.name!r} is recovering from a restore; refresh once "
                             f"it has recovered")
        out = []
        with _open_attached(site) as (app, infos):
            problems = [f"table {n} has no declared PRIMARY KEY" for n in names
                        if not infos[n].pk]
            problems += [schema.too_wide(infos[n]) for n in names
                         if len(infos[n].columns) > appdb.MAX_COLUMNS]
            # as attach refuses it: taken, peers' rows became clashes and the next capture
            # stopped the table again
            problems += [why for n in names if infos[n].pk
                         and (why := _collated_key(app, infos[n]))]
            if problems:
                raise AttachError("; ".join(problems) + "; nothing was refreshed")
            with appdb.write_txn(app):
                live = schema.review(site, app, infos)
                capturing.take_changes(site, app, live)       # what can be captured as usual, first
                for n in names:
                    t = appdb.table_info(app, n)
                    old_cols = set(current[n]["columns"])
                    if n not in live:
                        _capture_stopped(site, app, t)
                    prev = schema.definitions(site, n)
                    d = schema.definition(t, prev, dropped=old_cols - set(t.columns))
                    with site.transaction() as tx:
                        if _definition(site, n) != d or len(prev) > 1:
                            tx.write_raw(TABLES, n, codec.encode_value(d))
                        attached.set_shape(site.conn, n, schema.shape_of(t), t.columns, t.pk,
                                           t.create_sql)
                        attached.set_stopped(site.conn, n, None)
                    # no capture at all (the application made the table again): a row
                    # whose key has a peer record waiting may hold a change no trigger saw
                    unseen = not appdb.has_capture(app, n)
                    appdb.install_capture(app, t)       # the key may have changed
                    live[n] = schema.with_dropped(site, t)
                    changes = capturing.load_rows(site, app, live[n], rescan=True,
                                                  waiting_too=unseen)
                    out.append({"table": n, "columns": t.columns, "primary_key": t.pk,
                                "changes": changes})
                live, grown = schema.follow(site, app, live, [])
                done, clashes = applying.apply_pending(site, app, live)
                capturing.forget_taken(app, site)
            schema.record(site, grown)
            applying.settle(site, done, clashes)
            if set(names) == set(current):
                with site.write_txn() as conn:
                    attached.end_store_behind(conn)     # every row taken as it is
    return {"database": str(path), "refreshed": out}


# --- reports ------------------------------------------------------------------------------------

STORE_BEHIND = ("the store was found behind this file (restored from an older copy?): "
                "changes the application made before that restore may be only in its tables; "
                "once the site has recovered from its peers, 'attach DB --refresh' takes the "
                "tables' rows as they are, as this site's changes")


def report(site: Site, wait_ms: int = BRIEF_WAIT_MS) -> dict:
    """What is attached, per table: rows, changes not yet captured, last capture and apply;
    the family's tables not attached here; why the file cannot be read, if it cannot."""
    att = attached.attachment(site.conn)
    if att is None:
        return {"database": None, "busy": None, "tables": [], "available": schema.available(site),
                "problem": None, "file_behind": None, "store_behind": None, "failing": None}
    path, since = att
    tables = attached.tables(site.conn)
    counts: dict[str, int] | None = {}
    row_counts: dict[str, int | None] = {n: None for n in tables}
    problem = busy = file_behind = None
    stopped = attached.stopped(site.conn)
    try:
        # never a long wait: 'status' from a monitor must answer while the application
        # holds its lock (the figures are then unknown, and said to be)
        app = appdb.open_app(Path(path), wait_ms=wait_ms)
    except AttachBusyError as e:
        app, busy, counts = None, e.message, None
    except AttachError as e:
        app, problem = None, e.message
    if app is not None:
        try:
            problem = _not_the_file(site, app, path, note=False)
            with appdb.read_txn(app):
                if problem is None and capturing.file_went_back(site, app):
                    file_behind = _behind_store(path)
                counts = appdb.pending_counts(app, since, stopped)
                for n in tables:
                    if appdb.has_table(app, n):
                        row_counts[n] = appdb.count_rows(app, n)
        except AttachBusyError as e:
            counts, busy = None, e.message
            row_counts = {n: None for n in tables}
        finally:
            app.close()
    return {"database": path, "busy": busy, "tables": [
        {"table": n, "rows": row_counts[n],
         "pending": None if counts is None else counts.get(n, 0),
         "to_apply": attached.pending_count(site.conn, n),
         "waiting": attached.waiting_count(site.conn, n, appdb.WAITING),
         "stopped": stopped.get(n),
         "last_capture": d["last_capture_ms"], "last_apply": d["last_apply_ms"]}
        for n, d in tables.items()], "available": schema.available(site), "problem": problem,
        "file_behind": file_behind,
        "store_behind": STORE_BEHIND if attached.store_behind_since(site.conn) else None,
        "failing": attached.failing(site.conn)}


def check_values(site: Site, collection: str, records: list[tuple[str, object]]) -> None:
    """Refuses, before anything is written, records ``(key, value)`` written here for an
    attached table that the table cannot hold as given: a value that is not a row of it (not
    an object, a column it lacks, key columns other than the key: the table would refuse it,
    and every site would list it as a conflict), or a value the table would store as another
    one (SQLite converts by the column's type affinity: the record would say "7", the table
    7, and the sites would disagree)."""
    here = attached.tables(site.conn).get(collection)
    if here is not None:
        made = appdb.declared(collection, here["create_sql"])
        rowid = made and made.rowid_key
        _check_rows(collection, here["pk"], here["columns"], records, rowid is not None,
                    made.generated if made else frozenset())
        computed = made.computed if made else {}
        for k, v in records:
            text = isinstance(v, dict) and computed and appdb.lacks_computed(v, computed)
            if text:
                raise AttachError(f"the value for key {k!r} is not a whole row of attached "
                                  f"table {collection}: {text}; nothing was written",
                                  hint="give every column of the row")
        odd = [(k, v[rowid]) for k, v in records if isinstance(v, dict) and rowid in v
               and (not isinstance(v[rowid], int) or isinstance(v[rowid], bool))]
        if odd:
            raise AttachError(
                f"the value for key {odd[0][0]!r} is not a row of attached table "
                f"{collection}: its key column {rowid} is an INTEGER PRIMARY KEY, which holds "
                f"only integers, and {json.dumps(odd[0][1])} is none; nothing was written",
                hint=f"use an integer key, e.g. syncpack put {arg(collection)} 7 "
                     f"'{{\"{rowid}\": 7, ...}}'")
    shape = attached.shapes(site.conn).get(collection, (None, None))[0]
    if shape is not None:
        affinity = dict(map(tuple, shape["columns"]))
    else:
        # not attached here, but a peer's table: its definition says how it stores values
        # (what a row of it is is not checked here: the definition may be a member's lie
        # over a collection the family writes, tests/test_attach.py)
        d = _definition(site, collection) if not collection.startswith(SYS_PREFIX) else None
        made = appdb.declared(collection, d["create_sql"]) \
            if isinstance(d, dict) and isinstance(d.get("create_sql"), str) else None
        affinity = made and made.affinity
        if not affinity:
            return
    found = writer.conversions(affinity, [v for _k, v in records if isinstance(v, dict)])
    if found:
        c, v, stored = found[min(found)]
        raise AttachError(
            f"column {c} of attached table {collection} has {affinity[c]} affinity: "
            f"{json.dumps(v)} would be stored as {json.dumps(stored)}; nothing was "
            f"written", hint="write the value as the table stores it")


def _row_example(key: str, pk: list[str], integer_key: bool) -> str:
    """A row of record key ``key`` (its key columns; '...' for the rest), as JSON."""
    values = (rows.decode_key(key, ["BLOB"] * len(pk)) if key.startswith("[") else
              (int(key),) if integer_key and key.lstrip("-").isdigit() else (key,))
    if values is None or len(values) != len(pk) or any(isinstance(v, bytes) for v in values):
        return "{" + ", ".join(f"{json.dumps(c)}: ..." for c in pk) + ", ...}"
    return "{" + ", ".join(f"{json.dumps(c)}: {json.dumps(v)}"
                           for c, v in zip(pk, values)) + ", ...}"


def _check_rows(name: str, pk: list[str], columns: list[str],
                records: list[tuple[str, object]], integer_key: bool = False,
                generated: frozenset[str] = frozenset()) -> None:
    """:func:`check_values`'s refusal of records that are no row of table ``name`` (a JSON
    null among them: a record, not a delete)."""
    refused = rows.refused_records([v for _k, v in records], [k for k, _v in records], pk)
    if refused:
        at = min(refused)
        key, value = records[at]
        plural = "s" if len(pk) > 1 else ""
        why = ("it is not an object of the table's columns" if refused[at] == rows.NOT_A_ROW
               else f"its key column{plural} {', '.join(pk)} must hold the key")
        hint = f"give the row as an object, e.g. {_row_example(key, pk, integer_key)}"
        if isinstance(value, dict) and all(c in value for c in pk):
            try:
                own = rows.encode_key(tuple(value[c] for c in pk))
            except (TypeError, ValueError):
                own = None
            if own is not None and own != key:
                # a REAL or composite key is spelt as a JSON array ([{"real":"1.5"}])
                hint = (f"the row's key column{plural} make{'' if plural else 's'} the record "
                        f"key {own}: give that key, or key columns that make {key}")
        raise AttachError(
            f"the value for key {key!r} is not a row of attached table {name}: {why}; "
            f"nothing was written", hint=hint)
    known = set(columns)
    for key, value in records:
        odd = next(((c, v) for c, v in value.items() if not storable(v)), None)
        if odd is not None:
            raise AttachError(
                f"column {odd[0]!r} of the record for key {key!r} holds {json.dumps(odd[1])}, "
                f"which no SQLite column can hold (attached table {name}); nothing was written",
                hint="give each column a number (integers within 64 bits), a string or null; "
                     "BLOBs are written by the application")
        extra = [c for c in value if c not in known]
        if extra and extra[0] in generated:
            raise AttachError(
                f"column {extra[0]!r} of attached table {name} is generated (SQLite computes "
                f"it from the others); the record for key {key!r} names it; nothing was "
                f"written", hint=f"leave it out; the columns a row gives: {', '.join(columns)}")
        if extra:
            raise AttachError(
                f"attached table {name} has no column {extra[0]!r} (the record for key "
                f"{key!r} names it); nothing was written",
                hint=f"add the column to the table first (ALTER TABLE ... ADD COLUMN), or "
                     f"leave it out; its columns: {', '.join(columns)}")


def storable(v: object) -> bool:
    """Whether SQLite can hold ``v`` as one value: no list or map, no integer beyond 64 bits."""
    if isinstance(v, (list, dict)):
        return False
    return not isinstance(v, int) or -(1 << 63) <= v < (1 << 63)


# fsck's words for rows no key names, which no capture, refresh or apply ever touches.
NOT_REPLICATED = ", which are never replicated"
_GIVE_A_KEY = ("give each row with NULL in a key column a key, or delete it, and declare the "
               "key columns NOT NULL (docs/attach.md, 'Keys that are never NULL')")


def _behind_store(path: str) -> str:
    return (f"attached database {path} is behind the store (restored from an older copy?): "
            f"the next capture writes the newer records into it again, and a row the "
            f"application changed since becomes a conflict")


def check_hint(site: Site, problems: list[str]) -> str:
    """What to do when fsck finds only attached tables unlike the records (``problems``: rows
    written where the capture could not see them): take the tables' rows as they are, as
    this site's changes, which then travel to the peers; a row with no whole key is no
    record, and only the application can give it one."""
    if all(p.endswith(NOT_REPLICATED) for p in problems):
        return _GIVE_A_KEY
    path, captured = attached.attachment(site.conn)
    try:
        app = appdb.open_app(Path(path))
    except AttachError:
        return back_or_detach(path)
    try:
        foreign = _not_the_file(site, app, path, note=False)
        with appdb.read_txn(app):
            behind = capturing.file_went_back(site, app)
            gone = [n for n in attached.tables(site.conn) if not appdb.has_table(app, n)]
    finally:
        app.close()
    if foreign:
        return _NOT_THE_FILE_HINT.format(path=arg(path))
    if gone:
        return _gone_hint(path, gone[0])
    if behind:
        # A refresh here would take the old rows as this site's changes and roll the whole
        # family back to them; the capture's own path writes the newer records in again.
        return ("run 'syncpack capture' (or any export or import): it writes the "
                "newer records into the restored file again, and a row the application "
                "changed since the restore becomes a conflict (docs/attach.md)")
    hint = (f"'syncpack attach {arg(path)} --refresh' takes the attached tables' rows as they "
            f"are, as this site's changes (docs/attach.md)")
    if site.state == "recovering":
        # a refresh is refused until then: the rows may be behind what the peers send back
        hint = ("import the peers' packets until the site has recovered from its restore "
                "('syncpack status' says what it waits for); then " + hint)
    if any(p.endswith(NOT_REPLICATED) for p in problems):
        hint += "; and " + _GIVE_A_KEY
    return hint


def clash_list(site: Site, collection: str | None = None) -> list[tuple[str, str, str]]:
    """(table, key, constraint message) of each visible record the local schema refused."""
    if not is_attached(site):
        return []
    return [(c, k, t) for c, k, t, _at in attached.clashes(site.conn, collection)]


def versions(site: Site, collection: str, key: str) -> list[Version]:
    """The surviving versions of a key, for a clash that is not a version conflict."""
    return [Version(c, v is None, v) for c, v in attached.versions_of(site.conn, collection, key)]


def clash_of(site: Site, collection: str, key: str) -> str | None:
    return attached.clash_of(site.conn, collection, key) if is_attached(site) else None


def check(site: Site) -> list[str]:
    """fsck: each attached table equals the visible records, except keys still on their way
    (changes not captured yet, records not applied yet) and clashes, which are counted."""
    att = attached.attachment(site.conn)
    if att is None:
        return []
    problems: list[str] = []
    path, since = att
    try:
        ctx = _open_attached(site, gone_ok=True)
        app, infos = ctx.__enter__()
    except AttachError as e:
        return [f"attached database: {e.message}"]
    foreign = _not_the_file(site, app, path, note=False)
    if foreign:
        ctx.__exit__(None, None, None)
        return [f"attached database: {foreign}"]
    stopped = set(attached.stopped(site.conn))
    problems += [_gone_why(n, path) for n in attached.tables(site.conn) if n not in infos]
    if attached.store_behind_since(site.conn):
        problems.append(STORE_BEHIND.replace("this file", f"the attached database {path}"))
    try:
        with appdb.read_txn(app):
            if capturing.file_went_back(site, app):
                return [_behind_store(path)]
            for name, t in infos.items():
                if name in stopped:
                    continue        # 'attached' and 'status' show why; refresh compares it
                if not appdb.has_capture(app, name):
                    problems.append(f"attached table {name} has lost its capture triggers "
                                    f"or syncpack's tables in the file (the next capture "
                                    f"puts them back and compares the whole table)")
                    continue
                skip = set(attached.pending_keys(site.conn, name))
                skip |= attached.inflight_keys(site.conn, name)
                skip |= {k for c, k, _t, _a in attached.clashes(site.conn, name)}
                single = len(t.pk) == 1
                defaults = appdb.constant_defaults(app, t)
                for _s, key_vals, _r in appdb.changed_rows(app, t, since, 1 << 62):
                    skip.add(rows.encode_key(key_vals, single))
                # Two passes in chunks, so memory stays flat in the table's rows: each row
                # against its key's visible record, then each visible record's row found.
                bad = []
                sizer = rows.PartSizer(capturing.CAPTURE_CHUNK, reader.CAPTURE_BYTES)
                key_at = [t.columns.index(c) for c in t.pk]
                for part in rows.chunks(appdb.scan(app, t), sizer.rows):
                    sizer.saw(len(part), rows.text_bytes(part))
                    recs = [dict(zip(t.columns, row)) for row in part]
                    keys = rows.keys_at(part, key_at)
                    current = attached.versions_for(site.conn, name, keys)
                    for key, rec in zip(keys, recs):
                        if key in skip:
                            continue
                        v = capturing.visible(site, name, current.get(key, []), key)
                        if v is None or v.value is None or not rows.same_row(
                                codec.shown_value(v.value), rec, defaults):
                            bad.append(key)
                aff = [t.affinity.get(c, "BLOB") for c in t.pk]
                for key, vs in capturing.grouped(attached.visible_candidates(site.conn, name)):
                    if key in skip:
                        continue
                    if any(len(vals) == len(t.pk) and appdb.fetch_row(app, t, vals) is not None
                           for vals in rows.key_candidates(key, aff)):
                        continue                # the first pass compared it
                    v = capturing.visible(site, name, vs, key)
                    if v is not None and v.value is not None:
                        bad.append(key)
                bad.sort()
                for key in bad[:10]:
                    problems.append(f"attached table {name}: row {key} differs from the "
                                    f"visible record")
                if len(bad) > 10:
                    problems.append(f"attached table {name}: ... and {len(bad) - 10} more rows")
                keyless = appdb.null_key_rows(app, name, appdb.nullable_key(app, name))
                if keyless:
                    problems.append(f"attached table {name}: {keyless} row(s) with NULL in "
                                    f"the primary key{NOT_REPLICATED}")
    finally:
        ctx.__exit__(None, None, None)
    return problems
