"""Continuous batching with speculative decoding over a fixed 3-slot padded batch.

Requests wait in a FIFO queue. Each of the 3 slots holds one request; when a request finishes,
the next waiting one is admitted into its slot within the same loop iteration: it is prefilled
ALONE (batch-1 forward over a fresh DynamicCache, target and draft), and that KV is spliced into
the slot's row of the batch caches, right-aligned (left-padded) to the batch's current width; if
the newcomer is longer than the batch, every row is left-padded to make room. The row's 2-D 0/1
mask is rebuilt so that the row attends only the newcomer's prompt.

Decoding: greedy, K=3 drafts per step. The draft cache lags the committed tokens by one or two
(the pending token, plus the last draft when all drafts were accepted); its first call of a step
feeds what it is missing, left-padded inside the query. The verify feeds [pending, d1, d2, d3];
rejected slots stay in the caches as masked holes (caches only grow). Idle slots (nothing left to
admit) are fed masked pads.

Bugs (--bug):
  oldpos  slot state is reused on admission and its length counter is not reset, so the
          newcomer's positions continue from the previous occupant's length.
  ghost   the slot's mask row is not cleared on splice: the previous occupant's attended KV
          columns stay attended for the newcomer (target and draft).
"""

import sys

import torch
import transformers
from common import EOS, args, budgets_for, cut, report, setup, watcher

K = 3
SLOTS = 3


def log(*a):
    print(*a, file=sys.stderr, flush=True)


class Slot:
    def __init__(self, seq, prompt, first):
        self.seq = seq
        self.ctx = list(prompt) + [first]  # committed tokens (the last one is pending)
        self.n = len(self.ctx)  # committed count: positions are 0 .. n-1
        self.out = [first]
        self.missing = [first]  # committed tokens not yet in the draft cache
        self.done = False
        self.steps = 0

    def reset(self, seq, prompt, first, bug):
        self.seq = seq
        self.ctx = list(prompt) + [first]
        if bug == "oldpos":
            self.n += 1  # BUG: counter kept from the previous occupant, advanced by the new token
        else:
            self.n = len(self.ctx)
        self.out = [first]
        self.missing = [first]
        self.done = False
        self.steps = 0


class PaddedKV:
    """A batch DynamicCache plus its 2-D 0/1 attention mask over the cache columns."""

    def __init__(self, config):
        self.config = config
        self.cache = None
        self.mask = torch.zeros(SLOTS, 0, dtype=torch.long)

    @property
    def width(self):
        return self.mask.shape[1]

    def splice(self, slot, single, bug=""):
        """Write a batch-1 cache's KV into `slot`, right-aligned; rebuild that row's mask."""
        P = single.get_seq_length()
        if self.cache is None:
            self.cache = _empty_like(self.config, single)
        W = self.width
        if P > W:  # the newcomer is longer than the batch: left-pad every row
            extra = P - W
            for layer in self.cache.layers:
                k, v = layer.keys, layer.values
                pad = k.new_zeros(k.shape[0], k.shape[1], extra, k.shape[3])
                layer.keys = torch.cat([pad, k], dim=2)
                layer.values = torch.cat([pad.clone(), v], dim=2)
            self.mask = torch.cat([torch.zeros(SLOTS, extra, dtype=torch.long), self.mask], dim=1)
            W = P
        for layer, src in zip(self.cache.layers, single.layers):
            layer.keys[slot, :, W - P :, :] = src.keys[0]
            layer.values[slot, :, W - P :, :] = src.values[0]
        if bug != "ghost":
            self.mask[slot] = 0
        self.mask[slot, W - P :] = 1

    def grow(self, cols):
        """Append query columns to the mask (1 real, 0 padding)."""
        self.mask = torch.cat([self.mask, cols], dim=1)
        return self.mask


def _empty_like(config, single):
    c = transformers.DynamicCache(config=config)
    for i, layer in enumerate(single.layers):
        k, v = layer.keys, layer.values
        shape = (SLOTS, k.shape[1], 0, k.shape[3])
        c.update(k.new_zeros(shape), v.new_zeros(shape), i)
    return c


def main():
    a = args()
    pair, tok, prompts = setup(a.n)
    budgets = budgets_for(a.n)
    T, D = pair.target, pair.draft
    PAD = pair.pad_token_id
    waiting = list(range(len(prompts)))
    outs = [None] * len(prompts)
    slots = [None] * SLOTS
    tkv, dkv = PaddedKV(T.config), PaddedKV(D.config)
    tcalls = [0]

    def tforward(**kw):
        tcalls[0] += 1
        return T(**kw)

    with torch.no_grad(), watcher(a, pair, prompts, "arrivals") as w:

        def finish_reason(s):
            if s.out and s.out[-1] == EOS:
                return "eos"
            if len(s.out) >= budgets[s.seq]:
                return "length"
            return None

        def admit(i):
            """Fill slot i with the next waiting request (or leave it idle)."""
            while waiting:
                seq = waiting.pop(0)
                p = prompts[seq]
                P = len(p)
                ids = torch.tensor([p])
                pos = torch.arange(P).unsqueeze(0)
                am = torch.ones(1, P, dtype=torch.long)
                w.batch([seq])
                tc = transformers.DynamicCache(config=T.config)
                logits = tforward(input_ids=ids, position_ids=pos, attention_mask=am, cache=tc, use_cache=True).logits
                first = int(logits[0, -1].argmax())
                w.batch([seq], model="draft")
                dc = transformers.DynamicCache(config=D.config)
                D(input_ids=ids, position_ids=pos, attention_mask=am, cache=dc, use_cache=True)
                tkv.splice(i, tc, a.bug)
                dkv.splice(i, dc, a.bug)
                if slots[i] is None:
                    slots[i] = Slot(seq, p, first)
                else:
                    slots[i].reset(seq, p, first, a.bug)
                s = slots[i]
                log(f"admit seq {seq} -> slot {i} (P={P}, width {tkv.width}) at target call {tcalls[0]}, n={s.n}")
                s.out = cut(s.out, budgets[seq])
                r = finish_reason(s)
                w.emit(seq, list(s.out), r)
                if r is None:
                    return
                s.done = True
                outs[seq] = s.out
            if slots[i] is not None:
                slots[i].done = True

        for i in range(SLOTS):
            admit(i)

        step = 0
        while any(s is not None and not s.done for s in slots):
            live = [s is not None and not s.done for s in slots]
            w.rows([s.seq for s in slots])

            # --- draft: catch up the draft cache, then K proposals -------------------------
            m = max(len(s.missing) for s, on in zip(slots, live) if on)
            ids = torch.full((SLOTS, m), PAD, dtype=torch.long)
            pos = torch.zeros(SLOTS, m, dtype=torch.long)
            cols = torch.zeros(SLOTS, m, dtype=torch.long)
            for r, (s, on) in enumerate(zip(slots, live)):
                if not on:
                    continue
                miss = s.missing
                j0 = m - len(miss)
                ids[r, j0:] = torch.tensor(miss)
                pos[r, j0:] = torch.arange(s.n - len(miss), s.n)
                cols[r, j0:] = 1
            drafts = [[] for _ in range(SLOTS)]
            dcols = []  # mask column index of each proposal's input (d1, d2) per call
            for call in range(K):
                mask = dkv.grow(cols)
                logits = D(input_ids=ids, position_ids=pos, attention_mask=mask, cache=dkv.cache, use_cache=True).logits
                nxt = logits[:, -1].argmax(-1)
                for r, on in enumerate(live):
                    if on:
                        drafts[r].append(int(nxt[r]))
                if call == K - 1:
                    break
                dcols.append(dkv.width)  # the column the next call writes
                ids = torch.full((SLOTS, 1), PAD, dtype=torch.long)
                pos = torch.zeros(SLOTS, 1, dtype=torch.long)
                cols = torch.zeros(SLOTS, 1, dtype=torch.long)
                for r, (s, on) in enumerate(zip(slots, live)):
                    if on:
                        ids[r, 0] = drafts[r][-1]
                        pos[r, 0] = s.n + call
                        cols[r, 0] = 1

            # --- verify [pending, d1..dK] ----------------------------------------------------
            ids = torch.full((SLOTS, K + 1), PAD, dtype=torch.long)
            pos = torch.zeros(SLOTS, K + 1, dtype=torch.long)
            cols = torch.zeros(SLOTS, K + 1, dtype=torch.long)
            for r, (s, on) in enumerate(zip(slots, live)):
                if on:
                    ids[r] = torch.tensor([s.ctx[-1]] + drafts[r])
                    pos[r] = torch.arange(s.n - 1, s.n + K)
                    cols[r] = 1
            base = tkv.width
            mask = tkv.grow(cols)
            logits = tforward(
                input_ids=ids, position_ids=pos, attention_mask=mask, cache=tkv.cache, use_cache=True
            ).logits
            choice = logits.argmax(-1)
            log(f"step {step} (target call {tcalls[0]}): slots {[s.seq if on else None for s, on in zip(slots, live)]}")

            freed = []
            for r, (s, on) in enumerate(zip(slots, live)):
                if not on:
                    continue
                g = [int(x) for x in choice[r]]
                d = drafts[r]
                n = 0
                while n < K and d[n] == g[n]:
                    n += 1
                new = d[:n] + [g[n]]
                # rejected drafts become holes in both caches
                tkv.mask[r, base + 1 + n :] = 0
                for j, c in enumerate(dcols):  # dcols[j] holds d_{j+1}
                    if j >= n:
                        dkv.mask[r, c] = 0
                s.missing = [d[K - 1], g[n]] if n == K else [g[n]]
                new = cut(new, budgets[s.seq] - len(s.out))
                s.out += new
                s.ctx += new
                s.n += len(new)
                s.steps += 1
                r_ = finish_reason(s)
                w.emit(s.seq, new, r_)
                if r_ is not None:
                    s.done = True
                    outs[s.seq] = s.out
                    freed.append(r)
            for r in freed:
                admit(r)
            step += 1

    report(outs, prompts, budgets, tok)


if __name__ == "__main__":
    main()
