"""Packets that must be refused, and what a refusal leaves: nothing (docs/design.md §3.4
idempotence, §3.6 authenticity, §5 import; docs/commands.md exit codes).

Three groups, each asserting the error class of the check that failed (through the library) and
its one-line message (through ``syncpack import``: exit 1, ``error: PATH: ...``, no traceback),
and that the receiving store did not change:

* forged, replayed and misdirected packets, rebuilt and re-signed with a member's Ed25519 key
  (``SITE/keys/sign.key``) where they must get past the signature;
* malformed packets (framing, versions, features, signatures), after which the genuine packet
  still applies, so a bad copy was not recorded as seen either;
* relayed blocks: a relaying member cannot alter, splice, reorder or drop from the middle
  another origin's ops (format 2, formats/BLOCKS.md); every block is checked against its
  origin's key, whoever relays it, and each refusal names the origin.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
from pathlib import Path

import msgpack
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from conftest import Family, run
from packetkit import (apply_raises, blocks_of, ops_of, parts_of, rebuild, reblock,
                       rejected_by_cli, sign_key, state, verify_raises, write)
from syncpack.format.csn import pack_csn

from syncpack.exchange import verify
from syncpack.format import blocks, codec, keys, values
from syncpack.store import versions
from syncpack.errors import (EpochCollisionError, PacketBodyError, PacketFamilyError,
                             PacketFormatError, PacketSenderError, PacketSignatureError)


# === forged, replayed and misdirected packets ===================================================

@pytest.fixture
def ab(family):
    """a and b, a with three transactions; returns (family, packet a->b not yet imported)."""
    family.init("a")
    family.add("b", via="a")
    for i in range(3):
        with family.open("a") as s, s.transaction() as tx:
            for j in range(4):
                tx.put("parts", f"p{i}{j}", {"qty": i * 10 + j})
    [p] = family.export("a", "b")
    return family, p


# --- forged signature -------------------------------------------------------------------------

def test_forged_signature_bit_flip(ab, tmp_path):
    fam, p = ab
    raw = bytearray(p.read_bytes())
    raw[-(4 + 64) + 10] ^= 0x01          # inside the signature
    bad = write(tmp_path, "forged.spk", bytes(raw))
    before = state(fam.path("b"))
    e = verify_raises(fam.path("b"), bad, PacketSignatureError)
    assert "signature does not verify with a's key" in str(e)
    assert "signature does not verify with a's key" in rejected_by_cli(fam.path("b"), bad)
    assert state(fam.path("b")) == before


def test_forged_signature_by_an_outsider_key(ab, tmp_path):
    """Header edited (more ops claimed) and signed by a key that belongs to no member."""
    fam, p = ab
    bad = write(tmp_path, "outsider.spk",
                rebuild(p.read_bytes(), Ed25519PrivateKey.generate(),
                        edit=lambda h: h.update(created=h["created"] + 1)))
    before = state(fam.path("b"))
    e = verify_raises(fam.path("b"), bad, PacketSignatureError)
    assert "signature does not verify with a's key" in str(e)
    assert "signature" in rejected_by_cli(fam.path("b"), bad)
    assert state(fam.path("b")) == before


# --- retired member ---------------------------------------------------------------------------

def test_packet_from_a_retired_member(family, tmp_path):
    family.init("a")
    family.add("b", via="a")
    family.add("c", via="a")
    family.sync("a", "b")                 # b learns c is a member
    family.put("c", "parts", "from-c", {"x": 1})
    [pc] = family.export("c", "b")
    r = run("rmreplica", "c", site=family.path("b"))
    assert r.code == 0, r
    before = state(family.path("b"))
    e = verify_raises(family.path("b"), pc, PacketSenderError)
    assert "sender c has been retired from the family" in str(e)
    msg = rejected_by_cli(family.path("b"), pc)
    assert msg == "sender c has been retired from the family"
    assert state(family.path("b")) == before
    with family.open("b") as s:
        assert s.get("parts", "from-c", None) is None


# --- re-signed by a member, claiming another sender -------------------------------------------

def test_resigned_by_a_member_claiming_another_sender(family, tmp_path):
    """b rewrites a packet a sent to c (more qty!) and signs it with its own, valid, member key,
    leaving 'from' = a: c checks a's key and refuses."""
    family.init("a")
    family.add("b", via="a")
    family.add("c", via="a")
    family.put("a", "parts", "p1", {"qty": 1})
    [p] = family.export("a", "c")
    ops = ops_of(p.read_bytes())
    ops[-1] = ops[-1]._replace(value=codec.packb({"qty": 1_000_000}))
    forged = write(tmp_path, "b-as-a.spk", rebuild(
        p.read_bytes(), sign_key(family.path("b")),
        body=reblock(p.read_bytes(), ops, sign_key(family.path("b")))))
    before = state(family.path("c"))
    e = verify_raises(family.path("c"), forged, PacketSignatureError)
    assert "signature does not verify with a's key" in str(e)
    assert "signature does not verify with a's key" in rejected_by_cli(family.path("c"), forged)
    assert state(family.path("c")) == before
    # ... and claiming to be from b instead (b's own key) would be b's own op under a's origin
    # table entry: authentic as a relay, so the test stops at the forgery of the sender.


# --- replay -----------------------------------------------------------------------------------

def test_replay_of_an_applied_packet_is_a_duplicate(ab):
    fam, p = ab
    r = run("import", p, site=fam.path("b"), json_mode=True)
    assert r.code == 0 and r.json["applied"] == [str(p)], r
    before = state(fam.path("b"))
    r = run("import", p, site=fam.path("b"), json_mode=True)
    assert r.code == 0, r
    assert r.json["duplicates"] == [str(p)] and r.json["applied"] == [], r
    assert r.json["ops_applied"] == 0
    assert state(fam.path("b")) == before
    r = run("import", p, site=fam.path("b"))
    assert "1 duplicate(s) (applied before)" in r.out, r


def test_old_packet_whose_ops_are_all_held_changes_nothing(ab):
    """A second packet carrying the same ops (a resend after 'chepoch'), imported after the
    first: accepted, nothing applied, the replicated state unchanged."""
    fam, p1 = ab
    r = run("chepoch", "b", "a=0", site=fam.path("a"))
    assert r.code == 0, r
    [p2] = fam.export("a", "b")           # the same range again, a new packet id
    assert p2 != p1
    fam.import_(["b"][0], [p1])
    before = state(fam.path("b"))
    r = run("import", p2, site=fam.path("b"), json_mode=True)
    assert r.code == 0 and r.json["ops_applied"] == 0 and not r.json["rejected"], r
    after = state(fam.path("b"))
    for k in ("digest", "vector", "changelog"):
        assert after[k] == before[k], k
    # and the older one, now a replay, is a duplicate
    r = run("import", p1, site=fam.path("b"), json_mode=True)
    assert r.json["duplicates"] == [str(p1)], r


# --- another family ---------------------------------------------------------------------------

def test_packet_for_another_family(family, tmp_path):
    family.init("a")
    family.add("b", via="a")
    other = type(family)(tmp_path / "other")
    (tmp_path / "other").mkdir()
    other.init("a")                       # same site names, different family
    other.add("b", via="a")
    other.put("a", "parts", "alien", {"x": 1})
    [p] = other.export("a", "b")
    before = state(family.path("b"))
    e = verify_raises(family.path("b"), p, PacketFamilyError)
    assert "packet belongs to family" in str(e)
    msg = rejected_by_cli(family.path("b"), p)
    assert msg.startswith("packet belongs to family ")
    # in a directory it is left alone, not an error
    r = run("import", p.parent, site=family.path("b"), json_mode=True)
    assert r.code == 0 and not r.json["applied"] and not r.json["rejected"], r
    assert state(family.path("b")) == before


# --- ranges that lie about the body (re-signed by the sender) ----------------------------------

def _lie(p: Path, fam, edit) -> bytes:
    return rebuild(p.read_bytes(), sign_key(fam.path("a")), edit=edit)


def _range(h) -> list:
    assert len(h["ranges"]) == 1
    return h["ranges"][0]


def test_ranges_claim_fewer_ops_than_the_body_holds(ab, tmp_path):
    fam, p = ab

    def edit(h):
        _range(h)[2] -= 1
        h["count"] -= 1
    bad = write(tmp_path, "fewer.spk", _lie(p, fam, edit))
    before = state(fam.path("b"))
    e = apply_raises(fam.path("b"), bad, PacketBodyError)
    assert "does not continue the packet's declared range" in str(e)
    assert rejected_by_cli(fam.path("b"), bad) == str(e)
    assert state(fam.path("b")) == before


def test_ranges_claim_more_ops_than_the_body_holds(ab, tmp_path):
    fam, p = ab

    def edit(h):
        _range(h)[2] += 1
        h["count"] += 1
    bad = write(tmp_path, "more.spk", _lie(p, fam, edit))
    before = state(fam.path("b"))
    e = apply_raises(fam.path("b"), bad, PacketBodyError)
    assert "ops in its ranges but its blocks of a end at epoch" in str(e)
    assert rejected_by_cli(fam.path("b"), bad) == str(e)
    assert state(fam.path("b")) == before


def test_ranges_name_other_epochs_already_held(ab, tmp_path):
    """The next packet's ops relabelled one epoch down: the first now claims an epoch b holds
    (in its changelog) with a different op, an epoch collision."""
    fam, p1 = ab
    fam.import_("b", [p1])
    fam.put("a", "parts", "later", {"qty": 7})
    fam.put("a", "parts", "later2", {"qty": 8})
    [p2] = fam.export("a", "b")

    def edit(h):
        r = _range(h)
        r[1] -= 1
        r[2] -= 1
    bad = write(tmp_path, "shifted.spk", _lie(p2, fam, edit))
    before = state(fam.path("b"))
    e = apply_raises(fam.path("b"), bad, EpochCollisionError)
    assert "epoch collision" in str(e)
    assert "epoch collision" in rejected_by_cli(fam.path("b"), bad)
    assert state(fam.path("b")) == before


def test_ranges_name_another_origin(ab, tmp_path):
    """The range is declared for b's origin while the ops carry a's."""
    fam, p = ab
    with fam.open("b") as s:
        b_id = s.site_id

    def edit(h):
        h.pop("anchors", None)            # a liar drops what would give the range away
        h["origins"].append(b_id)
        _range(h)[0] = len(h["origins"]) - 1
        _range(h)[1] = 0
        _range(h)[2] = h["count"]
    bad = write(tmp_path, "other-origin.spk", _lie(p, fam, edit))
    before = state(fam.path("b"))
    e = apply_raises(fam.path("b"), bad, PacketBodyError)
    assert "does not continue the packet's declared range" in str(e)
    assert rejected_by_cli(fam.path("b"), bad) == str(e)
    assert state(fam.path("b")) == before


def test_ranges_relabel_an_op_already_held_as_a_new_epoch(ab, tmp_path):
    """After b holds a's epochs up to N, a packet claims epoch N+1 but carries the op b already
    holds as epoch N (same CSN): refused, not applied twice under two epochs."""
    fam, p = ab
    fam.import_("b", [p])
    txn = ops_of(p.read_bytes())[-4:]     # a's last transaction, epochs N-3..N
    # a itself signs it (the liar is the origin): the transaction it already sent, as N+1..
    again = blocks.encode_block(codec.read_envelope(io.BytesIO(p.read_bytes()),
                                                    p.stat().st_size).header.family,
                                txn[0].origin, blocks.ZERO_HASH,
                                [op._replace(epoch=op.epoch + 4) for op in txn],
                                sign_key(fam.path("a")).sign)

    def edit(h):
        h.pop("anchors", None)            # else the anchor (CSN of epoch N) gives it away first
        r = _range(h)
        r[1], r[2] = r[2], r[2] + 4
        h["count"] = 4
        h["seq"] += 1
        h["id"] = hashlib.blake2b(h["id"], digest_size=16).digest()
    bad = write(tmp_path, "relabel.spk",
                rebuild(p.read_bytes(), sign_key(fam.path("a")), edit=edit,
                        body=again))
    before = state(fam.path("b"))
    e = apply_raises(fam.path("b"), bad, PacketBodyError)
    assert "already holds" in str(e)
    assert "already holds" in rejected_by_cli(fam.path("b"), bad)
    assert state(fam.path("b")) == before


# --- header and body from different packets ---------------------------------------------------

def test_body_from_another_packet(ab, tmp_path):
    """Header (and signature) of one packet, body of another: the framing or the signed body
    hash gives it away."""
    fam, p1 = ab
    fam.put("a", "parts", "later", {"qty": 7})
    [p2] = fam.export("a", "b")
    pre1, body1, _h1, _v = parts_of(p1.read_bytes())
    _pre2, body2, _h2, _v = parts_of(p2.read_bytes())
    raw1 = p1.read_bytes()
    tail1 = raw1[len(pre1) + len(body1):]                 # header + footer of p1
    mixed = write(tmp_path, "mixed.spk", pre1 + body2 + tail1)
    before = state(fam.path("b"))
    with pytest.raises(PacketFormatError) as ei:
        verify.open_packet(mixed)
    assert "header says the body is" in str(ei.value)
    assert "header says the body is" in rejected_by_cli(fam.path("b"), mixed)
    # the same length, other bytes: the signed hash catches it
    same_len = body2[:len(body1)].ljust(len(body1), b"\x00")
    mixed2 = write(tmp_path, "mixed2.spk", pre1 + same_len + tail1)
    e = verify_raises(fam.path("b"), mixed2, PacketBodyError)
    assert "packet body does not match the hash in its signed header" in str(e)
    assert rejected_by_cli(fam.path("b"), mixed2) == str(e)
    assert state(fam.path("b")) == before


def test_body_from_another_packet_resigned(ab, tmp_path):
    """A member re-signs p1's header over p2's body (hash and length fixed up): the ops do not
    match the declared ranges and count."""
    fam, p1 = ab
    fam.put("a", "parts", "later", {"qty": 7})
    [p2] = fam.export("a", "b")
    _pre, body2, _h, _v = parts_of(p2.read_bytes())
    bad = write(tmp_path, "resigned-mix.spk",
                rebuild(p1.read_bytes(), sign_key(fam.path("a")), body=body2))
    before = state(fam.path("b"))
    e = apply_raises(fam.path("b"), bad, PacketBodyError)
    assert "declares" in str(e) or "does not continue the packet's declared range" in str(e) \
        or "clock beyond" in str(e)
    assert rejected_by_cli(fam.path("b"), bad) == str(e)
    assert state(fam.path("b")) == before


# === malformed packets ==========================================================================

def rebuild_header(data: bytes, sign, **changes) -> bytes:
    """The same body under a header with ``changes``, signed with ``sign``."""
    env = codec.read_envelope(io.BytesIO(data), len(data))
    hdr = dataclasses.replace(env.header, **changes)
    out = io.BytesIO()
    out.write(data[:env.body_offset + env.header.body_len])
    codec.finish_packet(out, hdr, env.origins, sign)
    return out.getvalue()


def flip(data: bytes, pos: int) -> bytes:
    b = bytearray(data)
    b[pos] ^= 0x5A
    return bytes(b)


class World:
    """boston, sanfran, tokyo in family 'fam'; bangalore joined later through boston and is
    still unknown to sanfran; and a second family with its own boston and sanfran."""

    def __init__(self, root: Path):
        self.fam = Family(root / "fam")
        self.fam.root.mkdir()
        f = self.fam
        f.init("boston")
        f.add("sanfran", via="boston")
        f.add("tokyo", via="boston")
        f.sync("boston", "sanfran")              # sanfran learns tokyo
        f.add("bangalore", via="boston")         # sanfran has not heard of bangalore
        for i in range(6):
            with f.open("boston") as s, s.transaction() as tx:
                tx.put("parts", f"p{i}", {"qty": i, "pad": "x" * 40 * i})
                tx.put("parts", f"q{i}", i)
        [self.good] = f.export("boston", "sanfran")
        [self.for_tokyo] = f.export("boston", "tokyo")
        f.put("bangalore", "parts", "from-bangalore", 1)
        [self.from_bangalore] = f.export("bangalore", "sanfran")

        self.other = Family(root / "other")
        self.other.root.mkdir()
        self.other.init("boston")
        self.other.add("sanfran", via="boston")
        self.other.put("boston", "parts", "p0", "other family")
        [self.other_family] = self.other.export("boston", "sanfran")

        self.sanfran = f.path("sanfran")
        self.bad_dir = root / "bad"
        self.bad_dir.mkdir()

    def write(self, name: str, data: bytes) -> Path:
        p = self.bad_dir / name
        p.write_bytes(data)
        return p

    def observe(self) -> tuple:
        s = self.sanfran
        st = run("status", site=s, json_mode=True).json
        return (run("digest", site=s, json_mode=True).json,
                run("lsepoch", site=s, json_mode=True).json,
                st["parked"], st["peers"], sorted((s / "parked").iterdir()))


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> World:
    return World(tmp_path_factory.mktemp("bad_packets"))


def _cases(w: World) -> dict[str, tuple[bytes, str]]:
    """name -> (packet bytes, text the error must contain)"""
    good = w.good.read_bytes()
    env = codec.read_envelope(io.BytesIO(good), len(good))
    n = len(good)
    footer = codec._FOOTER.size
    hstart = n - footer - len(env.header_bytes)
    body_mid = env.body_offset + env.header.body_len // 2
    hash_at = hstart + env.header_bytes.index(env.header.body_hash) + 5
    sig_at = n - footer + 4 + 10
    boston_sign = keys.load_signing_key(w.fam.path("boston")).sign
    # The helper reproduces the genuine packet byte for byte, so what the forgeries below are
    # refused for is exactly what was changed.
    assert rebuild_header(good, boston_sign) == good
    stranger = Ed25519PrivateKey.generate().sign
    sig_err = "signature does not verify with boston's key"
    return {
        "magic": (flip(good, 0), "bad magic"),
        "magic-last-byte": (flip(good, 7), "bad magic"),
        "newer-version": (good[:8] + bytes([codec.FORMAT_VERSION + 1]) + good[9:],
                          f"format version {codec.FORMAT_VERSION + 1} is newer"),
        "older-unknown-version": (good[:8] + b"\x00" + good[9:], "unknown packet format version 0"),
        "header-body-hash": (flip(good, hash_at), sig_err),
        "header-length": (flip(good, n - footer), "exceeds the limit"),
        "body": (flip(good, body_mid), "packet body does not match the hash"),
        "body-first-byte": (flip(good, env.body_offset), "packet body does not match the hash"),
        "signature": (flip(good, sig_at), sig_err),
        "end-marker": (flip(good, n - 1), "bad end marker"),
        "truncated-tail": (good[:-100], "bad end marker"),
        "truncated-to-nothing": (good[:20], "too small to be a packet"),
        "truncated-empty": (b"", "too small to be a packet"),
        "truncated-body": (good[:body_mid] + good[body_mid + 7:],
                           f"the file holds {env.header.body_len - 7}"),
        "signed-by-a-stranger": (rebuild_header(good, stranger), sig_err),
        "unknown-mandatory-feature": (
            rebuild_header(good, boston_sign, mandatory=[*env.header.mandatory, "x-quantum"]),
            "unknown mandatory feature(s): x-quantum"),
        "wrong-recipient": (w.for_tokyo.read_bytes(),
                            "packet is addressed to tokyo, not to this site (sanfran)"),
        "wrong-family": (w.other_family.read_bytes(), "packet belongs to family"),
        "unknown-sender": (w.from_bangalore.read_bytes(), "is not a member of family 'fam'"),
    }


CASES = ["magic", "magic-last-byte", "newer-version", "older-unknown-version",
         "header-body-hash", "header-length", "body", "body-first-byte", "signature",
         "end-marker", "truncated-tail", "truncated-to-nothing", "truncated-empty",
         "truncated-body", "signed-by-a-stranger", "unknown-mandatory-feature",
         "wrong-recipient", "wrong-family", "unknown-sender"]


def test_case_list_is_complete(world):
    assert sorted(_cases(world)) == sorted(CASES)


@pytest.mark.parametrize("case", CASES)
def test_bad_packet_is_rejected_and_changes_nothing(world, case):
    data, expected = _cases(world)[case]
    path = world.write(f"{case}.spk", data)
    before = world.observe()

    r = run("import", path, site=world.sanfran)
    assert r.code == 1, r
    errors = [ln for ln in r.err.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, r
    assert expected in errors[0] and str(path) in errors[0], r
    assert "Traceback" not in r.err and "internal error" not in r.err

    j = run("import", path, site=world.sanfran, json_mode=True)
    assert j.code == 1, j
    assert j.json["applied"] == [] and j.json["parked"] == [] and j.json["duplicates"] == []
    assert j.json["ops_applied"] == 0
    [rej] = j.json["rejected"]
    assert rej["path"] == str(path) and expected in rej["error"], rej

    assert world.observe() == before


def test_the_genuine_packet_still_applies(tmp_path):
    # A world of its own, so the module's shared one never learns bangalore.  After every bad
    # copy has been refused, none of them was recorded as seen: the genuine packet applies.
    world = World(tmp_path)
    for case in CASES:
        run("import", world.write(f"again-{case}.spk", _cases(world)[case][0]),
            site=world.sanfran)
    before = world.observe()
    r = run("import", world.good, site=world.sanfran, json_mode=True)
    assert r.code == 0, r
    # 12 puts, and bangalore's $roster entry written at boston after sanfran last heard from it
    assert r.json["applied"] == [str(world.good)] and r.json["ops_applied"] == 12 + 1
    assert world.observe()[0] != before[0]
    with world.fam.open("boston") as b:
        want = b.digest()[0]
    assert run("digest", site=world.sanfran, json_mode=True).json["digest"] == want


def test_unknown_advisory_feature_is_ignored(tmp_path):
    f = Family(tmp_path)
    f.init("boston")
    f.add("sanfran", via="boston")
    f.put("boston", "parts", "p1", 1)
    [good] = f.export("boston", "sanfran")
    sign = keys.load_signing_key(f.path("boston")).sign
    p = tmp_path / "advisory.spk"
    p.write_bytes(rebuild_header(good.read_bytes(), sign, advisory=["x-some-hint"]))
    r = run("import", p, site=f.path("sanfran"), json_mode=True)
    assert r.code == 0, r
    assert r.json["applied"] == [str(p)]
    assert f.digest("sanfran") == f.digest("boston")


def test_directory_import_leaves_other_sites_packets_alone(tmp_path):
    f = Family(tmp_path)
    f.init("boston")
    f.add("sanfran", via="boston")
    f.add("tokyo", via="boston")
    f.put("boston", "parts", "p1", 1)
    usb = tmp_path / "usb"
    r = run("export", "--all", "--create-out", "--out", usb, site=f.path("boston"), json_mode=True)
    assert r.code == 0, r
    by_peer = {p["to"]: Path(p["path"]) for p in r.json["packets"]}
    assert set(by_peer) == {"sanfran", "tokyo"}
    (usb / "README.txt").write_text("not a packet\n")
    (usb / "sanfran" / ".half-written.spk.tmp").write_bytes(b"\x89SYNCPK\n\x01partial")
    other = Family(tmp_path / "other")
    other.root.mkdir()
    other.init("boston")
    other.add("sanfran", via="boston")
    other.put("boston", "parts", "x", 1)
    [foreign] = other.export("boston", "sanfran")
    (usb / "sanfran" / "foreign").mkdir()
    foreign_copy = usb / "sanfran" / "foreign" / foreign.name
    foreign_copy.write_bytes(foreign.read_bytes())
    tokyo_bytes = by_peer["tokyo"].read_bytes()

    res = run("import", usb, site=f.path("sanfran"), json_mode=True)
    assert res.code == 0, res
    assert res.json["applied"] == [str(by_peer["sanfran"])]
    assert res.json["rejected"] == []
    assert sorted(res.json["skipped"]) == sorted([str(by_peer["tokyo"]), str(foreign_copy)])
    assert "error:" not in res.err
    # The medium is untouched and tokyo's packet still applies at tokyo.
    assert by_peer["tokyo"].read_bytes() == tokyo_bytes
    assert run("import", usb, site=f.path("tokyo")).code == 0
    assert f.digest("tokyo") == f.digest("sanfran") == f.digest("boston")
    # Named explicitly, the same packet for another site is an error.
    r = run("import", by_peer["tokyo"], site=f.path("sanfran"))
    assert r.code == 1 and "addressed to tokyo" in r.err


def test_a_new_members_snapshot_at_another_site_names_whom_it_is_for(tmp_path):
    """A new member's snapshot imported at a site that does not know it yet named it by id."""
    site = lambda n: tmp_path / n      # noqa: E731
    assert run("init", site("a"), "--family", "f", "--site", "a").code == 0
    for n in ("b", "c"):
        assert run("keygen", site(n), "--site", n).code == 0
        out = tmp_path / f"to-{n}"
        assert run("mkreplica", "export", "--site", n, "--pubkey",
                   site(n) / "keys" / "site.pub", "--out", out, "--create-out",
                   site=site("a")).code == 0
        if n == "b":
            assert run("mkreplica", "import", out, site=site("b")).code == 0
    [snap] = (tmp_path / "to-c").rglob("*.spk")
    r = run("import", snap, site=site("b"))
    assert r.code == 1 and "addressed to 'c' (as the packet's roster names it" in r.err, r


# === relayed blocks =============================================================================
#
# The family: A writes three transactions, B imports them and relays them to C.  B is a member
# with a valid key, so every forged packet below carries B's own valid packet signature; only
# the blocks can give the forgery away.

SIGNER: list = []


@pytest.fixture
def relay(family):
    family.init("A")
    family.add("B", via="A")
    family.add("C", via="A")
    family.full_exchange(2)
    for i in range(3):                  # three transactions, sealed as one block each
        with family.open("A") as s, s.transaction() as tx:
            for j in range(1200):
                tx.put("parts", f"p{i}-{j}", {"qty": i * 10_000 + j})
    family.sync("A", "B")
    [p] = family.export("B", "C")
    raw = p.read_bytes()
    with family.open("A") as s:
        a_id = s.site_id
    assert sum(1 for b in blocks_of(raw) if b[6:14] == a_id) == 3
    # B re-signs every forged packet with its own (valid) key
    SIGNER[:] = [sign_key(family.path("B"))]
    yield family, raw, a_id
    SIGNER.clear()


def refused(family, tmp_path, name: str, data: bytes) -> str:
    """C refuses the forged packet: exit 1, one error line, nothing applied or changed."""
    path = write(tmp_path, name, data)
    before = state(family.path("C"))
    r = run("import", path, site=family.path("C"))
    assert r.code == 1, r
    errors = [ln for ln in r.err.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in r.err, r
    assert state(family.path("C")) == before
    with family.open("C") as s:
        assert s.get("parts", "p0-0", None) is None
    return errors[0]


def forged_body(raw: bytes, edit) -> bytes:
    """B re-signs the packet (a valid signature of the sender) over a body edited by ``edit``
    (a function of the list of raw blocks)."""
    body = b"".join(edit(blocks_of(raw)))
    return rebuild(raw, SIGNER[0], body=body)




def a_blocks(bs: list[bytes], a_id: bytes) -> list[int]:
    return [i for i, b in enumerate(bs) if b[6:14] == a_id]


def test_the_honest_relay_applies(relay, tmp_path):
    family, raw, _a = relay
    path = write(tmp_path, "honest.spk", rebuild(raw, SIGNER[0]))
    assert run("import", path, site=family.path("C")).code == 0
    assert family.digest("C") == family.digest("A")


def test_one_op_altered_is_refused_naming_the_origin(relay, tmp_path):
    family, raw, a_id = relay

    def edit(bs):
        i = a_blocks(bs, a_id)[1]
        ops = list(blocks.decode_ops(bs[i]))
        ops[5] = ops[5]._replace(value=codec.encode_value({"qty": 1_000_000}))
        info = blocks.read_block_header(bs[i])
        family_id = codec.read_envelope(__import__("io").BytesIO(raw), len(raw)).header.family
        # B can make the block only with its own key
        bs[i] = blocks.encode_block(family_id, a_id, info.prev_hash, ops, SIGNER[0].sign)
        return bs
    err = refused(family, tmp_path, "altered.spk", forged_body(raw, edit))
    assert "block of origin A" in err and "signature does not verify" in err, err


def test_an_origin_signed_block_with_an_impossible_op_is_refused_naming_the_origin(
        relay, tmp_path):
    """A block its origin signed (the signature holds) whose op lists as replaced a version
    not older than itself: the error found decoding the ops names the origin as the operator
    knows it, and the packet's sender, as a signature failure does."""
    family, raw, a_id = relay

    def edit(bs):
        i = a_blocks(bs, a_id)[-1]      # the last: no block after it chains onto it
        ops = list(blocks.decode_ops(bs[i]))
        op = ops[5]
        ops[5] = op._replace(replaced=pack_csn(op.hlc + 1, op.origin, op.seq))
        info = blocks.read_block_header(bs[i])
        family_id = codec.read_envelope(__import__("io").BytesIO(raw), len(raw)).header.family
        bs[i] = blocks.encode_block(family_id, a_id, info.prev_hash, ops,
                                    sign_key(family.path("A")).sign)
        return bs
    err = refused(family, tmp_path, "impossible.spk", forged_body(raw, edit))
    assert "not older than itself" in err and "block of origin A (" in err, err
    assert "in a packet from B" in err, err


def test_a_flipped_byte_in_a_block_body_is_refused_naming_the_origin(relay, tmp_path):
    family, raw, a_id = relay

    def edit(bs):
        i = a_blocks(bs, a_id)[0]
        b = bytearray(bs[i])
        b[blocks.HEADER_LEN + 40] ^= 0x01
        bs[i] = bytes(b)
        return bs
    err = refused(family, tmp_path, "flipped.spk", forged_body(raw, edit))
    assert "block of origin A" in err and "body does not match its signed hash" in err, err


def test_a_spliced_block_is_refused_naming_the_origin(relay, tmp_path):
    """Header and signature of A's first block over the body of its second."""
    family, raw, a_id = relay

    def edit(bs):
        i, j = a_blocks(bs, a_id)[:2]
        bs[i] = bs[i][:blocks.HEADER_LEN] + bs[j][blocks.HEADER_LEN:]
        return bs
    err = refused(family, tmp_path, "spliced.spk", forged_body(raw, edit))
    assert "block of origin A" in err, err


def test_a_block_dropped_from_the_middle_is_refused_naming_the_origin(relay, tmp_path):
    family, raw, a_id = relay

    def edit(bs):
        del bs[a_blocks(bs, a_id)[1]]
        return bs

    err = refused(family, tmp_path, "dropped.spk", forged_body(raw, edit))
    assert "block of A" in err and "does not continue" in err, err


def test_reordered_blocks_are_refused(relay, tmp_path):
    family, raw, a_id = relay

    def edit(bs):
        i, j = a_blocks(bs, a_id)[1:3]
        bs[i], bs[j] = bs[j], bs[i]
        return bs
    err = refused(family, tmp_path, "reordered.spk", forged_body(raw, edit))
    assert "block of A" in err and "does not continue" in err, err


def test_ops_merged_from_two_blocks_into_one_are_refused(relay, tmp_path):
    """B re-encodes two of A's blocks as one (same ops, fewer signatures): only A can sign it."""
    family, raw, a_id = relay

    def edit(bs):
        i, j = a_blocks(bs, a_id)[:2]
        ops = list(blocks.decode_ops(bs[i])) + list(blocks.decode_ops(bs[j]))
        info = blocks.read_block_header(bs[i])
        family_id = codec.read_envelope(__import__("io").BytesIO(raw), len(raw)).header.family
        bs[i] = blocks.encode_block(family_id, a_id, info.prev_hash, ops, SIGNER[0].sign)
        del bs[j]
        return bs
    err = refused(family, tmp_path, "merged.spk", forged_body(raw, edit))
    assert "block of origin A" in err and "signature does not verify" in err, err


def test_ops_of_the_relayed_packet_are_the_origins_own(relay):
    """What C would apply from the honest relay is exactly what A wrote, block by block."""
    family, raw, a_id = relay
    ops = [op for op in ops_of(raw) if op.origin == a_id]
    assert len(ops) == 3600 and ops[0].key == "p0-0"
    _prefix, _body, h, version = parts_of(raw)
    assert version == codec.FORMAT_VERSION == 2 and "blocks" in h["req"]


def test_a_block_that_does_not_chain_onto_the_one_before_it_in_the_packet_is_refused(relay,
                                                                                     tmp_path):
    """Even the origin itself cannot continue its blocks in one packet from another past: the
    second block names a predecessor other than the first (a fork), signed with A's own key."""
    family, raw, a_id = relay
    a_key = sign_key(family.path("A"))

    def edit(bs):
        i = a_blocks(bs, a_id)[1]
        ops = list(blocks.decode_ops(bs[i]))
        family_id = codec.read_envelope(__import__("io").BytesIO(raw), len(raw)).header.family
        bs[i] = blocks.encode_block(family_id, a_id, b"\x42" * 32, ops, a_key.sign)
        return bs
    err = refused(family, tmp_path, "forked.spk", forged_body(raw, edit))
    assert "block of origin A" in err and "does not continue the chain" in err, err


# === pieces of a block too large for the medium (formats/PACKET.md section 6.4) =================

@pytest.fixture
def pieces(family, tmp_path):
    """a and b; a's one record of ~300 KB exported to b at 64K: its block in pieces.  Returns
    (family, the piece packets in order, a's signing key)."""
    family.init("a")
    family.add("b", via="a")
    with family.open("a") as s, s.transaction() as tx:
        tx.put("parts", "big", {"blob": __import__("os").urandom(150_000).hex()})
    files = family.export("a", "b", max_size=64 * 1024)
    assert len(files) >= 3
    assert all(parts_of(f.read_bytes())[2].get("piece") for f in files)
    return family, files, sign_key(family.path("a"))


def _repiece(raw: bytes, key, *, body: bytes | None = None, piece=None, pid: bytes | None = None):
    def edit(h):
        if piece is not None:
            h["piece"] = list(piece)
        if pid is not None:
            h["id"] = pid
    return rebuild(raw, key, edit=edit, body=body)


def _import_all(site: Path, paths: list[Path]):
    return run("import", *paths, site=site, json_mode=True)


def test_pieces_in_any_order_apply_once_whole(pieces):
    family, files, _key = pieces
    b = family.path("b")
    before = state(b)
    r = _import_all(b, files[1:][::-1])     # all but the first: the block is not whole
    assert r.code == 0 and not r.json["applied"] and len(r.json["parked"]) == len(files) - 1, r
    assert state(b)["digest"] == before["digest"]
    r = _import_all(b, [files[0]])
    assert r.code == 0 and len(r.json["applied"]) == len(files), r
    assert family.digest("a") == family.digest("b")
    assert run("fsck", site=b).code == 0


def test_a_missing_piece_waits_and_applies_nothing(pieces):
    family, files, _key = pieces
    b = family.path("b")
    before = state(b)["digest"]
    r = _import_all(b, files[:1] + files[2:])
    assert r.code == 0 and not r.json["applied"] and not r.json["rejected"], r
    assert all(p["waiting_for"] for p in r.json["parked"]), r
    assert state(b)["digest"] == before
    assert run("fsck", site=b).code == 0
    r = _import_all(b, [files[1]])
    assert r.code == 0 and len(r.json["applied"]) == len(files), r
    assert family.digest("a") == family.digest("b")


def test_a_duplicated_piece_is_a_duplicate(pieces):
    family, files, _key = pieces
    b = family.path("b")
    r = _import_all(b, files + [files[1]])
    assert r.code == 0 and len(r.json["applied"]) == len(files), r
    assert family.digest("a") == family.digest("b")


def test_a_second_piece_at_one_offset_with_other_bytes_refuses_the_set(pieces, tmp_path):
    family, files, key = pieces
    b = family.path("b")
    raw = files[1].read_bytes()
    body = bytearray(parts_of(raw)[1])
    body[100] ^= 0xFF
    twin = write(tmp_path, "twin.spk", _repiece(raw, key, body=bytes(body), pid=b"\x77" * 16))
    before = state(b)
    r = _import_all(b, files + [twin])
    assert r.code == 1 and not r.json["applied"], r
    assert len(r.json["rejected"]) == len(files) + 1
    assert all("same offset hold different bytes" in e["error"] for e in r.json["rejected"]), r
    assert state(b)["digest"] == before["digest"]


def test_a_lying_total_is_refused_when_the_first_piece_shows_the_block(pieces, tmp_path):
    family, files, key = pieces
    b = family.path("b")
    lying = []
    for i, f in enumerate(files):
        h = parts_of(f.read_bytes())[2]
        off, total = h["piece"]
        lying.append(write(tmp_path, f"lying{i}.spk",
                           _repiece(f.read_bytes(), key, piece=(off, total + 5000))))
    before = state(b)
    r = _import_all(b, lying)
    assert r.code == 1 and not r.json["applied"], r
    assert all("its own header" in e["error"] for e in r.json["rejected"]), r
    assert state(b)["digest"] == before["digest"]
    # a chain of pieces that never ends (no first piece, ever): it waits, applies nothing
    r = _import_all(b, lying[1:])
    assert r.code == 0 and not r.json["applied"], r
    assert state(b)["digest"] == before["digest"]


def test_a_piece_running_past_its_block_or_without_its_feature_is_refused(pieces, tmp_path):
    family, files, key = pieces
    b = family.path("b")
    raw = files[-1].read_bytes()
    off, total = parts_of(raw)[2]["piece"]
    past = write(tmp_path, "past.spk", _repiece(raw, key, piece=(total - 10, total)))
    before = state(b)
    r = _import_all(b, files[:-1] + [past])
    assert r.code == 1 and not r.json["applied"], r
    assert any("runs past the block's end" in e["error"] for e in r.json["rejected"]), r
    assert state(b)["digest"] == before["digest"]

    def no_feature(h):
        h["req"] = [f for f in h["req"] if f != codec.FEATURE_PIECE]
    bare = write(tmp_path, "bare.spk", rebuild(raw, key, edit=no_feature))
    assert "field 'piece' needs" in rejected_by_cli(b, bare)
    # an older reader (that knows no pieces) refuses the packet by its mandatory feature
    newer = write(tmp_path, "newer.spk", rebuild(raw, key, edit=lambda h: h.update(
        req=[*h["req"], "block-piece-v9"])))
    assert "unknown mandatory feature" in rejected_by_cli(b, newer)


def test_a_forged_piece_fails_the_origins_signature_once_joined(pieces, tmp_path):
    """A relay (here: a member re-signing the packet) alters a byte inside the block: the
    pieces join, the block fails its origin's check, nothing is applied."""
    family, files, key = pieces
    b = family.path("b")
    raw = files[1].read_bytes()
    body = bytearray(parts_of(raw)[1])
    body[500] ^= 0x01
    bad = write(tmp_path, "bad.spk", _repiece(raw, key, body=bytes(body)))
    before = state(b)
    r = _import_all(b, [files[0], bad] + files[2:])
    assert r.code == 1 and not r.json["applied"], r
    assert len(r.json["rejected"]) == len(files), r
    assert state(b)["digest"] == before["digest"]
    # the genuine pieces still apply afterwards
    r = _import_all(b, files)
    assert r.code == 0 and len(r.json["applied"]) == len(files), r
    assert family.digest("a") == family.digest("b")


# === patches: writes sending only the fields they changed (formats/VALUES.md) ===================
#
# a is a member gone rogue: it re-signs, with its own valid keys, the block of a genuine
# one-field update so that the op's value or base is a lie.  b refuses the packet whole.

@pytest.fixture
def patched(family):
    family.init("a")
    family.add("b", via="a")
    with family.open("a") as s, s.transaction() as tx:
        tx.set_policy("parts", "merge")
    with family.open("a") as s, s.transaction() as tx:
        tx.put("parts", "k", {"qty": 1, "bin": "A1", "note": "x" * 200})
        tx.put("parts", "t", {"qty": 1})
        tx.put("plain", "k", {"qty": 1, "bin": "A1", "note": "x" * 200})
    with family.open("a") as s, s.transaction() as tx:
        tx.delete("parts", "t")
    family.full_exchange(rounds=1)
    with family.open("a") as s, s.transaction() as tx:
        tx.put("parts", "k", {"qty": 2, "bin": "A1", "note": "x" * 200})
    [p] = family.export("a", "b")
    raw = p.read_bytes()
    [op] = [o for o in ops_of(raw) if o.collection == "parts"]
    assert values.claims_patch(op.value)
    with family.open("b") as s:
        held = {(c, k): versions.csns_of_key(s.conn, c, k) for c, k in
                (("plain", "k"), ("parts", "t"))}
    return family, raw, held


def _forge_patch(family, raw: bytes, **change) -> bytes:
    key = sign_key(family.path("a"))
    bs = blocks_of(raw)
    for i, b in enumerate(bs):
        ops = list(blocks.decode_ops(b))
        if not any(o.collection == "parts" for o in ops):
            continue
        ops = [o._replace(**change) if o.collection == "parts" else o for o in ops]
        info = blocks.read_block_header(b)
        family_id = codec.read_envelope(io.BytesIO(raw), len(raw)).header.family
        bs[i] = blocks.encode_block(family_id, info.origin, info.prev_hash, ops, key.sign)
    return rebuild(raw, key, body=b"".join(bs))


PATCH_CASES = {
    "patch in a collection not under merge, over a base not held": (
        lambda held, op: dict(collection="plain", replaced=bytes(7) + b"\x01" + b"\x42" * 8
                              + bytes(4)), "not under the merge policy"),
    "patch over a deleted record": (
        lambda held, op: dict(key="t", replaced=held[("parts", "t")]), "not a record of fields"),
    "patch naming a base that does not exist": (
        lambda held, op: dict(replaced=bytes(7) + b"\x01" + b"\x42" * 8 + bytes(4)),
        "which this site does not hold"),
    "patch naming no base": (lambda held, op: dict(replaced=b""), "versions it is based on"),
    "patch of an unknown version": (
        lambda held, op: dict(value=op.value[:3] + b"\x07" + op.value[4:]), "malformed patch"),
    "patch whose body is cut short": (
        lambda held, op: dict(value=msgpack.packb(msgpack.ExtType(values.PATCH_EXT, b"\x01\x92"))),
        "malformed patch"),
}


def test_a_patch_in_a_collection_not_under_merge_is_rebuilt_from_its_base(patched, tmp_path):
    """A patch is a shorter spelling of a whole record: where its base is held it is rebuilt,
    whatever the policy here (a member that wrote under 'merge' while another created the
    collection under 'lww' had its packets refused at every site, for good).  Nothing is
    gained by a lie here: the member could have sent the whole record."""
    family, raw, held = patched
    [op] = [o for o in ops_of(raw) if o.collection == "parts"]
    spelt = write(tmp_path, "patch.spk",
                  _forge_patch(family, raw, collection="plain", replaced=held[("plain", "k")]))
    r = run("import", spelt, site=family.path("b"))
    assert r.code == 0, r
    with family.open("b") as s:
        assert s.get("plain", "k") == {"qty": 2, "bin": "A1", "note": "x" * 200}
    assert run("fsck", site=family.path("b")).code == 0


@pytest.mark.parametrize("case", sorted(PATCH_CASES))
def test_a_patch_that_cannot_be_rebuilt_is_refused_whole(patched, tmp_path, case):
    family, raw, held = patched
    make, msg = PATCH_CASES[case]
    [op] = [o for o in ops_of(raw) if o.collection == "parts"]
    bad = write(tmp_path, "patch.spk", _forge_patch(family, raw, **make(held, op)))
    before = state(family.path("b"))
    r = run("import", bad, site=family.path("b"))
    assert r.code == 1 and "Traceback" not in r.err, r
    errors = [ln for ln in r.err.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and msg in errors[0], r
    assert state(family.path("b")) == before
    # the genuine packet still applies, and b rebuilds the record a holds
    assert run("import", write(tmp_path, "good.spk", raw), site=family.path("b")).code == 0
    assert family.digest("a") == family.digest("b")
    with family.open("b") as s:
        assert s.get("parts", "k")["qty"] == 2


@pytest.mark.parametrize("data, says", [
    (b"\x81\x91\x01\x02", "a map key is a list or a map"),
    (b"\xc1", "a byte no msgpack value starts with"),
    (b"\x91" * 100_000 + b"\x01", "nested too deep")])
def test_malformed_msgpack_is_told_in_words_of_the_data(data, says):
    """A damaged header read as msgpack said "unhashable type: 'list'" (Python's words), or
    nothing at all after the colon."""
    from syncpack.errors import PacketFormatError
    from syncpack.format import codec
    with pytest.raises(PacketFormatError) as e:
        codec.unpack_untrusted(data)
    assert str(e.value).endswith(says), e.value


@pytest.mark.parametrize("held", [b"", codec.MAGIC,
                                  codec.MAGIC + bytes([codec.FORMAT_VERSION]) * 40])
def test_a_file_shorter_than_its_size_said_is_a_packet_error(held):
    """A file on a shared drop rewritten in place while import reads it (or a sysfs file,
    whose size says 4 KiB) reads shorter than the size taken before: a crash with 'internal
    error' aborted a whole batch round."""
    with pytest.raises(PacketFormatError, match="shorter than its size said"):
        codec.read_envelope(io.BytesIO(held), 4096)


def test_an_inbox_reaching_files_that_read_short_imports_the_rest(tmp_path):
    thp = Path("/sys/kernel/mm/transparent_hugepage")
    if not (thp / "enabled").is_file() or (thp / "enabled").stat().st_size < 100:
        pytest.skip("no sysfs file that reads shorter than its size here")
    fam = Family(tmp_path)
    fam.init("a")
    fam.add("b", via="a")
    fam.put("a", "c", "k", {"v": 1})
    [packet] = fam.export("a", "b")
    (packet.parent / "thp").symlink_to(thp)
    r = run("import", packet.parent, site=fam.path("b"))
    assert "Traceback" not in r.err and "internal error" not in r.err, r
    assert run("get", "c", "k", site=fam.path("b")).code == 0, r
