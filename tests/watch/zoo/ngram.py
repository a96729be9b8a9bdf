"""Draft-free speculation (prompt lookup): no draft model. Each row proposes the k tokens that
followed the latest earlier occurrence of its last token in its own sequence (none when there is
no such occurrence), and the target verifies them with a cache (ragged queries, rejected slots
masked out as holes). The draft model passed in is never called.

Bug "positions": a row that proposes drafts feeds its query's positions one too far.
"""

from __future__ import annotations

import torch

from .common import HoleCache, verify


def lookup(seq: list[int], k: int) -> list[int]:
    """The k tokens after the latest earlier occurrence of the last token (fewer at the end)."""
    for start in range(len(seq) - 2, -1, -1):
        if seq[start] == seq[-1]:
            return seq[start + 1 : start + 1 + k]
    return []


@torch.no_grad()
def generate(target, draft, prompts, max_new, k=3, bug=None, w=None):
    seqs = [list(p) for p in prompts]
    outs: list[list[int]] = [[] for _ in prompts]
    cache = HoleCache(target, seqs)
    events: list[tuple[int, int]] = []
    step = 0
    while any(len(o) < max_new for o in outs):
        live = [r for r in range(len(seqs)) if len(outs[r]) < max_new]
        drafts = {r: lookup(seqs[r], min(k, max_new - len(outs[r]) - 1)) for r in live}
        queries = [[seqs[r][-1]] + drafts[r] if r in drafts else [] for r in range(len(seqs))]
        shift = [1 if bug == "positions" and drafts.get(r) else 0 for r in range(len(seqs))]
        if any(shift) and not events:
            events.append((step, shift.index(1)))
        cache.lens = [n + s for n, s in zip(cache.lens, shift)]
        targets = cache.forward(queries).argmax(-1).tolist()
        cache.lens = [n - s for n, s in zip(cache.lens, shift)]
        kept = [0] * len(seqs)
        for r in live:
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
