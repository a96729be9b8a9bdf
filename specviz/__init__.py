"""specviz: correctness forensics for batch speculative decoding."""

__version__ = "0.2.0"

# First, before the imports below pull in torch: Ctrl-C while `specviz` starts exits quietly.
from specviz.startup import quiet_interrupt_while_starting  # noqa: E402

quiet_interrupt_while_starting()

# `specviz.watch` is the subpackage, callable as the function (see specviz/watch/__init__.py);
# neither imports torch until used, so `import specviz` stays light.
from specviz import watch  # noqa: E402

__all__ = ["__version__", "watch"]
