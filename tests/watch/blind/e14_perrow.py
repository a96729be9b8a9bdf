"""Batched drafting, per-row verification.

Shape: the draft model keeps one left-padded batch of the live rows over its own DynamicCache and
proposes K=3 drafts for all of them in three batched calls (call 0 feeds [last draft the draft never
saw or a masked pad, pending], calls 1, 2 feed d1, d2). Rejected draft slots stay in the draft cache
as masked holes; positions are each row's count of attended slots. When a row finishes it is dropped
from the draft batch (`batch_select_indices`) and the survivors are re-indexed. The target keeps one
DynamicCache PER ROW: each row is prefilled alone (the prefill gives its first token) and each round
verifies [pending, d1, d2, d3] alone (batch 1, no mask, positions from the engine's own committed
count), rows in sequence order, finished rows skipped; after a rejection the row's cache is cropped
to its committed tokens (`crop`).

Per-draft-row state (the proposals buffer and the accepted-count buffer read by the draft's mask
update) is preallocated at [B, ...] and indexed by the row's slot in the draft batch.

Bugs: --bug crop1 : after a rejection the row's target cache is cropped one slot too few: the KV of
                    the first rejected draft stays and is attended from the next verify on
      --bug swap  : the seq -> draft-slot map is not rebuilt when a row leaves the draft batch, so the
                    verify loop reads (and writes back) the old slot: the rows after the finished one
                    verify the next row's drafts and hand their accepted count to the next row's
                    draft slot
"""

import os
import sys

import torch
from common import EOS, args, budgets_for, cut, report, setup, watcher
from transformers import DynamicCache

K = 3
PAD = 1


def main():
    a = args()
    pair, tok, prompts = setup(a.n)
    budgets = budgets_for(a.n)
    target, draft = pair.target, pair.draft
    B = len(prompts)
    outs = [[] for _ in prompts]
    done = [False] * B
    first_effect = []

    def note(rnd, seq, why):
        if not first_effect:
            first_effect.append((rnd, seq, why))

    with torch.no_grad(), watcher(a, pair, prompts, "probe-perrow") as w:
        # ---- target: one cache per row, each prompt prefilled alone; its logits give token 1
        tcache = [DynamicCache(config=target.config) for _ in range(B)]
        pending = [None] * B
        for s in range(B):
            w.batch([s])
            ids = torch.tensor([prompts[s]])
            lg = target(
                input_ids=ids, position_ids=torch.arange(len(prompts[s]))[None], cache=tcache[s], use_cache=True
            ).logits[0, -1]
            pending[s] = int(lg.argmax())
        # ---- draft: one left-padded batch of every row, its own cache
        W = max(len(p) for p in prompts)
        drows = list(range(B))  # draft slot j holds sequence drows[j]
        dmask = [[0] * (W - len(p)) + [1] * len(p) for p in prompts]
        unseen = [None] * B  # by draft slot: a last draft the draft proposed but never fed
        dc = DynamicCache(config=draft.config)
        w.rows(drows, model="draft")
        am = torch.tensor(dmask)
        draft(
            input_ids=torch.tensor([[PAD] * (W - len(p)) + p for p in prompts]),
            attention_mask=am,
            position_ids=(am.cumsum(-1) - 1).clamp(min=0),
            cache=dc,
            use_cache=True,
        )
        for s in range(B):
            new = cut([pending[s]], budgets[s])
            outs[s] += new
            fin = new[-1] == EOS or len(outs[s]) >= budgets[s]
            w.emit(s, new, ("eos" if new[-1] == EOS else "length") if fin else None)
            done[s] = fin
        slot = {s: j for j, s in enumerate(drows)}
        props_buf = torch.full((B, K), PAD, dtype=torch.long)  # proposals, by draft slot
        acc_buf = [0] * B  # accepted drafts, by draft slot, read by the draft's mask update
        rnd = 0
        tcalls = [B]  # target calls so far (the B prefills)
        while not all(done):
            rnd += 1
            # drop finished rows from the draft batch; survivors keep their order
            keep = [j for j, s in enumerate(drows) if not done[s]]
            if len(keep) < len(drows):
                dc.batch_select_indices(torch.tensor(keep))
                drows = [drows[j] for j in keep]
                dmask = [dmask[j] for j in keep]
                unseen = [unseen[j] for j in keep]
                acc_buf[: len(keep)] = [acc_buf[j] for j in keep]
                if a.bug != "swap":
                    slot = {s: j for j, s in enumerate(drows)}
                w.rows(drows, model="draft")
            n = len(drows)
            # ---- draft: K batched calls
            feed = [[unseen[j] if unseen[j] is not None else PAD, pending[drows[j]]] for j in range(n)]
            fm = [[int(unseen[j] is not None), 1] for j in range(n)]
            props = [[] for _ in range(n)]
            for i in range(K):
                am = torch.tensor([dmask[j] + fm[j] for j in range(n)])
                pos = []
                for j in range(n):
                    c = sum(dmask[j])
                    row = []
                    for m in fm[j]:
                        row.append(c if m else max(c - 1, 0))
                        c += m
                    pos.append(row)
                lg = draft(
                    input_ids=torch.tensor(feed),
                    attention_mask=am,
                    position_ids=torch.tensor(pos),
                    cache=dc,
                    use_cache=True,
                ).logits[:, -1]
                nxt = lg.argmax(-1).tolist()
                if os.environ.get("DEBUG"):
                    print(
                        "round",
                        rnd,
                        "draft",
                        i,
                        "rows",
                        drows,
                        "feed",
                        feed,
                        "pos",
                        pos,
                        "attended",
                        am.sum(-1).tolist(),
                        "->",
                        nxt,
                        file=sys.stderr,
                    )
                for j in range(n):
                    dmask[j] += fm[j]
                    props[j].append(nxt[j])
                feed = [[nxt[j]] for j in range(n)]
                fm = [[1] for _ in range(n)]
            props_buf[:n] = torch.tensor(props)
            # ---- verify: each live row alone, in sequence order
            for s in range(B):
                if done[s]:
                    continue
                j = slot[s]
                if j != drows.index(s):
                    note(rnd, s, "verified draft slot {} (seq {}'s drafts)".format(j, drows[j] if j < n else "stale"))
                d = props_buf[j].tolist()
                L = tcache[s].get_seq_length()
                nc = len(prompts[s]) + len(outs[s])  # committed tokens; pending is index nc - 1
                if L != nc - 1:
                    note(rnd, s, f"target cache holds {L} slots, {nc - 1} committed before pending")
                if os.environ.get("DEBUG"):
                    print(
                        "round",
                        rnd,
                        "seq",
                        s,
                        "cache",
                        L,
                        "committed",
                        nc,
                        "target-call",
                        tcalls[0],
                        "drafts",
                        d,
                        file=sys.stderr,
                    )
                tcalls[0] += 1
                w.batch([s])
                lg = target(
                    input_ids=torch.tensor([[pending[s]] + d]),
                    position_ids=torch.arange(nc - 1, nc + K)[None],
                    cache=tcache[s],
                    use_cache=True,
                ).logits[0]
                choice = lg.argmax(-1).tolist()
                acc = 0
                while acc < K and d[acc] == choice[acc]:
                    acc += 1
                if acc < K:
                    if a.bug == "crop1":
                        tcache[s].crop(-(K - acc - 1))  # one slot too few cropped
                    else:
                        tcache[s].crop(-(K - acc))  # back to L + 1 + acc slots
                acc_buf[j] = acc
                new = d[:acc] + [choice[acc]]
                pending[s] = new[-1]
                new = cut(new, budgets[s] - len(outs[s]))
                outs[s] += new
                fin = new[-1] == EOS or len(outs[s]) >= budgets[s]
                w.emit(s, new, ("eos" if new[-1] == EOS else "length") if fin else None)
                done[s] = fin
            # ---- draft bookkeeping, by draft slot: slots this round [unseen?, pending, d1, d2]
            for j in range(n):
                acc = acc_buf[j]
                fed = min(acc, K - 1)
                dm = dmask[j][-(K + 1) :]
                dmask[j][-(K + 1) :] = dm[:2] + [1] * fed + [0] * (K - 1 - fed)
                unseen[j] = props[j][-1] if acc == K else None
    report(outs, prompts, budgets, tok)
    if a.bug:
        print("BUG first effect: round {}, seq {}: {}".format(*first_effect[0]) if first_effect else "BUG no effect")


if __name__ == "__main__":
    sys.exit(main())
