"""Schema changes of attached tables (docs/attach.md, "Schema changes").

- :func:`review`, at each capture, inside the capture's snapshot of the application's file:
  compares each table's shape with the one recorded.  Columns added at the end become schema
  ops: a new version of the table's definition in ``$tables`` (carrying every op so far, in
  order), written in a replication transaction of its own that commits, with the new recorded
  shape, before the capture's rows that use the column; so every peer holds the op before any
  such row.  Any other change stops capture (and apply) of that table, with the reason kept
  for ``attached``/``status``, until ``attach --refresh``; other tables carry on.
- :func:`follow`, under the application's write lock before records are written: adds each
  column the family's definition has and the local table lacks, from the peers' text, refused
  unless it adds exactly that column (appdb.add_column).  A record that still has a column
  the table lacks waits (appdb.Writer) instead of losing the value.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable

from syncpack.attach import shapes
from syncpack.errors import AttachError
from syncpack.format import codec
from syncpack.rules import sqltext
from syncpack.site import TABLES, Site
from syncpack.store import appdb, attached


def definitions(site: Site, name: str) -> list[dict]:
    """The surviving versions of ``name``'s definition in ``$tables`` (more than one when
    sites changed it concurrently)."""
    out = []
    for _csn, raw in attached.versions_of(site.conn, TABLES, name):
        if raw is not None:
            v = codec.shown_value(raw)
            if isinstance(v, dict):
                out.append(v)
    return out


def definition(t: appdb.TableInfo, previous: list[dict], added: list[dict] = (),
               dropped: set[str] = frozenset()) -> dict:
    """The definition of ``t`` to publish: its CREATE TABLE, key and columns, with the schema
    ops of the family so far plus ``added`` (a site whose table lacks one of those columns
    still passes it on), and the columns the family dropped (whose ops go)."""
    gone = (shapes.dropped_of(previous) | set(dropped)) - set(t.columns)
    ops = [op for op in shapes.ops_of(previous + [{"added": list(added)}])
           if op["column"] not in gone]
    d = {"create_sql": t.create_sql, "pk": t.pk, "columns": t.columns}
    if ops:
        d["added"] = ops
    if gone:
        d["dropped"] = sorted(gone)
    return d


def shape_of(t: appdb.TableInfo) -> dict:
    return shapes.shape(t.columns, t.affinity, t.pk, t.uniques, t.key_collation)


def with_dropped(site: Site, t: appdb.TableInfo) -> appdb.TableInfo:
    return dataclasses.replace(t, dropped=frozenset(shapes.dropped_of(definitions(site, t.name))))


def review(site: Site, app: appdb.Connection, infos: dict[str, appdb.TableInfo],
           back: Iterable[str] = ()) -> dict[str, appdb.TableInfo]:
    """The tables to capture and apply now, each as it is in the caller's transaction on
    ``app``; publishes added columns, stops tables changed unsafely (see the module).  A
    table in ``back`` was stopped for being gone from the file and is there again: it is
    reviewed like the others (the caller resumes its capture if it is live)."""
    recorded = attached.shapes(site.conn)
    attached_here = attached.tables(site.conn)
    defs_sql = {n: d["create_sql"] for n, d in attached_here.items()}
    live: dict[str, appdb.TableInfo] = {}
    back = set(back)
    for name, t0 in infos.items():
        old, stopped = recorded.get(name, (None, None))
        if stopped and name not in back:
            continue
        t = appdb.table_info(app, name) or t0
        new = shape_of(t)
        # (a collated key is refused even as recorded: see shapes.compare)
        if old == new and not t.key_collation:
            live[name] = with_dropped(site, t)
            continue
        adds, problems = ([], []) if old is None else shapes.compare(old, new)
        ops = _new_ops(site, app, t, adds, defs_sql.get(name, "")) if not problems else []
        # A column the peers would refuse to add: its rows would wait at every peer, and
        # only the peers' administrators would be told.
        problems += [f"column {op['column']} was added with a definition the peers cannot "
                     f"add ({op['def'][:200]!r}): {why}" for op in ops
                     if (why := appdb.column_refusal(op["def"], name, attached_here))]
        if len(t.columns) > appdb.MAX_COLUMNS:
            # attach refuses such a table; peers would refuse its definition, and its rows
            # would wait there for good
            problems = [*problems, too_wide(t)]
        if problems:
            with site.write_txn() as conn:
                attached.set_stopped(conn, name, f"capture of table {name} stopped: "
                                                 + "; ".join(problems))
            continue
        _publish(site, t, ops, new)
        live[name] = with_dropped(site, t)
    return live


def declared_columns(name: str, defs: list, generated: bool = True) -> list[str]:
    """The columns the CREATE TABLE texts of the family's definitions ``defs`` of table
    ``name`` make, in order (the first text's first).  Not the definitions' own lists of
    columns: a member may list there a column no text makes, and a site that later added
    that column took it for one the family had, published no op, and its rows waited at
    the peers for good."""
    out: dict[str, None] = {}
    for d in defs:
        sql = d.get("create_sql") if isinstance(d, dict) else None
        made = appdb.declared(name, sql) if isinstance(sql, str) else None
        if made is not None:
            out.update(dict.fromkeys(
                [*made.affinity, *(sorted(made.generated) if generated else ())]))
    return list(out)


def too_wide(t: appdb.TableInfo) -> str:
    return (f"table {t.name} has {len(t.columns)} columns, more than the "
            f"{appdb.MAX_COLUMNS} an attached table may have")


def _new_ops(site: Site, app: appdb.Connection, t: appdb.TableInfo, adds: list[str],
             old_sql: str) -> list[dict]:
    """The schema ops of the columns ``adds`` of ``t`` the family does not have yet, each
    with its definition as the application wrote it."""
    if not adds:
        return []
    prev = definitions(site, t.name)
    known = {op["column"] for op in shapes.ops_of(prev)}
    family_cols = set(declared_columns(t.name, prev))
    ops = []
    # Several ADD COLUMNs since the last capture sit one after another in the new CREATE
    # TABLE text, each as the application wrote it (CHECK, COLLATE, REFERENCES and all)
    spliced = shapes.added_text(old_sql, t.create_sql)
    texts = sqltext.split_top_level(spliced) if spliced else []
    # each text by the column it names (a generated column added beside them has a text and
    # no place among the columns a row holds)
    written = {c: text for text in texts for c in adds if shapes.defines(text, c)}
    for c in adds:
        if c in known or c in family_cols:
            continue        # the family has it already (this site followed a peer's op)
        text = written.get(c)
        if text is None or not shapes.defines(text, c):
            text = appdb.column_sql(app, t.name, c)
        ops.append({"column": c, "def": text})
    return ops


def unpublished(site: Site, app: appdb.Connection, t: appdb.TableInfo) -> list[dict]:
    """Schema ops for the columns of ``t`` that the family's table has never had: added by
    the application while the table was not attached here (detached, or before this site's
    first attach of a table a peer attached).  Published with the definition an attach
    writes, they are added at every site as an ADD COLUMN made while attached is;
    left out, every later row of this site waited for them at the peers, for good.  Raises
    :class:`AttachError` for a column the peers could not add."""
    prev = definitions(site, t.name)
    if not prev:
        return []       # the first attach in the family: its columns are the definition
    known = set(declared_columns(t.name, prev)) | {op["column"] for op in shapes.ops_of(prev)}
    _same_but_case(t, known)
    # a column the family dropped is one it had: a site on the old release still has it,
    # and published again it was added back where the application had dropped it
    known |= shapes.dropped_of(prev)
    base = next((d["create_sql"] for d in prev if isinstance(d.get("create_sql"), str)), "")
    # as the application wrote them where its ALTER TABLE appended them to the family's text
    ops = _new_ops(site, app, t, [c for c in t.columns if c not in known], base)
    refused = [f"{op['column']} ({why})" for op in ops
               if (why := appdb.column_refusal(op["def"], t.name, attached.tables(site.conn)))]
    if refused:
        raise AttachError(f"table {t.name} has columns the family's table lacks, which the "
                          f"peers cannot add: {'; '.join(refused)}; nothing was changed",
                          hint="drop those columns, or give them a form ALTER TABLE ADD "
                               "COLUMN takes (a DEFAULT for NOT NULL, no UNIQUE or PRIMARY "
                               "KEY)")
    return ops


def _same_but_case(t: appdb.TableInfo, known: set[str]) -> None:
    """Refuse a column of ``t`` that is one of the family's ``known`` columns spelt in
    another case: SQLite takes the two for one column (it folds ASCII letters only), while
    records name their fields exactly, so each site's rows would wait at the other for a
    column no site can add ('duplicate column name')."""
    folded = {sqltext.fold(k): k for k in known}
    clash = [(c, folded[sqltext.fold(c)]) for c in t.columns
             if c not in known and sqltext.fold(c) in folded]
    if clash:
        mine, theirs = clash[0]
        raise AttachError(
            f"column {mine} of table {t.name} is the family's column {theirs} spelt in "
            f"another case: SQLite takes them for one column, replication does not; nothing "
            f"was changed",
            hint=f"rename it as the family spells it (ALTER TABLE {appdb.q(t.name)} RENAME "
                 f"COLUMN {appdb.q(mine)} TO {appdb.q(theirs)}), then attach again")


def _publish(site: Site, t: appdb.TableInfo, ops: list[dict], new_shape: dict) -> None:
    """Record ``t``'s new shape and publish ``ops`` (:func:`_new_ops`), in one store
    transaction (ahead of the rows the next capture writes)."""
    with site.transaction() as tx:
        if ops:
            tx.write_raw(TABLES, t.name,
                         codec.encode_value(definition(t, definitions(site, t.name), ops)))
        attached.set_shape(site.conn, t.name, new_shape, t.columns, t.pk, t.create_sql)


def follow(site: Site, app: appdb.Connection, infos: dict[str, appdb.TableInfo],
           refused: list[str]) -> tuple[dict[str, appdb.TableInfo], list[appdb.TableInfo]]:
    """Add to each table the columns the family's definition has and it lacks; the caller
    holds the application's write lock.  Refusals are appended to ``refused``.  Returns the
    tables as they are now, and those that grew: pass them to :func:`record` once the
    application's file has committed (recorded earlier, a rollback would leave a recorded
    column the table lacks, which reads as a dropped column)."""
    out = dict(infos)
    grown = []
    for name, t in infos.items():
        todo = _to_add(site, t)
        if not todo:
            continue
        changed = False
        for op in todo:
            why = appdb.add_column(app, name, op["column"], op["def"], replicated=infos)
            if why:
                refused.append(why)
                break       # later ops may depend on this column's place: wait for a fix
            changed = True
        if changed:
            t = with_dropped(site, appdb.table_info(app, name))
            out[name] = t
            grown.append(t)
    return out, grown


def _to_add(site: Site, t: appdb.TableInfo) -> list[dict]:
    """The schema ops of the family's definition of ``t`` that its table lacks."""
    defs = definitions(site, t.name)
    gone = shapes.dropped_of(defs)
    return [op for op in shapes.ops_of(defs)
            if op["column"] not in t.columns and op["column"] not in gone]


def to_follow(site: Site, infos: dict[str, appdb.TableInfo]) -> bool:
    """Whether :func:`follow` has columns to add."""
    return any(_to_add(site, t) for t in infos.values())


def record(site: Site, grown: list[appdb.TableInfo]) -> None:
    """The shapes of tables :func:`follow` grew, after the application's commit."""
    if grown:
        with site.write_txn() as conn:
            for t in grown:
                attached.set_shape(conn, t.name, shape_of(t), t.columns, t.pk, t.create_sql)


def available(site: Site) -> list[str]:
    """Tables some site of the family attached that this site has not."""
    mine = attached.tables(site.conn)
    return sorted(k for _c, k, v in site.records(TABLES) if isinstance(v, dict) and k not in mine)
