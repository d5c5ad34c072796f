"""What one key's surviving versions must be, replayed from the ops that wrote it (fsck).

Pure: the caller reads the ops and versions, this decides.  Keys are independent (an op only
supersedes versions of its own key, :func:`syncpack.store.versions.apply_version`), so a replay
one key at a time, in CSN order within the key, is the replay of the whole changelog.
"""

from __future__ import annotations

from typing import Callable, Iterable


def replay_key(base: Iterable[tuple[bytes, bytes | None]],
               ops: Iterable[tuple[bytes, bytes | None, Iterable[bytes]]],
               logged: Callable[[bytes], bool]) -> dict[bytes, bytes | None]:
    """The surviving versions ``{csn: value}`` of one key after its ``ops``.

    ``base``: the versions held whose op is not (from a snapshot, or trimmed), which the ops
    start from.  ``ops``: ``(csn, value, replaced CSNs)`` in CSN order.  ``logged(csn)``: whether
    an op with that CSN is held, of any key.  An op lists what it supersedes; one it lists that
    is neither a version now nor a held op may still arrive, and stays superseded when it does
    (as applying does)."""
    state = dict(base)
    superseded: set[bytes] = set()
    for csn, value, replaced in ops:
        for r in replaced:
            if state.pop(r, 0) == 0 and not logged(r):
                superseded.add(r)
        if csn not in superseded:
            state[csn] = value
    return state
