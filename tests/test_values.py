"""What a record value may be (syncpack/format/values.py): the encoder that every put and load
uses takes a quick path for plain values; it must accept, refuse and encode exactly as the
full check followed by the encoding does, whatever the value."""

from __future__ import annotations

import collections
import enum

from hypothesis import given, settings, strategies as st

from syncpack.errors import InvalidValueError
from syncpack.format import codec, values


class Level(enum.IntEnum):
    LOW = 1


def _reference(value) -> bytes | str:
    try:
        values.check_json_value(value)
        return codec.encode_value(value)
    except (InvalidValueError, ValueError) as e:
        return type(e).__name__ + ": " + str(e)


def _encoded(value) -> bytes | str:
    try:
        return values.json_value_encoder()(value)
    except InvalidValueError as e:
        return "InvalidValueError: " + str(e)


odd = st.sampled_from([float("nan"), float("inf"), b"bytes", {1, 2}, Level.LOW, "\ud800",
                       collections.OrderedDict(a=1), 2 ** 64, -(2 ** 63) - 1, True])
scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text() | odd
trees = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                     | st.tuples(inner, inner)
                     | st.dictionaries(st.text(max_size=3) | st.integers(0, 3) | odd.filter(
                         lambda k: isinstance(k, (str, int))), inner, max_size=4),
                     max_leaves=20)


@given(trees)
@settings(max_examples=400, deadline=None)
def test_the_encoder_decides_as_the_check_and_the_encoding_do(value):
    ref = _reference(value)
    got = _encoded(value)
    if isinstance(ref, bytes):
        assert got == ref
    else:
        # refused both ways, with the check's message where the check refused
        assert isinstance(got, str)
        if ref.startswith("InvalidValueError"):
            assert got == ref


def test_nesting_at_the_limit_is_accepted_and_beyond_it_refused():
    ok = 0
    for _ in range(values.MAX_DEPTH):
        ok = [ok]
    assert _encoded(ok) == _reference(ok)
    assert isinstance(_encoded(ok), bytes)
    deep = [ok]
    assert "nested more than" in _encoded(deep)
    loop: list = []
    loop.append(loop)
    assert "nested more than" in _encoded(loop)
