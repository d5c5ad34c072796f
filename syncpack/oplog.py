"""The changelog kept as Parquet segments, for the Spark engine (docs/design.md §9).

The layout, schema, manifest and append rules are ``formats/LOG.md``; change the two together.
In short: ``LOG/origin_hex=<hex>/ep-<first>-<last>.parquet`` segments, one origin per file in
contiguous epoch order, listed by ``LOG/_syncpack_log.json`` (the commit point of an append).

Writing (:func:`log_export`, :func:`append_log`) streams the store's changelog in bounded
batches into Parquet writers; reading (:func:`iter_origin_ops`, :func:`merged_log_ops`) streams
Arrow record batches back into :class:`~syncpack.codec.Op` tuples, checking contiguity, in the
same CSN order as :func:`syncpack.sync.merged_ops`.  The Spark executors and the tests both read
through these functions.

The log may live on a local path or at any URI pyarrow opens (``hdfs://``, ``s3://``...); only
local logs get fsync and a writer lock file.
"""

from __future__ import annotations

import fcntl
import heapq
import json
import os
import re
import secrets
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from itertools import islice, repeat
from pathlib import Path
from typing import Callable, Iterator

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from . import chain
from .codec import Op
from .errors import ExportError
from .packets import fsync_dir
from .progress import expect
from .site import Site, wall_ms

FORMAT = "syncpack-log"
VERSION = 1
MANIFEST = "_syncpack_log.json"
LOCK_FILE = "_lock"
DEFAULT_DIR = "log"                 # SITE/log: the site's own log
BATCH_ROWS = 65_536                 # rows per SQLite fetch, Arrow batch and Parquet row group
SEGMENT_ROWS = 16 * BATCH_ROWS      # rows per segment file at most
PARTITION = "origin_hex"

SCHEMA = pa.schema([
    pa.field("origin", pa.binary(), nullable=False),
    pa.field("epoch", pa.int64(), nullable=False),
    pa.field("hlc", pa.int64(), nullable=False),
    pa.field("seq", pa.int32(), nullable=False),
    pa.field("collection", pa.string(), nullable=False),
    pa.field("key", pa.string(), nullable=False),
    pa.field("value", pa.binary(), nullable=True),
    pa.field("replaced", pa.binary(), nullable=False),
])
# The same schema as Spark DDL (ad-hoc readers, and the shuffle strategy of the Spark engine).
SPARK_DDL = ("origin binary, epoch long, hlc long, seq int, collection string, key string, "
             "value binary, replaced binary")
_READ_COLUMNS = ["epoch", "hlc", "seq", "collection", "key", "value", "replaced"]
_SEGMENT_RE = re.compile(r"^ep-(\d{20})-(\d{20})\.parquet$")
# Op from an 8-tuple of column values: tuple.__new__ skips the Python-level __new__ of a
# NamedTuple, which is a third of the cost of turning Arrow batches into ops.
new_op = partial(tuple.__new__, Op)


# --- where the log lives ----------------------------------------------------------------------

class LogLocation:
    """A log directory: a local path, or a URI for a pyarrow filesystem."""

    def __init__(self, where: str | os.PathLike):
        text = os.fspath(where)
        self.text = text
        if "://" in text and not text.startswith("file://"):
            try:
                self.fs, root = pafs.FileSystem.from_uri(text)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError) as e:
                raise ExportError(f"cannot open the log at {text}: {e}") from None
            self.root = root.rstrip("/")
            self.local = False
        else:
            if text.startswith("file://"):
                text = text[len("file://"):]
            self.fs = pafs.LocalFileSystem()
            self.root = os.path.abspath(text)
            self.local = True

    def __str__(self) -> str:
        return self.text

    def path(self, rel: str) -> str:
        return f"{self.root}/{rel}" if rel else self.root

    def uri(self, rel: str) -> str:
        """What Spark's readers are given for ``rel``."""
        if self.local:
            return "file://" + self.path(rel)
        return self.text.rstrip("/") + "/" + rel

    # small filesystem helpers --------------------------------------------------------------

    def read_bytes(self, rel: str) -> bytes | None:
        try:
            with self.fs.open_input_stream(self.path(rel)) as f:
                return f.read()
        except FileNotFoundError:
            return None
        except OSError as e:
            if self.local and not os.path.exists(self.path(rel)):
                return None
            raise ExportError(f"cannot read {self.path(rel)}: {e}") from None

    def makedirs(self, rel: str) -> None:
        self.fs.create_dir(self.path(rel), recursive=True)

    def write_atomic(self, rel: str, data: bytes) -> None:
        final = self.path(rel)
        tmp = self.path(_tmp_name(rel))
        if self.local:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, final)
            fsync_dir(os.path.dirname(final))
        else:
            with self.fs.open_output_stream(tmp) as f:
                f.write(data)
            self.fs.move(tmp, final)

    def commit_file(self, tmp_rel: str, rel: str) -> None:
        """Make a closed temporary file durable under its final name."""
        tmp, final = self.path(tmp_rel), self.path(rel)
        if self.local:
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, final)
        else:
            self.fs.move(tmp, final)

    def sync_dir(self, rel: str) -> None:
        if self.local:
            fsync_dir(self.path(rel))

    def delete(self, rel: str) -> None:
        try:
            self.fs.delete_file(self.path(rel))
        except FileNotFoundError:
            pass
        except OSError:
            if not (self.local and not os.path.exists(self.path(rel))):
                raise

    def list_names(self, rel: str) -> list[str]:
        try:
            infos = self.fs.get_file_info(pafs.FileSelector(self.path(rel), allow_not_found=True))
        except OSError:
            return []
        return [i.base_name for i in infos]

    def open_parquet(self, rel: str) -> pq.ParquetFile:
        try:
            if self.local:
                return pq.ParquetFile(self.path(rel))
            return pq.ParquetFile(self.fs.open_input_file(self.path(rel)))
        except (OSError, pa.ArrowException) as e:
            raise ExportError(f"cannot read log segment {self.path(rel)}: {e}") from None

    @contextmanager
    def writer_lock(self) -> Iterator[None]:
        """Excludes a second writer of a local log (the site lock covers one site only)."""
        if not self.local:
            yield
            return
        os.makedirs(self.root, exist_ok=True)
        fd = os.open(self.path(LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise ExportError(f"another process is writing the log at {self.text}") from None
            yield
        finally:
            os.close(fd)


def _tmp_name(rel: str) -> str:
    head, _, name = rel.rpartition("/")
    tmp = f".{name}.{secrets.token_hex(4)}.tmp"
    return f"{head}/{tmp}" if head else tmp


def default_log_dir(site: Site) -> Path:
    return site.path / DEFAULT_DIR


def origin_dir(origin: bytes) -> str:
    return f"{PARTITION}={origin.hex()}"


def segment_path(origin: bytes, first: int, last: int) -> str:
    return f"{origin_dir(origin)}/ep-{first:020d}-{last:020d}.parquet"


# --- the manifest -----------------------------------------------------------------------------

@dataclass
class Segment:
    path: str           # relative to the log directory
    first: int
    last: int
    rows: int
    bytes: int

    def to_json(self) -> dict:
        return {"path": self.path, "first": self.first, "last": self.last, "rows": self.rows,
                "bytes": self.bytes}


@dataclass
class OriginLog:
    name: str
    floor: int
    top: int
    top_hlc: int | None = None
    top_seq: int | None = None
    segments: list[Segment] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"name": self.name, "floor": self.floor, "top": self.top,
                "top_hlc": self.top_hlc, "top_seq": self.top_seq,
                "segments": [s.to_json() for s in self.segments]}

    def overlapping(self, lo: int, hi: int) -> list[Segment]:
        """Segments holding any epoch in (lo, hi]."""
        return [s for s in self.segments if s.last > lo and s.first <= hi]


@dataclass
class Manifest:
    family_id: bytes
    producer: bytes
    producer_name: str
    updated_ms: int = 0
    origins: dict[bytes, OriginLog] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"format": FORMAT, "version": VERSION, "family_id": self.family_id.hex(),
                "producer": {"site_id": self.producer.hex(), "site": self.producer_name},
                "updated_ms": self.updated_ms,
                "origins": {o.hex(): e.to_json() for o, e in sorted(self.origins.items())}}

    @classmethod
    def from_json(cls, d, where: str) -> "Manifest":
        def bad(what: str) -> ExportError:
            return ExportError(f"the log at {where} has a bad manifest: {what}",
                               hint="rebuild it: remove the directory and run "
                                    "'syncpack log export DIR'")

        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise bad(f"not a {FORMAT} manifest")
        v = d.get("version")
        if type(v) is not int or v < 1:
            raise bad("no version")
        if v > VERSION:
            raise ExportError(f"the log at {where} has format version {v}, newer than this "
                              f"syncpack reads (up to {VERSION})",
                              hint="upgrade syncpack, or rebuild the log")
        try:
            man = cls(bytes.fromhex(d["family_id"]), bytes.fromhex(d["producer"]["site_id"]),
                      str(d["producer"]["site"]), int(d.get("updated_ms", 0)))
            for ohex, e in d["origins"].items():
                o = bytes.fromhex(ohex)
                ent = OriginLog(str(e["name"]), int(e["floor"]), int(e["top"]),
                                e.get("top_hlc"), e.get("top_seq"),
                                [Segment(str(s["path"]), int(s["first"]), int(s["last"]),
                                         int(s["rows"]), int(s["bytes"]))
                                 for s in e["segments"]])
                nxt = ent.floor + 1
                for s in ent.segments:
                    if s.first != nxt or s.last < s.first or s.rows != s.last - s.first + 1:
                        raise bad(f"segments of origin {ohex} are not contiguous at epoch {nxt}")
                    nxt = s.last + 1
                if nxt != ent.top + 1:
                    raise bad(f"segments of origin {ohex} end at {nxt - 1}, top is {ent.top}")
                man.origins[o] = ent
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise bad(f"{type(e).__name__}: {e}") from None
        return man


def read_manifest(loc: LogLocation) -> Manifest | None:
    raw = loc.read_bytes(MANIFEST)
    if raw is None:
        return None
    try:
        d = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ExportError(f"the log at {loc} has an unreadable manifest ({e})",
                          hint="rebuild it: remove the directory and run "
                               "'syncpack log export DIR'") from None
    return Manifest.from_json(d, loc.text)


def load_manifest(loc: LogLocation) -> Manifest:
    man = read_manifest(loc)
    if man is None:
        raise ExportError(f"{loc} is not a syncpack log (no {MANIFEST})",
                          hint="create it with 'syncpack log export DIR', or omit --log to use "
                               "the site's own log")
    return man


# --- appending --------------------------------------------------------------------------------

def log_export(site: Site, log_dir: str | os.PathLike | None = None,
               progress: Callable[[int], None] | None = None) -> dict:
    """Bring a Parquet log of ``site``'s changelog up to date (default: ``SITE/log``).

    Appends only epochs above what the log holds per origin, under the site lock and in one
    read snapshot of the store.  Returns counts (see :func:`append_log`)."""
    loc = LogLocation(default_log_dir(site) if log_dir is None else log_dir)
    with site.lock():
        conn = site.conn
        conn.execute("BEGIN")
        try:
            _man, stats = append_log(site, loc, progress)
        finally:
            conn.execute("ROLLBACK")  # a read snapshot only
    return stats


def append_log(site: Site, loc: LogLocation,
               progress: Callable[[int], None] | None = None) -> tuple[Manifest, dict]:
    """Append to the log what the store holds beyond it.

    The caller holds the site lock and has an open transaction on ``site.conn``: everything is
    read in that one snapshot, so a caller that plans an export in the same snapshot sees a log
    that matches its plan exactly.  Returns the new manifest and counts:
    ``{"log", "ops_written", "segments_written", "origins": {NAME: [FROM_EXCL, TO_INCL]},
    "rebuilt": [NAME...], "ops_held"}``."""
    with loc.writer_lock():
        man = read_manifest(loc)
        if man is None:
            man = Manifest(site.family_id, site.site_id, site.name)
        elif man.family_id != site.family_id:
            raise ExportError(f"the log at {loc} belongs to family {man.family_id.hex()}, "
                              f"this site to {site.family_id.hex()}",
                              hint="give each family its own log directory")
        elif man.producer != site.site_id:
            raise ExportError(f"the log at {loc} is kept by site {man.producer_name}; only that "
                              f"site appends to it",
                              hint="read it with 'export --engine spark --log DIR', or keep "
                                   "this site's own log elsewhere (default SITE/log)")
        _remove_leftovers(loc, man)
        vec = site.vector()
        floors = site.floors()
        names = site.names()
        stats = {"log": loc.text, "ops_written": 0, "segments_written": 0, "origins": {},
                 "rebuilt": []}
        dropped: list[str] = []
        for o in sorted(vec):
            top, floor = vec[o], floors.get(o, 0)
            name = names.get(o, o.hex())
            ent = man.origins.get(o)
            if ent is not None:
                diverged = ent.top > top or (
                    ent.top > max(floor, ent.floor) and ent.top_hlc is not None
                    and _csn_at(site, o, ent.top) != (ent.top_hlc, ent.top_seq))
                if diverged or floor > ent.top:
                    # A restored producer, or a hole the store has trimmed: start over.
                    dropped += [s.path for s in ent.segments]
                    stats["rebuilt"].append(name)
                    ent = None
            if ent is None:
                if not top:
                    continue
                ent = OriginLog(name, floor, floor)   # records the floor even when empty
            ent.name = name
            man.origins[o] = ent
            if top > ent.top:
                stats["origins"][name] = [ent.top, top]
                expect(progress, top - ent.top)
                n, k = _write_origin(site, loc, o, ent, top, progress)
                stats["ops_written"] += n
                stats["segments_written"] += k
        man.updated_ms = wall_ms()
        loc.write_atomic(MANIFEST, json.dumps(man.to_json(), indent=1).encode() + b"\n")
        for rel in dropped:
            loc.delete(rel)
        stats["ops_held"] = {e.name: [e.floor, e.top] for e in man.origins.values()}
        return man, stats


def _csn_at(site: Site, origin: bytes, epoch: int) -> tuple[int, int] | None:
    return chain.op_id_at(site.conn, origin, epoch)


def _remove_leftovers(loc: LogLocation, man: Manifest) -> None:
    """Segments of an interrupted append: in an origin directory, but not in the manifest."""
    listed = {s.path for e in man.origins.values() for s in e.segments}
    for d in loc.list_names(""):
        if not d.startswith(PARTITION + "="):
            continue
        for name in loc.list_names(d):
            rel = f"{d}/{name}"
            ours = _SEGMENT_RE.match(name) or (name.startswith(".ep-") and name.endswith(".tmp"))
            if ours and rel not in listed:
                loc.delete(rel)


def _write_origin(site: Site, loc: LogLocation, origin: bytes, ent: OriginLog, top: int,
                  progress) -> tuple[int, int]:
    """Stream epochs (ent.top, top] of ``origin`` into new segments; updates ``ent``."""
    d = origin_dir(origin)
    loc.makedirs(d)
    cur = (op[1:] for op in chain.iter_ops(site.conn, origin, ent.top, top))
    nxt = ent.top + 1
    written = segments = 0
    seg: dict | None = None

    def close_segment() -> None:
        nonlocal seg, segments
        seg["writer"].close()
        rel = segment_path(origin, seg["first"], nxt - 1)
        loc.commit_file(seg["tmp"], rel)
        size = loc.fs.get_file_info(loc.path(rel)).size
        ent.segments.append(Segment(rel, seg["first"], nxt - 1, nxt - seg["first"], size))
        segments += 1
        seg = None

    try:
        while True:
            rows = list(islice(cur, BATCH_ROWS))     # the store's cursors have no fetchmany
            if not rows:
                break
            cols = list(zip(*rows))
            n = len(rows)
            if cols[0][0] != nxt or cols[0][-1] != nxt + n - 1 \
                    or list(cols[0]) != list(range(nxt, nxt + n)):
                raise ExportError(f"the changelog of {ent.name} is not contiguous after epoch "
                                  f"{nxt - 1}; the log was not extended",
                                  hint="run 'syncpack fsck'")
            try:
                batch = pa.RecordBatch.from_arrays([
                    pa.repeat(pa.scalar(origin, pa.binary()), n),
                    pa.array(cols[0], pa.int64()), pa.array(cols[1], pa.int64()),
                    pa.array(cols[2], pa.int32()), pa.array(cols[3], pa.string()),
                    pa.array(cols[4], pa.string()), pa.array(cols[5], pa.binary()),
                    pa.array(cols[6], pa.binary())], schema=SCHEMA)
            except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as e:
                raise ExportError(f"an op of {ent.name} after epoch {nxt - 1} does not fit the "
                                  f"log schema: {e}") from None
            if seg is None:
                tmp = _tmp_name(f"{d}/ep-{nxt:020d}")
                w = pq.ParquetWriter(loc.path(tmp), SCHEMA, filesystem=loc.fs,
                                     compression="zstd", use_dictionary=["origin", "collection"],
                                     write_statistics=True)
                seg = {"writer": w, "tmp": tmp, "first": nxt, "rows": 0}
            seg["writer"].write_batch(batch, row_group_size=BATCH_ROWS)
            seg["rows"] += n
            nxt += n
            written += n
            ent.top, ent.top_hlc, ent.top_seq = nxt - 1, cols[1][-1], cols[2][-1]
            if progress:
                progress(n)
            if seg["rows"] >= SEGMENT_ROWS:
                close_segment()
        if seg is not None:
            close_segment()
    except BaseException:
        if seg is not None:
            try:
                seg["writer"].close()
            finally:
                loc.delete(seg["tmp"])
        raise
    if nxt != top + 1:
        raise ExportError(f"the changelog of {ent.name} ends at epoch {nxt - 1}, the vector "
                          f"says {top}; the log was not extended", hint="run 'syncpack fsck'")
    loc.sync_dir(d)
    return written, segments


# --- reading ----------------------------------------------------------------------------------

def _row_groups(pf: pq.ParquetFile, lo: int, hi: int) -> list[int]:
    """Row groups that may hold epochs in (lo, hi], by their statistics."""
    md = pf.metadata
    col = pf.schema_arrow.get_field_index("epoch")
    out = []
    for i in range(md.num_row_groups):
        st = md.row_group(i).column(col).statistics
        if st is not None and st.has_min_max and (st.max <= lo or st.min > hi):
            continue
        out.append(i)
    return out


def iter_origin_ops(loc: LogLocation, origin: bytes, ent: OriginLog, lo: int, hi: int,
                    batch_rows: int = BATCH_ROWS) -> Iterator[Op]:
    """Ops of ``origin`` with epochs in (lo, hi], in epoch (= CSN) order, from Arrow batches.

    Checks that the log holds each epoch exactly once, in order; raises :class:`ExportError`
    naming the first epoch it lacks otherwise."""
    if lo < ent.floor or hi > ent.top:
        raise ExportError(f"the log at {loc} holds epochs {ent.floor + 1}-{ent.top} of "
                          f"{ent.name}, not {lo + 1}-{hi}")
    expect = lo + 1
    for seg in ent.overlapping(lo, hi):
        pf = loc.open_parquet(seg.path)
        groups = _row_groups(pf, lo, hi)
        if not groups:
            continue
        for batch in pf.iter_batches(batch_size=batch_rows, row_groups=groups,
                                     columns=_READ_COLUMNS):
            n = batch.num_rows
            if not n:
                continue
            epochs = batch.column(0).to_pylist()
            first = epochs[0]
            if epochs != list(range(first, first + n)):
                raise ExportError(f"log segment {loc.path(seg.path)} is not in contiguous "
                                  f"epoch order")
            if first + n <= expect:
                continue        # wholly before the range
            if first > expect:
                break           # a hole: reported below
            a, b = expect - first, min(n, hi - first + 1)
            if a or b != n:
                batch = batch.slice(a, b - a)
                epochs = epochs[a:b]
            cols = [batch.column(i).to_pylist() for i in range(1, 7)]
            yield from map(new_op, zip(repeat(origin), epochs, *cols))
            expect = first + b
            if expect > hi:
                return
        else:
            continue
        break
    if expect <= hi:
        raise ExportError(f"the log at {loc} lacks epoch {expect} of {ent.name} "
                          f"(needed up to {hi})",
                          hint="rebuild it: remove the directory and run 'syncpack log export'")


def merged_log_ops(loc: LogLocation, man: Manifest,
                   ranges: dict[bytes, tuple[int, int]]) -> Iterator[Op]:
    """Ops of all ranges in CSN order, as :func:`syncpack.sync.merged_ops` gives them from the
    store: each origin's stream is already in CSN order, so a k-way merge suffices."""
    its = []
    for o, (lo, hi) in ranges.items():
        ent = man.origins.get(o)
        if ent is None:
            raise ExportError(f"the log at {loc} holds no ops of origin {o.hex()}")
        its.append(iter_origin_ops(loc, o, ent, lo, hi))
    if len(its) == 1:
        return its[0]
    return heapq.merge(*its, key=lambda op: (op.hlc, op.origin, op.seq))


def iter_log(log_dir: str | os.PathLike) -> Iterator[Op]:
    """Every op of a log, origin by origin in epoch order (for tests and inspection)."""
    loc = LogLocation(log_dir)
    man = load_manifest(loc)
    for o, ent in sorted(man.origins.items()):
        if ent.top > ent.floor:
            yield from iter_origin_ops(loc, o, ent, ent.floor, ent.top)
