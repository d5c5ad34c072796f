"""The Spark engine gives the local engine's packets byte for byte (docs/design.md §9).

Every test here is marked ``spark`` (deselect with ``-m "not spark"``).  One local Spark session
serves the whole module; each test works on copies of one family built once, because an export
records what it sent.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import time
from pathlib import Path

import pyarrow as pa
import pytest

from conftest import Family, run

from syncpack.admin import inspection, recovery
from syncpack.engine import parquet_log
from syncpack.exchange import sync
from syncpack.store import chain
from syncpack.errors import ExportError, ScrubbedError, SparkUnavailableError, UsageError
from syncpack.site import Site

pytestmark = pytest.mark.spark
pytest.importorskip("pyspark")

from syncpack.engine import spark_job  # noqa: E402

SEED = b"engine comparison"
# One fixed creation time for both engines (same bytes), close to now: importers refuse
# packets made further in the future than the clock-skew limit.
NOW = int(time.time() * 1000)
PEERS = ["p1", "p2", "p3", "p4"]


@pytest.fixture(scope="module")
def spark():
    handle = spark_job.start_session("local[2]")
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """hub + four peers; ops from several origins, deletes, overwrites, one transaction sealed
    at commit; peers at different points (p1 synced once, p4 created late)."""
    root = tmp_path_factory.mktemp("family")
    f = Family(root / "sites")
    (root / "sites").mkdir()
    f.init("hub")
    for p in PEERS[:3]:
        f.add(p, "hub")
    with f.open("hub") as s:
        for i in range(400):
            with s.transaction() as tx:
                for j in range(i % 4 + 1):
                    k = f"k{(i * 7 + j) % 250}"
                    if (i + j) % 11 == 0:
                        tx.delete("parts", k)
                    else:
                        tx.put("parts", k, {"i": i, "j": j, "pad": "x" * (i % 60)})
        with s.transaction() as tx:        # large enough to be sealed as a block at commit
            for j in range(chain.SEAL_AT_COMMIT):
                tx.put("bulk", f"b{j}", "y" * 100 + str(j))
    f.put("p2", "parts", "from-p2", [1, 2])
    f.put("p3", "other", "from-p3", {"x": None})
    f.sync("p2", "hub")
    f.sync("p3", "hub")
    f.sync("hub", "p1")
    f.add("p4", "hub")
    with f.open("hub") as s, s.transaction() as tx:
        for j in range(50):
            tx.put("parts", f"late{j}", j)
    return root / "sites"


def _copy(base: Path, dest: Path) -> Family:
    shutil.copytree(base, dest)
    f = Family(dest)
    for p in sorted(dest.iterdir()):
        if (p / "syncpack.db").exists():
            f.sites[p.name] = p
    return f


def _both(tmp_path: Path, base: Path, **kw):
    """Export with the local engine from one copy and the Spark engine from another."""
    fl, fs = _copy(base, tmp_path / "L"), _copy(base, tmp_path / "S")
    strategy = kw.pop("strategy", "merge")
    with fl.open("hub") as s:
        local = sync.export(s, tmp_path / "out_local", seed=SEED, now_ms=NOW, **kw)
    with fs.open("hub") as s:
        sparked = spark_job.export_spark(s, tmp_path / "out_spark", seed=SEED, now_ms=NOW,
                                            strategy=strategy, **kw)
    return fl, fs, local, sparked


def _import_at_now(f: Family, name: str, paths) -> sync.ImportResult:
    """Import packets made at the fixed clock NOW (years ahead of the wall clock, which the
    verifier's clock-skew check would refuse) as if it were NOW at the receiver too."""
    with f.open(name) as s:
        return sync.import_packets(s, paths, now_ms=NOW)


def _assert_same_packets(local, sparked, tmp_path: Path) -> None:
    assert len(local) == len(sparked) > 0
    for a, b in zip(local, sparked):
        assert (a.to, a.ops, a.bytes, a.ranges, a.seq, a.part) == \
               (b.to, b.ops, b.bytes, b.ranges, b.seq, b.part)
        assert a.path.relative_to(tmp_path / "out_local") == \
               b.path.relative_to(tmp_path / "out_spark")
        assert a.path.read_bytes() == b.path.read_bytes(), a.path
    files = lambda d: sorted(str(p.relative_to(d)) for p in d.rglob("*") if p.is_file())
    assert files(tmp_path / "out_local") == files(tmp_path / "out_spark")


def _under(path: str, out: Path) -> str:
    p = Path(path)
    return str(p.relative_to(out)) if p.is_relative_to(out) else "elsewhere"


def _store_records(site_dir: Path, out: Path) -> list:
    c = sqlite3.connect(site_dir / "syncpack.db")
    try:
        rows = [("out",) + r[:8] + (_under(r[8], out),) for r in c.execute(
            "SELECT packet_id, recipient, seq, part, kind, ranges, ops, bytes, path, at_ms "
            "FROM packets_out ORDER BY recipient, seq, part")]
        rows += [("matrix",) + r for r in c.execute("SELECT * FROM matrix ORDER BY peer, origin")]
        rows += [("links",) + r for r in c.execute("SELECT * FROM links ORDER BY peer")]
        return rows
    finally:
        c.close()


# --- the log ----------------------------------------------------------------------------------

def test_log_export_holds_the_changelog_and_appends_incrementally(tmp_path, base):
    f = _copy(base, tmp_path / "f")
    with f.open("hub") as s:
        first = parquet_log.log_export(s)
        changelog = sorted(map(tuple, chain.iter_all(s.conn)))
        vec = {s.name_of(o): e for o, e in s.vector().items() if e}
    assert first["ops_written"] == len(changelog)
    assert {o: hi for o, (lo, hi) in first["origins"].items()} == vec
    assert sorted(tuple(op) for op in parquet_log.iter_log(f.path("hub") / "log")) == changelog

    with f.open("hub") as s:
        assert parquet_log.log_export(s)["ops_written"] == 0          # nothing new
        with s.transaction() as tx:
            tx.put("parts", "new", 1)
            tx.delete("parts", "k1")
        again = parquet_log.log_export(s)
        top = s.vector()[s.site_id]
    assert again["ops_written"] == 2
    assert again["origins"] == {"hub": [top - 2, top]}
    man = parquet_log.load_manifest(parquet_log.LogLocation(f.path("hub") / "log"))
    segs = man.origins[bytes.fromhex(_hex(f, "hub"))].segments
    assert segs[-1].first == top - 1 and segs[-1].last == top
    assert (f.path("hub") / "log" / segs[-1].path).is_file()


def _hex(f: Family, name: str) -> str:
    with f.open(name) as s:
        return s.site_id.hex()


def test_log_of_a_restored_site_is_rebuilt(tmp_path, base):
    f = _copy(base, tmp_path / "f")
    backup = tmp_path / "backup"
    shutil.copytree(f.path("hub"), backup)
    with f.open("hub") as s:
        with s.transaction() as tx:
            tx.put("parts", "after-backup", 1)
        parquet_log.log_export(s, tmp_path / "log")
    shutil.rmtree(f.path("hub"))
    shutil.copytree(backup, f.path("hub"))       # the site goes back in time
    with f.open("hub") as s:
        res = parquet_log.log_export(s, tmp_path / "log")
        changelog = sorted(map(tuple, chain.iter_all(s.conn)))
    assert res["rebuilt"] == ["hub"]
    assert sorted(tuple(op) for op in parquet_log.iter_log(tmp_path / "log")) == changelog


def test_log_refuses_another_sites_appends(tmp_path, base):
    f = _copy(base, tmp_path / "f")
    with f.open("hub") as s:
        parquet_log.log_export(s, tmp_path / "log")
    with f.open("p1") as s, pytest.raises(ExportError, match="kept by site hub"):
        parquet_log.log_export(s, tmp_path / "log")


def test_the_log_gives_every_plans_blocks_across_segments_and_row_groups(tmp_path, base,
                                                                          monkeypatch):
    """What the executors read (without Spark): each peer's planned blocks, in the plan's
    order, byte for byte the store's, from a log cut into many segments and row groups."""
    monkeypatch.setattr(parquet_log, "ROW_GROUP_BYTES", 1)      # a row group per block
    monkeypatch.setattr(parquet_log, "SEGMENT_BYTES", 1000)     # a few blocks per segment
    f = _copy(base, tmp_path / "f")
    with f.open("hub") as s:
        res = parquet_log.log_export(s)
        loc = parquet_log.LogLocation(f.path("hub") / "log")
        man = parquet_log.load_manifest(loc)
        hub_id = s.site_id
        hub = man.origins[hub_id]
        assert res["segments_written"] >= 3 and len(hub.segments) >= 3
        assert sorted(tuple(op) for op in parquet_log.iter_log(loc.root)) == \
            sorted(map(tuple, chain.iter_all(s.conn)))
        s.conn.execute("BEGIN")
        try:
            plans = sync.plan_exports(s, sync.select_peers(s, None, True), NOW)
            assert sum(len(p.blocks) for p in plans) >= 5
            for p in plans:
                got = list(parquet_log.planned_blocks(loc, man, p.blocks, s.family_id))
                assert [(r.origin, r.lo, r.hi, r.hlc_first, r.hlc_last, r.last_seq, r.data)
                        for r in got] == \
                    [(b.origin, b.lo, b.hi, b.hlc_first, b.hlc_last, b.last_seq,
                      chain.block_bytes(s.conn, b)) for b in p.blocks]
        finally:
            s.conn.execute("ROLLBACK")
    # The log's own cover of a range that starts and ends inside blocks.
    lo, hi = hub.floor + 2, hub.top - 1
    refs = list(parquet_log.iter_origin_blocks(loc, hub_id, hub, lo, hi))
    assert refs[0].lo <= lo < refs[0].hi and refs[-1].hi >= hi
    assert all(a.hi == b.lo for a, b in zip(refs, refs[1:]))
    assert {r.origin for r in refs} == {hub_id}
    with pytest.raises(ExportError, match="holds epochs"):
        list(parquet_log.iter_origin_blocks(loc, hub_id, hub, lo, hub.top + 1))


def test_an_old_version_log_is_refused_and_log_export_rewrites_it(tmp_path, base):
    """A version 1 log (one row per op) cannot give packets: readers refuse it naming the
    command that rewrites it, and that command, at the log's producer, does."""
    f = _copy(base, tmp_path / "f")
    lake = tmp_path / "lake"
    with f.open("hub") as s:
        ohex = s.site_id.hex()
        old_seg = f"origin_hex={ohex}/ep-{1:020d}-{3:020d}.parquet"
        (lake / f"origin_hex={ohex}").mkdir(parents=True)
        (lake / old_seg).write_bytes(b"PAR1 an op segment of version 1")
        (lake / parquet_log.MANIFEST).write_text(json.dumps({
            "format": "syncpack-log", "version": 1, "family_id": s.family_id.hex(),
            "producer": {"site_id": ohex, "site": "hub"}, "updated_ms": 0,
            "origins": {ohex: {"name": "hub", "floor": 0, "top": 3, "top_hlc": 1, "top_seq": 0,
                               "segments": [{"path": old_seg, "first": 1, "last": 3,
                                             "rows": 3, "bytes": 31}]}}}))
        with pytest.raises(ExportError, match="format version 1") as e:
            parquet_log.load_manifest(parquet_log.LogLocation(lake))
        assert "syncpack log export" in e.value.hint and "hub" in e.value.hint
        res = parquet_log.log_export(s, lake)
        held = sorted(map(tuple, chain.iter_all(s.conn)))
    assert res["ops_written"] == len(held) and res["blocks_written"] > 0
    assert not (lake / old_seg).exists()
    assert json.loads((lake / parquet_log.MANIFEST).read_text())["version"] == parquet_log.VERSION
    assert sorted(tuple(op) for op in parquet_log.iter_log(lake)) == held


# --- same packets from both engines ---------------------------------------------------------

@pytest.mark.parametrize("strategy", ["merge", "shuffle"])
def test_engines_write_identical_packets_and_records(tmp_path, base, spark, strategy,
                                                     monkeypatch):
    monkeypatch.setattr(parquet_log, "ROW_GROUP_BYTES", 1)      # the log in many row groups
    monkeypatch.setattr(parquet_log, "SEGMENT_BYTES", 1000)     # and segments
    fl, fs, local, sparked = _both(tmp_path, base, all_peers=True, max_size=12000,
                                   strategy=strategy)
    _assert_same_packets(local, sparked, tmp_path)
    assert {p.to for p in sparked} == set(PEERS)
    assert any(p.part > 0 for p in sparked)           # cut into several packets
    assert _store_records(fl.path("hub"), tmp_path / "out_local") == \
        _store_records(fs.path("hub"), tmp_path / "out_spark")

    # The peers import the Spark packets and converge with the hub, as with local packets.
    for p in PEERS:
        r = _import_at_now(fs, p, [tmp_path / "out_spark" / p])
        assert not r.rejected and not r.parked, r
        r = _import_at_now(fl, p, [tmp_path / "out_local" / p])
        assert not r.rejected and not r.parked, r
        assert fs.digest(p) == fl.digest(p) == fs.digest("hub")


def test_second_export_sends_only_the_new_ops(tmp_path, base, spark):
    fl, fs, local, sparked = _both(tmp_path, base, to=["p2", "p4"], max_size=64 * 1024)
    _assert_same_packets(local, sparked, tmp_path)
    for f in (fl, fs):      # the same new ops at both copies: a fixed clock
        with Site.open(f.path("hub"), clock=lambda: NOW) as s, s.transaction() as tx:
            for j in range(20):
                tx.put("parts", f"second{j}", j)
    shutil.rmtree(tmp_path / "out_local")
    shutil.rmtree(tmp_path / "out_spark")
    with fl.open("hub") as s:
        local = sync.export(s, tmp_path / "out_local", to=["p2", "p4"], seed=SEED, now_ms=NOW)
    st: dict = {}
    with fs.open("hub") as s:
        sparked = spark_job.export_spark(s, tmp_path / "out_spark", to=["p2", "p4"],
                                            seed=SEED, now_ms=NOW, stats=st)
    assert st["log"]["ops_written"] == 20               # the log caught up incrementally
    _assert_same_packets(local, sparked, tmp_path)
    assert [p.ops for p in sparked] == [20, 20]


def test_sealed_packets_are_identical_too(tmp_path, base, spark):
    fl, fs, local, sparked = _both(tmp_path, base, to=["p3"], max_size=12000, encrypt=True)
    _assert_same_packets(local, sparked, tmp_path)
    r = _import_at_now(fs, "p3", [tmp_path / "out_spark"])
    assert not r.rejected and fs.digest("p3") == fs.digest("hub")


def test_a_log_from_elsewhere_gives_the_same_packets(tmp_path, base, spark):
    fl, fs = _copy(base, tmp_path / "L"), _copy(base, tmp_path / "S")
    with fs.open("hub") as s:
        parquet_log.log_export(s, tmp_path / "lake")
    with fl.open("hub") as s:
        local = sync.export(s, tmp_path / "out_local", to=["p1", "p3"], seed=SEED, now_ms=NOW)
    with fs.open("hub") as s:
        sparked = spark_job.export_spark(s, tmp_path / "out_spark", to=["p1", "p3"],
                                            log_dir=tmp_path / "lake", seed=SEED, now_ms=NOW)
    _assert_same_packets(local, sparked, tmp_path)
    assert not (fs.path("hub") / "log").exists()        # the given log was used, read only


def test_a_stale_log_is_refused_and_nothing_is_recorded(tmp_path, base, spark):
    f = _copy(base, tmp_path / "f")
    with f.open("hub") as s:
        parquet_log.log_export(s, tmp_path / "lake")
        with s.transaction() as tx:
            tx.put("parts", "newer", 1)
        before = s.conn.execute("SELECT count(*) FROM packets_out").fetchone()
        with pytest.raises(ExportError, match="but p2 needs up to epoch") as e:
            spark_job.export_spark(s, tmp_path / "out", to=["p2"], log_dir=tmp_path / "lake")
        assert "syncpack log export" in e.value.hint
        assert s.conn.execute("SELECT count(*) FROM packets_out").fetchone() == before
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("strategy", ["merge", "shuffle"])
def test_a_damaged_block_in_the_log_fails_the_export(tmp_path, base, spark, strategy):
    """Every block read from a log is checked against the plan and its own hash: a log from
    elsewhere cannot put other bytes into a packet, and nothing is recorded."""
    import pyarrow.parquet as pq
    f = _copy(base, tmp_path / "f")
    lake = tmp_path / "lake"
    with f.open("hub") as s:
        parquet_log.log_export(s, lake)
        ent = parquet_log.load_manifest(parquet_log.LogLocation(lake)).origins[s.site_id]
        seg = lake / ent.segments[0].path
        t = pq.read_table(seg)
        data = t.column("data").to_pylist()
        data[-1] = data[-1][:-1] + bytes([data[-1][-1] ^ 1])    # one bit of a body
        t = t.set_column(t.schema.get_field_index("data"), "data",
                         pa.array(data, pa.binary()))
        pq.write_table(t, seg)
        before = s.conn.execute("SELECT count(*) FROM packets_out").fetchone()
        with pytest.raises(ExportError, match="body does not match its hash"):
            spark_job.export_spark(s, tmp_path / "out", to=["p2"], log_dir=lake,
                                      strategy=strategy, staging=tmp_path / "staging")
        assert s.conn.execute("SELECT count(*) FROM packets_out").fetchone() == before
    assert not list((tmp_path / "out").rglob("*.spk"))
    assert not list((tmp_path / "staging").iterdir())      # no bodies left behind


def test_a_failure_while_the_driver_writes_leaves_no_packet(tmp_path, base, spark,
                                                            monkeypatch):
    """The driver writes the packets after the job: failing after some peers' packets are on
    the medium, none stays, nothing is recorded, and the staged bodies go."""
    f = _copy(base, tmp_path / "f")
    real = spark_job.finish_planned_packets
    calls = []

    def finish_then_fail(*a, **kw):
        calls.append(1)
        if len(calls) == 2:
            raise ExportError("the medium went away")
        return real(*a, **kw)

    monkeypatch.setattr(spark_job, "finish_planned_packets", finish_then_fail)
    with f.open("hub") as s:
        before = s.conn.execute("SELECT count(*) FROM packets_out").fetchone()
        with pytest.raises(ExportError, match="the medium went away"):
            spark_job.export_spark(s, tmp_path / "out", all_peers=True, max_size=12000,
                                      staging=tmp_path / "staging")
        assert s.conn.execute("SELECT count(*) FROM packets_out").fetchone() == before
    assert len(calls) == 2
    assert not [p for p in (tmp_path / "out").rglob("*") if p.is_file()]
    assert not list((tmp_path / "staging").iterdir())


def test_a_cluster_master_needs_a_staging_location():
    with pytest.raises(UsageError, match="needs --staging on a cluster") as e:
        spark_job._Staging(None, local_master=False)
    assert "docs/cluster.md" in e.value.hint


def test_a_cluster_master_without_staging_is_refused_before_spark_starts(family, tmp_path,
                                                                        monkeypatch):
    """Checked only once the session had started: against a master that did not answer, the
    administrator waited about 80 s for 'Spark did not start' instead."""
    family.init("hub")
    monkeypatch.setattr(spark_job, "_SessionStarter", lambda *a: pytest.fail("started"))
    with family.open("hub") as s, pytest.raises(UsageError, match="needs --staging"):
        spark_job.export_spark(s, tmp_path, all_peers=True, master="spark://nowhere:7077")


@pytest.mark.parametrize("master", ["bogus", "local[x]", "spark://", "localhost:7077"])
def test_a_mistyped_master_is_a_usage_error_before_spark_starts(family, tmp_path, master):
    """'bogus' was taken for a cluster and asked for --staging; 'local[x]' started Spark and
    failed with a Py4J line whose cause was only in Spark's log."""
    family.init("hub")
    family.add("p1", via="hub")
    out = tmp_path / "usb"
    r = run("export", "--all", "--out", out, "--create-out", "--engine", "spark",
            "--spark-master", master, site=family.path("hub"))
    assert r.code == 2 and "is not a Spark master URL" in r.err, r
    assert "hint: local[*], local[N], spark://HOST:PORT" in r.err, r
    assert not out.exists()


# --- below the floor ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def scrubbed(tmp_path_factory) -> Path:
    """hub and two peers, everything acknowledged and scrubbed at hub; then hub is told that
    p2 holds almost nothing of hub's ops.  ``hub-unscrubbed`` is hub just before the scrub."""
    root = tmp_path_factory.mktemp("scrubbed") / "sites"
    root.mkdir()
    f = Family(root)
    f.init("hub")
    f.add("p1", "hub")
    f.add("p2", "hub")
    for i in range(30):
        f.put("hub", "c", f"k{i}", i)
    f.full_exchange()
    shutil.copytree(root / "hub", root / "hub-unscrubbed")
    with f.open("hub") as s:
        recovery.scrub(s)
        assert s.floors()[s.site_id] > 1
        inspection.chepoch(s, "p2", ["hub=1"])
        parquet_log.log_export(s, root / "lake-after-scrub")
    return root


def test_peer_below_the_floor_gets_the_local_engines_error(tmp_path, scrubbed, spark):
    f = _copy(scrubbed, tmp_path / "f")
    with f.open("hub") as s, pytest.raises(ScrubbedError) as local_err:
        sync.export(s, tmp_path / "out_local", to=["p2"])
    with f.open("hub") as s, pytest.raises(ScrubbedError) as spark_err:
        spark_job.export_spark(s, tmp_path / "out_spark", to=["p2"])
    assert str(spark_err.value) == str(local_err.value)
    assert spark_err.value.hint == local_err.value.hint
    assert "of hub, but this site's changelog starts at epoch" in str(spark_err.value)
    assert not (tmp_path / "out_spark").exists()


def test_peer_below_a_given_logs_floor_gets_a_scrubbed_error(tmp_path, scrubbed, spark):
    f = _copy(scrubbed, tmp_path / "f")
    with f.open("hub-unscrubbed") as s:
        # The site itself still holds the ops (it was not scrubbed) but the log does not.
        inspection.chepoch(s, "p2", ["hub=1"])
        with pytest.raises(ScrubbedError, match="of hub, but the log at .* starts at") as e:
            spark_job.export_spark(s, tmp_path / "out", to=["p2"],
                                      log_dir=f.root / "lake-after-scrub")
        assert "resync --to p2" in e.value.hint


# --- the command line, and missing prerequisites ------------------------------------------------

def test_cli_export_with_the_spark_engine(tmp_path, base, spark):
    f = _copy(base, tmp_path / "f")
    r = run("log", "export", site=f.path("hub"), json_mode=True)
    assert r.code == 0, r
    assert r.json["ops_written"] > 0 and "hub" in r.json["origins"]
    r = run("export", "--to", "p2", "--create-out", "--out", tmp_path / "usb", "--engine", "spark",
            "--spark-master", "local[2]", site=f.path("hub"), json_mode=True)
    assert r.code == 0, r
    doc = json.loads(r.out)
    assert [p["to"] for p in doc["packets"]] == ["p2"] and doc["packets"][0]["ops"] > 0
    assert run("import", tmp_path / "usb", site=f.path("p2")).code == 0
    assert f.digest("p2") == f.digest("hub")
    r = run("export", "--to", "p2", "--out", tmp_path / "usb", "--log", tmp_path,
            site=f.path("hub"))
    assert r.code == 2 and "--engine spark" in r.err
    r = run("export", "--to", "p2", "--out", tmp_path / "usb", "--staging", tmp_path,
            site=f.path("hub"))
    assert r.code == 2 and "--engine spark" in r.err


def test_missing_java_or_pyspark_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(SparkUnavailableError, match="needs Java") as e:
        spark_job._check_java()
    assert "--engine local" in e.value.hint
    monkeypatch.setitem(__import__("sys").modules, "pyspark", None)
    with pytest.raises(SparkUnavailableError, match="needs pyspark") as e:
        spark_job._import_pyspark()
    assert "pip install" in e.value.hint


def test_export_all_with_a_bad_roster_entry_writes_the_good_peers(tmp_path, base, spark):
    """As with the local engine: a roster entry that cannot be a directory (an old store) is
    one failed peer; the others get the same packets as the local engine writes, in --out."""
    import os
    from syncpack.format import codec
    from syncpack.site import ROSTER, Member
    for d in ("L", "S"):
        shutil.copytree(base, tmp_path / "base" / d)
    for d in ("L", "S"):
        m = Member("../evil", b"\x01" * 8, b"\x02" * 32, b"\x03" * 32, 0, {}, False)
        with Site.open(tmp_path / "base" / d / "hub") as s:
            s.conn.execute("BEGIN IMMEDIATE")
            s.conn.execute("INSERT INTO versions VALUES (?, ?, ?, ?)",
                           (ROSTER, "../evil", os.urandom(16), codec.encode_value(m.to_value())))
            s.conn.execute("COMMIT")
    fl, fs = _copy(tmp_path / "base" / "L", tmp_path / "L"), \
        _copy(tmp_path / "base" / "S", tmp_path / "S")
    failed_local: list = []
    failed_spark: list = []
    with fl.open("hub") as s:
        local = sync.export(s, tmp_path / "out_local", all_peers=True, seed=SEED, now_ms=NOW,
                            failed=failed_local)
    with fs.open("hub") as s:
        sparked = spark_job.export_spark(s, tmp_path / "out_spark", all_peers=True,
                                            seed=SEED, now_ms=NOW, failed=failed_spark)
    _assert_same_packets(local, sparked, tmp_path)
    assert sorted({p.to for p in sparked}) == PEERS
    assert [str(e) for e in failed_spark] == [str(e) for e in failed_local]
    assert len(failed_spark) == 1 and "invalid site name" in str(failed_spark[0])
    assert not (tmp_path / "evil").exists()
    r = run("export", "--all", "--out", tmp_path / "usb", "--create-out", "--engine", "spark",
            "--spark-master", "local[2]", site=fs.path("hub"), json_mode=True)
    assert r.code == 1 and len(r.json["failed"]) == 1, r


# --- no key material leaves the driver -------------------------------------------------------

@pytest.mark.parametrize("strategy", ["merge", "shuffle"])
def test_no_executor_receives_key_material(tmp_path, base, spark, strategy, monkeypatch):
    """Everything Spark ships to executors (task closures, broadcast values) is pickled here and
    searched for the site's private keys: the signing key and the key that opens sealed packets
    must be absent, by construction, since only the driver builds and signs headers."""
    from cryptography.hazmat.primitives import serialization
    from pyspark import SparkContext, cloudpickle

    from syncpack.format import keys

    f = _copy(base, tmp_path / "f")
    raw = serialization.Encoding.Raw, serialization.PrivateFormat.Raw, \
        serialization.NoEncryption()
    secrets = [keys.load_signing_key(f.path("hub")).private_bytes(*raw),
               keys.load_box_key(f.path("hub")).private_bytes(*raw)]
    shipped: list[bytes] = []
    real_broadcast = SparkContext.broadcast

    def broadcast(self, value):
        shipped.append(cloudpickle.dumps(value))
        return real_broadcast(self, value)

    monkeypatch.setattr(SparkContext, "broadcast", broadcast)
    for name in ("_merge_task", "_arrow_task", "_rows_task"):
        real = getattr(spark_job, name)

        def closure(bc, ctx, acc, real=real):
            fn = real(bc, ctx, acc)
            shipped.append(cloudpickle.dumps(fn))
            return fn

        monkeypatch.setattr(spark_job, name, closure)
    with f.open("hub") as s:
        pk = spark_job.export_spark(s, tmp_path / "out", all_peers=True, max_size=12000,
                                       encrypt=True, strategy=strategy)
    assert pk and len(shipped) >= 2
    for blob in shipped:
        for secret in secrets:
            assert secret not in blob
    for p in ("p1", "p2"):
        with f.open(p) as s:
            sync.import_packets(s, [tmp_path / "out" / p])


def _java_child(pid: int) -> int | None:
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
                cmd = (d / "cmdline").read_bytes()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid and b"java" in cmd:
                return int(d.name)
    return None


def test_spark_killed_during_the_job_is_one_error_with_a_hint_and_leaves_nothing(tmp_path,
                                                                                base):
    """kill -9 of Spark's Java process while the job runs: stopping the dead session failed
    in turn, and its error ('Connection refused', no hint) replaced the job's, and this run's
    staging directory stayed.  Now: the job's error with its hint, no packet, no staging
    left, nothing recorded."""
    import os
    import signal
    import subprocess
    import sys
    for attempt in range(3):
        f = _copy(base, tmp_path / f"f{attempt}")
        stg, usb = tmp_path / f"stg{attempt}", tmp_path / f"usb{attempt}"
        stg.mkdir()
        before = f.digest("hub"), run("status", site=f.path("hub"), json_mode=True).json["peers"]
        p = subprocess.Popen([sys.executable, "-m", "syncpack", "--site", str(f.path("hub")),
                              "export", "--all", "--out", str(usb), "--create-out",
                              "--engine", "spark", "--spark-master", "local[2]",
                              "--staging", str(stg)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 240
        java = None
        while p.poll() is None and time.monotonic() < deadline:
            java = java or _java_child(p.pid)
            if java and any(stg.iterdir()):     # the job's staging directory: tasks start
                os.kill(java, signal.SIGKILL)
                break
            time.sleep(0.02)
        out, err = p.communicate(timeout=240)
        if p.returncode == 0:
            continue            # the job won the race: try again on a fresh copy
        assert p.returncode == 1, (out, err)
        lines = err.strip().splitlines()
        assert len(lines) == 2 and lines[0].startswith("error: the Spark job failed"), err
        assert lines[1].startswith("hint: see ") and "nothing was recorded" in lines[1], err
        assert not any(stg.iterdir()), list(stg.iterdir())
        assert not list(usb.rglob("*.spk")) if usb.exists() else True
        assert (f.digest("hub"),
                run("status", site=f.path("hub"), json_mode=True).json["peers"]) == before
        return
    pytest.skip("the Spark job finished before its Java process could be killed")


def test_one_member_without_a_sealing_key_does_not_stop_a_spark_export(tmp_path, base, spark):
    """As with the local engine: with sealing required, one member's entry without a sealing
    key failed the whole export, so no peer got a packet."""
    from syncpack.format import codec
    from syncpack.site import ROSTER, Member
    f = _copy(base, tmp_path / "f")
    assert run("require-sealing", "on", site=f.path("hub")).code == 0
    with f.open("hub") as s:
        e = Member("e", b"\x00\x11" * 4, b"\x01" * 32, b"", 0, {}, False)
        with s.transaction(_system=True) as tx:
            tx.write_raw(ROSTER, "e", codec.encode_value(e.to_value()))
    r = run("export", "--to", "p2", "--to", "e", "--create-out", "--out", tmp_path / "usb",
            "--engine", "spark", "--spark-master", "local[2]", site=f.path("hub"),
            json_mode=True)
    assert r.code == 1 and "no X25519 key for e" in r.err, r
    assert [p["to"] for p in r.json["packets"]] == ["p2"], r.json
    assert run("import", tmp_path / "usb" / "p2", site=f.path("p2")).code == 0
