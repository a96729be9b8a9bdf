"""Token text for display: the views' door to the trace's piece table.

The table lives in the trace (`header.token_text`, written where the trace is produced: see
`specviz.trace.token_text`), so views never need the tokenizer. This module re-exports the
readers the views use and `attach_token_text` for callers that still hold a tokenizer.
"""

from __future__ import annotations

from specviz.trace.token_text import (
    LEGACY_KEY,
    attach_token_text,
    join_tokens,
    token_label,
    token_text_map,
    token_texts,
    trace_token_ids,
)

TOKEN_TEXT_KEY = LEGACY_KEY  # the old `header.options` key, still read

__all__ = [
    "TOKEN_TEXT_KEY",
    "attach_token_text",
    "join_tokens",
    "token_label",
    "token_text_map",
    "token_texts",
    "trace_token_ids",
]
