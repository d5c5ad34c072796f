"""The Spark engine on a standalone cluster whose executors cannot see the site or the medium.

A real master and worker are started here with pyspark's own ``bin/spark-class``, on loopback.
The worker runs in a mount namespace of its own with a tmpfs over the directory that holds the
sites and the medium, so its executors see an empty directory there, as an executor on another
host would: they can reach only the shared log and the staging location.  The packets must
still reach the medium, be the local engine's, and bring the peers to the hub's state.

Needs root (for ``unshare -m`` and ``mount``) and Java; skipped otherwise, saying why.
Every test here is marked ``spark``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from conftest import Family, run

from syncpack.exchange import sync

pytestmark = pytest.mark.spark
pyspark = pytest.importorskip("pyspark")

from syncpack.engine import spark_job  # noqa: E402

SEED = b"cluster comparison"
NOW = int(time.time() * 1000)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "needs root, to hide the site and the medium from the worker (unshare -m, mount)"
    if not shutil.which("unshare") or not shutil.which("nsenter"):
        return "needs util-linux's unshare and nsenter"
    if not (os.environ.get("JAVA_HOME") or shutil.which("java")):
        return "needs Java for the Spark master and worker"
    with tempfile.TemporaryDirectory() as d:
        probe = subprocess.run(["unshare", "-m", "sh", "-c", 'mount -t tmpfs tmpfs "$1"', "sh",
                                d], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"cannot make a mount namespace here: {probe.stderr.strip()}"
    return None


class Cluster:
    def __init__(self, root: Path):
        self.root = root
        self.hidden = root / "hidden"       # sites and medium: the driver's alone
        self.shared = root / "shared"       # the log and the staging location
        for d in (self.hidden, self.shared, root / "logs", self.shared / "work"):
            d.mkdir(parents=True)
        self.procs: list[subprocess.Popen] = []
        home = Path(pyspark.__file__).parent
        self.spark_class = str(home / "bin" / "spark-class")
        self.env = dict(os.environ, SPARK_HOME=str(home), SPARK_LOCAL_IP="127.0.0.1",
                        PYSPARK_PYTHON=sys.executable)
        port, self.url = _free_port(), None
        self.url = f"spark://127.0.0.1:{port}"
        self._start("master", [self.spark_class, "org.apache.spark.deploy.master.Master",
                               "--host", "127.0.0.1", "--port", str(port),
                               "--webui-port", str(_free_port())])
        self._wait_for("master", "I have been elected leader")
        worker = [self.spark_class, "org.apache.spark.deploy.worker.Worker", "--host",
                  "127.0.0.1", "--cores", "2", "--memory", "2g", "--webui-port",
                  str(_free_port()), "--work-dir", str(self.shared / "work"), self.url]
        # The tmpfs is mounted in the worker's namespace only; its executors inherit it.
        self.worker = self._start("worker", [
            "unshare", "-m", "--propagation", "private", "sh", "-c",
            f'mount -t tmpfs tmpfs "{self.hidden}" && exec "$@"', "sh", *worker])
        self._wait_for("worker", "Successfully registered with master")

    def _start(self, name: str, argv: list[str]) -> subprocess.Popen:
        log = open(self.root / "logs" / f"{name}.log", "wb")
        p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                             start_new_session=True)
        log.close()
        self.procs.append(p)
        return p

    def _wait_for(self, name: str, line: str, timeout: float = 90) -> None:
        path = self.root / "logs" / f"{name}.log"
        end = time.time() + timeout
        while time.time() < end:
            if line in path.read_text(errors="replace"):
                return
            if self.procs[-1].poll() is not None:
                break
            time.sleep(0.3)
        self.stop()
        pytest.fail(f"the Spark {name} did not start:\n{path.read_text(errors='replace')[-3000:]}")

    def worker_sees(self, path: Path) -> list[str]:
        """What the worker's mount namespace shows in ``path``."""
        r = subprocess.run(["nsenter", "-t", str(self.worker.pid), "-m", "ls", "-A", str(path)],
                           capture_output=True, text=True)
        return r.stdout.split()

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for p in self.procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        self.procs.clear()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    why = _why_not()
    if why:
        pytest.skip(why)
    if spark_job._import_pyspark()[0]._active_spark_context is not None:
        pytest.skip("another Spark session is active in this process")
    # The driver (this process) on loopback too, where the master and the worker listen.
    saved = os.environ.get("SPARK_LOCAL_IP")
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    c = Cluster(tmp_path_factory.mktemp("cluster"))
    yield c
    c.stop()
    if saved is None:
        os.environ.pop("SPARK_LOCAL_IP", None)
    else:
        os.environ["SPARK_LOCAL_IP"] = saved


def _family(root: Path) -> Family:
    """hub + two peers, with enough ops (several origins) for several packets each."""
    root.mkdir(parents=True)
    f = Family(root)
    f.init("hub")
    f.add("p1", "hub")
    f.add("p2", "hub")
    with f.open("hub") as s:
        for i in range(300):
            with s.transaction() as tx:
                for j in range(i % 3 + 1):
                    tx.put("parts", f"k{(i * 5 + j) % 200}",
                           {"i": i, "pad": os.urandom(400).hex()})
    f.put("p2", "parts", "from-p2", [2])
    f.sync("p2", "hub")
    with f.open("hub") as s:
        with s.transaction() as tx:
            for j in range(40):
                tx.put("parts", f"late{j}", j)
        with s.write_txn():
            s.seal_pending(max_block=5000)      # blocks small enough for several packets
    return f


def _copy(src: Path, dest: Path) -> Family:
    shutil.copytree(src, dest)
    f = Family(dest)
    for p in sorted(dest.iterdir()):
        if (p / "syncpack.db").exists():
            f.sites[p.name] = p
    return f


def _sent(site: Path) -> int:
    c = sqlite3.connect(site / "syncpack.db")
    try:
        return c.execute("SELECT count(*) FROM packets_out").fetchone()[0]
    finally:
        c.close()


def _shape(packets: list[dict], out: Path) -> list[tuple]:
    return [(p["to"], p["ops"], p["bytes"], json.dumps(p["ranges"], sort_keys=True), p["seq"],
             p["part"], str(Path(p["path"]).resolve().relative_to(out.resolve())))
            for p in packets]


def test_cli_export_on_a_cluster_reaches_the_medium(cluster, tmp_path, monkeypatch):
    sites = cluster.hidden / "sites"
    _family(sites)
    local = _copy(sites, tmp_path / "local")
    assert cluster.worker_sees(cluster.hidden) == []       # the executors cannot see the site
    assert "sites" in os.listdir(cluster.hidden)

    # Relative paths throughout, as a user types them in the site's parent directory.
    monkeypatch.chdir(cluster.hidden)
    log = os.path.relpath(cluster.shared / "log")
    staging = os.path.relpath(cluster.shared / "staging")
    r = run("log", "export", log, site="sites/hub", json_mode=True)
    assert r.code == 0, r
    sent_before = _sent(sites / "hub")
    r = run("export", "--to", "p1", "--to", "p2", "--out", "medium", "--create-out",
            "--max-size", "64K", "--engine", "spark", "--spark-master", cluster.url,
            "--log", log, "--staging", staging, site="sites/hub", json_mode=True)
    assert r.code == 0, r
    sparked = r.json["packets"]
    assert len(sparked) > 4 and {p["to"] for p in sparked} == {"p1", "p2"}
    for p in sparked:
        assert (cluster.hidden / p["path"]).is_file() or Path(p["path"]).is_file()
    assert os.listdir(cluster.shared / "staging") == []     # this run's bodies are gone

    r = run("export", "--to", "p1", "--to", "p2", "--out", tmp_path / "medium-local",
            "--create-out", "--max-size", "64K", site=local.path("hub"), json_mode=True)
    assert r.code == 0, r
    assert _shape(sparked, cluster.hidden / "medium") == \
        _shape(r.json["packets"], tmp_path / "medium-local")

    f = Family(sites)
    f.sites = {n: sites / n for n in ("hub", "p1", "p2")}
    for peer in ("p1", "p2"):
        r = run("import", f"medium/{peer}", site=f"sites/{peer}", json_mode=True)
        assert r.code == 0, r
        assert f.digest(peer) == f.digest("hub")
    assert _sent(sites / "hub") == sent_before + len(sparked)     # recorded, once each


def test_sealed_packets_from_a_cluster_are_the_local_engines_bytes(cluster, tmp_path):
    base = _family(tmp_path / "base")
    fl = _copy(base.root, tmp_path / "L")
    fs = _copy(base.root, cluster.hidden / "S")
    lake = cluster.shared / "lake-sealed"
    with fl.open("hub") as s:
        local = sync.export(s, tmp_path / "out_local", to=["p1", "p2"], seed=SEED, now_ms=NOW,
                            max_size=12000, encrypt=True)
    run("log", "export", lake, site=fs.path("hub"))
    out = cluster.hidden / "out_spark"
    stats: dict = {}
    with fs.open("hub") as s:
        sparked = spark_job.export_spark(
            s, out, to=["p1", "p2"], seed=SEED, now_ms=NOW, max_size=12000, encrypt=True,
            master=cluster.url, log_dir=lake, staging=cluster.shared / "staging-sealed",
            stats=stats)
    # The bodies were made by the worker's executors, not by this process.
    assert {t["worker_pid"] for t in stats["tasks"]}.isdisjoint({os.getpid()})
    assert len(local) == len(sparked) > 2
    for a, b in zip(local, sparked):
        assert (a.to, a.ops, a.bytes, a.ranges, a.seq, a.part) == \
               (b.to, b.ops, b.bytes, b.ranges, b.seq, b.part)
        assert a.path.read_bytes() == b.path.read_bytes()
    for peer in ("p1", "p2"):
        with fs.open(peer) as s:
            sync.import_packets(s, [out / peer], now_ms=NOW)
        assert fs.digest(peer) == fs.digest("hub")
