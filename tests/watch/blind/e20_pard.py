"""PARD-style parallel drafting, batched, greedy verification (blind round 4, 2026-12-08).

Each step the draft proposes all K=3 drafts in ONE forward: each row is fed [catch-up..., pending, P, P]
over its own KV cache (catch-up: the drafts the target accepted last step, which the draft never
cached), and the drafts are its argmax at the last K slots. The draft's cache is then cropped by the
K-1 placeholder slots, so it holds committed tokens only. The target verifies [pending, d1, d2, d3] in
one padded forward over its DynamicCache; greedy acceptance plus the bonus; the rejected drafts' slots
are rolled back by masking them out of the row's 2-D mask (holes), every position fed explicitly.
Rows are left-padded; a finished row is dropped from both caches (batch_select_indices).

Bugs (--bug):
  draft_stale  the placeholder slots are not cropped from the draft cache and stay attended: every
               row's next draft call attends K-1 stale slots (first at step 1, every row).
  target_pos   after a partial accept (0 < a < K) the committed length advances by a, not a + 1, so
               the row's next verify is fed positions one too low (first at the step after the
               first such accept, that row; the engine prints where).
"""

import torch
from common import EOS, args, budgets_for, cut, report, setup, watcher
from transformers import DynamicCache

K = 3


def argmax_tail(model, ids, pos, mask, cache, n):
    out = model(input_ids=ids, position_ids=pos, attention_mask=mask, cache=cache, use_cache=True)
    return out.logits[:, -n:].argmax(-1).tolist()


@torch.no_grad()
def run(a):
    pair, tok, prompts = setup(a.n)
    budgets = budgets_for(a.n)
    target, draft = pair.target, pair.draft
    PAD = tok.pad_token_id
    P = PAD  # the placeholder fed in the parallel-draft slots
    B = len(prompts)
    outs = [[] for _ in range(B)]
    expect = None  # (step, seq) where the injected bug first shows
    with watcher(a, pair, prompts, "pd-" + (a.bug or "ok")) as w:
        seqs = list(range(B))
        w.rows(seqs)
        # prefill both models with prompt[:-1], left-padded; the last prompt token is the pending one
        W = max(len(p) for p in prompts) - 1
        ids = torch.full((B, W), PAD)
        mask = torch.zeros((B, W), dtype=torch.long)
        for r, p in enumerate(prompts):
            ids[r, W - len(p) + 1 :] = torch.tensor(p[:-1])
            mask[r, W - len(p) + 1 :] = 1
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        tc, dc = DynamicCache(), DynamicCache()
        target(input_ids=ids, position_ids=pos, attention_mask=mask, cache=tc, use_cache=True)
        draft(input_ids=ids, position_ids=pos, attention_mask=mask, cache=dc, use_cache=True)
        tmask, dmask = mask.clone(), mask.clone()
        L = [len(p) for p in prompts]  # committed length (prompt + output), pending included
        pending = [p[-1] for p in prompts]
        catch = [[] for _ in range(B)]  # committed tokens before pending the draft has not cached
        step = 0
        while seqs:
            n = len(seqs)
            # ---- draft: one forward, [catch..., pending, P, P] per row, drafts at the last K slots
            q = [catch[r] + [pending[r]] for r in range(n)]
            m = max(len(x) for x in q) + K - 1
            ids = torch.full((n, m), PAD)
            qmask = torch.zeros((n, m), dtype=torch.long)
            pos = torch.zeros((n, m), dtype=torch.long)
            for r in range(n):
                c = len(q[r])
                ids[r, m - c - K + 1 : m - K + 1] = torch.tensor(q[r])
                ids[r, m - K + 1 :] = P
                qmask[r, m - c - K + 1 :] = 1
                pos[r, m - c - K + 1 :] = torch.arange(L[r] - c, L[r] + K - 1)
            dmask = torch.cat([dmask, qmask], 1)
            drafts = argmax_tail(draft, ids, pos, dmask, dc, K)
            if a.bug != "draft_stale":
                dc.crop(-(K - 1))  # roll back the placeholder slots
                dmask = dmask[:, : -(K - 1)]
            elif expect is None:
                expect = (step + 1, seqs[0])
            # ---- target: verify [pending, d1..dK] for every row in one forward
            w.batch(seqs, drafts=[K] * n)
            ids = torch.tensor([[pending[r]] + drafts[r] for r in range(n)])
            pos = torch.tensor([[L[r] - 1 + i for i in range(K + 1)] for r in range(n)])
            base = tmask.shape[1]
            tmask = torch.cat([tmask, torch.ones((n, K + 1), dtype=torch.long)], 1)
            choice = argmax_tail(target, ids, pos, tmask, tc, K + 1)
            keep, done = [], []
            for r, s in enumerate(seqs):
                acc = 0
                while acc < K and drafts[r][acc] == choice[r][acc]:
                    acc += 1
                new = drafts[r][:acc] + [choice[r][acc]]
                tmask[r, base + 1 + acc :] = 0  # roll back the rejected drafts' KV
                got = cut(new, budgets[s] - len(outs[s]))
                outs[s] += got
                end = "eos" if got[-1] == EOS else "length" if len(outs[s]) >= budgets[s] else None
                w.emit(s, got, end)
                if end:
                    done.append(r)
                    continue
                keep.append(r)
                adv = acc + 1
                if a.bug == "target_pos" and 0 < acc < K:
                    adv = acc  # BUG: the bonus not counted
                    if expect is None:
                        expect = (step + 1, s)
                L[r] += adv
                catch[r] = drafts[r][:acc]
                pending[r] = new[-1]
            if done:
                idx = torch.tensor(keep, dtype=torch.long)
                for c in (tc, dc):
                    c.batch_select_indices(idx)
                tmask, dmask = tmask[idx], dmask[idx]
                seqs = [seqs[r] for r in keep]
                L = [L[r] for r in keep]
                catch = [catch[r] for r in keep]
                pending = [pending[r] for r in keep]
                if seqs:
                    w.rows(seqs)
            step += 1
    print(f"bug={a.bug or 'none'} steps={step} expect_first={expect}")
    return report(outs, prompts, budgets, tok)


if __name__ == "__main__":
    run(args())
