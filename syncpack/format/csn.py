"""Change sequence numbers and the hybrid logical clock that issues them.

A CSN is 20 bytes and sorts as bytes in the order the family agrees on:

    offset size field
    0      8    hlc      big-endian; (milliseconds since the Unix epoch << 16) | logical counter
    8      8    origin   the site id of the origin
    16     4    seq      position of the op inside its transaction, from 0

Every op of one transaction shares ``hlc`` and ``origin``, so no other op can sort between them:
a transaction is a contiguous run in CSN order, which is what lets packets be cut without
splitting transactions.  The origin in the middle makes CSNs unique without coordination.

The clock never goes backwards: a new hlc is ``max(last + 1, wall << 16)``, and ``observe`` lifts
``last`` to the highest hlc seen in an imported packet, so a new local CSN is greater than every
CSN the site has seen even when the wall clock jumps back.
"""

from __future__ import annotations

import struct
from operator import itemgetter
from typing import Iterable, NamedTuple

CSN_LEN = 20
SITE_ID_LEN = 8
LOGICAL_BITS = 16
# The one declaration of the layout; blocks and codec pack with it too.
CSN_STRUCT = struct.Struct(">Q8sI")
_CSN = CSN_STRUCT


class CSN(NamedTuple):
    hlc: int
    origin: bytes
    seq: int

    def pack(self) -> bytes:
        return _CSN.pack(self.hlc, self.origin, self.seq)

    @classmethod
    def unpack(cls, raw: bytes) -> "CSN":
        if len(raw) != CSN_LEN:
            raise ValueError(f"a CSN is {CSN_LEN} bytes, got {len(raw)}")
        return cls(*_CSN.unpack(raw))

    @property
    def txn(self) -> tuple[int, bytes]:
        """Identity of the transaction this op belongs to."""
        return (self.hlc, self.origin)


def pack_csn(hlc: int, origin: bytes, seq: int) -> bytes:
    return _CSN.pack(hlc, origin, seq)


def split_csns(joined: bytes) -> list[bytes]:
    """The CSNs of a concatenation of them (an op's ``replaced``)."""
    return [joined[i:i + CSN_LEN] for i in range(0, len(joined), CSN_LEN)]


def unpack_csn(raw: bytes) -> CSN:
    return CSN.unpack(raw)


def csn_hlc(csn: bytes) -> int:
    """The clock of a packed CSN, without unpacking the rest."""
    return int.from_bytes(csn[:8], "big")


def csn_origin(csn: bytes) -> bytes:
    """The origin site id of a packed CSN."""
    return bytes(csn[8:16])


_ORIGIN_BYTES = itemgetter(slice(8, 16))


def csn_origins(csns: Iterable[bytes]) -> set[bytes]:
    """The origin site ids of packed CSNs (bytes), without a Python call per CSN."""
    return set(map(_ORIGIN_BYTES, csns))


def csn_seq(csn: bytes) -> int:
    """The position in its transaction of a packed CSN's op."""
    return int.from_bytes(csn[16:20], "big")


def hlc_from_ms(ms: int) -> int:
    return ms << LOGICAL_BITS


def hlc_ms(hlc: int) -> int:
    return hlc >> LOGICAL_BITS


def next_hlc(last: int, wall_ms: int) -> int:
    """The hlc for a new local transaction: above ``last`` whatever the wall clock says."""
    return max(last + 1, hlc_from_ms(wall_ms))


def observe_hlc(last: int, seen: int) -> int:
    """Clock state after seeing a remote hlc (the caller has already applied the skew limit)."""
    return max(last, seen)


def format_csn(raw: bytes, names: dict[bytes, str] | None = None) -> str:
    """Human form ``<ms>.<counter>@<origin>#<seq>``; stable, and what ``--pick`` accepts."""
    c = CSN.unpack(raw)
    origin = (names or {}).get(c.origin, c.origin.hex())
    return f"{hlc_ms(c.hlc)}.{c.hlc & 0xFFFF}@{origin}#{c.seq}"
