"""How a failure is told to the user: one translation for the command line and batch rounds.

:func:`error_outcome` turns an expected exception into (message, hint, exit code); anything
else is a bug or an interrupt, which each caller reports in its own way."""

from __future__ import annotations

from syncpack.errors import SyncpackError
from syncpack.store.db import DatabaseError, access_problem

STORE_HINT = "check the disk and run 'syncpack fsck'; restore from a backup if it fails"


def error_outcome(e: BaseException) -> tuple[str, str | None, int] | None:
    """(message, hint, exit code) for a library error, a damaged store or an OS error;
    None for anything else."""
    if isinstance(e, SyncpackError):
        return e.message, e.hint, e.exit_code
    if isinstance(e, DatabaseError):
        access = access_problem(e)
        if access is not None:
            return f"{access[0]} ({e})", access[1], 1
        return f"the site store cannot be used: {e}", STORE_HINT, 1
    if isinstance(e, OSError):
        return f"{e.strerror or e}" + (f": {e.filename}" if e.filename else ""), None, 1
    return None
