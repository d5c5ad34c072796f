"""The README's demo and the batch demo run as a user runs them and end converged."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SAMPLES = Path(__file__).resolve().parent.parent / "samples"


@pytest.mark.parametrize("script", ["demo.sh", "batch_demo.sh"])
def test_demo_script_converges(script, tmp_path):
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
               DEMO=str(tmp_path / "demo"))
    r = subprocess.run(["bash", str(SAMPLES / script)], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "converged" in r.stdout and "NOT converged" not in r.stdout + r.stderr
    assert "Traceback" not in r.stderr
