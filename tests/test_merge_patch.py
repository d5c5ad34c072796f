"""Writes of a ``merge`` collection that send only the fields they changed (issue 22, item 1;
formats/VALUES.md): one-field updates of 1 KB records travel as small patches, every receiver
rebuilds the full record (``get``, ``digest``, attached tables and snapshots see full records),
and a patch that cannot be rebuilt is refused whole."""

from __future__ import annotations

import itertools
import json
import random
import string
from pathlib import Path

import msgpack
import pytest
from hypothesis import given, settings, strategies as st

from conftest import Family, run
from packetkit import ops_of
from syncpack.errors import PatchBaseError, PatchError
from syncpack.format import codec, values
from syncpack.format.codec import Op

SITES = ("a", "b", "c")


def _record(i: int) -> dict:
    rng = random.Random(i)
    rec = {f"f{j:02d}": "".join(rng.choice(string.ascii_letters) for _ in range(42))
           for j in range(20)}
    rec["qty"] = i
    return rec


def _lines(path: Path, recs: dict[str, dict]) -> Path:
    path.write_text("".join(json.dumps({"collection": "parts", "key": k, "value": v}) + "\n"
                            for k, v in recs.items()))
    return path


def _export(fam: Family, a: str, b: str) -> Path:
    out = fam.medium()
    r = run("export", "--to", b, "--out", out, site=fam.path(a))
    assert r.code == 0, r
    return out


def _import(fam: Family, out: Path, b: str) -> None:
    r = run("import", out, site=fam.path(b))
    assert r.code == 0, r


def _bytes(out: Path) -> int:
    return sum(p.stat().st_size for p in out.rglob("*.spk"))


def _three(fam: Family) -> None:
    fam.init("a")
    fam.add("b", via="a")
    fam.add("c", via="a")
    assert run("collection", "create", "parts", "--policy", "merge", site=fam.path("a")).code == 0
    fam.full_exchange(rounds=1)


def _get(fam: Family, s: str, key: str):
    r = run("get", "parts", key, site=fam.path(s), json_mode=True)
    assert r.code == 0, r
    return r.json["value"]


def _fsck_clean(fam: Family, s: str) -> None:
    r = run("fsck", site=fam.path(s), json_mode=True)
    assert r.code == 0 and r.json["ok"], r


# --- the format --------------------------------------------------------------------------------

def _f(d: dict) -> dict[str, bytes]:
    return {k: codec.packb(v) for k, v in d.items()}


json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**40, 2**40),
                         st.text(max_size=8), st.floats(allow_nan=False, allow_infinity=False))
records = st.dictionaries(st.sampled_from("abcdefgh"), json_scalars, max_size=8)


@settings(max_examples=200, deadline=None)
@given(base=records, new=records)
def test_a_patch_rebuilds_the_record(base, new):
    """Whatever the two records, the patch of one over the other rebuilds the new one (the same
    fields with the same bytes; a new field after the base's) and says it is a patch."""
    p = values.make_patch(_f(base), _f(new))
    assert values.claims_patch(p) and values.may_hold_patch([b"\x81", None, p])
    setf, removed = values.read_patch(p)
    out = values.patched(_f(base), setf, removed)
    assert out == _f(new)
    assert list(out)[:len([k for k in base if k in new])] == [k for k in base if k in new]
    assert codec.decode_value(values.encode_fields(out)) == new
    # no record is ever taken for a patch
    assert not values.claims_patch(codec.encode_value(new))
    assert not values.may_hold_patch([codec.encode_value(base), codec.encode_value(new)])


@pytest.mark.parametrize("raw, why", [
    (msgpack.packb(msgpack.ExtType(values.PATCH_EXT, b"")), "version missing"),
    (msgpack.packb(msgpack.ExtType(values.PATCH_EXT, b"\x02" + msgpack.packb([{}, []]))),
     "version 2"),
    (msgpack.packb(msgpack.ExtType(values.PATCH_EXT, b"\x01\xc1")), "not one msgpack"),
    (msgpack.packb(msgpack.ExtType(values.PATCH_EXT, b"\x01" + msgpack.packb([{}, []]) + b"\x00")),
     "not one msgpack"),
    (msgpack.packb(msgpack.ExtType(values.PATCH_EXT, b"\x01" + msgpack.packb({"a": 1}))),
     "not [set map"),
    (msgpack.packb(msgpack.ExtType(values.PATCH_EXT, b"\x01" + msgpack.packb([{1: 1}, []]))),
     "not a string"),
    (msgpack.packb(msgpack.ExtType(values.PATCH_EXT, b"\x01" + msgpack.packb([{"a": 1}, ["a"]]))),
     "sets one it removes"),
    (msgpack.packb(msgpack.ExtType(values.PATCH_EXT, b"\x01" + msgpack.packb([{}, ["a", "a"]]))),
     "removes a field twice"),
    (msgpack.packb(msgpack.ExtType(values.PATCH_EXT, b"\x01" + msgpack.packb(
        [{"a": msgpack.ExtType(values.PATCH_EXT, b"\x01")}, []]))), "not one msgpack"),
])
def test_malformed_patches_are_refused(raw, why):
    assert values.claims_patch(raw)
    with pytest.raises(values.PatchFormatError, match=why.replace("[", r"\[")):
        values.read_patch(raw)


def test_the_golden_patch_vector():
    """formats/vectors/v2-block-patch: the patch op's value, read by hand (an ext of type 0x50,
    version byte 1, then [set, removed]), rebuilds the record the vector states."""
    doc = json.loads((Path(__file__).resolve().parent.parent / "formats" / "vectors" /
                      "v2-block-patch.json").read_text())
    base_op, patch_op = doc["ops"]
    assert patch_op["replaced"] == [base_op["csn"]]
    raw = bytes.fromhex(patch_op["value"])
    ext = msgpack.unpackb(raw)
    assert isinstance(ext, msgpack.ExtType) and ext.code == 0x50 and ext.data[0] == 1
    setf, removed = msgpack.unpackb(ext.data[1:])
    assert (setf, removed) == (doc["patch"]["set"], doc["patch"]["removed"])
    base = codec.decode_value(bytes.fromhex(base_op["value"]))
    rebuilt = {k: setf.get(k, v) for k, v in base.items() if k not in removed}
    rebuilt.update({k: v for k, v in setf.items() if k not in rebuilt})
    assert rebuilt == doc["patch"]["record"]
    full = values.encode_fields(values.patched(_f(base), *values.read_patch(raw)))
    assert full.hex() == doc["patch"]["record_bytes"]


# --- three sites through the CLI --------------------------------------------------------------

def test_one_field_updates_of_1kb_records_travel_as_patches(tmp_path):
    """40 records of ~1 KB loaded at a, then qty of each changed: the update's packet is a small
    fraction of the load's, each op is a patch naming its base, and b (then c, relayed through
    b) rebuilds exactly the records a holds; fsck is clean and digests equal."""
    fam = Family(tmp_path)
    _three(fam)
    recs = {f"p{i:03d}": _record(i) for i in range(40)}
    assert run("load", _lines(tmp_path / "load.jsonl", recs), site=fam.path("a")).code == 0
    out = _export(fam, "a", "b")
    load_bytes = _bytes(out)
    _import(fam, out, "b")
    upd = {k: dict(v, qty=v["qty"] + 1000) for k, v in recs.items()}
    assert run("load", _lines(tmp_path / "upd.jsonl", upd), site=fam.path("a")).code == 0
    out = _export(fam, "a", "b")
    update_bytes = _bytes(out)
    assert update_bytes <= 0.15 * load_bytes, (update_bytes, load_bytes)
    mine = [op for p in sorted(out.rglob("*.spk")) for op in ops_of(p.read_bytes())
            if op.collection == "parts"]
    assert len(mine) == 40
    for op in mine:
        assert values.claims_patch(op.value) and len(op.replaced) == 20
        assert values.read_patch(op.value)[0] == {"qty": codec.packb(int(op.key[1:]) + 1000)}
    _import(fam, out, "b")
    _import(fam, _export(fam, "b", "c"), "c")
    for s in SITES:
        assert _get(fam, s, "p007") == upd["p007"], s
        _fsck_clean(fam, s)
    assert len({fam.digest(s) for s in SITES}) == 1


EDITS = {"a": {"qty": 7}, "b": {"f03": "from b"}, "c": {"f10": None, "new": True}}


@pytest.mark.parametrize("order", list(itertools.permutations(SITES)))
def test_concurrent_patches_of_different_fields_merge_in_every_delivery_order(tmp_path, order):
    """Each site changes other fields of one 1 KB record (c removes one and adds one); the
    three patches reach the others in every order of senders: every site ends with all three
    edits, no conflict, equal digests and a clean fsck."""
    fam = Family(tmp_path)
    _three(fam)
    base = _record(1)
    assert run("put", "parts", "k", json.dumps(base), site=fam.path("a")).code == 0
    fam.full_exchange(rounds=1)
    for s, change in EDITS.items():
        new = dict(base)
        for f, v in change.items():
            if v is None:
                new.pop(f)
            else:
                new[f] = v
        assert run("put", "parts", "k", json.dumps(new), site=fam.path(s)).code == 0
    want = dict(base, qty=7, f03="from b", new=True)
    del want["f10"]
    for a in order:             # each site's patch, straight to the two others
        for b in SITES:
            if b != a:
                _import(fam, _export(fam, a, b), b)
    fam.full_exchange(rounds=1)
    for s in SITES:
        assert _get(fam, s, "k") == want, s
        r = run("conflicts", site=fam.path(s), json_mode=True)
        assert r.json["conflicts"] == [], r
        _fsck_clean(fam, s)
    assert len({fam.digest(s) for s in SITES}) == 1


def test_a_site_made_by_snapshot_and_a_resync_hold_full_records(tmp_path):
    """mkreplica after patches seeds full records; the new site then applies further patches
    over them; a resync of a member rebuilds full records too."""
    fam = Family(tmp_path)
    _three(fam)
    recs = {f"p{i}": _record(i) for i in range(5)}
    assert run("load", _lines(tmp_path / "l.jsonl", recs), site=fam.path("a")).code == 0
    upd = {k: dict(v, qty=-1) for k, v in recs.items()}
    assert run("load", _lines(tmp_path / "u.jsonl", upd), site=fam.path("a")).code == 0
    fam.add("d", via="a")
    assert _get(fam, "d", "p3") == upd["p3"]
    upd2 = {k: dict(v, f00="again") for k, v in upd.items()}
    assert run("load", _lines(tmp_path / "u2.jsonl", upd2), site=fam.path("a")).code == 0
    out = _export(fam, "a", "d")
    assert any(values.claims_patch(op.value) for p in out.rglob("*.spk")
               for op in ops_of(p.read_bytes()))
    _import(fam, out, "d")
    assert _get(fam, "d", "p3") == upd2["p3"]
    _fsck_clean(fam, "d")
    snap = fam.medium()
    r = run("resync", "--to", "b", "--out", snap, site=fam.path("a"))
    assert r.code == 0, r
    _import(fam, snap, "b")
    assert _get(fam, "b", "p4") == upd2["p4"]
    _fsck_clean(fam, "b")
    assert fam.digest("a") == fam.digest("b") == fam.digest("d")


def test_an_attached_table_under_merge_sends_one_column(tmp_path):
    """An attached table under merge: an UPDATE of one small column of rows with a 1 KB text
    column travels as patches (packet a small fraction of the insert's) and the rows converge."""
    from test_attach import app, assert_converged, attach_all, exchange, make_family, sp, table
    sites = make_family(tmp_path, SITES)
    dbs = {n: tmp_path / f"{n}.db" for n in sites}
    for db in dbs.values():
        app(db, ["CREATE TABLE items(id TEXT PRIMARY KEY, qty INTEGER, doc TEXT, b BLOB, "
                 "r REAL)"])
    sp(sites["a"], "collection", "create", "items", "--policy", "merge")
    exchange(tmp_path, sites, rounds=1)
    attach_all(sites, dbs, ("items",))
    app(dbs["a"], [["INSERT INTO items(id, qty, doc) VALUES (?, ?, ?)",
                    [f"k{i:02d}", i, json.dumps(_record(i))]] for i in range(30)])

    def send(name: str, to: str = "b") -> int:
        out = tmp_path / name
        sp(sites["a"], "export", "--to", to, "--out", out, "--create-out")
        sp(sites[to], "import", out)
        return _bytes(out)
    load = send("ins")
    send("ins-c", "c")
    app(dbs["a"], ["UPDATE items SET qty = qty + 100"])
    app(dbs["c"], ["UPDATE items SET doc = 'short' WHERE id = 'k03'"])
    update = send("upd")
    assert update <= 0.15 * load, (update, load)
    exchange(tmp_path, sites)
    assert_converged(sites, dbs, ("items",))
    rows = {r[0]: r for r in table(dbs["b"], "items")}
    assert rows["k03"][2] == 103 and rows["k03"][4] == "short"
    assert rows["k04"][2] == 104 and json.loads(rows["k04"][4]) == _record(4)
    # bytes and an infinite float (not JSON, but what a row may hold) travel in a patch too
    app(dbs["b"], [["UPDATE items SET b = ?, r = 9e999 WHERE id = 'k05'", ["hex:00ff"]]])
    exchange(tmp_path, sites)
    assert_converged(sites, dbs, ("items",))
    row = {r[0]: r for r in table(dbs["c"], "items")}["k05"]
    assert row[6:] == (b"\x00\xff", "blob", float("inf"), "real")
    assert len({sp(sites[n], "digest").out for n in sites}) == 1


# --- any delivery order, and patches that cannot be applied ------------------------------------

O1, O2, O3 = b"\x11" * 8, b"\x22" * 8, b"\x33" * 8


def _patch(base: dict, new: dict) -> bytes:
    return values.make_patch(_f(base), _f(new))


def _family_ab(tmp_path: Path) -> Family:
    fam = Family(tmp_path)
    fam.init("a")
    fam.add("b", via="a")
    with fam.open("a") as s, s.transaction() as tx:
        tx.set_policy("parts", "merge")
    fam.full_exchange(rounds=1)
    return fam


def _causal_orders(ops: list[Op], parents: dict[bytes, list[bytes]], rng: random.Random):
    """Random orders in which every op comes after the ones it replaced (as packets carry
    them: an op never reaches a site before its base)."""
    for _ in range(4):
        left, done, out = list(ops), set(), []
        while left:
            ready = [o for o in left if all(p in done for p in parents.get(o.csn, []))]
            o = rng.choice(ready)
            left.remove(o)
            done.add(o.csn)
            out.append(o)
        yield out


@settings(max_examples=25, deadline=None)
@given(edits=st.lists(st.tuples(st.sampled_from([O1, O2, O3]),
                                st.dictionaries(st.sampled_from("pqrs"),
                                                st.one_of(st.integers(0, 3), st.none()),
                                                min_size=1, max_size=3),
                                st.booleans()),
                      min_size=1, max_size=5),
       seed=st.integers())
def test_any_delivery_order_of_concurrent_patches_gives_one_result(tmp_path_factory, edits,
                                                                   seed):
    """Concurrent patches over one base (some over another patch they saw), applied at a site
    in random orders that keep each after its base: one visible record, and it is what the
    whole records would have given."""
    base = {f: 0 for f in "pqrs"}
    x = Op(O1, 1, 10, 0, "parts", "k", codec.encode_value(base), b"")
    made: list[tuple[Op, dict]] = []
    whole: list[Op] = [x]
    ops = [x]
    parents: dict[bytes, list[bytes]] = {}
    epochs = {O1: 1, O2: 0, O3: 0}
    for n, (who, change, on_last) in enumerate(edits):
        over_op, over = made[-1] if on_last and made else (x, base)
        new = {f: v for f, v in over.items() if change.get(f, 0) is not None}
        new.update({f: v for f, v in change.items() if v is not None})
        epochs[who] += 1
        op = Op(who, epochs[who], 20 + n, 0, "parts", "k", _patch(over, new), over_op.csn)
        ops.append(op)
        whole.append(Op(*op[:6], codec.encode_value(new), op.replaced))
        parents[op.csn] = [over_op.csn]
        made.append((op, new))
    fam = _family_ab(tmp_path_factory.mktemp("f"))
    got = set()
    with fam.open("b") as s:
        with s.write_txn():
            for op in whole:
                s.apply_version(op, op.csn)
        want = s.get("parts", "k")
    with fam.open("a") as s:
        for n, order in enumerate(_causal_orders(ops, parents, random.Random(seed))):
            key = f"k{n}"       # each order on a key of its own, so none sees another's
            with s.write_txn():
                for op in order:
                    s.apply_version(Op(*op[:5], key, *op[6:]), op.csn)
            got.add(json.dumps(s.get("parts", key), sort_keys=True))
    assert len(got) == 1
    assert json.loads(got.pop()) == want


def test_patches_that_cannot_be_rebuilt_are_refused_and_apply_nothing(tmp_path):
    fam = _family_ab(tmp_path)
    enc = codec.encode_value
    x = Op(O1, 1, 10, 0, "parts", "k", enc({"qty": 1, "bin": "A"}), b"")
    tomb = Op(O1, 1, 10, 0, "parts", "t", None, b"")
    cases = [
        (Op(O2, 1, 20, 0, "parts", "k", _patch({}, {"qty": 2}), b"\x42" * 20),
         PatchBaseError, "does not hold"),
        (Op(O2, 1, 20, 0, "parts", "k", _patch({}, {"qty": 2}), b""), PatchError, "not one"),
        (Op(O2, 1, 20, 0, "parts", "k", _patch({}, {"qty": 2}), x.csn * 2), PatchError,
         "not one"),
        (Op(O2, 1, 20, 0, "plain", "k", _patch({}, {"qty": 2}), b"\x42" * 20),
         PatchBaseError, "not under the merge policy"),
        (Op(O2, 1, 20, 0, "parts", "t", _patch({}, {"qty": 2}), tomb.csn), PatchError,
         "not a record"),
        (Op(O2, 1, 20, 0, "parts", "k", msgpack.packb(msgpack.ExtType(values.PATCH_EXT, b"\x07")),
            x.csn), PatchError, "malformed"),
    ]
    with fam.open("a") as s:
        with s.write_txn():
            s.apply_version(x, x.csn)
            s.apply_version(tomb, tomb.csn)
        before = s.digest()
        for op, cls, msg in cases:
            with pytest.raises(cls, match=msg):
                with s.write_txn():
                    s.apply_version(op, op.csn)
            assert s.digest() == before
            assert s.get("parts", "k") == {"qty": 1, "bin": "A"}


def test_a_site_seeded_after_a_base_was_replaced_rebuilds_a_patch_over_it(tmp_path):
    """b writes over v1 while a replaces v1 with v2; d is seeded from a (its records hold v2
    only) and then gets b's patch over v1: the snapshot's field history holds v1, so d rebuilds
    b's write, merges both edits like everyone and shows no conflict."""
    fam = Family(tmp_path)
    _three(fam)
    base = _record(5)
    assert run("put", "parts", "k", json.dumps(base), site=fam.path("a")).code == 0
    fam.full_exchange(rounds=1)
    assert run("put", "parts", "k", json.dumps(dict(base, qty=1)), site=fam.path("a")).code == 0
    assert run("put", "parts", "k", json.dumps(dict(base, f05="b")), site=fam.path("b")).code == 0
    fam.add("d", via="a")
    _import(fam, _export(fam, "a", "b"), "b")     # b learns of d (and of v2)
    out = _export(fam, "b", "d")
    assert any(values.claims_patch(op.value) for p in out.rglob("*.spk")
               for op in ops_of(p.read_bytes()) if op.collection == "parts")
    _import(fam, out, "d")
    fam.full_exchange(rounds=2)
    names = (*SITES, "d")
    for s in names:
        assert _get(fam, s, "k") == dict(base, qty=1, f05="b"), s
        assert run("conflicts", site=fam.path(s), json_mode=True).json["conflicts"] == []
        _fsck_clean(fam, s)
    assert len({fam.digest(s) for s in names}) == 1


@pytest.mark.parametrize("value", [
    None, b"\x00", codec.packb([1, 2]), codec.packb(["c", "k", None, None]),
    codec.packb(["c", "other", None, None, b""]), codec.packb(["c", "k", 5, None, b""]),
    codec.packb(["c", "k", None, None, b"\x01" * 7]),
    codec.packb(["c", "k", None, codec.packb({"f": b"short"}), b""]),
    codec.packb(["c", "k", None, b"\xc1", b""]),
])
def test_malformed_field_history_in_a_snapshot_is_refused(value):
    from syncpack.store import fields
    with pytest.raises(ValueError):
        fields.parse_history(json.dumps(["c", "k"]), b"\x01" * 20, value)
    ok = codec.packb(["c", "k", None, codec.packb({"f": b"\x02" * 20}), b"\x03" * 20])
    assert fields.parse_history(json.dumps(["c", "k"]), b"\x01" * 20, ok)[0] == "c"


def test_patches_of_a_site_that_created_the_collection_under_merge_apply_where_another_won(
        tmp_path):
    """a creates 'parts' under merge and updates a large record (its second write travels as
    a patch); b creates 'parts' under lww concurrently, with the later clock, so lww wins
    everywhere.  b refused a's packet whole ('not under the merge policy here'), on every
    round, for good: a's changes after it never arrived.  The patch is rebuilt from its base,
    which b holds, and both sites converge with a clean fsck."""
    fam = Family(tmp_path)
    fam.init("a")
    fam.add("b", via="a")
    big = "z" * 500
    with fam.open("a") as s, s.transaction() as tx:
        tx.set_policy("parts", "merge")
    for qty in (1, 2):
        with fam.open("a") as s, s.transaction() as tx:
            tx.put("parts", "p1", {"qty": qty, "big": big})
    with fam.open("b") as s, s.transaction() as tx:
        tx.set_policy("parts", "lww")
    fam.full_exchange(rounds=3)
    assert fam.digest("a") == fam.digest("b")
    for n in ("a", "b"):
        assert run("get", "parts", "p1", site=fam.path(n), json_mode=True).json["value"] == \
            {"qty": 2, "big": big}
        assert run("fsck", site=fam.path(n)).code == 0
