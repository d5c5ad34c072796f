#!/usr/bin/env python3
"""Regenerate the golden blocks of format v2 in ``formats/vectors/v2-block-*``.

Deterministic: the keys, site ids, family id and clocks are those of the packet vectors
(``tools/make_vectors.py``), the ops are written by hand, Ed25519 (RFC 8032) is deterministic and
the body is compressed with the writers' zstd setting (``blocks.ZSTD_PARAMS``; the zstd library
version is recorded as ``zstd_library``).  Each vector is ``NAME.bin`` (one block, exactly as an
origin writes it) and ``NAME.json`` (what a reader must find in it: layout, every header field,
the signed message, the block hash, the decompressed columns and the ops).
``formats/BLOCKS.md`` is the specification; ``tests/test_blocks.py`` reads these files and
reproduces them byte for byte by calling :func:`write_vectors`.

Usage::

    python tools/make_block_vectors.py                  # rewrite formats/vectors/v2-block-*
    python tools/make_block_vectors.py --out DIR        # write elsewhere (e.g. to compare)
    python tools/make_block_vectors.py --hexdump NAME   # print the dump used in BLOCKS.md
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import msgpack  # noqa: E402
import zstandard  # noqa: E402

from syncpack.format import blocks, codec, values  # noqa: E402
from syncpack.format.codec import Op  # noqa: E402
from syncpack.format.csn import pack_csn  # noqa: E402


def _packet_generator():
    # The identities and clocks of the packet vectors, so blocks and packets show the same sites.
    spec = importlib.util.spec_from_file_location("make_vectors", ROOT / "tools" / "make_vectors.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("make_vectors", mod)
    spec.loader.exec_module(mod)
    return mod


pv = _packet_generator()
A, C = pv.A, pv.C
FAMILY_ID = pv.FAMILY_ID
VECTOR_DIR = ROOT / "formats" / "vectors"
PREFIX = "v2-block-"
signing_key, public_key, hlc, val = pv.signing_key, pv.public_key, pv.hlc, pv.val


# --- the hand-made ops ------------------------------------------------------------------------

T1, T2, T3, T4 = hlc(1_000), hlc(2_000), hlc(2_000, 1), hlc(3_000)
T5, T6 = hlc(9_000), hlc(9_500)


def basic_ops() -> list[Op]:
    """alpha's first block, epochs 1..6 in three transactions: a two-op transaction in two
    collections, an overwrite naming the version it replaced and a delete in one transaction
    one logical tick later, then a unicode key with an empty value."""
    return [
        Op(A, 1, T1, 0, "notes", "n1", val({"text": "hello"}), b""),
        Op(A, 2, T1, 1, "tasks", "t1", val({"done": False}), b""),
        Op(A, 3, T3, 0, "notes", "n1", val({"text": "hello, world"}), pack_csn(T1, A, 0)),
        Op(A, 4, T3, 1, "notes", "n2", None, b""),
        Op(A, 5, T3, 2, "tasks", "t1", val({"done": True}), pack_csn(T1, A, 1)),
        Op(A, 6, T4, 0, "notes", "ключ-κλειδί-鍵", b"", b""),
    ]


def next_ops() -> list[Op]:
    """alpha's second block, epochs 7..8 (one transaction), chained to the first."""
    return [
        Op(A, 7, T5, 0, "notes", "n3", val("second block"), b""),
        Op(A, 8, T5, 1, "notes", "n1", None, pack_csn(T3, A, 0)),
    ]


T7 = hlc(10_000)


def split_ops() -> list[Op]:
    """alpha's third transaction, epochs 9..13, too large for the medium it must cross: it
    travels as two parts, epochs 9..11 (flag MORE) and 12..13 (flag CONT, first seq 3)."""
    return [Op(A, 9 + i, T7, i, "blobs", f"b{i}", val({"chunk": i}), b"") for i in range(5)]


def charlie_ops() -> list[Op]:
    """charlie's first block: one op, the smallest block there is."""
    return [Op(C, 1, T6, 0, "notes", "c1", val(1), b"")]


T8, T9 = hlc(11_000), hlc(12_000)
PATCH_BASE = {"name": "bolt", "qty": 1, "bin": "A1", "note": "zinc plated"}
PATCH_NEW = {"name": "bolt", "qty": 2, "bin": "A1", "colour": "grey"}


def patch_ops() -> list[Op]:
    """charlie's second block: a record of a merge collection, then a write that sends only
    the fields it changed (formats/VALUES.md): qty set, colour added, note removed."""
    packed = lambda d: {k: codec.packb(v) for k, v in d.items()}    # noqa: E731
    patch = values.make_patch(packed(PATCH_BASE), packed(PATCH_NEW))
    return [Op(C, 2, T8, 0, "parts", "p1", val(PATCH_BASE), b""),
            Op(C, 3, T9, 0, "parts", "p1", patch, pack_csn(T8, C, 0))]


# --- writing ----------------------------------------------------------------------------------

def _hex(obj: Any) -> Any:
    if isinstance(obj, bytes):
        return obj.hex()
    if isinstance(obj, (list, tuple)):
        return [_hex(v) for v in obj]
    return obj


def _op_json(op: Op) -> dict:
    return {"epoch": op.epoch, "hlc": op.hlc, "seq": op.seq, "csn": op.csn.hex(),
            "collection": op.collection, "key": op.key,
            "value": None if op.value is None else op.value.hex(),
            "replaced": [op.replaced[i:i + 20].hex() for i in range(0, len(op.replaced), 20)]}


def _describe(name: str, raw: bytes, signer: str, description: str, ops: list[Op]) -> dict:
    info = blocks.verify_block(raw, public_key(signer), FAMILY_ID,
                               None if raw[14:22] != bytes(8) else blocks.ZERO_HASH)
    columns = msgpack.unpackb(zstandard.ZstdDecompressor().decompress(bytes(info.body)),
                              raw=False)
    return {
        "file": f"{name}.bin",
        "description": description,
        "format": "v2 (formats/BLOCKS.md): what update packets carry and the store keeps",
        "zstd_library": ".".join(map(str, zstandard.ZSTD_VERSION)),
        "zstd_params": {"level": blocks.ZSTD_LEVEL, "min_match": blocks.ZSTD_PARAMS.min_match},
        "signer": signer,
        "signer_ed25519": public_key(signer).hex(),
        "family": FAMILY_ID.hex(),
        "layout": {"size": len(raw), "header_len": blocks.SIGNED_LEN,
                   "signature_offset": blocks.SIGNED_LEN, "body_offset": blocks.HEADER_LEN,
                   "body_len": info.body_len},
        "header": {"magic": blocks.MAGIC.hex(), "version": blocks.VERSION, "flags": info.flags,
                   "origin": info.origin.hex(), "lo": info.lo, "hi": info.hi,
                   "txns": info.txns, "hlc_first": info.hlc_first, "hlc_last": info.hlc_last,
                   "prev_hash": info.prev_hash.hex(), "body_hash": info.body_hash.hex(),
                   "raw_len": info.raw_len, "body_len": info.body_len},
        "signed_message": blocks.signed_bytes(FAMILY_ID, info.header).hex(),
        "signature": info.signature.hex(),
        "block_hash": info.block_hash.hex(),
        "columns": _hex(columns),
        "ops": [_op_json(op) for op in ops],
    }


def write_vectors(directory: Path) -> list[str]:
    """Write every vector into ``directory``; returns the names (without extension)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    sign_a, sign_c = signing_key("alpha").sign, signing_key("charlie").sign
    docs: dict[str, dict] = {}
    out: dict[str, bytes] = {}

    name = PREFIX + "basic"
    ops = basic_ops()
    out[name] = blocks.encode_block(FAMILY_ID, A, blocks.ZERO_HASH, ops, sign_a)
    docs[name] = _describe(name, out[name], "alpha", "alpha's first block: epochs 1..6 in 3 "
                           "transactions, 2 collections, replaced CSNs, a delete, a unicode key "
                           "with an empty value; prev_hash zero", ops)

    name = PREFIX + "next"
    prev = bytes.fromhex(docs[PREFIX + "basic"]["block_hash"])
    ops = next_ops()
    out[name] = blocks.encode_block(FAMILY_ID, A, prev, ops, sign_a)
    docs[name] = _describe(name, out[name], "alpha", "alpha's second block: epochs 7..8, one "
                           "transaction; prev_hash is the block hash of v2-block-basic", ops)

    prev = bytes.fromhex(docs[PREFIX + "next"]["block_hash"])
    ops = split_ops()
    name = PREFIX + "part1"
    out[name] = blocks.encode_block(FAMILY_ID, A, prev, ops[:3], sign_a, more=True)
    docs[name] = _describe(name, out[name], "alpha", "the first part of alpha's third "
                           "transaction: epochs 9..11, flags 01 (MORE: it continues in the next "
                           "block); prev_hash is the block hash of v2-block-next", ops[:3])
    prev = bytes.fromhex(docs[name]["block_hash"])
    name = PREFIX + "part2"
    out[name] = blocks.encode_block(FAMILY_ID, A, prev, ops[3:], sign_a)
    docs[name] = _describe(name, out[name], "alpha", "the last part of that transaction: "
                           "epochs 12..13, flags 02 (CONT: it began in the previous block), the "
                           "tenth body element 3 is the seq of its first op", ops[3:])

    name = PREFIX + "charlie"
    ops = charlie_ops()
    out[name] = blocks.encode_block(FAMILY_ID, C, blocks.ZERO_HASH, ops, sign_c)
    docs[name] = _describe(name, out[name], "charlie", "charlie's first block: one op", ops)

    name = PREFIX + "patch"
    prev = bytes.fromhex(docs[PREFIX + "charlie"]["block_hash"])
    ops = patch_ops()
    out[name] = blocks.encode_block(FAMILY_ID, C, prev, ops, sign_c)
    docs[name] = _describe(name, out[name], "charlie", "charlie's second block: a record, then "
                           "a write over it sending only the fields it changed (a patch, "
                           "formats/VALUES.md); prev_hash is the block hash of "
                           "v2-block-charlie", ops)
    setf, removed = values.read_patch(ops[1].value)
    base = {k: codec.packb(v) for k, v in PATCH_BASE.items()}
    record = values.encode_fields(values.patched(base, setf, removed))
    docs[name]["patch"] = {"ext_type": values.PATCH_EXT, "version": values.PATCH_VERSION,
                           "set": {k: codec.unpackb(v) for k, v in setf.items()},
                           "removed": removed, "record": codec.decode_value(record),
                           "record_bytes": record.hex()}

    for n in docs:
        (directory / f"{n}.bin").write_bytes(out[n])
        (directory / f"{n}.json").write_text(json.dumps(docs[n], indent=1, ensure_ascii=False)
                                             + "\n")
    return sorted(docs)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=VECTOR_DIR)
    ap.add_argument("--hexdump", metavar="NAME", help="print the dump of vector NAME")
    args = ap.parse_args(argv)
    if args.hexdump:
        data = (args.out / f"{args.hexdump}.bin").read_bytes()
        print(pv.hexdump(data, 0, len(data)))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    for old in args.out.glob(PREFIX + "*"):
        old.unlink()
    for n in write_vectors(args.out):
        print(f"wrote {n}.bin and {n}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
