"""Packets that must be refused (docs/design.md §3.6, §5; docs/commands.md exit codes).

Each bad packet, named on the command line, is rejected with an error that says which check
failed, exit 1, no traceback, and the receiving site is left exactly as it was: same digest,
same vector, same epoch matrix, nothing parked.  The genuine packet still applies afterwards, so
a bad copy did not get recorded as seen either.
"""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path

import pytest
from conftest import Family, run
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from syncpack.format import codec, keys


def rebuild(data: bytes, sign, **changes) -> bytes:
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
    assert rebuild(good, boston_sign) == good
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
        "signed-by-a-stranger": (rebuild(good, stranger), sig_err),
        "unknown-mandatory-feature": (
            rebuild(good, boston_sign, mandatory=[*env.header.mandatory, "x-quantum"]),
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
    p.write_bytes(rebuild(good.read_bytes(), sign, advisory=["x-some-hint"]))
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
