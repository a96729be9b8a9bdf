"""Medusa-style heads over a bfloat16 target fed `inputs_embeds` (never `input_ids`).

Written as an engine object holding per-row state, unlike the zoo's function-shaped engines: the
engine embeds every token itself (`target.get_input_embeddings()`) and feeds the target those
vectors, in bfloat16 (the target is cast to bf16 before it is handed over). The drafter is a set
of Medusa heads (`Heads`): one linear head per draft depth, all reading the target's last hidden
state at the slot that predicted a row's pending token (plus that token's embedding, so the tiny
random target's heads agree with it often enough), one call proposing all k drafts as [B, k, V].
Each head is fitted offline in closed form (least squares) to the target's hidden state that many
tokens ahead. The batch is left-padded once, the cache keeps holes where drafts were rejected (a
2-D mask), finished rows leave (`batch_select_indices`), acceptance is greedy.

Bugs, each at (step, sequence) = events[0]:
- "stale_kv": the first partially accepted row's rejected slots stay attended from its next step
  on (KV);
- "positions": at step 2 the first row with drafts is fed positions one too far (POSITIONS).
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import DynamicCache

from .shapes import budgets, eos_ids, settle

DTYPE = torch.bfloat16


class Heads(nn.Module):
    """Medusa heads: head i maps [h_t; e(pending); 1] to the target's hidden state i + 1 tokens
    ahead, read through the target's lm_head; forward([B, H] hidden, [B, H] embedding) -> [B, k, V]."""

    def __init__(self, target, k: int = 2, samples: int = 32, seed: int = 5) -> None:
        super().__init__()
        hidden = target.config.hidden_size
        self.k = k
        self.heads = nn.ModuleList(nn.Linear(2 * hidden, hidden) for _ in range(k))
        self.lm_head = nn.Linear(hidden, target.config.vocab_size, bias=False)
        with torch.no_grad():
            self.lm_head.weight.copy_(target.get_output_embeddings().weight.float())
            self._fit(target, samples, seed)
        self.to(DTYPE).eval()

    def _fit(self, target, samples: int, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        ids = torch.randint(3, target.config.vocab_size, (samples, 24), generator=gen)
        h = target.model(input_ids=ids).last_hidden_state.float()
        e = target.get_input_embeddings()(ids).float()
        n = h.shape[1] - self.k
        x = torch.cat([h[:, :n], e[:, 1 : n + 1], torch.ones(samples, n, 1)], -1).flatten(0, 1)
        for i, head in enumerate(self.heads):
            y = h[:, 1 + i : n + 1 + i].flatten(0, 1)
            w = torch.linalg.lstsq(x, y, driver="gelsd").solution
            head.weight.copy_(w[:-1].T)
            head.bias.copy_(w[-1])

    def forward(self, hidden: torch.Tensor, embedded: torch.Tensor) -> torch.Tensor:
        x = torch.cat([hidden, embedded], -1)
        return torch.stack([self.lm_head(head(x)) for head in self.heads], 1)


class Row:
    """One live sequence: its id, tokens (prompt + output), output, budget and cached length."""

    def __init__(self, seq: int, prompt: list[int], limit: int) -> None:
        self.seq, self.tokens, self.out, self.limit = seq, list(prompt), [], limit
        self.cached = len(prompt) - 1  # all but the pending token
        self.last: torch.Tensor | None = None  # the hidden state that predicted the pending token


class Engine:
    def __init__(self, target, heads: Heads, k: int = 2) -> None:
        self.target, self.heads, self.k = target, heads, k
        self.embed = target.get_input_embeddings()
        self.eos = eos_ids(target)

    def _call(self, ids: list[list[int]], positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.target(
            inputs_embeds=self.embed(torch.tensor(ids)),
            attention_mask=self.mask,
            position_ids=positions,
            cache=self.cache,
            use_cache=True,
            output_hidden_states=True,
        )
        self.cache = out.past_key_values
        return out.logits, out.hidden_states[-1]

    @torch.no_grad()
    def run(self, prompts, max_new, bug=None, w=None):
        rows = [Row(s, p, n) for s, (p, n) in enumerate(zip(prompts, budgets(max_new, len(prompts))))]
        width = max(r.cached for r in rows)
        self.mask = torch.tensor([[0] * (width - r.cached) + [1] * r.cached for r in rows])
        self.cache = DynamicCache()
        ids = [[0] * (width - r.cached) + r.tokens[:-1] for r in rows]
        _, hidden = self._call(ids, (self.mask.cumsum(1) - 1).clamp(min=0))
        for i, r in enumerate(rows):
            r.last = hidden[i, -1]
        outs: list[list[int]] = [[] for _ in prompts]
        events: list[tuple[int, int]] = []
        step = 0
        while rows:
            if w is not None:
                w.rows([r.seq for r in rows])
            d = [min(self.k, r.limit - len(r.out) - 1) for r in rows]
            drafts = [[] for _ in rows]
            if max(d) > 0:
                pending = self.embed(torch.tensor([r.tokens[-1] for r in rows]))
                proposed = self.heads(torch.stack([r.last for r in rows]), pending).argmax(-1).tolist()
                drafts = [p[:n] for p, n in zip(proposed, d)]
            shift = [0] * len(rows)
            if bug == "positions" and step == 2:
                i = next(i for i, x in enumerate(drafts) if x)
                shift[i] = 1
                events.append((step, rows[i].seq))
            queries = [[r.tokens[-1]] + x for r, x in zip(rows, drafts)]
            q = max(map(len, queries))
            fed = torch.tensor([[1] * len(x) + [0] * (q - len(x)) for x in queries])
            self.mask = torch.cat([self.mask, fed], 1)
            positions = torch.tensor([[r.cached + s + j for j in range(q)] for r, s in zip(rows, shift)])
            logits, hidden = self._call([x + [0] * (q - len(x)) for x in queries], positions)
            choices = logits.argmax(-1).tolist()
            keep = []
            for i, r in enumerate(rows):
                a = 0
                while a < len(drafts[i]) and drafts[i][a] == choices[i][a]:
                    a += 1
                stale = bug == "stale_kv" and not events and a < d[i]
                tokens, finish = settle(r.out, drafts[i][:a] + [choices[i][a]], r.limit, self.eos)
                stale = stale and finish is None
                if stale:
                    events.append((step + 1, r.seq))
                self.mask[i, self.mask.shape[1] - q + (q if stale else 1 + a) :] = 0
                r.cached += 1 + a
                r.last = hidden[i, a]
                r.tokens += tokens
                r.out += tokens
                outs[r.seq] = r.out
                if w is not None:
                    w.emit(r.seq, tokens, finish)
                if not finish:
                    keep.append(i)
            if len(keep) < len(rows):
                self.cache.batch_select_indices(torch.tensor(keep, dtype=torch.long))
                self.mask = self.mask[keep]
                rows = [rows[i] for i in keep]
            step += 1
        return outs, events


def generate(target, heads, prompts, max_new, k=2, bug=None, w=None):
    """The zoo's calling convention: (outputs, events); `target` and `heads` in bfloat16."""
    return Engine(target, heads, k).run(prompts, max_new, bug, w)
