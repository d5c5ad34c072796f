"""Durable file writes and advisory locks, written once.

A file that must never be seen half-written (a packet, a parked copy, a log manifest, a
metrics file) is written under a hidden temporary name in its directory, fsynced, renamed over
its final name, and the directory fsynced so the rename itself survives a crash.  A lock is
``flock(LOCK_EX | LOCK_NB)`` on a file: the kernel drops it when the process dies, so a crash
never leaves a stale lock.  Errors are the OS's; callers turn them into their own.
"""

from __future__ import annotations

import fcntl
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Callable, Iterator


def fsync_dir(directory: str | os.PathLike) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def temp_name(final: Path) -> Path:
    """A hidden temporary name next to ``final`` (readers skip dot-files and ``*.tmp``)."""
    return final.parent / f".{final.name}.{os.urandom(4).hex()}.tmp"


def commit_temp(f: BinaryIO, tmp: str | os.PathLike, final: str | os.PathLike) -> None:
    """Make the open temporary file ``f`` (at ``tmp``) durable under ``final``: fsync, close,
    rename, fsync the directory."""
    f.flush()
    os.fsync(f.fileno())
    f.close()
    os.replace(tmp, final)
    fsync_dir(os.path.dirname(os.path.abspath(final)))


def write_atomic(path: str | os.PathLike, fill: bytes | Callable[[BinaryIO], None],
                 tmp: str | os.PathLike | None = None, mode: int | None = None) -> None:
    """Replace ``path`` with ``fill`` (bytes, or a function writing into the file) so that a
    crash leaves either the old file or the new one.  ``mode`` sets the new file's mode."""
    path = Path(path)
    tmp = Path(tmp) if tmp is not None else temp_name(path)
    try:
        f = open(tmp, "wb")
        try:
            if callable(fill):
                fill(f)
            else:
                f.write(fill)
            if mode is not None:
                os.chmod(tmp, mode)
        except BaseException:
            f.close()
            raise
        commit_temp(f, tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def try_lock(path: str | os.PathLike) -> int | None:
    """An fd holding an exclusive lock on ``path`` (created if missing), or None when another
    process holds it.  Closing the fd releases the lock."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextmanager
def locked(path: str | os.PathLike, busy: Callable[[], Exception], wait_s: float = 0.0,
           waiting: Callable[[], None] | None = None) -> Iterator[None]:
    """Hold the lock on ``path`` for the block; if another process holds it, wait up to
    ``wait_s`` seconds for it (calling ``waiting()`` once as the wait begins), then raise
    ``busy()``."""
    fd = try_lock(path)
    if fd is None and wait_s > 0:
        if waiting is not None:
            waiting()
        deadline = time.monotonic() + wait_s
        while fd is None and time.monotonic() < deadline:
            time.sleep(0.1)
            fd = try_lock(path)
    if fd is None:
        raise busy()
    try:
        yield
    finally:
        os.close(fd)
