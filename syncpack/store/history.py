"""What the store says an import committed: the truth an interrupted command reports from.

A Ctrl-C can arrive between a packet's COMMIT and the moment the caller notes it; counting
in memory would then under-report (or, printed late, over-report with the wrong exit code).
The ``packets_in`` rows are written in the same transaction as the packet's ops, so they say
exactly which packets are kept.
"""

from __future__ import annotations


def settle(conn) -> None:
    """Roll back a transaction an interruption left open (the store's own rollback already
    undid its changes; this only releases it so the connection can be read)."""
    if conn.in_transaction:
        conn.execute("ROLLBACK")


def applied_since(conn, at_ms: int) -> list[tuple[str, int]]:
    """``(path, ops)`` of every packet applied (committed) at or after wall-clock ``at_ms``,
    in the order applied."""
    return [(p or "", n) for p, n in conn.execute(
        "SELECT path, ops FROM packets_in WHERE at_ms>=? ORDER BY at_ms, seq, part",
        (at_ms,)).fetchall()]
