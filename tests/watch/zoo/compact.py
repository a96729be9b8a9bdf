"""Continuous batching's bookkeeping without newcomers: a row that reaches the budget leaves the
batch, which is compacted, and the rows left are reordered every step (longest sequence first),
their cache rows, mask rows and lengths moved together (`DynamicCache.batch_select_indices`).
Each row drafts min(k, tokens left - 1), so rows finish at different steps.

Bug "positions": the lengths are not moved, so a moved row's positions count the row it took.
Bug "stale_kv": the cache and mask rows are not moved either (the first rows are kept).
"""

from __future__ import annotations

import torch

from .common import HoleCache, draft_greedy, verify


@torch.no_grad()
def generate(target, draft, prompts, max_new, k=3, bug=None, w=None):
    seqs = [list(p) for p in prompts]
    outs: list[list[int]] = [[] for _ in prompts]
    cache = HoleCache(target, seqs)
    batch = list(range(len(prompts)))  # the sequence each row holds
    events: list[tuple[int, int]] = []
    step = 0
    while batch:
        if w is not None:
            w.rows(batch)
        d = [min(k, max_new - len(outs[s]) - 1) for s in batch]
        proposals = draft_greedy(draft, [seqs[s] for s in batch], max(d))
        drafts = [p[:n] for p, n in zip(proposals, d)]
        targets = cache.forward([[seqs[s][-1]] + x for s, x in zip(batch, drafts)]).argmax(-1).tolist()
        kept = []
        for r, s in enumerate(batch):
            a = verify(drafts[r], targets[r])
            tokens = drafts[r][:a] + [targets[r][a]]
            kept.append(len(tokens))
            seqs[s] += tokens
            outs[s] += tokens
            if w is not None:
                w.emit(s, tokens, "length" if len(outs[s]) >= max_new else None)
        cache.keep(kept)
        live = [r for r, s in enumerate(batch) if len(outs[s]) < max_new]
        order = sorted(live, key=lambda r: (-len(seqs[batch[r]]), batch[r]))
        lens, first = list(cache.lens), list(range(len(order)))
        cache.select(first if bug == "stale_kv" else order)  # cache rows, mask rows and lengths
        cache.lens = [lens[r] for r in (first if bug == "positions" else order)]
        moved = [r for r, o in enumerate(order) if lens[o] != lens[r]]
        if bug and moved and not events:
            events.append((step + 1, batch[order[moved[0]]]))
        batch = [batch[r] for r in order]
        step += 1
    return outs, events
