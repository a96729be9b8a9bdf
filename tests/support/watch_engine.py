"""A small independent batch speculative decoding engine, for test_watch only.

Imports nothing from specviz.engine: greedy drafting, batched verification and its own
realignment (strip each row's padding and rejected slots, re-pad on the left). Instrumenting it
for `specviz.watch` takes the lines marked `# watch`. Bugs are switched on by name; each one logs
where it first changed what the models were fed, so a test can compare with what watch finds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import DynamicCache


@dataclass
class Bugs:
    no_position_ids: bool = False  # lets HF derive positions from the physical slot (ignores padding)
    keep_rejected_kv: bool = False  # trims every row's new slots to the longest row's: stale KV attended
    accept_one_more: bool = False  # accepts one draft past the first mismatch
    mixup_at_step: int | None = None  # at this step, row r's tokens go to the next row's sequence
    no_bonus: bool = False  # drops the bonus after an all-accepted step: slower, still exact
    draft_without_cache: bool = False  # the draft re-reads the whole prefix each call: slower, still exact


@dataclass
class Rows:
    seq_ids: list[int]
    tokens: list[list[int]]  # committed tokens per row (prompt + output); the last one is pending
    outputs: list[list[int]]
    target: Any = None  # (cache, mask [B, W])
    draft: Any = None
    events: list[tuple[int, int]] = field(default_factory=list)  # (step, row) where a bug fired


def kv_pairs(cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    if isinstance(cache, (tuple, list)):  # 4.x returns the legacy format when given no Cache
        return [(keys, values) for keys, values in cache]
    if hasattr(cache, "layers"):  # transformers 5.x
        return [(layer.keys, layer.values) for layer in cache.layers]
    return list(zip(cache.key_cache, cache.value_cache))  # 4.x


def new_cache(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> Any:
    cache = DynamicCache()
    for i, (keys, values) in enumerate(pairs):
        cache.update(keys, values, i)
    return cache


def cache_kw(model: Any) -> str:
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def forward(model: Any, ids: torch.Tensor, mask: torch.Tensor, cache: Any, positions: torch.Tensor | None) -> Any:
    kwargs = {cache_kw(model): cache} if cache is not None else {}
    if positions is not None:
        kwargs["position_ids"] = positions
    return model(input_ids=ids, attention_mask=mask, use_cache=True, **kwargs)


def out_cache(out: Any) -> Any:
    return getattr(out, "cache", None) or out.past_key_values


def prefill(model: Any, contexts: list[list[int]], pad: int) -> tuple[Any, torch.Tensor]:
    width = max(len(c) for c in contexts)
    ids = torch.tensor([[pad] * (width - len(c)) + c for c in contexts])
    mask = torch.tensor([[0] * (width - len(c)) + [1] * len(c) for c in contexts])
    out = forward(model, ids, mask, None, (mask.cumsum(1) - 1).clamp(min=0))
    return out_cache(out), mask


def realign(state: Any, fed: int, keep_new: list[int], live: list[int]) -> tuple[Any, torch.Tensor]:
    """Keep each live row's real old slots and the first keep_new[r] of the `fed` new slots, left-padded anew."""
    cache, mask = state
    first_new = mask.shape[1] - fed
    slots = []
    for r in live:
        old = [i for i, v in enumerate(mask[r, :first_new].tolist()) if v]
        slots.append(old + list(range(first_new, first_new + keep_new[r])))
    width = max(len(s) for s in slots)
    pairs = []
    for keys, values in kv_pairs(cache):
        new_k = keys.new_zeros(len(live), keys.shape[1], width, keys.shape[3])
        new_v = torch.zeros_like(new_k)
        for i, (r, kept) in enumerate(zip(live, slots)):
            new_k[i, :, width - len(kept) :] = keys[r, :, kept]
            new_v[i, :, width - len(kept) :] = values[r, :, kept]
        pairs.append((new_k, new_v))
    new_mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in slots])
    return new_cache(pairs), new_mask


def positions_for(mask: torch.Tensor, q: int, bugs: Bugs) -> torch.Tensor | None:
    if bugs.no_position_ids:
        return None
    return mask.sum(1, keepdim=True) + torch.arange(q)[None, :]


@torch.no_grad()
def propose(draft: Any, rows: Rows, pending: torch.Tensor, k: int, bugs: Bugs, pad: int) -> torch.Tensor:
    """k greedy drafts; the cached draft also feeds d_k, so its cache covers every query slot."""
    proposals, token = [], pending[:, None]
    if bugs.draft_without_cache:
        seqs = [list(t) for t in rows.tokens]
        for _ in range(k):
            token = prefill_logits(draft, seqs, pad).argmax(-1, keepdim=True)
            proposals.append(token)
            seqs = [s + [int(t)] for s, t in zip(seqs, token[:, 0])]
        return torch.cat(proposals, 1)
    cache, mask = rows.draft
    for _ in range(k + 1):
        mask_in = torch.cat([mask, torch.ones(len(mask), 1, dtype=mask.dtype)], 1)
        out = forward(draft, token, mask_in, cache, positions_for(mask, 1, bugs))
        cache, mask = out_cache(out), mask_in
        token = out.logits[:, -1].argmax(-1, keepdim=True)
        proposals.append(token)
    rows.draft = (cache, mask)
    return torch.cat(proposals[:k], 1)


def finish_reason(output: list[int], eos: frozenset[int], max_new: int) -> str | None:
    if output and output[-1] in eos:
        return "eos"
    return "length" if len(output) >= max_new else None


def prefill_logits(model: Any, seqs: list[list[int]], pad: int) -> torch.Tensor:
    width = max(len(s) for s in seqs)
    ids = torch.tensor([[pad] * (width - len(s)) + s for s in seqs])
    mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in seqs])
    return forward(model, ids, mask, None, (mask.cumsum(1) - 1).clamp(min=0)).logits[:, -1]


@torch.no_grad()
def generate(target, draft, prompts, k, max_new, eos, pad, bugs=None, watch=None) -> Rows:
    bugs = bugs or Bugs()
    rows = Rows(list(range(len(prompts))), [list(p) for p in prompts], [[] for _ in prompts])
    rows.target = prefill(target, [p[:-1] for p in prompts], pad)
    if not bugs.draft_without_cache:
        rows.draft = prefill(draft, [p[:-1] for p in prompts], pad)
    done: list[list[int]] = [[] for _ in prompts]
    tainted: set[int] = set()  # sequences whose cache a bug altered: it shows at their next step
    for step in range(10 * max_new):
        if not rows.seq_ids:
            break
        watch and watch.rows(rows.seq_ids)  # watch
        hit = [r for r, s in enumerate(rows.seq_ids) if s in tainted]
        if hit and not rows.events:
            rows.events.append((step, hit[0]))
        pending = torch.tensor([t[-1] for t in rows.tokens])
        drafts = propose(draft, rows, pending, k, bugs, pad)
        cache, mask = rows.target
        mask_in = torch.cat([mask, torch.ones(len(mask), k + 1, dtype=mask.dtype)], 1)
        if bugs.no_position_ids and bool((mask == 0).any()) and not rows.events:
            rows.events.append((step, int((mask == 0).any(1).nonzero()[0])))
        out = forward(
            target, torch.cat([pending[:, None], drafts], 1), mask_in, cache, positions_for(mask, k + 1, bugs)
        )
        targets = out.logits.argmax(-1)
        matched = (drafts == targets[:, :k]).long().cumprod(1).sum(1).tolist()
        emitted, dest = [], list(range(len(rows.seq_ids)))
        for r, a in enumerate(matched):
            if bugs.accept_one_more and a < k:
                rows.events.append((step, r))
                a += 1
            tokens = drafts[r, :a].tolist() + [int(targets[r, a])]
            if bugs.no_bonus and a == k:
                tokens = tokens[:k]
            budget = max_new - len(rows.outputs[r])
            tokens = tokens[:budget]
            cut = next((i + 1 for i, t in enumerate(tokens) if t in eos), len(tokens))
            emitted.append(tokens[:cut])
        if bugs.mixup_at_step == step and len(dest) > 1:
            dest = [(r + 1) % len(dest) for r in dest]
            rows.events.append((step, 0))
        for r, d in enumerate(dest):
            rows.outputs[d] += emitted[r]
            rows.tokens[d] += emitted[r]
        keep = [len(e) for e in emitted]
        if bugs.keep_rejected_kv and len(set(keep)) > 1:
            tainted.update(rows.seq_ids[r] for r, n in enumerate(keep) if n < max(keep))
            keep = [max(keep)] * len(keep)
        reasons = [finish_reason(out_r, eos, max_new) for out_r in rows.outputs]
        for r, d in enumerate(dest):
            watch and watch.emit(rows.seq_ids[d], emitted[r], reasons[d])  # watch
        live = []
        for r in range(len(rows.seq_ids)):
            if reasons[r] is not None:
                done[rows.seq_ids[r]] = rows.outputs[r]
            else:
                live.append(r)
        if not live:
            break
        rows.target = realign((out_cache(out), mask_in), k + 1, keep, live)
        if not bugs.draft_without_cache:
            rows.draft = realign(rows.draft, k + 1, keep, live)
        rows.seq_ids = [rows.seq_ids[r] for r in live]
        rows.tokens = [rows.tokens[r] for r in live]
        rows.outputs = [rows.outputs[r] for r in live]
    rows.outputs = done
    return rows
