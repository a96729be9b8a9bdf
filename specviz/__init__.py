"""specviz: correctness forensics for batch speculative decoding."""

__version__ = "0.2.0"

# After `__version__` (the watch session reads it). Binding the function here, after the
# subpackage import, keeps `specviz.watch(...)` callable; import submodules with
# `from specviz.watch.hooks import ...`.
from specviz.watch import watch  # noqa: E402

__all__ = ["__version__", "watch"]
