"""Engine 5: packed trees, the sequences' order rotated every step, nothing declared to specviz
(API mode only emits).

One shared append-only KV stream (a batch-1 DynamicCache). Each step packs every running
sequence's 5-node tree back to back into one 1 x T verify, in an order rotated by one each step.
Tree (level order): node 0 pending, 1 = best first draft token, 4 = second best, 2 and 3 = the
two best tokens after node 1: parents [-1, 0, 1, 1, 0]; proposals from the draft model (cacheless,
left padded). 4-D boolean mask [cache | query]: a node sees its sequence's committed columns, its
ancestors and itself; node i is fed position committed length - 1 + depth(i). KV kept by index.

Bugs: --bug kept_other : when the accepted path goes through node 4, the engine keeps node 1's
                         KV instead (index mix-up; the wrong branch's KV attended from then on)
      --bug len_shift  : when a sequence finishes, the per-sequence length list drops its LAST
                         entry instead of the leaver's: positions of the sequences after it are
                         computed from their neighbour's length
"""

import torch
from common import EOS, args, budgets_for, report, setup, watcher
from transformers import DynamicCache

PARENTS = [-1, 0, 1, 1, 0]
DEPTH = [0, 1, 2, 2, 1]
N = len(PARENTS)


def ancestors(i):
    out = []
    while i >= 0:
        out.append(i)
        i = PARENTS[i]
    return out


@torch.no_grad()
def top2(draft, ctxs):
    w = max(len(c) for c in ctxs)
    ids = torch.tensor([[1] * (w - len(c)) + c for c in ctxs])
    am = torch.tensor([[0] * (w - len(c)) + [1] * len(c) for c in ctxs])
    pos = (am.cumsum(-1) - 1).clamp(min=0)
    return (
        draft(input_ids=ids, attention_mask=am, position_ids=pos, use_cache=False)
        .logits[:, -1]
        .topk(2, -1)
        .indices.tolist()
    )


def main():
    a = args()
    pair, tok, prompts = setup(a.n)
    budgets = budgets_for(a.n)
    target, draft = pair.target, pair.draft
    toks = {i: list(p) for i, p in enumerate(prompts)}
    outs = [[] for _ in prompts]
    cols = {}
    cache = DynamicCache(config=target.config)
    running = list(range(len(prompts)))
    plen = [len(p) for p in prompts]  # committed length per running sequence (aligned with `running`)
    with torch.no_grad(), watcher(a, pair, prompts, "blind-packed-tree") as w:
        # packed prefill of every prompt but its last token, block diagonal
        ids, pos, q = [], [], 0
        T = sum(len(p) - 1 for p in prompts)
        mask = torch.zeros(1, 1, T, T, dtype=torch.bool)
        for s, p in enumerate(prompts):
            m = len(p) - 1
            ids += p[:-1]
            pos += list(range(m))
            mask[0, 0, q : q + m, q : q + m] = torch.tril(torch.ones(m, m, dtype=torch.bool))
            cols[s] = list(range(q, q + m))
            q += m
        target(
            input_ids=torch.tensor([ids]),
            position_ids=torch.tensor([pos]),
            attention_mask=mask,
            cache=cache,
            use_cache=True,
        )
        step = 0
        while running:
            k = step % len(running)
            order = running[k:] + running[:k]
            lens = plen[k:] + plen[:k]
            d1 = top2(draft, [toks[s] for s in order])
            d2 = top2(draft, [toks[s] + [t[0]] for s, t in zip(order, d1)])
            trees = [[toks[s][-1], t1[0], t2[0], t2[1], t1[1]] for s, t1, t2 in zip(order, d1, d2)]
            base = cache.get_seq_length()
            T = N * len(order)
            mask = torch.zeros(1, 1, T, base + T, dtype=torch.bool)
            ids, pos = [], []
            for j, (s, tree) in enumerate(zip(order, trees)):
                if a.bug == "len_shift" and lens[j] != len(toks[s]):
                    print(f"BUG-HIT len_shift call={step} seq={s} n={len(toks[s])} fed as {lens[j]}")
                for i in range(N):
                    ids.append(tree[i])
                    pos.append(lens[j] - 1 + DEPTH[i])
                    mask[0, 0, j * N + i, cols[s]] = True
                    for anc in ancestors(i):
                        mask[0, 0, j * N + i, base + j * N + anc] = True
            am = (
                target(
                    input_ids=torch.tensor([ids]),
                    position_ids=torch.tensor([pos]),
                    attention_mask=mask,
                    cache=cache,
                    use_cache=True,
                )
                .logits[0]
                .argmax(-1)
                .tolist()
            )
            done = []
            for j, (s, tree) in enumerate(zip(order, trees)):
                node, path = 0, [0]
                while True:
                    kids = [i for i in range(N) if PARENTS[i] == node and tree[i] == am[j * N + node]]
                    if not kids:
                        break
                    node = kids[0]
                    path.append(node)
                kept = list(path)
                if a.bug == "kept_other" and 4 in path:
                    kept = [1 if i == 4 else i for i in kept]
                    print(f"BUG-HIT kept_other call={step} seq={s} n={len(toks[s])}")
                cols[s] += [base + j * N + i for i in kept]
                new = [tree[i] for i in path[1:]] + [am[j * N + node]]
                new = new[: budgets[s] - len(outs[s])]
                if EOS in new:
                    new = new[: new.index(EOS) + 1]
                outs[s] += new
                toks[s] += new
                plen[running.index(s)] += len(new)
                fin = new[-1] == EOS or len(outs[s]) >= budgets[s]
                w.emit(s, new, ("eos" if new[-1] == EOS else "length") if fin else None)
                if fin:
                    done.append(s)
            for s in done:
                i = running.index(s)
                running.pop(i)
                plen.pop() if a.bug == "len_shift" else plen.pop(i)
            step += 1
    report(outs, prompts, budgets, tok)


if __name__ == "__main__":
    main()
