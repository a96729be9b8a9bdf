"""The oracle: plain decoding of the target, one prompt at a time, no padding.

Deliberately the simplest possible loop, sharing no code with the batched engine: positions are
left to the model (0..n-1 with no padding they are unambiguous), the cache is the model's own.
It is the one oracle of every run, the engine's and watched ones (`specviz.watch`), so it runs
on any transformers 4.45+: the cache keyword is read off the model's forward (`cache_keyword`).
With a repetition penalty the logits first go through transformers' own
`RepetitionPenaltyLogitsProcessor` over the prompt and the tokens so far, as
`generate(repetition_penalty=...)` applies it (the engine's `penalty.py` is its own code).
It also records the top-1 minus top-2 margin of every token (of the logits when greedy, of the
noisy scores when sampling), which the forensics use to tell a floating-point near-tie from a
desync.

At temperature > 0 (coupled sampling) the oracle samples with the keyed noise of
`specviz.engine.sampling`: the token at logical index p of sequence `seq_id` takes the argmax of
its tempered, filtered logits plus the noise keyed by (seed, seq_id, p). That module holds only
the definition of the noise and the filters (the spec of a sample), no engine state or logic.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from specviz.engine.sampling import SamplingParams, noisy_scores, top2_margin


def cache_keyword(model: Any) -> str:
    """transformers 5 takes the cache as `cache=`; 4.x calls it `past_key_values` and would silently
    swallow an unknown keyword (its forward takes **kwargs), decoding without a cache."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _penalised(logits: torch.Tensor, ids: list[int], repetition_penalty: float) -> torch.Tensor:
    """`logits` [1, V] after transformers' repetition penalty over `ids` (prompt + tokens so far)."""
    if repetition_penalty == 1.0:
        return logits
    from transformers import RepetitionPenaltyLogitsProcessor

    history = torch.tensor([ids], device=logits.device)
    return RepetitionPenaltyLogitsProcessor(repetition_penalty)(history, logits.clone())


def _cache_of(out: Any) -> Any:
    cache = getattr(out, "cache", None)
    return cache if cache is not None else getattr(out, "past_key_values", None)


@torch.no_grad()
def greedy_reference(
    model: Any,
    prompt_ids: list[int],
    max_new_tokens: int,
    eos_ids: frozenset[int],
    device: torch.device | None = None,
    repetition_penalty: float = 1.0,
    min_new_tokens: int = 0,
) -> tuple[list[int], list[float]]:
    """Tokens and top-1 minus top-2 logit margins; `device`: the model's own by default.
    `min_new_tokens`: the stop tokens cannot be chosen before that many tokens (vLLM's and
    transformers' `min_tokens`: their logits are masked, so the argmax is the best other token)."""
    device = device if device is not None else next(model.parameters()).device
    keyword = cache_keyword(model)
    out = model(input_ids=torch.tensor([prompt_ids], device=device), use_cache=True)
    tokens: list[int] = []
    margins: list[float] = []
    stops = torch.tensor(sorted(eos_ids), dtype=torch.long, device=device)
    for _ in range(max_new_tokens):
        logits = _penalised(out.logits[:, -1].float(), prompt_ids + tokens, repetition_penalty)[0]
        if len(tokens) < min_new_tokens:
            logits = logits.index_fill(0, stops, float("-inf"))
        top2 = logits.topk(2).values
        token = int(logits.argmax())
        tokens.append(token)
        margins.append(round(float(top2[0] - top2[1]), 6))
        if token in eos_ids or len(tokens) == max_new_tokens:
            break
        out = model(input_ids=torch.tensor([[token]], device=device), use_cache=True, **{keyword: _cache_of(out)})
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
        return greedy_reference(model, prompt_ids, max_new_tokens, eos_ids, device, params.repetition_penalty)
    keyword = cache_keyword(model)
    out = model(input_ids=torch.tensor([prompt_ids], device=device), use_cache=True)
    seq = torch.tensor([seq_id], device=device)
    tokens: list[int] = []
    margins: list[float] = []
    for _ in range(max_new_tokens):
        index = torch.tensor([[len(prompt_ids) + len(tokens)]], device=device)
        logits = _penalised(out.logits[:, -1], prompt_ids + tokens, params.repetition_penalty)[:, None]
        scores = noisy_scores(logits, params, seq, index)[0, 0]
        token = int(scores.argmax())
        tokens.append(token)
        margins.append(round(top2_margin(scores), 6))
        if token in eos_ids or len(tokens) == max_new_tokens:
            break
        out = model(input_ids=torch.tensor([[token]], device=device), use_cache=True, **{keyword: _cache_of(out)})
    return tokens, margins
