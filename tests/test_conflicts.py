"""Conflicts (docs/design.md §7): per-key surviving versions, policies that converge whatever the
delivery order, a conflict list, and resolutions that replicate."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from conftest import Family, run
from syncpack.admin import conflicts, inspection
from syncpack.errors import UsageError
from syncpack.site import Site


def _visible(fam: Family, name: str) -> dict:
    with fam.open(name) as s:
        return {(c, k): v for c, k, v in s.records()}


def test_order_dependence_trap_priority_policy(family):
    # X, Y, Z have priorities 3, 2, 1.  x1 and y1 are concurrent; Z writes z1 having seen only
    # x1, so z1 supersedes x1 but not y1.  Comparing each arrival with the current value only
    # would let z1 win at the observer that sees it last (it "replaces" the current value) and
    # y1 win at the other; the surviving-set rule gives y1 at both, because y1 and z1 survive
    # and Y outranks Z.
    family.init("X", policy="priority", priority=3)
    family.add("Y", via="X", priority=2)
    family.add("Z", via="X", priority=1)
    family.add("A", via="X")
    family.add("B", via="X")
    # Everyone learns the full roster first.
    family.full_exchange()

    family.put("X", "parts", "k", "x1")
    family.put("Y", "parts", "k", "y1")
    family.sync("X", "Z")
    family.put("Z", "parts", "k", "z1")

    family.sync("X", "A")
    family.sync("Y", "A")
    family.sync("Z", "A")

    family.sync("X", "B")
    family.sync("Z", "B")
    family.sync("Y", "B")

    assert _visible(family, "A")[("parts", "k")] == "y1"
    assert _visible(family, "B")[("parts", "k")] == "y1"
    assert family.digest("A") == family.digest("B")
    with family.open("A") as a:
        found = conflicts.list_conflicts(a, "parts")
    assert [sorted(v["value"] for v in c["versions"]) for c in found] == [["y1", "z1"]]


def test_write_that_saw_the_version_is_not_a_conflict(family):
    family.init("a")
    family.add("b", via="a")
    family.put("a", "c", "k", 1)
    family.sync("a", "b")
    family.put("b", "c", "k", 2)      # b saw 1: supersedes it
    family.sync("b", "a")
    for s in "ab":
        with family.open(s) as site:
            assert site.get("c", "k") == 2
            assert conflicts.list_conflicts(site) == []


def test_late_concurrent_put_does_not_resurrect_silently(family):
    family.init("a")
    family.add("b", via="a")
    family.put("a", "c", "k", "old")
    family.sync("a", "b")
    with family.open("a") as s, s.transaction() as tx:
        tx.delete("c", "k")
    family.put("b", "c", "k", "concurrent")   # b has not seen the delete
    family.sync("a", "b")
    family.sync("b", "a")
    for s in "ab":
        with family.open(s) as site:
            found = conflicts.list_conflicts(site, "c")
            assert len(found) == 1
            kinds = sorted(v["deleted"] for v in found[0]["versions"])
            assert kinds == [False, True]   # the tombstone is a version too
    assert family.digest("a") == family.digest("b")


def test_resolution_replicates_and_stays_resolved(family, tmp_path):
    family.init("a")
    family.add("b", via="a")
    family.add("c", via="a")
    family.full_exchange()
    family.put("a", "col", "k", "from-a")
    family.put("b", "col", "k", "from-b")
    family.full_exchange()
    r = run("conflicts", "col", site=family.path("c"), json_mode=True)
    assert r.code == 0
    (c,) = r.json["conflicts"]
    assert set(c) >= {"collection", "key", "versions"}
    assert c["collection"] == "col" and c["key"] == "k"
    pick = next(v["version"] for v in c["versions"] if v["value"] == "from-a")
    r = run("conflicts", "resolve", "col", "k", "--pick", pick, site=family.path("c"))
    assert r.code == 0, r
    family.full_exchange()
    for s in "abc":
        with family.open(s) as site:
            assert site.get("col", "k") == "from-a"
            assert conflicts.list_conflicts(site) == []
            assert inspection.status(site)["conflicts"] == 0
    assert len({family.digest(s) for s in "abc"}) == 1


def test_resolution_concurrent_with_a_new_write_is_a_new_conflict(family):
    family.init("a")
    family.add("b", via="a")
    family.put("a", "col", "k", "a1")
    family.put("b", "col", "k", "b1")
    family.sync("a", "b")
    family.sync("b", "a")
    with family.open("a") as s:
        conflicts.resolve(s, "col", "k", value="resolved", has_value=True)
    family.put("b", "col", "k", "b2")    # b has not seen the resolution
    family.sync("a", "b")
    family.sync("b", "a")
    for s in "ab":
        with family.open(s) as site:
            (c,) = conflicts.list_conflicts(site, "col")
            assert sorted(v["value"] for v in c["versions"]) == ["b2", "resolved"]


def test_conflicts_survive_restart_and_cli_shapes(family):
    family.init("a")
    family.add("b", via="a")
    family.put("a", "col", "k", {"n": 1})
    family.put("b", "col", "k", {"n": 2})
    family.sync("a", "b")
    r = run("conflicts", site=family.path("b"), json_mode=True)
    assert r.code == 0 and len(r.json["conflicts"]) == 1
    versions = r.json["conflicts"][0]["versions"]
    assert {v["origin"] for v in versions} == {"a", "b"}
    assert all({"version", "origin", "csn", "value"} <= set(v) for v in versions)
    # A fresh process (the CLI reopens the store) sees the same list.
    assert run("conflicts", site=family.path("b"), json_mode=True).json == r.json
    s = run("status", site=family.path("b"), json_mode=True)
    assert s.json["conflicts"] == 1
    bad = run("conflicts", "resolve", "col", "k", "--pick", "nope", site=family.path("b"))
    assert bad.code == 1 and "error:" in bad.err
    none = run("conflicts", "resolve", "col", "other", "--value", "1", site=family.path("b"))
    assert none.code == 1 and "not in conflict" in none.err


def test_collection_policy_replicates_and_priority_change_replicates(family):
    family.init("hi", priority=1)
    family.add("lo", via="hi", priority=0)
    assert run("collection", "create", "inv", "--policy", "priority",
               site=family.path("lo")).code == 0
    again = run("collection", "create", "inv", "--policy", "lww", site=family.path("lo"))
    assert again.code == 1 and "already exists" in again.err
    family.full_exchange()
    family.put("hi", "inv", "k", "hi-value")
    family.put("lo", "inv", "k", "lo-value")   # later CSN, lower priority
    family.full_exchange()
    for s in ("hi", "lo"):
        with family.open(s) as site:
            assert site.policy_of("inv") == "priority"
            assert site.get("inv", "k") == "hi-value"
    assert run("priority", "lo", "5", site=family.path("hi")).code == 0
    family.full_exchange()
    for s in ("hi", "lo"):
        with family.open(s) as site:
            assert site.get("inv", "k") == "lo-value"
    assert family.digest("hi") == family.digest("lo")


ops = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.integers(0, 4), st.sampled_from("kl"),
                  st.integers(0, 9)),
        st.tuples(st.just("del"), st.integers(0, 4), st.sampled_from("kl"), st.just(0)),
        st.tuples(st.just("sync"), st.integers(0, 4), st.integers(0, 4), st.just(0)),
    ), min_size=4, max_size=30)


@settings(max_examples=20, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(policy=st.sampled_from(["lww", "priority"]), n_sites=st.integers(3, 5), steps=ops)
def test_random_concurrent_writes_converge(policy, n_sites, steps):
    with tempfile.TemporaryDirectory() as d:
        fam = Family(Path(d))
        names = [f"s{i}" for i in range(n_sites)]
        fam.init(names[0], policy=policy, priority=n_sites)
        for i, n in enumerate(names[1:], 1):
            fam.add(n, via=names[0], priority=n_sites - i)
        fam.full_exchange(rounds=1)
        for kind, a, key, val in steps:
            a %= n_sites
            if kind == "put":
                fam.put(names[a], "c", key, val)
            elif kind == "del":
                with fam.open(names[a]) as s, s.transaction() as tx:
                    tx.delete("c", key)
            else:
                b = key % n_sites   # for "sync" the third field is the target site
                if b != a:
                    fam.sync(names[a], names[b])
        fam.full_exchange(rounds=2)
        digests = {fam.digest(n) for n in names}
        assert len(digests) == 1
        visible = [_visible(fam, n) for n in names]
        assert all(v == visible[0] for v in visible)
        for n in names:
            with fam.open(n) as s:
                assert inspection.fsck(s)["ok"]


def test_a_priority_no_member_would_accept_is_refused_before_anything_is_written(family, tmp_path):
    """Every site refuses a roster entry whose priority is not a signed 32-bit integer, so a
    site that set one had every later packet refused for good: refused up front instead, by
    the command (a usage error) and by the library alike."""
    a = family.init("a")
    family.add("b", via="a")
    big = 1 << 31
    r = run("init", tmp_path / "c", "--family", "x", "--site", "c", "--priority", big)
    assert r.code == 2 and "range" in r.err and not (tmp_path / "c").exists()
    for p in (big, -big - 1, 10 ** 30):
        r = run("priority", "b", "--", p, site=a)
        assert r.code == 2 and "range" in r.err, r
    r = run("mkreplica", "export", "--site", "c", "--pubkey", tmp_path / "c.pub", "--out",
            tmp_path / "m", "--priority", big, site=a)
    assert r.code == 2 and "range" in r.err
    with family.open("a") as s:
        with pytest.raises(UsageError):
            conflicts.set_priority(s, "b", big)
        with pytest.raises(UsageError):
            Site.init_family(tmp_path / "d", "x", "d", "lww", big)
        assert not (tmp_path / "d").exists()
        assert s.roster()["b"].priority == 0
    # the range's ends are accepted and travel
    assert run("priority", "b", "--", -big, site=a).code == 0
    assert run("priority", "a", big - 1, site=a).code == 0
    family.full_exchange()
    with family.open("b") as s:
        assert (s.roster()["a"].priority, s.roster()["b"].priority) == (big - 1, -big)


def test_a_peers_bulk_update_of_keys_this_site_rewrote_reads_each_replaced_block_once(
        family, monkeypatch):
    """B rewrote every key of A's first transaction; A's second one replaces those same first
    versions, which B no longer holds, so B asks for each replaced op whether it has it.  The
    answer is in A's first block: read once, not once per key (4x the keys took 16x longer),
    and both rewrites stay, as concurrent versions of each key."""
    from syncpack.format import codec
    from syncpack.store import chain
    fam = family
    fam.init("A")
    fam.add("B", via="A")
    fam.full_exchange(2)
    n = chain.SEAL_AT_COMMIT + 200
    with fam.open("A") as s, s.transaction() as tx:
        for i in range(n):
            tx.put("t", f"k{i}", i)
    fam.sync("A", "B")
    with fam.open("B") as s, s.transaction() as tx:
        for i in range(n):
            tx.put("t", f"k{i}", -i)
    with fam.open("A") as s, s.transaction() as tx:
        for i in range(n):
            tx.put("t", f"k{i}", i + 1)
    reads: list[int] = []
    real_read = chain.block_bytes
    monkeypatch.setattr(chain, "block_bytes",
                        lambda conn, b: reads.append(1) or real_read(conn, b))
    fam.sync("A", "B")
    assert 0 < len(reads) <= 4
    fam.sync("B", "A")
    assert fam.digest("A") == fam.digest("B")
    with fam.open("B") as s:
        assert sorted(codec.decode_value(v.value) for v in s.versions("t", "k7")) == [-7, 8]


_json = st.recursive(st.none() | st.booleans() | st.integers(-2**63, 2**63 - 1)
                     | st.floats(allow_nan=False) | st.text(max_size=4),
                     lambda kids: st.lists(kids, max_size=3)
                     | st.dictionaries(st.text(max_size=3), kids, max_size=3), max_leaves=8)


@given(_json)
def test_a_value_is_identical_to_itself_and_not_to_its_look_alikes(v):
    from syncpack.format.values import identical
    assert identical(v, v)
    assert not identical({"v": 1}, {"v": 1.0}) and not identical([0.0], [-0.0])
    assert not identical(True, 1) and not identical({"a": [1]}, {"a": [True]})


def test_under_merge_one_version_of_1_and_1_0_is_the_visible_one(family):
    """Two sites set a field to 1 and to 1.0: a conflict of that field, rightly; but both
    versions were marked as the visible one (Python takes 1 for 1.0)."""
    family.init("a")
    family.add("b", via="a")
    family.full_exchange()
    assert run("collection", "create", "m", "--policy", "merge", site=family.path("a")).code == 0
    family.full_exchange()
    family.put("a", "m", "k", {"v": 1})
    family.put("b", "m", "k", {"v": 1.0})
    family.full_exchange()
    for n in ("a", "b"):
        doc = run("conflicts", "m", site=family.path(n), json_mode=True).json
        (c,) = doc["conflicts"]
        assert [f["field"] for f in c["fields"]] == ["v"]
        assert sum(v["winner"] for v in c["versions"]) == 1, c


def test_under_merge_of_two_concurrent_deletes_one_is_the_visible_one(family):
    """A delete makes the key a whole-record conflict, decided as under priority: one
    version shows.  Both deletes were marked the winner (each is None, as the visible
    value is)."""
    family.init("a", priority=5)
    family.add("b", via="a", priority=1)
    family.add("c", via="a", priority=3)
    family.full_exchange()
    assert run("collection", "create", "m", "--policy", "merge", site=family.path("a")).code == 0
    family.put("a", "m", "k", {"x": 0})
    family.full_exchange()
    for n in ("a", "b"):
        assert run("delete", "m", "k", site=family.path(n)).code == 0
    family.put("c", "m", "k", {"x": 9})
    family.full_exchange()
    for n in ("a", "b", "c"):
        doc = run("conflicts", "m", site=family.path(n), json_mode=True).json
        (c,) = doc["conflicts"]
        assert c["visible"] is None
        winners = [v["origin"] for v in c["versions"] if v["winner"]]
        assert winners == ["a"], c
