"""Peers' records into the application's tables: pending keys written after an import or a
command's capture (:func:`apply_pending`), and an import's rows written as the store inserts
them (:class:`DirectApply`).  Each first captures (attach/capturing.py) under the write lock
it holds, so no committed change of the application's is overwritten before it is in the
changelog; rows the local schema refuses are clashes, and marks of what was written let a
crash anywhere be recovered (:func:`recover`)."""

from __future__ import annotations

import os
from contextlib import nullcontext
from itertools import chain as joined, compress, repeat
from pathlib import Path
from typing import Callable

from syncpack import children
from syncpack.attach import capturing, rows, schema, writer
from syncpack.errors import AttachError
from syncpack.format import codec
from syncpack.format.csn import csn_hlc, csn_origin, csn_origins, csn_seq
from syncpack.pipeline import Pending, Worker
from syncpack.site import Site, wall_ms
from syncpack.store import appdb, attached, chain, matrix
# Rows written per statement batch.
APPLY_CHUNK = 10_000


def apply_pending(site: Site, app: appdb.Connection, infos: dict[str, appdb.TableInfo]
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
        big = len(first) >= capturing.PAUSE_CAPTURE_AT and not w.keeps_capture
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
        # rows whose deferred foreign keys refer to each other, deleted together; if a row
        # refused at once (a local row refers to it) fails the whole group, without such rows
        # (before, one such row kept every deferred pair of the import from going)
        deferred = {n: {k: v for k, v in ks.items() if clashes[n][k].endswith("(deferred)")}
                    for n, ks in refused.items()}
        for group in (refused, {n: ks for n, ks in deferred.items() if ks}):
            names = [n for n in reversed(order) if n in group]
            if group and appdb.delete_group([(appdb.Writer(app, infos[n]),
                                              list(group[n].values())) for n in names]):
                for n in names:
                    done[n] += len(group[n])
                    for k in group[n]:
                        clashes[n].pop(k, None)
                    if not clashes[n]:
                        del clashes[n]
                break
    if stuck and has_deletes:
        # a row that takes a UNIQUE value from a row its transaction deleted
        _apply_together(app, infos, order, stuck, done, clashes)
    return done, clashes


# Passes of restore_removed: a row written back may fire triggers that remove others.
RESTORE_PASSES = 3


def restore_removed(site: Site, infos: dict[str, appdb.TableInfo],
                    removed: Callable[[], dict[str, list[tuple]]],
                    write: Callable[[str, list[str], list[bytes]], None],
                    token: bytes | None) -> int:
    """Before an apply's commit: rows the application's triggers deleted as the apply wrote
    others, written back as the family's record says, where the write's origin held them.

    A trigger that keeps a row by deleting and inserting it again (a summary of an order's
    lines) did both at the origin, which sent the row as it left it, or nothing when it came
    out the same.  Here its INSERT is skipped (skip_trigger_writes) but its DELETE cannot be:
    the row was gone, and its delete, captured as this site's own change, went back and
    removed it everywhere.  What the origin's trigger deleted for good arrives as its delete,
    so a row still shown by the family's record after the apply is written back: one the
    apply wrote, a peer's, or one of ours every member acknowledged.  A row of ours the
    origin may lack (a child added here meanwhile, whose parent a peer deleted) stays
    deleted: a trigger's cascade, this site's change, as before.  ``removed``
    gives the rows deleted so (appdb.removed_since), ``write`` writes records (table, keys,
    records); ``token``: the import whose marks name the rows it wrote as they arrived.
    Returns the rows written back."""
    tried: set[tuple[str, str]] = set()
    total = 0
    floor: list[dict[bytes, int]] = []

    def known(csn: bytes) -> bool:
        # held where the write that fired the trigger was made: a peer's version, or one of
        # ours that every member acknowledged (one of ours the others may lack, a child
        # added here meanwhile, is this site's cascade)
        origin = csn_origin(csn)
        if origin != site.site_id:
            return True
        if not floor:
            floor.append(matrix.ack_floor(site.conn, site.site_id, list(site.members_by_id())))
        epoch = chain.epoch_of(site.conn, csn_hlc(csn), origin, csn_seq(csn))
        return epoch is not None and epoch <= floor[0].get(origin, 0)

    for _ in range(RESTORE_PASSES):
        found = 0
        for name, key_values in removed().items():
            single = len(infos[name].pk) == 1
            keys = []
            for k in key_values:
                try:
                    key = rows.encode_key(k, single)
                except (TypeError, ValueError):
                    continue
                if (name, key) not in tried:
                    tried.add((name, key))
                    keys.append(key)
            mine = attached.written_now(site.conn, name, keys, token)
            back = []
            for k, vs in attached.versions_for(site.conn, name, keys).items():
                v = capturing.visible(site, name, vs, k)
                if v is not None and v.value is not None and (k in mine or known(v.csn)):
                    back.append((k, v.value))
            if back:
                write(name, [k for k, _v in back], [v for _k, v in back])
                found += len(back)
        if not found:
            break
        total += found
    return total


def restore_here(site: Site, app: appdb.Connection, infos: dict[str, appdb.TableInfo],
                 start: int, token: bytes | None) -> int:
    """:func:`restore_removed` in this process's write transaction on ``app``, which began
    after change number ``start``."""
    def write(name: str, keys: list[str], raws: list[bytes]) -> None:
        writer.write_batch(appdb.Writer(app, infos[name]), keys, raws)
    return restore_removed(site, infos, lambda: appdb.removed_since(app, infos, start), write,
                           token)


def _visible_part(site: Site, name: str, part: list[tuple[str, int, bytes | None]]
                  ) -> list[tuple[str, bytes | None]]:
    """(key, visible value or None) of a chunk of :func:`attached.pending_visible`."""
    several = {k: capturing.visible(site, name, attached.versions_of(site.conn, name, k), k)
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
    shown = _rows_showing(w, vis, {k for k, n, _v in part if n > 1})
    if shown:
        # a key in conflict whose row shows the pick already (this site's version won): no
        # write, or the application's UPDATE triggers would fire for a change nobody made
        vis = [(k, v) for k, v in vis if k not in shown]
        done[name] = done.get(name, 0) + len(shown)
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


def _rows_showing(w: appdb.Writer, vis: list[tuple[str, bytes | None]],
                  several: set[str]) -> set[str]:
    """Of the keys in ``several`` (with more than one surviving version), those whose row in
    ``w``'s table holds their visible record ``vis`` already."""
    out: set[str] = set()
    if not several:
        return out
    # a column the record predates is written with its default (appdb.Writer)
    defaults = appdb.constant_defaults(w.conn, w.t)
    cols = set(w.t.columns)
    for key, v in vis:
        if key not in several or v is None:
            continue
        record = codec.shown_value(v)
        if not isinstance(record, dict) or not set(record) <= cols:
            continue    # written, it waits for a column (or is refused): as ever
        key_vals = writer.row_key(w, key)
        row = appdb.fetch_row(w.conn, w.t, key_vals) if key_vals is not None else None
        if row is not None and rows.same_row(record, dict(zip(w.t.columns, row)), defaults):
            out.add(key)
    return out


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


def _outcome(done: dict[str, int], clashes: dict[str, dict[str, str]]
             ) -> dict[str, dict[str, str]]:
    return {name: clashes.get(name, {}) for name in set(done) | set(clashes)}


def intend(site: Site, app: appdb.Connection | None, token: bytes, done: dict[str, int],
           clashes: dict[str, dict[str, str]],
           written: dict[str, list[str]] | None = None) -> bool:
    """Before the application's commit of an apply: its outcome in the store, and ``token``
    in the application's transaction, so that :func:`recover` can settle it after a crash
    between the two commits.  Whether there was anything to note."""
    if not (done or clashes or written):
        return False
    with site.write_txn() as conn:
        attached.note_settling(conn, token, _outcome(done, clashes), written or {})
    if app is not None:
        appdb.note_applied(app, token)
    return True


def settle(site: Site, done: dict[str, int], clashes: dict[str, dict[str, str]],
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


def recover(site: Site, app: appdb.Connection | None = None) -> None:
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
    a crash or an interruption at any point leaves the marks, and :func:`recover` makes
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
        if attached.attachment(site.conn) is None or site.state == "recovering":
            return
        path, _seq = attached.attachment(site.conn)
        try:
            app = appdb.open_app(Path(path))
        except AttachError:
            recover(site)
            return      # the ordinary apply after the import reports it
        try:
            recover(site, app)
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
                                              version, capturing.PAUSE_CAPTURE_AT)
                if not self.child:      # the application wrote meanwhile: as ever, here
                    self.child = None
                    infos = self._begin(app, tables)
        except BaseException:
            app.close()
            raise
        self.app, self.infos = app, infos
        # our write transaction's first change number (the child's is the same: upto)
        self.start = appdb.max_seq(app) if self.child is None else upto
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
            capturing.heal(site, app, infos)
            capturing.take_changes(site, app, infos)
            capturing.forget_taken(app, site)
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
        not_written = writer.write_batch(w, keys, raws, values, self.paused,
                                         capturing.PAUSE_CAPTURE_AT)
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
                        done, clashes = apply_pending(site, app, self.infos)
                    restore_here(site, app, self.infos, self.start, self.token)
                    if not intend(site, app, self.token, done, clashes) and self.marks:
                        appdb.note_applied(app, self.token)
                appdb.end_write(app, ok)
        finally:
            self.close()
        if ok and self.marks:
            with site.write_txn() as conn:
                attached.clear_inflight(conn, self.token)
                attached.touch(conn, self.written, "last_apply_ms", wall_ms())
        if ok and (done or clashes or written):
            settle(site, done, clashes, written)

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
            if ok:
                restore_removed(self.site, self.infos, self.child.removed,
                                self._put_in_child, self.token)
            # the token goes in the child's transaction (writer.Elsewhere.end)
            noted = ok and intend(self.site, None, self.token, {}, {}, written)
            token = self.token if self.marks or noted else None
            return (self.child.end(ok, token) and ok), written
        except children.ChildEnded:
            return False, {}

    def _put_in_child(self, name: str, keys: list[str], raws: list[bytes]) -> None:
        """Records written by the child, waited for (a row it refuses stays as it is)."""
        self.child.put(name, keys, raws, [b""] * len(keys))
        self.child.refused(wait=True)

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
