"""Greedy speculative decoding with a transformers StaticCache for the target.

Shape: the prompts are left-padded to the longest (W) and prefilled by both models. The target
keeps a StaticCache of L columns; every target forward writes its query at ONE shared
`cache_position` (all rows the same columns), and the 2-D 0/1 attention mask spans the static
cache's full width L. Each verify writes K+1 = 4 columns [pending, d1, d2, d3] for every row;
a row keeps attended only the columns it committed (pending + accepted drafts), so rows that
accepted fewer drafts leave masked holes. Positions are each row's count of attended columns.
The draft model has its own DynamicCache (grows by what is fed, left-padded, holes masked),
proposing K=3 drafts per step with 3 calls: [unseen-or-pad, pending], d1, d2.
Finished rows stay in the batch, fed masked pads.

Bugs: --bug sharedpos : verify position_ids are the shared cache_position (column index) rather
                        than the row's own attended count
      --bug unmask    : a row's rejected verify columns are left attended in the target mask
"""

import sys

import torch
from common import EOS, args, budgets_for, cut, report, setup, watcher
from transformers import DynamicCache, StaticCache

K = 3
PAD = 1


def main():
    a = args()
    pair, tok, prompts = setup(a.n)
    budgets = budgets_for(a.n)
    target, draft = pair.target, pair.draft
    B = len(prompts)
    W = max(len(p) for p in prompts)
    pads = [W - len(p) for p in prompts]
    L = W + (K + 1) * (max(budgets) + 1)
    outs = [[] for _ in prompts]
    done = [False] * B
    tmask = [[0] * pads[r] + [1] * len(p) + [0] * (L - W) for r, p in enumerate(prompts)]
    dmask = [[0] * pads[r] + [1] * len(p) for r, p in enumerate(prompts)]
    unseen = [None] * B  # a fully accepted row's last draft: committed but never fed to the draft
    first = None
    pending_effects = []

    effects = []

    def note(step, seq, why):
        nonlocal first
        effects.append((step, seq))
        if first is None:
            first = (step, seq, why)

    def finish(r, new):
        new = cut(new, budgets[r] - len(outs[r]))
        outs[r] += new
        fin = new[-1] == EOS or len(outs[r]) >= budgets[r]
        done[r] = fin
        return new, (("eos" if new[-1] == EOS else "length") if fin else None)

    with torch.no_grad(), watcher(a, pair, prompts, "probe-staticcache") as w:
        tc = StaticCache(config=target.config, max_cache_len=L)
        dc = DynamicCache(config=draft.config)
        ids = torch.tensor([[PAD] * pads[r] + p for r, p in enumerate(prompts)])
        am = torch.tensor([m[:W] for m in tmask])
        pos = (am.cumsum(-1) - 1).clamp(min=0)
        logits = target(
            input_ids=ids, attention_mask=torch.tensor(tmask), position_ids=pos, cache=tc, use_cache=True
        ).logits
        draft(input_ids=ids, attention_mask=am, position_ids=pos, cache=dc, use_cache=True)
        cur = W  # next free static column, shared by all rows
        pending = logits[:, -1].argmax(-1).tolist()
        for r in range(B):
            new, why = finish(r, [pending[r]])
            w.emit(r, new, why)
        step = 0
        while not all(done):
            step += 1
            live = [not d for d in done]
            # ---- draft: K calls
            feed = [[unseen[r] if unseen[r] is not None else PAD, pending[r]] for r in range(B)]
            feedm = [[int(live[r] and unseen[r] is not None), int(live[r])] for r in range(B)]
            props = [[] for _ in range(B)]
            for _i in range(K):
                am = torch.tensor([dmask[r] + feedm[r] for r in range(B)])
                pos = []
                for r in range(B):
                    c = sum(dmask[r])
                    row = []
                    for m in feedm[r]:
                        row.append(c if m else max(c - 1, 0))
                        c += m
                    pos.append(row)
                lg = draft(
                    input_ids=torch.tensor(feed),
                    attention_mask=am,
                    position_ids=torch.tensor(pos),
                    cache=dc,
                    use_cache=True,
                ).logits[:, -1]
                nxt = lg.argmax(-1).tolist()
                for r in range(B):
                    dmask[r] += feedm[r]
                    props[r].append(nxt[r])
                feed = [[props[r][-1]] for r in range(B)]
                feedm = [[int(live[r])] for r in range(B)]
            # ---- verify: K+1 columns at the shared cache_position (the StaticCache writes at its
            # cumulative length, the same columns for every row)
            cp = torch.arange(cur, cur + K + 1)
            q = [[pending[r]] + props[r] if live[r] else [PAD] * (K + 1) for r in range(B)]
            counts = [sum(tmask[r]) for r in range(B)]
            if a.bug == "sharedpos":
                pos = cp.unsqueeze(0).expand(B, -1)
                for r in range(B):
                    if live[r] and counts[r] != cur:
                        note(step, r, "positions from the shared cache_position")
            else:
                pos = torch.tensor([[counts[r] + i for i in range(K + 1)] for r in range(B)])
            for r in range(B):
                tmask[r][cur : cur + K + 1] = [int(live[r])] * (K + 1)
            logits = target(
                input_ids=torch.tensor(q),
                attention_mask=torch.tensor(tmask),
                position_ids=pos,
                cache=tc,
                use_cache=True,
            ).logits
            choice = logits.argmax(-1).tolist()
            assert int(tc.get_seq_length()) == cur + K + 1
            for r in range(B):
                if not live[r]:
                    dmask[r][-(K + 1) :] = [0] * (K + 1)
                    continue
                d = props[r]
                acc = 0
                while acc < K and d[acc] == choice[r][acc]:
                    acc += 1
                new = d[:acc] + [choice[r][acc]]
                if a.bug == "unmask":
                    keep = K + 1  # rejected columns left attended
                    if acc < K:
                        pending_effects.append((step + 1, r))
                else:
                    keep = acc + 1
                tmask[r][cur : cur + K + 1] = [1] * keep + [0] * (K + 1 - keep)
                # draft slots of this step: [unseen?, pending, d1, d2]; keep d_i while i <= acc
                fed = min(acc, K - 1)
                dmask[r][-(K + 1) :] = dmask[r][-(K + 1) : -(K - 1)] + [1] * fed + [0] * (K - 1 - fed)
                unseen[r] = d[-1] if acc == K else None
                pending[r] = new[-1]
                new, why = finish(r, new)
                w.emit(r, new, why)
            cur += K + 1
            for s, r in pending_effects:
                if not done[r]:
                    note(s, r, "rejected verify columns left attended")
            pending_effects.clear()
    report(outs, prompts, budgets, tok)
    if a.bug:
        print("BUG first effect: step {}, seq {}: {}".format(*first) if first else "BUG no effect")
        if first:
            print(f"BUG rows hit at step {first[0]}: {sorted({q for s, q in effects if s == first[0]})}")


if __name__ == "__main__":
    sys.exit(main())
