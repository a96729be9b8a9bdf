"""Speculative decoding over one left-padded batch with duplicate prompts, finished rows dropped
(issue 41, written from the docs alone in the third blind round; truth: `truth_dupes.py`).

Shape: prompts [T0, T0, T1, T1, T2, T5] (n=5: the first five), budgets [12, 20, 16, 7, 18, 14], so
each identical pair finishes at different times. Prompts are left-padded and prefilled whole by
both models (the target's prefill yields each row's first token). Each model keeps one
DynamicCache that only grows; rejected and padded slots stay in it as masked holes (2-D 0/1 masks
with holes). The draft model (K=3) is fed incrementally: its first call of a step feeds the
committed tokens it has not seen ([last draft if all were accepted, pending], left-padded to 2),
then one draft per call. Each row drafts k_r = min(K, room_r - 1) tokens (no drafting beyond its
budget); rows with fewer drafts feed masked pads. The target verifies [pending, d_1..d_k_r],
right-padded to max k + 1. Positions are each row's logical indices (kept as counters, never read
from the mask). When rows finish they are DROPPED: both caches `batch_select_indices(live rows)`,
the masks and per-row state filtered alike, and `w.rows(seq_ids)` declared (API mode).

Bugs: --bug wrongdrop : the engine finds the cache row to drop by prompt (first row holding that
                        prompt), so when the later twin of a pair finishes first, the earlier twin's
                        KV is dropped and the finished row's KV is kept for the survivor (masks and
                        bookkeeping are filtered by sequence, correctly)
      --bug stalehole : at the first step where a still-live row rejects a draft, that row's first
                        rejected verify slot is left attended in the target mask
"""

import json
import os
import sys

import torch
from common import EOS, HERE, args, cut, setup, watcher
from transformers import DynamicCache

K = 3
PAD = 1


def load_dupes(n):
    with open(os.path.join(HERE, "truth_dupes.json")) as f:
        return json.load(f)[str(n)]


def report(outs, prompts, truth, tok):
    ok = all(o == t for o, t in zip(outs, truth))
    for i, o in enumerate(outs):
        text = tok.decode(prompts[i] + o)
        mark = "==" if o == truth[i] else "!="
        print(f"seq {i} {mark} truth: {o}" + ("" if o == truth[i] else f"\n       truth: {truth[i]}"))
        del text
    print("MATCH" if ok else "MISMATCH")
    return ok


def main():
    a = args()
    pair, tok, _ = setup(1)
    spec = load_dupes(a.n)
    prompts, budgets, truth = spec["prompts"], spec["budgets"], spec["truth"]
    target, draft = pair.target, pair.draft
    N = len(prompts)
    W = max(len(p) for p in prompts)
    outs = [[] for _ in prompts]
    first_effect = []

    def note(verify, seq, why):
        if not first_effect:
            first_effect.append((verify, seq, why))

    # per-row state, indexed by batch row; seqs[i] is the sequence in row i
    seqs = list(range(N))
    tmask = [[0] * (W - len(p)) + [1] * len(p) for p in prompts]
    tfed = [[PAD] * (W - len(p)) + list(p) for p in prompts]  # what each target slot holds (bookkeeping)
    dmask = [list(m) for m in tmask]
    length = [len(p) for p in prompts]  # committed tokens per row (prompt + output)
    pending = [None] * N
    unseen = [None] * N  # last draft accepted but never fed to the draft
    stale_done = False

    with torch.no_grad(), watcher(a, pair, prompts, "probe-dupes") as w:
        tc, dc = DynamicCache(config=target.config), DynamicCache(config=draft.config)
        ids = torch.tensor(tfed)
        am = torch.tensor(tmask)
        pos = (am.cumsum(-1) - 1).clamp(min=0)
        first = target(input_ids=ids, attention_mask=am, position_ids=pos, cache=tc, use_cache=True).logits[:, -1]
        draft(input_ids=ids, attention_mask=am, position_ids=pos, cache=dc, use_cache=True)
        fin = [False] * N
        for r in range(N):
            t = int(first[r].argmax())
            new = cut([t], budgets[r])
            outs[r] += new
            pending[r] = t
            length[r] += 1
            fin[r] = new[-1] == EOS or len(outs[r]) >= budgets[r]
            w.emit(r, new, ("eos" if new[-1] == EOS else "length") if fin[r] else None)
        verify = 0
        while True:
            # ---- drop finished rows
            if any(fin):
                live = [i for i in range(len(seqs)) if not fin[i]]
                if not live:
                    break
                cache_rows = list(live)
                if a.bug == "wrongdrop":
                    # the buggy lookup: row to drop = first row whose prompt equals the finished one's
                    for i in range(len(seqs)):
                        if fin[i]:
                            j = next(x for x in range(len(seqs)) if prompts[seqs[x]] == prompts[seqs[i]])
                            if j != i and j in cache_rows:
                                cache_rows[cache_rows.index(j)] = i
                                # effect: row j's sequence now reads row i's KV; it hits only where
                                # j attends a slot whose fed token differs in row i
                                diff = [c for c in range(len(tmask[j])) if tmask[j][c] and tfed[j][c] != tfed[i][c]]
                                if diff:
                                    note(
                                        verify + 1,
                                        seqs[j],
                                        f"reads finished twin seq {seqs[i]}'s KV (slots {diff})",
                                    )
                                else:
                                    print("wrongdrop: twin KV identical on attended slots, no effect", file=sys.stderr)
                idx = torch.tensor(cache_rows)
                tc.batch_select_indices(idx)
                dc.batch_select_indices(idx)
                seqs = [seqs[i] for i in live]
                tmask = [tmask[i] for i in live]
                tfed = [tfed[i] for i in live]
                dmask = [dmask[i] for i in live]
                length = [length[i] for i in live]
                pending = [pending[i] for i in live]
                unseen = [unseen[i] for i in live]
                w.rows(seqs)
            B = len(seqs)
            kk = [max(0, min(K, budgets[s] - len(outs[s]) - 1)) for s in seqs]
            km = max(kk)
            # ---- draft: call 0 feeds [unseen or pad, pending]; call i feeds d_i
            feed = [[unseen[r] if unseen[r] is not None else PAD, pending[r]] for r in range(B)]
            feedm = [[int(unseen[r] is not None), 1] for r in range(B)]
            fpos = [[length[r] - 2, length[r] - 1] for r in range(B)]
            props = [[] for _ in range(B)]
            ncalls = max(km, 1)
            for i in range(ncalls):
                am = torch.tensor([dmask[r] + feedm[r] for r in range(B)])
                lg = draft(
                    input_ids=torch.tensor(feed),
                    attention_mask=am,
                    position_ids=torch.tensor(fpos),
                    cache=dc,
                    use_cache=True,
                ).logits[:, -1]
                nxt = lg.argmax(-1).tolist()
                for r in range(B):
                    dmask[r] += feedm[r]
                    if i < kk[r]:
                        props[r].append(nxt[r])
                if i + 1 >= km:
                    break
                feed = [[props[r][-1] if i + 1 < kk[r] else PAD] for r in range(B)]
                feedm = [[int(i + 1 < kk[r])] for r in range(B)]
                fpos = [[length[r] + i] for r in range(B)]
            # ---- verify
            Q = km + 1
            q = [[pending[r]] + props[r] + [PAD] * (km - kk[r]) for r in range(B)]
            qm = [[1] * (kk[r] + 1) + [0] * (km - kk[r]) for r in range(B)]
            pos = torch.tensor([[length[r] - 1 + i for i in range(Q)] for r in range(B)])
            am = torch.tensor([tmask[r] + qm[r] for r in range(B)])
            logits = target(
                input_ids=torch.tensor(q), attention_mask=am, position_ids=pos, cache=tc, use_cache=True
            ).logits
            choice = logits.argmax(-1).tolist()
            verify += 1
            fin = [False] * B
            for r in range(B):
                s = seqs[r]
                d = props[r]
                acc = 0
                while acc < kk[r] and d[acc] == choice[r][acc]:
                    acc += 1
                new = d[:acc] + [choice[r][acc]]
                keep = [1] * (acc + 1) + [0] * (Q - acc - 1)
                tfed[r] += q[r]
                new = cut(new, budgets[s] - len(outs[s]))
                outs[s] += new
                fin[r] = new[-1] == EOS or len(outs[s]) >= budgets[s]
                if a.bug == "stalehole" and not stale_done and acc < kk[r] and not fin[r]:
                    keep[acc + 1] = 1  # the first rejected draft's slot left attended
                    stale_done = True
                    note(verify + 1, s, f"rejected slot {acc + 1} of verify {verify} left attended")
                tmask[r] += keep
                # draft slots of this step: call 0's two, then d_1 .. d_(ncalls-1)
                fed = min(acc, max(kk[r] - 1, 0))
                dmask[r][-(ncalls + 1) :] = dmask[r][-(ncalls + 1) :][:2] + [1] * fed + [0] * (ncalls - 1 - fed)
                unseen[r] = d[-1] if (kk[r] > 0 and acc == kk[r]) else None
                length[r] += len(d[:acc]) + 1
                pending[r] = choice[r][acc]
                if os.environ.get("DEBUG"):
                    print("  v", verify, "seq", s, "k", kk[r], "acc", acc, "emit", len(new), file=sys.stderr)
                w.emit(s, new, ("eos" if new[-1] == EOS else "length") if fin[r] else None)
            if os.environ.get("DEBUG"):
                print("verify", verify, "seqs", seqs, "k", kk, file=sys.stderr)
    report(outs, prompts, truth, tok)
    if a.bug:
        print("BUG first effect: verify {}, seq {}: {}".format(*first_effect[0]) if first_effect else "BUG no effect")


if __name__ == "__main__":
    sys.exit(main())
