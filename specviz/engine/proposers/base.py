"""The proposer seam: what proposes a step's candidate tokens, and the shape they come in.

A `Proposer` turns each row's committed tokens (and, for a head, the target's hidden states) into
`k` draft tokens per row, optionally with one alternative at each of the first depths (a static
tree, `TreeShape`). The step (`engine/step.py`) verifies whatever it proposes; methods never see
the proposer, only `cache_model`: the model whose KV cache they keep beside the target's (the
draft model), or None when the proposer keeps no cache (a head, n-gram lookup).

Adding a proposer is one file in this package plus its line in the registry
(`specviz/proposers.py`, which says what it can do); docs/architecture.md walks through an example.
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


TREE_KINDS = ("static", "topk")


@dataclass(frozen=True)
class TreeShape:
    """A candidate tree: node 0 is the root (the pending token), nodes 1..k the main chain (node d
    at depth d), then `branches` alternative leaves, each hanging off a main-chain node.

    - static (`alt_parents` None): one alternative at each depth 1..branches (the proposer's second
      choice there), whose parent is the main-chain node one depth up; every row the same shape.
    - top-k (`alt_parents` per row): each row's `branches` best-scored alternatives among the
      proposer's next choices at every depth (`pick_topk`); a row unsure at depth 1 gets several
      there, a confident one gets them deeper. Same node count, so the same verify cost.
    Parents precede children, so the slots of any root-to-leaf path are in increasing order."""

    k: int
    branches: int
    alt_parents: tuple[tuple[int, ...], ...] | None = None  # top-k: per row, each alternative's parent

    @cached_property
    def parents(self) -> tuple[int, ...]:
        """The static tree's parents (row 0's for a top-k tree: use `row_parents`)."""
        return self.row_parents(0)

    @cached_property
    def depths(self) -> tuple[int, ...]:
        return self.row_depths(0)

    @property
    def size(self) -> int:
        return 1 + self.k + self.branches

    def row_parents(self, row: int) -> tuple[int, ...]:
        main = tuple(range(-1, self.k))  # root's parent -1, then node d's parent d - 1
        if self.alt_parents is None:
            return main + tuple(range(self.branches))  # alternative at depth d: parent d - 1
        return main + self.alt_parents[row]

    def row_depths(self, row: int) -> tuple[int, ...]:
        depths: list[int] = []
        for parent in self.row_parents(row):
            depths.append(0 if parent < 0 else depths[parent] + 1)
        return tuple(depths)

    def depth_tensor(self, rows: int, device: torch.device | None = None) -> torch.Tensor:
        """Node depths: [N] for a static tree, [B, N] for a top-k one."""
        if self.alt_parents is None:
            return torch.tensor(self.depths, device=device)
        return torch.tensor([self.row_depths(r) for r in range(rows)], device=device)

    def ancestors(self, device: torch.device | None = None, row: int = 0) -> torch.Tensor:
        """[N, N] bool: node i may attend node j (j is i or one of its ancestors), in row `row`'s tree."""
        parents = self.row_parents(row)
        out = torch.zeros(self.size, self.size, dtype=torch.bool, device=device)
        for node in range(self.size):
            at = node
            while at >= 0:
                out[node, at] = True
                at = parents[at]
        return out

    def attend_mask(self, rows: int, device: torch.device | None = None) -> torch.Tensor:
        """What each node may attend in the query block: [N, N] static, [B, N, N] top-k."""
        if self.alt_parents is None:
            return self.ancestors(device)
        return torch.stack([self.ancestors(device, row) for row in range(rows)])

    def children(self, node: int, row: int = 0) -> list[int]:
        return [c for c, p in enumerate(self.row_parents(row)) if p == node]


def accepted_path(tree: TreeShape, node_tokens: list[int], target_tokens: list[int], row: int = 0) -> list[int]:
    """The longest root-to-leaf path of row `row`'s tree whose every node's token is the target's
    choice at its parent (node indices, root excluded). Greedy has one choice per node, so at most
    one child agrees (distinct siblings; a duplicate sibling is never preferred over the main chain,
    listed first)."""
    path, at = [], 0
    while True:
        nxt = next((c for c in tree.children(at, row) if node_tokens[c] == target_tokens[at]), None)
        if nxt is None:
            return path
        path.append(nxt)
        at = nxt


class Alternatives:
    """A tree's alternatives, gathered while a proposer drafts depth by depth (`add` after each
    depth's choice), then `tree()`: the alternative tokens [B, branches] and the tree's shape."""

    def __init__(self, k: int, branches: int, kind: str = "static") -> None:
        self.k, self.branches, self.kind = k, branches, kind
        self.static: list[torch.Tensor] = []  # static: second choice at depths 1..branches
        self.scores: list[torch.Tensor] = []  # top-k: log-probabilities per depth, [B, V]
        self.chosen: list[torch.Tensor] = []  # top-k: the main chain's token per depth, [B]

    def add(self, depth_index: int, logits: torch.Tensor, chosen: torch.Tensor) -> None:
        """`logits` [B, 1, V] at depth `depth_index + 1`; `chosen` [B, 1] the main chain's token there."""
        if not self.branches:
            return
        if self.kind == "topk":
            self.scores.append(torch.log_softmax(logits[:, -1].float(), dim=-1))
            self.chosen.append(chosen[:, -1])
        elif depth_index < self.branches:
            self.static.append(second_choice(logits, chosen))

    def tree(self) -> tuple[torch.Tensor | None, TreeShape | None]:
        if not self.branches:
            return None, None
        if self.kind != "topk":
            return torch.cat(self.static, dim=1), TreeShape(self.k, self.branches)
        tokens, parents = pick_topk(self.scores, self.chosen, self.branches)
        return tokens, TreeShape(self.k, self.branches, parents)


def pick_topk(
    scores: list[torch.Tensor], chosen: list[torch.Tensor], budget: int
) -> tuple[torch.Tensor, tuple[tuple[int, ...], ...]]:
    """Per row, the `budget` best alternatives among the next `budget` choices at every depth.

    An alternative at depth d scores its path's log-probability under the proposer: the main
    chain's d - 1 tokens, then the alternative (EAGLE-2's ranking, over leaves of the main chain).
    Returns the tokens [B, budget], ordered by depth then score, and each one's parent (node d - 1).
    """
    batch, vocab = scores[0].shape
    width = min(budget, vocab - 1)
    prefix = torch.zeros(batch, device=scores[0].device)  # log-probability of the main chain so far
    cand_scores, cand_tokens = [], []
    for logp, main in zip(scores, chosen):
        others = logp.scatter(-1, main[:, None], float("-inf"))  # never the main chain's own token
        top, tokens = others.topk(width, dim=-1)  # [B, width]
        cand_scores.append(prefix[:, None] + top)
        cand_tokens.append(tokens)
        prefix = prefix + logp.gather(-1, main[:, None])[:, 0]
    flat_scores = torch.cat(cand_scores, dim=1)  # [B, depths * width], depth-major
    flat_tokens = torch.cat(cand_tokens, dim=1)
    best = flat_scores.topk(budget, dim=-1).indices.sort(dim=-1).values  # depth first, then rank (score)
    depth_index = (best // width).tolist()
    return flat_tokens.gather(1, best), tuple(tuple(row) for row in depth_index)


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

    @classmethod
    def for_run(cls, pair: Any, config: Any) -> Proposer:
        """The proposer a run with `config` (a `RunConfig`) drafts with, from the run's `ModelPair`."""

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
