"""Static batch slots recycled CUDA-graph style, written with plain Hugging Face forwards (nothing
from specviz). Every target forward has the same batch: `slots` rows, one per slot of a static KV
cache (`StaticKV`: keys [slots, heads, max_len, dim] per layer, never reallocated, never moved).
Each row writes its query's keys at its own `cache_position` ([B, q], a forward keyword the
attention passes on to the cache) and its additive 4-D mask's keys are the slot's `max_len`
positions: query token i of a row attends positions 0 .. n + i of its slot (n: the tokens the slot
holds), nothing else. Positions are fed (`position_ids`), equal to the cache positions.

- the first `slots` prompts are prefilled together (right-padded, all but each pending token);
- each step a draft model that keeps no cache proposes up to k tokens per live row (fewer near a
  row's own budget: ragged drafts), re-reading each live sequence (`common.draft_greedy`); the
  target verifies every slot in one padded [slots, 1 + k] forward; idle slots (finished, nothing
  waiting) are fed pads whose query attends nothing;
- when a request finishes, its slot is recycled: the next waiting request is prefilled into it from
  position 0 (all but its pending token) in a [slots, P] forward where every other row is idle (its
  query attends nothing), and its mask attends only its own new tokens; the old KV stays in the
  slot past the newcomer's length, never attended.

Bugs, each at (step, sequence) = events[0], the first newcomer recycled into a slot:
- "stale_len": the slot's length is not reset: the prefill is written and positioned from 0, but
  the slot's length adds the newcomer's prompt to the old request's, so at its first step the
  newcomer attends the old request's KV and is positioned after it (KV, POSITIONS);
- "positions": the newcomer's positions continue the old request's (its KV and mask are right):
  POSITIONS at its first step;
- "continued": the slot's length is not reset at all: the newcomer's prefill is written,
  positioned and masked after the old request's KV, attending it (KV, POSITIONS at its first
  step; the prefill itself is no step).
"""

from __future__ import annotations

import torch

from .common import PAD, draft_greedy, verify
from .shapes import NEG, budgets, commit, eos_ids, settle

BUGS = ("stale_len", "positions", "continued")


class StaticKV:
    """A static cache: per layer, keys and values [slots, heads, max_len, dim], written where the
    forward's `cache_position` ([B, q]) says, row by row; every call sees all max_len positions."""

    def __init__(self, slots: int, max_len: int) -> None:
        self.slots, self.max_len = slots, max_len
        self.keys: dict[int, torch.Tensor] = {}
        self.values: dict[int, torch.Tensor] = {}

    def update(self, keys: torch.Tensor, values: torch.Tensor, layer_idx: int, kwargs=None, **_):
        where = kwargs["cache_position"]
        if layer_idx not in self.keys:
            shape = (self.slots, keys.shape[1], self.max_len, keys.shape[3])
            self.keys[layer_idx], self.values[layer_idx] = keys.new_zeros(shape), values.new_zeros(shape)
        rows = torch.arange(self.slots)[:, None]
        self.keys[layer_idx][rows, :, where] = keys.transpose(1, 2)
        self.values[layer_idx][rows, :, where] = values.transpose(1, 2)
        return self.keys[layer_idx], self.values[layer_idx]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.max_len


class Slots:
    """The target over a `StaticKV`: `lens[r]` tokens cached in slot r, `shift[r]` added to its
    positions (0 unless a bug says otherwise)."""

    def __init__(self, target, slots: int, max_len: int) -> None:
        self.target, self.cache = target, StaticKV(slots, max_len)
        self.lens, self.shift = [0] * slots, [0] * slots

    @torch.no_grad()
    def forward(self, queries: list[list[int]]) -> torch.Tensor:
        """Logits [slots, q, V] of each slot's query, written from its length on (an empty query:
        an idle slot, fed pads that attend nothing)."""
        q = max(len(x) for x in queries)
        ids = torch.tensor([x + [PAD] * (q - len(x)) for x in queries])
        at = torch.tensor([[n + i for i in range(q)] for n in self.lens])
        mask = torch.full((len(queries), 1, q, self.cache.max_len), NEG)
        for r, x in enumerate(queries):
            for i in range(len(x)):
                mask[r, 0, i, : self.lens[r] + i + 1] = 0.0
        positions = at + torch.tensor(self.shift)[:, None]
        fed = {"input_ids": ids, "attention_mask": mask, "position_ids": positions, "cache_position": at}
        return self.target(**fed, cache=self.cache, use_cache=True).logits


@torch.no_grad()
def generate(target, draft, prompts, max_new, k=2, bug=None, w=None, slots=3):
    limit = budgets(max_new, len(prompts))
    slots = min(slots, len(prompts))
    seqs = [list(p) for p in prompts]
    outs: list[list[int]] = [[] for _ in prompts]
    longest = max(len(p) for p in prompts)
    engine = Slots(target, slots, 2 * longest + max(limit) + k + 2)
    held = list(range(slots))  # the sequence each slot holds (its last one, once it is idle)
    live = [True] * slots
    waiting = list(range(slots, len(prompts)))
    eos, done = eos_ids(target), set()
    events: list[tuple[int, int]] = []
    _prefill(engine, w, held, list(range(slots)), seqs)
    step, continued = 0, None
    while any(live):
        rows = [r for r in range(slots) if live[r]]
        left = [limit[held[r]] - len(outs[held[r]]) for r in rows]
        d = [min(k, n - 1) for n in left]
        if w is not None:
            w.rows([held[r] for r in rows], model="draft")
        proposed = draft_greedy(draft, [seqs[held[r]] for r in rows], max(d)) if max(d) else [[] for _ in rows]
        drafts = {r: p[:n] for r, p, n in zip(rows, proposed, d)}
        queries = [[seqs[held[r]][-1]] + drafts[r] if live[r] else [] for r in range(slots)]
        if w is not None:
            w.rows(held, model="target")
        choices = engine.forward(queries).argmax(-1).tolist()
        freed = []
        for r in rows:
            s = held[r]
            a = verify(drafts[r], choices[r])
            tokens, finish = settle(outs[s], drafts[r][:a] + [choices[r][a]], limit[s], eos)
            engine.lens[r] += 1 + a
            commit(s, tokens, finish, seqs, outs, done, w)
            if s in done:
                live[r] = False
                freed.append(r)
        step += 1
        recycled = []
        for r in freed:
            if not waiting:
                break
            old, s = engine.lens[r] + engine.shift[r], waiting.pop(0)
            held[r], live[r] = s, True
            engine.shift[r] = old if bug == "positions" and not events else 0
            keep = bug in ("stale_len", "continued") and not events
            engine.lens[r] = old if keep else 0
            if bug == "continued" and not events:
                continued = r
            if bug in BUGS and not events:
                events.append((step, s))
            recycled.append(r)
        if recycled:
            _prefill(engine, w, held, recycled, seqs, continued)
            continued = None
    return outs, events


def _prefill(engine: Slots, w, held: list[int], rows: list[int], seqs: list[list[int]], continued=None) -> None:
    """Prefill these slots (all but each pending token) in one [slots, P] forward, the other slots
    idle. A slot whose length was not reset ("stale_len") is still written from position 0; its
    length then counts the old request's tokens too. The `continued` slot is written after them."""
    if w is not None:
        w.rows(held, model="target")
    stale = {r: engine.lens[r] for r in rows}
    for r in rows:
        engine.lens[r] = stale[r] if r == continued else 0
    engine.forward([seqs[held[r]][:-1] if r in stale else [] for r in range(len(held))])
    for r in rows:
        engine.lens[r] = stale[r] + len(seqs[held[r]]) - 1
