"""A proposer added the documented way, by a test: this one file, plus one registry entry that
`tests/test_proposer_registry.py` adds for its tests and removes after (`REGISTRY["echo"]`)."""

from __future__ import annotations

from typing import Any

import torch

from specviz.engine.proposers.base import NoCarry, Proposals


class EchoProposer(NoCarry):
    """Drafts the row's pending token k times: no model, no cache, no scores, chains only.

    A poor guess that the target mostly rejects, which is the point: a proposer only moves
    acceptance, never what the target emits."""

    name = "echo"
    cache_model = None

    @classmethod
    def for_run(cls, pair: Any, config: Any) -> EchoProposer:
        return cls()

    def propose(self, engine: Any, batch: Any, pending: torch.Tensor, keys: Any, branches: int) -> Proposals:
        started, k = engine.now(), engine.k
        tokens = pending[:, None].expand(-1, k).contiguous()  # [B, k]
        committed = torch.tensor([s.committed for s in batch.seqs], device=pending.device)  # [B]
        return Proposals(
            tokens=tokens,
            positions=committed[:, None] + torch.arange(k, device=pending.device)[None, :],  # [B, k] logical indices
            kv_len=None,
            cache_width=0,
            seconds=engine.now() - started,
        )
