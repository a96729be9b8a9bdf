"""Engine 2: static slots recycled CUDA-graph style.

S fixed slots (< number of prompts), one static KV tensor per layer [S, H, L, D] written at each
row's own `cache_position` (a [S, T] tensor passed to the model, read by our cache layer); every
target forward has the fixed shape [S, K+1] (verify) or [S, P] (prefill). Idle rows are fed pads,
write nothing (cache_position -1) and attend nothing. A finished request's slot is prefilled
(all its prompt but the last token; with --first the whole prompt, whose last slot chooses the
first token, so the prefill is a step) for the next waiting request. Drafts: the draft model,
cacheless, re-reading each active row's context (left padded).

Bugs: --bug stale_len   : on recycle the slot keeps its old attended length when longer
                          (stale KV of the previous request attended by the newcomer)
      --bug pos_partial : the step after a partial accept feeds position_ids one too far
                          (cache_position right, only the rotary positions off)
"""

from collections import deque

import torch
from common import EOS, args, budgets_for, cut, report, setup, watcher
from transformers.cache_utils import Cache, CacheLayerMixin

S, K = 2, 3


class SlotLayer(CacheLayerMixin):
    is_compileable, is_sliding = False, False

    def __init__(self, slots, width):
        super().__init__()
        self.slots, self.width = slots, width

    def lazy_initialization(self, k, v):
        self.keys = torch.zeros(self.slots, k.shape[1], self.width, k.shape[3], dtype=k.dtype)
        self.values = torch.zeros(self.slots, v.shape[1], self.width, v.shape[3], dtype=v.dtype)
        self.is_initialized = True

    def update(self, k, v, *a, **kw):
        if not self.is_initialized:
            self.lazy_initialization(k, v)
        cp = kw["kwargs"]["cache_position"]  # [S, T], -1: write nothing
        for r in range(self.slots):
            keep = cp[r] >= 0
            self.keys[r][:, cp[r][keep]] = k[r][:, keep]
            self.values[r][:, cp[r][keep]] = v[r][:, keep]
        return self.keys, self.values

    def get_mask_sizes(self, q):
        return self.width, 0

    def get_seq_length(self):
        return self.width

    def get_max_length(self):
        return self.width


@torch.no_grad()
def propose(draft, ctxs):
    """K greedy tokens per context, cacheless, left padded."""
    ctxs = [list(c) for c in ctxs]
    out = [[] for _ in ctxs]
    for _ in range(K):
        w = max(len(c) for c in ctxs)
        ids = torch.tensor([[1] * (w - len(c)) + c for c in ctxs])
        am = torch.tensor([[0] * (w - len(c)) + [1] * len(c) for c in ctxs])
        pos = (am.cumsum(-1) - 1).clamp(min=0)
        nxt = draft(input_ids=ids, attention_mask=am, position_ids=pos, use_cache=False).logits[:, -1].argmax(-1)
        for i, t in enumerate(nxt.tolist()):
            ctxs[i].append(t)
            out[i].append(t)
    return out


def main():
    a = args({"--first": dict(action="store_true")})
    pair, tok, prompts = setup(a.n)
    budgets = budgets_for(a.n)
    target, draft = pair.target, pair.draft
    L = max(len(p) for p in prompts) + max(budgets) + K + 2
    cache = Cache(layers=[SlotLayer(S, L) for _ in range(target.config.num_hidden_layers)])
    slot_seq, attend = [None] * S, [0] * S  # request in each slot; cache columns it attends
    busy = [False] * S
    toks = {i: list(p) for i, p in enumerate(prompts)}
    outs = [[] for _ in prompts]
    waiting = deque(range(len(prompts)))
    calls, partial = 0, [False] * S

    def forward(ids, pos, cp, mask):
        return target(
            input_ids=ids, position_ids=pos, cache_position=cp, attention_mask=mask, cache=cache, use_cache=True
        ).logits

    with watcher(a, pair, prompts, "blind-slots") as w:

        def fill():
            new = []
            for r in range(S):
                if not busy[r] and waiting:
                    seq = waiting.popleft()
                    slot_seq[r], busy[r] = seq, True
                    n = len(prompts[seq]) - (0 if a.first else 1)  # prefill all but the last prompt token
                    attend[r] = max(attend[r], n) if a.bug == "stale_len" else n
                    if a.bug == "stale_len" and attend[r] > n:
                        print(f"BUG-HIT stale_len seq={seq} call={calls}")
                    new.append((r, seq))
            if not new:
                return
            P = max(len(prompts[s]) - (0 if a.first else 1) for _, s in new)
            ids = torch.ones(S, P, dtype=torch.long)
            cp = torch.full((S, P), -1)
            pos = torch.zeros(S, P, dtype=torch.long)
            mask = torch.zeros(S, 1, P, L, dtype=torch.bool)
            for r, seq in new:
                p = prompts[seq] if a.first else prompts[seq][:-1]
                ids[r, : len(p)] = torch.tensor(p)
                cp[r, : len(p)] = pos[r, : len(p)] = torch.arange(len(p))
                for j in range(len(p)):
                    mask[r, 0, j, : j + 1] = True
            w.rows([s if s is not None else 0 for s in slot_seq])
            logits = forward(ids, pos, cp, mask)
            if a.first:  # the prefill's last prompt slot chooses the first token
                for r, seq in new:
                    t = int(logits[r, len(prompts[seq]) - 1].argmax())
                    outs[seq].append(t)
                    toks[seq].append(t)
                    w.emit(seq, [t], None)

        fill()
        while any(busy):
            w.rows(list(slot_seq))
            act = [r for r in range(S) if busy[r]]
            props = dict(zip(act, propose(draft, [toks[slot_seq[r]] for r in act])))
            ids = torch.ones(S, K + 1, dtype=torch.long)
            cp = torch.full((S, K + 1), -1)
            pos = torch.zeros(S, K + 1, dtype=torch.long)
            mask = torch.zeros(S, 1, K + 1, L, dtype=torch.bool)
            for r in act:
                seq = slot_seq[r]
                n = len(toks[seq])  # pending token sits at n - 1
                ids[r] = torch.tensor([toks[seq][-1]] + props[r])
                cp[r] = torch.arange(n - 1, n + K)
                pos[r] = cp[r] + (1 if (a.bug == "pos_partial" and partial[r]) else 0)
                if a.bug == "pos_partial" and partial[r]:
                    print(f"BUG-HIT pos_partial call={calls} seq={seq}")
                mask[r, 0, :, : attend[r]] = True
                for j in range(K + 1):
                    mask[r, 0, j, n - 1 : n + j] = True
            am = forward(ids, pos, cp, mask).argmax(-1)
            calls += 1
            for r in act:
                seq, d = slot_seq[r], props[r]
                acc = 0
                while acc < K and d[acc] == int(am[r, acc]):
                    acc += 1
                partial[r] = 0 < acc < K
                new = cut(d[:acc] + [int(am[r, acc])], budgets[seq] - len(outs[seq]))
                outs[seq] += new
                toks[seq] += new
                done = outs[seq][-1] == EOS or len(outs[seq]) >= budgets[seq]
                w.emit(seq, new, ("eos" if outs[seq][-1] == EOS else "length") if done else None)
                attend[r] = len(toks[seq]) - 1
                if done:
                    busy[r] = False
            fill()
    report(outs, prompts, budgets, tok)


if __name__ == "__main__":
    main()
