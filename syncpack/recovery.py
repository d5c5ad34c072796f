"""Restore from backup, changelog trimming (scrub), hard resync, retiring members.

DESIGN.md §6.  Trimming only ever uses acknowledgements (what members reported in their own
packets, directly or through the all-members floor other members gossip), never estimates of
what was sent.
"""

from __future__ import annotations

import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from . import codec, keys
from .csn import pack_csn
from .errors import PacketBodyError, UsageError
from .packets import DEFAULT_MAX_SIZE
from .progress import expect
from .site import ROSTER, Site, wall_ms

NORMAL, RECOVERING = "normal", "recovering"
SCRUB_STEP = 50_000


# --- restore ----------------------------------------------------------------------------------

def _reports(site: Site) -> dict[bytes, int]:
    raw = site.meta("recover_reports")
    return {o: e for o, e in codec.unpackb(raw)} if raw else {}


def enter_recovering(site: Site, reason: str) -> None:
    """Called inside a write transaction."""
    if site.state != RECOVERING:
        site.set_meta("state", RECOVERING)
        site.set_meta("restore_ms", wall_ms())
        site.set_meta("recover_reason", reason)
        site.set_meta("recover_reports", codec.packb([]))


def note_report(site: Site, h) -> None:
    """Every verified packet from a member reports how much of our own origin it holds.
    A peer holding more of our origin than we do means we were restored from an old copy."""
    mine = h.vector.get(site.site_id, 0)
    held = site.vector().get(site.site_id, 0)
    if mine > held and site.state != RECOVERING:
        stash_own(site, f"{site.name_of(h.sender)} holds epoch {mine} of this site's own "
                        f"changes, this site only {held}", in_txn=True)
    elif h.tip is not None and site.state != RECOVERING and h.tip[0] <= held:
        e, csn = h.tip
        row = site.conn.execute("SELECT hlc, seq FROM changelog WHERE origin=? AND epoch=?",
                                (site.site_id, e)).fetchone()
        if row is not None and pack_csn(row[0], site.site_id, row[1]) != csn:
            stash_own(site, f"{site.name_of(h.sender)} holds a different op as epoch {e} of "
                            f"this site (restored from a backup, then written to?)",
                      in_txn=True)
    if site.state == RECOVERING and h.created_ms >= int(site.meta("restore_ms", 0)):
        reps = _reports(site)
        reps[h.sender] = max(reps.get(h.sender, 0), mine)
        site.set_meta("recover_reports", codec.packb(sorted([o, e] for o, e in reps.items())))
    maybe_finish(site)


def recovery_status(site: Site) -> dict:
    if site.state != RECOVERING:
        return {"state": NORMAL}
    reps = _reports(site)
    held = site.vector().get(site.site_id, 0)
    peers = [m for m in site.members_by_id().values() if m.site_id != site.site_id]
    waiting = sorted(m.name for m in peers if m.site_id not in reps)
    need = max(reps.values(), default=0)
    stashed = site.conn.execute("SELECT count(*) FROM stash").fetchone()[0]
    return {"state": RECOVERING, "reason": site.meta("recover_reason", ""),
            "own_epoch": held, "needed_epoch": need, "waiting_for_reports_from": waiting,
            "ops_to_reissue": stashed}


def maybe_finish(site: Site) -> bool:
    """Leave the recovering state once every current member has reported since the restore
    and we hold every epoch of our own that any of them reported."""
    st = recovery_status(site)
    if st["state"] != RECOVERING:
        return False
    if st["waiting_for_reports_from"] or st["own_epoch"] < st["needed_epoch"]:
        return False
    reissue_stash(site)
    site.set_meta("state", NORMAL)
    return True


def stash_own(site: Site, reason: str, in_txn: bool = False) -> int:
    """Set aside every own op above our floor and wind our vector back to it.

    After a restore our copy of our own history may hold ops the family never saw (written
    after the restore, under epochs peers already hold with other ops).  We cannot tell which,
    so all of them step aside: peers send our genuine ops back (they return to the changelog
    when their CSN matches), and what is left once every peer has reported is re-issued under
    fresh epochs.  Record state is untouched throughout."""
    c = site.conn
    if not in_txn:
        c.execute("BEGIN IMMEDIATE")
    try:
        me = site.site_id
        floor = site.floors().get(me, 0)
        c.execute("INSERT OR REPLACE INTO stash SELECT origin, epoch, hlc, seq, collection, "
                  "key, value, replaced FROM changelog WHERE origin=?", (me,))
        n = c.execute("DELETE FROM changelog WHERE origin=?", (me,)).rowcount
        c.execute("UPDATE vector SET epoch=? WHERE origin=?", (floor, me))
        c.execute("UPDATE links SET told=NULL")
        site.set_meta("state", NORMAL)     # restart the wait: reports must come after now
        enter_recovering(site, reason)
        if not in_txn:
            c.execute("COMMIT")
    except BaseException:
        if not in_txn:
            c.execute("ROLLBACK")
        raise
    return n


def reissue_stash(site: Site) -> int:
    """Give set-aside local ops fresh epochs and CSNs, keeping their transactions together and
    their effect on the records; CSNs they superseded are renamed along with them."""
    from .csn import next_hlc
    c = site.conn
    rows = c.execute("SELECT origin, epoch, hlc, seq, collection, key, value, replaced "
                     "FROM stash ORDER BY epoch").fetchall()
    if not rows:
        return 0
    me = site.site_id
    epoch = site.vector().get(me, 0)
    hlc = int(site.meta("hlc", 0))
    rename: dict[bytes, bytes] = {}
    new_ops = []
    txn_key = None
    for origin, _e, old_hlc, seq, coll, key, value, replaced in rows:
        if old_hlc != txn_key:
            txn_key = old_hlc
            hlc = next_hlc(hlc, site.clock())
        epoch += 1
        old = pack_csn(old_hlc, me, seq)
        new = pack_csn(hlc, me, seq)
        rename[old] = new
        repl = b"".join(rename.get(replaced[i:i + 20], replaced[i:i + 20])
                        for i in range(0, len(replaced), 20))
        new_ops.append(codec.Op(me, epoch, hlc, seq, coll, key, value, repl))
        c.execute("UPDATE versions SET csn=? WHERE collection=? AND key=? AND csn=?",
                  (new, coll, key, old))
        c.execute("UPDATE superseded SET csn=? WHERE csn=?", (new, old))
    site.record_ops(new_ops)
    c.execute("UPDATE vector SET epoch=? WHERE origin=?", (epoch, me))
    site.set_meta("hlc", hlc)
    c.execute("DELETE FROM stash")
    return len(new_ops)


def restore(site: Site, finish: bool = False) -> dict:
    """Declare that this site was restored from a backup (or, with ``finish``, override)."""
    with site.lock():
        c = site.conn
        c.execute("BEGIN IMMEDIATE")
        try:
            if finish:
                site.set_meta("state", NORMAL)
            else:
                stash_own(site, "declared restored from a backup with 'syncpack restore'",
                          in_txn=True)
                # Everything we believed peers held is suspect: our own records are old.
                c.execute("UPDATE matrix SET sent=acked")
                c.execute("UPDATE links SET told=NULL")
                maybe_finish(site)
            c.execute("COMMIT")
        except BaseException:
            c.execute("ROLLBACK")
            raise
    return {"site": site.name, **recovery_status(site)}


# --- scrub ------------------------------------------------------------------------------------

@dataclass
class ScrubPlan:
    ops: dict[bytes, tuple[int, int]]   # origin -> (old floor, new floor)
    tombstones: int
    tombstones_pending: int


def scrub(site: Site, dry_run: bool = False, min_age_ms: int = 0,
          now_ms: int | None = None, progress=None) -> dict:
    from .sync import ack_floor
    now = wall_ms() if now_ms is None else now_ms
    with site.lock():
        c = site.conn
        c.execute("BEGIN IMMEDIATE")
        try:
            acked = ack_floor(site)
            floors = site.floors()
            vec = site.vector()
            plan: dict[bytes, tuple[int, int]] = {}
            for o, e in acked.items():
                new = min(e, vec.get(o, 0))
                if min_age_ms:
                    # Keep ops younger than the minimum age, whatever was acknowledged.
                    row = c.execute("SELECT min(epoch) FROM changelog WHERE origin=? AND "
                                    "epoch>? AND epoch<=? AND hlc>=?",
                                    (o, floors.get(o, 0), new,
                                     (now - min_age_ms) << 16)).fetchone()
                    if row[0] is not None:
                        new = row[0] - 1
                if new > floors.get(o, 0):
                    plan[o] = (floors.get(o, 0), new)
            n_ops = 0
            for o, (lo, hi) in plan.items():
                n_ops += c.execute("SELECT count(*) FROM changelog WHERE origin=? AND epoch>? "
                                   "AND epoch<=?", (o, lo, hi)).fetchone()[0]
            tombs, pending = _tombstones(site, acked, vec, dry_run)
            if not dry_run:
                expect(progress, n_ops)
                for o, (lo, hi) in plan.items():
                    # In steps, so a long trim shows progress; still one transaction.
                    for top in range(lo + SCRUB_STEP, hi + SCRUB_STEP, SCRUB_STEP):
                        n = c.execute("DELETE FROM changelog WHERE origin=? AND epoch<=?",
                                      (o, min(top, hi))).rowcount
                        if progress:
                            progress(n)
                    c.execute("UPDATE vector SET floor=? WHERE origin=?", (hi, o))
            c.execute("COMMIT" if not dry_run else "ROLLBACK")
        except BaseException:
            c.execute("ROLLBACK")
            raise
    return {"dry_run": dry_run, "ops_removed": n_ops, "tombstones_removed": tombs,
            "tombstones_waiting": pending,
            "floors": {site.name_of(o): hi for o, (lo, hi) in plan.items()}}


def _tombstones(site: Site, acked: dict[bytes, int], vec: dict[bytes, int],
                dry_run: bool) -> tuple[int, int]:
    """Two phases.  A tombstone (sole survivor of its key) that every member acknowledged is
    noted with our vector at that moment; it goes once every member has acknowledged that whole
    vector too, because any write concurrent with the delete was issued before its site saw the
    delete and so sits below what we held when all acknowledgements of the delete were in."""
    c = site.conn
    removed = 0
    for coll, key, csn, after in c.execute(
            "SELECT collection, key, csn, after FROM tomb_pending").fetchall():
        need = {o: e for o, e in codec.unpackb(after)}
        still_sole = c.execute("SELECT count(*), max(csn=?) FROM versions WHERE collection=? "
                               "AND key=?", (csn, coll, key)).fetchone()
        if still_sole[0] != 1 or not still_sole[1]:
            if not dry_run:
                c.execute("DELETE FROM tomb_pending WHERE collection=? AND key=? AND csn=?",
                          (coll, key, csn))
            continue
        if all(acked.get(o, 0) >= e for o, e in need.items()):
            removed += 1
            if not dry_run:
                c.execute("DELETE FROM versions WHERE collection=? AND key=? AND csn=?",
                          (coll, key, csn))
                c.execute("DELETE FROM tomb_pending WHERE collection=? AND key=? AND csn=?",
                          (coll, key, csn))
    after_blob = codec.packb(sorted([o, e] for o, e in vec.items() if e))
    pending = 0
    for coll, key, csn in c.execute(
            "SELECT v.collection, v.key, v.csn FROM versions v WHERE v.value IS NULL AND "
            "NOT EXISTS (SELECT 1 FROM versions w WHERE w.collection=v.collection AND "
            "w.key=v.key AND w.csn<>v.csn) AND NOT EXISTS (SELECT 1 FROM tomb_pending t "
            "WHERE t.collection=v.collection AND t.key=v.key AND t.csn=v.csn)").fetchall():
        origin = csn[8:16]
        row = c.execute("SELECT epoch FROM changelog WHERE hlc=? AND origin=? AND seq=?",
                        (int.from_bytes(csn[:8], "big"), origin,
                         int.from_bytes(csn[16:], "big"))).fetchone()
        epoch = row[0] if row else site.floors().get(origin, 0)
        if acked.get(origin, 0) >= epoch:
            pending += 1
            if not dry_run:
                c.execute("INSERT OR IGNORE INTO tomb_pending VALUES (?, ?, ?, ?)",
                          (coll, key, csn, after_blob))
    pending += c.execute("SELECT count(*) FROM tomb_pending").fetchone()[0] if dry_run else 0
    return removed, (c.execute("SELECT count(*) FROM tomb_pending").fetchone()[0]
                     if not dry_run else pending)


# --- retiring a member ------------------------------------------------------------------------

def rmreplica(site: Site, name: str) -> dict:
    m = site.member_named(name)
    if m.site_id == site.site_id:
        raise UsageError("a site cannot retire itself; run rmreplica at another member")
    m.retired = True
    with site.transaction(_system=True) as tx:
        tx._write(ROSTER, m.name, codec.encode_value(m.to_value()))
    return {"site": name, "retired": True}


# --- hard resync ------------------------------------------------------------------------------

def resync_export(site: Site, peer: str, out_dir: str | os.PathLike,
                  max_size: int = DEFAULT_MAX_SIZE, progress=None, encrypt: bool = False) -> list:
    from .replica import write_snapshot
    from .sync import seal_key
    m = site.member_named(peer)
    if m.site_id == site.site_id:
        raise UsageError("resync sends a snapshot to another member")
    with site.lock():
        return write_snapshot(site, m.site_id, m.name, Path(out_dir), max_size,
                              progress=progress, seal_to=seal_key(site, m.site_id, encrypt))


def apply_resync(site: Site, pks: list, progress=None) -> int:
    """Re-seed from a snapshot while keeping every op we hold above the snapshot's vector (our
    own not-yet-acknowledged local ops above all), replayed on top in CSN order."""
    from .sync import _note_header
    first = pks[0].header
    snap = first.vector
    c = site.conn
    c.execute("BEGIN IMMEDIATE")
    try:
        kept = []
        for row in c.execute("SELECT origin, epoch, hlc, seq, collection, key, value, replaced "
                             "FROM changelog ORDER BY hlc, origin, seq"):
            if row[1] > snap.get(row[0], 0):
                kept.append(codec.Op(*row))
        c.execute("DELETE FROM versions")
        c.execute("DELETE FROM superseded")
        c.execute("DELETE FROM tomb_pending")
        c.execute("DELETE FROM changelog")
        n = 0
        for pk in pks:
            from .replica import _check_record_origin
            rows = []
            for r in codec.iter_records(pk.f, pk.env, keys.unsealer(site.path)):
                _check_record_origin(r, snap, site.site_id)
                rows.append((r.collection, r.key, r.csn, r.value))
            c.executemany("INSERT INTO versions VALUES (?, ?, ?, ?)", rows)
            n += len(rows)
            if progress:
                progress(len(rows))
            c.execute("INSERT OR IGNORE INTO packets_in VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                      (pk.header.packet_id, pk.header.sender, pk.header.seq, pk.header.part,
                       pk.header.kind, pk.header.count, str(pk.path), wall_ms()))
        for o, e in snap.items():
            c.execute("INSERT INTO vector(origin, epoch, floor, seeded) VALUES (?, ?, ?, ?) "
                      "ON CONFLICT(origin) DO UPDATE SET epoch=max(epoch, excluded.epoch), "
                      "floor=excluded.floor, seeded=excluded.seeded", (o, e, e, e))
        # Our own set-aside ops the snapshot already covers are the family's (their effect
        # is in the snapshot); only those above it may still need re-issuing.
        c.execute("DELETE FROM stash WHERE origin=? AND epoch<=?",
                  (site.site_id, snap.get(site.site_id, 0)))
        site.invalidate()
        site.record_ops(kept)
        for op in kept:
            site.apply_version(op, pack_csn(op.hlc, op.origin, op.seq))
        for o, e in snap.items():
            top = max([op.epoch for op in kept if op.origin == o], default=e)
            c.execute("UPDATE vector SET epoch=? WHERE origin=?", (max(top, e), o))
        hlc = max(int(site.meta("hlc", 0)), first.hlc_max)
        site.set_meta("hlc", hlc)
        _note_header(site, first)
        c.execute("COMMIT")
    except sqlite3.IntegrityError:
        c.execute("ROLLBACK")
        site.invalidate()
        raise PacketBodyError("snapshot holds the same version twice; nothing was changed") \
            from None
    except BaseException:
        c.execute("ROLLBACK")
        site.invalidate()
        raise
    site.invalidate()
    return n
