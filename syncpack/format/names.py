"""Site names: the one rule, applied wherever a name enters (command line, public key files,
roster entries arriving in packets and snapshots) and again where one becomes a path."""

from __future__ import annotations

import re

from syncpack.errors import SyncpackError, UsageError

MAX_SITE_NAME = 64
# A site name becomes a directory on every medium (OUT/<to>/<from>/), so it must be one safe
# path component on every filesystem a stick may carry: no separators, no '.' or '..', no
# leading dot or dash, nothing a shell or FAT32 treats specially.
_SITE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


def check_site_name(name: object, error: type[SyncpackError] = UsageError) -> str:
    """Refuse any site name that is not a safe single path component (raises ``error``)."""
    if not isinstance(name, str) or not _SITE_NAME.fullmatch(name) \
            or len(name) > MAX_SITE_NAME or name.endswith("."):
        shown = repr(name)[:80]
        raise error(f"invalid site name {shown}: use 1 to {MAX_SITE_NAME} letters, digits, "
                    f"'_', '-' or '.', starting with a letter, digit or '_'",
                    hint="site names become directory names on every medium")
    return name


# Names Windows keeps for devices, whatever their case or extension: a directory so named on a
# stick (FAT32, exFAT, NTFS) cannot be opened there, so packets for that site would be stuck on
# any medium a Windows machine carries or reads.
_DEVICE_NAMES = frozenset(["CON", "PRN", "AUX", "NUL", *(f"COM{i}" for i in range(1, 10)),
                           *(f"LPT{i}" for i in range(1, 10))])


def check_new_site_name(name: object, error: type[SyncpackError] = UsageError) -> str:
    """:func:`check_site_name` for a name a site takes now (init, keygen, mkreplica), which
    also refuses a device name of Windows.  Names already in a family are not refused again:
    their packets must still be read."""
    check_site_name(name, error)
    assert isinstance(name, str)
    if name.split(".")[0].upper() in _DEVICE_NAMES:
        raise error(f"invalid site name {name!r}: Windows keeps it for a device, and a "
                    f"directory of that name on a medium cannot be opened there",
                    hint="site names become directory names on every medium; choose "
                         "another (e.g. {0}-site)".format(name.split(".")[0].lower()))
    return name

