"""Tree verification under the watch: which rows of a target call verify a tree (declared with
`w.batch(..., parents=...)`, else read from the mask); the path rules every verify row is read by
(a chain is a tree whose node i hangs off node i - 1): which row's tree an emission walks (`credit`),
what it accepted and its step record (`row_record`, with the schema-3 fields of a tree row, so
`analysis.tree_checks` judges a watched tree engine as it judges specviz's own). The rules, packed
calls' trees included, are in docs/watch-trees.md."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy

from specviz.analysis.tree_checks import depths_of
from specviz.trace.schema import RowRecord
from specviz.watch.batchmap import block_cuts
from specviz.watch.map import tree_error  # noqa: F401  (Segment checks its parents with it; declared reads it here)
from specviz.watch.view import parents_of_block, parents_of_sets, slots_on


def branching(parents: list[int]) -> bool:
    """Some node's parent is not the node before it (the root's -1 is the node before it)."""
    return any(p != i - 1 for i, p in enumerate(parents))


def read_trees(call: Any) -> None:
    """A materialized target call's `trees` (per row its parents, None: a chain), declared or from its mask."""
    call.trees = [None] * call.batch_size  # each row's tree (None: a chain), as far as they are read
    if call.role != "target" or call.unreadable is not None:
        return
    if call.parents is not None:
        _declared_trees(call)
    else:
        _mask_trees(call)


def _declared_trees(call: Any) -> None:
    trees = [None if p is None else list(p) for p in call.parents[: call.batch_size]]
    trees += [None] * (call.batch_size - len(trees))
    for r, parents in enumerate(trees):
        live = call.views[r].real_run()
        if parents is not None and len(parents) > live:
            call.mark_unreadable(f"row {r} declares a tree of {len(parents)} nodes; its query holds {live} tokens")
            return
    call.trees = trees


def _mask_trees(call: Any) -> None:
    """The trees the rows' runs of real query slots show, where some row branches and is fed its
    depths (a chain engine's mask bug stays a chain); a call cut around tree nodes needs a branch only."""
    last = call.last_slots
    runs = [view.real_run() for view in call.views]
    found = [call.views[r].tree(last[r] - n + 1, n) if n >= 2 else None for r, n in enumerate(runs)]
    if not any(_fed_tree(p, call.positions[r], last[r], bool(call.tree_nodes)) for r, p in enumerate(found)):
        return
    for r, parents in enumerate(found):
        # A chain from a token that sees nothing before it (a root that branches at once is the
        # pending token): re-fed context, then the tree, and which token is pending is not said.
        if parents is None or parents.count(0) != 1 or not call.views[r].refed_root(last[r] - len(parents) + 1):
            continue
        if call.segments is None or branching(parents):
            call.mark_unreadable(
                f"row {r} verifies a tree after tokens it re-feeds (no cache): which one is its pending "
                "token the mask does not say; declare the trees with w.batch(..., parents=...)"
            )
            return
        found[r] = None  # a packed call's chain from a root that sees no cache: a prefill, no tree
    call.trees = found


def _fed_tree(parents: list[int] | None, positions: list[int], last: int, proven: bool = False) -> bool:
    """A branching tree ending at query slot `last`, fed its root's position plus each node's depth (or `proven`)."""
    if parents is None or not branching(parents):
        return False
    fed = list(positions[last - len(parents) + 1 : last + 1])  # shorter where the nodes do not fit
    return proven or [p - fed[0] for p in fed] == depths_of(parents)


def one_tree(mask: Any, cache_width: int, positions: list[int]) -> bool:
    """Does a 1 x T call's [T, keys] boolean mask verify one branching tree fed its depths, not
    several packed sequences (each one's first token sees no other query token: a second root)?"""
    mask = numpy.asarray(mask)  # `record` hands numpy; through it a packed row costs a few ops
    live = mask.any(-1)
    last = max(slots_on(live), default=0)  # none live: slot 0 alone, which shows no tree either
    first = max(slots_on(~live[:last]), default=-1) + 1  # the run of live slots ending at `last`
    nodes = mask[first : last + 1]
    # One array op first (a packed call can be long): every node of a tree sees what its root sees.
    if mask.shape[-1] == cache_width + mask.shape[0]:  # keys [cache | query]: the query block
        block = nodes[:, cache_width + first : cache_width + last + 1]
        parents = parents_of_block(block.tolist()) if block[:, 0].all() else None
    elif not (mask[first] & ~nodes).any():  # a static or in-place cache's slots
        parents = parents_of_sets([frozenset(slots_on(line)) for line in nodes])
    else:
        parents = None
    return _fed_tree(parents, positions, last)


def packed_nodes(seen: Any, lines: list[tuple[int, bool, bool, bool]], positions: list[int]) -> list[int]:
    """The `block_cuts` of a packed call's boolean [T, keys] mask that are tree nodes, by the mask
    alone: a cut whose parent (a token since the last cut that is no node, attending at least one
    slot, one fewer than the cut, all of them the cut's) is found; every cut's latest in one pass."""
    seen, counts = numpy.asarray(seen), numpy.array([line[0] for line in lines])
    cuts = numpy.array(block_cuts(lines, positions), dtype=int)
    parent = (counts == counts[cuts, None] - 1) & (counts > 0) & (numpy.arange(len(counts)) < cuts[:, None])
    cut, token = numpy.nonzero(parent)
    inside = ~(seen[token] & ~seen[cuts[cut]]).any(-1)
    latest = numpy.full(len(cuts), -1)
    numpy.maximum.at(latest, cut[inside], token[inside])
    nodes, start = [], 0
    for t, found in zip(cuts.tolist(), latest.tolist()):
        if found >= start:
            nodes.append(t)
        else:
            start = t
    return nodes


def consistent(tokens: list[int], parents: list[int], nodes: list[int], targets: list[int], free_last: bool) -> bool:
    """Tokens read as a root-to-node path of the tree, then (optionally) one more: the target's
    choice at that node (any token when the argmax is not the engine's choice)."""
    path = _walk(tokens, parents, nodes)
    past, at = tokens[len(path) - 1 :], path[-1]  # the tokens past the path; the node it ends at
    return len(past) <= 1 if free_last else past in ([], targets[at : at + 1])


def accepted_path(
    tokens: list[int], parents: list[int], nodes: list[int], targets: list[int]
) -> tuple[list[int], int | None]:
    """(accepted nodes, root excluded; bonus): the greedy path where the tokens are a prefix of its
    proposal (a budget or EOS cut what was emitted), else the path the tokens walk."""
    path, greedy = _walk(tokens, parents, nodes), greedy_path(parents, nodes, targets)
    if tokens == ([nodes[i] for i in greedy[1:]] + targets[greedy[-1] : greedy[-1] + 1])[: len(tokens)]:
        path = greedy  # (no targets: the greedy path is the root alone, as the tokens' walk is)
    return path[1:], tokens[len(path) - 1] if len(tokens) == len(path) else None


def greedy_chain(parents: list[int], nodes: list[int], targets: list[int]) -> tuple[list[int], list[int]]:
    """A tree row as the chain a greedy engine verified: the greedy path's drafts, the target's choices on it."""
    if not targets:
        return [], []
    path = greedy_path(parents, nodes, targets)
    return [nodes[i] for i in path[1:]], [targets[i] for i in path]


def _children(parents: list[int], nodes: list[int], at: int, tokens: list[Any]) -> list[int]:
    """The children of node `at` that hold a token of `tokens` (one, or none); plain Python: a
    chain's few nodes are read on every verify row, where numpy's per-call cost is the whole cost."""
    return [c for c, p in enumerate(parents) if p == at and nodes[c] in tokens]


def _walk(tokens: list[int], parents: list[int], nodes: list[int]) -> list[int]:
    """The path the tokens walk from the root (node 0, included), to the first token no child holds."""
    path = [0]
    for token in tokens:
        children = _children(parents, nodes, path[-1], [token])
        if not children:
            break
        path.append(children[0])
    return path


def greedy_path(parents: list[int], nodes: list[int], targets: list[int]) -> list[int]:
    """The first longest chain from the root (included) whose nodes hold the target's choice at their parent."""
    best, stack = [0], [[0]]
    while stack:
        path = stack.pop()
        best = max(best, path, key=len)
        stack.extend([*path, c] for c in _children(parents, nodes, path[-1], targets[path[-1] : path[-1] + 1]))
    return best


def credit(rows: list[Any], groups: list[Any], running: set[int], free_last: bool) -> dict[int, Any]:
    """Which row (`calls.RowRead`) produced each group: its own if its tokens walk the row's tree
    (`consistent`; any last token with `free_last`), else a `running` sequence's row they walk."""
    seqs = [row.seq_id for row in rows]

    def fits(group: Any, r: int) -> bool:
        return consistent(group.tokens, rows[r].parents, rows[r].nodes, rows[r].targets, free_last)

    taken: dict[int, Any] = {}

    def place(group: Any) -> bool:
        own = seqs.index(group.seq_id)
        if own not in taken and fits(group, own):
            taken[own] = group
            return True
        return False

    def split(group: Any) -> list[tuple[int, Any]] | None:
        """The group as consecutive pieces cut where its emits were appended, each fitting a distinct
        free row (its own first), longest first; None when none fits. No piece carries its ending."""
        own, bounds = seqs.index(group.seq_id), [0, *group.cuts, len(group.tokens)]

        def search(a: int, free_rows: set[int]) -> list[tuple[int, Any]] | None:
            if a == len(bounds) - 1:
                return []
            for b in range(len(bounds) - 1, a, -1):  # the longest piece first
                tokens = group.tokens[bounds[a] : bounds[b]]
                piece = replace(group, tokens=tokens, finish_reason=None, cuts=[], late=False)
                for r in sorted(free_rows, key=lambda r: (r != own, r)):  # its own row first, then in order
                    if fits(piece, r):
                        rest = search(b, free_rows - {r})
                        if rest is not None:
                            return [(r, piece), *rest]
            return None

        return search(0, {r for r in range(len(seqs)) if r not in taken and seqs[r] in running})

    # A late group (emitted after a newer call of its sequence: maybe that call's tokens, matched
    # here by its pending token) places after the on-time groups have been read, split included.
    # An on-time group that missed its own row tries it again in vain (still taken, or unfit).
    unfit = []
    for group in [g for g in groups if not g.late and not place(g)] + [g for g in groups if g.late]:
        if place(group):
            continue
        pieces = split(group)
        if pieces is None:
            unfit.append(group)
            continue
        pieces[-1][1].finish_reason = group.finish_reason  # the group's ending is its last piece's
        taken.update(pieces)
    for group in unfit:  # fits no row, whole or split: its own row shows what it got
        taken.setdefault(seqs.index(group.seq_id), group)
    return taken


def row_record(row: Any, group: Any, committed: int) -> RowRecord:
    """The step record of a row (`calls.RowRead`) credited with `group` (`attribution.Group`), its
    sequence holding `committed` tokens; a tree row's with its schema-3 fields."""
    path, bonus = accepted_path(group.tokens, row.parents, row.nodes, row.targets)
    shape: dict[str, Any] = {}
    if row.tree:
        shape.update(
            tree_parents=row.parents, tree_depths=depths_of(row.parents), node_attends=row.attends, tree_path=path
        )
    if row.draft_positions:
        shape["draft_position_ids"] = row.draft_positions
    if min(row.draft_contexts, default=-1) >= 0:
        contexts = row.draft_contexts
        shape.update(draft_kv_lens=contexts, draft_kv_len=contexts[0], draft_kv_len_expected=committed - 1)
    lead = next((n for value, n in row.runs[:1] if value == 0), 0)  # the padding the mask starts with
    return RowRecord(
        row=row.row,
        seq_id=row.seq_id,
        committed_before=committed,
        left_pad=min(lead, row.cache + row.rq.pending),
        left_pad_after=None,
        pending_token=row.nodes[0],
        draft_tokens=row.drafts,
        target_tokens=row.targets,
        accepted=len(path),
        bonus=bonus,
        emitted=list(group.tokens),
        write_seq=group.seq_id,
        position_ids=row.positions,
        mask_rle=row.runs,
        kv_len=max(row.context, 0),
        kv_len_expected=committed - 1,
        finished=group.finish_reason is not None,
        finish_reason=group.finish_reason,
        query_causal=row.causal,
        **shape,
    )


def kept_nodes(call: Any, row: int, rq: Any, later: Any, later_row: int, later_rq: Any) -> list[int] | None:
    """The tree row's nodes whose KV the sequence's next target call attends at its pending token,
    where the KV was kept by index, its keys beginning where this call's end (docs/watch-trees.md):
    a packed call's by the next packed call's first token's view (`held`); None otherwise."""
    n = len(call.trees[row])
    if call.node_keys is not None:  # packed over [cache | query]
        if (
            later.node_keys is None
            or later_rq.pending != 0
            or later.node_keys[0] - later.segments[0][1] != call.keys_end
        ):
            return None  # not packed the same way, or keys moved (another call between)
        first, line = call.node_keys[row] + rq.pending, later.held[later_row][0]
    else:
        first, line = call.cache_width + rq.pending, later.views[later_row].keys(later_rq.pending)
        before = call.views[row].keys(rq.pending)
        if before is None or line is None or later.cache_width != call.cache_width + call.query_len:
            return None
        # Kept by index: the context it attended is still attended where it was (a cache compacted or
        # shifted since can match the widths alone).
        if any(was and not now for was, now in zip(before[: call.cache_width], line)):
            return None
    return slots_on(line[first : first + n])


def alternatives(steps: list[Any]) -> int:
    """The header's `tree_branches`: the most nodes a tree row held off its longest chain (0: no tree)."""
    shapes = [r.tree_parents for s in steps for r in s.rows if r.tree_parents]
    return max((len(parents) - 1 - max(depths_of(parents)) for parents in shapes), default=0)
