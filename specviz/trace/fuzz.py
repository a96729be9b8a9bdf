"""Mutations of valid traces for fuzzing the loader and the checker (tests and tools/fuzz_traces.py).

Contract under test: for ANY input, `parse_trace_bytes` / `trace_from_dict` either return a
Trace or raise `TraceError`, and `check_trace` on a returned Trace never raises.
"""

from __future__ import annotations

import copy
import json
import random
from typing import Any

WEIRD_VALUES: list[Any] = [
    None,
    True,
    False,
    0,
    -1,
    1,
    2**31,
    -(2**63),
    10**12,
    0.5,
    -0.0,
    float("nan"),
    float("inf"),
    "",
    "x",
    "\udcff",
    [],
    [0],
    [[0, 1]],
    [[1, -3]],
    {},
    {"a": 1},
    [None],
    ["s"],
]


def _weird(rng: random.Random) -> Any:
    """A copy: inserting the shared list/dict itself would let later mutations alias it."""
    return copy.deepcopy(rng.choice(WEIRD_VALUES))


def _paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(node, dict):
        for key, value in node.items():
            out.extend(_paths(value, (*prefix, key)))
    elif isinstance(node, list):
        for i, value in enumerate(node[:6]):  # the first few items are enough to reach every field
            out.extend(_paths(value, (*prefix, i)))
    return out


def _parent(root: Any, path: tuple) -> tuple[Any, Any]:
    node = root
    for key in path[:-1]:
        node = node[key]
    return node, path[-1]


def mutate_dict(data: dict[str, Any], rng: random.Random, rounds: int = 1) -> dict[str, Any]:
    """Apply `rounds` structural mutations to a deep copy of a trace dict."""
    data = copy.deepcopy(data)
    for _ in range(rounds):
        paths = [p for p in _paths(data) if p]
        path = rng.choice(paths)
        parent, key = _parent(data, path)
        action = rng.randrange(6)
        if action == 0:
            parent[key] = _weird(rng)
        elif action == 1 and isinstance(parent, dict):
            del parent[key]
        elif action == 2 and isinstance(parent, dict):
            parent[f"extra_{rng.randrange(99)}"] = _weird(rng)
        elif action == 3 and isinstance(parent[key], list) and parent[key]:
            parent[key] = parent[key][: rng.randrange(len(parent[key]))]
        elif action == 4 and isinstance(parent[key], int) and not isinstance(parent[key], bool):
            parent[key] = parent[key] + rng.choice([-(10**9), -2, -1, 1, 2, 10**9])
        elif action == 5 and isinstance(parent[key], list) and parent[key]:
            parent[key] = parent[key] + [copy.deepcopy(rng.choice(parent[key]))]
        else:
            parent[key] = _weird(rng)
    return data


def mutate_bytes(raw: bytes, rng: random.Random) -> bytes:
    action = rng.randrange(4)
    if action == 0:
        return raw[: rng.randrange(len(raw) + 1)]
    buf = bytearray(raw)
    if action == 1:
        for _ in range(rng.randrange(1, 8)):
            buf[rng.randrange(len(buf))] = rng.randrange(256)
        return bytes(buf)
    if action == 2:
        cut = rng.randrange(len(buf))
        return bytes(buf[:cut] + buf[cut + rng.randrange(1, 40) :])
    text = raw.decode("utf-8", "replace")
    for token in ("0", "1", "true", "null", "[]"):
        if token in text and rng.random() < 0.5:
            text = text.replace(token, rng.choice(['"0"', "-1", "1e999", "{}", "99999999999999"]), 1)
    return text.encode()


def to_json_text(data: dict[str, Any]) -> str:
    return json.dumps(data, allow_nan=True)
