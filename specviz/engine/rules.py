"""The engine's token rules: how the draft proposes, and how verification accepts.

Three modes (`SamplingParams.mode`):
- `greedy`: argmax for both; accept the longest prefix where draft == target.
- `coupled`: both models take the argmax of their own tempered logits plus the same keyed noise
  (`sampling.py`), so a draft token is accepted exactly when it equals the target's coupled
  sample, and the output is token-exact against the coupled batch-1 reference.
- `rejection`: standard speculative rejection sampling (Leviathan et al. 2023, Chen et al. 2023).
  The draft samples x ~ q, verification accepts it with probability min(1, p(x) / q(x)), and at
  the first rejection samples from norm(max(0, p - q)); after k acceptances the bonus comes from
  p. The output is distributed as sampling from p, not token-exact against anything.

Every random draw is keyed by (seed, seq_id, logical index, stream), never by row or step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from specviz.engine.penalty import penalize
from specviz.engine.sampling import (
    STREAM_ACCEPT,
    STREAM_RESIDUAL,
    SamplingParams,
    keyed_gumbel,
    keyed_uniform,
    probabilities,
    sample_coupled,
)

# (p(x), q(x)) -> acceptance probability per drafted token; swappable so tests can show that a
# wrong rule fails the distribution test.
AcceptRatio = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class SampleKeys:
    """Which sequence each row holds and the logical index of the first token it chooses this step."""

    seq_ids: torch.Tensor  # [B]
    first: torch.Tensor  # [B]: committed tokens before the step = index of the first new token
    seen: torch.Tensor | None = None  # [B, V] bool: each row's penalty history (None: no penalty)

    def at(self, offsets: torch.Tensor | int, width: int = 1) -> torch.Tensor:
        """Logical indices [B, width] starting `offsets` tokens after `first`."""
        steps = torch.arange(width, device=self.first.device)
        return (self.first + offsets)[:, None] + steps[None, :]


def standard_ratio(p_x: torch.Tensor, q_x: torch.Tensor) -> torch.Tensor:
    """min(1, p(x) / q(x)); x was drawn from q, so q(x) > 0 up to float underflow."""
    return (p_x / q_x.clamp(min=torch.finfo(q_x.dtype).tiny)).clamp(max=1.0)


@dataclass
class TokenRules:
    """`select` for proposing (and for coupled / greedy verification), `verify` for accepting."""

    params: SamplingParams = SamplingParams()
    ratio: AcceptRatio = standard_ratio

    @property
    def keeps_draft_logits(self) -> bool:
        """Rejection sampling needs the draft's distribution q at verification."""
        return self.params.mode == "rejection"

    @property
    def penalizes(self) -> bool:
        return self.params.repetition_penalty != 1.0

    def select(
        self, logits: torch.Tensor, keys: SampleKeys | None, offset: int = 0, before: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Tokens [B, q] for logits [B, q, V] whose first slot chooses the token at `first + offset`.

        `before` [B, m]: the tokens chosen this step ahead of these slots (the repetition penalty
        counts them)."""
        if keys is not None and keys.seen is not None and self.penalizes:
            logits = penalize(logits, keys.seen, before, self.params.repetition_penalty)
        if self.params.greedy or keys is None:
            return logits.argmax(-1)
        return sample_coupled(logits, self.params, keys.seq_ids, keys.at(offset, logits.shape[1]))

    def verify(
        self,
        drafts: torch.Tensor,
        draft_logits: torch.Tensor | None,
        target_logits: torch.Tensor,
        keys: SampleKeys | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(matched [B], target_tokens [B, k + 1]): drafts the rule accepts, and what the target chose.

        Greedy and coupled: the target's own choice at each slot; matched = agreeing prefix.
        Rejection: target_tokens records what the engine sampled: the accepted drafts, then the
        residual (or bonus) sample at the first rejected slot, then the target's plain samples.
        """
        if self.params.mode != "rejection" or keys is None:
            target_tokens = self.select(target_logits, keys, before=drafts)
            return agreeing_prefix(drafts, target_tokens[:, : drafts.shape[1]]), target_tokens
        return self._rejection(drafts, draft_logits, target_logits, keys)

    def _rejection(
        self,
        drafts: torch.Tensor,
        draft_logits: torch.Tensor | None,
        target_logits: torch.Tensor,
        keys: SampleKeys,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        batch, k = drafts.shape
        params = self.params
        indices = keys.at(0, k + 1)
        p = probabilities(target_logits, params)  # [B, k + 1, V]
        if k:
            if draft_logits is None:
                raise ValueError("rejection sampling needs the draft's logits")
            q = probabilities(draft_logits, params)  # [B, k, V]
            p_x = p[:, :k].gather(-1, drafts[..., None]).squeeze(-1)
            q_x = q.gather(-1, drafts[..., None]).squeeze(-1)
            coin = keyed_uniform(params.seed, STREAM_ACCEPT, keys.seq_ids, indices[:, :k])
            ok = coin < self.ratio(p_x, q_x)
            matched = ok.long().cumprod(1).sum(1)
            residual = (p[:, :k] - q).clamp(min=0)
            # p == q everywhere leaves no residual mass: a rejection then cannot happen with the
            # standard ratio; fall back to p so a swapped-in ratio still samples something.
            empty = residual.sum(-1, keepdim=True) <= 0
            weights = torch.cat([torch.where(empty, p[:, :k], residual), p[:, k:]], dim=1)
        else:
            matched = torch.zeros(batch, dtype=torch.long, device=drafts.device)
            weights = p
        noise = keyed_gumbel(params.seed, STREAM_RESIDUAL, keys.seq_ids, indices, p.shape[-1])
        sampled = (weights.log() + noise).argmax(-1)  # Gumbel-max on unnormalised weights
        slots = torch.arange(k + 1, device=drafts.device)[None, :]
        padded = torch.cat([drafts, drafts.new_zeros(batch, 1)], dim=1)
        return matched, torch.where(slots < matched[:, None], padded, sampled)


def agreeing_prefix(drafts: torch.Tensor, target_tokens: torch.Tensor) -> torch.Tensor:
    """Per row, how many leading drafts equal the target's choice at the same slot."""
    return (drafts == target_tokens).long().cumprod(1).sum(1)
