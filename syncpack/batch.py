"""One scheduled round for one site: ``syncpack batch CONFIG.toml`` (from cron or a systemd timer).

A round, in this order:

1. **imports** — each inbox is imported with :func:`syncpack.exchange.sync.import_packets`, like
   ``syncpack import INBOX``; with ``remove_after_import`` the packet files that were applied or
   reported as duplicates are deleted afterwards (see below);
2. **exports** — each outbox gets :func:`syncpack.exchange.sync.export`, like ``syncpack export``; running
   after the imports, the packets carry what was just received (relayed changes, and the
   acknowledgements peers need to trim their changelogs);
3. **scrub** (optional) — :func:`syncpack.admin.recovery.scrub`, like ``syncpack scrub``.

A failing action (a rejected packet, an unmounted required medium, an outbox too full for
even one packet, a peer that needs a snapshot: with ``to = "all"`` that peer alone, the
others still get their packets) is recorded and the round carries on with the next action;
the outcome then says ``failed`` and the exit code is 1, so a scheduler can alert.  So does
an attached table whose capture a schema change stopped (action ``capture``): the round does
everything else, but that table's changes go nowhere until an administrator acts.  Parked
packets are not failures: they wait, inside the site, for the packets they miss and apply by
themselves in a later round (tried again also by a round whose inboxes are all absent).

Configuration
-------------

UTF-8 TOML.  Relative paths are relative to the directory holding the configuration file
(cron and systemd start commands in other directories); ``~`` is expanded.  Unknown keys are
errors, so a misspelt key is never silently ignored.

=========================  ========================================================================
key                        meaning
=========================  ========================================================================
``site``                   **required**: the site directory
``log``                    log file, one line appended per action (default ``SITE/batch.log``)
``metrics``                a ``.prom`` file rewritten atomically after every round that ran (also
                           a failed one): the site's ``syncpack status --format prometheus``
                           metrics plus ``syncpack_batch_*`` ones, for node_exporter's textfile
                           collector (see "Metrics" below).  Default: none
``[[import]]``             an inbox; repeat the table for several
``  path``                 **required**: a directory (searched recursively, as ``syncpack import``
                           does: packets for other sites and files that are not packets are left
                           alone) or one packet file.  The shared-media layout written by export is
                           ``MEDIA/<recipient>/<sender>/<seq>-<part>.spk``, so ``MEDIA/<this site>``
``  remove_after_import``  ``true``: after the import has committed, delete the files of packets
                           this site has applied (now or before: duplicates).  Only files inside
                           ``path`` that are packets addressed to this site and recorded as applied
                           in its store are deleted (not those reached through a link to another
                           directory); parked, rejected, skipped and foreign files stay.  Default
                           ``false``
``  required``             ``true``: a missing ``path`` is an error (a medium that should be
                           mounted); default ``false``: a missing inbox means nothing arrived yet
``[[export]]``             an outbox; repeat the table for an outbox per peer
``  out``                  **required**: the directory packets are written into
                           (``OUT/<recipient>/<sender>/...``)
``  to``                   ``"all"`` (default: every other current member that no other
                           ``[[export]]`` names) or a list of peer names
``  max_size``             largest packet: bytes, or a string with K/M/G (default just under 4G)
``  create``               ``true``: create ``out`` if it is missing.  Default ``false``: a missing
                           ``out`` is an error, so an unmounted medium never fills the root disk
``  encrypt``              ``true``: seal each packet to its recipient, as ``export --encrypt``
                           (always on when the family requires sealing).  Default ``false``
``[scrub]``                present: trim the changelog after the exports
``  min_age``              keep ops younger than this: seconds, or a string with s/m/h/d (``"7d"``)
``  dry_run``              ``true``: report what would be trimmed, change nothing
=========================  ========================================================================

A configuration must name at least one import, export or scrub.  ``[import]``/``[export]``
written as a single table (one bracket) are accepted as one-element lists.

Example (``/etc/syncpack/boston_hub.toml``)::

    site = "/srv/syncpack/boston_hub"
    log = "/var/log/syncpack/boston_hub.log"
    metrics = "/var/lib/node_exporter/textfile/syncpack_boston_hub.prom"

    [[import]]
    path = "/mnt/media/boston_hub"        # what peers wrote for us
    remove_after_import = true

    [[export]]
    out = "/mnt/media"                    # one outbox for all peers
    to = "all"
    max_size = "650M"

    [scrub]
    min_age = "7d"

Locking and logging
-------------------

Two rounds at one site never overlap: a round holds ``fcntl.flock`` on ``SITE/batch.lock``
(separate from the site's own per-command lock ``SITE/lock``, which every import, export and
scrub takes in turn, so interactive commands can still run between the actions of a round).  A
second round started meanwhile changes nothing and raises :class:`BatchLockedError` (exit 1).
The lock is released by the kernel when the process ends, however it ends, so a killed round
never leaves a stale lock; that is also why cron lines need no ``flock(1)`` wrapper.

The log gets one line per action, each ``<UTC timestamp> <site> <action>: <what happened>``,
appended with ``O_APPEND`` so concurrent writers never interleave within a line.  A round
interrupted (Ctrl-C, SIGTERM) ends its log with ``round: ABORTED: interrupted; ...`` saying
what the store kept of the import under way (its packets commit one by one), which its
metrics count as applied too.

Metrics
-------

With ``metrics = PATH``, every round that got the batch lock ends by writing PATH: the text of
``syncpack status --format prometheus`` (:mod:`syncpack.admin.metrics`) and the round's own
``syncpack_batch_last_run_*`` metrics, including ``syncpack_batch_last_run_ok`` (0 for a failed
round) and ``syncpack_batch_last_success_timestamp_seconds``, which a failed round carries over
from the previous file, so an alert on its age fires however the rounds fail.  The file is
written under a hidden temporary name in the same directory (node_exporter reads only
``*.prom``), fsynced, made world-readable (node_exporter runs as another user) and renamed over
PATH, so the collector never reads half a file.  A refused round (the lock is held) and a
configuration error write nothing: the file then grows old, which the same alert catches.  A
failure to write the file is a failed action of the round (``metrics`` in ``errors``).

Summary
-------

:func:`run_batch` returns a JSON-able dict (``syncpack --json batch`` prints it)::

    site, config, log, started, finished      where and when
    imported   {applied, duplicates, parked, rejected, skipped, removed, ops_applied}: all
               inboxes, fields as in 'syncpack --json import' (plus removed: deleted files)
    exported   {packets}                       as in 'syncpack --json export'
    scrub      the 'syncpack --json scrub' document, or null
    inboxes, outboxes                          the same per configured inbox / outbox
    errors     [{action, target, error, hint}]
    counts     {applied, ops_applied, duplicates, parked, rejected, removed,
                exported_packets, exported_ops, errors}
    outcome    "ok" or "failed";  exit_code  0 or 1
"""

from __future__ import annotations

import difflib
import errno
import os
import time
import tomllib
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, ContextManager

from syncpack.admin import inspection, metrics, recovery
from syncpack.attach import core as attach_core
from syncpack.exchange import sync
from syncpack.store import db, exports
from syncpack.outcome import error_outcome
from syncpack.exchange.apply import is_known
from .errors import (arg, BatchConfigError, BatchLockedError, MetricsWriteError, OutboxError,
                     PacketError, SiteError, SyncpackError)
from syncpack.exchange.packets import DEFAULT_MAX_SIZE, MediumRoom, parse_size, prepare_outbox
from syncpack.fileops import try_lock, write_atomic
from syncpack.exchange.verify import find_packet_files, open_packet, printable
from .site import PARKED_DIR, Site

BATCH_LOCK_FILE = "batch.lock"
DEFAULT_LOG_NAME = "batch.log"

TOP_KEYS = ("site", "log", "metrics", "import", "export", "scrub")
IMPORT_KEYS = ("path", "remove_after_import", "required")
EXPORT_KEYS = ("out", "to", "max_size", "create", "encrypt")
SCRUB_KEYS = ("min_age", "dry_run")


# --- configuration ----------------------------------------------------------------------------

@dataclass
class ImportSpec:
    name: str                 # "import[1]": how errors and the log refer to it
    path: Path
    remove_after_import: bool = False
    required: bool = False


@dataclass
class ExportSpec:
    name: str
    out: Path
    to: list[str] | None = None   # None: every other member
    max_size: int = DEFAULT_MAX_SIZE
    create: bool = False
    encrypt: bool = False


@dataclass
class ScrubSpec:
    min_age_ms: int = 0
    dry_run: bool = False


@dataclass
class BatchConfig:
    path: Path
    site: Path
    log: Path | None          # None: SITE/batch.log
    metrics: Path | None = None
    imports: list[ImportSpec] = field(default_factory=list)
    exports: list[ExportSpec] = field(default_factory=list)
    scrub: ScrubSpec | None = None


class _Checker:
    """Reads values out of the parsed TOML; every complaint names the file and the key."""

    def __init__(self, path: Path):
        self.path = path
        self.base = Path(os.path.abspath(path)).parent

    def error(self, key: str, what: str, hint: str | None = None) -> BatchConfigError:
        return BatchConfigError(f"batch config {self.path}: {key}: {what}", hint=hint)

    def known(self, table: dict, keys: tuple[str, ...], where: str) -> None:
        for k in table:
            if k not in keys:
                near = difflib.get_close_matches(k, keys, n=1)
                hint = (f"did you mean {near[0]!r}?" if near
                        else f"known keys{' in ' + where if where else ''}: {', '.join(keys)}")
                raise self.error(f"{where}.{k}" if where else k, "unknown key", hint)

    def string(self, table: dict, key: str, where: str, required: bool = False) -> str | None:
        name = f"{where}.{key}" if where else key
        if key not in table:
            if required:
                raise self.error(name, "missing (required)")
            return None
        v = table[key]
        if not isinstance(v, str) or not v.strip():
            raise self.error(name, f"must be a non-empty string, not {v!r}")
        return v

    def path_(self, table: dict, key: str, where: str, required: bool = False) -> Path | None:
        v = self.string(table, key, where, required)
        if v is None:
            return None
        return Path(os.path.abspath(self.base / os.path.expanduser(v)))

    def boolean(self, table: dict, key: str, where: str, default: bool = False) -> bool:
        v = table.get(key, default)
        if not isinstance(v, bool):
            raise self.error(f"{where}.{key}" if where else key,
                             f"must be true or false, not {v!r}")
        return v

    def tables(self, doc: dict, key: str) -> list[tuple[str, dict]]:
        v = doc.get(key, [])
        if isinstance(v, dict):
            v = [v]
        if not isinstance(v, list) or not all(isinstance(t, dict) for t in v):
            raise self.error(key, f"must be [[{key}]] tables")
        return [(f"{key}[{i}]", t) for i, t in enumerate(v, 1)]


def parse_duration_ms(value: Any) -> int:
    """Seconds as a number, or a string with an s/m/h/d unit: ``90``, ``"15m"``, ``"7d"``."""
    if isinstance(value, bool):
        raise ValueError(f"not a duration: {value!r}")
    if isinstance(value, (int, float)):
        secs = float(value)
    elif isinstance(value, str) and value.strip():
        t = value.strip().lower()
        unit = {"s": 1, "m": 60, "h": 3600, "d": 86400}.get(t[-1:])
        try:
            secs = float(t[:-1]) * unit if unit else float(t)
        except ValueError:
            raise ValueError(f"not a duration: {value!r} (seconds, or e.g. \"15m\", \"7d\")") \
                from None
    else:
        raise ValueError(f"not a duration: {value!r}")
    if secs != secs:
        raise ValueError(f"not a duration: {value!r}")
    if secs < 0:
        raise ValueError(f"a duration cannot be negative: {value!r}")
    if secs > MAX_DURATION_S:
        raise ValueError(f"not a duration: {value!r} is more than 100 years")
    return int(secs * 1000)


# Longer than any site lives; a value past it is a typing slip (and past 2^63 ms, an error
# deep in SQLite).
MAX_DURATION_S = 100 * 365 * 86400


def load_config(config_path: str | os.PathLike) -> BatchConfig:
    """Parse and check a batch configuration; raises :class:`BatchConfigError`."""
    path = Path(config_path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise BatchConfigError(f"batch config {path}: no such file",
                               hint="give the path of a TOML file; see 'syncpack batch --help'"
                               ) from None
    except IsADirectoryError:
        raise BatchConfigError(f"batch config {path}: is a directory, not a TOML file") from None
    except OSError as e:
        raise BatchConfigError(f"batch config {path}: cannot read ({e.strerror})") from None
    try:
        doc = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise BatchConfigError(f"batch config {path}: not UTF-8 text ({e.reason} at byte "
                               f"{e.start})") from None
    except tomllib.TOMLDecodeError as e:
        raise BatchConfigError(f"batch config {path}: not valid TOML ({e})",
                               hint="see the format in 'syncpack batch --help'") from None
    ck = _Checker(path)
    ck.known(doc, TOP_KEYS, "")
    site = ck.path_(doc, "site", "", required=True)
    log = ck.path_(doc, "log", "")
    metrics_path = ck.path_(doc, "metrics", "")
    if metrics_path is not None and metrics_path.suffix != ".prom":
        raise ck.error("metrics", f"{metrics_path} does not end in .prom",
                       hint="node_exporter's textfile collector reads only *.prom files")
    cfg = BatchConfig(path=path, site=site, log=log, metrics=metrics_path)

    for name, t in ck.tables(doc, "import"):
        ck.known(t, IMPORT_KEYS, name)
        cfg.imports.append(ImportSpec(
            name, ck.path_(t, "path", name, required=True),
            ck.boolean(t, "remove_after_import", name), ck.boolean(t, "required", name)))

    for name, t in ck.tables(doc, "export"):
        ck.known(t, EXPORT_KEYS, name)
        out = ck.path_(t, "out", name, required=True)
        to_v = t.get("to", "all")
        if to_v == "all":
            to = None
        elif (isinstance(to_v, list) and to_v
              and all(isinstance(x, str) and x.strip() for x in to_v)):
            to = list(dict.fromkeys(to_v))
        else:
            raise ck.error(f"{name}.to", f"must be \"all\" or a list of peer names, not {to_v!r}")
        max_size = DEFAULT_MAX_SIZE
        if "max_size" in t:
            v = t["max_size"]
            if isinstance(v, bool) or not isinstance(v, (int, str)):
                raise ck.error(f"{name}.max_size", f"must be bytes or a string like \"650M\", "
                                                   f"not {v!r}")
            try:
                max_size = parse_size(v)
            except ValueError as e:
                raise ck.error(f"{name}.max_size", str(e)) from None
        cfg.exports.append(ExportSpec(name, out, to, max_size, ck.boolean(t, "create", name),
                                      ck.boolean(t, "encrypt", name)))

    if "scrub" in doc:
        t = doc["scrub"]
        if not isinstance(t, dict):
            raise ck.error("scrub", "must be a [scrub] table")
        ck.known(t, SCRUB_KEYS, "scrub")
        min_age = 0
        if "min_age" in t:
            try:
                min_age = parse_duration_ms(t["min_age"])
            except ValueError as e:
                raise ck.error("scrub.min_age", str(e)) from None
        cfg.scrub = ScrubSpec(min_age, ck.boolean(t, "dry_run", "scrub"))

    if not cfg.imports and not cfg.exports and cfg.scrub is None:
        raise ck.error("import/export/scrub", "nothing to do: the file names no [[import]], "
                       "[[export]] or [scrub]")
    return cfg


# --- the log and the lock ---------------------------------------------------------------------

def _now_iso() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class BatchLog:
    """One line per action, appended; each line is written with a single ``write``.

    A log that cannot be written (a full disk) does not stop the round: the actions go on,
    the summary and the metrics are still written, and the failure is the round's error
    ``log`` (:attr:`failed`).  A line cut short by it is ended by the next round's first."""

    def __init__(self, path: Path, site_name: str):
        self.path = path
        self.site_name = site_name
        self.fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o640)
        self.failed: str | None = None
        self._torn = False
        try:
            size = os.fstat(self.fd).st_size
            self._torn = size > 0 and os.pread(self.fd, 1, size - 1) != b"\n"
        except OSError:
            pass

    def line(self, action: str, text: str) -> None:
        if self.failed is not None:
            return
        text = " ".join(str(text).split())  # one line, whatever the message held
        data = ("\n" if self._torn else "") + f"{_now_iso()} {self.site_name} {action}: {text}\n"
        raw = data.encode("utf-8", "backslashreplace")    # a file name that is not UTF-8
        try:
            n = os.write(self.fd, raw)
            if n < len(raw):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            self._torn = False
        except OSError as e:    # a full disk says nothing of which file: the log's
            self._torn = True
            self.failed = f"cannot append to {self.path} ({e.strerror or e})"

    def close(self) -> None:
        os.close(self.fd)


def acquire_lock(site_dir: Path, site_name: str) -> int:
    """The batch lock: an fd holding ``flock(LOCK_EX | LOCK_NB)`` on ``SITE/batch.lock``."""
    lock_path = site_dir / BATCH_LOCK_FILE
    fd = try_lock(lock_path)
    if fd is None:
        raise BatchLockedError(f"another batch round is running at site {site_name!r} "
                               f"(it holds {lock_path})")
    return fd


# --- the round --------------------------------------------------------------------------------

def remove_applied(site: Site, inbox: Path, shown: list[str], unsealed: list[str] = (),
                   errors: list[tuple[str, OSError]] | None = None) -> list[str]:
    """Delete those of ``shown`` (paths an import reported applied or duplicate) that are files
    inside ``inbox`` holding a packet addressed to this site whose id the store records as
    applied, and those of ``unsealed`` (refused because the family requires sealing: their
    senders send them again, sealed; left in place, they failed every round) that are still
    unsealed while the family requires sealing.  Checked again here, file by file, so nothing
    else is ever deleted.  A file that cannot be deleted goes into ``errors`` (the others
    still go).

    An import reports file names escaped (``verify.printable``); the inbox's own files are
    matched back by that same escaping, so a packet whose name holds a control character is
    removed too (it is still checked like any other)."""
    root = Path(os.path.abspath(inbox))
    real_root = Path(os.path.realpath(inbox))
    real = {printable(f): f for f, _named in find_packet_files([root])}
    removed = []
    stale = set(unsealed)
    for s in dict.fromkeys([*shown, *unsealed]):
        p = Path(os.path.abspath(real.get(s, s)))
        if p != root and root not in p.parents:
            continue  # e.g. a packet parked in an earlier round from another inbox
        # Its directory, links resolved, inside the inbox's too: through a link to another
        # directory (an archive), the import reads packets, but deleting one there would
        # delete the archive's copy.  (A link to a file is itself in the inbox: deleting it
        # leaves its target.  So is an inbox named as one packet file, a link or not: the
        # directory holding it is not the inbox, and deleting the file deletes nothing else.)
        where = Path(os.path.realpath(p.parent))
        if p != root and where != real_root and real_root not in where.parents:
            continue
        if not p.is_file():
            continue
        try:
            pk = open_packet(p)
        except PacketError:
            continue
        try:
            h = pk.header
            ok = h.family == site.family_id and h.recipient == site.site_id and (
                is_known(site, h) or
                s in stale and not h.sealed and site.requires_sealing())
        finally:
            pk.close()
        if ok:
            try:
                p.unlink(missing_ok=True)
            except OSError as e:
                if errors is None:
                    raise
                errors.append((s, e))
                continue
            removed.append(s)
    return removed


class _Round:
    def __init__(self, cfg: BatchConfig, site: Site, log: BatchLog,
                 progress: Callable[[int], None] | None):
        self.cfg = cfg
        self.site = site
        self.log = log
        self.progress = progress
        self.imported: dict[str, Any] = {"applied": [], "duplicates": [], "parked": [],
                                         "rejected": [], "skipped": [], "removed": [],
                                         "ops_applied": 0}
        self.exported: list[dict] = []
        self.inboxes: list[dict] = []
        self.outboxes: list[dict] = []
        self.scrub: dict | None = None
        self.errors: list[dict] = []
        # The import under way, whose packets commit one by one: what an interruption kept.
        self.importing: sync.ImportResult | None = None

    def interrupted(self) -> str:
        """What an interruption kept of the import under way, read from the store (a packet
        may have committed just before the interrupt), and counted as applied; or the plain
        rule when no import was under way."""
        if self.importing is None:
            return "the action in progress was rolled back"
        done = sync.committed_since(self.site, self.importing)
        self.imported["applied"] += [p for p, _n in done]
        self.imported["ops_applied"] += sum(n for _p, n in done)
        self._unpark([p for p, _n in done])
        kept = (f"{len(done)} packet(s) of the import in progress were applied and kept "
                f"({sum(n for _p, n in done):,} op(s))" if done else
                "no packet of the import in progress was applied")
        return f"{kept}; the packet being applied was rolled back whole"

    def fail(self, action: str, target: str, message: str, hint: str | None) -> None:
        self.errors.append({"action": action, "target": target, "error": message, "hint": hint})
        self.log.line(action, f"ERROR {target}: {message}" + (f" (hint: {hint})" if hint else ""))

    def guarded(self, action: str, target: str, fn: Callable[[], None]) -> None:
        """Run one action; a failure is recorded and the round goes on with the next one."""
        try:
            fn()
        except (SyncpackError, db.DatabaseError, OSError) as e:
            message, hint, _code = error_outcome(e, self.site.path)
            self.fail(action, target, message, hint)

    def do_import(self, spec: ImportSpec) -> None:
        entry: dict[str, Any] = {"path": str(spec.path), "present": spec.path.exists()}
        self.inboxes.append(entry)
        if not entry["present"]:
            if spec.required:
                self.fail("import", str(spec.path), f"inbox {spec.path} does not exist "
                          f"({spec.name}.required is true)", "is the medium mounted?")
            else:
                self.log.line("import", f"{spec.path}: absent, nothing to import")
            return
        res = self.importing = sync.ImportResult()
        try:
            sync.import_packets(self.site, [spec.path], progress=self.progress, result=res)
        except Exception:
            # failed, not interrupted: no longer the import in progress (an interrupt is a
            # BaseException, and the round's report reads this after it).  What it applied
            # before it failed (an attached application's lock held past its wait, say) is
            # committed, and reported as such.
            self.importing = None
            self._took(entry, res, [])
            raise
        self.importing = None
        removed: list[str] = []
        cannot: list[tuple[str, OSError]] = []
        if spec.remove_after_import:
            # import_packets has returned: every packet it applied is committed.
            removed = remove_applied(self.site, spec.path, res.applied + res.duplicates,
                                     res.unsealed, cannot)
        self._took(entry, res, removed)
        for path, e in cannot:
            self.fail("import", path, f"applied, but cannot be removed ({e.strerror or e})",
                      "let the user that runs the round delete files in the inbox, or set "
                      f"{spec.name}.remove_after_import = false")
        text = (f"{spec.path}: applied {len(res.applied)} packet(s) ({res.ops_applied} ops), "
                f"{len(res.duplicates)} duplicate(s), {len(res.parked)} parked, "
                f"{len(res.rejected)} rejected")
        if spec.remove_after_import:
            text += f", removed {len(removed)} file(s)"
        self.log.line("import", text)
        self._tell(res)

    def retry_parked(self) -> None:
        """With no inbox there (an unmounted medium), the packets parked at earlier rounds are
        still tried again, as every import does: they are kept in the site, not on a medium,
        and the round's ``parked`` is what is still parked once its imports are done."""
        if not exports.parked_rows(self.site.conn):
            return      # nothing to retry: a round without its medium leaves the site alone
        res = self.importing = sync.ImportResult()
        try:
            sync.import_packets(self.site, [], progress=self.progress, result=res)
        except Exception:
            self.importing = None   # failed, not interrupted (as in do_import)
            self._took(None, res, [])
            raise
        self.importing = None
        self._took(None, res, [])
        self.log.line("import", f"{self.site.path / PARKED_DIR}: no inbox present, packets "
                                f"parked earlier: applied {len(res.applied)} "
                                f"({res.ops_applied} ops), {len(res.parked)} still parked, "
                                f"{len(res.rejected)} rejected")
        self._tell(res)

    def _tell(self, res: sync.ImportResult) -> None:
        """An import's packets that wait or were refused, one log line each, and its forks."""
        for p in res.parked:
            self.log.line("import", f"parked {p['path']}: waiting for {sync.waiting_text(p)}")
        for r in res.rejected:
            self.log.line("import", f"REJECTED {r['path']}: {r['error']}")
        for g in res.forgotten:
            self.log.line("import", f"FORGOTTEN parked {g['path']}: its kept copy "
                                    f"{g['parked_file']} is gone; its ops come again")
        for f in res.forks:
            self.fail("import", f["path"], f"fork: {f['origin']} signed two histories of its "
                      f"epoch {f['epoch']}; that range was not applied",
                      "'syncpack status' shows the evidence, which travels to every member")

    def _took(self, entry: dict | None, res: sync.ImportResult, removed: list[str]) -> None:
        """One inbox's import into its entry (no entry: :meth:`retry_parked`) and the round's
        totals.  A packet parked at an earlier round is retried by every inbox's import:
        counted once.  The round's ``parked`` is what is still parked once its imports are
        done: a packet one inbox parked and a later inbox's import applied (its missing packet
        was there) is applied, not both."""
        if entry is not None:
            entry.update(res.to_json())
            entry["removed"] = removed
        for k in ("applied", "duplicates", "rejected", "skipped"):
            self.imported[k] += getattr(res, k)
        self._unpark([*res.applied, *res.duplicates, *(r["path"] for r in res.rejected),
                      *(g["path"] for g in res.forgotten)])
        # the later import's entry says what the packet waits for now
        latest = {p["path"]: p for p in res.parked}
        self.imported["parked"] = [latest.pop(p["path"], p) for p in self.imported["parked"]]
        self.imported["parked"] += latest.values()
        self.imported["removed"] += removed
        self.imported["ops_applied"] += res.ops_applied

    def _unpark(self, gone: list[str]) -> None:
        """Packets parked earlier in the round that have since left the parked set (a parked
        packet keeps the path it was imported from, so a retry reports it by that path)."""
        gone_set = set(gone)
        self.imported["parked"] = [p for p in self.imported["parked"]
                                   if p["path"] not in gone_set]

    def do_export(self, spec: ExportSpec) -> None:
        to_shown = "all" if spec.to is None else spec.to
        entry: dict[str, Any] = {"out": str(spec.out), "to": to_shown, "packets": [],
                                 "did_not_fit": {}}
        self.outboxes.append(entry)
        who = "all" if spec.to is None else ",".join(spec.to)
        try:
            prepare_outbox(spec.out, spec.create, f"set {spec.name}.create = true")
        except OutboxError as e:
            entry["failed"] = True      # not "nothing to send": nothing could be written
            # named by its peers too: two outboxes may share one directory
            self.fail("export", f"{spec.out} -> {who}", e.message, e.hint)
            return
        # To all peers, as 'syncpack export --all': a peer that cannot be served (a resync
        # needed, a roster name that cannot be a path) is one failure, the others still get
        # their packets.
        failed: list[SyncpackError] | None = [] if spec.to is None else None
        to = spec.to
        if to is None:
            # "all" is every peer no other outbox names: one peer's packets on two media
            # would split its link's sequence between them, and its own outbox's size unused
            named = {p for e in self.cfg.exports if e.to is not None for p in e.to}
            if named:
                to = sorted(m.name for m in self.site.members_by_id().values()
                            if m.site_id != self.site.site_id and m.name not in named)
                if not to:
                    return
        try:
            pkts = sync.export(self.site, spec.out, to=to or [], all_peers=to is None,
                               max_size=spec.max_size, progress=self.progress,
                               encrypt=spec.encrypt, failed=failed,
                               seal_max=min(e.max_size for e in self.cfg.exports) // 2,
                               did_not_fit=entry["did_not_fit"])
        except SyncpackError as e:
            # the summary must not say "nothing to send" for an outbox that failed, and the
            # error names the peers the outbox serves, not only the shared directory
            entry["failed"] = True
            self.fail("export", f"{spec.out} -> {getattr(e, 'peer', None) or who}", e.message,
                      e.hint)
            return
        entry["packets"] = [p.to_json() for p in pkts]
        self.exported += entry["packets"]
        for e in failed or []:
            self.fail("export", f"{spec.out} -> {getattr(e, 'peer', '?')}", e.message, e.hint)
        if entry["did_not_fit"] and not any(p.ops for p in pkts):
            # not one op moves on a medium this full, this round or the next: a failure, as
            # an outbox that cannot be written is, not "nothing to send" (a packet without
            # ops, the vector, may still have fitted)
            entry["failed"] = True
            self.fail("export", f"{spec.out} -> {who}",
                      MediumRoom.nothing_fit_text(entry["did_not_fit"], spec.out, len(pkts)),
                      MediumRoom.MEDIUM_FULL_HINT)
            return
        if pkts:
            peers = ", ".join(sorted({p.to for p in pkts}))
            self.log.line("export", f"{spec.out} -> {who}: {len(pkts)} packet(s) to {peers}, "
                                    f"{sum(p.ops for p in pkts)} ops, "
                                    f"{sum(p.bytes for p in pkts)} bytes")
        else:
            self.log.line("export", f"{spec.out} -> {who}: nothing to send")
        if entry["did_not_fit"]:
            self.log.line("export", sync.did_not_fit_text(entry["did_not_fit"], spec.out))

    def do_scrub(self, spec: ScrubSpec) -> None:
        doc = recovery.scrub(self.site, spec.dry_run, spec.min_age_ms)
        self.scrub = doc
        verb = "would remove" if spec.dry_run else "removed"
        self.log.line("scrub", f"{verb} {doc['ops_removed']} changelog op(s), "
                               f"{doc['tombstones_removed']} tombstone(s)")

    def do_metrics(self, path: Path, summary: dict, t0: float) -> None:
        write_metrics(path, self.site, summary, t0)
        self.log.line("metrics", f"wrote {path}")

    def run(self) -> None:
        for spec in self.cfg.imports:
            self.guarded("import", str(spec.path), lambda s=spec: self.do_import(s))
        if self.cfg.imports and not any(e["present"] for e in self.inboxes):
            self.guarded("import", str(self.site.path / PARKED_DIR), self.retry_parked)
        for spec in self.cfg.exports:
            self.guarded("export", str(spec.out), lambda s=spec: self.do_export(s))
        if self.cfg.scrub is not None:
            self.guarded("scrub", self.site.name, lambda: self.do_scrub(self.cfg.scrub))
        # The round did everything else; a table whose capture a schema change stopped is
        # still a failure (its application's changes go nowhere until someone acts).
        for name, why, hint in attach_core.stopped_tables(self.site):
            self.fail("capture", name, why, hint)


def run_batch(config_path: str | os.PathLike,
              progress: Callable[[int], None] | None = None,
              interrupted: dict | None = None,
              when_done: Callable[[], ContextManager] = nullcontext) -> dict:
    """Run one round as configured in ``config_path``; returns the summary (module docstring).
    An interrupted round says in its log and its metrics what it kept, and in
    ``interrupted["kept"]`` for the caller to tell.  Once every action has run, the round is
    summed up, its metrics written and its end logged inside ``when_done()`` (the command
    line holds off Ctrl-C and SIGTERM there: an interrupt then left the metrics of the round
    before, saying all was well, and no end line in the log).

    Raises :class:`BatchConfigError` for a bad configuration (nothing done) and
    :class:`BatchLockedError` when another round holds the site (nothing done).  Failures of
    single actions do not raise: they are in ``summary["errors"]`` and make ``exit_code`` 1.
    """
    cfg = load_config(config_path)
    try:
        site = Site.open(cfg.site)
    except SiteError as e:
        # the site's own hint (--site, SYNCPACK_SITE) is no way to name a round's site
        hint = (e.hint if e.hint and "--site" not in e.hint else
                f"set 'site' in {cfg.path} to the site's directory (an absolute path)")
        raise BatchConfigError(f"batch config {cfg.path}: site: {e.message}", hint=hint) \
            from None
    try:
        log_path = cfg.log or site.path / DEFAULT_LOG_NAME
        try:
            log = BatchLog(log_path, site.name)
        except OSError as e:
            d = log_path.parent
            raise BatchConfigError(
                f"batch config {cfg.path}: log: cannot append to {log_path} ({e.strerror})",
                hint=(f"create {d} (writable by the user that runs the round: "
                      f"mkdir -p {arg(d)}), or set log to a path in a directory that exists")
                if not d.is_dir() else
                f"let the user that runs the round write to {log_path}, or set log to "
                f"another path") from None
        try:
            try:
                lock_fd = acquire_lock(site.path, site.name)
            except BatchLockedError as e:
                log.line("round", f"refused: {e.message}")
                raise
            try:
                started = _now_iso()
                t0 = time.monotonic()
                log.line("round", f"start ({os.path.abspath(cfg.path)})")
                rnd = _Round(cfg, site, log, progress)
                try:
                    rnd.run()
                except BaseException as e:  # a bug or an interrupt: say so in the log, re-raise
                    if isinstance(e, KeyboardInterrupt):
                        kept = rnd.interrupted()
                        if interrupted is not None:
                            interrupted["kept"] = kept
                        log.line("round", f"ABORTED: interrupted; {kept}")
                    else:
                        log.line("round", f"ABORTED: {type(e).__name__}: {e}")
                    if cfg.metrics is not None:
                        try:   # best effort: the alert should see the round fail
                            write_metrics(cfg.metrics, site,
                                          _summary(cfg, site, log_path, started, rnd), t0,
                                          aborted=True)
                        except Exception:
                            pass
                    raise
                with when_done():
                    return _round_end(cfg, site, log, log_path, started, t0, rnd)
            finally:
                os.close(lock_fd)  # releases the flock
        finally:
            log.close()
    finally:
        site.close()


def _round_end(cfg, site: Site, log: "BatchLog", log_path: Path, started: str, t0: float,
               rnd: "_Round") -> dict:
    """A round whose actions have run: its summary, its metrics, its end line."""
    if log.failed is not None:
        rnd.errors.append({"action": "log", "target": str(log_path), "error": log.failed,
                           "hint": "free space on its disk, or set log to another path; the "
                                   "round's actions ran"})
    summary = _summary(cfg, site, log_path, started, rnd)
    if cfg.metrics is not None:
        rnd.guarded("metrics", str(cfg.metrics),
                    lambda: rnd.do_metrics(cfg.metrics, summary, t0))
        if len(rnd.errors) != summary["counts"]["errors"]:   # the write failed
            summary = _summary(cfg, site, log_path, started, rnd)
    c = summary["counts"]
    log.line("round", f"end: {summary['outcome']} (exit {summary['exit_code']}); applied "
                      f"{c['applied']}, parked {c['parked']}, rejected {c['rejected']}, "
                      f"exported {c['exported_packets']}, errors {c['errors']}")
    return summary


def write_metrics(path: Path, site: Site, summary: dict, t0: float,
                  aborted: bool = False) -> None:
    """Write the site's metrics and the round's to ``path`` (see "Metrics" above)."""
    try:
        status = inspection.status(site)
    except (SyncpackError, db.DatabaseError):
        # The store failed the round; the batch metrics still tell the alert so.
        status = {"site": site.name, "family": site.family_name}
    ok = summary["outcome"] == "ok" and not aborted
    finished = time.time()
    try:
        previous = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        previous = ""
    c = summary["counts"]
    rnd = metrics.BatchRound(
        finished_s=round(finished, 3), duration_s=round(time.monotonic() - t0, 3), ok=ok,
        failed_actions=c["errors"],
        packets={"applied": c["applied"], "duplicate": c["duplicates"], "parked": c["parked"],
                 "rejected": c["rejected"], "skipped": len(summary["imported"]["skipped"]),
                 "removed": c["removed"], "exported": c["exported_packets"]},
        last_success_s=round(finished, 3) if ok else metrics.previous_value(
            previous, "syncpack_batch_last_success_timestamp_seconds", site.name))
    try:
        write_textfile(path, metrics.render(status, rnd))
    except OSError as e:
        raise MetricsWriteError(f"cannot write metrics file {path}: {e.strerror or e}") \
            from None


def write_textfile(path: Path, text: str) -> None:
    """Replace ``path`` atomically: a hidden temporary file in the same directory, fsynced,
    mode 0644, renamed over ``path``, the directory fsynced."""
    write_atomic(path, text.encode("utf-8"), mode=0o644)


def _summary(cfg: BatchConfig, site: Site, log_path: Path, started: str, rnd: _Round) -> dict:
    imp = rnd.imported
    counts = {"applied": len(imp["applied"]), "ops_applied": imp["ops_applied"],
              "duplicates": len(imp["duplicates"]), "parked": len(imp["parked"]),
              "rejected": len(imp["rejected"]), "removed": len(imp["removed"]),
              "exported_packets": len(rnd.exported),
              "exported_ops": sum(p["ops"] for p in rnd.exported), "errors": len(rnd.errors)}
    ok = not imp["rejected"] and not rnd.errors
    return {"site": site.name, "config": str(cfg.path), "log": str(log_path),
            "started": started, "finished": _now_iso(),
            "imported": imp, "exported": {"packets": rnd.exported}, "scrub": rnd.scrub,
            "inboxes": rnd.inboxes, "outboxes": rnd.outboxes, "errors": rnd.errors,
            "counts": counts, "outcome": "ok" if ok else "failed", "exit_code": 0 if ok else 1}


def format_summary(doc: dict) -> str:
    """The human-readable summary ``syncpack batch`` prints (problems go to stderr apart)."""
    lines = [f"batch round at {doc['site']}: {doc['outcome']}"]
    for e in doc["inboxes"]:
        if not e["present"]:
            lines.append(f"  import {e['path']}: absent")
        elif "applied" in e:
            t = (f"  import {e['path']}: applied {len(e['applied'])} packet(s) "
                 f"({e['ops_applied']} ops), {len(e['duplicates'])} duplicate(s), "
                 f"{len(e['parked'])} parked, {len(e['rejected'])} rejected")
            if e.get("removed"):
                t += f"; removed {len(e['removed'])} file(s)"
            lines.append(t)
            for p in e["parked"]:
                lines.append(f"    parked {p['path']}: waiting for {sync.waiting_text(p)}")
    imp = doc["imported"]
    if not any(e["present"] for e in doc["inboxes"]) and (imp["applied"] or imp["parked"]):
        # no inbox line tells them: retried by the round (retry_parked), not by an import
        lines.append(f"  packets parked earlier: applied {len(imp['applied'])} "
                     f"({imp['ops_applied']} ops), {len(imp['parked'])} still parked")
        for p in imp["parked"]:
            lines.append(f"    parked {p['path']}: waiting for {sync.waiting_text(p)}")
    for e in doc["outboxes"]:
        who = e["to"] if isinstance(e["to"], str) else ", ".join(e["to"])
        pk = e["packets"]
        if e.get("failed"):
            lines.append(f"  export {e['out']} -> {who}: failed (see the error lines)")
        elif pk:
            lines.append(f"  export {e['out']} -> {who}: {len(pk)} packet(s), "
                         f"{sum(p['ops'] for p in pk)} ops, {sum(p['bytes'] for p in pk)} bytes")
        else:
            lines.append(f"  export {e['out']} -> {who}: nothing to send")
        if e.get("did_not_fit") and not e.get("failed"):    # else the error line tells it
            lines.append("    " + sync.did_not_fit_text(e["did_not_fit"], e["out"]))
    if doc["scrub"] is not None:
        s = doc["scrub"]
        verb = "would remove" if s["dry_run"] else "removed"
        lines.append(f"  scrub: {verb} {s['ops_removed']} changelog op(s), "
                     f"{s['tombstones_removed']} tombstone(s)")
    if doc["errors"] or doc["imported"]["rejected"]:
        lines.append(f"  {len(doc['imported']['rejected'])} rejected packet(s), "
                     f"{len(doc['errors'])} failed action(s): see the error lines")
    return "\n".join(lines)
