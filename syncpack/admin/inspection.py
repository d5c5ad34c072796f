"""Inspection and maintenance: lsepoch, chepoch, status, fsck, load, lspacket."""

from __future__ import annotations

import hashlib
import os
from itertools import chain as concat, groupby
from operator import itemgetter
from pathlib import Path
from typing import Callable, Iterator

from syncpack.admin import loading, writes
from syncpack.attach import core as attach_core
from syncpack.format import blocks, codec
from syncpack.rules import planning
from syncpack.rules.replay import replay_key
from syncpack.store import attached, chain, db, fields, log, scratch, stash, versions
from syncpack.store import matrix as stored
from syncpack.format.csn import csn_origin, hlc_ms, pack_csn, split_csns
from syncpack.store import forks as fork_store
from syncpack.exchange import forks
from syncpack.errors import (InvalidValueError, PacketError, SyncpackError,
                             UsageError)
from syncpack.site import TABLES, Site, wall_ms
from syncpack.admin.conflicts import count_conflicts
from syncpack.exchange.links import (acknowledgements, believed, link, matrix,
                                     ranges_from_blob)
from syncpack.exchange.verify import (DEFAULT_SKEW_MS, find_packet_files, open_packet,
                                      printable, signature_state, told_if_unreadable)
from syncpack.progress import expect


def lsepoch(site: Site) -> dict:
    peers = {}
    vec = site.vector()

    def every_origin(m: dict[bytes, int]) -> dict[str, int]:
        # an origin nothing was sent of (or acknowledged) yet is 0, as in the text table, so
        # that a script can read any origin of the vector
        return site.named({**{o: 0 for o in vec}, **m})

    for m in sorted(site.members_by_id().values(), key=lambda m: m.name):
        if m.site_id == site.site_id:
            continue
        sent, acked = matrix(site, m.site_id)
        peers[m.name] = {"sent": every_origin(sent), "acked": every_origin(acked)}
    return {"site": site.name, "family": site.family_name,
            "vector": site.named(vec), "peers": peers}


def chepoch(site: Site, peer: str, settings: list[str]) -> dict:
    m = site.member_named(peer)
    if m.site_id == site.site_id:
        raise UsageError("chepoch corrects what we believe a peer holds; name another site",
                         hint="'syncpack lsepoch' lists the peers")
    changes = {}
    given: set[str] = set()
    for s in settings:
        origin, sep, epoch = s.partition("=")
        if not sep or not origin:
            raise InvalidValueError(f"expected ORIGIN=EPOCH, got {s!r}",
                             hint="for example: syncpack chepoch sanfran boston=120")
        if not epoch.isascii() or not epoch.isdigit():    # int() also takes '+3', '1_0'
            raise InvalidValueError(f"epoch must be a whole number >= 0 in {s!r}",
                             hint="for example: syncpack chepoch sanfran boston=120")
        e = int(epoch)
        if origin in given:     # which of the two was meant cannot be guessed
            raise InvalidValueError(f"{origin} is given twice",
                                    hint="give each origin once: ORIGIN=EPOCH")
        given.add(origin)
        o = (site.member_named(origin).site_id if origin in site.roster()
             else _origin_by_name(site, origin))
        held = site.vector().get(o, 0)
        if e > held:
            # We cannot have sent what we do not hold; believing it would stop every export
            # of that origin to the peer for good.
            raise UsageError(f"{origin}={e} is more than this site holds of {origin} "
                             f"({held}); it cannot have sent the peer more",
                             hint=f"give at most {origin}={held}; 'syncpack lsepoch' shows "
                                  f"what each peer acknowledged")
        changes[o] = e
    with site.lock(), site.write_txn() as c:
        for o, e in changes.items():
            stored.correct_sent(c, m.site_id, o, e)
    return lsepoch(site)


def _origin_by_name(site: Site, name: str) -> bytes:
    for o, n in site.names().items():
        if n == name:
            return o
    raise UsageError(f"no origin named {name!r}",
                     hint="'syncpack lsepoch' lists the origins this site knows")


def status(site: Site) -> dict:
    # an attached application's changes count too
    synced = attach_core.sync_app(site, wait=False)
    # the application held its lock through one brief wait: the figures need not wait again
    report_wait = 0 if synced and "busy" in synced else attach_core.BRIEF_WAIT_MS
    vec = site.vector()
    received, sent_at = _last_packet_times(site)
    # A peer we exchange no media with (a spoke behind a hub) is known only by its own signed
    # acknowledgements, relayed: what scrub trims by, so the lag shown agrees with it.
    signed = {m: v for m, (_created, v, _sig) in acknowledgements(site).items()}
    peers = {}
    for m in sorted(site.members_by_id().values(), key=lambda m: m.name):
        if m.site_id == site.site_id:
            continue
        bel, reported = believed(site, m.site_id)
        own = signed.get(m.site_id, {})
        bel, reported = planning.merge_max(bel, own), planning.merge_max(reported, own)
        sent, acked = matrix(site, m.site_id)
        lk = link(site, m.site_id)
        peers[m.name] = {
            "lag_ops": planning.lag(vec, bel, m.site_id, reported),
            "unacknowledged_ops": sum(max(0, e - acked.get(o, 0)) for o, e in sent.items()),
            "packets_sent": lk["out_seq"], "packets_received": lk["in_seq"],
            "last_received_ms": received.get(m.site_id), "last_sent_ms": sent_at.get(m.site_id),
        }
    parked = []
    for pid, sender, seq, part, origin_path, w in log.parked(site.conn):
        parked.append({"packet_id": pid.hex(), "from": site.name_of(sender), "seq": seq,
                       "part": part, "path": origin_path,
                       # stored at parking time; narrowed to what is still missing now
                       "waiting_for": {site.name_of(o): [max(lo, vec.get(o, 0)), hi]
                                       for o, (lo, hi) in sorted(ranges_from_blob(w).items())
                                       if hi > vec.get(o, 0)}})
    conflicts = count_conflicts(site)
    changelog = chain.count(site.conn)
    # parts of a transaction too large for one block, held until its last part arrives
    incomplete = [{"origin": site.name_of(o), "epochs": [lo + 1, hi], "parts": n}
                  for o, (lo, hi, n) in sorted(chain.incomplete(site.conn).items())]
    from syncpack.admin.recovery import recovery_status, retired_members
    return {"site": site.name, "family": site.family_name, "state": site.state,
            "retired": retired_members(site),
            "recovery": recovery_status(site), "peers": peers, "parked": parked,
            "incomplete_transactions": incomplete, "conflicts": conflicts,
            "changelog_ops": changelog, "vector": site.named(vec),
            "attached": attach_core.report(site, report_wait) if attach_core.is_attached(site) else None,
            "forks": [forks.describe(site, f) for f in fork_store.all_forks(site.conn)],
            **stamps_ahead(site)}


def stamps_ahead(site: Site) -> dict:
    """How far this site's newest stamp (of its own changes, or of changes it took in) lies
    ahead of its clock now, and until when peers refuse its packets for it.  Past the import
    skew limit only a clock that ran fast when this site wrote can cause it (a peer's stamps
    that far ahead are refused here), and every peer refuses its packets until its clock
    catches up."""
    now = wall_ms()
    ahead = max(0, hlc_ms(site.last_hlc()) - now)
    return {"stamps_ahead_ms": ahead, "refused_until_ms":
            now + ahead - DEFAULT_SKEW_MS if ahead > DEFAULT_SKEW_MS else None}


def _last_packet_times(site: Site) -> tuple[dict[bytes, int], dict[bytes, int]]:
    """Per peer, when we last took in a packet from it (applied, or parked: it arrived) and
    when we last wrote one for it, in wall-clock ms."""
    now = wall_ms()
    return log.last_received(site.conn, now), log.last_sent(site.conn, now)


def digest(site: Site) -> dict:
    d, n = site.digest()
    # Zero entries are left out: a site that never wrote lists itself at 0, others omit it.
    return {"digest": d, "records": n,
            "vector": site.named({o: e for o, e in site.vector().items() if e})}


def load(site: Site, path: str | os.PathLike, progress=None) -> dict:
    """JSON lines, all in one store transaction; a bad line rejects the whole file."""
    p = Path(path)
    # Every object made here is acyclic; the cyclic collector would otherwise walk the growing
    # heap again and again (a third of a load's CPU time at 200,000 records).
    with blocks.gc_paused():
        records, parts = loading.parsed(p, getattr(progress, "expect", None) is not None)
        try:
            return _load_batches(site, parts, records, progress)
        finally:
            parts.close()       # a child still parsing is stopped


def _load_batches(site: Site, parts, records: int, progress) -> dict:
    expect(progress, records)
    loaded = deleted = 0
    # Each batch is parsed just before it is written (by a child process, for a large file,
    # while this one writes the one before), so only a batch or two of encoded rows is held
    # (a 1M-record load peaked at 743 MB holding them all, 486 MB so); a bad line rolls the
    # store transaction, all of the file, back.
    collections: set[str] = set()
    tables: dict[str, bool] = {}     # collection -> whether it is a table of the family
    failed = writes.capture_first(site)     # as put does (which tables it writes is not known)
    with site.transaction() as tx:
        for i, (batch, deletes) in enumerate(parts):
            if i:
                tx.part()       # one transaction at every site, travelling in parts
            for name in set(map(itemgetter(0), batch)):
                if name not in tables:
                    tables[name] = attached.family_table(site.conn, TABLES, name)
                if not tables[name]:
                    continue
                attach_core.check_values(site, name, [
                    (k, codec.decode_value(raw)) for c, k, raw in batch if c == name and raw])
            tx.write_rows(batch)
            collections.update(map(itemgetter(0), batch))
            loaded += len(batch)
            deleted += deletes
            if progress:
                progress(len(batch))
    writes.into_attached(site, collections, failed=failed)     # as a put does
    return {"loaded": loaded, "puts": loaded - deleted, "deletes": deleted}


def fsck_opening(open_site: Callable[[], Site]) -> dict:
    """:func:`fsck` of the site ``open_site`` opens: a store too damaged to open is a failed
    check too (told as one, with its hint, not as an error whose hint is to run fsck)."""
    try:
        site = open_site()
    except db.DatabaseError as e:
        if isinstance(e, db.BusyErrors) or db.access_problem(e) is not None:
            raise
        return {"ok": False, "problems": [f"the store cannot be opened: {e}"],
                "hint": DAMAGED_HINT, "changelog_ops": 0}
    return fsck(site)


def fsck(site: Site) -> dict:
    """Check the store's invariants; returns {"ok", "problems", ...}.  Under the site's lock:
    an import or capture running beside it commits the store and the attached file one after
    the other, and between the two they differ as they never do at rest."""
    with site.lock():
        return _fsck(site)


def _fsck(site: Site) -> dict:
    c = site.conn
    problems: list[str] = []
    stats: dict = {}
    with db.read_txn(c):
        # read in the snapshot the checks use: a local write committed before it (through
        # the API, which takes no lock) would otherwise read as a vector the changelog lacks
        site.invalidate()
        try:
            ic = db.integrity_check(c)
            if ic:
                problems.append("sqlite integrity_check: " + "; ".join(ic))
        except Exception as e:  # a damaged file can fail the check itself
            problems.append(f"sqlite integrity_check failed: {e}")
        try:
            stats = _store_checks(site, problems)
        except db.DatabaseError as e:
            return _unreadable(problems, e)
    try:
        in_app = attach_core.check(site)
    except db.DatabaseError as e:
        return _unreadable(problems, e)
    if in_app and not problems:
        # The store is sound and only the application's file differs from it: a backup of the
        # store would not help; taking the rows as they are does.
        hint = attach_core.check_hint(site, in_app)
    else:
        hint = DAMAGED_HINT
    problems += in_app
    return {"ok": not problems, "problems": problems, "hint": None if not problems else hint,
            "changelog_ops": sum(s[2] for s in stats.values()) if stats else 0}


DAMAGED_HINT = "restore the site from a backup, or re-seed it with a snapshot"


def _unreadable(problems: list[str], e: BaseException) -> dict:
    """fsck's report when damage (which SQLite's own check named) stops its other checks:
    said as their failure, rather than as an error whose hint is to run fsck."""
    if isinstance(e, db.BusyErrors):
        raise e
    return {"ok": False, "hint": DAMAGED_HINT, "changelog_ops": 0,
            "problems": problems + [f"the other checks could not read the store: {e}"]}


def _store_checks(site: Site, problems: list[str]) -> dict:
    """The checks of the store past SQLite's own, each failure added to ``problems``;
    returns each origin's held changelog ranges."""
    c = site.conn
    names = site.names()
    vec = site.vector()
    floors = site.floors()
    stats = chain.held_ranges(c)
    for o in set(stats) | set(vec):
        nm = names.get(o, o.hex())
        floor = floors.get(o, 0)
        lo, hi, n = stats.get(o, (None, None, 0))
        if n:
            if lo > floor + 1 or chain.count_range(c, o, floor, hi) != hi - floor:
                problems.append(f"changelog of {nm} is not contiguous: {n} ops between "
                                f"epochs {lo} and {hi}, floor {floor}")
            if vec.get(o) != hi:
                problems.append(f"vector says {nm} is at epoch {vec.get(o)}, changelog "
                                f"holds up to {hi}")
        elif vec.get(o, 0) != floor:
            problems.append(f"vector says {nm} is at epoch {vec.get(o)}, changelog holds "
                            f"nothing above floor {floor}")
    problems += _block_check(site)
    max_hlc = chain.max_hlc(c)
    if max_hlc > site.last_hlc():
        problems.append("clock is behind a CSN in the changelog")
    problems += _replay_check(site)
    return stats


def _block_check(site: Site) -> list[str]:
    """Every stored block still verifies with its origin's key and matches its signed body
    hash (a damaged or swapped row shows here)."""
    c = site.conn
    members = site.members_by_id(include_retired=True)
    problems = []
    for origin, lo, hi, data in chain.block_rows(c):
        m = members.get(origin)
        who = f"block of {site.name_of(origin)} (epochs {lo + 1}..{hi})"
        if m is None:
            problems.append(f"{who} is of an origin that is not a member")
            continue
        try:
            info = blocks.read_block_header(data, site.family_id)
            # The chain was checked on import; an origin that sealed again after a restore
            # legitimately leaves two links that differ here.
            blocks.verify_block(info, m.ed25519, site.family_id, None)
        except SyncpackError as e:
            problems.append(f"{who}: {e}")
    return problems


def _replay_check(site: Site) -> list[str]:
    """Record state must equal a replay of the changelog on top of the snapshot base.

    One key at a time (rules/replay.py), the ops spooled to a temporary file by key, so
    memory stays flat in the size of the store; values are compared by their digests."""
    c = site.conn
    # A re-seeded site keeps its own ops the snapshot covered, to pass on; their effect is in
    # the snapshot's records like that of the ops it trimmed, so they are no part of the replay.
    floors = stored.covered(c)
    problems: list[str] = []
    differ = unlogged = 0
    spool = scratch.OpsByKey()
    try:
        # a patch's record is its base's plus the fields it sent (every base is held here)
        ops = fields.full_values(c, concat((op for op in chain.iter_all(c)
                                            if op.epoch > floors.get(op.origin, 0)),
                                           stash.ops(c)))
        spool.add((op.collection, op.key, pack_csn(op.hlc, op.origin, op.seq),
                   _fingerprint(op.value), op.replaced) for op in ops)
        held = groupby(versions.rows_by_csn(c), key=itemgetter(0, 1))
        for (coll, key), vs, key_ops in _by_key(held, spool.groups()):
            if len(vs) == 1 and len(key_ops) == 1 and not key_ops[0][2] and \
                    vs[0] == key_ops[0][:2]:
                continue        # most keys: one op, replacing nothing, is the one version
            own = {csn for csn, _v, _r in key_ops}

            def logged(csn: bytes) -> bool:
                return csn in own or spool.holds(csn)

            base = []
            for csn, value in vs:
                if not logged(csn):
                    if floors.get(csn_origin(csn), 0) == 0:
                        unlogged += 1
                        if unlogged <= 10:
                            problems.append(f"version {csn.hex()} of {coll}/{key} has no "
                                            f"changelog op")
                    base.append((csn, value))   # from a snapshot, or trimmed
            replayed = replay_key(base, ((csn, v, split_csns(r)) for csn, v, r in key_ops),
                                  logged)
            if replayed != dict(vs):
                differ += 1
                if differ <= 10:
                    problems.append(f"record {coll}/{key} differs from a replay of the "
                                    f"changelog")
    finally:
        spool.close()
    if unlogged > 10:
        problems.append(f"... and {unlogged - 10} more versions have no changelog op")
    if differ > 10:
        problems.append(f"... and {differ - 10} more records differ")
    return problems


def _fingerprint(value: bytes | None) -> bytes | None:
    return None if value is None else hashlib.blake2b(value, digest_size=16).digest()


def _by_key(held, spooled) -> Iterator[tuple[tuple[str, str], list, list]]:
    """Both key-ordered streams side by side: ``(key, [(csn, fingerprint)...] held, [op...]
    spooled)`` for every key either has (SQLite's order of TEXT, as Python's of str)."""
    none = (None, None)
    h = next(held, none)
    s = next(spooled, none)
    while h[0] is not None or s[0] is not None:
        if s[0] is None or (h[0] is not None and h[0] < s[0]):
            yield h[0], [(r[2], _fingerprint(r[3])) for r in h[1]], []
            h = next(held, none)
        elif h[0] is None or s[0] < h[0]:
            yield s[0], [], s[1]
            s = next(spooled, none)
        else:
            yield h[0], [(r[2], _fingerprint(r[3])) for r in h[1]], s[1]
            h, s = next(held, none), next(spooled, none)


def lspacket(paths: list[str], site: Site | None = None) -> dict:
    """Describe packets without applying them; with a joined site, the signature is checked
    by the same code the verifier uses."""
    out = []
    errors = []
    for path, named in find_packet_files(paths):
        if named and not os.path.lexists(path):
            errors.append({"path": printable(path), "error": "no such file or directory",
                           "hint": "check the path (is the medium mounted?)"})
            continue
        try:
            pk = open_packet(path)
        except PacketError as e:
            if told_if_unreadable(path, named):     # as import tells it
                errors.append({"path": printable(path), "error": str(e), "hint": e.hint})
            continue
        try:
            h = pk.header
            names = site.names() if site else {}
            if h.kind == codec.KIND_SNAPSHOT and not (site and site.joined
                                                      and h.family == site.family_id):
                names = {m["id"]: m["name"] for m in h.roster}
            sig = signature_state(site, pk)
            nm = lambda o: printable(names.get(o, o.hex()))
            out.append({"path": printable(path), "kind": h.kind, "from": nm(h.sender),
                        "to": nm(h.recipient), "family_id": h.family.hex(),
                        "packet_id": h.packet_id.hex(), "seq": h.seq, "part": h.part,
                        "final": h.final, "created_ms": h.created_ms,
                        # as export counts them: a block's ops once, in its first piece
                        "ops": h.count if not h.piece or h.piece[0] == 0 else 0,
                        "bytes": pk.env.size,
                        "ranges": {nm(o): [lo, hi] for o, (lo, hi) in sorted(h.ranges.items())},
                        "vector": {nm(o): e for o, e in sorted(h.vector.items())},
                        "signature": sig, "sealed": h.sealed,
                        "piece": list(h.piece) if h.piece else None,
                        # ids a site could not name (no site, or not a member it knows)
                        "named": all(o in names for o in (h.sender, h.recipient))})
        finally:
            pk.close()
    return {"packets": out, "errors": errors}
