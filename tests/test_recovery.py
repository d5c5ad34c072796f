"""Issue 5, recovery (docs/design.md §3 guarantees 1, 2, 5, 6, 8 and §6): lost packets found without a
person, restore from a backup (declared and detected), epoch collisions refused, trimming only
on acknowledgements, hard resync of a peer below the floor, retired members, clock skew.

Sites are built the way a user builds them (``conftest.Family``); what a user would check is
checked through the CLI (exit codes, ``error:``/``hint:`` lines, ``--json`` fields), what only
the store can show (changelog rows, the clock) through sqlite on ``SITE/syncpack.db``.
"""

from __future__ import annotations

import json
import random
import shutil
import sqlite3
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from conftest import Family, run
from syncpack.exchange import apply, sync, verify
from syncpack.format import codec, keys
from syncpack.store import chain
from syncpack.format.codec import Header, Op
from syncpack.errors import (ClockSkewError, EpochCollisionError, PacketSenderError,
                             ScrubbedError)
from syncpack.format import blocks
from syncpack.exchange.packets import BlockRef, atomic_opener, build_update_packets
from syncpack.site import Site

DAY_MS = 24 * 3600 * 1000
NAMES = ["A", "B", "C"]


# --- helpers ----------------------------------------------------------------------------------

def three_sites(fam: Family) -> Family:
    """A, B and C, every site knowing the whole roster."""
    fam.init("A")
    fam.add("B", via="A")
    fam.add("C", via="A")
    fam.full_exchange(2)
    return fam


def db(fam: Family, name: str) -> sqlite3.Connection:
    return sqlite3.connect(fam.path(name) / "syncpack.db")


def changelog(fam: Family, name: str) -> dict[tuple[bytes, int], tuple[int, int]]:
    """(origin, epoch) -> (hlc, seq): the identity of the op each epoch names at this site."""
    with fam.open(name) as s:
        return {(op.origin, op.epoch): (op.hlc, op.seq) for op in chain.iter_all(s.conn)}


def changelog_count(fam: Family, name: str) -> int:
    with fam.open(name) as s:
        return chain.count(s.conn)


def meta(fam: Family, name: str, key: str):
    c = db(fam, name)
    try:
        row = c.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return row[0] if row else None
    finally:
        c.close()


def assert_no_epoch_reuse(fam: Family) -> None:
    """Guarantee 8: for each (origin, epoch), every site that holds it holds the same op."""
    seen: dict[tuple[bytes, int], tuple[str, tuple[int, int]]] = {}
    for name in fam.sites:
        for k, csn in changelog(fam, name).items():
            if k in seen:
                assert seen[k][1] == csn, (f"epoch {k[1]} of origin {k[0].hex()} names different "
                                           f"ops at {seen[k][0]} and {name}")
            else:
                seen[k] = (name, csn)


def vector(fam: Family, name: str) -> dict[str, int]:
    with fam.open(name) as s:
        return {o: e for o, e in s.named(s.vector()).items() if e}


def raw_vector(fam: Family, name: str) -> dict[bytes, int]:
    with fam.open(name) as s:
        return s.vector()


def site_id(fam: Family, name: str) -> bytes:
    with fam.open(name) as s:
        return s.site_id


def status(fam: Family, name: str) -> dict:
    r = run("status", site=fam.path(name), json_mode=True)
    assert r.code == 0, r
    return r.json


def assert_converged(fam: Family, names=None) -> None:
    names = list(names or fam.sites)
    digests = {n: fam.digest(n) for n in names}
    vectors = {n: vector(fam, n) for n in names}
    assert len(set(digests.values())) == 1, (digests, vectors)
    assert all(v == vectors[names[0]] for v in vectors.values()), vectors
    for n in names:
        assert fsck_ok(fam, n), run("fsck", site=fam.path(n))


def fsck_ok(fam: Family, name: str) -> bool:
    r = run("fsck", site=fam.path(name))
    return r.code == 0


def cli_export(fam: Family, name: str, *to: str, max_size: str | None = None
               ) -> tuple[Path, list[dict]]:
    out = fam.medium()
    args = ["export", "--out", out]
    args += [a for t in to for a in ("--to", t)] if to else ["--all"]
    args += ["--max-size", max_size] if max_size else []
    r = run(*args, site=fam.path(name), json_mode=True)
    assert r.code == 0, r
    return out, r.json["packets"]


def cli_import(fam: Family, name: str, *paths) -> dict:
    r = run("import", *paths, site=fam.path(name), json_mode=True)
    assert r.code == 0, r
    return r.json


def cli_rounds(fam: Family, rounds: int) -> None:
    """``rounds`` rounds in which every site exports to all and every peer imports its
    packets, each through the command."""
    for _ in range(rounds):
        for src in fam.sites:
            out, _ = cli_export(fam, src)
            for dst in fam.sites:
                if dst != src and (out / dst).exists():
                    cli_import(fam, dst, out / dst)


def backup(fam: Family, name: str) -> Path:
    """A copy of the whole site directory, taken while no command runs (every site is closed
    between the Family's calls)."""
    dest = fam.root / "backups" / name
    shutil.copytree(fam.path(name), dest)
    return dest


def put_back(fam: Family, name: str, copy: Path) -> None:
    shutil.rmtree(fam.path(name))
    shutil.copytree(copy, fam.path(name))


# --- lost packets -----------------------------------------------------------------------------

@pytest.mark.parametrize("seed", [5, 2024])
def test_random_packet_loss_converges_without_chepoch(tmp_path, seed):
    """Rounds of writes and exports between three sites; each packet is lost, delivered, or
    delivered a few rounds late (after later ones, so it is parked or a duplicate).  Nobody
    calls chepoch.  Once packets flow again, a bounded number of full rounds converges."""
    rng = random.Random(seed)
    fam = three_sites(Family(tmp_path))
    late: list[tuple[int, str, Path]] = []      # (due round, recipient, packet)
    lost = delivered = parked = n = 0
    for rnd in range(18):
        for name in NAMES:
            for _ in range(rng.choice([0, 0, 1, 2])):
                n += 1
                key = f"k{rng.randrange(12)}"
                with fam.open(name) as s, s.transaction() as tx:
                    if rng.random() < 0.2:
                        tx.delete("t", key)
                    else:
                        tx.put("t", key, {"n": n, "by": name})
        for src in NAMES:
            for dst in NAMES:
                if src == dst:
                    continue
                for p in fam.export(src, dst):
                    x = rng.random()
                    if x < 0.4:
                        lost += 1
                    elif x < 0.8:
                        delivered += 1
                        parked += len(fam.import_(dst, [p]).parked)
                    else:
                        late.append((rnd + rng.randrange(1, 4), dst, p))
        for due, dst, p in [t for t in late if t[0] == rnd]:
            res = fam.import_(dst, [p])
            assert res.rejected == []
            parked += len(res.parked)
        late = [t for t in late if t[0] != rnd]
    assert lost > 10 and delivered > 10 and parked > 0
    assert any(vector(fam, a) != vector(fam, b) for a in NAMES for b in NAMES)

    # Packets flow again: stragglers arrive, then full rounds (export, import at once).
    for _due, dst, p in late:
        fam.import_(dst, [p])
    fam.full_exchange(rounds=3)
    assert_converged(fam)
    for name in NAMES:
        st = status(fam, name)
        assert st["parked"] == []
        assert all(d["unacknowledged_ops"] == 0 and d["lag_ops"] == 0
                   for d in st["peers"].values()), (name, st["peers"])
    # ... and the probes stop once everything is acknowledged.
    for src in NAMES:
        for dst in NAMES:
            if src != dst:
                assert fam.export(src, dst) == []


def test_lost_first_packet_is_resent_after_the_peer_reports_it_parked_the_second(family):
    family.init("A")
    family.add("B", via="A")
    family.full_exchange()
    family.put("A", "t", "k1", 1)
    lost = family.export("A", "B")                 # packet 1: never arrives
    family.put("A", "t", "k2", 2)
    second = family.export("A", "B")               # packet 2: only what packet 1 did not carry
    assert len(lost) == 1 and len(second) == 1
    st = status(family, "A")
    assert st["peers"]["B"]["unacknowledged_ops"] == 2

    res = family.import_("B", second)
    assert res.applied == [] and len(res.parked) == 1
    (gap,) = res.parked[0]["waiting_for"].values()
    epoch_a = raw_vector(family, "A")[site_id(family, "A")]
    assert gap == [epoch_a - 2, epoch_a - 1]       # epochs of k1 missing: (held, from)

    # B's next packet (B wrote nothing) tells A what it holds and what it waits for ...
    reply = family.export("B", "A")
    assert len(reply) == 1
    family.import_("A", reply)
    # ... so A sends again from what B acknowledged, without anyone running chepoch.
    resend = family.export("A", "B")
    assert len(resend) == 1
    pk = verify.open_packet(resend[0])
    try:
        assert pk.header.ranges == {site_id(family, "A"): (epoch_a - 2, epoch_a)}
    finally:
        pk.close()
    res = family.import_("B", resend)
    assert res.rejected == [] and res.parked == []
    with family.open("B") as b:
        assert b.get("t", "k1") == 1 and b.get("t", "k2") == 2
        assert b.conn.execute("SELECT count(*) FROM parked").fetchone()[0] == 0
    assert not list((family.path("B") / "parked").iterdir())
    family.sync("B", "A")
    assert status(family, "A")["peers"]["B"]["unacknowledged_ops"] == 0
    assert_converged(family)


# --- restore from a backup --------------------------------------------------------------------

def _history_after_backup(fam: Family) -> Path:
    """B writes, everyone exchanges, B is backed up, then B writes more and everyone learns it
    (A and C acknowledge B's newer epochs).  Returns the backup."""
    fam.put("B", "t", "b1", "old")
    fam.full_exchange()
    copy = backup(fam, "B")
    fam.put("B", "t", "b2", "after the backup")
    with fam.open("B") as s, s.transaction() as tx:
        tx.put("t", "b3", "after the backup")
        tx.delete("t", "b1")
    fam.put("A", "t", "a1", "from A")
    fam.put("C", "t", "c1", "from C")
    fam.full_exchange()
    assert_converged(fam)
    return copy


def _recovery_round(fam: Family, name: str) -> None:
    """What the restore message tells the user: export to all peers, import their packets."""
    out, _ = cli_export(fam, name)
    for peer in fam.sites:
        if peer != name:
            cli_import(fam, peer, out)
    for peer in fam.sites:
        if peer != name:
            back, _ = cli_export(fam, peer, name)
            cli_import(fam, name, back)


def _refuses_local_writes(fam: Family, name: str) -> None:
    """Every command that writes an op refuses, syncpack's own settings too: a priority, a
    family setting or a retirement made while recovering took an epoch the peers held with
    another op, and the family refused the site's packets for good."""
    before = raw_vector(fam, name)
    other = next(n for n in fam.sites if n != name)
    for args in (("put", "t", "new", '"refused"'), ("priority", other, "7"),
                 ("require-sealing", "on"), ("rmreplica", other),
                 ("collection", "create", "fresh", "--policy", "lww")):
        r = run(*args, site=fam.path(name))
        assert r.code == 1, (args, r)
        assert "recovering" in r.err and "Traceback" not in r.err, (args, r)
    assert raw_vector(fam, name) == before
    with fam.open(name) as s:
        assert s.get("t", "new", None) is None


def test_restore_refuses_writes_until_own_ops_return_and_never_reuses_epochs(family):
    fam = three_sites(family)
    copy = _history_after_backup(fam)
    b = site_id(fam, "B")
    newest_b = raw_vector(fam, "A")[b]
    put_back(fam, "B", copy)
    assert raw_vector(fam, "B")[b] < newest_b

    r = run("restore", site=fam.path("B"), json_mode=True)
    assert r.code == 0, r
    assert r.json["state"] == "recovering"
    assert status(fam, "B")["state"] == "recovering"
    _refuses_local_writes(fam, "B")

    _recovery_round(fam, "B")
    if status(fam, "B")["state"] == "recovering":
        _refuses_local_writes(fam, "B")
        _recovery_round(fam, "B")
    assert status(fam, "B")["state"] == "normal"
    assert raw_vector(fam, "B")[b] == newest_b       # its own ops came back
    with fam.open("B") as s:
        assert s.get("t", "b2") == "after the backup"
        assert s.get("t", "b1", None) is None

    r = run("put", "t", "b4", '"after the restore"', site=fam.path("B"))
    assert r.code == 0, r
    assert raw_vector(fam, "B")[b] == newest_b + 1   # a fresh epoch, not a reused one
    fam.full_exchange()
    assert_no_epoch_reuse(fam)
    assert_converged(fam)
    with fam.open("C") as s:
        assert s.get("t", "b4") == "after the restore"


def test_a_restored_site_waits_for_its_ops_when_every_site_exports_before_importing(family):
    """After the restore, one round in which every site exports before any imports: the
    peers' packets were written before they heard of the restore, and carry none of B's ops.
    They had received B's packets numbered beyond what the restored copy remembers sending,
    so their reply read as an answer to B's report of being behind, their true claims were
    dismissed, and B went back to normal and wrote under epochs the family held (a fork
    at every site).  Now B stays recovering until its ops are back, and never reuses one."""
    fam = three_sites(family)

    def round_() -> None:
        outs = {n: cli_export(fam, n)[0] for n in fam.sites}
        for n in fam.sites:
            cli_import(fam, n, *[outs[m] for m in fam.sites if m != n])

    round_()
    round_()
    copy = backup(fam, "B")
    for i in range(3):
        assert run("put", "t", f"b{i}", f'"{i}"', site=fam.path("B")).code == 0
    round_()
    round_()
    b = site_id(fam, "B")
    newest_b = raw_vector(fam, "A")[b]
    put_back(fam, "B", copy)
    assert run("restore", site=fam.path("B")).code == 0
    for _ in range(2):
        round_()
        st = status(fam, "B")
        assert st["state"] == "recovering" or raw_vector(fam, "B")[b] == newest_b, st
        if st["state"] == "recovering":
            _refuses_local_writes(fam, "B")
            rec = st["recovery"]
            assert rec["claims_dismissed"] == [], rec
            assert rec["waiting_for_reports_from"] or rec["needed_epoch"] == newest_b, rec
    fam.full_exchange()
    assert status(fam, "B")["state"] == "normal"
    assert raw_vector(fam, "B")[b] == newest_b
    assert run("put", "t", "b4", '"after the restore"', site=fam.path("B")).code == 0
    fam.full_exchange()
    assert_no_epoch_reuse(fam)
    assert_converged(fam)
    for n in fam.sites:
        assert status(fam, n)["forks"] == [], n


def test_a_restored_site_never_writes_over_its_packets_still_on_the_medium(family):
    """The medium every site exports to and imports from (MEDIA, MEDIA/<site>) held a packet
    of B's not yet imported when B was restored from a backup.  B's store numbered its next
    packet from what the backup remembered sending: the same name, which replaced the packet
    on the medium, and the change it carried was lost at every site, silently (digests
    agreed, fsck passed)."""
    fam = three_sites(family)
    media = fam.root / "media"
    for n in fam.sites:         # the rounds of a batch: one medium, a directory per site
        assert run("export", "--all", "--out", media, "--create-out", site=fam.path(n)).code == 0
    for n in fam.sites:
        if (media / n).exists():
            assert run("import", media / n, site=fam.path(n)).code == 0
    copy = backup(fam, "B")
    fam.put("B", "t", "b1", "on the medium only")
    assert run("export", "--all", "--out", media, site=fam.path("B")).code == 0
    waiting = {p: p.read_bytes() for p in media.rglob("*.spk") if p.parent.name == "B"
               and p.parent.parent.name != "B"}
    put_back(fam, "B", copy)
    assert run("restore", site=fam.path("B")).code == 0
    for _ in range(3):
        for n in fam.sites:
            assert run("export", "--all", "--out", media, site=fam.path(n)).code == 0
            if n == "B":        # its packets of before the restore are still there, whole
                assert all(p.read_bytes() == b for p, b in waiting.items())
        for n in fam.sites:
            if (media / n).exists():
                assert run("import", media / n, site=fam.path(n)).code == 0
    for n in fam.sites:
        with fam.open(n) as s:
            assert s.get("t", "b1") == "on the medium only", n
    assert_converged(fam)


def test_restore_without_the_command_is_detected_on_import(family):
    fam = three_sites(family)
    copy = _history_after_backup(fam)
    b = site_id(fam, "B")
    newest_b = raw_vector(fam, "A")[b]
    put_back(fam, "B", copy)               # nobody runs 'syncpack restore'
    assert status(fam, "B")["state"] == "normal"

    # A has something new for B; its packet's header shows A holds more of B than B does.
    fam.put("A", "t", "a2", "news")
    out, pk = cli_export(fam, "A", "B")
    assert len(pk) == 1
    cli_import(fam, "B", out)
    st = status(fam, "B")
    assert st["state"] == "recovering", st
    _refuses_local_writes(fam, "B")

    for _ in range(3):
        if status(fam, "B")["state"] != "recovering":
            break
        _recovery_round(fam, "B")
    assert status(fam, "B")["state"] == "normal"
    assert raw_vector(fam, "B")[b] == newest_b
    fam.put("B", "t", "b4", "after recovery")
    assert raw_vector(fam, "B")[b] == newest_b + 1
    fam.full_exchange()
    assert_no_epoch_reuse(fam)
    assert_converged(fam)


def test_forged_epoch_collision_is_refused_and_data_kept(family):
    """A packet validly signed by member B that carries a different op under an epoch of B the
    receiver already holds (what a carelessly restored B would send): refused whole."""
    fam = three_sites(family)
    fam.put("B", "t", "k", "genuine")
    fam.sync("B", "A")
    b, a = site_id(fam, "B"), site_id(fam, "A")
    held = raw_vector(fam, "A")[b]
    before = (fam.digest("A"), raw_vector(fam, "A"), changelog(fam, "A"))

    with fam.open("A") as s:
        family_id, a_vec, hlc = s.family_id, s.vector(), s.last_hlc()
    forged = [
        # epoch `held` of B, which A holds as the op that wrote "genuine"
        Op(b, held, hlc + 1, 0, "t", "k", codec.encode_value("forged"), b""),
        # and a genuinely new epoch after it: the whole packet must be refused
        Op(b, held + 1, hlc + 2, 0, "t", "other", codec.encode_value("new"), b""),
    ]
    tmpl = Header(kind=codec.KIND_UPDATE, family=family_id, sender=b, recipient=a,
                  packet_id=b"", seq=1000, part=0, final=True, created_ms=int(time.time() * 1000),
                  vector={**{o: e for o, e in a_vec.items() if e}, b: held + 1})
    sign = keys.load_signing_key(fam.path("B")).sign
    media = fam.medium()
    # B itself signs the block (a relay could not): the reuse is B's own signed word.
    block = blocks.encode_block(family_id, b, blocks.ZERO_HASH, forged, sign)
    (part,) = build_update_packets([BlockRef.of(block)], tmpl, sign, 1 << 20,
                                   atomic_opener(media, lambda n: f"forged-{n}.spk"))

    with fam.open("A") as s:
        pk = verify.open_packet(part.path)
        try:
            verify.verify(s, pk)                     # signed by a current member: passes
            with pytest.raises(apply.ForkFound):     # B's two signed blocks prove a fork
                apply.apply_packet(s, pk)
        finally:
            pk.close()
    # Issue 23: a fork of B, loudly; B's range is not applied, the evidence is kept.
    r = run("import", part.path, site=fam.path("A"), json_mode=True)
    assert r.code == 1, r
    assert "fork: B signed two histories" in r.err and f"epoch {held}" in r.err, r
    assert [(f["origin"], f["epoch"]) for f in r.json["forks"]] == [("B", held)]
    with fam.open("A") as s:
        assert s.get("t", "k") == "genuine" and s.get("t", "other", None) is None
        assert s.conn.execute("SELECT count(*) FROM parked").fetchone()[0] == 0
    assert (fam.digest("A"), raw_vector(fam, "A"), changelog(fam, "A")) == before
    assert fsck_ok(fam, "A")


# --- clock skew -------------------------------------------------------------------------------

def test_packet_from_a_clock_two_days_ahead_is_refused_whole(family):
    family.init("A")
    family.add("B", via="A")
    family.full_exchange()
    family.put("A", "t", "fine", 1)
    now = int(time.time() * 1000)
    with Site.open(family.path("A"), clock=lambda: now + 2 * DAY_MS) as s, s.transaction() as tx:
        tx.put("t", "future", 2)
    paths = family.export("A", "B")
    assert len(paths) == 1                       # both transactions in one packet
    hlc, dig, vec = meta(family, "B", "hlc"), family.digest("B"), raw_vector(family, "B")

    r = run("import", *paths, site=family.path("B"))
    assert r.code == 1, r
    assert "ahead of this site's clock" in r.err, r
    with family.open("B") as s:
        pk = verify.open_packet(paths[0])
        try:
            with pytest.raises(ClockSkewError):      # the one verifier checks the clock
                verify.verify(s, pk)
        finally:
            pk.close()
        assert s.get("t", "fine", None) is None      # refused whole, the good op too
        assert s.conn.execute("SELECT count(*) FROM parked").fetchone()[0] == 0
    assert (meta(family, "B", "hlc"), family.digest("B"), raw_vector(family, "B")) == (hlc, dig,
                                                                                       vec)


def test_receiver_clock_behind_refuses_then_accepts_when_in_range(family):
    family.init("A")
    family.add("B", via="A")
    family.full_exchange()
    family.put("A", "t", "k", 1)
    paths = family.export("A", "B")
    hlc, dig = meta(family, "B", "hlc"), family.digest("B")
    now = int(time.time() * 1000)
    with family.open("B") as s:
        res = sync.import_packets(s, paths, now_ms=now - 2 * DAY_MS)
    assert res.applied == [] and len(res.rejected) == 1
    assert "ahead of this site's clock" in res.rejected[0]["error"]
    assert (meta(family, "B", "hlc"), family.digest("B")) == (hlc, dig)
    with family.open("B") as s:                 # just under the one-day limit: fine
        res = sync.import_packets(s, paths, now_ms=now - DAY_MS + 60_000)
    assert res.rejected == [] and len(res.applied) == 1
    assert family.digest("A") == family.digest("B")


# --- retired members --------------------------------------------------------------------------

def test_rmreplica_replicates_refuses_the_retired_and_scrub_stops_waiting(family):
    fam = three_sites(family)
    a, c = site_id(fam, "A"), site_id(fam, "C")
    for i in range(4):
        fam.put("A", "t", f"a{i}", i)
    fam.sync("A", "B")
    fam.sync("B", "A")                           # B acknowledges; C never hears of a0..a3
    c_holds = raw_vector(fam, "C")[a]
    r = run("scrub", site=fam.path("A"), json_mode=True)
    assert r.code == 0, r
    with fam.open("A") as s:
        assert s.floors()[a] <= c_holds           # scrub waits for C

    fam.put("C", "t", "c-before", 1)             # C does not know what is coming
    r = run("rmreplica", "C", site=fam.path("A"), json_mode=True)
    assert r.code == 0, r
    assert r.json == {"site": "C", "retired": True}
    fam.sync("A", "B")
    with fam.open("B") as s:
        assert s.roster()["C"].retired
        assert c not in s.members_by_id()

    for dst in ("A", "B"):
        pk = fam.export("C", dst)
        assert pk
        before = fam.digest(dst)
        r = run("import", *pk, site=fam.path(dst))
        assert r.code == 1, r
        assert "retired" in r.err, r
        with fam.open(dst) as s:
            op = verify.open_packet(pk[0])
            try:
                with pytest.raises(PacketSenderError, match="retired"):
                    verify.verify(s, op)
            finally:
                op.close()
            assert s.get("t", "c-before", None) is None
        assert fam.digest(dst) == before

    fam.sync("B", "A")                           # B acknowledges the retirement op too
    r = run("scrub", site=fam.path("A"), json_mode=True)
    assert r.code == 0, r
    assert r.json["ops_removed"] > 0
    with fam.open("A") as s:
        assert s.floors()[a] == s.vector()[a] > c_holds   # no longer waits for C
    for _ in range(2):
        fam.sync("A", "B")
        fam.sync("B", "A")
    assert_converged(fam, ["A", "B"])


# --- trimming ---------------------------------------------------------------------------------

def test_scrub_dry_run_changes_nothing_and_reports_what_would_go(family):
    fam = three_sites(family)
    for i in range(5):
        fam.put("A", "t", f"k{i}", i)
    with fam.open("B") as s, s.transaction() as tx:
        tx.delete("t", "k0")
    fam.full_exchange()
    a = site_id(fam, "A")
    count, dig, vec = changelog_count(fam, "A"), fam.digest("A"), raw_vector(fam, "A")

    dry = run("scrub", "--dry-run", site=fam.path("A"), json_mode=True)
    assert dry.code == 0, dry
    assert dry.json["dry_run"] is True and dry.json["ops_removed"] > 0
    assert dry.json["floors"]["A"] == vec[a]
    assert changelog_count(fam, "A") == count
    assert fam.digest("A") == dig
    with fam.open("A") as s:
        assert s.floors()[a] == 0
        assert s.conn.execute("SELECT count(*) FROM tomb_pending").fetchone()[0] == 0
    human = run("scrub", "--dry-run", site=fam.path("A"))
    assert human.code == 0 and f"would remove {dry.json['ops_removed']} changelog op(s)" in human.out

    real = run("scrub", site=fam.path("A"), json_mode=True)
    assert real.code == 0, real
    assert real.json["dry_run"] is False
    assert (real.json["ops_removed"], real.json["floors"]) == (dry.json["ops_removed"],
                                                               dry.json["floors"])
    assert changelog_count(fam, "A") == count - real.json["ops_removed"]
    assert fam.digest("A") == dig and fsck_ok(fam, "A")


def test_scrub_of_a_large_transaction_of_deletes_reads_each_block_once(family, monkeypatch):
    """A tombstone's epoch is found in the block that holds it: a transaction of many deletes
    is one block, which scrub once read (and hashed) per tombstone, so 20,000 deletes took
    21 s and 100,000 most of an hour.  The tombstones go all the same, in two phases."""
    from syncpack.admin import recovery
    fam = three_sites(family)
    n = chain.SEAL_AT_COMMIT + 200              # sealed at commit: one block each
    with fam.open("A") as s:
        with s.transaction() as tx:
            for i in range(n):
                tx.put("t", f"k{i}", i)
        with s.transaction() as tx:
            for i in range(n):
                tx.delete("t", f"k{i}")
    with fam.open("B") as s, s.transaction() as tx:
        tx.delete("t", "b-only")                # a small one: still in B's changelog
    fam.full_exchange(3)

    reads: list[int] = []
    real_read = chain.block_bytes
    monkeypatch.setattr(chain, "block_bytes",
                        lambda conn, b: reads.append(1) or real_read(conn, b))
    with fam.open("A") as s:
        ops = list(chain.iter_all(s.conn))
        held = chain.epochs_of(s.conn, [(op.hlc, op.origin, op.seq) for op in ops])
        # every op held is found, at its own epoch
        assert held == {(op.hlc, op.origin, op.seq): op.epoch for op in ops}
        blocks_held = s.conn.execute("SELECT count(*) FROM blocks").fetchone()[0]
        reads.clear()
        first = recovery.scrub(s)
        assert len(reads) <= blocks_held
    assert first["tombstones_waiting"] == n + 1
    fam.full_exchange(2)                        # the peers acknowledge what A held then
    with fam.open("A") as s:
        second = recovery.scrub(s)
        assert second["tombstones_removed"] == n + 1
        assert s.conn.execute("SELECT count(*) FROM versions WHERE value IS NULL"
                              ).fetchone()[0] == 0
    assert fsck_ok(fam, "A")


def test_peer_below_the_floor_needs_a_resync_that_keeps_its_unacknowledged_ops(family):
    fam = three_sites(family)
    fam.put("C", "t", "c0", "before the backup")
    fam.full_exchange()
    copy = backup(fam, "C")           # C writes nothing more before it is put back
    for i in range(6):
        fam.put("A", "t", f"a{i}", i)
    fam.full_exchange()               # every member acknowledges a0..a5
    r = run("scrub", site=fam.path("A"), json_mode=True)
    assert r.code == 0 and r.json["ops_removed"] > 0, r
    a = site_id(fam, "A")
    floor = r.json["floors"]["A"]

    put_back(fam, "C", copy)
    c = site_id(fam, "C")
    c_has, c_own_epoch = raw_vector(fam, "C")[a], raw_vector(fam, "C")[c]
    assert c_own_epoch == raw_vector(fam, "A")[c]      # nothing of C's own was lost
    assert c_has < floor
    # A, still believing C holds a0..a5, sends only a new op; C parks it and reports the gap.
    fam.put("A", "t", "a-new", "news")
    res = fam.import_("C", fam.export("A", "C"))
    assert len(res.parked) == 1
    res = fam.import_("A", fam.export("C", "A"))
    assert res.applied and not res.rejected
    # C's own local ops, made now and never exported (C's own history was not lost: no restore
    # state, fresh epochs).
    with fam.open("C") as s, s.transaction() as tx:
        tx.put("t", "c-local", "kept")
        tx.delete("t", "c0")
    fam.put("C", "t", "c-local2", "kept too")
    c_own = changelog(fam, "C")

    out = fam.medium()
    r = run("export", "--to", "C", "--out", out, site=fam.path("A"))
    assert r.code == 1, r
    error = [ln for ln in r.err.splitlines() if ln.startswith("error:")]
    assert len(error) == 1, r
    assert "peer C" in error[0] and f"epoch {c_has + 1} of A" in error[0], r
    assert f"starts at epoch {floor + 1}" in error[0], r
    assert "hint:" in r.err and "syncpack resync --to C" in r.err, r
    # C still learns A's vector (no ops): what only a snapshot can now bring it
    sent = list(out.rglob("*.spk"))
    assert len(sent) == 1 and json.loads(run("lspacket", sent[0], json_mode=True).out)[
        "packets"][0]["ops"] == 0
    with fam.open("A") as s, pytest.raises(ScrubbedError):
        sync.export(s, fam.medium(), to=["C"])

    snap = fam.medium()
    r = run("resync", "--to", "C", "--out", snap, site=fam.path("A"), json_mode=True)
    assert r.code == 0 and r.json["packets"], r
    imp = cli_import(fam, "C", snap)
    assert imp["applied"] and imp["rejected"] == []
    with fam.open("C") as s:
        assert s.get("t", "a5") == 5 and s.get("t", "a-new") == "news"
        assert s.get("t", "c-local") == "kept" and s.get("t", "c-local2") == "kept too"
        assert s.get("t", "c0", None) is None
        assert s.conn.execute("SELECT count(*) FROM parked").fetchone()[0] == 0
    assert fsck_ok(fam, "C")

    fam.full_exchange(rounds=2)
    assert_converged(fam)
    assert_no_epoch_reuse(fam)
    with fam.open("B") as s:
        assert s.get("t", "c-local") == "kept" and s.get("t", "c-local2") == "kept too"
        assert s.get("t", "c0", None) is None
    local = {k: v for k, v in c_own.items() if k[0] == c and k[1] > c_own_epoch}
    assert len(local) == 3
    for name in ("A", "B", "C"):        # the same ops under the same epochs everywhere
        held = changelog(fam, name)
        assert {k: held.get(k) for k in local} == local


_TEMPLATE: list = []


def _fresh_three_sites(root: Path) -> Family:
    """A copy of one prebuilt A/B/C family (building one per example would dominate the run)."""
    if not _TEMPLATE:
        keep = tempfile.TemporaryDirectory(prefix="syncpack-trim-template-")
        three_sites(Family(Path(keep.name) / "fam"))
        _TEMPLATE.append(keep)
    shutil.copytree(Path(_TEMPLATE[0].name) / "fam", root)
    fam = Family(root)
    fam.sites = {n: root / n for n in NAMES}
    fam._n = 10_000
    return fam


SITE = st.sampled_from(NAMES)
STEP = st.one_of(
    st.tuples(st.just("write"), SITE, st.integers(0, 4), st.booleans()),
    st.tuples(st.just("export"), SITE, SITE, st.sampled_from(["deliver", "lose", "hold"])),
    st.tuples(st.just("deliver_held"), st.integers(0, 10)),
    st.tuples(st.just("scrub"), SITE),
)


@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(steps=st.lists(STEP, min_size=4, max_size=28))
def test_scrub_never_trims_what_a_member_does_not_hold(steps):
    """Random writes (puts and deletes), exports that are delivered, lost or held back, and
    scrubs (each a dry run first) at three sites.  After every scrub at S, S's floor for each
    origin is at most what every other member actually holds; at the end, full rounds (with
    more scrubs) converge."""
    with tempfile.TemporaryDirectory() as tmp:
        fam = _fresh_three_sites(Path(tmp) / "fam")
        held: list[tuple[str, Path]] = []
        n = 0

        def scrub(name: str) -> None:
            before = changelog_count(fam, name)
            with fam.open(name) as s:
                floors_before = s.floors()
            dry = run("scrub", "--dry-run", site=fam.path(name), json_mode=True)
            assert dry.code == 0, dry
            assert changelog_count(fam, name) == before
            with fam.open(name) as s:
                assert s.floors() == floors_before
            r = run("scrub", site=fam.path(name), json_mode=True)
            assert r.code == 0, r
            assert (r.json["ops_removed"], r.json["floors"]) == (dry.json["ops_removed"],
                                                                 dry.json["floors"])
            assert changelog_count(fam, name) == before - r.json["ops_removed"]
            with fam.open(name) as s:
                floors = s.floors()
            actual = {m: raw_vector(fam, m) for m in NAMES if m != name}
            for origin, floor in floors.items():
                for m, vec in actual.items():
                    assert floor <= vec.get(origin, 0), (
                        f"{name} trimmed {origin.hex()} to {floor}, {m} holds "
                        f"{vec.get(origin, 0)}")

        for step in steps:
            if step[0] == "write":
                _, name, k, delete = step
                n += 1
                with fam.open(name) as s, s.transaction() as tx:
                    if delete:
                        tx.delete("t", f"k{k}")
                    else:
                        tx.put("t", f"k{k}", {"n": n, "at": name})
            elif step[0] == "export":
                _, src, dst, fate = step
                if src == dst:
                    continue
                paths = fam.export(src, dst)
                if fate == "deliver":
                    fam.import_(dst, paths)
                elif fate == "hold":
                    held += [(dst, p) for p in paths]
            elif step[0] == "deliver_held":
                if held:
                    dst, p = held.pop(step[1] % len(held))
                    fam.import_(dst, [p])
            else:
                scrub(step[1])

        fam.full_exchange(rounds=3)
        for _ in range(2):             # twice: tombstones go in two phases
            for name in NAMES:
                scrub(name)
            fam.full_exchange(rounds=1)
        assert_converged(fam)
        assert_no_epoch_reuse(fam)


def test_restored_site_below_every_floor_recovers_through_a_resync(family):
    """B is restored after every site has trimmed past B's backup, B's own ops included, so
    nobody can send B what it lacks and A re-seeds it.  B's recovery then completes with the
    usual rounds: B must not try to send C the own ops it only holds inside the snapshot (its
    belief about C was reset by the restore; C has them anyway), and nothing is reused.

    B's backup is taken before B's first write, so B has no own op of its own history in its
    changelog (see the report: own ops set aside at restore and then only returned inside a
    snapshot are a separate problem)."""
    fam = three_sites(family)
    copy = backup(fam, "B")
    fam.put("B", "t", "b1", "after the backup")
    with fam.open("B") as s, s.transaction() as tx:
        tx.put("t", "b2", "after the backup")
        tx.delete("t", "b1")
    fam.put("A", "t", "a1", "from A")
    fam.put("C", "t", "c1", "from C")
    fam.full_exchange(rounds=3)
    for name in NAMES:
        r = run("scrub", site=fam.path(name), json_mode=True)
        assert r.code == 0 and r.json["ops_removed"] > 0, r
    b = site_id(fam, "B")
    newest_b = raw_vector(fam, "A")[b]
    for name in NAMES:
        with fam.open(name) as s:
            assert s.floors()[b] == newest_b
    put_back(fam, "B", copy)
    assert raw_vector(fam, "B").get(b, 0) == 0
    assert run("restore", site=fam.path("B")).code == 0

    out, _ = cli_export(fam, "B")
    for peer in ("A", "C"):
        cli_import(fam, peer, out)
        r = run("export", "--to", "B", "--out", fam.medium(), site=fam.path(peer))
        assert r.code == 1 and "peer B needs epoch" in r.err and "resync" in r.err, r
    snap = fam.medium()
    assert run("resync", "--to", "B", "--out", snap, site=fam.path("A")).code == 0
    cli_import(fam, "B", snap)
    assert raw_vector(fam, "B")[b] == newest_b
    _refuses_local_writes(fam, "B")              # C has not reported yet
    _recovery_round(fam, "B")
    assert status(fam, "B")["state"] == "normal"

    fam.put("B", "t", "b9", "fresh")
    assert raw_vector(fam, "B")[b] == newest_b + 1
    fam.full_exchange(rounds=2)
    assert_converged(fam)
    assert_no_epoch_reuse(fam)
    with fam.open("C") as s:
        assert s.get("t", "b1", None) is None and s.get("t", "b9") == "fresh"


def b_restored_after_all_trimmed(family, key: str, value: str) -> Family:
    """Three sites; B writes t/key after a backup, every site trims it, and B's directory is
    put back from the backup."""
    fam = three_sites(family)
    copy = backup(fam, "B")
    fam.put("B", "t", key, value)
    fam.full_exchange(rounds=3)
    for name in NAMES:
        assert run("scrub", site=fam.path(name)).code == 0
    put_back(fam, "B", copy)
    return fam


def test_the_first_export_after_a_resync_plans_from_the_snapshot_not_the_stale_report(family):
    """The site that re-seeded B exports to B before B has answered (a batch round at A, say).
    A plans B's own origin from B's last report, taken before the snapshot, when B held none
    of its trimmed history: the export failed and told the administrator to resync once more,
    for a snapshot B had already taken in.  C, which sent B no snapshot, still says so."""
    fam = b_restored_after_all_trimmed(family, "b1", "after the backup")
    assert run("restore", site=fam.path("B")).code == 0
    out, _ = cli_export(fam, "B")
    for peer in ("A", "C"):
        cli_import(fam, peer, out)
    snap = fam.medium()
    assert run("resync", "--to", "B", "--out", snap, site=fam.path("A")).code == 0
    cli_import(fam, "B", snap)

    r = run("export", "--to", "B", "--out", fam.medium(), site=fam.path("A"))
    assert r.code == 0, r
    r = run("export", "--to", "B", "--out", fam.medium(), site=fam.path("C"))
    assert r.code == 1 and "peer B needs epoch" in r.err, r
    _recovery_round(fam, "B")
    fam.put("B", "t", "b2", "fresh")
    fam.full_exchange(rounds=2)
    assert_converged(fam)
    with fam.open("C") as s:
        assert s.get("t", "b1") == "after the backup" and s.get("t", "b2") == "fresh"


def test_a_reseed_keeps_the_own_ops_only_the_reseeded_site_holds(family):
    """C seeds D, then D re-seeds C before C's roster op (the one that added D) reached anyone
    else: D holds that op only inside its snapshot, so C's changelog is the only place it
    exists.  The re-seed kept it there; trimmed, the family lost it, and B and A could never
    take C's later ops (each waits for the one before it), silently."""
    fam = family
    fam.init("A")
    fam.add("B", via="A")
    fam.add("C", via="B")
    fam.add("D", via="C")
    fam.put("C", "t", "c1", "before the re-seed")
    snap = fam.medium()
    assert run("resync", "--to", "C", "--out", snap, site=fam.path("D")).code == 0
    cli_import(fam, "C", snap)
    fam.put("C", "t", "c2", "after the re-seed")
    for src, dst in (("C", "B"), ("B", "A")):
        fam.sync(src, dst)
    fam.full_exchange(rounds=2)
    assert_converged(fam)
    for name in ("A", "B", "D"):
        with fam.open(name) as s:
            assert s.get("t", "c1") == "before the re-seed"
            assert s.get("t", "c2") == "after the re-seed"
            assert "D" in s.names().values()
    assert all(fsck_ok(fam, n) for n in ("A", "B", "C", "D"))


def test_fsck_waits_for_a_command_working_on_the_site(family):
    """fsck beside an import (a scheduled round's, say) read the store and the attached file
    while that import had committed one and not yet the other, and reported damage that was
    not there, with the hint to restore the site or take the file's rows as changes.  It
    waits for the site's lock now, as the other commands do, and reads the vector in the
    snapshot it checks."""
    import subprocess
    import sys
    fam = three_sites(family)
    exe = shutil.which("syncpack", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.skip("needs the syncpack script of this venv")
    with fam.open("B") as s:
        with s.lock():
            p = subprocess.Popen([exe, "--site", str(fam.path("B")), "fsck"],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            time.sleep(1.5)
            assert p.poll() is None         # waiting for the lock held here
            with s.transaction() as tx:     # what the command holding it commits
                tx.put("t", "during", "the wait")
        out, err = p.communicate(timeout=60)
    assert p.returncode == 0, (out, err)
    assert "waiting for another syncpack command on site 'B'" in err, err


def _rounds(fam: Family, names: list[str], rounds: int, cli: bool = False) -> None:
    """Full rounds among ``names``; through the command (``cli``), whatever each export and
    import says (a fork makes them fail until it heals)."""
    for _ in range(rounds):
        for s in names:
            for t in names:
                if s == t:
                    continue
                if cli:
                    out = fam.medium()
                    run("export", "--to", t, "--out", out, site=fam.path(s))
                    run("import", out, site=fam.path(t))
                else:
                    fam.sync(s, t)


def test_restore_finish_reissues_the_writes_made_since_a_careless_restore(family):
    """A member that held the restored site's ops is gone for good, so the recovery waits for
    it forever and the administrator ends it with 'restore --finish': the local write made
    after the restore, set aside when the fork showed, must still reach the family."""
    fam = three_sites(family)
    fam.add("D", via="A")
    fam.full_exchange(2)
    copy = backup(fam, "A")
    fam.put("A", "t", "x", "before the restore")
    live = ["A", "B", "C"]
    _rounds(fam, live, 1)
    put_back(fam, "A", copy)                    # nobody runs 'syncpack restore'
    fam.put("A", "t", "y", "after the restore")
    _rounds(fam, live, 3, cli=True)
    st = status(fam, "A")
    assert st["state"] == "recovering" and st["recovery"]["ops_to_reissue"] == 1, st
    r = run("restore", "--finish", site=fam.path("A"))
    assert r.code == 0, r
    _rounds(fam, live, 2)
    assert_converged(fam, live)
    for name in live:
        with fam.open(name) as s:
            assert s.get("t", "y") == "after the restore"
            assert s.get("t", "x") == "before the restore"


def test_a_careless_restore_after_the_peers_trimmed_is_found_and_heals_by_a_resync(family):
    """B is backed up, writes x, every site acknowledges and trims it; B's directory is put
    back and B writes y under x's epoch.  No site held x's block any more, so nothing told
    the two apart: B kept y, the others x, every command said all was well, and the family
    was split for good.  The trimmed block's signed header now proves the fork; B recovers
    through the resync the status names, and the family ends holding x and y."""
    fam = b_restored_after_all_trimmed(family, "x", "before the restore")
    # nobody runs 'syncpack restore'
    fam.put("B", "t", "y", "after the restore")
    _rounds(fam, NAMES, 2, cli=True)
    for name in ("A", "C"):
        forks = status(fam, name)["forks"]
        assert forks and forks[0]["origin"] == "B", (name, forks)
    st = status(fam, "B")
    assert st["state"] == "recovering" and "resync" in run("status", site=fam.path("B")).out
    snap = fam.medium()
    assert run("resync", "--to", "B", "--out", snap, site=fam.path("A")).code == 0
    cli_import(fam, "B", snap)
    _rounds(fam, NAMES, 3, cli=True)
    assert_converged(fam)
    assert_no_epoch_reuse(fam)
    for name in NAMES:
        with fam.open(name) as s:
            assert s.get("t", "x") == "before the restore"
            assert s.get("t", "y") == "after the restore"


def test_a_restored_spoke_behind_a_hub_finishes_its_recovery(family):
    """B and D exchange media only with the hub C.  A restored B waited for reports from D,
    which never sends B a packet: its signed acknowledgements, relayed by C, are its word, so
    B finishes its recovery by the ordinary rounds through the hub."""
    fam = family
    fam.init("C")
    for name in ("A", "B", "D"):
        fam.add(name, via="C")
    spokes = ["A", "B", "D"]

    def hub_round():
        for s in spokes:
            fam.sync(s, "C")
        for s in spokes:
            fam.sync("C", s)

    for _ in range(3):
        hub_round()
    copy = backup(fam, "B")
    fam.put("B", "t", "x", "before the restore")
    hub_round()
    put_back(fam, "B", copy)
    assert run("restore", site=fam.path("B")).code == 0
    for _ in range(4):
        hub_round()
    st = status(fam, "B")
    assert st["state"] == "normal", st
    fam.put("B", "t", "y", "after the recovery")
    for _ in range(2):
        hub_round()
    assert_converged(fam)
    assert_no_epoch_reuse(fam)
    with fam.open("D") as s:
        assert s.get("t", "x") == "before the restore" and s.get("t", "y") == "after the recovery"


# --- a hub and its spokes: the members' word travels without changes to carry it ---------------

def _hub_round(fam: Family, hub: str = "A") -> int:
    """Every spoke to the hub, the hub to every spoke, through the command; the packets
    written."""
    written = 0
    for spoke in (n for n in fam.sites if n != hub):
        for src, dst in ((spoke, hub), (hub, spoke)):
            out, packets = cli_export(fam, src, dst)
            written += len(packets)
            if packets:
                cli_import(fam, dst, out)
    return written


def _hub_and_spokes(fam: Family) -> Family:
    """A is the hub; B and C never meet."""
    fam.init("A")
    fam.add("B", via="A")
    fam.add("C", via="A")
    for _ in range(3):
        _hub_round(fam)
    return fam


def test_a_spoke_hears_through_its_hub_that_the_other_spokes_hold_its_changes(family):
    """B's change reaches C through A, and C's word that it holds it goes back through A:
    before, A wrote B nothing once it had no change for it, so B showed a backlog of 1 op
    for C for good and could never trim the change, every digest equal."""
    fam = _hub_and_spokes(family)
    fam.put("B", "t", "b1", "from B")
    for _ in range(4):
        _hub_round(fam)
    assert_converged(fam)
    peers = status(fam, "B")["peers"]
    assert peers["C"]["lag_ops"] == 0, peers
    r = run("scrub", "--dry-run", site=fam.path("B"), json_mode=True)
    assert r.code == 0 and r.json["ops_removed"] >= 1, r
    # and the rounds fall quiet: a word that says nothing new is no reason for a packet
    assert _hub_round(fam) == 0


def test_a_restored_spoke_returns_to_normal_through_ordinary_rounds(family):
    """B is restored from a backup; C, the other spoke, has nothing to send and never meets B,
    so its word of how much of B's history it holds reached B only once some member wrote a
    change: B stayed recovering, refusing local writes, through any number of rounds."""
    fam = _hub_and_spokes(family)
    fam.put("B", "t", "b1", "before the backup")
    for _ in range(2):
        _hub_round(fam)
    copy = backup(fam, "B")
    fam.put("B", "t", "b2", "after the backup")
    for _ in range(2):
        _hub_round(fam)
    put_back(fam, "B", copy)
    assert run("restore", site=fam.path("B")).code == 0
    for _ in range(6):
        _hub_round(fam)
    rec = status(fam, "B")["recovery"]
    assert rec["state"] == "normal", json.dumps(rec)
    with fam.open("B") as s:
        assert s.get("t", "b2") == "after the backup"
    assert run("put", "t", "b3", '"after the restore"', site=fam.path("B")).code == 0
    for _ in range(3):
        _hub_round(fam)
    assert_converged(fam)
    assert _hub_round(fam) == 0


def test_a_member_added_at_two_sites_at_once_does_not_split_the_family(family):
    """The first snapshot medium for D is lost, and the administrator adds D again at another
    member before the two have exchanged: two roster entries for D, the same keys, each with
    the base of its own snapshot.  Each side refused the other's entry ('would change the
    state that member was created from'), and with it every packet, for good."""
    fam = three_sites(family)
    d = fam.root / "D"
    pub = run("keygen", d, "--site", "D", json_mode=True).json["public_key"]
    fam.put("A", "t", "a0", 0)          # the two snapshots hold different states
    fam.put("B", "t", "b0", 0)
    kept, second = fam.medium(), fam.medium()
    assert run("mkreplica", "export", "--site", "D", "--pubkey", pub, "--out", kept,
               site=fam.path("A")).code == 0
    # the entry written last claims D holds b0, which the snapshot D took does not
    assert run("mkreplica", "export", "--site", "D", "--pubkey", pub, "--out", second,
               site=fam.path("B")).code == 0
    assert run("mkreplica", "import", kept, site=d).code == 0
    fam.sites["D"] = d
    for n in ("A", "B", "C", "D"):
        fam.put(n, "t", n.lower(), n)
    cli_rounds(fam, 4)
    assert_converged(fam)
    with fam.open("C") as s:
        assert {k: s.get("t", k) for k in ("a0", "b0", "a", "b", "c", "d")} == \
            {"a0": 0, "b0": 0, "a": "A", "b": "B", "c": "C", "d": "D"}
    with fam.open("D") as s:
        assert s.get("t", "b0") == 0


def test_two_sites_added_at_once_under_names_alike_but_for_case_do_not_split_the_family(
        family):
    """A adds 'Boston' and B adds 'boston' (two new sites, two keys) before they exchange.
    mkreplica refuses a name another member holds but for case, and so did every import: each
    side refused the other's entry, and with it every packet, for good, with a hint blaming
    the packet; retiring one of them did not help.  Every site now keeps the same one (the
    lower site id) and reads the other as retired, and says so."""
    fam = three_sites(family)
    new = {}
    for name, at in (("Boston", "A"), ("boston", "B")):
        d = fam.root / name
        pub = run("keygen", d, "--site", name, json_mode=True).json["public_key"]
        medium = fam.medium()
        assert run("mkreplica", "export", "--site", name, "--pubkey", pub, "--out", medium,
                   site=fam.path(at)).code == 0
        assert run("mkreplica", "import", medium, site=d).code == 0
        new[name] = d
    with fam.open("A") as s:
        ids = {m.name: m.site_id for m in s.roster().values()}
    for name, d in new.items():
        with Site.open(d) as s:
            ids[name] = s.site_id
    keeper, loser = sorted(new, key=lambda n: ids[n])
    for n in ("A", "B", "C"):
        fam.put(n, "t", n.lower(), n)
    fam.sites[keeper] = new[keeper]
    fam.put(keeper, "t", "kept", keeper)
    cli_rounds(fam, 4)
    assert_converged(fam)
    with fam.open("C") as s:
        assert {k: s.get("t", k) for k in ("a", "b", "c", "kept")} == \
            {"a": "A", "b": "B", "c": "C", "kept": keeper}
    for n in fam.sites:
        said = [r for r in status(fam, n)["retired"] if r["site"] == loser]
        assert said == [{"site": loser, "by": [], "name_clash": keeper,
                         "name_clash_written_by": [{"Boston": "A", "boston": "B"}[keeper]]}], \
            (n, said)
    r = run("status", site=fam.path("C"))
    written = {"Boston": "A", "boston": "B"}[keeper]
    assert f"retired: {loser}: {keeper} (its entry written by {written}) has its name" in r.out, r
    r = run("rmreplica", loser, "--undo", site=fam.path("C"))
    assert r.code == 1 and "but for case" in r.err and "a name no member holds" in r.err, r


def test_a_roster_entry_raising_a_members_base_is_still_refused(family, tmp_path):
    """What the check is for: a member rewriting another's entry (having seen it) to claim
    it joined holding more, so that no site sends it what lies below."""
    fam = three_sites(family)
    with fam.open("B") as s:
        m = s.member_named("C")
        m.base = {**m.base, s.site_id: 10**6}
        from syncpack.replicated import ROSTER
        with s.transaction(_system=True) as tx:
            tx.write_raw(ROSTER, "C", codec.encode_value(m.to_value()))
    out, _ = cli_export(fam, "B", "A")
    r = run("import", out, site=fam.path("A"), json_mode=True)
    assert r.code != 0 and "created from" in r.out + r.err, r


def test_one_packet_named_at_two_paths_is_parked_once(family):
    """A packet that must wait, given at two paths in one import (a copy on the stick and
    the original): it was reported parked twice ('2 parked'), while the site keeps one."""
    fam = three_sites(family)
    fam.put("A", "t", "first", 1)
    first, _ = cli_export(fam, "A", "B")
    fam.put("A", "t", "second", 2)
    second, _ = cli_export(fam, "A", "B")
    [pkt] = sorted(second.rglob("*.spk"))
    copy = fam.root / "copy.spk"
    shutil.copy(pkt, copy)
    r = run("import", pkt, copy, site=fam.path("B"), json_mode=True)
    assert r.code == 0, r
    assert len(r.json["parked"]) == 1, r.json
    assert len(status(fam, "B")["parked"]) == 1
    cli_import(fam, "B", first)
    with fam.open("B") as s:
        assert s.get("t", "second") == 2
