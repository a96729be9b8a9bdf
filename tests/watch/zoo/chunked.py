"""Chunked prefill mixed into decode, one packed forward per step (vLLM's scheduler shape), with
prompt-lookup drafts (`ngram.lookup`, no draft model).

Every prompt is waiting at the start. Each step, every decoding sequence feeds its pending token
and drafts, and the waiting prompts get at most `budget` prefill tokens between them, first come
first served: a prompt longer than what is left is fed in chunks over several steps. A chunk that
stops short of the prompt's end yields no token (KV written only); the chunk that reaches the end
yields the sequence's first token from its last logits, as vLLM samples a prompt whose
computed tokens reach its length. All of it is one 1 x T row over one shared cache
(`shapes.SharedKV`), in a new order every step only in that decodes come before prefills.

With `declare`, each forward is declared (`w.batch(ids, query_lens=..., drafts=..., chunk=...)`).
`step` counts forwards that emit a token (a forward of chunks only is no step of any sequence).

Bugs, each at (step, sequence) = events[0]:
- "chunk_positions": the final chunk of the first prompt fed in two chunks or more restarts its
  positions at 0 (the engine numbers a chunk's tokens from its own start; POSITIONS);
- "chunk_forgets": that final chunk attends only its own tokens, not the chunks before it (KV);
- "kv_leak": at the second step with two decoding sequences, the second decoding sequence's query
  also attends the first one's earliest slot (KV).
"""

from __future__ import annotations

import torch

from .ngram import lookup
from .shapes import SharedKV, accepted, budgets, commit, eos_ids, settle


class _ForgetfulKV(SharedKV):
    """`SharedKV` whose sequence `forgets` attends none of its earlier slots in the next forward."""

    forgets: int | None = None

    def _view(self, seq: int) -> list[int]:
        return [] if seq == self.forgets else super()._view(seq)


@torch.no_grad()
def generate(target, draft, prompts, max_new, k=3, bug=None, w=None, budget=2, declare=0):
    """`draft` is never called (prompt lookup proposes); `budget`: prefill tokens per forward."""
    n = len(prompts)
    limit, eos = budgets(max_new, n), eos_ids(target)
    seqs, outs = [list(p) for p in prompts], [[] for _ in prompts]
    kv = _ForgetfulKV(target)
    computed = [0] * n  # prompt tokens in the cache, for a sequence still prefilling
    decoding: list[int] = []  # in arrival order
    done: set[int] = set()
    events: list[tuple[int, int]] = []
    leak_steps = 0
    step = 0
    while len(done) < n:
        chunks, roles = [], []  # (seq, tokens, first position); ("decode", drafts) | ("chunk", ends prompt)
        for s in decoding:
            drafts = lookup(seqs[s], min(k, limit[s] - len(outs[s]) - 1))
            chunks.append((s, [seqs[s][-1], *drafts], len(seqs[s]) - 1))
            roles.append(("decode", drafts))
        left = budget
        for s in range(n):
            if s in decoding or s in done or left == 0:
                continue
            take = min(left, len(prompts[s]) - computed[s])
            ends = computed[s] + take == len(prompts[s])
            start = computed[s]
            if ends and computed[s] and not events and bug in ("chunk_positions", "chunk_forgets"):
                events.append((step, s))
                start = 0 if bug == "chunk_positions" else start
                kv.forgets = s if bug == "chunk_forgets" else None
            chunks.append((s, prompts[s][computed[s] : computed[s] + take], start))
            roles.append(("chunk", ends))
            computed[s] += take
            left -= take
        leak = None
        if bug == "kv_leak" and len(decoding) >= 2 and not events:
            leak_steps += 1
            if leak_steps == 2:
                leak = (decoding[1], decoding[0])
                events.append((step, decoding[1]))
        if w is not None and declare:
            w.batch(
                [c[0] for c in chunks],
                query_lens=[len(c[1]) for c in chunks],
                drafts=[len(r[1]) if r[0] == "decode" else 0 for r in roles],
                chunk=[r == ("chunk", False) for r in roles],
            )
        out, slots = kv.forward(chunks, leak=leak)
        kv.forgets = None
        logits, at, emitted_any = out.logits[0], 0, False
        for (s, tokens, _), (role, detail), mine in zip(chunks, roles, slots):
            choices = logits[at : at + len(tokens)].argmax(-1).tolist()
            at += len(tokens)
            if role == "chunk" and not detail:
                continue  # stops short of the prompt's end: no token
            drafts = detail if role == "decode" else []
            a = accepted(drafts, choices[len(tokens) - len(drafts) - 1 :])
            emitted, finish = settle(outs[s], drafts[:a] + [choices[len(tokens) - len(drafts) - 1 + a]], limit[s], eos)
            kv.drop(mine[len(tokens) - len(drafts) + a :])  # the rejected drafts' slots
            commit(s, emitted, finish, seqs, outs, done, w)
            emitted_any = True
            if role == "chunk":
                decoding.append(s)
            if finish:
                decoding.remove(s)
                kv.release(s)
        step += emitted_any
    return outs, events
