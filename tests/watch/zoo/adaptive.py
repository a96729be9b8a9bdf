"""Per-row adaptive draft lengths: a row drafts one more token after a fully accepted step and
falls back to one after a rejection (d in 1..k, ragged within a step).

Bug "stale_kv": rejected drafts stay attended in the cache (their slots are never masked out).
"""

from __future__ import annotations

import torch

from .common import HoleCache, draft_greedy, verify


@torch.no_grad()
def generate(target, draft, prompts, max_new, k=3, bug=None, w=None):
    seqs = [list(p) for p in prompts]
    outs: list[list[int]] = [[] for _ in prompts]
    lengths = [1] * len(prompts)
    cache = HoleCache(target, seqs)
    events: list[tuple[int, int]] = []
    step = 0
    while any(len(o) < max_new for o in outs):
        live = [r for r in range(len(seqs)) if len(outs[r]) < max_new]
        d = {r: min(lengths[r], k, max_new - len(outs[r]) - 1) for r in live}
        proposals = draft_greedy(draft, [seqs[r] for r in live], max(d.values()))
        drafts = {r: p[: d[r]] for r, p in zip(live, proposals)}
        queries = [[seqs[r][-1]] + drafts[r] if r in d else [] for r in range(len(seqs))]
        targets = cache.forward(queries).argmax(-1).tolist()
        kept = [0] * len(seqs)
        attended = [0] * len(seqs)
        for r in live:
            a = verify(drafts[r], targets[r])
            tokens = drafts[r][:a] + [targets[r][a]]
            kept[r] = attended[r] = 1 + a
            if bug == "stale_kv" and a < d[r]:
                attended[r] = 1 + d[r]  # the rejected drafts' slots stay attended
                if not events:
                    events.append((step + 1, r))
            lengths[r] = lengths[r] + 1 if a == d[r] else 1
            seqs[r] += tokens
            outs[r] += tokens
            if w is not None:
                w.emit(r, tokens, "length" if len(outs[r]) >= max_new else None)
        cache.keep(kept, attended)
        step += 1
    return outs, events
