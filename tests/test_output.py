"""One output rule for every command (docs/commands.md, "Output"): results on stdout,
diagnostics on stderr, and ``-q`` prints nothing at all when the command succeeds."""

from __future__ import annotations

import json
import shutil

import pytest

from conftest import run


def _q(*args, site=None, input=None):
    r = run("-q", *args, site=site, input=input)
    assert r.code == 0, (args, r)
    assert r.out == "" and r.err == "", (args, r)
    return r


def test_quiet_prints_nothing_for_every_command_that_succeeds(tmp_path):
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    usb = tmp_path / "usb"
    usb.mkdir()
    seen = set()

    def q(*args, site=None, input=None):
        seen.add(" ".join(x for x in args[:2] if isinstance(x, str) and not x.startswith("-")
                          and x in COMMANDS_2) if args[0] in GROUPS else args[0])
        return _q(*args, site=site, input=input)

    q("init", a, "--family", "fam", "--site", "a")
    q("keygen", b, "--site", "b")
    q("keygen", c, "--site", "c")
    q("mkreplica", "export", "--site", "b", "--pubkey", b / "keys" / "site.pub", "--out", usb,
      site=a)
    q("mkreplica", "import", usb / "b" / "a", site=b)
    q("mkreplica", "export", "--site", "c", "--pubkey", c / "keys" / "site.pub", "--out", usb,
      site=a)
    q("mkreplica", "import", usb / "c" / "a", site=c)
    q("keyinfo", site=a)
    q("collection", "create", "notes", "--policy", "priority", site=a)
    q("collection", "ls", site=a)
    q("put", "parts", "p1", '{"qty": 1}', site=a)
    q("put", "parts", "p2", "-", site=a, input='{"qty": 2}')
    q("delete", "parts", "p2", site=a)
    q("get", "parts", "p1", site=a)
    q("ls", site=a)
    (tmp_path / "r.jsonl").write_text(json.dumps({"collection": "parts", "key": "p3",
                                                  "value": 3}) + "\n")
    q("load", tmp_path / "r.jsonl", site=a)
    q("priority", "b", "5", site=a)
    q("put", "parts", "x", "1", site=b)
    q("put", "parts", "x", "2", site=a)      # a conflict: neither has seen the other's
    q("export", "--to", "b", "--create-out", "--out", tmp_path / "m1", site=a)
    q("export", "--to", "a", "--create-out", "--out", tmp_path / "m1", site=b)
    q("lspacket", tmp_path / "m1", site=a)
    q("lspacket", tmp_path / "m1")
    q("import", tmp_path / "m1", site=b)
    q("import", tmp_path / "m1", site=a)
    q("conflicts", site=a)
    q("conflicts", "resolve", "parts", "x", "--value", "3", site=a)
    q("export", "--to", "b", "--create-out", "--out", tmp_path / "m2", site=a)
    q("export", "--to", "b", "--create-out", "--out", tmp_path / "m2", site=a)  # nothing
    q("lsepoch", site=a)
    q("chepoch", "b", "a=1", site=a)
    q("status", site=a)
    q("status", "--format", "prometheus", site=a)
    q("digest", site=a)
    q("fsck", site=a)
    q("scrub", site=a)
    q("resync", "--to", "b", "--create-out", "--out", tmp_path / "m3", site=a)
    q("require-sealing", "off", site=a)
    q("rmreplica", "c", site=a)
    cfg = tmp_path / "a.toml"
    cfg.write_text(f'site = "{a}"\n[[export]]\nout = "{tmp_path / "m4"}"\nto = "all"\n'
                   f'create = true\n')
    q("batch", cfg)
    app = tmp_path / "shop.db"
    import sqlite3
    with sqlite3.connect(app) as db:
        db.execute("CREATE TABLE orders(id INTEGER PRIMARY KEY, item TEXT)")
        db.execute("INSERT INTO orders VALUES (1, 'bolt')")
    db.close()
    q("attach", app, "--table", "orders", site=a)
    q("capture", site=a)
    q("attached", site=a)
    q("detach", app, "--table", "orders", site=a)
    backup = tmp_path / "b-backup"
    shutil.copytree(b, backup)
    q("restore", site=backup)
    missing = _all_commands() - seen - {"log export"}   # log export: the Parquet log, tested there
    assert not missing, missing


def _all_commands() -> set[str]:
    """Every command the program has, as a user types it (so a new one joins this test)."""
    import click
    from syncpack.cli import cli
    out = set()
    for name, cmd in cli.commands.items():
        if isinstance(cmd, click.Group):
            out |= {f"{name} {sub}" for sub in cmd.commands}
            if name == "conflicts":
                out.add(name)       # also a command of its own (lists)
        else:
            out.add(name)
    return out


GROUPS = {"mkreplica", "collection", "conflicts", "log"}
assert GROUPS == {n for n, c in __import__("syncpack.cli", fromlist=["cli"]).cli.commands.items()
                  if hasattr(c, "commands")}
COMMANDS_2 = {"mkreplica", "export", "import", "collection", "create", "ls", "conflicts",
              "resolve", "log"}
COMMANDS = {"init", "keygen", "mkreplica export", "mkreplica import", "keyinfo", "rmreplica",
            "restore", "put", "delete", "get", "ls", "load", "conflicts", "conflicts resolve",
            "collection create", "collection ls", "priority", "export", "import", "lspacket",
            "lsepoch", "chepoch", "resync", "require-sealing", "log export", "batch", "status",
            "scrub", "digest", "fsck"}


@pytest.fixture
def ab(family):
    family.init("a")
    family.add("b", via="a")
    family.put("a", "parts", "p1", {"qty": 1})
    return family


@pytest.mark.parametrize("args, needle", [
    (("fsck",), "ok:"),
    (("scrub",), "removed"),
    (("digest",), ""),
    (("status",), "site a"),
])
def test_results_go_to_stdout(ab, args, needle):
    r = run(*args, site=ab.path("a"))
    assert r.code == 0 and r.err == "" and needle in r.out, r


def test_import_summary_is_a_result_on_stdout(ab, tmp_path):
    ab.put("a", "c", "k", 1)
    usb = tmp_path / "usb"
    assert run("export", "--to", "b", "--create-out", "--out", usb, site=ab.path("a")).code == 0
    r = run("import", usb, site=ab.path("b"))
    assert r.code == 0 and r.err == "" and "import: 1 packet(s) applied" in r.out, r


def test_a_second_restore_says_the_site_is_already_recovering(ab):
    a = ab.path("a")
    r = run("restore", site=a)
    assert r.code == 0 and "recovering" in r.out, r
    before = run("status", site=a, json_mode=True).json["recovery"]
    r = run("restore", site=a)
    assert r.code == 1 and "already recovering" in r.err and "hint: " in r.err, r
    assert run("status", site=a, json_mode=True).json["recovery"] == before


def test_damaged_packet_and_read_only_medium_have_hints(ab, tmp_path):
    import os
    usb = tmp_path / "usb"
    assert run("export", "--to", "b", "--create-out", "--out", usb, site=ab.path("a")).code == 0
    pk = next(usb.rglob("*.spk"))
    data = pk.read_bytes()
    for bad in (data[:40], data[:-7], data[:200] + bytes([data[200] ^ 1]) + data[201:]):
        pk.write_bytes(bad)
        r = run("import", pk, site=ab.path("b"))
        assert r.code == 1 and "error: " in r.err and "hint: " in r.err, r
    # a medium whose write-protect switch is on (as root, chmod would not stop us: the
    # filesystem's answer is simulated)
    import builtins
    import errno
    from syncpack.exchange import packets
    real_open = builtins.open

    def read_only(path, mode="r", *a, **kw):
        if "w" in mode:
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real_open(path, mode, *a, **kw)
    ab.put("a", "c", "k", 2)
    packets.open = read_only
    try:
        r = run("export", "--to", "b", "--out", usb, site=ab.path("a"))
    finally:
        del packets.open
    assert r.code == 1 and "read-only" in r.err and "hint: " in r.err, r


def test_one_version_number():
    import tomllib
    from pathlib import Path
    import syncpack
    root = Path(syncpack.__file__).resolve().parents[1]
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    assert "version" in project["dynamic"] and "version" not in project
    r = run("--version")
    assert r.code == 0 and r.out.strip() == f"syncpack, version {syncpack.__version__}", r
    # --json means one JSON document on stdout, here too (it printed the text line)
    for args in (("--json", "--version"), ("--version", "--json")):
        r = run(*args)
        assert r.code == 0 and json.loads(r.out) == {"version": syncpack.__version__}, r
    assert syncpack.__version__ == "0.3.0"
    assert "0.3.0" in (root / "docs" / "operations.md").read_text()


def test_lspacket_labels_ids_and_names_a_missing_path(tmp_path):
    """Without a site an update packet's sites are ids, and the human output must not let an id
    pass for a name; a path that is not there is said so, with a hint (not "damaged")."""
    a, b = tmp_path / "a", tmp_path / "b"
    assert run("init", a, "--family", "fam", "--site", "a").code == 0
    assert run("keygen", b, "--site", "b").code == 0
    usb = tmp_path / "usb"
    usb.mkdir()
    assert run("mkreplica", "export", "--site", "b", "--pubkey", b / "keys" / "site.pub",
               "--out", usb, site=a).code == 0
    assert run("mkreplica", "import", usb / "b" / "a", site=b).code == 0
    assert run("put", "parts", "p1", "1", site=a).code == 0
    assert run("export", "--to", "b", "--create-out", "--out", tmp_path / "m", site=a).code == 0
    from syncpack.site import Site
    with Site.open(a) as s:
        a_id, b_id = s.site_id.hex(), s.member_named("b").site_id.hex()
    r = run("lspacket", tmp_path / "m")
    assert r.code == 0, r
    line = r.out.splitlines()[0]
    assert f"update site id {a_id} -> site id {b_id} " in line, r
    assert f"ranges site id {a_id} " in line and "not sealed" in line, r
    assert "sites shown by id" in r.out
    named = run("lspacket", tmp_path / "m", site=b)
    assert "update a -> b " in named.out and "site id" not in named.out, named
    gone = run("lspacket", tmp_path / "nothere")
    assert gone.code == 1 and "no such file or directory" in gone.err, gone
    assert "hint: check the path" in gone.err and "damaged" not in gone.err, gone
    junk = tmp_path / "junk.spk"
    junk.write_bytes(b"junk")
    bad = run("lspacket", junk)       # describing applies nothing: the hint does not say it did
    assert bad.code == 1 and "hint: " in bad.err and "applied" not in bad.err, bad


def test_a_reader_that_goes_away_ends_the_command_quietly(tmp_path):
    """'syncpack conflicts | head -1': once the reader has closed the pipe, the command ends
    without a word and with 141 (128 + SIGPIPE), as programs killed by SIGPIPE do; not with
    'error: Broken pipe' and 1, which would say the work failed."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    exe = shutil.which("syncpack", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.skip("needs the syncpack script of this venv")
    site = tmp_path / "a"
    assert run("init", site, "--family", "f", "--site", "a").code == 0
    for i in range(5):
        assert run("put", "c", f"k{i}", "1", site=site).code == 0
    for args in (["ls"], ["--json", "ls", "c"], ["conflicts"], ["status"]):
        r, w = os.pipe()
        os.close(r)         # the reader is gone before the first line
        try:
            p = subprocess.run([exe, "--site", str(site), *args], stdout=w,
                               stderr=subprocess.PIPE, text=True, timeout=60)
        finally:
            os.close(w)
        assert p.returncode == 141 and p.stderr == "", (args, p)


def test_a_reader_that_stops_early_gets_141_and_a_full_disk_one_error(tmp_path):
    """'syncpack ls | head -1' over a long listing: the reader takes the first bytes and
    closes the pipe, and Python's buffered write came back short without an error, so the
    command ended 0, as if the listing were whole.  A full disk under the output
    (/dev/full) printed two chained tracebacks with --json, and no hint without."""
    import subprocess
    import sys
    from pathlib import Path
    exe = shutil.which("syncpack", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.skip("needs the syncpack script of this venv")
    site = tmp_path / "a"
    assert run("init", site, "--family", "f", "--site", "a").code == 0
    lines = tmp_path / "r.jsonl"
    lines.write_text("".join(f'{{"collection": "c", "key": "k{i}", "value": {i}}}\n'
                             for i in range(20_000)))
    assert run("load", lines, site=site).code == 0
    for args in (["ls", "c"], ["--json", "ls", "c"]):
        p = subprocess.Popen([exe, "--site", str(site), *args], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
        p.stdout.read(100)
        p.stdout.close()        # the reader has what it wanted
        assert p.wait(timeout=60) == 141 and p.stderr.read() == b"", args
    whole = subprocess.run([exe, "--site", str(site), "ls", "c"], capture_output=True, text=True)
    assert whole.returncode == 0 and len(whole.stdout.splitlines()) == 20_000
    if not Path("/dev/full").exists():
        return
    for args in (["--json", "status"], ["status"], ["ls", "c"]):
        with open("/dev/full", "w") as full:
            p = subprocess.run([exe, "--site", str(site), *args], stdout=full,
                               stderr=subprocess.PIPE, text=True, timeout=60)
        assert p.returncode == 1, (args, p)
        assert p.stderr.splitlines()[0] == ("error: the output could not be written: No space "
                                            "left on device"), (args, p.stderr)
        assert "Traceback" not in p.stderr and "hint: " in p.stderr, (args, p.stderr)


def test_json_may_follow_the_command(tmp_path):
    """'syncpack status --json' as 'syncpack --json status', for every command; after '--'
    it is an argument like any other."""
    site = tmp_path / "a"
    assert run("init", site, "--family", "f", "--site", "a").code == 0
    assert run("put", "c", "k", '{"n": 1}', "--json", site=site).json is not None
    for args in (["status"], ["conflicts"], ["ls", "c"], ["get", "c", "k"], ["fsck"],
                 ["digest"], ["attached"]):
        after = run(*args, "--json", site=site)
        before = run("--json", *args, site=site)
        assert after.code == before.code == 0, (args, after)
        assert isinstance(after.json, dict), (args, after.out)
        assert after.json.keys() == before.json.keys(), args
    assert run("put", "c", "--", "--json", '"v"', site=site).code == 0     # a key
    assert run("get", "c", "--json", "--", "--json", site=site).json["value"] == "v"
