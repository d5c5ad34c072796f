"""A private temporary database for work larger than memory: fsck's replay of the changelog,
which must see every op of one key together while the changelog is ordered by origin.

It is SQLite's own temporary file (an empty file name), not in the site directory, removed
when closed; SQLite's sorter keeps memory flat however many ops there are (the replay held
them all in memory before: 1.6 GB for a store of 1M ops)."""

from __future__ import annotations

from itertools import groupby, islice
from operator import itemgetter
from typing import Iterable, Iterator

import apsw

_BATCH = 10_000


class OpsByKey:
    """Ops ``(collection, key, csn, value, replaced)`` put in :meth:`add`, read back grouped
    by key in :meth:`groups`; :meth:`holds` says whether one has a given CSN."""

    def __init__(self) -> None:
        self._conn = apsw.Connection("")
        self._conn.execute("PRAGMA journal_mode=OFF")
        self._conn.execute("PRAGMA synchronous=OFF")
        self._conn.execute("CREATE TABLE ops(collection TEXT, key TEXT, csn BLOB, value BLOB, "
                           "replaced BLOB)")
        self._indexed = False

    def add(self, rows: Iterable[tuple[str, str, bytes, bytes | None, bytes]]) -> None:
        rows = iter(rows)
        with self._conn:
            while batch := list(islice(rows, _BATCH)):
                self._conn.executemany("INSERT INTO ops VALUES (?, ?, ?, ?, ?)", batch)

    def _index(self) -> None:
        if not self._indexed:
            self._conn.execute("CREATE INDEX ops_csn ON ops(csn)")
            self._indexed = True

    def holds(self, csn: bytes) -> bool:
        self._index()
        return self._conn.execute("SELECT 1 FROM ops WHERE csn=? LIMIT 1", (csn,)
                                  ).fetchone() is not None

    def groups(self) -> Iterator[tuple[tuple[str, str], list[tuple[bytes, bytes | None, bytes]]]]:
        """((collection, key), [(csn, value, replaced)...] in CSN order), in (collection, key)
        order (SQLite's, the same as the store's versions)."""
        self._index()
        cur = self._conn.execute("SELECT collection, key, csn, value, replaced FROM ops "
                                 "ORDER BY collection, key, csn")
        for k, rows in groupby(cur, key=itemgetter(0, 1)):
            yield k, [r[2:] for r in rows]

    def close(self) -> None:
        self._conn.close()
