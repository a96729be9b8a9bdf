"""A second static-slots engine, written apart from `slots.py` (issue 41's "engines written by
others"): plain Hugging Face forwards, nothing from specviz.

A fixed pool of `n_slots` batch rows, each over its own stretch of a static KV buffer
(`SlotBuffer`: per layer keys/values [n_slots, kv_heads, capacity, head_dim], allocated once).
Both the target and the draft run over such a buffer; every forward of either model is
[n_slots, width]: each row is written at its own `cache_position` row ([n_slots, width], passed
to the buffer by the attention layers) and carries an additive 4-D mask over the buffer's
`capacity` keys (query token i of a row sees positions 0 .. base + i of its slot, nothing else).
Positions are fed as `position_ids`. Right padding and idle rows: pad tokens whose mask row is
all blocked, written to the slot's scratch column (the last one), never read.

- a request's prompt is prefilled whole, from position 0, and that forward's last logits give its
  first token (a step that yields one token, no drafts); the first `n_slots` requests are
  prefilled together;
- a decode step: the draft, which keeps its own slot buffer, first catches up on what it has not
  seen of each live row (1 or 2 tokens; a whole prompt for a newcomer) and proposes one token,
  then proposes k - 1 more one call at a time (fewer near a request's budget: ragged rows);
  the target verifies `[pending, drafts...]` of every live row in one forward;
- a request that ends frees its slot; the next waiting request is prefilled into it from position
  0 *inside the next target forward*, beside the other slots' verify rows (its row: the prompt;
  theirs: pending + drafts). The slot's old KV stays in the buffer past the newcomer, never seen.

Bugs (each fires once; `events[0]` = (step, sequence) where it shows, step = the target forward's
index, every target forward here yielding tokens):
- "keep_len": a recycled slot's length is not reset: the newcomer is written, positioned and
  masked after the old request's KV (its prefill step attends it);
- "positions": a recycled slot's positions continue the old request's (writes and mask right);
- "off_by_one": the first row that rejects a draft (after the first decode step) counts one
  accepted draft too many: it keeps the rejected draft and the target's choice after it.
"""

from __future__ import annotations

import torch

BUGS = ("keep_len", "positions", "off_by_one")
PAD_ID = 0
BLOCKED = torch.finfo(torch.float32).min


class SlotBuffer:
    """Static per-slot KV: writes go where the forward's `cache_position` [rows, q] says."""

    def __init__(self, n_slots: int, capacity: int) -> None:
        self.n_slots, self.capacity = n_slots, capacity
        self.layers: list[tuple[torch.Tensor, torch.Tensor]] = []

    def update(self, key_states, value_states, layer_idx, kwargs=None, **_):
        where = kwargs["cache_position"]
        while len(self.layers) <= layer_idx:
            rows, heads, _, dim = key_states.shape
            blank = key_states.new_zeros((rows, heads, self.capacity, dim))
            self.layers.append((blank, blank.clone()))
        keys, values = self.layers[layer_idx]
        idx = where[:, None, :, None].expand(-1, key_states.shape[1], -1, key_states.shape[3])
        keys.scatter_(2, idx, key_states)
        values.scatter_(2, idx, value_states)
        return keys, values

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.capacity


class SlotModel:
    """One model over a `SlotBuffer`; `used[s]` tokens of slot s are the current request's and
    `offset[s]` is added to its fed positions (0 unless a bug)."""

    def __init__(self, model, n_slots: int, capacity: int) -> None:
        self.model = model
        self.buffer = SlotBuffer(n_slots, capacity)
        self.used = [0] * n_slots
        self.offset = [0] * n_slots

    @torch.no_grad()
    def run(self, feeds: dict[int, list[int]]) -> list[list[int]]:
        """Feed `feeds[slot]` after each slot's `used` tokens (slots not named idle); returns the
        argmax at each fed token, per slot. `used` is not advanced: the caller says what stays."""
        n, cap = self.buffer.n_slots, self.buffer.capacity
        width = max(len(t) for t in feeds.values())
        ids = torch.full((n, width), PAD_ID, dtype=torch.long)
        where = torch.full((n, width), cap - 1, dtype=torch.long)  # the scratch column
        pos = torch.zeros((n, width), dtype=torch.long)
        mask = torch.full((n, 1, width, cap), BLOCKED)
        for s, tokens in feeds.items():
            base = self.used[s]
            ids[s, : len(tokens)] = torch.tensor(tokens)
            for i in range(len(tokens)):
                where[s, i] = base + i
                pos[s, i] = base + i + self.offset[s]
                mask[s, 0, i, : base + i + 1] = 0.0
        logits = self.model(
            input_ids=ids,
            position_ids=pos,
            cache_position=where,
            attention_mask=mask,
            cache=self.buffer,
            use_cache=True,
        ).logits
        best = logits.argmax(-1).tolist()
        return [best[s][: len(feeds[s])] if s in feeds else [] for s in range(n)]


def _eos(model) -> set[int]:
    raw = getattr(model.generation_config, "eos_token_id", None)
    if raw is None:
        raw = model.config.eos_token_id
    return set() if raw is None else ({raw} if isinstance(raw, int) else set(raw))


class Request:
    def __init__(self, rid: int, prompt: list[int], budget: int) -> None:
        self.rid, self.tokens, self.budget = rid, list(prompt), budget
        self.out: list[int] = []

    def take(self, new: list[int], eos: set[int]) -> tuple[list[int], str | None]:
        """Append what fits the budget, up to an end-of-sequence id; (kept, finish reason)."""
        kept: list[int] = []
        for t in new:
            if len(self.out) + len(kept) >= self.budget:
                break
            kept.append(t)
            if t in eos:
                break
        self.tokens += kept
        self.out += kept
        if kept and kept[-1] in eos:
            return kept, "eos"
        return kept, "length" if len(self.out) >= self.budget else None


@torch.no_grad()
def generate(target, draft, prompts, max_new, k=3, bug=None, w=None, n_slots=2):
    """Outputs (one list per prompt) and `events` [(step, request)] where the bug fired."""
    if bug is not None and bug not in BUGS:
        raise ValueError(bug)
    quotas = list(max_new) if isinstance(max_new, (list, tuple)) else [max_new] * len(prompts)
    everyone = [Request(i, p, b) for i, (p, b) in enumerate(zip(prompts, quotas))]
    queue = list(everyone)
    n_slots = min(n_slots, len(queue))
    capacity = 2 * (max(len(p) for p in prompts) + max(quotas) + k) + 2
    tgt, drf = SlotModel(target, n_slots, capacity), SlotModel(draft, n_slots, capacity)
    eos = _eos(target)
    owner: list[Request | None] = [None] * n_slots  # the request in each slot (None: idle)
    shown = [0] * n_slots  # the request each row holds, or last held (what `w.rows` says)
    recycled = [False] * n_slots  # the slot held a request before
    fresh: set[int] = set()  # slots whose request is prefilled by the next target forward
    events: list[tuple[int, int]] = []
    step = 0

    def admit(slot: int) -> None:
        req = queue.pop(0)
        old = tgt.used[slot] + tgt.offset[slot]
        owner[slot], shown[slot] = req, req.rid
        fresh.add(slot)
        tgt.used[slot], tgt.offset[slot], drf.used[slot] = 0, 0, 0
        if recycled[slot] and not events and bug in ("keep_len", "positions"):
            if bug == "keep_len":
                tgt.used[slot] = old
            else:
                tgt.offset[slot] = old
            events.append((step, req.rid))

    for slot in range(n_slots):
        admit(slot)
    while any(o is not None for o in owner):
        live = [s for s in range(n_slots) if owner[s] is not None and s not in fresh]
        if w is not None:
            w.rows(list(shown))
        # The draft: catch up on what it has not seen (and propose one), then one token a call.
        plan = {s: min(k, owner[s].budget - len(owner[s].out) - 1) for s in live}
        proposals: dict[int, list[int]] = {s: [] for s in live}
        for depth in range(max(plan.values(), default=0)):
            feeds = {}
            for s in live:
                if depth < plan[s]:
                    feeds[s] = owner[s].tokens[drf.used[s] :] if depth == 0 else [proposals[s][-1]]
            picks = drf.run(feeds)
            for s, fed in feeds.items():
                drf.used[s] += len(fed)
                proposals[s].append(picks[s][-1])
        # The target: every live row's verify and every newcomer's prefill in one forward.
        feeds = {s: [owner[s].tokens[-1]] + proposals[s] for s in live}
        feeds.update({s: list(owner[s].tokens) for s in fresh})
        picks = tgt.run(feeds)
        freed = []
        for s in sorted(feeds):
            req = owner[s]
            if s in fresh:
                new = [picks[s][-1]]
                tgt.used[s] += len(feeds[s])
            else:
                drafts = proposals[s]
                a = 0
                while a < len(drafts) and drafts[a] == picks[s][a]:
                    a += 1
                if bug == "off_by_one" and not events and step >= 2 and a < len(drafts):
                    a += 1  # one rejected draft counted as accepted
                    events.append((step, req.rid))
                new = drafts[:a] + [picks[s][a]]
                tgt.used[s] += 1 + a
                if drafts:  # the draft wrote the pending token and drafts[:-1]: keep the accepted
                    drf.used[s] = len(req.tokens) + min(a, len(drafts) - 1)
            kept, finish = req.take(new, eos)
            if w is not None:
                w.emit(req.rid, kept, finish)
            if finish:
                owner[s], recycled[s] = None, True
                freed.append(s)
        fresh.clear()
        step += 1
        for s in freed:
            if queue:
                admit(s)
    return [r.out for r in everyone], events
