"""How library functions report progress to whoever shows it.

A ``progress`` argument is a callable taking the number of units (ops, records) just done.  It
may also have an ``expect(n)`` method, told how many more units are coming as soon as a function
knows, so a display can show a percentage and the time left.  A plain callable keeps working:
:func:`expect` only calls the method when it is there.
"""

from __future__ import annotations

from typing import Callable, Optional, Protocol


class Progress(Protocol):
    def __call__(self, done: int) -> None: ...

    def expect(self, more: int) -> None: ...


ProgressArg = Optional[Callable[[int], None]]


def expect(progress: ProgressArg, more: int) -> None:
    """Tell ``progress`` that ``more`` units of work are coming (if it wants to know)."""
    f = getattr(progress, "expect", None)
    if f is not None and more > 0:
        f(more)
