"""``syncpack batch``: scheduled rounds through shared media, the batch lock, config errors and
``remove_after_import``.  After the family is created, sites synchronise by batch rounds only."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from syncpack import batch
from syncpack.admin import inspection
from syncpack.exchange import sync, verify
from syncpack.errors import BatchConfigError, BatchLockedError

from conftest import run

SITES = ("boston", "sanfran", "bangalore")


def write_config(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def site_config(family, name: str, media: Path, remove: bool = True, scrub: bool = True) -> Path:
    """A round at NAME: import MEDIA/NAME, export to every peer into MEDIA (absolute paths)."""
    text = (f'site = "{family.path(name)}"\n\n'
            f'[[import]]\npath = "{media / name}"\n'
            f'remove_after_import = {"true" if remove else "false"}\n\n'
            f'[[export]]\nout = "{media}"\nto = "all"\n')
    if scrub:
        text += "\n[scrub]\n"
    return write_config(family.root / "etc" / f"{name}.toml", text)


def three_sites(family) -> None:
    family.init("boston")
    family.add("sanfran", via="boston")
    family.add("bangalore", via="boston")


def packets_under(d: Path) -> list[Path]:
    return sorted(p for p in d.rglob("*.spk"))


def all_files(d: Path) -> list[str]:
    return sorted(str(p.relative_to(d)) for p in d.rglob("*") if p.is_file())


# --- rounds -----------------------------------------------------------------------------------

def test_batch_rounds_converge_three_sites(family):
    three_sites(family)
    for i in range(12):
        family.put("boston", "parts", f"b-{i}", {"qty": i})
    family.put("sanfran", "parts", "s-1", {"qty": 7})
    family.put("sanfran", "parts", "b-3", {"qty": 300})     # concurrent with boston's b-3
    family.put("bangalore", "parts", "g-1", {"qty": 1})
    with family.open("bangalore") as s, s.transaction() as tx:
        tx.delete("parts", "b-5")                          # concurrent with boston's b-5
    media = family.root / "shared_media"
    media.mkdir()
    configs = {n: site_config(family, n, media) for n in SITES}

    summaries = []
    for _round in range(2):
        for n in SITES:
            r = run("--json", "batch", configs[n])
            assert r.code == 0, r
            doc = r.json
            assert doc["outcome"] == "ok" and doc["exit_code"] == 0 and doc["errors"] == []
            assert doc["site"] == n
            summaries.append(doc)

    digests = {n: family.digest(n) for n in SITES}
    assert len(set(digests.values())) == 1, digests
    for n in SITES:
        with family.open(n) as s:
            assert inspection.fsck(s)["ok"]
        assert run("fsck", site=family.path(n)).code == 0
    with family.open("bangalore") as s:
        assert s.get("parts", "s-1") == {"qty": 7}
        assert s.get("parts", "b-0") == {"qty": 0}

    # Round 1 at boston found no inbox yet; sanfran applied boston's packet and removed it.
    first = summaries[0]
    assert first["inboxes"][0]["present"] is False
    assert first["counts"]["exported_packets"] == 2
    assert {p["to"] for p in first["exported"]["packets"]} == {"sanfran", "bangalore"}
    second = summaries[1]
    assert second["counts"]["applied"] == 1 and second["counts"]["removed"] == 1
    assert second["imported"]["removed"] == second["imported"]["applied"]
    # Every applied packet file was removed from the media: what is left is not yet imported.
    applied = [p for d in summaries for p in d["imported"]["applied"]]
    assert applied and not any(Path(p).exists() for p in applied)

    # A third round: the acknowledgements arrive, media drain, and scrub can trim.
    third = [run("--json", "batch", configs[n]).json for n in SITES]
    assert all(d["outcome"] == "ok" for d in third)
    assert {family.digest(n) for n in SITES} == set(digests.values())
    trimmed = sum(d["scrub"]["ops_removed"] for d in summaries + third)
    assert trimmed > 0
    for n in SITES:
        with family.open(n) as s:
            assert inspection.fsck(s)["ok"]

    # One line per action in the default log, SITE/batch.log.
    log = (family.path("boston") / "batch.log").read_text().splitlines()
    assert sum("round: start" in line for line in log) == 3
    assert sum(" import: " in line for line in log) == 3
    assert sum(" export: " in line for line in log) == 3
    assert sum(" scrub: " in line for line in log) == 3
    assert all(line.split(" ", 2)[1] == "boston" for line in log)


def test_batch_human_summary_and_quiet(family):
    three_sites(family)
    family.put("boston", "parts", "p1", {"qty": 1})
    media = family.root / "shared_media"
    media.mkdir()
    cfg = site_config(family, "boston", media, scrub=False)
    r = run("batch", cfg)
    assert r.code == 0, r
    assert r.out.startswith("batch round at boston: ok\n")
    assert "export" in r.out and "2 packet(s)" in r.out
    family.put("boston", "parts", "p2", {"qty": 2})
    r = run("-q", "batch", cfg)
    assert r.code == 0 and r.out == "" and r.err == "", r
    assert len(packets_under(media)) == 4


def two_outboxes(family, first: str, first_to: str, second: str) -> tuple[Path, Path]:
    """Boston with 40 records of 4 KB and a config of two outboxes under ``media``: ``first``
    to ``first_to`` (a TOML value), ``second`` to bangalore alone in packets of 64K."""
    three_sites(family)
    for i in range(40):
        family.put("boston", "parts", f"p{i}", {"blob": os.urandom(4000).hex()})
    media = family.root / "m"
    cfg = write_config(family.root / "etc" / "boston.toml", f"""
site = "{family.path('boston')}"
[[export]]
out = "{media / first}"
to = {first_to}
create = true
[[export]]
out = "{media / second}"
to = ["bangalore"]
max_size = "64K"
create = true
""")
    return media, cfg


def test_per_peer_outboxes_and_max_size(family):
    media, cfg = two_outboxes(family, "to_sanfran", '["sanfran"]', "to_bangalore")
    r = run("--json", "batch", cfg)
    assert r.code == 0, r
    doc = r.json
    assert [o["to"] for o in doc["outboxes"]] == [["sanfran"], ["bangalore"]]
    assert len(packets_under(media / "to_sanfran")) == 1
    small = packets_under(media / "to_bangalore")
    assert len(small) > 1 and all(p.stat().st_size <= 64 * 1024 for p in small)
    assert all(p.parent.parent.name == "bangalore" for p in small)
    # The small packets apply at bangalore by a batch round there, each on its own.
    cfg_b = write_config(family.root / "etc" / "bangalore.toml", f"""
site = "{family.path('bangalore')}"
[[import]]
path = "{media / 'to_bangalore'}"
""")
    r = run("--json", "batch", cfg_b)
    assert r.code == 0, r
    assert r.json["counts"]["applied"] == len(small) and r.json["counts"]["removed"] == 0
    with family.open("bangalore") as s:
        assert len(list(s.records("parts"))) == 40


def test_an_all_outbox_beside_a_per_peer_one_leaves_that_peer_to_its_own(family):
    """operations.md's example: one outbox for all, another for bangalore with a small size.
    "all" sent bangalore's packets to the big medium and only empty ones to its own (its
    size never applied, its sequence split over two media); now "all" is the others."""
    media, cfg = two_outboxes(family, "all", '"all"', "slow")
    for _ in range(2):
        r = run("--json", "batch", cfg)
        assert r.code == 0, r
    assert {p.parent.parent.name for p in packets_under(media / "all")} == {"sanfran"}
    slow = packets_under(media / "slow")
    assert len(slow) > 1 and all(p.stat().st_size <= 64 * 1024 for p in slow)
    assert {p.parent.parent.name for p in slow} == {"bangalore"}
    assert run("import", media / "slow", site=family.path("bangalore")).code == 0
    with family.open("bangalore") as s:
        assert len(list(s.records("parts"))) == 40


def test_encrypted_outbox(family):
    three_sites(family)
    family.put("boston", "parts", "p1", {"qty": 1})
    media = family.root / "shared_media"
    media.mkdir()
    cfg = write_config(family.root / "etc" / "boston.toml", f"""
site = "{family.path('boston')}"
[[export]]
out = "{media}"
to = ["sanfran"]
encrypt = true
""")
    r = run("--json", "batch", cfg)
    assert r.code == 0, r
    [pk] = packets_under(media)
    opened = verify.open_packet(pk)
    try:
        assert opened.header.sealed
    finally:
        opened.close()
    doc = run("--json", "batch", site_config(family, "sanfran", media, scrub=False)).json
    assert doc["counts"]["applied"] == 1 and doc["exit_code"] == 0
    with family.open("sanfran") as s:
        assert s.get("parts", "p1") == {"qty": 1}


# --- the lock ---------------------------------------------------------------------------------

def test_concurrent_round_is_refused_by_the_lock(family):
    three_sites(family)
    family.put("boston", "parts", "p1", {"qty": 1})
    media = family.root / "shared_media"
    media.mkdir()
    cfg = site_config(family, "boston", media)
    lock_path = family.path("boston") / batch.BATCH_LOCK_FILE
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)   # a round "in progress"
        r = run("batch", cfg)
        assert r.code == 1, r
        assert "error: another batch round is running at site 'boston'" in r.err, r
        assert "hint:" in r.err
        assert packets_under(media) == []                  # the refused round did nothing
        rj = run("--json", "batch", cfg)
        assert rj.code == 1 and "another batch round" in rj.json["error"]
    finally:
        os.close(fd)
    log = (family.path("boston") / "batch.log").read_text()
    assert "round: refused: another batch round is running" in log
    r = run("batch", cfg)                                  # lock released: the round runs
    assert r.code == 0, r
    assert len(packets_under(media)) == 2


def test_batch_lock_is_not_the_site_lock(family):
    """The batch lock is its own file: a held site lock (an interactive command running) does
    not refuse the round, but its actions fail (exit 1) and no inbox file is deleted."""
    three_sites(family)
    family.put("sanfran", "parts", "p1", {"qty": 1})
    media = family.root / "shared_media"
    with family.open("sanfran") as s:
        sync.export(s, media, to=["boston"])
    before = all_files(media)
    cfg = site_config(family, "boston", media)
    with family.open("boston") as s, s.lock():              # e.g. an interactive 'import'
        r = run("--json", "batch", cfg)
    assert r.code == 1, r
    doc = r.json
    assert doc["outcome"] == "failed"
    assert {e["action"] for e in doc["errors"]} == {"import", "export", "scrub"}
    assert all("another syncpack command" in e["error"] for e in doc["errors"])
    assert all_files(media) == before                      # nothing removed: nothing committed
    r = run("batch", cfg)
    assert r.code == 0, r
    assert packets_under(media / "boston") == []           # applied now, then removed


# --- remove_after_import ----------------------------------------------------------------------

def test_remove_after_import_removes_applied_packets_only(family):
    three_sites(family)
    stage = family.root / "stage"
    inbox = family.root / "inbox"
    inbox.mkdir()
    n = [0]

    def export(src: str, dst: str) -> Path:
        n[0] += 1
        with family.open(src) as s:
            return sync.export(s, stage / str(n[0]), to=[dst])[0].path

    # boston -> sanfran: #1 imported before (so sanfran knows bangalore; here a duplicate),
    # #2 applies, #3 arrives damaged.
    family.put("boston", "parts", "p1", {"qty": 1})
    b1 = export("boston", "sanfran")
    assert family.import_("sanfran", [b1]).applied
    family.put("boston", "parts", "p2", {"qty": 2})
    b2 = export("boston", "sanfran")
    family.put("boston", "parts", "p3", {"qty": 3})
    b3 = export("boston", "sanfran")
    # bangalore -> sanfran: two packets; only the second arrives at first (it parks).
    family.put("bangalore", "parts", "g1", {"qty": 1})
    g1 = export("bangalore", "sanfran")
    family.put("bangalore", "parts", "g2", {"qty": 2})
    g2 = export("bangalore", "sanfran")
    # boston -> bangalore: a packet for another site on the same medium.
    foreign = export("boston", "bangalore")

    def place(src: Path, rel: str) -> Path:
        dst = inbox / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)
        return dst

    duplicate = place(b1, "sanfran/boston/0000000001-0000.spk")
    applied = place(b2, "sanfran/boston/0000000002-0000.spk")
    rejected = place(b3, "sanfran/boston/0000000003-0000.spk")
    data = bytearray(rejected.read_bytes())
    data[12] ^= 0xFF                                       # damaged in transit (the body)
    rejected.write_bytes(bytes(data))
    parked = place(g2, "sanfran/bangalore/0000000002-0000.spk")
    other = place(foreign, "bangalore/boston/0000000001-0000.spk")
    notes = inbox / "sanfran" / "README.txt"
    notes.write_text("not a packet\n")

    cfg = write_config(family.root / "etc" / "sanfran.toml", f"""
site = "{family.path('sanfran')}"
[[import]]
path = "{inbox}"
remove_after_import = true
""")
    r = run("--json", "batch", cfg)
    assert r.code == 1, r                                  # a packet was rejected
    doc = r.json
    assert doc["outcome"] == "failed" and doc["errors"] == []
    assert doc["imported"]["applied"] == [str(applied)]
    assert doc["imported"]["duplicates"] == [str(duplicate)]
    assert [p["path"] for p in doc["imported"]["parked"]] == [str(parked)]
    assert [p["path"] for p in doc["imported"]["rejected"]] == [str(rejected)]
    assert doc["imported"]["skipped"] == [str(other)]
    assert sorted(doc["imported"]["removed"]) == sorted([str(applied), str(duplicate)])
    assert not applied.exists() and not duplicate.exists()
    assert parked.exists() and rejected.exists() and other.exists() and notes.exists()
    again = run("batch", cfg)
    assert again.code == 1 and f"error: {rejected}: " in again.err, again

    # The missing packet arrives: it applies, the parked one applies (from the site's own copy)
    # and both inbox files go; the foreign packet, the damaged one and the text file stay.
    missing = place(g1, "sanfran/bangalore/0000000001-0000.spk")
    r = run("--json", "batch", cfg)
    assert r.code == 1, r                                  # the damaged one, still there
    doc = r.json
    assert set(doc["imported"]["applied"]) == {str(missing), str(parked)}
    assert set(doc["imported"]["removed"]) == {str(missing), str(parked)}
    assert not missing.exists() and not parked.exists()
    assert other.exists() and notes.exists() and rejected.exists()
    with family.open("sanfran") as s:
        assert s.get("parts", "g2") == {"qty": 2}
    rejected.unlink()
    assert run("batch", cfg).code == 0
    assert all_files(inbox) == ["bangalore/boston/0000000001-0000.spk", "sanfran/README.txt"]


def test_damaged_packet_in_an_inbox_is_rejected_not_ignored(family):
    """A file that starts like a packet but is truncated is reported (the scheduler alerts),
    while files that are not packets at all are left alone."""
    three_sites(family)
    family.put("boston", "parts", "p1", {"qty": 1})
    media = family.root / "shared_media"
    with family.open("boston") as s:
        pk = sync.export(s, media, to=["sanfran"])[0].path
    pk.write_bytes(pk.read_bytes()[:-10])
    (media / "sanfran" / "notes.txt").write_text("hello")
    cfg = site_config(family, "sanfran", media, scrub=False)
    r = run("batch", cfg)
    assert r.code == 1, r
    assert f"error: {pk}: packet is truncated or damaged" in r.err
    assert pk.exists()


def test_without_remove_after_import_nothing_is_deleted(family):
    three_sites(family)
    family.put("boston", "parts", "p1", {"qty": 1})
    media = family.root / "shared_media"
    with family.open("boston") as s:
        sync.export(s, media, all_peers=True)
    before = all_files(media)
    cfg = site_config(family, "sanfran", media, remove=False, scrub=False)
    doc = run("--json", "batch", cfg).json
    assert doc["counts"]["applied"] == 1 and doc["counts"]["removed"] == 0
    assert set(before) <= set(all_files(media))
    doc = run("--json", "batch", cfg).json                 # the same packet again
    assert doc["counts"]["duplicates"] == 1 and doc["exit_code"] == 0


def test_missing_inboxes_and_outboxes(family):
    three_sites(family)
    family.put("boston", "parts", "p1", {"qty": 1})
    root = family.root
    cfg = write_config(root / "etc" / "b.toml", f"""
site = "{family.path('boston')}"
[[import]]
path = "{root / 'not_yet'}"
[[export]]
out = "{root / 'unmounted'}"
""")
    r = run("batch", cfg)
    assert r.code == 1, r
    assert f"error: export {root / 'unmounted'} -> all: outbox {root / 'unmounted'} does not " \
        f"exist" in r.err
    assert "hint: mount the medium or correct the path, or set export[1].create = true" in r.err
    assert "nothing to send" not in r.out and "failed (see the error lines)" in r.out
    assert not (root / "unmounted").exists()               # never created on the wrong disk
    cfg.write_text(cfg.read_text().replace('[[import]]', '[[import]]\nrequired = true'))
    r = run("--json", "batch", cfg)
    assert r.code == 1
    assert [e["action"] for e in r.json["errors"]] == ["import", "export"]
    assert "does not exist" in r.json["errors"][0]["error"]
    assert r.json["outboxes"][0]["failed"] is True
    cfg.write_text(f"""
site = "{family.path('boston')}"
[[import]]
path = "{root / 'not_yet'}"
[[export]]
out = "{root / 'unmounted'}"
create = true
""")
    r = run("--json", "batch", cfg)
    assert r.code == 0, r
    assert len(packets_under(root / "unmounted")) == 2


def test_relative_paths_are_relative_to_the_config_file(family, monkeypatch):
    three_sites(family)
    family.put("boston", "parts", "p1", {"qty": 1})
    cfg = write_config(family.root / "etc" / "boston.toml", """
site = "../boston"
log = "boston.log"
[[export]]
out = "../media_rel"
create = true
""")
    monkeypatch.chdir(family.path("sanfran"))
    r = run("batch", cfg)
    assert r.code == 0, r
    assert len(packets_under(family.root / "media_rel")) == 2
    assert "export:" in (family.root / "etc" / "boston.log").read_text()


# --- config errors ----------------------------------------------------------------------------

CONFIG_ERRORS = [
    ("bad toml", 'site = "x\n', "not valid TOML"),
    ("missing site", '[[export]]\nout = "/tmp"\n', "site: missing (required)"),
    ("unknown top key", 'site = "{site}"\n[[imports]]\npath = "/tmp"\n',
     "imports: unknown key"),
    ("unknown import key", 'site = "{site}"\n[[import]]\npath = "/tmp"\nremove = true\n',
     "import[1].remove: unknown key"),
    ("unknown export key", 'site = "{site}"\n[[export]]\nout = "/tmp"\nmaxsize = "1M"\n',
     "export[1].maxsize: unknown key"),
    ("unknown scrub key", 'site = "{site}"\n[scrub]\nage = "7d"\n', "scrub.age: unknown key"),
    ("missing import path", 'site = "{site}"\n[[import]]\nremove_after_import = true\n',
     "import[1].path: missing (required)"),
    ("bad bool", 'site = "{site}"\n[[import]]\npath = "/tmp"\nremove_after_import = "yes"\n',
     "import[1].remove_after_import: must be true or false"),
    ("bad to", 'site = "{site}"\n[[export]]\nout = "/tmp"\nto = 3\n', "export[1].to: must be"),
    ("bad max_size", 'site = "{site}"\n[[export]]\nout = "/tmp"\nmax_size = "big"\n',
     "export[1].max_size: not a size"),
    ("infinite max_size", 'site = "{site}"\n[[export]]\nout = "/tmp"\nmax_size = "inf"\n',
     "export[1].max_size: not a size"),
    ("huge max_size", 'site = "{site}"\n[[export]]\nout = "/tmp"\nmax_size = "9999999T"\n',
     "export[1].max_size: the largest packet must be at most"),
    ("bad min_age", 'site = "{site}"\n[scrub]\nmin_age = "soon"\n',
     "scrub.min_age: not a duration"),
    ("site type", 'site = 7\n[scrub]\n', "site: must be a non-empty string"),
    ("nothing to do", 'site = "{site}"\n', "nothing to do"),
    ("not a site", 'site = "/"\n[scrub]\n', "site: / is not a syncpack site"),
    ("no such site", 'site = "/no/such/dir"\n[scrub]\n', "site: /no/such/dir is not a directory"),
]


@pytest.mark.parametrize("text,expect", [c[1:] for c in CONFIG_ERRORS],
                         ids=[c[0] for c in CONFIG_ERRORS])
def test_config_errors_are_one_line_errors(family, text, expect):
    family.init("boston")
    cfg = write_config(family.root / "etc" / "bad.toml",
                       text.replace("{site}", str(family.path("boston"))))
    r = run("batch", cfg)                                  # run() fails on any traceback
    assert r.code == 1, r
    assert r.err.startswith(f"error: batch config {cfg}: "), r
    assert expect in r.err, r
    assert "\nhint: " in r.err, r         # every error a person can act on has one
    assert "--site" not in r.err and "SYNCPACK_SITE" not in r.err, r    # no way to name it
    assert r.out == ""
    assert not (family.path("boston") / "batch.log").exists()   # nothing was done
    rj = run("--json", "batch", cfg)
    assert rj.code == 1 and expect in rj.json["error"]


def test_config_error_hints(family):
    family.init("boston")
    cfg = write_config(family.root / "etc" / "typo.toml",
                       f'site = "{family.path("boston")}"\n[[exports]]\nout = "/tmp"\n')
    r = run("batch", cfg)
    assert r.code == 1 and "hint: did you mean 'export'?" in r.err, r


def test_missing_config_file(tmp_path):
    r = run("batch", tmp_path / "nope.toml")
    assert r.code == 1, r
    assert r.err.startswith(f"error: batch config {tmp_path / 'nope.toml'}: no such file"), r
    r = run("batch", tmp_path)
    assert r.code == 1 and "is a directory" in r.err, r


@pytest.mark.parametrize("log, said", [
    ("/no/such/dir/x.log", "log: cannot append to /no/such/dir/x.log"),
    # every write to /dev/full fails as a full disk does: the error named no file
    ("/dev/full", "error: log /dev/full: cannot append to /dev/full (No space left on device)"),
])
def test_a_log_that_cannot_be_written_is_named_in_the_error(family, log, said):
    if log == "/dev/full" and not Path(log).exists():
        pytest.skip("no /dev/full here")
    family.init("boston")
    cfg = write_config(family.root / "etc" / "b.toml",
                       f'site = "{family.path("boston")}"\nlog = "{log}"\n[scrub]\n')
    r = run("batch", cfg)
    assert r.code == 1 and said in r.err and "Traceback" not in r.err, r


def test_parse_duration():
    assert batch.parse_duration_ms(90) == 90_000
    assert batch.parse_duration_ms("15m") == 900_000
    assert batch.parse_duration_ms("7d") == 7 * 86_400_000
    assert batch.parse_duration_ms("1.5h") == 5_400_000
    for bad in ("", "x", "-1", True, [1], "-7d", "nan", "inf", "99999999999999999999d",
                float("nan")):
        with pytest.raises(ValueError):
            batch.parse_duration_ms(bad)


@pytest.mark.parametrize("age", ["-1", "-7d", "99999999999999999999d", "inf", "nan", "x"])
def test_scrub_refuses_an_age_that_is_no_duration_and_trims_nothing(tmp_path, age):
    site = tmp_path / "a"
    assert run("init", site, "--family", "f", "--site", "a").code == 0
    r = run("scrub", "--min-age", age, site=site)
    assert r.code == 2 and "--min-age" in r.err and "internal error" not in r.err, r


def test_run_batch_api_returns_the_summary(family):
    three_sites(family)
    family.put("boston", "parts", "p1", {"qty": 1})
    media = family.root / "shared_media"
    media.mkdir()
    ticks = []
    doc = batch.run_batch(site_config(family, "boston", media), progress=ticks.append)
    assert doc["exit_code"] == 0 and sum(ticks) == doc["counts"]["exported_ops"] > 0
    json.dumps(doc)                                        # JSON-able as it is
    with pytest.raises(BatchConfigError, match="no such file"):
        batch.run_batch(family.root / "etc" / "missing.toml")
    lock = family.path("boston") / batch.BATCH_LOCK_FILE
    with open(lock, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(BatchLockedError):
            batch.run_batch(site_config(family, "boston", media))


# --- metrics ----------------------------------------------------------------------------------

def _prom(path: Path) -> dict[str, list]:
    from prometheus_client.parser import text_string_to_metric_families
    out: dict[str, list] = {}
    for fam in text_string_to_metric_families(path.read_text()):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def _one(got: dict, name: str) -> float:
    [(labels, value)] = got[name]
    assert labels["site"] == "boston"
    return value


def _packets(prom: Path) -> dict[str, float]:
    """The metrics file's packets of the last round, by result."""
    return {lab["result"]: v for lab, v in _prom(prom)["syncpack_batch_last_run_packets"]}


def _sanfran_imports(family, *inboxes: Path) -> tuple[Path, Path]:
    """(a batch file for sanfran importing from ``inboxes`` in turn, its metrics file)."""
    prom = family.root / "sanfran.prom"
    imports = "".join(f'[[import]]\npath = "{p}"\n' for p in inboxes)
    cfg = write_config(family.root / "etc" / "sanfran.toml",
                       f'site = "{family.path("sanfran")}"\nmetrics = "{prom}"\n' + imports)
    return cfg, prom


def test_metrics_file_after_good_and_failed_rounds(family):
    three_sites(family)
    family.put("boston", "parts", "p1", {"qty": 1})
    media = family.root / "shared_media"
    media.mkdir()
    textfiles = family.root / "textfile"
    textfiles.mkdir()
    prom = textfiles / "syncpack_boston.prom"
    cfg = write_config(family.root / "etc" / "boston.toml", f"""
site = "{family.path('boston')}"
metrics = "{prom}"
[[export]]
out = "{media}"
""")
    before = time.time()
    r = run("batch", cfg)
    assert r.code == 0, r
    got = _prom(prom)
    assert _one(got, "syncpack_batch_last_run_ok") == 1
    success = _one(got, "syncpack_batch_last_success_timestamp_seconds")
    assert before - 1 <= success <= time.time() + 1
    assert _one(got, "syncpack_batch_last_run_timestamp_seconds") == success
    assert _one(got, "syncpack_batch_last_run_failed_actions") == 0
    packets = _packets(prom)
    assert packets["exported"] == 2 and packets["applied"] == 0
    # The site's status metrics are in the same file, as 'status --format prometheus' has them.
    assert {lab["peer"] for lab, _ in got["syncpack_peer_lag_ops"]} == {"sanfran", "bangalore"}
    sent = {lab["peer"]: v for lab, v in
            got["syncpack_peer_last_packet_sent_timestamp_seconds"]}
    assert all(before - 1 <= v for v in sent.values())
    status = run("status", "--format", "prometheus", site=family.path("boston")).out
    assert status in prom.read_text()
    assert oct(prom.stat().st_mode & 0o777) == oct(0o644)   # node_exporter is another user
    assert [p.name for p in textfiles.iterdir()] == [prom.name]   # no temporary file left

    # The medium is unmounted: the round fails, the file says so, the last success stays.
    shutil.rmtree(media)
    time.sleep(0.01)
    r = run("batch", cfg)
    assert r.code == 1, r
    got = _prom(prom)
    assert _one(got, "syncpack_batch_last_run_ok") == 0
    assert _one(got, "syncpack_batch_last_run_failed_actions") == 1
    assert _one(got, "syncpack_batch_last_success_timestamp_seconds") == success
    assert _one(got, "syncpack_batch_last_run_timestamp_seconds") > success
    r = run("batch", cfg)                                  # and again: still carried over
    assert _one(_prom(prom), "syncpack_batch_last_success_timestamp_seconds") == success
    log = (family.path("boston") / "batch.log").read_text()
    assert log.count(f"metrics: wrote {prom}") == 3

    # A round that fails before any success leaves no last-success sample (never succeeded).
    prom.unlink()
    r = run("batch", cfg)
    assert r.code == 1
    assert "syncpack_batch_last_success_timestamp_seconds" not in _prom(prom)
    assert _one(_prom(prom), "syncpack_batch_last_run_ok") == 0


def test_metrics_a_rejected_packet_counts_as_a_failed_round(family):
    three_sites(family)
    family.put("boston", "parts", "p1", {"qty": 1})
    media = family.root / "shared_media"
    with family.open("boston") as s:
        pk = sync.export(s, media, to=["sanfran"])[0].path
    pk.write_bytes(pk.read_bytes()[:-10])
    cfg, prom = _sanfran_imports(family, media / "sanfran")
    r = run("--json", "batch", cfg)
    assert r.code == 1 and r.json["errors"] == [], r
    got = _prom(prom)
    [(_, ok)] = got["syncpack_batch_last_run_ok"]
    assert ok == 0
    packets = _packets(prom)
    assert packets["rejected"] == 1


def test_metrics_refused_round_leaves_the_file_alone(family):
    three_sites(family)
    prom = family.root / "boston.prom"
    cfg = write_config(family.root / "etc" / "boston.toml", f"""
site = "{family.path('boston')}"
metrics = "{prom}"
[scrub]
""")
    assert run("batch", cfg).code == 0
    before = prom.read_bytes()
    fd = os.open(family.path("boston") / batch.BATCH_LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        r = run("batch", cfg)
        assert r.code == 1 and "another batch round" in r.err
    finally:
        os.close(fd)
    assert prom.read_bytes() == before                     # the running round owns the file


def test_metrics_write_failure_is_a_failed_action(family):
    three_sites(family)
    family.put("boston", "parts", "p1", {"qty": 1})
    media = family.root / "shared_media"
    media.mkdir()
    prom = family.root / "no_such_dir" / "boston.prom"
    cfg = write_config(family.root / "etc" / "boston.toml", f"""
site = "{family.path('boston')}"
metrics = "{prom}"
[[export]]
out = "{media}"
""")
    r = run("--json", "batch", cfg)
    assert r.code == 1, r
    doc = r.json
    assert doc["outcome"] == "failed" and doc["counts"]["errors"] == 1
    [e] = doc["errors"]
    assert e["action"] == "metrics" and e["target"] == str(prom)
    assert e["error"].startswith(f"cannot write metrics file {prom}: ")
    assert "textfile.directory" in e["hint"]
    assert len(packets_under(media)) == 2                  # the exports still happened
    r = run("batch", cfg)
    assert r.code == 1 and f"error: metrics {prom}: cannot write metrics file" in r.err, r
    assert "hint: check that the directory exists" in r.err
    log = (family.path("boston") / "batch.log").read_text()
    assert "metrics: ERROR" in log and "round: end: failed (exit 1)" in log


def test_metrics_replace_is_atomic(family, tmp_path, monkeypatch):
    """A write that fails half-way leaves the previous file whole and no temporary file."""
    target = tmp_path / "m.prom"
    batch.write_textfile(target, "old 1\n")
    assert target.read_text() == "old 1\n"

    def broken_fsync(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(OSError):
        batch.write_textfile(target, "new 2\n")
    assert target.read_text() == "old 1\n"
    assert [p.name for p in tmp_path.iterdir()] == ["m.prom"]


def test_metrics_key_must_name_a_prom_file(family):
    family.init("boston")
    cfg = write_config(family.root / "etc" / "b.toml",
                       f'site = "{family.path("boston")}"\nmetrics = "/tmp/x.txt"\n[scrub]\n')
    r = run("batch", cfg)
    assert r.code == 1, r
    assert r.err.startswith(f"error: batch config {cfg}: metrics: /tmp/x.txt does not end "
                            f"in .prom"), r
    assert "hint: node_exporter's textfile collector reads only *.prom files" in r.err
    assert not (family.path("boston") / "batch.log").exists()
    cfg.write_text(f'site = "{family.path("boston")}"\nmetrics = 3\n[scrub]\n')
    r = run("batch", cfg)
    assert r.code == 1 and "metrics: must be a non-empty string" in r.err, r


def _one_good_round_with_metrics(family) -> tuple[Path, Path]:
    """Three sites; boston's config exports to a shared medium and writes metrics, and one
    round of it has run well.  Returns (config, metrics file)."""
    three_sites(family)
    media = family.root / "shared_media"
    media.mkdir()
    prom = family.root / "boston.prom"
    cfg = write_config(family.root / "etc" / "boston.toml", f"""
site = "{family.path('boston')}"
metrics = "{prom}"
[[export]]
out = "{media}"
""")
    assert batch.run_batch(cfg)["exit_code"] == 0
    return cfg, prom


def test_metrics_written_when_a_round_is_interrupted(family, monkeypatch):
    cfg, prom = _one_good_round_with_metrics(family)
    success = _one(_prom(prom), "syncpack_batch_last_success_timestamp_seconds")

    def interrupted(*a, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(sync, "export", interrupted)
    with pytest.raises(KeyboardInterrupt):
        batch.run_batch(cfg)
    got = _prom(prom)
    assert _one(got, "syncpack_batch_last_run_ok") == 0
    assert _one(got, "syncpack_batch_last_success_timestamp_seconds") == success
    assert "round: ABORTED: interrupted; the action in progress was rolled back" in (family.path("boston") / "batch.log").read_text()


def test_an_interactive_command_waits_for_the_one_working_on_the_site(family):
    """An administrator's import while another command (a scheduled round's import, say)
    holds the site: it says it waits, waits, and runs once the other is done, where it
    failed at once before.  A round's own actions still fail at once (the test above)."""
    import subprocess
    import sys
    three_sites(family)
    family.put("sanfran", "parts", "p1", {"qty": 1})
    media = family.root / "shared_media"
    with family.open("sanfran") as s:
        sync.export(s, media, to=["boston"])
    exe = shutil.which("syncpack", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.skip("needs the syncpack script of this venv")
    with family.open("boston") as s:
        with s.lock():
            p = subprocess.Popen([exe, "--site", str(family.path("boston")), "import",
                                  str(media / "boston")], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
            time.sleep(1.5)
            assert p.poll() is None         # still waiting for the lock held here
        out, err = p.communicate(timeout=60)
    assert p.returncode == 0, (out, err)
    assert "waiting for another syncpack command on site 'boston'" in err, err
    assert "1 packet(s) applied" in out, out


def test_outboxes_sharing_a_missing_directory_are_told_apart_by_their_peers(family):
    """Two outboxes in one directory that is not there: each error named the directory
    only, so the administrator could not tell which peer's packets were not written."""
    three_sites(family)
    root = family.root
    cfg = write_config(root / "etc" / "two.toml", f"""
site = "{family.path('boston')}"
[[export]]
out = "{root / 'nomedia'}"
to = ["sanfran"]
[[export]]
out = "{root / 'nomedia'}"
to = ["bangalore"]
""")
    r = run("--json", "batch", cfg)
    assert r.code == 1, r
    assert [e["target"] for e in r.json["errors"]] == [
        f"{root / 'nomedia'} -> sanfran", f"{root / 'nomedia'} -> bangalore"], r.json


def test_a_log_in_a_directory_not_made_yet_says_to_make_it(family):
    """operations.md's systemd set-up names a log under /var/log/syncpack; a round whose log
    directory is missing said only 'fix the file' (the file was right)."""
    three_sites(family)
    root = family.root
    log = root / "logs" / "syncpack" / "boston.log"
    cfg = write_config(root / "etc" / "log.toml", f"""
site = "{family.path('boston')}"
log = "{log}"
[[import]]
path = "{root / 'inbox'}"
""")
    r = run("batch", cfg)
    assert r.code == 1 and "cannot append to" in r.err, r
    assert f"hint: create {log.parent}" in r.err and "mkdir -p" in r.err, r


def test_a_file_name_that_is_not_utf8_in_an_inbox_never_stops_the_round(family):
    """A damaged copy named in Latin-1 in a drop directory: the round's log line for it
    raised, every round ended there, and the site never exported again; a good packet so
    named could not be recorded as applied."""
    three_sites(family)
    media = family.root / "drop"
    media.mkdir()
    family.put("boston", "parts", "p1", 1)
    assert run("batch", site_config(family, "boston", media)).code == 0
    inbox = media / "sanfran"
    junk = os.fsencode(inbox) + b"/\xfejunk.spk"
    with open(junk, "wb") as f:
        f.write(b"junk")
    good = next(p for p in packets_under(inbox))
    os.rename(good, os.fsencode(good.parent) + b"/\xffpk.spk")
    family.put("sanfran", "parts", "s1", 2)
    r = run("--json", "batch", site_config(family, "sanfran", media))
    assert r.code == 1 and r.json is not None, r
    assert len(r.json["imported"]["applied"]) == 1 and len(r.json["imported"]["rejected"]) == 1
    assert r.json["counts"]["exported_packets"] == 2 and r.json["errors"] == [], r.json
    assert "\\udcfe" in (family.path("sanfran") / "batch.log").read_text()
    assert run("get", "parts", "p1", site=family.path("sanfran")).out.strip() == "1"


def test_a_log_that_cannot_be_written_fails_the_round_but_not_its_actions(family):
    """A full disk under the log (here /dev/full): the round stopped at its first line, with
    no summary and its metrics still saying the last round was fine."""
    three_sites(family)
    media = family.root / "drop"
    media.mkdir()
    family.put("boston", "parts", "p1", 1)
    prom = family.root / "boston.prom"
    cfg = site_config(family, "boston", media)
    cfg.write_text(f'log = "/dev/full"\nmetrics = "{prom}"\n' + cfg.read_text())
    r = run("--json", "batch", cfg)
    assert r.code == 1, r
    assert [e["action"] for e in r.json["errors"]] == ["log"], r.json
    assert "No space left" in r.json["errors"][0]["error"]
    assert r.json["counts"]["exported_packets"] == 2
    assert 'syncpack_batch_last_run_ok{site="boston"} 0' in prom.read_text()


def test_a_packet_parked_earlier_is_counted_once_however_many_inboxes(family):
    three_sites(family)
    media = family.root / "drop"
    media.mkdir()
    family.put("sanfran", "parts", "s1", 1)
    assert run("batch", site_config(family, "sanfran", media)).code == 0
    family.put("sanfran", "parts", "s2", 2)
    assert run("batch", site_config(family, "sanfran", media)).code == 0
    first = min(packets_under(media / "boston" / "sanfran"))
    first.unlink()                                  # lost: the second waits for it
    cfg = site_config(family, "boston", media)
    (family.root / "usb").mkdir()
    cfg.write_text(cfg.read_text() + f'\n[[import]]\npath = "{family.root / "usb"}"\n')
    r = run("--json", "batch", cfg)
    assert r.code == 0, r
    assert r.json["counts"]["parked"] == 1 and len(r.json["imported"]["parked"]) == 1, r.json


def test_a_packet_one_inbox_parks_and_a_later_inbox_applies_is_not_counted_parked(family):
    three_sites(family)
    in1, in2 = family.root / "in1", family.root / "in2"
    family.put("boston", "parts", "p1", 1)
    first = family.export("boston", "sanfran")
    family.put("boston", "parts", "p2", 2)
    second = family.export("boston", "sanfran")
    # the later packet is in the first inbox: its import parks it, the second's applies it
    for inbox, pkts in ((in1, second), (in2, first)):
        inbox.mkdir()
        for p in pkts:
            shutil.copy(p, inbox / p.name)
    cfg, prom = _sanfran_imports(family, in1, in2)
    r = run("--json", "batch", cfg)
    assert r.code == 0, r
    doc = r.json
    assert len(doc["inboxes"][0]["parked"]) == 1        # true when that import was done
    assert doc["imported"]["parked"] == [] and doc["counts"]["parked"] == 0, doc
    assert sorted(doc["imported"]["applied"]) == sorted(
        str(d / p.name) for d, pkts in ((in1, second), (in2, first)) for p in pkts)
    assert doc["counts"]["applied"] == 2
    assert run("--json", "status", site=family.path("sanfran")).json["parked"] == []
    end = (family.path("sanfran") / "batch.log").read_text().splitlines()[-1]
    assert "applied 2, parked 0," in end, end
    packets = _packets(prom)
    assert packets["parked"] == 0 and packets["applied"] == 2, packets
    with family.open("sanfran") as s:
        assert s.get("parts", "p2") == 2


def test_a_round_whose_inbox_is_absent_still_counts_the_packets_parked_earlier(family):
    """The medium not mounted: the round imported nothing and said nothing was parked (in its
    summary, its log and its metrics), though a packet waited in the site all along."""
    three_sites(family)
    family.put("boston", "parts", "p1", 1)
    first = family.export("boston", "sanfran")
    family.put("boston", "parts", "p2", 2)
    [second] = family.export("boston", "sanfran")
    assert family.import_("sanfran", [second]).parked       # it waits for the first
    inbox = family.root / "not_mounted"
    cfg, prom = _sanfran_imports(family, inbox)
    r = run("--json", "batch", cfg)
    assert r.code == 0, r                   # an absent inbox that is not required: no failure
    doc = r.json
    assert doc["outcome"] == "ok" and doc["errors"] == [], doc
    assert doc["inboxes"] == [{"path": str(inbox), "present": False}]
    assert [p["path"] for p in doc["imported"]["parked"]] == [str(second)], doc
    assert doc["counts"]["parked"] == 1 and doc["counts"]["applied"] == 0
    end = (family.path("sanfran") / "batch.log").read_text().splitlines()[-1]
    assert "applied 0, parked 1," in end, end
    packets = _packets(prom)
    assert packets["parked"] == 1, packets
    r = run("batch", cfg)
    assert f"parked {second}: waiting for" in r.out, r

    # The medium comes back with the missing packet: both apply, the parked one from the
    # site's own copy.
    inbox.mkdir()
    for p in first:
        shutil.copy(p, inbox / p.name)
    doc = run("--json", "batch", cfg).json
    assert doc["counts"]["applied"] == 2 and doc["counts"]["parked"] == 0, doc
    with family.open("sanfran") as s:
        assert s.get("parts", "p2") == 2


def test_unsealed_packets_left_from_before_sealing_are_removed_once_refused(family):
    """Packets written before the family required sealing, left in an inbox: refused at
    every round for ever (their ops come again, sealed), failing every round."""
    three_sites(family)
    media = family.root / "drop"
    media.mkdir()
    family.put("bangalore", "parts", "g1", 1)
    assert run("batch", site_config(family, "bangalore", media)).code == 0
    assert run("require-sealing", "on", site=family.path("boston")).code == 0
    cfg = site_config(family, "boston", media)
    r = run("--json", "batch", cfg)
    assert r.code == 1 and len(r.json["imported"]["rejected"]) == 1, r.json
    assert len(r.json["imported"]["removed"]) == 1
    assert not packets_under(media / "boston")
    for _ in range(3):
        for n in ("boston", "sanfran", "bangalore"):
            run("batch", site_config(family, n, media))
    for n in ("boston", "sanfran", "bangalore"):
        assert run("--json", "batch", site_config(family, n, media)).code == 0, n
    assert run("get", "parts", "g1", site=family.path("boston")).out.strip() == "1"


def test_remove_after_import_leaves_packets_reached_through_a_link_to_another_directory(
        family):
    """An inbox holding a link to an archive of packets: the import reads through it, and the
    round deleted the archive's copies of the packets it applied, outside the inbox."""
    three_sites(family)
    family.put("boston", "parts", "p1", {"qty": 1})
    archive = family.root / "archive"
    with family.open("boston") as s:
        [pk] = sync.export(s, archive, to=["sanfran"])
    media = family.root / "media"
    (media / "sanfran").mkdir(parents=True)
    (media / "sanfran" / "from-archive").symlink_to(archive / "sanfran")
    r = run("batch", site_config(family, "sanfran", media, scrub=False))
    assert r.code == 0, r
    with family.open("sanfran") as s:
        assert s.get("parts", "p1") == {"qty": 1}
    assert pk.path.exists(), "a packet outside the inbox was deleted"


def test_an_inbox_that_is_one_packet_file_is_removed_once_applied(family):
    """An inbox may be one packet file: remove_after_import never deleted it (its directory
    is not inside the inbox), and it came back as a duplicate at every round."""
    three_sites(family)
    family.put("boston", "parts", "p1", {"qty": 1})
    [pk] = family.export("boston", "sanfran")
    inbox = family.root / "drop" / "from-boston.spk"
    inbox.parent.mkdir()
    shutil.copyfile(pk, inbox)
    cfg = write_config(family.root / "etc" / "sanfran.toml", f"""
site = "{family.path('sanfran')}"
[[import]]
path = "{inbox}"
remove_after_import = true
""")
    r = run("--json", "batch", cfg)
    assert r.code == 0, r
    assert r.json["imported"]["applied"] == [str(inbox)], r.json
    assert r.json["imported"]["removed"] == [str(inbox)], r.json
    assert not inbox.exists()
    with family.open("sanfran") as s:
        assert s.get("parts", "p1") == {"qty": 1}

    # A copy applied before (a duplicate) goes too; a link to one goes, not the file it leads
    # to, as a link to a file in a directory inbox.
    for place in (lambda: shutil.copyfile(pk, inbox), lambda: inbox.symlink_to(pk)):
        place()
        r = run("--json", "batch", cfg)
        assert r.code == 0, r
        assert r.json["imported"]["duplicates"] == [str(inbox)], r.json
        assert r.json["imported"]["removed"] == [str(inbox)], r.json
        assert not os.path.lexists(inbox)
    assert pk.exists(), "the file a link in the inbox led to was deleted"


def test_a_sigterm_once_the_actions_have_run_lets_the_round_end_and_write_its_metrics(family):
    """'systemctl stop' landing after the round's export, while it summed the round up:
    the metrics file kept the round before (all well, a stale backlog), the log had no end
    line, and the message said the action in progress was rolled back though the export had
    committed.  The actions done, the round ends whole (exit 0, as a finished command)."""
    cfg, prom = _one_good_round_with_metrics(family)
    family.put("boston", "parts", "p9", {"qty": 9})
    # the signal arrives in the summing-up, as a real one did (a window of ~100 ms)
    code = ("import os, signal, sys\n"
            "from syncpack import batch\n"
            "real = batch._summary\n"
            "def summary(*a, **kw):\n"
            "    os.kill(os.getpid(), signal.SIGTERM)\n"
            "    return real(*a, **kw)\n"
            "batch._summary = summary\n"
            "from syncpack.console import main\n"
            f"sys.argv = ['syncpack', 'batch', {str(cfg)!r}]\n"
            "main()\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r
    log = (family.path("boston") / "batch.log").read_text().splitlines()
    assert "round: end: ok" in log[-1] and "exported 2" in log[-1], log[-3:]
    got = _prom(prom)
    assert _one(got, "syncpack_batch_last_run_ok") == 1
