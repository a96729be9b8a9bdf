"""Self-speculative decoding by early exit (LayerSkip / HF `assistant_early_exit` style).

No draft model: drafts come from the TARGET's own first L decoder layers, then its final norm and
lm_head, run here by calling the target's submodules (embed_tokens, layers[:L], rotary_emb, norm,
lm_head) over an early-exit KV cache of our own for those L layers. The full target verifies the
K drafts in one batched forward over its own cache. Greedy verification.

Layout: a left-padded batch over two DynamicCaches (target: all layers; early exit: layers[:L])
whose slots mirror each other. Every verify appends K+1 slots per row (pending + K drafts); the
slots of rejected drafts stay in both caches as holes, masked out of a per-row 2-D mask `valid`.
The early-exit pass feeds pending, d1..dK (K+1 calls, the last only to cache dK) so its cache gains
the same K+1 slots as the target's. Finished rows are dropped (batch_select_indices).
Position of a row's query token i: (committed length - 1) + i = valid.sum() + i.

Bugs (--bug):
  pos_holes     positions counted from the row's physical cache slots (holes included), not from
                its committed length: off by the rejected drafts after the first partial accept.
  commit_extra  off-by-one accept count after a rejection: the first rejected draft is kept too
                (its KV unmasked) and the target's choice after it taken as the bonus, so a row
                commits one token too many, one of them a token the target refused.
  stale_ee      (extra, draft-only) the early-exit cache is not rolled back after a rejection:
                the next drafts attend the rejected drafts' slots. Outputs stay right (greedy
                verification); only acceptance drops.
"""

import torch
from common import EOS, args, budgets_for, cut, report, setup, watcher
from transformers import DynamicCache
from transformers.masking_utils import create_causal_mask

K = 3
PAD = 1


@torch.no_grad()
def main():
    a = args()
    pair, tok, prompts = setup(a.n)
    budgets = budgets_for(a.n)
    tgt = pair.target
    body, cfg = tgt.model, tgt.config
    L = cfg.num_hidden_layers // 2  # early-exit depth
    tcache, dcache = DynamicCache(config=cfg), DynamicCache(config=cfg)

    def early_exit(ids, pos, mask2d):
        """The target's first L layers + final norm + lm_head over the early-exit cache."""
        h = body.embed_tokens(ids)
        cm = create_causal_mask(config=cfg, inputs_embeds=h, attention_mask=mask2d, cache=dcache, position_ids=pos)
        pe = body.rotary_emb(h, position_ids=pos)
        for layer in body.layers[:L]:
            h = layer(h, attention_mask=cm, position_embeddings=pe, position_ids=pos, cache=dcache, use_cache=True)
        return tgt.lm_head(body.norm(h))

    n = len(prompts)
    rows = list(range(n))  # sequence held by each batch row
    ctx = [list(p) for p in prompts]  # committed tokens: prompt + output
    outs = [[] for _ in range(n)]
    first_bug, bugged = None, []  # step where the injected bug first changes the engine, its seqs

    with watcher(a, pair, prompts, "early-exit-" + (a.bug or "ok"), use_draft=False) as w:
        # prefill prompt[:-1] of every row into both caches (left padded); the last prompt token
        # is the first verify's pending token, so the prefill yields no token (a chunk)
        pre = [p[:-1] for p in prompts]
        P = max(len(p) for p in pre)
        ids = torch.tensor([[PAD] * (P - len(p)) + p for p in pre])
        valid = torch.tensor([[0] * (P - len(p)) + [1] * len(p) for p in pre], dtype=torch.bool)
        lpad = torch.tensor([P - len(p) for p in pre])
        dvalid = valid  # the early-exit cache's slots (== valid unless --bug stale_ee)
        pos = (valid.long().cumsum(1) - 1).clamp(min=0)
        w.batch(rows, chunk=[True] * n)
        tgt(input_ids=ids, attention_mask=valid.long(), position_ids=pos, cache=tcache, use_cache=True)
        early_exit(ids, pos, valid.long())

        step = 0
        while rows:
            B = len(rows)
            true_base = valid.sum(1)  # committed length - 1: the pending token's position
            base = true_base
            if a.bug == "pos_holes":
                base = valid.shape[1] - lpad  # physical slots the row owns, holes included
                bad = [rows[b] for b in range(B) if base[b] != true_base[b]]
                if bad and first_bug is None:
                    first_bug, bugged = step, bad
            pending = torch.tensor([[ctx[s][-1]] for s in rows])

            # draft: K+1 early-exit calls, one token each (the last only caches dK)
            cur, drafts = pending, []
            for j in range(K + 1):
                m2 = torch.cat([dvalid, torch.ones(B, j + 1, dtype=torch.bool)], 1).long()
                logits = early_exit(cur, (base + j)[:, None], m2)
                cur = logits[:, -1].argmax(-1, keepdim=True)
                if j < K:
                    drafts.append(cur)
            drafts = torch.cat(drafts, 1)  # [B, K]

            # verify: pending + K drafts in one target forward over its own cache
            q = torch.cat([pending, drafts], 1)
            qpos = base[:, None] + torch.arange(K + 1)[None]
            m2 = torch.cat([valid, torch.ones(B, K + 1, dtype=torch.bool)], 1).long()
            w.batch(rows, drafts=[K] * B)
            g = tgt(input_ids=q, attention_mask=m2, position_ids=qpos, cache=tcache, use_cache=True).logits.argmax(
                -1
            )  # [B, K+1]

            keep_slots = torch.zeros(B, K + 1, dtype=torch.bool)
            for b, s in enumerate(rows):
                d, gb = drafts[b].tolist(), g[b].tolist()
                acc = 0
                while acc < K and d[acc] == gb[acc]:
                    acc += 1
                if a.bug == "commit_extra" and acc < K:
                    room = budgets[s] - len(outs[s])
                    good = cut(d[:acc] + [gb[acc]], room)
                    acc += 1  # off by one: the rejected draft counted as accepted
                    if cut(d[:acc] + [gb[acc]], room) != good and first_bug in (None, step):
                        first_bug, bugged = step, bugged + [s]
                commit = cut(d[:acc] + [gb[acc]], budgets[s] - len(outs[s]))
                keep_slots[b, : acc + 1] = True  # pending + accepted drafts; rejected: holes
                ctx[s] += commit
                outs[s] += commit
                why = "eos" if commit[-1] == EOS else "length" if len(outs[s]) >= budgets[s] else None
                w.emit(s, commit, why)
            valid = torch.cat([valid, keep_slots], 1)
            if a.bug == "stale_ee":  # rejected drafts stay attended by the early exit
                if first_bug is None and not keep_slots.all():
                    first_bug, bugged = step + 1, [rows[b] for b in range(B) if not keep_slots[b].all()]
                dvalid = torch.cat([dvalid, torch.ones(B, K + 1, dtype=torch.bool)], 1)
            else:
                dvalid = valid

            # drop finished rows from both caches and the mask
            keep = [b for b, s in enumerate(rows) if outs[s][-1] != EOS and len(outs[s]) < budgets[s]]
            if len(keep) < B:
                rows = [rows[b] for b in keep]
                if rows:
                    idx = torch.tensor(keep)
                    tcache.batch_select_indices(idx)
                    dcache.batch_select_indices(idx)
                    valid, lpad, dvalid = valid[idx], lpad[idx], dvalid[idx]
                    w.rows(rows)
            step += 1

    print(f"verify steps: {step}; injected bug first changes the engine at step {first_bug}, seqs {bugged}")
    report(outs, prompts, budgets, tok)


if __name__ == "__main__":
    main()
