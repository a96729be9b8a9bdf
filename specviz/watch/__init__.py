"""The subpackage behind `specviz.watch` (docs/watch.md); `specviz.watch` itself is the function in
`specviz/__init__.py`. Its names import lazily: `import specviz` imports no torch."""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["CallSink", "Watch", "WatchError", "watch"]
_LAZY = {"Watch": "session", "watch": "session", "WatchError": "hooks", "CallSink": "hooks"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"specviz.watch.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'specviz.watch' has no attribute {name!r}")
