"""A large import's rows written into the application's tables by a child process, on the
other core.

An import into an attached table (attach/applying.py, DirectApply) otherwise decodes every record
and binds every value on the interpreter that also verifies, decompresses and inserts the
blocks into the store: for 1M rows about a third of the import's time, all of it holding the
GIL.  Here the store's process sends each batch's records as they are (bytes, as signed) and
goes on with the next batch while the child decodes and writes them.

The child holds the application's write transaction for the whole import, as the importing
process would, and commits it only when told to (after the store committed every batch's mark,
as before).  It takes over from the importing process, which captured and then committed: it
serves only if the file is as that process left it (the same highest change number and schema
version: nothing was written between that commit and the child's BEGIN IMMEDIATE), else the
caller writes the rows itself.  If either process dies, the child's transaction rolls back and
the store's marks make the rows pending again (attach/applying.py, recover).

The child runs :func:`main`.  Request ``{"path", "tables", "upto", "schema", "module",
"pause_at"}``, answered ``{"ok": bool}``; then per ``["put", table, keys, records]`` the
positions of the records not written (the ordinary apply retries them and records why), in
order, and per ``["delete", table, keys]`` the positions of the keys not deleted;
``["removed"]`` answered with the rows the application's triggers deleted meanwhile
(appdb.removed_since); ``["end", commit, token]`` answered ``{"done": committed}`` (the token is written with the
commit: appdb.note_applied).  Input that ends before ``end``
rolls back.
"""

from __future__ import annotations

import gc
import subprocess
from collections import deque
from operator import methodcaller
from pathlib import Path
from typing import BinaryIO

from syncpack import children
from syncpack.attach import child, rows
from syncpack.format import codec
from syncpack.format.values import identical
from syncpack.store import appdb

# An import of at least this many ops (as its packets' headers say) writes the application's
# rows in a child process: its start (0.09-0.45 s measured, warm to cold) is then a small part.
ELSEWHERE_AT = 100_000


def write_batch(w: appdb.Writer, keys: list[str], raws: list[bytes], values: list | None = None,
                paused: set[str] | None = None, pause_at: int = 0) -> dict[int, str]:
    """Writes the records ``raws`` of ``keys`` (``values``: decoded already) into ``w``'s
    table, in the caller's write transaction; returns why, by position, each record not
    written: no row of that key (attach/rows.py), or refused by the table's constraints.
    With ``paused``, a batch of ``pause_at`` rows or more first drops the table's capture
    triggers, and its name joins ``paused`` (the caller puts them back before its commit).
    The one way a batch goes in: the child's, a smaller import's in the importing process,
    and the ordinary apply's."""
    if values is None:
        values = codec.decode_records(raws)
    why = rows.refused_records(values, keys, w.t.pk)
    if w.computed:
        # left out, the column would get another value at each site, unseen
        for i, v in enumerate(values):
            text = i not in why and isinstance(v, dict) and appdb.lacks_computed(v, w.computed)
            if text:
                why[i] = text
    at = range(len(values))
    if why:
        at = [i for i in at if i not in why]
        values = [values[i] for i in at]
    converted = conversions(w.t.affinity, values)
    if converted:
        # written, the row would differ from the record: the sites would disagree unseen
        for j, (c, v, stored) in converted.items():
            why[at[j]] = (f"column {c} has {w.t.affinity[c]} affinity here: {v!r} would be "
                          f"stored as {stored!r}")
        at = [i for j, i in enumerate(at) if j not in converted]
        values = [v for j, v in enumerate(values) if j not in converted]
    aliased = aliases(w, [keys[i] for i in at], values)
    if aliased:
        for j, text in aliased.items():
            why[at[j]] = text
        at = [i for j, i in enumerate(at) if j not in aliased]
        values = [v for j, v in enumerate(values) if j not in aliased]
    if not values:
        return why
    name = w.t.name
    if paused is not None and name not in paused and len(values) >= pause_at and \
            not w.keeps_capture:
        appdb.drop_capture(w.conn, name)
        paused.add(name)
    for j, err in enumerate(w.put_many(values)):
        if err:
            why[at[j]] = err
    return why


# Values SQLite binds as they are (a bool binds as an integer, and so is a conversion).
_BINDABLE = (type(None), int, float, str, bytes, bool)


def conversions(affinity: dict[str, str], records: list[dict]
                ) -> dict[int, tuple[str, object, object]]:
    """By position, a column of each of ``records`` that a table of these column affinities
    would store as another value, with the value given and the value stored (SQLite's own
    conversions, asked of SQLite: appdb.as_stored).  A value SQLite cannot bind at all is
    left to the write, which refuses it with its own reason."""
    at = rows.maybe_converted(records, affinity)
    if not at:
        return {}
    given = [{c: v for c, v in records[i].items() if c in affinity and type(v) in _BINDABLE
              and (type(v) is not int or -2 ** 63 <= v < 2 ** 63)} for i in at]
    out = {}
    for i, row, stored in zip(at, given, appdb.as_stored(affinity, given)):
        for c, v in row.items():
            if not identical(stored[c], v):
                out[i] = (c, v, stored[c])
                break
    return out


def aliases(w: appdb.Writer, keys: list[str], records: list[dict]) -> dict[int, str]:
    """By position, the records (each of its key ``keys``) whose key values SQLite would
    match to the row of another record key: written, the upsert would change that key's
    row (-0.0 finds 0.0; in a column of no declared type, 1.0 finds 1).  A record whose key
    spells no row here is looked up only when its key could alias (rows.may_alias), after
    :func:`conversions` refused the records a typed key column would convert."""
    t = w.t
    aff = [t.affinity.get(c, "BLOB") for c in t.pk]
    # rows.may_alias of every record at once, in C a column at a time: most keys are typed
    if not any(float in kinds or int in kinds
               for c, a in zip(t.pk, aff) if a == "BLOB"
               for kinds in [set(map(type, map(methodcaller("get", c), records)))]):
        return {}
    out = {}
    for j, (key, r) in enumerate(zip(keys, records)):
        vals = tuple(r.get(c) for c in t.pk)
        if not rows.may_alias(vals, aff):
            continue
        held = appdb.held_key(w.conn, t, vals)
        if held is None:
            continue
        spelt = rows.encode_key(tuple(held), len(t.pk) == 1)
        if spelt != key:
            out[j] = (f"its key finds the row of key {spelt} here (SQLite compares the two "
                      f"keys equal); written, it would change that row")
    return out


def row_key(w: appdb.Writer, key: str) -> tuple | None:
    """The primary key values of the row of ``w``'s table whose record key is ``key``, or None
    when it has none.  Found by the key's values, the row must also spell the key the same
    way: SQLite finds row 1 by '01' in an INTEGER column, and 'abc' by 'ABC' under NOCASE, so
    a lying member's delete of such a key would remove a row the family still shows."""
    for vals in rows.key_candidates(key, [w.t.affinity.get(c, "BLOB") for c in w.t.pk]):
        if len(vals) != len(w.t.pk):
            return None
        held = appdb.held_key(w.conn, w.t, vals)
        if held is not None and rows.encode_key(tuple(held), len(w.t.pk) == 1) == key:
            return tuple(held)
    return None


def delete_batch(w: appdb.Writer, keys: list[str]) -> list[int]:
    """Deletes the rows of record keys ``keys`` from ``w``'s table, in the caller's write
    transaction (a key without a row has nothing to delete); returns the positions of those
    a constraint refused: they stay pending for the ordinary apply."""
    refused = []
    for i, key in enumerate(keys):
        key_vals = row_key(w, key)
        if key_vals is not None and w.delete(key_vals):
            refused.append(i)
    return refused


def _serve(inp: BinaryIO, out: BinaryIO) -> None:
    req = children.read_frame(inp)
    gc.disable()        # nothing made here is cyclic; the collector would only walk it
    app = appdb.open_app(Path(req["path"]))
    try:
        appdb.skip_trigger_writes(app, req["replicated"])
        appdb.begin_write(app)
        try:
            infos = {}
            same = child.file_as_left(app, req, __file__)
            if same:
                infos = {n: appdb.table_info(app, n) for n in req["tables"]}
                same = all(infos.values())
            children.write_frame(out, {"ok": same})
            out.flush()
            if not same:
                return
            writers = {n: appdb.Writer(app, t) for n, t in infos.items()}
            paused: set[str] = set()
            for frame in children.frames(inp):
                if frame[0] == "end":
                    commit = frame[1] is True
                    if commit:
                        for n in paused:
                            appdb.install_capture(app, infos[n])
                        if frame[2] is not None:
                            appdb.note_applied(app, frame[2])
                    appdb.end_write(app, commit)
                    children.write_frame(out, {"done": commit})
                    out.flush()
                    return
                if frame[0] == "removed":
                    gone = appdb.removed_since(app, infos, req["upto"])
                    children.write_frame(out, {n: [list(k) for k in ks]
                                               for n, ks in gone.items()})
                    out.flush()
                    continue
                if frame[0] == "delete":
                    _op, name, keys = frame
                    children.write_frame(out, delete_batch(writers[name], keys))
                    out.flush()
                    continue
                _op, name, keys, raws = frame
                children.write_frame(out, sorted(write_batch(
                    writers[name], keys, raws, paused=paused, pause_at=req["pause_at"])))
                out.flush()
        except children.ChildEnded:        # the importing process went away: roll back
            return
        finally:
            appdb.end_write(app, False)     # nothing, after a commit
    finally:
        app.close()


def main() -> None:
    children.run(_serve)


class Elsewhere:
    """The child writing the rows of ``tables`` of the file at ``path``.  Falsy when it found
    the file changed since the caller's commit (``upto``, ``schema``) or could not start: then
    the caller writes the rows itself.

    :meth:`put` sends a batch and returns at once; :meth:`refused` gives the batches' rows the
    child did not write, as its answers arrive; :meth:`end` commits or rolls back.  Any of
    them raises :class:`children.ChildEnded` once the child is gone."""

    def __init__(self, path: str, tables: list[str], replicated: list[str], upto: int,
                 schema: int, pause_at: int):
        self.ok = False
        self._sent: deque[list] = deque()
        self._inbox: children.Inbox | None = None
        self._outbox: children.Outbox | None = None
        self._ended = False
        self.proc: subprocess.Popen | None = children.start("syncpack.attach.writer", {
            "path": str(path), "tables": tables, "replicated": replicated, "upto": upto,
            "schema": schema,
            "module": __file__, "pause_at": pause_at}, more_input=True)
        self.ok = self.proc is not None
        if not self.ok:
            return
        self._inbox = children.Inbox(self.proc.stdout, "syncpack-apply-answers")
        self._outbox = children.Outbox(self.proc.stdin, "syncpack-apply-rows", depth=8)

    def __bool__(self) -> bool:
        return self.ok

    def put(self, table: str, keys: list[str], raws: list[bytes], csns: list[bytes]) -> None:
        """Write ``raws`` (the records of ``keys``, versions ``csns``) into ``table``."""
        self._outbox.put(["put", table, keys, raws])
        self._sent.append((table, keys, csns))

    def delete(self, table: str, keys: list[str]) -> None:
        """Delete the rows of ``keys`` (record keys) from ``table``."""
        self._outbox.put(["delete", table, keys])
        self._sent.append((table, keys, [b""] * len(keys)))

    def refused(self, wait: bool) -> list[tuple[str, str, bytes]]:
        """(table, key, csn) of the rows the child did not write, of every batch answered by
        now (with ``wait``: of every batch sent)."""
        out = []
        while self._sent:
            answer = self._inbox.get(wait)
            if answer is None:
                break
            table, keys, csns = self._sent.popleft()
            if not isinstance(answer, list):
                raise children.ChildEnded("the process writing the application's rows failed")
            out += [(table, keys[i], csns[i]) for i in answer]
        return out

    def removed(self) -> dict[str, list[tuple]]:
        """Per table, the key values of rows the application's triggers deleted as the child
        wrote (appdb.removed_since); every batch sent must have been answered."""
        self._outbox.put(["removed"])
        answer = self._inbox.get()
        if not isinstance(answer, dict):
            raise children.ChildEnded("the process writing the application's rows failed")
        return {n: [tuple(k) for k in ks] for n, ks in answer.items()}

    def end(self, commit: bool, token: bytes | None) -> bool:
        """Commit (or roll back) everything written, with ``token`` (appdb.note_applied);
        True if committed."""
        self._outbox.put(["end", commit, token])
        answer = self._inbox.get()
        self._ended = isinstance(answer, dict) and answer.get("done") is not None
        return self._ended and answer["done"] is True

    def close(self) -> None:
        """Wait for the child if it has ended its transaction, else stop it (what it wrote
        is rolled back)."""
        p, self.proc = self.proc, None
        if p is not None and self._ended:
            try:
                p.wait(timeout=5)       # it exits once it has answered
            except subprocess.TimeoutExpired:
                pass
        if p is not None and p.poll() is None:
            p.kill()
        if self._outbox is not None:
            try:
                self._outbox.close()
            except children.ChildEnded:
                pass
            self._outbox = None
        children.stop(p)
        if self._inbox is not None:
            self._inbox.join()
            self._inbox = None
