"""A pandas view of a trace: one row per (step, batch row), for your own analysis.

Public API (documented in the README):

    from specviz.trace import load_trace, steps_frame
    frame = steps_frame(load_trace("runs/eq.json.gz"))
    frame.groupby("seq_id").accepted.mean()

Columns are the per-row fields of `docs/trace-format.md`, the step fields they belong to
(`cache_len`, `query_len`, timings), and three derived ones: `num_emitted`, `first_position` (the
position fed to the pending token) and `expected_first_position` (its logical index,
`committed_before - 1`). The column list is part of the API: columns are added, never renamed.
"""

from __future__ import annotations

import pandas as pd

from specviz.trace.schema import Trace

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
]


def steps_frame(trace: Trace) -> pd.DataFrame:
    """One row per (step, batch row), columns `COLUMNS`, in trace order."""
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
                )
            )
    return pd.DataFrame.from_records(records, columns=COLUMNS)
