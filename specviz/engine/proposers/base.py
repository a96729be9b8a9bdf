"""The proposer seam: what proposes a step's candidate tokens, and the shape they come in.

A `Proposer` turns each row's committed tokens (and, for a head, the target's hidden states) into
`k` draft tokens per row, optionally with one alternative at each of the first depths (a static
tree, `TreeShape`). The step (`engine/step.py`) verifies whatever it proposes; methods never see
the proposer, only `cache_model`: the model whose KV cache they keep beside the target's (the
draft model), or None when the proposer keeps no cache (a head, n-gram lookup).

Adding a proposer is one file in this package plus one line in `PROPOSERS` (`__init__.py`);
docs/architecture.md walks through an example.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, Protocol

import torch

if TYPE_CHECKING:
    from specviz.engine.batch import Batch, SeqState
    from specviz.engine.faults import Fault
    from specviz.engine.rules import SampleKeys, TokenRules


class EngineView(Protocol):
    """What a proposer reads of the engine (`step.Engine` is one): its k, the fault's hooks, the
    token rules, the run's settings (`pad_id`) and its clock."""

    k: int
    fault: Fault
    rules: TokenRules
    config: Any

    def now(self) -> float: ...


@dataclass(frozen=True)
class TreeShape:
    """A static candidate tree: node 0 is the root (the pending token), nodes 1..k the main chain
    (node d at depth d), then one alternative leaf at each depth 1..branches (the proposer's second
    choice there), whose parent is the main-chain node one depth up. Parents precede children, so
    the slots of any root-to-leaf path are in increasing order."""

    k: int
    branches: int

    @cached_property
    def parents(self) -> tuple[int, ...]:
        main = tuple(range(-1, self.k))  # root's parent -1, then node d's parent d - 1
        return main + tuple(range(self.branches))  # alternative at depth d: parent d - 1

    @cached_property
    def depths(self) -> tuple[int, ...]:
        return tuple(range(self.k + 1)) + tuple(range(1, self.branches + 1))

    @property
    def size(self) -> int:
        return 1 + self.k + self.branches

    def ancestors(self, device: torch.device | None = None) -> torch.Tensor:
        """[N, N] bool: node i may attend node j (j is i or one of its ancestors)."""
        out = torch.zeros(self.size, self.size, dtype=torch.bool, device=device)
        for node in range(self.size):
            at = node
            while at >= 0:
                out[node, at] = True
                at = self.parents[at]
        return out

    def children(self, node: int) -> list[int]:
        return [c for c, p in enumerate(self.parents) if p == node]


def accepted_path(tree: TreeShape, node_tokens: list[int], target_tokens: list[int]) -> list[int]:
    """The longest root-to-leaf path whose every node's token is the target's choice at its parent
    (node indices, root excluded). Greedy has one choice per node, so at most one child agrees
    (distinct siblings; a duplicate sibling is never preferred over the main chain, listed first)."""
    path, at = [], 0
    while True:
        nxt = next((c for c in tree.children(at) if node_tokens[c] == target_tokens[at]), None)
        if nxt is None:
            return path
        path.append(nxt)
        at = nxt


@dataclass(frozen=True)
class Proposals:
    """What the proposer proposed (vLLM's `SpeculativeProposals`)."""

    tokens: torch.Tensor  # [B, k] main-chain drafts; k = 0 without a proposer
    positions: torch.Tensor  # [B, k] position ID fed at each draft call (column j: call j)
    kv_len: torch.Tensor | None  # [B] attended draft slots at the first draft call; None: no draft cache
    cache_width: int  # draft cache slots before the first draft call
    seconds: float
    logits: torch.Tensor | None = None  # [B, k, V] the proposer's logits, kept only for rejection sampling
    call_kv_lens: torch.Tensor | None = None  # [B, k] attended draft slots before each draft call
    alternatives: torch.Tensor | None = None  # [B, branches] second choice at depths 1..branches (tree)
    tree: TreeShape | None = None  # None: a chain
    head_sources: list[list[int]] | None = None  # per row [seq_id, logical index] of the hidden state fed; [] none

    @property
    def k(self) -> int:
        return self.tokens.shape[1]

    @property
    def node_tokens(self) -> torch.Tensor:
        """[B, N - 1] the tree's nodes after the root, in node order (the chain when no tree)."""
        if self.alternatives is None:
            return self.tokens
        return torch.cat([self.tokens, self.alternatives], dim=1)

    @classmethod
    def none(cls, pending: torch.Tensor) -> Proposals:
        """The baseline's: no proposer, nothing proposed, the target decodes one token per row."""
        empty = pending.new_zeros(pending.shape[0], 0)
        return cls(tokens=empty, positions=empty, kv_len=None, cache_width=0, seconds=0.0)


class Proposer(Protocol):
    """One way of proposing drafts. `propose` is called once per step; the other two let a proposer
    that reads the target's hidden states keep them per sequence (the others ignore them)."""

    name: str
    cache_model: Any | None  # a model whose KV cache the methods keep per row (the draft), or None
    needs_hidden: bool  # the engine captures the target's last hidden states for `prefilled`/`verified`

    def propose(
        self, engine: EngineView, batch: Batch, pending: torch.Tensor, keys: SampleKeys | None, branches: int
    ) -> Proposals: ...

    def prefilled(self, engine: EngineView, seqs: list[SeqState], hidden: torch.Tensor, last: list[int]) -> None:
        """After a target prefill: `hidden` [B, W, H], `last[r]` the column of row r's last cached token (-1: none)."""

    def verified(
        self,
        engine: EngineView,
        seqs: list[SeqState],
        committed: list[int],
        hidden: torch.Tensor,
        slots: list[int],
        depths: list[int],
    ) -> None:
        """After verification: `hidden` [B, q, H]; row r's next carry is its query slot `slots[r]`,
        `depths[r]` tokens past its pending one."""


class NoCarry:
    """Mixin of proposers that read no hidden state."""

    needs_hidden = False

    def prefilled(self, engine: EngineView, seqs: list[SeqState], hidden: torch.Tensor, last: list[int]) -> None:
        return None

    def verified(
        self,
        engine: EngineView,
        seqs: list[SeqState],
        committed: list[int],
        hidden: torch.Tensor,
        slots: list[int],
        depths: list[int],
    ) -> None:
        return None


def second_choice(logits: torch.Tensor, first: torch.Tensor) -> torch.Tensor:
    """[B, 1] the best token other than `first` [B, 1] in `logits` [B, 1, V] (a tree's alternative)."""
    masked = logits.scatter(-1, first[..., None], float("-inf"))
    return masked.argmax(-1)
