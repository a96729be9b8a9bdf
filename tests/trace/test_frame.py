"""The pandas view `steps_frame`: one row per (step, batch row), values equal to the records."""

from __future__ import annotations

import pandas as pd

from specviz.trace import steps_frame
from specviz.trace.frame import COLUMNS
from specviz.trace.synthetic import synthetic_trace


def test_one_frame_row_per_step_row_in_trace_order() -> None:
    trace = synthetic_trace(num_prompts=7, batch_size=3, k=3, max_new=12)
    frame = steps_frame(trace)
    pairs = [(step.step, row.row) for step in trace.steps for row in step.rows]
    assert list(frame.columns) == COLUMNS
    assert list(zip(frame.step, frame.row)) == pairs


def test_frame_values_match_the_records() -> None:
    trace = synthetic_trace(num_prompts=5, batch_size=4, k=2, max_new=9)
    frame = steps_frame(trace)
    records = [(step, row) for step in trace.steps for row in step.rows]
    for (step, row), line in zip(records, frame.itertuples(index=False)):
        assert line.seq_id == row.seq_id and line.accepted == row.accepted
        assert line.cache_len == step.cache_len and line.query_len == step.query_len
        assert line.num_emitted == len(row.emitted)
        assert line.first_position == row.position_ids[0]
        assert line.expected_first_position == row.committed_before - 1


def test_per_sequence_totals_equal_the_outputs() -> None:
    """Summing emitted tokens per sequence gives each sequence's output length (a clean run)."""
    trace = synthetic_trace(num_prompts=6, batch_size=4, k=4, max_new=10)
    per_seq = steps_frame(trace).groupby("write_seq").num_emitted.sum().to_dict()
    assert per_seq == {s.seq_id: len(s.output_ids) for s in trace.sequences}


def test_empty_trace_gives_an_empty_frame_with_the_columns() -> None:
    trace = synthetic_trace(num_prompts=2, batch_size=2, k=1, max_new=3)
    trace.steps = []
    frame = steps_frame(trace)
    assert frame.empty and list(frame.columns) == COLUMNS


def test_every_record_field_is_a_column_by_name() -> None:
    """Every RowRecord and StepRecord field (all schema versions: every field `check` reads) is a
    column of that name, holding that field's value."""
    import dataclasses

    from specviz.trace.io import load_trace
    from specviz.trace.schema import RowRecord, StepRecord

    fields = [f.name for f in dataclasses.fields(RowRecord)] + [
        f.name for f in dataclasses.fields(StepRecord) if f.name != "rows"
    ]
    assert set(fields) <= set(COLUMNS)
    trace = load_trace("traces/default-eqspec-kv-row-copy.json.gz")  # records the v2 state fields
    frame = steps_frame(trace)
    records = [(step, row) for step in trace.steps for row in step.rows]
    for i, (step, row) in enumerate(records):
        line = frame.iloc[i]
        for name in fields:
            value = getattr(row, name) if hasattr(row, name) else getattr(step, name)
            if value is None:  # pandas shows a missing value of a numeric column as NaN
                assert line[name] is None or pd.isna(line[name]), (i, name)
            else:
                assert line[name] == value, (i, name)
    assert frame.kv_mismatch_slot.notna().any() and frame.kv_content_checked.any()
