"""A site: its directory, store, identity, clock, and the Python API for applications.

    >>> import syncpack
    >>> site = syncpack.open_site("/srv/sites/boston")
    >>> with site.transaction() as tx:
    ...     tx.put("parts", "p-100", {"name": "bolt", "qty": 40})
    ...     tx.delete("parts", "p-099")
    >>> site.get("parts", "p-100")
    {'name': 'bolt', 'qty': 40}

Each committed transaction appends its ops to the changelog under consecutive epochs of this
origin, atomically with the state change; an exception inside the ``with`` block leaves no op and
no change.
"""

from __future__ import annotations

import os
import struct
import time
from contextlib import contextmanager
from pathlib import Path
from itertools import groupby, repeat
from operator import itemgetter
from typing import Any, Callable, Iterator

from syncpack.format import codec
from syncpack.lazy import OnFirstUse
from syncpack.store import chain, db, exports, fields, matrix, meta, versions
from syncpack.format.codec import Op, Record
from syncpack.rules.conflict import POLICIES, Version
from syncpack.format.blocks import SEQ_LIMIT
from syncpack.format.csn import CSN_LEN, next_hlc, pack_csn, split_csns
from .errors import (InvalidNameError, InvalidValueError, LockedError, NotJoinedError,
                     RecordNotFound,
                     RecoveringError, SiteClosedError, SiteError, TransactionTooLargeError,
                     UsageError)
from syncpack.fileops import locked
from syncpack.format.names import check_new_site_name
from syncpack.format.values import json_value_encoder

_encode_json = json_value_encoder()


def encode_record_value(value: Any) -> bytes:
    """A value an application writes (:meth:`Transaction.put`), encoded: plain JSON (see
    :mod:`syncpack.format.values`) within what one record may hold.  Raises
    :class:`InvalidValueError`."""
    raw = _encode_json(value)
    if len(raw) > codec.MAX_VALUE_BYTES:
        raise InvalidValueError(f"a value is limited to {codec.MAX_VALUE_BYTES} bytes encoded "
                                f"(this one is {len(raw)}); peers would refuse it")
    return raw
# Also re-exported: applications and the packages above know these names from here.
from syncpack.replicated import (CLASH_HINT, COLLECTIONS, FAMILY, FAMILY_KEY,  # noqa: F401
                                 ROSTER, SYS_PREFIX, TABLES, Member, Replicated, check_priority,
                                 clash_text)

keys = OnFirstUse("syncpack.format.keys")    # cryptography: only to create or sign

PARKED_DIR = "parked"
LOCK_FILE = "lock"


_U32 = struct.Struct(">I")     # the seq at the end of a CSN


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


MAX_NAME_CHARS = 16 * 1024       # collections and keys; readers accept far more

# A bulk writer's ops (Transaction.write_columns) are sealed as a part of their transaction
# (formats/BLOCKS.md section 4.2) once this many are held, or this many bytes of keys and
# values: its memory stays flat however large the transaction, which no block limit bounds.
PART_OPS = 100_000
PART_BYTES = chain.BLOCK_RAW


def check_collection(name: str) -> None:
    _check_name(name, "collection name")
    if name.startswith(SYS_PREFIX):
        raise InvalidNameError(f"collection names starting with '{SYS_PREFIX}' are reserved "
                               f"for syncpack itself: {name!r}")


def check_key(key: str) -> None:
    # the same rule as for collection names: an empty key is as unusable (it cannot be typed
    # back on a command line, and 'ls' shows nothing for it)
    _check_name(key, "key")


def _check_name(name: str, what: str) -> None:
    if not isinstance(name, str) or not name:
        raise InvalidNameError(f"a {what} must be a non-empty string")
    if len(name) > MAX_NAME_CHARS:
        raise InvalidNameError(f"a {what} is limited to {MAX_NAME_CHARS} characters")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        # bytes that are not UTF-8, as a command line passes them (surrogate escapes)
        raise InvalidNameError(f"a {what} must be text (UTF-8): {name!r} is not",
                               hint="type it in UTF-8 (check the terminal's or the "
                                    "script's encoding)") from None


class Site:
    """An open site directory.  Not thread-safe; open one per thread or process."""

    def __init__(self, path: Path, conn: db.Connection, clock: Callable[[], int] = wall_ms):
        self.path = Path(path)
        self.conn = conn
        self.clock = clock
        m = meta.read_all(conn)
        if "site_id" not in m:
            raise SiteError(f"{self.path} holds an incomplete store (no site identity)",
                            hint="remove the directory and create the site again")
        self.site_id: bytes = m["site_id"]
        self.name: str = m["site_name"]
        self.joined = bool(m.get("joined", 0))
        self.family_id: bytes | None = m.get("family_id")
        self._replicated = Replicated()
        self._sign: Callable[[bytes], bytes] | None = None
        # How long lock() waits for another process's command (an interactive command waits;
        # a batch round's actions fail at once, as documented), and what it says meanwhile.
        self.lock_wait_s = 0.0
        self.on_lock_wait: Callable[[], None] | None = None
        # (store data version, epoch, clock, state) after our last local commit: while no
        # commit came in between, the next local transaction starts from it without asking
        # the store (a one-put transaction's one statement fewer)
        self._position: tuple[int, int, int, str] | None = None
        # commit_marker() after a commit a command made before its own work (an attached
        # application's changes captured first): what an interrupt of that work compares with
        self.marker_before_work: tuple | None = None

    # -- opening and creating ------------------------------------------------------------------

    @classmethod
    def open(cls, path: str | os.PathLike, *, require_joined: bool = True,
             clock: Callable[[], int] = wall_ms) -> "Site":
        """Open the site at ``path``; raises :class:`SiteError` if it is not one, or
        :class:`NotJoinedError` if it has not joined a family and ``require_joined``."""
        p = Path(path)
        db_path = p / db.DB_NAME
        if not p.is_dir():
            raise SiteError(f"{p} is not a directory",
                            hint="pass --site DIR or set SYNCPACK_SITE to a site directory")
        if db_path.exists() and not db_path.is_file():
            raise SiteError(f"{db_path} is not a file",
                            hint="a site's store is the file syncpack.db; something else took "
                                 "its name: move it aside, then restore the store from a backup")
        if not db_path.is_file():
            raise SiteError(f"{p} is not a syncpack site (no {db.DB_NAME})",
                            hint="create one with 'syncpack init' or 'syncpack keygen', "
                                 "or pass --site DIR")
        conn = db.open_existing(db_path)
        try:
            site = cls(p, conn, clock)
        except db.DatabaseError as e:
            conn.close()
            raise SiteError(f"{db_path} is not a readable syncpack store ({e})") from None
        if require_joined and not site.joined:
            conn.close()
            raise NotJoinedError(f"site {site.name!r} at {p} has not joined a family yet")
        return site

    @classmethod
    def _create_dir(cls, path: Path, site: str) -> tuple[Path, db.Connection, keys.PublicIdentity]:
        check_new_site_name(site)
        p = Path(path)
        if p.exists() and (not p.is_dir() or any(p.iterdir())):
            raise SiteError(f"{p} already exists and is not an empty directory",
                            hint="choose a new directory for the site")
        p.mkdir(parents=True, exist_ok=True)
        (p / PARKED_DIR).mkdir(exist_ok=True)
        site_id = os.urandom(8)
        ident = keys.generate(p, site, site_id)
        conn = db.create(p / db.DB_NAME)
        with db.write_txn(conn):
            meta.create(conn, [
                ("site_id", site_id), ("site_name", site), ("joined", 0), ("hlc", 0),
                ("state", "normal"), ("created_ms", wall_ms())])
            matrix.add_origin(conn, site_id)
        return p, conn, ident

    @classmethod
    def keygen(cls, path: str | os.PathLike, site: str) -> tuple["Site", Path]:
        """Make a not-yet-joined site directory with its key pair; returns the site and
        the public key file to hand to ``mkreplica export`` at a member."""
        p, conn, _ = cls._create_dir(Path(path), site)
        s = cls(p, conn)
        return s, keys.public_path(p)

    @classmethod
    def init_family(cls, path: str | os.PathLike, family: str, site: str,
                    policy: str = "lww", priority: int = 0) -> "Site":
        """Create a new family whose first site lives at ``path``."""
        if policy not in POLICIES:
            raise UsageError(f"unknown policy {policy!r}; choose one of {', '.join(POLICIES)}",
                             hint="lww: the newest write wins; priority: the higher-priority "
                                  "site")
        if not family.strip():      # blank is no name either: status would show none
            raise InvalidValueError("the family needs a name",
                                    hint="init DIR --family NAME --site NAME")
        check_priority(priority)
        p, conn, ident = cls._create_dir(Path(path), site)
        fam_id = os.urandom(16)
        with db.write_txn(conn):
            meta.put_many(conn, [("family_id", fam_id), ("family_name", family), ("joined", 1)])
        s = cls(p, conn)
        me = Member(site, ident.site_id, ident.ed25519, ident.x25519, priority, {}, False)
        with s.transaction(_system=True) as tx:
            tx.write_raw(FAMILY, FAMILY_KEY, codec.encode_value({"name": family, "policy": policy}))
            tx.write_raw(ROSTER, site, codec.encode_value(me.to_value()))
        return s

    def close(self) -> None:
        """Close the store; using the site afterwards raises :class:`SiteClosedError`."""
        if not isinstance(self.conn, _ClosedStore):
            self.conn.close()
            self.conn = _ClosedStore(self.name)

    def __enter__(self) -> "Site":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- metadata ------------------------------------------------------------------------------

    def meta(self, key: str, default: Any = None) -> Any:
        """A value of the site's local metadata (clock, state, identity), or ``default``."""
        return meta.get(self.conn, key, default)

    def set_meta(self, key: str, value: Any) -> None:
        """Set a metadata value; the caller holds a write transaction."""
        meta.put(self.conn, key, value)

    @property
    def family_name(self) -> str:
        """The family's name ('' before joining)."""
        return self.meta("family_name", "")

    @property
    def state(self) -> str:
        """``'normal'`` or ``'recovering'`` (after a restore, see ``syncpack restore``)."""
        return self.meta("state", "normal")

    # -- roster and policies (replicated state, read through the visible values) ----------------

    def invalidate(self) -> None:
        """Forget cached roster and policies (after changes to replicated settings)."""
        self._replicated.invalidate()

    def roster(self) -> dict[str, Member]:
        """The family's members by name, retired ones included."""
        return self._replicated.roster(self.conn)

    def members_by_id(self, include_retired: bool = False) -> dict[bytes, Member]:
        """Current members (and with ``include_retired`` the retired ones) by site id."""
        return {m.site_id: m for m in self.roster().values() if include_retired or not m.retired}

    def names(self) -> dict[bytes, str]:
        """Site id -> name for every site ever in the roster (retired ones too)."""
        names = {m.site_id: m.name for m in self.roster().values()}
        names.setdefault(self.site_id, self.name)
        return names

    def name_of(self, site_id: bytes) -> str:
        """A site's name, or its id in hex if it never was in the roster."""
        return self.names().get(site_id, site_id.hex())

    def member_named(self, name: str) -> Member:
        """The current member called ``name``; :class:`UsageError` if there is none."""
        m = self.roster().get(name)
        if m is not None and m.clashes_with:
            raise UsageError(clash_text(m, self.family_name), hint=CLASH_HINT)
        if m is not None and m.retired:
            raise UsageError(f"{name} was retired from family {self.family_name!r}: nothing is "
                             f"sent to it and its packets are refused",
                             hint=f"'syncpack status' says who retired it; to reinstate it: "
                                  f"'syncpack rmreplica {name} --undo'")
        if m is None:
            known = ", ".join(sorted(n for n, x in self.roster().items() if not x.retired))
            raise UsageError(f"no member named {name!r} in family {self.family_name!r}",
                             hint=f"members: {known}")
        return m

    def family_policy(self) -> str:
        """The family's default conflict policy (``lww`` or ``priority``)."""
        return self.family_settings().get("policy", "lww")

    def family_settings(self) -> dict:
        """The family's replicated settings (name, policy, sealing rule)."""
        return self._replicated.family_settings(self.conn)

    def requires_sealing(self) -> bool:
        """Whether the family requires every packet to be sealed to its recipient."""
        return bool(self.family_settings().get("require_sealed", False))

    def policies(self) -> dict[str, str]:
        """Collections that have their own conflict policy: name -> policy."""
        return self._replicated.policies(self.conn)

    def policy_of(self, collection: str) -> str:
        """The conflict policy that decides the visible version in ``collection``."""
        return self._replicated.policy_of(self.conn, collection)

    def seal_key(self, peer: bytes, encrypt: bool) -> bytes | None:
        """The peer's X25519 key when a packet to it must be sealed (asked for, or family
        policy); None when it goes unsealed."""
        if not (encrypt or self.requires_sealing()):
            return None
        m = self.members_by_id(include_retired=True).get(peer)
        if m is None or len(m.x25519) != 32:
            raise UsageError(f"no X25519 key for {self.name_of(peer)} in the roster; "
                             f"cannot seal")
        return m.x25519

    def priorities(self) -> dict[bytes, int]:
        """Each member's priority under the ``priority`` policy, by site id."""
        return self._replicated.priorities(self.conn)

    # -- reading -------------------------------------------------------------------------------

    def versions(self, collection: str, key: str) -> list[Version]:
        """The surviving versions of ``collection``/``key`` (more than one: a conflict)."""
        return versions.of_key(self.conn, collection, key)

    def key_as_shown(self, collection: str, key: str) -> str:
        """``key`` as given; or, when no version has it and it holds escapes, the key whose
        shown form it is: listings escape control characters (a NUL, a line break), which no
        command line can carry, so the key they show must name the record too."""
        if "\\" not in key or versions.of_key(self.conn, collection, key):
            return key
        try:
            real = key.encode("latin-1", "backslashreplace").decode("unicode_escape")
        except UnicodeDecodeError:
            return key
        return real if real != key and versions.of_key(self.conn, collection, real) else key

    def get(self, collection: str, key: str, default: Any = RecordNotFound) -> Any:
        """The visible value of ``collection``/``key``.  Raises :class:`RecordNotFound`
        when there is none, unless a ``default`` is given."""
        raw = self._replicated.visible(self.conn, collection, key)
        if raw is None:
            if default is RecordNotFound:
                raise RecordNotFound(f"no record {collection}/{key}")
            return default
        return codec.decode_value(raw, f"record {collection}/{key}")

    def records(self, collection: str | None = None, include_system: bool = False,
                shown: bool = False) -> Iterator[tuple[str, str, Any]]:
        """``(collection, key, value)`` of every visible record, sorted; one collection
        or all (syncpack's own ``$`` collections only with ``include_system``).  A record
        that is not a value raises :class:`UndecodableRecordError`, or with ``shown`` (a
        listing) comes as text saying so."""
        for coll, key, raw in self._replicated.visible_rows(self.conn, collection):
            if coll.startswith(SYS_PREFIX) and not include_system and collection is None:
                continue
            yield coll, key, (codec.shown_value(raw) if shown
                              else codec.decode_value(raw, f"record {coll}/{key}"))

    def vector(self) -> dict[bytes, int]:
        """This site's vector: origin site id -> highest epoch held."""
        return matrix.vector(self.conn)

    def last_hlc(self) -> int:
        """The hybrid logical clock's state: at or above every CSN this site made or saw."""
        tip = chain.own_tip(self.conn, self.site_id)
        return max(int(self.meta("hlc", 0)), tip[1] if tip else 0)

    def commit_marker(self) -> tuple:
        """What any committed change of the store's own history moves (vector, floors, packets
        recorded as sent), read in a connection of its own: a command stopped by Ctrl-C
        compares it with the one taken before its work, to say truthfully whether its
        transaction had committed before the interrupt (the window between COMMIT and the
        report is real).  Here, not with the inspection commands: every command takes it,
        a put too, which must start without their imports."""
        with Site.open(self.path) as s:
            return s.vector(), s.floors(), exports.packets_out_count(s.conn)

    def floors(self) -> dict[bytes, int]:
        """Per origin, the highest epoch no longer in the changelog (trimmed or seeded)."""
        return matrix.floors(self.conn)

    def named(self, vec: dict[bytes, int]) -> dict[str, int]:
        """A vector keyed by site name instead of site id."""
        names = self.names()
        return {names.get(o, o.hex()): e for o, e in sorted(vec.items(),
                                                             key=lambda x: names.get(x[0], ""))}

    def digest(self) -> tuple[str, int]:
        """A hash of the replicated state: equal on sites that hold the same ops.

        Covers every key's surviving versions (CSN and value) and its visible value; leaves out
        local bookkeeping (matrix, packets, clock) and keys whose only survivor is a tombstone,
        which trimming removes at different times at different sites."""
        return self._replicated.digest(self.conn)

    # -- writing -------------------------------------------------------------------------------

    def transaction(self, _system: bool = False) -> "_TransactionScope":
        """One local transaction: ``with site.transaction() as tx: tx.put(...)``.

        Every put and delete in the block commits together, or none does if the block
        raises; refused while the site is recovering from a restore."""
        if not self.joined:
            raise NotJoinedError(f"site {self.name!r} has not joined a family yet")
        return _TransactionScope(self, _system)

    def own_position(self) -> tuple[int, int, str]:
        """(epoch, clock, state) a local transaction starts from; the caller holds the write
        lock."""
        pos = self._position
        if pos is not None and pos[0] == db.data_version(self.conn):
            return pos[1], pos[2], pos[3]
        return chain.own_position(self.conn, self.site_id)

    def remember_position(self, epoch: int, hlc: int, state: str) -> None:
        """After a local commit: where the next local transaction starts (see own_position)."""
        self._position = (db.data_version(self.conn), epoch, hlc, state)

    @contextmanager
    def write_txn(self) -> Iterator[db.Connection]:
        """:func:`db.write_txn`, dropping cached roster and policies on rollback."""
        try:
            with db.write_txn(self.conn) as c:
                yield c
        except BaseException:
            self.invalidate()
            raise

    @contextmanager
    def lock(self, wait: bool = True) -> Iterator[None]:
        """Serialises packet work (export, import, mkreplica, scrub) on one site.  Held by
        another process: waits up to :attr:`lock_wait_s` (0 unless the command line set it;
        not at all with ``wait`` false), then raises :class:`LockedError`."""
        with locked(self.path / LOCK_FILE, lambda: LockedError(
                f"another syncpack command is working on site {self.name!r}"),
                self.lock_wait_s if wait else 0.0, self.on_lock_wait):
            yield

    # -- op application (shared by local writes, imports and fsck's replay) --------------------

    def apply_version(self, op: Op, csn: bytes) -> bool:
        """Make ``op`` a surviving version of its key unless a known write superseded it, and
        drop the versions it superseded.  Returns whether one of those is not here yet (it
        is remembered, and dropped when it arrives)."""
        merge = self.policy_of(op.collection) == "merge"
        full = fields.full_value(self.conn, op.collection, op.key, op.value, op.replaced, merge)
        if full is not op.value:    # a patch: what every reader sees is the record it makes
            op = Op(*op[:6], full, op.replaced)
        if merge:
            fields.note_write(self.conn, op.collection, op.key, csn, op.value, op.replaced)
        return versions.apply_version(self.conn, op, csn)

    def signer(self) -> Callable[[bytes], bytes]:
        """This site's Ed25519 signing function (read from its key file once)."""
        if self._sign is None:
            key = keys.load_signing_key(self.path)
            me = self.members_by_id(include_retired=True).get(self.site_id)
            if me is not None and key.public_key().public_bytes_raw() != me.ed25519:
                # signed with it, every block would be refused by every peer, for good
                raise SiteError(
                    f"the signing key in {self.path / keys.KEY_DIR} is not the one the family "
                    f"knows for site {self.name} (keys put back from another site?); nothing "
                    f"was signed", hint="restore this site's own keys directory from its "
                                        "backup")
            self._sign = key.sign
        return self._sign

    def check_sealing_key(self) -> None:
        """Raise :class:`SiteError` unless this site's sealing key loads and is the one the
        family seals to: else every sealed packet would fail to open, each with a hint that
        blames the packet."""
        key = keys.load_box_key(self.path)
        me = self.members_by_id(include_retired=True).get(self.site_id)
        if me is not None and len(me.x25519) == 32 and \
                key.public_key().public_bytes_raw() != me.x25519:
            raise SiteError(
                f"the sealing key in {self.path / keys.KEY_DIR} is not the one the family "
                f"knows for site {self.name} (keys put back from another site, or made again "
                f"by keygen?); sealed packets to this site cannot be opened, nothing was "
                f"imported", hint="restore this site's own keys directory from its backup")

    def seal_pending(self, max_block: int | None = None,
                     reseal_above: int | None = None) -> int:
        """Seal our unsealed ops into blocks (before they leave in a packet or a snapshot
        counts on them), of at most ``max_block`` bytes where whole transactions allow; the
        caller holds a write transaction."""
        n = chain.seal_pending(self.conn, self.family_id, self.site_id, self.signer(),
                               max_block)
        if reseal_above is not None:
            # a transaction sealed whole at commit may be larger than this medium allows
            chain.reseal_oversized(self.conn, self.family_id, self.site_id, self.signer(),
                                   reseal_above, max_block or reseal_above)
        return n

    def record_ops(self, ops: list[Op]) -> None:
        """Append our own ops to the changelog (sealed later); the caller holds a write
        transaction."""
        chain.append_ops(self.conn, ops)

    def iter_changelog(self, origin: bytes, lo: int, hi: int) -> Iterator[Op]:
        """Ops of ``origin`` with epochs in (lo, hi] we hold, in epoch (= CSN) order."""
        return chain.iter_ops(self.conn, origin, lo, hi)

    def iter_versions(self) -> Iterator[Record]:
        """Every surviving version of every key, in (collection, key, CSN) order."""
        for row in versions.rows_by_csn(self.conn):
            yield Record(*row)

    def parked_dir(self) -> Path:
        """The directory that keeps parked packets (created if missing)."""
        d = self.path / PARKED_DIR
        d.mkdir(exist_ok=True)
        return d


class _TransactionScope:
    """The ``with`` block of :meth:`Site.transaction`: :func:`db.write_txn` around a
    :class:`Transaction`, as a class (the generator-based form cost a one-put transaction two
    generators and their context managers); cached roster and policies are dropped on
    rollback, and after a commit that wrote syncpack's own collections."""

    __slots__ = ("site", "system", "tx")

    def __init__(self, site: "Site", system: bool):
        self.site, self.system = site, system

    def __enter__(self) -> "Transaction":
        site = self.site
        db.begin_write(site.conn)
        try:
            tx = self.tx = Transaction(site, self.system)
            # read with the epoch and clock, under the write lock (Transaction.__init__).
            # syncpack's own writes too (a priority, a retirement, a family setting): any op
            # made now takes an epoch the peers may hold with another op.
            if tx.recovering:
                raise RecoveringError(
                    f"site {site.name!r} is recovering from a restore and refuses local "
                    f"writes until its own ops have come back from its peers",
                    hint="import packets from the peers ('syncpack status' shows what is "
                         "missing)")
        except BaseException:
            self._abandon()
            raise
        return tx

    def __exit__(self, exc_type, exc, tb) -> bool:
        site = self.site
        if exc_type is not None:
            self._abandon()
            return False
        try:
            self.tx.flush()
        except BaseException:
            self._abandon()
            raise
        tx = self.tx
        wrote = tx.epoch != tx.start_epoch
        try:
            db.commit(site.conn)
        except BaseException:
            site.invalidate()
            raise
        if wrote:
            site.remember_position(tx.epoch, tx.hlc, tx.state)
        if tx.touched_system:
            site.invalidate()
        return False

    def _abandon(self) -> None:
        try:
            db.rollback(self.site.conn)
        finally:
            self.site.invalidate()


class _ClosedStore:
    """Stands in for the connection of a closed site, so any use says so clearly (instead of
    the driver's closed-connection error)."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str):
        raise SiteClosedError(f"site {self._name!r} has been closed")


class Transaction:
    """Puts and deletes of one local transaction; see :meth:`Site.transaction`."""

    def __init__(self, site: Site, system: bool):
        self.site = site
        self.system = system
        self.epoch, last, self.state = site.own_position()
        self.start_epoch = self.epoch
        self.recovering = self.state == "recovering"
        self.hlc = next_hlc(last, site.clock())
        self.ops: list[Op] = []
        self.seq = 0
        self.touched_system = False
        # write_columns: ops held as columns, and how many parts of them are sealed
        self._cols: list[tuple[str, list[str], list[bytes | None], list[bytes] | None]] = []
        self._cols_n = self._cols_bytes = self._parts = 0

    def put(self, collection: str, key: str, value: Any) -> None:
        """Write ``value`` (plain JSON: see :mod:`syncpack.format.values`) under
        ``collection``/``key``.  Raises :class:`InvalidValueError` (a :class:`SyncpackError`)
        for anything else, and :class:`UsageError` for a bad collection or key."""
        check_collection(collection)
        check_key(key)
        self.write_raw(collection, key, encode_record_value(value))

    def delete(self, collection: str, key: str) -> None:
        """Delete ``collection``/``key`` (a tombstone is recorded even if it is absent,
        so the delete still wins over older concurrent writes)."""
        check_collection(collection)
        check_key(key)
        self.write_raw(collection, key, None)

    def set_policy(self, collection: str, policy: str) -> None:
        """Give ``collection`` its own conflict policy (replicated like any write)."""
        check_collection(collection)
        if policy not in POLICIES:
            raise UsageError(f"unknown policy {policy!r}; choose one of {', '.join(POLICIES)}",
                             hint="lww: the newest write wins; priority: the higher-priority "
                                  "site")
        self.write_raw(COLLECTIONS, collection, codec.encode_value({"policy": policy}))

    def write_raw(self, collection: str, key: str, raw: bytes | None) -> None:
        """Write an already encoded value (None: a delete) without the checks of :meth:`put`.
        For syncpack's own replicated collections (roster, family settings, policies), whose
        rules their writers enforce; applications use :meth:`put` and :meth:`delete`."""
        site = self.site
        if self._cols:
            self._settle_columns()
        if collection.startswith(SYS_PREFIX):
            self.touched_system = True
        seq = self.seq
        self.seq += 1
        self.epoch += 1
        replaced = versions.csns_of_key(site.conn, collection, key)
        csn = pack_csn(self.hlc, site.site_id, seq)
        sent = raw
        if site.policy_of(collection) == "merge":
            sent, raw = fields.as_patch(site.conn, collection, key, replaced, raw)
            fields.note_write(site.conn, collection, key, csn, raw, replaced, local=True)
        versions.replace_key(site.conn, collection, key, csn, raw, bool(replaced))
        # tuple.__new__ builds the Op in C (the namedtuple's own __new__ is Python)
        self.ops.append(tuple.__new__(Op, (site.site_id, self.epoch, self.hlc, seq, collection,
                                           key, sent, replaced)))

    def write_many(self, collection: str,
                   items: list[tuple[str, bytes | None, list[bytes]]]) -> None:
        """:meth:`write_raw` for many distinct keys whose surviving versions the caller has
        read: each ``(key, raw, replaced)`` supersedes the versions listed in ``replaced``
        (they go), the others stay as concurrent ones.  For bulk writers (an attached table's
        capture), which would otherwise read every key twice."""
        site = self.site
        if self._cols:
            self._settle_columns()
        if collection.startswith(SYS_PREFIX):
            self.touched_system = True
        if not items:
            return
        names, raws, replaced_ = zip(*items)
        if not any(replaced_):
            # Nothing superseded (a first capture, new rows): the ops and rows are built by
            # map/zip in C instead of a Python loop per row.
            n, seq0, epoch0, hlc = len(items), self.seq, self.epoch, self.hlc
            self.seq += n
            self.epoch += n
            prefix = pack_csn(hlc, site.site_id, 0)[:CSN_LEN - 4]
            csns = map(prefix.__add__, map(_U32.pack, range(seq0, seq0 + n)))
            self.ops.extend(map(tuple.__new__, repeat(Op), zip(
                repeat(site.site_id), range(epoch0 + 1, epoch0 + 1 + n), repeat(hlc),
                range(seq0, seq0 + n), repeat(collection), names, raws, repeat(b""))))
            versions.insert_many(site.conn, zip(repeat(collection), names, csns, raws))
            return
        gone, rows = [], []
        merge = site.policy_of(collection) == "merge"
        for key, raw, replaced in items:
            seq = self.seq
            sent = raw
            if merge:
                sent, raw = fields.as_patch(site.conn, collection, key, b"".join(replaced), raw)
                fields.note_write(site.conn, collection, key,
                                  pack_csn(self.hlc, site.site_id, seq), raw,
                                  b"".join(replaced), local=True)
            self.seq += 1
            self.epoch += 1
            self.ops.append(Op(site.site_id, self.epoch, self.hlc, seq, collection, key, sent,
                               b"".join(replaced)))
            gone.extend((collection, key, c) for c in replaced)
            rows.append((collection, key, pack_csn(self.hlc, site.site_id, seq), raw))
        versions.remove_listed(site.conn, gone)
        versions.insert_many(site.conn, rows)

    def write_rows(self, rows: list[tuple[str, str, bytes | None]]) -> None:
        """:meth:`write_raw` for each ``(collection, key, encoded value or None)`` in order,
        with the store's reads and writes batched: one ``executemany`` looks up the keys'
        versions and one writes the new ones, so a record costs one B-tree write.  The caller
        has checked the rows (``syncpack load`` checks each line as it reads it); unlike
        :meth:`write_many` it looks the versions up itself, and a key may come twice."""
        if not rows:
            return
        site = self.site
        if self._cols:
            self._settle_columns()
        if any(site.policy_of(c) == "merge" for c in {r[0] for r in rows}):
            for c, k, raw in rows:      # merge collections stamp each write's fields
                self.write_raw(c, k, raw)
            return
        origin = site.site_id
        if any(c.startswith(SYS_PREFIX) for c in {r[0] for r in rows}):
            self.touched_system = True
        n = len(rows)
        colls, names, raws = zip(*rows)
        keys = list(zip(colls, names))
        unique = dict.fromkeys(keys)
        held = versions.csns_of_keys(site.conn, unique)
        if not held and len(unique) == n and n >= chain.SEAL_AT_COMMIT and not self.ops:
            # new keys, each once (a first load) and enough of them to be sealed as a block of
            # their own: nothing replaced, every row stays, and the rows go as columns, sealed
            # without an object per op (a third of a large load's CPU went to making and
            # taking apart Op tuples).  In key order, they append to the versions B-tree.
            for coll, run in groupby(sorted(rows), itemgetter(0)):
                _c, run_keys, run_raws = zip(*run)
                self.write_columns(coll, list(run_keys), list(run_raws))
            return
        seq0, epoch0, hlc = self.seq, self.epoch, self.hlc
        self.seq += n
        self.epoch += n
        prefix = pack_csn(hlc, origin, 0)[:CSN_LEN - 4]
        csns = list(map(prefix.__add__, map(_U32.pack, range(seq0, seq0 + n))))
        new = tuple.__new__     # builds each Op in C (Op(...) runs a Python __new__)
        if not held and len(unique) == n:
            # new keys, each once: nothing replaced, every row stays
            self.ops.extend(map(new, repeat(Op), zip(
                repeat(origin), range(epoch0 + 1, epoch0 + 1 + n), repeat(hlc),
                range(seq0, seq0 + n), colls, names, raws, repeat(b""))))
            versions.replace_many(site.conn, (), sorted(zip(colls, names, csns, raws)))
            return
        gone = list(held)
        last: dict[tuple[str, str], tuple[bytes, bytes | None]] = {}
        ops = self.ops
        for (coll, key, raw), k, csn, seq in zip(rows, keys, csns, range(seq0, seq0 + n)):
            old = held.get(k)
            # a key written twice in one batch: the later op supersedes the earlier one
            held[k] = [csn]
            last[k] = (csn, raw)
            ops.append(new(Op, (origin, epoch0 + 1 + seq - seq0, hlc, seq, coll, key, raw,
                                b"".join(old) if old else b"")))
        versions.replace_many(site.conn, gone, sorted(
            (c, k, csn, raw) for (c, k), (csn, raw) in last.items()))

    def write_columns(self, collection: str, keys: list[str], raws: list[bytes | None],
                      replaced: list[bytes] | None = None) -> None:
        """:meth:`write_many` for a bulk writer that holds columns: ``keys`` distinct and not
        written before in this transaction, ``raws`` their encoded values (None: a delete),
        ``replaced`` the CSNs each op supersedes, concatenated (they go; None: nothing
        superseded).  No object is made per op: the ops stay columns and are sealed straight
        into blocks, as parts of this transaction once :data:`PART_OPS` or :data:`PART_BYTES`
        are held, so neither memory nor a block's limits bound the transaction.  The caller
        checked the collection, keys and values (an attached table's capture)."""
        n = len(keys)
        if not n:
            return
        site = self.site
        if self.ops or site.policy_of(collection) == "merge":
            # written op by op before: go on that way (a transaction keeps its order); a
            # merge collection's op carries a patch, not the record (write_many makes it)
            self.write_many(collection, [
                (k, raw, split_csns(r))
                for k, raw, r in zip(keys, raws, replaced or repeat(b""))])
            return
        if collection.startswith(SYS_PREFIX):
            self.touched_system = True
        if self.seq + n > SEQ_LIMIT:
            raise TransactionTooLargeError(
                f"one transaction is limited to {SEQ_LIMIT} changes; nothing was written",
                hint="split the work into several transactions")
        at = 0
        while at < n:       # fill the part being held, seal it, go on in the next
            if self._cols_n >= PART_OPS:
                self._seal_part(more=True)
            end = min(n, at + PART_OPS - self._cols_n)
            size = sum(map(len, keys[at:end])) + sum(map(len, filter(None, raws[at:end])))
            if self._cols and self._cols_bytes + size > PART_BYTES:
                self._seal_part(more=True)
                continue
            while size > PART_BYTES and end - at > 1:
                end = at + (end - at) // 2
                size = sum(map(len, keys[at:end])) + sum(map(len, filter(None, raws[at:end])))
            self._write_part(collection, keys[at:end], raws[at:end],
                             None if replaced is None else replaced[at:end], size)
            at = end

    def _write_part(self, collection: str, keys: list[str], raws: list[bytes | None],
                    replaced: list[bytes] | None, size: int) -> None:
        site = self.site
        n = len(keys)
        seq0 = self.seq
        prefix = pack_csn(self.hlc, site.site_id, 0)[:CSN_LEN - 4]
        if replaced is not None and not any(replaced):
            replaced = None
        if replaced is not None:
            versions.remove_listed(site.conn, [
                (collection, k, c) for k, r in zip(keys, replaced) for c in split_csns(r)])
        versions.insert_numbered(site.conn, collection, keys, prefix, seq0, raws, size)
        self.seq += n
        self.epoch += n
        self._cols.append((collection, keys, raws, replaced))
        self._cols_n += n
        self._cols_bytes += size

    def _seal_part(self, more: bool) -> None:
        site = self.site
        if not self._parts:
            site.seal_pending()     # our older unsealed ops come first in the chain
        n = self._cols_n
        chain.seal_columns(site.conn, site.family_id, site.site_id, site.signer(),
                           self.epoch - n, self.hlc, self.seq - n, self._cols, more)
        self._parts += 1
        self._cols, self._cols_n, self._cols_bytes = [], 0, 0

    def _settle_columns(self) -> None:
        """Op-wise writes after column ones: the columns so far become a sealed part (once
        parts exist) or ops (a small transaction may still go to the changelog)."""
        if self._parts:
            self._seal_part(more=True)
            return
        n = self._cols_n
        seq, epoch, origin, hlc = self.seq - n, self.epoch - n, self.site.site_id, self.hlc
        for coll, keys, raws, reps in self._cols:
            k = len(keys)
            self.ops.extend(map(tuple.__new__, repeat(Op), zip(
                repeat(origin), range(epoch + 1, epoch + 1 + k), repeat(hlc),
                range(seq, seq + k), repeat(coll), keys, raws, reps or repeat(b""))))
            seq += k
            epoch += k
        self._cols, self._cols_n, self._cols_bytes = [], 0, 0

    def part(self) -> None:
        """End a part of this transaction: what was written so far is sealed as one of its
        parts (formats/BLOCKS.md section 4.2), and what follows continues it under the same
        clock; a peer applies none of it until the last part is there.  For a writer whose one
        transaction is larger than a block holds (``syncpack load``): it stays one at every
        site, and its memory stays that of a part."""
        self._seal_held(more=True)

    def _seal_held(self, more: bool) -> None:
        """Seal what the transaction holds (columns, then ops written op by op after them) as
        its next part, the last one unless ``more``."""
        site = self.site
        if self._cols:
            self._seal_part(more=more or bool(self.ops))
        if self.ops:
            if not self._parts:
                site.seal_pending()     # our older unsealed ops come first in the chain
            chain.seal(site.conn, site.family_id, site.site_id, self.ops, site.signer(),
                       more=more)
            self._parts += 1
            self.ops = []

    def split(self) -> None:
        """End this replication transaction and begin the next one inside the same store
        transaction: what was written so far travels as one unit, the rest as another (a
        block never cuts a transaction, and a block has limits)."""
        self.flush()
        self.hlc = next_hlc(self.hlc, self.site.clock())
        self.seq = 0

    def flush(self) -> None:
        """Record the ops written so far (changelog, vector, clock) inside the still-open
        transaction, so a snapshot cut in the same transaction sees them."""
        site = self.site
        if self._cols and not self._parts and self._cols_n < chain.SEAL_AT_COMMIT:
            self._settle_columns()      # small: to the changelog like any small transaction
        if self._cols or self._parts:
            self._seal_held(more=False)     # the last part
            matrix.set_epoch(site.conn, site.site_id, self.epoch)
            site.set_meta("hlc", self.hlc)
            self.ops, self._parts = [], 0
            return
        if not self.ops:
            return
        n_bytes = 0
        if len(self.ops) * (MAX_NAME_CHARS + codec.MAX_VALUE_BYTES) > chain.MAX_TXN_BYTES:
            # enough ops that they might exceed the limit: count (a few cannot)
            _o, _e, _h, _s, _c, keys_, values, _r = zip(*self.ops)
            n_bytes = sum(map(len, keys_)) + sum(map(len, filter(None, values)))
        if len(self.ops) > chain.MAX_TXN_OPS or n_bytes > chain.MAX_TXN_BYTES:
            raise TransactionTooLargeError(
                f"one transaction is limited to {chain.MAX_TXN_OPS} changes and "
                f"{chain.MAX_TXN_BYTES} bytes of keys and values (this one: {len(self.ops)} "
                f"changes, {n_bytes} bytes); nothing was written",
                hint="split the work into several transactions ('syncpack load' does so "
                     "itself)")
        if len(self.ops) >= chain.SEAL_AT_COMMIT:
            # A large transaction becomes its own block now: one row instead of one per op,
            # and an export later only copies it.  Older unsealed ops go first (the chain).
            site.seal_pending()
            chain.seal(site.conn, site.family_id, site.site_id, self.ops, site.signer())
            matrix.set_epoch(site.conn, site.site_id, self.epoch)
            site.set_meta("hlc", self.hlc)
        else:
            # The changelog rows carry our new epoch and clock (chain.own_tip): a small
            # transaction writes no vector or meta page.
            site.record_ops(self.ops)
        self.ops = []


def open_site(path: str | os.PathLike) -> Site:
    """Open a joined site for reading and local transactions."""
    return Site.open(path)
