"""The checker on hand-sized traces (two prompts, two steps): near-tie thresholds per dtype and
temperature, what the first violation names, output equivalence, masks and rows of one step."""

from __future__ import annotations

import copy

import pytest

from specviz.analysis.check import check_trace
from specviz.trace.schema import SamplingInfo
from specviz.trace.synthetic import synthetic_trace

# ----------------------------------------------------------------------------- hand-sized traces (issue 26)
#
# `small()`: synthetic_trace(2, 2, 2, 5), two prompts, batch 2, k = 2, a budget of 5, two steps:
#     step 0: row 0 seq 0 emits [286, 994, 712]   row 1 seq 1 emits [343, 138, 120]
#     step 1: row 0 seq 0 emits [10, 427] length  row 1 seq 1 emits [73, 308] length
# masks: step 0 row 0 [[0, 5], [1, 5]], row 1 [[1, 10]] (width 10 = cache 7 + query 3).


def small():
    trace = synthetic_trace(2, 2, 2, 5)
    assert [r.emitted for s in trace.steps for r in s.rows] == [[286, 994, 712], [343, 138, 120], [10, 427], [73, 308]]
    assert [r.mask_rle for r in trace.steps[0].rows] == [[[0, 5], [1, 5]], [[1, 10]]]
    return trace


def where(v) -> tuple:
    return (v.step_index, v.row, v.seq_id, v.field)


def diverge(trace, seq_id: int, index: int, margin: float) -> None:
    """The reference of `seq_id` differs at token `index`, with that reference margin there."""
    seq = trace.sequences[seq_id]
    seq.reference_ids[index] += 1
    seq.reference_margins[index] = margin


def test_float64_threshold_is_a_floor_of_1e_6() -> None:
    trace = small()
    trace.header.target.dtype = "float64"
    diverge(trace, 0, 3, 5e-7)
    report = check_trace(trace)
    assert report.margin_threshold == 1e-6
    assert (report.verdict, report.sequences[0].verdict, report.sequences[0].first_divergence) == (
        "numerical",
        "numerical",
        3,
    )
    # the context: up to 4 tokens either side of the divergence, from the first token here
    assert report.sequences[0].context_output == [286, 994, 712, 10, 427]
    assert report.sequences[0].context_reference == [286, 994, 712, 11, 427]
    trace.sequences[0].reference_margins[3] = 2e-6
    assert check_trace(trace).sequences[0].verdict == "unexplained"


def test_first_violation_step_names_the_step_not_its_index() -> None:
    """Steps numbered 10 and 11: a KV fault of seq 1 at the first step (index 0) is step 10."""
    trace = small()
    for i, step in enumerate(trace.steps):
        step.step = 10 + i
    trace.steps[0].rows[1].kv_len += 1
    report = check_trace(trace)
    assert [(s.first_violation_step, s.verdict) for s in report.sequences] == [(None, "exact"), (10, "exact")]


@pytest.mark.parametrize(
    "mode,temperature,threshold",
    [
        ("coupled", 2.0, 2.0**-17),  # float32's 2**-16 / T: a logit error e moves a score by e / T
        ("coupled", 0.5, 2.0**-15),
        ("rejection", 4.0, 2.0**-18),
        ("greedy", 2.0, 2.0**-16),  # greedy ignores the temperature
        ("coupled", 0.0, 2.0**-16),  # no temperature recorded: nothing to divide by
    ],
)
def test_threshold_scales_with_the_sampling_temperature(mode: str, temperature: float, threshold: float) -> None:
    trace = small()
    trace.header.sampling = SamplingInfo(mode=mode, temperature=temperature)
    assert check_trace(trace).margin_threshold == threshold


@pytest.mark.parametrize("mode,skipped", [("rejection", True), ("coupled", False), ("greedy", False)])
def test_rejection_runs_say_output_equivalence_is_not_checked(mode: str, skipped: bool) -> None:
    trace = small()
    trace.header.sampling = SamplingInfo(mode=mode, temperature=1.0)
    report = check_trace(trace)
    assert report.verdict == "clean"
    notes = [(s.check, s.steps, s.of) for s in report.skipped_checks if s.check == "output equivalence"]
    assert notes == ([("output equivalence", 2, 2)] if skipped else [])


def outputs(report) -> list[tuple]:
    return [(where(v), v.expected, v.actual, v.message) for v in report.violations if v.field == "output_ids"]


def test_output_must_be_what_the_steps_wrote_in_a_complete_run() -> None:
    """Seq 1's output loses its last token: the steps wrote 5; found at the last step, its row."""
    trace = small()
    trace.sequences[1].output_ids.pop()
    assert outputs(check_trace(trace)) == [
        ((1, 1, 1, "output_ids"), 5, 4, "sequence 1 output has 4 tokens but the steps wrote 5")
    ]
    trace.header.complete = False  # an interrupted run may have written a step it did not record
    assert outputs(check_trace(trace)) == []


def test_output_over_the_budget_is_found_at_the_step_that_wrote_past_it() -> None:
    """Step 1 row 1 emits a 6th token for seq 1 (budget 5): the output is 6 long, as written."""
    trace = small()
    trace.steps[1].rows[1].emitted.append(308)
    trace.sequences[1].output_ids.append(308)
    assert outputs(check_trace(trace)) == [((1, 1, 1, "output_ids"), 5, 6, "sequence 1 has 6 tokens > its budget of 5")]


@pytest.mark.parametrize("eos,index,step", [(138, 1, 0), (120, 2, 1), (73, 3, 1)])
def test_output_continuing_after_an_eos_is_found_where_the_next_token_was_written(eos, index, step) -> None:
    """`eos` made an EOS id: seq 1's output [343, 138, 120, 73, 308] goes on after it (token
    `index`); tokens 0-2 were written at step 0, tokens 3-4 at step 1."""
    trace = small()
    trace.header.eos_token_ids = [eos]
    assert trace.sequences[1].output_ids[index] == eos
    assert outputs(check_trace(trace)) == [
        ((step, 1, 1, "output_ids"), "nothing after EOS", "tokens after EOS", "sequence 1 continues after EOS")
    ]


def test_output_checks_of_a_run_without_steps_stay_at_the_run() -> None:
    """No step to locate an output fault at: over the budget and after an EOS are not reported
    (no step wrote them), the sequences were never decoded."""
    trace = small()
    trace.steps = []
    for seq in trace.sequences:
        seq.output_ids = [5, 0, 5, 5, 5, 5]  # 6 > 5 tokens, and after the EOS 0
    report = check_trace(trace)
    assert [(v.step_index, v.row, v.seq_id, v.field) for v in report.violations] == [
        (-1, -1, 0, "seq_id"),
        (-1, -1, 1, "seq_id"),
    ]
    assert all("never decoded" in v.message for v in report.violations)


def test_one_sequence_in_two_rows_of_a_step() -> None:
    trace = small()
    twin = copy.deepcopy(trace.steps[0].rows[1])
    twin.row = 2
    trace.steps[0].rows.append(twin)
    twice = [v for v in check_trace(trace).violations if v.step_index == 0 and v.field == "seq_id"]
    assert [(where(v), v.invariant, v.message) for v in twice] == [
        ((0, 2, 1, "seq_id"), 4, "sequence 1 appears in two rows of one step")
    ]


def test_zero_length_mask_runs_are_no_runs() -> None:
    trace = small()
    for step in trace.steps:
        for row in step.rows:
            row.mask_rle = [[1, 0], *row.mask_rle[:1], [0, 0], *row.mask_rle[1:], [0, 0]]
    report = check_trace(trace)
    assert report.verdict == "clean", report.first_violation


def test_rows_of_one_step_must_have_one_mask_width_when_left_padded() -> None:
    """Step 0, row 1's mask gets one more padding slot: widths 10 and 11, flagged at row 0."""
    trace = small()
    trace.steps[0].rows[1].mask_rle = [[0, 1], [1, 10]]
    width = [v for v in check_trace(trace).violations if v.expected == "one width for all rows"]
    assert [(where(v), v.invariant, v.actual) for v in width] == [((0, 0, 0, "mask_rle"), 1, [10, 11])]
    trace.header.layout = "unspecified"  # rows may differ: padding on either side, ragged drafts
    assert not [v for v in check_trace(trace).violations if v.expected == "one width for all rows"]
