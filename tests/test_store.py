"""The site store: atomic transactions, epochs, load, fsck, key files, and opening bad stores."""

from __future__ import annotations

import json
import os
import sqlite3
import stat
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from conftest import run
from syncpack import children
from syncpack.admin import loading
from syncpack.format import codec
from syncpack.format.csn import pack_csn
from syncpack.errors import SiteError, UsageError
from syncpack.site import Site
from syncpack.store import db, versions
from syncpack.store.db import DB_NAME, SCHEMA_VERSION


class Boom(Exception):
    pass


def snapshot(site: Site) -> tuple:
    """Everything a failed write must leave alone."""
    c = site.conn
    return (site.digest(), site.vector(),
            c.execute("SELECT count(*) FROM changelog").fetchone()[0],
            c.execute("SELECT collection, key, csn, value FROM versions ORDER BY 1, 2, 3").fetchall(),
            site.last_hlc())


def changelog_count(path: Path) -> int:
    with Site.open(path) as s:
        return s.conn.execute("SELECT count(*) FROM changelog").fetchone()[0]


def sql(path: Path, *statements: tuple) -> None:
    """Edit a site's database behind syncpack's back."""
    c = sqlite3.connect(str(path / DB_NAME), isolation_level=None)
    try:
        for stmt, *args in statements:
            c.execute(stmt, *args)
    finally:
        c.close()


@pytest.fixture
def site_dir(tmp_path) -> Path:
    p = tmp_path / "a"
    with Site.init_family(p, "fam", "a") as s:
        for i in range(3):
            with s.transaction() as tx:
                tx.put("parts", f"p{i}", {"n": i})
                tx.put("parts", f"q{i}", f"value {i}")
    return p


# --- transactions -------------------------------------------------------------------------------

def test_an_exception_inside_a_transaction_leaves_no_trace(site_dir):
    with Site.open(site_dir) as s:
        before = snapshot(s)
        with pytest.raises(Boom):
            with s.transaction() as tx:
                tx.put("parts", "p0", {"n": 100})      # overwrite
                tx.put("parts", "new", 1)              # insert
                tx.delete("parts", "q1")               # delete
                raise Boom()
        assert snapshot(s) == before
        assert s.get("parts", "p0") == {"n": 0}
        assert s.get("parts", "new", None) is None
        assert s.get("parts", "q1") == "value 1"
    with Site.open(site_dir) as s:                      # and nothing reached the disk
        assert snapshot(s) == before


def test_a_rejected_write_rolls_back_the_writes_before_it(site_dir):
    with Site.open(site_dir) as s:
        before = snapshot(s)
        with pytest.raises(UsageError):
            with s.transaction() as tx:
                tx.put("parts", "x", 1)
                tx.put("$roster", "x", 1)           # reserved: refused
        assert snapshot(s) == before
        with pytest.raises(UsageError):
            with s.transaction() as tx:
                tx.put("parts", "y", 1)
                tx.put("parts", "z", 2**70)         # not encodable
        assert snapshot(s) == before


def test_a_failed_transaction_does_not_use_up_epochs(site_dir):
    with Site.open(site_dir) as s:
        e0 = s.vector()[s.site_id]
        with pytest.raises(Boom):
            with s.transaction() as tx:
                tx.put("parts", "a", 1)
                tx.put("parts", "b", 1)
                raise Boom()
        with s.transaction() as tx:
            tx.put("parts", "c", 1)
        assert s.vector()[s.site_id] == e0 + 1
        assert s.conn.execute("SELECT key FROM changelog WHERE origin=? AND epoch=?",
                              (s.site_id, e0 + 1)).fetchone() == ("c",)


def test_epochs_are_consecutive_per_origin_across_transactions(tmp_path):
    with Site.init_family(tmp_path / "a", "fam", "a") as s:
        sizes = [3, 1, 0, 2, 5]
        for i, n in enumerate(sizes):
            with s.transaction() as tx:
                for j in range(n):
                    if j % 2:
                        tx.delete("c", f"{i}.{j}")
                    else:
                        tx.put("c", f"{i}.{j}", j)
        rows = s.conn.execute("SELECT epoch, hlc, seq FROM changelog WHERE origin=? "
                              "ORDER BY epoch", (s.site_id,)).fetchall()
        total = 2 + sum(sizes)                            # init wrote two system ops
        assert [r[0] for r in rows] == list(range(1, total + 1))
        assert s.vector() == {s.site_id: total}
        # each non-empty transaction is one hlc with seq 0..n-1; the empty one left nothing
        groups: dict[int, list[int]] = {}
        for _e, h, sq in rows:
            groups.setdefault(h, []).append(sq)
        assert [len(g) for g in groups.values()] == [2] + [n for n in sizes if n]
        assert all(g == list(range(len(g))) for g in groups.values())
        assert run("fsck", site=tmp_path / "a").code == 0


# --- load ---------------------------------------------------------------------------------------

GOOD = '{"collection": "parts", "key": "p9", "value": 9}'


@pytest.mark.parametrize("bad, why", [
    ('{"collection": "parts", "key": "x", "value": 1', "not valid JSON"),
    ('[1, 2]', "JSON object"),
    ('{"collection": "parts", "key": 5, "value": 1}', "collection"),
    ('{"collection": "$roster", "key": "x", "value": 1}', "reserved"),
    ('{"collection": "parts", "key": "x"}', "delete"),
    ('{"collection": "parts", "key": "x", "value": 1, "delete": true}', "not both"),
    ('{"collection": "parts", "key": "x", "value": 1, "extra": 2}', "extra"),
    ('{"collection": "parts", "key": "x", "value": %d}' % 2**70, "encoded"),
    # the rule of a put: an empty key cannot be typed back (delete refuses it)
    ('{"collection": "parts", "key": "", "value": 1}', "non-empty"),
    ('{"collection": "parts", "key": "\\ud800", "value": 1}', "UTF-8"),
])
@pytest.mark.parametrize("parser", ["here", "child"])
def test_load_rejects_a_bad_line_and_leaves_the_store_untouched(site_dir, tmp_path, bad, why,
                                                                parser, monkeypatch):
    """In this process or in the child process that parses a large file (forced here), the
    same line is refused with the same words, and nothing is loaded."""
    if parser == "child":
        monkeypatch.setattr(loading, "ELSEWHERE_AT", 0)
    f = tmp_path / "in.jsonl"
    f.write_text("\n".join([GOOD, '{"collection": "parts", "key": "p0", "delete": true}', "",
                            bad, GOOD]) + "\n")
    with Site.open(site_dir) as s:
        before = s.digest(), s.conn.execute("SELECT count(*) FROM changelog").fetchone()[0]
    r = run("load", f, site=site_dir)
    assert r.code == 1, r
    assert r.err.startswith(f"error: {f} line 4: "), r
    assert why in r.err
    assert "hint: nothing was loaded" in r.err
    with Site.open(site_dir) as s:
        assert (s.digest(), s.conn.execute("SELECT count(*) FROM changelog").fetchone()[0]) \
            == before
        assert s.get("parts", "p0") == {"n": 0}


@pytest.mark.parametrize("parser", ["here", "child"])
def test_load_applies_a_good_file_in_one_transaction(site_dir, tmp_path, parser, monkeypatch):
    spawned = []
    if parser == "child":
        monkeypatch.setattr(loading, "ELSEWHERE_AT", 0)
        real_spawn = children.spawn
        monkeypatch.setattr(children, "spawn", lambda m: spawned.append(m) or real_spawn(m))
    f = tmp_path / "in.jsonl"
    f.write_text(GOOD + '\n{"collection": "parts", "key": "p0", "delete": true}\n'
                 '{"collection": "other", "key": "k", "value": [1, {"a": null}]}\n')
    n0 = changelog_count(site_dir)
    r = run("load", f, site=site_dir, json_mode=True)
    assert r.code == 0 and r.json == {"loaded": 3, "puts": 2, "deletes": 1}, r
    assert spawned == (["syncpack.admin.loading"] if parser == "child" else [])
    with Site.open(site_dir) as s:
        rows = s.conn.execute("SELECT hlc, seq FROM changelog WHERE origin=? ORDER BY epoch "
                              "LIMIT -1 OFFSET ?", (s.site_id, n0)).fetchall()
        assert len(rows) == 3 and len({h for h, _ in rows}) == 1
        assert [sq for _, sq in rows] == [0, 1, 2]
        assert s.get("parts", "p9") == 9
        assert s.get("parts", "p0", None) is None
        assert s.get("other", "k") == [1, {"a": None}]


separated = st.lists(st.tuples(st.text("ab{}é😀 \r\u2028\x85", max_size=6),
                                st.sampled_from(["\n", "\r\n"])), max_size=30)


@settings(max_examples=60, deadline=None)
@given(pieces=separated, tail=st.text("ab\r\u2028", max_size=3), piece=st.integers(1, 7))
def test_a_load_file_read_a_piece_at_a_time_has_its_lines_whole(
        tmp_path_factory, pieces, tail, piece):
    """A piece may end inside a line, between '\r' and '\n', or inside a character's UTF-8
    bytes; the lines are still the text between its '\n's, so line numbers in errors hold
    (a U+2028 in a JSON string does not cut its line)."""
    text = "".join(a + b for a, b in pieces) + tail
    f = tmp_path_factory.mktemp("lines") / "in.jsonl"
    f.write_bytes(text.encode())
    whole = text.split("\n")
    if whole[-1] == "":
        whole.pop()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(loading, "READ_BYTES", piece)
        assert list(loading.lines_of(f)) == whole


@pytest.mark.parametrize("parser", ["here", "child"])
def test_load_takes_json_text_that_str_splitlines_would_cut(site_dir, tmp_path, parser,
                                                            monkeypatch):
    """JSON may hold U+2028, U+2029 and U+0085 unescaped in a string (json.dumps with
    ensure_ascii=False writes them so); Windows line ends load too."""
    if parser == "child":
        monkeypatch.setattr(loading, "ELSEWHERE_AT", 0)
    f = tmp_path / "in.jsonl"
    value = "a\u2028b\u2029c\x85d"
    f.write_text(json.dumps({"collection": "parts", "key": "u", "value": value},
                            ensure_ascii=False) + "\r\n" + GOOD + "\r\n", encoding="utf-8",
                 newline="")
    r = run("load", f, site=site_dir, json_mode=True)
    assert r.code == 0 and r.json["loaded"] == 2, r
    with Site.open(site_dir) as s:
        assert s.get("parts", "u") == value and s.get("parts", "p9") == 9


NOT_UTF8 = [
    # (the file's bytes, the error's start after the path); a GOOD line is 48 bytes and '\n'
    (b"\xff\xfe" + (GOOD + "\n").encode(), " line 1: not UTF-8 text (byte 0xff at offset 0 "),
    ((GOOD + "\n").encode() * 20 + b'{"collection": "parts", "key": "\xc3("}\n',
     " line 21: not UTF-8 text (byte 0xc3 at offset 1012 "),
    # the first bad line is the one told, whatever is wrong with it
    ((GOOD + "\n{oops\n").encode() + b"\xff\n", " line 2: not valid JSON"),
    ((GOOD + "\n").encode() + b"\xff\n{oops\n", " line 2: not UTF-8 text (byte 0xff at offset 49 "),
]


@pytest.mark.parametrize("parser", ["here", "child"])
@pytest.mark.parametrize("data, said", NOT_UTF8)
def test_load_of_a_file_that_is_not_utf8_names_the_line_and_changes_nothing(
        site_dir, tmp_path, parser, data, said, monkeypatch):
    """Parsed here or by the child, read in pieces that cut the file anywhere (17 bytes
    here), the same line and byte offset are told, and nothing is loaded."""
    if parser == "child":
        monkeypatch.setattr(loading, "ELSEWHERE_AT", 0)
    monkeypatch.setattr(loading, "READ_BYTES", 17)
    f = tmp_path / "in.jsonl"
    f.write_bytes(data)
    with Site.open(site_dir) as s:
        before = s.digest()
    r = run("load", f, site=site_dir)
    assert r.code == 1 and r.err.startswith(f"error: {f}{said}"), r
    assert "Traceback" not in r.err and len(r.err.splitlines()) == 2, r.err
    assert "nothing was loaded" in r.err
    with Site.open(site_dir) as s:
        assert s.digest() == before


@pytest.mark.parametrize("parser", ["here", "child"])
def test_load_skips_a_byte_order_mark(site_dir, tmp_path, parser, monkeypatch):
    """Windows tools may start UTF-8 text with a byte order mark; JSON readers may skip it."""
    if parser == "child":
        monkeypatch.setattr(loading, "ELSEWHERE_AT", 0)
    f = tmp_path / "in.jsonl"
    f.write_bytes(b"\xef\xbb\xbf" + (GOOD + "\r\n").encode())
    assert run("load", f, site=site_dir).code == 0
    with Site.open(site_dir) as s:
        assert s.get("parts", "p9") == 9


def test_a_load_that_fails_before_its_first_batch_stops_its_parsing_process(
        site_dir, tmp_path, monkeypatch):
    """The child is stopped even when no batch was ever taken from it (the store refused
    the transaction, say): it must not wait on a full pipe for as long as the caller lives."""
    from syncpack.admin import inspection
    monkeypatch.setattr(loading, "ELSEWHERE_AT", 0)
    procs = []
    real_spawn = children.spawn
    monkeypatch.setattr(children, "spawn", lambda m: procs.append(real_spawn(m)) or procs[-1])

    def refused(*a, **k):
        raise RuntimeError("refused")
    f = tmp_path / "in.jsonl"
    f.write_text("".join(f'{{"collection": "c", "key": "k{i}", "value": {i}}}\n'
                         for i in range(50_000)))
    with Site.open(site_dir) as s:
        monkeypatch.setattr(s, "transaction", refused)
        with pytest.raises(RuntimeError):
            inspection.load(s, f)
    assert len(procs) == 1 and procs[0].poll() is not None


def test_a_load_whose_parsing_process_is_killed_loads_nothing(site_dir, tmp_path,
                                                              monkeypatch):
    """The child parsing the file dies after its first batch was written (kill -9): the load
    fails with one line, its transaction rolled back, and a second load of the file works."""
    import signal
    monkeypatch.setattr(loading, "ELSEWHERE_AT", 0)
    monkeypatch.setattr(loading, "LOAD_TXN_OPS", 10)
    real = loading.Elsewhere.batches

    def batches(self):
        for i, b in enumerate(real(self)):
            if i == 1:
                os.kill(self.child.proc.pid, signal.SIGKILL)
                self.child.proc.wait()
            yield b
    monkeypatch.setattr(loading.Elsewhere, "batches", batches)
    f = tmp_path / "in.jsonl"
    f.write_text("".join(f'{{"collection": "c", "key": "k{i:05d}", "value": {i}}}\n'
                         for i in range(20_000)))
    with Site.open(site_dir) as s:
        before = s.digest()
    r = run("load", f, site=site_dir)
    assert r.code == 1 and "ended early" in r.err and "Traceback" not in r.err, r
    with Site.open(site_dir) as s:
        assert s.digest() == before
    monkeypatch.setattr(loading.Elsewhere, "batches", real)
    assert run("load", f, site=site_dir).code == 0
    with Site.open(site_dir) as s:
        assert s.get("c", "k19999") == 19999
    assert run("fsck", site=site_dir).code == 0


# --- fsck ---------------------------------------------------------------------------------------

def _own(path: Path) -> bytes:
    with Site.open(path) as s:
        return s.site_id


def break_delete_middle_op(p: Path):
    sql(p, ("DELETE FROM changelog WHERE origin=? AND epoch=4", (_own(p),)))


def break_bump_vector(p: Path):
    # our own epoch is the larger of the vector row and the changelog's newest op (a small
    # transaction writes only the latter): claim one more than both
    sql(p, ("UPDATE vector SET epoch=(SELECT max(epoch) FROM changelog WHERE origin=?1) + 1 "
            "WHERE origin=?1", (_own(p),)))


def break_change_value(p: Path):
    sql(p, ("UPDATE versions SET value=? WHERE collection='parts' AND key='p1'",
            (codec.encode_value({"n": 999}),)))


def break_version_without_op(p: Path):
    with Site.open(p) as s:
        hlc = s.last_hlc()
    sql(p, ("INSERT INTO versions VALUES ('parts', 'ghost', ?, ?)",
            (pack_csn(hlc - 5, _own(p), 0), codec.encode_value("boo"))))


def break_drop_version(p: Path):
    sql(p, ("DELETE FROM versions WHERE collection='parts' AND key='q2'",))


def break_versions_page(p: Path):
    """Bytes of the records' page damaged on disk: the roster is read from that table, so
    fsck's own checks failed and it said only 'the site store cannot be used', with the
    hint to run fsck."""
    c = sqlite3.connect(str(p / DB_NAME), isolation_level=None)
    try:
        c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        root = c.execute("SELECT rootpage FROM sqlite_schema WHERE name='versions'").fetchone()[0]
        size = c.execute("PRAGMA page_size").fetchone()[0]
    finally:
        c.close()
    with open(p / DB_NAME, "r+b") as f:
        f.seek((root - 1) * size + size - 200)
        f.write(bytes(b ^ 0x5A for b in f.read(190)).ljust(190, b"\x5a"))


@pytest.mark.parametrize("breaker, says", [
    (break_versions_page, "sqlite integrity_check"),
    (break_delete_middle_op, "not contiguous"),
    (break_bump_vector, "vector says a is at epoch 9, changelog holds up to 8"),
    (break_change_value, "record parts/p1 differs from a replay"),
    (break_version_without_op, "of parts/ghost has no changelog op"),
    (break_drop_version, "record parts/q2 differs from a replay"),
])
def test_fsck_catches_a_broken_store(site_dir, breaker, says):
    ok = run("fsck", site=site_dir)
    assert ok.code == 0 and "error:" not in ok.err, ok
    breaker(site_dir)
    r = run("fsck", site=site_dir)
    assert r.code == 1, r
    errors = [line for line in r.err.splitlines() if line.startswith("error: ")]
    assert errors and any(says in e for e in errors), r
    j = run("fsck", site=site_dir, json_mode=True)
    assert j.code == 1 and j.json["ok"] is False and any(says in p for p in j.json["problems"])


# --- key files ----------------------------------------------------------------------------------

@pytest.fixture
def open_umask():
    old = os.umask(0)        # so only an explicit mode can make the keys private
    try:
        yield
    finally:
        os.umask(old)


@pytest.mark.parametrize("how", ["init", "keygen"])
def test_private_keys_are_created_owner_only(tmp_path, open_umask, how):
    d = tmp_path / "s"
    args = ["init", d, "--family", "f", "--site", "s"] if how == "init" \
        else ["keygen", d, "--site", "s"]
    assert run(*args).code == 0
    for name in ("sign.key", "box.key"):
        mode = stat.S_IMODE((d / "keys" / name).stat().st_mode)
        assert mode == 0o600, (name, oct(mode))
    assert stat.S_IMODE((d / "keys").stat().st_mode) & 0o077 == 0
    assert (d / "keys" / "site.pub").read_text().startswith("{")


# --- opening what is not a usable site ----------------------------------------------------------

def _assert_site_error(r, *needles):
    assert r.code == 1, r
    lines = r.err.splitlines()
    assert lines and lines[0].startswith("error: "), r
    assert any(line.startswith("hint: ") for line in lines), r
    assert r.out == ""
    for n in needles:
        assert n in r.err, r


@pytest.mark.parametrize("cmd", [["ls"], ["get", "c", "k"], ["put", "c", "k", "1"], ["digest"],
                                 ["fsck"]])
def test_a_directory_that_is_not_a_site(tmp_path, cmd):
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "notes.txt").write_text("hello")
    _assert_site_error(run(*cmd, site=tmp_path / "plain"), "not a syncpack site")
    _assert_site_error(run(*cmd, site=tmp_path / "missing"), "not a directory")
    assert sorted(os.listdir(tmp_path / "plain")) == ["notes.txt"]   # nothing created there


@pytest.mark.parametrize("cmd", [["ls"], ["put", "c", "k", "1"], ["fsck"]])
def test_a_corrupt_database_file(site_dir, cmd):
    db = site_dir / DB_NAME
    assert not (site_dir / (DB_NAME + "-wal")).exists()      # closed cleanly by the fixture
    db.write_bytes(b"\x00garbage, not an SQLite file\xff" * 400)
    _assert_site_error(run(*cmd, site=site_dir), "not a readable syncpack store")
    with pytest.raises(SiteError):
        Site.open(site_dir)


def test_an_sqlite_database_of_another_program_is_refused_untouched(tmp_path):
    """Refused before any pragma: switching it to WAL would already write to it."""
    d = tmp_path / "other"
    d.mkdir()
    c = sqlite3.connect(str(d / DB_NAME), isolation_level=None)
    c.execute("CREATE TABLE notes(t TEXT)")
    c.execute("INSERT INTO notes VALUES ('hello')")
    c.close()
    before = (d / DB_NAME).read_bytes()
    for cmd in (["ls"], ["put", "c", "k", "1"], ["fsck"]):
        _assert_site_error(run(*cmd, site=d), "an SQLite database of something else")
    assert (d / DB_NAME).read_bytes() == before
    assert sorted(os.listdir(d)) == [DB_NAME]        # no -wal or -shm beside it


def test_a_store_from_a_newer_syncpack(site_dir):
    sql(site_dir, ("PRAGMA user_version=99",))
    for cmd in (["ls"], ["put", "c", "k", "1"], ["fsck"]):
        _assert_site_error(run(*cmd, site=site_dir), "schema version 99", "upgrade syncpack")
    c = sqlite3.connect(str(site_dir / DB_NAME))
    try:
        assert c.execute("PRAGMA user_version").fetchone()[0] == 99   # left as it was
        assert c.execute("SELECT count(*) FROM changelog").fetchone()[0] == 8
    finally:
        c.close()


def test_a_site_that_has_not_joined_refuses_data_commands(tmp_path):
    assert run("keygen", tmp_path / "k", "--site", "k").code == 0
    _assert_site_error(run("put", "c", "k", "1", site=tmp_path / "k"), "has not joined")
    _assert_site_error(run("ls", site=tmp_path / "k"), "has not joined")


def test_bench_api_script_runs_small(tmp_path):
    import json
    import subprocess
    import sys
    script = Path(__file__).resolve().parents[1] / "tools" / "bench_api.py"
    p = subprocess.run([sys.executable, str(script), "--ops", "250", "--batch", "100", "--json",
                        "--dir", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["ops"] == 250 and doc["transactions"] == 3
    assert doc["changelog_ops"] == 252                  # + the two system ops of init
    assert doc["store_bytes"] > 250 * 100 and doc["ops_per_s"] > 0
    assert list(tmp_path.iterdir()) == []               # the temporary site was removed


@pytest.mark.parametrize("release, sites, records", [
    ("store-v1", ("boston", "sanfran"), 3),                # syncpack 0.1.0, schema 1
    ("store-v2", ("boston", "sanfran", "chicago"), 5),     # format 1 with signed acks, schema 2
])
def test_a_store_made_by_an_older_release_migrates_and_keeps_syncing(tmp_path, release, sites,
                                                                       records):
    """tests/data/store-v1 and store-v2: sites made by the releases before format 2, each with
    changes the others have not imported, and format-1 packets carrying them in flight.  After
    the migration (schema 3): the records are unchanged and fsck passes; the old packets are
    refused as made by an older syncpack, with nothing changed; and ordinary rounds bring
    every change to every site, each from its origin (relayed ops of format 1 carried no
    origin signature, so they are never passed on)."""
    import json
    import shutil
    src = Path(__file__).parent / "data" / release
    root = tmp_path / "fam"
    shutil.copytree(src, root)
    for site in sites:
        os.chmod(root / site / "keys", 0o700)
        for k in (root / site / "keys").iterdir():
            os.chmod(k, 0o600)
        r = run("digest", site=root / site, json_mode=True)
        assert r.code == 0, r
        assert r.json == json.loads((root / f"{site}.digest.json").read_text()), site
        assert run("fsck", site=root / site).code == 0
        with sqlite3.connect(root / site / "syncpack.db") as c:
            assert c.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    for medium, site in (("pending", "sanfran"), ("to-boston", "boston")):
        before = run("digest", site=root / site, json_mode=True).json
        r = run("import", root / medium, site=root / site, json_mode=True)
        assert r.code == 1 and not r.json["applied"], r
        assert "made by an older syncpack" in r.json["rejected"][0]["error"], r
        assert run("digest", site=root / site, json_mode=True).json == before
    for _ in range(3):
        for a in sites:
            for b in sites:
                if a == b:
                    continue
                out = tmp_path / f"m-{a}-{b}-{_}"
                out.mkdir()
                r = run("export", "--to", b, "--out", out, site=root / a)
                assert r.code == 0, r
                assert run("import", out, site=root / b).code == 0
    d = [run("digest", site=root / s, json_mode=True).json for s in sites]
    assert all(x == d[0] for x in d) and d[0]["records"] == records, d
    for site in sites:
        assert run("fsck", site=root / site).code == 0


@settings(max_examples=60, deadline=None)
@given(rows=st.lists(st.tuples(st.text(min_size=1, max_size=6),
                               st.binary(min_size=20, max_size=20),
                               st.binary(min_size=1, max_size=40)),
                     min_size=1, max_size=30, unique_by=lambda r: r[0]),
       tombstone=st.booleans(),
       packed=st.sampled_from([versions.PACKED_BYTES, 16]))
def test_insert_columns_stores_what_insert_many_stores(tmp_path_factory, rows, tombstone,
                                                       packed):
    """The bulk inserts over a carray (each row packed into one blob and split by SQLite; a
    local writer's CSNs made by SQLite from their seqs) leave exactly the rows, bytes and
    SQLite types that one binding per row leaves: keys with NUL, non-ASCII and 0xff-free UTF-8
    of any length, CSNs as BLOBs (SQLite's || makes TEXT), tombstones, batches cut by size,
    seqs up to 2^32 - 1."""
    root = tmp_path_factory.mktemp("cols")
    if tombstone:
        rows[-1] = (*rows[-1][:2], None)
    # insert_numbered's rows: one CSN prefix and consecutive seqs, made by SQLite
    prefix, seq0 = rows[0][1][:16], 2 ** 32 - len(rows) - 1
    numbered = [(k, prefix + (seq0 + i).to_bytes(4, "big"), v)
                for i, (k, _c, v) in enumerate(rows)]
    got = []
    for how in ("many", "columns", "many numbered", "numbered"):
        conn = db.create(root / f"{how}.db")
        these = numbered if "numbered" in how else rows
        keys, csns, vals = ([r[i] for r in these] for i in range(3))
        with db.write_txn(conn):
            if how.startswith("many"):
                versions.insert_many(conn, [("c", k, c, v) for k, c, v in these])
            else:
                with pytest.MonkeyPatch.context() as mp:
                    mp.setattr(versions, "PACKED_BYTES", packed)
                    if how == "columns":
                        versions.insert_columns(conn, "c", keys, iter(csns), vals)
                    else:
                        versions.insert_numbered(conn, "c", keys, prefix, seq0, vals,
                                                 sum(len(v or b"") for v in vals))
        got.append(conn.execute(
            "SELECT collection, key, typeof(key), length(CAST(key AS BLOB)), csn, "
            "typeof(csn), value, typeof(value) FROM versions ORDER BY key, csn").fetchall())
        conn.close()
    assert got[0] == got[1] and got[2] == got[3]
    assert len(got[0]) == len(got[2]) == len(rows)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(0, 300), width=st.sampled_from([1, 2, 5, 600]))
def test_execute_rows_runs_every_row_in_order(tmp_path_factory, n, width):
    """Rows bound several to a statement (db.execute_rows) leave what one statement per row
    leaves, in the same order, whatever the count and width (wide rows get fewer per
    statement, within SQLite's limit on bound values)."""
    conn = db.create(tmp_path_factory.mktemp("rows") / "x.db")
    cols = ", ".join(f"c{i}" for i in range(width))
    conn.execute(f"CREATE TABLE t(seq INTEGER PRIMARY KEY, {cols})")
    one_row = "(" + ", ".join("?" for _ in range(width)) + ")"
    k = db.rows_per_statement(width)
    assert k * width <= db.MAX_BINDINGS
    rows = [tuple(i * 1000 + j for j in range(width)) for i in range(n)]
    with db.write_txn(conn):
        db.execute_rows(conn, f"INSERT INTO t({cols}) VALUES {one_row}",
                        f"INSERT INTO t({cols}) VALUES " + ", ".join([one_row] * k), rows, width)
    got = conn.execute(f"SELECT {cols} FROM t ORDER BY seq").fetchall()
    conn.close()
    assert [tuple(r) for r in got] == rows




def test_damaged_family_settings_are_told_as_damage_with_fsck_as_the_way(site_dir):
    """A store whose family settings record is not a value (damaged on disk, or edited) made
    every command fail with 'a record is not a value (1 bytes as its origin signed them)',
    naming no record, with the hint to replace it by a put, which no user can do there."""
    sql(site_dir, ("UPDATE versions SET value=x'c7' WHERE collection='$family'",))
    r = run("put", "parts", "k", "1", site=site_dir)
    assert r.code == 1 and "$family/settings" in r.err and "fsck" in r.err, r
    assert "origin signed" not in r.err
    r = run("fsck", site=site_dir)
    assert r.code == 1 and "$family/settings" in r.out, r
