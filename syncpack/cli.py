"""The ``syncpack`` command: parse, call one library function, print.

The contract (names, exit codes, JSON fields) is documented in docs/commands.md; keep the two
in step (tests/test_docs.py checks that every command, option and JSON field is there).
"""

from __future__ import annotations

import json
import math
import os
import shlex
import signal
import sys
import traceback
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator

import click

from syncpack.outcome import error_outcome
from syncpack.store import db
from .version import VERSION
from .errors import OutputError, RecordNotFound, SyncpackError, UsageError, arg
from .lazy import OnFirstUse
from .replicated import PRIORITY_MAX, PRIORITY_MIN
from .site import Site

# Each command imports what it runs when it runs (see syncpack.lazy).
attach_core = OnFirstUse("syncpack.attach.core")
conflicts_mod = OnFirstUse("syncpack.admin.conflicts")
inspection = OnFirstUse("syncpack.admin.inspection")
writes = OnFirstUse("syncpack.admin.writes")
metrics = OnFirstUse("syncpack.admin.metrics")
recovery = OnFirstUse("syncpack.admin.recovery")
replica = OnFirstUse("syncpack.exchange.replica")
sync = OnFirstUse("syncpack.exchange.sync")
keys = OnFirstUse("syncpack.format.keys")
names = OnFirstUse("syncpack.format.names")
packets = OnFirstUse("syncpack.exchange.packets")
verify = OnFirstUse("syncpack.exchange.verify")

# A member's priority: a signed 32-bit integer (replicated.check_priority); a value outside is
# a usage error before anything is written.
PRIORITY = click.IntRange(PRIORITY_MIN, PRIORITY_MAX)


class _Text(click.ParamType):
    """A name or a JSON value typed on the command line: bytes that are not UTF-8 reach Python
    as surrogate escapes, which no store or packet can hold (a usage error, exit 2)."""
    name = "text"

    def convert(self, value, param, ctx):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            self.fail(f"{printable(value)} is not UTF-8 text", param, ctx)
        return value


TEXT = _Text()
# How long a command waits for another syncpack command working on the same site.
LOCK_WAIT_S = 60.0


class _SiteName(_Text):
    """A site's name, by the one rule (format/names.py), refused as a usage error (exit 2)
    like any other malformed value: ``rule`` names the check, check_new_site_name for a site
    made now, check_site_name for a member's (a family's names are not held to rules added
    since; a name no site can have is a usage error, not a member the family lacks)."""
    name = "name"

    def __init__(self, rule: str):
        self.rule = rule

    def convert(self, value, param, ctx):
        value = super().convert(value, param, ctx)
        try:
            getattr(names, self.rule)(value)
        except SyncpackError as e:
            self.fail(f"{e.message} ({e.hint})", param, ctx)
        return value


SITE_NAME = _SiteName("check_new_site_name")
MEMBER_NAME = _SiteName("check_site_name")


def _utf8_path(value: str) -> str | None:
    """Why ``value`` cannot be a path syncpack uses, or None: the store records the paths of
    what it writes and reads (packets, the attached database), as UTF-8 text."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return (f"{printable(value)} is not a UTF-8 path, which syncpack cannot record in its "
                f"store; rename it")
    return None


def _empty_path(value: str) -> str | None:
    """Why ``value`` cannot be a path: an empty one would name the current directory (the
    operating system's reading), most likely from a script's unset variable."""
    if value == "":
        return "the path is empty (an unset variable in a script?); name the file or directory"
    return None


class _Where(_Text):
    """A path or URI kept as text (it may name another machine's file system), not empty."""
    name = "path"

    def convert(self, value, param, ctx):
        value = super().convert(value, param, ctx)
        if why := _empty_path(value):
            self.fail(why, param, ctx)
        return value


WHERE = _Where()


class _Path(click.Path):
    """click.Path for a path that is not UTF-8 refused as a usage error (exit 2) before
    anything is made, where it failed part-way through (a half-made site directory).

    A path of the wrong kind (a directory where a file is named) is input rejected, as a
    missing one is: exit 1 with ``error:`` and ``hint:`` (and the JSON error document), not
    click's usage text; an unreadable one is the command's to report, as for a file found
    in a directory."""

    def __init__(self, file_okay: bool = True, dir_okay: bool = True):
        super().__init__(file_okay=True, dir_okay=True, readable=False)
        self.want_file, self.want_dir = file_okay, dir_okay

    def convert(self, value, param, ctx):
        if isinstance(value, str) and (why := _utf8_path(value) or _empty_path(value)):
            self.fail(why, param, ctx)
        value = super().convert(value, param, ctx)
        if not self.want_dir and os.path.isdir(value):
            raise UsageError(f"{printable(value)} is a directory; a file is needed here",
                             hint="name the file itself")
        if not self.want_file and os.path.exists(value) and not os.path.isdir(value):
            raise UsageError(f"{printable(value)} is a file; a directory is needed here",
                             hint="name a directory (or a path that does not exist yet, where "
                                  "one is made)")
        return value


def printable(text: object) -> str:
    s = str(text)
    return s if s.isprintable() else verify.printable(s)   # most text needs no escaping


def escaped(text: str) -> str:
    """Human output with every control character escaped but the line breaks and tabs it was
    built with (no carriage return or terminal escape from a name gets through).  Names that
    may hold a line break are escaped where the lines are built (``verify.printable``)."""
    return "\n".join("\t".join(printable(cell) for cell in line.split("\t"))
                     for line in text.split("\n"))


class Ctx:
    def __init__(self, site: str | None, as_json: bool, quiet: bool, verbose: bool):
        self.site_dir = site or os.environ.get("SYNCPACK_SITE") or "."
        self.site_given = bool(site or os.environ.get("SYNCPACK_SITE"))
        if why := _utf8_path(self.site_dir):
            raise click.UsageError(f"SYNCPACK_SITE: {why}")
        self.json = as_json
        self.quiet = quiet
        self.verbose = verbose
        # Asked on Ctrl-C: (what was kept and what was rolled back, hint).
        self.interrupted: Callable[[], tuple[str, str | None]] | None = None
        # The directories --create-out made, deepest first: a command that fails leaves
        # them as they were, missing, where it wrote nothing into them.
        self.made: list[Path] = []

    def outbox(self, out: str, create: bool) -> None:
        """Check (or with ``create``, make) the directory an export writes into."""
        p = Path(out)
        missing = [d for d in [p, *p.parents] if not os.path.lexists(d)]
        packets.prepare_outbox(out, create, "pass --create-out to create it")
        self.made = missing

    def unmake_outbox(self) -> None:
        for d in self.made:
            try:
                d.rmdir()
            except OSError:     # something was written into it: kept
                break
        self.made = []

    def open(self, require_joined: bool = True) -> Site:
        s = Site.open(self.site_dir, require_joined=require_joined)
        click.get_current_context().call_on_close(s.close)
        if self.interrupted is None and require_joined:
            # What a Ctrl-C tells of a command that says nothing more precise (a put, a
            # priority, ...): whether its change had committed, read from the store then
            # (it can land after the COMMIT, before the report)
            self.on_interrupt_of_one_commit(
                s, "its change had committed before the interrupt and is kept (do not run "
                   "it again)",
                "nothing was left half-done; a change in progress, if any, was rolled back "
                "whole")
        # A command typed while another (a scheduled round's import, say) works on the site
        # waits for it a while, saying so, rather than failing at once.
        s.lock_wait_s = LOCK_WAIT_S
        s.on_lock_wait = lambda: self.note(
            f"waiting for another syncpack command on site {s.name!r} to finish (up to "
            f"{LOCK_WAIT_S:.0f} s)")
        return s

    # One rule for every command (docs/commands.md, "Output"): what a command did or found
    # is its result and goes to stdout; errors, hints and progress are diagnostics and go to
    # stderr.  -q prints nothing when the command succeeds (its exit code says so, like
    # grep -q); --json still writes its one document, which the caller asked for by name.

    def emit(self, doc: dict, human: str | None = None) -> None:
        """The JSON document on stdout in --json mode, else the human text on stdout."""
        if self.json:
            _out(_json_text(doc, indent=2))
        elif human is not None and human != "" and not self.quiet:
            _out(escaped(human))

    def warn(self, text: str) -> None:
        """A warning is a diagnostic: stderr (also beside --json), not when quiet."""
        if not self.quiet:
            click.echo(f"warning: {escaped(text)}", err=True)

    def note(self, text: str) -> None:
        """A diagnostic that is no warning (what the command is waiting for): stderr, not
        when quiet."""
        if not self.quiet:
            click.echo(escaped(text), err=True)

    def say(self, text: str) -> None:
        """More of the human result (a summary line, the next step to take): stdout, not in
        --json mode (stdout holds the document) and not when quiet."""
        if not self.quiet and not self.json:
            _out(escaped(text))

    @contextmanager
    def progress(self, label: str, unit: str = "ops") -> Iterator[_Bar | None]:
        """A progress bar on a terminal; nothing in --json mode, with -q, or when stderr is
        not a terminal (a log file or a pipe must not fill with bar redraws)."""
        if self.json or self.quiet or not sys.stderr.isatty():
            yield None
            return
        bar = _Bar(label, unit)
        try:
            yield bar
        finally:
            bar.close()

    def on_interrupt(self, note: str | Callable[[], tuple[str, str | None]],
                     hint: str | None = None) -> None:
        """What to tell the user if Ctrl-C stops this command: what was kept, what was
        rolled back (a callable is asked only then, so it can look at what was done)."""
        self.interrupted = note if callable(note) else (lambda: (note, hint))

    def on_interrupt_of_one_commit(self, site: Site, kept: str, rolled_back: str,
                                   hint: str | None = None) -> None:
        """:meth:`on_interrupt` for a command whose work is one store transaction: which of
        the two notes is true is read from the store then, for Ctrl-C can land after the
        COMMIT and before the report."""
        before = site.commit_marker()

        def note() -> tuple[str, str | None]:
            # (a commit the command made first, a capture, is none of its work)
            if site.commit_marker() != (site.marker_before_work or before):
                return kept, None
            return rolled_back, hint
        self.on_interrupt(note)


def _terminal_size() -> tuple[int, int]:
    # A terminal that reports no size (0x0: fresh ptys, serial consoles) would make tqdm hide
    # the bar as "beyond the screen"; assume a common one instead.
    try:
        cols, rows = os.get_terminal_size(sys.stderr.fileno())
    except OSError:
        cols, rows = 0, 0
    if not cols:
        try:
            cols = int(os.environ.get("COLUMNS", ""))
        except ValueError:
            cols = 0
    return (cols if cols >= 40 else 80), (rows if rows >= 2 else 24)


class _Bar:
    """tqdm's bar on stderr: percentage, count of total, rate and time left.  Library functions
    call it with the units just done and tell it the total through ``expect`` (see
    syncpack.progress); until then it shows the count and the rate.  Cleared when done, so
    the summary that follows stands alone."""

    def __init__(self, label: str, unit: str):
        from tqdm import tqdm
        cols, rows = _terminal_size()
        self._bar = tqdm(desc=label, total=None, unit=f" {unit}", file=sys.stderr, leave=False,
                         ncols=cols, nrows=rows, mininterval=0.1, smoothing=0.05)

    def __call__(self, done: int) -> None:
        self._bar.update(done)

    def expect(self, more: int) -> None:
        self._bar.total = (self._bar.total or 0) + more
        self._bar.refresh()

    def close(self) -> None:
        self._bar.close()


def echo_error(message: str, hint: str | None = None) -> None:
    """One ``error:`` line, and a ``hint:`` line if any, on stderr.  Control characters are
    escaped, so nothing a message quotes (a file name, a name from a packet) can break the
    line or forge another."""
    click.echo(f"error: {printable(message)}", err=True)
    if hint:
        click.echo(f"hint: {printable(hint)}", err=True)


def _out(text: str) -> None:
    """A result on stdout; a write that fails (a full disk; not a reader gone, which ends
    the command quietly) is the command's error, told on stderr."""
    try:
        click.echo(text)
    except BrokenPipeError:
        raise
    except OSError as e:
        _stdout_to_devnull()
        raise OutputError(f"the output could not be written: {e.strerror or e}") from None
    if _reader_gone():
        raise BrokenPipeError


def _reader_gone() -> bool:
    """Whether stdout is a pipe whose reader has closed it ('syncpack ls | head -1').  A write
    the reader cut short comes back short with no error from Python's buffered layer, and
    the command ended 0, as if the listing were whole; a script is told by exit 141."""
    import select
    import stat
    try:
        if not stat.S_ISFIFO(os.fstat(sys.stdout.fileno()).st_mode):
            return False
        p = select.poll()
        p.register(sys.stdout.fileno(), 0)
        return any(ev & select.POLLERR for _fd, ev in p.poll(0))
    except (OSError, ValueError, AttributeError):     # no file (a test's capture)
        return False


def _stdout_to_devnull() -> None:
    """What Python still holds for stdout goes nowhere (flushed at exit into a closed pipe
    or a full disk, it would fail again, with a traceback)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):   # stdout no file (a test's capture): nothing to flush
        pass


def fail(ctx_obj: Ctx | None, message: str, hint: str | None, code: int = 1):
    if ctx_obj is not None and ctx_obj.json:
        try:
            click.echo(json.dumps({"error": message, "hint": hint}))
        except OSError:     # stdout is what failed: stderr still tells
            _stdout_to_devnull()
    echo_error(message, hint)
    sys.exit(code)


def _given_twice(ctx: click.Context, command: click.Command, args: list[str],
                 group: bool) -> None:
    """Refuse an option that takes one value given twice (a usage error): click keeps the
    last, so 'resync --to b --to c' re-seeded c alone while its operator believed b was,
    and '--policy lww --policy merge' made a policy that can never change again.  A group's
    own options end at its first argument (the subcommand's name)."""
    takes_value = {o: p for p in command.params if isinstance(p, click.Option)
                   and not p.is_flag and not p.count for o in p.opts}
    seen: dict[str, str] = {}
    i = 0
    while i < len(args) and args[i] != "--":
        name, _eq, _v = args[i].partition("=") if args[i].startswith("--") else (
            args[i], "", "")
        p = takes_value.get(name)
        if p is None:
            if group and not args[i].startswith("-"):
                return
            i += 1
            continue
        if not p.multiple:
            if p.name in seen:
                opt = name if name == seen[p.name] else f"{seen[p.name]}/{name}"
                raise click.UsageError(f"{opt} was given twice; it takes one value (name "
                                       f"it once)", ctx=ctx)
            seen[p.name] = name
        i += 1 if _eq else 2


class Command(click.Command):
    """A command whose one-value options are refused when given twice (_given_twice)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        _given_twice(ctx, self, args, group=False)
        return super().parse_args(ctx, args)


class Group(click.Group):
    """Turns library errors into ``error:``/``hint:`` lines and exit 1, never a traceback."""

    command_class = Command

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if ctx.parent is None:
            args = _json_first(args)
        try:
            _given_twice(ctx, self, args, group=True)
            return super().parse_args(ctx, args)
        except KeyboardInterrupt:
            # click would say "Aborted!" and exit 1
            _hold_signals()
            message = "interrupted while starting; nothing was done"
            if "--json" in args:
                click.echo(json.dumps({"error": message, "hint": None}))
            fail(None, message, None, 130)
            raise

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return self._invoke(ctx)
        except BaseException as e:
            if not (isinstance(e, SystemExit) and e.code in (0, None, 141)) and \
                    isinstance(ctx.obj, Ctx):
                ctx.obj.unmake_outbox()
            raise
        finally:
            if ctx.parent is None and _STANDALONE:
                # Done and told: an interrupt from here on (click's teardown, the
                # interpreter's exit, where Python puts SIGINT's default action back) would
                # turn a finished command into a signal death, or click's "Aborted!"
                _hold_signals()

    def _invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            # The output's reader has gone ('syncpack conflicts | head -1'): the command's
            # work is done and nobody reads on; end quietly, as a program killed by SIGPIPE.
            _output_gone()
        except (SyncpackError, db.DatabaseError, OSError) as e:
            fail(ctx.obj, *error_outcome(e, getattr(ctx.obj, "site_dir", None)))
        except KeyboardInterrupt:
            # A second Ctrl-C (or SIGTERM, or an interrupt a finaliser swallowed and
            # console.interrupts_never_lost delivers again) must not cut the report short,
            # nor end the process by the signal: the work is already stopped.
            _hold_signals()
            note, hint = _interrupt_note(ctx.obj)
            fail(ctx.obj, f"interrupted; {note}", hint, 130)
        except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException):
            raise
        except Exception as e:  # a bug: say so in one line; -v shows the traceback
            if ctx.obj is not None and ctx.obj.verbose:
                traceback.print_exc()
            fail(ctx.obj, f"internal error: {type(e).__name__}: {e}",
                 "this is a bug in syncpack; rerun with -v and report the traceback")


def _json_first(args: list[str]) -> list[str]:
    """``syncpack status --json`` as ``syncpack --json status``: the option is the program's,
    and a user (or a script) puts it after the command as often as before.  A ``--json``
    after ``--`` is an argument and stays."""
    end = args.index("--") if "--" in args else len(args)
    if "--json" not in args[:end]:
        return args
    return ["--json", *(a for a in args[:end] if a != "--json"), *args[end:]]


def _output_gone() -> None:
    """Exit 141 (128 + SIGPIPE) without a word."""
    _stdout_to_devnull()
    sys.exit(141)


def _interrupt_note(obj: Ctx | None) -> tuple[str, str | None]:
    ask = obj.interrupted if obj is not None else None
    if ask is not None:
        try:
            return ask()
        except Exception:   # the report must not fail; fall back to what always holds
            pass
    # Every command changes the store in one transaction at a time, and SQLite rolls back
    # an unfinished one whole; a command that only reads had none ("if any").
    return "nothing was left half-done; a change in progress, if any, was rolled back whole", None


def _json_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise click.BadParameter(f"not valid JSON ({e.msg}); quote strings, e.g. '\"text\"'")
    except RecursionError:      # the parser's own limit, far below what memory allows
        from syncpack.format.values import MAX_DEPTH
        raise click.BadParameter(f"nested more than {MAX_DEPTH} levels deep") from None


def _shown(value: Any) -> str:
    """A value as a person reads it: JSON with non-ASCII text as itself, not \\u escapes."""
    return _json_text(value, ensure_ascii=False)


def _json_text(doc: Any, **kw) -> str:
    """``doc`` as strict JSON.  A REAL of an attached table may be infinite or NaN (and a
    member may sign such a value anywhere); JSON has no such numbers, and Python's spelling
    of them (bare ``Infinity``) makes the whole document unreadable to a strict parser
    (jq): they show tagged, as ``{"$real": "Infinity"}``, like a BLOB's ``$blob``.  A map
    key JSON cannot have (a member may sign a map keyed by bytes) shows as the JSON text of
    its tagged form, ``'{"$blob": "69"}'``."""
    try:
        return json.dumps(doc, allow_nan=False, default=_not_json, **kw)
    except (ValueError, TypeError):
        return json.dumps(_as_json(doc), allow_nan=False, default=_not_json, **kw)


def _as_json(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return {"$real": "NaN" if math.isnan(v) else "Infinity" if v > 0 else "-Infinity"}
    if isinstance(v, dict):
        return {_json_key(k): _as_json(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_as_json(x) for x in v]
    return v


def _json_key(k: Any) -> Any:
    if k is None or isinstance(k, (str, int, bool)) or \
            isinstance(k, float) and math.isfinite(k):
        return k
    return json.dumps(_as_json(k), allow_nan=False, default=_not_json)


def _not_json(value: Any) -> Any:
    # A BLOB of an attached table (docs/attach.md) shows tagged, as hex.
    if isinstance(value, bytes):
        return {"$blob": value.hex()}
    # Values the API now refuses may still arrive from a site running an older syncpack.
    return f"<{type(value).__name__}: not JSON>"


def _create_out_option(f):
    return click.option("--create-out", is_flag=True,
                        help="Create --out if it does not exist (default: a missing --out is "
                             "an error, so a mistyped or unmounted path never swallows "
                             "packets).")(f)


def _size(ctx, param, value):
    if value is None:
        return packets.DEFAULT_MAX_SIZE
    try:
        return packets.parse_size(value)
    except ValueError as e:
        raise click.BadParameter(str(e))


def _version(ctx, param, value):
    """--version: with --json (which is read first, both being eager), one JSON document."""
    if not value or ctx.resilient_parsing:
        return
    if ctx.params.get("as_json"):
        click.echo(json.dumps({"version": VERSION}))
    else:
        click.echo(f"syncpack, version {VERSION}")
    ctx.exit()


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--site", "site", metavar="DIR", type=_Path(),
              help="Site directory (default: $SYNCPACK_SITE, else the current directory).")
@click.option("--json", "as_json", is_flag=True, is_eager=True,
              help="Print one JSON document on stdout (may "
              "also follow the command: 'syncpack status --json').")
@click.option("-q", "--quiet", is_flag=True, help="Print nothing on success; errors still go "
              "to stderr, the exit code says how it went.")
@click.option("-v", "--verbose", is_flag=True, help="More detail; tracebacks for internal errors.")
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_version,
              help="Show the version and exit.")
@click.pass_context
def cli(ctx, site, as_json, quiet, verbose):
    """Offline replication by signed, compressed update packets.

    Sites that cannot reach each other each keep a full replica; 'export' writes the changes a
    peer lacks into packet files, you carry them (USB stick, shared drop), 'import' applies them.

    \b
    Example, a family of two sites:
      syncpack init boston --family parts --site boston
      syncpack keygen sanfran --site sanfran
      syncpack --site boston mkreplica export --site sanfran \\
          --pubkey sanfran/keys/site.pub --out /media/usb
      syncpack --site sanfran mkreplica import /media/usb
      syncpack --site boston put parts p1 '{"qty": 4}'
      syncpack --site boston export --to sanfran --out /media/usb
      syncpack --site sanfran import /media/usb
    """
    ctx.obj = Ctx(site, as_json, quiet, verbose)


# --- site lifecycle ---------------------------------------------------------------------------

@cli.command()
@click.argument("directory", type=_Path(file_okay=False))
@click.option("--family", type=TEXT, required=True, help="Name of the new family.")
@click.option("--site", "site_name", type=SITE_NAME, required=True,
              help="Name of this first site.")
@click.option("--policy", type=click.Choice(["lww", "priority"]), default="lww",
              show_default=True, help="Default conflict policy for collections.")
@click.option("--priority", type=PRIORITY, default=0, show_default=True,
              help="This site's priority under the 'priority' policy.")
@click.pass_obj
def init(obj: Ctx, directory, family, site_name, policy, priority):
    """Create a new family whose first site lives in DIRECTORY.

    Writes the site's store and an Ed25519 key pair (private key mode 0600).

    \b
    Example:
      syncpack init /srv/boston --family parts --site boston_hub
    """
    s = Site.init_family(directory, family, site_name, policy, priority)
    doc = {"site": s.name, "family": family, "family_id": s.family_id.hex(),
           "path": str(s.path)}
    obj.emit(doc, f"created family {family!r} ({s.family_id.hex()}) with site {s.name!r} "
                  f"at {s.path}")


@cli.command()
@click.argument("directory", type=_Path(file_okay=False))
@click.option("--site", "site_name", type=SITE_NAME, required=True,
              help="Name of the new site.")
@click.pass_obj
def keygen(obj: Ctx, directory, site_name):
    """Make a not-yet-joined site directory with its key pair.

    Prints the public key file to hand to 'mkreplica export --pubkey' at a member site.

    \b
    Example:
      syncpack keygen /srv/sanfran --site sanfran_hub
    """
    s, pub = Site.keygen(directory, site_name)
    # Absolute, so the path still works from whatever directory the next command runs in.
    pub_path = os.path.abspath(pub)
    obj.emit({"site": s.name, "public_key": pub_path}, pub_path)


@cli.group(cls=Group)
def mkreplica():
    """Add a site to the family (export) and create it from the packets (import).

    \b
    Example:
      syncpack keygen /srv/sanfran --site sanfran_hub
      syncpack --site /srv/boston mkreplica export --site sanfran_hub \\
          --pubkey /srv/sanfran/keys/site.pub --out /media/usb
      syncpack --site /srv/sanfran mkreplica import /media/usb
    """


@mkreplica.command("export")
@click.option("--site", "name", type=SITE_NAME, required=True, help="Name of the new site.")
@click.option("--pubkey", required=True, type=_Path(dir_okay=False),
              help="Public key file from 'syncpack keygen'.")
@click.option("--out", required=True, type=_Path(file_okay=False),
              help="Directory (e.g. a mounted USB stick) to write the packet(s) into.")
@click.option("--priority", type=PRIORITY, default=0, show_default=True,
              help="The new site's priority under the 'priority' conflict policy.")
@click.option("--max-size", callback=_size, help="Largest packet, bytes or with K/M/G/T "
              "(default just under 4G).")
@click.option("--encrypt", is_flag=True, help="Seal the snapshot to the new site's X25519 key.")
@_create_out_option
@click.pass_obj
def mkreplica_export(obj: Ctx, name, pubkey, out, priority, max_size, encrypt, create_out):
    """At a member site: add NAME to the family and write its replica-creation packets.

    \b
    Example:
      syncpack --site /srv/boston mkreplica export --site sanfran_hub \\
          --pubkey sanfran.pub --out /media/usb
    """
    s = obj.open()
    obj.outbox(out, create_out)
    obj.on_interrupt(lambda: _mkreplica_interrupted(s, name))
    with obj.progress("snapshot", "records") as tick:
        parts = replica.mkreplica_export(s, name, pubkey, out, priority, max_size,
                                         progress=tick, encrypt=encrypt)
    doc = {"packets": [{"path": str(p.path), "to": name, "records": p.header.count,
                        "bytes": p.size, "part": p.header.part} for p in parts]}
    obj.emit(doc, "\n".join(str(p.path) for p in parts))
    _warn_stopped(obj, s, "the snapshot")
    where = parts[0].path.parent if parts else Path(out)
    obj.say(f"added {name} to family {s.family_name!r}; carry {where} to the new site and run "
            f"there:\n  syncpack --site {shlex.quote(_keygen_dir(pubkey, name))} mkreplica "
            f"import {shlex.quote(str(where))}")


def _keygen_dir(pubkey: str, name: str) -> str:
    """The new site's directory when the public key still lies where keygen wrote it."""
    p = Path(pubkey).absolute()
    if p.parent.name == "keys" and (p.parent.parent / "syncpack.db").is_file():
        return str(p.parent.parent)
    return f"DIR_OF_{name}"


def _mkreplica_interrupted(s: Site, name: str) -> tuple[str, str | None]:
    s.invalidate()
    if name in s.roster():
        return (f"{name} was added to the family, but its replica-creation packets were not "
                f"written (partial files were removed)",
                f"write them with 'syncpack resync --to {name} --out DIR' and import those "
                f"with 'mkreplica import'")
    return "nothing was changed: the new site was not added", None


@mkreplica.command("import")
@click.argument("paths", nargs=-1, required=True, type=_Path())
@click.pass_obj
def mkreplica_import(obj: Ctx, paths):
    """Create the replica (the --site directory made by keygen) from its packets.

    \b
    Example:
      syncpack --site /srv/sanfran mkreplica import /media/usb
    """
    s = obj.open(require_joined=False)
    obj.on_interrupt("the site was not seeded: its one transaction was rolled back",
                     "run the same command again")
    with obj.progress("seeding", "records") as tick:
        replica.mkreplica_import(s, list(paths), progress=tick)
    m = replica.snapshot_sender(s)
    fp = keys.fingerprint(m.ed25519) if m else ""
    obj.emit({"site": s.name, "family": s.family_name, "family_id": s.family_id.hex(),
              "from": m.name if m else None, "sender_key_fingerprint": fp},
             f"site {s.name!r} joined family {s.family_name!r} ({s.family_id.hex()})")
    # The snapshot is checked against the keys it carries; the person importing it is the one
    # who can confirm it came from the family they meant to join.
    obj.say(f"snapshot signed by {m.name if m else '?'} with key {fp}; "
            f"compare with 'syncpack keyinfo' at that site")


# --- data -------------------------------------------------------------------------------------

@cli.command()
@click.argument("collection", type=TEXT)
@click.argument("key", type=TEXT)
@click.argument("value", type=TEXT, metavar="JSON")
@click.pass_obj
def put(obj: Ctx, collection, key, value):
    """Write a record; JSON '-' reads the value from standard input.

    \b
    Example:
      syncpack put parts p-100 '{"name": "bolt", "qty": 40}'
      syncpack put parts p-101 - < p-101.json
    """
    if value == "-":
        # Large values do not fit the shell's argument limit.
        data = sys.stdin.buffer.read() if hasattr(sys.stdin, "buffer") else sys.stdin.read()
        try:
            value = data.decode("utf-8-sig") if isinstance(data, bytes) else data
        except UnicodeDecodeError as e:
            raise click.BadParameter(f"standard input is not UTF-8 text (byte {e.start})",
                                     param_hint="'JSON'") from None
    v = _json_value(value)
    why = writes.put(obj.open(), collection, key, v)
    with _no_interrupt():
        _table_warning(obj, why)
        obj.emit({"collection": collection, "key": key, "value": v})


@cli.command()
@click.argument("collection", type=TEXT)
@click.argument("key", type=TEXT)
@click.pass_obj
def delete(obj: Ctx, collection, key):
    """Delete a record (a tombstone is recorded even if the record is absent).

    \b
    Example:
      syncpack delete parts p-099
    """
    why = writes.delete(obj.open(), collection, key)
    with _no_interrupt():
        _table_warning(obj, why)
        obj.emit({"collection": collection, "key": key, "deleted": True})


def _table_warning(obj: Ctx, why: str | None) -> None:
    if why:
        obj.warn(f"written, but {why}")


@cli.command()
@click.argument("collection", type=TEXT)
@click.argument("key", type=TEXT)
@click.pass_obj
def get(obj: Ctx, collection, key):
    """Print the visible value as JSON; exit 1 if absent.

    \b
    Example:
      syncpack get parts p-100
    """
    s = obj.open()
    key = s.key_as_shown(collection, key)
    try:
        v = s.get(collection, key)
    except RecordNotFound as e:
        raise RecordNotFound(str(e), hint=f"'syncpack ls {arg(collection)}' lists the "
                                          f"keys") from None
    obj.emit({"collection": collection, "key": key, "value": v}, _shown(v))


@cli.command("ls")
@click.argument("collection", type=TEXT, required=False)
@click.pass_obj
def ls_(obj: Ctx, collection):
    """List records (all collections, or one).

    \b
    Example:
      syncpack ls parts
    """
    s = obj.open()
    recs = [{"collection": c, "key": k, "value": v} for c, k, v in s.records(collection,
                                                                             shown=True)]
    obj.emit({"records": recs},
             "\n".join(f"{printable(r['collection'])}\t{printable(r['key'])}\t"
                       f"{_shown(r['value'])}" for r in recs))


@cli.command()
@click.argument("file", type=_Path(dir_okay=False))
@click.pass_obj
def load(obj: Ctx, file):
    """Load JSON lines in one transaction; a bad line rejects the whole file.

    Each line is {"collection", "key", "value"} or {"collection", "key", "delete": true}.
    FILE - reads standard input.

    \b
    Examples:
      syncpack load parts.jsonl
      zcat parts.jsonl.gz | syncpack load -
    """
    s = obj.open()
    obj.on_interrupt_of_one_commit(
        s, "the file was loaded whole: its one transaction had committed before the "
           "interrupt (do not load it again)",
        "nothing was loaded: the file's one transaction was rolled back")
    with obj.progress("load", "records") as tick:
        doc = inspection.load(s, file, progress=tick)
    with _no_interrupt():
        obj.emit(doc, f"loaded {doc['loaded']} record(s) in one transaction")


@cli.command()
@click.pass_obj
def digest(obj: Ctx):
    """Print a digest of the replicated state; equal on converged sites.

    \b
    Example:
      syncpack --site boston digest; syncpack --site sanfran digest
    """
    s = obj.open()
    doc = inspection.digest(s)
    obj.emit(doc, doc["digest"])


@cli.command()
@click.pass_obj
def fsck(obj: Ctx):
    """Check the store's invariants; exit 1 on any violation.

    Checks: SQLite's integrity check; each origin's changelog is contiguous; the vector
    equals the changelog's highest epochs; the clock is not behind any CSN; the record state
    equals a replay of the changelog; and each attached table equals the visible records.

    \b
    Example:
      syncpack --site boston fsck
    """
    doc = inspection.fsck_opening(obj.open)
    if obj.json:
        obj.emit(doc)
    if not doc["ok"]:
        # What it found is the result (stdout, to keep as a report); the failure is one
        # error line naming the first problem, with the hint.
        problems = doc["problems"]
        if not obj.json:
            for p in problems:
                _out(printable(p))
        more = (f" (and {len(problems) - 1} more problem(s), listed on stdout)"
                if len(problems) > 1 else "")
        echo_error(f"fsck: {problems[0]}{more}", doc["hint"])
        sys.exit(1)
    if not obj.json:
        obj.say(f"ok: {doc['changelog_ops']} changelog ops checked")


# --- sync -------------------------------------------------------------------------------------

@cli.command("export")
@click.option("--to", "to", type=MEMBER_NAME, multiple=True, metavar="PEER",
              help="Peer to export to (repeat).")
@click.option("--all", "all_peers", is_flag=True, help="Export to every other member.")
@click.option("--out", required=True, type=_Path(file_okay=False),
              help="Directory to write packets into (layout: OUT/<to>/<from>/<seq>-<part>.spk).")
@click.option("--max-size", callback=_size, help="Largest packet, bytes or with K/M/G/T "
              "(default just under 4G, so packets fit FAT32).")
@click.option("--engine", type=click.Choice(["local", "spark"]), default="local",
              show_default=True, help="'spark' builds the peers' packets in parallel with "
              "PySpark from the Parquet log (same bytes as 'local').")
@click.option("--spark-master", "spark_master", metavar="URL", default="local[*]",
              show_default=True, help="Spark master for --engine spark.")
@click.option("--log", "log_dir", metavar="DIR", type=WHERE,
              help="Parquet log to read with --engine spark "
              "(default: the site's own log, brought up to date first).")
@click.option("--staging", metavar="URI", type=WHERE,
              help="Where --engine spark's executors put packet bodies for this machine "
                   "to finish: a path or URI every executor can write and this machine can "
                   "read (needed on a cluster; default with a local master: a temporary "
                   "directory).")
@click.option("--encrypt", is_flag=True, help="Seal each packet to its recipient's X25519 key "
              "(always on when the family requires it).")
@_create_out_option
@click.pass_obj
def export_(obj: Ctx, to, all_peers, out, max_size, engine, spark_master, log_dir, staging,
            encrypt, create_out):
    """Write update packets holding exactly what each peer lacks.

    \b
    Example:
      syncpack --site boston export --to sanfran --out /media/usb
      syncpack --site boston export --all --out /media/usb --max-size 650M
      syncpack --site boston export --all --out /media/usb --engine spark
      syncpack --site boston export --all --out /media/usb --engine spark \\
          --spark-master spark://head:7077 --log /shared/boston-log --staging /shared/tmp
    """
    if to and all_peers:
        raise click.UsageError("use either --to PEER... or --all")
    if not to and not all_peers:
        raise click.UsageError("name the peers with --to PEER (repeatable) or use --all")
    if log_dir is not None and engine != "spark":
        raise click.UsageError("--log is read by --engine spark only")
    if staging is not None and engine != "spark":
        raise click.UsageError("--staging is used by --engine spark only")
    s = obj.open()
    sync.select_peers(s, list(to), all_peers)      # a bad name before the medium is touched
    if engine == "spark":
        from syncpack.engine import spark_job
        spark_job.check_master(spark_master)
    obj.outbox(out, create_out)
    obj.on_interrupt_of_one_commit(
        s, "packets of this run were written and recorded as sent before the interrupt "
           "('syncpack lsepoch' shows what each peer was sent); the next export writes only "
           "what is still missing",
        "no packet was recorded as sent; the next export writes the same changes again "
        "(packet files of this run may be left on the medium, harmless)",
        "run the same export again")
    # A peer that cannot be served (it needs a resync, or its roster name cannot be a
    # directory) does not hold back the others' packets, whichever engine builds them (it
    # gets our vector without ops where it can, and the command exits 1 naming it).
    failed: list[SyncpackError] = []
    did_not_fit: dict[str, int] = {}
    with obj.progress("export") as tick:
        if engine == "spark":
            pkts = spark_job.export_spark(s, out, list(to), all_peers, max_size,
                                             master=spark_master, log_dir=log_dir,
                                             staging=staging, progress=tick,
                                             encrypt=encrypt, failed=failed)
        else:
            pkts = sync.export(s, out, list(to), all_peers, max_size, progress=tick,
                               encrypt=encrypt, failed=failed, did_not_fit=did_not_fit)
    with _no_interrupt():       # the work is committed: Ctrl-C no longer cuts it short
        _export_report(obj, s, pkts, failed, did_not_fit, out)


def _warn_stopped(obj: Ctx, s: Site, what: str) -> None:
    """An attached table whose capture a schema change stopped: what leaves lacks its
    application's changes since, which an administrator must hear of."""
    for _name, why, hint in attach_core.stopped_tables(s):
        obj.warn(f"{why}; its changes are not in {what} ({hint})")


def _export_report(obj: Ctx, s: Site, pkts: list, failed: list[SyncpackError],
                   did_not_fit: dict[str, int], out) -> None:
    doc = {"packets": [p.to_json() for p in pkts], "did_not_fit": did_not_fit}
    if failed:
        doc["failed"] = [{"to": e.peer, "error": e.message, "hint": e.hint} for e in failed]
    obj.emit(doc, "\n".join(f"{p.path}\t{p.to}\t{p.ops} ops\t{p.bytes} bytes" for p in pkts))
    # Not one op written while ops wait is no partial trip but a failure, as a medium that
    # fills up midway is: a warning alone is silent under -q, and the backlog never moves on
    # a medium that full (a packet without ops may still fit: the vector, not the backlog).
    none_fit = bool(did_not_fit) and not any(p.ops for p in pkts)
    if not pkts and not failed and not none_fit:
        obj.say("nothing to send: every peer already holds our changes and our vector")
    if did_not_fit and not none_fit:
        obj.warn(sync.did_not_fit_text(did_not_fit, out))
    _warn_stopped(obj, s, "these packets")
    for e in failed:
        echo_error(e.message, e.hint)
    if none_fit:
        echo_error(packets.MediumRoom.nothing_fit_text(did_not_fit, out, len(pkts)),
                   packets.MediumRoom.MEDIUM_FULL_HINT)
    if failed or none_fit:
        sys.exit(1)


@cli.command("import")
@click.argument("paths", nargs=-1, required=True, type=_Path())
@click.pass_obj
def import_(obj: Ctx, paths):
    """Apply update packets (files, or directories searched recursively).

    Packets with a gap are parked inside the site directory and applied by themselves once the
    missing packets arrive.

    \b
    Example:
      syncpack --site sanfran import /media/usb
    """
    s = obj.open()
    res = sync.ImportResult()
    obj.on_interrupt(lambda: _import_interrupted(s, res))
    with obj.progress("import") as tick:
        sync.import_packets(s, paths, progress=tick, result=res)
    # The work is done and committed: a Ctrl-C from here on would only cut the report short
    # and turn a complete import's exit code into 130.
    with _no_interrupt():
        _import_report(obj, res)


def _hold_signals() -> None:
    try:
        for n in (signal.SIGINT, signal.SIGTERM):
            signal.signal(n, signal.SIG_IGN)
    except ValueError:      # not the main thread
        pass


@contextmanager
def _no_interrupt():
    try:
        old = {n: signal.signal(n, signal.SIG_IGN) for n in (signal.SIGINT, signal.SIGTERM)}
    except ValueError:      # not the main thread (an embedding caller): nothing to hold off
        old = None
    try:
        yield
    finally:
        # The program itself keeps ignoring them until it exits (a Ctrl-C while the
        # interpreter shuts down would still turn a finished import into a signal death);
        # an embedding caller gets its handlers back.
        if old is not None and not _STANDALONE:
            for n, h in old.items():
                signal.signal(n, h)


def _import_report(obj: Ctx, res: sync.ImportResult) -> None:
    if obj.json:
        obj.emit(res.to_json())
    for r in res.rejected:
        echo_error(f"{r['path']}: {r['error']}", r.get("hint"))
    for g in res.forgotten:
        obj.warn(f"the kept copy of a packet parked here ({printable(g['path'])}, from "
                 f"{printable(g['from'])}) is gone: {printable(g['parked_file'])} (a backup "
                 f"restored without the site's parked/ directory?); forgotten, its ops come "
                 f"again from a peer in the next rounds")
    for f in res.forks:
        echo_error(f"{f['path']}: fork: {f['origin']} signed two histories of its epoch "
                   f"{f['epoch']}; that range was not applied, the evidence is kept and "
                   f"passed on (see 'syncpack status')")
    for why in res.refused_definitions:
        obj.warn(why)
    if not obj.json:
        lines = [printable(attach_core.created_text(c)) for c in res.created_tables]
        for p in res.parked:
            lines.append(f"parked {p['path']}: waiting for {sync.waiting_text(p)}")
        # Last, after any error: the counts of everything that was found, so a directory of
        # other sites' packets does not read as an import that worked.
        lines.append(_import_summary(res))
        obj.say("\n".join(lines))
    if res.rejected or res.forks:
        sys.exit(1)


def _import_summary(res: sync.ImportResult) -> str:
    parts = []
    if res.applied or res.ops_applied:
        parts.append(f"{len(res.applied)} packet(s) applied ({res.ops_applied:,} op(s))")
    for n, what in ((len(res.duplicates), "duplicate(s) (applied before)"),
                    (len(res.parked), "parked (waiting for earlier packets)"),
                    (len(res.incomplete), "large transaction(s) held until their last part "
                                          "arrives"),
                    (len(res.rejected), "rejected")):
        if n:
            parts.append(f"{n} {what}")
    why = list(res.skipped_why.get(p, "other site") for p in res.skipped)
    skipped = [(why.count("other site"), "for other sites"),
               (why.count("other family"), "of another family"),
               (len(res.ignored), "not packets")]
    total = sum(n for n, _ in skipped)
    if total:
        parts.append(f"{total} file(s) skipped (" + ", ".join(
            f"{n} {what}" for n, what in skipped if n) + ")")
    return "import: " + ("; ".join(parts) if parts else "no packets found")


def _import_interrupted(s, res: sync.ImportResult) -> tuple[str, str]:
    # from the store, not from what the loop had noted: the interruption may have come
    # between a packet's commit and the note
    done = sync.committed_since(s, res)
    kept = (f"{len(done)} packet(s) applied and kept ({sum(n for _p, n in done):,} op(s)): "
            + ", ".join(printable(p) for p, _n in done) if done else "no packet was applied")
    return (f"{kept}; the packet being applied was rolled back whole",
            "run the same import again: applied packets are skipped as duplicates")


@cli.command()
@click.argument("paths", nargs=-1, required=True, type=_Path())
@click.pass_obj
def lspacket(obj: Ctx, paths):
    """Describe packets without applying them (no site needed; with one, checks signatures).

    \b
    Example:
      syncpack lspacket /media/usb
    """
    s = None
    if obj.site_given:
        # named (a typo, a medium not mounted): said, as every command says it, not taken
        # for no site at all
        s = obj.open(require_joined=False)
    elif Path(obj.site_dir, "syncpack.db").exists():
        try:
            s = obj.open(require_joined=False)
        except SyncpackError:
            s = None
    doc = inspection.lspacket(list(paths), s)
    human = []
    for p in doc["packets"]:
        # An id must not pass for a name: unnamed sites read "site id 1ca5b866c54d299f".
        who = (lambda x: x) if p["named"] else (lambda x: f"site id {x}")
        rng = ", ".join(f"{who(o)} {lo + 1}-{hi}" for o, (lo, hi) in p["ranges"].items()) or "-"
        human.append(f"{p['path']}: {p['kind']} {who(p['from'])} -> {who(p['to'])} seq "
                     f"{p['seq']} part {p['part']}, {p['ops']} ops, ranges {rng}, signature "
                     f"{p['signature']}, " + ("sealed" if p["sealed"] else "not sealed")
                     + (f", piece at {p['piece'][0]} of a "
                        f"{'record' if p['kind'] == 'snapshot' else 'block'} of "
                        f"{p['piece'][1]} bytes"
                        if p["piece"] else ""))
    if any(not p["named"] for p in doc["packets"]):
        human.append("sites shown by id: an update packet carries site ids only, and only a "
                     "member site knows their names (run with --site DIR to name them and "
                     "check signatures)")
    obj.emit(doc, "\n".join(human))
    for e in doc["errors"]:
        echo_error(f"{e['path']}: {e['error']}", e.get("hint"))
    if doc["errors"]:
        sys.exit(1)


@cli.command()
@click.pass_obj
def lsepoch(obj: Ctx):
    """Show the epoch matrix: our vector, and per peer what we sent and what it acknowledged.

    \b
    Example:
      syncpack --site boston lsepoch
    """
    s = obj.open()
    doc = inspection.lsepoch(s)
    obj.emit(doc, _matrix_table(doc))


def _matrix_table(doc: dict) -> str:
    # Site names come from the roster (an old store may hold any); escaped before laying out.
    doc = {"site": printable(doc["site"]),
           "vector": {printable(o): e for o, e in doc["vector"].items()},
           "peers": {printable(p): {k: {printable(o): e for o, e in v.items()}
                                    for k, v in d.items()} for p, d in doc["peers"].items()}}
    origins = list(doc["vector"])
    w = max([len(o) for o in origins] + [len("sent to ") + max(
        [len(p) for p in doc["peers"]] + [0]), 10]) + 2
    lines = [f"site {doc['site']}".ljust(w) + "".join(o[:12].rjust(13) for o in origins)]
    lines.append("holds".ljust(w) + "".join(str(doc["vector"][o]).rjust(13) for o in origins))
    for p, d in doc["peers"].items():
        lines.append(f"sent to {p}".ljust(w) + "".join(
            str(d["sent"].get(o, 0)).rjust(13) for o in origins))
        lines.append(f"acked by {p}".ljust(w) + "".join(
            str(d["acked"].get(o, 0)).rjust(13) for o in origins))
    return "\n".join(lines)


@cli.command()
@click.argument("peer", type=MEMBER_NAME)
@click.argument("settings", type=TEXT, nargs=-1, required=True, metavar="ORIGIN=EPOCH...")
@click.pass_obj
def chepoch(obj: Ctx, peer, settings):
    """Correct what we believe PEER holds of each ORIGIN (the next export sends from there).

    \b
    Example:
      syncpack --site boston chepoch sanfran boston=700
    """
    s = obj.open()
    doc = inspection.chepoch(s, peer, list(settings))
    obj.emit(doc, _matrix_table(doc))


@cli.command()
@click.option("--format", "fmt", type=click.Choice(["text", "json", "prometheus"]),
              help="text (default), json (same as the global --json), or prometheus: the "
              "text exposition format for node_exporter's textfile collector.")
@click.pass_obj
def status(obj: Ctx, fmt):
    """Per-peer lag, parked packets and what they wait for, state, conflicts.

    With --format prometheus, prints the same as syncpack_* metrics (a 'site' label on every
    sample, a 'peer' label on per-peer ones; times as Unix timestamps in seconds).

    \b
    Example:
      syncpack --site boston status
      syncpack --site boston status --format prometheus
    """
    if obj.json and fmt not in (None, "json"):
        raise click.UsageError(f"--json asks for JSON; drop it to get --format {fmt}")
    if fmt == "json":
        obj.json = True     # errors too come as the JSON document, as with --json
    s = obj.open()
    doc = inspection.status(s)
    if fmt == "prometheus":
        if not obj.quiet:
            _out(metrics.render(doc).removesuffix("\n"))
        return
    lines = [f"site {doc['site']} ({doc['state']}), family {printable(doc['family'])}, "
             f"{doc['changelog_ops']} changelog ops, {doc['conflicts']} conflict(s)"]
    for r in doc["retired"]:
        by = ", ".join(map(printable, r["by"]))
        if "name_clash" in r:
            who = "this site" if r["site"] == doc["site"] else printable(r["site"])
            keeper = printable(r["name_clash"])
            writers = ", ".join(map(printable, r["name_clash_written_by"]))
            lines.append(f"retired: {who}: {keeper} (its entry written by {writers}) has its "
                         f"name but for case and keeps it; its packets are refused. Add it "
                         f"again under another name, or retire {keeper} to give the name back")
        elif r["site"] == doc["site"]:
            lines.append(f"retired: this site, by a write of {by}; members that know refuse "
                         f"its packets. If that was not meant, run 'syncpack rmreplica "
                         f"{printable(r['site'])} --undo' at another member")
        else:
            lines.append(f"retired: {printable(r['site'])}, by a write of {by}; its packets "
                         f"are refused (undo: 'syncpack rmreplica {printable(r['site'])} "
                         f"--undo')")
    if doc["refused_until_ms"] is not None:
        ahead, until = doc["stamps_ahead_ms"], _utc(doc["refused_until_ms"])
        lines.append(f"clock: this site's changes are stamped up to {ahead // 3_600_000} h ahead "
                     f"of its clock, which ran fast when they were written; peers refuse them "
                     f"until {until} (see 'A clock that ran fast' in docs/operations.md)")
    if doc["peers"]:
        lines.append(f"{'peer':20} {'lag ops':>10} {'unacked':>10} {'sent':>6} {'recv':>6}  "
                     f"{'last sent (UTC)':17}  last received (UTC)")
        for p, d in doc["peers"].items():
            lines.append(f"{printable(p):20} {d['lag_ops']:>10} {d['unacknowledged_ops']:>10} "
                         f"{d['packets_sent']:>6} {d['packets_received']:>6}  "
                         f"{_utc(d['last_sent_ms']):17}  {_utc(d['last_received_ms'])}")
    for p in doc["parked"]:
        lines.append(f"parked: packet {p['seq']}.{p['part']} from {printable(p['from'])} "
                     f"waits for {printable(sync.waiting_text(p))}")
    for t in doc["incomplete_transactions"]:
        lines.append(f"incomplete: a transaction of {printable(t['origin'])} from epoch "
                     f"{t['epochs'][0]}, {t['parts']} part(s) held up to epoch {t['epochs'][1]}; "
                     f"applied when its last part arrives")
    rec = doc["recovery"]
    if rec["state"] == "recovering":
        lines.append(f"recovering ({printable(rec['reason'])}): holds epoch {rec['own_epoch']} of "
                     f"its own history, peers reported {rec['needed_epoch']}; local writes wait")
        if rec.get("claims_dismissed"):
            lines.append("claims not believed: " + ", ".join(map(printable,
                                                                 rec["claims_dismissed"])))
        if rec.get("next_step"):
            lines.append(f"next: {printable(rec['next_step'])}")
    for f in doc["forks"]:
        lines.append(f"fork ({f['state']}): {printable(f['origin'])} signed two histories of its "
                     f"epoch {f['epoch']}: blocks " + " and ".join(
                         f"{b['epochs'][0]}..{b['epochs'][1]} #{b['hash'][:12]}"
                         + (" (held here)" if b["held_here"] else "") for b in f["blocks"]))
    if doc.get("attached"):
        lines.append(_attached_text(doc["attached"]))
    obj.emit(doc, "\n".join(lines))


def _utc(ms: int | None) -> str:
    if not ms:
        return "never"
    return datetime.fromtimestamp(ms / 1000, timezone.utc).strftime("%Y-%m-%d %H:%MZ")


# --- conflicts and policies -------------------------------------------------------------------

class _ConflictsGroup(Group):
    """``conflicts [COLLECTION]`` lists; ``conflicts resolve ...`` resolves.  Click cannot mix
    an optional argument with subcommands, so the collection is taken off the arguments here."""

    def parse_args(self, ctx, args):
        if args and not args[0].startswith("-") and args[0] not in self.commands:
            ctx.meta["conflicts_collection"] = TEXT.convert(args[0], None, ctx)
            args = args[1:]
        return super().parse_args(ctx, args)

    def format_usage(self, ctx, formatter):
        formatter.write_usage(ctx.command_path, "[COLLECTION] | resolve COLLECTION KEY "
                                                "(--pick VERSION|SITE [--field FIELD=SITE...] "
                                                "| --field FIELD=SITE... | --value JSON)")


@cli.group(cls=_ConflictsGroup, invoke_without_command=True)
@click.pass_context
def conflicts(ctx):
    """List keys with more than one surviving version (writes that did not see each other),
    and records of an attached table that its schema refused (a UNIQUE, CHECK, NOT NULL or
    FOREIGN KEY clash, named; listed even with one version until resolved, or until a later
    write removes the clash).  '*' marks the visible version; 'resolve' picks one.

    \b
    Example:
      syncpack conflicts parts
      syncpack conflicts resolve parts p-100 --pick 1763822000000.0@boston#0
    """
    if ctx.invoked_subcommand is not None:
        return
    obj: Ctx = ctx.obj
    collection = ctx.meta.get("conflicts_collection")
    s = obj.open()
    found = conflicts_mod.list_conflicts(s, collection)
    lines = []
    for c in found:
        lines.append(f"{printable(c['collection'])}/{printable(c['key'])} ({c['policy']}):"
                     + (f" refused by the local schema: {c['constraint']}"
                        if c.get("constraint") else ""))
        for v in c["versions"]:
            shown = "<deleted>" if v["deleted"] else _shown(v["value"])
            lines.append(f"  {'*' if v['winner'] else ' '} {v['version']}  {shown}")
        if c["policy"] == "merge" and c["visible"] is not None:
            lines.append(f"  = merged  {_shown(c['visible'])}")
        for f in c["fields"]:
            lines.append(f"  field {printable(f['field'])}:")
            for x in f["values"]:
                shown = "<absent>" if x["absent"] else _shown(x["value"])
                lines.append(f"    {'*' if x['winner'] else ' '} {x['site']}  {shown}")
    obj.emit({"conflicts": found}, "\n".join(lines))
    if not obj.json:
        obj.say(f"{len(found)} key(s) in conflict" + ("; * marks the visible version" if found
                                                       else ""))


@conflicts.command("resolve")
@click.argument("collection", type=TEXT)
@click.argument("key", type=TEXT)
@click.option("--pick", "pick_version", metavar="VERSION|SITE",
              help="Keep this surviving version, or this site's side of every field in "
                   "conflict.")
@click.option("--field", "field_picks", metavar="FIELD=SITE", multiple=True,
              help="Take FIELD from SITE's value (repeatable).")
@click.option("--value", "value", metavar="JSON", help="Write this value instead.")
@click.pass_obj
def conflicts_resolve(obj: Ctx, collection, key, pick_version, field_picks, value):
    """Write a new version that supersedes every surviving version of KEY.

    \b
    Example:
      syncpack conflicts resolve parts p-100 --value '{"qty": 12}'
      syncpack conflicts resolve parts p-100 --pick boston
      syncpack conflicts resolve parts p-100 --field qty=boston --field bin=chicago
    """
    if value is not None and (pick_version is not None or field_picks) or \
            value is None and pick_version is None and not field_picks:
        raise click.UsageError("give --value JSON, or --pick VERSION|SITE and/or "
                               "--field FIELD=SITE")
    s = obj.open()
    v = _json_value(value) if value is not None else None
    doc = conflicts_mod.resolve(s, collection, key, pick_version, v, value is not None,
                                field_picks)
    warning = doc.pop("warning")
    obj.emit(doc)
    obj.say(f"resolved {collection}/{key}: superseded {doc['superseded']} version(s)")
    _table_warning(obj, warning)


@cli.group(cls=Group)
def collection():
    """Create collections with a conflict policy, and list them.

    \b
    Example:
      syncpack collection create parts --policy priority
      syncpack collection ls
    """


@collection.command("create")
@click.argument("name", type=TEXT)
@click.option("--policy", type=click.Choice(["lww", "priority", "merge"]), required=True,
              help="lww: greatest CSN wins; priority: the higher-priority site wins; merge: "
                   "per field of JSON objects, same field by priority then CSN.")
@click.pass_obj
def collection_create(obj: Ctx, name, policy):
    """Create collection NAME with a conflict policy (replicated to every site).

    \b
    Example:
      syncpack collection create parts --policy priority
    """
    s = obj.open()
    doc = conflicts_mod.create_collection(s, name, policy)
    obj.emit(doc, f"collection {name} uses policy {policy}")


@collection.command("ls")
@click.pass_obj
def collection_ls(obj: Ctx):
    """List collections and their conflict policies.

    \b
    Example:
      syncpack collection ls
    """
    s = obj.open()
    cols = conflicts_mod.list_collections(s)
    obj.emit({"collections": cols},
             "\n".join(f"{printable(c['collection'])}\t{c['policy']}" for c in cols))


@cli.command()
@click.argument("member", type=MEMBER_NAME)
@click.argument("priority", type=PRIORITY)
@click.pass_obj
def priority(obj: Ctx, member, priority):
    """Set a member's priority for the 'priority' policy (replicated to every site).

    A negative PRIORITY goes after '--', or it reads as an option.

    \b
    Examples:
      syncpack priority boston_hub 10
      syncpack priority field_station -- -5
    """
    s = obj.open()
    doc = conflicts_mod.set_priority(s, member, priority)
    obj.emit(doc, f"{member} now has priority {priority}")


# --- recovery and maintenance -----------------------------------------------------------------

@cli.command()
@click.option("--finish", is_flag=True, help="Leave the recovering state now (override; only "
              "when a peer that holds this site's ops is gone for good).")
@click.pass_obj
def restore(obj: Ctx, finish):
    """Declare that this site directory was restored from a backup.

    The site refuses local writes until its own ops have come back from every peer (export
    to them, import what they send); epochs are never reused.

    \b
    Example:
      syncpack --site boston restore
      syncpack --site boston export --all --out /media/usb
    """
    s = obj.open()
    doc = recovery.restore(s, finish)
    if doc["state"] == "recovering":
        human = ("site is recovering: local writes are refused until every peer has sent back "
                 "this site's own ops; export to all peers and import their packets")
    else:
        human = "site is in normal state"
    obj.emit(doc, human)


@cli.command()
@click.option("--dry-run", is_flag=True, help="Say what would be removed; change nothing.")
@click.option("--min-age", "min_age", default="0", metavar="AGE",
              help="Keep ops younger than this (s, or with m/h/d), acknowledged or not.")
@click.pass_obj
def scrub(obj: Ctx, dry_run, min_age):
    """Trim changelog ops (and tombstones) every current member has acknowledged.

    Never trims on estimates of what was sent: only on what members reported.

    \b
    Example:
      syncpack --site boston scrub --dry-run
      syncpack --site boston scrub --min-age 7d
    """
    from syncpack.batch import parse_duration_ms     # (what batch's min_age is read by)
    try:
        min_age_ms = parse_duration_ms(min_age)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--min-age")
    s = obj.open()
    obj.on_interrupt_of_one_commit(
        s, "the trim had committed before the interrupt and is kept ('syncpack status' "
           "shows the changelog)",
        "nothing was trimmed: the scrub's one transaction was rolled back")
    with obj.progress("scrub") as tick:
        doc = recovery.scrub(s, dry_run, min_age_ms, progress=tick)
    verb = "would remove" if dry_run else "removed"
    with _no_interrupt():
        obj.emit(doc, f"{verb} {doc['ops_removed']} changelog op(s) and "
                      f"{doc['tombstones_removed']} tombstone(s); floors: "
                      + (", ".join(f"{o}={e}" for o, e in doc["floors"].items())
                         or "unchanged"))


@cli.command()
@click.option("--to", "peer", type=MEMBER_NAME, required=True, metavar="PEER",
              help="Member to re-seed.")
@click.option("--out", required=True, type=_Path(file_okay=False),
              help="Directory (e.g. a mounted USB stick) to write the snapshot packet(s) into.")
@click.option("--max-size", callback=_size, help="Largest packet, bytes or with K/M/G/T "
              "(default just under 4G, so packets fit FAT32).")
@click.option("--encrypt", is_flag=True, help="Seal the snapshot to the peer's X25519 key.")
@_create_out_option
@click.pass_obj
def resync(obj: Ctx, peer, out, max_size, encrypt, create_out):
    """Write a snapshot packet that re-seeds PEER (when it needs ops we have trimmed).

    Importing it at PEER keeps and replays PEER's own not-yet-acknowledged local ops.

    \b
    Example:
      syncpack --site boston resync --to bangalore --out /media/usb
    """
    s = obj.open()
    obj.outbox(out, create_out)
    obj.on_interrupt("no snapshot was recorded as sent (partial files were removed)",
                     "run the same resync again")
    with obj.progress("snapshot", "records") as tick:
        parts = replica.resync_export(s, peer, out, max_size, progress=tick, encrypt=encrypt)
    obj.emit({"packets": [{"path": str(p.path), "to": peer, "records": p.header.count,
                           "bytes": p.size, "part": p.header.part} for p in parts]},
             "\n".join(str(p.path) for p in parts))
    _warn_stopped(obj, s, "the snapshot")


@cli.command()
@click.argument("name", type=MEMBER_NAME)
@click.option("--undo", is_flag=True,
              help="Reinstate NAME instead: a retirement made by mistake, or written by a "
                   "member that lied; its packets are accepted again.")
@click.pass_obj
def rmreplica(obj: Ctx, name, undo):
    """Retire member NAME: its packets are refused and trimming stops waiting for it.

    A retirement is a replicated write like any other; '--undo' is another, which
    reinstates the member wherever it arrives.  'status' lists retired members and who
    retired each.

    \b
    Example:
      syncpack --site boston rmreplica bangalore
      syncpack --site boston rmreplica bangalore --undo
    """
    s = obj.open()
    if undo:
        doc = recovery.reinstate(s, name)
        obj.emit(doc, f"{name} reinstated in family {s.family_name!r}")
        return
    doc = recovery.rmreplica(s, name)
    obj.emit(doc, f"{name} retired from family {s.family_name!r}")


# --- scheduled rounds -------------------------------------------------------------------------

@cli.command()
@click.argument("config", metavar="CONFIG.toml", type=WHERE)
@click.pass_obj
def batch(obj: Ctx, config):
    """Run one scheduled round at one site: the imports, exports and scrub named in CONFIG.toml.

    Imports first (optionally deleting the packet files that were applied), then exports, then
    scrub; the site comes from the file, not from --site.  Two rounds at a site never overlap.
    Exit 0 when all went well, 1 when an action failed or a packet was rejected; with -q a
    good round prints nothing (for cron).  The file format is in docs/operations.md ("Batch
    rounds"); metrics = PATH in it writes Prometheus metrics after every round.

    \b
    Example:
      syncpack -q batch /etc/syncpack/boston_hub.toml

    \b
    where /etc/syncpack/boston_hub.toml holds:
      site = "/srv/syncpack/boston_hub"
      [[import]]
      path = "/mnt/media/boston_hub"
      remove_after_import = true
      [[export]]
      out = "/mnt/media"
      to = "all"
    """
    told: dict = {}
    obj.on_interrupt(lambda: ("actions that finished before it were kept (see the batch log); "
                              + told.get("kept", "the one in progress was rolled back"),
                              "the next round carries on (packets applied are skipped as "
                              "duplicates)"))
    with obj.progress("batch") as tick:
        from syncpack import batch as batch_mod     # only here: every other command starts faster
        doc = batch_mod.run_batch(config, progress=tick, interrupted=told,
                                  when_done=_no_interrupt)
    with _no_interrupt():       # the round has ended (its log says so): report it whole
        if obj.json:
            obj.emit(doc)
        elif not obj.quiet:
            obj.emit(doc, batch_mod.format_summary(doc))
        for r in doc["imported"]["rejected"]:
            echo_error(f"{r['path']}: {r['error']}", r.get("hint"))
        for e in doc["errors"]:
            echo_error(f"{e['action']} {e['target']}: {e['error']}", e["hint"])
    sys.exit(doc["exit_code"])


@cli.command("require-sealing")
@click.argument("setting", type=click.Choice(["on", "off"]))
@click.pass_obj
def require_sealing(obj: Ctx, setting):
    """Family policy: when on, every site seals its packets and refuses unsealed ones.

    The setting is replicated like any change, so it takes hold at each site as the packet
    carrying it arrives.

    \b
    Example:
      syncpack --site boston require-sealing on
    """
    s = obj.open()
    doc = conflicts_mod.set_family_setting(s, "require_sealed", setting == "on")
    obj.emit(doc, f"family {s.family_name!r}: sealed packets "
                  f"{'required' if setting == 'on' else 'optional'}")


@cli.group("log", cls=Group)
def log_group():
    """Keep the changelog as Parquet segments for 'export --engine spark' (formats/LOG.md).

    \b
    Example:
      syncpack --site boston log export /data/boston-log
      syncpack --site boston export --all --out /media/usb --engine spark --log /data/boston-log
    """


@log_group.command("export")
@click.argument("directory", metavar="[DIR]", required=False, type=WHERE)
@click.pass_obj
def log_export(obj: Ctx, directory):
    """Append to the Parquet log at DIR (default SITE/log) the ops it does not hold yet.

    \b
    Example:
      syncpack --site boston log export /data/boston-log
    """
    from syncpack.engine import parquet_log
    s = obj.open()
    obj.on_interrupt("the log was not extended (segments written so far are removed by the "
                     "next 'log export')", "run it again")
    with obj.progress("log") as tick:
        doc = parquet_log.log_export(s, directory, progress=tick)
    obj.emit(doc, "\n".join(f"{o}\tepochs {lo + 1}-{hi}" for o, (lo, hi) in
                            doc["origins"].items()))
    if not obj.json:
        obj.say(f"log {doc['log']}: wrote {doc['ops_written']} op(s) in "
                f"{doc['segments_written']} segment(s)")


# --- attached application databases (docs/attach.md) -------------------------------------------

def _local_json(f):
    return click.option("--json", "as_json", is_flag=True,
                        help="Print one JSON document on stdout (as the global --json).")(f)


@cli.command("attach")
@click.argument("database", type=_Path())
@click.option("--table", "tables", type=TEXT, multiple=True, metavar="T",
              help="Table to replicate (repeat); it needs a declared PRIMARY KEY.")
@click.option("--all-tables", is_flag=True, help="Replicate every ordinary table of DATABASE "
              "(virtual tables, such as a full-text index, and their own tables left out).")
@click.option("--refresh", is_flag=True,
              help="Accept the attached tables' changed definitions (all, or --table T).")
@_local_json
@click.pass_obj
def attach_(obj: Ctx, database, tables, all_tables, refresh, as_json):
    """Replicate tables of an application's SQLite database, the application unchanged.

    Rows already in the tables become this site's changes; from now on every committed
    INSERT, UPDATE and DELETE of any program is captured, and records from peers are written
    into the tables.  Applications should set a busy timeout (docs/attach.md).

    \b
    Example:
      syncpack --site boston attach /srv/shop/shop.db --table orders --table customers
      syncpack --site boston attach /srv/shop/shop.db --refresh --table orders
    """
    obj.json = obj.json or as_json
    if refresh and all_tables:
        raise click.UsageError("use either --refresh [--table T...] or --all-tables")
    if not refresh and not tables and not all_tables:
        raise click.UsageError("name the tables with --table T (repeatable) or use --all-tables")
    if tables and all_tables:
        raise click.UsageError("use either --table T... or --all-tables")
    s = obj.open()
    if refresh:
        doc = attach_core.refresh(s, database, list(tables) or None)
        obj.emit(doc, "\n".join(f"refreshed {printable(t['table'])} ({len(t['columns'])} columns, "
                                f"{t['changes']} change(s) captured)" for t in doc["refreshed"]))
        return
    doc = attach_core.attach(s, database, list(tables), all_tables)
    for w in doc["warnings"]:
        obj.warn(w)
    obj.emit(doc,
             "\n".join(f"attached {printable(t['table'])} ({t['rows']} rows, key "
                       f"{', '.join(map(printable, t['primary_key']))})" for t in doc["tables"]))


@cli.command("detach")
@click.argument("database", type=_Path())
@click.option("--table", "tables", type=TEXT, multiple=True, metavar="T",
              help="Table to stop replicating (repeat; default: all).")
@_local_json
@click.pass_obj
def detach_(obj: Ctx, database, tables, as_json):
    """Stop replicating tables of the attached database (their rows stay in place).

    \b
    Example:
      syncpack --site boston detach /srv/shop/shop.db --table orders
    """
    obj.json = obj.json or as_json
    s = obj.open()
    doc = attach_core.detach(s, database, list(tables) or None)
    obj.emit(doc, "\n".join(f"detached {printable(t)}" for t in doc["detached"]))


@cli.command("attached")
@_local_json
@click.pass_obj
def attached_(obj: Ctx, as_json):
    """Show the attached database and, per table, rows and changes on their way.

    'pending' counts the application's changes not yet captured into the changelog.

    \b
    Example:
      syncpack --site boston attached
    """
    obj.json = obj.json or as_json
    s = obj.open()
    doc = attach_core.report(s)
    obj.emit(doc, _attached_text(doc))


def _attached_text(doc: dict) -> str:
    family = (["replicated in the family, not attached here: "
               + ", ".join(map(printable, doc["available"]))] if doc.get("available") else [])
    if not doc.get("database"):
        return "\n".join(["nothing attached", *family])
    lines = [f"database {doc['database']}",
             *([f"  CANNOT BE READ: {printable(doc['problem'])}"] if doc.get("problem") else []),
             *([f"  FILE BEHIND: {printable(doc['file_behind'])}"] if doc.get("file_behind")
               else []),
             *([f"  STORE BEHIND: {doc['store_behind']}"] if doc.get("store_behind") else []),
             *([f"  BUSY: {printable(doc['busy'])}; figures unknown ('?') until it is free"]
               if doc.get("busy") else []),
             *([f"  FAILING since {_utc(doc['failing']['since_ms'])}: "
                f"{printable(doc['failing']['error'])}"
                + (f" (hint: {printable(doc['failing']['hint'])})" if doc['failing']['hint']
                   else "")] if doc.get("failing") else []),
             f"{'table':20} {'rows':>10} {'pending':>8}  {'last capture (UTC)':18}  "
             f"last apply (UTC)"]
    for t in doc["tables"]:
        rows = "?" if t["rows"] is None else t["rows"]
        pending = "?" if t["pending"] is None else t["pending"]
        lines.append(f"{printable(t['table']):20} {rows:>10} {pending:>8}  "
                     f"{_utc(t['last_capture']):18}  {_utc(t['last_apply'])}")
        if t.get("stopped"):
            lines.append(f"  STOPPED: {printable(t['stopped'])}")
        if t.get("waiting"):
            lines.append(f"  {t['waiting']} record(s) wait for a column this table lacks")
        held = (t.get("to_apply") or 0) - (t.get("waiting") or 0)
        if held > 0:
            # 'pending' above counts the application's changes on their way out; these are
            # the family's records on their way in (or refused: 'conflicts' says why)
            lines.append(f"  {held} record(s) not yet written into the table (a clash, or "
                         f"the next capture writes them: see 'syncpack conflicts')")
    return "\n".join(lines + family)


@cli.command("capture")
@_local_json
@click.pass_obj
def capture_(obj: Ctx, as_json):
    """Move the attached application's committed changes into the changelog now.

    It also writes the family's records waiting for the application's tables, and creates
    (from the family's definition) a table another site attached that the application lacks.
    export, import, batch, status, mkreplica export and resync do this by themselves first.
    Exit 1 when a schema change stopped the capture of a table (see 'syncpack attached'),
    when the attached file cannot be used (gone, locked too long), or when nothing is
    attached.

    \b
    Example:
      syncpack --site boston capture
    """
    obj.json = obj.json or as_json
    s = obj.open()
    doc = attach_core.capture(s)
    for why in doc.get("refused", []):
        obj.warn(why)
    obj.emit(doc, "\n".join(
        [printable(attach_core.created_text(c)) for c in doc.get("created", [])]
        + [f"captured {doc['captured']} change(s), applied {doc['applied']} record(s)"
           + (f", {doc['clashes']} refused by the schema (see 'syncpack conflicts')"
              if doc["clashes"] else "")]))


@cli.command()
@click.pass_obj
def keyinfo(obj: Ctx):
    """Show this site's identity and key fingerprints (to confirm a snapshot's sender).

    \b
    Example:
      syncpack --site boston keyinfo
    """
    s = obj.open(require_joined=False)
    ident = keys.read_own_public(s.path)
    doc = {"site": s.name, "site_id": s.site_id.hex(), "family": s.family_name or None,
           "family_id": s.family_id.hex() if s.family_id else None,
           "signing_key_fingerprint": keys.fingerprint(ident.ed25519),
           "public_key": str(keys.public_path(s.path))}
    obj.emit(doc, "\n".join(f"{k}: {'(not joined yet)' if v is None else v}"
                            for k, v in doc.items()))


_STANDALONE = False     # set by main(): the syncpack program, not a caller embedding the CLI


def _terminated(_signum, _frame) -> None:
    raise KeyboardInterrupt     # as Ctrl-C: the same truthful report of what was kept


def main() -> None:
    global _STANDALONE
    _STANDALONE = True
    # 'systemctl stop', a shutdown, 'kill': stopped as by Ctrl-C, so a batch round logs its
    # end and rewrites its metrics, and every command says what it kept
    signal.signal(signal.SIGTERM, _terminated)
    try:
        cli(prog_name="syncpack")
    except SystemExit as e:
        if e.code != 130:
            raise
        # Interrupted, told, and every site closed (click's context is gone).  Python can
        # still count the interrupt as unhandled though it was caught here (at some points
        # of its own machinery), and its orderly exit then ends the process by SIGINT: exit
        # -2 where 130 was told, one run in a few dozen.
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(130)


if __name__ == "__main__":
    main()
