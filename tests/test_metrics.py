"""``syncpack status --format prometheus``: the text exposition format, read back by the
Prometheus project's own parser (``prometheus_client``), directly from the renderer and through
the command line on a real family."""

from __future__ import annotations

import re
from pathlib import Path
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from syncpack.admin import metrics

from syncpack.site import Site
from conftest import run


def parse(text: str) -> dict[str, list]:
    """name -> [(labels, value)], through the reference parser (raises on malformed text)."""
    out: dict[str, list] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def status_doc(site="boston", peers=None, state="normal", parked=0, conflicts=0, ops=10,
               forks=None):
    return {"site": site, "family": "fam", "state": state, "conflicts": conflicts,
            "changelog_ops": ops, "parked": [{"seq": i} for i in range(parked)],
            "peers": peers if peers is not None else {},
            "forks": forks if forks is not None else [{"origin": "chicago", "epoch": 7,
                                                       "state": "open"}]}


# --- the renderer -----------------------------------------------------------------------------

def test_every_family_has_help_and_type_before_its_samples():
    doc = status_doc(peers={"sanfran": {"lag_ops": 3, "unacknowledged_ops": 5,
                                        "last_received_ms": 1_700_000_000_250,
                                        "last_sent_ms": None}})
    doc["attached"] = {"database": "/srv/shop.db",
                       "tables": [{"table": "orders", "rows": 5, "pending": 2}]}
    text = metrics.render(doc, metrics.BatchRound(1_700_000_100.5, 2.25, True, 0,
                                                  {"applied": 2}, 1_700_000_100.5))
    assert text.endswith("\n") and not text.endswith("\n\n")
    lines = text.splitlines()
    seen: list[str] = []
    for i, line in enumerate(lines):
        if line.startswith("# HELP "):
            name = line.split()[2]
            assert lines[i + 1].startswith(f"# TYPE {name} gauge"), lines[i + 1]
            assert name not in seen, f"{name} declared twice"
            seen.append(name)
        elif not line.startswith("#"):
            name = re.match(r"[a-z_]+", line)[0]
            assert name == seen[-1], f"sample of {name} outside its family: {line}"
            assert re.fullmatch(r"syncpack_[a-z_]+", name)
            assert 'site="boston"' in line
    assert seen == [n for n, _, _ in metrics.FAMILIES]    # every family, in table order
    got = parse(text)
    assert got["syncpack_forks_open"] == [({"site": "boston"}, 1.0)]
    assert got["syncpack_fork"] == [({"site": "boston", "origin": "chicago", "epoch": "7",
                                      "state": "open"}, 1.0)]
    assert got["syncpack_peer_lag_ops"] == [({"site": "boston", "peer": "sanfran"}, 3.0)]
    assert got["syncpack_attached_pending_changes"] == [({"site": "boston", "table": "orders"},
                                                         2.0)]
    assert got["syncpack_peer_unacked_ops"][0][1] == 5.0
    assert got["syncpack_peer_last_packet_received_timestamp_seconds"][0][1] == 1_700_000_000.25
    assert got["syncpack_peer_last_packet_sent_timestamp_seconds"][0][1] == 0   # never
    assert got["syncpack_changelog_ops"] == [({"site": "boston"}, 10.0)]
    assert got["syncpack_batch_last_run_duration_seconds"][0][1] == 2.25
    packets = {lab["result"]: v for lab, v in got["syncpack_batch_last_run_packets"]}
    assert packets == {r: (2.0 if r == "applied" else 0.0) for r in metrics.PACKET_RESULTS}


def test_label_values_are_escaped():
    odd = 'bo"s\\to\nn'          # a quote, a backslash, a line feed
    peer = 'p"e\\er'
    doc = status_doc(site=odd, peers={peer: {"lag_ops": 1, "unacknowledged_ops": 0}})
    text = metrics.render(doc)
    assert '{site="bo\\"s\\\\to\\nn",peer="p\\"e\\\\er"}' in text
    assert len([ln for ln in text.splitlines() if ln.startswith("syncpack_peer_lag_ops")]) == 1
    got = parse(text)
    assert got["syncpack_peer_lag_ops"] == [({"site": odd, "peer": peer}, 1.0)]
    assert got["syncpack_site_info"] == [({"site": odd, "family": "fam"}, 1.0)]


def test_flags_and_counts():
    got = parse(metrics.render(status_doc(state="recovering", parked=2, conflicts=4)))
    assert got["syncpack_recovering"][0][1] == 1
    assert got["syncpack_parked_packets"][0][1] == 2
    assert got["syncpack_conflicts"][0][1] == 4
    assert parse(metrics.render(status_doc()))["syncpack_recovering"][0][1] == 0


def test_families_without_samples_are_left_out():
    text = metrics.render(status_doc())                   # no peers, no batch round
    assert "syncpack_peer_" not in text and "syncpack_batch_" not in text
    assert "syncpack_changelog_ops" in text
    # A batch round that could not read the store: the info and batch metrics only.
    text = metrics.render({"site": "boston", "family": "fam"},
                          metrics.BatchRound(1.0, 0.5, False, 1))
    assert set(parse(text)) == {"syncpack_site_info", "syncpack_batch_last_run_timestamp_seconds",
                                "syncpack_batch_last_run_ok",
                                "syncpack_batch_last_run_duration_seconds",
                                "syncpack_batch_last_run_failed_actions",
                                "syncpack_batch_last_run_packets"}


def test_value_formatting():
    assert metrics.format_value(True) == "1" and metrics.format_value(0) == "0"
    assert metrics.format_value(1795407890.956) == "1795407890.956"
    assert metrics.format_value(float("nan")) == "NaN"
    assert metrics.format_value(float("inf")) == "+Inf"
    assert metrics.format_value(float("-inf")) == "-Inf"


def test_previous_value_reads_back_what_render_wrote():
    name = "syncpack_batch_last_success_timestamp_seconds"
    text = metrics.render(status_doc(site='a"b'),
                          metrics.BatchRound(5.0, 1.0, True, 0, {}, 1234.5))
    assert metrics.previous_value(text, name, 'a"b') == 1234.5
    assert metrics.previous_value(text, name, "a") is None      # another site's series
    assert metrics.previous_value(text, "syncpack_nothing", 'a"b') is None
    assert metrics.previous_value("", name, "a") is None
    assert metrics.previous_value(f'{name}{{site="a"}} garbage\n', name, "a") is None
    assert metrics.previous_value(f'{name}{{site="a"}} NaN\n', name, "a") is None


# --- through the command line -----------------------------------------------------------------

@pytest.fixture
def synced(family):
    family.init("boston")
    family.add("sanfran", via="boston")
    family.add("bangalore", via="boston")
    family.put("boston", "parts", "p1", {"qty": 1})
    family.put("boston", "parts", "p2", {"qty": 2})
    return family


def prom(family, name: str) -> dict[str, list]:
    r = run("status", "--format", "prometheus", site=family.path(name))
    assert r.code == 0 and r.err == "", r
    return parse(r.out)


def per_peer(got: dict, metric: str) -> dict[str, float]:
    return {lab["peer"]: v for lab, v in got[metric]}


def test_status_prometheus_matches_status_json(synced, tmp_path):
    fam = synced
    before = time.time()
    fam.sync("boston", "sanfran")
    fam.sync("sanfran", "boston")                         # boston hears back from sanfran
    after = time.time()
    fam.put("boston", "parts", "p3", {"qty": 3})

    doc = run("status", site=fam.path("boston"), json_mode=True).json
    got = prom(fam, "boston")
    assert got["syncpack_site_info"] == [({"site": "boston", "family": "fam"}, 1.0)]
    assert per_peer(got, "syncpack_peer_lag_ops") == {
        p: d["lag_ops"] for p, d in doc["peers"].items()}
    assert per_peer(got, "syncpack_peer_unacked_ops") == {
        p: d["unacknowledged_ops"] for p, d in doc["peers"].items()}
    assert per_peer(got, "syncpack_peer_lag_ops")["sanfran"] == 1     # p3
    assert per_peer(got, "syncpack_peer_lag_ops")["bangalore"] > 1
    assert got["syncpack_changelog_ops"][0][1] == doc["changelog_ops"] > 0
    assert got["syncpack_recovering"][0][1] == 0

    received = per_peer(got, "syncpack_peer_last_packet_received_timestamp_seconds")
    sent = per_peer(got, "syncpack_peer_last_packet_sent_timestamp_seconds")
    assert before - 1 <= received["sanfran"] <= after + 1
    assert received["bangalore"] == 0                     # never heard from bangalore
    assert before - 1 <= sent["sanfran"] <= after + 1
    assert sent["bangalore"] > 0                          # its replica-creation snapshot
    assert doc["peers"]["sanfran"]["last_received_ms"] == int(received["sanfran"] * 1000)
    assert doc["peers"]["bangalore"]["last_received_ms"] is None


def test_status_formats_and_the_json_flag(synced):
    site = synced.path("boston")
    as_flag = run("status", site=site, json_mode=True)
    as_format = run("status", "--format", "json", site=site)
    assert as_flag.code == as_format.code == 0
    assert as_format.json == as_flag.json
    for field in ("site", "state", "peers", "parked", "conflicts"):
        assert field in as_format.json
    assert as_format.json["peers"]["sanfran"]["lag_ops"] >= 2     # p1, p2 (and the roster)
    text = run("status", "--format", "text", site=site)
    assert text.code == 0 and text.out == run("status", site=site).out
    assert text.out.startswith("site boston (normal)") and "never" in text.out
    r = run("status", "--format", "prometheus", site=site, json_mode=True)
    assert r.code == 2 and "--json asks for JSON" in r.err, r
    r = run("status", "--format", "yaml", site=site)
    assert r.code == 2, r
    missing = synced.root / "nowhere"
    for args in (["--json", "status"], ["status", "--format", "json"]):
        r = run(*args, site=missing)
        assert r.code == 1 and r.err.startswith("error: "), r
        assert r.json["error"] and "hint" in r.json
    r = run("status", "--format", "prometheus", site=missing)
    assert r.code == 1 and r.out == "" and r.err.startswith("error: "), r


def test_parked_conflicts_and_recovering_show_in_metrics(synced):
    fam = synced
    first = fam.export("boston", "sanfran")               # lost in transit
    fam.put("boston", "parts", "p4", {"qty": 4})
    second = fam.export("boston", "sanfran")
    res = fam.import_("sanfran", second)
    assert res.parked and not res.applied
    got = prom(fam, "sanfran")
    assert got["syncpack_parked_packets"][0][1] == 1
    assert per_peer(got, "syncpack_peer_last_packet_received_timestamp_seconds")["boston"] > 0
    fam.import_("sanfran", first)                         # the parked one applies too
    assert prom(fam, "sanfran")["syncpack_parked_packets"][0][1] == 0

    fam.put("sanfran", "parts", "p1", {"qty": 100})       # concurrent writes to p1
    fam.put("bangalore", "parts", "p1", {"qty": 200})
    fam.sync("bangalore", "sanfran")
    assert prom(fam, "sanfran")["syncpack_conflicts"][0][1] == 1

    assert run("restore", site=fam.path("bangalore")).code == 0
    assert prom(fam, "bangalore")["syncpack_recovering"][0][1] == 1


def test_odd_family_names_stay_parseable(tmp_path):
    # Site names are safe path components; a family name is free text and becomes a label.
    odd = 'pa"rts\\ \nfleet'
    Site.init_family(tmp_path / "boston", odd, "boston").close()
    r = run("status", "--format", "prometheus", site=tmp_path / "boston")
    assert r.code == 0, r
    [(labels, value)] = parse(r.out)["syncpack_site_info"]
    assert labels == {"site": "boston", "family": odd} and value == 1.0


# --- the sample alert rules -------------------------------------------------------------------

SAMPLES = Path(__file__).resolve().parent.parent / "samples"
OPERATIONS = Path(__file__).resolve().parent.parent / "docs" / "operations.md"


def test_sample_alert_rules_use_real_metrics_and_match_the_guide():
    import yaml
    path = SAMPLES / "prometheus" / "syncpack-alerts.yml"
    text = path.read_text()
    doc = yaml.safe_load(text)
    [group] = doc["groups"]
    assert group["name"] and group["rules"]
    real = {n for n, _, _ in metrics.FAMILIES}
    for rule in group["rules"]:
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule
        assert re.fullmatch(r"[A-Z][A-Za-z]+", rule["alert"])
        used = set(re.findall(r"\bsyncpack_\w+", rule["expr"]))
        assert used <= real, (rule["alert"], used - real)
        assert used or "node_textfile_mtime_seconds" in rule["expr"]   # the file's own age
        if "for" in rule:
            assert re.fullmatch(r"\d+[smhd]", rule["for"])
        assert rule["annotations"]["summary"]
    # docs/operations.md shows the same rules (the file less its comment header).
    rules = "".join(ln + "\n" for ln in text.splitlines() if not ln.startswith("#"))
    assert f"```yaml\n{rules}```" in OPERATIONS.read_text()
