"""Export and import of update packets: planning against the epoch matrix, gap checks,
parking, and applying in CSN order.

The rules are docs/design.md §4-§6.  Every packet goes through :func:`syncpack.exchange.verify.verify` and is
applied by :mod:`syncpack.exchange.apply`; a failure raises a :class:`PacketError` subclass and leaves
the store untouched.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Collection, Iterable, Iterator

from syncpack.format import blocks, codec
from syncpack.rules import planning
from syncpack.lazy import OnFirstUse
from syncpack.store import attached, chain, exports, history
from syncpack.store import forks as fork_store
from syncpack.exchange import forks
from syncpack.exchange.apply import (ForkDetected, ForkFound, apply_packet, apply_snapshot,
                                     drop_parked, is_known, note_header, park, pass_over)
from syncpack.format.codec import Header
from syncpack.format.csn import pack_csn
from syncpack.errors import (AttachError, ExportError, ForkFoundError, PacketBodyError, PacketError, PacketPolicyError,
                     PacketSenderError, ScrubbedError,
                     SyncpackError, UsageError)
from syncpack.exchange.links import (believed, ensure_link, link, matrix, own_acknowledgement,
                                     raise_matrix, ranges_blob, seal_key, tip_for, vec_blob,
                                     vec_from_blob, waiting_gaps)
from syncpack.exchange.packets import (DEFAULT_MAX_SIZE, BlockRef, MediumRoom, PartInfo,
                                       atomic_opener, build_update_packets, order_blocks,
                                       packet_dir, packet_name, seq_on_medium)
from syncpack.progress import expect
from syncpack.admin.recovery import RECOVERING, stash_own
from syncpack.site import Site, wall_ms
from syncpack.exchange.verify import (DEFAULT_SKEW_MS, JoinedPiecesPacket, OpenPacket,
                                      find_packet_files, open_packet,
                                      piece_bytes, printable, told_if_unreadable, verify)

# The attached-application code (and all it imports) loads only at a site that has one: an
# import elsewhere starts without it.
attach_core = OnFirstUse("syncpack.attach.core")
attach_applying = OnFirstUse("syncpack.attach.applying")


def _has_app(site: Site) -> bool:
    """Whether an application's database is attached here (asked of the store, so that a
    site without one never loads the attach code)."""
    return attached.attachment(site.conn) is not None


def _sync_app(site: Site, res: ImportResult | None = None) -> None:
    """Capture an attached application's changes and write pending records into its tables
    (attach/core.py: sync_app); nothing when nothing is attached.  With ``res``, the tables
    of the family it created in the application's file, and those it refused to, are noted
    there."""
    if _has_app(site):
        doc = attach_core.sync_app(site)
        if res is not None and doc is not None:
            res.created_tables += doc.get("created", [])
            res.refused_definitions += [w for w in doc.get("refused", [])
                                        if w not in res.refused_definitions]

# Relayed acknowledgements ride in the header; this bounds what one packet carries of them
# (a 1,000-member family's vectors would otherwise cost megabytes per packet).  The ones a
# peer has waited for longest go first; the rest follow in the next packets.
RELAY_ACK_BUDGET = 32 * 1024
# ... and within what is left of this for the whole header once vector, ranges and anchors are
# in, so a header stays under 64 KiB in a family of a thousand sites whatever else it carries.
HEADER_BUDGET = 56 * 1024
MIN_ACK_BUDGET = 4 * 1024
# Room left for a packet's framing and header beside a block of ours: a larger block is sealed
# again as parts.  A small family's header takes a few hundred bytes; a larger one's may not
# leave this much, and then the export names the --max-size that would do.
RESEAL_HEADROOM = 4 * 1024
# Fork evidence, heads and 'kept' take at most this fraction of a packet's --max-size, and
# at least FORK_ROOM_MIN bytes: a pair of evidence (2 x 188 bytes) must fit the smallest
# medium (64K), or a fork found there never reaches the members that must refuse it (the
# forked site included, which then never heals).  Well within RESEAL_HEADROOM.
FORK_ROOM_DIVISOR = 256
FORK_ROOM_MIN = 1024


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
    blocks: list[chain.StoredBlock] = field(default_factory=list)   # in the order they go
    heads: list[tuple[bytes, int]] = field(default_factory=list)    # (origin, hi) shown


def _anchors(site: Site, ranges: dict[bytes, tuple[int, int]], metas: list[chain.StoredBlock],
             peer: bytes) -> dict[bytes, bytes]:
    """CSN of the op each range continues (epoch ``lo``), where the blocks cannot say it: the
    first block of a range names its predecessor's hash, which the peer compares with its own
    block there, so an anchor is needed only where our chain breaks (a chain root), for our own
    origin (only the origin seals, and after a restore it may have sealed its returned ops
    again: its chain is then its own, and the anchor shows the peer the history is the same),
    and for the peer's own origin (a restored peer learns from it that its history forked).
    In a family of a thousand sites this keeps ~25 KiB of CSNs out of every header."""
    linked = set()
    for b in metas:
        o = b.origin
        if b.lo == ranges[o][0] and b.lo and o not in (peer, site.site_id):
            held = chain.block_ending_at(site.conn, o, b.lo)
            prev = bytes(chain.block_bytes(site.conn, b)[50:82])    # the signed prev_hash
            if held is not None and prev == held.hash:
                linked.add(o)
    out = {}
    for o, (lo, _hi) in ranges.items():
        if lo and o not in linked:
            held = chain.op_id_at(site.conn, o, lo)
            if held:
                out[o] = pack_csn(held[0], o, held[1])
    return out


def cover_ranges(site: Site, ranges: dict[bytes, tuple[int, int]]
                 ) -> tuple[dict[bytes, tuple[int, int]], list[chain.StoredBlock]]:
    """The stored blocks that carry ``ranges``, in the order they travel, and the ranges they
    actually span: a block is never cut, so a range may start below what the peer lacks
    (the peer skips epochs it holds)."""
    spans: dict[bytes, tuple[int, int]] = {}
    per_origin = []
    for o, (lo, hi) in ranges.items():
        cov = chain.covering(site.conn, o, lo, hi)
        if not cov or cov[0].lo > lo or cov[-1].hi < hi or \
                any(a.hi < b.lo for a, b in zip(cov, cov[1:])):
            raise ExportError(f"this site's store lacks some of epochs {lo + 1}..{hi} of "
                              f"{site.name_of(o)}; nothing was written",
                              hint="run 'syncpack fsck' and restore the site from a backup "
                                   "if it reports damage")
        spans[o] = (cov[0].lo, cov[-1].hi)
        per_origin.append(cov)
    return spans, order_blocks(per_origin)


def block_stream(site: Site, metas: Iterable[chain.StoredBlock]) -> Iterator[BlockRef]:
    """The blocks' bytes, fetched one at a time as the writer needs them."""
    for m in metas:
        yield BlockRef(m.origin, m.lo, m.hi, m.hlc_first, m.hlc_last, m.last_seq,
                       chain.block_bytes(site.conn, m))


def _acks_for(site: Site, peer: bytes, vec: dict[bytes, int], now_ms: int,
              sign: Callable[[bytes], bytes] | None, told: dict[bytes, int],
              members: Collection[bytes], budget: int = RELAY_ACK_BUDGET) -> list:
    """Our own signed acknowledgement, and the members' own ones this peer has not been
    given in their newest version, within the relay budget.  The peer's own comes back to it
    too: after a restore it is the proof of how much of its own history it once held."""
    out = []
    if sign is not None:
        own = {o: e for o, e in vec.items() if e}
        out.append((site.site_id, now_ms, None,
                    sign(codec.ack_signed_bytes(site.family_id, site.site_id, now_ms, own))))
    own = own_acknowledgement(site, peer)
    if own is not None and own[0] > told.get(peer, 0):
        out.append((peer, *own))
    # The longest-waiting first.  Only the ones that go are decoded (a hub of a thousand
    # members holds a thousand vectors of a thousand entries); each costs its differences from
    # our own vector on the wire (codec.ack_delta).
    fresh = sorted((told.get(m, 0), m, c) for m, c in exports.ack_times(site.conn)
                   if m != peer and m in members and c > told.get(m, 0))
    header_vec = {o: e for o, e in vec.items() if e}
    for _t, m, c in fresh:
        v, sig = exports.ack_of(site.conn, m)
        v = vec_from_blob(v)
        # its bytes on the wire, each origin index counted at its widest (3 bytes)
        cost = 96 + len(codec.packb([[0xFFFF, e] for e in
                                     codec.ack_delta(header_vec, v).values()]))
        if cost > budget:
            break
        budget -= cost
        out.append((m, c, v, sig))
    return out


def _grown_acks(site: Site, peer: bytes, told: dict[bytes, int],
                members: Collection[bytes]) -> bool:
    """Whether a member's acknowledgement has grown since ``peer`` was last given it (one the
    peer gave us, it has)."""
    return any(g > told.get(m, 0) for m, g in exports.ack_growths(site.conn)
               if m != peer and m in members)


def _restored_heard(site: Site, peer: bytes, vec: dict[bytes, int],
                    told: dict[bytes, int]) -> bool:
    """Whether a member told us, since our last packet to ``peer``, that it holds less of its
    own history than we do: restored from a backup, it waits for every member's word of how
    much of it they hold, and ours goes through this peer (a spoke's hub has nothing else to
    write it, and the restored spoke would wait for good)."""
    ours = told.get(site.site_id, 0)
    return any(m != peer and own < vec.get(m, 0)
               for m, own in exports.own_epochs_acked_since(site.conn, ours))


def plan_exports(site: Site, peers: list[bytes], now_ms: int,
                 failed: list[SyncpackError] | None = None,
                 sign: Callable[[bytes], bytes] | None = None,
                 max_size: int | None = None, out: Path | None = None) -> list[PeerPlan]:
    """Inside a read snapshot: what each peer lacks, and the header it will get (numbered
    past any packet of ours already in ``out`` for it, packets.seq_on_medium).  A peer that
    cannot be served (below our changelog floor, or a roster name that cannot be a path)
    raises, or with ``failed`` is left out and its error collected, so one peer does not stop
    the packets for the others.  ``sign`` signs our acknowledgement for the header.  What the
    header says of forks takes at most 1/256 of ``max_size``, and at least FORK_ROOM_MIN bytes
    (advisory: it must never be what keeps a block from fitting a packet)."""
    vec = site.vector()
    floor = site.floors()
    seeded = exports.seeded_epochs(site.conn)
    recovering = site.state == RECOVERING
    # retired members' acknowledgements too: they prove what a re-seed may claim of their ops
    ack_members = site.members_by_id(include_retired=True)
    plans = []
    for peer in peers:
        name = site.name_of(peer)
        bel, reported = believed(site, peer)
        needs_snapshot = False
        try:
            packet_dir(Path("."), site.name, name)      # the names must be able to be paths
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
            # The peer still gets our vector and acknowledgements (no ops): it learns what we
            # hold, and a restored peer learns what only a snapshot can now bring it.
            ranges, needs_snapshot = {}, True
        except SyncpackError as err:
            err.peer = printable(name)
            if failed is None:
                raise
            failed.append(err)
            continue
        try:
            ranges, metas = cover_ranges(site, ranges)
        except SyncpackError as err:
            err.peer = printable(name)
            if failed is None:
                raise
            failed.append(err)
            continue
        lk = link(site, peer)
        sent, acked = matrix(site, peer)
        unconfirmed = any(e > acked.get(o, 0) for o, e in sent.items())
        kept, evidence, words, heads = forks.for_header(
            site, peer,
            None if max_size is None else max(max_size // FORK_ROOM_DIVISOR, FORK_ROOM_MIN))
        told = exports.acks_told(site.conn, peer)
        if not planning.should_send(ranges, lk["told"], vec, unconfirmed, recovering,
                                    _grown_acks(site, peer, told, ack_members)
                                    or _restored_heard(site, peer, vec, told)) and \
                not heads and not forks.news_for(site, peer) and not needs_snapshot:
            continue
        tmpl = Header(kind=codec.KIND_UPDATE, mandatory=[codec.FEATURE_BLOCKS],
                      advisory=[codec.FEATURE_FORKS] if heads or evidence or kept or words
                      else [],
                      family=site.family_id, sender=site.site_id,
                      recipient=peer, packet_id=b"",
                      # Past any packet of ours still on the medium that this store never
                      # wrote (put back from a backup, or another running copy of this
                      # site): numbered from the store alone, ours took its name and replaced
                      # it, its changes lost with no site the wiser.  Both reach the peer,
                      # and a fork they show heals (forks.py).
                      seq=max(lk["out_seq"], seq_on_medium(out, site.name, name)
                              if out is not None else 0) + 1,
                      part=0, final=True,
                      created_ms=now_ms, vector={o: e for o, e in vec.items() if e},
                      recv_seq=lk["in_seq"], waiting=waiting_gaps(site, None),
                      tip=tip_for(site, peer, vec), anchors=_anchors(site, ranges, metas, peer),
                      reply=bool(ranges) or unconfirmed or recovering, recovering=recovering,
                      heads=[hd for _o, _hi, hd in heads], forks=evidence,
                      kept=kept, kept_by=words)
        # what the part headers hold besides the acknowledgements: the template and the ranges
        full = replace(tmpl, ranges=ranges)
        rest = len(codec.packb(full.to_wire(full.origin_table())))
        tmpl.acks = _acks_for(site, peer, vec, now_ms, sign, told, ack_members,
                              max(MIN_ACK_BUDGET, min(RELAY_ACK_BUDGET, HEADER_BUDGET - rest)))
        plans.append(PeerPlan(peer, name, ranges, tmpl, metas, [(o, hi) for o, hi, _ in heads]))
    return plans


def sealable(site: Site, plans: list[PeerPlan], encrypt: bool,
             failed: list[SyncpackError] | None) -> list[tuple[PeerPlan, bytes | None]]:
    """Each plan with the key its packets are sealed to (None: unsealed).  A peer the family
    cannot seal to (an entry without a sealing key) raises, or with ``failed`` is left out
    and its error collected: one such member must not stop the packets for the others."""
    out = []
    for plan in plans:
        try:
            out.append((plan, seal_key(site, plan.peer, encrypt)))
        except SyncpackError as err:
            err.peer = plan.name
            if failed is None:
                raise
            failed.append(err)
    return out


def select_peers(site: Site, to: list[str] | None, all_peers: bool) -> list[bytes]:
    """Peer ids for ``--to NAME...`` (in the order named) or ``--all`` (by name)."""
    if all_peers:
        return sorted((i for i in site.members_by_id() if i != site.site_id), key=site.name_of)
    peers: list[bytes] = []
    for name in to or []:
        m = site.member_named(name)
        if m.site_id == site.site_id:
            raise UsageError(f"{name} is this site; export to another member",
                             hint="'syncpack lsepoch' lists the peers; --all exports to each")
        if m.site_id not in peers:
            peers.append(m.site_id)
    return peers


def export(site: Site, out_dir: str | os.PathLike, to: list[str] | None = None,
           all_peers: bool = False, max_size: int = DEFAULT_MAX_SIZE,
           seed: bytes | None = None, now_ms: int | None = None,
           progress: Callable[[int], None] | None = None,
           encrypt: bool = False,
           failed: list[SyncpackError] | None = None,
           seal_max: int | None = None,
           did_not_fit: dict[str, int] | None = None) -> list[ExportedPacket]:
    """Write packets for the named peers (or all).  With ``failed``, peers that cannot be
    served (a resync needed, say) are reported there and the others still get their packets.
    ``seal_max`` bounds the blocks our unsealed ops become (default: half of ``max_size``;
    a caller exporting to several media passes half of the smallest).

    A medium too small for everything gets what fits, peer by peer in the order given
    (:class:`~syncpack.exchange.packets.MediumRoom`); the ops left for the next trip are
    counted per peer name in ``did_not_fit``.  On a small medium, packets are at most half
    its free space whatever ``max_size`` says, so that our transactions are sealed into
    blocks that fit it, one trip at a time."""
    out = Path(out_dir)
    medium = MediumRoom.of(out)
    if medium is not None:
        max_size = medium.cap(max_size)
        if seal_max is not None:
            seal_max = min(seal_max, max_size // 2)

    def write(peers: list[bytes], now: int, sign) -> list[tuple[PeerPlan, list[PartInfo]]]:
        written: list[tuple[PeerPlan, list[PartInfo]]] = []
        conn = site.conn
        # there now, it must stay there (a library caller may leave it for the first packet)
        outbox = out if out.is_dir() else None
        exports.begin_snapshot(conn)  # one read snapshot for plan and ops alike
        try:
            plans = plan_exports(site, peers, now, failed, sign, max_size, out)
            expect(progress, sum(hi - lo for p in plans for lo, hi in p.ranges.values()))
            for plan, seal_to in sealable(site, plans, encrypt, failed):
                d = packet_dir(out, site.name, plan.name)
                opener = atomic_opener(d, lambda part, s=plan.template.seq: packet_name(s, part),
                                       outbox=outbox)
                parts = build_update_packets(block_stream(site, plan.blocks), plan.template, sign,
                                             max_size, opener, seed, progress,
                                             seal_to=seal_to, medium=medium)
                if parts:
                    written.append((plan, parts))
                if did_not_fit is not None and medium is not None:
                    left = planning.ops_beyond(plan.ranges, [p.header.ranges for p in parts])
                    if left:
                        did_not_fit[plan.name] = left
            exports.end_snapshot(conn, keep=True)
        except BaseException:
            exports.end_snapshot(conn)
            for _plan, parts in written:
                for p in parts:
                    p.path.unlink(missing_ok=True)
            raise
        return written

    return run_export(site, to, all_peers, max_size, now_ms, seal_max, write)


def did_not_fit_text(did_not_fit: dict[str, int], out) -> str:
    """What an export cut short by a full medium tells its administrator."""
    left = ", ".join(f"{n} op(s) for {peer}" for peer, n in did_not_fit.items())
    return (f"the medium at {out} is full: {left} did not fit; the packets "
            f"written carry what did, so import them at the far end and export again to "
            f"send the rest")


Writer = Callable[[list[bytes], int, Callable[[bytes], bytes]],
                  list[tuple[PeerPlan, list[PartInfo]]]]


def run_export(site: Site, to: list[str] | None, all_peers: bool, max_size: int,
               now_ms: int | None, seal_max: int | None, write: Writer) -> list[ExportedPacket]:
    """The export driver every engine shares: under the site lock, pick the peers, seal our
    pending transactions into blocks (one rule, so every engine sends the same blocks), let
    the engine's ``write(peers, now, sign)`` plan and write the packets, then record what was
    written.  Only the writing differs between engines."""
    if not to and not all_peers:
        raise UsageError("name the peers with --to PEER (repeatable) or use --all")
    _sync_app(site)     # an attached application's changes go out too
    with site.lock():
        peers = select_peers(site, to, all_peers)
        now = wall_ms() if now_ms is None else now_ms
        sign = site.signer()    # the key stays in this process: only the driver signs
        with site.write_txn():
            forks.end_retired(site)     # a member retired since: one history kept
        # A block of ours that cannot fit a packet with its header (a transaction sealed at
        # commit, larger than this medium) is sealed again as parts.
        reseal_above = max_size - RESEAL_HEADROOM
        if chain.has_pending(site.conn, site.site_id) or chain.has_oversized(
                site.conn, site.site_id, reseal_above):
            with site.write_txn():
                # Our small transactions become blocks now, once, each small enough for a
                # packet of this export (packets are cut between blocks only).
                site.seal_pending(max_block=seal_max or max_size // 2,
                                  reseal_above=reseal_above)
        written = write(peers, now, sign)
        record_exports(site, written, now)
    # the pieces of one block count its ops once, in the first
    return [ExportedPacket(p.path, plan.name, 0 if p.header.piece and p.header.piece[0] else
                           p.header.count, p.size,
                           {site.name_of(o): [lo, hi]
                            for o, (lo, hi) in sorted(p.header.ranges.items())},
                           p.header.seq, p.header.part)
            for plan, parts in written for p in parts]


def record_exports(site: Site, written: list[tuple[PeerPlan, list[PartInfo]]],
                   now: int) -> None:
    """After the files are durable: the link counters, the packets, the 'sent' estimates and
    which acknowledgements each peer now has."""
    with site.write_txn() as conn:
        for plan, parts in written:
            ensure_link(site, plan.peer)
            exports.record_link_sent(conn, plan.peer, plan.template.seq,
                                     vec_blob(plan.template.vector))
            # ours too: the time of our newest word to it (_restored_heard)
            exports.record_acks_told(conn, plan.peer,
                                     [(m, c) for m, c, _v, _s in plan.template.acks])
            fork_store.note_heads_told(conn, plan.peer, plan.heads)
            forks.note_told(site, plan.peer, plan.template)
            for p in parts:
                h = p.header
                exports.record_packet_out(conn, h.packet_id, h.recipient, h.seq, h.part, h.kind,
                                          ranges_blob(h.ranges), h.count, p.size, str(p.path),
                                          now)
                raise_matrix(site, plan.peer, "sent",
                             {o: hi for o, (lo, hi) in h.ranges.items()})


# --- import -----------------------------------------------------------------------------------

@dataclass
class ImportResult:
    applied: list[str] = field(default_factory=list)
    duplicates: list[str] = field(default_factory=list)
    parked: list[dict] = field(default_factory=list)
    rejected: list[dict] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    ops_applied: int = 0
    started_ms: int = 0     # wall clock when the import began: what it committed is after
    # transactions larger than a packet of which only the first parts are here (held)
    incomplete: list[dict] = field(default_factory=list)
    # Why each skipped packet was left alone: "other site" or "other family".
    skipped_why: dict[str, str] = field(default_factory=dict)
    # Files in a searched directory that are not packets at all.
    ignored: list[str] = field(default_factory=list)
    # Forks this import found: an origin signed two histories (docs/design.md §3.10).
    forks: list[dict] = field(default_factory=list)
    # Parked packets whose kept copy was gone (a site restored without SITE/parked/):
    # forgotten, since their ops come again from a peer.
    forgotten: list[dict] = field(default_factory=list)
    # Rejected only because the family requires sealing (shown paths): their headers were
    # taken in, so their senders send what they held again, sealed.
    unsealed: list[str] = field(default_factory=list)
    # Tables of the family created in the attached application's file, with their rows, and
    # the peers' definitions (tables, columns) it refused, each with the reason.
    created_tables: list[dict] = field(default_factory=list)
    refused_definitions: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"applied": self.applied, "duplicates": self.duplicates, "parked": self.parked,
                "rejected": self.rejected, "ops_applied": self.ops_applied,
                "skipped": self.skipped, "ignored": self.ignored,
                "incomplete_transactions": self.incomplete, "forks": self.forks,
                "forgotten_parked": self.forgotten, "created_tables": self.created_tables,
                "refused_definitions": self.refused_definitions}


@dataclass
class _Candidate:
    pk: OpenPacket | JoinedPiecesPacket
    display: str
    parked_file: Path | None = None
    piece_data: bytes | None = None     # a piece packet's block bytes, once read


def _piece_key(h: Header) -> tuple:
    (o, (lo, hi)), = h.ranges.items()
    return h.sender, h.seq, o, lo, hi, h.piece[1]


def _first_piece_mismatch(head: bytes, key: tuple) -> str | None:
    """The first piece begins with the block's header: it must be the block the pieces'
    headers name, as long as they say (a lying length is refused at once, not waited on)."""
    _sender, _seq, origin, lo, hi, total = key
    if len(head) < blocks.HEADER_LEN or head[:4] != blocks.MAGIC:
        return "the first piece does not begin with a block header"
    if (head[6:14], int.from_bytes(head[14:22], "big"), int.from_bytes(head[22:30], "big")) \
            != (origin, lo, hi):
        return "the first piece holds another block than the pieces' headers name"
    if blocks.HEADER_LEN + int.from_bytes(head[118:122], "big") != total:
        return (f"the pieces' headers give the block {total} bytes, its own header "
                f"{blocks.HEADER_LEN + int.from_bytes(head[118:122], 'big')}")
    return None


def _join_pieces(site: Site, pending: list[_Candidate], res: ImportResult,
                 reject: Callable[[_Candidate, PacketError], None]) -> list[_Candidate]:
    """Every complete set of pieces of one block (formats/PACKET.md section 6.4) in
    ``pending`` becomes one candidate holding the joined block; an incomplete set stays as
    it is (parked at the end, listed as waiting).  Pieces are matched by sender, link
    sequence, block range and length, in any order; a copy of a piece with the same bytes is
    a duplicate, one with other bytes, or a set whose pieces overlap, is refused whole."""
    out: list[_Candidate] = []
    groups: dict[tuple, list[_Candidate]] = {}
    for c in pending:
        if isinstance(c.pk, JoinedPiecesPacket) or c.pk.header.piece is None:
            out.append(c)
        elif is_known(site, c.pk.header):     # its block was joined and applied before
            if c.parked_file:
                drop_parked(site, c.pk.header, c.parked_file)
            else:
                res.duplicates.append(c.display)
        else:
            groups.setdefault(_piece_key(c.pk.header), []).append(c)
    for key, cs in groups.items():
        total = key[-1]
        try:
            for c in cs:
                if c.piece_data is None:
                    c.piece_data = piece_bytes(site, c.pk)
        except PacketError as e:
            for c in cs:
                reject(c, e)
            continue
        cs.sort(key=lambda c: (c.pk.header.piece[0], c.pk.header.part))
        chosen: list[_Candidate] = []
        reach, bad = 0, None
        if cs[0].pk.header.piece[0] == 0:
            bad = _first_piece_mismatch(cs[0].piece_data, key)
        for c in cs if bad is None else ():
            off = c.pk.header.piece[0]
            if chosen and off == chosen[-1].pk.header.piece[0]:
                if c.piece_data == chosen[-1].piece_data:
                    prev = chosen[-1]
                    if prev.parked_file and not c.parked_file:
                        # the copy parked before: this one goes on in its place (listed as
                        # applied or parked, as a packet parked and imported again is)
                        drop_parked(site, prev.pk.header, prev.parked_file)
                        chosen[-1] = c
                    elif c.parked_file:
                        drop_parked(site, c.pk.header, c.parked_file)
                    else:
                        res.duplicates.append(c.display)
                    continue
                bad = "two pieces at the same offset hold different bytes"
                break
            if off < reach:
                bad = f"pieces overlap at offset {off}"
                break
            chosen.append(c)
            reach = off + len(c.piece_data) if off == reach else -1
        if bad is not None:
            err = PacketBodyError(f"pieces of a block of {site.name_of(key[2])} (epochs "
                                  f"{key[3] + 1}..{key[4]}) from {site.name_of(key[0])}: "
                                  f"{bad}; refused",
                                  hint="get fresh copies of these packets from the sender")
            for c in cs:
                reject(c, err)
            continue
        if reach != total:
            if site.vector().get(key[2], 0) >= key[4]:
                # Its epochs came meanwhile (the sender sent them again after a piece was lost
                # or damaged): these pieces will never be needed.
                for c in cs:
                    pass_over(site, c.pk.header, c.display, c.parked_file)
                    if not c.parked_file:
                        res.duplicates.append(c.display)
                continue
            out.extend(chosen)      # waits for the missing pieces
            continue
        last = chosen[-1].pk.header
        anchors: dict[bytes, bytes] = {}
        for c in chosen:
            anchors.update(c.pk.header.anchors)
        hdr = replace(last, piece=None, hlc_max=max(c.pk.header.hlc_max for c in chosen),
                      anchors=anchors,
                      mandatory=[f for f in last.mandatory if f != codec.FEATURE_PIECE])
        joined = JoinedPiecesPacket(chosen[-1].pk.path, hdr,
                                    b"".join(c.piece_data for c in chosen), chosen)
        out.append(_Candidate(joined, chosen[-1].display))
    return out


def import_packets(site: Site, paths: Iterable[str | os.PathLike], *,
                   skew_ms: int = DEFAULT_SKEW_MS, now_ms: int | None = None,
                   progress: Callable[[int], None] | None = None,
                   result: ImportResult | None = None) -> ImportResult:
    """Verify every packet found, apply what can apply (in dependency order, whatever order
    the files come in), park what waits for a gap, reject the rest one by one: a bad packet
    never stops the good ones beside it.  Each packet applies in its own transaction; with
    ``result``, the outcome is collected there as it happens, so a caller interrupted midway
    (Ctrl-C) still knows which packets were applied and committed."""
    res = result if result is not None else ImportResult()
    res.started_ms = wall_ms()
    _sync_app(site, res)    # local changes first: an import never hides one
    with site.lock():
        cands: list[_Candidate] = []
        snaps: dict[tuple[bytes, int], list[_Candidate]] = {}
        # A sender we do not know yet may be a member whose roster entry arrives in another
        # packet of this same import; such packets are verified again after each pass.
        unknown: list[tuple[_Candidate, PacketError]] = []
        opened: list[_Candidate] = []

        def check(c: _Candidate) -> None:
            verify(site, c.pk, now_ms=now_ms, skew_ms=skew_ms)

        for path, named in find_packet_files(paths):
            shown = str(path)       # the real name; human output escapes it when printed
            if not os.path.lexists(path):
                res.rejected.append({"path": shown, "error": "no such file",
                                     "hint": "check the path (is the medium mounted?)"})
                continue
            try:
                pk = open_packet(path)
            except PacketError as e:
                # A damaged or too new packet is not silent, nor one with a packet's name
                # that is cut short before its magic (a stick pulled out mid-copy): left out
                # as 'not a packet', a -q round from cron never said it.
                if told_if_unreadable(path, named):
                    res.rejected.append({"path": shown, "error": str(e), "hint": e.hint})
                else:
                    res.ignored.append(shown)   # in a directory: not a packet, left alone
                continue
            h = pk.header
            if not named and (h.family != site.family_id or h.recipient != site.site_id):
                res.skipped.append(shown)
                res.skipped_why[shown] = ("other family" if h.family != site.family_id
                                          else "other site")
                pk.close()
                continue
            c = _Candidate(pk, shown)
            opened.append(c)
            try:
                check(c)
            except PacketSenderError as e:
                if h.sender not in site.members_by_id(include_retired=True):
                    unknown.append((c, e))
                else:
                    res.rejected.append({"path": shown, "error": str(e), "hint": e.hint})
                continue
            except PacketError as e:
                if isinstance(e, PacketPolicyError) and is_known(site, h):
                    # applied before the family's policy changed (sealing turned on): it is
                    # what it was then, a duplicate, not a packet to refuse at every import
                    res.duplicates.append(shown)
                    continue
                if isinstance(e, PacketPolicyError) and h.kind != codec.KIND_SNAPSHOT:
                    # Its ops are refused, its signed header is not: the sender may lack the
                    # very ops that carry the rule (a lost packet), and only what it reports
                    # (its vector, what it received, its gaps) makes this site send them
                    # again; refused unheard, the two sites stalled for good.
                    with site.write_txn():
                        note_header(site, h, applied=False)
                    res.unsealed.append(shown)
                res.rejected.append({"path": shown, "error": str(e), "hint": e.hint})
                continue
            if h.kind == codec.KIND_SNAPSHOT:
                snaps.setdefault((h.sender, h.seq), []).append(c)
            else:
                cands.append(c)
        if any(c.pk.header.sealed for c in opened):
            # before anything applies: a missing, damaged or foreign key failed the first
            # sealed packet midway, the import stopped there and hid what it had applied
            site.check_sealing_key()
        with site.write_txn():
            forks.end_retired(site)
        # rows of attached tables go into the application's tables as they arrive
        # (the headers' counts are the senders' word: they choose only how rows are written)
        direct = attach_applying.DirectApply(site, sum(
            c.pk.header.count for c in [*cands, *(c for g in snaps.values() for c in g)])
        ) if _has_app(site) else None
        try:
            for group in snaps.values():
                _apply_snapshot(site, group, res, progress)
            while True:
                cands += _parked_candidates(site, res, opened, check)
                _apply_all(site, cands, res, progress)
                cands = []
                still = []
                for c, err in unknown:
                    try:
                        check(c)
                        cands.append(c)
                    except PacketSenderError as e:
                        still.append((c, e))
                    except PacketError as e:
                        res.rejected.append({"path": c.display, "error": str(e), "hint": e.hint})
                unknown = still
                if not cands:
                    break
            for c, err in unknown:
                res.rejected.append({"path": c.display, "error": str(err), "hint": err.hint})
            with site.write_txn():
                forks.end_retired(site)     # a retirement may have arrived just now
            res.incomplete = [{"origin": site.name_of(o), "epochs": [lo + 1, hi], "parts": n}
                              for o, (lo, hi, n) in sorted(chain.incomplete(site.conn).items())]
            if direct is not None:
                with _applied_kept(res):
                    direct.finish()
        finally:
            if direct is not None:
                direct.close()
            for c in opened:
                c.pk.close()
    with _applied_kept(res):
        _sync_app(site, res)    # what arrived, into the attached application's tables
    return res


@contextmanager
def _applied_kept(res: ImportResult) -> Iterator[None]:
    """An attached application's file that fails once the store has applied packets (full,
    locked, unreadable): the error says that those packets stay applied and that their rows
    wait for the next command, so the administrator does not import them again or restore."""
    try:
        yield
    except AttachError as e:
        if res.applied:
            e.message = (f"{e.message}; the {len(res.applied)} packet(s) applied before "
                         f"({res.ops_applied} op(s)) stay applied in the store, and their rows "
                         f"are written into the application's tables by the next syncpack "
                         f"command")
        raise


def committed_since(site: Site, res: ImportResult) -> list[tuple[str, int]]:
    """After an interruption: ``(path, ops)`` of the packets this import committed, read from
    the store (see :mod:`syncpack.store.history`), whatever the result had noted."""
    # A fresh connection: the command's own may be closed or mid-rollback by now.
    with Site.open(site.path) as s:
        history.settle(s.conn)
        return history.applied_since(s.conn, res.started_ms)


def _parked_candidates(site: Site, res: ImportResult, opened: list, check) -> list[_Candidate]:
    """Parked packets join every pass: they may apply now.  They are verified again (the
    roster may have changed since they were parked)."""
    out = []
    res.parked = []
    for sender, pid, fname, shown in exports.parked_rows(site.conn):
        f = site.parked_dir() / fname
        c = None
        if not f.exists():
            # Not damage: the kept copy is gone (a backup restored without the parked
            # directory).  The packet's ops are not held, so a peer sends them again.
            res.forgotten.append({"path": shown or str(f), "parked_file": str(f),
                                  "from": site.name_of(sender)})
            exports.forget_parked(site.conn, sender, pid)
            continue
        try:
            pk = open_packet(f)
            c = _Candidate(pk, shown or str(f), parked_file=f)
            opened.append(c)
            if (pk.header.sender, pk.header.packet_id) != (sender, pid):
                raise PacketError("parked file does not hold the packet recorded for it")
            check(c)
        except PacketError as e:
            res.rejected.append({"path": shown or str(f), "error": f"parked packet: {e}",
                                 "hint": e.hint})
            exports.forget_parked(site.conn, sender, pid)
            f.unlink(missing_ok=True)
            continue
        out.append(c)
    return out


def _apply_snapshot(site: Site, group: list[_Candidate], res: ImportResult,
                    progress=None) -> None:
    """A snapshot packet addressed to a member: a hard resync (docs/design.md §6)."""
    group.sort(key=lambda c: c.pk.header.part)
    shown = [c.display for c in group]
    if is_known(site, group[0].pk.header):
        res.duplicates.extend(shown)
        return
    parts = [c.pk.header.part for c in group]
    first = group[0].pk.header
    if parts != list(range(len(group))) or not group[-1].pk.header.final or any(
            (c.pk.header.vector, c.pk.header.hlc_max) != (first.vector, first.hlc_max)
            for c in group):
        for s in shown:
            res.rejected.append({"path": s, "error": f"snapshot parts incomplete or from "
                                 f"different snapshots: have parts {parts}; nothing was "
                                 f"changed",
                                 "hint": "import every part of one snapshot together (the "
                                         "files its 'resync' or 'mkreplica export' wrote)"})
        return
    try:
        n = apply_snapshot(site, [c.pk for c in group], progress)
    except PacketError as e:
        for s in shown:
            res.rejected.append({"path": s, "error": str(e), "hint": e.hint})
        return
    res.applied.extend(shown)
    res.ops_applied += n


def waiting_text(parked: dict) -> str:
    """What a parked packet (an entry of ``ImportResult.parked`` or of status's ``parked``)
    waits for, for people: the missing epochs, inclusive, or its block's other pieces."""
    w = ", ".join(f"{o} epochs {lo + 1}-{hi}" for o, (lo, hi) in parked["waiting_for"].items())
    return f"the other pieces of its block ({w})" if parked.get("waiting_for_pieces") else w


def _apply_all(site: Site, cands: list[_Candidate], res: ImportResult, progress) -> None:
    def order(c: _Candidate):
        h = c.pk.header
        return (site.name_of(h.sender), h.seq, h.part)

    pending = sorted(cands, key=order)
    expect(progress, sum(c.pk.header.count for c in cands))
    unproven: dict[tuple[bytes, bytes], PacketError] = {}

    def reject(c: _Candidate, e: PacketError) -> None:
        if isinstance(c.pk, JoinedPiecesPacket):
            for piece in c.pk.pieces:
                reject(piece, e)
            return
        res.rejected.append({"path": c.display, "error": str(e), "hint": e.hint})
        if c.parked_file:
            drop_parked(site, c.pk.header, c.parked_file)

    seen: set[tuple[bytes, bytes]] = set()
    found: dict[tuple[bytes, bytes], set[bytes]] = {}
    changed = True
    while changed:
        changed = False
        still: list[_Candidate] = []
        pending = sorted(_join_pieces(site, pending, res, reject), key=order)
        for c in pending:
            h = c.pk.header
            if h.piece is not None:
                still.append(c)     # its block is not whole yet
                continue
            if (h.sender, h.packet_id) in seen or is_known(site, h):
                if c.parked_file:
                    drop_parked(site, h, c.parked_file)
                else:
                    res.duplicates.append(c.display)
                continue
            if h.kept:
                with site.write_txn():
                    forks.note_kept(site, h)    # it healed: before the gap check
            frozen = forks.frozen(site)
            if planning.gaps({o: r for o, r in h.ranges.items() if o not in frozen},
                             site.vector()):
                still.append(c)
                continue
            try:
                n = apply_packet(site, c.pk, progress=progress, parked_file=c.parked_file,
                                 found_here=frozenset(found.get((h.sender, h.packet_id), ())),
                                 pieces=[(p.pk.header, p.pk.path, p.parked_file)
                                         for p in getattr(c.pk, "pieces", ())])
            except ForkDetected as e:
                with site.write_txn():
                    stash_own(site, f"{site.name_of(h.sender)} holds a different op as epoch "
                                    f"{e.epoch} of this site", from_epoch=e.epoch)
                still.append(c)      # retried (or parked) against the wound-back vector
                changed = True
                continue
            except ForkFound as e:
                if e.origin in found.get((h.sender, h.packet_id), ()):
                    # evidence known here and no longer open (healed, or ended): refuse
                    reject(c, ForkFoundError(
                        f"{site.name_of(e.origin)} signed two histories of its epoch "
                        f"{e.epoch}; this packet carries the one not kept here; refused"))
                    continue
                with site.write_txn():
                    forks.note(site, e.origin, e.epoch, e.a, e.b)
                found.setdefault((h.sender, h.packet_id), set()).add(e.origin)
                res.forks.append({"path": c.display, "origin": site.name_of(e.origin),
                                  "epoch": e.epoch})
                still.append(c)      # applied again, without the forked range
                changed = True
                continue
            except PacketSenderError as e:
                # Ops of an origin we do not know as a member: its roster entry may come in
                # another packet of this import.  Tried again after each pass; refused if
                # nothing brings it.
                unproven[(h.sender, h.packet_id)] = e
                still.append(c)
                continue
            except PacketError as e:
                reject(c, e)
                continue
            unproven.pop((h.sender, h.packet_id), None)
            seen.add((h.sender, h.packet_id))
            if isinstance(c.pk, JoinedPiecesPacket):
                seen.update((p.pk.header.sender, p.pk.header.packet_id) for p in c.pk.pieces)
                res.applied.extend(p.display for p in c.pk.pieces)
            else:
                res.applied.append(c.display)
            res.ops_applied += n
            changed = True
        pending = still
    for c in [c for c in pending if (c.pk.header.sender, c.pk.header.packet_id) in unproven]:
        h = c.pk.header
        if h.seq > link(site, h.sender)["in_seq"] + 1:
            # an earlier packet of its sender has not come: it may be the one that adds the
            # member these changes come from (a roster write); parked, tried at each import
            continue
        reject(c, unproven[(h.sender, h.packet_id)])
        pending.remove(c)
    # a joined block that could not apply yet waits as its pieces
    pending = [p for c in pending for p in (c.pk.pieces if isinstance(c.pk, JoinedPiecesPacket)
                                            else [c])]
    vec = site.vector()
    parked_ids = {(c.pk.header.sender, c.pk.header.packet_id) for c in pending if c.parked_file}
    for c in pending:
        h = c.pk.header
        if not c.parked_file and (h.sender, h.packet_id) in parked_ids:
            # named again while parked, or at a second path of this import: it stays
            # parked, reported once
            continue
        if not c.parked_file:
            parked_ids.add((h.sender, h.packet_id))
        gaps = planning.gaps(h.ranges, vec)
        pieces = h.piece is not None and not gaps
        if pieces:
            gaps = dict(h.ranges)       # waits for the block's other pieces
        if not gaps and (h.sender, h.packet_id) in unproven:
            # waits for the roster entries of origins not known yet (an earlier packet)
            known = site.members_by_id(include_retired=True)
            gaps = {o: r for o, r in h.ranges.items() if o not in known}
        if not c.parked_file:
            park(site, c.pk, gaps, c.display)
        res.parked.append({"path": c.display, "waiting_for": {
            site.name_of(o): [lo, hi] for o, (lo, hi) in sorted(gaps.items())},
            "waiting_for_pieces": pieces})
