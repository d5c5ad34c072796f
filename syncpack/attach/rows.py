"""Pure rules for attached tables: how a row's primary key becomes a record key and back, how
a row becomes a record value, and in which order tables are written.  No I/O.

A record of an attached table is a map {column: value} whose values keep their SQLite type
exactly: msgpack keeps integers (64-bit) apart from floats, text apart from bytes, and nil, so
``typeof()`` is the same at every site.

The record key is the primary key: a single-column key of INTEGER or TEXT value is that value as
text (``42``, ``p-100``); any other key (several columns, a REAL or BLOB value, text that
starts with ``[``) is a JSON array,
with bytes as ``{"hex": "..."}`` and floats in their exact repr.
"""

from __future__ import annotations

import json
from math import copysign, isnan
from itertools import chain, islice
from operator import itemgetter, methodcaller
from typing import Any, Callable, Iterable

from syncpack.format import codec
from syncpack.format.values import identical

INT_AFFINITY = ("INTEGER", "REAL", "NUMERIC")


def encode_key(values: tuple, single: bool | None = None) -> str:
    """The record key of a row whose primary key holds ``values`` (in key column order)."""
    if len(values) == 1 and (single is None or single):
        v = values[0]
        if isinstance(v, str) and not v.startswith("["):
            return v
        if isinstance(v, int) and not isinstance(v, bool):
            return str(v)
    return json.dumps([_jsonable(v) for v in values], separators=(",", ":"),
                      ensure_ascii=False)


def keys_at(part: list[tuple], at: list[int]) -> list[str]:
    """The record keys (:func:`encode_key`) of rows whose primary key values sit at the
    positions ``at`` (in key column order).  A single column of all TEXT that none starts
    with '[', or of all INTEGER, is spelt in C, the common case; any other row by
    encode_key."""
    if len(at) > 1:
        return [encode_key(v, False) for v in map(itemgetter(*at), part)]
    vals = list(map(itemgetter(at[0]), part))
    kinds = set(map(type, vals))
    if kinds == {str}:
        # Joined, one text in C says whether any starts with '[' (a key holding NUL before
        # '[' is only looked at again, one by one).
        joined = "\0".join(vals)
        if not joined.startswith("[") and "\0[" not in joined:
            return vals
    elif kinds == {int}:
        return list(map(str, vals))
    return [encode_key((v,), True) for v in vals]


def named_records(m: int) -> Callable[[list[tuple]], list[bytes]]:
    """Rows laid out as each of ``m`` columns' name beside its value -> their records, as
    ``codec.encode_value(dict(zip(names, values)))`` would encode them, in C: the
    interleaved names and values pack as an array of 2m elements, whose header is then
    swapped for the header of a map of m."""
    packer = codec.value_packer()
    body = itemgetter(slice(len(codec.array_header(2 * m)), None))
    headed = codec.map_header(m).__add__
    return lambda part: list(map(headed, map(body, map(packer, part))))


def named_keyed_records(columns: list[str], pk: list[str]
                        ) -> Callable[[list[tuple]], tuple[list[str], list[bytes]]]:
    """Rows laid out as each column's name beside its value -> (their record keys, their
    records): :func:`keys_at` and :func:`named_records` together."""
    records = named_records(len(columns))
    key_at = [2 * columns.index(c) + 1 for c in pk]
    return lambda part: (keys_at(part, key_at), records(part))


def oversized(raws: list[bytes | None], limit: int) -> int | None:
    """The position of the first record of ``raws`` longer than ``limit`` bytes, or None
    (the common case, found in C)."""
    if max(map(len, filter(None, raws)), default=0) <= limit:
        return None
    return next(i for i, r in enumerate(raws) if r is not None and len(r) > limit)


def overlong(keys: list[str], raws: list[bytes | None], limit: int) -> int | None:
    """The position of the first key of ``keys`` longer than ``limit`` bytes of UTF-8 whose
    row is present (its record in ``raws`` is not None), or None.  A row gone is passed over:
    its key was never captured (the row born and gone), so refusing its delete would stop the
    capture for good, even after the application removed the row.  The common case is found
    in C: no key has more than ``limit // 4`` characters, and a character is at most 4
    bytes."""
    if max(map(len, keys), default=0) <= limit // 4:
        return None
    return next((i for i, (k, r) in enumerate(zip(keys, raws)) if r is not None
                 and len(k) > limit // 4 and len(k.encode("utf-8", "surrogatepass")) > limit),
                None)


NOT_A_ROW = "the record is not a row of the table"
NOT_ITS_KEY = "the record's primary key columns are not its key"


def refused_records(records: list, keys: list[str], pk: list[str]) -> dict[int, str]:
    """Why the decoded ``records`` of ``keys`` (in step) cannot go into a table keyed by
    ``pk``, by position: not a map (or not a value at all), or a map whose key columns are not
    its key.  Empty in the common case, found in C."""
    if set(map(type, records)) <= {dict}:
        return dict.fromkeys(key_mismatches(records, keys, pk), NOT_ITS_KEY)
    maps = [i for i, r in enumerate(records) if r.__class__ is dict]
    out = {i: NOT_A_ROW for i, r in enumerate(records) if r.__class__ is not dict}
    for j in key_mismatches([records[i] for i in maps], [keys[i] for i in maps], pk):
        out[maps[j]] = NOT_ITS_KEY
    return out


def key_mismatches(records: list[dict], keys: list[str], pk: list[str]) -> list[int]:
    """The positions of ``records`` whose primary key columns are not those of their record
    key (``keys``, in step): a record a lying member signed for one key that would write
    another key's row, or a row without its key (a NULL or missing key column)."""
    if len(pk) == 1:
        # the common cases in C: text keys that are their own value, integer keys their text
        try:
            vals = list(map(itemgetter(pk[0]), records))
        except KeyError:
            vals = None
        if vals is not None:
            kinds = set(map(type, vals))
            if kinds == {str} and vals == keys and \
                    not any(map(methodcaller("startswith", "["), keys)):
                return []
            if kinds == {int} and list(map(str, vals)) == keys:
                return []
    elif records:
        # several columns: one JSON text for the lot against the keys joined the same way
        try:
            vals = list(map(itemgetter(*pk), records))
        except KeyError:
            vals = None
        if vals is not None and set(map(type, chain.from_iterable(vals))) <= {str, int} and \
                json.dumps(vals, separators=(",", ":"), ensure_ascii=False) == \
                "[" + ",".join(keys) + "]":
            return []
    bad = []
    for i, (r, k) in enumerate(zip(records, keys)):
        vals = tuple(r.get(c) for c in pk)
        if None in vals or any(c not in r for c in pk) or encode_key(vals) != k:
            bad.append(i)
    return bad


def _jsonable(v: Any) -> Any:
    if isinstance(v, bytes):
        return {"hex": v.hex()}
    if isinstance(v, float):
        return {"real": repr(v)}
    return v


def _from_json(v: Any) -> Any:
    if isinstance(v, dict):
        if len(v) == 1 and "hex" in v:
            return bytes.fromhex(v["hex"])
        if len(v) == 1 and "real" in v:
            return float(v["real"])
    return v


def decode_key(key: str, affinities: list[str]) -> tuple | None:
    """The primary key values of record key ``key`` of a table whose key columns have these
    affinities (one per column); None when ``key`` is no such key: it does not decode, has
    another number of values, or holds a value no key column holds (NULL, true, a list),
    all of which only a lying member sends.  (It may still be another spelling of a row's key:
    see attach/writer.py, ``row_key``.)"""
    if len(affinities) == 1 and not key.startswith("["):
        if affinities[0] == "BLOB":
            # No affinity converts for us: a number written as text must be bound as one.
            try:
                return (int(key),) if str(int(key)) == key else (key,)
            except ValueError:
                return (key,)
        return (key,)
    try:
        vals = json.loads(key)
        if not isinstance(vals, list) or len(vals) != len(affinities):
            return None
        out = tuple(_from_json(v) for v in vals)
    except (ValueError, TypeError, KeyError, OverflowError, RecursionError):
        return None
    if not all(type(v) in (int, float, str, bytes) for v in out):
        return None
    return out


def key_candidates(key: str, affinities: list[str]) -> list[tuple]:
    """The primary key values a row whose record key is ``key`` may hold, most likely first:
    :func:`decode_key`'s, and, in a single key column of no declared type, the TEXT that
    spells a number as well (the TEXT '2' and the INTEGER 2 are two keys there, both "2")."""
    vals = decode_key(key, affinities)
    if vals is None:
        return []
    if len(affinities) == 1 and affinities[0] == "BLOB" and vals[0] != key:
        return [vals, (key,)]
    return [vals]


def without_unset(raw: bytes, base_raw: bytes, defaults: dict[str, Any]) -> bytes:
    """Record ``raw`` of a row, less the columns its key's record ``base_raw`` lacks (added
    to the table after it) that still hold their default (``defaults``): the same row, since a
    record that lacks a column stands for the column's default (appdb.Writer), but no longer
    a change of those columns."""
    try:
        base = codec.decode_value(base_raw)
    except ValueError:
        return raw
    if not isinstance(base, dict):
        return raw
    return without_defaults(raw, [c for c in defaults if c not in base], defaults)


def with_dropped_kept(raw: bytes, base_raw: bytes, dropped: frozenset[str]) -> bytes:
    """Record ``raw`` of a row, plus the values its key's record ``base_raw`` holds of
    columns the family dropped (``dropped``) and the row lacks: a table without a column
    says nothing of it, and under 'merge' a record lacking it removed the field, erasing the
    value at the sites that still keep the column (their application still uses it)."""
    try:
        base, new = codec.decode_value(base_raw), codec.decode_value(raw)
    except ValueError:
        return raw
    if not isinstance(base, dict) or not isinstance(new, dict):
        return raw
    if not any(c in base and c not in new for c in dropped):
        return raw
    # in the base record's order, so a row written back unchanged is the same bytes
    out = {c: new[c] if c in new else v for c, v in base.items() if c in new or c in dropped}
    out.update((c, v) for c, v in new.items() if c not in out)
    return codec.encode_value(out)


def without_defaults(raw: bytes, columns: list[str], defaults: dict[str, Any]) -> bytes:
    """Record ``raw`` of a row, less those of ``columns`` that hold their default
    (``defaults``)."""
    try:
        new = codec.decode_value(raw)
    except ValueError:
        return raw
    if not isinstance(new, dict):
        return raw
    unset = [c for c in columns if c in new and c in defaults
             and identical(new[c], defaults[c])]
    if not unset:
        return raw
    return codec.encode_value({c: v for c, v in new.items() if c not in unset})


# The Python types of values a column of each type affinity stores as they are; any other
# may be converted (SQLite: '7' in an INTEGER column is 7, 5 in a TEXT one is '5').
_AS_IS = {"TEXT": {str, bytes, type(None)}, "INTEGER": {int, bytes, type(None)},
          "NUMERIC": {int, float, bytes, type(None)}, "REAL": {float, bytes, type(None)},
          "BLOB": {int, float, str, bytes, type(None)}}


def maybe_converted(records: list, affinity: dict[str, str]) -> list[int]:
    """The positions of ``records`` (maps) holding a value that its column, by its type
    affinity, may store as another one: a type the affinity converts, a float that is a
    whole number in an INTEGER or NUMERIC column, a NaN anywhere (stored as NULL).  The
    caller asks SQLite about these few; the common case (none) is found in C."""
    out: set[int] = set()
    for col, aff in affinity.items():
        get = methodcaller("get", col)
        vals = list(map(get, records))
        as_is = _AS_IS.get(aff, _AS_IS["BLOB"])
        kinds = set(map(type, vals))
        whole_converts = aff in ("INTEGER", "NUMERIC")
        # a REAL column keeps -0.0 as 0.0 (as a whole number), an untyped one keeps it
        signs_lost = aff == "REAL"
        if kinds <= as_is:
            if float not in kinds:
                continue
            floats = vals if len(kinds) == 1 else [v for v in vals if v.__class__ is float]
            if not any(map(isnan, floats)) and not (
                    whole_converts and any(map(float.is_integer, floats))) and not (
                    signs_lost and 0.0 in floats and any(map(is_negative_zero, floats))):
                continue        # a REAL column's floats, none of them NaN: the common case
        for i, v in enumerate(vals):
            kind = type(v)
            if kind not in as_is or kind is float and (
                    v != v or whole_converts and v.is_integer()
                    or signs_lost and is_negative_zero(v)):
                out.add(i)
    return sorted(out)


def is_negative_zero(v: float) -> bool:
    """-0.0, which compares equal to 0.0 (in Python and in SQLite) but is another value."""
    return v == 0.0 and copysign(1.0, v) < 0


def may_alias(vals: tuple, affinities: list[str]) -> bool:
    """Whether SQLite may find another key's row by these key values: a number in a key
    column of no declared type (1.0 finds the INTEGER 1 there, 1 the REAL 1.0, -0.0 finds
    0.0).  A column with an affinity converts such spellings to one, and a record it would
    convert is refused before (writer.conversions); text under the key's BINARY collation
    finds only itself."""
    return any(a == "BLOB" and type(v) in (int, float) for v, a in zip(vals, affinities))


def same_row(record: Any, row: dict, defaults: dict | None = None) -> bool:
    """Whether a table's ``row`` holds what ``record`` says: in the columns both have, and in
    a column the record predates, the column's default (``defaults``: the constant ones; a
    record from before a column stands for a row with its default, see appdb.Writer).  A
    column the table no longer has (dropped everywhere, then refreshed) is not a
    difference."""
    if not isinstance(record, dict):
        return False
    both = [c for c in row if c in record]
    if not identical({c: row[c] for c in both}, {c: record[c] for c in both}):
        return False
    newer = [c for c in row if c not in record and c in (defaults or {})]
    return identical({c: row[c] for c in newer}, {c: defaults[c] for c in newer})


def fk_order(parents: dict[str, list[str]]) -> list[str]:
    """Tables ordered parents first (a table after every table it references), ties by
    name; a cycle is broken at the name order (its rows may then clash and retry).  A
    depth-first walk on a stack of its own: a chain of a thousand tables, each referring to
    the next (a peer's definitions may be so), overflowed Python's."""
    out: list[str] = []
    done: set[str] = set()
    visiting: set[str] = set()

    def referenced(t: str):
        return iter(sorted(p for p in parents.get(t, []) if p in parents and p != t))

    for root in sorted(parents):
        if root in done:
            continue
        visiting.add(root)
        stack = [(root, referenced(root))]
        while stack:
            t, todo = stack[-1]
            p = next((p for p in todo if p not in done and p not in visiting), None)
            if p is not None:
                visiting.add(p)
                stack.append((p, referenced(p)))
                continue
            stack.pop()
            visiting.discard(t)
            done.add(t)
            out.append(t)
    return out


def integer_key_warning(table: str, pk: list[str], affinities: dict[str, str],
                        create_sql: str) -> str | None:
    """A warning when ``table`` is keyed by one INTEGER column (a rowid alias, often given
    out by SQLite): two sites inserting at once pick the same numbers."""
    if len(pk) == 1 and affinities.get(pk[0]) == "INTEGER":
        return (f"table {table} is keyed by INTEGER column {pk[0]}: rows inserted at two sites "
                f"before they sync may get the same key, and then show as conflicts; give each "
                f"site its own key range and insert explicit ids from it, or use text keys "
                f"(docs/attach.md, 'Integer keys')")
    return None


def untyped_key_warning(table: str, pk: list[str], affinities: dict[str, str]
                        ) -> str | None:
    """A warning when ``table`` is keyed by one column without a type (or BLOB): it may hold
    the integer 1 and the text '1' as two rows, which share the record key 1, or the
    integer 1 and the real 1.0 as one row, under two record keys."""
    if len(pk) == 1 and affinities.get(pk[0]) == "BLOB":
        return (f"key column {pk[0]} of table {table} has no type affinity (no declared "
                f"type, or BLOB): the integer 1 and the text '1' would be two rows there but "
                f"one record key, shown as a conflict, and 1 and 1.0 one row but two record "
                f"keys; declare it TEXT or INTEGER, unless it only ever holds blobs "
                f"(docs/attach.md, 'What it needs')")
    return None


def type_warning(table: str, here: dict[str, str], family: dict[str, str] | None
                 ) -> str | None:
    """A warning when columns of ``table`` have another type affinity here than in the
    family's definition: SQLite would store some values with other types here (1 as '1')."""
    if family is None:
        return None
    odd = [f"{c} ({here[c]} here, {family[c]} in the family)" for c in here
           if c in family and here[c] != family[c]]
    if not odd:
        return None
    return (f"table {table} declares column(s) {', '.join(odd)}: a peer's value that such a "
            f"column would store as another type (1 as '1') is a clash here, listed by "
            f"'conflicts'; declare the same column types")


def null_key_warning(table: str, columns: list[str]) -> str | None:
    """A warning when key columns of ``table`` may hold NULL: such a row has no key to
    replicate under, and is left out (SQLite allows it unless NOT NULL is declared)."""
    if not columns:
        return None
    return (f"key column(s) {', '.join(columns)} of table {table} allow NULL: a row with a "
            f"NULL key is not replicated (fsck reports it); declare them NOT NULL, or never "
            f"write NULL there")


def fk_action_warning(table: str, actions: list[str]) -> str | None:
    """A warning when foreign keys with actions touch ``table``: syncpack writes with foreign
    keys on, so a peer's delete of a parent runs them here and the changes they make travel;
    an application that leaves foreign keys off (SQLite's default) never runs them itself."""
    if not actions:
        return None
    return (f"table {table} has foreign key actions ({'; '.join(actions[:3])}"
            f"{'; ...' if len(actions) > 3 else ''}): syncpack writes with foreign keys on and "
            f"runs them at every site; if the application leaves foreign keys off (SQLite's "
            f"default), turn them on in each of its connections (PRAGMA foreign_keys=ON), or "
            f"the sites follow the schema where the application does not")


def chunks(items: Iterable, n: int | Callable[[], int]):
    """Lists of ``n`` items in order (the last one shorter), taken by islice in C; ``n`` may
    be a function, asked before each list (:meth:`PartSizer.rows`)."""
    it = iter(items)
    size = n if callable(n) else (lambda: n)
    while part := list(islice(it, size())):
        yield part


def text_bytes(part: list[tuple]) -> int:
    """The bytes of the TEXT and BLOB values of rows ``part`` (as characters for TEXT): about
    what their records will hold."""
    return sum(len(v) for row in part for v in row if isinstance(v, (str, bytes)))


class PartSizer:
    """How many rows the next part of a large read takes: at most ``most``, and about
    ``budget`` bytes of records by the sizes seen so far.  The first part is small and each
    may be at most four times the one before, so a table of large rows (a photo in each) is
    read in parts of a few rows, not of ``most`` rows held at once (1,500 rows of 1 MiB took a
    capture to 3.2 GB), while small rows reach ``most`` within a few parts."""

    def __init__(self, most: int, budget: int, first: int = 16):
        self.most, self.budget = most, budget
        self.n = max(1, min(first, most))

    def rows(self) -> int:
        return self.n

    def saw(self, rows: int, nbytes: int) -> None:
        """A part of ``rows`` rows held ``nbytes`` bytes of records."""
        if rows:
            per_row = max(1, nbytes // rows)
            self.n = max(1, min(self.most, self.n * 4, self.budget // per_row))
