"""The checker on how runs end: EOS, finish reasons, the length budget, sequences dropped or never
scheduled, interrupted and complete runs, on edited copies of the synthetic trace."""

from __future__ import annotations

import copy
import functools

import pytest
from edited_traces import clean_synth, first

from specviz.analysis.check import check_trace

# ----------------------------------------------------------------------------- completeness and endings

EOS_NEW = 99_999  # a token id the synthetic trace never uses otherwise


def drop_after(trace, seq_id: int, si: int) -> None:
    """Remove sequence `seq_id` from every step after index `si` (rows renumbered, empty steps dropped)."""
    for step in trace.steps[si + 1 :]:
        step.rows = [r for r in step.rows if r.seq_id != seq_id]
        for i, r in enumerate(step.rows):
            r.row = i
    trace.steps = trace.steps[: si + 1] + [s for s in trace.steps[si + 1 :] if s.rows]
    seq = next(s for s in trace.sequences if s.seq_id == seq_id)
    seq.output_ids = [t for s in trace.steps[: si + 1] for r in s.rows if r.write_seq == seq_id for t in r.emitted]


def end_with_eos(trace, seq_id: int):
    """Make `seq_id` end, correctly, with an EOS bonus at its first step that emits a bonus."""
    si, row = next(
        (i, r)
        for i, s in enumerate(trace.steps)
        for r in s.rows
        if r.seq_id == seq_id and r.bonus is not None and not r.finished
    )
    row.target_tokens[row.accepted] = row.bonus = row.emitted[-1] = EOS_NEW
    row.finished, row.finish_reason, row.left_pad_after = True, "eos", None
    drop_after(trace, seq_id, si)
    seq = trace.sequences[seq_id]
    seq.reference_ids, seq.reference_margins = list(seq.output_ids), [1.0] * len(seq.output_ids)
    seq.finish_reason = "eos"
    trace.header.eos_token_ids = [0, EOS_NEW]
    return si, row


@functools.cache
def eos_synth():
    trace = copy.deepcopy(clean_synth())
    return trace, end_with_eos(trace, 2)


def eos_mutated(edit):
    """`edit(trace, step_index, row)` on a copy of the EOS-ending trace; returns (trace, si, row)."""
    trace, (si, row) = copy.deepcopy(eos_synth())
    edit(trace, si, row)
    return trace, si, row


def test_sequence_ending_with_eos_is_clean() -> None:
    trace, (si, row) = eos_synth()
    assert row.emitted[-1] == EOS_NEW and check_trace(trace).verdict == "clean"


@pytest.mark.parametrize(
    "edit,fld",
    [
        (lambda t, si, r: setattr(t.sequences[2], "finish_reason", "length"), "finish_reason"),
        (lambda t, si, r: setattr(r, "finish_reason", "length"), "finish_reason"),
        (lambda t, si, r: (setattr(r, "finish_reason", None), setattr(r, "finished", False)), "finish_reason"),
        (lambda t, si, r: setattr(r, "finished", False), "finished"),
        (lambda t, si, r: setattr(t.header, "eos_token_ids", [0]), "finish_reason"),  # that token is no EOS
    ],
    ids=["sequence says length", "row says length", "row says nothing", "finished flag", "eos without EOS"],
)
def test_wrong_finish_reason_is_found_where_the_sequence_ended(edit, fld) -> None:
    trace, si, row = eos_mutated(edit)
    report = check_trace(trace)
    assert report.verdict == "desync"
    assert first(report) == (si, row.row, 4, fld), report.first_violation


def test_tokens_after_eos_in_one_step_are_found_at_that_step() -> None:
    trace, si, row = eos_mutated(lambda t, si, r: (r.emitted.append(7), t.sequences[2].output_ids.append(7)))
    report = check_trace(trace)
    hits = {(v.step_index, v.row, v.field) for v in report.violations}
    assert report.first_violation.step_index == si and (si, row.row, "emitted") in hits
    assert any("after EOS" in v.message for v in report.violations if v.step_index == si)


def test_length_claimed_one_token_short_is_found_at_that_step() -> None:
    trace = copy.deepcopy(clean_synth())
    # The row just before a sequence's finishing "length" row: it claims the budget is spent.
    ends = [(si, r) for si, s in enumerate(trace.steps) for r in s.rows if r.finish_reason == "length"]
    si_end, end = ends[0]
    si, row = next((i, r) for i in range(si_end - 1, -1, -1) for r in trace.steps[i].rows if r.seq_id == end.seq_id)
    row.finished, row.finish_reason = True, "length"
    report = check_trace(trace)
    assert first(report) == (si, row.row, 4, "finish_reason")
    assert "length" in report.first_violation.message and f"of {trace.header.max_new_tokens}" in (
        report.first_violation.message
    )


def _dropped(complete: bool):
    trace = copy.deepcopy(clean_synth())
    seq_id = 5
    si = [i for i, s in enumerate(trace.steps) if any(r.seq_id == seq_id for r in s.rows)][2]
    drop_after(trace, seq_id, si)
    trace.sequences[seq_id].finish_reason = None
    trace.header.complete = complete
    return trace, si, seq_id


def test_sequence_dropped_from_a_complete_run_is_a_located_violation() -> None:
    trace, si, seq_id = _dropped(complete=True)
    report = check_trace(trace)
    assert report.verdict == "desync" and report.exact_match < 1.0
    located = [v for v in report.violations if v.seq_id == seq_id]
    assert located and (located[0].step_index, located[0].field) == (si, "finish_reason")
    assert "unfinished" in located[0].message
    assert report.sequences[seq_id].verdict == "desync"


def test_interrupted_run_keeps_identical_so_far() -> None:
    trace, _, seq_id = _dropped(complete=False)
    report = check_trace(trace)
    assert report.verdict == "clean" and report.exact_match == 1.0


def test_sequence_never_scheduled_in_a_complete_run_is_a_violation_at_the_run() -> None:
    trace = copy.deepcopy(clean_synth())
    drop_after(trace, 7, -1)
    trace.sequences[7].finish_reason = None
    report = check_trace(trace)
    assert report.verdict == "desync" and report.exact_match < 1.0
    v = next(v for v in report.violations if v.seq_id == 7)
    assert (v.step_index, v.row) == (len(trace.steps) - 1, -1) and "never decoded" in v.message
    assert report.sequences[7].verdict == "desync"


def test_complete_run_without_steps_is_not_clean() -> None:
    from specviz.analysis.text import render_report

    trace = copy.deepcopy(clean_synth())
    trace.steps = []
    for seq in trace.sequences:
        seq.output_ids, seq.finish_reason = [], None
    report = check_trace(trace)
    assert report.verdict == "desync" and report.exact_match == 0.0
    assert report.violation_count == len(trace.sequences)
    assert (report.first_violation.step, report.first_violation.row) == (-1, -1)
    assert "never decoded" in render_report(trace, report)


def test_rows_without_mask_next_to_rows_with_one_raise_no_alarm() -> None:
    trace = copy.deepcopy(clean_synth())
    for step in trace.steps:
        for row in step.rows[::2]:
            row.mask_rle = []
    report = check_trace(trace)
    assert report.verdict == "clean", report.first_violation
    assert any("mask_rle" in s for s in report.skipped_checks)


def test_bonus_must_name_the_emitted_bonus() -> None:
    trace = copy.deepcopy(clean_synth())
    si, row = next((i, r) for i, s in enumerate(trace.steps) for r in s.rows if r.bonus is not None)
    row.bonus = None
    assert first(check_trace(trace)) == (si, row.row, 4, "bonus")
