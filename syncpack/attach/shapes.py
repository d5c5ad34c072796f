"""Pure rules for schema changes of attached tables (docs/attach.md, "Schema changes").  No I/O.

A table's *shape* is what peers must agree on to exchange its rows: its columns in order with
their type affinity, its primary key and its other UNIQUE indexes.  At each capture the current
shape is compared with the one recorded: columns appended at the end (``ALTER TABLE ... ADD
COLUMN``) are a change every site can follow, and travel as ordered schema ops; anything else
(a column dropped, renamed or moved, a changed affinity or primary key, a new UNIQUE index,
a key column given a collation) could lose or refuse peers' rows, so capture of that table
stops until the change is rolled out everywhere and accepted with ``syncpack attach DB
--refresh``.
"""

from __future__ import annotations

import re
from typing import Any

from syncpack.rules import sqltext

# Every change that stops capture is explained with this hint.
REFRESH_HINT = ("roll the change out at every site at the same release, then run 'syncpack "
                "attach {db} --refresh --table {table}' at each (a change no site can follow, "
                "as the reason says: undo it, then refresh here); until then the table's "
                "changes wait in the application's file and records for it wait in the store")


def shape(columns: list[str], affinity: dict[str, str], pk: list[str],
          uniques: list[list[str]], key_collation: list[tuple[str, str]] = ()) -> dict:
    """The shape of a table (JSON-able, comparable with ``==``).  ``key_collation``: the
    key columns that compare by a collation other than BINARY, with it; kept only when there
    is one, so the shapes recorded before it was looked at still compare equal."""
    out = {"columns": [[c, affinity.get(c, "BLOB")] for c in columns], "pk": list(pk),
           "uniques": sorted(list(u) for u in uniques)}
    if key_collation:
        out["key_collation"] = [[c, coll] for c, coll in key_collation]
    return out


def compare(old: dict, new: dict) -> tuple[list[str], list[str]]:
    """(columns added at the end, changes peers cannot follow) from shape ``old`` to ``new``.
    The second list names each unsafe change in words; when it is not empty the first one is
    meaningless."""
    problems: list[str] = []
    oc = [tuple(c) for c in old.get("columns", [])]
    nc = [tuple(c) for c in new.get("columns", [])]
    new_aff = dict(nc)
    new_names = [c for c, _a in nc]
    for name, aff in oc:
        if name not in new_aff:
            problems.append(f"column {name} was dropped or renamed")
        elif new_aff[name] != aff:
            problems.append(f"column {name} changed type affinity from {aff} to "
                            f"{new_aff[name]}")
    kept = [c for c in new_names if c in dict(oc)]
    old_names = [c for c, _a in oc]
    if not problems and kept != old_names:
        problems.append("columns changed order")
    elif not problems and new_names[:len(oc)] != old_names:
        # a table made again with a new column among the old ones: what peers add goes at
        # the end, so their rows would hold it elsewhere
        added = [c for c in new_names[:len(oc)] if c not in dict(oc)]
        problems.append(f"column {added[0]} was added between existing columns, not at the "
                        f"end")
    if list(old.get("pk", [])) != list(new.get("pk", [])):
        problems.append(f"the primary key changed from ({', '.join(old.get('pk', []))}) to "
                        f"({', '.join(new.get('pk', []))})")
    old_u = [list(u) for u in old.get("uniques", [])]
    for u in new.get("uniques", []):
        if list(u) not in old_u:
            problems.append(f"a new UNIQUE constraint on ({', '.join(u)})")
    # Never one peers can follow, even if a refresh recorded it: attach refuses such a key,
    # and the apply's upsert, aimed at the key's exact (BINARY) index, finds none.
    for col, coll in new.get("key_collation", []):
        problems.append(
            f"key column {col} now compares with COLLATE {coll}, and syncpack keys rows by "
            f"their exact text: two sites' keys that {coll} holds equal would overwrite each "
            f"other's rows (declare the key without COLLATE again; a UNIQUE index on ({col} "
            f"COLLATE {coll}) keeps the rule, and its clashes become conflicts)")
    if problems:
        return [], problems
    return new_names[len(oc):], []


def added_text(old_sql: str, new_sql: str) -> str | None:
    """The column definition SQLite spliced into a CREATE TABLE text for one ``ADD COLUMN``
    (it inserts ``", <definition>"`` before the closing parenthesis), or None when the two
    texts do not differ by exactly such an insertion."""
    if len(new_sql) <= len(old_sql):
        return None
    p = 0
    while p < len(old_sql) and old_sql[p] == new_sql[p]:
        p += 1
    s = 0
    while s < len(old_sql) - p and old_sql[-1 - s] == new_sql[-1 - s]:
        s += 1
    if p + s != len(old_sql):
        return None
    m = new_sql[p:len(new_sql) - s]
    # The same insertion may sit further left (``a, b`` + ``, c`` reads as ``a, `` + ``c, ``
    # when table constraints follow): slide it while the text allows.
    middle, k = m, 0
    while not middle.startswith(", "):
        k += 1
        if k > p or k > len(m) or m[len(m) - k:] != old_sql[p - k:p]:
            return None
        middle = old_sql[p - k:p] + m[:len(m) - k]
    return middle[2:].strip() or None


_IDENT = re.compile(r'\s*(?:"((?:[^"]|"")*)"|`([^`]*)`|\[([^\]]*)\]|([A-Za-z_][\w$]*))')


def defines(text: str, column: str) -> bool:
    """Whether column definition ``text`` starts by naming ``column`` (quoted or not)."""
    m = _IDENT.match(text)
    if m is None:
        return False
    name = m.group(1).replace('""', '"') if m.group(1) is not None else \
        next(g for g in m.groups()[1:] if g is not None)
    return sqltext.fold(name) == sqltext.fold(column)


def ops_of(definitions: list[Any]) -> list[dict]:
    """The schema ops (``{"column", "def"}``, in order, one per column) held by the surviving
    versions of a table's definition: concurrent definitions each keep their ops."""
    out: list[dict] = []
    seen: set[str] = set()
    for d in definitions:
        if not isinstance(d, dict):
            continue
        added = d.get("added")
        for op in added if isinstance(added, list) else []:
            if isinstance(op, dict) and isinstance(op.get("column"), str) \
                    and isinstance(op.get("def"), str) and op["column"] not in seen:
                seen.add(op["column"])
                out.append({"column": op["column"], "def": op["def"]})
    return out


def dropped_of(definitions: list[Any]) -> set[str]:
    """Columns a refresh somewhere in the family accepted as dropped: values of them in older
    records are left out, not waited for."""
    return _names_in(definitions, "dropped")


def _names_in(definitions: list[Any], field: str) -> set[str]:
    """The names listed under ``field`` by any of the definitions (a peer's word: whatever is
    not a list of names is nothing)."""
    out: set[str] = set()
    for d in definitions:
        names = d.get(field) if isinstance(d, dict) else None
        if isinstance(names, list):
            out |= {c for c in names if isinstance(c, str)}
    return out
