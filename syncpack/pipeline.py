"""Two stages of one piece of work on two cores: the GIL is released while SQLite runs a
statement, while zstd (de)compresses and while a signature is checked, so a thread that
prepares the next batch (parsing, decoding, reading another file) overlaps the one that
writes the current one.  Used by capture, import and load."""

from __future__ import annotations

import queue
import threading
from typing import Iterator, TypeVar

T = TypeVar("T")


def read_ahead(items: Iterator[T], depth: int = 2, name: str = "syncpack-read-ahead"
               ) -> Iterator[T]:
    """``items``, produced by another thread up to ``depth`` ahead.  The producer is the only
    user of whatever it reads from until it is done; an error on either side stops both, and
    the producer's is raised here, where its item would have been taken."""
    q: queue.Queue = queue.Queue(depth)
    stop = threading.Event()

    def put(item) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.05)
                return True
            except queue.Full:
                pass
        return False

    def produce() -> None:
        try:
            for x in items:
                if not put((True, x)):
                    return
            put((False, None))
        except BaseException as e:      # handed to the consumer, raised there
            put((False, e))

    th = threading.Thread(target=produce, name=name, daemon=True)
    th.start()
    try:
        while True:
            more, x = q.get()
            if not more:
                if x is not None:
                    raise x
                return
            yield x
    finally:
        stop.set()
        th.join()
