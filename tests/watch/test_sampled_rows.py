"""Sampled engines: what a row may emit still has a shape (its accepted drafts, then at most one
free token), and tokens written to another row's sequence are read as that row's write-back
(`write_seq != seq_id`), at the step where it happened, as a greedy engine's are. The engine is
the zoo's rejection sampler; the oracle for "clean" is the checker's own invariants (no token
equality can be asked of a sample)."""

from __future__ import annotations

import pytest
from tiny import make_pair
from zoo import sampled

import specviz
from specviz.analysis.check import check_trace
from specviz.trace.invariants import Invariant
from specviz.trace.io import open_trace, save_trace
from specviz.trace.synthetic import synthetic_trace

PROMPTS = [[5, 6, 7, 8, 9, 10], [11, 12, 13], [14, 15, 16, 17]]
MAX_NEW = 12
T = 0.05  # the tiny models' logits are small: a lower T makes rejections (and residual samples) happen


@pytest.fixture(scope="module")
def pair():
    return make_pair("llama")


def watched(pair, **options):
    with specviz.watch(pair.target, pair.draft, prompts=PROMPTS, temperature=T) as w:
        outs, events = sampled.generate(pair.target, pair.draft, PROMPTS, MAX_NEW, w=w, temperature=T, **options)
    return w.trace, outs, events


@pytest.mark.parametrize("ragged", [False, True])
def test_correct_sampled_run_is_clean(pair, ragged: bool) -> None:
    trace, outs, _ = watched(pair, ragged=ragged)
    report = check_trace(trace)
    assert report.verdict == "clean" and not report.violation_count, report.violations[:3]
    assert [s.output_ids for s in trace.sequences] == outs
    rows = [r for s in trace.steps for r in s.rows]
    assert all(r.write_seq == r.seq_id and len(r.emitted) <= r.accepted + 1 for r in rows)
    assert len({len(r.draft_tokens) for r in rows}) > 1 if ragged else True


@pytest.mark.parametrize("ragged", [False, True])
def test_wrong_row_write_is_found_at_its_step(pair, ragged: bool) -> None:
    """Row 0's tokens go to sequence 1 at step 2: found there, on sequence 0, as accounting, and
    the step's rows say which row wrote where (row 0 -> sequence 1, row 1 its own)."""
    trace, _, events = watched(pair, bug="wrongrow", ragged=ragged)
    report = check_trace(trace)
    v = report.first_violation
    assert events == [(2, 0)]
    assert v is not None and (v.step, v.seq_id, v.invariant) == (2, 0, Invariant.ACCOUNTING), report.violations[:3]
    writes = {(r.seq_id, r.write_seq) for r in trace.steps[2].rows}
    assert (0, 1) in writes and (1, 1) in writes


def _row_violations(pair, emitted_of, tmp_path):
    """A correct sampled trace with step 1, row 0's emitted tokens replaced: its violations there,
    the same read row by row and from Parquet (the columnar pass must not apply the step as clean)."""
    trace, _, _ = watched(pair)
    row = trace.steps[1].rows[0]
    row.emitted = emitted_of(row)
    found = [
        [(v.step, v.seq_id, v.field) for v in check_trace(t).violations if v.step == 1 and v.seq_id == row.seq_id]
        for t in (trace, open_trace(save_trace(trace, tmp_path / "t.parquet")))
    ]
    assert found[0] == found[1]
    return found[0]


def test_sampled_row_may_not_emit_more_than_its_drafts_and_one(pair, tmp_path) -> None:
    found = _row_violations(pair, lambda r: r.draft_tokens[: r.accepted] + [3, 4], tmp_path)
    assert (1, 0, "emitted") in found, found


def test_sampled_row_emits_its_accepted_drafts_first(pair, tmp_path) -> None:
    def swapped(r):
        assert r.accepted >= 1, "the fixture's step 1 row 0 accepts a draft"
        return [r.draft_tokens[0] + 1, *r.emitted[1:]]

    found = _row_violations(pair, swapped, tmp_path)
    assert (1, 0, "emitted") in found, found


def test_a_missing_ending_is_shown_where_the_sequence_was_last_held() -> None:
    """Sequence 0's row at step 1 gives nothing yet says it ended, and the sequence records no
    ending: the missing ending is shown
    at step 1 (where it was last held), not at step 0 (its last write), so it cannot come before a
    fault of step 1 (a wrong-row write ending another sequence) as the run's first violation."""
    trace = synthetic_trace(2, 2, 2, 5)
    row = trace.steps[1].rows[0]
    row.emitted, row.bonus, row.finished, row.finish_reason = [], None, True, "length"
    trace.sequences[0].output_ids = trace.sequences[0].output_ids[:3]
    trace.sequences[0].finish_reason = None
    report = check_trace(trace)
    missing = [v for v in report.violations if "has no finish_reason" in v.message]
    assert [(v.step_index, v.seq_id) for v in missing] == [(1, 0)], report.violations
