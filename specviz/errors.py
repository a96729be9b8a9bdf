"""User-facing errors: each carries a one-line message and is shown without a traceback."""

from __future__ import annotations


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type's name if it has none): what a one-line
    error quotes of a library's multi-line message."""
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


class SpecvizError(Exception):
    """A problem with the user's input or environment, explained in one line."""


class ModelLoadError(SpecvizError):
    """A model or tokenizer could not be loaded, or a target/draft pair does not fit together."""


class PromptError(SpecvizError):
    """A prompts file is missing, malformed, or empty."""
