"""Pure reading of SQL text: where its quotes and comments are, where its top-level commas
are, how many concatenations and expression terms it holds, when two names are one.  No I/O;
no parsing beyond that."""

from __future__ import annotations

import re
import string
from typing import Iterator

_ASCII_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)


def fold(name: str) -> str:
    """``name`` as SQLite compares names of tables and columns: ASCII letters without case,
    every other character as it is ('Items' is 'items', 'STRASSE' is not 'straße', 'Ä' is
    not 'ä', where Python's lower() and casefold() make them one)."""
    return name.translate(_ASCII_LOWER)


def _outside_quotes(text: str) -> Iterator[tuple[int, str]]:
    """(position, character) of each character of SQL ``text`` outside its string literals,
    quoted names and comments."""
    closing = {"'": "'", '"': '"', "`": "`", "[": "]", "/*": "*/", "--": "\n"}
    quote = None
    i = 0
    while i < len(text):
        if quote:
            if text.startswith(quote, i):
                i += len(quote)
                quote = None
                continue
        elif text[i:i + 2] in closing:
            quote = closing[text[i:i + 2]]
            i += 2
            continue
        elif text[i] in closing:
            quote = closing[text[i]]
        else:
            yield i, text[i]
        i += 1


def split_top_level(text: str) -> list[str]:
    """``text`` cut at its commas outside parentheses, quotes and comments (several column
    definitions SQLite spliced in one after another, ``a INT CHECK (a IN (1, 2)), b TEXT``)."""
    parts, depth, start = [], 0, 0
    for i, ch in _outside_quotes(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    parts.append(text[start:].strip())
    return parts


def concatenations(text: str) -> int:
    """How many ``||`` SQL ``text`` holds outside its quotes and comments: each may copy a
    value once more into a row a peer's definition computes (a DEFAULT, a generated column,
    a CHECK)."""
    n, last = 0, -2
    for i, ch in _outside_quotes(text):
        if ch == "|" and last == i - 1:
            n += 1
            last = -2       # '|||' is one and a stray bar
        elif ch == "|":
            last = i
    return n


_TERM_WORD = re.compile(r"(?i)(?<![\w$])(?:or|and|when)(?![\w$])")
_IN_LIST = re.compile(r"(?i)(?<![\w$])in\s*\(")


def expression_terms(text: str) -> int:
    """How many terms SQL ``text`` gives the expressions SQLite evaluates at each write, beyond
    a few: the values of its IN lists (SQLite builds each list anew for every row a CHECK
    tests, the whole list) and its OR, AND and WHEN (each branch tested in turn), outside its
    quotes and comments."""
    bare = [" "] * len(text)
    for i, ch in _outside_quotes(text):
        bare[i] = ch
    plain = "".join(bare)
    n = len(_TERM_WORD.findall(plain))
    for m in _IN_LIST.finditer(plain):
        depth, items = 1, 1
        for ch in plain[m.end():]:
            if ch == "(":
                depth += 1
            elif ch == ")":
                depth -= 1
                if not depth:
                    break
            elif ch == "," and depth == 1:
                items += 1
        n += items
    return n
