"""Convergence under any delivery schedule (docs/design.md §3.1, §3.2, §3.4, §3.7, §6 lost packets).

Hypothesis drives 3-4 sites through random local writes (puts and deletes on a small key space,
so concurrent writes and conflicts are common) and random packet traffic: exports between any
two sites, deliveries of any subset of the packets in flight in any order (several per import
call, the same packet twice in one call), packets kept for a second delivery later (duplicates),
and packets never delivered at all (lost).  Then the sites exchange packets in full rounds until
a round produces no packet; by then every site must hold the same state, pass fsck, and have no
parked packet left.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from conftest import Family
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from syncpack.admin import inspection
from syncpack.site import Site

KEYS = [("c", "k0"), ("c", "k1"), ("c", "k2"), ("d", "k0")]
MAX_FINAL_ROUNDS = 12


def _write(fam: Family, site: str, ops: list[tuple[int, int | None]]) -> None:
    with fam.open(site) as s, s.transaction() as tx:
        for ki, value in ops:
            coll, key = KEYS[ki]
            if value is None:
                tx.delete(coll, key)
            else:
                tx.put(coll, key, {"v": value, "at": site})


def _deliver(fam: Family, dst: str, paths: list[Path]) -> None:
    r = fam.import_(dst, paths)
    # Every packet here is genuine: out of order, late or twice, it is never rejected.
    assert r.rejected == [], r.rejected
    if r.parked:
        event("a packet was parked")
    if r.duplicates:
        event("a duplicate was skipped")


def _exchange_round(fam: Family, names: list[str]) -> int:
    produced = 0
    for a in names:
        for b in names:
            if a != b:
                pks = fam.export(a, b)
                produced += len(pks)
                if pks:
                    _deliver(fam, b, pks)
    return produced


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_sites_converge_under_any_schedule(data):
    n = data.draw(st.integers(3, 4), label="sites")
    names = [f"s{i}" for i in range(n)]
    policy = data.draw(st.sampled_from(["lww", "priority"]), label="policy")
    prios = data.draw(st.lists(st.integers(0, 3), min_size=n, max_size=n), label="priorities")
    with tempfile.TemporaryDirectory() as tmp:
        fam = Family(Path(tmp))
        fam.init(names[0], policy=policy, priority=prios[0])
        for i, name in enumerate(names[1:], 1):
            fam.add(name, via=names[0], priority=prios[i])
        # Every member learns the roster from the first site, so anyone can talk to anyone.
        for name in names[1:]:
            _deliver(fam, name, fam.export(names[0], name))

        in_flight: dict[str, list[Path]] = {name: [] for name in names}
        steps = data.draw(st.integers(1, 30), label="steps")
        for _ in range(steps):
            kind = data.draw(st.sampled_from(["write", "write", "export", "deliver", "drop"]))
            if kind == "write":
                site = data.draw(st.sampled_from(names))
                ops = data.draw(st.lists(
                    st.tuples(st.integers(0, len(KEYS) - 1),
                              st.one_of(st.none(), st.integers(0, 9))),
                    min_size=1, max_size=3))
                _write(fam, site, ops)
            elif kind == "export":
                src = data.draw(st.sampled_from(names))
                dst = data.draw(st.sampled_from([x for x in names if x != src]))
                in_flight[dst] += fam.export(src, dst)
            elif kind == "deliver":
                dst = data.draw(st.sampled_from(names))
                pool = in_flight[dst]
                if not pool:
                    continue
                picks = data.draw(st.lists(st.integers(0, len(pool) - 1), min_size=1,
                                           max_size=len(pool) + 1))
                _deliver(fam, dst, [pool[i] for i in picks])
                keep = data.draw(st.booleans(), label="keep for a second delivery")
                if not keep:
                    in_flight[dst] = [p for i, p in enumerate(pool) if i not in set(picks)]
            else:  # a packet lost in transit
                dst = data.draw(st.sampled_from(names))
                if in_flight[dst]:
                    in_flight[dst].pop(data.draw(st.integers(0, len(in_flight[dst]) - 1)))

        # What is still in flight is lost.  Full rounds until nobody has anything to say.
        _settle(fam, names)

        if any(in_flight.values()):
            event("packets were lost")
        digests = {}
        for name in names:
            with Site.open(fam.path(name)) as s:
                check = inspection.fsck(s)
                assert check["ok"], (name, check["problems"])
                st_ = inspection.status(s)
                assert st_["parked"] == [], (name, st_["parked"])
                digests[name] = (s.digest(), {o: e for o, e in s.vector().items() if e})
                if st_["conflicts"]:
                    event("conflicts at the end")
        assert len(set(map(repr, digests.values()))) == 1, digests


def _settle(fam: Family, names: list[str]) -> list[int]:
    """Full rounds until one produces no packet; packets per round."""
    rounds = []
    for _round in range(MAX_FINAL_ROUNDS):
        rounds.append(_exchange_round(fam, names))
        if rounds[-1] == 0:
            return rounds
    raise AssertionError(f"still exchanging packets after {MAX_FINAL_ROUNDS} rounds: {rounds}")


@pytest.mark.parametrize("lost", ["data", "acknowledgement"])
def test_a_lost_last_packet_is_recovered_and_the_exchange_comes_to_rest(tmp_path, lost):
    """The last packet on a link is lost and its sender has nothing new to say.  The regular
    exchange must bring the peers together without a person, then stop producing packets.
    (A lost acknowledgement used to leave the other side sending probes forever.)"""
    fam = Family(tmp_path)
    names = ["s0", "s1", "s2"]
    fam.init("s0")
    for name in names[1:]:
        fam.add(name, via="s0")
    _settle(fam, names)
    fam.put("s0", "c", "k", 1)
    if lost == "data":
        assert fam.export("s0", "s1")            # never delivered
    else:
        fam.sync("s0", "s1")
        assert fam.export("s1", "s0")            # s1's acknowledgement, never delivered
    _settle(fam, names)
    assert len({fam.digest(n) for n in names}) == 1
    for n in names:
        with fam.open(n) as s:
            assert s.get("c", "k") == 1
