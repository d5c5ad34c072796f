"""The CSN layout and the hybrid logical clock, as pure functions and through a real Site."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from syncpack.format.csn import (CSN, CSN_LEN, LOGICAL_BITS, hlc_from_ms, hlc_ms, next_hlc, observe_hlc,
                          pack_csn, unpack_csn)
from syncpack.site import Site, wall_ms

U64 = st.integers(min_value=0, max_value=2**64 - 1)
U32 = st.integers(min_value=0, max_value=2**32 - 1)
ORIGIN = st.binary(min_size=8, max_size=8)
CSNS = st.tuples(U64, ORIGIN, U32)
# wall clocks in ms that keep (ms << 16) inside 64 bits, with room for the logical counter
WALL = st.integers(min_value=0, max_value=2**47)


# --- the byte layout ----------------------------------------------------------------------------

@given(CSNS, CSNS)
def test_csn_bytes_sort_like_the_tuple(a, b):
    pa, pb = pack_csn(*a), pack_csn(*b)
    assert len(pa) == len(pb) == CSN_LEN
    assert (pa < pb) == (a < b)
    assert (pa == pb) == (a == b)


@given(st.lists(CSNS, min_size=1, max_size=50, unique=True))
def test_sorting_packed_csns_sorts_the_ops(csns):
    packed = sorted(pack_csn(*c) for c in csns)
    assert [tuple(unpack_csn(p)) for p in packed] == sorted(csns)


@given(CSNS)
def test_csn_round_trips(c):
    raw = CSN(*c).pack()
    assert unpack_csn(raw) == CSN(*c)
    assert unpack_csn(raw).txn == (c[0], c[1])


@pytest.mark.parametrize("n", [0, 19, 21])
def test_unpack_refuses_wrong_length(n):
    with pytest.raises(ValueError):
        unpack_csn(b"\0" * n)


def test_hlc_layout_is_milliseconds_then_counter():
    assert hlc_from_ms(1) == 1 << LOGICAL_BITS
    assert hlc_ms(hlc_from_ms(1_763_822_000_123) + 0xFFFF) == 1_763_822_000_123
    # the hlc is the most significant field: a later millisecond beats any origin and seq
    assert pack_csn(hlc_from_ms(2), b"\0" * 8, 0) > pack_csn(hlc_from_ms(1) + 5, b"\xff" * 8,
                                                            2**32 - 1)


# --- the clock ----------------------------------------------------------------------------------

@given(st.lists(WALL, min_size=1, max_size=200))
def test_next_hlc_strictly_increases_whatever_the_wall_clock_does(walls):
    last = 0
    for w in walls:
        h = next_hlc(last, w)
        assert h > last
        assert h >= hlc_from_ms(w)            # never behind the wall clock either
        last = h


@given(st.lists(st.integers(min_value=1, max_value=2**47), min_size=2, max_size=50))
def test_next_hlc_follows_the_wall_clock_when_it_moves_forward(walls):
    walls = sorted(set(walls))
    last = 0
    for w in walls:
        last = next_hlc(last, w)
        assert last == hlc_from_ms(w)          # no drift while the clock behaves


@given(U64.filter(lambda x: x < 2**63), U64.filter(lambda x: x < 2**63), WALL)
def test_after_observing_a_remote_hlc_the_next_local_hlc_is_greater(last, remote, wall):
    seen = observe_hlc(last, remote)
    assert seen >= last and seen >= remote
    nxt = next_hlc(seen, wall)
    assert nxt > remote and nxt > last


@given(st.lists(st.tuples(st.booleans(), WALL, U64.filter(lambda x: x < 2**62)),
                min_size=1, max_size=100))
def test_interleaved_local_and_remote_events_keep_local_hlcs_above_everything_seen(events):
    last, highest_seen = 0, 0
    for is_remote, wall, remote in events:
        if is_remote:
            last = observe_hlc(last, remote)
            highest_seen = max(highest_seen, remote)
        else:
            h = next_hlc(last, wall)
            assert h > highest_seen and h > last
            last = highest_seen = h


# --- through a real Site ------------------------------------------------------------------------

class ScriptedClock:
    """A wall clock that returns the given milliseconds in turn (then repeats the last)."""

    def __init__(self, values):
        self.values = list(values)
        self.calls = 0

    def __call__(self) -> int:
        v = self.values[min(self.calls, len(self.values) - 1)]
        self.calls += 1
        return v


def _assert_csns_ascend_by_epoch(site: Site):
    rows = site.conn.execute(
        "SELECT epoch, hlc, origin, seq FROM changelog WHERE origin=? ORDER BY epoch",
        (site.site_id,)).fetchall()
    assert [r[0] for r in rows] == list(range(1, len(rows) + 1))
    csns = [pack_csn(h, o, s) for _e, h, o, s in rows]
    for a, b in zip(csns, csns[1:]):
        assert a < b, (unpack_csn(a), unpack_csn(b))
    return rows


def test_site_csns_ascend_when_the_clock_jumps_back(tmp_path):
    now = wall_ms()
    Site.init_family(tmp_path / "a", "fam", "a").close()
    clock = ScriptedClock([now + 10_000, now - 3_600_000, 0, now + 10_000, now + 20_000])
    with Site.open(tmp_path / "a", clock=clock) as s:
        for i in range(5):
            with s.transaction() as tx:
                tx.put("c", f"k{i}", i)
                tx.put("c", f"j{i}", i)
        assert clock.calls == 5
        rows = _assert_csns_ascend_by_epoch(s)
        hlcs = [h for _e, h, _o, _s in rows[-10:]]
        # the jumps back were absorbed by the logical counter, the jump forward was taken
        assert hlcs[2] == hlcs[0] + 1 and hlcs[4] == hlcs[2] + 1
        assert hlcs[8] == hlc_from_ms(now + 20_000)
        assert s.last_hlc() == hlcs[-1]


@settings(max_examples=15, deadline=None)
@given(st.lists(st.tuples(st.integers(min_value=0, max_value=2**42),
                          st.integers(min_value=1, max_value=3)),
                min_size=1, max_size=8))
def test_site_changelog_csns_strictly_ascend_under_any_clock(txns):
    d = Path(tempfile.mkdtemp(prefix="syncpack-csn-"))
    try:
        Site.init_family(d / "s", "fam", "s").close()
        clock = ScriptedClock([w for w, _n in txns])
        with Site.open(d / "s", clock=clock) as s:
            for i, (_w, n) in enumerate(txns):
                with s.transaction() as tx:
                    for j in range(n):
                        tx.put("c", f"{i}-{j}", [i, j])
            rows = _assert_csns_ascend_by_epoch(s)
            assert len(rows) == 2 + sum(n for _w, n in txns)   # init wrote 2 system ops
            # ops of one transaction share the hlc and count seq from 0
            by_hlc: dict[int, list[int]] = {}
            for _e, h, _o, sq in rows:
                by_hlc.setdefault(h, []).append(sq)
            assert all(v == list(range(len(v))) for v in by_hlc.values())
            assert len(by_hlc) == 1 + len(txns)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_a_site_whose_clock_is_behind_writes_above_what_it_imported(family):
    family.init("a")
    family.add("b", via="a")
    ahead = wall_ms() + 60_000      # a's clock runs a minute fast (within the skew limit)
    with Site.open(family.path("a"), clock=lambda: ahead) as a, a.transaction() as tx:
        tx.put("c", "k", "from a")
    family.sync("a", "b")
    with Site.open(family.path("b"), clock=lambda: 1_000) as b:   # b's clock says 1970
        a_max = b.conn.execute("SELECT max(hlc_last) FROM blocks WHERE origin!=?",
                               (b.site_id,)).fetchone()[0]
        assert a_max >= hlc_from_ms(ahead)
        with b.transaction() as tx:
            tx.put("c", "k", "from b")
        mine = b.conn.execute("SELECT hlc FROM changelog WHERE origin=? ORDER BY epoch DESC "
                              "LIMIT 1", (b.site_id,)).fetchone()[0]
        assert mine > a_max
        # so b's write follows a's and is no conflict: one surviving version, b's value
        assert b.get("c", "k") == "from b"
        assert b.conn.execute("SELECT count(*) FROM versions WHERE collection='c' AND key='k'"
                              ).fetchone()[0] == 1
