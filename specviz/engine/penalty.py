"""Repetition penalty with transformers' semantics, applied where the engine chooses tokens.

transformers' `RepetitionPenaltyLogitsProcessor` (`generate(repetition_penalty=p)`): every token
that occurs in the sequence so far, prompt included, has its logit divided by p where positive
and multiplied by p where negative; applied to the raw logits, before temperature and filters.
So the choice at a slot depends on the tokens before it: for a speculative step, the sequence's
history (prompt + output, the pending token included) plus the drafts before that slot. The
engine keeps each sequence's history (`SeqState.penalty_history`), appended after every step with
the tokens the step emitted: all of them (SGLang PR #33643 and vLLM #30122 appended one).
The oracle (`reference.py`) applies transformers' own processor, sharing no code with this.
"""

from __future__ import annotations

import torch


def seen_tokens(histories: list[list[int]], vocab: int, device: torch.device) -> torch.Tensor:
    """[B, V] bool: the tokens each row's history holds."""
    seen = torch.zeros(len(histories), vocab, dtype=torch.bool, device=device)
    for row, history in enumerate(histories):
        if history:
            seen[row, torch.tensor(history, device=device)] = True
    return seen


def penalize(logits: torch.Tensor, seen: torch.Tensor, before: torch.Tensor | None, penalty: float) -> torch.Tensor:
    """`logits` [B, q, V] with each slot's repeated tokens penalised.

    `seen` [B, V]: the history before the step; `before` [B, m]: tokens chosen this step ahead of
    the slots (drafts), slot i seeing the first m - q + 1 + i of them (a verify block of
    [pending, d1..dk] has q = k + 1 slots after m = k drafts: slot i follows d1..di)."""
    batch, q, vocab = logits.shape
    present = seen[:, None, :].expand(batch, q, vocab).clone()  # [B, q, V]
    if before is not None and before.shape[1]:
        m = before.shape[1]
        onehot = torch.zeros(batch, m, vocab, dtype=torch.bool, device=logits.device)
        onehot.scatter_(2, before[..., None], True)
        upto = onehot.cumsum(1).bool()  # [B, m, V]: tokens among the first j + 1 drafts
        for slot in range(q):
            count = m - q + 1 + slot
            if count > 0:
                present[:, slot] |= upto[:, min(count, m) - 1]
    penalised = torch.where(logits < 0, logits * penalty, logits / penalty)
    return torch.where(present, penalised, logits)
