"""Transcripts of what an administrator meets: values from stdin and as text, values the API
refuses, outboxes that must exist, import summaries that count everything, papercuts."""

from __future__ import annotations

import json
import math
import shlex
import time
from pathlib import Path

import pytest

import syncpack
from conftest import Family, run
from syncpack.errors import InvalidValueError, SiteClosedError, SyncpackError
from syncpack.site import Site


@pytest.fixture
def a(tmp_path) -> Path:
    p = tmp_path / "a"
    assert run("init", p, "--family", "parts", "--site", "a").code == 0
    return p


def state(site: Path) -> tuple:
    d = run("digest", site=site, json_mode=True).json
    return d["digest"], d["vector"]


# --- values -----------------------------------------------------------------------------------

def test_put_dash_reads_a_10_mb_value_from_stdin(a):
    big = {"blob": "x" * (10 * 1024 * 1024), "n": 1}
    r = run("put", "parts", "big", "-", site=a, input=json.dumps(big))
    assert r.code == 0, r
    r = run("get", "parts", "big", site=a, json_mode=True)
    assert r.code == 0 and r.json["value"] == big


def test_put_dash_with_bad_json_on_stdin_is_a_usage_error(a):
    before = state(a)
    r = run("put", "parts", "k", "-", site=a, input="{not json")
    assert r.code == 2 and "not valid JSON" in r.err, r
    assert state(a) == before


def test_get_and_ls_show_utf8_as_text(a):
    v = {"name": "Schraube M6 – Zürich", "jp": "ボルト"}
    assert run("put", "parts", "ü-1", json.dumps(v), site=a).code == 0
    r = run("get", "parts", "ü-1", site=a)
    assert r.code == 0 and "Zürich" in r.out and "ボルト" in r.out and "\\u" not in r.out, r
    r = run("ls", "parts", site=a)
    assert r.code == 0 and "ü-1\t" in r.out and "ボルト" in r.out and "\\u" not in r.out, r


class Thing:
    pass


NOT_JSON = [
    pytest.param("parts", "k", b"raw", id="bytes"),
    pytest.param("parts", "k", {"x": [1, b"raw"]}, id="nested-bytes"),
    pytest.param("parts", "k", math.nan, id="nan"),
    pytest.param("parts", "k", {"x": math.inf}, id="inf"),
    pytest.param("parts", "k", [-math.inf], id="minus-inf"),
    pytest.param("parts", "k", {1: "one"}, id="int-key"),
    pytest.param("parts", "k", {"a": {(1, 2): "t"}}, id="tuple-key"),
    pytest.param("parts", "k", Thing(), id="object"),
    pytest.param("parts", "k", {1, 2}, id="set"),
    pytest.param("parts", "k", "\ud800", id="lone-surrogate"),
    pytest.param("parts", "k", 2 ** 70, id="huge-int"),
    pytest.param("parts", 7, "v", id="int-key-name"),
    pytest.param(b"parts", "k", "v", id="bytes-collection"),
    pytest.param(None, "k", "v", id="none-collection"),
]


@pytest.mark.parametrize("coll,key,value", NOT_JSON)
def test_api_refuses_values_that_are_not_json_and_changes_nothing(a, coll, key, value):
    assert run("put", "parts", "before", '{"ok": true}', site=a).code == 0
    before = state(a)
    site = syncpack.open_site(a)
    try:
        with pytest.raises(SyncpackError) as e:
            with site.transaction() as tx:
                tx.put("parts", "fine", {"would": "be rolled back too"})
                tx.put(coll, key, value)
        assert e.value.exit_code == 2 and e.value.message and e.value.hint   # a usage error
    finally:
        site.close()
    assert state(a) == before
    r = run("ls", site=a)
    assert r.code == 0 and "before" in r.out and "fine" not in r.out, r
    assert run("fsck", site=a).code == 0


def test_a_self_containing_value_is_refused(a):
    loop: list = []
    loop.append(loop)
    with syncpack.open_site(a) as site:
        with pytest.raises(InvalidValueError):
            with site.transaction() as tx:
                tx.put("parts", "loop", loop)


def test_json_values_of_every_kind_are_accepted(a):
    v = {"s": "ü", "i": -3, "f": 1.5, "b": True, "n": None, "l": [1, [2, {"x": []}]],
         "t": (1, 2)}
    with syncpack.open_site(a) as site:
        with site.transaction() as tx:
            tx.put("parts", "all", v)
        assert site.get("parts", "all") == {**v, "t": [1, 2]}


def test_cli_refuses_nan_from_put_and_load(a, tmp_path):
    before = state(a)
    r = run("put", "parts", "k", "NaN", site=a)
    assert r.code == 2 and "error: " in r.err and "hint: " in r.err, r   # as invalid JSON
    for name in (("", "k"), ("parts", "")):     # one rule for empty names, of either kind
        r = run("put", *name, "1", site=a)
        assert r.code == 2 and "non-empty" in r.err and "hint: " in r.err, r
    f = tmp_path / "nan.jsonl"
    f.write_text('{"collection": "parts", "key": "ok", "value": 1}\n'
                 '{"collection": "parts", "key": "bad", "value": Infinity}\n')
    r = run("load", f, site=a)
    assert r.code == 1 and "line 2" in r.err, r
    assert state(a) == before


def test_a_closed_site_says_so(a):
    site = syncpack.open_site(a)
    site.close()
    site.close()                    # closing twice is harmless
    for use in (lambda: site.get("parts", "x"), lambda: site.vector(),
                lambda: list(site.records()), lambda: site.transaction().__enter__()):
        with pytest.raises(SiteClosedError) as e:
            use()
        assert "closed" in e.value.message and e.value.hint and e.value.exit_code == 1
    with Site.open(a) as again:     # the directory itself is fine
        assert again.name == "a"


# --- the outbox must exist --------------------------------------------------------------------

@pytest.fixture
def ab(family):
    family.init("a")
    family.add("b", via="a")
    family.put("a", "parts", "p1", {"qty": 1})
    return family


def sent_to(site: Path, peer: str) -> dict:
    return run("lsepoch", site=site, json_mode=True).json["peers"][peer]["sent"]


def test_export_to_a_missing_outbox_fails_and_records_nothing(ab, tmp_path):
    a = ab.path("a")
    before = sent_to(a, "b")
    packets_sent = run("status", site=a, json_mode=True).json["peers"]["b"]["packets_sent"]
    typo = tmp_path / "mdia" / "usb"
    r = run("export", "--to", "b", "--out", typo, site=a)
    assert r.code == 1, r
    assert r.err.splitlines() == [f"error: outbox {typo} does not exist",
                                  "hint: mount the medium or correct the path, or pass "
                                  "--create-out to create it"]
    assert not typo.exists() and not typo.parent.exists()
    assert sent_to(a, "b") == before
    assert run("status", site=a,
               json_mode=True).json["peers"]["b"]["packets_sent"] == packets_sent
    # Asked for, the directory is made and the export goes through.
    r = run("export", "--to", "b", "--out", typo, "--create-out", site=a, json_mode=True)
    assert r.code == 0 and r.json["packets"], r
    assert ab.import_("b", [typo]).ops_applied > 0


def test_an_outbox_that_is_a_file_is_refused(ab, tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    for create in ([], ["--create-out"]):
        r = run("export", "--all", "--out", f, *create, site=ab.path("a"))
        assert r.code == 1 and "is a file; a directory is needed" in r.err, r
        assert "hint: " in r.err and "Usage:" not in r.err, r
    assert f.read_text() == "x"
    # The library check (batch and API callers) says the same in its own words.
    from syncpack.errors import OutboxError
    from syncpack.exchange.packets import prepare_outbox
    with pytest.raises(OutboxError, match="is not a directory"):
        prepare_outbox(f, True, "create it")


def test_mkreplica_export_and_resync_check_the_outbox_before_changing_anything(ab, tmp_path):
    a = ab.path("a")
    pub = run("keygen", tmp_path / "n", "--site", "n", json_mode=True).json["public_key"]
    missing = tmp_path / "nope"
    r = run("mkreplica", "export", "--site", "n", "--pubkey", pub, "--out", missing, site=a)
    assert r.code == 1 and "error: outbox" in r.err and "--create-out" in r.err, r
    assert "n" not in run("lsepoch", site=a, json_mode=True).json["peers"]   # not added
    r = run("resync", "--to", "b", "--out", missing, site=a)
    assert r.code == 1 and "error: outbox" in r.err and "hint: " in r.err, r
    assert not missing.exists()
    r = run("mkreplica", "export", "--site", "n", "--pubkey", pub, "--out", missing,
            "--create-out", site=a)
    assert r.code == 0, r
    assert run("mkreplica", "import", missing, site=tmp_path / "n").code == 0


# --- the import summary counts everything -----------------------------------------------------

def test_import_summary_counts_skipped_files_of_every_kind(family, tmp_path):
    family.init("a")
    family.add("b", via="a")
    family.add("c", via="a")
    family.put("a", "parts", "p1", {"qty": 1})
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    for p in family.export("a", "c"):             # for another site of the family
        (inbox / "c.spk").write_bytes(p.read_bytes())
    other = Family(tmp_path / "other")
    other.init("z")
    other.add("y", via="z")
    other.put("z", "parts", "p1", {"qty": 1})
    for p in other.export("z", "y"):              # from another family
        (inbox / "z.spk").write_bytes(p.read_bytes())
    (inbox / "notes.txt").write_text("not a packet")
    before = state(family.path("b"))

    r = run("import", inbox, site=family.path("b"))
    assert r.code == 0, r
    assert r.out.splitlines() == ["import: 3 file(s) skipped (1 for other sites, 1 of another "
                                  "family, 1 not packets)"]
    assert "applied" not in r.err
    assert state(family.path("b")) == before
    doc = run("import", inbox, site=family.path("b"), json_mode=True).json
    assert sorted(doc["skipped"]) == [str(inbox / "c.spk"), str(inbox / "z.spk")]
    assert doc["ignored"] == [str(inbox / "notes.txt")]
    assert doc["applied"] == [] and doc["ops_applied"] == 0

    for p in family.export("a", "b"):
        (inbox / "b.spk").write_bytes(p.read_bytes())
    r = run("import", inbox, site=family.path("b"))
    assert r.code == 0, r
    # Two ops: p1 and c's roster entry, which b had not heard of.
    assert r.out.splitlines() == ["import: 1 packet(s) applied (2 op(s)); 3 file(s) skipped "
                                  "(1 for other sites, 1 of another family, 1 not packets)"]
    r = run("import", inbox / "b.spk", site=family.path("b"))
    assert r.out.splitlines() == ["import: 1 duplicate(s) (applied before)"], r
    assert run("import", tmp_path / "empty_ok", site=family.path("b")).code == 1


def test_a_rejected_import_says_so_without_an_applied_line_first(ab, tmp_path):
    p = ab.export("a", "b")[0]
    bad = tmp_path / "bad.spk"
    data = bytearray(p.read_bytes())
    data[-10] ^= 0xFF
    bad.write_bytes(bytes(data))
    before = state(ab.path("b"))
    r = run("import", bad, site=ab.path("b"))
    assert r.code == 1, r
    # the error is a diagnostic (stderr), the summary the result (stdout)
    assert r.err.startswith(f"error: {bad}: ") and r.out == "import: 1 rejected\n", r
    assert "applied" not in r.err + r.out
    assert state(ab.path("b")) == before


# --- papercuts --------------------------------------------------------------------------------

def test_max_size_too_small_is_a_usage_error_and_64k_carries_any_record(ab, tmp_path):
    import random
    text = random.Random(1).randbytes(100_000).hex()    # one record of ~100 KB compressed
    ab.put("a", "parts", "big", {"blob": text})
    usb = tmp_path / "usb"
    usb.mkdir()
    r = run("export", "--to", "b", "--out", usb, "--max-size", "32K", site=ab.path("a"))
    assert r.code == 2 and "at least 64K" in r.err, r
    assert not list(usb.rglob("*.spk"))
    r = run("export", "--to", "b", "--out", usb, "--max-size", "64K", site=ab.path("a"),
            json_mode=True)
    assert r.code == 0 and len(r.json["packets"]) >= 2, r
    assert all(p.stat().st_size <= 64 * 1024 for p in usb.rglob("*.spk"))
    assert run("import", usb, site=ab.path("b")).code == 0
    assert run("digest", site=ab.path("a")).out == run("digest", site=ab.path("b")).out


def test_mkreplica_export_prints_the_real_next_command(ab, tmp_path):
    newdir = tmp_path / "new site"
    pub = run("keygen", newdir, "--site", "n", json_mode=True).json["public_key"]
    usb = tmp_path / "usb"
    usb.mkdir()
    r = run("mkreplica", "export", "--site", "n", "--pubkey", pub, "--out", usb,
            site=ab.path("a"))
    assert r.code == 0, r
    packet_dir = usb / "n" / "a"
    cmd = f"syncpack --site '{newdir}' mkreplica import {packet_dir}"
    assert cmd in r.out, r
    # The command works as printed.
    args = shlex.split(cmd)[1:]
    assert run(*args).code == 0
    assert run("digest", site=newdir).out == run("digest", site=ab.path("a")).out


def test_a_new_site_whose_keys_were_made_again_is_told_why_its_packet_does_not_fit(ab,
                                                                                    tmp_path):
    """keygen run again between 'mkreplica export' and 'mkreplica import': the import said no
    replica-creation packet was found (it is there, made for the first keys) and to pass the
    directory it was given, which it was; every next step led back to the same words."""
    import shutil
    newdir = tmp_path / "n"
    pub = run("keygen", newdir, "--site", "n", json_mode=True).json["public_key"]
    usb = tmp_path / "usb"
    assert run("mkreplica", "export", "--site", "n", "--pubkey", pub, "--out", usb,
               "--create-out", site=ab.path("a")).code == 0
    shutil.rmtree(newdir)
    assert run("keygen", newdir, "--site", "n").code == 0
    r = run("mkreplica", "import", usb / "n" / "a", site=newdir)
    assert r.code == 1 and "made for a site named n with other keys" in r.err, r
    assert "put back the keys directory" in r.err and "rmreplica n" in r.err, r


def test_the_python_api_is_documented_and_typed():
    root = Path(syncpack.__file__).parent
    assert (root / "py.typed").is_file()
    assert 'syncpack = ["py.typed"]' in (root.parent / "pyproject.toml").read_text()
    assert syncpack.__doc__
    missing = [n for n in syncpack.__all__ if not getattr(syncpack, n).__doc__]
    for cls in (syncpack.Site, syncpack.Transaction):
        for name, v in vars(cls).items():
            f = v.fget if isinstance(v, property) else getattr(v, "__func__", v)
            if not name.startswith("_") and callable(f) and not f.__doc__:
                missing.append(f"{cls.__name__}.{name}")
    assert missing == []


def _put_while_held(a, monkeypatch, holder_code: str):
    """A put while another process runs ``holder_code`` (given the site directory) until it
    has printed 'locked'; its result, and a put after the holder ended."""
    import subprocess
    import sys
    from syncpack.store import db
    monkeypatch.setattr(db, "BUSY_TIMEOUT_MS", 200)
    # another process: SQLite's locks do not keep connections of one process apart
    holder = subprocess.Popen([sys.executable, "-c", holder_code, str(a)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "locked\n"
        r = run("put", "parts", "k", "1", site=a)
    finally:
        holder.communicate("")
    return r, run("put", "parts", "k", "1", site=a)


def test_a_store_another_program_holds_locked_is_told_as_that_not_as_damage(a, monkeypatch):
    """An sqlite3 shell left inside a write transaction on the store is not damage: the
    message says who holds it and the hint is to close it, not to restore a backup."""
    r, after = _put_while_held(a, monkeypatch, (
        "import sqlite3, sys; c = sqlite3.connect(sys.argv[1] + '/syncpack.db', "
        "isolation_level=None); c.execute('BEGIN IMMEDIATE'); print('locked', flush=True); "
        "sys.stdin.read()"))
    assert r.code == 1, r
    assert r.err.startswith("error: the site store is locked by another program"), r
    assert "close it" in r.err and "restore" not in r.err
    assert after.code == 0


def test_a_store_held_by_a_long_syncpack_command_is_told_as_that(a, monkeypatch):
    """A put while an import at the site writes a large packet: past its wait, the error
    blamed 'a program other than syncpack' and said to close it.  It names the syncpack
    command holding the store now (the site lock tells), and to run the put again later."""
    # an importer's hold: the site lock, and a write transaction on the store
    r, after = _put_while_held(a, monkeypatch, (
        "import fcntl, sqlite3, sys; f = open(sys.argv[1] + '/lock', 'a'); "
        "fcntl.flock(f, fcntl.LOCK_EX); c = sqlite3.connect(sys.argv[1] + '/syncpack.db', "
        "isolation_level=None); c.execute('BEGIN IMMEDIATE'); print('locked', flush=True); "
        "sys.stdin.read()"))
    assert r.code == 1, r
    assert r.err.startswith("error: another syncpack command at this site"), r
    assert "run it again when that command ends" in r.err and "close it" not in r.err
    assert after.code == 0


def test_a_store_this_user_may_not_write_is_told_as_that_not_as_damage():
    """(Run as root, the suite cannot make a directory it may not write: the error the
    driver raises for one is told directly.)"""
    import apsw
    from syncpack.outcome import error_outcome
    msg, hint, code = error_outcome(apsw.ReadOnlyError("attempt to write a readonly database"))
    assert code == 1 and msg.startswith("the site store cannot be written by this user")
    assert "owns the site directory" in hint and "restore" not in hint
    assert "-shm" in hint      # SQLite made them with a read-only store's mode: still 0444
    msg, hint, code = error_outcome(apsw.CorruptError("database disk image is malformed"))
    assert msg.startswith("the site store cannot be used") and "backup" in hint


def test_a_packet_file_or_directory_the_import_cannot_read_is_told_not_passed_over(
        ab, tmp_path, monkeypatch):
    """(Run as root, the suite cannot make a file it may not read: the refusal the system
    would give is given for those paths.)  An unreadable packet in an inbox, or an inbox
    directory that cannot be listed, is a rejected path with exit 1, never silence."""
    import builtins
    import os
    a, b = ab.path("a"), ab.path("b")
    run("put", "parts", "k", "1", site=a)
    inbox = tmp_path / "inbox"
    assert run("export", "--to", "b", "--create-out", "--out", inbox, site=a).code == 0
    [pk] = [p for p in inbox.rglob("*.spk")]
    hidden = {str(pk)}
    real_os_open, real_open, real_scandir = os.open, builtins.open, os.scandir

    def refuse(path):
        if str(path) in hidden:
            raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(os, "open", lambda p, *a, **k: refuse(p) or real_os_open(p, *a, **k))
    monkeypatch.setattr(builtins, "open", lambda p, *a, **k: refuse(p) or real_open(p, *a, **k))
    r = run("import", inbox, site=b, json_mode=True)
    assert r.code == 1 and r.json["ignored"] == [], r
    assert "Permission denied" in r.json["rejected"][0]["error"]
    hidden = {str(pk.parent)}
    monkeypatch.setattr(os, "scandir", lambda p=".": refuse(p) or real_scandir(p))
    r = run("import", inbox, site=b, json_mode=True)
    assert r.code == 1 and r.json["rejected"][0]["path"] == str(pk.parent), r
    monkeypatch.undo()
    assert run("import", inbox, site=b).code == 0
    assert run("get", "parts", "k", site=b).out.strip() == "1"


def test_chepoch_refuses_more_than_this_site_holds(ab):
    """A mistyped epoch (more than this site holds of the origin) would make every later
    export believe the peer has it all, and stop sending for good: refused, nothing changed."""
    a = ab.path("a")
    before = run("lsepoch", site=a, json_mode=True).json
    held = before["vector"]["a"]
    r = run("chepoch", "b", f"a={held + 999999}", site=a)
    assert r.code == 1 and "more than this site holds" in r.err and f"a={held}" in r.err, r
    assert run("lsepoch", site=a, json_mode=True).json == before
    # an ORIGIN=EPOCH without its origin is malformed, as one without '=' (a usage error)
    r = run("chepoch", "b", "=1", site=a)
    assert r.code == 2 and "expected ORIGIN=EPOCH" in r.err, r
    assert run("chepoch", "b", f"a={held}", site=a).code == 0


def test_a_retired_name_is_told_as_never_reused(ab, tmp_path):
    """mkreplica of a retired member's name says the name is never used again and what to
    do instead, not to resync a member that is gone."""
    a = ab.path("a")
    assert run("rmreplica", "b", site=a).code == 0
    pub = tmp_path / "b2"
    assert run("keygen", pub, "--site", "b").code == 0
    r = run("mkreplica", "export", "--site", "b", "--pubkey", pub / "keys" / "site.pub",
            "--out", tmp_path / "usb", "--create-out", site=a)
    assert r.code != 0 and "retired" in r.err and "another name" in r.err, r
    assert "resync" not in r.err


def test_a_name_that_differs_from_a_members_only_in_case_is_refused(ab, tmp_path):
    """'boston' and 'Boston' both joined a family; on a stick formatted FAT32 or exFAT their
    packet directories are one, so packets for one overwrote packets for the other."""
    a = ab.path("a")
    pub = tmp_path / "B"
    assert run("keygen", pub, "--site", "B").code == 0
    before = run("--json", "lsepoch", site=a).json
    r = run("mkreplica", "export", "--site", "B", "--pubkey", pub / "keys" / "site.pub",
            "--out", tmp_path / "usb", "--create-out", site=a)
    assert r.code == 1 and "differs from member 'b' only in case" in r.err, r
    assert "hint: give the new site another name" in r.err, r
    assert run("--json", "lsepoch", site=a).json == before
    assert not (tmp_path / "usb").exists() or not any((tmp_path / "usb").rglob("*.spk"))


def test_a_parked_packet_whose_kept_copy_is_gone_is_forgotten_with_a_warning(family):
    """A site restored from a backup taken without SITE/parked/ (as the documented backup
    once said): the next import failed, naming the packet's path on the medium, with the
    hint for a damaged file.  The parked entry is forgotten with a warning instead, and the
    packet's ops come again in the next round."""
    family.init("a")
    family.add("b", via="a")
    b = family.path("b")
    family.put("a", "t", "k1", 1)
    first = family.export("a", "b")
    family.put("a", "t", "k2", 2)
    second = family.export("a", "b")
    r = run("--json", "import", *second, site=b)
    assert r.code == 0 and r.json["parked"], r
    for f in (b / "parked").iterdir():
        f.unlink()
    r = run("import", *first, site=b)
    assert r.code == 0, r
    assert "warning: the kept copy of a packet parked here" in r.err and "forgotten" in r.err
    assert run("--json", "status", site=b).json["parked"] == []
    family.full_exchange(2)     # b's packets tell a what it holds; a sends the rest again
    assert family.digest("a") == family.digest("b")
    assert run("fsck", site=b).code == 0


def test_a_packet_ahead_of_the_one_adding_a_member_is_parked_not_refused(family):
    """Packet 3 of a carries the first changes of h, whom packet 2 (not here yet) adds: it
    was refused, saying h (by a raw id) 'was never a member' and a 'not a current member',
    both false.  It is parked, and applies once packet 2 arrives."""
    family.init("a")
    family.add("b", via="a")
    family.add("h", via="a")
    second = family.export("a", "b")            # a's roster write: h joined
    family.put("h", "t", "from-h", 1)
    family.sync("h", "a")
    third = family.export("a", "b")             # relays h's write
    r = run("--json", "import", *third, site=family.path("b"))
    assert r.code == 0 and r.json["rejected"] == [] and len(r.json["parked"]) == 1, r
    r = run("--json", "import", *second, site=family.path("b"))
    assert r.code == 0 and len(r.json["applied"]) == 2, r
    assert json.loads(run("get", "t", "from-h", site=family.path("b")).out) == 1
    assert run("fsck", site=family.path("b")).code == 0


def test_lspacket_calls_a_packet_whose_body_was_changed_invalid(family):
    """The signature covers the body through its hash: lspacket said 'valid' of a packet
    whose body had one bit flipped, which import then refused."""
    family.init("a")
    family.add("b", via="a")
    family.put("a", "t", "k", "a value long enough to fill a body")
    (path,) = family.export("a", "b")
    ls = run("--json", "lspacket", path, site=family.path("b"))
    assert ls.json["packets"][0]["signature"] == "valid", ls
    data = bytearray(path.read_bytes())
    data[40] ^= 1       # in the body (from offset 9; the header and signature follow it)
    path.write_bytes(bytes(data))
    ls = run("--json", "lspacket", path, site=family.path("b"))
    assert ls.json["packets"][0]["signature"] == "invalid", ls
    r = run("import", path, site=family.path("b"))
    assert r.code == 1 and "does not match the hash" in r.err, r


def test_an_import_directory_s_links_are_followed_and_a_dead_packet_link_is_told(family,
                                                                                 tmp_path):
    """In a directory, a '*.spk' link whose file is gone passed unseen (exit 0, no word), and
    a linked subdirectory holding a packet was not searched ('no packets found').  The link
    is searched, each directory once (a link back up does not loop), and the dead packet
    link is refused as an unreadable packet."""
    family.init("a")
    family.add("b", via="a")
    family.put("a", "t", "k", 1)
    (packet,) = family.export("a", "b")
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    (inbox / "medium").symlink_to(packet.parent, target_is_directory=True)
    (inbox / "up").symlink_to(inbox, target_is_directory=True)
    r = run("--json", "import", inbox, site=family.path("b"))
    assert r.code == 0 and len(r.json["applied"]) == 1, r
    (inbox / "0000000009-0000.spk").symlink_to(tmp_path / "gone.spk")
    r = run("--json", "import", inbox, site=family.path("b"))
    assert r.code == 1 and [x["path"] for x in r.json["rejected"]] == [
        str(inbox / "0000000009-0000.spk")], r


def test_a_packet_written_while_the_clock_ran_fast_is_not_the_last_one_for_a_month(family):
    """One export made while this site's clock was 30 days ahead (fixed since): the peer's
    last-sent time stayed a month ahead, newer than every later export, so a silent peer
    looked heard from and an alert on it could not fire."""
    from syncpack.exchange import sync
    a = family.init("a")
    family.add("b", via="a")
    ahead = int(time.time() * 1000) + 30 * 24 * 3600 * 1000
    family.put("a", "t", "fast", 1)
    with family.open("a") as s:
        sync.export(s, family.medium(), to=["b"], now_ms=ahead)
    family.put("a", "t", "fixed", 2)
    before = int(time.time() * 1000)
    family.export("a", "b")
    after = int(time.time() * 1000)
    doc = run("status", site=a, json_mode=True).json
    assert before <= doc["peers"]["b"]["last_sent_ms"] <= after, doc["peers"]["b"]


def test_a_site_whose_clock_ran_fast_is_told_until_when_its_packets_are_refused(family):
    """One write while the clock ran 30 days fast, the clock fixed since: every peer refuses
    the site's packets until the clock catches up, and the site said 'normal' with nothing
    about it.  Now status (text, JSON, metric) says so and until when, and the peer's refusal
    no longer only tells to fix the clock, already fixed."""
    a = family.init("a")
    b = family.add("b", via="a")
    day = 24 * 3600 * 1000
    ahead = int(time.time() * 1000) + 30 * day
    with Site.open(a, clock=lambda: ahead) as s, s.transaction() as tx:
        tx.put("t", "fast", 1)
    family.put("a", "t", "after", 2)
    doc = run("status", site=a, json_mode=True).json
    assert 29 * day < doc["stamps_ahead_ms"] <= 30 * day, doc
    assert abs(doc["refused_until_ms"] - (ahead - day)) < 60_000, doc
    text = run("status", site=a).out
    assert "clock: this site's changes are stamped up to 7" in text, text
    prom = run("status", "--format", "prometheus", site=a).out
    value = next(ln for ln in prom.splitlines()
                 if ln.startswith("syncpack_clock_stamps_ahead_seconds{"))
    assert float(value.split()[-1]) > 29 * 86400, value
    [p] = family.export("a", "b")
    r = run("import", p, site=b)
    assert r.code == 1 and "stamped" in r.err and "'syncpack status' at a says when" in r.err, r
    calm = run("status", site=b, json_mode=True).json
    assert calm["stamps_ahead_ms"] < day and calm["refused_until_ms"] is None, calm


def test_a_spoke_shows_another_spoke_it_never_exchanges_with_as_caught_up(family):
    """Spokes of a hub exchange no media with each other: north showed east lagging for ever
    ('not known to hold'), while scrub at north trimmed by east's own signed acknowledgement,
    relayed by the hub.  The lag now counts that acknowledgement too."""
    family.init("hub")
    north = family.add("north", via="hub")
    family.add("east", via="hub")
    for i in range(3):
        family.put("north", "t", f"n{i}", i)
        family.put("east", "t", f"e{i}", i)
    for r in range(4):
        family.put("hub", "t", f"h{r}", r)     # the hub's packets carry the relayed acks
        for spoke in ("north", "east"):
            family.sync(spoke, "hub")
            family.sync("hub", spoke)
    assert family.digest("north") == family.digest("east")
    family.sync("east", "hub")                  # east's word: it holds everything so far
    family.put("hub", "t", "last", 1)           # ... but this, which carries that word on
    family.sync("hub", "north")
    peers = run("status", site=north, json_mode=True).json["peers"]
    assert peers["east"]["lag_ops"] == 1, peers
    assert peers["east"]["last_received_ms"] is None      # true: never directly


def test_a_medium_removed_during_an_export_writes_nothing_and_records_nothing(tmp_path,
                                                                            monkeypatch):
    """The outbox deleted (the medium pulled) after the first peer's packet was written: the
    next peer's directory was made again, with the outbox, and the export said every packet
    was written, the first gone with the medium, and recorded as sent."""
    import shutil
    from syncpack.errors import OutboxError
    from syncpack.exchange import sync
    fam = Family(tmp_path)
    fam.init("a")
    fam.add("b", via="a")
    fam.add("c", via="a")
    fam.put("a", "t", "k", 1)
    out = tmp_path / "usb"
    out.mkdir()
    build = sync.build_update_packets

    def then_pulled(*args, **kwargs):
        parts = build(*args, **kwargs)
        shutil.rmtree(out, ignore_errors=True)
        return parts

    monkeypatch.setattr(sync, "build_update_packets", then_pulled)
    with fam.open("a") as s, pytest.raises(OutboxError, match="is gone"):
        sync.export(s, out, to=["b", "c"])
    assert not out.exists()
    monkeypatch.undo()
    for peer in ("b", "c"):                  # nothing was recorded as sent
        fam.sync("a", peer)
        with fam.open(peer) as s:
            assert s.get("t", "k") == 1
