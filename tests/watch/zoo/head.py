"""Drafts from a head on the target's last hidden state (EAGLE/MTP-like): no draft model. The head
(`DraftHead`, an nn.Module) is fed the target's hidden state at the slot that predicted a row's
pending token plus the pending token's embedding (`inputs_embeds`), and returns the next token's
logits and its own feature, which the next head call is fed in place of the target's hidden state
(EAGLE's recursion). Its one linear map is fitted in closed form (least squares) to the target on
random tokens, so it agrees with the target about half the time: rows accept everything next to
rows that accept nothing. The target verifies the drafts with a padded cache that keeps holes
(`common.HoleCache`) and returns its hidden states; finished rows are dropped (each prompt has
its own budget). Pass `drafter=head` to the watch; the rows are declared each step (`w.rows`).
With `packed`, the target is packed instead (`generate_packed`, vLLM's EAGLE layout). With a
`MedusaHeads` drafter, all of a step's drafts come from ONE head call per step (Medusa: one head per
draft depth, all fed the same hidden state and the pending token's id; logits [B, heads, V]).

Bugs, each at (step, sequence) = events[0]:
- "stale_kv": the first partially accepted row's rejected slots stay attended from its next
  step on (KV);
- "positions": at step 2 the first row with drafts is fed positions one too far (POSITIONS);
- "head_row": at step 1 the head is fed each row's hidden state from the row below (the last
  row's from row 0). The drafts change, the outputs do not (the target verifies them): only a
  watch that checks which row's hidden state the head was fed can see it (events[0] is row 0);
- "head_stale": at step 1 the head is fed every row's hidden state of the step before (the
  prefill's, one target call older than the latest): outputs stay right, as for "head_row".
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.modeling_outputs import CausalLMOutput

from .common import HoleCache, left_padded, verify
from .shapes import SharedKV, accepted, budgets, commit, eos_ids, settle


class DraftHead(nn.Module):
    """feature = W [hidden; embedding; 1], logits = the target's lm_head(feature)."""

    def __init__(self, target, samples: int = 32, seed: int = 3) -> None:
        super().__init__()
        hidden = target.config.hidden_size
        self.fc = nn.Linear(2 * hidden, hidden)
        self.lm_head = nn.Linear(hidden, target.config.vocab_size, bias=False)
        with torch.no_grad():
            self.lm_head.weight.copy_(target.get_output_embeddings().weight)
            self._fit(target, samples, seed)
        self.eval()

    def _fit(self, target, samples: int, seed: int) -> None:
        """Least squares: the target's hidden state at t+1 from its hidden state at t and token t+1.

        Trained offline, as a real head is: through the target's base model (`target.model`, whose
        last hidden state is the causal LM's), so the fit is no call of the causal LM being served."""
        ids = torch.randint(3, target.config.vocab_size, (samples, 16), generator=torch.Generator().manual_seed(seed))
        h = target.model(input_ids=ids).last_hidden_state
        e = target.get_input_embeddings()(ids)
        x = torch.cat([h[:, :-1], e[:, 1:], torch.ones(*h.shape[:1], h.shape[1] - 1, 1)], -1)
        w = torch.linalg.lstsq(x.flatten(0, 1), h[:, 1:].flatten(0, 1), driver="gelsd").solution
        self.fc.weight.copy_(w[:-1].T)
        self.fc.bias.copy_(w[-1])

    def forward(self, hidden_states: torch.Tensor, inputs_embeds: torch.Tensor) -> CausalLMOutput:
        feature = self.fc(torch.cat([hidden_states, inputs_embeds], -1))
        return CausalLMOutput(logits=self.lm_head(feature), hidden_states=(feature,))


class MedusaHeads(nn.Module):
    """Medusa-shaped: one call, fed the target's hidden state [B, 1, H] and the pending token's ids
    [B, 1], returns logits [B, n, V], column i proposing draft i + 1. Its heads chain a `DraftHead`
    inside the call (each depth fed the depth before), so it drafts as well as the EAGLE-like head
    while the watch sees one call with more logits columns than query slots."""

    def __init__(self, target, n: int = 2) -> None:
        super().__init__()
        self.inner = DraftHead(target)
        self.embed = target.get_input_embeddings()
        self.n = n

    def forward(self, hidden_states: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
        hidden, tokens, logits = hidden_states, input_ids, []
        for _ in range(self.n):
            out = self.inner(hidden_states=hidden, inputs_embeds=self.embed(tokens))
            logits.append(out.logits[:, -1])
            hidden, tokens = out.hidden_states[-1], out.logits[:, -1:].argmax(-1)
        return torch.stack(logits, 1)


class HiddenCache(HoleCache):
    """`HoleCache` whose calls also return the target's last hidden states; `last[r]` is the
    hidden state at the slot that predicted row r's pending token."""

    def __init__(self, target, seqs: list[list[int]]) -> None:
        self.target = target
        ids, self.mask = left_padded([s[:-1] for s in seqs])
        out = target(
            input_ids=ids,
            attention_mask=self.mask,
            position_ids=(self.mask.cumsum(1) - 1).clamp(min=0),
            output_hidden_states=True,
        )
        self.cache, self.last = out.past_key_values, out.hidden_states[-1][:, -1]
        self.lens = [len(s) - 1 for s in seqs]

    @torch.no_grad()
    def verify(self, queries: list[list[int]], shift: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        q = max(len(x) for x in queries)
        ids = torch.tensor([x + [0] * (q - len(x)) for x in queries])
        self.mask = torch.cat([self.mask, torch.tensor([[1] * len(x) + [0] * (q - len(x)) for x in queries])], 1)
        positions = torch.tensor([[n + s + i for i in range(q)] for n, s in zip(self.lens, shift)])
        out = self.target(
            input_ids=ids,
            attention_mask=self.mask,
            position_ids=positions,
            cache=self.cache,
            use_cache=True,
            output_hidden_states=True,
        )
        self.cache, self.q = out.past_key_values, q
        return out.logits, out.hidden_states[-1]

    def select(self, rows: list[int]) -> None:
        super().select(rows)
        self.last = self.last[rows]


@torch.no_grad()
def propose(head: DraftHead | MedusaHeads, target, last: torch.Tensor, pending: list[int], n: int) -> list[list[int]]:
    """n drafts per row: head call j is fed the feature before and the token it proposed last
    (a `MedusaHeads` drafter: one call gives them all)."""
    if isinstance(head, MedusaHeads):
        if n == 0:
            return [[] for _ in pending]
        logits = head(hidden_states=last[:, None], input_ids=torch.tensor(pending)[:, None])
        return logits[:, :n].argmax(-1).tolist()
    hidden, tokens, out = last[:, None], torch.tensor(pending)[:, None], []
    for _ in range(n):
        step = head(hidden_states=hidden, inputs_embeds=target.get_input_embeddings()(tokens))
        tokens = step.logits[:, -1:].argmax(-1)
        hidden = step.hidden_states[-1]
        out.append(tokens[:, 0].tolist())
    return [list(row) for row in zip(*out)] if out else [[] for _ in pending]


@torch.no_grad()
def generate(target, head, prompts, max_new, k=2, bug=None, w=None, packed=0):
    if packed:
        return generate_packed(target, head, prompts, max_new, k, bug, w)
    limit = budgets(max_new, len(prompts))
    seqs = [list(p) for p in prompts]
    outs: list[list[int]] = [[] for _ in prompts]
    batch = list(range(len(prompts)))
    cache = HiddenCache(target, seqs)
    eos, done = eos_ids(target), set()
    events: list[tuple[int, int]] = []
    step, previous = 0, None  # previous: the head's input of the step before
    while batch:
        if w is not None:
            w.rows(batch)
        d = [min(k, limit[s] - len(outs[s]) - 1) for s in batch]
        last = cache.last
        if bug == "head_row" and step == 1 and len(batch) > 1:
            last = last.roll(-1, 0)
            events.append((step, batch[0]))
        if bug == "head_stale" and step == 1 and previous is not None and previous.shape == last.shape:
            last = previous
            events.append((step, batch[0]))
        previous = cache.last
        proposed = propose(head, target, last, [seqs[s][-1] for s in batch], max(d))
        drafts = [p[:n] for p, n in zip(proposed, d)]
        shift = [0] * len(batch)
        if bug == "positions" and step == 2:
            r = next(r for r, x in enumerate(drafts) if x)
            shift[r] = 1
            events.append((step, batch[r]))
        logits, hidden = cache.verify([[seqs[s][-1]] + x for s, x in zip(batch, drafts)], shift)
        choices = logits.argmax(-1).tolist()
        kept, attended, last = [], [], cache.last.clone()
        for r, s in enumerate(batch):
            a = verify(drafts[r], choices[r])
            tokens, finish = settle(outs[s], drafts[r][:a] + [choices[r][a]], limit[s], eos)
            kept.append(1 + a)
            stale = bug == "stale_kv" and not events and a < d[r] and finish is None
            attended.append(cache.q if stale else 1 + a)
            if stale:
                events.append((step + 1, s))
            last[r] = hidden[r, a]  # it predicted the new pending token
            commit(s, tokens, finish, seqs, outs, done, w)
        cache.keep(kept, attended)
        cache.last = last
        live = [r for r, s in enumerate(batch) if s not in done]
        if live and len(live) < len(batch):
            cache.select(live)
        batch = [batch[r] for r in live]
        step += 1
    return outs, events


@torch.no_grad()
def generate_packed(target, head, prompts, max_new, k=2, bug=None, w=None):
    """The same head over a packed target (`shapes.SharedKV`, vLLM's EAGLE layout): one 1 x T verify
    row per step, the head fed one row per live sequence in packed order; nothing declared but
    the emits. Same bugs, same (step, sequence) rules."""
    n = len(prompts)
    limit = budgets(max_new, n)
    seqs = [list(p) for p in prompts]
    outs: list[list[int]] = [[] for _ in prompts]
    kv = SharedKV(target)
    out, slots = kv.forward([(s, seqs[s][:-1], 0) for s in range(n)], hidden=True)
    last = {s: out.hidden_states[-1][0, mine[-1]] for s, mine in enumerate(slots)}  # slots start at 0
    eos, done = eos_ids(target), set()
    events: list[tuple[int, int]] = []
    step, previous = 0, {}  # previous: the head's input of the step before, by sequence
    while live := [s for s in range(n) if s not in done]:
        d = {s: min(k, limit[s] - len(outs[s]) - 1) for s in live}
        fed = torch.stack([last[s] for s in live])
        if bug == "head_row" and step == 1 and len(live) > 1:
            fed = fed.roll(-1, 0)
            events.append((step, live[0]))
        if bug == "head_stale" and step == 1 and all(s in previous for s in live):
            fed = torch.stack([previous[s] for s in live])
            events.append((step, live[0]))
        previous = dict(last)
        proposed = propose(head, target, fed, [seqs[s][-1] for s in live], max(d.values()))
        drafts = {s: p[: d[s]] for s, p in zip(live, proposed)}
        shift = {s: 0 for s in live}
        if bug == "positions" and step == 2:
            s = next(s for s in live if drafts[s])
            shift[s] = 1
            events.append((step, s))
        chunks = [(s, [seqs[s][-1]] + drafts[s], len(seqs[s]) - 1 + shift[s]) for s in live]
        out, slots = kv.forward(chunks, hidden=True)
        logits, hidden, at = out.logits[0], out.hidden_states[-1][0], 0
        for (s, tokens, _), mine in zip(chunks, slots):
            choices = logits[at : at + len(tokens)].argmax(-1).tolist()
            a = accepted(drafts[s], choices)
            last[s] = hidden[at + a]  # it predicted the new pending token
            at += len(tokens)
            emitted, finish = settle(outs[s], drafts[s][:a] + [choices[a]], limit[s], eos)
            stale = bug == "stale_kv" and not events and a < d[s] and finish is None
            if stale:
                events.append((step + 1, s))
            else:
                kv.drop(mine[1 + a :])
            commit(s, emitted, finish, seqs, outs, done, w)
        step += 1
    return outs, events
