"""Capture of an attached table in bulk (issue 21, docs/attach.md): one capture is one
replication transaction whatever its size, sealed as parts while it is read, so a peer sees
all of a large backlog or none of it; and the bulk encoders give exactly the records and blocks
the one-by-one ones give."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from operator import itemgetter
from pathlib import Path

import apsw
import pytest
from hypothesis import example, given, settings, strategies as st

from syncpack import site as site_mod
from syncpack.attach import core, reader, rows
from syncpack.format import blocks, codec
from syncpack.format.codec import Op
from syncpack.store import appdb, chain

from conftest import run
from test_attach import SCHEMA, app, make_family, schema_text, sp, table



def _child_starts(monkeypatch) -> list[bool]:
    """Whether each reader.Elsewhere made from now on started its child (appended as made)."""
    started: list[bool] = []
    real_init = reader.Elsewhere.__init__

    def init(self, *a, **k):
        real_init(self, *a, **k)
        started.append(bool(self))
    monkeypatch.setattr(reader.Elsewhere, "__init__", init)
    return started

def _own_blocks(site_dir: Path) -> list[blocks.BlockInfo]:
    with site_mod.Site.open(site_dir) as s:
        return [blocks.read_block_header(data) for o, _lo, _hi, data in chain.block_rows(s.conn)
                if o == s.site_id]


@pytest.mark.parametrize("part_ops", [7, 10])
def test_backlog_beyond_a_block_reaches_a_peer_as_one_transaction(tmp_path, monkeypatch,
                                                                   part_ops):
    # A block of at most 10 changes: the backlog of 35 changes (one application transaction
    # of 40 rows, then one of updates and deletes) is beyond one block, and must still be one
    # transaction.  Parts of 10 rows of 8 KB are larger than the export's medium: the export
    # seals them again, smaller.
    monkeypatch.setattr(blocks, "MAX_BLOCK_OPS", 10)
    monkeypatch.setattr(chain, "MAX_TXN_OPS", 10)
    monkeypatch.setattr(site_mod, "PART_OPS", part_ops)
    sites = make_family(tmp_path, ("a", "b"))
    dbs = {n: tmp_path / f"{n}.db" for n in sites}
    for db in dbs.values():
        app(db, SCHEMA)
    for n in sites:
        sp(sites[n], "attach", dbs[n], "--table", "items")
    app(dbs["a"], [f"INSERT INTO items VALUES ('k{i:03d}', {i}, {i} / 3.0, "
                   f"hex(randomblob(20)), randomblob(8000), NULL)" for i in range(40)],
        [f"UPDATE items SET i = -i WHERE id = 'k{i:03d}'" for i in range(5)]
        + [f"DELETE FROM items WHERE id = 'k{i:03d}'" for i in range(35, 40)]
        + ["INSERT INTO items(id, i) VALUES ('born', 1)", "DELETE FROM items WHERE id='born'"])
    r = run("capture", site=sites["a"], json_mode=True)
    assert r.code == 0 and r.json["captured"] == 35, r
    held = _own_blocks(sites["a"])
    parts = [b for b in held if b.hlc_first == held[-1].hlc_first]      # one transaction
    k = -(-35 // part_ops)
    assert len(parts) == k
    assert [p.flags for p in parts] == [blocks.FLAG_MORE] + [
        blocks.FLAG_MORE | blocks.FLAG_CONT] * (k - 2) + [blocks.FLAG_CONT]
    assert all(p.hi - p.lo <= part_ops for p in parts)

    usb = tmp_path / "usb"
    sp(sites["a"], "export", "--to", "b", "--out", usb, "--create-out", "--max-size", "64K")
    files = sorted(usb.rglob("*.spk"))
    assert len(files) >= 3
    for f in files[:-1]:
        sp(sites["b"], "import", f)
        # the peer shows none of the application's transaction until its last part is there
        assert table(dbs["b"], "items") == []
        assert run("get", "items", "k000", site=sites["b"]).code != 0
        sp(sites["b"], "fsck")
    sp(sites["b"], "import", files[-1])
    assert len(table(dbs["b"], "items")) == 35
    assert table(dbs["b"], "items") == table(dbs["a"], "items")
    for n in sites:
        sp(sites[n], "fsck")


def test_a_large_capture_then_local_writes_in_one_store_transaction(tmp_path, monkeypatch):
    """A later capture of updates and deletes of the keys captured in parts supersedes them
    (the general path), and the chain stays one for the peer."""
    monkeypatch.setattr(site_mod, "PART_OPS", 5)
    sites = make_family(tmp_path, ("a", "b"))
    dbs = {n: tmp_path / f"{n}.db" for n in sites}
    for db in dbs.values():
        app(db, SCHEMA)
    for n in sites:
        sp(sites[n], "attach", dbs[n], "--table", "items", "--table", "pairs")
    app(dbs["a"], [["INSERT INTO items(id, i) VALUES (?, ?)", [f"k{i}", i]] for i in range(23)]
        + [["INSERT INTO pairs VALUES (?, ?, ?)", [f"p{i}", i, "hex:00"]] for i in range(9)])
    sp(sites["a"], "capture")
    app(dbs["a"], ["UPDATE items SET i = i + 100", "DELETE FROM pairs WHERE b < 4"])
    sp(sites["a"], "capture")
    app(dbs["b"], ["INSERT INTO items(id, i) VALUES ('from-b', 1)"])
    for a, b in (("a", "b"), ("b", "a")):
        out = tmp_path / f"drop-{a}"
        sp(sites[a], "export", "--to", b, "--out", out, "--create-out")
        sp(sites[b], "import", out)
    for t in ("items", "pairs"):
        assert table(dbs["a"], t) == table(dbs["b"], t)
    assert len(table(dbs["b"], "items")) == 24 and len(table(dbs["b"], "pairs")) == 5
    for n in sites:
        sp(sites[n], "fsck")


def _capture_twice(root: Path) -> list[tuple]:
    """A site's records after two captures of an application's writes: every SQLite type,
    composite, REAL and BLOB keys, keys born and gone, then updates and deletes over held
    versions (the general path)."""
    root.mkdir()
    sites = make_family(root, ("a",))
    db = root / "a.db"
    app(db, SCHEMA)
    sp(sites["a"], "attach", db, "--table", "items", "--table", "pairs", "--table", "counters")
    app(db, [f"INSERT INTO items VALUES ('k{i:02d}', {i * 1000003}, {i} / 7.0, 'té{i}', "
             f"CAST('b{i}' AS BLOB), {'NULL' if i % 3 else i / 2})" for i in range(30)]
        + ["INSERT INTO items(id) VALUES ('[not plain')", "INSERT INTO items(id) VALUES ('born')",
           "DELETE FROM items WHERE id = 'born'"]
        + [f"INSERT INTO pairs VALUES ('p{i}', {i}, x'0{i}')" for i in range(5)]
        + [f"INSERT INTO counters VALUES ({i - 3}, {i} * 0.5)" for i in range(6)])
    assert run("capture", site=sites["a"]).code == 0
    app(db, ["UPDATE items SET i = -i WHERE id < 'k10'", "DELETE FROM items WHERE id > 'k25'",
             "DELETE FROM pairs WHERE b = 2", "UPDATE counters SET v = 'x' WHERE id = -3"])
    assert run("capture", site=sites["a"]).code == 0
    with site_mod.Site.open(sites["a"]) as s:
        return [(r.collection, r.key, r.value) for r in s.iter_versions()
                if not r.collection.startswith("$")]


def test_a_capture_read_by_the_reader_process_is_the_capture_read_here(tmp_path, monkeypatch):
    """A large capture's rows are read by a child process (attach/reader.py): the store gets
    exactly what reading them in this process gives."""
    monkeypatch.setattr(reader, "ELSEWHERE_AT", 10 ** 12)
    here = _capture_twice(tmp_path / "here")
    monkeypatch.setattr(reader, "ELSEWHERE_AT", 1)
    started = _child_starts(monkeypatch)
    child = _capture_twice(tmp_path / "child")
    assert started and all(started)
    assert child == here and len(here) > 30


def test_the_reader_process_is_not_used_on_another_snapshot(tmp_path):
    """The child's snapshot must hold what the caller's holds: another highest change number
    or schema version, and it declines (the caller reads the rows itself); a failure while
    reading is raised here, and the child is always waited for."""
    db = tmp_path / "a.db"
    app(db, SCHEMA)
    conn = appdb.open_app(db)
    t = appdb.table_info(conn, "items")
    with appdb.write_txn(conn):
        appdb.install_capture(conn, t)
    app(db, [f"INSERT INTO items(id) VALUES ('k{i}')" for i in range(3)])
    upto, schema = appdb.max_seq(conn), appdb.schema_version(conn)
    for wrong in (dict(upto=upto - 1), dict(schema=schema + 1)):
        e = reader.Elsewhere(str(db), [t], 0, **{"upto": upto, "schema": schema, **wrong})
        assert not e
        e.close()
    e = reader.Elsewhere(str(db), [t], 0, upto, schema)
    assert e
    got = [kr for kr in e.changes()]
    e.close()
    assert [k for keys, _raws in got for k in keys] == ["k0", "k1", "k2"]
    gone = appdb.TableInfo("nosuch", "", ["id"], ["id"], {}, False, [], [])
    e = reader.Elsewhere(str(db), [gone], 0, upto, schema)
    assert e
    with pytest.raises(core.AttachError, match="no such table: nosuch"):
        list(e.changes())
    e.close()
    assert e.child.proc is None       # waited for
    conn.close()


_RANDOM_ROWS = r"""
import random, sqlite3, sys
c = sqlite3.connect(sys.argv[1], timeout=30, isolation_level=None)
rnd = random.Random(int(sys.argv[3]))
c.execute("BEGIN")
c.executemany("INSERT INTO items(id, t) VALUES (?, ?)",
              ((f"{rnd.random():.15f}", "x" * 300) for _ in range(int(sys.argv[2]))))
c.execute("COMMIT")
"""


def test_a_capture_into_a_large_store_whose_statements_journal_many_pages_succeeds(tmp_path):
    """A capture of rows of random keys into a store already large: each insert of 10,000
    rows changes thousands of the store's pages, which SQLite journals for that statement.
    With the journal kept in memory up to 16 MiB (SQLITE_CONFIG_STMTJRNL_SPILL), this SQLite
    failed as it spilled ('database or disk is full', with the disk nearly empty), at every
    retry: the backlog could never be captured.  Through the command, in processes of its
    own, as an administrator runs it."""
    sites = make_family(tmp_path, names=("a",))
    db = tmp_path / "a.db"
    app(db, SCHEMA)
    sp(sites["a"], "attach", db, "--table", "items")

    def command(*args):
        return subprocess.run([sys.executable, "-m", "syncpack", "--site", str(sites["a"]),
                               *map(str, args)], capture_output=True, text=True)

    for rows_, seed in ((120_000, 1), (20_000, 2)):
        subprocess.run([sys.executable, "-c", _RANDOM_ROWS, str(db), str(rows_), str(seed)],
                       check=True)
        r = command("capture")
        assert r.returncode == 0, r.stderr
    r = command("--json", "attached")
    assert r.returncode == 0, r.stderr
    [t] = [t for t in json.loads(r.stdout)["tables"] if t["table"] == "items"]
    assert (t["rows"], t["pending"]) == (140_000, 0)
    assert command("fsck").returncode == 0


def test_a_capture_of_keys_whose_peer_records_wait_decodes_each_block_once(tmp_path,
                                                                          monkeypatch):
    """Keys whose peer records wait at a clash (a UNIQUE value taken here), then written by
    the application: the capture looks up what each waiting record replaced.  Asked key by
    key, that decoded a block per key (a site with 51k keys waiting took 97 s to import);
    each block is now decoded once per part of the capture."""
    monkeypatch.setattr(chain, "SEAL_AT_COMMIT", 10)    # each transaction its own block
    sites = make_family(tmp_path, names=("a", "b"))
    dbs = {n: tmp_path / f"{n}.db" for n in sites}
    for n in sites:
        app(dbs[n], ["CREATE TABLE t(id TEXT PRIMARY KEY, u INTEGER UNIQUE, v)"])
        sp(sites[n], "attach", dbs[n], "--table", "t")
    n_keys = 400
    for part in range(4):       # four transactions, keys interleaved across them
        app(dbs["a"], [f"INSERT INTO t VALUES ('k{i:04d}', {i}, 'a')"
                       for i in range(part, n_keys, 4)])
        sp(sites["a"], "capture")
    app(dbs["b"], [f"INSERT INTO t VALUES ('z{i:04d}', {i}, 'b')" for i in range(n_keys)])
    out = tmp_path / "x"
    sp(sites["a"], "export", "--to", "b", "--out", out, "--create-out")
    sp(sites["b"], "import", out)
    assert len(run("--json", "conflicts", site=sites["b"]).json["conflicts"]) >= n_keys
    app(dbs["b"], [f"INSERT INTO t VALUES ('k{i:04d}', {n_keys + i}, 'b2')"
                   for i in range(n_keys)])
    decoded = []
    real = blocks.decode_ops
    monkeypatch.setattr(blocks, "decode_ops", lambda data: decoded.append(1) or real(data))
    sp(sites["b"], "capture")
    # a bound in blocks, not in keys (16 measured: a few passes over the four blocks; 400,
    # one per key, before)
    assert 0 < len(decoded) < n_keys // 10, len(decoded)
    assert run("fsck", site=sites["b"]).code == 0


_COMMIT_WAITING = r"""
import sqlite3, sys, time
c = sqlite3.connect(sys.argv[1], timeout=30, isolation_level=None)
c.execute("BEGIN IMMEDIATE")
c.execute("INSERT INTO items(id) VALUES ('late')")
t0 = time.monotonic()
c.execute("COMMIT")
print(time.monotonic() - t0)
"""


_LOCKED_OUT = r"""
import sqlite3, sys, time
probe = sqlite3.connect(sys.argv[1], timeout=0)
while True:
    try:
        probe.execute("SELECT count(*) FROM sqlite_schema").fetchone()
    except sqlite3.OperationalError:
        break
    time.sleep(0.02)
"""


def test_the_reader_process_declines_at_once_when_an_application_commit_waits(tmp_path):
    """With a rollback journal, an application's COMMIT that waits for the capture's read
    lock to end keeps every new reader out: the reader process must decline at once (the
    caller reads the rows itself and ends its read), not wait for the lock while the caller
    waits for it, until the application's COMMIT fails on its busy timeout."""
    db = tmp_path / "a.db"
    app(db, SCHEMA)
    conn = appdb.open_app(db)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    t = appdb.table_info(conn, "items")
    with appdb.write_txn(conn):
        appdb.install_capture(conn, t)
    app(db, [f"INSERT INTO items(id) VALUES ('k{i}')" for i in range(3)])
    with appdb.read_txn(conn):
        upto, schema = appdb.max_seq(conn), appdb.schema_version(conn)
        writer = subprocess.Popen([sys.executable, "-c", _COMMIT_WAITING, str(db)],
                                  stdout=subprocess.PIPE, text=True)
        # until its COMMIT holds the PENDING lock (seen from another process: SQLite grants a
        # connection of this one the read lock this one already holds)
        subprocess.run([sys.executable, "-c", _LOCKED_OUT, str(db)], check=True, timeout=30)
        t0 = time.monotonic()
        e = reader.Elsewhere(str(db), [t], 0, upto, schema)
        took = time.monotonic() - t0
        assert not e
        e.close()
        assert writer.poll() is None        # still waiting for our read
    out, _ = writer.communicate(timeout=60)
    assert writer.returncode == 0 and float(out) < 25
    assert took < 10
    conn.close()


# --- the bulk encoders are the one-by-one ones ----------------------------------------------

_sqlite_value = st.one_of(
    st.none(), st.integers(-2 ** 63, 2 ** 63 - 1), st.floats(allow_nan=False),
    st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40),
    st.binary(max_size=40))


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 20), st.data())
def test_row_encoder_and_keys_equal_encode_value_and_encode_key(tmp_path_factory, ncols, data):
    """Records packed from interleaved names and values, and keys spelt by SQLite or read in
    bulk from the rows, are the bytes and strings codec.encode_value and rows.encode_key give (up to 20 columns: every
    msgpack header size a table can need below 65,536 columns)."""
    path = tmp_path_factory.mktemp("enc") / "app.db"
    cols = [f"c{i}" for i in range(ncols)]
    npk = data.draw(st.integers(1, min(2, ncols)))
    # the key's columns anywhere in the table, in any order
    pkcols = data.draw(st.permutations(cols))[:npk]
    at = [cols.index(c) for c in pkcols]
    conn = apsw.Connection(str(path))
    conn.execute(f"CREATE TABLE t({', '.join(cols)}, PRIMARY KEY({', '.join(pkcols)}))")
    t = appdb.table_info(conn, "t")
    with appdb.write_txn(conn):
        appdb.install_capture(conn, t)
    rows_in = data.draw(st.lists(st.tuples(*[_sqlite_value] * ncols), max_size=12,
                                 unique_by=lambda r: tuple(repr(r[i]) for i in at)))
    if npk == 1:        # also the common keys: integers and plain text
        rows_in += [tuple(k if i == at[0] else None for i in range(ncols))
                    for k in (7, -2 ** 63, "plain", "[not plain", "")]
    for r in rows_in:
        conn.execute(f"INSERT OR REPLACE INTO t VALUES ({', '.join('?' * ncols)})", r)
    gone = tuple(rows_in[0][i] for i in at) if rows_in else None
    if gone is not None:
        conn.execute(f"DELETE FROM t WHERE {' AND '.join(f'{c} IS ?' for c in pkcols)}",
                     gone)
    with appdb.read_txn(conn):
        got = [kr for keys, raws in reader.changes(conn, t, 0, 1 << 62) for kr in zip(keys, raws)]
        want = list(appdb.changed_rows(conn, t, 0, 1 << 62))
    conn.close()
    # a table not ordered by change gives its rows present, then its keys gone: compared by key
    assert len(got) == len(want)
    assert sorted(got, key=itemgetter(0)) == sorted(
        ((rows.encode_key(k, npk == 1),
          None if r is None else codec.encode_value(dict(zip(cols, r)))) for _s, k, r in want),
        key=itemgetter(0))


_key_value = st.one_of(
    st.integers(-2 ** 63, 2 ** 63 - 1), st.floats(allow_nan=False), st.binary(max_size=6),
    st.text(alphabet="[]\0ab", max_size=6))


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 3), st.data())
def test_keys_read_in_bulk_are_those_encode_key_spells(width, data):
    """rows.keys_at spells the keys of a whole part at once (all TEXT, or all INTEGER, in
    C): whatever the mix of types, and texts that start with '[' or hold one after NUL, each
    key is what rows.encode_key gives its values."""
    kinds = data.draw(st.sampled_from([_key_value, st.integers(-5, 5), st.text(alphabet="[\0a")]))
    keys = data.draw(st.lists(st.tuples(*[kinds] * width), max_size=8))
    at = [2 * i + 1 for i in range(width)]
    part = [tuple(x for v in k for x in ("name", v)) for k in keys]
    assert rows.keys_at(part, at) == [rows.encode_key(k, width == 1) for k in keys]
    assert rows.keys_at([("c", "a\0[b")], [1]) == ["a\0[b"]


_op = st.one_of(
    st.tuples(st.just("put"), st.integers(0, 6), st.integers(0, 3)),
    st.tuples(st.just("rekey"), st.integers(0, 6), st.integers(0, 6)),
    st.tuples(st.just("delete"), st.integers(0, 6), st.just(0)),
    st.tuples(st.just("delete_all"), st.just(0), st.just(0)))


@settings(max_examples=60, deadline=None)
@given(st.lists(_op, max_size=25), st.integers(0, 25), st.booleans())
# one change since the cut, whose REPLACE removed another key's row (a UNIQUE clash)
@example(ops=[("put", 1, 0), ("put", 2, 0)], cut=1, composite=False)
@example(ops=[("put", 1, 0), ("put", 2, 0)], cut=1, composite=True)
def test_the_changed_rows_are_those_of_each_key_changed(tmp_path_factory, ops, cut, composite):
    """Whatever the application did since a point (rows put and put again, replaced, given
    another key, deleted, deleted and put back), the rows a capture reads are exactly each
    key changed since then, with its row or as gone: the same as the grouped join by key
    (changed_rows) gives, though found another way (changed_records)."""
    path = tmp_path_factory.mktemp("chg") / "app.db"
    conn = apsw.Connection(str(path))
    if composite:
        conn.execute("CREATE TABLE t(a TEXT, b INTEGER, v UNIQUE, PRIMARY KEY(a, b))")
        key = lambda k: (f"k{k % 3}", k)     # noqa: E731
        where, kcols = "a = ? AND b = ?", "a, b"
    else:
        conn.execute("CREATE TABLE t(a TEXT PRIMARY KEY, v UNIQUE)")
        key = lambda k: (f"k{k}",)     # noqa: E731
        where, kcols = "a = ?", "a"
    t = appdb.table_info(conn, "t")
    with appdb.write_txn(conn):
        appdb.install_capture(conn, t)
    since = 0
    for i, (kind, k, x) in enumerate(ops):
        if i == cut:
            since = appdb.max_seq(conn)
        marks = ", ".join("?" * len(t.pk))
        if kind == "put":
            conn.execute(f"INSERT OR REPLACE INTO t({kcols}, v) VALUES ({marks}, ?)", key(k) + (x,))
        elif kind == "rekey":
            sets = ", ".join(f"{c} = ?" for c in t.pk)
            conn.execute(f"UPDATE OR REPLACE t SET {sets} WHERE {where}", key(x) + key(k))
        elif kind == "delete":
            conn.execute(f"DELETE FROM t WHERE {where}", key(k))
        else:
            conn.execute("DELETE FROM t")
    npk = len(t.pk)
    with appdb.read_txn(conn):
        upto = appdb.max_seq(conn)
        got = [kr for keys, raws in reader.changes(conn, t, since, upto)
               for kr in zip(keys, raws)]
        want = list(appdb.changed_rows(conn, t, since, upto))
    conn.close()
    assert sorted(got, key=itemgetter(0)) == sorted(
        ((rows.encode_key(k, npk == 1),
          None if r is None else codec.encode_value(dict(zip(t.columns, r)))) for _s, k, r in want),
        key=itemgetter(0))


def test_a_capture_looks_up_the_keys_changed_whatever_the_statistics_say(tmp_path):
    """The application may have run ANALYZE when its table was small and never again: the
    capture must still look up each changed key, not scan the table (with an IN list, SQLite
    chose a scan of the whole table on such statistics, for any number of changes)."""
    conn = apsw.Connection(str(tmp_path / "app.db"))
    conn.execute("CREATE TABLE t(id TEXT PRIMARY KEY, v)")
    t = appdb.table_info(conn, "t")
    with appdb.write_txn(conn):
        appdb.install_capture(conn, t)
    with conn:
        conn.executemany("INSERT INTO t VALUES (?, 1)", [(f"k{i}",) for i in range(10)])
        for i in range(3000):
            conn.execute("UPDATE t SET v = ? WHERE id = ?", (i, f"k{i % 10}"))
    conn.execute("ANALYZE")
    statements: list[str] = []

    def trace(_cursor, sql, _bindings):
        statements.append(sql)
        return True
    conn.exec_trace = trace
    with appdb.read_txn(conn):
        upto = appdb.max_seq(conn)
        got = [r for _named, part in appdb.changed_records(conn, t, upto - 5, upto, 100)
               for r in part]
    conn.exec_trace = None
    assert len(got) == 5
    reads = [sql for sql in statements if sql.startswith("SELECT") and '"t"' in sql]
    assert reads
    for sql in reads:
        plan = [r[3] for r in conn.execute("EXPLAIN QUERY PLAN " + sql, ("t", upto - 5, upto))]
        assert not any(step.startswith("SCAN t") for step in plan), plan
    conn.close()


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 50_000), st.integers(1, 1 << 26), st.integers(1, 64),
       st.lists(st.tuples(st.integers(0, 50_000), st.integers(0, 1 << 30)), max_size=30))
def test_a_part_holds_about_the_byte_budget_and_grows_by_at_most_four(most, budget, first,
                                                                        seen):
    """rows.PartSizer: a part is 1..most rows; after a part of rows of p bytes each, the next
    is at most budget // p rows (but one) and at most four times the one before."""
    sizer = rows.PartSizer(most, budget, first)
    assert 1 <= sizer.rows() <= min(first, most) or sizer.rows() == 1
    for n, nbytes in seen:
        before = sizer.rows()
        sizer.saw(n, nbytes)
        after = sizer.rows()
        assert 1 <= after <= most
        if n:
            assert after <= max(1, 4 * before)
            assert after <= max(1, budget // max(1, nbytes // n))
        else:
            assert after == before


def test_a_capture_of_large_rows_reads_them_a_few_at_a_time(tmp_path):
    """Rows of 1 MiB each are read and handed on in parts of about the byte budget, not of
    CAPTURE_CHUNK rows held at once (1,500 such rows took a capture to 3.2 GB); small rows
    still come in parts of CAPTURE_CHUNK."""
    db = tmp_path / "a.db"
    app(db, ["CREATE TABLE photos(id TEXT PRIMARY KEY, img BLOB)"])
    conn = appdb.open_app(db)
    t = appdb.table_info(conn, "photos")
    with appdb.write_txn(conn):
        appdb.install_capture(conn, t)
    app(db, [f"INSERT INTO photos VALUES ('p{i}', randomblob(1048576))" for i in range(60)])
    with appdb.read_txn(conn):
        parts = [len(raws) for _keys, raws in reader.changes(conn, t, 0, appdb.max_seq(conn))]
    conn.close()
    assert sum(parts) == 60
    assert max(parts) <= reader.CAPTURE_BYTES // (1 << 20) + 1, parts
    small = rows.PartSizer(reader.CAPTURE_CHUNK, reader.CAPTURE_BYTES)
    for _ in range(8):
        small.saw(small.rows(), small.rows() * 100)
    assert small.rows() == reader.CAPTURE_CHUNK


def _ops(origin: bytes, lo: int, hlc: int, first_seq: int, colls, keys, values, replaced):
    return [Op(origin, lo + 1 + i, hlc, first_seq + i, c, k, v, r)
            for i, (c, k, v, r) in enumerate(zip(colls, keys, values, replaced))]


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_encode_columns_is_encode_block(data):
    family, origin = b"F" * 16, b"O" * 8
    n = data.draw(st.integers(1, 30))
    first_seq = data.draw(st.sampled_from([0, 0, 1, 5]))
    lo = first_seq + data.draw(st.integers(0, 3))
    more = data.draw(st.booleans())
    prev = bytes(32) if lo == 0 else b"p" * 32
    hlc = data.draw(st.integers(0, 2 ** 63 - 1))
    colls = data.draw(st.lists(st.sampled_from(["items", "pairs", "x"]), min_size=n,
                               max_size=n))
    keys = data.draw(st.lists(st.text(max_size=8, alphabet="abc[1"), min_size=n, max_size=n))
    values = data.draw(st.lists(st.one_of(st.none(), st.binary(max_size=20)), min_size=n,
                                max_size=n))
    csn = st.binary(min_size=20, max_size=20).map(lambda b: bytes([b[0] & 0x7f]) + b[1:])
    replaced = data.draw(st.lists(st.one_of(st.just(b""), csn, st.tuples(csn, csn).map(
        b"".join)), min_size=n, max_size=n))
    runs: list[tuple[str, int]] = []
    for c in colls:
        if runs and runs[-1][0] == c and data.draw(st.booleans()):
            runs[-1] = (c, runs[-1][1] + 1)     # runs may or may not be merged by the caller
        else:
            runs.append((c, 1))
    rep_at = [i for i, r in enumerate(replaced) if r]
    sign = lambda m: b"s" * 64      # noqa: E731 (the bytes signed are compared, not verified)
    got = blocks.encode_columns(family, origin, prev, lo, hlc, first_seq, runs, keys, values,
                                rep_at, [replaced[i] for i in rep_at], sign, more)
    want = blocks.encode_block(family, origin, prev,
                               _ops(origin, lo, hlc, first_seq, colls, keys, values, replaced),
                               sign, more=more)
    assert got == want


def test_encode_columns_refuses_what_encode_block_refuses():
    family, origin, sign = b"F" * 16, b"O" * 8, (lambda m: b"s" * 64)
    ok = dict(family=family, origin=origin, prev_hash=bytes(32), lo=0, hlc=5, first_seq=0,
              collections=[("c", 1)], keys=["k"], values=[b"v"], rep_at=[], rep=[], sign=sign)
    assert blocks.encode_columns(**ok)
    for bad in (dict(keys=[b"k"]), dict(values=["v"]), dict(collections=[("c", 2)]),
                dict(first_seq=1), dict(hlc=2 ** 63), dict(rep_at=[0], rep=[b"short"]),
                dict(keys=[], values=[], collections=[])):
        with pytest.raises(blocks.BlockEncodeError):
            blocks.encode_columns(**{**ok, **bad})


def test_bench_capture_smoke(tmp_path):
    """tools/bench_capture.py runs end to end at a tiny size and reports every figure."""
    tool = Path(__file__).resolve().parent.parent / "tools" / "bench_capture.py"
    r = subprocess.run([sys.executable, str(tool), "--rows", "500", "--repeat", "1", "--json",
                        "--dir", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["rows"] == 500
    for k in ("wall_s", "cpu_s", "rss_mb", "rows_per_s", "rows_per_cpu_s"):
        assert res[k] > 0, k


@pytest.mark.parametrize("elsewhere", [False, True])
def test_text_that_is_not_utf8_stops_the_capture_clearly_until_fixed(tmp_path, monkeypatch,
                                                                    elsewhere):
    """SQLite keeps any bytes as TEXT.  A row holding TEXT that is not UTF-8 stops the
    capture with a clear error (nothing captured, the changes kept); once the application
    corrects it, the capture goes on, and a key that was never UTF-8 and is gone again is no
    change at all."""
    monkeypatch.setattr(reader, "ELSEWHERE_AT", 1 if elsewhere else 10 ** 12)
    sites = make_family(tmp_path, ("a", "b"))
    dbs = {n: tmp_path / f"{n}.db" for n in sites}
    for n in sites:
        app(dbs[n], SCHEMA[:1])
        sp(sites[n], "attach", dbs[n], "--table", "items")
    app(dbs["a"], ["INSERT INTO items(id, t) VALUES ('ok', 'fine')",
                   "INSERT INTO items(id, t) VALUES ('x', CAST(x'ff80' AS TEXT))",
                   "INSERT INTO items(id, t) VALUES (CAST(x'fe' AS TEXT), 'y')"])
    r = run("capture", site=sites["a"])
    assert r.code == 1 and "not valid UTF-8" in r.err and "hint: " in r.err, r
    assert run("--json", "attached", site=sites["a"]).json["tables"][0]["pending"] == 3
    assert run("ls", "items", site=sites["a"]).out == ""
    # 'status' captures too, and fails as the capture did: it says so, where it had shown
    # nothing wrong while every capture, export and import failed
    st = run("--json", "status", site=sites["a"]).json["attached"]
    assert "not valid UTF-8" in st["failing"]["error"] and st["failing"]["hint"], st
    assert "FAILING since" in run("status", site=sites["a"]).out
    prom = run("status", "--format", "prometheus", site=sites["a"]).out
    assert 'syncpack_attached_failing{site="a"} 1' in prom
    app(dbs["a"], ["UPDATE items SET t = CAST(t AS BLOB) WHERE id = 'x'",
                   "DELETE FROM items WHERE id = CAST(x'fe' AS TEXT)"])
    sp(sites["a"], "capture")
    assert run("--json", "attached", site=sites["a"]).json["failing"] is None
    assert 'syncpack_attached_failing{site="a"} 0' in run(
        "status", "--format", "prometheus", site=sites["a"]).out
    out = tmp_path / "drop"
    out.mkdir()
    sp(sites["a"], "export", "--all", "--out", out)
    sp(sites["b"], "import", out)
    assert table(dbs["b"], "items") == table(dbs["a"], "items")
    assert [r[0] for r in table(dbs["b"], "items")] == ["ok", "x"]
    assert table(dbs["b"], "items")[1][6:8] == (b"\xff\x80", "blob")
    for n in sites:
        sp(sites[n], "fsck")


def test_a_row_larger_than_a_record_stops_the_capture_naming_it(tmp_path, monkeypatch):
    """A row whose record would exceed what one record may hold is named, and nothing is
    captured (no 'internal error', no block that cannot be sealed); once the application
    makes it smaller, the next capture takes everything.  Attaching a table holding one is
    refused, nothing attached."""
    monkeypatch.setattr(codec, "MAX_VALUE_BYTES", 10_000)
    from test_attach import attached_pair, exchange
    sites, dbs = attached_pair(tmp_path, ["CREATE TABLE f(id TEXT PRIMARY KEY NOT NULL, "
                                          "data BLOB)"], [], ["f"])
    app(dbs["a"], ["INSERT INTO f VALUES ('small', randomblob(100))",
                   "INSERT INTO f VALUES ('big', randomblob(20000))"])
    for cmd in (["capture"], ["export", "--to", "b", "--out", tmp_path / "out",
                              "--create-out"]):
        r = run(*cmd, site=sites["a"])
        assert r.code == 1 and "row 'big' of table 'f' is 20," in r.err, r
        assert "nothing was captured" in r.err and "internal" not in r.err, r
    assert run("get", "f", "small", site=sites["a"]).code != 0
    app(dbs["a"], ["UPDATE f SET data = randomblob(10) WHERE id = 'big'"])
    exchange(tmp_path, sites)
    assert table(dbs["a"], "f") == table(dbs["b"], "f") and len(table(dbs["b"], "f")) == 2
    app(dbs["b"], ["CREATE TABLE g(id TEXT PRIMARY KEY NOT NULL, data BLOB)",
                   "INSERT INTO g VALUES ('huge', randomblob(20000))"])
    r = run("attach", dbs["b"], "--table", "g", site=sites["b"])
    assert r.code == 1 and "row 'huge' of table 'g'" in r.err, r
    assert [t["table"] for t in run("--json", "attached", site=sites["b"]).json["tables"]] \
        == ["f"]
    for n in sites:
        assert run("fsck", site=sites[n]).code == 0


def _repeated(chars: int, ch: str) -> str:
    """SQL for a TEXT of ``chars`` characters ``ch``, made by SQLite: a key this long does not
    fit on the application's command line."""
    return f"replace(hex(zeroblob({chars})), '00', '{ch}')"


@pytest.mark.parametrize("elsewhere", [False, True])
def test_a_key_longer_than_a_block_reads_stops_the_capture_until_the_row_is_gone(
        tmp_path, monkeypatch, elsewhere):
    """A block's reader takes a key of at most blocks.MAX_STR_BYTES bytes of UTF-8.  A row
    whose record key was longer was captured and sealed into a block no site could read (the
    origin's own fsck failed), and every later change of the origin waited behind it at the
    peers for good.  The capture stops at it instead, naming it, with nothing captured, read
    here or by the reader process; once the application deletes the row (or shortens its
    key), the peer gets everything else.  A key of exactly the limit travels; a key is
    counted in bytes, and a BLOB key in hex."""
    monkeypatch.setattr(reader, "ELSEWHERE_AT", 1 if elsewhere else 10 ** 12)
    started = _child_starts(monkeypatch)
    from test_attach import exchange
    limit = blocks.MAX_STR_BYTES
    sites = make_family(tmp_path, ("a", "b"))
    dbs = {n: tmp_path / f"{n}.db" for n in sites}
    for n in sites:
        app(dbs[n], ["CREATE TABLE docs(path TEXT PRIMARY KEY NOT NULL, body TEXT)",
                     "CREATE TABLE bl(k BLOB PRIMARY KEY NOT NULL, v)"])
        sp(sites[n], "attach", dbs[n], "--table", "docs", "--table", "bl")
    # 'é' is two bytes of UTF-8: fewer characters than the limit, two bytes more
    app(dbs["a"], ["INSERT INTO docs VALUES ('short', 'ordinary')",
                   f"INSERT INTO docs VALUES ({_repeated(limit, 'p')}, 'just fits')",
                   f"INSERT INTO docs VALUES ({_repeated(limit // 2 + 1, 'é')}, 'too long')"])
    for cmd in (["capture"], ["export", "--to", "b", "--out", tmp_path / "out",
                              "--create-out"]):
        r = run(*cmd, site=sites["a"])
        assert r.code == 1 and (f"row '{'é' * 57}...' of table 'docs' has a key of "
                                f"{limit + 2:,} bytes") in r.err, r
        assert "nothing was captured" in r.err and "hint: give the row a shorter key" in r.err
    assert run("ls", "docs", site=sites["a"]).out == ""
    [docs] = [t for t in run("--json", "attached", site=sites["a"]).json["tables"]
              if t["table"] == "docs"]
    assert docs["pending"] == 3
    sp(sites["a"], "fsck")
    app(dbs["a"], ["DELETE FROM docs WHERE body = 'too long'"])
    sp(sites["a"], "capture")
    # 600,000 bytes of BLOB key are 1,200,000 hex digits in the record key
    app(dbs["a"], ["INSERT INTO bl VALUES (x'01', 'small')",
                   "INSERT INTO bl VALUES (zeroblob(600000), 'big')"])
    r = run("capture", site=sites["a"])
    assert r.code == 1 and "row '[{\"hex\":\"0000" in r.err, r
    assert "of table 'bl' has a key of 1,200,012 bytes" in r.err, r
    app(dbs["a"], ["UPDATE bl SET k = x'02' WHERE v = 'big'"])
    exchange(tmp_path, sites)
    assert [row[2] for row in table(dbs["b"], "docs")] == ["just fits", "ordinary"]
    assert table(dbs["b"], "docs") == table(dbs["a"], "docs")
    assert table(dbs["b"], "bl") == table(dbs["a"], "bl") and len(table(dbs["b"], "bl")) == 2
    for n in sites:
        sp(sites[n], "fsck")
    if elsewhere:
        assert started and all(started)


def test_attaching_a_table_holding_a_key_too_long_for_a_block_changes_nothing(tmp_path):
    """attach takes a table's rows as this site's changes: a table holding a row whose key no
    block can hold is refused, naming the row, and nothing changes, in the store or the file;
    once the application deletes the row, the attach takes the rest, which reaches the
    peer."""
    from test_attach import exchange
    sites = make_family(tmp_path, ("a", "b"))
    dbs = {n: tmp_path / f"{n}.db" for n in sites}
    for n in sites:
        app(dbs[n], ["CREATE TABLE items(id TEXT PRIMARY KEY NOT NULL, v)"])
        sp(sites[n], "attach", dbs[n], "--table", "items")
    app(dbs["a"], ["INSERT INTO items VALUES ('i1', 1)"])
    sp(sites["a"], "capture")
    app(dbs["a"], ["CREATE TABLE g(id TEXT PRIMARY KEY NOT NULL, v)",
                   "INSERT INTO g VALUES ('small', 1)",
                   f"INSERT INTO g VALUES ({_repeated(blocks.MAX_STR_BYTES + 1, 'q')}, 2)"])
    before = (schema_text(dbs["a"]), table(dbs["a"], "g"), sp(sites["a"], "fsck").out)
    r = run("attach", dbs["a"], "--table", "g", site=sites["a"])
    assert r.code == 1 and (f"row '{'q' * 57}...' of table 'g' has a key of "
                            f"{blocks.MAX_STR_BYTES + 1:,} bytes") in r.err, r
    assert "hint: " in r.err, r
    assert (schema_text(dbs["a"]), table(dbs["a"], "g"), sp(sites["a"], "fsck").out) == before
    assert [t["table"] for t in run("--json", "attached", site=sites["a"]).json["tables"]] \
        == ["items"]
    assert run("ls", "g", site=sites["a"]).out == ""
    app(dbs["a"], ["DELETE FROM g WHERE v = 2"])
    sp(sites["a"], "attach", dbs["a"], "--table", "g")
    exchange(tmp_path, sites)
    assert table(dbs["b"], "g") == table(dbs["a"], "g") == [("small", "text", 1, "integer")]
    for n in sites:
        sp(sites[n], "fsck")


def test_a_utf16_file_replicates_deletes_and_key_changes(tmp_path):
    # A UTF-16 database's TEXT bytes are UTF-16: a key gone from the table, read back from
    # its bytes, was spelt as UTF-8 of those bytes, so the delete landed on no key and the
    # peers kept the row.
    sites = make_family(tmp_path, ("a", "b"))
    dbs = {n: tmp_path / f"{n}.db" for n in sites}
    for db in dbs.values():
        app(db, ["PRAGMA encoding='UTF-16le'",
                 "CREATE TABLE t (id TEXT PRIMARY KEY NOT NULL, e TEXT UNIQUE)"])
    for n in sites:
        sp(sites[n], "attach", dbs[n], "--table", "t")
    app(dbs["a"], ["INSERT INTO t VALUES ('k1', 'e1'), ('k2', 'e2'), ('k\u00e9', 'e3')"])
    usb = tmp_path / "usb"
    sp(sites["a"], "export", "--to", "b", "--out", usb, "--create-out")
    sp(sites["b"], "import", usb)
    app(dbs["a"], ["DELETE FROM t WHERE id = 'k\u00e9'", "UPDATE t SET id = 'k9' WHERE id = 'k1'",
                   "INSERT OR REPLACE INTO t VALUES ('k3', 'e2')"])
    sp(sites["a"], "export", "--to", "b", "--out", usb)
    sp(sites["b"], "import", usb)
    assert table(dbs["a"], "t") == [("k3", "text", "e2", "text"), ("k9", "text", "e1", "text")]
    assert table(dbs["b"], "t") == table(dbs["a"], "t")
    assert run("conflicts", site=sites["b"], json_mode=True).json["conflicts"] == []
    for n in sites:
        sp(sites[n], "fsck")
