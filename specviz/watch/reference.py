"""The oracle for watched runs: batch-1 greedy decoding of the target, any transformers 4.45+.

specviz's engine passes its cache as `cache=`; transformers 4.x calls it `past_key_values` and
would silently swallow an unknown keyword (its forward takes **kwargs), decoding without a cache.
So the keyword is chosen from the model's own signature.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch


def cache_keyword(model: Any) -> str:
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _cache_of(out: Any) -> Any:
    cache = getattr(out, "cache", None)
    return cache if cache is not None else getattr(out, "past_key_values", None)


@torch.no_grad()
def greedy_reference(
    model: Any, prompt_ids: list[int], max_new_tokens: int, eos_ids: frozenset[int]
) -> tuple[list[int], list[float]]:
    """Tokens and top-1 minus top-2 logit margins, one prompt, no padding, the model's own positions."""
    device = next(model.parameters()).device
    keyword = cache_keyword(model)
    out = model(input_ids=torch.tensor([prompt_ids], device=device), use_cache=True)
    tokens: list[int] = []
    margins: list[float] = []
    while len(tokens) < max_new_tokens:
        logits = out.logits[0, -1].float()
        top2 = logits.topk(2).values
        token = int(logits.argmax())
        tokens.append(token)
        margins.append(round(float(top2[0] - top2[1]), 6))
        if token in eos_ids or len(tokens) == max_new_tokens:
            break
        step = torch.tensor([[token]], device=device)
        out = model(input_ids=step, use_cache=True, **{keyword: _cache_of(out)})
    return tokens, margins
