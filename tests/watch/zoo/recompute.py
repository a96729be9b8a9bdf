"""A speculative loop without any cache: every call re-feeds each row's whole sequence, left-padded,
to the draft (k times) and to the target (sequence + drafts), with positions from the mask.

Bug "mask": the target is fed an all-ones mask, so padded rows attend their padding.
"""

from __future__ import annotations

import torch

from .common import draft_greedy, left_padded, verify


@torch.no_grad()
def generate(target, draft, prompts, max_new, k=3, bug=None, w=None):
    seqs = [list(p) for p in prompts]
    outs: list[list[int]] = [[] for _ in prompts]
    events: list[tuple[int, int]] = []
    step = 0
    while any(len(o) < max_new for o in outs):
        left = [max_new - len(o) for o in outs]
        n = max(0, min(k, min(x for x in left if x > 0) - 1))
        drafts = draft_greedy(draft, seqs, n)
        ids, mask = left_padded([s + x for s, x in zip(seqs, drafts)])
        positions = (mask.cumsum(1) - 1).clamp(min=0)
        if bug == "mask":
            padded = [r for r in range(len(seqs)) if not bool(mask[r, 0])]
            if padded and not events:
                events.append((step, padded[0]))
            mask = torch.ones_like(mask)
        logits = target(input_ids=ids, attention_mask=mask, position_ids=positions).logits
        targets = logits[:, -(n + 1) :].argmax(-1).tolist()
        for r in range(len(seqs)):
            if left[r] <= 0:
                continue
            a = verify(drafts[r], targets[r])
            tokens = (drafts[r][:a] + [targets[r][a]])[: left[r]]
            seqs[r] += tokens
            outs[r] += tokens
            if w is not None:
                w.emit(r, tokens, "length" if len(outs[r]) >= max_new else None)
        step += 1
    return outs, events
