"""What a person at a terminal sees: a real progress bar during long work (checked in a
pseudo-terminal), nothing of it in --json mode or when stderr is not a terminal, and a clean
Ctrl-C: exit 130, 'error: interrupted; ...', the packet being applied rolled back whole."""

from __future__ import annotations

import os
import pty
import re
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import Family, run
from syncpack.admin import loading

BIG = 150_000      # ops in one transaction: its apply takes long enough to be watched


class Terminal:
    """The real program with stderr on a pseudo-terminal, stdout on a pipe."""

    def __init__(self, args: list[str], cwd: Path):
        master, slave = pty.openpty()
        env = dict(os.environ, COLUMNS="120", TERM="xterm")
        self.p = subprocess.Popen([sys.executable, "-m", "syncpack", *map(str, args)], cwd=cwd,
                                  env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                  stderr=slave)
        os.close(slave)
        self.master = master
        self.chunks: list[bytes] = []
        self.changed = threading.Condition()
        self.t = threading.Thread(target=self._drain, daemon=True)
        self.t.start()

    def _drain(self) -> None:
        while True:
            r, _, _ = select.select([self.master], [], [], 60)
            if not r:
                break
            try:
                b = os.read(self.master, 65536)
            except OSError:     # EIO: the program closed its end
                break
            if not b:
                break
            with self.changed:
                self.chunks.append(b)
                self.changed.notify_all()
        with self.changed:
            self.chunks.append(b"")
            self.changed.notify_all()

    @property
    def err(self) -> str:
        return b"".join(self.chunks).decode(errors="replace")

    def wait_for(self, predicate, limit: float = 120) -> None:
        """Until ``predicate(stderr so far)`` holds (a guard against a hang, not a timing
        assertion: the test fails only if the program never gets there)."""
        end = time.monotonic() + limit
        with self.changed:
            while not predicate(self.err):
                left = end - time.monotonic()
                if left <= 0 or (self.chunks and self.chunks[-1] == b""):
                    raise AssertionError(f"never seen; stderr so far:\n{self.err[-3000:]}")
                self.changed.wait(left)

    def finish(self) -> tuple[int, str, str]:
        out, _ = self.p.communicate(timeout=300)
        self.t.join(timeout=60)
        os.close(self.master)
        return self.p.returncode, out.decode(), self.err


# Time left and rate are '?' on the first draw; an export that only copies blocks can finish
# before a second one.
BAR = re.compile(r"(\w+): +(\d+)%\|[^|\r]*\| (\d+)/(\d+) \[(\d\d:\d\d)<(\d\d:\d\d|\?), "
                 r"([\d.]+|\?) (ops|records)/s\]")


def bars(text: str, label: str) -> list[tuple[int, int, int]]:
    """(percent, done, total) of every full bar drawn for ``label``."""
    return [(int(m[2]), int(m[3]), int(m[4])) for m in BAR.finditer(text) if m[1] == label]


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict:
    """boston with a small and then one big transaction, exported as two packets for sanfran;
    sanfran as it was before importing them (each test works on copies)."""
    root = tmp_path_factory.mktemp("term")
    fam = Family(root)
    fam.init("boston")
    fam.add("sanfran", via="boston")
    fam.put("boston", "parts", "small", {"qty": 1})
    small = fam.export("boston", "sanfran")
    with fam.open("boston") as s, s.transaction() as tx:
        for i in range(BIG):
            tx.put("parts", f"p{i:07d}", {"qty": i, "name": "bolt"})
    big = fam.export("boston", "sanfran")
    assert len(small) == len(big) == 1
    return {"root": root, "boston": fam.path("boston"), "sanfran": fam.path("sanfran"),
            "small": small[0], "big": big[0]}


def copy_site(world: dict, name: str, dest: Path) -> Path:
    return Path(shutil.copytree(world[name], dest / name))


def interrupted(world: dict, name: str, tmp_path: Path, args, ready
                ) -> tuple[Path, int, str, str]:
    """A copy of site ``name`` running ``args(site)`` on a terminal, sent Ctrl-C once
    ``ready(stderr)``: (the site, exit code, stdout, stderr).  On a loaded machine the
    terminal's output can reach us after the command has finished, so that the Ctrl-C comes
    too late: such a run (exit 0) proves nothing either way, and is made again on a fresh
    copy."""
    for attempt in range(4):
        site = copy_site(world, name, tmp_path / f"try{attempt}")
        term = Terminal(args(site), tmp_path)
        term.wait_for(ready)
        term.p.send_signal(signal.SIGINT)
        code, out, err = term.finish()
        if code != 0:
            break
    return site, code, out, err


def state(site: Path) -> tuple:
    d = run("digest", site=site, json_mode=True).json
    return d["digest"], d["vector"]


def test_import_of_one_big_transaction_shows_a_bar_while_it_is_applied(world, tmp_path):
    sanfran = copy_site(world, "sanfran", tmp_path)
    term = Terminal(["--site", sanfran, "import", world["small"], world["big"]], tmp_path)
    code, out, err = term.finish()
    assert code == 0, err
    seen = bars(err, "import")
    assert seen, err[-2000:]
    total = BIG + 1
    assert all(t == total for _p, _n, t in seen), seen
    # Drawn during the big packet's one transaction, not only before or after it.
    assert any(0 < n < total and 0 < p < 100 for p, n, _t in seen), seen
    # The bar is cleared at the end (stderr ends blank); the summary is the result, on stdout.
    assert err.replace("\r", "\n").splitlines()[-1].strip() == "", err[-500:]
    assert out.strip().startswith("import: 2 packet(s) applied"), out


def test_export_seeding_and_load_show_bars(world, tmp_path):
    boston = copy_site(world, "boston", tmp_path)
    # Forget what sanfran was sent, so the export sends everything again.
    assert run("chepoch", "sanfran", "boston=0", site=boston).code == 0
    usb = tmp_path / "usb"
    usb.mkdir()
    code, out, err = Terminal(["--site", boston, "export", "--to", "sanfran", "--out", usb],
                              tmp_path).finish()
    assert code == 0, err
    assert any(t >= BIG for _p, _n, t in bars(err, "export")), err[-2000:]
    assert "sanfran" in out

    pub = run("keygen", tmp_path / "tokyo", "--site", "tokyo", json_mode=True).json
    code, out, err = Terminal(["--site", boston, "mkreplica", "export", "--site", "tokyo",
                               "--pubkey", pub["public_key"], "--out", usb], tmp_path).finish()
    assert code == 0, err
    assert any(t >= BIG for _p, _n, t in bars(err, "snapshot")), err[-2000:]
    code, out, err = Terminal(["--site", tmp_path / "tokyo", "mkreplica", "import",
                               usb / "tokyo"], tmp_path).finish()
    assert code == 0, err
    assert any(t >= BIG for _p, _n, t in bars(err, "seeding")), err[-2000:]

    lines = tmp_path / "load.jsonl"
    lines.write_text("".join(f'{{"collection": "c", "key": "k{i}", "value": {i}}}\n'
                             for i in range(50_000)))
    code, out, err = Terminal(["--site", boston, "load", lines], tmp_path).finish()
    assert code == 0, err
    assert any(t == 50_000 for _p, _n, t in bars(err, "load")), err[-2000:]


def test_no_bar_in_json_mode_or_when_stderr_is_not_a_terminal(world, tmp_path):
    sanfran = copy_site(world, "sanfran", tmp_path)
    code, out, err = Terminal(["--json", "--site", sanfran, "import", world["small"]],
                              tmp_path).finish()
    assert code == 0 and err == "", err
    assert '"applied"' in out

    # stderr on a pipe (a log file, cron): no bar and no carriage returns; the summary on stdout.
    p = subprocess.run([sys.executable, "-m", "syncpack", "--site", str(sanfran), "import",
                        str(world["big"])], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stderr == "", p.stderr
    assert p.stdout.startswith("import: 1 packet(s) applied"), p.stdout

    # -q on a terminal: nothing at all.
    boston = copy_site(world, "boston", tmp_path)
    assert run("chepoch", "sanfran", "boston=0", site=boston).code == 0
    usb = tmp_path / "usb"
    usb.mkdir()
    code, out, err = Terminal(["-q", "--site", boston, "export", "--to", "sanfran", "--out",
                               usb], tmp_path).finish()
    assert code == 0 and err == "", err


def test_ctrl_c_during_an_import_rolls_back_the_packet_being_applied(world, tmp_path):
    # What the store must look like afterwards: the small packet applied, the big one not.
    ref = copy_site(world, "sanfran", tmp_path / "ref")
    assert run("import", world["small"], site=ref).code == 0
    expected = state(ref)

    # Ctrl-C once the big packet's transaction is under way: the bar has counted ops of it.
    sanfran, code, out, err = interrupted(
        world, "sanfran", tmp_path,
        lambda site: ["--site", site, "import", world["small"], world["big"]],
        lambda err: any(1 < n < BIG for _p, n, _t in bars(err, "import")))

    assert code == 130, err
    assert "Traceback" not in err and "Aborted!" not in err, err
    msg = [ln for ln in err.replace("\r", "\n").splitlines() if ln.startswith("error: ")]
    assert msg == [f"error: interrupted; 1 packet(s) applied and kept (1 op(s)): "
                   f"{world['small']}; the packet being applied was rolled back whole"], \
        err[-1000:]
    assert "hint: run the same import again" in err
    assert state(sanfran) == expected
    assert run("fsck", site=sanfran).code == 0
    # Running it again finishes the job.
    r = run("import", world["small"], world["big"], site=sanfran, json_mode=True)
    assert r.code == 0 and r.json["duplicates"] == [str(world["small"])], r
    assert r.json["ops_applied"] == BIG


def test_scrub_resync_and_log_export_show_bars(world, tmp_path):
    from syncpack.exchange import sync
    from syncpack.site import Site
    boston = copy_site(world, "boston", tmp_path)
    sanfran = copy_site(world, "sanfran", tmp_path)
    # sanfran applies everything and acknowledges it, so boston may trim it all.
    with Site.open(sanfran) as s:
        sync.import_packets(s, [world["small"], world["big"]])
    back = tmp_path / "back"
    back.mkdir()
    with Site.open(sanfran) as s:
        sync.export(s, back, to=["boston"])
    with Site.open(boston) as s:
        sync.import_packets(s, [back])

    code, out, err = Terminal(["--site", boston, "log", "export"], tmp_path).finish()
    assert code == 0, err
    assert any(t >= BIG for _p, _n, t in bars(err, "log")), err[-2000:]

    usb = tmp_path / "usb"
    usb.mkdir()
    code, out, err = Terminal(["--site", boston, "resync", "--to", "sanfran", "--out", usb],
                              tmp_path).finish()
    assert code == 0, err
    assert any(t >= BIG for _p, _n, t in bars(err, "snapshot")), err[-2000:]

    code, out, err = Terminal(["--site", boston, "scrub"], tmp_path).finish()
    assert code == 0, err
    assert any(t >= BIG for _p, _n, t in bars(err, "scrub")), err[-2000:]
    assert re.search(r"removed \d{6,} changelog op\(s\)", out), out
    assert run("fsck", site=boston).code == 0


@pytest.mark.parametrize("parser", ["here", "child"])
def test_ctrl_c_during_a_load_rolls_back_its_one_transaction(world, tmp_path, parser):
    """A file of 6 MB is parsed by the loading process itself; one of 18 MB by a child
    process (admin/loading.py), which the Ctrl-C reaches too."""
    before = state(copy_site(world, "boston", tmp_path / "ref"))
    lines = tmp_path / "load.jsonl"
    if parser == "here":
        lines.write_text("".join(f'{{"collection":"c","key":"k{i}","value":{i}}}\n'
                                 for i in range(BIG)))
    else:
        lines.write_text("".join(f'{{"collection": "c", "key": "k{i}", "value": {{"n": {i}, '
                                 f'"pad": "{"x" * 60}"}}}}\n' for i in range(BIG)))
    assert (lines.stat().st_size >= loading.ELSEWHERE_AT) == (parser == "child")
    boston, code, out, err = interrupted(
        world, "boston", tmp_path, lambda site: ["--site", site, "load", lines],
        lambda err: any(0 < n < BIG for _p, n, _t in bars(err, "load")))
    assert code == 130, err
    assert "error: interrupted; nothing was loaded: the file's one transaction was rolled " \
           "back" in err, err[-1000:]
    assert "Traceback" not in err and "Aborted!" not in err
    assert state(boston) == before
    assert run("fsck", site=boston).code == 0


def test_a_load_from_a_pipe_at_a_terminal_loads_every_record(world, tmp_path):
    """With a bar to fill, a regular file is counted first and read again; a FIFO (or
    `<(zcat ...)`) cannot be read twice: counted, its records were consumed and the load said
    'loaded 0 record(s)' with exit 0."""
    boston = copy_site(world, "boston", tmp_path)
    fifo = tmp_path / "lines.fifo"
    os.mkfifo(fifo)
    text = "".join(f'{{"collection": "piped", "key": "k{i}", "value": {i}}}\n'
                   for i in range(300))

    def feed():
        with open(fifo, "w") as f:
            f.write(text)

    t = threading.Thread(target=feed, daemon=True)
    t.start()
    code, out, err = Terminal(["--site", boston, "load", fifo], tmp_path).finish()
    t.join(10)
    assert code == 0, err
    assert "loaded 300 record(s)" in out
    assert run("get", "piped", "k299", site=boston).out.strip() == "299"
