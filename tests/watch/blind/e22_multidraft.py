"""Multi-proposer token tree (SpecInfer-style), batched, greedy.

Each step, for every row: a draft-model chain (k=2, greedy, one token per draft call, over the
draft's own cache) and a prompt-lookup chain (k=2, from the row's own context) are merged into one
tree (node 0 = pending token, shared prefix merged). The target verifies all trees in one padded
forward with a 4-D mask (committed slots + ancestors), positions = committed length - 1 + depth.
KV is kept by index: the cache only appends and each row keeps a validity mask over its slots, so
the rejected nodes (and padding) become holes. Finished rows are dropped from both caches.
Bugs: --bug sibling (mask causal over the flattened tree: a node sees an earlier sibling branch),
      --bug stale   (KV kept by depth: every node as deep as the path's end stays, rejected siblings too).
"""

import torch
from common import EOS, args, budgets_for, cut, report, setup, watcher
from transformers import DynamicCache

K = 2
NEG = torch.finfo(torch.float32).min


def ngram_chain(ctx, k):
    """Prompt lookup: the latest earlier match of the last 2 (else 1) tokens, then what followed."""
    for n in (2, 1):
        if len(ctx) <= n:
            continue
        tail = ctx[-n:]
        for s in range(len(ctx) - n - 1, -1, -1):
            if ctx[s : s + n] == tail:
                return ctx[s + n : s + n + k]
    return []


def merge(pending, chains):
    """Chains -> (tokens, parents); node 0 the pending token; shared prefixes merged."""
    toks, par = [pending], [-1]
    for ch in chains:
        at = 0
        for t in ch:
            kids = [i for i in range(len(toks)) if par[i] == at and toks[i] == t]
            if kids:
                at = kids[0]
            else:
                toks.append(t)
                par.append(at)
                at = len(toks) - 1
    return toks, par


def depth(par, i):
    d = 0
    while par[i] != -1:
        i, d = par[i], d + 1
    return d


def ancestors(par, i):
    out = []
    while i != -1:
        out.append(i)
        i = par[i]
    return out


@torch.no_grad()
def main():
    a = args()
    torch.manual_seed(0)
    pair, tok, prompts = setup(a.n)
    T, D = pair.target, pair.draft
    budgets = budgets_for(a.n)
    outs = [[] for _ in prompts]
    ctx = [list(p) for p in prompts]  # committed tokens per sequence (last one = pending)
    alive = list(range(len(prompts)))
    steps = 0
    with watcher(a, pair, prompts, "md-tree") as w:
        w.rows(alive)
        # prefill both models with prompt[:-1], left-padded; the last prompt token is pending
        L = max(len(p) for p in prompts) - 1
        ids = torch.zeros(len(prompts), L, dtype=torch.long)
        m = torch.zeros(len(prompts), L, dtype=torch.long)
        for r, p in enumerate(prompts):
            ids[r, L - len(p) + 1 :] = torch.tensor(p[:-1])
            m[r, L - len(p) + 1 :] = 1
        pos = (m.cumsum(1) - 1).clamp(min=0)
        tc, dc = DynamicCache(config=T.config), DynamicCache(config=D.config)
        T(input_ids=ids, attention_mask=m, position_ids=pos, past_key_values=tc, use_cache=True)
        D(input_ids=ids, attention_mask=m, position_ids=pos, past_key_values=dc, use_cache=True)
        tvalid, dvalid = m.bool().clone(), m.bool().clone()  # per-row slot validity
        dcached = [len(p) - 1 for p in prompts]  # committed tokens in the draft cache
        while alive:
            B = len(alive)
            room = [budgets[s] - len(outs[s]) for s in alive]
            depthk = [max(0, min(K, rm - 1)) for rm in room]
            # (a) draft chain: catch up (left-padded block ending with pending), then one token/call
            catch = [ctx[s][dcached[s] :] for s in alive]
            Lc = max(len(c) for c in catch)
            ids = torch.zeros(B, Lc, dtype=torch.long)
            qm = torch.zeros(B, Lc, dtype=torch.bool)
            pos = torch.zeros(B, Lc, dtype=torch.long)
            for r, c in enumerate(catch):
                ids[r, Lc - len(c) :] = torch.tensor(c)
                qm[r, Lc - len(c) :] = True
                pos[r, Lc - len(c) :] = torch.arange(dcached[alive[r]], len(ctx[alive[r]]))
            dchain = [[] for _ in alive]
            for j in range(K):
                dvalid = torch.cat([dvalid, qm], 1)
                lg = D(
                    input_ids=ids, attention_mask=dvalid.long(), position_ids=pos, past_key_values=dc, use_cache=True
                ).logits[:, -1]
                nxt = lg.argmax(-1)
                for r in range(B):
                    if j < depthk[r]:
                        dchain[r].append(int(nxt[r]))
                ids = nxt[:, None]
                pos = pos[:, -1:] + 1
                qm = torch.ones(B, 1, dtype=torch.bool)
            dvalid[:, -1] = False  # the fed d1 slot is a hole; re-fed if accepted
            for s in alive:
                dcached[s] = len(ctx[s])
            # (b) n-gram chain and the merged tree
            trees = [merge(ctx[s][-1], [dchain[r], ngram_chain(ctx[s], depthk[r])]) for r, s in enumerate(alive)]
            N = max(len(t[0]) for t in trees)
            W = tc.get_seq_length()
            ids = torch.zeros(B, N, dtype=torch.long)
            pos = torch.zeros(B, N, dtype=torch.long)
            mask = torch.full((B, 1, N, W + N), NEG)
            for r, (toks, par) in enumerate(trees):
                n = len(ctx[alive[r]])
                ids[r, : len(toks)] = torch.tensor(toks)
                pos[r] = n - 1
                for i in range(N):
                    if i >= len(toks):
                        mask[r, 0, i, W + i] = 0  # pad node: its own key only
                        continue
                    pos[r, i] = n - 1 + depth(par, i)
                    mask[r, 0, i, :W][tvalid[r]] = 0
                    see = range(i + 1) if a.bug == "sibling" else ancestors(par, i)
                    for j in see:
                        mask[r, 0, i, W + j] = 0
            w.batch(alive, parents=[t[1] for t in trees])
            am = T(
                input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=tc, use_cache=True
            ).logits.argmax(-1)
            keep = torch.zeros(B, N, dtype=torch.bool)
            done = []
            for r, (toks, par) in enumerate(trees):
                s = alive[r]
                path, at = [0], 0  # greedy: follow the child the target chose
                while True:
                    kids = [i for i in range(len(toks)) if par[i] == at and toks[i] == int(am[r, at])]
                    if not kids:
                        break
                    at = kids[0]
                    path.append(at)
                gain = cut([toks[i] for i in path[1:]] + [int(am[r, at])], room[r])
                kept = [i for i in range(len(toks)) if depth(par, i) < len(path)] if a.bug == "stale" else path
                for i in kept:
                    keep[r, i] = True
                outs[s] += gain
                ctx[s] += gain
                fin = "eos" if gain[-1] == EOS else ("length" if len(outs[s]) >= budgets[s] else None)
                w.emit(s, gain, fin)
                if fin:
                    done.append(r)
                print(f"step {steps} seq {s} tree {par} path {path} gain {gain}", flush=True)
            tvalid = torch.cat([tvalid, keep], 1)
            steps += 1
            if done:
                idx = [r for r in range(B) if r not in done]
                alive = [alive[r] for r in idx]
                if not alive:
                    break
                tc.batch_select_indices(torch.tensor(idx))
                dc.batch_select_indices(torch.tensor(idx))
                tvalid, dvalid = tvalid[idx], dvalid[idx]
                w.rows(alive)
    report(outs, prompts, budgets, tok)


if __name__ == "__main__":
    main()
