"""Sealed packets: only the recipient can read them; still signed by the sender."""

from __future__ import annotations

import os

import pytest

from conftest import run
from syncpack.format import blocks
from syncpack.exchange import sync
from syncpack.format import codec, keys
from syncpack.errors import PacketSealError
from syncpack.site import Site


@pytest.fixture
def trio(family):
    family.init("a")
    family.add("b", via="a")
    family.add("c", via="a")
    family.full_exchange(rounds=1)
    family.put("a", "col", "secret", {"pin": 1234})
    return family


def _export_sealed(fam, src, dst):
    d = fam.medium()
    r = run("export", "--to", dst, "--out", d, "--encrypt", site=fam.path(src), json_mode=True)
    assert r.code == 0, r
    return [p["path"] for p in r.json["packets"]]


def test_sealed_packet_imports_at_its_recipient(trio):
    (p,) = _export_sealed(trio, "a", "b")
    raw = open(p, "rb").read()
    assert b"1234" not in raw and b"secret" not in raw
    with open(p, "rb") as f:
        env = codec.read_envelope(f, len(raw))
    assert env.header.sealed and codec.FEATURE_SEAL in env.header.mandatory
    r = run("import", p, site=trio.path("b"), json_mode=True)
    assert r.code == 0 and r.json["ops_applied"] >= 1, r
    assert run("get", "col", "secret", site=trio.path("b")).out.strip() == '{"pin": 1234}'


def test_a_third_member_cannot_read_it(trio):
    (p,) = _export_sealed(trio, "a", "b")
    # Through the CLI the packet is simply not for c.
    r = run("import", p, site=trio.path("c"))
    assert r.code == 1 and "addressed to b" in r.err
    # Even with the packet's signature checked, c's key does not open the body.
    with Site.open(trio.path("c")) as c, open(p, "rb") as f:
        import os
        env = codec.read_envelope(f, os.fstat(f.fileno()).st_size)
        with pytest.raises(PacketSealError):
            list(blocks.packet_ops(f, env, keys.unsealer(c.path)))
        with pytest.raises(PacketSealError):
            list(blocks.packet_ops(f, env))     # no key at all
    # lspacket at c still checks who sent it.
    ls = run("lspacket", p, site=trio.path("c"), json_mode=True)
    assert ls.json["packets"][0]["signature"] == "valid"


def test_tampered_sealed_body_is_rejected_and_store_unchanged(trio):
    (p,) = _export_sealed(trio, "a", "b")
    before = trio.digest("b")
    data = bytearray(open(p, "rb").read())
    data[20] ^= 0x01          # inside the sealed body
    open(p, "wb").write(bytes(data))
    r = run("import", p, site=trio.path("b"))
    assert r.code == 1 and "hash" in r.err
    assert trio.digest("b") == before


def test_resigned_tampered_ciphertext_fails_authentication(trio, tmp_path):
    """A member re-signs a header over altered ciphertext: the hash and signature pass, the
    AEAD does not."""
    (p,) = _export_sealed(trio, "a", "b")
    import hashlib
    raw = bytearray(open(p, "rb").read())
    with open(p, "rb") as f:
        env = codec.read_envelope(f, len(raw))
    body_start = env.body_offset
    raw[body_start + 5] ^= 0x40
    body = bytes(raw[body_start:body_start + env.header.body_len])
    h = env.header
    h.body_hash = hashlib.blake2b(body, digest_size=32).digest()
    key = keys.load_signing_key(trio.path("a"))
    out = tmp_path / "forged.spk"
    with open(out, "wb") as f:
        codec.start_packet(f)
        f.write(body)
        codec.finish_packet(f, h, env.origins, key.sign)
    before = trio.digest("b")
    r = run("import", out, site=trio.path("b"))
    assert r.code == 1 and "authenticate" in r.err, r
    assert trio.digest("b") == before


def test_family_policy_requires_sealing(trio):
    assert run("require-sealing", "on", site=trio.path("a")).code == 0
    trio.full_exchange(rounds=1)
    # An unsealed packet made with the API is refused at b ...
    trio.put("c", "col", "k", 1)
    d = trio.medium()
    with trio.open("c") as c:
        # c knows the policy now, so even a plain export is sealed.
        pk = sync.export(c, d, to=["b"])
    with open(pk[0].path, "rb") as f:
        import os
        assert codec.read_envelope(f, os.fstat(f.fileno()).st_size).header.sealed
    assert trio.import_(["b"][0], [pk[0].path]).applied
    # ... and one forged unsealed (policy switched off locally at the sender only) is refused.
    assert_forged_unsealed_refused(trio)


def assert_forged_unsealed_refused(trio) -> None:
    """c, with the family's sealing policy deleted from its own store, exports an unsealed
    packet to b: b refuses it."""
    with trio.open("c") as c:
        c.conn.execute("BEGIN IMMEDIATE")
        c.conn.execute("DELETE FROM versions WHERE collection='$family'")
        c.conn.execute("COMMIT")
        c.invalidate()
        trio.put("c", "col", "k2", 2)
        pk = sync.export(c, trio.medium(), to=["b"])
    res = trio.import_("b", [pk[0].path])
    assert res.rejected and "requires sealed" in res.rejected[0]["error"]


def test_sealed_replica_creation(family, tmp_path):
    family.init("a")
    family.put("a", "col", "k", "v")
    pub = run("keygen", tmp_path / "n", "--site", "n", json_mode=True).json["public_key"]
    out = tmp_path / "usb"
    r = run("mkreplica", "export", "--site", "n", "--pubkey", pub, "--create-out", "--out", out,
            "--encrypt",
            site=family.path("a"), json_mode=True)
    assert r.code == 0, r
    assert b'"v"' not in open(r.json["packets"][0]["path"], "rb").read()
    assert run("mkreplica", "import", out, site=tmp_path / "n").code == 0
    assert run("get", "col", "k", site=tmp_path / "n").out.strip() == '"v"'


def test_a_packet_applied_before_sealing_was_required_stays_a_duplicate(trio, tmp_path):
    """A medium still holds an unsealed packet b applied before the family required sealing:
    importing it again is a duplicate (operations.md), not a refusal at every round."""
    trio.full_exchange(rounds=1)
    trio.put("c", "col", "k", 1)
    inbox = tmp_path / "inbox"
    assert run("export", "--to", "b", "--create-out", "--out", inbox,
               site=trio.path("c")).code == 0
    assert run("import", inbox, site=trio.path("b")).code == 0
    assert run("require-sealing", "on", site=trio.path("a")).code == 0
    trio.full_exchange(rounds=1)
    r = run("import", inbox, site=trio.path("b"), json_mode=True)
    assert r.code == 0 and r.json["rejected"] == [] and len(r.json["duplicates"]) == 1, r
    # a packet not applied before is still refused unsealed
    assert_forged_unsealed_refused(trio)


def test_a_lost_packet_before_sealing_was_required_is_sent_again_and_the_rule_arrives(family):
    """a exports to b (the stick is lost), then turns sealing on: the packet carrying the
    rule waits at b for the lost ops, b's unsealed packets were refused at a unheard, so a
    never learned what b lacks, and the two stalled for good (operations.md promises that
    a lost stick needs nothing special)."""
    family.init("a")
    family.add("b", via="a")
    family.full_exchange(rounds=1)
    family.put("a", "col", "k1", 1)
    lost = family.medium()
    assert run("export", "--to", "b", "--out", lost, site=family.path("a")).code == 0
    assert run("require-sealing", "on", site=family.path("a")).code == 0
    for _ in range(3):
        for src, dst in (("a", "b"), ("b", "a")):
            d = family.medium()
            assert run("export", "--to", dst, "--out", d, site=family.path(src)).code == 0
            run("import", d, site=family.path(dst))
    assert run("get", "col", "k1", site=family.path("b")).out.strip() == "1"
    # b learned the rule: what it sends now is sealed, and a takes it in
    family.put("b", "col", "k2", 2)
    d = family.medium()
    r = run("export", "--to", "a", "--out", d, site=family.path("b"), json_mode=True)
    assert r.code == 0, r
    r = run("import", d, site=family.path("a"), json_mode=True)
    assert r.code == 0 and r.json["rejected"] == [], r
    assert run("get", "col", "k2", site=family.path("a")).out.strip() == "2"


def test_a_site_that_lifts_the_rule_keeps_sealing_until_its_peers_hold_the_lifting(trio):
    """The rule is on everywhere; b turns it off and writes.  b went unsealed at once, and
    a and c, still under the rule, refused its packets, the one that lifts it among them:
    b's writes never left it, while its own status said nothing was owed.  b now seals to
    each peer until that peer holds the write that lifted the rule."""
    fam = trio
    assert run("require-sealing", "on", site=fam.path("a")).code == 0
    fam.full_exchange(rounds=2)
    assert run("require-sealing", "off", site=fam.path("b")).code == 0
    fam.put("b", "col", "from-b", 1)
    for _ in range(3):
        for src in ("a", "b", "c"):
            for dst in ("a", "b", "c"):
                if src != dst:
                    d = fam.medium()
                    assert run("export", "--to", dst, "--out", d,
                               site=fam.path(src)).code == 0
                    r = run("import", d, site=fam.path(dst), json_mode=True)
                    assert r.code == 0 and r.json["rejected"] == [], (src, dst, r)
    for n in ("a", "b", "c"):
        assert run("get", "col", "from-b", site=fam.path(n)).out.strip() == "1", n
        with Site.open(fam.path(n)) as s:
            assert not s.requires_sealing(), n
    assert fam.digest("a") == fam.digest("b") == fam.digest("c")
    # the rule lifted everywhere: what goes now is plain again
    fam.put("b", "col", "later", 2)
    d = fam.medium()
    r = run("export", "--to", "a", "--out", d, site=fam.path("b"), json_mode=True)
    assert r.code == 0, r
    path = r.json["packets"][0]["path"]
    with open(path, "rb") as f:
        assert not codec.read_envelope(f, os.path.getsize(path)).header.sealed


@pytest.mark.parametrize("damage", ["missing", "another site's"])
def test_an_import_with_a_sealing_key_it_cannot_use_changes_nothing_and_says_so(trio, tmp_path,
                                                                                damage):
    """b's sealing key is missing, or is another site's (keys made again by keygen): the
    import applied the unsealed packet, stopped at the first sealed one and told only the
    key's trouble, hiding what it had applied; with a foreign key each sealed packet was
    refused with the hint to import it at its recipient, which b is."""
    fam = trio
    fam.put("c", "col", "from-c", 1)
    d = fam.medium()
    assert run("export", "--to", "b", "--out", d, site=fam.path("a")).code == 0
    assert run("export", "--to", "b", "--out", d, "--encrypt", site=fam.path("c")).code == 0
    box = fam.path("b") / "keys" / "box.key"
    kept = box.read_bytes()
    if damage == "missing":
        box.unlink()
    else:
        assert run("keygen", tmp_path / "other", "--site", "other").code == 0
        box.write_bytes((tmp_path / "other" / "keys" / "box.key").read_bytes())
    before = fam.digest("b")
    r = run("import", d, site=fam.path("b"))
    assert r.code != 0 and "Traceback" not in r.err, r
    assert ("is missing" if damage == "missing" else "not the one the family knows") in r.err
    assert "restore" in r.err and "nothing was imported" in r.err or damage == "missing", r
    assert fam.digest("b") == before
    box.write_bytes(kept)
    r = run("import", d, site=fam.path("b"), json_mode=True)
    assert r.code == 0 and len(r.json["applied"]) == 2, r
    assert run("get", "col", "from-c", site=fam.path("b")).out.strip() == "1"


def test_one_member_without_a_sealing_key_does_not_stop_the_packets_for_the_others(trio):
    """The family requires sealing and one member's entry has no sealing key (an entry
    written without one: a member's lie, or one from before sealing): 'export --all' failed
    whole, at every site, so no packet went to anyone.  The others get theirs; that member's
    error is told, and the export exits 1."""
    from syncpack.site import ROSTER, Member
    assert run("require-sealing", "on", site=trio.path("a")).code == 0
    with trio.open("a") as s:
        e = Member("e", b"\x00\x11" * 4, os.urandom(32), b"", 0, {}, False)
        with s.transaction(_system=True) as tx:
            tx.write_raw(ROSTER, "e", codec.encode_value(e.to_value()))
    trio.put("a", "col", "after", 1)
    out = trio.medium()
    r = run("export", "--all", "--out", out, site=trio.path("a"), json_mode=True)
    assert r.code == 1 and "no X25519 key for e" in r.err, r
    assert sorted(p["to"] for p in r.json["packets"]) == ["b", "c"], r.json
    assert run("import", out / "b", site=trio.path("b")).code == 0
    with trio.open("b") as s:
        assert s.get("col", "after") == 1
