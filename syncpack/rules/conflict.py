"""Conflict rules: which surviving version of a key is visible.

Pure functions.  A key's state is the set of versions no known write has superseded; the visible
version is a deterministic function of that set (and of the replicated roster, for ``priority``),
so every site that holds the same ops shows the same value, whatever order they arrived in.
Comparing an incoming op with the current value only would not have this property under
``priority`` (see tests/test_conflicts.py, the order-dependence trap).
"""

from __future__ import annotations

from typing import Iterable, NamedTuple

from syncpack.format.csn import csn_origin

POLICIES = ("lww", "priority", "merge")


class Version(NamedTuple):
    csn: bytes
    deleted: bool
    value: bytes | None  # msgpack-encoded value; None for a tombstone


_origin = csn_origin


def pick(versions: Iterable[Version], policy: str, priorities: dict[bytes, int]) -> Version | None:
    """The visible version among the surviving ones (a tombstone may win: then nothing shows)."""
    vs = list(versions)
    if not vs:
        return None
    if policy == "priority":
        return max(vs, key=lambda v: (priorities.get(_origin(v.csn), 0), v.csn))
    return max(vs, key=lambda v: v.csn)
