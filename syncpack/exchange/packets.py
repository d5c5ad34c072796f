"""Cutting a stream of blocks into signed packets, and writing packet files safely.

:class:`CutRule` is the one cutting rule: the local exporter (:func:`build_update_packets`, which
has the blocks' bytes) and the Spark job (:func:`plan_packets`, which has only their sizes) both
follow it over the same blocks in the same order (:func:`order_blocks`) and get the same bytes.
The unit of cutting is a block (origin-signed, never altered or split by anyone else).
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import BinaryIO, Callable, Iterable

from syncpack.format import blocks, codec
from syncpack.format.codec import Header
from syncpack.errors import ExportError, MediumFullError, OutboxError
from syncpack.fileops import commit_temp, temp_name
from syncpack.format.names import check_site_name

DEFAULT_MAX_SIZE = 4 * 1024 ** 3 - 64 * 1024 ** 2   # below 4 GiB, so a packet fits FAT32
# The smallest medium size we promise works for any content but a single record larger than
# it: a transaction larger than a packet travels in parts (formats/BLOCKS.md section 4.2),
# each at most half a packet, so the headers and acknowledgements keep their room.
MIN_MAX_SIZE = 64 * 1024
PACKET_SUFFIX = ".spk"


# No medium holds more; a larger number is a typo (and past 2^64 it overflowed).
MAX_MAX_SIZE = 1 << 50


def parse_size(text: str) -> int:
    t = str(text).strip().upper().removesuffix("B").removesuffix("I")
    mult = 1
    for suffix, m in (("K", 1024), ("M", 1024 ** 2), ("G", 1024 ** 3), ("T", 1024 ** 4)):
        if t.endswith(suffix):
            t, mult = t[:-1], m
            break
    # ASCII digits only: Python's own parsing would also take '1e9', '65_536', '+3' and
    # digits of other scripts, none of which an administrator means as a size
    if not re.fullmatch(r"[0-9]+(\.[0-9]+)?", t, re.ASCII):
        raise ValueError(f"not a size: {text!r} (use bytes, or a number with K, M, G or T)")
    n = int(float(t) * mult) if "." in t else int(t) * mult
    if n > MAX_MAX_SIZE:
        raise ValueError(f"the largest packet must be at most 1024T ({MAX_MAX_SIZE} bytes), not {text!r}")
    if n < MIN_MAX_SIZE:
        raise ValueError(f"the largest packet must be at least 64K ({MIN_MAX_SIZE} bytes); a "
                         f"transaction larger than a packet travels in several packets")
    return n


def packet_name(seq: int, part: int, kind: str = "") -> str:
    """``<seq>-<part>[.snapshot].spk``: sortable by link sequence."""
    return f"{seq:010d}-{part:04d}{'.' + kind if kind else ''}{PACKET_SUFFIX}"


_PACKET_NAME = re.compile(r"(\d{10})-\d{4}(?:\.[a-z]+)?" + re.escape(PACKET_SUFFIX))


def seq_on_medium(out: Path, sender: str, recipient: str) -> int:
    """The highest link sequence number of the packets already in ``out`` for ``recipient``
    from ``sender`` (0 for none, or none readable).  A site restored from a backup has
    forgotten the packets it wrote since: numbered from its store alone, its next packet took
    the name of one still on the medium, not yet imported, and replaced it (its ops lost)."""
    try:
        names = os.listdir(packet_dir(out, sender, recipient))
    except (OSError, ExportError):
        return 0
    return max((int(m[1]) for n in names if (m := _PACKET_NAME.fullmatch(n))), default=0)


def packet_dir(out: Path, sender: str, recipient: str) -> Path:
    """Media layout: OUT/<recipient>/<sender>/.  Both names are checked again here, whatever
    the roster holds, and the result must stay inside OUT."""
    check_site_name(recipient, ExportError)
    check_site_name(sender, ExportError)
    d = Path(out) / recipient / sender
    if os.path.commonpath([os.path.abspath(d), os.path.abspath(out)]) != os.path.abspath(out):
        raise ExportError(f"packets for {recipient!r} would be written outside {out}")
    return d


def size_text(n: int) -> str:
    """``n`` bytes as a --max-size value, rounded up to whole KiB (or bytes if small)."""
    return f"{max(-(-n // 1024), MIN_MAX_SIZE // 1024)}K"


def packet_id(seed: bytes | None, sender: bytes, recipient: bytes, seq: int, part: int) -> bytes:
    """Random by default; derived from a seed when reproducible packets are wanted (golden
    vectors, engine comparisons)."""
    if seed is None:
        return os.urandom(16)
    return hashlib.blake2b(seed + sender + recipient + seq.to_bytes(8, "big")
                           + part.to_bytes(4, "big"), digest_size=16).digest()


def sealer_for(seal_to: bytes | None, pid: bytes, seed: bytes | None):
    if not seal_to:
        return None
    from syncpack.format.seal import SealWriter
    return lambda sink: SealWriter(sink, seal_to, pid, seed)


def sealed_fields(template: Header, epk: bytes) -> dict:
    """The header fields that tell a sealed body (by its ephemeral public key) from a plain one."""
    if not epk:
        return {}
    return {"mandatory": [*template.mandatory, codec.FEATURE_SEAL], "seal_epk": epk}


def body_budget(template: Header, origins: list[bytes], max_size: int) -> int:
    """Bytes a body may take in a packet of at most ``max_size`` bytes whose header is built
    from ``template``; too little room for any body is the user's --max-size error."""
    budget = max_size - codec.framing_overhead() - codec.header_reserve(template, origins)
    if budget < 1024:
        raise ExportError(f"--max-size {max_size} leaves no room for a body next to a "
                          f"header for {len(origins)} origins; --max-size "
                          f"{size_text(max_size - budget + 1024)} or more would do")
    return budget


def piece_template(template: Header, piece: tuple[int, int]) -> Header:
    """The header fields that make a part a piece of one block (an update) or of one record
    (a snapshot)."""
    feature = (codec.FEATURE_RECORD_PIECE if template.kind == codec.KIND_SNAPSHOT
               else codec.FEATURE_PIECE)
    return replace(template, mandatory=[*template.mandatory, feature], piece=piece)


def record_pieces(template: Header, max_size: int, n: int,
                  sealed: bool) -> list[tuple[int, int]]:
    """(offset, length) of the pieces a snapshot record of ``n`` encoded bytes is cut into
    (formats/PACKET.md section 7.1): each piece, compressed in the worst case, fits the body
    of a record-piece packet next to its header."""
    pt = piece_template(template, (1 << 62, 1 << 62))
    room = codec.raw_body_room(body_budget(pt, pt.origin_table(), max_size), sealed)
    # the BodyWriter's bound: n + n/128 + 64 compressed bytes at most
    step = (room - 64) * 128 // 129
    while step + (step >> 7) + 64 > room:
        step -= 1
    return [(off, min(step, n - off)) for off in range(0, n, step)]


def too_big_error(what: str, n: int, max_size: int, need: int) -> ExportError:
    return ExportError(f"one {what} ({n} bytes) is larger than --max-size "
                       f"{max_size} allows; --max-size {size_text(need)} or more "
                       f"would do", hint="packets are cut between blocks and between "
                                         "records, never inside one")


class MediumRoom:
    """The free space of the medium an export writes to, spent as its parts are planned.

    An export that needs more than the medium holds (a backlog larger than the stick) writes
    the whole blocks that fit, ends with a final part, and leaves the rest for the next trip:
    what was written is recorded as sent, so the next export begins after it.  Writing
    nothing instead left a peer's backlog stuck for good on a medium of that size.  Costs are
    bounds (whole allocation units, and one unit more per file for its directory entry and
    its temporary name), so a medium's own bookkeeping never turns a planned fit into a
    full medium; if it does anyway, the export fails whole, as before."""

    def __init__(self, free: int, unit: int):
        self.unit = max(unit, 512)
        self.free = free
        # a margin beyond the per-file bounds, kept free: the file system's own metadata
        # grows too, and a medium filled to its last byte fails the export whole
        self.reserve = 16 * self.unit + 64 * 1024
        self.left = free - self.reserve

    @classmethod
    def of(cls, directory: Path) -> "MediumRoom | None":
        """The room of the file system ``directory`` is (or will be made) on; None when it
        cannot be told."""
        p = Path(os.path.abspath(directory))
        while not p.exists() and p != p.parent:
            p = p.parent
        try:
            st = os.statvfs(p)
        except (OSError, AttributeError):
            return None
        return cls(st.f_bavail * st.f_frsize, st.f_frsize or st.f_bsize)

    def cap(self, max_size: int) -> int:
        """The packet size limit for this medium: half its room at most (a block larger
        than the medium could never go), never below the smallest limit allowed."""
        return min(max_size, max(MIN_MAX_SIZE, self.left // 2))

    def cost(self, n: int) -> int:
        """What a file of at most ``n`` bytes takes of the medium."""
        return -(-n // self.unit) * self.unit + self.unit

    MEDIUM_FULL_HINT = ("free space on the medium (packets on it can go once the far end has "
                        "imported them) or use a larger one")

    @classmethod
    def nothing_fit_text(cls, did_not_fit: dict[str, int], out, written: int = 0) -> str:
        """What an export that found no room for even one op tells: not "nothing to send",
        nor that its packets carry part of what waits (``written`` packets without ops may
        have fitted: the site's vector), and the reserve that the free space shown must
        also hold."""
        left = ", ".join(f"{n} op(s) for {peer}" for peer, n in did_not_fit.items())
        room = cls.of(Path(out))
        has = (f" (it has {room.free} bytes free; an export keeps {room.reserve} bytes of "
               f"a medium free and needs room for a packet of a whole block beyond them)"
               if room is not None else "")
        what = (f"only {written} packet(s) without ops (this site's vector and "
                f"acknowledgements) were written" if written else "no packet was written")
        return f"the medium at {out} is full: not one op fitted, {what}; {left} did not fit{has}"


class CutRule:
    """Where a stream of blocks is cut into parts: a part takes blocks while their bytes fit
    its body's room, and a block never splits.  Decided from sizes alone, so the writer that
    has the bytes (:func:`build_update_packets`) and the planner that has only their sizes
    (:func:`plan_packets`) cut in the same places."""

    def __init__(self, template: Header, max_size: int, sealed: bool):
        self.max_size = max_size
        self.budget = body_budget(template, template.origin_table(), max_size)
        self.room = codec.raw_body_room(self.budget, sealed)
        # A piece packet's header is a little larger (its 'piece' field and feature name).
        pt = piece_template(template, (1 << 62, 1 << 62))
        self.piece_room = codec.raw_body_room(body_budget(pt, pt.origin_table(), max_size),
                                              sealed)
        self.out = 0
        self.count = 0
        # the most a part's file holds besides its blocks' bytes (header, framing, sealing)
        self.extra = max_size - min(self.room, self.piece_room)

    def oversized(self, n: int) -> bool:
        """A block no part can hold: it travels as pieces (:meth:`pieces`)."""
        return n > self.room

    def pieces(self, n: int) -> list[tuple[int, int]]:
        """(offset, length) of the pieces a block of ``n`` bytes is cut into, each the body of
        a packet of its own (formats/PACKET.md section 6.4); the parts around it start
        afresh."""
        self.out = self.count = 0
        return self.pieces_of(n)

    def pieces_of(self, n: int) -> list[tuple[int, int]]:
        return [(off, min(self.piece_room, n - off)) for off in range(0, n, self.piece_room)]

    def would_cut(self, n: int) -> bool:
        """Whether a block of ``n`` bytes (not oversized) begins a new part."""
        return self.out + n > self.room and self.count > 0

    def fits_medium(self, medium: MediumRoom, spent: int, n: int) -> bool:
        """Whether a block of ``n`` bytes can still go on ``medium``, ``spent`` being what the
        parts finished so far take there: with it, the open part, and room to finish after
        it (a final part of its own after a block that travels as pieces)."""
        if self.oversized(n):
            need = (medium.cost(self.extra + self.out) if self.count else 0) + sum(
                medium.cost(self.extra + ln) for _off, ln in self.pieces_of(n))
        elif self.would_cut(n):
            need = medium.cost(self.extra + self.out) + medium.cost(self.extra + n)
        else:
            need = medium.cost(self.extra + self.out + n)
        return spent + need + medium.cost(self.extra) <= medium.left

    def place(self, n: int, items: int) -> bool:
        """Take a block of ``n`` bytes and ``items`` ops; True when a new part must begin
        with it.  A block that no part can hold is an error."""
        cut = self.would_cut(n)
        if cut:
            self.out = self.count = 0
        if self.out + n > self.room:
            raise too_big_error("block", n, self.max_size, self.max_size - self.budget + n)
        self.out += n
        self.count += items
        return cut


def write_records(series: "PartSeries", records: Iterable[bytes], max_size: int,
                  sealed: bool, progress: Callable[[int], None] | None = None) -> None:
    """Write encoded snapshot records into ``series``, cutting between records; a record
    larger than an empty part travels as record pieces, one part each, and the records after
    it open a new part (formats/PACKET.md section 7.1).  The caller finishes the series."""
    for raw in records:
        if not series.fits(len(raw)):
            if series.count:
                series.cut()
            if not series.fits(len(raw)):
                for off, ln in record_pieces(series.template, max_size, len(raw), sealed):
                    # the record counts once, in its first piece
                    series.write(raw[off:off + ln], 1 if off == 0 else 0)
                    series.cut(piece=(off, len(raw)))
                if progress:
                    progress(1)
                continue
        series.write(raw, 1)
        if progress:
            progress(1)


@dataclass
class PartInfo:
    path: Path
    header: Header
    size: int


Opener = Callable[[int], tuple[BinaryIO, Callable[[bool], Path]]]


class PartSeries:
    """The consecutive parts of one export (or snapshot) to one peer.

    Each part is opened under a temporary name, its body streamed within the size budget and
    finished with its own header, then committed under its final name.  On failure
    :meth:`abort` removes every file of the series: an export that did not finish is not
    recorded, so its finished parts go too and the next export writes the same ranges again."""

    def __init__(self, template: Header, sign: Callable[[bytes], bytes], max_size: int,
                 opener: Opener, seed: bytes | None = None, seal_to: bytes | None = None,
                 raw_body: bool = False):
        self.template, self.sign, self.opener = template, sign, opener
        self.raw_body = raw_body
        self.seed, self.seal_to, self.max_size = seed, seal_to, max_size
        self.origins = template.origin_table()
        self.budget = body_budget(template, self.origins, max_size)
        self.parts: list[PartInfo] = []
        self.part = -1
        self._open()

    def _open(self) -> None:
        self.part += 1
        t = self.template
        self.f, self._commit = self.opener(self.part)
        codec.start_packet(self.f)
        self.pid = packet_id(self.seed, t.sender, t.recipient, t.seq, self.part)
        sealer = sealer_for(self.seal_to, self.pid, self.seed)
        self.body = (codec.RawBodyWriter(self.f, self.budget, sealer=sealer) if self.raw_body
                     else codec.BodyWriter(self.f, self.budget, sealer=sealer))
        self.count = 0

    def fits(self, n: int) -> bool:
        return self.body.would_fit(n)

    def write(self, raw: bytes, items: int) -> None:
        self.body.write(raw, items)
        self.count += items

    def too_big(self, n: int, what: str) -> ExportError:
        return too_big_error(what, n, self.max_size,
                             self.max_size - self.budget + self.body.room_needed(n))

    def finish(self, final: bool, **fields) -> PartInfo:
        length, digest = self.body.finish()
        template = self.template
        if fields.get("piece") is not None:
            template = piece_template(template, fields.pop("piece"))
        hdr = replace(template, part=self.part, final=final, packet_id=self.pid,
                      count=self.count, body_len=length, body_hash=digest,
                      **sealed_fields(template, self.body.epk), **fields)
        size = codec.finish_packet(self.f, hdr, self.origins, self.sign)
        info = PartInfo(self._commit(True), hdr, size)
        self.parts.append(info)
        return info

    def cut(self, **fields) -> None:
        """Finish this part (not the last) and open the next."""
        self.finish(False, **fields)
        self._open()

    def abort(self) -> None:
        if not self.parts or self.parts[-1].header.part != self.part:
            self._commit(False)
        for p in self.parts:
            p.path.unlink(missing_ok=True)


@dataclass(frozen=True)
class BlockRef:
    """One stored block as a packet writer needs it: where it sits in its origin's history,
    its newest op (for the next part's anchor) and its bytes, copied as they are."""
    origin: bytes
    lo: int
    hi: int
    hlc_first: int
    hlc_last: int
    last_seq: int
    data: bytes

    @classmethod
    def of(cls, raw: bytes) -> "BlockRef":
        """A block's bytes as a writer takes them (decodes it once for its newest op)."""
        cols = blocks.decode_block(raw)
        info = blocks.read_block_header(raw)
        return cls(info.origin, info.lo, info.hi, info.hlc_first, info.hlc_last,
                   cols.txn_lens[-1] - 1, raw)


def order_blocks(per_origin: Iterable[list[BlockRef]]) -> list[BlockRef]:
    """The order blocks travel in: by their first clock (so an importer merging them by CSN
    holds few at a time), each origin's in epoch order.  One rule for every engine."""
    return sorted((b for bs in per_origin for b in bs),
                  key=lambda b: (b.hlc_first, b.origin, b.lo))


def build_update_packets(blocks: Iterable[BlockRef], template: Header,
                         sign: Callable[[bytes], bytes], max_size: int, opener: Opener,
                         seed: bytes | None = None,
                         progress: Callable[[int], None] | None = None,
                         seal_to: bytes | None = None,
                         medium: MediumRoom | None = None) -> list[PartInfo]:
    """Write ``blocks`` (in :func:`order_blocks` order) as one or more packets of at most
    ``max_size`` bytes, cutting only between blocks.  The blocks are copied, never decoded.

    ``opener(part)`` returns a writable file and a ``commit(ok)`` callable that makes the file
    durable under its final name and returns that name (or discards it when ``ok`` is false).
    The template gives every header field except the per-part ones.  With ``seal_to`` (the
    recipient's X25519 public key) every body is sealed so only the recipient can read it.
    With ``medium``, blocks stop where the medium would be full (:class:`MediumRoom`): the
    parts written so far stay, the last of them final (the ranges they reach tell where)."""
    template = blocks_template(template)
    rule = CutRule(template, max_size, bool(seal_to))
    if medium is not None and medium.cost(rule.extra) > medium.left:
        return []       # not even a packet without blocks: none for this peer
    series = PartSeries(template, sign, max_size, opener, seed, seal_to, raw_body=True)
    fields = _PartFields(template)
    spent = counted = 0     # what the parts finished so far take of the medium
    try:
        it = iter(blocks)
        b = next(it, None)
        while b is not None:
            n = len(b.data)
            if medium is not None:
                for p in series.parts[counted:]:
                    spent += medium.cost(p.size)
                counted = len(series.parts)
                if not rule.fits_medium(medium, spent, n):
                    break
            nxt = next(it, None)
            if rule.oversized(n):
                # A block larger than any part (one record larger than the medium, or
                # another origin's block a relay cannot re-cut): its bytes travel in pieces,
                # one packet each, joined and verified whole by the importer.
                if series.count or fields.ranges:
                    series.cut(**fields.take())
                spans = rule.pieces(n)
                for k, (off, ln) in enumerate(spans):
                    series.write(b.data[off:off + ln], b.hi - b.lo)
                    fields.add(b)
                    f = fields.take()
                    f["piece"] = (off, n)
                    if k == len(spans) - 1 and nxt is None:
                        series.finish(True, **f)
                    else:
                        series.cut(**f)
            else:
                if rule.place(n, b.hi - b.lo):
                    series.cut(**fields.take())
                series.write(b.data, b.hi - b.lo)
                fields.add(b)
            if progress:
                progress(b.hi - b.lo)
            b = nxt
        if series.part == len(series.parts):
            series.finish(True, **fields.take())
    except BaseException:
        series.abort()
        raise
    if medium is not None:
        medium.left -= sum(medium.cost(p.size) for p in series.parts)
    return series.parts


def blocks_template(template: Header) -> Header:
    # The body is blocks, whatever the template says (they are compressed one by one).
    return replace(template, mandatory=[codec.FEATURE_BLOCKS] + [
        f for f in template.mandatory if f not in ("zstd", codec.FEATURE_BLOCKS)])


class _PartFields:
    """The per-part header fields (ranges, newest clock, anchors) of the blocks added since
    the last :meth:`take`: one rule whether the bytes are at hand or only the plan is."""

    def __init__(self, template: Header):
        # The template's anchors (CSN of the op just below a range, where the chain alone
        # cannot show what the range continues) go with the first part only: a later part's
        # first block of each origin chains onto that origin's last block in the part before.
        self.anchors: dict[bytes, bytes] = dict(template.anchors)
        self._begin()

    def _begin(self) -> None:
        self.ranges: dict[bytes, tuple[int, int]] = {}
        self.hlc_max = 0

    def add(self, b) -> None:
        lo_hi = self.ranges.get(b.origin)
        self.ranges[b.origin] = (lo_hi[0] if lo_hi else b.lo, b.hi)
        if b.hlc_last > self.hlc_max:
            self.hlc_max = b.hlc_last

    def take(self) -> dict:
        ranges = dict(self.ranges)
        out = {"ranges": ranges, "hlc_max": self.hlc_max,
               "anchors": {o: self.anchors[o] for o, (lo, _hi) in ranges.items()
                           if lo > 0 and o in self.anchors}}
        self.anchors = {o: c for o, c in self.anchors.items() if o not in ranges}
        self._begin()
        return out


# --- packets whose bodies are made elsewhere ---------------------------------------------------

@dataclass
class PlannedPart:
    """One part of a :class:`PacketPlan`: which of the plan's blocks its body holds
    (positions ``first`` up to ``end``), in the order given, and its header's fields."""
    part: int
    packet_id: bytes
    first: int
    end: int
    count: int
    fields: dict
    span: tuple[int, int] | None = None   # a piece: (offset, length) in block ``first``


@dataclass
class PacketPlan:
    """Where one peer's stream of blocks is cut into packets, decided from the blocks' sizes
    alone, so that bodies can be made by workers that never see the signing key while the
    signer finishes the packets (:func:`finish_planned_packets`).  The cuts are
    :func:`build_update_packets`'s, so both give the same bytes."""
    template: Header
    max_size: int
    budget: int                 # raw bytes a body may hold (what a RawBodyWriter is given)
    seal_to: bytes | None
    parts: list[PlannedPart]


def plan_packets(metas: Iterable, sizes: Iterable[int], template: Header, max_size: int,
                 seed: bytes | None = None, seal_to: bytes | None = None) -> PacketPlan:
    """Cut the blocks described by ``metas`` (anything with origin, lo, hi, hlc_last and
    last_seq; in :func:`order_blocks` order) of ``sizes`` bytes into parts."""
    template = blocks_template(template)
    rule = CutRule(template, max_size, bool(seal_to))
    parts: list[PlannedPart] = []
    fields = _PartFields(template)
    state = {"first": 0, "count": 0}

    def close(end: int, span: tuple[int, int] | None = None, total: int = 0) -> None:
        k = len(parts)
        f = fields.take()
        if span is not None:
            f["piece"] = (span[0], total)
        parts.append(PlannedPart(k, packet_id(seed, template.sender, template.recipient,
                                              template.seq, k),
                                 state["first"], end, state["count"], f, span))
        state.update(first=end, count=0)

    i = 0
    for i, (b, n) in enumerate(zip(metas, sizes)):
        if rule.oversized(n):       # as build_update_packets: pieces, one part each
            if state["count"] or fields.ranges:
                close(i)
            for span in rule.pieces(n):
                state.update(first=i, count=b.hi - b.lo)
                fields.add(b)
                close(i + 1, span, n)
            i += 1
            continue
        if rule.place(n, b.hi - b.lo):
            close(i)
        state["count"] += b.hi - b.lo
        fields.add(b)
        i += 1
    if state["count"] or fields.ranges or not parts:
        close(i)
    return PacketPlan(template, max_size, rule.budget, seal_to, parts)


@dataclass(frozen=True)
class MadeBody:
    """What a worker reports of a body it made for a planned part: its length and BLAKE2b-256
    hash as written (sealed, if it is), and the sealing key's public half."""
    length: int
    digest: bytes
    epk: bytes = b""


def finish_planned_packets(plan: PacketPlan, sign: Callable[[bytes], bytes], opener: Opener,
                           made: list[MadeBody],
                           read_body: Callable[[int], Iterable[bytes]]) -> list[PartInfo]:
    """Write each planned part: prefix, its body (``read_body(part)`` yields the made bytes,
    which are hashed again on the way and must be what the worker reported), then the header
    signed here, and commit it.  On any failure no part of the series stays behind."""
    origins = plan.template.origin_table()
    written: list[PartInfo] = []
    commit = None
    try:
        for pp, body in zip(plan.parts, made, strict=True):
            f, commit = opener(pp.part)
            codec.start_packet(f)
            h = hashlib.blake2b(digest_size=32)
            n = 0
            for chunk in read_body(pp.part):
                f.write(chunk)
                h.update(chunk)
                n += len(chunk)
            if (n, h.digest()) != (body.length, body.digest):
                raise ExportError(f"the body made for part {pp.part} of the packet to "
                                  f"{plan.template.recipient.hex()} changed on its way to the "
                                  f"writer ({n} bytes read, {body.length} reported)",
                                  hint="check the staging location; nothing was recorded, "
                                       "run the export again")
            fields = dict(pp.fields)
            template = plan.template
            if fields.get("piece") is not None:
                template = piece_template(template, fields.pop("piece"))
            sealed = sealed_fields(template, body.epk)
            hdr = replace(template, part=pp.part, final=pp.part == len(plan.parts) - 1,
                          packet_id=pp.packet_id, count=pp.count, body_len=n,
                          body_hash=body.digest, **sealed, **fields)
            size = codec.finish_packet(f, hdr, origins, sign)
            path = commit(True)
            commit = None
            written.append(PartInfo(path, hdr, size))
    except BaseException:
        if commit is not None:
            commit(False)
        for p in written:
            p.path.unlink(missing_ok=True)
        raise
    return written


def prepare_outbox(out: str | os.PathLike, create: bool, how_to_create: str) -> Path:
    """The directory an export writes into.  Missing, it is an error unless ``create``: a
    mistyped path would otherwise swallow packets that are then recorded as sent, and an
    unmounted medium would fill the disk under its mount point.  ``how_to_create`` tells the
    user how to ask for it (a flag, a config key)."""
    p = Path(out)
    if p.is_dir():
        return p
    if p.exists():
        raise OutboxError(f"outbox {p} is not a directory", hint="name a directory")
    if not create:
        raise OutboxError(f"outbox {p} does not exist",
                          hint=f"mount the medium or correct the path, or {how_to_create}")
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as e:    # e.g. a file where a parent directory should be
        raise OutboxError(f"cannot create outbox {p}: {e.strerror or e}",
                          hint="name a directory on a writable medium") from None
    return p


def atomic_opener(directory: Path, name_for: Callable[[int], str],
                  outbox: Path | None = None) -> Opener:
    """Files written under a temporary name, fsynced, renamed, and the directory fsynced: a
    crash or a full medium never leaves a partial packet under a packet's name.  ``directory``
    is made inside ``outbox`` (one the export found there when it began), which must still
    be there."""

    def opener(part: int):
        final = directory / name_for(part)
        tmp = temp_name(final)
        if outbox is not None and not outbox.is_dir():
            # The medium was removed (or the directory deleted) during the export: made
            # again, it would hold only the packets from here on, the earlier ones gone
            # with it, and the export would say all were written.
            raise OutboxError(f"outbox {outbox} is gone: the medium was removed or the "
                              f"directory deleted while the export wrote to it",
                              hint="put the medium back and export again; nothing was "
                                   "recorded as sent")
        try:
            # A file where a directory should be (OUT itself, or OUT/<to>/<from>) is a typed
            # export error naming the directory, like any other failure to write there.
            directory.mkdir(parents=True, exist_ok=True)
            if part == 0:
                # Only this sender writes here, under its site lock: a temporary file here
                # is what an export killed before its rename left, which nothing else removes.
                for left in directory.glob(f".*{PACKET_SUFFIX}.*.tmp"):
                    left.unlink(missing_ok=True)
            f = open(tmp, "wb")
        except OSError as e:
            raise _os_error(e, directory) from None

        def commit(ok: bool) -> Path:
            try:
                if not ok:
                    f.close()
                    tmp.unlink(missing_ok=True)
                    return final
                commit_temp(f, tmp, final)
                return final
            except OSError as e:
                try:
                    f.close()
                except OSError:
                    pass
                tmp.unlink(missing_ok=True)
                raise _os_error(e, directory) from None

        return _GuardedFile(f, tmp, directory), commit

    return opener


class _GuardedFile:
    """Turns write errors (a full medium above all) into typed errors and drops the temp file."""

    def __init__(self, f: BinaryIO, tmp: Path, directory: Path):
        self._f, self._tmp, self._dir = f, tmp, directory

    def write(self, b: bytes) -> int:
        try:
            return self._f.write(b)
        except OSError as e:
            try:
                self._f.close()
            except OSError:
                pass
            self._tmp.unlink(missing_ok=True)
            raise _os_error(e, self._dir) from None

    def __getattr__(self, name):
        return getattr(self._f, name)


def _os_error(e: OSError, directory: Path) -> ExportError:
    if e.errno == errno.EFBIG:
        return MediumFullError(f"the medium at {directory} takes no file this large "
                               f"({e.strerror}); no partial packet was left",
                               hint="use a smaller --max-size (a batch outbox's max_size; a "
                                    "FAT32 medium takes files below 4G); nothing was sent")
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        # A snapshot goes whole on one medium; an update export planned by the free space
        # it read (MediumRoom), so something else filled the medium meanwhile.  Either way
        # nothing of this run is kept (a smaller --max-size cuts the same bytes finer).
        return MediumFullError(f"the medium at {directory} is full ({e.strerror}); "
                               f"no partial packet was left",
                               hint="free space on the medium (is another program writing "
                                    "to it?) or use a larger one, and export again; nothing "
                                    "was sent")
    if e.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return ExportError(f"cannot write packets into {directory}: {e.strerror or e}",
                           hint="the medium is read-only or this user may not write there "
                                "(a write-protect switch, a mount option, permissions); make "
                                "it writable or choose another --out; nothing was sent")
    return ExportError(f"cannot write packets into {directory}: {e.strerror or e}",
                       hint="check the medium and run the export again; nothing was recorded "
                            "as sent")

