"""The site's blocks kept as Parquet segments, for the Spark engine (docs/design.md §9).

The layout, schema, manifest and append rules are ``formats/LOG.md``; change the two together.
In short: ``LOG/origin_hex=<hex>/ep-<first>-<last>.parquet`` segments, one origin per file, one
row per stored block (formats/BLOCKS.md) in epoch order, listed by ``LOG/_syncpack_log.json``
(the commit point of an append).

The log holds blocks, not ops, because only an origin can sign its ops: a packet carries each
origin's blocks byte for byte (:func:`syncpack.exchange.packets.build_update_packets`), so whoever builds
packets from the log needs those very bytes.  Writing (:func:`log_export`, :func:`append_log`)
copies the store's blocks (:func:`syncpack.store.chain.covering`, :func:`syncpack.store.chain.block_bytes`)
in bounded row groups; reading gives :class:`~syncpack.exchange.packets.BlockRef` objects, either the
log's cover of given per-origin ranges (:func:`iter_origin_blocks`) or exactly the blocks an
export plan names, checked against it (:func:`planned_blocks`), which is what the Spark
executors use.

The log may live on a local path or at any URI pyarrow opens (``hdfs://``, ``s3://``...); only
local logs get fsync and a writer lock file.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from syncpack.format import blocks
from syncpack.store import chain, db
from syncpack.format.codec import Op
from syncpack.errors import ExportError, arg
from syncpack.exchange.packets import BlockRef
from syncpack.fileops import fsync_dir, locked, write_atomic
from syncpack.progress import expect
from syncpack.site import Site, wall_ms

FORMAT = "syncpack-log"
VERSION = 2                         # 1 kept one row per op, before packets carried blocks
MANIFEST = "_syncpack_log.json"
LOCK_FILE = "_lock"
DEFAULT_DIR = "log"                 # SITE/log: the site's own log
PARTITION = "origin_hex"
# Blocks run from a few hundred bytes to hundreds of megabytes, so row groups and segments are
# bounded by bytes, not rows: a reader holds about one row group per origin it reads.
ROW_GROUP_BYTES = 32 * 1024 * 1024
SEGMENT_BYTES = 256 * 1024 * 1024
READ_BATCH = 16                     # blocks per Arrow batch when reading back (and in Spark)

SCHEMA = pa.schema([
    pa.field("origin", pa.binary(), nullable=False),
    pa.field("lo", pa.int64(), nullable=False),
    pa.field("hi", pa.int64(), nullable=False),
    pa.field("hlc_first", pa.int64(), nullable=False),
    pa.field("hlc_last", pa.int64(), nullable=False),
    pa.field("last_seq", pa.int64(), nullable=False),
    pa.field("hash", pa.binary(), nullable=False),
    pa.field("data", pa.binary(), nullable=False),
])
# The same schema as Spark DDL (ad-hoc readers, and the shuffle strategy of the Spark engine).
SPARK_DDL = ("origin binary, lo long, hi long, hlc_first long, hlc_last long, last_seq long, "
             "hash binary, data binary")
# A block is already a zstd frame: compressing it again costs time and gains nothing.
_COMPRESSION = {**{f.name: "zstd" for f in SCHEMA}, "data": "none"}
# Statistics only where readers prune by them; min/max of megabyte binaries would be waste.
_STATISTICS = ["lo", "hi", "hlc_first", "hlc_last"]
_SEGMENT_RE = re.compile(r"^ep-(\d{20})-(\d{20})\.parquet$")
_SEGMENT_REL_RE = re.compile(r"^origin_hex=[0-9a-f]{16}/ep-\d{20}-\d{20}\.parquet$")
_REBUILD_HINT = "rebuild it: remove the directory and run 'syncpack log export DIR'"


# --- where the log lives ----------------------------------------------------------------------

class LogLocation:
    """A log directory: a local path, or a URI for a pyarrow filesystem."""

    def __init__(self, where: str | os.PathLike, what: str = "the log"):
        text = os.fspath(where)
        self.text = text
        if "://" in text and not text.startswith("file://"):
            try:
                self.fs, root = pafs.FileSystem.from_uri(text)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError) as e:
                # Arrow's text for a missing HDFS client runs to pages: its first line says it
                why = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
                raise ExportError(f"cannot open {what} at {text}: {why}",
                                  hint="a URI needs its filesystem's client on this machine "
                                       "(for hdfs://, Hadoop's libhdfs and JAVA_HOME); a "
                                       "local directory needs none") from None
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
            write_atomic(final, data, tmp=tmp)
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
        with locked(self.path(LOCK_FILE), lambda: ExportError(
                f"another process is writing the log at {self.text}")):
            yield


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
    first: int          # epochs first..last: lo+1 of its first block, hi of its last
    last: int
    blocks: int
    bytes: int

    def to_json(self) -> dict:
        return {"path": self.path, "first": self.first, "last": self.last,
                "blocks": self.blocks, "bytes": self.bytes}


@dataclass
class OriginLog:
    name: str
    floor: int                      # lo of the first block logged: epochs <= floor are not here
    top: int                        # hi of the last block logged
    top_hash: bytes | None = None   # its block hash: how an append tells the history went on
    segments: list[Segment] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"name": self.name, "floor": self.floor, "top": self.top,
                "top_hash": self.top_hash.hex() if self.top_hash else None,
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
    # Segments of an older-version log at this place, which the next append replaces.
    superseded: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"format": FORMAT, "version": VERSION, "family_id": self.family_id.hex(),
                "producer": {"site_id": self.producer.hex(), "site": self.producer_name},
                "updated_ms": self.updated_ms,
                "origins": {o.hex(): e.to_json() for o, e in sorted(self.origins.items())}}

    @classmethod
    def from_json(cls, d, where: str, upgrade: bool = False) -> "Manifest":
        """``upgrade``: an older-version log comes back empty, its segments in ``superseded``
        (for its producer's append, which rewrites it); otherwise it is refused."""
        def bad(what: str) -> ExportError:
            return ExportError(f"the log at {where} has a bad manifest: {what}",
                               hint=_REBUILD_HINT)

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
            if v < VERSION:
                if not upgrade:
                    raise ExportError(
                        f"the log at {where} has format version {v}, which kept single ops; "
                        f"packets now carry the blocks their origins signed, which this "
                        f"syncpack keeps in log version {VERSION}",
                        hint=f"re-export the log: 'syncpack log export {arg(where)}' at "
                             f"{man.producer_name}, the site that keeps it, rewrites it")
                man.superseded = _old_segments(d)
                return man
            for ohex, e in d["origins"].items():
                o = bytes.fromhex(ohex)
                th = e.get("top_hash")
                ent = OriginLog(str(e["name"]), int(e["floor"]), int(e["top"]),
                                bytes.fromhex(th) if th is not None else None,
                                [Segment(str(s["path"]), int(s["first"]), int(s["last"]),
                                         int(s["blocks"]), int(s["bytes"]))
                                 for s in e["segments"]])
                reach = ent.floor
                for k, s in enumerate(ent.segments):
                    # Blocks never leave a hole; a re-sealed block may start below where the
                    # one before it ended, never above.
                    if (s.first != reach + 1 if k == 0 else s.first > reach + 1) \
                            or s.last <= reach or s.blocks < 1:
                        raise bad(f"segments of origin {ohex} do not continue each other at "
                                  f"epoch {reach + 1}")
                    reach = s.last
                if reach != ent.top:
                    raise bad(f"segments of origin {ohex} end at {reach}, top is {ent.top}")
                if ent.segments and (ent.top_hash is None
                                     or len(ent.top_hash) != blocks.HASH_LEN):
                    raise bad(f"origin {ohex} has no hash of its top block")
                man.origins[o] = ent
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise bad(f"{type(e).__name__}: {e}") from None
        return man


def _old_segments(d: dict) -> list[str]:
    """The segment files an older-version manifest lists (only names a log of ours can have:
    they are deleted)."""
    out = []
    try:
        for e in d["origins"].values():
            out += [s["path"] for s in e["segments"]
                    if isinstance(s["path"], str) and _SEGMENT_REL_RE.match(s["path"])]
    except (KeyError, TypeError, AttributeError):
        pass
    return out


def read_manifest(loc: LogLocation, upgrade: bool = False) -> Manifest | None:
    raw = loc.read_bytes(MANIFEST)
    if raw is None:
        return None
    try:
        d = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ExportError(f"the log at {loc} has an unreadable manifest ({e})",
                          hint=_REBUILD_HINT) from None
    return Manifest.from_json(d, loc.text, upgrade)


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
    """Bring a Parquet log of ``site``'s blocks up to date (default: ``SITE/log``).

    Our own unsealed ops are sealed into blocks first (as an export would: they are sealed
    once, and these very blocks are what every packet carries).  Then appends only blocks
    above what the log holds per origin, under the site lock and in one read snapshot of the
    store.  Returns counts (see :func:`append_log`)."""
    loc = LogLocation(default_log_dir(site) if log_dir is None else log_dir)
    with site.lock():
        conn = site.conn
        if chain.has_pending(conn, site.site_id):
            with site.write_txn():
                site.seal_pending()
        with db.read_txn(conn):     # a read snapshot only
            _man, stats = append_log(site, loc, progress)
    return stats


def append_log(site: Site, loc: LogLocation,
               progress: Callable[[int], None] | None = None) -> tuple[Manifest, dict]:
    """Append to the log the blocks the store holds beyond it.

    The caller holds the site lock and has an open transaction on ``site.conn``: everything is
    read in that one snapshot, so a caller that plans an export in the same snapshot sees a log
    that matches its plan exactly.  Our own ops not sealed yet are not blocks and are not
    logged: a caller that wants them in seals them first (:meth:`Site.seal_pending`, in a write
    transaction of its own).  A log of an older format version is rewritten.  Returns the new
    manifest and counts: ``{"log", "ops_written", "blocks_written", "segments_written",
    "origins": {NAME: [FROM_EXCL, TO_INCL]}, "rebuilt": [NAME...], "ops_held"}``."""
    with loc.writer_lock():
        man = read_manifest(loc, upgrade=True)
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
        dropped, man.superseded = man.superseded, []
        _remove_leftovers(loc, man, keep=set(dropped))
        conn = site.conn
        vec = site.vector()
        floors = site.floors()
        names = site.names()
        stats = {"log": loc.text, "ops_written": 0, "blocks_written": 0, "segments_written": 0,
                 "origins": {}, "rebuilt": []}
        for o in sorted(vec):
            top, floor = vec[o], floors.get(o, 0)
            name = names.get(o, o.hex())
            ent = man.origins.get(o)
            new: list[chain.StoredBlock] | None = None
            if ent is not None:
                new = _extension(conn, o, ent, floor, top)
                if new is None:
                    # A restored producer, or a hole the store has trimmed: start over.
                    dropped += [s.path for s in ent.segments]
                    stats["rebuilt"].append(name)
                    del man.origins[o]
                    ent = None
            if ent is None:
                if not top:
                    continue
                new = chain.covering(conn, o, floor, top) if top > floor else []
                start = new[0].lo if new else floor
                if start > floor:
                    raise _store_lacks(name, floor, start)
                ent = OriginLog(name, start, start)   # records the floor even when empty
            ent.name = name
            man.origins[o] = ent
            if new and not ent.segments:
                ent.floor = ent.top = new[0].lo   # an empty entry starts at its first block
            reach = new[-1].hi if new else ent.top
            if reach < top and not (o == site.site_id and chain.has_pending(conn, o)):
                raise _store_lacks(name, reach, top)
            if new:
                stats["origins"][name] = [ent.top, reach]
                expect(progress, reach - ent.top)
                n, k, s = _write_blocks(conn, loc, o, ent, new, progress)
                stats["ops_written"] += n
                stats["blocks_written"] += k
                stats["segments_written"] += s
        man.updated_ms = wall_ms()
        loc.write_atomic(MANIFEST, json.dumps(man.to_json(), indent=1).encode() + b"\n")
        listed = {s.path for e in man.origins.values() for s in e.segments}
        for rel in dropped:
            if rel not in listed:   # a new segment may have taken an old one's name
                loc.delete(rel)
        stats["ops_held"] = {e.name: [e.floor, e.top] for e in man.origins.values()}
        return man, stats


def _store_lacks(name: str, lo: int, hi: int) -> ExportError:
    return ExportError(f"this site's store lacks epochs {lo + 1}..{hi} of {name}; the log was "
                       f"not extended", hint="run 'syncpack fsck'")


def _extension(conn, origin: bytes, ent: OriginLog, floor: int,
               top: int) -> list[chain.StoredBlock] | None:
    """The store's blocks above the log's top that continue the history the log holds, or
    None when the log must start over (the producer's history went another way, or the store
    trimmed past the log's top)."""
    if ent.top > top:
        return None                     # the producer went back in time: a restore
    held = chain.block_ending_at(conn, origin, ent.top) if ent.top > ent.floor else None
    if held is not None and held.hash != ent.top_hash:
        return None                     # the same epochs, another block: another history
    new = chain.covering(conn, origin, ent.top, top) if top > ent.top else []
    if not new:
        # Nothing above the top: all trimmed (the log restarts at the new floor), or our own
        # ops not sealed yet, or damage (the caller compares the reach with the vector).
        return None if floor > ent.top else []
    if new[0].lo > ent.top:
        return None                     # a hole between the log and the store
    if held is None and ent.top > ent.floor and new[0].lo == ent.top:
        # The log's top block was trimmed here; the next block names its predecessor.
        prev = blocks.read_block_header(chain.block_bytes(conn, new[0])).prev_hash
        if prev != ent.top_hash:
            return None
    return new


def _remove_leftovers(loc: LogLocation, man: Manifest, keep: set[str]) -> None:
    """Segments of an interrupted append: in an origin directory, but not in the manifest
    (nor in ``keep``: an older log's segments, deleted once the new manifest is in place)."""
    listed = {s.path for e in man.origins.values() for s in e.segments} | keep
    for d in loc.list_names(""):
        if not d.startswith(PARTITION + "="):
            continue
        for name in loc.list_names(d):
            rel = f"{d}/{name}"
            ours = _SEGMENT_RE.match(name) or (name.startswith(".ep-") and name.endswith(".tmp"))
            if ours and rel not in listed:
                loc.delete(rel)


class _SegmentWriter:
    """One segment being written under a temporary name, one row group per flush."""

    def __init__(self, loc: LogLocation, origin: bytes, first: int):
        self.loc, self.origin, self.first = loc, origin, first
        self.tmp = _tmp_name(f"{origin_dir(origin)}/ep-{first:020d}")
        self.writer = pq.ParquetWriter(loc.path(self.tmp), SCHEMA, filesystem=loc.fs,
                                       compression=_COMPRESSION, use_dictionary=["origin"],
                                       write_statistics=_STATISTICS)
        self.blocks = self.bytes = 0
        self.last = first - 1

    def write(self, rows: list[tuple]) -> None:
        cols = list(zip(*rows))
        n = len(rows)
        table = pa.Table.from_arrays([
            pa.repeat(pa.scalar(self.origin, pa.binary()), n),
            *(pa.array(c, pa.int64()) for c in cols[:5]),
            pa.array(cols[5], pa.binary()), pa.array(cols[6], pa.binary())], schema=SCHEMA)
        self.writer.write_table(table, row_group_size=n)     # one row group
        self.blocks += n
        self.bytes += sum(map(len, cols[6]))
        self.last = cols[1][-1]

    def commit(self) -> Segment:
        self.writer.close()
        rel = segment_path(self.origin, self.first, self.last)
        self.loc.commit_file(self.tmp, rel)
        size = self.loc.fs.get_file_info(self.loc.path(rel)).size
        return Segment(rel, self.first, self.last, self.blocks, size)

    def discard(self) -> None:
        try:
            self.writer.close()
        finally:
            self.loc.delete(self.tmp)


def _write_blocks(conn, loc: LogLocation, origin: bytes, ent: OriginLog,
                  new: list[chain.StoredBlock], progress) -> tuple[int, int, int]:
    """Copy the store's blocks ``new`` (continuing the log's chain) into new segments, byte
    for byte; updates ``ent``.  Returns (ops, blocks, segments) written."""
    d = origin_dir(origin)
    loc.makedirs(d)
    seg: _SegmentWriter | None = None
    rows: list[tuple] = []
    size = ops = segments = 0

    def flush() -> None:
        nonlocal seg, rows, size, segments
        if seg is None:
            seg = _SegmentWriter(loc, origin, rows[0][0] + 1)
        seg.write(rows)
        rows, size = [], 0
        if seg.bytes >= SEGMENT_BYTES:
            ent.segments.append(seg.commit())
            seg = None
            segments += 1

    try:
        for b in new:
            if b.lo > ent.top or b.hi <= ent.top:
                raise ExportError(f"the blocks of {ent.name} this site holds do not continue "
                                  f"each other at epoch {ent.top}; the log was not extended",
                                  hint="run 'syncpack fsck'")
            data = chain.block_bytes(conn, b)
            if rows and size + len(data) > ROW_GROUP_BYTES:
                flush()             # so a large block sits alone in its row group
            rows.append((b.lo, b.hi, b.hlc_first, b.hlc_last, b.last_seq, b.hash, data))
            size += len(data)
            n = b.hi - ent.top      # the epochs it adds (a re-sealed block may overlap)
            ops += n
            ent.top, ent.top_hash = b.hi, b.hash
            if progress:
                progress(n)
        if rows:
            flush()
        if seg is not None:
            ent.segments.append(seg.commit())
            seg = None
            segments += 1
    except BaseException:
        if seg is not None:
            seg.discard()
        raise
    loc.sync_dir(d)
    return ops, len(new), segments


# --- reading ----------------------------------------------------------------------------------

def _row_groups(pf: pq.ParquetFile, lo: int, hi: int) -> list[int]:
    """Row groups that may hold blocks overlapping epochs (lo, hi], by their statistics."""
    md = pf.metadata
    names = pf.schema_arrow.names
    c_lo, c_hi = names.index("lo"), names.index("hi")
    out = []
    for i in range(md.num_row_groups):
        rg = md.row_group(i)
        s_lo, s_hi = rg.column(c_lo).statistics, rg.column(c_hi).statistics
        if s_hi is not None and s_hi.has_min_max and s_hi.max <= lo:
            continue
        if s_lo is not None and s_lo.has_min_max and s_lo.min >= hi:
            continue
        out.append(i)
    return out


def _rows(loc: LogLocation, ent: OriginLog, lo: int, hi: int,
          columns: list[str]) -> Iterator[tuple]:
    """Rows of one origin's blocks that may overlap (lo, hi], in the log's order (ascending
    ``hi``, which is checked), a few blocks at a time."""
    prev = None
    for seg in ent.overlapping(lo, hi):
        pf = loc.open_parquet(seg.path)
        try:
            groups = _row_groups(pf, lo, hi)
            batches = pf.iter_batches(batch_size=READ_BATCH, row_groups=groups,
                                      columns=["hi", *columns]) if groups else ()
            for batch in batches:
                cols = [batch.column(i).to_pylist() for i in range(batch.num_columns)]
                for row in zip(*cols):
                    if prev is not None and row[0] <= prev:
                        raise ExportError(f"log segment {loc.path(seg.path)} is not in epoch "
                                          f"order", hint=_REBUILD_HINT)
                    prev = row[0]
                    yield row
        except (OSError, pa.ArrowException) as e:
            raise ExportError(f"cannot read log segment {loc.path(seg.path)}: {e}") from None


def _check_range(loc: LogLocation, ent: OriginLog, lo: int, hi: int) -> None:
    if lo < ent.floor or hi > ent.top:
        raise ExportError(f"the log at {loc} holds epochs {ent.floor + 1}-{ent.top} of "
                          f"{ent.name}, not {lo + 1}-{hi}")


def iter_origin_blocks(loc: LogLocation, origin: bytes, ent: OriginLog, lo: int,
                       hi: int) -> Iterator[BlockRef]:
    """The log's blocks of ``origin`` that together hold epochs (lo, hi], in epoch order.

    A block is never cut, so the first may start below ``lo`` and the last end above ``hi``.
    Raises :class:`ExportError` naming the first epoch the log lacks."""
    _check_range(loc, ent, lo, hi)
    reach = lo
    if reach < hi:
        for bhi, blo, h1, h2, seq, data in _rows(
                loc, ent, lo, hi, ["lo", "hlc_first", "hlc_last", "last_seq", "data"]):
            if bhi <= reach:
                continue        # wholly below, or within what the blocks before it hold
            if blo > reach:
                break           # a hole: reported below
            yield BlockRef(origin, blo, bhi, h1, h2, seq, data)
            reach = bhi
            if reach >= hi:
                return
    if reach < hi:
        raise ExportError(f"the log at {loc} lacks epoch {reach + 1} of {ent.name} "
                          f"(needed up to {hi})", hint=_REBUILD_HINT)


def checked_block(data: bytes, want: chain.StoredBlock, family: bytes, where: str,
                  name: str) -> BlockRef:
    """``data`` as the block ``want`` (from an export plan), if it is that block, whole.

    The header must name the same origin, epochs, clocks and block hash as the plan, and the
    body must match its hash: so a log from anywhere can only supply the bytes the plan means,
    and a damaged one fails the export before any packet is recorded as sent."""
    what = f"the block of epochs {want.lo + 1}-{want.hi} of {name} in the log at {where}"
    try:
        info = blocks.read_block_header(data, family)
    except blocks.BlockError as e:
        raise ExportError(f"{what} is damaged: {e}", hint=_REBUILD_HINT) from None
    if (info.origin, info.lo, info.hi, info.hlc_first, info.hlc_last, info.block_hash) != \
            (want.origin, want.lo, want.hi, want.hlc_first, want.hlc_last, want.hash):
        raise ExportError(f"{what} is not the block this site holds for those epochs: the "
                          f"log continues another history",
                          hint="export from the site's own log (omit --log), or rebuild this "
                               "one at the site that keeps it")
    if hashlib.blake2b(info.body, digest_size=blocks.HASH_LEN).digest() != info.body_hash:
        raise ExportError(f"{what} is damaged: its body does not match its hash",
                          hint=_REBUILD_HINT)
    return BlockRef(want.origin, want.lo, want.hi, want.hlc_first, want.hlc_last, want.last_seq,
                    data)


def select_blocks(loc: LogLocation, origin: bytes, ent: OriginLog,
                  want: list[chain.StoredBlock], family: bytes) -> Iterator[BlockRef]:
    """The blocks ``want`` of ``origin`` (in epoch order) with their bytes from the log, each
    checked by :func:`checked_block`; one pass over the segments that hold them."""
    if not want:
        return
    _check_range(loc, ent, want[0].lo, want[-1].hi)
    k = 0
    for bhi, data in _rows(loc, ent, want[0].lo, want[-1].hi, ["data"]):
        w = want[k]
        if bhi < w.hi:
            continue
        if bhi > w.hi:
            break               # the log has no block ending where the planned one does
        yield checked_block(data, w, family, loc.text, ent.name)
        k += 1
        if k == len(want):
            return
    w = want[k]
    raise ExportError(f"the log at {loc} lacks the block of epochs {w.lo + 1}-{w.hi} of "
                      f"{ent.name}", hint=_REBUILD_HINT)


def planned_blocks(loc: LogLocation, man: Manifest, want: Iterable[chain.StoredBlock],
                   family: bytes) -> Iterator[BlockRef]:
    """The blocks of an export plan (:attr:`syncpack.exchange.sync.PeerPlan.blocks`, in the order they
    travel) with their bytes from the log.  Each origin's blocks are read in one pass over its
    segments, the origins' readers side by side, so memory stays at a few row groups per
    origin, whatever the number of blocks."""
    want = list(want)
    per: dict[bytes, list[chain.StoredBlock]] = {}
    for b in want:
        per.setdefault(b.origin, []).append(b)
    readers = {}
    for o, bs in per.items():
        ent = man.origins.get(o)
        if ent is None:
            raise ExportError(f"the log at {loc} holds no blocks of origin {o.hex()}")
        readers[o] = select_blocks(loc, o, ent, bs, family)
    for b in want:
        yield next(readers[b.origin])


def iter_log(log_dir: str | os.PathLike) -> Iterator[Op]:
    """Every op of a log, origin by origin in epoch order, each epoch once (for tests and
    inspection: the blocks are decoded, not verified)."""
    loc = LogLocation(log_dir)
    man = load_manifest(loc)
    for o, ent in sorted(man.origins.items()):
        if ent.top <= ent.floor:
            continue
        nxt = ent.floor + 1
        for ref in iter_origin_blocks(loc, o, ent, ent.floor, ent.top):
            for op in blocks.decode_ops(ref.data):
                if op.epoch >= nxt:
                    nxt = op.epoch + 1
                    yield op
