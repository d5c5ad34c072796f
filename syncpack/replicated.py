"""The family's replicated state as one site reads it: the visible value of each key under the
conflict policies, and syncpack's own replicated collections (the roster, the family settings,
the collections' policies) read through those visible values.

:class:`Site` delegates to a :class:`Replicated` it holds; the roster and the policies are
cached there until :meth:`Replicated.invalidate` (after changes to replicated settings)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from typing import Iterator

from syncpack.errors import IntegrityError, UndecodableRecordError, UsageError
from syncpack.format import codec
from syncpack.rules import roster as roster_rule
from syncpack.rules.conflict import Version, pick
from syncpack.store import fields, versions

SYS_PREFIX = "$"
ROSTER = "$roster"
FAMILY = "$family"
COLLECTIONS = "$collections"
TABLES = "$tables"               # definitions of attached application tables (docs/attach.md)
FAMILY_KEY = "settings"

# A member's priority is a signed 32-bit integer: every site refuses a roster entry holding
# another (formats/PACKET.md 4.3), so a site that set one would have its packets refused for good.
PRIORITY_MIN, PRIORITY_MAX = -(1 << 31), (1 << 31) - 1


def priority_ok(priority: object) -> bool:
    return type(priority) is int and PRIORITY_MIN <= priority <= PRIORITY_MAX


def check_priority(priority: int) -> None:
    """Refuse a priority no member would accept, before anything is written."""
    if not priority_ok(priority):
        raise UsageError(f"priority {priority} is outside {PRIORITY_MIN}..{PRIORITY_MAX}",
                         hint="a priority is a signed 32-bit integer; only their order counts, "
                              "so small numbers such as 10, 20, 30 do")


@dataclass
class Member:
    name: str
    site_id: bytes
    ed25519: bytes
    x25519: bytes
    priority: int
    base: dict[bytes, int]
    retired: bool
    # the member that keeps this one's name, but for case (rules/roster.name_clashes): read
    # as retired whatever its entry says (no write of the entry is offered for it: member_named
    # and reinstate refuse it)
    clashes_with: str = ""

    def to_value(self) -> dict:
        return {"id": self.site_id, "ed25519": self.ed25519, "x25519": self.x25519,
                "priority": self.priority, "base": [[o, e] for o, e in sorted(self.base.items())],
                "retired": self.retired}

    @classmethod
    def from_value(cls, name: str, v: dict) -> "Member":
        return cls(name, v["id"], v["ed25519"], v.get("x25519", b""), int(v.get("priority", 0)),
                   {o: e for o, e in v.get("base", [])}, bool(v.get("retired", False)))


CLASH_HINT = ("add that site again under a name no member holds, even in other case "
              "('syncpack keygen DIR --site NEWNAME', then 'syncpack mkreplica export'); or "
              "retire the member that keeps the name, and it passes back")


def clash_text(m: Member, family: str) -> str:
    """What to say of a member read as retired because another keeps its name but for case."""
    return (f"{m.name} shares its name, but for case, with member {m.clashes_with} of family "
            f"{family!r} (the two added at once at two sites, or one by a lie); every site "
            f"keeps {m.clashes_with} and reads {m.name} as retired: nothing is sent to it and "
            f"its packets are refused")


def decoded_versions(vs: list[Version]) -> list[tuple[bytes, object]]:
    """``(csn, value)`` of each version; None for a tombstone or bytes that are not a value
    (what the roster rules take: such a version retires no one)."""
    out = []
    for v in vs:
        try:
            out.append((v.csn, None if v.value is None else codec.decode_value(v.value)))
        except UndecodableRecordError:
            out.append((v.csn, None))
    return out


def roster_value(vs: list[Version]) -> bytes | None:
    """The visible value of a member's roster entry from its surviving versions: the newest
    one's, retired if any of them is, with the lowest of their bases (rules/roster.py).  Its
    newest version's bytes unless another version changes it, so a key without a conflict
    reads as it was signed."""
    newest = max(vs, key=lambda v: v.csn)
    if len(vs) == 1 or newest.value is None:
        return newest.value
    decoded = decoded_versions(vs)
    entry = roster_rule.entry(decoded)
    if entry is None or entry == dict(decoded)[newest.csn]:
        return newest.value
    return codec.encode_value(entry)


def group_versions(cur) -> Iterator[tuple[str, str, list[Version]]]:
    """(collection, key, versions) per key of (collection, key, csn, value) rows sorted by key."""
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


class Replicated:
    """Reads of one site's replicated state; every method takes the site's connection."""

    def __init__(self) -> None:
        self._roster: dict[str, Member] | None = None
        self._policies: dict[str, str] | None = None
        self._default: str | None = None

    def invalidate(self) -> None:
        """Forget cached roster and policies."""
        self._roster = None
        self._policies = None
        self._default = None

    def roster(self, conn) -> dict[str, Member]:
        """The family's members by name, retired ones included."""
        if self._roster is None:
            out: dict[str, Member] = {}
            for _c, key, raw in self.visible_rows(conn, ROSTER):
                try:
                    out[key] = Member.from_value(key, codec.decode_value(raw))
                except (KeyError, TypeError, ValueError):
                    continue
            clashes = roster_rule.name_clashes((m.name, m.site_id, m.retired)
                                                for m in out.values())
            for name, keeper in clashes.items():
                out[name] = replace(out[name], retired=True, clashes_with=keeper)
            self._roster = out
        return self._roster

    def priorities(self, conn) -> dict[bytes, int]:
        """Each member's priority under the ``priority`` policy, by site id."""
        return {m.site_id: m.priority for m in self.roster(conn).values()}

    def family_settings(self, conn) -> dict:
        """The family's replicated settings (name, policy, sealing rule)."""
        v = pick(versions.of_key(conn, FAMILY, FAMILY_KEY), "lww", {})
        try:
            settings = codec.decode_value(v.value) if v is not None and v.value is not None \
                else {}
        except UndecodableRecordError:
            # Read as no settings, a damaged store would drop the family's sealing rule;
            # and no put can replace a record of syncpack's
            raise IntegrityError(f"the family's settings ({FAMILY}/{FAMILY_KEY}) in this "
                                 f"store are damaged: {len(v.value)} bytes that are not a "
                                 f"value",
                                 hint="run 'syncpack fsck'; restore the site from a backup, "
                                      "or re-seed it with a snapshot") from None
        # Imports refuse malformed settings; a store that holds some anyway still opens.
        return settings if isinstance(settings, dict) else {}

    def policies(self, conn) -> dict[str, str]:
        """Collections that have their own conflict policy: name -> policy."""
        if self._policies is None:
            out = {}
            for _c, key, raw in self.visible_rows(conn, COLLECTIONS):
                try:
                    out[key] = codec.decode_value(raw)["policy"]
                except (KeyError, TypeError, ValueError):
                    continue
            self._policies = out
        return self._policies

    def policy_of(self, conn, collection: str) -> str:
        """The conflict policy that decides the visible version in ``collection``."""
        if collection.startswith(SYS_PREFIX):
            return "lww"
        own = self.policies(conn).get(collection)
        if own:
            return own
        if self._default is None:   # asked on every write, to know if it is a merge
            self._default = self.family_settings(conn).get("policy", "lww")
        return self._default

    def visible_rows(self, conn, collection: str | None = None
                     ) -> Iterator[tuple[str, str, bytes]]:
        """(collection, key, msgpack value) of visible records, sorted."""
        for coll, key, vs in group_versions(versions.rows(conn, collection)):
            # syncpack's own collections are lww whatever the family says: the priorities come
            # from the roster, which is read through here
            policy = "lww" if coll.startswith(SYS_PREFIX) else self.policy_of(conn, coll)
            if coll == ROSTER:
                raw = roster_value(vs)
                if raw is not None:
                    yield coll, key, raw
                continue
            if policy == "merge" and len(vs) > 1:
                raw = fields.visible_value(conn, coll, key, vs, self.priorities(conn))
                if raw is not None:
                    yield coll, key, raw
                continue
            v = vs[0] if len(vs) == 1 else pick(
                vs, policy, self.priorities(conn) if policy == "priority" else {})
            if v is not None and v.value is not None:
                yield coll, key, v.value

    def visible(self, conn, collection: str, key: str) -> bytes | None:
        """The visible value of ``collection``/``key`` (msgpack), or None."""
        vs = versions.of_key(conn, collection, key)
        if collection == ROSTER:
            return roster_value(vs) if vs else None
        policy = self.policy_of(conn, collection)
        if policy == "merge" and len(vs) > 1:
            return fields.visible_value(conn, collection, key, vs, self.priorities(conn))
        v = pick(vs, self.policy_of(conn, collection), self.priorities(conn)) if vs else None
        return None if v is None else v.value

    def digest(self, conn) -> tuple[str, int]:
        """See :meth:`syncpack.site.Site.digest`."""
        h = hashlib.sha256(b"syncpack digest v1\0")
        n = 0
        prio = self.priorities(conn)
        for coll, key, vs in group_versions(versions.rows_by_csn(conn)):
            if len(vs) == 1 and vs[0].value is None:
                continue
            policy = self.policy_of(conn, coll)
            if coll == ROSTER:
                visible = roster_value(vs)
            elif policy == "merge" and len(vs) > 1:
                visible = fields.visible_value(conn, coll, key, vs, prio)
            else:
                v = pick(vs, policy, prio)
                visible = v.value if v is not None else None
            if visible is not None and not coll.startswith(SYS_PREFIX):
                n += 1
            h.update(codec.packb([coll, key, [[x.csn, x.value] for x in vs], visible]))
        return h.hexdigest(), n
