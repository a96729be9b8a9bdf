"""JSON parsing that lets other threads run: the app parses a 32 MiB upload while others browse.

`json.loads` holds the GIL for the whole document: 46 MiB of steps take ~2.5 s on a busy 2-core
machine, during which every other visitor of the app waits. A trace is one object whose big
members are arrays of small items (steps, sequences), so this parses the top-level object and
those arrays item by item with `JSONDecoder.raw_decode`. Between items the interpreter can switch
threads; the result, and every error (message, line, column), is what `json.loads` gives.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

_SPACE = re.compile(r"[ \t\n\r]*")


def _skip(text: str, pos: int) -> int:
    return _SPACE.match(text, pos).end()  # type: ignore[union-attr] - the pattern always matches


def _expect(text: str, pos: int, char: str, message: str) -> int:
    if not text.startswith(char, pos):
        raise json.JSONDecodeError(message, text, pos)
    return pos + 1


def _array(decoder: json.JSONDecoder, text: str, pos: int) -> tuple[list[Any], int]:
    """The array starting at `pos` (a `[`), item by item; returns it and the position after it."""
    items: list[Any] = []
    pos = _skip(text, pos + 1)
    if text.startswith("]", pos):
        return items, pos + 1
    while True:
        item, pos = decoder.raw_decode(text, pos)
        items.append(item)
        pos = _skip(text, pos)
        if text.startswith("]", pos):
            return items, pos + 1
        pos = _skip(text, _expect(text, pos, ",", "Expecting ',' delimiter"))


def loads_yielding(text: str, parse_constant: Callable[[str], Any] | None = None) -> Any:
    """`json.loads(text, parse_constant=...)`, parsing a top-level object's arrays item by item."""
    decoder = json.JSONDecoder(parse_constant=parse_constant)
    pos = _skip(text, 0)
    if not text.startswith("{", pos):
        return decoder.decode(text)
    result: dict[str, Any] = {}
    pos = _skip(text, pos + 1)
    if text.startswith("}", pos):
        pos += 1
    else:
        while True:
            if not text.startswith('"', pos):
                raise json.JSONDecodeError("Expecting property name enclosed in double quotes", text, pos)
            key, pos = decoder.raw_decode(text, pos)
            pos = _skip(text, _expect(text, _skip(text, pos), ":", "Expecting ':' delimiter"))
            if text.startswith("[", pos):
                result[key], pos = _array(decoder, text, pos)
            else:
                result[key], pos = decoder.raw_decode(text, pos)
            pos = _skip(text, pos)
            if text.startswith("}", pos):
                pos += 1
                break
            pos = _skip(text, _expect(text, pos, ",", "Expecting ',' delimiter"))
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
