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

from .errors import InvalidValueError, SiteClosedError, SyncpackError
from .site import Site, Transaction, open_site
from .version import VERSION

__all__ = ["Site", "Transaction", "open_site", "SyncpackError", "InvalidValueError",
           "SiteClosedError"]
__version__ = VERSION
