"""What a record value may be: plain JSON, so every site can store, ship and show it.

msgpack (the stored and shipped form) would also take bytes, NaN, infinities, non-string map
keys and more; such a value would replicate and then break every JSON reader of every site.
"""

from __future__ import annotations

import math
import operator
from typing import Any, Callable

import msgpack

from syncpack.errors import InvalidValueError
from syncpack.format import codec

# Deeper than any real document; also what stops a list that contains itself.
MAX_DEPTH = 500


def json_value_encoder() -> Callable[[Any], bytes]:
    """:func:`check_json_value` and :func:`codec.encode_value` in one step, for a writer of
    many values: a string, integer, boolean or null is only encoded (whatever the check would
    refuse in one, a lone surrogate, encoding refuses too, and the check then names it).
    Raises :class:`InvalidValueError`."""
    pack = codec.value_packer()

    def encode(value: Any) -> bytes:
        if _plain_json(value):
            try:
                return pack(value)
            except (ValueError, OverflowError):
                pass
        check_json_value(value)
        try:
            return codec.encode_value(value)
        except ValueError as e:
            raise InvalidValueError(str(e)) from None

    return encode


def _plain_json(value: Any) -> bool:
    """Whether ``value`` is surely plain JSON but for its text, which only encoding checks (a
    lone surrogate fails it): exact types, no path named.  False sends the value to
    :func:`check_json_value`, which accepts what this passes over (subclasses) and names
    what it refuses.  The check of a small record's every element with its path spelt out
    cost a one-put transaction a fifth of its Python time."""
    stack = [(value, 0)]
    pop, push = stack.pop, stack.append
    while stack:
        v, depth = pop()
        t = type(v)
        if t is str or t is int or t is bool or v is None:
            continue
        if depth >= MAX_DEPTH:
            return False
        if t is float:
            if not math.isfinite(v):
                return False
        elif t is dict:
            for k, x in v.items():
                if type(k) is not str:
                    return False
                push((x, depth + 1))
        elif t is list or t is tuple:
            for x in v:
                push((x, depth + 1))
        else:
            return False
    return True


def identical(a: Any, b: Any) -> bool:
    """Whether two decoded values are the same value, not merely equal in Python: 1 is not
    1.0, nor 0.0 -0.0, nor True 1, at any depth (two versions of a field that differ so are
    a conflict, and only one of them is what a site shows)."""
    if type(a) is not type(b):
        return False
    if type(a) is dict:
        return a.keys() == b.keys() and all(identical(a[k], b[k]) for k in a)
    if type(a) in (list, tuple):
        return len(a) == len(b) and all(map(identical, a, b))
    if type(a) is float:
        return a == b and math.copysign(1.0, a) == math.copysign(1.0, b) or a != a and b != b
    return a == b


def check_json_value(value: Any) -> None:
    """Raise :class:`InvalidValueError` unless ``value`` is plain JSON: ``None``, ``bool``,
    ``int``, finite ``float``, ``str`` (valid Unicode), and ``list``/``tuple``/``dict`` (string
    keys) of those."""
    stack: list[tuple[Any, str, int]] = [(value, "value", 0)]
    while stack:
        v, where, depth = stack.pop()
        if depth > MAX_DEPTH:
            # (its path would be MAX_DEPTH steps long: the first few name it)
            raise InvalidValueError(f"{where[:40]}... is nested more than {MAX_DEPTH} levels "
                                    f"deep (or contains itself)")
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


# --- patches: a write of a merge collection that sends only the fields it changed -------------
#
# formats/VALUES.md is the specification.  A patch is an op value that is a msgpack ext of type
# PATCH_EXT: never a record (records are plain JSON, which has no ext), so it cannot be taken for
# one.  Its payload is PATCH_VERSION, then one msgpack array [set, removed]: ``set`` a map of the
# fields the write set (name -> value), ``removed`` an array of the field names it removed.  The
# base it applies to is the op's one replaced CSN.

PATCH_EXT = 0x50        # 'P'
PATCH_VERSION = 1
# First bytes of a msgpack ext (fixext 1/2/4/8/16, ext 8/16/32): a value starting otherwise is
# surely no patch, so most values are passed over on their first byte.
_EXT_LEADS = frozenset(b"\xd4\xd5\xd6\xd7\xd8\xc7\xc8\xc9")


class PatchFormatError(ValueError):
    """A value claims to be a patch (an ext of type PATCH_EXT) but is not a valid one."""


def claims_patch(raw: bytes | None) -> bool:
    """Whether an op value is meant as a patch (it may still be malformed:
    :func:`read_patch` says).  Cheap: a record value fails on its first byte."""
    if not raw or raw[0] not in _EXT_LEADS:
        return False
    try:
        obj = msgpack.unpackb(raw, raw=False, strict_map_key=False, max_ext_len=len(raw))
    except Exception:    # noqa: BLE001 - any undecodable value is no patch claim here
        return False
    return isinstance(obj, msgpack.ExtType) and obj.code == PATCH_EXT


def read_patch(raw: bytes) -> tuple[dict[str, bytes], list[str]]:
    """The (set fields as name -> msgpack bytes, removed names) of a patch value.  Untrusted
    input: raises :class:`PatchFormatError` for anything but a well-formed patch."""
    try:
        obj = msgpack.unpackb(raw, raw=False, strict_map_key=False, max_ext_len=len(raw))
    except Exception:    # noqa: BLE001
        raise PatchFormatError("not a msgpack value") from None
    if not isinstance(obj, msgpack.ExtType) or obj.code != PATCH_EXT:
        raise PatchFormatError("not a patch")
    data = obj.data
    if not data or data[0] != PATCH_VERSION:
        raise PatchFormatError(f"patch version {data[0] if data else 'missing'} is not "
                               f"{PATCH_VERSION}")
    try:
        body = msgpack.unpackb(data[1:], raw=False, strict_map_key=False, max_ext_len=0)
    except Exception:    # noqa: BLE001
        raise PatchFormatError("patch body is not one msgpack array") from None
    if not (isinstance(body, list) and len(body) == 2 and isinstance(body[0], dict)
            and isinstance(body[1], list)):
        raise PatchFormatError("patch body is not [set map, removed array]")
    setf, removed = body
    if not all(isinstance(k, str) for k in setf) or \
            not all(isinstance(k, str) for k in removed):
        raise PatchFormatError("patch names a field that is not a string")
    if len(set(removed)) != len(removed) or set(removed) & set(setf):
        raise PatchFormatError("patch removes a field twice or sets one it removes")
    # Values are as a record holds them: JSON for put's records, and also bytes and infinite
    # floats for an attached table's rows (attach/rows.py); an ext (a patch inside a patch)
    # was refused by the decoding above.
    return {k: codec.packb(v) for k, v in setf.items()}, removed


def make_patch(base: dict[str, bytes], new: dict[str, bytes]) -> bytes:
    """The patch that turns record ``base`` into ``new`` (both as field -> msgpack bytes): the
    fields whose bytes differ, in ``new``'s order, and the fields ``new`` lacks, sorted."""
    setf = b"".join(codec.packb(k) + v for k, v in new.items()
                    if base.get(k) != v)
    n = sum(1 for k, v in new.items() if base.get(k) != v)
    removed = sorted(k for k in base if k not in new)
    body = (b"\x92" + _map_header(n) + setf + codec.packb(removed))
    return codec.packb(msgpack.ExtType(PATCH_EXT, bytes([PATCH_VERSION]) + body))


def _map_header(n: int) -> bytes:
    if n < 16:
        return bytes([0x80 | n])
    if n < 1 << 16:
        return b"\xde" + n.to_bytes(2, "big")
    return b"\xdf" + n.to_bytes(4, "big")


def patched(base: dict[str, bytes], setf: dict[str, bytes], removed: list[str]
            ) -> dict[str, bytes]:
    """The record a patch makes of ``base``: its fields in its order, changed ones in place,
    removed ones dropped, new ones after them in the patch's order.  Every site (the writer
    included) keeps exactly this, so the record's bytes are the same everywhere."""
    gone = set(removed)
    out = {k: setf.get(k, v) for k, v in base.items() if k not in gone}
    for k, v in setf.items():
        out.setdefault(k, v)
    return out


def encode_fields(fields: dict[str, bytes]) -> bytes:
    """A record (a msgpack map) made of its fields' bytes as they are, in the given order: no
    value is decoded and re-encoded, so no site can change a byte of it."""
    return _map_header(len(fields)) + b"".join(
        codec.packb(k) + v for k, v in fields.items())


_FIRST_BYTE = operator.itemgetter(0)


def may_hold_patch(raws) -> bool:
    """Whether any of these op values could be a patch (runs in C: a bulk insert asks it of
    every value and takes the op-by-op path only when one could).  The set of first bytes,
    small ints, costs a third of joining them for a regular expression."""
    return not _EXT_LEADS.isdisjoint(set(map(_FIRST_BYTE, filter(None, raws))))
