"""Attached databases under concurrent application writes and kill -9 (issue 21, points 1, 3, 4).

The applications and the ``syncpack`` commands are separate processes; a killed command is
followed by the next one, after which the application's tables, the store and the peers agree
and ``fsck`` is clean.
"""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from test_attach import app, exchange, make_family, run, sp, table

from syncpack.format import blocks
from syncpack.site import Site
from syncpack.store import chain

SYNCPACK = str(Path(sys.executable).with_name("syncpack"))

# Moves one unit between two accounts per transaction (the sum never changes) and logs it:
# a peer that ever sees half a transaction sees a wrong sum.
TRANSFERS = r"""
import random, sqlite3, sys
db, n, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rnd = random.Random(seed)
c = sqlite3.connect(db, timeout=60, isolation_level=None)
for i in range(n):
    a, b = rnd.sample(range(10), 2)
    c.execute("BEGIN IMMEDIATE")
    c.execute("UPDATE acct SET bal = bal - 1 WHERE id = ?", (a,))
    c.execute("UPDATE acct SET bal = bal + 1 WHERE id = ?", (b,))
    c.execute("INSERT INTO log(id, what) VALUES (?, ?)", (f"{seed}-{i}", f"{a}->{b}"))
    c.execute("COMMIT")
"""

SCHEMA = ["CREATE TABLE acct(id INTEGER PRIMARY KEY, bal INTEGER NOT NULL)",
          "CREATE TABLE log(id TEXT PRIMARY KEY, what TEXT)"]


def start_transfers(db: Path, n: int, seed: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", TRANSFERS, str(db), str(n), str(seed)])


def balance(db: Path) -> int:
    c = sqlite3.connect(db)
    try:
        return c.execute("SELECT coalesce(sum(bal), 0) FROM acct").fetchone()[0]
    finally:
        c.close()


def two_sites(tmp_path):
    sites = make_family(tmp_path, ("a", "b"))
    dbs = {n: tmp_path / f"{n}.db" for n in sites}
    app(dbs["a"], SCHEMA, [f"INSERT INTO acct VALUES ({i}, 100)" for i in range(10)])
    app(dbs["b"], SCHEMA)
    for n in sites:
        sp(sites[n], "attach", dbs[n], "--table", "acct", "--table", "log")
    exchange(tmp_path, sites, rounds=1)
    assert balance(dbs["b"]) == 1000
    return sites, dbs


def test_app_writes_during_capture_and_import_never_split_a_transaction(tmp_path):
    sites, dbs = two_sites(tmp_path)
    out = tmp_path / "carry"
    out.mkdir()
    writer_a = start_transfers(dbs["a"], 400, 1)
    # b's own application keeps writing while b imports into its tables
    writer_b = subprocess.Popen([sys.executable, "-c", r"""
import sqlite3, sys
c = sqlite3.connect(sys.argv[1], timeout=60, isolation_level=None)
for i in range(300):
    c.execute("INSERT INTO log(id, what) VALUES (?, 'local at b')", (f"b-{i}",))
""", str(dbs["b"])])
    rounds = 0
    while writer_a.poll() is None or rounds < 2:
        r = subprocess.run([SYNCPACK, "--site", str(sites["a"]), "export", "--to", "b",
                            "--out", str(out)], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        r = subprocess.run([SYNCPACK, "--site", str(sites["b"]), "import", str(out)],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        assert balance(dbs["b"]) == 1000      # never half of a transfer
        rounds += 1
    assert writer_a.wait() == 0 and writer_b.wait() == 0
    exchange(tmp_path, sites)
    assert table(dbs["a"], "acct") == table(dbs["b"], "acct")
    assert table(dbs["a"], "log") == table(dbs["b"], "log")
    assert len(table(dbs["a"], "log")) == 700       # nothing lost on either side
    for s in sites.values():
        assert run("fsck", site=s).code == 0


def _children(pid: int) -> list[str]:
    """The processes ``pid`` started (any of its threads), as Linux lists them."""
    out: list[str] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out += f.read().split()
    except OSError:     # gone already
        pass
    return out


def _kill_at_random(args: list[str], rnd: random.Random, tries: int,
                    waits: tuple[float, float] = (0.05, 0.9), alone: bool = False) -> int:
    """Runs the command ``tries`` times, each killed -9 after a random wait if still running.
    With ``alone``, the wait starts once the command has started its child process, and every
    other time the command only is killed, leaving the child to notice (a command that did
    all its work before a kill would leave the next ones nothing to do).  Returns how many
    were killed."""
    killed = 0
    for k in range(tries):
        p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
        if alone:
            deadline = time.monotonic() + 60
            while p.poll() is None and not _children(p.pid) and time.monotonic() < deadline:
                time.sleep(0.005)
        time.sleep(rnd.uniform(*waits))
        if p.poll() is None:
            if alone and k % 2 == 0:
                os.kill(p.pid, signal.SIGKILL)
            else:
                os.killpg(p.pid, signal.SIGKILL)
            killed += 1
        p.wait()
    return killed


def test_kill_9_during_capture_and_import_loses_nothing_and_repeats_nothing(tmp_path):
    rnd = random.Random(21)
    sites, dbs = two_sites(tmp_path)
    out = tmp_path / "carry"
    out.mkdir()
    for round_ in range(3):
        w = start_transfers(dbs["a"], 150, 10 + round_)
        app(dbs["a"], [f"WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n "
                       f"WHERE i < 2999) INSERT INTO log(id, what) SELECT 'bulk-{round_}-' || i, "
                       f"printf('%.200c', 'x') FROM n"])
        assert w.wait() == 0
        _kill_at_random([SYNCPACK, "--site", str(sites["a"]), "capture"], rnd, 3)
        sp(sites["a"], "capture")
        assert run("fsck", site=sites["a"]).code == 0
        sp(sites["a"], "export", "--to", "b", "--out", out)
        _kill_at_random([SYNCPACK, "--site", str(sites["b"]), "import", str(out)], rnd, 3)
        sp(sites["b"], "import", out)
        assert balance(dbs["b"]) == 1000
        assert table(dbs["a"], "log") == table(dbs["b"], "log")
        assert table(dbs["a"], "acct") == table(dbs["b"], "acct")
        for s in sites.values():
            r = run("fsck", site=s)
            assert r.code == 0, r
    # each application change became exactly one op: the log rows were inserted once each
    r = run("--json", "status", site=sites["a"])
    assert r.json["conflicts"] == 0
    n_log = len(table(dbs["a"], "log"))
    assert n_log == 3 * (150 + 3000)
    exchange(tmp_path, sites)
    assert sp(sites["a"], "digest").out == sp(sites["b"], "digest").out


def _big_backlog(db: Path, n: int) -> int:
    """``n`` log rows in one application transaction; returns ``n``."""
    app(db, [f"WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n "
             f"WHERE i < {n - 1}) INSERT INTO log(id, what) SELECT 'big-' || i, "
             f"printf('%.40c', 'y') FROM n"])
    return n


def test_kill_9_during_a_capture_read_by_the_reader_process(tmp_path):
    """A backlog large enough to be read by a child process (attach/reader.py): kill -9 of the
    command alone (its reader left to notice) or of both at random instants loses no change and
    repeats none, and the next capture moves everything."""
    from syncpack.attach import reader
    rnd = random.Random(7)
    sites, dbs = two_sites(tmp_path)
    n = _big_backlog(dbs["a"], reader.ELSEWHERE_AT + 50_000)
    killed = _kill_at_random([SYNCPACK, "--site", str(sites["a"]), "capture"], rnd, 4,
                             (0.0, 0.4), alone=True)
    assert killed >= 2      # a capture of this size takes longer than the waits
    sp(sites["a"], "capture")
    assert run("fsck", site=sites["a"]).code == 0
    out = tmp_path / "carry"
    out.mkdir()
    sp(sites["a"], "export", "--to", "b", "--out", out)
    sp(sites["b"], "import", out)
    assert table(dbs["a"], "log") == table(dbs["b"], "log")
    assert len(table(dbs["b"], "log")) == n
    r = run("--json", "status", site=sites["a"])
    assert r.json["conflicts"] == 0
    for s in sites.values():
        assert run("fsck", site=s).code == 0


def test_kill_9_during_an_import_written_by_the_writer_process(tmp_path):
    """An import large enough for its rows to be written by a child process
    (attach/writer.py), while b's application writes: kill -9 of the command alone (its
    writer left to notice and roll back) or of both at random instants loses no change and
    applies none twice, and the next import writes everything."""
    from syncpack.attach import writer
    rnd = random.Random(11)
    sites, dbs = two_sites(tmp_path)
    n = _big_backlog(dbs["a"], writer.ELSEWHERE_AT + 50_000)
    sp(sites["a"], "capture")
    # one transaction in parts, all in the one packet: applied part by part as they arrive
    with Site.open(sites["a"]) as s:
        parts = [o for o, _lo, _hi, data in chain.block_rows(s.conn)
                 if o == s.site_id and blocks.read_block_header_flags(data)]
    assert len(parts) >= 2
    out = tmp_path / "carry"
    out.mkdir()
    sp(sites["a"], "export", "--to", "b", "--out", out)
    w = start_transfers(dbs["b"], 300, 5)
    killed = _kill_at_random([SYNCPACK, "--site", str(sites["b"]), "import", str(out)], rnd, 4,
                             (0.0, 0.4), alone=True)
    assert killed >= 2      # an import of this size takes longer than the waits
    assert w.wait() == 0
    sp(sites["b"], "import", out)
    assert balance(dbs["b"]) == 1000
    exchange(tmp_path, sites)
    for t in ("log", "acct"):
        assert table(dbs["a"], t) == table(dbs["b"], t)
    assert len(table(dbs["b"], "log")) == n + 300
    for s in sites.values():
        assert run("fsck", site=s).code == 0
        assert run("--json", "status", site=s).json["conflicts"] == 0


# The importing process killed (SIGKILL, as kill -9) at the instant it calls the store
# function named: after the application's transaction committed, before the store's own.
KILLED_AT = r"""
import os, signal, sys
from syncpack.store import attached
def killed(*_a, **_k):
    os.kill(os.getpid(), signal.SIGKILL)
setattr(attached, sys.argv.pop(1), killed)
from syncpack.cli import main
sys.argv = ["syncpack"] + sys.argv[1:]
main()
"""


def b_wins_everywhere(tmp_path, sites: dict, dbs: dict, value: str) -> None:
    """After an exchange, every site's row k holds b's ``value``: b's change after the kill
    was no conflict (a conflict, under 'priority', would have gone to a), and fsck is clean."""
    exchange(tmp_path, sites)
    for n in sites:
        assert [row[:3:2] for row in table(dbs[n], "items")] == [("k", value)]
        assert run("conflicts", site=sites[n], json_mode=True).json["conflicts"] == []
        sp(sites[n], "fsck")


def a_ranked_over_b(tmp_path) -> tuple[dict, dict]:
    """Sites a and b under 'priority', a ranked higher, each with table items attached."""
    a = tmp_path / "a"
    assert run("init", a, "--family", "f", "--site", "a", "--policy", "priority",
               "--priority", "10").code == 0
    b = tmp_path / "b"
    assert run("keygen", b, "--site", "b").code == 0
    sp(a, "mkreplica", "export", "--site", "b", "--pubkey", b / "keys" / "site.pub", "--out",
       tmp_path / "seed", "--create-out", "--priority", "1")
    sp(b, "mkreplica", "import", tmp_path / "seed")
    sites = {"a": a, "b": b}
    dbs = {n: tmp_path / f"{n}.db" for n in sites}
    for n in sites:
        app(dbs[n], ["CREATE TABLE items(id TEXT PRIMARY KEY NOT NULL, v)"])
        sp(sites[n], "attach", dbs[n], "--table", "items")
    return sites, dbs


def test_kill_9_right_after_the_applications_commit_makes_no_false_conflict(tmp_path):
    """The marks left by that kill made every row of the import pending again: the
    application's next edit of a row it had been shown was captured as concurrent with it, a
    conflict; under 'priority' with the peer ranked higher, the edit was reverted in the
    application's own table.  The import's transaction now leaves a token in the file, and
    marks of a transaction the file holds just go."""
    sites, dbs = a_ranked_over_b(tmp_path)
    a, b = sites["a"], sites["b"]
    app(dbs["a"], ["INSERT INTO items VALUES ('k', 'from a')"])
    sp(a, "export", "--to", "b", "--out", tmp_path / "m1", "--create-out")
    r = subprocess.run([sys.executable, "-c", KILLED_AT, "clear_inflight", "--site",
                        str(b), "import", str(tmp_path / "m1" / "b")])
    assert r.returncode == -signal.SIGKILL
    assert [row[:3:2] for row in table(dbs["b"], "items")] == [("k", "from a")]
    app(dbs["b"], ["UPDATE items SET v = 'edited at b' WHERE id = 'k'"])
    b_wins_everywhere(tmp_path, sites, dbs, "edited at b")


def test_kill_9_between_the_applications_commit_and_the_settling_makes_no_false_conflict(
        tmp_path):
    """The keys such an apply wrote stayed pending, so the application's next change of one
    of them was captured as concurrent with the record it had been shown: here a delete it
    had seen, which 'priority' then kept, deleting the application's new row again.  The
    outcome is now noted in the store before the application's commit, with a token in the
    file, and the next command settles it."""
    sites, dbs = a_ranked_over_b(tmp_path)
    a, b = sites["a"], sites["b"]
    app(dbs["a"], ["INSERT INTO items VALUES ('k', 'from a')"])
    exchange(tmp_path, sites)
    app(dbs["a"], ["DELETE FROM items WHERE id = 'k'"])
    sp(a, "export", "--to", "b", "--out", tmp_path / "m1", "--create-out")
    # killed after the application committed the delete (a key that was pending), before
    # the store settled it
    r = subprocess.run([sys.executable, "-c", KILLED_AT, "settle_pending", "--site",
                        str(b), "import", str(tmp_path / "m1" / "b")])
    assert r.returncode == -signal.SIGKILL
    assert table(dbs["b"], "items") == []               # the delete reached the application
    app(dbs["b"], ["INSERT INTO items VALUES ('k', 'again at b')"])
    b_wins_everywhere(tmp_path, sites, dbs, "again at b")
