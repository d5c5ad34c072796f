"""Reading a capture's changed rows: in this process, or, for a large capture, in a child
process on the other core.

Reading is most of a large capture's time (finding the changed rows in SQLite, then a
Python object per value and the record's packing), and nearly all of it holds the GIL: a
second *thread* took the GIL back and forth with the store's inserts row by row, which made
the pair slower than one thread.  A child process has its own interpreter, so it reads and
encodes part N+1 while this process inserts and seals part N; what crosses the pipe is one
msgpack frame per part, ``[keys, records]``, unpacked here in C.

The child reads the application's file in a snapshot of its own.  It is used only if that
snapshot holds what the caller's does: the same highest change number (every write to an
attached table adds a change row, and only syncpack, under the site lock, removes them) and
the same schema version.  Otherwise, and whenever the child cannot be started, the rows are
read here as before.  The child only reads: if either process dies, nothing was written by
it, and the store's transaction rolls back as after any failed capture.

The child runs :func:`main`: a request on stdin, frames on stdout.
"""

from __future__ import annotations

import gc
from operator import itemgetter
from pathlib import Path
from typing import BinaryIO, Iterator

from syncpack import children
from syncpack.attach import child, rows
from syncpack.errors import AttachError
from syncpack.format import blocks, codec
from syncpack.store import appdb

# Rows per part read and handed to the store, at most; and about how many bytes of records
# (rows.PartSizer: a table of large rows is read a few rows at a time).
CAPTURE_CHUNK = 10_000
CAPTURE_BYTES = 16 * 1024 * 1024
# A capture of at least this many changes is read by a child process: its start (an
# interpreter and these imports, 0.14-0.45 s of wall time measured) is then a small part.
ELSEWHERE_AT = 100_000
# How long the child waits for a lock on the application's file before it declines (and
# the rows are read here).  Short: with a rollback journal, an application's COMMIT waiting
# for the caller's read lock to end keeps every new reader out, the child included, while
# the caller waits for the child; the application's busy timeout ran out first.
CHILD_WAIT_MS = 250


def changes(app: appdb.Connection, t: appdb.TableInfo, since: int, upto: int
            ) -> Iterator[tuple[list[str], list[bytes | None]]]:
    """(record keys, records) of the keys of ``t`` changed in (since, upto], in chunks; a
    row present is its record, one absent is a delete (None)."""
    keyed_records = rows.named_keyed_records(t.columns, t.pk)
    encode = row_encoder(t)
    npk = len(t.pk)
    encoding = None
    sizer = rows.PartSizer(CAPTURE_CHUNK, CAPTURE_BYTES)
    for named, part in appdb.changed_records(app, t, since, upto, sizer.rows):
        if named:
            keys, raws = keyed_records(part)
        else:
            if not all(map(itemgetter(1), part)):
                encoding = encoding or appdb.text_encoding(app)
                part = gone_keys(part, npk, encoding)
            keys, raws = record_keys(part, npk), encode(part)
        check_sizes(t, keys, raws)
        sizer.saw(len(raws), sum(map(len, filter(None, raws))))
        yield keys, raws


def check_sizes(t: appdb.TableInfo, keys: list[str], raws: list[bytes | None]) -> None:
    """Refuse a row whose record, or whose record key, is larger than a block may hold
    (formats/BLOCKS.md): the capture stops there, with nothing captured, as at text that is
    not UTF-8.  Sealed, such a row made a block no site decodes, the origin's own fsck
    included, and every later change of the origin waited behind it at the peers."""
    big = rows.oversized(raws, codec.MAX_VALUE_BYTES)
    if big is not None:
        raise AttachError(
            f"row {_shown(keys[big])!r} of table {t.name!r} is {len(raws[big]):,} bytes as a "
            f"record, more than the {codec.MAX_VALUE_BYTES:,} one record may hold; nothing "
            f"was captured",
            hint="keep so large a value outside the database (a file, and its path in the "
                 "row), or split it over several rows; then run the command again")
    # the limit the block decoder reads a key with (as its msgpack str, in UTF-8 bytes)
    over = rows.overlong(keys, raws, blocks.MAX_STR_BYTES)
    if over is not None:
        raise AttachError(
            f"row {_shown(keys[over])!r} of table {t.name!r} has a key of "
            f"{len(keys[over].encode('utf-8', 'surrogatepass')):,} bytes as a record key, "
            f"more than the {blocks.MAX_STR_BYTES:,} a key may be; nothing was captured",
            hint="give the row a shorter key (a BLOB key counts twice: it travels in hex), "
                 "or delete the row; then run the command again, and the other changes go "
                 "through")


def _shown(key: str) -> str:
    """``key`` shortened to be named in a message."""
    return key if len(key) <= 60 else key[:57] + "..."


def gone_keys(part: list[tuple], npk: int, encoding: str = "utf-8") -> list[tuple]:
    """The rows of ``part`` with the TEXT key values of keys no longer in the table read back
    from hex (see appdb.changed_records), which is of the file's ``encoding`` (a UTF-16
    database's keys are UTF-16 bytes); a key that is not valid text was never captured, so
    its delete is nothing and its row is left out."""
    out = []
    for r in part:
        if r[1] or r[0] is not None:
            out.append(r)
            continue
        vals = list(r[2:2 + npk])
        try:
            for i, v in enumerate(vals):
                if isinstance(v, str):
                    vals[i] = bytes.fromhex(v[1:]).decode(encoding)
        except (ValueError, UnicodeDecodeError):
            continue
        out.append(r[:2] + tuple(vals) + r[2 + npk:])
    return out


def row_encoder(t: appdb.TableInfo):
    """Rows laid out as :func:`appdb.changed_records` gives those that may be absent -> their
    records (None for a row that is absent), as ``codec.encode_value(dict(zip(t.columns,
    row)))`` would encode them."""
    records = rows.named_records(len(t.columns))
    tail = itemgetter(slice(2 + len(t.pk), None))
    present = itemgetter(1)

    def encode(part: list[tuple]) -> list[bytes | None]:
        raws = records(list(map(tail, part)))
        if not all(map(present, part)):
            raws = [r if p[1] else None for r, p in zip(raws, part)]
        return raws

    return encode


def record_keys(part: list[tuple], npk: int) -> list[str]:
    """The record keys of rows laid out as :func:`appdb.changed_records` gives them: SQLite
    spelt the common ones (an integer, a text not starting with '['), rows.encode_key the
    rest."""
    keys = list(map(itemgetter(0), part))
    if None in keys:
        single = npk == 1
        keys = [k if k is not None else rows.encode_key(tuple(r[2:2 + npk]), single)
                for k, r in zip(keys, part)]
    return keys


# --- the child process ---------------------------------------------------------------------------

def _serve(inp: BinaryIO, out: BinaryIO) -> None:
    """The child's side: one request, then ``{"ok": bool}`` and, if ok, one frame per part
    of each table, ``[]`` after each table; ``{"error": text}`` if reading failed."""
    req = children.read_frame(inp)
    gc.disable()        # none of what is made here is cyclic; the collector only walks it
    try:
        app = appdb.open_app(Path(req["path"]), wait_ms=CHILD_WAIT_MS)
    except AttachError:     # locked, or gone: the caller reads the rows itself
        children.write_frame(out, {"ok": False})
        return
    appdb.sort_beside(app)
    try:
        with appdb.read_txn(app):
            try:
                same = child.file_as_left(app, req, __file__)
            except AttachError:
                same = False
            children.write_frame(out, {"ok": same})
            out.flush()
            if not same:
                return
            try:
                for name, columns, pk, parents, by_change in req["tables"]:
                    t = appdb.TableInfo(name, "", columns, pk, {}, False, [], parents,
                                        by_change=by_change)
                    for keys, raws in changes(app, t, req["since"], req["upto"]):
                        children.write_frame(out, [keys, raws])
                    children.write_frame(out, [])
            except AttachError as e:    # told to the capturing process, which raises it
                children.write_frame(out, {"error": str(e), "hint": e.hint})
            except Exception as e:
                children.write_frame(out, {"error": f"reading the application's changes "
                                               f"failed: {type(e).__name__}: {e}", "hint": None})
            out.flush()
    finally:
        app.close()


def main() -> None:
    children.run(_serve)


class Elsewhere:
    """A child process reading the changed rows of ``tables`` in (since, upto] of the file at
    ``path``: :meth:`changes` per table, in the order given.  Falsy when the child's snapshot
    differs from the caller's or it could not start (then read here)."""

    def __init__(self, path: str, tables: list[appdb.TableInfo], since: int, upto: int,
                 schema: int):
        proc = children.start("syncpack.attach.reader", {
            "path": str(path), "since": since, "upto": upto, "schema": schema,
            "module": __file__,
            "tables": [(t.name, t.columns, t.pk, t.parents, t.by_change) for t in tables]},
            more_input=False)
        self.child = (children.Sending(proc, depth=4, name="syncpack-capture-pipe")
                       if proc is not None else None)

    def __bool__(self) -> bool:
        return self.child is not None

    def changes(self) -> Iterator[tuple[list[str], list[bytes | None]]]:
        """The next table's (record keys, records), in parts."""
        for frame in self.child.run(AttachError, "the process reading the application's "
                                                  "changes ended early"):
            yield frame[0], frame[1]

    def close(self) -> None:
        """Stop the child if it is still running (an error on our side), and wait for it."""
        if self.child is not None:
            self.child.close()
