"""Pausing Python's cyclic garbage collector around work that builds much and frees no cycle.

Two callers: the watch's `close` (thousands of short-lived lists while the steps are built) and
the app's opening of a big local trace (the footer's sequences and each sequence's history, all
kept). Every collection their allocations trigger walks what is alive, costs milliseconds (and a
full one hundreds, with torch, transformers or the app loaded), and promotes it towards the next
full collection, which whatever runs later pays for. Neither holds a cycle to free.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    """No automatic collection inside; afterwards the collector runs again, unless the caller had
    already disabled it (that pause is left as it was)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
