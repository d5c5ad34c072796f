"""Untrusted inputs, through the CLI (the Trust issue, classes 1, 2, 3 and 7).

1. Names become paths: site names are one safe path component wherever they enter (the command
   line, public-key files, roster entries arriving in packets), and no export leaves ``--out``.
2. Files that are not files: FIFOs are never opened for reading (no hang while holding the site
   lock), and file names with control characters cannot forge output lines.
3. A poison packet (a sealed packet whose ephemeral key is malformed) is one rejected packet
   with a packet error; the good packets beside it apply.
7. ``mkreplica export`` is atomic: if its packets cannot be written, the member is not added.

Every refusal is checked the same way: exit 1, a one-line ``error:`` naming what failed, no
traceback, the store unchanged (digest, vector, members, ``fsck``), and the honest packets of
the same import still applied.
"""

from __future__ import annotations

import dataclasses
import errno
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from conftest import Family, run
from syncpack.format import codec, keys, names
from syncpack.errors import UsageError
from syncpack.format.csn import pack_csn
from syncpack.site import ROSTER, Member, Site

# --- helpers ----------------------------------------------------------------------------------


def observe(site: Path) -> dict:
    """What a refused input must leave exactly as it was (through the CLI)."""
    d = run("digest", site=site, json_mode=True)
    ep = run("lsepoch", site=site, json_mode=True)
    cols = run("collection", "ls", site=site, json_mode=True)
    st_ = run("status", site=site, json_mode=True)
    assert d.code == ep.code == cols.code == st_.code == 0
    assert run("fsck", site=site).code == 0
    return {"digest": d.json["digest"], "records": d.json["records"],
            "vector": d.json["vector"], "lsepoch": ep.json["vector"],
            "members": sorted(ep.json["peers"]), "collections": cols.json["collections"],
            "changelog_ops": st_.json["changelog_ops"]}


def error_lines(r) -> list[str]:
    return [ln for ln in r.err.splitlines() if ln.startswith("error:")]


def refused(r, *needles: str) -> str:
    """Exit 1, exactly one ``error:`` line (holding every needle), no traceback, no bug."""
    assert r.code == 1, r
    assert "Traceback" not in r.err + r.out, r
    assert "internal error" not in r.err, r
    errs = error_lines(r)
    assert len(errs) == 1, r
    for n in needles:
        assert n in errs[0], (n, r)
    return errs[0]


def clean_lines(text: str, summary: tuple[str, ...] = ()) -> None:
    """Every line is an ``error:``/``hint:`` line or one of the normal summary lines, and no
    raw control character is printed."""
    for ln in text.splitlines():
        assert ln.isprintable(), repr(ln)
        assert ln.startswith(("error:", "hint:", *summary)), repr(ln)


def files_under(root: Path) -> set[Path]:
    """Every path under ``root`` but SQLite's own journal files (they come and go)."""
    return {p for p in root.rglob("*") if not p.name.endswith(("-wal", "-shm", "-journal"))}


def syncpack_proc(*args, timeout: float = 60):
    """The CLI in a child process, so a hang fails the test instead of blocking it."""
    return subprocess.run([sys.executable, "-m", "syncpack", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


@pytest.fixture
def abc(family):
    """a, b, c all knowing one another, with data at a."""
    family.init("a")
    family.add("b", via="a")
    family.add("c", via="a")
    family.full_exchange(rounds=1)
    family.put("a", "parts", "p1", {"qty": 1})
    return family


BAD_NAMES = [".", "..", "a/b", "/abs", "/tmp/evil", "../evil", "a\nb", "x" * 300, "-rf", ".hidden",
             "a\\b", "", "a\x00b", "name.",
             # device names of Windows: such a directory on a stick cannot be opened there
             "CON", "nul", "Aux.site", "com1", "LPT9"]


# --- 1. names become paths --------------------------------------------------------------------

@pytest.mark.parametrize("name", BAD_NAMES, ids=repr)
def test_init_and_keygen_refuse_unsafe_site_names(tmp_path, name):
    for cmd in (["init", tmp_path / "s1", "--family", "f", "--site", name],
                ["keygen", tmp_path / "s2", "--site", name]):
        r = run(*cmd)
        assert r.code == 2 and "Traceback" not in r.err, r     # a malformed value
        (line,) = [ln for ln in r.err.splitlines() if "invalid site name" in ln]
        assert line.isprintable()
        # Nothing was created, anywhere.
        assert not (tmp_path / "s1").exists() and not (tmp_path / "s2").exists(), r
        assert list(tmp_path.iterdir()) == []


def test_init_and_keygen_accept_safe_names(tmp_path):
    for i, name in enumerate(["boston", "boston_hub", "site-2", "x.y", "_x", "A" * 64,
                              "console", "com10", "nul_site", "lpt"]):
        assert run("init", tmp_path / f"i{i}", "--family", "f", "--site", name).code == 0
        assert run("keygen", tmp_path / f"k{i}", "--site", name).code == 0


ABS = "<absolute>"     # stands for an absolute path of the test's own, outside everything


@pytest.mark.parametrize("evil", ["../evil", ABS, "a/../../evil", ".."], ids=repr)
def test_public_key_file_naming_a_path_is_refused(family, tmp_path, evil):
    abs_target = tmp_path.parent / f"{tmp_path.name}-evil-abs"
    evil = str(abs_target) if evil == ABS else evil
    a = family.init("a")
    family.put("a", "parts", "p1", 1)
    pub = Path(run("keygen", tmp_path / "n", "--site", "n", json_mode=True).json["public_key"])
    doc = json.loads(pub.read_text())
    doc["site"] = evil
    pub.write_text(json.dumps(doc))
    before = observe(a)
    out = tmp_path / "usb" / "deep"
    out.mkdir(parents=True)
    files_before = files_under(tmp_path)
    for site_arg in (evil, "n"):
        r = run("mkreplica", "export", "--site", site_arg, "--pubkey", pub, "--out", out,
                site=a)
        if site_arg == evil:        # typed: a malformed value, a usage error
            assert r.code == 2 and "invalid site name" in r.err, r
        else:                       # read from the key file
            refused(r, "invalid site name")
    assert observe(a) == before
    assert files_under(tmp_path) == files_before      # not a file written, in --out or outside
    assert not abs_target.exists()


def _bad_roster_op(fam: Family, at: str, bad_name: str) -> None:
    """A member writes a roster entry under a name that cannot be a path (a buggy or hostile
    member: the CLI would refuse it, the Python API writes it raw)."""
    ident = keys.PublicIdentity(bad_name, os.urandom(8), os.urandom(32), os.urandom(32))
    m = Member(bad_name, ident.site_id, ident.ed25519, ident.x25519, 0, {}, False)
    with fam.open(at) as s, s.transaction(_system=True) as tx:
        tx.write_raw(ROSTER, bad_name, codec.encode_value(m.to_value()))


@pytest.mark.parametrize("bad", ["../evil", "/abs/evil", "x" * 300, "..", "a\nerror: forged"],
                         ids=repr)
def test_roster_op_with_a_bad_name_is_refused_at_the_importing_site(abc, tmp_path, bad):
    fam = abc
    _bad_roster_op(fam, "a", bad)
    [poisoned] = fam.export("a", "b")
    fam.put("c", "parts", "from-c", {"x": 1})
    [honest] = fam.export("c", "b")
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    shutil.copy(poisoned, inbox / "from-a.spk")
    shutil.copy(honest, inbox / "from-c.spk")
    b = fam.path("b")
    before = observe(b)
    r = run("import", inbox, site=b)
    line = refused(r, "from-a.spk", "invalid site name")
    assert line.isprintable()
    clean_lines(r.err, ("import:",))
    r2 = run("get", "parts", "from-c", site=b)
    assert r2.code == 0 and json.loads(r2.out) == {"x": 1}      # the honest packet applied
    after = observe(b)
    assert after["members"] == before["members"]                # no member named `bad`
    assert run("get", "parts", "p1", site=b).code == 1          # nothing of a's packet
    assert after["vector"]["a"] == before["vector"]["a"]
    assert after["vector"]["c"] == before["vector"].get("c", 0) + 1
    # JSON mode: the same refusal, valid JSON.
    r = run("import", inbox / "from-a.spk", site=b, json_mode=True)
    assert r.code == 1 and len(r.json["rejected"]) == 1, r
    assert "invalid site name" in r.json["rejected"][0]["error"]


def _force_roster_entry(site: Path, bad: str) -> None:
    """An old store (before names were checked) holding a roster entry that is not a safe
    name: written straight into the versions table, as an old import would have."""
    m = Member(bad, os.urandom(8), os.urandom(32), os.urandom(32), 0, {}, False)
    with Site.open(site) as s:
        # stamped now, as the old import's op was: a random stamp could lie years ahead, and
        # a snapshot holding it is refused for that before its names are read
        csn = pack_csn(s.last_hlc(), m.site_id, 1)
        s.conn.execute("BEGIN IMMEDIATE")
        s.conn.execute("INSERT INTO versions VALUES (?, ?, ?, ?)",
                       (ROSTER, bad, csn, codec.encode_value(m.to_value())))
        s.conn.execute("COMMIT")


@pytest.mark.parametrize("bad", ["../evil", ABS, "x" * 300, "..", "n\nerror: forged"],
                         ids=repr)
def test_export_all_with_a_bad_roster_entry_writes_the_good_peers(abc, tmp_path, bad):
    abs_target = tmp_path.parent / f"{tmp_path.name}-evil-abs"
    bad = str(abs_target) if bad == ABS else bad
    fam = abc
    a = fam.path("a")
    _force_roster_entry(a, bad)
    out = tmp_path / "box" / "usb"
    out.mkdir(parents=True)
    outside = files_under(tmp_path) - files_under(out)
    r = run("export", "--all", "--out", out, "--create-out", site=a)
    assert r.code == 1, r
    errs = error_lines(r)
    assert len(errs) == 1 and "invalid site name" in errs[0], r
    clean_lines(r.err)
    # Good peers got their packets, inside --out.
    written = [Path(ln.split("\t")[0]) for ln in r.out.splitlines()]
    assert {p.relative_to(out).parts[:2] for p in written} == {("b", "a"), ("c", "a")}, r
    for p in files_under(tmp_path) - files_under(out):
        assert p in outside, f"written outside --out: {p}"
    assert not abs_target.exists()
    # JSON: the failure is listed, the packets too.
    fam.put("a", "parts", "p2", 2)
    r = run("export", "--all", "--out", out, "--create-out", site=a, json_mode=True)
    assert r.code == 1, r
    assert len(r.json["packets"]) == 2 and len(r.json["failed"]) == 1, r
    assert "invalid site name" in r.json["failed"][0]["error"]
    # The packets are good: b imports them.
    assert run("import", out / "b", site=fam.path("b")).code == 0
    assert run("get", "parts", "p2", site=fam.path("b")).out.strip() == "2"


# --- 2. files that are not files --------------------------------------------------------------

@pytest.fixture
def ab_packets(family):
    family.init("a")
    family.add("b", via="a")
    family.put("a", "parts", "p1", {"qty": 1})
    family.put("a", "parts", "p2", {"qty": 2})
    return family, family.export("a", "b")


def test_fifo_in_an_import_directory_is_skipped(ab_packets):
    fam, pkts = ab_packets
    inbox = pkts[0].parent
    os.mkfifo(inbox / "0000000099-0000.spk")
    os.mkfifo(inbox / "zz-fifo")
    os.symlink(inbox / "zz-fifo", inbox / "0000000098-0000.spk")     # a link to a FIFO
    os.symlink("/dev/zero", inbox / "0000000097-0000.spk")           # a link to a device
    r = syncpack_proc("--site", fam.path("b"), "import", inbox.parent.parent)
    assert r.returncode == 0, r
    assert "Traceback" not in r.stderr
    clean_lines(r.stderr, ("import:",))
    assert "1 packet(s) applied" in r.stdout, r
    assert run("get", "parts", "p2", site=fam.path("b")).out.strip() == '{"qty": 2}'
    # lspacket on the directory too: the FIFOs are not packets.
    r = syncpack_proc("--site", fam.path("b"), "lspacket", inbox)
    assert r.returncode == 0 and r.stdout.count("update a -> b") == 1, r


def test_a_packet_cut_to_nothing_in_an_inbox_is_rejected_not_skipped(ab_packets):
    """A stick pulled out mid-copy often leaves a packet's name on 0 bytes.  It was left out
    as 'not a packet', exit 0, so a -q round from cron never said it; a file cut after its
    magic was rejected.  A file with a packet's name is now rejected either way."""
    fam, pkts = ab_packets
    pkts[0].write_bytes(b"")
    r = run("import", pkts[0].parent, site=fam.path("b"))
    line = refused(r, "0 bytes, too small to be a packet")
    assert pkts[0].name in line and "hint: " in r.err, r
    # lspacket says it as import does (it printed nothing, exit 0)
    r = run("lspacket", pkts[0].parent)
    assert r.code == 1 and pkts[0].name in r.err and "too small" in r.err, r
    (pkts[0].parent / "notes.txt").write_text("")          # other files are still left alone
    pkts[0].unlink()
    assert run("import", pkts[0].parent, site=fam.path("b")).code == 0
    assert run("lspacket", pkts[0].parent).code == 0


def test_lspacket_with_a_site_that_is_none_says_so(ab_packets, tmp_path):
    """'lspacket --site snafran' (a typo) described the packet as if no site were given,
    'signature unchecked', exit 0, then advised to run with --site DIR."""
    fam, pkts = ab_packets
    r = run("lspacket", pkts[0], site=tmp_path / "snafran")
    refused(r, "snafran")
    r = run("lspacket", pkts[0], site=fam.path("b"))
    assert r.code == 0 and "signature valid" in r.out, r


@pytest.mark.parametrize("kind", ["fifo", "link-to-fifo", "device"])
@pytest.mark.parametrize("cmd", ["import", "lspacket", "mkreplica-import"])
def test_fifo_named_on_the_command_line_is_rejected_quickly(ab_packets, tmp_path, cmd, kind):
    fam, [good] = ab_packets
    fifo = tmp_path / "fifo.spk"
    if kind == "device":
        os.symlink("/dev/zero", fifo)       # endless: reading it would never finish
    else:
        os.mkfifo(tmp_path / "the-fifo")
        if kind == "fifo":
            os.rename(tmp_path / "the-fifo", fifo)
        else:
            os.symlink(tmp_path / "the-fifo", fifo)
    b = fam.path("b")
    before = observe(b)
    if cmd == "import":
        r = syncpack_proc("--site", b, "import", fifo, good)
    elif cmd == "lspacket":
        r = syncpack_proc("--site", b, "lspacket", fifo, good)
    else:
        n = tmp_path / "n"
        assert run("keygen", n, "--site", "n").code == 0
        r = syncpack_proc("--site", n, "mkreplica", "import", fifo)
    assert r.returncode == 1, r
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr, r
    errs = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(errs) == 1 and str(fifo) in errs[0] and "not a regular file" in errs[0], r
    if cmd == "import":
        assert "1 packet(s) applied" in r.stdout      # the real packet beside it applied
        assert run("get", "parts", "p2", site=b).out.strip() == '{"qty": 2}'
    else:
        assert observe(b) == before
    if cmd == "lspacket":
        assert r.stdout.count("update a -> b") == 1, r


FORGED = "x\nerror: forged line\x1b[2Khint: \rtrust me"


def test_newline_in_a_packet_file_name_cannot_forge_lines(ab_packets, tmp_path):
    fam, [good] = ab_packets
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    named_good = inbox / f"good{FORGED}.spk"
    shutil.copy(good, named_good)
    named_bad = inbox / f"bad{FORGED}.spk"
    named_bad.write_bytes(codec.MAGIC + b"\0" * 200)         # a damaged packet
    b = fam.path("b")
    before = observe(b)
    summary = ("import:", "parked ")

    # lspacket, human and JSON
    r = run("lspacket", named_bad, named_good, site=b)
    assert r.code == 1, r
    clean_lines(r.err)
    assert len(error_lines(r)) == 1, r
    for ln in r.out.splitlines():
        assert ln.isprintable() and ": update a -> b" in ln, repr(ln)
    r = run("lspacket", named_bad, named_good, site=b, json_mode=True)
    assert r.code == 1 and len(r.json["packets"]) == 1 and len(r.json["errors"]) == 1, r

    # import of the bad one alone, JSON then human: refused, store unchanged
    r = run("import", named_bad, site=b, json_mode=True)
    assert r.code == 1 and len(r.json["rejected"]) == 1 and not r.json["applied"], r
    assert observe(b) == before
    # import of both (named, and as a directory): the bad one refused, the good one applied
    r = run("import", inbox, site=b)
    assert r.code == 1, r
    clean_lines(r.err, summary)
    assert len(error_lines(r)) == 1 and "bad" in error_lines(r)[0], r
    assert "1 packet(s) applied" in r.out
    assert run("get", "parts", "p2", site=b).out.strip() == '{"qty": 2}'
    r = run("import", named_bad, named_good, site=b, json_mode=True)
    assert r.code == 1, r
    assert len(r.json["rejected"]) == 1 and len(r.json["duplicates"]) == 1, r
    # JSON carries the real names (JSON escapes them itself), so a script can act on them
    assert r.json["rejected"][0]["path"] == str(named_bad), r
    assert r.json["duplicates"] == [str(named_good)], r


def test_control_characters_in_any_error_are_escaped(ab_packets, tmp_path):
    """Errors that are not about packets (a missing file, a site directory, a JSON-lines
    file) go through the same ``error:`` line, escaped."""
    fam, _ = ab_packets
    b = fam.path("b")
    missing = tmp_path / f"missing{FORGED}"
    for r in (run("import", missing, site=b), run("lspacket", missing),
              run("digest", site=missing), run("load", missing, site=b),
              run("mkreplica", "import", missing, site=b),
              run("mkreplica", "export", "--site", "n", "--pubkey", missing, "--out",
                  tmp_path / "o", site=fam.path("a")),
              run("get", f"col{FORGED}", "k", site=b)):
        assert r.code != 0, r
        clean_lines(r.err, ("import:",))
        assert error_lines(r), r


def test_newline_in_an_mkreplica_import_path(family, tmp_path):
    family.init("a")
    family.put("a", "parts", "p1", 1)
    n = tmp_path / "n"
    pub = run("keygen", n, "--site", "n", json_mode=True).json["public_key"]
    out = tmp_path / "usb"
    assert run("mkreplica", "export", "--site", "n", "--pubkey", pub, "--out", out, "--create-out",
               site=family.path("a")).code == 0
    bad = tmp_path / f"junk{FORGED}.spk"
    bad.write_bytes(codec.MAGIC + b"\0" * 200)
    r = run("mkreplica", "import", bad, site=n)
    refused(r, "junk")
    clean_lines(r.err)
    r = run("mkreplica", "import", bad, out, site=n)     # the good snapshot beside it
    assert r.code == 0, r
    assert run("get", "parts", "p1", site=n).out.strip() == "1"


# --- 3. a poison packet -----------------------------------------------------------------------

LOW_ORDER = [bytes(32),
             bytes.fromhex("0100000000000000000000000000000000000000000000000000000000000000"),
             bytes.fromhex("e0eb7a7c3b41b8ae1656e3faf19fc46ada098deb9c32b1fd866205165f49b800"),
             bytes.fromhex("5f9c95bca3508c24b1d0b1559c83ef5b04445cc4581c8e86d8224eddd09f1157"),
             bytes.fromhex("ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f")]


def resealed_epk(raw: bytes, epk: bytes, sign) -> bytes:
    """The same sealed packet with only its ephemeral key replaced, re-signed by its sender."""
    env = codec.read_envelope(io.BytesIO(raw), len(raw))
    assert env.header.sealed
    hdr = dataclasses.replace(env.header, seal_epk=epk)
    out = io.BytesIO()
    out.write(raw[:env.body_offset + env.header.body_len])
    codec.finish_packet(out, hdr, env.origins, sign)
    return out.getvalue()


@pytest.mark.parametrize("epk", LOW_ORDER, ids=lambda e: e.hex()[:8])
def test_sealed_packet_with_a_malformed_ephemeral_key_is_one_rejected_packet(abc, tmp_path,
                                                                           epk):
    fam = abc
    b = fam.path("b")
    fam.put("c", "parts", "from-c", {"x": 1})
    out_c = fam.medium()
    r = run("export", "--to", "b", "--out", out_c, "--create-out", "--encrypt", site=fam.path("c"),
            json_mode=True)
    assert r.code == 0, r
    [sealed] = [Path(p["path"]) for p in r.json["packets"]]
    out_a = fam.medium()
    r = run("export", "--to", "b", "--out", out_a, "--create-out", "--encrypt", site=fam.path("a"),
            json_mode=True)
    [good_a] = [Path(p["path"]) for p in r.json["packets"]]
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    (inbox / "0-poison.spk").write_bytes(
        resealed_epk(sealed.read_bytes(), epk, keys.load_signing_key(fam.path("c")).sign))
    shutil.copy(good_a, inbox / "1-good-a.spk")
    before = observe(b)
    r = run("import", inbox, site=b)
    line = refused(r, "0-poison.spk")
    assert "1 packet(s) applied" in r.out, r
    assert run("get", "parts", "p1", site=b).out.strip() == '{"qty": 1}'   # a's packet
    assert run("get", "parts", "from-c", site=b).code == 1
    after = observe(b)
    assert after["vector"].get("c", 0) == before["vector"].get("c", 0)
    assert after["vector"]["a"] > before["vector"]["a"]
    assert "malformed ephemeral key" in line, line
    # JSON: the same, one rejected, valid JSON
    r = run("import", inbox / "0-poison.spk", site=b, json_mode=True)
    assert r.code == 1 and len(r.json["rejected"]) == 1, r
    assert "internal error" not in r.json["rejected"][0]["error"]
    assert observe(b) == after
    # The genuine sealed packet still applies afterwards (the bad copy was not recorded).
    r = run("import", sealed, site=b)
    assert r.code == 0, r
    assert run("get", "parts", "from-c", site=b).code == 0


@pytest.mark.parametrize("epk", LOW_ORDER[:3], ids=lambda e: e.hex()[:8])
def test_sealed_replica_snapshot_with_a_malformed_ephemeral_key(family, tmp_path, epk):
    family.init("a")
    family.put("a", "parts", "p1", 1)
    n = tmp_path / "n"
    pub = run("keygen", n, "--site", "n", json_mode=True).json["public_key"]
    out = tmp_path / "usb"
    r = run("mkreplica", "export", "--site", "n", "--pubkey", pub, "--out", out, "--create-out",
        "--encrypt",
            site=family.path("a"), json_mode=True)
    [p] = [Path(x["path"]) for x in r.json["packets"]]
    bad = tmp_path / "bad" / p.name
    bad.parent.mkdir()
    bad.write_bytes(resealed_epk(p.read_bytes(), epk,
                                 keys.load_signing_key(family.path("a")).sign))
    r = run("mkreplica", "import", bad, site=n)
    refused(r, "malformed ephemeral key")
    hints = [ln for ln in r.err.splitlines() if ln.startswith("hint:")]
    assert hints and "recipient" not in hints[0], r     # not "import it at its recipient"
    assert run("get", "parts", "p1", site=n).code == 1          # still not joined
    assert run("mkreplica", "import", out, site=n).code == 0    # the genuine one applies
    assert run("get", "parts", "p1", site=n).out.strip() == "1"


# --- 7. mkreplica export is atomic ------------------------------------------------------------

@pytest.mark.parametrize("how", ["out-under-a-file", "out-is-a-file", "peer-dir-is-a-file",
                                 "packet-name-is-a-dir"])
def test_mkreplica_export_to_an_unwritable_out_adds_nothing(family, tmp_path, how):
    a = family.init("a")
    family.add("b", via="a")
    family.put("a", "parts", "p1", 1)
    n = tmp_path / "n"
    pub = run("keygen", n, "--site", "n", json_mode=True).json["public_key"]
    blocker = tmp_path / "blocker"
    if how == "out-is-a-file":
        blocker.write_text("x")
        out = blocker
    elif how == "out-under-a-file":
        blocker.write_text("x")
        out = blocker / "usb"
    elif how == "peer-dir-is-a-file":
        out = tmp_path / "usb"
        (out / "n").mkdir(parents=True)
        (out / "n" / "a").write_text("x")
    else:
        out = tmp_path / "usb"
        # the final name of the first part is taken by a directory: the rename fails
        (out / "n" / "a" / "0000000001-0000.snapshot.spk" / "x").mkdir(parents=True)
    before = observe(a)
    r = run("mkreplica", "export", "--site", "n", "--pubkey", pub, "--out", out, "--create-out",
        site=a)
    if how == "out-is-a-file":
        # refused as the option is read, before anything is done: input rejected, as a
        # missing path is (it was click's usage text and exit 2, with no JSON document)
        refused(r, "is a file; a directory is needed here")
    else:
        line = refused(r, str(out))
        assert "cannot write packets into" in line or "cannot create outbox" in line, r
    assert observe(a) == before, "the member was added although its packets were not written"
    r = run("mkreplica", "export", "--site", "n", "--pubkey", pub, "--out", out, "--create-out",
        site=a,
            json_mode=True)
    assert r.code == 1 and "error" in r.json, r
    # No partial or temporary packet left on the medium.
    if out.is_dir():
        assert not [p for p in out.rglob("*") if p.is_file() and p.name != "a"
                    and p.suffix in (".spk", ".tmp")]
    # b, told by a, does not learn of n either.
    family.sync("a", "b")
    assert "n" not in run("lsepoch", site=family.path("b"), json_mode=True).json["peers"]
    # A retry with a good --out succeeds, and n joins.
    good = tmp_path / "good"
    r = run("mkreplica", "export", "--site", "n", "--pubkey", pub, "--out", good, "--create-out",
        site=a)
    assert r.code == 0, r
    assert run("mkreplica", "import", good, site=n).code == 0
    assert run("get", "parts", "p1", site=n).out.strip() == "1"
    assert "n" in observe(a)["members"]


# --- the one name rule ------------------------------------------------------------------------

@settings(max_examples=500, deadline=None)
@given(st.one_of(st.text(max_size=80),
                 st.text(alphabet="abAB09_.-/\\\n\x00 ", max_size=12),
                 st.sampled_from(BAD_NAMES)))
def test_every_accepted_site_name_is_one_plain_path_component(name):
    try:
        ok = names.check_site_name(name)
    except UsageError:
        return
    assert ok == name
    assert name not in (".", "..", "")
    assert os.sep not in name and "/" not in name and "\\" not in name
    assert (os.altsep or "/") not in name
    assert os.path.normpath(name) == name
    assert os.path.basename(name) == name and not os.path.isabs(name)
    assert all(c.isprintable() and not c.isspace() for c in name)
    assert not name.startswith(("-", ".")) and len(name) <= names.MAX_SITE_NAME
    assert Path(name).name == name and len(Path(name).parts) == 1


@settings(max_examples=200, deadline=None)
@given(st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,62}[A-Za-z0-9_-]", fullmatch=True))
def test_plain_names_are_accepted(name):
    assert names.check_site_name(name) == name


def test_update_export_to_an_unwritable_out_records_nothing(abc, tmp_path):
    """The same for update packets: nothing is recorded as sent, and a retry sends it all."""
    fam = abc
    a = fam.path("a")
    blocker = tmp_path / "blocker"
    blocker.write_text("x")
    before = run("lsepoch", site=a, json_mode=True).json
    r = run("export", "--to", "b", "--out", blocker / "usb", "--create-out", site=a)
    line = refused(r, str(blocker / "usb"))
    assert "cannot write packets into" in line or "cannot create outbox" in line, r
    assert run("lsepoch", site=a, json_mode=True).json == before
    assert blocker.read_text() == "x"
    good = tmp_path / "good"
    r = run("export", "--to", "b", "--out", good, "--create-out", site=a)
    assert r.code == 0, r
    assert run("import", good, site=fam.path("b")).code == 0
    assert run("get", "parts", "p1", site=fam.path("b")).out.strip() == '{"qty": 1}'


def _poison_inbox(fam: Family, tmp_path: Path, epk: bytes) -> Path:
    """b's inbox: c's sealed packet with a bad ephemeral key, a FIFO, and a's good packet."""
    fam.put("c", "parts", "from-c", {"x": 1})
    r = run("export", "--to", "b", "--out", fam.medium(), "--encrypt", site=fam.path("c"),
            json_mode=True)
    [sealed] = [Path(p["path"]) for p in r.json["packets"]]
    [good_a] = fam.export("a", "b")
    inbox = tmp_path / "inbox" / "b"
    inbox.mkdir(parents=True)
    (inbox / "0-poison.spk").write_bytes(
        resealed_epk(sealed.read_bytes(), epk, keys.load_signing_key(fam.path("c")).sign))
    os.mkfifo(inbox / "0-fifo.spk")
    shutil.copy(good_a, inbox / "1-good-a.spk")
    return inbox


def test_poison_packet_does_not_stop_a_cron_inbox(abc, tmp_path):
    """The issue's scenario: ``syncpack -q batch`` from cron over an inbox holding a poison
    packet (and a FIFO): the round finishes, the good packet applies, exit 1 names the bad."""
    fam = abc
    inbox = _poison_inbox(fam, tmp_path, bytes(32))
    cfg = tmp_path / "b.toml"
    cfg.write_text(f'site = "{fam.path("b")}"\n\n[[import]]\npath = "{inbox}"\n'
                   f'remove_after_import = true\n')
    r = syncpack_proc("-q", "batch", cfg)
    assert r.returncode == 1, r
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr, r
    errs = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(errs) == 1 and "0-poison.spk" in errs[0], r
    clean_lines(r.stderr)
    assert run("get", "parts", "p1", site=fam.path("b")).out.strip() == '{"qty": 1}'
    # the applied packet was removed, the rejected one and the FIFO left alone
    assert sorted(p.name for p in inbox.iterdir()) == ["0-fifo.spk", "0-poison.spk"]
    r = syncpack_proc("--json", "batch", cfg)
    assert r.returncode == 1, r
    doc = json.loads(r.stdout)
    assert [x["path"] for x in doc["imported"]["rejected"]] == [str(inbox / "0-poison.spk")]


@pytest.mark.parametrize("epk", LOW_ORDER[:2], ids=lambda e: e.hex()[:8])
def test_poisoned_resync_snapshot_beside_good_packets(abc, tmp_path, epk):
    """A hard-resync snapshot (sealed) with a bad ephemeral key: rejected as a packet, the
    update packets beside it apply."""
    fam = abc
    b = fam.path("b")
    r = run("resync", "--to", "b", "--out", fam.medium(), "--encrypt", site=fam.path("c"),
            json_mode=True)
    assert r.code == 0, r
    [snap] = [Path(p["path"]) for p in r.json["packets"]]
    [good_a] = fam.export("a", "b")
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    (inbox / "0-snap.spk").write_bytes(
        resealed_epk(snap.read_bytes(), epk, keys.load_signing_key(fam.path("c")).sign))
    shutil.copy(good_a, inbox / "1-good-a.spk")
    r = run("import", inbox, site=b)
    refused(r, "0-snap.spk")
    assert run("get", "parts", "p1", site=b).out.strip() == '{"qty": 1}'
    assert run("fsck", site=b).code == 0


def test_bad_roster_entry_in_a_snapshot_is_refused_by_the_new_site(family, tmp_path):
    """An old store holding a roster entry that cannot be a path seeds a new site: the new
    site refuses the snapshot, names the entry, and stays unjoined."""
    a = family.init("a")
    family.put("a", "parts", "p1", 1)
    _force_roster_entry(a, "../evil")
    n = tmp_path / "n"
    pub = run("keygen", n, "--site", "n", json_mode=True).json["public_key"]
    out = tmp_path / "usb"
    r = run("mkreplica", "export", "--site", "n", "--pubkey", pub, "--out", out, "--create-out",
        site=a)
    assert r.code == 0, r
    r = run("mkreplica", "import", out, site=n)
    refused(r, "invalid site name", "../evil")
    r = run("get", "parts", "p1", site=n)
    assert r.code == 1 and "not joined" in r.err, r


def test_human_listings_escape_names_and_keys(abc):
    """Names from an old store's roster and keys written by any member are data: listings
    print them escaped, one line per entry."""
    fam = abc
    a = fam.path("a")
    _force_roster_entry(a, "n\nerror: forged\x1b[2J")
    assert run("put", "parts", "k\nerror: forged\r", "1", site=a).code == 0
    for cmd in (["status"], ["lsepoch"], ["ls"], ["ls", "parts"], ["collection", "ls"]):
        r = run(*cmd, site=a)
        assert r.code == 0, r
        for ln in (r.out + r.err).splitlines():
            assert ln.isprintable() or "\t" in ln, repr(ln)
            assert not ln.startswith("error:"), (cmd, r)
    ls = run("ls", "parts", site=a).out.splitlines()
    assert "parts\tk\\nerror: forged\\r\t1" in ls, ls
    assert run("ls", "parts", site=a, json_mode=True).json["records"][0]["key"] in (
        "k\nerror: forged\r", "p1")


def test_mkreplica_export_onto_a_medium_that_fills_midway(family, tmp_path, monkeypatch):
    """The medium fills while the second part of the snapshot is written: every part goes,
    the member is not added, and a retry on a roomier medium succeeds."""
    from syncpack.exchange import packets
    a = family.init("a")
    with family.open("a") as s, s.transaction() as tx:
        for i in range(4000):
            tx.put("parts", f"p{i:04d}", {"pad": os.urandom(40).hex()})
    n = tmp_path / "n"
    pub = run("keygen", n, "--site", "n", json_mode=True).json["public_key"]
    out = tmp_path / "usb"
    real_write = packets._GuardedFile.write
    written = {"n": 0}

    def write(self, b):
        written["n"] += len(b)
        if written["n"] > 80_000:
            self._f.close()
            self._tmp.unlink(missing_ok=True)
            raise packets._os_error(OSError(28, "No space left on device"), self._dir)
        return real_write(self, b)

    before = observe(a)
    monkeypatch.setattr(packets._GuardedFile, "write", write)
    r = run("mkreplica", "export", "--site", "n", "--pubkey", pub, "--out", out, "--create-out",
            "--max-size", "64K", site=a)
    monkeypatch.setattr(packets._GuardedFile, "write", real_write)
    refused(r, "is full")
    # a snapshot goes whole or not at all: a smaller --max-size would cut the same bytes
    # into more files
    assert "hint: free space on the medium" in r.err and "nothing was sent" in r.err, r
    assert "smaller --max-size" not in r.err, r
    big = packets._os_error(OSError(errno.EFBIG, "File too large"), out)
    assert "smaller --max-size" in big.hint, big.hint
    assert observe(a) == before
    assert not [p for p in out.rglob("*") if p.is_file()], list(out.rglob("*"))
    r = run("mkreplica", "export", "--site", "n", "--pubkey", pub, "--out", out, "--create-out",
            "--max-size", "64K", site=a, json_mode=True)
    assert r.code == 0 and len(r.json["packets"]) > 2, r
    assert run("mkreplica", "import", out, site=n).code == 0
    assert run("digest", site=n).out == run("digest", site=a).out


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_mkreplica_export_into_a_read_only_directory(family, tmp_path):
    a = family.init("a")
    n = tmp_path / "n"
    pub = run("keygen", n, "--site", "n", json_mode=True).json["public_key"]
    out = tmp_path / "ro"
    out.mkdir()
    out.chmod(0o500)
    try:
        before = observe(a)
        refused(run("mkreplica", "export", "--site", "n", "--pubkey", pub, "--out", out,
                    site=a), "cannot write packets into")
        assert observe(a) == before
    finally:
        out.chmod(0o700)
    assert run("mkreplica", "export", "--site", "n", "--pubkey", pub, "--out", out, "--create-out",
               site=a).code == 0


def test_poisoned_packet_parked_behind_a_gap_is_rejected_when_the_gap_fills(abc, tmp_path):
    """The malformed key is only found when the body is opened: a poisoned packet that first
    waits for a gap is parked, then rejected alone (and dropped from the parking) once the
    gap fills; the packet that filled it applies."""
    fam = abc
    b = fam.path("b")
    fam.put("c", "parts", "c1", 1)
    r1 = run("export", "--to", "b", "--out", fam.medium(), "--encrypt", site=fam.path("c"),
             json_mode=True)
    fam.put("c", "parts", "c2", 2)
    r2 = run("export", "--to", "b", "--out", fam.medium(), "--encrypt", site=fam.path("c"),
             json_mode=True)
    [first] = [Path(p["path"]) for p in r1.json["packets"]]
    [second] = [Path(p["path"]) for p in r2.json["packets"]]
    poisoned = tmp_path / "second.spk"
    poisoned.write_bytes(resealed_epk(second.read_bytes(), bytes(32),
                                      keys.load_signing_key(fam.path("c")).sign))
    r = run("import", poisoned, site=b, json_mode=True)
    assert r.code == 0 and len(r.json["parked"]) == 1, r
    r = run("import", first, site=b)
    line = refused(r, "second.spk")
    assert "1 packet(s) applied" in r.out, r
    assert "internal error" not in line
    assert run("get", "parts", "c1", site=b).out.strip() == "1"
    assert run("get", "parts", "c2", site=b).code == 1
    st_ = run("status", site=b, json_mode=True).json
    assert st_["parked"] == [], st_
    assert run("fsck", site=b).code == 0
    assert run("import", second, site=b).code == 0           # the genuine one still applies
    assert run("get", "parts", "c2", site=b).out.strip() == "2"


def test_batch_export_to_all_with_a_bad_roster_entry_writes_the_good_peers(abc, tmp_path):
    """The scheduled round too: one bad roster entry does not hold back the other peers'
    packets; the round fails (exit 1) naming the entry, the packets are on the medium."""
    fam = abc
    a = fam.path("a")
    _force_roster_entry(a, "../evil")
    out = tmp_path / "outbox" / "usb"
    out.mkdir(parents=True)
    cfg = tmp_path / "a.toml"
    cfg.write_text(f'site = "{a}"\n\n[[export]]\nout = "{out}"\nto = "all"\n')
    r = run("batch", cfg)
    assert r.code == 1, r
    errs = error_lines(r)
    assert len(errs) == 1 and "invalid site name" in errs[0] and "../evil" in errs[0], r
    clean_lines(r.err)
    assert sorted(p.relative_to(out).parts[:2] for p in out.rglob("*.spk")) == \
        [("b", "a"), ("c", "a")]
    assert {p for p in (tmp_path / "outbox").rglob("*")} <= {out, *out.rglob("*")}
    doc = run("batch", cfg, json_mode=True).json
    assert doc["exit_code"] == 1 and len(doc["errors"]) == 1, doc
    assert run("import", out / "b", site=fam.path("b")).code == 0
    assert run("get", "parts", "p1", site=fam.path("b")).out.strip() == '{"qty": 1}'


def test_batch_removes_an_applied_packet_whose_name_holds_a_newline(ab_packets, tmp_path):
    """remove_after_import matches the import's escaped names back to the inbox's files: the
    applied packet goes whatever its name, the damaged one beside it stays."""
    fam, [good] = ab_packets
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    shutil.copy(good, inbox / f"good{FORGED}.spk")
    (inbox / f"bad{FORGED}.spk").write_bytes(codec.MAGIC + b"\0" * 200)
    cfg = tmp_path / "b.toml"
    cfg.write_text(f'site = "{fam.path("b")}"\n\n[[import]]\npath = "{inbox}"\n'
                   f'remove_after_import = true\n')
    r = run("batch", cfg)
    assert r.code == 1, r
    clean_lines(r.err)
    assert len(error_lines(r)) == 1 and "bad" in error_lines(r)[0], r
    for ln in r.out.splitlines():
        assert ln.isprintable(), repr(ln)
    assert [p.name for p in inbox.iterdir()] == [f"bad{FORGED}.spk"]
    assert run("get", "parts", "p2", site=fam.path("b")).out.strip() == '{"qty": 2}'


@pytest.mark.parametrize("args", [
    ("put", "p\udcff", "k", "1"), ("put", "p", "k\udcff", "1"), ("put", "p", "k", '"\udcff"'),
    ("get", "p\udcff", "k"), ("ls", "p\udcff"), ("delete", "p", "k\udcff"),
    ("collection", "create", "p\udcff", "--policy", "lww"), ("priority", "b\udcff", "1"),
    ("export", "--to", "b\udcff", "--out", "usb"), ("conflicts", "p\udcff"),
    ("log", "export", "d\udcff"), ("export", "--all", "--out", ".", "--engine", "spark",
                                    "--log", "d\udcff")])
def test_names_that_are_not_utf8_are_usage_errors(family, args):
    """Bytes that are not UTF-8 on a command line reach Python as surrogate escapes, which no
    store or packet can hold: an internal error (a traceback with -v) before."""
    a = family.init("a")
    before = run("digest", site=a).out
    r = run(*args, site=a)
    assert r.code == 2 and "not UTF-8 text" in r.err, r
    assert run("digest", site=a).out == before


def test_paths_that_are_not_utf8_are_usage_errors_with_nothing_made(family, tmp_path):
    """The store records the paths it writes and reads, as UTF-8 text.  A directory whose
    name is not UTF-8 made init fail part-way (a half-made site left behind) and mkreplica
    export fail after writing its packet directory, both as internal errors."""
    a = family.init("a")
    family.init("b")
    before = run("digest", site=a).out
    bad = str(tmp_path / "d\udcff")
    for args in [("init", bad, "--family", "f", "--site", "x"), ("keygen", bad, "--site", "x"),
                 ("export", "--all", "--out", bad, "--create-out"), ("import", bad),
                 ("attach", bad + ".db", "--table", "t"), ("--site", bad, "status")]:
        r = run(*args, site=None if args[0] == "--site" else a)
        assert r.code == 2 and "not a UTF-8 path" in r.err, (args, r)
    r = run("status", env={"SYNCPACK_SITE": bad})
    assert r.code == 2 and "SYNCPACK_SITE" in r.err, r
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        p.name for p in tmp_path.iterdir() if "\udcff" not in p.name)
    assert run("digest", site=a).out == before


def test_an_empty_path_is_a_usage_error_not_the_current_directory(abc, tmp_path,
                                                                   monkeypatch):
    """An unset variable in a cron job ('import "$INBOX"') gives an empty argument, which
    the system reads as the current directory: import applied what it found there, site
    directories included, and export, resync and mkreplica export wrote packets into it."""
    a = abc.path("a")
    pkt = abc.export("a", "b")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    shutil.copytree(pkt[0].parent, cwd / "a")      # an inbox the empty path would find
    monkeypatch.chdir(cwd)
    before, names = observe(abc.path("b")), sorted(os.listdir(cwd))
    for args, site in [(("import", ""), abc.path("b")),
                       (("export", "--to", "b", "--out", "", "--create-out"), a),
                       (("resync", "--to", "b", "--out", ""), a),
                       (("mkreplica", "export", "--site", "d", "--pubkey",
                         abc.path("b") / "keys" / "site.pub", "--out", ""), a),
                       (("log", "export", ""), a), (("lspacket", ""), a),
                       (("mkreplica", "import", ""), None), (("init", "", "--family", "f",
                                                             "--site", "x"), None),
                       (("keygen", "", "--site", "x"), None), (("batch", ""), None),
                       (("load", ""), a), (("attach", "", "--table", "t"), a),
                       (("status",), ""),
                       (("export", "--all", "--out", "o", "--create-out", "--engine", "spark",
                         "--log", ""), a)]:
        r = run(*args, site=site)
        assert r.code == 2 and "the path is empty" in r.err, (args, r)
    assert sorted(os.listdir(cwd)) == names
    assert observe(abc.path("b")) == before


def test_malformed_values_are_usage_errors_like_click_s_own(family):
    """One rule for malformed values (exit 2, as click gives for the values it checks): an
    ORIGIN=EPOCH that is not one and a family without a name exited 1."""
    a = family.init("a")
    family.add("b", via="a")
    for args in (("chepoch", "b", "a=-1"), ("chepoch", "b", "a=abc"), ("chepoch", "b", "a"),
                 # what Python's int() would take but no administrator writes as an epoch
                 ("chepoch", "b", "a=+1"), ("chepoch", "b", "a=\u0661"),
                 ("chepoch", "b", "a=0_1"), ("chepoch", "b", "a= 1"),
                 # the same origin twice: the last one winning silently hides a typo
                 ("chepoch", "b", "a=0", "a=0"),
                 ("conflicts", "resolve", "c", "k", "--field", "x=a", "--field", "x=b")):
        r = run(*args, site=a)
        assert r.code == 2 and "hint:" in r.err, (args, r)
    out = family.root / "o"
    for size in ("65_536K", "1e6", "\uff16\uff14K", "+64K", "64 K", "0x10000"):
        r = run("export", "--to", "b", "--out", out, "--create-out", "--max-size", size, site=a)
        assert r.code == 2 and "not a size" in r.err and not out.exists(), (size, r)
    for blank in ("", "   ", "\t"):
        r = run("init", family.root / "x", "--family", blank, "--site", "x")
        assert r.code == 2 and "needs a name" in r.err and not (family.root / "x").exists(), r


def test_an_option_of_one_value_given_twice_is_a_usage_error(abc, tmp_path):
    """click keeps the last of an option given twice: 'resync --to b --to c' re-seeded c
    alone while its operator believed b was too, and '--policy lww --policy merge' made a
    policy that never changes again.  Options that take several ('export --to b --to c')
    and flags given twice are as before."""
    a = abc.path("a")
    tmp_path = tmp_path / "w"
    tmp_path.mkdir()
    before = observe(a)
    for args, site in [(("resync", "--to", "b", "--to", "c", "--out", tmp_path / "r"), a),
                       (("collection", "create", "cc", "--policy", "lww", "--policy", "merge"),
                        a),
                       (("export", "--to", "b", "--out=" + str(tmp_path / "o1"), "--out",
                         tmp_path / "o2", "--create-out"), a),
                       (("--site", a, "--site", abc.path("b"), "status"), None)]:
        r = run(*args, site=site)
        assert r.code == 2 and "given twice" in r.err, (args, r)
    assert not any(tmp_path.iterdir())
    assert observe(a) == before
    r = run("--json", "export", "--to", "b", "--to", "c", "--out", tmp_path / "o",
            "--create-out", "--json", site=a)
    assert r.code == 0 and {p["to"] for p in r.json["packets"]} == {"b", "c"}, r
    # after '--', and after the command's name for the program's own options, what looks
    # like an option is an argument
    r = run("put", "--", "parts", "--site", "1", site=a)
    assert r.code == 0 and run("get", "parts", "--", "--site", site=a).out.strip() == "1", r


def test_a_failed_command_leaves_no_outbox_it_made(abc, tmp_path):
    """--create-out made the directory before the command failed (a bad public key, a
    member's name taken, a signing key gone), and left it behind, empty: a command that
    fails changes nothing."""
    a = abc.path("a")
    before = observe(a)
    junk = tmp_path / "junk.pub"
    junk.write_text("not a key")
    for args in (("mkreplica", "export", "--site", "d", "--pubkey", junk, "--out",
                  tmp_path / "m" / "new", "--create-out"),
                 ("mkreplica", "export", "--site", "b", "--pubkey",
                  abc.path("b") / "keys" / "site.pub", "--out", tmp_path / "m" / "new",
                  "--create-out")):
        r = run(*args, site=a)
        assert r.code in (1, 2) and not (tmp_path / "m").exists(), (args, r)
    key = a / "keys" / "sign.key"
    saved = key.read_bytes()
    key.unlink()
    try:
        r = run("export", "--to", "b", "--out", tmp_path / "o" / "usb", "--create-out", site=a)
        assert r.code == 1 and not (tmp_path / "o").exists(), r
    finally:
        key.write_bytes(saved)
    assert observe(a) == before
    r = run("export", "--to", "b", "--out", tmp_path / "o" / "usb", "--create-out", site=a)
    assert r.code == 0 and any((tmp_path / "o" / "usb").rglob("*.spk")), r


def test_mkreplica_import_of_a_mistyped_path_or_one_named_twice(family, tmp_path):
    """A mistyped path was told as 'ask the sender for a new snapshot'; the snapshot's
    directory named twice (or with a file in it) as 'snapshot parts are incomplete: have
    part(s) [0, 0]', with the hint to copy every part onto the medium."""
    a = family.init("a")
    d = tmp_path / "d"
    assert run("keygen", d, "--site", "d").code == 0
    usb = tmp_path / "usb"
    assert run("mkreplica", "export", "--site", "d", "--pubkey", d / "keys" / "site.pub",
               "--out", usb, "--create-out", site=a).code == 0
    r = run("mkreplica", "import", tmp_path / "typo", site=d)
    assert r.code == 1 and "check the path" in r.err and "new snapshot" not in r.err, r
    snap = next(usb.rglob("*.spk"))
    r = run("mkreplica", "import", usb, usb, snap, site=d)
    assert r.code == 0, r
    assert run("fsck", site=d).code == 0


def test_put_from_standard_input_says_when_it_is_not_utf8(family):
    """Bytes that are not UTF-8 on put's standard input were told as 'not valid JSON
    (Expecting value)'; load says 'not UTF-8' of the same bytes.  A byte-order mark, as some
    editors write, is no part of the value."""
    a = family.init("a")
    r = run("put", "c", "k", "-", site=a, input=b'"a\xff"')
    assert r.code == 2 and "not UTF-8" in r.err, r
    r = run("put", "c", "k", "-", site=a, input='\ufeff{"x": "é"}'.encode())
    assert r.code == 0 and run("get", "c", "k", site=a).out.strip() == '{"x": "é"}', r


def test_a_member_named_as_no_site_can_be_is_a_usage_error(abc, tmp_path):
    """The exit codes' rule: a site name that cannot be one is exit 2, as keygen gives;
    naming a peer so ('export --to ../x') was exit 1, 'no member named'."""
    a = abc.path("a")
    before = observe(a)
    for args in (("export", "--to", "../x", "--out", tmp_path / "o", "--create-out"),
                 ("export", "--to", "", "--out", tmp_path / "o", "--create-out"),
                 ("resync", "--to", "a/b", "--out", tmp_path / "o"), ("priority", "", "5"),
                 ("chepoch", "../x", "a=1"), ("rmreplica", "x" * 65)):
        r = run(*args, site=a)
        assert r.code == 2 and "invalid site name" in r.err, (args, r)
    assert not (tmp_path / "o").exists() and observe(a) == before
    r = run("export", "--to", "zz", "--out", tmp_path / "o", "--create-out", site=a)
    assert r.code == 1 and "members: a, b, c" in r.err, r     # a name, of no member


@pytest.mark.parametrize("value", ["NaN", '{"a": 1e999}', "[Infinity]",
                                   "18446744073709551616", '"\\ud800"'])
def test_a_resolving_value_is_held_to_what_put_takes(abc, value):
    """'conflicts resolve --value' wrote non-finite numbers that put refuses (they then
    replicated), and told a too-large integer or a lone surrogate as exit 1 without a hint,
    in Python's own words."""
    a, b = abc.path("a"), abc.path("b")
    abc.put("b", "parts", "p1", {"qty": 2})
    abc.full_exchange(rounds=1)
    assert run("put", "parts", "p1", value, site=a).code == 2
    before = observe(a)
    r = run("conflicts", "resolve", "parts", "p1", "--value", value, site=a)
    assert r.code == 2 and "hint:" in r.err and "codec" not in r.err, r
    assert observe(a) == before


def test_an_export_to_this_site_itself_says_what_to_do(family):
    a = family.init("a")
    family.add("b", via="a")
    r = run("export", "--to", "a", "--out", family.root / "o", "--create-out", site=a)
    line = refused(r, "a is this site")
    assert line and "hint: 'syncpack lsepoch' lists the peers" in r.err, r
    assert not (family.root / "o").exists()


def test_the_systems_refusals_each_say_what_to_do(family, tmp_path):
    """An error of the operating system's was its words alone (`File exists: PATH`, `Not a
    directory`, `File name too long`, `Permission denied`): now each has the hint for it.
    Permissions are checked in the translation itself, since a test run as root is never
    refused."""
    from syncpack.outcome import error_outcome
    a = family.init("a")
    afile = tmp_path / "afile"
    afile.write_text("")
    cases = [(("init", afile / "sub", "--family", "f", "--site", "x"), "Not a directory",
              "a part of that path is a file"),
             (("log", "export", afile), "File exists", "name a path that does not exist yet"),
             (("export", "--all", "--out", tmp_path / ("x" * 300), "--create-out"),
              "File name too long", "use a shorter path")]
    for args, words, hint in cases:
        r = run(*args, site=a)
        refused(r, words)
        assert f"hint: {hint}" in r.err, (args, r)
    message, hint, code = error_outcome(PermissionError(13, "Permission denied", "k/sign.key"))
    assert (message, code) == ("Permission denied: k/sign.key", 1)
    assert hint.startswith("run syncpack as the account that owns the site"), hint


def test_refusals_of_what_cannot_be_done_here_say_what_to_do_instead(family, tmp_path):
    """A missing --pubkey file, a resync to this site itself and a retirement of this site
    itself were one error line with no hint."""
    a = family.init("a")
    cases = [(("mkreplica", "export", "--site", "n", "--pubkey", tmp_path / "none.pub", "--out",
               tmp_path, "--create-out"), "does not exist", "keys/site.pub"),
             (("resync", "--to", "a", "--out", tmp_path), "another member", "--to naming"),
             (("rmreplica", "a"), "cannot retire itself", "rmreplica NAME")]
    for args, words, hint in cases:
        r = run(*args, site=a)
        refused(r, words)
        hints = [x for x in r.err.splitlines() if x.startswith("hint: ")]
        assert len(hints) == 1 and hint in hints[0], (args, r)


@pytest.mark.parametrize("damage", ["garbage", "public", "gone"])
def test_a_damaged_key_file_says_which_and_sends_to_the_backup(family, damage):
    """A site's own key file damaged or gone: one line naming the file, and the hint to
    restore the keys directory.  A damaged signing key printed the cryptography library's
    words (with its web page) and no hint; a lost public key file, no hint."""
    a = family.init("a")
    family.add("b", via="a")
    family.put("a", "parts", "p1", {"qty": 1})
    if damage == "garbage":
        (a / "keys" / keys.SIGN_KEY).write_bytes(os.urandom(10))
        r = run("export", "--to", "b", "--out", family.root / "o", "--create-out", site=a)
        line = refused(r, "signing key", "damaged")
    elif damage == "public":      # a key of the wrong kind where the signing key belongs
        (a / "keys" / keys.SIGN_KEY).write_bytes((a / "keys" / keys.BOX_KEY).read_bytes())
        r = run("export", "--to", "b", "--out", family.root / "o", "--create-out", site=a)
        line = refused(r, "is not an Ed25519 key")
    else:
        (a / "keys" / keys.PUBLIC_FILE).unlink()
        r = run("keyinfo", site=a)
        line = refused(r, "site.pub does not exist")
    assert "http" not in line and "hint: restore the site's keys directory" in r.err, r


def test_a_file_size_limit_is_told_as_such_not_as_a_damaged_store(tmp_path):
    """Under a file-size limit (``ulimit -f``, a quota) a sound store was reported 'not a
    readable syncpack store' with the hint to restore a backup, which would lose what it
    holds; the disk and the limits are what to check."""
    import resource
    site = tmp_path / "A"
    assert syncpack_proc("-q", "init", site, "--family", "fam", "--site", "A").returncode == 0
    for i in range(200):
        assert run("put", "c", f"k{i}", json.dumps("x" * 400), site=site).code == 0

    def limited():
        resource.setrlimit(resource.RLIMIT_FSIZE, (20 * 1024, 20 * 1024))

    r = subprocess.run([sys.executable, "-m", "syncpack", "--site", str(site), "status"],
                       capture_output=True, text=True, timeout=60, preexec_fn=limited,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 1, r
    assert "could not be read or written" in r.stderr and "ulimit -f" in r.stderr, r.stderr
    assert "restore the site directory from a backup" not in r.stderr, r.stderr
    assert syncpack_proc("--site", site, "fsck").returncode == 0


def test_a_store_name_taken_by_a_directory_is_named_as_such(tmp_path):
    """A directory where the store file should be is not "no syncpack.db": the message says
    what is there, and the hint does not send the administrator to create a new site."""
    site = tmp_path / "s"
    (site / "syncpack.db").mkdir(parents=True)
    r = run("status", site=site)
    line = refused(r, "syncpack.db is not a file")
    assert "syncpack init" not in r.err, (line, r)


def test_a_log_uri_this_machine_cannot_open_is_one_short_line_with_a_hint(family):
    """Arrow's error for an hdfs:// URI without Hadoop's client ran to 15 KB on one line,
    with no hint."""
    a = family.init("a")
    r = run("log", "export", "hdfs://nowhere.invalid:9000/x", site=a)
    line = refused(r, "cannot open the log at hdfs://nowhere.invalid:9000/x")
    assert len(line) < 400 and "hint: a URI needs its filesystem's client" in r.err, r
