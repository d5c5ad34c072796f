"""Building update packets with PySpark, from the Parquet log (docs/design.md §9, formats/LOG.md).

:func:`export_spark` gives the same packets, byte for byte, as :func:`syncpack.exchange.sync.export` for
the same site state and parameters, and records them in the store the same way:

1. Under the site lock: our own unsealed ops are sealed into blocks by the local engine's rule
   (each block at most half of ``max_size``, in a write transaction of its own).  Then inside
   one read snapshot of the store: bring the site's own log up to date (unless ``log_dir``
   names another log), plan every peer's blocks with :func:`syncpack.exchange.sync.plan_exports` (so a
   peer below the floor gets the same :class:`ScrubbedError`, and the blocks and their order
   are the local engine's), and check that the log holds every planned range.
   Every peer's packets are cut here, from the planned blocks' sizes, by the local engine's
   rule (:func:`syncpack.exchange.packets.plan_packets`), so part boundaries are known before the job.
2. A Spark job makes the packets' bodies inside the executors: the per-peer plans (block
   lists and sizes, each part's blocks and packet id, the peer's public sealing key) are
   broadcast, each task fetches its peer's planned blocks from the log, checks each against
   the plan (same origin, epochs, clocks and block hash, body intact:
   :func:`syncpack.engine.parquet_log.checked_block`), and writes each part's body (the blocks
   concatenated, sealed to the peer when packets are sealed) into this run's directory of the
   staging location, returning only each body's length, hash and sealing key.  Blocks are
   copied, never decoded or re-encoded: only an origin can sign its blocks.
3. The driver writes every packet file (:func:`syncpack.exchange.packets.finish_planned_packets`):
   prefix, the staged body copied in bounded pieces and hashed again, then the header built
   and signed here, under a temporary name, fsynced and renamed; then it removes the staged
   bodies, and the export driver both engines share (:func:`syncpack.exchange.sync.run_export`)
   records the exports.  A failure anywhere leaves no packet of this run and records nothing.

The private keys never leave the driver, by construction: nothing broadcast or captured in a
task closure holds key material (``tests/test_spark.py`` pickles both to check), because the
packet layout (prefix | body | header | footer) lets the header, which holds the body's hash,
be signed after the body was made elsewhere.  Every path is resolved here: executors run in
other working directories, on other hosts, and never see the site directory or the medium;
they need only the log and the staging location (docs/cluster.md).

A peer's bodies are made by one task, which reads its blocks in one pass over each origin's
segments; the parallelism is across peers.
Two strategies move the blocks to the tasks, both over Arrow, never pickled rows:

``merge`` (default)
    Each task reads its peer's blocks straight from the segment files with pyarrow (only the
    segments and row groups that hold them, pruned by the manifest and the ``lo``/``hi``
    statistics), one reader per origin side by side, taking them in the plan's order (the
    order of :func:`syncpack.exchange.packets.order_blocks`); no sort and no shuffle.  Works for logs
    on any filesystem pyarrow opens.
``shuffle``
    Spark SQL does the data movement: the needed segments are read as a DataFrame, joined with
    the broadcast table of planned blocks (``origin``, ``hi``, and each block's position in its
    peer's plan), hash-partitioned one peer per partition, sorted within partitions by that
    position, and handed to the writer with ``mapInArrow``.  With blocks the data is already
    grouped and the order comes from the plan, so this is a plain join, no sort of ops; it is
    kept for logs written by other producers to storage only the JVM can read, and pays a
    shuffle of every (peer, block) pair.

The strategy is the ``strategy`` argument, or ``SYNCPACK_SPARK_STRATEGY`` in the environment.

Spark is started once per command (or reused when the caller already has a session), with its
UI, console progress bar and INFO/WARN logging off, and with the JVM's own output sent to a log
file so that nothing reaches the terminal or a ``--json`` document.  The staging location is a
path or URI every executor can write and the driver can read; with a local master it defaults
to a temporary directory, a cluster master needs one named.
"""

from __future__ import annotations

import logging
import os
import re
import pickle
import resource
import shutil
import sys
import tempfile
import threading
import time
import zipfile
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import groupby
from operator import itemgetter
from pathlib import Path
from typing import Callable, Iterable, Iterator

from syncpack import errors
from syncpack.engine import parquet_log
from syncpack.store import chain, exports
from syncpack.format.codec import RawBodyWriter
from syncpack.errors import (ExportError, InvalidValueError, ScrubbedError,
                             SparkUnavailableError, SyncpackError, UsageError, arg)
from syncpack.exchange.packets import DEFAULT_MAX_SIZE, PACKET_SUFFIX, BlockRef, MadeBody, PartInfo, \
    atomic_opener, build_update_packets, finish_planned_packets, packet_dir, packet_name, \
    plan_packets, sealer_for
from syncpack.progress import expect
from syncpack.site import Site
from syncpack.exchange.sync import (ExportedPacket, PeerPlan, plan_exports, run_export,
                                    sealable)

STRATEGIES = ("merge", "shuffle")
DEFAULT_MASTER = "local[*]"

_LOG4J2 = """\
status = error
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex
"""


# --- the session ------------------------------------------------------------------------------

def _check_java() -> None:
    home = os.environ.get("JAVA_HOME")
    if home and os.access(os.path.join(home, "bin", "java"), os.X_OK):
        return
    if shutil.which("java"):
        return
    raise SparkUnavailableError(
        "the Spark engine needs Java (17 or newer), and no 'java' was found",
        hint="install a Java runtime (e.g. 'apt install openjdk-17-jre-headless') or set "
             "JAVA_HOME; or use --engine local")


def _import_pyspark():
    try:
        from pyspark import SparkContext
        from pyspark.sql import SparkSession
    except ImportError as e:
        raise SparkUnavailableError(
            f"the Spark engine needs pyspark, which is not installed here ({e})",
            hint="pip install pyspark (in syncpack's own environment), or use "
                 "--engine local") from None
    return SparkContext, SparkSession


@contextmanager
def _jvm_output_to(path: Path) -> Iterator[None]:
    """The JVM inherits our stdout and stderr; point them at a file while it starts, so not even
    the JVM's own start-up warnings reach the terminal or a --json document.  The JVM (and the
    Python workers it forks) keep writing there."""
    for s in (sys.stdout, sys.stderr):
        try:
            s.flush()
        except (OSError, ValueError):
            pass
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    saved = (os.dup(1), os.dup(2))
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for x in (*saved, fd):
            os.close(x)


class SparkSessionHandle:
    """A Spark session for one command: stops it at the end only if it started it."""

    def __init__(self, spark, created: bool, workdir: Path | None, log_file: Path | None,
                 log_handler: logging.Handler | None = None):
        self.spark, self.created, self.workdir, self.log_file = spark, created, workdir, log_file
        self.log_handler = log_handler

    @property
    def sc(self):
        return self.spark.sparkContext

    def stop(self, keep_log: bool = False) -> None:
        if self.created:
            try:
                self.spark.stop()
            except Exception:   # its JVM already gone (killed): nothing left to stop
                keep_log = True
            if self.log_handler is not None:
                logging.getLogger().removeHandler(self.log_handler)
                self.log_handler.close()
            if self.workdir is not None and not keep_log:
                shutil.rmtree(self.workdir, ignore_errors=True)


def active_session(SparkSession):
    """The session this process already runs (the caller's own, say), or None.  Public API
    only: ``SparkSession.active()`` also sees a session made in another thread, which
    ``getActiveSession()`` (thread-local in the JVM) would miss."""
    try:
        return SparkSession.active()
    except Exception:   # pyspark raises its own runtime error when there is none
        return None


def start_session(master: str = DEFAULT_MASTER, conf: dict[str, str] | None = None,
                  app_name: str = "syncpack") -> SparkSessionHandle:
    """Reuse the process's Spark session, or start one with syncpack's settings."""
    SparkContext, SparkSession = _import_pyspark()
    running = active_session(SparkSession)
    if running is not None:
        return SparkSessionHandle(running, False, None, None)
    _check_java()
    local = master.startswith("local")
    if local:
        # Driver and Python workers must be this interpreter, which can import syncpack.
        os.environ["PYSPARK_PYTHON"] = sys.executable
        os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    else:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    workdir = Path(tempfile.mkdtemp(prefix="syncpack-spark-"))
    log4j = workdir / "log4j2.properties"
    log4j.write_text(_LOG4J2)
    log_file = workdir / "spark.log"
    log_handler = None
    if not logging.getLogger().handlers:
        # py4j tells of a JVM gone mid-command through the root logger (logging.exception),
        # which unconfigured sets itself up to print the traceback on stderr, beside the
        # job's one error line: into the Spark log instead, which that error's hint names.
        log_handler = logging.FileHandler(log_file)
        logging.getLogger().addHandler(log_handler)
    java_opts = f"-Dlog4j2.configurationFile=file:{log4j} -Dlog4j.configurationFile=file:{log4j}"
    settings = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.extraJavaOptions": java_opts,
        "spark.executor.extraJavaOptions": java_opts,
        "spark.python.worker.reuse": "true",
        "spark.sql.sources.partitionColumnTypeInference.enabled": "false",
        # A row is a whole block (up to hundreds of megabytes): few rows per batch.
        "spark.sql.execution.arrow.maxRecordsPerBatch": str(parquet_log.READ_BATCH),
        "spark.sql.parquet.columnarReaderBatchSize": str(4 * parquet_log.READ_BATCH),
        "spark.sql.adaptive.enabled": "false",   # keep one partition per peer
    }
    if local:
        settings["spark.driver.host"] = "127.0.0.1"
        settings["spark.driver.bindAddress"] = "127.0.0.1"
    settings.update(conf or {})
    builder = SparkSession.builder.master(master).appName(app_name)
    for k, v in settings.items():
        builder = builder.config(k, v)
    try:
        with _jvm_output_to(log_file):
            spark = builder.getOrCreate()
    except Exception as e:  # pyspark raises several kinds when the JVM cannot start
        if log_handler is not None:
            logging.getLogger().removeHandler(log_handler)
            log_handler.close()
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise SparkUnavailableError(f"Spark did not start ({msg})",
                                    hint=f"see {log_file}; check JAVA_HOME and --spark-master, "
                                         f"or use --engine local") from None
    spark.sparkContext.setLogLevel("ERROR")
    if not local:
        _ship_package(spark.sparkContext, workdir)
    return SparkSessionHandle(spark, True, workdir, log_file, log_handler)


def _ship_package(sc, workdir: Path) -> None:
    """On a cluster the executors may lack syncpack: send this copy along."""
    sc.addPyFile(str(package_zip(workdir)))


def package_zip(workdir: Path) -> Path:
    """The whole syncpack package as a zip an executor can import from (this module sits in
    its ``engine`` subpackage, so the package is two levels up)."""
    pkg = Path(__file__).resolve().parents[1]
    z = workdir / "syncpack.zip"
    with zipfile.ZipFile(z, "w") as zf:
        for f in sorted(pkg.rglob("*.py")):
            zf.write(f, f"syncpack/{f.relative_to(pkg)}")
    return z


# --- what the executors get -------------------------------------------------------------------

# Nothing here holds key material, by construction: a job is the plan's public metadata
# (block positions, sizes, packet ids, the recipient's public sealing key), the context names
# locations.  Headers are built and signed at the driver
# (:func:`syncpack.exchange.packets.finish_planned_packets`, called by :func:`export_spark`).

@dataclass
class _Job:
    """One peer's work, broadcast to the executors."""
    index: int                                  # position in the plan list
    name: str
    ranges: dict[bytes, tuple[int, int]]
    blocks: list[chain.StoredBlock]             # the plan's blocks, in the order they travel
    sizes: list[int]                            # their lengths in bytes, as the store has them
    segments: dict[bytes, parquet_log.OriginLog]      # the manifest entries of its origins
    ops: int
    budget: int                                 # a body's raw budget (PacketPlan.budget)
    # (part, packet id, first block, end block, piece: (offset, length) of block first, or None)
    parts: list[tuple[int, bytes, int, int, tuple[int, int] | None]]
    seal_to: bytes | None = None                # the peer's X25519 public key


@dataclass
class _TaskCtx:
    log: str            # resolved at the driver: executors have other working directories
    log_shown: str      # the log as the user named it, for messages
    staging: str        # this run's directory in the staging location (a URI)
    family: bytes       # block hashes are over the family too
    seed: bytes | None


def _body_name(index: int, part: int) -> str:
    return f"{index:06d}-{part:06d}.body"


def _make_bodies(job: _Job, refs: Iterable[BlockRef], ctx: _TaskCtx) -> bytes:
    """Write each planned part's body (sealed, if the peer's packets are) into the staging
    location; returns the pickled outcome for the driver: each body's length, hash and sealing
    key (typed syncpack errors travel back as data, so the driver can raise the same error)."""
    t0 = time.perf_counter()
    stage = parquet_log.LogLocation(ctx.staging)
    made = []
    it = iter(refs)
    try:
        held: tuple[int, BlockRef] | None = None    # a block cut into pieces, while in use
        for part, pid, first, end, span in job.parts:
            with stage.fs.open_output_stream(stage.path(_body_name(job.index, part))) as f:
                body = RawBodyWriter(f, job.budget, sealer=sealer_for(job.seal_to, pid,
                                                                      ctx.seed))
                for k in range(first, end):
                    if span is not None and held is not None and held[0] == k:
                        ref = held[1]
                    else:
                        ref = next(it, None)
                    want = job.blocks[k]
                    if ref is None or len(ref.data) != job.sizes[k]:
                        raise ExportError(
                            f"the log at {ctx.log_shown} does not give the block of epochs "
                            f"{want.lo + 1}-{want.hi} of origin {want.origin.hex()} as this "
                            f"site holds it", hint="rebuild it: remove the directory and run "
                                                   "'syncpack log export DIR'")
                    if span is not None:
                        held = (k, ref)
                        body.write(ref.data[span[0]:span[0] + span[1]], ref.hi - ref.lo)
                    else:
                        body.write(ref.data, ref.hi - ref.lo)
                length, digest = body.finish()
            made.append(MadeBody(length, digest, body.epk))
        for _extra in it:   # lets the shuffle strategy's reader check it got no more rows
            pass
    except SyncpackError as e:
        return pickle.dumps(("error", job.index, type(e).__name__, e.message, e.hint))
    stats = {"peer": job.name, "ops": job.ops, "parts": len(made),
             "seconds": round(time.perf_counter() - t0, 3),
             "worker_pid": os.getpid(),
             "worker_maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}
    return pickle.dumps(("ok", job.index, made, stats))


def _from_rows(rows: Iterable[tuple[int, bytes]], job: _Job, ctx: _TaskCtx) -> Iterator[BlockRef]:
    """The ``shuffle`` strategy's ``(position in the plan, bytes)`` rows of one peer as the
    plan's blocks: each planned block exactly once, in order, and each checked against the plan
    (a log from another producer must not be able to make a packet whose ranges lie)."""
    names = {o: e.name for o, e in job.segments.items()}
    k = 0
    for pos, data in rows:
        if pos != k:
            break
        want = job.blocks[k]
        yield parquet_log.checked_block(data, want, ctx.family, ctx.log_shown, names[want.origin])
        k += 1
    if k < len(job.blocks):
        w = job.blocks[k]
        raise ExportError(f"the log at {ctx.log_shown} lacks the block of epochs "
                          f"{w.lo + 1}-{w.hi} of "
                          f"{names[w.origin]}, or holds it twice",
                          hint="rebuild it: remove the directory and run 'syncpack log export "
                               "DIR'")


def _merge_task(bc, ctx: _TaskCtx, acc):
    """mapPartitions function of the ``merge`` strategy: job indices in, outcomes out."""

    def run(indices: Iterator[int]) -> Iterator[bytes]:
        jobs = bc.value
        loc = parquet_log.LogLocation(ctx.log)
        for i in indices:
            job = jobs[i]
            man = parquet_log.Manifest(b"", b"", "", origins=job.segments)
            refs = parquet_log.planned_blocks(loc, man, job.blocks, ctx.family)
            yield _make_bodies(job, refs, ctx)
            acc.add(job.ops)

    return run


def _rows_task(bc, ctx: _TaskCtx, acc):
    """mapPartitions function of the ``shuffle`` strategy: ``(pid, pos, data)`` rows of one or
    more peers, each peer's rows contiguous and in plan order, in; one outcome per peer out."""

    def run(rows):
        jobs = bc.value
        for pid, group in groupby(rows, key=itemgetter(0)):
            job = jobs[pid]
            refs = _from_rows(((pos, bytes(data)) for _pid, pos, data in group), job, ctx)
            yield _make_bodies(job, refs, ctx)
            acc.add(job.ops)

    return run


def _arrow_task(bc, ctx: _TaskCtx, acc):
    """mapInArrow function of the ``shuffle`` strategy: :func:`_rows_task` on Arrow batches."""
    by_rows = _rows_task(bc, ctx, acc)

    def run(batches):
        import pyarrow as pa

        def rows():
            for b in batches:
                yield from zip(*(b.column(i).to_pylist() for i in range(3)))

        for payload in by_rows(rows()):
            yield pa.RecordBatch.from_arrays([pa.array([payload], pa.binary())],
                                             names=["payload"])

    return run


# --- the export -------------------------------------------------------------------------------

def _check_log_covers(site: Site, plans: list[PeerPlan], man: parquet_log.Manifest,
                      loc: parquet_log.LogLocation) -> None:
    if man.family_id != site.family_id:
        raise ExportError(f"the log at {loc} belongs to family {man.family_id.hex()}, this site "
                          f"to {site.family_id.hex()}", hint="name this family's log with --log")
    for plan in plans:
        for o, (lo, hi) in sorted(plan.ranges.items()):
            ent = man.origins.get(o)
            origin = site.name_of(o)
            if ent is not None and lo < ent.floor:
                raise ScrubbedError(
                    f"peer {plan.name} needs epoch {lo + 1} of {origin}, but the log at {loc} "
                    f"starts at epoch {ent.floor + 1}",
                    hint=f"send {plan.name} a snapshot instead: 'syncpack resync --to "
                         f"{plan.name} --out DIR'")
            if ent is None or ent.top < hi:
                have = f"up to epoch {ent.top}" if ent else "none"
                raise ExportError(
                    f"the log at {loc} holds {have} of {origin}'s ops, but {plan.name} needs "
                    f"up to epoch {hi}",
                    hint=f"bring it up to date with 'syncpack log export {arg(loc)}', or "
                         f"omit --log to use the site's own log")


def export_spark(site: Site, out_dir: str | os.PathLike, to: list[str] | None = None,
                 all_peers: bool = False, max_size: int = DEFAULT_MAX_SIZE,
                 master: str = DEFAULT_MASTER, log_dir: str | os.PathLike | None = None,
                 seed: bytes | None = None, progress: Callable[[int], None] | None = None, *,
                 now_ms: int | None = None, encrypt: bool = False, strategy: str | None = None,
                 stats: dict | None = None,
                 failed: list[SyncpackError] | None = None,
                 seal_max: int | None = None,
                 staging: str | os.PathLike | None = None) -> list[ExportedPacket]:
    """Like :func:`syncpack.exchange.sync.export`, with the packets' bodies made by a Spark job.  With
    ``failed`` and ``seal_max``, as there: a peer that cannot be served is reported in
    ``failed`` and the others still get their packets; ``seal_max`` bounds the blocks our
    unsealed ops become (default: half of ``max_size``).

    ``log_dir`` None uses (and first brings up to date) the site's own log ``SITE/log``; any
    other log is only read and must hold every planned range.  ``staging`` is where executors
    put the bodies (a path or URI every executor can write and this process can read; by
    default a temporary directory here, which only a local master can use).  ``stats``, when
    given, is filled with timings and per-task figures."""
    check_master(master)
    if staging is None and master and not master.startswith("local"):
        # said before the planning and the session's start (a minute, against a master
        # that does not answer); under spark-submit the master is known only once started
        raise _staging_needed()
    strategy = strategy or os.environ.get("SYNCPACK_SPARK_STRATEGY") or "merge"
    if strategy not in STRATEGIES:
        raise UsageError(f"unknown Spark strategy {strategy!r}; choose one of "
                         f"{', '.join(STRATEGIES)}")
    out = Path(out_dir)
    stats = stats if stats is not None else {}
    own = log_dir is None
    loc = parquet_log.LogLocation(parquet_log.default_log_dir(site) if own else log_dir)

    def write(peers: list[bytes], now: int, sign) -> list[tuple[PeerPlan, list[PartInfo]]]:
        conn = site.conn
        t0 = time.perf_counter()
        starter: _SessionStarter | None = None
        exports.begin_snapshot(conn)  # one read snapshot: plan, log catch-up and coverage check
        try:
            plans = plan_exports(site, peers, now, failed, sign=sign, max_size=max_size,
                                 out=Path(out_dir))
            pairs = sealable(site, plans, encrypt, failed)
            plans, seal = [p for p, _k in pairs], [k for _p, k in pairs]
            sizes = [exports.block_sizes(conn, p.blocks) for p in plans]
            # Every cut is decided here, before any job: executors only fill planned bodies.
            cuts = {i: plan_packets(p.blocks, sizes[i], p.template, max_size, seed, seal[i])
                    for i, p in enumerate(plans) if p.ranges}
            if cuts:
                starter = _SessionStarter(master)  # the JVM starts while the log catches up
            if own:
                t1 = time.perf_counter()
                man, stats["log"] = parquet_log.append_log(site, loc)
                stats["log_s"] = round(time.perf_counter() - t1, 3)
            else:
                man = parquet_log.load_manifest(loc)
            _check_log_covers(site, plans, man, loc)
        except BaseException:
            if starter is not None:
                starter.discard()
            raise
        finally:
            exports.end_snapshot(conn)
        stats["snapshot_s"] = round(time.perf_counter() - t0, 3)
        written: dict[int, list[PartInfo]] = {}
        stage: _Staging | None = None
        try:
            for i, plan in enumerate(plans):
                if not plan.ranges:  # only the header (acknowledgements): no job needed
                    written[i] = build_update_packets(iter(()), plan.template, sign, max_size,
                                                      _opener(out, site.name, plan), seed,
                                                      seal_to=seal[i])
            jobs = [_Job(i, plans[i].name, plans[i].ranges, plans[i].blocks, sizes[i],
                         {o: man.origins[o] for o in plans[i].ranges},
                         sum(hi - lo for lo, hi in plans[i].ranges.values()), c.budget,
                         [(x.part, x.packet_id, x.first, x.end, x.span) for x in c.parts],
                         seal[i])
                    for i, c in cuts.items()]
            expect(progress, sum(j.ops for j in jobs))
            if jobs:
                made, stage = _run_jobs(jobs, loc, staging, seed, site.family_id, starter,
                                        strategy, progress, stats)
                t1 = time.perf_counter()
                for j in jobs:
                    written[j.index] = finish_planned_packets(
                        cuts[j.index], sign, _opener(out, site.name, plans[j.index]),
                        made[j.index], lambda part, k=j.index: stage.read(_body_name(k, part)))
                stats["finish_s"] = round(time.perf_counter() - t1, 3)
        except BaseException:
            if starter is not None:
                starter.discard()
            _remove_outputs(out, site.name, plans)
            raise
        finally:
            if stage is not None:
                stage.remove()
        for i, plan in enumerate(plans):
            for p in written[i]:  # the paths as the local engine reports them
                p.path = packet_dir(out, site.name, plan.name) / packet_name(
                    p.header.seq, p.header.part)
        return [(plan, written[i]) for i, plan in enumerate(plans)]

    return run_export(site, to, all_peers, max_size, now_ms, seal_max, write)


def _opener(out: Path, sender: str, plan: PeerPlan):
    seq = plan.template.seq
    return atomic_opener(packet_dir(out, sender, plan.name), lambda part: packet_name(seq, part))


def _remove_outputs(out: Path, sender: str, plans: list[PeerPlan]) -> None:
    """After a failed job: no packet of this run may stay behind (nothing was recorded)."""
    for plan in plans:
        d = packet_dir(out, sender, plan.name)
        if d.is_dir():
            for f in d.glob(f"{plan.template.seq:010d}-*{PACKET_SUFFIX}"):
                f.unlink(missing_ok=True)


# The master URLs Spark knows (its SparkContext refuses others only once started, in a line
# of its own log): local, local[N], local[*], local[N,F], local[*,F], local-cluster[N,C,M],
# and the cluster managers' schemes.
_MASTER_URL = re.compile(r"local(\[(\d+|\*)(,\d+)?\])?|local-cluster\[\d+,\d+,\d+\]|yarn|"
                         r"(spark|k8s|mesos)://\S+")


def check_master(master: str | None) -> None:
    """Refuse what Spark would refuse only once started (or take for a cluster's name)."""
    if master and not _MASTER_URL.fullmatch(master):
        raise InvalidValueError(f"--spark-master {master!r} is not a Spark master URL",
                                hint="local[*], local[N], spark://HOST:PORT, yarn, k8s://URL "
                                     "or mesos://URL (docs/cluster.md)")


def _staging_needed() -> UsageError:
    return UsageError(
        "the Spark engine needs --staging on a cluster: a location every executor can write "
        "and this machine can read, where the packet bodies wait for the driver",
        hint="e.g. --staging hdfs://namenode/tmp/syncpack, s3://, or a shared mount "
             "(docs/cluster.md)")


class _Staging:
    """This run's directory in the staging location: executors write the bodies there, the
    driver copies them onto the medium and removes the directory."""

    READ_CHUNK = 1 << 20

    def __init__(self, where: str | os.PathLike | None, local_master: bool):
        if where is None:
            if not local_master:
                raise _staging_needed()
            self._tmp: str | None = tempfile.mkdtemp(prefix="syncpack-staging-")
            self.loc = parquet_log.LogLocation(self._tmp)
            self._base, self._run = self.loc, ""
            return
        self._tmp = None
        self._base = parquet_log.LogLocation(where, "the staging location")
        self._run = f"syncpack-{os.urandom(8).hex()}"
        try:
            self._base.fs.create_dir(self._base.path(self._run), recursive=True)
        except OSError as e:
            raise ExportError(f"cannot write in the staging location {where}: {e}",
                              hint="--staging names a directory this machine can create "
                                   "and every executor can write") from None
        self.loc = parquet_log.LogLocation(self._base.uri(self._run))

    @property
    def uri(self) -> str:
        return self.loc.uri("")

    def read(self, name: str) -> Iterator[bytes]:
        try:
            with self.loc.fs.open_input_stream(self.loc.path(name)) as f:
                while True:
                    b = f.read(self.READ_CHUNK)
                    if not b:
                        return
                    yield b
        except OSError as e:
            raise ExportError(f"cannot read a packet body from the staging location "
                              f"{self.uri}: {e}",
                              hint="the staging location must be one this machine reads "
                                   "and every executor writes") from None

    def remove(self) -> None:
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            return
        try:
            self._base.fs.delete_dir(self._base.path(self._run))
        except OSError:
            pass


class _SessionStarter:
    """Starts (or finds) the Spark session in a thread, so the JVM starts while the driver
    brings the log up to date; :meth:`result` waits for it."""

    def __init__(self, master: str):
        self._box: dict = {}
        self._t0 = time.perf_counter()
        self._thread = threading.Thread(target=self._run, args=(master,),
                                        name="syncpack-spark-start", daemon=True)
        self._thread.start()

    def _run(self, master: str) -> None:
        try:
            self._box["handle"] = start_session(master)
        except BaseException as e:  # re-raised by result()
            self._box["error"] = e
        self._box["seconds"] = time.perf_counter() - self._t0

    @property
    def seconds(self) -> float:
        """How long the start took (once :meth:`result` returned)."""
        return self._box["seconds"]

    def result(self) -> SparkSessionHandle:
        """The session; the caller now owns it (and stops it)."""
        self._thread.join()
        if "error" in self._box:
            raise self._box["error"]
        return self._box.pop("handle")

    def discard(self) -> None:
        """After a failure elsewhere: wait for the start, then stop what it started."""
        self._thread.join()
        h = self._box.pop("handle", None)
        if h is not None:
            h.stop()


def _run_jobs(jobs: list[_Job], loc: parquet_log.LogLocation, staging, seed: bytes | None,
              family: bytes, starter: _SessionStarter, strategy: str, progress,
              stats: dict) -> tuple[dict[int, list[MadeBody]], _Staging]:
    t0 = time.perf_counter()
    handle = starter.result()
    stats["session_wait_s"] = round(time.perf_counter() - t0, 3)
    stats["session_s"] = round(starter.seconds, 3)
    ok = False
    stage = None
    try:
        sc = handle.sc
        stage = _Staging(staging, sc.master.startswith("local"))
        ctx = _TaskCtx(loc.uri("") if loc.local else loc.text, loc.text, stage.uri, family,
                       seed)
        by_index = {j.index: j for j in jobs}
        bc = sc.broadcast(by_index)
        acc = sc.accumulator(0)
        if strategy == "merge":
            order = [j.index for j in sorted(jobs, key=lambda j: -j.ops)]  # biggest first
            action = sc.parallelize(order, len(order)).mapPartitions(
                _merge_task(bc, ctx, acc)).collect
        else:
            action = _shuffle_action(handle.spark, jobs, loc, bc, ctx, acc)
        t1 = time.perf_counter()
        payloads = _collect_with_progress(action, acc, progress)
        stats["job_s"] = round(time.perf_counter() - t1, 3)
        bc.unpersist()
        ok = True
    except SyncpackError:
        raise
    except Exception as e:
        raise ExportError(f"the Spark job failed: {_spark_error_line(e)}",
                          hint=f"see {handle.log_file or 'the Spark log'}; nothing was "
                               f"recorded, the next export sends the same ranges") from None
    finally:
        if not ok and stage is not None:    # interrupted too: no bodies left behind
            stage.remove()
        handle.stop(keep_log=not ok)
    made: dict[int, list[MadeBody]] = {}
    stats["tasks"] = []
    errs = []
    for raw in payloads:
        res = pickle.loads(raw if isinstance(raw, bytes) else raw["payload"])
        if res[0] == "error":
            _kind, _i, cls_name, message, hint = res
            cls = getattr(errors, cls_name, ExportError)
            errs.append(cls(message, hint) if isinstance(cls, type)
                        and issubclass(cls, SyncpackError) else ExportError(message, hint))
            continue
        _kind, i, bodies, task_stats = res
        made[i] = bodies
        stats["tasks"].append(task_stats)
    if errs:
        stage.remove()
        raise errs[0]
    missing = [j.name for j in jobs if j.index not in made]
    if missing:
        # Only the shuffle strategy can get here: no row of the log joined a peer's plan.
        stage.remove()
        raise ExportError(f"the Spark job returned no packets for {', '.join(missing)}",
                          hint=f"the log at {ctx.log_shown} may lack the blocks planned for "
                               f"them: rebuild it with 'syncpack log export'")
    return made, stage


def _shuffle_action(spark, jobs: list[_Job], loc: parquet_log.LogLocation, bc, ctx: _TaskCtx, acc):
    """The ``shuffle`` strategy as a DataFrame plan; returns its collect action."""
    from pyspark.sql import functions as F

    files = sorted({s.path for j in jobs for o, (lo, hi) in j.ranges.items()
                    for s in j.segments[o].overlapping(lo, hi)})
    log = spark.read.schema(parquet_log.SPARK_DDL).parquet(*[loc.uri(f) for f in files])
    n = len(jobs)
    # One peer per partition: for partition p pick a bucket value that Spark's hash
    # partitioning (pmod(murmur3(value), n)) sends to p.
    probe = spark.range(0, 64 * n).selectExpr("cast(id as int) as b",
                                              f"pmod(hash(cast(id as int)), {n}) as p")
    first: dict[int, int] = {}
    for row in probe.collect():
        first.setdefault(row["p"], row["b"])
    if len(first) < n:
        buckets = list(range(n))
    else:
        buckets = [first[p] for p in range(n)]
    # (origin, hi) names one block: a store (and so a log) holds one block ending at an epoch.
    planned = spark.createDataFrame(
        [(j.index, buckets[k], pos, b.origin, b.hi) for k, j in enumerate(jobs)
         for pos, b in enumerate(j.blocks)],
        "pid int, bucket int, pos int, r_origin binary, r_hi long")
    cond = (log.origin == planned.r_origin) & (log.hi == planned.r_hi)
    df = (log.join(F.broadcast(planned), cond)
          .select("pid", "bucket", "pos", "data")
          .repartition(n, "bucket")
          .sortWithinPartitions("pid", "pos")
          .drop("bucket"))
    try:
        import pandas  # noqa: F401
    except ImportError:
        # pyspark's mapInArrow insists on pandas although an Arrow map never uses it; without
        # pandas the same rows, in the same partitions and order, go through the public RDD
        # API instead (one more copy of each row, no reach into pyspark's internals).
        return df.rdd.mapPartitions(_rows_task(bc, ctx, acc)).collect
    return df.mapInArrow(_arrow_task(bc, ctx, acc), "payload binary").collect


def _collect_with_progress(action, acc, progress):
    """Run the job; meanwhile report finished peers' ops (accumulators arrive per task)."""
    if progress is None:
        return action()
    box: dict = {}

    def target():
        try:
            box["value"] = action()
        except BaseException as e:  # re-raised in the caller's thread
            box["error"] = e

    t = threading.Thread(target=target, name="syncpack-spark-job", daemon=True)
    t.start()
    reported = 0
    while t.is_alive():
        t.join(0.5)
        v = acc.value
        if v > reported:
            progress(v - reported)
            reported = v
    v = acc.value
    if v > reported:
        progress(v - reported)
    if "error" in box:
        raise box["error"]
    return box["value"]


def _spark_error_line(e: Exception) -> str:
    """The most telling line of a Spark/Py4J failure (the Python exception, when there is one)."""
    text = str(e)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if ln.split(":", 1)[0].endswith(("Error", "Exception")) and not ln.startswith("at "):
            return ln[:500]
    return (lines[0] if lines else type(e).__name__)[:500]
