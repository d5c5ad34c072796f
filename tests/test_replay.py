"""fsck's replay, one key at a time (rules/replay.py), against the replay of the whole
changelog at once that it replaced: keys are independent, so both must agree on every key."""

from __future__ import annotations

from hypothesis import given, settings, strategies as st

from syncpack.rules.replay import replay_key

KEYS = ("a", "b", "c")


def whole_replay(base: dict[tuple[str, bytes], bytes | None],
                 ops: list[tuple[str, bytes, bytes | None, list[bytes]]]) -> dict:
    """The changelog replayed at once, in CSN order over all keys (the earlier fsck)."""
    logged = {csn for _k, csn, _v, _r in ops}
    state: dict[str, dict[bytes, bytes | None]] = {}
    for (key, csn), value in base.items():
        if csn not in logged:
            state.setdefault(key, {})[csn] = value
    superseded = set()
    for key, csn, value, replaced in sorted(ops, key=lambda o: o[1]):
        vs = state.setdefault(key, {})
        for r in replaced:
            if vs.pop(r, 0) == 0 and r not in logged:
                superseded.add((key, r))
        if (key, csn) not in superseded:
            vs[csn] = value
    return {k: v for k, v in state.items() if v}


csns = st.integers(0, 40).map(lambda i: i.to_bytes(2, "big"))
values = st.one_of(st.none(), st.binary(max_size=3))


@st.composite
def histories(draw):
    n = draw(st.integers(0, 12))
    op_csns = draw(st.lists(csns, min_size=n, max_size=n, unique=True))
    ops = [(draw(st.sampled_from(KEYS)), c, draw(values),
            draw(st.lists(csns, max_size=3)))       # any CSN: of this key, another, none
           for c in op_csns]
    base = draw(st.dictionaries(st.tuples(st.sampled_from(KEYS), csns), values, max_size=4))
    return base, ops


@settings(max_examples=400, deadline=None)
@given(histories())
def test_replaying_each_key_alone_gives_what_replaying_everything_gives(history):
    base, ops = history
    logged = {csn for _k, csn, _v, _r in ops}
    whole = whole_replay(base, ops)
    for key in KEYS:
        key_base = [(c, v) for (k, c), v in base.items() if k == key and c not in logged]
        key_ops = sorted((c, v, r) for k, c, v, r in ops if k == key)
        assert replay_key(key_base, key_ops, logged.__contains__) == whole.get(key, {})


def test_what_an_op_lists_goes_and_what_it_does_not_list_stays():
    # op 2 lists op 1: only op 2's version survives
    assert replay_key([], [(b"\x01", b"x", []), (b"\x02", b"y", [b"\x01"])],
                      {b"\x01", b"\x02"}.__contains__) == {b"\x02": b"y"}
    # a base version (snapshot or trimmed) the op lists goes; one it does not list stays
    assert replay_key([(b"\x00", b"s"), (b"\x03", None)], [(b"\x04", b"w", [b"\x00"])],
                      {b"\x04"}.__contains__) == {b"\x03": None, b"\x04": b"w"}
