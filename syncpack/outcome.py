"""How a failure is told to the user: one translation for the command line and batch rounds.

:func:`error_outcome` turns an expected exception into (message, hint, exit code); anything
else is a bug or an interrupt, which each caller reports in its own way."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from syncpack.errors import ACCESS_HINT, SyncpackError
from syncpack.fileops import try_lock
from syncpack.site import LOCK_FILE
from syncpack.store.db import BusyErrors, DatabaseError, access_problem

STORE_HINT = "check the disk and run 'syncpack fsck'; restore from a backup if it fails"


def error_outcome(e: BaseException, site_dir: str | os.PathLike | None = None
                  ) -> tuple[str, str | None, int] | None:
    """(message, hint, exit code) for a library error, a damaged store or an OS error;
    None for anything else.  ``site_dir``: the site the command worked on, if known."""
    if isinstance(e, SyncpackError):
        return e.message, e.hint, e.exit_code
    if isinstance(e, BusyErrors) and site_dir is not None and _site_lock_held(site_dir):
        return (f"another syncpack command at this site (an import or a capture, say) held "
                f"its store longer than this command waits ({e})",
                "run it again when that command ends ('syncpack status' answers meanwhile); "
                "a large import holds the store about as long as its rows take to write", 1)
    if isinstance(e, DatabaseError):
        access = access_problem(e)
        if access is not None:
            return f"{access[0]} ({e})", access[1], 1
        return f"the site store cannot be used: {e}", STORE_HINT, 1
    if isinstance(e, OSError):
        return (f"{e.strerror or e}" + (f": {e.filename}" if e.filename else ""),
                _OS_HINTS.get(e.errno), 1)
    return None


# The operating system's refusals, each with what to do about it (what failed changed
# nothing: every command writes its files whole or not at all).
_OS_HINTS = {
    errno.EACCES: ACCESS_HINT,
    errno.EPERM: ACCESS_HINT,
    errno.EROFS: "the file system is mounted read-only; remount it writable, or use another "
                 "place",
    errno.ENOSPC: "free space on that disk (or use another), then run the command again",
    errno.EDQUOT: "this account's disk quota is used up; free space, then run the command again",
    errno.EEXIST: "name a path that does not exist yet, or move the one there away",
    errno.ENOTDIR: "a part of that path is a file, not a directory; check the path",
    errno.EISDIR: "that path is a directory; name a file",
    errno.ENAMETOOLONG: "use a shorter path (or shorter names along it)",
    errno.ENOENT: "check the path (does its directory exist?)",
}


def _site_lock_held(site_dir: str | os.PathLike) -> bool:
    """Whether another process holds the site's lock (the packet work of a syncpack command:
    an import, an export, a capture)."""
    path = Path(site_dir) / LOCK_FILE
    if not path.is_file():
        return False
    try:
        fd = try_lock(path)
    except OSError:
        return False
    if fd is None:
        return True
    os.close(fd)
    return False
