"""tools/bench runs end to end at a tiny size and reports every figure (no timing assertions)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "tools" / "bench"


def test_bench_smoke(tmp_path):
    r = subprocess.run([sys.executable, str(BENCH), "--ops", "2000", "--peers", "2",
                        "--big-gb", "0", "--json", "--dir", str(tmp_path)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["workload"]["ops"] == 2000
    assert res["workload"]["value_bytes"] == 102
    for k in ("seconds", "ops_per_s"):
        assert res["load"][k] > 0
    e = res["export"]
    assert e["ops"] == 2000 and e["packets"] == 1
    for k in ("seconds", "ops_per_s", "mb_per_s", "packet_bytes", "bytes_per_op"):
        assert e[k] > 0, k
    assert res["import"]["ops"] == 2000
    for k in ("seconds", "ops_per_s"):
        assert res["import"][k] > 0, k
    b = res["sqlite_session"]
    assert b["rows"] == 2000
    for k in ("changeset_bytes", "patchset_bytes", "changeset_zstd3_bytes",
              "patchset_zstd3_bytes", "apply_s", "apply_rows_per_s", "insert_with_session_s"):
        assert b[k] > 0, k
    for k in ("import_vs_changeset_apply", "packet_vs_patchset_zstd3",
              "packet_vs_changeset_zstd3", "packet_vs_patchset_raw"):
        assert res["ratios"][k] > 0, k
    assert res["big"]["skipped"] is True
    rl = res["relay"]
    assert rl["peers"] == 2 and rl["packets"] == 2
    assert rl["ops_total"] == 2 * (2000 + 500)
    assert rl["relayed_ops_per_peer"] == 500
    for k in ("seconds", "ops_per_s", "bytes_total", "mb_per_s"):
        assert rl[k] > 0, k
    t = res["targets"]
    assert set(t) == {"export_ops_per_s", "import_ops_per_s", "import_vs_changeset_apply",
                      "packet_vs_patchset_zstd3", "big_export_peak_rss_mb",
                      "big_import_peak_rss_mb"}
    for k, v in t.items():
        assert {"target", "limit", "value", "met"} <= set(v), k
        if k.startswith("big_"):
            assert v["met"] is None
        else:
            assert isinstance(v["met"], bool), k
    assert list(tmp_path.iterdir()) == []       # the temporary sites are removed


def test_bench_driver_smoke(tmp_path):
    """tools/bench_driver.py measures both drivers and the changeset apply at a tiny size."""
    tool = BENCH.parent / "bench_driver.py"
    r = subprocess.run([sys.executable, str(tool), "--ops", "3000", "--txn-ops", "1000",
                        "--runs", "2", "--json", "--dir", str(tmp_path)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert (res["ops"], res["txn_ops"], res["runs"]) == (3000, 1000, 2)
    for name in ("changeset_apply", "sqlite3", "apsw"):
        for k in ("wall_s", "cpu_s", "ops_per_s"):
            assert res["median"][name][k] > 0, (name, k)
    for name in ("sqlite3", "apsw"):
        assert set(res["ratio_to_changeset_apply"][name]) == {"wall", "cpu"}
    assert len(res["rounds"]) == 2
    assert list(tmp_path.iterdir()) == []       # the temporary databases are removed


def test_bench_cli_smoke(tmp_path):
    """tools/bench_cli.py runs end to end through the command at a tiny size, relay and
    big-packet RSS included (no timing assertions)."""
    tool = BENCH.parent / "bench_cli.py"
    r = subprocess.run([sys.executable, str(tool), "--bulk-ops", "2000", "--small-ops", "200",
                        "--peers", "2", "--big-gb", "0.01", "--json", "--dir", str(tmp_path)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert set(res["ratios"]) == {"load_vs_plain_sqlite", "api_txn_vs_plain_sqlite",
                                  "bulk_import_vs_apply", "bulk_export_vs_apply",
                                  "bulk_packet_vs_patchset_zstd3", "small_import_vs_apply"}
    assert all(v > 0 for v in res["ratios"].values())
    b = res["bulk"]
    assert b["relay_peers"] == 2 and 2 * 2000 <= b["relay_ops"] <= 2 * 2000 + 2
    assert res["relay_ops_per_s"] > 0
    [g] = res["big"]
    assert g["packets"] == 1 and g["ops"] >= 1000
    for what in ("export", "import"):
        assert g[what]["peak_rss_mb"] > g["idle_peak_rss_mb"] > 0, what
    assert_machine_told(res["machine"])
    assert list(tmp_path.iterdir()) == []       # the temporary sites are removed


def assert_machine_told(m: dict) -> None:
    """How loaded the machine was is reported beside the figures (tools/machine.py)."""
    assert m["cpus"] >= 1 and len(m["load_average"]) == 2 and m["seconds"] > 0
    assert len(m["calibration_ms"]) == 2 and min(m["calibration_ms"]) > 0
    if Path("/proc/stat").exists():
        assert 0 <= m["others_cpu_share"] <= 1 and 0 <= m["steal_share"] <= 1


def test_bench_attach_smoke(tmp_path):
    """tools/bench_attach.py runs end to end at a tiny size and reports every figure."""
    tool = BENCH.parent / "bench_attach.py"
    r = subprocess.run([sys.executable, str(tool), "--rows", "2000", "--bulk", "1000",
                        "--single", "20", "--repeat", "1", "--json", "--dir", str(tmp_path)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    for kind in ("bulk", "single"):
        assert res["app_writes"][kind]["ratio"] > 0
    p = res["pipeline"]
    assert p["rows"] == 2000
    for k in ("capture_s", "capture_rows_per_s", "import_s", "changeset_apply_s",
              "import_vs_changeset_apply", "capture_rss_mb", "import_rss_mb"):
        assert p[k] > 0, k
    assert set(res["targets"]) == {"bulk_write_ratio", "single_write_ratio",
                                   "capture_rows_per_s", "import_vs_changeset_apply"}
    assert_machine_told(res["machine"])
    assert list(tmp_path.iterdir()) == []


def test_bench_attach_schema_smoke():
    """tools/bench_attach_schema.py runs end to end at a tiny size and reports every figure."""
    tool = BENCH.parent / "bench_attach_schema.py"
    r = subprocess.run([sys.executable, str(tool), "--tables", "2", "--repeat", "3"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["tables"] == 2
    for k in ("capture_ms_with_review", "capture_ms_without_review", "ratio"):
        assert res[k] > 0, k
