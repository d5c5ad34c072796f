"""Schema changes of attached tables replicate (issue 22 item 2, docs/attach.md "Schema changes"),
through the ``syncpack`` command at three sites; the applications are separate processes
writing plain SQL through the stdlib ``sqlite3``.  Each scenario ends with the tables equal at
every site, row by row with SQLite types, and ``fsck`` clean.
"""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import apsw
import pytest
from hypothesis import given, settings, strategies as st

from syncpack.attach import shapes
from syncpack.rules import sqltext
from syncpack.format import codec
from syncpack.site import TABLES, Site

from conftest import run
from test_attach import (app, attached_everywhere, exchange, make_family, make_family_member,
                         schema_text, sp, table)

SCHEMA = [
    "CREATE TABLE items(id TEXT PRIMARY KEY, qty INTEGER, t TEXT)",
    "CREATE TABLE other(id TEXT PRIMARY KEY, v)",
]
TABLES_ = ("items", "other")


def columns(db: Path, name: str) -> list[tuple]:
    c = sqlite3.connect(db)
    try:
        return [tuple(r[1:]) for r in c.execute(f"PRAGMA table_xinfo({name})")]
    finally:
        c.close()


def converged(sites: dict, dbs: dict, tables=TABLES_) -> None:
    names = list(sites)
    for t in tables:
        first = table(dbs[names[0]], t)
        for n in names[1:]:
            assert columns(dbs[n], t) == columns(dbs[names[0]], t), (t, n)
            assert table(dbs[n], t) == first, (t, n)
    for n in names:
        sp(sites[n], "fsck")


def attached_doc(site: Path) -> dict:
    return json.loads(sp(site, "attached", "--json").out)


def entry(site: Path, name: str) -> dict:
    return next(t for t in attached_doc(site)["tables"] if t["table"] == name)


@pytest.fixture
def three(tmp_path):
    sites = make_family(tmp_path)
    dbs = {n: tmp_path / f"{n}.db" for n in sites}
    for n, db in dbs.items():
        app(db, SCHEMA, [f"INSERT INTO items VALUES ('{n}1', 1, 'x')",
                         f"INSERT INTO other VALUES ('{n}1', 1)"])
    for n in sites:
        sp(sites[n], "attach", dbs[n], "--table", "items", "--table", "other")
    exchange(tmp_path, sites)
    return tmp_path, sites, dbs


def export_to(root: Path, sites: dict, src: str, dsts: list[str]) -> None:
    out = root / "drop" / f"{src}-once"
    out.mkdir(parents=True, exist_ok=True)
    sp(sites[src], "export", "--all", "--out", out)
    for d in dsts:
        sp(sites[d], "import", out)


def test_an_added_column_reaches_every_site_before_the_rows_using_it(three):
    root, sites, dbs = three
    # a's next release adds a column and writes it at once; b and c keep writing meanwhile.
    app(dbs["a"], ["ALTER TABLE items ADD COLUMN note TEXT NOT NULL DEFAULT 'none'",
                   "INSERT INTO items VALUES ('a2', 2, 'y', 'fresh')",
                   "UPDATE items SET note = 'seen' WHERE id = 'b1'"])
    app(dbs["b"], ["INSERT INTO items VALUES ('b2', 5, 'z')", "UPDATE items SET qty = 9 "
                   "WHERE id = 'c1'"])
    app(dbs["c"], ["INSERT INTO other VALUES ('c2', x'00ff')"])
    # One import brings the column and the rows that use it: written at once, none waits.
    export_to(root, sites, "a", ["b", "c"])
    for n in ("b", "c"):
        assert [c[0] for c in columns(dbs[n], "items")] == ["id", "qty", "t", "note"]
        rows = {r[0]: r for r in table(dbs[n], "items")}
        assert rows["a2"][6:8] == ("fresh", "text")
        assert rows["b1"][6] == "seen"
        assert entry(sites[n], "items")["waiting"] == 0
    # b, now with the column, writes it; its old release's rows keep the default.
    app(dbs["b"], ["INSERT INTO items(id, qty, t, note) VALUES ('b3', 3, 'w', 'from b')"])
    exchange(root, sites)
    converged(sites, dbs)
    rows = {r[0]: r for r in table(dbs["c"], "items")}
    assert rows["b3"][6] == "from b" and rows["b2"][6] == "none" and rows["c1"][2] == 9
    for n in sites:
        assert entry(sites[n], "items")["stopped"] is None


def test_a_dropped_column_stops_that_table_only_and_loses_nothing(three):
    root, sites, dbs = three
    before = {n: table(dbs[n], "items") for n in sites}
    # A change committed before the schema change and not captured yet is not lost either.
    app(dbs["a"], ["UPDATE items SET qty = 41 WHERE id = 'c1'"])
    app(dbs["a"], ["ALTER TABLE items DROP COLUMN t",
                   "UPDATE items SET qty = 42 WHERE id = 'b1'",
                   "INSERT INTO items VALUES ('a9', 7)"],
        ["INSERT INTO other VALUES ('a5', 'still replicated')"])
    r = run("capture", site=sites["a"])
    assert r.code == 1, r
    assert "capture of table items stopped: column t was dropped or renamed" in r.err
    assert "--refresh" in r.err
    e = entry(sites["a"], "items")
    assert e["stopped"] and "column t was dropped" in e["stopped"]
    assert entry(sites["a"], "other")["stopped"] is None
    status = json.loads(run("status", site=sites["a"], json_mode=True).out)
    assert [t["stopped"] is not None for t in status["attached"]["tables"]] == [True, False]
    r = sp(sites["a"], "status", "--format", "prometheus")
    assert 'syncpack_attached_stopped{site="a",table="items"} 1' in r.out
    assert 'syncpack_attached_stopped{site="a",table="other"} 0' in r.out
    # An export says so too (it did its work: exit 0), and a batch round fails on it after
    # doing everything else, so that cron or the timer reports it.
    r = run("export", "--all", "--out", root / "drop-stopped", "--create-out", site=sites["a"])
    assert r.code == 0 and "warning: capture of table items stopped" in r.err, r
    # so does a snapshot for a new site or a resync: it too lacks the table's changes
    assert run("keygen", root / "newsite", "--site", "newsite").code == 0
    r = run("mkreplica", "export", "--site", "newsite", "--pubkey",
            root / "newsite" / "keys" / "site.pub", "--out", root / "drop-new",
            "--create-out", site=sites["a"])
    assert r.code == 0 and "stopped: column t was dropped or renamed; its changes are not " \
        "in the snapshot" in r.err, r
    r = run("resync", "--to", "b", "--out", root / "drop-resync", "--create-out",
            site=sites["a"])
    assert r.code == 0 and "not in the snapshot" in r.err, r
    cfg = root / "a-round.toml"
    cfg.write_text(f'site = "{sites["a"]}"\n[[export]]\nout = "{root / "drop-stopped"}"\n'
                   f'to = "all"\n')
    r = run("--json", "batch", cfg)
    doc = json.loads(r.out)
    assert r.code == 1 and doc["outcome"] == "failed", r
    assert [(e["action"], e["target"]) for e in doc["errors"]] == [("capture", "items")]
    assert "--refresh" in doc["errors"][0]["hint"]
    # Other tables carry on; the peers' items stay as they were.  The changes made while
    # stopped are still counted as waiting, after the other tables' captures moved on.
    exchange(root, sites)
    assert entry(sites["a"], "items")["pending"] == 3
    assert entry(sites["a"], "other")["pending"] == 0
    for n in ("b", "c"):
        assert ("a5", "text", "still replicated", "text") in table(dbs[n], "other")
        assert table(dbs[n], "items") == before[n]
    r = run("get", "items", "b1", site=sites["a"])
    assert json.loads(r.out)["t"] == "x"          # the store still holds the column's values
    # The release rolls out everywhere, each site accepts it, a's changes made while stopped
    # arrive.
    for n in ("b", "c"):
        app(dbs[n], ["ALTER TABLE items DROP COLUMN t"])
    for n in sites:
        r = sp(sites[n], "attach", dbs[n], "--refresh", "--table", "items", "--json")
        assert json.loads(r.out)["refreshed"][0]["columns"] == ["id", "qty"]
    exchange(root, sites)
    converged(sites, dbs)
    rows = {r[0]: r for r in table(dbs["c"], "items")}
    assert rows["b1"][2] == 42 and rows["a9"][2] == 7 and rows["c1"][2] == 41
    for n in sites:
        assert entry(sites[n], "items")["stopped"] is None
        sp(sites[n], "capture")
        assert run("conflicts", "items", "--json", site=sites[n]).out.count('"key"') == 0


def _a1_written_at_a_while_stopped_and_at_b(three) -> None:
    """a's application drops a column (its capture stops) and updates a1; b updates a1 too;
    b's record waits at a."""
    root, sites, dbs = three
    app(dbs["a"], ["ALTER TABLE items DROP COLUMN t", "UPDATE items SET qty = 100 WHERE "
                   "id = 'a1'"])
    app(dbs["b"], ["UPDATE items SET qty = 200 WHERE id = 'a1'"])
    exchange(root, sites)
    assert entry(sites["a"], "items")["to_apply"] >= 1


def _rolled_out_with_a1_in_conflict(three, statements: list[str]) -> None:
    """b and c's applications run ``statements`` (the release a has), every site refreshes,
    and the family converges with a1 in conflict everywhere."""
    root, sites, dbs = three
    for n in ("b", "c"):
        app(dbs[n], statements)
    for n in sites:
        sp(sites[n], "attach", dbs[n], "--refresh")
    exchange(root, sites)
    converged(sites, dbs)
    for n in sites:
        [conf] = run("--json", "conflicts", "items", site=sites[n]).json["conflicts"]
        assert conf["key"] == "a1"


def test_a_write_made_while_stopped_is_a_conflict_not_overwritten(three):
    _a1_written_at_a_while_stopped_and_at_b(three)
    # b's record waits at a (its table is stopped): a's own change is still in a's table.
    assert {r[0]: r[2] for r in table(three[2]["a"], "items")}["a1"] == 100
    _rolled_out_with_a1_in_conflict(three, ["ALTER TABLE items DROP COLUMN t"])


def test_a_row_too_large_written_while_stopped_stops_the_refresh_naming_it(three, monkeypatch):
    """A row changed while its table's capture was stopped, whose key waits for a peer's
    record, is taken by the refresh as capture takes a row: one too large for a record is
    named and nothing changes (it was sealed into a block no site can read); once the
    application makes it smaller, the refresh goes through and the row's write is a
    conflict with the peer's, as any write made while stopped."""
    monkeypatch.setattr(codec, "MAX_VALUE_BYTES", 10_000)
    root, sites, dbs = three
    _a1_written_at_a_while_stopped_and_at_b(three)
    app(dbs["a"], ["ALTER TABLE items ADD COLUMN note BLOB",
                   "UPDATE items SET note = randomblob(20000) WHERE id = 'a1'"])
    def state():
        # (a refresh captures the other tables first, as every command does)
        items = {k: v for k, v in entry(sites["a"], "items").items() if k != "last_capture"}
        return (table(dbs["a"], "items"), schema_text(dbs["a"]), sp(sites["a"], "fsck").out,
                items)

    before = state()
    r = run("attach", dbs["a"], "--refresh", site=sites["a"])
    assert r.code == 1 and "row 'a1' of table 'items' is 20," in r.err, r
    assert "internal" not in r.err and "hint: " in r.err, r
    assert state() == before
    app(dbs["a"], ["UPDATE items SET note = x'01' WHERE id = 'a1'"])
    _rolled_out_with_a1_in_conflict(three, ["ALTER TABLE items DROP COLUMN t",
                                            "ALTER TABLE items ADD COLUMN note BLOB"])


def test_a_site_joining_with_a_table_of_another_shape_never_replaces_the_familys(tmp_path):
    """A table a site attaches when the family has one of that name already: one that lacks
    a column of the family's table joins with a warning that says so (the peers' rows
    waited for that column, blamed on a peer adding it, and nothing said why at the attach);
    one with other types joins with a warning, and one with a column more publishes that
    column.  None replaces the family's definition: a site attaching later got the
    joiner's table (a column short, other types) and refused the origin's rows for good."""
    sites = make_family(tmp_path, ("a", "b", "c", "d"))
    dbs = {n: tmp_path / f"{n}.db" for n in sites}
    family_sql = "CREATE TABLE items(id TEXT PRIMARY KEY NOT NULL, v INTEGER, w TEXT)"
    app(dbs["a"], [family_sql, "INSERT INTO items VALUES ('k1', 1, 'w1')"])
    sp(sites["a"], "attach", dbs["a"], "--table", "items")
    exchange(tmp_path, sites)
    app(dbs["b"], ["CREATE TABLE items(id TEXT PRIMARY KEY NOT NULL, v INTEGER)",
                   "INSERT INTO items VALUES ('k2', 2)"])
    r = sp(sites["b"], "attach", dbs["b"], "--table", "items", "--json")
    assert any("lacks column(s) w of the family's table" in w and "$tables" in w
               for w in json.loads(r.out)["warnings"]), r.out
    exchange(tmp_path, sites)
    [clash] = run("--json", "conflicts", "items", site=sites["b"]).json["conflicts"]
    assert clash["key"] == "k1" and "waits for column w" in json.dumps(clash), clash
    app(dbs["b"], ["ALTER TABLE items ADD COLUMN w TEXT"])
    app(dbs["c"], ["CREATE TABLE items(id TEXT PRIMARY KEY NOT NULL, v TEXT, w TEXT, "
                   "x INTEGER DEFAULT 5)", "INSERT INTO items VALUES ('k3', 'three', 'w3', 6)"])
    r = sp(sites["c"], "attach", dbs["c"], "--table", "items", "--json")
    assert any("v" in w and "TEXT" in w for w in json.loads(r.out)["warnings"]), r.out
    exchange(tmp_path, sites)
    app(dbs["d"], [])
    sp(sites["d"], "attach", dbs["d"], "--table", "items")
    exchange(tmp_path, sites)
    made = dict((n, sql) for _t, n, sql in schema_text(dbs["d"]) if n == "items")["items"]
    assert made.startswith(family_sql[:-1]) and "\"x\" INTEGER DEFAULT 5" in made, made
    rows_d = {r[0]: r for r in table(dbs["d"], "items")}
    assert set(rows_d) == {"k1", "k2", "k3"}, rows_d
    assert rows_d["k1"][2:4] == (1, "integer") and rows_d["k3"][2:4] == ("three", "text")
    for n in ("a", "b", "d"):
        assert table(dbs[n], "items") == table(dbs["d"], "items"), n
        sp(sites[n], "fsck")


def test_a_column_a_member_only_lists_does_not_keep_another_sites_column_home(three):
    """A lying member republishes the table's definition listing a column 'note' that its
    CREATE TABLE does not make, and no schema op.  b's application later adds 'note' and
    writes it: b took the listed name for a column the family had, published nothing, and
    its rows waited at every other site for good.  What the family has is read from the
    definitions' CREATE TABLE texts and ops, so b's column travels."""
    root, sites, dbs = three
    with Site.open(sites["a"]) as s:
        d = s.get(TABLES, "items")
        d["columns"] = [*d["columns"], "note"]
        with s.transaction(_system=True) as tx:
            tx.write_raw(TABLES, "items", codec.encode_value(d))
    exchange(root, sites)
    app(dbs["b"], ["ALTER TABLE items ADD COLUMN note TEXT",
                   "INSERT INTO items VALUES ('b2', 2, 'y', 'hello')"])
    exchange(root, sites, rounds=3)
    converged(sites, dbs)
    for n in sites:
        assert {r[0]: r for r in table(dbs[n], "items")}["b2"][6:8] == ("hello", "text")


def test_many_new_tables_of_a_member_are_created_a_bounded_number_per_command(three):
    """A member publishes many tables at once (one of them unwritable here): each was
    created and attached on its own, every attach reviewing all the tables attached so far,
    and 400 of them took one import 142 s.  One command creates at most FOLLOW_AT_ONCE of
    them, together; the rest follow at the next commands, and the refused one is named."""
    from syncpack.attach import core
    root, sites, dbs = three
    n = core.FOLLOW_AT_ONCE + 20
    with Site.open(sites["a"]) as site, site.transaction(_system=True) as tx:
        for i in range(n):
            name = f"t{i:03d}"
            check = " CHECK (x = 'a' COLLATE nosuch)" if i == 7 else ""
            tx.write_raw(TABLES, name, codec.encode_value({
                "pk": ["id"], "columns": ["id", "x"],
                "create_sql": f"CREATE TABLE {name}(id TEXT PRIMARY KEY, x TEXT{check})"}))
            tx.write_raw(name, "r", codec.encode_value({"id": "r", "x": "a"}))
    export_to(root, sites, "a", ["b"])
    made = [t["table"] for t in attached_doc(sites["b"])["tables"] if t["table"][0] == "t"]
    assert len(made) == core.FOLLOW_AT_ONCE - 1, len(made)
    r = run("--json", "capture", site=sites["b"])
    assert any("table t007 of the family was not created here" in w
               for w in r.json["refused"]), r
    doc = attached_doc(sites["b"])
    assert doc["available"] == ["t007"]
    assert len([t for t in doc["tables"] if t["table"][0] == "t"]) == n - 1
    assert all(table(dbs["b"], f"t{i:03d}") == [("r", "text", "a", "text")]
               for i in range(n) if i != 7)
    sp(sites["b"], "fsck")


def test_unsafe_changes_are_named(three):
    _root, sites, dbs = three
    app(dbs["b"], ["CREATE UNIQUE INDEX items_t ON items(t, id)"])
    r = run("capture", site=sites["b"])
    assert r.code == 1 and "a new UNIQUE constraint on (t, id)" in r.err, r
    app(dbs["c"], ["ALTER TABLE items RENAME COLUMN qty TO amount"])
    r = run("capture", site=sites["c"])
    assert r.code == 1 and "column qty was dropped or renamed" in r.err, r


def test_records_with_a_column_a_site_lacks_wait_until_it_arrives(three):
    root, sites, dbs = three
    # A record from a newer release has a column no table has yet (written here through
    # the API: 'put' refuses a column the table lacks).
    with Site.open(sites["a"]) as s, s.transaction() as tx:
        tx.put("items", "k", {"id": "k", "qty": 1, "t": "y", "color": "red"})
    exchange(root, sites)
    for n in sites:
        assert entry(sites[n], "items")["waiting"] == 1
        assert "k" not in {r[0] for r in table(dbs[n], "items")}
        status = json.loads(run("status", site=sites[n], json_mode=True).out)
        assert status["attached"]["tables"][0]["waiting"] == 1
    # b's application moves to the release with the column: the column travels, every site
    # adds it and writes the waiting record.
    app(dbs["b"], ["ALTER TABLE items ADD COLUMN color TEXT"])
    exchange(root, sites)
    converged(sites, dbs)
    for n in sites:
        assert entry(sites[n], "items")["waiting"] == 0
        rows = {r[0]: r for r in table(dbs[n], "items")}
        assert rows["k"][6:8] == ("red", "text")


def test_a_new_table_attached_at_one_site_is_created_and_filled_at_the_others(three):
    root, sites, dbs = three
    # b's application has an unrelated table of that name: it is left alone, only offered.
    app(dbs["b"], ["CREATE TABLE extra(id TEXT PRIMARY KEY, v)", "INSERT INTO extra VALUES "
                   "('mine', 0)"])
    app(dbs["a"], ["CREATE TABLE extra(id TEXT PRIMARY KEY, v)", "INSERT INTO extra VALUES "
                   "('e', 1)"])
    sp(sites["a"], "attach", dbs["a"], "--table", "extra")
    exchange(root, sites)
    # c never had the table: the next sync after the import created it and wrote the rows.
    assert table(dbs["c"], "extra") == table(dbs["a"], "extra")
    assert "extra" in [t["table"] for t in attached_doc(sites["c"])["tables"]]
    assert attached_doc(sites["b"])["available"] == ["extra"]
    assert [r[0] for r in table(dbs["b"], "extra")] == ["mine"]
    sp(sites["b"], "attach", dbs["b"], "--table", "extra")
    # c's application writes the new table; its changes replicate like any other table's.
    app(dbs["c"], ["INSERT INTO extra VALUES ('c', 3)"])
    exchange(root, sites)
    converged(sites, dbs, tables=TABLES_ + ("extra",))


def test_a_put_into_a_stopped_table_says_it_waits(three):
    """Before, a put or a delete of a stopped table's record said nothing, though nothing
    reached the table."""
    root, sites, dbs = three
    app(dbs["a"], ["ALTER TABLE items DROP COLUMN t"])
    assert run("capture", site=sites["a"]).code == 1
    for args in (("put", "items", "z", '{"id": "z", "qty": 2}'), ("delete", "items", "a1")):
        r = sp(sites["a"], *args)
        assert "capture of table items stopped" in r.err and \
            "nothing is written into that table now" in r.err, r
    assert [r[0] for r in table(dbs["a"], "items")] == ["a1", "b1", "c1"]
    sp(sites["a"], "attach", dbs["a"], "--refresh", "--table", "items")
    assert [r[0] for r in table(dbs["a"], "items")] == ["b1", "c1", "z"]


def test_capture_and_import_say_which_tables_of_the_family_they_created_and_count_rows(three):
    """The administrator is told when a table appears in the application's file: before, a
    new site's capture that created a peer's table and wrote its rows said 'applied 0'."""
    root, sites, dbs = three
    app(dbs["a"], ["CREATE TABLE extra(id TEXT PRIMARY KEY, v)",
                   "INSERT INTO extra VALUES ('e', 1), ('f', 2)"])
    sp(sites["a"], "attach", dbs["a"], "--table", "extra")
    out = root / "drop-extra"
    sp(sites["a"], "export", "--to", "c", "--out", out, "--create-out")
    r = sp(sites["c"], "import", out)
    assert ("created table extra in the attached database from the family's definition "
            "(2 row(s) written)") in r.out, r
    assert table(dbs["c"], "extra") == table(dbs["a"], "extra")
    # a new site attaching one table: its capture creates the others and counts their rows
    d = make_family_member(root, sites, "d")
    dbd = root / "d.db"
    app(dbd, [SCHEMA[0]])
    sp(d, "attach", dbd, "--table", "items")
    doc = json.loads(sp(d, "--json", "capture").out)
    assert sorted(doc["created"], key=lambda c: c["table"]) == [
        {"table": "extra", "rows": 2}, {"table": "other", "rows": 3}], doc
    assert doc["applied"] == 5, doc
    assert table(dbd, "extra") == table(dbs["a"], "extra")
    r = sp(d, "capture")
    assert "created" not in r.out and "applied 0 record(s)" in r.out, r


def test_blob_literals_that_are_no_utf8_in_a_schema_replicate(three):
    """x'ff' in a DEFAULT, a CHECK or a trigger of the application's: SQLite shows such a
    literal's bytes as they are when it compiles a write, and reading that program made
    attach, and every capture after an ALTER TABLE adding one, an internal error."""
    root, sites, dbs = three
    app(dbs["a"], ["CREATE TABLE bin(id TEXT PRIMARY KEY, b BLOB DEFAULT x'ff', "
                   "c BLOB CHECK (c IS NOT x'fe'))",
                   "CREATE TABLE binlog(b BLOB, id TEXT)",
                   "CREATE TRIGGER bin_log AFTER INSERT ON bin BEGIN "
                   "INSERT INTO binlog VALUES (x'ff01', NEW.id); END",
                   "INSERT INTO bin(id, c) VALUES ('1', x'00')"])
    sp(sites["a"], "attach", dbs["a"], "--table", "bin")
    app(dbs["a"], ["ALTER TABLE items ADD COLUMN raw BLOB DEFAULT x'DEADBEEF'",
                   "INSERT INTO items(id, qty) VALUES ('raw', 1)",
                   "INSERT INTO bin(id) VALUES ('2')"])
    exchange(root, sites)
    converged(sites, dbs, tables=TABLES_ + ("bin",))
    assert table(dbs["c"], "bin")[0][2:4] == (b"\xff", "blob")
    assert [r[6:8] for r in table(dbs["b"], "items") if r[0] == "raw"] == \
        [(b"\xde\xad\xbe\xef", "blob")]


def test_a_capture_stopped_by_one_table_still_says_the_table_it_created(three):
    """A capture that created a table of the family while another table's capture was
    stopped failed (exit 1) naming only the stopped table: the new table, and its rows,
    were never told (found by a probe)."""
    root, sites, dbs = three
    app(dbs["b"], ["CREATE TABLE extra(id TEXT PRIMARY KEY, v)",
                   "INSERT INTO extra VALUES ('e', 1)"])
    sp(sites["b"], "attach", dbs["b"], "--table", "extra")
    app(dbs["a"], ["CREATE TABLE extra(unrelated)"])    # a's own: extra stays available
    out = root / "drop-extra"
    sp(sites["b"], "export", "--to", "a", "--out", out, "--create-out")
    sp(sites["a"], "import", out)
    assert attached_doc(sites["a"])["available"] == ["extra"]
    app(dbs["a"], ["DROP TABLE extra", "ALTER TABLE items DROP COLUMN t"])
    r = run("capture", site=sites["a"])
    assert r.code == 1 and "capture of table items stopped" in r.err, r
    assert "created table extra in the attached database from the family's definition " \
           "(1 row(s) written)" in r.err, r
    assert table(dbs["a"], "extra") == table(dbs["b"], "extra")


def test_a_put_waits_for_a_busy_application_once(three, monkeypatch):
    """A put whose capture first found the application holding its lock through the whole
    wait waited as long again to write the record into the table (a probe's put took 120 s
    against a 60 s wait)."""
    from syncpack.attach import core
    from syncpack.errors import AttachBusyError
    root, sites, dbs = three
    waits = []

    def busy(site, **k):
        waits.append(1)
        raise AttachBusyError("the application held its lock")
    monkeypatch.setattr(core, "sync_app", busy)
    r = run("put", "items", "p", '{"id": "p", "qty": 1}', site=sites["a"])
    assert r.code == 0 and "the application held its lock; the record is in the store" \
        in r.err, r
    assert len(waits) == 1
    monkeypatch.undo()
    sp(sites["a"], "capture")
    assert [r[0] for r in table(dbs["a"], "items")][-1] == "p"


def test_a_table_detached_at_one_site_is_not_attached_again(three):
    root, sites, dbs = three
    app(dbs["a"], ["CREATE TABLE extra(id TEXT PRIMARY KEY, v)", "INSERT INTO extra VALUES "
                   "('e', 1)"])
    sp(sites["a"], "attach", dbs["a"], "--table", "extra")
    exchange(root, sites)
    sp(sites["c"], "detach", dbs["c"], "--table", "extra")
    app(dbs["a"], ["INSERT INTO extra VALUES ('e2', 2)"])
    exchange(root, sites)
    assert attached_doc(sites["c"])["available"] == ["extra"]
    assert [r[0] for r in table(dbs["c"], "extra")] == ["e"]


def test_a_site_joining_later_and_an_old_release_table_follow_the_columns(three):
    root, sites, dbs = three
    app(dbs["a"], ["ALTER TABLE items ADD COLUMN note TEXT DEFAULT 'n'",
                   "INSERT INTO items VALUES ('a3', 3, 'x', 'new')"])
    exchange(root, sites)
    # A new site whose application still runs the old release (its table lacks the column).
    d = make_family_member(root, sites, "d")
    dbd = root / "d.db"
    app(dbd, SCHEMA)
    sp(d, "attach", dbd, "--table", "items", "--table", "other")
    assert [c[0] for c in columns(dbd, "items")] == ["id", "qty", "t", "note"]
    every = {**sites, "d": d}
    exchange(root, every)
    converged(every, {**dbs, "d": dbd})


def test_a_site_joining_after_a_column_was_dropped_everywhere_fills_its_table_at_once(three):
    """The rows written before the drop still carry the column in their records; the new
    site's table, created from the family's definition, lacks it as the others do.  Its
    attach wrote only the rows written since (the older ones waited for the dropped column)
    until some later command noticed the drop."""
    root, sites, dbs = three
    for n in sites:
        app(dbs[n], ["ALTER TABLE items DROP COLUMN t"])
        sp(sites[n], "attach", dbs[n], "--refresh", "--table", "items")
    app(dbs["a"], ["INSERT INTO items VALUES ('a2', 2)"])
    exchange(root, sites)
    d = make_family_member(root, sites, "d")
    dbd = root / "d.db"
    app(dbd)
    r = sp(d, "attach", dbd, "--table", "items", "--table", "other", "--json")
    assert {t["table"]: t["rows"] for t in json.loads(r.out)["tables"]} == {
        "items": 4, "other": 3}
    e = entry(d, "items")
    assert e["rows"] == 4 and e["waiting"] == 0 and e["to_apply"] == 0, e
    assert [c[0] for c in columns(dbd, "items")] == ["id", "qty"]
    assert table(dbd, "items") == table(dbs["a"], "items")


def test_a_column_the_peers_cannot_add_stops_its_table_at_the_site_that_added_it(three):
    """A column referring to a table this site keeps to itself is one every peer refuses:
    published, each of the site's later rows waited at every peer, and only the peers'
    administrators were told.  The site adding it stops the table, says why, and the usual
    roll-out and refresh carry the rows."""
    root, sites, dbs = three
    app(dbs["a"], ["CREATE TABLE users(id TEXT PRIMARY KEY NOT NULL, name TEXT)",
                   "INSERT INTO users VALUES ('u1', 'ann')",
                   "ALTER TABLE items ADD COLUMN owner TEXT REFERENCES users(id)",
                   "INSERT INTO items VALUES ('a2', 2, 'x', 'u1')"],
        ["INSERT INTO other VALUES ('a7', 'still replicated')"])
    r = run("capture", site=sites["a"])
    assert r.code == 1, r
    assert "column owner was added with a definition the peers cannot add" in r.err
    assert "'users', which is not attached here" in r.err and "--refresh" in r.err
    assert "column owner" in entry(sites["a"], "items")["stopped"]
    exchange(root, sites)
    for n in ("b", "c"):
        assert "owner" not in [c[0] for c in columns(dbs[n], "items")]
        assert "a2" not in [row[0] for row in table(dbs[n], "items")]
        assert "a7" in [row[0] for row in table(dbs[n], "other")]
        assert run("conflicts", "items", "--json", site=sites[n]).out.count('"key"') == 0
    # the release rolls out: every site keeps users too, attached, and accepts the column
    for n in ("b", "c"):
        app(dbs[n], ["CREATE TABLE users(id TEXT PRIMARY KEY NOT NULL, name TEXT)",
                     "ALTER TABLE items ADD COLUMN owner TEXT REFERENCES users(id)"])
    for n in sites:
        sp(sites[n], "attach", dbs[n], "--table", "users")
        sp(sites[n], "attach", dbs[n], "--refresh", "--table", "items")
    exchange(root, sites)
    converged(sites, dbs, tables=(*TABLES_, "users"))
    assert ("a2", "text", 2, "integer", "x", "text", "u1", "text") in table(dbs["c"], "items")


HOSTILE = [
    "z INTEGER; DROP TABLE other",
    "w INTEGER",                                   # another column than it says
    "z INTEGER DEFAULT 1; CREATE TABLE x(y)",
    "z INTEGER) --",
    "z INTEGER UNIQUE",                            # SQLite refuses; would be unsafe anyway
    "z TEXT\x00",                                  # not even SQL text: stopped every command
    # foreign keys every insert would then fail on, the application's too
    "z REFERENCES other(v)",                       # v is no key of other
    "z REFERENCES nosuch(x)",                      # no such table here
]


@pytest.mark.parametrize("text", HOSTILE)
def test_a_hostile_schema_op_is_refused_and_changes_nothing(three, text):
    root, sites, dbs = three
    site = Site.open(sites["a"])
    try:
        d = site.get(TABLES, "items")
        d["added"] = [{"column": "z", "def": text}]
        with site.transaction() as tx:
            tx.write_raw(TABLES, "items", codec.encode_value(d))
    finally:
        site.close()
    before = schema_text(dbs["b"]), table(dbs["b"], "items"), table(dbs["b"], "other")
    export_to(root, sites, "a", ["b"])
    assert (schema_text(dbs["b"]), table(dbs["b"], "items"), table(dbs["b"], "other")) == before
    r = sp(sites["b"], "capture", "--json")
    assert "was refused" in json.loads(r.out)["refused"][0]
    assert "was refused" in r.err
    app(dbs["b"], ["INSERT INTO items VALUES ('b7', 7, 'q')"])
    exchange(root, sites)
    converged(sites, dbs)


# --- the pure rules -----------------------------------------------------------------------------

AFF = st.sampled_from(["INTEGER", "REAL", "TEXT", "BLOB", "NUMERIC"])
NAMES = st.lists(st.from_regex(r"[a-z]{1,6}", fullmatch=True), min_size=1, max_size=6,
                 unique=True)


@st.composite
def shapes_(draw):
    cols = draw(NAMES)
    aff = {c: draw(AFF) for c in cols}
    pk = cols[:draw(st.integers(1, len(cols)))]
    return cols, aff, pk


@given(shapes_(), st.lists(st.from_regex(r"[A-Z]{1,6}", fullmatch=True), max_size=3,
                           unique=True))
def test_appended_columns_are_adds_and_nothing_else(s, extra):
    cols, aff, pk = s
    old = shapes.shape(cols, aff, pk, [])
    assert shapes.compare(old, old) == ([], [])
    new = shapes.shape(cols + extra, {**aff, **{e: "TEXT" for e in extra}}, pk, [])
    assert shapes.compare(old, new) == (extra, [])


@given(shapes_(), st.data())
def test_a_column_added_among_the_old_ones_is_unsafe(s, data):
    # a table made again with a new column before some old ones: taken as one added at the
    # end, it never travelled, and the peers' records waited for it for good
    cols, aff, pk = s
    old = shapes.shape(cols, aff, pk, [])
    at = data.draw(st.integers(0, len(cols) - 1))
    new_cols = cols[:at] + ["NEWCOL"] + cols[at:]
    adds, problems = shapes.compare(old, shapes.shape(new_cols, {**aff, "NEWCOL": "TEXT"},
                                                      pk, []))
    assert adds == [] and problems == [
        "column NEWCOL was added between existing columns, not at the end"]


@given(shapes_(), st.data())
def test_a_dropped_or_retyped_column_is_unsafe(s, data):
    cols, aff, pk = s
    old = shapes.shape(cols, aff, pk, [])
    gone = data.draw(st.sampled_from(cols))
    kept = [c for c in cols if c != gone]
    adds, problems = shapes.compare(old, shapes.shape(kept, aff, [c for c in pk if c != gone],
                                                      []))
    assert adds == [] and any(f"column {gone} was dropped" in p for p in problems)
    other = data.draw(AFF.filter(lambda a: a != aff[gone]))
    _a, problems = shapes.compare(old, shapes.shape(cols, {**aff, gone: other}, pk, []))
    assert any("type affinity" in p for p in problems)
    _a, problems = shapes.compare(old, shapes.shape(cols, aff, pk, [[gone]]))
    assert any("UNIQUE" in p for p in problems)


# a column name SQLite takes bare: not one of its keywords ('as', 'if', 'to' ... need quotes)
DEFS = st.tuples(st.from_regex(r"[a-z]{1,5}", fullmatch=True).filter(
                     lambda n: n.upper() not in apsw.keywords),
                 st.sampled_from(["", " INTEGER", " TEXT", " REAL", " text"]),
                 st.sampled_from(["", " DEFAULT 0", " NOT NULL DEFAULT 'a,)b'", " DEFAULT -1.5",
                                  " CHECK (1)", " COLLATE NOCASE", " /* a, ( */ CHECK (2)"]))


@settings(max_examples=60)
@given(DEFS, st.sampled_from(["CREATE TABLE t(id TEXT PRIMARY KEY, v)",
                              "CREATE TABLE t(\n  id TEXT PRIMARY KEY,\n  v\n)",
                              'CREATE TABLE "t" (id, v, PRIMARY KEY(id)) WITHOUT ROWID']))
def test_added_text_is_what_sqlite_spliced_in(d, create):
    name, decl, rest = d
    if name in ("id", "v") or ("NOT NULL" in rest and "DEFAULT" not in rest):
        return
    c = sqlite3.connect(":memory:")
    c.execute(create)
    old = c.execute("SELECT sql FROM sqlite_schema WHERE name='t'").fetchone()[0]
    coldef = f"{name}{decl}{rest}"
    c.execute(f"ALTER TABLE t ADD COLUMN {coldef}")
    new = c.execute("SELECT sql FROM sqlite_schema WHERE name='t'").fetchone()[0]
    text = shapes.added_text(old, new)
    assert text == coldef and shapes.defines(text, name)


@settings(max_examples=40)
@given(st.lists(DEFS, min_size=2, max_size=4, unique_by=lambda d: d[0]),
       st.sampled_from(["CREATE TABLE t(id TEXT PRIMARY KEY, v)",
                        'CREATE TABLE "t" (id, v, PRIMARY KEY(id)) WITHOUT ROWID']))
def test_several_added_columns_are_each_as_written(ds, create):
    """Several ADD COLUMNs between two captures: each column's definition is found whole
    (its CHECK, COLLATE, quoted DEFAULT with commas), one after another."""
    defs = [f"{n}{decl}{rest}" for n, decl, rest in ds
            if n not in ("id", "v") and not ("NOT NULL" in rest and "DEFAULT" not in rest)]
    if len(defs) < 2:
        return
    c = sqlite3.connect(":memory:")
    c.execute(create)
    old = c.execute("SELECT sql FROM sqlite_schema WHERE name='t'").fetchone()[0]
    for d in defs:
        c.execute(f"ALTER TABLE t ADD COLUMN {d}")
    new = c.execute("SELECT sql FROM sqlite_schema WHERE name='t'").fetchone()[0]
    assert sqltext.split_top_level(shapes.added_text(old, new)) == defs


def test_columns_added_together_keep_their_checks_at_the_peers(three):
    root, sites, dbs = three
    app(dbs["a"], ["ALTER TABLE items ADD COLUMN score REAL DEFAULT 0.5 CHECK (score >= 0)",
                   "ALTER TABLE items ADD COLUMN tag TEXT COLLATE NOCASE"])
    exchange(root, sites)
    want = [c for c in schema_text(dbs["a"]) if c[1] == "items"]
    assert "CHECK (score >= 0)" in want[0][2] and "COLLATE NOCASE" in want[0][2]
    for n in ("b", "c"):
        assert [c for c in schema_text(dbs[n]) if c[1] == "items"] == want


def test_a_generated_column_added_beside_others_leaves_their_checks_whole(three):
    """A generated column added in the same capture has a definition and no place among the
    row's columns: the definitions were then matched to the columns by count, which
    differed, and every added column travelled without its CHECK, REFERENCES and COLLATE."""
    root, sites, dbs = three
    app(dbs["a"], ["ALTER TABLE items ADD COLUMN ck INTEGER CHECK (ck > 0)",
                   "ALTER TABLE items ADD COLUMN g INTEGER GENERATED ALWAYS AS (qty * 2) "
                   "VIRTUAL",
                   "ALTER TABLE items ADD COLUMN cc TEXT /* a, ( */ COLLATE NOCASE"])
    exchange(root, sites)
    for n in ("b", "c"):
        text = [c for c in schema_text(dbs[n]) if c[1] == "items"][0][2]
        assert "ck INTEGER CHECK (ck > 0)" in text and "COLLATE NOCASE" in text, (n, text)


def test_a_winning_record_from_before_a_column_gives_the_row_that_columns_default(three):
    """a adds a column and sets it on a row; b, before it has the column, updates the same
    row later, and b's version wins (lww).  That version stands for a row with the column's
    default, as b's own row has once b adds the column: a's table must say so too, or the
    two tables differ for good while the records agree."""
    root, sites, dbs = three
    app(dbs["a"], ["ALTER TABLE items ADD COLUMN note TEXT NOT NULL DEFAULT 'none'",
                   "UPDATE items SET note = 'fresh' WHERE id = 'a1'"])
    sp(sites["a"], "capture")
    app(dbs["b"], ["UPDATE items SET qty = 9 WHERE id = 'a1'"])
    sp(sites["b"], "capture")
    exchange(root, sites)
    rows = {n: {r[0]: r for r in table(dbs[n], "items")} for n in sites}
    assert rows["a"]["a1"][2] == 9 and rows["a"]["a1"][6] == "none"
    converged(sites, dbs)


def test_a_change_to_a_renamed_column_made_while_stopped_is_taken_by_the_refresh(tmp_path):
    """A release renames a column; the application writes the new name while capture is
    stopped; the refresh compares the whole row, new column included (its value against the
    column's default where the record predates it), so the change travels; the other site,
    still on the old release meanwhile, converges once it upgrades too."""
    from test_attach import attached_pair
    sites, dbs = attached_pair(tmp_path, ["CREATE TABLE t(id TEXT PRIMARY KEY NOT NULL, "
                                          "v TEXT)"],
                               ["INSERT INTO t VALUES ('k1', 'x')"], ["t"])
    app(dbs["a"], ["ALTER TABLE t RENAME COLUMN v TO w", "UPDATE t SET w = 'y' "
                   "WHERE id = 'k1'"])
    assert run("capture", site=sites["a"]).code == 1        # stopped, as documented
    r = sp(sites["a"], "attach", dbs["a"], "--refresh", "--json")
    assert json.loads(r.out)["refreshed"][0]["changes"] >= 1, r.out
    app(dbs["b"], ["INSERT INTO t VALUES ('k2', 'z')"])
    exchange(tmp_path, sites, rounds=1)
    app(dbs["b"], ["ALTER TABLE t RENAME COLUMN v TO w"])
    sp(sites["b"], "attach", dbs["b"], "--refresh")
    exchange(tmp_path, sites, rounds=2)
    assert table(dbs["a"], "t") == table(dbs["b"], "t") == [
        ("k1", "text", "y", "text"), ("k2", "text", "z", "text")]
    for n in sites:
        assert run("fsck", site=sites[n]).code == 0


@given(st.sampled_from(["", " DEFAULT 0", " DEFAULT -1.5", " DEFAULT 'a,b'", " DEFAULT NULL",
                        " DEFAULT x'00ff'", " DEFAULT CURRENT_TIMESTAMP", " DEFAULT (1 + 1)",
                        " DEFAULT '5'", " DEFAULT 0x10", " DEFAULT 7.0", " DEFAULT '1e3'"]),
       st.sampled_from(["", "INTEGER", "REAL", "TEXT", "NUMERIC", "BLOB"]))
def test_constant_defaults_are_the_values_sqlite_gives(dflt, decl):
    from syncpack.store import appdb
    c = apsw.Connection(":memory:")
    c.execute(f"CREATE TABLE t(id TEXT PRIMARY KEY, v {decl}{dflt})")
    c.execute("INSERT INTO t(id) VALUES ('k')")
    got = appdb.constant_defaults(c, appdb.table_info(c, "t"))
    if "CURRENT" in dflt or "(" in dflt:
        assert "v" not in got          # not the same at every site: left out
    else:
        want = c.execute("SELECT v, typeof(v) FROM t").fetchone()
        assert (got["v"], type(got["v"])) == (want[0], type(want[0])), (got, want)


@pytest.mark.parametrize("lie", [
    {"table": "items", "added": 5},
    {"table": "items", "dropped": 5},
    {"table": "items", "dropped": "qty"},        # read as q, t, y: t is a column
    {"table": "evil", "create_sql": "CREATE TABLE evil(id TEXT PRIMARY KEY, v\x00)"},
    {"table": "evil", "create_sql": "CREATE TABLE evil(id TEXT PRIMARY KEY, r REFERENCES "
                                    "other(v))"},
    {"table": "evil", "create_sql": "CREATE TABLE evil(id TEXT PRIMARY KEY, r REFERENCES "
                                    "nosuch(x))"},
    {"table": "evil", "create_sql": "CREATE TABLE evil(id TEXT PRIMARY KEY, "
                                    + ", ".join(f"c{i}" for i in range(950)) + ")"},
    # an endless query: it held the application's write lock for good, every command after
    {"table": "evil", "create_sql": "CREATE TABLE evil AS WITH RECURSIVE r(x) AS (SELECT 1 "
                                    "UNION ALL SELECT x + 1 FROM r) SELECT x AS id FROM r "
                                    "WHERE x < 0"},
    # a few bytes of definition that make every row written huge
    {"table": "evil", "create_sql": "CREATE TABLE evil(id TEXT PRIMARY KEY, "
                                    "g DEFAULT (zeroblob(100000000)))"},
    {"table": "evil", "create_sql": "CREATE TABLE evil(id TEXT PRIMARY KEY, "
                                    "g BLOB AS (zeroblob(100000000)) STORED)"},
    # syncpack's own clean-up of its change table then failed at every command
    {"table": "evil", "create_sql": "CREATE TABLE evil(id TEXT PRIMARY KEY, "
                                    "s INTEGER REFERENCES _syncpack_changes(seq))"},
    {"table": "evil", "create_sql": "CREATE TABLE evil(id TEXT PRIMARY KEY, v DEFAULT '"
                                    + "x" * 300_000 + "')"},
    # an added column whose CHECK binds the application's other columns: its own writes failed
    {"table": "items", "added": [{"column": "c", "def": "c TEXT CHECK (id = 'a' AND "
                                                        "qty < 2)"}]},
    {"table": "items", "added": [{"column": "c", "def": "c INTEGER REFERENCES "
                                                        "_syncpack_changes(seq)"}]},
    {"table": "items", "added": [{"column": "c", "def": "c BLOB DEFAULT "
                                                        "(randomblob(100000000))"}]},
    {"table": "items", "added": [{"column": "c", "def": "c TEXT DEFAULT '"
                                                        + "x" * 300_000 + "'"}]},
    # values doubled by each nested call, or copied by each ||, at every write here
    {"table": "evil", "create_sql": "CREATE TABLE evil(id TEXT PRIMARY KEY, b BLOB, "
                                    "CHECK (length(hex(hex(hex(hex(hex(b)))))) > 0))"},
    {"table": "evil", "create_sql": "CREATE TABLE evil(id TEXT PRIMARY KEY, b BLOB, g AS ("
                                    + " || ".join(["b"] * 40) + ") STORED)"},
    {"table": "items", "added": [{"column": "c", "def": "c TEXT CHECK (c LIKE "
                                                        "'%a%a%a%a%a%a%a%a%a%b')"}]},
    # cheap functions made costly: ltrim's cost is the product of its arguments' lengths;
    # generated columns that double each other; a literal DEFAULT of a quarter megabyte
    {"table": "items", "added": [{"column": "c", "def": "c TEXT DEFAULT 'a' CHECK (ltrim("
                                                        "c || c, 'ab') IS NOT NULL)"}]},
    {"table": "evil", "create_sql": "CREATE TABLE evil(id TEXT PRIMARY KEY, a TEXT, "
                                    "g1 TEXT AS (a || a) STORED, g2 TEXT AS (g1 || g1) STORED)"},
    {"table": "items", "added": [{"column": "c", "def": "c TEXT DEFAULT '"
                                                        + "x" * 2000 + "'"}]},
    {"table": "items", "added": [{"column": "c", "def": "c TEXT CHECK (length(" + "upper(" * 8
                                                        + "c" + ")" * 8 + ") > 0)"}]},
    # every INSERT into the table built the 30,000 values anew: 1,000 times slower, the
    # application's own too; a chain of ORs tested in turn
    {"table": "items", "added": [{"column": "c", "def": "c INTEGER CHECK (c IN ("
                                  + ",".join(map(str, range(30_000))) + "))"}]},
    {"table": "evil", "create_sql": "CREATE TABLE evil(id TEXT PRIMARY KEY, v INTEGER CHECK ("
                                    + " OR ".join(f"v = {i}" for i in range(900)) + "))"},
], ids=["added-not-a-list", "dropped-not-a-list", "dropped-a-text", "nul", "fk-to-no-key",
        "fk-to-no-table", "950-columns", "endless-query", "huge-default", "huge-generated",
        "fk-to-syncpack", "huge-text", "column-binding-others", "column-fk-to-syncpack",
        "column-huge-default", "column-huge-text", "nested-hex", "concatenated",
        "column-like-backtracking", "column-slow-check", "doubling-generated",
        "column-long-literal", "column-many-calls", "column-long-in-list", "or-chain"])
def test_a_lying_table_definition_stops_nothing_and_leaves_the_schema(three, lie):
    """A member's definition of a table: fields of the wrong kind stopped every command at
    the sites with the table attached (an internal error, for good); a new table whose
    foreign keys cannot work was created, after which the application could no longer insert
    into it or change the table it names, and every import failed blaming the site store.
    A definition or an added column is the peers' text run against the application's file:
    no query, no function but cheap ones, no other column named by an added one, no key to
    syncpack's tables, no text beyond a size."""
    root, sites, dbs = three
    lie = dict(lie)
    name = lie.pop("table")
    with Site.open(sites["a"]) as site:
        d = site.get(TABLES, name, None) or {"pk": ["id"], "columns": ["id"]}
        d.update(lie)
        with site.transaction(_system=True) as tx:
            tx.write_raw(TABLES, name, codec.encode_value(d))
            if name == "evil":
                tx.put("evil", "e1", {"id": "e1"})
    before = schema_text(dbs["b"]), table(dbs["b"], "items"), table(dbs["b"], "other")
    export_to(root, sites, "a", ["b"])
    assert (schema_text(dbs["b"]), table(dbs["b"], "items"), table(dbs["b"], "other")) == before
    for command in (["capture"], ["status"], ["fsck"]):
        sp(sites["b"], *command)
    app(dbs["b"], ["INSERT INTO items VALUES ('b7', 7, 'q')",
                   "UPDATE other SET v = 5 WHERE id = 'b1'"])
    exchange(root, sites)
    converged(sites, dbs)


def test_a_peers_definition_of_literals_keys_and_types_is_created(three):
    """What a definition from the peers may hold: types (STRICT, WITHOUT ROWID), NOT NULL,
    literal defaults (the clock's too), collations, foreign keys to the application's
    tables."""
    root, sites, dbs = three
    create = ("CREATE TABLE legit(id TEXT PRIMARY KEY NOT NULL, n INTEGER NOT NULL DEFAULT 0, "
              "t TEXT DEFAULT 'it''s', at TEXT DEFAULT CURRENT_TIMESTAMP, neg INTEGER DEFAULT "
              "(-1), x BLOB DEFAULT x'00ff', name TEXT COLLATE NOCASE, "
              "ref TEXT REFERENCES items(id)) STRICT, WITHOUT ROWID")
    app(dbs["a"], [create, "INSERT INTO legit(id, ref) VALUES ('l1', 'a1')"])
    sp(sites["a"], "attach", dbs["a"], "--table", "legit")
    exchange(root, sites)
    for n in ("b", "c"):
        assert [r for r in schema_text(dbs[n]) if r[1] == "legit"] == \
            [r for r in schema_text(dbs["a"]) if r[1] == "legit"], n
    converged(sites, dbs, tables=TABLES_ + ("legit",))


def test_new_tables_whose_foreign_keys_refer_to_each_other_are_created_parents_first(three):
    """A site that follows the family's new tables created 'orders' before the 'users' it
    refers to: SQLite then refused every insert into it ('no such table: main.users'), which
    stopped the import, blamed the site store, and left 'orders' attached but missing."""
    root, sites, dbs = three
    app(dbs["a"], ["CREATE TABLE users(id TEXT PRIMARY KEY, name TEXT)",
                   "CREATE TABLE orders(id TEXT PRIMARY KEY, uid TEXT REFERENCES users(id))",
                   "INSERT INTO users VALUES ('u1', 'ann')",
                   "INSERT INTO orders VALUES ('o1', 'u1')"])
    sp(sites["a"], "attach", dbs["a"], "--table", "orders", "--table", "users")
    exchange(root, sites)
    for n in ("b", "c"):
        assert table(dbs[n], "orders") == table(dbs["a"], "orders")
        assert table(dbs[n], "users") == table(dbs["a"], "users")
    app(dbs["b"], ["PRAGMA foreign_keys=ON", "INSERT INTO users VALUES ('u2', 'bo')",
                   "INSERT INTO orders VALUES ('o2', 'u2')"])
    exchange(root, sites)
    converged(sites, dbs, tables=TABLES_ + ("users", "orders"))


@pytest.mark.parametrize("column", [
    "note TEXT NOT NULL DEFAULT 'none'", "note TEXT",
    # a default whose constant the column's affinity converts: rows hold 0.0, 5 and 16, and
    # the bare constant made every row differ from its default (fsck failed everywhere)
    "note REAL NOT NULL DEFAULT 0", "note INTEGER DEFAULT '5'", "note INTEGER DEFAULT 0x10"])
def test_under_merge_a_row_from_before_an_added_column_changes_only_what_was_written(
        tmp_path, column):
    """b sets the added column of an older row; a, later, sets another column of it.  a's
    record of the row predated the column, so a's capture counted the column's default as
    a change too, which overrode b's edit at every site (a conflict of that field)."""
    sites = make_family(tmp_path, ("a", "b"))
    sp(sites["a"], "collection", "create", "items", "--policy", "merge")
    exchange(tmp_path, sites, rounds=1)
    dbs = attached_everywhere(tmp_path, sites, "CREATE TABLE items(id TEXT PRIMARY KEY NOT "
                              "NULL, qty INTEGER)", ["INSERT INTO items VALUES ('k', 2)"],
                              "items", rounds=1)
    app(dbs["a"], [f"ALTER TABLE items ADD COLUMN {column}"])
    exchange(tmp_path, sites, rounds=1)
    app(dbs["b"], ["UPDATE items SET note = 'from b' WHERE id = 'k'"])
    sp(sites["b"], "capture")
    app(dbs["a"], ["UPDATE items SET qty = 99 WHERE id = 'k'"])
    sp(sites["a"], "capture")
    exchange(tmp_path, sites)
    for n in sites:
        assert [r[:6:2] for r in table(dbs[n], "items")] == [("k", 99, "from b")]
        assert run("--json", "conflicts", site=sites[n]).json["conflicts"] == []
        sp(sites[n], "fsck")


def test_a_unique_index_the_application_drops_takes_syncpacks_trigger_on_it_along(tmp_path):
    """syncpack notes the rows a REPLACE removes with triggers that name each UNIQUE index's
    columns; after the application dropped the index they still named them, and SQLite
    refused the application's DROP COLUMN of that column ('error in trigger
    _syncpack_users_rep'), which it does not without syncpack.  The next command rebuilds
    them; a command with nothing to change leaves the schema alone."""
    sites = make_family(tmp_path, ("a",))
    db = tmp_path / "a.db"
    app(db, ["CREATE TABLE users(id TEXT PRIMARY KEY NOT NULL, email TEXT, "
             "nick TEXT UNIQUE, v INTEGER)", "CREATE UNIQUE INDEX users_email ON users(email)",
             "INSERT INTO users VALUES ('u1', 'x@y', 'ux', 1)"])
    sp(sites["a"], "attach", db, "--table", "users")

    def schema_version() -> int:
        c = sqlite3.connect(db)
        try:
            return c.execute("PRAGMA schema_version").fetchone()[0]
        finally:
            c.close()

    before = schema_version()
    sp(sites["a"], "capture")
    assert schema_version() == before           # nothing rebuilt when nothing changed
    app(db, ["DROP INDEX users_email"])
    sp(sites["a"], "capture")
    app(db, ["ALTER TABLE users DROP COLUMN email"])    # refused before
    app(db, ["INSERT OR REPLACE INTO users(id, nick, v) VALUES ('u2', 'ux', 2)"])
    r = run("--json", "attached", site=sites["a"])
    assert r.code == 0, r


def test_a_column_no_index_names_drops_beside_expression_and_partial_unique_indexes(tmp_path):
    """The triggers that note rows a REPLACE removes under a UNIQUE index on an expression or
    with a WHERE clause named every column of the table, so SQLite refused the application's
    DROP COLUMN of a column no index names ('no such column: NEW.note'), which it does not
    without syncpack.  They name only the columns the index does; a REPLACE is still seen."""
    sites = make_family(tmp_path, ("a",))
    db = tmp_path / "a.db"
    app(db, ["CREATE TABLE u(id TEXT PRIMARY KEY NOT NULL, email TEXT, note TEXT)",
             "CREATE UNIQUE INDEX u_email ON u(lower(email))",
             "CREATE TABLE p(id TEXT PRIMARY KEY NOT NULL, v INTEGER, note TEXT)",
             "CREATE UNIQUE INDEX p_v ON p(v) WHERE v > 100",
             "INSERT INTO u VALUES ('u1', 'X@y', 'n'), ('u2', 'z@y', 'n')",
             "INSERT INTO p VALUES ('p1', 101, 'n'), ('p2', 5, 'n')"])
    sp(sites["a"], "attach", db, "--table", "u", "--table", "p")
    app(db, ["ALTER TABLE u DROP COLUMN note"], ["ALTER TABLE p DROP COLUMN note"])
    sp(sites["a"], "attach", db, "--refresh")       # the family takes the new shape
    app(db, ["INSERT OR REPLACE INTO u VALUES ('u3', 'x@Y')",
             "INSERT OR REPLACE INTO p VALUES ('p3', 101)"])
    sp(sites["a"], "capture")
    for t, gone in (("u", "u1"), ("p", "p1")):
        assert run("get", t, gone, site=sites["a"]).code != 0, t    # the REPLACE's delete
    assert run("fsck", site=sites["a"]).code == 0


@pytest.mark.parametrize("create_sql, why", [
    ("CREATE TABLE evil(id TEXT PRIMARY KEY, g DEFAULT (randomblob(9)))", "randomblob()"),
    # made, attached and its triggers installed, then every row refused, the application's
    # own too ("no such collation sequence"), listed as a clash for good
    ("CREATE TABLE evil(id TEXT PRIMARY KEY, x TEXT CHECK (x = 'a' COLLATE nosuch))",
     "SQLite refuses to write here")], ids=["function", "collation"])
def test_capture_says_why_a_new_table_of_the_family_was_not_created(three, create_sql, why):
    """A peer's definition this site refuses left the table only 'available', and no command
    said why; capture tells it, as it tells a refused column.  Nothing of it is made in the
    application's file."""
    root, sites, dbs = three
    before = schema_text(dbs["b"])
    with Site.open(sites["a"]) as site, site.transaction(_system=True) as tx:
        tx.write_raw(TABLES, "evil", codec.encode_value({
            "pk": ["id"], "columns": ["id", "g"], "create_sql": create_sql}))
        tx.write_raw("evil", "e1", codec.encode_value({"id": "e1"}))
    export_to(root, sites, "a", ["b"])
    r = run("--json", "capture", site=sites["b"])
    assert r.code == 0 and any("table evil of the family was not created here" in w and
                               why in w for w in r.json["refused"]), r
    assert "evil" in run("--json", "attached", site=sites["b"]).json["available"]
    assert schema_text(dbs["b"]) == before
    sp(sites["b"], "fsck")


_SQL_PIECES = st.sampled_from(["a", " ", "||", "|", "(", ")", ",", "'x||y'", '"n||m"',
                               "[p||q]", "/* || */", "-- ||\n", "b"])


@given(st.lists(_SQL_PIECES, max_size=30))
def test_concatenations_and_commas_are_counted_outside_quotes_and_comments(pieces):
    """A peer's definition is refused past a number of ||; one inside a string, a quoted
    name or a comment copies nothing."""
    text = "".join(pieces)
    bare = "".join(p if p in ("a", " ", "||", "|", "(", ")", ",", "b") else " "
                   for p in pieces)
    assert sqltext.concatenations(text) == sqltext.concatenations(bare)
    assert sqltext.concatenations(bare) == sum(len(r) // 2 for r in re.findall(r"\|+", bare))
    assert len(sqltext.split_top_level(text)) == len(sqltext.split_top_level(bare))


def test_expression_terms_count_in_list_values_and_branches_outside_quotes():
    assert sqltext.expression_terms("CREATE TABLE t(a, b CHECK (b IN (1, 2, 3)), "
                                    "c CHECK (c > 0 AND c < 9 OR c IS NULL))") == 5
    # a value holding a comma, a parenthesised one and a call are one each
    assert sqltext.expression_terms("x IN ('a,b', (1), f(2, 3))") == 3
    assert sqltext.expression_terms("note TEXT /* or and */ DEFAULT 'or, and, when'") == 0
    assert sqltext.expression_terms("mOrder INTEGER, brand TEXT, INdex INTEGER") == 0
    assert sqltext.expression_terms("CASE WHEN a THEN 1 WHEN b THEN 2 END") == 2


@pytest.mark.parametrize("cols", [5, [["id"], {"a": 1}]], ids=["a-number", "not-names"])
def test_a_definition_whose_columns_are_no_names_stops_no_later_schema_change(three, cols):
    """A member's definition whose columns are not a list of names: once the application
    at a site holding it added a column, every command there (capture, status, export,
    import) failed with an internal error, for good, and a corrected definition could not
    get in either."""
    root, sites, dbs = three
    with Site.open(sites["a"]) as site:
        d = site.get(TABLES, "items")
        d["columns"] = cols
        with site.transaction(_system=True) as tx:
            tx.write_raw(TABLES, "items", codec.encode_value(d))
    export_to(root, sites, "a", ["b"])
    app(dbs["b"], ["ALTER TABLE items ADD COLUMN note TEXT",
                   "INSERT INTO items VALUES ('b7', 7, 'q', 'n')"])
    for command in (["capture"], ["status"], ["fsck"]):
        sp(sites["b"], *command)
    exchange(root, sites)
    converged(sites, dbs)
    assert [c[0] for c in columns(dbs["a"], "items")][-1] == "note"


@pytest.mark.parametrize("text", [
    "x INTEGER NOT NULL",                          # SQLite adds it to an empty table
    "x INTEGER DEFAULT 0 CHECK (x > 0)",
    "x TEXT DEFAULT 'o1' REFERENCES other(id)",    # a parent row some site may lack
    "x TEXT DEFAULT 's' REFERENCES secrets(id)",
    "x TEXT REFERENCES secrets(id)",               # a table b keeps to itself
])
def test_an_added_column_that_would_refuse_the_old_releases_rows_is_refused(three, text):
    """A schema op whose column a row written without it would break: added to a table
    with no rows (where SQLite takes a NOT NULL column without a default), it made every
    insert of the application's release that does not know the column fail, at that site
    and at every site that created the table later.  One referring to a table not attached
    at b, as a peer's new table may not: the peers' rows would keep b's application from
    deleting its own rows."""
    root, sites, dbs = three
    app(dbs["b"], ["CREATE TABLE secrets(id TEXT PRIMARY KEY)", "INSERT INTO secrets "
                   "VALUES ('s')", "DELETE FROM items"])
    sp(sites["b"], "capture")
    with Site.open(sites["a"]) as site:
        d = site.get(TABLES, "items")
        d["added"] = [{"column": "x", "def": text}]
        with site.transaction(_system=True) as tx:
            tx.write_raw(TABLES, "items", codec.encode_value(d))
    before = schema_text(dbs["b"])
    export_to(root, sites, "a", ["b"])
    r = run("--json", "capture", site=sites["b"])
    assert r.code == 0 and "was refused" in r.json["refused"][0], r
    assert schema_text(dbs["b"]) == before
    app(dbs["b"], ["PRAGMA foreign_keys = ON", "INSERT INTO items VALUES ('b7', 7, 'q')",
                   "DELETE FROM secrets"])
    exchange(root, sites)
    converged(sites, dbs)


def test_a_new_table_referring_to_a_table_not_attached_here_is_not_created(three):
    """A member's new table whose foreign key refers to a table the application keeps to
    itself here: created and filled unasked, its rows kept the application from deleting its
    own row (FOREIGN KEY constraint failed).  An administrator may still attach it."""
    root, sites, dbs = three
    app(dbs["b"], ["CREATE TABLE secrets(id TEXT PRIMARY KEY)",
                   "INSERT INTO secrets VALUES ('s')"])
    with Site.open(sites["a"]) as site, site.transaction(_system=True) as tx:
        tx.write_raw(TABLES, "evil", codec.encode_value({
            "pk": ["id"], "columns": ["id", "v"],
            "create_sql": "CREATE TABLE evil(id TEXT PRIMARY KEY, v REFERENCES secrets(id))"}))
        tx.put("evil", "e1", {"id": "e1", "v": "s"})
    export_to(root, sites, "a", ["b"])
    r = run("--json", "capture", site=sites["b"])
    assert r.code == 0 and any("not created here" in w and "not attached here" in w
                               for w in r.json["refused"]), r
    assert "evil" not in [n for _t, n, _s in schema_text(dbs["b"])]
    app(dbs["b"], ["PRAGMA foreign_keys = ON", "DELETE FROM secrets",
                   "INSERT INTO secrets VALUES ('s')"])
    sp(sites["b"], "attach", dbs["b"], "--table", "evil")
    sp(sites["b"], "capture")
    assert table(dbs["b"], "evil") == [("e1", "text", "s", "text")]


def test_a_peers_table_named_as_one_of_the_applications_but_for_case_is_left_alone(three):
    """A member attached 'Notes'; this application has its own 'notes' (SQLite's names ignore
    case).  Every capture here tried to create 'Notes', failed ('already exists'), and said
    so with a hint that could not help.  It is a table the application has: left alone,
    'available', without a word."""
    root, sites, dbs = three
    app(dbs["b"], ["CREATE TABLE notes(id TEXT PRIMARY KEY, mine TEXT)",
                   "INSERT INTO notes VALUES ('n', 'private')"])
    app(dbs["a"], ["CREATE TABLE Notes(id TEXT PRIMARY KEY, text TEXT)",
                   "INSERT INTO Notes VALUES ('x', 'shared')"])
    sp(sites["a"], "attach", dbs["a"], "--table", "Notes")
    export_to(root, sites, "a", ["b"])
    for _ in range(2):
        r = run("--json", "capture", site=sites["b"])
        assert r.code == 0 and r.json["refused"] == [], r
        assert "warning" not in r.err, r
    assert table(dbs["b"], "notes") == [("n", "text", "private", "text")]
    assert run("fsck", site=sites["b"]).code == 0


def test_a_column_added_past_the_most_an_attached_table_may_have_stops_its_capture(tmp_path):
    """attach refuses a table of more than 900 columns, but an application's ADD COLUMN took
    an attached table of 900 to 901: its capture went on, every peer refused the new
    definition, and the rows then waited at each of them for good, with no word at the
    origin.  The capture of that table now stops there, saying why, and a refresh refuses it
    as attach does."""
    sites = make_family(tmp_path, ("a", "b"))
    cols = ", ".join(f"c{i}" for i in range(899))
    dbs = attached_everywhere(tmp_path, sites, f"CREATE TABLE wide(id TEXT PRIMARY KEY, {cols})",
                              ["INSERT INTO wide(id, c0) VALUES ('w', 1)"], "wide")
    app(dbs["a"], ["ALTER TABLE wide ADD COLUMN c899 TEXT DEFAULT 'd'",
                   "UPDATE wide SET c899 = 'new', c0 = 2 WHERE id = 'w'"])
    r = run("capture", site=sites["a"])
    assert r.code == 1 and "wide has 901 columns, more than the 900" in r.err, r
    r = run("attach", dbs["a"], "--refresh", "--table", "wide", site=sites["a"])
    assert r.code == 1 and "wide has 901 columns" in r.err, r
    app(dbs["a"], ["ALTER TABLE wide DROP COLUMN c899"])
    sp(sites["a"], "attach", dbs["a"], "--refresh", "--table", "wide")
    exchange(tmp_path, sites, rounds=2)
    assert table(dbs["b"], "wide")[0][2:4] == (2, "integer")
    for n in sites:
        assert run("fsck", site=sites[n]).code == 0


def test_an_added_column_referring_to_a_table_attached_everywhere_is_followed(three):
    """The rule above refuses a reference to a table a site keeps to itself, not one to a
    table every site replicates."""
    root, sites, dbs = three
    app(dbs["a"], ["ALTER TABLE items ADD COLUMN o TEXT REFERENCES other(id)",
                   "INSERT INTO items VALUES ('a5', 5, 'q', 'a1')"])
    exchange(root, sites)
    converged(sites, dbs)
    for n in ("b", "c"):
        assert [c[0] for c in columns(dbs[n], "items")][-1] == "o"
        with sqlite3.connect(dbs[n]) as c:
            assert c.execute("SELECT `table` FROM pragma_foreign_key_list('items')"
                             ).fetchall() == [("other",)]


@pytest.mark.parametrize("create_sql, said", [
    ("CREATE TABLE evil(id TEXT PRIMARY KEY); CREATE TABLE more(x)", "not one CREATE TABLE"),
    ("CREATE TABLE elsewhere(id TEXT PRIMARY KEY)", "creates another table"),
])
def test_a_refused_peers_definition_says_what_to_do_instead(three, create_sql, said):
    """Every refusal of a peer's table definition at attach tells the administrator the way
    out: create the table with the application's own schema, then attach it."""
    root, sites, dbs = three
    with Site.open(sites["a"]) as site, site.transaction(_system=True) as tx:
        tx.write_raw(TABLES, "evil", codec.encode_value(
            {"pk": ["id"], "columns": ["id"], "create_sql": create_sql}))
        tx.put("evil", "e1", {"id": "e1"})
    export_to(root, sites, "a", ["b"])
    before = schema_text(dbs["b"])
    r = run("attach", dbs["b"], "--table", "evil", site=sites["b"])
    assert r.code == 1 and said in r.err, r
    assert "hint: create the table" in r.err and "Traceback" not in r.err, r
    assert schema_text(dbs["b"]) == before


def _merge_row_at_three_sites(tmp_path):
    """Sites a, b, c with ``items`` under 'merge', one row k1 = (1, 'n') in every table."""
    sites = make_family(tmp_path)
    sp(sites["a"], "collection", "create", "items", "--policy", "merge")
    exchange(tmp_path, sites)
    dbs = {n: tmp_path / f"{n}.db" for n in sites}
    app(dbs["a"], SCHEMA, ["INSERT INTO items VALUES ('k1', 1, 'n')"])
    sp(sites["a"], "attach", dbs["a"], "--table", "items")
    exchange(tmp_path, sites)
    for n in ("b", "c"):
        dbs[n].touch()          # the table is made from the definition that travels
        sp(sites[n], "attach", dbs[n], "--table", "items")
    exchange(tmp_path, sites)
    return sites, dbs


def _both_edits_everywhere(sites, dbs) -> None:
    for n in sites:
        assert table(dbs[n], "items") == [("k1", "text", 5, "integer", "m", "text")], n
        assert run("conflicts", site=sites[n], json_mode=True).json["conflicts"] == [], n


def test_a_table_detached_and_attached_again_keeps_a_peers_edit_of_another_field(tmp_path):
    """b detaches its file, its application edits qty, a's edits t, and b attaches the same
    file again: the row's op replaced only the versions it had shown that still survived, so
    a's t, which had replaced one of them, lost to b's old value everywhere."""
    sites, dbs = _merge_row_at_three_sites(tmp_path)
    sp(sites["b"], "detach", dbs["b"])
    app(dbs["b"], ["UPDATE items SET qty = 5 WHERE id = 'k1'"])
    app(dbs["a"], ["UPDATE items SET t = 'm' WHERE id = 'k1'"])
    exchange(tmp_path, sites)
    sp(sites["b"], "attach", dbs["b"], "--table", "items")
    exchange(tmp_path, sites, rounds=3)
    _both_edits_everywhere(sites, dbs)


def test_a_column_added_by_the_release_while_detached_is_no_change_of_the_rows(tmp_path):
    """Under 'merge': b detaches; a's release adds column more and sets it in k1; b's own
    release adds the same column and leaves the rows alone; b attaches again.  Each row of
    b's then held more at its default, unlike its digest when it was left, and became b's op
    setting more to NULL, which overrode a's edit at every site."""
    sites, dbs = _merge_row_at_three_sites(tmp_path)
    sp(sites["b"], "detach", dbs["b"])
    app(dbs["a"], ["ALTER TABLE items ADD COLUMN more INTEGER",
                   "UPDATE items SET more = 1 WHERE id = 'k1'"])
    exchange(tmp_path, sites)
    app(dbs["b"], ["ALTER TABLE items ADD COLUMN more INTEGER"])
    sp(sites["b"], "attach", dbs["b"], "--table", "items")
    exchange(tmp_path, sites, rounds=3)
    for n in sites:
        assert table(dbs[n], "items") == [("k1", "text", 1, "integer", "n", "text",
                                           1, "integer")], n
        assert run("conflicts", site=sites[n], json_mode=True).json["conflicts"] == [], n


def test_a_table_renamed_away_and_back_keeps_a_peers_edit_of_another_field(tmp_path):
    """Under 'merge': b's application renames its table away, edits qty, and renames it back,
    while a's edits t of the same row.  The op capture made for b's edit when the table came
    back replaced only the versions the row showed that had arrived, not the one beneath the
    peer's waiting edit: a's t lost to b's old value at every site (the conflict listed under
    the wrong field)."""
    sites, dbs = _merge_row_at_three_sites(tmp_path)
    app(dbs["b"], ["ALTER TABLE items RENAME TO items_away",
                   "UPDATE items_away SET qty = 5 WHERE id = 'k1'"])
    app(dbs["a"], ["UPDATE items SET t = 'm' WHERE id = 'k1'"])
    for n in sites:         # b's capture reports its table gone; the others go on
        run("capture", site=sites[n])
    exchange(tmp_path, sites)
    app(dbs["b"], ["ALTER TABLE items_away RENAME TO items"])
    exchange(tmp_path, sites, rounds=3)
    _both_edits_everywhere(sites, dbs)


@pytest.mark.parametrize("remade", [False, True])
def test_a_stopped_table_detached_and_attached_again_keeps_the_changes_made_meanwhile(
        tmp_path, remade):
    """b's application drops a column (capture of the table stops), then inserts, updates
    and deletes rows; b detaches the table and attaches it again.  Its rows were taken as
    left as they were: the row inserted meanwhile was deleted from the application's table,
    and the update and the delete never replicated.  Or the application dropped the table and
    made it again (no capture at all): the same, for every row."""
    sites = make_family(tmp_path, ("a", "b"))
    dbs = attached_everywhere(tmp_path, sites, "CREATE TABLE items(id TEXT PRIMARY KEY NOT "
                              "NULL, qty INTEGER, bin TEXT)",
                              ["INSERT INTO items VALUES ('k1', 1, 'A'), ('k2', 2, 'B')"],
                              "items")
    if remade:
        app(dbs["b"], ["DROP TABLE items",
                       "CREATE TABLE items(id TEXT PRIMARY KEY NOT NULL, qty INTEGER)",
                       "INSERT INTO items VALUES ('k1', 11), ('b2', 22)"])
    else:
        app(dbs["b"], ["ALTER TABLE items DROP COLUMN bin",
                       "INSERT INTO items VALUES ('b2', 22)",
                       "UPDATE items SET qty = 11 WHERE id = 'k1'",
                       "DELETE FROM items WHERE id = 'k2'"])
        r = run("capture", site=sites["b"])
        assert r.code == 1 and "stopped" in r.err, r
    sp(sites["b"], "detach", dbs["b"], "--table", "items")
    sp(sites["b"], "attach", dbs["b"], "--table", "items")
    assert table(dbs["b"], "items") == [("b2", "text", 22, "integer"),
                                        ("k1", "text", 11, "integer")]
    held = {r["key"]: r["value"] for r in
            run("--json", "ls", "items", site=sites["b"]).json["records"]}
    assert held["b2"] == {"id": "b2", "qty": 22}
    if not remade:      # made again, k1 is the application's op beside a's: a conflict
        assert held == {"b2": {"id": "b2", "qty": 22}, "k1": {"id": "k1", "qty": 11}}
    sp(sites["b"], "fsck")


def test_an_edit_after_a_table_is_made_again_is_not_lost_to_a_waiting_record(tmp_path):
    """a's application rebuilds its table without a column (SQLite's make-copy-drop-rename),
    which drops the capture triggers with it, then edits a row; b edits the same row.  b's
    record waits at a (the table is stopped), and a's refresh passed the keys with waiting
    records over: b's value was written over a's edit, with no conflict, at every site."""
    sites = make_family(tmp_path, ("a", "b"))
    dbs = attached_everywhere(tmp_path, sites, "CREATE TABLE items(id TEXT PRIMARY KEY NOT "
                              "NULL, qty INTEGER, bin TEXT)",
                              ["INSERT INTO items VALUES ('k1', 1, 'A'), ('k2', 2, 'B')"],
                              "items")
    app(dbs["a"], ["CREATE TABLE items_new(id TEXT PRIMARY KEY NOT NULL, qty INTEGER)",
                   "INSERT INTO items_new SELECT id, qty FROM items", "DROP TABLE items",
                   "ALTER TABLE items_new RENAME TO items",
                   "UPDATE items SET qty = 5 WHERE id = 'k1'"])
    app(dbs["b"], ["UPDATE items SET qty = 7 WHERE id = 'k1'",
                   "UPDATE items SET qty = 8 WHERE id = 'k2'"])
    out = tmp_path / "b-to-a"
    sp(sites["b"], "export", "--to", "a", "--out", out, "--create-out")
    run("import", out, site=sites["a"])
    sp(sites["a"], "attach", dbs["a"], "--refresh", "--table", "items")
    [c] = run("--json", "conflicts", "items", site=sites["a"]).json["conflicts"]
    assert c["key"] == "k1"
    assert sorted(v["value"]["qty"] for v in c["versions"]) == [5, 7]
    # k2, which a's application left alone, takes b's edit
    assert table(dbs["a"], "items") == [("k1", "text", c["visible"]["qty"], "integer"),
                                        ("k2", "text", 8, "integer")]
    sp(sites["a"], "fsck")


def test_a_column_added_while_detached_travels_with_the_next_attach(tmp_path):
    """b's application adds a column while b's table is detached, then b attaches it again.
    The attach published the table's definition without a schema op for the column, so the
    peers never added it, and every later row of b's (its edits of the old columns too)
    waited at the peers for good.  It is now published as an ADD COLUMN made while attached
    is, and a column the peers could not add is refused, nothing changed."""
    sites = make_family(tmp_path, ("a", "b", "c"))
    dbs = attached_everywhere(tmp_path, sites, SCHEMA[0],
                              ["INSERT INTO items(id, qty) VALUES ('k1', 1), ('k2', 2)"],
                              "items")
    sp(sites["b"], "detach", dbs["b"])
    app(dbs["b"], ["ALTER TABLE items ADD COLUMN z INTEGER DEFAULT 0"])
    sp(sites["b"], "attach", dbs["b"], "--table", "items")
    app(dbs["b"], ["UPDATE items SET qty = 11 WHERE id = 'k1'"],
        ["UPDATE items SET qty = 22, z = 5 WHERE id = 'k2'"])
    exchange(tmp_path, sites, rounds=3)
    converged(sites, dbs, tables=("items",))
    assert [(r[0], r[2], r[6]) for r in table(dbs["c"], "items")] == [
        ("k1", 11, 0), ("k2", 22, 5)]
    assert run("conflicts", site=sites["a"], json_mode=True).json["conflicts"] == []
    # a column ALTER TABLE ADD COLUMN could not add at the peers: refused, nothing changed
    sp(sites["c"], "detach", dbs["c"])
    app(dbs["c"], ["CREATE TABLE items2 AS SELECT * FROM items", "DROP TABLE items",
                   "CREATE TABLE items(id TEXT PRIMARY KEY, qty INTEGER, t TEXT, "
                   "z INTEGER DEFAULT 0, u TEXT NOT NULL)",
                   "INSERT INTO items(id, qty, t, z, u) SELECT id, qty, t, z, 'x' FROM items2",
                   "DROP TABLE items2"])
    before = run("--json", "attached", site=sites["c"]).json
    r = run("attach", dbs["c"], "--table", "items", site=sites["c"])
    assert r.code == 1 and "the peers cannot add: u" in r.err, r
    assert run("--json", "attached", site=sites["c"]).json == before


@pytest.mark.parametrize("edit_before_refresh", [False, True])
def test_under_merge_a_site_that_dropped_a_column_leaves_its_value_alone_where_it_is_kept(
        tmp_path, edit_before_refresh):
    """A column drop rolled out site by site: a drops 'note' and refreshes; b, still on the
    old release, sets the note of a row; a, later, sets its qty.  a's row has no note, so a's
    capture counted the note as removed, and b's note was erased at b (no conflict listed),
    though a never changed it.  A column the family dropped is no field a site without it
    writes: its value in the record a's change is based on is kept."""
    sites = make_family(tmp_path, ("a", "b"))
    sp(sites["a"], "collection", "create", "items", "--policy", "merge")
    exchange(tmp_path, sites, rounds=1)
    dbs = attached_everywhere(tmp_path, sites, "CREATE TABLE items(id TEXT PRIMARY KEY NOT "
                              "NULL, qty INTEGER, note TEXT)",
                              ["INSERT INTO items VALUES ('k', 1, 'n1')"], "items", rounds=1)
    app(dbs["a"], ["ALTER TABLE items DROP COLUMN note"])
    if edit_before_refresh:     # taken by the refresh's comparison of the whole table
        assert sp(sites["a"], "capture", ok=False).code == 1
        app(dbs["a"], ["UPDATE items SET qty = 2 WHERE id = 'k'"])
    else:
        sp(sites["a"], "attach", dbs["a"], "--refresh", "--table", "items")
    app(dbs["b"], ["UPDATE items SET note = 'important' WHERE id = 'k'"])
    exchange(tmp_path, sites)
    if edit_before_refresh:
        sp(sites["a"], "attach", dbs["a"], "--refresh", "--table", "items")
    else:
        app(dbs["a"], ["UPDATE items SET qty = 2 WHERE id = 'k'"])
    exchange(tmp_path, sites)
    assert table(dbs["a"], "items") == [("k", "text", 2, "integer")]
    assert table(dbs["b"], "items") == [("k", "text", 2, "integer", "important", "text")]
    for n in sites:
        assert run("--json", "conflicts", site=sites[n]).json["conflicts"] == []
        sp(sites[n], "fsck")


def test_under_merge_a_dropped_columns_value_is_kept_when_two_peers_edited_the_row(tmp_path):
    """As above, with two peers on the old release editing the row meanwhile (one its note,
    one its bin), both unseen at a when its refresh takes a's edit: both replaced the same
    record, which was then counted twice, and a's edit counted the note as removed (the
    note lost everywhere, a conflict listed)."""
    sites = make_family(tmp_path, ("a", "b", "c"))
    sp(sites["a"], "collection", "create", "items", "--policy", "merge")
    exchange(tmp_path, sites, rounds=1)
    dbs = attached_everywhere(tmp_path, sites, "CREATE TABLE items(id TEXT PRIMARY KEY NOT "
                              "NULL, qty INTEGER, bin TEXT, note TEXT)",
                              ["INSERT INTO items VALUES ('k', 1, 'A', 'n1')"], "items",
                              rounds=1)
    app(dbs["a"], ["ALTER TABLE items DROP COLUMN note"])
    assert sp(sites["a"], "capture", ok=False).code == 1
    app(dbs["a"], ["UPDATE items SET qty = 2 WHERE id = 'k'"])
    app(dbs["b"], ["UPDATE items SET note = 'important' WHERE id = 'k'"])
    app(dbs["c"], ["UPDATE items SET bin = 'C' WHERE id = 'k'"])
    exchange(tmp_path, sites)
    sp(sites["a"], "attach", dbs["a"], "--refresh", "--table", "items")
    exchange(tmp_path, sites)
    assert table(dbs["a"], "items") == [("k", "text", 2, "integer", "C", "text")]
    for n in "bc":
        assert table(dbs[n], "items") == [("k", "text", 2, "integer", "C", "text",
                                            "important", "text")], n
    for n in sites:
        assert run("--json", "conflicts", site=sites[n]).json["conflicts"] == []
        sp(sites[n], "fsck")


_names = st.sampled_from(["id", "qty", "note", "bin", "loc"])
_vals = st.one_of(st.none(), st.integers(-2**63, 2**63 - 1), st.text(max_size=5), st.binary(max_size=5))


@given(st.dictionaries(_names, _vals), st.dictionaries(_names, _vals),
       st.frozensets(_names))
def test_a_row_keeps_the_dropped_columns_its_base_record_held(base, new, dropped):
    from syncpack.attach import rows
    new = {c: v for c, v in new.items() if c not in dropped}     # the table lacks them
    out = codec.decode_value(rows.with_dropped_kept(codec.encode_value(new),
                                                    codec.encode_value(base), dropped))
    assert out == {**new, **{c: base[c] for c in dropped if c in base}}
    # a row written back as its record was is the record's very bytes
    same = {c: v for c, v in base.items() if c not in dropped}
    assert rows.with_dropped_kept(codec.encode_value(same), codec.encode_value(base),
                                  dropped) == codec.encode_value(base)


def test_a_column_spelt_in_another_case_than_the_familys_is_refused_at_attach(tmp_path):
    """SQLite takes 'Note' and 'note' for one column; records name it exactly.  b's own
    table spelt the family's column 'note': attached, it was published as a new column that
    no site could add ('duplicate column name'), and each site's rows waited at the other
    for good, said to wait for a column 'added at a peer, not yet here'."""
    sites = make_family(tmp_path, ("a", "b"))
    app(tmp_path / "a.db", ["CREATE TABLE items(id TEXT PRIMARY KEY NOT NULL, Note TEXT)",
                            "INSERT INTO items VALUES ('k1', 'A')"])
    sp(sites["a"], "attach", tmp_path / "a.db", "--table", "items")
    exchange(tmp_path, sites, rounds=1)
    db = tmp_path / "b.db"
    app(db, ["CREATE TABLE items(id TEXT PRIMARY KEY NOT NULL, note TEXT)",
             "INSERT INTO items VALUES ('k2', 'B')"])
    before = schema_text(db)
    r = sp(sites["b"], "attach", db, "--table", "items", ok=False)
    assert r.code == 1 and "Note" in r.err and 'RENAME COLUMN "note" TO "Note"' in r.err, r
    assert "Traceback" not in r.err
    assert schema_text(db) == before
    assert attached_doc(sites["b"])["tables"] == []
    app(db, ["ALTER TABLE items RENAME COLUMN note TO Note"])
    sp(sites["b"], "attach", db, "--table", "items")
    exchange(tmp_path, sites)
    for n in sites:
        assert table(tmp_path / f"{n}.db", "items") == [("k1", "text", "A", "text"),
                                                        ("k2", "text", "B", "text")]
        sp(sites[n], "fsck")


@pytest.mark.parametrize("change", ["added", "dropped"])
def test_under_merge_a_merged_row_keeps_a_peers_edit_of_an_added_or_dropped_column(
        tmp_path, change):
    """The rules that keep a peer's edit of an added column (a row still at its default) and
    of a dropped one (a site without it says nothing of it) looked at a key's one surviving
    version: a row whose record merged two concurrent edits has two, and its next edit of
    another field overrode the peer's edit (added: a conflict the peer lost; dropped: the
    value erased, silently)."""
    sites = make_family(tmp_path, ("a", "b", "c"))
    sp(sites["a"], "collection", "create", "t", "--policy", "merge")
    exchange(tmp_path, sites, rounds=1)
    cols = "id TEXT PRIMARY KEY NOT NULL, w TEXT, x TEXT" + (", note TEXT" if change == "dropped"
                                                             else "")
    row = "('r1', 'w0', 'x0'" + (", 'B')" if change == "dropped" else ")")
    dbs = attached_everywhere(tmp_path, sites, f"CREATE TABLE t({cols})",
                              [f"INSERT INTO t VALUES {row}"], "t", rounds=1)
    app(dbs["a"], ["UPDATE t SET w = 'wa'"])
    app(dbs["c"], ["UPDATE t SET x = 'xc'"])
    exchange(tmp_path, sites)           # r1 now merges two versions, without a conflict
    if change == "added":
        app(dbs["a"], ["ALTER TABLE t ADD COLUMN note TEXT DEFAULT 'none'"])
        exchange(tmp_path, sites, rounds=1)
        app(dbs["b"], ["UPDATE t SET note = 'B'"])
        app(dbs["c"], ["UPDATE t SET w = 'C'"])
        exchange(tmp_path, sites)
        for n in sites:
            assert [r[::2] for r in table(dbs[n], "t")] == [("r1", "C", "xc", "B")], n
    else:
        app(dbs["a"], ["ALTER TABLE t DROP COLUMN note"])
        sp(sites["a"], "attach", dbs["a"], "--refresh", "--table", "t")
        exchange(tmp_path, sites, rounds=1)
        app(dbs["a"], ["UPDATE t SET w = 'wa2'"])
        exchange(tmp_path, sites)
        assert [r[::2] for r in table(dbs["a"], "t")] == [("r1", "wa2", "xc")]
        for n in ("b", "c"):
            assert [r[::2] for r in table(dbs[n], "t")] == [("r1", "wa2", "xc", "B")], n
    for n in sites:
        assert run("--json", "conflicts", site=sites[n]).json["conflicts"] == []
        sp(sites[n], "fsck")


def test_names_are_one_as_sqlite_folds_them_ascii_letters_only(tmp_path):
    """'--all-tables' left out every table whose name began with 'sqlite' (a LIKE whose '_'
    matched any character), and a peer's table 'straße' was taken for this application's
    'STRASSE' (Python's casefold; SQLite keeps both), so it was never created here."""
    sites = make_family(tmp_path, ("a", "b"))
    dba, dbb = tmp_path / "a.db", tmp_path / "b.db"
    app(dba, ['CREATE TABLE "SQLiteStats"(id TEXT PRIMARY KEY NOT NULL, v INTEGER)',
              "CREATE TABLE sqlitex(id TEXT PRIMARY KEY NOT NULL, v INTEGER)",
              'CREATE TABLE "straße"(id TEXT PRIMARY KEY NOT NULL, v INTEGER)',
              "INSERT INTO \"straße\" VALUES ('k', 1)"])
    r = sp(sites["a"], "attach", dba, "--all-tables", "--json")
    assert {t["table"] for t in json.loads(r.out)["tables"]} == {"SQLiteStats", "sqlitex",
                                                                  "straße"}
    app(dbb, ["CREATE TABLE STRASSE(id TEXT PRIMARY KEY NOT NULL, note TEXT)",
              "CREATE TABLE sqlitex(id TEXT PRIMARY KEY NOT NULL, v INTEGER)"])
    sp(sites["b"], "attach", dbb, "--table", "sqlitex")
    exchange(tmp_path, sites)
    assert table(dbb, '"straße"') == [("k", "text", 1, "integer")]
    assert table(dbb, "STRASSE") == []
    for n in sites:
        sp(sites[n], "fsck")


def test_a_site_on_the_old_release_attaching_again_does_not_bring_back_a_dropped_column(
        tmp_path):
    """c's release dropped column y (and c refreshed); b, still on the old release, detached
    and attached its table again.  b's attach published y as a column the family lacked,
    every site added it back (c's application had dropped it: its rows then held NULL, fsck
    failed, and its hint, a refresh, published the NULLs over b's and a's values)."""
    sites = make_family(tmp_path, ("a", "b", "c"))
    sp(sites["a"], "collection", "create", "t", "--policy", "merge")
    exchange(tmp_path, sites, rounds=1)
    dbs = attached_everywhere(tmp_path, sites, "CREATE TABLE t(id TEXT PRIMARY KEY NOT NULL, "
                              "w TEXT, y TEXT)", ["INSERT INTO t VALUES ('r1', 'w0', 'y0')"],
                              "t", rounds=1)
    app(dbs["c"], ["ALTER TABLE t DROP COLUMN y"])
    sp(sites["c"], "attach", dbs["c"], "--refresh", "--table", "t")
    exchange(tmp_path, sites)
    sp(sites["b"], "detach", dbs["b"], "--table", "t")
    sp(sites["b"], "attach", dbs["b"], "--table", "t")
    exchange(tmp_path, sites)
    assert [c[0] for c in columns(dbs["c"], "t")] == ["id", "w"]
    for n in ("a", "b"):
        assert [r[::2] for r in table(dbs[n], "t")] == [("r1", "w0", "y0")], n
    for n in sites:
        sp(sites[n], "fsck")


def test_under_merge_columns_a_record_leaves_out_are_no_change_of_a_later_edit(tmp_path):
    """A record that leaves out columns (a put or a resolve of part of a row) stands for a
    row holding their defaults.  The next edit of another column carried those defaults as
    changes, and beat a peer's concurrent edit of them (listed as conflicts it lost)."""
    sites = make_family(tmp_path, ("a", "b", "c"))
    sp(sites["a"], "collection", "create", "t", "--policy", "merge")
    exchange(tmp_path, sites, rounds=1)
    dbs = attached_everywhere(tmp_path, sites, "CREATE TABLE t(id TEXT PRIMARY KEY NOT NULL, "
                              "p TEXT, q INTEGER, r TEXT DEFAULT 'rd')",
                              ["INSERT INTO t VALUES ('k1', 'p0', 0, 'r0')"], "t", rounds=1)
    sp(sites["c"], "put", "t", "k1", '{"id": "k1", "q": 3}')
    exchange(tmp_path, sites)
    for n in sites:
        assert [r[::2] for r in table(dbs[n], "t")] == [("k1", None, 3, "rd")], n
    app(dbs["c"], ["UPDATE t SET p = 'pc', r = 'rc'"])
    app(dbs["b"], ["UPDATE t SET q = 20"])
    exchange(tmp_path, sites)
    for n in sites:
        assert [r[::2] for r in table(dbs[n], "t")] == [("k1", "pc", 20, "rc")], n
        assert run("--json", "conflicts", site=sites[n]).json["conflicts"] == []
        sp(sites[n], "fsck")


def _rebuilt(create: str, *more: str) -> list:
    """The application's release rebuilding items as SQLite's documentation says (create the
    new table, copy, drop, rename), in one transaction."""
    return ["PRAGMA foreign_keys=OFF", create.replace("items(", "items_new(", 1),
            "INSERT INTO items_new SELECT * FROM items", "DROP TABLE items",
            "ALTER TABLE items_new RENAME TO items", *more]


def _a_row_each_refused_in_items_at_b(root, sites, dbs, key: str) -> None:
    """a writes ``key`` into items and its lower case into other, exports once, b imports:
    the import succeeds, blames nothing on the store, other gets its row, items does not."""
    app(dbs["a"], [f"INSERT INTO items VALUES ('{key}', {key[1]}, 'from a')",
                   f"INSERT INTO other VALUES ('{key.lower()}', 'from a')"])
    out = root / "drop" / "a-once"
    out.mkdir(parents=True)
    sp(sites["a"], "export", "--all", "--out", out)
    r = run("import", out, site=sites["b"])
    assert r.code == 0 and "site store" not in r.out + r.err, r
    assert (key.lower(), "text", "from a", "text") in table(dbs["b"], "other")
    assert key not in [row[0] for row in table(dbs["b"], "items")]


@pytest.mark.parametrize("create", [
    "CREATE TABLE items(id TEXT PRIMARY KEY COLLATE NOCASE, qty INTEGER, t TEXT)",
    "CREATE TABLE items(id TEXT, qty INTEGER, t TEXT, PRIMARY KEY(id COLLATE RTRIM))",
])
def test_a_key_rebuilt_under_a_collation_stops_that_table_alone(three, create):
    """attach refuses a key that compares by a collation; a release that rebuilt an attached
    table so was not noticed: capture said nothing, and every later import at that site
    failed whole ('ON CONFLICT clause does not match', blamed on the site store), the
    untouched tables' rows with it.  The change stops that table alone, with the reason."""
    root, sites, dbs = three
    coll = "NOCASE" if "NOCASE" in create else "RTRIM"
    app(dbs["b"], _rebuilt(create), ["INSERT INTO items VALUES ('b7', 7, 'while stopped')"])
    _a_row_each_refused_in_items_at_b(root, sites, dbs, "A9")
    said = f"key column id now compares with COLLATE {coll}"
    r = run("capture", site=sites["b"])
    assert r.code == 1 and said in r.err and "site store" not in r.err, r
    assert said in entry(sites["b"], "items")["stopped"]
    status = json.loads(run("status", site=sites["b"], json_mode=True).out)
    assert [said in (t["stopped"] or "") for t in status["attached"]["tables"]] == [True, False]
    # the other tables keep replicating both ways
    app(dbs["b"], ["INSERT INTO other VALUES ('b9', 'from b')"])
    exchange(root, sites)
    for n in sites:
        assert {"a9", "b9"} <= {row[0] for row in table(dbs[n], "other")}, n
    assert "b7" not in [row[0] for row in table(dbs["a"], "items")]
    # a refresh cannot take such a key, as attach cannot
    r = run("attach", dbs["b"], "--refresh", "--table", "items", site=sites["b"])
    assert r.code == 1 and f"COLLATE {coll}" in r.err and "nothing was refreshed" in r.err, r
    assert said in entry(sites["b"], "items")["stopped"]
    # undone (the rule kept by a UNIQUE index) and refreshed, it carries on, nothing lost
    app(dbs["b"], _rebuilt(SCHEMA[0], "CREATE UNIQUE INDEX items_ci ON items(id COLLATE "
                                      "NOCASE)"))
    sp(sites["b"], "attach", dbs["b"], "--refresh", "--table", "items")
    assert entry(sites["b"], "items")["stopped"] is None
    exchange(root, sites)
    converged(sites, dbs)
    assert {"A9", "b7"} <= {row[0] for row in table(dbs["c"], "items")}


def test_a_trigger_naming_a_dropped_table_makes_its_rows_clashes_not_a_failed_import(three):
    """SQLite lets a table go while a trigger still names it, and the application's own
    INSERTs still work; syncpack's write of a peer's row set it off, and every import at that
    site failed whole, blamed on the site store, the untouched tables' rows with it.  The
    rows it refuses are clashes, as for a function only the application defines."""
    root, sites, dbs = three
    app(dbs["b"], ["CREATE TABLE audit(x)",
                   "CREATE TRIGGER tr AFTER UPDATE ON items BEGIN "
                   "INSERT INTO audit VALUES (NEW.id); END",
                   "DROP TABLE audit"],
        ["INSERT INTO items VALUES ('b5', 5, 'still written by the application')"])
    _a_row_each_refused_in_items_at_b(root, sites, dbs, "a5")
    [conf] = run("--json", "conflicts", site=sites["b"]).json["conflicts"]
    assert (conf["collection"], conf["key"]) == ("items", "a5")
    assert "no such table: main.audit" in conf["constraint"], conf
    # the site's own changes still travel
    exchange(root, sites)
    for n in ("a", "c"):
        assert "b5" in [row[0] for row in table(dbs[n], "items")], n
    # the application's schema corrected, the waiting row goes in
    app(dbs["b"], ["DROP TRIGGER tr"])
    exchange(root, sites)
    converged(sites, dbs)
    assert run("--json", "conflicts", site=sites["b"]).json["conflicts"] == []


def test_a_key_collation_is_part_of_the_shape_and_never_one_peers_follow():
    old = shapes.shape(["id", "v"], {"id": "TEXT"}, ["id"], [])
    # shapes recorded before the collation was looked at still compare equal
    assert shapes.shape(["id", "v"], {"id": "TEXT"}, ["id"], [], []) == old
    new = shapes.shape(["id", "v"], {"id": "TEXT"}, ["id"], [], [("id", "NOCASE")])
    for before in (old, new):
        adds, problems = shapes.compare(before, new)
        assert adds == [] and len(problems) == 1
        assert problems[0].startswith("key column id now compares with COLLATE NOCASE")
    assert shapes.compare(new, old) == ([], [])
