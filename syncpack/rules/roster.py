"""Which roster entry a site reads when a member's entry has several surviving versions.

Pure functions.  Every roster write (a priority, a retirement, its undo) rewrites the whole
entry, so two concurrent writes each carry the other's fields as their writer last saw them.
Read by last-writer-wins alone, a priority set by a member that had not yet heard of a
retirement would silently undo it, even one set by the retired member itself, whose packets
the family was told are refused from then on (docs/trust.md: nothing is dropped silently).

So the entry read is the newest surviving version's, except that it is retired when any
surviving version says so, and its base is the lowest of theirs (:func:`lowest_base`).  Only a write made after seeing the retirement (``rmreplica
--undo``) supersedes it, and that one replaces every version its writer held.  The result
depends only on the set of surviving versions, never on the order they arrived in, so every
site that holds the same ops reads the same roster.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence


def says_retired(value: Any) -> bool:
    """Whether one decoded roster version retires its member (as ``Member.from_value``
    reads the field)."""
    return isinstance(value, dict) and bool(value.get("retired", False))


def entry(versions: Iterable[tuple[bytes, Any]]) -> Any:
    """The entry read from a member's surviving ``(csn, decoded value)`` versions; a
    tombstone or an unreadable version is ``None``.  ``None`` when the newest is one."""
    vs = list(versions)
    if not vs:
        return None
    _csn, newest = max(vs, key=lambda v: v[0])
    if not isinstance(newest, dict):
        return None
    if not says_retired(newest) and any(says_retired(v) for _c, v in vs):
        newest = {**newest, "retired": True}
    low = lowest_base([v.get("base", []) for _c, v in vs if isinstance(v, dict)])
    if low != newest.get("base", []):
        newest = {**newest, "base": low}
    return newest


def lowest_base(bases: list[Any]) -> list[list]:
    """The member's base read from several versions of its entry (``[[origin, epoch], ...]``
    each): origin by origin the lowest, an origin missing from one of them 0 (left out).
    A member added at two sites at once, each seeding it with its own snapshot, has two
    bases; the one its snapshot did not hold claims epochs it lacks, which no site would
    ever send it.  The lower costs only ops sent again."""
    maps = []
    for b in bases:
        try:
            maps.append({bytes(o): e for o, e in b})
        except (TypeError, ValueError):
            return []       # unreadable: claim nothing held (the check at arrival refuses it)
    if not maps:
        return []
    common = set.intersection(*(set(m) for m in maps))
    return sorted([o, min(m[o] for m in maps)] for o in common
                  if min(m[o] for m in maps) > 0)


def retiring(versions: Sequence[tuple[bytes, Any]]) -> list[bytes]:
    """CSNs of the surviving versions that retire the member, sorted: the writes the family
    should be told retired it (a version that only changed a priority did not)."""
    return sorted(csn for csn, v in versions if says_retired(v))


def name_clashes(members: Iterable[tuple[str, bytes, bool]]) -> dict[str, str]:
    """Of members ``(name, site id, retired)`` whose names differ only in case, each one that
    does not keep the name, mapped to the one that does: of those no write retired, the
    lowest site id.

    One site refuses to add a name another member holds but for case (on most removable
    media the two packet directories are one), but two sites may each add one before they
    have exchanged.  Refused where it arrives, each entry stopped every packet carrying it,
    at every site of the other side, for good.  Both entries are kept instead, and every
    site reads the same one as retired, from the entries alone, whatever order they came
    in (a site id, unlike a write's stamp, never changes with later writes of the entry).
    Retiring the keeper gives the name to the next: the way back for a member a lying
    entry took its name from, as ``rmreplica --undo`` is for a lying retirement."""
    groups: dict[str, list[tuple[bytes, str]]] = {}
    for name, site_id, retired in members:
        if not retired:
            groups.setdefault(name.casefold(), []).append((site_id, name))
    out = {}
    for group in groups.values():
        if len(group) > 1:
            _id, keeper = min(group)
            out.update((name, keeper) for _i, name in group if name != keeper)
    return out
