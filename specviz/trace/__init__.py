"""The trace: schema, recorder, save/load and a pandas view. The bottom layer: imports no other.

`load_trace`, `save_trace` and `steps_frame` are re-exported lazily, so importing the schema (as
the engine and `specviz.watch` do) does not pull in pandas.
"""

from __future__ import annotations

from typing import Any

__all__ = ["load_trace", "save_trace", "steps_frame"]


def __getattr__(name: str) -> Any:
    if name == "steps_frame":
        from specviz.trace.frame import steps_frame

        return steps_frame
    if name in ("load_trace", "save_trace"):
        from specviz.trace import io

        return getattr(io, name)
    raise AttributeError(f"module 'specviz.trace' has no attribute {name!r}")
