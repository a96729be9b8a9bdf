"""Engine 6: EXSPEC-like. A pool of sequences, each with its OWN target KV (per-layer tensors
[H, n-1, D]); every step picks a group (the most common committed length, ties to the shortest,
at most G rows: no padding needed), or when every length is unique, the G shortest sequences
re-padded on the left. The group's KV is stacked (left padded with zeros, masked out by a 2-D
mask) into a fresh DynamicCache, verified with explicit position_ids, and each row's committed
KV (pending + accepted drafts) is split back. Other sequences sit the step out. Drafts: the
draft model, cacheless, K greedy tokens per row, left padded.

Bugs: --bug pad_pos  : in a re-padded group, position_ids are not passed for the verify
                       (the model counts padded slots)
      --bug one_more : at the first partial accept, the row commits the first rejected draft
                       instead of the target's bonus (one draft too many, bonus dropped)
"""

import sys
from collections import Counter

import torch
from common import EOS, args, budgets_for, cut, report, setup, watcher
from transformers import DynamicCache

K, G = 3, 3


@torch.no_grad()
def propose(draft, ctxs):
    ctxs, out = [list(c) for c in ctxs], [[] for _ in ctxs]
    for _ in range(K):
        w = max(len(c) for c in ctxs)
        ids = torch.tensor([[1] * (w - len(c)) + c for c in ctxs])
        am = torch.tensor([[0] * (w - len(c)) + [1] * len(c) for c in ctxs])
        nxt = (
            draft(input_ids=ids, attention_mask=am, position_ids=(am.cumsum(-1) - 1).clamp(min=0), use_cache=False)
            .logits[:, -1]
            .argmax(-1)
            .tolist()
        )
        for c, o, t in zip(ctxs, out, nxt):
            c.append(t)
            o.append(t)
    return out


def main():
    a = args()
    if "--n" not in sys.argv:
        a.n = 6  # prompts 0 and 5 share a length (--n 5: every length unique, groups re-padded)
    pair, tok, prompts = setup(a.n)
    budgets = budgets_for(a.n)
    target, draft = pair.target, pair.draft
    L = target.config.num_hidden_layers
    toks = {i: list(p) for i, p in enumerate(prompts)}
    outs = [[] for _ in prompts]
    kv = {}
    step, hit = 0, False
    with torch.no_grad(), watcher(a, pair, prompts, "blind-exspec") as w:
        P = max(len(p) for p in prompts) - 1
        ids = torch.tensor([[1] * (P - len(p) + 1) + p[:-1] for p in prompts])
        am = torch.tensor([[0] * (P - len(p) + 1) + [1] * (len(p) - 1) for p in prompts])
        cache = DynamicCache(config=target.config)
        w.rows(list(range(len(prompts))))
        target(
            input_ids=ids, attention_mask=am, position_ids=(am.cumsum(-1) - 1).clamp(min=0), cache=cache, use_cache=True
        )
        for s, p in enumerate(prompts):
            pad = P - len(p) + 1
            layers = cache.layers
            kv[s] = [(layers[i].keys[s, :, pad:], layers[i].values[s, :, pad:]) for i in range(L)]
        live = set(range(len(prompts)))
        while live:
            by_len = Counter(len(toks[s]) for s in live)
            n, cnt = min(by_len.items(), key=lambda x: (-x[1], x[0]))
            group = (
                sorted(s for s in live if len(toks[s]) == n)[:G]
                if cnt > 1
                else sorted(live, key=lambda s: (len(toks[s]), s))[:G]
            )
            w.rows(group)
            drafts = propose(draft, [toks[s] for s in group])
            W = max(len(toks[s]) - 1 for s in group)
            pads = [W - (len(toks[s]) - 1) for s in group]
            cache = DynamicCache(config=target.config)
            for layer in range(L):
                ks = torch.stack([torch.nn.functional.pad(kv[s][layer][0], (0, 0, p, 0)) for s, p in zip(group, pads)])
                vs = torch.stack([torch.nn.functional.pad(kv[s][layer][1], (0, 0, p, 0)) for s, p in zip(group, pads)])
                cache.update(ks, vs, layer)
            mask = torch.tensor([[0] * p + [1] * (W - p + K + 1) for p in pads])
            q = torch.tensor([[toks[s][-1]] + d for s, d in zip(group, drafts)])
            pos = torch.tensor([[len(toks[s]) - 1 + i for i in range(K + 1)] for s in group])
            kw = {} if (a.bug == "pad_pos" and any(pads)) else {"position_ids": pos}
            if not kw:
                print(f"BUG-HIT pad_pos call={step} seqs={[s for s, p in zip(group, pads) if p]}")
            am = target(input_ids=q, attention_mask=mask, cache=cache, use_cache=True, **kw).logits.argmax(-1).tolist()
            for r, (s, d) in enumerate(zip(group, drafts)):
                acc = 0
                while acc < K and d[acc] == am[r][acc]:
                    acc += 1
                new = d[:acc] + [am[r][acc]]
                if a.bug == "one_more" and 0 < acc < K and not hit:
                    hit = True
                    new = d[: acc + 1]
                    print(f"BUG-HIT one_more call={step} seq={s} n={len(toks[s])}")
                new = cut(new, budgets[s] - len(outs[s]))
                keep = W + len(new)  # cache columns through the last committed token but the new pending one
                kv[s] = [
                    (cache.layers[layer].keys[r, :, pads[r] : keep], cache.layers[layer].values[r, :, pads[r] : keep])
                    for layer in range(L)
                ]
                outs[s] += new
                toks[s] += new
                fin = new[-1] == EOS or len(outs[s]) >= budgets[s]
                w.emit(s, new, ("eos" if new[-1] == EOS else "length") if fin else None)
                if fin:
                    live.discard(s)
            step += 1
    report(outs, prompts, budgets, tok)


if __name__ == "__main__":
    main()
