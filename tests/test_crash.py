"""Crash atomicity (docs/design.md §3.3): SIGKILL at random instants, about 20 kills in all.

Runs the harness of ``tools/crash_run.py`` (which see for the checks) on a CI-sized world: a
16,000-op update from a to b cut into four packets, a snapshot for a new site, a changelog to
scrub, and a 60-transaction write loop.  Each command is started as a child process (the venv's
``syncpack`` script, or ``python -c`` with the API for the write loop) and killed with SIGKILL
after a random delay inside its measured run time; then the store must open, ``fsck`` must be
clean, no packet may be half-written under its final name, every committed local transaction
must be whole, the re-run must complete, and the result must equal an uninterrupted run.

For long runs: ``.venv/bin/python tools/crash_run.py --kills 200``.
"""

from __future__ import annotations

import importlib.util
import os
import random
import sys
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[1] / "tools" / "crash_run.py"


def _load():
    spec = importlib.util.spec_from_file_location("crash_run", TOOL)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["crash_run"] = mod
    spec.loader.exec_module(mod)
    return mod


crash_run = _load()

KILLS = {"import": 4, "import-parked": 3, "export": 4, "mkreplica-import": 3, "scrub": 3,
         "write": 3}
SEED = int(os.environ.get("SYNCPACK_CRASH_SEED", random.randrange(1 << 30)))


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    if not crash_run.SYNCPACK.exists():
        pytest.skip(f"no syncpack script next to {sys.executable}")
    return crash_run.build_world(tmp_path_factory.mktemp("crash"), ops=16000, write_txns=60,
                                 write_width=100)


def test_kill_counts_add_up_to_about_twenty():
    assert 18 <= sum(KILLS.values()) <= 24
    assert set(KILLS) == set(crash_run.COMMANDS)


@pytest.mark.parametrize("cmd", list(KILLS))
def test_sigkill_at_random_instants(world, cmd):
    seed = SEED + list(KILLS).index(cmd)
    tally = crash_run.run(world, {cmd: KILLS[cmd]}, seed)
    report = tally.report()
    print(f"SYNCPACK_CRASH_SEED={SEED}\n{report}")
    assert not tally.failures, f"seed {seed}\n{report}"
    assert tally.kills[cmd] == KILLS[cmd]


def test_the_reference_runs_agree(world):
    """The world itself: the direct and the parked route converge, scrub trims, the write loop
    made every transaction."""
    ref = world.ref
    assert ref["import"]["digest"] == ref["import-parked"]["digest"]
    assert ref["import"]["parked"] == 0 and ref["import-parked"]["parked"] == 0
    assert ref["scrub"]["floors"] and ref["scrub"]["changelog"] < ref["import"]["changelog"]
    assert ref["write_records"]["counter"] == {"i": world.write_txns}
    assert ref["mkreplica-import"]["records"] == ref["import"]["records"]
