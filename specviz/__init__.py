"""specviz: correctness forensics for batch speculative decoding."""

__version__ = "0.2.0"
