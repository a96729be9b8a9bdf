"""A separate draft model: k single-token forwards on its own KV cache (the classic proposer)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from specviz.engine.kv.state import feed
from specviz.engine.proposers.base import Alternatives, EngineView, NoCarry, Proposals

if TYPE_CHECKING:
    from specviz.engine.batch import Batch
    from specviz.engine.rules import SampleKeys


class DraftModelProposer(NoCarry):
    """k draft tokens per row, one forward each on the draft's own cache (`batch.draft`), at
    explicit positions; the methods keep that cache in step with the target's."""

    name = "draft-model"

    def __init__(self, model: Any) -> None:
        self.cache_model = model

    @classmethod
    def for_run(cls, pair: Any, config: Any) -> DraftModelProposer:
        return cls(pair.draft)

    def propose(
        self, engine: EngineView, batch: Batch, pending: torch.Tensor, keys: SampleKeys | None, branches: int
    ) -> Proposals:
        state, fault, rules = batch.draft, engine.fault, engine.rules
        started = engine.now()
        kv_len, cache_width = state.mask.sum(1), state.width
        tokens = pending[:, None]  # [B, 1]
        drafted, fed_positions, kept_logits, call_kv_lens = [], [], [], []
        alternatives = Alternatives(engine.k, branches, engine.config.tree_kind)
        for j in range(engine.k):
            positions = fault.forward_positions(state.next_pos + j, state.width, 1, "draft")  # [B, 1]
            positions = fault.draft_positions(positions)
            call_kv_lens.append(state.mask.sum(1, keepdim=True))  # the call's one query attends these
            logits = feed(self.cache_model, state, tokens, positions)[:, -1:]  # [B, 1, V]
            tokens = rules.select(logits, keys, offset=j)
            drafted.append(tokens)
            fed_positions.append(positions)
            alternatives.add(j, logits, tokens)
            if rules.keeps_draft_logits:
                kept_logits.append(logits)
        alternative_tokens, tree = alternatives.tree()
        return Proposals(
            tokens=torch.cat(drafted, dim=1),
            positions=torch.cat(fed_positions, dim=1),
            kv_len=kv_len,
            cache_width=cache_width,
            seconds=engine.now() - started,
            logits=torch.cat(kept_logits, dim=1) if kept_logits else None,
            call_kv_lens=torch.cat(call_kv_lens, dim=1),
            alternatives=alternative_tokens,
            tree=tree,
        )
