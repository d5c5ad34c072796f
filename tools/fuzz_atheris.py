#!/usr/bin/env python3
"""Coverage-guided fuzzing of the packet reader with atheris (libFuzzer for Python).

The target is everything a site does with untrusted bytes before it trusts them: framing, the
header (``codec.read_envelope``), the body hash, then the whole body (``codec.iter_ops`` or
``codec.iter_records``) -- the body is decoded even when the hash does not match, so the
decompressor and the op decoder are fuzzed too, as a member's own (buggy or hostile) packets
would reach them.  Any exception other than a ``PacketError`` subclass is a finding; libFuzzer's
``-rss_limit_mb`` and ``-timeout`` catch unbounded memory and hangs.

Setup (atheris 3.0 wheels exist for CPython 3.11 on x86_64 Linux)::

    /work/venv/bin/pip install atheris

Seed corpus: freshly made packets (``--make-corpus DIR`` builds a small family and writes an
update packet, a parked-gap packet and a snapshot into DIR) plus ``formats/vectors/*.spk``::

    /work/venv/bin/python tools/fuzz_atheris.py --make-corpus /tmp/spk-corpus
    /work/venv/bin/python tools/fuzz_atheris.py /tmp/spk-corpus formats/vectors \\
        -rss_limit_mb=1024 -timeout=10 -max_total_time=600

All arguments other than ``--make-corpus`` go to libFuzzer (``-runs=N``, ``-jobs=N``, a crash
file to reproduce, ...).
"""

from __future__ import annotations

import io
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def make_corpus(out: Path) -> None:
    """Write a few genuine packets to start from."""
    import tempfile
    sys.path.insert(0, str(ROOT / "tests"))
    import test_fuzz as tf
    out.mkdir(parents=True, exist_ok=True)
    w = tf.build_world(Path(tempfile.mkdtemp(prefix="syncpack-atheris-")))
    for name, raw in w.corpus.items():
        (out / f"{name}.spk").write_bytes(raw)
    (out / "seed_c.spk").write_bytes(w.seed_c)
    print(f"wrote {len(w.corpus) + 1} packets into {out}")


def main() -> None:
    if len(sys.argv) >= 3 and sys.argv[1] == "--make-corpus":
        make_corpus(Path(sys.argv[2]))
        return
    try:
        import atheris
    except ImportError:
        sys.exit("atheris is not installed: /work/venv/bin/pip install atheris")

    with atheris.instrument_imports():
        from syncpack import blocks, codec
        from syncpack.errors import PacketError

    def test_one_input(data: bytes) -> None:
        f = io.BytesIO(data)
        try:
            env = codec.read_envelope(f, len(data))
            codec.body_hash_matches(f, env)
            if env.header.kind == codec.KIND_SNAPSHOT:
                for _ in codec.iter_records(f, env):
                    pass
            else:
                for _ in blocks.packet_ops(f, env):
                    pass
        except PacketError:
            pass

    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
