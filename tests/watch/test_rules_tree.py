"""Tree verification under the watch (`specviz/watch/tree.py`): which rows of a target call verify a
tree (declared, or read from the mask), a packed call's tree nodes, and what a tree step accepted
and kept. Every mask and token list is written by hand, with what a correct engine's row reads as
and what a buggy or unreadable one reads as."""

from __future__ import annotations

from types import SimpleNamespace

import torch

# The code under test, in one block.
from specviz.watch.calls import draft_calls_before
from specviz.watch.record import CallRecord
from specviz.watch.tensor_reads import line_summary
from specviz.watch.tree import (
    accepted_path,
    alternatives,
    branching,
    consistent,
    greedy_chain,
    kept_nodes,
    one_tree,
    packed_nodes,
)


def seen_of(*rows: str) -> torch.Tensor:
    return torch.tensor([[c == "1" for c in row] for row in rows])


# A cache of 2 slots then a tree of 4 nodes, parents [-1, 0, 0, 1] (node 2 does not see node 1).
TREE = seen_of("111000", "111100", "111010", "111101")
CHAIN = seen_of("111000", "111100", "111110", "111111")


def call(ids: list[list[int]], mask, kind: str, positions: list[list[int]], width: int = 0, **fields) -> CallRecord:
    b, q = len(ids), len(ids[0])
    record = CallRecord(
        role=fields.pop("role", "target"), rows=None, input_ids=torch.tensor(ids), positions=torch.tensor(positions),
        positions_fed=True, cache_width=width, mask_kind=kind, mask=mask, batch_size=b, query_len=q,
    )  # fmt: skip
    for name, value in fields.items():
        setattr(record, name, value)
    record.materialize()
    return record


# ----------------------------------------------------------------------------- which rows verify a tree


def test_branching() -> None:
    assert not branching([-1]) and not branching([-1, 0, 1])
    assert branching([-1, 0, 0]) and branching([-1, 0, 1, 1])


def test_a_tree_read_from_the_mask_fed_its_depths() -> None:
    c = call([[5, 6, 7, 8]], TREE[None], "4d", [[10, 11, 11, 12]], width=2)
    assert c.unreadable is None
    assert c.trees == [[-1, 0, 0, 1]]


def test_a_branching_mask_fed_chain_positions_stays_a_chain() -> None:
    """A chain engine's mask bug (draft 2 misses draft 1) is not read as a tree: positions 10-13
    are a chain's, not the tree's depths."""
    c = call([[5, 6, 7, 8]], TREE[None], "4d", [[10, 11, 12, 13]], width=2)
    assert not any(c.trees)


def test_a_chain_call_has_no_trees() -> None:
    c = call([[5, 6, 7, 8]], CHAIN[None], "4d", [[10, 11, 12, 13]], width=2)
    assert not any(c.trees) and c.unreadable is None


def test_a_tree_read_over_a_row_that_ends_before_the_call() -> None:
    """Row 1 is a tree of 3 nodes in slots 1-3 of 5 (slots 0 and 4 padding: their lines attend
    nothing), over keys [cache 2 | query 5]; row 0 a chain of 5. Row 1 branches, fed its depths: a
    tree call, whose chain row is then a chain-shaped tree."""
    chain = seen_of("1110000", "1111000", "1111100", "1111110", "1111111")
    tree = seen_of("0000000", "1101000", "1101100", "1101010", "0000000")
    live = torch.tensor([[True] * 5, [False, True, True, True, False]])
    c = call(
        [[5, 6, 7, 8, 9], [0, 5, 6, 7, 0]], torch.stack([chain, tree]), "4d",
        [[10, 11, 12, 13, 14], [0, 10, 11, 11, 0]], width=2, query_live=live,
    )  # fmt: skip
    assert c.last_slots == [4, 3]
    assert c.trees == [[-1, 0, 1, 2, 3], [-1, 0, 0]]


def test_a_tree_after_re_fed_context_is_unreadable() -> None:
    """No cache: slot 0 is re-fed context, slot 1 the pending token, slots 2 and 3 siblings. The
    mask alone does not say which token of the chain is the pending one: unreadable, no trees."""
    c = call([[4, 5, 6, 7]], seen_of("1000", "1100", "1110", "1101")[None], "4d", [[0, 1, 2, 2]])
    assert not any(c.trees)
    assert c.unreadable is not None and "re-feeds" in c.unreadable


def test_a_chain_then_tree_over_a_cache_is_read() -> None:
    """The same shape over a cache of 2 (the root at slot 0 sees it): a tree, read."""
    mask = seen_of("111000", "111100", "111110", "111101")[None]
    c = call([[4, 5, 6, 7]], mask, "4d", [[8, 9, 10, 10]], width=2)
    assert c.unreadable is None and c.trees == [[-1, 0, 1, 1]]


def test_declared_trees() -> None:
    """Declared parents are the row's tree, None a chain row; the batch's rows past the list: None."""
    c = call([[5, 6, 7], [8, 9, 10]], None, "none", [[3, 4, 4], [3, 4, 5]], width=3, parents=[[-1, 0, 0]])
    assert c.unreadable is None
    assert c.trees == [[-1, 0, 0], None]
    whole = call([[5, 6, 7]], None, "none", [[3, 4, 4]], width=3, parents=[(-1, 0, 0)])
    assert whole.trees == [[-1, 0, 0]]


def test_a_declared_tree_larger_than_the_query_is_unreadable() -> None:
    c = call([[5, 6, 7]], None, "none", [[3, 4, 4]], width=3, parents=[[-1, 0, 0, 1]])
    assert not any(c.trees)
    assert c.unreadable == "row 0 declares a tree of 4 nodes; its query holds 3 tokens"


def test_a_draft_call_verifies_no_tree() -> None:
    c = call([[5, 6, 7]], None, "none", [[3, 4, 4]], width=3, parents=[[-1, 0, 0]], role="draft")
    assert not any(c.trees) and c.unreadable is None


# ----------------------------------------------------------------------------- a packed 1 x T mask


def test_one_tree_over_a_cache() -> None:
    """Keys [cache 2 | query 4]: one tree fed its depths. Fed a chain's positions: no tree."""
    assert one_tree(TREE, 2, [10, 11, 11, 12])
    assert not one_tree(TREE, 2, [10, 11, 12, 13])
    assert not one_tree(CHAIN, 2, [10, 11, 12, 13])


def test_one_tree_ends_at_the_last_live_token() -> None:
    """Padding after the tree (lines that attend nothing) is not part of it."""
    padded = torch.zeros(6, 8, dtype=torch.bool)
    padded[:4, :6] = TREE
    assert one_tree(padded, 2, [10, 11, 11, 12, 0, 0])


def test_one_tree_after_padding_over_a_cache() -> None:
    """A padding query slot (it attends nothing) before the tree: the tree's block starts at its root's own key."""
    padded = torch.zeros(5, 7, dtype=torch.bool)
    padded[1:, :2], padded[1:, 3:] = TREE[:, :2], TREE[:, 2:]
    assert one_tree(padded, 2, [0, 10, 11, 11, 12])


def test_a_call_that_attends_nothing_is_no_tree() -> None:
    """No live token (every line off), keys [cache | query] with no cache or a static cache's: no tree."""
    assert not one_tree(torch.zeros(4, 4, dtype=torch.bool), 0, [0, 1, 1, 2])
    assert not one_tree(torch.zeros(4, 8, dtype=torch.bool), 2, [0, 1, 1, 2])


def test_one_tree_over_a_static_cache_s_slots() -> None:
    """Keys: 8 slots of a static cache (not [cache | query]); the tree's nodes in slots 2-5."""
    static = torch.zeros(4, 8, dtype=torch.bool)
    static[:, :6] = TREE
    assert one_tree(static, 2, [10, 11, 11, 12])


def test_two_sequences_packed_over_a_static_cache_are_no_tree() -> None:
    """Sequence A in slots 0-1 (its token at 1), sequence B in slots 4-6 (tokens at 5, 6)."""
    static = seen_of("11000000", "00001100", "00001110")
    assert not one_tree(static, 2, [1, 5, 6])


def test_packed_nodes_are_tree_siblings_not_new_sequences() -> None:
    """A tree (root, two siblings) then a chain of 2, no cache: the second sibling drops its
    predecessor's slot like a new sequence would, yet attends its root's slots plus its own."""
    seen = seen_of("10000", "11000", "10100", "00010", "00011")
    assert packed_nodes(seen, line_summary(seen), [4, 5, 5, 2, 3]) == [2]


def test_packed_nodes_of_a_tree_after_another_sequence() -> None:
    """A chain of 2 then the tree (root at 2, siblings at 3 and 4): the sibling at 4 is a node."""
    seen = seen_of("10000", "11000", "00100", "00110", "00101")
    assert packed_nodes(seen, line_summary(seen), [2, 3, 4, 5, 5]) == [4]


def test_a_new_sequence_is_no_packed_node() -> None:
    """Two chains back to back: the second's first token attends only itself."""
    seen = seen_of("10000", "11000", "11100", "00010", "00011")
    assert packed_nodes(seen, line_summary(seen), [0, 1, 2, 0, 1]) == []


# ----------------------------------------------------------------------------- what a step accepted


# Root r, nodes a (child of r), b (child of r), c (child of a): parents [-1, 0, 0, 1].
PARENTS, NODES = [-1, 0, 0, 1], [1, 20, 30, 40]


def test_consistent() -> None:
    targets = [20, 40, 9, 50]  # the target's choice at each node
    assert consistent([20, 40], PARENTS, NODES, targets, False)  # the path, nothing more
    assert consistent([20, 40, 50], PARENTS, NODES, targets, False)  # then the target's choice
    assert not consistent([20, 40, 51], PARENTS, NODES, targets, False)  # another token
    assert consistent([20, 40, 51], PARENTS, NODES, targets, True)  # any last token allowed
    assert not consistent([20, 40, 50, 60], PARENTS, NODES, targets, True)  # two tokens past it
    assert consistent([30], PARENTS, NODES, targets, False)


def test_accepted_path_walks_the_tokens() -> None:
    targets = [30, 9, 9, 9]
    assert accepted_path([30, 9], PARENTS, NODES, targets) == ([2], 9)
    assert accepted_path([20, 40], PARENTS, NODES, []) == ([1, 3], None)
    assert accepted_path([7], PARENTS, NODES, []) == ([], 7)


def test_accepted_path_cut_short_accepts_the_greedy_path() -> None:
    """The target agrees with a then c: an emit cut after one token accepts the whole verified path."""
    targets = [20, 40, 9, 50]
    assert accepted_path([20], PARENTS, NODES, targets) == ([1, 3], None)
    assert accepted_path([20, 40, 50], PARENTS, NODES, targets) == ([1, 3], 50)


def test_twin_siblings_accept_the_branch_the_target_agrees_with() -> None:
    """Nodes 1 and 2 hold the same token; the target's choice goes on under node 2 only."""
    parents, nodes, targets = [-1, 0, 0, 2], [1, 20, 20, 40], [20, 9, 40, 50]
    assert accepted_path([20, 40, 50], parents, nodes, targets) == ([2, 3], 50)
    assert greedy_chain(parents, nodes, targets) == ([20, 40], [20, 40, 50])
    assert greedy_chain(parents, nodes, []) == ([], [])


# ----------------------------------------------------------------------------- calls, kept nodes, header


def test_draft_calls_before() -> None:
    roles = ["target", "draft", "draft", "target"]
    calls = [SimpleNamespace(role=r) for r in roles]
    assert draft_calls_before(calls, 3) == [2, 1]
    calls = [SimpleNamespace(role=r) for r in ["target", "target", "draft", "target"]]
    assert draft_calls_before(calls, 3) == [2]
    calls = [SimpleNamespace(role=r) for r in ["draft", "draft", "target"]]
    assert draft_calls_before(calls, 2) == [1, 0]


def test_alternatives() -> None:
    steps = [SimpleNamespace(rows=[SimpleNamespace(tree_parents=PARENTS), SimpleNamespace(tree_parents=None)])]
    assert alternatives(steps) == 1
    assert alternatives([SimpleNamespace(rows=[SimpleNamespace(tree_parents=[-1, 0, 0, 0])])]) == 2
    assert alternatives([]) == 0


def _packed(node_keys, segments, keys_end=None, held=None, trees=None) -> CallRecord:
    c = CallRecord(
        role="target", rows=None, input_ids=[[0]], positions=[[0]], positions_fed=True, cache_width=0,
        mask_kind="none", mask=None, batch_size=len(segments), query_len=1,
    )  # fmt: skip
    c.node_keys, c.segments, c.keys_end, c.held, c.trees = node_keys, segments, keys_end, held, trees
    return c


def test_kept_nodes_of_a_packed_tree_call() -> None:
    """Call 1 packs a tree of 3 nodes (keys 0-2) and a chain (keys 3-4), its keys end at 5. The
    next call's sequences start at its query columns 0 and 2, their keys at 5 and 7; the tree's
    sequence attends keys 0 and 2 (root and the second sibling kept)."""
    rq = SimpleNamespace(pending=0)
    first = _packed([0, 3], [(0, 0, 3), (1, 3, 2)], keys_end=5, trees=[[-1, 0, 0], [-1, 0]])
    held = [[[1, 0, 1, 0, 0, 1, 0]], [[0, 0, 0, 1, 1, 0, 1]]]
    later = _packed([5, 7], [(3, 0, 2), (5, 2, 2)], held=held)
    assert kept_nodes(first, 0, rq, later, 0, rq) == [0, 2]
    assert kept_nodes(first, 1, rq, later, 1, rq) == [0, 1]
    # Another call between them (the next call's keys begin past where this one's end): not read.
    moved = _packed([6, 8], [(3, 0, 2), (5, 2, 2)], held=held)
    assert kept_nodes(first, 0, rq, moved, 0, rq) is None
