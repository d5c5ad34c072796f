"""Documentation and terminal behaviour of the command line.

Every command and subcommand has help text with an "Example", and ``--help`` works for each;
progress display goes to a terminal on stderr, never into ``--json`` output.
"""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
import threading
from pathlib import Path

import click
import pytest

from syncpack.cli import cli

from conftest import run


def walk(cmd: click.Command, path: tuple[str, ...] = ()):
    """(path, command) for the group and every command below it, recursively."""
    yield path, cmd
    if isinstance(cmd, click.Group):
        for name in sorted(cmd.commands):
            yield from walk(cmd.commands[name], path + (name,))


COMMANDS = list(walk(cli))
IDS = [" ".join(p) or "syncpack" for p, _ in COMMANDS]


def test_the_walk_finds_nested_commands():
    paths = {p for p, _ in COMMANDS}
    for p in [(), ("import",), ("export",), ("batch",), ("mkreplica", "export"),
              ("mkreplica", "import"), ("conflicts", "resolve"), ("collection", "create")]:
        assert p in paths, p


@pytest.mark.parametrize("path,cmd", COMMANDS, ids=IDS)
def test_every_command_has_help_with_an_example(path, cmd):
    name = " ".join(("syncpack",) + path)
    text = cmd.help or ""
    assert text.strip(), f"{name} has no help text (give the command a docstring)"
    assert "Example" in text, f"{name}'s help has no 'Example:' block"
    assert cmd.get_short_help_str().strip(), f"{name} has no short help"


@pytest.mark.parametrize("path,cmd", COMMANDS, ids=IDS)
def test_help_exits_zero(path, cmd):
    r = run(*path, "--help")
    assert r.code == 0, r
    assert r.out.startswith("Usage: "), r
    assert "Example" in r.out
    assert r.err == ""


def test_short_help_flag_and_no_command():
    assert run("-h").code == 0
    r = run()
    assert r.code in (0, 2) and "Usage:" in r.out + r.err


# --- progress display -------------------------------------------------------------------------

def _run_with_tty_stderr(args: list[str], cwd: Path) -> tuple[int, str, str]:
    """Run the real program with stderr on a pseudo-terminal (as a person at a terminal sees
    it) and stdout on a pipe (as a script reading --json sees it)."""
    master, slave = pty.openpty()
    env = dict(os.environ, COLUMNS="100", TERM="xterm")
    p = subprocess.Popen([sys.executable, "-m", "syncpack", *args], cwd=cwd, env=env,
                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=slave)
    os.close(slave)
    chunks: list[bytes] = []

    def drain() -> None:  # keep the pty from filling up while the program writes
        while True:
            r, _, _ = select.select([master], [], [], 30)
            if not r:
                return
            try:
                b = os.read(master, 65536)
            except OSError:  # EIO: the program closed its end
                return
            if not b:
                return
            chunks.append(b)

    t = threading.Thread(target=drain, daemon=True)
    t.start()
    out, _ = p.communicate(timeout=120)
    t.join(timeout=30)
    os.close(master)
    return p.returncode, out.decode(), b"".join(chunks).decode(errors="replace")


@pytest.fixture
def two_sites(family):
    family.init("boston")
    family.add("sanfran", via="boston")
    with family.open("boston") as s, s.transaction() as tx:
        for i in range(200):
            tx.put("parts", f"p-{i}", {"qty": i})
    return family


def test_progress_shows_on_a_terminal_but_never_in_json(two_sites, tmp_path):
    fam = two_sites
    boston, sanfran = str(fam.path("boston")), str(fam.path("sanfran"))
    usb = tmp_path / "usb"

    # Human mode on a terminal: a progress bar on stderr, nothing of it on stdout.
    code, out, err = _run_with_tty_stderr(
        ["--site", boston, "export", "--to", "sanfran", "--create-out", "--out",
         str(usb / "a")], tmp_path)
    assert code == 0, err
    assert "\rexport: " in err and "/200 [" in err, err      # the bar, with its total
    assert "export:" not in out and "\r" not in out

    # --json on the same terminal: stdout is exactly one JSON document, no progress anywhere.
    code, out, err = _run_with_tty_stderr(
        ["--json", "--site", sanfran, "import", str(usb / "a")], tmp_path)
    assert code == 0, err
    doc = json.loads(out)
    assert out.strip() == json.dumps(doc, indent=2)
    assert doc["ops_applied"] > 0 and len(doc["applied"]) == 1
    assert "import: " not in err and "\r" not in err, err

    with fam.open("boston") as s, s.transaction() as tx:
        tx.put("parts", "p-new", {"qty": 1})
    code, out, err = _run_with_tty_stderr(
        ["--json", "--site", boston, "export", "--to", "sanfran", "--create-out", "--out",
         str(usb / "b")],
        tmp_path)
    assert code == 0, err
    doc = json.loads(out)
    assert out.strip() == json.dumps(doc, indent=2)
    assert [p["to"] for p in doc["packets"]] == ["sanfran"]
    assert "export: " not in err and "\r" not in err, err

    # A batch round: progress on the terminal in human mode, none with --json.
    cfg = tmp_path / "sanfran.toml"
    inbox = usb / "b"
    cfg.write_text(f'site = "{sanfran}"\n[[import]]\npath = "{inbox}"\n')
    code, out, err = _run_with_tty_stderr(["--json", "batch", str(cfg)], tmp_path)
    assert code == 0, err
    doc = json.loads(out)
    assert out.strip() == json.dumps(doc, indent=2)
    assert doc["counts"]["applied"] == 1 and err == "", err


def test_json_output_is_only_the_document_in_process(two_sites, tmp_path):
    """The same through the in-process runner (stderr not a terminal): stdout parses whole."""
    fam = two_sites
    r = run("export", "--to", "sanfran", "--create-out", "--out", tmp_path / "usb",
            site=fam.path("boston"), json_mode=True)
    assert r.code == 0, r
    assert json.loads(r.out)["packets"]
    r = run("import", tmp_path / "usb", site=fam.path("sanfran"), json_mode=True)
    assert r.code == 0, r
    assert json.loads(r.out)["ops_applied"] == 200
    assert r.err == ""
