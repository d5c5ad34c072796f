"""Export and import of update packets: planning against the epoch matrix, verification, gap
checks, parking, and applying in CSN order.

The rules are DESIGN.md §4-§6.  Verification order is fixed (see :func:`verify`); every failure
raises a :class:`PacketError` subclass and leaves the store untouched.
"""

from __future__ import annotations

import heapq
import os
import shutil
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Callable, Iterable, Iterator

from . import codec, keys, planning
from .codec import Envelope, Header, Op
from .csn import hlc_from_ms, pack_csn
from .errors import (ClockSkewError, EpochCollisionError, PacketError, PacketFamilyError,
                     PacketFormatError, PacketRecipientError, PacketSenderError,
                     PacketSignatureError, PacketBodyError, PacketPolicyError, ScrubbedError,
                     UsageError)
from .packets import (DEFAULT_MAX_SIZE, PACKET_SUFFIX, PartInfo, atomic_opener,
                      build_update_packets, fsync_dir)
from .progress import expect
from .site import SYS_PREFIX, Site, wall_ms

DEFAULT_SKEW_MS = 24 * 3600 * 1000
APPLY_BATCH = 20_000


def _vec_blob(v: dict[bytes, int]) -> bytes:
    return codec.packb(sorted([o, e] for o, e in v.items() if e))


def _vec_from_blob(b: bytes | None) -> dict[bytes, int]:
    return {o: e for o, e in codec.unpackb(b)} if b else {}


def _ranges_blob(r: dict[bytes, tuple[int, int]]) -> bytes:
    return codec.packb(sorted([o, lo, hi] for o, (lo, hi) in r.items()))


def _ranges_from_blob(b: bytes | None) -> dict[bytes, tuple[int, int]]:
    return {o: (lo, hi) for o, lo, hi in codec.unpackb(b)} if b else {}


# --- the matrix -------------------------------------------------------------------------------

def matrix(site: Site, peer: bytes) -> tuple[dict[bytes, int], dict[bytes, int]]:
    sent, acked = {}, {}
    for o, s, a in site.conn.execute("SELECT origin, sent, acked FROM matrix WHERE peer=?",
                                     (peer,)):
        if s:
            sent[o] = s
        if a:
            acked[o] = a
    return sent, acked


def link(site: Site, peer: bytes) -> dict:
    row = site.conn.execute("SELECT out_seq, in_seq, told, peer_recv_seq, peer_waiting FROM links "
                            "WHERE peer=?", (peer,)).fetchone()
    if row is None:
        return {"out_seq": 0, "in_seq": 0, "told": {}, "peer_recv_seq": 0, "peer_waiting": {}}
    return {"out_seq": row[0], "in_seq": row[1], "told": _vec_from_blob(row[2]),
            "peer_recv_seq": row[3], "peer_waiting": _ranges_from_blob(row[4])}


def _ensure_link(site: Site, peer: bytes) -> None:
    site.conn.execute("INSERT OR IGNORE INTO links(peer) VALUES (?)", (peer,))


def _raise_matrix(site: Site, peer: bytes, column: str, vec: dict[bytes, int]) -> None:
    site.conn.executemany(
        f"INSERT INTO matrix(peer, origin, {column}) VALUES (?, ?, ?) "
        f"ON CONFLICT(peer, origin) DO UPDATE SET {column}=max({column}, excluded.{column})",
        [(peer, o, e) for o, e in vec.items()])


def believed(site: Site, peer: bytes) -> tuple[dict[bytes, int], dict[bytes, int]]:
    """(what we believe the peer holds, what it reported itself)."""
    sent, acked = matrix(site, peer)
    m = site.members_by_id(include_retired=True).get(peer)
    base = m.base if m else {}
    return planning.belief(sent, acked, base), acked


def waiting_gaps(site: Site, sender: bytes | None = None) -> dict[bytes, tuple[int, int]]:
    """What our parked packets wait for, merged per origin."""
    out: dict[bytes, tuple[int, int]] = {}
    q = "SELECT waiting FROM parked" + (" WHERE sender=?" if sender else "")
    for (w,) in site.conn.execute(q, (sender,) if sender else ()):
        for o, (lo, hi) in _ranges_from_blob(w).items():
            cur = out.get(o)
            out[o] = (lo, max(hi, cur[1])) if cur else (lo, hi)
    v = site.vector()
    return {o: (v.get(o, 0), hi) for o, (lo, hi) in out.items() if hi > v.get(o, 0)}


def member_set_hash(site: Site) -> bytes:
    import hashlib
    return hashlib.blake2b(b"".join(sorted(site.members_by_id())), digest_size=8).digest()


def ack_floor(site: Site) -> dict[bytes, int]:
    """Per origin, the epoch every current member is known to hold: from each member's own
    reports (and the snapshot it was created from), raised by what other members gossip only
    when their floor was computed over exactly our member set (a member they do not know yet
    must not be trimmed past)."""
    vec = site.vector()
    vectors = [vec]
    for m in site.members_by_id().values():
        if m.site_id == site.site_id:
            continue
        vectors.append(planning.vmax(matrix(site, m.site_id)[1], m.base))
    gossip = _vec_from_blob(site.meta("ack_floor_gossip"))
    if site.meta("ack_floor_set") != member_set_hash(site):
        gossip = {}
    out = {o: max(min(v.get(o, 0) for v in vectors), min(gossip.get(o, 0), vec.get(o, 0)))
           for o in vec}
    return {o: e for o, e in out.items() if e}


# --- export -----------------------------------------------------------------------------------

@dataclass
class ExportedPacket:
    path: Path
    to: str
    ops: int
    bytes: int
    ranges: dict[str, list[int]]
    seq: int
    part: int

    def to_json(self) -> dict:
        return {"path": str(self.path), "to": self.to, "ops": self.ops, "bytes": self.bytes,
                "ranges": self.ranges, "seq": self.seq, "part": self.part}


@dataclass
class PeerPlan:
    peer: bytes
    name: str
    ranges: dict[bytes, tuple[int, int]]
    template: Header


def _anchors(site: Site, ranges: dict[bytes, tuple[int, int]]) -> dict[bytes, bytes]:
    """CSN of the op each range continues (epoch ``lo``), where we still hold it."""
    out = {}
    for o, (lo, _hi) in ranges.items():
        if lo:
            row = site.conn.execute("SELECT hlc, seq FROM changelog WHERE origin=? AND epoch=?",
                                    (o, lo)).fetchone()
            if row:
                out[o] = pack_csn(row[0], o, row[1])
    return out


def tip_for(site: Site, peer: bytes, vec: dict[bytes, int]) -> tuple[int, bytes] | None:
    """The newest op of the peer's own origin we hold, so the peer can tell whether its own
    history still matches the family's (a restored site that wrote before it knew)."""
    e = vec.get(peer, 0)
    if not e:
        return None
    row = site.conn.execute("SELECT hlc, seq FROM changelog WHERE origin=? AND epoch=?",
                            (peer, e)).fetchone()
    return (e, pack_csn(row[0], peer, row[1])) if row else None


def merged_ops(site: Site, ranges: dict[bytes, tuple[int, int]]) -> Iterator[Op]:
    """Ops of all ranges in CSN order (each origin's epoch order is its CSN order)."""
    its = [site.iter_changelog(o, lo, hi) for o, (lo, hi) in ranges.items()]
    if len(its) == 1:
        return its[0]
    return heapq.merge(*its, key=lambda op: (op.hlc, op.origin, op.seq))


def plan_exports(site: Site, peers: list[bytes], now_ms: int,
                 failed: list[ScrubbedError] | None = None) -> list[PeerPlan]:
    """Inside a read snapshot: what each peer lacks, and the header it will get.  A peer below
    our changelog floor raises :class:`ScrubbedError`, or with ``failed`` is left out and its
    error collected, so one stale peer does not stop the packets for the others."""
    vec = site.vector()
    floor = site.floors()
    seeded = {o: e for o, e in site.conn.execute("SELECT origin, seeded FROM vector")}
    floor_acks = ack_floor(site)
    plans = []
    for peer in peers:
        name = site.name_of(peer)
        bel, reported = believed(site, peer)
        try:
            ranges = planning.plan_ranges(vec, peer, bel, reported, floor, seeded, site.site_id)
        except planning.BelowFloor as e:
            err = ScrubbedError(
                f"peer {name} needs epoch {e.needed} of {site.name_of(e.origin)}, but this "
                f"site's changelog starts at epoch {e.floor}",
                hint=f"send {name} a snapshot instead: 'syncpack resync --to {name} --out DIR'")
            err.peer = name
            if failed is None:
                raise err from None
            failed.append(err)
            continue
        lk = link(site, peer)
        sent, acked = matrix(site, peer)
        unconfirmed = any(e > acked.get(o, 0) for o, e in sent.items())
        if not ranges and lk["told"] == {o: e for o, e in vec.items() if e} and not unconfirmed:
            continue
        tmpl = Header(kind=codec.KIND_UPDATE, family=site.family_id, sender=site.site_id,
                      recipient=peer, packet_id=b"", seq=lk["out_seq"] + 1, part=0, final=True,
                      created_ms=now_ms, vector={o: e for o, e in vec.items() if e},
                      recv_seq=lk["in_seq"], waiting=waiting_gaps(site, None),
                      ack_floor=floor_acks, tip=tip_for(site, peer, vec),
                      anchors=_anchors(site, ranges), reply=bool(ranges) or unconfirmed or site.state == "recovering",
                      ack_set=member_set_hash(site))
        plans.append(PeerPlan(peer, name, ranges, tmpl))
    return plans


def seal_key(site: Site, peer: bytes, encrypt: bool) -> bytes | None:
    """The peer's X25519 key when the packet must be sealed (asked for, or family policy)."""
    if not (encrypt or site.requires_sealing()):
        return None
    m = site.members_by_id(include_retired=True).get(peer)
    if m is None or len(m.x25519) != 32:
        raise UsageError(f"no X25519 key for {site.name_of(peer)} in the roster; cannot seal")
    return m.x25519


def packet_name(sender: str, seq: int, part: int) -> str:
    return f"{seq:010d}-{part:04d}{PACKET_SUFFIX}"


def packet_dir(out: Path, sender: str, recipient: str) -> Path:
    """Media layout: OUT/<recipient>/<sender>/<seq>-<part>.spk (sortable by link sequence)."""
    return out / recipient / sender


def select_peers(site: Site, to: list[str] | None, all_peers: bool) -> list[bytes]:
    """Peer ids for ``--to NAME...`` (in the order named) or ``--all`` (by name)."""
    if all_peers:
        return sorted((i for i in site.members_by_id() if i != site.site_id), key=site.name_of)
    peers: list[bytes] = []
    for name in to or []:
        m = site.member_named(name)
        if m.site_id == site.site_id:
            raise UsageError(f"{name} is this site; export to another member")
        if m.site_id not in peers:
            peers.append(m.site_id)
    return peers


def export(site: Site, out_dir: str | os.PathLike, to: list[str] | None = None,
           all_peers: bool = False, max_size: int = DEFAULT_MAX_SIZE,
           seed: bytes | None = None, now_ms: int | None = None,
           progress: Callable[[int], None] | None = None,
           encrypt: bool = False,
           failed: list[ScrubbedError] | None = None) -> list[ExportedPacket]:
    """Write packets for the named peers (or all).  With ``failed``, peers that need a resync
    are reported there and the others still get their packets."""
    out = Path(out_dir)
    if not to and not all_peers:
        raise UsageError("name the peers with --to PEER (repeatable) or use --all")
    with site.lock():
        peers = select_peers(site, to, all_peers)
        now = wall_ms() if now_ms is None else now_ms
        sign = keys.load_signing_key(site.path).sign
        written: list[tuple[PeerPlan, list[PartInfo]]] = []
        conn = site.conn
        conn.execute("BEGIN")  # one read snapshot for plan and ops alike
        try:
            plans = plan_exports(site, peers, now, failed)
            expect(progress, sum(hi - lo for p in plans for lo, hi in p.ranges.values()))
            for plan in plans:
                d = packet_dir(out, site.name, plan.name)
                opener = atomic_opener(d, lambda part, s=plan.template.seq:
                                       packet_name(site.name, s, part))
                parts = build_update_packets(merged_ops(site, plan.ranges), plan.template, sign,
                                             max_size, opener, seed, progress,
                                             seal_to=seal_key(site, plan.peer, encrypt))
                written.append((plan, parts))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            for _plan, parts in written:
                for p in parts:
                    p.path.unlink(missing_ok=True)
            raise
        _record_exports(site, written, now)
    result = []
    for plan, parts in written:
        for p in parts:
            result.append(ExportedPacket(
                p.path, plan.name, p.header.count, p.size,
                {site.name_of(o): [lo, hi] for o, (lo, hi) in sorted(p.header.ranges.items())},
                p.header.seq, p.header.part))
    return result


def _record_exports(site: Site, written: list[tuple[PeerPlan, list[PartInfo]]],
                    now: int) -> None:
    conn = site.conn
    conn.execute("BEGIN IMMEDIATE")
    try:
        for plan, parts in written:
            _ensure_link(site, plan.peer)
            conn.execute("UPDATE links SET out_seq=max(out_seq, ?), told=? WHERE peer=?",
                         (plan.template.seq, _vec_blob(plan.template.vector), plan.peer))
            for p in parts:
                h = p.header
                conn.execute("INSERT INTO packets_out VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                             (h.packet_id, h.recipient, h.seq, h.part, h.kind,
                              _ranges_blob(h.ranges), h.count, p.size, str(p.path), now))
                _raise_matrix(site, plan.peer, "sent", {o: hi for o, (lo, hi) in h.ranges.items()})
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


# --- reading and verifying --------------------------------------------------------------------

@dataclass
class OpenPacket:
    path: Path
    f: BinaryIO
    env: Envelope

    @property
    def header(self) -> Header:
        return self.env.header

    def close(self) -> None:
        self.f.close()


def open_packet(path: Path) -> OpenPacket:
    """Size, magic, version and header checks; raises PacketError subclasses."""
    try:
        f = open(path, "rb")
    except OSError as e:
        raise PacketFormatError(f"cannot read {path}: {e.strerror}") from None
    try:
        size = os.fstat(f.fileno()).st_size
        env = codec.read_envelope(f, size)
    except BaseException:
        f.close()
        raise
    return OpenPacket(Path(path), f, env)


def check_signature(pk: OpenPacket, public: bytes) -> bool:
    return keys.verify(public, pk.env.signature,
                       codec.signed_bytes(pk.env.version, pk.env.header_bytes))


def verify(site: Site, pk: OpenPacket) -> None:
    """The fixed order after the framing checks: family, recipient, sender membership,
    signature, body hash.  Decompression limits are enforced while applying."""
    h = pk.header
    if h.family != site.family_id:
        raise PacketFamilyError(f"packet belongs to family {h.family.hex()}, "
                                f"this site to {site.family_id.hex()}")
    if h.recipient != site.site_id:
        raise PacketRecipientError(f"packet is addressed to {site.name_of(h.recipient)}, "
                                   f"not to this site ({site.name})")
    member = site.members_by_id(include_retired=True).get(h.sender)
    if member is None:
        raise PacketSenderError(f"sender {h.sender.hex()} is not a member of family "
                                f"{site.family_name!r}")
    if member.retired:
        raise PacketSenderError(f"sender {member.name} has been retired from the family")
    if not check_signature(pk, member.ed25519):
        raise PacketSignatureError(f"signature does not verify with {member.name}'s key")
    if not codec.body_hash_matches(pk.f, pk.env):
        raise PacketBodyError("packet body does not match the hash in its signed header")
    if site.requires_sealing() and not h.sealed:
        raise PacketPolicyError(f"family {site.family_name!r} requires sealed packets and this "
                                f"one from {member.name} is not sealed")


# --- import -----------------------------------------------------------------------------------

@dataclass
class ImportResult:
    applied: list[str] = field(default_factory=list)
    duplicates: list[str] = field(default_factory=list)
    parked: list[dict] = field(default_factory=list)
    rejected: list[dict] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    ops_applied: int = 0
    # Why each skipped packet was left alone: "other site" or "other family".
    skipped_why: dict[str, str] = field(default_factory=dict)
    # Files in a searched directory that are not packets at all.
    ignored: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"applied": self.applied, "duplicates": self.duplicates, "parked": self.parked,
                "rejected": self.rejected, "ops_applied": self.ops_applied,
                "skipped": self.skipped, "ignored": self.ignored}


def find_packet_files(paths: Iterable[str | os.PathLike]) -> list[tuple[Path, bool]]:
    """(file, named explicitly) pairs; directories are searched recursively, temporary files
    and hidden files in them are left alone."""
    out: list[tuple[Path, bool]] = []
    for p in paths:
        p = Path(p)
        if p.is_dir():
            for root, dirs, files in os.walk(p):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                for fn in sorted(files):
                    if fn.startswith(".") or fn.endswith(".tmp"):
                        continue
                    out.append((Path(root) / fn, False))
        else:
            out.append((p, True))
    return out


def _has_magic(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(len(codec.MAGIC)) == codec.MAGIC
    except OSError:
        return False


@dataclass
class _Candidate:
    pk: OpenPacket
    display: str
    parked_file: Path | None = None


def import_packets(site: Site, paths: Iterable[str | os.PathLike], *,
                   skew_ms: int = DEFAULT_SKEW_MS, now_ms: int | None = None,
                   progress: Callable[[int], None] | None = None,
                   result: ImportResult | None = None) -> ImportResult:
    """Verify and apply packets; each packet in its own transaction.  With ``result``, the
    outcome is collected there as it happens, so a caller interrupted midway (Ctrl-C) still
    knows which packets were applied and committed."""
    res = result if result is not None else ImportResult()
    with site.lock():
        cands: list[_Candidate] = []
        snaps: dict[tuple[bytes, int], list[_Candidate]] = {}
        # A sender we do not know yet may be a member whose roster entry arrives in another
        # packet of this same import; such packets are verified again after each pass.
        unknown: list[tuple[_Candidate, PacketError]] = []
        opened: list[_Candidate] = []
        for path, named in find_packet_files(paths):
            if not path.exists():
                res.rejected.append({"path": str(path), "error": "no such file"})
                continue
            try:
                pk = open_packet(path)
            except PacketError as e:
                if named or _has_magic(path):  # a damaged or too new packet is not silent
                    res.rejected.append({"path": str(path), "error": str(e)})
                else:
                    res.ignored.append(str(path))   # in a directory: not a packet, left alone
                continue
            h = pk.header
            if not named and (h.family != site.family_id or h.recipient != site.site_id):
                res.skipped.append(str(path))
                res.skipped_why[str(path)] = ("other family" if h.family != site.family_id
                                              else "other site")
                pk.close()
                continue
            c = _Candidate(pk, str(path))
            opened.append(c)
            try:
                verify(site, pk)
            except PacketSenderError as e:
                if h.sender not in site.members_by_id(include_retired=True):
                    unknown.append((c, e))
                else:
                    res.rejected.append({"path": str(path), "error": str(e)})
                continue
            except PacketError as e:
                res.rejected.append({"path": str(path), "error": str(e)})
                continue
            if h.kind == codec.KIND_SNAPSHOT:
                snaps.setdefault((h.sender, h.seq), []).append(c)
            else:
                cands.append(c)
        try:
            for group in snaps.values():
                _apply_snapshot(site, group, res, progress)
            while True:
                cands += _parked_candidates(site, res, opened)
                _apply_all(site, cands, res, skew_ms, now_ms, progress)
                cands = []
                still = []
                for c, err in unknown:
                    try:
                        verify(site, c.pk)
                        cands.append(c)
                    except PacketSenderError as e:
                        still.append((c, e))
                    except PacketError as e:
                        res.rejected.append({"path": c.display, "error": str(e)})
                unknown = still
                if not cands:
                    break
            for c, err in unknown:
                res.rejected.append({"path": c.display, "error": str(err)})
        finally:
            for c in opened:
                c.pk.close()
    return res


def _parked_candidates(site: Site, res: ImportResult, opened: list) -> list[_Candidate]:
    """Parked packets join every pass: they may apply now."""
    out = []
    res.parked = []
    for pid, fname, shown in site.conn.execute(
            "SELECT packet_id, file, origin_path FROM parked ORDER BY sender, seq, part"
            ).fetchall():
        f = site.parked_dir() / fname
        try:
            pk = open_packet(f)
        except PacketError as e:
            res.rejected.append({"path": shown or str(f), "error": f"parked packet: {e}"})
            _drop_parked(site, pid, f)
            continue
        c = _Candidate(pk, shown or str(f), parked_file=f)
        opened.append(c)
        try:
            verify(site, pk)
        except PacketError as e:
            res.rejected.append({"path": c.display, "error": f"parked packet: {e}"})
            _drop_parked(site, pid, f)
            continue
        out.append(c)
    return out


def _apply_snapshot(site: Site, group: list[_Candidate], res: ImportResult,
                    progress=None) -> None:
    """A snapshot packet addressed to a member: a hard resync (DESIGN.md §6)."""
    from .recovery import apply_resync
    group.sort(key=lambda c: c.pk.header.part)
    shown = [c.display for c in group]
    if site.conn.execute("SELECT 1 FROM packets_in WHERE packet_id=?",
                         (group[0].pk.header.packet_id,)).fetchone():
        res.duplicates.extend(shown)
        return
    parts = [c.pk.header.part for c in group]
    if parts != list(range(len(group))) or not group[-1].pk.header.final:
        for s in shown:
            res.rejected.append({"path": s, "error": f"snapshot parts incomplete: have {parts}; "
                                 f"import every part together"})
        return
    try:
        expect(progress, sum(c.pk.header.count for c in group))
        n = apply_resync(site, [c.pk for c in group], progress)
    except PacketError as e:
        for s in shown:
            res.rejected.append({"path": s, "error": str(e)})
        return
    res.applied.extend(shown)
    res.ops_applied += n


def _drop_parked(site: Site, pid: bytes, f: Path) -> None:
    site.conn.execute("DELETE FROM parked WHERE packet_id=?", (pid,))
    f.unlink(missing_ok=True)


def _apply_all(site: Site, cands: list[_Candidate], res: ImportResult, skew_ms: int,
               now_ms: int | None, progress) -> None:
    def order(c: _Candidate):
        h = c.pk.header
        return (site.name_of(h.sender), h.seq, h.part)

    pending = sorted(cands, key=order)
    expect(progress, sum(c.pk.header.count for c in cands))
    seen_ids: set[bytes] = set()
    changed = True
    while changed:
        changed = False
        still: list[_Candidate] = []
        for c in pending:
            h = c.pk.header
            if h.packet_id in seen_ids or site.conn.execute(
                    "SELECT 1 FROM packets_in WHERE packet_id=?", (h.packet_id,)).fetchone():
                if c.parked_file:
                    _drop_parked(site, h.packet_id, c.parked_file)
                else:
                    res.duplicates.append(c.display)
                continue
            if planning.gaps(h.ranges, site.vector()):
                still.append(c)
                continue
            try:
                n = apply_packet(site, c.pk, skew_ms=skew_ms, now_ms=now_ms, progress=progress,
                                 parked_file=c.parked_file)
            except ForkDetected as e:
                from .recovery import stash_own
                stash_own(site, f"{site.name_of(h.sender)} holds a different op as epoch "
                                f"{e.epoch} of this site")
                still.append(c)      # retried (or parked) against the wound-back vector
                changed = True
                continue
            except PacketError as e:
                res.rejected.append({"path": c.display, "error": str(e)})
                if c.parked_file:
                    _drop_parked(site, h.packet_id, c.parked_file)
                continue
            seen_ids.add(h.packet_id)
            res.applied.append(c.display)
            res.ops_applied += n
            changed = True
        pending = still
    vec = site.vector()
    parked_ids = {c.pk.header.packet_id for c in pending if c.parked_file}
    for c in pending:
        h = c.pk.header
        if not c.parked_file and h.packet_id in parked_ids:
            continue  # named again while parked: it stays parked, reported once
        gaps = planning.gaps(h.ranges, vec)
        if not c.parked_file:
            park(site, c.pk, gaps, c.display)
        res.parked.append({"path": c.display, "waiting_for": {
            site.name_of(o): [lo, hi] for o, (lo, hi) in sorted(gaps.items())}})


def park(site: Site, pk: OpenPacket, gaps: dict[bytes, tuple[int, int]], shown: str) -> None:
    """Keep a copy inside the site directory, so the medium can be removed."""
    h = pk.header
    fname = h.packet_id.hex() + PACKET_SUFFIX
    dest = site.parked_dir() / fname
    tmp = dest.with_suffix(".tmp")
    pk.f.seek(0)
    with open(tmp, "wb") as out:
        shutil.copyfileobj(pk.f, out, 1 << 20)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, dest)
    fsync_dir(dest.parent)      # the rename is durable before the store points at the file
    conn = site.conn
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute("INSERT OR REPLACE INTO parked VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                     (h.packet_id, h.sender, h.seq, h.part, fname, shown, _ranges_blob(gaps),
                      wall_ms()))
        _note_header(site, h)
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _note_header(site: Site, h: Header) -> None:
    """What every verified packet teaches us about its sender, applied or parked.

    The sender's vector is exact when it was made, so the newest report replaces what we had
    (not a running maximum): a peer restored from a backup reports less than before, and then
    everything we believed it held is wound back to what it reports."""
    peer = h.sender
    _ensure_link(site, peer)
    row = site.conn.execute("SELECT acked_created FROM links WHERE peer=?", (peer,)).fetchone()
    if h.created_ms >= row[0]:
        _sent, old = matrix(site, peer)
        regressed = any(h.vector.get(o, 0) < e for o, e in old.items())
        site.conn.execute("UPDATE matrix SET acked=0 WHERE peer=?", (peer,))
        site.conn.executemany(
            "INSERT INTO matrix(peer, origin, acked) VALUES (?, ?, ?) "
            "ON CONFLICT(peer, origin) DO UPDATE SET acked=excluded.acked",
            [(peer, o, e) for o, e in h.vector.items()])
        if regressed:
            site.conn.execute("UPDATE matrix SET sent=acked WHERE peer=?", (peer,))
            site.conn.execute("UPDATE links SET told=NULL WHERE peer=?", (peer,))
        site.conn.execute("UPDATE links SET acked_created=? WHERE peer=?", (h.created_ms, peer))
    site.conn.execute(
        "UPDATE links SET in_seq=max(in_seq, ?), peer_recv_seq=max(peer_recv_seq, ?), "
        "peer_waiting=? WHERE peer=?", (h.seq, h.recv_seq, _ranges_blob(h.waiting), peer))
    _wind_back(site, peer, h)
    vec = site.vector()
    if any(e > vec.get(o, 0) for o, e in h.vector.items()):
        # The sender holds ops we lack that its packets did not bring (lost, or parked here):
        # tell it our vector again even if it has not changed, or its probes go unanswered.
        site.conn.execute("UPDATE links SET told=NULL WHERE peer=?", (peer,))
    elif h.reply and h.recv_seq < link(site, peer)["out_seq"]:
        # The sender waits for an acknowledgement and has not received our latest packet
        # (lost, or still on its way): our vector may never have reached it; answer once more.
        # Idle senders do not ask, so sites that export before they import fall quiet.
        site.conn.execute("UPDATE links SET told=NULL WHERE peer=?", (peer,))
    if h.ack_set and h.ack_set == member_set_hash(site):
        gossip = _vec_from_blob(site.meta("ack_floor_gossip"))
        if site.meta("ack_floor_set") != h.ack_set:
            gossip = {}
        merged = planning.vmax(gossip, h.ack_floor)
        if merged != gossip or site.meta("ack_floor_set") != h.ack_set:
            site.set_meta("ack_floor_gossip", _vec_blob(merged))
            site.set_meta("ack_floor_set", h.ack_set)
    from .recovery import note_report
    note_report(site, h)


def _wind_back(site: Site, peer: bytes, h: Header) -> None:
    """Lost or parked packets: the peer has seen our packets up to ``recv_seq`` (or reports a
    gap), yet its vector lacks what they carried; resend from what it acknowledged."""
    seen_hi: dict[bytes, int] = {}
    for (r,) in site.conn.execute("SELECT ranges FROM packets_out WHERE recipient=? AND seq<=?",
                                  (peer, h.recv_seq)):
        for o, (lo, hi) in _ranges_from_blob(r).items():
            seen_hi[o] = max(seen_hi.get(o, 0), hi)
    for o in h.waiting:
        seen_hi[o] = max(seen_hi.get(o, 0), h.waiting[o][1])
    sent, _acked = matrix(site, peer)
    for o, hi in seen_hi.items():
        have = h.vector.get(o, 0)
        if have < hi and sent.get(o, 0) > have:
            site.conn.execute("UPDATE matrix SET sent=? WHERE peer=? AND origin=?",
                              (have, peer, o))


def apply_packet(site: Site, pk: OpenPacket, *, skew_ms: int = DEFAULT_SKEW_MS,
                 now_ms: int | None = None, progress=None, parked_file: Path | None = None) -> int:
    """Apply one verified, gap-free packet in one transaction; returns ops applied."""
    h = pk.header
    now = wall_ms() if now_ms is None else now_ms
    if h.hlc_max > hlc_from_ms(now + skew_ms):
        raise ClockSkewError(
            f"packet from {site.name_of(h.sender)} carries changes stamped "
            f"{(h.hlc_max >> 16) - now} ms ahead of this site's clock (limit {skew_ms} ms)")
    conn = site.conn
    conn.execute("BEGIN IMMEDIATE")
    try:
        vec = site.vector()
        for o in h.ranges:
            conn.execute("INSERT OR IGNORE INTO vector(origin, epoch) VALUES (?, 0)", (o,))
        applied = 0
        batch: list[Op] = []
        rows: list[tuple] = []     # versions of ops that supersede nothing: inserted in bulk
        system = False
        superseded_any = conn.execute("SELECT 1 FROM superseded LIMIT 1").fetchone() is not None

        def flush() -> None:
            nonlocal batch, rows, applied
            conn.executemany("INSERT INTO versions VALUES (?, ?, ?, ?)", rows)
            site.record_ops(batch)
            applied += len(batch)
            if progress and batch:
                progress(len(batch))
            batch, rows = [], []

        for o, csn in h.anchors.items():
            lo = h.ranges[o][0]
            row = conn.execute("SELECT hlc, seq FROM changelog WHERE origin=? AND epoch=?",
                               (o, lo)).fetchone()
            if row is not None and pack_csn(row[0], o, row[1]) != csn:
                if o == site.site_id:
                    raise ForkDetected(lo)
                e = EpochCollisionError(
                    f"epoch collision: this site holds a different op as epoch {lo} of "
                    f"{site.name_of(o)} than the one the packet's range continues; refused")
                e.origin, e.epoch = o, lo
                raise e
        stashed_any = conn.execute("SELECT 1 FROM stash LIMIT 1").fetchone() is not None
        for op in codec.iter_ops(pk.f, pk.env, keys.unsealer(site.path)):
            if op.epoch <= vec.get(op.origin, 0):
                if op.origin == site.site_id and _differs(site, op):
                    raise ForkDetected(op.epoch)
                _check_collision(site, op)
                continue
            if stashed_any and op.origin == site.site_id:
                flush()
                if _unstash(site, op):
                    continue
            if op.replaced or superseded_any or stashed_any:
                flush()     # the slow path reads versions and the changelog
                site.apply_version(op, op.csn)
            else:
                rows.append((op.collection, op.key, op.csn, op.value))
            if not system and op.collection.startswith(SYS_PREFIX):
                system = True
            batch.append(op)
            if len(batch) >= APPLY_BATCH:
                flush()
        flush()
        for o, (lo, hi) in h.ranges.items():
            conn.execute("UPDATE vector SET epoch=max(epoch, ?) WHERE origin=?", (hi, o))
        hlc = int(site.meta("hlc", 0))
        if h.hlc_max > hlc:
            site.set_meta("hlc", h.hlc_max)
        _note_header(site, h)
        conn.execute("INSERT INTO packets_in VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                     (h.packet_id, h.sender, h.seq, h.part, h.kind, applied, str(pk.path), now))
        if parked_file is not None:
            conn.execute("DELETE FROM parked WHERE packet_id=?", (h.packet_id,))
        conn.execute("COMMIT")
    except sqlite3.IntegrityError:
        conn.execute("ROLLBACK")
        site.invalidate()
        raise PacketBodyError("packet carries an op this site already holds under another "
                              "epoch; nothing was applied") from None
    except BaseException:
        conn.execute("ROLLBACK")
        site.invalidate()
        raise
    if system:
        site.invalidate()
    if parked_file is not None:
        parked_file.unlink(missing_ok=True)
    return applied


def _check_collision(site: Site, op: Op) -> None:
    if _differs(site, op):
        e = EpochCollisionError(
            f"epoch collision: this site holds a different op as epoch {op.epoch} of "
            f"{site.name_of(op.origin)}; packet refused")
        e.origin, e.epoch = op.origin, op.epoch
        raise e


class ForkDetected(Exception):
    """Internal: a peer holds a different op under one of our own epochs."""

    def __init__(self, epoch: int):
        super().__init__(epoch)
        self.epoch = epoch


def _unstash(site: Site, op: Op) -> bool:
    """One of our own set-aside ops came back from a peer: it is genuine, and its effect on
    the records is already here, so it only returns to the changelog."""
    c = site.conn
    row = c.execute("SELECT epoch FROM stash WHERE origin=? AND hlc=? AND seq=?",
                    (op.origin, op.hlc, op.seq)).fetchone()
    if row is None:
        return False
    c.execute("DELETE FROM stash WHERE origin=? AND epoch=?", (op.origin, row[0]))
    site.record_ops([op])
    return True


def _differs(site: Site, op: Op) -> bool:
    row = site.conn.execute("SELECT hlc, seq FROM changelog WHERE origin=? AND epoch=?",
                            (op.origin, op.epoch)).fetchone()
    return row is not None and (row[0], row[1]) != (op.hlc, op.seq)
