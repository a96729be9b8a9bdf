"""specviz: correctness forensics for batch speculative decoding."""

__version__ = "0.1.0"
