"""The application's changes into the changelog: a capture of what its change table names,
and a whole table compared with the store where the change table cannot be trusted (a
capture put back, a file restored from an older copy).  Rows at or below what the store
captured are never read again, so the change rows can be cleared after the store's commit
(:func:`forget_taken`) at any later time."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from itertools import compress
from pathlib import Path
from typing import Iterator

from syncpack.attach import reader, rows
from syncpack.format import blocks, codec
from syncpack.format.csn import split_csns
from syncpack.rules.conflict import Version, pick
from syncpack.site import Site, wall_ms
from syncpack.store import appdb, attached, chain, fields
# An attach's initial rows travel as replication transactions of at most this many rows, as
# 'load' cuts them.
ATTACH_TXN_OPS = 100_000
ATTACH_TXN_BYTES = 32 * 1024 * 1024
# Keys looked up in the store per round trip while capturing.
CAPTURE_CHUNK = 10_000
# A write this large goes in with the table's capture triggers dropped for its duration
# (appdb.capture_paused), a capture this large with the store's versions triggers dropped
# (attached.pause_triggers); smaller ones are not worth a schema change.
PAUSE_CAPTURE_AT = 1_000


def record_of(t: appdb.TableInfo, row: tuple | None) -> bytes | None:
    return None if row is None else codec.encode_value(dict(zip(t.columns, row)))


def visible(site: Site, name: str, vs: list[tuple[bytes, bytes | None]],
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


def shows_visible(site: Site, name: str, key: str, vs, raw: bytes | None,
                  defaults: dict | None) -> bool:
    """Whether the row ``raw`` (None: no row) of a key whose surviving versions are ``vs``
    holds the visible record: the application changed nothing there, and a conflict stays
    for 'conflicts resolve'."""
    v = visible(site, name, list(vs), key)
    if v is None or v.value is None or raw is None:
        return raw is None and (v is None or v.value is None)
    return rows.same_row(codec.shown_value(v.value), codec.decode_value(raw), defaults)


def take_changes(site: Site, app: appdb.Connection, infos: dict[str, appdb.TableInfo]) -> int:
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
    last = appdb.change_row(app, upto)
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
            _note_captured(conn, upto, last)
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
    """The ops of :func:`take_changes`, written in its store transaction ``tx``."""
    conn = site.conn
    written = 0
    attached.begin_capturing(conn)
    if upto - since >= PAUSE_CAPTURE_AT:
        attached.pause_triggers(conn)
    any_pending = attached.has_pending(conn)
    # A table's first capture into an empty collection needs no look-ups.
    used = {n: attached.collection_used(conn, n) for n in infos}
    # Under 'merge', a column a row's record lacks (added since it was written, or left out
    # by a put or a resolve of part of a row) holds its default in the row: written back
    # unchanged, it is no change of that column (sent as one, it overrode a peer's real
    # edit of the column).
    defaults = {n: appdb.constant_defaults(app, t) for n, t in infos.items()
                if used[n] and site.policy_of(n) == "merge"}
    dropped = {n: t.dropped for n, t in infos.items()
               if used[n] and t.dropped and site.policy_of(n) == "merge"}
    held: dict[str, dict] = {}

    def constants(name: str, t: appdb.TableInfo) -> dict:
        # a row compared whole with a record that predates a column (keys in conflict only)
        if name not in held:
            held[name] = appdb.constant_defaults(app, t)
        return held[name]

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
            untouched, gone = defaults.get(name), dropped.get(name)
            for key, raw in zip(keys, raws):
                vs = current.get(key, ())
                u = unseen.get(key, ())
                if (untouched or gone) and raw is not None and vs:
                    raw = merge_write(raw, shown_record(site, name, key, vs, u), untouched,
                                      gone)
                if len(vs) == 1 and vs[0][1] == raw or (raw is None and not vs):
                    continue    # nothing new (written back as it was, or born and gone)
                if len(vs) > 1 and shows_visible(site, name, key, vs, raw,
                                                 constants(name, t)):
                    # A key in conflict whose row shows the visible record: a write that
                    # changed nothing (an UPDATE of the application's trigger that syncpack
                    # skipped while writing a peer's row of another table still fires this
                    # table's capture trigger) settles nothing; 'conflicts resolve' does.
                    continue
                bk.append(key)
                br.append(raw)
                bv.append(b"".join(shown(vs, u, replaced)))
            tx.write_columns(name, bk, br, bv)
            written += len(bk)
    return written


def shown_record(site: Site, name: str, key: str, vs: list[tuple[bytes, bytes | None]],
                 unseen: set[bytes] | tuple = ()) -> bytes | None:
    """The record a row of ``key`` shows: the visible one of its surviving versions ``vs``
    but those not yet written into the table (``unseen``); under 'merge', versions merged
    without a conflict show as one record.  None for none, or a delete."""
    v = visible(site, name, [cv for cv in vs if cv[0] not in unseen], key)
    return None if v is None else v.value


def merge_write(raw: bytes | None, base: bytes | None, untouched: dict | None,
                dropped: frozenset[str] | None) -> bytes | None:
    """Record ``raw`` of a row that showed record ``base`` (:func:`shown_record`), as a
    write under 'merge' changes it: a column added since ``base`` that still holds its
    default is no change (rows.without_unset), nor a column the family dropped that the
    table lacks (rows.with_dropped_kept)."""
    if raw is None or base is None:
        return raw
    if untouched:
        raw = rows.without_unset(raw, base, untouched)
    if dropped:
        raw = rows.with_dropped_kept(raw, base, dropped)
    return raw


def shown(vs: list[tuple[bytes, bytes | None]], unseen: set[bytes] | tuple,
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


def forget_taken(app: appdb.Connection, site: Site) -> None:
    att = attached.attachment(site.conn)
    if att is not None:
        # A stopped table's changes stay: its refresh needs the keys changed meanwhile.
        stopped = list(attached.stopped(site.conn))
        appdb.forget_changes(app, att[1], stopped)


def grouped(cur) -> Iterator[tuple[str, list[tuple[bytes, bytes | None]]]]:
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


def heal(site: Site, app: appdb.Connection, infos: dict[str, appdb.TableInfo]) -> int:
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
    went_back = file_went_back(site, app)
    for name, t in infos.items():
        there = appdb.has_capture(app, name)
        if there and not went_back and not appdb.capture_current(app, t):
            appdb.install_capture(app, t)
            taken += load_rows(site, app, t, rescan=True)
        elif went_back or not there:
            changed = set(changed_keys(app, t)) if went_back else set()
            appdb.install_capture(app, t, floor=since)
            appdb.set_owner(app, site.site_id, str(site.path.resolve()))
            if went_back:
                with site.transaction() as tx:
                    taken += _went_back(site, tx, app, t, changed)
            else:
                taken += load_rows(site, app, t, rescan=True, waiting_too=True)
    if went_back:
        # every change row in the file was compared above: none is to be captured again
        upto = appdb.max_seq(app)
        with site.write_txn() as conn:
            _note_captured(conn, upto, appdb.change_row(app, upto))
    return taken


def _note_captured(conn, upto: int, last: tuple | None) -> None:
    """The store has captured the file's changes up to number ``upto``, whose change row is
    ``last``: noted with the row's fingerprint, which tells a file gone back behind it."""
    attached.set_captured(conn, upto)
    attached.note_tail(conn, upto, None if last is None else appdb.change_fingerprint(last))


def file_went_back(site: Site, app: appdb.Connection) -> bool:
    """Whether the attached file went back behind what the store captured of it
    (appdb.went_back); the caller holds a transaction on ``app``."""
    captured = attached.attachment(site.conn)[1]
    return appdb.went_back(app, captured, attached.tail(site.conn, captured))


def changed_keys(app: appdb.Connection, t: appdb.TableInfo) -> dict[str, tuple]:
    """Record key -> key values of each key of ``t`` in the change table (changed since the
    last capture took it, or kept there: a stopped table's).  A key that is no record key (TEXT
    that is not UTF-8) was never captured, and is left out."""
    single = len(t.pk) == 1
    out = {}
    for k in appdb.kept_keys(app, t):
        try:
            out[rows.encode_key(tuple(k), single)] = tuple(k)
        except (TypeError, ValueError):
            continue
    return out


def _went_back(site: Site, tx, app: appdb.Connection, t: appdb.TableInfo,
               changed_keys: set[str]) -> int:
    """The application's file went back: a row that differs from its visible record is the
    backup's (the store holds what came after it, its own and the peers'), and gets the
    visible record again, unless the application changed its key since (a key in the change
    table, ``changed_keys``; the restored rows and the new ones cannot be told apart there).  Such a
    row becomes this site's op concurrent with the visible record: a conflict that
    'conflicts' lists, so neither the application's write nor the newer record is lost
    unseen."""
    conn, name = site.conn, t.name
    pending = set(attached.pending_keys(conn, name))
    defaults = appdb.constant_defaults(app, t)
    again: list[tuple[str, str, bytes]] = []
    mine: list[tuple[str, bytes | None, list[bytes]]] = []
    seen: set[str] = set()

    for items in scanned(app, t):
        seen.update(k for k, _r in items)
        current = attached.versions_for(conn, name, [k for k, _r in items if k not in pending])
        for key, raw in items:
            if key in pending or shows_visible(site, name, key, current.get(key, ()), raw,
                                                 defaults):
                continue
            if key in changed_keys:
                mine.append((key, raw, []))
            else:
                again.append((name, key, b""))
    for key, vs in grouped(attached.visible_candidates(conn, name)):
        if key in seen or key in pending or shows_visible(site, name, key, vs, None, defaults):
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


def load_rows(site: Site, app: appdb.Connection, t: appdb.TableInfo, rescan: bool,
              waiting_too: bool = False) -> int:
    """Rows of ``t`` that differ from the store become local ops.  At attach they are
    concurrent with whatever the store holds (``rescan=False``); on a rescan they replace what
    the application had seen.  Keys the store holds and the table lacks are deleted on a
    rescan only.  A rescan passes over keys whose peer records wait (a capture took their
    changes), unless ``waiting_too`` (no capture saw the table's changes: _waiting_changed)."""
    with site.transaction() as tx:
        return load_rows_in(site, tx, app, t, rescan, waiting_too)


def scanned(app: appdb.Connection, t: appdb.TableInfo) -> Iterator[list[tuple[str, bytes]]]:
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


def load_rows_in(site: Site, tx, app: appdb.Connection, t: appdb.TableInfo,
                 rescan: bool, waiting_too: bool = False) -> int:
    """:func:`load_rows` in the caller's store transaction ``tx``."""
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
    left = None if rescan else attached.detached_rows(conn, name, path, file_id(Path(path)))
    as_left: list[tuple[str, str, bytes]] = []
    defaults = appdb.constant_defaults(app, t) if rescan else None
    # columns the application's release added while the table was detached: a row holding
    # their defaults there is as it was left (under 'merge', taken as set to the default, it
    # overrode a peer's edit of the column)
    then = attached.detached_columns(conn, name) if left else None
    added = [c for c in t.columns if c not in then] if then else []
    added_defaults = appdb.constant_defaults(app, t) if added else {}
    gone = t.dropped if rescan and t.dropped and site.policy_of(name) == "merge" else None
    for items in scanned(app, t):
        if rescan:
            seen_keys.update(k for k, _r in items)
            waiting = [(k, r) for k, r in items if k in pending]
            items = [(k, r) for k, r in items if k not in pending]
            if waiting and waiting_too:
                n += _waiting_changed(site, tx, t, waiting, defaults)
        current = attached.versions_for(conn, name, [k for k, _r in items])
        batch = []
        for key, raw in items:
            vs = current.get(key, ())
            was = left.pop(key, None) if left is not None else None
            if was is not None and (digest(raw) == was[1] or added and digest(
                    rows.without_defaults(raw, added, added_defaults)) == was[1]):
                as_left.append((name, key, b""))
                continue
            if len(vs) == 1 and (vs[0][1] == raw or rescan and vs[0][1] is not None
                                 and rows.same_row(codec.shown_value(vs[0][1]),
                                                   codec.decode_value(raw), defaults)):
                continue
            if rescan and len(vs) > 1 and shows_visible(site, name, key, vs, raw, defaults):
                continue    # no change of the application's: as in a capture
            if rescan:
                replaced = [c for c, _v in vs]
                if gone and vs:
                    raw = merge_write(raw, shown_record(site, name, key, vs), None, gone)
            elif was is not None:
                # what the row showed when it was left, survivors or not: a version replaced
                # since by a peer's edit is still what the application's change is based on
                # (under merge, the peer's edit of another field then stands)
                replaced = split_csns(was[0])
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
        for key, vs in grouped((k, c, v) for k, c, v in
                               attached.visible_candidates(conn, name)):
            if key in seen_keys or key in pending:
                continue
            v = visible(site, name, vs, key)
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


def _waiting_changed(site: Site, tx, t: appdb.TableInfo, items: list[tuple[str, bytes]],
                     defaults: dict) -> int:
    """Of rows (key, record) whose keys have peer records waiting to be written, those the
    application changed: unlike what the row showed (the versions but the waiting ones), they
    become local ops concurrent with the waiting records, as capture makes them.  A rescan
    passed them over, and a change no trigger saw (the table made again, then edited) was
    overwritten by the waiting record, silently.  Returns the ops written."""
    conn, name = site.conn, t.name
    keys = [k for k, _r in items]
    current = attached.versions_for(conn, name, keys)
    unseen = attached.unseen_for(conn, name, keys)
    replaced = chain.replaced_of_many(conn, set().union(*unseen.values()))
    # what the waiting versions replaced, which the row still shows where nothing else is
    under = chain.values_of_many(conn, {r for rs in replaced.values() for r in rs})
    batch = []
    for key, raw in items:
        vs = list(current.get(key, ()))
        u = unseen.get(key, set())
        row = codec.decode_value(raw)
        v = visible(site, name, [(c, x) for c, x in vs if c not in u], key)
        if v is not None:
            was = [v.value]
        else:
            was = [under.get(r) for c in u for r in replaced.get(c, ())]
        if any(x is not None and rows.same_row(codec.shown_value(x), row, defaults)
               for x in was):
            continue
        batch.append((key, raw, shown(vs, u, replaced)))
    tx.write_many(name, batch)
    return len(batch)


def file_id(path: Path) -> str:
    """Which file ``path`` is (device and inode): a file put in its place is another."""
    st = path.stat()
    return f"{st.st_dev}:{st.st_ino}"


def digest(raw: bytes) -> bytes:
    return hashlib.blake2b(raw, digest_size=16).digest()
