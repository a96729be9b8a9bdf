"""The app's memory: a ceiling over the loaded runs of every session (public mode), least recently
used runs of idle sessions unloaded first, and freed heap handed back to the system.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import gc
import itertools
import operator
import os
import sys
import threading
import time
import types
from collections.abc import Callable
from typing import Any

_LIBC: Any = None


def release_memory(_value: Any = None) -> None:
    """Collect the young generations, then hand freed heap back to the system (glibc keeps it
    otherwise: RSS never falls). A loaded run holds no reference cycle, so refcounting frees it
    when its state lets go; a full collection would only walk every other session's runs with the
    GIL held (0.6-1.8 s on 2 busy cores: every visitor's answer waited).

    Usable as a `gr.State(delete_callback=...)`: it runs when a session's state expires.
    """
    global _LIBC
    gc.collect(1)
    if _LIBC is None:
        name = ctypes.util.find_library("c")
        _LIBC = ctypes.CDLL(name) if name else False
    trim: Callable[[int], int] | None = getattr(_LIBC, "malloc_trim", None) if _LIBC else None
    if trim is not None:
        trim(0)


# Python's default (700, 10, 10) walks everything alive (every session's loaded runs) each time the
# survivors grew by a quarter: an upload allocates millions of objects that live, so each set off
# full collections of 0.5-1.8 s with the GIL held (gc callbacks, 2 busy cores). Young collections
# stay small (5,000 new objects, then 50,000); a full one waits for 10,000 of those (500M objects).
GC_THRESHOLDS = (5_000, 10, 10_000)


def tune_gc_for_serving() -> None:
    """Move everything the server holds after start-up (Gradio, torch, the model pair) out of the
    collector's sight (`gc.freeze`), and collect far less often: the loaded runs are trees, freed
    by refcounting, so the cyclic collector's full walks were pure pauses for every visitor."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


UNLOADED_MESSAGE = "this run or report was unloaded to free memory; load it again"
PUBLIC_RUN_MEMORY_MB = 4096  # loaded runs of every session together, public mode


def run_memory_ceiling(public: bool, environ: dict[str, str] | None = None) -> int | None:
    """Bytes of loaded runs the app keeps (public mode: 4 GB, or SPECVIZ_RUN_MEMORY_MB); None: no ceiling."""
    environ = os.environ if environ is None else environ
    value = environ.get("SPECVIZ_RUN_MEMORY_MB")
    if value:
        return int(float(value) * 2**20)
    return PUBLIC_RUN_MEMORY_MB * 2**20 if public else None


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


class RunMemory:
    """Every loaded run of every session, with its estimated size; past the ceiling the least
    recently used runs of idle sessions are unloaded in place (their handlers then see an empty
    slot and a note, see `install_memory`). Runs shared by all sessions (bundled) are not counted."""

    def __init__(self, ceiling: int | None, estimate: Callable[[Any], int] = estimate_run_bytes) -> None:
        import weakref

        self.ceiling = ceiling
        self.estimate = estimate
        self._weakref = weakref
        self._runs: dict[int, dict[str, Any]] = {}  # id(run) -> {ref, session, size, used}
        self._sessions: dict[str, float] = {}  # session -> last request
        self._active: dict[str, int] = {}  # session -> handlers running now
        self._lock = threading.RLock()
        self.evicted = 0

    def total(self) -> int:
        with self._lock:
            return sum(entry["size"] for entry in self._runs.values())

    def begin(self, session: str | None) -> None:
        if session is None:
            return
        with self._lock:
            self._sessions[session] = time.monotonic()
            self._active[session] = self._active.get(session, 0) + 1

    def end(self, session: str | None) -> None:
        if session is None:
            return
        with self._lock:
            left = self._active.get(session, 1) - 1
            if left > 0:
                self._active[session] = left
            else:
                self._active.pop(session, None)
            self._sessions[session] = time.monotonic()

    def use(self, run: Any) -> None:
        with self._lock:
            entry = self._runs.get(id(run))
            if entry is not None:
                entry["used"] = time.monotonic()

    def grew(self, run: Any, session: str | None) -> None:
        """A handler drew whole-run figures of `run` (kept in `run.figures`) or wrote its report
        file (temp disk the session holds until the run goes): count them too."""
        self._count_file(run)
        figures = getattr(run, "figures", None)
        with self._lock:
            entry = self._runs.get(id(run))
            if entry is None or not figures or len(figures) == entry.get("figures", 0):
                return
            entry["figures"] = len(figures)
        size = int(ALLOCATOR_SLACK * kept_bytes(list(figures.values())))
        with self._lock:
            entry = self._runs.get(id(run))
            if entry is None:
                return
            entry["size"] += size - entry.get("figure_bytes", 0)
            entry["figure_bytes"] = size
        self.make_room(keep=session)

    def _count_file(self, run: Any) -> None:
        path = getattr(run, "report_file", None)
        with self._lock:
            entry = self._runs.get(id(run))
            if entry is None or not path or entry.get("file") == path:
                return
            entry["file"] = path
            size = os.path.getsize(path) if os.path.isfile(path) else 0
            entry["size"] += size - entry.get("file_bytes", 0)
            entry["file_bytes"] = size

    def track(self, run: Any, session: str | None) -> None:
        """A run landed in `session`'s state: count it, then make room by unloading others."""
        if self.ceiling is None or run is None or getattr(run, "shared", False) or getattr(run, "evicted", False):
            return
        key = id(run)
        with self._lock:
            if key in self._runs:
                self._runs[key]["used"] = time.monotonic()
                return
        size = self.estimate(run)

        def forget(_ref: Any, key: int = key) -> None:
            with self._lock:
                self._runs.pop(key, None)

        with self._lock:
            self._runs[key] = {
                "ref": self._weakref.ref(run, forget),
                "session": session or "",
                "size": size,
                "used": time.monotonic(),
                "figures": len(getattr(run, "figures", None) or ()),  # counted in `size` already
                "figure_bytes": 0,
            }
        self.make_room(keep=session)

    def make_room(self, keep: str | None = None) -> int:
        """Unload least recently used runs of idle sessions (never `keep`'s) until under the ceiling."""
        if self.ceiling is None:
            return 0
        victims = []
        with self._lock:
            total = sum(entry["size"] for entry in self._runs.values())
            if total <= self.ceiling:
                return 0
            idle = [
                (self._sessions.get(entry["session"], 0.0), entry["used"], key)
                for key, entry in self._runs.items()
                if entry["session"] != keep and not self._active.get(entry["session"])
            ]
            for _, _, key in sorted(idle):
                if total <= self.ceiling:
                    break
                entry = self._runs.pop(key)
                total -= entry["size"]
                run = entry["ref"]()
                if run is not None:
                    victims.append(run)
        for run in victims:
            unload_run(run)
        self.evicted += len(victims)
        if victims:
            release_memory()
        return len(victims)


def unload_run(run: Any) -> None:
    """Empty a loaded run (or probe report) in place: the session's state keeps a husk that says it
    was unloaded."""
    for name in ("trace", "report", "history"):
        if hasattr(run, name):
            object.__setattr__(run, name, None)
    for name, empty in (("texts", {}), ("figures", {}), ("prompts", ())):
        if hasattr(run, name):
            object.__setattr__(run, name, empty)
    report_file = getattr(run, "report_file", None)
    if report_file and not getattr(run, "shared", False):  # its temp file goes with it
        with contextlib.suppress(OSError):
            os.unlink(report_file)
        object.__setattr__(run, "report_file", None)
    object.__setattr__(run, "evicted", True)


def _request_session() -> str | None:
    try:
        from gradio.context import LocalContext

        request = LocalContext.request.get(None)
    except (ImportError, LookupError):
        return None
    return getattr(request, "session_hash", None)


def _kept_types(run_type: type | tuple[type, ...]) -> tuple[type, ...]:
    """What the ceiling counts: loaded runs and opened probe reports (each session's own)."""
    from specviz.probe.report import ProbeReport

    kinds = run_type if isinstance(run_type, tuple) else (run_type,)
    return (*kinds, ProbeReport)


def install_memory(demo: Any, memory: RunMemory, run_type: type | tuple[type, ...]) -> int:
    """Wrap every handler of `demo`: a run (or probe report) that was unloaded reaches it as an
    empty slot (with a warning toast, never an error badge), and every run or report it puts in a
    state is counted by `memory`, the figures it draws of a run too."""
    import functools
    import inspect

    run_type = _kept_types(run_type)

    wrapped = 0
    for block_fn in getattr(demo, "fns", {}).values():
        fn = getattr(block_fn, "fn", None)
        if fn is None or inspect.iscoroutinefunction(fn) or inspect.isgeneratorfunction(fn):
            continue

        def wrapper(*args: Any, __fn: Any = fn, **kwargs: Any) -> Any:
            session = _request_session()
            memory.begin(session)
            try:
                unloaded = False
                fixed = []
                for arg in args:
                    if isinstance(arg, run_type):
                        if getattr(arg, "evicted", False):
                            unloaded, arg = True, None
                        else:
                            memory.use(arg)
                    fixed.append(arg)
                if unloaded:
                    import gradio as gr

                    gr.Warning(UNLOADED_MESSAGE)
                result = __fn(*fixed, **kwargs)
                for arg in fixed:
                    if isinstance(arg, run_type):
                        memory.grew(arg, session)
                values = result.values() if isinstance(result, dict) else result
                for value in values if isinstance(values, (list, tuple, type({}.values()))) else [values]:
                    if isinstance(value, run_type):
                        memory.track(value, session)
                return result
            finally:
                memory.end(session)

        functools.update_wrapper(wrapper, fn)
        block_fn.fn = wrapper
        wrapped += 1
    return wrapped
