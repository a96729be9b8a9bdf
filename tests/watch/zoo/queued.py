"""Continuous batching with a waiting queue: at most `rows` sequences decode at once; the others
wait. A newcomer is prefilled alone (all but its pending token) and its cache row merged into the
batch cache (`common.HoleCache.join`); finished sequences leave (their rows are dropped); every
step the rows are re-sorted, longest sequence first, so a sequence changes row often. Each
request has its own budget (`max_new` a list) and ends with `emit(..., "length")` there. The draft
model proposes up to k tokens per row, fewer near a row's own budget (ragged drafts): re-reading
each row's whole sequence, or, with `draft_cache`, from its own cache (`DraftRows`), joined,
re-sorted and dropped row for row with the target's. The engine declares its rows each step
(`w.rows`), the short form for a padded [B, T] batch.

Bugs, each breaking one invariant at (step, sequence) = events[0]:
- "kv_mixup": at the first re-sort after step 0 that moves rows, the cache rows and lengths move but the
  attention-mask rows stay where they were: a row attends another sequence's slot pattern (KV,
  at the lowest row whose attended count changed);
- "draft_mixup" (with `draft_cache`): at the first re-sort after step 0 that moves rows, the
  draft's cache rows stay put (its bookkeeping moves): the draft attends another sequence's slot
  pattern (KV on the draft side; the outputs stay right, the acceptance collapses);
- "positions": the first newcomer after step 0 has its length taken as the batch cache's width, padding counted
  (POSITIONS, at its first step).
"""

from __future__ import annotations

import torch

from .common import HoleCache, draft_greedy, verify
from .shapes import budgets, commit, eos_ids, settle


class DraftRows:
    """The draft's own cache, row for row with the target's (`HoleCache`, joined and re-sorted with
    it). Draft call 0 of a step feeds each row what the draft has not cached (its pending token;
    after a fully accepted step also the last draft), call j > 0 the draft before; the rejected
    drafts' slots are masked out after the verify (holes). `has[r]`: committed tokens cached."""

    def __init__(self, draft, seq: list[int]) -> None:
        self.cache = HoleCache(draft, [seq])
        self.has = [len(seq) - 1]

    def join(self, other: DraftRows, at: int) -> None:
        self.cache.join(other.cache, at)
        self.has[at:at] = other.has

    def select(self, rows: list[int], move_cache: bool = True) -> None:
        """Keep these rows in this order; `move_cache=False` moves the bookkeeping only (a bug)."""
        if move_cache:
            self.cache.select(rows)
        self.has = [self.has[r] for r in rows]

    def propose(self, seqs: list[list[int]], d: list[int]) -> tuple[list[list[int]], list[list[int]]]:
        """Each row's d[r] drafts, and the mask column of each draft it fed (draft i at call i + 1)."""
        drafts: list[list[int]] = [[] for _ in seqs]
        columns: list[list[int]] = [[] for _ in seqs]
        for j in range(max(d, default=0)):
            queries = [
                (seq[self.has[r] :] if j == 0 else drafts[r][-1:]) if d[r] > j else [] for r, seq in enumerate(seqs)
            ]
            self.cache.lens = [self.has[r] if j == 0 else len(seq) + j - 1 for r, seq in enumerate(seqs)]
            logits = self.cache.forward(queries)
            for r, query in enumerate(queries):
                if query:
                    drafts[r].append(int(logits[r, len(query) - 1].argmax()))
                    if j > 0:
                        columns[r].append(self.cache.mask.shape[1] - self.cache.q)
        return drafts, columns

    def settle(self, r: int, committed: int, a: int, d: int, columns: list[int]) -> None:
        """Row r accepted a of its d drafts: mask the rejected ones it fed, count the kept ones."""
        for column in columns[a:]:
            self.cache.mask[r, column] = 0
        if d:
            self.has[r] = committed + min(a, d - 1)


@torch.no_grad()
def generate(target, draft, prompts, max_new, k=2, bug=None, w=None, rows=3, draft_cache=0):
    limit = budgets(max_new, len(prompts))
    seqs = [list(p) for p in prompts]
    outs: list[list[int]] = [[] for _ in prompts]
    waiting = list(range(len(prompts)))
    batch: list[int] = []  # the sequence each row holds
    cache: HoleCache | None = None
    drafter: DraftRows | None = None
    eos, done = eos_ids(target), set()
    events: list[tuple[int, int]] = []
    step = 0
    while waiting or batch:
        while waiting and len(batch) < rows:  # newcomers: prefilled alone, merged at row 0
            s = waiting.pop(0)
            newcomer = HoleCache(target, [seqs[s]])
            fresh = DraftRows(draft, seqs[s]) if draft_cache else None
            if cache is None:
                cache, drafter = newcomer, fresh
            else:
                cache.join(newcomer, 0)
                if fresh is not None:
                    drafter.join(fresh, 0)
                if bug == "positions" and step > 0 and not events:
                    cache.lens[0] = cache.mask.shape[1]
                    events.append((step, s))
            batch.insert(0, s)
        order = sorted(range(len(batch)), key=lambda r: (-len(seqs[batch[r]]), batch[r]))
        if order != list(range(len(batch))):
            _resort(cache, order, bug == "kv_mixup" and step > 0 and not events, events, step, batch)
            if drafter is not None:
                _resort_draft(drafter, order, bug == "draft_mixup" and step > 0 and not events, events, step, batch)
            batch = [batch[r] for r in order]
        if w is not None:
            w.rows(batch)
        left = [limit[s] - len(outs[s]) for s in batch]
        d = [min(k, n - 1) for n in left]
        if drafter is not None:
            drafts, columns = drafter.propose([seqs[s] for s in batch], d)
        else:
            proposed = draft_greedy(draft, [seqs[s] for s in batch], max(d)) if max(d) else [[] for _ in batch]
            drafts = [p[:n] for p, n in zip(proposed, d)]
        choices = cache.forward([[seqs[s][-1]] + x for s, x in zip(batch, drafts)]).argmax(-1).tolist()
        kept = []
        for r, s in enumerate(batch):
            a = verify(drafts[r], choices[r])
            tokens, finish = settle(outs[s], drafts[r][:a] + [choices[r][a]], limit[s], eos)
            kept.append(1 + a)
            if drafter is not None:
                drafter.settle(r, len(seqs[s]), a, d[r], columns[r])
            commit(s, tokens, finish, seqs, outs, done, w)
        cache.keep(kept)
        live = [r for r, s in enumerate(batch) if s not in done]
        if len(live) < len(batch):
            if live:
                cache.select(live)
                if drafter is not None:
                    drafter.select(live)
            batch = [batch[r] for r in live]
        if not batch:
            cache = drafter = None
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


def _resort_draft(drafter: DraftRows, order: list[int], bug: bool, events: list, step: int, batch: list[int]) -> None:
    """Move the draft's rows with the target's; with `bug`, its cache rows stay where they were."""
    before = drafter.cache.mask
    moved = [r for r in range(len(order)) if int(before[r].sum()) != int(before[order[r]].sum())]
    if bug and moved:  # a row then attends a slot pattern of another sequence: the bug shows now
        drafter.select(order, move_cache=False)
        events.append((step, batch[order[moved[0]]]))
    else:
        drafter.select(order)
