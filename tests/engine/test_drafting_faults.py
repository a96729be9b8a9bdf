"""The faults of head and tree drafting, and of request order, on the tiny pair: each is caught at
exactly the (step, row) where it first fed something wrong (from the fault's own log, which the
checker never reads), with the invariant it documents; the head faults keep outputs exact (the
target verifies) and only cost acceptance; none fires at batch 1 where it needs a second row."""

from __future__ import annotations

import functools

import pytest
from drafting import MANY, decode, oracle, outputs, with_oracle

from specviz.analysis.check import check_trace
from specviz.analysis.drafting import drafting_cost
from specviz.engine.faults import FAULTS
from specviz.trace.invariants import Invariant

PROMPTS = MANY[:12]
# Each fault with the proposer, tree and method it corrupts.
SETUPS = {
    "request-order": ("exspec", "draft-model", 0),  # exspec batches by length, not in request order
    "head-source-index": ("exspec", "head", 0),
    "shared-carry": ("eqspec", "head", 0),
    "tree-sibling-mask": ("eqspec", "draft-model", 2),
    "tree-node-positions": ("inplace", "ngram", 2),
}


@functools.cache
def faulty(fault: str | None, method: str, proposer: str, tree: int, batch: int = 6):
    return with_oracle(decode(method, proposer, batch, tree, prompts=PROMPTS, fault=fault), PROMPTS)


def test_setups_cover_the_drafting_faults() -> None:
    needing = {f for f, cls in FAULTS.items() if cls.needs_proposer or cls.needs_tree} | {"request-order"}
    assert needing == set(SETUPS)


@pytest.mark.parametrize("fault", sorted(SETUPS))
def test_drafting_fault_is_caught_where_it_fired(fault: str) -> None:
    trace = faulty(fault, *SETUPS[fault])
    events = trace.header.fault_events
    assert events, f"{fault} never fired"
    report = check_trace(trace)
    assert report.verdict == "desync"
    first = report.first_violation
    assert (first.step, first.row, first.seq_id) == (events[0]["step"], events[0]["row"], events[0]["seq_id"])
    at_first = {v.invariant for v in report.violations if (v.step, v.row) == (first.step, first.row)}
    assert at_first & set(FAULTS[fault].invariants), f"{fault}: broke {at_first}"
    clean = check_trace(faulty(None, *SETUPS[fault]))
    assert clean.violation_count == 0 and clean.verdict == "clean"


@pytest.mark.parametrize("fault", ["head-source-index", "shared-carry"])
def test_head_faults_keep_outputs_exact_and_are_reported_as_drafting_faults(fault: str) -> None:
    trace = faulty(fault, *SETUPS[fault])
    assert outputs(trace) == oracle(tuple(PROMPTS))
    report = check_trace(trace)
    assert {v.invariant for v in report.violations} == {Invariant.HEAD}
    cost = drafting_cost(trace, faulty(None, *SETUPS[fault]))
    assert cost.exact_with == 1.0 and cost.rate_without is not None and cost.rate_with is not None


def test_tree_sibling_mask_changes_what_alternative_nodes_see() -> None:
    trace = faulty("tree-sibling-mask", *SETUPS["tree-sibling-mask"])
    row = trace.steps[0].rows[0]
    assert row.node_attends[4] == [0, 1, 2, 3, 4]  # the depth-1 alternative saw the main chain
    assert row.node_attends[1] == [0, 1]


@pytest.mark.parametrize("fault", ["request-order", "head-source-index", "shared-carry"])
def test_row_faults_are_harmless_at_batch_1(fault: str) -> None:
    trace = faulty(fault, *SETUPS[fault], batch=1)
    assert trace.header.fault_events == []
    assert check_trace(trace).verdict == "clean"
