"""The dynamic (top-k) tree (`--tree-kind topk`): per row, the b best-scored alternatives among the
proposer's next choices at every depth. Exact against batch-1 greedy of the target for every
method at batch sizes 1 to 32, with trees that differ from row to row, and checked clean; its
faults are caught where they fired."""

from __future__ import annotations

import contextlib

import pytest
import torch
from drafting import MANY, decode, oracle, outputs, tiny_pair, with_oracle

from specviz.analysis.check import check_trace
from specviz.engine.config import RunConfig
from specviz.engine.proposers.base import TreeShape, accepted_path, pick_topk
from specviz.errors import SpecvizError

METHODS = ("eqspec", "exspec", "inplace")
FEW = MANY[:12]


@contextlib.contextmanager
def sharp_draft(scale: float = 20.0):
    """The tiny draft's logits scaled up: the same drafts (argmax unchanged), but confident, so
    the top-k ranking puts some rows' alternatives deeper than depth 1 (a flat random draft never
    does): trees that differ from row to row. The target, and so the oracle, is untouched."""
    handle = tiny_pair().draft.get_output_embeddings().register_forward_hook(lambda m, i, out: out * scale)
    try:
        yield
    finally:
        handle.remove()


def shapes(trace) -> set[tuple[int, ...]]:
    return {tuple(r.tree_parents) for s in trace.steps for r in s.rows}


def test_pick_topk_spends_the_budget_where_the_proposer_is_unsure() -> None:
    # Row 0 is sure of depth 1 (token 2) and unsure at depth 2; row 1 unsure at depth 1.
    depth1 = torch.log_softmax(torch.tensor([[0.0, 0, 9, 0, 0, 0], [0, 3, 3.2, 3.1, 0, 0]]), -1)
    depth2 = torch.log_softmax(torch.tensor([[0.0, 5, 4.9, 4.8, 0, 0], [0, 0, 0, 0, 0, 4]]), -1)
    chosen = [depth1.argmax(-1), depth2.argmax(-1)]
    tokens, parents = pick_topk([depth1, depth2], chosen, budget=2)
    assert parents == ((1, 1), (0, 0))  # row 0: both at depth 2 (parent node 1); row 1: both at depth 1
    assert tokens.tolist() == [[2, 3], [3, 1]]  # never the main chain's own token (row 0's depth-2 pick is 1)
    tree = TreeShape(k=2, branches=2, alt_parents=parents)
    assert tree.row_parents(0) == (-1, 0, 1, 1, 1) and tree.row_depths(1) == (0, 1, 2, 1, 1)
    assert tree.attend_mask(2).shape == (2, 5, 5)
    assert accepted_path(tree, [9, 2, 1, 2, 3], [2, 3, 0, 0, 0], row=0) == [1, 4]  # through row 0's alternative
    assert accepted_path(tree, [9, 2, 1, 2, 3], [2, 3, 0, 0, 0], row=1) == [1]  # row 1's node 4 hangs off the root


@pytest.mark.parametrize("method", METHODS)
def test_topk_tree_is_exact_at_batch_sizes_1_to_32_and_checks_clean(method: str) -> None:
    expected = oracle()
    with sharp_draft():
        for batch in (1, 3, 7, 32):
            trace = with_oracle(decode(method, "draft-model", batch, tree=2, tree_kind="topk"))
            assert outputs(trace) == expected, f"batch {batch}"
            report = check_trace(trace)
            assert report.violation_count == 0 and report.verdict == "clean", (batch, report.violations[:3])
            assert len(shapes(trace)) > 1, "every row drew the same tree: nothing dynamic was exercised"
            assert trace.header.options["tree_kind"] == "topk"


@pytest.mark.parametrize("method", METHODS)
def test_topk_tree_with_a_head_is_exact(method: str) -> None:
    trace = with_oracle(decode(method, "head", 5, tree=3, prompts=FEW, tree_kind="topk"), FEW)
    assert outputs(trace) == oracle(tuple(FEW))
    assert check_trace(trace).verdict == "clean"


def test_topk_paths_end_on_deep_alternatives() -> None:
    """What the top-k tree adds: accepted paths that end on an alternative below depth 1."""
    with sharp_draft():
        trace = decode("eqspec", "draft-model", 8, tree=2, prompts=FEW, tree_kind="topk")
    depth_of_end = [
        r.tree_depths[r.tree_path[-1]] for s in trace.steps for r in s.rows if r.tree_path and r.tree_path[-1] > 3
    ]
    assert depth_of_end and max(depth_of_end) >= 2


@pytest.mark.parametrize("fault", ["tree-sibling-mask", "tree-node-positions"])
def test_tree_faults_are_caught_where_they_fired_in_a_topk_tree(fault: str) -> None:
    with sharp_draft():
        trace = with_oracle(decode("exspec", "draft-model", 6, tree=2, prompts=FEW, tree_kind="topk", fault=fault), FEW)
    event, first = trace.header.fault_events[0], check_trace(trace).first_violation
    assert (first.step, first.row, first.seq_id) == (event["step"], event["row"], event["seq_id"])


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"tree_kind": "topk"}, "--tree-kind topk needs --tree 1 or more"),
        ({"tree_kind": "topk", "tree_branches": 2, "proposer": "ngram"}, "ngram has none"),
        ({"tree_kind": "wide", "tree_branches": 2}, "unknown --tree-kind 'wide'"),
    ],
)
def test_topk_settings_are_refused_in_one_line(change: dict, says: str) -> None:
    with pytest.raises(SpecvizError, match=says):
        RunConfig(**change).validate()


def test_record_flag_reaches_the_run_config() -> None:
    from specviz.cli import build_parser
    from specviz.recording import run_config

    args = build_parser().parse_args(["record", "--tree", "2", "--tree-kind", "topk"])
    config = run_config(args)
    assert (config.tree_branches, config.tree_kind) == (2, "topk")
