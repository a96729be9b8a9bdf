"""A right-padded batch whose prefill emits each row's first token (from its last real slot), then
greedy decoding with a cache: every row appends at the same column, so short rows carry the
prefill's padding as a hole. Positions are fed (each row's own count).

Bug "positions": the decode calls feed no position_ids, so the model uses the physical column.
"""

from __future__ import annotations

import torch

PAD = 0


@torch.no_grad()
def generate(target, draft, prompts, max_new, k=0, bug=None, w=None):
    width = max(len(p) for p in prompts)
    ids = torch.tensor([list(p) + [PAD] * (width - len(p)) for p in prompts])
    mask = torch.tensor([[1] * len(p) + [0] * (width - len(p)) for p in prompts])
    out = target(input_ids=ids, attention_mask=mask, use_cache=True)
    last = torch.tensor([len(p) - 1 for p in prompts])
    token = out.logits[torch.arange(len(prompts)), last].argmax(-1)
    cache, lens = out.past_key_values, [len(p) for p in prompts]
    outs: list[list[int]] = [[] for _ in prompts]
    events: list[tuple[int, int]] = []
    for step in range(max_new):
        for r, t in enumerate(token.tolist()):
            outs[r].append(t)
            if w is not None:
                w.emit(r, [t], "length" if len(outs[r]) >= max_new else None)
        if step == max_new - 1:
            break
        mask = torch.cat([mask, torch.ones(len(prompts), 1, dtype=mask.dtype)], 1)
        kwargs = {"position_ids": torch.tensor(lens)[:, None]}
        if bug == "positions":
            kwargs = {}
            if not events:
                events.append((step + 1, next(r for r, n in enumerate(lens) if n < width)))
        out = target(input_ids=token[:, None], attention_mask=mask, past_key_values=cache, use_cache=True, **kwargs)
        cache, token = out.past_key_values, out.logits[:, -1].argmax(-1)
        lens = [n + 1 for n in lens]
    return outs, events
