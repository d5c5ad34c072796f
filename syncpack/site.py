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

import fcntl
import hashlib
import os
import secrets
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from syncpack.format import codec, keys
from syncpack.store import chain, db
from syncpack.format.codec import Op, Record
from syncpack.rules.conflict import POLICIES, Version, pick
from syncpack.format.csn import CSN_LEN, next_hlc, pack_csn
from .errors import (InvalidNameError, InvalidValueError, LockedError, NotJoinedError, RecordNotFound,
                     RecoveringError, SiteClosedError, SiteError, TransactionTooLargeError,
                     UsageError)
from syncpack.format.names import check_site_name
from syncpack.format.values import check_json_value

SYS_PREFIX = "$"
ROSTER = "$roster"
FAMILY = "$family"
COLLECTIONS = "$collections"
FAMILY_KEY = "settings"
PARKED_DIR = "parked"
LOCK_FILE = "lock"


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass
class Member:
    name: str
    site_id: bytes
    ed25519: bytes
    x25519: bytes
    priority: int
    base: dict[bytes, int]
    retired: bool

    def to_value(self) -> dict:
        return {"id": self.site_id, "ed25519": self.ed25519, "x25519": self.x25519,
                "priority": self.priority, "base": [[o, e] for o, e in sorted(self.base.items())],
                "retired": self.retired}

    @classmethod
    def from_value(cls, name: str, v: dict) -> "Member":
        return cls(name, v["id"], v["ed25519"], v.get("x25519", b""), int(v.get("priority", 0)),
                   {o: e for o, e in v.get("base", [])}, bool(v.get("retired", False)))


MAX_NAME_CHARS = 16 * 1024       # collections and keys; readers accept far more


def check_collection(name: str) -> None:
    if not isinstance(name, str) or not name:
        raise InvalidNameError("a collection name must be a non-empty string")
    if len(name) > MAX_NAME_CHARS:
        raise InvalidNameError(f"a collection name is limited to {MAX_NAME_CHARS} characters")
    if name.startswith(SYS_PREFIX):
        raise InvalidNameError(f"collection names starting with '{SYS_PREFIX}' are reserved "
                               f"for syncpack itself: {name!r}")


def _check_key(key: str) -> None:
    # the same rule as for collection names: an empty key is as unusable (it cannot be typed
    # back on a command line, and 'ls' shows nothing for it)
    if not isinstance(key, str) or not key:
        raise InvalidNameError("a key must be a non-empty string")
    if len(key) > MAX_NAME_CHARS:
        raise InvalidNameError(f"a key is limited to {MAX_NAME_CHARS} characters")


class Site:
    """An open site directory.  Not thread-safe; open one per thread or process."""

    def __init__(self, path: Path, conn: db.Connection, clock: Callable[[], int] = wall_ms):
        self.path = Path(path)
        self.conn = conn
        self.clock = clock
        m = dict(conn.execute("SELECT key, value FROM meta"))
        if "site_id" not in m:
            raise SiteError(f"{self.path} holds an incomplete store (no site identity)",
                            hint="remove the directory and create the site again")
        self.site_id: bytes = m["site_id"]
        self.name: str = m["site_name"]
        self.joined = bool(m.get("joined", 0))
        self.family_id: bytes | None = m.get("family_id")
        self._roster: dict[str, Member] | None = None
        self._policies: dict[str, str] | None = None
        self._sign: Callable[[bytes], bytes] | None = None

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
        check_site_name(site)
        p = Path(path)
        if p.exists() and (not p.is_dir() or any(p.iterdir())):
            raise SiteError(f"{p} already exists and is not an empty directory",
                            hint="choose a new directory for the site")
        p.mkdir(parents=True, exist_ok=True)
        (p / PARKED_DIR).mkdir(exist_ok=True)
        site_id = secrets.token_bytes(8)
        ident = keys.generate(p, site, site_id)
        conn = db.create(p / db.DB_NAME)
        with db.write_txn(conn):
            conn.executemany("INSERT INTO meta VALUES (?, ?)", [
                ("site_id", site_id), ("site_name", site), ("joined", 0), ("hlc", 0),
                ("state", "normal"), ("created_ms", wall_ms())])
            conn.execute("INSERT INTO vector(origin, epoch) VALUES (?, 0)", (site_id,))
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
        if not family:
            raise UsageError("the family needs a name", hint="init DIR --family NAME --site NAME")
        p, conn, ident = cls._create_dir(Path(path), site)
        fam_id = secrets.token_bytes(16)
        with db.write_txn(conn):
            conn.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)",
                             [("family_id", fam_id), ("family_name", family), ("joined", 1)])
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
        row = self.conn.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return row[0] if row else default

    def set_meta(self, key: str, value: Any) -> None:
        """Set a metadata value; the caller holds a write transaction."""
        self.conn.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))

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
        self._roster = None
        self._policies = None

    def roster(self) -> dict[str, Member]:
        """The family's members by name, retired ones included."""
        if self._roster is None:
            out: dict[str, Member] = {}
            for _c, key, raw in self._visible_rows(ROSTER):
                try:
                    out[key] = Member.from_value(key, codec.decode_value(raw))
                except (KeyError, TypeError, ValueError):
                    continue
            self._roster = out
        return self._roster

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
        if m is None or m.retired:
            known = ", ".join(sorted(n for n, x in self.roster().items() if not x.retired))
            raise UsageError(f"no member named {name!r} in family {self.family_name!r}",
                             hint=f"members: {known}")
        return m

    def family_policy(self) -> str:
        """The family's default conflict policy (``lww`` or ``priority``)."""
        return self.family_settings().get("policy", "lww")

    def family_settings(self) -> dict:
        """The family's replicated settings (name, policy, sealing rule)."""
        v = pick(self._versions(FAMILY, FAMILY_KEY), "lww", {})
        settings = codec.decode_value(v.value) if v is not None and v.value is not None else {}
        # Imports refuse malformed settings; a store that holds some anyway still opens.
        return settings if isinstance(settings, dict) else {}

    def requires_sealing(self) -> bool:
        """Whether the family requires every packet to be sealed to its recipient."""
        return bool(self.family_settings().get("require_sealed", False))

    def policies(self) -> dict[str, str]:
        """Collections that have their own conflict policy: name -> policy."""
        if self._policies is None:
            out = {}
            for _c, key, raw in self._visible_rows(COLLECTIONS):
                try:
                    out[key] = codec.decode_value(raw)["policy"]
                except (KeyError, TypeError, ValueError):
                    continue
            self._policies = out
        return self._policies

    def policy_of(self, collection: str) -> str:
        """The conflict policy that decides the visible version in ``collection``."""
        if collection.startswith(SYS_PREFIX):
            return "lww"
        return self.policies().get(collection) or self.family_policy()

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
        return {m.site_id: m.priority for m in self.roster().values()}

    # -- reading -------------------------------------------------------------------------------

    def _versions(self, collection: str, key: str) -> list[Version]:
        return [Version(c, v is None, v) for c, v in self.conn.execute(
            "SELECT csn, value FROM versions WHERE collection=? AND key=?", (collection, key))]

    def _visible_rows(self, collection: str | None = None) -> Iterator[tuple[str, str, bytes]]:
        """(collection, key, msgpack value) of visible records, sorted."""
        if collection is None:
            cur = self.conn.execute(
                "SELECT collection, key, csn, value FROM versions ORDER BY collection, key")
        else:
            cur = self.conn.execute("SELECT collection, key, csn, value FROM versions "
                                    "WHERE collection=? ORDER BY key", (collection,))
        for coll, key, vs in group_versions(cur):
            # syncpack's own collections are lww whatever the family says: the priorities come
            # from the roster, which is read through here
            policy = "lww" if coll.startswith(SYS_PREFIX) else self.policy_of(coll)
            v = vs[0] if len(vs) == 1 else pick(
                vs, policy, self.priorities() if policy == "priority" else {})
            if v is not None and v.value is not None:
                yield coll, key, v.value

    def get(self, collection: str, key: str, default: Any = RecordNotFound) -> Any:
        """The visible value of ``collection``/``key``.  Raises :class:`RecordNotFound`
        when there is none, unless a ``default`` is given."""
        vs = self._versions(collection, key)
        v = pick(vs, self.policy_of(collection), self.priorities()) if vs else None
        if v is None or v.value is None:
            if default is RecordNotFound:
                raise RecordNotFound(f"no record {collection}/{key}")
            return default
        return codec.decode_value(v.value)

    def records(self, collection: str | None = None,
                include_system: bool = False) -> Iterator[tuple[str, str, Any]]:
        """``(collection, key, value)`` of every visible record, sorted; one collection
        or all (syncpack's own ``$`` collections only with ``include_system``)."""
        for coll, key, raw in self._visible_rows(collection):
            if coll.startswith(SYS_PREFIX) and not include_system and collection is None:
                continue
            yield coll, key, codec.decode_value(raw)

    def vector(self) -> dict[bytes, int]:
        """This site's vector: origin site id -> highest epoch held."""
        return {o: e for o, e in self.conn.execute("SELECT origin, epoch FROM vector")}

    def floors(self) -> dict[bytes, int]:
        """Per origin, the highest epoch no longer in the changelog (trimmed or seeded)."""
        return {o: f for o, f in self.conn.execute("SELECT origin, floor FROM vector")}

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
        h = hashlib.sha256(b"syncpack digest v1\0")
        n = 0
        cur = self.conn.execute(
            "SELECT collection, key, csn, value FROM versions ORDER BY collection, key, csn")
        prio = self.priorities()
        for coll, key, vs in group_versions(cur):
            if len(vs) == 1 and vs[0].value is None:
                continue
            v = pick(vs, self.policy_of(coll), prio)
            visible = v.value if v is not None else None
            if visible is not None and not coll.startswith(SYS_PREFIX):
                n += 1
            h.update(codec.packb([coll, key, [[x.csn, x.value] for x in vs], visible]))
        return h.hexdigest(), n

    # -- writing -------------------------------------------------------------------------------

    @contextmanager
    def transaction(self, _system: bool = False) -> Iterator["Transaction"]:
        """One local transaction: ``with site.transaction() as tx: tx.put(...)``.

        Every put and delete in the block commits together, or none does if the block
        raises; refused while the site is recovering from a restore."""
        if not self.joined:
            raise NotJoinedError(f"site {self.name!r} has not joined a family yet")
        if self.state == "recovering" and not _system:
            raise RecoveringError(
                f"site {self.name!r} is recovering from a restore and refuses local writes "
                f"until its own ops have come back from its peers",
                hint="import packets from the peers ('syncpack status' shows what is missing)")
        with self.write_txn():
            tx = Transaction(self, _system)
            yield tx
            tx.flush()
        if tx.touched_system:
            self.invalidate()

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
    def lock(self) -> Iterator[None]:
        """Serialises packet work (export, import, mkreplica, scrub) on one site."""
        fd = os.open(self.path / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise LockedError(f"another syncpack command is working on site "
                                  f"{self.name!r}") from None
            yield
        finally:
            os.close(fd)

    # -- op application (shared by local writes, imports and fsck's replay) --------------------

    def apply_version(self, op: Op, csn: bytes) -> None:
        """Make ``op`` a surviving version of its key unless a known write superseded it, and
        drop the versions it superseded."""
        cur = self.conn
        if op.replaced:
            for i in range(0, len(op.replaced), CSN_LEN):
                r = op.replaced[i:i + CSN_LEN]
                cur.execute("DELETE FROM versions WHERE collection=? AND key=? AND csn=?",
                            (op.collection, op.key, r))
                n = cur.changes()
                if n == 0 and not self._op_known(r):
                    # Keyed by the key too: an op can only supersede versions of its own key,
                    # whatever CSNs it lists (a member listing another key's must not hide it).
                    cur.execute("INSERT OR IGNORE INTO superseded VALUES (?, ?, ?)",
                                (op.collection, op.key, r))
        cur.execute("DELETE FROM superseded WHERE collection=? AND key=? AND csn=?",
                    (op.collection, op.key, csn))
        if cur.changes():
            return
        cur.execute("INSERT INTO versions VALUES (?, ?, ?, ?)",
                    (op.collection, op.key, csn, op.value))

    def _op_known(self, csn: bytes) -> bool:
        hlc, origin, seq = int.from_bytes(csn[:8], "big"), csn[8:16], int.from_bytes(csn[16:], "big")
        # An op trimmed from the changelog was applied before; it can never arrive again.
        return chain.epoch_of(self.conn, hlc, origin, seq) is not None

    def signer(self) -> Callable[[bytes], bytes]:
        """This site's Ed25519 signing function (read from its key file once)."""
        if self._sign is None:
            self._sign = keys.load_signing_key(self.path).sign
        return self._sign

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
        self.conn.executemany(
            "INSERT INTO changelog VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            [(o.origin, o.epoch, o.hlc, o.seq, o.collection, o.key, o.value, o.replaced)
             for o in ops])

    def iter_changelog(self, origin: bytes, lo: int, hi: int) -> Iterator[Op]:
        """Ops of ``origin`` with epochs in (lo, hi] we hold, in epoch (= CSN) order."""
        return chain.iter_ops(self.conn, origin, lo, hi)

    def iter_versions(self) -> Iterator[Record]:
        """Every surviving version of every key, in (collection, key, CSN) order."""
        for row in self.conn.execute(
                "SELECT collection, key, csn, value FROM versions ORDER BY collection, key, csn"):
            yield Record(*row)

    def parked_dir(self) -> Path:
        """The directory that keeps parked packets (created if missing)."""
        d = self.path / PARKED_DIR
        d.mkdir(exist_ok=True)
        return d


class _ClosedStore:
    """Stands in for the connection of a closed site, so any use says so clearly (instead of
    the driver's closed-connection error)."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str):
        raise SiteClosedError(f"site {self._name!r} has been closed")


def group_versions(cur) -> Iterator[tuple[str, str, list[Version]]]:
    cur_key = None
    vs: list[Version] = []
    for coll, key, csn, value in cur:
        k = (coll, key)
        if k != cur_key:
            if cur_key is not None:
                yield cur_key[0], cur_key[1], vs
            cur_key, vs = k, []
        vs.append(Version(csn, value is None, value))
    if cur_key is not None:
        yield cur_key[0], cur_key[1], vs


class Transaction:
    """Puts and deletes of one local transaction; see :meth:`Site.transaction`."""

    def __init__(self, site: Site, system: bool):
        self.site = site
        self.system = system
        c = site.conn
        self.hlc = next_hlc(int(site.meta("hlc", 0)), site.clock())
        self.epoch = c.execute("SELECT epoch FROM vector WHERE origin=?",
                               (site.site_id,)).fetchone()[0]
        self.ops: list[Op] = []
        self.seq = 0
        self.touched_system = False

    def put(self, collection: str, key: str, value: Any) -> None:
        """Write ``value`` (plain JSON: see :mod:`syncpack.format.values`) under
        ``collection``/``key``.  Raises :class:`InvalidValueError` (a :class:`SyncpackError`)
        for anything else, and :class:`UsageError` for a bad collection or key."""
        check_collection(collection)
        _check_key(key)
        check_json_value(value)
        try:
            raw = codec.encode_value(value)
        except ValueError as e:
            raise InvalidValueError(str(e)) from None
        if len(raw) > codec.MAX_VALUE_BYTES:
            raise InvalidValueError(f"a value is limited to {codec.MAX_VALUE_BYTES} bytes encoded "
                             f"(this one is {len(raw)}); peers would refuse it")
        self.write_raw(collection, key, raw)

    def delete(self, collection: str, key: str) -> None:
        """Delete ``collection``/``key`` (a tombstone is recorded even if it is absent,
        so the delete still wins over older concurrent writes)."""
        check_collection(collection)
        _check_key(key)
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
        if collection.startswith(SYS_PREFIX):
            self.touched_system = True
        seq = self.seq
        self.seq += 1
        self.epoch += 1
        replaced = b"".join(r[0] for r in site.conn.execute(
            "SELECT csn FROM versions WHERE collection=? AND key=? ORDER BY csn",
            (collection, key)))
        op = Op(site.site_id, self.epoch, self.hlc, seq, collection, key, raw, replaced)
        csn = pack_csn(self.hlc, site.site_id, seq)
        if replaced:
            site.conn.execute("DELETE FROM versions WHERE collection=? AND key=?",
                              (collection, key))
        site.conn.execute("INSERT INTO versions VALUES (?, ?, ?, ?)", (collection, key, csn, raw))
        self.ops.append(op)

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
        if not self.ops:
            return
        site = self.site
        n_bytes = sum(len(o.key) + len(o.value or b"") for o in self.ops)
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
        else:
            site.record_ops(self.ops)
        site.conn.execute("UPDATE vector SET epoch=? WHERE origin=?", (self.epoch, site.site_id))
        site.set_meta("hlc", self.hlc)
        self.ops = []


def open_site(path: str | os.PathLike) -> Site:
    """Open a joined site for reading and local transactions."""
    return Site.open(path)
