"""Engine 1: tree verification, padded batch, rows leaving when done.

The draft model (cacheless, left padded) proposes per row a 5-node tree, numbered depth first:
node 0 the pending token, 1-2-3 the greedy chain from its best first token, 4 the second-best
first token: parents [-1, 0, 1, 2, 0]. One padded verify [B, 5] over a DynamicCache with a 4-D
boolean mask [cache | query]: per row a `valid` vector over the cache columns (left padding and
rejected nodes are holes; KV kept by index, never moved) and the ancestor block in the query.
Positions: committed length - 1 + depth. A finished row is dropped (cache batch_select_indices).
Prompts 0 and 5 have equal length and different pending tokens.

Bugs: --bug stale_branch : after a step whose path took node 1, node 4's KV (rejected branch) is
                           kept valid (attended from the row's next step)
      --bug leave_shift  : when a row leaves, its valid-mask row is not removed: the rows after it
                           attend with their predecessor's mask (mask row of the wrong sequence)
      --bug head_row     : (--head) when a row leaves, the kept hidden states are not re-indexed:
                           the head is fed another row's state

--head: an EAGLE-like TreeHead (untrained: random linear on the target's last hidden state plus
the pending token's embedding, a bias toward 'the', the target's LM head on top) proposes the same
tree shape instead of the draft model; it is fed the target's final hidden state of the slot that
chose the pending token (the prefill's last slot, then each row's last accepted node), as [B, H]
(--head3d: as [B, 1, H], the head then returns [B, 1, H] features and [B, 1, V] logits).
"""

import torch
from common import EOS, args, budgets_for, cut, report, setup, watcher
from torch import nn
from transformers import DynamicCache

PARENTS = [-1, 0, 1, 2, 0]
DEPTH = [0, 1, 2, 3, 1]
N = len(PARENTS)
ANC = torch.zeros(N, N, dtype=torch.bool)
for i in range(N):
    j = i
    while j >= 0:
        ANC[i, j] = True
        j = PARENTS[j]


class TreeHead(nn.Module):
    def __init__(self, target, seed=0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        H = target.config.hidden_size
        self.fc = nn.Linear(H, H, bias=False)
        self.fc.weight.data = torch.randn(H, H, generator=g) * 0.05
        self.emb, self.norm, self.lm_head = target.get_input_embeddings(), target.model.norm, target.lm_head
        self.bias = nn.Parameter(target.get_input_embeddings().weight[262].detach() * 2)

    def forward(self, hidden_states, token_ids):  # [B, H] (or [B, 1, H]), [B] -> features [B, H], logits [B, V]
        three_d = hidden_states.dim() == 3
        if three_d:
            hidden_states = hidden_states[:, -1]
        f = self.fc(hidden_states) + self.emb(token_ids) + self.bias
        logits = self.lm_head(self.norm(f))
        return (f[:, None], logits[:, None]) if three_d else (f, logits)


@torch.no_grad()
def head_tree(head, hid, ctxs, three_d=False):
    f, lg = head(hid[:, None] if three_d else hid, torch.tensor([c[-1] for c in ctxs]))
    top = lg.reshape(len(ctxs), -1).topk(2, -1).indices
    chain = [top[:, 0]]
    for _ in range(2):
        f, lg = head(f, chain[-1])
        chain.append(lg.reshape(len(ctxs), -1).argmax(-1))
    return [[c[-1], *(int(t[r]) for t in chain), int(top[r, 1])] for r, c in enumerate(ctxs)]


@torch.no_grad()
def draft_tree(draft, ctxs):
    def step(cs):
        w = max(len(c) for c in cs)
        ids = torch.tensor([[1] * (w - len(c)) + c for c in cs])
        am = torch.tensor([[0] * (w - len(c)) + [1] * len(c) for c in cs])
        pos = (am.cumsum(-1) - 1).clamp(min=0)
        return draft(input_ids=ids, attention_mask=am, position_ids=pos, use_cache=False).logits[:, -1]

    top = step(ctxs).topk(2, -1).indices.tolist()
    chain = [[t[0]] for t in top]
    for _ in range(2):
        nxt = step([c + ch for c, ch in zip(ctxs, chain)]).argmax(-1).tolist()
        for ch, t in zip(chain, nxt):
            ch.append(t)
    return [[c[-1]] + ch + [t[1]] for c, ch, t in zip(ctxs, chain, top)]


def main():
    a = args({"--head": dict(action="store_true"), "--head3d": dict(action="store_true")})
    a.n = 6
    pair, tok, prompts = setup(a.n)
    budgets = budgets_for(a.n)
    target, draft = pair.target, pair.draft
    seqs = list(range(len(prompts)))
    toks = {i: list(p) for i, p in enumerate(prompts)}
    outs = [[] for _ in prompts]
    head = TreeHead(target) if a.head else None
    with torch.no_grad(), watcher(a, pair, prompts, "blind-tree", drafter=head, use_draft=not a.head) as w:
        # prefill all but the last prompt token, left padded
        P = max(len(p) for p in prompts) - 1
        ids = torch.tensor([[1] * (P - len(p) + 1) + p[:-1] for p in prompts])
        am = torch.tensor([[0] * (P - len(p) + 1) + [1] * (len(p) - 1) for p in prompts])
        cache = DynamicCache(config=target.config)
        w.rows(seqs)
        o = target(
            input_ids=ids,
            attention_mask=am,
            position_ids=(am.cumsum(-1) - 1).clamp(min=0),
            cache=cache,
            use_cache=True,
            output_hidden_states=a.head,
        )
        hid = o.hidden_states[-1][:, -1] if a.head else None
        valid = am.bool()  # [B, W]
        call = 0
        while seqs:
            w.rows(seqs)
            ctxs = [toks[s] for s in seqs]
            trees = head_tree(head, hid, ctxs, a.head3d) if a.head else draft_tree(draft, ctxs)
            B, W = len(seqs), valid.shape[1]
            mask = torch.zeros(B, 1, N, W + N, dtype=torch.bool)
            mask[:, 0, :, :W] = valid[:, None, :]
            mask[:, 0, :, W:] = ANC
            pos = torch.tensor([[len(toks[s]) - 1 + d for d in DEPTH] for s in seqs])
            w.batch(seqs, parents=[PARENTS] * B)
            o = target(
                input_ids=torch.tensor(trees),
                attention_mask=mask,
                position_ids=pos,
                cache=cache,
                use_cache=True,
                output_hidden_states=a.head,
            )
            am = o.logits.argmax(-1).tolist()
            last = []
            keep_cols = torch.zeros(B, N, dtype=torch.bool)
            keep_rows, left = [], []
            for r, s in enumerate(seqs):
                node, path = 0, [0]
                while True:
                    kids = [i for i in range(N) if PARENTS[i] == node and trees[r][i] == am[r][node]]
                    if not kids:
                        break
                    node = kids[0]
                    path.append(node)
                keep_cols[r, path] = True
                last.append(node)
                if a.bug == "stale_branch" and 1 in path:
                    keep_cols[r, 4] = True
                    print(f"BUG-HIT stale_branch call={call} seq={s} n={len(toks[s])} (attended from its next step)")
                new = cut([trees[r][i] for i in path[1:]] + [am[r][node]], budgets[s] - len(outs[s]))
                outs[s] += new
                toks[s] += new
                fin = new[-1] == EOS or len(outs[s]) >= budgets[s]
                w.emit(s, new, ("eos" if new[-1] == EOS else "length") if fin else None)
                (left if fin else keep_rows).append(r)
            valid = torch.cat([valid, keep_cols], 1)
            if a.head:
                hid = o.hidden_states[-1][torch.arange(B), torch.tensor(last)]
            call += 1
            if left:
                idx = torch.tensor(keep_rows, dtype=torch.long)
                cache.batch_select_indices(idx)
                if a.head:
                    if a.bug == "head_row" and keep_rows and min(left) < max(keep_rows):
                        print(
                            f"BUG-HIT head_row call={call} seqs={[seqs[k] for i, k in enumerate(keep_rows) if i != k]}"
                        )
                        hid = hid[: len(keep_rows)]
                    else:
                        hid = hid[idx]
                if a.bug == "leave_shift" and keep_rows and min(left) < max(keep_rows):
                    old = valid
                    valid = valid[: len(keep_rows)]
                    shifted = [seqs[k] for i, k in enumerate(keep_rows) if not torch.equal(valid[i], old[k])]
                    print(f"BUG-HIT leave_shift call={call} seqs={shifted}")
                else:
                    valid = valid[idx]
                seqs = [seqs[r] for r in keep_rows]
    report(outs, prompts, budgets, tok)


if __name__ == "__main__":
    main()
