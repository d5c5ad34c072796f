"""The ``merge`` policy (docs/design.md §7): concurrent writes to different fields of a JSON
record both survive at every site in any delivery order; the same field picks by priority then
CSN and is listed by ``conflicts`` naming the field; ``conflicts resolve`` works whole or per
field."""

from __future__ import annotations

import itertools
import json
import random

import pytest
from hypothesis import given, settings, strategies as st

from conftest import Family, run
from syncpack.format import codec
from syncpack.format.csn import pack_csn
from syncpack.rules.merge import FieldVersion, merge, own_stamps, stamp_write

SITES = ("a", "b", "c")


# --- the pure rule --------------------------------------------------------------------------

def _f(d: dict) -> dict[str, bytes]:
    return {k: codec.packb(v) for k, v in d.items()}


FIELDS = "pqrs"
writes = st.lists(st.tuples(st.integers(0, 4),                     # writer site
                            st.dictionaries(st.sampled_from(FIELDS + "t"),
                                            st.one_of(st.integers(0, 3), st.none()),
                                            max_size=3),          # fields set (None: removed)
                            st.booleans()),                         # based on base or on a sibling
                  min_size=1, max_size=6)


@settings(max_examples=200, deadline=None)
@given(ws=writes, prio=st.dictionaries(st.integers(0, 4), st.integers(0, 2)), seed=st.integers())
def test_merge_is_a_function_of_the_set_of_versions(ws, prio, seed):
    """Writes made concurrently over one base (some over a sibling they saw): whatever order
    the surviving versions come in, the merge is the same; a field only one write changed
    shows that write's value; a field several changed shows the one ranked highest."""
    origin = lambda i: bytes([i + 1]) * 8
    base_csn = pack_csn(1, origin(0), 0)
    base = _f({f: 0 for f in FIELDS})
    base_v = FieldVersion(base_csn, base, own_stamps(base_csn, base))
    made: list[FieldVersion] = []
    parents = {}
    replaced_by_any = set()
    for n, (who, change, on_sibling) in enumerate(ws):
        over = made[-1] if on_sibling and made else base_v
        new = dict(over.fields)
        for f, v in change.items():
            if v is None:
                new.pop(f, None)
            else:
                new[f] = codec.packb(v)
        csn = pack_csn(10 + n, origin(who), n)
        made.append(FieldVersion(csn, new, stamp_write(csn, new, over.fields, over.stamps)))
        parents[csn] = [over.csn]
        replaced_by_any.add(over.csn)
    surviving = [v for v in made if v.csn not in replaced_by_any] or [base_v]
    priorities = {origin(k): p for k, p in prio.items()}
    want = merge(surviving, priorities, parents)
    rng = random.Random(seed)
    for _ in range(3):
        shuffled = surviving[:]
        rng.shuffle(shuffled)
        assert merge(shuffled + shuffled[:1], priorities, parents) == want
    # A field set by exactly one surviving lineage shows that value.
    for f in FIELDS:
        owners = {v.stamps.get(f) for v in surviving}
        if len(owners) == 1:
            assert want.fields.get(f) == surviving[0].fields.get(f)
    assert set(want.conflicts) <= set(FIELDS + "t")


def test_merge_of_two_edits_of_different_fields_and_of_one_field():
    o1, o2 = b"\x01" * 8, b"\x02" * 8
    x = pack_csn(1, o1, 0)
    base = _f({"qty": 1, "bin": "A"})
    st0 = own_stamps(x, base)
    v1c, v2c = pack_csn(5, o1, 0), pack_csn(6, o2, 0)
    v1 = FieldVersion(v1c, _f({"qty": 2, "bin": "A"}),
                      stamp_write(v1c, _f({"qty": 2, "bin": "A"}), base, st0))
    v2 = FieldVersion(v2c, _f({"qty": 1, "bin": "B"}),
                      stamp_write(v2c, _f({"qty": 1, "bin": "B"}), base, st0))
    par = {v1c: [x], v2c: [x]}
    m = merge([v2, v1], parents=par)
    assert m.fields == _f({"qty": 2, "bin": "B"}) and not m.conflicts
    v3 = FieldVersion(v2c, _f({"qty": 3, "bin": "A"}),
                      stamp_write(v2c, _f({"qty": 3, "bin": "A"}), base, st0))
    m = merge([v1, v3], parents=par)
    assert m.fields == _f({"qty": 3, "bin": "A"}) and list(m.conflicts) == ["qty"]
    m = merge([v1, v3], {o1: 1}, par)        # priority before CSN
    assert m.fields == _f({"qty": 2, "bin": "A"}) and list(m.conflicts) == ["qty"]
    tomb = FieldVersion(v2c, None, {})
    m = merge([v1, tomb], parents=par)               # a delete against a field change: whole record
    assert m.fields is None and m.whole == tomb


# --- three sites through the CLI ------------------------------------------------------------

def _cli_sync(fam: Family, a: str, b: str) -> None:
    out = fam.medium()
    r = run("export", "--to", b, "--out", out, site=fam.path(a))
    assert r.code == 0, r
    r = run("import", out, site=fam.path(b))
    assert r.code == 0, r


def _three(fam: Family, prio_b: int = 0) -> None:
    fam.init("a")
    fam.add("b", via="a", priority=prio_b)
    fam.add("c", via="a")
    assert run("collection", "create", "parts", "--policy", "merge", site=fam.path("a")).code == 0
    assert run("put", "parts", "p-1", json.dumps({"qty": 1, "bin": "A", "name": "bolt"}),
               site=fam.path("a")).code == 0
    fam.full_exchange(rounds=1)


def _get(fam: Family, s: str):
    r = run("get", "parts", "p-1", site=fam.path(s), json_mode=True)
    assert r.code == 0, r
    return r.json["value"]


def _deliver(fam: Family, order) -> None:
    for a, b in order:
        _cli_sync(fam, a, b)
    fam.full_exchange(rounds=1)


ORDERS = [
    [("a", "b"), ("b", "c")],          # c learns both via b
    [("b", "c"), ("a", "c")],          # c learns b's then a's
    [("a", "c"), ("b", "c")],          # the other way round
    [("c", "a"), ("b", "a"), ("a", "c")],
]


@pytest.mark.parametrize("order", ORDERS)
def test_concurrent_edits_of_different_fields_both_survive_everywhere(tmp_path, order):
    fam = Family(tmp_path)
    _three(fam)
    assert run("put", "parts", "p-1", json.dumps({"qty": 7, "bin": "A", "name": "bolt"}),
               site=fam.path("a")).code == 0
    assert run("put", "parts", "p-1", json.dumps({"qty": 1, "bin": "Z", "name": "bolt"}),
               site=fam.path("b")).code == 0
    assert run("put", "parts", "p-1", json.dumps({"qty": 1, "bin": "A", "name": "nut",
                                                   "new": True}), site=fam.path("c")).code == 0
    _deliver(fam, order)
    for s in SITES:
        assert _get(fam, s) == {"qty": 7, "bin": "Z", "name": "nut", "new": True}, s
        r = run("conflicts", site=fam.path(s), json_mode=True)
        assert r.code == 0 and r.json["conflicts"] == [], r
    assert len({fam.digest(s) for s in SITES}) == 1
    # The next write at any site sees the merged record and supersedes every version.
    assert run("put", "parts", "p-1", json.dumps({"qty": 8, "bin": "Z", "name": "nut"}),
               site=fam.path("c")).code == 0
    fam.full_exchange(rounds=1)
    for s in SITES:
        assert _get(fam, s) == {"qty": 8, "bin": "Z", "name": "nut"}
    assert len({fam.digest(s) for s in SITES}) == 1


@pytest.mark.parametrize("order", ORDERS[:3])
def test_same_field_edits_pick_by_policy_and_name_the_field(tmp_path, order):
    fam = Family(tmp_path)
    _three(fam, prio_b=1)         # b outranks a whatever the clocks say
    run("put", "parts", "p-1", json.dumps({"qty": 5, "bin": "A", "name": "bolt"}),
        site=fam.path("b"))
    run("put", "parts", "p-1", json.dumps({"qty": 9, "bin": "A", "name": "washer"}),
        site=fam.path("a"))
    _deliver(fam, order)
    for s in SITES:
        assert _get(fam, s) == {"qty": 5, "bin": "A", "name": "washer"}, s
        r = run("conflicts", site=fam.path(s), json_mode=True)
        (c,) = r.json["conflicts"]
        assert [f["field"] for f in c["fields"]] == ["qty"]
        vals = {x["site"]: (x["value"], x["winner"]) for x in c["fields"][0]["values"]}
        assert vals == {"a": (9, False), "b": (5, True)}
        text = run("conflicts", site=fam.path(s))
        assert "field qty" in text.out
    assert len({fam.digest(s) for s in SITES}) == 1
    # Resolve per field at c: qty from a; the other field edits stay.
    r = run("conflicts", "resolve", "parts", "p-1", "--field", "qty=a", site=fam.path("c"),
            json_mode=True)
    assert r.code == 0, r
    fam.full_exchange(rounds=1)
    for s in SITES:
        assert _get(fam, s) == {"qty": 9, "bin": "A", "name": "washer"}
        assert run("conflicts", site=fam.path(s), json_mode=True).json["conflicts"] == []
    assert len({fam.digest(s) for s in SITES}) == 1


def test_resolve_pick_site_and_delete_against_edit(tmp_path):
    fam = Family(tmp_path)
    _three(fam)
    run("put", "parts", "p-1", json.dumps({"qty": 5, "bin": "A", "name": "bolt"}),
        site=fam.path("b"))
    run("put", "parts", "p-1", json.dumps({"qty": 9, "bin": "C", "name": "bolt"}),
        site=fam.path("a"))
    fam.full_exchange(rounds=1)
    r = run("conflicts", "resolve", "parts", "p-1", "--pick", "b", site=fam.path("a"))
    assert r.code == 0, r
    fam.full_exchange(rounds=1)
    for s in SITES:
        # qty was in conflict: b's side; bin only a changed: stays
        assert _get(fam, s) == {"qty": 5, "bin": "C", "name": "bolt"}
    bad = run("conflicts", "resolve", "parts", "p-1", "--field", "qty", site=fam.path("a"))
    assert bad.code == 2 and "Traceback" not in bad.err     # malformed, as documented
    # A delete concurrent with a field change is a whole-record conflict, listed as today.
    assert run("delete", "parts", "p-1", site=fam.path("a")).code == 0
    run("put", "parts", "p-1", json.dumps({"qty": 6, "bin": "C", "name": "bolt"}),
        site=fam.path("c"))
    fam.full_exchange(rounds=1)
    for s in SITES:
        (c,) = run("conflicts", site=fam.path(s), json_mode=True).json["conflicts"]
        assert sorted(v["deleted"] for v in c["versions"]) == [False, True]
        assert c["fields"] == []
    assert len({fam.digest(s) for s in SITES}) == 1


def test_status_counts_only_keys_to_decide(tmp_path):
    fam = Family(tmp_path)
    _three(fam)
    run("put", "parts", "p-1", json.dumps({"qty": 5, "bin": "A", "name": "bolt"}),
        site=fam.path("b"))
    run("put", "parts", "p-1", json.dumps({"qty": 1, "bin": "C", "name": "bolt"}),
        site=fam.path("a"))
    fam.full_exchange(rounds=1)
    assert run("status", site=fam.path("c"), json_mode=True).json["conflicts"] == 0
    assert _get(fam, "c") == {"qty": 5, "bin": "C", "name": "bolt"}


steps = st.lists(
    st.one_of(
        st.tuples(st.just("set"), st.integers(0, 3), st.sampled_from("kl"),
                  st.tuples(st.sampled_from("xyz"), st.integers(0, 9))),
        st.tuples(st.just("drop"), st.integers(0, 3), st.sampled_from("kl"),
                  st.tuples(st.sampled_from("xyz"), st.just(0))),
        st.tuples(st.just("del"), st.integers(0, 3), st.sampled_from("kl"), st.just(None)),
        st.tuples(st.just("sync"), st.integers(0, 3), st.sampled_from("kl"),
                  st.integers(0, 3)),
    ), min_size=4, max_size=25)


@settings(max_examples=15, deadline=None)
@given(ops=steps, prio=st.booleans())
def test_random_field_edits_converge(ops, prio):
    """Random field edits, field removals, deletes and partial syncs at four sites: after a full
    exchange every site shows the same records and the same digest, in whatever order the ops
    arrived, and fsck passes."""
    import tempfile
    from pathlib import Path
    from syncpack.admin import inspection
    with tempfile.TemporaryDirectory() as d:
        fam = Family(Path(d))
        names = ["s0", "s1", "s2", "s3"]
        fam.init("s0", policy="lww", priority=3 if prio else 0)
        for i, n in enumerate(names[1:], 1):
            fam.add(n, via="s0", priority=(3 - i) if prio else 0)
        with fam.open("s0") as s, s.transaction() as tx:
            tx.set_policy("c", "merge")
        fam.full_exchange(rounds=1)
        for kind, a, key, arg in ops:
            name = names[a]
            if kind == "sync":
                if arg != a:
                    fam.sync(name, names[arg])
                continue
            with fam.open(name) as s, s.transaction() as tx:
                if kind == "del":
                    tx.delete("c", key)
                    continue
                cur = s.get("c", key, None)
                cur = dict(cur) if isinstance(cur, dict) else {}
                f, v = arg
                if kind == "set":
                    cur[f] = v
                else:
                    cur.pop(f, None)
                tx.put("c", key, cur)
        fam.full_exchange(rounds=2)
        assert len({fam.digest(n) for n in names}) == 1
        seen = []
        for n in names:
            with fam.open(n) as s:
                seen.append(list(s.records()))
                assert inspection.fsck(s)["ok"]
        assert all(x == seen[0] for x in seen)


def test_field_update_benchmark_runs(tmp_path):
    """tools/bench_field_update.py end to end at a tiny size (no assertion on the figures)."""
    import subprocess
    import sys
    from pathlib import Path
    tool = Path(__file__).resolve().parent.parent / "tools" / "bench_field_update.py"
    r = subprocess.run([sys.executable, str(tool), "--records", "20", "--json"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["records"] == 20 and doc["update_packet_bytes"] > 0 and doc["load_packet_bytes"] > 0


def test_lww_conflicts_show_the_fields_that_differ_and_resolve_per_field(tmp_path):
    fam = Family(tmp_path)
    fam.init("a")
    fam.add("b", via="a")
    run("put", "inv", "k", json.dumps({"qty": 1, "bin": "A", "same": 0}), site=fam.path("a"))
    run("put", "inv", "k", json.dumps({"qty": 2, "bin": "B", "same": 0}), site=fam.path("b"))
    fam.full_exchange(rounds=1)
    (c,) = run("conflicts", site=fam.path("a"), json_mode=True).json["conflicts"]
    assert [f["field"] for f in c["fields"]] == ["bin", "qty"]
    for f in c["fields"]:
        assert sorted(x["site"] for x in f["values"]) == ["a", "b"]
        assert sum(x["winner"] for x in f["values"]) == 1
    # a misspelt field settled the conflict with the visible value, as if asked
    for args, msg in ((["--field", "qty=nobody"], "nobody"), (["--field", "=a"], "FIELD=SITE"),
                      (["--pick", "a", "--value", "1"], "--value"), ([], "--value"),
                      (["--field", "qyt=a"], "no surviving version of inv/k has a field 'qyt'")):
        r = run("conflicts", "resolve", "inv", "k", *args, site=fam.path("a"))
        assert r.code != 0 and msg in r.err, (args, r)
    assert len(run("conflicts", site=fam.path("a"), json_mode=True).json["conflicts"]) == 1
    # malformed is a usage error also for a key in no conflict
    r = run("conflicts", "resolve", "inv", "none", "--field", "qty", site=fam.path("a"))
    assert r.code == 2 and "FIELD=SITE" in r.err, r
    r = run("conflicts", "resolve", "inv", "k", "--pick", "b", "--field", "bin=a",
            site=fam.path("a"), json_mode=True)
    assert r.code == 0 and r.json["value"] == {"qty": 2, "bin": "A", "same": 0}, r
    fam.full_exchange(rounds=1)
    for s in ("a", "b"):
        r = run("get", "inv", "k", site=fam.path(s), json_mode=True)
        assert r.json["value"] == {"qty": 2, "bin": "A", "same": 0}
        assert run("conflicts", site=fam.path(s), json_mode=True).json["conflicts"] == []


@pytest.mark.parametrize("order", list(itertools.permutations(range(4))))
def test_stamps_do_not_depend_on_the_arrival_order(tmp_path, order):
    """A base X, two writes replacing it that change different fields, and a write over one of
    them: applied in any order (a write before the version it replaced included), the visible
    record and the digest are the same."""
    from syncpack.format.codec import Op
    fam = Family(tmp_path)
    fam.init("a")
    fam.add("b", via="a")
    with fam.open("a") as s, s.transaction() as tx:
        tx.set_policy("parts", "merge")
    fam.full_exchange(rounds=1)
    o1, o2 = b"\x11" * 8, b"\x22" * 8
    enc = codec.encode_value
    x = Op(o1, 1, 10, 0, "parts", "k", enc({"qty": 1, "bin": "A", "n": 0}), b"")
    v1 = Op(o1, 2, 20, 0, "parts", "k", enc({"qty": 2, "bin": "A", "n": 0}), x.csn)
    v2 = Op(o2, 1, 21, 0, "parts", "k", enc({"qty": 1, "bin": "B", "n": 0}), x.csn)
    v3 = Op(o1, 3, 30, 0, "parts", "k", enc({"qty": 2, "bin": "A", "n": 5}), v1.csn)
    ops = [x, v1, v2, v3]
    results = {}
    for site in ("a", "b"):
        seq = ops if site == "a" else [ops[i] for i in order]
        with fam.open(site) as s:
            with s.write_txn():
                for op in seq:
                    s.apply_version(op, op.csn)
            results[site] = (s.get("parts", "k"), s.digest())
    assert results["a"][0] == {"qty": 2, "bin": "B", "n": 5}
    assert results["a"] == results["b"]


def test_resolving_a_field_from_a_site_that_never_set_it_is_refused(tmp_path):
    """Base {qty: 0, bin: 'A'}; a sets qty 1, b sets qty 2, c sets only bin.  'resolve
    --field qty=c' exited 0 and kept b's qty, settling the key everywhere otherwise than
    asked: c's version holds no qty of its own.  Refused, naming the sites that set it."""
    fam = Family(tmp_path)
    _three(fam)
    run("put", "parts", "p-1", json.dumps({"qty": 0, "bin": "A"}), site=fam.path("a"))
    fam.full_exchange(rounds=1)
    for s, value in (("a", {"qty": 1, "bin": "A"}), ("b", {"qty": 2, "bin": "A"}),
                     ("c", {"qty": 0, "bin": "C"})):
        run("put", "parts", "p-1", json.dumps(value), site=fam.path(s))
    fam.full_exchange(rounds=1)
    r = run("conflicts", "resolve", "parts", "p-1", "--field", "qty=c", site=fam.path("a"))
    assert r.code == 1 and "site c holds no value of its own for field 'qty'" in r.err, r
    assert "hint: pick one of the sites that set it: a, b" in r.err, r
    assert len(run("conflicts", site=fam.path("a"), json_mode=True).json["conflicts"]) == 1
    r = run("conflicts", "resolve", "parts", "p-1", "--field", "qty=a", site=fam.path("a"))
    assert r.code == 0, r
    fam.full_exchange(rounds=1)
    for s in SITES:
        assert _get(fam, s) == {"qty": 1, "bin": "C"}


def test_a_field_whose_name_holds_an_equals_sign_is_resolved_by_name(tmp_path):
    """--field FIELD=SITE: a site name never holds '=', a field name may (a column 'x=y');
    split at the first '=', it named a field 'x' that no version has."""
    fam = Family(tmp_path)
    _three(fam)
    run("put", "parts", "p-1", json.dumps({"x=y": 5, "bin": "A"}), site=fam.path("b"))
    run("put", "parts", "p-1", json.dumps({"x=y": 9, "bin": "A"}), site=fam.path("a"))
    fam.full_exchange(rounds=1)
    r = run("conflicts", "resolve", "parts", "p-1", "--field", "x=y=a", site=fam.path("c"))
    assert r.code == 0, r
    fam.full_exchange(rounds=1)
    for s in SITES:
        assert _get(fam, s)["x=y"] == 9, s
        assert run("conflicts", site=fam.path(s), json_mode=True).json["conflicts"] == []
