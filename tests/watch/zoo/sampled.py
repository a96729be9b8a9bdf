"""Speculative rejection sampling at temperature T: the draft samples d tokens per row (no cache,
it re-reads each row), the target accepts draft x with probability min(1, p(x) / q(x)), else
samples the residual max(p - q, 0) and stops; after a full acceptance it samples a bonus from p.
Tokens are not the argmax anywhere, so the watch is told the temperature.

Bug "stale_kv": rejected drafts stay attended in the cache (their slots are never masked out).
Bug "wrongrow": at step 2 row 0's tokens are written to sequence 1 (before row 1's own), the
rows themselves unchanged. `ragged`: each row drafts its own count (1..k) every step.
`draft_cache`: the draft reads each row's context once per step into a fresh cache and is then fed
only its last sampled token (a one-token query at the next position), as most engines draft.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from .common import HoleCache, left_padded


def draft_sampled(draft, seqs, n, temperature, gen, cached=False):
    """n sampled drafts per row, with the draft's distribution at each (`cached`: `draft_cache`)."""
    seqs = [list(s) for s in seqs]
    tokens: list[list[int]] = [[] for _ in seqs]
    probs: list[list[torch.Tensor]] = [[] for _ in seqs]
    ids, mask = left_padded(seqs)
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    kept = {"cache": DynamicCache()} if cached else {}
    for _ in range(n):
        if not cached:
            ids, mask = left_padded(seqs)
            positions = (mask.cumsum(1) - 1).clamp(min=0)
        logits = draft(input_ids=ids, attention_mask=mask, position_ids=positions, **kept).logits
        if cached:  # next: the token just sampled, one position on, its key appended to the cache
            mask, positions = torch.cat([mask, torch.ones_like(mask[:, :1])], 1), positions[:, -1:] + 1
        q = torch.softmax(logits[:, -1] / temperature, -1)
        for r, t in enumerate(torch.multinomial(q, 1, generator=gen)[:, 0].tolist()):
            tokens[r].append(t)
            probs[r].append(q[r])
            seqs[r].append(t)
        ids = torch.tensor([[s[-1]] for s in seqs])
    return tokens, probs


def verify(drafts, q, p, gen):
    """Rejection sampling of one row: (accepted count, tokens to append)."""
    for i, x in enumerate(drafts):
        if torch.rand(1, generator=gen).item() < min(1.0, (p[i][x] / q[i][x]).item()):
            continue
        residual = (p[i] - q[i]).clamp(min=0)
        return i, drafts[:i] + [int(torch.multinomial(residual / residual.sum(), 1, generator=gen))]
    return len(drafts), drafts + [int(torch.multinomial(p[len(drafts)], 1, generator=gen))]


@torch.no_grad()
def generate(
    target, draft, prompts, max_new, k=3, bug=None, w=None, temperature=0.8, seed=0, ragged=False, draft_cache=False
):
    gen = torch.Generator().manual_seed(seed)
    seqs = [list(p) for p in prompts]
    outs: list[list[int]] = [[] for _ in prompts]
    cache = HoleCache(target, seqs)
    events: list[tuple[int, int]] = []
    step = 0
    while any(len(o) < max_new for o in outs):
        live = [r for r in range(len(seqs)) if len(outs[r]) < max_new]
        d = {r: min(1 + (step + r) % k if ragged else k, max_new - len(outs[r]) - 1) for r in live}
        tokens, probs = draft_sampled(draft, [seqs[r] for r in live], max(d.values()), temperature, gen, draft_cache)
        drafts = {r: t[: d[r]] for r, t in zip(live, tokens)}
        q = {r: pr[: d[r]] for r, pr in zip(live, probs)}
        queries = [[seqs[r][-1]] + drafts[r] if r in d else [] for r in range(len(seqs))]
        p = torch.softmax(cache.forward(queries) / temperature, -1)
        kept, attended = [0] * len(seqs), [0] * len(seqs)
        for r in live:
            a, new = verify(drafts[r], q[r], p[r], gen)
            kept[r] = attended[r] = 1 + a
            if bug == "stale_kv" and a < d[r]:
                attended[r] = 1 + d[r]  # the rejected drafts' slots stay attended
                if not events:
                    events.append((step + 1, r))
            seqs[r] += new
            dest = r
            if bug == "wrongrow" and step == 2 and r == 0 and 1 in live:
                dest = 1  # the row's tokens go to the next row's sequence
                events.append((step, r))
            outs[dest] += new
            if w is not None:
                w.emit(dest, new, "length" if len(outs[dest]) >= max_new else None)
        cache.keep(kept, attended)
        step += 1
    return outs, events
