"""The Speed issue's behaviour (its figures are measured by tools/bench_cli.py, not here): a
command imports only what it runs, and a bulk load writes what one put at a time would."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from hypothesis import given, settings, strategies as st

from conftest import run
from syncpack.admin import inspection, loading
from syncpack.site import Site
from syncpack.store import chain

HEAVY = ("cryptography", "zstandard", "pyarrow", "tqdm", "syncpack.exchange.sync",
         "syncpack.exchange.apply", "syncpack.admin.inspection")

_PROBE = """
import sys
from syncpack.cli import main
sys.argv = ["syncpack", "--site", sys.argv[1]] + sys.argv[2:]
try:
    main()
except SystemExit as e:
    code = e.code
heavy = [m for m in {heavy!r} if m in sys.modules]
print("HEAVY", ",".join(heavy), file=sys.stderr)
"""


def _heavy_imports(*args) -> list[str]:
    r = subprocess.run([sys.executable, "-c", _PROBE.format(heavy=HEAVY), *map(str, args)],
                       capture_output=True, text=True)
    line = [x for x in r.stderr.splitlines() if x.startswith("HEAVY")]
    assert line, r.stderr
    return [m for m in line[-1][len("HEAVY "):].split(",") if m]


def test_get_and_put_import_no_crypto_compression_or_packet_code(tmp_path):
    site = tmp_path / "a"
    assert run("init", site, "--family", "f", "--site", "a").code == 0
    assert _heavy_imports(site, "put", "c", "k", '{"n": 1}') == []
    assert _heavy_imports(site, "get", "c", "k") == []
    assert _heavy_imports(site, "ls", "c") == []
    # a command that needs them still gets them
    assert "syncpack.admin.inspection" in _heavy_imports(site, "status")


keys_ = st.sampled_from([f"k{i}" for i in range(6)])
values = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**63 - 1),
                   st.text(max_size=8), st.lists(st.integers(0, 9), max_size=3),
                   st.dictionaries(st.text(max_size=3), st.integers(0, 9), max_size=2))
lines = st.lists(st.tuples(st.sampled_from(["c", "d"]), keys_,
                           st.one_of(st.just(None), values.map(lambda v: ("v", v)))),
                 min_size=1, max_size=25)


@settings(max_examples=20, deadline=None)
@given(before=lines, batch=lines)
def test_load_leaves_what_one_put_at_a_time_leaves(tmp_path_factory, before, batch):
    """A bulk load (versions looked up and written in batches, a key written twice in one
    file) ends with the records, surviving versions and superseded lists that the same
    writes one by one through the API leave."""
    root = tmp_path_factory.mktemp("load")
    a, b = root / "a", root / "b"
    for p in (a, b):
        Site.init_family(p, "fam", "s", "lww").close()
    clock = iter(range(10**6, 10**7, 1000))

    def write(site: Site, rows) -> None:
        with site.transaction() as tx:
            for coll, key, v in rows:
                tx.put(coll, key, v[1]) if v else tx.delete(coll, key)

    f = root / "batch.jsonl"
    f.write_text("".join(json.dumps({"collection": c, "key": k, "value": v[1]} if v else
                                    {"collection": c, "key": k, "delete": True}) + "\n"
                         for c, k, v in batch))
    for p, bulk in ((a, True), (b, False)):
        with Site.open(p, clock=lambda: 0) as s:
            write(s, before)
        if bulk:
            with Site.open(p) as s:
                inspection.load(s, f)
        else:
            with Site.open(p) as s:
                write(s, batch)
    with Site.open(a) as sa, Site.open(b) as sb:
        assert list(sa.records()) == list(sb.records())

        def shape(s: Site):
            # CSNs differ between the two sites (their clocks and ids); compare what each op
            # superseded as positions in the site's own history
            ops = list(s.iter_changelog(s.site_id, 0, 10**9))
            pos = {o.csn: i for i, o in enumerate(ops)}
            return ([(o.collection, o.key, o.value,
                      [pos[o.replaced[i:i + 20]] for i in range(0, len(o.replaced), 20)])
                     for o in ops if not o.collection.startswith("$")],
                    sorted((r.collection, r.key, pos[r.csn]) for r in s.iter_versions()
                           if not r.collection.startswith("$")))
        assert shape(sa) == shape(sb)


@settings(max_examples=10, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=1, max_size=30))
def test_own_epoch_clock_and_csn_lookup_come_from_the_changelog(tmp_path_factory, sizes):
    """Small transactions write only their changelog rows and versions: the site's own epoch,
    its clock and the lookup of a CSN by bisecting epochs must still see every op, and they
    must carry over once the ops are sealed and the changelog is emptied."""
    p = tmp_path_factory.mktemp("tip") / "a"
    Site.init_family(p, "fam", "a").close()
    with Site.open(p) as s:
        for t, n in enumerate(sizes):
            with s.transaction() as tx:
                for i in range(n):
                    tx.put("c", f"k{t}-{i}", i)
        ops = list(s.iter_changelog(s.site_id, 0, 10**9))
        assert s.vector()[s.site_id] == ops[-1].epoch == 2 + sum(sizes)
        assert s.last_hlc() == ops[-1].hlc
        for op in ops:
            assert chain.epoch_of(s.conn, op.hlc, op.origin, op.seq) == op.epoch
        assert chain.epoch_of(s.conn, ops[-1].hlc + 1, s.site_id, 0) is None
        with s.write_txn():
            s.seal_pending()
        assert not chain.has_pending(s.conn, s.site_id)
        assert s.vector()[s.site_id] == ops[-1].epoch and s.last_hlc() == ops[-1].hlc
        with s.transaction() as tx:
            tx.put("c", "after", 1)
        assert s.vector()[s.site_id] == ops[-1].epoch + 1
        assert s.last_hlc() > ops[-1].hlc


def test_one_put_commit_writes_two_or_three_small_pages(tmp_path):
    """A new store has 4 KiB pages and keys its changelog by epoch (a rowid table): a one-put
    transaction appends one version and one changelog row, and its commit writes about 2.6
    WAL pages (a clustered changelog re-balanced three pages every few commits: 3.1; 16 KiB
    pages made each of them four times the bytes to wait for)."""
    p = tmp_path / "a"
    Site.init_family(p, "fam", "a").close()
    with Site.open(p) as s:
        c = s.conn
        assert c.execute("PRAGMA page_size").fetchone()[0] == 4096
        sql = c.execute("SELECT sql FROM sqlite_schema WHERE name='changelog'").fetchone()[0]
        assert "epoch INTEGER PRIMARY KEY" in sql and "WITHOUT ROWID" not in sql
        c.execute("PRAGMA wal_autocheckpoint=0")
        with s.transaction() as tx:
            tx.put("c", "k-warm", 0)
        wal = p / "syncpack.db-wal"
        before, n = wal.stat().st_size, 300
        for i in range(n):
            with s.transaction() as tx:
                tx.put("c", f"k{i:05d}", "v" * 100)
        frames = (wal.stat().st_size - before) / (4096 + 24) / n
        assert 2.0 <= frames <= 3.0, frames
        assert len(list(s.iter_changelog(s.site_id, 0, 10**9))) == n + 3


def test_a_clustered_changelog_migrates_to_one_keyed_by_epoch(tmp_path):
    """Stores before the changelog_by_epoch migration kept the changelog clustered by
    (origin, epoch): the migration moves its rows into the rowid table keyed by epoch, and
    the site's unsealed ops, epoch, clock and CSN look-ups are the same after it."""
    import sqlite3
    from syncpack.store.db import MIGRATIONS
    step = next(m for m in MIGRATIONS if "changelog_by_epoch" in m)
    p = tmp_path / "a"
    Site.init_family(p, "fam", "a").close()
    with Site.open(p) as s:
        for t in range(5):
            with s.transaction() as tx:
                for i in range(t + 1):
                    tx.put("c", f"k{t}-{i}", i)
        before = (list(s.iter_changelog(s.site_id, 0, 10**9)), s.vector(), s.last_hlc())
    with sqlite3.connect(p / "syncpack.db") as c:
        c.executescript("""
            CREATE TABLE old(origin BLOB NOT NULL, epoch INTEGER NOT NULL, hlc INTEGER NOT NULL,
                seq INTEGER NOT NULL, collection TEXT NOT NULL, key TEXT NOT NULL, value BLOB,
                replaced BLOB NOT NULL, PRIMARY KEY(origin, epoch)) WITHOUT ROWID;
            INSERT INTO old SELECT * FROM changelog;
            DROP TABLE changelog;
            ALTER TABLE old RENAME TO changelog;""")
        assert "WITHOUT ROWID" in c.execute(
            "SELECT sql FROM sqlite_schema WHERE name='changelog'").fetchone()[0]
        c.executescript(step)       # the migration's own statements, whatever its number
    with Site.open(p) as s:
        sql = s.conn.execute("SELECT sql FROM sqlite_schema WHERE name='changelog'").fetchone()[0]
        assert "epoch INTEGER PRIMARY KEY" in sql and "WITHOUT ROWID" not in sql
        ops = list(s.iter_changelog(s.site_id, 0, 10**9))
        assert (ops, s.vector(), s.last_hlc()) == before
        for op in ops:
            assert chain.epoch_of(s.conn, op.hlc, op.origin, op.seq) == op.epoch
        with s.transaction() as tx:
            tx.put("c", "after", 1)
        assert s.vector()[s.site_id] == ops[-1].epoch + 1
    assert run("fsck", site=p).code == 0


def test_a_load_in_many_batches_leaves_what_one_put_at_a_time_leaves(tmp_path, monkeypatch):
    """A load cut into replication transactions looks up only the keys a collection may hold
    (a range probe per batch): keys below, among and above those held, and a key written
    again in a later batch, are superseded exactly as by puts one at a time."""
    monkeypatch.setattr(loading, "LOAD_TXN_OPS", 3)
    a, b = tmp_path / "a", tmp_path / "b"
    for p in (a, b):
        Site.init_family(p, "fam", "s", "lww").close()
    held = [("c", "k10"), ("c", "k20"), ("d", "k15")]
    rows = [("c", "k05"), ("c", "k06"), ("d", "k01"), ("c", "k15"), ("c", "k20"),
            ("c", "k30"), ("c", "k31"), ("c", "k05"), ("d", "k15"), ("e", "k1")]
    f = tmp_path / "load.jsonl"
    f.write_text("".join(json.dumps({"collection": c, "key": k, "value": i}) + "\n"
                         for i, (c, k) in enumerate(rows)))
    for p in (a, b):
        with Site.open(p) as s:
            with s.transaction() as tx:
                for c, k in held:
                    tx.put(c, k, "old")
    with Site.open(a) as s:
        inspection.load(s, f)
    with Site.open(b) as s:
        with s.transaction() as tx:
            for i, (c, k) in enumerate(rows):
                tx.put(c, k, i)
    with Site.open(a) as sa, Site.open(b) as sb:
        assert list(sa.records()) == list(sb.records())
        for s in (sa, sb):
            # one surviving version per key: every earlier one was superseded
            keys = [(r.collection, r.key) for r in s.iter_versions()]
            assert len(keys) == len(set(keys))


new_lines = st.lists(
    st.tuples(st.sampled_from(["c", "d", "e"]), st.text("abkéz😀", min_size=1, max_size=4),
              st.one_of(st.just(None), values.map(lambda v: ("v", v)))),
    min_size=1, max_size=40, unique_by=lambda t: (t[0], t[1]))


@settings(max_examples=15, deadline=None)
@given(rows=new_lines, batch=st.integers(1, 9))
def test_a_load_of_new_keys_as_columns_leaves_what_puts_leave(tmp_path_factory, rows, batch):
    """Batches of keys no collection holds yet go as columns, sealed without an object per op
    (what a first load of a large file does past chain.SEAL_AT_COMMIT records a batch, made
    small here): the records, the surviving versions and what a peer imports are those that
    the same writes one at a time leave, in any key order and mix of collections."""
    root = tmp_path_factory.mktemp("cols")
    a, b = root / "a", root / "b"
    for p in (a, b):
        Site.init_family(p, "fam", "s", "lww").close()
    f = root / "load.jsonl"
    f.write_text("".join(json.dumps({"collection": c, "key": k, "value": v[1]} if v else
                                    {"collection": c, "key": k, "delete": True}) + "\n"
                         for c, k, v in rows))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(chain, "SEAL_AT_COMMIT", 2)
        mp.setattr(loading, "LOAD_TXN_OPS", batch)
        with Site.open(a) as s:
            assert inspection.load(s, f)["loaded"] == len(rows)
    with Site.open(b) as s:
        with s.transaction() as tx:
            for c, k, v in rows:
                tx.put(c, k, v[1]) if v else tx.delete(c, k)
    with Site.open(a) as sa, Site.open(b) as sb:
        assert list(sa.records()) == list(sb.records())

        def held(s: Site):
            return sorted((r.collection, r.key, r.value) for r in s.iter_versions()
                          if not r.collection.startswith("$"))
        assert held(sa) == held(sb)
        ops = list(sa.iter_changelog(sa.site_id, 0, 10**9))
        assert [o.epoch for o in ops] == list(range(1, len(ops) + 1))
    assert run("fsck", site=a).code == 0


@pytest.mark.parametrize("parser", ["here", "child"])
def test_a_bad_line_after_batches_were_written_loads_nothing(tmp_path, monkeypatch, parser):
    """Batches are written as the file is read (parsed here, or by the child process of a
    large file): a bad line after some of them rolls the whole file back (one store
    transaction), and the site is as it was."""
    if parser == "child":
        monkeypatch.setattr(loading, "ELSEWHERE_AT", 0)
    monkeypatch.setattr(loading, "LOAD_TXN_OPS", 3)
    monkeypatch.setattr(chain, "SEAL_AT_COMMIT", 2)
    p = tmp_path / "a"
    Site.init_family(p, "fam", "a").close()
    with Site.open(p) as s:
        with s.transaction() as tx:
            tx.put("c", "kept", 1)
        before = (list(s.records()), s.vector())
    f = tmp_path / "load.jsonl"
    f.write_text("".join(json.dumps({"collection": "c", "key": f"k{i}", "value": i}) + "\n"
                         for i in range(10)) + "{not json\n")
    r = run("load", f, site=p)
    assert r.code == 1 and "line 11" in r.err and "nothing was loaded" in r.err, r.err
    with Site.open(p) as s:
        assert (list(s.records()), s.vector()) == before
        with s.transaction() as tx:         # and the next write carries on from there
            tx.put("c", "after", 2)
    assert run("fsck", site=p).code == 0


def test_local_transactions_follow_commits_made_elsewhere(tmp_path):
    """A site keeps its epoch and clock in memory between its own transactions; a commit by
    another connection or process in between (another Site on the store, a CLI put, an
    import) is seen, so epochs stay one gapless history."""
    p = tmp_path / "a"
    Site.init_family(p, "fam", "a").close()
    with Site.open(p) as s1, Site.open(p) as s2:
        for i in range(3):
            with s1.transaction() as tx:
                tx.put("c", f"one{i}", i)
            with s2.transaction() as tx:
                tx.put("c", f"two{i}", i)
            assert run("put", "c", f"cli{i}", str(i), site=p).code == 0
        with s1.transaction() as tx:
            tx.put("c", "last", 0)
        ops = list(s1.iter_changelog(s1.site_id, 0, 10**9))
        assert [o.epoch for o in ops] == list(range(ops[0].epoch, ops[0].epoch + len(ops)))
        assert [o.csn for o in ops] == sorted(o.csn for o in ops)
        assert s1.get("c", "cli2") == 2 and s2.get("c", "last") == 0
    assert run("fsck", site=p).code == 0


def test_the_decompress_worker_hands_back_results_and_errors_in_order():
    """pipeline.Worker (the import's read-ahead): each call's result or exception reaches the
    one who asks, in order; leaving drops the calls not begun and no thread is left."""
    import threading

    from syncpack.pipeline import Worker
    gate = threading.Event()
    with Worker("test-worker") as w:
        first = w.submit(lambda: gate.wait(5) and "first")
        bad = w.submit(int, "not a number")
        third = w.submit(sum, [1, 2, 3])
        gate.set()
        assert first.result() == "first" and third.result() == 6
        with pytest.raises(ValueError):
            bad.result()
    blocker = threading.Event()
    with Worker("test-worker-2") as w:
        w.submit(blocker.wait, 0.2)
        dropped = w.submit(sum, [1])
    with pytest.raises(RuntimeError, match="dropped"):
        dropped.result()
    assert not any(t.name.startswith("test-worker") for t in threading.enumerate())


def test_a_ctrl_c_while_the_worker_starts_its_thread_stays_a_ctrl_c(monkeypatch):
    """Ctrl-C inside the thread's start() (the import test hit it once in CI): leaving the
    block joined a thread never started, and the user saw "internal error: cannot join
    thread before it is started" instead of the interruption."""
    import threading

    from syncpack.pipeline import Worker

    def interrupted(self):
        raise KeyboardInterrupt
    monkeypatch.setattr(threading.Thread, "start", interrupted)
    with pytest.raises(KeyboardInterrupt):
        with Worker("test-worker-3") as w:
            w.submit(sum, [1])


def test_an_import_loads_no_attach_code_and_no_key_file_formats(tmp_path):
    """An import at a site with no database attached starts without the attached-database
    code, and an unsealed packet without the sealing code or cryptography's key-file formats
    (only a sealed packet, or a site with a database attached, needs them)."""
    from conftest import Family
    fam = Family(tmp_path)
    fam.init("a")
    fam.add("b", via="a")
    with fam.open("a") as s, s.transaction() as tx:
        tx.put("c", "k", 1)
    out = list(fam.export("a", "b"))
    probe = _PROBE.format(heavy=("syncpack.attach.core", "syncpack.attach.applying", "syncpack.format.seal",
                                 "cryptography.hazmat.primitives.serialization",
                                 "syncpack.exchange.apply"))
    r = subprocess.run([sys.executable, "-c", probe, str(fam.path("b")), "import",
                        *map(str, out)], capture_output=True, text=True)
    line = [x for x in r.stderr.splitlines() if x.startswith("HEAVY")]
    assert line and line[-1].split(" ", 1)[1].split(",") == ["syncpack.exchange.apply"], r
    assert "1 packet(s) applied" in r.stdout + r.stderr, r
