"""Packets arriving out of order, twice, or in parts (docs/design.md §3.1, §3.4, §3.7, §4, §5).

boston writes three transactions and after each one exports to sanfran and tokyo, so each link
carries packets p1, p2, p3 whose ranges follow each other.  sanfran gets them in some disorder,
tokyo (another fresh replica) in order; both must end in the same state.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest

from conftest import run

from syncpack.format import blocks
from syncpack.format import codec
from syncpack.exchange.sync import open_packet


def jimport(site: Path, *paths) -> dict:
    r = run("import", *paths, site=site, json_mode=True)
    assert r.code == 0, r
    assert r.json["rejected"] == []
    return r.json


def state(site: Path) -> tuple[str, dict]:
    """(digest, vector without zero entries)."""
    d = run("digest", site=site, json_mode=True).json
    return d["digest"], {o: e for o, e in d["vector"].items() if e}


def parked_files(site: Path) -> list[Path]:
    return sorted((site / "parked").glob("*.spk"))


class Links:
    def __init__(self, family):
        self.family = family
        family.init("boston")
        family.add("sanfran", via="boston")
        family.add("tokyo", via="boston")
        self.p: dict[str, list[dict]] = {"sanfran": [], "tokyo": []}
        for rnd in range(3):
            with family.open("boston") as s, s.transaction() as tx:
                for j in range(5):
                    tx.put("parts", f"r{rnd}k{j}", {"round": rnd, "j": j})
                if rnd:
                    tx.delete("parts", f"r{rnd - 1}k0")
            r = run("export", "--to", "sanfran", "--to", "tokyo",
                    "--create-out", "--out", family.root / "media" / f"round{rnd}",
                    site=family.path("boston"), json_mode=True)
            assert r.code == 0, r
            for pk in r.json["packets"]:
                self.p[pk["to"]].append(pk)
        for peer, pks in self.p.items():
            assert len(pks) == 3
            # consecutive ranges of boston's origin, one packet per export
            for a, b in zip(pks, pks[1:]):
                assert a["ranges"]["boston"][1] == b["ranges"]["boston"][0]

    def path(self, name):
        return self.family.path(name)


@pytest.fixture
def links(family) -> Links:
    return Links(family)


def test_out_of_order_arrival_ends_like_in_order_arrival(links):
    sanfran, tokyo = links.path("sanfran"), links.path("tokyo")
    p1, p2, p3 = links.p["sanfran"]
    held = state(sanfran)[1]["boston"]          # what sanfran's snapshot gave it
    assert held == p1["ranges"]["boston"][0]

    # p3 first: its range starts above what sanfran holds, so it is parked, whole.
    r = jimport(sanfran, p3["path"])
    assert r["applied"] == [] and r["ops_applied"] == 0
    assert r["parked"] == [{"path": p3["path"],
                            "waiting_for": {"boston": [held, p3["ranges"]["boston"][0]]},
                            "waiting_for_pieces": False}]
    assert state(sanfran)[1]["boston"] == held
    st = run("status", site=sanfran, json_mode=True).json
    assert [(p["from"], p["waiting_for"]) for p in st["parked"]] == [
        ("boston", {"boston": [held, p3["ranges"]["boston"][0]]})]
    human = run("status", site=sanfran).out        # the missing epochs, inclusive, for people
    assert f"boston epochs {held + 1}-{p3['ranges']['boston'][0]}" in human

    # p1 applies; p3 still waits, now only for p2's epochs.
    r = jimport(sanfran, p1["path"])
    assert r["applied"] == [p1["path"]] and r["ops_applied"] == p1["ops"]
    assert r["parked"] == [{"path": p3["path"], "waiting_for": {"boston": p2["ranges"]["boston"]},
                            "waiting_for_pieces": False}]
    assert run("status", site=sanfran, json_mode=True).json["parked"][0]["waiting_for"] == {
        "boston": p2["ranges"]["boston"]}

    # p2 applies, and the parked p3 applies by itself in the same import.
    r = jimport(sanfran, p2["path"])
    assert r["applied"] == [p2["path"], p3["path"]]
    assert r["ops_applied"] == p2["ops"] + p3["ops"]
    assert r["parked"] == []
    assert run("status", site=sanfran, json_mode=True).json["parked"] == []
    assert parked_files(sanfran) == []

    # tokyo: the same ops, in order, one import each.
    for pk in links.p["tokyo"]:
        assert jimport(tokyo, pk["path"])["applied"] == [pk["path"]]
    boston = state(links.path("boston"))
    assert state(sanfran) == state(tokyo) == boston
    assert boston[1]["boston"] == p3["ranges"]["boston"][1]
    for s in ("boston", "sanfran", "tokyo"):
        assert run("fsck", site=links.path(s)).code == 0


def test_parked_packet_outlives_its_medium(links):
    sanfran = links.path("sanfran")
    p1, p2, p3 = links.p["sanfran"]
    assert len(jimport(sanfran, p3["path"])["parked"]) == 1
    [copy] = parked_files(sanfran)
    assert copy.is_relative_to(sanfran)
    shutil.rmtree(Path(p3["path"]).parents[2])   # the USB stick is gone
    assert not Path(p3["path"]).exists()

    r = jimport(sanfran, p1["path"], p2["path"])
    assert r["applied"] == [p1["path"], p2["path"], p3["path"]]
    assert r["ops_applied"] == p1["ops"] + p2["ops"] + p3["ops"]
    assert parked_files(sanfran) == []
    assert state(sanfran) == state(links.path("boston"))


def test_one_import_call_applies_in_dependency_order(links):
    sanfran = links.path("sanfran")
    p1, p2, p3 = links.p["sanfran"]
    r = jimport(sanfran, p3["path"], p2["path"], p1["path"])
    assert r["applied"] == [p1["path"], p2["path"], p3["path"]]
    assert r["parked"] == [] and r["duplicates"] == []
    assert r["ops_applied"] == p1["ops"] + p2["ops"] + p3["ops"]
    assert parked_files(sanfran) == []
    assert state(sanfran) == state(links.path("boston"))


def test_every_packet_imported_twice_changes_nothing_the_second_time(links):
    sanfran = links.path("sanfran")
    p1, p2, p3 = links.p["sanfran"]

    def snapshot():
        return (state(sanfran), run("lsepoch", site=sanfran, json_mode=True).json,
                run("status", site=sanfran, json_mode=True).json["parked"],
                parked_files(sanfran))

    # A parked packet named again stays parked, once.
    jimport(sanfran, p3["path"])
    before = snapshot()
    r = jimport(sanfran, p3["path"])
    assert r["applied"] == [] and r["duplicates"] == [] and r["ops_applied"] == 0
    assert [p["path"] for p in r["parked"]] == [p3["path"]]
    assert snapshot() == before

    for pk in (p1, p2):
        first = jimport(sanfran, pk["path"])
        assert pk["path"] in first["applied"]
        before = snapshot()
        again = jimport(sanfran, pk["path"])
        assert again["duplicates"] == [pk["path"]]
        assert again["applied"] == [] and again["ops_applied"] == 0
        # p3 (parked, waiting for p2) is retried and reported as still parked, nothing more
        assert [p["path"] for p in again["parked"]] == ([p3["path"]] if pk is p1 else [])
        assert snapshot() == before
    # p3 went in with p2; naming it again is a duplicate too.
    before = snapshot()
    again = jimport(sanfran, p3["path"])
    assert again["duplicates"] == [p3["path"]] and again["ops_applied"] == 0
    assert snapshot() == before
    # The whole medium again, in one call: three duplicates, tokyo's packets left alone.
    media = links.family.root / "media"
    again = jimport(sanfran, *[media / f"round{i}" for i in range(3)])
    assert sorted(again["duplicates"]) == sorted(p["path"] for p in (p1, p2, p3))
    assert again["applied"] == [] and again["ops_applied"] == 0
    assert sorted(again["skipped"]) == sorted(p["path"] for p in links.p["tokyo"])
    assert snapshot() == before
    assert state(sanfran) == state(links.path("boston"))


# --- cutting by --max-size -----------------------------------------------------------------------

TXNS, OPS_PER_TXN = 160, 10


def _ops_of(path: str) -> list[codec.Op]:
    pk = open_packet(Path(path))
    try:
        return list(blocks.packet_ops(pk.f, pk.env))
    finally:
        pk.close()


def test_max_size_cuts_whole_transactions_that_apply_part_by_part(family):
    family.init("boston")
    family.add("sanfran", via="boston")
    family.add("tokyo", via="boston")
    family.sync("boston", "sanfran")     # tokyo's roster op: now both start where boston is
    rng = random.Random(7)
    alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    with family.open("boston") as s:
        base = s.vector()[s.site_id]
        for t in range(TXNS):
            with s.transaction() as tx:
                for j in range(OPS_PER_TXN):
                    tx.put("blobs", f"t{t:02d}-{j}", "".join(rng.choices(alphabet, k=300)))
    max_size = 64 * 1024
    out = family.root / "cut"
    r = run("export", "--to", "sanfran", "--to", "tokyo", "--create-out", "--out", out,
            "--max-size", "64K",
            site=family.path("boston"), json_mode=True)
    assert r.code == 0, r
    parts = [p for p in r.json["packets"] if p["to"] == "sanfran"]
    assert len(parts) >= 4, "the export should need several parts"
    assert [p["part"] for p in parts] == list(range(len(parts)))
    assert len({p["seq"] for p in parts}) == 1
    assert sum(p["ops"] for p in parts) == TXNS * OPS_PER_TXN

    lo = base
    for p in parts:
        assert p["bytes"] <= max_size
        assert Path(p["path"]).stat().st_size == p["bytes"] <= max_size
        plo, phi = p["ranges"]["boston"]
        assert plo == lo and phi - plo == p["ops"]      # each part states its own range
        assert (phi - base) % OPS_PER_TXN == 0          # cut between transactions
        lo = phi
        ops = _ops_of(p["path"])
        by_txn: dict[int, int] = {}
        for op in ops:
            by_txn[op.hlc] = by_txn.get(op.hlc, 0) + 1
        assert set(by_txn.values()) == {OPS_PER_TXN}, "a transaction was split"
    assert lo == base + TXNS * OPS_PER_TXN

    # lspacket agrees with what export reported.
    ls = run("lspacket", out / "sanfran", site=family.path("sanfran"), json_mode=True)
    assert [(x["part"], x["ranges"], x["signature"]) for x in ls.json["packets"]] == [
        (p["part"], p["ranges"], "valid") for p in parts]

    # Each part applies on its own, in order, one import per part.
    sanfran = family.path("sanfran")
    for p in parts:
        res = jimport(sanfran, p["path"])
        assert res["applied"] == [p["path"]] and res["ops_applied"] == p["ops"]
        assert state(sanfran)[1]["boston"] == p["ranges"]["boston"][1]
    assert state(sanfran) == state(family.path("boston"))

    # At tokyo the last part comes first: it waits, whole, for the others.
    tokyo = family.path("tokyo")
    tparts = [p for p in r.json["packets"] if p["to"] == "tokyo"]
    res = jimport(tokyo, tparts[-1]["path"])
    assert res["applied"] == [] and len(res["parked"]) == 1
    for p in tparts[:-1]:
        jimport(tokyo, p["path"])
    assert parked_files(tokyo) == []
    assert state(tokyo) == state(family.path("boston"))


def test_one_transaction_larger_than_max_size_travels_in_parts(family):
    """A transaction larger than a packet is cut into parts, each its origin's signed block
    of at most half the packet; the peer applies it whole when the last part is there.  A
    single op larger than the packet travels in pieces of its block."""
    family.init("boston")
    family.add("sanfran", via="boston")
    rng = random.Random(3)
    with family.open("boston") as s, s.transaction() as tx:
        for j in range(60):
            tx.put("blobs", f"k{j}", rng.randbytes(400).hex())
    pks = family.export("boston", "sanfran", max_size=8 * 1024)
    assert len(pks) > 4
    r = family.import_("sanfran", pks)
    assert r.applied and not r.parked
    assert family.digest("sanfran") == family.digest("boston")
    with family.open("boston") as s, s.transaction() as tx:
        tx.put("blobs", "huge", rng.randbytes(12_000).hex())
    # a single op larger than the packet travels in pieces of its block
    pks = family.export("boston", "sanfran", max_size=8 * 1024)
    assert len(pks) >= 2
    r = family.import_("sanfran", list(reversed(pks)))
    assert len(r.applied) == len(pks) and not r.parked and not r.rejected
    assert family.digest("sanfran") == family.digest("boston")


def _record_state(path: Path) -> tuple:
    import sqlite3
    c = sqlite3.connect(path / "syncpack.db")
    try:
        return (c.execute("SELECT collection, key, csn, value FROM versions "
                          "ORDER BY 1, 2, 3").fetchall(),
                c.execute("SELECT * FROM superseded ORDER BY 1, 2, 3").fetchall())
    finally:
        c.close()


def test_a_block_of_updates_applies_in_bulk_exactly_as_op_by_op(family, monkeypatch):
    """Blocks whose ops replace versions (updates, deletes) are applied as one removal and
    one insert per batch (a 1M-update import took 5x the first import op by op): the store
    after it is the one the op-by-op path makes, with concurrent versions kept, a key
    written twice in one transaction, and deletes."""
    from syncpack.admin import conflicts
    from syncpack.exchange import apply as apply_mod
    from syncpack.store import versions
    family.init("a")
    family.add("b", via="a")
    with family.open("a") as s, s.transaction() as tx:
        for i in range(3000):
            tx.put("c", f"k{i:05d}", {"v": i})
    family.sync("a", "b")
    with family.open("b") as s, s.transaction() as tx:      # concurrent: stay as conflicts
        for i in range(0, 3000, 100):
            tx.put("c", f"k{i:05d}", {"b": i})
    with family.open("a") as s:
        with s.transaction() as tx:
            for i in range(3000):
                if i % 7 == 0:
                    tx.delete("c", f"k{i:05d}")
                else:
                    tx.put("c", f"k{i:05d}", {"v": -i})
        with s.transaction() as tx:     # one batch replacing an op of its own: op by op
            tx.put("c", "k00001", 1)
            tx.put("c", "k00002", 2)
            tx.put("c", "k00001", 3)
    paths = family.export("a", "b")
    twin = family.root / "b-twin"
    shutil.copytree(family.path("b"), twin)
    calls = []
    real = versions.remove_replaced
    monkeypatch.setattr(versions, "remove_replaced", lambda *a: calls.append(a) or real(*a))
    assert family.import_("b", paths).ops_applied == 3003
    assert calls and sum(len(c[2]) for c in calls) >= 2900
    monkeypatch.setattr(apply_mod._Applier, "_replacing", lambda self, info, cols: False)
    family.sites["b-twin"] = twin
    family.import_("b-twin", paths)
    assert _record_state(family.path("b")) == _record_state(twin)
    with family.open("b") as s:
        assert s.get("c", "k00001") == 3 and s.get("c", "k00003") == {"v": -3}
        # b's concurrent writes stay beside a's (those a deleted too)
        assert len(conflicts.list_conflicts(s, "c")) == 30
    family.sync("b", "a")
    assert family.digest("a") == family.digest("b")
