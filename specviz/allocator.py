"""Keep freed memory in the process for reuse (glibc), for the short-lived `record` and `bench`.

A decode on CPU allocates and frees tensors of tens of MB every step: the KV move of EQSPEC and
EXSPEC, and transformers' `DynamicLayer.update`, which concatenates the whole cache on every
forward. glibc serves blocks that large with fresh `mmap`s and unmaps them on free, so every
reuse page-faults the memory in again: about 10,000 minor faults and 10-15 ms per 40 MB move on
the 2-core machine this was measured on (benchmarks/README.md). Raising the mmap and trim
thresholds keeps freed blocks in the heap, where the next step's allocation reuses them.

The cost is that the process keeps its peak memory until it exits, which suits a CLI run. The app
does not call this: a public server hands memory back after each session
(`specviz/app/memory.py` `release_memory`). Other allocators (musl, jemalloc) have no `mallopt`; nothing happens.
Set `SPECVIZ_KEEP_FREED_MEMORY=0` to leave the allocator alone (to measure the difference).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter numbers (malloc.h)
M_MMAP_THRESHOLD = -3
THRESHOLD = 1 << 30  # 1 GiB: blocks below it come from the heap and stay there when freed


def keep_freed_memory() -> bool:
    """Ask glibc to keep freed blocks for reuse; True when it took the settings."""
    if os.environ.get("SPECVIZ_KEEP_FREED_MEMORY", "1") == "0":
        return False
    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    # Older glibc caps the mmap threshold at 32 MiB (64-bit): then take the cap.
    took = bool(mallopt(M_MMAP_THRESHOLD, THRESHOLD)) or bool(mallopt(M_MMAP_THRESHOLD, 32 << 20))
    return took and bool(mallopt(M_TRIM_THRESHOLD, THRESHOLD))
