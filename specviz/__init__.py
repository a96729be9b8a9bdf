"""specviz: correctness forensics for batch speculative decoding."""

__version__ = "0.2.0"

# First, before the imports below pull in torch: Ctrl-C while `specviz` starts exits quietly.
from specviz.startup import quiet_interrupt_while_starting  # noqa: E402

quiet_interrupt_while_starting()

# After `__version__` (the watch session reads it). Binding the function here, after the
# subpackage import, keeps `specviz.watch(...)` callable; import submodules with
# `from specviz.watch.hooks import ...`.
from specviz.watch import watch  # noqa: E402

__all__ = ["__version__", "watch"]
