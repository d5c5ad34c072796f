"""Attach, capture, apply, detach: an application's own SQLite tables as collections.

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
- an import (:class:`DirectApply`) holds that lock, captures first, and writes rows whose new
  version is their key's only one as the store inserts them (a large import's in a child
  process that took the lock over, attach/writer.py), leaving a mark of their CSNs in
  the same store transaction; the application commits only if every mark committed, and only
  then are the marks dropped.  Marks found later (a crash) make their keys pending again
  (:func:`_recover`, before any capture).

The lock order is always the application's file, then the store; every step holds the site's
own lock (one syncpack command at a time works on an attachment).
"""

from __future__ import annotations

import hashlib
import json
import os
from contextlib import contextmanager, nullcontext
from dataclasses import replace
from itertools import chain as joined, compress, repeat
from pathlib import Path
from typing import Iterator

from syncpack import children
from syncpack.attach import reader, rows, schema, shapes, writer
from syncpack.errors import AttachError, InvalidNameError, LockedError, UsageError, arg
from syncpack.format import blocks, codec
from syncpack.format.csn import csn_origin, csn_origins, split_csns
from syncpack.pipeline import Pending, Worker
from syncpack.rules.conflict import Version, pick
from syncpack.site import SYS_PREFIX, TABLES, Site, check_collection, wall_ms
from syncpack.store import appdb, attached, chain, fields

# An attach's initial rows travel as replication transactions of at most this many rows, as
# 'load' cuts them.
ATTACH_TXN_OPS = 100_000
ATTACH_TXN_BYTES = 32 * 1024 * 1024
# Keys looked up in the store per round trip while capturing, rows written per statement
# batch while applying.
CAPTURE_CHUNK = 10_000
APPLY_CHUNK = 10_000
# A write this large goes in with the table's capture triggers dropped for its duration
# (appdb.capture_paused), a capture this large with the store's versions triggers dropped
# (attached.pause_triggers); smaller ones are not worth a schema change.
PAUSE_CAPTURE_AT = 1_000


def _path(db_path: str | os.PathLike) -> Path:
    return Path(db_path).expanduser().resolve()


def is_attached(site: Site) -> bool:
    return attached.attachment(site.conn) is not None


def back_or_detach(path: str) -> str:
    """What to do when the attached file is gone, or another file stands in its place."""
    return (f"put the application's database back at {path} (from its backup), or run "
            f"'syncpack detach {arg(path)}' to stop replicating it (the records stay in the "
            f"family)")


def _gone_why(name: str, path: str) -> str:
    return f"attached table {name} is gone from {path} (dropped, or renamed?)"


def _is_gone_why(why: str | None, name: str) -> bool:
    return bool(why) and why.startswith(f"attached table {name} is gone from ")


@contextmanager
def _open_attached(site: Site, gone_ok: bool = False, stop_gone: bool = False
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
        app = appdb.open_app(Path(path))
    except AttachError as e:    # the hints of an attach do not apply to a file attached
        raise AttachError(e.message, hint=back_or_detach(path)) from None
    try:
        _refuse_other_owner(site, app, Path(path))
        infos = {}
        stopped = attached.stopped(site.conn) if stop_gone else {}
        unfinished = attached.creating(site.conn) if stop_gone else []
        for name in attached.tables(site.conn):
            t = appdb.table_info(app, name)
            if t is None and name in unfinished:
                t = _create_again(site, app, name)
            if t is None:
                if gone_ok:
                    continue
                if stop_gone:
                    if not _is_gone_why(stopped.get(name), name):
                        with site.write_txn() as conn:
                            attached.set_stopped(conn, name, _gone_why(name, path))
                    continue
                raise AttachError(_gone_why(name, path), hint=_gone_hint(path, name))
            if _is_gone_why(stopped.get(name), name):
                # back (renamed back): its changes meanwhile were kept in the change table
                with site.write_txn() as conn:
                    attached.set_stopped(conn, name, None)
            infos[name] = t
        if unfinished:
            with site.write_txn() as conn:
                attached.end_creating(conn, unfinished)
        appdb.skip_trigger_writes(app, attached.tables(site.conn))
        yield app, infos
    finally:
        app.close()


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
    return (f"rename it back, or run 'syncpack detach {arg(path)} --table {arg(name)}' to stop "
            f"replicating it (its records stay in the family)")


# --- capture ------------------------------------------------------------------------------------

def _record(t: appdb.TableInfo, row: tuple | None) -> bytes | None:
    return None if row is None else codec.encode_value(dict(zip(t.columns, row)))


def _visible(site: Site, name: str, vs: list[tuple[bytes, bytes | None]],
             key: str | None = None) -> Version | None:
    versions = [Version(c, v is None, v) for c, v in vs]
    if not versions:
        return None
    if len(versions) == 1:
        return versions[0]
    policy = site.policy_of(name)
    if policy == "merge" and key is not None:
        # per column: the merged row (docs/design.md §7), under the newest CSN's name
        raw = fields.visible_value(site.conn, name, key, versions, site.priorities())
        return Version(max(c for c, _v in vs), raw is None, raw)
    return pick(versions, policy, site.priorities())


def _capture(site: Site, app: appdb.Connection, infos: dict[str, appdb.TableInfo]) -> int:
    """Move the application's committed changes into the changelog; the caller holds the
    site lock and a transaction on ``app`` (read or write).  Returns changes captured.

    Everything up to the snapshot is ONE replication transaction, so no application
    transaction is ever split; a large one is sealed as parts while it is read
    (Transaction.write_columns), which keeps memory flat and lifts the limits of a block."""
    att = attached.attachment(site.conn)
    if att is None:
        return 0
    since = att[1]
    upto = appdb.max_seq(app)
    if upto <= since:
        return 0
    now = wall_ms()
    conn = site.conn
    written = 0
    infos = {n: replace(t, by_change=True) if appdb.self_deleting_triggers(app, t) else t
             for n, t in infos.items()}
    # A large backlog is read on the other core (reader.Elsewhere), started before the store's
    # transaction so that its start-up and SQLite's grouping overlap ours.
    elsewhere = (reader.Elsewhere(att[0], list(infos.values()), since, upto,
                                  appdb.schema_version(app))
                 if upto - since >= reader.ELSEWHERE_AT else None)
    try:
        # Nothing a capture makes is cyclic, but its allocations set the collector off again
        # and again, each time walking every live object (1M rows: 1.5 s of 15).
        with blocks.gc_paused(), site.transaction() as tx:
            written = _capture_in(site, tx, app, infos, since, upto, elsewhere)
            attached.set_captured(conn, upto)
            attached.touch(conn, list(infos), "last_capture_ms", now)
            if upto - since >= PAUSE_CAPTURE_AT:
                attached.resume_triggers(conn)
            attached.end_capturing(conn)
    finally:
        if elsewhere is not None:
            elsewhere.close()
    return written


def _capture_in(site: Site, tx, app: appdb.Connection, infos: dict[str, appdb.TableInfo],
                since: int, upto: int, elsewhere: reader.Elsewhere | None) -> int:
    """The ops of :func:`_capture`, written in its store transaction ``tx``."""
    conn = site.conn
    written = 0
    attached.begin_capturing(conn)
    if upto - since >= PAUSE_CAPTURE_AT:
        attached.pause_triggers(conn)
    any_pending = attached.has_pending(conn)
    # A table's first capture into an empty collection needs no look-ups.
    used = {n: attached.collection_used(conn, n) for n in infos}
    # Under 'merge', a column added since a row's record was written holds its default in
    # the row, and the record lacks it: written back unchanged, it is no change of that
    # column (sent as one, it overrode a peer's real edit of the column).
    defaults = {n: appdb.constant_defaults(app, t) for n, t in infos.items()
                if used[n] and site.policy_of(n) == "merge" and schema.has_added_columns(site, n)}
    for name, t in infos.items():
        parts = elsewhere.changes() if elsewhere else reader.changes(app, t, since, upto)
        for keys, raws in parts:
            if not used[name] and not any_pending:
                # Nothing held for these keys: a row is new, a key born and gone is
                # nothing.
                if None in raws:
                    keep = [r is not None for r in raws]
                    keys, raws = list(compress(keys, keep)), list(compress(raws, keep))
                tx.write_columns(name, keys, raws)
                written += len(keys)
                continue
            current = attached.versions_for(conn, name, keys) if used[name] else {}
            unseen = attached.unseen_for(conn, name, keys) if any_pending else {}
            replaced = chain.replaced_of_many(conn, set().union(*unseen.values()))
            bk: list[str] = []
            br: list[bytes | None] = []
            bv: list[bytes] = []
            untouched = defaults.get(name)
            for key, raw in zip(keys, raws):
                vs = current.get(key, ())
                if untouched and raw is not None and len(vs) == 1 and vs[0][1] is not None:
                    raw = rows.without_unset(raw, vs[0][1], untouched)
                if len(vs) == 1 and vs[0][1] == raw or (raw is None and not vs):
                    continue    # nothing new (written back as it was, or born and gone)
                u = unseen.get(key, ())
                bk.append(key)
                br.append(raw)
                bv.append(b"".join(_shown(vs, u, replaced)))
            tx.write_columns(name, bk, br, bv)
            written += len(bk)
    return written


def _shown(vs: list[tuple[bytes, bytes | None]], unseen: set[bytes] | tuple,
           replaced: dict[bytes, list[bytes]]) -> list[bytes]:
    """The CSNs of the versions a row shows, which a capture of it supersedes: the key's
    surviving versions but those not yet written into the table (``unseen``: arrived, waiting
    for a column or a clash), and, beneath those, the versions they replaced, which the row
    still shows.  Without the latter, an edit of a row whose peer record waits replaced
    nothing it was based on: under 'merge' every field it kept became a conflict with that
    record, and a peer with priority reverted the edit."""
    shown = [c for c, _v in vs if c not in unseen]
    if not unseen:
        return shown
    known = set(shown) | set(unseen)    # each unseen version's own replaced are looked at
    for c in unseen:
        for r in replaced.get(c, ()):
            if r not in known:
                known.add(r)
                shown.append(r)
    return shown


def _forget(app: appdb.Connection, site: Site) -> None:
    att = attached.attachment(site.conn)
    if att is not None:
        # A stopped table's changes stay: its refresh needs the keys changed meanwhile.
        stopped = list(attached.stopped(site.conn))
        appdb.forget_changes(app, att[1], stopped)


# --- apply --------------------------------------------------------------------------------------

def _apply(site: Site, app: appdb.Connection, infos: dict[str, appdb.TableInfo]
           ) -> tuple[dict[str, int], dict[str, dict[str, str]]]:
    """Write every pending key's visible record into the application's tables; the caller
    holds the write lock of ``app``.  Returns (rows written, clashes) per table; every
    pending key of a table named in either was handled (only counts are kept, and the keys
    are streamed, so memory does not grow with them)."""
    conn = site.conn
    done: dict[str, int] = {}
    clashes: dict[str, dict[str, str]] = {}
    order = rows.fk_order({n: t.parents for n, t in infos.items()})
    has_deletes: list[str] = []
    stuck: dict[str, dict[str, bytes]] = {}
    for name in order:
        t = infos[name]
        w = appdb.Writer(app, t)
        parts = rows.chunks(attached.pending_visible(conn, name, w.row_marks), APPLY_CHUNK)
        first = next(parts, None)
        if first is None:
            continue
        done.setdefault(name, 0)
        # a table marked row by row keeps its triggers: they capture what its own triggers
        # delete beside the rows written
        big = len(first) >= PAUSE_CAPTURE_AT and not w.row_marks
        with appdb.capture_paused(app, t) if big else nullcontext():
            for part in joined([first], parts):
                if _apply_part(site, w, part, done, clashes, stuck):
                    has_deletes.append(name)
    if stuck:
        _apply_together(app, infos, order, stuck, done, clashes)
    # Deletes after every put, children before their parents: a second pass over the keys.
    refused: dict[str, dict[str, tuple]] = {}
    for name in reversed(order):
        if name not in has_deletes:
            continue
        t = infos[name]
        w = appdb.Writer(app, t)
        for part in rows.chunks(attached.pending_visible(conn, name, w.row_marks), APPLY_CHUNK):
            for key, v in _visible_part(site, name, part):
                if v is not None:
                    continue
                key_vals = writer.row_key(w, key)
                err = w.delete(key_vals) if key_vals is not None else None
                if err:
                    clashes.setdefault(name, {})[key] = err
                    if err.startswith("FOREIGN KEY") and \
                            sum(map(len, refused.values())) < TOGETHER_MAX:
                        refused.setdefault(name, {})[key] = key_vals
                else:
                    done[name] += 1
    if refused:
        # rows whose deferred foreign keys refer to each other, deleted together
        names = [n for n in reversed(order) if n in refused]
        if appdb.delete_group([(appdb.Writer(app, infos[n]), list(refused[n].values()))
                               for n in names]):
            for n in names:
                done[n] += len(refused[n])
                for k in refused[n]:
                    clashes[n].pop(k, None)
                if not clashes[n]:
                    del clashes[n]
    if stuck and has_deletes:
        # a row that takes a UNIQUE value from a row its transaction deleted
        _apply_together(app, infos, order, stuck, done, clashes)
    return done, clashes


def _visible_part(site: Site, name: str, part: list[tuple[str, int, bytes | None]]
                  ) -> list[tuple[str, bytes | None]]:
    """(key, visible value or None) of a chunk of :func:`attached.pending_visible`."""
    several = {k: _visible(site, name, attached.versions_of(site.conn, name, k), k)
               for k, n, _v in part if n > 1}
    return [(k, v if n < 2 else getattr(several[k], "value", None)) for k, n, v in part]


def _apply_part(site: Site, w: appdb.Writer, part: list[tuple[str, int, bytes | None]],
                done: dict[str, int], clashes: dict[str, dict[str, str]],
                stuck: dict[str, dict[str, bytes]]) -> bool:
    """Write the live records of one chunk of (key, number of versions, the value if exactly
    one) of table ``w.t``; returns whether it holds deletes (they go after all puts).  The
    records a UNIQUE or FOREIGN KEY constraint refused go to ``stuck`` too, for
    :func:`_apply_together` (up to :data:`TOGETHER_MAX`)."""
    name = w.t.name
    vis = _visible_part(site, name, part)
    keys = [k for k, v in vis if v is not None]
    raws = [v for _k, v in vis if v is not None]
    why = writer.write_batch(w, keys, raws)
    for i, text in why.items():
        clashes.setdefault(name, {})[keys[i]] = text
        if text.startswith(_TOGETHER_MAY_HELP) and \
                sum(map(len, stuck.values())) < TOGETHER_MAX:
            stuck.setdefault(name, {})[keys[i]] = raws[i]
    done[name] = done.get(name, 0) + len(keys) - len(why)
    return any(v is None for _k, v in vis)


# Refusals that rows written together may avoid (a swap of UNIQUE values, rows whose deferred
# foreign keys point at each other): a CHECK or NOT NULL is about the row alone.
_TOGETHER_MAY_HELP = ("UNIQUE constraint failed", "FOREIGN KEY constraint failed")
# Refused rows held for writing together; past this many, the rest stay clashes as before.
TOGETHER_MAX = 100_000


def _apply_together(app: appdb.Connection, infos: dict[str, appdb.TableInfo],
                    order: list[str], stuck: dict[str, dict[str, bytes]],
                    done: dict[str, int], clashes: dict[str, dict[str, str]]) -> None:
    """A transaction the origin could commit is never split at a peer by the order its rows
    are written here: rows refused one at a time are tried again all together (tables in
    foreign-key order); if that fails, without the rows that break a constraint even beside
    all the others (a real clash in the same packet must not hold back a swap, or rows whose
    deferred foreign keys point at each other); then each table's together.  Those that go
    in are no longer clashes."""
    def group(names: list[str], leave: dict[str, set[int]] | None = None
              ) -> list[tuple[appdb.Writer, list[dict]]]:
        leave = leave or {}
        return [(appdb.Writer(app, infos[n]),
                 [codec.decode_value(r) for i, r in enumerate(stuck[n].values())
                  if i not in leave.get(n, ())]) for n in names]

    def written(names: list[str], leave: dict[str, set[int]] | None = None) -> None:
        leave = leave or {}
        for n in names:
            keys = [k for i, k in enumerate(stuck[n]) if i not in leave.get(n, ())]
            for k in keys:
                del stuck[n][k]
                clashes[n].pop(k, None)
            done[n] += len(keys)
            if not stuck[n]:
                del stuck[n]
            if not clashes[n]:
                del clashes[n]

    names = [n for n in order if n in stuck]
    delete_first = {n for n in names if not appdb.deletes_reach_further(app, n)}
    if appdb.write_group(group(names), delete_first):
        written(names)
        return
    hopeless = dict(zip(names, appdb.refused_even_together(group(names), delete_first)))
    if any(hopeless.values()) and any(len(hopeless[n]) < len(stuck[n]) for n in names) \
            and appdb.write_group(group(names, hopeless), delete_first):
        written(names, hopeless)
        return
    if len(names) > 1:
        for n in names:
            if appdb.write_group(group([n]), delete_first):
                written([n])


def _grouped(cur) -> Iterator[tuple[str, list[tuple[bytes, bytes | None]]]]:
    key, vs = None, []
    for k, csn, value in cur:
        if k != key:
            if key is not None:
                yield key, vs
            key, vs = k, []
        if csn is not None:
            vs.append((csn, value))
    if key is not None:
        yield key, vs


def _outcome(done: dict[str, int], clashes: dict[str, dict[str, str]]
             ) -> dict[str, dict[str, str]]:
    return {name: clashes.get(name, {}) for name in set(done) | set(clashes)}


def _intend(site: Site, app: appdb.Connection | None, token: bytes, done: dict[str, int],
            clashes: dict[str, dict[str, str]],
            written: dict[str, list[str]] | None = None) -> bool:
    """Before the application's commit of an apply: its outcome in the store, and ``token``
    in the application's transaction, so that :func:`_recover` can settle it after a crash
    between the two commits.  Whether there was anything to note."""
    if not (done or clashes or written):
        return False
    with site.write_txn() as conn:
        attached.note_settling(conn, token, _outcome(done, clashes), written or {})
    if app is not None:
        appdb.note_applied(app, token)
    return True


def _settle(site: Site, done: dict[str, int], clashes: dict[str, dict[str, str]],
            written: dict[str, list[str]] | None = None) -> None:
    """After the application's commit: every pending key of the tables applied was handled
    (the site lock kept others from adding any), so only the clashes stay pending (retried on
    every apply, listed by 'conflicts'); an earlier clash not refused again is gone.  The keys
    in ``written`` were written and are no longer pending."""
    with site.write_txn() as conn:
        _settled(conn, _outcome(done, clashes), written or {}, wall_ms())
        attached.end_settling(conn)


def _settled(conn, settle: dict[str, dict[str, str]], written: dict[str, list[str]],
             now: int) -> None:
    for name, refused in settle.items():
        attached.settle_pending(conn, name, refused, now)
    attached.touch(conn, set(settle), "last_apply_ms", now)
    for name, keys in written.items():
        attached.written_keys(conn, name, keys, now)


def _recover(site: Site, app: appdb.Connection | None = None) -> None:
    """An import that wrote rows straight into the application and did not finish (a crash,
    an interruption, a packet rolled back) left marks; their keys are pending again.  Runs
    before any capture, so a local change made since is concurrent with those versions.

    Marks of an import whose application transaction did commit (its token is in the file,
    ``app``: a crash between that commit and the marks' removal) just go: those rows are in
    the application's tables, and a change it made to them since is no conflict."""
    if attached.has_inflight(site.conn) or attached.settling(site.conn):
        with site.write_txn() as conn:
            intent = attached.settling(conn)
            if app is not None:
                tokens = attached.inflight_tokens(conn) | ({intent[0]} if intent else set())
                for token in appdb.applied_tokens(app, tokens):
                    attached.clear_inflight(conn, token)
                    if intent and token == intent[0]:
                        _settled(conn, intent[1], intent[2], wall_ms())
            attached.end_settling(conn)
            attached.recover_inflight(conn)


class DirectApply:
    """During an import, the rows of attached tables go into the application's tables as the
    store inserts them, not through per-key pending marks read back afterwards.

    Made under the site lock: it takes the application's write lock, captures first (so no
    committed application change is ever overwritten before it is in the changelog), then,
    for each batch the store inserts in bulk (:func:`attached.note_new_versions`), writes the
    rows whose new version is their key's only one and notes every other key pending (a
    delete, a conflict, a row the local schema refuses: the ordinary apply after the import
    handles those).  Each batch written leaves a mark of its CSN range in the same store
    transaction.  :meth:`finish` commits the application's transaction only if every mark is
    committed (no packet was rolled back after its rows were written), then drops the marks;
    a crash or an interruption at any point leaves the marks, and :func:`_recover` makes
    their keys pending again.  Inactive when nothing is attached.

    An import of :data:`writer.ELSEWHERE_AT` ops or more hands the writing to a child process
    (attach/writer.py) once the capture is committed: this process sends each batch's
    records as they are and marks it at once; the rows the child answers it did not write
    become pending; the child commits when :meth:`finish` would.  A child that declines or
    cannot start leaves the writing here; one that dies leaves its batches to the marks."""

    def __init__(self, site: Site, expected_ops: int = 0):
        self.site = site
        self.app: appdb.Connection | None = None
        self.child: writer.Elsewhere | None = None
        if not is_attached(site) or site.state == "recovering":
            return
        path, _seq = attached.attachment(site.conn)
        try:
            app = appdb.open_app(Path(path))
        except AttachError:
            _recover(site)
            return      # the ordinary apply after the import reports it
        try:
            _recover(site, app)
            appdb.skip_trigger_writes(app, attached.tables(site.conn))
            tables = {}
            for name in attached.tables(site.conn):
                t = appdb.table_info(app, name)
                if t is None:
                    app.close()
                    return
                tables[name] = t
            infos = self._begin(app, tables)
            if expected_ops >= writer.ELSEWHERE_AT:
                # a large import: the rows are written by a child process, which takes the
                # application's write lock over once ours, with the capture, is committed
                upto, version = appdb.max_seq(app), appdb.schema_version(app)
                appdb.end_write(app, True)
                self.child = writer.Elsewhere(path, list(infos), list(tables), upto,
                                              version, PAUSE_CAPTURE_AT)
                if not self.child:      # the application wrote meanwhile: as ever, here
                    self.child = None
                    infos = self._begin(app, tables)
        except BaseException:
            app.close()
            raise
        self.app, self.infos = app, infos
        self.writers = {n: appdb.Writer(app, t) for n, t in infos.items()}
        self.paused: set[str] = set()
        self.written: set[str] = set()
        self.token = os.urandom(8)
        self.marks = 0
        self.child_lost = False
        # the child decodes its own batches: a thread here only when the rows are written here
        self.decoder = None if self.child else Worker("syncpack-decode-rows").__enter__()
        attached.set_direct(site.conn, self._sink, self._prepare)

    def _begin(self, app: appdb.Connection, tables: dict[str, appdb.TableInfo]
               ) -> dict[str, appdb.TableInfo]:
        """Take the application's write lock and capture; the tables to write into."""
        site = self.site
        appdb.begin_write(app)
        try:
            # as _cycle does; peers' new columns are added by the apply after the import
            # (a record that needs one waits for it there)
            infos = schema.review(site, app, tables)     # stopped tables are left out
            _heal(site, app, infos)
            _capture(site, app, infos)
            _forget(app, site)
        except BaseException:
            appdb.end_write(app, False)
            raise
        return infos

    def _prepare(self, raws: list[bytes | None]) -> Pending | None:
        """The records ``raws`` (one table's, about to be inserted into the store) decoded on
        another thread while SQLite inserts them (it does so without the GIL)."""
        if self.decoder is None or None in raws:
            return None
        return self.decoder.submit(codec.decode_records, raws)

    def _sink(self, name: str, keys: list[str], csns: list[bytes], raws: list[bytes | None],
              prepared: Pending | None = None) -> None:
        later = self._write(name, keys, csns, raws, prepared.result() if prepared else None)
        if later:
            attached.mark_pending(self.site.conn, later)
        if self.child is not None:
            refused = self._refused(wait=False)
            if refused:
                attached.mark_pending_held(self.site.conn, refused)

    def _refused(self, wait: bool) -> list[tuple[str, str, bytes]]:
        """The rows the child did not write, of the batches it has answered (``wait``: of
        all); the ordinary apply retries them.  A child gone leaves its batches to the
        marks."""
        if self.child_lost:
            return []
        try:
            return self.child.refused(wait)
        except children.ChildEnded:
            self.child_lost = True
            return []

    def _write(self, name: str, keys: list[str], csns: list[bytes], raws: list[bytes | None],
               values: list | None = None) -> list[tuple[str, str, bytes]]:
        """Writes the records ``raws`` of ``keys`` (new versions ``csns`` of table ``name``)
        that can go straight in; returns the (collection, key, csn) of the others, for the
        ordinary apply.  ``values``: the records, decoded already."""
        conn = self.site.conn
        w = self.writers.get(name)
        if w is None:
            return list(zip(repeat(name), keys, csns))
        later: list[tuple[str, str, bytes]] = []
        several = attached.several_versions(conn, name, keys)
        if several or None in raws:
            keep = [r is not None and k not in several for k, r in zip(keys, raws)]
            later = [(name, k, c) for k, c, ok in zip(keys, csns, keep) if not ok]
            keys, csns, raws = (list(compress(keys, keep)), list(compress(csns, keep)),
                                list(compress(raws, keep)))
            if values is not None:
                values = list(compress(values, keep))
        if not keys:
            return later
        if self.child is not None:     # it decodes, checks and writes them
            if self.child_lost:
                return later + list(zip(repeat(name), keys, csns))
            try:
                self.child.put(name, keys, raws, csns)
            except children.ChildEnded:
                self.child_lost = True
                return later + list(zip(repeat(name), keys, csns))
            self._mark(name, csns)
            return later
        not_written = writer.write_batch(w, keys, raws, values, self.paused, PAUSE_CAPTURE_AT)
        if not_written:     # the ordinary apply retries them and records why
            later += [(name, keys[i], csns[i]) for i in sorted(not_written)]
            csns = [c for i, c in enumerate(csns) if i not in not_written]
            if not csns:
                return later
        self._mark(name, csns)
        return later

    def _mark(self, name: str, csns: list[bytes]) -> None:
        """The store's mark of rows (new versions ``csns`` of table ``name``) written into the
        application's open transaction."""
        one = len(csn_origins(csns)) == 1
        origin = csn_origin(csns[0])
        attached.add_inflight(self.site.conn, self.token, self.marks, name,
                              origin if one else None, min(csns), max(csns))
        self.marks += 1
        self.written.add(name)

    def _unhook(self) -> None:
        """No more rows from the store's inserts; the decoding thread, if any, stopped."""
        attached.set_direct(self.site.conn, None)
        if self.decoder is not None:
            self.decoder.__exit__(None, None, None)
            self.decoder = None

    def finish(self) -> None:
        """After the import's last store commit: commit the rows written, if all of them
        belong to committed store transactions."""
        if self.app is None:
            return
        site, app = self.site, self.app
        self._unhook()
        done: dict[str, int] = {}
        clashes: dict[str, dict[str, str]] = {}
        written: dict[str, list[str]] = {}
        try:
            if self.child is not None:
                ok, written = self._finish_child()
            else:
                ok = attached.inflight_count(site.conn, self.token) == self.marks
                if ok:
                    for name in self.paused:
                        appdb.install_capture(app, self.infos[name])
                    if attached.has_pending(site.conn):
                        # The rest of what arrived (deletes, keys in conflict, rows to try
                        # again) in the same application transaction: committed apart, a
                        # peer's transaction that deletes rows and inserts others showed in
                        # the application half done until the second commit (or, after a
                        # crash between the two, until the next command).
                        done, clashes = _apply(site, app, self.infos)
                    if not _intend(site, app, self.token, done, clashes) and self.marks:
                        appdb.note_applied(app, self.token)
                appdb.end_write(app, ok)
        finally:
            self.close()
        if ok and self.marks:
            with site.write_txn() as conn:
                attached.clear_inflight(conn, self.token)
                attached.touch(conn, self.written, "last_apply_ms", wall_ms())
        if ok and (done or clashes or written):
            _settle(site, done, clashes, written)

    def _finish_child(self) -> tuple[bool, dict[str, list[str]]]:
        """:meth:`finish` of rows the child wrote: its answers in, the rows it refused
        pending (committed before the application's file, like the marks), the keys still
        pending written by it too, then its commit.  Returns whether it committed, and the
        pending keys it wrote (cleared in the store after the commit)."""
        refused = self._refused(wait=True)
        if refused:
            with self.site.write_txn() as conn:
                attached.mark_pending_held(conn, refused)
        ok = (not self.child_lost
              and attached.inflight_count(self.site.conn, self.token) == self.marks)
        written: dict[str, list[str]] = {}
        try:
            if ok and attached.has_pending(self.site.conn):
                written = self._pending_to_child()
            # the token goes in the child's transaction (writer.Elsewhere.end)
            noted = ok and _intend(self.site, None, self.token, {}, {}, written)
            token = self.token if self.marks or noted else None
            return (self.child.end(ok, token) and ok), written
        except children.ChildEnded:
            return False, {}

    def _pending_to_child(self) -> dict[str, list[str]]:
        """The keys still pending (deletes, keys in conflict, rows to try again) written by
        the child in its one transaction, as the importing process writes them before its
        commit: committed apart, a peer's transaction that deletes rows and inserts others
        showed in the application half done.  Puts parents first, then deletes children
        first; a row refused stays pending (the ordinary apply after records why, and writes
        rows that need each other together).  Returns the keys written, per table."""
        site, conn = self.site, self.site.conn
        order = rows.fk_order({n: t.parents for n, t in self.infos.items()})
        sent: list[tuple[str, list[str]]] = []
        deletes: list[tuple[str, list[str]]] = []
        for name in order:
            by_csn = self.writers[name].row_marks
            for part in rows.chunks(attached.pending_visible(conn, name, by_csn), APPLY_CHUNK):
                vis = _visible_part(site, name, part)
                keys = [k for k, v in vis if v is not None]
                if keys:
                    self.child.put(name, keys, [v for _k, v in vis if v is not None],
                                   [b""] * len(keys))
                    sent.append((name, keys))
                gone = [k for k, v in vis if v is None]
                if gone:
                    deletes.append((name, gone))
        for name, gone in reversed(deletes):
            self.child.delete(name, gone)
            sent.append((name, gone))
        refused = {(t, k) for t, k, _c in self.child.refused(wait=True)}
        written: dict[str, list[str]] = {}
        for name, keys in sent:
            written.setdefault(name, []).extend(k for k in keys if (name, k) not in refused)
        return written

    def close(self) -> None:
        """Without :meth:`finish` (an error): nothing written stays; the marks of what the
        store committed make those keys pending again at the next capture."""
        if self.app is None:
            return
        self._unhook()
        try:
            if self.child is not None:
                self.child.close()      # uncommitted, its transaction rolls back
            else:
                appdb.end_write(self.app, False)
        finally:
            self.app.close()
            self.app = None


def _heal(site: Site, app: appdb.Connection, infos: dict[str, appdb.TableInfo]) -> int:
    """A table whose capture is missing (a crash inside attach, the application dropped and
    re-created the table, or someone dropped syncpack's tables in the file) or not current
    (an older release's triggers, which missed what later ones capture; a UNIQUE index the
    application dropped): put it back and compare the whole table with the store, so
    whatever changed unseen becomes local ops.

    A file whose change numbers are below what the store captured went back in time (it was
    restored from a backup, or the change table emptied): see :func:`_went_back`.  Returns
    the changes of the application's it took."""
    since = attached.attachment(site.conn)[1]
    taken = 0
    went_back = appdb.went_back(app, since)
    for name, t in infos.items():
        there = appdb.has_capture(app, name)
        if there and not went_back and not appdb.capture_current(app, t):
            appdb.install_capture(app, t)
            taken += _load_rows(site, app, t, rescan=True)
        elif went_back or not there:
            changed = appdb.kept_keys(app, t) if went_back else []
            appdb.install_capture(app, t, floor=since)
            appdb.set_owner(app, site.site_id, str(site.path.resolve()))
            if went_back:
                with site.transaction() as tx:
                    taken += _went_back(site, tx, app, t, changed)
            else:
                taken += _load_rows(site, app, t, rescan=True)
    return taken


def _went_back(site: Site, tx, app: appdb.Connection, t: appdb.TableInfo,
               changed: list[tuple]) -> int:
    """The application's file went back: a row that differs from its visible record is the
    backup's (the store holds what came after it, its own and the peers'), and gets the
    visible record again, unless the application changed its key since (a key in the change
    table ``changed``; the restored rows and the new ones cannot be told apart there).  Such a
    row becomes this site's op concurrent with the visible record: a conflict that
    'conflicts' lists, so neither the application's write nor the newer record is lost
    unseen."""
    conn, name, single = site.conn, t.name, len(t.pk) == 1
    try:
        changed_keys = {rows.encode_key(tuple(k), single) for k in changed}
    except (TypeError, ValueError):
        changed_keys = set()
    pending = set(attached.pending_keys(conn, name))
    defaults = appdb.constant_defaults(app, t)
    again: list[tuple[str, str, bytes]] = []
    mine: list[tuple[str, bytes | None, list[bytes]]] = []
    seen: set[str] = set()

    def shows(key: str, vs: list, raw: bytes | None) -> bool:
        v = _visible(site, name, vs, key)
        if v is None or v.value is None:
            return raw is None
        return raw is not None and rows.same_row(codec.shown_value(v.value),
                                                 codec.decode_value(raw), defaults)

    for items in _scanned(app, t):
        seen.update(k for k, _r in items)
        current = attached.versions_for(conn, name, [k for k, _r in items if k not in pending])
        for key, raw in items:
            if key in pending or shows(key, list(current.get(key, ())), raw):
                continue
            if key in changed_keys:
                mine.append((key, raw, []))
            else:
                again.append((name, key, b""))
    for key, vs in _grouped(attached.visible_candidates(conn, name)):
        if key in seen or key in pending or shows(key, vs, None):
            continue
        if key in changed_keys:
            mine.append((key, None, []))
        else:
            again.append((name, key, b""))
    attached.begin_capturing(conn)
    for i in range(0, len(mine), ATTACH_TXN_OPS):
        if i:
            tx.split()
        tx.write_many(name, mine[i:i + ATTACH_TXN_OPS])
    attached.end_capturing(conn)
    attached.mark_pending(conn, again)
    return len(mine)


def _load_rows(site: Site, app: appdb.Connection, t: appdb.TableInfo, rescan: bool) -> int:
    """Rows of ``t`` that differ from the store become local ops.  At attach they are
    concurrent with whatever the store holds (``rescan=False``); on a rescan they replace what
    the application had seen.  Keys the store holds and the table lacks are deleted on a
    rescan only."""
    with site.transaction() as tx:
        return _load_rows_in(site, tx, app, t, rescan)


def _scanned(app: appdb.Connection, t: appdb.TableInfo) -> Iterator[list[tuple[str, bytes]]]:
    """(record key, record) of every row of ``t``, in parts of about
    :data:`reader.CAPTURE_BYTES` (rows.PartSizer), so memory stays flat in the rows and in
    their sizes."""
    sizer = rows.PartSizer(CAPTURE_CHUNK, reader.CAPTURE_BYTES)
    keyed_records = rows.named_keyed_records(t.columns, t.pk)
    for part in rows.chunks(appdb.scan(app, t, named=True), sizer.rows):
        keys, raws = keyed_records(part)
        reader.check_sizes(t, keys, raws)
        sizer.saw(len(raws), sum(map(len, raws)))
        yield list(zip(keys, raws))


def _load_rows_in(site: Site, tx, app: appdb.Connection, t: appdb.TableInfo,
                  rescan: bool) -> int:
    """:func:`_load_rows` in the caller's store transaction ``tx``."""
    conn = site.conn
    name = t.name
    n = 0
    attached.begin_capturing(conn)
    size = 0
    seen_keys: set[str] = set()
    pending = set(attached.pending_keys(conn, name)) if rescan else set()
    # Attached again, from the file it was detached from: a row as it was left is no change
    # of the application's (the records that arrived meanwhile are written over it), and one
    # the application changed meanwhile replaces what the row showed then, as a capture would.
    path = attached.attachment(conn)[0]
    left = None if rescan else attached.detached_rows(conn, name, path, _file_id(Path(path)))
    as_left: list[tuple[str, str, bytes]] = []
    defaults = appdb.constant_defaults(app, t) if rescan else None
    for items in _scanned(app, t):
        if rescan:
            seen_keys.update(k for k, _r in items)
            items = [(k, r) for k, r in items if k not in pending]
        current = attached.versions_for(conn, name, [k for k, _r in items])
        batch = []
        for key, raw in items:
            vs = current.get(key, ())
            was = left.pop(key, None) if left is not None else None
            if was is not None and _digest(raw) == was[1]:
                as_left.append((name, key, b""))
                continue
            if len(vs) == 1 and (vs[0][1] == raw or rescan and vs[0][1] is not None
                                 and rows.same_row(codec.shown_value(vs[0][1]),
                                                   codec.decode_value(raw), defaults)):
                continue
            if rescan and len(vs) > 1:
                # a key in conflict whose row shows the visible record: no change of the
                # application's, and the conflict stays for 'conflicts resolve'
                v = _visible(site, name, list(vs), key)
                if v is not None and v.value is not None and rows.same_row(
                        codec.shown_value(v.value), codec.decode_value(raw), defaults):
                    continue
            if rescan:
                replaced = [c for c, _v in vs]
            elif was is not None:
                shown = set(split_csns(was[0]))
                replaced = [c for c, _v in vs if c in shown]
            else:
                replaced = []
            if tx.seq + len(batch) >= ATTACH_TXN_OPS or size >= ATTACH_TXN_BYTES:
                tx.write_many(name, batch)
                batch = []
                tx.split()
                size = 0
            size += len(key) + len(raw)
            batch.append((key, raw, replaced))
        tx.write_many(name, batch)
        n += len(batch)
    if rescan:
        gone = []
        for key, vs in _grouped((k, c, v) for k, c, v in
                                attached.visible_candidates(conn, name)):
            if key in seen_keys or key in pending:
                continue
            v = _visible(site, name, vs, key)
            if v is not None and v.value is not None:
                gone.append((key, None, [c for c, _v in vs]))
        tx.write_many(name, gone)
        n += len(gone)
    if left:
        # rows the application deleted while the table was detached
        current = attached.versions_for(conn, name, list(left))
        gone = []
        for key, (csns, _d) in left.items():
            shown = set(split_csns(csns))
            vs = current.get(key, ())
            if any(v is not None for _c, v in vs):
                gone.append((key, None, [c for c, _v in vs if c in shown]))
        tx.write_many(name, gone)
        n += len(gone)
    if left is not None:
        attached.mark_pending(conn, as_left)    # each gets the visible record, or goes
        attached.forget_detached(conn, name)
    attached.end_capturing(conn)
    return n


def _cycle(site: Site, app: appdb.Connection, infos: dict[str, appdb.TableInfo]) -> dict:
    """Capture, then apply, under the application's write lock."""
    refused: list[str] = []
    with appdb.write_txn(app):
        infos = schema.review(site, app, infos)     # stopped tables are left out
        captured = _heal(site, app, infos)
        captured += _capture(site, app, infos)
        infos, grown = schema.follow(site, app, infos, refused)     # peers' new columns
        done, clashes = ({}, {})
        if attached.has_pending(site.conn):
            done, clashes = _apply(site, app, infos)
            _intend(site, app, os.urandom(8), done, clashes)
        _forget(app, site)
    schema.record(site, grown)
    if done or clashes:
        _settle(site, done, clashes)
    return {"captured": captured, "applied": sum(done.values()),
            "clashes": sum(len(v) for v in clashes.values()), "refused": refused}


def _idle(site: Site, app: appdb.Connection, infos: dict[str, appdb.TableInfo]) -> bool:
    """Whether :func:`_cycle` would write nothing into the application's file: everything is
    captured and its change rows forgotten, no record waits to be written, the capture's
    triggers are all there and current, and no column of the family's is missing."""
    att = attached.attachment(site.conn)
    if att is None:
        return True
    captured = att[1]
    if attached.has_pending(site.conn) or appdb.max_seq(app) != captured:
        return False
    if any(not appdb.has_capture(app, n) or not appdb.capture_current(app, t)
           for n, t in infos.items()):
        return False
    if schema.to_follow(site, infos):
        return False
    return not appdb.has_forgettable(app, captured, list(attached.stopped(site.conn)))


# How long a command that must answer (status) waits for the application's write lock.
BRIEF_WAIT_MS = 2_000


def sync_app(site: Site, *, wait: bool = True, lock_wait: bool = True) -> dict | None:
    """Capture the application's changes and write pending records into its tables: what
    'export', 'import', 'batch' and 'status' do first (and import after).  None when nothing
    is attached, or the site is busy with another command and ``wait`` is false, or it is
    recovering from a restore (local writes wait; the changes stay in the application's
    change table).  ``lock_wait`` false: another command holding the site is not waited for
    (it writes what is pending itself)."""
    if not is_attached(site) or site.state == "recovering":
        return None
    try:
        with site.lock(wait=wait and lock_wait):
            if not is_attached(site):
                return None
            not_created = _follow_new_tables(site)
            with _open_attached(site, stop_gone=True) as (app, infos):
                _recover(site, app)
                if appdb.store_behind(app, attached.attachment(site.conn)[1]):
                    # said by 'attached', status and fsck until a refresh takes the rows
                    with site.write_txn() as conn:
                        attached.note_store_behind(conn, wall_ms())
                if not wait:
                    # 'status' from cron or a monitor: a minute's wait for the application's
                    # lock would stall it; its figures are then those of the last capture
                    appdb.wait_at_most(app, BRIEF_WAIT_MS)
                # The bulk of a capture under a read snapshot: the application keeps writing
                # (in WAL mode); the write lock is held only for what came in meanwhile and
                # for writing peers' records.
                with appdb.read_txn(app):
                    infos = schema.review(site, app, infos)
                    early = _capture(site, app, infos)
                    idle = _idle(site, app, infos)
                if idle:
                    # nothing to write: a write committed for nothing would still end the
                    # read snapshot of an application transaction about to write (SQLite's
                    # BUSY_SNAPSHOT, at once, whatever its busy timeout)
                    return {"captured": early, "applied": 0, "clashes": 0,
                            "refused": not_created}
                doc = _cycle(site, app, infos)
                doc["captured"] += early
                doc["refused"] = not_created + doc["refused"]
                return doc
    except (LockedError, AttachError):
        # 'status' must answer even when the database is gone or busy; it shows that itself.
        if wait:
            raise
        return None


def _follow_new_tables(site: Site) -> list[str]:
    """A table another site attached, which this site's application does not have, is a schema
    change of the family: it is created from the family's definition and attached here, and its
    records are written into it (docs/attach.md).  A table the application already has (an
    unrelated table of that name), or one detached here (even if the application dropped it
    since), is left alone and stays 'available'.  Returns why each table whose definition
    this database refuses was not created."""
    names = [n for n in schema.available(site) if n not in attached.detached_here(site.conn)]
    if not names:
        return []
    why: dict[str, str] = {}
    path = Path(attached.attachment(site.conn)[0])
    app = appdb.open_app(path)
    try:
        # Again while a round creates one: a table whose foreign keys refer to another new
        # table is refused until that one exists (its inserts would all fail before).
        while names:
            refused = []
            for name in names:
                if appdb.table_info(app, name) is not None:
                    continue
                if _check_table(site, app, name, attached.tables(site.conn)) is not None:
                    continue
                try:
                    _attach_locked(site, app, path, [name], False, unasked=True)
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
    return [f"table {n} of the family was not created here: {w}" for n, w in sorted(why.items())]


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
        raise AttachError("; ".join(why for _n, why, _h in stopped), hint=stopped[0][2])
    return doc


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
            raise AttachError(f"site {site.name!r} already has {att[0]} attached; a site "
                              f"replicates one application database",
                              hint=f"'syncpack detach {arg(att[0])}' first, or use another "
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
        return _file_id(Path(a)) == _file_id(Path(b))
    except OSError:
        return False


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
                 f"move or remove {arg(other)} first")
    raise AttachError(f"{path} is attached to the site at {other}; one application database "
                      f"is replicated by one site", hint=f"detach it there ('syncpack --site "
                      f"{arg(other)} detach {arg(theirs)}') or attach a copy here")


_NO_SUCH_TABLE_END = " (and no peer has attached one so named)"


def _check_table(site: Site, app: appdb.Connection, name: str, current: dict) -> str | None:
    """Why ``name`` cannot be attached, or None."""
    if name in current:
        return f"table {name} is already attached"
    if name.startswith(SYS_PREFIX) or name.startswith("_syncpack_") \
            or name.startswith("sqlite_"):
        return f"table name {name!r} is reserved"
    try:
        check_collection(name)      # its rows travel as the collection of its name
    except InvalidNameError as e:
        return f"table name {name!r} cannot name a collection: {e}"
    t = appdb.table_info(app, name)
    d = _definition(site, name)
    if t is None:
        if appdb.is_view(app, name):
            return f"{name} is a view; only ordinary tables can be replicated"
        if d is None:
            return f"no table {name} in the database{_NO_SUCH_TABLE_END}"
        return None
    if t.virtual:
        return f"table {name} is a virtual table; only ordinary tables can be replicated"
    if not t.pk:
        return f"table {name} has no declared PRIMARY KEY; a replicated row needs a key"
    if len(t.columns) > appdb.MAX_COLUMNS:
        return (f"table {name} has {len(t.columns)} columns, more than the "
                f"{appdb.MAX_COLUMNS} an attached table may have")
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
            raise AttachError(f"{path} has no table left to attach")
        if virtual:
            # a full-text index and its own tables: the application writes them from its
            # tables (each site builds its own), and they cannot be replicated anyway
            skipped.append(f"left out virtual tables and their shadow tables: "
                           f"{', '.join(virtual)}")
    names = list(dict.fromkeys(names))
    problems = [p for p in (_check_table(site, app, n, current) for n in names) if p]
    appdb.skip_trigger_writes(app, [*current, *names])
    if problems:
        if all(n in current for n in names):
            hint = ("'syncpack attached' lists what is attached; 'attach DB --refresh' "
                    "accepts a changed definition")
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
        _capture(site, app, infos)     # what the attached tables hold so far, first
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
        odd_types = {n: rows.type_warning(n, new[n].affinity,
                                          appdb.declared_affinities(n, d["create_sql"]))
                     for n in names if (d := _definition(site, n)) is not None}
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
            attached.set_captured(conn, upto)
            if created:
                attached.note_creating(conn, list(created))
            for n, t in new.items():
                attached.mark_all_pending(conn, n)
                attached.add_table(conn, n, t.pk, t.columns, t.create_sql)
                attached.set_shape(conn, n, schema.shape_of(t))
            for n, t in new.items():
                d = schema.definition(t, schema.definitions(site, n))
                if _definition(site, n) != d:
                    tx.write_raw(TABLES, n, codec.encode_value(d))
            told: set[str] = set()
            for n, t in new.items():
                if n in created:
                    # detached here once, then dropped: its rows were not deleted one by
                    # one, the table is new and fills from the records like any other
                    attached.forget_detached(conn, n)
                tx.split()      # each table's rows a transaction of their own
                _load_rows_in(site, tx, app, t, rescan=False)
                actions = [a for a in appdb.foreign_key_actions(app, n) if a not in told]
                told.update(actions)        # a key between two tables attached: said once
                for w in (rows.integer_key_warning(n, t.pk, t.affinity, t.create_sql),
                          rows.untyped_key_warning(n, t.pk, t.affinity),
                          rows.null_key_warning(n, appdb.nullable_key(app, n)),
                          rows.fk_action_warning(n, actions),
                          odd_types.get(n)):
                    if w:
                        warnings.append(w)
                out.append({"table": n, "rows": 0, "primary_key": t.pk})
            # the rows it held became this site's changes: that was its first capture
            attached.touch(conn, list(new), "last_capture_ms", wall_ms())
        infos.update(new)
        infos, grown = schema.follow(site, app, infos, [])
        done, clashes = _apply(site, app, infos)
        _forget(app, site)
    if created:
        with site.write_txn() as conn:
            attached.end_creating(conn)
    schema.record(site, grown)
    _settle(site, done, clashes)
    with appdb.read_txn(app):
        for o in out:
            o["rows"] = appdb.count_rows(app, o["table"])
    return {"database": str(path), "tables": out, "warnings": skipped + warnings}


def _named_tables(site: Site, path: Path, names: list[str] | None, current: dict,
                  done: str) -> list[str]:
    """The attached tables a command names (all of them by default), or why not; the caller
    holds the site lock."""
    att = attached.attachment(site.conn)
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
        _recover(site)
        if not path.exists() or appdb.is_other_file(path):
            # The file was moved or deleted (or another, no database, stands in its place):
            # nothing of ours is left to remove from it, and its changes not yet captured
            # went with it.
            with site.write_txn() as conn:
                for n in names:
                    attached.remove_table(conn, n)
            return {"database": str(path), "detached": names}
        with _open_attached(site, gone_ok=True) as (app, infos):
            if site.state != "recovering":
                _cycle(site, app, infos)
            # The store's transaction around the application's: the rows are read as the
            # triggers go, and a crash after the application's commit leaves the table
            # attached without triggers, which the next command heals.
            with site.write_txn() as conn, appdb.write_txn(app):
                for n in names:
                    appdb.drop_capture(app, n)
                    if n in infos:
                        attached.remember_detached(conn, n, str(path), _file_id(path),
                                                   _as_left(site, app, infos[n]))
                    attached.remove_table(conn, n)
                if set(names) == set(current):
                    appdb.drop_capture_tables(app)
    return {"database": str(path), "detached": names}


def _file_id(path: Path) -> str:
    """Which file ``path`` is (device and inode): a file put in its place is another."""
    st = path.stat()
    return f"{st.st_dev}:{st.st_ino}"


def _digest(raw: bytes) -> bytes:
    return hashlib.blake2b(raw, digest_size=16).digest()


def _as_left(site: Site, app: appdb.Connection, t: appdb.TableInfo
             ) -> Iterator[tuple[str, bytes, bytes]]:
    """(key, CSNs of the versions its row has seen, digest of the row's record) of each row
    of ``t`` as it is detached: what a capture would compare it with."""
    conn = site.conn
    for items in _scanned(app, t):
        keys = [k for k, _r in items]
        current = attached.versions_for(conn, t.name, keys)
        unseen = attached.unseen_for(conn, t.name, keys)
        for key, raw in items:
            u = unseen.get(key, ())
            yield key, b"".join(c for c, _v in current.get(key, ()) if c not in u), _digest(raw)


def _capture_stopped(site: Site, app: appdb.Connection, t: appdb.TableInfo) -> None:
    """The keys of ``t`` changed while its capture was stopped and still waiting for peers'
    records: each current row (or its absence) becomes a local op concurrent with the
    versions the application has not seen, as capture makes it.  (The other changed keys are
    found by the refresh's comparison of the whole table.)"""
    conn = site.conn
    pending = set(attached.pending_keys(conn, t.name))
    single = len(t.pk) == 1
    keys = {rows.encode_key(k, single): k for k in appdb.kept_keys(app, t)}
    keys = {k: v for k, v in keys.items() if k in pending}
    if not keys:
        return
    current = attached.versions_for(conn, t.name, list(keys))
    unseen = attached.unseen_for(conn, t.name, list(keys))
    batch = []
    for key, vals in keys.items():
        raw = _record(t, appdb.fetch_row(app, t, vals))
        vs = current.get(key, ())
        u = unseen.get(key, set())
        seen = [c for c, _v in vs if c not in u]
        if seen and len(seen) == len(vs) and any(v == raw for c, v in vs):
            continue
        batch.append((key, raw, seen))
    with site.transaction() as tx:
        attached.begin_capturing(conn)
        tx.write_many(t.name, batch)
        attached.end_capturing(conn)


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
            if problems:
                raise AttachError("; ".join(problems) + "; nothing was refreshed")
            with appdb.write_txn(app):
                live = schema.review(site, app, infos)
                _capture(site, app, live)       # what can be captured as usual, first
                for n in names:
                    t = appdb.table_info(app, n)
                    if n not in live:
                        _capture_stopped(site, app, t)
                    prev = schema.definitions(site, n)
                    old_cols = set(current[n]["columns"])
                    d = schema.definition(t, prev, dropped=old_cols - set(t.columns))
                    with site.transaction() as tx:
                        if _definition(site, n) != d or len(prev) > 1:
                            tx.write_raw(TABLES, n, codec.encode_value(d))
                        attached.set_shape(site.conn, n, schema.shape_of(t), t.columns, t.pk,
                                           t.create_sql)
                        attached.set_stopped(site.conn, n, None)
                    appdb.install_capture(app, t)       # the key may have changed
                    changes = _load_rows(site, app, t, rescan=True)
                    live[n] = schema.with_dropped(site, t)
                    out.append({"table": n, "columns": t.columns, "primary_key": t.pk,
                                "changes": changes})
                live, grown = schema.follow(site, app, live, [])
                done, clashes = _apply(site, app, live)
                _forget(app, site)
            schema.record(site, grown)
            _settle(site, done, clashes)
            if set(names) == set(current):
                with site.write_txn() as conn:
                    attached.end_store_behind(conn)     # every row taken as it is
    return {"database": str(path), "refreshed": out}


# --- reports ------------------------------------------------------------------------------------

STORE_BEHIND = ("the store was found behind this file (restored from an older copy?): "
                "changes the application made before that restore may be only in its tables; "
                "once the site has recovered from its peers, 'attach DB --refresh' takes the "
                "tables' rows as they are, as this site's changes")


def report(site: Site) -> dict:
    """What is attached, per table: rows, changes not yet captured, last capture and apply;
    the family's tables not attached here; why the file cannot be read, if it cannot."""
    att = attached.attachment(site.conn)
    if att is None:
        return {"database": None, "tables": [], "available": schema.available(site),
                "problem": None, "store_behind": None}
    path, since = att
    tables = attached.tables(site.conn)
    counts: dict[str, int] = {}
    row_counts: dict[str, int | None] = {n: None for n in tables}
    problem = None
    stopped = attached.stopped(site.conn)
    try:
        app = appdb.open_app(Path(path))
    except AttachError as e:
        app, problem = None, e.message
    if app is not None:
        try:
            with appdb.read_txn(app):
                counts = appdb.pending_counts(app, since, stopped)
                for n in tables:
                    if appdb.has_table(app, n):
                        row_counts[n] = appdb.count_rows(app, n)
        finally:
            app.close()
    return {"database": path, "tables": [
        {"table": n, "rows": row_counts[n], "pending": counts.get(n, 0),
         "to_apply": attached.pending_count(site.conn, n),
         "waiting": attached.waiting_count(site.conn, n, appdb.WAITING),
         "stopped": stopped.get(n),
         "last_capture": d["last_capture_ms"], "last_apply": d["last_apply_ms"]}
        for n, d in tables.items()], "available": schema.available(site), "problem": problem,
        "store_behind": STORE_BEHIND if attached.store_behind_since(site.conn) else None}


def check_values(site: Site, collection: str, records: list[tuple[str, object]]) -> None:
    """Refuses, before anything is written, records ``(key, value)`` written here for an
    attached table that the table cannot hold as given: a value that is not a row of it (not
    an object, a column it lacks, key columns other than the key: the table would refuse it,
    and every site would list it as a conflict), or a value the table would store as another
    one (SQLite converts by the column's type affinity: the record would say "7", the table
    7, and the sites would disagree)."""
    here = attached.tables(site.conn).get(collection)
    if here is not None:
        _check_rows(collection, here["pk"], here["columns"], records)
    shape = attached.shapes(site.conn).get(collection, (None, None))[0]
    if shape is not None:
        affinity = dict(map(tuple, shape["columns"]))
    else:
        # not attached here, but a peer's table: its definition says how it stores values
        d = _definition(site, collection) if not collection.startswith(SYS_PREFIX) else None
        affinity = appdb.declared_affinities(collection, d["create_sql"]) \
            if isinstance(d, dict) and isinstance(d.get("create_sql"), str) else None
        if not affinity:
            return
    found = writer.conversions(affinity, [v for _k, v in records if isinstance(v, dict)])
    if found:
        c, v, stored = found[min(found)]
        raise AttachError(
            f"column {c} of attached table {collection} has {affinity[c]} affinity: "
            f"{json.dumps(v)} would be stored as {json.dumps(stored)}; nothing was "
            f"written", hint="write the value as the table stores it")


def _check_rows(name: str, pk: list[str], columns: list[str],
                records: list[tuple[str, object]]) -> None:
    """:func:`check_values`'s refusal of records that are no row of table ``name``."""
    puts = [(k, v) for k, v in records if v is not None]
    refused = rows.refused_records([v for _k, v in puts], [k for k, _v in puts], pk)
    if refused:
        at = min(refused)
        key, _value = puts[at]
        plural = "s" if len(pk) > 1 else ""
        why = ("it is not an object of the table's columns" if refused[at] == rows.NOT_A_ROW
               else f"its key column{plural} {', '.join(pk)} must hold the key")
        example = (f"{{{json.dumps(pk[0])}: {json.dumps(key)}, ...}}" if len(pk) == 1 else
                   "{" + ", ".join(f"{json.dumps(c)}: ..." for c in pk) + ", ...}")
        raise AttachError(
            f"the value for key {key!r} is not a row of attached table {name}: {why}; "
            f"nothing was written", hint=f"give the row as an object, e.g. {example}")
    known = set(columns)
    for key, value in puts:
        extra = [c for c in value if c not in known]
        if extra:
            raise AttachError(
                f"attached table {name} has no column {extra[0]!r} (the record for key "
                f"{key!r} names it); nothing was written",
                hint=f"add the column to the table first (ALTER TABLE ... ADD COLUMN), or "
                     f"leave it out; its columns: {', '.join(columns)}")


def check_hint(site: Site) -> str:
    """What to do when fsck finds only attached tables unlike the records (rows written where
    the capture could not see them): take the tables' rows as they are, as this site's
    changes, which then travel to the peers."""
    path, captured = attached.attachment(site.conn)
    try:
        app = appdb.open_app(Path(path))
    except AttachError:
        return back_or_detach(path)
    try:
        with appdb.read_txn(app):
            behind = appdb.went_back(app, captured)
            gone = [n for n in attached.tables(site.conn) if not appdb.has_table(app, n)]
    finally:
        app.close()
    if gone:
        return _gone_hint(path, gone[0])
    if behind:
        # A refresh here would take the old rows as this site's changes and roll the whole
        # family back to them; the capture's own path writes the newer records in again.
        return ("run 'syncpack capture' (or any export, import or status): it writes the "
                "newer records into the restored file again, and a row the application "
                "changed since the restore becomes a conflict (docs/attach.md)")
    return (f"'syncpack attach {arg(path)} --refresh' takes the attached tables' rows as they "
            f"are, as this site's changes (docs/attach.md)")


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
    stopped = set(attached.stopped(site.conn))
    problems += [_gone_why(n, path) for n in attached.tables(site.conn) if n not in infos]
    if attached.store_behind_since(site.conn):
        problems.append(STORE_BEHIND.replace("this file", f"the attached database {path}"))
    try:
        with appdb.read_txn(app):
            if appdb.went_back(app, since):
                return [f"attached database {path} is behind the store (restored from an "
                        f"older copy?): the next capture writes the newer records into it "
                        f"again, and a row the application changed since becomes a conflict"]
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
                sizer = rows.PartSizer(CAPTURE_CHUNK, reader.CAPTURE_BYTES)
                key_at = [t.columns.index(c) for c in t.pk]
                for part in rows.chunks(appdb.scan(app, t), sizer.rows):
                    sizer.saw(len(part), rows.text_bytes(part))
                    recs = [dict(zip(t.columns, row)) for row in part]
                    keys = rows.keys_at(part, key_at)
                    current = attached.versions_for(site.conn, name, keys)
                    for key, rec in zip(keys, recs):
                        if key in skip:
                            continue
                        v = _visible(site, name, current.get(key, []), key)
                        if v is None or v.value is None or not rows.same_row(
                                codec.shown_value(v.value), rec, defaults):
                            bad.append(key)
                aff = [t.affinity.get(c, "BLOB") for c in t.pk]
                for key, vs in _grouped(attached.visible_candidates(site.conn, name)):
                    if key in skip:
                        continue
                    if any(len(vals) == len(t.pk) and appdb.fetch_row(app, t, vals) is not None
                           for vals in rows.key_candidates(key, aff)):
                        continue                # the first pass compared it
                    v = _visible(site, name, vs, key)
                    if v is not None and v.value is not None:
                        bad.append(key)
                bad.sort()
                for key in bad[:10]:
                    problems.append(f"attached table {name}: row {key} differs from the "
                                    f"visible record")
                if len(bad) > 10:
                    problems.append(f"attached table {name}: ... and {len(bad) - 10} more rows")
    finally:
        ctx.__exit__(None, None, None)
    return problems
