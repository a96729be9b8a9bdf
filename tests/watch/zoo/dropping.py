"""A left-padded batch over one `DynamicCache` whose finished rows are dropped, nothing declared
but what the API is told. Each row's drafts come from the draft model run on that row alone (no
cache), a different number per row and step (ragged: a row with fewer drafts pads its query on
the right); a rejected draft's slot stays in the cache as a hole the mask stops attending. A row
that reaches its budget or EOS leaves: the survivors keep their order and their cache rows
(`DynamicCache.batch_select_indices`), so which sequence a row holds is said by nothing but the
call (its positions, its mask's history, its place among the survivors).

Each sequence's next token (its pending token) is committed when chosen and fed, not yet cached,
at the head of its row's next query, at position = its committed length - 1.

Bug "stale": once (after a row has left), a row that rejected a draft keeps attending the
rejected slots (its hole is not masked). Bug "positions": once (after a row has left), a row that
rejected a draft is fed positions one too far from then on. Either shows at that sequence's next
call; `events` holds (trace step, sequence) of it (the prefill is step 0, the n-th verify step n).
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from .common import left_padded, verify
from .shapes import budgets, eos_ids


@torch.no_grad()
def propose(draft, tokens: list[int], n: int) -> list[int]:
    """n greedy drafts for one sequence, the draft model re-reading it whole each time."""
    seq, out = list(tokens), []
    for _ in range(n):
        out.append(int(draft(torch.tensor([seq])).logits[0, -1].argmax()))
        seq.append(out[-1])
    return out


@torch.no_grad()
def generate(target, draft, prompts, max_new, k=3, bug=None, w=None, pad=0):
    limits, eos = budgets(max_new, len(prompts)), eos_ids(target)
    ids, mask = left_padded([list(p) for p in prompts])
    cache = DynamicCache()
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    first = target(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache)
    seqs = [list(p) + [t] for p, t in zip(prompts, first.logits[:, -1].argmax(-1).tolist())]
    outs = [[s[-1]] for s in seqs]
    if w is not None:
        for s, out in enumerate(outs):
            w.emit(s, out, None)
    live = list(range(len(prompts)))  # the sequence each row holds
    valid = mask.tolist()  # per row: which cache slots it attends
    shift = [0] * len(prompts)  # the positions bug: a row fed positions this far off
    events: list[tuple[int, int]] = []
    step = 0
    while live:
        step += 1
        if w is not None:
            w.rows(live)
        drafts = [propose(draft, seqs[s], min(k, limits[s] - len(outs[s]) - 1, (s + step) % (k + 1))) for s in live]
        width = 1 + max(map(len, drafts))
        q_ids, q_mask, q_pos = [], [], []
        for r, s in enumerate(live):
            row, n = [seqs[s][-1]] + drafts[r], len(seqs[s]) - 1 + shift[s]
            q_ids.append(row + [pad] * (width - len(row)))
            q_mask.append(valid[r] + [1] * len(row) + [0] * (width - len(row)))
            q_pos.append([n + j for j in range(len(row))] + [n + len(row) - 1] * (width - len(row)))
        logits = target(
            input_ids=torch.tensor(q_ids),
            attention_mask=torch.tensor(q_mask),
            position_ids=torch.tensor(q_pos),
            past_key_values=cache,
        ).logits
        choices = logits.argmax(-1).tolist()
        stay = []
        for r, s in enumerate(live):
            d = drafts[r]
            a = verify(d, choices[r])
            tokens = d[:a] + [choices[r][a]]
            finish = None
            if eos & set(tokens):
                tokens, finish = tokens[: 1 + min(tokens.index(e) for e in eos & set(tokens))], "eos"
            if len(outs[s]) + len(tokens) >= limits[s]:
                tokens, finish = tokens[: limits[s] - len(outs[s])], "length"
            seqs[s] += tokens
            outs[s] += tokens
            if w is not None:
                w.emit(s, tokens, finish)
            kept = [1] * (1 + a) + [0] * (width - 1 - a)
            late = len(live) < len(prompts) and finish is None
            if bug and not events and a < len(d) and late:  # once a row has left, where it shows next
                events.append((step + 1, s))
                if bug == "stale":
                    kept = [1] * (1 + len(d)) + [0] * (width - 1 - len(d))
                elif bug == "positions":
                    shift[s] = 1
            valid[r] += kept
            if finish is None:
                stay.append(r)
        if len(stay) < len(live):  # finished rows leave; the survivors keep their order
            cache.batch_select_indices(torch.tensor(stay, dtype=torch.long))
            live, valid = [live[r] for r in stay], [valid[r] for r in stay]
    return outs, events
