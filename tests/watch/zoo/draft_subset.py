"""The draft runs on a subset of the target's rows (the even sequences); the others verify their
pending token alone (d = 0). With `w`, the draft batch is declared (`w.rows(..., model="draft")`)
unless `declare=False`, when the watch matches it by tokens.

Bug "draft_positions": the draft is fed positions one too far.
"""

from __future__ import annotations

import torch

from .common import HoleCache, draft_greedy, verify


@torch.no_grad()
def generate(target, draft, prompts, max_new, k=3, bug=None, w=None, declare=True):
    seqs = [list(p) for p in prompts]
    outs: list[list[int]] = [[] for _ in prompts]
    cache = HoleCache(target, seqs)
    events: list[tuple[int, int]] = []
    step = 0
    while any(len(o) < max_new for o in outs):
        left = [max_new - len(o) for o in outs]
        drafting = [r for r in range(len(seqs)) if r % 2 == 0 and left[r] > 1]
        d = min([k] + [left[r] - 1 for r in drafting])
        drafts = [[] for _ in seqs]
        if drafting:
            if w is not None and declare:
                w.rows(drafting, model="draft")
            shift = 1 if bug == "draft_positions" else 0
            for r, p in zip(drafting, draft_greedy(draft, [seqs[r] for r in drafting], d, shift)):
                drafts[r] = p
            if bug and not events:
                events.append((step, drafting[0]))
        queries = [[s[-1]] + x if n > 0 else [] for s, x, n in zip(seqs, drafts, left)]
        targets = cache.forward(queries).argmax(-1).tolist()
        kept = [0] * len(seqs)
        for r in range(len(seqs)):
            if left[r] <= 0:
                continue
            a = verify(drafts[r], targets[r])
            tokens = drafts[r][:a] + [targets[r][a]]
            kept[r] = 1 + a
            seqs[r] += tokens
            outs[r] += tokens
            if w is not None:
                w.emit(r, tokens, "length" if len(outs[r]) >= max_new else None)
        cache.keep(kept)
        step += 1
    return outs, events
