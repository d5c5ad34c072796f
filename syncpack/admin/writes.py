"""One record written from the command line (``put``, ``delete``), and, when its collection
is an attached table, into the application's table at once.

Kept apart from :mod:`syncpack.admin.inspection`: a ``put`` starts without the packet code,
cryptography or zstd (tests/test_speed.py), and the attach code is loaded only for a
collection that is attached."""

from __future__ import annotations

from typing import Any, Iterable

from syncpack.errors import AttachError, LockedError
from syncpack.lazy import OnFirstUse
from syncpack.site import TABLES, Site, check_collection, check_key
from syncpack.store import attached

attach_core = OnFirstUse("syncpack.attach.core")


def put(site: Site, collection: str, key: str, value: Any) -> str | None:
    """One record in one transaction, into an attached application's table as well.
    Returns a warning when such a table refused it (it is then listed by conflicts) or
    could not be written now."""
    check_collection(collection)    # before a name that cannot be text reaches SQL
    check_key(key)
    if attached.family_table(site.conn, TABLES, collection):
        attach_core.check_values(site, collection, [(key, value)])
    failed = capture_first(site, [collection])
    with site.transaction() as tx:
        tx.put(collection, key, value)
    return into_attached(site, [collection], key, failed)


def delete(site: Site, collection: str, key: str) -> str | None:
    """:func:`put` of a delete."""
    failed = capture_first(site, [collection])
    with site.transaction() as tx:
        tx.delete(collection, key)
    return into_attached(site, [collection], key, failed)


def capture_first(site: Site, collections: Iterable[str] | None = None
                  ) -> AttachError | None:
    """Before an administrator's write to an attached table (one of ``collections``; None:
    any), the application's committed changes are captured: taken after it, an earlier
    change of the application's to the same row became the newer op, a conflict of the site
    with itself that the application's old value won.  When the file cannot be read (or the
    application held its lock through the wait), the write goes on and the error is
    returned, for :func:`into_attached` to tell without waiting again; when another command
    holds the site, that one captures."""
    watched = attached.watched(site.conn)
    if not watched or collections is not None and watched.isdisjoint(collections):
        return None
    failed = None
    try:
        attach_core.sync_app(site, wait=True, lock_wait=False)
    except LockedError:
        return None
    except AttachError as e:
        failed = e      # (the capture may have committed before the file failed)
    # an interrupt of the write compares the store with its state now (cli.py)
    site.marker_before_work = site.commit_marker()
    return failed


def into_attached(site: Site, collections: Iterable[str], key: str | None = None,
                  failed: AttachError | None = None) -> str | None:
    """Write what is pending for the application's tables if one of ``collections`` is
    attached (an administrator's write shows in the table at once, not only at the next
    capture; if another command holds the site, that one does it).  Returns a warning when
    the table of the first collection refused ``key``'s record, or the application's file
    could not be written now (the records wait in the store either way; ``failed``: it
    could not be read a moment ago, by :func:`capture_first`, and is not waited for again)."""
    collections = list(collections)
    if attached.watched(site.conn).isdisjoint(collections):
        return None
    if failed is None:
        try:
            attach_core.sync_app(site, wait=True, lock_wait=False)
        except LockedError:
            return None     # the command holding the site writes it
        except AttachError as e:
            failed = e
    if failed is not None:
        return (f"{failed.message}; the record is in the store, and goes into the "
                f"application's table at the next capture that can write it")
    stopped = attached.stopped(site.conn).get(collections[0])
    if stopped is not None:
        return (f"{stopped}, so nothing is written into that table now; the record is in the "
                f"store, and goes into the table once its capture resumes ('syncpack "
                f"attached' says what to do)")
    why = attach_core.clash_of(site, collections[0], key) if key is not None else None
    return (f"the attached table refused it: {why} (listed by 'syncpack conflicts' until a "
            f"write or 'conflicts resolve' settles it)") if why else None
