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
    # A fault of the draft model's own calls runs with the default proposer: test_scheduling_faults.py.
    needing = {f for f, cls in FAULTS.items() if cls.needs_proposer not in (None, "draft-model") or cls.needs_tree}
    needing |= {"request-order"}
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


def test_request_order_runs_on_inplace_and_is_caught_where_it_fired() -> None:
    """INPLACE orders rows longest prompt first, so request order differs from row order at once:
    results land in the wrong sequences (outputs off the oracle), caught at the first event's
    (step, row); the same run without the fault equals the oracle and checks clean."""
    trace = faulty("request-order", "inplace", "draft-model", 0)
    events = trace.header.fault_events
    assert events and events[0]["step"] == 0
    first = check_trace(trace).first_violation
    assert (first.step, first.row, first.seq_id, first.invariant) == (
        events[0]["step"], events[0]["row"], events[0]["seq_id"], Invariant.ACCOUNTING,
    )  # fmt: skip
    expected = oracle(tuple(PROMPTS))
    wrong = {e["seq_id"] for e in events}
    assert any(outputs(trace)[seq] != expected[seq] for seq in wrong)
    clean = faulty(None, "inplace", "draft-model", 0)
    assert outputs(clean) == expected and check_trace(clean).verdict == "clean"


@pytest.mark.parametrize(("proposer", "batch", "tree"), [("draft-model", 3, 0), ("ngram", 5, 2)])
def test_request_order_never_outgrows_an_inplace_region(proposer: str, batch: int, tree: int) -> None:
    """Rows of very different acceptance: a row whose sequence is handed few tokens while its own
    drafts are all accepted kept its own growth before, and outgrew its fixed region ("a row outgrew
    its slots"); the cache now keeps what its sequence was given, as vLLM's scheduler did."""
    prompts = ["a b a b a b a b a b a b a b", "x", "the cat sat on the mat the cat sat on the mat the cat", "qwerty"]
    prompts += ["1 2 3 1 2 3 1 2 3 1 2 3"]
    trace = decode("inplace", proposer, batch, tree, prompts=prompts, fault="request-order", max_new_tokens=40)
    assert trace.header.fault_events and all(len(s.output_ids) == 40 for s in trace.sequences)
    first, event = check_trace(trace).first_violation, trace.header.fault_events[0]
    assert (first.step, first.row) == (event["step"], event["row"])
