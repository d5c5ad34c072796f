"""Conflict list and resolution, collection policies, site priorities (docs/design.md §7).

A key is in conflict when more than one version survives (writes that did not see each other).
Resolving writes a new version at this site that supersedes every surviving one; it replicates
like any write, and a write concurrent with the resolution makes a new conflict instead of
being lost.
"""

from __future__ import annotations

from typing import Any

from syncpack.admin import writes
from syncpack.attach import core as attach_core
from syncpack.format import codec
from syncpack.format.values import identical
from syncpack.rules.conflict import POLICIES, Version, pick
from syncpack.format.csn import csn_origin, format_csn
from syncpack.errors import InvalidValueError, SyncpackError, UsageError, arg
from syncpack.store import attached, fields, versions
from syncpack.replicated import (COLLECTIONS, FAMILY, FAMILY_KEY, ROSTER, SYS_PREFIX,
                                 check_priority, group_versions)
from syncpack.site import Site, check_collection, encode_record_value


def _decoded(raw: bytes | None) -> Any:
    return None if raw is None else codec.shown_value(raw)


def _field_rows(site: Site, coll: str, key: str, vs: list[Version]
                ) -> tuple[list[dict], Any, bytes | None]:
    """The fields that differ between the surviving versions (each with the value every site
    holds and which one shows), the visible value, and the CSN of the version that shows
    whole (None where fields of several were merged, or nothing shows)."""
    names = site.names()
    policy = site.policy_of(coll)

    def who(csn: bytes) -> str:
        return names.get(csn_origin(csn), csn_origin(csn).hex())

    if policy == "merge":
        m = fields.merged(site.conn, coll, key, vs, site.priorities())
        if m is None or m.fields is None:
            win = None if m is None else m.whole
            visible = None if win is None else _decoded(
                next(v.value for v in vs if v.csn == win.csn))
            return _plain_fields(vs, win.csn if win else None, who, names), visible, \
                None if win is None else win.csn
        rows = [{"field": f, "values": [
                    {"site": who(st), "version": format_csn(st, names), "absent": b is None,
                     "value": None if b is None else codec.unpackb(b),
                     "winner": st == m.winners[f]} for st, b in cand.items()]}
                for f, cand in sorted(m.conflicts.items())]
        return rows, fields.decoded(m.fields), None
    win = pick(vs, policy, site.priorities())
    return _plain_fields(vs, None if win is None else win.csn, who, names), \
        None if win is None else _decoded(win.value), None if win is None else win.csn


def _plain_fields(vs: list[Version], win: bytes | None, who, names) -> list[dict]:
    """Fields whose values differ between versions that are all maps (a delete or a value that
    is not a map differs as a whole: no fields)."""
    maps = {v.csn: fields.to_fields(v.value) for v in vs}
    if any(m is None for m in maps.values()):
        return []
    out = []
    for f in sorted({f for m in maps.values() for f in m}):
        if len({m.get(f) for m in maps.values()}) > 1:
            out.append({"field": f, "values": [
                {"site": who(c), "version": format_csn(c, names), "absent": f not in m,
                 "value": codec.unpackb(m[f]) if f in m else None, "winner": c == win}
                for c, m in sorted(maps.items())]})
    return out


def _describe(site: Site, coll: str, key: str, vs: list[Version],
              force: bool = False) -> dict | None:
    names = site.names()
    policy = site.policy_of(coll)
    rows, visible, whole = _field_rows(site, coll, key, vs)
    if policy == "merge" and not force and not rows and all(v.value is not None for v in vs) and \
            all(fields.to_fields(v.value) is not None for v in vs):
        return None      # concurrent writes to different fields: merged, nothing to decide
    return {"collection": coll, "key": key, "policy": policy, "visible": visible,
            "fields": rows,
            "versions": [{"version": format_csn(v.csn, names), "csn": v.csn.hex(),
                          "origin": names.get(csn_origin(v.csn), csn_origin(v.csn).hex()),
                          "deleted": v.deleted,
                          # one version shows whole (every delete decodes to the
                          # same None: each was marked the winner); under merge, a
                          # record merged from several shows as each that equals it
                          "winner": v.csn == whole if whole is not None or
                          policy != "merge" else identical(_decoded(v.value), visible),
                          "value": _decoded(v.value)}
                         for v in sorted(vs, key=lambda v: v.csn)]}


def list_conflicts(site: Site, collection: str | None = None) -> list[dict]:
    cur = versions.conflict_rows(site.conn, collection)
    found = [d for d in (_describe(site, c, k, vs) for c, k, vs in group_versions(cur)
                         if collection is not None or not c.startswith(SYS_PREFIX))
             if d is not None]
    # Rows of attached tables that the application's schema refused (docs/attach.md).
    clashes = {(c, k): text for c, k, text in attach_core.clash_list(site, collection)}
    for d in found:
        d["constraint"] = clashes.pop((d["collection"], d["key"]), None)
    for (c, k), text in sorted(clashes.items()):
        d = _describe(site, c, k, site.versions(c, k), force=True)
        d["constraint"] = text
        found.append(d)
    found.sort(key=lambda d: (d["collection"], d["key"]))
    return found


def count_conflicts(site: Site) -> int:
    """Keys in conflict, as :func:`list_conflicts` counts them: those with concurrent
    versions (under ``merge``, a key whose concurrent writes changed different fields is
    merged, not in conflict) and rows an attached table's schema refused."""
    if "merge" not in site.policies().values() and site.family_policy() != "merge":
        return versions.count_conflicts(site.conn) + attached.lone_clashes(site.conn)
    return len(list_conflicts(site))


def _site_id(site: Site, name: str) -> bytes:
    return site.member_named(name).site_id


def resolve(site: Site, collection: str, key: str, pick_version: str | None = None,
            value: Any = None, has_value: bool = False,
            field_picks: list[str] | tuple[str, ...] = ()) -> dict:
    """Supersede every surviving version of a key with one chosen value: a surviving version
    or every conflicting field from one site (``pick_version``: a version or a site name),
    some fields from given sites (``field_picks``, ``FIELD=SITE``), or a new ``value``."""
    if has_value and (pick_version is not None or field_picks) or \
            not has_value and pick_version is None and not field_picks:
        raise UsageError("give --value JSON, or --pick VERSION|SITE and/or --field FIELD=SITE",
                         hint="'syncpack conflicts COLLECTION' lists the surviving versions")
    seen: set[str] = set()
    for fp in field_picks:      # malformed is a usage error whatever the key's state
        f, sep, who = fp.rpartition("=")   # a site name holds no "=", a field name may
        if not sep or not f or not who:
            raise InvalidValueError(f"--field {fp!r}: expected FIELD=SITE",
                                    hint="for example: --field qty=boston (see "
                                         "'syncpack conflicts' for the fields)")
        if f in seen:       # which of two sites was meant cannot be guessed
            raise InvalidValueError(f"--field {f!r} is given twice",
                                    hint="give each field once: --field FIELD=SITE")
        seen.add(f)
    key = site.key_as_shown(collection, key)
    # the application's changes first: one of this key's, captured after the resolve, would
    # be the newer write, and the key in conflict again
    failed = writes.capture_first(site, [collection])
    vs = site.versions(collection, key)
    if len(vs) < 2 and attach_core.clash_of(site, collection, key) is None:
        raise UsageError(f"{collection}/{key} is not in conflict",
                         hint=f"'syncpack conflicts {arg(collection)}' lists the keys in "
                              f"conflict")
    if has_value:
        raw = encode_record_value(value)       # what put takes, nothing else
        attach_core.check_values(site, collection, [(key, value)])
    else:
        raw = _chosen(site, collection, key, vs, pick_version, field_picks)
    with site.transaction() as tx:
        tx.write_raw(collection, key, raw)   # supersedes every surviving version
    # into an attached table (retrying a clash); said if the table refuses it, as for put
    warning = writes.into_attached(site, [collection], key, failed)
    return {"collection": collection, "key": key,
            "value": None if raw is None else codec.shown_value(raw),
            "deleted": raw is None, "superseded": len(vs), "warning": warning}


def _chosen(site: Site, collection: str, key: str, vs: list[Version], pick_version: str | None,
            field_picks) -> bytes | None:
    names = site.names()
    merge_policy = site.policy_of(collection) == "merge"
    m = fields.merged(site.conn, collection, key, vs, site.priorities()) if merge_policy \
        else None
    raw = _visible_raw(site, collection, key, vs, m)
    if pick_version is not None:
        chosen = [v for v in vs if pick_version in (format_csn(v.csn, names), v.csn.hex())]
        if chosen:
            raw = chosen[0].value
        else:
            sid = _pick_site(site, collection, key, pick_version)
            mine = sorted((v for v in vs if csn_origin(v.csn) == sid), key=lambda v: v.csn)
            if not mine and not (m is not None and m.fields is not None and any(
                    csn_origin(st) == sid for c in m.conflicts.values() for st in c)):
                raise UsageError(f"{pick_version!r} is neither a surviving version of "
                                 f"{collection}/{key} nor a site that wrote one",
                                 hint="use a 'version' or a site shown by 'syncpack conflicts'")
            if m is not None and m.fields is not None:
                # merged: every field in conflict takes this site's value, the rest stay
                raw = _with_fields(raw, m, {f: sid for f in m.conflicts})
            else:
                raw = mine[-1].value
    if field_picks:
        picks = {}
        held = set().union(*(fields.to_fields(v.value) or {} for v in vs if v.value is not None),
                           m.conflicts if m is not None and m.fields is not None else ())
        for fp in field_picks:
            f, _sep, who = fp.rpartition("=")
            if f not in held:
                # a misspelt field settled the conflict with the visible value, unasked
                raise UsageError(f"no surviving version of {collection}/{key} has a field "
                                 f"{f!r}; nothing was changed",
                                 hint="'syncpack conflicts' shows the fields that differ")
            picks[f] = _pick_site(site, collection, key, who)
        if raw is None or fields.to_fields(raw) is None:
            raise UsageError(f"{collection}/{key}: the chosen value is not a JSON object, so it "
                             f"has no fields to pick", hint="use --pick or --value")
        if m is not None and m.fields is not None:
            for f, sid in picks.items():
                holders = {csn_origin(st) for st in (m.conflicts.get(f) or {})}
                if f in m.conflicts and sid not in holders:
                    # the key was settled, everywhere, otherwise than asked
                    names = ", ".join(sorted(site.name_of(o) for o in holders))
                    raise UsageError(f"site {site.name_of(sid)} holds no value of its own for "
                                     f"field {f!r} of {collection}/{key} (its version keeps "
                                     f"the value it was based on); nothing was changed",
                                     hint=f"pick one of the sites that set it: {names}")
            raw = _with_fields(raw, m, picks)
        else:
            cur = fields.to_fields(raw)
            for f, sid in picks.items():
                mine = sorted((v for v in vs if csn_origin(v.csn) == sid), key=lambda v: v.csn)
                src = fields.to_fields(mine[-1].value) if mine else None
                if src is None:
                    raise UsageError(f"site {site.name_of(sid)} has no surviving version of "
                                     f"{collection}/{key} with fields")
                if f in src:
                    cur[f] = src[f]
                else:
                    cur.pop(f, None)
            raw = fields.from_fields(cur)
    return raw


def _pick_site(site: Site, collection: str, key: str, name: str) -> bytes:
    try:
        return _site_id(site, name)
    except SyncpackError:
        raise UsageError(f"{name!r} is neither a surviving version of {collection}/{key} nor a "
                         f"member of the family",
                         hint="use a 'version' or a site shown by 'syncpack conflicts'") from None


def _visible_raw(site: Site, collection: str, key: str, vs: list[Version], m) -> bytes | None:
    if m is not None:
        if m.fields is not None:
            return fields.from_fields(m.fields)
        return None if m.whole is None else next(v.value for v in vs if v.csn == m.whole.csn)
    win = pick(vs, site.policy_of(collection), site.priorities())
    return None if win is None else win.value


def _with_fields(raw: bytes | None, m, picks: dict[str, bytes]) -> bytes:
    """The merged record with each field of ``picks`` taken from that site's live value."""
    cur = fields.to_fields(raw) or {}
    for f, sid in picks.items():
        cand = {st: b for st, b in (m.conflicts.get(f) or {}).items() if csn_origin(st) == sid}
        if not cand:
            if f in m.conflicts:
                continue        # this site holds no value of its own for f
            raise UsageError(f"field {f!r} is not in conflict",
                             hint="'syncpack conflicts' shows the fields that differ")
        b = cand[max(cand)]
        if b is None:
            cur.pop(f, None)
        else:
            cur[f] = b
    return fields.from_fields(cur)


def create_collection(site: Site, name: str, policy: str) -> dict:
    check_collection(name)
    if policy not in POLICIES:
        raise UsageError(f"unknown policy {policy!r}; choose one of {', '.join(POLICIES)}",
                         hint="lww: the newest write wins; priority: the higher-priority site")
    if versions.collection_exists(site.conn, name, COLLECTIONS):
        raise UsageError(f"collection {name!r} already exists (policy "
                         f"{site.policy_of(name)})",
                         hint="a collection's policy is set by 'collection create' before its "
                              "first record (else it is the family's default) and never "
                              "changes, so that every site decides its conflicts alike; put "
                              "the records in a new collection created with the policy")
    with site.transaction() as tx:
        tx.set_policy(name, policy)
    return {"collection": name, "policy": policy}


def list_collections(site: Site) -> list[dict]:
    names = {c for c in versions.collections(site.conn) if not c.startswith(SYS_PREFIX)}
    names |= set(site.policies())
    return [{"collection": n, "policy": site.policy_of(n)} for n in sorted(names)]


def set_priority(site: Site, member: str, priority: int) -> dict:
    check_priority(priority)
    m = site.member_named(member)
    m.priority = priority
    with site.transaction(_system=True) as tx:
        tx.write_raw(ROSTER, m.name, codec.encode_value(m.to_value()))
    return {"site": m.name, "priority": priority}


def set_family_setting(site: Site, name: str, value: Any) -> dict:
    """Family-wide settings live in one replicated record (lww)."""
    settings = dict(site.family_settings())
    settings[name] = value
    with site.transaction(_system=True) as tx:
        tx.write_raw(FAMILY, FAMILY_KEY, codec.encode_value(settings))
    return {"family": site.family_name, "settings": settings}
