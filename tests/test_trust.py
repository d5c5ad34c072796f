"""Bounded trust (docs/design.md §3.9): a member can affect others only through what it can prove.

Each test plays a lying member (it holds its own signing key and re-signs what it likes) or a
careless operator, through the CLI or the packet codec, and checks that the claim is refused
or not believed: exit 1 with one error line, the store unchanged, honest packets still applied.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from conftest import run
from test_recovery import (assert_converged, assert_no_epoch_reuse, raw_vector, site_id, status,
                           three_sites as three)
from packetkit import (rebuild, sign_key, snapshot_body, snapshot_records, state,
                       write)
from syncpack.format import blocks, codec
from syncpack.format.csn import csn_origin
from syncpack.store import chain
from syncpack.site import ROSTER, Member, Site

YEAR_MS = 365 * 24 * 3600 * 1000


def fsck_ok(family, name) -> bool:
    return run("fsck", site=family.path(name)).code == 0


def one_error(r) -> str:
    assert r.code == 1, r
    errors = [ln for ln in r.err.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, r
    assert "Traceback" not in r.err and "internal error" not in r.err, r
    return errors[0]


def refused(family, name: str, bad, tmp_path, *, honest_from: str = "C") -> str:
    """Import ``bad`` beside an honest packet at site ``name``: the bad one is refused with one
    error line and exit 1, the honest one applies, and the site ends exactly as a copy that
    imported only the honest packet (digest, vector, changelog, matrix, clock), fsck clean."""
    family.put(honest_from, "t", f"honest-{time.monotonic_ns()}", 1)
    [honest] = family.export(honest_from, name)
    copy = tmp_path / f"copy-{name}-{time.monotonic_ns()}"
    shutil.copytree(family.path(name), copy)
    r = run("import", bad, honest, site=family.path(name))
    err = one_error(r)
    r = run("import", honest, site=copy, json_mode=True)
    assert r.code == 0 and r.json["applied"] == [str(honest)], r
    assert state(family.path(name)) == state(copy)
    with family.open(name) as s:
        assert s.conn.execute("SELECT count(*) FROM packets_in WHERE path=?",
                              (str(honest),)).fetchone()[0] == 1     # applied beside it
    assert fsck_ok(family, name)
    return err


def origin_index(h: dict, origin: bytes) -> int:
    if origin not in h["origins"]:
        h["origins"].append(origin)
    return h["origins"].index(origin)


def set_vector(h: dict, origin: bytes, epoch: int) -> None:
    i = origin_index(h, origin)
    h["vector"] = [[j, e] for j, e in h["vector"] if j != i] + [[i, epoch]]
    h["vector"].sort()
    # the sender's own acknowledgement covers the header vector; a liar re-signs it too
    h.pop("acks", None)


# --- 5. gossip is believed only in its own member's signed word --------------------------------

def test_a_relayed_acknowledgement_must_be_signed_by_its_member(family, tmp_path):
    """B claims, in its own signed packet, that C acknowledged everything: A refuses it."""
    three(family)
    family.put("A", "t", "k", 1)
    [pa] = family.export("A", "B")
    family.import_("B", [pa])
    [pb] = family.export("B", "A")
    b_key = sign_key(family.path("B"))
    with family.open("B") as s:
        fam_id, c_id, vec = s.family_id, site_id(family, "C"), s.vector()

    def forge(h):
        created = h["created"]
        fake = {o: e for o, e in vec.items() if e}
        sig = b_key.sign(codec.ack_signed_bytes(fam_id, c_id, created, fake))   # B's key, not C's
        ci = origin_index(h, c_id)
        h["acks"] = [a for a in h.get("acks", []) if a[0] != ci]    # drop C's genuine one
        h["acks"].append([ci, created, [[origin_index(h, o), e]
                                                       for o, e in sorted(fake.items())], sig])
    bad = write(tmp_path, "forged.spk", rebuild(pb.read_bytes(), b_key, forge))
    err = refused(family, "A", bad, tmp_path)
    assert "acknowledgement of C" in err and "does not verify" in err, err


def test_a_neighbours_ack_floor_never_makes_a_site_trim(family, tmp_path):
    """B's header says (in the old gossip field) that everyone holds everything; A trims only
    on each member's own acknowledgement, so ops C never received stay in A's changelog."""
    three(family)
    for i in range(5):
        family.put("A", "t", f"k{i}", i)
    family.sync("A", "B")                       # C never gets these
    [pb] = family.export("B", "A")
    with family.open("A") as s:
        vec = s.vector()

    def gossip(h):
        h["ack_floor"] = [[origin_index(h, o), e] for o, e in sorted(vec.items()) if e]
        with family.open("A") as s:     # as format 1.0 writers hashed the member set
            h["ack_set"] = hashlib.blake2b(b"".join(sorted(s.members_by_id())),
                                           digest_size=8).digest()
    lie = write(tmp_path, "gossip.spk", rebuild(pb.read_bytes(), sign_key(family.path("B")),
                                                gossip))
    family.import_("A", [lie])
    with family.open("A") as s:
        before = chain.count(s.conn)
    r = run("scrub", site=family.path("A"), json_mode=True)
    assert r.code == 0, r
    with family.open("A") as s:
        a_id = s.site_id
        top = s.vector()[a_id]
        held = chain.count_range(s.conn, a_id, top - 5, top)
        assert s.floors().get(a_id, 0) <= raw_vector(family, "C").get(a_id, 0), r.json
    assert held == 5 and before >= 5
    # and C still gets everything through ordinary rounds
    family.full_exchange(2)
    assert_converged(family)


def test_acknowledgements_relay_so_a_spoke_can_trim(family):
    """The other side of the rule: each member's own signed word, relayed by the hub, lets a
    spoke that never hears from the other spokes trim what every member holds."""
    three(family)
    for i in range(4):
        family.put("B", "t", f"b{i}", i)
    for _ in range(3):
        for spoke in ("B", "C"):
            family.sync(spoke, "A")
            family.sync("A", spoke)
    r = run("scrub", site=family.path("C"), json_mode=True)
    assert r.code == 0 and r.json["ops_removed"] > 0, r
    with family.open("C") as s:
        acks = s.conn.execute("SELECT count(*) FROM acks").fetchone()[0]
    assert acks == 2                     # A's and B's own, B's relayed by A
    family.full_exchange(2)
    assert_converged(family)


def test_a_packet_dated_years_ahead_is_refused_and_freezes_nothing(family, tmp_path):
    three(family)
    family.put("B", "t", "k", 1)
    [pb] = family.export("B", "A")
    later = pb.read_bytes()

    def ahead(h):
        h["created"] = int(time.time() * 1000) + 5 * YEAR_MS
        h.pop("acks", None)
    lie = write(tmp_path, "ahead.spk", rebuild(later, sign_key(family.path("B")), ahead))
    err = refused(family, "A", lie, tmp_path)
    assert "in the future" in err, err
    # B's genuine reports still count
    family.import_("A", [pb])
    family.put("B", "t", "k2", 2)
    family.sync("B", "A")
    r = run("lsepoch", site=family.path("A"), json_mode=True)
    assert r.json["peers"]["B"]["acked"]["B"] == raw_vector(family, "B")[site_id(family, "B")]


def test_a_lying_claim_about_a_sites_own_history_delays_it_only_until_checked(family, tmp_path):
    """B keeps claiming it holds 1000 more of A's ops than A has.  A stops writing while the
    claim is unchecked, tells B it is behind, and when B's next packet still brings nothing,
    A dismisses the claim and writes again."""
    three(family)
    a_id = site_id(family, "A")
    held = raw_vector(family, "A")[a_id]
    b_key = sign_key(family.path("B"))

    def lie(p):
        return write(tmp_path, f"lie-{p.name}", rebuild(p.read_bytes(), b_key,
                                                         lambda h: set_vector(h, a_id, held + 1000)))
    family.put("B", "t", "k", 1)
    [pb] = family.export("B", "A")
    family.import_("A", [lie(pb)])
    assert status(family, "A")["state"] == "recovering"
    r = run("put", "t", "x", "1", site=family.path("A"))
    assert r.code == 1 and "recovering" in r.err, r
    for _ in range(3):
        family.sync("C", "A")
        family.sync("A", "C")
        paths = family.export("A", "B")
        family.import_("B", paths)
        family.put("B", "t", "k", 2)
        family.import_("A", [lie(p) for p in family.export("B", "A")])
    st = status(family, "A")
    assert st["state"] == "normal", st
    assert run("put", "t", "x", "1", site=family.path("A")).code == 0
    family.full_exchange(3)
    assert_converged(family)
    assert_no_epoch_reuse(family)


# --- 6. membership and identity ----------------------------------------------------------------

def test_ops_of_an_origin_that_never_was_a_member_are_refused(family, tmp_path):
    three(family)
    family.put("B", "t", "k", 1)
    [pb] = family.export("B", "A")
    ghost = b"\x99" * 8
    b_id = site_id(family, "B")

    def relabel(h):
        bi = h["origins"].index(b_id)
        gi = origin_index(h, ghost)
        h["ranges"] = [[gi if i == bi else i, 0, hi - lo] for i, lo, hi in h["ranges"]]
        h.pop("anchors", None)
        h.pop("acks", None)
    # B makes a block for the ghost origin (with its own key: no one holds a ghost's key) and
    # relays it as if the ghost were a member.
    from packetkit import ops_of
    ops = [op for op in ops_of(pb.read_bytes()) if op.origin == b_id]
    lo = ops[0].epoch - 1
    family_id = codec.read_envelope(open(pb, "rb"), pb.stat().st_size).header.family
    ghost_block = blocks.encode_block(family_id, ghost, blocks.ZERO_HASH,
                                      [op._replace(origin=ghost, epoch=op.epoch - lo)
                                       for op in ops], sign_key(family.path("B")).sign)
    bad = write(tmp_path, "ghost.spk", rebuild(pb.read_bytes(), sign_key(family.path("B")),
                                               relabel, body=ghost_block))
    err = refused(family, "A", bad, tmp_path)
    assert "never a member" in err, err


def test_a_member_cannot_shadow_anothers_packet_by_reusing_its_id(family, tmp_path):
    three(family)
    family.put("C", "t", "c", 1)
    [pc] = family.export("C", "A")
    c_id = codec.read_envelope(open(pc, "rb"), pc.stat().st_size).header.packet_id
    family.put("B", "t", "b", 1)
    [pb] = family.export("B", "A")
    stolen = write(tmp_path, "stolen.spk", rebuild(pb.read_bytes(), sign_key(family.path("B")),
                                                  lambda h: h.update(id=c_id)))
    family.import_("A", [stolen])
    r = run("import", pc, site=family.path("A"), json_mode=True)
    assert r.code == 0 and r.json["applied"] == [str(pc)], r
    with family.open("A") as s:
        assert s.get("t", "c") == 1


def _roster_lie_refused_at_a(family, tmp_path, make) -> tuple[dict, str]:
    """B writes the roster entry ``make(roster)`` returns; its packet is refused at A.
    Returns the roster as B held it before, and A's error."""
    three(family)
    with family.open("B") as s:
        roster = s.roster()
        evil = make(roster)
        with s.transaction(_system=True) as tx:
            tx.write_raw(ROSTER, evil.name, codec.encode_value(evil.to_value()))
    [pb] = family.export("B", "A")
    return roster, refused(family, "A", pb, tmp_path)


def test_a_roster_op_cannot_replace_another_members_key(family, tmp_path):
    roster, err = _roster_lie_refused_at_a(family, tmp_path, lambda r: Member(
        "C", r["C"].site_id, r["B"].ed25519, r["B"].x25519, r["C"].priority, r["C"].base,
        False))
    assert "roster entry of C" in err and "keys" in err, err
    with family.open("A") as s:
        assert s.roster()["C"].ed25519 == roster["C"].ed25519


@pytest.mark.parametrize("same_id", [True, False], ids=["its-id", "a-new-id"])
def test_a_roster_op_naming_nothing_replaced_cannot_give_a_member_other_keys(family, tmp_path,
                                                                            same_id):
    """Written as if its writer had not seen C's entry (the name added at two members at
    once), a second version with B's keys would let B sign as C, or shut C out for good."""
    def lie(r):
        return Member("C", r["C"].site_id if same_id else b"\x00" * 8, r["B"].ed25519,
                      r["B"].x25519, 0, {}, False)
    three(family)
    with family.open("B") as s:
        roster = s.roster()
        with s.transaction(_system=True) as tx:
            tx.write_many(ROSTER, [("C", codec.encode_value(lie(roster).to_value()), [])])
    [pb] = family.export("B", "A")
    err = refused(family, "A", pb, tmp_path)
    assert "roster entry of C" in err and "identity or keys" in err, err
    with family.open("A") as s:
        assert s.roster()["C"].ed25519 == roster["C"].ed25519
        assert not s.roster()["C"].retired


def test_a_roster_op_cannot_rewrite_the_state_another_member_was_created_from(family,
                                                                              tmp_path):
    """B rewrote C's entry, same id and keys, claiming C was created holding a million of A's
    ops: every site then believed C held them and never sent it A's later writes, with lag 0
    and fsck clean everywhere."""
    roster, err = _roster_lie_refused_at_a(family, tmp_path, lambda r: Member(
        "C", r["C"].site_id, r["C"].ed25519, r["C"].x25519, r["C"].priority,
        {**r["C"].base, r["A"].site_id: 10 ** 6}, False))
    assert "roster entry of C" in err and "created from" in err, err
    with family.open("A") as s:
        assert s.roster()["C"].base == roster["C"].base


def test_a_roster_op_naming_a_member_like_another_but_for_case_is_told_and_undone(family):
    """mkreplica refuses such a name (one packet directory for both on FAT32 and exFAT
    media), but two sites may each add one before they exchange, so an entry that does is
    taken, and every site keeps the name for the lower site id.  Written by a lie, it takes
    a member's name as a lying retirement would: 'status' names the writer, and retiring
    the keeper gives the name back."""
    three(family)
    with family.open("B") as s:
        evil = Member("c", b"\x00" * 8, b"\x02" * 32, b"", 0, {}, False)
        with s.transaction(_system=True) as tx:
            tx.write_raw(ROSTER, evil.name, codec.encode_value(evil.to_value()))
    family.sync("B", "A")
    doc = status(family, "A")
    assert {"site": "C", "by": [], "name_clash": "c", "name_clash_written_by": ["B"]} in \
        doc["retired"], doc["retired"]
    r = run("status", site=family.path("A"))
    assert "retired: C: c (its entry written by B) has its name but for case" in r.out, r
    r = run("export", "--to", "C", "--out", family.medium(), site=family.path("A"))
    assert r.code == 1 and "shares its name, but for case, with member c" in r.err, r
    assert run("rmreplica", "c", site=family.path("A")).code == 0
    with family.open("A") as s:
        assert not s.roster()["C"].retired and s.roster()["c"].retired
    family.sync("A", "C")
    family.put("C", "t", "back", 1)
    family.sync("C", "A")
    with family.open("A") as s:
        assert s.get("t", "back") == 1


# --- 4. snapshots go through the same checks ---------------------------------------------------

def test_a_resync_snapshot_stamped_years_ahead_is_refused(family, tmp_path):
    three(family)
    future = int(time.time() * 1000) + 3 * YEAR_MS
    with Site.open(family.path("A"), clock=lambda: future) as s, s.transaction() as tx:
        tx.put("t", "future", 1)
    out = family.medium()
    run("resync", "--to", "B", "--out", out, site=family.path("A"))
    err = refused(family, "B", out, tmp_path)
    assert "ahead of this site's clock" in err, err


def test_an_old_resync_snapshot_never_rolls_a_site_back(family, tmp_path):
    """A snapshot made before B moved on (and trimmed) would roll B back; it is refused, and
    B's next write reuses no epoch."""
    three(family)
    old = family.medium()
    assert run("resync", "--to", "B", "--out", old, site=family.path("A")).code == 0
    for i in range(4):
        family.put("A", "t", f"a{i}", i)
        family.put("B", "t", f"b{i}", i)
    for _ in range(3):
        family.full_exchange(1)
    for n in ("A", "B", "C"):
        assert run("scrub", site=family.path(n)).code == 0
    vec = raw_vector(family, "B")
    err = refused(family, "B", old, tmp_path)
    assert "roll" in err, err
    assert all(raw_vector(family, "B")[o] >= e for o, e in vec.items())
    family.put("B", "t", "after", 1)
    family.full_exchange(2)
    assert_converged(family)
    assert_no_epoch_reuse(family)


def test_an_old_snapshot_with_the_ops_still_held_keeps_them(family):
    three(family)
    old = family.medium()
    assert run("resync", "--to", "B", "--out", old, site=family.path("A")).code == 0
    family.put("B", "t", "mine", 1)
    family.put("A", "t", "theirs", 1)
    family.sync("A", "B")
    vec = raw_vector(family, "B")
    r = run("import", old, site=family.path("B"))
    assert r.code == 0, r
    after = raw_vector(family, "B")
    assert all(after.get(o, 0) >= e for o, e in vec.items()), (vec, after)
    with family.open("B") as s:
        assert s.get("t", "mine") == 1 and s.get("t", "theirs") == 1
    family.put("B", "t", "next", 1)
    family.full_exchange(2)
    assert_converged(family)
    assert_no_epoch_reuse(family)


# --- 8. a restored site always comes back --------------------------------------------------------

def restore_from(family, name, backup):
    p = family.path(name)
    shutil.rmtree(p)
    shutil.copytree(backup, p)
    r = run("restore", site=p)
    assert r.code == 0, r


def rounds(family, n=4):
    for _ in range(n):
        family.full_exchange(1)


@pytest.mark.parametrize("who", ["A", "B"])          # A is the founder
@pytest.mark.parametrize("peers_write", [False, True])
def test_a_restored_site_returns_to_normal_through_ordinary_rounds(family, tmp_path, who,
                                                                   peers_write):
    three(family)
    backup = tmp_path / "backup"
    shutil.copytree(family.path(who), backup)
    for i in range(3):
        family.put(who, "t", f"lost{i}", i)      # after the backup: peers hold them
    family.full_exchange(2)
    restore_from(family, who, backup)
    assert status(family, who)["state"] == "recovering"
    if peers_write:
        for n in family.sites:
            if n != who:
                family.put(n, "t", f"new-{n}", 1)
    rounds(family)
    st = status(family, who)
    assert st["state"] == "normal", st
    with family.open(who) as s:
        assert s.get("t", "lost2") == 2
    family.put(who, "t", "after", 1)
    rounds(family, 2)
    assert_converged(family)
    assert_no_epoch_reuse(family)


def test_a_restored_site_with_nothing_new_at_its_peers_still_finishes(family, tmp_path):
    three(family)
    backup = tmp_path / "backup"
    shutil.copytree(family.path("C"), backup)
    restore_from(family, "C", backup)
    assert status(family, "C")["state"] == "recovering"
    rounds(family, 2)
    assert status(family, "C")["state"] == "normal"
    assert_converged(family)


def test_a_restored_site_whose_lost_ops_every_peer_trimmed_is_told_what_to_run(family,
                                                                                tmp_path):
    """The one case ordinary rounds cannot mend: every peer trimmed the ops the backup lacks.
    Status names the exact command and the site to run it at; that command finishes it."""
    three(family)
    backup = tmp_path / "backup"
    shutil.copytree(family.path("A"), backup)
    family.put("A", "t", "lost", 1)
    rounds(family, 3)
    for n in ("A", "B", "C"):
        assert run("scrub", site=family.path(n)).code == 0
    restore_from(family, "A", backup)
    refused = set()
    for _ in range(3):
        media = {}
        for n in family.sites:
            media[n] = family.medium()
            r = run("export", "--all", "--out", media[n], site=family.path(n), json_mode=True)
            if r.code:         # once B and C know A is behind, they cannot send its lost op
                assert n != "A" and [f["to"] for f in r.json["failed"]] == ["A"], r
                refused.add(n)
        for n in family.sites:
            for m in family.sites:
                if m != n:
                    run("import", media[m] / n, site=family.path(n))
    assert refused == {"B", "C"}
    st = status(family, "A")
    assert st["state"] == "recovering", st
    step = st["recovery"]["next_step"]
    assert "resync --to A" in step, st
    human = run("status", site=family.path("A")).out
    assert "recovering (" in human and "next: " in human and "resync --to A" in human, human
    peer = "B" if step.startswith("B") else "C"
    out = family.medium()
    assert run("resync", "--to", "A", "--out", out, site=family.path(peer)).code == 0
    assert run("import", out, site=family.path("A")).code == 0
    rounds(family, 2)
    assert status(family, "A")["state"] == "normal"
    with family.open("A") as s:
        assert s.get("t", "lost") == 1
    family.put("A", "t", "after", 1)
    rounds(family, 2)
    assert_converged(family)
    assert_no_epoch_reuse(family)


def test_every_claim_of_the_trust_model_names_a_test_that_exists():
    """docs/trust.md backs each claim with a test: each one it names must exist."""
    import re
    from pathlib import Path
    tests = Path(__file__).parent
    doc = (tests.parent / "docs" / "trust.md").read_text()
    files = set(re.findall(r"`(test_\w+\.py)(?:::\w+)?`", doc))
    names = set(re.findall(r"`(?:test_\w+\.py::)?(test_\w+)`", doc)) - {f[:-3] for f in files}
    assert files and names
    sources = {f.name: f.read_text() for f in tests.glob("test_*.py")}
    for f in files:
        assert f in sources, f"docs/trust.md names {f}, which does not exist"
    for n in names:
        assert any(f"def {n}(" in src for src in sources.values()), \
            f"docs/trust.md names the test {n}, which does not exist"


def test_a_lying_tip_about_a_sites_own_history_costs_it_one_recovery_at_most(family, tmp_path):
    """B keeps saying it holds another op as one of A's epochs.  The first time, A sets its
    own ops aside and takes the family's back; the family's ops say B was wrong, and from then
    on B's tip is not believed: A stays normal and writes."""
    three(family)
    family.put("A", "t", "a1", 1)
    family.full_exchange(2)
    a_id = site_id(family, "A")
    held = raw_vector(family, "A")[a_id]
    b_key = sign_key(family.path("B"))
    fake = b"\x00" * 8 + a_id + b"\x00\x00\x00\x07"

    def lie(p):
        return write(tmp_path, f"tip-{time.monotonic_ns()}.spk",
                     rebuild(p.read_bytes(), b_key, lambda h: h.update(tip=[held, fake])))
    states = []
    for i in range(5):
        family.put("B", "t", f"b{i}", i)
        family.import_("A", [lie(p) for p in family.export("B", "A")])
        states.append(status(family, "A")["state"])
        for n in ("A", "C"):
            family.sync("A", n if n != "A" else "B")
        family.sync("C", "A")
        family.sync("A", "C")
    assert states[0] == "recovering" and states[-1] == "normal", states
    assert states.count("recovering") <= 2, states
    assert run("put", "t", "x", "1", site=family.path("A")).code == 0
    family.full_exchange(3)
    assert_converged(family)
    assert_no_epoch_reuse(family)


@pytest.mark.parametrize("field,bad", [("base", [[b"12345678", "lots"]]), ("base", [[1, 2]]),
                                       ("priority", "5"), ("retired", 1),
                                       ("x25519", b"short")])
def test_a_malformed_roster_entry_is_refused_before_it_can_break_other_sites(family, tmp_path,
                                                                           field, bad):
    """A member writes a new roster entry whose fields other sites would trip over later
    (planning reads 'base', conflict rules read 'priority'): refused at import."""
    three(family)
    with family.open("B") as s:
        v = Member("D", b"\x42" * 8, b"\x01" * 32, b"", 0, {}, False).to_value()
        v[field] = bad
        with s.transaction(_system=True) as tx:
            tx.write_raw(ROSTER, "D", codec.encode_value(v))
    [pb] = family.export("B", "A")
    err = refused(family, "A", pb, tmp_path)
    assert "roster entry of D is malformed" in err, err
    assert run("export", "--all", "--out", family.medium(), site=family.path("A")).code == 0


@pytest.mark.parametrize("collection,key,value", [
    ("$family", "settings", ["not", "a", "map"]), ("$family", "settings", {"name": "x"}),
    ("$family", "settings", {"name": "x", "policy": "lww", "require_sealed": "yes"}),
    ("$collections", "parts", {"policy": "coin-toss"}), ("$whatever", "k", 1)])
def test_a_malformed_system_entry_is_refused_before_it_can_stop_other_sites(
        family, tmp_path, collection, key, value):
    """Every import reads the family settings (sealing policy) and conflict policies: an entry
    no site can read would stop every site it reached.  Refused where it arrives."""
    three(family)
    with family.open("B") as s, s.transaction(_system=True) as tx:
        tx.write_raw(collection, key, codec.encode_value(value))
    [pb] = family.export("B", "A")
    err = refused(family, "A", pb, tmp_path)
    assert "malformed or unknown" in err, err
    assert run("status", site=family.path("A")).code == 0


@pytest.mark.parametrize("value", [{"policy": "priority"}, None])
def test_a_member_cannot_change_a_collections_conflict_policy(family, tmp_path, value):
    """A policy is set before a collection's first record and never changes (commands.md):
    'collection create' refuses an existing collection.  A member writing over the entry
    itself (another policy, or none, which is the family's default) changed how every site
    decided that collection's conflicts from then on."""
    fam = three(family)
    assert run("collection", "create", "parts", "--policy", "lww", site=fam.path("A")).code == 0
    fam.full_exchange()
    with fam.open("B") as s, s.transaction(_system=True) as tx:
        tx.write_raw("$collections", "parts",
                     None if value is None else codec.encode_value(value))
    [pb] = fam.export("B", "A")
    err = refused(fam, "A", pb, tmp_path)
    assert "conflict policy of collection parts" in err, err
    with fam.open("A") as s:
        assert s.policy_of("parts") == "lww"


def test_a_member_that_retires_an_honest_one_is_seen_and_undone(family):
    """C retires B and tells only A: A refuses B's packets and sends it nothing from then on,
    and nothing could undo a retirement.  Now every site that knows lists whom C retired,
    exporting to B says why not, and 'rmreplica B --undo' at A reinstates B everywhere."""
    fam = three(family)
    assert run("rmreplica", "B", site=fam.path("C")).code == 0      # the lie, signed by C
    fam.sync("C", "A")
    fam.put("B", "t", "k", "from B")
    r = run("import", *fam.export("B", "A"), site=fam.path("A"))
    assert r.code == 1 and "has been retired" in r.err, r
    assert status(fam, "A")["retired"] == [{"site": "B", "by": ["C"]}]
    r = run("status", site=fam.path("A"))
    assert "retired: B, by a write of C" in r.out and "rmreplica B --undo" in r.out, r.out
    r = run("status", "--format", "prometheus", site=fam.path("A"))
    assert 'syncpack_retired_members{site="A"} 1' in r.out, r.out
    r = run("export", "--to", "B", "--out", fam.medium(), site=fam.path("A"))
    assert r.code == 1 and "B was retired" in r.err and "rmreplica B --undo" in r.err, r
    assert status(fam, "B")["retired"] == []

    r = run("rmreplica", "B", "--undo", site=fam.path("A"), json_mode=True)
    assert r.code == 0 and r.json == {"site": "B", "retired": False}, r
    r = run("rmreplica", "B", "--undo", site=fam.path("A"))
    assert r.code == 1 and "is not retired" in r.err, r
    family.full_exchange(2)
    assert all(status(fam, n)["retired"] == [] for n in ("A", "B", "C"))
    assert_converged(fam)
    with fam.open("C") as s:
        assert s.get("t", "k") == "from B"


# --- snapshots: what the sender's word covers -----------------------------------------------

def _one_snapshot(out) -> Path:
    [p] = list(Path(out).rglob("*.spk"))
    return p


def test_a_seeding_snapshot_whose_header_and_records_name_other_keys_is_refused(family, tmp_path):
    """An outsider with no member key signs a new site's snapshot with its own key, which it
    names as the sender's in the header's roster, and leaves the records' roster (from which
    the new site shows the sender's fingerprint) as it was: the operator would be shown the
    real sender's fingerprint under a forged snapshot.  Refused, the new site not joined; the
    genuine snapshot still seeds it."""
    family.init("A")
    n = tmp_path / "N"
    assert run("keygen", n, "--site", "N").code == 0
    assert run("keygen", tmp_path / "X", "--site", "X").code == 0
    out = family.medium()
    assert run("mkreplica", "export", "--site", "N", "--pubkey", n / "keys" / "site.pub",
               "--out", out, site=family.path("A")).code == 0
    genuine = _one_snapshot(out)
    raw = genuine.read_bytes()
    outsider = sign_key(tmp_path / "X")
    from syncpack.format import keys
    forged_key = keys.read_own_public(tmp_path / "X").ed25519

    def as_outsider(h):
        for m in h["roster"]:
            if m[0] == "A":
                m[2] = forged_key
    recs = snapshot_records(raw)
    for r in recs:
        if r[0] == "t":
            r[3] = codec.encode_value("forged")
    bad = write(tmp_path, "forged.spk", rebuild(raw, outsider, as_outsider,
                                                body=snapshot_body(recs)))
    err = one_error(run("mkreplica", "import", bad, site=n))
    assert "another roster than its signed header" in err, err
    assert run("status", site=n).code != 0          # still not joined
    r = run("mkreplica", "import", genuine, site=n)
    assert r.code == 0, r
    a_key = run("keyinfo", site=family.path("A")).out
    fingerprint = next(w for w in a_key.split() if w.count(":") > 4)
    assert fingerprint in r.out + r.err, (r, a_key)


def test_a_snapshot_giving_one_site_id_to_two_members_is_refused(family, tmp_path):
    """A member that makes a new site's snapshot names, in both rosters, an extra member
    holding another member's site id with its own key: the new site would check that
    member's packets with the wrong key.  Refused, nothing joined."""
    three(family)
    n = tmp_path / "N"
    assert run("keygen", n, "--site", "N").code == 0
    out = family.medium()
    assert run("mkreplica", "export", "--site", "N", "--pubkey", n / "keys" / "site.pub",
               "--out", out, site=family.path("A")).code == 0
    raw = _one_snapshot(out).read_bytes()
    b = site_id(family, "B")
    recs = snapshot_records(raw)
    [mine] = [r for r in recs if r[0] == ROSTER and r[1] == "A"]
    mallory = Member.from_value("mallory", codec.decode_value(mine[3]))
    mallory = Member("mallory", b, mallory.ed25519, mallory.x25519, 0, {}, False)
    recs.append([ROSTER, "mallory", mine[2], codec.encode_value(mallory.to_value())])
    recs.sort(key=lambda r: (r[0].encode(), r[1].encode(), r[2]))

    def listed(h):
        a = next(m for m in h["roster"] if m[0] == "A")
        h["roster"].append(["mallory", b, a[2], a[3], 0])
        h["count"] = len(recs)
    bad = write(tmp_path, "mallory.spk", rebuild(raw, sign_key(family.path("A")), listed,
                                                 body=snapshot_body(recs)))
    err = one_error(run("mkreplica", "import", bad, site=n))
    assert "one site id to two members" in err, err
    assert run("status", site=n).code != 0


def test_a_resync_snapshot_claiming_more_of_another_origin_than_it_signed_is_refused(
        family, tmp_path):
    """A member's resync snapshot for B claims more of C than C holds (and leaves C's own
    acknowledgement out, which would contradict it): believed, B would never ask for C's
    ops up to there, and no later snapshot could lower it.  Refused, B unchanged; the
    genuine snapshot, which carries C's own signed word, applies."""
    three(family)
    family.put("C", "t", "c1", 1)
    family.full_exchange(2)
    out = family.medium()
    assert run("resync", "--to", "B", "--out", out, site=family.path("A")).code == 0
    genuine = _one_snapshot(out)
    raw = genuine.read_bytes()
    c = site_id(family, "C")

    key = sign_key(family.path("A"))

    def claims_more(h):
        ci = h["origins"].index(c)
        h["vector"] = [[i, e + 5 if i == ci else e] for i, e in h["vector"]]
        h["acks"] = [a for a in h.get("acks", []) if a[0] != ci]
        for a in h["acks"]:             # A's own word on its new vector, signed again
            if a[2] is None:
                vec = {h["origins"][i]: e for i, e in h["vector"] if e}
                a[3] = key.sign(codec.ack_signed_bytes(h["family"], h["from"], a[1], vec))
    bad = write(tmp_path, "claims.spk", rebuild(raw, key, claims_more))
    err = refused(family, "B", bad, tmp_path)
    assert "more than C ever signed it holds" in err, err
    r = run("import", genuine, site=family.path("B"))
    assert r.code == 0, r
    family.put("C", "t", "c2", 2)
    family.full_exchange(3)
    assert_converged(family)


def test_a_resync_snapshot_holding_a_version_dated_after_its_clock_is_refused(family, tmp_path):
    """One record stamped ten years ahead under an honest header clock: taken, it would be
    named as replaced by B's next write of that key, and every peer would refuse that write
    for good.  Refused, B unchanged."""
    three(family)
    family.put("A", "t", "k", 1)
    family.full_exchange(2)
    out = family.medium()
    assert run("resync", "--to", "B", "--out", out, site=family.path("A")).code == 0
    raw = _one_snapshot(out).read_bytes()
    recs = snapshot_records(raw)
    for r in recs:
        if (r[0], r[1]) == ("t", "k"):
            hlc = int.from_bytes(r[2][:8], "big") + ((10 * YEAR_MS) << 16)
            r[2] = hlc.to_bytes(8, "big") + r[2][8:]
    bad = write(tmp_path, "ahead.spk", rebuild(raw, sign_key(family.path("A")),
                                               body=snapshot_body(recs)))
    err = refused(family, "B", bad, tmp_path)
    assert "dated after the snapshot's own clock" in err, err


def test_a_seeding_snapshot_with_a_middle_part_marked_last_is_refused(family, tmp_path):
    """Only the last part of a snapshot says it is the last: a part before it re-signed as
    final (what a member could make) is refused with the rest, and a named damaged file gets
    a hint that asks for a new snapshot, not for the directory."""
    family.init("A")
    with family.open("A") as s, s.transaction() as tx:
        for i in range(400):
            tx.put("t", f"k{i:04d}", os.urandom(300).hex())
    n = tmp_path / "N"
    assert run("keygen", n, "--site", "N").code == 0
    out = family.medium()
    assert run("mkreplica", "export", "--site", "N", "--pubkey", n / "keys" / "site.pub",
               "--out", out, "--max-size", "64K", site=family.path("A")).code == 0
    parts = sorted(Path(out).rglob("*.spk"))
    assert len(parts) >= 3, parts
    staged = tmp_path / "staged"
    staged.mkdir()
    for p in parts:
        shutil.copy(p, staged / p.name)
    first = staged / parts[0].name

    def final(h):
        h["final"] = True
    first.write_bytes(rebuild(first.read_bytes(), sign_key(family.path("A")), final))
    err = one_error(run("mkreplica", "import", staged, site=n))
    assert "incomplete" in err, err
    assert run("status", site=n).code != 0
    damaged = write(tmp_path, "damaged.spk", parts[0].read_bytes()[:-9])
    r = run("mkreplica", "import", damaged, site=n)
    one_error(r)
    assert "hint: ask the sender for a new snapshot" in r.err, r
    assert run("mkreplica", "import", out, site=n).code == 0


def _resigned_claim(h, key, origin: bytes, more: int, drop_acks_of: set[bytes]) -> None:
    """A lying sender's edit: claim ``more`` epochs of ``origin``, leave out the listed
    members' acknowledgements, and sign its own acknowledgement again over the new vector."""
    if origin not in h["origins"]:
        h["origins"].append(origin)
        h["vector"].append([len(h["origins"]) - 1, 0])
    oi = h["origins"].index(origin)
    h["vector"] = [[i, e + more if i == oi else e] for i, e in h["vector"]]
    h.pop("tip", None)
    h["acks"] = [a for a in h.get("acks", []) if h["origins"][a[0]] not in drop_acks_of]
    for a in h["acks"]:
        if a[2] is None:
            vec = {h["origins"][i]: e for i, e in h["vector"] if e}
            a[3] = key.sign(codec.ack_signed_bytes(h["family"], h["from"], a[1], vec))


def test_a_resync_snapshot_claiming_more_of_the_receivers_own_history_is_refused(family,
                                                                                 tmp_path):
    """The receiver's own origin was exempt: B believed it held 50 more of its own epochs,
    its next write took an epoch nobody would ever ask for, and the family split silently."""
    three(family)
    out = family.medium()
    assert run("resync", "--to", "B", "--out", out, site=family.path("A")).code == 0
    raw = _one_snapshot(out).read_bytes()
    b, key = site_id(family, "B"), sign_key(family.path("A"))
    bad = write(tmp_path, "own.spk", rebuild(
        raw, key, lambda h: _resigned_claim(h, key, b, 50, {b})))
    err = refused(family, "B", bad, tmp_path)
    assert "more than B ever signed it holds" in err, err


def test_a_forged_acknowledgement_of_a_member_the_receiver_does_not_know_proves_nothing(
        family, tmp_path):
    """An acknowledgement of a member B had not heard of was passed over by the verifier but
    counted as proof, and stored: B then believed any claim about that member."""
    three(family)
    x = tmp_path / "X"
    assert run("keygen", x, "--site", "X").code == 0
    assert run("mkreplica", "export", "--site", "X", "--pubkey", x / "keys" / "site.pub",
               "--out", family.medium(), site=family.path("A")).code == 0
    out = family.medium()
    assert run("resync", "--to", "B", "--out", out, site=family.path("A")).code == 0
    raw = _one_snapshot(out).read_bytes()
    key = sign_key(family.path("A"))
    with Site.open(x, require_joined=False) as sx:
        xid = sx.site_id

    def forged(h):
        _resigned_claim(h, key, xid, 1000, set())
        xi = h["origins"].index(xid)
        h["acks"].append([xi, h["created"], [[xi, 1000]], bytes(64)])
    bad = write(tmp_path, "forged-ack.spk", rebuild(raw, key, forged))
    err = refused(family, "B", bad, tmp_path)
    assert "acknowledgement of X" in err and "does not verify" in err, err


def test_a_site_whose_keys_are_anothers_signs_nothing(family, tmp_path):
    """A site's keys directory put back from another site's keygen: every block it sealed
    would be refused by every peer, for good (the peers blamed the carrier), even after the
    right keys came back.  It now refuses to sign, names the cause, and signs once its own
    keys are back."""
    fam = three(family)
    good = tmp_path / "good-keys"
    shutil.copytree(fam.path("A") / "keys", good)
    assert run("keygen", tmp_path / "Z", "--site", "Z").code == 0
    shutil.rmtree(fam.path("A") / "keys")
    shutil.copytree(tmp_path / "Z" / "keys", fam.path("A") / "keys")
    assert run("put", "t", "k", '"written meanwhile"', site=fam.path("A")).code == 0
    r = run("export", "--all", "--out", fam.medium(), site=fam.path("A"))
    assert r.code == 1 and "not the one the family knows" in r.err and "hint:" in r.err, r
    shutil.rmtree(fam.path("A") / "keys")
    shutil.copytree(good, fam.path("A") / "keys")
    fam.full_exchange(2)
    assert_converged(fam)
    with fam.open("B") as s:
        assert s.get("t", "k") == "written meanwhile"


# --- a retirement against concurrent writes of the same roster entry ---------------------------

def _retire_and_set_priority_concurrently(fam, first: str) -> None:
    """A retires C and B sets C's priority, neither having heard of the other's write; the
    one named ``first`` is written first (an older clock), so the other is the newest."""
    writes = {"retire": ("rmreplica", "C", "A"), "priority": ("priority", "C", "5", "B")}
    for what in (first, *(w for w in writes if w != first)):
        *args, at = writes[what]
        assert run(*args, site=fam.path(at)).code == 0
        time.sleep(0.01)        # a later wall clock: the second write is the newest version
    fam.sync("A", "B")
    fam.sync("B", "A")
    with fam.open("A") as s:
        assert len(s.versions(ROSTER, "C")) == 2            # concurrent: both survive
        newest = max(s.versions(ROSTER, "C"), key=lambda v: v.csn)
        assert csn_origin(newest.csn) == site_id(fam, "A" if first == "priority" else "B")


@pytest.mark.parametrize("first", ["retire", "priority"])
def test_a_retirement_stands_against_a_concurrent_write_of_the_members_entry(family, first):
    """Every roster write rewrites the whole entry: a priority set by a member that had not
    heard of a retirement, and written later, undid it silently everywhere (status showed no
    one retired, the member's packets were taken again).  And with the retirement the newest,
    status said both writers retired the member.  Now the member stays retired at every site,
    retired by A alone, the priority write still applies, and only a write made after the
    retirement ('--undo') reinstates it."""
    fam = three(family)
    _retire_and_set_priority_concurrently(fam, first)
    for n in ("A", "B"):
        assert status(fam, n)["retired"] == [{"site": "C", "by": ["A"]}], n
        with fam.open(n) as s:
            assert s.roster()["C"].retired and s.get(ROSTER, "C")["retired"] is True
            if first == "retire":
                assert s.roster()["C"].priority == 5
    fam.put("C", "t", "c", "from retired C")
    for n in ("A", "B"):
        r = run("import", *fam.export("C", n), site=fam.path(n))
        assert r.code == 1 and "has been retired" in r.err, r
    assert_converged(fam, ["A", "B"])

    r = run("rmreplica", "C", "--undo", site=fam.path("B"), json_mode=True)
    assert r.code == 0 and r.json == {"site": "C", "retired": False}, r
    fam.sync("B", "A")
    for n in ("A", "B"):
        assert status(fam, n)["retired"] == [], n
        with fam.open(n) as s:
            assert len(s.versions(ROSTER, "C")) == 1
    family.full_exchange(2)
    assert_converged(fam)
    with fam.open("A") as s:
        assert s.get("t", "c") == "from retired C"


def test_a_retired_member_unaware_of_it_cannot_reinstate_itself_by_its_own_write(family):
    """A retires C.  C, not having heard, sets its own priority; B relays that write to A,
    which took C back: status listed no one retired and A accepted C's packets again.  Now
    C stays retired at A, and at B once B hears of it, and its packets are refused."""
    fam = three(family)
    assert run("rmreplica", "C", site=fam.path("A")).code == 0
    time.sleep(0.01)
    assert run("priority", "C", "7", site=fam.path("C")).code == 0    # newer than the retirement
    fam.sync("C", "B")
    r = run("import", *fam.export("B", "A"), site=fam.path("A"))
    assert r.code == 0, r
    assert status(fam, "A")["retired"] == [{"site": "C", "by": ["A"]}]
    fam.put("C", "t", "c", "after its retirement")
    r = run("import", *fam.export("C", "A"), site=fam.path("A"))
    assert r.code == 1 and "has been retired" in r.err, r
    fam.sync("A", "B")
    assert status(fam, "B")["retired"] == [{"site": "C", "by": ["A"]}]
    r = run("import", *fam.export("C", "B"), site=fam.path("B"))
    assert r.code == 1 and "has been retired" in r.err, r
    assert_converged(fam, ["A", "B"])


# The rule itself (syncpack/rules/roster.py), on any set of surviving versions.

_csns = st.binary(min_size=16, max_size=16)
_origins = st.sampled_from([b"A" * 8, b"B" * 8, b"D" * 8])
_bases = st.dictionaries(_origins, st.integers(0, 9)).map(
    lambda d: sorted([o, e] for o, e in d.items() if e))
_entries = st.one_of(st.none(), st.fixed_dictionaries(
    {"id": st.just(b"C" * 8), "priority": st.integers(-5, 5), "retired": st.booleans(),
     "base": _bases}))
_roster_versions = st.lists(st.tuples(_csns, _entries), min_size=1, max_size=6,
                            unique_by=lambda v: v[0])


@given(_roster_versions, st.randoms())
@settings(max_examples=300, deadline=None)
def test_the_roster_entry_read_is_the_newest_retired_if_any_version_is(vs, rnd):
    from syncpack.rules import roster
    got = roster.entry(vs)
    shuffled = list(vs)
    rnd.shuffle(shuffled)
    assert roster.entry(shuffled) == got                # whatever order they arrived in
    assert roster.retiring(shuffled) == roster.retiring(vs)
    _csn, newest = max(vs)
    if newest is None:
        assert got is None
        return
    assert {k: v for k, v in got.items() if k not in ("retired", "base")} == \
        {k: v for k, v in newest.items() if k not in ("retired", "base")}
    assert got["retired"] == any(v is not None and v["retired"] for _c, v in vs)
    # the base: origin by origin the lowest any surviving version claims (a member added at
    # two sites at once has two; no site is led to believe it holds what it lacks)
    held = [dict((bytes(o), e) for o, e in v["base"]) for _c, v in vs if v is not None]
    for o in (b"A" * 8, b"B" * 8, b"D" * 8):
        assert dict((bytes(x), e) for x, e in got["base"]).get(o, 0) == \
            min(h.get(o, 0) for h in held)
    assert roster.retiring(vs) == sorted(c for c, v in vs if v is not None and v["retired"])
    if len(vs) == 1:
        assert got == newest


@given(_roster_versions)
@settings(max_examples=200, deadline=None)
def test_every_reader_of_the_roster_reads_the_rule(vs):
    """The visible value (what get, digest and the roster read) is the rule's entry, and the
    newest version's own bytes whenever the rule changes nothing."""
    from syncpack.replicated import roster_value
    from syncpack.rules import roster
    from syncpack.rules.conflict import Version
    stored = [Version(c, v is None, None if v is None else codec.encode_value(v)) for c, v in vs]
    raw = roster_value(stored)
    want = roster.entry(vs)
    newest = max(stored, key=lambda v: v.csn)
    if want is None:
        assert raw == newest.value
    else:
        assert codec.decode_value(raw) == want
        if want == codec.decode_value(newest.value):
            assert raw == newest.value


_names = st.sampled_from(["boston", "Boston", "BOSTON", "bosTon", "Lima", "lima", "oslo"])
_ids = st.binary(min_size=8, max_size=8)


@given(st.lists(st.tuples(_names, _ids, st.booleans()), max_size=8,
                unique_by=(lambda m: m[0], lambda m: m[1])), st.randoms())
@settings(max_examples=300, deadline=None)
def test_of_names_alike_but_for_case_every_site_keeps_the_same_one(members, rnd):
    """Two sites may each add a name another holds but for case before they exchange: each
    group of such names not retired keeps exactly one, the lowest site id, the same whatever
    order the entries came in; a retired member is never the keeper and never shadowed."""
    from syncpack.rules import roster
    got = roster.name_clashes(members)
    shuffled = list(members)
    rnd.shuffle(shuffled)
    assert roster.name_clashes(shuffled) == got
    ids = {n: i for n, i, _r in members}
    live = [n for n, _i, r in members if not r]
    assert not set(got) - set(live) and not set(got.values()) - set(live)
    kept = [n for n in live if n not in got]
    assert len({n.casefold() for n in kept}) == len(kept)       # one per group
    assert {n.casefold() for n in kept} == {n.casefold() for n in live}
    for loser, keeper in got.items():
        assert keeper in kept and keeper.casefold() == loser.casefold()
        assert ids[keeper] < ids[loser]
