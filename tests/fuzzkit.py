"""The fuzzing harness of the import path, as a library: the small family every case runs
against (:func:`build_world`), the mutators (bytes, re-signed header and body edits, blocks
re-made with edited ops or columns), and the judge that decides whether an outcome is a typed
refusal that changed nothing or a correct apply.

``tests/test_fuzz.py`` draws cases with Hypothesis; ``tools/fuzz_run.py`` runs many more
outside pytest.  Both import this module; neither copies it."""

from __future__ import annotations

import hashlib
import io
import shutil
import signal
import struct
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import msgpack
import zstandard
from hypothesis import HealthCheck, note as _note, strategies as st
from hypothesis.errors import InvalidArgument

from conftest import Family

from syncpack.admin import inspection
from syncpack.exchange import replica, sync, verify
from syncpack.format import blocks, codec, keys
from syncpack.format.codec import Op
from syncpack.errors import PacketError
from syncpack import site as site_mod
from syncpack.site import SYS_PREFIX, Site

VECTORS = Path(__file__).resolve().parents[1] / "formats" / "vectors"
FOOTER = struct.Struct(">I64s4s")
SETTINGS = dict(deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.data_too_large, HealthCheck.filter_too_much])
HANG_SECONDS = 20


def note(text: str) -> None:
    """Hypothesis' note, also usable outside a test (tools/fuzz_run.py imports this module)."""
    try:
        _note(text)
    except InvalidArgument:
        pass


# --- taking packets apart and putting them back together ---------------------------------------

@dataclass
class Split:
    prefix: bytes
    body: bytes
    header: dict
    version: int


def split(raw: bytes) -> Split:
    env = codec.read_envelope(io.BytesIO(raw), len(raw))
    body = raw[env.body_offset:env.body_offset + env.header.body_len]
    return Split(raw[:env.body_offset], body, msgpack.unpackb(env.header_bytes, raw=False,
                                                             strict_map_key=False), env.version)


def assemble(prefix: bytes, body: bytes, header_bytes: bytes, sig: bytes) -> bytes:
    return prefix + body + header_bytes + FOOTER.pack(len(header_bytes), sig, codec.END_MAGIC)


def resign(raw: bytes, key, edit=None, body: bytes | None = None) -> bytes:
    """Rebuild ``raw`` with its header edited (``edit(header_dict)``) and/or a new body, signed
    with ``key`` so the signature is valid again."""
    p = split(raw)
    h = p.header
    if body is not None:
        h["body_len"] = len(body)
        h["body_hash"] = hashlib.blake2b(body, digest_size=32).digest()
    if edit is not None:
        edit(h)
    hb = codec.packb(h)
    return assemble(p.prefix, p.body if body is None else body, hb,
                    key.sign(codec.signed_bytes(p.version, hb)))


def compress(raw: bytes) -> bytes:
    return zstandard.ZstdCompressor(level=3).compress(raw)


def body_objects(raw: bytes) -> list:
    """The msgpack items of a (trusted, unsealed) snapshot body."""
    data = zstandard.ZstdDecompressor().decompressobj().decompress(split(raw).body)
    return list(msgpack.Unpacker(io.BytesIO(data), raw=False, strict_map_key=False))


# --- blocks, as a member who forges them sees them ---------------------------------------------

# The signed block header as formats/BLOCKS.md 3.1 lays it out, read here on its own rather
# than through syncpack.format.blocks, so that a forger's view and the reader's can disagree.
BLOCK_HEADER = struct.Struct(">4sBB8sQQIQQ32s32sII")
BLOCK_FIELDS = ("magic", "version", "flags", "origin", "lo", "hi", "txns", "hlc_first",
                "hlc_last", "prev_hash", "body_hash", "raw_len", "body_len")
FIELD_SPAN = {"magic": (0, 4), "version": (4, 1), "flags": (5, 1), "origin": (6, 8),
              "lo": (14, 8), "hi": (22, 8), "txns": (30, 4), "hlc_first": (34, 8),
              "hlc_last": (42, 8), "prev_hash": (50, 32), "body_hash": (82, 32),
              "raw_len": (114, 4), "body_len": (118, 4), "signature": (122, 64)}
HEADER_LEN = 186
assert BLOCK_HEADER.size == blocks.SIGNED_LEN and HEADER_LEN == blocks.HEADER_LEN


class Unmakeable(Exception):
    """The drawn edit has no bytes: msgpack, struct or encode_block refuses it, as they would
    refuse the forger."""


def fields_of(block: bytes) -> dict:
    return dict(zip(BLOCK_FIELDS, BLOCK_HEADER.unpack_from(block)))


def origin_of(block: bytes) -> bytes:
    return bytes(block[6:14])


def body_blocks(raw: bytes) -> list[bytes]:
    return list(blocks.split_blocks([split(raw).body]))


def block_columns(block: bytes) -> list:
    """The nine columns of a genuine block, as plain msgpack data to edit."""
    raw = zstandard.ZstdDecompressor().decompress(bytes(block[HEADER_LEN:]))
    return msgpack.unpackb(raw, raw=False)


def frame(raw: bytes, form: str = "zstd") -> bytes:
    """``raw`` as a block body: the writers' frame (content size declared) or one a reader
    must refuse."""
    if form == "plain":
        return raw
    if form == "no-size":
        return zstandard.ZstdCompressor(level=3, write_content_size=False).compress(raw)
    if form == "checksum":       # allowed: readers accept a zstd checksum
        return zstandard.ZstdCompressor(level=3, write_checksum=True).compress(raw)
    if form == "junk":
        return compress(raw) + b"\x00junk"
    if form == "two-frames":
        return compress(raw[:len(raw) // 2]) + compress(raw[len(raw) // 2:])
    return compress(raw)


def sign_block(fields: dict, body: bytes, key, family: bytes, raw_len: int | None) -> bytes:
    """A block of ``body`` under ``fields`` with a matching body hash and length (and raw_len,
    when given), signed by ``key``: what any member can make, whatever ``fields`` claim."""
    f = dict(fields, body_hash=hashlib.blake2b(body, digest_size=32).digest(),
             body_len=len(body))
    if raw_len is not None:
        f["raw_len"] = raw_len
    try:
        header = BLOCK_HEADER.pack(*(f[k] for k in BLOCK_FIELDS))
    except struct.error as e:
        raise Unmakeable(f"header: {e}") from None
    return header + key.sign(blocks.signed_bytes(family, header)) + body


def walk(body: bytes) -> list[dict]:
    """The header fields of each block in ``body``, as far as their lengths lead."""
    out, off = [], 0
    while off + HEADER_LEN <= len(body):
        f = fields_of(body[off:])
        out.append(f)
        off += HEADER_LEN + f["body_len"]
    return out


def fix_ranges(h: dict, body: bytes, key=None) -> None:
    """Bring a wire header in step with the blocks of ``body``, as a careful liar would: each
    origin's range spans its blocks (origins with none left lose theirs), the op count, the
    sender's vector and hlc_max follow, and anchors stay only where a range still starts where
    it did.  The sender's own acknowledgement covers its vector: with the sender's ``key``
    it is signed again when the vector grew."""
    origins = list(h["origins"])
    spans: dict[bytes, list[int]] = {}
    top = 0
    for f in walk(body):
        s = spans.setdefault(f["origin"], [f["lo"], f["hi"]])
        s[0], s[1] = min(s[0], f["lo"]), max(s[1], f["hi"])
        top = max(top, f["hlc_last"])
    origins += [o for o in spans if o not in origins]
    before = {r[0]: r[1] for r in h["ranges"]}
    ranges = {origins.index(o): s for o, s in spans.items()}
    h["origins"] = origins
    h["ranges"] = sorted([i, lo, hi] for i, (lo, hi) in ranges.items())
    h["count"] = sum(hi - lo for lo, hi in ranges.values())
    vec = {i: e for i, e in h["vector"]}
    for i, (_lo, hi) in ranges.items():
        vec[i] = max(vec.get(i, 0), hi)
    if key is not None and sorted([i, e] for i, e in vec.items()) != sorted(h["vector"]):
        mine = {origins[i]: e for i, e in vec.items()}
        for a in h.get("acks", []):
            if origins[a[0]] == h["from"] and a[2] is None:
                a[3] = key.sign(codec.ack_signed_bytes(h["family"], h["from"], a[1], mine))
    h["vector"] = sorted([i, e] for i, e in vec.items())
    h["anchors"] = [[i, c] for i, c in h.get("anchors", [])
                    if i in ranges and before.get(i) == ranges[i][0]]
    if top:
        h["hlc_max"] = top


# --- the store's full state, to prove a rejection changed nothing ------------------------------

def fingerprint(path: Path) -> dict:
    with Site.open(path) as s:
        c = s.conn
        q = lambda sql: sorted(c.execute(sql).fetchall())  # noqa: E731
        return {
            "digest": s.digest()[0],
            "vector": q("SELECT * FROM vector"),
            "blocks": q("SELECT origin, lo, hi, hlc_first, hlc_last, last_seq, hash FROM blocks"),
            "changelog": c.execute("SELECT count(*), max(hlc) FROM changelog").fetchone(),
            "stash": q("SELECT origin, epoch FROM stash"),
            "versions": c.execute("SELECT count(*) FROM versions").fetchone()[0],
            "superseded": q("SELECT * FROM superseded"),
            "tomb_pending": q("SELECT * FROM tomb_pending"),
            "packets_in": q("SELECT packet_id FROM packets_in"),
            "parked": q("SELECT packet_id, file FROM parked"),
            "parked_files": sorted(p.name for p in (path / "parked").iterdir()),
            "matrix": q("SELECT * FROM matrix"),
            "links": q("SELECT * FROM links"),
            "acks": q("SELECT member, created_ms FROM acks"),
            "own_acks": q("SELECT member, epoch, created_ms FROM own_acks"),
            "acks_told": q("SELECT * FROM acks_told"),
            "meta": q("SELECT * FROM meta"),
        }


def semantic(fp: dict) -> tuple:
    return fp["digest"], fp["vector"], fp["blocks"], fp["changelog"]


@contextmanager
def time_limit(seconds: float):
    def boom(signum, frame):
        raise TimeoutError(f"no answer within {seconds}s: a hang")
    old = signal.signal(signal.SIGALRM, boom)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def read_all(path: Path, site: Site | None = None) -> str:
    """The reader alone: framing, verification (with a site), the whole body.  Returns the
    PacketError class name, or 'ok'; any other exception propagates."""
    try:
        pk = verify.open_packet(path)
    except PacketError as e:
        return type(e).__name__
    try:
        if site is not None:
            verify.verify(site, pk)
        elif not codec.body_hash_matches(pk.f, pk.env):
            return "hash"
        if pk.header.kind == codec.KIND_SNAPSHOT and pk.header.piece is not None:
            codec.read_record_piece(pk.f, pk.env)
        elif pk.header.kind == codec.KIND_SNAPSHOT:
            for _ in codec.iter_records(pk.f, pk.env):
                pass
        else:
            for _ in blocks.packet_ops(pk.f, pk.env):
                pass
        return "ok"
    except PacketError as e:
        return type(e).__name__
    finally:
        pk.close()


# --- the world --------------------------------------------------------------------------------

@dataclass
class World:
    root: Path
    pristine: Path                      # site b, never touched after setup
    scratch: Path                       # site b, reset after every change
    key_a: object                       # a's signing key (the sender)
    key_b: object
    corpus: dict[str, bytes] = field(default_factory=dict)
    ref: dict[str, tuple] = field(default_factory=dict)      # semantic state after a clean import
    outcome: dict[str, str] = field(default_factory=dict)
    dirty: bool = False
    seed_c: bytes = b""                 # the snapshot that creates site c
    c_pristine: Path | None = None      # c after keygen, before mkreplica import
    key_r: object = None                # r's: a relays r's blocks and cannot sign them
    family: bytes = b""
    ids: dict[str, bytes] = field(default_factory=dict)      # member name -> site id
    blocks: dict[str, list[bytes]] = field(default_factory=dict)   # of "update" and "gap"
    csns: list[bytes] = field(default_factory=list)          # of every op a and r sent, and b's
    system: list[tuple] = field(default_factory=list)        # b's $-collection versions

    def reset(self) -> None:
        shutil.rmtree(self.scratch)
        shutil.copytree(self.pristine, self.scratch)
        self.dirty = False

    def key(self, name: str):
        return {"a": self.key_a, "b": self.key_b, "r": self.key_r}[name]

    def name_of(self, site_id: bytes) -> str:
        return {v: k for k, v in self.ids.items()}.get(site_id, site_id.hex())


def build_world(root: Path) -> World:
    fam = Family(root)
    fam.init("a")
    fam.add("b", via="a")
    fam.add("r", via="a")      # b learns of r from a roster op inside the update packet
    with fam.open("r") as s, s.transaction() as tx:
        tx.put("parts", "p000", {"qty": -1, "by": "r"})
        tx.put("notes", "n1", "from r")
    fam.sync("r", "a")
    with fam.open("a") as s:
        with s.transaction() as tx:
            for i in range(12):
                tx.put("parts", f"p{i:03d}", {"qty": i, "name": "bolt" * (i % 3)})
    fam.export("a", "r")       # seals a's pending ops: the update packet holds several a blocks
    with fam.open("a") as s:
        with s.transaction() as tx:
            tx.put("parts", "p001", {"qty": 100})
            tx.delete("parts", "p002")
            tx.put("tools", "t1", [1, 2.5, "x", None, True])
        with s.transaction() as tx:
            tx.put("parts", "p003", {"qty": -3, "blob": "\x00\x01"})
        # one transaction sealed as three parts (formats/BLOCKS.md, 4.2), all in the packet:
        # applied part by part as they arrive, which a damaged part must not split
        part_ops, site_mod.PART_OPS = site_mod.PART_OPS, 4
        try:
            with s.transaction() as tx:
                tx.write_columns("bulk", [f"q{i:02d}" for i in range(10)],
                                 [codec.encode_value({"n": i}) for i in range(10)])
        finally:
            site_mod.PART_OPS = part_ops
    p1 = fam.export("a", "b")
    with fam.open("a") as s, s.transaction() as tx:
        for i in range(5):
            tx.put("tools", f"t{i + 2}", {"n": i})
    p2 = fam.export("a", "b")
    d = fam.medium()
    with fam.open("a") as s:
        snap = replica.resync_export(s, "b", d)
    # a replica-creation packet for a new site c (mkreplica import is fuzzed on its own)
    c_site, c_pub = Site.keygen(root / "c_pristine", "c")
    c_site.close()
    d = fam.medium()
    with fam.open("a") as s:
        seed_c = replica.mkreplica_export(s, "c", c_pub, d)
    w = World(root, fam.path("b"), root / "scratch", keys.load_signing_key(fam.path("a")),
              keys.load_signing_key(fam.path("b")))
    w.key_r = keys.load_signing_key(fam.path("r"))
    for n in ("a", "b", "r"):
        with fam.open(n) as s:
            w.ids[n] = s.site_id
            w.family = s.family_id
    assert len(p1) == 1 and len(p2) == 1 and len(snap) == 1 and len(seed_c) == 1
    w.corpus = {"update": p1[0].read_bytes(), "gap": p2[0].read_bytes(),
                "snapshot": snap[0].path.read_bytes()}
    w.blocks = {n: body_blocks(w.corpus[n]) for n in ("update", "gap")}
    origins = [origin_of(b) for b in w.blocks["update"]]
    assert w.ids["r"] in origins and origins.count(w.ids["a"]) >= 3, origins
    assert [blocks.read_block_header_flags(b) for b in w.blocks["update"]
            if blocks.read_block_header_flags(b)] == [1, 3, 2]     # the parts, in order
    with Site.open(w.pristine) as s:
        rows = s.conn.execute("SELECT collection, key, csn, value FROM versions").fetchall()
    w.system = [r for r in rows if r[0].startswith(SYS_PREFIX)]
    w.csns = [r[2] for r in rows] + [op.csn for bl in w.blocks.values() for b in bl
                                     for op in blocks.decode_ops(b)]
    w.seed_c = seed_c[0].path.read_bytes()
    w.c_pristine = root / "c_pristine"
    shutil.copytree(w.pristine, w.scratch)
    for name, raw in w.corpus.items():
        f = root / f"clean-{name}.spk"
        f.write_bytes(raw)
        with Site.open(w.scratch) as s:
            res = sync.import_packets(s, [f])
        w.outcome[name] = ("applied" if res.applied else "parked" if res.parked else
                           "rejected" if res.rejected else "duplicate")
        w.ref[name] = semantic(fingerprint(w.scratch))
        w.reset()
    assert w.outcome == {"update": "applied", "gap": "parked", "snapshot": "applied"}, w.outcome
    with Site.open(w.scratch) as s:
        res = sync.import_packets(s, [root / "clean-gap.spk", root / "clean-update.spk"])
    assert len(res.applied) == 2, res.to_json()
    w.ref["update+gap"] = semantic(fingerprint(w.scratch))
    w.reset()
    return w



def fsck_findings(doc: dict, resigned_snapshot: bool) -> list[str]:
    """fsck problems after an accepted packet.  Known and left open: a snapshot re-signed by a
    member may carry a version whose CSN names an origin missing from its vector; it is applied
    and fsck then reports "version ... has no changelog op" (the snapshot is the sender's word;
    rejecting such versions would also refuse a genuine snapshot from a site whose own ops are
    set aside after a restore)."""
    return [p for p in doc["problems"]
            if not (resigned_snapshot and p.startswith("version ") and
                    p.endswith("has no changelog op"))]


@dataclass
class Verdict:
    outcome: str                # rejected, applied, parked or duplicate
    reader: str                 # read_all's answer
    result: dict                # the import's result
    changed: list[str] = field(default_factory=list)   # what a rejected packet changed
    bad: list[str] = field(default_factory=list)       # what is wrong with an outcome


def stored_as_sent(w: World, data: bytes, vector: dict[bytes, int]) -> list[str]:
    """Every block of an applied update packet that extends what b held is kept byte for byte
    (relays pass blocks on unchanged)."""
    problems = []
    with Site.open(w.scratch) as s:
        for b in body_blocks(data):
            f = fields_of(b)
            if f["hi"] <= vector.get(f["origin"], 0):
                continue
            row = s.conn.execute("SELECT data FROM blocks WHERE origin=? AND hi=?",
                                 (f["origin"], f["hi"])).fetchone()
            if row is None or bytes(row[0]) != b:
                problems.append(f"block of {w.name_of(f['origin'])} (epochs {f['lo'] + 1}.."
                                f"{f['hi']}) is not kept as it arrived")
    return problems


def stage_input(w: World, name: str, data: bytes) -> tuple[Path, dict]:
    """``data`` as a file to import at a clean scratch copy of b, and that copy's state now."""
    if w.dirty:
        w.reset()
    f = w.root / "in" / name
    f.parent.mkdir(exist_ok=True)
    f.write_bytes(data)
    return f, fingerprint(w.scratch)


def judge(w: World, name: str, data: bytes, exact: bool, expect: str = "any",
          origin: bytes | None = None) -> Verdict:
    """Import ``data`` (a mutation of corpus packet ``name``) at the scratch copy of b and judge
    the outcome.  ``exact``: an apply must give exactly the clean packet's state (true when the
    mutation was not re-signed, so an accepted packet is the original one).  ``expect``: "any"
    (applied correctly, parked or refused), "reject" (block bytes changed without re-signing:
    refused, or parked for a later check), "signature" (a block signed without its origin's
    key: refused for its signature, naming ``origin``, or parked).  Exceptions other than a
    PacketError, and hangs, propagate."""
    f, before = stage_input(w, "mutant.spk", data)
    try:
        return _judge(w, name, f, data, before, exact, expect, origin)
    except KnownBug as e:
        bug = str(e)
    except Exception as e:
        bug = known_bug(e)
        if bug is None:
            raise
        note(f"known bug: {bug}")
    w.dirty = True
    return Verdict(f"known bug ({bug})", "?", {})


# Library bugs this fuzzing found, each with its xfail(strict=True) test: an input that runs
# into one is counted under the bug's name instead of failing every run.  When the library is
# fixed the xfail test passes, fails as strict, and its entry here goes.
KNOWN_CRASHES: dict = {}     # none open: roster recursion was fixed in Site._visible_rows
KNOWN_FINDINGS: dict = {}    # none open: blocks now refuse a replaced CSN from the op's future


class KnownBug(Exception):
    """An outcome one of the known bugs explains."""


def known_bug(e: BaseException) -> str | None:
    tb = "".join(traceback.format_exception(e))
    return next((name for name, hit in KNOWN_CRASHES.items() if hit(e, tb)), None)


def replaces_its_future(data: bytes) -> bool:
    """Some op of the packet lists as replaced a CSN at or after its own."""
    return any(op.replaced[i:i + 20] >= op.csn for b in body_blocks(data)
               for op in blocks.decode_ops(b) for i in range(0, len(op.replaced), 20))


def _judge(w: World, name: str, f: Path, data: bytes, before: dict, exact: bool, expect: str,
           origin: bytes | None) -> Verdict:
    with time_limit(HANG_SECONDS):
        with Site.open(w.scratch) as s:
            kind = read_all(f, s)
        with Site.open(w.scratch) as s:
            res = sync.import_packets(s, [f])
    out = res.to_json()
    note(f"reader: {kind}; import: {out}")
    after = fingerprint(w.scratch)
    if res.rejected:
        v = Verdict("rejected", kind, out)
        err = res.rejected[0]["error"]
        if res.applied or res.parked or len(res.rejected) != 1 or not err:
            v.bad.append("a rejection must be one error and nothing else")
        if "\n" in err.strip():
            v.bad.append("error must be one line")
        if after != before:
            v.changed = [k for k in after if after[k] != before[k]]
        # The packet's own checks (its signature, skew, acknowledgements) come before any
        # block's: a header the forger kept in step may fail there first.
        v.bad += refusal_problems(w, err, expect, origin,
                                  packet_level=kind != "ok" and not kind.startswith("Block"))
        return v
    w.dirty = True
    v = Verdict("duplicate" if res.duplicates else "parked" if res.parked else "applied",
                kind, out)
    if v.outcome in ("duplicate", "parked"):
        v.bad += fsck_problems(w, name, data, exact)
        if semantic(after) != semantic(before):
            v.bad.append(f"{v.outcome} packet changed the replicated state")
        if v.outcome == "parked" and name == "gap" and not v.bad:
            then = fill_the_gap(w, f, data, exact, expect, origin, v)
            v.outcome = then if then.startswith("known bug") else f"parked, then {then}"
        return v
    if not res.applied:
        v.bad.append("neither applied, parked, duplicate nor rejected")
    if res.forks:
        v.outcome = fork_found(w, data, exact, expect, v)
        return v
    if kind != "ok":
        v.bad.append(f"reader refused ({kind}) what import applied")
    return applied_problems(w, name, data, exact, expect, v, before, w.ref.get(name))


def refusal_problems(w: World, err: str, expect: str, origin: bytes | None,
                     packet_level: bool) -> list[str]:
    # Where a block sits is checked before whose it is: a forged block that also sits in the
    # wrong place may be refused for that first.
    if expect == "signature" and not packet_level and not (
            "signature" in err and f"origin {w.name_of(origin)} (" in err
            or "does not continue the packet's declared range" in err):
        return ["a block not signed by its origin was refused, but not for its signature "
                "naming the origin"]
    return []


def fsck_problems(w: World, name: str, data: bytes, exact: bool) -> list[str]:
    with Site.open(w.scratch) as s:
        doc = inspection.fsck(s)
    findings = fsck_findings(doc, resigned_snapshot=name == "snapshot" and not exact)
    bug = next((b for b, hit in KNOWN_FINDINGS.items()
                if findings and name != "snapshot" and hit(findings, data)), None)
    if bug is not None:
        note(f"known bug: {bug}: {findings[:3]}")
        raise KnownBug(bug)
    return [f"fsck after an accepted packet: {findings[:3]}"] if findings else []


def applied_problems(w: World, name: str, data: bytes, exact: bool, expect: str, v: Verdict,
                     before: dict, ref: tuple | None) -> Verdict:
    """What must hold once a mutant was applied: fsck passes, its blocks are kept as they
    arrived, no block its origin did not sign got in, and an unchanged packet gives the
    reference state."""
    v.bad += fsck_problems(w, name, data, exact)
    if expect != "any":
        v.bad.append("applied a packet holding a block its origin did not sign")
    if exact and semantic(fingerprint(w.scratch)) != ref:
        v.bad.append("accepted mutant applied differently")
    if name != "snapshot":
        v.bad += stored_as_sent(w, data, {r[0]: r[1] for r in before["vector"]})
    return v


def fill_the_gap(w: World, f: Path, data: bytes, exact: bool, expect: str,
                 origin: bytes | None, v: Verdict) -> str:
    """A mutant of the gap packet parked unread: the genuine update packet fills the gap, the
    mutant is applied or refused with it and is judged like any other packet."""
    clean = w.root / "in" / "clean-update.spk"
    clean.write_bytes(w.corpus["update"])
    before = fingerprint(w.scratch)
    with time_limit(HANG_SECONDS):
        with Site.open(w.scratch) as s:
            res = sync.import_packets(s, [clean])
    out = res.to_json()
    note(f"the gap filled: {out}")
    refused = [r["error"] for r in res.rejected if r["path"] == str(f)]
    if str(clean) not in res.applied or len(res.rejected) > len(refused):
        v.bad.append(f"the genuine packet was not applied beside a parked mutant: {out}")
        return "?"
    if refused:
        v.bad += refusal_problems(w, refused[0], expect, origin,
                                  packet_level=refused[0].startswith("parked packet:"))
        if semantic(fingerprint(w.scratch)) != w.ref["update"]:
            v.bad.append("a refused parked packet left changes behind")
        return "rejected"
    if str(f) not in res.applied:
        return "parked"
    if res.forks:
        return fork_found(w, data, exact, expect, v)
    applied_problems(w, "gap", data, exact, expect, v, before, w.ref["update+gap"])
    return "applied"


def fork_found(w: World, data: bytes, exact: bool, expect: str, v: Verdict) -> str:
    """The mutant, re-signed by its origin, holds another op at an epoch already held: the
    origin signed two histories, a fork found (its range left out, the evidence kept), never
    from a block its origin did not sign."""
    if expect != "any":
        v.bad.append("a fork found from a block its origin did not sign")
    v.bad += fsck_problems(w, "gap", data, exact)
    return "fork found"


def try_import(w: World, name: str, data: bytes, exact: bool, expect: str = "any",
               origin: bytes | None = None) -> str:
    """:func:`judge`, asserting that nothing is wrong; returns the outcome."""
    v = judge(w, name, data, exact, expect, origin)
    if v.outcome.startswith("known bug"):
        return v.outcome
    assert not v.changed, f"rejected packet changed the store ({v.changed}): {v.result}"
    assert not v.bad, f"{v.bad}: reader {v.reader}, import {v.result}"
    return v.outcome


# --- strategies -------------------------------------------------------------------------------

CORPUS = st.sampled_from(["update", "gap", "snapshot"])


@st.composite
def byte_mutation(draw, raw: bytes) -> bytes:
    """Flips, truncations, insertions, cut-outs; positions biased towards the header and footer
    (where the structure is) but anywhere in the file."""
    data = bytearray(raw)
    n_ops = draw(st.integers(1, 4))
    for _ in range(n_ops):
        n = len(data)
        if n == 0:
            break
        region = draw(st.sampled_from(["any", "tail", "head"]))
        if region == "tail":
            pos = n - 1 - draw(st.integers(0, min(n - 1, 400)))
        elif region == "head":
            pos = draw(st.integers(0, min(n - 1, 40)))
        else:
            pos = draw(st.integers(0, n - 1))
        what = draw(st.sampled_from(["flip", "flip", "set", "truncate", "insert", "cut"]))
        if what == "flip":
            data[pos] ^= draw(st.integers(1, 255))
        elif what == "set":
            data[pos] = draw(st.sampled_from([0, 0xFF, 0x7F, 0x80, 0xC0, 0xDC, 0xDD, 0xC6]))
        elif what == "truncate":
            del data[pos:]
        elif what == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=64))
        else:
            del data[pos:pos + draw(st.integers(1, 64))]
    return bytes(data)


SCALARS = (st.none() | st.booleans() | st.integers(-(1 << 63), (1 << 64) - 1)
           | st.integers(-3, 70) | st.binary(max_size=20) | st.text(max_size=12)
           | st.floats(allow_nan=True))
VALUES = st.recursive(SCALARS, lambda c: st.lists(c, max_size=4)
                      | st.dictionaries(st.text(max_size=6), c, max_size=3), max_leaves=10)
HEADER_KEYS = ["kind", "family", "from", "to", "id", "seq", "part", "final", "created",
               "origins", "vector", "ranges", "recv_seq", "waiting", "ack_floor", "count",
               "hlc_max", "body_len", "body_hash", "req", "opt", "roster", "seal", "anchors", "reply",
               "extra"]


@st.composite
def header_edit(draw):
    """A function editing a wire header dict in place, and a description."""
    edits = []
    for _ in range(draw(st.integers(1, 3))):
        key = draw(st.sampled_from(HEADER_KEYS))
        how = draw(st.sampled_from(["replace", "delete", "tweak", "tweak", "list"]))
        if how == "replace":
            v = draw(VALUES)
            edits.append((key, how, v))
        elif how == "tweak":
            edits.append((key, how, draw(st.sampled_from([-1, 1, 2, -2, 1 << 32, 1 << 63,
                                                          (1 << 64) - 1]))))
        elif how == "list":
            edits.append((key, how, (draw(st.integers(0, 5)), draw(st.integers(0, 3)),
                                     draw(st.integers(-2, 3) | SCALARS))))
        else:
            edits.append((key, how, None))

    def edit(h: dict) -> None:
        for key, how, v in edits:
            cur = h.get(key)
            if how == "delete":
                h.pop(key, None)
            elif how == "replace":
                h[key] = v
            elif how == "tweak":
                if type(cur) is int:
                    h[key] = min(max(cur + v, -(1 << 63)), (1 << 64) - 1)
                elif isinstance(cur, bool):
                    h[key] = not cur
                elif isinstance(cur, (bytes, str)) and cur:
                    b = bytearray(cur if isinstance(cur, bytes) else cur.encode())
                    b[v % len(b)] ^= 1
                    h[key] = bytes(b) if isinstance(cur, bytes) else b.decode(errors="replace")
                elif isinstance(cur, list):
                    h[key] = list(reversed(cur)) if v > 0 else cur + cur[:1]
                else:
                    h[key] = v
            elif how == "list" and isinstance(cur, list) and cur:
                i, j, delta = v
                item = cur[i % len(cur)]
                if isinstance(item, list) and item:
                    item = list(item)
                    old = item[j % len(item)]
                    item[j % len(item)] = (old + delta if type(old) is int and type(delta) is int
                                           and -(1 << 63) <= old + delta < (1 << 64) else delta)
                    cur = list(cur)
                    cur[i % len(cur)] = item
                    h[key] = cur
                else:
                    cur = list(cur)
                    cur[i % len(cur)] = delta
                    h[key] = cur
    return edit, edits


@st.composite
def body_edit(draw, objs: list) -> bytes:
    """A new snapshot body: its records edited structurally, then compressed (or raw
    garbage)."""
    objs = [list(o) if isinstance(o, list) else o for o in objs]
    for _ in range(draw(st.integers(1, 3))):
        if not objs:
            objs.append(draw(VALUES))
            continue
        i = draw(st.integers(0, len(objs) - 1))
        what = draw(st.sampled_from(["drop", "dup", "swap", "field", "field", "append",
                                     "truncate_item", "extend_item"]))
        if what == "drop":
            del objs[i]
        elif what == "dup":
            objs.insert(i, objs[i])
        elif what == "swap":
            j = draw(st.integers(0, len(objs) - 1))
            objs[i], objs[j] = objs[j], objs[i]
        elif what == "field" and isinstance(objs[i], list) and objs[i]:
            item = list(objs[i])
            j = draw(st.integers(0, len(item) - 1))
            item[j] = draw(VALUES | st.integers(0, (1 << 64) - 1))
            objs[i] = item
        elif what == "truncate_item" and isinstance(objs[i], list) and objs[i]:
            objs[i] = objs[i][:-1]
        elif what == "extend_item" and isinstance(objs[i], list):
            objs[i] = objs[i] + [draw(SCALARS)]
        else:
            objs.insert(i, draw(VALUES))
    raw = b"".join(codec.packb(o) for o in objs)
    form = draw(st.sampled_from(["zstd", "zstd", "zstd", "plain", "zstd+junk", "two_frames"]))
    if form == "plain":
        return raw
    if form == "zstd+junk":
        return compress(raw) + draw(st.binary(min_size=1, max_size=8))
    if form == "two_frames":
        return compress(raw[: len(raw) // 2]) + compress(raw[len(raw) // 2:])
    return compress(raw)


# --- edits of an update packet's blocks -------------------------------------------------------
#
# One mutator for hypothesis and tools/fuzz_run.py: it asks a chooser (DrawChooser here,
# RandomChooser there) for every decision.

class DrawChooser:
    """Decisions drawn by hypothesis (so a failure shrinks and replays)."""

    def __init__(self, data):
        self.draw = data.draw

    def int(self, lo: int, hi: int) -> int:
        return self.draw(st.integers(lo, hi))

    def pick(self, seq):
        return self.draw(st.sampled_from(list(seq)))

    def chance(self, p: float) -> bool:
        return self.draw(st.integers(0, 99)) < p * 100

    def value(self):
        return self.draw(VALUES)

    def text(self) -> str:
        return self.draw(st.text(max_size=12))

    def blob(self, n: int) -> bytes:
        return self.draw(st.binary(max_size=n))


class RandomChooser:
    """Decisions from ``random.Random`` (reproducible by seed); ``value`` makes msgpack-able
    values."""

    def __init__(self, r, value):
        self.r, self._value = r, value

    def int(self, lo: int, hi: int) -> int:
        return self.r.randint(lo, hi)

    def pick(self, seq):
        return self.r.choice(list(seq))

    def chance(self, p: float) -> bool:
        return self.r.random() < p

    def value(self):
        return self._value()

    def text(self) -> str:
        return "".join(self.r.choice("ap01$\u00e9\u4e2d") for _ in range(self.r.randrange(8)))

    def blob(self, n: int) -> bytes:
        return self.r.randbytes(self.r.randint(0, n))


@dataclass
class BodyEdit:
    kind: str                   # ops, columns, foreign, bytes, structure
    body: bytes
    desc: list
    expect: str = "any"         # as judge() takes it
    origin: bytes | None = None     # whose signature a "signature" edit lacks


def a_value(ch) -> bytes | None:
    """An op's value: msgpack of anything, a delete, or bytes that are no msgpack at all (values
    are opaque to the apply)."""
    how = ch.pick(["msgpack", "msgpack", "delete", "empty", "junk"])
    if how == "delete":
        return None
    if how == "empty":
        return b""
    if how == "junk":
        return b"\xc1" + ch.blob(16)
    try:
        return codec.encode_value(ch.value())
    except (TypeError, ValueError, OverflowError):
        return b"\xc0"


def a_csn(ch, w: World, valid: bool = True) -> bytes:
    """A CSN for a replaced list: one b holds, one the packets carry, or made up."""
    how = ch.pick(["known", "known", "random", "zero"] + ([] if valid else
                                                        ["top-bit", "short", "long"]))
    if how == "known":
        return ch.pick(w.csns)
    if how == "zero":
        return bytes(20)
    if how == "top-bit":
        return b"\xff" * 20 if ch.chance(0.5) else bytes([0x80 | ch.pick(w.csns)[0]]) + \
            ch.pick(w.csns)[1:]
    if how == "short":
        return ch.pick(w.csns)[:19]
    if how == "long":
        return ch.pick(w.csns) + b"\x00"
    raw = bytearray(ch.blob(20).ljust(20, b"\x01"))
    raw[0] &= 0x7F
    return bytes(raw)


def edit_txns(ch, w: World, txns: list, desc: list) -> None:
    """One edit of a block's transactions, ``[[hlc, [[collection, key, value, replaced], ...]],
    ...]``, keeping what a block can express (epochs and seqs follow from the order)."""
    t = ch.int(0, len(txns) - 1)
    hlc, ops = txns[t]
    i = ch.int(0, len(ops) - 1)
    op = ops[i]
    what = ch.pick(["value", "value", "key", "collection", "system", "replaced", "replaced",
                    "hlc", "drop", "dup", "insert", "split", "merge", "drop-txn"])
    desc.append(("op", what, t, i))
    if what == "value":
        op[2] = a_value(ch)
    elif what == "key":
        op[1] = {"text": ch.text, "other": lambda: ch.pick([o[1] for o in ops]),
                 "known": lambda: ch.pick(["p000", "p001", "p002", "t1", "n1", "a", "b", "r"]),
                 "long": lambda: "k" * 5000}[ch.pick(["text", "other", "known", "long"])]()
    elif what == "collection":
        op[0] = ch.pick(["parts", "tools", "notes", "", "$nope", "$collections", "text"])
        if op[0] == "text":
            op[0] = ch.text()
    elif what == "system":      # an entry of syncpack's own collections: checked on arrival
        coll, key, _csn, value = ch.pick(w.system)
        op[0] = coll
        op[1] = key if ch.chance(0.5) else ch.pick(["a", "b", "r", "c", "zz", ch.text()])
        op[2] = value if ch.chance(0.6) else a_value(ch)
    elif what == "replaced":
        how = ch.pick(["one", "one", "two", "none"])
        op[3] = (b"" if how == "none" else a_csn(ch, w) if how == "one"
                 else a_csn(ch, w) + a_csn(ch, w))
    elif what == "hlc":
        how = ch.pick(["+1", "-1", "+1s", "-1s", "+48h", "known"])
        if how == "known":
            txns[t][0] = int.from_bytes(ch.pick(w.csns)[:8], "big")
        else:
            txns[t][0] = hlc + {"+1": 1, "-1": -1, "+1s": 1000 << 16, "-1s": -(1000 << 16),
                                "+48h": (48 * 3600 * 1000) << 16}[how]
    elif what == "drop":
        del ops[i]
    elif what == "dup":
        ops.insert(i, list(op))
    elif what == "insert":
        ops.insert(i, [ch.pick(["parts", "tools", ch.text()]), ch.text(), a_value(ch), b""])
    elif what == "split" and i > 0:
        txns.insert(t + 1, [hlc + 1, ops[i:]])
        del ops[i:]
    elif what == "merge" and t > 0:
        txns[t - 1][1].extend(ops)
        del txns[t]
    elif what == "drop-txn" and len(txns) > 1:
        del txns[t]
    txns[:] = [x for x in txns if x[1]]
    if not txns:
        raise Unmakeable("no op left")


def continues(block: bytes) -> bool:
    """``block`` is a part whose transaction continues in the next block (MORE)."""
    return bool(blocks.read_block_header_flags(block) & blocks.FLAG_MORE)


def remade_from_ops(ch, w: World, block: bytes, key, desc: list) -> bytes:
    """``block`` with its ops edited, encoded again by the writers' own code and signed with
    ``key``: a valid block when ``key`` is its origin's."""
    f = fields_of(block)
    txns: list = []
    first_seq = 0       # > 0 in a later part of a transaction, whose first op is not seq 0
    for op in blocks.decode_ops(block):
        if op.seq == 0 or not txns:
            txns.append([op.hlc, []])
            first_seq = first_seq if len(txns) > 1 else op.seq
        txns[-1][1].append([op.collection, op.key, op.value, op.replaced])
    for _ in range(ch.int(1, 3)):
        edit_txns(ch, w, txns, desc)
    ops, epoch = [], f["lo"]
    for i, (hlc, body) in enumerate(txns):
        for seq, (c, k, v, r) in enumerate(body, first_seq if i == 0 else 0):
            epoch += 1
            ops.append(Op(f["origin"], epoch, hlc, seq, c, k, v, r))
    try:
        return blocks.encode_block(w.family, f["origin"], f["prev_hash"], ops, key.sign,
                                   more=continues(block))
    except blocks.BlockEncodeError as e:
        raise Unmakeable(str(e)) from None


def odd_value(ch):
    """Something for a column's place: right or wrong type, at or past a limit."""
    how = ch.pick(["value", "zero", "minus", "2**63", "2**64-1", "2**32", "str", "bin", "nil",
                   "true", "float", "csn-top-bit", "csn", "text", "blob", "list"])
    return {"value": ch.value, "zero": lambda: 0, "minus": lambda: -1,
            "2**63": lambda: 1 << 63, "2**64-1": lambda: (1 << 64) - 1, "2**32": lambda: 1 << 32,
            "str": lambda: "", "bin": lambda: b"", "nil": lambda: None, "true": lambda: True,
            "float": lambda: 1.5, "csn-top-bit": lambda: b"\xff" * 20, "csn": lambda: bytes(20),
            "text": ch.text, "blob": lambda: ch.blob(24), "list": lambda: []}[how]()


def edit_columns(ch, w: World, cols, desc: list):
    """One edit of a block's decoded columns, of any shape: returns the new columns."""
    what = ch.pick(["elem", "elem", "int", "drop", "dup", "append", "column", "shape",
                    "replaced", "replaced"])
    desc.append(("columns", what))
    if not (type(cols) is list and cols):
        return [[] for _ in range(9)] if what == "shape" else cols
    c = ch.int(0, len(cols) - 1)
    col = cols[c]
    if what == "replaced" and len(cols) == 9 and type(cols[7]) is list and type(cols[8]) is list:
        csn = a_csn(ch, w, valid=False)
        how = ch.pick(["append", "replace", "index"])
        if how == "replace" and cols[8]:
            cols[8][ch.int(0, len(cols[8]) - 1)] = csn
        elif how == "index" and cols[7]:
            cols[7][ch.int(0, len(cols[7]) - 1)] = ch.pick([-1, 0, 1, 11, 12, 1 << 32])
        else:
            cols[7].append(ch.int(0, 20))
            cols[8].append(csn)
    elif what == "column":
        cols[c] = {"empty": [], "value": ch.value(), "other": cols[ch.int(0, len(cols) - 1)],
                   "nested": [col]}[ch.pick(["empty", "value", "other", "nested"])]
    elif what == "shape":
        how = ch.pick(["drop", "extra", "swap", "reverse", "wrap", "scalar"])
        desc.append(how)
        if how == "drop":
            del cols[c]
        elif how == "extra":
            cols.append(odd_value(ch))
        elif how == "swap":
            d = ch.int(0, len(cols) - 1)
            cols[c], cols[d] = cols[d], cols[c]
        elif how == "reverse" and type(col) is list:
            col.reverse()
        elif how == "wrap":
            return [cols]
        elif how == "scalar":
            return ch.value()
    elif type(col) is list and col:
        j = ch.int(0, len(col) - 1)
        if what == "int" and type(col[j]) is int:
            col[j] = min(max(col[j] + ch.pick([-2, -1, 1, 2, 1 << 32, -(1 << 40)]),
                             -(1 << 63)), (1 << 64) - 1)
        elif what == "drop":
            del col[j]
        elif what == "dup":
            col.insert(j, col[j])
        elif what == "append":
            col.append(odd_value(ch))
        else:
            col[j] = odd_value(ch)
    return cols


def remade_from_columns(ch, w: World, block: bytes, key, desc: list) -> bytes:
    """``block`` with its columns edited in any way (types, lengths, shapes), the header made
    to agree with them or not, framed well or badly, and signed with ``key``."""
    f = fields_of(block)
    cols = block_columns(block)
    for _ in range(ch.int(1, 3)):
        cols = edit_columns(ch, w, cols, desc)
    if ch.chance(0.7):          # a careful forger keeps the header in step
        try:
            f.update(hi=f["lo"] + len(cols[5]), txns=len(cols[0]),
                     hlc_last=f["hlc_first"] + sum(cols[1]))
        except (TypeError, IndexError, KeyError):
            pass
    if ch.chance(0.25):
        name = ch.pick(["lo", "hi", "txns", "hlc_first", "hlc_last", "flags", "version"])
        f[name] = max(0, f[name] + ch.pick([-1, 1, 1 << 20, 1 << 31]))
        desc.append(("header", name, f[name]))
    try:
        raw = codec.packb(cols)
    except (TypeError, ValueError, OverflowError) as e:
        raise Unmakeable(f"columns: {e}") from None
    form = ch.pick(["zstd", "zstd", "zstd", "zstd", "no-size", "checksum", "plain", "junk",
                    "two-frames", "raw_len+1", "raw_len-1"])
    desc.append(("frame", form))
    raw_len = len(raw) + {"raw_len+1": 1, "raw_len-1": -1}.get(form, 0)
    return sign_block(f, frame(raw, form), key, w.family, max(raw_len, 0))


def _changed_bytes(ch, w: World, bl: list[bytes], desc: list) -> list[bytes]:
    """Bytes of the blocks altered without signing anything again."""
    k = ch.int(0, len(bl) - 1)
    b = bytearray(bl[k])
    others = [x for x in w.blocks["update"] + w.blocks["gap"] if x != bl[k]]
    what = ch.pick(["field", "field", "field", "flip", "truncate", "insert", "splice",
                    "swap-sig", "fuse", "reorder", "reorder", "cut"])
    if what in ("fuse", "reorder") and len(bl) < 2:
        what = "splice"
    desc.append(("bytes", what, k))
    if what == "field":
        name = ch.pick(list(FIELD_SPAN))
        off, size = FIELD_SPAN[name]
        old = bytes(b[off:off + size])
        n = int.from_bytes(old, "big")
        how = ch.pick(["bit", "zero", "ones", "other", "+1", "-1"])
        new = {"bit": lambda: (n ^ (1 << ch.int(0, 8 * size - 1))).to_bytes(size, "big"),
               "zero": lambda: bytes(size), "ones": lambda: b"\xff" * size,
               "other": lambda: ch.pick(others)[off:off + size],
               "+1": lambda: ((n + 1) % (1 << 8 * size)).to_bytes(size, "big"),
               "-1": lambda: ((n - 1) % (1 << 8 * size)).to_bytes(size, "big")}[how]()
        if new == old:
            new = (n ^ 1).to_bytes(size, "big")
        desc.append((name, how))
        b[off:off + size] = new
    elif what == "flip":
        b[ch.int(0, len(b) - 1)] ^= ch.int(1, 255)
    elif what == "truncate":        # not the whole block: that would be a dropped block
        del b[len(b) - ch.int(1, len(b) - 1):]
    elif what == "insert":
        pos = ch.int(0, len(b))
        b[pos:pos] = ch.blob(16) or b"\x00"
    elif what == "splice":          # one block's header and signature, another's body
        b[HEADER_LEN:] = ch.pick(others)[HEADER_LEN:]
    elif what == "swap-sig":
        other = ch.pick([x for x in others if x[122:HEADER_LEN] != b[122:HEADER_LEN]])
        b[122:HEADER_LEN] = other[122:HEADER_LEN]
    elif what == "fuse":            # two blocks under the first one's header
        j = ch.pick([i for i in range(len(bl)) if i != k])
        b[118:122] = (fields_of(bl[k])["body_len"] + len(bl[j])).to_bytes(4, "big")
        b += bl[j]
        return [bytes(b) if i == k else x for i, x in enumerate(bl) if i != j]
    elif what == "reorder":
        j = ch.pick([i for i in range(len(bl)) if i != k])
        bl = list(bl)
        bl[j], bl[k] = bl[k], bl[j]
        return bl
    elif what == "cut":             # the body ends inside a block
        return bl[:k] + [bytes(b[:ch.int(1, len(b) - 1)])]
    out = list(bl)
    out[k] = bytes(b)
    return out


def edit_update_body(ch, w: World, name: str) -> BodyEdit:
    """A new body for update packet ``name`` (its header is re-signed by the caller, with
    :func:`fix_ranges` or not), with what the import must make of it."""
    bl = list(w.blocks[name])
    desc: list = []
    kind = ch.pick(["ops", "ops", "columns", "columns", "foreign", "bytes", "bytes",
                    "structure"])
    a = w.ids["a"]
    if kind in ("ops", "columns"):      # a's own blocks, a's own key: valid signatures
        k = ch.pick([i for i, b in enumerate(bl) if origin_of(b) == a])
        old = fields_of(bl[k])
        remake = remade_from_ops if kind == "ops" else remade_from_columns
        bl[k] = remake(ch, w, bl[k], w.key_a, desc)
        if ch.chance(0.8):
            rechain(w, bl, k, old)
        return BodyEdit(kind, b"".join(bl), desc)
    if kind == "foreign":
        k = ch.int(0, len(bl) - 1)
        o = origin_of(bl[k])
        signer = ch.pick([n for n in ("a", "b", "r") if w.ids[n] != o])
        how = ch.pick(["same", "same", "ops", "columns"])
        desc.append(("signed by", signer, how, k))
        if how == "same":
            bl[k] = sign_block(fields_of(bl[k]), bl[k][HEADER_LEN:], w.key(signer), w.family,
                               None)
        else:
            remake = remade_from_ops if how == "ops" else remade_from_columns
            bl[k] = remake(ch, w, bl[k], w.key(signer), desc)
        try:
            blocks.read_block_header(bl[k])
            expect = "signature"
        except PacketError:
            expect = "reject"       # refused before its signature is looked at
        return BodyEdit(kind, b"".join(bl), desc, expect, o)
    if kind == "bytes":
        body = b"".join(_changed_bytes(ch, w, bl, desc))
        if body == b"".join(w.blocks[name]):
            raise Unmakeable("no change")
        return BodyEdit(kind, body, desc, "reject")
    what = ch.pick(["drop", "dup", "more", "only"])
    k = ch.int(0, len(bl) - 1)
    desc.append(("structure", what, k))
    if what == "drop" and len(bl) > 1:
        del bl[k]
    elif what == "dup":
        bl.insert(ch.int(0, len(bl)), bl[k])
    elif what == "only":
        bl = [bl[k]]
    else:       # a relay adds the other packet's blocks: genuine, and in order
        bl = bl + w.blocks["gap"] if name == "update" else w.blocks["update"] + bl
    return BodyEdit(kind, b"".join(bl), desc)


def rechain(w: World, bl: list[bytes], k: int, old: dict) -> None:
    """After block ``k`` of a was made again, make a's later blocks continue it: epochs shifted
    by the change in its op count, prev_hash its new block hash (a holds a's key)."""
    f = fields_of(bl[k])
    shift = f["hi"] - old["hi"]
    prev = blocks.block_hash(w.family, bl[k][:blocks.SIGNED_LEN])
    for j in range(k + 1, len(bl)):
        if origin_of(bl[j]) != f["origin"]:
            continue
        try:
            ops = [op._replace(epoch=op.epoch + shift) for op in blocks.decode_ops(bl[j])]
            bl[j] = blocks.encode_block(w.family, f["origin"], prev, ops, w.key_a.sign,
                                        more=continues(bl[j]))
        except (PacketError, blocks.BlockEncodeError):
            return
        prev = blocks.block_hash(w.family, bl[j][:blocks.SIGNED_LEN])


def resigned_update(w: World, name: str, e: BodyEdit, fix: bool) -> bytes:
    if fix:
        try:
            return resign(w.corpus[name], w.key_a, body=e.body,
                          edit=lambda h: fix_ranges(h, e.body, w.key_a))
        except (TypeError, ValueError, OverflowError):
            pass        # damaged lengths led the walk to numbers no header can hold
    return resign(w.corpus[name], w.key_a, body=e.body)
