"""Tree verification with a 4-D mask and a compacted KV cache.

One padded batch (prompts left-padded). Each step, each row's draft model (with its own DynamicCache)
grows a small token tree from the row's pending token:

    node 0: the pending token (root)              depth 0
    node 1, 2: the draft's top-2 after the root   depth 1
    node 3: greedy child of 1, node 4: of 2       depth 2
    node 5: greedy child of 3, node 6: of 4       depth 3

(nodes numbered level by level). The target verifies the 7 nodes of every row in ONE forward, with a
boolean 4-D mask (B, 1, 7, cache + 7): each node sees the row's committed slots, its ancestors and
itself; its position is the row's committed length + its depth. The longest root-to-node path whose
tokens are the target's argmax is accepted, plus the target's choice after it.

Afterwards both caches are compacted: each layer's key/value tensors are gathered (per row) so the
cache holds only committed tokens, right-aligned (left padding, masked), no holes. The draft's
cache keeps the root and the accepted nodes it was fed (depth <= 2); a depth-3 node it never fed is
fed next step before the new root.

Rows that finish keep computing (their tokens are ignored).

Bugs: --bug gather : when branch 2 (node 2) was accepted, the target compaction takes depths 2-3 from
                     node index - 1 (branch 1's nodes 3 and 5 instead of 4 and 6)
      --bug linpos : tree node positions are committed length + node index (not depth)
"""

import sys

import torch
from common import EOS, args, budgets_for, cut, report, setup, watcher
from transformers import DynamicCache

PAD = 1
DEBUG = bool(__import__("os").environ.get("TREE_DEBUG"))
PARENTS = [-1, 0, 0, 1, 2, 3, 4]
DEPTH = [0, 1, 1, 2, 2, 3, 3]
CHILDREN = {0: [1, 2], 1: [3], 2: [4], 3: [5], 4: [6], 5: [], 6: []}
N = len(PARENTS)


def ancestors(i):
    out = []
    while i >= 0:
        out.append(i)
        i = PARENTS[i]
    return set(out)


ANC = [ancestors(i) for i in range(N)]


def compact(cache, keep):
    """Gather each row's kept columns (lists of column indices), right-aligned; returns new masks."""
    width = max(len(k) for k in keep)
    idx, masks = [], []
    for k in keep:
        pad = width - len(k)
        idx.append([k[0] if k else 0] * pad + list(k))
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
    target, draft = pair.target, pair.draft
    B = len(prompts)
    seqs = [list(p) for p in prompts]  # committed tokens, the last one pending
    outs = [[] for _ in prompts]
    done = [False] * B
    W = max(len(p) for p in prompts) - 1
    with torch.no_grad(), watcher(a, pair, prompts, "probe-tree4d") as w:
        tc, dc = DynamicCache(config=target.config), DynamicCache(config=draft.config)
        ids = torch.tensor([[PAD] * (W - len(p) + 1) + p[:-1] for p in prompts])
        m2 = torch.tensor([[0] * (W - len(p) + 1) + [1] * (len(p) - 1) for p in prompts])
        pos = (m2.cumsum(-1) - 1).clamp(min=0)
        target(input_ids=ids, attention_mask=m2, position_ids=pos, cache=tc, use_cache=True)
        draft(input_ids=ids, attention_mask=m2, position_ids=pos, cache=dc, use_cache=True)
        tmask = m2.tolist()  # per row, 0/1 over the target cache's columns
        dmask = m2.tolist()  # the same for the draft cache
        dseen = [len(p) - 1 for p in prompts]  # committed tokens the draft cache holds
        step = 0
        while not all(done):
            # ---- draft: feed what the draft has not seen (an unseen depth-3 node, then the root)
            feed = [seqs[r][dseen[r] :] for r in range(B)]
            Q1 = max(len(f) for f in feed)
            Wd = len(dmask[0])
            q_ids, q_pos, m4 = [], [], torch.zeros(B, 1, Q1, Wd + Q1, dtype=torch.bool)
            for r in range(B):
                pad = Q1 - len(feed[r])
                q_ids.append([PAD] * pad + feed[r])
                q_pos.append([dseen[r]] * pad + [dseen[r] + i for i in range(len(feed[r]))])
                for i in range(Q1):
                    if i < pad:
                        m4[r, 0, i, Wd + i] = True  # a pad slot sees itself only (never seen)
                        continue
                    m4[r, 0, i, :Wd] = torch.tensor(dmask[r], dtype=torch.bool)
                    m4[r, 0, i, Wd + pad : Wd + i + 1] = True
            lg = draft(
                input_ids=torch.tensor(q_ids),
                attention_mask=m4,
                position_ids=torch.tensor(q_pos),
                cache=dc,
                use_cache=True,
            ).logits[:, -1]
            top2 = lg.topk(2, dim=-1).indices.tolist()
            root_dcol = [Wd + Q1 - 1] * B
            for r in range(B):
                dmask[r] = dmask[r] + [0] * (Q1 - len(feed[r])) + [1] * len(feed[r])
            nodes = [[seqs[r][-1], top2[r][0], top2[r][1]] for r in range(B)]
            node_dcol = [[root_dcol[r]] for r in range(B)]
            L = [len(s) - 1 for s in seqs]  # the root's logical index
            # depth 2 then depth 3: two-token queries, one per branch
            for depth, (pa, pb) in ((2, (1, 2)), (3, (3, 4))):
                Wd = len(dmask[0])
                m4 = torch.zeros(B, 1, 2, Wd + 2, dtype=torch.bool)
                for r in range(B):
                    for j, p in enumerate((pa, pb)):
                        row = list(dmask[r])
                        m4[r, 0, j, :Wd] = torch.tensor(row, dtype=torch.bool)
                        for anc in ANC[p] - {p}:
                            if anc > 0:  # the root is committed (dmask); earlier tree nodes by column
                                m4[r, 0, j, node_dcol[r][anc]] = True
                        m4[r, 0, j, Wd + j] = True
                q = torch.tensor([[nodes[r][pa], nodes[r][pb]] for r in range(B)])
                qp = torch.tensor([[L[r] + depth - 1] * 2 for r in range(B)])
                nxt = (
                    draft(input_ids=q, attention_mask=m4, position_ids=qp, cache=dc, use_cache=True)
                    .logits.argmax(-1)
                    .tolist()
                )
                for r in range(B):
                    node_dcol[r] += [Wd, Wd + 1]
                    dmask[r] = dmask[r] + [0, 0]  # tree slots: attended only through m4 this step
                    nodes[r] += nxt[r]
            # node_dcol[r]: draft columns of nodes 0..4 (5 and 6 never fed)
            # ---- target: verify every row's tree in one forward
            Wt = len(tmask[0])
            m4 = torch.zeros(B, 1, N, Wt + N, dtype=torch.bool)
            for r in range(B):
                cm = torch.tensor(tmask[r], dtype=torch.bool)
                for i in range(N):
                    m4[r, 0, i, :Wt] = cm
                    for anc in ANC[i]:
                        m4[r, 0, i, Wt + anc] = True
            if a.bug == "linpos":
                tpos = [[L[r] + i for i in range(N)] for r in range(B)]
            else:
                tpos = [[L[r] + DEPTH[i] for i in range(N)] for r in range(B)]
            choice = (
                target(
                    input_ids=torch.tensor(nodes),
                    attention_mask=m4,
                    position_ids=torch.tensor(tpos),
                    cache=tc,
                    use_cache=True,
                )
                .logits.argmax(-1)
                .tolist()
            )
            tkeep, dkeep = [], []
            for r in range(B):
                path, cur = [0], 0
                while True:
                    t = choice[r][cur]
                    nxt = [c for c in CHILDREN[cur] if nodes[r][c] == t]
                    if not nxt:
                        break
                    cur = nxt[0]
                    path.append(cur)
                new = [nodes[r][i] for i in path[1:]] + [choice[r][cur]]
                if DEBUG:
                    print(
                        f"DBG step {step} seq {r} nodes {nodes[r]} choice {choice[r]} path {path} new {new}",
                        file=sys.stderr,
                    )
                # target: committed columns plus the accepted path's slots in this step's block
                old = [c for c, m in enumerate(tmask[r]) if m]
                blk = list(path)
                if a.bug == "gather" and len(path) > 2 and path[1] == 2:
                    blk = [path[0], path[1]] + [i - 1 for i in path[2:]]
                    print(f"BUG gather fired: step {step} seq {r} path {path} gathered {blk}", file=sys.stderr)
                tkeep.append(old + [Wt + i for i in blk])
                # draft: committed columns, the tokens fed this step, the accepted nodes it was fed
                dold = [c for c, m in enumerate(dmask[r]) if m]
                dk = dold + [node_dcol[r][i] for i in path[1:] if i < len(node_dcol[r])]
                dkeep.append(dk)
                dseen[r] = len(seqs[r]) + sum(1 for i in path[1:] if i < len(node_dcol[r]))
                seqs[r] += new
                if done[r]:
                    continue
                new = cut(new, budgets[r] - len(outs[r]))
                outs[r] += new
                fin = new[-1] == EOS or len(outs[r]) >= budgets[r]
                w.emit(r, new, ("eos" if new[-1] == EOS else "length") if fin else None)
                done[r] = fin
            tmask = compact(tc, tkeep)
            dmask = compact(dc, dkeep)
            step += 1
    print(f"steps {step}", file=sys.stderr)
    report(outs, prompts, budgets, tok)


if __name__ == "__main__":
    sys.exit(main())
