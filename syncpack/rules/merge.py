"""The ``merge`` policy: field-level merge of a key's surviving versions (docs/design.md §7).

Pure functions, no I/O.  A record is a map of fields; each field of each version carries a
*stamp*, the CSN of the write that last set (or removed) that field.  A write stamps the fields
it changed with its own CSN and keeps its base's stamps for the others, so two concurrent writes
that change different fields leave versions whose stamps say which of them owns which field, and
the visible record takes every field from the version that owns it.

Two live stamps of one field that are not ancestor and descendant are a field conflict; the
visible value is then the one with the higher (priority of the stamp's origin, stamp), which is
plain last-writer-wins while no member has a priority.  A tombstone among the survivors, or a
value that is not a map, is a whole-record conflict decided exactly as under ``lww``/``priority``.

Field values are handled as their msgpack bytes, so equality is exact (``1``, ``1.0`` and
``true`` differ) and the merged record encodes the same at every site.
"""

from __future__ import annotations

from typing import Iterable, Mapping, NamedTuple

from syncpack.format.csn import csn_origin

ABSENT = None   # a stamped field with no value: the write that stamped it removed the field


class FieldVersion(NamedTuple):
    csn: bytes
    fields: Mapping[str, bytes] | None   # field -> msgpack bytes; None: a tombstone or non-map
    stamps: Mapping[str, bytes]          # field -> CSN of the write that last set or removed it
    whole: bytes | None = None           # the version's raw value when it is not a map


class Merged(NamedTuple):
    """The visible record of a key under ``merge``."""
    fields: dict[str, bytes] | None      # None: no map to show (see ``whole``)
    whole: FieldVersion | None           # the whole-record pick when fields is None
    conflicts: dict[str, dict[bytes, bytes | None]]   # field -> {live stamp: value}, disagreeing
    winners: dict[str, bytes]            # field -> stamp of the visible value


def own_stamps(csn: bytes, fields: Mapping[str, bytes] | None) -> dict[str, bytes]:
    """Stamps of a version whose history is unknown: it set every field it has."""
    return {f: csn for f in fields} if fields else {}


def stamp_write(csn: bytes, new: Mapping[str, bytes] | None,
                base: Mapping[str, bytes] | None, base_stamps: Mapping[str, bytes]
                ) -> dict[str, bytes]:
    """The stamps of a write of ``new`` made over ``base`` (the merged record it replaced)."""
    if new is None:
        return {}
    base = base or {}
    out: dict[str, bytes] = {}
    for f in set(new) | set(base) | set(base_stamps):
        if new.get(f) != base.get(f):
            out[f] = csn
        elif f in base_stamps:
            out[f] = base_stamps[f]
        elif f in new:
            out[f] = csn
    return out


def _rank(stamp: bytes, priorities: Mapping[bytes, int]) -> tuple[int, bytes]:
    return priorities.get(csn_origin(stamp), 0), stamp


def _ancestors(csn: bytes, parents: Mapping[bytes, Iterable[bytes]], memo: dict) -> frozenset:
    if csn in memo:
        return memo[csn]
    memo[csn] = frozenset()          # cycles cannot happen (HLC order) but must not recurse
    seen: set[bytes] = set()
    todo = list(parents.get(csn, ()))
    while todo:
        p = todo.pop()
        if p not in seen:
            seen.add(p)
            todo.extend(parents.get(p, ()))
    memo[csn] = frozenset(seen)
    return memo[csn]


def merge(versions: Iterable[FieldVersion], priorities: Mapping[bytes, int] | None = None,
          parents: Mapping[bytes, Iterable[bytes]] | None = None) -> Merged | None:
    """The visible record of a key from its surviving versions, in any order.

    ``parents`` maps a write's CSN to the CSNs it replaced (as far as known); it only tells
    which stamps are older than others, so a missing entry can add a reported conflict but
    never changes a visible value while no member has a priority."""
    prio = priorities or {}
    vs = sorted({v.csn: v for v in versions}.values(), key=lambda v: v.csn)
    if not vs:
        return None
    if len(vs) == 1 and vs[0].fields is not None:
        v = vs[0]
        return Merged(dict(v.fields), None, {}, {f: s for f, s in v.stamps.items()})
    if any(v.fields is None for v in vs):
        win = max(vs, key=lambda v: _rank(v.csn, prio))
        return Merged(None, win, {}, {})
    memo: dict = {}
    par = parents or {}
    fields: dict[str, bytes] = {}
    conflicts: dict[str, dict[bytes, bytes | None]] = {}
    winners: dict[str, bytes] = {}
    names = sorted({f for v in vs for f in v.stamps} | {f for v in vs for f in v.fields})
    for f in names:
        cand: dict[bytes, bytes | None] = {}
        for v in vs:
            if f in v.stamps or f in v.fields:   # a version that never saw f has no say on it
                cand[v.stamps.get(f, v.csn)] = v.fields.get(f, ABSENT)
        live = [s for s in cand
                if not any(s in _ancestors(t, par, memo) for t in cand if t != s)]
        win = max(live, key=lambda s: _rank(s, prio))
        if len({cand[s] for s in live}) > 1:
            conflicts[f] = {s: cand[s] for s in sorted(live)}
        winners[f] = win
        if cand[win] is not ABSENT:
            fields[f] = cand[win]
    return Merged(fields, None, conflicts, winners)
