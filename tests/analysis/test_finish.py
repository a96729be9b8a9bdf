"""Finish reasons and run completeness (`specviz/analysis/finish.py`) on a trace small enough to
read: two prompts, batch 2, k = 2, a budget of 5 tokens, two steps (issue 26, mutation survivors).

The trace (`synthetic_trace(2, 2, 2, 5)`, an independent writer of the format):

    step 0: row 0 seq 0 emits [286, 994, 712]   row 1 seq 1 emits [343, 138, 120]
    step 1: row 0 seq 0 emits [10, 427] length  row 1 seq 1 emits [73, 308] length

Each test makes one defect and names the violation it must produce: step index, row, field.
"""

from __future__ import annotations

import pytest

from specviz.analysis.check import check_trace
from specviz.analysis.finish import records_row_finish
from specviz.trace.synthetic import synthetic_trace


def small():
    trace = synthetic_trace(2, 2, 2, 5)
    assert [r.emitted for s in trace.steps for r in s.rows] == [[286, 994, 712], [343, 138, 120], [10, 427], [73, 308]]
    return trace


def where(v) -> tuple:
    return (v.step_index, v.row, v.seq_id, v.field)


def strip_row_finish(trace) -> None:
    for step in trace.steps:
        for row in step.rows:
            row.finished, row.finish_reason = False, None


# ----------------------------------------------------------------------------- records_row_finish


def test_row_finish_is_recorded_if_any_row_says_finished_or_gives_a_reason() -> None:
    trace = small()
    assert records_row_finish(trace.steps)
    strip_row_finish(trace)
    assert not records_row_finish(trace.steps)  # no row says anything: not recorded
    last = trace.steps[1].rows[1]
    last.finished = True  # the flag alone
    assert records_row_finish(trace.steps)
    last.finished, last.finish_reason = False, "length"  # the reason alone
    assert records_row_finish(trace.steps)


class ColumnarSteps(list):
    """Steps that answer `records_row_finish` from their columns; reading the rows is an error."""

    def __init__(self, steps, answer: bool) -> None:
        super().__init__(steps)
        self.answer = answer

    def records_row_finish(self) -> bool:
        return self.answer

    def __iter__(self):
        raise AssertionError("records_row_finish read every row of a columnar trace")


@pytest.mark.parametrize("answer", [True, False])
def test_columnar_steps_answer_without_a_full_read(answer: bool) -> None:
    assert records_row_finish(ColumnarSteps(small().steps, answer)) is answer


# ----------------------------------------------------------------------------- per step


def test_trace_without_row_finish_fields_skips_only_the_row_reason_checks() -> None:
    trace = small()
    strip_row_finish(trace)  # an engine that does not record row endings: no alarm at all
    report = check_trace(trace)
    assert report.verdict == "clean", report.first_violation
    skipped = [(s.check, s.steps, s.of) for s in report.skipped_checks]
    assert ("row finish reasons", 2, 2) in skipped
    trace.sequences[1].finish_reason = "eos"  # the sequence-level reason is still checked
    report = check_trace(trace)
    assert [where(v) for v in report.violations] == [(1, 1, 1, "finish_reason")]


def test_eos_inside_a_step_ends_the_sequence_at_that_step() -> None:
    """994 made an EOS id: seq 0 emits [286, EOS, 712] at step 0 and is decoded again at step 1,
    where its row's ending (a wrong 'eos') is not judged again: decoding it at all is the fault."""
    trace = small()
    trace.header.eos_token_ids = [994]
    trace.steps[1].rows[0].finish_reason = "eos"
    report = check_trace(trace)
    assert [v.field for v in report.violations if (v.step_index, v.row) == (1, 0)] == ["seq_id"]
    after_eos = [v for v in report.violations if v.expected == "nothing after EOS" and v.field == "emitted"]
    assert [(where(v), v.actual, v.message) for v in after_eos] == [
        ((0, 0, 0, "emitted"), [712], "1 token(s) emitted after EOS in the same step")
    ]
    again = [v for v in report.violations if where(v) == (1, 0, 0, "seq_id")]  # the EOS ended it at step 0
    assert len(again) == 1 and "finished at step 0 but is decoded again" in again[0].message


def test_eos_inside_a_step_ends_the_sequence_where_rows_record_no_endings() -> None:
    """As above, in a trace without row finish fields: the EOS alone ends seq 0 at step 0."""
    trace = small()
    trace.header.eos_token_ids = [994]
    strip_row_finish(trace)
    report = check_trace(trace)
    again = [v for v in report.violations if where(v) == (1, 0, 0, "seq_id")]
    assert len(again) == 1 and "finished at step 0 but is decoded again" in again[0].message


def test_reason_eos_is_judged_by_the_last_token_only() -> None:
    """10 made an EOS id: seq 0's output [286, 994, 712, 10, 427] holds an EOS, but ends on 427,
    the 5th of 5 tokens, so only 'length' is right; the wrong 'eos' is located at the last step
    that wrote to it (step 1), not the first."""
    trace = small()
    trace.header.eos_token_ids = [10]
    trace.sequences[0].finish_reason = "eos"
    report = check_trace(trace)
    wrong = [v for v in report.violations if v.field == "finish_reason"]
    assert [(where(v), v.expected, v.actual) for v in wrong] == [((1, 0, 0, "finish_reason"), ["length"], "eos")]
    assert "its last token 427 is not an EOS id" in wrong[0].message


def test_a_complete_run_needs_every_sequence_reason() -> None:
    trace = small()
    trace.sequences[1].finish_reason = None
    report = check_trace(trace)
    assert [(where(v), v.expected, v.actual) for v in report.violations] == [
        ((1, 1, 1, "finish_reason"), ["length"], None)
    ]
    assert report.violations[0].message == "sequence 1 has no finish_reason in a run marked complete"


def row_endings(report) -> list[tuple]:
    return [
        (where(v), v.expected, v.actual, v.message)
        for v in report.violations
        if v.field in ("finished", "finish_reason")
    ]


def test_a_row_that_ended_its_sequence_must_say_why() -> None:
    trace = small()
    last = trace.steps[1].rows[1]  # seq 1's 4th and 5th tokens: the budget
    last.finished, last.finish_reason = False, None
    assert row_endings(check_trace(trace)) == [
        (
            (1, 1, 1, "finish_reason"),
            "length",
            None,
            "sequence 1 ended at this step (5 tokens, the budget) but the row records no finish",
        )
    ]
    trace = small()
    trace.header.eos_token_ids = [120]  # step 0, row 1 emits [343, 138, 120]: an EOS at its end
    assert row_endings(check_trace(trace))[0] == (
        (0, 1, 1, "finish_reason"),
        "eos",
        None,
        "sequence 1 ended at this step (EOS) but the row records no finish",
    )


@pytest.mark.parametrize("finished,reason", [(False, "length"), (True, None)])
def test_finished_flag_must_agree_with_the_reason(finished: bool, reason) -> None:
    trace = small()
    row = trace.steps[1].rows[1]
    row.finished, row.finish_reason = finished, reason
    flags = [e for e in row_endings(check_trace(trace)) if e[0][3] == "finished"]
    assert flags == [
        ((1, 1, 1, "finished"), not finished, finished, f"finished is {finished} but finish_reason is {reason!r}")
    ]


def test_a_wrong_eos_names_the_last_token_received() -> None:
    trace = small()
    trace.steps[1].rows[1].finish_reason = "eos"  # it received [73, 308]: the budget, no EOS
    assert row_endings(check_trace(trace)) == [
        (
            (1, 1, 1, "finish_reason"),
            ["length"],
            "eos",
            "finish_reason 'eos' for sequence 1, but its last token 308 is not an EOS id",
        )
    ]


def test_an_ending_claimed_early_still_ends_the_sequence() -> None:
    """Step 0, row 1 claims 'length' at 3 of 5 tokens: wrong there, and the sequence may not come
    back at step 1 (that row is 'decoded again', its own ending not judged)."""
    trace = small()
    early = trace.steps[0].rows[1]
    early.finished, early.finish_reason = True, "length"
    report = check_trace(trace)
    assert row_endings(report) == [
        ((0, 1, 1, "finish_reason"), None, "length", "finish_reason 'length' for sequence 1 with 3 of 5 tokens")
    ]
    again = [v for v in report.violations if where(v) == (1, 1, 1, "seq_id")]
    assert len(again) == 1 and "finished at step 0 but is decoded again" in again[0].message


# ----------------------------------------------------------------------------- per sequence, end of run


def unfinished_at(report) -> dict[str, tuple[int, int]]:
    """'sequence N' -> (step index, row) of its "left the batch unfinished" violation."""
    out = {}
    for v in report.violations:
        if "left the batch unfinished" in v.message:
            out[" ".join(v.message.split()[:2])] = (v.step_index, v.row)
    return out


def misrouted_last_step(eos: list[int]):
    """Step 1 holds only seq 0's row, and it writes one token [10] to seq 1."""
    trace = small()
    trace.header.eos_token_ids = eos
    step = trace.steps[1]
    row = step.rows[0]
    row.write_seq, row.emitted, row.finished, row.finish_reason = 1, [10], False, None
    step.rows = [row]
    for seq in trace.sequences:
        seq.finish_reason = None
    return check_trace(trace)


def test_an_unfinished_sequence_is_located_at_the_last_step_that_held_it() -> None:
    """Seq 0 wrote only at step 0 (3 of 5 tokens) but was held at step 1: located there."""
    report = misrouted_last_step(eos=[0])
    assert unfinished_at(report)["sequence 0"] == (1, 0)
    assert (1, 0, 0, "write_seq") in {where(v) for v in report.violations}


def test_an_unfinished_sequence_is_located_at_the_last_step_that_fed_it() -> None:
    """712 made an EOS id: seq 0 ends at step 0. Seq 1's own row was last at step 0, but seq 0's
    row fed it at step 1 (4 of 5 tokens): located at step 1, at the row that wrote to it."""
    report = misrouted_last_step(eos=[712])
    assert unfinished_at(report) == {"sequence 1": (1, 0)}


def test_a_zero_token_budget_needs_no_step() -> None:
    trace = small()
    trace.header.max_new_tokens = 0
    trace.steps = []
    for seq in trace.sequences:
        seq.output_ids, seq.reference_ids, seq.reference_margins, seq.finish_reason = [], [], [], "length"
    report = check_trace(trace)
    assert report.verdict == "clean" and report.violations == []


def test_a_one_token_budget_sequence_never_scheduled_is_found_at_the_run() -> None:
    trace = synthetic_trace(3, 2, 2, 1)  # batch 0: seqs 0 and 1 (one step); batch 1: seq 2
    assert [[r.seq_id for r in s.rows] for s in trace.steps] == [[0, 1], [2]]
    trace.steps = trace.steps[:1]
    trace.sequences[2].output_ids, trace.sequences[2].finish_reason = [], None
    report = check_trace(trace)
    never = [v for v in report.violations if v.seq_id == 2 and "never decoded" in v.message]
    assert [(v.step_index, v.row, v.field) for v in never] == [(0, -1, "seq_id")]


def test_a_wrong_eos_of_a_one_token_output_names_that_token() -> None:
    trace = synthetic_trace(3, 2, 2, 1)
    seq = trace.sequences[0]
    seq.finish_reason = "eos"
    wrong = [v for v in check_trace(trace).violations if v.seq_id == 0]
    assert [(v.field, v.expected, v.actual) for v in wrong] == [("finish_reason", ["length"], "eos")]
    assert (
        wrong[0].message
        == f"finish_reason 'eos' for sequence 0, but its last token {seq.output_ids[0]} is not an EOS id"
    )


def test_two_sequences_unfinished_at_one_row_are_both_reported_each_under_its_own_id() -> None:
    """Seq 0's row at step 1 holds seq 0 and feeds seq 1; both leave unfinished there. The two
    violations have the same field and values and the same row: each is kept, named by its own
    sequence (they were once merged into one under seq 0)."""
    report = misrouted_last_step(eos=[0])
    assert unfinished_at(report) == {"sequence 0": (1, 0), "sequence 1": (1, 0)}
    about = {v.seq_id for v in report.violations if "left the batch unfinished" in v.message}
    assert about == {0, 1}


def test_a_sequence_whose_own_budget_is_zero_needs_no_step() -> None:
    """A watched engine's per-request budget (`header.options.sequence_budgets`): seq 2 may write
    nothing, so a complete run never decodes it; the run's max_new_tokens (1) is not its budget."""
    trace = synthetic_trace(3, 2, 2, 1)  # batch 0: seqs 0 and 1 (one step); batch 1: seq 2
    trace.steps = trace.steps[:1]
    trace.sequences[2].output_ids, trace.sequences[2].finish_reason = [], "length"
    trace.sequences[2].reference_ids, trace.sequences[2].reference_margins = [], []
    trace.header.options["sequence_budgets"] = {"2": 0}
    report = check_trace(trace)
    assert report.verdict == "clean" and report.violations == []
    trace.header.options["sequence_budgets"] = {"2": 1}  # the control: a budget of 1 must be decoded
    never = [v for v in check_trace(trace).violations if "never decoded" in v.message]
    assert [(v.step_index, v.seq_id) for v in never] == [(0, 2)]


@pytest.mark.parametrize("bad", ["x", {"1": "x"}, {"1": -3}, {"1": [5]}])
def test_an_unreadable_sequence_budget_is_the_runs_not_a_traceback(bad) -> None:
    trace = small()
    trace.header.options["sequence_budgets"] = bad
    assert check_trace(trace).verdict == check_trace(small()).verdict == "clean"
