"""Shared fixtures: CLI transcripts and families of sites built the way a user builds them."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from click.testing import CliRunner

from syncpack.exchange import replica, sync
from syncpack.cli import cli
from syncpack.site import Site


class Result:
    def __init__(self, r):
        self.code = r.exit_code
        self.out = r.stdout
        self.err = r.stderr
        self.exception = r.exception

    @property
    def json(self):
        return json.loads(self.out)

    def __repr__(self):
        return f"<exit {self.code}\nstdout: {self.out}\nstderr: {self.err}>"


def run(*args, site: str | os.PathLike | None = None, json_mode: bool = False, env=None,
        input: str | bytes | None = None) -> Result:
    """Run the syncpack CLI in-process; arguments as a user types them, ``input`` on stdin."""
    argv = []
    if site is not None:
        argv += ["--site", str(site)]
    if json_mode:
        argv.append("--json")
    argv += [str(a) for a in args]
    # An interrupted command ignores further Ctrl-Cs while it reports; in a process of its
    # own that ends with it, here it would outlive the command, and every process a later
    # test starts would inherit SIGINT ignored.
    handlers = {n: signal.getsignal(n) for n in (signal.SIGINT, signal.SIGTERM)}
    try:
        r = CliRunner().invoke(cli, argv, env=env, input=input, catch_exceptions=True)
    finally:
        for n, h in handlers.items():
            signal.signal(n, h)
    res = Result(r)
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise AssertionError(f"uncaught exception from syncpack {argv}: {r.exception!r}\n{res}")
    assert "Traceback" not in res.err, res
    return res


class Family:
    """Sites of one family under a temporary directory, with a shared 'usb' medium per hop."""

    def __init__(self, root: Path):
        self.root = root
        self.sites: dict[str, Path] = {}
        self._n = 0

    def path(self, name: str) -> Path:
        return self.sites[name]

    def open(self, name: str) -> Site:
        return Site.open(self.sites[name])

    def init(self, name: str, policy: str = "lww", priority: int = 0) -> Path:
        p = self.root / name
        Site.init_family(p, "fam", name, policy, priority).close()
        self.sites[name] = p
        return p

    def add(self, name: str, via: str, priority: int = 0) -> Path:
        p = self.root / name
        s, pub = Site.keygen(p, name)
        s.close()
        medium = self.medium()
        with self.open(via) as src:
            replica.mkreplica_export(src, name, pub, medium, priority)
        with Site.open(p, require_joined=False) as dst:
            replica.mkreplica_import(dst, [medium])
        self.sites[name] = p
        return p

    def medium(self) -> Path:
        self._n += 1
        d = self.root / "media" / f"m{self._n:05d}"
        d.mkdir(parents=True)
        return d

    def export(self, src: str, dst: str | list[str], **kw) -> list[Path]:
        """Export from src to dst into a fresh medium; returns the packet paths."""
        d = self.medium()
        with self.open(src) as s:
            pk = sync.export(s, d, to=[dst] if isinstance(dst, str) else dst, **kw)
        return [p.path for p in pk]

    def import_(self, dst: str, paths) -> sync.ImportResult:
        with self.open(dst) as s:
            return sync.import_packets(s, paths)

    def sync(self, src: str, dst: str) -> sync.ImportResult:
        return self.import_(dst, self.export(src, dst))

    def put(self, name: str, collection: str, key: str, value) -> None:
        with self.open(name) as s, s.transaction() as tx:
            tx.put(collection, key, value)

    def digest(self, name: str) -> str:
        with self.open(name) as s:
            return s.digest()[0]

    def full_exchange(self, rounds: int = 2) -> None:
        names = list(self.sites)
        for _ in range(rounds):
            for a in names:
                for b in names:
                    if a != b:
                        self.sync(a, b)


@pytest.fixture
def family(tmp_path) -> Family:
    return Family(tmp_path)
