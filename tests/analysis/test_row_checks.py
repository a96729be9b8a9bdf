"""The checks of one batch row (`specviz/analysis/row_checks.py`), on hand-built rows and on a
trace small enough to read (issue 26, mutation survivors). Every expected value is worked out
in a comment from the rules in the module's docstring.

`small()` is `synthetic_trace(2, 2, 2, 5)`: two prompts (3 and 8 tokens), batch 2, k = 2, a
budget of 5, two steps; step 0 has cache_len 7 and query_len 3:
    row 0 seq 0: committed 3, left_pad 5, mask [[0, 5], [1, 5]], kv_len 2, emits [286, 994, 712]
    row 1 seq 1: committed 8, left_pad 0, mask [[1, 10]],        kv_len 7, emits [343, 138, 120]
"""

from __future__ import annotations

from specviz.analysis.check import check_trace
from specviz.analysis.findings import Findings
from specviz.analysis.row_checks import check_kv, check_positions
from specviz.trace.schema import RowRecord, StepRecord
from specviz.trace.synthetic import synthetic_trace


def small():
    trace = synthetic_trace(2, 2, 2, 5)
    assert [r.mask_rle for r in trace.steps[0].rows] == [[[0, 5], [1, 5]], [[1, 10]]]
    return trace


def where(v) -> tuple:
    return (v.step_index, v.row, v.seq_id, v.field)


def hand_row(committed_before: int, drafts: int, position_ids: list[int]) -> RowRecord:
    return RowRecord(
        row=0,
        seq_id=0,
        committed_before=committed_before,
        left_pad=0,
        left_pad_after=0,
        pending_token=1,
        draft_tokens=[2] * drafts,
        target_tokens=[2] * (drafts + 1),
        accepted=drafts,
        bonus=2,
        emitted=[2] * (drafts + 1),
        write_seq=0,
        position_ids=position_ids,
        mask_rle=[],
        kv_len=committed_before - 1,
        kv_len_expected=committed_before - 1,
    )


def positions_violations(row: RowRecord, query_len: int) -> list:
    step = StepRecord(0, 0, 200, query_len, None, 0.0, 0.0, 0.0, 0.0, [row])
    findings = Findings()
    check_positions(findings.at(0, step, row))
    return findings.violations


def test_expected_positions_are_listed_up_to_64_then_shown_by_their_ends() -> None:
    # committed 100: the window starts at 99; 63 drafts: 64 positions 99..162, listed in full
    listed = positions_violations(hand_row(100, 63, [0] * 64), query_len=64)
    assert [(v.field, v.expected) for v in listed] == [("position_ids", list(range(99, 163)))]
    assert listed[0].message == "positions start at [0] for a row with 100 committed tokens (expected 99)"
    # 64 drafts: 65 positions 99..163, too many to list
    ends = positions_violations(hand_row(100, 64, [0] * 65), query_len=65)
    assert [(v.field, v.expected) for v in ends] == [("position_ids", "99..163 (65 positions)")]
    assert positions_violations(hand_row(100, 64, list(range(99, 164))), query_len=65) == []


def test_alignment_is_a_rule_of_the_left_padded_layout_only() -> None:
    """Row 1's left_pad says 3 where its mask starts with no padding: an alignment violation
    when left-padded; an unspecified layout skips the check (and says so), nothing else fires."""
    trace = small()
    trace.steps[0].rows[1].left_pad = 3
    assert [(where(v), v.invariant, v.expected, v.actual) for v in check_trace(trace).violations] == [
        ((0, 1, 1, "left_pad"), 1, 0, 3)
    ]
    trace.header.layout = "unspecified"
    report = check_trace(trace)
    assert report.verdict == "clean", report.first_violation
    skipped = [(s.check, s.reason, s.steps) for s in report.skipped_checks if s.check == "rectangular alignment"]
    assert skipped == [("rectangular alignment", "the trace declares no left-padded layout", 2)]


def test_a_masked_hole_right_after_the_first_run_is_counted() -> None:
    """Row 1 (no padding) gets two masked slots inside its attended region: [[1, 6], [0, 2], [1, 2]]
    (same width 10): the hole is run 1, two slots."""
    trace = small()
    trace.steps[0].rows[1].mask_rle = [[1, 6], [0, 2], [1, 2]]
    holes = [v for v in check_trace(trace).violations if v.invariant == 1]
    assert [(where(v), v.expected, v.actual, v.message) for v in holes] == [
        (
            (0, 1, 1, "mask_rle"),
            "no masked slot after the first real slot",
            "2 masked slot(s) inside the row",
            "2 masked hole(s) inside the attended region",
        )
    ]


def test_check_kv_defaults_to_a_declared_layout() -> None:
    """Committed 5, two drafts, on a step of cache 6 and query 3: the mask must be 9 wide; this
    one is 8 (no layout given: a declared one, where the width is the step's, not the row's)."""
    row = hand_row(5, 2, [4, 5, 6])
    row.mask_rle = [[0, 1], [1, 7]]
    step = StepRecord(0, 0, 6, 3, None, 0.0, 0.0, 0.0, 0.0, [row])
    findings = Findings()
    check_kv(findings.at(0, step, row), row.mask_rle, k=2)
    assert [(v.field, v.expected, v.actual) for v in findings.violations] == [("mask_rle", 9, 8)]


def test_a_ragged_row_queries_its_own_drafts_only() -> None:
    """Unspecified layout (watched engines draft d in 0..k per row): at step 1, seq 1's row drafts
    one token instead of two, so its query is 2 slots: positions [10, 11], mask 10 cached + 2 = 12."""
    trace = small()
    trace.header.layout = "unspecified"
    row = trace.steps[1].rows[1]
    assert (row.draft_tokens, row.target_tokens, row.accepted, row.emitted) == ([73, 309], [73, 308, 831], 1, [73, 308])
    row.draft_tokens, row.target_tokens, row.position_ids, row.mask_rle = [73], [73, 308], [10, 11], [[1, 12]]
    report = check_trace(trace)
    assert report.verdict == "clean", report.first_violation
    row.position_ids = [10, 11, 12]  # fed one slot past its query
    assert [(where(v), v.expected) for v in check_trace(trace).violations] == [((1, 1, 1, "position_ids"), [10, 11])]


def kv_masks(trace) -> list[tuple]:
    return [
        (where(v), v.expected, v.actual)
        for v in check_trace(trace).violations
        if (v.invariant, v.field) == (3, "mask_rle")
    ]


def test_mask_counts_are_checked_against_the_step_and_kv_len() -> None:
    """Step 0 (cache 7 + query 3 = width 10). Row 1 [[1, 11]]: width 11. Row 0 [[0, 6], [1, 4]]:
    attends 1 of its cache slots where kv_len says 2. Row 1 [[1, 9], [0, 1]]: 2 of 3 query slots.
    Only the one count each defect breaks is reported."""
    trace = small()
    trace.steps[0].rows[1].mask_rle = [[1, 11]]
    assert kv_masks(trace) == [((0, 1, 1, "mask_rle"), 10, 11)]  # and nothing else about that mask
    trace = small()
    trace.steps[0].rows[0].mask_rle = [[0, 6], [1, 4]]
    assert kv_masks(trace) == [((0, 0, 0, "mask_rle"), 2, 1)]
    trace = small()
    trace.steps[0].rows[1].mask_rle = [[1, 9], [0, 1]]
    assert kv_masks(trace) == [((0, 1, 1, "mask_rle"), 3, 2)]
    # Row 1 [[1, 6], [0, 1], [1, 3]]: 6 of 7 cache slots, then a run starting exactly at the query
    trace = small()
    trace.steps[0].rows[1].mask_rle = [[1, 6], [0, 1], [1, 3]]
    assert kv_masks(trace) == [((0, 1, 1, "mask_rle"), 7, 6)]


def test_the_draft_cache_is_checked_whenever_a_draft_runs() -> None:
    """Committed 3 tokens: the draft cache must hold 2. With k = 1 a draft ran, so 0 is flagged;
    with k = 0 (plain decoding) no draft ran and the recorded value means nothing."""
    for k, flagged in ((1, [((0, 0, 0, "draft_kv_len"), 2, 0)]), (0, [])):
        trace = synthetic_trace(2, 2, k, 5)
        row = trace.steps[0].rows[0]
        assert (row.committed_before, row.draft_kv_len) == (3, 2)
        row.draft_kv_len = 0
        found = [(where(v), v.expected, v.actual) for v in check_trace(trace).violations]
        assert found == flagged, k


def test_a_short_draft_in_a_declared_layout_is_flagged_with_its_extra_query_slot() -> None:
    """Left-padded (declared: k drafts per row), step 1, seq 1's row drafts one token for k = 2,
    yet its mask attends all 3 query slots of the step: two violations, the draft count and the
    query slots attended beyond its own query of 2."""
    trace = small()
    row = trace.steps[1].rows[1]
    row.draft_tokens, row.target_tokens, row.position_ids = [73], [73, 308], [10, 11]
    assert row.mask_rle == [[1, 13]]
    found = [(where(v), v.invariant, v.expected, v.actual) for v in check_trace(trace).violations]
    assert found == [((1, 1, 1, "mask_rle"), 3, 2, 3), ((1, 1, 1, "draft_tokens"), 4, 2, 1)]


def test_accepted_beyond_the_drafts_is_flagged_alone() -> None:
    """Step 0, row 0 claims 3 accepted of its 2 drafts: one violation, and nothing derived from
    the impossible count (no acceptance or bonus check runs on it)."""
    trace = small()
    trace.steps[0].rows[0].accepted = 3
    found = [(where(v), v.expected, v.actual, v.message) for v in check_trace(trace).violations]
    assert found == [((0, 0, 0, "accepted"), "0..2", 3, "accepted 3 of 2 drafts")]


def test_accepted_is_bounded_by_a_ragged_row_own_drafts() -> None:
    """Unspecified layout, step 1, seq 1's row drafts one token (k = 2) and claims 2 accepted."""
    trace = small()
    trace.header.layout = "unspecified"
    row = trace.steps[1].rows[1]
    row.draft_tokens, row.target_tokens, row.position_ids, row.mask_rle = [73], [73, 308], [10, 11], [[1, 12]]
    row.accepted = 2
    found = [(where(v), v.expected, v.actual, v.message) for v in check_trace(trace).violations]
    assert found == [((1, 1, 1, "accepted"), "0..1", 2, "accepted 2 of 1 drafts")]


def test_a_row_claims_are_checked_against_its_sequence_history() -> None:
    """Step 1, seq 1's row: its sequence has 8 prompt + 3 written = 11 tokens, the last 120."""
    trace = small()
    row = trace.steps[1].rows[1]
    assert (row.committed_before, row.pending_token) == (11, 120)
    row.pending_token = 121
    found = [(where(v), v.expected, v.actual) for v in check_trace(trace).violations]
    assert found == [((1, 1, 1, "pending_token"), 120, 121)]
    row.pending_token, row.committed_before = 120, 12  # positions and caches then disagree too
    history = [v for v in check_trace(trace).violations if v.field == "committed_before"]
    assert [(where(v), v.expected, v.actual, v.message) for v in history] == [
        ((1, 1, 1, "committed_before"), 11, 12, "row claims 12 committed tokens; its sequence has 11")
    ]


def test_rows_without_target_tokens_skip_the_greedy_acceptance_check() -> None:
    trace = small()
    for step in trace.steps:
        for row in step.rows:
            row.target_tokens = []
    report = check_trace(trace)
    assert report.verdict == "clean", report.first_violation
    skipped = [(s.check, s.reason, s.steps) for s in report.skipped_checks if s.check == "greedy acceptance"]
    assert skipped == [("greedy acceptance", "target_tokens missing or not d+1 long", 2)]


def test_emitted_must_be_a_prefix_of_the_accepted_drafts_plus_the_bonus() -> None:
    """Step 0, row 1 accepted both drafts [343, 138] and the target's bonus is 120; it emits 999
    in the bonus's place (and names it the bonus)."""
    trace = small()
    row = trace.steps[0].rows[1]
    assert (row.draft_tokens, row.target_tokens, row.accepted) == ([343, 138], [343, 138, 120], 2)
    row.emitted[2] = row.bonus = 999
    trace.sequences[1].output_ids[2] = 999
    at_step_0 = [
        (where(v), v.expected, v.actual, v.message) for v in check_trace(trace).violations if v.step_index == 0
    ]
    assert at_step_0 == [
        (
            (0, 1, 1, "emitted"),
            [343, 138, 120],
            [343, 138, 999],
            "emitted tokens are not a prefix of the accepted drafts plus the bonus",
        )
    ]


def test_an_emitted_token_in_place_of_the_targets_eos_names_the_likely_cause() -> None:
    """The same row, with the target's bonus being EOS (the header's eos ids): the violation stays
    (the raw argmax was EOS), and the message names EOS suppression and the declaration that fits."""
    trace = small()
    eos = trace.header.eos_token_ids[0]
    row = trace.steps[0].rows[1]
    row.target_tokens[2] = eos  # the target's own token after the two accepted drafts: EOS
    row.emitted[2] = row.bonus = 999  # the engine emitted 999 there (as min_new_tokens would)
    trace.sequences[1].output_ids[2] = 999
    (v,) = [v for v in check_trace(trace).violations if v.step_index == 0]
    assert (where(v), v.expected, v.actual) == ((0, 1, 1, "emitted"), [343, 138, eos], [343, 138, 999])
    assert v.message == (
        "emitted tokens are not a prefix of the accepted drafts plus the bonus (the target's token there is "
        "EOS: if the engine suppresses EOS, e.g. HF min_new_tokens, its choice is not the raw argmax; "
        "watch it with logits_processed=True)"
    )
