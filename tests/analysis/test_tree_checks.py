"""The tree and head-input checks on hand-edited rows of a correct tree run: each edit is flagged
with its invariant at its row, malformed trees (as an uploaded file may hold) are one violation,
never an exception, and the untouched run stays clean."""

from __future__ import annotations

import copy
import functools

import pytest
from drafting import MANY, decode

from specviz.analysis.check import check_trace
from specviz.trace.invariants import Invariant


@functools.cache
def tree_run():
    return decode("eqspec", "head", 4, tree=2, prompts=MANY[:4])


def edited(edit):
    trace = copy.deepcopy(tree_run())
    row = trace.steps[1].rows[1]
    edit(row)
    return trace, row


def _set(**fields):
    def edit(row):
        for name, value in fields.items():
            setattr(row, name, value(row) if callable(value) else value)

    return edit


CASES = {
    "sibling visible": (
        _set(node_attends=lambda r: [*r.node_attends[:4], [0, 1, 4], *r.node_attends[5:]]),
        Invariant.KV,
        "node_attends",
    ),  # noqa: E501
    "position by index": (
        _set(position_ids=lambda r: [r.committed_before - 1 + i for i in range(len(r.tree_parents))]),
        Invariant.POSITIONS,
        "position_ids",
    ),  # noqa: E501
    "path not a chain": (_set(tree_path=[2]), Invariant.ACCOUNTING, "tree_path"),
    "kept off the path": (
        _set(kept_nodes=lambda r: [0, *r.tree_path, 5] if 5 not in r.tree_path else [0]),
        Invariant.KV,
        "kept_nodes",
    ),  # noqa: E501
    "another row's hidden state": (
        _set(head_source=lambda r: [r.seq_id + 1, r.committed_before - 2]),
        Invariant.HEAD,
        "head_source",
    ),  # noqa: E501
    "parent after child": (
        _set(tree_parents=lambda r: [-1, 3, *r.tree_parents[2:]]),
        Invariant.ACCOUNTING,
        "tree_parents",
    ),  # noqa: E501
    "parents too short": (_set(tree_parents=[-1]), Invariant.ACCOUNTING, "tree_parents"),
}


def test_the_untouched_tree_run_is_clean() -> None:
    assert check_trace(tree_run()).violation_count == 0


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_edit_is_flagged_at_its_row(case: str) -> None:
    edit, invariant, field = CASES[case]
    trace, row = edited(edit)
    report = check_trace(trace)
    first = report.first_violation
    assert (first.step, first.row) == (trace.steps[1].step, row.row)
    assert (first.invariant, first.field) == (invariant, field)


def test_a_head_drafted_row_that_does_not_say_what_its_head_was_fed_is_listed_as_skipped() -> None:
    """A head's input that was not read (a head fed features the watch cannot match) is no
    violation, but the check did not run there: the report lists it, with the steps it missed,
    never a silent pass. The same rows in a run drafted by a draft model lack nothing."""
    trace = copy.deepcopy(tree_run())
    assert trace.header.proposer == "head" and not any(
        s.check == "draft head input" for s in check_trace(trace).skipped_checks
    )
    trace.steps[1].rows[1].head_source = None
    skipped = [s for s in check_trace(trace).skipped_checks if s.check == "draft head input"]
    assert [(s.steps, s.of) for s in skipped] == [(1, len(trace.steps))]
    assert check_trace(trace).violation_count == 0
    trace.header.proposer = "draft-model"
    assert not any(s.check == "draft head input" for s in check_trace(trace).skipped_checks)


def test_kept_nodes_read_off_a_next_step_with_a_wrong_context_are_not_blamed_on_this_step() -> None:
    """A step's kept nodes are read off what the sequence's next step attends of its block. Where
    that next step attends a context wrong by more than the kept nodes add (another row's mask
    there: issue 41's blind round, `leave_shift`), the fault is the next step's, flagged there by
    its own KV check; this step's kept nodes are listed as not told. Off by exactly what they add,
    they are this step's (a stale branch kept: flagged here)."""
    trace, row = edited(lambda r: setattr(r, "kept_nodes", [*r.kept_nodes, 5]))
    later = next(r for s in trace.steps[2:] for r in s.rows if r.seq_id == row.seq_id)
    later.kv_len = later.kv_len_expected - 7
    report = check_trace(trace)
    first = report.first_violation
    assert (first.seq_id, first.field) == (row.seq_id, "kv_len") and first.step > trace.steps[1].step
    assert any(s.check == "kept tree nodes" for s in report.skipped_checks)
    later.kv_len = later.kv_len_expected + 1  # what the extra kept node adds: this step kept it
    first = check_trace(trace).first_violation
    assert (first.step, first.seq_id, first.field) == (trace.steps[1].step, row.seq_id, "kept_nodes")
