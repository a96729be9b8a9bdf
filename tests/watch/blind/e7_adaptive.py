"""Adaptive-k speculative decoding over one left-padded batch.

Shape: the prompts are left-padded and prefilled whole by both models (the target's prefill yields
each row's first token). Both models keep their own DynamicCache for the whole run; the caches only
grow. Each step every live row r proposes its own number of drafts, k_r = 1 + (drafts it accepted
last step), capped at KMAX (first step: K0). Draft calls run max_r k_r times; a row that has all its
drafts feeds a masked pad. The target verifies [pending, d_1 .. d_k_r] per row, right-padded to the
step's max k + 1 (padding masked in the 2-D mask). Rejected and padded verify slots stay in the cache
as masked holes. Positions are each row's count of attended slots. Finished rows stay in the batch,
fed masked pads only.

Bugs: --bug stale  : rows whose k_r is below the step's max keep their padded/rejected verify slots
                     attended (mask not cleared)
      --bug maxpos : every row's verify positions start from the batch's largest attended count
"""

import os
import sys

import torch
from common import EOS, args, budgets_for, cut, report, setup, watcher
from transformers import DynamicCache

KMAX = 4
K0 = 2
PAD = 1


def main():
    a = args()
    pair, tok, prompts = setup(a.n)
    budgets = budgets_for(a.n)
    target, draft = pair.target, pair.draft
    B = len(prompts)
    W = max(len(p) for p in prompts)
    pads = [W - len(p) for p in prompts]
    outs = [[] for _ in prompts]
    done = [False] * B
    k = [K0] * B
    tmask = [[0] * pads[r] + [1] * len(p) for r, p in enumerate(prompts)]
    dmask = [list(m) for m in tmask]
    unseen = [None] * B  # last draft of a row that accepted all: committed, never fed to the draft
    first_effect = None

    def note(verify, seq, why):
        nonlocal first_effect
        if first_effect is None:
            first_effect = (verify, seq, why)

    with torch.no_grad(), watcher(a, pair, prompts, "probe-adaptive") as w:
        tc, dc = DynamicCache(config=target.config), DynamicCache(config=draft.config)
        ids = torch.tensor([[PAD] * pads[r] + p for r, p in enumerate(prompts)])
        am = torch.tensor(tmask)
        pos = (am.cumsum(-1) - 1).clamp(min=0)
        first = target(input_ids=ids, attention_mask=am, position_ids=pos, cache=tc, use_cache=True).logits[:, -1]
        draft(input_ids=ids, attention_mask=am, position_ids=pos, cache=dc, use_cache=True)
        pending = first.argmax(-1).tolist()
        for r in range(B):
            new = cut([pending[r]], budgets[r])
            outs[r] += new
            fin = new[-1] == EOS or len(outs[r]) >= budgets[r]
            w.emit(r, new, ("eos" if new[-1] == EOS else "length") if fin else None)
            done[r] = fin
        verify = 0  # verify calls made so far; the prefill is target call 0
        while not all(done):
            live = [r for r in range(B) if not done[r]]
            kk = [k[r] if not done[r] else 0 for r in range(B)]
            km = max(kk)
            if os.environ.get("DEBUG"):
                print("verify", verify + 1, "k", kk, file=sys.stderr)
            # --- draft: call 0 feeds [unseen-or-pad, pending]; call i feeds d_i; k_r calls per row
            feed = [[unseen[r] if unseen[r] is not None else PAD, pending[r]] for r in range(B)]
            feedm = [[int(unseen[r] is not None and not done[r]), int(not done[r])] for r in range(B)]
            props = [[] for _ in range(B)]
            for i in range(km):
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
                    if i < kk[r]:
                        props[r].append(nxt[r])
                # next call: rows still proposing feed their newest draft, the others a masked pad
                feed = [[props[r][-1] if i + 1 < kk[r] else PAD] for r in range(B)]
                feedm = [[int(i + 1 < kk[r])] for r in range(B)]
            # --- verify: [pending, drafts] right-padded to km + 1
            Q = km + 1
            q = [([pending[r]] + props[r] + [PAD] * (Q - 1 - kk[r])) if not done[r] else [PAD] * Q for r in range(B)]
            qm = [([1] * (kk[r] + 1) + [0] * (Q - 1 - kk[r])) if not done[r] else [0] * Q for r in range(B)]
            counts = [sum(tmask[r]) for r in range(B)]
            base = [max(counts[x] for x in live) if a.bug == "maxpos" else counts[r] for r in range(B)]
            if a.bug == "maxpos":
                for r in live:
                    if base[r] != counts[r]:
                        note(verify + 1, r, "verify positions from the longest row")
                        break
            pos = torch.tensor([[base[r] + i for i in range(Q)] for r in range(B)])
            am = torch.tensor([tmask[r] + qm[r] for r in range(B)])
            logits = target(
                input_ids=torch.tensor(q), attention_mask=am, position_ids=pos, cache=tc, use_cache=True
            ).logits
            choice = logits.argmax(-1).tolist()
            verify += 1
            for r in range(B):
                if done[r]:
                    tmask[r] += [0] * Q
                    dmask[r][-(km + 1) :] = [0] * (km + 1)
                    continue
                d = props[r]
                acc = 0
                while acc < kk[r] and d[acc] == choice[r][acc]:
                    acc += 1
                new = d[:acc] + [choice[r][acc]]
                if a.bug == "stale" and kk[r] < km:
                    tmask[r] += [1] * Q  # padded and rejected slots left attended
                    stale_pending.append((verify + 1, r))
                else:
                    tmask[r] += [1] * (acc + 1) + [0] * (Q - acc - 1)
                # draft slots of this step: [unseen?, pending, d_1 .. d_(km-1) or pads]
                fed = min(acc, kk[r] - 1)
                dm = dmask[r][-(km + 1) :]
                keep = dm[:2] + [1] * fed + [0] * (km - 1 - fed)
                dmask[r][-(km + 1) :] = keep
                unseen[r] = d[-1] if acc == kk[r] else None
                pending[r] = new[-1]
                k[r] = min(1 + acc, KMAX)
                new = cut(new, budgets[r] - len(outs[r]))
                outs[r] += new
                fin = new[-1] == EOS or len(outs[r]) >= budgets[r]
                w.emit(r, new, ("eos" if new[-1] == EOS else "length") if fin else None)
                done[r] = fin
            # stale: the effect is the row's next verify, if it still runs one
            for v, r in stale_pending:
                if not done[r]:
                    note(v, r, "stale verify slots attended")
            stale_pending.clear()
    report(outs, prompts, budgets, tok)
    if a.bug:
        print(
            "BUG first effect: verify call {0} (target call {0}), seq {1}: {2}".format(*first_effect)
            if first_effect
            else "BUG no effect"
        )


stale_pending = []

if __name__ == "__main__":
    sys.exit(main())
