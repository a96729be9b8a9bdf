"""What a loaded run keeps, in bytes: every object it holds counted once (the memory ceiling's
measure, `specviz.app.memory.RunMemory`). Moved out of memory.py, unchanged.
"""

from __future__ import annotations

import gc
import itertools
import operator
import sys
import types
from typing import Any


def estimate_run_bytes(loaded: Any) -> int:
    """What a loaded run (or an opened probe report) keeps: every object it holds, in bytes
    (`kept_bytes`). A lazy run's steps stay on disk: its overview's steps are counted instead."""
    if bool(getattr(loaded, "lazy", False)):
        overview = getattr(loaded, "overview", None)
        steps = overview()[0].steps if overview is not None else []
        parts = [loaded.trace.header, loaded.trace.sequences, steps, loaded.report, loaded.texts, loaded.figures]
        return RUN_OVERHEAD_BYTES + int(ALLOCATOR_SLACK * kept_bytes(parts)) + loaded.history.nbytes
    return RUN_OVERHEAD_BYTES + int(ALLOCATOR_SLACK * kept_bytes(loaded))


RUN_OVERHEAD_BYTES = 64 * 1024  # a session's state and its run's entry here
# Python's allocator keeps a freed block's arena while a kept object shares it: the parse's own
# dicts, freed, leave holes among a run's objects. Per run kept, RSS grew 0.95-1.2x the objects'
# bytes (a hostile trace 78.3 MB for 74.2, the heaviest public trace 23.6 for 23.3, a 9,000-prompt
# probe report 12.6 for 10.4; tests/app/test_kept_memory.py checks it within 20%).
ALLOCATOR_SLACK = 1.1


# The objects Python shares rather than allocates per use: counting them would count nothing kept.
_CACHED = {value: sys.getsizeof(value) for value in range(-5, 257)}
_CACHED.update({None: sys.getsizeof(None), True: sys.getsizeof(True), False: sys.getsizeof(False)})
_SCALARS = frozenset({int, float, bool, type(None), complex})
_LEAVES = _SCALARS | {str, bytes}
_NOT_KEPT = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType, types.CodeType)


def kept_bytes(root: Any) -> int:
    """The bytes every object reachable from `root` takes (`sys.getsizeof`, each object once), as
    allocated: strings by their stored width (an emoji is 4 bytes, as in UTF-8), lists and dicts with
    their tables, mask runs and token lists item by item, arrays with their data. Shared objects
    (classes, modules, functions, small ints, None) are not what a run keeps and are skipped.

    Containers of scalars, and of tuples or lists of scalars (token lists, mask runs, the grid's
    history), are summed with C-level maps: a run at the public budget is counted in ~0.1 s."""
    seen: set[int] = set()
    stack: list[Any] = [root]
    total = 0
    while stack:
        obj = stack.pop()
        kind = type(obj)
        if kind in _LEAVES:
            total += _leaf(obj, seen)
            continue
        key = id(obj)
        if key in seen:
            continue
        seen.add(key)
        if kind is list or kind is tuple or kind is set or kind is frozenset:
            total += sys.getsizeof(obj) + _items(obj, stack, seen)
        elif kind is dict:
            total += sys.getsizeof(obj) + _keys(obj, stack, seen) + _items(obj.values(), stack, seen)
        elif isinstance(obj, _NOT_KEPT):
            continue
        elif _is_array(obj):
            total += sys.getsizeof(obj)  # with its data when it owns it
            if getattr(obj, "base", None) is not None:
                stack.append(obj.base)
        else:  # an instance: its own size, then what it refers to (not its class: shared)
            refs = [ref for ref in gc.get_referents(obj) if not isinstance(ref, type)]
            # Attribute values stored in the object (no `__dict__` made: asking for it would make one).
            inline = 0 if any(type(ref) is dict for ref in refs) else 8 * len(refs) + 16
            total += sys.getsizeof(obj) + inline + _items(refs, stack, seen)
    return total


def _leaf(value: Any, seen: set[int]) -> int:
    """One scalar (its own object unless Python caches it) or string (counted once: may be shared)."""
    kind = type(value)
    if kind is float:
        return _FLOAT_BYTES
    if kind is str or kind is bytes:
        if id(value) in seen:
            return 0
        seen.add(id(value))
        return _allocated(sys.getsizeof(value))
    if kind is int and value in _CACHED or value is None or kind is bool:
        return 0
    return _allocated(sys.getsizeof(value))


_FLOAT_BYTES = sys.getsizeof(0.0)


def _allocated(size: int) -> int:
    """What the allocator hands out for `size` bytes: 8-byte blocks up to 512, then malloc's."""
    return (size + 7) & ~7 if size <= 512 else size + 16


def _leaves(items: list[Any] | tuple[Any, ...], kinds: set[type], seen: set[int]) -> int:
    """Scalars and strings, summed with C-level maps where they are only numbers."""
    if kinds == {float}:
        return _FLOAT_BYTES * len(items)
    if kinds <= {int, bool, type(None)}:  # token IDs, positions, mask runs: 28-byte ints take 32
        cached = sum(map(_CACHED.__contains__, items))
        own = sum(map(sys.getsizeof, items)) - sum(map(_CACHED.get, items, itertools.repeat(0)))
        return own + 4 * (len(items) - cached)
    return sum(_leaf(value, seen) for value in items)


_NESTING = 32  # containers summed at once this deep; deeper ones go on the walk's stack (no recursion limit)


def _items(container: Any, stack: list[Any], seen: set[int], depth: int = 0) -> int:
    """The items of a container: leaves summed at once (and small tuples or lists of numbers, as
    mask runs and the grid's history), anything else pushed for the walk."""
    items = container if type(container) in (list, tuple) else list(container)
    kinds = set(map(type, items))
    if kinds <= _LEAVES:
        return _leaves(items, kinds, seen)
    if kinds <= {tuple, list} and depth < _NESTING:  # token lists, mask runs, the history, steps' rows
        inner = list(itertools.chain.from_iterable(items))
        return sum(map(_allocated, map(sys.getsizeof, items))) + _items(inner, stack, seen, depth + 1)
    if len(kinds) == 1 and len(items) >= 8 and depth < _NESTING:
        fields = getattr(next(iter(kinds)), "__dataclass_fields__", None)
        if fields is not None:
            return _records(items, list(fields), stack, seen, depth + 1)
    total = 0
    for value in items:
        if type(value) in _LEAVES:
            total += _leaf(value, seen)
        else:
            stack.append(value)
    return total


def _records(items: Any, names: list[str], stack: list[Any], seen: set[int], depth: int) -> int:
    """Many instances of one dataclass (rows, steps, violations): each field taken as a column, so
    a column of numbers or of token lists is summed at once instead of walked object by object."""
    fresh = [item for item in items if id(item) not in seen]
    if not fresh:
        return 0
    seen.update(map(id, fresh))
    # The objects, and their attribute values: stored beside each object, or in a `__dict__` of its
    # own where Python made one (a class of many fields, or attributes set out of order: a probe
    # report's prompts took 790 bytes each there, half of what the report kept).
    total = sum(map(sys.getsizeof, fresh)) + sum(_attribute_bytes(item, names) for item in fresh)
    for name in names:
        column = list(map(operator.attrgetter(name), fresh))
        total += _items(column, stack, seen, depth)
    return total


def _attribute_bytes(item: Any, names: list[str]) -> int:
    """The attribute storage of one instance: its own `__dict__` when it has one (found among what it
    refers to, so none is made by looking), else the values stored inline beside the object."""
    wanted = set(names)
    for ref in gc.get_referents(item):
        if type(ref) is dict and wanted <= ref.keys():
            return sys.getsizeof(ref)
    return 8 * len(names) + 16


def _keys(mapping: dict[Any, Any], stack: list[Any], seen: set[int]) -> int:
    """A dict's keys: strings are often shared between dicts (JSON keys, attribute names): once each."""
    if not all(type(key) is str for key in mapping):
        return _items(mapping.keys(), stack, seen)  # e.g. the history's (sequence, index) tuples
    total = 0
    for key in mapping:
        if id(key) not in seen:
            seen.add(id(key))
            total += _allocated(sys.getsizeof(key))
    return total


def _is_array(obj: Any) -> bool:
    return type(obj).__module__ == "numpy" and hasattr(obj, "nbytes") and hasattr(obj, "base")
