"""Two stages of one piece of work on two cores: the GIL is released while SQLite runs a
statement, while zstd (de)compresses and while a signature is checked, so a thread that
prepares the next batch (parsing, decoding, reading another file) overlaps the one that
writes the current one.  Used by capture, import and load."""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable, Iterator, TypeVar

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


class Pending:
    """The result of a call a :class:`Worker` makes later: :meth:`result` waits for it and
    returns it, or raises what the call raised."""

    __slots__ = ("_done", "_value", "_error")

    def __init__(self) -> None:
        self._done = threading.Event()
        self._value: Any = None
        self._error: BaseException | None = None

    def finish(self, value: Any = None, error: BaseException | None = None) -> None:
        self._value, self._error = value, error
        self._done.set()

    def result(self) -> Any:
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._value


class Worker:
    """One thread making submitted calls in order (``with Worker(name) as w: w.submit(...)``).
    Leaving the block drops the calls not yet begun and waits for the one running, so the
    thread never outlives the work it serves.  (concurrent.futures would do as well, but its
    import, with logging's, cost every command's start ~30 ms.)"""

    def __init__(self, name: str):
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._stop = False
        self._name = name
        self._th: threading.Thread | None = None

    def __enter__(self) -> "Worker":
        return self

    def __exit__(self, *exc) -> None:
        self._stop = True
        if self._th is not None:
            self._q.put(None)
            self._th.join()
            self._th = None

    def submit(self, fn: Callable[..., Any], *args) -> Pending:
        if self._stop:
            raise RuntimeError("the worker has been left")
        if self._th is None:
            # started by the first call only: an idle thread beside an import of large
            # blocks (never decoded ahead) raised its peak memory by 16 MB
            th = threading.Thread(target=self._run, name=self._name, daemon=True)
            # kept only once started: a Ctrl-C inside start() left a thread that leaving the
            # block then joined, and "cannot join thread before it is started" hid the Ctrl-C
            th.start()
            self._th = th
        p = Pending()
        self._q.put((p, fn, args))
        return p

    def _run(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                return
            self._call(*item)
            # nothing of the call may stay referenced here while the next is awaited: a
            # decompressed block held by this frame added its size to an import's peak
            del item

    def _call(self, p: Pending, fn: Callable[..., Any], args: tuple) -> None:
        if self._stop:
            p.finish(error=RuntimeError("dropped: the worker was leaving"))
            return
        try:
            p.finish(fn(*args))
        except BaseException as e:      # handed to whoever waits for the result
            p.finish(error=e)
