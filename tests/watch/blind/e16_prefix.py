"""Greedy speculative decoding with a shared system prefix (prefix caching).

Shape: every prompt is PREFIX + suffix_r. Both models prefill the prefix ONCE (batch 1), the
prefix KV is repeated along the batch dim (DynamicCache.batch_repeat_interleave) to B rows, then
the suffixes are prefilled in one ragged call: right-padded to S, 2-D mask over [prefix | suffixes],
positions Lp .. Lp+S-1. The target's column len(s_r)-1 gives row r's first token. Decode writes at
the batch's common frontier (after Lp+S): a shorter suffix leaves a masked gap; rejected drafts
become masked holes; caches only grow. K = 3: the draft is fed [unseen-or-hole, pending], then d1,
d2; the target verifies [pending, d1, d2, d3]. Positions are each row's logical indices. Finished
rows stay, fed masked pads.

Bugs: --bug sufpos      : the suffix prefill's positions restart at 0 (arange(S)) instead of Lp+j
                          (both models; decode positions are right)
      --bug crosssuffix : the suffix-prefill mask is built as all ones over [prefix | suffix block],
                          so the right padding of each shorter suffix is attended, and the running
                          decode masks (both models) start from it
"""

import torch
from common import EOS, args, budgets_for, cut, prefixed, report, setup, watcher
from transformers import DynamicCache

K = 3
PAD = 1


def main():
    a = args()
    pair, tok, _ = setup(a.n)
    pre, sufs = prefixed(tok, a.n)
    prompts = [pre + s for s in sufs]
    budgets = budgets_for(a.n)
    target, draft = pair.target, pair.draft
    B, Lp = len(prompts), len(pre)
    Ls = [len(s) for s in sufs]
    S = max(Ls)
    L = [Lp + x for x in Ls]  # full prompt lengths
    W = Lp + S
    outs = [[] for _ in prompts]
    done = [False] * B
    first_effect = None

    def note(step, seq, why):
        nonlocal first_effect
        if first_effect is None:
            first_effect = (step, seq, why)

    if a.bug == "crosssuffix":
        prompt_mask = [[1] * W for r in range(B)]
    else:
        prompt_mask = [[1] * Lp + [1] * Ls[r] + [0] * (S - Ls[r]) for r in range(B)]
    tmask = [list(m) for m in prompt_mask]
    dmask = [list(m) for m in prompt_mask]
    unseen = [None] * B

    with torch.no_grad(), watcher(a, pair, prompts, "probe-prefix") as w:
        tc, dc = DynamicCache(config=target.config), DynamicCache(config=draft.config)
        # ---- shared prefix, once, batch 1
        pids = torch.tensor([pre])
        ppos = torch.arange(Lp).unsqueeze(0)
        target(
            input_ids=pids,
            position_ids=ppos,
            attention_mask=torch.ones(1, Lp, dtype=torch.long),
            cache=tc,
            use_cache=True,
        )
        draft(
            input_ids=pids,
            position_ids=ppos,
            attention_mask=torch.ones(1, Lp, dtype=torch.long),
            cache=dc,
            use_cache=True,
        )
        tc.batch_repeat_interleave(B)
        dc.batch_repeat_interleave(B)
        # ---- suffixes, one ragged right-padded call
        ids = torch.tensor([s + [PAD] * (S - len(s)) for s in sufs])
        am = torch.tensor(prompt_mask)
        if a.bug == "sufpos":
            pos = torch.arange(S).unsqueeze(0).expand(B, S)
            for r in range(B):
                note(0, r, "suffix positions restart at 0")
        else:
            pos = (Lp + torch.arange(S)).unsqueeze(0).expand(B, S)
        lg = target(input_ids=ids, attention_mask=am, position_ids=pos, cache=tc, use_cache=True).logits
        draft(input_ids=ids, attention_mask=am, position_ids=pos, cache=dc, use_cache=True)
        pending = [int(lg[r, Ls[r] - 1].argmax()) for r in range(B)]
        for r in range(B):
            new = cut([pending[r]], budgets[r])
            outs[r] += new
            fin = new[-1] == EOS or len(outs[r]) >= budgets[r]
            w.emit(r, new, ("eos" if new[-1] == EOS else "length") if fin else None)
            done[r] = fin

        step = 0
        while not all(done):
            step += 1
            n = [L[r] + len(outs[r]) for r in range(B)]  # committed, pending included
            feed = [[unseen[r] if unseen[r] is not None else PAD, pending[r]] for r in range(B)]
            fm = [[int(unseen[r] is not None and not done[r]), int(not done[r])] for r in range(B)]
            fp = [[n[r] - 2, n[r] - 1] for r in range(B)]
            props = [[] for _ in range(B)]
            for i in range(K):
                am = torch.tensor([dmask[r] + fm[r] for r in range(B)])
                lgd = draft(
                    input_ids=torch.tensor(feed),
                    attention_mask=am,
                    position_ids=torch.tensor(fp),
                    cache=dc,
                    use_cache=True,
                ).logits[:, -1]
                nxt = lgd.argmax(-1).tolist()
                for r in range(B):
                    dmask[r] += fm[r]
                    props[r].append(nxt[r])
                feed = [[props[r][-1]] for r in range(B)]
                fm = [[int(not done[r])] for r in range(B)]
                fp = [[n[r] + i] for r in range(B)]
            q = [[pending[r]] + props[r] if not done[r] else [PAD] * (K + 1) for r in range(B)]
            qm = [[int(not done[r])] * (K + 1) for r in range(B)]
            qp = [[n[r] - 1 + i for i in range(K + 1)] for r in range(B)]
            if a.bug == "crosssuffix":
                for r in range(B):
                    if not done[r] and Ls[r] < S:
                        note(step, r, "suffix padding attended")
            am = torch.tensor([tmask[r] + qm[r] for r in range(B)])
            logits = target(
                input_ids=torch.tensor(q), attention_mask=am, position_ids=torch.tensor(qp), cache=tc, use_cache=True
            ).logits
            choice = logits.argmax(-1).tolist()
            for r in range(B):
                if done[r]:
                    tmask[r] += [0] * (K + 1)
                    continue
                d = props[r]
                acc = 0
                while acc < K and d[acc] == choice[r][acc]:
                    acc += 1
                new = d[:acc] + [choice[r][acc]]
                tmask[r] += [1] * (acc + 1) + [0] * (K - acc)
                fed = min(acc, K - 1)
                dmask[r][-K:] = [1] + [1] * fed + [0] * (K - 1 - fed)
                unseen[r] = d[-1] if acc == K else None
                pending[r] = new[-1]
                new = cut(new, budgets[r] - len(outs[r]))
                outs[r] += new
                fin = new[-1] == EOS or len(outs[r]) >= budgets[r]
                w.emit(r, new, ("eos" if new[-1] == EOS else "length") if fin else None)
                done[r] = fin
    report(outs, prompts, budgets, tok)
    if a.bug:
        print("BUG first effect: step {}, seq {}: {}".format(*first_effect) if first_effect else "BUG no effect")


if __name__ == "__main__":
    main()
