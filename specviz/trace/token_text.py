"""The trace's piece table: the text of every token ID it uses, so no reader needs the tokenizer.

A trace stores token IDs. Whoever produces it still holds the tokenizer (`engine.run.run`, so the
CLI's `record`, the app's live runs and `tools/make_traces.py`; a watched script) and stores the
text of each ID in `header.token_text` (`{"<id>": "<text>"}`: JSON object keys are strings).
Views, `check` and the pandas view read it back with `token_texts`, and fall back to `#id`.
"""

from __future__ import annotations

from collections.abc import Callable

from specviz.trace.schema import RowRecord, Trace

LEGACY_KEY = "token_text"  # where an earlier draft of version 2 kept it: header.options["token_text"]
MAX_TOKEN_CHARS = 200  # a token is a few characters; a longer entry is cut, never drawn whole


def trace_token_ids(trace: Trace, step_ids: set[int] | None = None) -> set[int]:
    """Every token ID a reader might show: prompts, outputs, references, drafts, targets, bonus.

    `step_ids`: the steps' IDs gathered as they were recorded (`step_token_ids`), for a trace
    whose steps went to disk as they finished; then `trace.steps` is not read."""
    ids: set[int] = set()
    for seq in trace.sequences:
        ids.update(seq.prompt_ids)
        ids.update(seq.output_ids)
        ids.update(seq.reference_ids or ())
    if step_ids is not None:
        return ids | step_ids
    for step in trace.steps:
        ids.update(step_token_ids(step.rows))
    return ids


def step_token_ids(rows: list[RowRecord]) -> set[int]:
    ids: set[int] = set()
    for row in rows:
        ids.update(row.draft_tokens)
        ids.update(row.target_tokens)
        ids.add(row.pending_token)
        if row.bonus is not None:
            ids.add(row.bonus)
    return ids


def token_text_map(trace: Trace, decode_one: Callable[[int], str], step_ids: set[int] | None = None) -> dict[str, str]:
    """`{str(id): text}` for every token of the trace."""
    return {str(token): decode_one(token) for token in sorted(trace_token_ids(trace, step_ids))}


def attach_token_text(trace: Trace, tokenizer: object, step_ids: set[int] | None = None) -> Trace:
    """Store the text of the trace's tokens in its header, decoded one token at a time."""

    def decode_one(token: int) -> str:
        try:
            return tokenizer.decode([token], skip_special_tokens=False)  # type: ignore[attr-defined]
        except (ValueError, TypeError, IndexError, OverflowError):  # an ID outside the vocabulary
            return f"#{token}"

    trace.header.token_text = token_text_map(trace, decode_one, step_ids)
    trace.header.options.pop(LEGACY_KEY, None)  # one place only
    return trace


def token_texts(trace: Trace) -> dict[int, str]:
    """The stored token text by ID, tolerant of a hand-written or foreign table."""
    raw = trace.header.token_text or trace.header.options.get(LEGACY_KEY)
    if not isinstance(raw, dict):
        return {}
    out: dict[int, str] = {}
    for key, value in raw.items():
        if isinstance(value, str):
            try:
                out[int(key)] = value[:MAX_TOKEN_CHARS]
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


def join_tokens(texts: dict[int, str], tokens: list[int]) -> str:
    """Several tokens as one string; an unknown one as `⟨id⟩`."""
    return "".join(texts.get(t, f"⟨{t}⟩") for t in tokens)
