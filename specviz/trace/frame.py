"""A pandas view of a trace: one row per (step, batch row), for your own analysis.

Public API (documented in the README):

    from specviz.trace import load_trace, steps_frame
    frame = steps_frame(load_trace("runs/eq.json.gz"))
    frame.groupby("seq_id").accepted.mean()

Columns are the per-row fields of `docs/trace-format.md`, the step fields they belong to
(`cache_len`, `query_len`, timings), and three derived ones: `num_emitted`, `first_position` (the
position fed to the pending token) and `expected_first_position` (its logical index,
`committed_before - 1`). The last four hold token text from the trace's piece table
(`header.token_text`): `pending_text`, and `draft_text`, `target_text`, `emitted_text` as lists
parallel to their ID lists; None where the trace has no text for an ID. The column list is part of
the API: columns are added, never renamed.
"""

from __future__ import annotations

import pandas as pd

from specviz.trace.schema import Trace
from specviz.trace.token_text import token_texts

COLUMNS = [
    "step",
    "batch_id",
    "row",
    "seq_id",
    "write_seq",
    "committed_before",
    "left_pad",
    "left_pad_after",
    "cache_len",
    "query_len",
    "grouped",
    "pending_token",
    "draft_tokens",
    "target_tokens",
    "accepted",
    "bonus",
    "emitted",
    "num_emitted",
    "position_ids",
    "first_position",
    "expected_first_position",
    "mask_rle",
    "kv_len",
    "kv_len_expected",
    "draft_kv_len",
    "draft_kv_len_expected",
    "finished",
    "finish_reason",
    "draft_ms",
    "verify_ms",
    "align_ms",
    "total_ms",
    "pending_text",
    "draft_text",
    "target_text",
    "emitted_text",
]


def steps_frame(trace: Trace) -> pd.DataFrame:
    """One row per (step, batch row), columns `COLUMNS`, in trace order."""
    texts = token_texts(trace)

    def text_of(tokens: list[int]) -> list[str | None]:
        return [texts.get(t) for t in tokens]

    records = []
    for step in trace.steps:
        for r in step.rows:
            records.append(
                (
                    step.step,
                    step.batch_id,
                    r.row,
                    r.seq_id,
                    r.write_seq,
                    r.committed_before,
                    r.left_pad,
                    r.left_pad_after,
                    step.cache_len,
                    step.query_len,
                    step.grouped,
                    r.pending_token,
                    r.draft_tokens,
                    r.target_tokens,
                    r.accepted,
                    r.bonus,
                    r.emitted,
                    len(r.emitted),
                    r.position_ids,
                    r.position_ids[0] if r.position_ids else None,
                    r.committed_before - 1,
                    r.mask_rle,
                    r.kv_len,
                    r.kv_len_expected,
                    r.draft_kv_len,
                    r.draft_kv_len_expected,
                    r.finished,
                    r.finish_reason,
                    step.draft_ms,
                    step.verify_ms,
                    step.align_ms,
                    step.total_ms,
                    texts.get(r.pending_token),
                    text_of(r.draft_tokens),
                    text_of(r.target_tokens),
                    text_of(r.emitted),
                )
            )
    return pd.DataFrame.from_records(records, columns=COLUMNS)
