"""The pure decisions of syncpack.rules.planning, against what docs/design.md promises.

Each property states the guarantee in terms of plain vectors, so a change to the store cannot
hide a change of rule."""

from __future__ import annotations

from hypothesis import given, settings, strategies as st

from syncpack.rules import planning

ORIGINS = [bytes([i]) * 8 for i in range(4)]
epochs = st.integers(0, 50)
vectors = st.dictionaries(st.sampled_from(ORIGINS), epochs, max_size=4)


@given(vectors, st.lists(vectors, max_size=5))
def test_the_ack_floor_never_exceeds_any_members_own_acknowledgement(own, acks):
    floor = planning.ack_floor(own, acks)
    for o, e in floor.items():
        assert e <= own.get(o, 0)
        assert all(e <= a.get(o, 0) for a in acks)      # each member holds what is trimmed
    # and it is the greatest such floor: nothing is kept back that everyone acknowledged
    for o, e in own.items():
        best = min([e, *(a.get(o, 0) for a in acks)])
        assert floor.get(o, 0) == best


@given(vectors, st.lists(vectors, min_size=1, max_size=4), vectors)
def test_a_member_that_never_acknowledged_blocks_all_trimming(own, acks, _):
    assert planning.ack_floor(own, [*acks, {}]) == {}


@given(vectors, vectors, vectors, st.dictionaries(st.sampled_from(ORIGINS), st.integers(1, 60)))
def test_scrub_floors_only_rise_and_stay_within_what_was_acknowledged_and_old_enough(
        acked, floors, vector, young):
    plan = planning.scrub_floors(acked, floors, vector, young)
    for o, (old, new) in plan.items():
        assert old == floors.get(o, 0) < new
        assert new <= acked.get(o, 0) and new <= vector.get(o, 0)
        if o in young:
            assert new < young[o]


@given(vectors, st.one_of(st.none(), vectors), st.booleans(), st.booleans())
def test_should_send_whenever_the_peer_has_not_seen_our_vector(vector, told, unconfirmed,
                                                               recovering):
    current = {o: e for o, e in vector.items() if e}
    send = planning.should_send({}, told, vector, unconfirmed, recovering)
    if unconfirmed or recovering:
        # a recovering site asks every round: the members' word it waits for may have to
        # come through a peer that has nothing else to send it
        assert send
    elif told is None:
        assert send == bool(current)
    else:
        assert send == ({o: e for o, e in told.items() if e} != current)
    assert planning.should_send({ORIGINS[0]: (0, 1)}, current, vector, False, False)


@given(vectors, vectors, vectors)
def test_wind_back_lowers_sent_exactly_to_what_the_peer_holds_of_what_it_saw(sent, peer, seen):
    lowered = planning.wind_back(sent, peer, seen)
    for o, new in lowered.items():
        assert new == peer.get(o, 0) < sent.get(o, 0)
        assert peer.get(o, 0) < seen[o]                  # it saw more than it holds: lost
    for o in sent:
        if o not in lowered and o in seen and peer.get(o, 0) < seen[o]:
            assert sent[o] <= peer.get(o, 0)            # nothing to wind back


@given(vectors, vectors, vectors)
def test_a_snapshot_is_accepted_only_if_every_later_op_is_still_held(snap, vector, floors):
    o = planning.snapshot_rollback(snap, vector, floors)
    if o is None:
        for x, e in vector.items():
            if snap.get(x, 0) < e:
                # we replay (snap, e] from our changelog: we still hold it all
                assert floors.get(x, 0) <= snap.get(x, 0)
    else:
        assert snap.get(o, 0) < vector[o] and floors.get(o, 0) > snap.get(o, 0)


@given(vectors, vectors, vectors, st.sets(st.sampled_from(ORIGINS)))
def test_a_snapshot_claim_is_believed_only_as_far_as_held_or_signed_by_its_origin(
        claimed, held, proven, exempt):
    o = planning.unproven_claim(claimed, held, proven, exempt)
    unproven = sorted(x for x, e in claimed.items()
                      if x not in exempt and e > max(held.get(x, 0), proven.get(x, 0)))
    assert o == (unproven[0] if unproven else None)
    # raising the proof of every origin to its claim always makes the snapshot acceptable
    assert planning.unproven_claim(claimed, held, {**proven, **claimed}, exempt) is None


@settings(max_examples=300)
@given(st.integers(0, 100), st.integers(0, 100), st.integers(0, 100), st.booleans(),
       st.booleans())
def test_an_own_claim_is_dismissed_only_when_unproven_unanswered_and_undelivered(
        claim, held, proven, saw, delivered):
    d = planning.own_claim_dismissed(claim, held, proven, saw, delivered)
    if d:
        assert claim > held and claim > proven and saw and not delivered
    if claim <= proven:
        assert not d             # our own signed word always stands
    if claim > max(held, proven) and saw and not delivered:
        assert d                 # a liar delays us for one exchange, not for good


@given(vectors, vectors)
def test_a_relayed_acknowledgement_survives_its_delta_encoding(header, ack):
    from syncpack.format import codec
    nonzero = {o: e for o, e in ack.items() if e}
    delta = codec.ack_delta({o: e for o, e in header.items() if e}, ack)
    assert codec.apply_ack_delta({o: e for o, e in header.items() if e}, delta) == nonzero
    # only what differs travels
    assert all(header.get(o, 0) != nonzero.get(o, 0) for o in delta)


@given(st.integers(0, 20), st.sets(st.integers(1, 40), max_size=30), st.integers(0, 40))
def test_own_ops_are_kept_through_a_reseed_only_when_every_one_is_held(floor, held, epoch):
    """holds_through: the changelog holds each epoch from above the floor through the one a
    snapshot covers (keeping a history with a hole would promise ops it cannot send)."""
    held = {e for e in held if e > floor}
    summary = (min(held), max(held), len(held)) if held else None
    expected = epoch > floor and all(e in held for e in range(floor + 1, epoch + 1)) and \
        (not held or set(range(floor + 1, max(held) + 1)) == held)
    assert planning.holds_through(floor, summary, epoch) == expected


@given(vectors, vectors, st.sampled_from(ORIGINS), st.booleans())
def test_a_peers_own_origin_counts_what_our_unanswered_snapshot_brought_it(acked, sent, peer,
                                                                           reseeded):
    out = planning.reported(acked, sent, peer, reseeded)
    # other origins are the peer's word alone, and its own is never lowered
    assert {o: e for o, e in out.items() if o != peer} == \
        {o: e for o, e in acked.items() if o != peer}
    assert out.get(peer, 0) >= acked.get(peer, 0)
    if reseeded:
        assert out.get(peer, 0) == max(acked.get(peer, 0), sent.get(peer, 0))
    else:
        assert out == acked


ranges_st = st.dictionaries(st.sampled_from(ORIGINS),
                            st.tuples(epochs, epochs).map(lambda t: (min(t), max(t))), max_size=4)


@given(ranges_st, st.data())
def test_ops_left_by_a_cut_short_export_are_the_planned_ops_past_what_was_written(planned, data):
    # What an export writes of each origin is a prefix of its planned range.
    reached = {o: data.draw(st.integers(lo, hi)) for o, (lo, hi) in planned.items()}
    written = [{o: (lo, reached[o]) for o, (lo, _hi) in planned.items() if reached[o] > lo}]
    total = sum(hi - lo for lo, hi in planned.values())
    left = planning.ops_beyond(planned, written)
    assert left == sum(hi - reached[o] for o, (_lo, hi) in planned.items())
    assert planning.ops_beyond(planned, []) == total
    assert planning.ops_beyond(planned, [planned]) == 0
    assert 0 <= left <= total
