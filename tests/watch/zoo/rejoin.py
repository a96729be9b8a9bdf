"""Greedy decoding that re-prefills the whole batch when a sequence joins: the last prompt waits
`join` steps, then every row's committed tokens but the pending one are prefilled again, left-padded.

Bug "stale_kv": the re-prefill also caches the pending token, which the next call feeds again.
"""

from __future__ import annotations

import torch

from .common import left_padded


def prefill(target, seqs, drop):
    """Every sequence but its last `drop` tokens, left-padded."""
    ids, mask = left_padded([s[: len(s) - drop] for s in seqs])
    out = target(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(1) - 1).clamp(min=0))
    return out.past_key_values, mask


@torch.no_grad()
def generate(target, draft, prompts, max_new, k=0, bug=None, w=None, join=2):
    seqs = [list(p) for p in prompts]
    outs: list[list[int]] = [[] for _ in prompts]
    events: list[tuple[int, int]] = []
    batch = list(range(len(prompts) - 1))
    cache, mask = prefill(target, [seqs[s] for s in batch], 1)
    step = 0
    while any(len(outs[s]) < max_new for s in range(len(prompts))):
        if step == join:
            batch = list(range(len(prompts)))
            stale = bug == "stale_kv"
            cache, mask = prefill(target, [seqs[s] for s in batch], 0 if stale else 1)
            if stale:
                events.append((step, 0))
        live = [s for s in batch if len(outs[s]) < max_new]
        if w is not None:
            w.rows(batch)
        ids = torch.tensor([[seqs[s][-1]] for s in batch])
        mask = torch.cat([mask, torch.ones(len(batch), 1, dtype=mask.dtype)], 1)
        positions = torch.tensor([[len(seqs[s]) - 1] for s in batch])
        out = target(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        for r, t in enumerate(out.logits[:, -1].argmax(-1).tolist()):
            s = batch[r]
            if s in live:
                seqs[s].append(t)
                outs[s].append(t)
                if w is not None:
                    w.emit(s, [t], "length" if len(outs[s]) >= max_new else None)
        step += 1
    return outs, events
