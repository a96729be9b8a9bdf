"""A sequence joins a running batch: the last prompt waits `join` steps, then is prefilled on its
own (all but its pending token) and its cache row is inserted at row `at` of the batch cache
(left-padded to one width), moving the rows after it down. Greedy decoding with a cache.

Bug "positions": the newcomer's length is taken as the batch cache's width (its padding counted).
"""

from __future__ import annotations

import torch

from .common import HoleCache


@torch.no_grad()
def generate(target, draft, prompts, max_new, k=0, bug=None, w=None, join=2, at=1):
    seqs = [list(p) for p in prompts]
    outs: list[list[int]] = [[] for _ in prompts]
    batch = list(range(len(prompts) - 1))  # the sequence each row holds
    cache = HoleCache(target, seqs[:-1])
    events: list[tuple[int, int]] = []
    step = 0
    while batch:
        if step == join:
            newcomer = HoleCache(target, seqs[-1:])
            cache.join(newcomer, at)
            batch.insert(at, len(prompts) - 1)
            if bug == "positions":
                cache.lens[at] = cache.mask.shape[1]
                events.append((step, len(prompts) - 1))
        if w is not None:
            w.rows(batch)
        targets = cache.forward([[seqs[s][-1]] for s in batch]).argmax(-1).tolist()
        for r, s in enumerate(batch):
            seqs[s].append(targets[r][0])
            outs[s].append(targets[r][0])
            if w is not None:
                w.emit(s, [targets[r][0]], "length" if len(outs[s]) >= max_new else None)
        cache.keep([1] * len(batch))
        live = [r for r, s in enumerate(batch) if len(outs[s]) < max_new]
        cache.select(live)
        batch = [batch[r] for r in live]
        step += 1
    return outs, events
