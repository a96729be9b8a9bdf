"""Token text for display, carried inside the trace so views never need the tokenizer.

A trace stores token IDs. Showing text for the reference (which has no `*_text` field) or for a
single draft token needs the tokenizer, which the app may not have (an uploaded trace, a model too
big for the machine). So whoever still holds the tokenizer (tools/make_traces.py, the app's live
runs) stores the text of every token the trace mentions in `header.options["token_text"]`
(`options` is the format's free-form slot). Views fall back to `#id` for unknown tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from specviz.trace.schema import Trace

TOKEN_TEXT_KEY = "token_text"


def trace_token_ids(trace: Trace) -> set[int]:
    """Every token ID a view might show: prompts, outputs, references, drafts, targets, bonus."""
    ids: set[int] = set()
    for seq in trace.sequences:
        ids.update(seq.prompt_ids)
        ids.update(seq.output_ids)
        ids.update(seq.reference_ids or ())
    for step in trace.steps:
        for row in step.rows:
            ids.update(row.draft_tokens)
            ids.update(row.target_tokens)
            ids.add(row.pending_token)
            if row.bonus is not None:
                ids.add(row.bonus)
    return ids


def token_text_map(trace: Trace, decode_one: Callable[[int], str]) -> dict[str, str]:
    """`{str(id): text}` for every token of the trace; JSON object keys must be strings."""
    return {str(token): decode_one(token) for token in sorted(trace_token_ids(trace))}


def attach_token_text(trace: Trace, tokenizer: object) -> None:
    """Store the text of the trace's tokens in its header, decoded one token at a time."""

    def decode_one(token: int) -> str:
        return tokenizer.decode([token], skip_special_tokens=False)  # type: ignore[attr-defined]

    trace.header.options[TOKEN_TEXT_KEY] = token_text_map(trace, decode_one)


def token_texts(trace: Trace) -> dict[int, str]:
    """The stored token text, tolerant of a hand-written or foreign `token_text` entry."""
    raw = trace.header.options.get(TOKEN_TEXT_KEY)
    if not isinstance(raw, dict):
        return {}
    out: dict[int, str] = {}
    for key, value in raw.items():
        if isinstance(value, str):
            try:
                out[int(key)] = value
            except ValueError:
                continue
    return out


def token_label(texts: dict[int, str], token: int | None) -> str:
    """Readable text of one token: whitespace made visible, unknown tokens as `#id`."""
    if token is None:
        return ""
    text = texts.get(token)
    if text is None:
        return f"#{token}"
    return text.replace("\n", "↵").replace("\t", "⇥") or "∅"


def join_tokens(texts: dict[int, str], tokens: Iterable[int]) -> str:
    return "".join(texts.get(t, f"⟨{t}⟩") for t in tokens)
