"""syncpack: offline, packet-based replication between disconnected sites.

Applications open a site and write in transactions::

    import syncpack
    with syncpack.open_site("/srv/boston") as site:
        with site.transaction() as tx:
            tx.put("parts", "p-100", {"name": "bolt", "qty": 40})
        print(site.get("parts", "p-100"))

Every failure a caller can cause raises a :class:`SyncpackError` subclass with a message and a
hint.
"""

from typing import TYPE_CHECKING

from .version import VERSION

if TYPE_CHECKING:   # what type checkers see; at run time the names load on first use
    from .errors import InvalidValueError, SiteClosedError, SyncpackError
    from .site import Site, Transaction, open_site

__all__ = ["Site", "Transaction", "open_site", "SyncpackError", "InvalidValueError",
           "SiteClosedError"]
__version__ = VERSION

# Importing the package stays cheap (no store, no SQLite): the ``syncpack`` command's entry
# point (syncpack.console) imports the package before it can catch a Ctrl-C, so everything
# heavy must load after that.
_HOME = {"Site": "site", "Transaction": "site", "open_site": "site",
         "SyncpackError": "errors", "InvalidValueError": "errors", "SiteClosedError": "errors"}


def __getattr__(name: str):
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'syncpack' has no attribute {name!r}")
    import importlib
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value
