"""The faults of state carried between steps and draft calls (docs/faults.md, scheduling table), on
the tiny pair, greedy and sampled: each is caught at exactly the (step, row) where it first fed
something wrong (from the fault's own log, which `check` never reads), with the invariant it
documents first; the outputs-exact ones keep every output on the batch-1 oracle; the correct
engine under the same settings checks clean and exact; the batch-dependent ones never fire at
batch 1."""

from __future__ import annotations

import functools

import pytest
from exactness import PROMPTS, pair_for

from specviz.analysis.check import check_trace
from specviz.engine.config import RunConfig
from specviz.engine.faults import FAULTS
from specviz.engine.run import run
from specviz.trace.invariants import Invariant

SCHEDULING = ("stale-pending", "async-ahead", "mid-batch-pad", "stale-draft-map")
# (step, row, invariant) of check's first violation, which the fault's first event must match.
FIRST = {
    "stale-pending": Invariant.ACCOUNTING,  # the stale pending token, at the step it is fed
    "async-ahead": Invariant.POSITIONS,  # the next step of a row that accepted less than k
    "mid-batch-pad": Invariant.POSITIONS,  # step 0, the first row from the middle on
    "stale-draft-map": Invariant.DRAFT_INPUT,  # step 0, the first row that read another's token
}
BATCH_ONLY = ("mid-batch-pad", "stale-draft-map")
TEMPERATURES = (0.0, 0.9)


@functools.cache
def record(fault: str | None, temperature: float, batch: int = 6, method: str = "eqspec"):
    """Decode the mixed-length prompts with the oracle (greedy, or coupled with the same keys)."""
    config = RunConfig(
        method=method,
        fault=fault,
        batch_size=batch,
        draft_k=3,
        max_new_tokens=12,
        kv_check_every=1,
        temperature=temperature,
        reference=True,
    )
    return run(pair_for("llama"), PROMPTS, config)


def first_event(trace) -> tuple[int, int, int]:
    """The fault's first deviation in (step, row) order (a step's calls may log later rows first)."""
    events = trace.header.fault_events
    assert events, "the fault never fired"
    first = min(events, key=lambda e: (e["step"], e["row"]))
    return first["step"], first["row"], first["seq_id"]


def test_the_scheduling_faults_are_registered() -> None:
    assert set(SCHEDULING) <= set(FAULTS)
    assert {FAULTS[f].invariants[0] for f in SCHEDULING} == set(FIRST.values())


@pytest.mark.parametrize("temperature", TEMPERATURES)
@pytest.mark.parametrize("fault", SCHEDULING)
def test_fault_is_caught_at_its_first_step_and_row(fault: str, temperature: float) -> None:
    trace = record(fault, temperature)
    report = check_trace(trace)
    assert report.verdict == "desync"
    first = report.first_violation
    assert (first.step, first.row, first.seq_id) == first_event(trace)
    assert first.invariant == FIRST[fault], first.message
    if FAULTS[fault].outputs_exact:  # caught by the invariant, not by the outputs
        assert report.exact_match == 1.0
        assert {v.invariant for v in report.violations} == {FIRST[fault]}


@pytest.mark.parametrize("temperature", TEMPERATURES)
def test_the_correct_engine_under_the_same_settings_is_clean(temperature: float) -> None:
    report = check_trace(record(None, temperature))
    assert (report.verdict, report.violation_count, report.exact_match) == ("clean", 0, 1.0)


@pytest.mark.parametrize("fault", BATCH_ONLY)
def test_batch_faults_never_fire_at_batch_1(fault: str) -> None:
    trace = record(fault, 0.0, batch=1)
    assert trace.header.fault_events == []
    assert check_trace(trace).verdict == "clean"


def test_stale_draft_map_is_exact_at_draft_call_0_and_lowers_later_depths() -> None:
    """The map is wrong only for calls 1..k-1: call 0 feeds every row its own pending token."""
    trace = record("stale-draft-map", 0.0)
    rows = [row for step in trace.steps for row in step.rows]
    assert all(row.draft_input_tokens[0] == row.pending_token for row in rows)
    assert any(row.draft_input_tokens[1] != row.draft_tokens[0] for row in rows)


def test_stale_pending_feeds_the_token_fed_the_step_before() -> None:
    trace = record("stale-pending", 0.0)
    step, row, seq_id = first_event(trace)
    fed = trace.steps[step].rows[row].pending_token
    before = next(r for r in trace.steps[step - 1].rows if r.seq_id == seq_id)
    assert fed == before.pending_token


@pytest.mark.parametrize("fault", ["stale-draft-map", None])
def test_parquet_columns_judge_draft_inputs_as_the_row_walk_does(fault: str | None, tmp_path) -> None:
    """A Parquet trace's row groups are checked a column at a time up to their first flagged step:
    the draft-input check there must flag the rows the row walk flags (same report either way)."""
    from specviz.trace.io import open_trace, save_trace

    trace = record(fault, 0.0)
    walked = check_trace(trace)
    columnar = check_trace(open_trace(save_trace(trace, tmp_path / "t.parquet")))
    assert columnar.to_dict() == walked.to_dict()


def test_a_schema_3_trace_still_loads_and_checks_clean() -> None:
    """Bundled traces were written before schema 4: they load, lack the new fields, and a correct
    run checks clean, with the draft-input check reported as skipped, not failed."""
    from pathlib import Path

    from specviz.trace.io import load_trace

    trace = load_trace(Path(__file__).resolve().parents[2] / "traces" / "default-eqspec.json.gz")
    assert trace.header.schema_version == 3
    assert all(row.draft_input_tokens is None for step in trace.steps for row in step.rows)
    report = check_trace(trace)
    assert report.verdict == "clean"
    assert any("draft_input_tokens" in skipped for skipped in report.skipped_checks)
