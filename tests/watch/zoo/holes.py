"""One padded batch for the whole run, and both models keep their own `DynamicCache`, which only
grows: a rejected draft's KV is never removed, its slots are masked out of every later call by
the 2-D attention mask (holes), and each row's positions are its own token count. A row that
finishes keeps computing (its tokens are dropped). The draft is prefilled after the target and fed
one token per call; a row that accepted every draft first feeds the last draft it never saw, so
its first draft call of a step is ragged (a masked pad slot in the other rows). `drop`: a finished
row leaves the batch instead, both caches cut down to the rows left (the sequences keep their ids).

Bug "phys_pos": positions count the row's physical slots since its left padding, holes included
(the draft's masked pad slot at once, the target's holes after the first rejection).
Bug "keep_rej": a rejected draft's target slot stays attended (its mask is never cleared).
`EVENTS` name the first (step, sequence) each bug shows at.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from .shapes import budgets, eos_ids

PAD = 0


class Row:
    """One sequence's slots in both caches (1: attended) and what it has committed."""

    def __init__(self, seq: int, prompt: list[int], pad: int) -> None:
        self.seq, self.pad = seq, pad
        self.target = [0] * pad + [1] * (len(prompt) - 1)  # the prompt but its last token, prefilled
        self.draft = list(self.target)
        self.count = len(prompt) - 1  # tokens in the caches' attended slots
        self.pending = prompt[-1]
        self.unseen: int | None = None  # a draft the draft model was never fed (all accepted)
        self.out: list[int] = []
        self.done = False

    def start(self, slots: list[int], attended: int, physical: bool) -> int:
        """The position after `slots`: the tokens attended there, or (bug) its physical width."""
        return len(slots) - self.pad if physical else attended


def _forward(model, cache, ids, masks, positions):
    kwargs = {"attention_mask": torch.tensor(masks), "position_ids": torch.tensor(positions)}
    return model(input_ids=torch.tensor(ids), cache=cache, use_cache=True, **kwargs).logits


def _draft(draft, cache, rows: list[Row], k: int, physical: bool) -> list[list[int]]:
    """k greedy proposals per row: the first call feeds [unseen or a masked pad, pending]."""
    feed = [[row.unseen if row.unseen is not None else PAD, row.pending] for row in rows]
    fed = [[int(row.unseen is not None), 1] for row in rows]
    proposals: list[list[int]] = [[] for _ in rows]
    for _ in range(k):
        positions = []
        for row, flags in zip(rows, fed):
            start = row.start(row.draft, sum(row.draft), physical)
            positions.append([start + sum(flags[:i]) for i in range(len(flags))])
        masks = [row.draft + flags for row, flags in zip(rows, fed)]
        chosen = _forward(draft, cache, feed, masks, positions)[:, -1].argmax(-1).tolist()
        for row, flags, out, token in zip(rows, fed, proposals, chosen):
            row.draft += flags
            out.append(token)
        feed, fed = [[token] for token in chosen], [[1] for _ in rows]
    return proposals


@torch.no_grad()
def generate(target, draft, prompts, max_new, k=3, bug=None, w=None, drop=0):
    limit, eos = budgets(max_new, len(prompts)), eos_ids(target)
    width = max(len(p) for p in prompts) - 1
    rows = [Row(s, p, width - len(p) + 1) for s, p in enumerate(prompts)]
    physical, events, everyone = bug == "phys_pos", [], list(rows)
    caches = DynamicCache(), DynamicCache()
    ids = [[PAD] * row.pad + p[:-1] for row, p in zip(rows, prompts)]
    positions = [[max(sum(row.target[: i + 1]) - 1, 0) for i in range(width)] for row in rows]
    masks = [row.target for row in rows]
    _forward(target, caches[0], ids, masks, positions)
    _forward(draft, caches[1], ids, masks, positions)
    step = 0
    while not all(row.done for row in rows):
        if physical and not events and any(row.unseen is None for row in rows):
            events.append((step, next(row.seq for row in rows if not row.done)))
        proposals = _draft(draft, caches[1], rows, k, physical)
        query = [[row.pending, *drafts] for row, drafts in zip(rows, proposals)]
        masks = [row.target + [1] * (k + 1) for row in rows]
        starts = [row.start(row.target, row.count, physical) for row in rows]
        positions = [list(range(start, start + k + 1)) for start in starts]
        choice = _forward(target, caches[0], query, masks, positions).argmax(-1).tolist()
        for r, (row, drafts) in enumerate(zip(rows, proposals)):
            accepted = next((i for i in range(k) if drafts[i] != choice[r][i]), k)
            kept = k + 1 if bug == "keep_rej" else accepted + 1
            row.target += [1] * kept + [0] * (k + 1 - kept)
            seen = min(accepted, k - 1)  # the draft was fed the pending token and drafts 1 .. k-1
            row.draft[-k:] = [1] * (1 + seen) + [0] * (k - 1 - seen)
            row.unseen = drafts[k - 1] if accepted == k else None
            row.count += accepted + 1
            new = drafts[:accepted] + [choice[r][accepted]]
            row.pending = new[-1]
            if row.done:
                continue
            new = new[: limit[row.seq] - len(row.out)]
            new = new[: next((i + 1 for i, t in enumerate(new) if t in eos), len(new))]
            row.out += new
            row.done = len(row.out) >= limit[row.seq] or new[-1] in eos
            if kept > accepted + 1 and not row.done and not events:
                events.append((step + 1, row.seq))  # its stale slots are first attended at its next step
            if w is not None:
                w.emit(row.seq, new, ("eos" if new[-1] in eos else "length") if row.done else None)
        left = [r for r, row in enumerate(rows) if not row.done]
        if drop and left and len(left) < len(rows):  # the finished rows leave both caches
            _keep_rows(caches, left)
            rows = [rows[r] for r in left]
        step += 1
    return [row.out for row in sorted(everyone, key=lambda row: row.seq)], events


def _keep_rows(caches, left: list[int]) -> None:
    """Each cache layer cut down to the rows `left`, in order."""
    index = torch.tensor(left)
    for cache in caches:
        for layer in cache.layers:
            layer.keys, layer.values = layer.keys[index], layer.values[index]
