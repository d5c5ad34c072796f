"""The one error family of syncpack.

Every failure a user can cause is a subclass of :class:`SyncpackError`; the CLI turns it into
``error: <message>`` and ``hint: <hint>`` on stderr and exit code 1.  Anything else reaching the
CLI is a bug and is reported as an internal error (still without a traceback unless ``-v``).
"""

from __future__ import annotations

import os


def arg(value: object) -> str:
    """A path, a name or a location as a hint's command must spell it, so the command pasted
    into a shell runs as shown (a path with a space, a table named "my table")."""
    import shlex    # only when a hint is made: every command imports this module
    return shlex.quote(os.fspath(value) if isinstance(value, os.PathLike) else str(value))


# What to do when this process may not read or write a file: the file is not at fault.
ACCESS_HINT = ("run syncpack as the account that owns the site and its media, or give that "
               "account access")


class SyncpackError(Exception):
    """Base class: a message, an optional hint, a stable exit code."""

    exit_code = 1
    default_hint: str | None = None

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint if hint is not None else self.default_hint

    def __str__(self) -> str:
        return self.message


class UsageError(SyncpackError):
    """Bad arguments that click could not catch (e.g. a malformed JSON value)."""


class SiteError(SyncpackError):
    """The site directory is missing, not a site, corrupt, or from a newer syncpack."""


class NotJoinedError(SiteError):
    default_hint = "import the replica-creation packet with 'syncpack --site DIR mkreplica import PATH'"


class RecordNotFound(SyncpackError):
    pass


class LoadError(SyncpackError):
    """A JSON-lines file was rejected; nothing was written."""


class IntegrityError(SyncpackError):
    """fsck found a violated invariant."""


class RecoveringError(SyncpackError):
    """Local writes are refused while the site waits for its own ops to come back."""


class AlreadyRecoveringError(SyncpackError):
    """'syncpack restore' at a site that is already recovering: a second declaration would
    restart the wait and forget the reports already received."""

    default_hint = ("'syncpack status' shows what it waits for; export to every peer and "
                    "import their packets. 'syncpack restore --finish' ends the wait by hand")


class PacketError(SyncpackError):
    """A packet failed verification.  Subclasses name the check that failed."""

    # (an import applies nothing of a packet it refuses, and says so by refusing it; the
    # hint is also lspacket's, which applies nothing anyway)
    default_hint = "get a fresh copy of the packet from its sender (or have it export again)"


class PacketFormatError(PacketError):
    """Size, magic, framing or encoding is wrong: the file is not a well-formed packet."""

    default_hint = ("the file is damaged (a medium pulled out while writing?) or not a "
                    "packet; get a fresh copy from the sender")


class PacketVersionError(PacketError):
    default_hint = "upgrade syncpack at this site to read packets made by a newer version"


class PacketFeatureError(PacketError):
    default_hint = "upgrade syncpack at this site; the sender used a feature this version lacks"


class PacketFamilyError(PacketError):
    default_hint = "this packet belongs to another family; check which medium you imported"


class PacketRecipientError(PacketError):
    default_hint = "import it at the site it is addressed to"


class PacketSenderError(PacketError):
    default_hint = "the sender is not a current member of this family"


class PacketSignatureError(PacketError):
    default_hint = "the packet was altered or not made by its claimed sender; get a fresh copy"


class PacketBodyError(PacketError):
    """Body hash, decompression, op stream or declared ranges do not match."""

    default_hint = "the packet is damaged or forged; get a fresh copy from the sender"


class PatchError(PacketBodyError):
    """An op sending only the fields it changed (formats/VALUES.md) that cannot be applied:
    malformed, in a collection not under the ``merge`` policy, or over a base that is not a
    record.  Refused whole: nothing of the packet is applied."""


class PatchBaseError(PatchError):
    """An op sending only the fields it changed names a base version this site does not hold
    (and never will: its epoch is already counted here), so the record cannot be rebuilt."""

    default_hint = ("nothing of the packet was applied; this site lacks the version the "
                    "change is based on (seeded from an older snapshot, or the sender is "
                    "forging): ask a peer for a snapshot with 'syncpack resync --to THIS_SITE'")


class PacketSealError(PacketError):
    """A sealed (encrypted) packet cannot be opened here."""

    default_hint = "only the recipient can read a sealed packet; import it at its recipient"


class PacketPolicyError(PacketError):
    default_hint = ("this family requires sealed packets: the sender's next export seals "
                    "them once the rule has reached it (nothing is lost: what this packet held "
                    "is sent again); or export with --encrypt")


class PacketLimitError(PacketError):
    """The packet asks for more memory than we allow an untrusted input."""

    default_hint = ("the packet is damaged or forged: no packet syncpack writes asks for "
                    "that much; get a fresh copy from the sender")


class EpochCollisionError(PacketError):
    default_hint = ("the sender reused an epoch (was it restored from a backup without "
                    "'syncpack restore'?); this site kept its data")


class ForkedMemberError(PacketError):
    """A member signed two histories of one of its epochs (docs/design.md §3.10)."""

    default_hint = ("'syncpack status' shows the evidence; the member heals by itself if it "
                    "was restored from a backup, otherwise retire it with 'syncpack rmreplica'")


class ForkFoundError(EpochCollisionError):
    """This import found a fork: the forked range was not applied, the rest of the packet was."""

    default_hint = ("the evidence is kept and travels to every member; 'syncpack status' shows "
                    "it. The origin heals by itself if it was restored from a backup, otherwise "
                    "retire it with 'syncpack rmreplica'")


class SnapshotForkError(PacketError):
    """A snapshot for a member whose own history forked from the one the sender holds of it
    (restored from a backup, then written to): applied, it would discard those writes."""

    default_hint = ("exchange ordinary packets with the sender instead (export here, import "
                    "there, and back): rounds heal a restored site and keep what it wrote; "
                    "ask for a snapshot again only if 'syncpack status' then names one")


class ClockSkewError(PacketError):
    default_hint = "fix the sender's clock; the packet was not applied"


class ScrubbedError(SyncpackError):
    """A peer needs ops this site has already trimmed from its changelog."""


class ExportError(SyncpackError):
    """Packets could not be written; nothing was recorded as sent."""


class OutboxError(ExportError):
    """The directory packets should go into is missing (and was not to be created) or is not a
    directory: a mistyped or unmounted path never swallows packets."""


class MediumFullError(ExportError):
    default_hint = "free space on the medium, or use a larger one; nothing was sent"


class SparkUnavailableError(ExportError):
    """The Spark engine cannot run here: pyspark or Java is missing, or Spark did not start."""

    default_hint = "install pyspark ('pip install pyspark') and Java 17+, or use --engine local"


class LockedError(SyncpackError):
    default_hint = "wait for the other syncpack command on this site to finish"


class BatchConfigError(SyncpackError):
    """A batch round's TOML configuration is missing, malformed or names a bad value."""

    default_hint = ("fix the file and run the round again: docs/operations.md, 'Batch rounds', "
                    "lists every key; samples/batch/ holds working files")


class BatchLockedError(SyncpackError):
    """Another batch round holds this site's batch lock: rounds never overlap."""

    default_hint = ("this round was skipped and changed nothing; the next scheduled round "
                    "catches up (if rounds keep overlapping, schedule them further apart)")


class OutputError(SyncpackError):
    """The command's result could not be written where its output goes (a full disk)."""
    default_hint = ("what the command did stands; free space where its output goes, or send "
                    "the output elsewhere, and run a command that shows it again (status, ls)")


class MetricsWriteError(SyncpackError):
    """A batch round could not write its metrics file."""

    default_hint = ("check that the directory exists and this user may write to it (for "
                    "node_exporter: the --collector.textfile.directory)")


class UndecodableRecordError(SyncpackError, ValueError):
    """A stored record whose bytes are not a value: its origin signed them so (a member that
    lies, or software that is not syncpack).  The store keeps what was signed; reading it
    names the record instead of failing inside the decoder."""

    default_hint = ("the record arrived like this from its origin; 'syncpack conflicts "
                    "resolve', a new put or a delete of the key replaces it at every site")


class InvalidValueError(UsageError):
    """A record value that is not plain JSON (bytes, NaN, infinities, non-string keys, other
    objects): refused before anything is written, so every site can show and ship it.

    On the command line an unacceptable value or name is a usage error (exit 2), whichever
    check finds it: the same code as a value that is not JSON at all.  Also raised for other
    malformed values given to a command (an ORIGIN=EPOCH without a whole number, a --field
    without '=', a family without a name)."""

    exit_code = 2

    default_hint = ("store JSON values only: dicts with string keys, lists, strings, finite "
                    "numbers (integers within 64 bits), true/false/null")


class InvalidNameError(UsageError):
    """A collection name or key that cannot be used: empty, too long, or reserved.  One rule
    for both kinds of name (exit 2 on the command line, as for an invalid value)."""

    exit_code = 2
    default_hint = ("collections and keys are non-empty strings; names starting with '$' "
                    "belong to syncpack")


class TransactionTooLargeError(UsageError):
    """One transaction holds more than one block can (formats/BLOCKS.md: 2^20 changes, 256 MiB
    encoded); it is refused whole at commit, nothing written."""


class SiteClosedError(SiteError):
    """A :class:`~syncpack.Site` was used after :meth:`~syncpack.Site.close`."""

    default_hint = "open the site again with syncpack.open_site(PATH)"


class AttachError(SyncpackError):
    """An application database or table cannot be attached, detached or written; nothing
    was changed."""


class AttachBusyError(AttachError):
    """The application's database stayed locked by another connection (the application's
    own transaction) for longer than the command waits."""


class ApplicationOnlyError(AttachError):
    """A statement on an application's table needs a function, a collation or a module that
    only the application defines (it registers them in its own connections): its triggers,
    indexes, CHECK constraints or generated columns use one.  A row it refuses is a clash,
    like a constraint's."""

    needs = ""      # SQLite's words: "no such function: slug"


class SealError(Exception):
    """format/seal.py: a sealed body cannot be opened; ``hint`` says what to do (the caller's
    default otherwise).  Not a user-facing error: the packet code raises it again as a
    :class:`PacketSealError`.  Defined here so that code reading unsealed packets can catch
    it without loading the sealing code and its cryptography."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.hint = hint
