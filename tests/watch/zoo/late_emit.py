"""A padded engine whose proposer the watch cannot see, and three ways of telling the watch what
each sequence got (`emit`). Written without specviz.

The target runs a left-padded batch over one `DynamicCache`. Each row proposes its own number of
drafts (0..k, so the verify's query block is ragged: a row with fewer drafts has its trailing
query slots masked out) from a draft model run per row, uncached and unwatched: the watch sees
the drafts only in the verify input. A rejected draft's slot stays in the cache as a hole (masked
from then on); finished rows leave the batch (`batch_select_indices`) and the rows are declared
(`w.rows`). The token a verify chooses after its accepted drafts (the bonus) is fed as the next
step's pending token.

`emit` (the timing the engine reports tokens with, same tokens in the end):
- "now": each verify's accepted drafts and bonus when chosen, the prefill's token after the
  prefill (the contract in docs/watch.md);
- "first_late": the prefill's token only with the first verify's tokens;
- "late": every step's bonus only with the next step's tokens (the engine emits what it feeds as
  pending plus the drafts it accepted; a sequence's last bonus is never emitted).

Bug "stale_kv": the first row that rejects a draft while more than k + 1 tokens of its budget
remain keeps its rejected slots attended from its next step on (KV); events[0] is that next step
(steps counted as the watch counts them: the prefill is step 0)."""

from __future__ import annotations

import torch
from transformers import DynamicCache

from .shapes import accepted, budgets, eos_ids

EMITS = ("now", "first_late", "late")


@torch.no_grad()
def _propose(draft, tokens: list[int], n: int) -> list[int]:
    out = []
    for _ in range(n):
        out.append(int(draft(torch.tensor([tokens + out])).logits[0, -1].argmax()))
    return out


@torch.no_grad()
def generate(target, draft, prompts, max_new, k=3, bug=None, w=None, emit="now"):
    if emit not in EMITS:
        raise ValueError(f"emit must be one of {EMITS}")
    limit, eos, n = budgets(max_new, len(prompts)), eos_ids(target), len(prompts)
    width = max(map(len, prompts))
    mask = [[0] * (width - len(p)) + [1] * len(p) for p in prompts]
    ids = torch.tensor([[0] * (width - len(p)) + list(p) for p in prompts])
    fed_mask = torch.tensor(mask)
    cache = DynamicCache()
    logits = target(input_ids=ids, attention_mask=fed_mask, position_ids=(fed_mask.cumsum(-1) - 1).clamp(min=0),
                    cache=cache, use_cache=True).logits  # fmt: skip
    pending = [int(t) for t in logits[:, -1].argmax(-1)]
    seqs = [list(p) for p in prompts]
    outs: list[list[int]] = [[pending[s]] for s in range(n)]  # the prefill chose each first token
    unsent: list[list[int]] = [[] for _ in range(n)]  # chosen, not yet emitted
    live = []
    for s in range(n):
        finish = "eos" if pending[s] in eos else "length" if limit[s] <= 1 else None
        _tell(w, emit, s, [pending[s]], finish, unsent, when="prefill")
        live += [s] if finish is None else []
    if len(live) < n:
        cache.batch_select_indices(torch.tensor(live, dtype=torch.long))
        mask, pending = [mask[s] for s in live], [pending[s] for s in live]
    events, step = [], 1
    while live:
        if w is not None:
            w.rows(live)
        drafts = []
        for r, s in enumerate(live):  # a number of drafts of its own, fitting before its budget's end
            count = min(k, limit[s] - len(outs[s]) - 1, (s + step) % (k + 1))
            drafts.append(_propose(draft, seqs[s] + [pending[r]], count))
        q = 1 + max(map(len, drafts))
        rows = [[pending[r]] + d for r, d in enumerate(drafts)]
        out = (
            target(
                input_ids=torch.tensor([x + [0] * (q - len(x)) for x in rows]),
                attention_mask=torch.tensor([m + [1] * len(x) + [0] * (q - len(x)) for m, x in zip(mask, rows)]),
                position_ids=torch.tensor(
                    [[len(seqs[s]) + min(j, len(x) - 1) for j in range(q)] for s, x in zip(live, rows)]
                ),  # noqa: E501
                cache=cache,
                use_cache=True,
            )
            .logits.argmax(-1)
            .tolist()
        )
        keep = []
        for r, s in enumerate(live):
            a = accepted(drafts[r], out[r])
            new = drafts[r][:a] + [out[r][a]]
            seqs[s].append(pending[r])
            seqs[s] += drafts[r][:a]
            new, finish = _settle(outs[s], new, limit[s], eos)
            outs[s] += new
            stale = bug == "stale_kv" and not events and a < len(drafts[r]) and limit[s] - len(outs[s]) > k + 1
            if stale:
                events.append((step + 1, s))
            kept = len(rows[r]) if stale else 1 + a
            mask[r] = mask[r] + [1] * kept + [0] * (q - kept)
            pending[r] = new[-1]
            _tell(w, emit, s, new, finish, unsent)
            if finish is None:
                keep.append(r)
        if len(keep) < len(live):
            if keep:
                cache.batch_select_indices(torch.tensor(keep, dtype=torch.long))
            live, mask, pending = [live[r] for r in keep], [mask[r] for r in keep], [pending[r] for r in keep]
        step += 1
    return outs, events


def _settle(out: list[int], new: list[int], limit: int, eos: set[int]) -> tuple[list[int], str | None]:
    """The tokens kept of what the verify allowed: up to the budget, through an EOS."""
    new = new[: max(limit - len(out), 0)]
    for i, t in enumerate(new):
        if t in eos:
            return new[: i + 1], "eos"
    return new, "length" if len(out) + len(new) >= limit else None


def _tell(w, emit: str, seq: int, tokens: list[int], finish: str | None, unsent, when: str = "verify") -> None:
    """Emit as the engine's `emit` mode reports: now, the prefill's token late, or every bonus late."""
    if w is None:
        return
    if emit == "now" or (emit == "first_late" and (when != "prefill" or finish is not None)):
        w.emit(seq, unsent[seq] + tokens, finish)
        unsent[seq] = []
    elif emit == "first_late":
        unsent[seq] = list(tokens)
    else:  # late: hold the last chosen token (the next pending) back until the next step
        shown = unsent[seq] + tokens
        if finish is not None:
            w.emit(seq, shown, finish)
        elif len(shown) > 1 or when != "prefill":
            w.emit(seq, shown[:-1], None)
        unsent[seq] = shown[-1:] if finish is None else []
