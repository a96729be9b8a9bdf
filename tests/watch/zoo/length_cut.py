"""Drafts cut near the length limit: each row drafts min(k, tokens left - 1), down to 0.

Bug "accounting": after a rejection, the row also keeps the first rejected draft.
"""

from __future__ import annotations

import torch

from .common import HoleCache, draft_greedy, verify


@torch.no_grad()
def generate(target, draft, prompts, max_new, k=3, bug=None, w=None):
    seqs = [list(p) for p in prompts]
    outs: list[list[int]] = [[] for _ in prompts]
    cache = HoleCache(target, seqs)
    events: list[tuple[int, int]] = []
    step = 0
    while any(len(o) < max_new for o in outs):
        left = [max_new - len(o) for o in outs]
        d = [min(k, n - 1) if n > 0 else 0 for n in left]
        proposals = draft_greedy(draft, seqs, max(d))
        drafts = [p[:n] for p, n in zip(proposals, d)]
        queries = [[s[-1]] + x if n > 0 else [] for s, x, n in zip(seqs, drafts, left)]
        targets = cache.forward(queries).argmax(-1).tolist()
        kept = [0] * len(seqs)
        for r in range(len(seqs)):
            if left[r] <= 0:
                continue
            a = verify(drafts[r], targets[r])
            if bug == "accounting" and a < d[r] and a + 1 < left[r]:
                if not events:
                    events.append((step, r))
                a += 1  # keeps a draft the target rejected
            tokens = drafts[r][:a] + [targets[r][a]]
            kept[r] = 1 + a
            seqs[r] += tokens
            outs[r] += tokens
            if w is not None:
                w.emit(r, tokens, "length" if len(outs[r]) >= max_new else None)
        cache.keep(kept)
        step += 1
    return outs, events
