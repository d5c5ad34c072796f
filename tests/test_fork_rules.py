"""Property tests of the fork proof (syncpack/rules/forks.py, docs/design.md §3.10): two
signed block headers prove a fork only when their origin really signed two histories, and
blocks of one history, however grouped or re-sealed, never do."""

from __future__ import annotations

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given, settings, strategies as st

from syncpack.format import blocks, codec
from syncpack.format.codec import Op
from syncpack.rules import forks

FAMILY = b"fork-rules-fam01"
ORIGIN = b"ORIGIN-1"
SIGN = Ed25519PrivateKey.from_private_bytes(bytes(range(32))).sign


def txn_specs(n_min=1):
    # a transaction: (clock step, number of ops, value tag)
    return st.lists(st.tuples(st.integers(1, 3), st.integers(1, 3), st.integers(0, 2)),
                    min_size=n_min, max_size=8)


def history(specs, start_hlc=1000, start_epoch=1, tag=""):
    ops, hlc, epoch = [], start_hlc, start_epoch
    for step, n, v in specs:
        hlc += step
        for seq in range(n):
            ops.append(Op(ORIGIN, epoch, hlc, seq, "c", f"k{epoch}",
                          codec.encode_value(f"{tag}{v}"), b""))
            epoch += 1
    return ops


def txns(ops):
    out = []
    for op in ops:
        if op.seq == 0:
            out.append([])
        out[-1].append(op)
    return out


def seal(ops, cuts, root_at=None):
    """Signed blocks of ``ops`` grouped at the transaction indexes in ``cuts``; the block
    starting at transaction ``root_at`` is a chain root (re-sealed after a restore)."""
    groups, cur = [], []
    for i, t in enumerate(txns(ops)):
        if i in cuts and cur:
            groups.append(cur)
            cur = []
        cur += t
    if cur:
        groups.append(cur)
    out, prev, i = [], blocks.ZERO_HASH, 0
    for g in groups:
        p = blocks.ZERO_HASH if (root_at is not None and g[0].epoch > 1 and i == root_at) else prev
        raw = blocks.encode_block(FAMILY, ORIGIN, p, g, SIGN)
        info = blocks.read_block_header(raw, FAMILY)
        out.append(info)
        prev = info.block_hash
        i += 1
    return out


def facts(i):
    return forks.HeaderFacts(i.origin, i.lo, i.hi, i.hlc_first, i.hlc_last, i.prev_hash,
                             i.block_hash)


@settings(max_examples=60, deadline=None)
@given(txn_specs(), st.sets(st.integers(0, 8)), st.sets(st.integers(0, 8)),
       st.one_of(st.none(), st.integers(0, 4)))
def test_one_history_never_proves_a_fork(specs, cuts1, cuts2, root):
    ops = history(specs)
    a, b = seal(ops, cuts1), seal(ops, cuts2, root)
    for x in a:
        for y in b:
            assert forks.fork_epoch(facts(x), facts(y)) is None


@settings(max_examples=60, deadline=None)
@given(txn_specs(0), txn_specs(), txn_specs(), st.sets(st.integers(0, 8)),
       st.sets(st.integers(0, 8)), st.booleans())
def test_a_proof_names_a_place_where_the_histories_differ(prefix, tail1, tail2, cuts1, cuts2,
                                                         same_clock):
    base = history(prefix)
    hlc0 = base[-1].hlc if base else 1000
    e0 = len(base) + 1
    one = base + history(tail1, hlc0, e0, "one")
    two = base + history(tail2 if not same_clock else tail1, hlc0, e0, "two")
    ops1 = {op.epoch: op for op in one}
    ops2 = {op.epoch: op for op in two}
    for x in seal(one, cuts1):
        for y in seal(two, cuts2):
            e = forks.fork_epoch(facts(x), facts(y))
            if e is None:
                continue
            top = min(x.hi, y.hi)
            assert e <= top
            assert any(ops1.get(k) != ops2.get(k) for k in range(e, top + 1)), (x, y)


@settings(max_examples=40, deadline=None)
@given(txn_specs(0), txn_specs())
def test_the_same_place_with_other_ops_is_always_a_proof(prefix, tail):
    """What an equivocating member does: one block, signed twice with different ops after the
    same past, is always caught."""
    base = history(prefix)
    hlc0 = base[-1].hlc if base else 1000
    prev = seal(base, set())[-1].block_hash if base else blocks.ZERO_HASH
    e0 = len(base) + 1
    x = blocks.read_block_header(blocks.encode_block(
        FAMILY, ORIGIN, prev, history(tail, hlc0, e0, "one"), SIGN), FAMILY)
    y = blocks.read_block_header(blocks.encode_block(
        FAMILY, ORIGIN, prev, history(tail, hlc0, e0, "two"), SIGN), FAMILY)
    assert forks.fork_epoch(facts(x), facts(y)) == e0
    assert forks.fork_epoch(facts(y), facts(x)) == e0
    assert forks.winner(facts(x), facts(y)) == forks.winner(facts(y), facts(x))


@given(st.lists(st.tuples(st.integers(1, 50), st.binary(min_size=1, max_size=4),
                          st.binary(min_size=1, max_size=4)), min_size=1, max_size=6),
       st.randoms())
def test_the_deciding_evidence_is_the_lowest_fork_whatever_order_it_was_learnt_in(pieces, rnd):
    """Sites learn pieces of evidence against one origin in different orders: they must all
    end its fork with the same one, the first place the histories part."""
    shuffled = list(pieces)
    rnd.shuffle(shuffled)
    chosen = forks.deciding(shuffled)
    assert chosen == forks.deciding(pieces)
    assert chosen in pieces and chosen[0] == min(p[0] for p in pieces)
