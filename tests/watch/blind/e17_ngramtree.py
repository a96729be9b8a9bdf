"""Prompt-lookup (n-gram) tree speculation, no draft model.

One left-padded batch, one DynamicCache for the target. The cache holds every committed token except
the last one (the *pending* token, fed as each step's tree root).

Each step, for each row:
  - candidates: the continuations (up to 3 tokens) after the most recent earlier occurrences of the
    row's last 2 tokens in its own context (prompt + generated), up to two distinct ones; if fewer
    than two were found, add [the token that followed the most recent earlier occurrence of the
    row's last token, among those whose follower is not already a candidate's first token] (if any);
  - merge them into a trie rooted at the pending token (shared prefixes merged, nodes numbered in
    insertion order: depth-first, candidate by candidate).
The target verifies all rows' tries in ONE forward: queries left-padded to the largest trie, a
boolean 4-D mask (B, 1, N, cache + N): node i sees the row's committed cache slots, its ancestors and
itself; a pad slot sees only itself. Node positions: the row's cache length + depth.
Greedy acceptance along the trie (follow the child whose token is the target's argmax), plus the
target's choice after the accepted path. Then the cache is compacted: each layer's keys/values are
gathered per row so it holds only the committed tokens (old slots + accepted path), right-aligned.

Bugs: --bug sibling  : tree mask causal over the flattened trie (nodes also see earlier siblings and
                       their subtrees)
      --bug depthpos : node position = cache length + node index instead of + depth
"""

import sys

import torch
from common import EOS, args, budgets_for, cut, report, setup, watcher
from transformers import DynamicCache

PAD = 1
MAXLEN = 3


def candidates(ctx):
    out = []
    if len(ctx) >= 3:
        a, b = ctx[-2], ctx[-1]
        for i in range(len(ctx) - 3, -1, -1):
            if ctx[i] == a and ctx[i + 1] == b:
                cont = ctx[i + 2 : i + 2 + MAXLEN]
                if cont and cont not in out:
                    out.append(cont)
                if len(out) == 2:
                    break
    if len(out) < 2:
        last = ctx[-1]
        firsts = {c[0] for c in out}
        for j in range(len(ctx) - 2, -1, -1):
            if ctx[j] == last and ctx[j + 1] not in firsts:  # a follower that adds a branch
                out.append([ctx[j + 1]])
                break
    return out


def build_trie(root_tok, cands):
    toks, parents, depth = [root_tok], [-1], [0]
    children = {0: {}}
    for c in cands:
        cur = 0
        for t in c:
            if t in children[cur]:
                cur = children[cur][t]
                continue
            n = len(toks)
            toks.append(t)
            parents.append(cur)
            depth.append(depth[cur] + 1)
            children[cur][t] = n
            children[n] = {}
            cur = n
    return toks, parents, depth, children


def ancestors(parents, i):
    s = set()
    while i >= 0:
        s.add(i)
        i = parents[i]
    return s


def compact(cache, keep):
    width = max(len(k) for k in keep)
    idx, masks = [], []
    for k in keep:
        pad = width - len(k)
        idx.append([k[0]] * pad + list(k))
        masks.append([0] * pad + [1] * len(k))
    idx = torch.tensor(idx)
    for layer in cache.layers:
        B, H, _, D = layer.keys.shape
        g = idx[:, None, :, None].expand(B, H, width, D)
        layer.keys = layer.keys.gather(2, g)
        layer.values = layer.values.gather(2, g)
    return masks


def main():
    a = args()
    pair, tok, prompts = setup(a.n)
    budgets = budgets_for(a.n)
    target = pair.target
    B = len(prompts)
    seqs = [list(p) for p in prompts]
    outs = [[] for _ in prompts]
    done = [False] * B
    W = max(len(p) for p in prompts) - 1
    with torch.no_grad(), watcher(a, pair, prompts, "probe-ngramtree", use_draft=False) as w:
        cache = DynamicCache(config=target.config)
        ids = torch.tensor([[PAD] * (W - len(p) + 1) + p[:-1] for p in prompts])
        m2 = torch.tensor([[0] * (W - len(p) + 1) + [1] * (len(p) - 1) for p in prompts])
        pos = (m2.cumsum(-1) - 1).clamp(min=0)
        target(input_ids=ids, attention_mask=m2, position_ids=pos, cache=cache, use_cache=True)
        cmask = m2.tolist()
        step = 0
        while not all(done):
            tries = [build_trie(seqs[r][-1], candidates(seqs[r])) for r in range(B)]
            N = max(len(t[0]) for t in tries)
            Wc = len(cmask[0])
            m4 = torch.zeros(B, 1, N, Wc + N, dtype=torch.bool)
            q_ids, q_pos, offs = [], [], []
            for r in range(B):
                toks, parents, depth, _ = tries[r]
                n = len(toks)
                pad = N - n
                offs.append(pad)
                L = len(seqs[r]) - 1  # cache length = the root's logical index
                q_ids.append([PAD] * pad + toks)
                if a.bug == "depthpos":
                    p = [L + i for i in range(n)]
                    if p != [L + d for d in depth]:
                        print(f"BUG depthpos fired: step {step} seq {r} parents {parents}", file=sys.stderr)
                else:
                    p = [L + d for d in depth]
                q_pos.append([0] * pad + p)
                cm = torch.tensor(cmask[r], dtype=torch.bool)
                for i in range(pad):
                    m4[r, 0, i, Wc + i] = True
                fired = False
                for i in range(n):
                    m4[r, 0, pad + i, :Wc] = cm
                    if a.bug == "sibling":
                        seen = set(range(i + 1))
                        if seen != ancestors(parents, i):
                            fired = True
                    else:
                        seen = ancestors(parents, i)
                    for j in seen:
                        m4[r, 0, pad + i, Wc + pad + j] = True
                if fired:
                    print(f"BUG sibling fired: step {step} seq {r} parents {parents}", file=sys.stderr)
            w.batch(list(range(B)), parents=[t[1] for t in tries])
            choice = (
                target(
                    input_ids=torch.tensor(q_ids),
                    attention_mask=m4,
                    position_ids=torch.tensor(q_pos),
                    cache=cache,
                    use_cache=True,
                )
                .logits.argmax(-1)
                .tolist()
            )
            keep = []
            for r in range(B):
                toks, parents, depth, children = tries[r]
                pad = offs[r]
                ch = choice[r][pad:]
                path, cur = [0], 0
                while ch[cur] in children[cur]:
                    cur = children[cur][ch[cur]]
                    path.append(cur)
                new = [toks[i] for i in path[1:]] + [ch[cur]]
                old = [c for c, m in enumerate(cmask[r]) if m]
                keep.append(old + [Wc + pad + i for i in path])
                seqs[r] += new
                if done[r]:
                    continue
                new = cut(new, budgets[r] - len(outs[r]))
                outs[r] += new
                fin = new[-1] == EOS or len(outs[r]) >= budgets[r]
                w.emit(r, new, ("eos" if new[-1] == EOS else "length") if fin else None)
                done[r] = fin
            cmask = compact(cache, keep)
            step += 1
    print(f"steps {step}", file=sys.stderr)
    report(outs, prompts, budgets, tok)


if __name__ == "__main__":
    sys.exit(main())
