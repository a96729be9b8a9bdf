"""Slot forensics (specviz.analysis.slots): which physical slot holds which logical token, and which
slots differ from what a correct left-padded engine feeds. Hand-built steps pin each rule; runs of
the tiny model pair (tests/support/tiny.py), correct and with each fault, check the rules end to end.
"""

from __future__ import annotations

from typing import Any

import pytest
from ragged import RAGGED_K

from specviz.analysis.check import check_trace
from specviz.analysis.report import Violation
from specviz.analysis.slot_model import SLOT_KINDS, StepSlots
from specviz.analysis.slots import (
    anchor_col,
    expected_row,
    fed_history,
    fed_position_before,
    step_slots,
)
from specviz.trace.mask_runs import expand_mask
from specviz.trace.schema import Header, ModelInfo, RowRecord, SequenceRecord, StepRecord, Trace
from specviz.views.palette import KINDS

K = 2
PROMPT = [11, 12, 13]  # three prompt tokens: n = 3 before the first step


def make_row(**fields: Any) -> RowRecord:
    """A correct row of sequence 0 at its first step (cache 3 slots: 1 pad + 2 prompt tokens)."""
    row = {
        "row": 0,
        "seq_id": 0,
        "committed_before": 3,
        "left_pad": 1,
        "left_pad_after": None,
        "pending_token": 13,
        "draft_tokens": [21, 22],
        "target_tokens": [21, 30, 31],
        "accepted": 1,
        "bonus": 30,
        "emitted": [21, 30],
        "write_seq": 0,
        "position_ids": [2, 3, 4],
        "mask_rle": [[0, 1], [1, 2 + K + 1]],
        "kv_len": 2,
        "kv_len_expected": 2,
        "finished": True,  # the sequence ends here, so the checker sees a complete run
        "finish_reason": "length",
    }
    return RowRecord(**{**row, **fields})


def make_trace(*rows: RowRecord, cache_len: int = 3) -> Trace:
    info = ModelInfo("hand", "float32", "cpu", 100, 1)
    header = Header(1, "eqspec", None, info, info, K, 1, 2, [], 0, 0, "2025-01-01T00:00:00+00:00", {})
    steps = [StepRecord(i, 0, cache_len, K + 1, None, 0.0, 0.0, 0.0, 0.0, [row]) for i, row in enumerate(rows)]
    sequence = SequenceRecord(0, "p", PROMPT, [21, 30], "", None, None, "length")
    return Trace(header, steps, [sequence])


def violation(field: str, row: int = 0, step_index: int = 0) -> Violation:
    return Violation(step_index, step_index, row, 0, 1, "test", field, None, None, f"bad {field}")


# ----------------------------------------------------------------------------- hand-built steps


def test_correct_row_holds_padding_prompt_query_and_bonus() -> None:
    slots = step_slots(make_trace(make_row()), 0)
    row = slots.row(0)
    assert row.kinds() == ["padding", "prompt", "prompt", "pending", "accepted", "rejected", "bonus"]
    assert [s.token for s in row.slots] == [None, 11, 12, 13, 21, 22, 30]
    # The bonus follows the accepted prefix: index n + a, where the rejected draft stood.
    assert [s.expected_position for s in row.slots[1:]] == [0, 1, 2, 3, 4, 4]
    # Prefilled prompt tokens have no recorded position: the expected one stands in.
    assert [s.position_recorded for s in row.slots[1:3]] == [False, False]
    assert not row.flagged and slots.first_violation is None
    assert row.expected == expected_row(slots.step, row.record)
    assert (row.expected.left_pad, row.expected.kv_len, row.expected.position_ids) == (1, 2, [2, 3, 4])


def test_wrong_query_position_is_flagged_on_its_slot() -> None:
    row = step_slots(make_trace(make_row(position_ids=[2, 2, 4])), 0).row(0)
    flagged = [s.col for s in row.slots if s.flagged]
    assert flagged == [4] and "fed position 2, expected 3" in row.slots[4].reasons


def test_masked_slot_after_the_first_real_one_is_a_hole() -> None:
    row = step_slots(make_trace(make_row(mask_rle=[[1, 1], [0, 1], [1, 1 + K + 1]], left_pad=0)), 0).row(0)
    assert row.kinds()[:3] == ["prompt", "hole", "prompt"]
    assert row.slots[1].flagged


def test_surplus_attended_slots_are_extra_next_to_the_query() -> None:
    # Four cache slots, all attended, for two committed tokens: two extra, drawn right of the tokens.
    row = step_slots(make_trace(make_row(mask_rle=[[1, 4 + K + 1]], left_pad=0, kv_len=4), cache_len=4), 0).row(0)
    assert row.kinds()[:4] == ["prompt", "prompt", "extra", "extra"]
    assert all(s.flagged for s in row.slots[2:4])


def test_missing_kv_is_a_row_note() -> None:
    row = step_slots(make_trace(make_row(mask_rle=[[0, 2], [1, 1 + K + 1]], kv_len=1)), 0).row(0)
    assert row.kinds()[:3] == ["padding", "padding", "prompt"]
    assert row.slots[2].token_index == 1  # the one attended slot holds the newer token
    assert row.notes == ["the cache lacks the KV of 1 committed token(s)"]


def test_cache_positions_come_from_the_step_that_fed_the_token() -> None:
    first = make_row(position_ids=[2, 9, 4])  # token 3 (the accepted draft) fed at 9, not 3
    second = make_row(
        committed_before=5, left_pad=0, pending_token=30, mask_rle=[[1, 4 + K + 1]], kv_len=4, position_ids=[4, 5, 6]
    )
    trace = make_trace(first, second, cache_len=4)
    history = fed_history(trace)
    assert fed_position_before(history, 0, 3, 1) == 9 and fed_position_before(history, 0, 3, 0) is None
    cached = step_slots(trace, 1, history=history).row(0).slots[3]
    assert (cached.token_index, cached.fed_position, cached.kind) == (3, 9, "committed")
    assert cached.reasons == ["its KV was computed at position 9, expected 3"]


def test_violation_anchors_on_its_evidence_and_marks_the_first() -> None:
    trace = make_trace(make_row(position_ids=[2, 2, 4]))
    report = check_trace(trace)
    slots = step_slots(trace, 0, report)
    assert report.first_violation is not None and slots.first_violation == (0, 4)
    # A violation with no slot of its own (the write target) sits on the bonus slot.
    assert anchor_col(slots.row(0).slots, violation("write_seq"), slots.step) == slots.width - 1


def test_row_lookup_and_mask_expansion() -> None:
    slots = step_slots(make_trace(make_row(row=3)), 0)
    assert isinstance(slots, StepSlots) and slots.row_position(3) == 0
    assert slots.find_row(0) is None and slots.row(3).row == 3
    with pytest.raises(KeyError):
        slots.row(0)
    with pytest.raises(IndexError):
        step_slots(make_trace(make_row()), 1)
    assert expand_mask([[0, 1], [1, 2]], 5) == [0, 1, 1, None, None]
    assert expand_mask([[1, 4]], 2) == [1, 1]


def test_palette_draws_every_kind_analysis_names() -> None:
    assert KINDS == SLOT_KINDS


# ----------------------------------------------------------------------------- tiny-model runs

# Mixed prompt lengths make the batch ragged from the first step.


def every_step(trace: Trace) -> list[StepSlots]:
    report = check_trace(trace)
    history = fed_history(trace)
    return [step_slots(trace, si, report, history) for si in range(len(trace.steps))]


@pytest.mark.parametrize("name", ["eqspec", "exspec"])
def test_correct_run_slots_match_accepted_counts(traces: dict[str, Trace], name: str) -> None:
    trace = traces[name]
    seqs = {s.seq_id: s for s in trace.sequences}
    for step in every_step(trace):
        for row in step.rows:
            rec, cache = row.record, step.cache_len
            kinds = row.kinds()
            # Query: the pending token, then a accepted drafts, then k - a rejected ones.
            rejected = RAGGED_K - rec.accepted
            assert (
                kinds[cache : cache + step.query_len]
                == ["pending"] + ["accepted"] * rec.accepted + ["rejected"] * rejected
            )
            assert kinds[-1] == ("bonus" if rec.bonus is not None else "empty")
            # Cache: left padding, then exactly the n - 1 committed tokens in order.
            n, prompt_len = rec.committed_before, len(seqs[rec.seq_id].prompt_ids)
            assert kinds[:cache] == ["padding"] * rec.left_pad + [
                "prompt" if i < prompt_len else "committed" for i in range(n - 1)
            ]
            tokens = seqs[rec.seq_id].prompt_ids + seqs[rec.seq_id].output_ids
            assert [s.token for s in row.slots[rec.left_pad : cache]] == tokens[: n - 1]
            assert [s.fed_position for s in row.slots[cache:-1]] == list(range(n - 1, n - 1 + step.query_len))
            assert not row.flagged, [s.reasons for s in row.slots if s.flagged]


def test_first_violation_slot_is_flagged_in_every_faulty_run(traces: dict[str, Trace]) -> None:
    expected_kind = {
        "column-positions": {"pending", "accepted", "rejected"},  # a query slot at a wrong position
        "stale-kv": {"extra"},  # an attended slot beyond the committed tokens
        "masked-holes": {"hole"},  # a masked slot inside the row
        "extra-accept": {"accepted"},  # a draft accepted although the target disagreed
    }
    for fault, kinds in expected_kind.items():
        trace = traces[fault]
        report = check_trace(trace)
        history = fed_history(trace)
        first = report.first_violation
        assert first is not None, fault
        slots = step_slots(trace, first.step_index, report, history)
        assert slots.first_violation is not None, fault
        row, col = slots.first_violation
        assert row == first.row
        slot = slots.row(row).slots[col]
        assert slot.flagged and slot.kind in kinds, (fault, slot)
        # No earlier step has a flagged slot: the first flagged slot is where desync begins.
        for si in range(first.step_index):
            assert not any(r.flagged for r in step_slots(trace, si, report, history).rows), fault


def test_column_positions_flag_exactly_the_wrong_query_positions(traces: dict[str, Trace]) -> None:
    for step in every_step(traces["column-positions"]):
        for row in step.rows:
            n = row.committed_before
            fed = row.record.position_ids
            for j, slot in enumerate(row.slots[step.cache_len : -1]):
                assert slot.expected_position == n - 1 + j
                wrong = fed[j] != n - 1 + j
                assert any("fed position" in r for r in slot.reasons) == wrong


def test_masked_holes_are_where_the_mask_has_holes(traces: dict[str, Trace]) -> None:
    seen = 0
    for step in every_step(traces["masked-holes"]):
        for row in step.rows:
            mask = expand_mask(row.record.mask_rle, step.cache_len + step.query_len)[: step.cache_len]
            first_real = mask.index(1) if 1 in mask else step.cache_len
            holes = [j for j in range(first_real, step.cache_len) if mask[j] == 0]
            assert [s.col for s in row.slots if s.kind == "hole"] == holes
            seen += len(holes)
    assert seen > 0


def test_stale_kv_extra_slots_count_matches_kv_error(traces: dict[str, Trace]) -> None:
    for step in every_step(traces["stale-kv"]):
        for row in step.rows:
            surplus = max(0, row.record.kv_len - (row.committed_before - 1))
            assert row.kinds().count("extra") == surplus


def test_attended_padding_is_drawn_on_the_left_where_it_is() -> None:
    # Two pads then two prompt tokens, the mask attending all four (as when no mask is passed): the
    # two extra slots are the pads, on the left; the tokens keep their own slots, next to the query.
    row = step_slots(make_trace(make_row(mask_rle=[[1, 4 + K + 1]], left_pad=2, kv_len=4), cache_len=4), 0).row(0)
    assert row.kinds()[:4] == ["extra", "extra", "prompt", "prompt"]
    assert [s.token for s in row.slots[:4]] == [None, None, 11, 12]
    assert all("padding attended" in s.reasons[0] for s in row.slots[:2])
    assert not row.slots[2].flagged and not row.slots[3].flagged
