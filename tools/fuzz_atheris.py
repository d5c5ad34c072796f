#!/usr/bin/env python3
"""Coverage-guided fuzzing of the packet reader with atheris (libFuzzer for Python).

The target is everything a site does with untrusted bytes before it trusts them: framing, the
header (``codec.read_envelope``), the body hash, then the whole body -- an update packet's
blocks (``blocks.packet_ops``: each block's header, body hash, zstd frame and columns, format
v2) or a snapshot's records (``codec.iter_records``).  The body is decoded even when the hash
does not match, so the decompressor and the decoders are fuzzed too, as a member's own (buggy or
hostile) packets would reach them.  Block signatures are not checked here (no keys: that is
``tests/test_fuzz.py``'s part).  Any exception other than a ``PacketError`` subclass is a
finding; libFuzzer's ``-rss_limit_mb`` and ``-timeout`` catch unbounded memory and hangs.

Setup (atheris 3.0 wheels exist for CPython 3.11 on x86_64 Linux)::

    .venv/bin/pip install atheris

Seed corpus: freshly made packets (``--make-corpus DIR`` builds a small family and writes an
update packet, a parked-gap packet and a snapshot into DIR) plus ``formats/vectors/*.spk``::

    .venv/bin/python tools/fuzz_atheris.py --make-corpus /tmp/spk-corpus
    .venv/bin/python tools/fuzz_atheris.py /tmp/spk-corpus formats/vectors \\
        -rss_limit_mb=1024 -timeout=10 -max_total_time=600

All arguments other than ``--make-corpus`` go to libFuzzer (``-runs=N``, ``-jobs=N``, a crash
file to reproduce, ...).  Without atheris the harness runs once on each file named (or found
in each directory named; with none, on a freshly made corpus) and exits 1 on a finding: a
smoke test of the harness, and a way to replay a crash file.
"""

from __future__ import annotations

import io
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))   # the syncpack of this tree, not whichever is installed


def load() -> None:
    """Import the reader; under atheris inside ``instrument_imports`` so it is instrumented."""
    global blocks, codec, PacketError
    from syncpack.format import blocks, codec
    from syncpack.errors import PacketError


def test_one_input(data: bytes) -> None:
    f = io.BytesIO(data)
    try:
        env = codec.read_envelope(f, len(data))
        codec.body_hash_matches(f, env)
        if env.header.kind == codec.KIND_SNAPSHOT and env.header.piece is not None:
            codec.read_record_piece(f, env)
        elif env.header.kind == codec.KIND_SNAPSHOT:
            for _ in codec.iter_records(f, env):
                pass
        else:
            for _ in blocks.packet_ops(f, env):
                pass
    except PacketError:
        pass


def make_corpus(out: Path) -> list[Path]:
    """Write a few genuine packets to start from."""
    sys.path.insert(0, str(ROOT / "tests"))
    import fuzzkit as tf
    out.mkdir(parents=True, exist_ok=True)
    w = tf.build_world(Path(tempfile.mkdtemp(prefix="syncpack-atheris-")))
    files = []
    for name, raw in list(w.corpus.items()) + [("seed_c", w.seed_c)]:
        files.append(out / f"{name}.spk")
        files[-1].write_bytes(raw)
    print(f"wrote {len(files)} packets into {out}")
    return files


def run_once(args: list[str]) -> int:
    """The harness on each input, without coverage guidance; an exception propagates."""
    load()
    paths = [Path(a) for a in args if not a.startswith("-")]
    if not paths:
        paths = [Path(tempfile.mkdtemp(prefix="syncpack-atheris-corpus-"))]
        make_corpus(paths[0])
    files = sorted(q for p in paths for q in ([p] if p.is_file() else p.rglob("*"))
                   if q.is_file())
    for p in files:
        test_one_input(p.read_bytes())
    print(f"atheris is not installed: ran the harness once on {len(files)} inputs, no finding "
          f"(.venv/bin/pip install atheris to fuzz)")
    return 0


def main() -> int:
    if len(sys.argv) >= 3 and sys.argv[1] == "--make-corpus":
        make_corpus(Path(sys.argv[2]))
        return 0
    try:
        import atheris
    except ImportError:
        return run_once(sys.argv[1:])
    with atheris.instrument_imports():
        load()
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()
    return 0


if __name__ == "__main__":
    sys.exit(main())
