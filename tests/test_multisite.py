"""The ClearCase MultiSite example (``lsepoch`` / ``syncreplica -export``), as a CLI transcript.

In the MultiSite manual, boston_hub holds 950 of its own ops and 504 of sanfran_hub's, and it
believes sanfran_hub holds 791 of boston's.  sanfran_hub holds 702 of its own.  An export from
boston to sanfran then carries exactly boston's ops 792-950 and nothing of sanfran's own.

The epoch offset: syncpack keeps membership as replicated ops, so boston_hub's own history starts
with ops the user never typed.  ``init`` writes 2 ops at boston (the ``$family`` settings record
and boston's ``$roster`` entry) and ``mkreplica export`` of sanfran_hub writes 1 more (sanfran's
``$roster`` entry).  Boston's user op number ``n`` therefore has epoch ``n + 3``: "boston ops
792-950" is the range (794, 953].  sanfran_hub was created by a snapshot and writes no
membership op of its own, so its user op ``n`` is epoch ``n``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from conftest import run

from syncpack.format import blocks
from syncpack.format import codec
from syncpack.site import Site
from syncpack.exchange.sync import open_packet

B = 3   # boston's membership ops, before any user op (see the module docstring)
S = 0   # sanfran's


def load(site: Path, prefix: str, first: int, last: int, tmp: Path) -> None:
    """User ops ``first..last`` at ``site``: one JSON-lines file, one ``load`` (one transaction)."""
    f = tmp / f"{site.name}-{prefix}{first}-{last}.jsonl"
    with open(f, "w") as out:
        for i in range(first, last + 1):
            out.write(json.dumps({"collection": "parts", "key": f"{prefix}{i:04d}",
                                  "value": {"n": i, "by": prefix}}) + "\n")
    r = run("load", f, site=site, json_mode=True)
    assert r.code == 0, r
    assert r.json["loaded"] == last - first + 1


def export(site: Path, out: Path, *to: str) -> list[dict]:
    args = ["export", "--create-out", "--out", out]
    for t in to:
        args += ["--to", t]
    if not to:
        args.append("--all")
    r = run(*args, site=site, json_mode=True)
    assert r.code == 0, r
    return r.json["packets"]


def import_(site: Path, *paths) -> dict:
    r = run("import", *paths, site=site, json_mode=True)
    assert r.code == 0, r
    assert r.json["rejected"] == [] and r.json["parked"] == []
    return r.json


def lsepoch(site: Path) -> dict:
    r = run("lsepoch", site=site, json_mode=True)
    assert r.code == 0, r
    return r.json


def digest(site: Path) -> dict:
    """``digest --json``, with the vector's zero entries dropped (a site lists its own origin
    at 0 before its first write; the other sites do not list it at all)."""
    r = run("digest", site=site, json_mode=True)
    assert r.code == 0, r
    d = r.json
    d["vector"] = {o: e for o, e in d["vector"].items() if e}
    return d


def keys_in(path: str) -> list[tuple[str, int, str]]:
    """(origin id hex, epoch, key) of every op in a packet, in the order carried."""
    pk = open_packet(Path(path))
    try:
        return [(op.origin.hex(), op.epoch, op.key) for op in blocks.packet_ops(pk.f, pk.env)]
    finally:
        pk.close()


def add_site(tmp: Path, via: Path, name: str, medium: Path) -> Path:
    d = tmp / name
    k = run("keygen", d, "--site", name, json_mode=True)
    assert k.code == 0, k
    e = run("mkreplica", "export", "--site", name, "--pubkey", k.json["public_key"],
            "--create-out", "--out", medium, site=via, json_mode=True)
    assert e.code == 0, e
    assert run("mkreplica", "import", medium, site=d).code == 0
    return d


def build_multisite_state(tmp: Path) -> tuple[Path, Path]:
    """boston_hub: 950 own ops, 504 of sanfran's; sanfran_hub: 702 own ops, 791 of boston's."""
    boston = tmp / "boston"
    assert run("init", boston, "--family", "parts", "--site", "boston_hub").code == 0
    sanfran = add_site(tmp, boston, "sanfran_hub", tmp / "m0")

    load(sanfran, "s", 1, 504, tmp)
    p = export(sanfran, tmp / "m1", "boston_hub")
    assert [x["ranges"] for x in p] == [{"sanfran_hub": [0, 504 + S]}]
    import_(boston, tmp / "m1")

    load(boston, "b", 1, 791, tmp)
    p = export(boston, tmp / "m2", "sanfran_hub")
    assert [x["ranges"] for x in p] == [{"boston_hub": [B, 791 + B]}]
    import_(sanfran, tmp / "m2")

    load(sanfran, "s", 505, 702, tmp)
    load(boston, "b", 792, 950, tmp)
    return boston, sanfran


def test_export_holds_exactly_the_ops_sanfran_lacks(tmp_path):
    boston, sanfran = build_multisite_state(tmp_path)

    # The epoch matrix of the manual's example, offset by boston's 3 membership ops.
    eb = lsepoch(boston)
    assert eb["vector"] == {"boston_hub": 950 + B, "sanfran_hub": 504 + S}
    assert eb["peers"]["sanfran_hub"]["sent"]["boston_hub"] == 791 + B
    assert lsepoch(sanfran)["vector"] == {"boston_hub": 791 + B, "sanfran_hub": 702 + S}

    packets = export(boston, tmp_path / "usb", "sanfran_hub")
    assert len(packets) == 1
    pk = packets[0]
    assert pk["to"] == "sanfran_hub"
    assert pk["ops"] == 950 - 792 + 1 == 159
    # boston ops 792-950, and no range at all for sanfran_hub's own origin.
    assert pk["ranges"] == {"boston_hub": [791 + B, 950 + B]}
    assert re.fullmatch(r".*/usb/sanfran_hub/boston_hub/\d{10}-0000\.spk", pk["path"]), pk
    assert Path(pk["path"]).stat().st_size == pk["bytes"]

    # lspacket says the same, with and without a site to check the signature against.
    ls = run("lspacket", tmp_path / "usb", site=boston, json_mode=True)
    assert ls.code == 0, ls
    [d] = ls.json["packets"]
    assert (d["from"], d["to"], d["ops"], d["ranges"], d["signature"]) == (
        "boston_hub", "sanfran_hub", 159, {"boston_hub": [794, 953]}, "valid")
    ls_s = run("lspacket", pk["path"], site=sanfran, json_mode=True)
    assert ls_s.json["packets"][0]["signature"] == "valid"
    assert ls_s.json["packets"][0]["family_id"] == d["family_id"]

    # The body carries exactly the user's ops b0792..b0950, epochs 795..953, in order.
    carried = keys_in(pk["path"])
    assert [k for _o, _e, k in carried] == [f"b{i:04d}" for i in range(792, 951)]
    assert [e for _o, e, _k in carried] == list(range(792 + B, 951 + B))
    with Site.open(boston) as s:
        assert {o for o, _e, _k in carried} == {s.site_id.hex()}

    r = import_(sanfran, tmp_path / "usb")
    assert r["ops_applied"] == 159
    assert lsepoch(sanfran)["vector"] == {"boston_hub": 953, "sanfran_hub": 702}
    assert json.loads(run("get", "parts", "b0950", site=sanfran).out) == {"n": 950, "by": "b"}

    # The way back carries sanfran ops 505-702 and none of boston's own.
    back = export(sanfran, tmp_path / "back", "boston_hub")
    assert [(p["ops"], p["ranges"]) for p in back] == [(198, {"sanfran_hub": [504, 702]})]
    import_(boston, tmp_path / "back")
    db, ds = digest(boston), digest(sanfran)
    assert db == ds
    assert db["records"] == 950 + 702
    assert db["vector"] == {"boston_hub": 953, "sanfran_hub": 702}

    # Nothing is left to send: at most an acknowledgement packet without ops.
    again = export(boston, tmp_path / "again", "sanfran_hub")
    assert all(p["ops"] == 0 and p["ranges"] == {} for p in again), again
    for site in (boston, sanfran):
        assert run("fsck", site=site).code == 0


def test_boston_relays_sanfran_ops_to_bangalore(tmp_path):
    boston, sanfran = build_multisite_state(tmp_path)
    import_(sanfran, *[p["path"] for p in export(boston, tmp_path / "u1", "sanfran_hub")])
    import_(boston, *[p["path"] for p in export(sanfran, tmp_path / "u2", "boston_hub")])

    # bangalore joins through boston: one more $roster op at boston (epoch 954).  Its snapshot
    # carries everything boston holds: boston 1-954, sanfran 1-702.
    bangalore = add_site(tmp_path, boston, "bangalore", tmp_path / "m9")
    assert lsepoch(bangalore)["vector"] == {"boston_hub": 954, "sanfran_hub": 702, "bangalore": 0}

    # sanfran, which has not heard of bangalore yet, keeps working and talks only to boston.
    load(sanfran, "s", 703, 760, tmp_path)
    assert "bangalore" not in lsepoch(sanfran)["peers"]
    p = export(sanfran, tmp_path / "u3", "boston_hub")
    assert [x["ranges"] for x in p] == [{"sanfran_hub": [702, 760]}]
    import_(boston, tmp_path / "u3")
    load(boston, "b", 951, 960, tmp_path)          # epochs 955..964

    # One export to every member: sanfran gets boston's ops (with bangalore's roster entry),
    # bangalore gets boston's new ops and sanfran's relayed ones.
    out = tmp_path / "hub"
    by_peer = {p["to"]: p for p in export(boston, out)}
    assert set(by_peer) == {"sanfran_hub", "bangalore"}
    assert by_peer["sanfran_hub"]["ranges"] == {"boston_hub": [953, 964]}
    assert by_peer["bangalore"]["ranges"] == {"boston_hub": [954, 964],
                                              "sanfran_hub": [702, 760]}
    assert by_peer["bangalore"]["ops"] == 10 + 58
    ls = run("lspacket", by_peer["bangalore"]["path"], site=bangalore, json_mode=True)
    assert ls.code == 0, ls
    assert ls.json["packets"][0]["from"] == "boston_hub"
    assert ls.json["packets"][0]["signature"] == "valid"

    # Each site imports the whole medium; the other's packet is left alone.
    rb = run("import", out, site=bangalore, json_mode=True)
    assert rb.code == 0, rb
    assert rb.json["ops_applied"] == 68 and rb.json["rejected"] == []
    assert rb.json["applied"] == [by_peer["bangalore"]["path"]]
    assert json.loads(run("get", "parts", "s0760", site=bangalore).out) == {"n": 760, "by": "s"}
    rs = run("import", out, site=sanfran, json_mode=True)
    assert rs.code == 0 and rs.json["applied"] == [by_peer["sanfran_hub"]["path"]], rs
    assert Path(by_peer["bangalore"]["path"]).exists()
    assert digest(bangalore) == digest(boston) == digest(sanfran)

    # sanfran now knows bangalore from the relayed roster op, but only the state bangalore was
    # created with, so it sends sanfran 703-760 (and boston 955-964) again by the direct route.
    # Those ops arrived by the relay already: the second route changes nothing.
    assert "bangalore" in lsepoch(sanfran)["peers"]
    before = digest(bangalore)
    direct = export(sanfran, tmp_path / "direct", "bangalore")
    assert [p["ranges"] for p in direct] == [{"sanfran_hub": [702, 760],
                                              "boston_hub": [954, 964]}]
    r = import_(bangalore, tmp_path / "direct")
    assert r["ops_applied"] == 0 and len(r["applied"]) == 1
    assert digest(bangalore) == before

    # And from here on nobody resends it: bangalore's acknowledgement reaches sanfran.
    import_(sanfran, *[p["path"] for p in export(bangalore, tmp_path / "ack", "sanfran_hub")])
    again = export(sanfran, tmp_path / "again", "bangalore")
    assert all(p["ops"] == 0 for p in again), again
    for site in (boston, sanfran, bangalore):
        assert run("fsck", site=site).code == 0
