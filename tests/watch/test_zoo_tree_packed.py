"""Trees in a packed 1 x T call (`tests/watch/zoo/tree.py`, `packed=1`), the shape vLLM's tree
attention and packed EAGLE engines verify with: every live sequence's tree nodes back to back in
one row over a shared cache, each node at committed length - 1 + depth, attending its own
sequence's slots and its ancestors; the last prompt's prefill rides in step 2's verify call
behind the trees (`late=2`). Watched with its segments and trees declared
(`w.batch(seq_ids, query_lens=..., parents=...)`, None for the prefill; the sequences packed in a
new order each step, `rotate=1`), with nothing declared (the
API: the call is cut by its mask, around its tree nodes, and each tree read inside its sequence),
with flash attention's `cu_seq_lens_q/k` and a boolean mask ("flash": cut by those, the trees read
inside), and by the command.

The truth is independent of specviz: the correct engine equals batch-1 greedy of the target on
every prompt, each to its own budget (`shapes.reference`, unwatched). The correct run checks clean
with exact match 1.0, every row read as its tree; each injected bug's first violation is at the
(step, sequence) the engine reports.
"""

from __future__ import annotations

import pytest
import torch
from test_zoo_tree import BUDGETS, PROMPTS
from tiny import make_pair
from zoo import shapes, tree
from zoo.command import watch_script

import specviz
from specviz.analysis.check import check_trace
from specviz.trace.invariants import Invariant
from specviz.watch import batchmap
from specviz.watch.tensor_reads import line_summary
from specviz.watch.tree import packed_nodes

# (bug, mode) -> the invariant its first violation breaks, as that mode reads it. Declared, a
# sibling seen is KV; read from the mask, the causal block is a chain-shaped tree whose depths the
# positions do not follow. A stale branch is KV at its own step: the next call still attends it.
BUGS = {
    ("sibling", "declared"): Invariant.KV,
    ("sibling", "rows"): Invariant.POSITIONS,
    ("sibling", "flash"): Invariant.POSITIONS,
    ("positions", "declared"): Invariant.POSITIONS,
    ("stale_branch", "rows"): Invariant.KV,
    ("stale_branch", "command"): Invariant.KV,
    ("off_path", "rows"): Invariant.ACCOUNTING,
}
LATE = 2  # the step whose verify call also prefills the last prompt


@pytest.fixture(scope="module")
def pair():
    return make_pair("llama")


@pytest.fixture(scope="module")
def runs(pair, tmp_path_factory):
    done: dict[tuple, tuple] = {}
    tmp = tmp_path_factory.mktemp("packed-tree")

    def get(bug: str | None, mode: str):
        if (bug, mode) not in done:
            done[bug, mode] = _command(tmp, bug) if mode == "command" else _api(pair, bug, mode)
        return done[bug, mode]

    return get


def _api(pair, bug: str | None, mode: str):
    declared = int(mode == "declared")  # declared, the sequences are also packed in a new order each step
    options = {"declare": declared, "rotate": declared, "flash": int(mode == "flash"), "packed": 1, "late": LATE}
    with specviz.watch(pair.target, pair.draft, prompts=PROMPTS, name=f"packed-tree-{mode}") as w:
        outs, events = tree.generate(pair.target, pair.draft, PROMPTS, BUDGETS, bug=bug, w=w, **options)
    return w.trace, outs, events


def _command(tmp, bug: str | None):
    options = {"packed": 1, "late": LATE}
    return watch_script(tmp / f"{bug or 'correct'}.trace.json", "tree", PROMPTS, BUDGETS, bug, options)


@pytest.mark.parametrize("mode", ["declared", "rows", "flash", "command"])
def test_correct_packed_tree_engine_checks_clean(pair, runs, mode: str) -> None:
    trace, outs, events = runs(None, mode)
    assert outs == shapes.reference(pair.target, PROMPTS, BUDGETS) and not events  # the oracle, unwatched
    report = check_trace(trace)
    assert report.verdict == "clean", (report.verdict, report.violations[:3])
    assert not report.violation_count and report.exact_match == 1.0
    rows = [row for step in trace.steps for row in step.rows]
    assert sorted({row.seq_id for row in rows}) == list(range(len(PROMPTS)))  # the late one too
    shapes_read = {tuple(tree.tree_parents(d)) for d in (1, 2, 3)}
    assert all(tuple(row.tree_parents) in shapes_read for row in rows)  # every row read as its tree
    assert any(len(step.rows) > 1 for step in trace.steps)  # several trees in one packed call
    assert any(row.tree_path[:1] == [2] for row in rows)  # the second branch accepted: a tree, not a chain
    # What each step kept, read from the next packed call's view of the shared cache (slots never move).
    assert any(row.kept_nodes == [0, *row.tree_path] for row in rows)
    assert all(row.kept_nodes in (None, [0, *row.tree_path]) for row in rows)
    assert trace.header.tree_branches == 3


@pytest.mark.parametrize(("bug", "mode"), list(BUGS))
def test_injected_packed_tree_bug_is_located(runs, bug: str, mode: str) -> None:
    trace, _, events = runs(bug, mode)
    assert events, f"{bug} never fired"
    report = check_trace(trace)
    v = report.first_violation
    assert v is not None, (report.verdict, report.skipped_checks)
    assert (v.step, v.seq_id, v.invariant) == (*events[0], BUGS[bug, mode]), report.violations[:3]
    if bug == "off_path":  # the target's choice not kept: a wrong output, never called clean
        assert report.exact_match < 1.0


def _packed_mask(views: list[list[int]], keys: int) -> torch.Tensor:
    mask = torch.zeros(len(views), keys, dtype=torch.bool)
    for t, seen in enumerate(views):
        mask[t, seen] = True
    return mask


def test_a_packed_tree_is_cut_by_sequence_not_by_node() -> None:
    """Two sequences (cache slots 0-1 and 2-3) each verify a tree [-1, 0, 0] at query slots 4-6 and
    7-9: the block-diagonal rule alone would cut at each sibling (it drops its predecessor's slot
    at the same position); read around the nodes, the call is two segments. Each sequence's root
    shares no slot with the node before it, so it still starts a sequence."""
    views = [[0, 1, 4], [0, 1, 4, 5], [0, 1, 4, 6], [2, 3, 7], [2, 3, 7, 8], [2, 3, 7, 9]]
    positions = [2, 3, 3, 2, 3, 3]
    mask = _packed_mask(views, 10)
    lines = line_summary(mask)
    assert batchmap.block_cuts(lines, positions) == [2, 3, 5]
    nodes = packed_nodes(mask, lines, positions)
    assert nodes == [2, 5]
    assert batchmap._block_segments(lines, positions, nodes) == [(0, 3, None), (3, 3, None)]
    # A neighbour's root that leaks one slot of the first sequence is still a cut, never a node.
    leaked = _packed_mask([*views[:3], [0, 2, 3, 7], [0, 2, 3, 7, 8], [0, 2, 3, 7, 9]], 10)
    assert packed_nodes(leaked, line_summary(leaked), positions) == [2, 5]


def _packed_call(views: list[list[int]], positions: list[int], cache: int, **fields):
    """A captured, unmaterialized packed 1 x T target call whose token t attends key slots `views[t]`
    (keys: `cache` slots, then the T query tokens)."""
    from specviz.watch.hooks import CallRecord

    t = len(views)
    mask = _packed_mask(views, cache + t)[None]
    ids = torch.tensor([[10 + i for i in range(t)]])
    call = CallRecord("target", None, ids, torch.tensor([positions]), True, cache, "4d", mask, 1, t, packed=True)
    for name, value in fields.items():
        setattr(call, name, value)
    call.materialize()
    return call


def test_a_packed_tree_after_refed_context_is_unreadable_never_guessed() -> None:
    """Two sequences in one packed call, each a tree [-1, 0, 0] after its root. With a cache (slots
    0-1, 2-3) each root is the pending token: two tree rows. Cacheless, each re-feeds its one
    context token before the tree: which token is the pending one the mask does not say, so the
    call is unreadable, not read as a tree rooted at the prompt's first token. Declared trees of
    more nodes than a segment holds are unreadable too."""
    cached = _packed_call(
        [[0, 1, 4], [0, 1, 4, 5], [0, 1, 4, 6], [2, 3, 7], [2, 3, 7, 8], [2, 3, 7, 9]], [2, 3, 3] * 2, 4
    )
    assert cached.unreadable is None and cached.trees == [[-1, 0, 0], [-1, 0, 0]]
    refed = [[0], [0, 1], [0, 1, 2], [0, 1, 3], [4], [4, 5], [4, 5, 6], [4, 5, 7]]  # context, root, 2 nodes
    call = _packed_call(refed, [0, 1, 2, 2] * 2, 0)
    assert not any(call.trees) and "re-feeds" in call.unreadable
    too_big = _packed_call(
        [[0, 1, 4], [0, 1, 4, 5], [0, 1, 4, 6], [2, 3, 7], [2, 3, 7, 8], [2, 3, 7, 9]],
        [2, 3, 3] * 2,
        4,
        query_lens=[3, 3],
        parents=[[-1, 0, 0, 1], [-1, 0, 0]],
    )
    assert not any(too_big.trees) and "declares a tree of 4 nodes" in too_big.unreadable
    # A cacheless prefill (a chain from a root that sees nothing before it) packed beside a tree over
    # its cache (slots 0-1): a prefill, no tree; the call stays readable.
    beside = _packed_call([[2], [2, 3], [2, 3, 4], [0, 1, 5], [0, 1, 5, 6], [0, 1, 5, 7]], [0, 1, 2, 2, 3, 3], 2)
    assert beside.unreadable is None and beside.trees == [None, [-1, 0, 0]]
