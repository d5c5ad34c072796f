"""Replica creation: adding a member to the family and seeding its site from a snapshot packet.

Membership is replicated state (the ``$roster`` collection), so every site learns of a new
member through ordinary packets, relayed like any op.  The roster entry carries the vector the
new site is created from (``base``), which lets every member start its estimate for the newcomer
there instead of at zero.
"""

from __future__ import annotations

import itertools
import os

from pathlib import Path
from typing import Callable

from syncpack.attach import core as attach_core
from syncpack.format import codec, keys
from syncpack.exchange.apply import apply_snapshot
from syncpack.format.codec import Header
from syncpack.format.names import check_new_site_name
from syncpack.format.csn import csn_hlc
from syncpack.errors import PacketError, PacketFormatError, SiteError, UsageError
from syncpack.exchange.links import ensure_link, link, raise_matrix, tip_for
from syncpack.store import chain, fields, log, versions
from syncpack.store import matrix as stored
from syncpack.exchange.packets import DEFAULT_MAX_SIZE, PartInfo, PartSeries, atomic_opener, packet_dir, packet_name, write_records
from syncpack.replicated import ROSTER, Member, check_priority
from syncpack.site import Site, Transaction, wall_ms
from syncpack.exchange.verify import find_packet_files, open_packet, printable, verify
from syncpack.progress import expect

SnapshotPart = PartInfo


def write_snapshot(site: Site, recipient: bytes, recipient_name: str, out_dir: Path,
                   max_size: int, seed: bytes | None = None, now_ms: int | None = None,
                   progress: Callable[[int], None] | None = None,
                   seal_to: bytes | None = None) -> list[SnapshotPart]:
    """Write the whole state at one consistent point as snapshot packet(s) for ``recipient``,
    and record them.  The caller holds the site lock and an open write transaction (so a
    member added in it and its snapshot commit together, or neither does); on failure no part
    is left on the medium."""
    if site.state == "recovering":
        raise SiteError(f"site {site.name!r} is recovering from a restore; its state is not "
                        f"complete enough to seed another site",
                        hint="finish the recovery first, or make the snapshot at another member")
    now = wall_ms() if now_ms is None else now_ms
    sign = site.signer()
    # Our unsealed ops become blocks first, so the snapshot's vector of our own origin ends
    # where a block does: the recipient is then sent whole blocks from there on.
    site.seal_pending()
    conn = site.conn
    vec = {o: e for o, e in chain.applied_vector(conn, site.vector()).items() if e}
    roster = [{"name": m.name, "id": m.site_id, "ed25519": m.ed25519, "x25519": m.x25519,
               "priority": m.priority} for m in site.roster().values() if not m.retired]
    seq = link(site, recipient)["out_seq"] + 1
    # no record may be dated after the snapshot's clock (the recipient checks it)
    hlc = max(site.last_hlc(), *(csn_hlc(c) for c in (versions.newest_csn(conn),
                                                      fields.newest_history_csn(conn)) if c))
    # Each origin's own signed word that it holds what the vector claims of it: a member
    # re-seeded by this snapshot believes the claim only that far (planning.unproven_claim).
    # Ours comes first, signed now over the vector (a site seeded by this snapshot proves with
    # it what it later re-seeds of us); the recipient's own is the proof of its own history.
    acks = [(site.site_id, now, None,
             sign(codec.ack_signed_bytes(site.family_id, site.site_id, now, vec)))]
    acks += [(o, *own) for o in sorted(set(vec) | {recipient}) if o != site.site_id
             and (own := stored.own_acknowledgement(conn, o)) is not None]
    tmpl = Header(kind=codec.KIND_SNAPSHOT, family=site.family_id, sender=site.site_id,
                  recipient=recipient, packet_id=b"", seq=seq, part=0, final=False,
                  created_ms=now, vector=vec, roster=roster, hlc_max=hlc, acks=acks,
                  # a re-seeded member checks that its own history is the one we hold
                  tip=tip_for(site, recipient, vec))
    d = packet_dir(out_dir, site.name, recipient_name)
    opener = atomic_opener(d, lambda part: packet_name(seq, part, "snapshot"),
                           outbox=Path(out_dir) if Path(out_dir).is_dir() else None)
    series = PartSeries(tmpl, sign, max_size, opener, seed, seal_to)
    try:
        if progress:
            expect(progress, versions.count(conn) + fields.count_history(conn))
        records = itertools.chain(site.iter_versions(), itertools.starmap(
            codec.Record, fields.history_records(conn)))
        write_records(series, map(codec.encode_record, records), max_size, bool(seal_to),
                      progress)
        series.finish(True)
        parts = series.parts
        ensure_link(site, recipient)
        stored.note_sent(conn, recipient, seq, vec)
        for p in parts:
            h = p.header
            log.record_out(conn, h.packet_id, recipient, seq, h.part, h.kind, codec.packb([]),
                           h.count, p.size, str(p.path), now)
        raise_matrix(site, recipient, "sent", vec)
    except BaseException:
        series.abort()
        raise
    return parts


def _write_snapshot_committed(site: Site, make, **kw) -> list[SnapshotPart]:
    """Run ``make`` (roster changes) and write the snapshot in one transaction; if the commit
    fails after the files were renamed into place, they go too."""
    parts: list[SnapshotPart] = []
    try:
        with site.write_txn():
            target = make()
            parts = write_snapshot(site, *target, **kw)
    except BaseException:
        for p in parts:
            p.path.unlink(missing_ok=True)
        raise
    site.invalidate()
    return parts


def mkreplica_export(site: Site, name: str, pubkey: str | os.PathLike, out_dir: str | os.PathLike,
                     priority: int = 0, max_size: int = DEFAULT_MAX_SIZE,
                     seed: bytes | None = None, progress=None,
                     encrypt: bool = False) -> list[SnapshotPart]:
    """Add ``name`` to the family and write its replica-creation packet(s), atomically: if the
    packets cannot be written, the member is not added."""
    check_priority(priority)
    check_new_site_name(name)
    if site.state == "recovering":
        raise SiteError(f"site {site.name!r} is recovering from a restore and cannot add "
                        f"members now", hint="finish the recovery first, or add the site at "
                                             "another member")
    ident = keys.read_public_file(Path(pubkey))
    if ident.site != name:
        raise UsageError(f"public key file {pubkey} belongs to site {ident.site!r}, not {name!r}",
                         hint="pass the .pub file that 'syncpack keygen' made for this site")
    roster = site.roster()
    if name in roster:
        if roster[name].retired:
            raise UsageError(f"{name!r} was a member of family {site.family_name!r} and was "
                             f"retired; a retired name is never used again (peers refuse "
                             f"its packets for good)",
                             hint="give the new site another name ('syncpack keygen DIR "
                                  "--site NEWNAME')")
        raise UsageError(f"{name!r} is already a member of family {site.family_name!r}",
                         hint="to re-seed an existing member use 'syncpack resync'")
    if any(m.site_id == ident.site_id for m in roster.values()):
        raise UsageError("a member with that site id already exists; run keygen again")
    alike = [n for n in roster if n.casefold() == name.casefold()]
    if alike:
        # media formatted FAT32 or exFAT (most sticks) see one directory for both names:
        # packets for one would overwrite packets for the other
        raise UsageError(f"{name!r} differs from member {alike[0]!r} only in case, and "
                         f"packet directories on most removable media ignore case",
                         hint="give the new site another name ('syncpack keygen DIR "
                              "--site NEWNAME')")
    seal = ident.x25519 if (encrypt or site.requires_sealing()) else None

    def add_member():
        tx = Transaction(site, True)
        base = {o: e for o, e in chain.applied_vector(site.conn, site.vector()).items() if e}
        base[site.site_id] = tx.epoch + 1   # the roster op written just below
        m = Member(name, ident.site_id, ident.ed25519, ident.x25519, priority, base, False)
        tx.write_raw(ROSTER, name, codec.encode_value(m.to_value()))
        tx.flush()
        site.invalidate()
        return ident.site_id, name, Path(out_dir), max_size, seed

    attach_core.sync_app(site)      # the snapshot holds the attached application's changes
    with site.lock():
        return _write_snapshot_committed(site, add_member, progress=progress, seal_to=seal)


def resync_export(site: Site, peer: str, out_dir: str | os.PathLike,
                  max_size: int = DEFAULT_MAX_SIZE, progress=None, encrypt: bool = False) -> list:
    """A hard resync: a snapshot for a member whose needs fall below our changelog floor."""
    m = site.member_named(peer)
    if m.site_id == site.site_id:
        raise UsageError("resync sends a snapshot to another member",
                         hint="run it at a member that holds the data, with --to naming this "
                              "site; 'syncpack lsepoch' lists the members")
    attach_core.sync_app(site)
    with site.lock():
        seal = site.seal_key(m.site_id, encrypt)
        return _write_snapshot_committed(
            site, lambda: (m.site_id, m.name, Path(out_dir), max_size),
            progress=progress, seal_to=seal)


def mkreplica_import(site: Site, paths: list[str | os.PathLike],
                     progress: Callable[[int], None] | None = None) -> Site:
    """Seed a keygen'd, not-yet-joined site from its snapshot packet(s)."""
    if site.joined:
        raise SiteError(f"site {site.name!r} already belongs to family {site.family_name!r}",
                        hint="mkreplica import seeds a new site made with 'syncpack keygen'")
    missing = [p for p in paths if not os.path.lexists(p)]
    if missing:
        raise PacketFormatError(f"{printable(missing[0])}: no such file or directory; "
                                f"nothing was imported",
                                hint="check the path (is the medium mounted?)")
    groups: dict[tuple[bytes, int], list] = {}
    errors: list[str] = []
    other_keys: list[str] = []     # made for this site's name under another key pair
    opened = []
    seen: set[str] = set()
    try:
        for path, named in find_packet_files(paths):
            if os.path.realpath(path) in seen:   # named twice, or found again in a directory
                continue
            seen.add(os.path.realpath(path))
            try:
                pk = open_packet(path)
            except PacketError as e:
                if named:
                    errors.append(f"{printable(path)}: {e}")
                continue
            opened.append(pk)
            h = pk.header
            if h.kind == codec.KIND_SNAPSHOT and h.recipient != site.site_id and any(
                    m.get("name") == site.name and m.get("id") == h.recipient
                    for m in h.roster if isinstance(m, dict)):
                other_keys.append(printable(path))
                continue
            if h.kind != codec.KIND_SNAPSHOT or h.recipient != site.site_id:
                if named:
                    errors.append(f"{printable(path)}: not a replica-creation packet for "
                                  f"{site.name}")
                continue
            groups.setdefault((h.sender, h.seq), []).append(pk)
        if not groups and other_keys:
            raise PacketFormatError(
                f"the replica-creation packet {other_keys[0]} was made for a site named "
                f"{site.name} with other keys than this site's (its keys made again by "
                f"'syncpack keygen' after 'mkreplica export'?); nothing was imported",
                hint=f"put back the keys directory whose site.pub the sender was given; or "
                     f"have the sender retire {site.name} ('syncpack rmreplica "
                     f"{site.name}') and make a replica for a new site, made with keygen "
                     f"under another name, from its keys/site.pub")
        if not groups:
            raise PacketFormatError(
                "no replica-creation packet for this site was found" +
                (": " + "; ".join(errors) if errors else ""),
                hint="ask the sender for a new snapshot ('syncpack mkreplica export')" if errors
                else "pass the directory 'mkreplica export' wrote")
        # Newest snapshot wins if several were made for this site.
        key = max(groups, key=lambda k: max(p.header.created_ms for p in groups[k]))
        pks = sorted(groups[key], key=lambda p: p.header.part)
        parts = [p.header.part for p in pks]
        if parts != list(range(len(pks))) or not pks[-1].header.final or \
                any(p.header.final for p in pks[:-1]):
            raise PacketFormatError(
                f"snapshot parts are incomplete: have part(s) {parts}, need 0.. up to the "
                f"final part", hint="copy every part of the snapshot onto the medium")
        first = pks[0].header
        for pk in pks:
            h = pk.header
            if (h.family, h.sender, h.seq, h.vector, h.hlc_max, h.roster) != \
                    (first.family, first.sender, first.seq, first.vector, first.hlc_max,
                     first.roster):
                raise PacketFormatError("snapshot parts come from different snapshots")
            verify(site, pk)
        apply_snapshot(site, pks, progress)
    finally:
        for p in opened:
            p.close()
    site.invalidate()
    return site


def snapshot_sender(site: Site) -> Member | None:
    """The member whose snapshot seeded (or last re-seeded) this site, if it is a member."""
    sender = log.last_snapshot_sender(site.conn)
    return site.members_by_id().get(sender) if sender is not None else None
