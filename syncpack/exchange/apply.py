"""The one apply path: verified update packets, and snapshots (replica creation and hard resync).

Everything here runs on packets :func:`syncpack.exchange.verify.verify` has passed, each inside one write
transaction: a packet is applied whole or not at all.  What a packet claims about other sites is
believed only as far as it proves: ops must come from members and may not rewrite a member's
roster entry; acknowledgements count only with their own member's signature (checked by the
verifier); claims about our own history go through :func:`syncpack.admin.recovery.note_report`.
"""

from __future__ import annotations

import heapq
from itertools import compress
import shutil
from collections import deque
from contextlib import ExitStack, nullcontext
from pathlib import Path
from typing import Iterable, Iterator

from syncpack.admin import recovery
from syncpack.format import blocks, codec, keys, values
from syncpack.rules import planning
from syncpack.store import attached, chain, db, exports, fields, log, stash, versions
from syncpack.store import matrix as stored
from syncpack.format.codec import Header, Op
from syncpack.format.csn import CSN_LEN, csn_hlc, csn_origin, pack_csn, split_csns
from syncpack.errors import (EpochCollisionError, PacketBodyError, PacketSenderError,
                             PacketSignatureError, PatchError, SnapshotForkError)
from syncpack.exchange.links import (ensure_link, link, matrix, raise_matrix, ranges_blob,
                     store_acknowledgements)
from syncpack.exchange.packets import PACKET_SUFFIX
from syncpack.fileops import write_atomic
from syncpack.pipeline import Pending, Worker
from syncpack.progress import expect
from syncpack.format.names import check_site_name
from syncpack.rules.conflict import POLICIES
from syncpack.replicated import (COLLECTIONS, FAMILY, FAMILY_KEY, ROSTER, SYS_PREFIX, TABLES,
                                 Member, priority_ok)
from syncpack.site import Site, wall_ms
from syncpack.exchange.verify import (JoinedPiecesPacket, OpenPacket, packet_blocks,
                                      name_block_error, resolved_acks, verify_acks,
                                      verify_block)
from syncpack.exchange import forks
from syncpack.store import forks as fork_store

APPLY_BATCH = 20_000

class ForkDetected(Exception):
    """Internal: a peer holds a different op under one of our own epochs."""

    def __init__(self, epoch: int):
        super().__init__(epoch)
        self.epoch = epoch


class ForkFound(Exception):
    """Internal: a block of the packet and one we hold prove that their origin signed two
    histories (``syncpack.rules.forks``).  The packet is rolled back; the caller keeps the
    evidence and applies the packet again without that origin's range."""

    def __init__(self, origin: bytes, epoch: int, a: bytes, b: bytes):
        super().__init__(origin, epoch)
        self.origin, self.epoch, self.a, self.b = origin, epoch, a, b


# --- what a verified header teaches us ---------------------------------------------------------

def note_header(site: Site, h: Header, applied: bool) -> None:
    """What every verified packet teaches us about its sender, applied or parked.

    The sender's vector is exact when it was made, so the newest report replaces what we had
    (not a running maximum): a peer restored from a backup reports less than before, and then
    everything we believed it held is wound back to what it reports.  'Newest' is by the
    packet's creation time, which the verifier bounds by the clock-skew limit."""
    peer = h.sender
    ensure_link(site, peer)
    conn = site.conn
    if h.created_ms >= stored.acked_created(conn, peer):
        _sent, old = matrix(site, peer)
        regressed = any(h.vector.get(o, 0) < e for o, e in old.items())
        stored.replace_acked(conn, peer, h.vector)
        if regressed:
            stored.sent_back_to_acked(conn, peer)
            stored.forget_told(conn, peer)
            # It lost what we told it, its own acknowledgements included: they are the proof
            # of how much of its own history it once held.
            stored.forget_acks_told(conn, peer)
            fork_store.forget_heads_told(conn, peer)
            forks.forget_told(site, peer)
        stored.set_acked_created(conn, peer, h.created_ms)
    stored.note_received(conn, peer, h.seq, h.recv_seq, h.waiting)
    _wind_back(site, peer, h)
    vec = site.vector()
    if any(e > vec.get(o, 0) for o, e in h.vector.items()) or h.recovering:
        # The sender holds ops we lack that its packets did not bring (lost, or parked here),
        # or it waits for the family's reports after a restore: tell it our vector again even
        # if it has not changed, or its probes go unanswered.
        stored.forget_told(conn, peer)
    elif h.reply and h.recv_seq < link(site, peer)["out_seq"]:
        # The sender waits for an acknowledgement and has not received our latest packet
        # (lost, or still on its way): our vector may never have reached it; answer once more.
        # Idle senders do not ask, so sites that export before they import fall quiet.
        stored.forget_told(conn, peer)
    # only acknowledgements the verifier checked: a member we do not know yet is passed over
    known = site.members_by_id(include_retired=True)
    acks = [a for a in resolved_acks(h) if a[0] in known]
    store_acknowledgements(site, acks)
    # what it gave us of the others' word, it has: not relayed back to it as news (its own
    # word is another matter: what we hold of it goes back after a restore, _acks_for)
    exports.record_acks_told(conn, peer, [(m, c) for m, c, _v, _s in acks if m != peer])
    forks.learn(site, h)
    recovery.note_report(site, h, applied)


def _wind_back(site: Site, peer: bytes, h: Header) -> None:
    """Lost or parked packets: the peer has seen our packets up to ``recv_seq`` (or reports a
    gap), yet its vector lacks what they carried; resend from what it acknowledged."""
    seen_hi: dict[bytes, int] = {}
    for r in log.ranges_sent_through(site.conn, peer, h.recv_seq):
        for o, lo, hi in codec.unpackb(r):
            seen_hi[o] = max(seen_hi.get(o, 0), hi)
    for o in h.waiting:
        seen_hi[o] = max(seen_hi.get(o, 0), h.waiting[o][1])
    sent, _acked = matrix(site, peer)
    for o, have in planning.wind_back(sent, h.vector, seen_hi).items():
        stored.set_sent(site.conn, peer, o, have)


# --- roster and membership: what one member may not do to another -----------------------------

def check_roster_entry(site: Site, name: str, raw: bytes | None, error=PacketBodyError,
                       roster: dict[str, Member] | None = None,
                       replaced: bytes | None = None) -> None:
    """A roster entry arriving from anywhere (a packet, a snapshot) must name a safe site,
    carry well-formed keys, and never replace an existing member's id or keys, nor take
    another member's id: otherwise one member could sign as another."""
    check_site_name(name, error)
    if raw is None:
        raise error(f"roster entry of {name} is deleted; members are retired, never removed")
    try:
        value = codec.decode_value(raw)
        new = Member.from_value(name, value)
        # Every field is used later (planning reads 'base', conflicts read 'priority'): a
        # malformed one would fail some other site's export, not just this import.
        ok = (isinstance(new.site_id, bytes) and len(new.site_id) == 8
              and isinstance(new.ed25519, bytes) and len(new.ed25519) == 32
              and isinstance(new.x25519, bytes) and len(new.x25519) in (0, 32)
              and priority_ok(value.get("priority", 0))
              and isinstance(value.get("retired", False), bool)
              and all(isinstance(o, bytes) and len(o) == 8 and type(e) is int
                      and 0 <= e < 1 << 63 for o, e in new.base.items()))
    except (KeyError, TypeError, ValueError, AttributeError):
        ok = False
    if not ok:
        raise error(f"roster entry of {name} is malformed")
    roster = site.roster() if roster is None else roster
    old = roster.get(name)
    if old is not None and (old.site_id, old.ed25519, old.x25519) != \
            (new.site_id, new.ed25519, new.x25519):
        raise error(f"roster entry of {name} would replace that member's identity or keys; "
                    f"refused", hint="a member's keys never change; to replace a site, retire "
                                     "it and add a new one (a name added at two members from "
                                     "two keygen runs: docs/operations.md, 'Mishaps')")
    if old is not None and old.base != new.base and not planning.covers(old.base, new.base) \
            and not _concurrent_entry(site, name, replaced):
        # 'base' is what every site believes the member held when it joined: raised, no site
        # sent it what lay below the lie, and nothing showed it (lag 0, fsck clean).  Lowered
        # only costs ops sent again.  An entry written without having seen ours (the member
        # added at two sites at once, each with its own snapshot) is another version of the
        # key: every site reads the lowest base of the versions that survive.
        raise error(f"roster entry of {name} would change the state that member was created "
                    f"from; refused", hint="a member's roster entry keeps its identity, keys "
                                           "and starting state; only priority and retirement "
                                           "change")
    for other in roster.values():
        if other.name != name and other.site_id == new.site_id:
            raise error(f"roster entry of {name} takes the site id of member {other.name}; "
                        f"refused")


def _concurrent_entry(site: Site, name: str, replaced: bytes | None) -> bool:
    """Whether a roster op (``replaced``: the versions it superseded; None for a snapshot's
    record) was written without having seen any version of ``name``'s entry held here."""
    if replaced is None:
        return False
    gone = set(split_csns(replaced))
    return not any(v.csn in gone for v in versions.of_key(site.conn, ROSTER, name))


def check_system_entry(site: Site, collection: str, key: str, raw: bytes | None,
                       roster: dict[str, Member] | None = None,
                       replaced: bytes | None = None) -> None:
    """syncpack's own replicated collections hold what every site reads on every import (the
    roster, the family settings, the conflict policies): an entry another site could not read
    would stop that site, so it is refused where it arrives."""
    if collection == ROSTER:
        return check_roster_entry(site, key, raw, roster=roster, replaced=replaced)
    try:
        value = None if raw is None else codec.decode_value(raw)
    except ValueError:
        value = ...
    if collection == FAMILY:
        ok = (key == FAMILY_KEY and isinstance(value, dict) and isinstance(value.get("name"), str)
              and value.get("policy") in POLICIES
              and isinstance(value.get("require_sealed", False), bool))
    elif collection == COLLECTIONS:
        ok = (isinstance(key, str) and bool(key) and not key.startswith(SYS_PREFIX)
              and (value is None or isinstance(value, dict) and value.get("policy") in POLICIES))
    elif collection == TABLES:
        ok = (isinstance(key, str) and bool(key) and not key.startswith(SYS_PREFIX)
              and (value is None or isinstance(value, dict)
                   and isinstance(value.get("create_sql"), str)
                   and isinstance(value.get("pk"), list) and value["pk"]
                   and all(isinstance(c, str) for c in value["pk"])))
    else:
        ok = False
    if not ok:
        raise PacketBodyError(f"entry {key!r} of syncpack's own collection {collection!r} is "
                              f"malformed or unknown; refused")


def _check_members(site: Site, origins, what: str) -> None:
    site.invalidate()
    members = site.members_by_id(include_retired=True)
    for o in origins:
        if o not in members:
            raise PacketSenderError(f"{what} carries changes of origin {o.hex()}, which was "
                                    f"never a member of family {site.family_name!r}; refused")


# --- update packets ---------------------------------------------------------------------------

# Blocks whose clock ranges overlap are merged op by op into CSN order; at most this many ops
# are held decoded at once (a packet that interleaves more is applied window by window: the
# outcome does not depend on the order, see Site.apply_version), which bounds the memory an
# import takes whatever the packet's size.
MERGE_WINDOW_OPS = 200_000


# A block whose body decompresses to at most this is hashed and decompressed in a second
# thread while the blocks before it are applied (blake2, zstd and SQLite release the GIL; the
# unpacking into columns holds it, and stays on the applying thread: done beside it, it would
# stall the insert for as long).  A larger block is decoded when its turn comes, so an import
# never holds two of those.
DECODE_AHEAD_MAX_RAW = 16 * 1024 * 1024


# How far an import reads ahead in a packet, in raw block bytes, for the last part of a
# transaction whose first part it has reached (see :func:`whole_transactions`).
LOOKAHEAD_BYTES = 32 * 1024 * 1024


def whole_transactions(raws: Iterable[bytes], whole: dict[tuple[bytes, int], int]
                       ) -> Iterator[bytes]:
    """The blocks ``raws``, unchanged and in order; for each transaction whose parts (formats/
    BLOCKS.md, 4.2) all follow in them within :data:`LOOKAHEAD_BYTES` of its first, ``whole``
    maps (origin, lo) of each part to the lo of its first part, before that part is given.

    Such a transaction can be applied part by part as its parts arrive: the packet is one
    store transaction, so nobody sees it half applied, and each part is decoded once, on the
    other core, while the one before it is applied.  Without it the parts are kept and the
    whole transaction read back and decoded again at its last part.  Only what the headers
    claim is read here; every block is still verified when it is reached, and a part that
    fails rolls the packet back.  A block given is not held here (an import's memory is
    counted in blocks)."""
    it = iter(raws)
    ahead: deque[bytes] = deque()      # read, not yet given
    failed: Exception | None = None
    while True:
        if ahead:
            raw = ahead.popleft()
        elif failed is not None:
            raise failed    # the packet's damage, met after the blocks before it
        else:
            raw = next(it, None)
            if raw is None:
                return
        if not ahead and failed is None and \
                blocks.read_block_header_flags(raw) == blocks.FLAG_MORE:
            failed = _look_ahead(raw, it, ahead, whole)
        yield raw
        raw = None


def _look_ahead(first_raw: bytes, it: Iterator[bytes], ahead: deque[bytes],
                whole: dict[tuple[bytes, int], int]) -> Exception | None:
    """Read the blocks after ``first_raw``, a transaction's first part, into ``ahead`` up to
    its last part (then noted in ``whole``), a block that does not continue it, or the
    limit; returns what reading them raised, if anything."""
    try:
        first = last = blocks.read_block_header(first_raw)
    except blocks.BlockError:
        return None     # refused when it is reached
    los, size = [first.lo], len(first_raw)
    while size <= LOOKAHEAD_BYTES:
        try:
            nxt = next(it, None)
        except Exception as e:
            return e
        if nxt is None:
            return None
        ahead.append(nxt)
        try:
            p = blocks.read_block_header(nxt)
        except blocks.BlockError:
            return None
        if p.origin != first.origin or p.lo != last.hi or not p.cont:
            return None     # not this transaction's: looked at on its own
        los.append(p.lo)
        size += len(nxt)
        last = p
        if not p.more:
            whole.update(((first.origin, lo), first.lo) for lo in los)
            return None
    return None


class Decoding:
    """A block's columns, from its body being (or already) decompressed."""

    def __init__(self, info: blocks.BlockInfo, body: Pending | None):
        self._info, self._body, self._columns = info, body, None

    def columns(self) -> blocks.BlockColumns:
        if self._columns is None:
            raw = self._body.result() if self._body is not None else None
            self._columns = blocks.decode_block(self._info, raw)
            self._body = None
        return self._columns


class DecodeAhead:
    """One worker thread decompressing the blocks of one packet in order.  Leaving waits for
    the one that may still run (bounded by a block's limits): no thread outlives the packet's
    transaction."""

    def __enter__(self) -> "DecodeAhead":
        self._worker = Worker("syncpack-decompress").__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._worker.__exit__(*exc)

    def decode(self, info: blocks.BlockInfo) -> Decoding:
        if info.raw_len > DECODE_AHEAD_MAX_RAW:
            return Decoding(info, None)
        return Decoding(info, self._worker.submit(blocks.decompressed_body, info))


class _Applier:
    """Applies the decoded blocks of one packet, inside the caller's transaction."""

    def __init__(self, site: Site, vec: dict[bytes, int], progress):
        self.site, self.vec, self.progress = site, vec, progress
        c = site.conn
        self.superseded_any = versions.any_superseded(c)
        self.stashed_any = stash.any_held(c)
        self.applied = 0
        self.system = False
        self.rows: list[tuple] = []
        # (origin, lo) of each part whose whole transaction is in the packet -> its first
        # part's lo (filled by whole_transactions)
        self.whole: dict[tuple[bytes, int], int] = {}

    def flush(self) -> None:
        if self.rows:
            versions.insert_many(self.site.conn, self.rows)
            self.rows = []

    def window(self, win: list[tuple[blocks.BlockInfo, Decoding]]) -> None:
        win = [(info, d.columns()) for info, d in win]
        site = self.site
        for info, cols in win:
            if info.hi > self.vec.get(info.origin, 0):
                # We keep what extends our history, byte for byte, to pass on.
                chain.store_block(site.conn, info, cols.last_seq)
        if any(info.flags and info.hi > self.vec.get(info.origin, 0) and not self.alone(info)
               for info, _c in win):
            self._parts(win)
            return
        if len(win) == 1:
            info, cols = win[0]
            if self._clean(info, cols):
                with blocks.gc_paused():
                    for batch in cols.column_batches(APPLY_BATCH):
                        versions.insert_columns(site.conn, *batch)
                        self._count(len(batch[1]))
                return
            if self._replacing(info, cols):
                with blocks.gc_paused():
                    for batch in cols.column_batches(APPLY_BATCH, replaced=True):
                        self._replace(*batch)
                        self._count(len(batch[1]))
                return
            ops: Iterable[Op] = cols.ops()
        else:
            ops = heapq.merge(*(c.ops() for _i, c in win),
                              key=lambda op: (op.hlc, op.origin, op.seq))
        n = 0
        for op in ops:
            n += self._op(op)
            if n >= APPLY_BATCH:
                self.flush()
                self._count(n)
                n = 0
        self.flush()
        self._count(n)

    def _parts(self, win: list[tuple[blocks.BlockInfo, blocks.BlockColumns]]) -> None:
        """A window holding parts of a transaction too large for one block: a part that is
        not the last is kept (stored above) and applies nothing; the last part applies the
        whole transaction, its earlier parts read back from the store, where earlier packets
        or this one left them.  Never a part of a transaction alone."""
        streams: list[Iterable[Op]] = []
        whole: list[tuple[blocks.BlockInfo, int]] = []
        for info, cols in win:
            if not info.flags or info.hi <= self.vec.get(info.origin, 0) or self.alone(info):
                streams.append(cols.ops())
            elif not info.more:
                whole.append((info, info.lo - cols.first_seq))
        # A whole transaction takes its place among the other ops in CSN order (its parts
        # share one clock): a later write in the packet that replaced one of its rows must
        # find that row, or the row would survive beside the write that replaced it.
        whole.sort(key=lambda w: (w[0].hlc_last, w[0].origin))
        n, later = 0, deque(whole)
        for op in heapq.merge(*streams, key=lambda op: (op.hlc, op.origin, op.seq)):
            while later and (later[0][0].hlc_last, later[0][0].origin) < (op.hlc, op.origin):
                n += self._whole(*later.popleft())
            n += self._op(op)
        while later:
            n += self._whole(*later.popleft())
        self.flush()
        self._count(n)

    def _whole(self, info: blocks.BlockInfo, start: int) -> int:
        """The transaction whose last part is ``info`` (epochs ``(start, info.hi]``), new to
        this site though its epochs may be below the vector: the vector counts parts held,
        the records only transactions applied.  Streamed, in batches (a transaction of
        millions of ops is never held whole); a missing part is found by the count and rolls
        the packet back."""
        self.flush()
        done = self._whole_as_columns(info.origin, start, info.hi)
        if done is not None:
            return done
        got = n = 0
        for op in chain.iter_ops(self.site.conn, info.origin, start, info.hi):
            if got == 0 and op.seq != 0:
                break
            got += 1
            n += self._fresh(op)
            if len(self.rows) >= APPLY_BATCH:
                self.flush()
        if got != info.hi - start:
            raise PacketBodyError(
                f"last part of a transaction of {self.site.name_of(info.origin)} "
                f"(epochs {start + 1}..{info.hi}) arrived without its earlier parts",
                hint="this site no longer holds them (restored from a backup?); ask "
                     "a peer for a snapshot with 'syncpack resync --to THIS_SITE'")
        self.flush()
        return n

    def _whole_as_columns(self, origin: bytes, start: int, hi: int) -> int | None:
        """A transaction's parts, stored one block each, applied part by part as columns
        (a part the fast path cannot take goes op by op).  Returns the ops applied, or None
        when the parts are not the blocks of exactly epochs ``(start, hi]`` beginning with
        the transaction's first op (the caller's op-wise path then applies it or refuses)."""
        conn = self.site.conn
        tiles = chain.tiling(conn, origin, start, hi)
        if not tiles:
            return None
        n = 0
        for k, b in enumerate(tiles):
            cols = blocks.decode_block(chain.block_bytes(conn, b))
            if k == 0 and cols.first_seq != 0:
                return None     # not the transaction's beginning: the op-wise path refuses
            self.flush()
            if self._plain(cols):
                with blocks.gc_paused():
                    for batch in cols.column_batches(APPLY_BATCH):
                        versions.insert_columns(conn, *batch)
            else:
                for op in cols.ops():
                    self._fresh(op)
                    if len(self.rows) >= APPLY_BATCH:
                        self.flush()
            n += cols.count
        self.flush()
        return n

    def alone(self, info: blocks.BlockInfo) -> bool:
        """``info`` is a part applied as it arrives, like a block of whole transactions: its
        transaction's parts are all in the packet and none of them is held here yet."""
        start = self.whole.get((info.origin, info.lo))
        return start is not None and start >= self.vec.get(info.origin, 0)

    def _count(self, n: int) -> None:
        self.applied += n
        if self.progress and n:
            self.progress(n)

    def _clean(self, info: blocks.BlockInfo, cols: blocks.BlockColumns) -> bool:
        """Nothing in the block needs more than an insert: all of it new, no earlier version
        replaced, none of syncpack's own collections, nothing set aside or superseded."""
        return info.lo >= self.vec.get(info.origin, 0) and self._plain(cols)

    def _plain(self, cols: blocks.BlockColumns) -> bool:
        """Each op of ``cols``, new to this site, needs no more than an insert."""
        return (not self.superseded_any
                and not self.stashed_any and not any(cols.replaced)
                and not any(c.startswith(SYS_PREFIX) for c in set(cols.collections))
                and not values.may_hold_patch(cols.values))

    def _replacing(self, info: blocks.BlockInfo, cols: blocks.BlockColumns) -> bool:
        """Each op of ``cols``, new to this site, needs no more than the removal of the
        versions it replaces and an insert (updates of ordinary records, in bulk)."""
        return (info.lo >= self.vec.get(info.origin, 0) and not self.superseded_any
                and not self.stashed_any
                and not any(c.startswith(SYS_PREFIX) or self.site.policy_of(c) == "merge"
                            for c in set(cols.collections))
                and not values.may_hold_patch(cols.values))

    def _replace(self, coll: str, keys: list[str], csns: list[bytes],
                 vals: list[bytes | None], reps: list[bytes]) -> None:
        """One batch of :meth:`_replacing` ops: what ``site.apply_version`` does op by op,
        as one removal of the replaced versions and one insert.  Only when no op of the batch
        replaces another of it and no key comes twice (the removal goes first); otherwise op
        by op."""
        conn = self.site.conn
        single = max(map(len, reps)) <= CSN_LEN     # each replaces one version (or none)
        if len(set(keys)) < len(keys) or not set(reps).isdisjoint(csns) or not single and \
                any(len(r) > CSN_LEN and not set(split_csns(r)).isdisjoint(csns)
                    for r in reps):
            for k, c, v, r in zip(keys, csns, vals, reps):
                self.site.apply_version(tuple.__new__(Op, (b"", 0, 0, 0, coll, k, v, r)), c)
            return
        gone = (list(zip(compress(keys, reps), filter(None, reps))) if single else
                [(k, c) for k, r in zip(keys, reps) if r for c in split_csns(r)])
        # Each key whose version goes gets its new one next, which notes it for an attached
        # table; noted for the removal too, its row was written twice (the application's
        # update triggers fired twice for one update of the origin's).
        with attached.triggers_aside(conn, deletes=True) if gone else nullcontext():
            if versions.remove_replaced(conn, coll, gone):
                self.superseded_any = True      # the next ops go op by op (apply_version)
        versions.insert_columns(conn, coll, keys, csns, vals)

    def _op(self, op: Op) -> int:
        site = self.site
        if op.epoch <= self.vec.get(op.origin, 0):
            held = chain.op_id_at(site.conn, op.origin, op.epoch)
            if held is not None and held != (op.hlc, op.seq):
                if op.origin == site.site_id:
                    raise ForkDetected(op.epoch)
                e = EpochCollisionError(
                    f"epoch collision: this site holds a different op as epoch {op.epoch} of "
                    f"{site.name_of(op.origin)}; packet refused")
                e.origin, e.epoch = op.origin, op.epoch
                raise e
            return 0
        return self._fresh(op)

    def _fresh(self, op: Op) -> int:
        site = self.site
        if self.stashed_any and op.origin == site.site_id:
            self.flush()
            if _unstash(site, op):
                return 1
        if op.collection.startswith(SYS_PREFIX):
            self.flush()
            check_system_entry(site, op.collection, op.key, op.value, replaced=op.replaced)
            if op.collection == COLLECTIONS and op.replaced:
                # 'collection create' never writes over an entry: two concurrent creates
                # are both kept and one picked, as for any key; a write over one is a
                # member changing how every site decides that collection from then on
                raise PacketBodyError(
                    f"op {op.key!r} of syncpack's collection {COLLECTIONS!r} would change the "
                    f"conflict policy of collection {op.key}, which never changes; refused",
                    hint="a collection's policy is set once, by 'collection create' before "
                         "its first record")
            self.system = True
            site.apply_version(op, op.csn)
            site.invalidate()
        elif op.replaced or self.superseded_any or self.stashed_any or \
                values.claims_patch(op.value):
            self.flush()     # the slow path reads versions and the changelog
            if site.apply_version(op, op.csn):
                self.superseded_any = True      # the version it replaced may come later
        else:
            self.rows.append((op.collection, op.key, op.csn, op.value))
        return 1


def _check_anchors(site: Site, h: Header, frozen: dict[bytes, int],
                   bad: dict[bytes, EpochCollisionError]) -> set[bytes]:
    """Each range's anchor (the CSN of the op just below it) against ours.  Returns the
    origins whose anchor we confirmed: their histories agree with ours up to the range (a fork
    changes every CSN from where it happens), so a first block that does not chain onto our
    block there was sealed again by its origin after a restore, not forked.  An anchor of
    another origin that differs goes into ``bad``: its first block may prove a fork."""
    confirmed = set()
    for o, csn in h.anchors.items():
        if o in frozen:
            continue
        lo = h.ranges[o][0]
        held = chain.op_id_at(site.conn, o, lo)
        if held is not None and pack_csn(held[0], o, held[1]) == csn:
            confirmed.add(o)
        if held is not None and pack_csn(held[0], o, held[1]) != csn:
            if o == site.site_id:
                raise ForkDetected(lo)
            e = EpochCollisionError(
                f"epoch collision: this site holds a different op as epoch {lo} of "
                f"{site.name_of(o)} than the one the packet's range continues; refused")
            e.origin, e.epoch = o, lo
            bad[o] = e
    return confirmed


def _prove_fork(site: Site, raw, sender: str, prev: bytes | None) -> None:
    """A block that disagrees with our history (its chain, its anchor or its ops): raise
    :class:`ForkFound` if its header and one of ours prove a fork (its signature checked,
    the chain not)."""
    try:
        info = verify_block(site, raw, sender, False, prev)
    except (blocks.BlockError, PacketSenderError, PacketSignatureError):
        return
    found = forks.contradiction(site, info)
    if found is not None:
        raise ForkFound(info.origin, *found)


def apply_packet(site: Site, pk: OpenPacket | JoinedPiecesPacket, *, progress=None,
                 parked_file: Path | None = None, found_here: frozenset = frozenset(),
                 pieces: list[tuple[Header, Path, Path | None]] = ()) -> int:
    """Apply one verified, gap-free packet in one transaction; returns ops applied.

    Each block is checked against its origin's key and our chain as it is reached (after the
    blocks before it applied, so a member added earlier in the packet is known), must continue
    its origin's range in the header, and the blocks must come in travelling order
    (:func:`syncpack.exchange.packets.order_blocks`); blocks whose clocks overlap are merged into CSN
    order.  Any failure rolls the whole packet back.

    A fork this packet shows (:class:`ForkFound`) rolls it back too; the caller keeps the
    evidence and applies it again, with ``found_here`` naming the origins it just found
    forked: their ranges are left out, and a packet of theirs is not refused for it (only
    packets of members known forked before are).

    A block joined from its pieces (``pk`` a :class:`JoinedPiecesPacket`) records every piece
    packet (``pieces``: header, path, parked copy) as applied with it, in the same
    transaction."""
    h = pk.header
    now = wall_ms()
    conn = site.conn
    sender = site.name_of(h.sender)
    try:
        with site.write_txn(), ExitStack() as stack:
            vec = site.vector()
            for o in h.ranges:
                stored.ensure_origin(conn, o)
            frozen = forks.frozen(site)
            lost = forks.lost_versions(site)
            left = forks.sent_before_healing(site, h)
            bad_anchor: dict[bytes, EpochCollisionError] = {}
            anchored = _check_anchors(site, h, frozen, bad_anchor)
            skipped: set[bytes] = set()
            ap = _Applier(site, vec, progress)
            ahead = stack.enter_context(DecodeAhead())
            cursor = {o: lo for o, (lo, _hi) in h.ranges.items()}
            win: list[tuple[blocks.BlockInfo, Decoding]] = []
            win_hlc, win_ops = -1, 0
            last_key: tuple | None = None
            last_hash: dict[bytes, bytes] = {}     # per origin, the packet's previous block
            win_alone = False
            for raw in whole_transactions(packet_blocks(site, pk), ap.whole):
                # Where the block sits first (its header, not yet trusted): a block missing,
                # repeated or moved by whoever assembled the packet shows as such, before any
                # chain comparison could blame its origin.
                peek = blocks.read_block_header(raw)
                origin = peek.origin
                if origin in bad_anchor and origin in left:
                    skipped.add(origin)     # its version left at the fork: not applied
                elif origin in bad_anchor:
                    # The range does not continue our history of this origin: a fork if its
                    # first block proves one, else an epoch collision.
                    if cursor.get(origin) == peek.lo:
                        _prove_fork(site, raw, sender, None)
                    raise bad_anchor[origin]
                if cursor.get(origin) != peek.lo or peek.hi > h.ranges[origin][1]:
                    raise PacketBodyError(
                        f"block of {site.name_of(origin)} (epochs {peek.lo + 1}..{peek.hi}) "
                        f"does not continue the packet's declared range of that origin")
                first = cursor.get(origin) == h.ranges[origin][0]
                # After a packet's first block of an origin, the chain continues inside the
                # packet; before it, in our store (unless the anchor vouched, see above).
                prev = last_hash.get(origin) if not first else None
                chained = not first or origin not in anchored
                if origin in frozen:
                    skipped.add(origin)     # its ops wait until it heals or is retired
                elif lost and bytes(raw[:blocks.HEADER_LEN]) in lost:
                    # the version that lost at a fork, sent by a peer that has not heard which
                    # was kept (it reverts it once it hears); for our own origin, ops we set
                    # aside and issued again
                    skipped.add(origin)
                if origin in skipped:
                    cursor[origin] = peek.hi
                    continue
                try:
                    info = verify_block(site, raw, sender, chained, prev)
                except blocks.BlockChainError:
                    if origin == site.site_id:
                        raise ForkDetected(peek.lo) from None   # our history forked: recover
                    if origin in left:
                        skipped.add(origin)
                        cursor[origin] = peek.hi
                        continue
                    _prove_fork(site, raw, sender, prev)
                    raise
                except PacketSenderError:
                    if not win:
                        raise
                    ap.window(win)      # a roster change in them may add this origin
                    win, win_hlc, win_ops = [], -1, 0
                    info = verify_block(site, raw, sender, chained, prev)
                last_hash[origin] = info.block_hash
                o = info.origin
                cursor[o] = info.hi
                if info.hlc_last > h.hlc_max:
                    raise PacketBodyError("ops carry a clock beyond the header's hlc_max")
                key = (info.hlc_first, o, info.lo)
                if last_key is not None and key < last_key:
                    raise PacketBodyError("blocks are not in the order packets carry them")
                last_key = key
                if info.hi <= vec.get(o, 0):
                    mine = chain.block_ending_at(conn, o, info.hi)
                    if mine is not None and mine.lo == info.lo and mine.hash == info.block_hash:
                        continue        # the very block we hold (relayed to us twice)
                if info.lo < vec.get(o, 0) and o == site.site_id:
                    # Our own ops, relayed back over epochs we hold (a block goes whole):
                    # another op in one of them is the family's version of a history we
                    # forked, which a peer's tip named higher up.  Applied, it stood beside
                    # ours, the store no longer a replay of its changelog.
                    e = next(forks.differing_epochs(site, info, vec[o]), None)
                    if e is not None:
                        raise ForkDetected(e)
                elif info.lo < vec.get(o, 0):
                    found = forks.contradiction(site, info) or \
                        forks.differing_op(site, info, vec[o])
                    if found is not None and o in left:
                        skipped.add(o)
                        continue
                    if found is not None:
                        raise ForkFound(o, *found)
                # decoded on the other core while the window before it is applied
                cols = ahead.decode(info)
                # a part applied as it arrives is a window of its own (the fast path takes
                # one block at a time)
                alone = ap.alone(info)
                if win and (alone or win_alone or info.hlc_first > win_hlc or
                            win_ops + info.count > MERGE_WINDOW_OPS):
                    ap.window(win)
                    win, win_hlc, win_ops = [], -1, 0
                win.append((info, cols))
                win_alone = alone
                win_hlc = max(win_hlc, info.hlc_last)
                win_ops += info.count
            if win:
                ap.window(win)
            short = [o for o, (_lo, hi) in h.ranges.items() if cursor[o] != hi]
            if short:
                raise PacketBodyError(
                    f"packet declares {h.count} ops in its ranges but its blocks of "
                    f"{site.name_of(short[0])} end at epoch {cursor[short[0]]}, not "
                    f"{h.ranges[short[0]][1]}")
            for o, (lo, hi) in h.ranges.items():
                if o not in skipped:
                    stored.raise_epoch(conn, o, hi)
            if h.hlc_max > int(site.meta("hlc", 0)):
                site.set_meta("hlc", h.hlc_max)     # bounded by the verifier's skew check
            if h.sender in forks.frozen(site) and h.sender not in found_here:
                forks.refuse_sender(site, h)
            note_header(site, h, applied=True)
            log.record_in(conn, h.sender, h.packet_id, h.seq, h.part, h.kind, ap.applied,
                          str(pk.path), now)
            if parked_file is not None:
                log.unpark(conn, h.sender, h.packet_id)
            for ph, path, parked in pieces:
                if ph.packet_id != h.packet_id:
                    log.record_in(conn, ph.sender, ph.packet_id, ph.seq, ph.part, ph.kind, 0,
                                  str(path), now)
                if parked is not None:
                    log.unpark(conn, ph.sender, ph.packet_id)
    except db.IntegrityError:
        raise PacketBodyError("packet carries an op this site already holds under another "
                              "epoch; nothing was applied") from None
    except blocks.BlockError as e:      # found decoding its ops, after its header verified
        if e.origin is None:
            raise
        raise name_block_error(site, e, e.origin, sender) from None
    if ap.system:
        site.invalidate()
    if parked_file is not None:
        parked_file.unlink(missing_ok=True)
    for _ph, _path, parked in pieces:
        if parked is not None:
            parked.unlink(missing_ok=True)
    return ap.applied


def _restash(site: Site, covered: int) -> None:
    """After a snapshot: our set-aside ops from a fork of our history on are ours alone, but
    the snapshot replaced every version, theirs too.  Those whose version the snapshot holds
    are the family's after all (dropped); the others get their versions back, to be renamed
    when they are issued again (recovery.reissue_stash), as they were before."""
    c = site.conn
    for op in stash.ops(c):
        csn = pack_csn(op.hlc, op.origin, op.seq)
        if op.epoch <= covered and csn in split_csns(
                versions.csns_of_key(c, op.collection, op.key)):
            stash.drop(c, op.origin, op.epoch)
        else:
            site.apply_version(op, csn)


def _unstash(site: Site, op: Op) -> bool:
    """One of our own set-aside ops came back from a peer, inside our own signed block (which
    is now kept): it is genuine, and its effect on the records is already here.  Returns
    False when ``op`` is none of them, to be applied as any other.

    An op under the very CSN of one set aside that is not that op (a member that signed
    another version of our epoch with our key and our clock, which the family kept) takes
    its place: ours is undone and dropped, and the family's applies (matched by CSN alone,
    ours stayed in the records while the changelog held the family's)."""
    mine = stash.op_of(site.conn, op.origin, op.hlc, op.seq)
    if mine is None:
        return False
    stash.drop(site.conn, op.origin, mine.epoch)
    if (mine.collection, mine.key, mine.value, mine.replaced) == \
            (op.collection, op.key, op.value, op.replaced):
        return True
    fork_store.undo_ops(site.conn, [mine])
    return False


def is_known(site: Site, h: Header) -> bool:
    """Applied before.  Packets are known by (sender, id): the sender is proven by the
    signature, so no member can make another's packet look like a duplicate."""
    return log.is_known(site.conn, h.sender, h.packet_id)


def parked_name(h: Header) -> str:
    return f"{h.sender.hex()}-{h.packet_id.hex()}{PACKET_SUFFIX}"


def park(site: Site, pk: OpenPacket, gaps: dict[bytes, tuple[int, int]], shown: str) -> None:
    """Keep a copy inside the site directory, so the medium can be removed."""
    h = pk.header
    fname = parked_name(h)
    dest = site.parked_dir() / fname
    pk.f.seek(0)
    # the rename is durable before the store points at the file
    write_atomic(dest, lambda out: shutil.copyfileobj(pk.f, out, 1 << 20),
                 tmp=dest.with_suffix(".tmp"))
    with site.write_txn() as conn:
        log.park(conn, h.sender, h.packet_id, h.seq, h.part, fname, shown, ranges_blob(gaps),
                 wall_ms())
        note_header(site, h, applied=False)


def drop_parked(site: Site, h: Header, f: Path) -> None:
    log.unpark(site.conn, h.sender, h.packet_id)
    f.unlink(missing_ok=True)


def pass_over(site: Site, h: Header, shown: str, parked_file: Path | None) -> None:
    """A packet of no use: its ops came by other packets (the pieces of a block the sender sent
    again, cut anew).  Noted as received without ops, so an inbox drained after import lets it
    go (left there, it was read and told as a duplicate every round), and a later import tells
    it as one; its parked copy goes."""
    with site.write_txn() as conn:
        log.record_in(conn, h.sender, h.packet_id, h.seq, h.part, h.kind, 0, shown, wall_ms(),
                      again_ok=True)
        if parked_file is not None:
            log.unpark(conn, h.sender, h.packet_id)
    if parked_file is not None:
        parked_file.unlink(missing_ok=True)


# --- snapshots: one path for replica creation and hard resync ----------------------------------

def _check_record(site: Site, rec, h: Header, roster: dict[str, Member]) -> None:
    """Every version in a snapshot comes from an origin the snapshot's vector covers (or from
    us), is not dated after the snapshot's own clock (a version years ahead would be named as
    replaced by this site's next write of its key, and every peer would refuse that write),
    and roster records obey the same rules as roster ops."""
    _check_stamp(site, rec, h, f"a version of {rec.collection}/{rec.key}")
    if rec.collection.startswith(SYS_PREFIX):
        check_system_entry(site, rec.collection, rec.key, rec.value, roster=roster)
    if values.claims_patch(rec.value):
        raise PatchError(f"snapshot holds a patch as the version of {rec.collection}/{rec.key}"
                         f"; a snapshot carries whole records")


def _check_stamp(site: Site, rec, h: Header, what: str) -> None:
    origin = csn_origin(rec.csn)
    if h.vector.get(origin, 0) <= 0 and origin != site.site_id:
        raise PacketBodyError(f"snapshot holds {what} from an origin its vector does not "
                              f"cover")
    if csn_hlc(rec.csn) > h.hlc_max:
        raise PacketBodyError(f"snapshot holds {what} dated after the snapshot's own clock",
                              hint="the snapshot is damaged or forged; ask another member "
                                   "for one")


def _history_row(site: Site, rec, h: Header) -> tuple:
    """A field_history row a snapshot carries (the stamps of its merge collections)."""
    try:
        row = fields.parse_history(rec.key, rec.csn, rec.value)
    except ValueError:
        raise PacketBodyError("snapshot holds a malformed field history record") from None
    _check_stamp(site, rec, h, "field history")
    return row


class RecordJoiner:
    """Joins the pieces of one snapshot record (formats/PACKET.md section 7.1), given in part
    order: they must be consecutive parts that tile ``0 ..< total`` from offset 0, nothing
    between them; anything else refuses the snapshot (its transaction rolls back whole)."""

    def __init__(self) -> None:
        self.buf: bytearray | None = None
        self.total = 0

    def add(self, h: Header, data: bytes) -> codec.Record | None:
        off, total = h.piece
        if self.buf is None:
            if off != 0:
                raise PacketBodyError(f"snapshot part {h.part} is a record piece at offset "
                                      f"{off}, but no piece at offset 0 comes before it")
            self.buf, self.total = bytearray(), total
        if total != self.total or off != len(self.buf):
            raise PacketBodyError(f"snapshot part {h.part}: record piece [{off}, {total}] does "
                                  f"not continue the record's {len(self.buf)} of "
                                  f"{self.total} bytes")
        if off + len(data) > total:
            raise PacketBodyError(f"snapshot part {h.part}: record piece runs past the "
                                  f"record's {total} bytes")
        self.buf += data
        if len(self.buf) < total:
            return None
        raw, self.buf = bytes(self.buf), None
        return codec.decode_record(raw)

    def check_closed(self) -> None:
        if self.buf is not None:
            raise PacketBodyError(f"a record's pieces stop at {len(self.buf)} of its "
                                  f"{self.total} bytes")


def _check_own_history(site: Site, h: Header) -> None:
    """Refuse a re-seed whose sender holds another op than ours under an epoch of our own
    that it covers (its ``tip``): our history forked after a restore, and the snapshot would
    put the family's version in place of ours, discarding the ops we wrote on the other
    branch (trimmed as covered) and leaving those above it chained to a history nobody
    else holds.  Ordinary rounds heal that and keep them (recovery.note_report)."""
    if h.tip is None:
        return
    me = site.site_id
    e, csn = h.tip
    # or the op set aside under it, when a peer's packet already named another there (the
    # re-seed would drop it as covered, and the writes below it with the changelog)
    ours = chain.op_id_at(site.conn, me, e) or stash.op_id_at(site.conn, me, e)
    if ours is not None and pack_csn(ours[0], me, ours[1]) != csn:
        raise SnapshotForkError(
            f"snapshot from {site.name_of(h.sender)} holds another op than this site's own as "
            f"its epoch {e}: this site was restored from a backup and then written to, and "
            f"the snapshot would discard those writes; nothing was changed")


def _check_claims(site: Site, h: Header, held: dict[bytes, int]) -> None:
    """Refuse a re-seed that claims more of another origin, or of this site's own, than that
    origin ever signed it holds: believed, it would stop this site from ever asking for those
    ops (or issuing its own), and no later snapshot could lower it again
    (``planning.unproven_claim``).  Called once the snapshot's roster is read, so every
    acknowledgement it carries is checked with its member's key first."""
    verify_acks(site, h, site.name_of(h.sender))
    proven = stored.own_epochs(site.conn)
    for m, _created, vec, _sig in resolved_acks(h):
        proven[m] = max(proven.get(m, 0), vec.get(m, 0))
    o = planning.unproven_claim(h.vector, held, proven, {h.sender})
    if o is not None:
        sender, name = site.name_of(h.sender), site.name_of(o)
        raise PacketBodyError(
            f"snapshot from {sender} claims epoch {h.vector[o]} of {name}, more than {name} "
            f"ever signed it holds ({max(proven.get(o, 0), held.get(o, 0))}); "
            f"nothing was changed",
            hint=f"the snapshot is forged, or {sender} lacks {name}'s acknowledgement: make it "
                 f"again after {name}'s packets reached {sender}, or at another member")


def _check_roster(site: Site, h: Header) -> None:
    """The records' roster must be the one the snapshot's signed header names: a new site is
    told the sender's key fingerprint from the records, and checks the signature with the
    header's key; two rosters would let a forger sign with one key and show another."""
    members = site.roster().values()
    ids = [m.site_id for m in members]
    if len(set(ids)) != len(ids):
        raise PacketBodyError("snapshot's roster gives one site id to two members; nothing "
                              "was changed", hint="the snapshot is damaged or forged")
    said = {m["name"]: (m["id"], m["ed25519"], m["x25519"]) for m in h.roster}
    held = {m.name: (m.site_id, m.ed25519, m.x25519) for m in members if not m.retired}
    if said != held:
        raise PacketBodyError("snapshot's records hold another roster than its signed header; "
                              "nothing was changed", hint="the snapshot is damaged or forged; "
                              "ask the sender for a new one")


def apply_snapshot(site: Site, pks: list[OpenPacket], progress=None) -> int:
    """Seed a new site (``mkreplica import``) or re-seed a member (hard resync) from the
    verified parts of one snapshot, in one transaction.

    A re-seed keeps every op we hold above the snapshot's vector (our own not-yet-acknowledged
    ops above all) and replays them on top in CSN order.  It is refused if it would roll state
    back: for an origin where the snapshot is behind us, every later op must still be in our
    changelog (``planning.snapshot_rollback``); so no vector is ever lowered and no epoch of
    ours can be issued twice."""
    first = pks[0].header
    snap = first.vector
    seeding = not site.joined
    expect(progress, sum(pk.header.count for pk in pks))
    c = site.conn
    try:
        # (a re-seed: keys of attached tables that come back as they were are no news)
        with site.write_txn(), nullcontext() if seeding else attached.replaced_whole(c):
            held = site.vector()
            if not seeding:
                _check_own_history(site, first)
            behind = planning.snapshot_rollback(snap, site.vector(), site.floors())
            if behind is not None:
                raise PacketBodyError(
                    f"snapshot from {site.name_of(first.sender)} is older than this site's "
                    f"state of {site.name_of(behind)} (it holds epoch {snap.get(behind, 0)}, "
                    f"this site {site.vector().get(behind, 0)} and no longer the ops between); "
                    f"applying it would roll changes back", hint="ask for a fresh snapshot "
                    "('syncpack resync') made after this site's last packets reached the sender")
            before = dict(site.roster()) if not seeding else {}
            # parts of a transaction still waiting for its last part stay held, not applied
            waiting = chain.incomplete(c)
            ranges = chain.held_ranges(c)
            kept = sorted((op for o, (_lo, hi, _n) in ranges.items()
                           for op in chain.iter_ops(c, o, snap.get(o, 0),
                                                    waiting[o][0] if o in waiting else hi)),
                          key=lambda op: (op.hlc, op.origin, op.seq))
            # Our own ops the snapshot covers stay in our changelog when we hold them all:
            # the sender may hold them only inside a snapshot of its own, and a peer that
            # lacks them can get them from no one but their origin.
            own = site.site_id if not seeding and planning.holds_through(
                site.floors().get(site.site_id, 0), ranges.get(site.site_id),
                snap.get(site.site_id, 0)) else None
            versions.clear(c)
            for o, e in snap.items():
                if o != own:
                    chain.trim(c, o, e)     # the snapshot holds their effect; kept ops stay
            n = 0
            history: list[tuple] = []
            joiner = RecordJoiner()
            for pk in pks:
                rows = []
                if pk.header.piece is not None:
                    whole = joiner.add(pk.header, codec.read_record_piece(
                        pk.f, pk.env, keys.unsealer(site.path)))
                    recs = [whole] if whole is not None else []
                else:
                    joiner.check_closed()
                    recs = codec.iter_records(pk.f, pk.env, keys.unsealer(site.path))
                for rec in recs:
                    if rec.collection == fields.HISTORY:
                        history.append(_history_row(site, rec, first))
                        continue
                    _check_record(site, rec, first, before)
                    rows.append((rec.collection, rec.key, rec.csn, rec.value))
                    if len(rows) >= APPLY_BATCH:
                        versions.insert_many(c, rows)
                        n += len(rows)
                        if progress:
                            progress(len(rows))
                        rows = []
                versions.insert_many(c, rows)
                n += len(rows)
                if progress and rows:
                    progress(len(rows))
                h = pk.header
                log.record_in(c, h.sender, h.packet_id, h.seq, h.part, h.kind, h.count,
                              str(pk.path), wall_ms(), again_ok=True)
            joiner.check_closed()
            stored.seed(c, snap, kept=own)
            fields.insert_history(c, history)
            # Our own set-aside ops the snapshot already covers are the family's (their effect
            # is in the snapshot); only those above it may still need re-issuing.  Not from a
            # fork of our history on: the family holds the other version of those epochs, and
            # ours (written after a restore) are still to be issued again.
            me = site.site_id
            forked = min((f.epoch for f in fork_store.all_forks(c) if f.origin == me),
                         default=None)
            stash.drop_through(c, me, snap.get(me, 0) if forked is None else
                               min(snap.get(me, 0), forked - 1))
            if seeding:
                site.set_meta("family_id", first.family)
                site.set_meta("joined", 1)
                site.joined, site.family_id = True, first.family
            site.invalidate()
            _check_roster(site, first)
            if seeding:
                verify_acks(site, first, site.name_of(first.sender))
            else:
                _check_claims(site, first, held)
            # what each origin signed it holds, so this site can prove what it re-seeds
            store_acknowledgements(site, resolved_acks(first))
            _check_members(site, [o for o, e in snap.items() if e], "snapshot")
            for op in kept:
                site.apply_version(op, op.csn)
            if forked is not None:
                _restash(site, snap.get(me, 0))
            for o, e in snap.items():
                top = max([op.epoch for op in kept if op.origin == o], default=e)
                if o in waiting and waiting[o][0] >= e:
                    top = max(top, waiting[o][1])       # the parts held above it
                stored.set_epoch(c, o, max(top, e))
            site.set_meta("hlc", max(int(site.meta("hlc", 0)), first.hlc_max))
            if seeding:
                fam = site.family_settings()
                site.set_meta("family_name", fam.get("name", ""))
                ensure_link(site, first.sender)
                stored.set_in_seq(c, first.sender, first.seq)
                raise_matrix(site, first.sender, "acked", snap)
            else:
                note_header(site, first, applied=True)
    except BaseException as e:
        if seeding:
            site.joined, site.family_id = False, None
        site.invalidate()
        if isinstance(e, db.IntegrityError):
            raise PacketBodyError("snapshot holds the same version twice; nothing was "
                                  "changed") from None
        raise
    site.invalidate()
    return n
