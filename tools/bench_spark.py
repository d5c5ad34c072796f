#!/usr/bin/env python3
"""Benchmark: the Spark engine against the local engine on one machine.

Builds (once, cached under --workdir) a family of a hub and --peers peers whose hub holds --ops
ops of its own plus a few relayed from every peer, then exports packets for every peer with each
engine from its own copy of the hub, in a child process each, and reports wall times, their
ratio and peak RSS.  Both engines get the same seed and clock, and the packets are compared byte
for byte.

    python tools/bench_spark.py --ops 1000000
    python tools/bench_spark.py                   # 5,000,000 ops, 8 peers
    python tools/bench_spark.py --ops 20000000    # the big run, on request
    python tools/bench_spark.py --ops 1000000 --cluster 1,2   # + standalone clusters

With ``--cluster N,M`` the Spark runs are repeated on a standalone cluster started here on
loopback with pyspark's own ``bin/spark-class`` (a master and N workers sharing the machine's
cores), bodies staged under the run directory (``--staging``): the cluster's cost (task
shipping, staging, the driver's copy to the medium) beside ``local[*]`` on the same cores.

Each Spark run is one cold ``export --engine spark`` in its own process (start Spark, bring the
log up to date, run the job, record, stop Spark), done twice: on a first export, when the site's
Parquet log is built inside the run (the JVM starts meanwhile), and with the log already current
(as when ``syncpack log export`` runs from cron).  Peak RSS: the local engine's process; for
Spark the driver (Python), the JVM and the largest Python worker (the executors' packet writers).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from syncpack.exchange import sync  # noqa: E402
from syncpack.exchange import replica
from syncpack.site import Site  # noqa: E402

SEED = b"bench_spark"
# One creation time for both engines (identical packets); near now, as importers refuse
# packets made more than the clock-skew limit in the future.  The children are given the
# parent's (--now): each would otherwise read its own clock, and the packets would differ.
NOW = int(time.time() * 1000)
RELAYED_PER_PEER = 10
TXN_OPS = 100


# --- building the family ----------------------------------------------------------------------

def build_family(root: Path, ops: int, peers: int) -> Path:
    """hub + peers, created before the data so that every peer needs all of it."""
    done = root / "READY"
    if done.exists():
        return root / "hub"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    t0 = time.perf_counter()
    Site.init_family(root / "hub", "bench", "hub").close()
    names = [f"peer{i:02d}" for i in range(1, peers + 1)]
    for n in names:
        s, pub = Site.keygen(root / n, n)
        s.close()
        medium = root / "media" / n
        with Site.open(root / "hub") as hub:
            replica.mkreplica_export(hub, n, pub, medium)
        with Site.open(root / n, require_joined=False) as dst:
            replica.mkreplica_import(dst, [medium])
    for n in names:  # a few ops of every peer, relayed by the hub
        with Site.open(root / n) as s, s.transaction() as tx:
            for j in range(RELAYED_PER_PEER):
                tx.put("notes", f"{n}-{j}", {"from": n, "j": j})
        medium = root / "media" / f"{n}-up"
        with Site.open(root / n) as s:
            sync.export(s, medium, to=["hub"])
        with Site.open(root / "hub") as hub:
            sync.import_packets(hub, [medium])
    keys = max(1, ops // 2)
    written = 0
    with Site.open(root / "hub") as hub:
        while written < ops:
            with hub.transaction() as tx:
                for i in range(written, min(ops, written + TXN_OPS)):
                    k = f"p{i % keys:09d}"
                    if i % 20 == 19:
                        tx.delete("parts", k)
                    else:
                        tx.put("parts", k, {"sku": f"SKU-{i:010d}", "qty": i % 1000,
                                            "bin": f"A-{i % 97:02d}-{i % 13}",
                                            "price": (i % 10000) / 100})
            written = min(ops, written + TXN_OPS)
            if written % 500_000 == 0:
                print(f"  ... {written:,} ops written ({time.perf_counter() - t0:.0f} s)",
                      file=sys.stderr, flush=True)
        hub.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    shutil.rmtree(root / "media", ignore_errors=True)
    done.write_text(json.dumps({"ops": ops, "peers": peers,
                                "build_s": round(time.perf_counter() - t0, 1)}))
    return root / "hub"


# --- the two runs, each in a child process ------------------------------------------------------

def _descendants() -> list[int]:
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(d))
    out, todo = [], [os.getpid()]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _hwm_kb(pid: int) -> tuple[str, int]:
    try:
        with open(f"/proc/{pid}/comm") as f:
            comm = f.read().strip()
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return comm, int(line.split()[1])
    except OSError:
        pass
    return "", 0


def child_local(site_dir: Path, out: Path, max_size: int) -> dict:
    t0 = time.perf_counter()
    with Site.open(site_dir) as s:
        pk = sync.export(s, out, all_peers=True, max_size=max_size, seed=SEED, now_ms=NOW)
    wall = time.perf_counter() - t0
    return {"engine": "local", "wall_s": round(wall, 2), "packets": len(pk),
            "ops": sum(p.ops for p in pk),
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024}


class _PeakSampler:
    """Samples the peak RSS (VmHWM) of every descendant process while a run goes on: the JVM,
    and the Python workers it forks (they are gone once the session stops)."""

    def __init__(self):
        self.jvm = self.workers = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._loop, daemon=True)
        self._t.start()

    def _loop(self) -> None:
        while not self._stop.wait(0.25):
            for pid in _descendants():
                comm, kb = _hwm_kb(pid)
                if comm == "java":
                    self.jvm = max(self.jvm, kb)
                elif comm.startswith("python"):
                    self.workers = max(self.workers, kb)

    def stop(self) -> None:
        self._stop.set()
        self._t.join()


def child_spark(site_dir: Path, out: Path, max_size: int, master: str, strategy: str,
                driver_memory: str | None, staging: Path | None = None) -> dict:
    """One cold ``export --engine spark``: starts Spark (while the log catches up), runs the
    job, records, stops Spark."""
    from syncpack.engine import spark_job

    if driver_memory:
        os.environ["PYSPARK_SUBMIT_ARGS"] = f"--driver-memory {driver_memory} pyspark-shell"
    sampler = _PeakSampler()
    stats: dict = {}
    t0 = time.perf_counter()
    with Site.open(site_dir) as s:
        pk = spark_job.export_spark(s, out, all_peers=True, max_size=max_size,
                                       master=master, seed=SEED, now_ms=NOW,
                                       strategy=strategy, stats=stats, staging=staging)
    wall = time.perf_counter() - t0
    sampler.stop()
    workers = max([sampler.workers] + [t["worker_maxrss_kb"] for t in stats.get("tasks", [])])
    return {"engine": f"spark/{strategy}", "master": master, "wall_s": round(wall, 2),
            "log_s": stats.get("log_s"), "log_ops_written": stats["log"]["ops_written"],
            "session_start_s": stats.get("session_s"),
            "session_wait_s": stats.get("session_wait_s"), "job_s": stats.get("job_s"),
            "finish_s": stats.get("finish_s"),
            "packets": len(pk), "ops": sum(p.ops for p in pk),
            "driver_peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
            "jvm_peak_rss_mb": sampler.jvm // 1024, "worker_peak_rss_mb": workers // 1024,
            "tasks": stats.get("tasks")}


class StandaloneCluster:
    """A Spark standalone master and ``workers`` workers on loopback, for one set of runs."""

    def __init__(self, workdir: Path, workers: int, memory: str):
        import pyspark
        import socket

        def port() -> int:
            with socket.socket() as sk:
                sk.bind(("127.0.0.1", 0))
                return sk.getsockname()[1]

        home = Path(pyspark.__file__).parent
        spark_class = str(home / "bin" / "spark-class")
        self.env = dict(os.environ, SPARK_HOME=str(home), SPARK_LOCAL_IP="127.0.0.1",
                        PYSPARK_PYTHON=sys.executable)
        self.dir, self.workers = workdir, workers
        workdir.mkdir(parents=True, exist_ok=True)
        self.procs: list[subprocess.Popen] = []
        mport = port()
        self.url = f"spark://127.0.0.1:{mport}"
        self._start("master", [spark_class, "org.apache.spark.deploy.master.Master", "--host",
                               "127.0.0.1", "--port", str(mport), "--webui-port", str(port())],
                    "I have been elected leader")
        cores = max(1, (os.cpu_count() or 1) // workers)
        for w in range(workers):
            self._start(f"worker{w}", [spark_class, "org.apache.spark.deploy.worker.Worker",
                                       "--host", "127.0.0.1", "--cores", str(cores), "--memory",
                                       memory, "--webui-port", str(port()), "--work-dir",
                                       str(workdir / f"work{w}"), self.url],
                        "Successfully registered with master")

    def _start(self, name: str, argv: list[str], ready: str) -> None:
        log = self.dir / f"{name}.log"
        with open(log, "wb") as f:
            p = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, env=self.env,
                                 start_new_session=True)
        self.procs.append(p)
        end = time.time() + 120
        while time.time() < end:
            if ready in log.read_text(errors="replace"):
                return
            if p.poll() is not None:
                break
            time.sleep(0.3)
        self.stop()
        raise SystemExit(f"the Spark {name} did not start; see {log}")

    def stop(self) -> None:
        import signal
        for p in reversed(self.procs):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        self.procs.clear()


def run_child(args: list[str]) -> dict:
    r = subprocess.run([sys.executable, __file__, *args], stdout=subprocess.PIPE, text=True)
    if r.returncode:
        raise SystemExit(f"child {args[:2]} failed with exit code {r.returncode}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def digests(out: Path) -> dict[str, str]:
    res = {}
    for p in sorted(out.rglob("*.spk")):
        h = hashlib.sha256()
        with open(p, "rb") as f:
            for b in iter(lambda: f.read(1 << 20), b""):
                h.update(b)
        res[str(p.relative_to(out))] = h.hexdigest()
    return res


def main() -> None:
    global NOW
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", type=int, default=5_000_000)
    ap.add_argument("--peers", type=int, default=8)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/syncpack-bench"))
    ap.add_argument("--master", default="local[*]")
    ap.add_argument("--strategy", choices=["merge", "shuffle", "both"], default="merge")
    ap.add_argument("--max-size", default="64M", help="packet size limit (default 64M)")
    ap.add_argument("--driver-memory", default=None, help="spark.driver.memory, e.g. 4g")
    ap.add_argument("--skip-local", action="store_true")
    ap.add_argument("--cluster", default="", metavar="N,M",
                    help="also run on standalone clusters of N, M... workers (e.g. 1,2)")
    ap.add_argument("--worker-memory", default="4g", help="each cluster worker's memory")
    ap.add_argument("--staging", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--keep", action="store_true", help="keep the packets and site copies")
    ap.add_argument("--child", choices=["local", "spark"], help=argparse.SUPPRESS)
    ap.add_argument("--site", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--now", type=int, default=NOW, help=argparse.SUPPRESS)
    a = ap.parse_args()
    NOW = a.now
    from syncpack.exchange.packets import parse_size
    max_size = parse_size(a.max_size)

    if a.child == "local":
        print(json.dumps(child_local(a.site, a.out, max_size)))
        return
    if a.child == "spark":
        print(json.dumps(child_spark(a.site, a.out, max_size, a.master, a.strategy,
                                     a.driver_memory, a.staging)))
        return

    base = a.workdir / f"family-{a.ops}-{a.peers}"
    print(f"family: {a.ops:,} ops at the hub, {a.peers} peers ({base})", file=sys.stderr)
    hub = build_family(base, a.ops, a.peers)
    runs = a.workdir / "runs"
    shutil.rmtree(runs, ignore_errors=True)
    results: list[dict] = []
    outs: dict[str, dict] = {}
    strategies = ["merge", "shuffle"] if a.strategy == "both" else [a.strategy]
    runs_list = ([] if a.skip_local else [("local", None, False)])
    for st in strategies:
        runs_list += [(f"{st}-first", st, False), (f"{st}-logged", st, True)]
    clusters = [int(n) for n in a.cluster.split(",") if n.strip()]
    for n in clusters:   # logged runs only: the log's catch-up is the driver's, as above
        runs_list += [(f"{st}-cluster{n}-logged", st, True) for st in strategies]
    cluster: StandaloneCluster | None = None
    for label, strategy, logged in runs_list:
        workers = int(label.split("-cluster")[1].split("-")[0]) if "-cluster" in label else 0
        if cluster is not None and workers != cluster.workers:
            cluster.stop()
            cluster = None
        if workers and cluster is None:
            print(f"starting a standalone cluster of {workers} worker(s) ...", file=sys.stderr,
                  flush=True)
            cluster = StandaloneCluster(runs / f"cluster{workers}", workers, a.worker_memory)
            os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
        site = runs / label / "hub"
        shutil.copytree(hub, site)
        if logged:  # the log is kept current (e.g. 'syncpack log export' from cron)
            from syncpack.engine import parquet_log
            t0 = time.perf_counter()
            with Site.open(site) as s:
                # Sealed as the export would seal them: log_export alone seals at its own
                # (larger) bound, and other blocks would make other packets than the local run.
                with s.lock(), s.write_txn():
                    s.seal_pending(max_block=max_size // 2)
                parquet_log.log_export(s)
            log_build = round(time.perf_counter() - t0, 2)
        out = runs / label / "out"
        print(f"running {label} ...", file=sys.stderr, flush=True)
        common = ["--site", str(site), "--out", str(out), "--max-size", a.max_size,
                  "--now", str(NOW)]
        if strategy is None:
            res = run_child(["--child", "local", *common])
        else:
            master = cluster.url if workers else a.master
            res = run_child(["--child", "spark", *common, "--master", master,
                             "--strategy", strategy]
                            + (["--driver-memory", a.driver_memory] if a.driver_memory else [])
                            + (["--staging", str(runs / label / "staging")] if workers else []))
            res["label"] = label
            if logged:
                res["log_built_before_s"] = log_build
        results.append(res)
        outs[label] = digests(out)
        shown = {k: v for k, v in res.items() if k != "tasks"}
        if res.get("tasks"):
            shown["task_s"] = [t["seconds"] for t in res["tasks"]]
        print(json.dumps(shown), file=sys.stderr)
    if cluster is not None:
        cluster.stop()
    if len(outs) > 1:
        first = next(iter(outs.values()))
        same = all(d == first for d in outs.values())
        print(f"packets identical across engines: {same} ({len(first)} files)")
        if not same:
            raise SystemExit(1)

    print(f"\n{a.ops:,} ops x {a.peers} peers, max packet {a.max_size}, "
          f"{os.cpu_count()} cores, master {a.master}")
    local = next((r for r in results if r["engine"] == "local"), None)
    for r in results:
        if r["engine"] == "local":
            print(f"  local engine             wall {r['wall_s']:7.1f} s   peak RSS "
                  f"{r['peak_rss_mb']} MB   ({r['ops']:,} ops sent)")
            continue
        what = ("log already current" if r["label"].endswith("logged")
                else "first export, log built in the run")
        ratio = f"   spark/local {r['wall_s'] / local['wall_s']:.2f}" if local else ""
        name = r["engine"] + (f" {r['label'].split('-')[1]}" if "-cluster" in r["label"]
                              else "")
        print(f"  {name:<24} wall {r['wall_s']:7.1f} s{ratio}   ({what})")
        print(f"  {'':<24} log catch-up {r['log_s']:.1f} s ({r['log_ops_written']:,} ops), "
              f"JVM start {r['session_start_s']:.1f} s of which waited "
              f"{r['session_wait_s']:.1f} s, job {r['job_s']:.1f} s, driver writes "
              f"{r['finish_s'] or 0:.1f} s")
        print(f"  {'':<24} peak RSS: driver {r['driver_peak_rss_mb']} MB, JVM "
              f"{r['jvm_peak_rss_mb']} MB, largest Python worker {r['worker_peak_rss_mb']} MB")
    if not a.keep:
        shutil.rmtree(runs, ignore_errors=True)


if __name__ == "__main__":
    main()
