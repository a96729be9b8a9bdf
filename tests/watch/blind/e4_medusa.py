"""Engine 4: Medusa-style heads over a bf16 target fed inputs_embeds.

M linear heads (one per depth: a SiLU linear block + the target's LM head; random weights and a
bias toward 'the', nothing trained) read the target's final hidden state at each row's last accepted slot and return one
logits column per depth: those are the drafts. The target (cast to bf16) is always fed
`inputs_embeds` from its own embedding table. Left-padded batch over a DynamicCache with a 2-D
mask over [cache | query] in which rejected drafts are holes; explicit position_ids; finished rows
are dropped (batch_select_indices).

Bugs: --bug head_col : after a step that accepted drafts, the heads are fed the hidden state of
                       the pending slot instead of the last accepted one (head input off by the
                       accepted count)
      --bug hole_kept: after the first step in which a row accepted some but not all drafts, its
                       rejected drafts' KV stays attended (the 2-D mask holes not punched)
"""

import torch
from common import EOS, args, budgets_for, cut, report, setup, watcher
from torch import nn
from transformers import DynamicCache

M = 3
COMMON = 262  # 'the'


class MedusaHeads(nn.Module):
    def __init__(self, hidden, lm_head, m=M, seed=0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.blocks = nn.ModuleList(nn.Linear(hidden, hidden) for _ in range(m))
        for b in self.blocks:  # untrained: small random weights, a bias toward the commonest token
            b.weight.data = torch.randn(hidden, hidden, generator=g) * 0.02
            b.bias.data = lm_head.weight[COMMON].detach().float() * 3
        self.lm_head = lm_head

    def forward(self, hidden_states):  # [B, 1, H] -> [B, M, V]
        h = hidden_states[:, -1]
        cols = [nn.functional.silu(b(h.float())).to(h.dtype) for b in self.blocks]
        return self.lm_head(torch.stack(cols, 1))


def main():
    a = args()
    pair, tok, prompts = setup(a.n, torch.bfloat16)
    budgets = budgets_for(a.n)
    target = pair.target
    emb = target.get_input_embeddings()
    heads = MedusaHeads(target.config.hidden_size, target.lm_head)
    seqs = list(range(len(prompts)))
    toks = {i: list(p) for i, p in enumerate(prompts)}
    outs = [[] for _ in prompts]
    partial_seen = set()
    w_ctx = watcher(a, pair, prompts, "blind-medusa", drafter=heads, use_draft=False)
    with torch.no_grad(), w_ctx as w:
        P = max(len(p) for p in prompts)
        ids = torch.tensor([[1] * (P - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (P - len(p)) + [1] * len(p) for p in prompts])
        cache = DynamicCache(config=target.config)
        w.rows(seqs)
        o = target(
            inputs_embeds=emb(ids),
            attention_mask=mask,
            position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
            cache=cache,
            use_cache=True,
            output_hidden_states=True,
        )
        # the prompt's last token was fed: its logits give the first token, its state feeds the heads
        first = o.logits[:, -1].argmax(-1).tolist()
        for s in seqs:
            w.emit(s, [first[s]], None)
            outs[s].append(first[s])
            toks[s].append(first[s])
        hid = o.hidden_states[-1][:, -1:]
        call = 1
        while seqs:
            w.rows(seqs)
            drafts = heads(hid).argmax(-1).tolist()  # [B, M]
            B, W = len(seqs), mask.shape[1]
            q = torch.tensor([[toks[s][-1]] + drafts[r] for r, s in enumerate(seqs)])
            pos = torch.tensor([[len(toks[s]) - 1 + i for i in range(M + 1)] for s in seqs])
            full = torch.cat([mask, torch.ones(B, M + 1, dtype=mask.dtype)], 1)
            o = target(
                inputs_embeds=emb(q),
                attention_mask=full,
                position_ids=pos,
                cache=cache,
                use_cache=True,
                output_hidden_states=True,
            )
            am = o.logits.argmax(-1).tolist()
            keep, hrows = [], []
            for r, s in enumerate(seqs):
                acc = 0
                while acc < M and drafts[r][acc] == am[r][acc]:
                    acc += 1
                full[r, W + acc + 1 :] = 0  # rejected drafts: holes
                if a.bug == "hole_kept" and 0 < acc < M and not partial_seen:
                    full[r, W + acc + 1 :] = 1
                    partial_seen.add(s)
                    print(f"BUG-HIT hole_kept call={call} seq={s} n={len(toks[s])} (attended from its next step)")
                col = acc
                if a.bug == "head_col" and acc > 0:
                    col = 0
                    print(f"BUG-HIT head_col call={call} seq={s} n={len(toks[s])} (heads fed the wrong state)")
                new = cut(drafts[r][:acc] + [am[r][acc]], budgets[s] - len(outs[s]))
                outs[s] += new
                toks[s] += new
                fin = new[-1] == EOS or len(outs[s]) >= budgets[s]
                w.emit(s, new, ("eos" if new[-1] == EOS else "length") if fin else None)
                hrows.append(o.hidden_states[-1][r, col])
                if not fin:
                    keep.append(r)
            mask = full
            hid = torch.stack(hrows)[:, None]
            call += 1
            if len(keep) < B:
                idx = torch.tensor(keep, dtype=torch.long)
                cache.batch_select_indices(idx)
                mask, hid = mask[idx], hid[idx]
                seqs = [seqs[r] for r in keep]
    report(outs, prompts, budgets, tok, "bfloat16")


if __name__ == "__main__":
    main()
