"""Restore from backup, changelog trimming (scrub), retiring members.

docs/design.md §6.  Trimming only ever uses acknowledgements each member signed itself (received
from it directly or relayed word for word), never estimates of what was sent and never one
member's summary of others.
"""

from __future__ import annotations

from syncpack.format import codec
from syncpack.rules import planning
from syncpack.rules import roster as roster_rule
from syncpack.store import chain, stash, versions
from syncpack.store import matrix as stored
from syncpack.format.csn import csn_hlc, csn_origin, csn_seq, next_hlc, pack_csn, split_csns
from syncpack.store import forks as fork_store
from syncpack.errors import AlreadyRecoveringError, UsageError
from syncpack.exchange.links import ack_floor
from syncpack.progress import expect
from syncpack.replicated import CLASH_HINT, ROSTER, clash_text, decoded_versions
from syncpack.site import Member, Site, wall_ms
from syncpack.exchange.verify import resolved_acks

NORMAL, RECOVERING = "normal", "recovering"
SCRUB_STEP = 50_000

# Why a site's own epoch can hold another op at a peer.  A copy of the site that still runs
# elsewhere (its directory copied to a new machine, the old one left on) signs one history
# while this one signs another, and packets for the site reach whichever imports them:
# neither can heal until one stops, and the one that goes on then heals by rounds.
COPIED = ("restored from a backup or copied, then written to? if another copy of this site "
          "still runs, stop it: this one heals once it runs alone")


# --- restore ---------------------------------------------------------------------------------

def _id_map(site: Site, key: str) -> dict[bytes, int]:
    raw = site.meta(key)
    return {o: e for o, e in codec.unpackb(raw)} if raw else {}


def _set_id_map(site: Site, key: str, m: dict[bytes, int]) -> None:
    site.set_meta(key, codec.packb(sorted([o, e] for o, e in m.items())))


def enter_recovering(site: Site, reason: str) -> None:
    """Called inside a write transaction.  Every peer will be told our (lower) vector again;
    ``recover_asked`` keeps the sequence number of the first packet that tells each one, so we
    can tell later whether a peer's claim was answered (see :func:`note_report`)."""
    if site.state == RECOVERING:
        return
    site.set_meta("state", RECOVERING)
    site.set_meta("restore_ms", wall_ms())
    site.set_meta("recover_reason", reason)
    _set_id_map(site, "recover_reports", {})
    _set_id_map(site, "recover_asked", _next_packets(site))
    stored.forget_told(site.conn)


def _next_packets(site: Site) -> dict[bytes, int]:
    """The sequence number of our next packet to each member."""
    asked = {peer: out + 1 for peer, out in stored.out_seqs(site.conn).items()}
    for m in site.members_by_id():
        asked.setdefault(m, 1)
    return asked


def wait_until_told(site: Site, reason: str) -> None:
    """Called inside a write transaction, when this site keeps its own version at a fork of
    its own history (a copy of it that still ran signed the other, which some peers hold).
    Those peers revert theirs once a packet of ours says which we kept (its header's
    ``kept``); nothing else of ours may be new to them, so nothing else would make us write
    to them, and a packet lost on the way left a peer frozen on us for good.  We wait as a
    restored site does, writing to every peer, and each peer's report counts only once it
    has received a packet of ours sent from now on (one made before did not hear us)."""
    enter_recovering(site, reason)
    # again if we were recovering already: no packet or report before now carried our word
    _set_id_map(site, "recover_asked", _next_packets(site))
    _set_id_map(site, "recover_reports", {})
    stored.forget_told(site.conn)
    site.set_meta("recover_until_told", 1)


def note_report(site: Site, h, applied: bool) -> None:
    """Every verified packet from a member reports how much of our own origin it holds.

    A member holding more of our origin than we do means we were restored from an old copy:
    we refuse local writes until those ops come back.  A tip that differs from our op at that
    epoch means our history forked after a restore: our own ops step aside (:func:`stash_own`).
    Such a claim about our own history delays us only while it is consistent with what we can
    check: a member that saw our report of being behind and still does not send the ops it
    claims is not believed any more (``planning.own_claim_dismissed``), until it stops
    claiming more than we hold."""
    me = site.site_id
    claim = h.vector.get(me, 0)
    held = site.vector().get(me, 0)
    if h.recv_seq > stored.link(site.conn, h.sender)["out_seq"]:
        # It received packets of ours this store does not remember: we were restored from a
        # copy older than them.  Our next packet is numbered after them, and only that one
        # tells it of the restore (else its reply to a packet it got before would read as
        # an answer to our report of being behind, and dismiss its true claim).
        stored.raise_out_seq(site.conn, h.sender, h.recv_seq)
        if site.state == RECOVERING:
            asked = _id_map(site, "recover_asked")
            asked[h.sender] = max(asked.get(h.sender, 1), h.recv_seq + 1)
            _set_id_map(site, "recover_asked", asked)
    if h.tip is not None and h.tip[0] > held:
        held = _unstash_through(site, *h.tip) or held
    # Our own signed acknowledgement, relayed back: proof of how much of our history we held
    # (kept: the member that relays it does so once).
    proven = max([int(site.meta("own_proven", 0)),
                  *(v.get(me, 0) for m, _c, v, _s in resolved_acks(h) if m == me)])
    site.set_meta("own_proven", proven)
    tip_differs = False
    if h.tip is not None and h.tip[0] <= held:
        e, csn = h.tip
        ours = chain.op_id_at(site.conn, me, e)
        tip_differs = ours is not None and pack_csn(ours[0], me, ours[1]) != csn \
            and not _past_a_settled_fork(site, e)
    dismissed = _id_map(site, "recover_dismissed")
    if h.sender in dismissed and claim <= held and not tip_differs:
        # Its word agrees with our history again (a tip that still differs after the family
        # returned our ops to us is the same unbacked claim: it stays dismissed).
        del dismissed[h.sender]
        _set_id_map(site, "recover_dismissed", dismissed)
    believed = h.sender not in dismissed
    if site.state != RECOVERING and believed:
        if claim > held:
            enter_recovering(site, f"{site.name_of(h.sender)} holds epoch {claim} of this "
                                   f"site's own changes, this site only {held}")
        elif tip_differs:
            tips = _id_map(site, "recover_tip_claims")
            if h.sender in tips:
                # The family already returned our history once on this member's word, and it
                # still names another op: its word is not believed again.
                dismissed[h.sender] = h.tip[0]
                _set_id_map(site, "recover_dismissed", dismissed)
                believed = False
            else:
                tips[h.sender] = h.tip[0]
                _set_id_map(site, "recover_tip_claims", tips)
                stash_own(site, f"{site.name_of(h.sender)} holds a different op as epoch "
                                f"{h.tip[0]} of this site ({COPIED})", from_epoch=h.tip[0])
    if h.tip is not None and not tip_differs and h.tip[0] <= held:
        tips = _id_map(site, "recover_tip_claims")
        if tips.pop(h.sender, None) is not None:
            _set_id_map(site, "recover_tip_claims", tips)
    if site.state == RECOVERING and h.created_ms >= int(site.meta("restore_ms", 0)):
        reps = _id_map(site, "recover_reports")
        saw = h.recv_seq >= _id_map(site, "recover_asked").get(h.sender, 1)
        if believed and applied and planning.own_claim_dismissed(claim, held, proven, saw,
                                                                 delivered=claim <= held):
            dismissed[h.sender] = claim
            _set_id_map(site, "recover_dismissed", dismissed)
            believed = False
        if saw or not int(site.meta("recover_until_told", 0)):
            reps[h.sender] = claim if believed else max(held, min(claim, proven))
            _set_id_map(site, "recover_reports", reps)
    if site.state == RECOVERING:
        _note_relayed_reports(site, h, held, proven)
    maybe_finish(site)


def _past_a_settled_fork(site: Site, epoch: int) -> bool:
    """Whether our ``epoch`` lies at or past a fork of our own history that we settled, and
    we hold one of its two versions: the one we kept (the other we set aside, and never take
    back).  A peer's tip naming another op there names the version we left, which it reverts
    once our packets say which we kept; setting ours aside for it (two running copies of the
    site, each version held by some peer) made us refuse, as the one we left, the very
    version we had kept."""
    me = site.site_id
    for f in fork_store.all_forks(site.conn):
        if f.origin == me and f.state != fork_store.OPEN and f.epoch <= epoch:
            held = fork_store.headers_overlapping(site.conn, me, f.epoch - 1, f.epoch)
            if f.a in held or f.b in held:
                return True
    return False


def _note_relayed_reports(site: Site, h, held: int, proven: int) -> None:
    """A member this site exchanges no media with (a spoke behind a hub) reports only through
    its signed acknowledgements, relayed: one made since the restore counts as its report.
    Its claim is believed only as far as our own relayed acknowledgements prove we held (as
    for a member whose direct claim was dismissed): a relayed word cannot be answered."""
    me = site.site_id
    since = int(site.meta("restore_ms", 0))
    reps = _id_map(site, "recover_reports")
    members = site.members_by_id()
    # waiting until every peer is told (wait_until_told), a member's relayed word does not
    # show that it heard us, unless it never writes to us itself (a spoke behind a hub)
    direct_only = int(site.meta("recover_until_told", 0))
    new = {m: max(held, min(v.get(me, 0), proven)) for m, created, v, _s in resolved_acks(h)
           if m != me and m != h.sender and m in members and m not in reps and created >= since
           and not (direct_only and stored.link(site.conn, m)["in_seq"])}
    if new:
        _set_id_map(site, "recover_reports", {**reps, **new})


def _unstash_through(site: Site, epoch: int, csn: bytes) -> int:
    """A member's tip names, as our epoch ``epoch``, the very op we set aside under it: our
    history up to there is the family's (a fork changes every CSN from the fork on), so our
    own ops up to it return to the changelog at once, including the ones peers hold only
    inside snapshots and so can never send back.  Returns the new own epoch, or 0."""
    me = site.site_id
    c = site.conn
    row = stash.op_id_at(c, me, epoch)
    if row is None or pack_csn(row[0], me, row[1]) != csn:
        return 0
    for f in fork_store.all_forks(c):
        if f.origin == me and f.epoch <= epoch and stash.op_id_at(c, me, f.epoch) is not None:
            # Evidence showed that we signed two versions from f.epoch, and we keep the one
            # the peer that showed it holds: a member naming an op we set aside there holds
            # the other, which it reverts once our packets say which was kept.  Ours come
            # back inside the kept version's blocks (apply.py: _unstash), the rest is issued
            # again.
            return 0
    stash.return_through(c, me, epoch)
    stored.raise_epoch(c, me, epoch)
    return epoch


def recovery_status(site: Site) -> dict:
    if site.state != RECOVERING:
        return {"state": NORMAL}
    reps = _id_map(site, "recover_reports")
    held = site.vector().get(site.site_id, 0)
    peers = [m for m in site.members_by_id().values() if m.site_id != site.site_id]
    waiting = sorted(m.name for m in peers if m.site_id not in reps)
    need = max(reps.values(), default=0)
    stashed = stash.count(site.conn)
    st = {"state": RECOVERING, "reason": site.meta("recover_reason", ""),
          "own_epoch": held, "needed_epoch": need, "waiting_for_reports_from": waiting,
          "ops_to_reissue": stashed,
          "claims_dismissed": sorted(site.name_of(m) for m in
                                     _id_map(site, "recover_dismissed"))}
    if waiting:
        st["next_step"] = (f"export to {', '.join(waiting)} and import their answers "
                           f"(ordinary rounds finish the recovery)")
    elif held < need:
        best = max(reps, key=lambda m: reps[m])
        st["next_step"] = (
            f"{site.name_of(best)} holds epochs {held + 1}..{need} of this site; if its next "
            f"packets do not bring them (it holds them only in a snapshot, or trimmed them), "
            f"run 'syncpack --site <{site.name_of(best)}'s directory> resync --to {site.name} "
            f"--out DIR' at {site.name_of(best)} and import the snapshot here")
    return st


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
    site.set_meta("recover_until_told", 0)
    return True


def stash_own(site: Site, reason: str, from_epoch: int | None = None) -> int:
    """Set aside our own ops from ``from_epoch`` on (every one above our floor without it) and
    wind our vector back to just below them.  Called inside a write transaction.

    Our history forked after a restore: our copy may hold ops the family never saw (written
    after the restore, under epochs peers already hold with other ops).  The history below the
    first epoch shown to differ is the family's (a fork changes every block hash from where it
    happens, and the peer that showed it holds the same past), so it stays; from there on we
    cannot tell which ops are the family's, so all of them step aside: peers send our genuine
    ops back (they return to the changelog when their CSN matches), and what is left once every
    peer has reported is re-issued under fresh epochs.  If the fork began lower still, the
    next packet's anchor shows it and this runs again from there.  Record state is untouched
    throughout."""
    c = site.conn
    me = site.site_id
    floor = site.floors().get(me, 0)
    lo = floor + 1 if from_epoch is None or from_epoch <= floor + 1 else from_epoch
    # The signed headers of the first blocks set aside: evidence of the fork arriving later
    # names one of them, and the other is then the version this site keeps (forks.py).
    aside = fork_store.headers_overlapping(c, me, lo - 1, 1 << 62)[:4]     # epochs >= lo
    if aside:
        site.set_meta("set_aside_headers",
                      codec.packb((aside + sorted(set_aside_headers(site)))[:16]))
    if lo == floor + 1:
        ops = chain.take_all(c, me)
        top = floor
    else:
        ops = chain.take_from(c, me, from_epoch)
        top = from_epoch - 1
    stash.put(c, ops)
    n = len(ops)
    stored.set_epoch(c, me, min(site.vector().get(me, 0), top))
    site.set_meta("state", NORMAL)     # restart the wait: reports must come after now
    enter_recovering(site, reason)
    return n


def set_aside_headers(site: Site) -> set[bytes]:
    """Signed headers of our own blocks that :func:`stash_own` set aside (the newest few)."""
    raw = site.meta("set_aside_headers")
    return {bytes(h) for h in codec.unpackb(raw)} if raw else set()


def reissue_stash(site: Site) -> int:
    """Give set-aside local ops fresh epochs and CSNs, keeping their transactions together and
    their effect on the records; CSNs they superseded are renamed along with them."""
    c = site.conn
    rows = stash.rows(c)
    if not rows:
        return 0
    me = site.site_id
    epoch = site.vector().get(me, 0)
    hlc = site.last_hlc()
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
        repl = b"".join(rename.get(r, r) for r in split_csns(replaced))
        new_ops.append(codec.Op(me, epoch, hlc, seq, coll, key, value, repl))
        versions.rename_csn(c, coll, key, old, new)
    site.record_ops(new_ops)
    stored.set_epoch(c, me, epoch)
    site.set_meta("hlc", hlc)
    stash.clear(c)
    return len(new_ops)


def restore(site: Site, finish: bool = False) -> dict:
    """Declare that this site was restored from a backup (or, with ``finish``, override).

    A declared restore, made before any local write, holds a true prefix of our own history:
    nothing steps aside.  Local writes wait until every member has reported and we hold every
    epoch of our own that any of them holds, so no epoch is ever issued twice."""
    with site.lock(), site.write_txn() as c:
        if finish:
            if site.state == RECOVERING:
                # The local writes set aside since the restore are this site's, and no peer
                # holds them: left in the stash they never reached the family.
                reissue_stash(site)
            site.set_meta("state", NORMAL)
            site.set_meta("recover_until_told", 0)
        else:
            if site.state == RECOVERING:
                raise AlreadyRecoveringError(
                    f"site {site.name} is already recovering "
                    f"({recovery_status(site).get('reason') or 'restored'}); nothing changed")
            enter_recovering(site, "declared restored from a backup with 'syncpack restore'")
            # Everything we believed peers held is suspect: our own records are old.
            stored.sent_back_to_acked(c)
            maybe_finish(site)
    return {"site": site.name, **recovery_status(site)}


# --- scrub ------------------------------------------------------------------------------------

def scrub(site: Site, dry_run: bool = False, min_age_ms: int = 0,
          now_ms: int | None = None, progress=None) -> dict:
    now = wall_ms() if now_ms is None else now_ms
    # A dry run writes nothing: every write below is guarded by 'not dry_run'.
    with site.lock(), site.write_txn() as c:
        acked = ack_floor(site)
        for f in fork_store.all_forks(c):
            # Acknowledgements count epochs, not which version: a forked origin's ops from the
            # fork on stay until the fork has ended, so a site can still revert them.
            if f.state != fork_store.ENDED and f.origin in acked:
                acked[f.origin] = min(acked[f.origin], f.epoch - 1)
        floors = site.floors()
        vec = site.vector()
        young: dict[bytes, int] = {}
        if min_age_ms:
            # Keep ops younger than the minimum age, whatever was acknowledged.
            for o, e in acked.items():
                first = chain.first_epoch_since(c, o, floors.get(o, 0), e,
                                                (now - min_age_ms) << 16)
                if first is not None:
                    young[o] = first
        # Never the parts of a transaction still waiting for its last part: every member may
        # hold their epochs, but this site has not applied them and needs them to.
        plan = planning.scrub_floors(acked, floors, chain.applied_vector(c, vec), young)
        n_ops = 0
        for o, (lo, hi) in plan.items():
            n_ops += chain.count_range(c, o, lo, hi)
        tombs, pending = _tombstones(site, acked, vec, floors, dry_run)
        if not dry_run:
            expect(progress, n_ops)
            for o, (lo, hi) in plan.items():
                # In steps, so a long trim shows progress; still one transaction.
                for top in range(lo + SCRUB_STEP, hi + SCRUB_STEP, SCRUB_STEP):
                    n = chain.trim(c, o, min(top, hi))
                    if progress:
                        progress(n)
                stored.set_floor(c, o, hi)
    return {"dry_run": dry_run, "ops_removed": n_ops, "tombstones_removed": tombs,
            "tombstones_waiting": pending,
            "floors": {site.name_of(o): hi for o, (lo, hi) in plan.items()}}


def _tombstones(site: Site, acked: dict[bytes, int], vec: dict[bytes, int],
                floors: dict[bytes, int], dry_run: bool) -> tuple[int, int]:
    """Two phases.  A tombstone (sole survivor of its key) that every member acknowledged is
    noted with our vector at that moment; it goes once every member has acknowledged that whole
    vector too, because any write concurrent with the delete was issued before its site saw the
    delete and so sits below what we held when all acknowledgements of the delete were in."""
    c = site.conn
    removed = 0
    for coll, key, csn, after in versions.pending_tombstones(c):
        need = {o: e for o, e in codec.unpackb(after)}
        if not versions.is_sole_version(c, coll, key, csn):
            if not dry_run:
                versions.forget_pending(c, coll, key, csn)
            continue
        if all(acked.get(o, 0) >= e for o, e in need.items()):
            removed += 1
            if not dry_run:
                versions.remove_tombstone(c, coll, key, csn)
    after_blob = codec.packb(sorted([o, e] for o, e in vec.items() if e))
    pending = 0
    lone = [(coll, key, csn, (csn_hlc(csn), csn_origin(csn), csn_seq(csn)))
            for coll, key, csn in versions.lone_tombstones_not_pending(c)]
    epochs = chain.epochs_of(c, [op for *_r, op in lone])
    for coll, key, csn, op in lone:
        origin = op[1]
        epoch = epochs.get(op, floors.get(origin, 0))
        if acked.get(origin, 0) >= epoch:
            pending += 1
            if not dry_run:
                versions.note_pending(c, coll, key, csn, after_blob)
    pending += versions.count_pending(c) if dry_run else 0
    return removed, (versions.count_pending(c) if not dry_run else pending)


# --- retiring a member ------------------------------------------------------------------------

def rmreplica(site: Site, name: str) -> dict:
    m = site.member_named(name)
    if m.site_id == site.site_id:
        raise UsageError("a site cannot retire itself; run rmreplica at another member",
                         hint="at another member: 'syncpack --site OTHER rmreplica NAME'")
    return _set_retired(site, m, True)


def reinstate(site: Site, name: str) -> dict:
    """Undo a retirement (a mistaken one, or one a lying member wrote): a replicated write,
    as the retirement was; members that hear of it accept the site's packets again."""
    m = site.roster().get(name)
    if m is None:
        raise UsageError(f"no member named {name!r} in family {site.family_name!r}",
                         hint="members, retired ones too: " + ", ".join(sorted(site.roster())))
    if m.clashes_with:
        raise UsageError(clash_text(m, site.family_name), hint=CLASH_HINT)
    if not m.retired:
        raise UsageError(f"{name} is not retired; nothing to undo")
    return _set_retired(site, m, False)


def _set_retired(site: Site, m: Member, retired: bool) -> dict:
    m.retired = retired
    with site.transaction(_system=True) as tx:
        tx.write_raw(ROSTER, m.name, codec.encode_value(m.to_value()))
    return {"site": m.name, "retired": retired}


def retired_members(site: Site) -> list[dict]:
    """Each retired member and the members whose writes retired it: a member may retire
    another by a lie, and the family should see who did it and whom (the site retired
    hears of it only from its peers' silence, since they neither send it packets nor take
    its own)."""
    out = []
    for name, m in sorted(site.roster().items()):
        if m.retired:
            # only the versions that say retired: a concurrent write of the same entry (a
            # priority) survives beside the retirement without having retired anyone
            vs = decoded_versions(versions.of_key(site.conn, ROSTER, name))
            writers = {csn_origin(csn) for csn in roster_rule.retiring(vs)}
            entry = {"site": name, "by": sorted(site.name_of(o) for o in writers)}
            if m.clashes_with:
                entry["name_clash"] = m.clashes_with
                # who wrote the keeper's entry as it stands (whoever added it, if no write
                # came after: a later priority or undo replaces the adding write)
                entry["name_clash_written_by"] = sorted({
                    site.name_of(csn_origin(v.csn))
                    for v in versions.of_key(site.conn, ROSTER, m.clashes_with)})
            out.append(entry)
    return out
