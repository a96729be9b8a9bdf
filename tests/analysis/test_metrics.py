"""Acceptance and exactness metrics on a hand-built trace with answers worked out by hand (issue 26).

The trace below is small enough to add up on paper; every expected number is derived in a
comment next to it, from the definitions in `specviz/analysis/metrics.py`'s docstring (which
follow vLLM and llama.cpp), never by calling the code under test.
"""

from __future__ import annotations

import pytest

from specviz.analysis import metrics

# The code under test: every name it is reached by, in one place (analysis/ may be restructured).
from specviz.analysis.acceptance import Acceptance
from specviz.analysis.exactness import exact_match, first_divergence, sequence_divergence
from specviz.analysis.metrics import (
    acceptance,
    phase_times,
    summary,
    tokens_emitted,
    tokens_left_on_table,
    tokens_per_second,
)
from specviz.trace.columnar import ParquetTraceWriter
from specviz.trace.io import open_trace
from specviz.trace.schema import Header, ModelInfo, RowRecord, SequenceRecord, StepRecord, Trace

K = 3  # draft_k
MAX_NEW = 6
EOS = 2


def row(i, seq_id, committed_before, draft, target, accepted, emitted) -> RowRecord:
    return RowRecord(
        row=i,
        seq_id=seq_id,
        committed_before=committed_before,
        left_pad=0,
        left_pad_after=0,
        pending_token=0,
        draft_tokens=draft,
        target_tokens=target,
        accepted=accepted,
        bonus=None,
        emitted=emitted,
        write_seq=seq_id,
        position_ids=[],
        mask_rle=[],
        kv_len=0,
        kv_len_expected=0,
    )


def step(n, rows, draft_ms, verify_ms, align_ms, total_ms) -> StepRecord:
    return StepRecord(n, 0, 8, K + 1, None, draft_ms, verify_ms, align_ms, total_ms, rows)


def seq(seq_id, prompt_ids, output_ids, reference_ids, finish_reason) -> SequenceRecord:
    return SequenceRecord(seq_id, "", prompt_ids, output_ids, "", reference_ids, None, finish_reason)


def header(draft_k=K, complete=True, decode_seconds=4.0) -> Header:
    model = ModelInfo("tiny", "float32", "cpu", 32, 1000)
    return Header(
        schema_version=2,
        method="eqspec",
        fault=None,
        target=model,
        draft=model,
        draft_k=draft_k,
        batch_size=3,
        max_new_tokens=MAX_NEW,
        eos_token_ids=[EOS],
        pad_token_id=0,
        seed=0,
        created_at="",
        library_versions={},
        options={"group_share": 0.5},
        complete=complete,
        decode_seconds=decode_seconds,
    )


# Prompt lengths: seq 0: 2, seq 1: 1, seq 2: 3. Budget of a row = MAX_NEW - (committed_before - prompt_len).
STEPS = [
    step(
        0,
        [
            # acc 3; allowed [5,6,7] + bonus 8, budget 6 - (3 - 2) = 5, no EOS: cut 4; emitted 4: left 0
            row(0, 0, 3, [5, 6, 7], [5, 6, 7, 8], 3, [5, 6, 7, 8]),
            # acc 0; allowed [5], budget 5; emitted nothing (bonus dropped): left 1
            row(1, 1, 2, [9, 9, 9], [5, 6, 4, 3], 0, []),
            # acc 1; allowed [5, 2], EOS (2) at index 1: cut 2; emitted [5]: left 1
            row(2, 2, 4, [5, 3, 7], [5, 2, 3, 1], 1, [5]),
        ],
        draft_ms=1.0,
        verify_ms=2.0,
        align_ms=0.5,
        total_ms=5.0,
    ),
    step(
        1,
        [
            # acc 2; allowed [6, 7, 1] but budget 6 - (7 - 2) = 1: [6]; emitted [6]: left 0
            row(0, 0, 7, [6, 7, 8], [6, 7, 1, 0], 2, [6]),
            # acc 3; allowed [4, 4, 4, 4]; emitted [4, 4, 9] is not a prefix of it: not counted
            row(1, 1, 3, [4, 4, 4], [4, 4, 4, 4], 3, [4, 4, 9]),
        ],
        draft_ms=1.0,
        verify_ms=1.0,
        align_ms=0.0,
        total_ms=2.5,
    ),
    step(
        2,
        # acc 1 but only 1 target token recorded (len(target) <= accepted): left out
        [row(0, 1, 6, [1, 1, 1], [1], 1, [1])],
        draft_ms=0.5,
        verify_ms=1.0,
        align_ms=0.25,
        total_ms=2.0,
    ),
]

SEQUENCES = [
    seq(0, [10, 11], [5, 6, 7, 8, 6], [5, 6, 7, 8, 6], "length"),  # equal: no divergence
    seq(1, [12], [5, 4, 4, 9], [5, 4, 4, 4], "length"),  # differs at index 3
    seq(2, [13, 14, 15], [5, 2], [5, 2, 7], "eos"),  # finished early: diverges at 2
    seq(3, [16], [8], None, None),  # no reference: not counted by exact match
]


def trace(**kw) -> Trace:
    return Trace(header(**kw), STEPS, SEQUENCES)


def test_acceptance_totals_by_hand() -> None:
    total, per_seq = acceptance(trace())
    # Rows (verify steps): accepted 3, 0, 1 | 2, 3 | 1  -> 6 verify steps, 18 drafted, 10 accepted.
    assert (total.verify_steps, total.drafted, total.accepted) == (6, 18, 10)
    assert total.rate == pytest.approx(10 / 18)  # 0.5556
    assert total.mean_length == pytest.approx(1 + 10 / 6)  # 2.6667 tokens per verify step
    assert total.histogram == [1, 2, 1, 2]  # exactly 0, 1, 2, 3 accepted
    # At least 1 accepted: 5 of 6; at least 2: 3 of 6; at least 3: 2 of 6.
    assert total.per_position == pytest.approx([5 / 6, 3 / 6, 2 / 6])
    # Given the previous depth: 5 of 6 reach depth 1; of those 5, 3 reach 2; of those 3, 2 reach 3.
    assert total.per_position_given_previous == pytest.approx([5 / 6, 3 / 5, 2 / 3])
    d = total.as_dict()
    assert d["rate"] == pytest.approx(10 / 18) and d["mean_length"] == pytest.approx(8 / 3)
    assert d["per_position"] == pytest.approx([5 / 6, 0.5, 1 / 3]) and d["histogram"] == [1, 2, 1, 2]
    assert (d["verify_steps"], d["drafted"], d["accepted"]) == (6, 18, 10)


def test_acceptance_per_sequence_by_hand() -> None:
    _, per_seq = acceptance(trace())
    assert sorted(per_seq) == [0, 1, 2]
    s0, s1, s2 = per_seq[0], per_seq[1], per_seq[2]
    # seq 0: accepted 3, 2 over 2 steps: rate 5/6, mean length 1 + 5/2 = 3.5.
    assert (s0.verify_steps, s0.drafted, s0.accepted, s0.histogram) == (2, 6, 5, [0, 0, 1, 1])
    assert (s0.rate, s0.mean_length) == (pytest.approx(5 / 6), pytest.approx(3.5))
    assert s0.per_position == pytest.approx([1.0, 1.0, 0.5])
    # seq 1: accepted 0, 3, 1: rate 4/9, mean 1 + 4/3, at least 1: 2/3, 2: 1/3, 3: 1/3.
    assert (s1.verify_steps, s1.drafted, s1.accepted, s1.histogram) == (3, 9, 4, [1, 1, 0, 1])
    assert (s1.rate, s1.mean_length) == (pytest.approx(4 / 9), pytest.approx(7 / 3))
    assert s1.per_position == pytest.approx([2 / 3, 1 / 3, 1 / 3])
    # seq 2: one step, accepted 1.
    assert (s2.verify_steps, s2.accepted, s2.histogram, s2.per_position) == (1, 1, [0, 1, 0, 0], [1.0, 0.0, 0.0])


def test_acceptance_edges() -> None:
    total, per_seq = acceptance(trace(draft_k=0))  # plain decoding: no drafts, nothing to accept
    assert (total.verify_steps, total.rate, total.mean_length, total.per_position, per_seq) == (0, None, None, [], {})
    a = Acceptance()
    assert (a.rate, a.mean_length, a.per_position, a.histogram) == (None, None, [], [])
    a.add(5, 2)  # more accepted than drafted (a faulty engine): histogram caps at k, totals do not
    a.add(0, 2)
    assert a.histogram == [1, 0, 1] and a.accepted == 5 and a.drafted == 4 and a.verify_steps == 2
    a.add(1, 4)  # a larger k widens the histogram
    assert a.histogram == [1, 1, 1, 0, 0]
    c = Acceptance()
    c.add(2, 2)
    c.add(3, 3)  # k one larger than before: one more bucket, for exactly 3 accepted
    assert c.histogram == [0, 0, 1, 1]
    assert a.per_position == pytest.approx([2 / 3, 1 / 3, 0.0, 0.0])
    # Built without a verify step (histogram of zeros, as a reader could): no rates, no division.
    assert Acceptance(histogram=[0, 0, 0]).per_position == []
    assert Acceptance(histogram=[0, 0, 0]).per_position_given_previous == []
    never = Acceptance()
    never.add(0, 3)  # no verify reached depth 1: depths 2 and 3 have nothing to be conditioned on
    assert never.per_position_given_previous == [0.0, None, None]
    b = Acceptance()
    b.add(0, 1)
    assert (b.rate, b.mean_length, b.per_position) == (0.0, 1.0, [0.0])


def test_acceptance_of_ragged_drafts_by_hand() -> None:
    # k = 3. Row 0 drafts 1 and accepts it; row 1 drafts nothing (not a verify of drafts); row 2
    # drafts 4 > k (counted as k = 3) and accepts 2. Verify steps 2, drafted 1 + 3, accepted 1 + 2.
    ragged = step(
        0,
        [
            row(0, 0, 3, [5], [5, 6], 1, [5, 6]),
            row(1, 1, 2, [], [7], 0, [7]),
            row(2, 2, 4, [5, 3, 7, 9], [5, 3, 8, 1, 1], 2, [5, 3, 8]),
        ],
        0,
        0,
        0,
        0,
    )
    total, per_seq = acceptance(Trace(header(), [ragged], SEQUENCES))
    assert (total.verify_steps, total.drafted, total.accepted, total.histogram) == (2, 4, 3, [0, 1, 1, 0])
    assert total.rate == pytest.approx(3 / 4) and sorted(per_seq) == [0, 2]
    # k = 1: one draft, accepted: one verify step.
    one = step(0, [row(0, 0, 3, [5], [5, 6], 1, [5, 6])], 0, 0, 0, 0)
    total, _ = acceptance(Trace(header(draft_k=1), [one], SEQUENCES))
    assert (total.verify_steps, total.drafted, total.accepted, total.histogram) == (1, 1, 1, [0, 1])


def test_first_divergence_by_hand() -> None:
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([7], [8]) == 0
    assert first_divergence([1, 2], [1, 2, 3]) == 2  # stopped early
    assert first_divergence([1, 2], [1, 2, 3], finished=False) is None  # interrupted: fine so far
    assert first_divergence([1, 2, 3, 4], [1, 2, 3]) == 3  # ran past the reference
    assert first_divergence([1, 2, 3, 4], [1, 2, 3], finished=False) == 3  # even when unfinished
    assert first_divergence([1, 9], [1, 2, 3], finished=False) == 1
    assert first_divergence([1, 2], None) is None
    assert first_divergence([], []) is None
    assert first_divergence([], [4]) == 0


def test_exact_match_and_divergence_by_hand() -> None:
    t = trace()
    # Sequences with a reference: 0 (equal), 1 (diverges at 3), 2 (stops at 2): 1 of 3 exact.
    assert exact_match(t) == pytest.approx(1 / 3)
    assert [sequence_divergence(s) for s in SEQUENCES] == [None, 3, 2, None]
    unfinished = seq(4, [1], [5, 2], [5, 2, 7], None)  # no finish reason
    assert sequence_divergence(unfinished) is None  # interrupted run: agrees so far
    assert sequence_divergence(unfinished, run_complete=True) == 2  # complete run: stopped early
    assert exact_match(Trace(header(complete=False), [], [unfinished])) == 1.0
    assert exact_match(Trace(header(complete=True), [], [unfinished])) == 0.0
    assert exact_match(Trace(header(), [], [SEQUENCES[3]])) is None  # no reference anywhere


def test_tokens_and_throughput_by_hand() -> None:
    t = trace()
    assert tokens_emitted(t) == 5 + 4 + 2 + 1
    assert tokens_per_second(t) == pytest.approx(12 / 4.0)
    assert tokens_per_second(trace(decode_seconds=None)) is None
    assert tokens_per_second(trace(decode_seconds=0.0)) is None


def test_tokens_left_on_table_by_hand() -> None:
    # Per row (comments at STEPS): 0 + 1 + 1 | 0 + 0 | skipped = 2 tokens over 3 steps.
    assert tokens_left_on_table(trace()) == pytest.approx(2 / 3)
    assert tokens_left_on_table(Trace(header(), [], SEQUENCES)) is None
    # A row past its budget (committed 10 with prompt 2 and max 6: budget -2) leaves nothing.
    over = step(0, [row(0, 0, 10, [5], [5, 6], 1, [])], 0, 0, 0, 0)
    assert tokens_left_on_table(Trace(header(), [over], SEQUENCES)) == 0.0
    # EOS as the first allowed token: cut 1, emitted nothing: 1 left.
    eos_first = step(0, [row(0, 0, 3, [EOS, 5], [EOS, 5, 6], 1, [])], 0, 0, 0, 0)
    assert tokens_left_on_table(Trace(header(), [eos_first], SEQUENCES)) == 1.0
    # A row of a sequence the trace does not list (an interrupted run keeps only what finished):
    # its prompt length is unknown, so every committed token counts as output, the smallest budget.
    # Committed 4: budget 6 - 4 = 2, allowed [5, 6, 7, 8] cut to [5, 6]; emitted [5]: 1 left.
    unlisted = step(0, [row(0, 9, 4, [5, 6, 7], [5, 6, 7, 8], 3, [5])], 0, 0, 0, 0)
    assert tokens_left_on_table(Trace(header(complete=False), [unlisted], SEQUENCES)) == 1.0


def own_budgets(budgets) -> Trace:
    """The hand-built trace with `header.options.sequence_budgets` (a watched engine's per-request
    max_new_tokens; the header's max_new_tokens stays the largest)."""
    t = trace()
    t.header.options["sequence_budgets"] = budgets
    return t


def test_tokens_left_on_table_use_each_sequences_own_budget() -> None:
    # Seq 1 (prompt 1) may write 1 token: at step 0 (committed 2) it has written 1, its budget is
    # 1 - 1 = 0, so its dropped bonus [5] was not allowed: 0 left, not 1. Total 0 + 0 + 1 | 0 + 0 = 1.
    assert tokens_left_on_table(own_budgets({"1": 1})) == pytest.approx(1 / 3)
    # Seq 2 (prompt 3, committed 4: 1 written) with 1 more token: allowed [5, 2] cut to [5], emitted
    # [5]: 0 left; with seq 1's as well, nothing is left anywhere.
    assert tokens_left_on_table(own_budgets({"1": 1, "2": 2})) == 0.0
    # A budget equal to the run's changes nothing; so does one for a sequence the trace lacks.
    assert tokens_left_on_table(own_budgets({"1": MAX_NEW, "7": 0})) == pytest.approx(2 / 3)


@pytest.mark.parametrize("bad", ["x", [1], {"1": "1"}, {"1": -1}, {"1": True}, {"1": 1.0}, {"1": None}])
def test_a_budget_that_is_not_a_count_is_the_runs(bad) -> None:
    # An uploaded file's unreadable budget is not one: the sequence keeps max_new_tokens, no traceback.
    assert tokens_left_on_table(own_budgets(bad)) == pytest.approx(2 / 3)


@pytest.mark.parametrize("budgets", [{}, {"1": 1}, {"1": 1, "2": 2}, {"0": 0, "1": 0, "2": 0}])
def test_parquet_left_on_table_equals_json(tmp_path, monkeypatch, budgets) -> None:
    t = own_budgets(budgets)
    writer = ParquetTraceWriter(tmp_path / "t.parquet", row_group_rows=2)
    for s in t.steps:
        writer.add_step(s)
    columnar = open_trace(writer.close(t.header, t.sequences))
    expected = tokens_left_on_table(t)

    def row_by_row(*_):
        raise AssertionError("the Parquet walk fell back to rows: its arrays were not tested")

    monkeypatch.setattr(metrics, "add_step", row_by_row)
    assert tokens_left_on_table(columnar) == expected


def test_phase_times_by_hand() -> None:
    # draft 1 + 1 + 0.5, verify 2 + 1 + 1, align 0.5 + 0 + 0.25, total 5 + 2.5 + 2 = 9.5:
    # bookkeeping = 9.5 - 2.5 - 4 - 0.75 = 2.25.
    times = phase_times(trace())
    assert times == pytest.approx(
        {"draft_ms": 2.5, "verify_ms": 4.0, "align_ms": 0.75, "bookkeeping_ms": 2.25, "total_ms": 9.5}
    )
    tight = step(0, [], draft_ms=2.0, verify_ms=2.0, align_ms=1.0, total_ms=4.0)  # phases exceed the total
    assert phase_times(Trace(header(), [tight], []))["bookkeeping_ms"] == 0.0


def test_summary_by_hand() -> None:
    s = summary(trace())
    assert s["method"] == "eqspec" and s["fault"] is None and s["draft_k"] == K
    assert s["num_prompts"] == 4 and s["batch_size"] == 3 and s["max_new_tokens"] == MAX_NEW
    assert s["complete"] is True and s["steps"] == 3
    assert s["exact_match"] == pytest.approx(1 / 3)
    assert s["acceptance_rate"] == pytest.approx(10 / 18)
    assert s["mean_acceptance_length"] == pytest.approx(8 / 3)
    assert s["per_position_acceptance"] == pytest.approx([5 / 6, 0.5, 1 / 3])
    assert s["per_position_acceptance_given_previous"] == pytest.approx([5 / 6, 3 / 5, 2 / 3])
    assert s["tokens_emitted"] == 12 and s["decode_seconds"] == 4.0
    assert s["tokens_per_second"] == pytest.approx(3.0)
    assert s["tokens_left_on_table_per_step"] == pytest.approx(2 / 3)
    assert s["exspec_group_share"] == 0.5
    assert s["first_divergence"] == [None, 3, 2, None]
    assert s["bookkeeping_ms"] == pytest.approx(2.25) and s["total_ms"] == pytest.approx(9.5)
    # An interrupted run: sequence 3 has no reference; none of the others change (all finished).
    assert summary(trace(complete=False))["first_divergence"] == [None, 3, 2, None]
