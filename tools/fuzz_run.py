#!/usr/bin/env python3
"""Mutation fuzzing of the import path, for long runs outside pytest.

Builds the small family of ``tests/fuzzkit.py`` (sites a, b and r; an a->b update packet
that applies, carrying blocks of a and of r, one that parks for a gap, a resync snapshot for
b), then runs N mutated packets through ``syncpack.exchange.sync.import_packets`` at a scratch copy of b
(``fuzzkit.judge``), and counts:

* **tracebacks**: any exception other than a ``PacketError`` (the CLI would print "internal
  error"), or a hang past the time limit;
* **changed on reject**: a rejected packet that changed anything in the store (digest, vector,
  blocks, changelog, packets, parked, matrix, links, acknowledgements, meta);
* **bad apply**: an accepted packet after which ``fsck`` fails, whose blocks are not kept as
  they arrived, or (for mutations that were not re-signed) whose state differs from the
  original packet's; an outcome an edit must not get (see below);
* and the outcomes: rejected (by error class), applied, parked, duplicate; a mutant of the
  gap packet that parks is then applied or refused when the genuine update packet fills the
  gap ("parked, then ..."), and judged again.

Mutations (chosen at random, reproducible with --seed): byte flips, byte sets, truncations,
insertions, cut-outs (not re-signed); header field edits re-signed with the sender's key; body
edits re-signed with a consistent body hash.  For update packets the body edits are the block
edits of ``tests/fuzzkit.py`` (``edit_update_body``): a's own blocks re-made with edited ops or
columns and signed with a's key (valid blocks), blocks signed with a key that is not their
origin's (must be refused for their signature, naming the origin), bytes changed inside blocks
(must be refused), blocks dropped, duplicated or added; the header's ranges kept in step or
not.  Snapshot bodies (one zstd stream of records): records dropped, duplicated, swapped,
fields replaced, items added; compressed, raw, with trailing junk or in two frames.  An
outcome that contradicts what an edit must get (a forged block applied, a forged signature
refused for another reason) counts as a bad apply.

Usage::

    .venv/bin/python tools/fuzz_run.py               # 10,000 cases
    .venv/bin/python tools/fuzz_run.py -n 50000 --seed 3

Exits 1 if any traceback, change on reject or bad apply was seen.
"""

from __future__ import annotations

import argparse
import collections
import random
import re
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]   # this tree's syncpack, whatever is installed

import fuzzkit as tf  # noqa: E402  (the harness helpers and the world)

from syncpack.format import codec  # noqa: E402

INTERESTING = [0, 1, 2, 0x7F, 0x80, 0xFF, 0xC0, 0xC1, 0xC2, 0xC3, 0xC4, 0xC6, 0xCF, 0xD3,
               0xDC, 0xDD, 0xDE, 0xDF, 0x90, 0x9F, 0x80, 0x8F, 0xA0, 0xBF]
INTS = [0, 1, -1, 2, 7, 255, 256, 65535, 1 << 31, (1 << 32) - 1, 1 << 32, (1 << 62),
        (1 << 63) - 1, 1 << 63, (1 << 64) - 1, -(1 << 63)]


def rand_scalar(r: random.Random):
    k = r.randrange(8)
    if k == 0:
        return None
    if k == 1:
        return r.random() < 0.5
    if k == 2:
        return r.choice(INTS)
    if k == 3:
        return r.randrange(-5, 70)
    if k == 4:
        return r.randbytes(r.choice([0, 1, 8, 16, 20, 32, 33]))
    if k == 5:
        return "".join(r.choice("abc$\u00e9\u4e2d") for _ in range(r.randrange(6)))
    if k == 6:
        return r.choice([0.0, -1.5, float("inf"), float("nan")])
    return r.randrange(1 << 64)


def rand_value(r: random.Random, depth: int = 0):
    if depth < 2 and r.random() < 0.25:
        if r.random() < 0.5:
            return [rand_value(r, depth + 1) for _ in range(r.randrange(4))]
        return {str(rand_scalar(r))[:6]: rand_value(r, depth + 1) for _ in range(r.randrange(3))}
    return rand_scalar(r)


def mutate_bytes(r: random.Random, raw: bytes) -> bytes:
    data = bytearray(raw)
    for _ in range(r.randrange(1, 5)):
        n = len(data)
        if not n:
            break
        region = r.random()
        if region < 0.4:
            pos = n - 1 - r.randrange(min(n, 400))          # header and footer
        elif region < 0.5:
            pos = r.randrange(min(n, 40))                   # prefix and body start
        else:
            pos = r.randrange(n)
        k = r.randrange(6)
        if k in (0, 1):
            data[pos] ^= r.randrange(1, 256)
        elif k == 2:
            data[pos] = r.choice(INTERESTING)
        elif k == 3:
            del data[pos:]
        elif k == 4:
            data[pos:pos] = r.randbytes(r.randrange(1, 65))
        else:
            del data[pos:pos + r.randrange(1, 65)]
    return bytes(data)


def edit_header(r: random.Random, h: dict) -> list:
    done = []
    for _ in range(r.randrange(1, 4)):
        key = r.choice(tf.HEADER_KEYS)
        cur = h.get(key)
        k = r.randrange(5)
        if k == 0:
            h.pop(key, None)
            done.append((key, "delete"))
        elif k == 1:
            h[key] = rand_value(r)
            done.append((key, "replace"))
        elif type(cur) is int:
            h[key] = min(max(cur + r.choice([-2, -1, 1, 2, 1 << 32, 1 << 63]), -(1 << 63)),
                         (1 << 64) - 1)
            done.append((key, "tweak"))
        elif isinstance(cur, bool):
            h[key] = not cur
            done.append((key, "flip"))
        elif isinstance(cur, bytes) and cur:
            b = bytearray(cur)
            b[r.randrange(len(b))] ^= 1 << r.randrange(8)
            h[key] = bytes(b)
            done.append((key, "bit"))
        elif isinstance(cur, list) and cur:
            cur = [list(x) if isinstance(x, list) else x for x in cur]
            i = r.randrange(len(cur))
            if isinstance(cur[i], list) and cur[i] and r.random() < 0.8:
                j = r.randrange(len(cur[i]))
                old = cur[i][j]
                cur[i][j] = (old + r.choice([-1, 1, 2]) if type(old) is int and old + 2 < (1 << 64)
                             and old - 1 >= -(1 << 63) else rand_scalar(r))
            elif r.random() < 0.5:
                cur.append(cur[i])
            else:
                del cur[i]
            h[key] = cur
            done.append((key, "list"))
        else:
            h[key] = rand_value(r)
            done.append((key, "replace"))
    return done


def edit_body(r: random.Random, objs: list) -> bytes:
    """A new snapshot body from its records."""
    objs = [list(o) if isinstance(o, list) else o for o in objs]
    for _ in range(r.randrange(1, 4)):
        if not objs:
            objs.append(rand_value(r))
            continue
        i = r.randrange(len(objs))
        k = r.randrange(8)
        if k == 0:
            del objs[i]
        elif k == 1:
            objs.insert(i, objs[i])
        elif k == 2:
            j = r.randrange(len(objs))
            objs[i], objs[j] = objs[j], objs[i]
        elif k in (3, 4) and isinstance(objs[i], list) and objs[i]:
            item = list(objs[i])
            item[r.randrange(len(item))] = (rand_value(r) if r.random() < 0.7
                                            else r.randrange(1 << 64))
            objs[i] = item
        elif k == 5 and isinstance(objs[i], list) and objs[i]:
            objs[i] = objs[i][:-1]
        elif k == 6 and isinstance(objs[i], list):
            objs[i] = objs[i] + [rand_scalar(r)]
        else:
            objs.insert(i, rand_value(r))
    raw = b"".join(codec.packb(o) for o in objs)
    form = r.randrange(8)
    if form == 0:
        return raw
    if form == 1:
        return tf.compress(raw) + r.randbytes(r.randrange(1, 9))
    if form == 2:
        return tf.compress(raw[: len(raw) // 2]) + tf.compress(raw[len(raw) // 2:])
    if form == 3:
        c = bytearray(tf.compress(raw))
        c[r.randrange(len(c))] ^= r.randrange(1, 256)
        return bytes(c)
    return tf.compress(raw)


class Tally:
    def __init__(self):
        self.cases = 0
        self.by_kind = collections.Counter()
        self.outcomes = collections.Counter()
        self.errors = collections.Counter()
        self.tracebacks: list[tuple] = []
        self.changed: list[tuple] = []
        self.bad_apply: list[tuple] = []

    def report(self, seconds: float) -> str:
        known = ", ".join(f"{k[len('known bug ('):-1]} {v}"
                          for k, v in sorted(self.outcomes.items()) if k.startswith("known bug"))
        lines = [f"cases: {self.cases} in {seconds:.0f}s  ("
                 + ", ".join(f"{k} {v}" for k, v in sorted(self.by_kind.items())) + ")",
                 "outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(self.outcomes.items())),
                 "rejections by class: " + ", ".join(
                     f"{k} {v}" for k, v in self.errors.most_common()),
                 f"tracebacks (non-PacketError exceptions, hangs): {len(self.tracebacks)}"
                 + (f" (besides known bugs, each with an xfail test: {known})" if known
                    else ""),
                 f"store changed by a rejected packet: {len(self.changed)}",
                 f"bad applies (fsck fails, differs from the original, or an outcome the "
                 f"edit must not get): {len(self.bad_apply)}"]
        for title, items in (("TRACEBACK", self.tracebacks), ("CHANGED", self.changed),
                             ("BAD APPLY", self.bad_apply)):
            seen = set()
            for case, kind, msg in items:
                key = msg.strip().splitlines()[-1] if msg.strip() else msg
                if key in seen:
                    continue
                seen.add(key)
                lines.append(f"{title} case {case} ({kind}):\n    " + msg.strip().replace(
                    "\n", "\n    "))
        return "\n".join(lines)


def classify(w, case: int, kind: str, name: str, data: bytes, exact: bool, tally: Tally,
             failures_dir: Path, expect: str = "any", origin: bytes | None = None) -> None:
    try:
        v = tf.judge(w, name, data, exact, expect, origin)
    except Exception:  # noqa: BLE001 - that is what we count
        tally.tracebacks.append((case, kind, traceback.format_exc()))
        (failures_dir / f"traceback-{case}.spk").write_bytes(data)
        tally.outcomes["traceback"] += 1
        w.dirty = True
        return
    tally.outcomes[v.outcome] += 1
    if v.outcome.startswith("known bug"):
        (failures_dir / f"known-{case}.spk").write_bytes(data)
        return
    if v.outcome == "rejected":
        cls = v.reader
        if cls == "ok":   # the reader passed it: refused while applying (blocks, ranges, ...)
            msg = re.sub(r"\d+|\b[0-9a-f]{16}\b", "N", v.result["rejected"][0]["error"])
            cls = f"at apply ({msg.split(': ', 1)[-1].split(';')[0][:60]})"
        tally.errors[cls] += 1
        if v.changed:
            tally.changed.append((case, kind, f"changed {v.changed}: "
                                              f"{v.result['rejected'][0]['error']}"))
            (failures_dir / f"changed-{case}.spk").write_bytes(data)
            w.dirty = True
    if v.bad:
        tally.bad_apply.append((case, kind, f"{v.bad}: {v.result}"))
        (failures_dir / f"bad-{case}.spk").write_bytes(data)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", "--cases", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--dir", help="work directory (default: a new temporary one)")
    a = ap.parse_args(argv)
    seed = a.seed if a.seed is not None else random.randrange(1 << 30)
    r = random.Random(seed)
    root = Path(a.dir) if a.dir else Path(tempfile.mkdtemp(prefix="syncpack-fuzz-"))
    root.mkdir(parents=True, exist_ok=True)
    failures = root / "failures"
    failures.mkdir(exist_ok=True)
    w = tf.build_world(root / "world")
    snapshot_items = tf.body_objects(w.corpus["snapshot"])
    ch = tf.RandomChooser(r, lambda: rand_value(r))
    names = list(w.corpus)
    tally = Tally()
    t0 = time.monotonic()
    case = 0
    while tally.cases < a.cases:
        case += 1
        name = r.choice(names)
        raw = w.corpus[name]
        k = r.random()
        expect, origin = "any", None
        try:
            if k < 0.4:
                kind, exact = "bytes", True
                data = mutate_bytes(r, raw)
                if data == raw:
                    continue
            elif k < 0.65:
                kind = "header"
                signer = w.key_a if r.random() < 0.85 else w.key_b
                done: list = []
                data = tf.resign(raw, signer, edit=lambda h: done.extend(edit_header(r, h)))
                fields = {x[0] for x in done}
                exact = signer is w.key_a and fields <= {
                    "created", "seq", "part", "final", "recv_seq", "waiting", "ack_floor",
                    "hlc_max", "id", "opt", "reply", "extra"} | (
                    {"vector"} if name != "snapshot" else set())
            elif name == "snapshot":
                kind, exact = "body", False
                data = tf.resign(raw, w.key_a, body=edit_body(r, snapshot_items))
            else:
                e = tf.edit_update_body(ch, w, name)
                kind, exact, expect, origin = f"blocks:{e.kind}", False, e.expect, e.origin
                data = tf.resigned_update(w, name, e, fix=r.random() < 0.7)
        except (TypeError, ValueError, OverflowError, tf.Unmakeable):
            continue          # the edit does not encode: not a packet anyone can make
        tally.cases += 1
        tally.by_kind[kind] += 1
        classify(w, case, f"{kind} of {name}", name, data, exact, tally, failures, expect,
                 origin)
        if tally.cases % 1000 == 0:
            print(f"... {tally.cases} cases, {len(tally.tracebacks)} tracebacks",
                  file=sys.stderr, flush=True)
    took = time.monotonic() - t0
    print(f"fuzz_run: seed {seed}, work dir {root}")
    print(tally.report(took))
    bad = tally.tracebacks or tally.changed or tally.bad_apply
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
