"""Reading packet files and the one verifier every packet kind goes through.

Update packets, replica-creation snapshots, resync snapshots and ``lspacket`` all use
:func:`verify`, in the fixed order written in ``formats/PACKET.md`` §9: (framing, in
:func:`open_packet`) size, magic, version, header; then family, recipient, sender membership,
signature, body hash, sealing policy, clock skew.  Each failure raises a :class:`PacketError`
subclass naming the check; nothing here writes to the store.

Only regular files are opened (a FIFO or a device named on the command line or lying in an
import directory would block a reader forever while it holds the site lock).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterable, Iterator

from syncpack.format import blocks, codec, keys
from syncpack.store import chain
from syncpack.format.codec import Envelope, Header
from syncpack.format.csn import hlc_from_ms
from syncpack.errors import (ACCESS_HINT, ClockSkewError, PacketBodyError, PacketFamilyError,
                             PacketFormatError, PacketPolicyError, PacketRecipientError,
                             PacketSenderError, PacketSignatureError)
from syncpack.format.names import check_site_name
from syncpack.exchange.packets import PACKET_SUFFIX
from syncpack.site import Site, wall_ms

DEFAULT_SKEW_MS = 24 * 3600 * 1000


def printable(text: object) -> str:
    """``text`` with control characters escaped, so a file name cannot forge output lines."""
    s = str(text)
    if s.isprintable():
        return s
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in s)


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


@dataclass
class JoinedPiecesPacket:
    """The pieces of one block (formats/PACKET.md section 6.4), joined: applied like an update
    packet whose body is that one block, under a header made from the pieces' own (each
    verified, signed by the sender).  ``pieces`` are the piece packets, to be recorded with it."""
    path: Path
    header: Header
    data: bytes
    pieces: list

    def close(self) -> None:
        pass


def piece_bytes(site: Site, pk: OpenPacket) -> bytes:
    """The block bytes a verified piece packet carries, unsealed; they must lie inside the
    block's length its header gives."""
    data = b"".join(codec.body_chunks(pk.f, pk.env, keys.unsealer(site.path)))
    off, total = pk.header.piece
    if not data or off + len(data) > total:
        raise PacketBodyError(f"piece at offset {off} holds {len(data)} bytes of a block of "
                              f"{total}: it runs past the block's end or is empty")
    return data


def is_regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def open_packet(path: str | os.PathLike) -> OpenPacket:
    """Size, magic, version and header checks; raises PacketError subclasses (whose messages
    do not repeat the path: every caller reports the file it named)."""
    path = Path(path)
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer; the fstat below refuses it.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except PermissionError as e:
        # the file may well be sound: a fresh copy would meet the same permissions
        raise PacketFormatError(f"cannot read: {e.strerror}",
                                hint=f"give this user read access to it ({ACCESS_HINT})") from None
    except OSError as e:
        raise PacketFormatError(f"cannot read: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise PacketFormatError("not a regular file (a FIFO, device or socket is never "
                                    "read as a packet)")
        os.set_blocking(fd, True)
        f = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    try:
        env = codec.read_envelope(f, st.st_size)
    except BaseException:
        f.close()
        raise
    return OpenPacket(path, f, env)


def find_packet_files(paths: Iterable[str | os.PathLike]) -> list[tuple[Path, bool]]:
    """(file, named explicitly) pairs; directories are searched recursively, through links
    to directories too (each directory once).  In a directory, hidden and temporary files and
    anything that is not a regular file are left alone; a path named on the command line is
    returned whatever it is, for the caller to refuse.  So is a directory that cannot be
    listed, and a packet's name that leads nowhere (a link whose file is gone): packets there
    must not pass unseen."""
    out: list[tuple[Path, bool]] = []

    def unlisted(e: OSError) -> None:
        out.append((Path(e.filename), True))

    for p in paths:
        p = Path(p)
        if p.is_dir():
            seen: set[str] = set()
            for root, dirs, files in os.walk(p, onerror=unlisted, followlinks=True):
                real = os.path.realpath(root)
                if real in seen:        # a link back to a directory already searched
                    dirs[:] = []
                    continue
                seen.add(real)
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                for fn in sorted(files):
                    if fn.startswith(".") or fn.endswith(".tmp"):
                        continue
                    f = Path(root) / fn
                    if is_regular(f):
                        out.append((f, False))
                    elif fn.endswith(PACKET_SUFFIX) and not f.exists():
                        out.append((f, True))
        else:
            out.append((p, True))
    return out


def told_if_unreadable(path: Path, named: bool) -> bool:
    """Whether a file that does not open as a packet is told about (import rejects it,
    lspacket lists it): one named on the command line, or one found in a directory that
    begins as a packet or bears a packet's name (a stick pulled out mid-copy cuts a packet
    short before its magic).  Any other file there is not a packet, and left alone."""
    return named or has_magic(path) or path.name.endswith(PACKET_SUFFIX) and is_regular(path)


def has_magic(path: Path) -> bool:
    """Whether a file found in a directory is to be told about when it does not open as a
    packet: it begins as one, or it cannot even be read to tell."""
    if not is_regular(path):
        return False
    try:
        with open(path, "rb") as f:
            return f.read(len(codec.MAGIC)) == codec.MAGIC
    except PermissionError:
        return True
    except OSError:
        return False


def check_signature(pk: OpenPacket, public: bytes) -> bool:
    return keys.verify(public, pk.env.signature,
                       codec.signed_bytes(pk.env.version, pk.env.header_bytes))


def check_skew(h: Header, sender_name: str, now_ms: int | None = None,
               skew_ms: int = DEFAULT_SKEW_MS) -> None:
    """Neither the packet's changes nor its creation time may lie further in the future than
    the skew limit: a far-future stamp would drag our clock, or freeze what we record as the
    sender's newest report."""
    now = wall_ms() if now_ms is None else now_ms
    if h.hlc_max > hlc_from_ms(now + skew_ms):
        raise ClockSkewError(
            f"packet from {sender_name} carries changes stamped "
            f"{(h.hlc_max >> 16) - now} ms ahead of this site's clock (limit {skew_ms} ms)",
            hint=f"the sender's clock ran fast when it wrote them, or this site's runs slow: "
                 f"check both; changes stamped while a clock ran fast are taken once this "
                 f"site's clock is within the limit of them ('syncpack status' at "
                 f"{sender_name} says when); the packet was not applied")
    if h.created_ms > now + skew_ms:
        raise ClockSkewError(
            f"packet from {sender_name} says it was made {h.created_ms - now} ms in the "
            f"future (limit {skew_ms} ms)")


def snapshot_roster(h: Header) -> dict[bytes, dict]:
    return {m["id"]: m for m in h.roster}


def verify(site: Site, pk: OpenPacket, *, now_ms: int | None = None,
           skew_ms: int = DEFAULT_SKEW_MS) -> None:
    """Every check after the framing, in the fixed order.

    A joined site checks the sender against its own roster.  A site that has not joined yet
    (``mkreplica import``) has only the snapshot's roster, and accepts it only if it holds
    this site under its own name and public key (the operator confirms the sender's key
    fingerprint, which ``mkreplica import`` prints)."""
    h = pk.header
    if site.joined and h.family != site.family_id:
        raise PacketFamilyError(f"packet belongs to family {h.family.hex()}, "
                                f"this site to {site.family_id.hex()}")
    if h.recipient != site.site_id:
        to = site.name_of(h.recipient)
        if to == h.recipient.hex():
            # a site this one does not know yet (a new member's snapshot): the name its own
            # unverified roster gives, said as such
            named = [m["name"] for m in h.roster if m["id"] == h.recipient]
            if named:
                to = f"{printable(named[0])!r} (as the packet's roster names it, {to})"
        raise PacketRecipientError(f"packet is addressed to {to}, not to this site "
                                   f"({site.name})")
    if site.joined:
        member = site.members_by_id(include_retired=True).get(h.sender)
        if member is None:
            raise PacketSenderError(
                f"sender {h.sender.hex()} is not a member of family {site.family_name!r} as "
                f"far as this site knows",
                hint="if a site joined recently, import first the packets of the member that "
                     "added it (they carry the roster), then this one again; it is not "
                     "applied until then")
        if member.retired:
            raise PacketSenderError(f"sender {member.name} has been retired from the family")
        name, public = member.name, member.ed25519
    else:
        if h.kind != codec.KIND_SNAPSHOT:
            raise PacketSenderError("this site has not joined a family; only its "
                                    "replica-creation packet can be imported here")
        roster = snapshot_roster(h)
        for m in h.roster:
            check_site_name(m["name"], PacketBodyError)
        mine = roster.get(site.site_id)
        me = keys.read_own_public(site.path)
        if mine is None or mine["ed25519"] != me.ed25519 or mine["name"] != site.name:
            raise PacketSignatureError("snapshot's roster does not hold this site's public key",
                                       hint="the snapshot was made for another key pair")
        sender = roster.get(h.sender)
        if sender is None:
            raise PacketSenderError("snapshot's sender is not in its own roster")
        name, public = sender["name"], sender["ed25519"]
    if not check_signature(pk, public):
        raise PacketSignatureError(f"signature does not verify with {name}'s key")
    if not codec.body_hash_matches(pk.f, pk.env):
        raise PacketBodyError("packet body does not match the hash in its signed header")
    check_skew(h, name, now_ms, skew_ms)
    if site.joined:
        verify_acks(site, h, name, now_ms, skew_ms)
    # last: a packet refused only for this is otherwise verified, and its header is taken in
    # (the refusing site must still learn what the sender lacks, see sync.import_packets)
    if site.joined and site.requires_sealing() and not h.sealed:
        raise PacketPolicyError(f"family {site.family_name!r} requires sealed packets and this "
                                f"one from {name} is not sealed")


def resolved_acks(h: Header) -> list[tuple[bytes, int, dict[bytes, int], bytes]]:
    """The header's acknowledgements with the sender's own vector filled in."""
    return [(m, c, h.vector if v is None else v, sig) for m, c, v, sig in h.acks]


def verify_acks(site: Site, h: Header, sender: str, now_ms: int | None = None,
                skew_ms: int = DEFAULT_SKEW_MS) -> None:
    """Each acknowledgement must verify with the key of the member it names: a relaying
    member cannot speak for another.  Members we do not know (yet) are passed over."""
    now = wall_ms() if now_ms is None else now_ms
    members = site.members_by_id(include_retired=True)
    for m, created, vec, sig in resolved_acks(h):
        member = members.get(m)
        if member is None:
            continue
        if m == h.sender and created != h.created_ms:
            raise PacketBodyError(f"{sender}'s own acknowledgement is not dated like its packet")
        if not keys.verify(member.ed25519, sig,
                           codec.ack_signed_bytes(h.family, m, created, vec)):
            raise PacketSignatureError(f"acknowledgement of {member.name} in a packet from "
                                       f"{sender} does not verify with {member.name}'s key",
                                       hint="a member cannot speak for another; the packet "
                                            "was not applied")
        if created > now + skew_ms:
            raise ClockSkewError(f"acknowledgement of {member.name} in a packet from {sender} "
                                 f"is dated {created - now} ms in the future")


def signature_state(site: Site | None, pk: OpenPacket) -> str:
    """For ``lspacket``: 'valid', 'invalid' or 'unchecked' (no key to check against).  The
    signature covers the body through its hash, so a body that does not match it is
    'invalid' too (import refuses it)."""
    h = pk.header
    public = None
    if site is not None and site.joined and h.family == site.family_id:
        m = site.members_by_id(include_retired=True).get(h.sender)
        public = m.ed25519 if m is not None else None
    elif h.kind == codec.KIND_SNAPSHOT:
        r = snapshot_roster(h).get(h.sender)
        public = r["ed25519"] if r is not None else None
    if public is None:
        return "unchecked"
    return "valid" if check_signature(pk, public) and codec.body_hash_matches(pk.f, pk.env) \
        else "invalid"


# --- the blocks of an update packet ------------------------------------------------------------

def packet_blocks(site: Site, pk: OpenPacket) -> Iterator[bytes]:
    """The raw blocks of a verified update packet's body, unsealed, one at a time."""
    if isinstance(pk, JoinedPiecesPacket):
        return blocks.split_blocks(iter([pk.data]))     # exactly one block, or refused
    if pk.header.piece is not None:
        raise PacketBodyError("a piece of a block is applied only with all its pieces")
    return blocks.split_blocks(codec.body_chunks(pk.f, pk.env, keys.unsealer(site.path)))


def verify_block(site: Site, raw: bytes, sender: str, chained: bool = True,
                 prev_in_packet: bytes | None = None) -> blocks.BlockInfo:
    """One block of a packet from ``sender``, against its **origin's** key (whoever relayed
    it) and, if ``chained``, the chain: onto ``prev_in_packet`` (the origin's block just before
    it in the same packet) or else onto the block we hold; errors name the origin.  Called as the block is reached, after
    the blocks before it applied, so an origin added by a roster change earlier in the same
    packet is known by then."""
    origin = bytes(raw[6:14]) if len(raw) >= 14 else b""
    member = site.members_by_id(include_retired=True).get(origin)
    try:
        info = blocks.read_block_header(raw, site.family_id)
        if member is None:
            raise PacketSenderError(f"packet from {sender} carries changes of origin "
                                    f"{origin.hex()}, which was never a member of family "
                                    f"{site.family_name!r}; refused")
        if not chained:
            prev = None
        elif prev_in_packet is not None:
            prev = prev_in_packet       # a root cannot follow a block in the same packet
        elif info.prev_hash == blocks.ZERO_HASH and info.lo:
            prev = None                 # a chain root: its origin no longer held the block before
        else:
            prev = chain.expected_prev(site.conn, origin, info.lo)
        return blocks.verify_block(info, member.ed25519, site.family_id, prev)
    except (blocks.BlockError, blocks.BlockSignatureError) as e:
        raise name_block_error(site, e, origin, sender) from None


def name_block_error(site: Site, e: PacketBodyError, origin: bytes, sender: str):
    """``e`` with the block's origin named as the operator knows it, and the sender said
    (once: the error may pass through here again on its way out)."""
    member = site.members_by_id(include_retired=True).get(origin)
    if member is not None and f"origin {origin.hex()}" in e.message:
        e.message = e.message.replace(f"origin {origin.hex()}",
                                      f"origin {member.name} ({origin.hex()})", 1)
        e.message += f" (in a packet from {sender})"
        e.args = (e.message,)
    return e
