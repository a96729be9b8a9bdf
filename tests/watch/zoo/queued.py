"""Continuous batching with a waiting queue: at most `rows` sequences decode at once; the others
wait. A newcomer is prefilled alone (all but its pending token) and its cache row merged into the
batch cache (`common.HoleCache.join`); finished sequences leave (their rows are dropped); every
step the rows are re-sorted, longest sequence first, so a sequence changes row often. Each
request has its own budget (`max_new` a list) and ends with `emit(..., "length")` there. The draft
model proposes up to k tokens per row, fewer near a row's own budget (ragged drafts). The engine
declares its rows each step (`w.rows`), the short form for a padded [B, T] batch.

Bugs, each breaking one invariant at (step, sequence) = events[0]:
- "kv_mixup": at the first re-sort after step 0 that moves rows, the cache rows and lengths move but the
  attention-mask rows stay where they were: a row attends another sequence's slot pattern (KV,
  at the lowest row whose attended count changed);
- "positions": the first newcomer after step 0 has its length taken as the batch cache's width, padding counted
  (POSITIONS, at its first step).
"""

from __future__ import annotations

import torch

from .common import HoleCache, draft_greedy, verify
from .shapes import budgets


@torch.no_grad()
def generate(target, draft, prompts, max_new, k=2, bug=None, w=None, rows=3):
    limit = budgets(max_new, len(prompts))
    seqs = [list(p) for p in prompts]
    outs: list[list[int]] = [[] for _ in prompts]
    waiting = list(range(len(prompts)))
    batch: list[int] = []  # the sequence each row holds
    cache: HoleCache | None = None
    events: list[tuple[int, int]] = []
    step = 0
    while waiting or batch:
        while waiting and len(batch) < rows:  # newcomers: prefilled alone, merged at row 0
            s = waiting.pop(0)
            newcomer = HoleCache(target, [seqs[s]])
            if cache is None:
                cache = newcomer
            else:
                cache.join(newcomer, 0)
                if bug == "positions" and step > 0 and not events:
                    cache.lens[0] = cache.mask.shape[1]
                    events.append((step, s))
            batch.insert(0, s)
        order = sorted(range(len(batch)), key=lambda r: (-len(seqs[batch[r]]), batch[r]))
        if order != list(range(len(batch))):
            _resort(cache, order, bug == "kv_mixup" and step > 0 and not events, events, step, batch)
            batch = [batch[r] for r in order]
        if w is not None:
            w.rows(batch)
        left = [limit[s] - len(outs[s]) for s in batch]
        d = [min(k, n - 1) for n in left]
        proposed = draft_greedy(draft, [seqs[s] for s in batch], max(d)) if max(d) else [[] for _ in batch]
        drafts = [p[:n] for p, n in zip(proposed, d)]
        choices = cache.forward([[seqs[s][-1]] + x for s, x in zip(batch, drafts)]).argmax(-1).tolist()
        kept = []
        for r, s in enumerate(batch):
            a = verify(drafts[r], choices[r])
            tokens = drafts[r][:a] + [choices[r][a]]
            kept.append(1 + a)
            seqs[s] += tokens
            outs[s] += tokens
            if w is not None:
                w.emit(s, tokens, "length" if len(outs[s]) >= limit[s] else None)
        cache.keep(kept)
        live = [r for r, s in enumerate(batch) if len(outs[s]) < limit[s]]
        if len(live) < len(batch):
            cache.select(live) if live else None
            batch = [batch[r] for r in live]
        if not batch:
            cache = None
        step += 1
    return outs, events


def _resort(cache: HoleCache, order: list[int], bug: bool, events: list, step: int, batch: list[int]) -> None:
    """Move the cache rows, mask rows and lengths to `order`; with `bug`, the mask rows stay."""
    mask = cache.mask
    cache.select(order)
    if not bug:
        return
    moved = [r for r in range(len(order)) if int(mask[r].sum()) != int(cache.mask[r].sum())]
    if moved:  # the mask really differs in what it attends: the bug shows at this step
        cache.mask = mask
        events.append((step, batch[order[moved[0]]]))
