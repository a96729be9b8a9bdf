"""Checks of tree verification and head drafting (schema 3 row fields), row by row.

A tree row's query block is N nodes, node 0 the pending token, `tree_parents[i]` node i's parent
(parents listed before children). With n = `committed_before`:
  POSITIONS: node i is fed at n - 1 + depth(i) (depth from the parents, not the recorded depths);
  KV: node i attends, in the query block, exactly itself and its ancestors (`node_attends`; the
      committed slots are the row's mask, checked by `row_checks.check_kv`); after the commit
      exactly the root and the accepted path keep their KV (`kept_nodes`);
  ACCOUNTING: the accepted path is a root-to-leaf chain of the tree whose every node's token is the
      target's choice at its parent, and no child of its last node also agrees (it is the longest);
      accepted == its length; emitted == its tokens plus the target's choice at its last node, cut
      by the budget and EOS; plus the history checks every row gets.
A head-drafting row (`head_source` recorded, chain or tree):
  HEAD: the head was fed the target hidden state of the row's own sequence at its last cached
      token, [seq_id, n - 2] ([] when n = 1: nothing is cached yet). Breaking it can keep outputs
      exact (the target verifies) and only collapse acceptance: a drafting fault.
"""

from __future__ import annotations

from specviz.analysis.findings import RowFlags
from specviz.analysis.history import History
from specviz.analysis.row_checks import check_against_history, check_bonus_and_destination, check_emitted
from specviz.trace.invariants import Invariant
from specviz.trace.schema import RowRecord

NO_NODE_ATTENDS = ("tree attention per node", "no tree row records node_attends")


def tree_shape_error(row: RowRecord) -> str | None:
    """Why the row's tree fields do not describe a tree over its query block (None: they do)."""
    parents = row.tree_parents or []
    if not parents or parents[0] != -1:
        return "node 0 (the pending token) must be the root, parent -1"
    if any(not 0 <= p < i for i, p in enumerate(parents) if i):
        return "each node's parent must be an earlier node"
    if len(row.position_ids) != len(parents) or len(row.target_tokens) != len(parents):
        return f"{len(parents)} nodes but {len(row.position_ids)} positions and {len(row.target_tokens)} target tokens"
    if len(row.draft_tokens) != len(parents) - 1:
        return f"{len(parents)} nodes but {len(row.draft_tokens)} draft tokens (expected one per node after the root)"
    return None


def depths_of(parents: list[int]) -> list[int]:
    depths: list[int] = []
    for parent in parents:
        depths.append(0 if parent < 0 else depths[parent] + 1)
    return depths


def ancestors_of(parents: list[int], node: int) -> list[int]:
    """The node and its ancestors, ascending."""
    out = []
    while node >= 0:
        out.append(node)
        node = parents[node]
    return sorted(out)


def check_tree_row(flag: RowFlags, history: History) -> None:
    """Every tree rule of one row (replaces the chain's position and acceptance checks)."""
    row = flag.row
    check_against_history(flag, history)
    problem = tree_shape_error(row)
    if problem is not None:
        flag(Invariant.ACCOUNTING, "tree_parents", "a tree over the query block", row.tree_parents, problem)
        return
    parents = row.tree_parents
    depths = depths_of(parents)
    if row.tree_depths is not None and row.tree_depths != depths:
        flag(Invariant.ACCOUNTING, "tree_depths", depths, row.tree_depths, "recorded depths disagree with the parents")
    start = row.committed_before - 1
    expected = [start + d for d in depths]
    if row.position_ids != expected:
        node = next(i for i, (p, e) in enumerate(zip(row.position_ids, expected)) if p != e)
        flag(
            Invariant.POSITIONS,
            "position_ids",
            expected,
            row.position_ids,
            f"tree node {node} (depth {depths[node]}) fed position {row.position_ids[node]}, "
            f"expected committed length - 1 + depth = {expected[node]}",
        )
    _check_attends(flag, parents)
    path = _check_path(flag, history, parents)
    if path is not None and row.kept_nodes is not None and not row.finished and row.kept_nodes != [0, *path]:
        if not _kept_explains_next(row, path, history.next_row(row.seq_id, flag.si)):
            flag.skip(*KEPT_UNREAD)
            return
        flag(
            Invariant.KV,
            "kept_nodes",
            [0, *path],
            row.kept_nodes,
            "after the commit the cache keeps KV of nodes off the accepted path (or drops some of it)",
        )
    check_bonus_and_destination(flag)


# Kept nodes are read off what the sequence's next step attends of this step's block: where that
# step attends a context wrong by more than the kept nodes say (another row's mask), its own KV
# check flags it, and what this step kept is not told.
KEPT_UNREAD = (
    "kept tree nodes",
    "read from the sequence's next step, whose attended context is wrong beyond the kept nodes (flagged there)",
)


def _kept_explains_next(row: RowRecord, path: list[int], later: RowRecord | None) -> bool:
    """The next row's attended context is right, or off by exactly what the kept nodes add or drop (or not said)."""
    if later is None or later.kv_len_expected is None:
        return True
    return later.kv_len - later.kv_len_expected in (0, len(row.kept_nodes) - len(path) - 1)


def _check_attends(flag: RowFlags, parents: list[int]) -> None:
    row = flag.row
    if row.node_attends is None:
        flag.skip(*NO_NODE_ATTENDS)
        return
    if len(row.node_attends) != len(parents):
        flag(Invariant.KV, "node_attends", len(parents), len(row.node_attends), "one attended set per tree node")
        return
    depths = depths_of(parents)
    for node, seen in enumerate(row.node_attends):
        # A node has depth + 1 ancestors (itself included): compare the lengths first, so a crafted
        # file costs what it holds, not its node count times its depth.
        expected = ancestors_of(parents, node) if len(seen) == depths[node] + 1 else None
        if expected is None or sorted(seen) != expected:
            expected = expected or ancestors_of(parents, node)
            extra = sorted(set(seen) - set(expected))
            missing = sorted(set(expected) - set(seen))
            what = f"sees non-ancestor nodes {extra}" if extra else f"misses its ancestors {missing}"
            flag(Invariant.KV, "node_attends", expected, sorted(seen), f"tree node {node} {what}")
            return  # the first broken node; the rest of the row's mask is from the same builder


def _check_path(flag: RowFlags, history: History, parents: list[int]) -> list[int] | None:
    """The accepted path: a chain agreeing with the target, the longest such, counted and emitted."""
    row = flag.row
    path = row.tree_path
    if path is None:
        flag.skip("accepted tree path", "tree rows record no tree_path")
        return None
    nodes = [row.pending_token, *row.draft_tokens]
    at = 0
    for node in path:
        if not 0 < node < len(parents) or parents[node] != at:
            flag(Invariant.ACCOUNTING, "tree_path", "a root-to-leaf chain", path, f"node {node} is not a child of {at}")
            return None
        if nodes[node] != row.target_tokens[at]:
            flag(
                Invariant.ACCOUNTING,
                "tree_path",
                row.target_tokens[at],
                nodes[node],
                f"accepted node {node} holds {nodes[node]}, "
                f"but the target chose {row.target_tokens[at]} after node {at}",
            )
            return None
        at = node
    longer = [c for c, p in enumerate(parents) if p == at and nodes[c] == row.target_tokens[at]]
    if longer:
        flag(
            Invariant.ACCOUNTING,
            "tree_path",
            [*path, longer[0]],
            path,
            f"node {longer[0]} also agrees with the target: the accepted path is not the longest",
        )
    if row.accepted != len(path):
        flag(Invariant.ACCOUNTING, "accepted", len(path), row.accepted, "accepted differs from the path's length")
    proposal = [nodes[node] for node in path] + [row.target_tokens[at]]
    check_emitted(flag, history, proposal, "emitted tokens are not the accepted path's tokens plus the bonus")
    return path


HEAD_UNREAD = (
    "draft head input",
    "what the head was fed is not read: no head call served the row's drafts, or the vector it was "
    "fed matched no hidden state the watch kept (docs/watch-heads.md)",
)


def check_head_row(flag: RowFlags, drafted_by_head: bool = False) -> None:
    """The head was fed the row's own sequence's hidden state at n - 2 (HEAD); a head-drafted row
    (`drafted_by_head`) that does not say what its head was fed: the check is listed as skipped."""
    row = flag.row
    if row.head_source is None:
        if drafted_by_head and row.draft_tokens:
            flag.skip(*HEAD_UNREAD)
        return
    n = row.committed_before
    expected = [row.seq_id, n - 2] if n >= 2 else []
    if list(row.head_source) != expected:
        source = (
            "no hidden state"
            if not row.head_source
            else f"sequence {row.head_source[0]} at index {row.head_source[-1]}"
        )
        flag(
            Invariant.HEAD,
            "head_source",
            expected,
            list(row.head_source),
            f"draft head fed {source}; expected its own sequence at index {n - 2} "
            "(a drafting fault: outputs may stay exact while acceptance falls)",
        )


def first_broken_node(row: RowRecord) -> int | None:
    """The lowest tree node the row's own fields show broken (fed the wrong position, attending a
    non-ancestor, accepted against the target, or kept off the path), for the tree picture; None
    when none is (or the fields do not describe a tree)."""
    if row.tree_parents is None or tree_shape_error(row) is not None:
        return None
    parents = row.tree_parents
    start = row.committed_before - 1
    broken = [i for i, (p, d) in enumerate(zip(row.position_ids, depths_of(parents))) if p != start + d][:1]
    depths = depths_of(parents)
    attends = row.node_attends or []
    # One list per node: a longer node_attends is read as far as the tree goes (the check flags it).
    for node, seen in enumerate(attends[: len(parents)]):
        if len(seen) != depths[node] + 1 or sorted(seen) != ancestors_of(parents, node):
            broken.append(node)
            break
    if row.node_attends is not None and len(attends) < len(parents):
        broken.append(len(attends))  # the first node with no attention recorded
    nodes = [row.pending_token, *row.draft_tokens]
    at = 0
    for node in row.tree_path or []:
        if not 0 < node < len(parents) or parents[node] != at or nodes[node] != row.target_tokens[at]:
            broken.append(node if 0 < node < len(parents) else at)
            break
        at = node
    if row.kept_nodes is not None and row.tree_path is not None and not row.finished:
        broken.extend(set(row.kept_nodes) ^ {0, *row.tree_path})
    return min(broken) if broken else None
