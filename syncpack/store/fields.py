"""Field stamps of the ``merge`` policy.  Owns the table ``field_history``: every version applied
in a merge collection (CSN, value, the field stamps it was given, the CSNs it replaced), kept
after it is superseded, because a concurrent write based on it may still arrive and is stamped
against it.  The rule itself is :mod:`syncpack.rules.merge`; this module reads and writes.

Everything runs on the caller's connection and inside its transaction."""

from __future__ import annotations

from typing import Any, Iterable

from syncpack.format import codec
from syncpack.format.csn import CSN_LEN
from syncpack.rules.conflict import Version
from syncpack.rules.merge import FieldVersion, Merged, merge, own_stamps, stamp_write


def to_fields(raw: bytes | None) -> dict[str, bytes] | None:
    """A stored value as field -> msgpack bytes; None for a tombstone or a value not a map."""
    if raw is None:
        return None
    v = codec.decode_value(raw)
    if not isinstance(v, dict) or not all(isinstance(k, str) for k in v):
        return None
    return {k: codec.packb(x) for k, x in v.items()}


def from_fields(fields: dict[str, bytes]) -> bytes:
    """The encoded record of merged fields, keys sorted so that every site encodes it alike."""
    return codec.encode_value({f: codec.unpackb(fields[f]) for f in sorted(fields)})


def _split(replaced: bytes) -> list[bytes]:
    return [replaced[i:i + CSN_LEN] for i in range(0, len(replaced), CSN_LEN)]


def _history(conn, collection: str, key: str, csns: Iterable[bytes]
             ) -> dict[bytes, FieldVersion]:
    out = {}
    for csn in csns:
        row = conn.execute("SELECT value, stamps FROM field_history WHERE collection=? AND "
                           "key=? AND csn=?", (collection, key, csn)).fetchone()
        if row is None:
            row = conn.execute("SELECT value, NULL FROM versions WHERE collection=? AND key=? "
                               "AND csn=?", (collection, key, csn)).fetchone()
        if row is not None:
            out[csn] = _version(csn, row[0], row[1])
    return out


def _version(csn: bytes, raw: bytes | None, stamps: bytes | None) -> FieldVersion:
    fields = to_fields(raw)
    st = codec.unpackb(stamps) if stamps is not None else own_stamps(csn, fields)
    return FieldVersion(csn, fields, st, raw if fields is None else None)


def note_write(conn, collection: str, key: str, csn: bytes, raw: bytes | None,
               replaced: bytes) -> None:
    """Record a version of a merge collection before it is applied (and before the versions it
    replaces are dropped): its stamps against the merged record of what it replaced."""
    if conn.execute("SELECT 1 FROM field_history WHERE collection=? AND key=? AND csn=?",
                    (collection, key, csn)).fetchone():
        return
    rs = _split(replaced)
    known = _history(conn, collection, key, rs)
    for r, v in known.items():   # keep what this write is based on, should a sibling follow
        conn.execute("INSERT OR IGNORE INTO field_history VALUES (?, ?, ?, ?, ?, ?)",
                     (collection, key, r, v.whole if v.fields is None else
                      from_fields(dict(v.fields)), codec.packb(dict(v.stamps)), b""))
    live = [v for v in known.values() if v.fields is not None]
    base = merge(live) if live else None
    stamps = stamp_write(csn, to_fields(raw), base.fields if base else None,
                         base.winners if base else {})
    conn.execute("INSERT INTO field_history VALUES (?, ?, ?, ?, ?, ?)",
                 (collection, key, csn, raw, codec.packb(stamps), replaced))


def _parents(conn, collection: str, key: str) -> dict[bytes, list[bytes]]:
    return {c: _split(r) for c, r in conn.execute(
        "SELECT csn, replaced FROM field_history WHERE collection=? AND key=?",
        (collection, key))}


def merged(conn, collection: str, key: str, vs: list[Version],
           priorities: dict[bytes, int]) -> Merged | None:
    """The merge of one key's surviving versions ``vs``."""
    if len(vs) == 1:
        v = vs[0]
        return merge([_version(v.csn, v.value, None)], priorities)
    hist = _history(conn, collection, key, [v.csn for v in vs])
    fvs = [hist.get(v.csn) or _version(v.csn, v.value, None) for v in vs]
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
