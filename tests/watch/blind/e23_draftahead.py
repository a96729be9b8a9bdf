"""Drafting ahead: pipelined speculative decoding, run sequentially.

Each step, after the k=3 drafts of step t are proposed, the draft model goes on (before the
target's verify) as if all of them were accepted and the bonus were its own next choice g:
it proposes g, then s1..s3, the drafts of step t+1. After the verify, a row that accepted all 3
drafts and whose bonus equals g keeps s1..s3 as its next drafts (no fresh draft calls); every
other row rolls its draft cache back to its committed tokens (rejected and speculative slots
masked out as holes) and proposes fresh drafts. Both models run one padded batch over their own
DynamicCache; every slot keeps its logical position; rows finish at different steps and then
feed only padding.

Bugs (--bug):
  stale_guess  a row that accepted all drafts takes the speculation whole, including the
               guessed bonus g as its next pending token, even where the target's bonus differs
               (the right bonus is emitted, the guess is what gets fed): first shows at the step
               after the first all-accepted step whose bonus != g, for that row.
  no_rollback  after a discarded speculation, the draft cache masks out the rejected drafts but
               not the speculative slots past d3 (g, s1, s2): the fresh drafts attend stale
               speculative KV. First shows at the first step whose fresh drafts follow a
               discarded speculation.
"""

import os
import sys

import torch
from common import EOS, args, budgets_for, cut, report, setup, watcher

K = 3
PAD = EOS


class Batch:
    """One model's batched cache with per-slot validity and logical positions."""

    def __init__(self, model, B):
        from transformers import DynamicCache

        self.model, self.B = model, B
        self.cache = DynamicCache(config=model.config)
        self.valid = [[] for _ in range(B)]  # per row, per slot: 1 attended, 0 pad/hole
        self.pos = [[] for _ in range(B)]  # per row, per slot: logical position (-1 pad)

    @torch.no_grad()
    def forward(self, toks, poss, live):
        """toks/poss: per row lists of equal length T; live[b][j]: slot is real."""
        for b in range(self.B):
            self.valid[b] += [int(x) for x in live[b]]
            self.pos[b] += [p if ok else -1 for p, ok in zip(poss[b], live[b])]
        mask = torch.tensor(self.valid, dtype=torch.long)
        ids = torch.tensor(toks, dtype=torch.long)
        pos = torch.tensor([[max(p, 0) for p in r] for r in poss], dtype=torch.long)
        out = self.model(
            input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=self.cache, use_cache=True
        )
        return out.logits.argmax(-1).tolist()

    @torch.no_grad()
    def sub_forward(self, rows, toks, poss):
        """One token for each of `rows` only: a sub-batch over their gathered KV; the other
        rows get a hole (a zero key, masked) in the new slot."""
        from transformers import DynamicCache

        idx = torch.tensor(rows)
        sub = DynamicCache(config=self.model.config)
        for i, layer in enumerate(self.cache.layers):
            sub.update(layer.keys[idx].clone(), layer.values[idx].clone(), i)
        mask = torch.tensor([self.valid[b] + [1] for b in rows], dtype=torch.long)
        out = self.model(
            input_ids=torch.tensor(toks),
            attention_mask=mask,
            position_ids=torch.tensor(poss),
            past_key_values=sub,
            use_cache=True,
        )
        for i, layer in enumerate(self.cache.layers):
            for name in ("keys", "values"):
                full = getattr(layer, name)
                col = full.new_zeros(full.shape[0], full.shape[1], 1, full.shape[3])
                col[idx] = getattr(sub.layers[i], name)[:, :, -1:]
                setattr(layer, name, torch.cat([full, col], dim=2))
        for b in range(self.B):
            self.valid[b].append(int(b in rows))
            self.pos[b].append(poss[rows.index(b)][0] if b in rows else -1)
        return dict(zip(rows, out.logits[:, -1].argmax(-1).tolist()))

    def drop_from(self, b, first_pos):
        """Roll row b back: every slot at logical position >= first_pos becomes a hole."""
        for j, p in enumerate(self.pos[b]):
            if p >= first_pos:
                self.valid[b][j] = 0


def main():
    a = args()
    pair, tok, prompts = setup(a.n)
    budgets = budgets_for(a.n)
    B, P = len(prompts), max(len(p) for p in prompts)
    outs = [[] for _ in range(B)]
    done = [False] * B
    with watcher(a, pair, prompts, "aa-draft-ahead") as w:
        w.rows(list(range(B)))
        tgt, dft = Batch(pair.target, B), Batch(pair.draft, B)
        # prefill both models, left padded; the target's last column gives each row's first token
        toks = [[PAD] * (P - len(p)) + p for p in prompts]
        live = [[0] * (P - len(p)) + [1] * len(p) for p in prompts]
        poss = [[0] * (P - len(p)) + list(range(len(p))) for p in prompts]
        first = tgt.forward(toks, poss, live)
        dft.forward(toks, poss, live)
        L = [len(p) + 1 for p in prompts]  # committed length, pending token included
        pending = [first[b][-1] for b in range(B)]
        for b in range(B):
            outs[b] = [pending[b]]
            done[b] = pending[b] == EOS or len(outs[b]) >= budgets[b]
            w.emit(b, [pending[b]], ("eos" if pending[b] == EOS else "length") if done[b] else None)
        drafts = [None] * B  # speculative drafts kept for a row (None: propose fresh)
        fed = list(pending)  # the pending token each row feeds its next verify
        step = 0  # the prefill was step 0
        while not all(done):
            step += 1
            act = [not d for d in done]
            fresh = [act[b] and drafts[b] is None for b in range(B)]
            chain = [[] for _ in range(B)]  # per row: pending, d1..d3, g, s1..s3
            for b in range(B):
                chain[b] = [fed[b]] + (list(drafts[b]) if drafts[b] is not None else [])
            # calls A..C: fresh rows feed pending, d1, d2 (a sub-batch: the others sit out)
            rows = [b for b in range(B) if fresh[b]]
            for j in range(K if rows else 0):
                if len(rows) < B:
                    w.batch(rows, model="draft")
                nxt = dft.sub_forward(rows, [[chain[b][j]] for b in rows], [[L[b] - 1 + j] for b in rows])
                for b in rows:
                    chain[b].append(nxt[b])
            # calls D..G: drafting ahead, every live row feeds d3, g, s1, s2
            for j in range(K, 2 * K + 1):
                t = [[chain[b][j] if act[b] else PAD] for b in range(B)]
                p = [[L[b] - 1 + j] for b in range(B)]
                nxt = dft.forward(t, p, [[act[b]] for b in range(B)])
                for b in range(B):
                    if act[b]:
                        chain[b].append(nxt[b][0])
            # verify: pending + d1..d3 at logical positions L-1 .. L+2
            w.batch(list(range(B)), drafts=[K if act[b] else None for b in range(B)])
            t = [chain[b][: K + 1] if act[b] else [PAD] * (K + 1) for b in range(B)]
            p = [[L[b] - 1 + j for j in range(K + 1)] for b in range(B)]
            am = tgt.forward(t, p, [[act[b]] * (K + 1) for b in range(B)])
            for b in range(B):
                if not act[b]:
                    continue
                d = chain[b][1 : K + 1]
                n = 0
                while n < K and d[n] == am[b][n]:
                    n += 1
                new = d[:n] + [am[b][n]]
                guess, spec = chain[b][K + 1], chain[b][K + 2 :]
                tgt.drop_from(b, L[b] + n)  # rejected drafts' target KV
                reuse = n == K and new[-1] == guess
                if os.environ.get("AA_LOG"):
                    print(
                        f"verify {step} seq {b}: accepted {n} bonus {new[-1]} guess {guess}"
                        f" {'reuse' if reuse else 'fresh'}",
                        file=sys.stderr,
                    )
                if a.bug == "stale_guess":
                    reuse = n == K
                if reuse:
                    drafts[b] = spec
                    fed[b] = guess
                else:
                    drafts[b] = None
                    fed[b] = new[-1]
                    if a.bug == "no_rollback":
                        for j, q in enumerate(dft.pos[b]):  # only this step's drafts
                            if L[b] + n <= q < L[b] - 1 + K + 1:
                                dft.valid[b][j] = 0
                    else:
                        dft.drop_from(b, L[b] + n)  # back to the committed tokens
                new = cut(new, budgets[b] - len(outs[b]))
                outs[b] += new
                L[b] += n + 1
                done[b] = new[-1] == EOS or len(outs[b]) >= budgets[b]
                w.emit(b, new, ("eos" if new[-1] == EOS else "length") if done[b] else None)
    report(outs, prompts, budgets, tok)


if __name__ == "__main__":
    main()
