"""A child process of ours on the other core, spoken to in msgpack frames over its pipes.

A large capture reads the application's changes in one (attach/reader.py), a large import
writes the application's rows in one (attach/writer.py), and a large load parses its file in
one (admin/loading.py): nearly all of that work holds the GIL, so a thread would only take
turns with the store's; a process runs beside it.  Each frame is a 4-byte big-endian length
and one msgpack object.  Both ends are this package, started from the same files (the request
names the module's file; a child that finds another file answers that it cannot serve, and
the caller does the work itself).
"""

from __future__ import annotations

import os
import queue
import struct
import subprocess
import sys
import threading
from pathlib import Path
from typing import BinaryIO, Callable, Iterator

from syncpack.format import codec
from syncpack.pipeline import read_ahead

_LEN = struct.Struct(">I")
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[1])

# Started as ``python -c``: the package is found where this process found it (and only the
# package: the directory is taken off the path again before anything else is imported).
_MAIN = ("import sys; sys.path.insert(0, {root!r}); import syncpack; sys.path.pop(0); "
         "import importlib; importlib.import_module({module!r}).main()")


class ChildEnded(EOFError):
    """The child's output ended before the frame the caller waited for."""


def write_frame(out: BinaryIO, obj) -> None:
    body = codec.packb(obj)
    out.write(_LEN.pack(len(body)))
    out.write(body)


def read_frame(inp: BinaryIO):
    head = inp.read(_LEN.size)
    if len(head) < _LEN.size:
        raise ChildEnded("the helper process ended early")
    n = _LEN.unpack(head)[0]
    body = inp.read(n)
    if len(body) < n:
        raise ChildEnded("the helper process ended early")
    return codec.unpackb(body)    # our own process's frames


def frames(inp: BinaryIO) -> Iterator:
    while True:
        yield read_frame(inp)


def spawn(module: str) -> subprocess.Popen | None:
    """``<module>.main()`` (a module of this package, named in full) in a new interpreter,
    its stdin and stdout ours; None when no interpreter can be started (the caller then does
    the work itself)."""
    if not sys.executable:
        return None
    try:
        return subprocess.Popen(
            [sys.executable, "-c", _MAIN.format(root=_PACKAGE_ROOT, module=module),
             str(os.getpid())],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    except OSError:
        return None


def start(module: str, request: dict, more_input: bool) -> subprocess.Popen | None:
    """:func:`spawn` of ``module`` given ``request`` (and, unless ``more_input``, nothing
    after it), if it answers that it serves (``{"ok": true}``); None otherwise, the child
    stopped: the caller then does the work itself."""
    return started(module, request, more_input)[0]


def started(module: str, request: dict, more_input: bool
            ) -> tuple[subprocess.Popen | None, dict | None]:
    """:func:`start`, with the child's first answer (None if there was none): a child may
    answer why it does not serve (an error its caller should raise, not work around)."""
    proc = spawn(module)
    if proc is None:
        return None, None
    answer = None
    try:
        write_frame(proc.stdin, request)
        if more_input:
            proc.stdin.flush()
        else:
            proc.stdin.close()
        answer = read_frame(proc.stdout)
        if isinstance(answer, dict) and answer.get("ok") is True:
            return proc, answer
    except (OSError, EOFError, ValueError):
        pass
    except BaseException:       # Ctrl-C while the child starts: it must not outlive us
        stop(proc)
        raise
    stop(proc)
    return None, answer if isinstance(answer, dict) else None


def run(serve: Callable[[BinaryIO, BinaryIO], None]) -> None:
    """A child's main: ``serve(its stdin, its stdout)``; the parent gone is an exit, not a
    traceback."""
    _end_with_parent()
    try:
        serve(sys.stdin.buffer, sys.stdout.buffer)
    except BrokenPipeError:
        sys.exit(1)


def _end_with_parent() -> None:
    """On Linux, have the kernel kill this child when the thread that started it ends (each
    child's work lives within one call of its parent, on one thread): a parent killed by
    ``kill -9`` leaves no child working on, which otherwise would only notice at its next
    write to the closed pipe (a load file of blank lines: many seconds).  Elsewhere, or if
    the call fails, that next write still ends it."""
    if not sys.platform.startswith("linux") or len(sys.argv) < 2:
        return
    try:
        import ctypes
        import signal
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)     # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if str(os.getppid()) != sys.argv[1]:    # the parent was gone before the call took hold
        sys.exit(1)


def stop(proc: subprocess.Popen | None) -> None:
    """Kill ``proc`` if it still runs (an error on our side: whatever it held uncommitted is
    rolled back by SQLite), wait for it and close its pipes."""
    if proc is None:
        return
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    for f in (proc.stdin, proc.stdout):
        try:
            f.close()
        except OSError:     # a request the child never read
            pass


class Sending:
    """A started child that only sends: its frames, read ahead by a thread of their own up to
    ``depth`` (the GIL is free while it waits on the pipe), so the child is never held back
    by a full pipe while this process writes what it sent.  A dict frame is the child's
    error, ``[]`` the end of a run of frames."""

    def __init__(self, proc: subprocess.Popen, depth: int, name: str):
        self.proc: subprocess.Popen | None = proc
        self._frames: Iterator | None = read_ahead(frames(proc.stdout), depth=depth,
                                                   name=name)

    def run(self, error: Callable[[str, str | None], Exception], ended: str) -> Iterator[list]:
        """The frames up to the next ``[]``; a dict frame raises ``error(its text, its
        hint)``, and output that ends first raises ``error(ended, None)``."""
        while True:
            try:
                frame = next(self._frames)
            except (EOFError, StopIteration):
                raise error(ended, None) from None
            if isinstance(frame, dict):
                raise error(str(frame.get("error")), frame.get("hint"))
            if not frame:
                return
            yield frame

    def close(self) -> None:
        """Stop the child if it is still running (an error on our side), and wait for it."""
        p, self.proc = self.proc, None
        if p is not None and p.poll() is None:
            p.kill()        # then the thread reading its pipe sees the end and stops
        if self._frames is not None:
            self._frames.close()
            self._frames = None
        stop(p)


class Outbox:
    """Frames to the child, written by a thread of their own from a queue of ``depth``: this
    process goes on while the child is busy, and the child has work waiting while this process
    is (a pipe holds 64 KiB, less than one batch).  A write that failed (the child is gone) is
    :class:`ChildEnded` at the next :meth:`put` or at :meth:`close`."""

    _END = object()

    def __init__(self, out: BinaryIO, name: str, depth: int):
        self._q: queue.Queue = queue.Queue(maxsize=depth)
        self._failed = False
        self._t = threading.Thread(target=self._run, args=(out,), name=name, daemon=True)
        self._t.start()

    def _run(self, out: BinaryIO) -> None:
        while True:
            obj = self._q.get()
            if obj is self._END:
                return
            if self._failed:
                continue        # drained, so that put never waits on a dead child
            try:
                write_frame(out, obj)
                out.flush()
            except Exception:
                # A frame that could not be written or packed: the child must not wait for
                # it (nor the caller for its answer), so its input ends here.
                self._failed = True
                try:
                    out.close()
                except OSError:
                    pass

    def put(self, obj) -> None:
        if self._failed:
            raise ChildEnded("the helper process ended early")
        self._q.put(obj)

    def close(self) -> None:
        """Wait until every frame is written; :class:`ChildEnded` if one could not be."""
        if self._t.is_alive():
            self._q.put(self._END)
            self._t.join()
        if self._failed:
            raise ChildEnded("the helper process ended early")


class Inbox:
    """The child's frames, read by a thread of their own into a queue without bound, so that
    the child never waits on a full pipe while this process writes to it (each side waiting
    for the other would be a deadlock).  The end of the output is :class:`ChildEnded`."""

    _END = object()

    def __init__(self, inp: BinaryIO, name: str):
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._t = threading.Thread(target=self._run, args=(inp,), name=name, daemon=True)
        self._t.start()

    def _run(self, inp: BinaryIO) -> None:
        try:
            for f in frames(inp):
                self._q.put(f)
        except (EOFError, OSError, ValueError):
            pass
        finally:
            self._q.put(self._END)

    def get(self, wait: bool = True):
        """The next frame; None if ``wait`` is false and none is there yet."""
        try:
            f = self._q.get(block=wait)
        except queue.Empty:
            return None
        if f is self._END:
            self._q.put(f)      # every later call sees the end too
            raise ChildEnded("the helper process ended early")
        return f

    def join(self) -> None:
        self._t.join()
