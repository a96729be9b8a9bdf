"""User-facing errors: each carries a one-line message and is shown without a traceback."""

from __future__ import annotations


class SpecvizError(Exception):
    """A problem with the user's input or environment, explained in one line."""


class ModelLoadError(SpecvizError):
    """A model or tokenizer could not be loaded, or a target/draft pair does not fit together."""


class PromptError(SpecvizError):
    """A prompts file is missing, malformed, or empty."""
