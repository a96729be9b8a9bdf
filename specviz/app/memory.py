"""The app's memory: a ceiling over the loaded runs of every session (public mode), least recently
used runs of idle sessions unloaded first, and freed heap handed back to the system.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import gc
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from specviz.app.kept_bytes import ALLOCATOR_SLACK, estimate_run_bytes, kept_bytes

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
