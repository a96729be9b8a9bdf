"""Which slots of [old | new] a cache keeps after a step, and the tree bookkeeping that decides it:
pure functions of the plan, the verification and the tree (`step.py` calls them)."""

from __future__ import annotations

import torch

from specviz.engine.faults import SlotPlan
from specviz.engine.kv.state import CachePlan
from specviz.engine.proposers.base import TreeShape


def row_parents(tree: TreeShape | None, rows: int) -> list[list[int]] | None:
    """Per row, the parent of each node of its tree (None: a chain)."""
    return None if tree is None else [list(tree.row_parents(r)) for r in range(rows)]


def path_first(paths: list[list[int]] | None, tree: TreeShape | None, device: torch.device) -> torch.Tensor | None:
    """[B, N] a tree's query slots in keeping order: the root, the accepted path (`paths`: each
    row's accepted nodes, root excluded), then the rest."""
    if tree is None or paths is None:
        return None
    order = []
    for path in paths:
        front = [0, *path]
        order.append(front + [s for s in range(tree.size) if s not in front])
    return torch.tensor(order, dtype=torch.long, device=device)


def kept_nodes(plan: CachePlan, old_width: int) -> list[list[int]]:
    """Per row, the query-block nodes whose KV the target plan keeps attended."""
    return [row.nonzero().flatten().tolist() for row in plan.attend[:, old_width:]]


def keep_masks(
    mask_after: torch.Tensor, old_width: int, plan: SlotPlan, order: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Which slots of [old | new] survive the rebuild, and which of those stay attended. The plan
    counts new slots in `order` (default: as written)."""
    old = mask_after[:, :old_width]
    new_width = mask_after.shape[1] - old_width
    if plan.absorb_old_pad:
        retain_old = torch.ones_like(old, dtype=torch.bool)
        attend_old = retain_old
    else:
        retain_old = old.cumsum(1) > 0  # strip leading padding, keep any holes after it
        attend_old = old.bool()
    slots = torch.arange(new_width, device=mask_after.device)[None, :]
    rank = slots if order is None else order.argsort(1)  # each new slot's place in the keeping order
    retain_new = rank < plan.keep_new[:, None]
    attend_new = rank < plan.attend_new[:, None]
    return torch.cat([retain_old, retain_new], 1), torch.cat([attend_old, attend_new], 1)
