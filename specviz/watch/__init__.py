"""`specviz.watch`: trace any engine built on Hugging Face models (docs/watch.md).

One idea per file: `hooks` captures what each forward call was fed, `steps` turns calls and
declared emissions into the trace's step records, `reference` decodes the oracle on any
transformers 4.45+, `session` is the Watch object, `streamer` adapts HF `generate`.

This package is also the function: `specviz.watch(target, draft, ...)` calls
`session.watch`. Python binds the name `specviz.watch` to this package as soon as any of its
submodules is imported, so the package itself is made callable rather than shadowed by the
function. Nothing here imports torch until a name is used: `import specviz` (for `check` on a
trace file, say) stays light.
"""

from __future__ import annotations

import sys
import types
from typing import Any

__all__ = ["Watch", "WatchError", "watch"]

_LAZY = {"Watch": "specviz.watch.session", "watch": "specviz.watch.session", "WatchError": "specviz.watch.hooks"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'specviz.watch' has no attribute {name!r}")


class _CallablePackage(types.ModuleType):
    """`specviz.watch(...)`: the package forwards calls to `specviz.watch.session.watch`."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from specviz.watch.session import watch

        return watch(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
