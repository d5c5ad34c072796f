"""Replica creation: adding a member to the family and seeding its site from a snapshot packet.

Membership is replicated state (the ``$roster`` collection), so every site learns of a new
member through ordinary packets, relayed like any op.  The roster entry carries the vector the
new site is created from (``base``), which lets every member start its estimate for the newcomer
there instead of at zero.
"""

from __future__ import annotations

import os
import sqlite3

from pathlib import Path
from typing import Callable

from . import codec, keys
from .codec import Header
from .errors import PacketBodyError, PacketError, PacketFormatError, PacketSignatureError, SiteError, UsageError
from .packets import DEFAULT_MAX_SIZE, PACKET_SUFFIX, PartInfo, PartSeries, atomic_opener
from .progress import expect
from .site import FAMILY, FAMILY_KEY, ROSTER, Member, Site, wall_ms
from .sync import (_ensure_link, _raise_matrix, _vec_blob, check_signature, find_packet_files,
                   link, open_packet, packet_dir)

SnapshotPart = PartInfo


def _check_record_origin(rec, vector: dict[bytes, int], me: bytes | None) -> None:
    """Every version in a snapshot comes from an origin the snapshot's vector covers."""
    origin = rec.csn[8:16]
    if vector.get(origin, 0) <= 0 and origin != me:
        raise PacketBodyError(f"snapshot holds a version of {rec.collection}/{rec.key} from an "
                              f"origin its vector does not cover")


def write_snapshot(site: Site, recipient: bytes, recipient_name: str, out_dir: Path,
                   max_size: int, seed: bytes | None = None, now_ms: int | None = None,
                   progress: Callable[[int], None] | None = None,
                   seal_to: bytes | None = None) -> list[SnapshotPart]:
    """Write the whole state at one consistent point as snapshot packet(s) for ``recipient``.
    The caller holds the site lock; this opens its own read snapshot."""
    if site.state == "recovering":
        raise SiteError(f"site {site.name!r} is recovering from a restore; its state is not "
                        f"complete enough to seed another site",
                        hint="finish the recovery first, or make the snapshot at another member")
    now = wall_ms() if now_ms is None else now_ms
    sign = keys.load_signing_key(site.path).sign
    conn = site.conn
    conn.execute("BEGIN")
    try:
        vec = {o: e for o, e in site.vector().items() if e}
        roster = [{"name": m.name, "id": m.site_id, "ed25519": m.ed25519, "x25519": m.x25519,
                   "priority": m.priority} for m in site.roster().values() if not m.retired]
        seq = link(site, recipient)["out_seq"] + 1
        hlc = int(site.meta("hlc", 0))
        tmpl = Header(kind=codec.KIND_SNAPSHOT, family=site.family_id, sender=site.site_id,
                      recipient=recipient, packet_id=b"", seq=seq, part=0, final=False,
                      created_ms=now, vector=vec, roster=roster, hlc_max=hlc)
        d = packet_dir(out_dir, site.name, recipient_name)
        opener = atomic_opener(d, lambda part: f"{seq:010d}-{part:04d}.snapshot{PACKET_SUFFIX}")
        series = PartSeries(tmpl, sign, max_size, opener, seed, seal_to)
        if progress:
            expect(progress, conn.execute("SELECT count(*) FROM versions").fetchone()[0])
        try:
            for rec in site.iter_versions():
                raw = codec.encode_record(rec)
                if not series.fits(len(raw)):
                    if series.count:
                        series.cut()
                    if not series.fits(len(raw)):
                        raise series.too_big(len(raw), "record")
                series.write(raw, 1)
                if progress:
                    progress(1)
            series.finish(True)
        except BaseException:
            series.abort()
            raise
        parts = series.parts
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("BEGIN IMMEDIATE")
    try:
        _ensure_link(site, recipient)
        conn.execute("UPDATE links SET out_seq=max(out_seq, ?), told=? WHERE peer=?",
                     (seq, _vec_blob(vec), recipient))
        for p in parts:
            h = p.header
            conn.execute("INSERT INTO packets_out VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                         (h.packet_id, recipient, seq, h.part, h.kind, codec.packb([]), h.count,
                          p.size, str(p.path), now))
        _raise_matrix(site, recipient, "sent", vec)
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return parts


def mkreplica_export(site: Site, name: str, pubkey: str | os.PathLike, out_dir: str | os.PathLike,
                     priority: int = 0, max_size: int = DEFAULT_MAX_SIZE,
                     seed: bytes | None = None, progress=None,
                     encrypt: bool = False) -> list[SnapshotPart]:
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
        raise UsageError(f"{name!r} is already a member of family {site.family_name!r}" +
                         (" (retired)" if roster[name].retired else ""),
                         hint="to re-seed an existing member use 'syncpack resync'")
    if any(m.site_id == ident.site_id for m in roster.values()):
        raise UsageError("a member with that site id already exists; run keygen again")
    with site.lock():
        with site.transaction(_system=True) as tx:
            base = {o: e for o, e in site.vector().items() if e}
            base[site.site_id] = tx.epoch + 1   # the roster op written just below
            m = Member(name, ident.site_id, ident.ed25519, ident.x25519, priority, base, False)
            tx._write(ROSTER, name, codec.encode_value(m.to_value()))
        seal = ident.x25519 if (encrypt or site.requires_sealing()) else None
        return write_snapshot(site, ident.site_id, name, Path(out_dir), max_size, seed,
                              progress=progress, seal_to=seal)


def mkreplica_import(site: Site, paths: list[str | os.PathLike],
                     progress: Callable[[int], None] | None = None) -> Site:
    """Seed a keygen'd, not-yet-joined site from its snapshot packet(s)."""
    if site.joined:
        raise SiteError(f"site {site.name!r} already belongs to family {site.family_name!r}",
                        hint="mkreplica import seeds a new site made with 'syncpack keygen'")
    me_pub = keys.read_public_file(keys.public_path(site.path))
    groups: dict[tuple[bytes, int], list] = {}
    errors: list[str] = []
    for path, named in find_packet_files(paths):
        try:
            pk = open_packet(path)
        except PacketError as e:
            if named:
                errors.append(f"{path}: {e}")
            continue
        h = pk.header
        if h.kind != codec.KIND_SNAPSHOT or h.recipient != site.site_id:
            pk.close()
            if named:
                errors.append(f"{path}: not a replica-creation packet for {site.name}")
            continue
        groups.setdefault((h.sender, h.seq), []).append(pk)
    try:
        if not groups:
            raise PacketFormatError(
                "no replica-creation packet for this site was found" +
                (": " + "; ".join(errors) if errors else ""),
                hint="pass the directory 'mkreplica export' wrote")
        # Newest snapshot wins if several were made for this site.
        key = max(groups, key=lambda k: max(p.header.created_ms for p in groups[k]))
        pks = sorted(groups[key], key=lambda p: p.header.part)
        parts = [p.header.part for p in pks]
        if parts != list(range(len(pks))) or not pks[-1].header.final:
            raise PacketFormatError(
                f"snapshot parts are incomplete: have part(s) {parts}, need 0.. up to the "
                f"final part", hint="copy every part of the snapshot onto the medium")
        first = pks[0].header
        for pk in pks:
            _verify_snapshot(pk, first, site, me_pub)
        from .sync import DEFAULT_SKEW_MS
        from .csn import hlc_from_ms
        if first.hlc_max > hlc_from_ms(wall_ms() + DEFAULT_SKEW_MS):
            from .errors import ClockSkewError
            raise ClockSkewError("snapshot carries changes stamped more than a day ahead of "
                                 "this site's clock")
        _seed(site, pks, progress)
    finally:
        for ps in groups.values():
            for p in ps:
                p.close()
    site.invalidate()
    return site


def _verify_snapshot(pk, first: Header, site: Site, me: keys.PublicIdentity) -> None:
    h = pk.header
    if (h.family, h.sender, h.seq, h.vector) != (first.family, first.sender, first.seq,
                                                   first.vector):
        raise PacketFormatError("snapshot parts come from different snapshots")
    roster = {m["id"]: m for m in h.roster}
    mine = roster.get(site.site_id)
    if mine is None or mine["ed25519"] != me.ed25519 or mine["name"] != site.name:
        raise PacketSignatureError("snapshot's roster does not hold this site's public key",
                                   hint="the snapshot was made for another key pair")
    sender = roster.get(h.sender)
    if sender is None or not check_signature(pk, sender["ed25519"]):
        raise PacketSignatureError("snapshot signature does not verify with its sender's key")
    if not codec.body_hash_matches(pk.f, pk.env):
        raise PacketBodyError("snapshot body does not match the hash in its signed header")


def _seed(site: Site, pks: list, progress) -> None:
    first = pks[0].header
    expect(progress, sum(pk.header.count for pk in pks))
    conn = site.conn
    conn.execute("BEGIN IMMEDIATE")
    try:
        for pk in pks:
            rows = []
            for rec in codec.iter_records(pk.f, pk.env, keys.unsealer(site.path)):
                _check_record_origin(rec, first.vector, None)
                rows.append((rec.collection, rec.key, rec.csn, rec.value))
                if len(rows) >= 20_000:
                    conn.executemany("INSERT INTO versions VALUES (?, ?, ?, ?)", rows)
                    if progress:
                        progress(len(rows))
                    rows = []
            conn.executemany("INSERT INTO versions VALUES (?, ?, ?, ?)", rows)
            if progress and rows:
                progress(len(rows))
            conn.execute("INSERT INTO packets_in VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                         (pk.header.packet_id, pk.header.sender, pk.header.seq, pk.header.part,
                          pk.header.kind, pk.header.count, str(pk.path), wall_ms()))
        conn.executemany("INSERT INTO vector(origin, epoch, floor, seeded) VALUES (?, ?, ?, ?) "
                         "ON CONFLICT(origin) DO UPDATE SET epoch=excluded.epoch, "
                         "floor=excluded.floor, seeded=excluded.seeded",
                         [(o, e, e, e) for o, e in first.vector.items()])
        site.set_meta("family_id", first.family)
        site.set_meta("hlc", max(int(site.meta("hlc", 0)), first.hlc_max))
        site.set_meta("joined", 1)
        site.invalidate()
        fam = site._versions(FAMILY, FAMILY_KEY)
        name = codec.decode_value(fam[0].value)["name"] if fam and fam[0].value else ""
        site.set_meta("family_name", name)
        _ensure_link(site, first.sender)
        conn.execute("UPDATE links SET in_seq=? WHERE peer=?", (first.seq, first.sender))
        _raise_matrix(site, first.sender, "acked", first.vector)
        conn.execute("COMMIT")
    except sqlite3.IntegrityError:
        conn.execute("ROLLBACK")
        raise PacketBodyError("snapshot holds the same version twice; nothing was changed") \
            from None
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    site.joined = True
    site.family_id = first.family
