"""Two micro-batches, interleaved greedy speculative decoding.

Shape: the prompts are sorted by length and split into two micro-batches: A (the shorter
ceil(n/2)) and B (the rest). Each micro-batch is a left-padded batch with its own target and draft
DynamicCache, prefilled whole by both models (the target's prefill gives each row its first token).
The loop alternates: one speculative step of A (K=3 draft calls, one verify of [pending, d1..d3]),
then one of B, and so on until both are done
a batch whose rows are all done is skipped. Caches
only grow: rejected verify / draft slots stay in the cache and are masked out (holes) in the 2-D
mask. Positions come from each row's logical length (tracked separately from the mask). The draft's
first call of a step feeds two columns [unseen, pending] (unseen = the last draft when all K were
accepted, never fed to the draft
else a masked pad). Finished rows stay in their batch, fed masked
pads.

Bugs: --bug swapcache : at B's third step, B's verify positions are taken from A's row lengths
                        (the wrong micro-batch's state object; A has at least as many rows)
      --bug nocrop    : after each verify of batch A, the rejected slots stay attended in its mask
"""

import os
import sys

import torch
from common import EOS, args, budgets_for, cut, report, setup, watcher
from transformers import DynamicCache

K = 3
PAD = 1


class MB:
    def __init__(self, name, seqs, prompts, target, draft):
        self.name = name
        self.seqs = seqs  # prompt indices, row order
        self.n = len(seqs)
        W = max(len(prompts[s]) for s in seqs)
        self.pads = [W - len(prompts[s]) for s in seqs]
        self.ids = [[PAD] * self.pads[r] + prompts[s] for r, s in enumerate(seqs)]
        self.tmask = [[0] * self.pads[r] + [1] * len(prompts[s]) for r, s in enumerate(seqs)]
        self.dmask = [list(m) for m in self.tmask]
        self.tlen = [len(prompts[s]) for s in seqs]  # committed tokens in the target cache (logical)
        self.dlen = list(self.tlen)  # committed tokens in the draft cache (logical)
        self.tc = DynamicCache(config=target.config)
        self.dc = DynamicCache(config=draft.config)
        self.pending = [None] * self.n
        self.unseen = [None] * self.n
        self.done = [False] * self.n
        self.steps = 0


def main():
    a = args()
    pair, tok, prompts = setup(a.n)
    budgets = budgets_for(a.n)
    target, draft = pair.target, pair.draft
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    half = (len(order) + 1) // 2
    A = MB("A", order[:half], prompts, target, draft)
    B = MB("B", order[half:], prompts, target, draft)
    outs = [[] for _ in prompts]
    tcall = [0]  # target calls so far (prefills included)
    first_effect = []
    stale = {}  # nocrop: seq -> A's step whose rejected slots it keeps attending

    def note(call, seq, why):
        if not first_effect:
            first_effect.append((call, seq, why))
            print(f"BUG first effect: target call {call} (batch step), seq {seq}: {why}")

    def commit(mb, r, toks, w):
        s = mb.seqs[r]
        new = cut(toks, budgets[s] - len(outs[s]))
        outs[s] += new
        fin = new[-1] == EOS or len(outs[s]) >= budgets[s]
        w.emit(s, new, ("eos" if new[-1] == EOS else "length") if fin else None)
        mb.done[r] = fin
        return new

    with torch.no_grad(), watcher(a, pair, prompts, "probe-twobatches") as w:
        for mb in (A, B):
            w.rows(mb.seqs)
            ids = torch.tensor(mb.ids)
            am = torch.tensor(mb.tmask)
            pos = (am.cumsum(-1) - 1).clamp(min=0)
            lg = target(input_ids=ids, attention_mask=am, position_ids=pos, cache=mb.tc, use_cache=True).logits[:, -1]
            tcall[0] += 1
            draft(input_ids=ids, attention_mask=am, position_ids=pos, cache=mb.dc, use_cache=True)
            first = lg.argmax(-1).tolist()
            for r in range(mb.n):
                mb.pending[r] = first[r]
                commit(mb, r, [first[r]], w)

        def step(mb):
            w.rows(mb.seqs)
            live = [not d for d in mb.done]
            # ---- draft: call 0 feeds [unseen|pad, pending], calls 1..K-1 feed the newest draft
            feed, fm, fpos = [], [], []
            for r in range(mb.n):
                if not live[r]:
                    feed.append([PAD, PAD])
                    fm.append([0, 0])
                    fpos.append([mb.dlen[r]] * 2)
                elif mb.unseen[r] is not None:
                    feed.append([mb.unseen[r], mb.pending[r]])
                    fm.append([1, 1])
                    fpos.append([mb.dlen[r], mb.dlen[r] + 1])
                else:
                    feed.append([PAD, mb.pending[r]])
                    fm.append([0, 1])
                    fpos.append([mb.dlen[r], mb.dlen[r]])
            props = [[] for _ in range(mb.n)]
            for i in range(K):
                am = torch.tensor([mb.dmask[r] + fm[r] for r in range(mb.n)])
                lg = draft(
                    input_ids=torch.tensor(feed),
                    attention_mask=am,
                    position_ids=torch.tensor(fpos),
                    cache=mb.dc,
                    use_cache=True,
                ).logits[:, -1]
                nxt = lg.argmax(-1).tolist()
                for r in range(mb.n):
                    mb.dmask[r] += fm[r]
                    mb.dlen[r] += sum(fm[r])
                    if live[r]:
                        props[r].append(nxt[r])
                if i + 1 < K:
                    feed = [[props[r][-1] if live[r] else PAD] for r in range(mb.n)]
                    fm = [[int(live[r])] for r in range(mb.n)]
                    fpos = [[mb.dlen[r]] for r in range(mb.n)]
            # ---- verify [pending, d1..dK]
            Q = K + 1
            q = [[mb.pending[r]] + props[r] if live[r] else [PAD] * Q for r in range(mb.n)]
            qm = [[1] * Q if live[r] else [0] * Q for r in range(mb.n)]
            base = list(mb.tlen)
            if a.bug == "swapcache" and mb is B and mb.steps == 2:
                other = A  # BUG: the other micro-batch's lengths
                base = other.tlen[: mb.n]
                for r in range(mb.n):
                    if live[r] and base[r] != mb.tlen[r]:
                        note(
                            tcall[0] + 1,
                            mb.seqs[r],
                            f"B's verify positions from A's lengths ({base[r]} vs {mb.tlen[r]})",
                        )
                        break
            pos = torch.tensor([[base[r] + i for i in range(Q)] for r in range(mb.n)])
            am = torch.tensor([mb.tmask[r] + qm[r] for r in range(mb.n)])
            logits = target(
                input_ids=torch.tensor(q), attention_mask=am, position_ids=pos, cache=mb.tc, use_cache=True
            ).logits
            tcall[0] += 1
            mb.steps += 1
            choice = logits.argmax(-1).tolist()
            for r in range(mb.n):
                if not live[r]:
                    mb.tmask[r] += [0] * Q
                    continue
                d = props[r]
                acc = 0
                while acc < K and d[acc] == choice[r][acc]:
                    acc += 1
                new = commit(mb, r, d[:acc] + [choice[r][acc]], w)
                # target cache: keep pending + accepted drafts, mask the rejected ones
                if a.bug == "nocrop" and mb is A:
                    mb.tmask[r] += [1] * Q  # BUG: rejected slots stay attended
                    if acc < K:
                        stale[mb.seqs[r]] = stale.get(mb.seqs[r], mb.steps)
                else:
                    mb.tmask[r] += [1] * (1 + acc) + [0] * (K - acc)
                mb.tlen[r] += 1 + acc
                # draft cache: wrote [x, pending, d1 .. d(K-1)]; keep pending and the accepted drafts
                kept = min(acc, K - 1)
                tail = mb.dmask[r][-(K - 1) :]
                mb.dmask[r][-(K - 1) :] = [1] * kept + [0] * (K - 1 - kept)
                mb.dlen[r] -= sum(tail) - kept
                mb.unseen[r] = d[K - 1] if acc == K else None
                mb.pending[r] = choice[r][acc]
                if os.environ.get("DEBUG"):
                    print(mb.name, mb.steps, "seq", mb.seqs[r], "acc", acc, "new", new, file=sys.stderr)

        while not (all(A.done) and all(B.done)):
            for mb in (A, B):
                if all(mb.done):
                    continue
                if a.bug == "nocrop" and mb is A:
                    # rejected slots are first attended at A's next verify, by the live rows that rejected
                    hit = [s for r, s in enumerate(A.seqs) if not A.done[r] and s in stale]
                    if hit:
                        note(
                            tcall[0] + 1,
                            hit,
                            f"A's step {A.steps + 1} attends slots rejected at A's steps "
                            + str({s: stale[s] for s in hit}),
                        )
                step(mb)

    report(outs, prompts, budgets, tok)


if __name__ == "__main__":
    main()
