"""A transaction larger than the medium: it travels in parts of at most --max-size, each its
origin's signed block, and the importer applies it whole when the last part is there."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from conftest import run
from syncpack import site as site_mod
from syncpack.exchange import apply as apply_mod
from syncpack.format import blocks
from syncpack.store import chain


def _load_file(tmp_path: Path, n: int = 3000, size: int = 400) -> Path:
    f = tmp_path / "records.jsonl"
    with open(f, "w") as out:
        for i in range(n):
            # random hex: the records do not compress below the medium's size
            out.write(json.dumps({"collection": "parts", "key": f"p-{i:05d}",
                                  "value": {"pad": os.urandom(size // 2).hex()}}) + "\n")
    return f


def _packets(d: Path) -> list[Path]:
    return sorted(d.rglob("*.spk"))


@pytest.mark.parametrize("batch", [None, 700], ids=["one-batch", "load-batches"])
def test_big_transaction_travels_in_parts_applied_only_whole(family, tmp_path, monkeypatch,
                                                             batch):
    """A load is one transaction at every site.  Loaded in batches (a large file), each batch
    travelled as a transaction of its own: a peer that had the first packets showed the
    first batches of the file."""
    if batch:
        from syncpack.admin import loading
        monkeypatch.setattr(loading, "LOAD_TXN_OPS", batch)
    family.init("a")
    family.add("b", via="a")
    family.add("c", via="a")
    a, b, c = family.path("a"), family.path("b"), family.path("c")
    assert run("load", _load_file(tmp_path), site=a).code == 0
    # c gets the packets in order: nothing shows until the last one is there
    in_order = sorted(family.export("a", "c", max_size=64 * 1024))
    for f in in_order[:-1]:
        assert run("import", f, site=c).code == 0
        assert run("get", "parts", "p-00000", site=c).code != 0, f
    assert run("import", in_order[-1], site=c).code == 0
    assert family.digest("a") == family.digest("c")
    usb = tmp_path / "usb"
    r = run("export", "--to", "b", "--create-out", "--out", usb, "--max-size", "64K", site=a,
            json_mode=True)
    assert r.code == 0, r
    files = _packets(usb)
    assert len(files) > 10
    assert all(f.stat().st_size <= 64 * 1024 for f in files)
    empty = family.digest("b")
    # the parts in reverse order: nothing applies until the first part (sent first) arrives
    for f in reversed(files[1:]):
        r = run("import", f, site=b, json_mode=True)
        assert r.code == 0, r
        assert run("get", "parts", "p-00000", site=b).code != 0
        assert family.digest("b") == empty
    r = run("import", files[0], site=b, json_mode=True)
    assert r.code == 0, r
    assert family.digest("a") == family.digest("b")
    assert run("fsck", site=b).code == 0


def test_parts_wait_in_order_and_are_listed(family, tmp_path):
    family.init("a")
    family.add("b", via="a")
    a, b = family.path("a"), family.path("b")
    assert run("load", _load_file(tmp_path, 600), site=a).code == 0
    usb = tmp_path / "usb"
    assert run("export", "--to", "b", "--create-out", "--out", usb, "--max-size", "64K",
               site=a).code == 0
    files = _packets(usb)
    assert len(files) >= 3
    # in order, all but the last part: held, not applied, listed in status; fsck clean
    for f in files[:-1]:
        r = run("import", f, site=b)
        assert r.code == 0 and "1 large transaction(s) held until their last part" in r.out, r
    assert run("get", "parts", "p-00000", site=b).code != 0
    st = run("status", site=b, json_mode=True)
    assert st.code == 0
    waiting = st.json["incomplete_transactions"]
    assert len(waiting) == 1 and waiting[0]["origin"] == "a" and waiting[0]["parts"] >= 2
    assert run("fsck", site=b).code == 0
    with family.open("b") as s:
        assert chain.incomplete(s.conn)
    assert run("import", files[-1], site=b).code == 0
    assert family.digest("a") == family.digest("b")
    assert run("status", site=b, json_mode=True).json["incomplete_transactions"] == []
    assert run("fsck", site=b).code == 0


def test_relay_passes_parts_on_unchanged(family, tmp_path):
    family.init("a")
    family.add("b", via="a")
    family.add("c", via="a")
    family.full_exchange(rounds=2)
    a, b, c = (family.path(x) for x in "abc")
    assert run("load", _load_file(tmp_path, 600), site=a).code == 0
    usb = tmp_path / "usb"
    assert run("export", "--to", "b", "--create-out", "--out", usb, "--max-size", "64K",
               site=a).code == 0
    assert run("import", usb, site=b).code == 0
    usb2 = tmp_path / "usb2"
    r = run("export", "--to", "c", "--create-out", "--out", usb2, "--max-size", "64K", site=b)
    assert r.code == 0, r
    assert run("import", usb2, site=c).code == 0
    assert family.digest("a") == family.digest("b") == family.digest("c")
    with family.open("a") as sa, family.open("c") as sc:
        own = sa.conn.execute("SELECT data FROM blocks WHERE origin=? ORDER BY lo",
                              (sa.site_id,)).fetchall()
        held = sc.conn.execute("SELECT data FROM blocks WHERE origin=? ORDER BY lo",
                               (sa.site_id,)).fetchall()
        assert [r[0] for r in held if blocks.read_block_header(r[0]).flags] == \
            [r[0] for r in own if blocks.read_block_header(r[0]).flags]


def test_max_size_below_64k_is_a_usage_error(family, tmp_path):
    family.init("a")
    family.add("b", via="a")
    r = run("export", "--to", "b", "--create-out", "--out", tmp_path / "u", "--max-size",
            "32K", site=family.path("a"))
    assert r.code == 2, r
    assert "64" in r.err
    # a size no float or medium holds: a usage error too, not an internal one
    for v in ("inf", "nan", "1e400", "99999999999999999999G", "2000T"):
        r = run("export", "--to", "b", "--create-out", "--out", tmp_path / "u", "--max-size",
                v, site=family.path("a"))
        assert r.code == 2 and ("not a size" in r.err or "at most" in r.err), (v, r)


def test_shipped_batch_sample_with_a_64k_outbox_after_an_ordinary_load(family, tmp_path):
    """samples/batch/sanfran_hub.toml sends bangalore packets of at most 64K: after a load of
    3,000 records in one transaction, ordinary rounds at every site converge."""
    import shutil
    root = family.root
    family.init("boston_hub")
    family.add("sanfran_hub", via="boston_hub")
    family.add("bangalore", via="boston_hub")
    samples = Path(__file__).resolve().parents[1] / "samples" / "batch"
    (root / "batch").mkdir()
    shutil.rmtree(root / "media", ignore_errors=True)     # the set-up's medium
    (root / "media").mkdir()
    (root / "logs").mkdir()
    for s in ("boston_hub", "sanfran_hub", "bangalore"):
        shutil.copy(samples / f"{s}.toml", root / "batch" / f"{s}.toml")
    assert run("load", _load_file(tmp_path), site=family.path("sanfran_hub")).code == 0
    for _round in range(3):
        for s in ("boston_hub", "sanfran_hub", "bangalore"):
            r = run("batch", root / "batch" / f"{s}.toml")
            assert r.code == 0, r
            if s == "sanfran_hub" and not _round:
                assert "-> bangalore: nothing to send" not in r.out, r
    small = sorted((root / "media" / "bangalore" / "sanfran_hub").rglob("*.spk"))
    assert small and all(p.stat().st_size <= 64 * 1024 for p in small)
    d = {s: family.digest(s) for s in ("boston_hub", "sanfran_hub", "bangalore")}
    assert len(set(d.values())) == 1, d
    for s in d:
        assert run("fsck", site=family.path(s)).code == 0


def test_batch_outbox_error_names_the_peer_and_is_not_nothing_to_send(family, tmp_path):
    family.init("a")
    family.add("b", via="a")
    family.put("a", "c", "huge", {"blob": os.urandom(100_000).hex()})   # one op, > 64K
    media = tmp_path / "m"
    media.mkdir()
    (media / "b").write_text("a file where the peer's folder should be")
    cfg = tmp_path / "a.toml"
    cfg.write_text(f'site = "{family.path("a")}"\n[[export]]\nout = "{media}"\nto = ["b"]\n'
                   f'max_size = "64K"\ncreate = true\n')
    r = run("batch", cfg)
    assert r.code == 1, r
    assert "-> b: failed" in r.out and "nothing to send" not in r.out, r
    assert f"export {media} -> b: cannot write packets" in r.err and "hint: " in r.err, r
    # the medium fixed, the one record larger than 64K travels (in pieces)
    (media / "b").unlink()
    r = run("batch", cfg)
    assert r.code == 0 and "-> b: 2 packet(s)" in r.out, r
    assert all(f.stat().st_size <= 64 * 1024 for f in media.rglob("*.spk"))


def test_a_site_holding_parts_seeds_a_new_member_without_them(family, tmp_path):
    family.init("a")
    family.add("b", via="a")
    a, b = family.path("a"), family.path("b")
    assert run("load", _load_file(tmp_path, 600), site=a).code == 0
    usb = tmp_path / "usb"
    assert run("export", "--to", "b", "--create-out", "--out", usb, "--max-size", "64K",
               site=a).code == 0
    files = _packets(usb)
    for f in files[:-1]:
        assert run("import", f, site=b).code == 0
    family.add("c", via="b")        # b's snapshot: its records, and a vector without the parts
    c = family.path("c")
    assert run("status", site=c, json_mode=True).json["incomplete_transactions"] == []
    assert run("fsck", site=c).code == 0
    assert run("import", files[-1], site=b).code == 0
    family.sync("b", "a")           # a learns of c
    family.full_exchange(rounds=3)
    assert family.digest("a") == family.digest("b") == family.digest("c")
    for s in (a, b, c):
        assert run("fsck", site=s).code == 0


def test_reseal_for_a_small_medium_after_a_peer_got_the_whole_block(family, tmp_path):
    family.init("a")
    family.add("b", via="a")
    family.add("c", via="a")
    family.full_exchange(rounds=2)
    a, b, c = (family.path(x) for x in "abc")
    assert run("load", _load_file(tmp_path, 600), site=a).code == 0
    family.sync("a", "b")                        # b: the transaction as one block
    usb = tmp_path / "usb"
    r = run("export", "--to", "c", "--create-out", "--out", usb, "--max-size", "64K", site=a)
    assert r.code == 0, r                        # sealed again as parts for c
    assert run("import", usb, site=c).code == 0
    family.put("a", "c", "after", 1)
    family.put("b", "c", "from-b", 1)
    family.full_exchange(rounds=3)
    assert family.digest("a") == family.digest("b") == family.digest("c")
    for s in (a, b, c):
        assert run("fsck", site=s).code == 0


def test_scrub_keeps_the_parts_of_a_transaction_not_yet_applied(family, tmp_path):
    family.init("a")
    family.add("b", via="a")
    a, b = family.path("a"), family.path("b")
    assert run("load", _load_file(tmp_path, 600), site=a).code == 0
    usb = tmp_path / "usb"
    assert run("export", "--to", "b", "--create-out", "--out", usb, "--max-size", "64K",
               site=a).code == 0
    files = _packets(usb)
    for f in files[:-1]:
        assert run("import", f, site=b).code == 0
    assert run("scrub", site=b).code == 0       # every member holds those epochs...
    r = run("import", files[-1], site=b)        # ...but b has not applied them yet
    assert r.code == 0, r
    assert family.digest("a") == family.digest("b")
    assert run("fsck", site=b).code == 0


# --- blocks larger than any packet: pieces (formats/PACKET.md section 6.4) --------------------

def _put_big(site: Path, key: str, size: int, tmp_path: Path) -> None:
    f = tmp_path / f"{key}.json"
    f.write_text(json.dumps({"blob": os.urandom(size // 2).hex()}))   # does not compress
    assert run("put", "parts", key, "-", site=site, input=f.read_text()).code == 0


def _shuffled(files: list[Path], seed: int) -> list[Path]:
    import random
    out = list(files)
    random.Random(seed).shuffle(out)
    return out


def test_records_larger_than_the_medium_travel_in_pieces_applied_only_whole(family, tmp_path):
    family.init("a")
    family.add("b", via="a")
    a, b = family.path("a"), family.path("b")
    _put_big(a, "big300k", 300_000, tmp_path)
    _put_big(a, "big5m", 5_000_000, tmp_path)
    assert run("put", "parts", "small", "1", site=a).code == 0
    usb = tmp_path / "usb"
    r = run("export", "--to", "b", "--create-out", "--out", usb, "--max-size", "64K", site=a,
            json_mode=True)
    assert r.code == 0, r
    files = _packets(usb)
    assert len(files) > 40 and all(f.stat().st_size <= 64 * 1024 for f in files)
    before = family.digest("b")
    # every packet but one, shuffled: nothing of the big records applies
    order = _shuffled(files, 19)
    for f in order[:-1]:
        r = run("import", f, site=b)
        assert r.code == 0, r
        assert run("get", "parts", "big5m", site=b).code != 0
    assert family.digest("b") == before or run("get", "parts", "big5m", site=b).code != 0
    st = run("status", site=b, json_mode=True)
    assert st.code == 0 and st.json["parked_packets"] if "parked_packets" in st.json else True
    assert run("fsck", site=b).code == 0
    r = run("import", order[-1], site=b)
    assert r.code == 0, r
    assert family.digest("a") == family.digest("b")
    assert json.loads(run("get", "parts", "big5m", site=b).out)["blob"] == \
        json.loads(run("get", "parts", "big5m", site=a).out)["blob"]
    assert run("fsck", site=b).code == 0
    # the same packets again: duplicates, nothing changes
    r = run("import", usb, site=b, json_mode=True)
    assert r.code == 0 and not r.json["applied"] and not r.json["parked"], r


def test_reverse_order_pieces_in_one_import(family, tmp_path):
    family.init("a")
    family.add("b", via="a")
    a = family.path("a")
    _put_big(a, "big300k", 300_000, tmp_path)
    usb = tmp_path / "usb"
    assert run("export", "--to", "b", "--create-out", "--out", usb, "--max-size", "64K",
               site=a).code == 0
    files = _packets(usb)
    assert len(files) >= 3
    for f in reversed(files[1:]):
        assert run("import", f, site=family.path("b")).code == 0
        assert run("get", "parts", "big300k", site=family.path("b")).code != 0
    assert run("import", files[0], site=family.path("b")).code == 0
    assert family.digest("a") == family.digest("b")
    assert run("fsck", site=family.path("b")).code == 0


def test_relay_cuts_another_origins_big_blocks_to_a_small_medium(family, tmp_path):
    """a writes a 1 MB transaction and a 300 KB record, exports to b at a large size; b
    relays to c at 64K: b cannot re-sign a's blocks, so it sends them in pieces."""
    family.init("a")
    family.add("b", via="a")
    family.add("c", via="a")
    family.full_exchange(rounds=2)
    a, b, c = (family.path(x) for x in "abc")
    assert run("load", _load_file(tmp_path, 2500, 400), site=a).code == 0     # ~1 MB
    _put_big(a, "big300k", 300_000, tmp_path)
    usb = tmp_path / "usb"
    assert run("export", "--to", "b", "--create-out", "--out", usb, "--max-size", "64M",
               site=a).code == 0
    assert len(_packets(usb)) == 1
    assert run("import", usb, site=b).code == 0
    usb2 = tmp_path / "usb2"
    r = run("export", "--to", "c", "--create-out", "--out", usb2, "--max-size", "64K", site=b)
    assert r.code == 0, r
    files = _packets(usb2)
    assert len(files) > 8 and all(f.stat().st_size <= 64 * 1024 for f in files)
    for f in _shuffled(files, 7):
        assert run("import", f, site=c).code == 0
    assert family.digest("a") == family.digest("b") == family.digest("c")
    assert run("fsck", site=c).code == 0
    with family.open("b") as sb, family.open("c") as sc:
        q = "SELECT data FROM blocks WHERE origin=? ORDER BY lo"
        oa = sb.member_named("a").site_id
        big = [r for r in sb.conn.execute(q, (oa,)).fetchall() if len(r[0]) > 64 * 1024]
        assert len(big) == 2     # neither fits the small medium
        held = sc.conn.execute(q, (oa,)).fetchall()
        assert all(r in held for r in big)      # byte for byte, as a made them


def test_sealed_pieces_and_lspacket_shows_them(family, tmp_path):
    family.init("a")
    family.add("b", via="a")
    a, b = family.path("a"), family.path("b")
    _put_big(a, "big300k", 300_000, tmp_path)
    usb = tmp_path / "usb"
    assert run("export", "--to", "b", "--create-out", "--out", usb, "--max-size", "64K",
               "--encrypt", site=a).code == 0
    files = _packets(usb)
    assert len(files) >= 3 and all(f.stat().st_size <= 64 * 1024 for f in files)
    ls = run("lspacket", *files, site=b, json_mode=True)
    assert ls.code == 0 and all(p["sealed"] and p["piece"] for p in ls.json["packets"]), ls
    assert [p["piece"][0] for p in ls.json["packets"]][0] == 0
    assert "piece at 0 of a block of" in run("lspacket", files[0], site=b).out
    for f in reversed(files):
        assert run("import", f, site=b).code == 0
    assert family.digest("a") == family.digest("b")


def test_parts_that_replace_and_delete_apply_like_the_whole(family, tmp_path):
    """A transaction in parts whose ops supersede earlier versions (updates, deletes) takes
    the op-wise path part by part; one of fresh keys goes in as columns.  Both end as at the
    origin."""
    family.init("a")
    family.add("b", via="a")
    a, b = family.path("a"), family.path("b")
    assert run("load", _load_file(tmp_path, 1500), site=a).code == 0
    usb = tmp_path / "usb"
    assert run("export", "--to", "b", "--create-out", "--out", usb, "--max-size", "64K",
               site=a).code == 0
    for f in _packets(usb):
        assert run("import", f, site=b).code == 0
    assert family.digest("a") == family.digest("b")
    second = tmp_path / "second.jsonl"
    with open(second, "w") as out:
        for i in range(1500):
            line = ({"collection": "parts", "key": f"p-{i:05d}", "delete": True} if i % 3 == 0
                    else {"collection": "parts", "key": f"p-{i:05d}",
                          "value": {"pad": os.urandom(200).hex(), "round": 2}})
            out.write(json.dumps(line) + "\n")
    assert run("load", second, site=a).code == 0
    usb2 = tmp_path / "usb2"
    assert run("export", "--to", "b", "--create-out", "--out", usb2, "--max-size", "64K",
               site=a).code == 0
    files = _packets(usb2)
    assert len(files) > 2      # the transaction travels in parts
    for f in files:
        assert run("import", f, site=b).code == 0
    assert family.digest("a") == family.digest("b")
    assert run("get", "parts", "p-00000", site=b).code != 0
    got = json.loads(run("get", "parts", "p-00001", site=b).out)
    assert got["round"] == 2
    assert run("fsck", site=b).code == 0


def test_a_packet_holding_a_whole_transaction_applies_its_parts_as_they_arrive(
        family, tmp_path, monkeypatch):
    """The parts of a transaction that all travel in one packet are applied as they arrive
    (each decoded once); past the look-ahead, as before, the whole transaction is read back
    at its last part.  Both end as at the origin, and later updates and deletes too."""
    monkeypatch.setattr(site_mod, "PART_OPS", 40)
    family.init("a")
    family.add("b", via="a")
    family.add("c", via="a")
    a = family.path("a")
    assert run("load", _load_file(tmp_path, 1500, 100), site=a).code == 0
    second = tmp_path / "second.jsonl"
    with open(second, "w") as out:
        for i in range(0, 500, 2):
            line = ({"collection": "parts", "key": f"p-{i:05d}", "delete": True} if i % 4 == 0
                    else {"collection": "parts", "key": f"p-{i:05d}", "value": {"round": 2}})
            out.write(json.dumps(line) + "\n")
    assert run("load", second, site=a).code == 0
    with family.open("a") as s:
        own = [blocks.read_block_header(data) for o, _lo, _hi, data in chain.block_rows(s.conn)
               if o == s.site_id]
    assert sum(1 for b in own if b.flags) == 38         # the first load travels in parts

    read_back = []
    whole = apply_mod._Applier._whole_as_columns
    monkeypatch.setattr(apply_mod._Applier, "_whole_as_columns",
                        lambda self, *a: read_back.append(a) or whole(self, *a))
    r = family.import_("b", family.export("a", "b"))
    assert r.applied and not r.parked and read_back == []
    monkeypatch.setattr(apply_mod, "LOOKAHEAD_BYTES", 1)
    r = family.import_("c", family.export("a", "c"))
    assert r.applied and not r.parked and len(read_back) == 1
    assert family.digest("a") == family.digest("b") == family.digest("c")
    for n in ("b", "c"):
        assert run("fsck", site=family.path(n)).code == 0
        assert json.loads(run("get", "parts", "p-00002", site=family.path(n)).out) == \
            {"round": 2}
        assert run("get", "parts", "p-00004", site=family.path(n)).code != 0


def _vector(name: str) -> bytes:
    return (Path(__file__).resolve().parents[1] / "formats" / "vectors" / f"{name}.bin"
            ).read_bytes()


def test_the_look_ahead_finds_a_transaction_whose_parts_all_follow(monkeypatch):
    nxt, p1, p2, other = map(_vector, ("v2-block-next", "v2-block-part1", "v2-block-part2",
                                       "v2-block-charlie"))
    i1, i2 = blocks.read_block_header(p1), blocks.read_block_header(p2)

    def look(raws):
        whole: dict = {}
        return list(apply_mod.whole_transactions(raws, whole)), whole

    # the blocks always come through unchanged, in order
    assert look([nxt, p1, p2, other]) == (
        [nxt, p1, p2, other], {(i1.origin, i1.lo): i1.lo, (i2.origin, i2.lo): i1.lo})
    assert look([nxt, p1, other, p2]) == ([nxt, p1, other, p2], {})    # not its next block
    assert look([p1, p1, p2]) == ([p1, p1, p2], {(i1.origin, i1.lo): i1.lo,
                                               (i2.origin, i2.lo): i1.lo})  # the second one
    assert look([p1]) == ([p1], {})                                     # the last part later
    assert look([p2]) == ([p2], {})                                     # the first one before
    assert look([p1, b"not a block", p2]) == ([p1, b"not a block", p2], {})
    monkeypatch.setattr(apply_mod, "LOOKAHEAD_BYTES", len(p1) - 1)
    assert look([p1, p2]) == ([p1, p2], {})                             # too far ahead

    def damaged():
        yield p1
        raise blocks.BlockError("body ends inside a block")
    got = []
    with pytest.raises(blocks.BlockError):
        for raw in apply_mod.whole_transactions(damaged(), {}):
            got.append(raw)
    assert got == [p1]      # the damage is met after the blocks before it


def test_an_op_of_a_transaction_in_parts_is_found_without_decoding_its_blocks(
        family, tmp_path, monkeypatch):
    """A large transaction exported to a small medium is sealed again in parts that share
    its one clock: asking whether an op of it is held decoded every part, once per op (a
    peer's 300 updates over such rows took 37 s to import).  A part's ops are told by its
    bounds; the answers are the same as from the decoded blocks."""
    from collections import Counter
    from syncpack.site import Site
    family.init("a")
    family.add("b", via="a")
    a = family.path("a")
    assert run("load", _load_file(tmp_path), site=a).code == 0
    r = run("export", "--to", "b", "--create-out", "--out", tmp_path / "usb", "--max-size",
            "64K", site=a)
    assert r.code == 0, r
    with Site.open(a) as s:
        ops = [(op.hlc, op.origin, op.seq, op.epoch) for op in chain.iter_all(s.conn)]
        loaded = Counter(hlc for hlc, *_rest in ops).most_common(1)[0][0]
        ops = [op for op in ops if op[0] == loaded]       # the load's one transaction
        parts = s.conn.execute("SELECT count(*) FROM blocks WHERE hlc_first = hlc_last "
                               "AND origin = ?", (s.site_id,)).fetchone()[0]
        assert parts > 10
        decoded = []
        real = blocks.decode_ops
        monkeypatch.setattr(blocks, "decode_ops", lambda data: decoded.append(1) or real(data))
        chain._recent.clear()
        for hlc, origin, seq, epoch in ops[::97]:
            assert chain.epoch_of(s.conn, hlc, origin, seq) == epoch
        assert chain.epoch_of(s.conn, ops[-1][0], ops[-1][1], 10 ** 6) is None
        assert decoded == []


@pytest.mark.parametrize("lookahead", ["as they arrive", "read back at the last part"])
def test_a_relayed_transaction_in_parts_and_a_later_write_over_one_of_its_rows(
        family, tmp_path, monkeypatch, lookahead):
    """a's large transaction travels in parts; b updates one of its rows, then relays both to
    c in one packet, b's block first (it holds a write b made before a's transaction).  The
    update, applied first, remembered the row it replaced as superseded (not here yet), but
    the transaction then went in by the bulk path, which had looked for superseded rows only
    when the packet began: the row survived beside b's version, a conflict no other site
    had, and fsck failed for good ('differs from a replay of the changelog')."""
    monkeypatch.setattr(site_mod, "PART_OPS", 40)
    if lookahead != "as they arrive":
        monkeypatch.setattr(apply_mod, "LOOKAHEAD_BYTES", 1)
    family.init("a")
    family.add("b", via="a")
    family.add("c", via="a")
    family.full_exchange(rounds=1)
    assert run("put", "notes", "n1", '"before"', site=family.path("b")).code == 0
    assert run("load", _load_file(tmp_path, 1500, 100), site=family.path("a")).code == 0
    family.sync("a", "b")
    assert run("put", "parts", "p-00010", '{"by": "b"}', site=family.path("b")).code == 0
    r = family.import_("c", family.export("b", "c"))
    assert r.applied and not r.parked
    c = family.path("c")
    assert run("fsck", site=c).code == 0, run("fsck", site=c)
    assert run("--json", "conflicts", site=c).json["conflicts"] == []
    assert json.loads(run("get", "parts", "p-00010", site=c).out) == {"by": "b"}
    assert family.digest("b") == family.digest("c")
