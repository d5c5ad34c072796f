"""Change blocks (format 2): a run of whole transactions of one origin, encoded once by
that origin, signed by it and hash-chained to its previous block.

A block is self-describing and self-delimiting: a fixed 186-byte header (everything a relay or
a planner needs, readable without touching the body), then one zstd frame holding the ops as
columns.  Relays pass blocks on byte for byte; any reader verifies a block against its origin's
Ed25519 key, whoever handed it over.  The byte layout is specified in ``formats/BLOCKS.md``;
``formats/vectors/v2-block-*`` are its golden vectors (``tools/make_block_vectors.py``).

Everything here is pure apart from the signature check; ``sign`` is a callable the caller
provides (``Ed25519PrivateKey.sign``), so no key material passes through this module.

Reading is for untrusted input: every size is bounded before anything is allocated, the
decompressor's output is bounded by the signed ``raw_len``, and every failure is a
:class:`syncpack.errors.PacketError` subclass whose message names the origin when the header
could be read.  Update packets carry blocks (``formats/PACKET.md``) and the store keeps them
(:mod:`syncpack.store.chain`).
"""

from __future__ import annotations

import dataclasses
import gc
from bisect import bisect_right
import hashlib
import struct
import threading
from dataclasses import dataclass, field
from contextlib import contextmanager
from itertools import accumulate, chain, groupby, islice, repeat
from operator import itemgetter
from typing import Callable, Iterable, Iterator, NamedTuple

from syncpack.format import codec
from syncpack.format.codec import MAX_VALUE_BYTES, ZSTD_MAX_WINDOW, Op
from syncpack.format.csn import CSN_LEN, CSN_STRUCT, SITE_ID_LEN, split_csns
from syncpack.errors import (EpochCollisionError, PacketBodyError, PacketLimitError,
                     PacketSignatureError, PacketVersionError)

# --- constants (formats/BLOCKS.md section 3) ---------------------------------------------------

MAGIC = b"SPKB"
VERSION = 2
FAMILY_LEN = 16
HASH_LEN = 32
SIG_LEN = 64
ZERO_HASH = bytes(HASH_LEN)
SIGNING_CONTEXT = b"syncpack block signature v2\x00"

# magic, version, flags, origin, lo, hi, txns, hlc_first, hlc_last, prev_hash, body_hash,
# raw_len, body_len -- then the signature.  Fixed width so a relay reads it with one unpack.
_FIXED = struct.Struct(">4sBB8sQQIQQ32s32sII")
SIGNED_LEN = _FIXED.size                  # 122: the header bytes the signature covers
HEADER_LEN = SIGNED_LEN + SIG_LEN         # 186: the body starts here

MAX_BLOCK_OPS = 1 << 20                   # ops (= epochs) in one block
MAX_BLOCK_RAW = 256 * 1024 * 1024         # decompressed body; bounds the one allocation
MAX_BLOCK_BODY = MAX_BLOCK_RAW + (MAX_BLOCK_RAW >> 7) + 1024   # zstd's worst-case expansion
MAX_STR_BYTES = codec.MAX_STR_BYTES      # a key or collection name
HLC_LIMIT = 1 << 63                       # clocks and epochs are SQLite INTEGERs (signed 64)
SEQ_LIMIT = 1 << 32                       # seq is the u32 at the end of a CSN
N_COLUMNS = 9

# Flags (header byte 5).  A transaction larger than a medium allows travels as several blocks,
# its parts, each signed by the origin: MORE says the block's one transaction continues in the
# origin's next block, CONT that it began in the previous one (the body then has a tenth
# element, the seq of its first op).  Whole-transaction blocks keep flags 0, so every block
# written before parts existed reads as before.  A relay cuts packets between blocks only, so
# part boundaries are always the origin's.
FLAG_MORE = 0x01
FLAG_CONT = 0x02
KNOWN_FLAGS = FLAG_MORE | FLAG_CONT

# The writers' zstd setting is codec's (the one module that sets msgpack and zstd options).
ZSTD_LEVEL = codec.ZSTD_LEVEL
_ZSTD_MAGIC = codec.ZSTD_MAGIC

_HLC_ORIGIN = struct.Struct(">Q8s")
_CSN_PACK = CSN_STRUCT.pack
_tuple_new = tuple.__new__       # the first 16 bytes of every CSN of a transaction


def __getattr__(name: str):
    if name == "ZSTD_PARAMS":      # codec's, made on first use (zstandard loads lazily)
        return codec.BLOCK_ZSTD_PARAMS
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# --- errors ------------------------------------------------------------------------------------

def _who(origin: bytes | None, lo: int | None = None, hi: int | None = None) -> str:
    if origin is None:
        return "block"
    if lo is None:
        return f"block of origin {origin.hex()}"
    return f"block of origin {origin.hex()} (epochs {lo + 1}..{hi})"


class BlockError(PacketBodyError):
    """A block is malformed, damaged or does not match its own header."""

    default_hint = "the block is damaged or forged; get a fresh copy from its origin or a peer"

    def __init__(self, message: str, origin: bytes | None = None, lo: int | None = None,
                 hi: int | None = None):
        super().__init__(f"{_who(origin, lo, hi)}: {message}")
        self.origin = origin


class BlockLimitError(BlockError, PacketLimitError):
    """The block asks for more than an untrusted input may (ops, bytes, window)."""


class BlockVersionError(BlockError, PacketVersionError):
    default_hint = "upgrade syncpack at this site to read blocks made by a newer version"


class BlockSignatureError(PacketSignatureError):
    """The origin's key does not verify the block: altered, spliced or not made by it."""

    default_hint = ("a relay or carrier altered the block, or it was not made by its origin; "
                    "get a fresh copy")

    def __init__(self, message: str, origin: bytes | None = None, lo: int | None = None,
                 hi: int | None = None):
        super().__init__(f"{_who(origin, lo, hi)}: {message}")
        self.origin = origin


class BlockChainError(BlockError, EpochCollisionError):
    """A correctly signed block does not continue the chain we hold: its origin forked its
    history (restored from a backup and wrote again) or reused an epoch."""

    default_hint = ("the origin reused epochs (restored from a backup without 'syncpack "
                    "restore'?); nothing was applied")


class BlockEncodeError(ValueError):
    """encode_block was given ops that cannot form one block (a caller's bug, not input)."""


# --- header ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class BlockInfo:
    """The header of one block, read without decompressing its body."""
    origin: bytes
    lo: int                   # the block holds epochs lo+1 ..= hi
    hi: int
    txns: int
    hlc_first: int
    hlc_last: int
    prev_hash: bytes
    body_hash: bytes
    raw_len: int
    body_len: int
    signature: bytes
    block_hash: bytes | None = field(repr=False)   # None unless the family was given
    header: bytes = field(repr=False)       # the 122 signed header bytes
    raw: bytes | memoryview = field(repr=False, compare=False)   # the whole block
    body_checked: bool = field(default=False, repr=False, compare=False)  # by verify_block
    flags: int = 0

    @property
    def more(self) -> bool:
        """The block's transaction continues in the origin's next block (a part, not the last)."""
        return bool(self.flags & FLAG_MORE)

    @property
    def cont(self) -> bool:
        """The block's transaction began in the origin's previous block (a later part)."""
        return bool(self.flags & FLAG_CONT)

    @property
    def count(self) -> int:
        return self.hi - self.lo

    @property
    def size(self) -> int:
        return HEADER_LEN + self.body_len

    @property
    def body(self) -> memoryview:
        # a view, not a copy: a block may be hundreds of megabytes, and an import holds it
        return memoryview(self.raw)[HEADER_LEN:HEADER_LEN + self.body_len]


def signed_bytes(family: bytes, header: bytes) -> bytes:
    """What the origin signs: a context string, the family, and the 122 header bytes (which
    hold origin, lo, hi, the clock range, prev_hash and the hash of the body as stored)."""
    return SIGNING_CONTEXT + family + header


def block_hash(family: bytes, header: bytes) -> bytes:
    """The chain link: BLAKE2b-256 of the signed message.  It commits to the body through
    body_hash and to the whole past through prev_hash, and not to the signature bytes (a
    different valid signature over the same block is the same block)."""
    return hashlib.blake2b(signed_bytes(family, header), digest_size=HASH_LEN).digest()


def read_block_header(raw: bytes | memoryview, family: bytes | None = None,
                      exact: bool = True, header_only: bool = False) -> BlockInfo:
    """Parse and sanity-check the fixed header; the body is neither hashed nor decoded.

    ``exact``: ``raw`` must be exactly one block (else it may continue with further blocks, see
    :func:`iter_blocks`).  ``family`` fills in ``block_hash`` (None without it).
    ``header_only``: ``raw`` is the signed header alone (:data:`HEADER_LEN` bytes, as fork
    evidence carries it), without the body."""
    if isinstance(raw, bytearray):
        raw = bytes(raw)
    if not isinstance(raw, (bytes, memoryview)):
        raise TypeError("a block is bytes")
    n = len(raw)
    # Name the origin the bytes claim in every error once they hold one, so an operator
    # learns whose block was damaged even when the damage is in the first bytes.
    claimed = bytes(raw[6:14]) if n >= 14 else None
    if n >= 4 and bytes(raw[:4]) != MAGIC:
        raise BlockError("not a syncpack block (bad magic)", claimed)
    if n < HEADER_LEN:
        raise BlockError(f"{n} bytes, too short for a block header ({HEADER_LEN})", claimed)
    header = bytes(raw[:SIGNED_LEN])
    (magic, version, flags, origin, lo, hi, txns, hlc_first, hlc_last, prev_hash, body_hash_,
     raw_len, body_len) = _FIXED.unpack(header)
    if version != VERSION:
        raise BlockVersionError(f"block format version {version} is not {VERSION}", origin)
    if flags & ~KNOWN_FLAGS:
        raise BlockVersionError(f"unknown block flags {flags:#04x}", origin)
    if not lo < hi < HLC_LIMIT:
        raise BlockError(f"bad epoch range ({lo}, {hi}]", origin)
    if hi - lo > MAX_BLOCK_OPS:
        raise BlockLimitError(f"{hi - lo} ops exceed the limit of {MAX_BLOCK_OPS}", origin, lo, hi)
    if not 1 <= txns <= hi - lo:
        raise BlockError(f"{txns} transactions for {hi - lo} ops", origin, lo, hi)
    if flags and txns != 1:
        raise BlockError(f"a part of a transaction holds that one transaction, not {txns}",
                         origin, lo, hi)
    # hlcs of one origin strictly ascend from transaction to transaction
    if not (hlc_first <= hlc_last < HLC_LIMIT and hlc_last - hlc_first >= txns - 1
            and (txns > 1 or hlc_first == hlc_last)):
        raise BlockError("bad clock range", origin, lo, hi)
    if lo == 0 and prev_hash != ZERO_HASH:
        raise BlockError("the first block of an origin has no predecessor", origin, lo, hi)
    if raw_len > MAX_BLOCK_RAW:
        raise BlockLimitError(f"body of {raw_len} bytes decompressed exceeds the limit of "
                              f"{MAX_BLOCK_RAW}", origin, lo, hi)
    if body_len > MAX_BLOCK_BODY:
        raise BlockLimitError(f"body of {body_len} bytes exceeds the limit", origin, lo, hi)
    end = HEADER_LEN + body_len
    if header_only:
        if n != HEADER_LEN:
            raise BlockError(f"{n} bytes, not a signed block header ({HEADER_LEN})", origin)
        end = n
    if n < end:
        raise BlockError(f"truncated: {n} bytes of {end}", origin, lo, hi)
    if exact and n != end:
        raise BlockError(f"{n - end} bytes after the end of the block", origin, lo, hi)
    raw_ = raw if n == end else raw[:end]
    return BlockInfo(origin, lo, hi, txns, hlc_first, hlc_last, prev_hash, body_hash_, raw_len,
                     body_len, bytes(raw[SIGNED_LEN:HEADER_LEN]),
                     block_hash(family, header) if family is not None else None,
                     header, raw_, flags=flags)


def read_block_header_flags(head: bytes | memoryview) -> int:
    """The flags byte of a block's header, for a store that lists parts without decoding."""
    return head[5] if len(head) > 5 else 0


def iter_blocks(data: bytes | memoryview, family: bytes | None = None) -> Iterator[BlockInfo]:
    """Headers of a concatenation of blocks (as a relay or a packet body holds them)."""
    mv = memoryview(data)
    off = 0
    while off < len(mv):
        info = read_block_header(mv[off:], family, exact=False)
        off += info.size
        yield info


# --- verification ------------------------------------------------------------------------------

def verify_block(block: bytes | memoryview | BlockInfo, public_key: bytes, family: bytes,
                 expected_prev: bytes | None) -> BlockInfo:
    """Check a block in this order: header, origin's signature, body hash, then the chain.

    ``expected_prev``: the block_hash of the block this reader holds that ends at epoch ``lo``
    of the origin (``ZERO_HASH`` when lo is 0), or None when it holds none (the chain cannot be
    checked there).  The chain is checked last, so a :class:`BlockChainError` is the origin's
    own signed word that its history forked, never a relay's tampering.  Returns the header
    with ``block_hash`` filled in.  The body is not decoded (see :func:`decode_block`)."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    if len(family) != FAMILY_LEN:
        raise ValueError("a family id is 16 bytes")
    info = block if isinstance(block, BlockInfo) else read_block_header(block)
    who = (info.origin, info.lo, info.hi)
    try:
        Ed25519PublicKey.from_public_bytes(public_key).verify(
            info.signature, signed_bytes(family, info.header))
    except (InvalidSignature, ValueError):
        raise BlockSignatureError("signature does not verify with the origin's key",
                                  *who) from None
    if hashlib.blake2b(info.body, digest_size=HASH_LEN).digest() != info.body_hash:
        raise BlockError("body does not match its signed hash", *who)
    bh = block_hash(family, info.header)
    if expected_prev is not None and info.prev_hash != expected_prev:
        raise BlockChainError(
            f"does not continue the chain held here at epoch {info.lo} (prev "
            f"{info.prev_hash.hex()[:16]}…, held {expected_prev.hex()[:16]}…): the origin "
            f"forked its history or reused an epoch", *who)
    return dataclasses.replace(info, block_hash=bh, body_checked=True)


def header_signed_by(info: BlockInfo, public_key: bytes, family: bytes) -> bool:
    """Whether the origin's key signed this header (the body is not needed: fork evidence)."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    try:
        Ed25519PublicKey.from_public_bytes(public_key).verify(
            info.signature, signed_bytes(family, info.header))
    except (InvalidSignature, ValueError):
        return False
    return True


# --- encoding ----------------------------------------------------------------------------------

def _csn_ok(replaced: bytes) -> bool:
    # whole CSNs, each clock below 2**63 (SQLite's signed INTEGER)
    return not (len(replaced) % CSN_LEN or any(b >= 0x80 for b in replaced[::CSN_LEN]))


def _csns_ok(column: list[bytes]) -> bool:
    """:func:`_csn_ok` of each of a column's non-empty entries; one CSN each (updates, the
    common case) checked without a Python call per entry."""
    if column and set(map(len, column)) == {CSN_LEN}:
        return max(map(_FIRST_BYTE, column)) < 0x80
    return all(r and _csn_ok(r) for r in column)


_FIRST_BYTE = itemgetter(0)


def _columns_checked(origin: bytes, lo: int, ops: list[Op], flags: int = 0) -> tuple:
    """The block's columns from its ops, checking each op and saying which is wrong.  With
    ``flags`` the ops are one part of a transaction (formats/BLOCKS.md section 4.2)."""
    txn_lens: list[int] = []
    hlcs: list[int] = []
    names: dict[str, int] = {}
    run_coll: list[int] = []
    run_len: list[int] = []
    rep_at: list[int] = []
    rep: list[bytes] = []
    prev_hlc = -1
    cur = -1
    first_seq = ops[0].seq
    if flags:
        if not (0 <= first_seq < SEQ_LIMIT and 0 <= ops[0].hlc < HLC_LIMIT) \
                or any(op.hlc != ops[0].hlc for op in ops):
            raise BlockEncodeError("a part holds the ops of one transaction")
        txn_lens.append(0)
        hlcs.append(ops[0].hlc)
        prev_hlc = ops[0].hlc
    for i, op in enumerate(ops):
        if op.origin != origin:
            raise BlockEncodeError(f"op {i} is of origin {op.origin.hex()}, the block's is "
                                   f"{origin.hex()}")
        if op.epoch != lo + 1 + i:
            raise BlockEncodeError(f"op {i} has epoch {op.epoch}, expected {lo + 1 + i}: "
                                   f"epochs must be consecutive")
        if op.seq == 0 and not (flags and i == 0):
            if not prev_hlc < op.hlc < HLC_LIMIT:
                raise BlockEncodeError(f"op {i} (epoch {op.epoch}) starts a transaction whose "
                                       f"hlc {op.hlc} does not ascend past {prev_hlc}")
            txn_lens.append(1)
            hlcs.append(op.hlc)
            prev_hlc = op.hlc
        else:
            if not txn_lens:
                raise BlockEncodeError("the first op must start a transaction (seq 0): a "
                                       "block holds whole transactions")
            if op.hlc != prev_hlc or op.seq != first_seq * (len(txn_lens) == 1) + txn_lens[-1] \
                    or op.seq >= SEQ_LIMIT:
                raise BlockEncodeError(f"op {i} (epoch {op.epoch}) does not continue its "
                                       f"transaction (hlc {op.hlc}, seq {op.seq})")
            txn_lens[-1] += 1
        if type(op.collection) is not str or type(op.key) is not str:
            raise BlockEncodeError(f"op {i}: collection and key are str")
        if op.value is not None and (type(op.value) is not bytes
                                     or len(op.value) > MAX_VALUE_BYTES):
            raise BlockEncodeError(f"op {i}: value is None or bytes of at most "
                                   f"{MAX_VALUE_BYTES}")
        if type(op.replaced) is not bytes or not _csn_ok(op.replaced):
            raise BlockEncodeError(f"op {i}: replaced must be whole CSNs")
        c = names.setdefault(op.collection, len(names))
        if c == cur:
            run_len[-1] += 1
        else:
            run_coll.append(c)
            run_len.append(1)
            cur = c
        if op.replaced:
            rep_at.append(i)
            rep.append(op.replaced)
    if flags and len(txn_lens) != 1:
        raise BlockEncodeError("a part holds the ops of one transaction")
    return txn_lens, hlcs, names, run_coll, run_len, rep_at, rep


def _columns_fast(origin: bytes, lo: int, ops: list[Op]) -> tuple | None:
    """What :func:`_columns_checked` returns, or None where it would raise: the same checks
    over whole columns in C (zip, map, set), about 4x faster on a big local transaction."""
    n = len(ops)
    origins, epochs, op_hlcs, seqs, colls, keys_, values, replaced = zip(*ops)
    if set(origins) != {origin} or epochs != tuple(range(lo + 1, lo + 1 + n)):
        return None
    if not (set(map(type, colls)) <= {str} and set(map(type, keys_)) <= {str}
            and set(map(type, values)) <= {bytes, type(None)}
            and set(map(type, replaced)) == {bytes} and set(map(type, seqs)) == {int}
            and set(map(type, op_hlcs)) == {int}):
        return None
    if values and max(map(len, filter(None, values)), default=0) > MAX_VALUE_BYTES:
        return None
    starts = [i for i, q in enumerate(seqs) if q == 0]
    if not starts or starts[0] != 0:
        return None
    ends = starts[1:] + [n]
    txn_lens = [b - a for a, b in zip(starts, ends)]
    hlcs = [op_hlcs[i] for i in starts]
    if max(txn_lens) > SEQ_LIMIT or hlcs[0] < 0 or hlcs[-1] >= HLC_LIMIT or \
            any(a >= b for a, b in zip(hlcs, hlcs[1:])):
        return None
    # within each transaction: seqs count up from 0 and share the first op's hlc
    if seqs != tuple(chain.from_iterable(map(range, txn_lens))) or \
            op_hlcs != tuple(chain.from_iterable(map(repeat, hlcs, txn_lens))):
        return None
    rep_at = [i for i, r in enumerate(replaced) if r]
    rep = [replaced[i] for i in rep_at]
    if not all(map(_csn_ok, rep)):
        return None
    names: dict[str, int] = {}
    run_coll: list[int] = []
    run_len: list[int] = []
    for c, run in groupby(colls):
        run_coll.append(names.setdefault(c, len(names)))
        run_len.append(sum(1 for _ in run))
    return txn_lens, hlcs, names, run_coll, run_len, rep_at, rep


def encode_block(family: bytes, origin: bytes, prev_hash: bytes, ops: list[Op],
                 sign: Callable[[bytes], bytes],
                 level: int | codec.ZstdParams | None = None,
                 more: bool = False) -> bytes:
    """One block of ``ops``: all of ``origin``, consecutive epochs from the first, whole
    transactions in CSN order (each starts at seq 0, its ops share one hlc and count up;
    transactions' hlcs strictly ascend).  The caller guarantees that the last transaction is
    complete (the origin's next op, if any, has seq 0): nothing in the ops can show it.

    The body columns (formats/BLOCKS.md section 4) carry no epoch, hlc per op or seq: epochs
    follow from lo, seqs from transaction lengths, hlcs are one delta per transaction.

    A part of a transaction (formats/BLOCKS.md section 4.2): ``ops`` are a run of one
    transaction's ops; if the first has seq > 0 the block is a later part (CONT), and ``more``
    says the transaction continues in the next block (MORE)."""
    if len(family) != FAMILY_LEN or len(origin) != SITE_ID_LEN or len(prev_hash) != HASH_LEN:
        raise BlockEncodeError("family, origin and prev_hash are 16, 8 and 32 bytes")
    n = len(ops)
    if not 1 <= n <= MAX_BLOCK_OPS:
        raise BlockEncodeError(f"a block holds 1..{MAX_BLOCK_OPS} ops, not {n}")
    lo = ops[0].epoch - 1
    hi = lo + n
    if lo < 0 or hi >= HLC_LIMIT:
        raise BlockEncodeError(f"epochs must lie in 1..2^63-1, not from {lo + 1}")
    if lo == 0 and prev_hash != ZERO_HASH:
        raise BlockEncodeError("the block holding epoch 1 has no predecessor: prev_hash 0")
    first_seq = ops[0].seq
    flags = (FLAG_MORE if more else 0) | (FLAG_CONT if first_seq else 0)
    if first_seq > lo:
        raise BlockEncodeError(f"op 0 has seq {first_seq}, but its transaction cannot begin "
                               f"below epoch 1: a block starts at seq 0 unless it is a later "
                               f"part of a transaction")
    # parts are few (one per medium-sized piece of a big transaction): the op-by-op pass is enough
    cols = None if flags else _columns_fast(origin, lo, ops)
    if cols is None:        # a part, or something is wrong: the op-by-op pass says what
        cols = _columns_checked(origin, lo, ops, flags)
    txn_lens, hlcs, names, run_coll, run_len, rep_at, rep = cols
    hlc_deltas = [b - a for a, b in zip(hlcs, hlcs[1:])]
    # why not a delta of 0 coded as 1: deltas stay the plain differences, easier to check by hand
    columns = [txn_lens, hlc_deltas, list(names), run_coll, run_len,
               list(map(itemgetter(5), ops)), list(map(itemgetter(6), ops)), rep_at, rep]
    if first_seq:
        columns.append(first_seq)
    return _seal(columns, family, sign, flags, origin, lo, hi, len(txn_lens), hlcs[0],
                 hlcs[-1], prev_hash, level)


def encode_columns(family: bytes, origin: bytes, prev_hash: bytes, lo: int, hlc: int,
                   first_seq: int, collections: list[tuple[str, int]], keys: list[str],
                   values: list[bytes | None], rep_at: list[int], rep: list[bytes],
                   sign: Callable[[bytes], bytes], more: bool = False) -> bytes:
    """:func:`encode_block` of ops of ONE transaction (clock ``hlc``) held as columns by a bulk
    writer: op ``i`` has epoch ``lo + 1 + i`` and seq ``first_seq + i``; ``collections`` are
    runs ``(name, count)``; ``rep_at``/``rep`` the ops that replace versions and their CSNs.
    The same bytes as :func:`encode_block` of those ops, without an object per op: a whole
    transaction (``first_seq`` 0, not ``more``) or one of its parts (section 4.2)."""
    if len(family) != FAMILY_LEN or len(origin) != SITE_ID_LEN or len(prev_hash) != HASH_LEN:
        raise BlockEncodeError("family, origin and prev_hash are 16, 8 and 32 bytes")
    n = len(keys)
    if not 1 <= n <= MAX_BLOCK_OPS or len(values) != n:
        raise BlockEncodeError(f"a block holds 1..{MAX_BLOCK_OPS} ops, not {n}")
    hi = lo + n
    if lo < 0 or hi >= HLC_LIMIT or not 0 <= hlc < HLC_LIMIT:
        raise BlockEncodeError("epochs and clocks must lie in 0..2^63-1")
    if lo == 0 and prev_hash != ZERO_HASH:
        raise BlockEncodeError("the block holding epoch 1 has no predecessor: prev_hash 0")
    if not 0 <= first_seq <= lo or first_seq + n > SEQ_LIMIT:
        raise BlockEncodeError(f"a part starting at seq {first_seq} does not fit below "
                               f"epoch {lo + 1}")
    if sum(c for _name, c in collections) != n or min(c for _n, c in collections) < 1:
        raise BlockEncodeError("the collection runs must cover the ops")
    if not (set(map(type, keys)) <= {str} and set(map(type, values)) <= {bytes, type(None)}
            and all(type(name) is str for name, _c in collections)):
        raise BlockEncodeError("collection and key are str, a value is None or bytes")
    if max(map(len, filter(None, values)), default=0) > MAX_VALUE_BYTES:
        raise BlockEncodeError(f"a value is bytes of at most {MAX_VALUE_BYTES}")
    if len(rep_at) != len(rep) or not all(map(_csn_ok, rep)) or b"" in rep or \
            any(not 0 <= i < n for i in rep_at[:1] + rep_at[-1:]) or \
            any(a >= b for a, b in zip(rep_at, rep_at[1:])):
        raise BlockEncodeError("replaced must be whole CSNs of ops in the block")
    names: dict[str, int] = {}
    run_coll: list[int] = []
    run_len: list[int] = []
    for name, c in collections:
        i = names.setdefault(name, len(names))
        if run_coll and run_coll[-1] == i:
            run_len[-1] += c
        else:
            run_coll.append(i)
            run_len.append(c)
    flags = (FLAG_MORE if more else 0) | (FLAG_CONT if first_seq else 0)
    columns = [[n], [], list(names), run_coll, run_len, keys, values, rep_at, rep]
    if first_seq:
        columns.append(first_seq)
    return _seal(columns, family, sign, flags, origin, lo, hi, 1, hlc, hlc, prev_hash, None)


def _seal(columns: list, family: bytes, sign, flags: int, origin: bytes, lo: int, hi: int,
          txns: int, hlc_first: int, hlc_last: int, prev_hash: bytes,
          level: int | codec.ZstdParams | None) -> bytes:
    """The block of ``columns``: the body packed and compressed, the header, the signature."""
    try:
        raw = codec.packb(columns)
    except (ValueError, TypeError, OverflowError) as e:     # e.g. a key with a lone surrogate
        raise BlockEncodeError(f"ops cannot be encoded: {e}") from None
    if len(raw) > MAX_BLOCK_RAW:
        raise BlockEncodeError(f"{len(raw)} bytes of ops exceed a block ({MAX_BLOCK_RAW})")
    body = codec.block_compressor(level).compress(raw)
    header = _FIXED.pack(MAGIC, VERSION, flags, origin, lo, hi, txns, hlc_first, hlc_last,
                         prev_hash, hashlib.blake2b(body, digest_size=HASH_LEN).digest(),
                         len(raw), len(body))
    sig = sign(signed_bytes(family, header))
    if len(sig) != SIG_LEN:
        raise BlockEncodeError("sign must return a 64-byte Ed25519 signature")
    return header + sig + body


# --- decoding ----------------------------------------------------------------------------------

_gc_lock = threading.Lock()
_gc_pausers = 0
_gc_was_enabled = False


@contextmanager
def gc_paused():
    """Decoding a block allocates ~3 objects per op, none of them cyclic; each allocation burst
    would trigger the cyclic collector, which then walks every live object of the process.
    Pausing it (as msgpack's docs advise for large unpacks) cut decoding 1M ops by ~30% in
    tools/bench_blocks.py.  Counted across threads (an import decodes in one while it inserts
    in another): the collector comes back, if it was on, when the last pauser leaves,
    whatever happens."""
    global _gc_pausers, _gc_was_enabled
    with _gc_lock:
        if _gc_pausers == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_pausers += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_pausers -= 1
            if _gc_pausers == 0 and _gc_was_enabled:
                gc.enable()


# A decompressed body above this is decoded in pieces (see _decode).
_UNPACKB_MAX = 16 * 1024 * 1024

_SEQ4: list[bytes] = [i.to_bytes(4, "big") for i in range(1024)]
_SEQ4_CACHE_MAX = 1 << 16


def _txn_csns(prefix: bytes, n: int) -> Iterator[bytes]:
    """The CSNs of a transaction's ops 0..n-1: its 16-byte (hlc, origin) prefix and each seq,
    the seq from a small cache (a transaction is mostly short); beyond the cache one pack per
    op (as fast as the cache, measured; a list of to_bytes per op took 80% longer)."""
    if n > len(_SEQ4):
        if n > _SEQ4_CACHE_MAX:
            return map(_PFX_SEQ_PACK, repeat(prefix), range(n))
        _SEQ4.extend(map(_SEQ_PACK, range(len(_SEQ4), n)))
    return map(prefix.__add__, _SEQ4[:n] if n < len(_SEQ4) else _SEQ4)


def _block_csns(origin: bytes, hlcs: list[int], lens: list[int], first_seq: int, n: int
                ) -> Iterator[bytes]:
    """The CSNs of a block's ``n`` ops (BlockColumns.iter_csns)."""
    if first_seq:      # a later part: one transaction, seqs from first_seq
        return map(_CSN_PACK, repeat(hlcs[0], n), repeat(origin), range(first_seq, first_seq + n))
    if len(lens) == n:
        return map(bytes.__add__, map(_HLC_ORIGIN.pack, hlcs, repeat(origin)),
                   repeat(b"\0\0\0\0"))
    if n < 8 * len(lens):
        return map(_CSN_PACK, chain.from_iterable(map(repeat, hlcs, lens)),
                   repeat(origin), chain.from_iterable(map(range, lens)))
    pack = _HLC_ORIGIN.pack
    return chain.from_iterable(map(_txn_csns, map(pack, hlcs, repeat(origin)), lens))


_PFX_SEQ_PACK = struct.Struct(">16sI").pack
_SEQ_PACK = struct.Struct(">I").pack


class BlockColumns(NamedTuple):
    """The ops of one block as columns, checked; row i is the op of epoch lo+1+i."""
    origin: bytes
    lo: int
    hi: int
    txn_lens: list[int]       # ops per transaction, in order
    txn_hlcs: list[int]       # the hlc of each transaction
    collections: list[str]    # per op
    keys: list[str]
    values: list[bytes | None]
    replaced: list[bytes]     # per op, b"" for most
    first_seq: int = 0        # the seq of the first op (> 0 only in a later part, CONT)

    @property
    def count(self) -> int:
        return self.hi - self.lo

    @property
    def last_seq(self) -> int:
        """The seq of the block's last op."""
        return self.first_seq + self.txn_lens[-1] - 1

    def csns(self) -> list[bytes]:
        """The 20-byte CSN of every op."""
        return list(self.iter_csns())

    def iter_csns(self) -> Iterator[bytes]:
        """:meth:`csns`, made as they are taken.  Three shapes, measured
        (tools/bench_blocks.py, ns per op): one-op transactions take a 16-byte prefix plus 4
        zero bytes (184 against 764 for the per-transaction loop); short ones a struct pack
        per op (413); long ones one prefix per transaction plus its seqs (108, against 122
        packing per op)."""
        return _block_csns(self.origin, self.txn_hlcs, self.txn_lens, self.first_seq,
                           self.hi - self.lo)

    def rows(self) -> list[tuple]:
        """``(collection, key, csn, value)`` per op, ready for ``executemany``."""
        with gc_paused():
            return list(self.iter_rows())

    def column_batches(self, size: int, replaced: bool = False
                       ) -> Iterator[tuple[str, list[str], list[bytes], list[bytes | None]]]:
        """The ops as ``(collection, keys, csns, values)``, runs of one collection of at most
        ``size`` ops, in order (a bulk insert's batches); with ``replaced``, each batch has
        the ops' replaced CSNs (concatenated, b"" for none) as a fifth column."""
        csns = self.iter_csns()
        colls, keys, values, reps = self.collections, self.keys, self.values, self.replaced
        at, n = 0, self.count
        while at < n:
            end = min(n, at + size)
            c = colls[at]
            if colls[at:end].count(c) != end - at:
                end = at + 1                    # the run of c ends before: find where
                while end < n and end - at < size and colls[end] == c:
                    end += 1
            batch = (c, keys[at:end], list(islice(csns, end - at)), values[at:end])
            yield batch + (reps[at:end],) if replaced else batch
            at = end

    def iter_rows(self) -> Iterator[tuple]:
        """:meth:`rows` made as they are taken: ``executemany`` over it builds no list, and
        ``zip`` reuses its tuple once the driver has bound it."""
        return zip(self.collections, self.keys, self.iter_csns(), self.values)

    def ops(self) -> Iterator[Op]:
        """The same ops as :class:`syncpack.format.codec.Op`, in epoch (= CSN) order."""
        hlcs = chain.from_iterable(map(repeat, self.txn_hlcs, self.txn_lens))
        seqs = chain.from_iterable(map(range, self.txn_lens)) if not self.first_seq else \
            iter(range(self.first_seq, self.first_seq + self.count))
        # tuple.__new__ over zipped columns builds each Op in C; Op(...) would run the
        # namedtuple's Python-level __new__ once per op (2.3x slower at 1M ops)
        return map(_tuple_new, repeat(Op), zip(
            repeat(self.origin), range(self.lo + 1, self.hi + 1), hlcs, seqs,
            self.collections, self.keys, self.values, self.replaced))


def _only(col, types: tuple) -> bool:
    return type(col) is list and set(map(type, col)) <= set(types)


def decode_block(block: bytes | memoryview | BlockInfo, raw: bytes | None = None
                 ) -> BlockColumns:
    """``raw``: the body as :func:`decompressed_body` gave it, if it ran already."""
    with gc_paused():
        return _decode(block, raw)


def decompressed_body(info: BlockInfo) -> bytes:
    """The block's body hash checked (unless verify_block did) and its body decompressed
    within the header's limits: the part of decoding that runs without the GIL."""
    origin, lo, hi = info.origin, info.lo, info.hi

    def bad(msg: str) -> BlockError:
        return BlockError(msg, origin, lo, hi)

    body = info.body
    if not info.body_checked and \
            hashlib.blake2b(body, digest_size=HASH_LEN).digest() != info.body_hash:
        raise bad("body does not match its signed hash")
    # The zstd frame header must declare exactly raw_len (bounded above) before any output is
    # produced: a frame without a content size could expand without bound.
    if bytes(body[:4]) != _ZSTD_MAGIC:
        raise bad("body is not a zstd frame")
    try:
        params = codec.zstd_frame_parameters(body)
        if params.content_size != info.raw_len:
            raise bad(f"compressed frame declares {params.content_size} bytes, the header "
                      f"{info.raw_len}")
        if params.window_size > ZSTD_MAX_WINDOW:
            raise BlockLimitError(f"zstd window of {params.window_size} bytes exceeds the limit",
                                  origin, lo, hi)
        d = codec.bounded_decompressor()
        raw = d.decompress(body)
    except codec.ZstdError as e:
        raise bad(f"body does not decompress: {e}") from None
    if not d.eof:
        raise bad("body ends inside its compressed frame")
    if d.unused_data:
        raise bad("bytes after the end of the compressed body")
    if len(raw) != info.raw_len:
        raise bad(f"body decompresses to {len(raw)} bytes, the header says {info.raw_len}")
    return raw


def _decode(block: bytes | memoryview | BlockInfo, raw: bytes | None = None) -> BlockColumns:
    """Decompress and decode a block's body with limits, checking every column against the
    (signed) header.  Checks the body hash (unless ``block`` is the BlockInfo verify_block
    returned), not the signature: call :func:`verify_block` first for anything that came
    from another site."""
    info = block if isinstance(block, BlockInfo) else read_block_header(block)
    origin, lo, hi, n = info.origin, info.lo, info.hi, info.count

    def bad(msg: str) -> BlockError:
        return BlockError(msg, origin, lo, hi)

    if raw is None:
        raw = decompressed_body(info)

    # One C-level unpack of the body.  Amplification is bounded: no array is longer
    # than the op count, maps and ext are refused, and the hook refuses a tenth array (the
    # body is exactly one array of nine flat columns), so nested arrays cannot multiply.
    lists = [N_COLUMNS + 1]

    def hook(obj):
        lists[0] -= 1
        if lists[0] < 0:
            raise ValueError("nested array in a column")
        return obj
    limits = dict(max_str_len=MAX_STR_BYTES, max_bin_len=MAX_VALUE_BYTES,
                  max_array_len=max(n, N_COLUMNS + info.cont), max_map_len=0, max_ext_len=0,
                  list_hook=hook)
    try:
        if len(raw) <= _UNPACKB_MAX:
            cols = codec.unpack_limited(raw, **limits)
        else:
            # unpackb's ExtraData error carries a copy of everything after the first complete
            # object: a body of one small object and 256 MiB of padding would cost two bodies
            # (formats/BLOCKS.md 4.1 allows one).  Read in pieces instead, which copies no
            # tail; ~20% slower, so small bodies, whose tail copy is small, keep unpackb.
            cols = codec.unpack_limited_in_pieces(raw, **limits)
    except codec.MSGPACK_ERRORS as e:
        raise bad(f"malformed columns: {e or type(e).__name__}") from None
    del raw     # the columns hold what is needed; the decompressed bytes can go now
    cont = info.cont
    if type(cols) is not list or len(cols) != N_COLUMNS + cont:
        raise bad(f"body is not an array of {N_COLUMNS} columns"
                  + (" and the first seq" if cont else ""))
    first_seq = 0
    if cont:
        first_seq = cols.pop()
        if type(first_seq) is not int or not 1 <= first_seq <= lo or first_seq >= SEQ_LIMIT - n:
            raise bad("a later part of a transaction must name the seq of its first op")
    txn_lens, hlc_deltas, names, run_coll, run_len, keys, values, rep_at, rep = cols

    T = info.txns
    if not (_only(txn_lens, (int,)) and len(txn_lens) == T and min(txn_lens) >= 1
            and max(txn_lens) < SEQ_LIMIT and sum(txn_lens) == n):
        raise bad(f"transaction lengths do not add up to {n} ops in {T} transactions")
    if not (_only(hlc_deltas, (int,)) and len(hlc_deltas) == T - 1
            and (T == 1 or min(hlc_deltas) >= 1)
            and info.hlc_first + sum(hlc_deltas) == info.hlc_last):
        raise bad("transaction clocks do not ascend from hlc_first to hlc_last")
    if not (_only(names, (str,)) and 1 <= len(names) <= n and len(set(names)) == len(names)):
        raise bad("bad collection dictionary")
    if not (_only(run_coll, (int,)) and _only(run_len, (int,)) and run_coll
            and len(run_coll) == len(run_len) and min(run_coll) >= 0
            and max(run_coll) < len(names) and min(run_len) >= 1 and sum(run_len) == n
            and all(a != b for a, b in zip(run_coll, run_coll[1:]))):
        raise bad("collection runs do not cover the ops")
    if not (_only(keys, (str,)) and len(keys) == n):
        raise bad(f"key column does not hold {n} keys")
    if not (_only(values, (bytes, type(None))) and len(values) == n):
        raise bad(f"value column does not hold {n} values")
    if not (_only(rep_at, (int,)) and _only(rep, (bytes,)) and len(rep_at) == len(rep)
            and all(map(int.__lt__, rep_at, rep_at[1:]))     # ascending, in C
            and (not rep_at or 0 <= rep_at[0] and rep_at[-1] < n)
            and _csns_ok(rep)):
        raise bad("bad replaced-versions column")

    hlcs = list(accumulate(hlc_deltas, initial=info.hlc_first))
    if rep_at:
        # An op can only have seen versions older than itself: a CSN from its own future would
        # be superseded before it exists, at some sites and not others.
        if 4 * len(rep_at) >= n:     # most ops replace (updates): the block's CSNs, once
            owns = list(map(list(_block_csns(origin, hlcs, txn_lens, first_seq, n)).__getitem__,
                            rep_at))
        else:
            ends = list(accumulate(txn_lens))
            owns = [_CSN_PACK(hlcs[t], origin, a - (ends[t - 1] if t else -first_seq))
                    for a, t in zip(rep_at, map(bisect_right, repeat(ends), rep_at))]
        tops = rep if max(map(len, rep)) == CSN_LEN else [max(split_csns(r)) for r in rep]
        if not all(map(bytes.__lt__, tops, owns)):
            raise bad("an op lists as replaced a version not older than itself")
    collections = list(chain.from_iterable(map(repeat, map(names.__getitem__, run_coll),
                                               run_len)))
    replaced = [b""] * n
    for a, r in zip(rep_at, rep):
        replaced[a] = r
    return BlockColumns(origin, lo, hi, txn_lens, hlcs, collections, keys, values, replaced,
                        first_seq)


def decode_ops(block: bytes | memoryview | BlockInfo) -> Iterator[Op]:
    """The ops of a block, in epoch order (decoded and checked in full before the first)."""
    return decode_block(block).ops()



_BODY_LEN = struct.Struct(">I")


def split_blocks(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """Whole blocks out of a byte stream that concatenates them (a packet body read in
    chunks).  The header's length field is bounded before the body is awaited, so a lying
    length cannot make the reader hold more than one block's limit; the caller reads each
    block's header in full (:func:`read_block_header`)."""
    buf = bytearray()
    pos = 0
    for chunk in chunks:
        if pos:
            del buf[:pos]       # once per chunk: many small blocks cost no quadratic copying
            pos = 0
        buf += chunk
        while len(buf) - pos >= HEADER_LEN:
            body_len = _BODY_LEN.unpack_from(buf, pos + SIGNED_LEN - 4)[0]
            if body_len > MAX_BLOCK_BODY:
                raise BlockLimitError(f"body of {body_len} bytes exceeds the limit",
                                      bytes(buf[pos + 6:pos + 14]))
            end = pos + HEADER_LEN + body_len
            if len(buf) < end:
                break
            yield bytes(buf[pos:end])
            if end - pos >= 1 << 20:
                del buf[:end]   # a big block goes at once (small ones wait for the next chunk)
                pos = 0
            else:
                pos = end
    if len(buf) > pos:
        claimed = bytes(buf[pos + 6:pos + 14]) if len(buf) - pos >= 14 else None
        raise BlockError(f"body ends inside a block ({len(buf) - pos} bytes left over)", claimed)


def packet_ops(f, env, unsealer=None) -> Iterator[Op]:
    """Every op of an update packet's body, block after block, for inspection (lspacket,
    tools, tests).  Checks each block's header, body hash and columns, but not signatures or
    chains: the importer's path is :func:`syncpack.exchange.verify.verify_block`."""
    from syncpack.format.codec import body_chunks
    if env.header.piece is not None:
        # One piece of a block (PACKET.md section 6.4) holds no whole op: read (and unseal)
        # it, nothing more; its ops are read once the pieces are joined.
        for _chunk in body_chunks(f, env, unsealer):
            pass
        return
    for raw in split_blocks(body_chunks(f, env, unsealer)):
        yield from decode_ops(raw)
