"""A pandas view of a trace: one row per (step, batch row), for your own analysis.

Public API (documented in the README):

    from specviz.trace import load_trace, steps_frame
    frame = steps_frame(load_trace("runs/eq.json.gz"))
    frame.groupby("seq_id").accepted.mean()

Columns are every per-row field of `docs/trace-format.md` (schema version 2's optional state
fields included, None / False where a row did not record them) and the step fields they belong to
(`cache_len`, `query_len`, timings), so every field `check` reads is a column; and three derived
ones: `num_emitted`, `first_position` (the position fed to the pending token) and
`expected_first_position` (its logical index, `committed_before - 1`). The last four hold token
text from the trace's piece table (`header.token_text`): `pending_text`, and `draft_text`,
`target_text`, `emitted_text` as lists parallel to their ID lists; None where the trace has no
text for an ID. The column list is part of the API: columns are added, never renamed (a numeric
column with missing values shows them as NaN, as pandas does).
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from specviz.trace.schema import RowRecord, StepRecord, Trace
from specviz.trace.token_text import token_texts

# Derived columns (not trace fields): `num_emitted`, `first_position`, `expected_first_position`,
# and the four `*_text` columns. Every other column is a RowRecord or StepRecord field of that name.
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
    # schema version 2, optional state fields
    "query_causal",
    "draft_position_ids",
    "draft_kv_lens",
    "kv_content_checked",
    "kv_mismatch_slot",
    # schema version 3, optional tree and head fields
    "tree_parents",
    "tree_depths",
    "node_attends",
    "tree_path",
    "kept_nodes",
    "head_source",
    # schema version 4, optional draft-input field
    "draft_input_tokens",
    "penalty_history_len",
    "penalty_added",
    "prefill_chunks",
    "draft_prefill_tokens",
    # token text from the trace's piece table
    "pending_text",
    "draft_text",
    "target_text",
    "emitted_text",
]
STEP_COLUMNS = (
    "step",
    "batch_id",
    "cache_len",
    "query_len",
    "grouped",
    "draft_ms",
    "verify_ms",
    "align_ms",
    "total_ms",
)
ROW_COLUMNS = tuple(
    c
    for c in COLUMNS
    if c not in STEP_COLUMNS
    and c not in ("num_emitted", "first_position", "expected_first_position")
    and not c.endswith("_text")
)


def steps_frame(trace: Trace) -> pd.DataFrame:
    """One row per (step, batch row), columns `COLUMNS`, in trace order."""
    texts = token_texts(trace)
    records = [_record(step, row, texts) for step in trace.steps for row in step.rows]
    return pd.DataFrame.from_records(records, columns=COLUMNS)


def _record(step: StepRecord, r: RowRecord, texts: dict[int, str]) -> dict[str, Any]:
    """One frame row by column name: the step's and the row's fields, then the derived columns."""
    record: dict[str, Any] = {name: getattr(step, name) for name in STEP_COLUMNS}
    record.update((name, getattr(r, name)) for name in ROW_COLUMNS)
    record["num_emitted"] = len(r.emitted)
    record["first_position"] = r.position_ids[0] if r.position_ids else None
    record["expected_first_position"] = r.committed_before - 1
    record["pending_text"] = texts.get(r.pending_token)
    record["draft_text"] = [texts.get(t) for t in r.draft_tokens]
    record["target_text"] = [texts.get(t) for t in r.target_tokens]
    record["emitted_text"] = [texts.get(t) for t in r.emitted]
    return record
