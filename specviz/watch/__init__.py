"""The subpackage behind `specviz.watch`: trace any engine built on Hugging Face models (docs/watch.md).

`specviz.watch` itself is the function in `specviz/__init__.py` (it calls `session.watch`);
`from specviz.watch import Watch, WatchError, watch` reads this subpackage, whose names import
lazily: `import specviz` (for `check` on a trace file, say) imports no torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from specviz.watch.hooks import CallSink, WatchError
    from specviz.watch.session import Watch, watch

__all__ = ["CallSink", "Watch", "WatchError", "watch"]

_LAZY = {
    "Watch": "specviz.watch.session",
    "watch": "specviz.watch.session",
    "WatchError": "specviz.watch.hooks",
    "CallSink": "specviz.watch.hooks",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'specviz.watch' has no attribute {name!r}")
