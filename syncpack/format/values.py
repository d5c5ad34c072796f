"""What a record value may be: plain JSON, so every site can store, ship and show it.

msgpack (the stored and shipped form) would also take bytes, NaN, infinities, non-string map
keys and more; such a value would replicate and then break every JSON reader of every site.
"""

from __future__ import annotations

import math
from typing import Any

from syncpack.errors import InvalidValueError

# Deeper than any real document; also what stops a list that contains itself.
MAX_DEPTH = 500


def check_json_value(value: Any) -> None:
    """Raise :class:`InvalidValueError` unless ``value`` is plain JSON: ``None``, ``bool``,
    ``int``, finite ``float``, ``str`` (valid Unicode), and ``list``/``tuple``/``dict`` (string
    keys) of those."""
    stack: list[tuple[Any, str, int]] = [(value, "value", 0)]
    while stack:
        v, where, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise InvalidValueError(f"{where} is nested more than {MAX_DEPTH} levels deep "
                                    f"(or contains itself)")
        if v is None or isinstance(v, (bool, int)):
            continue
        if isinstance(v, str):
            _check_text(v, where)
        elif isinstance(v, float):
            if not math.isfinite(v):
                raise InvalidValueError(f"{where} is {v!r}, which JSON cannot represent")
        elif isinstance(v, (list, tuple)):
            stack.extend((x, f"{where}[{i}]", depth + 1) for i, x in enumerate(v))
        elif isinstance(v, dict):
            for k, x in v.items():
                if not isinstance(k, str):
                    raise InvalidValueError(f"{where} has a {type(k).__name__} key {k!r}; "
                                            f"JSON object keys are strings")
                _check_text(k, f"a key of {where}")
                stack.append((x, f"{where}[{k!r}]", depth + 1))
        else:
            raise InvalidValueError(f"{where} is a {type(v).__name__}, which is not JSON")


def _check_text(s: str, where: str) -> None:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidValueError(f"{where} holds a lone surrogate, which is not valid "
                                f"Unicode text") from None
