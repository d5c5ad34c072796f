"""Removable media: a medium that fills up mid-export leaves no partial packet and changes
nothing in the store; the media layout lets one stick serve several sites."""

from __future__ import annotations

import builtins
import errno
import json
import os
import shutil
import subprocess

import pytest
from hypothesis import given, strategies as st

from conftest import run
from syncpack.exchange import packets


class _FillingFile:
    """A file on a medium with ``room`` bytes left: writes past it fail with ENOSPC."""

    def __init__(self, f, budget):
        self._f, self._budget = f, budget

    def write(self, b):
        if self._budget[0] < len(b):
            raise OSError(errno.ENOSPC, "No space left on device")
        self._budget[0] -= len(b)
        return self._f.write(b)

    def __getattr__(self, name):
        return getattr(self._f, name)


def _fill_medium_after(monkeypatch, room: int):
    budget = [room]
    real_open = builtins.open

    def fake_open(path, mode="r", *a, **kw):
        f = real_open(path, mode, *a, **kw)
        return _FillingFile(f, budget) if "w" in mode else f

    monkeypatch.setattr(packets, "open", fake_open, raising=False)


def _spk_files(d):
    return sorted(os.path.relpath(os.path.join(r, f), d)
                  for r, _, fs in os.walk(d) for f in fs)


def test_full_medium_mid_export_leaves_no_partial_packet(family, monkeypatch, tmp_path):
    family.init("a")
    family.add("b", via="a")
    with family.open("a") as s:
        for t in range(20):
            with s.transaction() as tx:
                for i in range(50):
                    tx.put("c", f"k{t}-{i}", {"pad": os.urandom(150).hex()})
    usb = tmp_path / "usb"
    with family.open("a") as s:
        before = s.conn.execute("SELECT count(*) FROM packets_out").fetchone()[0]
        matrix_before = s.conn.execute("SELECT * FROM matrix ORDER BY 1, 2").fetchall()
    # Room for one 64 KiB packet and part of the next.
    _fill_medium_after(monkeypatch, 80 * 1024)
    r = run("export", "--to", "b", "--create-out", "--out", usb, "--max-size", "64K",
            site=family.path("a"))
    assert r.code == 1, r
    assert "full" in r.err and "no partial packet" in r.err
    assert [f for f in _spk_files(usb) if not f.endswith(".tmp")] == []
    assert [f for f in _spk_files(usb) if f.endswith(".tmp")] == []
    with family.open("a") as s:
        assert s.conn.execute("SELECT count(*) FROM packets_out").fetchone()[0] == before
        assert s.conn.execute("SELECT * FROM matrix ORDER BY 1, 2").fetchall() == matrix_before
    monkeypatch.undo()
    # With room again the same export works and the peer converges.
    r = run("export", "--to", "b", "--create-out", "--out", usb, "--max-size", "64K",
            site=family.path("a"), json_mode=True)
    assert r.code == 0 and len(r.json["packets"]) >= 2
    assert all(p["bytes"] <= 64 * 1024 for p in r.json["packets"])
    assert run("import", usb, site=family.path("b")).code == 0
    assert family.digest("a") == family.digest("b")


def test_one_stick_serves_several_sites(family, tmp_path):
    family.init("a")
    family.add("b", via="a")
    family.add("c", via="a")
    family.full_exchange(rounds=1)
    family.put("a", "c", "k", 1)
    stick = tmp_path / "stick"
    assert run("export", "--all", "--create-out", "--out", stick, site=family.path("a")).code == 0
    files = _spk_files(stick)
    assert any(f.startswith("b/a/") for f in files) and any(f.startswith("c/a/") for f in files)
    for site in ("b", "c"):
        r = run("import", stick, site=family.path(site), json_mode=True)
        assert r.code == 0 and len(r.json["applied"]) == 1, r
        assert all(p.startswith(str(stick / site)) for p in r.json["applied"])
    assert family.digest("a") == family.digest("b") == family.digest("c")


def test_export_all_still_serves_the_others_when_one_peer_needs_a_resync(family, tmp_path):
    import shutil
    family.init("a")
    family.add("b", via="a")
    family.add("c", via="a")
    family.full_exchange(rounds=2)
    backup = tmp_path / "c-backup"
    shutil.copytree(family.path("c"), backup)
    family.put("a", "col", "k1", 1)
    family.full_exchange(rounds=3)
    assert run("scrub", site=family.path("a")).code == 0
    shutil.rmtree(family.path("c"))
    shutil.copytree(backup, family.path("c"))
    family.put("c", "col", "from-c", 1)   # c reports being behind on a's ops
    family.sync("c", "a")
    family.put("a", "col", "k2", 2)
    out = tmp_path / "all"
    r = run("export", "--all", "--create-out", "--out", out, site=family.path("a"), json_mode=True)
    assert r.code == 1, r
    doc = r.json
    # c gets our vector without ops; b gets the ops
    assert [(p["to"], p["ops"] > 0) for p in doc["packets"]] == [("b", True), ("c", False)]
    assert [f["to"] for f in doc["failed"]] == ["c"] and "resync" in doc["failed"][0]["hint"]
    assert "error: peer c needs epoch" in r.err
    assert run("import", out / "b", site=family.path("b")).code == 0
    with family.open("b") as s:
        assert s.get("col", "k2") == 2
    # again with nothing new: c is still told (it was left out, having been told before)
    r = run("export", "--all", "--create-out", "--out", tmp_path / "again",
            site=family.path("a"), json_mode=True)
    assert r.code == 1 and ("c", 0) in [(p["to"], p["ops"]) for p in r.json["packets"]], r


def _big_record_in_pieces(family, out) -> list:
    """a puts a record larger than a 64K packet and exports it to b: its pieces, in order."""
    family.put("a", "big", "k1", os.urandom(150_000).hex())
    assert run("export", "--to", "b", "--create-out", "--out", out, "--max-size", "64K",
               site=family.path("a")).code == 0
    pieces = sorted((out / "b" / "a").iterdir())
    assert len(pieces) >= 3
    return pieces


def test_pieces_left_waiting_by_a_damaged_one_go_once_their_block_came_again(family, tmp_path):
    """A record larger than --max-size travels in pieces.  One is damaged on the medium and
    deleted, as operations.md says; the sender sends the block again in later rounds.  The
    pieces parked meanwhile are then of no use: they go, and nothing stays parked."""
    family.init("a")
    family.add("b", via="a")
    first = tmp_path / "first"
    pieces = _big_record_in_pieces(family, first)
    damaged = pieces[1]
    raw = bytearray(damaged.read_bytes())
    raw[500] ^= 0xFF
    damaged.write_bytes(bytes(raw))
    assert run("import", first / "b", site=family.path("b")).code == 1
    damaged.unlink()
    for i in range(2):
        back, again = tmp_path / f"back{i}", tmp_path / f"again{i}"
        assert run("export", "--to", "a", "--create-out", "--out", back,
                   site=family.path("b")).code == 0
        run("import", back, site=family.path("a"))
        assert run("export", "--to", "b", "--create-out", "--out", again, "--max-size", "64K",
                   site=family.path("a")).code == 0
        if (again / "b").exists():
            run("import", again / "b", site=family.path("b"))
    assert family.digest("a") == family.digest("b")
    st = run("status", site=family.path("b"), json_mode=True).json
    assert st["parked"] == [], st["parked"]


def test_pieces_parked_and_imported_again_are_told_as_a_packet_parked_is(family, tmp_path):
    """Half the pieces of a block on a stick, imported twice, then all of them: a piece parked
    and imported again was listed both as parked and as a duplicate ("applied before", which
    it never was), and at the end the parked copies were listed as duplicates beside the
    same packets applied.  And lspacket counted the block's ops in every piece, where export
    counts them once, in the first."""
    family.init("a")
    family.add("b", via="a")
    family.put("a", "big", "k1", os.urandom(150_000).hex())
    out = tmp_path / "out"
    r = run("export", "--to", "b", "--create-out", "--out", out, "--max-size", "64K",
            site=family.path("a"), json_mode=True)
    assert r.code == 0
    exported = [p["ops"] for p in r.json["packets"]]
    assert exported[0] == 1 and set(exported[1:]) == {0}, exported
    listed = run("lspacket", out / "b" / "a", json_mode=True).json["packets"]
    assert [p["ops"] for p in listed] == exported
    pieces = sorted((out / "b" / "a").iterdir())
    stick = tmp_path / "stick"
    stick.mkdir()
    for p in pieces[:2]:
        shutil.copy(p, stick / p.name)
    for _ in range(2):
        doc = run("import", stick, site=family.path("b"), json_mode=True).json
        assert doc["applied"] == [] and doc["duplicates"] == [], doc
        assert sorted(p["path"] for p in doc["parked"]) == sorted(
            str(stick / p.name) for p in pieces[:2]), doc
        # told as waiting for the block's other pieces, not for epochs it holds itself
        assert all(p["waiting_for_pieces"] for p in doc["parked"]), doc
    text = run("import", stick, site=family.path("b")).out
    assert "waiting for the other pieces of its block" in text, text
    doc = run("import", out / "b", site=family.path("b"), json_mode=True).json
    assert doc["duplicates"] == [] and doc["parked"] == [], doc
    assert len(doc["applied"]) == len(pieces) and doc["ops_applied"] == 1, doc
    assert family.digest("a") == family.digest("b")
    assert run("status", site=family.path("b"), json_mode=True).json["parked"] == []


def test_an_export_removes_the_temporary_files_a_killed_export_left(family):
    """A kill between a packet's write and its rename leaves a hidden temporary file in the
    sender's own directory of the medium; nothing removed it, round after round."""
    from syncpack.exchange import packets
    a = family.init("a")
    family.add("b", via="a")
    out = family.root / "usb"
    family.put("a", "t", "k1", 1)
    assert run("export", "--to", "b", "--out", out, "--create-out", site=a).code == 0
    mine = packets.packet_dir(out, "a", "b")
    left = mine / ".0000000009-0000.spk.0badf00d.tmp"
    left.write_bytes(b"half a packet")
    foreign = out / "b" / "c"
    foreign.mkdir(parents=True)
    (foreign / ".0000000001-0000.spk.12345678.tmp").write_bytes(b"another sender's")
    family.put("a", "t", "k2", 2)
    assert run("export", "--to", "b", "--out", out, site=a).code == 0
    assert not left.exists()
    assert (foreign / ".0000000001-0000.spk.12345678.tmp").exists()    # not ours: left
    assert run("import", out, site=family.path("b")).code == 0
    assert family.digest("b") == family.digest("a")


def _tmpfs(tmp_path, size: str):
    d = tmp_path / "stick"
    d.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(d)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"a small file system cannot be mounted here: {r.stderr.strip()}")
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], capture_output=True)


@pytest.fixture
def small_stick(tmp_path):
    """A real file system of 1 MiB (tmpfs), as a small stick or a nearly full one is."""
    yield from _tmpfs(tmp_path, "1m")


@pytest.fixture
def full_stick(tmp_path):
    """A real file system of 100 KiB (tmpfs): less than an export keeps free, so no packet
    fits, as on a stick all but full."""
    yield from _tmpfs(tmp_path, "100k")


@pytest.fixture
def nearly_full_stick(tmp_path):
    """A real file system of 140 KiB (tmpfs): beyond what an export keeps free, room for a
    packet without ops, not for one with a block of a few KiB (with 4 KiB units)."""
    for d in _tmpfs(tmp_path, "140k"):
        if packets.MediumRoom.of(d).unit != 4096:
            pytest.skip("the sizes here are reckoned for 4 KiB allocation units")
        yield d


def _load(family, site: str, tag: str, n: int) -> None:
    """One transaction of ``n`` records of random hex (about 170 bytes each, compressed)."""
    f = family.root / f"{tag}.jsonl"
    f.write_text("".join(json.dumps({"collection": "c", "key": f"{tag}-{i}",
                                     "value": {"pad": os.urandom(150).hex()}}) + "\n"
                         for i in range(n)))
    assert run("load", f, site=family.path(site)).code == 0


def _empty(d) -> None:
    for p in list(d.iterdir()):
        shutil.rmtree(p) if p.is_dir() else p.unlink()


def test_a_backlog_larger_than_the_medium_moves_in_several_trips(family, small_stick):
    """The backlog (three loads, one of them alone larger than the whole stick) does not fit
    a 1 MiB medium.  Each export writes the whole packets that fit, says what is left, exits
    0 and counts what it wrote as sent; trip after trip the far end converges.  Writing all
    or nothing instead left the backlog stuck on this medium for good."""
    family.init("a")
    family.add("b", via="a")
    family.full_exchange(rounds=1)
    _load(family, "a", "small", 3000)
    _load(family, "a", "big", 8000)     # about 1.3 MB compressed: larger than the stick
    _load(family, "a", "more", 3000)
    cfg = family.root / "a.toml"
    cfg.write_text(f'site = "{family.path("a")}"\n\n[[export]]\nout = "{small_stick}"\n'
                   f'to = "all"\n')
    # the first trip by a batch round: a short medium is no failed action
    r = run("batch", cfg, json_mode=True)
    assert r.code == 0, r
    [box] = r.json["outboxes"]
    assert box["did_not_fit"]["b"] > 0 and box["packets"], r.json
    assert r.json["errors"] == [] and r.json["outcome"] == "ok"
    left = [box["did_not_fit"]["b"]]
    sizes = [p["bytes"] for p in box["packets"]]
    trips = 1
    while True:
        assert run("import", small_stick, site=family.path("b")).code == 0
        _empty(small_stick)
        r = run("export", "--to", "b", "--out", small_stick, site=family.path("a"),
                json_mode=True)
        assert r.code == 0, r
        sizes += [p["bytes"] for p in r.json["packets"]]
        if not r.json["did_not_fit"]:
            break
        assert "is full" in r.err and "did not fit" in r.err, r
        left.append(r.json["did_not_fit"]["b"])
        trips += 1
        assert trips < 15, left
    trips += 1
    assert run("import", small_stick, site=family.path("b")).code == 0
    assert trips >= 3 and left == sorted(left, reverse=True) and len(set(left)) == len(left)
    assert max(sizes) < 1024 * 1024
    assert family.digest("a") == family.digest("b")
    assert run("fsck", site=family.path("b")).code == 0
    assert run("get", "c", "big-7999", site=family.path("b")).code == 0
    # and nothing is sent twice: the next export has nothing but our vector to say
    _empty(small_stick)
    r = run("export", "--to", "b", "--out", small_stick, site=family.path("a"), json_mode=True)
    assert r.code == 0 and sum(p["ops"] for p in r.json["packets"]) == 0, r


def test_peers_sharing_a_small_medium_are_served_in_turn_until_all_converge(family,
                                                                          small_stick):
    family.init("a")
    family.add("b", via="a")
    family.add("c", via="a")
    family.full_exchange(rounds=1)
    _load(family, "a", "one", 3000)
    _load(family, "a", "two", 3000)
    trips, short = 0, 0
    while True:
        r = run("export", "--all", "--out", small_stick, site=family.path("a"), json_mode=True)
        assert r.code == 0, r
        trips += 1
        short += bool(r.json["did_not_fit"])
        for site in ("b", "c"):
            assert run("import", small_stick / site, site=family.path(site)).code == 0
        _empty(small_stick)
        if not r.json["did_not_fit"]:
            break
        assert trips < 15
    assert short >= 1
    assert family.digest("a") == family.digest("b") == family.digest("c")


def test_stale_pieces_in_a_batch_inbox_drain_once_their_block_came_again(family, tmp_path):
    """An inbox that a batch round drains (remove_after_import) holds the pieces of a block,
    one of them lost; the sender sends the block again, whole set, into the same inbox.  The
    new set applies; the old pieces are then of no use, and must leave the inbox like any
    packet whose contents arrived, not be read again and told as duplicates every round."""
    family.init("a")
    family.add("b", via="a")
    family.full_exchange(rounds=1)
    inbox = tmp_path / "inbox"
    old = _big_record_in_pieces(family, inbox)
    old[1].unlink()     # lost on the way
    cfg = tmp_path / "b.toml"
    cfg.write_text(f'site = "{family.path("b")}"\n\n[[import]]\npath = "{inbox / "b"}"\n'
                   f'remove_after_import = true\n')
    rounds = []
    for i in range(4):
        r = run("batch", cfg, json_mode=True)
        assert r.code == 0, r
        rounds.append(r.json)
        if i == 0:
            # b tells a what it lacks; a sends the block again into the same inbox
            back = tmp_path / f"back{i}"
            assert run("export", "--to", "a", "--create-out", "--out", back,
                       site=family.path("b")).code == 0
            assert run("import", back, site=family.path("a")).code == 0
            assert run("export", "--to", "b", "--out", inbox, "--max-size", "64K",
                       site=family.path("a")).code == 0
    assert family.digest("a") == family.digest("b")
    left = sorted(p for p in (inbox / "b").rglob("*.spk"))
    assert left == [], (left, rounds[1:])
    assert rounds[-1]["counts"]["duplicates"] == 0, rounds[-1]
    st = run("status", site=family.path("b"), json_mode=True).json
    assert st["parked"] == [], st["parked"]


def test_a_medium_too_full_for_any_packet_is_an_error_not_nothing_to_send(family, full_stick):
    """Not one packet fits: the export must not say there is nothing to send, nor that
    packets written carry part of it.  It writes nothing, records nothing as sent, and fails
    (exit 1, the error shown even with -q, as a medium that fills up midway does), since on
    a medium this full the backlog never moves; a batch round counts it a failed action."""
    family.init("a")
    family.add("b", via="a")
    family.full_exchange(rounds=1)
    _load(family, "a", "w", 50)
    a = family.path("a")
    r = run("export", "--to", "b", "--out", full_stick, site=a)
    assert r.code == 1, r
    assert "nothing to send" not in r.out + r.err and "packets written" not in r.err, r
    assert (f"error: the medium at {full_stick} is full: not one op fitted, no packet was "
            f"written; 50 op(s) for b did not fit (it has ") in r.err, r
    assert "hint: free space on the medium" in r.err, r
    r = run("-q", "export", "--to", "b", "--out", full_stick, site=a)
    assert r.code == 1 and r.out == "" and "error: the medium at" in r.err, r
    r = run("export", "--to", "b", "--out", full_stick, site=a, json_mode=True)
    assert r.code == 1 and r.json == {"packets": [], "did_not_fit": {"b": 50}}, r
    assert _spk_files(full_stick) == []

    cfg = family.root / "a.toml"
    cfg.write_text(f'site = "{a}"\n\n[[export]]\nout = "{full_stick}"\nto = "all"\n')
    r = run("batch", cfg)
    assert r.code == 1, r
    assert "nothing to send" not in r.out + r.err and "packets written" not in r.out, r
    assert (f"error: export {full_stick} -> all: the medium at {full_stick} is full: not one "
            f"op fitted, no packet was written") in r.err, r
    doc = run("batch", cfg, json_mode=True).json
    [box] = doc["outboxes"]
    assert box["failed"] and box["packets"] == [] and box["did_not_fit"] == {"b": 50}, doc
    assert [e["action"] for e in doc["errors"]] == ["export"] and doc["outcome"] == "failed"
    log = (a / "batch.log").read_text()
    assert "nothing to send" not in log and "is full: not one op fitted" in log
    assert _spk_files(full_stick) == []

    # nothing was recorded as sent: a medium with room gets all of it
    roomy = family.root / "roomy"
    roomy.mkdir()
    r = run("export", "--to", "b", "--out", roomy, site=a, json_mode=True)
    assert r.code == 0 and r.json["did_not_fit"] == {}, r
    assert sum(p["ops"] for p in r.json["packets"]) == 50, r
    assert run("import", roomy, site=family.path("b")).code == 0
    assert family.digest("a") == family.digest("b")


def test_a_medium_with_room_for_a_packet_without_ops_only_is_an_error_too(
        family, nearly_full_stick):
    """The medium takes this site's vector (a packet without ops) but not one op: the
    backlog does not move there either, and the packet written carries none of it."""
    family.init("a")
    family.add("b", via="a")
    family.full_exchange(rounds=1)
    _load(family, "a", "w", 50)
    r = run("export", "--to", "b", "--out", nearly_full_stick, site=family.path("a"),
            json_mode=True)
    assert r.code == 1, r
    [pk] = r.json["packets"]
    assert pk["ops"] == 0 and r.json["did_not_fit"] == {"b": 50}, r
    assert "packets written carry" not in r.err, r
    assert (f"error: the medium at {nearly_full_stick} is full: not one op fitted, only 1 "
            f"packet(s) without ops (this site's vector and acknowledgements) were written; "
            f"50 op(s) for b did not fit") in r.err, r


@given(st.integers(1024, 1 << 42), st.integers(0, 1 << 42), st.sampled_from([512, 4096, 32768]))
def test_a_medium_lowers_the_packet_limit_never_raises_it(max_size, free, unit):
    room = packets.MediumRoom(free, unit)
    cap = room.cap(max_size)
    assert cap <= max_size
    assert cap == max_size or cap >= packets.MIN_MAX_SIZE
    # lowered above the floor: two packets of it fit what is left
    if packets.MIN_MAX_SIZE < cap < max_size:
        assert 2 * cap <= room.left
