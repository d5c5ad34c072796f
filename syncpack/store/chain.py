"""Each origin's history as the store keeps it: signed blocks, plus our own not yet sealed ops.
Owns the tables ``blocks`` and ``changelog``.

Format v2 (formats/BLOCKS.md): an origin encodes, signs and hash-chains its ops into blocks
once; every other site keeps those blocks byte for byte (one row per block in ``blocks``) and
passes them on unchanged, so a relay can neither alter nor reorder another origin's ops.  The
per-op ``changelog`` table now holds only this site's own ops that are not sealed yet (small
transactions, gathered until the next export) and nothing of any other origin.

Sealing: a transaction of :data:`SEAL_AT_COMMIT` ops or more is sealed when it commits (its ops
never touch the changelog: a bulk load writes one row, not a million); smaller ones wait in the
changelog and are gathered into blocks of about :data:`BLOCK_OPS` ops when an export (or a
snapshot) needs them.  A block never cuts a transaction.

Everything here runs inside the caller's transaction on ``conn``; nothing commits.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from functools import partial
from itertools import accumulate
from typing import Callable, Iterable, Iterator

from syncpack.format import blocks
from syncpack.store import matrix, meta
from syncpack.format.blocks import ZERO_HASH, BlockInfo
from syncpack.format.codec import Op
from syncpack.format.csn import csn_hlc, csn_origin, csn_seq, split_csns

SEAL_AT_COMMIT = 1_000          # ops: a transaction this large becomes a block at commit
BLOCK_OPS = 10_000              # ops: pending small transactions are gathered up to this
BLOCK_RAW = 16 * 1024 * 1024    # bytes of keys and values: ... or this, whichever first
MAX_TXN_OPS = blocks.MAX_BLOCK_OPS
MAX_TXN_BYTES = blocks.MAX_BLOCK_RAW // 2   # keys and values of one transaction (with room
                                            # for the columns' own bytes in the block limit)

_OP_NEW = partial(tuple.__new__, Op)


@dataclass(frozen=True)
class StoredBlock:
    origin: bytes
    lo: int
    hi: int
    hlc_first: int
    hlc_last: int
    last_seq: int
    hash: bytes

    @property
    def last_csn(self) -> tuple[int, int]:
        return self.hlc_last, self.last_seq


_COLS = "origin, lo, hi, hlc_first, hlc_last, last_seq, hash"


def _stored(row) -> StoredBlock:
    return StoredBlock(*row)


# --- what is held ------------------------------------------------------------------------------

def top(conn, origin: bytes) -> StoredBlock | None:
    """The origin's block with the highest epochs we hold."""
    row = conn.execute(f"SELECT {_COLS} FROM blocks WHERE origin=? ORDER BY hi DESC LIMIT 1",
                       (origin,)).fetchone()
    return _stored(row) if row else None


def block_ending_at(conn, origin: bytes, epoch: int) -> StoredBlock | None:
    row = conn.execute(f"SELECT {_COLS} FROM blocks WHERE origin=? AND hi=?",
                       (origin, epoch)).fetchone()
    return _stored(row) if row else None


def expected_prev(conn, origin: bytes, lo: int) -> bytes | None:
    """What a block starting after epoch ``lo`` must name as its predecessor, if we can tell:
    the hash of our block of that origin ending at ``lo`` (zero at the origin's start)."""
    if lo == 0:
        return ZERO_HASH
    b = block_ending_at(conn, origin, lo)
    return b.hash if b else None


def covering(conn, origin: bytes, lo: int, hi: int) -> list[StoredBlock]:
    """Stored blocks that together hold epochs ``(lo, hi]`` of ``origin``, in epoch order:
    fewest blocks, each extending the cover (blocks of one origin may overlap after a
    re-seal).  Stops where the cover has a hole; the caller compares the reach with ``hi``."""
    rows = conn.execute(f"SELECT {_COLS} FROM blocks WHERE origin=? AND hi>? AND lo<? "
                        f"ORDER BY lo, hi DESC", (origin, lo, hi)).fetchall()
    out: list[StoredBlock] = []
    reach = lo
    best: StoredBlock | None = None
    for r in map(_stored, rows):
        if r.lo > reach:
            if best is None:
                break
            out.append(best)
            reach, best = best.hi, None
            if r.lo > reach or reach >= hi:
                break
        if r.hi > reach and (best is None or r.hi > best.hi):
            best = r
    if best is not None and reach < hi:
        out.append(best)
    return out


def tiling(conn, origin: bytes, lo: int, hi: int) -> list[StoredBlock] | None:
    """:func:`covering` when its blocks hold exactly epochs ``(lo, hi]``, each starting where
    the one before ends (the parts of one transaction, as sealed), else None."""
    out = covering(conn, origin, lo, hi)
    reach = lo
    for b in out:
        if b.lo != reach:
            return None
        reach = b.hi
    return out if reach == hi else None


def block_bytes(conn, b: StoredBlock) -> bytes:
    return conn.execute("SELECT data FROM blocks WHERE origin=? AND hi=? AND lo=?",
                        (b.origin, b.hi, b.lo)).fetchone()[0]


# The ops of the blocks decoded last, and an index of their epochs by (clock, seq), keyed by
# the block itself (its hash names its content): callers look up op after op in one block,
# and a cache keyed by the block's bytes read and hashed all of them for every look-up (an
# import where a peer's transaction replaced versions already gone took minutes).
_RECENT_BLOCKS = 2
_recent: dict[StoredBlock, tuple[list[Op], dict[tuple[int, int], int] | None]] = {}


def _recently_decoded(conn, b: StoredBlock
                      ) -> tuple[list[Op], dict[tuple[int, int], int] | None]:
    got = _recent.pop(b, None)
    if got is None:
        got = (list(blocks.decode_ops(block_bytes(conn, b))), None)
        while len(_recent) >= _RECENT_BLOCKS:
            del _recent[next(iter(_recent))]
    _recent[b] = got
    return got


def _block_ops(conn, b: StoredBlock) -> list[Op]:
    return _recently_decoded(conn, b)[0]


def _block_epochs(conn, b: StoredBlock) -> dict[tuple[int, int], int]:
    """{(hlc, seq): epoch} of the ops of block ``b``."""
    ops, index = _recently_decoded(conn, b)
    if index is None:
        index = {(op.hlc, op.seq): op.epoch for op in ops}
        _recent[b] = (ops, index)
    return index


def iter_ops(conn, origin: bytes, lo: int, hi: int) -> Iterator[Op]:
    """Ops of ``origin`` with epochs in ``(lo, hi]`` we hold, in epoch (= CSN) order: from
    its blocks, then from the changelog (our own unsealed ops).  Each epoch once."""
    nxt = lo + 1
    for b in covering(conn, origin, lo, hi):
        for op in blocks.decode_ops(block_bytes(conn, b)):
            if nxt <= op.epoch <= hi:
                nxt = op.epoch + 1
                yield op
    if nxt <= hi:
        cur = conn.execute(
            "SELECT origin, epoch, hlc, seq, collection, key, value, replaced FROM changelog "
            "WHERE origin=? AND epoch>=? AND epoch<=? ORDER BY epoch", (origin, nxt, hi))
        yield from map(_OP_NEW, cur)


def op_at(conn, origin: bytes, epoch: int) -> Op | None:
    """The op we hold as ``epoch`` of ``origin``, or None (looked up op after op, a block
    is decoded once: :func:`_block_ops`)."""
    row = conn.execute("SELECT origin, epoch, hlc, seq, collection, key, value, replaced "
                       "FROM changelog WHERE origin=? AND epoch=?", (origin, epoch)).fetchone()
    if row:
        return _OP_NEW(row)
    row = conn.execute(f"SELECT {_COLS} FROM blocks WHERE origin=? AND lo<? AND hi>=? "
                       f"LIMIT 1", (origin, epoch, epoch)).fetchone()
    if row is None:
        return None
    ops = _block_ops(conn, _stored(row))
    i = epoch - row[1] - 1
    return ops[i] if 0 <= i < len(ops) and ops[i].epoch == epoch else None


def replaced_of_many(conn, csns: Iterable[bytes]) -> dict[bytes, list[bytes]]:
    """The CSNs each of the ops ``csns`` superseded: {csn: its replaced} for each we hold.
    Each block that may hold one is decoded once: asked op by op, a capture of 8,000 keys
    whose peer records waited at a clash decoded a block per key (8.6 s against 0.6 s)."""
    wanted: dict[bytes, dict[tuple[int, int], bytes]] = {}
    for c in csns:
        wanted.setdefault(csn_origin(c), {})[csn_hlc(c), csn_seq(c)] = c
    out: dict[bytes, list[bytes]] = {}
    for origin, ids in wanted.items():
        for hlc, seq, _epoch, replaced in _held_near(conn, origin, ids):
            c = ids.get((hlc, seq))
            if c is not None and c not in out:
                out[c] = split_csns(replaced)
    return out


def values_of_many(conn, csns: Iterable[bytes]) -> dict[bytes, bytes | None]:
    """The values the ops ``csns`` wrote, of each we still hold (decoded a block at a time)."""
    ids = {(csn_hlc(c), csn_origin(c), csn_seq(c)): c for c in csns}
    out: dict[bytes, bytes | None] = {}
    for (hlc, origin, seq), epoch in epochs_of(conn, ids).items():
        op = op_at(conn, origin, epoch)
        if op is not None:
            out[ids[hlc, origin, seq]] = op.value
    return out


def op_id_at(conn, origin: bytes, epoch: int) -> tuple[int, int] | None:
    """``(hlc, seq)`` of the op we hold as ``epoch`` of ``origin``, or None."""
    row = conn.execute("SELECT hlc, seq FROM changelog WHERE origin=? AND epoch=?",
                       (origin, epoch)).fetchone()
    if row:
        return row[0], row[1]
    b = block_ending_at(conn, origin, epoch)
    if b:
        return b.last_csn       # no decoding: the common case (ranges start at a block's end)
    op = op_at(conn, origin, epoch)
    return None if op is None else (op.hlc, op.seq)


def epoch_of(conn, hlc: int, origin: bytes, seq: int) -> int | None:
    """The epoch of the op with CSN ``(hlc, origin, seq)`` if we hold it, else None."""
    e = _changelog_epoch_of(conn, hlc, origin, seq)
    if e is not None:
        return e
    for r in conn.execute(f"SELECT {_COLS} FROM blocks WHERE origin=? AND hlc_first<=? AND "
                          f"hlc_last>=?", (origin, hlc, hlc)).fetchall():
        b = _stored(r)
        if b.hlc_last == hlc and b.last_seq == seq:
            return b.hi
        if b.hlc_first == b.hlc_last:
            # One transaction, or a part of one (a block's clocks rise from one transaction
            # to the next): its seqs count up to last_seq, one per epoch, so no decoding.  A
            # large transaction sealed in parts for a small medium shares one clock over
            # hundreds of blocks, and each look-up decoded them all (a 300-op import: 37 s).
            first = b.last_seq - (b.hi - b.lo) + 1
            if first <= seq <= b.last_seq:
                return b.hi - (b.last_seq - seq)
            continue
        if b.hlc_last == hlc and seq > b.last_seq:
            continue
        e = _block_epochs(conn, b).get((hlc, seq))
        if e is not None:
            return e
    return None


def epochs_of(conn, ops: Iterable[tuple[int, bytes, int]]) -> dict[tuple[int, bytes, int], int]:
    """:func:`epoch_of` of many ops ``(hlc, origin, seq)`` at once: the epoch of each we hold.
    Each block that may hold one is decoded once: asked op by op, a scrub of a transaction of
    many deletes decoded its block once per tombstone (20,000 took 21 s)."""
    wanted: dict[bytes, set[tuple[int, int]]] = {}
    for hlc, origin, seq in ops:
        wanted.setdefault(origin, set()).add((hlc, seq))
    out: dict[tuple[int, bytes, int], int] = {}
    for origin, ids in wanted.items():
        for hlc, seq, epoch, _replaced in _held_near(conn, origin, ids):
            if (hlc, seq) in ids:
                out.setdefault((hlc, origin, seq), epoch)
    return out


def _held_near(conn, origin: bytes, ids: Iterable[tuple[int, int]]
               ) -> Iterator[tuple[int, int, int, bytes]]:
    """(hlc, seq, epoch, replaced) of the ops of ``origin`` we hold that may be among ``ids``
    (their (hlc, seq)): the changelog's within their clocks, then those of each block whose
    clock range holds one of them, each block decoded once."""
    hlcs = sorted({h for h, _s in ids})
    low, high = hlcs[0], hlcs[-1]
    yield from conn.execute("SELECT hlc, seq, epoch, replaced FROM changelog WHERE origin=? "
                            "AND hlc>=? AND hlc<=?", (origin, low, high))
    rows = conn.execute(f"SELECT {_COLS} FROM blocks WHERE origin=? AND hlc_first<=? AND "
                        f"hlc_last>=? ORDER BY lo", (origin, high, low)).fetchall()
    for b in map(_stored, rows):
        i = bisect_left(hlcs, b.hlc_first)
        if i == len(hlcs) or hlcs[i] > b.hlc_last:
            continue        # no op asked for falls in this block's clock range
        for op in blocks.decode_ops(block_bytes(conn, b)):
            yield op.hlc, op.seq, op.epoch, op.replaced


def _changelog_epoch_of(conn, hlc: int, origin: bytes, seq: int) -> int | None:
    # The changelog holds our own ops only, in consecutive epochs whose CSNs ascend with them:
    # bisect the epochs (no CSN index to keep up in every commit, see db.py migration 6).
    lo, hi = conn.execute(
        f"SELECT (SELECT {_IF_OWN} FROM changelog ORDER BY epoch LIMIT 1), "
        f"(SELECT {_IF_OWN} FROM changelog ORDER BY epoch DESC LIMIT 1)", (origin,)).fetchone()
    if lo is None:
        return None
    want = (hlc, seq)
    while lo <= hi:
        mid = (lo + hi) // 2
        row = conn.execute("SELECT hlc, seq FROM changelog WHERE origin=? AND epoch=?",
                           (origin, mid)).fetchone()
        if row is None:         # not consecutive after all: look at every row
            row = conn.execute("SELECT epoch FROM changelog WHERE origin=? AND hlc=? AND seq=?",
                               (origin, hlc, seq)).fetchone()
            return row[0] if row else None
        if row == want:
            return mid
        if row < want:
            lo = mid + 1
        else:
            hi = mid - 1
    return None


# The changelog is keyed by epoch alone (db.py, changelog_by_epoch): its first and last rows are
# found without a scan, and are ``origin``'s if any row is (it holds one origin's ops).
_IF_OWN = "CASE WHEN origin=?1 THEN epoch END"


def own_tip(conn, origin: bytes) -> tuple[int, int] | None:
    """``(epoch, hlc)`` of our newest unsealed op, or None.  A small transaction writes only
    its changelog rows (and versions): the vector's and meta's record of our own epoch and
    clock catch up when the changelog is emptied (:func:`settle_own`), so readers take the
    larger of both."""
    row = conn.execute("SELECT origin=?, epoch, hlc FROM changelog ORDER BY epoch DESC LIMIT 1",
                       (origin,)).fetchone()
    return row[1:] if row and row[0] else None


def own_position(conn, origin: bytes) -> tuple[int, int, str]:
    """What a local transaction starts from, in one statement (each costs a one-put
    transaction ~10% of its CPU time): our epoch held and clock (the larger of the vector's
    and meta's record and our newest unsealed op's, see :func:`own_tip`) and the site's
    recovery state (meta ``state``)."""
    epoch, hlc, state, tip_epoch, tip_hlc = conn.execute(
        "SELECT epoch, (SELECT value FROM meta WHERE key='hlc'), "
        "(SELECT value FROM meta WHERE key='state'), "
        f"(SELECT {_IF_OWN} FROM changelog ORDER BY epoch DESC LIMIT 1), "
        "(SELECT CASE WHEN origin=?1 THEN hlc END FROM changelog ORDER BY epoch DESC LIMIT 1) "
        "FROM vector WHERE origin=?1", (origin,)).fetchone()
    return (max(epoch, tip_epoch or 0), max(int(hlc or 0), tip_hlc or 0),
            state or "normal")


def settle_own(conn, origin: bytes) -> None:
    """Carry our newest unsealed op's epoch and clock into the vector and meta, before
    changelog rows go (sealed, trimmed or set aside)."""
    tip = own_tip(conn, origin)
    if tip is None:
        return
    matrix.raise_epoch(conn, origin, tip[0])
    meta.put(conn, "hlc", max(int(meta.get(conn, "hlc", 0)), tip[1]))


def held_ranges(conn) -> dict[bytes, tuple[int, int, int]]:
    """Per origin: (lowest epoch, highest epoch, count) of the ops we hold (fsck, status)."""
    out: dict[bytes, list[int]] = {}
    for o, lo, hi in conn.execute("SELECT origin, lo, hi FROM blocks ORDER BY origin, lo"):
        cur = out.setdefault(o, [lo + 1, hi, 0, 0])
        cur[0] = min(cur[0], lo + 1)
        cur[2] += max(0, hi - max(lo, cur[3]))
        cur[1] = max(cur[1], hi)
        cur[3] = max(cur[3], hi)
    for o, lo, hi, n in conn.execute("SELECT origin, min(epoch), max(epoch), count(*) FROM "
                                     "changelog GROUP BY origin"):
        cur = out.setdefault(o, [lo, hi, 0, 0])
        cur[0], cur[1], cur[2] = min(cur[0], lo), max(cur[1], hi), cur[2] + n
    return {o: (v[0], v[1], v[2]) for o, v in out.items()}


def count(conn) -> int:
    return sum(n for _lo, _hi, n in held_ranges(conn).values())


def iter_all(conn) -> Iterator[Op]:
    """Every op we hold that is applied, origin by origin (fsck's replay): the parts of a
    transaction still waiting for its last part are held, not applied."""
    waiting = incomplete(conn)
    for o, (lo, hi, _n) in sorted(held_ranges(conn).items()):
        yield from iter_ops(conn, o, lo - 1, waiting[o][0] if o in waiting else hi)


# --- writing -----------------------------------------------------------------------------------

def store_block(conn, info: BlockInfo, last_seq: int) -> None:
    """Keep a verified block (its ``block_hash`` filled in) as it arrived."""
    conn.execute("INSERT OR IGNORE INTO blocks(origin, lo, hi, hlc_first, hlc_last, last_seq, "
                 "hash, data) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                 (info.origin, info.lo, info.hi, info.hlc_first, info.hlc_last, last_seq,
                  info.block_hash, bytes(info.raw)))


def trim(conn, origin: bytes, floor: int) -> int:
    """Forget what is at or below ``floor``: unsealed ops, and blocks wholly below it (a block
    that straddles the floor stays whole; its older ops count as trimmed).  Returns ops gone."""
    n = 0
    for lo, hi in conn.execute("SELECT lo, hi FROM blocks WHERE origin=? AND hi<=?",
                               (origin, floor)).fetchall():
        n += hi - lo
    # The newest block's signed header stays: a fork at its epochs is still proved by it.
    conn.execute(
        "INSERT INTO trimmed_heads SELECT origin, lo, hi, substr(data, 1, ?) FROM blocks "
        "WHERE origin=?2 AND hi<=?3 ORDER BY hi DESC LIMIT 1 ON CONFLICT(origin) DO UPDATE "
        "SET lo=excluded.lo, hi=excluded.hi, header=excluded.header WHERE excluded.hi>hi",
        (blocks.HEADER_LEN, origin, floor))
    conn.execute("DELETE FROM blocks WHERE origin=? AND hi<=?", (origin, floor))
    settle_own(conn, origin)
    conn.execute("DELETE FROM changelog WHERE origin=? AND epoch<=?", (origin, floor))
    return n + conn.changes()


def take_all(conn, origin: bytes) -> list[Op]:
    """Remove and return every op of ``origin`` we hold (a restore's set-aside)."""
    # From the lowest epoch held, not from 0: below a trimmed history the cover has a hole
    # at its start, none of the ops were read, and all were deleted
    low = conn.execute("SELECT min(x) FROM (SELECT min(lo) AS x FROM blocks WHERE origin=?1 "
                       "UNION ALL SELECT min(epoch) - 1 FROM changelog WHERE origin=?1)",
                       (origin,)).fetchone()[0]
    ops = list(iter_ops(conn, origin, low or 0, (1 << 63) - 1))
    settle_own(conn, origin)
    conn.execute("DELETE FROM blocks WHERE origin=?", (origin,))
    conn.execute("DELETE FROM changelog WHERE origin=?", (origin,))
    return ops


def take_from(conn, origin: bytes, epoch: int) -> list[Op]:
    """Remove and return every op of ``origin`` from ``epoch`` on (a fork's set-aside: the
    history before it is the family's).  A block holding epochs on both sides goes whole; its
    ops below ``epoch`` stay, as unsealed ops (sealed again when next needed)."""
    row = conn.execute("SELECT min(lo) FROM blocks WHERE origin=? AND hi>=?",
                       (origin, epoch)).fetchone()
    cut = epoch - 1 if row[0] is None else min(row[0], epoch - 1)
    ops = list(iter_ops(conn, origin, cut, (1 << 63) - 1))
    settle_own(conn, origin)        # the clock must not go back with the ops set aside
    conn.execute("DELETE FROM blocks WHERE origin=? AND hi>?", (origin, cut))
    conn.execute("DELETE FROM changelog WHERE origin=? AND epoch>?", (origin, cut))
    keep = [op for op in ops if op.epoch < epoch]
    conn.executemany("INSERT INTO changelog VALUES (?, ?, ?, ?, ?, ?, ?, ?)", keep)
    return [op for op in ops if op.epoch >= epoch]


def _txns(ops: Iterable[Op]) -> Iterator[list[Op]]:
    txn: list[Op] = []
    for op in ops:
        if op.seq == 0 and txn:
            yield txn
            txn = []
        txn.append(op)
    if txn:
        yield txn


def _op_bytes(op: Op) -> int:
    return len(op.key) + len(op.value or b"") + len(op.collection) + len(op.replaced) + 8


def _txns_with_bytes(ops: list[Op]) -> Iterator[tuple[list[Op], int]]:
    """:func:`_txns`, each with the sum of its ops' :func:`_op_bytes`, computed over whole
    columns (a bulk load's transaction is 100,000 ops)."""
    if not ops:
        return
    _o, _e, _h, seqs, colls, keys, values, reps = zip(*ops)
    starts = [i for i, q in enumerate(seqs) if q == 0 and i]
    if not starts:      # one transaction (a load's): plain sums, no size per op
        yield ops, (sum(map(len, colls)) + sum(map(len, keys)) + sum(map(len, reps))
                    + sum(map(len, filter(None, values))) + 8 * len(ops))
        return
    sizes = list(accumulate(map(sum, zip(map(len, colls), map(len, keys), map(len, reps),
                                         map(len, map(_or_empty, values)))), initial=0))
    for a, b in zip([0, *starts], [*starts, len(ops)]):
        yield ops[a:b], sizes[b] - sizes[a] + 8 * (b - a)


def _or_empty(value: bytes | None) -> bytes:
    return value or b""


def seal(conn, family: bytes, origin: bytes, ops: list[Op], sign: Callable[[bytes], bytes],
         max_block: int | None = None, more: bool = False) -> list[StoredBlock]:
    """Seal our own ``ops`` (whole transactions, consecutive epochs continuing what we hold)
    into blocks and store them; chained to our block ending just below, else a chain root.
    ``max_block`` bounds a block's bytes where whole transactions allow (an export's
    --max-size: packets are cut between blocks only).  With ``more``, ``ops`` are a part of
    one transaction that continues (formats/BLOCKS.md section 4.2)."""
    out: list[StoredBlock] = []
    prev = [expected_prev(conn, origin, ops[0].epoch - 1) if ops else None]
    raw_cap = BLOCK_RAW if max_block is None else max(1, min(BLOCK_RAW, max_block - 2048))

    def put(group: list[Op], more: bool) -> None:
        raw = blocks.encode_block(family, origin, prev[0] or ZERO_HASH, group, sign, more=more)
        if max_block is not None and len(raw) > max_block:
            # Compression guessed wrong: whole transactions split between them, else the
            # transaction (or this part of it) is cut into two parts.  One op alone larger
            # than the limit stays whole; the export then names it.
            txns = list(_txns(group)) if group[0].seq == 0 and not more else []
            if len(txns) > 1:
                half = len(txns) // 2
                put([op for t in txns[:half] for op in t], False)
                put([op for t in txns[half:] for op in t], False)
                return
            if len(group) > 1:
                half = len(group) // 2
                put(group[:half], True)
                put(group[half:], more)
                return
        info = blocks.read_block_header(raw, family)
        store_block(conn, info, group[-1].seq)
        out.append(StoredBlock(origin, info.lo, info.hi, info.hlc_first, info.hlc_last,
                               group[-1].seq, info.block_hash))
        prev[0] = info.block_hash

    def emit(txns: list[list[Op]]) -> None:
        if max_block is not None and len(txns) == 1 and sum(map(_op_bytes, txns[0])) > raw_cap:
            # A transaction larger than the medium allows travels as parts, each its
            # origin's signed block (formats/BLOCKS.md section 4.2); the importer applies it
            # when the last part is there.
            part: list[Op] = []
            size = 0
            for op in txns[0]:
                ob = _op_bytes(op)
                if part and size + ob > raw_cap:
                    put(part, True)
                    part, size = [], 0
                part.append(op)
                size += ob
            put(part, more)
            return
        put([op for t in txns for op in t], more)

    txns: list[list[Op]] = []
    n = size = 0
    for txn, tb in _txns_with_bytes(ops):
        if txns and (n + len(txn) > BLOCK_OPS or size + tb > raw_cap):
            emit(txns)
            txns, n, size = [], 0, 0
        txns.append(txn)
        n += len(txn)
        size += tb
    if txns:
        emit(txns)
    return out


def seal_columns(conn, family: bytes, origin: bytes, sign: Callable[[bytes], bytes], lo: int,
                 hlc: int, first_seq: int,
                 chunks: list[tuple[str, list[str], list[bytes | None], list[bytes] | None]],
                 more: bool) -> StoredBlock:
    """Seal the ops of one transaction of ours that a bulk writer holds as columns (chunks of
    (collection, keys, values, replaced or None)), epochs from ``lo + 1`` and seqs from
    ``first_seq``, as one block chained to our block ending at ``lo``: a whole transaction, or
    one of its parts (``more``: it continues; formats/BLOCKS.md section 4.2)."""
    keys: list[str] = []
    values: list[bytes | None] = []
    rep_at: list[int] = []
    rep: list[bytes] = []
    for _coll, ks, vs, reps in chunks:
        if reps is not None:
            base = len(keys)
            at = [i for i, r in enumerate(reps) if r]
            rep_at.extend(base + i for i in at)
            rep.extend(reps[i] for i in at)
        keys.extend(ks)
        values.extend(vs)
    prev = expected_prev(conn, origin, lo) or ZERO_HASH
    raw = blocks.encode_columns(family, origin, prev, lo, hlc, first_seq,
                                [(c, len(ks)) for c, ks, _v, _r in chunks], keys, values,
                                rep_at, rep, sign, more)
    info = blocks.read_block_header(raw, family)
    last_seq = first_seq + len(keys) - 1
    store_block(conn, info, last_seq)
    return StoredBlock(origin, info.lo, info.hi, info.hlc_first, info.hlc_last, last_seq,
                       info.block_hash)


def seal_pending(conn, family: bytes, origin: bytes, sign: Callable[[bytes], bytes],
                 max_block: int | None = None) -> int:
    """Seal every unsealed op of ours; returns how many.  The caller holds a write
    transaction."""
    ops = list(map(_OP_NEW, conn.execute(
        "SELECT origin, epoch, hlc, seq, collection, key, value, replaced FROM changelog "
        "WHERE origin=? ORDER BY epoch", (origin,))))
    if not ops:
        return 0
    seal(conn, family, origin, ops, sign, max_block)
    settle_own(conn, origin)
    conn.execute("DELETE FROM changelog WHERE origin=?", (origin,))
    return len(ops)


def reseal_oversized(conn, family: bytes, origin: bytes, sign: Callable[[bytes], bytes],
                     above: int, max_block: int) -> int:
    """Our own blocks larger than ``above`` (a transaction sealed at commit, before an export
    to a small medium asked for less) are sealed again into blocks of at most ``max_block``,
    with every later block of ours so the chain stays one: transactions too large become
    parts.  Peers that hold the old
    blocks take the new ones as a re-sealed chain (formats/BLOCKS.md section 5).  Returns the
    ops sealed again."""
    # A block of one op cannot be cut: it travels in pieces (formats/PACKET.md section 6.4).
    row = conn.execute("SELECT lo, hi, data FROM blocks WHERE origin=? AND length(data)>? "
                       "AND hi-lo>1 ORDER BY lo LIMIT 1", (origin, above)).fetchone()
    if row is None:
        return 0
    lo = row[0]
    first = blocks.read_block_header(row[2])
    if first.cont:
        # start where the transaction does, at the block holding its first op
        lo -= blocks.decode_block(first).first_seq
        b = conn.execute("SELECT lo FROM blocks WHERE origin=? AND lo<=? AND hi>? ORDER BY lo "
                         "DESC LIMIT 1", (origin, lo, lo)).fetchone()
        lo = b[0] if b else lo
    top_ = conn.execute("SELECT max(hi) FROM blocks WHERE origin=?", (origin,)).fetchone()[0]
    pending = conn.execute(f"SELECT {_IF_OWN} FROM changelog ORDER BY epoch DESC LIMIT 1",
                           (origin,)).fetchone()
    pending = pending[0] if pending else None
    hi = max(top_ or 0, pending or 0)
    ops = list(iter_ops(conn, origin, lo, hi))
    if not ops or ops[0].seq != 0:
        return 0        # we no longer hold the transaction's start: leave the chain as it is
    conn.execute("DELETE FROM blocks WHERE origin=? AND hi>?", (origin, lo))
    conn.execute("DELETE FROM changelog WHERE origin=? AND epoch>?", (origin, lo))
    seal(conn, family, origin, ops, sign, max_block)
    return len(ops)


def has_oversized(conn, origin: bytes, max_block: int) -> bool:
    return conn.execute("SELECT 1 FROM blocks WHERE origin=? AND length(data)>? AND hi-lo>1 "
                        "LIMIT 1", (origin, max_block)).fetchone() is not None


def incomplete(conn) -> dict[bytes, tuple[int, int, int]]:
    """Per origin, a transaction whose parts we hold only in part: (epoch before its first
    op, the last epoch held, the parts held).  Parts arrive in epoch order, so such a
    transaction is always the top of what we hold of its origin.  Only the flags byte of each
    block looked at is read (a block may be hundreds of megabytes)."""
    out: dict[bytes, tuple[int, int, int]] = {}
    for rowid, origin, lo, hi in conn.execute(
            "SELECT rowid, origin, lo, max(hi) FROM blocks GROUP BY origin").fetchall():
        if not _flags(conn, rowid) & blocks.FLAG_MORE:
            continue
        start, n = lo, 1
        while True:
            b = conn.execute("SELECT rowid, lo FROM blocks WHERE origin=? AND hi=?",
                             (origin, start)).fetchone()
            if b is None or not _flags(conn, b[0]) & blocks.FLAG_MORE:
                break
            start, n = b[1], n + 1
        out[origin] = (start, hi, n)
    return out


def _flags(conn, rowid: int) -> int:
    with conn.blob_open("main", "blocks", "data", rowid, False) as blob:
        return blocks.read_block_header_flags(blob.read(6))


def applied_vector(conn, vec: dict[bytes, int]) -> dict[bytes, int]:
    """``vec`` (epochs held) wound back to the transactions applied: a snapshot's records hold
    no part of a transaction still waiting for its last part, so its vector must not claim it."""
    out = dict(vec)
    for o, (lo, _hi, _n) in incomplete(conn).items():
        if o in out:
            out[o] = min(out[o], lo)
    return out


def has_pending(conn, origin: bytes) -> bool:
    return conn.execute("SELECT 1 FROM changelog WHERE origin=? LIMIT 1",
                        (origin,)).fetchone() is not None


def count_range(conn, origin: bytes, lo: int, hi: int) -> int:
    """How many ops of ``origin`` in ``(lo, hi]`` we hold."""
    n = 0
    reach = lo
    for b in covering(conn, origin, lo, hi):
        n += max(0, min(hi, b.hi) - max(reach, b.lo))
        reach = max(reach, b.hi)
    row = conn.execute("SELECT count(*) FROM changelog WHERE origin=? AND epoch>? AND epoch<=?",
                       (origin, max(lo, reach), hi)).fetchone()
    return n + row[0]


def first_epoch_since(conn, origin: bytes, lo: int, hi: int, hlc: int) -> int | None:
    """The lowest epoch in ``(lo, hi]`` we hold whose op was written at clock ``hlc`` or
    later (scrub keeps young ops), or None."""
    for b in covering(conn, origin, lo, hi):
        if b.hlc_last < hlc:
            continue
        for op in _block_ops(conn, b):
            if lo < op.epoch <= hi and op.hlc >= hlc:
                return op.epoch
    row = conn.execute("SELECT min(epoch) FROM changelog WHERE origin=? AND epoch>? AND "
                       "epoch<=? AND hlc>=?", (origin, lo, hi, hlc)).fetchone()
    return row[0]


def append_ops(conn, ops: list[Op]) -> None:
    """Append our own ops to the changelog (sealed later)."""
    # an Op's fields are the table's columns, in order
    conn.executemany("INSERT INTO changelog VALUES (?, ?, ?, ?, ?, ?, ?, ?)", ops)


def max_hlc(conn) -> int:
    """The highest clock of any op held, in the changelog or in a block (0 if none)."""
    return max(conn.execute("SELECT max(hlc) FROM changelog").fetchone()[0] or 0,
               conn.execute("SELECT max(hlc_last) FROM blocks").fetchone()[0] or 0)


def block_rows(conn) -> Iterator[tuple[bytes, int, int, bytes]]:
    """(origin, lo, hi, data) of every stored block, in (origin, hi) order."""
    return conn.execute("SELECT origin, lo, hi, data FROM blocks ORDER BY origin, hi")
