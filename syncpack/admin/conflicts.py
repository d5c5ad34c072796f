"""Conflict list and resolution, collection policies, site priorities (docs/design.md §7).

A key is in conflict when more than one version survives (writes that did not see each other).
Resolving writes a new version at this site that supersedes every surviving one; it replicates
like any write, and a write concurrent with the resolution makes a new conflict instead of
being lost.
"""

from __future__ import annotations

from typing import Any

from syncpack.attach import core as attach_core
from syncpack.format import codec
from syncpack.rules.conflict import POLICIES, Version, pick
from syncpack.format.csn import csn_origin, format_csn
from syncpack.errors import UsageError
from syncpack.store import versions
from syncpack.replicated import COLLECTIONS, FAMILY, FAMILY_KEY, ROSTER, SYS_PREFIX, group_versions
from syncpack.site import Site, check_collection


def _describe(site: Site, coll: str, key: str, vs: list[Version]) -> dict:
    names = site.names()
    win = pick(vs, site.policy_of(coll), site.priorities())
    return {"collection": coll, "key": key, "policy": site.policy_of(coll),
            "visible": None if win is None or win.value is None else
            codec.decode_value(win.value),
            "versions": [{"version": format_csn(v.csn, names), "csn": v.csn.hex(),
                          "origin": names.get(csn_origin(v.csn), csn_origin(v.csn).hex()),
                          "deleted": v.deleted, "winner": v == win,
                          "value": None if v.value is None else codec.decode_value(v.value)}
                         for v in sorted(vs, key=lambda v: v.csn)]}


def list_conflicts(site: Site, collection: str | None = None) -> list[dict]:
    cur = versions.conflict_rows(site.conn, collection)
    found = [_describe(site, c, k, vs) for c, k, vs in group_versions(cur)
             if collection is not None or not c.startswith(SYS_PREFIX)]
    # Rows of attached tables that the application's schema refused (docs/attach.md).
    clashes = {(c, k): text for c, k, text in attach_core.clash_list(site, collection)}
    for d in found:
        d["constraint"] = clashes.pop((d["collection"], d["key"]), None)
    for (c, k), text in sorted(clashes.items()):
        d = _describe(site, c, k, site.versions(c, k))
        d["constraint"] = text
        found.append(d)
    found.sort(key=lambda d: (d["collection"], d["key"]))
    return found


def resolve(site: Site, collection: str, key: str, pick_version: str | None = None,
            value: Any = None, has_value: bool = False) -> dict:
    if (pick_version is None) == (not has_value):
        raise UsageError("give exactly one of --pick VERSION or --value JSON",
                         hint="'syncpack conflicts COLLECTION' lists the surviving versions")
    vs = site.versions(collection, key)
    if len(vs) < 2 and attach_core.clash_of(site, collection, key) is None:
        raise UsageError(f"{collection}/{key} is not in conflict",
                         hint=f"'syncpack conflicts {collection}' lists the keys in conflict")
    if pick_version is not None:
        names = site.names()
        chosen = [v for v in vs if pick_version in (format_csn(v.csn, names), v.csn.hex())]
        if not chosen:
            raise UsageError(f"{pick_version!r} is not a surviving version of {collection}/{key}",
                             hint="use a 'version' (or 'csn') shown by 'syncpack conflicts'")
        raw = chosen[0].value
    else:
        try:
            raw = codec.encode_value(value)
        except ValueError as e:
            raise UsageError(str(e), hint=getattr(e, "hint", None)) from None
    with site.transaction() as tx:
        tx.write_raw(collection, key, raw)   # supersedes every surviving version
    attach_core.sync_app(site)               # into an attached table (retrying a clash)
    return {"collection": collection, "key": key,
            "value": None if raw is None else codec.decode_value(raw),
            "deleted": raw is None, "superseded": len(vs)}


def create_collection(site: Site, name: str, policy: str) -> dict:
    check_collection(name)
    if policy not in POLICIES:
        raise UsageError(f"unknown policy {policy!r}; choose one of {', '.join(POLICIES)}",
                         hint="lww: the newest write wins; priority: the higher-priority site")
    if versions.collection_exists(site.conn, name, COLLECTIONS):
        raise UsageError(f"collection {name!r} already exists (policy "
                         f"{site.policy_of(name)})",
                         hint="the policy is chosen when a collection is first written")
    with site.transaction() as tx:
        tx.set_policy(name, policy)
    return {"collection": name, "policy": policy}


def list_collections(site: Site) -> list[dict]:
    names = {c for c in versions.collections(site.conn) if not c.startswith(SYS_PREFIX)}
    names |= set(site.policies())
    return [{"collection": n, "policy": site.policy_of(n)} for n in sorted(names)]


def set_priority(site: Site, member: str, priority: int) -> dict:
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
