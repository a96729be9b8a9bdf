"""JSON parsing that lets other threads run: the app parses a 32 MiB upload while others browse.

`json.loads` holds the GIL for the whole document: 46 MiB of steps take ~2.5 s on a busy 2-core
machine, during which every other visitor of the app waits. A trace is one object whose big
members are arrays of small items (steps, sequences) and the header's piece table (one small entry
per token), so this parses those members by item with `JSONDecoder.raw_decode`. Between items the interpreter can switch
threads; the result, and every error (message, line, column), is what `json.loads` gives.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

_SPACE = re.compile(r"[ \t\n\r]*")


class TooMany(ValueError):
    """A container parsed item by item holds more items than the caller allows: refused as soon as
    it passes the count, before the rest is built (a 2.15M-entry piece table built its whole dict,
    ~400 MB at its peak, before the budget refused it)."""

    def __init__(self, path: str, limit: int) -> None:
        super().__init__(f"{path}: more than {limit:,} items, over the budget")


def _skip(text: str, pos: int) -> int:
    return _SPACE.match(text, pos).end()  # type: ignore[union-attr] - the pattern always matches


def _expect(text: str, pos: int, char: str, message: str) -> int:
    if not text.startswith(char, pos):
        raise json.JSONDecodeError(message, text, pos)
    return pos + 1


# Objects are parsed member by member down to this depth: the trace, its header, the header's piece
# table (2M entries decoded in one C call held the GIL for 6.8 s on 2 busy cores). Arrays in them
# (steps, sequences) go item by item, and each item (a step, a sequence) is decoded whole.
YIELD_DEPTH = 3
# A member whose key and value are plain strings (no escape, no control character: what a piece
# table is made of), with the comma and the next key's quote after it, in one match; any other
# member (and the last) goes the general way, with json's own errors.
_PLAIN_MEMBER = re.compile(r'"([^"\\\x00-\x1f]*)"[ \t\n\r]*:[ \t\n\r]*"([^"\\\x00-\x1f]*)"[ \t\n\r]*,[ \t\n\r]*(?=")')


class _Parse:
    """One document's parse: its decoder and the most items a container parsed by item may hold."""

    def __init__(self, decoder: json.JSONDecoder, text: str, max_items: int | None) -> None:
        self.decoder, self.text = decoder, text
        self.max_items = max_items if max_items is not None else 1 << 62

    def count(self, items: int, path: str) -> None:
        if items > self.max_items:
            raise TooMany(path or "top level", self.max_items)


def _value(parse: _Parse, pos: int, depth: int, path: str) -> tuple[Any, int]:
    """The value starting at `pos`: containers member by member while `depth` lasts, else whole."""
    text = parse.text
    if depth > 0 and text.startswith("[", pos):
        return _array(parse, pos, path)
    if depth > 0 and text.startswith("{", pos):
        return _object(parse, pos, depth, path)
    return parse.decoder.raw_decode(text, pos)


def _array(parse: _Parse, pos: int, path: str) -> tuple[list[Any], int]:
    """The array starting at `pos` (a `[`), item by item; returns it and the position after it."""
    decoder, text = parse.decoder, parse.text
    items: list[Any] = []
    pos = _skip(text, pos + 1)
    if text.startswith("]", pos):
        return items, pos + 1
    while True:
        item, pos = decoder.raw_decode(text, pos)
        items.append(item)
        parse.count(len(items), path)
        pos = _skip(text, pos)
        if text.startswith("]", pos):
            return items, pos + 1
        pos = _skip(text, _expect(text, pos, ",", "Expecting ',' delimiter"))


def _object(parse: _Parse, pos: int, depth: int, path: str) -> tuple[dict[str, Any], int]:
    """The object starting at `pos` (a `{`), member by member; returns it and the position after it."""
    decoder, text = parse.decoder, parse.text
    result: dict[str, Any] = {}
    pos = _skip(text, pos + 1)
    if text.startswith("}", pos):
        return result, pos + 1
    match = _PLAIN_MEMBER.match
    limit = parse.max_items
    while True:
        plain = match(text, pos)
        while plain:
            key, value = plain.groups()
            result[key] = value
            if len(result) > limit:
                parse.count(len(result), path)
            pos = plain.end()
            plain = match(text, pos)
        if not text.startswith('"', pos):
            raise json.JSONDecodeError("Expecting property name enclosed in double quotes", text, pos)
        key, pos = decoder.raw_decode(text, pos)
        pos = _skip(text, _expect(text, _skip(text, pos), ":", "Expecting ':' delimiter"))
        result[key], pos = _value(parse, pos, depth - 1, f"{path}.{key}" if path else str(key))
        parse.count(len(result), path)
        pos = _skip(text, pos)
        if text.startswith("}", pos):
            return result, pos + 1
        pos = _skip(text, _expect(text, pos, ",", "Expecting ',' delimiter"))


def loads_yielding(text: str, parse_constant: Callable[[str], Any] | None = None, max_items: int | None = None) -> Any:
    """`json.loads(text, parse_constant=...)`, parsing a top-level object's members item by item.

    `max_items`: a container parsed by item (the trace, its header, the piece table, the steps and
    sequences) with more items raises `TooMany` as soon as it has them."""
    decoder = json.JSONDecoder(parse_constant=parse_constant)
    pos = _skip(text, 0)
    if not text.startswith("{", pos):
        return decoder.decode(text)
    result, pos = _object(_Parse(decoder, text, max_items), pos, YIELD_DEPTH, "")
    pos = _skip(text, pos)
    if pos != len(text):
        raise json.JSONDecodeError("Extra data", text, pos)
    return result


def top_level_kind(text: str) -> str:
    """What the document is, from its first character: "object", "array", "str", "number", ..."""
    first = text[_skip(text, 0) : _skip(text, 0) + 1]
    return {"{": "object", "[": "array", '"': "str", "t": "bool", "f": "bool", "n": "null"}.get(
        first, "number" if first in "-0123456789" and first else "something else"
    )
