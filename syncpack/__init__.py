"""syncpack: offline, packet-based replication between disconnected sites."""

from .errors import SyncpackError
from .site import Site, Transaction, open_site

__all__ = ["Site", "Transaction", "open_site", "SyncpackError"]
__version__ = "0.1.0"
