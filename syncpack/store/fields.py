"""Field stamps of the ``merge`` policy.  Owns the table ``field_history``: every version applied
in a merge collection (CSN, value, the field stamps it was given, the CSNs it replaced), kept
after it is superseded, because a concurrent write based on it may still arrive and is stamped
against it.  The rule itself is :mod:`syncpack.rules.merge`; this module reads and writes.

Everything runs on the caller's connection and inside its transaction."""

from __future__ import annotations

import json
from typing import Any, Iterable, Iterator

from syncpack.errors import PatchBaseError, PatchError
from syncpack.format import codec, values
from syncpack.format.csn import CSN_LEN, pack_csn, split_csns
from syncpack.rules.conflict import Version
from syncpack.rules.merge import FieldVersion, Merged, merge, own_stamps, stamp_write


def to_fields(raw: bytes | None) -> dict[str, bytes] | None:
    """A stored value as field -> msgpack bytes; None for a tombstone or a value not a map."""
    if raw is None:
        return None
    v = codec.shown_value(raw)      # bytes that are not a value are not a map either
    if not isinstance(v, dict) or not all(isinstance(k, str) for k in v):
        return None
    return {k: codec.packb(x) for k, x in v.items()}


def from_fields(fields: dict[str, bytes]) -> bytes:
    """The encoded record of merged fields, keys sorted so that every site encodes it alike."""
    return codec.encode_value({f: codec.unpackb(fields[f]) for f in sorted(fields)})


def _version(csn: bytes, raw: bytes | None, stamps: dict | None) -> FieldVersion:
    fields = to_fields(raw)
    st = stamps if stamps is not None else own_stamps(csn, fields)
    return FieldVersion(csn, fields, st, raw if fields is None else None)


def _stamped(conn, collection: str, key: str, csn: bytes, memo: dict, depth: int = 0
             ) -> tuple[FieldVersion, bool] | None:
    """A version with its stamps, and whether they are final (everything it was based on is
    known); None if this site never held it.  Stamps left open when a write arrived before a
    version it replaced are worked out here, so they do not depend on the arrival order."""
    if csn in memo:
        return memo[csn]
    row = conn.execute("SELECT value, stamps, replaced FROM field_history WHERE collection=? "
                       "AND key=? AND csn=?", (collection, key, csn)).fetchone()
    if row is None:
        row = conn.execute("SELECT value FROM versions WHERE collection=? AND key=? AND csn=?",
                           (collection, key, csn)).fetchone()
        # a version applied as a plain insert replaced nothing: it set every field it has
        out = None if row is None else (_version(csn, row[0], None), True)
    elif row[1] is not None:
        out = (_version(csn, row[0], codec.unpackb(row[1])), True)
    elif depth > 200:
        out = (_version(csn, row[0], None), False)
    else:
        st, final = _stamps_of(conn, collection, key, csn, row[0], row[2], memo, depth + 1)
        out = (_version(csn, row[0], st), final)
    memo[csn] = out
    return out


def _stamps_of(conn, collection: str, key: str, csn: bytes, raw: bytes | None, replaced: bytes,
               memo: dict, depth: int = 0) -> tuple[dict[str, bytes], bool]:
    bases = [_stamped(conn, collection, key, r, memo, depth) for r in split_csns(replaced)]
    final = all(b is not None and b[1] for b in bases)
    live = [b[0] for b in bases if b is not None and b[0].fields is not None]
    base = merge(live) if live else None
    return stamp_write(csn, to_fields(raw), base.fields if base else None,
                       base.winners if base else {}), final


def note_write(conn, collection: str, key: str, csn: bytes, raw: bytes | None,
               replaced: bytes, local: bool = False) -> None:
    """Record a version of a merge collection before it is applied (and before the versions it
    replaces are dropped): its stamps against the merged record of what it replaced, or none
    yet if one of those has not arrived."""
    if local and not replaced or conn.execute(
            "SELECT 1 FROM field_history WHERE collection=? AND key=? AND csn=?",
            (collection, key, csn)).fetchone():
        # A local first write sets every field it has and is surely in versions: read from
        # there like a plain insert, kept here once a later write replaces it (below), so a
        # bulk load costs nothing.  An arriving one may have been replaced already: kept.
        return
    memo: dict = {}
    for r in split_csns(replaced):   # keep what this write is based on, should a sibling follow
        got = _stamped(conn, collection, key, r, memo)
        if got is not None and got[1]:
            conn.execute("INSERT OR IGNORE INTO field_history VALUES (?, ?, ?, ?, ?, ?)",
                         (collection, key, r, _raw_of(conn, collection, key, r),
                          codec.packb(dict(got[0].stamps)), b""))
    stamps, final = _stamps_of(conn, collection, key, csn, raw, replaced, memo)
    conn.execute("INSERT INTO field_history VALUES (?, ?, ?, ?, ?, ?)",
                 (collection, key, csn, raw, codec.packb(stamps) if final else None, replaced))


def _raw_of(conn, collection: str, key: str, csn: bytes) -> bytes | None:
    row = conn.execute("SELECT value FROM versions WHERE collection=? AND key=? AND csn=?",
                       (collection, key, csn)).fetchone()
    return None if row is None else row[0]


def _parents(conn, collection: str, key: str) -> dict[bytes, list[bytes]]:
    return {c: split_csns(r) for c, r in conn.execute(
        "SELECT csn, replaced FROM field_history WHERE collection=? AND key=?",
        (collection, key))}


def merged(conn, collection: str, key: str, vs: list[Version],
           priorities: dict[bytes, int]) -> Merged | None:
    """The merge of one key's surviving versions ``vs``."""
    if len(vs) == 1:
        v = vs[0]
        return merge([_version(v.csn, v.value, None)], priorities)
    memo: dict = {}
    fvs = []
    for v in vs:
        got = _stamped(conn, collection, key, v.csn, memo)
        fvs.append(got[0] if got is not None else _version(v.csn, v.value, None))
    return merge(fvs, priorities, _parents(conn, collection, key))


def visible_value(conn, collection: str, key: str, vs: list[Version],
                  priorities: dict[bytes, int]) -> bytes | None:
    """The visible value (msgpack) of a key in a merge collection, or None."""
    if len(vs) == 1:
        return vs[0].value
    m = merged(conn, collection, key, vs, priorities)
    if m is None:
        return None
    if m.fields is None:
        w = m.whole
        return None if w is None else next(v.value for v in vs if v.csn == w.csn)
    return from_fields(m.fields)


def decoded(fields: dict[str, bytes]) -> dict[str, Any]:
    return {f: codec.unpackb(b) for f, b in fields.items()}


# --- patches: writes that send only the fields they changed (formats/VALUES.md) ---------------

def _held_value(conn, collection: str, key: str, csn: bytes) -> tuple[bool, bytes | None]:
    """(whether this site holds it, its full value) of a version, surviving or superseded."""
    row = conn.execute("SELECT value FROM versions WHERE collection=? AND key=? AND csn=?",
                       (collection, key, csn)).fetchone()
    if row is None:
        row = conn.execute("SELECT value FROM field_history WHERE collection=? AND key=? "
                           "AND csn=?", (collection, key, csn)).fetchone()
    return (False, None) if row is None else (True, row[0])


def as_patch(conn, collection: str, key: str, replaced: bytes, raw: bytes | None
             ) -> tuple[bytes | None, bytes | None]:
    """A local write of a merge collection: (the op's value, the value kept here).

    Over exactly one version holding a map, the op carries only the fields that changed (when
    that is smaller) and this site keeps the record every receiver rebuilds from it, byte for
    byte; otherwise both are ``raw``.  Over several concurrent versions the record travels
    whole: a receiver could not know which merge of them the writer saw."""
    if raw is None or len(replaced) != CSN_LEN:
        return raw, raw
    new = to_fields(raw)
    held, base_raw = _held_value(conn, collection, key, replaced)
    base = to_fields(base_raw) if held else None
    if new is None or base is None:
        return raw, raw
    patch = values.make_patch(base, new)
    if len(patch) >= len(raw):
        return raw, raw
    return patch, values.encode_fields(values.patched(base, *values.read_patch(patch)))


def full_value(conn, collection: str, key: str, raw: bytes | None, replaced: bytes,
               merge_policy: bool) -> bytes | None:
    """The record an arriving op writes: its value, or, for a patch, the record rebuilt from
    the base it names.  Raises :class:`PatchError` (:class:`PatchBaseError` when the base is
    not here) rather than keep anything half-right."""
    if not values.claims_patch(raw):
        return raw
    where = f"a change of {collection}/{key}"
    # Rebuilt from its base whatever the policy here: a site that wrote under 'merge' while
    # another created the collection under another policy (concurrently, or before the
    # create arrived) sends patches, and refusing them stopped its packets at every site
    # for good.  Only the base must be here.
    try:
        setf, removed = values.read_patch(raw)
    except values.PatchFormatError as e:
        raise PatchError(f"{where} is a malformed patch ({e}); refused") from None
    if len(replaced) != CSN_LEN:
        raise PatchError(f"{where} sends only some fields but names {len(replaced) // CSN_LEN}"
                         f" versions it is based on, not one; refused")
    held, base_raw = _held_value(conn, collection, key, replaced)
    if not held:
        policy = "" if merge_policy else (f" ({collection!r} is not under the merge policy "
                                           f"here, which keeps the versions patches need)")
        raise PatchBaseError(f"{where} sends only the fields it changed, over version "
                             f"{replaced.hex()}, which this site does not hold{policy}; "
                             f"refused")
    base = to_fields(base_raw)
    if base is None:
        raise PatchError(f"{where} sends only some fields, over a version that is not a "
                         f"record of fields; refused")
    return values.encode_fields(values.patched(base, setf, removed))


def full_values(conn, ops) -> Iterable:
    """``ops`` with each patch replaced by the record it writes (for a replay of the
    changelog): the record kept when it was applied, while its version is held; else the one
    rebuilt from its base (under 'merge' every base stays held); else it stays a patch (the
    replay differs and says so, if the version survives)."""
    for op in ops:
        if values.claims_patch(op.value):
            held, full = _held_value(conn, op.collection, op.key,
                                     pack_csn(op.hlc, op.origin, op.seq))
            try:
                if not held:
                    full = full_value(conn, op.collection, op.key, op.value, op.replaced, True)
                op = type(op)(*op[:6], full, op.replaced)
            except PatchError:
                pass
        yield op


def record_of(conn, collection: str, key: str, csn: bytes, raw: bytes | None) -> bytes | None:
    """The record a version held in the changelog wrote (``raw`` unless it is a patch: then
    the record kept when it was applied)."""
    if not values.claims_patch(raw):
        return raw
    held, full = _held_value(conn, collection, key, csn)
    return full if held else raw


# --- field history in snapshots (formats/PACKET.md §7) --------------------------------------------

# Snapshot records of this pseudo-collection carry field_history rows, so a site seeded from a
# snapshot stamps and rebuilds writes made over versions the snapshot's records no longer hold.
HISTORY = "$fields"


def newest_history_csn(conn) -> bytes | None:
    return conn.execute("SELECT max(csn) FROM field_history").fetchone()[0]


def count_history(conn) -> int:
    return conn.execute("SELECT count(*) FROM field_history").fetchone()[0]


def history_records(conn) -> Iterator[tuple[str, str, bytes, bytes]]:
    """(collection, key, csn, value) snapshot records of every field_history row."""
    for coll, key, csn, value, stamps, replaced in conn.execute(
            "SELECT collection, key, csn, value, stamps, replaced FROM field_history "
            "ORDER BY collection, key, csn"):
        yield HISTORY, json.dumps([coll, key]), csn, codec.packb([coll, key, value, stamps,
                                                                  replaced])


def parse_history(key: str, csn: bytes, raw: bytes | None) -> tuple:
    """A field_history row from a snapshot record (untrusted); ValueError if malformed."""
    try:
        coll, k, value, stamps, replaced = codec.unpack_untrusted(raw)
        ok = (json.dumps([coll, k]) == key and isinstance(coll, str) and isinstance(k, str)
              and (value is None or isinstance(value, bytes)) and isinstance(replaced, bytes)
              and len(replaced) % CSN_LEN == 0
              and (stamps is None or isinstance(stamps, bytes)))
        if ok and stamps is not None:
            st = codec.unpack_untrusted(stamps)
            ok = isinstance(st, dict) and all(isinstance(f, str) and isinstance(c, bytes)
                                              and len(c) == CSN_LEN for f, c in st.items())
    except Exception:    # noqa: BLE001 - any malformed input is the same refusal
        ok = False
    if not ok:
        raise ValueError("malformed field history record")
    return coll, k, csn, value, stamps, replaced


def insert_history(conn, rows: list[tuple]) -> None:
    conn.executemany("INSERT OR IGNORE INTO field_history VALUES (?, ?, ?, ?, ?, ?)", rows)
