"""Transcripts of the data commands: init, keygen, put, get, delete, ls, load, digest, fsck."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import run
from syncpack.site import Site, wall_ms


@pytest.fixture
def a(tmp_path) -> Path:
    p = tmp_path / "a"
    r = run("init", p, "--family", "parts", "--site", "a")
    assert r.code == 0, r
    return p


def changelog_count(path: Path) -> int:
    with Site.open(path) as s:
        return s.conn.execute("SELECT count(*) FROM changelog").fetchone()[0]


# --- init and keygen ----------------------------------------------------------------------------

def test_init_json(tmp_path):
    r = run("init", tmp_path / "boston", "--family", "parts", "--site", "boston",
            "--policy", "priority", json_mode=True)
    assert r.code == 0, r
    doc = r.json
    assert {"site", "family", "family_id"} <= set(doc)
    assert doc["site"] == "boston" and doc["family"] == "parts"
    assert re.fullmatch(r"[0-9a-f]{32}", doc["family_id"])
    with Site.open(tmp_path / "boston") as s:
        assert s.family_id.hex() == doc["family_id"]
        assert s.family_policy() == "priority"
        assert s.name == "boston" and s.family_name == "parts"


def test_init_human_and_second_family_differs(tmp_path):
    r = run("init", tmp_path / "x", "--family", "f", "--site", "x")
    assert r.code == 0 and "x" in r.out
    j1 = run("init", tmp_path / "y", "--family", "f", "--site", "y", json_mode=True).json
    j2 = run("init", tmp_path / "z", "--family", "f", "--site", "z", json_mode=True).json
    assert j1["family_id"] != j2["family_id"]


def test_init_refuses_a_used_directory(a):
    r = run("init", a, "--family", "f", "--site", "other")
    assert r.code == 1 and r.err.startswith("error: ") and "hint: " in r.err, r
    with Site.open(a) as s:                        # the existing site is unharmed
        assert s.name == "a"


@pytest.mark.parametrize("args", [
    ["init", "{d}"],                                          # no --family / --site
    ["init", "{d}", "--family", "f"],
    ["init", "{d}", "--family", "f", "--site", "s", "--policy", "fifo"],
    ["keygen", "{d}"],
])
def test_init_and_keygen_usage_errors(tmp_path, args):
    d = tmp_path / "new"
    r = run(*[x.format(d=d) for x in args])
    assert r.code == 2, r
    assert not d.exists()


@pytest.mark.parametrize("name", ["a/b", "$sys", " padded", ""])
def test_init_refuses_bad_site_names(tmp_path, name):
    # a malformed value: a usage error (exit 2), as an empty collection name is
    r = run("init", tmp_path / "n", "--family", "f", "--site", name)
    assert r.code == 2 and "invalid site name" in r.err, r


def test_keygen_json(tmp_path):
    r = run("keygen", tmp_path / "sf", "--site", "sanfran", json_mode=True)
    assert r.code == 0, r
    assert {"site", "public_key"} <= set(r.json)
    assert r.json["site"] == "sanfran"
    pub = Path(r.json["public_key"])
    assert pub.is_file()
    d = json.loads(pub.read_text())
    assert d["site"] == "sanfran" and len(bytes.fromhex(d["ed25519"])) == 32
    # human mode prints the same path and nothing else on stdout
    h = run("keygen", tmp_path / "la", "--site", "la")
    assert h.code == 0 and h.out.strip() == str(tmp_path / "la" / "keys" / "site.pub")


# --- put, get, delete, ls -----------------------------------------------------------------------

def test_put_get_transcript(a):
    assert run("put", "parts", "p-100", '{"name": "bolt", "qty": 40}', site=a).code == 0
    r = run("get", "parts", "p-100", site=a)
    assert (r.code, r.out, r.err) == (0, '{"name": "bolt", "qty": 40}\n', "")
    assert run("put", "parts", "p-100", '"replaced"', site=a).code == 0
    assert run("get", "parts", "p-100", site=a).out == '"replaced"\n'
    for text in ["null", "[1, 2.5, true]", "0", '"\\u00e9t\\u00e9"']:
        assert run("put", "t", text, text, site=a).code == 0
        assert json.loads(run("get", "t", text, site=a).out) == json.loads(text)


def test_get_json(a):
    run("put", "c", "k", "[1, 2]", site=a)
    r = run("get", "c", "k", site=a, json_mode=True)
    assert r.code == 0 and r.json["value"] == [1, 2]


def test_get_of_an_absent_key_exits_1(a):
    r = run("get", "parts", "nope", site=a)
    assert r.code == 1 and r.out == ""
    assert r.err.splitlines()[0] == "error: no record parts/nope"
    assert "hint: " in r.err
    assert run("get", "parts", "nope", site=a, json_mode=True).code == 1


def test_put_with_invalid_json_is_a_usage_error(a):
    n = changelog_count(a)
    for bad in ["{bad", "bolt", "", "[1,"]:
        r = run("put", "parts", "p1", bad, site=a)
        assert r.code == 2, r
        assert "not valid JSON" in r.err
    assert run("put", "parts", site=a).code == 2                  # missing argument
    assert changelog_count(a) == n


def test_json_nested_deeper_than_a_value_may_be_is_refused_not_an_internal_error(a, tmp_path):
    """Past Python's own recursion limit the parser fails before the value's depth is
    checked: still the same refusal, for put, conflicts resolve and load alike."""
    n = changelog_count(a)
    for depth in (600, 5000):
        for deep in ("[" * depth + "]" * depth, '{"a":' * depth + "1" + "}" * depth):
            r = run("put", "parts", "p1", deep, site=a)
            assert r.code == 2 and "levels deep" in r.err, r
            assert max(map(len, r.err.splitlines())) < 200
            # (no conflict to resolve: refused as that, or for its value first)
            r = run("conflicts", "resolve", "parts", "p1", "--value", deep, site=a)
            assert r.code in (1, 2) and "internal error" not in r.err, r
            assert "levels deep" in r.err or "not in conflict" in r.err
            f = tmp_path / "deep.jsonl"
            f.write_text('{"collection": "parts", "key": "k", "value": ' + deep + "}\n")
            r = run("load", f, site=a)
            assert r.code == 1 and "line 1" in r.err and "levels deep" in r.err, r
    assert changelog_count(a) == n


@pytest.mark.parametrize("cmd", [["put", "$roster", "x", "1"], ["delete", "$family", "settings"],
                                 ["put", "$mine", "k", '"v"']])
def test_reserved_collection_names_are_refused(a, cmd):
    n = changelog_count(a)
    r = run(*cmd, site=a)
    assert r.code == 2, r       # a name that cannot be used: a usage error, as a bad value
    assert r.err.startswith("error: collection names starting with '$' are reserved")
    assert "hint: " in r.err
    assert changelog_count(a) == n
    with Site.open(a) as s:
        assert "a" in s.roster()                                     # roster intact


def test_delete_transcript(a):
    run("put", "parts", "p1", "1", site=a)
    run("put", "parts", "p2", "2", site=a)
    r = run("delete", "parts", "p1", site=a)
    assert r.code == 0, r
    assert run("get", "parts", "p1", site=a).code == 1
    assert run("ls", site=a, json_mode=True).json == {
        "records": [{"collection": "parts", "key": "p2", "value": 2}]}


def test_delete_of_an_absent_record_succeeds_and_is_recorded(a):
    n = changelog_count(a)
    d0 = run("digest", site=a, json_mode=True).json
    r = run("delete", "parts", "never", site=a)
    assert r.code == 0, r
    assert changelog_count(a) == n + 1
    with Site.open(a) as s:
        row = s.conn.execute("SELECT collection, key, value FROM changelog WHERE origin=? "
                             "ORDER BY epoch DESC LIMIT 1", (s.site_id,)).fetchone()
    assert row == ("parts", "never", None)                       # a tombstone
    d1 = run("digest", site=a, json_mode=True).json
    assert d1["vector"]["a"] == d0["vector"]["a"] + 1
    assert d1["records"] == d0["records"] == 0


def test_ls_transcript(a):
    assert run("ls", site=a).out == ""
    assert run("ls", site=a, json_mode=True).json == {"records": []}   # no system records
    run("put", "tools", "t1", '{"kind": "wrench"}', site=a)
    run("put", "parts", "p2", "2", site=a)
    run("put", "parts", "p1", '"one"', site=a)
    r = run("ls", site=a, json_mode=True)
    assert r.code == 0
    assert r.json == {"records": [
        {"collection": "parts", "key": "p1", "value": "one"},
        {"collection": "parts", "key": "p2", "value": 2},
        {"collection": "tools", "key": "t1", "value": {"kind": "wrench"}}]}
    assert run("ls", "parts", site=a).out == 'parts\tp1\t"one"\nparts\tp2\t2\n'
    assert run("ls", "tools", site=a, json_mode=True).json["records"] == [
        {"collection": "tools", "key": "t1", "value": {"kind": "wrench"}}]
    assert run("ls", "empty", site=a, json_mode=True).json == {"records": []}


# --- choosing the site --------------------------------------------------------------------------

def test_site_option_env_and_current_directory(a, tmp_path, monkeypatch):
    b = tmp_path / "b"
    run("init", b, "--family", "other", "--site", "b")
    run("put", "c", "where", '"a"', site=a)
    run("put", "c", "where", '"b"', site=b)
    assert run("get", "c", "where", site=a).out == '"a"\n'
    assert run("get", "c", "where", env={"SYNCPACK_SITE": str(b)}).out == '"b"\n'
    # --site wins over the environment
    assert run("get", "c", "where", site=a, env={"SYNCPACK_SITE": str(b)}).out == '"a"\n'
    r = run("put", "c", "env", "1", env={"SYNCPACK_SITE": str(b)})
    assert r.code == 0
    assert run("get", "c", "env", site=b).code == 0 and run("get", "c", "env", site=a).code == 1
    monkeypatch.delenv("SYNCPACK_SITE", raising=False)
    monkeypatch.chdir(a)
    assert run("get", "c", "where").out == '"a"\n'
    monkeypatch.chdir(tmp_path)
    r = run("get", "c", "where")
    assert r.code == 1 and "not a syncpack site" in r.err and "hint: " in r.err


# --- load ---------------------------------------------------------------------------------------

def test_load_transcript(a, tmp_path):
    run("put", "parts", "old", "0", site=a)
    f = tmp_path / "data.jsonl"
    f.write_text('{"collection": "parts", "key": "p1", "value": {"qty": 1}}\n'
                 '\n'
                 '{"collection": "parts", "key": "old", "delete": true}\n'
                 '{"collection": "parts", "key": "gone", "delete": true}\n'
                 '{"collection": "tools", "key": "t1", "value": "hammer"}\n')
    n = changelog_count(a)
    r = run("load", f, site=a, json_mode=True)
    assert r.code == 0, r
    assert r.json["loaded"] == 4
    assert changelog_count(a) == n + 4
    assert run("ls", site=a, json_mode=True).json["records"] == [
        {"collection": "parts", "key": "p1", "value": {"qty": 1}},
        {"collection": "tools", "key": "t1", "value": "hammer"}]


def test_load_bad_line_names_it_and_loads_nothing(a, tmp_path):
    f = tmp_path / "data.jsonl"
    f.write_text('{"collection": "parts", "key": "p1", "value": 1}\n'
                 '{"collection": "parts", "key": "p2", "value": 2}\n'
                 '{"collection": "parts", "key": "p3" "value": 3}\n'
                 '{"collection": "parts", "key": "p4", "value": 4}\n')
    before = run("digest", site=a, json_mode=True).json
    n = changelog_count(a)
    r = run("load", f, site=a)
    assert r.code == 1 and r.out == ""
    assert r.err.splitlines()[0].startswith(f"error: {f} line 3: not valid JSON")
    assert run("digest", site=a, json_mode=True).json == before
    assert changelog_count(a) == n
    assert run("get", "parts", "p1", site=a).code == 1


def test_load_of_a_missing_file(a, tmp_path):
    r = run("load", tmp_path / "nope.jsonl", site=a)
    assert r.code == 1 and "error: " in r.err and "no such file" in r.err


def test_load_dash_reads_standard_input(a):
    lines = '{"collection": "std", "key": "k1", "value": 1}\n' \
            '{"collection": "std", "key": "k2", "delete": true}\n'
    r = run("load", "-", site=a, json_mode=True, input=lines)
    assert r.code == 0, r
    assert r.json == {"loaded": 2, "puts": 1, "deletes": 1}
    assert run("get", "std", "k1", site=a).out.strip() == "1"
    bad = run("load", "-", site=a, input='{"collection": "std", "key": "k3", "value": 3}\nnot json\n')
    assert bad.code == 1 and "standard input line 2: not valid JSON" in bad.err
    assert run("get", "std", "k3", site=a).code != 0


# --- digest and fsck ----------------------------------------------------------------------------

def test_digest_json_shape(a):
    run("put", "c", "k1", "1", site=a)
    run("put", "c", "k2", "2", site=a)
    run("delete", "c", "k2", site=a)
    r = run("digest", site=a, json_mode=True)
    assert r.code == 0
    doc = r.json
    assert {"digest", "records", "vector"} <= set(doc)
    assert re.fullmatch(r"[0-9a-f]{64}", doc["digest"])
    assert doc["records"] == 1
    assert doc["vector"] == {"a": 5}                  # 2 system ops at init, then 3 writes
    h = run("digest", site=a)
    assert h.out.strip() == doc["digest"]


def test_digest_equal_after_exchange_and_different_after_a_write(family):
    family.init("a")
    family.add("b", via="a")
    a, b = family.path("a"), family.path("b")
    run("put", "parts", "p1", '{"qty": 1}', site=a)
    run("put", "parts", "p2", '"two"', site=b)
    run("delete", "parts", "p3", site=b)
    family.full_exchange()
    da = run("digest", site=a, json_mode=True).json
    db = run("digest", site=b, json_mode=True).json
    assert da == db and da["records"] == 2
    assert run("put", "parts", "p1", '{"qty": 2}', site=b).code == 0
    db2 = run("digest", site=b, json_mode=True).json
    assert db2["digest"] != da["digest"]
    assert run("digest", site=a, json_mode=True).json == da          # a has not seen it yet
    family.full_exchange()
    assert run("digest", site=a, json_mode=True).json["digest"] == db2["digest"]


def test_fsck_on_a_healthy_site(a):
    run("put", "c", "k", "1", site=a)
    run("delete", "c", "k", site=a)
    r = run("fsck", site=a)
    assert r.code == 0 and "error" not in r.err, r
    j = run("fsck", site=a, json_mode=True)
    assert j.code == 0 and j.json["ok"] is True and j.json["problems"] == []
    assert j.json["changelog_ops"] == 4


# --- a delete still wins over an older concurrent write -----------------------------------------

def _csn_of(path: Path, key: str) -> bytes:
    with Site.open(path) as s:
        (h, o, sq), = s.conn.execute("SELECT hlc, origin, seq FROM changelog WHERE key=? "
                                     "ORDER BY epoch DESC LIMIT 1", (key,)).fetchall()
        return h.to_bytes(8, "big") + o + sq.to_bytes(4, "big")


def test_delete_of_an_unseen_record_wins_over_an_older_concurrent_write(family):
    family.init("a")
    family.add("b", via="a")
    a, b = family.path("a"), family.path("b")
    # b writes k with an older clock; a, which never saw it, deletes k (and x) later
    with Site.open(b, clock=lambda: wall_ms() - 60_000) as sb, sb.transaction() as tx:
        tx.put("parts", "k", "from b")
    time.sleep(0.005)
    assert run("delete", "parts", "k", site=a).code == 0
    assert run("get", "parts", "k", site=b).out == '"from b"\n'
    # control: a deletes x first, then b writes x later; the later write must win
    assert run("delete", "parts", "x", site=a).code == 0
    time.sleep(0.005)
    assert run("put", "parts", "x", '"late write"', site=b).code == 0
    assert _csn_of(a, "k") > _csn_of(b, "k")
    assert _csn_of(b, "x") > _csn_of(a, "x")

    family.full_exchange()
    for site in (a, b):
        assert run("get", "parts", "k", site=site).code == 1, site
        assert run("get", "parts", "x", site=site).out == '"late write"\n', site
        assert run("ls", site=site, json_mode=True).json == {
            "records": [{"collection": "parts", "key": "x", "value": "late write"}]}
        assert run("fsck", site=site).code == 0
    assert run("digest", site=a, json_mode=True).json == run("digest", site=b,
                                                              json_mode=True).json


# --- the module entry point ---------------------------------------------------------------------

def test_python_m_syncpack_help(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    p = subprocess.run([sys.executable, "-m", "syncpack", "--help"], capture_output=True,
                       text=True, timeout=60, env=env, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "Usage:" in p.stdout
    for cmd in ("init", "keygen", "put", "get", "delete", "ls", "load", "digest", "fsck"):
        assert re.search(rf"^\s+{cmd}\b", p.stdout, re.M), cmd
    bad = subprocess.run([sys.executable, "-m", "syncpack", "no-such-command"],
                         capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr


def test_a_key_holding_a_control_character_is_named_as_listings_show_it(family):
    """A key may hold a NUL or a line break (an attached table's TEXT key may); listings
    show it escaped, and no command line can carry it as it is: the shown form names it, for
    'get' and 'conflicts resolve', so its conflict can be settled."""
    family.init("A")
    family.add("B", via="A")
    family.full_exchange(1)
    for name, v in (("A", "from A"), ("B", "from B")):
        family.put(name, "t", "n\x00ul\nx", v)
    family.full_exchange(1)
    shown = run("conflicts", "t", site=family.path("A")).out
    assert "t/n\\x00ul\\nx" in shown, shown
    r = run("get", "t", "n\\x00ul\\nx", site=family.path("A"), json_mode=True)
    assert r.code == 0 and r.json["key"] == "n\x00ul\nx", r
    r = run("conflicts", "resolve", "t", "n\\x00ul\\nx", "--pick", "B", site=family.path("A"))
    assert r.code == 0, r
    with family.open("A") as s:
        assert s.get("t", "n\x00ul\nx") == "from B" and len(s.versions("t", "n\x00ul\nx")) == 1
    # a key that really is spelt with a backslash is still that key
    family.put("A", "t", "a\\x41", "literal")
    assert run("get", "t", "a\\x41", site=family.path("A"), json_mode=True).json["value"] == \
        "literal"
