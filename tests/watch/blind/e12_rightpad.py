"""Greedy speculative decoding over one RIGHT-padded batch with a common write frontier.

Shape: the prompts are right-padded to the batch's width W (pad tokens after each shorter prompt,
masked out in the 2-D mask) and prefilled whole by both models; the target's prefill column
L_r - 1 gives row r's first token. From then on every row writes its new tokens at the batch's
common cache width (after W), so a shorter row has a masked gap between its prompt and its
generated tokens. Positions are each row's logical indices (prompt length, then onward). Each
model keeps its own DynamicCache, which only grows; rejected drafts' slots become masked holes.
K = 3: the draft is fed incrementally (first call [unseen-or-hole, pending], then d1, d2), the
target verifies [pending, d1, d2, d3]. Finished rows stay, fed masked pads.

Bugs: --bug gap_pos : generated tokens' positions continue from the batch's width W instead of
                      the row's own length L_r (both models; a shared helper)
      --bug padkv   : the target's decode mask marks the whole prefill width attended, so the
                      right padding of a shorter prompt is attended from the first verify on
"""

import torch
from common import EOS, args, budgets_for, cut, report, setup, watcher
from transformers import DynamicCache

K = 3
PAD = 1


def main():
    a = args()
    pair, tok, prompts = setup(a.n)
    budgets = budgets_for(a.n)
    target, draft = pair.target, pair.draft
    B = len(prompts)
    L = [len(p) for p in prompts]
    W = max(L)
    outs = [[] for _ in prompts]
    done = [False] * B
    first_effect = None

    def note(verify, seq, why):
        nonlocal first_effect
        if first_effect is None:
            first_effect = (verify, seq, why)

    def logical(r, idx):
        """Position of the token at logical index idx of row r."""
        if a.bug == "gap_pos" and idx >= L[r]:
            return W + (idx - L[r])  # continue from the common width
        return idx

    prompt_mask = [[1] * L[r] + [0] * (W - L[r]) for r in range(B)]
    tmask = [list(m) for m in prompt_mask]
    dmask = [list(m) for m in prompt_mask]
    unseen = [None] * B  # d3 of a row that accepted all drafts: committed, never fed to the draft

    with torch.no_grad(), watcher(a, pair, prompts, "probe-rightpad") as w:
        tc, dc = DynamicCache(config=target.config), DynamicCache(config=draft.config)
        ids = torch.tensor([p + [PAD] * (W - L[r]) for r, p in enumerate(prompts)])
        am = torch.tensor(prompt_mask)
        pos = torch.arange(W).unsqueeze(0).expand(B, W)
        lg = target(input_ids=ids, attention_mask=am, position_ids=pos, cache=tc, use_cache=True).logits
        draft(input_ids=ids, attention_mask=am, position_ids=pos, cache=dc, use_cache=True)
        pending = [int(lg[r, L[r] - 1].argmax()) for r in range(B)]
        if a.bug == "padkv":
            tmask = [[1] * W for _ in range(B)]  # decode mask rebuilt as "the prefill width is all real"
        for r in range(B):
            new = cut([pending[r]], budgets[r])
            outs[r] += new
            fin = new[-1] == EOS or len(outs[r]) >= budgets[r]
            w.emit(r, new, ("eos" if new[-1] == EOS else "length") if fin else None)
            done[r] = fin

        verify = 0
        while not all(done):
            live = [r for r in range(B) if not done[r]]
            n = [L[r] + len(outs[r]) for r in range(B)]  # committed length, pending included
            # ---- draft: call 0 feeds [unseen-or-hole, pending], then d1, d2
            feed = [[unseen[r] if unseen[r] is not None else PAD, pending[r]] for r in range(B)]
            fm = [[int(unseen[r] is not None and not done[r]), int(not done[r])] for r in range(B)]
            fp = [[logical(r, max(n[r] - 2, 0)), logical(r, n[r] - 1)] for r in range(B)]
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
                fp = [[logical(r, n[r] + i)] for r in range(B)]
            # ---- verify [pending, d1, d2, d3]
            q = [[pending[r]] + props[r] if not done[r] else [PAD] * (K + 1) for r in range(B)]
            qm = [[int(not done[r])] * (K + 1) for r in range(B)]
            qp = [[logical(r, n[r] - 1 + i) for i in range(K + 1)] for r in range(B)]
            for r in live:
                if a.bug == "gap_pos" and L[r] < W:
                    note(verify + 1, r, "positions from the common width")
                if a.bug == "padkv" and L[r] < W:
                    note(verify + 1, r, "right padding attended")
            am = torch.tensor([tmask[r] + qm[r] for r in range(B)])
            logits = target(
                input_ids=torch.tensor(q), attention_mask=am, position_ids=torch.tensor(qp), cache=tc, use_cache=True
            ).logits
            choice = logits.argmax(-1).tolist()
            verify += 1
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
                # draft slots of this step: [unseen-or-hole, pending, d1, d2]; keep the accepted
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
        print("BUG first effect: verify call {}, seq {}: {}".format(*first_effect) if first_effect else "BUG no effect")


if __name__ == "__main__":
    main()
