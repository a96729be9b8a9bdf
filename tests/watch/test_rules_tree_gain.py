"""What a tree step gave its sequence, read for the command (`specviz/watch/infer/gains.py`, `step_gain`), on
target calls written by hand: the next call's context growth says how deep the kept path went, the
target's choices which path of that depth it was, a cacheless draft's re-read which of several
(else greedy acceptance), and where nothing tells two paths apart the step is unreadable, never guessed.

A = [5, 6, 7] is prefilled (its first token 40 fed next), then verified as a tree: 40 at the root
(node 0), 20 (node 1) and 21 (node 2) its children, 22 (node 3) the child of 20. The next call
feeds 25 after five slots (the root and one node kept), at position 5."""

from __future__ import annotations

# The code under test, in one block.
from specviz.watch.autowatch import infer
from specviz.watch.hooks import CallRecord

EOS = frozenset([1])
PARENTS = [-1, 0, 0, 1]


def call(role: str, ids: list[int], width: int, mask: list[int], position: int, argmax) -> CallRecord:
    q = len(ids)
    return CallRecord(
        role=role, rows=None, input_ids=[ids], positions=[list(range(position, position + q))], positions_fed=True,
        cache_width=width, mask_kind="2d", mask=[mask], batch_size=1, query_len=q,
        argmax=None if argmax is None else [argmax],
    )  # fmt: skip


def run(
    tree_argmax: list[int] | None, draft_fed: list[int] | None = None, seen: list[int] | None = None, fed: int = 25
) -> tuple:
    """The three target calls (a cacheless draft call fed `draft_fed` before the last, if given;
    `seen`: the last call's mask over its seven cache slots, default the root and node 1; `fed`:
    the token it is fed, default 25).
    Returns the tokens read, the notes, and why the tree's call is unreadable (None: readable)."""
    tree = call("target", [40, 20, 21, 22], 3, [1] * 7, 3, tree_argmax)
    tree.parents = [PARENTS]
    calls = [call("target", [5, 6, 7], 0, [1, 1, 1], 0, [99, 99, 40]), tree]
    if draft_fed is not None:
        calls.append(call("draft", draft_fed, 0, [1] * len(draft_fed), 0, [99] * len(draft_fed)))
    calls.append(call("target", [fed], 7, [*(seen or [1, 1, 1, 1, 1, 0, 0]), 1], 5, [1]))
    notes: list[str] = []
    prompts, emits = infer(calls, EOS, notes)
    assert prompts == [[5, 6, 7]]
    tokens = [t for e in emits for t in e.tokens]
    return tokens, notes, tree.unreadable


def test_the_path_whose_end_chose_the_fed_token_is_the_one_kept() -> None:
    """Argmax 20 at the root, 25 at 20, 26 at 21: the context grew by two (one node, then 25), and
    of the two one-node paths, 20's end chose 25: the step gave 20, 25 (then EOS)."""
    assert run([20, 25, 26, 27]) == ([40, 20, 25, 1], [], None)


def test_two_paths_whose_ends_chose_the_fed_token_are_told_by_greedy_acceptance() -> None:
    """Argmax 25 after 20 and after 21 alike (a compacted cache shows no node's KV), with no draft to
    re-read either: greedy acceptance, the rule the command reads, keeps the root's choice 20."""
    assert run([20, 25, 25, 27]) == ([40, 20, 25, 1], [], None)


def test_two_paths_that_greedy_acceptance_does_not_tell_make_the_step_unreadable() -> None:
    """Argmax 25 after 20 and after 21 alike, and the root chose neither (99): nothing tells which
    node was kept, so the tree's call is unreadable from there (said, with the call, row and depth),
    never a guess."""
    _, notes, why = run([99, 25, 25, 27])
    assert not notes
    assert why == "tree step of target call 1, row 0: no one path of 1 nodes fits what was fed next"


def test_a_cacheless_draft_re_read_tells_which_of_two_paths_was_kept() -> None:
    """The same two paths, then a draft model without a cache fed [5, 6, 7, 40, 21, 25]: that is the
    sequence the engine kept, so the step gave 21, 25 (readable), not 20, 25."""
    assert run([20, 25, 25, 27], [5, 6, 7, 40, 21, 25]) == ([40, 21, 25, 1], [], None)


def test_an_argmax_kept_for_the_last_slots_only_is_read_at_its_own_slots() -> None:
    """The engine kept the logits of the last three query slots only (nodes 1-3: 25 after 20, 26
    after 21, 27 after 22; none at the root): the choice after node 1 is still the first of them,
    so the path kept is 20's, and the step gave 20, 25."""
    assert run([25, 26, 27]) == ([40, 20, 25, 1], [], None)


def test_the_nodes_the_next_call_still_attends_are_the_path_kept() -> None:
    """4-D masks, keys [cache | query], KV kept by index: the tree's call has the three prompt
    slots then its four nodes (each attending its ancestors), the next call's cache is all seven.
    Its pending token 26 attends the root and node 2 (21), not node 1 (20): the engine kept 21,
    though the target chose 20 at the root (a greedy engine would have kept 20, then 25). The
    step gave what the cache shows, 21, 26 (the checks judge the acceptance), then EOS."""

    def four_d(ids: list[int], width: int, lines: list[list[int]], position: int, argmax: list[int]) -> CallRecord:
        q = len(ids)
        return CallRecord(
            role="target", rows=None, input_ids=[ids], positions=[list(range(position, position + q))],
            positions_fed=True, cache_width=width, mask_kind="4d", mask=[lines], batch_size=1, query_len=q,
            argmax=[argmax],
        )  # fmt: skip

    lines = [[1, 1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 0, 1, 0], [1, 1, 1, 1, 1, 0, 1]]
    tree = four_d([40, 20, 21, 22], 3, lines, 3, [20, 25, 26, 27])
    tree.parents = [PARENTS]
    calls = [
        call("target", [5, 6, 7], 0, [1, 1, 1], 0, [99, 99, 40]),
        tree,
        four_d([26], 7, [[1, 1, 1, 1, 0, 1, 0, 1]], 5, [1]),
    ]
    notes: list[str] = []
    prompts, emits = infer(calls, EOS, notes)
    assert prompts == [[5, 6, 7]] and not notes, notes
    assert [t for e in emits for t in e.tokens] == [40, 21, 26, 1]
    assert tree.unreadable is None


def test_a_growth_no_path_of_the_tree_explains_is_left_to_the_chain_rules() -> None:
    """The next call is fed 77, which no node's target chose (a wrong token), and attends all seven
    slots (every node kept: the context grew by four), while the tree's deepest path holds two
    nodes: no path explains it, and no chain or token fits the row (the batch keeps its order).
    The step is read by the chain rules (the drafts greedy acceptance keeps, 20, then the token
    fed, 77) for the checks to judge; the tree's call is not called unreadable."""
    assert run([20, 25, 26, 27], seen=[1] * 7, fed=77) == ([40, 20, 77, 1], [], None)
