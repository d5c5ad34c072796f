"""The site's local settings and identity as stored.  Owns the table ``meta`` (site id and
name, family id and name, joined flag, clock, recovery state and its bookkeeping).

Everything here runs on the caller's connection, inside the caller's transaction for writes."""

from __future__ import annotations

from typing import Any, Iterable


def read_all(conn) -> dict[str, Any]:
    """Every metadata value, by key."""
    return dict(conn.execute("SELECT key, value FROM meta"))


def get(conn, key: str, default: Any = None) -> Any:
    row = conn.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
    return row[0] if row else default


def put(conn, key: str, value: Any) -> None:
    conn.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))


def put_many(conn, items: Iterable[tuple[str, Any]]) -> None:
    conn.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", list(items))


def create(conn, items: Iterable[tuple[str, Any]]) -> None:
    """The first values of a new store (refuses keys already there)."""
    conn.executemany("INSERT INTO meta VALUES (?, ?)", list(items))


def remove(conn, key: str) -> None:
    conn.execute("DELETE FROM meta WHERE key=?", (key,))
