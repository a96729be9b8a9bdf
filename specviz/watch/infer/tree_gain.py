"""What a tree step gave its sequence, read for the command from the next call that feeds it; where several
paths of different tokens fit, the step is unreadable, never guessed."""

from __future__ import annotations

from typing import Any

from specviz.analysis.tree_checks import depths_of
from specviz.watch.calls import argmax_at, tree_of
from specviz.watch.tree import kept_nodes


def step_gain(
    calls: list[Any], step: tuple[int, int], at: tuple[int, int], rq: Any, later_rq: Any, context: list[int], grown: int
) -> list[int] | str | None:
    """A tree step's tokens as the next call (`at`) shows them: the kept nodes, when they are the root and
    a chain, then the fed token; else the path of `grown` - 1 nodes whose end chose the fed token (a
    cacheless draft's feed breaking a tie). A string: why it cannot be told; None: no tree row, or
    nothing a path explains."""
    (i, ri), (j, rj) = step, at
    call = calls[i]
    parents = tree_of(call, ri)
    if parents is None:
        return None
    nodes = call.input_ids[ri][rq.pending : rq.pending + len(parents)]
    token = calls[j].input_ids[rj][later_rq.pending]
    kept = kept_nodes(call, ri, rq, calls[j], rj, later_rq)
    if kept is not None:
        chain = kept == [0, *_path_to(parents, max(kept, default=0))]  # the root and a path down (kept ascends)
        return [nodes[n] for n in kept[1:]] + [token] if chain else None
    depths = depths_of(parents)
    ends = [n for n, d in enumerate(depths) if d == grown - 1]
    if not ends:
        return None
    chosen = [n for n in ends if argmax_at(call, ri, rq.pending + n) == token]
    paths = {tuple(nodes[a] for a in _path_to(parents, n)) for n in (chosen or ends)}
    if len(paths) > 1:  # a cacheless draft re-reads the committed tokens: the path it was fed
        paths = {p for p in paths if [*context, *p, token] in _draft_feeds(calls, i, j)}
    if len(paths) != 1:
        return f"tree step of target call {i}, row {ri}: no one path of {grown - 1} nodes fits what was fed next"
    return [*paths.pop(), token]


def _draft_feeds(calls: list[Any], i: int, j: int) -> list[list[int]]:
    """What each row of the draft-model calls between target calls i and j attended of its query."""
    return [
        [t for t, keep in zip(call.input_ids[r], call.query_flags(r)) if keep]
        for call in calls[i + 1 : j]
        if of_draft_model(call)
        for r in range(call.batch_size)
    ]


def of_draft_model(call: Any) -> bool:
    """A draft model's call (a draft head's is fed no tokens of its own)."""
    return call.role == "draft" and not call.drafter


def _path_to(parents: list[int], node: int) -> list[int]:
    """The nodes from the root's child down to `node` (root excluded)."""
    path = []
    while node > 0:
        path.append(node)
        node = parents[node]
    return path[::-1]
