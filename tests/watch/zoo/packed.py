"""Packed varlen speculative decoding, the way vLLM and transformers' continuous batching feed a
model: every forward is ONE 1 x T row holding all live sequences' query tokens back to back, with
per-token `position_ids` restarting per sequence and a block-diagonal additive 4-D mask over a
shared cache whose slots never move (`shapes.SharedKV`). The draft model proposes the same packed
way: draft call j packs the sequences still drafting (call 1 re-feeds what its cache lacks: the
pending token, after a fully accepted step also the last draft), so the drafts are ragged. The
target verifies each sequence's pending token and drafts in one packed call; a rejected draft's
slot is dropped from the mask (a hole). The sequences are packed in a new order every step (a
rotation), and the last prompt arrives late (at step `late`): its prefill rides behind the others'
tokens in that step's verify call and first draft call, emitting nothing, as vLLM mixes prefills
into decoding batches (if every other request has ended before it arrives, it is prefilled alone
then). Each prompt has its own budget and ends there or at the model's EOS
(`shapes.settle`); finished sequences leave the packed row and give their slots back.
Nothing is declared but the emitted tokens (`w.emit`). With `embeds`, both models are fed
`inputs_embeds` (their own embedding rows) instead of token ids, as multimodal servers do. With
`flash`, the mask is boolean and each call also carries flash attention's varlen metadata
(`cu_seq_lens_q/k`, `max_length_q/k`). With `pool=N`, both caches are N-slot pools written through
a slot mapping (`shapes.SlotKV`, vLLM's layout): a slot given back (a rejected draft, a finished
sequence) is reused by the next call, and the mask's keys are the pool's slots. With `flip`, the
draft calls pack the sequences in the reverse of the verify's order. With `declare`, each forward's
segments are declared before it (`w.batch(seq_ids, query_lens=...)`, `model="draft"` for the
draft's), the watch's declared producer. With `lookup`, there is no draft model: each sequence
proposes the tokens that followed the latest earlier occurrence of its last token (prompt
lookup, `ngram.lookup`), so some steps verify no drafts at all.

Bugs, each breaking one invariant at (step, sequence) = events[0]:
- "positions": after the first partial accept, that sequence's position counter advances by its
  drafts, not by what it kept: its next step is fed positions too far (POSITIONS);
- "kv_leak": at step 1 the second packed sequence's query also attends the first one's earliest
  slot (the mask lets its neighbour in; KV);
- "kv_leak_zero": at step 1 the shortest sequence but the first also attends slot 0, the first
  sequence's first slot (the lowest slot of the cache: read by "the first slot a row attends", it
  is the first sequence's row; KV);
- "kv_leak_join": the late sequence's first decoding row (step late + 1) also attends slot 0:
  its context is read one slot longer than its prefill left it (KV);
- "kv_leak_last": a sequence at its last step (one token left to its budget, no drafts) also
  attends the earliest slot of the sequence prefilled first of the others (lower than any of its
  own): no later row of it tells the two apart (KV);
- "stale_kv": the first partially accepted sequence's rejected target slots stay attended from
  its next step on (KV);
- "reuse" (with `pool`): the first partially accepted sequence gives its rejected slots back to
  the pool but keeps attending them; events[0] is the first step where one of them holds another
  sequence's token or is free (KV).
"""

from __future__ import annotations

import torch

from .ngram import lookup as prompt_lookup
from .shapes import SharedKV, SlotKV, accepted, budgets, commit, eos_ids, settle


@torch.no_grad()
def generate(target, draft, prompts, max_new, k=3, bug=None, w=None, late=2, **variant):
    """`variant`: embeds, flash, pool, flip, declare, lookup (module docstring), each 0 when absent."""
    unknown = set(variant) - {"embeds", "flash", "pool", "flip", "declare", "lookup"}
    if unknown:
        raise TypeError(f"unknown packed options: {sorted(unknown)}")
    embeds, flash, pool, flip, declare, lookup = (
        variant.get(name, 0) for name in ("embeds", "flash", "pool", "flip", "declare", "lookup")
    )
    n = len(prompts)
    limit = budgets(max_new, n)
    seqs = [list(p) for p in prompts]
    outs: list[list[int]] = [[] for _ in prompts]
    if bug == "reuse" and not pool:
        raise ValueError("bug 'reuse' needs a slot pool (pool=N)")
    if pool:
        tkv, dkv = SlotKV(target, pool, bool(embeds), bool(flash)), SlotKV(draft, pool, bool(embeds), bool(flash))
    else:
        tkv, dkv = SharedKV(target, bool(embeds), bool(flash)), SharedKV(draft, bool(embeds), bool(flash))
    if w is not None and declare:  # each forward's packed segments, declared before it
        tkv.before = lambda chunks: w.batch([c[0] for c in chunks], query_lens=[len(c[1]) for c in chunks])
        dkv.before = lambda chunks: w.batch(
            [c[0] for c in chunks], query_lens=[len(c[1]) for c in chunks], model="draft"
        )
    reused = None  # bug "reuse": the sequence that still attends the slots it gave back
    eos, done = eos_ids(target), set()
    waiting = {n - 1: late} if late else {}  # sequence -> the step it arrives at
    prefill = [(s, seqs[s][:-1], 0) for s in range(n) if s not in waiting]  # all but each pending token
    _prefill_now(tkv, None if lookup else dkv, prefill)
    draft_has = [len(p) - 1 for p in prompts]  # committed tokens in the draft's cache
    pos = [len(p) - 1 for p in prompts]  # the pending token's position, as the engine counts it
    events: list[tuple[int, int]] = []
    step = 0
    while waiting or len(done) < n:
        live = [s for s in range(n) if s not in waiting and s not in done]
        if not live:  # every other request ended before the late one arrived: it starts alone now
            _prefill_now(tkv, None if lookup else dkv, [(s, seqs[s][:-1], 0) for s in waiting])
            waiting.clear()
            continue
        live = live[step % len(live) :] + live[: step % len(live)]  # packed in a new order each step
        joining = [(s, seqs[s][:-1], 0) for s, at in waiting.items() if at == step]  # prefilled behind the rest
        d = {s: min(k, limit[s] - len(outs[s]) - 1) for s in live}
        if lookup:  # prompt lookup: no draft model, nothing to prefill for a newcomer
            drafts, draft_slots = {s: prompt_lookup(seqs[s], d[s]) for s in live}, {s: [] for s in live}
        else:
            drafts, draft_slots = _propose(dkv, seqs, pos, draft_has, d, live[::-1] if flip else live, joining)
        leak = _leak(bug, step, live, seqs, outs, limit, late) if not events else None
        if leak is not None:
            events.append((step, leak[0]))
        chunks = [(s, [seqs[s][-1]] + drafts[s], pos[s]) for s in live]
        out, slots = tkv.forward(chunks + joining, leak=leak)
        if reused is not None and not events and reused in tkv.foreign:
            events.append((step, reused))
        logits, at = out.logits[0], 0
        for (s, tokens, _), mine in zip(chunks, slots):
            choices = logits[at : at + len(tokens)].argmax(-1).tolist()
            at += len(tokens)
            a = accepted(drafts[s], choices)
            emitted, finish = settle(outs[s], drafts[s][:a] + [choices[a]], limit[s], eos)
            first_partial = a < len(drafts[s]) and not events and finish is None
            if bug == "stale_kv" and first_partial:
                events.append((step + 1, s))  # its rejected slots are never dropped
            elif bug == "reuse" and first_partial and reused is None:
                tkv.drop(mine[1 + a :], forget=False)  # back to the pool, still in its view
                reused = s
            else:
                tkv.drop(mine[1 + a :])
            dkv.drop(draft_slots[s][a:])  # the fed drafts the target rejected
            draft_has[s] = len(seqs[s]) + min(a, max(d[s] - 1, 0)) if d[s] else draft_has[s]
            pos[s] += len(emitted)
            if bug == "positions" and first_partial:
                pos[s] += len(drafts[s]) - a  # counts every draft it verified as kept
                events.append((step + 1, s))
            commit(s, emitted, finish, seqs, outs, done, w)
            if finish:
                tkv.release(s)
                dkv.release(s)
        for s, _, _ in joining:
            del waiting[s]
        step += 1
    return outs, events


def _prefill_now(tkv, dkv, prefill) -> None:
    """Newcomers prefilled in calls of their own (both caches), as at the start of the run."""
    tkv.forward(prefill)
    if dkv is not None:
        dkv.forward(prefill)


def _leak(bug, step, live, seqs, outs, limit, late) -> tuple[int, int] | None:
    """(sequence, neighbour whose earliest slot it also attends) for the leak bugs, at this step."""
    if len(live) < 2:
        return None
    if bug == "kv_leak" and step == 1:
        return live[1], live[0]
    if bug == "kv_leak_zero" and step == 1 and 0 in live:
        return min((s for s in live if s != 0), key=lambda s: len(seqs[s])), 0
    if bug == "kv_leak_join" and late and step == late + 1 and {0, len(seqs) - 1} <= set(live):
        return len(seqs) - 1, 0  # the late sequence's first decoding row
    if bug == "kv_leak_last":
        last = [s for s in live if limit[s] - len(outs[s]) == 1]
        if last:  # into the sequence prefilled first of the others: its slots are the cache's lowest
            return last[0], min(s for s in live if s != last[0])
    return None


def _propose(dkv: SharedKV, seqs, pos, draft_has, d, live, joining):
    """Draft calls j = 0 .. max(d) - 1, each one packed row of the sequences with d > j; call 0
    also prefills the newcomers (`joining`), behind the rest (a call of its own if none drafts).

    Returns each sequence's drafts and the draft-cache slots of the drafts it fed (draft j - 1 is
    fed at call j; the last draft is never fed)."""
    drafts = {s: [] for s in live}
    fed = {s: [] for s in live}
    if joining and not any(d.values()):
        dkv.forward(joining)
    for j in range(max(d.values())):
        chunks = []
        for s in live:
            if d[s] > j:
                tokens = seqs[s][draft_has[s] :] if j == 0 else [drafts[s][-1]]
                chunks.append((s, tokens, pos[s] + j - len(tokens) + 1))
        out, slots = dkv.forward(chunks + (joining if j == 0 else []))
        logits, at = out.logits[0], 0
        for (s, tokens, _), mine in zip(chunks, slots):
            at += len(tokens)
            drafts[s].append(int(logits[at - 1].argmax()))
            if j > 0:
                fed[s] += mine
    return drafts, fed
