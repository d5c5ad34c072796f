"""Reading a load file: its JSON lines checked and encoded, in batches of one replication
transaction each, here or, for a large file, in a child process on the other core.

Parsing and encoding is most of a large load's time (1M records: about 3 s of a 5.8 s load,
against about 2 s for the store's inserts and sealing), and all of it holds the GIL: a thread
would only take turns with the store's writer.  A child process (syncpack/children.py) has
an interpreter of its own, so it parses batch N+1 while this process writes batch N; what
crosses the pipe is one msgpack frame per batch, its columns ``[collections, keys, values,
deletes]``.  The child runs the same :func:`batches` as this process would, so a bad line is
refused with the same message; it only reads, and if either process dies the store's
transaction rolls back as after any failed load.
"""

from __future__ import annotations

import codecs
import gc
import json
import os
import stat
import sys
from contextlib import nullcontext
from itertools import chain
from json.scanner import make_scanner
from pathlib import Path
from typing import BinaryIO, Iterable, Iterator

from syncpack import children
from syncpack.errors import LoadError, SyncpackError
from syncpack.format import codec
from syncpack.format.values import MAX_DEPTH, json_value_encoder
from syncpack.site import MAX_NAME_CHARS, check_collection, check_key

# A load is one transaction, here and at every peer; it travels in parts of at most this many
# changes or bytes: each part is one block, which an importer decodes whole, applying the
# transaction when its last part is there.
LOAD_TXN_OPS = 100_000
LOAD_TXN_BYTES = 32 * 1024 * 1024
# A file of at least this many bytes is parsed by a child process: its start (an interpreter
# and the imports, 0.15-0.3 s of wall time) is then a small part of the load.
ELSEWHERE_AT = 8 * 1024 * 1024
# The path that names standard input, as for 'put -'.
STDIN = "-"


def named(p: Path) -> str:
    """How the file ``p`` is named in a message."""
    return "standard input" if str(p) == STDIN else str(p)

Row = tuple[str, str, bytes | None]


# Read this many bytes at a time: the first batch is parsed while the rest is unread.
READ_BYTES = 4 * 1024 * 1024
_NOT_UTF8_HINT = ("a load file is UTF-8 JSON lines; convert it (for instance iconv -f LATIN1 "
                  "-t UTF-8) and load it again; nothing was loaded")


def lines_of(p: Path) -> Iterator[str]:
    """The file's lines, read a piece at a time: each ends at a '\n' (a '\r' before it is
    JSON's whitespace, so a file with Windows line ends loads too).  Only '\n': JSON text may
    hold U+2028, U+2029 and U+0085 unescaped inside a string, which ``str.splitlines`` would
    cut.  A byte order mark at the start is skipped.  Bytes that are not UTF-8 are
    :class:`LoadError` naming their line and offset, raised once the lines before them are
    given (so the first bad line of a file is the one told, whatever is wrong with it)."""
    try:
        # standard input is read, not closed: it is the process's
        f = open(p, "rb") if str(p) != STDIN else nullcontext(sys.stdin.buffer)
    except FileNotFoundError:
        raise LoadError(f"{p}: no such file", hint="check the path; nothing was loaded") from None
    except OSError as e:
        raise _unreadable(p, e) from None
    decode = codecs.getincrementaldecoder("utf-8-sig")().decode
    held: list[str] = []    # read, and after the last '\n' read so far
    at = newlines = 0       # bytes and '\n's read before this piece
    with f as f:
        while True:
            try:
                raw = f.read(READ_BYTES)
            except OSError as e:
                raise _unreadable(p, e) from None
            bad = None
            try:
                piece = decode(raw, not raw)
            except UnicodeDecodeError as e:
                # e.object: the bytes this call decoded, a suffix of those read so far
                good = e.object[:e.start]
                piece = good.decode("utf-8")
                piece = piece[:piece.rfind("\n") + 1]      # the bad byte's line is not given
                line = newlines + good.count(b"\n") + 1
                offset = at + len(raw) - len(e.object) + e.start
                bad = LoadError(f"{named(p)} line {line}: not UTF-8 text (byte 0x{e.object[e.start]:02x} "
                                f"at offset {offset} of the file)", hint=_NOT_UTF8_HINT)
            at += len(raw)
            newlines += raw.count(b"\n")
            # A piece without a '\n' is only held, and joined once one comes (a long line
            # costs its length, not its square).
            cut = piece.rfind("\n") + 1
            if cut:
                text = "".join(held) + piece[:cut] if held else piece[:cut]
                held = [piece[cut:]]
                lines = text.split("\n")
                lines.pop()     # the '' after the last '\n'
                yield from lines
            elif piece:
                held.append(piece)
            if bad is not None:
                raise bad
            if not raw:
                break
        tail = "".join(held)
        if tail:
            yield tail


def _unreadable(p: Path, e: OSError) -> LoadError:
    return LoadError(f"{named(p)}: cannot read ({e.strerror or e})",
                     hint="a load file is UTF-8 JSON lines, readable by this user")


def records_in(p: Path) -> int:
    """How many records the file holds (blank lines are none), for a progress bar."""
    return sum(1 for line in lines_of(p) if line and not line.isspace())


_JSON_SCAN = make_scanner(json.JSONDecoder())


def batches(p: Path, lines: Iterable[str], ops: int = 0, size_limit: int = 0
            ) -> Iterator[tuple[list[Row], int]]:
    """The file's records, checked and encoded, in batches of one replication transaction
    (one block): at most ``ops`` records (LOAD_TXN_OPS) or ``size_limit`` bytes of keys and
    values (LOAD_TXN_BYTES); each batch with how many of its records are deletes.  A bad line
    is :class:`LoadError`, naming it."""
    ops = ops or LOAD_TXN_OPS
    size_limit = size_limit or LOAD_TXN_BYTES
    rows: list[Row] = []
    append = rows.append
    size = deletes = 0
    scan = _JSON_SCAN
    encode = json_value_encoder()
    collections: set[str] = set()
    for n, line in enumerate(lines, 1):
        if not line or line.isspace():
            continue
        try:
            # json.loads's own C scanner without its Python wrapper (half its time); any line
            # it does not take whole goes through json.loads, for the same result or error
            try:
                d, end = scan(line, 0)
            except StopIteration:
                end = -1
            if end < 0 or (end != len(line) and not line[end:].isspace()):
                d = json.loads(line)
        except json.JSONDecodeError as e:
            raise LoadError(f"{named(p)} line {n}: not valid JSON ({e.msg})",
                            hint="nothing was loaded; fix the line and load the file again") from None
        except RecursionError:      # the parser's own limit, below the one of a value
            raise LoadError(f"{named(p)} line {n}: nested more than {MAX_DEPTH} levels deep",
                            hint="nothing was loaded; fix the line and load the file again") from None
        try:
            if type(d) is not dict:
                raise ValueError("each line must be a JSON object")
            coll, key = d.get("collection"), d.get("key")
            if type(coll) is not str or type(key) is not str:
                raise ValueError("needs string fields 'collection' and 'key'")
            if coll not in collections:
                check_collection(coll)
                collections.add(coll)
            if not key or len(key) > MAX_NAME_CHARS or not key.isascii():
                check_key(key)      # the rule of a put (the common key needs no more)
            if len(d) == 3 and "value" in d:
                # NaN or Infinity (json.loads takes them) and unencodable values are refused
                # with their line
                raw = encode(d["value"])
                if len(raw) > codec.MAX_VALUE_BYTES:
                    raise ValueError(f"a value is limited to {codec.MAX_VALUE_BYTES} bytes "
                                     f"encoded (this one is {len(raw)})")
                append((coll, key, raw))
                size += len(key) + len(raw)
            elif d.get("delete") is True:
                if "value" in d:
                    raise ValueError("a line has either 'value' or 'delete': true, not both")
                append((coll, key, None))
                size += len(key)
                deletes += 1
            elif "value" in d:
                extra = set(d) - {"collection", "key", "value"}
                raise ValueError(f"unexpected field(s): {', '.join(sorted(extra))}")
            else:
                raise ValueError("needs 'value' or 'delete': true")
        except (ValueError, SyncpackError) as e:
            raise LoadError(f"{named(p)} line {n}: {e}",
                            hint="nothing was loaded; fix the line and load the file again") from None
        if len(rows) >= ops or size >= size_limit:
            yield rows, deletes
            rows, size, deletes = [], 0, 0
            append = rows.append
    if rows:
        yield rows, deletes


def parsed(p: Path, count: bool) -> tuple[int, Iterable[tuple[list[Row], int]]]:
    """(how many records the file holds if ``count``, else 0; its :func:`batches`, to be
    taken once and closed): read by a child process for a large file (closing them stops
    it), else here.  Counting reads the file once more, first."""
    # Only a regular file is read twice (counted, then loaded) or by a child: a pipe, a
    # FIFO or standard input is read once, here (counted first, a pipe's records were
    # consumed by the count and the load found none, and said so as a success).
    try:
        st = os.stat(p) if str(p) != STDIN else None
    except OSError:
        st = None       # lines_of says what is wrong with it
    regular = st is not None and stat.S_ISREG(st.st_mode)
    if regular and st.st_size >= ELSEWHERE_AT:
        child = Elsewhere(p, count)
        if child:
            return child.records, child
    return (records_in(p) if count and regular else 0), batches(p, lines_of(p))


# --- the child process ---------------------------------------------------------------------------

def _serve(inp: BinaryIO, out: BinaryIO) -> None:
    """The child's side: one request; then ``{"ok": true, "records": n}`` and one frame per
    batch, ``[]`` after the last; or ``{"ok": false}`` (another file of code: the caller
    parses the file itself), or ``{"error", "hint"}`` (the file, or a line of it, is refused,
    as the caller would have refused it)."""
    req = children.read_frame(inp)
    gc.disable()        # none of what is made here is cyclic; the collector only walks it
    if req.get("module") != __file__:
        children.write_frame(out, {"ok": False})
        return
    p = Path(req["path"])
    try:
        lines = lines_of(p)
        first = next(lines, None)   # the file opened, and its first piece read
        children.write_frame(out, {"ok": True,
                                   "records": records_in(p) if req["count"] else 0})
        out.flush()
        if first is not None:
            lines = chain((first,), lines)
        for rows, deletes in batches(p, lines, req["ops"], req["bytes"]):
            colls, keys, raws = zip(*rows)
            children.write_frame(out, [colls, keys, raws, deletes])
        children.write_frame(out, [])
    except LoadError as e:      # told to the loading process, which raises it
        children.write_frame(out, {"error": str(e), "hint": e.hint})
    except Exception as e:
        children.write_frame(out, {"error": f"{p}: parsing the file failed: "
                                            f"{type(e).__name__}: {e}",
                                   "hint": "nothing was loaded; run the command again"})
    out.flush()


def main() -> None:
    children.run(_serve)


class Elsewhere:
    """A child process parsing the load file ``p``: :attr:`records` and :meth:`batches`.
    Falsy when it could not start or serve (then parse here)."""

    def __init__(self, p: Path, count: bool):
        self.p = p
        proc, answer = children.started("syncpack.admin.loading", {
            "path": os.fspath(p), "module": __file__, "ops": LOAD_TXN_OPS,
            "bytes": LOAD_TXN_BYTES, "count": count}, more_input=False)
        if answer is not None and "error" in answer:    # the file cannot be read
            raise LoadError(str(answer["error"]), hint=answer.get("hint"))
        self.records = int(answer.get("records", 0)) if proc is not None else 0
        self.child = (children.Sending(proc, depth=2, name="syncpack-load-pipe")
                       if proc is not None else None)

    def __bool__(self) -> bool:
        return self.child is not None

    def __iter__(self) -> Iterator[tuple[list[Row], int]]:
        return self.batches()

    def close(self) -> None:
        """Stop the child, whether or not its batches were taken (a load that fails before
        its first batch must not leave it waiting on a full pipe)."""
        if self.child is not None:
            self.child.close()

    def batches(self) -> Iterator[tuple[list[Row], int]]:
        """The child's batches, as :func:`batches` gives them; the child is stopped when
        they end, or when the caller stops taking them."""
        try:
            for colls, keys, raws, deletes in self.child.run(
                    _load_error, f"{self.p}: the process reading the file ended early"):
                yield list(zip(colls, keys, raws)), deletes
        finally:
            self.child.close()


def _load_error(text: str, hint: str | None) -> LoadError:
    return LoadError(text, hint=hint or "nothing was loaded; run the command again")
