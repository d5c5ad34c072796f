"""The README's demo and the batch demo run as a user runs them and end converged, without
touching the directory they are started from."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

SAMPLES = Path(__file__).resolve().parent.parent / "samples"


def _env(**extra) -> dict:
    return dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
                **extra)


@pytest.mark.parametrize("script", ["demo.sh", "batch_demo.sh"])
def test_demo_script_converges_in_its_own_temporary_directory(script, tmp_path):
    start = tmp_path / "start"          # where a user happens to be
    start.mkdir()
    (start / "usb").mkdir()             # a folder of the user's that the demo must not delete
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = _env(TMPDIR=str(tmp))
    env.pop("DEMO", None)
    r = subprocess.run(["bash", str(SAMPLES / script)], cwd=start, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "converged" in r.stdout and "NOT converged" not in r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    assert sorted(p.name for p in start.iterdir()) == ["usb"]
    assert not any((start / "usb").iterdir())
    where = Path(re.search(r"demo directory: (\S+)", r.stdout)[1])
    assert where.parent == tmp and (where / "boston_hub" / "syncpack.db").is_file()


def test_demo_refuses_a_demo_directory_that_is_not_empty(tmp_path):
    used = tmp_path / "used"
    used.mkdir()
    (used / "keep.txt").write_text("mine")
    r = subprocess.run(["bash", str(SAMPLES / "demo.sh")], cwd=tmp_path,
                       env=_env(DEMO=str(used)), capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "not empty" in r.stderr, r.stderr
    assert [p.name for p in used.iterdir()] == ["keep.txt"]


def test_attach_demo_three_shops_converge(tmp_path):
    """samples/attach_demo.sh: three applications writing plain SQL end with equal tables."""
    start = tmp_path / "start"
    start.mkdir()
    env = _env(TMPDIR=str(tmp_path))
    env.pop("DEMO", None)
    r = subprocess.run(["bash", str(SAMPLES / "attach_demo.sh")], cwd=start, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "converged: the three shops hold equal tables" in r.stdout
    assert "Traceback" not in r.stderr
    assert list(start.iterdir()) == []


def _readme_block(heading: str, lang: str = "sh") -> str:
    text = (SAMPLES.parent / "README.md").read_text()
    section = text.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return section.split(f"```{lang}\n", 1)[1].split("```", 1)[0]


def test_readme_setup_puts_syncpack_on_path_and_is_seen_by_type_checkers():
    setup = _readme_block("Set up")
    assert ". .venv/bin/activate" in setup          # syncpack is on PATH for what follows
    # an editable install a type checker can follow: a real path on sys.path, not an import hook
    assert "editable_mode=compat" in setup
    assert (SAMPLES.parent / "syncpack" / "py.typed").is_file()


def test_readme_family_in_five_minutes_works_as_written(tmp_path):
    """The quick start, after the set-up (the venv's bin on PATH), in an empty directory."""
    script = _readme_block("A family in five minutes")
    r = subprocess.run(["bash", "-e", "-c", script], cwd=tmp_path, env=_env(),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip().splitlines()[-1] == '{"name": "bolt", "qty": 40}', r.stdout
    # then the Python API's example, in the same directory
    r = subprocess.run([sys.executable, "-c", _readme_block("A family in five minutes",
                                                            "python")],
                       cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip() == "{'name': 'bolt', 'qty': 40}", r.stdout
