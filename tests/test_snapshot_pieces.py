"""A snapshot holding one record larger than --max-size: the record travels as pieces of
snapshot packets (formats/PACKET.md section 7.1), joined before the snapshot applies whole."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from conftest import run
from syncpack.exchange.verify import open_packet


def _put_big(site: Path, key: str, size: int, tmp_path: Path) -> None:
    f = tmp_path / f"{key}.json"
    f.write_text(json.dumps({"blob": os.urandom(size // 2).hex()}))   # does not compress
    assert run("put", "parts", key, "-", site=site, input=f.read_text()).code == 0


def _snapshot_for_new_site(family, tmp_path: Path, name: str = "n") -> tuple[Path, list[Path]]:
    family.init("a")
    a = family.path("a")
    _put_big(a, "big300k", 300_000, tmp_path)
    _put_big(a, "big1m", 1_000_000, tmp_path)
    assert run("put", "parts", "small", "1", site=a).code == 0
    d = tmp_path / name
    k = run("keygen", d, "--site", name, json_mode=True)
    assert k.code == 0, k
    usb = tmp_path / "usb"
    e = run("mkreplica", "export", "--site", name, "--pubkey", k.json["public_key"],
            "--create-out", "--out", usb, "--max-size", "64K", site=a, json_mode=True)
    assert e.code == 0, e
    files = sorted(usb.rglob("*.spk"))
    assert len(files) > 20 and all(f.stat().st_size <= 64 * 1024 for f in files)
    return d, files


def _pieces(files: list[Path]) -> list[tuple[Path, tuple[int, int]]]:
    out = []
    for f in files:
        pk = open_packet(f)
        try:
            if pk.header.piece is not None:
                out.append((f, pk.header.piece))
        finally:
            pk.close()
    return out


def test_mkreplica_at_64k_with_records_larger_than_a_packet(family, tmp_path):
    d, files = _snapshot_for_new_site(family, tmp_path)
    totals = {total for _f, (_off, total) in _pieces(files)}
    assert len(totals) == 2     # the two big records, each in pieces
    r = run("mkreplica", "import", *reversed(files), site=d)
    assert r.code == 0, r
    family.sites["n"] = d
    assert family.digest("a") == family.digest("n")
    assert json.loads(run("get", "parts", "big1m", site=d).out)["blob"] == \
        json.loads(run("get", "parts", "big1m", site=family.path("a")).out)["blob"]
    assert run("fsck", site=d).code == 0
    # the new member then exchanges as usual
    assert run("put", "parts", "after", "2", site=d).code == 0
    usb2 = tmp_path / "usb2"
    assert run("export", "--to", "a", "--create-out", "--out", usb2, "--max-size", "64K",
               site=d).code == 0
    assert run("import", usb2, site=family.path("a")).code == 0
    assert family.digest("a") == family.digest("n")


def test_lspacket_shows_a_record_piece(family, tmp_path):
    _d, files = _snapshot_for_new_site(family, tmp_path)
    f, (off, total) = _pieces(files)[1]
    r = run("lspacket", f, json_mode=True)
    assert r.code == 0, r
    assert r.json["packets"][0]["piece"] == [off, total] and off > 0
    assert f"piece at {off} of a record of {total} bytes" in run("lspacket", f).out


def _refused_and_not_joined(d: Path, files) -> str:
    r = run("mkreplica", "import", *files, site=d)
    assert r.code != 0 and "Traceback" not in r.err, r
    assert run("status", site=d).code != 0 or "fam" not in run("status", site=d).out
    return r.err


def test_a_missing_piece_is_refused_and_nothing_applies(family, tmp_path):
    d, files = _snapshot_for_new_site(family, tmp_path)
    missing = _pieces(files)[2][0]
    _refused_and_not_joined(d, [f for f in files if f != missing])
    # with every part, the same site joins
    assert run("mkreplica", "import", *files, site=d).code == 0


def test_a_duplicated_piece_is_refused(family, tmp_path):
    d, files = _snapshot_for_new_site(family, tmp_path)
    extra = tmp_path / "copy"
    extra.mkdir()
    dup = _pieces(files)[1][0]
    shutil.copy(dup, extra / dup.name)
    _refused_and_not_joined(d, [*files, extra / dup.name])


def test_pieces_signed_with_a_lying_total_are_refused(family, tmp_path, monkeypatch):
    """A sender whose pieces do not tile the record (a total too large): the snapshot is
    refused, the site stays unjoined."""
    from syncpack.exchange import packets, replica
    real = packets.record_pieces

    def short(template, max_size, n, sealed):
        spans = real(template, max_size, n, sealed)
        return spans[:-1]       # the last piece never written: the record stops short

    monkeypatch.setattr(packets, "record_pieces", short)
    from syncpack.site import Site
    family.init("a")
    a = family.path("a")
    _put_big(a, "big300k", 300_000, tmp_path)
    d = tmp_path / "n"
    s, pub = Site.keygen(d, "n")
    s.close()
    usb = tmp_path / "usb"
    usb.mkdir()
    with family.open("a") as src:
        replica.mkreplica_export(src, "n", pub, usb, max_size=64 * 1024)
    err = _refused_and_not_joined(d, sorted(usb.rglob("*.spk")))
    assert "piece" in err


def test_resync_at_64k_with_a_record_larger_than_a_packet(family, tmp_path):
    family.init("a")
    family.add("b", via="a")
    a, b = family.path("a"), family.path("b")
    _put_big(a, "big300k", 300_000, tmp_path)
    assert run("put", "parts", "small", "1", site=a).code == 0
    usb = tmp_path / "usb"
    r = run("resync", "--to", "b", "--create-out", "--out", usb, "--max-size", "64K", site=a)
    assert r.code == 0, r
    files = sorted(usb.rglob("*.spk"))
    assert len(_pieces(files)) >= 5 and all(f.stat().st_size <= 64 * 1024 for f in files)
    # a part missing: refused, nothing applied
    before = family.digest("b")
    r = run("import", *files[:-2], files[-1], site=b)
    assert "Traceback" not in r.err and family.digest("b") == before
    r = run("import", *reversed(files), site=b)
    assert r.code == 0, r
    assert family.digest("a") == family.digest("b")
    assert run("fsck", site=b).code == 0


def test_sealed_snapshot_with_record_pieces(family, tmp_path):
    family.init("a")
    a = family.path("a")
    _put_big(a, "big300k", 300_000, tmp_path)
    d = tmp_path / "n"
    k = run("keygen", d, "--site", "n", json_mode=True)
    usb = tmp_path / "usb"
    e = run("mkreplica", "export", "--site", "n", "--pubkey", k.json["public_key"],
            "--create-out", "--out", usb, "--max-size", "64K", "--encrypt", site=a)
    assert e.code == 0, e
    files = sorted(usb.rglob("*.spk"))
    assert _pieces(files) and all(f.stat().st_size <= 64 * 1024 for f in files)
    shown = run("lspacket", _pieces(files)[0][0], json_mode=True).json["packets"][0]
    assert shown["sealed"] is True and shown["piece"][0] == 0
    assert run("mkreplica", "import", *reversed(files), site=d).code == 0
    family.sites["n"] = d
    assert family.digest("a") == family.digest("n")


def test_parts_of_two_snapshots_mixed_are_refused_with_what_to_do(family, tmp_path):
    """The parts of two resync snapshots mixed on one medium: refused, nothing applied, and
    each rejected entry says what to do (its 'hint' was missing from the JSON and the text)."""
    family.init("a")
    family.add("b", via="a")
    a, b = family.path("a"), family.path("b")
    records = tmp_path / "r.jsonl"
    records.write_text("".join(json.dumps({"collection": "parts", "key": f"k{i}",
                                           "value": os.urandom(150).hex()}) + "\n"
                               for i in range(1500)))
    assert run("load", records, site=a).code == 0
    snaps = []
    for n in range(2):
        out = tmp_path / f"snap{n}"
        assert run("put", "parts", f"after{n}", "1", site=a).code == 0
        assert run("resync", "--to", "b", "--create-out", "--out", out, "--max-size", "64K",
                   site=a).code == 0
        snaps.append(sorted(out.rglob("*.spk")))
    assert len(snaps[0]) >= 3 and len(snaps[1]) == len(snaps[0])
    mixed = [*snaps[0][:1], snaps[1][1], *snaps[0][2:]]
    before = family.digest("b")
    r = run("import", *mixed, site=b, json_mode=True)
    assert r.code == 1 and family.digest("b") == before, r
    assert r.json["rejected"] and all(
        "different snapshots" in x["error"] and "every part of one snapshot" in x["hint"]
        for x in r.json["rejected"]), r.json["rejected"]
    r = run("import", *mixed, site=b)
    assert "hint: import every part of one snapshot together" in r.err, r
