"""Transcripts of what an administrator meets: values from stdin and as text, values the API
refuses, outboxes that must exist, import summaries that count everything, papercuts."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

import syncpack
from conftest import run
from syncpack.errors import InvalidValueError, SiteClosedError, SyncpackError
from syncpack.site import Site


@pytest.fixture
def a(tmp_path) -> Path:
    p = tmp_path / "a"
    assert run("init", p, "--family", "parts", "--site", "a").code == 0
    return p


def state(site: Path) -> tuple:
    d = run("digest", site=site, json_mode=True).json
    return d["digest"], d["vector"]


# --- values -----------------------------------------------------------------------------------

def test_put_dash_reads_a_10_mb_value_from_stdin(a):
    big = {"blob": "x" * (10 * 1024 * 1024), "n": 1}
    r = run("put", "parts", "big", "-", site=a, input=json.dumps(big))
    assert r.code == 0, r
    r = run("get", "parts", "big", site=a, json_mode=True)
    assert r.code == 0 and r.json["value"] == big


def test_put_dash_with_bad_json_on_stdin_is_a_usage_error(a):
    before = state(a)
    r = run("put", "parts", "k", "-", site=a, input="{not json")
    assert r.code == 2 and "not valid JSON" in r.err, r
    assert state(a) == before


def test_get_and_ls_show_utf8_as_text(a):
    v = {"name": "Schraube M6 – Zürich", "jp": "ボルト"}
    assert run("put", "parts", "ü-1", json.dumps(v), site=a).code == 0
    r = run("get", "parts", "ü-1", site=a)
    assert r.code == 0 and "Zürich" in r.out and "ボルト" in r.out and "\\u" not in r.out, r
    r = run("ls", "parts", site=a)
    assert r.code == 0 and "ü-1\t" in r.out and "ボルト" in r.out and "\\u" not in r.out, r


class Thing:
    pass


NOT_JSON = [
    pytest.param("parts", "k", b"raw", id="bytes"),
    pytest.param("parts", "k", {"x": [1, b"raw"]}, id="nested-bytes"),
    pytest.param("parts", "k", math.nan, id="nan"),
    pytest.param("parts", "k", {"x": math.inf}, id="inf"),
    pytest.param("parts", "k", [-math.inf], id="minus-inf"),
    pytest.param("parts", "k", {1: "one"}, id="int-key"),
    pytest.param("parts", "k", {"a": {(1, 2): "t"}}, id="tuple-key"),
    pytest.param("parts", "k", Thing(), id="object"),
    pytest.param("parts", "k", {1, 2}, id="set"),
    pytest.param("parts", "k", "\ud800", id="lone-surrogate"),
    pytest.param("parts", "k", 2 ** 70, id="huge-int"),
    pytest.param("parts", 7, "v", id="int-key-name"),
    pytest.param(b"parts", "k", "v", id="bytes-collection"),
    pytest.param(None, "k", "v", id="none-collection"),
]


@pytest.mark.parametrize("coll,key,value", NOT_JSON)
def test_api_refuses_values_that_are_not_json_and_changes_nothing(a, coll, key, value):
    assert run("put", "parts", "before", '{"ok": true}', site=a).code == 0
    before = state(a)
    site = syncpack.open_site(a)
    try:
        with pytest.raises(SyncpackError) as e:
            with site.transaction() as tx:
                tx.put("parts", "fine", {"would": "be rolled back too"})
                tx.put(coll, key, value)
        assert e.value.exit_code == 1 and e.value.message
    finally:
        site.close()
    assert state(a) == before
    r = run("ls", site=a)
    assert r.code == 0 and "before" in r.out and "fine" not in r.out, r
    assert run("fsck", site=a).code == 0


def test_a_self_containing_value_is_refused(a):
    loop: list = []
    loop.append(loop)
    with syncpack.open_site(a) as site:
        with pytest.raises(InvalidValueError):
            with site.transaction() as tx:
                tx.put("parts", "loop", loop)


def test_json_values_of_every_kind_are_accepted(a):
    v = {"s": "ü", "i": -3, "f": 1.5, "b": True, "n": None, "l": [1, [2, {"x": []}]],
         "t": (1, 2)}
    with syncpack.open_site(a) as site:
        with site.transaction() as tx:
            tx.put("parts", "all", v)
        assert site.get("parts", "all") == {**v, "t": [1, 2]}


def test_cli_refuses_nan_from_put_and_load(a, tmp_path):
    before = state(a)
    r = run("put", "parts", "k", "NaN", site=a)
    assert r.code == 1 and "error: " in r.err and "hint: " in r.err, r
    f = tmp_path / "nan.jsonl"
    f.write_text('{"collection": "parts", "key": "ok", "value": 1}\n'
                 '{"collection": "parts", "key": "bad", "value": Infinity}\n')
    r = run("load", f, site=a)
    assert r.code == 1 and "line 2" in r.err, r
    assert state(a) == before


def test_a_closed_site_says_so(a):
    site = syncpack.open_site(a)
    site.close()
    site.close()                    # closing twice is harmless
    for use in (lambda: site.get("parts", "x"), lambda: site.vector(),
                lambda: list(site.records()), lambda: site.transaction().__enter__()):
        with pytest.raises(SiteClosedError) as e:
            use()
        assert "closed" in e.value.message and e.value.hint and e.value.exit_code == 1
    with Site.open(a) as again:     # the directory itself is fine
        assert again.name == "a"
