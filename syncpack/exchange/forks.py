"""Forks: an origin that signed two histories (docs/design.md §3.10, docs/trust.md).

A site finds a fork where a signed block it receives (in a packet body, or as a head in a
packet header) contradicts one it holds (:func:`syncpack.rules.forks.fork_epoch`); it keeps
both signed headers as evidence and passes them on in its packet headers, so every member
learns of it within a round.  What it does then:

- the origin is **frozen** here: its ops from the fork epoch wait, packets it sends are
  refused naming the evidence, until it heals or is retired;
- the origin **heals** when a block it signed continues, past the fork, the version this site
  holds (its signed word that it kept that version);
- a site shown evidence that **it** forked keeps the version of the peer that showed it (by
  that peer's tip); if that is not its own, it sets aside its own ops from the fork epoch and
  re-issues them under new epochs (:func:`syncpack.admin.recovery.stash_own`);
- a fork of a **retired** member ends with one history kept everywhere
  (:func:`syncpack.rules.forks.winner`): a site holding the other reverts it and receives the
  kept one in ordinary rounds.

Everything here runs inside the caller's write transaction.
"""

from __future__ import annotations

import hashlib
from typing import Iterator

from syncpack.admin import recovery
from syncpack.errors import ForkedMemberError
from syncpack.format import blocks
from syncpack.format import codec
from syncpack.format import keys
from syncpack.format.codec import MAX_FORKS, MAX_HEADS, MAX_KEPT, Header
from syncpack.format.csn import pack_csn
from syncpack.rules import forks as rules
from syncpack.site import Site, wall_ms
from syncpack.store import chain
from syncpack.store import forks as store

# Heads cost 186 bytes each: a few per packet, the ones a peer has not seen first.
HEADS_PER_PACKET = 16
assert HEADS_PER_PACKET <= MAX_HEADS


def facts(info: blocks.BlockInfo) -> rules.HeaderFacts:
    return rules.HeaderFacts(info.origin, info.lo, info.hi, info.hlc_first, info.hlc_last,
                             info.prev_hash, info.block_hash)


def signed_header(site: Site, raw: bytes) -> blocks.BlockInfo | None:
    """A signed block header from elsewhere, if its origin (a member, retired or not) signed
    it for this family; None otherwise (evidence nobody could check is not evidence)."""
    try:
        info = blocks.read_block_header(raw, site.family_id, header_only=True)
    except blocks.BlockError:
        return None
    m = site.members_by_id(include_retired=True).get(info.origin)
    if m is None or not blocks.header_signed_by(info, m.ed25519, site.family_id):
        return None
    return info


def contradiction(site: Site, theirs: blocks.BlockInfo) -> tuple[int, bytes, bytes] | None:
    """(fork epoch, a, b) if a block we hold and ``theirs`` (signed, its hash known) prove
    that their origin signed two histories."""
    held = store.headers_overlapping(site.conn, theirs.origin, theirs.lo, theirs.hi)
    # A block trimmed here still proves a fork at its epochs: without it, an origin restored
    # from a backup that signed those epochs again split the family unseen.
    trimmed = store.trimmed_header_overlapping(site.conn, theirs.origin, theirs.lo, theirs.hi)
    for raw in held + ([trimmed] if trimmed is not None and trimmed not in held else []):
        ours = blocks.read_block_header(raw, site.family_id, header_only=True)
        e = rules.fork_epoch(facts(ours), facts(theirs))
        if e is not None:
            a, b = rules.canonical(raw, bytes(theirs.raw[:blocks.HEADER_LEN]))
            return e, a, b
    return None


def differing_op(site: Site, theirs: blocks.BlockInfo, held_to: int
                 ) -> tuple[int, bytes, bytes] | None:
    """(fork epoch, a, b) if ``theirs`` (verified, its body checked) holds, at an epoch we
    hold, another op than ours under the same clock and seq: its origin signed two histories
    whose blocks the headers alone do not tell apart (the same start and clock, other ends),
    which this site sees in the bodies.  The ops were compared only by their clocks, so the
    other version's record was skipped as held, and the sites held two values for good."""
    for epoch in differing_epochs(site, theirs, held_to):
        ours = store.headers_overlapping(site.conn, theirs.origin, epoch - 1, epoch)
        if ours:
            a, b = rules.canonical(ours[0], bytes(theirs.raw[:blocks.HEADER_LEN]))
            return epoch, a, b
    return None


def differing_epochs(site: Site, theirs: blocks.BlockInfo, held_to: int) -> Iterator[int]:
    """The epochs up to ``held_to`` at which ``theirs`` holds another op than the one we
    hold, in order."""
    hi = min(theirs.hi, held_to)
    mine = {op.epoch: op for op in chain.iter_ops(site.conn, theirs.origin, theirs.lo, hi)}
    for op in blocks.decode_ops(theirs):
        if op.epoch > hi:
            break
        held = mine.get(op.epoch)
        if held is not None and _op_bytes(held) != _op_bytes(op):
            yield op.epoch


def _op_bytes(op) -> tuple:
    return (op.hlc, op.seq, op.collection, op.key,
            None if op.value is None else bytes(op.value), bytes(op.replaced))


def note(site: Site, origin: bytes, epoch: int, a: bytes, b: bytes,
         shown_by: Header | None = None) -> bool:
    """Keep evidence; returns whether it is new here.  Evidence about our own origin makes us
    heal at once, if the header of the packet that showed it (``shown_by``: its sender's word
    on our own history) or what we set aside tells which version the family holds
    (:func:`_heal_own`)."""
    new = store.record(site.conn, origin, epoch, a, b, wall_ms())
    if new and origin == site.site_id:
        _heal_own(site, store.Fork(origin, epoch, a, b, 0, store.OPEN), shown_by)
    return new


def learn(site: Site, h: Header) -> list[store.Fork]:
    """What a verified header shows: evidence it carries, and heads that contradict blocks
    we hold.  Returns the forks new here.  Signatures are checked only where something would
    be kept (evidence we already hold, and heads that agree with us, cost no verification)."""
    before = {(f.origin, f.a, f.b) for f in store.all_forks(site.conn)}
    shown_by = h if h.sender != site.site_id else None
    for a, b in h.forks:
        a, b = rules.canonical(a, b)
        if store.known(site.conn, a[6:14], a, b):
            continue
        ia, ib = signed_header(site, a), signed_header(site, b)
        if ia is None or ib is None:
            continue
        e = rules.fork_epoch(facts(ia), facts(ib))
        if e is not None:
            note(site, ia.origin, e, a, b, shown_by)
    # Evidence of our own fork that an earlier packet showed without saying which version
    # its sender holds waits for one that does.
    for f in store.open_forks(site.conn, site.site_id):
        _heal_own(site, f, shown_by)
    for raw in h.heads:
        try:
            info = blocks.read_block_header(raw, site.family_id, header_only=True)
        except blocks.BlockError:
            continue
        found = contradiction(site, info)
        if found is not None and signed_header(site, raw) is not None:
            note(site, info.origin, *found)
    take_word(site, h)
    settle_by_word(site)
    return [f for f in store.all_forks(site.conn) if (f.origin, f.a, f.b) not in before]


def _heal_own(site: Site, f: store.Fork, shown_by: Header | None) -> None:
    """Evidence that we signed two histories (restored from a backup, then written to, or a
    copy of this site that still runs): keep the version our peers hold
    (:func:`syncpack.rules.forks.own_keep`).  If it is not ours, our own ops step aside from
    the fork epoch; the family sends its version back and what is left is issued again under
    new epochs, so nothing is lost and no epoch is used twice.  If it is ours (the other copy's
    reached the peers second), we say so and keep it: setting it aside made this copy refuse
    the family's version as the one it left.  ``shown_by`` is the header of the packet that
    showed the fork (or a later one); if its sender holds none of our ops from the fork on,
    and we set neither version aside, the fork stays open until a packet tells."""
    me = site.site_id
    ours = {bytes(x) for x in store.headers_overlapping(site.conn, me, f.epoch - 1, f.epoch)}
    aside = recovery.set_aside_headers(site)
    choice = rules.own_keep((f.a in ours, f.b in ours), (f.a in aside, f.b in aside),
                            _sender_holds_ours(site, f.epoch, shown_by))
    if choice == rules.WAIT:
        return
    keep = None if choice is None else (f.a, f.b)[choice]
    if keep is not None:
        # said from now on, or the family would refuse this site's packets for good
        _keep(site, keep)
        _lose(site, f, keep)
        other = f.a if keep == f.b else f.b
        if other in ours or (keep not in ours
                             and chain.op_id_at(site.conn, me, f.epoch) is not None):
            # we hold the other version (again: another member's tip named it as ours and
            # brought it back before the evidence came), or an op of that epoch outside the
            # kept block: one of ours written after the restore (a peer's tip had set aside
            # only what lay above it), which sealed would sign that epoch once more
            recovery.stash_own(site, f"this site signed two versions of its epoch {f.epoch} "
                                     f"(a peer holds the other one: {recovery.COPIED})",
                           from_epoch=f.epoch)
        elif keep in ours:
            # peers holding the other version revert it once a packet of ours tells them
            recovery.wait_until_told(
                site, f"this site signed two versions of its epoch {f.epoch}; it keeps its own, "
                      f"which its peers hold, and waits until each has heard "
                      f"({recovery.COPIED})")
    store.set_state(site.conn, f, store.HEALED)


def _sender_holds_ours(site: Site, epoch: int, h: Header | None) -> bool | None:
    """Whether the sender of ``h`` holds our version from the fork ``epoch`` on: its tip (its
    newest op of our origin) is the op we hold at that epoch (a fork changes every CSN from
    where it happens).  None if it holds none of our ops from the fork on (it never took
    either version, or reverted one): its packet does not tell."""
    if h is None or h.vector.get(site.site_id, 0) < epoch:
        return None
    if h.tip is None or h.tip[0] < epoch:
        # It holds our epochs past the fork but names no op there: it trimmed them, once
        # every member acknowledged them, this site too, before it signed the version it
        # holds now (a careless restore): the family's is the other.
        return False
    e, csn = h.tip
    mine = chain.op_id_at(site.conn, site.site_id, e)
    return mine is not None and pack_csn(mine[0], site.site_id, mine[1]) == csn


def _keep(site: Site, header: bytes) -> None:
    """Say in our packets, from now on, that the block of ``header`` is the version kept."""
    keep = blocks.read_block_header(header, site.family_id, header_only=True).block_hash
    site.set_meta("fork_kept", codec.packb([keep, *kept_for_header(site)][:MAX_KEPT]))
    _remember_word(site, [(keep, site.signer()(codec.kept_signed_bytes(
        site.family_id, site.site_id, keep)))])


# How many lost versions a site remembers (the newest): a peer holding one reverts it once it
# hears which was kept, within a few rounds.
MAX_LOST = 64


def lost_versions(site: Site) -> set[bytes]:
    """Signed headers of the blocks that lost at forks this site saw settled (healed: the
    origin said which version it kept; ended: the forked member was retired).  A peer that
    has not heard yet may still send one; it is never applied (it would be a history the
    family left, held here for good)."""
    return set(_lost(site))


def _lost(site: Site) -> list[bytes]:
    raw = site.meta("fork_lost")
    return [bytes(h) for h in codec.unpackb(raw)] if raw else []


def _remember_lost(site: Site, lose: bytes, instead_of: frozenset[bytes] = frozenset()
                   ) -> None:
    """Remember ``lose`` (newest first), forgetting ``instead_of``: blocks an earlier decision
    named, which may be of the history kept now."""
    have = [h for h in _lost(site) if h != lose and h not in instead_of]
    site.set_meta("fork_lost", codec.packb(([lose] + have)[:MAX_LOST]))


def _lose(site: Site, f: store.Fork, kept: bytes) -> None:
    _remember_lost(site, f.b if kept == f.a else f.a)


def frozen(site: Site) -> dict[bytes, int]:
    """Origins frozen here (open evidence), each with its fork epoch; never our own."""
    return {o: e for o, e in store.frozen(site.conn).items() if o != site.site_id}


def note_kept(site: Site, h: Header) -> None:
    """A packet of a frozen member naming, in its signed header, the version it kept at a
    fork: it healed.  If it kept the version we do not hold, ours is reverted and the kept one
    comes in ordinary rounds.  Not if it said, signed, that it kept the other one too
    (:func:`settle_by_word`)."""
    if not h.kept or h.sender == site.site_id:
        return
    take_word(site, h)
    said = _said(site)
    forks = store.all_forks(site.conn)
    hash_of = _hashes(site, forks)
    if h.sender in _liars(forks, hash_of, said):
        return
    # only with its signed word, which every member passes on: healed on the header alone,
    # a site kept what the member told it without a word that could meet the other one
    kept = set(h.kept) & said
    for f in forks:
        chosen = [raw for raw in (f.a, f.b) if hash_of[raw] in kept]
        if f.origin == h.sender and f.state == store.OPEN and len(chosen) == 1:
            _settle(site, f, chosen[0])
            _note_told_healed(site, f.origin, h.seq, f.epoch)


def _settle(site: Site, f: store.Fork, keep: bytes) -> None:
    """Keep the version ``keep`` of fork ``f``, as its origin said: a version of the other
    history held here is reverted (the kept one comes in ordinary rounds), and the other is
    remembered as lost instead of whatever an earlier decision named."""
    held = store.headers_overlapping(site.conn, f.origin, f.epoch - 1, f.epoch)
    lose = f.b if keep == f.a else f.a
    if held and keep not in held and (lose in held or _against(site, held, keep)):
        store.revert_from(site.conn, f.origin, f.epoch)
        site.invalidate()
    elif not held:
        _revert_trimmed(site, f, keep)
    _remember_lost(site, lose, frozenset((f.a, f.b)))
    store.set_state(site.conn, f, store.HEALED)


def _words(site: Site) -> list[tuple[bytes, bytes, int]]:
    """(block hash, its origin's signature, when it came here), newest first: every word
    verified here, each of a block of evidence held here (kept for good, as the evidence is:
    dropped at a cap, the older of a liar's two words went, and a site then settled the
    fork again on the one left)."""
    raw = site.meta("fork_kept_by")
    return [(bytes(k), bytes(sig), ms) for k, sig, ms in codec.unpackb(raw)] if raw else []


def _said(site: Site) -> set[bytes]:
    return {k for k, _sig, _ms in _words(site)}


def _remember_word(site: Site, words: list[tuple[bytes, bytes]]) -> None:
    have = _words(site)
    known = {k for k, _sig, _ms in have}
    now = wall_ms()
    new = [(k, sig, now) for k, sig in dict(words).items() if k not in known]
    if new:
        site.set_meta("fork_kept_by", codec.packb([list(w) for w in new + have]))


def _told_key(peer: bytes) -> str:
    return "fork_told:" + peer.hex()


def _told(site: Site, peer: bytes) -> set[bytes]:
    """The words (by block hash) and the pieces of evidence (by :func:`_piece`) ``peer`` has
    been given."""
    raw = site.meta(_told_key(peer))
    return {bytes(k) for k in codec.unpackb(raw)} if raw else set()


def _piece(a: bytes, b: bytes) -> bytes:
    return hashlib.blake2b(a + b, digest_size=16).digest()


def note_told(site: Site, peer: bytes, h: Header) -> None:
    """After an export: ``peer`` has been given the words and evidence of header ``h``."""
    given = {k for k, _sig in h.kept_by} | {_piece(a, b) for a, b in h.forks}
    if given - (told := _told(site, peer)):
        site.set_meta(_told_key(peer), codec.packb(sorted(told | given)))


def forget_told(site: Site, peer: bytes) -> None:
    """``peer`` lost what we told it (restored from a backup): everything goes again."""
    if site.meta(_told_key(peer)) is not None:
        site.set_meta(_told_key(peer), codec.packb([]))


def news_for(site: Site, peer: bytes) -> bool:
    """Whether we hold a word or a piece of evidence ``peer`` has not been given: it must
    hear it, even when nothing else is to be sent (the member it concerns may never write to
    it again), and every one of them, whatever came after it (a member's newer forks and
    words crowded older ones out of the 16 a packet carries, for good)."""
    told = _told(site, peer)
    return bool(_said(site) - told) or any(
        _piece(f.a, f.b) not in told for f in store.all_forks(site.conn))


def _hashes(site: Site, forks: list[store.Fork]) -> dict[bytes, bytes]:
    """Signed header -> its block hash, for both headers of each of ``forks``."""
    return {raw: blocks.read_block_header(raw, site.family_id, header_only=True).block_hash
            for f in forks for raw in (f.a, f.b)}


def _liars(forks: list[store.Fork], hash_of: dict[bytes, bytes], said: set[bytes]
           ) -> set[bytes]:
    """Origins that said, signed, that they kept each of the two versions of one of their
    ``forks``: none of their words counts."""
    return {f.origin for f in forks if hash_of[f.a] in said and hash_of[f.b] in said}


def take_word(site: Site, h: Header) -> None:
    """Keep the signed words of which version an origin kept at a fork (``kept_by``) that
    verify: each names one block of evidence we hold, signed by that block's origin.  A word
    of a block we hold no evidence of is passed over; it comes again with the evidence."""
    said = _said(site)
    fresh = [(k, sig) for k, sig in h.kept_by if k not in said]
    if not fresh:
        return
    forks = store.all_forks(site.conn)
    hash_of = _hashes(site, forks)
    origin_of = {hash_of[raw]: f.origin for f in forks for raw in (f.a, f.b)}
    members = site.members_by_id(include_retired=True)
    good = [(k, sig) for k, sig in fresh if k in origin_of and origin_of[k] in members
            and keys.verify(members[origin_of[k]].ed25519, sig,
                            codec.kept_signed_bytes(site.family_id, origin_of[k], k))]
    _remember_word(site, good)


def settle_by_word(site: Site) -> None:
    """Forks of other origins settled by the origin's signed word, however it came (from the
    origin itself, or passed on by any member): every site keeps the version it named, so a
    member that heard the word only through others, or only after the origin was retired,
    keeps the same history as those that heard it first.  An origin that said, signed, that
    it kept each of the two versions of one fork (two running copies, or a liar telling each
    site what it holds) settled nothing, there or at any other fork of its own: each is open
    again wherever it counted as healed, and retiring the member ends them with one history
    everywhere (:func:`end_retired`)."""
    said = _said(site)
    if not said:
        return
    forks = store.all_forks(site.conn)
    hash_of = _hashes(site, forks)
    liars = _liars(forks, hash_of, said)
    reopened = False
    for f in forks:
        if f.origin == site.site_id:
            continue
        if f.origin in liars:
            # a member that lied at one fork settled none: each is open again, and its
            # retirement ends them all from the evidence alone
            if f.state == store.HEALED:
                store.set_state(site.conn, f, store.OPEN)
                reopened = True
            continue
        named = [raw for raw in (f.a, f.b) if hash_of[raw] in said]
        if len(named) == 1 and f.state != store.HEALED:
            _settle(site, f, named[0])
    if reopened:
        end_retired(site)


# How many heals told by the forked member itself a site remembers (the newest).
MAX_TOLD_HEALED = 64


def _told_healed(site: Site) -> list[tuple[bytes, int, int]]:
    raw = site.meta("fork_told_healed")
    return [(bytes(o), s, e) for o, s, e in codec.unpackb(raw)] if raw else []


def _note_told_healed(site: Site, origin: bytes, seq: int, epoch: int) -> None:
    """The packet ``seq`` of ``origin`` was the first to tell us which version it kept at its
    fork from ``epoch``."""
    have = [t for t in _told_healed(site) if (t[0], t[2]) != (origin, epoch)]
    site.set_meta("fork_told_healed", codec.packb(
        [[o, s, e] for o, s, e in ([(origin, seq, epoch)] + have)[:MAX_TOLD_HEALED]]))


def sent_before_healing(site: Site, h: Header) -> set[bytes]:
    """The origins of ``h``'s ranges whose ops it may carry from a version it left at a fork:
    ``h`` is a packet of the forked member itself, numbered before the one that told us
    which version it kept, and its range reaches the fork.  A transaction that travelled in
    parts has its later parts parked here while the fork is open; the member then kept the
    other version and issued its ops again, and such a part, retried, no longer continues
    what we hold.  It is not new evidence of a fork."""
    out = set()
    for origin, seq, epoch in _told_healed(site):
        if origin == h.sender and h.seq < seq and h.ranges.get(origin, (0, 0))[1] >= epoch:
            out.add(origin)
    return out


def kept_for_header(site: Site) -> list[bytes]:
    """What our packets say we kept at forks of our own history (newest first)."""
    raw = site.meta("fork_kept")
    return list(codec.unpackb(raw))[:MAX_KEPT] if raw else []


def refuse_sender(site: Site, h: Header) -> None:
    """A packet from a member frozen here is refused, naming the evidence."""
    fs = store.open_forks(site.conn, h.sender)
    if fs and h.sender != site.site_id:
        f = fs[0]
        raise ForkedMemberError(
            f"{site.name_of(h.sender)} signed two histories of its epoch {f.epoch} (evidence: "
            f"blocks {_short(site, f.a)} and {_short(site, f.b)}); its packets are refused "
            f"until it heals or is retired")


def _short(site: Site, raw: bytes) -> str:
    info = blocks.read_block_header(raw, site.family_id, header_only=True)
    return f"{info.lo + 1}..{info.hi} #{info.block_hash.hex()[:12]}"


def describe(site: Site, f: store.Fork) -> dict:
    a = blocks.read_block_header(f.a, site.family_id, header_only=True)
    b = blocks.read_block_header(f.b, site.family_id, header_only=True)
    held = store.headers_overlapping(site.conn, f.origin, f.epoch - 1, f.epoch)
    return {"origin": site.name_of(f.origin), "epoch": f.epoch, "state": f.state,
            "found_ms": f.found_ms,
            "blocks": [{"epochs": [x.lo + 1, x.hi], "hash": x.block_hash.hex(),
                        "held_here": raw in held} for x, raw in ((a, f.a), (b, f.b))]}


def for_header(site: Site, peer: bytes, room: int | None = None
               ) -> tuple[list[bytes], list[tuple[bytes, bytes]], list[tuple[bytes, bytes]],
                          list[tuple[bytes, int, bytes]]]:
    """What a packet to ``peer`` says of forks, within ``room`` header bytes (None: the
    per-field limits only): what we kept at forks of our own history; the origins' signed
    words of which version they kept that the peer has not been given (ours first), each with
    its evidence; then our other evidence, what the peer has not been given first, open and
    healed before ended (a member that has not heard of a fork yet still needs it to keep the
    same history when the forked member is retired); and our newest block of origins the peer
    has not been shown."""
    left = (1 << 62) if room is None else room
    kept = []
    for k in kept_for_header(site):
        if left < 34:
            break
        kept.append(k)
        left -= 34
    forks = list(reversed(store.all_forks(site.conn)))
    hash_of = _hashes(site, forks)
    pair_of = {hash_of[raw]: (f.origin, f.a, f.b) for f in forks for raw in (f.a, f.b)}
    ev: list[tuple[bytes, bytes]] = []
    words: list[tuple[bytes, bytes]] = []

    def give(k: bytes, sig: bytes) -> None:
        # a word with its evidence, which the peer needs to check it
        nonlocal left
        _o, a, b = pair_of[k]
        need = 100 + (0 if (a, b) in ev else 2 * 188)
        if len(words) < MAX_KEPT and left >= need and ((a, b) in ev or len(ev) < MAX_FORKS):
            words.append((k, sig))
            if (a, b) not in ev:
                ev.append((a, b))
            left -= need

    # Words the peer has not been given, ours first (a restored site's word is what unfreezes
    # it), then other origins' with both of a fork's words first (the proof of a lie), each
    # in turn: the newest alone would let a member crowd its older word out for good.
    told, held = _told(site, peer), _words(site)
    said = {k for k, _sig, _ms in held}
    both = {k for k, (_o, a, b) in pair_of.items() if hash_of[a] in said and hash_of[b] in said}
    untold = [(k, sig) for k, sig, _ms in held if k not in told and k in pair_of]
    for k, sig in sorted(untold, key=lambda w: (pair_of[w[0]][0] != site.site_id,
                                                w[0] not in both)):
        give(k, sig)
    # then evidence the peer has not been given, open and healed first, then the rest
    for f in sorted(forks, key=lambda f: (_piece(f.a, f.b) in told, f.state == store.ENDED)):
        if len(ev) == MAX_FORKS or left < 2 * 188:
            break
        if (f.a, f.b) not in ev:
            ev.append((f.a, f.b))
            left -= 2 * 188
    heads = store.heads_to_tell(site.conn, peer, min(HEADS_PER_PACKET, max(0, left // 188)))
    return kept, ev, words, heads


def end_retired(site: Site) -> int:
    """Forks of members retired since: one history is kept everywhere, the winner of the
    deciding piece of evidence (:func:`syncpack.rules.forks.deciding`).  A site holding the
    other one reverts the origin's ops from the fork on (they come back, the kept version,
    from any peer that holds it).  Returns how many forks ended."""
    retired = {o for o, m in site.members_by_id(include_retired=True).items() if m.retired}
    by_origin: dict[bytes, list[store.Fork]] = {}
    for f in store.all_forks(site.conn):
        if f.origin in retired and f.state != store.HEALED:     # healed: settled by the origin
            by_origin.setdefault(f.origin, []).append(f)
    n = 0
    for origin, fs in by_origin.items():
        fresh = [f for f in fs if f.state == store.OPEN]
        if not fresh:
            continue
        epoch, a_raw, b_raw = rules.deciding([(f.epoch, f.a, f.b) for f in fs])
        a = blocks.read_block_header(a_raw, site.family_id, header_only=True)
        b = blocks.read_block_header(b_raw, site.family_id, header_only=True)
        won = rules.winner(facts(a), facts(b))
        keep, lose = (a_raw, b_raw) if won.block_hash == a.block_hash else (b_raw, a_raw)
        held = store.headers_overlapping(site.conn, origin, epoch - 1, epoch)
        if keep not in held and (lose in held or _against(site, held, keep)):
            store.revert_from(site.conn, origin, epoch)
            site.invalidate()
        elif not held:
            _revert_trimmed(site, store.Fork(origin, epoch, a_raw, b_raw, 0, store.OPEN), keep)
        _remember_lost(site, lose, frozenset(h for f in fs for h in (f.a, f.b)))
        for f in fresh:
            store.set_state(site.conn, f, store.ENDED)
        n += len(fresh)
    return n


def _revert_trimmed(site: Site, f: store.Fork, keep: bytes) -> None:
    """The version not kept at ``f`` is the one this site held and has since trimmed (found
    by the header kept from the trim): nothing was reverted, the site kept its values while
    its peers took the kept version, and refused that version for good as the one that
    lost.  Its versions go by their clocks, and the kept history comes in again."""
    trimmed = store.trimmed_header_overlapping(site.conn, f.origin, f.epoch - 1, f.epoch)
    if trimmed is None or trimmed == keep:
        return
    if trimmed not in (f.a, f.b) and not _against(site, [trimmed], keep):
        return      # the same history, sealed in other parts
    info = blocks.read_block_header(trimmed, site.family_id, header_only=True)
    store.revert_from(site.conn, f.origin, f.epoch)     # its later blocks we still hold
    store.revert_trimmed(site.conn, f.origin, info.lo, info.hlc_first)
    site.invalidate()


def _against(site: Site, held: list[bytes], keep: bytes) -> bool:
    """Whether a block we hold is proved to be of another history than ``keep`` (the same
    history sealed in other parts never is)."""
    k = facts(blocks.read_block_header(keep, site.family_id, header_only=True))
    return any(rules.fork_epoch(facts(blocks.read_block_header(h, site.family_id,
                                                               header_only=True)), k)
               is not None for h in held)
