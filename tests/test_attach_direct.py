"""An import writes attached rows straight into the application's table (attach/applying.py
DirectApply): what happens when it does not get to commit them (issue 21, points 2 and 4).

Each batch written leaves a mark of its CSNs in the store transaction that inserted it; the
application's transaction commits only if every mark did, and marks left over make their keys
pending again, so the next command writes them the ordinary way.
"""

from __future__ import annotations

import sqlite3

import pytest
from hypothesis import given, settings, strategies as st

from syncpack.errors import PacketBodyError
from syncpack.format import codec
from syncpack.exchange import apply as apply_mod, sync
from syncpack.site import Site
from syncpack.store import appdb, attached

from test_attach import SCHEMA, app, attach_all, assert_converged, make_family, sp, table


def two_sites(tmp_path):
    sites = make_family(tmp_path, ("a", "b"))
    dbs = {n: tmp_path / f"{n}.db" for n in sites}
    for db in dbs.values():
        app(db, SCHEMA)
    attach_all(sites, dbs)
    return sites, dbs


def rows_sql(lo: int, hi: int) -> list[str]:
    return [f"WITH RECURSIVE n(i) AS (SELECT {lo} UNION ALL SELECT i + 1 FROM n WHERE i < {hi - 1}) "
            f"INSERT INTO items(id, i, t, b) SELECT printf('k%05d', i), i, 't' || i, "
            f"CAST(printf('%04x', i) AS BLOB) FROM n"]


def export(sites, tmp_path, name):
    out = tmp_path / name
    sp(sites["a"], "export", "--to", "b", "--out", out, "--create-out")
    return out


def test_an_import_stopped_before_the_application_commits_is_written_by_the_next_command(
        tmp_path, monkeypatch):
    sites, dbs = two_sites(tmp_path)
    app(dbs["a"], rows_sql(0, 2500), ["INSERT INTO pairs VALUES ('p', 1, 2.5)"])
    out = export(sites, tmp_path, "drop1")
    real = appdb.end_write

    def power_cut(conn, commit):
        # the import's own transaction (rows of items in it): gone before its COMMIT
        if commit and conn.execute("SELECT count(*) FROM items").fetchone()[0]:
            real(conn, False)
            raise RuntimeError("power cut")
        real(conn, commit)

    monkeypatch.setattr(appdb, "end_write", power_cut)
    with Site.open(sites["b"]) as s:
        with pytest.raises(RuntimeError, match="power cut"):
            sync.import_packets(s, [out])
        assert attached.has_inflight(s.conn)      # the rows went the direct way
    monkeypatch.undo()
    assert table(dbs["b"], "items") == []
    assert sp(sites["b"], "fsck").code == 0     # keys on their way are not differences
    # the application writes meanwhile: one of those keys, concurrently
    app(dbs["b"], ["INSERT INTO items(id, i) VALUES ('k00007', -7)"])
    sp(sites["b"], "capture")
    got = {r[0]: r for r in table(dbs["b"], "items")}
    assert len(got) == 2500 and got["k00100"] == table(dbs["a"], "items")[100]
    with Site.open(sites["b"]) as s:
        assert not attached.has_inflight(s.conn)
    # the local write never saw the peer's row: a conflict, not an overwrite
    r = sp(sites["b"], "conflicts", "items")
    assert "k00007" in r.out
    app(dbs["a"], ["UPDATE items SET i = 0 WHERE id = 'k00001'"], ["DELETE FROM items WHERE "
                                                                  "id = 'k00002'"])
    sp(sites["b"], "export", "--to", "a", "--out", tmp_path / "back", "--create-out")
    sp(sites["a"], "import", tmp_path / "back")
    sp(sites["b"], "import", export(sites, tmp_path, "drop2"))
    assert_converged(sites, dbs)


def test_a_packet_rolled_back_after_its_rows_went_in_leaves_nothing_of_it(tmp_path, monkeypatch):
    sites, dbs = two_sites(tmp_path)
    app(dbs["a"], rows_sql(0, 1500))
    out = export(sites, tmp_path, "drop")
    app(dbs["a"], rows_sql(1500, 3000), ["UPDATE items SET t = 'new' WHERE id < 'k00010'"])
    export(sites, tmp_path, "drop")             # a second packet beside the first
    first = {r[0]: r for r in table(dbs["a"], "items") if r[0] < "k01500"}
    real, calls = apply_mod.note_header, []

    def refuse_second(site, h, applied):
        calls.append(h)
        if len(calls) == 2:
            raise PacketBodyError("refused for the test")
        real(site, h, applied)

    monkeypatch.setattr(apply_mod, "note_header", refuse_second)
    with Site.open(sites["b"]) as s:
        res = sync.import_packets(s, [out])
    monkeypatch.undo()
    assert len(res.applied) == 1 and len(res.rejected) == 1
    got = {r[0]: r for r in table(dbs["b"], "items")}
    assert got.keys() == first.keys()
    assert got["k00003"][6] == "t3"            # the second packet's update is not there
    assert sp(sites["b"], "fsck").code == 0
    sp(sites["b"], "import", out)
    assert_converged(sites, dbs)
    c = sqlite3.connect(dbs["b"])
    assert c.execute("SELECT count(*) FROM items").fetchone()[0] == 3000
    c.close()


def test_check_and_not_null_clashes_are_listed_and_let_through_after_a_fix(tmp_path):
    sites = make_family(tmp_path, ("a", "b"))
    dbs = {n: tmp_path / f"{n}.db" for n in sites}
    # the same table, stricter at b: its own CHECK and NOT NULL
    app(dbs["a"], ["CREATE TABLE stock(id TEXT PRIMARY KEY, qty INTEGER, note TEXT)"])
    app(dbs["b"], ["CREATE TABLE stock(id TEXT PRIMARY KEY, qty INTEGER CHECK (qty >= 0), "
                   "note TEXT NOT NULL)"])
    for n in sites:
        sp(sites[n], "attach", dbs[n], "--table", "stock")
    app(dbs["a"], ["INSERT INTO stock VALUES ('s1', -5, 'x')",
                   "INSERT INTO stock VALUES ('s2', 3, NULL)",
                   "INSERT INTO stock VALUES ('s3', 1, 'ok')"])
    out = export(sites, tmp_path, "drop1")
    r = sp(sites["b"], "import", out)
    assert [x[0] for x in table(dbs["b"], "stock")] == ["s3"]
    r = run_json(sites["b"], "conflicts", "stock")
    got = {c["key"]: c["constraint"] for c in r["conflicts"]}
    assert "CHECK" in got["s1"] and "NOT NULL" in got["s2"], got
    assert "NOT NULL" in sp(sites["b"], "conflicts").out
    assert sp(sites["b"], "fsck").code == 0
    # s1: resolved here; s2: a write at the origin removes the clash
    sp(sites["b"], "conflicts", "resolve", "stock", "s1", "--value",
       '{"id": "s1", "qty": 5, "note": "x"}')
    app(dbs["a"], ["UPDATE stock SET note = 'filled' WHERE id = 's2'"])
    sp(sites["b"], "import", export(sites, tmp_path, "drop2"))
    sp(sites["b"], "export", "--to", "a", "--out", tmp_path / "back", "--create-out")
    sp(sites["a"], "import", tmp_path / "back")
    assert run_json(sites["b"], "conflicts")["conflicts"] == []
    assert_converged(sites, dbs, ("stock",))
    assert [(x[0], x[2], x[4]) for x in table(dbs["b"], "stock")] == [
        ("s1", 5, "x"), ("s2", 3, "filled"), ("s3", 1, "ok")]


def test_a_deferred_foreign_key_clash_is_a_conflict_not_a_crash(tmp_path):
    sites = make_family(tmp_path, ("a", "b"))
    dbs = {n: tmp_path / f"{n}.db" for n in sites}
    schema = ["CREATE TABLE users(id TEXT PRIMARY KEY, name TEXT)",
              "CREATE TABLE orders(id TEXT PRIMARY KEY, user TEXT REFERENCES users(id) "
              "DEFERRABLE INITIALLY DEFERRED, qty INTEGER)"]
    for db in dbs.values():
        app(db, schema)
    for n in sites:
        sp(sites[n], "attach", dbs[n], "--table", "users", "--table", "orders")
    app(dbs["a"], ["INSERT INTO users VALUES ('u1', 'one')",
                   "INSERT INTO orders VALUES ('o1', 'u1', 1)"])
    exchange_ab(sites, tmp_path)
    # a child whose parent is gone at b
    app(dbs["b"], ["DELETE FROM orders", "DELETE FROM users"])
    app(dbs["a"], ["INSERT INTO orders VALUES ('o2', 'u1', 2)"])
    sp(sites["a"], "capture")
    sp(sites["b"], "import", export(sites, tmp_path, "drop2"))
    assert table(dbs["b"], "orders") == []
    r = run_json(sites["b"], "conflicts", "orders")
    clash = [c for c in r["conflicts"] if c["key"] == "o2"]
    assert clash and "FOREIGN KEY" in clash[0]["constraint"], r
    assert sp(sites["b"], "fsck").code == 0
    sp(sites["b"], "conflicts", "resolve", "orders", "o2", "--value",
       '{"id": "o2", "user": null, "qty": 2}')
    exchange_ab(sites, tmp_path)
    assert_converged(sites, dbs, ("users", "orders"))


def run_json(site, *args):
    from conftest import run
    r = run("--json", *args, site=site)
    assert r.code == 0, r
    return r.json


def exchange_ab(sites, tmp_path):
    from test_attach import exchange
    exchange(tmp_path, sites)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abcdefgh"), st.integers(0, 2)), max_size=12),
       st.lists(st.sampled_from("abcdefghij"), min_size=1, max_size=8))
def test_several_versions_names_exactly_the_keys_with_more_than_one(tmp_path_factory, held,
                                                                   batch):
    from syncpack.store import db
    conn = db.create(tmp_path_factory.mktemp("s") / "store.db")
    try:
        # as in an import: the batch's own versions are in, and maybe others
        rows = {(k, bytes([v]) * 20) for k, v in held} | {(k, b"n" * 20) for k in batch}
        conn.executemany("INSERT INTO versions VALUES ('t', ?, ?, NULL)", rows)
        conn.execute("INSERT INTO versions VALUES ('u', 'c', ?, NULL)", (b"z" * 20,))
        counts: dict[str, int] = {}
        for k, _c in rows:
            counts[k] = counts.get(k, 0) + 1
        want = {k for k in batch if counts.get(k, 0) > 1}
        assert attached.several_versions(conn, "t", batch) == want
    finally:
        conn.close()


# --- rows written by a child process (attach/writer.py) ---------------------------------------

def _elsewhere(monkeypatch, at: int) -> list[bool]:
    """Imports of at least ``at`` ops write through the writer process; the list records, per
    import, whether one served."""
    from syncpack.attach import writer
    monkeypatch.setattr(writer, "ELSEWHERE_AT", at)
    served: list[bool] = []
    real_init = writer.Elsewhere.__init__

    def init(self, *a, **k):
        real_init(self, *a, **k)
        served.append(bool(self))
    monkeypatch.setattr(writer.Elsewhere, "__init__", init)
    return served


def _mixed_import(root, monkeypatch, at: int):
    """b imports (in this process) a's rows of every type and key kind, deletes, a row that
    clashes with b's UNIQUE column, records that are no row, and a key b wrote itself."""
    sites = make_family(root, ("a", "b"))
    dbs = {n: root / f"{n}.db" for n in sites}
    app(dbs["a"], SCHEMA)
    app(dbs["b"], SCHEMA, ["CREATE UNIQUE INDEX items_t ON items(t)"])
    attach_all(sites, dbs)
    app(dbs["a"], rows_sql(0, 1200),
        [["INSERT INTO items VALUES (?, ?, ?, ?, ?, ?)",
          ["x", 2 ** 63 - 1, -0.5, "héllo\x00tail", "hex:00ff10", None]]],
        ["INSERT INTO counters(v) VALUES ('one')", "INSERT INTO counters(v) VALUES (2.5)"],
        [["INSERT INTO pairs VALUES (?, ?, ?)", ["k", 1, "hex:beef"]]],
        ["DELETE FROM items WHERE id BETWEEN 'k00010' AND 'k00019'",
         "UPDATE items SET t = 'changed' WHERE id = 'k00020'"])
    app(dbs["b"], ["INSERT INTO items(id, t) VALUES ('mine', 't30')",
                   "INSERT INTO items(id, i) VALUES ('k00007', -7)"])
    with Site.open(sites["a"]) as s, s.transaction() as tx:
        tx.write_raw("items", "bad1", b"\xc1")
        tx.write_raw("items", "bad2", codec.encode_value({"id": "mine", "i": 5}))
    out = export(sites, root, "drop")
    served = _elsewhere(monkeypatch, at)
    with Site.open(sites["b"]) as s:
        res = sync.import_packets(s, [out])
    monkeypatch.undo()
    assert res.applied and not res.rejected
    clashes = sorted((c["key"], c["constraint"])
                     for c in run_json(sites["b"], "conflicts")["conflicts"])
    assert sp(sites["b"], "fsck").code == 0
    return served, {t: table(dbs["b"], t) for t in ("items", "counters", "pairs")}, clashes


def test_rows_written_by_the_writer_process_are_the_rows_written_here(tmp_path, monkeypatch):
    served_here, here, clashes_here = _mixed_import(tmp_path / "here", monkeypatch, 10 ** 12)
    served, there, clashes = _mixed_import(tmp_path / "there", monkeypatch, 1)
    assert served_here == [] and served == [True]
    assert there == here
    assert clashes == clashes_here
    keys = {k for k, _c in clashes}
    assert {"bad1", "bad2", "k00030", "k00007"} <= keys, clashes
    assert len(here["items"]) == 1200 - 10 + 2 - 1     # + x and mine; k00030 clashes


def test_the_writer_process_leaves_the_applications_triggers_writes_to_the_origin(
        tmp_path, monkeypatch):
    """As an import written here (test_attach.py, the same application): a trigger's row in
    a replicated table comes from the origin, not again from the writer process."""
    from test_attach import TRIGGERED, attached_pair
    sites, dbs = attached_pair(tmp_path, TRIGGERED, [], ["notes", "audit"])
    app(dbs["a"], ["INSERT INTO notes(id, body) VALUES ('n1', 'hello')",
                   "INSERT INTO notes(id, body) VALUES ('n2', 'there')"],
        ["UPDATE notes SET body = 'again' WHERE id = 'n1'"])
    out = export(sites, tmp_path, "drop")
    served = _elsewhere(monkeypatch, 1)
    with Site.open(sites["b"]) as s:
        sync.import_packets(s, [out])
    monkeypatch.undo()
    assert served == [True]
    for t in ("notes", "audit"):
        assert table(dbs["b"], t) == table(dbs["a"], t), t
    assert len(table(dbs["b"], "audit")) == 2
    assert table(dbs["b"], "tally") == [("seen", "text", 2, "integer")]
    assert sp(sites["b"], "fsck").code == 0


def test_an_import_whose_writer_process_dies_still_writes_every_row(tmp_path, monkeypatch):
    """The child killed after its first batch: the batches after it go the ordinary way, the
    ones it had go back to pending by their marks, and the import's own apply writes them."""
    import os
    import signal
    from syncpack.attach import writer
    sites, dbs = two_sites(tmp_path)
    app(dbs["a"], rows_sql(0, 25_000))
    out = export(sites, tmp_path, "drop")
    served = _elsewhere(monkeypatch, 1)
    real_put = writer.Elsewhere.put

    def put_then_die(self, *a):
        real_put(self, *a)
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
    monkeypatch.setattr(writer.Elsewhere, "put", put_then_die)
    with Site.open(sites["b"]) as s:
        res = sync.import_packets(s, [out])
        assert not attached.has_inflight(s.conn)
    monkeypatch.undo()
    assert served == [True] and res.applied
    assert table(dbs["b"], "items") == table(dbs["a"], "items")
    assert sp(sites["b"], "fsck").code == 0


def test_a_power_cut_before_the_writer_process_commits(tmp_path, monkeypatch):
    """Everything in the store, nothing in the application's file (the child killed as it
    was to commit): the marks make the next command write the rows, after capturing what the
    application wrote meanwhile."""
    import os
    import signal
    from syncpack.attach import writer
    sites, dbs = two_sites(tmp_path)
    app(dbs["a"], rows_sql(0, 2500))
    out = export(sites, tmp_path, "drop")
    served = _elsewhere(monkeypatch, 1)

    def power_cut(self, commit, token):
        os.kill(self.proc.pid, signal.SIGKILL)
        raise RuntimeError("power cut")
    monkeypatch.setattr(writer.Elsewhere, "end", power_cut)
    with Site.open(sites["b"]) as s:
        with pytest.raises(RuntimeError, match="power cut"):
            sync.import_packets(s, [out])
        assert attached.has_inflight(s.conn)
    monkeypatch.undo()
    assert served == [True]
    assert table(dbs["b"], "items") == []
    app(dbs["b"], ["INSERT INTO items(id, i) VALUES ('k00007', -7)"])
    sp(sites["b"], "capture")
    got = {r[0]: r for r in table(dbs["b"], "items")}
    assert len(got) == 2500 and got["k00100"] == table(dbs["a"], "items")[100]
    assert "k00007" in sp(sites["b"], "conflicts", "items").out
    assert sp(sites["b"], "fsck").code == 0


def test_the_writer_process_serves_only_the_file_as_left(tmp_path):
    """Another highest change number or schema version (the application wrote between the
    caller's commit and the child's lock): the child declines and holds nothing.  Serving, it
    answers the positions it did not write, and commits only when told."""
    from syncpack.attach import writer
    db = tmp_path / "a.db"
    app(db, SCHEMA[:1], ["CREATE UNIQUE INDEX items_t ON items(t)",
                         "INSERT INTO items(id, t) VALUES ('mine', 'taken')"])
    conn = appdb.open_app(db)
    t = appdb.table_info(conn, "items")
    with appdb.write_txn(conn):
        appdb.install_capture(conn, t)
    app(db, ["INSERT INTO items(id) VALUES ('k0')"])
    upto, schema = appdb.max_seq(conn), appdb.schema_version(conn)
    for wrong in (dict(upto=upto - 1), dict(schema=schema + 1)):
        w = writer.Elsewhere(str(db), ["items"], ["items"],
                             **{"upto": upto, "schema": schema, **wrong}, pause_at=1000)
        assert not w
        w.close()
    rec = [codec.encode_value({"id": "n1", "t": "a"}), b"\xc1",
           codec.encode_value({"id": "n3", "t": "taken"}), codec.encode_value({"id": "n4"})]
    for commit in (False, True):
        w = writer.Elsewhere(str(db), ["items"], ["items"], upto, schema, pause_at=1000)
        assert w
        w.put("items", ["n1", "n2", "n3", "n4"], rec, [b"one", b"two", b"three", b"four"])
        assert w.refused(wait=True) == [("items", "n2", b"two"), ("items", "n3", b"three")]
        assert w.end(commit, b"token") is commit
        w.close()
        assert w.proc is None
        got = [r[0] for r in table(db, "items")]
        assert got == (["k0", "mine", "n1", "n4"] if commit else ["k0", "mine"])
        # the token committed with the rows, so that a crash after the commit is told apart
        assert appdb.applied_tokens(conn, [b"token"]) == ({b"token"} if commit else set())
    # nothing it wrote was captured as the application's change
    assert appdb.pending_counts(conn, upto) == {}
    conn.close()


def test_a_batch_that_cannot_reach_the_writer_process_ends_it_without_a_hang(tmp_path):
    """A frame the importing process cannot send (here one that does not pack) ends the
    child's input: the child rolls back and exits, and waiting for answers raises instead
    of waiting forever."""
    import threading
    from syncpack import children
    from syncpack.attach import writer
    db = tmp_path / "a.db"
    app(db, SCHEMA[:1])
    conn = appdb.open_app(db)
    t = appdb.table_info(conn, "items")
    with appdb.write_txn(conn):
        appdb.install_capture(conn, t)
    w = writer.Elsewhere(str(db), ["items"], ["items"], appdb.max_seq(conn),
                         appdb.schema_version(conn), pause_at=1000)
    assert w
    w.put("items", ["n1"], [codec.encode_value({"id": "n1"})], [b"one"])
    w.put("items", ["n2"], [object()], [b"two"])
    outcome: list = []

    def wait_for_answers():
        try:
            outcome.append(w.refused(wait=True))
        except children.ChildEnded as e:
            outcome.append(e)
    waiter = threading.Thread(target=wait_for_answers, daemon=True)
    waiter.start()
    waiter.join(30)
    assert outcome and isinstance(outcome[0], children.ChildEnded), outcome
    w.close()
    assert table(db, "items") == []         # rolled back
    conn.close()


def test_an_application_write_at_the_hand_over_is_captured_not_overwritten(tmp_path,
                                                                          monkeypatch):
    """The application writes between the importer's commit and the child's lock: the child
    declines, the importer takes the lock back, captures that write, and writes the rows
    itself; the write is a conflict with the peer's row, not overwritten."""
    from syncpack.attach import writer
    sites, dbs = two_sites(tmp_path)
    app(dbs["a"], rows_sql(0, 1500))
    out = export(sites, tmp_path, "drop")
    served = _elsewhere(monkeypatch, 1)
    wrapped_init = writer.Elsewhere.__init__

    def write_first(self, *a, **k):
        c = sqlite3.connect(dbs["b"], timeout=60, isolation_level=None)
        c.execute("INSERT INTO items(id, i) VALUES ('k00042', -42)")
        c.close()
        wrapped_init(self, *a, **k)
    monkeypatch.setattr(writer.Elsewhere, "__init__", write_first)
    with Site.open(sites["b"]) as s:
        res = sync.import_packets(s, [out])
    monkeypatch.undo()
    assert served == [False] and res.applied
    assert len(table(dbs["b"], "items")) == 1500
    assert "k00042" in sp(sites["b"], "conflicts", "items").out
    sp(sites["b"], "export", "--to", "a", "--out", tmp_path / "back", "--create-out")
    sp(sites["a"], "import", tmp_path / "back")
    assert_converged(sites, dbs)
