"""The oracle: plain greedy decoding of the target, one prompt at a time, no padding.

Deliberately the simplest possible loop, sharing no code with the batched engine: positions are
left to the model (0..n-1 with no padding they are unambiguous), the cache is the model's own.
It also records the top-1 minus top-2 logit margin of every token, which the forensics use to tell
a floating-point near-tie from a desync.
"""

from __future__ import annotations

from typing import Any

import torch


@torch.no_grad()
def greedy_reference(
    model: Any,
    prompt_ids: list[int],
    max_new_tokens: int,
    eos_ids: frozenset[int],
    device: torch.device,
) -> tuple[list[int], list[float]]:
    out = model(input_ids=torch.tensor([prompt_ids], device=device), use_cache=True)
    tokens: list[int] = []
    margins: list[float] = []
    for _ in range(max_new_tokens):
        logits = out.logits[0, -1].float()
        top2 = logits.topk(2).values
        token = int(logits.argmax())
        tokens.append(token)
        margins.append(round(float(top2[0] - top2[1]), 6))
        if token in eos_ids or len(tokens) == max_new_tokens:
            break
        cache = out.cache if hasattr(out, "cache") else out.past_key_values
        out = model(input_ids=torch.tensor([[token]], device=device), cache=cache, use_cache=True)
    return tokens, margins
