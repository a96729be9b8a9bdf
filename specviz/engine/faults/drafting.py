"""Faults of drafting: the draft's positions, a head's carried hidden state, a tree's mask and positions."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from specviz.engine.faults.base import POSITIONS_OFF, Fault
from specviz.trace.invariants import Invariant

if TYPE_CHECKING:
    pass


class DraftPositions(Fault):
    name = "draft-positions"
    invariants = (Invariant.POSITIONS,)
    seen_in = "draft fed the wrong position offset (EAGLE/Medusa-style off-by-one)"
    summary = "the draft is fed position IDs one past the right ones; the target verifies, so outputs stay exact"
    outputs_exact = True

    def draft_positions(self, positions: torch.Tensor) -> torch.Tensor:
        fed = positions + 1
        self.log.rows(fed.ne(super().draft_positions(positions)).any(1), POSITIONS_OFF["draft"])
        return fed


class HeadSourceIndex(Fault):
    name = "head-source-index"
    needs_rows = 2
    invariants = (Invariant.HEAD,)
    seen_in = "vllm-ascend EAGLE-3 proposer: wrong source indices under concurrency"
    summary = "each row's head carry is gathered from the next row's hidden states (an index off by one row)"
    outputs_exact = True
    default_method = "exspec"
    any_layout = True
    needs_proposer = "head"

    def head_source_rows(self, batch_size: int) -> list[int]:
        return [(row + 1) % batch_size for row in range(batch_size)]


class SharedCarry(Fault):
    name = "shared-carry"
    needs_rows = 2
    invariants = (Invariant.HEAD,)
    seen_in = "llama.cpp-fork MTP drafting: sequence 0 hard-coded, carry-over state shared across slots"
    summary = "every row's head reads row 0's carry-over hidden state"
    outputs_exact = True
    default_method = "eqspec"
    any_layout = True
    needs_proposer = "head"

    def carry_rows(self, batch_size: int) -> list[int]:
        return [0] * batch_size


class TreeSiblingMask(Fault):
    name = "tree-sibling-mask"
    invariants = (Invariant.KV,)
    seen_in = "tree attention masks built causally over the flattened tree (siblings visible)"
    summary = "the tree mask lets each node see its siblings listed before it, not only its ancestors"
    default_method = "eqspec"
    any_layout = True
    needs_tree = True

    def tree_attend(self, ancestors: torch.Tensor) -> torch.Tensor:
        size = ancestors.shape[-1]
        # A node sees the flattened block causally: every node listed before it, siblings included.
        causal = torch.ones(size, size, dtype=torch.bool, device=ancestors.device).tril()
        fed = ancestors | causal
        if bool((fed != ancestors).any()):
            for row in range(len(self.log.seqs)):
                self.log.row(row, "tree node attends nodes that are not its ancestors")
        return fed


class TreeNodePositions(Fault):
    name = "tree-node-positions"
    invariants = (Invariant.POSITIONS,)
    seen_in = "tree verification fed positions by node index instead of depth"
    summary = "each tree node's position is the row's next position plus its node index, not its depth"
    default_method = "eqspec"
    any_layout = True
    needs_tree = True

    def tree_positions(self, next_pos: torch.Tensor, depths: torch.Tensor) -> torch.Tensor:
        index = torch.arange(depths.shape[-1], device=next_pos.device)
        if bool((index != depths).any()):
            for row in range(next_pos.shape[0]):
                self.log.row(row, POSITIONS_OFF["verify"])
        return next_pos[:, None] + index[None, :]
