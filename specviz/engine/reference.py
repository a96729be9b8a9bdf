"""The oracle: plain decoding of the target, one prompt at a time, no padding.

Deliberately the simplest possible loop, sharing no code with the batched engine: positions are
left to the model (0..n-1 with no padding they are unambiguous), the cache is the model's own.
It also records the top-1 minus top-2 margin of every token (of the logits when greedy, of the
noisy scores when sampling), which the forensics use to tell a floating-point near-tie from a
desync.

At temperature > 0 (coupled sampling) the oracle samples with the keyed noise of
`specviz.engine.sampling`: the token at logical index p of sequence `seq_id` takes the argmax of
its tempered, filtered logits plus the noise keyed by (seed, seq_id, p). That module holds only
the definition of the noise and the filters (the spec of a sample), no engine state or logic.
"""

from __future__ import annotations

from typing import Any

import torch

from specviz.engine.sampling import SamplingParams, noisy_scores, top2_margin


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


@torch.no_grad()
def sampled_reference(
    model: Any,
    prompt_ids: list[int],
    max_new_tokens: int,
    eos_ids: frozenset[int],
    device: torch.device,
    params: SamplingParams,
    seq_id: int,
) -> tuple[list[int], list[float]]:
    """Coupled sampling of the target at batch 1: (tokens, top-1 minus top-2 noisy score)."""
    if params.greedy:
        return greedy_reference(model, prompt_ids, max_new_tokens, eos_ids, device)
    out = model(input_ids=torch.tensor([prompt_ids], device=device), use_cache=True)
    seq = torch.tensor([seq_id], device=device)
    tokens: list[int] = []
    margins: list[float] = []
    for _ in range(max_new_tokens):
        index = torch.tensor([[len(prompt_ids) + len(tokens)]], device=device)
        scores = noisy_scores(out.logits[:, -1:], params, seq, index)[0, 0]
        token = int(scores.argmax())
        tokens.append(token)
        margins.append(round(top2_margin(scores), 6))
        if token in eos_ids or len(tokens) == max_new_tokens:
            break
        cache = out.cache if hasattr(out, "cache") else out.past_key_values
        out = model(input_ids=torch.tensor([[token]], device=device), cache=cache, use_cache=True)
    return tokens, margins
