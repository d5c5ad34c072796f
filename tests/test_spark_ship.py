"""The package shipped to a cluster's executors is the whole package: an executor without
syncpack installed imports every subpackage from the zip (docs/cluster.md)."""

from __future__ import annotations

import subprocess
import sys
import zipfile

from syncpack.engine.spark_job import package_zip


def test_the_shipped_zip_holds_the_whole_package_and_imports(tmp_path):
    z = package_zip(tmp_path)
    names = set(zipfile.ZipFile(z).namelist())
    for m in ("syncpack/__init__.py", "syncpack/engine/spark_job.py",
              "syncpack/exchange/packets.py", "syncpack/format/blocks.py",
              "syncpack/store/db.py"):
        assert m in names, m
    # The zip first on the path, as addPyFile puts it: everything comes from it.
    code = ("import sys; sys.path.insert(0, sys.argv[1]); "
            "import syncpack.engine.parquet_log, syncpack.exchange.packets, syncpack; "
            "assert syncpack.__file__.startswith(sys.argv[1]), syncpack.__file__")
    r = subprocess.run([sys.executable, "-c", code, str(z)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
