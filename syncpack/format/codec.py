"""The only module that touches msgpack and zstd: values, ops and packet files.

The local exporter, the importer, ``mkreplica`` and the Spark job all read and write packets
through this module, so both engines produce the same bytes.  The byte layout is specified in
``formats/PACKET.md``; change the two together (the golden vectors in ``formats/vectors/`` catch a
drift).

Functions take file objects, never paths.  Everything read from a packet is untrusted: sizes are
bounded before anything is allocated, library errors become :class:`PacketError` subclasses.
"""

from __future__ import annotations

import hashlib
import io
import struct
import threading
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Callable, Iterable, Iterator, NamedTuple

import msgpack

from syncpack.format.csn import CSN_LEN, CSN_STRUCT, SITE_ID_LEN
from syncpack.lazy import OnFirstUse
from syncpack.errors import (PacketBodyError, PacketFeatureError, PacketFormatError,
                             PacketLimitError, PacketSealError, PacketVersionError,
                             SealError, UndecodableRecordError)

# --- msgpack, with fixed settings -------------------------------------------------------------

MAX_VALUE_BYTES = 64 * 1024 * 1024      # one record value, encoded
MAX_STR_BYTES = 1024 * 1024             # a key or collection name, in UTF-8 (every reader)
MAX_HEADER_BYTES = 16 * 1024 * 1024     # O(sites); a thousand sites need well under 1 MiB
MAX_ORIGINS = 100_000
ZSTD_LEVEL = 3
ZSTD_MAX_WINDOW = 1 << 27               # refuse frames that ask for more than 128 MiB of window


# Block writers' zstd setting (readers accept any frame within the limits): level 3 with a
# minimum match of 7 bytes instead of level 3's 5.  Measured by tools/bench_blocks.py: on the
# issue's bulk workload 27.7 bytes/op against 29.1 at plain level 3 (26.9 at level 1), on the
# small one 28.3 against 32.9 (27.7), on JSON-like records 32.6 against 32.8 (34.4 at level 1):
# 5-byte matches inside random text cost more than the literals they replace.  Content size in
# the frame header (the reader checks it, which bounds its output before it allocates); no zstd
# checksum (the signed body hash covers the body).
# zstandard is imported on first use (syncpack.lazy: a get or put never compresses), so the
# names below that come from it are made when first asked for (module __getattr__).
zstandard = OnFirstUse("zstandard")
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_FROM_ZSTD = {
    "BLOCK_ZSTD_PARAMS": lambda: zstandard.ZstdCompressionParameters.from_level(
        ZSTD_LEVEL, min_match=7, write_content_size=1, write_checksum=0),
    "ZstdParams": lambda: zstandard.ZstdCompressionParameters,
    "ZstdError": lambda: zstandard.ZstdError,
    "zstd_frame_parameters": lambda: zstandard.get_frame_parameters,
}


def _from_zstd(name: str) -> Any:
    if name not in globals():
        globals()[name] = _FROM_ZSTD[name]()     # made once
    return globals()[name]


def __getattr__(name: str) -> Any:
    if name not in _FROM_ZSTD:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return _from_zstd(name)
# what a malformed msgpack input may raise
MSGPACK_ERRORS = (msgpack.ExtraData, msgpack.FormatError, msgpack.StackError, msgpack.OutOfData,
                  msgpack.BufferFull, ValueError, TypeError, OverflowError, RecursionError)


def block_compressor(level: "int | zstandard.ZstdCompressionParameters | None" = None):
    """The compressor of a block's body: the writers' setting, or (tools/bench_blocks.py)
    given parameters or a plain level with the same frame options."""
    if level is None:
        return zstandard.ZstdCompressor(compression_params=_from_zstd("BLOCK_ZSTD_PARAMS"))
    if isinstance(level, zstandard.ZstdCompressionParameters):
        return zstandard.ZstdCompressor(compression_params=level)
    return zstandard.ZstdCompressor(level=level, write_content_size=True, write_checksum=False)


def bounded_decompressor():
    """A streaming zstd decompressor that refuses windows above :data:`ZSTD_MAX_WINDOW`."""
    return zstandard.ZstdDecompressor(max_window_size=ZSTD_MAX_WINDOW).decompressobj()


def unpack_limited(data, **limits) -> Any:
    """Decode untrusted bytes in one C-level call, within the caller's msgpack limits."""
    return msgpack.unpackb(data, raw=False, use_list=True, strict_map_key=False, **limits)


UNPACK_PIECE = 1 << 20


def unpack_limited_in_pieces(data: bytes, **limits) -> Any:
    """:func:`unpack_limited` for a large input that must hold one object: an Unpacker reads
    it in pieces (BytesIO shares the bytes), so bytes after the object are counted, never
    copied (unpackb's ExtraData error carries a copy of them).  Its buffer holds at most one
    piece beyond the largest string or bin the limits allow."""
    big = max(limits.get("max_bin_len", 0), limits.get("max_str_len", 0))
    unpacker = msgpack.Unpacker(io.BytesIO(data), read_size=UNPACK_PIECE,
                                max_buffer_size=big + 2 * UNPACK_PIECE, raw=False,
                                use_list=True, strict_map_key=False, **limits)
    obj = unpacker.unpack()
    if unpacker.tell() != len(data):
        raise ValueError(f"{len(data) - unpacker.tell()} bytes after the first object")
    return obj


# One Packer per thread, kept: msgpack.packb makes one per call, with a 1 MiB buffer, which
# was most of the cost of packing a small value (1.0 against 0.4 us for a short record).
_packers = threading.local()
# A Packer keeps its buffer as large as the largest value it packed: one that packed more
# than this is let go, so a block's megabytes are not held for the rest of the command.
_KEEP_PACKER_BELOW = 1 << 20


def packb(obj: Any) -> bytes:
    try:
        pack = _packers.pack
    except AttributeError:
        pack = _packers.pack = msgpack.Packer(use_bin_type=True).pack
    out = pack(obj)     # (a Packer that raised is reset, and packs the next value afresh)
    if len(out) >= _KEEP_PACKER_BELOW:
        del _packers.pack
    return out


def unpackb(data: bytes) -> Any:
    """Decode trusted bytes (our own store)."""
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


def value_packer() -> Callable[[Any], bytes]:
    """:func:`packb` for many values in a row: one reusable Packer (making one per call is
    most of packb's cost for a small value).  Raises as packb does, and recovers after."""
    return msgpack.Packer(use_bin_type=True).pack


def map_header(n: int) -> bytes:
    """The msgpack header of a map of ``n`` pairs (a bulk encoder's own maps)."""
    return msgpack.Packer(use_bin_type=True).pack_map_header(n)


def array_header(n: int) -> bytes:
    """The msgpack header of an array of ``n`` elements."""
    return msgpack.Packer(use_bin_type=True).pack_array_header(n)


def encode_value(value: Any) -> bytes:
    """A record value as stored and shipped.  Raises TypeError/ValueError for unencodable input."""
    try:
        return packb(value)
    except OverflowError:
        # JSON has no bound on integers; the format (and SQLite) holds 64 bits
        raise ValueError("value cannot be encoded: an integer outside 64 bits (from "
                         "-9223372036854775808 to 18446744073709551615); write a larger "
                         "number as a string") from None
    except (TypeError, ValueError) as e:
        raise ValueError(f"value cannot be encoded: {e}") from None


class Undecodable:
    """Stands for a value whose bytes are not msgpack (what a lying member may sign)."""

    __slots__ = ()


UNDECODABLE = Undecodable()


def _value_or_undecodable(raw: bytes) -> Any:
    """A stored record's value, or :data:`UNDECODABLE` (the store keeps values as their
    origin signed them)."""
    try:
        return unpackb(raw)
    except MSGPACK_ERRORS:
        return UNDECODABLE


def decode_value(raw: bytes, what: str = "a record") -> Any:
    """A stored record's value.  Raises :class:`UndecodableRecordError`, naming ``what``, for
    bytes that are not a value."""
    v = _value_or_undecodable(raw)
    if v is UNDECODABLE:
        raise UndecodableRecordError(f"{what} is not a value ({len(raw)} bytes as its origin "
                                     f"signed them)")
    return v


def shown_value(raw: bytes) -> Any:
    """:func:`decode_value` for display: a value that does not decode is shown as text
    saying so (with its first bytes), so that a listing of many still shows the others."""
    v = _value_or_undecodable(raw)
    return f"(not a value: {len(raw)} bytes {raw[:16].hex()})" if v is UNDECODABLE else v


def decode_values(raws: list[bytes]) -> list[Any]:
    """:func:`decode_value` of many (a bulk reader): no Python call per value beyond
    msgpack's own."""
    unpack = msgpack.unpackb
    return [unpack(r, raw=False, strict_map_key=False) for r in raws]


def decode_records(raws: list[bytes]) -> list[Any]:
    """:func:`decode_values` of values that came from peers: one that does not decode is
    :data:`UNDECODABLE` instead of an error for all (one by one only after a failure)."""
    try:
        return decode_values(raws)
    except MSGPACK_ERRORS:
        return list(map(_value_or_undecodable, raws))


def _untrusted_unpacker(body: bool = False) -> msgpack.Unpacker:
    # An empty array or map is one byte of input and ~60 bytes of memory, so length limits alone
    # let a 16 MiB header (parsed before the signature is checked) become gigabytes of nested
    # lists.  Bound the number of containers in a header; body items (ops, records) are flat.
    if body:
        containers = frozenset((list, dict))

        def hook(obj):
            if not containers.isdisjoint(map(type, obj)):
                raise ValueError("nested array or map inside an op")
            return obj
    else:
        left = [5 * MAX_ORIGINS + 1000]

        def hook(obj):
            left[0] -= 1
            if left[0] < 0:
                raise ValueError("too many arrays and maps")
            return obj
    return msgpack.Unpacker(raw=False, use_list=True, strict_map_key=False,
                            max_buffer_size=MAX_VALUE_BYTES + 1024 * 1024,
                            max_bin_len=MAX_VALUE_BYTES, max_str_len=MAX_STR_BYTES,
                            max_array_len=7 if body else 1_000_000,
                            max_map_len=0 if body else 100_000, max_ext_len=0,
                            list_hook=hook, object_hook=None if body else hook)


def unpack_untrusted(data: bytes) -> Any:
    try:
        u = _untrusted_unpacker()
        u.feed(data)
        obj = u.unpack()
        try:
            u.unpack()
        except msgpack.OutOfData:
            return obj
        raise PacketFormatError("extra bytes after a msgpack object")
    except msgpack.OutOfData:
        raise PacketFormatError("truncated msgpack data") from None
    except UnicodeDecodeError:
        # (a ValueError, whose own text names codec internals, not the data)
        raise PacketFormatError("malformed msgpack: a text field is not UTF-8") from None
    except TypeError:
        # msgpack's own words ("unhashable type: 'list'") name Python, not the data
        raise PacketFormatError("malformed msgpack: a map key is a list or a map") from None
    except msgpack.StackError:
        raise PacketFormatError("malformed msgpack: nested too deep") from None
    except (msgpack.ExtraData, msgpack.FormatError, ValueError) as e:
        why = str(e) or "a byte no msgpack value starts with"
        raise PacketFormatError(f"malformed msgpack: {why}") from None


# --- ops --------------------------------------------------------------------------------------

_CSN_PACK = CSN_STRUCT.pack


class Op(NamedTuple):
    """One change, as the changelog holds it and a packet carries it."""
    origin: bytes          # site id, 8 bytes
    epoch: int
    hlc: int
    seq: int
    collection: str
    key: str
    value: bytes | None    # msgpack-encoded value, None for a delete (tombstone)
    replaced: bytes        # concatenated 20-byte CSNs of the versions this op superseded

    @property
    def csn(self) -> bytes:
        return _CSN_PACK(self.hlc, self.origin, self.seq)


class Record(NamedTuple):
    """One surviving version, as a snapshot packet carries it."""
    collection: str
    key: str
    csn: bytes
    value: bytes | None


# --- packet framing ---------------------------------------------------------------------------

MAGIC = b"\x89SYNCPK\n"
FORMAT_VERSION = 2
SUPPORTED_VERSIONS = (2,)
OLDER_VERSIONS = (1,)   # known, no longer read: their ops carry no origin's signature
END_MAGIC = b"SPKE"
SIG_LEN = 64
# Fork evidence and heads carry signed block headers (formats/BLOCKS.md 3.1 and 3.2), at most
# this many of each per packet header.
BLOCK_HEADER_LEN = 186
MAX_HEADS = 64
MAX_FORKS = 16
MAX_KEPT = 16
_PREFIX = struct.Struct(">8sB")           # magic, version
_FOOTER = struct.Struct(">I64s4s")        # header length, Ed25519 signature, end magic
MIN_PACKET = _PREFIX.size + _FOOTER.size
SIGNING_CONTEXT = b"syncpack packet signature v1\x00"

KIND_UPDATE = "update"
KIND_SNAPSHOT = "snapshot"
FEATURE_BLOCKS = "blocks"       # the body of an update packet: origin-signed blocks
FEATURE_SEAL = "seal-x25519-chacha20poly1305"
# The body is one piece of one block too large for the medium (PACKET.md section 6.4): a
# reader that does not know pieces must refuse the packet, never read the piece as blocks.
FEATURE_PIECE = "block-piece"
# The body of a snapshot packet is one piece of one record too large for the medium (PACKET.md
# section 7.1): a reader that does not know it must not read the piece as whole records.
FEATURE_RECORD_PIECE = "record-piece"
KNOWN_MANDATORY = frozenset({"zstd", FEATURE_BLOCKS, FEATURE_SEAL, FEATURE_PIECE,
                             FEATURE_RECORD_PIECE})
# The bytes of one block a piece may belong to: a block's whole length at most.
MAX_PIECE_TOTAL = BLOCK_HEADER_LEN + (256 * 1024 * 1024) + ((256 * 1024 * 1024) >> 7) + 1024
MAX_RECORD_PIECE_TOTAL = MAX_VALUE_BYTES + 1024 * 1024
# Fork evidence, heads and 'kept' in the header (docs/design.md §3.10): old readers may ignore
# them (they then find forks only where the blocks meet).
FEATURE_FORKS = "forks"
KNOWN_ADVISORY: frozenset[str] = frozenset({FEATURE_FORKS})


ACK_CONTEXT = b"syncpack acknowledgement v1\x00"
KEPT_CONTEXT = b"syncpack fork kept v1\x00"


def kept_signed_bytes(family: bytes, origin: bytes, block_hash: bytes) -> bytes:
    """What an origin signs to say that, at a fork of its own history, it kept the block
    ``block_hash``; members pass the signature on as is (``kept_by``)."""
    return KEPT_CONTEXT + family + origin + block_hash


def ack_signed_bytes(family: bytes, member: bytes, created_ms: int,
                     vector: dict[bytes, int]) -> bytes:
    """What a member signs to acknowledge its vector; relays pass the signature on as is."""
    return (ACK_CONTEXT + family + member + created_ms.to_bytes(8, "big")
            + packb(sorted([o, e] for o, e in vector.items() if e)))


def ack_delta(base: dict[bytes, int], vec: dict[bytes, int]) -> dict[bytes, int]:
    """A relayed acknowledgement travels as its differences from the header's vector (the
    members of a family that syncs hold nearly the same vectors): the entries that differ,
    0 for an origin the header has and the acknowledgement lacks."""
    out = {o: e for o, e in vec.items() if e and base.get(o, 0) != e}
    out.update({o: 0 for o in base if not vec.get(o, 0)})
    return out


def apply_ack_delta(base: dict[bytes, int], delta: dict[bytes, int]) -> dict[bytes, int]:
    vec = dict(base)
    vec.update(delta)
    return {o: e for o, e in vec.items() if e}


def signed_bytes(version: int, header_bytes: bytes) -> bytes:
    """What the signature covers: the version byte and the header, which holds the body hash."""
    return SIGNING_CONTEXT + _PREFIX.pack(MAGIC, version) + header_bytes


@dataclass
class Header:
    kind: str
    family: bytes
    sender: bytes
    recipient: bytes
    packet_id: bytes
    seq: int
    part: int
    final: bool
    created_ms: int
    vector: dict[bytes, int]
    ranges: dict[bytes, tuple[int, int]] = field(default_factory=dict)
    recv_seq: int = 0
    waiting: dict[bytes, tuple[int, int]] = field(default_factory=dict)
    ack_floor: dict[bytes, int] = field(default_factory=dict)
    count: int = 0
    hlc_max: int = 0
    body_len: int = 0
    body_hash: bytes = b""
    mandatory: list[str] = field(default_factory=lambda: ["zstd"])
    advisory: list[str] = field(default_factory=list)
    roster: list[dict] = field(default_factory=list)   # snapshot packets only
    seal_epk: bytes = b""      # sealed packets: the sender's ephemeral X25519 public key
    tip: tuple[int, bytes] | None = None   # (epoch, CSN) of the newest op of the recipient's
                                           # own origin the sender holds
    anchors: dict[bytes, bytes] = field(default_factory=dict)  # origin -> CSN at range's lo
    reply: bool = False        # the sender has unconfirmed changes: answer even if idle
    recovering: bool = False   # the sender waits for its own ops after a restore: answer it
    ack_set: bytes = b""       # obsolete (format 1.0 gossip): parsed, never believed
    # Signed acknowledgements: (member, created_ms, vector or None, signature).  The sender's
    # own has vector None (it is the header's vector, made at the header's 'created'); the
    # others are relayed word for word from the members that signed them.
    acks: list[tuple[bytes, int, dict[bytes, int] | None, bytes]] = field(default_factory=list)
    # Signed headers of the sender's newest block of some origins, so a recipient holding
    # another block there finds the fork (docs/design.md §3.10); and fork evidence: pairs of
    # signed headers of one origin that contradict each other.
    heads: list[bytes] = field(default_factory=list)
    forks: list[tuple[bytes, bytes]] = field(default_factory=list)
    # Block hashes of the sender's own origin: at forks of its history it healed, the version
    # it kept (its signed word, as this whole header is).
    kept: list[bytes] = field(default_factory=list)
    # The same word, signed by itself so any member can pass it on: (block hash, the origin's
    # signature of kept_signed_bytes), the sender's own and other origins' it holds.
    kept_by: list[tuple[bytes, bytes]] = field(default_factory=list)
    # A piece packet (FEATURE_PIECE): (offset, total) of the block bytes its body holds.
    piece: tuple[int, int] | None = None

    @property
    def sealed(self) -> bool:
        return FEATURE_SEAL in self.mandatory

    # The wire form numbers origins once, in order of first use, so ranges, vectors and ops
    # refer to a small index instead of repeating 8-byte ids.
    def origin_table(self, extra: Iterable[bytes] = ()) -> list[bytes]:
        seen: dict[bytes, int] = {}
        for o in list(self.vector) + list(self.ranges) + list(self.waiting) + \
                list(self.ack_floor) + list(extra):
            seen.setdefault(o, len(seen))
        for member, _created, vec, _sig in self.acks:
            seen.setdefault(member, len(seen))
            for o in vec or ():
                seen.setdefault(o, len(seen))
        return list(seen)

    def to_wire(self, origins: list[bytes]) -> dict:
        ix = {o: i for i, o in enumerate(origins)}
        h = {
            "kind": self.kind, "family": self.family, "from": self.sender,
            "to": self.recipient, "id": self.packet_id, "seq": self.seq, "part": self.part,
            "final": self.final, "created": self.created_ms, "origins": origins,
            "vector": [[ix[o], e] for o, e in sorted(self.vector.items())],
            "ranges": [[ix[o], lo, hi] for o, (lo, hi) in sorted(self.ranges.items())],
            "recv_seq": self.recv_seq,
            "waiting": [[ix[o], lo, hi] for o, (lo, hi) in sorted(self.waiting.items())],
            "ack_floor": [[ix[o], e] for o, e in sorted(self.ack_floor.items())],
            "count": self.count, "hlc_max": self.hlc_max, "body_len": self.body_len,
            "body_hash": self.body_hash, "req": list(self.mandatory),
            "opt": list(self.advisory),
        }
        if self.sealed:
            h["seal"] = {"epk": self.seal_epk}
        if self.tip is not None:
            h["tip"] = [self.tip[0], self.tip[1]]
        if self.anchors:
            h["anchors"] = [[ix[o], c] for o, c in sorted(self.anchors.items())]
        if self.reply:
            h["reply"] = True
        if self.recovering:
            h["recovering"] = True
        if self.ack_set:
            h["ack_set"] = self.ack_set
        if self.acks:
            h["acks"] = [[ix[m], created, None if vec is None else
                          [[ix[o], e] for o, e in sorted(ack_delta(self.vector, vec).items())],
                          sig] for m, created, vec, sig in self.acks]
        if self.heads:
            h["heads"] = list(self.heads)
        if self.forks:
            h["forks"] = [[a, b] for a, b in self.forks]
        if self.kept:
            h["kept"] = list(self.kept)
        if self.kept_by:
            h["kept_by"] = [[k, sig] for k, sig in self.kept_by]
        if self.piece is not None:
            h["piece"] = [self.piece[0], self.piece[1]]
        if self.kind == KIND_SNAPSHOT:
            h["roster"] = [[m["name"], m["id"], m["ed25519"], m["x25519"], m["priority"]]
                           for m in self.roster]
        return h


def _need(cond: bool, what: str) -> None:
    if not cond:
        raise PacketFormatError(f"bad packet header: {what}")


def _int(h: dict, k: str, lo: int = 0, hi: int = (1 << 63) - 1) -> int:
    # 2**63 - 1: header integers are stored in SQLite, whose INTEGER is signed 64-bit.
    v = h.get(k)
    _need(type(v) is int and lo <= v <= hi, f"field '{k}' must be an integer in [{lo}, {hi}]")
    return v


def _bytes(h: dict, k: str, n: int) -> bytes:
    v = h.get(k)
    _need(isinstance(v, bytes) and len(v) == n, f"field '{k}' must be {n} bytes")
    return v


def _triples(h: dict, k: str, origins: list[bytes]) -> dict[bytes, tuple[int, int]]:
    v = h.get(k)
    _need(isinstance(v, list), f"field '{k}' must be a list")
    out: dict[bytes, tuple[int, int]] = {}
    for t in v:
        _need(isinstance(t, list) and len(t) == 3 and all(type(x) is int for x in t),
              f"entries of '{k}' must be [origin, from, to]")
        i, lo, hi = t
        _need(0 <= i < len(origins) and 0 <= lo <= hi < (1 << 63), f"bad entry in '{k}'")
        _need(origins[i] not in out, f"origin listed twice in '{k}'")
        out[origins[i]] = (lo, hi)
    return out


def _pairs(h: dict, k: str, origins: list[bytes]) -> dict[bytes, int]:
    v = h.get(k)
    _need(isinstance(v, list), f"field '{k}' must be a list")
    out: dict[bytes, int] = {}
    for t in v:
        _need(isinstance(t, list) and len(t) == 2 and all(type(x) is int for x in t),
              f"entries of '{k}' must be [origin, epoch]")
        i, e = t
        _need(0 <= i < len(origins) and 0 <= e < (1 << 63), f"bad entry in '{k}'")
        _need(origins[i] not in out, f"origin listed twice in '{k}'")
        out[origins[i]] = e
    return out


def header_from_wire(h: Any) -> tuple[Header, list[bytes]]:
    _need(isinstance(h, dict), "not a map")
    req = h.get("req")
    opt = h.get("opt", [])
    _need(isinstance(req, list) and all(isinstance(x, str) for x in req), "field 'req'")
    _need(isinstance(opt, list) and all(isinstance(x, str) for x in opt), "field 'opt'")
    unknown = [f for f in req if f not in KNOWN_MANDATORY]
    if unknown:
        raise PacketFeatureError(f"packet needs unknown mandatory feature(s): {', '.join(unknown)}")
    kind = h.get("kind")
    _need(kind in (KIND_UPDATE, KIND_SNAPSHOT), "field 'kind' must be 'update' or 'snapshot'")
    encoding = FEATURE_BLOCKS if kind == KIND_UPDATE else "zstd"
    _need(encoding in req, f"the body encoding {encoding!r} must be listed in 'req'")
    origins = h.get("origins")
    _need(isinstance(origins, list) and len(origins) <= MAX_ORIGINS
          and all(isinstance(o, bytes) and len(o) == SITE_ID_LEN for o in origins)
          and len(set(origins)) == len(origins), "field 'origins'")
    final = h.get("final")
    _need(isinstance(final, bool), "field 'final' must be a boolean")
    hdr = Header(
        kind=kind, family=_bytes(h, "family", 16), sender=_bytes(h, "from", SITE_ID_LEN),
        recipient=_bytes(h, "to", SITE_ID_LEN), packet_id=_bytes(h, "id", 16),
        seq=_int(h, "seq"), part=_int(h, "part"), final=final, created_ms=_int(h, "created"),
        vector=_pairs(h, "vector", origins), ranges=_triples(h, "ranges", origins),
        recv_seq=_int(h, "recv_seq"), waiting=_triples(h, "waiting", origins),
        ack_floor=_pairs(h, "ack_floor", origins), count=_int(h, "count", 0, 1 << 48),
        hlc_max=_int(h, "hlc_max"), body_len=_int(h, "body_len", 0, 1 << 62),
        body_hash=_bytes(h, "body_hash", 32), mandatory=req, advisory=opt)
    tip = h.get("tip")
    if tip is not None:
        _need(isinstance(tip, list) and len(tip) == 2 and type(tip[0]) is int
              and 0 < tip[0] < (1 << 63) and isinstance(tip[1], bytes)
              and len(tip[1]) == CSN_LEN, "field 'tip' must be [epoch, csn]")
        hdr.tip = (tip[0], tip[1])
    anchors = h.get("anchors", [])
    _need(isinstance(anchors, list), "field 'anchors' must be a list")
    for a in anchors:
        _need(isinstance(a, list) and len(a) == 2 and type(a[0]) is int
              and 0 <= a[0] < len(origins) and isinstance(a[1], bytes)
              and len(a[1]) == CSN_LEN, "entries of 'anchors' must be [origin, csn]")
        o = origins[a[0]]
        _need(o in hdr.ranges and hdr.ranges[o][0] > 0 and o not in hdr.anchors,
              "an anchor needs a range of its origin starting above 0")
        hdr.anchors[o] = a[1]
    reply = h.get("reply", False)
    _need(isinstance(reply, bool), "field 'reply' must be a boolean")
    hdr.reply = reply
    recovering = h.get("recovering", False)
    _need(isinstance(recovering, bool), "field 'recovering' must be a boolean")
    hdr.recovering = recovering
    ack_set = h.get("ack_set", b"")
    _need(isinstance(ack_set, bytes) and len(ack_set) in (0, 8), "field 'ack_set'")
    hdr.ack_set = ack_set
    acks = h.get("acks", [])
    _need(isinstance(acks, list), "field 'acks' must be a list")
    members: set[bytes] = set()
    for a in acks:
        _need(isinstance(a, list) and len(a) == 4 and type(a[0]) is int
              and 0 <= a[0] < len(origins) and type(a[1]) is int and 0 <= a[1] < (1 << 63)
              and (a[2] is None or isinstance(a[2], list)) and isinstance(a[3], bytes)
              and len(a[3]) == SIG_LEN, "entries of 'acks' must be [member, created, vector, sig]")
        m = origins[a[0]]
        _need(m not in members, "a member acknowledged twice in 'acks'")
        _need((a[2] is None) == (m == hdr.sender), "only the sender's own acknowledgement "
              "takes the header's vector")
        members.add(m)
        vec = None if a[2] is None else apply_ack_delta(hdr.vector,
                                                        _pairs({"v": a[2]}, "v", origins))
        hdr.acks.append((m, a[1], vec, a[3]))
    heads = h.get("heads", [])
    _need(isinstance(heads, list) and len(heads) <= MAX_HEADS
          and all(isinstance(x, bytes) and len(x) == BLOCK_HEADER_LEN for x in heads),
          f"field 'heads' must be at most {MAX_HEADS} signed block headers")
    hdr.heads = list(heads)
    forks = h.get("forks", [])
    _need(isinstance(forks, list) and len(forks) <= MAX_FORKS
          and all(isinstance(p, list) and len(p) == 2 and all(
              isinstance(x, bytes) and len(x) == BLOCK_HEADER_LEN for x in p) for p in forks),
          f"field 'forks' must be at most {MAX_FORKS} pairs of signed block headers")
    hdr.forks = [(a, b) for a, b in forks]
    kept = h.get("kept", [])
    _need(isinstance(kept, list) and len(kept) <= MAX_KEPT
          and all(isinstance(x, bytes) and len(x) == 32 for x in kept),
          f"field 'kept' must be at most {MAX_KEPT} block hashes")
    hdr.kept = list(kept)
    kept_by = h.get("kept_by", [])
    _need(isinstance(kept_by, list) and len(kept_by) <= MAX_KEPT
          and all(isinstance(p, list) and len(p) == 2 and isinstance(p[0], bytes)
                  and len(p[0]) == 32 and isinstance(p[1], bytes) and len(p[1]) == SIG_LEN
                  for p in kept_by),
          f"field 'kept_by' must be at most {MAX_KEPT} pairs [block hash, signature]")
    hdr.kept_by = [(k, sig) for k, sig in kept_by]
    if hdr.sealed:
        seal = h.get("seal")
        _need(isinstance(seal, dict) and isinstance(seal.get("epk"), bytes)
              and len(seal["epk"]) == 32, "sealed packets carry 'seal' with a 32-byte 'epk'")
        hdr.seal_epk = seal["epk"]
    if kind == KIND_SNAPSHOT:
        roster = h.get("roster")
        _need(isinstance(roster, list), "snapshot packets carry a roster")
        for m in roster:
            _need(isinstance(m, list) and len(m) == 5 and isinstance(m[0], str)
                  and isinstance(m[1], bytes) and len(m[1]) == SITE_ID_LEN
                  and isinstance(m[2], bytes) and len(m[2]) == 32
                  and isinstance(m[3], bytes) and len(m[3]) in (0, 32)
                  and type(m[4]) is int, "roster entry")
            hdr.roster.append({"name": m[0], "id": m[1], "ed25519": m[2], "x25519": m[3],
                               "priority": m[4]})
    else:
        for o, (lo, hi) in hdr.ranges.items():
            _need(hi > lo, "empty range")
    piece = h.get("piece")
    if FEATURE_PIECE in req:
        _need(kind == KIND_UPDATE and isinstance(piece, list) and len(piece) == 2
              and all(type(x) is int for x in piece)
              and 0 <= piece[0] < piece[1] <= MAX_PIECE_TOTAL
              and len(hdr.ranges) == 1, "a piece packet carries 'piece': [offset, total] "
              "within a block's size limit, and the range of that one block")
        hdr.piece = (piece[0], piece[1])
    elif FEATURE_RECORD_PIECE in req:
        # A record holds one value, at most MAX_VALUE_BYTES, plus its names and CSN.
        _need(kind == KIND_SNAPSHOT and isinstance(piece, list) and len(piece) == 2
              and all(type(x) is int for x in piece)
              and 0 <= piece[0] < piece[1] <= MAX_RECORD_PIECE_TOTAL
              and hdr.count == (1 if piece[0] == 0 else 0),
              "a record piece carries 'piece': [offset, total] within a record's size limit, "
              "and counts its record in the piece at offset 0 only")
        hdr.piece = (piece[0], piece[1])
    else:
        _need(piece is None, f"field 'piece' needs {FEATURE_PIECE!r} in 'req'")
    if kind != KIND_SNAPSHOT:
        _need(sum(hi - lo for lo, hi in hdr.ranges.values()) == hdr.count,
              "op count does not match the ranges")
    return hdr, origins


@dataclass
class Envelope:
    """A packet whose framing has been checked; the signature and body are not yet verified."""
    version: int
    header: Header
    origins: list[bytes]
    header_bytes: bytes
    signature: bytes
    body_offset: int
    size: int


def _read_exactly(f: BinaryIO, n: int) -> bytes:
    """``n`` bytes, or a packet error: a file that reads shorter than its size said is one
    being rewritten in place (a shared drop), or no plain file at all."""
    b = f.read(n)
    if len(b) != n:
        raise PacketFormatError("packet is shorter than its size said (the file changed while "
                                "it was read, or is not a plain file)")
    return b


def read_envelope(f: BinaryIO, size: int) -> Envelope:
    """Check size, magic, version and framing, and parse the header (in that order)."""
    if size < MIN_PACKET:
        raise PacketFormatError(f"file is {size} bytes, too small to be a packet "
                                f"(at least {MIN_PACKET})")
    f.seek(0)
    magic, version = _PREFIX.unpack(_read_exactly(f, _PREFIX.size))
    if magic != MAGIC:
        raise PacketFormatError("not a syncpack packet (bad magic)")
    if version not in SUPPORTED_VERSIONS:
        if version in OLDER_VERSIONS:
            raise PacketVersionError(
                f"packet format version {version} was made by an older syncpack; this one "
                f"reads format {FORMAT_VERSION} (changes signed by their origin)",
                hint="upgrade syncpack at the sending site and export again; the changes "
                     "this packet carried are sent again by the next export")
        if version > FORMAT_VERSION:
            raise PacketVersionError(f"packet format version {version} is newer than this "
                                     f"syncpack reads (up to {FORMAT_VERSION})")
        raise PacketVersionError(f"unknown packet format version {version}")
    f.seek(size - _FOOTER.size)
    hlen, sig, end = _FOOTER.unpack(_read_exactly(f, _FOOTER.size))
    if end != END_MAGIC:
        raise PacketFormatError("packet is truncated or damaged (bad end marker)")
    if hlen > MAX_HEADER_BYTES:
        raise PacketLimitError(f"header of {hlen} bytes exceeds the limit of {MAX_HEADER_BYTES}")
    if hlen > size - MIN_PACKET:
        raise PacketFormatError("header length runs past the start of the file")
    f.seek(size - _FOOTER.size - hlen)
    hbytes = _read_exactly(f, hlen)
    hdr, origins = header_from_wire(unpack_untrusted(hbytes))
    body_len = size - MIN_PACKET - hlen
    if hdr.body_len != body_len:
        raise PacketFormatError(f"header says the body is {hdr.body_len} bytes, "
                                f"the file holds {body_len}")
    return Envelope(version, hdr, origins, hbytes, sig, _PREFIX.size, size)


def _read_body_chunks(f: BinaryIO, env: Envelope, chunk: int = 1 << 20) -> Iterator[bytes]:
    f.seek(env.body_offset)
    left = env.header.body_len
    while left:
        b = f.read(min(chunk, left))
        if not b:
            raise PacketFormatError("packet is truncated")
        left -= len(b)
        yield b


def read_record_piece(f: BinaryIO, env: Envelope, unsealer=None) -> bytes:
    """The bytes of one record a record-piece snapshot packet carries (PACKET.md section 7.1):
    its body unsealed and decompressed, never more than the piece's span can hold."""
    off, total = env.header.piece
    cap = total - off
    d = zstandard.ZstdDecompressor(max_window_size=ZSTD_MAX_WINDOW).decompressobj()
    out = bytearray()
    try:
        for chunk in body_chunks(f, env, unsealer):
            mv = memoryview(chunk)
            for j in range(0, len(mv), 1024):
                if d.eof:
                    raise PacketBodyError("bytes after the end of the compressed body")
                out += d.decompress(mv[j:j + 1024])
                if len(out) > cap:
                    raise PacketBodyError(f"record piece at offset {off} runs past the "
                                          f"record's {total} bytes")
        if not d.eof or d.unused_data:
            raise PacketBodyError("record piece body is not one whole compressed frame")
    except zstandard.ZstdError as e:
        raise PacketBodyError(f"body does not decompress: {e}") from None
    if not out:
        raise PacketBodyError(f"record piece at offset {off} is empty")
    return bytes(out)


def decode_record(raw: bytes) -> Record:
    """One whole record joined from its pieces, with the limits and checks of a body's."""
    u = _untrusted_unpacker(body=True)
    try:
        u.feed(raw)
        objs = list(u)
    except (msgpack.BufferFull, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError,
            ValueError) as e:
        raise PacketBodyError(f"joined record does not decode: {e}") from None
    if len(objs) != 1 or u.tell() != len(raw):
        raise PacketBodyError("joined record pieces do not hold exactly one record")
    return _record(objs[0])


def body_hash_matches(f: BinaryIO, env: Envelope) -> bool:
    h = hashlib.blake2b(digest_size=32)
    for b in _read_body_chunks(f, env):
        h.update(b)
    return h.digest() == env.header.body_hash


def body_chunks(f: BinaryIO, env: Envelope, unsealer=None) -> Iterator[bytes]:
    """The body's bytes as the sender wrote them before sealing (an update packet's blocks),
    in chunks; the unsealer's failures are :class:`PacketSealError`."""
    chunks: Iterator[bytes] = _read_body_chunks(f, env)
    if not env.header.sealed:
        yield from chunks
        return
    if unsealer is None:
        raise PacketSealError("packet is sealed to its recipient; this site cannot open it")
    from syncpack.format import seal
    try:
        yield from seal.unseal(chunks, unsealer(env.header))
    except SealError as e:
        raise PacketSealError(str(e), hint=e.hint) from None


def _decoded_stream(f: BinaryIO, env: Envelope, unsealer=None) -> Iterator[Any]:
    """msgpack objects of the body, unsealed, decompressed and decoded with limits."""
    chunks: Iterator[bytes] = _read_body_chunks(f, env)
    try:
        if env.header.sealed:
            if unsealer is None:
                raise PacketSealError("packet is sealed to its recipient; this site cannot "
                                      "open it")
            from syncpack.format import seal
            # A malformed ephemeral key (all zeros, low order) fails here: one bad packet.
            chunks = seal.unseal(chunks, unsealer(env.header))
        d = zstandard.ZstdDecompressor(max_window_size=ZSTD_MAX_WINDOW).decompressobj()
        u = _untrusted_unpacker(body=True)
        for chunk in chunks:
            # Decompress 1 KiB at a time: a zstd block expands at most ~32768-fold (a 128 KiB
            # RLE block costs 4 bytes), so one call never returns more than ~32 MiB of a bomb.
            mv = memoryview(chunk)
            for j in range(0, len(mv), 1024):
                if d.eof:
                    raise PacketBodyError("bytes after the end of the compressed body")
                data = d.decompress(mv[j:j + 1024])
                for i in range(0, len(data), 1 << 20):
                    u.feed(data[i:i + (1 << 20)])
                    yield from u
        if not d.eof:
            raise PacketBodyError("packet body ends inside its compressed frame")
        leftover = d.unused_data
        if leftover:
            raise PacketBodyError("bytes after the end of the compressed body")
        try:
            u.unpack()
        except msgpack.OutOfData:
            return
        raise PacketBodyError("op stream ends inside an op")
    except SealError as e:
        raise PacketSealError(str(e), hint=e.hint) from None
    except zstandard.ZstdError as e:
        raise PacketBodyError(f"body does not decompress: {e}") from None
    except msgpack.BufferFull:
        raise PacketLimitError("an op in the packet exceeds the size limit") from None
    except (msgpack.ExtraData, msgpack.FormatError, msgpack.StackError, ValueError,
            TypeError) as e:
        raise PacketBodyError(f"malformed op stream: {e}") from None


def _bad(msg: str) -> PacketBodyError:
    return PacketBodyError(f"malformed record stream: {msg}")


def _record(obj) -> Record:
    """A snapshot record as decoded, checked field by field (every byte may be a lie)."""
    if not (isinstance(obj, list) and len(obj) == 4):
        raise _bad("a record is not a 4-element array")
    coll, key, c, val = obj
    if not (isinstance(coll, str) and isinstance(key, str) and isinstance(c, bytes)
            and len(c) == CSN_LEN and c[0] < 0x80 and (val is None or isinstance(val, bytes))):
        raise _bad("bad record fields")
    return Record(coll, key, c, val)


def iter_records(f: BinaryIO, env: Envelope, unsealer=None) -> Iterator[Record]:
    if env.header.piece is not None:
        # a record piece holds no whole record (read_record_piece; PACKET.md section 7.1)
        raise PacketBodyError("a piece of a record is read only with all its pieces")
    n = 0
    for obj in _decoded_stream(f, env, unsealer):
        n += 1
        yield _record(obj)
    if n != env.header.count:
        raise PacketBodyError(f"snapshot declares {env.header.count} records but holds {n}")


# --- writing ----------------------------------------------------------------------------------

class _HashingSink:
    def __init__(self, f: BinaryIO):
        self.f = f
        self.h = hashlib.blake2b(digest_size=32)
        self.n = 0

    def write(self, b: bytes) -> int:
        self.f.write(b)
        self.h.update(b)
        self.n += len(b)
        return len(b)


class BodyWriter:
    """Streams msgpack items through zstd (and, for sealed packets, the sealer) into a file
    object, hashing the bytes that land in the file.

    ``would_fit`` answers, without writing, whether ``n`` more raw bytes stay within ``budget``
    body bytes; near the limit it flushes a zstd block to learn the true size.  The sequence of
    calls alone decides the output, so any engine that feeds the same items in the same order
    writes the same bytes."""

    def __init__(self, f: BinaryIO, budget: int, level: int = ZSTD_LEVEL, sealer=None):
        self._sink = _HashingSink(f)
        self._sealer = sealer(self._sink) if sealer else None
        self._out = self._sealer or self._sink
        self.epk = self._sealer.epk if self._sealer else b""
        self.budget = raw_body_room(budget, sealer is not None)
        self._c = zstandard.ZstdCompressor(level=level).compressobj()
        self.out = 0
        self.pending = 0
        self.items = 0

    def _emit(self, b: bytes) -> None:
        if b:
            self._out.write(b)
            self.out += len(b)

    @staticmethod
    def _bound(n: int) -> int:
        return n + (n >> 7) + 64

    def room_needed(self, n: int) -> int:
        """Body bytes an empty body needs to take ``n`` raw bytes (what would_fit checks)."""
        return self.out + self._bound(n)

    def would_fit(self, n: int) -> bool:
        if self.out + self._bound(self.pending + n) <= self.budget:
            return True
        if self.pending:
            self._emit(self._c.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK))
            self.pending = 0
        return self.out + self._bound(n) <= self.budget

    def write(self, raw: bytes, items: int = 1) -> None:
        """Append encoded items (one, or several already joined: fewer compressor calls)."""
        self._emit(self._c.compress(raw))
        self.pending += len(raw)
        self.items += items

    def finish(self) -> tuple[int, bytes]:
        self._emit(self._c.flush(zstandard.COMPRESSOBJ_FLUSH_FINISH))
        if self._sealer:
            self._sealer.close_stream()
        return self._sink.n, self._sink.h.digest()


def raw_body_room(budget: int, sealed: bool) -> int:
    """The blocks' bytes a raw body of ``budget`` bytes holds: sealing takes its tags first."""
    from syncpack.format import seal
    return budget - (seal.overhead(budget) if sealed else 0)


class RawBodyWriter:
    """An update packet's body: stored blocks copied as they are (each is compressed already),
    through the sealer for sealed packets, hashed as they land in the file."""

    def __init__(self, f: BinaryIO, budget: int, sealer=None):
        self._sink = _HashingSink(f)
        self._sealer = sealer(self._sink) if sealer else None
        self._out = self._sealer or self._sink
        self.epk = self._sealer.epk if self._sealer else b""
        self.budget = raw_body_room(budget, sealer is not None)
        self.out = 0
        self.items = 0

    def room_needed(self, n: int) -> int:
        return self.out + n

    def would_fit(self, n: int) -> bool:
        return self.out + n <= self.budget

    def write(self, raw: bytes, items: int = 1) -> None:
        self._out.write(raw)
        self.out += len(raw)
        self.items += items

    def finish(self) -> tuple[int, bytes]:
        if self._sealer:
            self._sealer.close_stream()
        return self._sink.n, self._sink.h.digest()


def finish_packet(f: BinaryIO, header: Header, origins: list[bytes],
                  sign: Callable[[bytes], bytes]) -> int:
    """Write header and footer after a finished body; returns the packet's total size."""
    hbytes = packb(header.to_wire(origins))
    if len(hbytes) > MAX_HEADER_BYTES:
        raise ValueError("header too large")
    sig = sign(signed_bytes(FORMAT_VERSION, hbytes))
    f.write(hbytes)
    f.write(_FOOTER.pack(len(hbytes), sig, END_MAGIC))
    return _PREFIX.size + header.body_len + len(hbytes) + _FOOTER.size


def start_packet(f: BinaryIO) -> None:
    f.write(_PREFIX.pack(MAGIC, FORMAT_VERSION))


def header_reserve(template: "Header", origins: list[bytes]) -> int:
    """An upper bound of the encoded header of any part built from ``template``: the template
    encoded with every per-part field at its widest (ranges for every origin, 64-bit
    numbers, a sealing key)."""
    from dataclasses import replace
    big = (1 << 63) - 1
    worst = replace(template, packet_id=b"\xff" * 16, part=1 << 32, final=False,
                    ranges={o: (big, big) for o in origins}, count=1 << 48,
                    hlc_max=(1 << 64) - 1, body_len=1 << 62, body_hash=b"\xff" * 32,
                    mandatory=[*template.mandatory, FEATURE_SEAL], seal_epk=b"\xff" * 32)
    return len(packb(worst.to_wire(origins))) + 64


def framing_overhead() -> int:
    return MIN_PACKET


def encode_record(rec: Record) -> bytes:
    return packb([rec.collection, rec.key, rec.csn, rec.value])
